"""One attention call as a family's launch plan receives it (``Family.plan``): the call's
:class:`~tiledattention.Problem`, with its variant (window, softcap, sinks, ragged ranges,
pages) in the problem's fields, and what the problem's canonical form leaves out but a plan
kept for more than one problem needs.

A problem is canonical at its own lengths: bottom-right alignment with ``S_q == S_k`` is
top-left, and a window side that binds no key at these lengths is unbounded. A plan kept for a
band of problems (the decode family's, one per band of cache lengths) also serves longer calls,
where that alignment or that side binds, so it is built from the mask the caller gave
(``bottom_right``, ``window``), which equals the problem's wherever the problem is all the plan
serves. The launch-time arrays of a variant (sink logits, ranges, a block table) are not part
of it: they are each launch's arguments (``Plan.run``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._problem import Problem, causal_flags

__all__ = ["Call"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Call:
    """``problem`` (the key its schedule is looked up for), ``scale`` (the softmax scale;
    ``None``: ``1 / sqrt(D)``), ``bottom_right`` (the caller's causal alignment) and
    ``window`` (the caller's ``(left, right)``, ``-1`` unbounded), before the canonical form."""

    problem: Problem
    scale: float | None = None
    bottom_right: bool = False
    window: tuple[int, int] = (-1, -1)

    @classmethod
    def of(cls, problem: Problem, scale: float | None = None, causal: Any = None,
           window: Any = None) -> "Call":
        """The call of ``problem`` with the caller's validated ``causal=`` and ``window=``
        arguments (``None``: the problem's own alignment and window)."""
        bottom_right = problem.bottom_right or (causal is not None and causal_flags(causal)[1])
        sides = ((problem.window_left, problem.window_right) if window is None
                 else (int(window[0]), int(window[1])))
        return cls(problem=problem, scale=scale, bottom_right=bottom_right, window=sides)
