"""The pairwise-covering case set of the backward GPU test
(``tests/gpu/test_backward_gpu.py::test_gradients_against_fp32_reference_and_torch``), kept
free of CUDA and torch so that ``tests/cpu/test_gpu_case_sets.py`` checks it on any machine."""

from __future__ import annotations

import itertools

LENGTHS = [(1, 257), (17, 17), (17, 1000), (257, 257), (1000, 1000), (1000, 17)]
HEADS = [(4, 4), (8, 2), (8, 1)]  # MHA, GQA 8/2, MQA 8/1
HEAD_DIMS = [40, 64, 96, 128, 256]
CAUSAL = [False, True, "bottom_right"]
DTYPE_NAMES = ["bf16", "fp16"]
_PARAMETERS = (LENGTHS, HEADS, HEAD_DIMS, CAUSAL, DTYPE_NAMES)


def _pairs(row: tuple) -> set:
    return {(i, row[i], j, row[j]) for i, j in itertools.combinations(range(len(row)), 2)}


def pairwise_cases() -> list[tuple]:
    """A deterministic greedy pairwise-covering set over the five parameters: every pair of
    values of any two parameters appears in some case (31 cases instead of 540)."""
    needed = set()
    for row in itertools.product(*_PARAMETERS):
        needed |= _pairs(row)
    rows, covered = [], set()
    candidates = list(itertools.product(*_PARAMETERS))
    while covered != needed:
        best = max(candidates, key=lambda r: len(_pairs(r) - covered))
        rows.append(best)
        covered |= _pairs(best)
    return rows


CASES = pairwise_cases()
