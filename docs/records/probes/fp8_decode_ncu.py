"""Where an FP8-cache decode step's time goes (issue 52): the split kernel over an e4m3 cache
and over a bf16 cache of the same shape (each its sm_90 default), one launch each, under Nsight
Compute (``prefill_ncu.profile``: warm-up calls, then one launch each between
``cudaProfilerStart`` and ``cudaProfilerStop``, in an NVTX range named by its cache).

    source .devtk/setup.sh && ncu --profile-from-start off --clock-control none --set full \\
        --kernel-name regex:decode_split --export $OUT/fp8dec --force-overwrite \\
        python3 docs/records/probes/fp8_decode_ncu.py [--shape B,HQ/HKV,SK,D]
    ncu --import $OUT/fp8dec.ncu-rep --page details --csv > $OUT/details.csv
"""

import argparse
import dataclasses
import sys
from pathlib import Path

import tiledattention as ta

sys.path.insert(0, str(Path(__file__).parent))
from prefill_ncu import profile  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="1,32/8,40000,128")
    args = parser.parse_args()
    b, heads, sk, d = args.shape.split(",")
    hq, hkv = (heads.split("/") + [heads])[:2]
    bf16 = ta.Problem(batch=int(b), heads_q=int(hq), heads_kv=int(hkv), seqlen_q=1,
                      seqlen_k=int(sk), head_dim=int(d), dtype="bf16", causal=False)
    fns = {}
    for name, p in (("e4m3", dataclasses.replace(bf16, kv_dtype="e4m3")), ("bf16", bf16)):
        case = ta.DECODE.case(p, 0)
        schedule = ta.DECODE.default_schedule("sm_90", p)
        print(name, schedule.describe(), flush=True)
        fns[name] = case.launcher(schedule)
    profile(fns)


if __name__ == "__main__":
    main()
