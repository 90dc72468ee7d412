"""The one-pass backward (``BackwardSchedule.dq_mode="atomic"``) on the CPU: the schedule field
(round trip, rows stored before it), normalisation, the launches and scratch it makes, the
deterministic selection (torch's flag, ``sdpa_backward(deterministic=True)``, ``explain``), the
search space, and compile-only builds for several architectures (on sm_90 the dQ shares leave
the dK/dV kernel as TMA bulk reduce-adds, ``UTMAREDG``, where cuobjdump is at hand)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import search_spaces
import tiledattention
from tiledattention import BACKWARD, BackwardSchedule, Problem, ScheduleError
from tiledattention.kernels.backward._launch import (DELTA_TILE, DKDV_PARAMETERS, DQ_ACCUM,
                                                     DQ_FIELDS, RANGES, SUM_TILE, kernel_args,
                                                     launches, normalise, scratch_shapes)
from tiledattention.errors import InputTypeError, KernelArgumentError
from tuner.cli import main

from .test_backward import _build, _digests  # one compile cache for both files

ARCHES = ("sm_80", "sm_90", "sm_100", "sm_120", "sm_121")
#: GQA 4/2, S_q != S_k (bottom-right), D 64
GQA = Problem(batch=1, heads_q=4, heads_kv=2, seqlen_q=200, seqlen_k=300, head_dim=64,
              dtype="bf16", causal=True, bottom_right=True)
ONE_PASS = BackwardSchedule(dq_mode="atomic")


# -- the schedule field ---------------------------------------------------------------------------
def test_dq_mode_round_trips_and_defaults_to_the_dq_kernel():
    assert BackwardSchedule().dq_mode == "kernel"
    data = ONE_PASS.to_dict()
    assert data["dq_mode"] == "atomic"
    assert BackwardSchedule.from_dict(data) == ONE_PASS
    assert ONE_PASS.key != BackwardSchedule().key
    # a row stored before the field existed means the two-kernel backward it measured
    old = {k: v for k, v in BackwardSchedule(dq_tile_m=128).to_dict().items() if k != "dq_mode"}
    assert BackwardSchedule.from_dict(old) == BackwardSchedule(dq_tile_m=128)
    assert BackwardSchedule.from_dict(old).dq_mode == "kernel"
    for bad in ("Atomic", "", None, 1, True):
        with pytest.raises(ScheduleError, match="dq_mode must be one of"):
            BackwardSchedule(dq_mode=bad)
    assert "dq atomic" in ONE_PASS.describe() and "dq 64x64" not in ONE_PASS.describe()
    assert "dq atomic" not in BackwardSchedule().describe()


# -- normalisation --------------------------------------------------------------------------------
def test_normalise_drops_the_dq_kernels_fields_from_a_one_pass_schedule():
    busy = ONE_PASS.replace(dq_tile_m=128, dq_tile_n=32, dq_occupancy=3, dq_worker_warps=8,
                            kv_latency=4, dq_heavy_first=True, dkdv_tile_m=128)
    n = normalise(GQA, busy)
    assert n.dq_mode == "atomic" and n.dkdv_tile_m == 128
    assert all(getattr(n, f) == getattr(BackwardSchedule(), f) for f in DQ_FIELDS)
    assert normalise(GQA, n) is n
    # the two-kernel schedule keeps them
    assert normalise(GQA, busy.replace(dq_mode="kernel")).dq_tile_m == 128


def test_wide_one_pass_query_tiles_run_one_cta_per_sm():
    """128-row query tiles at two CTAs per SM gave a wrong dK on an H200 (the record)."""
    wide = ONE_PASS.replace(dkdv_tile_m=128, dkdv_occupancy=2)
    assert normalise(GQA, wide).dkdv_occupancy == 1
    assert normalise(GQA, wide.replace(dkdv_tile_m=64)).dkdv_occupancy == 2
    assert normalise(GQA, wide.replace(dq_mode="kernel")).dkdv_occupancy == 2
    short = dataclasses.replace(GQA, seqlen_q=50)  # the tile is capped at 64 rows
    assert normalise(short, wide).dkdv_occupancy == 2


def test_one_pass_query_steps_are_at_least_64_rows():
    """32-row query steps gave a wrong, run-to-run varying dK on an H200 (the record), also
    where S_q is shorter than 64 rows; the two-kernel backward keeps its 32-row steps."""
    narrow = ONE_PASS.replace(dkdv_tile_m=32, dkdv_tile_n=128, dkdv_worker_warps=8)
    for problem in (GQA, dataclasses.replace(GQA, seqlen_q=20),
                    dataclasses.replace(GQA, seqlen_q=20, ragged=True)):
        n = normalise(problem, narrow)
        assert n.dkdv_tile_m == 64, problem
        assert normalise(problem, n) is n
    assert normalise(GQA, ONE_PASS.replace(dkdv_tile_m=16)).dkdv_tile_m == 64
    assert normalise(GQA, narrow.replace(dq_mode="kernel")).dkdv_tile_m == 32


def test_a_ragged_problem_runs_one_pass_and_its_splits():
    """Each sequence's dQ shares go into its own rows of the accumulator (the kernel cuts it
    like q), so a ragged batch runs either mode; its splits share each sequence's walk."""
    ragged = dataclasses.replace(GQA, ragged=True)
    n = normalise(ragged, ONE_PASS.replace(dkdv_splits=4))
    assert n.dq_mode == "atomic" and n.dkdv_splits == 4
    assert normalise(ragged, ONE_PASS.replace(dq_mode="kernel")).dq_mode == "kernel"
    assert normalise(dataclasses.replace(GQA, window_left=32, softcap=10.0),
                     ONE_PASS).dq_mode == "atomic"  # windows and softcaps: the same masks
    assert normalise(GQA, ONE_PASS.replace(dkdv_splits=2)).dkdv_splits == 2  # splits add too


# -- launches ---------------------------------------------------------------------------------------
def test_one_pass_launches_and_scratch():
    plan = launches(GQA, ONE_PASS.replace(dkdv_splits=2), 0.125)
    assert plan.one_pass and plan.splits == 2 and plan.scale == 0.125
    assert DELTA_TILE == 128
    assert plan.delta_scalars == (DELTA_TILE, 64) and plan.dq_scale_scalars == (SUM_TILE, 64)
    shapes = scratch_shapes(GQA, ONE_PASS.replace(dkdv_splits=2))
    assert shapes["dq_accum"] == (1, 4, 200, 64)
    assert set(shapes) == {"dq_accum", "dk_parts", "dv_parts"}
    assert scratch_shapes(GQA, BackwardSchedule()) == {}
    assert not launches(GQA, BackwardSchedule(), 0.125).one_pass


def test_a_deterministic_ragged_run_launches_the_dq_kernel(monkeypatch):
    """Under ``torch.use_deterministic_algorithms(True)`` a ragged one-pass schedule (a
    searched bucket's row may be one) runs the two kernels, as a dense one does."""
    import torch

    import tiledattention.kernels.backward._family as family_module
    from tiledattention.core._device import DeviceInfo
    from tiledattention.core._ragged import RaggedLayout

    info = DeviceInfo(index=0, arch="sm_90", name="fake", sm_count=132)
    monkeypatch.setattr("tiledattention.core._device.device_info", lambda index: info)
    calls = []
    monkeypatch.setattr(family_module, "launch_ragged",
                        lambda *args, **kwargs: calls.append((args[1], kwargs)))
    ragged = dataclasses.replace(GQA, ragged=True)
    q = torch.empty(1, 4, 200, 64)
    before = torch.are_deterministic_algorithms_enabled()
    try:
        for deterministic in (False, True):
            torch.use_deterministic_algorithms(deterministic)
            BACKWARD.backward("stream", ragged, ONE_PASS, 0.1, q, q, q, q, q, None, None,
                              (q, q, q), ragged=RaggedLayout(None, 200, 300, True))
    finally:
        torch.use_deterministic_algorithms(before)
    (fast, fast_kwargs), (fixed, fixed_kwargs) = calls
    assert fast.one_pass and fast_kwargs["dq_accum"].shape == q.shape
    assert fast_kwargs["dq_accum"].dtype == torch.float32
    assert not fixed.one_pass and fixed_kwargs["dq_accum"] is None


def test_one_pass_launches_run_the_row_kernels_over_every_row(monkeypatch):
    """The delta kernel, the dK/dV kernel with the accumulator, the dQ-scale kernel, the row
    kernels' grids from the call's ``[B, H_q, S_q, D]`` rows; then the partials' sums."""
    import cuda.tile
    import torch

    from tiledattention.kernels.backward._launch import delta_kernel, dq_scale_kernel, launch

    calls = []
    monkeypatch.setattr(cuda.tile, "launch", lambda *a, **k: calls.append(a))
    plan = launches(GQA, ONE_PASS.replace(dkdv_splits=2), 0.125)
    q = torch.empty(1, 4, 200, 64, dtype=torch.bfloat16)
    k = torch.empty(1, 2, 300, 64, dtype=torch.bfloat16)
    scratch = {name: torch.empty(shape) for name, shape in scratch_shapes(
        GQA, ONE_PASS.replace(dkdv_splits=2)).items()}
    launch("stream", plan, q, k, k, q, q, "lse", "delta", "dq", k, k, scratch)
    assert [c[2] for c in calls[:3]] == [delta_kernel(), plan.dkdv, dq_scale_kernel()]
    assert calls[0][1] == (-(-200 // DELTA_TILE), 4, 1)
    assert calls[0][3][:4] == (q, q, "delta", scratch["dq_accum"])
    assert calls[2][1] == (-(-200 // SUM_TILE), 4, 1)
    assert calls[2][3][:3] == (scratch["dq_accum"], "dq", 0.125)
    assert calls[1][1] == plan.dkdv_grid and len(calls) == 5  # and the two partials' sums


def test_the_accumulator_follows_ranges_and_is_given_exactly_for_one_pass_plans():
    names = DKDV_PARAMETERS.names
    assert names.index(DQ_ACCUM) == names.index(RANGES) + 2  # after Work
    one_pass, two_kernel = (launches(GQA, s, 0.125) for s in (ONE_PASS, BackwardSchedule()))
    arrays = tuple(f"a{i}" for i in range(10))
    _, dkdv = kernel_args(one_pass, *arrays, dq_accum="ACC")
    at = 8 + one_pass.ranges_at
    assert dkdv[at:at + 3] == ((), (), "ACC")
    assert dkdv[at + 3:] == one_pass.dkdv_scalars[one_pass.ranges_at:]
    _, dkdv = kernel_args(two_kernel, *arrays)
    assert dkdv[at:at + 3] == ((), (), ())  # zero-byte placeholders: the code of before
    with pytest.raises(KernelArgumentError, match="dq_accum must be given"):
        kernel_args(one_pass, *arrays)
    with pytest.raises(KernelArgumentError, match="dq_accum must be given"):
        kernel_args(two_kernel, *arrays, dq_accum="ACC")


# -- deterministic selection ----------------------------------------------------------------------
def test_the_deterministic_schedule_computes_dq_with_the_dq_kernel():
    """A one-pass schedule gives way to the two-kernel default (its dK/dV fields too: they
    were chosen for the one-pass kernel's extra tile); a two-kernel one stays as it is."""
    two_kernel = BACKWARD.default_schedule("sm_90", GQA)
    assert two_kernel.dq_mode == "kernel" and two_kernel.dkdv_occupancy == 2
    for one_pass in (ONE_PASS, ONE_PASS.replace(dkdv_tile_n=128, dkdv_occupancy=1,
                                                dkdv_worker_warps=8)):
        assert BACKWARD.deterministic_schedule("sm_90", GQA, one_pass) == two_kernel
    kernel = BackwardSchedule(dq_tile_m=128)
    assert BACKWARD.deterministic_schedule("sm_90", GQA, kernel) == kernel
    assert "bitwise reproducible" in BACKWARD.determinism(GQA, kernel)
    assert "no fixed order" in BACKWARD.determinism(GQA, ONE_PASS)


# -- the softcap default ----------------------------------------------------------------------------
def _capped(d: int = 128, left: int = -1, **fields) -> Problem:
    """GQA 8/2 over 4096 keys, causal, scores capped at 30 (``fields`` replace any)."""
    return dataclasses.replace(GQA, **{
        "heads_q": 8, "seqlen_q": 4096, "seqlen_k": 4096, "head_dim": d, "bottom_right": False,
        "softcap": 30.0, "window_left": left, **fields})


@pytest.mark.parametrize("d, fields", [
    (64, dict(dkdv_tile_n=128, dkdv_tile_m=64, dkdv_occupancy=1, dkdv_worker_warps=8)),
    (96, dict(dkdv_tile_n=128, dkdv_tile_m=64, dkdv_occupancy=1, dkdv_worker_warps=8)),
    (128, dict(dkdv_tile_n=128, dkdv_tile_m=64, dkdv_occupancy=1, dkdv_worker_warps=8)),
    (256, dict(dkdv_tile_n=64, dkdv_tile_m=64, dkdv_occupancy=1, dkdv_worker_warps=8,
               q_latency=3))])
def test_capped_scores_run_one_pass_on_hopper_with_the_rules_fields(d, fields):
    s = BACKWARD.default_schedule("sm_90", _capped(d))
    assert s.dq_mode == "atomic"
    assert {name: getattr(s, name) for name in fields} == fields
    # the same problem uncapped, or on other generations: the two kernels
    assert BACKWARD.default_schedule("sm_90", _capped(d, softcap=0.0)).dq_mode == "kernel"
    for arch in ("sm_80", "sm_100", "sm_120"):
        assert BACKWARD.default_schedule(arch, _capped(d)).dq_mode == "kernel"
    # a deterministic run: the two-kernel default, as without the rule
    two_kernel = BACKWARD.deterministic_schedule("sm_90", _capped(d), s)
    assert two_kernel.dq_mode == "kernel" and two_kernel.dkdv_tile_n == 64
    assert two_kernel.dkdv_occupancy == (1 if d == 256 else 2)
    assert two_kernel.q_latency == (2 if d == 256 else None)


@pytest.mark.parametrize("d, left, one_pass", [
    (128, 127, False), (128, 511, False), (128, 1022, False), (128, 1023, True),
    (128, 4095, True), (256, 127, False), (256, 510, False), (256, 511, True)])
def test_a_narrow_window_keeps_the_two_kernels(d, left, one_pass):
    """The rule's span: a row sees ``left + 1`` keys of a causal window (1024 at D 128, 512
    at D 256)."""
    s = BACKWARD.default_schedule("sm_90", _capped(d, left))
    assert (s.dq_mode == "atomic") == one_pass


def test_short_capped_problems_and_ragged_ones():
    """A problem shorter than the rule's span but unwindowed runs one-pass (every row may see
    every key); a ragged batch runs the two kernels (the one-pass kernels index whole batch
    entries)."""
    short = dataclasses.replace(_capped(), seqlen_q=200, seqlen_k=300)
    assert BACKWARD.default_schedule("sm_90", short).dq_mode == "atomic"
    assert BACKWARD.default_schedule("sm_90", _capped(ragged=True)).dq_mode == "kernel"


def _fake_cuda(monkeypatch, calls):
    """Tensors on the CPU pass for CUDA ones: the kernels each launch enqueues recorded."""
    torch = pytest.importorskip("torch")
    import cuda.tile

    import tiledattention.entry_points._training as training
    from tiledattention.core._device import DeviceInfo

    monkeypatch.setattr(cuda.tile, "launch", lambda *args, **kwargs: calls.append(args[2]))
    monkeypatch.setattr(training, "check_cuda", lambda *args: None)
    info = DeviceInfo(index=0, arch="sm_90", name="fake", sm_count=132)
    monkeypatch.setattr(training, "device_info", lambda index: info)
    monkeypatch.setattr("tiledattention.core._device.device_info", lambda index: info)
    from tiledattention.core import _plans

    _plans.bind_torch()
    monkeypatch.setattr(_plans, "raw_stream", lambda device: 0)  # (the launch is recorded)
    return torch


@pytest.mark.parametrize("how", ["argument", "torch flag", "neither"])
def test_deterministic_runs_launch_the_dq_kernel(monkeypatch, how):
    calls: list = []
    torch = _fake_cuda(monkeypatch, calls)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 200, 64, generator=g).to(torch.bfloat16)
    k = torch.randn(1, 2, 300, 64, generator=g).to(torch.bfloat16)
    lse = torch.zeros(1, 4, 200)
    before = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(how == "torch flag")
        tiledattention.sdpa_backward(q, q, k, k, q, lse, "bottom_right", schedule=ONE_PASS,
                                     deterministic=how == "argument")
    finally:
        torch.use_deterministic_algorithms(before)
    from tiledattention.kernels.backward._launch import (delta_kernel, dkdv_kernel, dq_kernel,
                                                         dq_scale_kernel)

    fixed = BACKWARD.deterministic_schedule("sm_90", GQA, ONE_PASS)
    want = ([delta_kernel(), dkdv_kernel(normalise(GQA, ONE_PASS)), dq_scale_kernel()]
            if how == "neither" else [dq_kernel(fixed), dkdv_kernel(fixed)])
    assert calls == want, calls
    with pytest.raises(InputTypeError, match="deterministic must be a bool"):
        tiledattention.sdpa_backward(q, q, k, k, q, lse, "bottom_right", deterministic="yes")


def test_explain_says_which_dq_mode_runs_and_why(capsys, monkeypatch, tmp_path):
    import tiledattention.kernels.backward._defaults as defaults

    monkeypatch.setitem(defaults.DQ_MODE, "hopper", "atomic")
    argv = ["explain", "--device", "sm_90", "--shape", "1,4/2,200:300,64", "--causal",
            "bottom_right", "--training", "--db", str(tmp_path / "none.sqlite")]
    assert main(argv) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "dq atomic" in out and "no fixed order" in out
    assert "deterministic run: dkdv" in out and "| dq 64x64" in out
    monkeypatch.setitem(defaults.DQ_MODE, "hopper", "kernel")
    assert main(argv) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "dq_mode kernel" in out and "deterministic run" not in out


# -- the search space -------------------------------------------------------------------------------
def test_the_search_spaces_hold_both_dq_modes():
    for name in ("full", "compact"):
        space = search_spaces.space_for("backward", "sm_90", name)
        assert space.choices["dq_mode"] == ("kernel", "atomic")
        restricted = search_spaces.BACKWARD_SPACE.restrict(space, GQA)
        assert restricted.choices["dq_mode"] == ("kernel", "atomic")
        ragged = search_spaces.BACKWARD_SPACE.restrict(space, dataclasses.replace(GQA, ragged=True))
        assert ragged.choices["dq_mode"] == ("kernel", "atomic")
    model = search_spaces.BACKWARD_SPACE.model_ms
    assert model(GQA, ONE_PASS) != model(GQA, BackwardSchedule())


# -- compile-only builds ----------------------------------------------------------------------------
#: sm_90's build is of a window and a softcap (the variants' masks in the one-pass walk)
VARIANTS = dataclasses.replace(GQA, window_left=64, softcap=20.0)


@pytest.mark.parametrize("arch", ARCHES)
def test_the_one_pass_backward_compiles_for_each_architecture(arch):
    result = _build(VARIANTS if arch == "sm_90" else GQA, ONE_PASS, arch)
    assert result.arch == arch and result.cubin[:4] == b"\x7fELF"
    assert len(result.other_cubins) == 2  # the delta kernel and the dQ-scale kernel


def _cuobjdump() -> str | None:
    found = shutil.which("cuobjdump")
    if found is None:  # the nvidia-cuda-cuobjdump wheel's, beside nvdisasm's
        here = Path(sys.prefix, "lib", f"python{sys.version_info.major}.{sys.version_info.minor}",
                    "site-packages", "nvidia", "cu13", "bin")
        if (here / "cuobjdump").exists() and (here / "nvdisasm").exists():
            found = str(here / "cuobjdump")
    return found


def _sass(cubin: bytes, path: Path) -> str:
    """The SASS of ``cubin`` (written to ``path`` first), by ``cuobjdump -sass``; skips the
    test where cuobjdump is absent."""
    tool = _cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump (nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm wheels) absent")
    path.write_bytes(cubin)
    env = {**os.environ, "PATH": f"{Path(tool).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run([tool, "-sass", str(path)], capture_output=True, text=True, env=env,
                          check=True).stdout


def test_on_sm_90_the_dq_shares_are_tma_bulk_reduce_adds(tmp_path):
    builds = {mode: _build(VARIANTS, BackwardSchedule(dq_mode=mode)) for mode in ("kernel",
                                                                                "atomic")}
    assert _digests(builds["kernel"])[0] != _digests(builds["atomic"])[0]
    sass = {mode: _sass(build.cubin, tmp_path / f"{mode}.cubin")
            for mode, build in builds.items()}
    assert "UTMAREDG" in sass["atomic"] and ".ADD" in sass["atomic"]
    assert "UTMAREDG" not in sass["kernel"]
    assert "ATOMG" not in sass["atomic"] and "REDG" not in sass["atomic"].replace("UTMAREDG", "")
