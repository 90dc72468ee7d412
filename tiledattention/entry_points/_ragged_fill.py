"""Zeros for the rows of a packed array that no sequence covers (``tiledattention.entry_points._varlen``).

Packed sequences cover one contiguous run of rows, ``[cu[0], cu[N])``: the kernels write every
row inside it, and the rows before and after it (tokens of no sequence: rare, but then their
outputs and gradients must be zeros, never uninitialised memory) are cleared here. One small
launch whose CTAs walk only those rows: nothing when the sequences cover the array, instead
of a memset of the whole output (which cost ~13% of a 32k-token forward on an H100).
"""

from __future__ import annotations

from typing import Any

from ..core import _aot
from ..core._lazy import lazy_module

ct = lazy_module("cuda.tile", globals(), "ct")

__all__ = ["clear_uncovered_rows", "compile_clear"]

#: rows and columns of one cleared tile, and the CTAs that walk them
TILE_R = 16
TILE_C = 128
CTAS = 132


def clear_uncovered_rows(stream: Any, out: Any, ranges: Any, which: int) -> None:
    """Zeros in the rows of ``out`` (``[T, ...]``, contiguous) outside the run that packed
    sequences cover: ``ranges`` rows ``which`` and ``which + 1`` (0: queries, 2: keys) of the
    int32 ``[4, N]`` range table give the first sequence's start and the last one's end."""
    from ._clear_kernel import clear_outside  # with cuda.tile, on first use

    flat = out.view(out.shape[0], -1)
    _aot.launch(stream, (CTAS,), clear_outside, (flat, ranges, which, TILE_R, TILE_C))


def compile_clear(problem: Any, arch: str) -> None:
    """Compile (only) the clears a packed call of ragged ``problem`` may launch on ``arch``:
    its output's and ``dQ``'s query rows, ``dK``'s and ``dV``'s key rows (``tiledtune aot``
    keeps them, under ``capturing``)."""
    from ..core._compile import array_constraint, export_cubin
    from ._clear_kernel import clear_outside

    p = problem
    ranges = array_constraint("int32", (4, p.batch))
    for which, rows, width in ((0, p.batch * p.seqlen_q, p.heads_q * p.head_dim),
                               (2, p.batch * p.seqlen_k, p.heads_kv * p.head_dim)):
        export_cubin(clear_outside, (array_constraint(p.dtype, (rows, width)), ranges, which,
                                     TILE_R, TILE_C), arch, "clear_outside")
