"""Tiles for packed batches of short sequences (issue 50), on the GPU: the forward's and the
backward's sm_90 defaults against other tiles, on ``packed_batches``' short-sequence batches,
FlashAttention-4 beside where importable. GPU time (a spin hides the host; the L2 flushed),
interleaved, median of ``--rounds``; every schedule's output checked against the default's.

    source .devtk/setup.sh && python3 docs/records/probes/packed_tiles.py [--only NAMES]
        [--forward-only] [--rounds N]

Candidates: ``FWD`` by head dim (bidirectional), ``FWD_CAUSAL`` (causal, D 128), ``BWD``; each
replaces some fields of the default, and ``lookup`` is added where the lookup's answer differs.
"""

import argparse
import sys
from pathlib import Path

import torch

import tiledattention as ta
from tiledattention.core._dispatch import choose_family
from tiledattention.core._ragged import packed_row_stat
from tiledattention.entry_points._varlen import _view
from tuner.measure import time_interleaved

sys.path.insert(0, str(Path(__file__).parent))
from packed_batches import batches, fa4_backward, packed_call, pairs, rel  # noqa: E402

FWD = {64: (dict(tile_m=128, tile_n=64, occupancy=2), dict(tile_m=128, tile_n=128, occupancy=1,
                                                          num_worker_warps=8),
            dict(tile_m=64, tile_n=128, occupancy=2), dict(tile_m=64, tile_n=32, occupancy=4)),
       128: (dict(tile_m=64, tile_n=64, occupancy=2, num_worker_warps=None),
             dict(tile_m=64, tile_n=128, occupancy=2, num_worker_warps=None),
             dict(tile_m=128, tile_n=64, occupancy=1, num_worker_warps=8),
             dict(tile_m=128, tile_n=128, occupancy=3, num_ctas=2, num_worker_warps=None,
                  kv_sawtooth=True, persistent=False))}
#: causal packed batches at D 128 (the rectangle's rules: 64x128 below 4k keys, 128x128 over a
#: two-CTA cluster beyond)
FWD_CAUSAL = (dict(tile_m=64, tile_n=128, occupancy=2, num_ctas=1, kv_sawtooth=True),
              dict(tile_m=128, tile_n=128, occupancy=2, num_ctas=1),
              dict(tile_m=64, tile_n=64, occupancy=3, num_ctas=1, kv_sawtooth=True),
              dict(tile_m=128, tile_n=64, occupancy=2, num_ctas=1, num_worker_warps=8))
BWD = {64: (dict(dkdv_tile_m=64), dict(dq_tile_m=128, dq_worker_warps=8),
            dict(dkdv_tile_n=128, dkdv_occupancy=1, dkdv_worker_warps=8),
            dict(dkdv_tile_m=64, dq_tile_n=128)),
       128: (dict(dq_tile_m=64, dq_worker_warps=None), dict(dq_tile_n=128),
             dict(dkdv_tile_n=128, dkdv_occupancy=1, dkdv_worker_warps=8),
             dict(dkdv_tile_m=128, dkdv_occupancy=1, dkdv_worker_warps=8))}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="encoder,encoder-d128,short-gqa7")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--forward-only", action="store_true")
    args = ap.parse_args()
    try:
        from flash_attn.cute import flash_attn_varlen_func as fa4
    except Exception:  # not installed here: no FA4 rows
        fa4 = None
    for name, (lengths, hq, hkv, d, causal, dtype) in batches().items():
        if name not in args.only.split(","):
            continue
        t = sum(lengths)
        q, k, v, do, cu, longest, packed = packed_call(lengths, hq, hkv, d, causal, dtype)
        problem, layout, scale = packed.problem, packed.layout(cu, cu), packed.scale
        fam_f = choose_family("sm_90", problem, "sdpa_with_lse")
        fam_b = choose_family("sm_90", problem, "sdpa_backward")
        looked_f = ta.explain_varlen(q, k, v, cu, cu, longest, longest, is_causal=causal,
                                     enable_gqa=hq != hkv)
        stream = torch.cuda.current_stream()
        out = torch.empty_like(q)
        lse = packed_row_stat(hq, t, q.device)
        base_f = fam_f.default_schedule("sm_90", problem)
        base_b = fam_b.default_schedule("sm_90", problem)
        print(f"# {name}: {problem.describe()}; lookup {looked_f.source}: "
              f"{looked_f.schedule}", flush=True)

        def fwd_run(s, o=None):
            o = out if o is None else o
            return lambda: fam_f.forward_with_lse(stream, _view(q), _view(k), _view(v), _view(o),
                                                  lse, problem, s, scale, 0, ragged=layout)
        ref = torch.empty_like(q)
        fwd_run(base_f, ref)()
        fns, errs = {}, {}
        tried = [("default", base_f)] + [(",".join(f"{a}={b}" for a, b in c.items()),
                                          base_f.replace(**c))
                                         for c in (FWD_CAUSAL if causal and d == 128 else FWD[d])]
        if looked_f.schedule != base_f:
            tried.append(("lookup", looked_f.schedule))
        for tag, s in tried:
            try:
                test = torch.full_like(q, float("nan"))
                fwd_run(s, test)()
                torch.cuda.synchronize()
                errs[tag] = rel(test, ref)
                fns[tag] = fwd_run(s)
            except Exception as exc:
                print(f"  fwd {tag}: {type(exc).__name__}: {str(exc)[:150]}")
        if fa4 is not None:
            fns["flash-attn-4"] = lambda: fa4(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu,
                                              max_seqlen_q=longest, max_seqlen_k=longest,
                                              causal=causal)
        times = time_interleaved(fns, rounds=args.rounds)
        flops = pairs(lengths, causal) * 4 * hq * d
        for tag, tm in times.items():
            print(f"  fwd {tag:60s} {tm.median_ms * 1e3:8.1f} us {flops / tm.median_ms / 1e9:6.1f}"
                  f" TF/s  err {errs.get(tag, float('nan')):.1e}", flush=True)

        if args.forward_only:
            continue
        # backward: the forward's lse from the default
        grads = tuple(torch.empty(x.shape, dtype=x.dtype, device=x.device) for x in (q, k, v))
        delta = packed_row_stat(hq, t, q.device)

        def bwd_run(s, gs=grads):
            return lambda: fam_b.backward(stream, problem, s, scale, _view(q), _view(k), _view(v),
                                          _view(ref), _view(do), lse, delta,
                                          tuple(_view(x) for x in gs), ragged=layout)
        fwd_run(base_f, ref)()
        want = tuple(torch.empty_like(x) for x in grads)
        bwd_run(base_b, want)()
        fns, errs = {}, {}
        looked_b = ta.explain_varlen(q, k, v, cu, cu, longest, longest, is_causal=causal,
                                     enable_gqa=hq != hkv, training=True)
        print(f"  backward lookup {looked_b.source}: {looked_b.schedule}")
        tried = [("default", base_b)] + [(",".join(f"{a}={b}" for a, b in c.items()),
                                          base_b.replace(**c)) for c in BWD[d]]
        if looked_b.schedule != base_b:
            tried.append(("lookup", looked_b.schedule))
        for tag, s in tried:
            try:
                test = tuple(torch.full_like(x, float("nan")) for x in grads)
                bwd_run(s, test)()
                torch.cuda.synchronize()
                errs[tag] = max(rel(a, b) for a, b in zip(test, want))
                fns[tag] = bwd_run(s)
            except Exception as exc:
                print(f"  bwd {tag}: {type(exc).__name__}: {str(exc)[:150]}")
        if fa4 is not None:
            fns["flash-attn-4"] = fa4_backward(fa4, q, k, v, do, cu, longest, causal)
        times = time_interleaved(fns, rounds=args.rounds)
        for tag, tm in times.items():
            print(f"  bwd {tag:60s} {tm.median_ms * 1e3:8.1f} us "
                  f"{2.5 * flops / tm.median_ms / 1e9:6.1f} TF/s  err "
                  f"{errs.get(tag, float('nan')):.1e}", flush=True)
        print(f"  defaults: fwd {base_f}\n            bwd {base_b}", flush=True)


if __name__ == "__main__":
    main()
