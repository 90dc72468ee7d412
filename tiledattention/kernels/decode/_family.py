"""Split-KV decode as a kernel family: problem key (the forward's :class:`Problem`), schedule,
default, normalisation, lookup metric, compile-only build and GPU test case."""

from __future__ import annotations

import math
from typing import Callable

from ...core import _plans as hot
from ...core._call import Call
from ...core._compile import CompileResult
from ...core._device import DeviceInfo
from ...core._case import AttentionCase, PagedCase, paged_flops
from ...core._family import Family, check_arch_dtype, register_family
from ...kernel_core import MODULES as KERNEL_CORE_MODULES
from ...core._problem import Problem
from ...errors import UnsupportedProblemError
from ._compile import compile_decode
from ._defaults import default_decode_schedule
from ._dispatch import dispatch_rule
from ._launch import launch, launches, new_scratch, normalise, order_grid
from ._plan import DecodePlan, bucket_problem, decode_plan, decode_plan_key, flat_sms
from ._schedule import DecodeSchedule

__all__ = ["DECODE", "DecodeFamily", "DecodeCase"]


def _case_launcher(problem: Problem, schedule: DecodeSchedule, q, k, v, out, offset: int,
                   **arrays) -> Callable[[], None]:
    """A case's launch of ``schedule``: the plan and its float32 partial buffers built once,
    the split (and combine) kernels enqueued per call; ``arrays``: ``launch``'s ``sinks``,
    ``ranges``, ``pages``."""
    import torch

    plan = launches(problem, schedule, None, sms=flat_sms(schedule, q.device.index))
    partials = new_scratch(plan, lambda shape: torch.empty(shape, dtype=torch.float32,
                                                           device=q.device))

    def run() -> None:
        launch(torch.cuda.current_stream(), plan, q, k, v, out, offset, partials, **arrays)

    return run


class DecodeCase(AttentionCase):
    """The decode kernels' GPU case: the shared inputs and reference, this family's launcher
    (an FP8 cache's with its K and V descale factors)."""

    def launcher(self, schedule: DecodeSchedule) -> Callable[[], None]:
        descales = None if self.descales is None else self.descales[1:]
        return _case_launcher(self.problem, schedule, self.q, self.k, self.v, self.out,
                              self.problem.causal_offset, sinks=self.sinks, descales=descales)


class PagedDecodeCase(PagedCase):
    """A paged problem's case (``PagedCase``: caches of mixed lengths in shuffled pages) with
    this family's launcher: the kernels read the pages in place (an FP8 cache's with its K and
    V descale factors)."""

    def launcher(self, schedule: DecodeSchedule) -> Callable[[], None]:
        descales = None if self.descales is None else self.descales[1:]
        return _case_launcher(self.problem, schedule, self.q, self.k_pages, self.v_pages,
                              self.out, 0, ranges=self.seqused, pages=self.table,
                              descales=descales)


class DecodeFamily(Family):
    """Split-KV (flash-decoding) attention for few query rows against a long K/V cache."""

    name = "decode"
    problem_type = Problem
    schedule_type = DecodeSchedule
    # the input dtypes the kernels take, each with the relative L2 error against the float32
    # reference a correct schedule may have on it: the family's one list of its dtypes
    tolerances = {"bf16": 1e-2, "fp16": 5e-3}
    # an FP8 K/V cache under bf16 / fp16 queries: K and V widened per tile (the error is the
    # queries' dtype's against the dequantised cache)
    kv_dtypes = ("e4m3",)
    template_modules = ("tiledattention.kernels.decode._kernel",
                        "tiledattention.kernels.decode._flat_kernel",
                        "tiledattention.kernels.decode._flat",
                        "tiledattention.kernels.decode._launch", *KERNEL_CORE_MODULES)
    bucket_fields = ("causal", "dtype", "head_dim")
    seed_across = ("dtype",)
    # same GQA group (it decides the packing); distance |log2 S_k - log2 S_k'| +
    # |log2(B·H_kv) - log2(B'·H_kv')| (CTAs per split decide the best split count) +
    # |log2 S_q - log2 S_q'|
    match_ratios = (("heads_q", "heads_kv"),)
    distance_terms = ((("seqlen_k",), 1.0), (("batch", "heads_kv"), 1.0), (("seqlen_q",), 1.0))
    # A row transfers (``Family.transfer_refusal``) only to the same B·H_kv (its split count
    # was chosen for that many CTAs per split) and query rows (they decide the packed tile),
    # as far as its splits' and tiles' padding allows (issue 29: rows of another batch or head
    # count ran 0.87-0.95x cuDNN where the neighbouring keys ran 0.98-1.0x), and to caches at
    # most twice or half its own (a row tuned at 2048 keys ran B4 H8/1 over 16249 at 0.74x the
    # default, over 7000-9000 at 0.85-0.87x; with this limit 0.96-1.02x, and 0.91-1.16x on the
    # calls still within it: docs/records/benchmarks/decode/nearest-rows.md)
    transfer_limits = ((("batch", "heads_kv"), 0.0), (("seqlen_q",), 0.0), (("seqlen_k",), 1.0))
    padding_terms = (("seqlen_k", "tile_n", "splits"),)
    # a paged or ragged row answers only for its own bucket's longest cache: it was tuned on a
    # mix of caches up to that length, and its split count misfits shorter ones (an H200 row
    # of B32 at 16k, 12 splits, ran a B32 step over 4k caches at 0.82x contiguous decode, where
    # the default ran 0.97x)
    ragged_exact = {"seqlen_k": "longest cache"}

    def default_schedule(self, arch: str, problem: Problem) -> DecodeSchedule:
        return self._default(arch, problem, device_name="")

    def device_default(self, device: DeviceInfo, problem: Problem) -> DecodeSchedule:
        """The architecture's rules for the device's name and its own SMs (an H20's 78, an
        RTX 5090's 170), where known."""
        return self._default(device.arch, problem, device.name, device.sm_count)

    @staticmethod
    def _default(arch: str, problem: Problem, device_name: str,
                 sms: int = 0) -> DecodeSchedule:
        _check_ragged(problem)
        check_arch_dtype(arch, problem)
        return default_decode_schedule(arch, problem, device_name, sms)

    def normalise(self, problem: Problem, schedule: DecodeSchedule) -> DecodeSchedule:
        return normalise(problem, schedule)

    def flops(self, problem: Problem) -> float:
        # a paged bucket: its case's caches of mixed lengths, the valid keys only
        return paged_flops(problem) if problem.page_size else problem.flops

    def compile(self, problem: Problem, schedule: DecodeSchedule, arch: str) -> CompileResult:
        _check_ragged(problem)
        check_arch_dtype(arch, problem)
        return compile_decode(problem, schedule, arch)

    def launch_ctas(self, problem: Problem, schedule: DecodeSchedule,
                    sms: int) -> tuple[int, ...]:
        """The split kernel's CTAs, then the merge's (more than one split) and the order's (a
        longest-first batch), or a flat walk's wave and its merge: :meth:`compile`'s order."""
        plan = launches(problem, schedule, None, sms=sms)
        if plan.flat is not None:
            grids = [(plan.flat.ctas, 1, 1), plan.flat.merge_grid]
        else:
            grids = [plan.split_grid] + [plan.combine_grid] * (plan.combine is not None)
            grids += [order_grid(plan.order_entries)] * (plan.order_entries > 0)
        return tuple(math.prod(grid) for grid in grids)

    def case(self, problem: Problem, device_index: int) -> DecodeCase | PagedDecodeCase:
        _check_ragged(problem)
        if problem.page_size:
            return PagedDecodeCase(problem, device_index)
        if problem.ragged:
            raise UnsupportedProblemError(
                f"the decode family has no tuner case for a padded ragged batch yet; got "
                f"{problem.describe()}: its default schedule runs it")
        return DecodeCase(problem, device_index)

    def fp8_plan(self, call: Call, schedule: DecodeSchedule, device_index: int, q, k, v,
                 out) -> DecodePlan:
        """:meth:`Family.fp8_plan` of an FP8 cache (``kv_dtype``) under 16-bit queries: the
        plan of the call's band of cache lengths (as ``sdpa``'s), whose split kernel widens
        each key and value tile; its runs take the k and v factors of ``descales``."""
        _check_ragged(call.problem)
        hot.bind_torch()
        return decode_plan(call, schedule, device_index).for_torch(q, out, k, v)

    # sdpa asks decode first: its measured rule (``DispatchRule``) takes few query rows
    serves = ("sdpa",)
    dispatch_priority = 10

    # its split kernel reads a paged cache (decode steps over a serving engine's pages)
    reads_pages = True
    tunes_pages = True  # PagedDecodeCase

    def takes(self, arch: str, problem: Problem) -> bool:
        return _ragged_refusal(problem) is None and dispatch_rule(arch).takes(problem)

    def why_taken(self, arch: str, problem: Problem) -> str:
        return dispatch_rule(arch).why(arch, problem)

    def plan_problem(self, problem: Problem) -> Problem:
        return bucket_problem(problem)  # one plan (and lookup) per band of cache lengths

    def plan(self, call: Call, schedule: DecodeSchedule, device_index: int) -> DecodePlan:
        """A plan kept for the problem's band of cache lengths: built from the caller's own
        alignment and window (``Call``), which may bind at a longer cache of the band where
        the problem's canonical form dropped them."""
        _check_ragged(call.problem)
        return decode_plan(call, schedule, device_index)

    def plan_key(self, signature: tuple, k, v) -> tuple:
        return decode_plan_key(signature, k, v)


def _ragged_refusal(problem: Problem) -> str | None:
    """Why the split-KV kernels cannot run a ragged ``problem``, or ``None``. They take a
    padded batch's per-entry ranges (``sdpa(ranges=)``) with the queries the last positions of
    each entry's keys: bottom-right, or no mask at all."""
    if problem.ragged and (problem.causal or problem.windowed) and not problem.bottom_right:
        return (f"the decode family aligns a ragged batch's mask bottom-right only; got "
                f"{problem.describe()}: the forward family runs it (--kernel forward)")
    return None


def _check_ragged(problem: Problem) -> None:
    why = _ragged_refusal(problem)
    if why is not None:
        raise UnsupportedProblemError(why)


DECODE = register_family(DecodeFamily())
