"""``tiledtune bench --kernel decode --preset paged`` without a GPU: the preset's buckets (exactly
the shipped paged decode keys), the contenders each problem gets, GB/s and TFLOP/s counted on
the valid keys (against hand counts), the contenders (cuDNN's padded SDPA on the CPU's own
backend, ``varlen_attn`` with a block table replaced by a float32 gather) against the
per-entry reference on a paged case built like the decode family's, the engine's rows, bad
flags, and the rows in CSV, summary and plots. The engine's GPU timing is not run here
(``tests/gpu/test_bench_paged_gpu.py`` does)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import pytest

import tiledattention
from tiledattention import DECODE, Problem
from tiledattention.core._reference import attention_reference
from tuner import bench
from tuner.bench import (PAGED_CONTENDERS, PAGED_POINTS, PAGED_PRESETS, PEER_CONTENDERS,
                         PRESETS, RAGGED_CONTENDERS, VARIANT_CONTENDERS, BenchConfigError,
                         BenchResult, RunInfo, applies, build_grid, load_results,
                         render_markdown, write_csv)
from tuner.bench import _engine, _paged
from tuner.commands import bench_cmd

from ._bench_stand_ins import (FixedRuntime, NamedSchedule, ReferenceCase, paged_case,
                               run_once_timing)

OURS = ("tiledattention", "tiledattention-default")
SHIPPED = Path(tiledattention.__file__).parent / "pretuned" / "sm_90.json"


def _p(**fields) -> Problem:
    """A small paged bucket: 6 caches of 64, 48, 32, 16, 64, 48 keys in pages of 16."""
    base = dict(batch=6, heads_q=4, heads_kv=2, seqlen_q=1, seqlen_k=64, head_dim=32,
                dtype="bf16", causal=True, bottom_right=True, ragged=True, page_size=16)
    return Problem(**{**base, **fields})


def _bucket(batch: int, longest: int, page: int) -> tuple:
    return (batch, 32, 8, 1, longest, 128, True, True, True, page)


def _shape(p: Problem) -> tuple:
    return (p.batch, p.heads_q, p.heads_kv, p.seqlen_q, p.seqlen_k, p.head_dim, p.causal,
            p.bottom_right, p.ragged, p.page_size)


# -- the preset's grid -----------------------------------------------------------------------------

#: scripts/tune_paged_shipped.py's BUCKETS: (entries, longest cache, page size)
SHIPPED_BUCKETS = ((16, 32768, 64), (64, 32768, 64), (32, 16384, 64), (16, 32768, 16))


@pytest.mark.parametrize("quick, expected", [
    (False, [_bucket(*b) for b in SHIPPED_BUCKETS]),
    (True, [_bucket(*SHIPPED_BUCKETS[i]) for i in (0, 3)]),
], ids=("full", "quick"))
def test_paged_preset_points(quick, expected):
    grid = build_grid("decode", preset="paged", quick=quick)
    assert grid.kernel == "decode" and grid.preset_name == "paged"
    preset = grid.preset
    assert preset is PAGED_PRESETS["decode"] and preset.family.name == "decode"
    # the decode family's timing and ceiling: interleaved, read against the copy rate
    assert preset.interleave == PRESETS["decode"].interleave and preset.ceiling == "copy"
    assert preset.gbps and preset.phase == "" and preset.also == ()
    assert [_shape(p) for p in grid.problems] == expected
    for p in grid.problems:
        assert isinstance(p, Problem) and p.page_size and p.ragged and p.dtype == "bf16"
        assert Problem.from_dict(p.to_dict()) == p  # canonical
        assert DECODE.takes("sm_90", p)  # the decode family runs it
    # tiledattention's lookup and default, and both paged contenders, at every point
    assert grid.contenders == OURS + PAGED_CONTENDERS + PEER_CONTENDERS
    assert all(grid.contenders_at(p) == grid.contenders for p in grid.problems)


def test_points_are_exactly_the_shipped_paged_buckets():
    """The preset's problems are the shipped table's paged decode keys over 16-bit caches (the
    FP8 caches' rows are for the FP8 path), no more, no fewer: the lookup answers each with its
    tuned row."""
    rows = json.loads(SHIPPED.read_text())["rows"]
    shipped = [Problem.from_dict(row["problem"]) for row in rows
               if row["family"] == "decode" and row["problem"].get("page_size")
               and not row["problem"].get("kv_dtype")]
    problems = build_grid("decode", preset="paged").problems
    assert len(shipped) == len(problems) == 4
    assert set(problems) == set(shipped)


def test_points_are_buckets_of_serving_calls():
    """A real decode step of a few entries fewer, whose longest cache is a little shorter,
    lands on each point (``paged_problem``: the call's bucket)."""
    import torch

    from tiledattention.entry_points._paged import paged_problem

    problems = build_grid("decode", preset="paged").problems
    for (name, point), p in zip(PAGED_POINTS.items(), problems):
        b, longest, page = point["batch"] - 3, point["longest"] - 100, point["page_size"]
        q = torch.empty(b, 32, 1, 128, dtype=torch.bfloat16, device="meta")
        k_pages = torch.empty(b * longest // page, page, 8, 128, dtype=torch.bfloat16,
                              device="meta")
        table = torch.empty(b, -(-longest // page), dtype=torch.int32, device="meta")
        got, _ = paged_problem(q, k_pages, table, True, None, None, None, longest)
        assert got == p, name


def test_batch_seqlens_and_page_sizes_options():
    grid = build_grid("decode", preset="paged", quick=True, batch="8,16", seqlens_k="4096",
                      page_sizes="16,128", dtypes="bf16,fp16")
    # dtype, point, batch, longest, page; the two quick points collapse at each page size
    assert [(p.dtype, p.batch, p.seqlen_k, p.page_size) for p in grid.problems] == [
        (dtype, b, 4096, page) for dtype in ("bf16", "fp16") for b in (8, 16)
        for page in (16, 128)]
    assert len(set(grid.problems)) == len(grid.problems)
    assert bench_cmd.grid_from_args(_args("--kernel", "decode", "--preset", "paged", "--quick",
                                          "--batch", "8,16", "--seqlens-k", "4096",
                                          "--page-sizes", "16,128", "--dtypes",
                                          "bf16,fp16")) == grid


# -- which contenders each problem gets ----------------------------------------------------------

PLAIN = Problem(batch=1, heads_q=4, heads_kv=2, seqlen_q=1, seqlen_k=64, head_dim=32,
                dtype="bf16", causal=False)
RAGGED = Problem(batch=6, heads_q=4, heads_kv=2, seqlen_q=32, seqlen_k=32, head_dim=32,
                 dtype="bf16", causal=True, ragged=True)


@pytest.mark.parametrize("problem, expected", [
    (_p(), OURS + PAGED_CONTENDERS),
    (_p(seqlen_q=4), OURS + PAGED_CONTENDERS),
    (_p(heads_q=2), OURS + PAGED_CONTENDERS),
    (_p(window_left=15), OURS + PAGED_CONTENDERS),
    (_p(softcap=30.0), OURS),
    (_p(sinks=True), OURS),
    # a ragged batch without pages: not a paged one
    (RAGGED, OURS + ("tiledattention-forward",) + RAGGED_CONTENDERS),
    (PLAIN, OURS + ("tiledattention-forward", "torch-cudnn", "torch-flash")),
], ids=("decode-step", "four-rows", "mha", "window", "softcap", "sinks", "ragged", "plain"))
def test_contenders_per_problem(problem, expected):
    known = ("tiledattention", "tiledattention-default", "tiledattention-forward",
             "torch-cudnn", "torch-flash") + VARIANT_CONTENDERS + RAGGED_CONTENDERS \
        + PAGED_CONTENDERS
    assert tuple(c for c in known if applies(c, problem)) == expected


def test_a_paged_problem_named_field_by_field_gets_the_paged_contenders():
    grid = bench_cmd.grid_from_args(_args(
        "--kernel", "decode", "--problem", "batch=4,heads_q=8,heads_kv=2,seqlen_q=1,"
        "seqlen_k=1024,head_dim=64,dtype=bf16,causal=yes,bottom_right=yes,ragged=yes,"
        "page_size=32"))
    # the forward family reads no paged cache: its lookup is no contender here
    assert grid.contenders == OURS + PAGED_CONTENDERS + PEER_CONTENDERS
    assert grid.problems[0].page_size == 32


# -- work and bytes on the valid keys ---------------------------------------------------------

#: keys of each point's caches: B/4 times (1, 3/4, 1/2, 1/4) of the longest
VALID_KEYS = {"b16-32k-page64": 4 * (32768 + 24576 + 16384 + 8192),
              "b64-32k-page64": 16 * (32768 + 24576 + 16384 + 8192),
              "b32-16k-page64": 8 * (16384 + 12288 + 8192 + 4096),
              "b16-32k-page16": 4 * (32768 + 24576 + 16384 + 8192)}


@pytest.mark.parametrize("problem", [_p(), _p(seqlen_q=4), _p(batch=1), _p(seqlen_k=2)] + [
    p for p in build_grid("decode", preset="paged").problems], ids=str)
def test_case_lengths_are_the_paged_cases(problem):
    """The bench counts the caches the decode family's paged case holds."""
    from tiledattention.core._case import paged_lengths

    assert _paged.case_lengths(problem) == paged_lengths(problem)


def test_bytes_count_the_valid_kv_bytes_by_hand():
    """B16 at 32k: 4 x (32768, 24576, 16384, 8192) keys = 327680; each key H_kv 8 x D 128 x 2
    bytes, for K and for V: 1,342,177,280 bytes (not the bucket's 16 x 32768 rectangle, nor the
    pages' padding)."""
    assert VALID_KEYS["b16-32k-page64"] == 327680
    assert 327680 * 8 * 128 * 2 * 2 == 1_342_177_280
    for (name, point), p in zip(PAGED_POINTS.items(), build_grid("decode",
                                                                 preset="paged").problems):
        keys = VALID_KEYS[name]
        assert _paged.valid_keys(p) == sum(_paged.case_lengths(p)) == keys, name
        assert bench.problem_bytes(p) == keys * 8 * 128 * 2 * 2, name
        rectangle = point["batch"] * point["longest"] * 8 * 128 * 2 * 2
        assert bench.problem_bytes(p) == rectangle * 5 // 8 < rectangle  # 5/8 of it is valid
        # one query row per entry, bottom-right: every valid key is attended once per head
        assert bench.paged_flops(p) == 4 * 32 * 128 * keys, name
        assert bench.paged_flops(p) == DECODE.flops(p)  # the family's count, not the rectangle
        assert DECODE.flops(p) < p.flops
    small = _p()  # 6 caches of 64, 48, 32, 16, 64, 48 keys; H_kv 2, D 32
    assert _paged.case_lengths(small) == [64, 48, 32, 16, 64, 48]
    assert bench.problem_bytes(small) == 272 * 2 * 32 * 2 * 2
    # four query rows, the last of each cache's keys: n + (n-1) + (n-2) + (n-3) pairs an entry
    four = _p(seqlen_q=4)
    assert bench.paged_flops(four) == 4 * 4 * 32 * sum(4 * n - 6 for n in
                                                       [64, 48, 32, 16, 64, 48])
    # a window: the keys it lets some query see (16 of each cache), not the whole cache
    assert bench.problem_bytes(_p(window_left=15)) == 6 * 16 * 2 * 32 * 2 * 2


# -- the contenders against the per-entry reference ---------------------------------------------

@pytest.mark.parametrize("problem", [_p(), _p(seqlen_q=4), _p(heads_q=2), _p(page_size=32)],
                         ids=("decode-step", "four-rows", "mha", "pages-of-32"))
def test_padded_cache_contender_matches_the_reference(problem, cpu_sdpa, monkeypatch):
    import torch

    case = paged_case(problem)
    run, err = _paged.build_paged_contender("cudnn-padded-cache", problem, case)
    assert err < 1e-2
    out = run()
    assert out.shape == case.q.shape and torch.isfinite(out).all()
    # the check is sharp: without the key-padding mask the padded zeros join the softmax
    monkeypatch.setattr(bench._ragged, "padded_mask",
                        lambda problem, lens_q, lens_k, device: None)
    _, far = _paged.build_paged_contender("cudnn-padded-cache", problem, case)
    assert far > 0.05


def _fake_varlen(calls: list, *, block_table: bool = True):
    """torch's ``varlen_attn`` with a block table, computed in float32: each entry's pages
    gathered by its row of the table, its queries the last of its ``seqused_k`` keys."""
    import torch

    def run(query, key, value, cu_seq_q, max_q, max_k, window_size, enable_gqa, seqused_k,
            table):
        calls.append(dict(window=window_size, gqa=enable_gqa, max_q=max_q, max_k=max_k,
                          table=table.clone(), seqused=seqused_k.tolist()))
        out = torch.empty(query.shape, dtype=torch.float32)
        page = key.shape[1]
        for b, n in enumerate(seqused_k.tolist()):
            rows = slice(int(cu_seq_q[b]), int(cu_seq_q[b + 1]))
            pages = table[b, :-(-n // page)].long()
            k, v = (x[pages].flatten(0, 1)[:n].transpose(0, 1)[None] for x in (key, value))
            sq = rows.stop - rows.start
            one = Problem(batch=1, heads_q=query.shape[1], heads_kv=key.shape[2], seqlen_q=sq,
                          seqlen_k=n, head_dim=query.shape[2], dtype="bf16",
                          causal=window_size[1] == 0, bottom_right=window_size[1] == 0)
            out[rows] = attention_reference(query[rows].transpose(0, 1)[None], k, v,
                                            one)[0].transpose(0, 1)
        return out.to(query.dtype)

    if block_table:
        def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *,
                        return_aux=None, scale=None, window_size=(-1, -1), enable_gqa=False,
                        seqused_k=None, block_table=None, num_splits=None):
            assert cu_seq_k is None and block_table is not None and seqused_k is not None
            return run(query, key, value, cu_seq_q, max_q, max_k, window_size, enable_gqa,
                       seqused_k, block_table)
    else:
        def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *,
                        return_aux=None, scale=None, window_size=(-1, -1), enable_gqa=False):
            raise AssertionError("not called")
    return varlen_attn


@pytest.mark.parametrize("problem", [_p(), _p(seqlen_q=4)], ids=("decode-step", "four-rows"))
def test_torch_varlen_paged_contender_matches_the_reference(problem, monkeypatch):
    varlen = pytest.importorskip("torch.nn.attention.varlen")
    calls: list = []
    monkeypatch.setattr(varlen, "varlen_attn", _fake_varlen(calls))
    case = paged_case(problem)
    run, err = _paged.build_paged_contender("torch-varlen-paged", problem, case)
    assert err < 1e-2
    out = run()
    assert out.shape == (6 * problem.seqlen_q, 4, 32)  # packed [B·S_q, H_q, D]
    call = calls[-1]
    assert call["window"] == (-1, 0) and call["gqa"] is True  # causal bottom-right, grouped
    assert (call["max_q"], call["max_k"]) == (problem.seqlen_q, 64)
    assert call["seqused"] == _paged.case_lengths(problem)
    # the table's unused slots (-1 in the case's) point at a real page in the contender's copy
    assert (case.table == -1).any() and (call["table"] >= 0).all()
    assert (call["table"][case.table >= 0] == case.table[case.table >= 0]).all()


def test_paged_contenders_say_why_not(monkeypatch):
    varlen = pytest.importorskip("torch.nn.attention.varlen")
    case = paged_case(_p())
    monkeypatch.setattr(varlen, "varlen_attn", _fake_varlen([], block_table=False))
    assert "takes no block_table or seqused_k" in _paged.varlen_paged_support()
    with pytest.raises(_paged.NotRunnable, match="takes no block_table"):
        _paged.build_paged_contender("torch-varlen-paged", _p(), case)
    monkeypatch.delattr(varlen, "varlen_attn")
    with pytest.raises(_paged.NotRunnable, match="has no torch.nn.attention.varlen"):
        _paged.build_paged_contender("torch-varlen-paged", _p(), case)
    with pytest.raises(_paged.NotRunnable, match="does not take"):
        _paged.build_paged_contender("cudnn-padded-cache", _p(softcap=5.0), case)
    with pytest.raises(_paged.NotRunnable, match="no backward"):
        _paged.build_paged_contender("cudnn-padded-cache", _p(), case, backward=True)


def test_installed_torch_varlen_takes_a_block_table_or_says_why():
    """What the installed torch answers (2.13: a block table; the row runs)."""
    import inspect

    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        assert "has no torch.nn.attention.varlen" in _paged.varlen_paged_support()
        return
    has = "block_table" in inspect.signature(varlen_attn).parameters
    assert (_paged.varlen_paged_support() == "") == has


# -- the engine's rows ---------------------------------------------------------------------------

_Sched = NamedSchedule


def _Case(problem):
    return ReferenceCase(paged_case(problem), "paged problems take no torch SDPA baseline")


class _PagedDecode(type(DECODE)):
    """The decode family with a CPU case."""

    name = "cpupaged"

    def case(self, problem, device_index):
        return _Case(problem)


def _Runtime():
    return FixedRuntime("shipped")


@pytest.fixture
def paged_family(monkeypatch, cpu_sdpa):
    family = tiledattention.register_family(_PagedDecode())
    monkeypatch.setattr(tiledattention, "runtime", lambda: _Runtime())
    yield dataclasses.replace(PAGED_PRESETS["decode"], kernel=family.name)
    tiledattention.unregister_family(family.name)


_timing = run_once_timing


def test_engine_checks_then_times_the_paged_contenders(paged_family, monkeypatch):
    varlen = pytest.importorskip("torch.nn.attention.varlen")
    monkeypatch.setattr(varlen, "varlen_attn", _fake_varlen([]))
    problem = _p()
    rows = bench.measure_point(paged_family, problem, ("tiledattention",) + PAGED_CONTENDERS,
                               bench.BenchSettings(), env={}, time_fn=_timing)
    assert [r.contender for r in rows] == ["tiledattention", *PAGED_CONTENDERS]
    keys = 64 + 48 + 32 + 16 + 64 + 48
    for r in rows:
        assert r.status == "ok", r.note
        assert r.ragged and r.page_size == 16 and (r.batch, r.seqlen_q, r.seqlen) == (6, 1, 64)
        assert r.rel_err < 1e-2 and r.median_ms == 2.0
        # every contender's GB/s count the valid K/V bytes (H_kv 2, D 32, 2 bytes, K and V)
        assert r.gbps == pytest.approx(keys * 2 * 32 * 2 * 2 / 2e-3 / 1e9)
        assert r.tflops == pytest.approx(4 * 4 * 32 * keys / 2e-3 / 1e12)
    assert rows[0].schedule == "tuned" and rows[0].lookup_source == "shipped"

    def refuse(name, problem, case, *, backward):
        if name == "torch-varlen-paged":
            raise _paged.NotRunnable("torch 2.9's varlen_attn takes no block_table")
        return (lambda: None), 0.5  # a contender whose output is wrong

    monkeypatch.setattr(_engine, "build_paged_contender", refuse)
    rows = bench.measure_point(paged_family, problem, PAGED_CONTENDERS, bench.BenchSettings(),
                               env={}, time_fn=_timing)
    by = {r.contender: r for r in rows}
    assert by["torch-varlen-paged"].status == "skipped"
    assert "block_table" in by["torch-varlen-paged"].reason
    assert by["cudnn-padded-cache"].status == "wrong"
    assert by["cudnn-padded-cache"].reason == "err=0.5 > 0.01"


# -- flags ---------------------------------------------------------------------------------------

def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tiledtune bench")
    bench_cmd.configure(parser)
    return parser.parse_args(list(argv))


@pytest.mark.parametrize("kwargs, flag, words", [
    (dict(kernel="forward", preset="paged"), "--preset paged",
     "no such grid for --kernel forward (it has decode): a paged K/V cache is read by the "
     "decode family's kernels"),
    (dict(kernel="backward", preset="paged"), "--preset paged", "give --kernel decode"),
    (dict(batch="0"), "--batch", "positive integer"),
    (dict(batch="24"), "--batch", "24 is not a power of two"),
    (dict(batch="16,16"), "--batch", "twice"),
    (dict(seqlens_k="30000"), "--seqlens-k", "would be measured as 32768: give 32768"),
    (dict(seqlens_k="32k"), "--seqlens-k", "positive integer"),
    (dict(page_sizes="24"), "--page-sizes", "24 is not supported: page_size must be"),
    (dict(page_sizes="-16"), "--page-sizes", "positive integer"),
    (dict(page_sizes=""), "--page-sizes", "needs a comma-separated list"),
    (dict(dtypes="fp8"), "--dtypes", "'fp8'"),
    (dict(masks="none"), "--masks", "does not go with --preset paged"),
    (dict(heads="32/8"), "--heads", "it takes --batch, --seqlens-k, --page-sizes, --dtypes"),
    (dict(seqlens_q="4"), "--seqlens-q", "does not go with --preset paged"),
    (dict(problems=[_p().to_dict()]), "--preset paged", "cannot go with --problem"),
    (dict(contenders="torch-cudnn"), "--contenders", "'torch-cudnn' runs only at plain"),
    (dict(contenders="torch-varlen"), "--contenders", "'torch-varlen' runs only at ragged"),
    (dict(contenders="cudnn-padded-cache,eager"), "--contenders", "unknown contender 'eager'"),
    (dict(preset="default", contenders="torch-varlen-paged"), "--contenders",
     "'torch-varlen-paged' runs only at paged problems"),
    (dict(preset="default", page_sizes="64"), "--page-sizes",
     "goes only with --preset paged (--kernel decode)"),
], ids=lambda x: x if isinstance(x, str) else None)
def test_bad_paged_flags_name_the_flag(kwargs, flag, words):
    kwargs = {"kernel": "decode", "preset": "paged", **kwargs}
    with pytest.raises(BenchConfigError) as info:
        build_grid(**kwargs)
    message = str(info.value)
    assert message.startswith(flag) and words in message, message


def test_cli_paged_preset(capsys):
    grid = bench_cmd.grid_from_args(_args("--kernel", "decode", "--preset", "paged", "--quick",
                                          "--contenders", "cudnn-padded-cache,tiledattention"))
    assert grid == build_grid("decode", preset="paged", quick=True,
                              contenders="cudnn-padded-cache,tiledattention")
    assert grid.contenders == ("tiledattention", "cudnn-padded-cache")  # canonical order
    settings = bench_cmd.settings_from_args(_args("--kernel", "decode", "--preset", "paged"))
    assert settings.interleave == PRESETS["decode"].interleave[0]
    assert bench_cmd.run(_args("--kernel", "decode", "--preset", "paged", "--page-sizes",
                               "8")) == 2
    assert "--page-sizes: 8 is not supported" in " ".join(capsys.readouterr().err.split())
    assert bench_cmd.run(_args("--preset", "paged")) == 2  # --kernel forward, the default
    err = " ".join(capsys.readouterr().err.split())
    assert "--preset paged: no such grid for --kernel forward" in err and "--kernel decode" in err
    assert bench_cmd.run(_args("--kernel", "decode", "--page-sizes", "64")) == 2
    assert "--page-sizes goes only with --preset paged" in " ".join(
        capsys.readouterr().err.split())


# -- rows, CSV, summary and plots ----------------------------------------------------------------

def _row(name: str, problem: Problem, ms: float | None, **fields) -> BenchResult:
    base = dict(_engine.result_fields(problem), contender=name, kernel="decode")
    if ms is None:
        return BenchResult(status="unavailable", reason="RuntimeError: no kernel", **base,
                           **fields)
    return BenchResult(status="ok", median_ms=ms,
                       tflops=bench.paged_flops(problem) / (ms * 1e-3) / 1e12,
                       gbps=bench.problem_bytes(problem) / (ms * 1e-3) / 1e9, **base, **fields)


def _rows() -> list[BenchResult]:
    page64, page16 = build_grid("decode", preset="paged", quick=True).problems
    times = ({"tiledattention": 0.5, "torch-varlen-paged": 0.6, "cudnn-padded-cache": 1.0},
             {"tiledattention": 0.8, "torch-varlen-paged": None, "cudnn-padded-cache": 1.2})
    return [_row(name, p, ms) for p, t in zip((page64, page16), times)
            for name, ms in t.items()]


def test_paged_rows_round_trip_and_render(tmp_path):
    rows = _rows()
    assert _engine.result_fields(_p())["page_size"] == 16
    assert "page_size" not in _engine.result_fields(PLAIN)  # plain rows keep the default
    # two points that differ only in their page size are two points
    assert rows[0].point != rows[3].point and rows[0].page_size == 64 == 4 * rows[3].page_size
    path = write_csv(rows, tmp_path / "bench.csv")
    assert load_results(path) == rows
    # a CSV of an older run (no page_size column) loads as rows without pages
    old = tmp_path / "old.csv"
    lines = path.read_text().splitlines()
    keep = [i for i, c in enumerate(lines[0].split(",")) if c != "page_size"]
    old.write_text("\n".join(",".join(line.split(",")[i] for i in keep)
                             for line in lines[:2]) + "\n")
    assert load_results(old)[0].page_size == 0
    text = render_markdown(rows, RunInfo(command="tiledtune bench --kernel decode --preset "
                                                 "paged", date="2026-01-01",
                                         copy_gbps=(3000.0, 2684.35456)))
    assert "# tiledattention decode benchmark: paged K/V cache" in text
    assert "valid K/V bytes" in text and "`[B, 1, 1, L]`" in text
    assert ("| point | contender | µs | TFLOP/s | GB/s | % copy | ÷ varlen paged | "
            "÷ cuDNN padded |") in text
    label = "bf16 D128 H32/8 B16 L32768 page64 (327680 keys)"
    # 1,342,177,280 bytes in 0.5 ms: 2684 GB/s, 89% of the faster copy rate (3000);
    # 4 x 32 x 128 x 327680 flops in 0.5 ms: 10.74 TFLOP/s
    assert f"| {label} | tiledattention | 500.0 | 10.74 | 2684 | 89% | 1.20 | 2.00 |" in text
    page16 = "bf16 D128 H32/8 B16 L32768 page16 (327680 keys)"
    assert f"| {page16} | tiledattention | 800.0 | 6.71 | 1678 | 56% | — | 1.50 |" in text
    assert "## Share of the copy bandwidth" in text
    assert f"| {label} | 89% | 75% | 45% |" in text
    # geometric means over the points where both ran
    assert "| tiledattention | 1.20 | 1 | 1.73 | 2 |" in text
    assert f"- torch-varlen-paged, {page16}: unavailable: RuntimeError: no kernel" in text


def test_paged_plots(tmp_path):
    pytest.importorskip("matplotlib")
    from tuner.bench import write_plots

    written, messages = write_plots(_rows(), tmp_path, (3000.0,))
    assert [p.name for p in written] == ["paged_copy_share.png", "paged_speedup_bf16.png"]
    assert messages == []
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in written)
    assert all(p.stat().st_size < bench.MAX_PNG_BYTES for p in written)


def test_another_familys_contender_runs_a_paged_problem_only_where_that_family_tunes_pages():
    """The decode family's tuner case takes paged buckets; the forward reads pages for chunked
    prefill but tunes none, and the backward reads none."""
    problem = _p()
    assert applies("tiledattention-decode", problem)
    assert not applies("tiledattention-forward", problem)
    assert not applies("tiledattention-backward", problem)
