"""The backward family's search spaces: candidate values per architecture, static feasibility,
the tiles worth trying for a problem, and an analytic time model for the simulated backend.

The backward pass is two kernels (``tiledattention/kernels/backward/_kernel.py``): ``attention_bwd_dq``
(dQ and the row sums ``delta``; a CTA per query tile, walking key tiles) and
``attention_bwd_dkdv`` (a CTA per key tile, walking query tiles). Their schedules are tuned
jointly (one ``BackwardSchedule``), since the key is the pair's time. ``dq_mode`` searches the
one-pass backward too ("atomic": no dQ kernel; the dK/dV kernel adds dQ into a float32
accumulator), whose points normalise the dQ kernel's fields away.
"""

from __future__ import annotations

import math

from tiledattention import BACKWARD, BackwardSchedule, Problem
from tiledattention.tooling import head_dim_parts, packable

from ._space import FamilySpace, SearchSpace, register_space, smem_infeasibility

__all__ = ["BACKWARD_SPACE", "SPACES", "infeasibility", "model_ms", "restricted",
           "smem_bytes", "tile_caps"]

#: Fields that are tile sizes, with the sequence they tile ("q": S_q, "k": S_k).
_TILE_FIELDS = {"dkdv_tile_n": "k", "dkdv_tile_m": "q", "dq_tile_m": "q", "dq_tile_n": "k"}

_FULL = {
    "dkdv_tile_n": (32, 64, 128),
    "dkdv_tile_m": (16, 32, 64, 128),
    "dkdv_occupancy": (1, 2),
    "dkdv_worker_warps": (None, 8),
    "q_latency": (None, 2, 3, 4),
    "dq_tile_m": (32, 64, 128),
    "dq_tile_n": (32, 64, 128),
    "dq_occupancy": (1, 2, 3, 4),
    "dq_worker_warps": (None, 8),
    "kv_latency": (None, 2, 3, 4),
    "dkdv_splits": (1, 2, 4, 8, 16),
    "dq_heavy_first": (False, True),
    "tile_major": (False, True),
    "dq_mode": ("kernel", "atomic"),
    "split_d": (False, True),
    "dq_pack_gqa": (False, True),
}
# The dimensions the H100 probes behind the sm_90 defaults found to matter
# (scripts/backward_probe.py at 6113995: each kernel's occupancy and worker warps, the dK/dV
# kernel's query tile and Q/dO latency hint, the dQ kernel's query tile; issue 31's
# scripts/backward_parallel_probe.py at c05e939: the dK/dV splits), at values that include
# every default; the key tiles stay at 64, as in every default; both dQ modes; and for a head
# dim of two parts (72, 80, 96, 192) both of its forms; Q/dO loads two and three steps ahead
# (two: the D 256 default since the H200's probe; three: the H100's and the softcap rule's).
# 6144 points at a power-of-two head dim (non-causal keys: 1536; a one-pass point normalises
# the dQ kernel's fields away), twice that at the others; grouped heads whose group a dQ tile
# can hold (``packable``) search the dQ kernel packed and not, twice again.
_COMPACT = {
    "dkdv_tile_m": (64, 128),
    "dkdv_occupancy": (1, 2),
    "dkdv_worker_warps": (None, 8),
    "q_latency": (None, 2, 3),
    "dq_tile_m": (64, 128),
    "dq_occupancy": (1, 2),
    "dq_worker_warps": (None, 8),
    "dkdv_splits": (1, 2, 4, 8),
    "dq_heavy_first": (False, True),
    "tile_major": (False, True),
    "dq_mode": ("kernel", "atomic"),
    "split_d": (False, True),
    "dq_pack_gqa": (False, True),
}
SPACES = {"full": _FULL, "compact": _COMPACT}


def _columns(problem: Problem, schedule: BackwardSchedule) -> int:
    """The head-dim columns the kernels compute: the head dim padded to a power of two, or
    with ``split_d`` its two parts' (``head_dim_parts``)."""
    return sum(head_dim_parts(problem.head_dim, schedule.split_d))


def smem_bytes(problem: Problem, schedule: BackwardSchedule) -> tuple[int, int]:
    """Shared memory (dK/dV kernel, dQ kernel) that one CTA needs at the least: one tile of the
    operand each kernel streams, ``[dkdv_tile_m, D]`` of Q / dO and ``[dq_tile_n, D]`` of K / V,
    in the input dtype (2 bytes).

    A lower bound, on purpose: tileiras picks the pipeline depth (and whether the tiles a CTA
    keeps, K and V or Q and dO, live in registers or shared memory) to fit the SM. Cubins of 22
    schedules compiled for sm_90 and sm_86 (D 64..256, tiles 16..256) used 1.0x to 26x this
    bound (the compiler adds pipeline stages while the SM has room) and always fitted: e.g.
    the dK/dV kernel at D=256 with 128x128 tiles took 162 KiB on sm_90 and 64 KiB on sm_86. A
    resident-plus-pipelined estimate (K and V tiles plus two stages of Q and dO: 384 KiB there)
    would reject schedules that compile and run."""
    d = _columns(problem, schedule)
    return 2 * d * schedule.dkdv_tile_m, 2 * d * schedule.dq_tile_n


def infeasibility(arch: str, problem: Problem, schedule: BackwardSchedule) -> str | None:
    """Why ``schedule`` cannot work for ``problem`` on ``arch`` (static checks), or ``None``."""
    dkdv, dq = smem_bytes(problem, schedule)
    for kernel, need in (("dK/dV kernel", dkdv), ("dQ kernel", dq)):
        found = smem_infeasibility(arch, need)
        if found is not None:
            return f"{kernel}: {found}"
    return None


def tile_caps(problem: Problem) -> dict[str, int]:
    """The largest useful value of each tile field: the tile that ``normalise`` caps it at
    (the next power of two of the sequence it tiles, at least 16)."""
    cap = {"q": max(16, 1 << (problem.seqlen_q - 1).bit_length()),
           "k": max(16, 1 << (problem.seqlen_k - 1).bit_length())}
    return {name: cap[seq] for name, seq in _TILE_FIELDS.items()}


def restricted(space: SearchSpace, problem: Problem) -> SearchSpace:
    """Tiles no larger than ``problem`` needs: a tile past the next power of two of the
    sequence it tiles computes only padding, and ``normalise`` turns it into that cap anyway;
    when every candidate is past it, the cap itself is the one value left. Without a causal
    mask the work orders are not searched; dK/dV splits stop at the walk's length; a head dim
    of one part (a power of two, ``head_dim_parts``) searches no ``split_d``, and a problem
    whose K/V groups no dQ tile can hold (``packable``) no ``dq_pack_gqa``."""
    if head_dim_parts(problem.head_dim, True)[1] == 0 and "split_d" in space.choices:
        space = space.without("split_d")
    if "dq_pack_gqa" in space.choices and not packable(
            problem, max(space.choices.get("dq_tile_m", (space.base.dq_tile_m,)))):
        space = space.without("dq_pack_gqa")
    choices = dict(space.choices)
    for name, cap in tile_caps(problem).items():
        if name in choices:
            choices[name] = tuple(v for v in choices[name] if v <= cap) or (cap,)
    for name in ("dq_heavy_first", "tile_major"):
        if not problem.causal and name in choices:
            choices[name] = (False,)  # work orders only a causal mask has
    if "dkdv_splits" in choices:
        # the split counts normalise keeps at the largest query tile searched, so that every
        # point is its own normal form
        widest = space.base.replace(
            dkdv_tile_m=max(choices.get("dkdv_tile_m", (space.base.dkdv_tile_m,))))
        choices["dkdv_splits"] = tuple(
            v for v in choices["dkdv_splits"]
            if BACKWARD.normalise(problem, widest.replace(dkdv_splits=v)).dkdv_splits == v)
    return SearchSpace(space.arch, choices, space.base, space.infeasibility)


def _space(name: str):
    def build(arch: str) -> SearchSpace:
        """The same candidates on every architecture: tileiras fits each kernel's pipeline to
        the SM's shared memory (``smem_bytes``), and the defaults elsewhere are Hopper's tiles
        (which the space must hold, as the search's first seed); the shared-memory check
        prunes per problem."""
        return SearchSpace(arch, dict(SPACES[name]), BackwardSchedule(), infeasibility)
    return build


# -- simulated time ------------------------------------------------------------------------------

#: Efficiency of (tile the CTA keeps, tile it streams): dK/dV (dkdv_tile_n, dkdv_tile_m) and
#: dQ (dq_tile_m, dq_tile_n); others 0.6.
_DKDV_TILES = {(64, 128): 1.0, (64, 64): 0.95, (128, 64): 0.9, (128, 128): 0.85,
               (64, 32): 0.85, (32, 64): 0.8, (128, 32): 0.8, (32, 128): 0.75, (32, 32): 0.7}
_DQ_TILES = {(128, 64): 1.0, (64, 64): 0.95, (64, 128): 0.9, (128, 128): 0.85,
             (128, 32): 0.85, (64, 32): 0.85, (32, 64): 0.75, (32, 32): 0.7, (32, 128): 0.7}
_SMS = 132
_RATE = 700e12  # FLOP/s of the made-up GPU at efficiency 1
_BANDWIDTH = 3e12  # bytes/s
_KIB = 1024


def _kernel_efficiency(table: dict, kept: int, streamed: int, accumulator_bytes: int,
                       occupancy: int, warps: int | None, latency: int | None) -> float:
    """Shaped like the H100 probe's findings (scripts/backward_probe.py at 6113995): more CTAs
    per SM pay while the float32 accumulators of all of them fit half the register file; 8
    worker warps pay when one CTA's accumulators fill it; past the whole register file they
    spill."""
    eff = table.get((kept, streamed), 0.6)
    if accumulator_bytes > 128 * _KIB:
        eff *= 0.4
    if occupancy > 1:
        fits = accumulator_bytes * occupancy <= 128 * _KIB
        eff *= (1.4 - 0.03 * (occupancy - 2)) if fits else 0.8 - 0.05 * (occupancy - 2)
    if accumulator_bytes >= 128 * _KIB:
        eff *= 1.0 if warps == 8 else 0.3
    elif warps == 8:
        eff *= 0.98
    return eff * {None: 1.0, 2: 1.01, 3: 1.03, 4: 1.02}.get(latency, 0.99)


def _fill(ctas: int) -> float:
    """Share of the SMs busy over the grid's waves."""
    waves = math.ceil(ctas / _SMS)
    return ctas / (waves * _SMS)


def model_ms(problem: Problem, schedule: BackwardSchedule) -> float:
    """A made-up analytic time on an sm_90-like GPU, for the simulated backend: the dQ kernel's
    three matrix products and the dK/dV kernel's four (each of the forward's size; both
    recompute the scores) at 700 TFLOP/s times each kernel's efficiency (tile pair, float32
    accumulators against the register file, occupancy, worker warps, latency hint) and share of
    busy SMs (the dK/dV splits multiply its CTAs), the split partials' traffic at 3 TB/s, 3%
    off the causal dQ kernel run heavy tiles first, plus 3 µs per launch. One-pass
    (``dq_mode="atomic"``): no dQ kernel; the dK/dV kernel's fifth product (dS K) with a
    ``[dkdv_tile_m, D]`` float32 tile more in registers, its reduce-adds of float32 dQ (a tile a
    (query tile, key tile) pair, half of them with a causal mask) at 4x the DRAM bandwidth
    (L2 absorbs the reduce-adds), and
    the delta and scale kernels' row traffic."""
    d = _columns(problem, schedule)
    s = schedule
    # one matrix product of the forward's size, over the columns the kernels compute
    half = problem.flops / 2 * d / problem.head_dim
    one_pass = s.dq_mode == "atomic"
    dkdv_eff = _kernel_efficiency(_DKDV_TILES, s.dkdv_tile_n, s.dkdv_tile_m,
                                  (2 * s.dkdv_tile_n + one_pass * s.dkdv_tile_m) * d * 4,
                                  s.dkdv_occupancy, s.dkdv_worker_warps, s.q_latency)
    dq_eff = _kernel_efficiency(_DQ_TILES, s.dq_tile_m, s.dq_tile_n, s.dq_tile_m * d * 4,
                                s.dq_occupancy, s.dq_worker_warps, s.kv_latency)
    dkdv_ctas = (math.ceil(problem.seqlen_k / s.dkdv_tile_n) * problem.batch
                 * problem.heads_kv * s.dkdv_splits)
    dq_ctas = math.ceil(problem.seqlen_q / s.dq_tile_m) * problem.batch * problem.heads_q
    dkdv_s = (4 + one_pass) * half / (_RATE * dkdv_eff * _fill(dkdv_ctas))
    dq_s = 3 * half / (_RATE * dq_eff * _fill(dq_ctas))
    if problem.causal and s.dq_heavy_first:
        dq_s *= 0.97  # the short query tiles fill the launch's tail
    if problem.causal and s.tile_major:
        dkdv_s *= 0.98  # the longest dK/dV walks of every head start first
    launches = 2
    if one_pass:
        rows = problem.batch * problem.heads_q * problem.seqlen_q * d
        adds = (math.ceil(problem.seqlen_k / s.dkdv_tile_n) * rows * 4
                * (0.5 if problem.causal else 1.0))
        dkdv_s += adds / (4 * _BANDWIDTH)
        dq_s = rows * (2 * 2 + 4 + 4 + 4 + 2) / _BANDWIDTH  # O, dO in; dQ float32 x3; dQ out
        launches += 1
    if s.dkdv_splits > 1:  # float32 partials of dK and dV written, read back, summed
        parts = 2 * s.dkdv_splits * problem.batch * problem.heads_kv * problem.seqlen_k * d * 4
        dkdv_s += 2 * parts / _BANDWIDTH
        launches += 2
    return (dkdv_s + dq_s) * 1e3 + launches * 0.003


BACKWARD_SPACE = register_space(FamilySpace(
    family=BACKWARD.name, spaces={name: _space(name) for name in SPACES},
    restrict=restricted, model_ms=model_ms))
