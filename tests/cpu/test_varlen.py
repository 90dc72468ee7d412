"""Ragged batches on the CPU (issue 33): the bucketed problem, the forward's ragged constants,
normalisation and arguments, compiles for every architecture, argument errors of
``varlen_attn`` and ``sdpa(ranges=)`` (raised before anything is launched), the custom ops'
fake implementations, the ragged case and the per-sequence reference."""

from __future__ import annotations

import dataclasses
import math

import cuda.tile
import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

import tiledattention
from tiledattention import FORWARD, KernelArgumentError, Problem, Schedule
from tiledattention.core._case import ragged_flops, ragged_lengths
from tiledattention.core._ragged import packed_ranges, ragged_problem
from tiledattention.core._work_table import TABLE_MIN_IDLE_CTAS, use_work_table, work_items
from tiledattention.kernels.forward._compile import compile_schedule
from tiledattention.kernels.forward._launch import (kernel_args, kernel_constants,
                                                    kernel_parameters, normalise, ragged_grid)
from tiledattention.tooling import varlen_reference

ARCHS = ("sm_80", "sm_90", "sm_100", "sm_120", "sm_121")


def _ragged(**fields) -> Problem:
    base = dict(batch=8, heads_q=32, heads_kv=8, seqlen_q=2048, seqlen_k=2048, head_dim=128,
                dtype="bf16", causal=True, ragged=True)
    return Problem(**{**base, **fields})


@pytest.fixture
def launches(monkeypatch):
    calls = []
    monkeypatch.setattr(cuda.tile, "launch", lambda *a, **k: calls.append(a))
    return calls


# -- the problem ---------------------------------------------------------------------------------
def test_a_ragged_call_is_looked_up_by_its_bucket():
    p = ragged_problem(sequences=37, tokens_q=20000, longest_q=1500, longest_k=1500,
                       heads_q=32, heads_kv=8, head_dim=128, dtype="bf16", causal=True,
                       bottom_right=True)
    assert (p.batch, p.seqlen_q, p.seqlen_k, p.ragged) == (16, 2048, 2048, True)
    # other offsets and lengths of the same profile: the same key
    q = ragged_problem(sequences=41, tokens_q=17000, longest_q=1100, longest_k=1100,
                       heads_q=32, heads_kv=8, head_dim=128, dtype="bf16", causal=True,
                       bottom_right=True)
    assert q == p
    # never more sequences than the call has (rounded up)
    one = ragged_problem(sequences=1, tokens_q=9, longest_q=9, longest_k=300, heads_q=4,
                         heads_kv=4, head_dim=64, dtype="fp16", causal=False,
                         bottom_right=True)
    assert (one.batch, one.seqlen_q, one.seqlen_k, one.bottom_right) == (1, 16, 512, False)


def test_a_large_packed_batch_keeps_its_bucket_inside_the_index_range():
    """The bucket's rounding (sequences filled, lengths to powers of two) must not refuse a
    call whose own arrays fit the kernels' int32 indexing: 80 sequences of 5000 tokens, 32 K/V
    heads of D 128 (1.64e9 elements a packed tensor) rounded to 64 x 8192 would reach 2.1e9.
    A paged call's bucket too, as the forward looks it up (without its pages)."""
    big = dict(sequences=80, tokens_q=400000, longest_q=5000, longest_k=5000, heads_q=32,
               heads_kv=32, head_dim=128, dtype="bf16", causal=True, bottom_right=True)
    p = ragged_problem(**big)
    assert (p.batch, p.seqlen_k) == (32, 8192)
    assert p.batch * p.heads_kv * p.seqlen_k * 128 <= 2 ** 31 - 1
    # the same profile at a quarter of the tokens keeps the plain rounding
    assert ragged_problem(**{**big, "sequences": 20, "tokens_q": 100000}).batch == 16
    # a paged bucket's pools are exempt (a decode step's is looked up with its pages), not
    # the same work without them, which the forward looks a chunk of a prefill up by: 64 (33
    # rounded up) x 8 x 16384 x 256 is 2 ** 31
    paged = ragged_problem(**{**big, "sequences": 33, "tokens_q": 33 * 64, "longest_q": 64,
                              "longest_k": 8929, "heads_q": 56, "heads_kv": 8,
                              "head_dim": 256, "page_size": 16})
    assert paged.batch == 64
    unpaged = FORWARD.paged_lookup(paged, paged)
    assert (unpaged.page_size, unpaged.batch) == (0, 32)


@pytest.mark.parametrize("seqlen", [128, 512, 1024, 2048, 8192])
def test_a_packed_batch_at_d128_without_a_mask_runs_64_row_tiles_on_hopper(seqlen):
    """Packed sequences end inside tiles whatever the bucket's (power-of-two) lengths: up to
    2048 tokens 64x128 at occupancy 2 (measured on an H200: 1.09-1.23x the rectangle's 128x128
    tiles), their key tiles sawtooth up to 512 (on an H100: 1.00-1.10x), longer ones and the
    rectangle of the same lengths keep 128x128 tiles, and causal packed batches the
    rectangle's rule (their grouped heads packed: ``pack_gqa``)."""
    packed = _ragged(causal=False, seqlen_q=seqlen, seqlen_k=seqlen)
    s = FORWARD.default_schedule("sm_90", packed)
    want = (64, 128, 2, 1) if seqlen <= 2048 else (128, 128, 1, 1)
    assert (s.tile_m, s.tile_n, s.occupancy, s.num_ctas) == want
    assert s.kv_sawtooth is (seqlen <= 512)
    rectangle = dataclasses.replace(packed, ragged=False)
    assert FORWARD.default_schedule("sm_90", rectangle).tile_m == 128
    # a head dim between 96 and 128 pads to 128 (two parts would pad as much): the same rule
    odd = FORWARD.default_schedule("sm_90", dataclasses.replace(packed, head_dim=112))
    assert not odd.split_d and (odd.tile_m == 64) is (seqlen <= 2048)
    # causal: the rectangle's tiles, with a packed batch's grouped heads in one tile
    causal = FORWARD.default_schedule("sm_90", dataclasses.replace(packed, causal=True))
    assert causal.pack_gqa and causal.replace(pack_gqa=False) == \
        FORWARD.default_schedule("sm_90", dataclasses.replace(rectangle, causal=True))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_packed_ranges_are_each_sequences_starts_and_ends(dtype):
    """Rows: query starts, query ends, key starts, key ends (int32, contiguous), empty
    sequences and int64 offsets included."""
    cu_q = torch.tensor([0, 3, 7, 7, 12], dtype=dtype)
    cu_k = torch.tensor([0, 5, 6, 9, 20], dtype=dtype)
    ranges = packed_ranges(cu_q, cu_k)
    want = torch.tensor([[0, 3, 7, 7], [3, 7, 7, 12], [0, 5, 6, 9], [5, 6, 9, 20]],
                        dtype=torch.int32)
    assert ranges.dtype == torch.int32 and ranges.is_contiguous()
    assert torch.equal(ranges, want)
    same = packed_ranges(cu_q, cu_q)  # one tensor for both: one copy
    assert torch.equal(same, torch.cat((want[:2], want[:2])))


def test_ragged_keeps_the_alignment_the_bounds_would_drop():
    """Each sequence aligns by its own lengths: bottom-right stays where S_q == S_k (a
    rectangle's canonical form drops it), and a window side stays even where it binds no key
    at the bounds."""
    p = _ragged(bottom_right=True, window_left=4096)
    assert p.bottom_right and p.window_left == 4096
    assert not dataclasses.replace(p, ragged=False).bottom_right
    assert p.to_dict()["ragged"] is True and "ragged" not in _ragged(ragged=False).to_dict()
    assert "ragged" in p.describe()
    assert "ragged" in Problem.VARIANT_FIELDS  # its own lookup bucket


# -- the forward's constants, normalisation and arguments ---------------------------------------
def test_ragged_constants():
    c = kernel_constants(_ragged(), Schedule(tile_m=64, tile_n=64), packed=True)
    assert (c["RAGGED"], c["PACKED"], c["EVEN_K"], c["CHECK_BOUNDS"]) == (True, True, False,
                                                                           True)
    plain = kernel_constants(_ragged(ragged=False), Schedule(), packed=True)
    assert (plain["RAGGED"], plain["PACKED"]) == (False, False)


def test_ragged_normalises_the_whole_length_orders_away():
    s = Schedule(tile_m=64, tile_n=64, persistent=True, paired_tiles=True, longest_first=True,
                 unchecked_loads=True, kv_sawtooth=True)
    n = normalise(_ragged(), s)
    assert not (n.persistent or n.paired_tiles or n.unchecked_loads)
    assert n.kv_sawtooth and n.longest_first  # orders the ragged grid keeps
    assert normalise(_ragged(ragged=False), s).persistent


def test_ragged_keys_load_by_row_so_their_transposed_order_normalises_away():
    """A ragged call reads its key tiles by row (a view of rows has no transposed order), so
    ``k_transposed`` compiles to nothing there; a dense call keeps it."""
    s = Schedule(tile_m=64, tile_n=64, k_transposed=True)
    assert normalise(_ragged(), s).k_transposed == Schedule().k_transposed
    assert normalise(_ragged(ragged=False), s).k_transposed


def test_ranges_go_with_a_ragged_problem_only():
    s = Schedule()
    with pytest.raises(KernelArgumentError, match="ranges must be given exactly"):
        kernel_args("q", "k", "v", "o", _ragged(), s, 0.1)
    with pytest.raises(KernelArgumentError, match="ranges must be given exactly"):
        kernel_args("q", "k", "v", "o", _ragged(ragged=False), s, 0.1, ranges="r")
    assert ragged_grid(128, 32, 5, 1000) == (8, 160, 1)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("fields", [dict(), dict(causal=False, heads_kv=32),
                                    dict(head_dim=96, heads_q=12, heads_kv=4),
                                    dict(causal=False, window_left=63, window_right=0)],
                         ids=["causal_gqa", "full_mha", "d96", "window"])
def test_the_ragged_forward_compiles(arch, fields):
    problem = _ragged(**fields)
    schedule = FORWARD.default_schedule(arch, problem)
    result = compile_schedule(problem, FORWARD.normalise(problem, schedule), arch)
    assert result.cubin[:4] == b"\x7fELF"


def test_on_sm_90_a_packed_forward_reads_its_rows_through_the_arrays_descriptors(tmp_path):
    """The packed forward loads each sequence's query and key rows by row from the uncut
    arrays (whose TMA descriptors the launch makes), the key tile that runs past the sequence
    too (the mask drops its scores by a select, whatever its rows hold), cuts a slice of V
    only for that tile's values (a descriptor the kernel builds: ``UTMACCTL.IV``; 0 * NaN is
    not 0) and stores through cuts without TMA. Read that key tile from a cut of K as well,
    as before 2026-12-04 (thirty-ninth session), and the kernel builds two a head-dim part;
    cut Q, K, V and Out per sequence, as before that, four."""
    from tiledattention.core._problem import head_dim_parts

    from .test_backward_atomic import _sass

    for fields in (dict(), dict(causal=False, heads_kv=32, head_dim=64),
                   dict(head_dim=96, heads_q=12, heads_kv=4)):
        problem = _ragged(**fields)
        schedule = FORWARD.normalise(problem, FORWARD.default_schedule("sm_90", problem))
        result = compile_schedule(problem, schedule, "sm_90", store_lse=True, work_table=True)
        sass = _sass(result.cubin, tmp_path / "kernel.cubin")
        assert "UTMALDG" in sass
        parts = 2 if head_dim_parts(problem.head_dim, schedule.split_d)[1] else 1
        assert sass.count("UTMACCTL.IV") <= parts, problem.describe()


@pytest.mark.parametrize("arch", ARCHS)
def test_the_ragged_forward_compiles_with_a_work_table(arch):
    from tiledattention.kernels.forward._compile import _export
    from tiledattention.kernels.forward._launch import kernel_for

    problem = _ragged()
    schedule = FORWARD.normalise(problem, FORWARD.default_schedule(arch, problem))
    constants = kernel_constants(problem, schedule, packed=True, work_table=True)
    assert constants["WORK_TABLE"]
    result = _export(problem, kernel_for(schedule), constants, arch, "work table")
    assert result.cubin[:4] == b"\x7fELF"


# -- the work table of a skewed batch -------------------------------------------------------------
def _ranges_of(q_lens, k_lens=None):
    k_lens = q_lens if k_lens is None else k_lens
    cq = torch.tensor([0] + list(q_lens)).cumsum(0)
    ck = torch.tensor([0] + list(k_lens)).cumsum(0)
    return torch.stack((cq[:-1], cq[1:], ck[:-1], ck[1:])).to(torch.int32)


@pytest.mark.parametrize("keys", [False, True])
@pytest.mark.parametrize("arch", ARCHS)
def test_the_work_table_kernel_compiles(arch, keys):
    from tiledattention.core._compile import array_constraint, export_cubin
    from tiledattention.core._work_kernel import fill_work_table
    from tiledattention.core._work_table import CHUNK

    result = export_cubin(fill_work_table, (array_constraint("int32", (4, 77)),
                                            array_constraint("int32", (2, 600)), 128, CHUNK,
                                            keys),
                          arch, "fill_work_table")
    assert result.cubin[:4] == b"\x7fELF"


def test_work_items_bound_the_tiles_of_any_lengths():
    # 3 sequences in 10 rows: at most 10 // 8 tiles and one partial tile each
    assert work_items(sequences=3, longest=8, rows=10, tile=8) == 3
    assert work_items(sequences=3, longest=9, rows=10, tile=8) == 3  # e.g. 9, 1, 0
    for lens in ([1, 1, 8], [8, 1, 1], [9, 1, 0], [4, 4, 2]):
        tiles = sum(-(-n // 8) for n in lens)
        assert tiles <= work_items(sequences=3, longest=max(lens), rows=10, tile=8)


def test_a_skewed_batch_walks_a_table_and_an_even_one_its_grid(launches):
    """Where the longest sequence's grid leaves at least TABLE_MIN_IDLE_CTAS idle, the launch
    is 1-D over (work item x head) and takes the table; an even batch keeps the 2-D grid."""
    from tiledattention.kernels.forward._launch import launch_ragged

    s = Schedule(tile_m=128, tile_n=64)
    heads = 32
    for lens, table in (([4096] + [100] * 76, True), ([1024] * 32, False)):
        tokens = sum(lens)
        q = torch.empty(1, heads, tokens, 128, dtype=torch.bfloat16)
        k = torch.empty(1, 8, tokens, 128, dtype=torch.bfloat16)
        problem = _ragged(batch=len(lens), seqlen_q=max(lens), seqlen_k=max(lens))
        launch_ragged(None, q, k, k, q, _ranges_of(lens), problem, s, 0.1, max(lens),
                      packed=True)
        _, grid, _, args = launches.pop()
        items = work_items(sequences=len(lens), longest=max(lens), rows=tokens, tile=128)
        assert use_work_table(sequences=len(lens), longest=max(lens), items=items,
                              heads=heads, tile=128) is table
        work = args[kernel_parameters().index("Work")]
        if table:  # the table's kernel first, on the same stream, one CTA per sequence + 1
            assert grid == (items * heads, 1, 1) and 32 + 76 <= items < 8 * 77
            assert isinstance(work, torch.Tensor) and work.shape == (2, items)
            _, table_grid, _, table_args = launches.pop()
            assert table_grid == (len(lens) + 1,) and table_args[1] is work
        else:
            assert grid == (8, 32 * heads, 1) and work == ()
        assert not launches
    assert TABLE_MIN_IDLE_CTAS > 0


def test_more_sequences_than_a_grid_dimension_holds_walk_a_table(launches, monkeypatch):
    """Sequences x heads past a grid's second dimension (65535): the launch walks a table
    whatever the threshold, an even batch of short sequences included."""
    import tiledattention.core._work_table as work_table
    from tiledattention.kernels.forward._launch import launch_ragged

    monkeypatch.setattr(work_table, "TABLE_MIN_IDLE_CTAS", 1 << 62)
    lens = [20] * 4097  # x 16 query heads: 65552 CTAs
    tokens = sum(lens)
    q = torch.empty(1, 16, tokens, 64, dtype=torch.bfloat16)
    k = torch.empty(1, 4, tokens, 64, dtype=torch.bfloat16)
    problem = _ragged(batch=4096, heads_q=16, heads_kv=4, seqlen_q=32, seqlen_k=32, head_dim=64)
    launch_ragged(None, q, k, k, q, _ranges_of(lens), problem, Schedule(tile_m=64, tile_n=64),
                  0.1, max(lens), packed=True)
    _, grid, _, _ = launches.pop()
    assert grid == (len(lens) * 16, 1, 1)
    _, table_grid, _, _ = launches.pop()
    assert table_grid == (len(lens) + 1,) and not launches


def test_a_prepared_ragged_launch_takes_each_calls_own_arrays(launches):
    """The ragged launch is prepared once per problem, schedule and counts (cached), and every
    call launches with its own arrays in their parameters' places: a second call with other
    tensors, ranges and log-sum-exp gets those, never the first call's, and a new work table."""
    from tiledattention.kernels.forward._launch import launch_ragged

    names = kernel_parameters()
    lens = [4096] + [100] * 76  # skewed: a work table
    problem = _ragged(batch=len(lens), seqlen_q=4096, seqlen_k=4096)
    seen = []
    for _ in range(2):
        q = torch.empty(1, 32, sum(lens), 128, dtype=torch.bfloat16)
        k, v, out = torch.empty_like(q[:, :8]), torch.empty_like(q[:, :8]), torch.empty_like(q)
        lse, ranges = torch.empty(1, 32, sum(lens)), _ranges_of(lens)
        launch_ragged(None, q, k, v, out, ranges, problem, Schedule(tile_m=128, tile_n=64), 0.1,
                      4096, packed=True, lse=lse)
        _, _, _, args = launches.pop()
        _, _, _, table_args = launches.pop()
        for name, x in (("Q", q), ("K", k), ("V", v), ("Out", out), ("Lse", lse),
                        ("Ranges", ranges), ("Work", table_args[1])):
            assert args[names.index(name)] is x, name
        assert table_args[0] is ranges
        seen.append(args[names.index("Work")])
    assert seen[0] is not seen[1]


def test_a_work_table_comes_with_ranges_only():
    with pytest.raises(KernelArgumentError, match="work table comes only with"):
        kernel_args("q", "k", "v", "o", _ragged(ragged=False), Schedule(), 0.1, work="w")


# -- argument errors ----------------------------------------------------------------------------
def test_cupy_calls_take_cupy_arrays_only():
    pytest.importorskip("cupy")
    fake = type("ndarray", (), {"__module__": "cupy._core.core"})()  # a CuPy-looking query
    q, k, v, cu_q, cu_k = _packed()
    with pytest.raises(tiledattention.InputTypeError, match="query must be a cupy.ndarray"):
        tiledattention.varlen_attn(fake, k, v, cu_q, cu_k, 15, 15)


def _packed(tokens=40, hq=4, hkv=4, d=64, dtype=torch.bfloat16):
    make = lambda t, h: torch.randn(t, h, d, dtype=dtype)  # noqa: E731
    cu = torch.tensor([0, 10, 25, tokens], dtype=torch.int32)
    return make(tokens, hq), make(tokens, hkv), make(tokens, hkv), cu, cu


BAD = {
    "cpu": (dict(), {}, ValueError, "query must be a CUDA tensor"),
    "dims": (dict(q=torch.randn(1, 40, 4, 64, dtype=torch.bfloat16)), {}, ValueError,
             "query must have 3 dims"),
    "dtype": (dict(q=torch.randn(40, 4, 64)), {}, TypeError, "bfloat16 or float16"),
    "gqa": (dict(k=torch.randn(40, 2, 64, dtype=torch.bfloat16),
                 v=torch.randn(40, 2, 64, dtype=torch.bfloat16)), {}, ValueError,
            "enable_gqa=True"),
    "offsets dtype": (dict(cu_q=torch.tensor([0.0, 40.0])), {}, ValueError,
                      "cu_seq_q must be a 1-dim int32"),
    "offsets lengths": (dict(cu_k=torch.tensor([0, 40], dtype=torch.int32)), {}, ValueError,
                        "one length"),
    "max_q": (dict(max_q=0), {}, ValueError, "max_q must be at least 1"),
    "max_k type": (dict(max_k=3.0), {}, TypeError, "max_k must be an int"),
    "is_causal": (dict(), {"is_causal": "yes"}, ValueError, "is_causal must be"),
    "scale": (dict(), {"scale": -1.0}, ValueError, "scale must be a finite"),
    "window": (dict(), {"window_size": (-2, 0)}, ValueError, "window's left side"),
    "enable_gqa type": (dict(), {"enable_gqa": torch.tensor([1, 0])}, TypeError,
                        "enable_gqa must be a bool; got Tensor"),
    "paged key type": (dict(k="pages"), {"block_table": torch.zeros(3, 1, dtype=torch.int32),
                                         "seqused_k": torch.tensor([10, 15, 15],
                                                                   dtype=torch.int32)},
                       TypeError, "key must be a torch.Tensor like query; got str"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_varlen_attn_errors_name_the_argument(name, launches):
    change, kwargs, error, message = BAD[name]
    q, k, v, cu_q, cu_k = _packed()
    args = dict(q=q, k=k, v=v, cu_q=cu_q, cu_k=cu_k, max_q=15, max_k=15, **{})
    args.update(change)
    with pytest.raises(error, match=message) as raised:
        tiledattention.varlen_attn(args["q"], args["k"], args["v"], args["cu_q"], args["cu_k"],
                                   args["max_q"], args["max_k"], **kwargs)
    assert isinstance(raised.value, tiledattention.TiledAttentionError)
    assert launches == []


def test_explain_varlen_names_a_flag_that_is_not_a_bool():
    q, k, v, cu_q, cu_k = _packed(hq=4, hkv=2)
    for flag in ("enable_gqa", "training"):
        with pytest.raises(tiledattention.InputTypeError,
                           match=f"^{flag} must be a bool; got Tensor$"):
            tiledattention.explain_varlen(q, k, v, cu_q, cu_k, 15, 15,
                                          **{flag: torch.tensor([1, 0])})


def test_grouped_heads_need_enable_gqa_with_gradients_too(launches):
    """The training route (inputs that require grad) refuses grouped heads without
    enable_gqa=True as the forward-only route does, rather than running them."""
    q, k, v, cu_q, cu_k = _packed(hq=4, hkv=2)
    q.requires_grad_()
    with pytest.raises(tiledattention.InputValueError, match="pass enable_gqa=True"):
        tiledattention.varlen_attn(q, k, v, cu_q, cu_k, 15, 15)
    with pytest.raises(tiledattention.InputValueError, match="query must be a CUDA tensor"):
        tiledattention.varlen_attn(q, k, v, cu_q, cu_k, 15, 15, enable_gqa=True)
    assert launches == []


def test_sdpa_ranges_errors(launches):
    q = torch.randn(2, 4, 8, 64, dtype=torch.bfloat16)
    good = torch.zeros(4, 2, dtype=torch.int32)
    for bad in (good.long(), good[:, :1], [[0, 8]] * 4):
        with pytest.raises(tiledattention.InputValueError, match="ranges must be an int32"):
            tiledattention.sdpa(q, q, q, True, ranges=bad)
    with pytest.raises(tiledattention.InputValueError, match="q must be a CUDA tensor"):
        tiledattention.sdpa(q, q, q, True, ranges=good)
    with pytest.raises(tiledattention.InputValueError, match=r"q must have 4 dims .* got shape "
                       r"\(1, 2, 4, 8, 64\)"):  # q's shape named, not a batch of None
        tiledattention.sdpa(q[None], q[None], q[None], True, ranges=good)
    assert launches == []


def test_a_ranged_call_that_repeats_a_signature_runs_the_kept_plan_with_its_ranges():
    """``sdpa(ranges=)``'s warm path (a static cache's decode steps): a call whose signature a
    kept plan answers runs it unvalidated with its own ranges (CPU tensors would fail
    validation); a call that needs a gradient is another signature and is refused."""
    from tiledattention.core import _plans as hot
    from tiledattention.entry_points._varlen import padded_forward

    class Runtime:
        def __init__(self):
            self.plans = {}

        def plan(self, key):
            return self.plans.get(key)

    class Kept:
        ranges = []

        def run(self, runtime, q, k, v, device, out, *, ranges):
            self.ranges.append(ranges)
            return "kept plan's output"

    q = torch.randn(3, 8, 1, 64, dtype=torch.bfloat16)
    k = torch.randn(3, 2, 40, 64, dtype=torch.bfloat16)
    runtime = Runtime()
    first = torch.tensor([[0] * 3, [1] * 3, [0, 5, 9], [40, 30, 9]], dtype=torch.int32)
    runtime.plans[hot.warm_key("ranged", (q, k, k, first), "bottom_right", None, None,
                               None)] = Kept()
    for ranges in (first, first.flip(1).contiguous()):
        assert padded_forward(runtime, q, k, k, "bottom_right", None, ranges) == \
            "kept plan's output"
    assert Kept.ranges[0] is first and Kept.ranges[1] is ranges
    with pytest.raises(tiledattention.UnsupportedOperationError, match="no autograd"):
        padded_forward(runtime, q.requires_grad_(), k, k, "bottom_right", None, first)
    with pytest.raises(tiledattention.InputValueError, match="q must be a CUDA tensor"):
        padded_forward(runtime, q.detach(), k, k, "bottom_right", 0.5, first)  # another key


# -- ops, case, reference -----------------------------------------------------------------------
def test_the_ops_fakes_give_the_real_shapes_and_strides():
    from tiledattention.entry_points import _varlen

    with FakeTensorMode():
        q = torch.empty(45, 8, 64, dtype=torch.bfloat16)
        k = torch.empty(50, 2, 64, dtype=torch.bfloat16)
        cu = torch.empty(4, dtype=torch.int32)
        out, lse = torch.ops.tiledattention.varlen_fwd(q, k, k, cu, cu, 20, 20, True, True,
                                                       None, -1, -1)
        assert out.shape == q.shape and out.is_contiguous()
        assert lse.shape == (1, 8, 45) and lse.stride() == (8 * 64, 64, 1)
        dq, dk, dv = torch.ops.tiledattention.varlen_bwd(out, q, k, k, out, lse, cu, cu, 20, 20,
                                                         True, True, None, -1, -1)
        assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, k.shape)
    assert _varlen.FWD_OP_NAME == "tiledattention::varlen_fwd"


def test_the_ragged_case_mixes_lengths():
    p = _ragged(batch=6, seqlen_q=1024, seqlen_k=1024)
    assert ragged_lengths(p) == [1024, 768, 512, 256, 1024, 768]
    pairs = sum(n * (n + 1) // 2 for n in ragged_lengths(p))
    assert ragged_flops(p) == 4.0 * 32 * 128 * pairs
    assert FORWARD.flops(p) == ragged_flops(p)


@pytest.mark.parametrize("bottom_right", [True, False])
def test_the_reference_attends_each_sequence_alone(bottom_right):
    gen = torch.Generator().manual_seed(0)
    cu_q = torch.tensor([0, 3, 3, 10], dtype=torch.int32)
    cu_k = torch.tensor([0, 5, 9, 16], dtype=torch.int32)
    q = torch.randn(12, 2, 32, generator=gen)
    k = torch.randn(16, 1, 32, generator=gen)
    v = torch.randn(16, 1, 32, generator=gen)
    out = varlen_reference(q, k, v, cu_q, cu_k, causal=True, bottom_right=bottom_right)
    assert torch.equal(out[10:], torch.zeros_like(out[10:]))  # no sequence
    for (q0, q1), (k0, k1) in (((0, 3), (0, 5)), ((3, 10), (9, 16))):
        lq, lk = q1 - q0, k1 - k0
        off = lk - lq if bottom_right else 0
        mask = torch.arange(lk)[None, :] <= torch.arange(lq)[:, None] + off
        want = F.scaled_dot_product_attention(
            q[q0:q1].transpose(0, 1), k[k0:k1].transpose(0, 1).expand(2, -1, -1),
            v[k0:k1].transpose(0, 1).expand(2, -1, -1), attn_mask=mask).transpose(0, 1)
        assert torch.allclose(out[q0:q1], want, atol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_the_uncovered_rows_kernels_compile(arch):
    """The forward's clear of its output's uncovered rows, and the backward's prologue (work
    tables and the gradients' clears in one launch), two-kernel and one-pass, both dtypes."""
    from tiledattention.core._compile import capturing
    from tiledattention.entry_points._ragged_fill import compile_clear
    from tiledattention.kernels.backward._compile import compile_prologue
    from tiledattention.kernels.backward._schedule import BackwardSchedule

    for dtype, head_dim in (("bf16", 64), ("fp16", 96)):
        problem = Problem(batch=8, heads_q=8, heads_kv=2, seqlen_q=512, seqlen_k=512,
                          head_dim=head_dim, dtype=dtype, causal=True, ragged=True)
        with capturing() as builds:
            compile_clear(problem, arch)
        assert [b[3][:4] for b in builds] == [b"\x7fELF"]
        for mode in ("kernel", "atomic"):
            result = compile_prologue(problem, BackwardSchedule(dq_mode=mode), arch)
            assert result.cubin[:4] == b"\x7fELF"



def test_the_decode_family_takes_a_ragged_batch_bottom_right_only():
    """The split-KV kernels take a padded batch's ranges with the queries the last positions of
    each entry's keys (bottom-right, or no mask); a top-left one is the forward's."""
    from tiledattention import DECODE, UnsupportedProblemError
    from tiledattention.kernels.decode._compile import compile_decode

    bottom_right = _ragged(batch=4, seqlen_q=2, seqlen_k=4096, bottom_right=True)
    assert DECODE.takes("sm_90", bottom_right) and bottom_right.causal
    assert DECODE.takes("sm_90", _ragged(seqlen_q=1, causal=False))
    top_left = _ragged(batch=4, seqlen_q=2, seqlen_k=4096)
    assert not DECODE.takes("sm_90", top_left)
    for call in (lambda: DECODE.default_schedule("sm_90", top_left),
                 lambda: DECODE.compile(top_left, DECODE.default_schedule(
                     "sm_90", bottom_right), "sm_90")):
        with pytest.raises(UnsupportedProblemError, match="bottom-right only"):
            call()
    with pytest.raises(UnsupportedProblemError, match="no tuner case"):
        DECODE.case(bottom_right, 0)
    for arch in ARCHS:
        result = compile_decode(bottom_right, DECODE.default_schedule(arch, bottom_right), arch)
        assert result.cubin[:4] == b"\x7fELF"


def _stand_in_launches(monkeypatch, prepared):
    """``_varlen``'s validation counted into ``prepared`` and its launches replaced by CPU
    stand-ins (the real validation runs; devices and the lookup are stood in for)."""
    from tiledattention.core import _runtime
    from tiledattention.entry_points import _varlen

    real_prepare = _varlen._prepare

    def prepare(query, key, value, cu_q, cu_k, max_q, max_k, is_causal, scale, window, gqa):
        prepared.append((is_causal, scale, window, gqa))
        return real_prepare(query, key, value, cu_q, cu_k, max_q, max_k, is_causal, scale,
                            window, gqa)

    def run_forward(runtime, query, key, value, packed, layout):
        assert layout.ranges.shape == (4, 2) and layout.longest_q == packed.longest_q
        return (query * packed.scale + key.sum(),
                torch.zeros(1, query.shape[1], query.shape[0]))

    def run_backward(runtime, grad_out, query, key, value, out, lse, packed, layout):
        assert layout.ranges.shape == (4, 2)
        return grad_out * packed.scale, torch.ones_like(key), torch.ones_like(value) * 2
    monkeypatch.setattr(_varlen, "check_cuda", lambda arrays, kind: None)
    monkeypatch.setattr(_varlen, "_prepare", prepare)
    monkeypatch.setattr(_varlen, "_run_forward", run_forward)
    monkeypatch.setattr(_varlen, "_run_backward", run_backward)
    monkeypatch.setattr(_runtime, "current", None)  # a fresh runtime: no kept calls


def test_an_eager_packed_training_call_takes_the_eager_route_and_validates_once(monkeypatch):
    """varlen_attn on inputs that need grad, eagerly: the autograd Function (no op dispatched),
    whose backward reuses what its forward validated, and a second step of the same signature
    validates nothing (the kept call); under a dispatch mode, the op. The launches are replaced
    by CPU stand-ins."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from tiledattention.entry_points import _varlen

    prepared = []
    _stand_in_launches(monkeypatch, prepared)
    real = _varlen.varlen_fwd

    def op_must_not_run(*args):
        raise AssertionError("the op was dispatched for an untraced eager call")
    monkeypatch.setattr(_varlen, "varlen_fwd", op_must_not_run)
    bf16 = torch.bfloat16
    q = torch.randn(10, 4, 32, dtype=bf16).requires_grad_()
    k, v = (torch.randn(10, 2, 32, dtype=bf16).requires_grad_() for _ in range(2))
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    scale = 1 / math.sqrt(32)
    for step in range(2):
        out = tiledattention.varlen_attn(q, k, v, cu, cu, 6, 6, is_causal=True,
                                         enable_gqa=True, window_size=(3, 0))
        assert type(out.grad_fn).__name__ == "_EagerVarlenBackward"
        g = torch.randn_like(out)
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), g)
        assert torch.allclose(dq, g * scale) and torch.equal(dv, torch.full_like(v, 2.0))
    # once in two steps: the backward and the second step reused the first validation
    assert prepared == [("bottom_right", None, (3, 0), True)]
    monkeypatch.setattr(_varlen, "varlen_fwd", real)
    seen = []

    class Recording(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))
    with Recording():
        traced = tiledattention.varlen_attn(q, k, v, cu, cu, 6, 6, is_causal=True,
                                            enable_gqa=True, window_size=(3, 0))
    assert torch.ops.tiledattention.varlen_fwd.default in seen
    assert torch.equal(traced, out)


@pytest.mark.parametrize("change", ["max_q", "causal", "scale", "dtype", "offsets",
                                    "two offsets tensors", "tokens", "strides", "scale type"])
def test_a_packed_call_of_another_signature_is_validated_again(monkeypatch, change):
    """The warm path's key holds every fact validation judged: a call that differs from a kept
    one in any of them is validated (and a bad one refused) instead of reusing the kept call."""
    prepared = []
    _stand_in_launches(monkeypatch, prepared)
    q = torch.randn(10, 4, 32, dtype=torch.bfloat16)
    k, v = torch.randn_like(q[:, :2]), torch.randn_like(q[:, :2])
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    args = dict(query=q, key=k, value=v, cu_seq_q=cu, cu_seq_k=cu, max_q=6, max_k=6)
    kwargs = dict(is_causal=True, enable_gqa=True, scale=0.25)
    tiledattention.varlen_attn(*args.values(), **kwargs)
    tiledattention.varlen_attn(*args.values(), **kwargs)
    assert len(prepared) == 1
    if change == "max_q":
        args["max_q"] = 7
    elif change == "causal":
        kwargs["is_causal"] = False
    elif change == "scale":
        kwargs["scale"] = 0.5
    elif change == "scale type":  # 1 == 1.0 hash alike; validation judges each
        kwargs["scale"] = True
    elif change == "dtype":
        args.update(query=q.half(), key=k.half(), value=v.half())
    elif change == "offsets":
        args.update(cu_seq_q=cu.long(), cu_seq_k=cu.long())
    elif change == "two offsets tensors":  # equal values, but they could differ
        args.update(cu_seq_k=cu.clone())
    elif change == "tokens":
        args.update(query=torch.randn(12, 4, 32, dtype=torch.bfloat16))
    elif change == "strides":
        args.update(key=torch.randn(10, 32, 2, dtype=torch.bfloat16).transpose(1, 2))
    if change in ("strides", "scale type"):
        with pytest.raises(tiledattention.TiledAttentionError):
            tiledattention.varlen_attn(*args.values(), **kwargs)
    else:
        tiledattention.varlen_attn(*args.values(), **kwargs)
    assert len(prepared) == 2


@pytest.mark.parametrize("is_causal", [True, "top_left", "bottom_right"])
def test_one_offsets_tensor_takes_the_bottom_right_bucket(monkeypatch, is_causal):
    """Queries and keys cut by one offsets tensor have as many of each in every sequence, where
    the two alignments are one mask: the call takes the bottom-right bucket (the shipped causal
    ragged rows' key) whichever was asked. Two tensors keep the alignment asked (their
    sequences may differ)."""
    from tiledattention.entry_points import _varlen

    _stand_in_launches(monkeypatch, [])
    problems = []
    stand_in = _varlen._run_forward

    def run_forward(runtime, query, key, value, packed, layout):
        problems.append(packed.problem)
        return stand_in(runtime, query, key, value, packed, layout)
    monkeypatch.setattr(_varlen, "_run_forward", run_forward)
    q = torch.randn(10, 4, 32, dtype=torch.bfloat16)
    k, v = torch.randn_like(q), torch.randn_like(q)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    for cu_k in (cu, cu.clone()):
        tiledattention.varlen_attn(q, k, v, cu, cu_k, 6, 6, is_causal=is_causal)
    shared, separate = problems
    assert shared.causal and separate.causal
    assert shared.bottom_right
    assert separate.bottom_right == (is_causal != "top_left")
    assert dataclasses.replace(shared, bottom_right=separate.bottom_right) == separate
