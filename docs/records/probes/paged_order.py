"""Does the order of a paged batch's entries matter to the decode default (issue 49)? The same
lengths and pages as sent and arranged longest first on the host (no kernel change: the bound
of an order inside the kernel), the default without ``longest_first`` on each; FlashAttention-4
beside on the batch as sent where importable. Interleaved, L2 flushed, GPU view; shares of the copy rate
(read + written, same run) on the valid K/V bytes read once. ``ordered``: the default with
``longest_first`` (the order ranked on the device each call), also timed as isolated calls and
back to back with the host counted.

    source .devtk/setup.sh && python3 -u docs/records/probes/paged_order.py [0,1,...]

The argument picks points of ``POINTS`` by index; ``--once``: each point's ordered kernel
launched once (run it first, under a timeout). ``--model`` (no GPU): longest first over grid
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
          (33, 40, 8, 7000, 128, 128),
          # held out of LONGEST_FIRST_MAX_WAVES (kernels/decode/_defaults.py)
          (60, 16, 8, 3000, 32, 128), (45, 64, 8, 3000, 64, 128), (70, 28, 4, 2500, 128, 128),
          (120, 32, 4, 1200, 256, 64))
#: the entries' lengths as the host arranges them
ORDERS = {"as sent": lambda xs: xs, "longest first": lambda xs: sorted(xs, reverse=True)}


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
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    picked = [int(a) for a in args[0].split(",")] if args else range(len(POINTS))
    points = problems(picked)
    defaults = {p: ta.DECODE.default_schedule("sm_90", p).replace(longest_first=False)
                for p in points}
    ordered = {p: d.replace(longest_first=True) for p, d in defaults.items()}
    if "--once" in sys.argv:  # each ordered kernel's first launch, alone (run under a timeout)
        for p in points:
            case = ta.DECODE.case(p, 0)
            print(p.describe(), ordered[p].describe(),
                  f"error {case.error(case.launcher(ordered[p])):.1e}", flush=True)
        return
    copy_gbps = copy_rate()
    compile_ahead([(p, s[p]) for p in points for s in (defaults, ordered)])
    original, rows = _case.paged_lengths, []
    for p in points:
        d = defaults[p]
        for mix, lengths in MIXES.items():
            fns, errors = {}, {}
            for order, arrange in ORDERS.items():
                _case.paged_lengths = lambda q, lengths=lengths, arrange=arrange: arrange(
                    lengths(q))
                case = ta.DECODE.case(p, 0)
                fns[order] = case.launcher(d)
                errors[order] = case.error(fns[order])
                if order == "as sent":
                    fns["ordered"] = case.launcher(ordered[p])
                    errors["ordered"] = case.error(fns["ordered"])
                    add_fa4(p, case, fns, errors)
            _case.paged_lengths = original
            valid = int(case.seqused.sum()) * p.heads_kv * p.head_dim * 4
            timed = time_interleaved(fns, rounds=15)
            views = {n: fns[n] for n in ("as sent", "ordered", "flash-attn-4") if n in fns}
            iso = time_interleaved(views, rounds=15, host=True)
            loop = time_interleaved(views, rounds=15, loop=True, flush_l2=False)
            print(f"== {p.describe()} {mix} {d.describe()}", flush=True)
            report(timed, valid, copy_gbps, errors,
                   {"as sent": d, "longest first": d, "ordered": ordered[p]})
            for view, timed_view in (("isolated", iso), ("back to back", loop)):
                print(f"  {view}: " + "  ".join(f"{n} {1e3 * t.median_ms:.1f} us"
                                               for n, t in timed_view.items()), flush=True)
            t = {n: r.median_ms for n, r in timed.items()}
            i = {n: r.median_ms for n, r in iso.items()}
            fa4 = t.get("flash-attn-4", float("nan"))
            fa4_iso = i.get("flash-attn-4", float("nan"))
            b = {n: r.median_ms for n, r in loop.items()}
            rows.append(f"| {p.describe()} | {mix} | {d.describe()} | {t['as sent'] * 1e3:.1f} | "
                        f"{t['as sent'] / t['longest first']:.3f} | "
                        f"{t['as sent'] / t['ordered']:.3f} | {i['as sent'] / i['ordered']:.3f} "
                        f"| {b['as sent'] / b['ordered']:.3f} | {fa4 / t['ordered']:.3f} | "
                        f"{fa4_iso / i['ordered']:.3f} | "
                        f"{b.get('flash-attn-4', float('nan')) / b['ordered']:.3f} |")
    print("\n| batch | mix | default | as sent µs | as sent ÷ arranged longest first | as sent ÷ "
          "ordered (GPU) | (isolated) | (back to back) | FA4 ÷ ordered (GPU) | (isolated) | "
          "(back to back) |\n" + "|---" * 11 + "|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
