"""Contiguous decode whose rows (B x H_kv) pass the SMs by at most half (133-198 on 132): one
split at two CTAs an SM (the default before ``PART_FILL_SPLITS``) against 2-4 splits and a
third CTA an SM, cuDNN beside (``--sweep 1`` and ``--sweep 2``: the calls the rule was drawn
from); ``--check``: other calls, the rule's default against the one before it, GPU and
isolated views. Interleaved, medians of 15, the L2 flushed (section 49 of
``docs/records/benchmarks/paged/issue49/README.md``; its runs were this logic in two scratch
scripts, the same points and forms, the sweeps at medians of 12).

    source .devtk/setup.sh && python3 -u docs/records/probes/decode_part_fill.py --sweep 1
"""
import argparse
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import tiledattention as ta
from tiledattention.kernels.decode import layout
from tuner.measure import time_interleaved

sys.path.insert(0, "docs/records/probes")
from compile_ahead import compile_ahead  # noqa: E402
from paged_defaults import default_with  # noqa: E402

# (batch, heads_q, heads_kv, keys, head dim, dtype)
SWEEPS = {1: ((12, 12, 12, 48589, 64, "bf16"), (9, 16, 16, 30000, 64, "bf16"),
              (20, 8, 8, 20000, 64, "bf16"), (5, 32, 32, 12000, 64, "bf16"),
              (36, 32, 4, 9000, 64, "bf16"), (17, 32, 8, 16000, 128, "bf16"),
              (10, 16, 16, 25000, 96, "bf16"), (16, 16, 16, 8730, 64, "bf16")),
          2: ((7, 20, 20, 40000, 64, "fp16"), (34, 32, 4, 12000, 64, "bf16"),
              (19, 8, 8, 30000, 80, "bf16"), (11, 14, 14, 20000, 96, "fp16"),
              (21, 64, 8, 6000, 64, "bf16"), (45, 28, 4, 16000, 64, "bf16"),
              (6, 32, 32, 10000, 64, "bf16"), (25, 8, 8, 15000, 96, "fp16"),
              (14, 16, 16, 5000, 80, "bf16"), (4, 40, 40, 64000, 64, "bf16"),
              (3, 48, 48, 4000, 64, "bf16"), (18, 64, 8, 20000, 128, "bf16"))}
CHECK = ((8, 18, 18, 30000, 64, "bf16"), (17, 32, 8, 24000, 64, "fp16"),
         (5, 28, 28, 50000, 80, "bf16"), (23, 56, 7, 7000, 64, "bf16"),
         (44, 16, 4, 9000, 96, "fp16"), (2, 80, 80, 40000, 64, "bf16"),
         (11, 16, 16, 60000, 64, "bf16"), (47, 32, 4, 12000, 64, "bf16"))


def before(problem):
    """The default before the rule (``PART_FILL_MAX_ROWS_SHARE`` at 0)."""
    return default_with(problem, PART_FILL_MAX_ROWS_SHARE=0)


def cudnn(case):
    def run():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(case.q, case.k, case.v,
                                                                    enable_gqa=True)
    return run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", type=int, choices=sorted(SWEEPS))
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    points = CHECK if args.check else SWEEPS[args.sweep]
    problems = [ta.Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=1, seqlen_k=sk,
                           head_dim=d, dtype=dt, causal=False) for b, hq, hkv, sk, d, dt in points]
    forms = {}
    for p in problems:
        old = before(p)
        forms[p] = {"old": old}
        if args.check:
            forms[p]["new"] = ta.DECODE.default_schedule("sm_90", p)
        else:
            for s, o in ((2, 2), (3, 2), (4, 2), (2, 1), (4, 1), (1, 3)):
                forms[p][f"s{s} occ{o}"] = old.replace(
                    splits=s, occupancy=o, combine="block_pdl" if s > 1 else old.combine)
    compile_ahead([(p, s) for p in problems for s in forms[p].values()])
    for p in problems:
        case = ta.DECODE.case(p, 0)
        fns = {n: case.launcher(s) for n, s in forms[p].items()}
        errors = {n: case.error(f) for n, f in fns.items()}
        fns["cudnn"] = cudnn(case)
        gpu = {n: t.median_ms for n, t in time_interleaved(fns, rounds=15).items()}
        line = (f"{p.describe()} rows {layout(p, forms[p]['old']).rows} old "
                f"{forms[p]['old'].describe()} {gpu['old'] * 1e3:.1f} us; old / form: " +
                "  ".join(f"{n} {gpu['old'] / t:.3f}" for n, t in gpu.items()) +
                f"; worst error {max(errors.values()):.1e}")
        if args.check:
            iso = {n: t.median_ms for n, t in
                   time_interleaved(fns, rounds=15, host=True).items()}
            line += (f"; isolated old / new {iso['old'] / iso['new']:.3f}, cuDNN / new "
                     f"{iso['cudnn'] / iso['new']:.3f}")
        print(line, flush=True)


if __name__ == "__main__":
    main()
