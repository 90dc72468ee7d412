"""The prefill forward as a kernel family: its problem key, schedule, default, normalisation,
lookup metric, compile-only build and GPU test case."""

from __future__ import annotations

from typing import Any, Callable, Mapping

from .._compile import CompileResult
from .._family import Case, Family, register_family
from .._reference import attention_reference
from ._compile import compile_schedule
from ._defaults import default_schedule
from ._launch import default_scale, grid_for, kernel_args, kernel_for, normalise
from ._problem import Problem
from ._schedule import Schedule

__all__ = ["FORWARD", "ForwardFamily", "ForwardCase"]

#: relative L2 error a correct schedule may have against the float32 reference
TOLERANCE = {"bf16": 1e-2, "fp16": 5e-3}


class ForwardCase(Case):
    """Random q, k, v (seed 1234) on one GPU, the float32 reference and an output buffer."""

    def __init__(self, problem: Problem, device_index: int) -> None:
        import torch

        from .._device import device_info

        self.problem = problem
        self.device_index = device_index
        self.sm_count = device_info(device_index).sm_count
        torch.cuda.set_device(device_index)
        dtype = torch.bfloat16 if problem.dtype == "bf16" else torch.float16
        gen = torch.Generator(device="cuda").manual_seed(1234)

        def rand(heads: int, seqlen: int) -> torch.Tensor:
            return torch.randn(problem.batch, heads, seqlen, problem.head_dim, dtype=dtype,
                               device="cuda", generator=gen)

        self.q = rand(problem.heads_q, problem.seqlen_q)
        self.k = rand(problem.heads_kv, problem.seqlen_k)
        self.v = rand(problem.heads_kv, problem.seqlen_k)
        self.reference = attention_reference(self.q, self.k, self.v, problem)
        self.out = torch.empty_like(self.q)

    def launcher(self, schedule: Schedule) -> Callable[[], None]:
        import cuda.tile as ct
        import torch

        problem = self.problem
        schedule = normalise(problem, schedule)
        grid = grid_for(problem, schedule, self.sm_count)
        kernel = kernel_for(schedule)
        args = kernel_args(self.q, self.k, self.v, self.out, problem, schedule,
                           default_scale(problem))

        def run() -> None:
            ct.launch(torch.cuda.current_stream(), grid, kernel, args)

        return run

    def error(self, run: Callable[[], None]) -> float:
        import torch

        self.out.fill_(float("nan"))
        run()
        diff = torch.linalg.vector_norm(self.out.float() - self.reference)
        return (diff / torch.linalg.vector_norm(self.reference)).item()

    def baselines(self) -> Mapping[str, Callable[[], Any]]:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        q, k, v, problem = self.q, self.k, self.v, self.problem
        gqa = problem.group_size > 1

        mask: dict[str, Any] = {"is_causal": problem.causal}
        if problem.bottom_right:
            from torch.nn.attention.bias import causal_lower_right

            mask = {"attn_mask": causal_lower_right(problem.seqlen_q, problem.seqlen_k)}

        def backend(which: SDPBackend) -> Callable[[], Any]:
            def run() -> Any:
                with sdpa_kernel(which):
                    return torch.nn.functional.scaled_dot_product_attention(
                        q, k, v, enable_gqa=gqa, **mask)
            return run

        return {"torch-cudnn": backend(SDPBackend.CUDNN_ATTENTION),
                "torch-flash": backend(SDPBackend.FLASH_ATTENTION)}


class ForwardFamily(Family):
    """FlashAttention-style prefill forward (``tiledattention.sdpa``)."""

    name = "forward"
    problem_type = Problem
    schedule_type = Schedule
    template_modules = ("tiledattention.forward._kernel", "tiledattention.forward._launch")
    bucket_fields = ("causal", "dtype", "head_dim")
    seed_across = ("dtype",)
    # same GQA group size; distance |log2 S_q - log2 S_q'| + |log2 S_k - log2 S_k'| +
    # 0.5·|log2(B·H_q) - log2(B'·H_q')|: sequence length moves the best tiles more than batch
    # or heads do
    match_ratios = (("heads_q", "heads_kv"),)
    distance_terms = ((("seqlen_q",), 1.0), (("seqlen_k",), 1.0), (("batch", "heads_q"), 0.5))

    def default_schedule(self, arch: str, problem: Problem) -> Schedule:
        return default_schedule(arch, problem)

    def normalise(self, problem: Problem, schedule: Schedule) -> Schedule:
        return normalise(problem, schedule)

    def flops(self, problem: Problem) -> float:
        return problem.flops

    def compile(self, problem: Problem, schedule: Schedule, arch: str) -> CompileResult:
        return compile_schedule(problem, normalise(problem, schedule), arch)

    def case(self, problem: Problem, device_index: int) -> ForwardCase:
        return ForwardCase(problem, device_index)

    def tolerance(self, problem: Problem) -> float:
        return TOLERANCE[problem.dtype]


FORWARD = register_family(ForwardFamily())
