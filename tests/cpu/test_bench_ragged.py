"""``tiledtune bench --preset ragged`` without a GPU: the preset's buckets (the shipped ragged
keys), the contenders each problem gets, TFLOP/s and GB/s counted on the valid tokens (against
hand counts), the padding mask against ``visible_keys``, the contenders (padded SDPA on torch's
math backend, ``varlen_attn`` replaced by the float32 reference) against the per-sequence
reference, the engine's rows, bad flags, and the rows in CSV, summary and plots. The engine's
GPU timing is not run here (``tests/gpu/test_bench_ragged_gpu.py`` does)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import types
from pathlib import Path

import pytest

import tiledattention
from tiledattention import BACKWARD, FORWARD, Problem
from tiledattention.core._reference import varlen_reference, visible_keys
from tuner import bench
from tuner.bench import (PEER_CONTENDERS, PRESETS, RAGGED_CONTENDERS, RAGGED_POINTS,
                         VARIANT_CONTENDERS, BenchConfigError, BenchResult, RunInfo, applies,
                         build_grid, load_results, padded_mask, render_markdown, valid_tokens,
                         write_csv)
from tuner.bench import _engine, _ragged
from tuner.commands import bench_cmd

from ._bench_stand_ins import FixedRuntime, NamedSchedule, ReferenceCase, run_once_timing

OURS = ("tiledattention", "tiledattention-default")
SHIPPED = Path(tiledattention.__file__).parent / "pretuned" / "sm_90.json"


def _r(**fields) -> Problem:
    """A small ragged bucket (6 sequences of 32, 24, 16, 8, 32, 24 queries)."""
    base = dict(batch=6, heads_q=4, heads_kv=2, seqlen_q=32, seqlen_k=32, head_dim=32,
                dtype="bf16", causal=True, ragged=True)
    return Problem(**{**base, **fields})


def _bucket(batch: int, heads: tuple[int, int], longest: int, head_dim: int) -> tuple:
    return (batch, heads[0], heads[1], longest, longest, head_dim, True, True, True)


def _shape(p: Problem) -> tuple:
    return (p.batch, p.heads_q, p.heads_kv, p.seqlen_q, p.seqlen_k, p.head_dim, p.causal,
            p.bottom_right, p.ragged)


# -- the preset's grid -----------------------------------------------------------------------------

LLAMA = (32, 8)
FORWARD_BUCKETS = [_bucket(16, LLAMA, 1024, 128), _bucket(32, LLAMA, 1024, 128),
                   _bucket(8, LLAMA, 2048, 128), _bucket(16, LLAMA, 2048, 128),
                   _bucket(4, LLAMA, 4096, 128), _bucket(8, LLAMA, 4096, 128),
                   _bucket(2, LLAMA, 8192, 128), _bucket(2, LLAMA, 16384, 128),
                   _bucket(8, (16, 16), 2048, 64), _bucket(4, (8, 1), 4096, 128)]
BACKWARD_BUCKETS = [_bucket(16, LLAMA, 1024, 128), _bucket(8, LLAMA, 2048, 128),
                    _bucket(4, LLAMA, 4096, 128), _bucket(2, LLAMA, 8192, 128),
                    _bucket(8, (16, 16), 2048, 64)]


@pytest.mark.parametrize("kernel, quick, expected", [
    ("forward", False, FORWARD_BUCKETS),
    ("forward", True, [FORWARD_BUCKETS[i] for i in (0, 6, 8, 9)]),
    ("backward", False, BACKWARD_BUCKETS),
    ("backward", True, [BACKWARD_BUCKETS[i] for i in (0, 2, 4)]),
])
def test_ragged_preset_points(kernel, quick, expected):
    grid = build_grid(kernel, preset="ragged", quick=quick)
    assert grid.kernel == kernel and grid.preset_name == "ragged"
    assert grid.preset.family.name == kernel and grid.preset.phase == PRESETS[kernel].phase
    assert grid.preset.interleave == PRESETS[kernel].interleave
    assert [_shape(p) for p in grid.problems] == expected
    for p in grid.problems:
        # valid, canonical ragged buckets of the family, in bf16, none of them a variant
        assert isinstance(p, grid.preset.family.problem_type) and p.ragged and not p.variant
        assert Problem.from_dict(p.to_dict()) == p and p.dtype == "bf16"
    assert grid.contenders == OURS + RAGGED_CONTENDERS + PEER_CONTENDERS
    assert all(grid.contenders_at(p) == grid.contenders for p in grid.problems)


def test_points_are_buckets_of_their_token_counts():
    from tiledattention.core._ragged import ragged_problem

    problems = build_grid("forward", preset="ragged").problems
    for (name, point), p in zip(RAGGED_POINTS.items(), problems):
        # a real batch of that many tokens whose longest sequence has `longest` lands here
        assert p == ragged_problem(sequences=37, tokens_q=point["tokens"] - 5,
                                   longest_q=point["longest"] - 3,
                                   longest_k=point["longest"] - 3, heads_q=point["heads_q"],
                                   heads_kv=point["heads_kv"], head_dim=point["head_dim"],
                                   dtype="bf16", causal=True, bottom_right=True), name
        assert p.batch * p.seqlen_q == point["tokens"] >= point["longest"] == p.seqlen_q


def test_points_are_the_shipped_ragged_keys():
    """Each point of the preset, forward and backward, has a shipped sm_90 row (bottom-right
    buckets, tuned 2026-12-04, ``docs/shipped-table.md``): the lookup answers it exactly."""
    rows = json.loads(SHIPPED.read_text())["rows"]
    shipped = {(row["family"], Problem.from_dict(row["problem"])) for row in rows
               if row["problem"].get("ragged")}
    for kernel in ("forward", "backward"):
        for p in build_grid(kernel, preset="ragged").problems:
            assert (kernel, p) in shipped, (kernel, p.describe())


def test_tokens_and_dtypes_options():
    grid = build_grid("forward", preset="ragged", quick=True, tokens="16384,65536",
                      dtypes="bf16,fp16")
    # dtype, point, token count; every point at each count
    assert [(p.dtype, p.seqlen_q, p.heads_q, p.batch) for p in grid.problems] == [
        (dtype, longest, hq, tokens // longest) for dtype in ("bf16", "fp16")
        for longest, hq in ((1024, 32), (8192, 32), (2048, 16), (4096, 8))
        for tokens in (16384, 65536)]
    # points that share a bucket at the counts given are measured once
    both = build_grid("forward", preset="ragged", tokens="32768").problems
    assert len(both) == len(set(both)) == 7  # 1k, 2k, 4k at 16k and 32k collapse
    assert build_grid("forward", preset="ragged", no_matmul=True).problems == \
        build_grid("forward", preset="ragged").problems
    assert bench_cmd.grid_from_args(_args("--kernel", "backward", "--preset", "ragged",
                                          "--quick", "--tokens", "32768")) == \
        build_grid("backward", preset="ragged", quick=True, tokens="32768")


# -- which contenders each problem gets ----------------------------------------------------------

PLAIN = Problem(batch=1, heads_q=4, heads_kv=2, seqlen_q=32, seqlen_k=32, head_dim=32,
                dtype="bf16", causal=True)


@pytest.mark.parametrize("problem, expected", [
    (_r(), OURS + RAGGED_CONTENDERS),
    (_r(causal=False), OURS + RAGGED_CONTENDERS),
    (_r(seqlen_k=64), OURS + ("cudnn-padded", "efficient-padded")),  # top-left, keys != queries
    (_r(seqlen_k=64, bottom_right=True), OURS + RAGGED_CONTENDERS),  # FlashAttention's alignment
    (_r(causal=False, seqlen_k=64), OURS + RAGGED_CONTENDERS),  # no mask to align
    (_r(window_left=7), OURS + RAGGED_CONTENDERS),
    (_r(softcap=30.0), OURS),
    (_r(sinks=True), OURS),
    (PLAIN, PRESETS["forward"].contenders[:-1]),
    (dataclasses.replace(PLAIN, window_left=7), OURS + VARIANT_CONTENDERS),
], ids=("causal", "full", "top-left-more-keys", "bottom-right-more-keys", "full-more-keys",
        "window", "softcap", "sinks", "plain", "plain-window"))
def test_contenders_per_problem(problem, expected):
    known = PRESETS["forward"].contenders[:-1] + VARIANT_CONTENDERS + RAGGED_CONTENDERS
    assert tuple(c for c in known if applies(c, problem)) == expected
    assert all(applies(c, problem) for c in PEER_CONTENDERS)  # FlashAttention-4: everywhere


def test_ragged_varlen_window():
    assert _ragged.ragged_varlen_window(_r()) == (-1, 0)
    assert _ragged.ragged_varlen_window(_r(causal=False)) == (-1, -1)
    assert _ragged.ragged_varlen_window(_r(window_left=7)) == (7, 0)
    assert _ragged.ragged_varlen_window(_r(causal=False, window_left=3, window_right=5)) == (3, 5)
    assert _ragged.ragged_varlen_window(_r(seqlen_k=64)) is None
    assert _ragged.ragged_varlen_window(PLAIN) is None  # not ragged


# -- work and bytes on the valid tokens -----------------------------------------------------------

def test_flops_count_the_valid_tokens_by_hand():
    """B16 H32/8 S1024 D128 causal: 4 x (1024, 768, 512, 256) sequences, each its own causal
    triangle of n(n+1)/2 pairs, 4·H_q·D flops a pair."""
    p = build_grid("forward", preset="ragged").problems[0]
    assert _shape(p) == _bucket(16, LLAMA, 1024, 128)
    assert _ragged.case_lengths(p) == [(n, n) for n in (1024, 768, 512, 256)] * 4
    assert valid_tokens(p) == 4 * (1024 + 768 + 512 + 256) == 10240
    pairs = 4 * (1024 * 1025 + 768 * 769 + 512 * 513 + 256 * 257) // 2
    assert pairs == 3937280
    assert FORWARD.flops(p) == 4 * 32 * 128 * pairs == 64_508_395_520
    assert BACKWARD.flops(p) == 2.5 * FORWARD.flops(p)
    # not the bucket's rectangle (16 sequences of 1024)
    rectangle = dataclasses.replace(p, ragged=False).flops
    assert rectangle == 4 * 32 * 128 * 16 * 1024 * 1025 // 2 and FORWARD.flops(p) < rectangle


def test_flops_of_a_multi_query_bucket_by_hand():
    p = build_grid("forward", preset="ragged").problems[-1]  # B4 H8/1 S4096 D128
    assert _shape(p) == _bucket(4, (8, 1), 4096, 128)
    pairs = sum(n * (n + 1) // 2 for n in (4096, 3072, 2048, 1024))
    assert FORWARD.flops(p) == 4 * 8 * 128 * pairs


def test_problem_bytes_count_the_valid_tokens():
    p = build_grid("forward", preset="ragged").problems[0]  # B16 H32/8 S1024 D128
    tokens = 10240
    # Q read and O written (H_q), K and V read (H_kv), 2 bytes an element, each token once
    assert bench.problem_bytes(p) == 2 * (2 * tokens * 32 * 128 + 2 * tokens * 8 * 128)
    more_keys = _r(seqlen_k=64, causal=False)  # keys scaled by S_k/S_q: 64, 48, 32, 16, 64, 48
    q_tokens, k_tokens = 136, 272
    assert valid_tokens(more_keys) == q_tokens
    assert bench.problem_bytes(more_keys) == 2 * (2 * q_tokens * 4 * 32 + 2 * k_tokens * 2 * 32)


# -- the padding mask ------------------------------------------------------------------------------

@pytest.mark.parametrize("fields", [
    dict(), dict(causal=False), dict(window_left=5), dict(causal=False, window_left=3,
                                                          window_right=4),
    dict(seqlen_k=64), dict(seqlen_k=64, bottom_right=True),
    dict(seqlen_k=64, bottom_right=True, window_left=9),
], ids=lambda f: ",".join(f"{k}={v}" for k, v in f.items()) or "causal")
def test_padded_mask_is_each_sequences_mask(fields):
    import torch

    p = _r(**fields)
    lens = _ragged.case_lengths(p)
    lens_q, lens_k = [a for a, _ in lens], [b for _, b in lens]
    mask = padded_mask(p, lens_q, lens_k, "cpu")
    assert mask.dtype == torch.bool and mask.shape == (6, 1, max(lens_q), max(lens_k))
    for b, one in enumerate(_ragged.case_sequences(p)):
        n, keys = lens_q[b], lens_k[b]
        assert (one.seqlen_q, one.seqlen_k, one.ragged) == (n, keys, False)
        assert torch.equal(mask[b, 0, :n, :keys], visible_keys(one, "cpu"))
        assert not mask[b, 0, :n, keys:].any()  # padded keys: never seen
        assert mask[b, 0, n:].all()  # padded query rows see every key (no NaN rows)


# -- the contenders against the per-sequence reference ------------------------------------------

def _case(problem: Problem, *, backward: bool = False, seed: int = 0):
    """Packed q, k, v of the problem's case lengths, offsets and the float32 reference (and dO
    with reference gradients), like a family's ragged case, on the CPU."""
    import torch

    lens = _ragged.case_lengths(problem)
    lens_q, lens_k = [a for a, _ in lens], [b for _, b in lens]
    cu_q = torch.tensor([0] + lens_q).cumsum(0).to(torch.int32)
    cu_k = torch.tensor([0] + lens_k).cumsum(0).to(torch.int32)
    gen = torch.Generator().manual_seed(seed)

    def rand(tokens, heads):
        return torch.randn(tokens, heads, problem.head_dim, generator=gen).bfloat16()

    q, k, v = rand(sum(lens_q), problem.heads_q), rand(sum(lens_k), problem.heads_kv), \
        rand(sum(lens_k), problem.heads_kv)
    mask = dict(causal=problem.causal, bottom_right=problem.bottom_right,
                window=(problem.window_left, problem.window_right))
    case = types.SimpleNamespace(q=q, k=k, v=v, cu_seq_q=cu_q, cu_seq_k=cu_k,
                                 reference=varlen_reference(q, k, v, cu_q, cu_k, **mask))
    if backward:
        case.grad_out = rand(sum(lens_q), problem.heads_q)
        leaves = [x.float().requires_grad_() for x in (q, k, v)]
        out = varlen_reference(*leaves, cu_q, cu_k, **mask)
        case.reference_grads = torch.autograd.grad(out, leaves, case.grad_out.float())
    return case


@pytest.mark.parametrize("name", ["cudnn-padded", "efficient-padded"])
@pytest.mark.parametrize("backward", [False, True], ids=("forward", "backward"))
@pytest.mark.parametrize("problem", [_r(), _r(heads_q=4, heads_kv=4, causal=False),
                                     _r(seqlen_k=64, bottom_right=True, window_left=9)],
                         ids=("causal-gqa", "full-mha", "bottom-right-window"))
def test_padded_contenders_match_the_reference(name, backward, problem, cpu_sdpa):
    case = _case(problem, backward=backward)
    run, err = _ragged.build_ragged_contender(name, problem, case, backward=backward)
    assert err < 1e-2
    got = run()
    if backward:  # the padded layout's gradients (heads repeated for the efficient one)
        dq, dk, dv = got
        group = problem.heads_q // problem.heads_kv
        heads_kv = problem.heads_q if name == "efficient-padded" and group > 1 \
            else problem.heads_kv
        assert dq.shape == (6, problem.heads_q, 32, 32) and dk.shape[:2] == (6, heads_kv)
    else:
        assert got.shape[:2] == (6, problem.heads_q)
    # the check is sharp: the output of the problem without its mask is far from it
    if not backward and problem.causal:
        unmasked = dataclasses.replace(problem, causal=False, window_left=-1,
                                       bottom_right=False)
        _, far = _ragged.build_ragged_contender(name, unmasked, case, backward=False)
        assert far > 0.05


def test_padding_beyond_the_mask_limit_is_skipped(monkeypatch, cpu_sdpa):
    monkeypatch.setattr(_ragged, "MASK_LIMIT", 6 * 32 * 32 - 1)
    with pytest.raises(_ragged.NotRunnable, match="padding mask"):
        _ragged.build_ragged_contender("cudnn-padded", _r(), _case(_r()), backward=False)


def _fake_varlen(calls: list, *, new: bool):
    """``varlen_attn`` of torch 2.13 (``window_size``, ``enable_gqa``) or 2.11 (``is_causal``
    only), computed by the float32 reference (bottom-right, torch's convention)."""
    def run(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, window):
        calls.append(dict(window=window, heads_kv=key.shape[1], max_q=max_q, max_k=max_k))
        if key.shape[1] != query.shape[1]:
            key = key.repeat_interleave(query.shape[1] // key.shape[1], 1)
            value = value.repeat_interleave(query.shape[1] // value.shape[1], 1)
        causal = window[1] == 0
        return varlen_reference(query, key, value, cu_seq_q, cu_seq_k, causal=causal,
                                bottom_right=True,
                                window=(window[0], -1 if causal else window[1])).to(query.dtype)

    if new:
        def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *,
                        return_aux=None, scale=None, window_size=(-1, -1), enable_gqa=False):
            assert enable_gqa or key.shape[1] == query.shape[1]
            return run(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, window_size)
    else:
        def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *,
                        is_causal=False):
            assert key.shape[1] == query.shape[1]  # no grouped heads
            return run(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k,
                       (-1, 0) if is_causal else (-1, -1))
    return varlen_attn


@pytest.mark.parametrize("new", [True, False], ids=("torch-2.13", "torch-2.11"))
@pytest.mark.parametrize("backward", [False, True], ids=("forward", "backward"))
def test_torch_varlen_contender_matches_the_reference(new, backward, monkeypatch):
    varlen = pytest.importorskip("torch.nn.attention.varlen")
    calls: list = []
    monkeypatch.setattr(varlen, "varlen_attn", _fake_varlen(calls, new=new))
    problem = _r()
    case = _case(problem, backward=backward)
    run, err = _ragged.build_ragged_contender("torch-varlen", problem, case, backward=backward)
    assert err < 1e-2
    run()
    # grouped heads where the torch takes them, else K/V repeated to H_q; the longest lengths
    assert calls[-1] == dict(window=(-1, 0), heads_kv=2 if new else 4, max_q=32, max_k=32)


def test_torch_varlen_says_why_not(monkeypatch):
    varlen = pytest.importorskip("torch.nn.attention.varlen")

    def no_mask(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k):
        raise AssertionError("not called")

    monkeypatch.setattr(varlen, "varlen_attn", no_mask)
    with pytest.raises(_ragged.NotRunnable, match="takes no window_size"):
        _ragged.build_ragged_contender("torch-varlen", _r(), _case(_r()), backward=False)
    monkeypatch.delattr(varlen, "varlen_attn")
    with pytest.raises(_ragged.NotRunnable, match="has no torch.nn.attention.varlen"):
        _ragged.build_ragged_contender("torch-varlen", _r(), _case(_r()), backward=False)
    with pytest.raises(_ragged.NotRunnable, match="does not take"):
        _ragged.build_ragged_contender("cudnn-padded", _r(softcap=5.0), None, backward=False)


# -- the engine's rows ---------------------------------------------------------------------------

_Sched = NamedSchedule


def _Case(problem, backward):
    return ReferenceCase(_case(problem, backward=backward),
                         "ragged problems take no torch SDPA baseline")


class _RaggedForward(type(FORWARD)):
    """The forward family (its flops: the ragged count) with a CPU case."""

    name = "cpuragged"

    def case(self, problem, device_index):
        return _Case(problem, backward=False)


def _Runtime():
    return FixedRuntime("shipped")


@pytest.fixture
def ragged_family(monkeypatch, cpu_sdpa):
    family = tiledattention.register_family(_RaggedForward())
    monkeypatch.setattr(tiledattention, "runtime", lambda: _Runtime())
    yield dataclasses.replace(bench.RAGGED_PRESETS["forward"], kernel=family.name)
    tiledattention.unregister_family(family.name)


_timing = run_once_timing


def test_engine_checks_then_times_the_ragged_contenders(ragged_family, monkeypatch):
    varlen = pytest.importorskip("torch.nn.attention.varlen")
    monkeypatch.setattr(varlen, "varlen_attn", _fake_varlen([], new=True))
    problem = _r()
    rows = bench.measure_point(ragged_family, problem, ("tiledattention",) + RAGGED_CONTENDERS,
                               bench.BenchSettings(), env={}, time_fn=_timing)
    assert [r.contender for r in rows] == ["tiledattention", *RAGGED_CONTENDERS]
    pairs = sum(n * (n + 1) // 2 for n in (32, 24, 16, 8, 32, 24))
    tokens = 136
    for r in rows:
        assert r.status == "ok", r.note
        assert r.ragged and not r.variant and (r.batch, r.seqlen_q, r.heads_kv) == (6, 32, 2)
        assert r.rel_err < 1e-2 and r.median_ms == 2.0
        # every contender's TFLOP/s count the valid tokens' causal pairs, the same for all
        assert r.tflops == pytest.approx(4 * 4 * 32 * pairs / 2e-3 / 1e12)
        assert r.gbps == pytest.approx(2 * (2 * tokens * 4 * 32 + 2 * tokens * 2 * 32)
                                       / 2e-3 / 1e9)
    assert rows[0].schedule == "tuned" and rows[0].lookup_source == "shipped"

    def refuse(name, problem, case, *, backward):
        if name == "torch-varlen":
            raise _ragged.NotRunnable("torch 2.4 has no torch.nn.attention.varlen.varlen_attn")
        return (lambda: None), 0.5  # a contender whose output is wrong

    monkeypatch.setattr(_engine, "build_ragged_contender", refuse)
    rows = bench.measure_point(ragged_family, problem, RAGGED_CONTENDERS,
                               bench.BenchSettings(), env={}, time_fn=_timing)
    by = {r.contender: r for r in rows}
    assert by["torch-varlen"].status == "skipped" and "varlen_attn" in by["torch-varlen"].reason
    assert by["cudnn-padded"].status == by["efficient-padded"].status == "wrong"
    assert by["cudnn-padded"].reason == "err=0.5 > 0.01" and by["cudnn-padded"].rel_err == 0.5


# -- flags ---------------------------------------------------------------------------------------

def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tiledtune bench")
    bench_cmd.configure(parser)
    return parser.parse_args(list(argv))


@pytest.mark.parametrize("kwargs, flag, words", [
    (dict(preset="ragged", tokens="0"), "--tokens", "positive integer"),
    (dict(preset="ragged", tokens="16k"), "--tokens", "positive integer"),
    (dict(preset="ragged", tokens="16384,16384"), "--tokens", "twice"),
    (dict(preset="ragged", tokens="4096"), "--tokens", "cannot hold point llama-8k@16k's "
                                                       "longest sequence (8192 tokens)"),
    (dict(preset="ragged", dtypes="fp8"), "--dtypes", "'fp8'"),
    (dict(preset="ragged", seqlens="1024"), "--seqlens", "does not go with --preset ragged"),
    (dict(preset="ragged", batch="2"), "--batch", "it takes --tokens, --dtypes"),
    (dict(preset="ragged", causal="yes"), "--causal", "does not go with --preset ragged"),
    (dict(kernel="decode", preset="ragged"), "--preset ragged", "no such grid for --kernel "
                                                                "decode"),
    (dict(preset="ragged", problems=[_r().to_dict()]), "--preset ragged",
     "cannot go with --problem"),
    (dict(contenders="torch-varlen"), "--contenders",
     "'torch-varlen' runs only at ragged problems"),
    (dict(preset="ragged", contenders="torch-cudnn"), "--contenders",
     "'torch-cudnn' runs only at plain problems"),
    (dict(preset="ragged", contenders="flex"), "--contenders",
     "'flex' runs only at variant problems"),
    (dict(preset="ragged", contenders="cudnn-padded,eager"), "--contenders",
     "unknown contender 'eager'"),
], ids=lambda x: x if isinstance(x, str) else None)
def test_bad_ragged_flags_name_the_flag(kwargs, flag, words):
    with pytest.raises(BenchConfigError) as info:
        build_grid(**kwargs)
    message = str(info.value)
    assert message.startswith(flag) and words in message, message


def test_cli_ragged_preset(capsys):
    grid = bench_cmd.grid_from_args(_args("--preset", "ragged", "--quick", "--contenders",
                                          "torch-varlen,tiledattention"))
    assert grid == build_grid("forward", preset="ragged", quick=True,
                              contenders="torch-varlen,tiledattention")
    assert grid.contenders == ("tiledattention", "torch-varlen")  # canonical order
    assert bench_cmd.run(_args("--preset", "ragged", "--tokens", "100")) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "--tokens: 100 tokens cannot hold point" in err
    assert bench_cmd.run(_args("--kernel", "decode", "--preset", "ragged")) == 2
    assert "no such grid for --kernel decode" in " ".join(capsys.readouterr().err.split())
    # a ragged problem named field by field gets the ragged contenders on the default grid
    given = bench_cmd.grid_from_args(_args("--problem", "batch=4,heads_q=8,heads_kv=2,"
                                           "seqlen_q=512,seqlen_k=512,head_dim=64,dtype=bf16,"
                                           "causal=yes,ragged=yes"))
    assert given.contenders == OURS + RAGGED_CONTENDERS + PEER_CONTENDERS
    assert given.problems[0].ragged


# -- rows, CSV, summary and plots ----------------------------------------------------------------

def _row(name: str, problem: Problem, ms: float | None, kernel: str = "forward",
         **fields) -> BenchResult:
    base = dict(_engine.result_fields(problem), contender=name, kernel=kernel,
                phase=PRESETS[kernel].phase)
    if ms is None:
        return BenchResult(status="unavailable", reason="RuntimeError: no kernel", **base,
                           **fields)
    return BenchResult(status="ok", median_ms=ms, tflops=1.0 / ms, **base, **fields)


def _rows(kernel: str = "forward") -> list[BenchResult]:
    small, large = build_grid(kernel, preset="ragged", quick=True).problems[:2]
    times = ({"tiledattention": 1.0, "torch-varlen": 2.0, "cudnn-padded": 8.0,
              "efficient-padded": 4.0},
             {"tiledattention": 1.0, "torch-varlen": 1.5, "cudnn-padded": None,
              "efficient-padded": 3.0})
    return [_row(name, p, ms, kernel) for p, t in zip((small, large), times)
            for name, ms in t.items()]


def test_ragged_rows_round_trip_and_render(tmp_path):
    rows = _rows()
    assert _engine.result_fields(_r())["ragged"] is True
    assert "ragged" not in _engine.result_fields(PLAIN)  # plain rows keep the default
    assert rows[0].point != dataclasses.replace(rows[0], ragged=False).point
    path = write_csv(rows, tmp_path / "bench.csv")
    assert load_results(path) == rows
    # a CSV of an older run (no ragged column) loads as plain rows
    old = tmp_path / "old.csv"
    lines = path.read_text().splitlines()
    keep = [i for i, c in enumerate(lines[0].split(",")) if c != "ragged"]
    old.write_text("\n".join(",".join(line.split(",")[i] for i in keep)
                             for line in lines[:2]) + "\n")
    assert not load_results(old)[0].ragged
    text = render_markdown(rows, RunInfo(command="tiledtune bench --preset ragged",
                                         date="2026-01-01"))
    assert "# tiledattention benchmark: ragged batches" in text
    assert "valid tokens only" in text
    assert ("| point | contender | ms | TFLOP/s | ÷ varlen | ÷ cuDNN padded | "
            "÷ efficient padded |") in text
    label = "bf16 D128 causal-br H32/8 L1024 B16 (10240 tokens)"
    assert f"| {label} | tiledattention | 1.000 | 1.0 | 2.00 | 8.00 | 4.00 |" in text
    long = "bf16 D128 causal-br H32/8 L8192 B2 (14336 tokens)"  # 8192 + 6144
    assert f"| {long} | tiledattention | 1.000 | 1.0 | 1.50 | — | 3.00 |" in text
    # geometric means over the points where both ran
    assert "| tiledattention | 1.73 | 2 | 8.00 | 1 | 3.46 | 2 |" in text
    assert f"- cudnn-padded, {long}: unavailable: RuntimeError: no kernel" in text


def test_ragged_backward_rows_render_in_the_backward_units():
    text = render_markdown(_rows("backward"), RunInfo(command="", date=""))
    assert "# tiledattention backward benchmark: ragged batches" in text
    assert "| point | contender | bwd ms | bwd TFLOP/s |" in text
    assert "2.5x the forward's" in text


def test_ragged_plots(tmp_path):
    pytest.importorskip("matplotlib")
    from tuner.bench import write_plots

    written, messages = write_plots(_rows(), tmp_path)
    assert [p.name for p in written] == ["ragged_tflops_bf16.png", "ragged_speedup_bf16.png"]
    assert messages == []
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in written)
