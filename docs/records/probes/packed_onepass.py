"""The one-pass backward of packed batches (issue 50, item 2), on the GPU: each batch's default
backward (the two kernels) against one-pass forms (``dq_mode="atomic"``: the dK/dV kernel adds
each pair's dQ share into a float32 accumulator by a bulk reduce-add, no dQ kernel), through
the family's ragged launcher as ``varlen_attn``'s backward runs it, FlashAttention-4's
``flash_attn_varlen_func`` backward beside where importable; then dense short calls
(``sdpa_backward`` with the schedule given), where the same trade (no second walk, float32
adds) may pay. GPU time (a spin hides the host; the L2 flushed), interleaved, median of
``--rounds``; every form's gradients checked against the default's.

    source .devtk/setup.sh && python3 docs/records/probes/packed_onepass.py [--only NAMES]
        [--rounds N] [--dense-only] [--packed-only]
"""

import argparse
import sys
from pathlib import Path

import torch

import tiledattention as ta
from tiledattention.core._dispatch import choose_family
from tiledattention.core._ragged import packed_row_stat
from tiledattention.entry_points._varlen import _view
from tiledattention.kernels.backward._family import ragged_accumulator
from tiledattention.kernels.backward._launch import launch_ragged, launches
from tuner.measure import time_interleaved

sys.path.insert(0, str(Path(__file__).parent))
from packed_batches import batches, fa4_backward, packed_call, pairs, rel  # noqa: E402

#: one-pass forms: the default's dK/dV fields, the softcap rule's wide tile (128 keys x 64
#: rows, one CTA an SM, 8 worker warps), 64 x 64 at two CTAs an SM
FORMS = {"one-pass": {},
         "one-pass 128x64 w8": dict(dkdv_tile_n=128, dkdv_tile_m=64, dkdv_occupancy=1,
                                    dkdv_worker_warps=8),
         "one-pass 64x64 occ2": dict(dkdv_tile_n=64, dkdv_tile_m=64, dkdv_occupancy=2,
                                     dkdv_worker_warps=None)}
#: dense short training calls: (B, H_q, H_kv, S, D, causal, dtype)
DENSE = [(8, 16, 16, 577, 64, False, torch.bfloat16),
         (32, 12, 12, 197, 64, False, torch.bfloat16),
         (4, 12, 4, 1000, 96, True, torch.bfloat16),
         (16, 32, 8, 512, 128, True, torch.float16),
         (2, 16, 16, 1024, 128, False, torch.bfloat16),
         (1, 8, 8, 256, 64, True, torch.bfloat16)]


def packed(args, fa4):
    for name, (lengths, hq, hkv, d, causal, dtype) in batches().items():
        if args.only and name not in args.only.split(","):
            continue
        t = sum(lengths)
        q, k, v, do, cu, longest, prep = packed_call(lengths, hq, hkv, d, causal, dtype)
        problem, layout, scale = prep.problem, prep.layout(cu, cu), prep.scale
        fam_f = choose_family("sm_90", problem, "sdpa_with_lse")
        fam_b = choose_family("sm_90", problem, "sdpa_backward")
        stream = torch.cuda.current_stream()
        out = torch.empty_like(q)
        lse = packed_row_stat(hq, t, q.device)
        fam_f.forward_with_lse(stream, _view(q), _view(k), _view(v), _view(out), lse, problem,
                               fam_f.default_schedule("sm_90", problem), scale, 0, ragged=layout)
        looked = ta.explain_varlen(q, k, v, cu, cu, longest, longest, is_causal=causal,
                                   enable_gqa=hq != hkv, training=True).schedule
        delta = packed_row_stat(hq, t, q.device)

        def run(s, gs):
            plan = launches(problem, s, scale)
            views = tuple(_view(x) for x in (q, k, v, out, do))
            accum = ragged_accumulator(plan, views[0])
            return lambda: launch_ragged(stream, plan, *views, lse, delta,
                                         *(_view(x) for x in gs), layout.ranges,
                                         layout.longest_q, layout.longest_k, packed=True,
                                         dq_accum=accum)
        want = tuple(torch.zeros_like(x) for x in (q, k, v))
        run(looked, want)()
        tried = [("lookup", looked)] + [
            (tag, fam_b.normalise(problem, looked.replace(dq_mode="atomic", **fields)))
            for tag, fields in FORMS.items()]
        fns, errs = {}, {}
        for tag, s in tried:
            grads = tuple(torch.zeros_like(x) for x in (q, k, v))
            try:
                run(s, grads)()
                torch.cuda.synchronize()
            except Exception as exc:
                print(f"  {tag}: {type(exc).__name__}: {str(exc)[:150]}", flush=True)
                continue
            errs[tag] = max(rel(a, b) for a, b in zip(grads, want))
            fns[tag] = run(s, grads)
        if fa4 is not None:
            fns["flash-attn-4"] = fa4_backward(fa4, q, k, v, do, cu, longest, causal)
        times = time_interleaved(fns, rounds=args.rounds)
        flops = 2.5 * pairs(lengths, causal) * 4 * hq * d
        base = times["lookup"].median_ms
        print(f"# {name}: {len(lengths)} sequences, {t} tokens, H {hq}/{hkv} D {d} "
              f"{'causal' if causal else 'full'}; lookup {looked}", flush=True)
        for tag, tm in times.items():
            err = errs.get(tag, float("nan"))  # FA4's is not checked here
            print(f"  bwd {tag:22s} {tm.median_ms * 1e3:8.1f} us {flops / tm.median_ms / 1e9:6.1f}"
                  f" TF/s  {base / tm.median_ms:5.2f}x lookup  err {err:.1e}", flush=True)


def dense(args):
    for b, hq, hkv, s, d, causal, dtype in DENSE:
        g = torch.Generator(device="cuda").manual_seed(2)
        q, do = (torch.randn(b, hq, s, d, device="cuda", dtype=dtype, generator=g) for _ in "qo")
        k, v = (torch.randn(b, hkv, s, d, device="cuda", dtype=dtype, generator=g) for _ in "kv")
        out, lse = ta.sdpa_with_lse(q, k, v, causal=causal)
        problem = ta.Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=s, seqlen_k=s,
                             head_dim=d, dtype={torch.bfloat16: "bf16"}.get(dtype, "fp16"),
                             causal=causal)
        base = ta.BACKWARD.default_schedule("sm_90", problem)
        tried = [("default", base)] + [
            (tag, ta.BACKWARD.normalise(problem, base.replace(dq_mode="atomic", **fields)))
            for tag, fields in FORMS.items()]
        want = tuple(torch.empty_like(x) for x in (q, k, v))
        ta.sdpa_backward(do, q, k, v, out, lse, causal, schedule=base, grads=want)
        fns, errs = {}, {}
        for tag, sch in tried:
            grads = tuple(torch.empty_like(x) for x in (q, k, v))

            def run(sch=sch, grads=grads):
                ta.sdpa_backward(do, q, k, v, out, lse, causal, schedule=sch, grads=grads)
            run()
            torch.cuda.synchronize()
            errs[tag] = max(rel(a, w) for a, w in zip(grads, want))
            fns[tag] = run
        times = time_interleaved(fns, rounds=args.rounds)
        flops = 2.5 * 4 * b * hq * d * problem.attended_pairs
        ref = times["default"].median_ms
        print(f"# dense B{b} H{hq}/{hkv} S{s} D{d} {'causal' if causal else 'full'} {dtype}; "
              f"default {base}", flush=True)
        for tag, tm in times.items():
            print(f"  bwd {tag:22s} {tm.median_ms * 1e3:8.1f} us {flops / tm.median_ms / 1e9:6.1f}"
                  f" TF/s  {ref / tm.median_ms:5.2f}x default  err {errs[tag]:.1e}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--dense-only", action="store_true")
    ap.add_argument("--packed-only", action="store_true")
    args = ap.parse_args()
    try:
        from flash_attn.cute import flash_attn_varlen_func as fa4
    except Exception:  # not installed here: no FA4 rows
        fa4 = None
    if not args.dense_only:
        packed(args, fa4)
    if not args.packed_only:
        dense(args)


if __name__ == "__main__":
    main()
