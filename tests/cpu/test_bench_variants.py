"""``tiledtune bench --preset variants`` without a GPU: the preset's model-shaped points, the
contenders each kind of problem gets (plain, window-only, softcap, sinks), FlexAttention's
mask_mod against ``visible_keys``, the flex contender (eager, not compiled) against the float32
reference, the engine's rows for variant contenders, bad flags, and the rows' variant fields in
CSV and summary."""

from __future__ import annotations

import argparse
import dataclasses
import types

import pytest

import tiledattention
from tiledattention import Problem
from tuner import bench
from tuner.bench import (PEER_CONTENDERS, PRESETS, VARIANT_CONTENDERS, BenchConfigError,
                         BenchResult, RunInfo, applies, build_grid, flex_mask_mod, flex_score_mod,
                         load_results, render_markdown, varlen_window, write_csv)
from tuner.bench import _engine, _variants
from tuner.commands import bench_cmd
from tuner.commands._problems import parse_problem_fields

from ._bench_stand_ins import FixedRuntime, NamedSchedule, ReferenceCase, run_once_timing

OURS = ("tiledattention", "tiledattention-default")


def _p(**fields) -> Problem:
    base = dict(batch=1, heads_q=4, heads_kv=2, seqlen_q=37, seqlen_k=37, head_dim=32,
                dtype="bf16", causal=True)
    return Problem(**{**base, **fields})


# -- the preset's grid -----------------------------------------------------------------------------

def _shape(p: Problem) -> tuple:
    return (p.batch, p.heads_q, p.heads_kv, p.seqlen_q, p.seqlen_k, p.head_dim, p.causal,
            p.bottom_right, p.window_left, p.window_right, p.softcap, p.sinks)


#: (B, H_q, H_kv, S_q, S_k, D, causal, bottom_right, window_left, window_right, softcap, sinks)
MISTRAL_8K = (2, 32, 8, 8192, 8192, 128, True, False, 4095, -1, 0.0, False)
MISTRAL_32K = (1, 32, 8, 32768, 32768, 128, True, False, 4095, -1, 0.0, False)
GPT_OSS = (2, 64, 8, 8192, 8192, 64, True, False, 127, -1, 0.0, False)
GPT_OSS_SINKS = GPT_OSS[:-1] + (True,)
GEMMA2 = (2, 16, 8, 8192, 8192, 256, True, False, -1, -1, 50.0, False)
GEMMA2_LOCAL = (2, 16, 8, 8192, 8192, 256, True, False, 4095, -1, 50.0, False)
DECODE = (1, 32, 8, 1, 131072, 128, False, True, 4095, -1, 0.0, False)
DECODE_B8 = (8,) + DECODE[1:]
DECODE_SINKS = (1, 64, 8, 1, 131072, 64, False, True, 127, -1, 0.0, True)


def _b1(shape: tuple) -> tuple:
    return (1,) + shape[1:]


@pytest.mark.parametrize("kernel, quick, expected", [
    ("forward", False, [MISTRAL_8K, MISTRAL_32K, GPT_OSS, GPT_OSS_SINKS, GEMMA2, GEMMA2_LOCAL]),
    ("forward", True, [MISTRAL_8K, GPT_OSS_SINKS, GEMMA2_LOCAL]),
    ("backward", False, [_b1(s) for s in (MISTRAL_8K, GPT_OSS, GPT_OSS_SINKS, GEMMA2,
                                          GEMMA2_LOCAL)]),
    ("backward", True, [_b1(s) for s in (MISTRAL_8K, GPT_OSS_SINKS, GEMMA2_LOCAL)]),
    ("decode", False, [DECODE, DECODE_B8, DECODE_SINKS]),
    ("decode", True, [DECODE, DECODE_SINKS]),
])
def test_variants_preset_points(kernel, quick, expected):
    grid = build_grid(kernel, preset="variants", quick=quick)
    assert grid.kernel == kernel and grid.preset_name == "variants"
    assert grid.preset.family.name == kernel and grid.preset.phase == PRESETS[kernel].phase
    assert [_shape(p) for p in grid.problems] == expected
    for p in grid.problems:
        # valid, canonical problems of the family, all of them variants, in bf16
        assert isinstance(p, grid.preset.family.problem_type) and p.variant
        assert Problem.from_dict(p.to_dict()) == p and p.dtype == "bf16"
    assert grid.contenders == OURS + (("tiledattention-forward",) if kernel == "decode"
                                      else ()) + VARIANT_CONTENDERS + PEER_CONTENDERS


def test_decode_points_see_the_last_keys_of_the_cache():
    for p in build_grid("decode", preset="variants").problems:
        assert p.seqlen_q == 1 and p.bottom_right and p.causal_offset == p.seqlen_k - 1
        span = p.window_left + 1
        assert p.key_span(0, 0) == (p.seqlen_k - span, p.seqlen_k)
        # the bytes a call must move count the window's keys, not the cache's
        assert bench.problem_bytes(p) == 2 * (2 * p.batch * p.heads_q * p.head_dim
                                              + 2 * p.batch * p.heads_kv * span * p.head_dim)


def test_plain_problem_bytes_are_unchanged():
    p = _p(seqlen_q=16, seqlen_k=8192, bottom_right=True)
    assert bench.problem_bytes(p) == 2 * (2 * 16 * 4 * 32 + 2 * 2 * 8192 * 32)


def test_batch_and_dtypes_options():
    grid = build_grid("forward", preset="variants", quick=True, batch="1,4", dtypes="bf16,fp16")
    assert [(p.dtype, p.batch, p.head_dim) for p in grid.problems] == [
        (dtype, b, d) for dtype in ("bf16", "fp16") for d in (128, 64, 256) for b in (1, 4)]
    backward = build_grid("backward", preset="variants", batch="2")
    assert {p.batch for p in backward.problems} == {2}
    assert build_grid("forward", preset="variants", no_matmul=True).problems == \
        build_grid("forward", preset="variants").problems


# -- which contenders each kind of problem gets --------------------------------------------------

PLAIN = _p()
WINDOW = _p(window_left=7)
SOFTCAP = _p(softcap=30.0)
SINKS = _p(sinks=True)
WINDOW_SINKS = _p(window_left=7, sinks=True)
TOP_LEFT_WINDOW = _p(seqlen_q=16, seqlen_k=64, window_left=7)  # not FlashAttention's alignment


@pytest.mark.parametrize("problem, expected", [
    (PLAIN, PRESETS["forward"].contenders),
    (WINDOW, OURS + ("flex", "sdpa-mask", "varlen") + PEER_CONTENDERS),
    (SOFTCAP, OURS + ("flex",) + PEER_CONTENDERS),
    (SINKS, OURS + ("flex",) + PEER_CONTENDERS),
    (WINDOW_SINKS, OURS + ("flex",) + PEER_CONTENDERS),
    (TOP_LEFT_WINDOW, OURS + ("flex", "sdpa-mask") + PEER_CONTENDERS),
], ids=("plain", "window", "softcap", "sinks", "window+sinks", "top-left-window"))
def test_contenders_per_kind_of_problem(problem, expected):
    problems = [PLAIN, WINDOW, SOFTCAP, SINKS, WINDOW_SINKS, TOP_LEFT_WINDOW]
    grid = build_grid("forward", problems=[p.to_dict() for p in problems])
    assert grid.contenders == PRESETS["forward"].contenders[:-1] + VARIANT_CONTENDERS \
        + PEER_CONTENDERS
    assert grid.contenders_at(problem) == expected
    assert tuple(c for c in grid.contenders if applies(c, problem)) == expected


def test_plain_grids_keep_their_contenders():
    for kernel in ("forward", "backward", "decode"):
        grid = build_grid(kernel, quick=True)
        assert grid.contenders == PRESETS[kernel].contenders and grid.preset_name == "default"
        assert all(grid.contenders_at(p) == grid.contenders for p in grid.problems)


def test_contenders_option_on_a_variant_grid():
    grid = build_grid("decode", preset="variants", contenders="flex,tiledattention")
    assert grid.contenders == ("tiledattention", "flex")  # canonical order
    assert grid.contenders_at(grid.problems[-1]) == ("tiledattention", "flex")


def test_varlen_window_is_flash_attentions_window_of_the_same_mask():
    import torch

    from tiledattention.core._reference import visible_keys

    for p in (WINDOW, _p(causal=False, window_left=3, window_right=5),
              _p(seqlen_q=5, seqlen_k=40, bottom_right=True, window_left=9),
              _p(seqlen_q=1, seqlen_k=50, bottom_right=True, window_left=9),
              _p(causal=False, seqlen_q=20, seqlen_k=40, bottom_right=True, window_left=2,
                 window_right=3)):
        left, right = varlen_window(p)
        # FlashAttention: key j of row i iff i + S_k - S_q - left <= j <= i + S_k - S_q + right
        i = torch.arange(p.seqlen_q)[:, None] + p.seqlen_k - p.seqlen_q
        j = torch.arange(p.seqlen_k)[None, :]
        fa = torch.ones(p.seqlen_q, p.seqlen_k, dtype=torch.bool)
        if left >= 0:
            fa &= j >= i - left
        if right >= 0:
            fa &= j <= i + right
        assert torch.equal(fa, visible_keys(p, "cpu")), p.describe()
    assert varlen_window(WINDOW) == (7, 0)
    assert varlen_window(TOP_LEFT_WINDOW) is None and varlen_window(SINKS) is None


# -- FlexAttention's mask and score ----------------------------------------------------------------

@pytest.mark.parametrize("fields", [
    dict(window_left=7),
    dict(causal=False, window_left=3, window_right=5),
    dict(causal=False, window_left=-1, window_right=4),
    dict(causal=False, window_left=0, window_right=-1),
    dict(seqlen_q=16, seqlen_k=64, window_left=7),
    dict(seqlen_q=16, seqlen_k=64, bottom_right=True, window_left=7),
    dict(seqlen_q=64, seqlen_k=16, bottom_right=True, window_left=3),
    dict(seqlen_q=1, seqlen_k=300, bottom_right=True, window_left=127, sinks=True),
    dict(causal=False, seqlen_q=30, seqlen_k=50, bottom_right=True, window_left=4,
         window_right=2),
    dict(seqlen_q=16, seqlen_k=64, bottom_right=True),
    dict(softcap=50.0),
], ids=lambda f: ",".join(f"{k}={v}" for k, v in f.items()))
def test_flex_mask_mod_agrees_with_visible_keys(fields):
    import torch

    from tiledattention.core._reference import visible_keys

    p = _p(**fields)
    q_idx = torch.arange(p.seqlen_q)[:, None]
    kv_idx = torch.arange(p.seqlen_k)[None, :]
    b = h = torch.tensor(0)
    got = flex_mask_mod(p)(b, h, q_idx, kv_idx).expand(p.seqlen_q, p.seqlen_k)
    want = visible_keys(p, "cpu")
    assert got.dtype == torch.bool and torch.equal(got, want)


def test_flex_score_mod_is_the_softcap():
    import torch

    assert flex_score_mod(WINDOW) is None and flex_score_mod(SINKS) is None
    score = torch.tensor([-400.0, -30.0, 0.0, 1.0, 29.0, 1e4])
    got = flex_score_mod(SOFTCAP)(score, 0, 0, 0, 0)
    assert torch.allclose(got, 30.0 * torch.tanh(score / 30.0))
    assert got.abs().max() <= 30.0


def _case(problem: Problem, *, seed: int = 0):
    """q, k, v (q scaled up with a softcap, so it binds), sink logits and the reference, like a
    family's case, on the CPU."""
    import torch

    from tiledattention.core._reference import attention_reference

    gen = torch.Generator().manual_seed(seed)

    def rand(h, s):
        return torch.randn(problem.batch, h, s, problem.head_dim, generator=gen).bfloat16()

    q, k, v = rand(problem.heads_q, problem.seqlen_q), rand(problem.heads_kv,
                                                           problem.seqlen_k), \
        rand(problem.heads_kv, problem.seqlen_k)
    if problem.softcap:
        q = q * 8
    sinks = torch.randn(problem.heads_q, generator=gen) + 2.0 if problem.sinks else None
    return types.SimpleNamespace(q=q, k=k, v=v, sinks=sinks, reference=attention_reference(
        q, k, v, problem, sinks=sinks))


@pytest.fixture
def eager_flex(monkeypatch):
    """FlexAttention run eagerly: the contender's torch.compile is the identity here."""
    import warnings

    import torch

    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: fn)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "flex_attention called without torch.compile()"
        yield


@pytest.mark.parametrize("problem", [
    _p(window_left=5), _p(softcap=0.5), _p(sinks=True, window_left=7), _p(sinks=True),
    _p(seqlen_q=3, seqlen_k=40, bottom_right=True, window_left=9, sinks=True, softcap=2.0),
], ids=("window", "softcap", "window+sinks", "sinks", "decode-all"))
def test_flex_contender_matches_the_reference(problem, eager_flex):
    case = _case(problem)
    run, err = _variants.build_contender("flex", problem, case, backward=False)
    assert err < 1e-2
    out = run()
    assert out.shape == case.q.shape and out.dtype == case.q.dtype
    # the variant matters: the plain problem's attention is far from it
    plain = dataclasses.replace(problem, window_left=-1, softcap=0.0, sinks=False)
    from tiledattention.core._reference import attention_reference
    assert _variants._rel_l2(attention_reference(case.q, case.k, case.v, plain),
                             case.reference) > 0.05


def test_varlen_support_says_why_not(monkeypatch):
    varlen = pytest.importorskip("torch.nn.attention.varlen")

    def old_varlen(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, is_causal=False):
        raise AssertionError("not called")  # the signature of an older torch

    monkeypatch.setattr(varlen, "varlen_attn", old_varlen)
    assert "takes no window_size" in _variants.varlen_support(WINDOW)
    with pytest.raises(_variants.NotRunnable, match="takes no window_size"):
        _variants.build_contender("varlen", WINDOW, _case(WINDOW), backward=False)


# -- the engine's rows for variant contenders ------------------------------------------------------

_Sched = NamedSchedule


def _Case(problem):
    return ReferenceCase(_case(problem), "variant problems take no torch baseline")


class _Family(tiledattention.Family):
    name = "cpuvariants"
    problem_type = Problem
    schedule_type = _Sched
    template_modules = (__name__,)
    bucket_fields = ("dtype",)

    def default_schedule(self, arch, problem):
        return _Sched("default")

    def flops(self, problem):
        return 1e9

    def compile(self, problem, schedule, arch):
        raise NotImplementedError

    def case(self, problem, device_index):
        return _Case(problem)

    def tolerance(self, problem):
        return 1e-2


def _Runtime():
    return FixedRuntime("exact-device")


@pytest.fixture
def variant_family(monkeypatch):
    family = tiledattention.register_family(_Family())
    monkeypatch.setattr(tiledattention, "runtime", lambda: _Runtime())
    yield dataclasses.replace(PRESETS["forward"], kernel=family.name)
    tiledattention.unregister_family(family.name)


_timing = run_once_timing


def test_engine_checks_then_times_the_variant_contenders(variant_family, eager_flex,
                                                        monkeypatch):
    problem = _p(window_left=7, sinks=True)
    names = ("tiledattention", "flex")
    rows = bench.measure_point(variant_family, problem, names, bench.BenchSettings(),
                               env={}, time_fn=_timing)
    ours, flex = rows
    assert (ours.status, flex.status) == ("ok", "ok"), (ours.reason, flex.reason)
    assert 0 < flex.rel_err < 1e-2 and ours.rel_err < 1e-2  # bf16 rounding of the reference
    assert (flex.window_left, flex.window_right, flex.softcap, flex.sinks) == (7, -1, 0.0, True)
    assert flex.mask == "causal-win(7,-1) sinks" and flex.variant

    def refuse(name, problem, case, *, backward):
        if name == "varlen":
            raise _variants.NotRunnable("torch 2.4 has no torch.nn.attention.varlen.varlen_attn")
        return (lambda: None), 0.5  # a contender whose output is wrong

    monkeypatch.setattr(_engine, "build_contender", refuse)
    window = _p(window_left=7)
    rows = bench.measure_point(variant_family, window, ("flex", "sdpa-mask", "varlen"),
                               bench.BenchSettings(), env={}, time_fn=_timing)
    by = {r.contender: r for r in rows}
    assert by["flex"].status == by["sdpa-mask"].status == "wrong"
    assert by["flex"].reason == "err=0.5 > 0.01" and by["flex"].rel_err == 0.5
    assert by["varlen"].status == "skipped" and "varlen_attn" in by["varlen"].reason


def test_run_grid_gives_each_problem_its_contenders(monkeypatch):
    grid = build_grid("forward", problems=[PLAIN.to_dict(), SOFTCAP.to_dict()])
    seen = []

    def measure(preset, problem, contenders, settings, *, env, on_contender):
        seen.append(contenders)
        return []

    monkeypatch.setattr(_engine, "environment", lambda device, family: {})
    monkeypatch.setattr(_engine, "gpu_clocks", lambda device: ("", ""))
    bench.run_grid(grid, bench.BenchSettings(), measure=measure)
    assert seen == [PRESETS["forward"].contenders, OURS + ("flex",) + PEER_CONTENDERS]


# -- flags ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, flag, words", [
    (dict(preset="nope"), "--preset", "unknown preset 'nope'; expected default or variants"),
    (dict(preset="variants", seqlens="1024"), "--seqlens", "does not go with --preset variants"),
    (dict(preset="variants", causal="yes"), "--causal", "it takes --batch, --dtypes"),
    (dict(preset="variants", batch="0"), "--batch", "positive integer"),
    (dict(preset="variants", batch="2,2"), "--batch", "twice"),
    (dict(preset="variants", dtypes="fp8"), "--dtypes", "'fp8'"),
    (dict(preset="variants", problems=[PLAIN.to_dict()]), "--preset variants",
     "cannot go with --problem"),
    (dict(contenders="flex"), "--contenders", "'flex' runs only at variant problems"),
    (dict(preset="variants", contenders="torch-cudnn"), "--contenders",
     "'torch-cudnn' runs only at plain problems"),
    (dict(preset="variants", contenders="eager,flex"), "--contenders", "unknown contender"),
], ids=lambda x: x if isinstance(x, str) else None)
def test_bad_variant_flags_name_the_flag(kwargs, flag, words):
    with pytest.raises(BenchConfigError) as info:
        build_grid(**kwargs)
    message = str(info.value)
    assert message.startswith(flag) and words in message, message


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tiledtune bench")
    bench_cmd.configure(parser)
    return parser.parse_args(list(argv))


def test_cli_preset_option(capsys):
    assert _args().preset == "default"
    grid = bench_cmd.grid_from_args(_args("--kernel", "decode", "--preset", "variants",
                                          "--quick", "--batch", "4"))
    assert grid == build_grid("decode", preset="variants", quick=True, batch="4")
    assert bench_cmd.run(_args("--preset", "nope")) == 2
    assert "--preset" in capsys.readouterr().err
    assert bench_cmd.run(_args("--preset", "variants", "--seqlens", "1024")) == 2
    assert "--seqlens does not go with --preset variants" in " ".join(
        capsys.readouterr().err.split())
    given = bench_cmd.grid_from_args(_args("--problem", "batch=1,heads_q=4,heads_kv=2,"
                                           "seqlen_q=64,seqlen_k=64,head_dim=64,dtype=bf16,"
                                           "causal=yes,softcap=30.0"))
    assert given.contenders == OURS + ("flex",) + PEER_CONTENDERS
    assert given.problems[0].softcap == 30.0
    assert parse_problem_fields("batch=1,heads_q=4,heads_kv=2,seqlen_q=64,seqlen_k=64,"
                                "head_dim=64,dtype=bf16,causal=yes,window_left=7")


# -- rows, CSV and summary -----------------------------------------------------------------------

def _row(name: str, problem: Problem, ms: float | None, **fields) -> BenchResult:
    base = dict(_engine.result_fields(problem), contender=name, kernel="forward")
    if ms is None:
        return BenchResult(status="unavailable", reason="RuntimeError: no kernel", **base,
                           **fields)
    return BenchResult(status="ok", median_ms=ms, tflops=1.0 / ms, **base, **fields)


def test_variant_rows_round_trip_and_render(tmp_path):
    rows = []
    for problem, times in ((GPT := _p(window_left=7), {"tiledattention": 1.0, "flex": 2.0,
                                                          "sdpa-mask": 4.0, "varlen": None}),
                           (_p(window_left=7, sinks=True), {"tiledattention": 1.0,
                                                              "flex": 3.0})):
        rows += [_row(name, problem, ms) for name, ms in times.items()]
    assert rows[0].point != rows[-1].point  # sinks or not: two points
    assert _engine.result_fields(PLAIN) == dict(
        batch=1, heads=4, heads_kv=2, seqlen_q=37, seqlen=37, head_dim=32, dtype="bf16",
        causal=True, bottom_right=False)  # plain rows carry no variant field
    path = write_csv(rows, tmp_path / "bench.csv")
    assert load_results(path) == rows
    # a CSV of an older run (no variant columns) loads as plain rows
    old = tmp_path / "old.csv"
    lines = path.read_text().splitlines()
    header = lines[0].split(",")
    keep = [i for i, c in enumerate(header)
            if c not in ("window_left", "window_right", "softcap", "sinks")]
    old.write_text("\n".join(",".join(line.split(",")[i] for i in keep)
                             for line in lines[:2]) + "\n")
    assert not load_results(old)[0].variant
    text = render_markdown(rows, RunInfo(command="tiledtune bench --preset variants",
                                         date="2026-01-01"))
    assert "variants (window, softcap, sinks)" in text
    assert "| point | contender | ms | TFLOP/s | ÷ flex | ÷ sdpa-mask | ÷ varlen |" in text
    label = "bf16 D32 causal-win(7,-1) S37 B1 H4/2"
    assert f"| {label} | tiledattention | 1.000 | 1.0 | 2.00 | 4.00 | — |" in text
    sinks = label.replace(" S37", " sinks S37")
    assert f"| {sinks} | tiledattention | 1.000 | 1.0 | 3.00 | — | — |" in text
    assert "| tiledattention | 2.45 | 2 | 4.00 | 1 | — | 0 |" in text  # geometric means
    assert f"- varlen, {label}: unavailable: RuntimeError: no kernel" in text
    assert GPT.variant


def test_variant_plots(tmp_path):
    pytest.importorskip("matplotlib")
    from tuner.bench import write_plots

    rows = [_row(name, problem, ms)
            for problem in (_p(window_left=7), _p(seqlen_q=64, seqlen_k=64, window_left=7),
                            _p(softcap=30.0))
            for name, ms in (("tiledattention", 1.0), ("flex", 2.0), ("sdpa-mask", 3.0))
            if name != "sdpa-mask" or not problem.softcap]
    written, messages = write_plots(rows, tmp_path)
    assert [p.name for p in written] == ["variants_speedup_bf16.png"] and messages == []
    assert written[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
