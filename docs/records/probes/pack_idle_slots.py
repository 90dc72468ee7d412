"""Groups that are not a power of two (7, 3, 5, 6) packed into a power of two of head slots
(``pack_gqa``, issue 49 section 66) beside FlashAttention-4: the looked-up schedule, it packed,
tiles with or without a cluster, packed or not (``FORMS``); ``--held``: held-out calls. Varlen
calls force the fields on every ragged launch, dense ones pass ``schedule=``. bf16, D 128,
causal (bottom-right for chunks); GPU view, then isolated; checked against float32.

    call 1 (carry .fa4): mkdir -p /root/fa4site && tar -xJf .fa4/fa4site.tar.xz -C /root/fa4site
    call 2 (carry .devtk): source .devtk/setup.sh && python3 docs/records/probes/pack_idle_slots.py
        [--rounds 7] [--held]
"""
import argparse
import dataclasses
import itertools
import os
import random
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from packed_batches import with_schedule_fields  # noqa: E402
from paged_mixed import DTYPE, reference  # noqa: E402

import tiledattention as ta  # noqa: E402
from tuner.measure import time_interleaved  # noqa: E402


def _chunk(n, hq, hkv, q, k):
    return f"B{n} H{hq}/{hkv} {q} over {k}", (hq, hkv), [q] * n, [k] * n


def _lengths(n, lo, hi, seed):
    rng = random.Random(seed)
    return [rng.randint(lo, hi) for _ in range(n)]


#: varlen calls: name, (H_q, H_kv), query counts, key counts
VARLEN = (_chunk(6, 28, 4, 400, 3000),
          _chunk(3, 40, 8, 700, 5000),
          _chunk(4, 12, 2, 512, 4000),
          _chunk(8, 24, 8, 300, 2500),
          ("64 x 100-400 H28/4", (28, 4), *(2 * [_lengths(64, 100, 400, 1)])),
          ("16 x 500-2000 H20/4", (20, 4), *(2 * [_lengths(16, 500, 2000, 2)])),
          ("64 x 100-400 H32/8", (32, 8), *(2 * [_lengths(64, 100, 400, 1)])))
#: ``--held``: calls the rule for groups of 7 was not chosen on
HELD_VARLEN = (_chunk(2, 28, 4, 256, 6000),
               _chunk(12, 28, 4, 128, 2000),
               _chunk(3, 28, 4, 900, 3500),
               ("32 x 50-600 H28/4", (28, 4), *(2 * [_lengths(32, 50, 600, 3)])),
               ("8 x 1000-3000 H28/4", (28, 4), *(2 * [_lengths(8, 1000, 3000, 4)])),
               _chunk(4, 28, 4, 300, 8000),
               _chunk(16, 28, 4, 64, 1500),
               _chunk(5, 28, 4, 600, 2400),
               _chunk(6, 28, 4, 400, 3000))
#: dense calls: name, (H_q, H_kv), batch, queries, keys
DENSE = (("B2 H28/4 2048", (28, 4), 2, 2048, 2048),
         ("B1 H28/4 8192", (28, 4), 1, 8192, 8192),
         ("B4 H28/4 32 over 4096", (28, 4), 4, 32, 4096),
         ("B2 H40/8 1500", (40, 8), 2, 1500, 1500),
         ("B4 H32/8 32 over 4096", (32, 8), 4, 32, 4096))
D = 128
_NO_CLUSTER = (("m64", dict(tile_m=64, tile_n=128, occupancy=2, num_ctas=1)),
               ("m128 c1", dict(tile_m=128, tile_n=128, occupancy=1, num_worker_warps=8,
                                num_ctas=1)))
#: the looked-up schedule changed by these fields (None: as looked up)
FORMS = {"default": None, "pack": dict(pack_gqa=True),
         "m128 c2 pack": dict(tile_m=128, tile_n=128, occupancy=2, num_ctas=2, pack_gqa=True),
         **{name + tail: dict(fields, pack_gqa=bool(tail)) for name, fields in _NO_CLUSTER
            for tail in ("", " pack")}}
#: ``--held``: the looked-up schedule (forced as the other is: a fair isolated view), unpacked
HELD_FORMS = {"default": {}, "unpacked": dict(pack_gqa=False)}
HEADER = ("| call | contender | µs | ÷ default | ÷ FA4 | isolated µs | ÷ default | ÷ FA4 | "
          "rel L2 |")


def _changed(schedule, fields):
    schedule = schedule.replace(**fields)
    if fields.get("pack_gqa") and schedule.occupancy > 3:
        schedule = schedule.replace(occupancy=3)
    return schedule


def varlen_case(hq, hkv, lens_q, lens_k):
    gen = torch.Generator(device="cuda").manual_seed(2)
    caches = [tuple(torch.randn(sk, hkv, D, generator=gen, dtype=DTYPE, device="cuda")
                    for _ in range(2)) for sk in lens_k]
    query = torch.randn(sum(lens_q), hq, D, generator=gen, dtype=DTYPE, device="cuda")
    cu = torch.tensor([0, *itertools.accumulate(lens_q)], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, *itertools.accumulate(lens_k)], dtype=torch.int32, device="cuda")
    k, v = (torch.cat([c[i] for c in caches]) for i in (0, 1))
    want = reference(query, cu, caches)
    args = (query, k, v, cu, cu_k, max(lens_q), max(lens_k))

    def ours(fields):
        def run():
            return ta.varlen_attn(*args, is_causal=True, enable_gqa=True)
        if fields is None:
            return run
        base = ta.explain_varlen(*args, is_causal=True, enable_gqa=True).schedule
        return with_schedule_fields(run, **dataclasses.asdict(_changed(base, fields)))

    def fa4():
        from flash_attn.cute import flash_attn_varlen_func

        out = flash_attn_varlen_func(query, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu_k,
                                     max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_k),
                                     causal=True)
        return out[0] if isinstance(out, tuple) else out
    return ours, fa4, want


def dense_case(hq, hkv, b, sq, sk):
    gen = torch.Generator(device="cuda").manual_seed(3)
    q = torch.randn(b, hq, sq, D, generator=gen, dtype=DTYPE, device="cuda")
    k, v = (torch.randn(b, hkv, sk, D, generator=gen, dtype=DTYPE, device="cuda")
            for _ in range(2))
    causal = "bottom_right" if sq != sk else True
    keep = (torch.arange(sk, device="cuda")[None, :]
            <= torch.arange(sq, device="cuda")[:, None] + sk - sq)
    want = F.scaled_dot_product_attention(
        q.float(), *(x.float().repeat_interleave(hq // hkv, 1) for x in (k, v)), attn_mask=keep)
    q4, k4, v4 = (x.transpose(1, 2).contiguous() for x in (q, k, v))

    def ours(fields):
        if fields is None:
            return lambda: ta.sdpa(q, k, v, causal)
        schedule = _changed(ta.explain(q, k, v, causal).schedule, fields)
        return lambda: ta.sdpa(q, k, v, causal, schedule=schedule)

    def fa4():
        from flash_attn.cute import flash_attn_func

        out = flash_attn_func(q4, k4, v4, causal=True)
        return (out[0] if isinstance(out, tuple) else out).transpose(1, 2)
    return ours, fa4, want


def measured(name, case, forms, rounds, fa4_too=True):
    """Rows of ``case`` (``ours, fa4, want``) under ``forms`` and FA4: checked, timed (GPU,
    isolated), over the first form's and FA4's time."""
    ours, fa4, want = case
    fns, errs = {}, {}
    with torch.no_grad():
        for who in [*forms] + (["fa4"] if fa4_too else []):
            try:
                f = fa4 if who == "fa4" else ours(forms[who])
                errs[who] = ((f().float() - want).norm() / want.norm()).item()
                fns[who] = f
            except Exception as exc:  # a form that cannot run
                print(f"  {name} {who}: {exc!r:.160}", flush=True)
        gpu = time_interleaved(fns, rounds=rounds)
        host = time_interleaved(fns, rounds=rounds, host=True)
    rows = []
    for who in fns:
        cells = [f"{1e3 * t[who].median_ms:.1f} | "
                 + " | ".join(f"{t[who].median_ms / t[base].median_ms:.3f}" if base in t
                              else "-" for base in (next(iter(forms)), "fa4"))
                 for t in (gpu, host)]
        rows.append(f"| {name} | {who} | {' | '.join(cells)} | {errs[who]:.1e} |")
    print("\n".join(rows), flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--held", action="store_true")
    args = ap.parse_args()
    rows = [HEADER, "|---|---|---|---|---|---|---|---|---|"]
    varlen, dense = (HELD_VARLEN, ()) if args.held else (VARLEN, DENSE)
    forms = HELD_FORMS if args.held else FORMS
    cases = ([(name, varlen_case, (*heads, lq, lk)) for name, heads, lq, lk in varlen]
             + [(name, dense_case, (*heads, b, sq, sk)) for name, heads, b, sq, sk in dense])
    for name, make, shape in cases:
        rows += measured(name, make(*shape), forms, args.rounds)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
