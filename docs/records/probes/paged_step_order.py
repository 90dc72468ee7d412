"""A paged batch's order ranked once a decode step (``tiledattention.PagedOrder``, issue 49):
the longest-first default ranking each call, the same given the step's order, and the grid
order (``longest_first`` off), on the batches of ``paged_order.py`` picked by index. Views,
interleaved, medians of 15: GPU (one call between events, L2 flushed); isolated (the GPU
drained and the L2 flushed, the host clock from the call to the end of its work), through the
family's launcher and through ``tiledattention.paged_attention`` as a user calls it; a step
of 32 layers back to back with the host counted (the same pools each layer, so later layers
find some of the K/V in L2: alike for every contender), the given order ranked once a step.

    source .devtk/setup.sh && cd docs/records/probes && python3 -u paged_step_order.py 12,13
"""
import sys

import tiledattention as ta
from tiledattention.core import _case
from tiledattention.kernels.decode._family import _case_launcher
from tuner.measure import time_interleaved

from paged_balance import MIXES
from paged_order import problems
from compile_ahead import compile_ahead

LAYERS = 32


def main():
    picked = [int(i) for i in sys.argv[1].split(",")]
    points = problems(picked)
    ranked = {p: ta.DECODE.default_schedule("sm_90", p) for p in points}
    assert all(s.longest_first for s in ranked.values()), "a point the default keeps in order"
    grid = {p: s.replace(longest_first=False) for p, s in ranked.items()}
    compile_ahead([(p, s[p]) for p in points for s in (ranked, grid)])
    original, rows = _case.paged_lengths, []
    for p in points:
        for mix, lengths in MIXES.items():
            _case.paged_lengths = lengths
            case = ta.DECODE.case(p, 0)
            order = ta.PagedOrder(case.seqused)
            args = (case.q, case.k_pages, case.v_pages, case.table, case.seqused)

            def made(schedule, **given):
                return _case_launcher(p, schedule, case.q, case.k_pages, case.v_pages, case.out,
                                      0, ranges=case.seqused, pages=case.table, **given)

            fns = {"grid": made(grid[p]), "ranked": made(ranked[p]),
                   "given": made(ranked[p], order=order.entries)}
            errors = {n: case.error(fn) for n, fn in fns.items()}
            public = {"public": lambda: ta.paged_attention(*args),
                      "public given": lambda: ta.paged_attention(*args, order=order)}
            for name, fn in public.items():
                errors[name] = case.error(lambda fn=fn: case.out.copy_(fn()))

            def step(fn, rank=False):
                def run():
                    if rank:
                        ta.PagedOrder(case.seqused)
                    for _ in range(LAYERS):
                        fn()
                return run

            gpu = time_interleaved(fns, rounds=15)
            iso = time_interleaved({**fns, **public}, rounds=15, host=True)
            steps = time_interleaved({"grid": step(fns["grid"]), "ranked": step(fns["ranked"]),
                                      "given": step(public["public given"], rank=True),
                                      "public": step(public["public"])},
                                     rounds=15, loop=True, flush_l2=False)
            _case.paged_lengths = original
            t = {f"{view} {n}": r.median_ms * 1e3 for view, timed in
                 (("gpu", gpu), ("iso", iso), ("step", steps)) for n, r in timed.items()}
            print(f"== {p.describe()} {mix} {ranked[p].describe()} errors " + " ".join(
                f"{n} {e:.1e}" for n, e in errors.items()) + "\n  " + "  ".join(
                f"{n} {v:.1f}" for n, v in t.items()), flush=True)
            rows.append(f"| {p.describe()} | {mix} | {t['gpu grid']:.1f} | "
                        f"{t['gpu grid'] / t['gpu ranked']:.3f} | "
                        f"{t['gpu grid'] / t['gpu given']:.3f} | "
                        f"{t['iso grid'] / t['iso ranked']:.3f} | "
                        f"{t['iso grid'] / t['iso given']:.3f} | "
                        f"{t['iso public'] / t['iso public given']:.3f} | "
                        f"{t['step grid'] / t['step ranked']:.3f} | "
                        f"{t['step public'] / t['step given']:.3f} |")
    print("\n| batch | mix | grid µs (GPU) | grid ÷ ranked (GPU) | grid ÷ given (GPU) | "
          "grid ÷ ranked (isolated) | grid ÷ given (isolated) | public ÷ public given "
          f"(isolated) | grid ÷ ranked ({LAYERS}-layer step) | public ÷ public given "
          f"({LAYERS}-layer step) |\n" + "|---" * 10 + "|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
