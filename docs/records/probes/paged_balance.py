"""Mixed-length paged decode (issue 49): proportional splits (each entry's keys divided into
``splits`` shares of its own length) against balanced ones (``DecodeSchedule.balanced``: every
share the longest entry's keys / ``splits``), at the split rule's count (before
``PAGED_SPLIT_FACTOR``) and multiples of it, on two length mixes: the family's case (the
longest, 3/4, 1/2, 1/4 of it, cycling) and lengths drawn log-uniformly from 64 to the longest
(seeded). Interleaved, the L2 flushed before each sample; shares of the device copy rate (read
+ written, same run) on the valid K/V bytes read once.

    source .devtk/setup.sh && python3 docs/records/probes/paged_balance.py [--new]

``--new``: other batches (none of the first set's), the default against the rule before it,
and FlashAttention-4 beside where it is importable (``../shared/device/pack-fa4``; it was not
in the recorded run).

``--pdl``: the batches of both sets, the default against the same schedule with its block
merge launched as a programmatic dependent (``combine="block_pdl"``), FlashAttention-4 beside
where it is importable.

``--depth``: batches at pages of 16 and 32 (``DEPTH_POINTS``, none of the other sets'), the
default against deeper load pipelines (K and V loads 3-6 steps ahead) and 32-key steps,
FlashAttention-4 beside where it is importable; a table of each batch's best form last.
``--held``: batches at pages of 16 none of the sets ran (one cache, a batch one split fills),
the default (loads ``SMALL_PAGE_LATENCY`` ahead, drawn from ``--depth``) against two ahead.
``--live``: batches of pages of 16-256 (``LIVE_POINTS``), the default against balanced splits
at 1-8x its count, whose empty splits store no partials (the merge reads each row's up to its
last live split: the kernels of 79e0064, reverted after).
``--part``: batches whose rows fill one CTA an SM but not two (``PART_POINTS``, pages of
32-256), the default's one split against two and four, proportional and balanced.
``--part-held``: seven other such batches (``PART_HELD_POINTS``), with caches of one length
as a third mix.
``--part-more``: the same question at D 64 and 256 and for pages of 16 a part-wave past two
waves (``PART_MORE_POINTS``): one to four proportional splits, three mixes.
``--part-check``: the rule held out (``PART_CHECK_POINTS``): the default against one split,
FlashAttention-4 beside where it is importable.
``--third``: batches over pages of 32-256 whose rows (265-396) are a wave of two CTAs an SM
and a part-empty second (``THIRD_POINTS``): the default's one split at two CTAs an SM against
three CTAs an SM with 64-key steps (one wave; the contiguous caches' band rule) and two and
four splits, FlashAttention-4 beside where it is importable.
"""

import math
import random
import sys
from typing import Callable, NamedTuple

import tiledattention as ta
from tiledattention.core import _case
from tuner.measure import time_interleaved

from paged_defaults import add_fa4, copy_rate, default_with, report
from compile_ahead import compile_ahead

# (batch, heads_q, heads_kv, longest cache, page size)
POINTS = ((20, 28, 4, 10000, 64), (10, 32, 8, 20000, 256), (4, 32, 8, 32768, 16),
          (28, 28, 4, 7000, 32), (16, 32, 8, 12000, 16))
NEW_POINTS = ((6, 64, 8, 40000, 128), (14, 32, 8, 9000, 32), (12, 28, 4, 24000, 64),
              (24, 32, 4, 5000, 256), (9, 32, 8, 17000, 16), (32, 32, 1, 8000, 64))


DEPTH_POINTS = ((10, 32, 8, 24000, 16), (36, 28, 4, 7000, 16), (20, 40, 8, 12000, 16),
                (18, 32, 8, 11000, 32), (48, 28, 4, 4000, 32))

HELD_POINTS = ((6, 32, 8, 30000, 16), (28, 28, 4, 9000, 16), (14, 64, 8, 10000, 16),
               (64, 32, 8, 3000, 16), (1, 32, 8, 32768, 16), (3, 16, 2, 20000, 16))


def log_uniform(problem):
    """``problem.batch`` lengths from 64 to the longest, log-uniform; one is the longest."""
    rng = random.Random(problem.batch * 7919 + problem.seqlen_k)
    top = problem.seqlen_k
    out = [int(math.exp(rng.uniform(math.log(64), math.log(top)))) for _ in range(problem.batch)]
    out[rng.randrange(problem.batch)] = top
    return out


MIXES = {"cycling": _case.paged_lengths, "log-uniform": log_uniform}


def rule_before(problem):
    """The default before ``PAGED_SPLIT_FACTOR`` (the factor at 1)."""
    return default_with(problem, PAGED_SPLIT_FACTOR=1)


def sweep(problem):
    """The rule before the factor ("default" in the record's ``small-runs.log`` (balance.log),
    run before the factor existed), 4x its splits, and balanced splits at 1-8x."""
    d = rule_before(problem)
    candidates = {"default": d, "default bal": d.replace(balanced=True)}
    for f in (2, 4, 8):
        s = d.replace(splits=min(256, f * d.splits), occupancy=2)
        if f == 4:
            candidates[f"{f}x"] = s
        candidates[f"{f}x bal"] = s.replace(balanced=True)
    return candidates


def check(problem):
    """The default against the rule before it, balanced, and twice the default's splits."""
    d = ta.DECODE.default_schedule("sm_90", problem)
    return {"default": d, "before": rule_before(problem), "default bal": d.replace(balanced=True),
            "2x": d.replace(splits=min(256, 2 * d.splits))}


def pdl(problem):
    """The default against its block merge launched as a programmatic dependent."""
    d = ta.DECODE.default_schedule("sm_90", problem)
    return {"default": d, "block_pdl": d.replace(combine="block_pdl")}


def depth(problem):
    """The default against deeper load pipelines and 32-key steps."""
    d = ta.DECODE.default_schedule("sm_90", problem)
    return {"default": d, "V4": d.replace(v_latency=4),
            "K4 V4": d.replace(k_latency=4, v_latency=4),
            "K3 V3": d.replace(k_latency=3, v_latency=3),
            "K6 V6": d.replace(k_latency=6, v_latency=6),
            "V4 occ1": d.replace(v_latency=4, occupancy=1),
            "n32 K4 V4": d.replace(tile_n=32, k_latency=4, v_latency=4)}


def held(problem):
    """The default against its loads two steps ahead (the rule before
    ``SMALL_PAGE_LATENCY``)."""
    d = ta.DECODE.default_schedule("sm_90", problem)
    return {"default": d, "K2 V2": d.replace(k_latency=2, v_latency=2)}


#: ``--live``: batches of every page size, most none of the sets ran
LIVE_POINTS = ((6, 32, 8, 30000, 16), (28, 28, 4, 9000, 16), (14, 64, 8, 10000, 16),
               (64, 32, 8, 3000, 16), (3, 16, 2, 20000, 16), (12, 32, 8, 16000, 32),
               (40, 28, 4, 5000, 64), (8, 32, 8, 24000, 256))


def live(problem):
    """The default against balanced splits at 1-8x its count (a shorter entry's empty splits
    store no partials; the merge reads a row's up to its last live split)."""
    d = ta.DECODE.default_schedule("sm_90", problem)
    found = {"default": d}
    for f in (1, 2, 4, 8):
        splits = min(128, f * max(d.splits, 2))
        s = d.replace(splits=splits, balanced=True, occupancy=2,
                      combine="block_pdl" if d.splits == 1 else d.combine)
        if s not in found.values():
            found[f"bal {splits}"] = s
    return found


#: ``--part``: batches whose rows fill one CTA an SM but not two, pages of 32-256
PART_POINTS = ((20, 32, 8, 12000, 32), (24, 32, 8, 8000, 128), (30, 32, 8, 6000, 256),
               (36, 28, 4, 9000, 64), (60, 28, 4, 4000, 32), (17, 64, 8, 10000, 128),
               (50, 32, 4, 5000, 64))


#: ``--part-held``: more of them, none of the sets', with caches of one length too
PART_HELD_POINTS = ((18, 32, 8, 15000, 64), (42, 28, 4, 6000, 128), (22, 40, 8, 7000, 32),
                    (45, 16, 4, 8000, 256), (35, 32, 4, 12000, 64), (19, 64, 8, 5000, 256),
                    (150, 8, 1, 3000, 64))


#: ``--part-more``: head dims 64 and 256 in that band (the sixth field), and pages of 16 a
#: part-wave past two waves of two CTAs an SM (264-396 rows)
PART_MORE_POINTS = ((20, 32, 8, 12000, 64, 64), (36, 28, 4, 9000, 128, 64),
                    (20, 32, 8, 8000, 64, 256), (40, 8, 4, 6000, 64, 256),
                    (40, 32, 8, 6000, 16), (70, 28, 4, 5000, 16), (45, 64, 8, 4000, 16))


#: ``--part-check``: the rule's band held out (head dims 64-256, pages of 16-256, H_kv 1-8)
PART_CHECK_POINTS = ((22, 32, 8, 10000, 32, 64), (45, 12, 4, 7000, 256, 64),
                     (18, 24, 8, 8000, 64, 96), (36, 16, 4, 5000, 128, 256),
                     (160, 16, 1, 4000, 32), (35, 32, 8, 7000, 16), (90, 28, 4, 3500, 16),
                     (48, 64, 8, 5000, 16))


#: ``--third``: (batch, heads_q, heads_kv, longest cache, page size): 288-384 rows
THIRD_POINTS = ((40, 32, 8, 2000, 128), (36, 32, 8, 3000, 64), (80, 28, 4, 2500, 256),
                (48, 32, 8, 1500, 32), (90, 16, 4, 4000, 128), (44, 32, 8, 6000, 64))


def third(problem):
    """The default (one split at two CTAs an SM) against one wave of three CTAs an SM (64-key
    steps, loads as the default's or two ahead) and two and four splits."""
    d = ta.DECODE.default_schedule("sm_90", problem)
    three = d.replace(occupancy=3, tile_n=64)
    return {"default": d, "occ3 n64": three, "occ3 n64 K2": three.replace(k_latency=2),
            "2": d.replace(splits=2, combine="block_pdl"),
            "4": d.replace(splits=4, combine="block_pdl")}


def part_check(problem):
    """The default (the part-wave rule's four splits) against one split, the rule before."""
    d = ta.DECODE.default_schedule("sm_90", problem)
    return {"default": d, "one split": d.replace(splits=1, combine="kernel")}


def part_more(problem):
    """The default against one, two, three and four splits (proportional)."""
    d = ta.DECODE.default_schedule("sm_90", problem)
    found = {"default": d}
    merge = "block_pdl" if problem.head_dim <= 128 else "block"  # D 256: PDL spills
    for splits in (1, 2, 3, 4):
        s = d.replace(splits=splits, combine=merge if splits > 1 else "kernel")
        if s not in found.values():
            found[f"{splits}"] = s
    return found


def part(problem):
    """The default (one split at two CTAs an SM) against two and four splits, proportional
    and balanced."""
    d = ta.DECODE.default_schedule("sm_90", problem)
    found = {"default": d}
    for splits in (2, 4):
        s = d.replace(splits=splits, combine="block_pdl")
        found[f"{splits}"] = s
        found[f"{splits} bal"] = s.replace(balanced=True)
    return found


def nan_partials_error(case, schedule):
    """``schedule``'s error on ``case`` with its float32 partial buffers filled with NaN
    before the call: a merge that read a slot no split stored would return NaN."""
    import torch

    from tiledattention.kernels.decode._launch import launch, launches, partial_shapes

    plan = launches(case.problem, schedule, None)
    partials = None
    if plan.combine is not None:
        partials = tuple(torch.full(shape, float("nan"), device="cuda")
                         for shape in partial_shapes(plan))

    def run():
        launch(torch.cuda.current_stream(), plan, case.q, case.k_pages, case.v_pages,
               case.out, 0, partials, ranges=case.seqused, pages=case.table)

    return case.error(run)


class Mode(NamedTuple):
    """A command-line mode: its batches, its forms, and what it runs beside them."""

    points: tuple
    forms: Callable
    compile_first: bool = False  # compile every form ahead, in a pool
    nan_check: bool = False  # each form's error with NaN-filled partials too
    fa4: bool = False  # FlashAttention-4 beside where it is importable
    one_length: bool = False  # caches all at the longest as a third mix


MODES = {
    "": Mode(POINTS, sweep),
    "--new": Mode(NEW_POINTS, check, fa4=True),
    "--pdl": Mode(POINTS + NEW_POINTS, pdl, fa4=True),
    "--depth": Mode(DEPTH_POINTS, depth, compile_first=True, fa4=True),
    "--held": Mode(HELD_POINTS, held, compile_first=True, fa4=True),
    "--live": Mode(LIVE_POINTS, live, compile_first=True, nan_check=True),
    "--part": Mode(PART_POINTS, part, compile_first=True, nan_check=True),
    "--part-held": Mode(PART_HELD_POINTS, part, compile_first=True, nan_check=True,
                        one_length=True),
    "--part-more": Mode(PART_MORE_POINTS, part_more, compile_first=True, nan_check=True,
                        one_length=True),
    "--part-check": Mode(PART_CHECK_POINTS, part_check, compile_first=True, nan_check=True,
                         fa4=True, one_length=True),
    "--third": Mode(THIRD_POINTS, third, compile_first=True, fa4=True),
}


def main():
    mode = MODES[next((a for a in sys.argv[1:] if a in MODES), "")]
    copy_gbps = copy_rate()
    mixes = dict(MIXES)
    if mode.one_length:  # and every cache at the longest
        mixes["one length"] = lambda problem: [problem.seqlen_k] * problem.batch
    original = _case.paged_lengths
    summary = []
    for b, hq, hkv, sk, page, *dim in mode.points:
        d = dim[0] if dim else 128
        p = ta.Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=1, seqlen_k=sk, head_dim=d,
                       dtype="bf16", causal=True, bottom_right=True, ragged=True, page_size=page)
        candidates = mode.forms(p)
        if mode.compile_first:
            compile_ahead([(p, s) for s in candidates.values()])
        for mix, lengths in mixes.items():
            _case.paged_lengths = lengths
            case = ta.DECODE.case(p, 0)
            fns = {name: case.launcher(s) for name, s in candidates.items()}
            errors = {name: case.error(run) for name, run in fns.items()}
            if mode.nan_check:  # NaN partials: the largest error of any form
                worst = max(nan_partials_error(case, s) for s in candidates.values())
                print(f"   NaN-partials check: worst rel. L2 {worst:.2e}")
            if mode.fa4:
                add_fa4(p, case, fns, errors)
            times = time_interleaved(fns, rounds=15)
            valid = int(case.seqused.sum()) * hkv * d * 2 * 2
            print(f"== {p.describe()} {mix} lengths {case.seqused.tolist()[:6]}.. "
                  f"default {candidates['default'].describe()}")
            report(times, valid, copy_gbps, errors, candidates)
            ours = {n: t.median_ms for n, t in times.items() if n in candidates}
            best = min(ours, key=ours.get)
            fa4 = next((t.median_ms for n, t in times.items() if n not in candidates), None)
            summary.append((f"{p.describe()} {mix}", ours["default"], best, ours[best], fa4,
                            valid / (ours[best] * 1e-3) / (copy_gbps * 1e9)))
    _case.paged_lengths = original
    print("\n| batch | default µs | best | ÷ default (speed) | FA4 ÷ best (time) | "
          "best % of copy |\n|---|---|---|---|---|---|")
    for desc, base, best, best_ms, fa4, share in summary:
        versus = f"{fa4 / best_ms:.3f}" if fa4 else "-"
        print(f"| {desc} | {base * 1e3:.1f} | {best} | {base / best_ms:.3f} | {versus} | "
              f"{share:.0%} |")


if __name__ == "__main__":
    main()
