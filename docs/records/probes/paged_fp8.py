"""Paged decode over an FP8 cache on the GPU (issue 52: "paged FP8 decode likewise"): the
sm_90 default of an e4m3 cache against the same batch in bf16, on mixed-length paged batches
(the family's paged case: caches of the longest, 3/4, 1/2 and 1/4 of it, in shuffled pages) at
pages of 16 to 256, GQA 32/8 and 28/4. Interleaved, the L2 flushed before each sample (GPU
time); shares of the device copy rate (read + written, same run) on each cache's valid K/V
bytes read once; errors against the float32 attention of the dequantised cache.

    source .devtk/setup.sh && python3 docs/records/probes/paged_fp8.py
"""

import dataclasses
import sys
from pathlib import Path

import tiledattention as ta
from tuner.measure import time_interleaved

sys.path.insert(0, str(Path(__file__).parent))
from paged_defaults import copy_rate  # noqa: E402

# (batch, heads_q, heads_kv, longest cache, page size): none is a shipped or tested batch
POINTS = ((8, 32, 8, 20000, 16), (40, 28, 4, 6000, 16), (24, 32, 8, 9000, 32),
          (16, 32, 8, 12000, 64), (56, 28, 4, 3000, 64), (12, 32, 8, 30000, 256))


def main():
    copy_gbps = copy_rate()
    rows = []
    for b, hq, hkv, sk, page in POINTS:
        bf16 = ta.Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=1, seqlen_k=sk,
                          head_dim=128, dtype="bf16", causal=True, bottom_right=True,
                          ragged=True, page_size=page)
        fp8 = dataclasses.replace(bf16, kv_dtype="e4m3")
        fns, errors, nbytes, labels = {}, {}, {}, {}
        for name, p in (("e4m3", fp8), ("bf16", bf16)):
            case = ta.DECODE.case(p, 0)
            schedule = ta.DECODE.default_schedule("sm_90", p)
            fns[name] = case.launcher(schedule)
            errors[name] = case.error(fns[name])
            nbytes[name] = int(case.seqused.sum()) * hkv * 128 * 2 * (1 if p.kv_dtype else 2)
            labels[name] = schedule.describe()
        times = time_interleaved(fns, rounds=15)
        print(f"== {fp8.describe()}")
        for name, t in times.items():
            share = nbytes[name] / (t.median_ms * 1e-3) / 1e9 / copy_gbps
            print(f"  {name:5s} {1e3 * t.median_ms:8.1f} us {100 * share:5.1f}% of copy "
                  f"err {errors[name]:.1e} {labels[name]}")
        ratio = times["bf16"].median_ms / times["e4m3"].median_ms
        rows.append((fp8.describe(), 1e3 * times["e4m3"].median_ms,
                     1e3 * times["bf16"].median_ms, ratio,
                     nbytes["e4m3"] / (times["e4m3"].median_ms * 1e-3) / 1e9 / copy_gbps))
    print("\n| paged decode (mixed lengths) | e4m3 µs | bf16 µs | e4m3 ÷ bf16 speed | e4m3 share "
          "of copy |\n|---|---|---|---|---|")
    for what, f, h, r, share in rows:
        print(f"| {what} | {f:.1f} | {h:.1f} | {r:.2f} | {100 * share:.0f}% |")


if __name__ == "__main__":
    main()
