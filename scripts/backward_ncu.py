"""Issue 31: one backward call per schedule inside the CUDA profiler range, for Nsight Compute.

    ncu --profile-from-start off --section SpeedOfLight --section Occupancy \\
        --section LaunchStats --csv --page details python scripts/backward_ncu.py

Each case (a problem and a schedule, ``CASES``) runs once to compile and warm up, then once more
between ``cudaProfilerStart`` and ``cudaProfilerStop``, so ncu sees exactly the kernels of one
backward call (the dQ kernel, the dK/dV kernel, and the partials' sums of a split schedule).
"""

from __future__ import annotations

import torch

from tiledattention import BACKWARD, Problem

#: (label, problem, schedule changes from the sm_90 default)
CASES = (
    ("mqa-unsplit", Problem(batch=1, heads_q=8, heads_kv=1, seqlen_q=6144, seqlen_k=6144,
                            head_dim=128, dtype="bf16", causal=True), {"dkdv_splits": 1}),
    ("mqa-default", Problem(batch=1, heads_q=8, heads_kv=1, seqlen_q=6144, seqlen_k=6144,
                            head_dim=128, dtype="bf16", causal=True), {}),
    ("mha-full-8k", Problem(batch=1, heads_q=16, heads_kv=16, seqlen_q=8192, seqlen_k=8192,
                            head_dim=128, dtype="bf16", causal=False), {}),
)


def main() -> None:
    for label, problem, changes in CASES:
        case = BACKWARD.case(problem, 0)
        schedule = BACKWARD.default_schedule("sm_90", problem).replace(**changes)
        run = case.launcher(schedule)
        run()
        torch.cuda.synchronize()
        print(f"{label}: {problem.describe()} | {schedule.describe()}", flush=True)
        torch.cuda.cudart().cudaProfilerStart()
        run()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
