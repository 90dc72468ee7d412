"""Causal prefill below 4k keys at 64 < D <= 128 (issue 18): a few schedules against cuDNN.

    python scripts/short_causal_probe.py --set split --out $OUT/split_causal.json
    python scripts/short_causal_probe.py --set d128 --out $OUT/d128_causal.json

``--set split``: every causal fitting shape (``tuner.lookup.FITTING``) with 64 < D <= 128 and
three proxies of neither set (D96 B16 S1024, D80 and D128 at B16 S512), with the default, 64x128
tiles at occupancy 2, and 64x64 tiles at occupancy 2, 3, 4 (sawtooth, longest first; occupancy
3 also with latency hints 2). ``--set d128``: the causal D128 fitting shapes whose rows see
< 4k keys and ten proxies (S 256 to 3500, grouped, multi-head and multi-query, one fp16), with
the default and 64x128 occupancy 2 tiles with and without the sawtooth walk and longest-first
order (and the 64x64 tiles of the D64 default).

Each shape is timed interleaved with torch's cuDNN backend (``lookup_regret.measure``: compiled
ahead, checked against float32, 10 rounds, L2 flushed). Prints cuDNN / schedule per shape; the
JSON holds every time. The evidence of the default's short causal branches (``docs/lookup.md``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import lookup_regret

import tiledattention
from tiledattention import FORWARD, Problem
from tiledattention.forward import Schedule, head_dim_parts
from tuner.lookup import FITTING, HeldOutShape


def _causal(name: str, b: int, hq: int, hkv: int, s: int, d: int,
            dtype: str = "bf16") -> HeldOutShape:
    return HeldOutShape(name, Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=s,
                                      seqlen_k=s, head_dim=d, dtype=dtype, causal=True))


FAST = dict(exp2=True, approx_div=True, k_transposed=True)


def split_set() -> tuple[list[HeldOutShape], dict]:
    shapes = [s for s in FITTING if s.problem.causal and 64 < s.problem.head_dim <= 128]
    shapes += [_causal("proxy D96 S1024 B16", 16, 32, 32, 1024, 96),
               _causal("proxy D80 S512 B16", 16, 32, 32, 512, 80),
               _causal("proxy D128 S512 B16", 16, 32, 32, 512, 128)]

    def named(problem: Problem) -> dict[str, Schedule]:
        split = head_dim_parts(problem.head_dim, True)[1] != 0
        small = dict(tile_m=64, tile_n=64, kv_sawtooth=True, longest_first=True, split_d=split,
                     **FAST)
        return {"64x128 occ2": Schedule(tile_m=64, tile_n=128, occupancy=2, split_d=split,
                                        **FAST),
                **{f"64x64 occ{o}": Schedule(occupancy=o, **small) for o in (2, 3, 4)},
                "64x64 occ3 lat2": Schedule(occupancy=3, k_latency=2, v_latency=2, **small)}
    return shapes, named


def d128_set() -> tuple[list[HeldOutShape], dict]:
    shapes = [s for s in FITTING if s.problem.causal and s.problem.head_dim == 128
              and s.problem.seqlen_q < 4096 and not s.problem.bottom_right]
    shapes += [_causal(f"proxy B{b} H{hq}/{hkv} S{s}" + (" fp16" if dt == "fp16" else ""),
                       b, hq, hkv, s, 128, dt)
               for b, hq, hkv, s, dt in ((16, 32, 8, 512, "bf16"), (8, 32, 8, 1024, "bf16"),
                                         (32, 32, 8, 256, "bf16"), (4, 32, 8, 777, "bf16"),
                                         (16, 32, 32, 512, "bf16"), (8, 32, 32, 300, "bf16"),
                                         (16, 32, 1, 640, "bf16"), (2, 32, 8, 1200, "bf16"),
                                         (8, 32, 8, 1024, "fp16"), (1, 32, 8, 3500, "bf16"))]
    base = Schedule(tile_m=64, tile_n=128, occupancy=2, **FAST)

    def named(problem: Problem) -> dict[str, Schedule]:
        return {"64x128 occ2": base,
                "64x128 occ2 sawtooth longest-first": base.replace(kv_sawtooth=True,
                                                                   longest_first=True),
                "64x128 occ2 sawtooth": base.replace(kv_sawtooth=True),
                "64x128 occ2 longest-first": base.replace(longest_first=True),
                "64x64 occ4 sawtooth longest-first lat2": Schedule(
                    tile_m=64, tile_n=64, occupancy=4, kv_sawtooth=True, longest_first=True,
                    k_latency=2, v_latency=2, **FAST)}
    return shapes, named


SETS = {"split": split_set, "d128": d128_set}


def candidates(arch: str, problem: Problem, named) -> dict[str, tuple[str, Schedule]]:
    """key -> (names, normalised schedule) of the default and ``named(problem)``; names joined
    with '|' where two coincide."""
    pool: dict[str, tuple[str, Schedule]] = {}
    for name, schedule in {"default": FORWARD.default_schedule(arch, problem),
                           **named(problem)}.items():
        s = FORWARD.normalise(problem, schedule)
        pool[s.key] = ((pool[s.key][0] + "|" if s.key in pool else "") + name, s)
    return pool


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--set", required=True, choices=sorted(SETS), help="which shapes")
    parser.add_argument("--out", type=Path, required=True, help="the JSON results file")
    parser.add_argument("--rounds", type=int, default=10, help="interleaved timing rounds")
    parser.add_argument("--jobs", type=int, default=16, help="compile processes")
    args = parser.parse_args()
    shapes, named = SETS[args.set]()
    tiledattention.use_database(str(args.out.parent / "no-user-db.sqlite"))  # shipped + default
    arch = tiledattention.device_info(0).arch
    rows = lookup_regret.shipped_tuned_rows(arch)
    pools = {s.name: candidates(arch, s.problem, named) for s in shapes}
    failed = lookup_regret.compile_ahead(
        [(s.problem, sched) for s in shapes for _, sched in pools[s.name].values()], arch,
        args.jobs)
    records = []
    for shape in shapes:
        r = lookup_regret.measure("probe", shape, pools[shape.name], failed, rows, arch, args)
        records.append(r)
        args.out.write_text(json.dumps({"versions": lookup_regret.versions(),
                                        "shapes": records}, indent=1))
        times, cudnn = r["times"], r["cudnn_ms"]
        line = " ".join(f"{r['why'][k]}={cudnn / times[k]:.3f}"
                        for k in sorted(times, key=times.get))
        print(f"{shape.name} [{shape.problem.describe()}] cuDNN/x: {line}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
