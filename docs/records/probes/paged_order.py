"""Does the order of a paged batch's entries matter to the decode default (issue 49)? The same
lengths and pages as sent, longest first and shortest first, arranged on the host (no kernel
change: the bound of an order inside the kernel), the default on each; FlashAttention-4 beside
on the first two where importable. Interleaved, L2 flushed, GPU view; shares of the copy rate
(read + written, same run) on the valid K/V bytes read once.

    source .devtk/setup.sh && python3 -u docs/records/probes/paged_order.py [0,1,...]

The argument picks points of ``POINTS`` by index. ``--model`` (no GPU): longest first over grid
order in two models of the defaults' grids, slots of equal speed and CTAs sharing 3 TB/s.
"""
import sys

import tiledattention as ta
from tiledattention.core import _case
from tuner.measure import time_interleaved

from paged_balance import MIXES
from paged_defaults import add_fa4, copy_rate, report
from compile_ahead import compile_ahead

# (batch, heads_q, heads_kv, longest cache, page size, head dim)
POINTS = ((40, 32, 8, 2000, 128, 128), (56, 32, 8, 3000, 64, 128), (100, 28, 4, 1500, 256, 128),
          (44, 28, 4, 6000, 256, 128), (36, 28, 4, 5000, 32, 128), (64, 32, 8, 4000, 32, 128),
          (128, 28, 4, 3000, 64, 128), (200, 32, 8, 2500, 128, 128),
          (24, 32, 8, 20000, 16, 128), (70, 8, 1, 3000, 64, 128), (48, 32, 8, 6000, 64, 64),
          (33, 40, 8, 7000, 128, 128))
ORDERS = {"as sent": lambda xs: xs, "longest first": lambda xs: sorted(xs, reverse=True),
          "shortest first": sorted}


def model_ms(works, slots, shared, cap):
    """Time of CTAs of ``works`` bytes started in order on ``slots`` slots, each running at
    ``min(cap, shared / running)`` bytes/s after 2 µs of start (``shared`` None: equal speed)."""
    pending, running, t = list(works), [], 0.0
    while pending or running:
        running += [[pending.pop(0), 2e-6] for _ in range(min(slots - len(running), len(pending)))]
        rate = cap if shared is None else min(cap, shared / len(running))
        step = min(start or left / rate for left, start in running)
        t += step
        running = [[left - (0 if start else rate * step), max(start - step, 0)]
                   for left, start in running if start > step or left - rate * step > 1]
    return t * 1e3


def problems(picked):
    """The decode problems of ``POINTS`` at indices ``picked``."""
    return [ta.Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=1, seqlen_k=sk, head_dim=d,
                       dtype="bf16", causal=True, bottom_right=True, ragged=True, page_size=page)
            for b, hq, hkv, sk, page, d in (POINTS[i] for i in picked)]


def model(points):
    print("grid order over longest first: equal speed (10 GB/s a CTA); 3 TB/s shared, at most "
          "100 GB/s a CTA; the same, at most 200 GB/s")
    for p in points:
        d = ta.DECODE.default_schedule("sm_90", p)
        for mix, lengths in MIXES.items():
            def works(order):
                return [n / d.splits * p.head_dim * 4 for _ in range(d.splits) for n in order
                        for _ in range(p.heads_kv)]
            ratios = [model_ms(works(lengths(p)), 132 * d.occupancy, shared, cap)
                      / model_ms(works(sorted(lengths(p), reverse=True)), 132 * d.occupancy,
                                 shared, cap)
                      for shared, cap in ((None, 10e9), (3e12, 100e9), (3e12, 200e9))]
            print(p.describe(), mix, d.describe(), " ".join(f"{r:.3f}" for r in ratios))


def main():
    if "--model" in sys.argv:
        return model(problems(range(len(POINTS))))
    picked = [int(a) for a in sys.argv[1].split(",")] if len(sys.argv) > 1 else range(len(POINTS))
    points = problems(picked)
    copy_gbps = copy_rate()
    compile_ahead([(p, ta.DECODE.default_schedule("sm_90", p)) for p in points])
    original, rows = _case.paged_lengths, []
    for p in points:
        d = ta.DECODE.default_schedule("sm_90", p)
        for mix, lengths in MIXES.items():
            fns, errors = {}, {}
            for order, arrange in ORDERS.items():
                _case.paged_lengths = lambda q, lengths=lengths, arrange=arrange: arrange(
                    lengths(q))
                case = ta.DECODE.case(p, 0)
                fns[order] = case.launcher(d)
                errors[order] = case.error(fns[order])
                if order != "shortest first":
                    peer_fns, peer_errors = {}, {}
                    add_fa4(p, case, peer_fns, peer_errors)
                    for name, run in peer_fns.items():
                        fns[f"FA4 {order}"] = run
                        errors[f"FA4 {order}"] = peer_errors[name]
            _case.paged_lengths = original
            valid = int(case.seqused.sum()) * p.heads_kv * p.head_dim * 4
            timed = time_interleaved(fns, rounds=15)
            print(f"== {p.describe()} {mix} {d.describe()}", flush=True)
            report(timed, valid, copy_gbps, errors, {o: d for o in ORDERS})
            t = {n: r.median_ms for n, r in timed.items()}
            fa4 = t.get("FA4 as sent", float("nan")) / t["as sent"]
            rows.append(f"| {p.describe()} | {mix} | {d.describe()} | {t['as sent'] * 1e3:.1f} | "
                        f"{t['as sent'] / t['longest first']:.3f} | "
                        f"{t['shortest first'] / t['as sent']:.3f} | {fa4:.3f} |")
    print("\n| batch | mix | default | as sent µs | as sent ÷ longest first | shortest first ÷ "
          "as sent | FA4 ÷ ours, as sent |\n|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
