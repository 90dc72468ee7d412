"""Where a B1 decode call's time goes beside a kernel that only reads its bytes (issue 49): the
default call (split kernel and merge), its split kernel alone (the same plan with no merge
launched), a streaming read of the same K/V bytes at the split kernel's grid and occupancy
(``read_floor.stream_read``, 128-key tiles two loads ahead as the decode walks them), and the
fastest read form of ``read_floor.py`` (two CTAs an SM, tiles strided over the grid); then the same
with as many splits as two CTAs an SM hold (every SM busy; at most the merge's cap).
Interleaved, L2 flushed, GPU time.

    git show 36d0808^:docs/records/probes/read_floor.py > docs/records/probes/read_floor.py
    source .devtk/setup.sh && python3 docs/records/probes/decode_parts.py [--rounds 20]

(``read_floor.py`` left the tree to keep it small: restore it first, as above.)
"""

import argparse
import sys
from pathlib import Path

import cuda.tile as ct

import tiledattention as ta
from tiledattention.core._device import device_info
from tiledattention.kernels.decode._defaults import MAX_MERGED_ROWS
from tiledattention.kernels.decode._launch import launch, launches, partial_shapes
from tiledattention.kernels.decode._schedule import MAX_SPLITS
from tuner.measure import time_interleaved

sys.path.insert(0, str(Path(__file__).parent))
from paged_defaults import copy_rate  # noqa: E402
from read_floor import WIDTH, form_kernel  # noqa: E402

#: (B, H_q, H_kv, keys)
POINTS = ((1, 32, 8, 8192), (1, 32, 8, 16384), (1, 32, 8, 32768), (1, 8, 1, 65536),
          (2, 16, 4, 24000))


def main():
    import torch

    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    copy_gbps = copy_rate()
    stream = torch.cuda.current_stream()
    sms = device_info(0).sm_count
    table = []
    for b, hq, hkv, sk in POINTS:
        p = ta.Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=1, seqlen_k=sk,
                       head_dim=WIDTH, dtype="bf16", causal=False)
        case = ta.DECODE.case(p, 0)
        default = ta.DECODE.default_schedule("sm_90", p)
        rows = b * hkv
        wave = default.replace(splits=min(2 * sms // rows, MAX_SPLITS,
                                          MAX_MERGED_ROWS // default.tile_m), occupancy=2)
        kv_bytes = 2 * b * hkv * sk * WIDTH * 2
        k = case.k.reshape(1, 1, b * hkv * sk, WIDTH)  # (contiguous [B, H_kv, S, D])
        v = case.v.reshape(1, 1, b * hkv * sk, WIDTH)
        fns = {}
        for label, schedule in (("", default), (" wave", wave)):
            plan = launches(p, schedule, None)
            shapes = partial_shapes(plan)
            partials = tuple(torch.empty(s, dtype=torch.float32, device="cuda") for s in shapes)
            alone = plan._replace(combine=None)
            fns[f"whole{label}"] = case.launcher(schedule)
            fns[f"split alone{label}"] = (
                lambda alone=alone, partials=partials:
                launch(stream, alone, case.q, case.k, case.v, case.out, 0, partials))
            grid = schedule.splits * rows
            tiles = b * hkv * sk // 128
            out = torch.empty(grid, WIDTH, device="cuda")
            kernel = form_kernel(schedule.occupancy)
            fns[f"read at its grid{label}"] = (
                lambda kernel=kernel, out=out, grid=grid, tiles=tiles:
                ct.launch(stream, (grid, 1, 1), kernel, (k, v, out, tiles, 128, 2, False)))
        best = form_kernel(2)
        out = torch.empty(2 * sms, WIDTH, device="cuda")
        fns["read, fastest form"] = lambda: ct.launch(stream, (2 * sms, 1, 1), best,
                                                      (k, v, out, b * hkv * sk // 128, 128, 4,
                                                       True))
        errors = {name: case.error(fns[name]) for name in ("whole", "whole wave")}
        times = {name: t.median_ms * 1e-3 for name, t
                 in time_interleaved(fns, rounds=args.rounds).items()}
        print(f"== {p.describe()}: K/V {kv_bytes / 1e6:.1f} MB; default "
              f"{default.describe()}, wave {wave.describe()}; errors "
              + ", ".join(f"{n} {e:.1e}" for n, e in errors.items()))
        for name, t in sorted(times.items(), key=lambda kv: kv[1]):
            print(f"  {name:24s} {t * 1e6:7.1f} us "
                  f"{100 * kv_bytes / t / 1e9 / copy_gbps:5.1f}% of copy")
        table.append((p.describe(), default.splits, times))
    print("\n| call | splits | whole µs | split alone | read at its grid | whole, a wave of "
          "two an SM | its split alone | read at its grid | fastest read |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, splits, t in table:
        print(f"| {name} | {splits} | {t['whole'] * 1e6:.1f} | {t['split alone'] * 1e6:.1f} | "
              f"{t['read at its grid'] * 1e6:.1f} | {t['whole wave'] * 1e6:.1f} | "
              f"{t['split alone wave'] * 1e6:.1f} | {t['read at its grid wave'] * 1e6:.1f} | "
              f"{t['read, fastest form'] * 1e6:.1f} |")


if __name__ == "__main__":
    main()
