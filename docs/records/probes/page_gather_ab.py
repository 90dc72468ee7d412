"""Paged decode on the GPU: a key tile's pages gathered by one load (``PAGE_GATHER``, one TMA load
per page into one tile) against the same tile joined from page loads (``ct.cat``), the same
schedule both ways, interleaved, the L2 flushed before each sample; the device copy rate in the
same run. It ran at commit 4bf2d5e, whose decode kernel had ``PAGE_GATHER`` (reverted next: the
kernel has no such constant since; docs/records/benchmarks/paged/issue49/README.md):

    git checkout 4bf2d5e && source .devtk/setup.sh && python3 docs/records/probes/page_gather_ab.py

Each point prints both ways (``gather``, ``joined``), the time and the share of the copy rate on
the valid K/V bytes (read once), and the relative L2 error of each against the float32
reference; the flag is set on the plan's constants here, whatever the rule would choose.
"""

import torch

import tiledattention as ta
import tiledattention.kernels.decode._family as family
from tiledattention.kernels.decode import _launch
from tuner.measure import time_interleaved

REAL = _launch.launches


def with_gather(on):
    def launches(*args, **kwargs):
        plan = REAL(*args, **kwargs)
        names = _launch.SPLIT_PARAMETERS.names[15:]
        constants = dict(zip(names, plan.split_constants))
        constants["PAGE_GATHER"] = on
        return plan._replace(split_constants=tuple(constants[n] for n in names))
    return launches


def main():
    src = torch.empty(1 << 28, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    copy = time_interleaved({"copy": lambda: dst.copy_(src)}, rounds=10)["copy"].median_ms
    copy_gbps = 2 * src.numel() * 4 / (copy * 1e-3) / 1e9
    print(f"device copy {copy_gbps:.0f} GB/s (read + written)")
    # (batch, heads_q, heads_kv, longest cache, page size, key step)
    for b, hq, hkv, sk, page, tile_n in (
            (16, 32, 8, 32768, 16, 128), (48, 32, 8, 8192, 16, 128), (12, 28, 4, 16384, 16, 128),
            (16, 32, 8, 32768, 32, 128), (12, 28, 4, 16384, 32, 128), (16, 32, 8, 32768, 32, 256),
            (16, 32, 8, 32768, 16, 64), (16, 32, 8, 32768, 64, 128)):
        p = ta.Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=1, seqlen_k=sk, head_dim=128,
                       dtype="bf16", causal=True, bottom_right=True, ragged=True, page_size=page)
        case = ta.DECODE.case(p, 0)
        s = ta.DECODE.default_schedule("sm_90", p).replace(tile_n=tile_n)
        fns = {}
        for name, on in (("gather", True), ("joined", False)):
            family.launches = with_gather(on)
            try:
                fns[name] = case.launcher(s)
            finally:
                family.launches = REAL
        errors = {name: case.error(run) for name, run in fns.items()}
        times = time_interleaved(fns, rounds=20)
        valid = int(case.seqused.sum()) * hkv * 128 * 2 * 2
        print(f"== {p.describe()} {s.describe()} (the rule: "
              f"{'gather' if _launch.gathers_pages(page, tile_n) else 'joined'})")
        for name, t in times.items():
            gbps = valid / (t.median_ms * 1e-3) / 1e9
            print(f"  {name:8s} {1e3 * t.median_ms:8.1f} us {100 * gbps / copy_gbps:5.1f}% of copy "
                  f"err {errors[name]:.1e}")
        print(f"  joined / gather: {times['joined'].median_ms / times['gather'].median_ms:.2f}")


if __name__ == "__main__":
    main()
