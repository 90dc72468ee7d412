"""Attention over a paged K/V cache on the GPU (``tiledattention.paged_attention`` and
``varlen_attn(..., block_table=, seqused_k=)``) against a float32 reference over each entry's
cache gathered from its pages.

Pages are assigned in a shuffled, non-contiguous order; every page no entry uses, every slot
past an entry's length in its last page and every block-table slot past its pages hold
garbage (NaN pages, -1 page ids), so a read outside an entry's keys turns its output into NaN
or faults.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import tiledattention

from ._reference import attend, rel_l2

pytestmark = pytest.mark.gpu

TOL = {torch.bfloat16: 1e-2, torch.float16: 5e-3}


def paged_cache(lengths, page_size, hkv, d, dtype=torch.bfloat16, seed=0, spare_pages=3):
    """(k_pages, v_pages, block_table, seqused_k, per-entry contiguous (k, v)) with shuffled
    pages, NaN in unused pages and past each length, -1 in unused block-table slots."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    need = [-(-n // page_size) for n in lengths]
    total = sum(need) + spare_pages
    order = torch.randperm(total, generator=gen, device="cuda")
    k_pages = torch.full((total, page_size, hkv, d), float("nan"), dtype=dtype, device="cuda")
    v_pages = torch.full_like(k_pages, float("nan"))
    width = max(max(need), 1) + 2
    table = torch.full((len(lengths), width), -1, dtype=torch.int32, device="cuda")
    caches, used = [], 0
    for b, (n, pages) in enumerate(zip(lengths, need)):
        k = torch.randn(n, hkv, d, generator=gen, device="cuda", dtype=dtype)
        v = torch.randn(n, hkv, d, generator=gen, device="cuda", dtype=dtype)
        ids = order[used:used + pages]
        used += pages
        table[b, :pages] = ids.int()
        for i in range(pages):
            rows = slice(i * page_size, min((i + 1) * page_size, n))
            k_pages[ids[i], : rows.stop - rows.start] = k[rows]
            v_pages[ids[i], : rows.stop - rows.start] = v[rows]
        caches.append((k, v))
    seqused = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    return k_pages, v_pages, table, seqused, caches


def reference(q, caches, causal=True, window=None, scale=None):
    """float32 per entry: q [B, H_q, S_q, D] the last S_q positions of each cache."""
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    for b, (k, v) in enumerate(caches):
        if k.shape[0]:
            out[b] = attend(q[b], k.transpose(0, 1), v.transpose(0, 1), causal=causal,
                            bottom_right=True, window=window, softcap=None, sinks=None,
                            scale=scale)
    return out


def run_and_check(lengths, page_size, hq=32, hkv=8, d=128, sq=1, dtype=torch.bfloat16,
                  causal=True, window=None, seed=0):
    k_pages, v_pages, table, seqused, caches = paged_cache(lengths, page_size, hkv, d, dtype,
                                                           seed)
    gen = torch.Generator(device="cuda").manual_seed(seed + 1)
    q = torch.randn(len(lengths), hq, sq, d, generator=gen, device="cuda", dtype=dtype)
    with torch.no_grad():
        out = tiledattention.paged_attention(q, k_pages, v_pages, table, seqused,
                                             causal=causal, window=window,
                                             max_k=max(lengths))
    want = reference(q, caches, causal, window)
    assert not out.isnan().any(), "a read outside an entry's keys"
    for b in range(len(lengths)):
        assert rel_l2(out[b], want[b]) < TOL[dtype], (b, lengths[b])
    return out, (q, k_pages, v_pages, table, seqused, caches)


@pytest.mark.parametrize("page_size", [16, 64, 256])
def test_decode_over_pages(page_size):
    run_and_check([1, 17, 1000, 64, 3000, 255, 256, 257], page_size)


def test_lengths_from_1_to_128k_in_one_batch():
    run_and_check([131072, 1, 5000, 100, 65536, 7], 64, hq=8, hkv=2)


@pytest.mark.parametrize("hq, hkv, d, dtype", [(8, 1, 128, torch.bfloat16),
                                               (16, 16, 64, torch.float16),
                                               (12, 4, 96, torch.bfloat16)])
def test_heads_head_dims_and_dtypes(hq, hkv, d, dtype):
    run_and_check([33, 700, 1], 32, hq=hq, hkv=hkv, d=d, dtype=dtype)


@pytest.mark.parametrize("sq", [4, 100])
def test_chunked_prefill_and_speculative_steps(sq):
    run_and_check([sq, 300, 1025, 4000], 64, sq=sq, hq=16, hkv=4)


@pytest.mark.parametrize("page_size", [16, 64, 128, 256, 384])
def test_chunked_prefill_in_place_or_on_gathered_pages(page_size, monkeypatch):
    """512-row chunks on the forward's ragged kernel: reading the pages in place where a page
    holds a whole key tile (128 keys or more under the defaults; 384 keys: tiles of 128), or
    half of one at 2048 query rows a K/V group or fewer (pages of 64: not the ungrouped H 8/1
    call's 4096), else on the gathered pages; one entry has fewer keys than queries (its
    first rows see none: zeros). Odd lengths end inside pages whose rest is NaN."""
    from tiledattention.entry_points import _paged

    assert tiledattention.explain_paged(
        torch.empty(4, 16, 512, 128, device="cuda", dtype=torch.bfloat16),
        *paged_cache([600] * 4, page_size, 4, 128)[:4]).family == "forward"
    real, gathered = _paged.copy_read_pages, []

    def counting(*args):
        gathered.append(args[0].shape[1])
        return real(*args)

    monkeypatch.setattr(_paged, "copy_read_pages", counting)
    run_and_check([700, 2001, 300, 4097], page_size, sq=512, hq=16, hkv=4)
    run_and_check([700, 2000, 300, 4096], page_size, sq=512, hq=16, hkv=4, window=(255, 0))
    run_and_check([1025, 513], page_size, sq=512, hq=8, hkv=1, causal=False)
    # a window without the causal mask aligns bottom-right too (the gathered pages took it
    # top-left until the conformance test's draw found it)
    run_and_check([700, 2001, 300, 4097], page_size, sq=512, hq=16, hkv=4, causal=False,
                  window=(100, 37))
    assert len(gathered) == {16: 4, 64: 1}.get(page_size, 0), gathered


@pytest.mark.parametrize("page_size, hkv, d, dtype", [
    (16, 8, 128, torch.bfloat16), (32, 3, 80, torch.float16), (48, 1, 256, torch.bfloat16),
    (64, 4, 64, torch.float8_e4m3fn), (16, 64, 256, torch.float16)])
@pytest.mark.parametrize("packed", [False, True])
def test_the_page_copy_copies_the_read_pages_exactly(page_size, hkv, d, dtype, packed):
    """The copy a long query run reads (``_page_copy.copy_read_pages``) against its torch
    reference, slot by slot: random lengths (odd, past the table, zero), sequences without
    queries, -1 and out-of-pool table slots past the keys, a pool that is a strided view
    (K and V interleaved in one tensor), head dims and head counts padded in the tiles; an FP8
    pool copied as it is and widened into bf16 by factors of each entry (or one row) and
    head."""
    from tiledattention.entry_points._page_copy import copy_read_pages

    from ..paged_kernels import read_pages_copy

    gen = torch.Generator(device="cuda").manual_seed(page_size + hkv + d)
    sequences, slots, pages = 37, 9, 200
    both = torch.randn(pages, 2, page_size, hkv, d, generator=gen, device="cuda").to(dtype)
    k_pages, v_pages = both[:, 0], both[:, 1]  # strided pools
    table = torch.randint(0, pages, (sequences, slots), generator=gen, device="cuda",
                          dtype=torch.int32)
    keys = torch.randint(0, slots * page_size + 50, (sequences,), generator=gen, device="cuda")
    for b in range(0, sequences, 5):  # slots past an entry's pages name no page
        table[b, -(-int(keys[b]) // page_size):] = -1 if b % 2 else pages + 7
    starts = torch.randint(0, 4, (sequences,), generator=gen, device="cuda")
    counts = torch.randint(0, 3, (sequences,), generator=gen, device="cuda")  # 0: no queries
    longest = slots * page_size - 5
    width = -(-longest // page_size)
    stride = width * page_size if packed else 0
    ranges = torch.stack((starts, starts + counts, torch.arange(sequences, device="cuda")
                          * stride, torch.arange(sequences, device="cuda") * stride
                          + keys.clamp(max=width * page_size))).to(torch.int32)
    widen = [()]
    if dtype == torch.float8_e4m3fn:  # widened into bf16 by factors of each entry and head
        widen.append(tuple(torch.rand(1 if packed else sequences, hkv, generator=gen,
                                      device="cuda") * 4 + 0.25 for _ in range(2)))
    for factors in widen:
        out_dtype = torch.bfloat16 if factors else dtype
        got = copy_read_pages(k_pages, v_pages, table, ranges, longest, packed, factors,
                              out_dtype)
        torch.cuda.synchronize()
        want = read_pages_copy(k_pages, v_pages, table, ranges, longest, packed, factors,
                               out_dtype)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == out_dtype
            g, w = (x.transpose(1, 2).reshape(sequences, width, page_size, hkv, d).float()
                    for x in (g, w))
            read = ~w.isnan().flatten(2).all(2)  # [B, width]: the slots the copy writes
            assert read.any() and (~read).any()
            assert torch.equal(g[read], w[read])


@pytest.mark.parametrize("sequences", [1, 37, 300])
@pytest.mark.parametrize("offsets", [torch.int32, torch.int64])
@pytest.mark.parametrize("apart", [False, True])
def test_a_mixed_steps_tables_match_their_reference(sequences, offsets, apart):
    """The mixed step's index tables (``_mixed_tables.mixed_tables``, one kernel of CTAs of
    128 sequences) against their torch reference: query counts 0-5 and longer, spare rows
    before and after, key counts past the limit, both offset dtypes."""
    from tiledattention.entry_points._mixed_tables import mixed_tables

    from ..paged_kernels import mixed_tables_reference

    gen = torch.Generator(device="cuda").manual_seed(sequences)
    counts = torch.randint(0, 6, (sequences,), generator=gen, device="cuda")
    counts[::7] = 40
    cu = torch.cat((torch.zeros(1, device="cuda", dtype=torch.long), counts.cumsum(0))) + 3
    tokens = int(cu[-1]) + 2
    used = torch.randint(0, 5000, (sequences,), generator=gen, device="cuda",
                         dtype=torch.int32)
    got = mixed_tables(cu.to(offsets), used, tokens, 4096, 4000, apart)
    want = mixed_tables_reference(cu, used, tokens, 4096, 4000, apart)
    for g, w in zip(got, want):
        assert (g is None) == (w is None)
        if g is not None:
            assert g.dtype == w.dtype and torch.equal(g, w)


def test_the_forward_reads_pages_of_64_in_place_with_tiles_of_64():
    """The in-place kernel itself at the smallest tile, fp16, grouped heads, called directly
    (the lookup's 128-key tiles read pages of 64 as two parts a tile)."""
    import dataclasses

    from tiledattention import FORWARD
    from tiledattention.entry_points._paged import paged_problem, ragged_forward

    lengths = [1000, 64, 2049]
    k_pages, v_pages, table, seqused, caches = paged_cache(lengths, 64, 2, 64, torch.float16, 3)
    q = torch.randn(3, 8, 256, 64, device="cuda", dtype=torch.float16)
    problem, longest = paged_problem(q, k_pages, table, True, None, None, None, max(lengths))
    schedule = dataclasses.replace(FORWARD.default_schedule("sm_90", problem), tile_m=64,
                                   tile_n=64)
    assert FORWARD.reads_pages_with(problem, schedule)
    with torch.no_grad():
        out = ragged_forward(FORWARD, problem, schedule, q, k_pages, v_pages, table, seqused,
                             longest, None)
    want = reference(q, caches)
    assert not out.isnan().any()
    for b in range(len(lengths)):
        assert rel_l2(out[b], want[b]) < TOL[q.dtype], b


@pytest.mark.parametrize("page_size,hq,hkv,d,dtype", [
    (64, 16, 4, 128, torch.bfloat16), (32, 8, 2, 80, torch.float16),
    (16, 8, 8, 64, torch.bfloat16), (48, 12, 4, 96, torch.bfloat16)])
@pytest.mark.parametrize("mask", ["causal", "window", "none"])
def test_a_key_tile_over_smaller_pages_walks_as_parts_of_a_page(page_size, hq, hkv, d, dtype,
                                                                mask):
    """Pages smaller than a key tile read in place, a tile as parts of a page's keys: odd
    lengths (NaN past them), an entry of fewer keys than queries, D 80, 96."""
    from tiledattention import FORWARD
    from tiledattention.entry_points._paged import paged_problem, ragged_forward

    lengths = [700, 2001, 150, 4097]
    k_pages, v_pages, table, seqused, caches = paged_cache(lengths, page_size, hkv, d, dtype, 5)
    q = torch.randn(len(lengths), hq, 256, d, device="cuda", dtype=dtype)
    causal, window = {"causal": (True, None), "window": (True, (300, 0)),
                      "none": (False, None)}[mask]
    problem, longest = paged_problem(q, k_pages, table, causal, window, None, None,
                                     max(lengths))
    schedule = FORWARD.default_schedule("sm_90", problem)
    assert schedule.tile_n > page_size & -page_size  # parts of a page's keys
    with torch.no_grad():
        out = ragged_forward(FORWARD, problem, schedule, q, k_pages, v_pages, table, seqused,
                             longest, None, layout=(True, 0, table.shape[1] * page_size))
    want = reference(q, caches, causal, window)
    assert not out.isnan().any(), "a read outside an entry's keys"
    for b in range(len(lengths)):
        assert rel_l2(out[b], want[b]) < TOL[dtype], (b, lengths[b])


def test_without_a_mask_and_with_a_window():
    run_and_check([50, 900, 2049], 64, sq=3, causal=False)
    run_and_check([50, 900, 2049], 128, sq=3, window=(255, 0))


@pytest.mark.parametrize("lengths,page_size,sq", [([5, 999, 64], 64, 2),
                                                  ([300, 999, 128], 64, 80),
                                                  ([300, 999, 128], 256, 80)])
def test_varlen_attn_with_a_block_table_is_paged_attention(lengths, page_size, sq):
    """One query count: the paged call's output, packed (a long run writes it so)."""
    out, (q, k_pages, v_pages, table, seqused, _) = run_and_check(lengths, page_size, sq=sq)
    packed = q.transpose(1, 2).reshape(-1, q.shape[1], q.shape[3])  # [N * S_q, H, D]
    cu_q = torch.arange(0, packed.shape[0] + 1, sq, dtype=torch.int32, device="cuda")
    got = tiledattention.varlen_attn(packed, k_pages, v_pages, cu_q, None, sq, max(lengths),
                                     is_causal=True, enable_gqa=True, seqused_k=seqused,
                                     block_table=table)
    assert torch.equal(got, out.transpose(1, 2).reshape(packed.shape))
    assert got.is_contiguous()


def check_mixed(out, query, counts, caches, *, is_causal=True, window=(-1, -1)):
    """Each sequence's rows of a mixed step's output (``counts[b]`` packed queries, the last
    positions of ``caches[b]``'s keys) against the float32 reference; rows past the last
    sequence zeros."""
    d, start = query.shape[2], 0
    causal = is_causal is not False or window[1] == 0
    for b, ((k, v), n) in enumerate(zip(caches, counts)):
        rows = slice(start, start + n)
        start += n
        assert not out[rows].isnan().any(), ("a read outside a sequence's keys", b)
        if not n:
            continue
        want = torch.zeros(n, query.shape[1], d, device="cuda")
        if k.shape[0]:
            want = attend(query[rows].transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                          causal=causal, bottom_right=True,
                          window=None if window == (-1, -1) else window, softcap=None,
                          sinks=None, scale=d ** -0.5).transpose(0, 1)
        assert rel_l2(out[rows], want) < TOL[query.dtype], (b, n, k.shape[0])
    assert torch.equal(out[start:], torch.zeros_like(out[start:])), "rows of no sequence"


def mixed_step(counts, lengths, page_size, hq=32, hkv=8, d=128, dtype=torch.bfloat16,
               is_causal=True, window=(-1, -1), spare=3, seed=0):
    """A serving engine's mixed step through ``varlen_attn``: sequence ``b`` has
    ``counts[b]`` packed queries (0 included), the last positions of its ``lengths[b]`` keys
    in shuffled pages (NaN around them), and ``spare`` rows of no sequence after the last;
    the output's memory poisoned with NaN before the call (:func:`check_mixed`). Returns the
    call's arguments, keywords, output and per-sequence caches."""
    k_pages, v_pages, table, seqused, caches = paged_cache(lengths, page_size, hkv, d, dtype,
                                                           seed)
    gen = torch.Generator(device="cuda").manual_seed(seed + 1)
    query = torch.randn(sum(counts) + spare, hq, d, generator=gen, device="cuda", dtype=dtype)
    cu = torch.tensor([0] + list(itertools.accumulate(counts)), dtype=torch.int32,
                      device="cuda")
    args = (query, k_pages, v_pages, cu, None, max(counts), max(lengths))
    kwargs = dict(is_causal=is_causal, window_size=window, enable_gqa=hq != hkv,
                  seqused_k=seqused, block_table=table)
    poison = torch.full_like(query, float("nan"))  # the allocator hands its block out next
    del poison
    with torch.no_grad():
        out = tiledattention.varlen_attn(*args, **kwargs)
    check_mixed(out, query, counts, caches, is_causal=is_causal, window=window)
    return args, kwargs, out, caches


@pytest.mark.parametrize("page_size", [16, 64, 256])
def test_a_mixed_step_of_prefill_chunks_and_decode_tokens(page_size, monkeypatch):
    """Prefill chunks beside decode tokens, a sequence with no queries and one with more
    queries than keys (its first rows see none: zeros), over pages read in place (256; 64 as
    two parts, but the H 28/4 call's 3584 rows) or gathered into one packed copy (16)."""
    from tiledattention.entry_points import _paged

    counts = [1, 300, 1, 0, 77, 1, 512, 40]
    lengths = [900, 300, 4097, 33, 1500, 1, 2049, 20]
    real, gathered = _paged.copy_read_pages, []

    def counting(*args):
        gathered.append(args[0].shape[1])
        return real(*args)

    monkeypatch.setattr(_paged, "copy_read_pages", counting)
    args, kwargs, _, _ = mixed_step(counts, lengths, page_size)
    assert tiledattention.explain_varlen(*args, **kwargs).family == "forward"
    mixed_step(counts, lengths, page_size, window=(255, 0))
    mixed_step(counts, lengths, page_size, hq=28, hkv=4, d=64, dtype=torch.float16,
               is_causal=False, seed=3)
    mixed_step(counts, lengths, page_size, hq=8, hkv=8, d=96, is_causal=False,
               window=(100, 37), seed=4)
    assert len(gathered) == {16: 4, 64: 1}.get(page_size, 0), gathered


@pytest.mark.parametrize("page_size", [16, 256])
def test_a_mixed_step_of_many_chunks_walks_its_work_table(page_size, monkeypatch):
    """150 chunks of 30-97 queries beside 150 decode tokens (H 28/4: groups of 7, unpacked):
    the forward walks a work table of the chunks' tiles (the bound counts the decode tokens
    too, whose items stay empty), and the pages those chunks read, shared out over every
    copying CTA one at a time, land where the forward reads them."""
    from tiledattention.kernels.forward import _launch

    launches = []
    real = _launch.ragged_launch

    def recording(*args, **kwargs):
        launches.append(real(*args, **kwargs))
        return launches[-1]

    monkeypatch.setattr(_launch, "ragged_launch", recording)
    counts = [30 + (b * 37) % 68 if b % 2 else 1 for b in range(300)]
    lengths = [max(n, 40 + (b * 911) % 9000) for b, n in enumerate(counts)]
    mixed_step(counts, lengths, page_size, hq=28, hkv=4, seed=5)
    assert [p.items > 0 for p in launches] == [True], [(p.grid, p.items) for p in launches]


def test_a_mixed_step_over_an_fp8_cache():
    """An FP8 cache under a mixed step: its pages gathered and widened (unit descales, as
    ``varlen_attn`` takes none), against the reference over the cache's e4m3 values."""
    counts, lengths = [1, 100, 0, 37, 1], [700, 100, 5, 2000, 64]
    k_pages, v_pages, table, seqused, caches = paged_cache(lengths, 64, 4, 128, seed=11)
    fp8 = torch.float8_e4m3fn
    k8, v8 = (x.to(fp8) for x in (k_pages, v_pages))
    caches = [tuple(x.to(fp8).to(torch.bfloat16) for x in c) for c in caches]
    query = torch.randn(sum(counts) + 2, 16, 128, device="cuda", dtype=torch.bfloat16)
    cu = torch.tensor([0] + list(itertools.accumulate(counts)), dtype=torch.int32,
                      device="cuda")
    with torch.no_grad():
        out = tiledattention.varlen_attn(query, k8, v8, cu, None, max(counts), max(lengths),
                                         is_causal=True, enable_gqa=True, seqused_k=seqused,
                                         block_table=table)
    check_mixed(out, query, counts, caches)


def test_a_mixed_step_compiles_and_replays_in_a_cuda_graph():
    """The mixed step under ``torch.compile`` (the ``paged_varlen`` op) equals eager bit for
    bit; captured in a CUDA graph it replays with new query counts (at most the captured
    ``max_q`` each, within the same tokens) and cache lengths, each replay against the
    reference."""
    counts, lengths = [1, 200, 1, 64], [3100, 3100, 3100, 3100]
    args, kwargs, out, caches = mixed_step(counts, lengths, 64, hq=16, hkv=4, seed=7)
    fn = torch.compile(lambda *a: tiledattention.varlen_attn(*a, **kwargs), fullgraph=True)
    with torch.no_grad():
        assert torch.equal(fn(*args), out)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = tiledattention.varlen_attn(*args, **kwargs)
    query, cu, seqused = args[0], args[3], kwargs["seqused_k"]
    for new_counts, new_lengths in (([100, 1, 164, 1], [101, 2000, 3000, 9]),
                                    ([1, 1, 1, 200], [5, 6, 7, 263]),
                                    ([0, 0, 200, 66], [0, 0, 200, 3100])):
        cu.copy_(torch.tensor([0] + list(itertools.accumulate(new_counts))))
        seqused.copy_(torch.tensor(new_lengths))
        query.normal_()
        graph.replay()
        now = [(k[:n], v[:n]) for (k, v), n in zip(caches, new_lengths)]
        check_mixed(captured, query, new_counts, now)


def test_compiled_call_matches_eager():
    out, (q, k_pages, v_pages, table, seqused, _) = run_and_check([5, 999, 64], 64)
    fn = torch.compile(lambda *a: tiledattention.paged_attention(*a, max_k=999), fullgraph=True)
    with torch.no_grad():
        assert torch.equal(fn(q, k_pages, v_pages, table, seqused), out)


def captured_step(q, k_pages, v_pages, table, seqused, max_k):
    """A paged decode step captured in a CUDA graph after two warm calls (look up, keep the
    plan): ``(graph, out)``, ``out`` what each replay writes. Call under ``torch.no_grad()``."""
    for _ in range(2):
        tiledattention.paged_attention(q, k_pages, v_pages, table, seqused, max_k=max_k)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = tiledattention.paged_attention(q, k_pages, v_pages, table, seqused, max_k=max_k)
    return graph, out


def test_a_cuda_graph_replays_growing_ragged_steps():
    """Capture one decode step for a fixed batch, then replay 100 steps whose lengths grow by
    one key each (new pages joining the block table as they fill) and whose block tables
    change: every replay matches the reference over the caches as they are then."""
    page_size, hq, hkv, d, b = 16, 16, 4, 128, 6
    start = [1, 15, 200, 1000, 31, 4090]
    steps = 100
    final = [n + steps for n in start]
    k_pages, v_pages, table, seqused, caches = paged_cache(final, page_size, hkv, d, seed=5)
    full_table = table.clone()
    q = torch.randn(b, hq, 1, d, device="cuda", dtype=torch.bfloat16)
    lengths = torch.tensor(start, dtype=torch.int32, device="cuda")

    def step_table(lens):  # only the pages the lengths fill; -1 past them
        pages = (lens + page_size - 1) // page_size
        cols = torch.arange(full_table.shape[1], device="cuda")[None, :]
        return torch.where(cols < pages[:, None], full_table, -1).int()

    seqused.copy_(lengths)
    table.copy_(step_table(lengths))
    with torch.no_grad():
        graph, out = captured_step(q, k_pages, v_pages, table, seqused, 8192)
    gen = torch.Generator(device="cuda").manual_seed(9)
    for step in range(steps):
        lens = lengths + step + 1
        seqused.copy_(lens)
        table.copy_(step_table(lens))
        q.copy_(torch.randn(q.shape, generator=gen, device="cuda", dtype=q.dtype))
        graph.replay()
        now = [(k[:n], v[:n]) for (k, v), n in zip(caches, lens.tolist())]
        want = reference(q, now)
        assert not out.isnan().any(), step
        assert rel_l2(out, want) < TOL[q.dtype], step


@pytest.mark.parametrize("page_size", [1, 8, 12])
def test_pages_the_kernels_cannot_read_in_place_run_over_a_regrouped_copy(page_size):
    """Pages of 1 (SGLang's token pool), 8 and 12 keys: decode steps, chunks and a mixed step
    over a copy in pages of 256 (768 for 12), NaN around the pages and -1 in unused slots."""
    run_and_check([1, 17, 700, 255, 1500], page_size, hq=16, hkv=4)
    run_and_check([40, 300, 900], page_size, hq=8, hkv=8, d=64, sq=40, dtype=torch.float16,
                  seed=2)
    run_and_check([5, 600], page_size, hq=12, hkv=4, d=96, window=(100, 0), seed=5)
    mixed_step([1, 30, 0, 1, 7], [500, 300, 9, 1200, 7], page_size)


def test_bad_arguments_are_refused_before_a_launch():
    k_pages, v_pages, table, seqused, _ = paged_cache([10, 20], 16, 2, 64)
    q = torch.randn(2, 4, 1, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="seqused_k must be an int32 tensor"):
        tiledattention.paged_attention(q, k_pages, v_pages, table, seqused.long())
    with pytest.raises(ValueError, match="block_table must be an int32 tensor"):
        tiledattention.paged_attention(q, k_pages, v_pages, table[:1], seqused)
    with pytest.raises(ValueError, match="top_left"):
        tiledattention.paged_attention(q.expand(2, 4, 3, 64), k_pages, v_pages, table, seqused,
                                       causal="top_left")


@pytest.mark.parametrize("hq, hkv, d, dtype, sq, page", [
    (28, 4, 128, "bf16", 1, 64), (32, 1, 64, "fp16", 1, 16), (16, 4, 128, "bf16", 4, 32),
    (12, 12, 256, "bf16", 1, 256)])
def test_balanced_splits_match_the_reference_and_cover_caches_past_the_plans(hq, hkv, d, dtype,
                                                                              sq, page):
    """Balanced splits (``DecodeSchedule.balanced``: each split 1 / splits of the plan's longest
    cache) on the family's paged case (caches of the longest, 3/4, 1/2 and 1/4 of it, NaN past
    them), and with a plan whose longest cache is a fifth of the batch's: the longer caches
    take their own share (a walk that stopped at the plan's share would leave keys out)."""
    import dataclasses

    from tiledattention import DECODE, DecodeSchedule, Problem
    from tiledattention.kernels.decode._family import _case_launcher

    tol = {"bf16": 1e-2, "fp16": 5e-3}[dtype]
    problem = Problem(batch=7, heads_q=hq, heads_kv=hkv, seqlen_q=sq, seqlen_k=5003,
                      head_dim=d, dtype=dtype, causal=True, bottom_right=True, ragged=True,
                      page_size=page)
    case = DECODE.case(problem, 0)
    # and each 64-key tile folded as four slices of 16 keys, one split and three
    for splits, slices in ((3, 1), (8, 1), (1, 4), (3, 4)):
        schedule = DecodeSchedule(splits=splits, tile_n=64, balanced=True, key_slices=slices)
        assert case.error(case.launcher(schedule)) < tol, (splits, slices)
        short = dataclasses.replace(problem, seqlen_k=1000)
        run = _case_launcher(short, schedule, case.q, case.k_pages, case.v_pages, case.out, 0,
                             ranges=case.seqused, pages=case.table)
        assert case.error(run) < tol, ("a plan of 1000 keys", splits, slices)


@pytest.mark.parametrize("batch, hq, hkv, d, page", [(18, 32, 8, 128, 64), (36, 16, 4, 256, 128),
                                                     (20, 32, 8, 128, 32), (150, 8, 1, 64, 32)])
def test_a_batch_of_a_part_wave_splits_in_four_and_matches_the_reference(batch, hq, hkv, d,
                                                                          page):
    """Rows (batch x K/V heads) that fill one CTA an SM (two waves over pages of 16) but at
    most ``PAGED_PART_WAVE_MAX_SHARE`` of that: the default splits every cache in four
    (``PAGED_SPLIT_FACTOR`` at two CTAs an SM) and stays exact on odd, mixed lengths (1 to
    4096 keys, NaN past each) through ``paged_attention``."""
    from tiledattention.kernels.decode._defaults import PAGED_SPLIT_FACTOR

    lengths = [max(1, 4096 * (i * 7 % 11 + 1) // 11 - i % 3) for i in range(batch)]
    lengths[batch // 2] = 4096
    _, (q, k_pages, v_pages, table, seqused, _) = run_and_check(lengths, page, hq=hq, hkv=hkv,
                                                                  d=d)
    resolution = tiledattention.explain_paged(q, k_pages, v_pages, table, seqused,
                                              max_k=max(lengths))
    assert resolution.source == "default" and resolution.schedule.splits == PAGED_SPLIT_FACTOR


@pytest.mark.parametrize("batch, hq, hkv, d, dtype, sq", [
    (23, 32, 8, 128, torch.bfloat16, 1), (9, 28, 4, 64, torch.float16, 1),
    (17, 16, 2, 256, torch.bfloat16, 1), (70, 8, 1, 96, torch.bfloat16, 1),
    (6, 32, 8, 128, torch.float16, 3),
    # bf16 at D <= 64: the split kernel's one loop, every key tile masked (ONE_LOOP)
    (33, 32, 8, 64, torch.bfloat16, 1), (12, 16, 4, 32, torch.bfloat16, 2)])
def test_the_flat_walk_over_pages_of_16_matches_the_reference(batch, hq, hkv, d, dtype, sq):
    """Pages of 16 at two CTAs an SM walk flat by default (``DecodeSchedule.flat``: one wave
    shares the batch's key tiles evenly, rows cut by its shares merged after): exact on
    lengths at and around page and tile edges, one long cache among short ones, grouped and
    multi-query heads and a speculative step of three queries; and again with the scratch
    (partials, log-sum-exps) full of NaN before the call, so a merge that read a slot no CTA
    wrote would show."""
    from tiledattention import DECODE, Problem
    from tiledattention.kernels.decode._launch import launch, launches, new_scratch

    edges = (1, 15, 16, 17, 63, 64, 65, 129, 5000, sq, 2047)
    lengths = [max(sq, edges[i % len(edges)] + i // len(edges)) for i in range(batch)]
    out, (q, k_pages, v_pages, table, seqused, caches) = run_and_check(
        lengths, 16, hq=hq, hkv=hkv, d=d, sq=sq, dtype=dtype)
    resolution = tiledattention.explain_paged(q, k_pages, v_pages, table, seqused,
                                              max_k=max(lengths))
    assert resolution.schedule.flat, resolution.schedule.describe()
    problem = Problem(batch=batch, heads_q=hq, heads_kv=hkv, seqlen_q=sq, seqlen_k=max(lengths),
                      head_dim=d, dtype="bf16" if dtype is torch.bfloat16 else "fp16",
                      causal=True, bottom_right=True, ragged=True, page_size=16)
    plan = launches(problem, DECODE.default_schedule("sm_90", problem),
                    None, sms=torch.cuda.get_device_properties(0).multi_processor_count)
    assert plan.flat is not None
    scratch = new_scratch(plan, lambda shape: torch.full(shape, float("nan"), device="cuda"))
    again = torch.full_like(q, float("nan"))
    launch(torch.cuda.current_stream(), plan, q, k_pages, v_pages, again, 0, scratch,
           ranges=seqused, pages=table)
    assert torch.equal(again, out)


def test_the_flat_walk_over_a_large_batch_with_entries_of_no_keys():
    """300 entries (each CTA's offsets tile is 512 wide) of 1-700 keys, every seventh of no
    keys, walked flat: an empty entry's rows come out as zeros, every other entry as the
    reference's (an offset one entry off would mix two entries' keys)."""
    lengths = [0 if i % 7 == 3 else 1 + i * 37 % 700 for i in range(300)]
    k_pages, v_pages, table, seqused, caches = paged_cache(lengths, 16, 2, 128)
    gen = torch.Generator(device="cuda").manual_seed(5)
    q = torch.randn(len(lengths), 8, 1, 128, generator=gen, device="cuda", dtype=torch.bfloat16)
    resolution = tiledattention.explain_paged(q, k_pages, v_pages, table, seqused,
                                              max_k=max(lengths))
    assert resolution.schedule.flat, resolution.schedule.describe()
    out = tiledattention.paged_attention(q, k_pages, v_pages, table, seqused, max_k=max(lengths))
    want = reference(q, caches)
    for b, n in enumerate(lengths):
        if n:
            assert rel_l2(out[b], want[b]) < TOL[torch.bfloat16], (b, n)
        else:
            assert torch.equal(out[b], torch.zeros_like(out[b])), b


@pytest.mark.parametrize("sq,page_size", [(1, 16), (80, 16), (80, 128)])
def test_a_repeated_paged_call_runs_its_kept_plan_on_new_lengths_and_pages(sq, page_size,
                                                                          monkeypatch):
    """The warm path: a call repeating a signature (a decode step, a long query run) runs
    the kept plan unvalidated (a validation that raises is never reached) on this call's
    lengths and block table (new values in the same tensors)."""
    from tiledattention.entry_points import _paged

    first = [700, 93, 5000, 129]
    k_pages, v_pages, table, seqused, _ = paged_cache(first, page_size, 4, 128,
                                                      spare_pages=6400 // page_size)
    gen = torch.Generator(device="cuda").manual_seed(3)
    q = torch.randn(4, 16, sq, 128, generator=gen, device="cuda", dtype=torch.bfloat16)
    tiledattention.paged_attention(q, k_pages, v_pages, table, seqused)
    ran = tiledattention.explain_paged(q, k_pages, v_pages, table, seqused).family
    assert ran == ("decode" if sq == 1 else "forward")
    # the next step: other lengths over other pages of the same pool
    later = [1000, 4999, 87, 2048]
    spare = k_pages.shape[0] - sum(-(-n // page_size) for n in later)
    k2, v2, table2, seqused2, caches = paged_cache(later, page_size, 4, 128, seed=9,
                                                   spare_pages=spare)
    assert k2.shape == k_pages.shape and table2.shape == table.shape
    k_pages.copy_(k2), v_pages.copy_(v2), table.copy_(table2), seqused.copy_(seqused2)

    def refuse(*args, **kwargs):
        raise AssertionError("a warm call validated its arguments")

    monkeypatch.setattr(_paged, "check_paged", refuse)
    out = tiledattention.paged_attention(q, k_pages, v_pages, table, seqused)
    want = reference(q, caches)
    for b in range(4):
        assert rel_l2(out[b], want[b]) < TOL[torch.bfloat16], (b, later[b])
    with pytest.raises(AssertionError, match="validated"):  # another signature: validated
        tiledattention.paged_attention(q, k_pages, v_pages, table, seqused, scale=0.05)


def test_a_warm_signature_does_not_pass_what_validation_refuses():
    """What the warm key holds decides validation: the same call with q requiring grad under
    autograd, or with ``causal`` of another type, is judged again, not run on the kept plan."""
    from tiledattention.errors import TiledAttentionError

    k_pages, v_pages, table, seqused, _ = paged_cache([300, 40], 16, 2, 64)
    q = torch.randn(2, 8, 1, 64, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        tiledattention.paged_attention(q, k_pages, v_pages, table, seqused, causal=True)
    with pytest.raises(TiledAttentionError, match="autograd"):
        tiledattention.paged_attention(q.requires_grad_(), k_pages, v_pages, table, seqused)
    q = q.detach()
    with pytest.raises(TiledAttentionError, match="causal"):
        tiledattention.paged_attention(q, k_pages, v_pages, table, seqused, causal=1)


def poison(buffer):
    """NaN in a float scratch array, -1 in an integer one (the flat walk's int32 offsets)."""
    buffer.fill_(float("nan") if buffer.is_floating_point() else -1)


def test_the_flat_merge_reads_what_the_walk_wrote_over_2000_launches():
    """The flat walk's merge reads the partials and offsets its launch's split kernel wrote:
    2,000 launches over a log-uniform batch, each after the scratch was filled with NaN, every
    output bit-equal to the first, and the first the default's."""
    import random

    from tiledattention import DecodeSchedule, Problem
    from tiledattention.kernels.decode._launch import launch, launches, new_scratch

    rng = random.Random(7)
    lengths = [int(2 ** rng.uniform(0, 13)) for _ in range(37)]
    out, (q, k_pages, v_pages, table, seqused, _) = run_and_check(lengths, 16, hq=16, hkv=4)
    problem = Problem(batch=37, heads_q=16, heads_kv=4, seqlen_q=1, seqlen_k=max(lengths),
                      head_dim=128, dtype="bf16", causal=True, bottom_right=True, ragged=True,
                      page_size=16)
    schedule = DecodeSchedule(flat=True, tile_n=64, occupancy=2, k_latency=4, v_latency=4)
    plan = launches(problem, schedule, None,
                    sms=torch.cuda.get_device_properties(0).multi_processor_count)
    assert plan.flat is not None
    scratch = new_scratch(plan, lambda shape: torch.empty(shape, device="cuda"))
    stream = torch.cuda.current_stream()
    first, again = torch.full_like(q, float("nan")), torch.empty_like(q)
    for buffer in scratch:  # the partials, log-sum-exps and offsets: every scratch byte
        poison(buffer)
    launch(stream, plan, q, k_pages, v_pages, first, 0, scratch, ranges=seqused, pages=table)
    assert rel_l2(first, out) < 1e-6  # the default's walk
    mismatches = 0
    for _ in range(2000):
        for buffer in scratch:
            poison(buffer)
        again.fill_(float("nan"))
        launch(stream, plan, q, k_pages, v_pages, again, 0, scratch, ranges=seqused,
               pages=table)
        mismatches += int(not torch.equal(again, first))
    assert mismatches == 0


@pytest.mark.parametrize("splits", [1, 3])
def test_longest_first_reads_the_order_its_call_ranked_over_2000_launches(splits):
    """``longest_first``: the order kernel ranks each call's key counts and the split kernel,
    its programmatic dependent, reads that order. Two batches of one shape whose orders differ
    (ties among their lengths) alternate over 2,000 launches with one scratch, NaN and -1 in
    every scratch byte before each: a row that read the other call's order, or none, would
    attend the wrong entry or none. Every output is bit-equal to its batch's first, and the
    first ones are the float32 reference's; the order each call ranked is its lengths'
    stable descending sort."""
    import random

    from tiledattention import DecodeSchedule, Problem
    from tiledattention.kernels.decode._launch import launch, launches, new_scratch

    rng = random.Random(11)
    lengths = [int(2 ** rng.uniform(4, 10.9)) for _ in range(37)] + [700, 700, 1, 2000]
    batches = []
    for mix in (lengths, lengths[::-1]):
        out, (q, k_pages, v_pages, table, seqused, caches) = run_and_check(mix, 128)
        batches.append((q, k_pages, v_pages, table, seqused, reference(q, caches)))
    problem = Problem(batch=41, heads_q=32, heads_kv=8, seqlen_q=1, seqlen_k=2000, head_dim=128,
                      dtype="bf16", causal=True, bottom_right=True, ragged=True, page_size=128)
    schedule = DecodeSchedule(splits=splits, combine="block_pdl", tile_n=128, occupancy=2,
                              k_latency=4, v_latency=2, longest_first=True)
    plan = launches(problem, schedule, None)
    assert plan.order_entries == 41
    scratch = new_scratch(plan, lambda shape: torch.empty(shape, device="cuda"))
    stream = torch.cuda.current_stream()

    def run(batch, out):
        for buffer in scratch:
            if buffer is not None:
                poison(buffer)
        q, k_pages, v_pages, table, seqused, _ = batch
        out.fill_(float("nan"))
        launch(stream, plan, q, k_pages, v_pages, out, 0, scratch, ranges=seqused, pages=table)

    firsts = []
    for batch, mix in zip(batches, (lengths, lengths[::-1])):
        firsts.append(torch.empty_like(batch[0]))
        run(batch, firsts[-1])
        # longest first, ties in entry order
        assert scratch[2].tolist() == sorted(range(41), key=lambda e: (-mix[e], e))
        assert not firsts[-1].isnan().any()
        for b in range(41):
            assert rel_l2(firsts[-1][b], batch[5][b]) < TOL[torch.bfloat16], b
    again = torch.empty_like(firsts[0])
    mismatches = 0
    for i in range(2000):
        run(batches[i % 2], again)
        mismatches += int(not torch.equal(again, firsts[i % 2]))
    assert mismatches == 0


def longest_first_step(seed):
    """A paged step the default runs longest first (41 entries of 200-2000 keys, H 32/8, pages
    of 128: its bucket of 64 entries passes one wave of two CTAs an SM) and six other mixes of
    its lengths: ``(lengths, mixes, (q, k_pages, v_pages, table, seqused), caches)``."""
    import random

    rng = random.Random(seed)
    longest = [rng.randrange(200, 2000) for _ in range(41)]
    k_pages, v_pages, table, seqused, caches = paged_cache(longest, 128, 8, 128, seed=seed + 1)
    q = torch.randn(41, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
    resolution = tiledattention.explain_paged(q, k_pages, v_pages, table, seqused, max_k=2000)
    assert resolution.schedule.longest_first, resolution
    mixes = [[n - rng.randrange(0, 150) for n in longest] for _ in range(6)]
    return longest, mixes, (q, k_pages, v_pages, table, seqused), caches


def test_a_longest_first_step_replays_in_a_cuda_graph_and_compiles():
    """A longest-first step captured in a CUDA graph and replayed with lengths whose order
    changes every replay (the ranking is in the graph), and the same call under
    ``torch.compile``: each matches the float32 reference."""
    _, mixes, (q, k_pages, v_pages, table, seqused), caches = longest_first_step(3)
    with torch.no_grad():
        compiled = torch.compile(lambda *a: tiledattention.paged_attention(*a, max_k=2000),
                                 fullgraph=True)
        graph, out = captured_step(q, k_pages, v_pages, table, seqused, 2000)
        for lens in mixes:
            seqused.copy_(torch.tensor(lens, dtype=torch.int32))
            graph.replay()
            want = reference(q, [(k[:n], v[:n]) for (k, v), n in zip(caches, lens)])
            assert not out.isnan().any()
            assert rel_l2(out, want) < TOL[q.dtype]
            assert rel_l2(compiled(q, k_pages, v_pages, table, seqused), want) < TOL[q.dtype]


def test_a_step_order_ranked_once_serves_each_layer_and_replays_in_a_cuda_graph():
    """``PagedOrder``: a step's entries ranked once (its key counts' stable longest-first sort)
    and read by each layer's call instead of ranking: bit-equal to the call that ranks for
    itself, as is a call given an order ranked from other lengths (any order of the entries is
    right). Captured with three layers' calls in a CUDA graph, the ranking replays with new
    lengths, each layer matching the reference. Another batch's order is refused."""
    longest, mixes, args, caches = longest_first_step(5)
    q, seqused = args[0], args[4]
    with torch.no_grad():
        ranked = tiledattention.paged_attention(*args, max_k=2000)
        order = tiledattention.PagedOrder(seqused)
        assert order.entries.tolist() == sorted(range(41), key=lambda e: (-longest[e], e))
        assert torch.equal(tiledattention.paged_attention(*args, max_k=2000, order=order), ranked)
        stale = tiledattention.PagedOrder(torch.tensor(mixes[0][::-1], dtype=torch.int32,
                                                       device="cuda"))
        assert torch.equal(tiledattention.paged_attention(*args, max_k=2000, order=stale), ranked)
        with pytest.raises(tiledattention.InputValueError, match="order must rank this call"):
            tiledattention.paged_attention(*args, max_k=2000,
                                           order=tiledattention.PagedOrder(seqused[:40]))
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            order = tiledattention.PagedOrder(seqused)
            outs = [tiledattention.paged_attention(q * (i + 1), *args[1:], max_k=2000,
                                                   order=order) for i in range(3)]
        for lens in mixes:
            seqused.copy_(torch.tensor(lens, dtype=torch.int32))
            graph.replay()
            assert order.entries.tolist() == sorted(range(41), key=lambda e: (-lens[e], e))
            now = [(k[:n], v[:n]) for (k, v), n in zip(caches, lens)]
            for i, out in enumerate(outs):
                assert rel_l2(out, reference(q * (i + 1), now)) < TOL[q.dtype], i
