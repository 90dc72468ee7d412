"""Tune the shipped sm_90 keys for ragged batches (issue 33) on the GPU machine: one
``tiledtune search`` per family over ragged buckets (``Problem.ragged``: the longest length
and the token count rounded up to powers of two; the tuner's case packs sequences of 1, 3/4,
1/2 and 1/4 the bucket's length). Causal (bottom-right, as ``varlen_attn(is_causal=True)`` and
padding-free training look it up) H 32/8, D 128, bf16, longest 1k-16k, 16k-32k tokens,
and a D 64 multi-head and a D 128 MQA key (the backward: a subset); ``--full-mask`` the
bidirectional keys of encoders instead (BERT- and ViT-shaped: D 64 and D 128, longest 512-2k).
``keys()`` lists them. Prints the command it runs.

    python scripts/tune_ragged_shipped.py --db OUT.sqlite [--kernel forward|backward]
        [--full-mask] [--space compact|full] [--trials 6] [--timeout 30s] [--dry-run]
"""

from __future__ import annotations

import argparse

from _search import add_search_options, problem_args, search

#: (longest, sequences of that length the tokens fill, H_q, H_kv, D)
BUCKETS = (
    (1024, 16, 32, 8, 128), (1024, 32, 32, 8, 128), (2048, 8, 32, 8, 128),
    (2048, 16, 32, 8, 128), (4096, 4, 32, 8, 128), (4096, 8, 32, 8, 128),
    (8192, 2, 32, 8, 128), (16384, 2, 32, 8, 128),
    (2048, 8, 16, 16, 64), (4096, 4, 8, 1, 128),
)
#: the backward's: training lengths
BACKWARD_BUCKETS = ((1024, 16, 32, 8, 128), (2048, 8, 32, 8, 128), (4096, 4, 32, 8, 128),
                    (8192, 2, 32, 8, 128), (2048, 8, 16, 16, 64))
#: bidirectional (encoders; both families): BERT-base-shaped (H 12, D 64) and ViT- / larger
#: encoder-shaped (H 12 and 16, D 128) batches of sequences up to 512, 1k and 2k tokens, 16k-64k
#: tokens
FULL_MASK_BUCKETS = ((512, 64, 12, 12, 64), (1024, 32, 16, 16, 128), (2048, 16, 16, 16, 128),
                     (2048, 32, 16, 16, 128), (2048, 16, 12, 12, 128))


def keys(kernel: str = "forward", full_mask: bool = False) -> list[str]:
    buckets = (FULL_MASK_BUCKETS if full_mask else
               BUCKETS if kernel == "forward" else BACKWARD_BUCKETS)
    return problem_args([
        dict(batch=batch, heads_q=hq, heads_kv=hkv, seqlen_q=longest, seqlen_k=longest,
             head_dim=d, dtype="bf16", causal=not full_mask, bottom_right=not full_mask,
             ragged=True)
        for longest, batch, hq, hkv, d in buckets])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_search_options(ap)
    ap.add_argument("--kernel", choices=("forward", "backward"), default="forward")
    ap.add_argument("--full-mask", action="store_true", help="the bidirectional buckets")
    args = ap.parse_args()
    raise SystemExit(search(args.kernel, keys(args.kernel, args.full_mask), args))


if __name__ == "__main__":
    main()
