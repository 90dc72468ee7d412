"""The backward pass as a kernel family: problem key (the forward's :class:`Problem`), schedule,
default, normalisation, lookup metric, compile-only build and GPU test case."""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

from ...core._case import AttentionCase, RaggedCase, ragged_flops, torch_sdpa_kwargs
from ...core import _aot
from ...core._compile import CompileResult
from ...core._device import DeviceInfo
from ...core._family import Family, register_family
from ...kernel_core import MODULES as KERNEL_CORE_MODULES
from ...core._reference import attention_reference
from ...core._problem import Problem, default_scale
from ._compile import compile_backward, compile_prologue
from ._defaults import default_backward_schedule, deterministic_backward_schedule
from ._launch import (Launches, argument_tails, launch, launch_ragged, launches,
                      normalise, one_pass_grids, ragged_parts_shape, row_stat_shape)
from ._schedule import BackwardSchedule

__all__ = ["BACKWARD", "BackwardFamily", "BackwardCase", "relative_errors"]

#: the backward's matrix products over the forward's (FlashAttention's count: 5 products of
#: the forward's size, against 2)
BACKWARD_FLOP_RATIO = 2.5


def relative_errors(grads: tuple[Any, ...], reference: tuple[Any, ...]) -> tuple[float, ...]:
    """Relative L2 error of each gradient against its float32 reference (``nan`` when the
    gradient is not finite)."""
    import torch

    return tuple((torch.linalg.vector_norm(g.float() - r) / torch.linalg.vector_norm(r)).item()
                 for g, r in zip(grads, reference))


def _deterministic_asked() -> bool:
    """Whether torch is set to use deterministic algorithms only."""
    import torch

    return torch.are_deterministic_algorithms_enabled()


def allocate_scratch(plan: Launches, device: Any) -> dict[str, Any]:
    """The float32 buffers (torch, on ``device``) a launch of ``plan`` needs besides the
    gradients (``plan.scratch``): none without dK/dV splits."""
    import torch

    return {name: torch.empty(shape, dtype=torch.float32, device=device)
            for name, shape in plan.scratch.items()}


def ragged_parts(plan: Launches, k: Any) -> tuple[Any, Any] | None:
    """A ragged launch's zeroed float32 partials of dK and dV (``launch_ragged``'s ``parts``,
    shaped ``ragged_parts_shape``) for a plan with dK/dV splits, else None."""
    import torch

    shape = ragged_parts_shape(plan, k)
    if shape is None:
        return None
    return tuple(torch.zeros(shape, dtype=torch.float32, device=k.device) for _ in range(2))


def ragged_accumulator(plan: Launches, q: Any) -> Any:
    """A ragged launch's float32 dQ accumulator (``launch_ragged``'s ``dq_accum``): a
    contiguous tensor shaped like ``q`` (the ``[B, H_q, S, D]`` view the kernels take) for a
    one-pass plan, else None."""
    import torch

    return (torch.empty(tuple(q.shape), dtype=torch.float32, device=q.device)
            if plan.one_pass else None)


def _grad_out_and_forward(case: Any, arrays: tuple, lse: Any, **extra: Any) -> None:
    """A backward case's dO (seed 4321, like ``case.q``), scale, and the forward's output and
    log-sum-exp from the registered forward family (its default schedule) on ``arrays`` (q, k,
    v, out as the kernels take them) into ``lse``; ``extra``: the forward's keywords."""
    import torch

    from ...core._device import device_info
    from ...core._dispatch import choose_family

    problem = case.problem
    gen = torch.Generator(device="cuda").manual_seed(4321)
    case.grad_out = torch.randn(case.q.shape, dtype=case.q.dtype, device="cuda", generator=gen)
    case.scale = default_scale(problem)
    arch = device_info(case.device_index).arch
    forward = choose_family(arch, problem, "sdpa_with_lse")  # the registered forward
    forward.forward_with_lse(torch.cuda.current_stream(), *arrays, lse, problem,
                             forward.default_schedule(arch, problem), case.scale,
                             case.device_index, **extra)


def _poisoned_error(run: Callable[[], None], grads: tuple, reference: tuple) -> float:
    """A backward case's error: ``grads`` NaN-poisoned, ``run`` writes them, the largest
    relative error of the three against ``reference``."""
    for g in grads:
        g.fill_(float("nan"))
    run()
    return max(relative_errors(grads, reference))


class BackwardCase(AttentionCase):
    """Random q, k, v and dO of ``problem`` (and its sink logits); the forward's output and
    log-sum-exp from this project's forward kernel (its default schedule); float32 reference
    gradients by autograd through the float32 reference (window, softcap and sinks applied
    there); gradient buffers."""

    def __init__(self, problem: Problem, device_index: int) -> None:
        import torch

        super().__init__(problem, device_index)
        store = torch.empty(row_stat_shape(problem), dtype=torch.float32, device="cuda")
        self.lse = store[:, :, :problem.seqlen_q]
        _grad_out_and_forward(self, (self.q, self.k, self.v, self.out), self.lse,
                              sinks=self.sinks)
        self.delta = torch.empty_like(store)[:, :, :problem.seqlen_q]
        leaves = [x.detach().float().requires_grad_() for x in (self.q, self.k, self.v)]
        with torch.enable_grad():
            ref_out = attention_reference(*leaves, problem, self.scale, sinks=self.sinks)
            self.reference_grads = torch.autograd.grad(ref_out, leaves, self.grad_out.float())
        self.grads = tuple(torch.empty_like(x) for x in (self.q, self.k, self.v))

    def launcher(self, schedule: BackwardSchedule) -> Callable[[], None]:
        import torch

        plan = launches(self.problem, schedule, self.scale)
        scratch = allocate_scratch(plan, self.q.device)

        def run() -> None:
            launch(torch.cuda.current_stream(), plan, self.q, self.k, self.v, self.out,
                   self.grad_out, self.lse, self.delta, *self.grads, scratch)

        return run

    def error(self, run: Callable[[], None]) -> float:
        return _poisoned_error(run, self.grads, self.reference_grads)

    def baselines(self) -> Mapping[str, Callable[[], Any]]:
        """torch's cuDNN and flash backends' backward (their forward runs once, untimed, when a
        baseline is first called); for a window, its efficient backend with the materialised
        mask (as the forward's case); none for a softcap or sinks (torch's SDPA has
        neither)."""
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        if self.problem.softcap > 0 or self.problem.sinks:
            return {}
        kwargs = torch_sdpa_kwargs(self.problem)
        leaves = [x.detach().requires_grad_() for x in (self.q, self.k, self.v)]

        def backend(which: SDPBackend) -> Callable[[], Any]:
            graph: list[Any] = []

            def run() -> Any:
                if not graph:
                    with sdpa_kernel(which), torch.enable_grad():
                        q, k, v = leaves
                        if self.problem.windowed:  # transformers' repeat_kv (see the forward)
                            k = k.repeat_interleave(self.problem.group_size, 1)
                            v = v.repeat_interleave(self.problem.group_size, 1)
                        graph.append(torch.nn.functional.scaled_dot_product_attention(
                            q, k, v, **kwargs))
                return torch.autograd.grad(graph[0], leaves, self.grad_out, retain_graph=True)
            return run

        if self.problem.windowed:
            kwargs.pop("enable_gqa", None)
            return {"torch-efficient-mask": backend(SDPBackend.EFFICIENT_ATTENTION)}
        return {"torch-cudnn": backend(SDPBackend.CUDNN_ATTENTION),
                "torch-flash": backend(SDPBackend.FLASH_ATTENTION)}


class RaggedBackwardCase(RaggedCase):
    """The backward's case of a ragged problem: packed sequences (``RaggedCase``), dO, the
    ragged forward's output and log-sum-exp (the forward family's default schedule), float32
    reference gradients by autograd through the per-sequence reference, gradient buffers."""

    def __init__(self, problem: Problem, device_index: int) -> None:
        import torch

        from ...core._ragged import packed_row_stat
        from ...core._reference import varlen_reference

        super().__init__(problem, device_index)
        self.lse, self.delta = (packed_row_stat(problem.heads_q, self.q.shape[0], "cuda")
                                for _ in range(2))
        view = self.view
        _grad_out_and_forward(self, tuple(view(x) for x in (self.q, self.k, self.v, self.out)),
                              self.lse, ragged=self.layout)
        leaves = [x.detach().float().requires_grad_() for x in (self.q, self.k, self.v)]
        with torch.enable_grad():
            ref_out = varlen_reference(*leaves, self.cu_seq_q, self.cu_seq_k,
                                       causal=problem.causal,
                                       bottom_right=problem.bottom_right, scale=self.scale,
                                       window=(problem.window_left, problem.window_right))
            self.reference_grads = torch.autograd.grad(ref_out, leaves, self.grad_out.float())
        self.grads = tuple(torch.empty_like(x) for x in (self.q, self.k, self.v))

    def launcher(self, schedule: BackwardSchedule) -> Callable[[], None]:
        import torch

        plan = launches(self.problem, schedule, self.scale)
        view, layout = self.view, self.layout
        args = [view(x) for x in (self.q, self.k, self.v, self.out, self.grad_out)]
        grads = [view(g) for g in self.grads]
        accum = ragged_accumulator(plan, args[0])

        def run() -> None:
            launch_ragged(torch.cuda.current_stream(), plan, *args, self.lse, self.delta,
                          *grads, layout.ranges, layout.longest_q, layout.longest_k,
                          packed=True, dq_accum=accum, parts=ragged_parts(plan, args[1]))

        return run

    def error(self, run: Callable[[], None]) -> float:
        return _poisoned_error(run, self.grads, self.reference_grads)


class BackwardFamily(Family):
    """The attention backward pass: dQ, dK and dV from dO and the forward's log-sum-exp."""

    name = "backward"
    problem_type = Problem
    schedule_type = BackwardSchedule
    # the input dtypes the kernels take, each with the relative L2 error (the largest of dQ's,
    # dK's and dV's) against the float32 reference a correct schedule may have on it: the
    # family's one list of its dtypes
    tolerances = {"bf16": 2e-2, "fp16": 1e-2}
    template_modules = ("tiledattention.kernels.backward._kernel",
                        "tiledattention.kernels.backward._launch", *KERNEL_CORE_MODULES)
    bucket_fields = ("causal", "dtype", "head_dim")
    seed_across = ("dtype",)
    # the forward's metric: same GQA group; |log2 S_q - log2 S_q'| + |log2 S_k - log2 S_k'| +
    # 0.5·|log2(B·H_q) - log2(B'·H_q')|
    match_ratios = (("heads_q", "heads_kv"),)
    distance_terms = ((("seqlen_q",), 1.0), (("seqlen_k",), 1.0), (("batch", "heads_q"), 0.5))
    # the forward's transfer rule, over the grids of the dQ kernel (query tiles) and the dK/dV
    # kernel (key tiles)
    transfer_limits = ((("batch", "heads_q"), 1.0),)
    padding_terms = (("seqlen_q", "dq_tile_m", None), ("seqlen_k", "dkdv_tile_n", None))

    def default_schedule(self, arch: str, problem: Problem) -> BackwardSchedule:
        self.check_pages(problem)
        return default_backward_schedule(arch, problem)

    def device_default(self, device: DeviceInfo, problem: Problem) -> BackwardSchedule:
        """The architecture's default, its dK/dV waves counted on the device's own SMs."""
        self.check_pages(problem)
        return default_backward_schedule(device.arch, problem, device.sm_count)

    def normalise(self, problem: Problem, schedule: BackwardSchedule) -> BackwardSchedule:
        return normalise(problem, schedule)

    def deterministic_schedule(self, arch: str, problem: Problem,
                               schedule: BackwardSchedule) -> BackwardSchedule:
        """A one-pass schedule (``dq_mode="atomic"``) gives way to the two-kernel default
        (:func:`~tiledattention.kernels.backward._defaults.deterministic_backward_schedule`)."""
        return deterministic_backward_schedule(arch, problem, schedule)

    def determinism(self, problem: Problem, schedule: BackwardSchedule) -> str:
        if normalise(problem, schedule).dq_mode == "atomic":
            return ("dq_mode atomic: one pass, each (query tile, key tile) pair's dQ share "
                    "added into a float32 accumulator by a bulk reduce-add, in no fixed order "
                    "(dQ may differ in its last bits run to run); a deterministic run "
                    "(torch.use_deterministic_algorithms(True), or sdpa_backward's "
                    "deterministic=True) computes dQ with the dQ kernel instead")
        why = (" (a ragged batch runs no one-pass backward)" if problem.ragged
               and schedule.dq_mode == "atomic" else "")
        return ("dq_mode kernel: dQ by a kernel of its own, dK/dV partials added in a fixed "
                f"order: bitwise reproducible run to run{why}")

    def flops(self, problem: Problem) -> float:
        return BACKWARD_FLOP_RATIO * (ragged_flops(problem) if problem.ragged else problem.flops)

    def compile(self, problem: Problem, schedule: BackwardSchedule, arch: str) -> CompileResult:
        self.check_pages(problem)
        return compile_backward(problem, schedule, arch)

    def launch_ctas(self, problem: Problem, schedule: BackwardSchedule,
                    sms: int) -> tuple[int, ...] | None:
        """The dK/dV kernel's CTAs, then the dQ kernel's (or one-pass, the delta and dQ-scale
        kernels'), then the partials' sum's (each of its two launches): :meth:`compile`'s
        order; ``None`` for a ragged problem, whose call sizes its grids."""
        if problem.ragged:
            return None
        plan = launches(problem, schedule, default_scale(problem))
        grids = [plan.dkdv_grid]
        grids += (one_pass_grids(problem.seqlen_q, problem.batch, problem.heads_q)
                  if plan.one_pass else [plan.dq_grid])
        grids += [plan.sum_grid] * (plan.splits > 1)
        return tuple(math.prod(grid) for grid in grids)

    def compile_launchable(self, problem: Problem, schedule: BackwardSchedule,
                           arch: str) -> None:
        """The call's kernels and, for a ragged problem, those that walk work tables and the
        prologue that fills the tables (of query tiles and of key tiles) and clears a packed
        call's uncovered rows."""
        self.compile(problem, schedule, arch)
        if problem.ragged:
            s = normalise(problem, schedule)
            compile_backward(problem, s, arch, work_table=True)
            compile_prologue(problem, s, arch)

    def case(self, problem: Problem, device_index: int) -> BackwardCase | RaggedBackwardCase:
        self.check_pages(problem)
        if problem.ragged:
            return RaggedBackwardCase(problem, device_index)
        return BackwardCase(problem, device_index)

    serves = ("sdpa_backward",)

    def prepare_backward(self, problem: Problem, schedule: BackwardSchedule,
                         scale: float) -> Callable[..., None]:
        """:meth:`Family.prepare_backward`: the plan's launches made once (a one-pass schedule
        asks each call whether torch wants deterministic algorithms: :meth:`backward`)."""
        if schedule.dq_mode == "atomic" or problem.ragged:
            return super().prepare_backward(problem, schedule, scale)
        plan = launches(problem, schedule, scale)
        if plan.splits > 1:  # float32 partials each call, and their sums
            def run(stream, q, k, v, out, grad_out, lse, delta, grads) -> None:
                launch(stream, plan, q, k, v, out, grad_out, lse, delta, *grads,
                       allocate_scratch(plan, q.device))
            return run
        # what launch() enqueues, its argument tuples' constant tails built here: a warm call
        # runs no checks and no scratch dict (the kept call validated its arrays)
        dq_tail, dkdv_tail = argument_tails(plan)
        dq_grid, dkdv_grid, dq_kernel, dkdv_kernel = (plan.dq_grid, plan.dkdv_grid, plan.dq,
                                                      plan.dkdv)
        enqueue = _aot.launch

        def run_unsplit(stream, q, k, v, out, grad_out, lse, delta, grads) -> None:
            dq, dk, dv = grads
            enqueue(stream, dq_grid, dq_kernel, (q, k, v, out, grad_out, lse, delta, dq, *dq_tail))
            enqueue(stream, dkdv_grid, dkdv_kernel,
                    (q, k, v, grad_out, lse, delta, dk, dv, *dkdv_tail))
        return run_unsplit

    def backward(self, stream, problem: Problem, schedule: BackwardSchedule, scale: float, q, k,
                 v, out, grad_out, lse, delta, grads, sinks=None, ragged=None) -> None:
        """:meth:`Family.backward`. ``sinks`` is not read: the forward's ``lse`` holds the
        sinks' term, which is all the kernels need (the caller computes the sinks' own
        gradient). ``ragged``: the call's ``RaggedLayout`` when ``problem.ragged``
        (:func:`~tiledattention.kernels.backward._launch.launch_ragged`: rows and keys outside
        every sequence are not written, but for a one-pass schedule's dQ rows: zeros). Under
        ``torch.use_deterministic_algorithms(True)`` a one-pass schedule runs its
        :meth:`deterministic_schedule`."""
        if schedule.dq_mode == "atomic" and _deterministic_asked():
            from ...core._device import device_info

            schedule = self.deterministic_schedule(device_info(q.device.index).arch, problem,
                                                   schedule)
        plan = launches(problem, schedule, scale)
        if ragged is not None:
            launch_ragged(stream, plan, q, k, v, out, grad_out, lse, delta, *grads,
                          ragged.ranges, ragged.longest_q, ragged.longest_k,
                          packed=ragged.packed, dq_accum=ragged_accumulator(plan, q),
                          parts=ragged_parts(plan, k))
            return
        launch(stream, plan, q, k, v, out, grad_out, lse, delta, *grads,
               allocate_scratch(plan, q.device))


BACKWARD = register_family(BackwardFamily())
