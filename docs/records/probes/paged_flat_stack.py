"""Flat-walk kernels that keep stack (issue 49, section 33 of
``docs/records/benchmarks/paged/issue49/README.md``): tileiras 13.4 gives the sm_90
``flat_split`` 64-80 bytes of stack at D 96-128 when the item offsets' tile is 16 wide or less
(batches of at most 15) and 200-528 at D 64 with 64-key steps, none with 128-key steps. Timed
against the default, interleaved, GPU view (L2 flushed, median of ``--rounds``), paged batches
over pages of 16, cycling and log-uniform cache lengths:

- ``--bpad``: the default (offsets tile at least ``_flat.B_PAD_LEAST`` = 32 wide) against the
  tile of the next power of two past the batch (the form before), and the split rule;
- ``--d64``: at D 64, the default (64-key steps, loads 4 ahead) against 128-key steps with
  loads 4 or 2 ahead, and the split rule;
- ``--rule``: the default drawn from those two (``FLAT_MIN_ROWS``, ``FLAT_SHORT_HEAD_DIM``)
  against the other walk (``flat`` flipped) on batches neither had.

    source .devtk/setup.sh && python3 docs/records/probes/paged_flat_stack.py --bpad
    source .devtk/setup.sh && python3 docs/records/probes/paged_flat_stack.py --d64
    source .devtk/setup.sh && python3 docs/records/probes/paged_flat_stack.py --rule --rounds 10

Since section 35 the bf16 flat kernel at D <= 64 walks its key tiles in one loop (``ONE_LOOP``)
and ``FLAT_SHORT_HEAD_DIM`` is gone; the recorded runs ran the two loops of ``git show d3ba538``.
"""

import argparse

import tiledattention as ta
from tiledattention.core import _case
from tiledattention.kernels.decode import _launch
from tiledattention.kernels.decode._launch import normalise

import paged_balance
from paged_defaults import copy_rate
from tuner.measure import time_interleaved

MIXES = {"cycling": _case.paged_lengths, "log-uniform": paged_balance.log_uniform}
#: (batch, heads_q, heads_kv, longest cache, head dim, dtype)
BPAD = ((6, 32, 8, 8000, 128, "bf16"), (12, 28, 4, 6000, 128, "fp16"),
        (10, 8, 1, 5000, 128, "bf16"), (14, 40, 8, 3000, 96, "bf16"))
D64 = ((32, 32, 8, 5000, 64, "fp16"), (40, 16, 16, 3000, 64, "bf16"),
       (12, 32, 8, 7000, 64, "bf16"), (100, 8, 1, 2000, 64, "bf16"))
RULE = ((4, 32, 8, 7000, 128, "bf16"), (3, 16, 2, 6000, 128, "bf16"),
        (20, 8, 1, 4000, 128, "fp16"), (24, 28, 4, 5000, 64, "fp16"),
        (16, 32, 8, 4000, 64, "bf16"), (9, 40, 8, 7000, 96, "bf16"))


def narrow_tile(case, schedule):
    """The case's launcher of ``schedule`` with the offsets tile of b1d83d3 (the next power of
    two past the batch, however narrow)."""
    product = _launch.flat_launches

    def launches(batch, *args, **kwargs):
        flat = product(batch, *args, **kwargs)
        b_pad = 1 << batch.bit_length()
        constants = list(flat.split_constants)
        constants[constants.index(flat.b_pad)] = b_pad  # (B_PAD: the only value of its size)
        return flat._replace(b_pad=b_pad, split_constants=tuple(constants))

    _launch.flat_launches = launches
    try:
        return case.launcher(schedule)  # (the plan is built here, once)
    finally:
        _launch.flat_launches = product


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bpad", action="store_true")
    ap.add_argument("--d64", action="store_true")
    ap.add_argument("--rule", action="store_true")
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    copy_gbps = copy_rate()
    original = _case.paged_lengths
    rows = []
    for b, hq, hkv, sk, d, dtype in (BPAD if args.bpad else RULE if args.rule else D64):
        p = ta.Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=1, seqlen_k=sk, head_dim=d,
                       dtype=dtype, causal=True, bottom_right=True, ragged=True, page_size=16)
        default = ta.DECODE.default_schedule("sm_90", p)
        flat = normalise(p, default.replace(flat=True, occupancy=2))
        for mix, lengths in MIXES.items():
            _case.paged_lengths = lengths
            case = ta.DECODE.case(p, 0)
            fns = {"flat": case.launcher(flat),
                   "split rule": case.launcher(normalise(p, default.replace(flat=False)))}
            if args.bpad:
                fns["flat, narrow tile"] = narrow_tile(case, flat)
            else:
                for lat in (4, 2):
                    fns[f"flat n128 K{lat}"] = case.launcher(
                        flat.replace(tile_n=128, k_latency=lat, v_latency=lat))
            errors = {name: case.error(fn) for name, fn in fns.items()}
            times = time_interleaved(fns, rounds=args.rounds)
            valid = int(case.seqused.sum()) * hkv * d * 2 * 2
            base = times["flat"].median_ms
            desc = f"B{b} H{hq}/{hkv} D{d} {dtype} <= {sk} {mix}" + (
                f" (default {'flat' if default.flat else 'split rule'})" if args.rule else "")
            print(f"== {desc} ({flat.describe()}): " + "  ".join(
                f"{n} {1e3 * t.median_ms:.1f}us "
                f"{valid / (t.median_ms * 1e-3) / (copy_gbps * 1e9):.0%} err {errors[n]:.1e}"
                for n, t in times.items()), flush=True)
            rows.append((desc, base, {n: t.median_ms / base for n, t in times.items()
                                      if n != "flat"}))
    _case.paged_lengths = original
    print_table(rows, "flat", "{} ÷ flat")


def print_table(rows, base, column):
    """``rows`` of ``(batch, base ms, {contender: ratio})`` as a Markdown table: the batch,
    ``base``'s µs, then each contender's ratio under the heading ``column.format(name)``."""
    names = list(rows[0][2])
    print(f"\n| batch | {base} µs | " + " | ".join(column.format(n) for n in names) + " |")
    print("|---|---|" + "---|" * len(names))
    for desc, ms, ratios in rows:
        print(f"| {desc} | {ms * 1e3:.1f} | "
              + " | ".join(f"{ratios[n]:.3f}" for n in names) + " |")


if __name__ == "__main__":
    main()
