"""``tiledtune bench`` without a GPU: the forward preset's grid and flags, the engine's
check-then-time logic over a family whose case runs on the CPU, CSV, reports, plots, and the
committed studies re-rendered from their CSVs."""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import tiledattention
from tiledattention import Problem
from tuner import bench
from tuner.bench import (
    CONTENDERS,
    MAX_PNG_BYTES,
    BenchConfigError,
    BenchResult,
    PlotsUnavailable,
    RunInfo,
    build_grid,
    load_results,
    render_markdown,
    write_csv,
    write_plots,
    write_run_info,
)
from tuner.commands import bench_cmd
from tuner.commands._problems import parse_problem_fields
from tuner.errors import TunerValueError, UnreadableFile, UsageError
from tuner.measure import Timing

ROOT = Path(__file__).resolve().parents[2]
INFO = RunInfo(command="tiledtune bench --quick", date="2025-01-01T00:00:00+00:00")


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tiledtune bench")
    bench_cmd.configure(parser)
    return parser.parse_args(list(argv))


def _squash(text: str) -> str:
    return " ".join(text.split())  # rich wraps long lines


# -- grid ----------------------------------------------------------------------------------------

def _layer(p: Problem) -> tuple:
    return (p.batch, p.heads_q, p.seqlen_q, p.head_dim, p.dtype, p.causal)


def test_default_grid_points():
    grid = build_grid()
    points = grid.problems
    assert len(points) == 3 * 6 * 2 * 2 == len(set(points))
    assert grid.contenders == CONTENDERS == ("tiledattention", "tiledattention-default",
                                             "torch-flash", "torch-cudnn", "flash-attn-4")
    assert all(isinstance(p, tiledattention.FORWARD.problem_type) for p in points)
    assert {p.head_dim for p in points} == {64, 128, 256}
    assert {p.seqlen_q for p in points} == {512, 1024, 2048, 4096, 8192, 16384}
    assert {p.dtype for p in points} == {"bf16", "fp16"}
    assert {p.causal for p in points} == {True, False}
    for p in points:
        assert p.batch * p.seqlen_q == 16384 and p.heads_q * p.head_dim == 2048
        assert (p.seqlen_k, p.heads_kv, p.bottom_right) == (p.seqlen_q, p.heads_q, False)
    assert _layer(points[0]) == (32, 32, 512, 64, "bf16", False)  # dtype, mask, D, S order
    assert _layer(points[-1]) == (1, 8, 16384, 256, "fp16", True)


def test_custom_grid_keeps_invariants_and_contender_order():
    grid = build_grid(tokens="8192", hidden="1024", head_dims="128,64", seqlens="256,8192",
                      dtypes="fp16", causal="yes", contenders="torch-cudnn,tiledattention")
    points = grid.problems
    assert len(points) == 4
    assert {(p.seqlen_q, p.batch) for p in points} == {(256, 32), (8192, 1)}
    assert {(p.head_dim, p.heads_q) for p in points} == {(128, 8), (64, 16)}
    assert all(p.dtype == "fp16" and p.causal for p in points)
    assert grid.contenders == ("tiledattention", "torch-cudnn")  # canonical order
    assert build_grid(contenders="all").contenders == CONTENDERS
    assert build_grid(causal=[True], dtypes=["bf16"], seqlens=[1024]).problems[0].causal


def test_quick_grid_is_small_and_explicit_flags_win():
    quick = build_grid(quick=True)
    assert 0 < len(quick.problems) < len(build_grid().problems) / 4
    assert {p.dtype for p in build_grid(quick=True, dtypes="fp16").problems} == {"fp16"}
    settings = bench_cmd.settings_from_args(_args("--quick"))
    assert settings.max_seconds < bench.BenchSettings().max_seconds
    assert bench_cmd.settings_from_args(_args("--quick", "--samples", "77")).max_samples == 77


@pytest.mark.parametrize("kwargs, flag, words", [
    (dict(seqlens="3000"), "--seqlens", "does not divide --tokens 16384"),
    (dict(seqlens="32768"), "--seqlens", "does not divide"),
    (dict(seqlens="0"), "--seqlens", "positive integer"),
    (dict(seqlens="512,512"), "--seqlens", "twice"),
    (dict(seqlens="512,,1024"), "--seqlens", "empty item"),
    (dict(seqlens=""), "--seqlens", "comma-separated"),
    (dict(head_dims="100"), "--head-dims", "multiple of 8"),
    (dict(head_dims="48"), "--head-dims", "does not divide --hidden 2048"),
    (dict(head_dims="x"), "--head-dims", "positive integer"),
    (dict(dtypes="fp32"), "--dtypes", "'fp32'"),
    (dict(causal="maybe"), "--causal", "'maybe'"),
    (dict(causal="yes,causal"), "--causal", "twice"),
    (dict(tokens="abc"), "--tokens", "positive integer"),
    (dict(hidden="-5"), "--hidden", "positive integer"),
    (dict(tokens="1000", seqlens="512"), "--seqlens", "--tokens 1000"),
    (dict(contenders="triton"), "--contenders", "'triton' for --kernel forward"),
    (dict(contenders="eager"), "--contenders", "known: tiledattention, "),
    (dict(batch="4"), "--batch", "belongs to the decode grid"),
], ids=lambda x: x if isinstance(x, str) else None)
def test_bad_grid_flags_are_rejected_naming_the_flag(kwargs, flag, words):
    with pytest.raises(BenchConfigError) as info:
        build_grid(**kwargs)
    message = str(info.value)
    assert message.startswith(flag), message
    assert words in message
    assert isinstance(info.value, UsageError) and isinstance(info.value, ValueError)


@pytest.mark.parametrize("argv, flag", [
    (("--seqlens", "3000"), "--seqlens"),
    (("--head-dims", "100"), "--head-dims"),
    (("--dtypes", "f16"), "--dtypes"),
    (("--samples", "0"), "--samples"),
    (("--rel-precision", "nan"), "--rel-precision"),
    (("--min-samples", "300"), "--min-samples"),
    (("--device", "-1"), "--device"),
    (("--seed", "x"), "--seed"),
], ids=lambda x: x if isinstance(x, str) else "-".join(x))
def test_run_rejects_bad_flags_with_exit_2(argv, flag, capsys):
    assert bench_cmd.run(_args(*argv)) == 2
    err = _squash(capsys.readouterr().err)
    assert "error" in err and flag in err


def test_kernel_option_accepts_the_families_with_a_grid(capsys):
    assert _args().kernel == "forward"
    assert [_args("--kernel", k).kernel for k in ("forward", "decode", "backward")] == \
        ["forward", "decode", "backward"]
    assert bench_cmd.KERNELS == tuple(bench.PRESETS) == ("forward", "decode", "backward")
    with pytest.raises(SystemExit) as info:
        _args("--kernel", "toy")
    assert info.value.code == 2
    err = _squash(capsys.readouterr().err)
    assert "--kernel" in err and "forward, decode, backward families only" in err
    assert "'toy'" in err


def test_interleave_option_is_validated():
    assert bench_cmd.settings_from_args(_args("--interleave", "30")).interleave == 30
    assert bench_cmd.settings_from_args(_args()).interleave == 0
    with pytest.raises(BenchConfigError, match="--interleave"):
        bench_cmd.settings_from_args(_args("--interleave", "-1"))


def test_timing_host_times_the_contenders_as_isolated_calls_and_the_ceilings_as_gpu_time(
        cpu_families, monkeypatch):
    """``--timing host`` (issue 47: the isolated view with the host's time): the contenders'
    timing gets ``host=True``; the matrix-product and copy ceilings stay GPU time."""
    settings = bench_cmd.settings_from_args(_args("--timing", "host"))
    assert settings.host and not bench_cmd.settings_from_args(_args()).host
    assert settings.timing_kwargs()["host"] is True and "host" not in settings.ceiling_kwargs()
    cpu, other = cpu_families
    cpu.lookup = _Sched(2.0, "default sm_90")
    other.lookup = _Sched(3.0, "other wrong")
    seen = []

    def timing(fn, **kwargs):
        seen.append(kwargs["host"])
        return _fake_timing(fn, **kwargs)
    bench.measure_point(_preset(), _PROBLEM, _NAMES[:1], settings, env={}, time_fn=timing)
    assert seen == [True]
    import tuner.measure as measure

    ceiling = []
    monkeypatch.setattr(measure, "time_cuda", lambda fn, **kw: ceiling.append(kw) or Timing(
        median_ms=1.0, spread_ms=0.0, mean_ms=1.0, min_ms=1.0, samples=1))
    from tuner.bench import _engine

    _engine._ceiling_ms(lambda: None, settings)
    assert ceiling and "host" not in ceiling[0]


def test_timing_loop_times_the_contenders_back_to_back_on_a_warm_l2(cpu_families):
    """``--timing loop`` (the steady state with the host's time): the contenders' timing, on
    its own and interleaved, gets ``loop=True`` and no L2 flush; the ceilings stay GPU time."""
    settings = bench_cmd.settings_from_args(_args("--timing", "loop"))
    assert settings.loop and not settings.host
    assert not bench_cmd.settings_from_args(_args("--timing", "host")).loop
    assert settings.mode_kwargs() == {"host": False, "loop": True, "flush_l2": False}
    assert "loop" not in settings.ceiling_kwargs()
    cpu, other = cpu_families
    cpu.lookup = _Sched(2.0, "default sm_90")
    other.lookup = _Sched(3.0, "other wrong")
    seen = []

    def timing(fn, **kwargs):
        seen.append((kwargs["loop"], kwargs["flush_l2"]))
        return _fake_timing(fn, **{k: v for k, v in kwargs.items() if k != "loop"})
    bench.measure_point(_preset(), _PROBLEM, _NAMES[:1], settings, env={}, time_fn=timing)
    assert seen == [(True, False)]
    interleaved = []

    def rounds(fns, **kwargs):
        interleaved.append(kwargs)
        return {name: _fake_timing(fn, min_samples=3) for name, fn in fns.items()}
    looped = dataclasses.replace(settings, interleave=3)
    rows = bench.measure_point(_preset(), _PROBLEM, _NAMES[:1], looped, env={},
                               interleaved_fn=rounds)
    assert interleaved == [{"rounds": 3, "host": False, "loop": True, "flush_l2": False}]
    assert [row.status for row in rows] == ["ok"]


# -- --problem: exactly the problems named, instead of the grid ----------------------------------

_GQA = ("batch=1,heads_q=32,heads_kv=8,seqlen_q=4096,seqlen_k=4096,head_dim=128,dtype=bf16,"
        "causal=yes,bottom_right=no")
_BOTTOM_RIGHT = ("batch=2,heads_q=16,heads_kv=4,seqlen_q=512,seqlen_k=2048,head_dim=64,"
                 "dtype=fp16,causal=yes,bottom_right=yes")
_DECODE = "batch=8,heads_q=32,heads_kv=8,seqlen_q=1,seqlen_k=8192,head_dim=128,dtype=bf16,causal=no"


@pytest.mark.parametrize("kernel", ["forward", "decode", "backward"])
def test_problem_grid_is_exactly_the_problems_given(kernel):
    texts = (_BOTTOM_RIGHT, _GQA, _DECODE)
    grid = build_grid(kernel, problems=[parse_problem_fields(t) for t in texts])
    problem_type = tiledattention.get_family(kernel).problem_type
    assert all(type(p) is problem_type for p in grid.problems)
    assert grid.problems == (
        Problem(batch=2, heads_q=16, heads_kv=4, seqlen_q=512, seqlen_k=2048, head_dim=64,
                dtype="fp16", causal=True, bottom_right=True),
        Problem(batch=1, heads_q=32, heads_kv=8, seqlen_q=4096, seqlen_k=4096, head_dim=128,
                dtype="bf16", causal=True),
        Problem(batch=8, heads_q=32, heads_kv=8, seqlen_q=1, seqlen_k=8192, head_dim=128,
                dtype="bf16", causal=False))
    assert grid.problems[0].causal_offset == 2048 - 512  # bottom-right kept, S_q != S_k
    assert grid.contenders == bench.PRESETS[kernel].contenders and grid.kernel == kernel
    only = build_grid(kernel, problems=[parse_problem_fields(_DECODE)], quick=True,
                      contenders="tiledattention")
    assert len(only.problems) == 1 and only.contenders == ("tiledattention",)


def test_problem_grid_drops_duplicates_keeping_the_first_order():
    # bottom-right with S_q == S_k is the top-left causal problem (the canonical form)
    same = _GQA.replace("bottom_right=no", "bottom_right=yes")
    grid = build_grid("backward", problems=[parse_problem_fields(t) for t in
                                            (_DECODE, _GQA, _DECODE, same, _GQA)])
    assert [(p.seqlen_q, p.causal) for p in grid.problems] == [(1, False), (4096, True)]


@pytest.mark.parametrize("kernel, options, flag", [
    ("forward", dict(seqlens="1024"), "--seqlens"),
    ("backward", dict(causal="yes"), "--causal"),
    ("forward", dict(tokens="8192"), "--tokens"),
    ("backward", dict(head_dims=(64,)), "--head-dims"),
    ("decode", dict(batch="4"), "--batch"),
    ("decode", dict(seqlens_k="1024"), "--seqlens-k"),
    ("decode", dict(dtypes="fp16"), "--dtypes"),
    ("forward", dict(masks="none"), "--masks"),  # another family's option: the same refusal
], ids=lambda x: x if isinstance(x, str) else None)
def test_grid_options_are_refused_with_problems_naming_the_flag(kernel, options, flag):
    with pytest.raises(BenchConfigError) as info:
        build_grid(kernel, problems=[parse_problem_fields(_GQA)], **options)
    message = str(info.value)
    assert message.startswith(flag + " ") and "--problem replaces the" in message, message
    assert build_grid(kernel, problems=[parse_problem_fields(_GQA)], seqlens=None,
                      no_matmul=kernel != "decode").problems  # None: not given; no grid option


@pytest.mark.parametrize("text, words", [
    (_GQA.replace("head_dim=128", "head_dim=7"), "head_dim must be a multiple of 8"),
    (_GQA.replace("heads_kv=8", "heads_kv=5"), "must be a multiple of heads_kv (5)"),
    (_GQA.replace("dtype=bf16", "dtype=fp32"), "dtype must be one of"),
    (_GQA.replace(",bottom_right=no", "").replace(",causal=yes", ""), "missing ['causal']"),
    (_GQA + ",window=128", "unknown ['window']"),
    (_GQA.replace("batch=1", "batch=x"), "batch must be a positive int; got 'x'"),
], ids=["head_dim", "heads", "dtype", "missing", "unknown", "batch"])
def test_a_problem_the_family_refuses_names_problem_and_its_text(text, words):
    with pytest.raises(BenchConfigError) as info:
        build_grid("backward", problems=[parse_problem_fields(_DECODE),
                                         parse_problem_fields(text)])
    message = str(info.value)
    assert message.startswith(f"--problem {text}: not a problem the backward kernel takes: ")
    assert words in message, message
    assert isinstance(info.value, UsageError) and info.value.__cause__ is None
    assert info.value.__suppress_context__
    with pytest.raises(BenchConfigError, match="^--problem needs a non-empty list"):
        build_grid(problems=[])
    with pytest.raises(BenchConfigError, match="^--problem needs a non-empty list"):
        build_grid(problems=parse_problem_fields(_GQA))


def test_problem_option_through_configure_and_grid_from_args(capsys):
    args = _args("--kernel", "backward", "--problem", _BOTTOM_RIGHT, "--problem", _GQA,
                 "--quick", "--contenders", "torch-flash,tiledattention")
    grid = bench_cmd.grid_from_args(args)
    assert grid == build_grid("backward", problems=[parse_problem_fields(_BOTTOM_RIGHT),
                                                    parse_problem_fields(_GQA)],
                              contenders="tiledattention,torch-flash")
    assert grid.problems[0].bottom_right and grid.problems[0].group_size == 4
    assert bench_cmd.settings_from_args(args).interleave == 10  # --quick still applies
    decode = bench_cmd.grid_from_args(_args("--kernel", "decode", "--problem", _DECODE))
    assert [p.seqlen_k for p in decode.problems] == [8192]
    assert bench_cmd.grid_from_args(_args("--problem", _GQA, "--no-matmul")).problems
    assert _args().problem is None and bench_cmd.grid_from_args(_args()) == build_grid()
    with pytest.raises(SystemExit) as info:  # bad FIELD=VALUE syntax: argparse's usage error
        _args("--problem", "batch=1,heads_q")
    assert info.value.code == 2
    err = _squash(capsys.readouterr().err)
    assert "usage:" in err and "--problem" in err and "expected FIELD=VALUE" in err
    assert bench_cmd.run(_args("--problem", _GQA, "--seqlens", "1024")) == 2
    err = _squash(capsys.readouterr().err)
    assert "error: --seqlens cannot go with --problem" in err, err
    assert bench_cmd.run(_args("--problem", _GQA.replace("head_dim=128", "head_dim=7"))) == 2
    err = _squash(capsys.readouterr().err)
    assert "error: --problem batch=1" in err and "head_dim=7" in err, err
    assert "Traceback" not in err


def test_environment_names_the_device_and_the_familys_versions(monkeypatch):
    from tiledattention import BACKWARD, DeviceInfo
    from tiledattention.tooling import current_provenance

    fake = DeviceInfo(index=3, arch="sm_90", name="NVIDIA H100 80GB HBM3", sm_count=132)
    monkeypatch.setattr(tiledattention, "device_info", lambda index: fake)
    env = bench.environment(3, BACKWARD)
    prov = current_provenance(BACKWARD)
    assert env == dict(device="NVIDIA H100 80GB HBM3", arch="sm_90", driver=prov.driver,
                       torch_version=prov.torch, cuda_tile_version=prov.cuda_tile)


# -- the engine on the CPU: a family whose case runs on torch's CPU tensors ----------------------

@dataclass(frozen=True)
class _Sched:
    """A "schedule" of the CPU family: its launch writes ``factor * q`` (correct: 2)."""

    factor: float
    name: str

    def describe(self) -> str:
        return self.name

    @classmethod
    def from_dict(cls, data):
        return cls(**data)


class _CpuCase(tiledattention.Case):
    def __init__(self, problem, log):
        import torch

        self.q = torch.randn(problem.batch, problem.heads_q, problem.seqlen_q, problem.head_dim,
                             generator=torch.Generator().manual_seed(1))
        self.out, self.log = torch.empty_like(self.q), log

    def launcher(self, schedule):
        def run():
            if schedule.factor is None:
                raise RuntimeError("No available kernel. Aborting execution.\nsecond line")
            self.log.append(schedule.name)
            self.out.copy_(self.q * schedule.factor)
        return run

    def error(self, run):
        self.out.fill_(float("nan"))
        run()
        return float((self.out - 2 * self.q).norm() / (2 * self.q).norm())

    def baselines(self):
        import warnings

        def broken():
            warnings.warn("Flash attention kernel not used because: head dim 37")
            raise RuntimeError("No available kernel. Aborting execution.")
        return {"torch-cudnn": lambda: self.log.append("cudnn"), "torch-flash": broken}


class _CpuFamily(tiledattention.Family):
    """Lookup: ``lookup`` (set by the tests); default: factor 2 named "default"."""

    problem_type = tiledattention.Problem
    schedule_type = _Sched
    template_modules = (__name__,)
    bucket_fields = ("dtype",)
    tolerances = {"bf16": 1e-6}  # the dtype its problems have (tolerance() answers anyway)

    def __init__(self, name, lookup):
        self.name, self.lookup, self.log = name, lookup, []

    def default_schedule(self, arch, problem):
        return _Sched(2.0, f"default {arch}")

    def flops(self, problem):
        return 1e9

    def compile(self, problem, schedule, arch):
        raise NotImplementedError

    def case(self, problem, device_index):
        return _CpuCase(problem, self.log)

    def tolerance(self, problem):
        return 1e-6


class _Runtime:
    def resolution(self, family, problem, device_index):
        return tiledattention.Resolution(schedule=family.lookup, source="exact-device",
                                         detail=f"{family.name} row", family=family.name)


@pytest.fixture
def cpu_families(monkeypatch):
    pytest.importorskip("torch")
    made = [tiledattention.register_family(_CpuFamily(name, _Sched(2.0, f"{name} tuned")))
            for name in ("cpu", "cpuother")]
    monkeypatch.setattr(tiledattention, "runtime", lambda: _Runtime())
    yield made
    for family in made:
        tiledattention.unregister_family(family.name)


_PROBLEM = Problem(batch=2, heads_q=2, heads_kv=2, seqlen_q=37, seqlen_k=37, head_dim=64,
                   dtype="bf16", causal=True)
_NAMES = ["tiledattention", "tiledattention-default", "tiledattention-cpuother", "torch-cudnn",
          "torch-flash", "torch-efficient"]


def _preset(**changes):
    return dataclasses.replace(bench.PRESETS["forward"], kernel="cpu", also=("cpuother",),
                               order=tuple(_NAMES), **changes)


def _fake_timing(fn, **kwargs) -> Timing:
    fn()
    return Timing(median_ms=2.0, spread_ms=0.1, mean_ms=2.05, min_ms=1.9,
                  samples=kwargs["min_samples"])


def test_measure_point_checks_then_times_every_contender(cpu_families):
    cpu, other = cpu_families
    cpu.lookup = _Sched(2.0, "default sm_90")  # the lookup answers with the default
    other.lookup = _Sched(3.0, "other wrong")
    seen = []
    results = bench.measure_point(_preset(), _PROBLEM, _NAMES, bench.BenchSettings(),
                                  env=dict(device="cpu", arch="sm_90"), time_fn=_fake_timing,
                                  on_contender=seen.append)
    by = {r.contender: r for r in results}
    assert [r.contender for r in results] == seen == _NAMES
    ours = by["tiledattention"]
    assert (ours.status, ours.kernel, ours.schedule, ours.lookup_source, ours.lookup_detail) == \
        ("ok", "cpu", "default sm_90", "exact-device", "cpu row")
    assert ours.rel_err == 0.0 and ours.median_ms == 2.0 and ours.samples == 10
    assert ours.tflops == pytest.approx(1e9 / 2e-3 / 1e12)  # the family's flops
    assert ours.gbps == pytest.approx(bench.problem_bytes(_PROBLEM) / 2e-3 / 1e9)
    assert (ours.batch, ours.heads, ours.heads_kv, ours.seqlen_q, ours.seqlen, ours.head_dim,
            ours.causal, ours.device, ours.arch) == (2, 2, 2, 37, 37, 64, True, "cpu", "sm_90")
    default = by["tiledattention-default"]
    assert default.status == "skipped" and "is the default default sm_90" in default.reason
    wrong = by["tiledattention-cpuother"]  # the other family's lookup, checked by its case
    assert wrong.status == "wrong" and wrong.reason == "err=0.5 > 1e-06"
    assert wrong.rel_err == pytest.approx(0.5) and wrong.schedule == "other wrong"
    assert wrong.tflops is None
    assert by["torch-cudnn"].status == "ok" and by["torch-cudnn"].rel_err is None
    flash = by["torch-flash"]
    assert flash.status == "unavailable"
    assert flash.reason == ("RuntimeError: No available kernel. Aborting execution. (Flash "
                            "attention kernel not used because: head dim 37)")
    assert by["torch-efficient"].status == "unavailable"
    assert "has no baseline 'torch-efficient'" in by["torch-efficient"].reason
    # the check ran each of ours once, the baselines once, then the timing once more
    assert cpu.log == ["default sm_90", "cudnn", "default sm_90", "cudnn"]


def test_default_is_timed_where_it_differs_and_failures_are_rows(cpu_families):
    cpu, _ = cpu_families
    cpu.lookup = _Sched(None, "tuned but broken")
    results = bench.measure_point(_preset(), _PROBLEM, _NAMES[:2], bench.BenchSettings(),
                                  env=dict(arch="sm_80"), time_fn=_fake_timing)
    broken, default = results
    assert broken.status == "unavailable"
    assert broken.reason == "RuntimeError: No available kernel. Aborting execution."
    assert (default.status, default.schedule, default.lookup_source, default.lookup_detail) == \
        ("ok", "default sm_80", "forced", "cpu.default_schedule('sm_80')")


def test_interleaved_timing_takes_only_the_contenders_that_passed(cpu_families):
    cpu, other = cpu_families
    other.lookup = _Sched(float("nan"), "nan")  # poison left in the output: wrong
    calls = []

    def fake_interleaved(fns, *, rounds, host=False):
        calls.append((list(fns), rounds))
        assert host == settings.host
        for fn in fns.values():
            fn()
        return {name: Timing(median_ms=1.0 + i, spread_ms=0.0, mean_ms=1.0 + i, min_ms=1.0 + i,
                             samples=rounds) for i, name in enumerate(fns)}

    def never(fn, **kwargs):
        raise AssertionError("interleaved runs must not time contenders one by one")

    settings = bench.BenchSettings(interleave=7)
    results = bench.measure_point(_preset(), _PROBLEM, _NAMES, settings, env={},
                                  time_fn=never, interleaved_fn=fake_interleaved)
    assert calls == [(["tiledattention", "tiledattention-default", "torch-cudnn"], 7)]
    by = {r.contender: r for r in results}
    assert [by[n].median_ms for n in calls[0][0]] == [1.0, 2.0, 3.0]
    assert by["tiledattention"].samples == 7
    assert by["tiledattention-cpuother"].status == "wrong"
    assert "nan" in by["tiledattention-cpuother"].reason
    assert by["tiledattention-cpuother"].rel_err is None

    def crash(fns, *, rounds, host=False):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    results = bench.measure_point(_preset(), _PROBLEM, _NAMES[:2], settings, env={},
                                  time_fn=never, interleaved_fn=crash)
    assert [r.status for r in results] == ["unavailable", "unavailable"]
    assert "illegal memory access" in results[0].reason and results[0].schedule


def test_run_grid_measures_every_problem_with_the_clocks(cpu_families, monkeypatch):
    from tuner.bench import _engine

    monkeypatch.setattr(_engine, "environment", lambda device, family: {"device": family.name})
    monkeypatch.setattr(_engine, "gpu_clocks", lambda device: ("1980 MHz", "2619 MHz"))
    problems = (_PROBLEM, dataclasses.replace(_PROBLEM, seqlen_q=5, seqlen_k=5))
    monkeypatch.setitem(bench.PRESETS, "cpu", _preset())
    grid = bench.Grid("cpu", problems, ("tiledattention", "torch-cudnn"))
    seen = []

    def measure(preset, problem, contenders, settings, *, env, on_contender):
        seen.append((preset.kernel, problem.seqlen_q, contenders, env))
        return [BenchResult(contender=n, status="skipped", **bench.result_fields(problem))
                for n in contenders]

    results = bench.run_grid(grid, bench.BenchSettings(), measure=measure)
    assert seen == [("cpu", 37, grid.contenders, {"device": "cpu"}),
                    ("cpu", 5, grid.contenders, {"device": "cpu"})]
    assert [(r.seqlen, r.sm_clock, r.mem_clock) for r in results] == \
        [(37, "1980 MHz", "2619 MHz")] * 2 + [(5, "1980 MHz", "2619 MHz")] * 2


# -- CSV -----------------------------------------------------------------------------------------

def _result(contender, seqlen, tflops=None, *, status="ok", d=64, causal=False, dtype="bf16",
            reason="", **extra) -> BenchResult:
    tokens, hidden = 16384, 2048
    timed = status == "ok"
    extra.setdefault("rel_err", 1e-3 if timed else None)
    return BenchResult(contender=contender, status=status, reason=reason,
                       batch=tokens // seqlen, heads=hidden // d, seqlen=seqlen, head_dim=d,
                       dtype=dtype, causal=causal,
                       median_ms=(1.0 / tflops) if timed else None,
                       spread_ms=0.01 if timed else None, samples=50 if timed else None,
                       tflops=tflops,
                       device="NVIDIA H100 80GB HBM3", arch="sm_90", driver="13.0",
                       torch_version="2.9.0", cuda_tile_version="1.7.0", **extra)


def test_csv_round_trip(tmp_path):
    results = [
        _result("tiledattention", 1024, 1 / 3, schedule="128x64 occ2 exp2 approx Kt",
                lookup_source="exact-device", lookup_detail="B16 H32 S1024 D64 bf16 full in x.db",
                sm_clock="1980 MHz", mem_clock="2619 MHz"),
        _result("torch-flash", 1024, 123.456789012345, causal=True, dtype="fp16", d=128),
        _result("torch-cudnn", 2048, status="unavailable",
                reason='RuntimeError: No available kernel, "quoted", comma'),
        _result("eager", 16384, status="skipped", reason="would need 32.0 GiB"),
        _result("torch-math", 512, status="wrong", reason="err=0.03 > 0.01",
                rel_err=0.0312345),
    ]
    path = write_csv(results, tmp_path / "sub" / "bench.csv")
    loaded = load_results(path)
    assert loaded == results
    header = path.read_text().splitlines()[0].split(",")
    for column in ("contender", "status", "reason", "batch", "heads", "seqlen", "head_dim",
                   "dtype", "causal", "median_ms", "spread_ms", "samples", "tflops", "rel_err",
                   "schedule", "lookup_source", "device", "arch", "driver", "torch_version",
                   "cuda_tile_version", "sm_clock", "mem_clock"):
        assert column in header
    assert not list(tmp_path.glob("sub/*.tmp"))


def test_load_results_rejects_other_csvs(tmp_path):
    path = tmp_path / "other.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(UnreadableFile, match="lacks columns"):
        load_results(path)
    with pytest.raises(UnreadableFile, match="cannot read"):
        load_results(tmp_path / "missing.csv")


# -- markdown ------------------------------------------------------------------------------------

def _synthetic() -> list[BenchResult]:
    """tiledattention is 2x and 4x cuDNN at D=64 full (geomean sqrt(8) = 2.83); at S=4096
    cuDNN is unavailable and drops out of the geomean; eager is skipped at S=4096."""
    return [
        _result("tiledattention", 1024, 200.0, schedule="128x64 occ2", lookup_source="nearest"),
        _result("torch-cudnn", 1024, 100.0),
        _result("eager", 1024, 50.0),
        _result("tiledattention", 2048, 300.0, schedule="128x64 occ2", lookup_source="default"),
        _result("torch-cudnn", 2048, 75.0),
        _result("eager", 2048, 30.0),
        _result("tiledattention", 4096, 310.0),
        _result("torch-cudnn", 4096, status="unavailable", reason="RuntimeError: cudnn boom"),
        _result("eager", 4096, status="skipped", reason="would need 99.0 GiB"),
        _result("tiledattention", 1024, 150.0, causal=True),
        _result("torch-cudnn", 1024, 100.0, causal=True),
        _result("eager", 1024, status="wrong", reason="err=0.5 > 0.01", causal=True,
                rel_err=0.5),
    ]


def test_markdown_summary_content():
    text = render_markdown(_synthetic(), INFO)
    assert "`tiledtune bench --quick`" in text and "2025-01-01" in text
    assert "NVIDIA H100 80GB HBM3 (sm_90)" in text and "2.9.0" in text and "1.7.0" in text
    assert "## bf16, D=64, full" in text and "## bf16, D=64, causal" in text
    head = next(line for line in text.splitlines() if line.startswith("| S |"))
    columns = [c.strip() for c in head.split("|")[1:-1]]
    assert columns == ["S", "B×H", "tiledattention", "torch-cudnn", "eager",
                       "÷ torch-cudnn", "÷ eager"]
    full = [line for line in text.split("## bf16, D=64, full")[1].split("##")[0].splitlines()
            if line.startswith("| ") and line.split("|")[1].strip().isdigit()]
    cells = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[1:-1]]
             for line in full}
    assert cells["1024"] == ["1024", "16×32", "200.0", "100.0", "50.0", "2.00", "4.00"]
    assert cells["2048"] == ["2048", "8×32", "300.0", "75.0", "30.0", "4.00", "10.00"]
    assert cells["4096"] == ["4096", "4×32", "310.0", "unavailable", "skipped", "—", "—"]
    geo = text.split("## Geometric mean")[1]
    geo_rows = [line for line in geo.splitlines() if line.startswith("| 64 |")]
    assert geo_rows[0].replace(" ", "") == "|64|full|2.83|6.32|"
    assert geo_rows[1].replace(" ", "") == "|64|causal|1.50|—|"
    notes = text.split("## Notes")[1]
    assert "torch-cudnn, bf16 D=64 full S=4096 (B=4, H=32): unavailable: RuntimeError: " \
           "cudnn boom" in notes
    assert "eager, bf16 D=64 full S=4096 (B=4, H=32): skipped: would need 99.0 GiB" in notes
    assert "eager, bf16 D=64 causal S=1024 (B=16, H=32): wrong: err=0.5 > 0.01" in notes
    assert "S=1024: 128x64 occ2 (nearest)" in text


def test_markdown_reports_the_share_of_the_matmul_rate():
    info = RunInfo(command="x", date="d", matmul_tflops=(400.0, 500.0))
    text = render_markdown(_synthetic(), info)
    assert "before and after the grid: 400.0 / 500.0 TFLOP/s" in text
    section = text.split("share of the matrix-product rate (500.0 TFLOP/s)")[1].split("##")[0]
    rows = [line.replace(" ", "") for line in section.splitlines() if line.startswith("| bf16")]
    # the faster of the two rates is the ceiling: 200/500, 300/500, 310/500; causal 150/500
    assert rows == ["|bf16|64|full|40%|60%|62%|", "|bf16|64|causal|30%|—|—|"]
    assert "matrix-product" not in render_markdown(_synthetic(), INFO)


def test_report_only_keeps_the_runs_matmul_rate(tmp_path):
    csv_path = write_csv(_synthetic(), tmp_path / "bench.csv")
    info = RunInfo(command="tiledtune bench", date="d", matmul_tflops=(700.0, 710.5))
    write_run_info(info, tmp_path / "run.json")
    assert RunInfo.from_json((tmp_path / "run.json").read_text()) == info
    assert bench_cmd.run(_args("--report-only", str(csv_path), "--no-plots")) == 0
    assert "700.0 / 710.5 TFLOP/s" in (tmp_path / "summary.md").read_text()


def test_markdown_without_tiledattention_has_no_ratio_columns():
    results = [r for r in _synthetic() if r.contender != "tiledattention"]
    text = render_markdown(results, INFO)
    assert "÷" not in text and "Geometric mean" not in text
    assert "| S | B×H | torch-cudnn | eager |" in text


# -- plots ---------------------------------------------------------------------------------------

def _full_grid_results() -> list[BenchResult]:
    results = []
    for point in build_grid().problems:
        for i, name in enumerate(CONTENDERS):
            status = "ok" if (i + point.seqlen_q // 512) % 7 else "unavailable"
            tflops = 100.0 + 37 * i + math.log2(point.seqlen_q) * (3 + i) + point.head_dim / 10
            results.append(_result(name, point.seqlen_q, tflops if status == "ok" else None,
                                   status=status, d=point.head_dim, causal=point.causal,
                                   dtype=point.dtype, reason="" if status == "ok" else "x"))
    return results


def test_plots_are_small_pngs(tmp_path):
    pytest.importorskip("matplotlib")
    written, messages = write_plots(_full_grid_results(), tmp_path)
    names = sorted(p.name for p in written)
    assert names == ["ratio_cudnn_bf16.png", "ratio_cudnn_fp16.png", "tflops_bf16.png",
                     "tflops_fp16.png"]
    assert messages == []
    for path in written:
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        assert 5_000 < len(data) < MAX_PNG_BYTES


def test_plots_lower_dpi_to_fit_and_fail_loudly_when_impossible(tmp_path):
    pytest.importorskip("matplotlib")
    results = _synthetic()
    write_plots(results, tmp_path / "big")
    size = (tmp_path / "big" / "tflops_bf16.png").stat().st_size
    write_plots(results, tmp_path / "small", max_bytes=int(size * 0.8))
    assert (tmp_path / "small" / "tflops_bf16.png").stat().st_size <= size * 0.8
    with pytest.raises(TunerValueError, match="KiB even at dpi"):
        write_plots(results, tmp_path / "tiny", max_bytes=1000)


def test_no_ratio_plot_without_cudnn(tmp_path):
    pytest.importorskip("matplotlib")
    results = [r for r in _synthetic() if r.contender != "torch-cudnn"]
    written, messages = write_plots(results, tmp_path)
    assert [p.name for p in written] == ["tflops_bf16.png"]
    assert messages == ["no ratio_cudnn_bf16.png: torch-cudnn and the contenders never both ran"]


def test_plots_skipped_with_a_message_without_matplotlib(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(PlotsUnavailable, match="pip install"):
        write_plots(_synthetic(), tmp_path)
    csv_path = write_csv(_synthetic(), tmp_path / "bench.csv")
    assert bench_cmd.run(_args("--report-only", str(csv_path))) == 0
    assert "plots skipped" in _squash(capsys.readouterr().err)
    assert (tmp_path / "summary.md").exists() and not list(tmp_path.glob("*.png"))


# -- report-only through run() -------------------------------------------------------------------

def test_report_only_rerenders_from_csv(tmp_path, capsys):
    csv_path = write_csv(_synthetic(), tmp_path / "run" / "bench.csv")
    out = tmp_path / "rendered"
    assert bench_cmd.run(_args("--report-only", str(csv_path), "--out", str(out))) == 0
    summary = (out / "summary.md").read_text()
    assert "re-rendered from" in summary
    assert "| 1024 | 16×32 | 200.0 | 100.0 | 50.0 | 2.00 | 4.00 |" in summary
    assert "unavailable: RuntimeError: cudnn boom" in summary
    if _has_matplotlib():
        assert (out / "tflops_bf16.png").exists()
    out = _squash(capsys.readouterr().out)  # results (tables, files written) on stdout
    assert "summary.md" in out and "unavailable" in out  # the rich table shows statuses


def test_report_only_through_the_cli_registry(tmp_path):
    from tuner import cli

    csv_path = write_csv(_synthetic(), tmp_path / "bench.csv")
    assert cli.main(["bench", "--report-only", str(csv_path), "--no-plots"]) == 0
    summary = (tmp_path / "summary.md").read_text()
    assert f"- command: `tiledtune bench --report-only {csv_path} --no-plots (re-rendered " \
        f"from {csv_path})`" in summary


def test_report_only_with_no_plots_and_bad_csv(tmp_path, capsys):
    csv_path = write_csv(_synthetic(), tmp_path / "bench.csv")
    assert bench_cmd.run(_args("--report-only", str(csv_path), "--no-plots")) == 0
    assert not list(tmp_path.glob("*.png")) and (tmp_path / "summary.md").exists()
    bad = tmp_path / "bad.csv"
    bad.write_text("x,y\n")
    assert bench_cmd.run(_args("--report-only", str(bad))) == 2
    assert "lacks columns" in _squash(capsys.readouterr().err)


def _has_matplotlib() -> bool:
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


def test_results_round_trip_through_csv_keeps_the_summary(tmp_path):
    results = _synthetic()
    path = write_csv(results, tmp_path / "bench.csv")
    assert render_markdown(load_results(path), INFO) == render_markdown(results, INFO)


def test_every_status_and_order_is_kept():
    results = _synthetic()
    assert {r.status for r in results} == {"ok", "unavailable", "skipped", "wrong"}
    with pytest.raises(ValueError, match="status"):
        dataclasses.replace(results[0], status="fast")
    with pytest.raises(ValueError, match="needs median_ms"):
        dataclasses.replace(results[0], tflops=None)
    assert list(itertools.islice(CONTENDERS, 2)) == ["tiledattention", "tiledattention-default"]


# -- the committed studies re-render from their CSVs unchanged ------------------------------------

@pytest.mark.parametrize("study", ["", "decode", "backward"], ids=["forward", "decode",
                                                                    "backward"])
def test_committed_studies_rerender_unchanged(study, tmp_path):
    folder = ROOT / "docs" / "records" / "benchmarks" / study
    committed = (folder / "summary.md").read_text()
    saved = RunInfo.from_json((folder / "run.json").read_text())
    # the header's command and date are the re-rendering's own: take the committed ones
    info = RunInfo(command=re.search(r"^- command: `(.*)`$", committed, re.M).group(1),
                   date=re.search(r"^- date: (.*)$", committed, re.M).group(1),
                   matmul_tflops=saved.matmul_tflops, copy_gbps=saved.copy_gbps)
    results = load_results(folder / "bench.csv")
    assert render_markdown(results, info) == committed
    # and through the command, the whole file but the command and date lines
    assert bench_cmd.run(_args("--report-only", str(folder / "bench.csv"), "--no-plots",
                               "--out", str(tmp_path))) == 0
    again = (tmp_path / "summary.md").read_text().splitlines()
    assert [line for line in again if not line.startswith(("- command:", "- date:"))] == \
        [line for line in committed.splitlines() if not line.startswith(("- command:", "- date:"))]


def test_save_png_writes_a_palette_png_when_asked(tmp_path):
    pytest.importorskip("matplotlib")
    from PIL import Image

    from tuner.bench import new_figure, save_png

    def figure():
        fig = new_figure(figsize=(4, 3))
        fig.subplots().plot([1, 3, 2, 5], label="a line")
        return fig

    full = save_png(figure(), tmp_path / "full.png")
    small = save_png(figure(), tmp_path / "small.png", palette=True)
    assert Image.open(full).mode == "RGBA" and Image.open(small).mode == "P"
    assert small.stat().st_size < full.stat().st_size
