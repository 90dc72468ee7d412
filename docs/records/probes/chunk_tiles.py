"""Chunked prefill (bottom-right causal calls, keys past the queries): the looked-up schedule
beside 64x128 tiles at two CTAs an SM, 128x128 tiles over a two-CTA cluster and 128x128 tiles
of 8 worker warps (each packed as the looked-up one is), and FlashAttention-4; ``--short``:
held-out chunks whose rows see fewer than 4096 keys, packed batches and dense calls. bf16, D
128; GPU view then isolated; each checked against float32.

    call 1 (carry .fa4): mkdir -p /root/fa4site && tar -xJf .fa4/fa4site.tar.xz -C /root/fa4site
    call 2 (carry .devtk): source .devtk/setup.sh && python3 docs/records/probes/chunk_tiles.py
"""
import argparse
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pack_idle_slots import HEADER, dense_case, measured, varlen_case  # noqa: E402

FAST = dict(exp2=True, approx_div=True, k_transposed=True, longest_first=True)
FORMS = {"default": {},
         "m64": dict(tile_m=64, tile_n=128, occupancy=2, num_ctas=1, kv_sawtooth=True, **FAST),
         "c2": dict(tile_m=128, tile_n=128, occupancy=2, num_ctas=2, kv_sawtooth=False,
                    **FAST),
         "w8": dict(tile_m=128, tile_n=128, occupancy=1, num_ctas=1, num_worker_warps=8,
                    kv_sawtooth=False, **FAST)}


def _uniform(b, hq, hkv, q, k):
    return f"B{b} H{hq}/{hkv} {q}/{k}", hq, hkv, [q] * b, [k] * b, False


def _dense(b, hq, hkv, q, k):
    return f"dense B{b} H{hq}/{hkv} {q}/{k}", hq, hkv, (b, q, k), None, True


def _mixed(n, hq, hkv, seed, lo=1000, hi=9000):
    rng = random.Random(seed)
    qs = [rng.randint(64, 1024 if hi > 2048 else 400) for _ in range(n)]
    ks = [q + rng.randint(lo, hi) for q in qs]
    return f"{n}x mixed H{hq}/{hkv} s{seed}", hq, hkv, qs, ks, False


CALLS = [_uniform(*c) for c in (
    (2, 32, 8, 512, 8000), (4, 32, 8, 256, 6000), (8, 32, 8, 384, 3000),
    (3, 32, 8, 1024, 5000), (1, 32, 8, 2048, 16000), (6, 28, 4, 250, 4500),
    (4, 28, 4, 640, 7000), (2, 28, 4, 1200, 3300), (12, 28, 4, 128, 2600),
    (5, 64, 8, 300, 4000), (2, 64, 8, 800, 12000), (16, 16, 2, 200, 2200),
    (3, 16, 2, 1500, 9000), (8, 40, 8, 450, 3600), (10, 32, 8, 96, 5000),
    (4, 32, 4, 700, 2800), (16, 32, 8, 256, 1800),
    (24, 28, 4, 128, 1500))] + [_mixed(*c) for c in (
        (8, 32, 8, 1), (12, 28, 4, 2), (6, 64, 8, 3), (16, 16, 2, 4))]
#: ``--short``: chunks whose rows see fewer than 4096 keys (held out), packed batches and dense
SHORT = [_uniform(*c) for c in (
    (16, 32, 8, 256, 1200), (24, 32, 8, 128, 700), (8, 28, 4, 512, 2000), (32, 16, 2, 64, 900),
    (12, 64, 8, 200, 1536), (6, 40, 8, 300, 1000), (10, 28, 4, 384, 3000),
    (20, 32, 4, 160, 2500))] + [_mixed(*c, lo=300, hi=1800) for c in (
        (24, 32, 8, 7), (16, 28, 4, 8))] + [_dense(*c) for c in (
            (8, 32, 8, 256, 1500), (16, 28, 4, 128, 1000), (4, 32, 8, 512, 3000),
            (32, 64, 8, 64, 2048))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--short", action="store_true")
    ap.add_argument("--no-fa4", action="store_true")
    args = ap.parse_args()
    rows = [HEADER, "|---|---|---|---|---|---|---|---|---|"]
    forms = {k: v for k, v in FORMS.items() if k != "w8" or not args.short}
    for name, hq, hkv, lq, lk, dense in SHORT if args.short else CALLS:
        case = dense_case(hq, hkv, *lq) if dense else varlen_case(hq, hkv, lq, lk)
        rows += measured(name, case, forms, args.rounds, fa4_too=not args.no_fa4)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
