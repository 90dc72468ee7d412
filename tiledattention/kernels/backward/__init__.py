"""The backward-pass family: dQ, dK and dV of attention from dO and the forward's per-row
log-sum-exp (``BACKWARD`` is the registered :class:`~tiledattention.Family`)."""

from ._compile import compile_backward
from ._defaults import OnePassRule, softcap_one_pass_rule
from ._family import BACKWARD, BackwardFamily
from ._schedule import BackwardSchedule

__all__ = ["BACKWARD", "BackwardFamily", "BackwardSchedule", "compile_backward", "OnePassRule",
           "softcap_one_pass_rule"]
