"""Times the forward kernel before and after a code change, interleaved in one process (GPU).

    mkdir -p prebench && git archive REV tiledattention | tar -x -C prebench
    mv prebench/tiledattention prebench/tiledattention_pre
    python scripts/renovation_check.py --old prebench --out results.json

The old package is imported as ``tiledattention_pre`` (its imports are relative) and launched
through its own ``Runtime`` with the schedule the current lookup picks (from the shipped table),
so both sides run the same schedule through their own launch path. Per point: the relative L2
error of each side against a float32 reference, whether the two outputs are bitwise equal, and
the median time of each over interleaved rounds (L2 flushed between samples). Grid: D in
{64, 128, 256}, S in {1k, 16k}, causal and not, bf16, B·S = 16k, H·D = 2048.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", required=True, help="directory holding tiledattention_pre/")
    parser.add_argument("--out", default=None, help="write the results here as JSON")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3,
                        help="interleaved measurements per point (the median ratio is reported)")
    args = parser.parse_args()

    import torch

    sys.path.insert(0, args.old)
    import tiledattention_pre as pre

    import tiledattention as new
    from tuner.measure import time_interleaved

    old_runtime = pre.Runtime(lambda problem, device: None)  # explicit schedules only
    results = []
    for d in (64, 128, 256):
        for s in (1024, 16384):
            for causal in (False, True):
                h, b = 2048 // d, 16384 // s
                gen = torch.Generator(device="cuda").manual_seed(7)
                q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16,
                                       generator=gen) for _ in range(3))
                resolution = new.explain(q, k, v, causal)
                schedule = resolution.schedule
                old_schedule = pre.Schedule.from_dict(schedule.to_dict())

                def run_new():
                    return new.sdpa(q, k, v, causal, schedule=schedule)

                def run_old():
                    return old_runtime.sdpa(q, k, v, causal, schedule=old_schedule)

                ref = torch.nn.functional.scaled_dot_product_attention(
                    q.float(), k.float(), v.float(), is_causal=causal)
                out_new, out_old = run_new(), run_old()
                torch.cuda.synchronize()

                def err(out):
                    return (torch.linalg.vector_norm(out.float() - ref)
                            / torch.linalg.vector_norm(ref)).item()

                ratios, medians = [], []
                for _ in range(args.repeats):
                    t = time_interleaved({"new": run_new, "old": run_old}, rounds=args.rounds)
                    ratios.append(t["old"].median_ms / t["new"].median_ms)
                    medians.append((t["new"].median_ms, t["old"].median_ms))
                ratios.sort()
                row = {"D": d, "S": s, "causal": causal, "B": b, "H": h,
                       "schedule": schedule.describe(), "source": resolution.source,
                       "err_new": err(out_new), "err_old": err(out_old),
                       "bitwise_equal": bool(torch.equal(out_new, out_old)),
                       "new_ms": [m[0] for m in medians], "old_ms": [m[1] for m in medians],
                       "old_over_new": ratios[len(ratios) // 2], "ratios": ratios}
                results.append(row)
                print(json.dumps(row), flush=True)
                torch.cuda.empty_cache()
    geomean = math.exp(sum(math.log(r["old_over_new"]) for r in results) / len(results))
    info = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "cuda_tile": __import__("importlib.metadata").metadata.version("cuda-tile"),
            "geomean_old_over_new": geomean, "points": results}
    if args.out:
        Path(args.out).write_text(json.dumps(info, indent=1) + "\n")
    print(f"\n{'D':>4} {'S':>6} {'mask':>6} {'new ms':>8} {'old ms':>8} {'old/new':>8} "
          f"{'equal':>6} {'err':>8}  schedule")
    for r in results:
        print(f"{r['D']:>4} {r['S']:>6} {'causal' if r['causal'] else 'full':>6} "
              f"{_median(r['new_ms']):>8.3f} {_median(r['old_ms']):>8.3f} "
              f"{r['old_over_new']:>8.3f} {str(r['bitwise_equal']):>6} {r['err_new']:>8.1e}  "
              f"{r['schedule']}")
    print(f"geomean old/new: {geomean:.4f}; {info['device']}")
    bad = [r for r in results if abs(r["old_over_new"] - 1) > 0.02 or not r["bitwise_equal"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
