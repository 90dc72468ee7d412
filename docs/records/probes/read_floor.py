"""How fast can a cuTile kernel on this device only *read* a B1 decode call's K/V bytes (issue 49:
"B1 decode over 32k keys at least 85% of the copy rate; over 8k keys at least 60%")? A streaming
kernel with no attention in it: each CTA walks its share of the K and V tiles (contiguous, as a
decode split does; or strided over the grid), adds each tile's rows into a float32 tile by a
matrix product with ones (the tensor cores read the tiles from shared memory, as a decode's
products do) and stores one 128-wide row of sums. Its fastest form over tile rows, loads in
flight, CTAs an SM and walk is the floor a cuTile decode of those bytes could reach; it is
timed beside the default decode, cuDNN and a copy of the bytes, interleaved, L2 flushed, GPU
time (host hidden). Shares are of the 1 GiB copy rate of the same run, on the K/V bytes read
once (the copy's on its bytes read + written).

    source .devtk/setup.sh && python3 docs/records/probes/read_floor.py [--rounds 20]
    python3 docs/records/probes/read_floor.py --export [--sass]   # CPU: the forms, for sm_90
"""

import argparse
import itertools
import re
import subprocess
import sys
from pathlib import Path

import cuda.tile as ct

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]
WIDTH = 128  # the head dim: a K/V row

#: (H_q, H_kv, keys): B1 D128 bf16 caches of the issue and the record before
POINTS = ((32, 8, 4096), (32, 8, 8192), (32, 8, 16384), (32, 8, 32768), (8, 1, 65536))
#: (tile rows, loads in flight, CTAs an SM)
FORMS = tuple(itertools.product((64, 128, 256), (2, 4), (1, 2)))


@ct.kernel
def stream_read(k, v, out, tiles: int, ROWS: ConstInt, LATENCY: ConstInt, STRIDED: ConstBool):
    """CTA ``c`` of ``g`` adds the rows of tiles ``[c*tiles//g, (c+1)*tiles//g)`` of K and V
    (``[1, 1, keys, WIDTH]`` views; or, strided, tiles ``c, c+g, ...``) into a float32 tile and
    stores its column sums as row ``c``. (The arrays are 4-d as a decode's are: over a 2-d
    array of the same rows cuTile 1.7 loads with ``LDG``, not TMA.)"""
    c = ct.bid(0)
    g = ct.num_blocks(0)
    ones = ct.full((16, ROWS), 1.0, dtype=ct.bfloat16)
    acc = ct.zeros((16, WIDTH), dtype=ct.float32)

    def add(acc, a, i):
        tile = ct.load(a, (0, 0, i, 0), (1, 1, ROWS, WIDTH), latency=LATENCY,
                       padding_mode=ct.PaddingMode.ZERO)
        return ct.mma(ones, tile.reshape((ROWS, WIDTH)), acc)

    if STRIDED:
        for i in range(c, tiles, g):
            acc = add(add(acc, k, i), v, i)
    else:
        for i in range(c * tiles // g, (c + 1) * tiles // g):
            acc = add(add(acc, k, i), v, i)
    ct.store(out, (c, 0), ct.sum(acc, axis=0, keepdims=True) * (1.0 / 16))


def form_kernel(occupancy):
    """``stream_read`` compiled for ``occupancy`` CTAs an SM (its other form choices are
    constants of the launch)."""
    return stream_read.replace_hints(occupancy=occupancy)


def export_all(sass):
    """Compile every form for sm_90 on the CPU (no GPU): a typo costs no device time; with
    ``sass`` (``cuobjdump`` and ``nvdisasm`` on PATH) count stack stores, global loads and
    TMA loads in each."""
    from tiledattention.core._compile import array_constraint, export_cubin

    kv = array_constraint("bf16", (1, 1, 8 * 8192, WIDTH))
    out = array_constraint("fp32", (264, WIDTH))
    from cuda.tile import compilation as ctc
    tiles = ctc.ScalarConstraint(ct.int32)
    for rows, latency, occupancy in FORMS:
        for strided in (False, True):
            result = export_cubin(form_kernel(occupancy),
                                  [kv, kv, out, tiles, rows, latency, strided], "sm_90",
                                  f"stream_read {rows} {latency} {occupancy} {strided}")
            print(f"rows {rows} latency {latency} occupancy {occupancy} strided {strided}: "
                  f"{result.cubin_size} bytes, shared {result.shared_bytes}")
            if sass:
                path = Path("/tmp/read_floor.cubin")
                path.write_bytes(result.cubin)
                text = subprocess.run(["cuobjdump", "-sass", str(path)], capture_output=True,
                                      text=True).stdout
                ops = re.findall(r"\b(STL|LDG|UTMALDG)\b", text)
                print("  " + " ".join(f"{op} {ops.count(op)}" for op in ("STL", "LDG", "UTMALDG")))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--export", action="store_true")
    parser.add_argument("--sass", action="store_true")
    args = parser.parse_args()
    if args.export:
        export_all(args.sass)
        return
    import torch

    import tiledattention as ta
    from tiledattention.core._device import device_info
    from tuner.measure import time_interleaved

    sys.path.insert(0, str(Path(__file__).parent))
    from paged_defaults import copy_rate  # noqa: E402

    copy_gbps = copy_rate()
    stream = torch.cuda.current_stream()
    sms = device_info(0).sm_count
    table = []
    for hq, hkv, sk in POINTS:
        p = ta.Problem(batch=1, heads_q=hq, heads_kv=hkv, seqlen_q=1, seqlen_k=sk,
                       head_dim=WIDTH, dtype="bf16", causal=False)
        case = ta.DECODE.case(p, 0)
        k = torch.randn(1, 1, hkv * sk, WIDTH, dtype=torch.bfloat16, device="cuda")
        v = torch.randn_like(k)
        kv_bytes = 2 * k.numel() * 2
        reference = (k.float().sum((0, 1, 2)) + v.float().sum((0, 1, 2)))
        fns = {"default decode": case.launcher(ta.DECODE.default_schedule("sm_90", p)),
               "torch-cudnn": case.baselines()["torch-cudnn"]}
        both = torch.randn(2 * hkv * sk, WIDTH, dtype=torch.bfloat16, device="cuda")
        both_dst = torch.empty_like(both)
        fns["copy of the bytes"] = lambda: both_dst.copy_(both)
        for rows, latency, occupancy in FORMS:
            for strided in (False, True):
                grid = occupancy * sms
                tiles = k.shape[2] // rows
                out = torch.full((grid, WIDTH), float("nan"), device="cuda")
                kernel = form_kernel(occupancy)

                def run(kernel=kernel, out=out, grid=grid, tiles=tiles, rows=rows,
                        latency=latency, strided=strided):
                    ct.launch(stream, (grid, 1, 1), kernel,
                              (k, v, out, tiles, rows, latency, strided))
                run()
                got = out.sum(0)
                err = ((got - reference).norm() / reference.norm()).item()
                if not err < 1e-3:
                    print(f"  form {rows} {latency} {occupancy} {strided}: wrong sum "
                          f"(rel {err:.1e}), left out")
                    continue
                fns[f"read r{rows} L{latency} occ{occupancy}{' strided' if strided else ''}"] = run
        times = {name: t.median_ms * 1e-3 for name, t
                 in time_interleaved(fns, rounds=args.rounds).items()}

        def share(nbytes, seconds):
            return 100 * nbytes / seconds / 1e9 / copy_gbps

        print(f"== {p.describe()}: K/V {kv_bytes / 1e6:.1f} MB")
        for name, t in sorted(times.items(), key=lambda kv: kv[1]):
            moved = 2 * kv_bytes if name == "copy of the bytes" else kv_bytes
            print(f"  {name:34s} {t * 1e6:7.1f} us {share(moved, t):5.1f}% of copy")
        reads = {n: t for n, t in times.items() if n.startswith("read ")}
        best = min(reads, key=reads.get)
        table.append((p.describe(), kv_bytes, times["default decode"], times["torch-cudnn"],
                      times["copy of the bytes"], best, reads[best]))
    print("\n| call | K/V MB | default µs (% of copy) | cuDNN µs (%) | copy of the bytes µs "
          "(% read + written) | fastest read | its µs (%) |")
    print("|---|---|---|---|---|---|---|")
    for name, nbytes, ours, cudnn, copy, best, read in table:
        def pct(seconds, moved=nbytes):
            return f"{seconds * 1e6:.1f} ({100 * moved / seconds / 1e9 / copy_gbps:.1f})"
        print(f"| {name} | {nbytes / 1e6:.1f} | {pct(ours)} | {pct(cudnn)} | "
              f"{pct(copy, 2 * nbytes)} | {best} | {pct(read)} |")


if __name__ == "__main__":
    main()
