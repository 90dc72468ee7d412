"""The prefill forward family: a FlashAttention-style forward kernel, its problem key and its
typed schedule (``FORWARD`` is the registered :class:`~tiledattention.Family`)."""

from ._compile import compile_schedule
from ._family import FORWARD, ForwardFamily
from ._problem import (BOTTOM_RIGHT, DTYPES, SUPPORTED_HEAD_DIMS, TOP_LEFT, Problem,
                       head_dim_parts, problem_from_arrays)
from ._schedule import Schedule

__all__ = ["BOTTOM_RIGHT", "DTYPES", "TOP_LEFT", "FORWARD", "ForwardFamily", "Problem",
           "SUPPORTED_HEAD_DIMS", "Schedule", "compile_schedule", "head_dim_parts",
           "problem_from_arrays"]
