"""The case sets of the GPU correctness tests, checked without a GPU (they were in
``tests/gpu/``, whose every test is skipped on a machine without CUDA): each covers every pair of
values of any two of its factors."""

from __future__ import annotations

import itertools

from ..backward_cases import _PARAMETERS
from ..backward_cases import CASES as BACKWARD_CASES
from ..backward_cases import _pairs as backward_pairs
from ..decode_cases import CASES as DECODE_CASES
from ..decode_cases import FACTORS, _feasible, all_pairs
from ..decode_cases import _pairs as decode_pairs


def test_decode_case_set_covers_every_pair():
    """Every pair of values of any two factors is in some case, every pair is feasible at all
    (none was dropped for memory), and every case fits the memory bound."""
    covered = set().union(*(decode_pairs(c) for c in DECODE_CASES))
    names = list(FACTORS)
    for a, b in itertools.combinations(names, 2):
        for x, y in itertools.product(FACTORS[a], FACTORS[b]):
            assert (a, x, b, y) in covered, f"{a}={x}, {b}={y} in no case"
    assert all(_feasible(c) for c in DECODE_CASES)
    assert len(DECODE_CASES) == len(set(DECODE_CASES)) and len(DECODE_CASES) <= 45, \
        len(DECODE_CASES)
    # deterministic (xdist collects the GPU test per worker)
    assert DECODE_CASES == all_pairs(FACTORS, _feasible)
    # the corners the brief names are there
    assert any(c.sk == 131072 and c.d == 256 for c in DECODE_CASES)
    assert any(c.align == "bottom_right" and c.sq > c.sk for c in DECODE_CASES)
    # and each is a valid problem
    assert all(c.problem().dtype == c.dtype for c in DECODE_CASES)


def test_backward_case_set_covers_every_pair():
    needed = set()
    for row in itertools.product(*_PARAMETERS):
        needed |= backward_pairs(row)
    covered = set().union(*(backward_pairs(c) for c in BACKWARD_CASES))
    assert covered == needed
    assert len(BACKWARD_CASES) <= 40
