"""The forward kernel's per-architecture default schedule: what ``sdpa`` runs for a shape nobody
tuned and the shipped table does not cover."""

from __future__ import annotations

from ...core._compile import generation
from ...core._dtypes import FP8_DTYPES
from ...core._problem import Problem, head_dim_parts, head_slots
from ._launch import packable
from ._schedule import Schedule

__all__ = ["default_schedule", "row_keys", "PACKED_SHORT", "PACKED_SAWTOOTH", "packs_heads",
           "PAGE_PARTS_MAX_ROWS", "PAGE_PARTS_MIN_KEYS"]

#: A long query run over pages of half a key tile reads them in place (each tile two page
#: loads, folded as one step) where its longest query run times the query heads of a K/V
#: group is at most this many rows, else copies them first: the copy costs the same whatever
#: the queries, the parts' overhead grows with them. H100, bf16 D 128, pages of 64 under
#: 128-key tiles, time over the contiguous call: 1.14x and 1.19x in place against 1.24x and
#: 1.42x copied at 2048 and 1024 rows; 1.24x against 1.06x at 7168
#: (docs/records/probes/chunked_in_place.py). Pages of 32 and 16 (four and eight parts) ran
#: 1.31-1.47x and 2.2-2.4x: copied.
PAGE_PARTS_MAX_ROWS = 2048
#: The fewest keys such a part holds: parts of 64 keys are what was measured (a 64-key tile
#: over pages of 32, the sm_80 / sm_120 defaults' case, was not); smaller pages are copied.
PAGE_PARTS_MIN_KEYS = 64
#: A window this narrow (the most keys a row sees) runs on 64x64 tiles: a query tile visits the
#: key tiles from its first row's first key to its last row's last, TILE_M + span keys rounded
#: out to TILE_N; at 256 keys a 128x128 tile visits 3-4 key tiles (384-512 keys) per row that
#: uses 256, a 64x64 one 5-6 (320-384 keys). Chosen by this count, not measured.
NARROW_WINDOW = 256
#: The longest bucket length (``Problem.ragged``: the longest sequence rounded up to a power of
#: two) whose packed D 128 forward runs 64-row tiles without a mask: measured up to 2048 (the
#: gain fell from 1.23x at 512 to 1.09x at 2048), so longer ones keep the rectangle's tiles.
PACKED_SHORT = 2048
#: The longest bucket length up to which those 64-row tiles walk their key tiles sawtooth: on
#: an H100, 1.00-1.10x the forward walk on six packed batches of buckets 128-512 (D 128, no
#: mask, H 8-32, grouped and not, bf16 and fp16), 0.98x at 2048
#: (``docs/records/benchmarks/varlen/issue50``, fiftieth session).
PACKED_SAWTOOTH = 512
#: A full-mask D 256 call (no window) whose rows see more than the first and at most the second
#: of these many keys walks its key tiles sawtooth (odd query tiles backwards, so consecutive
#: tiles of a head meet the same keys in the L2). On an H200
#: (docs/records/probes/forward_short_d256.py) 1.044-1.064x the forward walk at 700-2000 keys on
#: five calls (B 8-32, H 8-16, groups 1-8, bf16 and fp16), 0.987x at 512 keys, 0.997-1.007x
#: at 4k-16k; D 192 (two head-dim parts) at 2048 keys 0.998x.
WIDE_SAWTOOTH_KEYS = (512, 2048)
#: A causal D > 128 call (no window) whose rows see at most this many keys leaves its query
#: tiles unpaired, takes the longest first and walks their key tiles sawtooth: pairing evens
#: out long causal walks, but a short one has few tiles to even out and pays for the pair's
#: second walk in registers. On an H200 (docs/records/probes/forward_short_d256.py
#: --causal-lengths, --causal-held): 1.015-1.21x the paired default at 300-2048 keys on
#: twelve calls (B 6-128, D 192 and 256, groups 1-8, bf16 and fp16), 0.94-1.04x from 2600 keys.
CAUSAL_UNPAIRED_KEYS = 2048


def row_keys(problem: Problem) -> int:
    """The most keys one query row sees: ``S_k``, bounded by the window's width (with the
    causal mask its right side is the diagonal). A plain problem gives ``S_k``."""
    sk = problem.seqlen_k
    left = problem.window_left if problem.window_left >= 0 else sk
    right = 0 if problem.causal else (problem.window_right if problem.window_right >= 0 else sk)
    return min(sk, left + right + 1)


def even_tiles(problem: Problem, tile_m: int, tile_n: int) -> bool:
    """Whether ``problem``'s lengths are whole numbers of ``tile_m`` x ``tile_n`` tiles."""
    return problem.seqlen_q % tile_m == 0 and problem.seqlen_k % tile_n == 0


def _hopper_fp8(problem: Problem, split: dict) -> Schedule | None:
    """sm_90's FP8 (e4m3) rules where they differ from bf16's (``None``: bf16's), each the
    winner of a ``tiledtune search`` on an H200 (``docs/records/benchmarks/fp8``):

    - D <= 128, no mask, whole tiles: 128x256 tiles (a 256-key step holds as many bytes as a
      bf16 128-key one) with 8 worker warps: within 1% of the best of 30 candidates at B1
      H32/8 S8192 and B4 H28/4 S4096 (0.90-1.00x our bf16 forward in the layout probe, against
      0.82-0.93x for the bf16 rule's persistent 128x128 tiles).
    - D > 128, causal: the bf16 rule's 128x128 tiles at occupancy 3 with 8 worker warps,
      without a cluster; no mask: 128x64 at occupancy 2 with 8 worker warps. Both with
      ``fast_acc`` (set by :func:`default_schedule`), whose float32 adds made the e4m3 kernel
      spill without a cluster: 1.54x and 1.48x the former cluster rules (which a search had
      found, 1.24-1.27x the bf16 rule then) at B2 H8/4 S4096 causal and B1 H16/8 S8192 full
      on an H200 (``docs/records/benchmarks/fp8``).

    ``split``: the head-dim split of :func:`default_schedule`."""
    d = problem.head_dim
    if d <= 128 and not problem.causal and not problem.windowed and even_tiles(problem, 128,
                                                                                256):
        return Schedule(tile_m=128, tile_n=256, occupancy=1, num_worker_warps=8, exp2=True,
                        approx_div=True, unchecked_loads=True)
    if d > 128 and not problem.windowed:
        if problem.causal:
            return Schedule(tile_m=128, tile_n=128, occupancy=3, num_worker_warps=8,
                            exp2=True, approx_div=True, k_latency=4, v_latency=2,
                            kv_sawtooth=True, unchecked_loads=True, paired_tiles=True, **split)
        return Schedule(tile_m=128, tile_n=64, occupancy=2, num_worker_warps=8, exp2=True,
                        k_transposed=True, v_latency=2, **split)
    return None


def packs_heads(arch: str, problem: Problem, schedule: Schedule) -> bool:
    """Whether the default packs a K/V group's query heads into one tile (``pack_gqa``,
    ``docs/records/benchmarks/varlen/pack-gqa``): on sm_90, for 16-bit inputs whose group a
    tile can hold (:func:`~._launch.packable`),

    - in a packed batch of sequences (``ragged``; they end inside tiles) under a rule of at
      most three CTAs an SM: 1.05-1.34x the same schedule unpacked on six packed batches of
      8-6000-token sequences, groups 4, 8 and 16, D 128, and 1.05-1.11x on six more beside
      FlashAttention-4. The D <= 64 rules' tiles (four CTAs an SM, 64 registers a thread,
      where the packed kernel keeps 96 bytes on the stack) ran 0.87-0.94x packed at four or
      three CTAs an SM on four D 64 batches (1.04x on a fifth), so they stay unpacked; a paged
      cache was not measured;
    - in a call whose queries fill at most half a tile (speculative verification, small
      chunks), at most three CTAs an SM: 1.29-2.30x at 24-40 queries over 4k-8k keys with
      groups of 4 (D 128; 1.00x a multi-query fp16 call), 1.10x at 24 queries (D 64, three
      CTAs an SM, where four ran 0.90x); chunks of 64-256 queries ran 0.94-1.03x packed.

    A group that is not a power of two packs into idle slots where at most one slot in eight
    idles (7 in 8) and, in a packed batch, the keys are at least twice the queries (chunked
    prefill): on an H100 (``docs/records/probes/pack_idle_slots.py``, issue 49 section 66)
    H28/4 chunks took 0.84-1.02x the unpacked time (seven held out, 64-900 queries over
    1500-8000 keys), self-attention batches 1.00-1.06x (three; left unpacked), 32 queries over
    4096 keys 0.81x; groups of 5 took 1.30-1.44x, of 3 and 6 0.99-1.00x (left unpacked)."""
    if generation(arch) != "hopper" or problem.dtype in FP8_DTYPES or problem.page_size:
        return False
    if not packable(problem, schedule.tile_m, idle_slots=True):
        return False
    group, slots = problem.group_size, head_slots(problem.group_size)
    if group != slots:  # idle slots
        if group * 8 < slots * 7 or (
                problem.ragged and problem.seqlen_k < 2 * problem.seqlen_q):
            return False
    if problem.ragged:
        return schedule.occupancy <= 3
    return 2 * problem.seqlen_q <= schedule.tile_m


def default_schedule(arch: str, problem: Problem) -> Schedule:
    """Per-architecture default, used when no tuned schedule is known for a shape: the rules
    of :func:`_rules`; on sm_90 e4m3 inputs accumulate their products in the tensor core's own
    precision (``fast_acc``: 1.02-1.10x on seven Llama, Qwen and Mistral prefills at D 128 on
    an H200, the errors unchanged at 2.0-2.5e-02; at D 256 with the tiles it lets run without
    a cluster, :func:`_hopper_fp8`: ``docs/records/benchmarks/fp8``), and grouped query heads
    share a tile where :func:`packs_heads` says so (at most three CTAs an SM)."""
    schedule = _rules(arch, problem)
    if generation(arch) == "hopper" and problem.dtype in FP8_DTYPES:
        return schedule.replace(fast_acc=True)
    if packs_heads(arch, problem, schedule):
        return schedule.replace(pack_gqa=True, occupancy=min(schedule.occupancy, 3))
    return schedule


def _rules(arch: str, problem: Problem) -> Schedule:
    """The default by decision list, before FP8's accumulation choice.

    sm_90: a decision list by head dim (as the kernel pads it), masking and length, each branch
    the schedule that won where it applies: in the shipped table's tuned rows (H100 searches)
    and in the per-shape sweeps of the held-out *fitting* shapes of issue 18
    (``scripts/lookup_regret.py``, ``docs/lookup.md``). A head dim that is not a power of two
    runs split into two power-of-two parts (``split_d``: 1.00-1.15x the padded kernel on every
    fitting shape with D 72, 80, 96 and 192; D 40 is a tie).

    - D <= 64, causal: 64x64 tiles at occupancy 4, key tiles walked sawtooth, longest query
      tiles first (every shipped D64 causal row: 1.01-1.22x the former 64x128 default).
    - D <= 64, not causal: the same tiles up to 2k keys (ViT, Whisper and Conformer lengths:
      1.08-1.42x the former default); 64x128 at occupancy 3 beyond (every shipped D64 row with
      S >= 2k). A head dim between 32 and 64 (40, 48, 56): 256x64 tiles over a two-CTA
      cluster, persistent (Stable Diffusion's D40: 1.8x the 64x64 tiles; one shape measured).
    - 64 < D <= 128, causal: 64x128 at occupancy 2 with exp2, approximate division and K
      loaded transposed, key tiles walked sawtooth, longest query tiles first (D128 below 4k
      keys: 1.01-1.04x the same without the last two on the three such fitting shapes,
      0.99-1.09x on ten more at S 256 to 3500). Where rows see 4k keys or more (S_q >= 4k, or
      S_k >= 4k bottom-right: chunked prefill), the same 128-row tile split over a cluster of
      two CTAs, longest query tiles first (H100 probe 8: 0.99-1.24x the 64x128 schedule at
      S >= 4k; a 512-query chunk over 4608 keys: 1.07x). A split head dim (72, 80, 96) below
      4k keys: 64x64 tiles at occupancy 3, sawtooth, longest first (the four such fitting
      shapes, D80/D96 at S 300 to 1337: 1.07-1.25x the 64x128 schedule; at S 4096 it loses to
      the cluster, 0.99x).
    - 64 < D <= 128, not causal, lengths multiples of 128: 128x128 tiles, one CTA per SM with
      8 worker warps, persistent (every shipped D128 non-causal row; D72 at S 256 and 1024).
      Other lengths (a ragged last tile): D <= 80, 128x64 tiles at occupancy 2 with 8 worker
      warps, persistent (D72/D80 at S 257, 401, 900, 1025: 1.2-1.7x the 128x128 one); D > 96,
      128x128 at occupancy 3 over a two-CTA cluster (D128 at S 577: 1.13x). D 96 (64 + 32):
      64x128 at occupancy 3 at any length (S 1999, and 1024 queries over 4096 keys: 1.15-1.25x
      the 128x128 one). A packed batch (``ragged``, D > 96) of sequences up to
      :data:`PACKED_SHORT` tokens runs 64x128 at occupancy 2 (key tiles sawtooth up to
      :data:`PACKED_SAWTOOTH`): its sequences end inside tiles
      whatever its bucket's lengths (H200, four packed batches of 16-2048-token sequences, D
      128, H 12-32: 1.09-1.23x the 128x128 tile, the gain falling with length; 1.01-1.11x
      128x128 over a cluster of two; ``docs/records/benchmarks/varlen/issue50``).
    - D > 128: 128x128 with 8 worker warps at occupancy 3 (every shipped D256 key with
      S >= 4k: 1.2-1.36x 64x128), query tiles paired when causal (H100 probe 11) unless rows
      see at most :data:`CAUSAL_UNPAIRED_KEYS` keys (then unpaired, longest first, key tiles
      sawtooth); a full mask over :data:`WIDE_SAWTOOTH_KEYS` keys at D 256 walks its key
      tiles sawtooth.

    FP8 (e4m3) inputs on sm_90 follow their own rules where they were measured to differ
    (:func:`_hopper_fp8`), else the bf16 ones.

    Other architectures get the choices public cuTile attention code reports as good there (not
    measured by this project).

    A sliding window bounds the keys a row sees (:func:`row_keys`): where the rules above go by
    length, they go by that count instead, and on sm_90 and sm_100 a window of at most
    :data:`NARROW_WINDOW` keys runs on 64x64 tiles at D <= 128 (each query tile then visits
    fewer keys its rows do not see; the other architectures' defaults are 64x64 already).
    Neither is measured yet: no windowed shape has been tuned.
    """
    gen = generation(arch)
    fast_math = dict(exp2=True, approx_div=True, k_transposed=True)
    split = dict(split_d=head_dim_parts(problem.head_dim, True)[1] != 0)
    keys = row_keys(problem)
    if (problem.windowed and keys <= NARROW_WINDOW and problem.head_dim <= 128
            and gen in ("hopper", "blackwell")):
        return Schedule(tile_m=64, tile_n=64, occupancy=4 if problem.head_dim <= 64 else 3,
                        kv_sawtooth=True, **fast_math, **split)
    if gen == "hopper":
        d = problem.head_dim
        if problem.dtype in FP8_DTYPES:
            fp8 = _hopper_fp8(problem, split)
            if fp8 is not None:
                return fp8
        if d > 128:
            lo, hi = WIDE_SAWTOOTH_KEYS
            short_causal = (problem.causal and not problem.windowed
                            and keys <= CAUSAL_UNPAIRED_KEYS)
            return Schedule(tile_m=128, tile_n=128, occupancy=3, num_worker_warps=8, exp2=True,
                            k_transposed=True, k_latency=4, v_latency=2,
                            paired_tiles=problem.causal and not short_causal,
                            longest_first=short_causal,
                            kv_sawtooth=short_causal or (
                                not problem.causal and not problem.windowed
                                and not split["split_d"] and lo < keys <= hi),
                            **split)
        small_tiles = dict(tile_m=64, tile_n=64, occupancy=4, exp2=True, approx_div=True,
                           k_latency=2, v_latency=2, kv_sawtooth=True)
        if d <= 64:
            if problem.causal:
                return Schedule(longest_first=True, unchecked_loads=True, **small_tiles,
                                **split)
            if 32 < d < 64:
                return Schedule(tile_m=256, tile_n=64, occupancy=2, num_ctas=2, k_latency=2,
                                persistent=True, **fast_math, **split)
            if keys <= 2048:
                return Schedule(**small_tiles)
            return Schedule(tile_m=64, tile_n=128, occupancy=3, exp2=True, approx_div=True,
                            k_latency=4, v_latency=2, unchecked_loads=True)
        if problem.causal:
            # the keys a query row sees: S_k with bottom-right alignment (chunked prefill), at
            # most the window's width
            seen = problem.seqlen_k if problem.bottom_right else problem.seqlen_q
            if (min(seen, keys) if problem.windowed else seen) >= 4096:
                return Schedule(tile_m=128, tile_n=128, occupancy=2, num_ctas=2,
                                longest_first=True, **fast_math, **split)
            if split["split_d"]:  # 72 and 80 as 64 + 16, 96 as 64 + 32
                return Schedule(tile_m=64, tile_n=64, occupancy=3, kv_sawtooth=True,
                                longest_first=True, **fast_math, **split)
            return Schedule(tile_m=64, tile_n=128, occupancy=2, kv_sawtooth=True,
                            longest_first=True, **fast_math, **split)
        even = even_tiles(problem, 128, 128)
        if problem.ragged and d > 96 and problem.seqlen_q <= PACKED_SHORT:
            return Schedule(tile_m=64, tile_n=128, occupancy=2, exp2=True, approx_div=True,
                            v_latency=4, kv_sawtooth=problem.seqlen_q <= PACKED_SAWTOOTH,
                            **split)
        if 80 < d <= 96:  # two parts, 64 + 32: 64-row tiles
            return Schedule(tile_m=64, tile_n=128, occupancy=3, exp2=True, approx_div=True,
                            k_latency=4, v_latency=2, unchecked_loads=True, **split)
        if even:
            return Schedule(tile_m=128, tile_n=128, occupancy=1, num_worker_warps=8, exp2=True,
                            approx_div=True, v_latency=4, unchecked_loads=True,
                            persistent=True, **split)
        if d <= 80:  # 64 + 16
            return Schedule(tile_m=128, tile_n=64, occupancy=2, num_worker_warps=8,
                            k_latency=4, v_latency=4, kv_sawtooth=True, persistent=True,
                            **fast_math, **split)
        return Schedule(tile_m=128, tile_n=128, occupancy=3, num_ctas=2, kv_sawtooth=True,
                        **fast_math, **split)
    if gen == "blackwell":
        return Schedule(tile_m=128, tile_n=128, occupancy=2, **fast_math)
    # consumer Blackwell, Ada, Ampere: 99-163 KiB of shared memory per SM
    return Schedule(tile_m=64, tile_n=64, occupancy=2 if problem.head_dim <= 128 else 1,
                    **fast_math)
