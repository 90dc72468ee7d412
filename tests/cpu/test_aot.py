"""Shipped cubins on the CPU: ``tiledtune aot`` builds bundles for several architectures
whose images assume what ``ct.launch``'s signature of a call promises and no more; a
kernel's compile is answered with the image that serves the signature and goes to the JIT
otherwise; ``TILEDATTENTION_JIT=0`` refuses to compile; an image of another template version
is never used."""

from __future__ import annotations

import dataclasses
import json
import os
import types
import zipfile

import cuda.tile
import pytest

from tiledattention import FORWARD, Problem
from tiledattention.core import _aot, _bundles
from tiledattention.errors import CompileRequiredError, InputValueError
from tiledattention.core._compile import array_constraint
from tiledattention.kernels.forward._launch import kernel_args, kernel_for, normalise
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
    """Bundles for three architectures: Llama-shaped prefill (on sm_90 at batch 1 and 2), and
    a decode step on sm_90."""
    out = tmp_path_factory.mktemp("cubins")
    jobs = [_job("forward", LLAMA, arch) for arch in ARCHES] + [
        _job("forward", dataclasses.replace(LLAMA, batch=2), "sm_90"),
        _job("decode", DECODE, "sm_90")]
    report = build_bundles(jobs, out, processes=2)
    assert report.failures == []
    return out


@pytest.fixture
def no_installed_bundles(monkeypatch, tmp_path):
    """No bundle in the package (a wheel build may have left some in the source tree) nor in
    the cubin cache."""
    monkeypatch.setattr(_bundles, "PACKAGE_BUNDLES", tmp_path / "package")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(_bundles.ENV_CUBINS, raising=False)


@pytest.fixture
def use_bundles(bundle_dir, monkeypatch, no_installed_bundles):
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
    is compiled in (a compile-only build of 1024 tokens would assume 16 | S), and a dim of
    length 1 only in the batch-1 image."""
    problem = Problem(batch=2, heads_q=16, heads_kv=16, seqlen_q=1024, seqlen_k=1024,
                      head_dim=64, dtype="fp16", causal=False)
    plain, with_lse = images_of(_job("forward", problem, "sm_90"))  # and a training forward's
    for image, count in ((plain, 4), (with_lse, 5)):  # Q, K, V, Out (, Lse)
        arrays = [p for p in image["params"] if p["kind"] == "array"]
        assert len(arrays) == count
        for array in arrays[:4]:
            assert array["shape_divisible_by"] == [1, 1, 1, 16]
            assert array["shape_constant"] == [None] * 4
            assert array["stride_constant"][-1] == 1 and array["base_divisible_by"] == 16
            assert array["dtype"] == "float16"
    lse = [p for p in with_lse["params"] if p["kind"] == "array"][4]
    assert (lse["dtype"], lse["shape_divisible_by"]) == ("float32", [1, 1, 1])
    # the PTX text of the debug sections is blanked, the code kept (as cuTile exports it)
    from tiledattention.core._cubin import elf_sections
    from tiledattention.tooling import capturing, text_digest

    with capturing() as builds:
        FORWARD.compile_launchable(problem, FORWARD.default_schedule("sm_90", problem), "sm_90")
    exported = {_bundles.constants_key(_bundles.param_specs(kernel, args)): cubin
                for kernel, args, _, cubin in builds}
    for image in (plain, with_lse):
        sections = dict(elf_sections(image["cubin"]))
        ptx = [v for k, v in sections.items() if k.endswith("nv_debug_ptx_txt")]
        assert ptx and all(len(v) > 1000 and not any(v) for v in ptx)
        exported_cubin = exported[_bundles.constants_key(image["params"])]
        assert text_digest(image["cubin"]) == text_digest(exported_cubin)
        assert image["cubin"] != exported_cubin
    one = images_of(_job("forward", dataclasses.replace(problem, batch=1), "sm_90"))[0]
    assert all(a["shape_constant"] == [1, None, None, None]
               for a in one["params"] if a["kind"] == "array")


def test_a_packed_batchs_helper_kernels_are_built_and_vouched_for_by_their_module():
    """A ragged problem's images include the work-table kernel, the clear of the output's
    uncovered rows and the paged routes' copy and tables (forward), the prologue of work tables and clears (backward), each tied to
    the identity of its own module too."""
    from tiledattention.tooling import module_identity

    problem = Problem(batch=5, heads_q=8, heads_kv=2, seqlen_q=512, seqlen_k=512, head_dim=64,
                      dtype="bf16", causal=True, ragged=True)
    helpers = "tiledattention.core._work_kernel"
    images = images_of(_job("forward", problem, "sm_90"))
    by_kernel = {i["kernel"].split("[")[0]: i for i in images}
    table = by_kernel[f"{helpers}:fill_work_table"]
    assert table["modules"][-1] == helpers
    assert table["identity"] == module_identity(*table["modules"])
    clears = [i for i in images if ":clear_outside[" in i["kernel"]]
    assert [_bundles.constants_key(i["params"])[0] for i in clears] == [0]
    assert all(i["modules"][-1] == helpers for i in clears)
    # over pages: the copy of the pages a chunk reads (pages of 16) and a mixed step's tables
    # (with and without its decode step, int32 and int64 offsets)
    pages = "tiledattention.core._page_kernel"
    assert len([i for i in images if i["kernel"].startswith(f"{pages}:copy_read_pages")]) == 1
    tables = [i for i in images if i["kernel"].startswith(f"{pages}:mixed_step_tables")]
    assert len(tables) == 4 and all(i["modules"][-1] == pages for i in tables)
    backward = images_of(_job("backward", problem, "sm_90"))
    prologues = [i for i in backward if ":backward_prologue[" in i["kernel"]]
    assert len(prologues) == 1 and prologues[0]["modules"][-1] == helpers
    assert prologues[0]["identity"] == module_identity(*prologues[0]["modules"])


def test_array_constraints_are_what_ct_launch_derives():
    """``array_constraint`` mirrors the signature ``ct.launch`` derived on an H200 for a
    ``[1, 32, 173, 128]`` bf16 tensor and a decode step's ``[2, 8, 4, 1, 128]`` view
    (``cuda.tile`` 1.7: a stride of 1 and a dim of 1 become constants, 16-byte divisibility
    of strides and base, 16 | each dim)."""
    q = array_constraint("bf16", (1, 32, 173, 128))
    assert q.shape_constant == (1, None, None, None)
    assert q.stride_constant == (None, None, None, 1)
    assert q.stride_lower_bound_incl == (0, 0, 0, None)
    assert q.stride_divisible_by == (8, 8, 8, 1)
    assert q.shape_divisible_by == (1, 16, 1, 16)
    assert (q.base_addr_divisible_by, q.alias_groups, q.may_alias_internally) == (16, (), False)
    step = array_constraint("bf16", (2, 8, 4, 1, 128))
    assert step.shape_constant == (None, None, None, 1, None)
    assert step.shape_divisible_by == (1, 1, 1, 1, 16)
    lse = array_constraint("fp32", (1, 32, 173), (32 * 176, 176, 1))
    assert lse.stride_divisible_by == (4, 4, 1) and lse.shape_constant == (1, None, None)



def test_any_length_drops_what_varies_from_call_to_call_and_keeps_the_rest():
    """Lengths (but the head dim) and a table's row stride may be anything; the head dim's
    divisibility, the big arrays' strides (TMA needs them 16-byte divisible), dims of length 1
    and everything else stay as the launch had them. What this leaves varies with no length:
    two launches of other token and sequence counts make the same constraints."""
    def general(dtype, shape, strides=None):
        return _bundles.any_length(array_constraint(dtype, shape, strides))

    q = general("bf16", (1, 32, 784, 128))  # a packed batch's [1, H, tokens, D] view
    assert q.shape_divisible_by == (1, 1, 1, 16) and q.stride_divisible_by == (8, 8, 8, 1)
    assert q.shape_constant == (1, None, None, None)
    assert general("bf16", (1, 32, 777, 128)) == q
    ranges = general("int32", (4, 12))  # [4, sequences]: row stride 12, then 13
    assert ranges.stride_divisible_by == (1, 1) and ranges.shape_divisible_by == (1, 1)
    assert general("int32", (4, 13)) == ranges
    lse = general("fp32", (1, 32, 784), (32 * 784, 784, 1))  # row stats: rows stay aligned
    assert lse.stride_divisible_by == (4, 4, 1) and lse.shape_divisible_by == (1, 1, 1)
    other = types.SimpleNamespace(value=3)  # a constant or scalar: itself
    assert _bundles.any_length(other) is other
    assert _bundles.any_length(q) is q  # (already general)

def test_an_image_is_compiled_in_the_calling_convention_ct_launch_picks():
    """The oldest that can pass the launch: the backward's sum kernel (two arrays, constants)
    takes ``cutile_python_v1`` at batch 2 and ``cutile_python_v2`` at batch 1 (a dim of
    length 1 is a constant); a kernel with empty-tuple placeholders always v2."""
    # (a walk of 4 heads x 8 query tiles: the default splits it, so the sum kernel is built)
    problem = Problem(batch=2, heads_q=8, heads_kv=2, seqlen_q=1000, seqlen_k=1000,
                      head_dim=64, dtype="bf16", causal=True)
    for batch, want in ((2, "cutile_python_v1"), (1, "cutile_python_v2")):
        images = images_of(_job("backward", dataclasses.replace(problem, batch=batch), "sm_90"))
        sums = [i for i in images if ":attention_bwd_sum[" in i["kernel"]]
        assert sums and all(_bundles.convention_of(i["params"]) == want for i in sums)
        others = [i for i in images if i not in sums]
        assert all(_bundles.convention_of(i["params"]) == "cutile_python_v2" for i in others)


def _signature(problem: Problem):
    """The signature ``ct.launch`` makes of a forward launch of ``problem`` (its arrays as
    ``array_constraint`` describes them, which the test above pins) and the kernel."""
    from cuda.tile import compilation as ctc

    from tiledattention.core._compile import attention_constraints
    from tiledattention.kernels.forward._launch import kernel_constants, ordered_args

    schedule = normalise(problem, FORWARD.default_schedule("sm_90", problem))
    q_like, kv_like = attention_constraints(problem, packed=False)
    runtime = {"Q": q_like, "K": kv_like, "V": kv_like, "Out": q_like,
               "qk_scale": ctc.ScalarConstraint(cuda.tile.float32),
               "heads_q": ctc.ScalarConstraint(cuda.tile.int32),
               "group": ctc.ScalarConstraint(cuda.tile.int32),
               "Lse": ctc.ScalarConstraint(cuda.tile.int32)}
    runtime.update({name: ctc.TupleConstraint(()) for name in ("window_left", "window_right",
                                                                "softcap", "Sinks")})
    args = ordered_args(runtime, kernel_constants(problem, schedule))
    return kernel_for(schedule), ctc.KernelSignature(
        list(args), calling_convention=ctc.CallingConvention.cutile_python_v2())


class _Original:
    """A kernel's own ``_compile``, recording the signatures it is asked to compile."""

    def __init__(self) -> None:
        self.asked = []

    def __call__(self, signature, context, compute_capability=None):
        self.asked.append(signature)
        return b"jit", "jit", None, ()


def _hook(kernel, jit: bool = True):
    original = _Original()
    return _aot.ShippedCompile(kernel, original, jit), original


def test_a_launch_signature_gets_the_image_that_serves_it(use_bundles):
    kernel, signature = _signature(dataclasses.replace(LLAMA, seqlen_q=777, seqlen_k=777))
    hook, original = _hook(kernel)
    cubin, symbol, program, providers = hook(signature, None, (9, 0))
    assert cubin[:4] == b"\x7fELF" and symbol.startswith("attention_fwd")
    assert (program, providers, hook.served, original.asked) == (None, (), 1, [])
    # the batch-1 image is another one than the batch-2 one (batch 1 is compiled in)
    _, other = _signature(dataclasses.replace(LLAMA, batch=2))
    assert hook(other, None, (9, 0))[0] != cubin and hook.served == 2
    # no image: another architecture, another calling convention, a head dim nobody built
    assert hook(signature, None, (12, 0))[0] == b"jit"
    v3 = types.SimpleNamespace(parameters=signature.parameters,
                               calling_convention=types.SimpleNamespace(name="cutile_python_v3"))
    assert hook(v3, None, (9, 0))[0] == b"jit"
    kernel64, sig64 = _signature(dataclasses.replace(LLAMA, head_dim=64))
    hook64, original64 = _hook(kernel64)
    assert hook64(sig64, None, (9, 0))[0] == b"jit" and len(original64.asked) == 1
    assert hook.served == 2 and len(original.asked) == 2


def test_lengths_of_other_divisibility_reuse_one_length_free_compile(monkeypatch):
    """No bundle: a launch signature is compiled with its lengths' divisibility dropped, once:
    another token count (777 and 784 keys: 16 does not divide one, divides the other) reuses
    that compile; another head dim, constant or architecture compiles again."""
    monkeypatch.delenv(_bundles.ENV_CUBINS, raising=False)
    _aot.reset()
    kernel, odd = _signature(dataclasses.replace(LLAMA, batch=2, seqlen_q=777, seqlen_k=777))
    _, even = _signature(dataclasses.replace(LLAMA, batch=2, seqlen_q=784, seqlen_k=784))
    arrays = [p for p in even.parameters if hasattr(p, "shape_divisible_by")]
    assert any(p.shape_divisible_by[2] == 16 for p in arrays)  # (the launches do differ)
    hook, original = _hook(kernel)
    first = hook(odd, None, (9, 0))
    assert hook(even, None, (9, 0)) is first and (hook.compiled, hook.reused) == (1, 1)
    [asked] = original.asked
    for p in asked.parameters:
        if hasattr(p, "shape_divisible_by"):  # only the head dim keeps its divisibility
            assert p.shape_divisible_by[:-1] == (1,) * (p.ndim - 1)
    assert asked.parameters[0].shape_divisible_by[-1] == 16
    hook(odd, None, (10, 0))  # another architecture
    _, d64 = _signature(dataclasses.replace(LLAMA, batch=2, head_dim=64))
    hook(d64, None, (9, 0))
    assert (hook.compiled, hook.reused, hook.served) == (3, 1, 0)
    # a calling convention the package does not launch with goes to cuTile as it came
    v3 = types.SimpleNamespace(parameters=odd.parameters,
                               calling_convention=types.SimpleNamespace(name="cutile_python_v3"))
    hook(v3, None, (9, 0))
    assert original.asked[-1] is v3 and hook.compiled == 3
    # compiling off: refused, nothing asked
    off, off_original = _hook(kernel, jit=False)
    with pytest.raises(CompileRequiredError):
        off(odd, None, (9, 0))
    assert off_original.asked == []


def test_an_image_never_serves_weaker_assumptions(use_bundles):
    """A launch whose arrays promise less than the image assumed (an unaligned base, a
    stride not 16-byte divisible, another dtype) is compiled, not served."""
    kernel, signature = _signature(LLAMA)
    params = _bundles.param_specs(kernel, signature.parameters)
    hook, _ = _hook(kernel)
    image = _aot._find(_aot._loaded_images("sm_90")[_bundles.kernel_name(kernel)], "sm_90",
                       params)
    assert image is not None
    for field, value in (("base_divisible_by", 1), ("stride_divisible_by", [1, 8, 8, 1]),
                         ("dtype", "float16"), ("shape_constant", [None] * 4),
                         ("may_alias_internally", True), ("stride_lower_bound", [None] * 4)):
        weaker = [dict(p) for p in params]
        weaker[0][field] = value
        assert not _bundles.serves(image.params, weaker), field
    stronger = [dict(p) for p in params]
    stronger[0]["shape_divisible_by"] = [1, 16, 16, 16]  # (a length of 1024 tokens)
    assert _bundles.serves(image.params, stronger)


def test_another_cuda_tile_release_compiles_instead(use_bundles, monkeypatch):
    """Only a release whose launcher was checked to take the answer gets cubins."""
    kernel, signature = _signature(LLAMA)
    hook, original = _hook(kernel)
    monkeypatch.setattr(cuda.tile, "__version__", "1.8.0")
    assert hook(signature, None, (9, 0))[0] == b"jit" and hook.served == 0
    monkeypatch.setattr(cuda.tile, "__version__", "1.7.2")
    assert hook(signature, None, (9, 0))[0][:4] == b"\x7fELF" and hook.served == 1


def test_no_image_and_no_jit_is_a_clear_error(use_bundles):
    kernel, signature = _signature(dataclasses.replace(LLAMA, head_dim=64))
    hook, original = _hook(kernel, jit=False)
    with pytest.raises(CompileRequiredError, match="TILEDATTENTION_JIT=0") as info:
        hook(signature, None, (9, 0))
    assert "attention_fwd" in str(info.value) and original.asked == []
    kernel, signature = _signature(LLAMA)  # a shipped one still runs
    hook, original = _hook(kernel, jit=False)
    assert hook(signature, None, (9, 0))[0][:4] == b"\x7fELF"


def _forward_launch(problem: Problem):
    """(kernel, args, (q, k, v, out)) of a forward launch on CPU tensors."""
    schedule = normalise(problem, FORWARD.default_schedule("sm_90", problem))
    p = problem
    q = torch.randn(p.batch, p.heads_q, p.seqlen_q, p.head_dim).to(torch.bfloat16)
    k = torch.randn(p.batch, p.heads_kv, p.seqlen_k, p.head_dim).to(torch.bfloat16)
    v = torch.randn_like(k)
    out = torch.empty_like(q)
    args = kernel_args(q, k, v, out, problem, schedule, 0.125)
    return kernel_for(schedule), args, (q, k, v, out)


def test_a_launch_is_ct_launch_with_the_kernels_compile_answered(use_bundles, monkeypatch):
    launched = []
    monkeypatch.setattr(cuda.tile, "launch", lambda *a, **kw: launched.append((a, kw)))
    kernel, args, _ = _forward_launch(LLAMA)
    own = kernel._compile
    _aot.launch(7, (8, 32), kernel, args, programmatic_dependent_launch=True)
    assert launched == [((7, (8, 32), kernel, args), {"programmatic_dependent_launch": True})]
    assert isinstance(kernel._compile, _aot.ShippedCompile) and kernel._compile.original == own
    with _aot.recording() as launches:
        _aot.launch(7, (8, 32), kernel, args)  # prepared once
    assert kernel._compile.original == own
    assert launches == [(7, (8, 32), kernel, args, {})] and len(launched) == 2
    assert _aot.served() == 0  # (ct.launch is a stand-in here: it compiled nothing)
    _aot.reset()  # the kernel's own compile back
    assert kernel._compile == own
    monkeypatch.delenv(_bundles.ENV_CUBINS)
    other, args64, _ = _forward_launch(Problem(**{**LLAMA.to_dict(), "head_dim": 64}))
    _aot.launch(7, (8, 32), other, args64)  # no bundle, compiling allowed: length-free JIT
    assert isinstance(other._compile, _aot.ShippedCompile) and other._compile.jit
    assert other._compile.original == other.__class__._compile.__get__(other)
    monkeypatch.setenv(_aot.ENV_JIT, "0")
    _aot.reset()
    _aot.launch(7, (8, 32), other, args64)  # compiling off: every kernel is answered by us
    assert isinstance(other._compile, _aot.ShippedCompile) and not other._compile.jit


def test_a_launch_refused_for_want_of_memory_says_so(use_bundles, monkeypatch):
    """cuTile's out-of-memory launch error becomes ours, worded as torch's own (``"CUDA out of
    memory."`` first, one argument: what transformers' and accelerate's batch-size finders
    look for); any other error passes as it came."""
    from tiledattention import LaunchOutOfMemoryError, TiledAttentionError

    kernel, args, _ = _forward_launch(LLAMA)
    raised = {}

    def refuse(*a, **kw):
        raise raised["error"]

    monkeypatch.setattr(cuda.tile, "launch", refuse)
    raised["error"] = RuntimeError("Failed to launch cuTile kernel: out of memory")
    with pytest.raises(LaunchOutOfMemoryError) as info:
        _aot.launch(7, (8, 32), kernel, args)
    error = info.value
    assert isinstance(error, RuntimeError) and isinstance(error, TiledAttentionError)
    assert len(error.args) == 1 and error.args[0].startswith("CUDA out of memory. ")
    assert f"{kernel._pyfunc.__name__} kernel (grid (8, 32))" in str(error)
    assert error.__cause__ is raised["error"]
    for other in (RuntimeError("Failed to launch cuTile kernel: invalid argument"),
                  ValueError("Grid[0] exceeds 24-bit limit")):
        raised["error"] = other
        with pytest.raises(type(other)) as info:
            _aot.launch(7, (8, 32), kernel, args)
        assert info.value is other


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
    # the call's kernel and the one storing the LSE, each at batch 1 and 2 and at 1000 keys
    # and 1024 (EVEN_K)
    assert "sm_90: 8 kernels" in capsys.readouterr().out
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
    # the training forward is the prefill's problem in the forward family: one job for both;
    # batch 1 also brings batch 2 (the image of every batch of more than one; batch 1's
    # compiles the batch in), batch 4 also batch 1: batches 1, 2 and 4; and 100 tokens also
    # 256 (a key count the key tile divides: EVEN_K), the decode step over 100 keys too
    assert len(jobs) == 2 * 3 * 2 * 3 * 2
    assert {dict(j.problem)["seqlen_k"] for j in jobs} == {100, 256}
    by_family = {}
    for job in jobs:
        by_family.setdefault(job.family, set()).add(dict(job.problem)["seqlen_q"])
    assert by_family == {"forward": {100, 256}, "decode": {1}, "backward": {100, 256}}
    assert main(["aot", "--arch", "sm_90", "--no-shipped", "--out", str(tmp_path),
                 "--lengths", "64"]) == 2
    assert "describe a --model's calls" in capsys.readouterr().err
    with pytest.raises(SystemExit) as bad:  # argparse's refusal of the option
        main(["aot", "--arch", "sm_90", "--no-shipped", "--out", str(tmp_path),
              "--model", "32/7,128"])
    assert bad.value.code == 2 and "HQ a multiple of HKV" in capsys.readouterr().err



def test_warm_builds_a_models_kernels_into_the_cache_the_runtime_reads(
        monkeypatch, tmp_path, capsys, no_installed_bundles):
    _aot.reset()
    assert main(["warm", "--model", "32/8,128", "--lengths", "1000", "--batch", "1",
                 "--arch", "sm_90", "--jobs", "2"]) == 0
    warmed = list((tmp_path / "cache" / "tiledattention" / "cubins").glob("cubins-sm_90-*.zip"))
    assert len(warmed) == 1 and warmed[0] in _bundles.bundle_paths()
    try:
        # prompts of other lengths too: unaligned (1500) and aligned to the key tile (2048)
        for shape, causal in (("1,32/8,1000,128", "yes"), ("3,32/8,1000,128", "yes"),
                              ("1,32/8,1500,128", "yes"), ("2,32/8,2048,128", "yes"),
                              ("1,32/8,1:1000,128", "no"), ("5,32/8,1:1000,128", "no")):
            capsys.readouterr()
            assert main(["explain", "--device", "sm_90", "--shape", shape, "--dtype", "bf16",
                         "--causal", causal]) == 0
            assert "launch   shipped cubins" in capsys.readouterr().out, shape
        # another model's request gets a file of its own; the first stays
        assert main(["warm", "--model", "16/16,64", "--lengths", "300", "--batch", "1",
                     "--arch", "sm_90", "--jobs", "2"]) == 0
        assert len(list(warmed[0].parent.glob("cubins-sm_90-*.zip"))) == 2
    finally:
        _aot.reset()
    capsys.readouterr()
    assert main(["warm", "--arch", "sm_90"]) == 2
    assert "--preset NAME or --model" in capsys.readouterr().err
    monkeypatch.setattr("tiledattention.local_devices", lambda: [])
    assert main(["warm", "--preset", "llama-3-8b"]) == 2
    assert "no CUDA device here" in capsys.readouterr().err


def test_shipped_rows_build_for_every_target_and_their_launches_are_served(
        tmp_path, monkeypatch, no_installed_bundles):
    """A row of each family of the shipped sm_90 table, built for Hopper, Blackwell and RTX
    Blackwell (three of the wheel's architectures, for CI's time): at its batch, at the other
    batch pattern and at the other key-length pattern, every kernel its launches compile is served by an image, on
    every architecture (what ``scripts/bundle_coverage.py`` checks for the whole table)."""
    from tiledattention import get_family, shipped_table
    from tiledattention.tooling import launch_path
    from tuner.lookup import runtime_resolution, shipped_rows

    rows = {}
    for row in shipped_table("sm_90").rows():
        rows.setdefault(row.family, row)
    assert set(rows) == {"forward", "decode", "backward"}
    named = [(family, row.problem) for family, row in rows.items()]
    report = build_bundles(jobs_for(ARCHES, named, shipped=False), tmp_path, processes=2)
    assert report.failures == [] and set(report.bundles) == set(ARCHES)
    monkeypatch.setenv(_bundles.ENV_CUBINS, os.pathsep.join(
        str(path) for path, _, _ in report.bundles.values()))
    _aot.reset()
    try:
        for arch in ARCHES:
            for name, problem in named:
                other = 1 if problem.batch > 1 else 2  # (batch 1 is compiled in)
                k = problem.seqlen_k  # and a key count the key tile divides or not (EVEN_K)
                keys = k + 1 if k % 32 == 0 else -(-k // 256) * 256
                longer = dataclasses.replace(
                    problem, seqlen_k=keys,
                    seqlen_q=keys if problem.seqlen_q == k else problem.seqlen_q)
                for each in (problem, dataclasses.replace(problem, batch=other), longer):
                    family = get_family(name)
                    schedule = runtime_resolution(family, each, shipped_rows(family, arch),
                                                  arch).schedule
                    path = launch_path(family, each, schedule, arch)
                    assert path.startswith("shipped"), (arch, name, each, path)
    finally:
        _aot.reset()


def test_the_wheels_build_py_ships_builds_or_skips_the_bundles(monkeypatch, tmp_path):
    """``TILEDATTENTION_WHEEL_CUBINS``: unset, the bundles found ship and the missing
    architectures are named; ``build`` runs the build first; ``skip`` checks nothing; an
    editable install neither builds nor checks."""
    from setuptools.command.build_py import build_py

    from tuner.aot import _wheel

    built, said = [], []
    monkeypatch.setattr(_wheel, "_ROOT", tmp_path)
    monkeypatch.setattr(_wheel, "_build_bundles", lambda pretuned: built.append(pretuned))
    monkeypatch.setattr(build_py, "run", lambda self: None)
    pretuned = tmp_path / "tiledattention" / "pretuned"
    pretuned.mkdir(parents=True)
    (pretuned / "cubins-sm_90.zip").write_bytes(b"PK")

    def run(mode, editable=False):
        if mode is None:
            monkeypatch.delenv(_wheel.ENV_WHEEL, raising=False)
        else:
            monkeypatch.setenv(_wheel.ENV_WHEEL, mode)
        command = _wheel.BuildPy.__new__(_wheel.BuildPy)
        command.editable_mode = editable
        command.announce = lambda message, level=1: said.append(message)
        command.run()

    run(None)
    assert built == [] and len(said) == 1
    assert "no cubin bundle for sm_100, sm_103, sm_120, sm_121:" in said[0]
    run("build")
    assert built == [pretuned] and len(said) == 2
    run("skip")
    run("build", editable=True)
    assert built == [pretuned] and len(said) == 2


def test_a_decode_bucket_ships_each_devices_default(monkeypatch):
    """A bucket whose decode default the device's name changes (an H100 runs a short cache's
    67-88 rows unsplit) ships both: the H100's schedule and every other sm_90's."""
    from tiledattention import DECODE

    built = []
    monkeypatch.setattr(type(DECODE), "compile_launchable",
                        lambda self, problem, schedule, arch: built.append(schedule))
    problem = Problem(batch=9, heads_q=16, heads_kv=8, seqlen_q=1, seqlen_k=1600, head_dim=128,
                      dtype="bf16", causal=False)
    images_of(_job("decode", problem, "sm_90"))
    assert [(s.splits, s.occupancy) for s in built] == [(1, 1), (3, 2)]
