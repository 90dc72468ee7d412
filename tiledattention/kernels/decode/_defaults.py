"""The decode family's per-architecture default schedule: what runs for a shape nobody tuned
and the shipped table does not cover."""

from __future__ import annotations

from ...core._compile import SM_COUNTS, generation
from ...core._problem import Problem, padded_head_dim, page_tile
from ._flat import one_loop
from ._launch import BLOCK_MAX_ROWS, flat_applies, layout, rows_past_waves
from ._schedule import MAX_SPLITS, DecodeSchedule

__all__ = ["default_decode_schedule", "window_keys", "MIN_KEYS_PER_SPLIT", "MAX_TILE_M",
           "WINDOW_SPLIT_MIN_KEYS", "WINDOW_SPLIT_MIN_GAIN",
           "SMALL_PAGE_ROWS", "SMALL_PAGE_STEP",
           "SMALL_PAGE_WAVES", "SMALL_PAGE_LATENCY", "FULL_GPU_OCCUPANCY", "TWO_CTAS_AN_SM",
           "LONGEST_FIRST_MAX_WAVES",
           "THIRD_CTA_MIN_ROWS_SHARE", "THIRD_CTA_OCCUPANCY", "THIRD_CTA_STEP",
           "THIRD_CTA_SECOND_WAVE_ROWS_SHARES", "THIRD_CTA_SHORT_HEAD_STEP",
           "FOURTH_CTA_MAX_ROWS_SHARE", "FOURTH_CTA_OCCUPANCY", "FOURTH_CTA_STEP",
           "FOURTH_CTA_LATENCY", "FILL_FOURTH_CTA_MIN_KEYS", "FILL_FOURTH_CTA_SPLIT_KEYS",
           "FILL_FOURTH_CTA_FEW_SPLITS", "TAIL_MAX_WAVE_SHARE", "TAIL_MAX_SPLITS",
           "FP8_SPLIT_FACTOR", "FP8_MIN_KEYS_PER_SPLIT", "FP8_CONTIGUOUS_MIN_KEYS",
           "FP8_SMALL_PAGE_V_LATENCY", "FP8_K_LATENCY", "PAGED_SPLIT_FACTOR",
           "PAGED_PART_WAVE_MAX_SHARE", "FLAT_MAX_KEYS", "FLAT_MIN_ROWS", "FLAT_ONE_LOOP_LATENCY",
           "SHORT_HEAD_DIM",
           "SHORT_HEAD_STEP", "SHORT_HEAD_MIN_KEYS", "SHORT_HEAD_SPLIT_FACTOR",
           "SHORT_HEAD_SPLIT_MIN_KEYS", "SHORT_HEAD_SPLIT_MIN_ROWS", "LONG_SPLIT_K_LATENCY",
           "LONG_SPLIT_MIN_KEYS", "DEEP_STEP_MAX_ROWS_SHARE", "DEEP_STEP_MIN_KEYS",
           "DEEP_STEP_SPLIT_MIN_KEYS", "FILL_MAX_CTAS_SHARE", "PART_WAVE_MAX_SHARE",
           "PART_WAVE_MIN_KEYS", "PART_WAVE_SPLITS", "PART_FILL_MAX_ROWS_SHARE", "PART_FILL_MIN_KEYS",
           "PART_FILL_SPLITS", "SHORT_CACHE_MIN_KEYS", "SHORT_CACHE_WAVE_MIN_ROWS_SHARE",
           "H100_NAMES", "H100_SHORT_CACHE_WAVE_MIN_ROWS_SHARE", "H100_FILL_ONE_SPLIT_MAX_KEYS",
           "SHORT_CACHE_WAVE_MAX_KEYS", "SHORT_HEAD_ALONE_MIN_KEYS", "MAX_MERGED_ROWS",
           "DEFAULT_COMBINE"]

#: Fewest keys a split should stream: below this a split's fixed cost (its query tile, its
#: partial output, the combine's share) outweighs the parallelism it adds. The H100 tuning of
#: the shipped rows picked 4 splits at B = 1 with 1k keys and 8-12 with 2k (1.10-1.19x a cap of
#: 512 keys per split).
MIN_KEYS_PER_SPLIT = 256
#: Most query rows the default packs into one tile. On an H100, where a group times S_q
#: (padded) exceeds 64 rows (multi-query speculative decoding, say), 64-row tiles ran 0.44-0.58x
#: the time of 128-row ones with the splits recounted for them, on all 7 such shapes probed;
#: 32-row tiles 0.45-1.27x (issue 29, docs/lookup.md).
MAX_TILE_M = 64
#: A windowed call splits its keys only where the window is longer than this and splitting
#: multiplies its CTAs at least ``WINDOW_SPLIT_MIN_GAIN``-fold: a split costs the combine's
#: launch and partials, 4-6 us on an H100, which a window's few keys rarely pay back. Tuned
#: on 10 windowed keys (windows 128-4096, B 1 and 8, H 32/8, 16/8 and 64/8): one split won or
#: tied at windows of 128 and 512 (1.14-1.31x the 2 splits the cache rule gave) and at B = 8
#: (64 CTAs already; 1.00-1.31x), while 16 splits of a 4096 window at B = 1 took a third of
#: one split's time (docs/records/benchmarks/variants/README.md). Since the block merge (one
#: load of a row's splits), a window over a contiguous 16-bit cache splits, and runs two CTAs an
#: SM, as a cache of its keys would: on an H200 (docs/records/probes/decode_window_fill.py,
#: windows of 1k-4k keys, B 6-40) 1.02-1.53x the one CTA an SM and one split of this rule on six
#: calls; so does one with a softcap above D 128 (Gemma 2), at one CTA an SM (its split kernel
#: keeps stack at two): on an H200 (decode_window_fill.py --capped, windows of 4096 keys, D 256,
#: cap 50) two and three splits ran 1.64-2.29x one at 40-64 rows. The four-fold gain still
#: bounds paged and FP8 windows (not measured).
WINDOW_SPLIT_MIN_KEYS = 512
WINDOW_SPLIT_MIN_GAIN = 4
#: Paged caches whose loads take at most this many keys (pages of 16, or 48: a load never
#: straddles two pages) walk ``SMALL_PAGE_STEP``-key steps in splits for ``SMALL_PAGE_WAVES``
#: waves of CTAs. On an H200 (mixed-length paged batches of pages of 16, H 32/8 and 28/4, D 128,
#: B 8-64; docs/records/probes/paged_defaults.py) 64-key steps ran 1.37-1.52x faster than
#: 128-key ones (a 128-key tile joined from eight page loads), twice the splits a further
#: 1.05-1.15x where they made two waves (B 8-48), and occupancy 2 1.07x at B 64 (four waves
#: of one-split CTAs); larger pages keep 128-key steps (64-key ones ran 0.74-0.90x), and where
#: one split fills the GPU, occupancy 2 with K loads four steps ahead ran 1.09x and 1.14x (B 40
#: pages of 256, B 32 pages of 32) and 0.98-0.99x where it took splits.
SMALL_PAGE_ROWS = 16
SMALL_PAGE_STEP = 64
SMALL_PAGE_WAVES = 2
#: Over such pages a 16-bit cache's key and value loads run this many steps ahead where two
#: CTAs share an SM (a batch; no window): on an H200 (docs/records/probes/paged_balance.py
#: ``--depth``, B 10-36, H 32/8, 28/4 and 40/8, D 128, two length mixes) 1.014-1.057x two ahead
#: on all six batches (three and six ahead alike), at pages of 32 (128-key steps) 1.000x;
#: ``--held``: 1.020-1.063x on five other batches (B 3-64), and 0.90x for one cache (B 1, 33
#: splits at one CTA an SM), which keeps two.
SMALL_PAGE_LATENCY = 4
#: Where one split gives at least a CTA per SM (per two with small pages), two CTAs share an SM.
#: On an H200 (contiguous caches of one length, H 32/8, 28/4 and 64/8, D 128, B 16-64;
#: docs/records/probes/decode_batched.py) that ran 1.01-1.40x the one-CTA default where the CTAs
#: outnumbered the SMs (1.16x at B 24 over 3000 keys, which cuDNN led by 1.22x, now 1.05x) and
#: tied it (0.99-1.0x) at 128 CTAs; below 132 CTAs it lost (0.97x at 96), so the rule starts at
#: the SM count. On four other batches (144-768 CTAs): 1.10-1.57x, and 0.98x at B 40 over 2000
#: keys (320 CTAs). A paged batch of fewer rows than SMs that the cache rule leaves at one split
#: takes two splits at this occupancy: 1.23-1.47x on mixed-length paged batches of 80-96 rows
#: (pages of 64 and 256), where the longest caches' CTAs otherwise run alone at the end, and
#: 1.11-1.14x on three other such batches (112-120 rows, pages of 32-128). (On a contiguous
#: cache of one length, 96 rows, two splits ran 0.98x.)
FULL_GPU_OCCUPANCY = 2
#: Rows past one wave of two CTAs an SM by at most this share of it (265-330 on an H200), over a
#: contiguous 16-bit cache of at least ``PART_WAVE_MIN_KEYS`` keys (D <= 128, no window or
#: softcap), take ``PART_WAVE_SPLITS`` splits: one split leaves the rows past the wave to run
#: alone at the end. On an H200 (docs/records/probes/decode_fill.py ``--waves-above``, B 9-76, H
#: 16/4, 32/8 and 128/32, 3000-8000 keys) three splits ran 1.037-1.100x one on five calls of
#: 272-320 rows (two 1.004-1.099x, four 1.031-1.090x); at 2000 keys 0.988x, at 352 rows 0.98x,
#: and from 400 rows (and below 264, ``--waves``: 160-240 rows) every split count lost
#: (0.68-0.99x). Held out (``--waves-held``, eight calls of 272-320 rows, D 64-128, 3500-20000
#: keys): 1.004-1.142x, and 1.026-1.100x as isolated calls with the host's time counted.
PART_WAVE_MAX_SHARE = 1.25
PART_WAVE_MIN_KEYS = 3000
PART_WAVE_SPLITS = 3
#: Rows past the SMs by at most this share of them (133-198 on 132 SMs; at D 128 below
#: ``THIRD_CTA_MIN_ROWS_SHARE``, whose rows run three CTAs an SM), over a contiguous 16-bit
#: cache of at least ``PART_FILL_MIN_KEYS`` keys (no window or softcap), run one wave of a CTA
#: an SM unsplit and split only the rows past it (``tail_rows``) to fill a second, merged as a
#: dependent: one split at two CTAs an SM runs two on only a few SMs and one on the rest. On an
#: H100 (section 52 of docs/records/benchmarks/paged/issue49/README.md;
#: docs/records/probes/decode_part_fill.py at d06c1f7 ``--sweep 5``, ``6``: 14 calls, 136-184 rows,
#: D 64-128, 7000-50000 keys) it ran 1.014-1.195x one split on 13 and 1.03-1.05x the three
#: splits below D 128 (four calls). It loses (``--check-tail``) where the tail's splits fill
#: few SMs (4 rows past in 8 splits: 0.964x) or whole entries round the tail up past twice
#: the rows past the SMs (B3 H48: 0.930x): those keep the rule before, ``PART_FILL_SPLITS``
#: splits at two CTAs an SM below D 128 (1.01-1.17x one split on 14 calls, section 49), one
#: split at D 128. Held out (``--check-tail-held``, six calls in the form): 1.025-1.084x on
#: the GPU, 1.013-1.064x isolated; cuDNN's time over ours 0.968-1.094 and 1.009-1.131.
PART_FILL_MAX_ROWS_SHARE = 1.5
PART_FILL_MIN_KEYS = 6000
PART_FILL_SPLITS = 3
#: A contiguous 16-bit cache whose rows (B x H_kv) leave more than a third of the SMs idle at one
#: split, and fewer than one split a CTA an SM would fill, splits into as many as two CTAs an SM
#: hold at once (``FULL_GPU_OCCUPANCY``). On an H200 (docs/records/probes/decode_fill.py, bf16,
#: the block merge as a dependent launch) 70 and 80 rows ran 1.64x (B70 H16/1 over 9000 keys,
#: D 64) and 1.22x (B10 H32/8 over 20k) the one split, from 49% and 76% of the copy rate to 81%
#: and 92%; at 96-120 rows more splits ran 0.88-1.05x (2 splits 0.91-1.09x), so the rule stops at
#: two thirds of the SMs. Calls that walk ``SHORT_HEAD_STEP``-key steps (D <= 64) split so below
#: the SM count too: two splits ran 1.04-1.24x the one on six calls of 96-120 rows.
FILL_MAX_ROWS_SHARE = 2 / 3
#: H100: a D 96-128 cache short of this many keys whose rows that rule splits (67-88 on 132
#: SMs) runs one split at one CTA an SM: over so few keys the splits' start and merge cost more
#: than the idle SMs. 1.057-1.171x on 13 D 112-128 calls over 900-3900 keys, D 96 1.009x and
#: 1.110x, cuDNN's time over it 0.966-1.004 (section 57 of the issue-49 record; D 80 0.925x).
#: Not measured on an H200, whose faster memory the splits can use.
H100_FILL_ONE_SPLIT_MAX_KEYS = 4000
#: Rows above that share, up to this one (89-102 on an H200), run one split at one CTA an SM,
#: each CTA alone on its SM: over a contiguous 16-bit cache of at least ``DEEP_STEP_MIN_KEYS``
#: keys at head dims above ``SHORT_HEAD_DIM`` up to 128 (16-row tiles, no window or softcap)
#: they walk ``SHORT_HEAD_STEP``-key steps, each load one step ahead (twice the bytes a load in
#: flight an SM; 227 KB of shared memory). On an H200 (docs/records/probes/decode_fill.py
#: ``--depth`` and ``--steps``, bf16 and fp16, D 96 and 128, a sink) 1.001-1.073x the 128-key
#: steps two ahead on 15 calls of 89-102 rows and 3.5k-40k keys (98-99% of the copy rate at
#: 96-100 rows over 16k-37k keys, from 91-93%); 0.991x at 101 rows over 2500 keys; at 104-128
#: rows, where more SMs stream, 0.92-1.00x (deeper 128-key pipelines, 64-key steps and eight
#: worker warps 0.83-1.01x everywhere).
DEEP_STEP_MAX_ROWS_SHARE = 0.775
DEEP_STEP_MIN_KEYS = 3500
#: On Hopper those rows at D 128 over ``DEEP_STEP_SPLIT_MIN_KEYS`` keys or more split for one
#: wave of three CTAs an SM (3 x SMs // rows splits, 64-key steps, merged as a dependent): the
#: 256-key walk left 30-42 SMs idle, cuDNN 1.11-1.20x it. On an H100 (section 54 of the issue-49
#: record, 90-102 rows over 10759-70000 keys): 1.007-1.141x on 14 calls, five held out.
DEEP_STEP_SPLIT_MIN_KEYS = 10000
#: Where the cache rule gives two splits or more (``SMs // rows``) whose CTAs fill at most this
#: share of the SMs at one an SM (45-51 rows at two splits, 34 at three on an H200), the call
#: splits for two CTAs an SM as the fill rule does (D <= 128, no window): on an H200
#: (docs/records/probes/decode_fill.py ``--ctas``, seven calls of 45-51 rows, D 128, bf16 and
#: fp16, 6k-47k keys) five splits at two an SM ran 1.030-1.065x the two at one on six, 0.988x
#: on one (B3 H128/16 over 16k keys).
FILL_MAX_CTAS_SHARE = 0.775
#: One split at two CTAs an SM over a contiguous 16-bit cache at D 128 (16-row tiles, at least
#: ``PART_WAVE_MIN_KEYS`` keys, no window or softcap) whose rows fill between this share of the
#: SMs and two CTAs each, or pass that wave by more than ``PART_WAVE_MAX_SHARE`` but fit three
#: CTAs an SM, runs three CTAs an SM with 64-key steps, loads two ahead (~40 KB of shared memory
#: a CTA against 112 KB). On an H200 (docs/records/probes/decode_fill.py --occ, eleven calls of
#: 160-600 rows): 1.028-1.065x at 176-240 rows, 1.159x at 352, 0.956x at 160; cuDNN parity or
#: better on five of those six (0.93-0.98x before); at 400-520 rows, a wave of three and a bit,
#: it lost (0.82-0.89x). Held out on ten other calls (``--occ-held``): 1.036-1.196x, cuDNN ÷
#: ours 0.987-1.104 (0.923-0.978 before; docs/records/benchmarks/paged/issue49/README.md,
#: section 23). Hopper only (measured there).
THIRD_CTA_MIN_ROWS_SHARE = 1.3
THIRD_CTA_OCCUPANCY = 3
THIRD_CTA_STEP = 64
#: The same rule past two waves of two CTAs an SM: rows from this share of the SMs to five CTAs'
#: rows an SM (581-660 on an H200; a third wave of two at most half full, a second wave of three
#: more than half) run three CTAs an SM. On an H200 (docs/records/probes/decode_fill.py
#: ``--occ-four``, the record above, section 24): 1.108x and 1.075x at 600 and 640 rows, 1.020x
#: and 1.007x at 704 and 792 (past the band); held out (``--occ-four-held``) 1.047-1.096x at
#: 584-656 rows (GPU time; 1.054-1.076x isolated with the host counted), but 0.963x at 544 rows
#: and 1.006x at 568 (where a third wave of two holds 16-40 CTAs), from which the band's lower
#: end was drawn.
THIRD_CTA_SECOND_WAVE_ROWS_SHARES = (4.4, 5)
#: The rows past the three-split rule's and the second wave's (not those short of a wave of
#: two) run so at head dims of 33-127 too: 65-127 with 64-key steps as 128 (the same 128-column
#: tiles), 33-64 (``SHORT_HEAD_DIM``, 256-key steps otherwise) with this many keys a step. On an
#: H200 (docs/records/probes/decode_fill.py ``--occ-dims``, section 25 of the record above): D 64
#: 1.034-1.200x at 200-620 rows with 128-key steps (64-key steps 0.62-1.04x), D 96 1.023-1.211x
#: at 240-620 with 64-key steps; held out (``--occ-dims-held``, D 48-96, seventeen calls):
#: 1.150-1.256x at 340-392 rows and 1.030-1.090x at 592-648 (GPU time; 1.102-1.208x and
#: 1.046-1.076x isolated), but 0.908-1.063x at 176-256 rows (D 80 at 240 rows 0.908x, D 48 at
#: 192 0.911x), so those keep two CTAs an SM below D 128. A sliding window of at least
#: ``PART_WAVE_MIN_KEYS`` keys over a contiguous cache (no softcap) takes every band of these
#: rules, counted on the window's keys: on ten calls of 192-640 rows (windows of 3500-4096 keys
#: over 8k-32k caches, D 64 and 128; ``--occ-window``, section 26) the rules' form ran
#: 1.021-1.216x the two-CTA default, 91-103% of the copy rate on the window's bytes.
THIRD_CTA_SHORT_HEAD_STEP = 128
#: Shorter caches (from this many keys to ``PART_WAVE_MIN_KEYS``) at head dims of 33-64 whose
#: rows pass the SMs, up to a wave of three CTAs an SM (133-396 rows on 132 SMs; no window or
#: softcap, contiguous 16-bit), run one split at three CTAs an SM with 128-key steps as well,
#: whatever the band: each CTA's walk is short, and at two an SM the SMs idle while CTAs start
#: and end. On an H100 (sections 50-51 of docs/records/benchmarks/paged/issue49/README.md):
#: 1.10-1.16x two CTAs an SM on four calls of 160-384 rows over 1098-2000 keys (D 128 lost:
#: 0.84-0.92x); held out, ten calls (D 48-64, 140-336 rows, 800-2900 keys) 1.03-1.30x on the
#: GPU, 0.95-1.13x isolated, cuDNN's time over ours 0.96-1.02. Rows past that wave, up to a
#: wave of four (397-528), run four CTAs an SM so: held out, six calls 1.00-1.08x (GPU).
SHORT_CACHE_MIN_KEYS = 800
#: Within one wave of two CTAs an SM, past this share of the SMs (199-264 rows on 132 SMs),
#: that form reaches caches short of ``SHORT_CACHE_WAVE_MAX_KEYS`` keys. On an H100 (section 55
#: of the issue-49 record): 1.010-1.114x on eight D 64 calls of 136-250 rows over 3100-5500
#: keys, held out 1.000-1.171x on eight. On an H200 (section 56) 208-256 rows ran
#: 1.010-1.066x, 140-176 rows 0.899-0.976x (an H100 1.004-1.149x at 136-192).
SHORT_CACHE_WAVE_MIN_ROWS_SHARE = 1.5
#: The device the rules named "H100" were measured on, as torch names it (an H100 SXM: 132 SMs
#: as the H200, HBM3 at 3.35 TB/s against its 4.8). Elsewhere the rules follow the H200 where
#: the two parted. H100: the short-cache form's reach starts past the SMs (133-264 rows): it
#: ran 1.004-1.149x on ten calls of 136-192 rows over 3266-5500 keys there (section 56).
H100_NAMES = ("NVIDIA H100 80GB HBM3",)
H100_SHORT_CACHE_WAVE_MIN_ROWS_SHARE = 1.0
SHORT_CACHE_WAVE_MAX_KEYS = 6000
#: Rows past a wave of three CTAs an SM, up to this share of the SMs (397-495 on an H200), run
#: four CTAs an SM with 32-key steps, loads four ahead: one wave. On an H200 (``--occ-four``):
#: 1.017-1.034x at 400-480 rows (0.993x at 512, 1.003x at 528, two whole waves of two; 64-key
#: steps at four CTAs 0.97-1.02x); held out (``--occ-four-held``, 408-488 rows, D 128, bf16 and
#: fp16, GQA 7, MQA, a sink) 1.022-1.039x GPU time, 1.013-1.037x isolated.
FOURTH_CTA_MAX_ROWS_SHARE = 3.75
FOURTH_CTA_OCCUPANCY = 4
FOURTH_CTA_STEP = 32
FOURTH_CTA_LATENCY = 4
#: On Hopper a D 128 cache that the fill rules split for two CTAs an SM (rows short of the SMs)
#: over ``FILL_FOURTH_CTA_MIN_KEYS`` keys or more splits for one wave of four instead, in that
#: form (4 x SMs // rows splits, 32-key steps, loads four ahead), each split at least
#: ``FILL_FOURTH_CTA_SPLIT_KEYS`` keys, and twice that where it splits more than
#: ``FILL_FOURTH_CTA_FEW_SPLITS`` ways (rows short of half the SMs). On an H100 (section 55 of
#: the issue-49 record, ``decode_part_fill.py``): held out 1.052-1.102x on nine calls of 34-86
#: rows over 10500-70000 keys, 1.044-1.099x on four over 5000-9500; 382-433 keys a split
#: 0.986-1.003x. On an H200 (section 56): the nine 1.025-1.084x; over 4100-8000 keys 72-80 rows
#: (6-7 splits) 1.006-1.024x, 34-50 rows (10-15 splits of 520-654 keys) 0.930-0.963x.
FILL_FOURTH_CTA_MIN_KEYS = 4000
FILL_FOURTH_CTA_SPLIT_KEYS = 512
FILL_FOURTH_CTA_FEW_SPLITS = 8
#: One split at two CTAs an SM at head dims of 33-127 whose rows pass whole waves (of two CTAs
#: an SM) by at most this share of a wave (529-580, 793-897, ... rows on an H200; the rows past
#: a wave of two and the three-CTA bands take the rules above) splits only those last rows
#: (``DecodeSchedule.tail_rows``), in as many splits as fill the last wave, at most
#: ``TAIL_MAX_SPLITS``: the whole waves' rows run unsplit first, the last rows' splits fill
#: the last wave with shorter walks instead of leaving it mostly empty. On an H200
#: (docs/records/probes/decode_fill.py ``--tail`` and ``--tail-dims``, section 27 of
#: docs/records/benchmarks/paged/issue49/README.md): 1.056-1.225x one split at D 48-96 on
#: nine calls with 8-108 rows past whole waves (the rule's split counts), 0.95-1.02x with
#: 172-236; at D 128 (93-103% of the copy rate already) 0.95-1.04x with 2-48 rows past and
#: 0.94-0.97x with 72-208: D 128 keeps one split. Held out (``--tail-held``, ten calls of
#: 540-1140 rows, D 48-96, GQA 2-8 and MQA, fp16, a sink): 1.023-1.148x GPU time, 1.031-1.101x
#: isolated (cuDNN ÷ ours 1.01-1.19); two windows (3500, 4096 keys) 1.022-1.139x: windows take
#: it too.
TAIL_MAX_WAVE_SHARE = 0.4
TAIL_MAX_SPLITS = 8
#: A paged batch of several caches (no window, a 16-bit cache) whose rows do not fill the GPU takes
#: this many times the splits above at two CTAs an SM. Its caches have lengths of their own, and a
#: split of the longest ones ran alone at the end: on an H200 (H 32/8 and 28/4, D 128, pages of
#: 16-256, B 4-28, cache lengths cycling through 1, 3/4, 1/2 and 1/4 of the longest or drawn
#: log-uniformly from 64 to it; docs/records/probes/paged_balance.py) 4x ran 1.02-1.21x the rule's
#: splits on the first mix and 1.23-2.08x on the second; on six other batches (B 6-32, H_kv 1-8,
#: pages of 16-256) 1.02-1.39x and 1.26-2.81x. One cache (B 1) has nothing to balance and keeps the
#: rule (on caches of one length 4x ran 0.94-0.99x at pages of 32-256, 1.08-1.25x at pages of 16).
#: (Balanced splits, ``DecodeSchedule.balanced``, 0.97-1.14x more at 4x, are left to the tuner:
#: without ``max_k`` a call's longest cache is its block table's capacity.)
PAGED_SPLIT_FACTOR = 4
#: So does one whose rows fill its waves of one CTA an SM (one wave; small pages: two) but at
#: most this share of them (one split at two CTAs an SM leaves the second slot part-empty, and
#: the longest caches' CTAs run alone at the end): on an H200 (D 128, B 17-60, H_kv 4-8, pages
#: of 32-256; ``paged_balance.py --part``) four splits ran 1.05-1.24x one split on the cycling
#: mix and 1.54-1.75x on log-uniform lengths at 136-192 rows, but 0.87-0.93x (cycling) at
#: 200-240 rows; held out (``--part-held``, seven batches of 140-180 rows, H_kv 1-8, pages of
#: 32-256) 0.99-1.20x (cycling), 1.15-2.01x (log-uniform), and 0.84-0.94x on caches of one
#: length, which a paged batch (continuous batching) seldom has. At D 64 and 256 (144-160
#: rows) and over pages of 16 (280-360 rows; ``--part-more``) 1.08-1.48x (cycling),
#: 1.18-1.94x (log-uniform) and 0.96-1.28x (one length); pages of 16 at 512 rows lost
#: 0.83-0.85x at two and four splits (``--live``).
PAGED_PART_WAVE_MAX_SHARE = 1.5
#: A paged batch of several caches (a 16-bit cache, no window) whose one split at two CTAs an SM
#: passes one wave by at most this many waves again runs its entries longest cache first
#: (``DecodeSchedule.longest_first``): CTAs start in grid order, and a long cache's CTA started
#: in the last wave ran alone at the end. On an H100 (``docs/records/probes/paged_order.py``,
#: cache lengths cycling or log-uniform; GPU view) 1.02-1.15x on three batches of 1.2-1.7 waves
#: (B40 H32/8 over pages of 128, B100 H28/4 over 256, B56 H32/8 over 64), the entries arranged
#: so on the host 1.06-1.13x; 1.01-1.03x at six waves (B200), 0.96-0.99x at one wave exactly and
#: at four splits. Held out (seven batches, B45-128, H_kv 4-8, D 64 and 128, pages of 32-256)
#: 0.97-1.26x, 13 of 14 mixes faster. The ranking is a launch of its own, host time that an
#: isolated call waits for: 0.90-1.02x then (``paged/issue49/README.md`` section 47).
LONGEST_FIRST_MAX_WAVES = 2
#: A paged batch of several caches over small pages (16 keys a load) at two CTAs an SM, the
#: longest at most this many keys, walks flat on Hopper (``DecodeSchedule.flat``: one wave
#: shares the batch's key tiles evenly instead of proportional splits). On an H200
#: (``docs/records/probes/paged_flat.py``; cache lengths cycling through 1, 3/4, 1/2 and 1/4 of
#: the longest, or drawn log-uniformly from 64 to it): D 128, H 32/8, B 16 and 40 over 12000
#: and 5000 keys, 1.13-1.15x the split rule (cycling) and 1.24-1.34x (log-uniform); then seven
#: other batches (D 64-256, H_kv 1-8, 20-1600 rows, bf16 and fp16; ``--held``): over 3000-6000
#: keys 1.01-1.22x (cycling) and 1.05-1.40x (log-uniform) on all four, over 10000-20000 keys
#: 0.83-0.94x (cycling) and 0.79-1.27x (log-uniform), where the splits already stream evenly.
#: The bound was drawn from those seven; held out on four batches of 2500-6000 keys
#: (``docs/records/probes/paged_fa4.py``) 1.17-1.47x, and 0.87-0.95x at B8 over 9000 keys
#: (section 32 of ``docs/records/benchmarks/paged/issue49/README.md``). Larger pages
#: (128-key steps) keep their splits: at D 128 five batches ran 1.00-1.20x flat, but nine held
#: out (D 80-128, pages of 32-256, three length mixes) 0.50-1.17x, 0.86x on geometric mean.
FLAT_MAX_KEYS = 8192
#: ... and has at least this many rows (the layout's: entries x K/V heads x query tiles): at B10
#: H8/1 D 128 (10 rows) the flat walk ran 0.60-0.84x the split rule, at 48-112 rows 1.17-1.35x
#: (``docs/records/probes/paged_flat_stack.py --bpad``; section 33 of the record above).
FLAT_MIN_ROWS = 32
#: A flat walk whose split kernel walks its key tiles in one loop (a bf16 cache at D <= 64,
#: ``_flat.one_loop``) loads keys and values this many steps ahead. The two-loop bf16 kernel
#: kept 96-344 bytes of stack on sm_90 and ran 0.61-0.91x the split rule (``paged_flat_stack.py
#: --d64``), so those batches kept the split rule; with one loop and loads two ahead it keeps
#: none, and on an H200 (``paged_flat_oneloop.py``, pages of 16, GPU view) it ran 0.96-1.35x
#: the split rule on five batches of 32-640 rows (two length mixes; 1.12-1.35x on seven of the
#: ten) where two loops ran 0.56-0.81x (loads four ahead) and 0.81-1.16x (two ahead); held out
#: (``--held``, five other batches, D 32 and 64) 1.09-1.38x on eight mixes and 0.93-0.99x on
#: the two of 768 rows. With the host counted it won fewer (isolated 0.77-1.08x, back to back
#: 0.73-1.25x; section 35 of ``docs/records/benchmarks/paged/issue49/README.md``).
FLAT_ONE_LOOP_LATENCY = 2
#: An FP8 (e4m3) cache: its split kernel widens each key and value tile, which leaves it
#: waiting on latency at the bf16 rule's CTA count. It runs two CTAs an SM with K loads
#: ``FP8_K_LATENCY`` steps ahead and ``FP8_SPLIT_FACTOR`` times the rule's splits (at least that
#: many where the rule gives none to spare), each streaming at least ``FP8_MIN_KEYS_PER_SPLIT``
#: keys, except a contiguous batch whose one split fills the GPU. On an H200 (H 32/8 and 28/4,
#: D 128; docs/records/probes/paged_fp8.py --sweep): 1.03-1.68x the bf16 rule on six
#: mixed-length paged batches (pages of 16-256, B 8-56) and 1.11-1.27x on contiguous caches at
#: B 1, 4 and 12; a contiguous B 32 over 3000 keys (256 rows, one split fills the GPU) ran
#: 0.81x with them, so it keeps the rule's. Checked on nine other batches (``--check``):
#: 1.07-1.77x where it applies, 1.00x at B 1 over 32k keys. Once the value tile was read as
#: int16 words (a leaner step), a contiguous cache ran best with as many splits as two CTAs an SM
#: hold in one wave (``FULL_GPU_OCCUPANCY x SMs // rows``), each streaming at least
#: ``FP8_CONTIGUOUS_MIN_KEYS`` keys (docs/records/probes/fp8_words_sweep.py: about half the
#: former splits, 1.08-1.12x on five caches at B 1-16; 1.03-1.20x one split more where the
#: rows divide the SMs unevenly); paged batches keep theirs (0.80-1.04x at half).
FP8_SPLIT_FACTOR = 4
FP8_MIN_KEYS_PER_SPLIT = 512
FP8_CONTIGUOUS_MIN_KEYS = MIN_KEYS_PER_SPLIT
FP8_K_LATENCY = 4
#: Over small pages (64-key steps) an FP8 cache's value loads run this many steps ahead:
#: 1.155-1.161x two ahead on three batches at pages of 16 (B 8-40, H 32/8 and 28/4), 0.98-0.99x
#: at pages of 32 and 0.96-0.99x at 64-256 (docs/records/probes/fp8_words_sweep.py).
FP8_SMALL_PAGE_V_LATENCY = 4
#: Head dims up to this walk ``SHORT_HEAD_STEP``-key steps over a contiguous 16-bit cache of at
#: least ``SHORT_HEAD_MIN_KEYS`` keys without a window: as many bytes a step as 128 keys at D 128.
#: On an H200 (batch 1-32, H 8-32 with groups of 1 and 4, caches of 2k-30k keys;
#: b83b497:docs/records/probes/decode_small_batches.py --heads64 --steps) 256-key steps ran
#: 1.04-1.12x the 128-key default at D 64 on all seven calls (geometric mean 1.09x; cuDNN's lead
#: there fell from 1.18-1.23x to 1.03-1.13x). Shorter caches were not measured, nor generations with
#: less shared memory an SM than Hopper's (``TWO_CTAS_AN_SM``): there the steps stay 128 keys.
SHORT_HEAD_DIM = 64
SHORT_HEAD_STEP = 256
SHORT_HEAD_MIN_KEYS = 2048
#: Shorter caches of at least ``SHORT_HEAD_ALONE_MIN_KEYS`` keys at D 33-64 take those steps
#: where one split runs each CTA alone on its SM (rows above the fill rule's share, short of the
#: SMs; 16-row tiles, a contiguous 16-bit cache, no window or softcap): on an H200 (section 58
#: of the issue-49 record, 96-120 rows over 1000-1500 keys) 1.081-1.140x the 128-key steps on
#: four calls, cuDNN's lead there 1.13-1.17x before; on an H100 0.991-1.095x on seven (D 48-64,
#: 96-128 rows, 900-2000 keys).
SHORT_HEAD_ALONE_MIN_KEYS = 900
#: On Hopper a contiguous 16-bit cache of at least ``SHORT_HEAD_SPLIT_MIN_KEYS`` keys at D <= 64
#: (256-key steps, 16-row tiles, no window or softcap) whose rule splits it for one CTA an SM
#: takes ``SHORT_HEAD_SPLIT_FACTOR`` times the splits at two CTAs an SM: a 256-key step at
#: D 64 is half a D 128 one's bytes, and one CTA an SM streams it short of the copy rate. On an
#: H100 (section 53 of docs/records/benchmarks/paged/issue49/README.md, ten calls of 8-64 rows
#: at 2-16 splits over 9000-131072 keys): 0.999-1.042x the one CTA an SM (six, then four held
#: out); at D 128 the same ran 0.97-0.98x (five calls), so D 128 keeps its splits. Fewer
#: than ``SHORT_HEAD_SPLIT_MIN_ROWS`` rows (more than 32 splits after) were not measured.
SHORT_HEAD_SPLIT_FACTOR = 2
SHORT_HEAD_SPLIT_MIN_KEYS = 9000
SHORT_HEAD_SPLIT_MIN_ROWS = 8
#: On Hopper a D 128 split at one CTA an SM over a contiguous 16-bit cache of
#: ``LONG_SPLIT_MIN_KEYS`` keys or more (128-key steps, 16-row tiles, no window or softcap)
#: loads its keys ``LONG_SPLIT_K_LATENCY`` steps ahead, values two: 1.001-1.056x on eight calls
#: over 40000-131072 keys (H100, section 54 of the issue-49 record); 0.993x over 8000 keys, D
#: 80-96 0.997x, one split 0.999-1.001x.
LONG_SPLIT_K_LATENCY = 3
LONG_SPLIT_MIN_KEYS = 32768
#: At most this many query rows (splits x the tile's rows) are merged per output row: the combine
#: kernel walks a row's splits in a chain, so a cache of one or two K/V heads split for a whole wave
#: (66-132 splits) spent longer merging than streaming. On an H200 (one K/V head, batch 1 and 2, D
#: 64 and 128; b83b497:docs/records/probes/decode_small_batches.py --mqa) half to a quarter of those
#: splits ran 1.10-1.88x the default (B1 H64/1 over 32k keys: 128 splits of 64-row tiles 50.6 µs, 32
#: splits 26.9 µs), an eighth 0.72-1.66x. Checked on five other calls of one or two K/V heads
#: (``--check-rows``): 1.04-1.42x the uncapped splits on four, 0.95x on one (B1 H32/1 over 64k keys,
#: D 64: 32 splits of 32-row tiles against 132). With the block merge (``DEFAULT_COMBINE``, one load
#: of all of a row's splits) the cost per split fell and the cap rose to what one block holds,
#: ``_launch.BLOCK_MAX_ROWS`` (2048 rows; on an H200, twice the splits merged as a block ran 1.63x
#: and 1.57x the 1024-row default on the two multi-query calls that it changes).
MAX_MERGED_ROWS = BLOCK_MAX_ROWS
#: How the default merges its splits: all of a row's splits from one tile (``"block"``; a
#: schedule of more rows than a block holds falls back to the stepping merge in ``normalise``).
#: On an H200 (ten decode calls, B 1-4, H_kv 1-8, D 64-256; decode_small_batches.py --block)
#: 1.011-1.348x the stepping merge, faster at every call (geometric mean 1.070x). Calls with
#: sinks as well (the block merge adds each row's sink once; GPU-tested since).
DEFAULT_COMBINE = "block"
#: Where the default launches that merge as a programmatic dependent of the split kernel
#: (``"block_pdl"``: its CTAs are scheduled while the split kernel drains): on Hopper, a plain
#: or sink-merging split over a contiguous or paged 16-bit cache of a head dim up to this (no
#: softcap, window, FP8 cache or padded ragged batch). On an H200: 0.990-1.106x the block merge
#: on fifteen contiguous calls (B 1-4, H_kv 1-16, D 64-128, 4k-50k keys; 1.031x on geometric
#: mean) and 0.989-1.159x on 22 paged batches (B 4-32, pages of 16-256, two length mixes;
#: 1.021x); at D 256 it ran 0.73x, where the split kernel compiled with the PDL instruction
#: spills (472 bytes of stack on sm_90, none without); with a softcap it spills 48 bytes at
#: D 128 (``docs/records/benchmarks/paged/issue49/README.md``, section 10).
PDL_MAX_HEAD_DIM = 128
#: Where those occupancy rules apply: generations with 228 KB of shared memory an SM (two CTAs
#: of these kernels fit; measured on Hopper). Ampere, Ada and consumer Blackwell keep one.
TWO_CTAS_AN_SM = ("hopper", "blackwell")


def window_keys(problem: Problem) -> int:
    """The keys the call's query rows may see at all: the length of the union of their
    visible ranges (``problem.key_span(0, S_q - 1)``; the whole cache without a window)."""
    lo, hi = problem.key_span(0, problem.seqlen_q - 1)
    return max(hi - lo, 0)


def _tail_splits(tail: int, wave: int, most_splits: int) -> int:
    """The splits of ``tail`` rows that fill a last wave of ``wave`` CTAs, at most
    :data:`TAIL_MAX_SPLITS` (8 splits of a tile of at most ``MAX_TILE_M`` rows stay under
    ``MAX_MERGED_ROWS``) and ``most_splits``; 0 without a tail."""
    return min(TAIL_MAX_SPLITS, wave // tail, most_splits) if tail else 0


def _one_wave(base: DecodeSchedule, ctas: int, splits: int, step: int) -> DecodeSchedule:
    """``base`` in ``splits`` splits, one wave of ``ctas`` CTAs an SM, ``step``-key steps."""
    return base.replace(splits=splits, occupancy=ctas, tile_n=step, combine="block_pdl")


def default_decode_schedule(arch: str, problem: Problem, device_name: str = "",
                            sms: int = 0) -> DecodeSchedule:
    """Per-architecture default (``device_name``: the GPU's, for the rules measured apart on
    devices of one architecture, :data:`H100_NAMES`; ``sms``: its SMs, which the rules below
    count waves and shares of, 0 for the generation's ``SM_COUNTS``): heads of a group packed
    into one tile, 128-key steps (256 on Hopper and data-centre Blackwell at head dims up to 64
    over a contiguous cache of 2k keys or more, :data:`SHORT_HEAD_STEP`), loads issued two steps
    ahead, and enough splits to give each SM one CTA (capped so that a split streams at least
    ``MIN_KEYS_PER_SPLIT`` keys); the merge as a second kernel that
    loads all of a row's splits at once (:data:`DEFAULT_COMBINE`), on Hopper launched as a
    programmatic dependent where the split kernel so compiled does not spill and it measured
    faster (:data:`PDL_MAX_HEAD_DIM`; on an H100 the stepping merge so launched measured 0-5%
    slower at S_k = 32k-128k); rows just past one wave of two CTAs an SM split in three
    (:data:`PART_WAVE_MAX_SHARE`). Where one split leaves a third of the SMs or more idle (and two
    would not give each SM a CTA), a contiguous cache long enough to split splits for two CTAs
    an SM instead (:data:`FILL_MAX_ROWS_SHARE`; with 256-key steps wherever one split leaves an
    SM idle; not with a softcap above D 128, whose split kernel keeps stack); so does one whose
    rule gives two splits or more that fill at most :data:`FILL_MAX_CTAS_SHARE` of the SMs (D
    <= 128, no window); on Hopper a D 128 cache of :data:`FILL_FOURTH_CTA_MIN_KEYS` keys or
    more that these two rules split runs one wave of four CTAs an SM instead. Rows above that
    share up to :data:`DEEP_STEP_MAX_ROWS_SHARE` of the SMs
    (one split, each CTA alone on its SM) walk 256-key steps with each load one step ahead at
    D 65-128 (on Hopper at D 128 over :data:`DEEP_STEP_SPLIT_MIN_KEYS` keys, splits for one wave
    of three CTAs an SM instead); on Hopper, one split at D 128 whose rows fill from
    :data:`THIRD_CTA_MIN_ROWS_SHARE` of the SMs to two CTAs each, fit three CTAs an SM past
    the three-split rule's rows, or leave a third wave of two at most half full
    (:data:`THIRD_CTA_SECOND_WAVE_ROWS_SHARES`), runs three CTAs an SM with 64-key steps; rows
    just past a wave of three (up to :data:`FOURTH_CTA_MAX_ROWS_SHARE` of the SMs) run one wave
    of four with 32-key steps. At D 33-127 the last two bands of three CTAs an SM apply too
    (:data:`THIRD_CTA_SHORT_HEAD_STEP`-key steps at D <= 64), and all of them to a window over a
    contiguous cache (counted on its keys; no softcap); elsewhere past a wave of two at D
    33-127 the rows of a last wave at most :data:`TAIL_MAX_WAVE_SHARE` full split to fill it.
    On Hopper, rows past the SMs by at most :data:`PART_FILL_MAX_ROWS_SHARE` of them (at D 128
    short of the three-CTA band) over :data:`PART_FILL_MIN_KEYS` keys or more run one wave of
    a CTA an SM and split the rest to fill a second (``tail_rows``); a D 33-64 cache of
    :data:`SHORT_HEAD_ALONE_MIN_KEYS` keys or more whose one split leaves each CTA alone on its
    SM walks 256-key steps however short; a D <= 64 cache split for one CTA an SM takes
    :data:`SHORT_HEAD_SPLIT_FACTOR` times the splits at two, a D 128 one
    over :data:`LONG_SPLIT_MIN_KEYS` keys loads its keys :data:`LONG_SPLIT_K_LATENCY` ahead; at D
    33-64, caches of :data:`SHORT_CACHE_MIN_KEYS` keys up to ``PART_WAVE_MIN_KEYS`` (within a
    wave of two CTAs an SM past :data:`SHORT_CACHE_WAVE_MIN_ROWS_SHARE` of the SMs,
    :data:`SHORT_CACHE_WAVE_MAX_KEYS`) whose rows pass the SMs, up
    to a wave of four CTAs an SM, run one split at three CTAs an SM (four
    past a wave of three) with 128-key steps (both over a contiguous 16-bit cache, no window
    or softcap). On an H100 the short-cache form's reach starts past the SMs
    (:data:`H100_SHORT_CACHE_WAVE_MIN_ROWS_SHARE`) and D 96-128 caches of fewer than
    :data:`H100_FILL_ONE_SPLIT_MAX_KEYS` keys that the fill rule would split run one split at
    one CTA an SM.

    With a sliding window the walk covers only the window's keys (:func:`window_keys`, not
    ``S_k``): the key step is at most the power of two that holds them (at least 32; a 33-key
    window walks 64-key tiles, not 128-key ones), and the splits are counted from those keys;
    over a contiguous 16-bit cache every rule above applies as to a cache of the window's keys,
    but a window of at most :data:`WINDOW_SPLIT_MIN_KEYS` keys runs one split (with a softcap
    above D 128, at one CTA an SM); a paged or FP8 window also splits only where that multiplies
    its CTAs :data:`WINDOW_SPLIT_MIN_GAIN`-fold, and keeps one CTA an SM. A ragged batch (a
    paged cache's) splits by the same rule, counted on its longest cache: on an H200 (page 64,
    H 32/8, D 128), more splits than the rule gives cost 1.07-1.26x on caches of one length (B 8
    at 8k, B 64 at 2k) and gained 1.04x and 1.18x on cache lengths drawn from 100 to 32k (B
    64 at 4 splits, B 16 at 8). Pages whose loads take 16 keys walk 64-key steps split for two waves
    (:data:`SMALL_PAGE_STEP`; at two CTAs an SM, loads :data:`SMALL_PAGE_LATENCY` steps
    ahead); a paged split that fills the GPU by itself runs two CTAs an SM (with larger pages,
    K loads four steps ahead); one that does not takes
    :data:`PAGED_SPLIT_FACTOR` times the splits at two CTAs an SM, and so does one whose rows
    fill at most :data:`PAGED_PART_WAVE_MAX_SHARE` of its waves; on Hopper a small-page batch
    at two CTAs an SM over at most :data:`FLAT_MAX_KEYS` keys with at least
    :data:`FLAT_MIN_ROWS` rows walks flat instead (``DecodeSchedule.flat``: one wave shares its
    key tiles evenly; a bf16 cache at D <= 64 loads :data:`FLAT_ONE_LOOP_LATENCY` ahead). An
    FP8 cache takes more splits at two CTAs an SM (:data:`FP8_SPLIT_FACTOR`). Every rule stops
    where the combine would merge more than :data:`MAX_MERGED_ROWS` rows of partials into one
    output row."""
    gen = generation(arch)
    h100 = gen == "hopper" and device_name in H100_NAMES
    # one tile holds the whole group's rows for up to MAX_TILE_M rows, so K/V are read once
    # per head (or per MAX_TILE_M rows of it)
    rows = problem.group_size * (1 << (problem.seqlen_q - 1).bit_length())
    tile_m = min(MAX_TILE_M, max(16, 1 << (rows - 1).bit_length()))
    # a softcap above D 128 compiles a split kernel that keeps stack (sm_90: 80-128 bytes at one
    # CTA an SM, 200-280 at two): the rules measured without one leave it as it was
    capped_wide = problem.softcap > 0 and problem.head_dim > 128
    # a window over a contiguous 16-bit cache splits as a cache of the window's keys would (and
    # runs two CTAs an SM as it would, but for a capped wide head)
    contiguous = not problem.page_size and not problem.kv_dtype
    contiguous_window = problem.windowed and contiguous and not capped_wide
    # what the one-split occupancy rules were measured on: a contiguous 16-bit cache of one
    # length, no softcap (a window counted on its keys)
    uncapped = contiguous and not (problem.softcap or problem.ragged)
    # and the one-split wave and step rules: the same without a window
    plain = uncapped and not problem.windowed
    keys = window_keys(problem) if problem.windowed else problem.seqlen_k
    tile_n = 128 if problem.head_dim <= 128 else 64
    if (gen in TWO_CTAS_AN_SM and problem.head_dim <= SHORT_HEAD_DIM
            and keys >= SHORT_HEAD_MIN_KEYS and not problem.page_size
            and not problem.kv_dtype):
        tile_n = SHORT_HEAD_STEP
    if problem.windowed:
        tile_n = min(tile_n, max(32, 1 << max(keys - 1, 0).bit_length()))
    small_pages = bool(problem.page_size) and page_tile(problem.page_size) <= SMALL_PAGE_ROWS
    if small_pages:
        tile_n = min(tile_n, SMALL_PAGE_STEP)
    base = DecodeSchedule(tile_n=tile_n, tile_m=tile_m, k_latency=2, v_latency=2,
                          combine=DEFAULT_COMBINE)
    rows = layout(problem, base).rows  # CTAs per split
    sms = sms or SM_COUNTS[gen]
    # the most rows the three-split rule takes: a quarter past one wave of two CTAs an SM
    part_wave_rows = PART_WAVE_MAX_SHARE * FULL_GPU_OCCUPANCY * sms
    waves = SMALL_PAGE_WAVES if small_pages else 1
    # one wave (these kernels run one CTA per SM on sm_90), or small pages' waves
    wanted = sms // rows if waves == 1 else -(-waves * sms // rows)
    # the most splits the keys take (a window of at most WINDOW_SPLIT_MIN_KEYS keys: one)
    most_splits = (1 if problem.windowed and keys <= WINDOW_SPLIT_MIN_KEYS
                   else keys // MIN_KEYS_PER_SPLIT)
    occupancy, k_latency = 1, base.k_latency
    # (paged and FP8 windows: not measured)
    two_ctas = gen in TWO_CTAS_AN_SM and (not problem.windowed or contiguous_window)
    # on an H100 a short cache the fill rule would split runs one split at one CTA an SM
    h100_unsplit = (h100 and plain and 96 <= problem.head_dim <= 128 and tile_m == 16
                    and wanted == 1 and rows <= FILL_MAX_ROWS_SHARE * sms
                    and keys < H100_FILL_ONE_SPLIT_MAX_KEYS)
    if two_ctas and rows >= waves * sms:  # one split fills the GPU: two CTAs an SM
        occupancy = FULL_GPU_OCCUPANCY
        if problem.page_size and not small_pages:
            k_latency = 4
        if (plain and problem.head_dim <= 128 and keys >= PART_WAVE_MIN_KEYS
                and FULL_GPU_OCCUPANCY * sms < rows <= part_wave_rows):
            wanted = PART_WAVE_SPLITS  # the rows past one wave would run alone at the end
        part_fill_rows = (THIRD_CTA_MIN_ROWS_SHARE if problem.head_dim == 128
                          else PART_FILL_MAX_ROWS_SHARE) * sms
        if (plain and gen == "hopper" and problem.head_dim <= 128 and keys >= PART_FILL_MIN_KEYS
                and sms < rows <= part_fill_rows):
            # else a wave of two CTAs an SM runs part-empty: one wave of a CTA an SM, the rows
            # past it (in whole batch entries) split to fill a second
            tail = rows_past_waves(problem, base, sms)
            tail_splits = _tail_splits(tail, sms, most_splits)
            # a tail whose splits fill too few SMs to stream at the copy rate, or rounded up
            # to whole entries past twice the rows past the SMs, or groups of more than 16
            # heads (not measured), keep the rule before
            if (tail_splits >= 2 and tail * tail_splits >= sms // 2
                    and tail <= 2 * (rows - sms) and tile_m == 16):
                return base.replace(splits=tail_splits, tail_rows=tail, combine="block_pdl")
            if problem.head_dim < 128:
                wanted = PART_FILL_SPLITS
    elif two_ctas and problem.page_size and wanted == 1:
        wanted, occupancy = 2, FULL_GPU_OCCUPANCY  # a paged batch of fewer rows than SMs
    elif (two_ctas and most_splits > 1 and not problem.ragged and not problem.kv_dtype
          and not capped_wide and not h100_unsplit
          and ((wanted == 1 and (rows <= FILL_MAX_ROWS_SHARE * sms
                                 or tile_n == SHORT_HEAD_STEP))
               or (wanted > 1 and rows * wanted <= FILL_MAX_CTAS_SHARE * sms
                   and problem.head_dim <= 128 and not problem.windowed))):
        # a third of the SMs or more idle at one split (any idle with 256-key steps), or the
        # rule's splits leaving more than a fifth idle: as many splits as two CTAs an SM hold
        # (a cache too short to split keeps one CTA an SM: one split at two an SM below the SM
        # count ran 0.97x)
        wanted, occupancy = FULL_GPU_OCCUPANCY * sms // rows, FULL_GPU_OCCUPANCY
    if (problem.page_size and problem.batch > 1 and not problem.windowed and not problem.kv_dtype
            and two_ctas and PAGED_SPLIT_FACTOR > 1
            and rows <= PAGED_PART_WAVE_MAX_SHARE * waves * sms):
        wanted, occupancy = max(wanted, 1) * PAGED_SPLIT_FACTOR, FULL_GPU_OCCUPANCY
    if problem.kv_dtype and two_ctas and (problem.page_size or rows < waves * sms):
        wanted, least = ((max(wanted, 1) * FP8_SPLIT_FACTOR, FP8_MIN_KEYS_PER_SPLIT)
                         if problem.page_size
                         else (FULL_GPU_OCCUPANCY * sms // rows, FP8_CONTIGUOUS_MIN_KEYS))
        splits = max(1, min(wanted, keys // least, MAX_SPLITS, MAX_MERGED_ROWS // tile_m))
        return base.replace(splits=splits, occupancy=FULL_GPU_OCCUPANCY,
                            k_latency=FP8_K_LATENCY,
                            v_latency=FP8_SMALL_PAGE_V_LATENCY if small_pages else base.v_latency)
    if problem.windowed and not contiguous and wanted < WINDOW_SPLIT_MIN_GAIN:
        wanted = 1
    split_cap = min(most_splits, MAX_SPLITS, MAX_MERGED_ROWS // tile_m)
    splits = max(1, min(wanted, split_cap))
    if (gen == "hopper" and plain and occupancy == 1 and splits > 1 and tile_m == 16
            and tile_n == SHORT_HEAD_STEP and keys >= SHORT_HEAD_SPLIT_MIN_KEYS
            and rows >= SHORT_HEAD_SPLIT_MIN_ROWS):
        # a D <= 64 split (256-key steps) alone on its SM: more splits at two CTAs an SM
        splits = min(SHORT_HEAD_SPLIT_FACTOR * splits, split_cap)
        occupancy = FULL_GPU_OCCUPANCY
    if (gen == "hopper" and plain and problem.head_dim == 128 and tile_m == 16 and splits > 1
            and occupancy == FULL_GPU_OCCUPANCY and rows < sms
            and keys >= FILL_FOURTH_CTA_MIN_KEYS):
        # the fill rules' splits: one wave of four CTAs an SM, each split long enough
        fourth = min(FOURTH_CTA_OCCUPANCY * sms // rows, split_cap)
        least = FILL_FOURTH_CTA_SPLIT_KEYS * (1 if fourth <= FILL_FOURTH_CTA_FEW_SPLITS else 2)
        if keys >= least * fourth:
            return _one_wave(base, FOURTH_CTA_OCCUPANCY, fourth, FOURTH_CTA_STEP).replace(
                k_latency=FOURTH_CTA_LATENCY, v_latency=FOURTH_CTA_LATENCY)
    # one split at one CTA an SM above the fill rule's rows (so short of the SMs): each CTA
    # alone on its SM
    alone = (gen in TWO_CTAS_AN_SM and plain and splits == 1 and occupancy == 1 and tile_m == 16
             and rows > FILL_MAX_ROWS_SHARE * sms)
    if (alone and rows <= DEEP_STEP_MAX_ROWS_SHARE * sms
            and SHORT_HEAD_DIM < problem.head_dim <= 128 and keys >= DEEP_STEP_MIN_KEYS):
        if gen == "hopper" and problem.head_dim == 128 and keys >= DEEP_STEP_SPLIT_MIN_KEYS:
            # a D 128 cache long enough: split for one wave of three CTAs an SM instead
            return _one_wave(base, THIRD_CTA_OCCUPANCY,
                             min(THIRD_CTA_OCCUPANCY * sms // rows, split_cap), THIRD_CTA_STEP)
        # each CTA alone on its SM: 256-key steps, loads one ahead
        return base.replace(tile_n=SHORT_HEAD_STEP, k_latency=1, v_latency=1)
    if (alone and gen == "hopper" and 32 < problem.head_dim <= SHORT_HEAD_DIM
            and keys >= SHORT_HEAD_ALONE_MIN_KEYS):
        # a short D 33-64 cache: 256-key steps all the same
        return base.replace(tile_n=SHORT_HEAD_STEP)
    # one split at two CTAs an SM on Hopper, 16-row tiles: what the rules below may change
    hopper_one_split = (gen == "hopper" and splits == 1 and occupancy == FULL_GPU_OCCUPANCY
                        and tile_m == 16)
    wave_share = H100_SHORT_CACHE_WAVE_MIN_ROWS_SHARE if h100 else SHORT_CACHE_WAVE_MIN_ROWS_SHARE
    short_cache_keys = (SHORT_CACHE_WAVE_MAX_KEYS
                        if wave_share * sms < rows <= FULL_GPU_OCCUPANCY * sms
                        else PART_WAVE_MIN_KEYS)
    if (hopper_one_split and 32 < problem.head_dim <= SHORT_HEAD_DIM and plain
            and SHORT_CACHE_MIN_KEYS <= keys < short_cache_keys
            and sms < rows <= FOURTH_CTA_OCCUPANCY * sms):
        # short walks: a third CTA an SM (a fourth past a wave of three) keeps the SMs
        # streaming while CTAs start and end
        ctas = THIRD_CTA_OCCUPANCY if rows <= THIRD_CTA_OCCUPANCY * sms else FOURTH_CTA_OCCUPANCY
        return base.replace(occupancy=ctas, tile_n=THIRD_CTA_SHORT_HEAD_STEP)
    if (hopper_one_split and 32 < problem.head_dim <= 128 and keys >= PART_WAVE_MIN_KEYS
            and uncapped):
        low, high = THIRD_CTA_SECOND_WAVE_ROWS_SHARES
        if ((THIRD_CTA_MIN_ROWS_SHARE * sms <= rows <= FULL_GPU_OCCUPANCY * sms
             and problem.head_dim == 128)
                or part_wave_rows < rows <= THIRD_CTA_OCCUPANCY * sms
                or low * sms < rows <= high * sms):
            # a wave of two CTAs an SM not full, or a last wave of two at most half full
            # whose CTAs a third CTA an SM takes into the wave before
            return base.replace(occupancy=THIRD_CTA_OCCUPANCY,
                                tile_n=THIRD_CTA_SHORT_HEAD_STEP
                                if problem.head_dim <= SHORT_HEAD_DIM else THIRD_CTA_STEP)
        if (THIRD_CTA_OCCUPANCY * sms < rows <= FOURTH_CTA_MAX_ROWS_SHARE * sms
                and problem.head_dim == 128):
            # a wave of three CTAs an SM and a bit: one wave of four
            return base.replace(occupancy=FOURTH_CTA_OCCUPANCY, tile_n=FOURTH_CTA_STEP,
                                k_latency=FOURTH_CTA_LATENCY, v_latency=FOURTH_CTA_LATENCY)
        wave = FULL_GPU_OCCUPANCY * sms
        tail = rows_past_waves(problem, base, wave)
        if 0 < tail <= TAIL_MAX_WAVE_SHARE * wave and problem.head_dim < 128:
            # the last wave's rows split to fill it (the whole waves' rows first, unsplit)
            tail_splits = max(2, _tail_splits(tail, wave, most_splits))
            return base.replace(splits=tail_splits, tail_rows=tail, occupancy=occupancy,
                                combine="block_pdl")
    if (gen == "hopper" and plain and problem.head_dim == 128 and tile_m == 16 and splits > 1
            and occupancy == 1 and keys >= LONG_SPLIT_MIN_KEYS):
        k_latency = LONG_SPLIT_K_LATENCY  # a D 128 split alone on its SM: keys further ahead
    v_latency = base.v_latency
    if small_pages and not problem.windowed and occupancy == FULL_GPU_OCCUPANCY:
        k_latency = v_latency = SMALL_PAGE_LATENCY
    pdl = (splits > 1 and gen == "hopper" and problem.head_dim <= PDL_MAX_HEAD_DIM
           and not (problem.softcap or problem.windowed or problem.kv_dtype
                    or (problem.ragged and not problem.page_size)))
    flat = (gen == "hopper" and small_pages and problem.batch > 1 and flat_applies(problem)
            and occupancy == FULL_GPU_OCCUPANCY and problem.seqlen_k <= FLAT_MAX_KEYS
            and rows >= FLAT_MIN_ROWS)
    wave = FULL_GPU_OCCUPANCY * sms
    longest_first = (gen == "hopper" and problem.page_size > 0 and problem.batch > 1
                     and not problem.windowed and not flat and splits == 1
                     and occupancy == FULL_GPU_OCCUPANCY
                     and wave < rows <= LONGEST_FIRST_MAX_WAVES * wave)
    if flat and one_loop(problem.dtype, padded_head_dim(problem.head_dim)):
        k_latency = v_latency = FLAT_ONE_LOOP_LATENCY
    return base.replace(splits=splits, occupancy=occupancy, k_latency=k_latency,
                        v_latency=v_latency, combine="block_pdl" if pdl else base.combine,
                        flat=flat, longest_first=longest_first)
