"""The numbers the kernels' arithmetic shares, and the one spelling of an unbounded window
side."""

from __future__ import annotations

import math

__all__ = ["LOG2_E", "NEG_BIG", "UNBOUNDED", "FAR", "bounded", "reach", "head_slots"]

#: log2(e): scores times this go through ``exp2`` (and base-2 log-sum-exps back to base e).
LOG2_E = 1.0 / math.log(2.0)
#: Finite "minus infinity" for a running max: a row whose first visited key tile is fully
#: masked must not compute (-inf) - (-inf).
NEG_BIG = -1.0e30
#: A window side (``window_left`` / ``window_right``, as every kernel receives it) that does
#: not bound the row's keys. A kernel either tests a side with :func:`bounded` or resolves it
#: with :func:`reach`.
UNBOUNDED = -1
#: What an unbounded side reaches, in keys, where a kernel needs a number (the decode split
#: kernel): past any cache the kernels can index (``S_k * D < 2**31``), and small enough that
#: key offsets of that size do not overflow int32.
FAR = 1 << 30


def bounded(side):
    """Whether a window side bounds the row's keys (is not :data:`UNBOUNDED`)."""
    return side > UNBOUNDED


def reach(side, far):
    """How many keys a window side reaches past the row's diagonal: ``side``, or ``far``
    (past every key) where it is :data:`UNBOUNDED`. Plain integer arithmetic: kernels call it
    on scalars, the launchers' tests on Python ints."""
    keys = side
    if side <= UNBOUNDED:
        keys = far
    return keys


def head_slots(heads: int) -> int:
    """The head slots of a tile that holds ``heads`` query heads: the power of two at or above
    ``heads`` (tile shapes are powers of two). Plain Python, for ``ct.static_eval`` too."""
    return 1 << (heads - 1).bit_length()
