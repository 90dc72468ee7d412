"""Split-KV decode as a kernel family: problem key (the forward's :class:`Problem`), schedule,
default, normalisation, lookup metric, compile-only build and GPU test case."""

from __future__ import annotations

from typing import Any, Callable, Mapping

from .._compile import CompileResult
from .._family import Case, Family, register_family
from ..forward._problem import Problem
from ._compile import compile_decode
from ._defaults import default_decode_schedule
from ._launch import launch, launches, normalise, partial_shapes
from ._schedule import DecodeSchedule

__all__ = ["DECODE", "DecodeFamily", "DecodeCase", "torch_baselines"]

#: relative L2 error a correct schedule may have against the float32 reference
TOLERANCE = {"bf16": 1e-2, "fp16": 5e-3}


def torch_baselines(q: Any, k: Any, v: Any, problem: Problem) -> dict[str, Callable[[], Any]]:
    """torch SDPA with one backend pinned per entry, for ``problem``'s masking: top-left causal
    as ``is_causal``, bottom-right as the ``causal_lower_right`` bias (which torch runs on its
    flash and efficient backends only); grouped-query heads through ``enable_gqa``."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kwargs: dict[str, Any] = {"enable_gqa": problem.heads_q != problem.heads_kv}
    if problem.bottom_right:
        from torch.nn.attention.bias import causal_lower_right

        kwargs["attn_mask"] = causal_lower_right(problem.seqlen_q, problem.seqlen_k)
    else:
        kwargs["is_causal"] = problem.causal

    def backend(which: SDPBackend) -> Callable[[], Any]:
        def run() -> Any:
            with sdpa_kernel(which):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, **kwargs)
        return run

    return {"torch-cudnn": backend(SDPBackend.CUDNN_ATTENTION),
            "torch-flash": backend(SDPBackend.FLASH_ATTENTION),
            "torch-efficient": backend(SDPBackend.EFFICIENT_ATTENTION)}


class DecodeCase(Case):
    """Random q, k, v (seed 1234) on one GPU, the float32 reference and an output buffer."""

    def __init__(self, problem: Problem, device_index: int) -> None:
        import torch

        from .._reference import attention_reference

        self.problem = problem
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

    def launcher(self, schedule: DecodeSchedule) -> Callable[[], None]:
        import torch

        plan = launches(self.problem, schedule, None)
        partials = None
        if plan.combine is not None:
            opart, lse = partial_shapes(plan)
            partials = (torch.empty(opart, dtype=torch.float32, device=self.q.device),
                        torch.empty(lse, dtype=torch.float32, device=self.q.device))
        offset = self.problem.causal_offset

        def run() -> None:
            launch(torch.cuda.current_stream(), plan, self.q, self.k, self.v, self.out, offset,
                   partials)

        return run

    def error(self, run: Callable[[], None]) -> float:
        import torch

        self.out.fill_(float("nan"))
        run()
        diff = torch.linalg.vector_norm(self.out.float() - self.reference)
        return (diff / torch.linalg.vector_norm(self.reference)).item()

    def baselines(self) -> Mapping[str, Callable[[], Any]]:
        return torch_baselines(self.q, self.k, self.v, self.problem)


class DecodeFamily(Family):
    """Split-KV (flash-decoding) attention for few query rows against a long K/V cache."""

    name = "decode"
    problem_type = Problem
    schedule_type = DecodeSchedule
    template_modules = ("tiledattention.decode._kernel", "tiledattention.decode._launch")
    bucket_fields = ("causal", "dtype", "head_dim")
    seed_across = ("dtype",)
    # same GQA group (it decides the packing); distance |log2 S_k - log2 S_k'| +
    # |log2(B·H_kv) - log2(B'·H_kv')| (CTAs per split decide the best split count) +
    # |log2 S_q - log2 S_q'|
    match_ratios = (("heads_q", "heads_kv"),)
    distance_terms = ((("seqlen_k",), 1.0), (("batch", "heads_kv"), 1.0), (("seqlen_q",), 1.0))

    def default_schedule(self, arch: str, problem: Problem) -> DecodeSchedule:
        return default_decode_schedule(arch, problem)

    def normalise(self, problem: Problem, schedule: DecodeSchedule) -> DecodeSchedule:
        return normalise(problem, schedule)

    def flops(self, problem: Problem) -> float:
        return problem.flops

    def compile(self, problem: Problem, schedule: DecodeSchedule, arch: str) -> CompileResult:
        return compile_decode(problem, schedule, arch)

    def case(self, problem: Problem, device_index: int) -> DecodeCase:
        return DecodeCase(problem, device_index)

    def tolerance(self, problem: Problem) -> float:
        return TOLERANCE[problem.dtype]


DECODE = register_family(DecodeFamily())
