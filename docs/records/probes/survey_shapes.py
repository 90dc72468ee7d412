"""Random calls for a survey of the defaults against the peers (the shapes a re-measure might
pick: batch, heads, grouping, head dim, dtype, odd lengths, masks), printed as `tiledtune
bench --problem` arguments, one family a line:

    python3 docs/records/probes/survey_shapes.py [--seed 7] [--count 12] [--scale 1]

(``--scale``: the forward's and backward's work budgets a call, times this: 0.1 draws batches a
tenth as large, calls of ~0.1-4 ms where 1 draws ~1-40 ms.)

then on the GPU machine, for each printed line ``FAMILY ARGS``:

    python3 -m tuner.cli bench --kernel FAMILY ARGS --contenders tiledattention,torch-cudnn,flash-attn-4 \
        --interleave 10 --no-plots --no-matmul --out $OUT/FAMILY
"""

import argparse
import random

GROUPS = ((32, 8), (28, 4), (16, 16), (64, 8), (48, 1), (12, 12), (56, 8), (24, 3), (40, 8), (8, 1))


def problem(b, hq, hkv, sq, sk, d, causal, dtype):
    mask = {"full": "causal=no", "causal": "causal=yes",
            "bottom_right": "causal=yes,bottom_right=yes"}[causal]
    return (f"--problem batch={b},heads_q={hq},heads_kv={hkv},seqlen_q={sq},seqlen_k={sk},"
            f"head_dim={d},dtype={dtype},{mask}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--count", type=int, default=12)
    parser.add_argument("--scale", type=float, default=1.0)
    args = parser.parse_args()
    rnd = random.Random(args.seed)
    lines = {"forward": [], "backward": [], "decode": []}
    for family, budget in (("forward", 4e12 * args.scale), ("backward", 1.5e12 * args.scale)):
        for _ in range(args.count):
            hq, hkv = rnd.choice(GROUPS)
            d = rnd.choice((64, 80, 96, 128, 128, 256))
            s = int(2 ** rnd.uniform(9, 14.5)) | rnd.choice((0, 1))  # 512-23k, some odd
            causal = rnd.choice(("full", "causal", "causal", "bottom_right"))
            sq = s if causal != "bottom_right" else max(64, s // rnd.choice((2, 3, 4)))
            b = max(1, min(32, int(budget / (4 * hq * sq * s * d))))
            dtype = rnd.choice(("bf16", "bf16", "fp16"))
            lines[family].append(problem(b, hq, hkv, sq, s, d, causal, dtype))
    for _ in range(args.count):
        hq, hkv = rnd.choice(GROUPS)
        d = rnd.choice((64, 128, 128, 256))
        sk = int(2 ** rnd.uniform(10, 17))
        b = rnd.choice((1, 1, 2, 4, 8, 16, 24, 48, 96))
        while b * hkv * sk * d * 4 > 2e9:
            b = max(1, b // 2)
        lines["decode"].append(problem(b, hq, hkv, 1, sk, d, "full", rnd.choice(("bf16", "fp16"))))
    for family, items in lines.items():
        print(family, " ".join(items))


if __name__ == "__main__":
    main()
