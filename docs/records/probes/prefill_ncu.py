"""Where a long causal prefill's time goes (issue 48, item 1): our forward kernel and
FlashAttention-4's, one launch each, under Nsight Compute (all sections). The launches sit
between ``cudaProfilerStart`` and ``cudaProfilerStop``, after warm-up calls outside them.

    source .devtk/setup.sh && ncu --profile-from-start off --clock-control none --set full \\
        --export $OUT/prefill --force-overwrite python3 docs/records/probes/prefill_ncu.py \\
        [--shape B,HQ/HKV,S,D] [--schedule NAME=JSON ...]
    ncu --import $OUT/prefill.ncu-rep --page details --csv > $OUT/details.csv

``--schedule``: more of our schedules to profile beside the default (a name and, as JSON,
the fields that differ from the default).
"""

import argparse
import json

import torch

import tiledattention as ta
from tuner.bench import build_peer_contender


def profile(fns):
    """Each of ``fns`` (name -> call) twice to warm up, then once each between
    ``cudaProfilerStart`` and ``cudaProfilerStop``, in an NVTX range of its name."""
    for fn in fns.values():
        fn()
        fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for name, fn in fns.items():
        torch.cuda.nvtx.range_push(name)
        fn()
        torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="1,40/8,16384,128")
    parser.add_argument("--schedule", action="append", default=[])
    parser.add_argument("--full", action="store_true", help="no causal mask")
    args = parser.parse_args()
    b, heads, s, d = args.shape.split(",")
    hq, hkv = (heads.split("/") + [heads])[:2]
    p = ta.Problem(batch=int(b), heads_q=int(hq), heads_kv=int(hkv), seqlen_q=int(s),
                   seqlen_k=int(s), head_dim=int(d), dtype="bf16", causal=not args.full)
    case = ta.FORWARD.case(p, 0)
    default = ta.FORWARD.default_schedule("sm_90", p)
    fns = {"default": case.launcher(default)}
    for item in args.schedule:
        name, text = item.split("=", 1)
        fns[name] = case.launcher(default.replace(**json.loads(text)))
    fns["flash-attn-4"], _ = build_peer_contender("flash-attn-4", p, case, backward=False)
    profile(fns)
    print("profiled:", ", ".join(fns), "at", p.describe())


if __name__ == "__main__":
    main()
