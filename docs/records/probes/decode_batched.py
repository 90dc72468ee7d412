"""Batched decode on the GPU (issue 49: every GPU-bound decode shape at least 1.0x cuDNN): the
sm_90 default against occupancy 2 (with K loads two or four steps ahead) and one more split, on
contiguous caches of one length (torch's cuDNN beside) and on paged batches whose rows leave SMs
idle at one split. Interleaved, the L2 flushed before each sample; shares of the device copy
rate measured in the same run, on the K/V bytes read once.

    source .devtk/setup.sh && python3 docs/records/probes/decode_batched.py [--check]

``--check``: other points (none of the sweep's), the default against the default before the
occupancy rules (``paged_defaults.previous_default``), cuDNN beside contiguous points and
FlashAttention-4 beside paged ones where it is importable.
"""

import sys
from pathlib import Path

import tiledattention as ta
from tuner.measure import time_interleaved

sys.path.insert(0, str(Path(__file__).parent))
from paged_defaults import add_fa4, copy_rate, previous_default, report  # noqa: E402

CONTIGUOUS = ((24, 32, 8, 3000), (16, 32, 8, 4096), (32, 32, 8, 2048), (48, 28, 4, 1500),
              (12, 32, 8, 8192), (64, 32, 8, 1024), (20, 64, 8, 2500))
PAGED = ((10, 32, 8, 20000, 256), (20, 28, 4, 10000, 64), (12, 32, 8, 16384, 64))
CHECK = ((40, 32, 8, 2000), (18, 32, 8, 5000), (96, 32, 8, 700), (36, 28, 4, 2200),
         (14, 32, 8, 9000, 64), (15, 32, 8, 15000, 32), (30, 28, 4, 6000, 128))


def problem(b, hq, hkv, sk, page=0):
    return ta.Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=1, seqlen_k=sk, head_dim=128,
                      dtype="bf16", causal=bool(page), bottom_right=bool(page),
                      ragged=bool(page), page_size=page)


def main():
    copy_gbps = copy_rate()
    check = "--check" in sys.argv
    for point in CHECK if check else CONTIGUOUS + PAGED:
        p = problem(*point)
        case = ta.DECODE.case(p, 0)
        d = ta.DECODE.default_schedule("sm_90", p)
        candidates = {"default": d, "occ2": d.replace(occupancy=2),
                      "occ2 K4": d.replace(occupancy=2, k_latency=4),
                      "+1 split": d.replace(splits=d.splits + 1),
                      "+1 split occ2": d.replace(splits=d.splits + 1, occupancy=2)}
        if check:
            candidates = {"default": d, "previous": previous_default(p, d)}
        fns = {name: case.launcher(s) for name, s in candidates.items()}
        errors = {name: case.error(run) for name, run in fns.items()}
        if not p.page_size:
            fns["torch-cudnn"] = case.baselines()["torch-cudnn"]
            errors["torch-cudnn"] = float("nan")
        elif check:
            add_fa4(p, case, fns, errors)
        times = time_interleaved(fns, rounds=20)
        if p.page_size:
            kv = int(case.seqused.sum()) * p.heads_kv * p.head_dim * 2 * 2
        else:
            kv = p.batch * p.heads_kv * p.seqlen_k * p.head_dim * 2 * 2
        print(f"== {p.describe()} default {d.describe()}")
        report(times, kv, copy_gbps, errors, candidates)


if __name__ == "__main__":
    main()
