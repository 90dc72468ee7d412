"""Decode batches over contiguous caches by their (batch x K/V head) rows against the SMs
(issue 49: every GPU-bound decode shape at least 1.0x cuDNN; a survey found B24 H28/4 over 37k
keys, 96 rows, at 0.91x): the sm_90 default against other split counts (at two CTAs an SM
merged as the default merges: the block merge, as a dependent launch on Hopper) and other
forms of its split kernel, cuDNN beside. Interleaved, the L2 flushed before each sample;
shares of the device copy rate measured in the same run, on the K/V bytes read once.

    source .devtk/setup.sh && python3 docs/records/probes/decode_fill.py [--rounds 20]
        [--check | --long | --d64 | --depth | ... | --waves-held | --band] [--host]

Candidates: ``sN``: N splits at two CTAs an SM (the rule's merge for split calls);
``sN occ1``: at one. ``fill``: the splits that make the CTAs closest to whole waves of two an SM.

- ``--check``: other points (none of the sweep's), the default (since ``FILL_MAX_ROWS_SHARE``)
  against one split at one CTA an SM (the rule before it);
- ``--long``: 96-120 rows over long caches, 4, 6 and 8 splits with K loads two and four ahead;
- ``--d64``: D 64 calls of 88-120 rows (256-key steps), 2 and 4 splits;
- ``--depth``: 96-128 rows at D 128 (one split, one CTA an SM: 0.91-0.96x cuDNN) and two
  B1 caches (8k and 32k keys, the issue's 60% and 85% of the copy rate), deeper
  load pipelines at one split (K and V loads 3-6 steps ahead, 64-key steps with more of
  them, 256-key steps), eight worker warps; every candidate compiled ahead in a pool;
- ``--steps``: other calls of 89-110 rows (none of the sets above; bf16 and fp16, D 96 and
  128, a sink), 128-key steps two loads ahead against 256-key steps one ahead, at one split;
  ``--held``: the same on calls of 89-102 rows that neither set ran (after the rule,
  ``DEEP_STEP_MAX_ROWS_SHARE``, was drawn from them);
- ``--ctas``: rows whose cache rule gives two or more splits of 89-102 CTAs in all (one CTA
  an SM, a quarter of the SMs idle: 45-51 rows at two splits), the default against 256-key
  steps one load ahead and against as many splits as two CTAs an SM hold; ``--ctas-held``:
  other such calls (34-51 rows), the default (``FILL_MAX_CTAS_SHARE``) against the cache
  rule's splits at one CTA an SM.
- ``--short``: caches of 1k-16k keys at few rows (at most a quarter of the SMs), where
  ``MIN_KEYS_PER_SPLIT`` or the one-CTA-an-SM wave caps the splits: splits of 128, 192 and 256
  keys at one and two CTAs an SM (``kN occM``), and the default's splits with loads three
  ahead; ``--short-held``: other such calls (and caches of 24k-64k keys), the default
  against the rule drawn from that sweep (at most 13 rows, 3000 keys or more: as many splits
  as two CTAs an SM hold, down to 128 keys a split). Refuted there; not a default.
- ``--waves``: 160-320 rows, where one split fills the GPU and runs two CTAs an SM, but its
  CTAs fill the 264 places of one wave unevenly (a survey, seed 33, read B48 H28/4 over 6-7k
  keys, 192 rows, at 0.95-0.97x cuDNN): the sweep's candidates (2-8 splits, and the split
  count that makes whole waves); ``--waves-above``: 270-600 rows (one wave of two CTAs an SM
  and part of a second), the same candidates; ``--waves-held``: other calls of 272-320 rows
  over 3500-20000 keys (D 64-128), the default (``PART_WAVE_SPLITS``) against one split;
  ``--occ``: the six ``--band`` calls and five of 352-600 rows, one split at three and four
  CTAs an SM with 32-128-key steps (smaller shared-memory stages, more CTAs streaming an SM);
  ``--occ-held``: ten other calls where the rule drawn from it applies, against the default
  before it (one split, 128-key steps, two CTAs an SM).
  ``--occ-four``: other calls of 400-528 rows (a wave of three CTAs an SM and a bit) and
  600-792 rows (past two waves of three), one split at four CTAs an SM with 32- and 64-key
  steps and at three with 64-key steps, against the default (two CTAs an SM, 128-key steps).
  ``--occ-four-held``: ten other calls in those two bands (397-495 and 529-660 rows), the
  defaults drawn from ``--occ-four`` against the default before them.
  ``--occ-dims``: the same bands at D 64, 96 and 256 (the rules above are D 128's), one split
  at three and four CTAs an SM with shorter key steps than the default's.
  ``--occ-dims-held``: other calls at D 48-96 in the three-CTA bands, the rule drawn from
  ``--occ-dims`` against the default before it.
  ``--occ-many``: 680-1320 rows at D 64 and 128 (past the bands above), three and four CTAs
  an SM against the default.
  ``--occ-window``: sliding windows of 3500-4096 keys (Mistral's) over longer contiguous
  caches in the bands of the rules above (drawn without windows): the form those rules give
  the same call without its window against the two-CTA form windows ran before them (the
  default, whichever of the two the tree's rules pick, beside); shares of the copy rate on
  the window's bytes.
  ``--tail``: rows past whole waves of two CTAs an SM that the bands leave (and two inside
  them): only the rows of the last, part-empty wave split (``tail_rows``), in 2, 4 or as many
  splits as fill the wave (at most 8), against the default and the two-CTA form;
  ``--tail-dims``: the same at D 48-96 and at D 128 with 2-14 rows past whole waves (8 splits
  too); ``--tail-held``: other calls where the rule drawn from them applies (and two windows,
  which it leaves out), the default against one split and the rule's form.
  ``--band``: 160-240 rows (one wave at two CTAs an SM, where no split count helped), one
  split with loads four ahead, 64- and 256-key steps, or at one CTA an SM; ``--band-held``:
  other calls of 170-260 rows, the default against 64-key steps four loads ahead (the lead
  ``--band`` left, not yet run).

``--host`` times isolated calls with the host's time counted instead of GPU time (any mode).
"""

import argparse
import dataclasses
import sys
from pathlib import Path

import tiledattention as ta
from tiledattention.kernels.decode._defaults import (FULL_GPU_OCCUPANCY, MAX_MERGED_ROWS,
                                                     window_keys)
from tiledattention.kernels.decode._schedule import MAX_SPLITS
from tuner.measure import time_interleaved

sys.path.insert(0, str(Path(__file__).parent))
from paged_defaults import copy_rate, report  # noqa: E402
from compile_ahead import compile_ahead  # noqa: E402

#: (B, H_q, H_kv, keys, D): rows = B x H_kv below 132
POINTS = ((24, 28, 4, 37185, 128), (10, 32, 8, 20000, 128), (12, 64, 8, 8000, 128),
          (15, 32, 8, 3000, 128), (100, 8, 1, 4000, 128), (7, 16, 16, 12000, 64),
          (3, 32, 32, 30000, 128), (20, 40, 5, 16000, 128), (9, 28, 4, 60000, 128),
          (70, 16, 1, 9000, 64))
CHECK = ((9, 64, 8, 12000, 128), (11, 32, 8, 5000, 128), (84, 8, 1, 6000, 128),
         (5, 16, 16, 20000, 64), (2, 40, 40, 7000, 128), (18, 28, 4, 2500, 128),
         (10, 32, 8, 1500, 128), (10, 32, 8, 9000, 256), (68, 14, 1, 30000, 128),
         (4, 20, 20, 11111, 96))
LONG = ((13, 32, 8, 24000, 128), (120, 8, 1, 20000, 128), (14, 64, 8, 32000, 128),
        (100, 16, 1, 40000, 64), (11, 40, 10, 50000, 128), (6, 16, 16, 28000, 128))
DEPTH = ((1, 32, 8, 8192, 128), (1, 32, 8, 32768, 128), (24, 28, 4, 37185, 128),
         (12, 64, 8, 8000, 128), (3, 32, 32, 30000, 128), (20, 40, 5, 16000, 128),
         (100, 8, 1, 4000, 128), (15, 32, 8, 3000, 128), (13, 32, 8, 24000, 128),
         (14, 64, 8, 32000, 128), (11, 40, 10, 50000, 128), (16, 32, 8, 20000, 128))
STEPS = ((23, 16, 4, 20000, 128), (89, 16, 1, 8000, 128, "fp16"), (53, 8, 2, 7000, 128),
         (90, 8, 1, 6000, 128, "fp16"), (31, 24, 3, 12000, 128), (6, 16, 16, 25000, 96, "fp16"),
         (97, 4, 1, 16384, 128), (25, 32, 4, 9000, 128), (51, 16, 2, 5000, 128, "fp16"),
         (26, 32, 4, 30000, 128), (9, 96, 12, 14000, 128), (101, 8, 1, 2500, 128),
         (33, 12, 3, 40000, 128, "bf16", True))
HELD = ((91, 8, 1, 12000, 128), (47, 16, 2, 6000, 128, "fp16"), (3, 64, 32, 20000, 128),
        (19, 40, 5, 30000, 128), (25, 8, 4, 10000, 96, "fp16"), (34, 24, 3, 4500, 128),
        (49, 16, 2, 3600, 128))
CTAS = ((12, 28, 4, 47107, 128, "fp16"), (6, 16, 8, 30000, 128), (47, 8, 1, 9000, 128),
        (25, 16, 2, 12000, 128), (15, 12, 3, 25000, 128), (3, 128, 16, 16000, 128, "fp16"),
        (51, 8, 1, 6000, 128))
CTAS_HELD = ((46, 8, 1, 20000, 128), (17, 24, 3, 15000, 128), (6, 64, 8, 12000, 128),
             (34, 16, 1, 7000, 128, "fp16"), (49, 4, 1, 30000, 128, "fp16"),
             (12, 16, 4, 5000, 128))
SHORT = ((1, 32, 8, 1024, 128), (1, 32, 8, 2048, 128), (1, 32, 8, 4096, 128),
         (1, 32, 8, 8192, 128), (1, 32, 8, 16384, 128), (8, 4, 1, 3000, 128),
         (4, 8, 1, 7000, 128), (2, 28, 4, 5000, 128), (1, 16, 2, 6000, 64),
         (1, 8, 1, 8192, 128), (3, 16, 4, 4000, 128), (4, 32, 8, 2000, 128))
SHORT_HELD = ((1, 28, 4, 9000, 128), (1, 64, 8, 6000, 128), (1, 32, 8, 12000, 128, "fp16"),
              (3, 32, 4, 3500, 128), (2, 8, 2, 20000, 64), (6, 16, 2, 5000, 96, "fp16"),
              (2, 12, 4, 10000, 128), (1, 40, 8, 24000, 128, "bf16", True),
              (1, 32, 8, 32768, 128), (1, 8, 1, 65536, 128), (1, 16, 4, 50000, 64))
WAVES = ((48, 28, 4, 6061, 128, "fp16"), (20, 32, 8, 9000, 128), (44, 16, 4, 5000, 128),
         (25, 32, 8, 7000, 128, "fp16"), (27, 16, 8, 12000, 128), (30, 32, 8, 4000, 128),
         (70, 16, 4, 3000, 128), (40, 32, 8, 5000, 128))
WAVES_ABOVE = ((34, 32, 8, 4000, 128), (76, 16, 4, 6000, 128), (44, 32, 8, 3000, 128, "fp16"),
               (50, 32, 8, 5000, 128), (57, 16, 8, 4000, 128), (130, 16, 4, 2500, 128),
               (75, 32, 8, 3000, 128), (35, 64, 8, 2000, 128), (9, 128, 32, 8000, 128, "fp16"))
WAVES_HELD = ((68, 16, 4, 4500, 128), (37, 32, 8, 10000, 128), (10, 120, 30, 5000, 128, "fp16"),
              (42, 56, 7, 3500, 128), (36, 32, 8, 6000, 96, "fp16"), (40, 32, 8, 5000, 64),
              (78, 8, 4, 20000, 128), (300, 8, 1, 4000, 128))
BAND_HELD = ((22, 32, 8, 8000, 128), (45, 16, 4, 5000, 128, "fp16"), (26, 64, 8, 3500, 128),
             (60, 28, 4, 10000, 128), (29, 16, 8, 6000, 96, "fp16"), (240, 8, 1, 4000, 128),
             (32, 32, 8, 16000, 128))
#: --occ: 352-600 rows (one split, two CTAs an SM; section 19 found no split count that helps)
OCC_ABOVE = ((44, 32, 8, 3000, 128, "fp16"), (50, 32, 8, 5000, 128), (57, 16, 8, 4000, 128),
             (130, 16, 4, 2500, 128), (75, 32, 8, 3000, 128))
#: --occ-four: 400-528 and 600-792 rows, none of the sets above (the leads --occ left)
OCC_FOUR = ((100, 16, 4, 4500, 128), (60, 49, 7, 4000, 128), (56, 32, 8, 6000, 128),
            (120, 12, 4, 3200, 128, "fp16"), (64, 32, 8, 4096, 128), (66, 32, 8, 3001, 128),
            (75, 56, 8, 3500, 128), (80, 32, 8, 4000, 128, "fp16"), (88, 16, 8, 3000, 128),
            (99, 32, 8, 3300, 128, "bf16", True))
#: --occ-four-held: calls none of the sets above ran, in the bands of the rules drawn from it
OCC_FOUR_HELD = ((51, 64, 8, 4500, 128), (110, 16, 4, 3800, 128, "fp16"), (66, 49, 7, 3500, 128),
                 (472, 8, 1, 3000, 128), (61, 32, 8, 7000, 128, "bf16", True),
                 (68, 64, 8, 3200, 128), (142, 16, 4, 3000, 128, "fp16"),
                 (73, 32, 8, 5000, 128), (620, 8, 1, 4000, 128),
                 (82, 56, 8, 3300, 128, "bf16", True))
#: --occ-dims: 200, 240, 360, 440 and 620 rows at D 64, 96 and 256
OCC_DIMS = tuple((b, hq, hkv, sk, d, *more) for d in (64, 96, 256)
                 for b, hq, hkv, sk, *more in ((25, 32, 8, 7000), (60, 16, 4, 5000, "fp16"),
                                               (45, 32, 8, 4500), (55, 64, 8, 4000),
                                               (155, 16, 4, 3500, "fp16")))
#: --occ-dims-held: calls at D 48-96 none of the sets above ran, in the three-CTA bands
OCC_DIMS_HELD = ((22, 32, 8, 6000, 64), (27, 16, 8, 5000, 64, "fp16"), (64, 12, 4, 4000, 64),
                 (85, 16, 4, 3300, 64), (48, 32, 8, 3500, 64, "bf16", True),
                 (75, 32, 8, 5000, 64), (81, 64, 8, 3000, 64, "fp16"),
                 (46, 32, 8, 5000, 96), (27, 32, 8, 8000, 96, "fp16"), (32, 16, 8, 4000, 96),
                 (86, 16, 4, 3500, 96), (49, 32, 8, 3000, 96, "bf16", True),
                 (74, 32, 8, 4000, 96), (160, 16, 4, 3100, 96, "fp16"),
                 (30, 32, 8, 6000, 80), (78, 16, 8, 3500, 80), (24, 32, 8, 8000, 48))
#: --occ-many: 680-1320 rows, D 64 and 128
OCC_MANY = ((85, 32, 8, 4000, 128), (90, 16, 8, 3500, 128, "fp16"), (95, 32, 8, 4000, 64),
            (105, 32, 8, 3000, 128), (225, 16, 4, 3200, 128, "fp16"), (120, 32, 8, 3000, 128),
            (132, 32, 8, 3000, 128), (140, 32, 8, 3500, 64), (150, 16, 8, 3000, 128),
            (165, 32, 8, 3000, 64, "fp16"))
#: --occ-window: (B, H_q, H_kv, cache keys, D, dtype, sinks, window keys) in the rules' bands
OCC_WINDOW = ((24, 32, 8, 32768, 128, "bf16", False, 4096),
              (30, 32, 8, 20000, 128, "fp16", False, 4096),
              (44, 32, 8, 16384, 128, "bf16", False, 4096),
              (48, 32, 8, 12000, 128, "bf16", True, 4096),
              (55, 32, 8, 16000, 128, "bf16", False, 4096),
              (60, 32, 8, 10000, 128, "fp16", False, 4096),
              (75, 32, 8, 8192, 128, "bf16", False, 4096),
              (80, 32, 8, 9000, 128, "bf16", False, 4096),
              (45, 16, 8, 12000, 64, "bf16", False, 4096),
              (78, 16, 8, 9000, 64, "fp16", False, 3500))
#: --tail: rows the occupancy bands leave past whole waves of two CTAs an SM (D 128 529-580 and
#: 661-1320 rows, D 64 past 528), and two inside the bands (600 and 640 rows)
TAIL = ((67, 32, 8, 5000, 128), (70, 64, 8, 4000, 128), (144, 16, 4, 6000, 128, "fp16"),
        (137, 8, 4, 3500, 128), (75, 32, 8, 4000, 128), (160, 16, 4, 3000, 128),
        (175, 16, 4, 3000, 128), (105, 32, 8, 4000, 128), (125, 64, 8, 3000, 128),
        (275, 8, 4, 3000, 128, "fp16"), (70, 32, 8, 6000, 64), (425, 4, 2, 8000, 64))
#: --tail-dims: the same at head dims below 128 (past 264 rows, outside the three-CTA bands), and
#: D 128 calls whose last wave holds 2-14 CTAs
TAIL_DIMS = ((67, 16, 8, 4000, 64), (175, 16, 4, 5000, 64), (90, 64, 8, 3000, 64, "fp16"),
             (100, 32, 8, 4000, 64), (225, 8, 4, 6000, 64), (250, 16, 4, 3000, 64, "fp16"),
             (115, 40, 10, 3500, 64), (225, 4, 2, 5000, 64), (125, 16, 4, 4000, 64),
             (70, 16, 8, 4000, 96), (425, 4, 2, 5000, 96), (175, 8, 4, 4000, 80),
             (140, 8, 4, 5000, 48), (265, 4, 2, 4000, 128), (100, 32, 8, 3000, 128),
             (107, 40, 10, 3000, 128))
#: --tail-held: calls none of the sets above ran with 8-100 rows past whole waves of two CTAs an
#: SM at D 48-96 (GQA 2-8, MQA, fp16, a sink), and two sliding windows (the last field: keys)
TAIL_HELD = ((270, 4, 2, 4500, 64), (69, 64, 8, 3500, 64, "fp16"), (71, 16, 8, 6000, 96),
             (570, 4, 1, 3000, 64), (200, 16, 4, 4000, 80), (210, 28, 4, 3200, 64),
             (110, 64, 8, 4000, 64, "bf16", True), (223, 16, 4, 3000, 96, "fp16"),
             (67, 128, 16, 3000, 64), (380, 6, 3, 4000, 48),
             (70, 32, 8, 16000, 64, "bf16", False, 4096),
             (105, 32, 8, 9000, 96, "fp16", False, 3500))
#: --occ-held: calls none of the sets above ran, where the three-CTA rule applies
OCC_HELD = ((23, 32, 8, 6000, 128), (60, 12, 4, 5000, 128), (13, 64, 16, 8000, 128, "fp16"),
            (29, 8, 8, 10000, 128), (196, 8, 1, 4000, 128), (45, 16, 4, 3500, 128, "fp16"),
            (45, 32, 8, 4000, 128), (96, 16, 4, 3000, 128, "fp16"), (340, 8, 1, 5000, 128),
            (23, 64, 16, 6000, 128))
D64 = ((100, 16, 1, 40000, 64), (120, 8, 1, 9000, 64), (12, 64, 8, 6000, 64),
       (30, 32, 4, 20000, 64), (110, 32, 1, 4000, 64), (11, 24, 8, 15000, 64))


def forms(default, *shapes):
    """``default`` at each ``(occupancy, key step, loads ahead of K and V)``, by name."""
    return {f"occ{o} n{n} K{k} V{k}": default.replace(occupancy=o, tile_n=n, k_latency=k,
                                                     v_latency=k)
            for o, n, k in shapes}


def candidates_for(mode, default, rows, merged, keys):
    """The schedules a mode times beside the default."""
    def split(n, **changes):
        return default.replace(splits=n, occupancy=2, combine=merged, **changes)

    if mode == "check":
        return {"previous": default.replace(splits=1, occupancy=1, combine="block")}
    if mode == "long":
        return {f"s{n} K{k}": split(n, k_latency=k) for n in (4, 6, 8) for k in (2, 4)}
    if mode == "d64":
        return {f"s{n}": split(n) for n in (2, 4)}
    if mode == "ctas":
        return {"n256 K1 V1": default.replace(tile_n=256, k_latency=1, v_latency=1),
                "n256 K1 V1 block": default.replace(tile_n=256, k_latency=1, v_latency=1,
                                                    combine="block"),
                "two an SM": default.replace(splits=FULL_GPU_OCCUPANCY * 132 // rows,
                                             occupancy=FULL_GPU_OCCUPANCY)}
    if mode == "ctas-held":
        return {"before": default.replace(splits=132 // rows, occupancy=1)}
    if mode in ("steps", "held"):
        return {"n128 K2 V2": default.replace(tile_n=128, k_latency=2, v_latency=2),
                "n256 K1 V1": default.replace(tile_n=256, k_latency=1, v_latency=1)}
    if mode == "band":
        return {"K4 V4": default.replace(k_latency=4, v_latency=4),
                "occ1": default.replace(occupancy=1),
                "n256 K1 V1": default.replace(tile_n=256, k_latency=1, v_latency=1),
                "n64 K4 V4": default.replace(tile_n=64, k_latency=4, v_latency=4),
                "occ1 n256 K1 V1": default.replace(occupancy=1, tile_n=256, k_latency=1,
                                                   v_latency=1)}
    if mode == "occ":
        return forms(default, (3, 64, 2), (3, 64, 4), (3, 128, 1), (4, 64, 1), (4, 32, 4))
    if mode == "occ-four":
        return forms(default, (4, 32, 4), (4, 64, 2), (3, 64, 2))
    if mode == "occ-many":
        step = 128 if default.tile_n == 256 else 64
        return forms(default, (3, step, 2), (4, step // 2, 4))
    if mode == "occ-dims":
        if default.tile_n >= 128:  # D 64 (256-key steps) and D 96 (128)
            return forms(default, (3, 128, 2), (3, 64, 2), (4, 64, 2), (4, 32, 4))
        return forms(default, (2, 32, 4), (3, 32, 2), (3, 32, 4))
    if mode == "occ-dims-held":  # before the rule: two CTAs an SM, steps twice as long
        assert default.occupancy == 3, default  # every call is in a band of the rule
        return {"before": default.replace(occupancy=2, tile_n=2 * default.tile_n, k_latency=2,
                                          v_latency=2)}
    if mode in ("occ-held", "occ-four-held"):  # the rules, against the default before them
        return {"before": default.replace(occupancy=2, tile_n=128, k_latency=2, v_latency=2)}
    if mode in ("tail", "tail-dims"):  # only the rows past whole waves of two CTAs an SM split
        two = default.replace(occupancy=2, tile_n=256 if default.tile_n == 256 else 128,
                              k_latency=2, v_latency=2)
        tail = rows % 264
        fill = max(2, min(8, 264 // tail))
        found = {"two CTAs an SM": two}
        for n in sorted({2, 4, fill} | ({8} if mode == "tail-dims" else set())):
            found[f"tail{tail} s{n}"] = two.replace(splits=n, tail_rows=tail, combine=merged)
        return {name: s for name, s in found.items() if s != default}
    if mode == "tail-held":  # the rule drawn from --tail-dims against one split, and its form
        wave = 264
        tail = rows % wave
        form = default.replace(splits=max(2, min(8, wave // tail)), tail_rows=tail,
                               occupancy=2, combine="block_pdl")
        return {name: s for name, s in (("one split", default.replace(
            splits=1, tail_rows=0, combine="block")), ("tail form", form)) if s != default}
    if mode == "band-held":
        return {"n64 K4 V4": default.replace(tile_n=64, k_latency=4, v_latency=4)}
    if mode == "waves-held":
        return {"one split": default.replace(splits=1, combine="block")}
    if mode == "short-held":  # the rule drawn from --short
        n = max(1, min(264 // rows, keys // 128, MAX_SPLITS, MAX_MERGED_ROWS // default.tile_m))
        return {"k128 occ2": default.replace(splits=n, occupancy=2)}
    if mode == "short":
        found = {}
        for occupancy in (1, 2):
            for per_split in (128, 192, 256):
                n = max(1, min(occupancy * 132 // rows, keys // per_split, MAX_SPLITS,
                               MAX_MERGED_ROWS // default.tile_m))
                found[f"k{per_split} occ{occupancy}"] = default.replace(
                    splits=n, occupancy=occupancy, combine=merged if n > 1 else "block")
        found["K3 V3"] = default.replace(k_latency=3, v_latency=3)
        unique = {}
        for name, schedule in found.items():  # one name a schedule, the default's own first
            if schedule != default and schedule not in unique.values():
                unique[name] = schedule
        return unique
    if mode == "depth":
        return {"K3 V3": default.replace(k_latency=3, v_latency=3),
                "K4 V4": default.replace(k_latency=4, v_latency=4),
                "K4 V2": default.replace(k_latency=4),
                "n64 K4 V4": default.replace(tile_n=64, k_latency=4, v_latency=4),
                "n64 K6 V6": default.replace(tile_n=64, k_latency=6, v_latency=6),
                "n256 K1 V1": default.replace(tile_n=256, k_latency=1, v_latency=1),
                "w8": default.replace(num_worker_warps=8),
                "w8 K3 V3": default.replace(num_worker_warps=8, k_latency=3, v_latency=3)}
    found = {f"s{n}": split(n) for n in (2, 3, 4, 8)}
    found["s2 occ1"] = default.replace(splits=2, occupancy=1, combine=merged)
    waves = [(abs(rows * s / 264 - round(rows * s / 264)) / (rows * s / 264), s)
             for s in range(2, 17) if rows * s >= 264]
    fill = min(waves)[1]
    if f"s{fill}" not in found:
        found[f"fill s{fill}"] = split(fill)
    return found


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--host", action="store_true",
                        help="isolated calls with the host's time counted (default: GPU time)")
    modes = parser.add_mutually_exclusive_group()
    for mode in ("check", "long", "d64", "depth", "steps", "held", "ctas", "ctas-held", "short",
                 "short-held", "waves", "waves-above",
                 "waves-held", "band", "band-held", "occ", "occ-held", "occ-four", "occ-four-held",
                 "occ-dims", "occ-dims-held", "occ-many", "occ-window", "tail", "tail-dims",
                 "tail-held"):
        modes.add_argument(f"--{mode}", dest="mode", action="store_const", const=mode)
    args = parser.parse_args()
    points = {"check": CHECK, "long": LONG, "d64": D64, "depth": DEPTH,
              "steps": STEPS, "held": HELD, "ctas": CTAS,
              "ctas-held": CTAS_HELD, "short": SHORT, "short-held": SHORT_HELD, "waves": WAVES,
              "waves-above": WAVES_ABOVE, "waves-held": WAVES_HELD,
              "band": WAVES[:6], "band-held": BAND_HELD,
              "occ": WAVES[:6] + OCC_ABOVE, "occ-held": OCC_HELD, "occ-four": OCC_FOUR,
              "occ-four-held": OCC_FOUR_HELD, "occ-dims": OCC_DIMS,
              "occ-dims-held": OCC_DIMS_HELD, "occ-many": OCC_MANY,
              "occ-window": OCC_WINDOW, "tail": TAIL, "tail-dims": TAIL_DIMS,
              "tail-held": TAIL_HELD}.get(args.mode, POINTS)
    copy_gbps = copy_rate()
    plans = []
    for b, hq, hkv, sk, d, *more in points:  # more: the dtype, sinks, a window's keys
        dtype, sinks, window = (more + ["bf16", False, 0][len(more):])[:3]
        p = ta.Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=1, seqlen_k=sk, head_dim=d,
                       dtype=dtype, causal=False, sinks=sinks)
        if window:
            unwindowed = ta.DECODE.default_schedule("sm_90", p)
            p = dataclasses.replace(p, causal=True, bottom_right=True, window_left=window - 1,
                                    window_right=0)
        default = ta.DECODE.default_schedule("sm_90", p)
        merged = "block_pdl" if d <= 128 else "block"
        if args.mode == "occ-window":  # the rules' form drawn without a window, and the
            # two-CTA form windows ran before them (either may be the tree's default)
            found = {"unwindowed form": default.replace(
                occupancy=unwindowed.occupancy, tile_n=unwindowed.tile_n,
                k_latency=unwindowed.k_latency, v_latency=unwindowed.v_latency),
                "two CTAs an SM": default.replace(occupancy=2, tile_n=256 if d <= 64 else 128,
                                                  k_latency=2, v_latency=2)}
        else:
            found = candidates_for(args.mode, default, b * hkv, merged, sk)
        plans.append((p, {"default": default, **found}))
    compile_ahead([(p, s) for p, c in plans for s in c.values()])
    summary = []
    for p, candidates in plans:
        case = ta.DECODE.case(p, 0)
        default = candidates["default"]
        rows, sk, d = p.batch * p.heads_kv, p.seqlen_k, p.head_dim
        fns = {name: case.launcher(s) for name, s in candidates.items()}
        errors = {name: case.error(run) for name, run in fns.items()}
        baseline = case.baselines().get("torch-cudnn")  # none with sinks
        if baseline is not None:
            fns["torch-cudnn"] = baseline
            errors["torch-cudnn"] = float("nan")
        times = time_interleaved(fns, rounds=args.rounds, host=args.host)
        print(f"== {p.describe()} rows {rows} default {default.describe()}")
        keys = window_keys(p)  # the cache's, or a window's
        report(times, rows * keys * d * 2 * 2, copy_gbps, errors, candidates)
        base = times["default"].median_ms
        cudnn = times["torch-cudnn"].median_ms if baseline is not None else float("nan")
        print("  cuDNN/ours: " + "  ".join(f"{n}={cudnn / t.median_ms:.3f}"
                                          for n, t in times.items() if n != "torch-cudnn"))
        print("  speed vs default: " + "  ".join(f"{n}={base / t.median_ms:.3f}"
                                                for n, t in times.items()))
        best = min((n for n in times if n != "torch-cudnn"), key=lambda n: times[n].median_ms)
        summary.append((p.describe(), rows, base, cudnn / base, best,
                        base / times[best].median_ms, cudnn / times[best].median_ms))
    print("\n| call | rows | default µs | cuDNN ÷ default | best | ÷ default (speed) | "
          "cuDNN ÷ best |\n|---|---|---|---|---|---|---|")
    for desc, rows, base, vs, best, gain, best_vs in summary:
        print(f"| {desc} | {rows} | {base * 1e3:.1f} | {vs:.3f} | {best} | {gain:.3f} | "
              f"{best_vs:.3f} |")


if __name__ == "__main__":
    main()
