"""Tune the shipped sm_90 keys of the attention variants (issue 32) on the GPU machine: one
``tiledtune search`` per family.

Keys: the sliding windows real models use (128, 512, 1024 and 4096 tokens: GPT-OSS, Mistral,
Gemma 2/3) in prefill, decode and training, Gemma 2's logit softcap (50, head dim 256, with and
without its 4096 window) and GPT-OSS's sinks (head dim 64, over its full layers); ``keys()``
lists them. Prints each command it runs.

    python scripts/tune_variants_shipped.py --db OUT.sqlite --kernel forward [--trials 6]
        [--timeout 30s] [--dry-run]
"""

from __future__ import annotations

import argparse

from _search import add_search_options, problem_args, search


WINDOWS = (128, 512, 1024, 4096)

#: per family: problems as Problem fields (``window`` is the window's length in tokens,
#: ``window_left = window - 1``: the query's own key and the window - 1 before it)
KEYS = {
    "forward": (
        *[dict(batch=2, heads_q=32, heads_kv=8, seqlen=8192, head_dim=128, window=w)
          for w in WINDOWS],
        dict(batch=2, heads_q=16, heads_kv=8, seqlen=4096, head_dim=256, softcap=50.0),
        dict(batch=1, heads_q=16, heads_kv=8, seqlen=8192, head_dim=256, softcap=50.0,
             window=4096),
        dict(batch=2, heads_q=64, heads_kv=8, seqlen=4096, head_dim=64, sinks=True),
    ),
    "backward": (
        *[dict(batch=2, heads_q=32, heads_kv=8, seqlen=8192, head_dim=128, window=w)
          for w in WINDOWS],
        dict(batch=2, heads_q=16, heads_kv=8, seqlen=4096, head_dim=256, softcap=50.0),
        dict(batch=2, heads_q=64, heads_kv=8, seqlen=4096, head_dim=64, sinks=True,
             window=128),
    ),
    "decode": (
        *[dict(batch=b, heads_q=32, heads_kv=8, seqlen=1, seqlen_k=32768, head_dim=128,
               window=w) for b in (1, 8) for w in WINDOWS],
        dict(batch=8, heads_q=16, heads_kv=8, seqlen=1, seqlen_k=8192, head_dim=256,
             softcap=50.0, window=4096),
        dict(batch=8, heads_q=64, heads_kv=8, seqlen=1, seqlen_k=8192, head_dim=64, sinks=True,
             window=128),
    ),
}


def problem_fields(spec: dict) -> dict:
    """The Problem fields of one ``KEYS`` entry: causal (bottom-right for decode)."""
    seqlen_q = spec["seqlen"]
    fields = dict(batch=spec["batch"], heads_q=spec["heads_q"], heads_kv=spec["heads_kv"],
                  seqlen_q=seqlen_q, seqlen_k=spec.get("seqlen_k", seqlen_q),
                  head_dim=spec["head_dim"], dtype="bf16")
    if seqlen_q < fields["seqlen_k"]:
        fields.update(causal=False, bottom_right=True)
    else:
        fields.update(causal=True)
    if "window" in spec:
        fields["window_left"] = spec["window"] - 1
    if "softcap" in spec:
        fields["softcap"] = spec["softcap"]
    if spec.get("sinks"):
        fields["sinks"] = True
    return fields


def keys(kernel: str) -> list[str]:
    return problem_args([problem_fields(spec) for spec in KEYS[kernel]])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_search_options(ap)
    ap.add_argument("--kernel", choices=sorted(KEYS), action="append", required=True,
                    help="family to tune (repeatable)")
    args = ap.parse_args()
    status = 0
    for kernel in args.kernel:
        status = search(kernel, keys(kernel), args) or status
    raise SystemExit(status)


if __name__ == "__main__":
    main()
