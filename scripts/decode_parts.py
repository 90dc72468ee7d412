"""Where a B = 1 decode call's time goes: the split kernel alone, the combine kernel alone and
both, interleaved with cuDNN, for a few split counts (H100 probe behind
docs/benchmarks/decode/README.md).

    python scripts/decode_parts.py
"""

from __future__ import annotations

import torch
import cuda.tile as ct

import tiledattention as ta
from tiledattention.decode import _launch as L
from tuner.measure import time_interleaved


def main() -> None:
    for sk in (4096, 32768):
        p = ta.Problem(batch=1, heads_q=32, heads_kv=8, seqlen_q=1, seqlen_k=sk, head_dim=128,
                       dtype="bf16", causal=False)
        case = ta.DECODE.case(p, 0)
        fns = dict(case.baselines())
        fns.pop("torch-efficient", None)
        for splits in (8, 16):
            for combine in ("kernel", "pdl"):
                s = ta.DecodeSchedule(splits=splits, tile_n=128, k_latency=2, v_latency=2,
                                      combine=combine)
                plan = L.launches(p, s, None)
                shapes = L.partial_shapes(plan)
                parts = tuple(torch.empty(x, dtype=torch.float32, device="cuda") for x in shapes)
                q5, out5 = L.grouped_view(case.q, plan.tiles), L.grouped_view(case.out, plan.tiles)
                stream = torch.cuda.current_stream()
                split_args = (q5, case.k, case.v, out5, *parts, plan.scale, 0, plan.tiles.kv_div,
                              *plan.split_constants)
                comb_args = (*parts, out5, *plan.combine_constants)
                name = f"s{splits}/{combine}"
                fns[name + " both"] = case.launcher(s)
                if combine == "kernel":
                    fns[name + " split only"] = (
                        lambda a=split_args, g=plan.split_grid, k=plan.split:
                        ct.launch(stream, g, k, a))
                    fns[name + " combine only"] = (
                        lambda a=comb_args, g=plan.combine_grid, k=plan.combine:
                        ct.launch(stream, g, k, a))
        times = time_interleaved(fns, rounds=40)
        print(f"== {p.describe()}")
        for name, t in sorted(times.items(), key=lambda kv: kv[1].median_ms):
            print(f"  {name:28s} {t.median_ms * 1000:7.1f} us")


if __name__ == "__main__":
    main()
