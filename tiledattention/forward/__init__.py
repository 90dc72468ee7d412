"""The prefill forward family: a FlashAttention-style forward kernel, its problem key and its
typed schedule (``FORWARD`` is the registered :class:`~tiledattention.Family`)."""

from ._compile import compile_schedule
from ._family import FORWARD, ForwardFamily
from ._problem import DTYPES, SUPPORTED_HEAD_DIMS, Problem, problem_from_arrays
from ._schedule import Schedule
from ._sdpa import sdpa

__all__ = ["DTYPES", "FORWARD", "ForwardFamily", "Problem", "SUPPORTED_HEAD_DIMS", "Schedule",
           "compile_schedule", "problem_from_arrays", "sdpa"]
