"""Tune the backward family's shipped sm_90 keys on the GPU machine (one ``tiledtune search``).

Keys: the backward benchmark grid of issue 17 (bf16 and fp16, D in {64, 128, 256}, S in {1k, 4k,
16k}, causal and not, B·S = 16k, H·D = 2048) and Llama-style grouped-query training shapes
(H_q 32 / H_kv 8, D 128, causal, B·S = 16k at S = 2k, 4k, 8k, bf16). Prints the command it runs.

    python scripts/tune_backward_shipped.py --db OUT.sqlite [--trials 8] [--dtype bf16] [--dry-run]
"""

from __future__ import annotations

import argparse
import subprocess
import sys

import tiledattention as ta


def keys(dtypes: tuple[str, ...] = ("bf16", "fp16")) -> list[str]:
    fields = []
    for dtype in dtypes:
        for d in (64, 128, 256):
            for s in (1024, 4096, 16384):
                for causal in (False, True):
                    fields.append(dict(batch=16384 // s, heads_q=2048 // d, heads_kv=2048 // d,
                                       seqlen_q=s, seqlen_k=s, head_dim=d, dtype=dtype,
                                       causal=causal))
    for s in (2048, 4096, 8192) if "bf16" in dtypes else ():
        fields.append(dict(batch=16384 // s, heads_q=32, heads_kv=8, seqlen_q=s, seqlen_k=s,
                           head_dim=128, dtype="bf16", causal=True))
    out = []
    for f in fields:
        ta.Problem(**f)  # valid
        out.append(",".join(f"{k}={str(v).lower()}" for k, v in f.items()))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--dtype", choices=("bf16", "fp16"), action="append",
                    help="only these dtypes' keys (repeatable; default both)")
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()
    chosen = keys(tuple(args.dtype or ("bf16", "fp16")))
    cmd = [sys.executable, "-m", "tuner.cli", "search", "--kernel", "backward", "--device",
           "sm_90", "--space", "compact", "--trials", str(args.trials), "--db", args.db]
    for key in chosen:
        cmd += ["--problem", key]
    print(f"{len(chosen)} keys:", " ".join(cmd), flush=True)
    if not args.dry_run:
        raise SystemExit(subprocess.call(cmd))


if __name__ == "__main__":
    main()
