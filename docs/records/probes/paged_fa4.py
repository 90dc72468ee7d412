"""Paged decode of mixed lengths against FlashAttention-4 (issue 49's bar: at least 80% of the
copy rate on valid bytes at pages of 16, 32, 64 and 256, B 8-64, GQA 32/8 and 28/4, and at
least 1.0x FA4), on batches none of the earlier paged runs had. Two views, interleaved:

- GPU: one call between CUDA events, L2 flushed before each sample (``time_interleaved``);
- isolated: the GPU drained and the L2 flushed, then the host clock from the call to the end of
  its GPU work (``host=True``); ours through ``tiledattention.paged_attention`` as a user calls
  it (lookup included), FA4 through ``flash_attn_varlen_func`` with ``page_table``.

``default`` is the sm_90 default schedule through the family's launcher; where a flat walk
applies (a plain 16-bit paged cache), ``other`` is the default with ``flat`` flipped (the split
rule where the default walks flat, else the flat walk). Shares: of a device copy timed in the
same run, on the valid K/V bytes read once. (The ``--pdl`` run of section 32 used this probe
as it was at 25ce12a, whose flat schedules could launch their merge as a dependent.)

    source .devtk/setup.sh && python3 docs/records/probes/paged_fa4.py [--rounds 15] [--only I,J]
    source .devtk/setup.sh && python3 docs/records/probes/paged_fa4.py --held   # HELD, 3 mixes

``--ab``: where the default walks flat, also ``flat, prefix kernel``: the flat walk of b1d83d3,
whose offsets a one-CTA kernel wrote before the split kernel ran (its kernels from
``git show b1d83d3:tiledattention/kernels/decode/_flat_kernel.py``, saved as
``_old_flat_kernel.py`` beside this probe, its three relative imports made absolute),
in both views.
"""

import argparse
import functools


import tiledattention as ta
from tiledattention.core import _case
from tiledattention.kernels.decode import flat_applies
from tiledattention.kernels.decode._launch import normalise

import paged_balance
from paged_defaults import add_fa4, copy_rate
from tuner.measure import time_interleaved

#: (batch, heads_q, heads_kv, longest cache, head dim, dtype, page size)
POINTS = ((8, 32, 8, 9000, 128, "bf16", 16), (24, 28, 4, 6000, 128, "bf16", 16),
          (48, 32, 8, 4000, 128, "fp16", 16), (64, 28, 4, 2500, 128, "bf16", 16),
          (32, 32, 8, 5000, 64, "fp16", 16), (16, 32, 8, 7000, 128, "bf16", 32),
          (36, 28, 4, 5000, 128, "fp16", 32), (12, 28, 4, 16000, 128, "bf16", 64),
          (56, 32, 8, 3000, 128, "bf16", 64), (20, 32, 8, 20000, 128, "bf16", 256),
          (44, 28, 4, 6000, 128, "fp16", 256))
#: ``--held``: batches none of the runs before had, for a flat walk over larger pages at
#: 64 < D <= 128 (the default tried and refuted: section 32), with a third mix of caches of one
#: length
HELD = ((10, 32, 8, 8000, 128, "bf16", 32), (28, 40, 8, 4500, 128, "fp16", 32),
        (70, 8, 1, 3000, 128, "bf16", 64), (18, 28, 4, 6500, 96, "bf16", 64),
        (40, 32, 8, 2000, 128, "bf16", 128), (9, 16, 2, 7500, 128, "fp16", 128),
        (26, 32, 8, 5500, 80, "bf16", 256), (100, 28, 4, 1500, 128, "bf16", 256),
        (6, 64, 8, 8192, 128, "bf16", 64))
MIXES = {"cycling": _case.paged_lengths, "log-uniform": paged_balance.log_uniform}
HELD_MIXES = {**MIXES, "one length": lambda p: [p.seqlen_k] * p.batch}


def prefix_walk(case, schedule):
    """The flat walk of b1d83d3 (three kernels) through the case's launcher (``--ab``)."""
    import _old_flat_kernel as old

    from tiledattention.core import _aot
    from tiledattention.kernels.decode import _launch

    @functools.lru_cache(maxsize=None)
    def split(occupancy, warps):
        return old.flat_split.replace_hints(occupancy=occupancy, num_worker_warps=warps)

    def launch_flat(stream, flat, q5, out5, k, v, scratch, scale, lens, pages):
        opart, tail = scratch
        slots = flat.rows + flat.ctas
        lse = tail[:slots * flat.tile_m].reshape(slots, flat.tile_m)
        cu = tail[slots * flat.tile_m:slots * flat.tile_m + q5.shape[0] + 1].view(lens.dtype)
        _aot.launch(stream, (1, 1, 1), old.flat_prefix,
                    (lens, cu, pages.shape[1] * k.shape[1], flat.rows_per_entry, flat.tile_n,
                     flat.b_pad))
        _aot.launch(stream, (flat.ctas, 1, 1), split(schedule.occupancy,
                                                     schedule.num_worker_warps),
                    (q5, out5, k, v, opart, lse, cu, lens, pages, scale, flat.kv_div,
                     *flat.split_constants))
        _aot.launch(stream, flat.merge_grid, old.flat_merge,
                    (opart, lse, out5, cu, flat.ctas, *flat.merge_constants))

    run = case.launcher(schedule)

    def swapped():
        product, _launch.launch_flat = _launch.launch_flat, launch_flat
        try:
            run()
        finally:
            _launch.launch_flat = product

    return swapped


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--only", default="")
    ap.add_argument("--ab", action="store_true")
    ap.add_argument("--held", action="store_true")
    args = ap.parse_args()
    only = {int(i) for i in args.only.split(",") if i}
    copy_gbps = copy_rate()
    original = _case.paged_lengths
    rows, ab = [], []
    for i, (b, hq, hkv, sk, d, dtype, page) in enumerate(HELD if args.held else POINTS):
        if only and i not in only:
            continue
        p = ta.Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=1, seqlen_k=sk, head_dim=d,
                       dtype=dtype, causal=True, bottom_right=True, ragged=True, page_size=page)
        default = ta.DECODE.default_schedule("sm_90", p)
        schedules = {"default": default}
        if flat_applies(p):
            schedules["other"] = normalise(p, default.replace(flat=not default.flat))
        for mix, lengths in (HELD_MIXES if args.held else MIXES).items():
            _case.paged_lengths = lengths
            case = ta.DECODE.case(p, 0)
            fns = {name: case.launcher(s) for name, s in schedules.items()}
            fns["public"] = lambda case=case: ta.paged_attention(
                case.q, case.k_pages, case.v_pages, case.table, case.seqused)
            if args.ab and default.flat:
                fns["flat, prefix kernel"] = prefix_walk(case, default)
            errors = {name: case.error(fn) for name, fn in fns.items() if name != "public"}
            errors["public"] = case.error(lambda: case.out.copy_(fns["public"]()))
            add_fa4(p, case, fns, errors)
            gpu = time_interleaved(fns, rounds=args.rounds)
            iso = time_interleaved({n: fns[n] for n in ("public", "flash-attn-4", "default",
                                                        "other", "flat, prefix kernel")
                                    if n in fns},
                                   rounds=args.rounds, host=True)
            valid = int(case.seqused.sum()) * hkv * d * 2 * 2  # K and V, 2 bytes a value
            share = {n: valid / (t.median_ms * 1e-3) / (copy_gbps * 1e9) for n, t in gpu.items()}
            desc = f"B{b} H{hq}/{hkv} D{d} {dtype} pages {page} <= {sk} {mix}"
            print(f"== {desc}: " + "  ".join(
                f"{n} {1e3 * t.median_ms:.1f}us {share[n]:.0%} err {errors[n]:.1e}"
                for n, t in gpu.items()) + "  | isolated " + "  ".join(
                f"{n} {1e3 * t.median_ms:.1f}us" for n, t in iso.items()), flush=True)
            fa4 = gpu.get("flash-attn-4")
            ab.append((desc, gpu, iso))
            rows.append((desc, default.describe(), gpu["default"].median_ms, share["default"],
                         gpu["other"].median_ms if "other" in gpu else None,
                         fa4.median_ms if fa4 else None, share.get("flash-attn-4"),
                         iso["public"].median_ms,
                         iso["other"].median_ms / iso["default"].median_ms if "other" in iso
                         else None,
                         iso["flash-attn-4"].median_ms if "flash-attn-4" in iso else None))
    _case.paged_lengths = original
    if args.ab:
        print("\n| batch | flat µs (GPU) | prefix kernel ÷ flat (GPU) | flat µs (isolated) | "
              "prefix kernel ÷ flat (isolated) |\n|---|---|---|---|---|")
        for desc, gpu, iso in ab:
            if "flat, prefix kernel" in gpu:
                g, i = gpu["default"].median_ms, iso["default"].median_ms
                print(f"| {desc} | {g * 1e3:.1f} | {gpu['flat, prefix kernel'].median_ms / g:.3f} "
                      f"| {i * 1e3:.1f} | {iso['flat, prefix kernel'].median_ms / i:.3f} |")
    print("\n| batch | default | µs (GPU) | % copy | other ÷ default | FA4 ÷ default (GPU) "
          "| FA4 % copy | isolated µs | FA4 ÷ ours (isolated) |\n" + "|---" * 9 + "|")
    for desc, sched, ms, sh, rule, fa4, fsh, iso, other_iso, fiso in rows:
        cell = lambda x, f: "-" if x is None else f(x)  # noqa: E731
        print(f"| {desc} | {sched} | {ms * 1e3:.1f} | {sh:.0%} | "
              f"{cell(rule, lambda r: f'{r / ms:.3f}')} "
              f"({cell(other_iso, lambda r: f'{r:.3f}')} isolated) | "
              f"{cell(fa4, lambda f: f'{f / ms:.3f}')} | "
              f"{cell(fsh, lambda s: f'{s:.0%}')} | {iso * 1e3:.1f} | "
              f"{cell(fiso, lambda f: f'{f / iso:.3f}')} |")


if __name__ == "__main__":
    main()
