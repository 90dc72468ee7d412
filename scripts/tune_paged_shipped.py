"""Tune the shipped sm_90 keys for paged decode (issue 34) on the GPU machine: one ``tiledtune
search`` of the decode family over paged buckets (``Problem.page_size``; the tuner's case holds
caches of 1, 3/4, 1/2 and 1/4 the bucket's longest in shuffled pages, as a continuous batch
mixes them). A decode step (one query row per entry), causal H 32/8, D 128, bf16, pages of 64
(and one key at 16); ``keys()`` lists them. ``--fp8``: the same steps over an FP8 (e4m3)
cache instead (``FP8_BUCKETS``: pages of 64 and 16). Prints the command it runs.

    python scripts/tune_paged_shipped.py --db OUT.sqlite [--trials 6] [--timeout 30s]
        [--fp8] [--dry-run]
"""

from __future__ import annotations

import argparse

from _search import add_search_options, problem_args, search

#: (entries, longest cache, page size)
BUCKETS = ((16, 32768, 64), (64, 32768, 64), (32, 16384, 64), (16, 32768, 16))
FP8_BUCKETS = ((16, 32768, 64), (16, 32768, 16))


def keys(fp8: bool = False) -> list[str]:
    extra = dict(kv_dtype="e4m3") if fp8 else {}
    return problem_args([dict(batch=batch, heads_q=32, heads_kv=8, seqlen_q=1, seqlen_k=longest,
                              head_dim=128, dtype="bf16", causal=True, bottom_right=True,
                              ragged=True, page_size=page, **extra)
                         for batch, longest, page in (FP8_BUCKETS if fp8 else BUCKETS)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_search_options(ap)
    ap.add_argument("--fp8", action="store_true", help="the FP8 (e4m3) cache's buckets")
    args = ap.parse_args()
    raise SystemExit(search("decode", keys(args.fp8), args))


if __name__ == "__main__":
    main()
