"""The split-KV decode family: few query rows against a long K/V cache, the keys split over
CTAs and merged by a combine step (``DECODE`` is the registered :class:`~tiledattention.Family`)."""

from ._compile import compile_decode
from ._family import DECODE, DecodeFamily
from ._launch import Layout, layout
from ._schedule import DecodeSchedule

__all__ = ["DECODE", "DecodeFamily", "DecodeSchedule", "Layout", "compile_decode", "layout"]
