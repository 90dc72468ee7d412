"""A persistent paged decode over a flat work list (issue 49, the "Next hypotheses" entry of
the thirty-third session; record: ``docs/records/benchmarks/paged/issue49/README.md``,
section 31): every CTA of one wave takes an equal share of the batch's (row, key tile) items;
a row inside one CTA's share is written by it, a row cut by share boundaries leaves a partial
in slot ``row + cta`` for the merge. The prefix and merge kernels are the product's
(``tiledattention/kernels/decode/_flat_kernel.py``); the split kernel here is the experiment's,
with ``TMA`` choosing TMA or plain loads of q and stores (TMA: the form that hangs at two CTAs
an SM; the product's stores are plain).

    source .devtk/setup.sh && python3 docs/records/probes/paged_flat.py --diag STAGE [--occ 2]
        [--edges] [--tma]            # prefix | split | merge, synchronised, on one batch
    source .devtk/setup.sh && python3 docs/records/probes/paged_flat.py            # one CTA an SM, TMA
    source .devtk/setup.sh && python3 docs/records/probes/paged_flat.py --deep     # the same, deeper
    source .devtk/setup.sh && python3 docs/records/probes/paged_flat.py --occ2     # two CTAs an SM
    source .devtk/setup.sh && python3 docs/records/probes/paged_flat.py --held     # the product default
    source .devtk/setup.sh && python3 docs/records/probes/paged_flat.py --check    # errors only

Interleaved against the default, the L2 flushed before each sample; shares of the device
copy rate (same run) on the valid K/V bytes read once; every form's error also with its
scratch NaN-filled before the call.
"""

import math
import sys

import cuda.tile as ct
import numpy as np
import torch

import paged_balance
import tiledattention as ta
from tiledattention.core import _case
from tiledattention.core._problem import padded_head_dim, page_tile
from tiledattention.kernel_core.numbers import LOG2_E, NEG_BIG
from tiledattention.kernel_core.ranges import page_rows
from tiledattention.kernel_core.softmax import log_sum_exp, normalised, online_softmax
from tiledattention.kernels.decode._flat_kernel import _row_of, flat_merge, flat_prefix
from tiledattention.kernels.decode._launch import grouped_view, layout, normalise

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]


@ct.kernel
def flat_split(Q, K, V, Out, Opart, Lse, Cu, Lens, Pages, qk_scale: float, kv_div: int,
               TILE_G: ConstInt, TILE_S: ConstInt, TILE_N: ConstInt, TILE_D: ConstInt,
               PAGE_ROWS: ConstInt, K_LATENCY: ConstInt, V_LATENCY: ConstInt,
               B_PAD: ConstInt, CAUSAL: ConstBool, TMA: ConstBool):
    TILE_M = ct.static_eval(TILE_G * TILE_S)
    PAD = ct.static_eval(ct.PaddingMode.ZERO)
    heads = Q.shape[1]
    q_tiles = ct.cdiv(Q.shape[3], TILE_S)
    rows_per_entry = heads * q_tiles
    n = Q.shape[0]
    total = ct.gather(Cu, n)
    cta = ct.bid(0)
    per = ct.cdiv(total, ct.num_blocks(0))
    lo = min(cta * per, total)
    hi = min(lo + per, total)
    first_row = _row_of(Cu, max(min(lo, total - 1), 0), B_PAD, n, rows_per_entry)
    last_row = _row_of(Cu, max(hi - 1, 0), B_PAD, n, rows_per_entry)
    segments = max(last_row - first_row + 1, 0)
    if lo >= hi:
        segments = 0
    scale = qk_scale * LOG2_E
    cap = Pages.shape[1] * K.shape[1]
    for seg in range(segments):
        row = first_row + seg
        entry = row // rows_per_entry
        within = row % rows_per_entry
        head = within // q_tiles
        q_tile = within % q_tiles
        kv_head = head // kv_div
        base = ct.gather(Cu, entry)
        tiles = (ct.gather(Cu, entry + 1) - base) // rows_per_entry
        row_lo = base + within * tiles
        row_hi = row_lo + tiles
        start = max(lo, row_lo) - row_lo
        stop = min(hi, row_hi) - row_lo
        seqlen_k = min(ct.gather(Lens, entry), cap)
        offset = seqlen_k - Q.shape[3]
        first_pos = q_tile * TILE_S
        positions = first_pos + ct.arange(TILE_M, dtype=np.int32)[:, None] % TILE_S
        visible = seqlen_k
        if CAUSAL:
            visible = min(seqlen_k, max(first_pos + offset + 1, 0))
        clean = min(max(visible // TILE_N, start), stop)
        q = ct.load(Q, index=(entry, head, 0, q_tile, 0), shape=(1, 1, TILE_G, TILE_S, TILE_D),
                    padding_mode=PAD, allow_tma=TMA).reshape((TILE_M, TILE_D))
        m_i = ct.full((TILE_M, 1), NEG_BIG, dtype=np.float32)
        l_i = ct.full((TILE_M, 1), 0.0, dtype=np.float32)
        acc = ct.full((TILE_M, TILE_D), 0.0, dtype=np.float32)
        for j in range(start, clean):
            k = ct.transpose(page_rows(K, Pages, entry, kv_head, j, 0, TILE_N, PAGE_ROWS,
                                       width=TILE_D, latency=K_LATENCY, PAD=PAD,
                                       page_size=K.shape[1]))
            qk = ct.mma(q, k, ct.full((TILE_M, TILE_N), 0.0, dtype=np.float32))
            p, m_i, l_i, alpha = online_softmax(qk, m_i, l_i, scale, True, prescaled=False)
            v = page_rows(V, Pages, entry, kv_head, j, 0, TILE_N, PAGE_ROWS, width=TILE_D,
                          latency=V_LATENCY, PAD=PAD, page_size=V.shape[1])
            acc = ct.mma(p.astype(v.dtype), v, acc * alpha)
        for j in range(clean, stop):
            k = ct.transpose(page_rows(K, Pages, entry, kv_head, j, 0, TILE_N, PAGE_ROWS,
                                       width=TILE_D, latency=K_LATENCY, PAD=PAD,
                                       page_size=K.shape[1]))
            qk = ct.mma(q, k, ct.full((TILE_M, TILE_N), 0.0, dtype=np.float32))
            keys = j * TILE_N + ct.arange(TILE_N, dtype=np.int32)[None, :]
            keep = keys < seqlen_k
            if CAUSAL:
                keep = keep & (keys <= positions + offset)
            qk = ct.where(keep, qk, -np.inf)
            p, m_i, l_i, alpha = online_softmax(qk, m_i, l_i, scale, True, prescaled=False)
            v = page_rows(V, Pages, entry, kv_head, j, 0, TILE_N, PAGE_ROWS, width=TILE_D,
                          latency=V_LATENCY, PAD=PAD, page_size=V.shape[1])
            key_rows = j * TILE_N + ct.arange(TILE_N, dtype=np.int32)[:, None]
            v = ct.where(key_rows < seqlen_k, v, 0.0)
            acc = ct.mma(p.astype(v.dtype), v, acc * alpha)
        out = normalised(acc, l_i)
        if (row_lo >= lo) & (row_hi <= hi):
            ct.store(Out, index=(entry, head, 0, q_tile, 0),
                     tile=out.astype(Out.dtype).reshape((1, 1, TILE_G, TILE_S, TILE_D)),
                     allow_tma=TMA)
        else:
            lse = log_sum_exp(m_i, l_i, True, -np.inf)
            ct.store(Opart, index=(row + cta, 0, 0), tile=out.reshape((1, TILE_M, TILE_D)),
                     allow_tma=TMA)
            ct.store(Lse, index=(row + cta, 0), tile=lse.reshape((1, TILE_M)),
                     allow_tma=TMA)


class FlatPlan:
    """The flat launches of ``problem`` with ``schedule``'s tiles, loads and occupancy."""

    def __init__(self, problem, schedule, occupancy=1, waves=1, sms=132, tma=False):
        schedule = normalise(problem, schedule)
        self.tiles = layout(problem, schedule)
        self.problem = problem
        self.ctas = sms * occupancy * waves
        self.split = flat_split.replace_hints(occupancy=occupancy,
                                              num_worker_warps=schedule.num_worker_warps)
        self.tile_d = padded_head_dim(problem.head_dim)
        self.tile_n = schedule.tile_n
        self.b_pad = max(64, 1 << problem.batch.bit_length())  # > batch: Cu's batch + 1 values fit
        self.constants = (self.tiles.tile_g, self.tiles.tile_s, schedule.tile_n, self.tile_d,
                          min(schedule.tile_n, page_tile(problem.page_size)),
                          schedule.k_latency or 0, schedule.v_latency or 0, self.b_pad,
                          problem.causal, tma)
        self.chunk = min(self.tile_d, 32)
        self.scale = 1.0 / math.sqrt(problem.head_dim)
        rows = self.tiles.rows
        self.slots = rows + self.ctas
        self.rows_per_entry = rows // problem.batch

    def buffers(self):
        m = self.tiles.tile_m
        return (torch.empty(self.problem.batch + 1, dtype=torch.int32, device="cuda"),
                torch.empty(self.slots, m, self.tile_d, dtype=torch.float32, device="cuda"),
                torch.empty(self.slots, m, dtype=torch.float32, device="cuda"))

    def __call__(self, q, k_pages, v_pages, out, lens, table, buffers=None):
        cu, opart, lse = buffers or self.buffers()
        stream = torch.cuda.current_stream()
        cap = table.shape[1] * k_pages.shape[1]
        ct.launch(stream, (1, 1, 1), flat_prefix,
                  (lens, cu, cap, self.rows_per_entry, self.tile_n, self.b_pad))
        q5, out5 = grouped_view(q, self.tiles), grouped_view(out, self.tiles)
        ct.launch(stream, (self.ctas, 1, 1), self.split,
                  (q5, k_pages, v_pages, out5, opart, lse, cu, lens, table, self.scale,
                   self.tiles.kv_div, *self.constants))
        ct.launch(stream, (self.tiles.rows, self.tile_d // self.chunk, 1), flat_merge,
                  (opart, lse, out5, cu, self.ctas, self.tiles.tile_g, self.tiles.tile_s,
                   self.chunk, 4))


def edge_lengths(problem):
    """Lengths of 2, 1, a page, a page + 1, a tile, and the longest, cycling."""
    page = problem.page_size
    pick = (2, 1, page, page + 1, 63, 64, 65, problem.seqlen_k, 3 * page - 1)
    return [max(problem.seqlen_q, min(n, problem.seqlen_k))
            for n in (pick[i % len(pick)] for i in range(problem.batch))]


MIXES = {"cycling": _case.paged_lengths, "log-uniform": paged_balance.log_uniform}

POINTS = ((16, 32, 8, 12000, 16), (24, 28, 4, 8000, 32), (8, 32, 8, 30000, 64),
          (40, 32, 8, 5000, 16), (12, 64, 8, 16000, 128), (64, 16, 2, 4000, 16))
CHECK_POINTS = ((9, 32, 8, 3000, 16), (13, 28, 4, 2000, 32), (5, 16, 16, 5000, 64),
                (27, 8, 1, 700, 16))


def diag(stage):
    """One stage of the flat launches on a small batch, synchronised (``--diag prefix|split|
    merge``): the prefix against torch's cumsum; the split and merge on torch's offsets."""
    p = ta.Problem(batch=9, heads_q=32, heads_kv=8, seqlen_q=1, seqlen_k=3000, head_dim=128,
                   dtype="bf16", causal=True, bottom_right=True, ragged=True, page_size=16)
    d = ta.DECODE.default_schedule("sm_90", p)
    if "--edges" in sys.argv:
        _case.paged_lengths = edge_lengths
    case = ta.DECODE.case(p, 0)
    occupancy = int(sys.argv[sys.argv.index("--occ") + 1]) if "--occ" in sys.argv else 1
    plan = FlatPlan(p, d, occupancy, tma="--tma" in sys.argv)
    cu, opart, lse = plan.buffers()
    items = (case.seqused + plan.tile_n - 1) // plan.tile_n * plan.rows_per_entry
    want = torch.cat((items.new_zeros(1), items.cumsum(0))).to(torch.int32)
    stream = torch.cuda.current_stream()
    if stage == "prefix":
        cap = case.table.shape[1] * case.k_pages.shape[1]
        ct.launch(stream, (1, 1, 1), flat_prefix,
                  (case.seqused, cu, cap, plan.rows_per_entry, plan.tile_n, plan.b_pad))
        torch.cuda.synchronize()
        print("prefix", cu.tolist(), "want", want.tolist(), flush=True)
        return
    cu.copy_(want)
    case.out.fill_(float("nan"))
    q5, out5 = grouped_view(case.q, plan.tiles), grouped_view(case.out, plan.tiles)
    ct.launch(stream, (plan.ctas, 1, 1), plan.split,
              (q5, case.k_pages, case.v_pages, out5, opart, lse, cu, case.seqused, case.table,
               plan.scale, plan.tiles.kv_div, *plan.constants))
    torch.cuda.synchronize()
    print("split ran; lengths", case.seqused.tolist(), "rows written", int((~case.out.isnan()).any(-1).sum()), flush=True)
    if stage == "merge":
        ct.launch(stream, (plan.tiles.rows, plan.tile_d // plan.chunk, 1), flat_merge,
                  (opart, lse, out5, cu, plan.ctas, plan.tiles.tile_g, plan.tiles.tile_s,
                   plan.chunk, 4))
        torch.cuda.synchronize()
        err = (torch.linalg.vector_norm(case.out.float() - case.reference)
               / torch.linalg.vector_norm(case.reference)).item()
        print("merge ran; error", err, flush=True)


def first_forms(p, d):
    """The first run's: the default's tiles and loads at one CTA an SM, two waves of it,
    and loads six steps ahead."""
    return {"flat": FlatPlan(p, d, tma=True), "flat x2": FlatPlan(p, d, waves=2, tma=True),
            "flat K6V6": FlatPlan(p, d.replace(k_latency=6, v_latency=6), tma=True)}


def deep_forms(p, d):
    """``--deep``: loads eight and ten steps ahead, two waves with six, 128-key steps."""
    return {"flat K8V8": FlatPlan(p, d.replace(k_latency=8, v_latency=8), tma=True),
            "flat K10V10": FlatPlan(p, d.replace(k_latency=10, v_latency=10), tma=True),
            "flat x2 K6V6": FlatPlan(p, d.replace(k_latency=6, v_latency=6), waves=2, tma=True),
            "flat n128 K6V6": FlatPlan(p, d.replace(tile_n=128, k_latency=6, v_latency=6),
                                       tma=True)}


def occ2_forms(p, d):
    """``--occ2``: two CTAs an SM (the stores not by TMA, so the kernel keeps two warpgroups
    and its register budget), loads four, six and eight steps ahead."""
    return {"flat occ2": FlatPlan(p, d, 2),
            "flat occ2 K6V6": FlatPlan(p, d.replace(k_latency=6, v_latency=6), 2),
            "flat occ2 K8V8": FlatPlan(p, d.replace(k_latency=8, v_latency=8), 2)}


FORMS = {"": first_forms, "--deep": deep_forms, "--occ2": occ2_forms}
DEEP_POINTS = ((16, 32, 8, 12000, 16), (40, 32, 8, 5000, 16), (24, 28, 4, 8000, 32),
               (12, 64, 8, 16000, 128))


#: ``--held``: the default (flat, the product's kernels) against the rule before it on batches
#: none of the runs above had: head dims 64-256, K/V heads 1-8, 16-1600 rows, both dtypes
#: (batch, heads_q, heads_kv, longest cache, head dim, dtype)
HELD_POINTS = ((12, 32, 8, 20000, 128, "bf16"), (30, 28, 4, 6000, 64, "fp16"),
               (10, 16, 2, 16000, 256, "bf16"), (90, 8, 1, 5000, 128, "bf16"),
               (200, 32, 8, 3000, 128, "bf16"), (20, 40, 8, 10000, 96, "fp16"),
               (48, 32, 8, 3000, 256, "bf16"))


def held():
    """``--held``: the default against ``flat=False`` (the split rule), product launches."""
    from paged_defaults import copy_rate, report
    from tuner.measure import time_interleaved

    copy_gbps = copy_rate()
    original = _case.paged_lengths
    summary = []
    for b, hq, hkv, sk, d, dtype in HELD_POINTS:
        p = ta.Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=1, seqlen_k=sk, head_dim=d,
                       dtype=dtype, causal=True, bottom_right=True, ragged=True, page_size=16)
        new = ta.DECODE.default_schedule("sm_90", p)
        candidates = {"default": new, "split rule": new.replace(flat=False)}
        for mix, lengths in MIXES.items():
            _case.paged_lengths = lengths
            case = ta.DECODE.case(p, 0)
            fns = {name: case.launcher(s) for name, s in candidates.items()}
            errors = {name: case.error(fn) for name, fn in fns.items()}
            times = time_interleaved(fns, rounds=15)
            valid = int(case.seqused.sum()) * hkv * d * 2 * 2
            print(f"== {p.describe()} {mix}")
            report(times, valid, copy_gbps, errors, candidates)
            base, ours = times["split rule"].median_ms, times["default"].median_ms
            summary.append((f"{p.describe()} {mix}", base, ours,
                            valid / (base * 1e-3) / (copy_gbps * 1e9),
                            valid / (ours * 1e-3) / (copy_gbps * 1e9), errors["default"]))
    _case.paged_lengths = original
    print("\n| batch | split rule µs | flat µs | rule ÷ flat (time) | rule % copy | flat % copy "
          "| flat error |\n|---|---|---|---|---|---|---|")
    for desc, base, ours, s0, s1, err in summary:
        print(f"| {desc} | {base * 1e3:.1f} | {ours * 1e3:.1f} | {base / ours:.3f} | {s0:.0%} | "
              f"{s1:.0%} | {err:.1e} |")


def main():
    if "--held" in sys.argv:
        return held()
    form = next((a for a in sys.argv[1:] if a in FORMS), "")
    if "--diag" in sys.argv:
        return diag(sys.argv[sys.argv.index("--diag") + 1])
    from paged_defaults import copy_rate, report
    from tuner.measure import time_interleaved

    check_only = "--check" in sys.argv
    copy_gbps = None if check_only else copy_rate()
    original = _case.paged_lengths
    summary = []
    mixes = {"edges": edge_lengths, **MIXES} if check_only else MIXES
    points = CHECK_POINTS if check_only else DEEP_POINTS if form else POINTS
    for b, hq, hkv, sk, page in points:
        p = ta.Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=1, seqlen_k=sk, head_dim=128,
                       dtype="bf16", causal=True, bottom_right=True, ragged=True, page_size=page)
        d = ta.DECODE.default_schedule("sm_90", p)
        for mix, lengths in mixes.items():
            _case.paged_lengths = lengths
            case = ta.DECODE.case(p, 0)
            flats = FORMS[form](p, d)
            fns = {"default": case.launcher(d)}
            for name, plan in flats.items():
                bufs = plan.buffers()
                fns[name] = (lambda plan=plan, bufs=bufs: plan(
                    case.q, case.k_pages, case.v_pages, case.out, case.seqused, case.table,
                    bufs))
            errors = {name: case.error(fn) for name, fn in fns.items()}
            for name, plan in flats.items():  # NaN partials: a merge that read an unwritten slot
                cu, opart, lse = bufs = plan.buffers()
                opart.fill_(float("nan"))
                lse.fill_(float("nan"))
                errors[name + " nan"] = case.error(lambda: plan(
                    case.q, case.k_pages, case.v_pages, case.out, case.seqused, case.table,
                    bufs))
            print(f"== {p.describe()} {mix} lengths {case.seqused.tolist()[:8]}.. errors "
                  + " ".join(f"{n}={e:.1e}" for n, e in errors.items()), flush=True)
            if check_only:
                continue
            times = time_interleaved(fns, rounds=15)
            valid = int(case.seqused.sum()) * hkv * 128 * 2 * 2
            report(times, valid, copy_gbps, errors, {"default": d})
            base = times["default"].median_ms
            best = min((n for n in fns if n != "default"), key=lambda n: times[n].median_ms)
            summary.append((f"{p.describe()} {mix}", base, best, times[best].median_ms,
                            valid / (base * 1e-3) / (copy_gbps * 1e9),
                            valid / (times[best].median_ms * 1e-3) / (copy_gbps * 1e9)))
    _case.paged_lengths = original
    if summary:
        print("\n| batch | default µs | best flat | default ÷ flat (time) | default % copy | "
              "flat % copy |\n|---|---|---|---|---|---|")
        for desc, base, best, ms, s0, s1 in summary:
            print(f"| {desc} | {base * 1e3:.1f} | {best} | {base / ms:.3f} | {s0:.0%} | "
                  f"{s1:.0%} |")


if __name__ == "__main__":
    main()
