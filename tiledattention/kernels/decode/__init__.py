"""The split-KV decode family: few query rows against a long K/V cache, the keys split over
CTAs and merged by a combine step (``DECODE`` is the registered :class:`~tiledattention.Family`;
``DispatchRule`` is when ``sdpa`` runs it)."""

from ._compile import compile_decode
from ._dispatch import DISPATCH_RULES, DispatchRule, dispatch_rule
from ._family import DECODE, DecodeFamily
from ._launch import Layout, flat_applies, layout, rows_past_waves
from ._plan import bucket_problem, length_bucket
from ._schedule import DecodeSchedule

__all__ = ["DECODE", "DISPATCH_RULES", "DecodeFamily", "DecodeSchedule", "DispatchRule",
           "Layout", "bucket_problem", "compile_decode", "dispatch_rule", "flat_applies", "layout",
           "length_bucket", "rows_past_waves"]
