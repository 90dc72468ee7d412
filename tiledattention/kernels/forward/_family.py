"""The prefill forward as a kernel family: its problem key, schedule, default, normalisation,
lookup metric, compile-only build and GPU test case."""

from __future__ import annotations

from typing import Callable

from ...core import _device
from ...core import _aot
from ...core._case import AttentionCase, RaggedCase, ragged_flops
from ...core._call import Call
from ...core._compile import CompileResult
from ...core._dtypes import FP8_DTYPES, element, torch_dtype
from ...core._family import Family, check_arch_dtype, register_family
from ...kernel_core import MODULES as KERNEL_CORE_MODULES
from ...core._problem import Problem, default_scale, page_tile
from ...core._ragged import without_pages
from ...core._work_table import compile_work_table
from ...errors import UnsupportedProblemError
from ._compile import compile_schedule
from ._defaults import PAGE_PARTS_MAX_ROWS, PAGE_PARTS_MIN_KEYS, default_schedule
from ._launch import (grid_for, kernel_args, kernel_for, launch_ragged, launch_with_lse,
                      normalise, query_rows)
from ._plan import ForwardPlan, Fp8ForwardPlan, dense_launch, forward_plan, fp8_forward_plan
from ._schedule import Schedule

__all__ = ["FORWARD", "ForwardFamily", "ForwardCase"]


class ForwardCase(AttentionCase):
    """The forward kernel's GPU case: the shared inputs and reference, this family's launcher."""

    def __init__(self, problem: Problem, device_index: int) -> None:
        super().__init__(problem, device_index)
        self.sm_count = _device.device_info(device_index).sm_count

    def launcher(self, schedule: Schedule) -> Callable[[], None]:
        import torch

        problem = self.problem
        schedule = normalise(problem, schedule)
        grid = grid_for(problem, schedule, self.sm_count)
        if self.descales is not None:  # FP8: the call's plan (its V transpose is timed too)
            plan = fp8_forward_plan(problem, schedule, self.device_index, None, self.out.dtype)
            return lambda: plan.run(None, self.q, self.k, self.v, self.device_index, self.out,
                                    self.sinks, self.descales)
        kernel = kernel_for(schedule)
        args = kernel_args(self.q, self.k, self.v, self.out, problem, schedule,
                           default_scale(problem), sinks=self.sinks)
        return lambda: _aot.launch(torch.cuda.current_stream(), grid, kernel, args)


class RaggedForwardCase(RaggedCase):
    """The forward's case of a ragged problem: packed sequences (``RaggedCase``)."""

    def launcher(self, schedule: Schedule) -> Callable[[], None]:
        import torch

        problem, layout = self.problem, self.layout
        schedule = normalise(problem, schedule)
        q, k, v, out = (self.view(x) for x in (self.q, self.k, self.v, self.out))

        def run() -> None:
            launch_ragged(torch.cuda.current_stream(), q, k, v, out, layout.ranges, problem,
                          schedule, default_scale(problem), layout.longest_q, packed=True)

        return run


class ForwardFamily(Family):
    """FlashAttention-style prefill forward (``tiledattention.sdpa``)."""

    name = "forward"
    problem_type = Problem
    schedule_type = Schedule
    # the input dtypes the kernels take, each with the relative L2 error against the float32
    # reference a correct schedule may have: the family's one list of its dtypes
    # (e4m3: against the dequantised inputs; P·V in e4m3 measured 2.1-2.5e-2 on an H200,
    # docs/records/benchmarks/fp8)
    tolerances = {"bf16": 1e-2, "fp16": 5e-3, "e4m3": 5e-2}
    template_modules = ("tiledattention.kernels.forward._kernel",
                        "tiledattention.kernels.forward._launch", *KERNEL_CORE_MODULES)
    bucket_fields = ("causal", "dtype", "head_dim")
    seed_across = ("dtype",)
    # same GQA group size; distance |log2 S_q - log2 S_q'| + |log2 S_k - log2 S_k'| +
    # 0.5·|log2(B·H_q) - log2(B'·H_q')|: length moves the best tiles more than batch or heads
    match_ratios = (("heads_q", "heads_kv"),)
    distance_terms = ((("seqlen_q",), 1.0), (("seqlen_k",), 1.0), (("batch", "heads_q"), 0.5))
    # Farther than this, the default answers: on 18 held-out fitting shapes (issue 18; H100,
    # docs/lookup.md) rows within distance 1 never lost to the default, rows at 1.5-4
    # were up to 1.17x slower, and at 5 up to 1.65x (a 16k-token row for 257 tokens).
    nearest_limit = 1.0
    # A row transfers (``Family.transfer_refusal``) to a problem of at most twice or half its
    # B·H_q (the grid's blocks a tile row) and only as far as its tiles' padding allows: on
    # shapes differing from shipped keys in batch and heads, nearest rows within distance 1
    # ran up to 1.43x the default (issue 29).
    transfer_limits = ((("batch", "heads_q"), 1.0),)
    padding_terms = (("seqlen_q", "tile_m", None), ("seqlen_k", "tile_n", None))

    def fp8_refusal(self, problem: Problem) -> str | None:
        """Why this family cannot run ``problem``'s FP8 inputs, or ``None``: the FP8 kernel
        reads dense ``[B, H, S, D]`` arrays only (an architecture without FP8 is refused for
        every family: ``check_arch_dtype``)."""
        if problem.dtype in FP8_DTYPES and problem.ragged:
            return (f"FP8 attention runs dense [B, H, S, D] calls only (no packed, padded or "
                    f"paged sequences); got {problem.describe()}")
        return None

    def check_fp8(self, arch: str, problem: Problem) -> None:
        """Raise an :class:`UnsupportedProblemError` where ``arch`` has no FP8 or the FP8
        kernel cannot run ``problem`` (:meth:`fp8_refusal`)."""
        check_arch_dtype(arch, problem)
        why = self.fp8_refusal(problem)
        if why is not None:
            raise UnsupportedProblemError(why)

    def takes(self, arch: str, problem: Problem) -> bool:
        return super().takes(arch, problem) and self.fp8_refusal(problem) is None

    def default_schedule(self, arch: str, problem: Problem) -> Schedule:
        self.check_pages(problem)
        self.check_fp8(arch, problem)
        return default_schedule(arch, problem)

    def normalise(self, problem: Problem, schedule: Schedule) -> Schedule:
        return normalise(problem, schedule)

    def flops(self, problem: Problem) -> float:
        return ragged_flops(problem) if problem.ragged else problem.flops

    def compile(self, problem: Problem, schedule: Schedule, arch: str) -> CompileResult:
        self.check_pages(problem)
        self.check_fp8(arch, problem)
        return compile_schedule(problem, normalise(problem, schedule), arch)

    def launch_ctas(self, problem: Problem, schedule: Schedule, sms: int) -> tuple[int] | None:
        """Blocks of ``num_ctas`` CTAs; ragged calls size their grids."""
        if problem.ragged:
            return None
        x, y, z = grid_for(problem, normalise(problem, schedule), sms)
        return (x * y * z * schedule.num_ctas,)

    def compile_launchable(self, problem: Problem, schedule: Schedule, arch: str) -> None:
        """The call's kernel, the one that also stores the log-sum-exp (the forward of a
        training call) and, for a ragged problem, the walk of a work table and the kernel
        that fills one."""
        self.check_pages(problem)
        self.check_fp8(arch, problem)
        schedule = normalise(problem, schedule)
        if problem.dtype in FP8_DTYPES:  # no training: no log-sum-exp
            compile_schedule(problem, schedule, arch)
            return
        compile_schedule(problem, schedule, arch, store_lse=None, work_table=None)
        if problem.ragged:
            compile_work_table(problem.batch, query_rows(problem, schedule), arch)

    def case(self, problem: Problem, device_index: int) -> ForwardCase | RaggedForwardCase:
        if problem.page_size and not self.tunes_pages:
            raise UnsupportedProblemError(f"the forward family has no tuner case for a paged "
                                          f"cache yet; got {problem.describe()}: its default "
                                          f"schedule runs it")
        if problem.ragged:
            return RaggedForwardCase(problem, device_index)
        return ForwardCase(problem, device_index)

    # the prefill forward takes every attention call no family of higher priority takes
    serves = ("sdpa", "sdpa_with_lse")
    # its ragged kernel reads a paged cache (chunked prefill, long query runs)
    reads_pages = True

    def reads_pages_with(self, problem: Problem, schedule: Schedule) -> bool:
        """In place where one page holds a whole key tile, or half of one of at least
        ``PAGE_PARTS_MIN_KEYS`` keys for query runs of at most ``PAGE_PARTS_MAX_ROWS`` rows a
        K/V group (the tile walks as two parts of a page's keys); else the call copies the
        pages first (tiles of more or smaller parts ran slower than the copy on an H100)."""
        tile = page_tile(problem.page_size)
        rows = problem.seqlen_q * problem.group_size
        return tile >= schedule.tile_n or (2 * tile == schedule.tile_n
                                           and tile >= PAGE_PARTS_MIN_KEYS
                                           and rows <= PAGE_PARTS_MAX_ROWS)

    def paged_lookup(self, bucket: Problem, shape: Problem) -> Problem:
        """The bucket without pages (the one the gathered call looks up,
        :func:`~tiledattention.core._ragged.without_pages`): pages change where keys lie, not
        the work, and the forward tunes no paged rows."""
        return without_pages(bucket)

    def why_taken(self, arch: str, problem: Problem) -> str:
        return (self.fp8_refusal(problem)
                or "the prefill forward runs every call no other family takes")

    def plan(self, call: Call, schedule: Schedule, device_index: int) -> ForwardPlan:
        # a forward plan is kept per K/V shape: the problem's own mask is the call's
        return forward_plan(call.problem, schedule, device_index, call.scale)

    def forward_with_lse(self, stream, q, k, v, out, lse, problem: Problem, schedule: Schedule,
                         scale: float, device_index: int, sinks=None, ragged=None) -> None:
        """:meth:`Family.forward_with_lse`; ``sinks``: the float32 ``[H_q]`` sink logits when
        ``problem.sinks`` (the stored log-sum-exp then includes them); ``ragged``: the call's
        ``RaggedLayout`` when ``problem.ragged``."""
        schedule = normalise(problem, schedule)
        if ragged is not None:
            launch_ragged(stream, q, k, v, out, ragged.ranges, problem, schedule, scale,
                          ragged.longest_q, packed=ragged.packed, lse=lse, sinks=sinks,
                          pages=ragged.pages, table=ragged.table)
            return
        launch_with_lse(stream, q, k, v, out, lse, problem, schedule, scale,
                        _device.device_info(device_index).sm_count, sinks=sinks)

    def prepare_with_lse(self, problem: Problem, schedule: Schedule, scale: float,
                         device_index: int) -> Callable[..., None]:
        """:meth:`Family.prepare_with_lse`: the launch's arguments prepared once
        (:func:`~._plan.dense_launch`), each call's arrays put in their places."""
        prepared = dense_launch(problem, normalise(problem, schedule), float(scale),
                                _device.device_info(device_index).sm_count,
                                sinks=problem.sinks)

        def run(stream, q, k, v, out, lse, sinks) -> None:
            prepared.run(stream, {"Q": q, "K": k, "V": v, "Out": out, "Lse": lse,
                                  "Sinks": sinks})
        return run

    def fp8_plan(self, call: Call, schedule: Schedule, device_index: int, q, k, v,
                 out) -> Fp8ForwardPlan:
        """:meth:`Family.fp8_plan` of e4m3 q, k and v (the output bf16): each run transposes
        the values into a ``[B, H_kv, D, S_k]`` copy first, the layout e4m3 ``P·V`` reads."""
        problem = call.problem
        self.check_fp8(_device.device_info(device_index).arch, problem)
        return fp8_forward_plan(problem, schedule, device_index, call.scale,
                                torch_dtype(element(problem.dtype).output_name))


FORWARD = register_family(ForwardFamily())
