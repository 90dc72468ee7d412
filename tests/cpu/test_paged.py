"""A paged K/V cache on the CPU (issue 34): the problem field, which families take it, the
decode kernels' constants and normalisation, compiles for every architecture, and argument
errors raised before anything is launched."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import tiledattention
from tiledattention import BACKWARD, DECODE, FORWARD, DecodeSchedule, Problem
from tiledattention.kernels.decode._compile import compile_decode
from tiledattention.core._compile import SM_COUNTS
from tiledattention.kernels.decode._defaults import (PAGED_PART_WAVE_MAX_SHARE,
                                                     PAGED_SPLIT_FACTOR, SMALL_PAGE_LATENCY,
                                                     SMALL_PAGE_WAVES)
from tiledattention.core._problem import page_tile
from tiledattention.kernels.decode._launch import launches, normalise, split_constants
from tiledattention.core._device import DeviceInfo
from tiledattention.errors import InputValueError, UnsupportedProblemError
from tiledattention.kernels.forward._defaults import PAGE_PARTS_MAX_ROWS
from tiledattention.kernels.forward._launch import kernel_constants as FORWARD_CONSTANTS

from ..paged_kernels import mixed_tables_reference, read_pages_copy

ARCHS = ("sm_80", "sm_90", "sm_100", "sm_120", "sm_121")


def _paged(**fields) -> Problem:
    base = dict(batch=16, heads_q=32, heads_kv=8, seqlen_q=1, seqlen_k=32768, head_dim=128,
                dtype="bf16", causal=True, bottom_right=True, ragged=True, page_size=64)
    return Problem(**{**base, **fields})


def test_the_page_size_is_a_variant_field_of_its_own():
    p = _paged()
    assert "page_size" in Problem.VARIANT_FIELDS and "paged64" in p.describe()
    assert Problem.from_dict(p.to_dict()) == p
    assert "page_size" not in _paged(page_size=0).to_dict()
    # a paged pool holds what it holds: no batch x seqlen_k index bound
    assert _paged(batch=1024, seqlen_k=1 << 20).page_size == 64
    for bad in (8, 24, -16, 1.5, True):
        with pytest.raises(UnsupportedProblemError, match="page_size must be"):
            _paged(page_size=bad)
    with pytest.raises(UnsupportedProblemError, match="needs ragged=True"):
        _paged(ragged=False)


def test_which_family_reads_pages_and_when_the_forward_gathers_them():
    """A decode step goes to the split-KV kernels; a chunk of a prefill (many query rows) to
    the forward's ragged kernel, which reads pages in place where one page holds a whole key
    tile, or half of one under a bound on the query rows (else the call copies them); the
    backward refuses paged problems."""
    from tiledattention.entry_points._paged import reader

    assert reader("sm_90", _paged(seqlen_q=1)) is DECODE
    chunk = _paged(seqlen_q=512, batch=4, seqlen_k=16384)
    assert reader("sm_90", chunk) is FORWARD
    assert DECODE.reads_pages and FORWARD.reads_pages and not BACKWARD.reads_pages
    wide = FORWARD.default_schedule("sm_90", chunk)
    assert wide.tile_n == 128
    # two pages of 64 a tile: in place to PAGE_PARTS_MAX_ROWS query rows a group
    assert FORWARD.reads_pages_with(chunk, wide) and 512 * 4 == PAGE_PARTS_MAX_ROWS
    assert not FORWARD.reads_pages_with(_paged(seqlen_q=513, page_size=64), wide)
    assert FORWARD.reads_pages_with(_paged(seqlen_q=2048, heads_kv=32, page_size=64), wide)
    assert not FORWARD.reads_pages_with(_paged(seqlen_q=64, page_size=32), wide)  # four parts
    narrow = wide.replace(tile_n=64)  # parts of 32 keys: below PAGE_PARTS_MIN_KEYS
    assert not FORWARD.reads_pages_with(_paged(seqlen_q=64, page_size=32), narrow)
    assert FORWARD.reads_pages_with(chunk, wide.replace(tile_n=64))
    for size in (128, 256, 384):  # 384: page_tile 128
        assert FORWARD.reads_pages_with(_paged(seqlen_q=512, page_size=size), wide)
    assert not FORWARD.reads_pages_with(_paged(seqlen_q=512, page_size=48), wide)
    assert DECODE.reads_pages_with(_paged(page_size=16), DECODE.default_schedule("sm_90",
                                                                                _paged()))
    assert not BACKWARD.takes("sm_90", chunk)
    with pytest.raises(UnsupportedProblemError, match="reads no paged cache"):
        BACKWARD.default_schedule("sm_90", chunk)
    with pytest.raises(UnsupportedProblemError, match="reads no paged cache"):
        BACKWARD.compile(chunk, BACKWARD.default_schedule("sm_90", dataclasses.replace(
            chunk, page_size=0)), "sm_90")
    with pytest.raises(UnsupportedProblemError, match="no tuner case"):
        FORWARD.case(chunk, 0)


def test_the_paged_forward_walks_masked_tiles_as_its_schedule_says():
    """Value rows past the keys are zeroed only in the edge tile (which walks apart), so
    ``split_masked`` is the schedule's, as without pages."""
    chunk = _paged(seqlen_q=512, batch=4, seqlen_k=16384, page_size=256)
    schedule = FORWARD.default_schedule("sm_90", chunk).replace(split_masked=False)
    constants = FORWARD_CONSTANTS(chunk, schedule)
    assert constants["PAGED"] and not constants["SPLIT_MASKED"] and constants["PAGE_ROWS"] == 128
    assert FORWARD.normalise(chunk, schedule.replace(split_masked=True)) != \
        FORWARD.normalise(chunk, schedule)
    plain = dataclasses.replace(chunk, page_size=0)
    assert not FORWARD_CONSTANTS(plain, schedule)["SPLIT_MASKED"]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("page_size,tile_n", [(64, 64), (64, 128), (256, 0)])
def test_the_paged_forward_compiles(arch, page_size, tile_n):
    """In place: a page a key tile, or (pages of 64 under 128-key tiles) two parts of a
    page's keys a tile; ``tile_n`` 0: the default's."""
    from tiledattention.kernels.forward._compile import compile_schedule

    chunk = _paged(seqlen_q=512, batch=4, seqlen_k=16384, page_size=page_size)
    schedule = FORWARD.default_schedule(arch, chunk)
    schedule = FORWARD.normalise(chunk, schedule.replace(tile_n=tile_n or schedule.tile_n))
    assert FORWARD.reads_pages_with(chunk, schedule)
    constants = FORWARD_CONSTANTS(chunk, schedule)
    assert constants["PAGED"] and constants["PAGE_ROWS"] == min(page_size, schedule.tile_n)
    assert compile_schedule(chunk, schedule, arch).cubin[:4] == b"\x7fELF"


    # the decode family's tuner case of a paged bucket: caches of mixed lengths
    from tiledattention.core._case import paged_lengths

    assert paged_lengths(_paged(batch=6, seqlen_k=1000, seqlen_q=4)) == [1000, 750, 500, 250,
                                                                        1000, 750]
    assert paged_lengths(_paged(batch=4, seqlen_k=8, seqlen_q=4)) == [8, 6, 4, 4]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90", "sm_100", "sm_120", "sm_121"])
def test_the_paged_routes_small_kernels_compile(arch):
    """The copy of the pages a chunk reads (bf16 and fp16 pools of pages of 16-256, heads and
    head dims padded; an FP8 pool where FP8 runs) and a mixed step's tables."""
    from tiledattention.core._compile import capturing
    from tiledattention.entry_points._mixed_tables import compile_mixed_tables
    from tiledattention.entry_points._page_copy import compile_page_copy

    cases = [("bf16", "", 8, 128, 16), ("fp16", "", 3, 80, 48), ("bf16", "", 1, 256, 256)]
    if arch != "sm_80":
        cases.append(("bf16", "e4m3", 4, 64, 32))
    with capturing() as builds:
        for dtype, kv_dtype, hkv, d, page in cases:
            compile_page_copy(_paged(heads_q=2 * hkv, heads_kv=hkv, head_dim=d, dtype=dtype,
                                     kv_dtype=kv_dtype, page_size=page), arch)
        compile_mixed_tables(37, arch, "int64")
    assert [b[3][:4] for b in builds] == [b"\x7fELF"] * (len(cases) + 2)


def test_a_paged_long_query_run_walks_a_work_table_whatever_the_grid_would_idle():
    """A mixed step's forward bounds its query tiles by every sequence's queries: a 512-query
    chunk beside 63 decode tokens makes a grid of 8,192 CTAs for 128 that work, which the plain
    rule (``TABLE_MIN_IDLE_CTAS``) launches; a paged long query run walks a table instead."""
    from tiledattention.kernels.forward._launch import ragged_launch

    chunk = _paged(batch=64, seqlen_q=512, seqlen_k=16384, page_size=0)
    schedule = FORWARD.normalise(chunk, FORWARD.default_schedule("sm_90", chunk))
    plain = ragged_launch(chunk, schedule, 0.1, 64, 512, 575, packed=True, lse=False,
                          sinks=False, pages=False)
    tabled = ragged_launch(chunk, schedule, 0.1, 64, 512, 575, packed=True, lse=False,
                           sinks=False, pages=False, table=True)
    assert plain.items == 0 and plain.grid == (16, 64 * 8, 1)
    assert tabled.items == 79 and tabled.grid == (79 * 8, 1, 1) and tabled.tile_m == 32
    # (ragged_forward's layout asks for the table: the in-place-or-copied test below)


def test_the_page_copy_and_the_tables_launch_as_sized(monkeypatch):
    """The host side of the paged routes' small kernels: the copy's grid (one axis, every
    sequence's pages shared out over at most 8 CTAs an SM), outputs of every sequence's
    slots in the pool's dtype (the queries' when an FP8 pool is widened), the factors or the
    ranges standing in for them; the tables' grid of 128 sequences a CTA and its stand-ins
    without the decode step."""
    from tiledattention.core._device import DeviceInfo
    from tiledattention.entry_points import _mixed_tables, _page_copy

    launched = []
    for module in (_page_copy, _mixed_tables):
        monkeypatch.setattr(module._aot, "launch",
                            lambda stream, grid, kernel, args: launched.append((grid, args)))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    monkeypatch.setattr(_page_copy, "device_info",
                        lambda index: DeviceInfo(index=0, arch="sm_90", name="x", sm_count=132))
    pool = torch.zeros(50, 16, 2, 64, dtype=torch.bfloat16)
    table = torch.zeros(3, 9, dtype=torch.int32)
    ranges = torch.zeros(4, 3, dtype=torch.int32)
    k, v = _page_copy.copy_read_pages(pool, pool, table, ranges, 100)
    (grid, args), = launched
    # a 1-D grid: every sequence's pages shared out, at most eight CTAs an SM
    assert grid == (21,) and k.shape == (3, 2, 7 * 16, 64) and k.dtype == torch.bfloat16
    assert args[4].shape == (21, 16, 2, 64) and args[6] is ranges and args[7] is ranges
    assert args[8:] == (16, 2, 64, False, 128)
    fp8 = pool.to(torch.float8_e4m3fn)
    factors = (torch.ones(3, 2), torch.ones(3, 2))
    k, _ = _page_copy.copy_read_pages(fp8, fp8, table[:1].expand(300, 9), ranges, 1000, True,
                                      factors, torch.float16)
    grid, args = launched[-1]
    assert grid == (8 * 132,) and k.shape == (1, 2, 300 * 9 * 16, 64)
    assert k.dtype == torch.float16
    assert args[6] is factors[0] and args[7] is factors[1] and args[-2] is True
    cu, used = torch.zeros(301, dtype=torch.int32), torch.zeros(300, dtype=torch.int32)
    tables = _mixed_tables.mixed_tables(cu, used, 900, 144, 144, False)
    grid, args = launched[-1]
    assert grid == (3,) and tables.keys is None and tables.rows is None
    assert args[3].shape == (300,) and args[4].shape == (2, 1) and args[4].dtype == torch.int64
    assert args[5:] == (900, 144, 144, 128, False)
    tables = _mixed_tables.mixed_tables(cu, used, 900, 0, 50, True)
    assert launched[-1][1][3] is tables.keys and launched[-1][1][4] is tables.rows
    assert tables.rows.shape == (2, 300) and tables.rows.dtype == torch.int64


def test_the_page_copy_holds_the_read_pages_of_each_entry_in_order():
    """The reference of the copy a long query run reads (the kernel's GPU test compares with
    it): an entry's pages for the keys its ranges read, none for an entry without queries."""
    from tiledattention.entry_points._page_copy import copy_tile, copy_width

    pool = torch.arange(6 * 16 * 2 * 4, dtype=torch.float32).view(6, 16, 2, 4)
    table = torch.tensor([[4, 1, -1], [0, 5, 2], [3, 2, 1]], dtype=torch.int32)
    ranges = torch.tensor([[0, 3, 5], [3, 5, 5], [0, 48, 96], [20, 65, 120]])
    k, v = read_pages_copy(pool, pool, table, ranges, 40)  # 40 keys: three slots an entry
    assert k.shape == (3, 2, 48, 4) and copy_width(pool, table, 40) == 3
    assert torch.equal(k[0, :, :32].transpose(0, 1), torch.cat((pool[4], pool[1])))
    assert torch.equal(v[1, :, :32].transpose(0, 1), torch.cat((pool[0], pool[5])))
    # not read (past 20 and 17 keys; the third entry has no queries): not copied
    assert k[0, :, 32:].isnan().all() and v[1, :, 32:].isnan().all() and k[2].isnan().all()
    # tiles: a page's rows by a power of two dividing it, heads and head dim padded
    assert copy_tile(16, 8, 128) == (8, 8, 128)
    assert copy_tile(48, 3, 80) == (16, 4, 128)
    assert copy_tile(256, 1, 64) == (128, 1, 64)
    assert copy_tile(16, 64, 256) == (1, 32, 256)


class _Forward:
    """The forward family's two answers the paged routes ask for (whether it reads the pages
    in place), and its launch, recorded in ``launched`` instead of run."""

    def __init__(self, in_place: bool) -> None:
        self.in_place = in_place
        self.launched: dict = {}

    def reads_pages_with(self, problem, schedule):
        return self.in_place

    def forward_with_lse(self, stream, q, k, v, out, lse, problem, schedule, scale, device,
                         sinks=None, ragged=None):
        self.launched.update(q=q, k=k, v=v, out=out, problem=problem, scale=scale,
                             layout=ragged)


@pytest.mark.parametrize("in_place", [True, False])
def test_a_long_query_run_launches_the_paged_problem_in_place_or_gathered(in_place,
                                                                        monkeypatch):
    """A chunked prefill over pages runs the paged problem's own mask either way: a window
    without the causal mask stays bottom-right on gathered pages (they took it top-left once,
    found by the GPU conformance draws); in place the kernel gets the pools and the table,
    gathered each entry's keys in order and no table."""
    from tiledattention.entry_points import _paged as route

    forward = _Forward(in_place)
    launched = forward.launched
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    monkeypatch.setattr(route, "copy_read_pages", lambda *a: read_pages_copy(*a, fill=0))
    problem = _paged(batch=2, heads_q=4, heads_kv=2, seqlen_q=64, seqlen_k=64, head_dim=32,
                     causal=False, window_left=9, window_right=5, page_size=16)
    pool = torch.randn(6, 16, 2, 32)
    table = torch.tensor([[4, 1, -1], [0, 5, 2]], dtype=torch.int32)
    q = torch.randn(2, 4, 64, 32)
    out = route.ragged_forward(forward, problem, FORWARD.default_schedule("sm_90", problem),
                               q, pool, pool, table, torch.tensor([20, 40]), 40, None)
    assert out.shape == q.shape
    got, layout = launched["problem"], launched["layout"]
    assert (got.bottom_right, got.causal, got.window_left, got.window_right) == (True, False, 9, 5)
    assert layout.ranges.tolist() == [[0, 0], [64, 64], [0, 0], [20, 40]]
    assert layout.table  # a work table of the tiles the sequences have, always
    assert launched["scale"] == pytest.approx(32 ** -0.5)
    if in_place:
        assert got == problem and launched["k"] is pool and layout.pages is table
    else:
        assert got == dataclasses.replace(problem, page_size=0) and layout.pages is None
        assert torch.equal(launched["k"], read_pages_copy(pool, pool, table, layout.ranges,
                                                          40, fill=0)[0])


def test_a_load_never_straddles_two_pages():
    assert [page_tile(n) for n in (16, 48, 64, 80, 256, 272)] == [16, 16, 64, 16, 256, 16]
    s = normalise(_paged(page_size=48), DecodeSchedule(tile_n=128, k_transposed=True))
    assert s.tile_n == 128 and s.k_transposed == DecodeSchedule().k_transposed
    rows = {n: split_constants(_paged(page_size=n), DecodeSchedule(tile_n=128))["PAGE_ROWS"]
            for n in (16, 48, 64, 256)}
    assert rows == {16: 16, 48: 16, 64: 64, 256: 128}  # loads of a tile: 8, 8, 2, 1
    assert split_constants(_paged(page_size=48), DecodeSchedule())["PAGE_SIZE"] == 48
    flat = launches(_paged(page_size=48), DecodeSchedule(tile_n=64, flat=True), None).flat
    assert flat.split_constants[4:6] == (16, 48)  # PAGE_ROWS, PAGE_SIZE
    assert split_constants(_paged(), DecodeSchedule())["PAGED"]
    plain = split_constants(_paged(page_size=0), DecodeSchedule())
    assert not plain["PAGED"] and plain["PAGE_ROWS"] == 0


def test_a_paged_batch_splits_by_the_cache_rule():
    """The plain rule on the longest cache where one split fills the GPU and for one cache
    (more splits lost 1.07-1.26x on caches of one length on an H200); a batch of several
    caches short of the GPU takes ``PAGED_SPLIT_FACTOR`` times the rule's splits, two CTAs an
    SM (their lengths differ: 1.02-2.81x on mixed-length batches)."""
    for batch, seqlen_k in ((32, 16384), (1, 32768)):
        paged = DECODE.default_schedule("sm_90", _paged(batch=batch, seqlen_k=seqlen_k))
        plain = DECODE.default_schedule("sm_90", _paged(batch=batch, seqlen_k=seqlen_k,
                                                        ragged=False, page_size=0))
        assert paged.splits == plain.splits
    paged = DECODE.default_schedule("sm_90", _paged(batch=8, seqlen_k=8192))  # 64 CTAs a split
    plain = DECODE.default_schedule("sm_90", _paged(batch=8, seqlen_k=8192, ragged=False,
                                                    page_size=0))
    assert (paged.splits, paged.occupancy) == (PAGED_SPLIT_FACTOR * plain.splits, 2)


def test_small_pages_walk_short_steps_in_two_waves():
    """Pages of 16 (loads of 16 keys, also pages of 48): 64-key steps, K and V loads
    ``SMALL_PAGE_LATENCY`` steps ahead at two CTAs an SM (not one cache's one, nor in a
    window) and splits for two waves of CTAs
    (1.60-1.73x the 128-key, one-wave default on an H200), times
    ``PAGED_SPLIT_FACTOR`` at two CTAs an SM for a batch short of the GPU; a split that fills
    the GPU alone runs two CTAs an SM, with larger pages loading K four steps ahead; other
    larger pages keep the cache rule (times the factor: at least two splits at two CTAs an
    SM)."""
    def default(**fields):
        return DECODE.default_schedule("sm_90", _paged(**fields))

    small = default(batch=8, seqlen_k=16384, page_size=16)  # 64 CTAs a split
    assert (small.tile_n, small.splits, small.occupancy) == (64, 5 * PAGED_SPLIT_FACTOR, 2)
    assert (small.k_latency, small.v_latency) == (SMALL_PAGE_LATENCY, SMALL_PAGE_LATENCY)
    assert default(batch=8, seqlen_k=16384, page_size=48) == small
    windowed = default(batch=8, seqlen_k=16384, page_size=16, window_left=4000)
    assert (windowed.k_latency, windowed.v_latency) == (2, 2)  # not measured with a window
    wide = default(batch=64, seqlen_k=2048, page_size=16)  # 512 CTAs: two waves already
    assert (wide.tile_n, wide.splits, wide.occupancy, wide.k_latency) == (
        64, 1, 2, SMALL_PAGE_LATENCY)
    large = default(batch=32, seqlen_k=8192, page_size=32)  # 256 CTAs
    assert (large.tile_n, large.splits, large.occupancy, large.k_latency) == (128, 1, 2, 4)
    few = default(batch=8, seqlen_k=32768, page_size=64)  # 64 CTAs: the cache rule's 2
    assert (few.tile_n, few.splits, few.occupancy, few.k_latency) == (
        128, 2 * PAGED_SPLIT_FACTOR, 2, 2)
    short = default(batch=12, seqlen_k=16384, page_size=64)  # 96 CTAs: two splits, two an SM
    assert (short.tile_n, short.splits, short.occupancy, short.k_latency) == (
        128, 2 * PAGED_SPLIT_FACTOR, 2, 2)
    one = default(batch=1, seqlen_k=16384, page_size=16)  # one cache: nothing to balance
    assert one.splits == -(-SMALL_PAGE_WAVES * SM_COUNTS["hopper"] // 8)  # 8 rows, the rule
    assert (one.occupancy, one.k_latency, one.v_latency) == (1, 2, 2)


def test_a_paged_batch_of_a_part_wave_of_two_ctas_an_sm_splits_by_the_factor(monkeypatch):
    """A batch whose rows fill its waves of one CTA an SM (two over pages of 16) but at most
    ``PAGED_PART_WAVE_MAX_SHARE`` of them: ``PAGED_SPLIT_FACTOR`` splits at two CTAs an SM
    (the longest caches' one-split CTAs ran alone at the end: 0.99-2.01x on an H200, mixed
    lengths, 136-192 rows at D 64-256, 280-360 over pages of 16); past that share, for one
    cache, an FP8 cache or a window, the rules before."""
    def default(**fields):
        return DECODE.default_schedule("sm_90", _paged(**fields))

    sms = SM_COUNTS["hopper"]
    for batch, heads_kv, page, dim, waves in ((17, 8, 128, 128, 1), (36, 4, 64, 64, 1),
                                              (24, 8, 256, 256, 1), (150, 1, 32, 128, 1),
                                              (40, 8, 16, 128, 2), (49, 8, 16, 128, 2)):
        rows = batch * heads_kv
        assert waves * sms <= rows <= PAGED_PART_WAVE_MAX_SHARE * waves * sms
        d = default(batch=batch, heads_q=4 * heads_kv, heads_kv=heads_kv, seqlen_k=9000,
                    page_size=page, head_dim=dim)
        assert (d.splits, d.occupancy) == (PAGED_SPLIT_FACTOR, 2), (batch, heads_kv, page)
        assert d.combine == ("block_pdl" if dim <= 128 else "block")  # D 256: PDL spills
    for past in (dict(batch=25, page_size=64), dict(batch=50, page_size=16)):  # 200, 400 rows
        d = default(seqlen_k=9000, **past)
        assert (d.splits, d.occupancy) == (1, 2), past
    others = [dict(kv_dtype="e4m3"), dict(causal=False, window_left=1000, window_right=0),
              dict(batch=1, heads_q=640, heads_kv=160)]
    fields = [dict(dict(batch=20, seqlen_k=9000, page_size=64), **f) for f in others]  # 160 rows
    found = [default(**f) for f in fields]
    monkeypatch.setattr("tiledattention.kernels.decode._defaults.PAGED_PART_WAVE_MAX_SHARE", 1)
    assert found == [default(**f) for f in fields]  # the rule changes none of them
    assert default(batch=20, seqlen_k=9000, page_size=64).splits == 1  # the rule before


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("fields", [dict(page_size=16), dict(page_size=256, seqlen_q=4),
                                    dict(page_size=64, seqlen_q=128, heads_q=16, heads_kv=16,
                                         head_dim=64, dtype="fp16"),
                                    dict(page_size=64, causal=False, window_left=511,
                                         window_right=0)],
                         ids=["p16", "p256_spec", "p64_chunk_mha", "p64_window"])
def test_the_paged_decode_compiles(arch, fields):
    p = _paged(**fields)
    # the split + combine pair everywhere; one split (direct) on Hopper and RTX Blackwell, two
    # of tileiras's back ends (each build takes seconds of CI's time)
    for splits in (1, 8) if arch in ("sm_90", "sm_120") else (8,):
        schedule = DECODE.default_schedule(arch, p).replace(splits=splits)
        result = compile_decode(p, schedule, arch)
        assert result.cubin[:4] == b"\x7fELF"


def _args(b=2, hq=4, hkv=2, d=64, pages=6, page=16, width=3):
    q = torch.randn(b, hq, 1, d, dtype=torch.bfloat16)
    k = torch.randn(pages, page, hkv, d, dtype=torch.bfloat16)
    table = torch.zeros(b, width, dtype=torch.int32)
    used = torch.ones(b, dtype=torch.int32)
    return q, k, k.clone(), table, used


@pytest.mark.parametrize("change, error, match", [
    (dict(q=torch.randn(2, 4, 64)), ValueError, "q must have 4 dims"),
    (dict(k=torch.randn(6, 16, 2, 64)), TypeError, "bfloat16 or float16"),
    (dict(table=torch.zeros(2, 3)), ValueError, "block_table must be an int32 tensor"),
    (dict(used=torch.ones(3, dtype=torch.int32)), ValueError, "seqused_k must be an int32"),
    (dict(used=[1, 1]), TypeError, "seqused_k must be an int32 torch.Tensor"),
    # pages of 24 keys run over a regrouped copy: the call is told its device
    (dict(k=torch.randn(6, 24, 2, 64, dtype=torch.bfloat16)), ValueError, "must be CUDA"),
    (dict(), ValueError, "must be CUDA tensors"),
])
def test_bad_arguments_name_what_was_expected(change, error, match):
    q, k, v, table, used = _args()
    args = dict(q=q, k=k, v=v, table=table, used=used)
    args.update(change)
    if "k" in change:
        args["v"] = args["k"].clone()
    with pytest.raises(error, match=match):
        tiledattention.paged_attention(args["q"], args["k"], args["v"], args["table"],
                                       args["used"])


def _order_of(entries):
    """A ``PagedOrder`` holding ``entries`` (its constructor ranks on a GPU)."""
    from tiledattention.entry_points._paged_order import PagedOrder

    order = object.__new__(PagedOrder)
    order.entries = entries
    return order


def test_a_step_order_is_refused_unless_it_ranks_the_calls_batch():
    """``order`` is a ``PagedOrder`` of the call's batch, on its device, or ``None``; and a
    ``PagedOrder`` ranks only an int32 ``[B]`` CUDA tensor. Each is named before any launch."""
    q, k, v, table, used = _args()
    for order, error, match in (
            ([1, 0], tiledattention.InputTypeError, "order must be a tiledattention.PagedOrder"),
            (used, tiledattention.InputTypeError, "got Tensor"),
            (_order_of(torch.zeros(3, dtype=torch.int32)), InputValueError,
             "order must rank this call's batch: 2 entries on cpu; got a PagedOrder of 3"),
            (_order_of(torch.zeros(2, dtype=torch.int32, device="meta")), InputValueError,
             "on meta"),
            (_order_of(torch.zeros(2, dtype=torch.int32)), InputValueError,
             "must be CUDA tensors")):  # a right order: the device check comes last
        with pytest.raises(error, match=match):
            tiledattention.paged_attention(q, k, v, table, used, order=order)
    for lengths, match in (([3, 1], "must be an int32 torch.Tensor"),
                           (torch.ones(2), "int32 tensor \\[B\\] with B >= 1; got torch.float32"),
                           (torch.ones(2, 1, dtype=torch.int32), "of shape \\(2, 1\\)"),
                           (torch.ones(0, dtype=torch.int32), "of shape \\(0,\\)"),
                           (used, "must be a CUDA tensor; got one on cpu")):
        with pytest.raises((tiledattention.InputTypeError, InputValueError), match=match):
            tiledattention.PagedOrder(lengths)


def test_a_compiled_step_traces_the_paged_op_without_its_order():
    """Under ``torch.compile`` the call hands no order to its op (each call ranks for itself
    there, a launch a CUDA graph replays): a step given a ``PagedOrder`` traces in one graph
    of one ``tiledattention::paged_attention`` node whose inputs are the call's five arrays,
    not the order's entries."""
    q, k, v, table, used = _args()
    order = _order_of(torch.arange(2, dtype=torch.int32))
    graphs = []

    def backend(gm, inputs):
        graphs.append(gm)
        return lambda *args: (torch.zeros(q.shape, dtype=q.dtype),)

    step = torch.compile(lambda *a: tiledattention.paged_attention(*a, order=order),
                         backend=backend, fullgraph=True)
    step(q, k, v, table, used)
    (gm,) = graphs
    ops = [n for n in gm.graph.nodes if n.op == "call_function"
           and "paged_attention" in str(n.target)]
    assert len(ops) == 1
    assert len([n for n in gm.graph.nodes if n.op == "placeholder"]) == 5


def test_varlen_attn_over_pages_checks_its_arguments():
    q = torch.randn(5, 4, 64, dtype=torch.bfloat16)
    k = torch.randn(6, 16, 2, 64, dtype=torch.bfloat16)
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    table = torch.zeros(2, 3, dtype=torch.int32)
    used = torch.ones(2, dtype=torch.int32)
    # query counts of their own (2 and 3) and one count (2 and 2): the device check is last
    for tokens, max_q in ((5, 3), (4, 2)):
        with pytest.raises(ValueError, match="must be CUDA tensors"):
            tiledattention.varlen_attn(q[:tokens], k, k, cu, None, max_q, 40, seqused_k=used,
                                       block_table=table, enable_gqa=True)
    with pytest.raises(ValueError, match="enable_gqa=True"):
        tiledattention.varlen_attn(q, k, k, cu, None, 3, 40, seqused_k=used, block_table=table)
    with pytest.raises(ValueError, match="block_table and seqused_k together"):
        tiledattention.varlen_attn(q, k, k, cu, None, 3, 40, seqused_k=used)


@pytest.mark.parametrize("change, error, match", [
    (dict(cu=torch.tensor([0.0, 2.0, 5.0])), ValueError, "cu_seq_q must be an int32 tensor"),
    (dict(cu=torch.tensor([0, 2, 5], dtype=torch.int32), table=torch.zeros(3, 3,
                                                                            dtype=torch.int32)),
     ValueError, r"block_table must be an int32 tensor \[sequences, max_pages\] = \[2"),
    (dict(used=torch.ones(3, dtype=torch.int32)), ValueError, "seqused_k must be an int32"),
    (dict(used=torch.ones(2)), ValueError, "seqused_k must be an int32"),
    (dict(k=torch.randn(6, 16, 2, 32, dtype=torch.bfloat16)), ValueError,
     "key's head_dim must be query's"),
    (dict(k=torch.randn(6, 16, 3, 64, dtype=torch.bfloat16)), ValueError,
     r"query's heads \(4\) must be a multiple of key's \(3\)"),
    (dict(k=torch.randn(6, 16, 2, 64, dtype=torch.float16)), TypeError, "must have one dtype"),
    (dict(is_causal="top_left"), ValueError, "last positions of its keys"),
    (dict(max_k=0), ValueError, "max_k must be at least 1"),
    (dict(grad=True), RuntimeError, "no autograd"),
    (dict(), ValueError, "must be CUDA tensors"),
])
def test_a_mixed_step_over_pages_names_a_wrong_argument(change, error, match):
    """Sequences of their own query counts (2 and 3 here) over pages: every argument checked,
    by the caller's names, before the device check and before anything runs."""
    args = dict(q=torch.randn(5, 4, 64, dtype=torch.bfloat16),
                k=torch.randn(6, 16, 2, 64, dtype=torch.bfloat16),
                cu=torch.tensor([0, 2, 5], dtype=torch.int32),
                table=torch.zeros(2, 3, dtype=torch.int32), used=torch.ones(2, dtype=torch.int32),
                is_causal=True, max_k=40, grad=False)
    args.update(change)
    q = args["q"].requires_grad_(args["grad"])
    with pytest.raises(error, match=match):
        tiledattention.varlen_attn(q, args["k"], args["k"].clone(), args["cu"], None, 3,
                                   args["max_k"], is_causal=args["is_causal"],
                                   seqused_k=args["used"], block_table=args["table"],
                                   enable_gqa=True)


@pytest.mark.parametrize("tokens, max_q, route", [(5, 3, "packed"), (4, 2, "paged"),
                                                  (3, 1, "packed"), (2, 1, "paged")])
def test_varlen_attn_over_pages_packs_query_counts_of_their_own(tokens, max_q, route,
                                                                monkeypatch):
    """One query count (tokens = sequences x max_q) runs as paged_attention's [N, H, max_q, D]
    batch; else the packed queries go to the packed route with the offsets, the alignment,
    the window and the longest counts."""
    from tiledattention.entry_points import _paged, _paged_mixed

    seen = {}
    monkeypatch.setattr(_paged_mixed, "packed_paged_attention",
                        lambda *a, **k: seen.update(packed=(a, k)) or a[0])
    monkeypatch.setattr(_paged, "paged_attention",
                        lambda q, *a, **k: seen.update(paged=(q, a, k)) or q)
    q = torch.randn(tokens, 4, 64, dtype=torch.bfloat16)
    k = torch.randn(6, 16, 2, 64, dtype=torch.bfloat16)
    cu = torch.tensor([0, 2, tokens], dtype=torch.int32)
    table, used = torch.zeros(2, 3, dtype=torch.int32), torch.ones(2, dtype=torch.int32)
    out = tiledattention.varlen_attn(q, k, k, cu, None, max_q, 40, is_causal=False,
                                     window_size=(7, 0), seqused_k=used, block_table=table,
                                     enable_gqa=True)
    assert list(seen) == [route] and out.shape == q.shape
    if route == "packed":
        args, kwargs = seen["packed"]
        assert args[0] is q and args[3] is cu and args[4] is table and args[5] is used
        assert args[6:] == (max_q, 40)
        assert kwargs == dict(causal="bottom_right", scale=None, window=(7, 0))
    else:
        q4, _, kwargs = seen["paged"]
        assert q4.shape == (2, 4, max_q, 64) and kwargs["max_k"] == 40


@pytest.mark.parametrize("in_place", [True, False])
def test_a_mixed_step_launches_its_packed_queries_over_pages_in_place_or_gathered(
        in_place, monkeypatch):
    """The packed queries as one [1, H, tokens, D] batch entry, each sequence's rows by the
    offsets; its keys in its pages (in place: the pools and the table, key ranges from 0) or
    copied into one packed copy (sequence b's keys from b x its slots, no table; the pages of
    the keys it reads, none for a sequence of no queries); key ends held to what the pages or
    the copy hold; rows of no sequence cleared."""
    from tiledattention.entry_points import _paged as route

    forward, cleared = _Forward(in_place), []
    launched = forward.launched
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    monkeypatch.setattr(route, "clear_uncovered_rows", lambda *a: cleared.append(a))
    monkeypatch.setattr(route, "copy_read_pages", read_pages_copy)
    pool = torch.randn(7, 16, 2, 32, dtype=torch.bfloat16)
    table = torch.tensor([[4, 1, -1], [0, 5, 2], [6, 3, 3]], dtype=torch.int32)
    query = torch.randn(40, 4, 32, dtype=torch.bfloat16)
    cu = torch.tensor([1, 6, 6, 38], dtype=torch.int32)  # 5, 0 and 32 queries; 2 rows spare
    used = torch.tensor([20, 3, 60], dtype=torch.int32)  # 60: past 3 pages (48 keys)
    problem, longest = route.paged_problem(query, pool, table, True, None, None, None, 40,
                                           longest_q=32)
    assert (problem.batch, problem.seqlen_q, problem.page_size) == (2, 32, 16)
    out = route.ragged_forward(forward, problem, FORWARD.default_schedule("sm_90", problem),
                               query, pool, pool, table, used, longest, None,
                               queries=torch.stack((cu[:-1], cu[1:])), longest_q=32)
    layout = launched["layout"]
    assert out.shape == query.shape and layout.packed and layout.longest_q == 32
    assert launched["q"].shape == (1, 4, 40, 32) and launched["out"].data_ptr() == out.data_ptr()
    assert torch.equal(launched["q"][0].transpose(0, 1), query)
    assert cleared and cleared[0][2] is layout.ranges and cleared[0][3] == 0
    ranges = layout.ranges.tolist()
    assert ranges[:2] == [[1, 6, 6], [6, 6, 38]]
    if in_place:
        assert launched["k"] is pool and layout.pages is table and launched["problem"] == problem
        assert ranges[2:] == [[0, 0, 0], [20, 3, 48]]
    else:
        assert layout.pages is None and launched["problem"].page_size == 0
        slots = 48  # 40 keys: three pages a sequence
        assert launched["k"].shape == (1, 2, 3 * slots, 32)
        assert ranges[2:] == [[0, slots, 2 * slots], [20, slots + 3, 2 * slots + 48]]
        # the pages of the keys read: two, none (no queries), three
        for b, pages in enumerate((2, 0, 3)):
            keys = launched["k"][0, :, b * slots:(b + 1) * slots].transpose(0, 1)
            want = pool[table[b, :pages].long()].flatten(0, 1)
            assert torch.equal(keys[:16 * pages], want), b
            assert keys[16 * pages:].isnan().all(), b


@pytest.mark.parametrize("cu, max_q, apart, want", [
    # counts 1, 5, 0, 1, 33 and two spare rows: one-query sequences on the decode step
    ([0, 1, 6, 6, 7, 40], 33, True,
     [200] + [1] * 5 + [203] + [4] * 33 + [0] * 2),
    # counts 1, 0, 1 and a spare row: no forward at all
    ([0, 1, 1, 2], 1, True, [200, 202, 0]),
    # no decode step takes one-query sequences here: the forward takes every sequence
    ([0, 1, 6, 6, 7, 40], 33, False, [0] + [1] * 5 + [3] + [4] * 33 + [0] * 2),
])
def test_a_mixed_steps_one_query_sequences_run_as_a_decode_step(cu, max_q, apart, want,
                                                                 monkeypatch):
    """Which kernel writes which row of a mixed step: the forward (here: each covered row its
    sequence's index) the sequences of more than one query, the one-query step (200 + the
    sequence, exact in bf16; the others' keys held to none there) the rest, launched first
    and scattered to their rows after the forward cleared the rows outside its first start
    and last end; rows of no sequence zeros."""
    from tiledattention.entry_points import _paged
    from tiledattention.entry_points import _paged_mixed as route

    calls = []

    class Forward:
        def reads_pages_with(self, problem, schedule):
            return True

        def forward_with_lse(self, stream, q, k, v, out, lse, problem, schedule, scale,
                             device, sinks=None, ragged=None):
            calls.append(("forward", ragged.ranges[:2].tolist()))
            out.fill_(float("nan"))
            for b, (start, end) in enumerate(ragged.ranges[:2].t().tolist()):
                out[0, :, start:end] = b

    def clear(stream, out, ranges, which):
        out[0, :, :int(ranges[which, 0])] = 0
        out[0, :, int(ranges[which + 1, -1]):] = 0

    def single(runtime, q4, k_pages, v_pages, table, used, **kwargs):
        calls.append(("decode", tuple(q4.shape), used.tolist()))
        n = q4.shape[0]
        return (200 + torch.arange(n, dtype=q4.dtype))[:, None, None, None].expand(q4.shape)

    forward = Forward()
    pool = torch.zeros(8, 16, 2, 32, dtype=torch.bfloat16)
    sequences = len(cu) - 1
    table = torch.zeros(sequences, 3, dtype=torch.int32)
    query = torch.randn(len(want), 4, 32, dtype=torch.bfloat16)
    problem, longest = route.paged_problem(query, pool, table, True, None, None, None, 40,
                                           longest_q=max_q)
    resolution = type("R", (), {"schedule": FORWARD.default_schedule("sm_90", problem)})
    monkeypatch.setattr(route, "_packed_call",
                        lambda *a: (forward, problem, resolution, longest, ""))
    monkeypatch.setattr(route, "reader", lambda arch, shape: "decode" if apart else forward)
    monkeypatch.setattr(route, "device_info", lambda index: type("I", (), {"arch": "sm_90"}))
    monkeypatch.setattr(route, "paged_forward", single)
    monkeypatch.setattr(route, "mixed_tables", mixed_tables_reference)
    monkeypatch.setattr(_paged, "clear_uncovered_rows", clear)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    out = route.packed_paged_forward(None, query, pool, pool,
                                     torch.tensor(cu, dtype=torch.int32), table,
                                     torch.full((sequences,), 40, dtype=torch.int32), max_q, 40)
    assert out.shape == query.shape
    assert out[:, 0, 0].tolist() == want
    kinds = [c[0] for c in calls]
    assert kinds == (["decode"] if apart else []) + (["forward"] if max_q > 1 else [])
    if apart:  # the sequences of more queries (or none) read no key in the decode step
        counts = [e - s for s, e in zip(cu[:-1], cu[1:])]
        assert calls[0][1:] == ((sequences, 4, 1, 32), [40 if n == 1 else 0 for n in counts])
    if max_q > 1:
        ends = [e if e - s > 1 or not apart else s for s, e in zip(cu[:-1], cu[1:])]
        assert calls[-1][1] == [cu[:-1], ends]


def test_a_long_query_run_repeating_a_signature_runs_no_checks_again(monkeypatch):
    """A chunked prefill's repeat of a signature runs the kept ``LongRun`` (no checks, lookup
    or layout) on its own lengths; another ``max_k`` is judged again; sinks keep nothing.
    The output has q's layout: a view of packed rows packs back with no copy."""
    from tiledattention.core import _runtime
    from tiledattention.entry_points import _paged as route

    judged, looked_up, laid_out, launched = [], [], [], []
    real_check, real_layout = route.check_paged, route.key_layout

    def check(*args):
        judged.append(args[4].tolist())
        return real_check(*args)

    def layout(*args):
        laid_out.append(args[4].shape)
        return real_layout(*args)

    class Forward(_Forward):
        name = "forward"

        def paged_lookup(self, bucket, shape):
            looked_up.append(shape.seqlen_k)
            return bucket

        def forward_with_lse(self, stream, q, k, v, out, lse, *args, sinks=None, ragged=None):
            launched.append((ragged.ranges[3].tolist(), sinks is not None))
            out.copy_(q)

    forward = Forward(in_place=True)
    monkeypatch.setattr(route, "check_paged", check)
    monkeypatch.setattr(route, "key_layout", layout)
    monkeypatch.setattr(route, "check_device", lambda q: None)
    for module in (route, _runtime):
        monkeypatch.setattr(module, "device_info",
                            lambda index: type("I", (), {"arch": "sm_90"}))
    monkeypatch.setattr(route, "reader", lambda arch, shape: forward)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    runtime = _runtime.Runtime(lambda family, problem, info: type(
        "R", (), {"schedule": FORWARD.default_schedule("sm_90", problem)}))
    pool = torch.zeros(8, 16, 2, 32, dtype=torch.bfloat16)
    table = torch.zeros((2, 3), dtype=torch.int32)
    packed = torch.randn(2 * 24, 4, 32, dtype=torch.bfloat16)
    q = packed.unflatten(0, (2, 24)).transpose(1, 2)  # [2, 4, 24, 32], as varlen_attn passes
    for used, max_k in (([20, 40], 40), ([7, 33], 40), ([20, 40], 48)):
        out = route.paged_forward(runtime, q, pool, pool, table,
                                  torch.tensor(used, dtype=torch.int32), max_k=max_k)
        assert out.stride() == q.stride() and torch.equal(out, q)
        assert out.transpose(1, 2).reshape(packed.shape).data_ptr() == out.data_ptr()
    assert judged == [[20, 40], [20, 40]] and looked_up == [40, 48] and len(laid_out) == 2
    assert launched == [([20, 40], False), ([7, 33], False), ([20, 40], False)]
    sinks = torch.zeros(4)
    for _ in range(2):  # sinks: judged every call
        route.paged_forward(runtime, q, pool, pool, table,
                            torch.tensor([5, 6], dtype=torch.int32), max_k=40, sinks=sinks)
    assert len(judged) == 4 and launched[-2:] == [([5, 6], True)] * 2


def test_a_mixed_step_repeating_a_signature_runs_no_checks_again(monkeypatch):
    """The second call of a signature takes what the first decided (kept in the runtime under
    its warm key); another ``max_q``, or another table shape, is judged again; a call the
    checks refuse keeps nothing. The forward's keys are laid out once a call."""
    from tiledattention.core import _runtime
    from tiledattention.entry_points import _paged
    from tiledattention.entry_points import _paged_mixed as route

    judged, launched = [], []
    real = route._packed_call

    def counting(*args):
        judged.append(args[5].shape)
        return real(*args)

    class Forward(_Forward):
        name = "forward"

        def forward_with_lse(self, *args, ragged=None, **kwargs):
            launched.append(ragged.ranges[:2].tolist())

    forward = Forward(in_place=True)
    monkeypatch.setattr(route, "_packed_call", counting)
    monkeypatch.setattr(route, "check_device", lambda q: None)
    for module in (route, _runtime):
        monkeypatch.setattr(module, "device_info",
                            lambda index: type("I", (), {"arch": "sm_90"}))
    monkeypatch.setattr(route, "choose_family", lambda *a: forward)
    monkeypatch.setattr(route, "reader", lambda arch, shape: forward)
    monkeypatch.setattr(route, "mixed_tables", mixed_tables_reference)
    monkeypatch.setattr(_paged, "clear_uncovered_rows", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    forward.paged_lookup = lambda bucket, shape: bucket
    laid_out, real_layout = [], _paged.key_layout

    def layout(*args):
        laid_out.append(args[4].shape)
        return real_layout(*args)

    for module in (route, _paged):  # the forward's keys are laid out once a call
        monkeypatch.setattr(module, "key_layout", layout)
    runtime = _runtime.Runtime(lambda family, problem, info: type(
        "R", (), {"schedule": FORWARD.default_schedule("sm_90", problem)}))
    pool = torch.zeros(8, 16, 2, 32, dtype=torch.bfloat16)
    query = torch.randn(9, 4, 32, dtype=torch.bfloat16)
    cu = torch.tensor([0, 1, 9], dtype=torch.int32)
    used = torch.tensor([20, 40], dtype=torch.int32)
    for table, max_q in (((2, 3), 8), ((2, 3), 8), ((2, 3), 9), ((2, 4), 8), ((2, 4), 8)):
        route.packed_paged_forward(runtime, query, pool, pool, cu,
                                   torch.zeros(table, dtype=torch.int32), used, max_q, 40)
    assert judged == [(2, 3), (2, 3), (2, 4)]
    assert launched == [[[0, 1], [1, 9]]] * 5 and len(laid_out) == 5
    with pytest.raises(InputValueError, match="scale"):
        route.packed_paged_forward(runtime, query, pool, pool, cu,
                                   torch.zeros((2, 3), dtype=torch.int32), used, 8, 40,
                                   scale=-1.0)
    with pytest.raises(InputValueError, match="scale"):  # judged again: nothing was kept
        route.packed_paged_forward(runtime, query, pool, pool, cu,
                                   torch.zeros((2, 3), dtype=torch.int32), used, 8, 40,
                                   scale=-1.0)
    assert len(judged) == 5


def test_a_mixed_step_over_an_fp8_cache_widens_the_gathered_pages(monkeypatch):
    """An FP8 cache (``varlen_attn`` takes no descales: unit factors) is gathered and widened
    into q's dtype even where a page holds a whole key tile: the forward reads 16-bit keys."""
    from tiledattention.entry_points import _paged as route

    forward = _Forward(True)
    launched = forward.launched
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    monkeypatch.setattr(route, "clear_uncovered_rows", lambda *a: None)
    monkeypatch.setattr(route, "copy_read_pages", read_pages_copy)
    pool = torch.randn(5, 16, 2, 32).to(torch.float8_e4m3fn)
    table = torch.tensor([[3, 0], [1, 4]], dtype=torch.int32)
    query = torch.randn(9, 4, 32, dtype=torch.bfloat16)
    cu = torch.tensor([0, 1, 9], dtype=torch.int32)
    problem, longest = route.paged_problem(query, pool, table, True, None, None, None, 32,
                                           longest_q=8)
    ones = torch.ones((1, 2), dtype=torch.float32)
    route.ragged_forward(forward, problem, FORWARD.default_schedule("sm_90", problem), query,
                         pool, pool, table, torch.tensor([20, 32], dtype=torch.int32), longest,
                         None, factors=(ones, ones), queries=torch.stack((cu[:-1], cu[1:])),
                         longest_q=8)
    assert launched["layout"].pages is None and launched["k"].dtype == torch.bfloat16
    assert launched["problem"].page_size == 0 and launched["problem"].kv_dtype == ""
    want = torch.cat([pool[i] for i in (3, 0, 1, 4)]).to(torch.bfloat16)
    assert torch.equal(launched["k"][0].transpose(0, 1), want)
    assert launched["layout"].ranges.tolist()[2:] == [[0, 32], [20, 64]]


def test_a_copy_of_pages_past_the_index_range_is_refused_before_it_is_made(monkeypatch):
    """Gathered pages hold every entry's share of the longest cache: 300 entries of 2000
    pages of 16 keys (8 heads of D 256) would copy 2e10 elements from a pool of four pages.
    Refused before the copy, packed or not; the pool itself passes."""
    from tiledattention.entry_points import _paged as route

    forward = _Forward(in_place=False)
    monkeypatch.setattr(route, "copy_read_pages", lambda *a: pytest.fail("copied"))
    pool = torch.zeros(4, 16, 8, 256, dtype=torch.bfloat16)
    table = torch.zeros(300, 2000, dtype=torch.int32)
    used = torch.full((300,), 32000, dtype=torch.int32)
    problem, longest = route.paged_problem(torch.zeros(300, 8, 1, 256, dtype=torch.bfloat16),
                                           pool, table, True, None, None, None, 32000)
    schedule = FORWARD.default_schedule("sm_90", FORWARD.paged_lookup(problem, problem))
    for query, cu in ((torch.zeros(300, 8, 4, 256, dtype=torch.bfloat16), None),
                      (torch.zeros(600, 8, 256, dtype=torch.bfloat16),
                       torch.arange(0, 601, 2, dtype=torch.int32))):
        with pytest.raises(UnsupportedProblemError, match="copies each entry's first 2000"):
            route.ragged_forward(forward, problem, schedule, query, pool, pool, table, used,
                                 longest, None, longest_q=2,
                                 queries=None if cu is None else torch.stack((cu[:-1], cu[1:])))


def test_the_queries_reach_is_checked_whatever_the_bucket():
    """A bucket may count fewer sequences than the call (``ragged_problem`` keeps it inside the
    index range), so the paged routes check q's own reach: 300000 packed queries of 64 heads
    (2.5e9 elements) or the same as a [B, H, S, D] batch are refused, a tenth of them not."""
    from tiledattention.entry_points._paged import check_call

    pool = torch.empty(4, 16, 8, 128, device="meta")
    for q in (torch.empty(300000, 64, 128, device="meta"),
              torch.empty(100, 64, 3000, 128, device="meta")):
        with pytest.raises(UnsupportedProblemError, match="q must lie within"):
            check_call(None, q, pool, pool)
    check_call(None, torch.empty(30000, 64, 128, device="meta"), pool, pool)


def test_the_packed_paged_op_gives_the_query_shape_under_fake_tensors():
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tiledattention.entry_points import _paged_mixed

    with FakeTensorMode():
        q = torch.empty(45, 8, 64, dtype=torch.bfloat16)
        k = torch.empty(20, 16, 2, 64, dtype=torch.bfloat16)
        cu = torch.empty(4, dtype=torch.int32)
        table = torch.empty(3, 5, dtype=torch.int32)
        used = torch.empty(3, dtype=torch.int32)
        out = torch.ops.tiledattention.paged_varlen(q, k, k, cu, table, used, 30, 80, True,
                                                    None, -1, -1)
        assert out.shape == q.shape and out.dtype == q.dtype
    assert _paged_mixed.PACKED_OP_NAME == "tiledattention::paged_varlen"


def test_explain_names_a_paged_calls_family_or_its_gather(capsys):
    from tuner import cli

    fields = ("heads_q=32,heads_kv=8,head_dim=128,dtype=bf16,causal=true,bottom_right=true,"
              "ragged=true,page_size=64")
    assert cli.main(["explain", "--device", "sm_90", "--problem",
                     f"batch=64,seqlen_q=1,seqlen_k=32768,{fields}"]) == 0
    assert "family decode" in capsys.readouterr().out
    assert cli.main(["explain", "--device", "sm_90", "--problem",
                     f"batch=4,seqlen_q=512,seqlen_k=16384,{fields}"]) == 0
    out = capsys.readouterr().out
    assert "family forward" in out and "reads the pages in place where" in out
    assert "copies first the pages whose keys its queries read" in out
    assert "tile_n <= 64" in out and "paged" not in out.split("tile_n <=")[1]


def test_a_paged_row_answers_only_for_its_own_longest_cache():
    stored = _paged(batch=32, seqlen_k=16384)
    schedule = DecodeSchedule(splits=12)
    why = DECODE.transfer_refusal(stored, schedule, 1.0, 2.0, _paged(batch=32, seqlen_k=4096))
    assert why and "its own longest cache" in why
    assert DECODE.transfer_refusal(stored, schedule, 1.0, 2.0, stored) is None


def test_query_key_and_value_are_checked_together():
    from tiledattention.core._problem import check_attention_tensors

    q = torch.randn(2, 4, 1, 64, dtype=torch.bfloat16)
    k = torch.randn(6, 16, 2, 64, dtype=torch.bfloat16)
    names, dims = ("q", "k_pages", "v_pages"), ("[B, H_q, S_q, D]", "[pages, page_size, H, D]")
    check_attention_tensors(names, q, k, k.clone(), *dims)
    with pytest.raises(tiledattention.InputTypeError, match="q, k_pages and v_pages must have "
                                                            "one dtype"):
        check_attention_tensors(names, q, k, k.half(), *dims)
    with pytest.raises(tiledattention.InputValueError, match=r"v_pages must have the shape of "
                                                             r"k_pages \(6, 16, 2, 64\)"):
        check_attention_tensors(names, q, k, k[:5], *dims)
    with pytest.raises(tiledattention.InputValueError, match="k_pages must have 4 dims"):
        check_attention_tensors(names, q, k[0], k, *dims)


# -- pages the kernels cannot read in place -----------------------------------------------------
@pytest.mark.parametrize("page", [1, 8, 12, 100])
def test_regrouped_pages_hold_each_sequences_keys_in_order(page):
    """Pages of a size that is not a multiple of 16 (SGLang's 1, vLLM's 8) are copied into
    pages the kernels read whole (256 keys, or a multiple of the page and of 16), each
    sequence's first ``longest`` keys end to end in pages of its own, the table naming them."""
    from tiledattention.entry_points._regroup import (regroup_pages, regrouped,
                                                      regrouped_page_size)

    size = regrouped_page_size(page)
    assert size % 16 == 0 and size % page == 0 and regrouped(torch.empty(1, page, 1, 1))
    assert size == {1: 256, 8: 256, 12: 768, 100: 400}[page]
    assert not regrouped(torch.empty(1, 48, 1, 1)) and regrouped_page_size(48) == 48
    gen = torch.Generator().manual_seed(page)
    lengths, longest = [1, 300, 777, 0], 777
    need = [-(-n // page) for n in lengths]
    pool = torch.randn(sum(need) + 2, page, 2, 8, generator=gen).to(torch.bfloat16)
    table = torch.full((4, max(need) + 3), -1, dtype=torch.int32)
    order = torch.randperm(pool.shape[0], generator=gen)
    used = 0
    for b, n in enumerate(need):
        table[b, :n] = order[used:used + n].int()
        used += n
    k, v, regrouped_table = regroup_pages(pool, pool * 2, table, longest)
    groups = -(-(-(-longest // page) * page) // size)
    assert k.shape == (4 * groups, size, 2, 8) and v.dtype == pool.dtype
    assert torch.equal(regrouped_table, torch.arange(4 * groups, dtype=torch.int32).view(4, -1))
    for b, n in enumerate(lengths):
        want = torch.cat([pool[i] for i in table[b, :need[b]].tolist()] or [pool[:0, 0]])[:n]
        got = torch.cat([k[i] for i in regrouped_table[b].tolist()])[:n]
        assert torch.equal(got, want), b
        assert torch.equal(torch.cat([v[i] for i in regrouped_table[b].tolist()])[:n], want * 2)


def test_a_call_over_small_pages_runs_over_the_copy_after_its_checks(monkeypatch):
    """paged_attention, a mixed step through varlen_attn and explain_paged over pages of 8:
    the problem looked up is the copy's (pages of 256), the copy is made only after every
    check (a bad scale or an unfit copy: none made) and the kernels are handed the copy's
    pools and table."""
    from tiledattention.entry_points import _paged as route
    from tiledattention.entry_points import _paged_mixed

    copies = []

    class Copied(Exception):
        pass

    def regroup(k, v, table, longest):
        copies.append((k.shape, table.shape, longest))
        raise Copied

    fake = DeviceInfo(index=0, arch="sm_90", name="fake", sm_count=132)
    for module in (route, _paged_mixed):  # paged_attention's route and the mixed step's
        monkeypatch.setattr(module, "regroup_pages", regroup)
        monkeypatch.setattr(module, "check_device", lambda q: None)
        monkeypatch.setattr(module, "device_info", lambda index: fake)
    monkeypatch.setattr("tiledattention.core._runtime.device_info", lambda index: fake)
    q, k, v, table, used = _args(b=3, hq=4, hkv=2, d=64, pages=40, page=8, width=12)
    problem, longest = route.paged_problem(q, k, table, True, None, None, None, 90)
    assert (problem.page_size, longest) == (256, 90)
    with pytest.raises(InputValueError, match="scale"):
        tiledattention.paged_attention(q, k, v, table, used, scale=-1.0)
    assert copies == []
    with pytest.raises(Copied):
        tiledattention.paged_attention(q, k, v, table, used, max_k=90)
    assert copies == [((40, 8, 2, 64), (3, 12), 90)]
    query = torch.randn(7, 4, 64, dtype=torch.bfloat16)
    cu = torch.tensor([0, 1, 5, 7], dtype=torch.int32)
    with pytest.raises(Copied):
        tiledattention.varlen_attn(query, k, v, cu, None, 4, 96, is_causal=True,
                                   enable_gqa=True, seqused_k=used, block_table=table)
    assert copies[-1] == ((40, 8, 2, 64), (3, 12), 96)
    assert tiledattention.explain_paged(q, k, v, table, used, max_k=90).family == "decode"
    assert len(copies) == 2  # explaining copies nothing


def test_a_regrouped_copy_past_the_index_range_is_refused_before_it_is_made(monkeypatch):
    from tiledattention.entry_points import _paged as route

    monkeypatch.setattr(route, "regroup_pages", lambda *a: pytest.fail("copied"))
    q = torch.zeros(300, 8, 1, 256, dtype=torch.bfloat16)
    pool = torch.zeros(4, 8, 8, 256, dtype=torch.bfloat16)
    table = torch.zeros(300, 4000, dtype=torch.int32)
    used = torch.full((300,), 32000, dtype=torch.int32)
    with pytest.raises(UnsupportedProblemError, match="runs over a copy in pages of 256"):
        tiledattention.paged_attention(q, pool, pool, table, used)


# -- a paged batch's entries longest cache first -------------------------------------------------
def test_the_longest_first_order_applies_to_paged_batches_of_several_entries_only():
    """``normalise`` keeps ``longest_first`` only for a paged batch of more than one entry not
    walked flat, and only then does the split kernel read an order (``ORDERED``) and a plan
    rank the entries each call."""
    ordered = DecodeSchedule(tile_n=128, occupancy=2, longest_first=True)
    paged = _paged(batch=40, seqlen_k=2000, page_size=128)
    assert normalise(paged, ordered).longest_first
    assert split_constants(paged, ordered)["ORDERED"]
    assert launches(paged, ordered, None).order_entries == 40
    for other in (_paged(batch=1, page_size=128), _paged(page_size=0, ragged=False),
                  _paged(page_size=0)):
        assert not normalise(other, ordered).longest_first, other.describe()
        assert not split_constants(other, ordered)["ORDERED"], other.describe()
        assert launches(other, ordered, None).order_entries == 0
    flat = _paged(batch=48, seqlen_k=4000, page_size=16)
    assert not normalise(flat, ordered.replace(flat=True, tile_n=64)).longest_first
    assert not split_constants(paged, ordered.replace(longest_first=False))["ORDERED"]


@pytest.mark.parametrize("splits", [1, 4])
def test_an_ordered_call_ranks_its_entries_first_into_the_scratch_after_the_lses(monkeypatch,
                                                                                 splits):
    """The order kernel runs first, on the call's key counts, into int32 entries cut from the
    float32 scratch after the log-sum-exps (alone where one split has none); the split kernel
    follows as its programmatic dependent and reads that order."""
    from tiledattention.kernels.decode import _launch

    problem = _paged(batch=40, seqlen_k=2000, page_size=128)
    plan = _launch.launches(problem, DecodeSchedule(splits=splits, tile_n=128, occupancy=2,
                                                    longest_first=True), None)
    rows, m = 40 * 8, 16
    merged = rows * splits * m if splits > 1 else 0
    assert _launch.partial_shapes(plan)[1] == (merged + 40,)
    scratch = _launch.new_scratch(plan, lambda shape: torch.zeros(shape))
    opart, lse, order = scratch
    assert order.dtype == torch.int32 and order.shape == (40,)
    assert (lse is None) is (splits == 1)
    if splits > 1:
        assert lse.shape == (rows, splits, m) and opart.shape == (rows, splits, m, 128)
        assert order.data_ptr() == lse.data_ptr() + 4 * merged
    launched = []
    monkeypatch.setattr(_launch._aot, "launch", lambda stream, grid, kernel, args, **options:
                        launched.append((grid, kernel, args, options)))
    q = torch.zeros(40, 32, 1, 128, dtype=torch.bfloat16)
    pool = torch.zeros(700, 128, 8, 128, dtype=torch.bfloat16)
    lengths = torch.zeros(40, dtype=torch.int32)
    table = torch.zeros(40, 16, dtype=torch.int32)
    _launch.launch(None, plan, q, pool, pool, q.clone(), 0, scratch, ranges=lengths, pages=table)
    (grid, kernel, args, options), split = launched[:2]
    assert kernel is _launch.order_kernel() and grid == (1, 1, 1)
    assert args[0] is lengths and args[1] is order and args[2] == _launch.ORDER_CHUNK
    assert split[1] is plan.split and split[3] == {"programmatic_dependent_launch": True}
    named = dict(zip(_launch.SPLIT_PARAMETERS.names, split[2]))
    assert named["Order"] is order and named["Ranges"] is lengths
    assert len(launched) == (3 if splits > 1 else 2)  # and the merge


def test_a_call_given_its_order_launches_the_split_kernel_alone(monkeypatch):
    """An ordered plan given the caller's order (``PagedOrder``'s entries) ranks nothing: the
    split kernel reads that order, still as a programmatic dependent of the kernel before it
    (it waits for that one before reading anything); a plan that is not ordered passes no
    order, whatever it is given, and starts only after the kernel before it."""
    from tiledattention.kernels.decode import _launch

    problem = _paged(batch=40, seqlen_k=2000, page_size=128)
    q = torch.zeros(40, 32, 1, 128, dtype=torch.bfloat16)
    pool = torch.zeros(700, 128, 8, 128, dtype=torch.bfloat16)
    lengths, table = torch.zeros(40, dtype=torch.int32), torch.zeros(40, 16, dtype=torch.int32)
    given = torch.arange(40, dtype=torch.int32)
    for ordered in (True, False):
        plan = _launch.launches(problem, DecodeSchedule(tile_n=128, occupancy=2,
                                                        longest_first=ordered), None)
        scratch = _launch.new_scratch(plan, lambda shape: torch.zeros(shape))
        launched = []
        monkeypatch.setattr(_launch._aot, "launch", lambda stream, grid, kernel, args, **o:
                            launched.append((kernel, args, o)))
        _launch.launch(None, plan, q, pool, pool, q.clone(), 0, scratch, ranges=lengths,
                       pages=table, order=given)
        (kernel, args, options), = launched
        named = dict(zip(_launch.SPLIT_PARAMETERS.names, args))
        assert kernel is plan.split
        assert options["programmatic_dependent_launch"] is ordered
        assert named["Order"] is (given if ordered else _launch.UNUSED)


def test_paged_batches_just_past_a_wave_run_longest_first_by_default():
    """Hopper: a paged batch whose one split at two CTAs an SM passes one wave (264 CTAs on
    132 SMs) by at most one more runs its entries longest first; exactly one wave, six waves,
    a window, one entry, a contiguous cache or another architecture keep the grid order."""
    def default(arch="sm_90", **fields):
        return DECODE.default_schedule(arch, _paged(**fields))

    for batch, heads_q, heads_kv, keys, page in ((40, 32, 8, 2000, 128), (100, 28, 4, 1500, 256),
                                                 (56, 32, 8, 3000, 64), (66, 32, 8, 3000, 32)):
        s = default(batch=batch, heads_q=heads_q, heads_kv=heads_kv, seqlen_k=keys,
                    page_size=page)
        assert s.longest_first and s.splits == 1 and s.occupancy == 2, (batch, s)
    for fields in (dict(batch=33, heads_q=40, heads_kv=8, seqlen_k=7000, page_size=128),
                   dict(batch=67, heads_q=32, heads_kv=8, seqlen_k=3000, page_size=128),
                   dict(batch=200, seqlen_k=2500, page_size=128),
                   dict(batch=40, seqlen_k=2000, page_size=0),
                   dict(batch=40, seqlen_k=2000, page_size=128, window_left=255)):
        assert not default(**fields).longest_first, fields
    assert not default("sm_100", batch=40, seqlen_k=2000, page_size=128).longest_first


@pytest.mark.parametrize("arch", ARCHS)
def test_a_longest_first_schedule_compiles_with_its_order_kernel(arch):
    """The split kernel reading the order, with the order kernel beside it (and the merge
    where it splits)."""
    problem = _paged(batch=40, seqlen_k=2000, page_size=128)
    for splits, cubins in ((1, 2), (4, 3)):
        result = compile_decode(problem, DecodeSchedule(splits=splits, tile_n=128,
                                                        longest_first=True), arch)
        assert [c[:4] for c in result.cubins] == [b"\x7fELF"] * cubins
        assert "decode_order" in result.resources()[-1].symbol


def test_the_ordered_split_kernel_waits_for_its_order_on_sm_90(tmp_path):
    """A longest-first plan's split kernel starts as the order kernel's programmatic dependent:
    its sm_90 code waits for that kernel's memory (``griddepcontrol.wait``, SASS ``ACQBULK``)
    before it reads the order; the plain split kernel (one split: no merge) never waits."""
    from .test_backward_atomic import _sass

    problem = _paged(batch=40, seqlen_k=2000, page_size=128)
    schedule = DecodeSchedule(tile_n=128, occupancy=2, k_latency=4, v_latency=2)
    sass = {ordered: _sass(compile_decode(problem, schedule.replace(longest_first=ordered),
                                          "sm_90").cubin, tmp_path / f"{ordered}.cubin")
            for ordered in (False, True)}
    assert "ACQBULK" in sass[True] and "ACQBULK" not in sass[False]
