"""Prepared launches straight through the driver (``tiledattention.core._direct``): the
parameter words of cuTile's calling convention, what a call writes, when it refuses, and the
prepared launcher's route (the driver itself is faked: these tests run without a GPU; the GPU
suite checks the results against ``ct.launch``'s, ``tests/gpu/test_direct_launch_gpu.py``)."""

from __future__ import annotations

import ctypes
import struct
import types

import pytest

from tiledattention.core import _aot, _direct

from .test_aot import LLAMA, _hook, _signature

torch = pytest.importorskip("torch")


class _FakeDriver:
    """The driver's launch entry point, recording (stream, kernel, the words it was given)."""

    def __init__(self, result: int = 0) -> None:
        self.result = result
        self.launches = []

    def launch(self, config, kernel, params, extra):
        config = config._obj
        count = len(self.words_of)
        words = [ctypes.c_uint64.from_address(params[i]).value for i in range(count)]
        self.launches.append((config.stream, kernel, words,
                              (config.grid_x, config.grid_y, config.grid_z), config.num_attrs))
        return self.result

    def kernel(self, cubin, symbol):
        return 1234


def _spec(kind, **fields):
    return {"kind": kind, **fields}


def _array_spec(ndim, index="int32", base=16):
    return _spec("array", ndim=ndim, index_dtype=index, base_divisible_by=base)


@pytest.fixture
def fake_driver(monkeypatch):
    driver = _FakeDriver()
    monkeypatch.setattr(_direct, "_driver", driver)
    return driver


def _launch(driver, args, params, grid=(5, 3), pdl=False):
    direct = _direct.DirectLaunch(grid, 1234, args, params, pdl)
    driver.words_of = list(direct._words)
    return direct


def test_the_words_are_cutiles_calling_convention(fake_driver):
    """A constant and an empty tuple take no bytes; a scalar one word (int32, float32 bits);
    an array its address, its shape, its strides (int32 words, or int64 ones)."""
    q = torch.empty(2, 3, 8, dtype=torch.bfloat16)
    table = torch.empty(4, 5, dtype=torch.int32)
    args = (q, 0.5, 7, (), -3, table, 128)
    params = [_array_spec(3), _spec("f32"), _spec("const", value=7), _spec("omit"),
              _spec("i32"), _array_spec(2, index="int64"), _spec("const", value=128)]
    direct = _launch(fake_driver, args, params)
    assert list(direct._words) == [
        q.data_ptr(), 2, 3, 8, 24, 8, 1,
        struct.unpack("<I", struct.pack("<f", 0.5))[0],
        (-3) & 0xFFFFFFFF,
        table.data_ptr(), 4, 5, 5, 1]
    # each parameter pointer points at its own word
    base = ctypes.addressof(direct._words)
    assert [direct._params[i] for i in range(14)] == [base + 8 * i for i in range(14)]
    assert (direct._config.grid_x, direct._config.grid_y, direct._config.grid_z) == (5, 3, 1)
    assert (direct._config.block_x, direct._config.block_y, direct._config.block_z) == (1, 1, 1)
    assert direct._config.shared_bytes == 0 and direct._config.num_attrs == 0
    pdl = _launch(fake_driver, args, params, pdl=True)
    assert pdl._config.num_attrs == 1 and pdl._attrs[0].id == 6  # programmatic serialization
    assert list(pdl._attrs[0].value) == [1] + [0] * 15
    assert ctypes.sizeof(_direct._LaunchAttribute) == 72  # CUlaunchAttribute's size


def test_a_call_writes_its_arrays_and_scalars_and_launches_on_its_stream(fake_driver):
    q = torch.empty(2, 8, dtype=torch.float32)
    params = [_array_spec(2), _spec("i32"), _spec("f32")]
    direct = _launch(fake_driver, (q, 5, 1.5), params)
    other = torch.empty(2, 8, dtype=torch.float32)
    assert direct(77, (other, 5, 1.5))
    stream, kernel, words, grid, attrs = fake_driver.launches[-1]
    assert (stream, kernel, grid, attrs) == (77, 1234, (5, 3, 1), 0)
    assert words[0] == other.data_ptr() and words[1:5] == [2, 8, 8, 1]
    assert words[5:] == [5, struct.unpack("<I", struct.pack("<f", 1.5))[0]]
    # scalars that changed are written too
    assert direct(78, (other, -1, 2.0))
    assert fake_driver.launches[-1][2][5:] == [0xFFFFFFFF,
                                              struct.unpack("<I", struct.pack("<f", 2.0))[0]]


def test_a_misaligned_array_or_a_refused_launch_launches_nothing(fake_driver):
    """The code assumes the first launch's alignment: an array off it is refused before the
    driver is asked (the prepared launcher then goes through ct.launch); so is a launch the
    driver refuses."""
    x = torch.empty(64, dtype=torch.bfloat16)
    direct = _launch(fake_driver, (x,), [_array_spec(1, base=16)])
    assert not direct(1, (x[1:],)) and fake_driver.launches == []
    loose = _launch(fake_driver, (x[1:],), [_array_spec(1, base=2)])
    assert loose(1, (x[3:],)) and len(fake_driver.launches) == 1
    fake_driver.result = 1  # CUDA_ERROR_INVALID_VALUE
    assert not direct(1, (x,))


def _arguments(signature):
    """Stand-in arguments shaped as ``signature``'s constraints."""
    from cuda.tile import compilation as ctc

    args = []
    for p in signature.parameters:
        if isinstance(p, ctc.ArrayConstraint):
            args.append(torch.empty((2,) * p.ndim, dtype=torch.float32))
        elif isinstance(p, ctc.ScalarConstraint):
            args.append(1.0 if p.dtype.name.startswith("float") else 1)
        elif isinstance(p, ctc.TupleConstraint):
            args.append(())
        else:
            args.append(p.value if isinstance(p, ctc.ConstantConstraint) else p)
    return args


@pytest.fixture
def launch_signature(monkeypatch):
    """The forward's launch signature of LLAMA, returned for any arguments as ct.launch's."""
    import cuda.tile._cext as cext

    kernel, signature = _signature(LLAMA)
    monkeypatch.setattr(cext, "get_parameter_constraints_from_pyargs",
                        lambda k, args, cconv: list(signature.parameters))
    monkeypatch.setattr(_direct, "_answers", {})
    return kernel, signature


def test_a_direct_launch_runs_the_answer_cutiles_compile_gave(fake_driver, launch_signature,
                                                               monkeypatch):
    """``make`` finds the cubin the compile hook answered for the launch's own signature;
    without one, or with an answer that needs a shared-memory program, or with the route
    switched off, there is no direct launch."""
    kernel, signature = launch_signature
    args = _arguments(signature)
    assert _direct.DirectLaunch.make((4, 1, 1), kernel, args) is None  # nothing answered yet
    hook, _ = _hook(kernel)
    hook(signature, None, (9, 0))  # (the JIT's answer: no bundle holds LLAMA here)
    direct = _direct.DirectLaunch.make((4, 1, 1), kernel, args)
    assert isinstance(direct, _direct.DirectLaunch)
    arrays = [a for a in args if isinstance(a, torch.Tensor)]
    scalars = [a for a in args[:len(signature.parameters)]
               if isinstance(a, (int, float)) and not isinstance(a, bool)]
    assert len(direct._arrays) == len(arrays)
    assert len(direct._words) == sum(1 + 2 * a.dim() for a in arrays) + len(direct._scalars)
    monkeypatch.setenv(_direct.ENV_DIRECT, "0")
    assert _direct.DirectLaunch.make((4, 1, 1), kernel, args) is None
    monkeypatch.delenv(_direct.ENV_DIRECT)
    params = next(iter(_direct._answers))[1]
    _direct._answers[(kernel, params)] = None  # (a compile that returned a size program)
    assert _direct.DirectLaunch.make((4, 1, 1), kernel, args) is None
    assert scalars  # (the signature does have scalars)


def test_an_answer_with_a_shared_memory_program_is_not_launched_directly():
    kernel = object()
    _direct.record_answer(kernel, [{"kind": "i32"}], (b"cubin", "sym", object(), ()))
    assert _direct._answers[(kernel, repr([{"kind": "i32"}]))] is None
    _direct.record_answer(kernel, [{"kind": "f32"}], (b"cubin", "sym", None, ()))
    assert _direct._answers[(kernel, repr([{"kind": "f32"}]))] == (b"cubin", "sym")


def test_the_prepared_launcher_goes_to_the_driver_after_its_first_launch(monkeypatch):
    """The first call goes through ``_aot.launch`` (it compiles or finds the code) and makes
    the direct launch; later calls go direct, and back to ``_aot.launch`` whenever the direct
    launch refuses (or could not be made)."""
    through = []
    monkeypatch.setattr(_aot, "launch", lambda *a, **kw: through.append((a, kw)))
    answers = []

    class Direct:
        def __call__(self, stream, args):
            answers.append((stream, args))
            return args[0] != "refuse"

    made = []
    monkeypatch.setattr(_direct.DirectLaunch, "make",
                        classmethod(lambda cls, *a: made.append(a) or Direct()))
    run = _aot.prepared_launcher((8, 1), "kernel", pdl=True)
    before = _direct.launched()
    run(5, ("a",))
    assert len(through) == 1 and through[0][1] == {"programmatic_dependent_launch": True}
    assert made == [((8, 1), "kernel", ("a",), True)]
    run(types.SimpleNamespace(cuda_stream=9), ("b",))
    assert len(through) == 1 and answers[-1] == (9, ("b",))
    run(5, ("refuse",))
    assert len(through) == 2 and through[1][0][3] == ("refuse",)
    after = _direct.launched()
    assert (after["direct"] - before["direct"], after["fallback"] - before["fallback"]) == (1, 1)
    # a launch no direct form could be made for always goes through _aot.launch
    monkeypatch.setattr(_direct.DirectLaunch, "make", classmethod(lambda cls, *a: None))
    plain = _aot.prepared_launcher((8, 1), "kernel")
    plain(5, ("a",))
    plain(5, ("b",))
    assert len(through) == 4 and through[3][1] == {}
