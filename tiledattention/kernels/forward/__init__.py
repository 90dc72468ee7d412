"""The prefill forward family: a FlashAttention-style forward kernel and its typed schedule
(``FORWARD`` is the registered :class:`~tiledattention.Family`; the problem it keys on is the
core's :class:`~tiledattention.Problem`)."""

from ...core._problem import head_dim_parts
from ._compile import compile_schedule
from ._family import FORWARD, ForwardFamily
from ._launch import packable
from ._schedule import Schedule

__all__ = ["FORWARD", "ForwardFamily", "Schedule", "compile_schedule", "head_dim_parts",
           "packable"]
