"""Forward schedules on packed batches (issue 50): each candidate forced on every ragged forward
launch (``ragged_launch`` patched to run ``BASE`` updated by the candidate's fields; a grouped
batch keeps its looked-up ``pack_gqa``), interleaved with what ``varlen_attn`` runs by itself
(``default``), GPU view (one call between events, L2 flushed: ``time_interleaved``), medians.
Each candidate's output is checked against the float32 reference first (relative L2 over
1e-2: left out, said so). The batches: ``packed_batches.py``'s and ``extra_batches()``'s.

    source .devtk/setup.sh && python3 docs/records/probes/packed_schedules.py \\
        [--causal] [--only a,b] [--cands "name;name"] [--rounds 9]
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from packed_batches import (batches, log_uniform, new_batches, packed_call,  # noqa: E402
                            rel, uniform, with_schedule_fields)

import tiledattention as ta  # noqa: E402
from tiledattention.tooling import varlen_reference  # noqa: E402
from tuner.measure import time_interleaved  # noqa: E402

FM = dict(exp2=True, approx_div=True)
LF = dict(longest_first=True, **FM)
FULL = {
    "128x128 o2 c2": dict(tile_m=128, tile_n=128, occupancy=2, num_ctas=2, k_transposed=True,
                          **FM),
    "128x128 o1 w8": dict(tile_m=128, tile_n=128, occupancy=1, num_worker_warps=8, v_latency=4,
                          unchecked_loads=True, **FM),
    "64x128 o2 kl2 vl2": dict(tile_m=64, tile_n=128, occupancy=2, k_latency=2, v_latency=2, **FM),
    "64x128 o2 vl4 unchk": dict(tile_m=64, tile_n=128, occupancy=2, v_latency=4,
                                unchecked_loads=True, **FM),
    "64x128 o3": dict(tile_m=64, tile_n=128, occupancy=3, k_latency=4, v_latency=2,
                      unchecked_loads=True, **FM),
    "64x64 o4": dict(tile_m=64, tile_n=64, occupancy=4, k_latency=2, v_latency=2,
                     kv_sawtooth=True, **FM),
    "64x64 o4 nosaw": dict(tile_m=64, tile_n=64, occupancy=4, k_latency=2, v_latency=2, **FM),
    "64x64 o3 saw": dict(tile_m=64, tile_n=64, occupancy=3, k_latency=2, v_latency=2,
                         kv_sawtooth=True, **FM),
    "64x128 o2 vl4 saw": dict(tile_m=64, tile_n=128, occupancy=2, v_latency=4, kv_sawtooth=True,
                              **FM),
    # the packed short D 128 default before the fiftieth session (no sawtooth)
    "old 64x128 o2 vl4": dict(tile_m=64, tile_n=128, occupancy=2, v_latency=4, **FM),
}
CAUSAL = {
    "c 128x128 o2 c2 lf": dict(tile_m=128, tile_n=128, occupancy=2, num_ctas=2,
                               k_transposed=True, **LF),
    "c 128x128 o2 c2 lf saw": dict(tile_m=128, tile_n=128, occupancy=2, num_ctas=2,
                                   kv_sawtooth=True, k_transposed=True, **LF),
    "c 64x128 o3 saw lf": dict(tile_m=64, tile_n=128, occupancy=3, kv_sawtooth=True, **LF),
    "c 128x128 o1 w8 lf": dict(tile_m=128, tile_n=128, occupancy=1, num_worker_warps=8,
                               v_latency=4, **LF),
    "c 64x128 o2 saw lf": dict(tile_m=64, tile_n=128, occupancy=2, kv_sawtooth=True, **LF),
}
BASE = dict(tile_m=64, tile_n=64, occupancy=1, num_ctas=1, num_worker_warps=None,
            k_latency=None, v_latency=None, k_transposed=False, exp2=False, approx_div=False,
            kv_sawtooth=False, longest_first=False, unchecked_loads=False, persistent=False,
            paired_tiles=False)


def extra_batches():
    """Bidirectional D 128 batches named in no other probe (name: lengths, H_q, H_kv, D,
    causal, dtype)."""
    g, h = torch.Generator().manual_seed(77), torch.Generator().manual_seed(78)
    bf16, fp16 = torch.bfloat16, torch.float16
    return {
        "x-short-h16": (uniform(g, 200, 20, 256), 16, 16, 128, False, bf16),
        "x-mid-gqa4-fp16": (uniform(g, 60, 100, 500), 32, 8, 128, False, fp16),
        "x-h12-300-512": (uniform(g, 40, 300, 512), 12, 12, 128, False, bf16),
        "x-logu-30-900": (log_uniform(g, 80, 30, 900), 16, 16, 128, False, bf16),
        "x-h8-tiny": (uniform(g, 300, 10, 120), 8, 8, 128, False, fp16),
        "y-enc-h12": (uniform(h, 100, 32, 480), 12, 12, 128, False, bf16),
        "y-gqa8-fp16": (uniform(h, 50, 64, 400), 32, 4, 128, False, fp16),
        "y-tiny-h32": (uniform(h, 400, 8, 64), 32, 32, 128, False, bf16),
        "y-logu-h24": (log_uniform(h, 64, 20, 500), 24, 8, 128, False, bf16),
        "y-near-1k": (uniform(h, 24, 700, 1000), 16, 16, 128, False, bf16),
    }


def forced(fn, fields):
    """``fn`` with every ragged forward launch running ``BASE`` updated by ``fields``."""
    return with_schedule_fields(fn, **{**BASE, **fields})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="encoder-d128,encoder-d128-1k,encoder-d128-2k,"
                                      "vit-d128-gqa,vision-full")
    ap.add_argument("--cands", default="", help="candidate names, ';'-separated (default: all)")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--causal", action="store_true", help="the causal candidates")
    args = ap.parse_args()
    chosen = batches() | new_batches() | extra_batches()
    pool = CAUSAL if args.causal else FULL
    cands = {n: f for n, f in pool.items() if not args.cands or n in args.cands.split(";")}
    summary = []
    for name in args.only.split(","):
        lengths, hq, hkv, d, causal, dtype = chosen[name]
        q, k, v, _, cu, longest, _ = packed_call(lengths, hq, hkv, d, causal, dtype)
        ref = varlen_reference(q.float(), k.float(), v.float(), cu, cu, causal=causal)

        def call():
            return ta.varlen_attn(q, k, v, cu, cu, longest, longest, is_causal=causal,
                                  enable_gqa=hq != hkv)
        chosen_schedule = ta.explain_varlen(q, k, v, cu, cu, longest, longest, is_causal=causal,
                                            enable_gqa=hq != hkv).schedule
        print(f"# {name}: {len(lengths)} seqs, {sum(lengths)} tokens, longest {longest}, "
              f"H {hq}/{hkv} D {d} causal {causal} {dtype}; default "
              f"{chosen_schedule.describe()}", flush=True)
        fns = {"default": call}
        for cand, fields in cands.items():
            fn = forced(call, fields)
            with torch.no_grad():
                err = rel(fn(), ref)
            if err > 1e-2:
                print(f"  {cand}: rel. L2 {err:.2e}, left out", flush=True)
                continue
            fns[cand] = fn
        with torch.no_grad():
            res = time_interleaved(fns, rounds=args.rounds)
        base = res["default"].median_ms
        line = (f"{name:16s} default {base * 1e3:7.1f} us | " + " ".join(
            f"[{n}] {base / r.median_ms:.3f}" for n, r in res.items() if n != "default"))
        print(line, flush=True)
        summary.append(line)
    print("\n## candidate's speed over the default (> 1: the candidate is faster)")
    for line in summary:
        print(line)


if __name__ == "__main__":
    main()
