"""Where a batched D 128 decode call's time goes beside cuDNN's (issue 49: at 529-580 and
661-1320 rows one split reads 93-103% of the copy rate and cuDNN 1-4% more): our default split
kernel and torch's cuDNN SDPA on the same tensors, one launch each, under Nsight Compute
(``prefill_ncu.profile``: two warm-up calls, then one call each between ``cudaProfilerStart``
and ``cudaProfilerStop``, in an NVTX range of its name).

    source .devtk/setup.sh && ncu --profile-from-start off --clock-control none \\
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section LaunchStats \\
        --section Occupancy --section WarpStateStats --section SchedulerStats \\
        --export $OUT/dec --force-overwrite python3 docs/records/probes/decode_ncu_cudnn.py
    ncu --import $OUT/dec.ncu-rep --page details --csv > $OUT/details.csv
"""

import argparse
import sys
from pathlib import Path

import tiledattention as ta

sys.path.insert(0, str(Path(__file__).parent))
from prefill_ncu import profile  # noqa: E402

#: (batch, H_q, H_kv, keys): 840 and 560 rows of D 128, bf16
SHAPES = ((105, 32, 8, 4000), (70, 32, 8, 6000))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", action="append", default=[],
                        help="B,HQ/HKV,SK (D 128, bf16); repeatable")
    args = parser.parse_args()
    shapes = SHAPES
    if args.shape:
        shapes = []
        for text in args.shape:
            b, heads, sk = text.split(",")
            hq, hkv = heads.split("/")
            shapes.append((int(b), int(hq), int(hkv), int(sk)))
    fns = {}
    for b, hq, hkv, sk in shapes:
        p = ta.Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=1, seqlen_k=sk,
                       head_dim=128, dtype="bf16", causal=False)
        case = ta.DECODE.case(p, 0)
        schedule = ta.DECODE.default_schedule("sm_90", p)
        tag = f"B{b} H{hq}/{hkv} S{sk}"
        print(tag, schedule.describe(), flush=True)
        fns[f"ours {tag}"] = case.launcher(schedule)
        fns[f"cudnn {tag}"] = case.baselines()["torch-cudnn"]
    profile(fns)


if __name__ == "__main__":
    main()
