"""Tune the decode family's shipped sm_90 keys on the GPU machine (one ``tiledtune search``).

Keys (issue 16): S_q = 1, S_k in {1k, 2k, ..., 128k}, B in {1, 8, 32}, H_q 32 with H_kv 8 or 4
(group size 4, 8), D = 128, bf16 and fp16, no mask; keys whose K/V exceed the kernel's int32
indexing (B = 32 with the longest caches) are left out. Prints the command it runs.

    python scripts/tune_decode_shipped.py --db OUT.sqlite [--trials 5] [--dry-run]
"""

from __future__ import annotations

import argparse
import subprocess
import sys

import tiledattention as ta


def keys() -> list[str]:
    out = []
    for dtype in ("bf16", "fp16"):
        for heads_kv in (8, 4):
            for batch in (1, 8, 32):
                for exp in range(10, 18):
                    fields = dict(batch=batch, heads_q=32, heads_kv=heads_kv, seqlen_q=1,
                                  seqlen_k=1 << exp, head_dim=128, dtype=dtype, causal=False)
                    try:
                        ta.Problem(**fields)
                    except ta.UnsupportedProblemError:
                        continue
                    out.append(",".join(f"{k}={str(v).lower()}" for k, v in fields.items()))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()
    cmd = [sys.executable, "-m", "tuner.cli", "search", "--kernel", "decode", "--device",
           "sm_90", "--space", "compact", "--trials", str(args.trials), "--db", args.db]
    for key in keys():
        cmd += ["--problem", key]
    print(f"{len(keys())} keys:", " ".join(cmd), flush=True)
    if not args.dry_run:
        raise SystemExit(subprocess.call(cmd))


if __name__ == "__main__":
    main()
