"""Which registered family serves a call: the families that serve the call's operation
(``Family.serves``), asked in decreasing ``dispatch_priority``; the first that accepts the
problem (``Family.accepts``: a dtype it declares, then its own ``takes``) runs it. An explicit
schedule picks the family whose schedule type it is.
Nothing here names a family: each registers its own predicate (the decode family's is its
measured ``DispatchRule``)."""

from __future__ import annotations

from typing import Any

from ._family import Family, serving
from ..errors import InputTypeError, UnsupportedOperationError

__all__ = ["choose_family", "family_for_schedule", "explain_choice"]


def _asked(arch: str, problem: Any, operation: str) -> list[Family]:
    """The families serving ``operation`` in the order they are asked, up to and including the
    first that takes ``problem`` (the chosen one, last)."""
    asked = []
    for family in serving(operation):
        asked.append(family)
        if family.accepts(arch, problem):
            return asked
    why = "; ".join(family.why_accepted(arch, problem) for family in asked)
    raise UnsupportedOperationError(f"no registered kernel family serves {operation} for "
                                    f"{problem.describe()} on {arch}" + (f": {why}" if why else ""))


def choose_family(arch: str, problem: Any, operation: str = "sdpa") -> Family:
    """The family that runs ``operation`` ("sdpa", "sdpa_with_lse", "sdpa_backward") for
    ``problem`` on ``arch`` when the schedule is left to the lookup."""
    return _asked(arch, problem, operation)[-1]


def family_for_schedule(schedule: Any, operation: str = "sdpa") -> Family:
    """The family serving ``operation`` whose schedule type ``schedule`` is; an
    :class:`InputTypeError` naming the accepted types otherwise."""
    families = serving(operation)
    for family in families:
        if isinstance(schedule, family.schedule_type):
            return family
    accepted = ", ".join(f"a tiledattention.{f.schedule_type.__name__}" for f in families)
    raise InputTypeError(f"schedule must be {accepted} or None; got {type(schedule).__name__}")


def explain_choice(arch: str, problem: Any, operation: str = "sdpa") -> tuple[Family, str]:
    """``choose_family``'s answer and why, in words: each family asked until it, with its
    reason (``Family.why_accepted``: a dtype it does not declare, or its ``why_taken``)."""
    asked = _asked(arch, problem, operation)
    return asked[-1], "; ".join(family.why_accepted(arch, problem) for family in asked)
