"""The flat paged walk at D <= 64 in bf16 with one key-tile loop (issue 49, section 35 of
``docs/records/benchmarks/paged/issue49/README.md``). On sm_90 the bf16 D 64 ``flat_split``
with its two key-tile loops (unmasked, then masked) kept 96-344 bytes of stack
(``FLAT_SHORT_HEAD_DIM`` kept those batches on the split rule); in one loop that masks every
tile (the kernel's ``ONE_LOOP`` form, ``_flat.one_loop``) it keeps none with loads two steps
ahead (tileiras 13.4, CPU). Interleaved, pages of 16, cycling and log-uniform cache lengths;
shares of the device copy rate (same run) on the valid K/V bytes.

    source .devtk/setup.sh && python3 docs/records/probes/paged_flat_oneloop.py [--rounds 15]

times, on bf16 D 64 batches (``POINTS``), the default, the split rule and the flat walk in
two loops and in one (each form forced while its launcher is built), loads four and two
ahead. (Section 35's run 1 ran this comparison on the tree of d3ba538, the one-loop kernel a
copy of that tree's ``_flat_kernel.py`` launched in its place: the same kernels.)

    source .devtk/setup.sh && python3 docs/records/probes/paged_flat_oneloop.py --held \\
        [--view gpu|isolated|loop]

times the default (one loop, loads ``FLAT_ONE_LOOP_LATENCY`` ahead) against the split rule
before it on batches run 1 did not have (``HELD``), FlashAttention-4 beside where it is
importable (``../shared/device/pack-fa4``). Views: ``gpu`` (one call between events, L2
flushed, the host's launch hidden), ``isolated`` (one call from an idle GPU, L2 flushed, the
host's time counted), ``loop`` (calls back to back, warm L2, host counted, per call).
"""

import argparse
import contextlib

import tiledattention as ta
from tiledattention.core import _case
from tiledattention.kernels.decode import _flat
from tiledattention.kernels.decode._defaults import SMALL_PAGE_LATENCY
from tiledattention.kernels.decode._launch import normalise

import paged_balance
from paged_defaults import add_fa4, copy_rate
from paged_flat_stack import print_table
from tuner.measure import time_interleaved

MIXES = {"cycling": _case.paged_lengths, "log-uniform": paged_balance.log_uniform}
#: (batch, heads_q, heads_kv, longest cache, head dim, dtype): bf16 D 64 batches none of
#: ``paged_flat_stack.py``'s sets had, then one of its (B40 H16/16).
POINTS = ((24, 32, 8, 4000, 64, "bf16"), (48, 32, 8, 2500, 64, "bf16"),
          (8, 16, 4, 8000, 64, "bf16"), (64, 16, 8, 1500, 64, "bf16"),
          (40, 16, 16, 3000, 64, "bf16"))
HELD = ((32, 32, 8, 3000, 64, "bf16"), (16, 8, 2, 6000, 64, "bf16"),
        (96, 32, 8, 1000, 64, "bf16"), (20, 24, 8, 5000, 64, "bf16"),
        (16, 16, 4, 4000, 32, "bf16"))


@contextlib.contextmanager
def loop_form(one: bool, dtype: str):
    """Within it, a flat launcher built for a ``dtype`` cache walks in one loop or in two."""
    saved = _flat.ONE_LOOP_DTYPE
    _flat.ONE_LOOP_DTYPE = dtype if one else None
    try:
        yield
    finally:
        _flat.ONE_LOOP_DTYPE = saved


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--held", action="store_true")
    ap.add_argument("--view", default="gpu", choices=("gpu", "isolated", "loop"))
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    copy_gbps = copy_rate()
    original = _case.paged_lengths
    rows = []
    for b, hq, hkv, sk, d, dtype in HELD if args.held else POINTS:
        p = ta.Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=1, seqlen_k=sk, head_dim=d,
                       dtype=dtype, causal=True, bottom_right=True, ragged=True, page_size=16)
        default = ta.DECODE.default_schedule("sm_90", p)
        flat = normalise(p, default.replace(flat=True, occupancy=2))
        split_rule = (default.replace(flat=False, k_latency=SMALL_PAGE_LATENCY,
                                      v_latency=SMALL_PAGE_LATENCY) if default.flat else default)
        for mix, lengths in MIXES.items():
            _case.paged_lengths = lengths
            case = ta.DECODE.case(p, 0)
            fns = {"default": case.launcher(default),
                   "split rule": case.launcher(normalise(p, split_rule))}
            for one in () if args.held else (False, True):
                for lat in (4, 2):
                    with loop_form(one, dtype):
                        fns[f"{'one loop' if one else 'two loops'} K{lat}"] = case.launcher(
                            flat.replace(k_latency=lat, v_latency=lat))
            errors = {name: case.error(fn) for name, fn in fns.items()}
            if args.held:
                add_fa4(p, case, fns, errors)
            times = time_interleaved(fns, rounds=args.rounds, host=args.view == "isolated",
                                     loop=args.view == "loop", flush_l2=args.view != "loop")
            valid = int(case.seqused.sum()) * hkv * d * 2 * 2
            base = times["default"].median_ms
            desc = f"B{b} H{hq}/{hkv} D{d} {dtype} <= {sk} {mix} (default {default.describe()})"
            print(f"== {desc}: " + "  ".join(
                f"{n} {1e3 * t.median_ms:.1f}us "
                f"{valid / (t.median_ms * 1e-3) / (copy_gbps * 1e9):.0%} err {errors[n]:.1e}"
                for n, t in times.items()), flush=True)
            rows.append((desc, base, {n: base / t.median_ms for n, t in times.items()
                                      if n != "default"}))
    _case.paged_lengths = original
    print("\n(speed-up over the default: its time over each)")
    print_table(rows, "default", "{}")


if __name__ == "__main__":
    main()
