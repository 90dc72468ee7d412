"""Packed variable-length attention on the GPU (``tiledattention.varlen_attn``) against the
float32 reference built sequence by sequence (``tiledattention.tooling.varlen_reference``).

Every batch interleaves its sequences with *poison* sequences whose query, key and value rows
are NaN, and ends with NaN tokens that belong to no sequence: a kernel that reads one row
outside its sequence's range (a key, a value, a query) turns some output of a real sequence
into NaN. Rows outside every sequence must come out as zeros. Lengths include 0 (empty
sequences), 1, odd lengths around the tiles' edges, S_q != S_k in both alignments, and a batch
spanning 1 to 32k tokens.
"""

from __future__ import annotations

import pytest
import torch

import tiledattention
from tiledattention.tooling import varlen_reference

from ._reference import rel_l2

pytestmark = pytest.mark.gpu

TOL = {torch.bfloat16: 1e-2, torch.float16: 5e-3}


def packed_batch(lens_q, lens_k, hq=8, hkv=2, d=128, dtype=torch.bfloat16, poison=True,
                 seed=0):
    """Packed q, k, v with a NaN poison sequence after every real one and 3 NaN trailing tokens;
    the offsets (int32, CUDA) and the real sequences' indices."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    seq_q, seq_k, real = [], [], []
    for i, (lq, lk) in enumerate(zip(lens_q, lens_k)):
        real.append(len(seq_q))
        seq_q.append(lq)
        seq_k.append(lk)
        if poison:
            seq_q.append(3 + i % 5)
            seq_k.append(2 + i % 7)
    cu_q = torch.tensor([0] + seq_q, device="cuda").cumsum(0).to(torch.int32)
    cu_k = torch.tensor([0] + seq_k, device="cuda").cumsum(0).to(torch.int32)
    tq, tk = int(cu_q[-1]) + 3, int(cu_k[-1]) + 3

    def make(tokens, heads, cu):
        x = torch.randn(tokens, heads, d, device="cuda", dtype=dtype, generator=gen)
        bad = torch.ones(tokens, dtype=torch.bool, device="cuda")
        for j in real:
            bad[int(cu[j]):int(cu[j + 1])] = False
        return x.masked_fill(bad[:, None, None], float("nan"))
    return (make(tq, hq, cu_q), make(tk, hkv, cu_k), make(tk, hkv, cu_k), cu_q, cu_k, real)


def check(q, k, v, cu_q, cu_k, real, *, is_causal=False, window=(-1, -1), scale=None,
          grad=False):
    lens_q = (cu_q[1:] - cu_q[:-1]).tolist()
    lens_k = (cu_k[1:] - cu_k[:-1]).tolist()
    causal = is_causal is not False or window[1] == 0
    bottom_right = is_causal != "top_left"  # torch's convention, windows included
    out = tiledattention.varlen_attn(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                     is_causal=is_causal, window_size=window, scale=scale,
                                     enable_gqa=q.shape[1] != k.shape[1])
    want = varlen_reference(q, k, v, cu_q, cu_k, causal=causal, bottom_right=bottom_right,
                            scale=scale, window=window)
    covered = torch.zeros(q.shape[0], dtype=torch.bool, device="cuda")
    for j in range(len(lens_q)):
        covered[int(cu_q[j]):int(cu_q[j + 1])] = True
    assert torch.equal(out[~covered], torch.zeros_like(out[~covered]))  # no sequence: zeros
    for j in real:
        rows = slice(int(cu_q[j]), int(cu_q[j + 1]))
        if rows.stop == rows.start:
            continue
        got, ref = out[rows], want[rows]
        assert not got.isnan().any(), f"sequence {j} read a row outside its range"
        if ref.abs().sum() == 0:  # no key visible: zeros
            assert torch.equal(got, torch.zeros_like(got)), j
        else:
            assert rel_l2(got, ref) < TOL[q.dtype], (j, lens_q[j], lens_k[j])
    return out


LENGTHS = [1, 17, 63, 64, 65, 127, 129, 300, 1025]


@pytest.mark.parametrize("is_causal", [False, True, "top_left"])
def test_self_attention_sequences(is_causal):
    q, k, v, cu_q, cu_k, real = packed_batch(LENGTHS, LENGTHS, hq=32, hkv=8)
    check(q, k, v, cu_q, cu_k, real, is_causal=is_causal)


@pytest.mark.parametrize("is_causal", [False, True, "top_left"])
def test_queries_and_keys_of_other_lengths(is_causal):
    lens_q = [3, 100, 1, 50, 200, 7]
    lens_k = [10, 100, 257, 49, 64, 700]
    q, k, v, cu_q, cu_k, real = packed_batch(lens_q, lens_k, hq=8, hkv=8)
    check(q, k, v, cu_q, cu_k, real, is_causal=is_causal)


def test_empty_sequences_and_sequences_without_keys():
    lens_q = [0, 5, 9, 0, 33, 4]
    lens_k = [0, 0, 9, 12, 33, 0]
    q, k, v, cu_q, cu_k, real = packed_batch(lens_q, lens_k, hq=4, hkv=1)
    out = check(q, k, v, cu_q, cu_k, real, is_causal=True)
    assert torch.equal(out[int(cu_q[2]):int(cu_q[3])], torch.zeros_like(out[:5]))  # no keys


@pytest.mark.parametrize("d, dtype", [(64, torch.float16), (96, torch.bfloat16),
                                      (256, torch.bfloat16)])
def test_head_dims_and_dtypes(d, dtype):
    lens = [5, 130, 77, 256]
    q, k, v, cu_q, cu_k, real = packed_batch(lens, lens, hq=6, hkv=2, d=d, dtype=dtype)
    check(q, k, v, cu_q, cu_k, real, is_causal=True, scale=0.3)


def test_a_window_per_sequence():
    lens_q = [40, 300, 1, 129]
    lens_k = [40, 500, 200, 129]
    q, k, v, cu_q, cu_k, real = packed_batch(lens_q, lens_k, hq=8, hkv=4)
    check(q, k, v, cu_q, cu_k, real, window=(64, 0))
    check(q, k, v, cu_q, cu_k, real, window=(31, 17))


def test_lengths_from_1_to_32k():
    lens = [32768, 1, 1000, 3, 4096, 17, 999]
    q, k, v, cu_q, cu_k, real = packed_batch(lens, lens, hq=8, hkv=2, poison=True)
    check(q, k, v, cu_q, cu_k, real, is_causal=True)


def test_cupy_arrays():
    cupy = pytest.importorskip("cupy")
    lens = [5, 130, 0, 77, 256]
    q, k, v, cu_q, cu_k, real = packed_batch(lens, lens, hq=8, hkv=2, d=64,
                                             dtype=torch.float16)
    want = check(q, k, v, cu_q, cu_k, real, is_causal=True)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        got = tiledattention.varlen_attn(*(cupy.from_dlpack(x) for x in (q, k, v, cu_q, cu_k)),
                                         max(lens), max(lens), is_causal=True, enable_gqa=True)
        stream.synchronize()
    assert isinstance(got, cupy.ndarray)
    torch.testing.assert_close(torch.from_dlpack(got), want, rtol=0, atol=0, equal_nan=True)
    with pytest.raises(TypeError, match="cu_seq_k must be a cupy.ndarray"):
        tiledattention.varlen_attn(*(cupy.from_dlpack(x) for x in (q, k, v, cu_q)), cu_k,
                                   max(lens), max(lens))


def _table_reference(ranges, tile, items, keys):
    """The work table by torch ops: sequences by float32 queries x keys, descending, ties by
    index; each one's query tiles from its last (``keys``: its key tiles from its first); -1
    past the last tile."""
    q_len = (ranges[1] - ranges[0]).long()
    own = (ranges[3] - ranges[2]).long() if keys else q_len
    tiles = (own + tile - 1) // tile
    weight = q_len.float() * (ranges[3] - ranges[2]).float()
    order = torch.argsort(weight, descending=True, stable=True)
    ends = torch.cumsum(tiles[order], 0)
    item = torch.arange(items, device=ranges.device)
    place = torch.searchsorted(ends, item, right=True).clamp_(max=ranges.shape[1] - 1)
    last = ends[place]
    sequence = torch.where(item < last, order[place], -1)
    first = last - tiles[order][place]
    tile_of = (item - first) if keys else (last - 1 - item)
    return sequence.int(), tile_of.int(), item < last


@pytest.mark.parametrize("keys", [False, True])
@pytest.mark.parametrize("q_lens, k_lens, tile", [
    ([5, 300, 0, 129, 1, 64, 0, 257], [5, 300, 0, 129, 9000, 64, 7, 257], 64),
    ([100] * 7 + [0, 1], [100] * 7 + [3, 0], 128),  # ties keep index order
    ([19200, 3] + [70] * 600, None, 64),  # over one chunk of sequences and of tiles
    ([7, 40, 1], [3000, 0, 513], 128),  # keys of their own lengths
])
def test_the_work_table_kernel_matches_its_reference(q_lens, k_lens, tile, keys):
    from tiledattention.core._work_table import make_work_table, work_items

    k_lens = q_lens if k_lens is None else k_lens
    cq = torch.tensor([0] + q_lens, device="cuda").cumsum(0)
    ck = torch.tensor([0] + k_lens, device="cuda").cumsum(0)
    ranges = torch.stack((cq[:-1], cq[1:], ck[:-1], ck[1:])).to(torch.int32)
    lens = k_lens if keys else q_lens
    items = work_items(sequences=len(lens), longest=max(lens), rows=sum(lens), tile=tile) + 5
    table = make_work_table(torch.cuda.current_stream(), ranges, tile, items, keys=keys)
    sequence, tile_of, used = _table_reference(ranges, tile, items, keys)
    assert torch.equal(table[0], sequence)
    assert torch.equal(table[1][used], tile_of[used])
    assert int(used.sum()) == sum(-(-n // tile) for n in lens)


@pytest.mark.parametrize("q_lens, k_lens, tiles", [
    ([5, 300, 0, 129, 1, 64, 0, 257], [5, 300, 0, 129, 9000, 64, 7, 257], (64, 128)),
    ([19200, 3] + [70] * 600, None, (128, 64)),  # over one chunk of sequences and of tiles
])
def test_the_backward_prologue_fills_both_tables_in_one_launch(q_lens, k_lens, tiles):
    """The backward's prologue (one launch) writes the dQ kernel's table of query tiles and
    the dK/dV kernel's of key tiles, each as the work-table reference has it."""
    import types

    from tiledattention.core._work_table import work_items
    from tiledattention.kernels.backward import _launch

    k_lens = q_lens if k_lens is None else k_lens
    cq = torch.tensor([0] + q_lens, device="cuda").cumsum(0)
    ck = torch.tensor([0] + k_lens, device="cuda").cumsum(0)
    ranges = torch.stack((cq[:-1], cq[1:], ck[:-1], ck[1:])).to(torch.int32)
    sizes = [work_items(sequences=len(n), longest=max(n), rows=sum(n), tile=t) + 5
             for n, t in ((q_lens, tiles[0]), (k_lens, tiles[1]))]
    tables = [torch.full((2, n), 12345, dtype=torch.int32, device="cuda") for n in sizes]
    problem = tiledattention.Problem(batch=len(q_lens), heads_q=8, heads_kv=2, seqlen_q=256,
                                     seqlen_k=256, head_dim=64, dtype="bf16", causal=True,
                                     ragged=True)
    plan = types.SimpleNamespace(problem=problem, tiles=tiles)
    _launch._launch_prologue(torch.cuda.current_stream(), plan, ranges, tables, None)
    for keys, (table, tile, items, lens) in enumerate(zip(tables, tiles, sizes,
                                                          (q_lens, k_lens))):
        sequence, tile_of, used = _table_reference(ranges, tile, items, bool(keys))
        assert torch.equal(table[0], sequence), keys
        assert torch.equal(table[1][used], tile_of[used]), keys
        assert int(used.sum()) == sum(-(-n // tile) for n in lens)


@pytest.fixture(params=["table", "grid"])
def launch_mode(request, monkeypatch):
    """Every ragged launch (forward and backward) walks a work table, or none does (the
    launchers pick by how many idle CTAs the longest sequence's grid would have)."""
    import tiledattention.core._work_table as work_table

    for name in ("TABLE_MIN_IDLE_CTAS", "BACKWARD_TABLE_MIN_IDLE_CTAS"):
        monkeypatch.setattr(work_table, name, 0 if request.param == "table" else 1 << 62)
    return request.param


@pytest.mark.parametrize("is_causal", [False, True, "top_left"])
def test_both_launch_modes(launch_mode, is_causal):
    q, k, v, cu_q, cu_k, real = packed_batch(LENGTHS, LENGTHS[::-1], hq=8, hkv=2, seed=3)
    check(q, k, v, cu_q, cu_k, real, is_causal=is_causal)
    check(q, k, v, cu_q, cu_k, real, window=(100, 0))
    lens_q = [0, 5, 9, 0, 33, 4, 2000]
    lens_k = [0, 0, 9, 12, 33, 0, 2100]
    q, k, v, cu_q, cu_k, real = packed_batch(lens_q, lens_k, hq=4, hkv=1, seed=4)
    check(q, k, v, cu_q, cu_k, real, is_causal=is_causal)


def test_both_launch_modes_padded(launch_mode):
    s = 700
    spans = [(p, s) for p in (0, 17, 129, 699, 350)]
    q, k, v, ranges = padded_batch(5, 8, 2, s, s, 128, spans, spans)
    check_padded(q, k, v, ranges, True)


def test_new_batches_of_one_profile_share_one_lookup():
    """Offsets differ batch to batch; the lookup's memo grows by bucket, not by batch."""
    rt = tiledattention.runtime()
    rt.clear()
    gen = torch.Generator().manual_seed(1)
    for _ in range(6):
        lens = (torch.randint(200, 1000, (8,), generator=gen)).tolist()
        q, k, v, cu_q, cu_k, real = packed_batch(lens, lens, poison=False)
        tiledattention.varlen_attn(q, k, v, cu_q, cu_k, max(lens), max(lens), is_causal=True,
                                   enable_gqa=True)
    resolutions, _ = rt.sizes()
    assert resolutions <= 2



def test_batches_of_new_token_counts_compile_nothing_new():
    """A packed batch's token and sequence counts change from batch to batch (a padding-free
    training run): the kernels are compiled without assumptions on them (one length-free compile
    per kernel variant, ``core._aot``), so batches whose counts divide by 16 or not, after one of
    each bucket and launch mode, reuse those compiles and stay right (forward and gradients)."""
    from tiledattention.core import _aot

    gen = torch.Generator().manual_seed(5)
    batches = [[int(n) for n in torch.randint(130, 256, (count,), generator=gen)] + [256]
               for count in (5, 6, 7, 8, 9, 11, 13)]
    for i, lens in enumerate(batches):
        if i == 1:  # the first batch compiled this bucket's kernels
            compiled, reused = _aot.compiles()
        check(*packed_batch(lens, lens), is_causal=True)
        check_grads(lens, lens, hq=8, hkv=2)
    after = _aot.compiles()
    assert after[0] == compiled, "a batch of new counts compiled a kernel again"
    assert after[1] > reused  # (new launch signatures did come, answered by earlier compiles)


# -- a padded batch: sdpa(..., ranges=) ----------------------------------------------------------
def padded_batch(b, hq, hkv, sq, sk, d, q_ranges, k_ranges, dtype=torch.bfloat16, seed=3):
    """q, k, v ``[B, H, S, D]`` with NaN everywhere outside each entry's ranges; the int32
    ``[4, B]`` ranges."""
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def make(heads, s, spans):
        x = torch.randn(b, heads, s, d, device="cuda", dtype=dtype, generator=gen)
        for i, (lo, hi) in enumerate(spans):
            x[i, :, :lo] = float("nan")
            x[i, :, hi:] = float("nan")
        return x
    ranges = torch.tensor([[r[0] for r in q_ranges], [r[1] for r in q_ranges],
                           [r[0] for r in k_ranges], [r[1] for r in k_ranges]],
                          dtype=torch.int32, device="cuda")
    return make(hq, sq, q_ranges), make(hkv, sk, k_ranges), make(hkv, sk, k_ranges), ranges


def check_padded(q, k, v, ranges, causal, window=None):
    out = tiledattention.sdpa(q, k, v, causal, ranges=ranges, window=window)
    cols = ranges.T.tolist()
    for i, (q0, q1, k0, k1) in enumerate(cols):
        assert torch.equal(out[i, :, :q0], torch.zeros_like(out[i, :, :q0]))
        assert torch.equal(out[i, :, q1:], torch.zeros_like(out[i, :, q1:]))
        if q1 <= q0:
            continue
        lens_q, lens_k = q1 - q0, k1 - k0
        packed = lambda x, a, c: x[i, :, a:c].transpose(0, 1)  # noqa: E731
        cu_q = torch.tensor([0, lens_q], dtype=torch.int32)
        cu_k = torch.tensor([0, lens_k], dtype=torch.int32)
        want = varlen_reference(packed(q, q0, q1), packed(k, k0, k1), packed(v, k0, k1), cu_q,
                                cu_k, causal=causal is not False,
                                bottom_right=causal == "bottom_right",
                                window=window or (-1, -1))
        got = out[i, :, q0:q1].transpose(0, 1)
        assert not got.isnan().any(), i
        if want.abs().sum() == 0:
            assert torch.equal(got, torch.zeros_like(got))
        else:
            assert rel_l2(got, want) < TOL[q.dtype], i
    return out


@pytest.mark.parametrize("causal", [True, "bottom_right", False])
def test_left_padded_prefill(causal):
    s = 300
    pads = [0, 17, 129, 299]
    spans = [(p, s) for p in pads]
    q, k, v, ranges = padded_batch(4, 8, 2, s, s, 128, spans, spans)
    check_padded(q, k, v, ranges, causal)


def test_left_padded_decode_steps_and_right_padding():
    sk = 1000
    k_spans = [(0, 1000), (400, 1000), (999, 1000), (0, 613)]  # left padding, and right
    q_spans = [(0, 1)] * 4
    q, k, v, ranges = padded_batch(4, 32, 8, 1, sk, 128, q_spans, k_spans)
    check_padded(q, k, v, ranges, "bottom_right")
    q, k, v, ranges = padded_batch(4, 32, 8, 4, sk, 64, [(0, 4)] * 4, k_spans)
    check_padded(q, k, v, ranges, "bottom_right", window=(255, 0))


def test_ranges_are_checked_before_a_launch():
    q, k, v, ranges = padded_batch(2, 4, 4, 8, 8, 64, [(0, 8)] * 2, [(0, 8)] * 2)
    for bad in (ranges.long(), ranges[:, :1], ranges.cpu(), [[0, 8, 0, 8]]):
        with pytest.raises(ValueError, match="ranges must be an int32 tensor"):
            tiledattention.sdpa(q, k, v, True, ranges=bad)


# -- gradients ------------------------------------------------------------------------------------
def check_grads(lens_q, lens_k, *, is_causal=True, hq=8, hkv=2, d=128, window=(-1, -1),
                dtype=torch.bfloat16, shared=False):
    """varlen_attn's gradients against autograd through the per-sequence reference, on real
    sequences interleaved with NaN poison ones (whose own gradients are not compared); rows and
    keys outside every sequence get zero gradients. ``shared``: one offsets tensor for queries
    and keys (``lens_q == lens_k``; no poison sequences, whose key counts differ)."""
    q, k, v, cu_q, cu_k, real = packed_batch(lens_q, lens_k, hq=hq, hkv=hkv, d=d, dtype=dtype,
                                             poison=not shared)
    if shared:
        assert lens_q == lens_k
        cu_k = cu_q
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    lq = (cu_q[1:] - cu_q[:-1]).tolist()
    lk = (cu_k[1:] - cu_k[:-1]).tolist()
    out = tiledattention.varlen_attn(*leaves, cu_q, cu_k, max(lq), max(lk), is_causal=is_causal,
                                     window_size=window, enable_gqa=hq != hkv)
    grad_out = torch.randn_like(out)
    grads = torch.autograd.grad(out, leaves, grad_out)
    # the reference on the real sequences only (the poison ones would spread NaN through it)
    keep = [j for j in real]
    cq = torch.tensor([0] + [lq[j] for j in keep]).cumsum(0).to(torch.int32)
    ck = torch.tensor([0] + [lk[j] for j in keep]).cumsum(0).to(torch.int32)

    def gather(x, cu, lens):
        return torch.cat([x[int(cu[j]):int(cu[j]) + lens[j]] for j in keep])
    ref_leaves = [gather(x, c, n).float().requires_grad_()
                  for x, c, n in ((q, cu_q, lq), (k, cu_k, lk), (v, cu_k, lk))]
    ref = varlen_reference(*ref_leaves, cq, ck, causal=is_causal is not False or window[1] == 0,
                           bottom_right=is_causal != "top_left", window=window)
    want = torch.autograd.grad(ref, ref_leaves, gather(grad_out, cu_q, lq).float())
    for name, g, w, cu, lens in (("dq", grads[0], want[0], cu_q, lq),
                                 ("dk", grads[1], want[1], cu_k, lk),
                                 ("dv", grads[2], want[2], cu_k, lk)):
        got = gather(g, cu, lens)
        assert not got.isnan().any(), f"{name}: a sequence read a row outside its range"
        assert rel_l2(got, w) < 2 * TOL[dtype], name
        covered = torch.zeros(g.shape[0], dtype=torch.bool, device="cuda")
        for j in range(len(lens)):
            covered[int(cu[j]):int(cu[j + 1])] = True
        assert torch.equal(g[~covered], torch.zeros_like(g[~covered])), name


@pytest.mark.parametrize("is_causal", [True, False, "top_left"])
def test_gradients_self_attention(is_causal):
    check_grads(LENGTHS, LENGTHS, is_causal=is_causal, hq=16, hkv=4)


@pytest.mark.parametrize("is_causal", [True, "top_left"])
def test_gradients_through_one_offsets_tensor(is_causal):
    """Queries and keys cut by one offsets tensor take the bottom-right bucket whichever
    alignment is asked (every sequence has as many queries as keys: one mask), so a top-left
    call runs the bottom-right kernels: outputs and gradients still the reference's."""
    check_grads(LENGTHS, LENGTHS, is_causal=is_causal, hq=16, hkv=4, shared=True)


def test_gradients_queries_and_keys_of_other_lengths_and_empty_ones():
    check_grads([3, 100, 0, 1, 50, 129], [10, 100, 7, 257, 49, 0], is_causal=True, hq=8, hkv=8)


@pytest.mark.parametrize("hq, hkv, d", [(8, 1, 64), (12, 4, 96), (4, 2, 256)])
def test_gradients_grouped_heads_and_head_dims(hq, hkv, d):
    check_grads([77, 1, 256, 130], [77, 1, 256, 130], hq=hq, hkv=hkv, d=d)


def test_gradients_with_a_window():
    check_grads([40, 300, 129], [40, 300, 129], window=(63, 0), is_causal=False)


@pytest.mark.parametrize("is_causal", [True, False, "top_left"])
def test_gradients_in_both_launch_modes(launch_mode, is_causal):
    """The backward's dQ and dK/dV kernels over work tables (of query tiles, and of key tiles,
    the first first) and over their grids; empty sequences, keys of other lengths, a window."""
    check_grads([3, 100, 0, 1, 50, 129, 1025], [10, 100, 7, 257, 49, 0, 1100],
                is_causal=is_causal, hq=8, hkv=2)
    check_grads(LENGTHS, LENGTHS[::-1], is_causal=is_causal, hq=12, hkv=4, d=64,
                dtype=torch.float16)
    check_grads(LENGTHS, LENGTHS, window=(63, 0), is_causal=False, hq=7, hkv=1, d=96)


@pytest.fixture
def one_pass(monkeypatch):
    """Every ragged backward runs one-pass (``dq_mode="atomic"``): the family's launches are
    those of its schedule with that mode, whatever the lookup gave."""
    from tiledattention.kernels.backward import _family

    plain = _family.launches

    def launches(problem, schedule, scale):
        assert problem.ragged
        return plain(problem, _family.normalise(problem, schedule.replace(dq_mode="atomic")),
                     scale)
    monkeypatch.setattr(_family, "launches", launches)


@pytest.mark.parametrize("is_causal", [True, False, "top_left"])
def test_one_pass_gradients(one_pass, launch_mode, is_causal):
    """The one-pass backward of packed sequences: each sequence's dQ shares added into its own
    rows of the float32 accumulator (sequences end mid-tile, so a share spilling past its
    sequence's end lands in the next one's dQ), with empty sequences, keys of other lengths,
    grouped and multi-query heads, D 64 / 96 / 128, fp16, a window; NaN poison sequences
    between the real ones."""
    check_grads([3, 100, 0, 1, 50, 129, 1025], [10, 100, 7, 257, 49, 0, 1100],
                is_causal=is_causal, hq=8, hkv=2)
    check_grads(LENGTHS, LENGTHS[::-1], is_causal=is_causal, hq=12, hkv=4, d=64,
                dtype=torch.float16)
    check_grads(LENGTHS, LENGTHS, window=(63, 0), is_causal=False, hq=7, hkv=1, d=96)


def test_one_pass_reduce_adds_stay_in_their_sequences_over_thousands_of_launches():
    """Cross-CTA float32 reduce-adds into the accumulator rows of packed sequences (the tuner's
    case of a bucket of 8 sequences of 701, 525, 350 and 175 tokens, each ending mid-tile, so
    query tiles straddle two sequences): 2,000 launches, dQ poisoned with NaN before each and
    held to the two-kernel backward's dQ (relative L2 on the GPU, the worst kept there: a
    stale, lost or misplaced add shows as NaN or a large error), after both passed the float32
    reference."""
    from tiledattention import BACKWARD, Problem

    problem = Problem(batch=8, heads_q=8, heads_kv=2, seqlen_q=701, seqlen_k=701, head_dim=64,
                      dtype="bf16", causal=True, ragged=True)
    case = BACKWARD.case(problem, 0)
    one_pass = BACKWARD.normalise(problem, BACKWARD.default_schedule("sm_90", problem).replace(
        dq_mode="atomic"))
    assert one_pass.dq_mode == "atomic"
    two_kernel, run = (case.launcher(s) for s in (one_pass.replace(dq_mode="kernel"), one_pass))
    for launcher in (two_kernel, run):
        error = case.error(launcher)
        assert error <= BACKWARD.tolerance(problem), error
    two_kernel()
    dq = case.grads[0]
    reference = dq.float().clone()
    norm = torch.linalg.vector_norm(reference)
    worst = torch.zeros((), device="cuda")
    for _ in range(2000):
        dq.fill_(float("nan"))
        run()
        err = torch.linalg.vector_norm(dq.float() - reference) / norm
        worst = torch.maximum(worst, torch.nan_to_num(err, nan=float("inf")))  # no sync
    torch.cuda.synchronize()
    assert worst.item() <= 5e-3, f"worst dQ relative L2 over 2000 launches: {worst}"


def test_more_sequences_than_a_grid_dimension_holds():
    """4100 short sequences, each followed by a NaN poison one, x 16 query heads: past a grid's
    second dimension (65535), so the forward's and the backward's dQ launches walk tables (the
    dK/dV grid of 8200 x 4 K/V heads fits): output and gradients against the reference."""
    gen = torch.Generator().manual_seed(5)
    lens = torch.randint(0, 40, (4100,), generator=gen).tolist()
    q, k, v, cu_q, cu_k, real = packed_batch(lens, lens, hq=16, hkv=4, d=64, seed=6)
    assert (cu_q.shape[0] - 1) * 16 > 65535
    check(q, k, v, cu_q, cu_k, real, is_causal=True)
    check_grads(lens, lens, is_causal=True, hq=16, hkv=4, d=64)


def test_the_eager_route_and_the_custom_op_agree_bitwise():
    """Eager calls go through an autograd Function (entry_points/_varlen.py) instead of
    tiledattention::varlen_fwd / varlen_bwd; both run the same kernels on the same plan."""
    from tiledattention.entry_points import _varlen

    lens_q, lens_k = [100, 1, 333, 64, 0, 17], [120, 5, 333, 64, 9, 17]
    q, k, v, cu_q, cu_k, _ = packed_batch(lens_q, lens_k, poison=False)
    grad_out = torch.randn_like(q)
    results = []
    for route in ("eager", "op"):
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        if route == "eager":
            assert _varlen.eager(*leaves, cu_q, cu_k)
            out = tiledattention.varlen_attn(*leaves, cu_q, cu_k, 333, 333, is_causal=True,
                                             enable_gqa=True)
        else:
            out, _ = torch.ops.tiledattention.varlen_fwd(*leaves, cu_q, cu_k, 333, 333, True,
                                                         True, None, -1, -1)
        results.append((out, *torch.autograd.grad(out, leaves, grad_out)))
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_compiled_training_step_matches_eager():
    """torch.compile traces varlen_attn's custom ops (fake implementations) forward and
    backward."""
    lens = [100, 1, 333, 64]
    q, k, v, cu_q, cu_k, _ = packed_batch(lens, lens, poison=False)

    def step(q, k, v):
        out = tiledattention.varlen_attn(q, k, v, cu_q, cu_k, 333, 333, is_causal=True,
                                         enable_gqa=True)
        return (out.float() ** 2).sum()
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    loss = step(*leaves)
    grads = torch.autograd.grad(loss, leaves)
    compiled = torch.compile(step, fullgraph=True)
    leaves2 = [x.clone().requires_grad_() for x in (q, k, v)]
    loss2 = compiled(*leaves2)
    grads2 = torch.autograd.grad(loss2, leaves2)
    assert torch.allclose(loss, loss2, rtol=1e-3)
    for a, b in zip(grads, grads2):
        assert torch.equal(a, b)


def test_explain_varlen_names_the_bucket_and_its_schedule():
    lens = [700, 1500, 3]
    q, k, v, cu_q, cu_k, _ = packed_batch(lens, lens, poison=False)
    found = tiledattention.explain_varlen(q, k, v, cu_q, cu_k, 1500, 1500, is_causal=True,
                                          enable_gqa=True)
    assert found.family == "forward"
    assert not found.schedule.persistent  # what the launch runs: normalisable, never persistent
    back = tiledattention.explain_varlen(q, k, v, cu_q, cu_k, 1500, 1500, is_causal=True,
                                         enable_gqa=True, training=True)
    assert back.family == "backward"


def test_rows_of_no_sequence_get_zero_outputs_and_gradients():
    """Tokens before the first sequence and after the last (NaN here) come out as zeros, and so
    do their gradients, though their memory held NaN: the forward's clear and the backward's
    prologue zero exactly those rows (none else are left unwritten)."""
    gen = torch.Generator(device="cuda").manual_seed(5)
    tokens, first, end = 600, 7, 250  # rows of no sequence: 7 before, 350 after (22 tiles)
    q, k, v = (torch.randn(tokens, h, 64, device="cuda", dtype=torch.bfloat16, generator=gen)
               for h in (4, 2, 2))
    for x in (q, k, v):
        x[:first] = float("nan")
        x[end:] = float("nan")
    cu = torch.tensor([first, 100, 101, end], dtype=torch.int32, device="cuda")
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    # NaN-filled blocks of the output's and the gradients' sizes, freed: the caching allocator
    # hands them out again, so a row nothing writes reads NaN
    junk = [torch.full_like(x, float("nan")) for x in (q, q, k, v) for _ in range(2)]
    del junk
    out = tiledattention.varlen_attn(*leaves, cu, cu, 149, 149, is_causal=True,
                                     enable_gqa=True)
    grads = torch.autograd.grad(out, leaves, torch.randn_like(out))
    for name, x in (("out", out), ("dq", grads[0]), ("dk", grads[1]), ("dv", grads[2])):
        assert torch.equal(x[:first], torch.zeros_like(x[:first])), name
        assert torch.equal(x[end:], torch.zeros_like(x[end:])), name
        assert not x[first:end].isnan().any(), name
    want = varlen_reference(q, k, v, cu, cu, causal=True)
    assert rel_l2(out[first:end], want[first:end]) < TOL[q.dtype]
