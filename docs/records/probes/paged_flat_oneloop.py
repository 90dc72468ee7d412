"""The flat paged walk at D 64 in bf16 with one key-tile loop (issue 49, section 35 of
``docs/records/benchmarks/paged/issue49/README.md``). On sm_90 the bf16 D 64 ``flat_split``
kept 96-344 bytes of stack (``FLAT_SHORT_HEAD_DIM`` kept those batches on the split rule);
with its two key-tile loops (unmasked, then masked) made one loop that masks every tile, the
build keeps none with loads two steps ahead (tileiras 13.4, CPU). ``--variant``: a copy of
``tiledattention/kernels/decode/_flat_kernel.py`` with that loop (loaded beside this tree's
and launched in place of its ``flat_split``, ``packed_ab.py``'s way). Timed against the
default, the split rule and this tree's flat walk with loads four and two ahead, interleaved,
GPU view (L2 flushed, median of ``--rounds``), pages of 16, cycling and log-uniform cache
lengths; shares of the device copy rate (same run) on the valid K/V bytes.

    source .devtk/setup.sh && python3 docs/records/probes/paged_flat_oneloop.py \\
        --variant ab/flat_oneloop.py [--rounds 15]

(``ab/flat_oneloop.py``: ``git show d3ba538:tiledattention/kernels/decode/_flat_kernel.py``
with its two ``for j`` loops made one ``for j in range(start, stop)`` of masked folds; the
kernel has had that loop as its ``ONE_LOOP`` form since.) ``--held``: the default this drew
(one loop, loads ``FLAT_ONE_LOOP_LATENCY`` ahead) against the split rule before it, on
batches the first run did not have (``HELD``), no variant file, FlashAttention-4 beside where
it is importable (``../shared/device/pack-fa4``). ``--view isolated``: each sample one call from
an idle GPU (L2 flushed, drained), the host's time counted; ``--view loop``: calls back to
back (warm L2), the host's time counted, per call.
"""

import argparse
import os

import tiledattention as ta
from tiledattention.core import _case
from tiledattention.kernels.decode._defaults import SMALL_PAGE_LATENCY
from tiledattention.kernels.decode._launch import normalise

import paged_balance
from packed_ab import BEFORE, launch_before_when_asked, load_before
from paged_defaults import add_fa4, copy_rate
from tuner.measure import time_interleaved

MIXES = {"cycling": _case.paged_lengths, "log-uniform": paged_balance.log_uniform}
#: (batch, heads_q, heads_kv, longest cache, head dim, dtype): bf16 D 64 batches none of
#: ``paged_flat_stack.py``'s sets had, then one of its (B40 H16/16), then two the flat walk
#: is the default for (the one loop's cost where the two-loop build keeps no stack).
POINTS = ((24, 32, 8, 4000, 64, "bf16"), (48, 32, 8, 2500, 64, "bf16"),
          (8, 16, 4, 8000, 64, "bf16"), (64, 16, 8, 1500, 64, "bf16"),
          (40, 16, 16, 3000, 64, "bf16"),
          (24, 28, 4, 6000, 128, "bf16"), (32, 32, 8, 5000, 64, "fp16"))
HELD = ((32, 32, 8, 3000, 64, "bf16"), (16, 8, 2, 6000, 64, "bf16"),
        (96, 32, 8, 1000, 64, "bf16"), (20, 24, 8, 5000, 64, "bf16"),
        (16, 16, 4, 4000, 32, "bf16"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant")
    ap.add_argument("--held", action="store_true")
    ap.add_argument("--view", default="gpu", choices=("gpu", "isolated", "loop"))
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    if not args.held:
        stem = os.path.basename(args.variant).removesuffix(".py")
        launch_before_when_asked({stem: load_before(args.variant, "decode")})
    copy_gbps = copy_rate()
    original = _case.paged_lengths
    rows = []
    for b, hq, hkv, sk, d, dtype in HELD if args.held else POINTS:
        p = ta.Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=1, seqlen_k=sk, head_dim=d,
                       dtype=dtype, causal=True, bottom_right=True, ragged=True, page_size=16)
        default = ta.DECODE.default_schedule("sm_90", p)
        flat = normalise(p, default.replace(flat=True, occupancy=2))
        for mix, lengths in MIXES.items():
            _case.paged_lengths = lengths
            case = ta.DECODE.case(p, 0)

            def one_loop(fn):
                def call():
                    BEFORE["on"] = stem
                    try:
                        return fn()
                    finally:
                        BEFORE["on"] = None
                return call
            split_rule = default.replace(flat=False, k_latency=SMALL_PAGE_LATENCY,
                                         v_latency=SMALL_PAGE_LATENCY) if default.flat else default
            fns = {"default": case.launcher(default),
                   "split rule": case.launcher(normalise(p, split_rule))}
            for lat in () if args.held else (4, 2):
                walk = case.launcher(flat.replace(k_latency=lat, v_latency=lat))
                fns[f"flat K{lat}"] = walk
                fns[f"one loop K{lat}"] = one_loop(walk)
            errors = {name: case.error(fn) for name, fn in fns.items()}
            if args.held:
                add_fa4(p, case, fns, errors)
            times = time_interleaved(fns, rounds=args.rounds, host=args.view == "isolated",
                                     loop=args.view == "loop", flush_l2=args.view != "loop")
            valid = int(case.seqused.sum()) * hkv * d * 2 * 2
            base = times["default"].median_ms
            desc = (f"B{b} H{hq}/{hkv} D{d} {dtype} <= {sk} {mix} "
                    f"(default {default.describe()})")
            print(f"== {desc}: " + "  ".join(
                f"{n} {1e3 * t.median_ms:.1f}us "
                f"{valid / (t.median_ms * 1e-3) / (copy_gbps * 1e9):.0%} err {errors[n]:.1e}"
                for n, t in times.items()), flush=True)
            rows.append((desc, base, {n: base / t.median_ms for n, t in times.items()
                                      if n != "default"}))
    _case.paged_lengths = original
    print(f"# launches in place: {BEFORE['launches']}")
    names = list(rows[0][2])
    print("\n(speed-up over the default: its time over each)\n\n| batch | default µs | "
          + " | ".join(names) + " |")
    print("|---|---|" + "---|" * len(names))
    for desc, base, ratios in rows:
        print(f"| {desc} | {base * 1e3:.1f} | "
              + " | ".join(f"{ratios[n]:.3f}" for n in names) + " |")


if __name__ == "__main__":
    main()
