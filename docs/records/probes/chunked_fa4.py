"""Chunked prefill over pages, ours beside FlashAttention-4 (issue 49, section 65): each one's
paged call (pages of 16, 64, 256; ours as the route reads them) over its own contiguous call,
on ``chunked_in_place``'s three calls and its first two held-out ones. bf16, bottom-right
causal, equal query counts; FA4 through ``flash_attn_varlen_func`` (``page_table`` with the
unused slots at page 0, ``seqused_k``). GPU view (L2 flushed, interleaved, medians of 7), then
the isolated view (host counted); each contender checked against the float32 reference.

    call 1 (carry .fa4): mkdir -p /root/fa4site && tar -xJf .fa4/fa4site.tar.xz -C /root/fa4site
    call 2 (carry .devtk): source .devtk/setup.sh && python3 docs/records/probes/chunked_fa4.py
"""
import itertools
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chunked_in_place import HELD, POINTS, call, inputs  # noqa: E402
from paged_mixed import pages_of  # noqa: E402

from tuner.measure import time_interleaved  # noqa: E402


def fa4(query, k, v, **kwargs):
    from flash_attn.cute import flash_attn_varlen_func

    out = flash_attn_varlen_func(query, k, v, causal=True, **kwargs)
    return out[0] if isinstance(out, tuple) else out


rows = []
for name, (hq, hkv), n, sq, sk, d in POINTS + HELD[:2]:
    caches, query, cu, want = inputs(hq, hkv, n, sq, sk, d)
    fns = {"ours contiguous": call(query, cu, caches, 0, None, {}, [sq] * n, [sk] * n)}
    for page in (16, 64, 256):
        fns[f"ours p{page}"] = call(query, cu, caches, page, None, {}, [sq] * n, [sk] * n)
    k, v = (torch.cat([c[i] for c in caches]) for i in (0, 1))
    cu_k = torch.tensor([0, *itertools.accumulate([sk] * n)], dtype=torch.int32, device="cuda")
    fns["fa4 contiguous"] = lambda k=k, v=v, cu_k=cu_k: fa4(
        query, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu_k, max_seqlen_q=sq, max_seqlen_k=sk)
    used = torch.full((n,), sk, dtype=torch.int32, device="cuda")
    for page in (16, 64, 256):
        kp, vp, table = pages_of(caches, page)
        table = table.clamp(min=0).contiguous()
        fns[f"fa4 p{page}"] = lambda kp=kp, vp=vp, table=table: fa4(
            query, kp, vp, cu_seqlens_q=cu, seqused_k=used, page_table=table, max_seqlen_q=sq,
            max_seqlen_k=sk)
    errs, ok = {}, {}
    with torch.no_grad():
        for who, f in fns.items():
            try:
                errs[who] = ((f().float() - want).norm() / want.norm()).item()
                ok[who] = f
            except Exception as exc:  # a form that cannot run: said so
                print(f"  {name} {who}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
        gpu = time_interleaved(ok, rounds=7)
        host = time_interleaved(ok, rounds=7, host=True)
    for who in ok:
        base = "ours contiguous" if who.startswith("ours") else "fa4 contiguous"
        g, h = gpu[who].median_ms, host[who].median_ms
        rows.append(f"| {name} | {who} | {1e3 * g:.1f} | {g / gpu[base].median_ms:.3f} | "
                    f"{g / gpu['ours contiguous'].median_ms:.3f} | {1e3 * h:.1f} | "
                    f"{h / host[base].median_ms:.3f} | {errs[who]:.1e} |")
        print(rows[-1], flush=True)
print("| call | contender | µs | ÷ own contiguous | ÷ ours contiguous | isolated µs | "
      "÷ own contiguous | rel L2 |\n|---|---|---|---|---|---|---|---|")
print("\n".join(rows))
