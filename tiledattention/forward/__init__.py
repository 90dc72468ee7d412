"""The prefill forward family: FlashAttention-style forward kernel, its schedule and problem."""

from ._compile import compile_schedule
from ._problem import Problem, problem_from_arrays
from ._schedule import Schedule

__all__ = ["Problem", "Schedule", "compile_schedule", "problem_from_arrays"]
