"""Call-for-call check of a restructuring (GPU): the package at another revision against the
working tree, for the forward, decode and backward families, interleaved in one process.

    mkdir -p pre && git archive REV tiledattention | tar -x -C pre
    mv pre/tiledattention pre/tiledattention_pre
    python scripts/peers_check.py --old pre --out peers.json

Both sides run the same schedule (the current lookup's, passed explicitly) through their own
public entry points: ``sdpa`` for the forward and decode points, ``sdpa_with_lse`` then
``sdpa_backward`` for the backward ones, and ``sdpa_with_lse`` (the forward that keeps the
log-sum-exp) at the forward and backward points. Per point: whether the outputs (and gradients) are
bitwise equal, each side's relative L2 error against a float32 reference, and the median ratio
of the two sides' times over ``--repeats`` interleaved measurements (cold L2, stream launches).
The old package is imported as ``tiledattention_pre`` (its imports are relative).
"""

from __future__ import annotations

import argparse
import json
import sys

#: (family, B, H_q, H_kv, S_q, S_k, D, causal): shapes named in no doc's table
POINTS = [
    ("forward", 2, 16, 16, 1025, 1025, 64, False),
    ("forward", 1, 32, 8, 2048, 2048, 128, True),
    ("forward", 4, 12, 12, 777, 777, 96, True),
    ("forward", 1, 8, 1, 3000, 3000, 128, False),
    ("forward", 2, 16, 16, 300, 1337, 256, "bottom_right"),
    ("forward", 8, 24, 8, 512, 512, 80, False),
    ("decode", 1, 32, 8, 1, 4099, 128, False),
    ("decode", 8, 32, 8, 1, 8192, 128, False),
    ("decode", 1, 64, 8, 4, 30000, 128, "bottom_right"),
    ("decode", 16, 16, 16, 1, 1500, 64, False),
    ("backward", 1, 32, 8, 2048, 2048, 128, True),
    ("backward", 2, 16, 16, 1000, 1000, 64, False),
    ("backward", 1, 8, 1, 1500, 1500, 128, True),
    ("backward", 2, 8, 2, 700, 2100, 128, "bottom_right"),
]


def _rel(x, ref) -> float:
    import torch

    return (torch.linalg.vector_norm(x.float() - ref) / torch.linalg.vector_norm(ref)).item()


def _reference(q, k, v, causal):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention.bias import causal_lower_right

    kwargs = {"enable_gqa": q.shape[1] != k.shape[1]}
    if causal == "bottom_right":
        kwargs["attn_mask"] = causal_lower_right(q.shape[2], k.shape[2])
    else:
        kwargs["is_causal"] = bool(causal)
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), **kwargs)


def _ratio(run_new, run_old, args) -> tuple[float, float]:
    """The median over ``args.repeats`` interleaved measurements of new/old time, and the new
    side's last median (ms)."""
    from tuner.measure import time_interleaved

    ratios = []
    for _ in range(args.repeats):
        timings = time_interleaved({"new": run_new, "old": run_old}, rounds=args.rounds)
        ratios.append(timings["new"].median_ms / timings["old"].median_ms)
    return sorted(ratios)[len(ratios) // 2], timings["new"].median_ms


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", required=True, help="directory holding tiledattention_pre/")
    parser.add_argument("--out", default=None, help="write the results here as JSON")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import torch

    sys.path.insert(0, args.old)
    import tiledattention_pre as pre

    import tiledattention as new

    results = []
    for family, b, hq, hkv, sq, sk, d, causal in POINTS:
        gen = torch.Generator(device="cuda").manual_seed(11)

        def rand(*shape):
            return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=gen)

        q, k, v = rand(b, hq, sq, d), rand(b, hkv, sk, d), rand(b, hkv, sk, d)
        row = {"family": family, "shape": [b, hq, hkv, sq, sk, d], "causal": causal}
        if family == "backward":
            problem = new.problem_from_arrays(q, k, v, causal, None)[0]
            arch = new.device_info(0).arch
            fwd = new.FORWARD.default_schedule(arch, problem)
            bwd = new.runtime().resolution(new.BACKWARD, problem, 0).schedule
            old_fwd = pre.Schedule.from_dict(fwd.to_dict())
            old_bwd = pre.BackwardSchedule.from_dict(bwd.to_dict())
            grad_out = rand(b, hq, sq, d)
            o_new, lse_new = new.sdpa_with_lse(q, k, v, causal, schedule=fwd)
            o_old, lse_old = pre.sdpa_with_lse(q, k, v, causal, schedule=old_fwd)

            def run_new():
                return new.sdpa_backward(grad_out, q, k, v, o_new, lse_new, causal, schedule=bwd)

            def run_old():
                return pre.sdpa_backward(grad_out, q, k, v, o_old, lse_old, causal,
                                         schedule=old_bwd)

            got_new, got_old = run_new(), run_old()
            leaves = [x.detach().float().requires_grad_() for x in (q, k, v)]
            ref = torch.autograd.grad(_reference(*leaves, causal), leaves, grad_out.float())
            row["equal"] = (torch.equal(o_new, o_old) and torch.equal(lse_new, lse_old)
                            and all(torch.equal(a, c) for a, c in zip(got_new, got_old)))
            row["err_new"] = max(_rel(g, r) for g, r in zip(got_new, ref))
            row["err_old"] = max(_rel(g, r) for g, r in zip(got_old, ref))
            row["schedule"] = bwd.describe()
        else:
            resolution = new.explain(q, k, v, causal)
            assert resolution.family == family, (resolution.family, family)
            schedule = resolution.schedule
            old_type = pre.DecodeSchedule if family == "decode" else pre.Schedule
            old_schedule = old_type.from_dict(schedule.to_dict())

            def run_new():
                return new.sdpa(q, k, v, causal, schedule=schedule)

            def run_old():
                return pre.sdpa(q, k, v, causal, schedule=old_schedule)

            got_new, got_old = run_new(), run_old()
            ref = _reference(q, k, v, causal)
            row["equal"] = torch.equal(got_new, got_old)
            row["err_new"], row["err_old"] = _rel(got_new, ref), _rel(got_old, ref)
            row["schedule"] = schedule.describe()
        row["ratio"], row["new_ms"] = _ratio(run_new, run_old, args)
        if family != "decode":  # the forward a training step runs (log-sum-exp kept)
            if family == "forward":
                fwd, old_fwd = schedule, old_schedule
            lse_new, lse_old = (new.sdpa_with_lse(q, k, v, causal, schedule=fwd),
                                pre.sdpa_with_lse(q, k, v, causal, schedule=old_fwd))
            row["equal"] = row["equal"] and all(torch.equal(a, c)
                                                for a, c in zip(lse_new, lse_old))
            row["forward_lse_ratio"] = _ratio(
                lambda: new.sdpa_with_lse(q, k, v, causal, schedule=fwd),
                lambda: pre.sdpa_with_lse(q, k, v, causal, schedule=old_fwd), args)[0]
        results.append(row)
        print(json.dumps(row), flush=True)

    print(f"\n{'family':<9} {'shape':<28} {'causal':<13} {'equal':<6} {'err new':>8} "
          f"{'err old':>8} {'new/old':>8} {'fwd+lse':>8}")
    for r in results:
        lse = f"{r['forward_lse_ratio']:8.3f}" if "forward_lse_ratio" in r else f"{'-':>8}"
        print(f"{r['family']:<9} {str(r['shape']):<28} {str(r['causal']):<13} "
              f"{str(r['equal']):<6} {r['err_new']:8.1e} {r['err_old']:8.1e} {r['ratio']:8.3f} "
              f"{lse}")
    ratios = [r["ratio"] for r in results]
    geo = 1.0
    for x in ratios:
        geo *= x
    print(f"all equal: {all(r['equal'] for r in results)}; new/old time: geometric mean "
          f"{geo ** (1 / len(ratios)):.3f}, range {min(ratios):.3f}-{max(ratios):.3f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
