"""An A/A check of the isolated-call timing (``time_interleaved(..., host=True)``): one decode
call under three names, with and without a device copy of the cache's bytes in the rotation,
and the copy placed before each name in turn. Identical calls should read alike.

    source .devtk/setup.sh && python3 docs/records/probes/isolated_aa.py [--rounds 30]
"""

import argparse

import torch

import tiledattention as ta
from tuner.measure import time_interleaved


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    b, hq, hkv, sk, d = 1, 32, 8, 8192, 128
    q, k, v = (torch.randn(b, h, s, d, device="cuda", generator=g).to(torch.bfloat16)
               for h, s in ((hq, 1), (hkv, sk), (hkv, sk)))
    call = lambda: ta.sdpa(q, k, v)  # noqa: E731
    kv_bytes = 2 * k.numel() * k.element_size()
    src = torch.ones(kv_bytes // 4, dtype=torch.int32, device="cuda")
    dst = torch.empty_like(src)
    copy = lambda: dst.copy_(src)  # noqa: E731
    small = torch.empty(1024, device="cuda")
    tiny = lambda: small.fill_(1.0)  # noqa: E731
    sets = {
        "A/A/A": {"a1": call, "a2": call, "a3": call},
        "A/A/A + copy": {"a1": call, "a2": call, "a3": call, "copy": copy},
        "A/A/A + tiny kernel": {"a1": call, "a2": call, "a3": call, "tiny": tiny},
        "copy first, A/A/A": {"copy": copy, "a1": call, "a2": call, "a3": call},
    }
    for label, fns in sets.items():
        for view, kw in (("isolated", dict(host=True)), ("GPU", {})):
            t = time_interleaved(fns, rounds=args.rounds, **kw)
            print(f"{label:22s} {view:8s} " + "  ".join(
                f"{n} {1e3 * t[n].median_ms:6.1f}" for n in fns), flush=True)


if __name__ == "__main__":
    main()
