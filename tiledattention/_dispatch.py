"""Which kernel family ``sdpa`` runs for a problem: the split-KV decode kernels for few query
rows, the prefill forward otherwise.

The rule is a measured boundary per GPU generation (``docs/benchmarks/decode/dispatch.md``:
``scripts/dispatch_rule.py`` times both families over S_q, S_k, batch and group size and prints
the boundary). An explicit schedule picks its own family; the rule only decides calls that
leave the schedule to the lookup.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._compile import generation
from .decode import DECODE
from .forward import FORWARD
from .forward._problem import Problem

__all__ = ["DispatchRule", "DISPATCH_RULES", "dispatch_rule", "choose_family"]


@dataclass(frozen=True)
class DispatchRule:
    """Run the decode family when ``S_q <= max_seqlen_q``, else the forward."""

    max_seqlen_q: int

    def family_for(self, problem: Problem):
        return DECODE if problem.seqlen_q <= self.max_seqlen_q else FORWARD


#: Per generation; generations without a measurement use Hopper's boundary.
DISPATCH_RULES = {"hopper": DispatchRule(max_seqlen_q=16)}


def dispatch_rule(arch: str) -> DispatchRule:
    return DISPATCH_RULES.get(generation(arch), DISPATCH_RULES["hopper"])


def choose_family(arch: str, problem: Problem):
    """The family ``sdpa`` runs ``problem`` with on ``arch``."""
    return dispatch_rule(arch).family_for(problem)
