"""Search spaces: the candidate values of each schedule dimension, per GPU architecture.

A space is data about an architecture (``space_for("sm_90")``), plus static feasibility checks
that run before anything compiles, and the per-architecture default schedule that ``sdpa`` uses
when nothing better is known (``default_schedule(arch, problem)``).
"""

from ._spaces import (
    ARCH_LIMITS,
    SEED,
    ArchLimits,
    SearchSpace,
    default_schedule,
    infeasibility,
    space_for,
)

__all__ = ["ARCH_LIMITS", "SEED", "ArchLimits", "SearchSpace", "default_schedule", "infeasibility",
           "space_for"]
