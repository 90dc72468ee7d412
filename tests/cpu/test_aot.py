"""Shipped cubins on the CPU: ``tiledtune aot`` builds bundles for several architectures; an
image packs a launch's arguments in cuTile's calling convention (checked field by field
against the kernel's parameters and through the driver's pointer array); a launch takes the
image where one fits and the JIT otherwise; ``TILEDATTENTION_JIT=0`` refuses to compile; an
image of another template version is never used."""

from __future__ import annotations

import ctypes
import json
import zipfile

import cuda.tile
import pytest

from tiledattention import FORWARD, DeviceInfo, Problem
from tiledattention.core import _aot, _bundles
from tiledattention.errors import CompileRequiredError, InputValueError
from tiledattention.kernels.forward._launch import UNUSED, kernel_args, kernel_for, normalise
from tuner.aot import Job, build_bundles, images_of, jobs_for, model_calls
from tuner.cli import main

torch = pytest.importorskip("torch")

ARCHES = ("sm_90", "sm_100", "sm_120")
LLAMA = Problem(batch=1, heads_q=32, heads_kv=8, seqlen_q=1000, seqlen_k=1000, head_dim=128,
                dtype="bf16", causal=True)
DECODE = Problem(batch=2, heads_q=32, heads_kv=8, seqlen_q=1, seqlen_k=3001, head_dim=128,
                 dtype="bf16", causal=True)


def _job(family: str, problem: Problem, arch: str) -> Job:
    return Job(family, tuple(sorted(problem.to_dict().items())), arch)


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory):
    """Bundles for three architectures: Llama-shaped prefill, and a decode step on sm_90."""
    out = tmp_path_factory.mktemp("cubins")
    jobs = [_job("forward", LLAMA, arch) for arch in ARCHES] + [_job("decode", DECODE, "sm_90")]
    report = build_bundles(jobs, out, processes=2)
    assert report.failures == []
    return out


@pytest.fixture
def use_bundles(bundle_dir, monkeypatch):
    monkeypatch.setenv(_bundles.ENV_CUBINS, str(bundle_dir / "cubins-sm_90.zip"))
    _aot.reset()
    yield bundle_dir
    _aot.reset()


def test_bundles_are_built_for_each_architecture(bundle_dir):
    for arch in ARCHES:
        manifest = _bundles.read_manifest(bundle_dir / f"cubins-{arch}.zip")
        assert manifest["arch"] == arch and manifest["format"] == _bundles.BUNDLE_FORMAT
        kernels = {image["kernel"].split("[")[0] for image in manifest["images"]}
        assert "tiledattention.kernels.forward._kernel:attention_fwd" in kernels
        with zipfile.ZipFile(bundle_dir / f"cubins-{arch}.zip") as z:
            for image in manifest["images"]:
                assert z.read(image["file"])[:4] == b"\x7fELF"
    decode = _bundles.read_manifest(bundle_dir / "cubins-sm_90.zip")["images"]
    assert {i["family"] for i in decode} == {"forward", "decode"}


def test_images_assume_nothing_of_lengths_but_the_head_dims():
    """A shipped image serves every sequence length: only the last dimension's divisibility
    is compiled in (a compile-only build of 1024 tokens would assume 16 | S)."""
    problem = Problem(batch=2, heads_q=16, heads_kv=16, seqlen_q=1024, seqlen_k=1024,
                      head_dim=64, dtype="fp16", causal=False)
    plain, with_lse = images_of(_job("forward", problem, "sm_90"))  # and a training forward's
    for image, count in ((plain, 4), (with_lse, 5)):  # Q, K, V, Out (, Lse)
        arrays = [p for p in image["params"] if p["kind"] == "array"]
        assert len(arrays) == count
        for array in arrays[:4]:
            assert array["shape_divisible_by"] == [1, 1, 1, 16]
            assert array["stride_constant"][-1] == 1 and array["base_divisible_by"] == 16
            assert array["dtype"] == "float16"
    lse = [p for p in with_lse["params"] if p["kind"] == "array"][4]
    assert (lse["dtype"], lse["shape_divisible_by"]) == ("float32", [1, 1, 1])


def _forward_launch(problem: Problem, q=None):
    """(kernel, args, q, k, v, out) of a forward launch on CPU tensors (they have data
    pointers, shapes and strides like CUDA ones)."""
    schedule = normalise(problem, FORWARD.default_schedule("sm_90", problem))
    p = problem
    q = torch.randn(p.batch, p.heads_q, p.seqlen_q, p.head_dim).to(torch.bfloat16) \
        if q is None else q
    k = torch.randn(p.batch, p.heads_kv, p.seqlen_k, p.head_dim).to(torch.bfloat16)
    v = torch.randn_like(k)
    out = torch.empty_like(q)
    args = kernel_args(q, k, v, out, problem, schedule, 0.125)
    return kernel_for(schedule), args, (q, k, v, out)


class FakeDriver:
    """``_driver``'s two calls: loads counted, launches recorded with the argument bytes
    read back through the driver's pointer array."""

    def __init__(self, monkeypatch) -> None:
        self.loads, self.launches = [], []
        monkeypatch.setattr(_aot._driver, "load_kernel", self.load)
        monkeypatch.setattr(_aot._driver, "launch_kernel", self.launch)
        monkeypatch.setattr(_aot, "_device_of", lambda args: 0)
        monkeypatch.setattr(_aot, "_current_device", lambda: 0)
        monkeypatch.setattr(_aot, "device_info", lambda index: DeviceInfo(
            index=index, arch="sm_90", name="fake", sm_count=132))
        self.image = None

    def load(self, cubin, symbol, device):
        assert cubin[:4] == b"\x7fELF" and symbol and device == 0
        self.loads.append(symbol)
        return 1234

    def launch(self, handle, grid, stream, params):
        self.launches.append((handle, grid, stream, params))


def _read_params(image: _aot.Image, params) -> list:
    """The launch's argument values, each read where its pointer in ``params`` points."""
    values, j = [], 0
    for _, spec in image.slots:
        codes = spec if isinstance(spec, str) else "q" + "i" * 2 * spec.spec.ndim
        for code in codes:
            ctype = {"q": ctypes.c_uint64, "i": ctypes.c_int32, "f": ctypes.c_float}[code]
            values.append(ctypes.cast(params[j], ctypes.POINTER(ctype)).contents.value)
            j += 1
    return values


def test_a_launch_packs_the_calling_convention(use_bundles, monkeypatch):
    driver = FakeDriver(monkeypatch)
    jit = []
    monkeypatch.setattr(cuda.tile, "launch", lambda *a: jit.append(a))
    kernel, args, (q, k, v, out) = _forward_launch(
        Problem(**{**LLAMA.to_dict(), "seqlen_q": 777, "seqlen_k": 777}))
    _aot.launch(99, (7, 32), kernel, args)  # another length than the build's: one image
    assert jit == [] and len(driver.launches) == 1
    handle, grid, stream, params = driver.launches[0]
    assert (handle, grid, stream) == (1234, (7, 32, 1), 99)
    image = _aot.shipped_image(kernel, args)
    want = []
    for t in (q, k, v, out):  # pointer, shape, strides (elements)
        want += [t.data_ptr(), *t.shape, *t.stride()]
    want += [0.125, 32, 4, 0]  # qk_scale, heads_q, group, the Lse placeholder (no LSE)
    got = _read_params(image, params)
    assert got[:len(want) - 4] == want[:-4]
    assert got[-4] == pytest.approx(0.125) and got[-3:] == want[-3:]
    # the packed slots are exactly the parameters that are neither constants nor placeholders
    annotations = kernel._annotated_function.parameter_annotations
    assert [i for i, _ in image.slots] == [
        i for i, a in enumerate(annotations) if not a.constant and args[i] is not UNUSED]
    _aot.launch(99, (7, 32), kernel, args)  # loaded once
    assert len(driver.loads) == 1


def test_arrays_that_break_a_constraint_take_the_jit(use_bundles, monkeypatch):
    driver = FakeDriver(monkeypatch)
    jit = []
    monkeypatch.setattr(cuda.tile, "launch", lambda *a: jit.append(a))
    p = LLAMA
    storage = torch.randn(p.batch * p.heads_q * p.seqlen_q * p.head_dim + 1).to(torch.bfloat16)
    unaligned = storage[1:].view(p.batch, p.heads_q, p.seqlen_q, p.head_dim)  # 2 bytes in
    kernel, args, _ = _forward_launch(p, q=unaligned)
    _aot.launch(0, (8, 32), kernel, args)
    assert len(jit) == 1 and driver.launches == []
    kernel, args, _ = _forward_launch(p, q=torch.randn(1, 32, 1000, 128).to(torch.float16))
    _aot.launch(0, (8, 32), kernel, args)  # a dtype the image was not built for
    assert len(jit) == 2 and driver.launches == []


def test_no_image_and_no_jit_is_a_clear_error(use_bundles, monkeypatch):
    FakeDriver(monkeypatch)
    jit = []
    monkeypatch.setattr(cuda.tile, "launch", lambda *a: jit.append(a))
    monkeypatch.setenv(_aot.ENV_JIT, "0")
    _aot.reset()  # launches read the setting once
    other = Problem(**{**LLAMA.to_dict(), "head_dim": 64})  # constants nobody built
    kernel, args, _ = _forward_launch(other)
    with pytest.raises(CompileRequiredError, match="TILEDATTENTION_JIT=0") as info:
        _aot.launch(0, (8, 32), kernel, args)
    assert "attention_fwd" in str(info.value) and jit == []
    kernel, args, _ = _forward_launch(LLAMA)  # a shipped one still runs
    _aot.launch(0, (8, 32), kernel, args)
    monkeypatch.setenv(_aot.ENV_JIT, "1")
    _aot.reset()
    kernel, args, _ = _forward_launch(other)
    _aot.launch(0, (8, 32), kernel, args)
    assert len(jit) == 1


def test_an_image_of_another_template_version_is_never_used(bundle_dir, tmp_path):
    source = bundle_dir / "cubins-sm_90.zip"
    stale = tmp_path / "cubins-sm_90.zip"
    with zipfile.ZipFile(source) as z, zipfile.ZipFile(stale, "w") as out:
        for name in z.namelist():
            data = z.read(name)
            if name == "manifest.json":
                manifest = json.loads(data)
                for image in manifest["images"]:
                    image["identity"] = "0" * 12
                data = json.dumps(manifest).encode()
            out.writestr(name, data)
    assert _aot.shipped_images([source]) != {}
    assert _aot.shipped_images([stale]) == {}


def test_a_file_that_is_no_bundle_is_named_and_skipped(tmp_path):
    bad = tmp_path / "cubins-sm_90.zip"
    bad.write_bytes(b"not a zip")
    with pytest.raises(InputValueError, match="is not a cubin bundle"):
        _bundles.read_manifest(bad)
    with pytest.warns(UserWarning, match="its cubins are not used"):
        assert _aot.shipped_images([bad]) == {}


def test_the_command_builds_and_refuses_what_it_cannot(tmp_path, capsys):
    fields = ",".join(f"{k}={v}" for k, v in LLAMA.to_dict().items())
    assert main(["aot", "--arch", "sm_90", "--no-shipped", "--out", str(tmp_path),
                 "--problem", f"kernel=forward,{fields}"]) == 0
    assert "sm_90: 2 kernels" in capsys.readouterr().out  # and the one storing the LSE
    assert main(["aot", "--arch", "sm_90", "--no-shipped", "--out", str(tmp_path)]) == 2
    assert main(["aot", "--arch", "sm_90", "--no-shipped", "--out", str(tmp_path),
                 "--problem", fields]) == 2
    assert "kernel=NAME" in capsys.readouterr().err


def test_explain_says_how_a_call_launches(use_bundles, monkeypatch, capsys):
    from tiledattention.tooling import launch_path

    schedule = FORWARD.default_schedule("sm_90", LLAMA)
    # the call's kernel and the training forward's (storing the log-sum-exp)
    assert launch_path(FORWARD, LLAMA, schedule, "sm_90").startswith("shipped cubins (2 kernel")
    assert launch_path(FORWARD, LLAMA, schedule, "sm_120").startswith("JIT: 2 of 2 kernel")
    other = Problem(**{**LLAMA.to_dict(), "head_dim": 64})
    monkeypatch.setenv(_aot.ENV_JIT, "0")
    assert launch_path(FORWARD, other, FORWARD.default_schedule("sm_90", other),
                       "sm_90").startswith("refused (TILEDATTENTION_JIT=0): 2 of 2")
    monkeypatch.delenv(_bundles.ENV_CUBINS)
    _aot.reset()
    assert "no cubin bundle is installed" in launch_path(FORWARD, LLAMA, schedule, "sm_90")
    monkeypatch.setenv(_bundles.ENV_CUBINS, str(use_bundles / "cubins-sm_90.zip"))
    monkeypatch.delenv(_aot.ENV_JIT)
    _aot.reset()
    assert main(["explain", "--device", "sm_90", "--shape", "1,32/8,1000,128", "--dtype", "bf16",
                 "--causal", "yes"]) == 0
    assert "launch   shipped cubins" in capsys.readouterr().out


def test_a_models_calls_are_built_in_the_families_that_run_them(capsys, tmp_path):
    calls = model_calls(32, 8, 128, dtypes=("bf16", "fp16"), batches=(1, 4), lengths=(100,),
                        training=True)
    assert len(calls) == 2 * 2 * 4  # dtypes x batches x (prefill, decode, training fwd, bwd)
    jobs = jobs_for(["sm_90", "sm_120"], [], shipped=False, calls=calls)
    # the training forward is the prefill's problem in the forward family: one job for both
    assert len(jobs) == 2 * 2 * 2 * 3
    by_family = {}
    for job in jobs:
        by_family.setdefault(job.family, set()).add(dict(job.problem)["seqlen_q"])
    assert by_family == {"forward": {100}, "decode": {1}, "backward": {100}}
    assert main(["aot", "--arch", "sm_90", "--no-shipped", "--out", str(tmp_path),
                 "--lengths", "64"]) == 2
    assert "describe a --model's calls" in capsys.readouterr().err
    with pytest.raises(SystemExit) as bad:  # argparse's refusal of the option
        main(["aot", "--arch", "sm_90", "--no-shipped", "--out", str(tmp_path),
              "--model", "32/7,128"])
    assert bad.value.code == 2 and "HQ a multiple of HKV" in capsys.readouterr().err

