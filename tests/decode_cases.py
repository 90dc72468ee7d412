"""The pairwise-covering case set of the decode family's GPU correctness test
(``tests/gpu/test_decode_gpu.py::test_pairwise_correctness``), kept free of CUDA and torch so that
``tests/cpu/test_gpu_case_sets.py`` checks it on any machine."""

from __future__ import annotations

import itertools
from typing import NamedTuple

from tiledattention import Problem

#: (H_q, H_kv) per GQA group: H_kv 1-2 so the 128k-key cases stay small; "mqa16" is MQA with 16
#: query heads (g32 has one K/V head as well, with twice the query heads)
HEADS = {"g1": (2, 2), "g4": (8, 2), "g8": (16, 2), "g32": (32, 1), "mqa16": (16, 1)}
FACTORS = {
    "sq": (1, 2, 7, 16, 64),
    "sk": (1, 100, 4097, 32768, 131072),
    "heads": tuple(HEADS),
    "d": (64, 128, 256, 80),
    "align": ("none", "top_left", "bottom_right"),
    "dtype": ("bf16", "fp16"),
}
#: Peak memory the float32 reference (``attention_reference``: K/V repeated to H_q heads in
#: float32, scores and their softmax copies) may need for one case; 8 tests run side by side.
MAX_REFERENCE_BYTES = 3 << 30


class Combo(NamedTuple):
    sq: int
    sk: int
    heads: str
    d: int
    align: str
    dtype: str

    @property
    def batch(self) -> int:
        return 2 if self.sk <= 4097 else 1  # batch indexing where the cache is short

    def problem(self) -> Problem:
        hq, hkv = HEADS[self.heads]
        return Problem(batch=self.batch, heads_q=hq, heads_kv=hkv, seqlen_q=self.sq,
                       seqlen_k=self.sk, head_dim=self.d, dtype=self.dtype,
                       causal=self.align != "none", bottom_right=self.align == "bottom_right")

    @property
    def id(self) -> str:
        return f"sq{self.sq}-sk{self.sk}-{self.heads}-d{self.d}-{self.align}-{self.dtype}"


def reference_bytes(c: Combo) -> int:
    hq, hkv = HEADS[c.heads]
    kv_f32 = hq * c.sk * c.d * 4  # one of k, v repeated to H_q heads in float32
    scores = hq * c.sq * c.sk * 4
    inputs = 2 * c.batch * hkv * c.sk * c.d * 2
    return (3 if c.batch > 1 else 2) * kv_f32 + 4 * scores + inputs


def _feasible(c: Combo) -> bool:
    return reference_bytes(c) <= MAX_REFERENCE_BYTES


def _pairs(c: Combo) -> frozenset:
    return frozenset((a, getattr(c, a), b, getattr(c, b))
                     for a, b in itertools.combinations(Combo._fields, 2))


def all_pairs(factors: dict, feasible) -> list[Combo]:
    """Greedy all-pairs: repeatedly take the first feasible combination (in product order) that
    covers the most pairs not covered yet, until every pair that occurs in some feasible
    combination is covered. Deterministic."""
    combos = [Combo(*values) for values in itertools.product(*factors.values())]
    combos = [(c, _pairs(c)) for c in combos if feasible(c)]
    uncovered = set().union(*(pairs for _, pairs in combos))
    chosen = []
    while uncovered:
        best, pairs = max(combos, key=lambda item: len(item[1] & uncovered))
        chosen.append(best)
        uncovered -= pairs
    return chosen


CASES = all_pairs(FACTORS, _feasible)
