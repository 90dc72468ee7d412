"""Tune the backward family's shipped sm_90 keys on the GPU machine (one ``tiledtune search``).

Keys: a training grid (issue 31): grouped-query 4:1 and 8:1 and multi-query heads at the lengths
models train at (2k-8k; batch 1-2), D 64/96/128/256, causal and not, bf16 and fp16; ``keys()``
lists them. Prints the command it runs.

    python scripts/tune_backward_shipped.py --db OUT.sqlite [--trials 8] [--timeout 20s]
        [--dtype bf16] [--dry-run]
"""

from __future__ import annotations

import argparse
import subprocess
import sys

import tiledattention as ta


#: (B, H_q, H_kv, S, D, causal, dtype): B·S = 4k-8k tokens, as one GPU's share of a batch
TRAINING = (
    # D 128: GQA 4:1 (Llama-3-8B), 8:1, multi-query; causal and not
    *[(b, 32, kv, s, 128, c, "bf16") for kv in (8, 4) for b, s in ((2, 2048), (1, 8192))
      for c in (True, False)],
    *[(b, 8, 1, s, 128, c, "bf16") for b, s in ((2, 2048), (1, 8192)) for c in (True, False)],
    # D 64, 96, 256
    (2, 16, 4, 4096, 64, True, "bf16"), (2, 16, 1, 4096, 64, True, "bf16"),
    (1, 32, 8, 4096, 96, True, "bf16"), (1, 16, 2, 4096, 256, True, "bf16"),
    (1, 8, 1, 4096, 256, True, "bf16"),
    # fp16
    (1, 32, 8, 4096, 128, True, "fp16"), (1, 32, 8, 4096, 128, False, "fp16"),
    (1, 8, 1, 4096, 128, True, "fp16"), (2, 16, 4, 2048, 64, True, "fp16"),
)


def keys(dtypes: tuple[str, ...] = ("bf16", "fp16")) -> list[str]:
    out = []
    for b, hq, hkv, s, d, causal, dtype in TRAINING:
        if dtype not in dtypes:
            continue
        f = dict(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=s, seqlen_k=s, head_dim=d,
                 dtype=dtype, causal=causal)
        ta.Problem(**f)  # valid
        out.append(",".join(f"{k}={str(v).lower()}" for k, v in f.items()))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--timeout", default=None, help="per key, e.g. 20s (tiledtune's syntax)")
    ap.add_argument("--dtype", choices=("bf16", "fp16"), action="append",
                    help="only these dtypes' keys (repeatable; default both)")
    ap.add_argument("--causal", choices=("yes", "no"), help="only the causal (or the other) keys")
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()
    chosen = keys(tuple(args.dtype or ("bf16", "fp16")))
    if args.causal:
        wanted = f"causal={'true' if args.causal == 'yes' else 'false'}"
        chosen = [k for k in chosen if k.endswith(wanted)]
    cmd = [sys.executable, "-m", "tuner.cli", "search", "--kernel", "backward", "--device",
           "sm_90", "--space", "compact", "--trials", str(args.trials), "--db", args.db]
    if args.timeout:
        cmd += ["--timeout", args.timeout]
    for key in chosen:
        cmd += ["--problem", key]
    print(f"{len(chosen)} keys:", " ".join(cmd), flush=True)
    if not args.dry_run:
        raise SystemExit(subprocess.call(cmd))


if __name__ == "__main__":
    main()
