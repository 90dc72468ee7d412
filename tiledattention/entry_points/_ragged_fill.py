"""Zeros for the rows of a packed array that no sequence covers (``tiledattention.entry_points._varlen``).

Packed sequences cover one contiguous run of rows, ``[cu[0], cu[N])``: the kernels write every
row inside it, and the rows before and after it (tokens of no sequence: rare, but then their
outputs and gradients must be zeros, never uninitialised memory) are cleared: a forward's
output here, a backward's gradients in the backward's prologue
(``tiledattention.core._work_kernel.backward_prologue``). One small launch whose CTAs walk only
those rows: nothing when the sequences cover the array, instead of a memset of the whole output
(which cost ~13% of a 32k-token forward on an H100).
"""

from __future__ import annotations

from typing import Any

from ..core import _aot
from ..core._problem import padded_head_dim
from ..core._work_table import CLEAR_TILE_ROWS

__all__ = ["clear_uncovered_rows", "compile_clear"]

#: the CTAs that walk the cleared tiles
CTAS = 132


def clear_uncovered_rows(stream: Any, out: Any, ranges: Any, which: int) -> None:
    """Zeros in the rows of ``out`` (the ``[1, H, T, D]`` view of a packed ``[T, H, D]``
    array the kernels take) outside the run that packed sequences cover: ``ranges`` rows
    ``which`` and ``which + 1`` (0: queries, 2: keys) of the int32 ``[4, N]`` range table give
    the first sequence's start and the last one's end."""
    from ..core._work_kernel import clear_outside  # with cuda.tile, on first use

    _aot.launch(stream, (CTAS,), clear_outside,
                (out, ranges, which, CLEAR_TILE_ROWS, padded_head_dim(out.shape[3])))


def compile_clear(problem: Any, arch: str) -> None:
    """Compile (only) the clear a packed forward of ragged ``problem`` launches on ``arch``:
    its output's query rows (the backward's clears run in its prologue, which the backward
    family compiles; ``tiledtune aot`` keeps it, under ``capturing``)."""
    from ..core._compile import array_constraint, attention_constraints, export_cubin
    from ..core._work_kernel import clear_outside

    q_like, _ = attention_constraints(problem, True)
    export_cubin(clear_outside, (q_like, array_constraint("int32", (4, problem.batch)), 0,
                                 CLEAR_TILE_ROWS, padded_head_dim(problem.head_dim)),
                 arch, "clear_outside")
