"""When ``sdpa`` runs the split-KV decode kernels rather than a family of lower priority (the
prefill forward): few query rows, or few rows and too few forward CTAs.

The rule is a measured boundary per GPU generation: ``docs/records/benchmarks/decode/dispatch.md``
(committed in 242186d) holds the H100 measurement, both families timed interleaved over S_q,
S_k, batch and group size by the crossover section of ``scripts/decode_probe.py``. An explicit
schedule picks its own family; the rule only decides calls that leave the schedule to the
lookup.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...core._compile import generation
from ...core._problem import Problem

__all__ = ["DispatchRule", "DISPATCH_RULES", "dispatch_rule"]


@dataclass(frozen=True)
class DispatchRule:
    """Run the decode family when ``S_q <= max_seqlen_q``, or when ``S_q <= sparse_seqlen_q``
    and the forward would launch at most ``sparse_ctas`` CTAs (``B * H_q * ceil(S_q / 64)``:
    too few to stream K/V at full rate, while decode splits the keys over more); else the
    forward."""

    max_seqlen_q: int
    sparse_seqlen_q: int
    sparse_ctas: int

    def takes(self, problem: Problem) -> bool:
        """Whether the decode family runs ``problem``."""
        sq = problem.seqlen_q
        if sq <= self.max_seqlen_q:
            return True
        return sq <= self.sparse_seqlen_q and forward_ctas(problem) <= self.sparse_ctas

    def why(self, arch: str, problem: Problem) -> str:
        return (f"sdpa's dispatch rule for {arch}: decode when S_q <= {self.max_seqlen_q}, or "
                f"S_q <= {self.sparse_seqlen_q} with at most {self.sparse_ctas} forward CTAs; "
                f"here S_q = {problem.seqlen_q}, {forward_ctas(problem)} forward CTAs "
                f"(B*H_q*ceil(S_q/64))")


def forward_ctas(problem: Problem) -> int:
    """The CTAs a prefill forward of 64-row query tiles would launch: ``B * H_q * ceil(S_q /
    64)``."""
    return problem.batch * problem.heads_q * -(-problem.seqlen_q // 64)


#: Per generation; generations without a measurement use Hopper's boundary. Hopper: H100,
#: bf16, D 128, S_k 4k and 32k, S_q 1-128 (docs/records/benchmarks/decode/dispatch.md): decode is
#: 1.0-4.9x the forward for S_q <= 16 at B = 1, 8, 32 with grouped heads, 0.92-1.04x for
#: multi-head B = 4 (on a par); at S_q = 32-64 it wins only with B * H_q <= 32 (1.0-2.6x at
#: B = 1) and loses 0.35-0.67x at B >= 8; at S_q = 128 the forward wins everywhere.
DISPATCH_RULES = {"hopper": DispatchRule(max_seqlen_q=16, sparse_seqlen_q=64, sparse_ctas=66)}


def dispatch_rule(arch: str) -> DispatchRule:
    return DISPATCH_RULES.get(generation(arch), DISPATCH_RULES["hopper"])
