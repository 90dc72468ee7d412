"""The contenders of ``tiledtune bench`` and the float32 reference they are checked against.

A :class:`Contender` turns inputs and a grid point into a :class:`Prepared` call; nothing here
times anything or touches the GPU at import (torch and tiledattention's launcher are imported
where they are used).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any, Callable

from ._grid import CONTENDERS, BenchPoint

__all__ = ["Contender", "Prepared", "make_contenders", "reference_attention"]


@dataclass(frozen=True)
class Prepared:
    """A contender ready to run at one point: ``fn()`` returns the output; ``context`` wraps
    both the check and the timing (e.g. pins torch's SDPA backend)."""

    fn: Callable[[], Any]
    context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    schedule: str = ""
    lookup_source: str = ""
    lookup_detail: str = ""


@dataclass(frozen=True)
class Contender:
    """``prepare(q, k, v, point, arch)`` -> :class:`Prepared`; ``score_bytes(point)`` -> bytes
    of S×S intermediates it materialises (0: none), checked against the memory budget."""

    name: str
    prepare: Callable[..., Prepared]
    score_bytes: Callable[[BenchPoint], int] = lambda point: 0


def _score_elements(point: BenchPoint) -> int:
    return point.batch * point.heads * point.seqlen * point.seqlen


def _tiledattention(q, k, v, point: BenchPoint, arch: str) -> Prepared:
    from tiledattention import explain, sdpa

    resolution = explain(q, k, v, point.causal)
    schedule = resolution.schedule
    # pass the explained schedule explicitly, so the row's schedule is the one that ran
    return Prepared(lambda: sdpa(q, k, v, point.causal, schedule=schedule),
                    schedule=schedule.describe(), lookup_source=resolution.source,
                    lookup_detail=resolution.detail)


def _tiledattention_default(q, k, v, point: BenchPoint, arch: str) -> Prepared:
    from tiledattention import FORWARD, sdpa

    schedule = FORWARD.default_schedule(arch, point.problem)
    return Prepared(lambda: sdpa(q, k, v, point.causal, schedule=schedule),
                    schedule=schedule.describe(), lookup_source="forced",
                    lookup_detail=f"FORWARD.default_schedule({arch!r})")


def _torch_sdpa(backend: str | None) -> Callable[..., Prepared]:
    def prepare(q, k, v, point: BenchPoint, arch: str) -> Prepared:
        import torch.nn.functional as F

        fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=point.causal)  # noqa: E731
        if backend is None:
            return Prepared(fn)
        from torch.nn.attention import SDPBackend, sdpa_kernel

        chosen = getattr(SDPBackend, backend)
        return Prepared(fn, context=lambda: sdpa_kernel(chosen))
    return prepare


def _eager(q, k, v, point: BenchPoint, arch: str) -> Prepared:
    import torch

    scale = 1.0 / math.sqrt(point.head_dim)
    mask = None
    if point.causal:  # top-left aligned, like torch's is_causal; built once, outside the timing
        mask = torch.ones(point.seqlen, point.seqlen, dtype=torch.bool,
                          device=q.device).triu_(1)

    def fn():
        scores = torch.matmul(q, k.transpose(-1, -2))  # [B, H, S, S] in the input dtype
        scores.mul_(scale)
        if mask is not None:
            scores.masked_fill_(mask, float("-inf"))
        return torch.matmul(torch.softmax(scores, dim=-1), v)
    return Prepared(fn)


def make_contenders() -> dict[str, Contender]:
    """Every known contender, by name (``CONTENDERS`` order)."""
    table = {
        "tiledattention": Contender("tiledattention", _tiledattention),
        "tiledattention-default": Contender("tiledattention-default", _tiledattention_default),
        "torch-auto": Contender("torch-auto", _torch_sdpa(None)),
        "torch-flash": Contender("torch-flash", _torch_sdpa("FLASH_ATTENTION")),
        "torch-cudnn": Contender("torch-cudnn", _torch_sdpa("CUDNN_ATTENTION")),
        "torch-efficient": Contender("torch-efficient", _torch_sdpa("EFFICIENT_ATTENTION")),
        # the math backend upcasts half inputs: fp32 scores, fp32 probabilities and a copy
        "torch-math": Contender("torch-math", _torch_sdpa("MATH"),
                                score_bytes=lambda p: 3 * 4 * _score_elements(p)),
        # eager: scores and probabilities in the input dtype (2 x 2 bytes: the fp32 size)
        "eager": Contender("eager", _eager, score_bytes=lambda p: 4 * _score_elements(p)),
    }
    assert tuple(table) == CONTENDERS
    return table


def reference_attention(q, k, v, causal: bool, *, budget_bytes: int) -> Any:
    """float32 attention (top-left causal), in query chunks whose fp32 scores fit
    ``budget_bytes``; full-precision matmuls (no TF32)."""
    import torch

    b, h, sq, d = q.shape
    sk = k.shape[2]
    scale = 1.0 / math.sqrt(d)
    kf, vf = k.float(), v.float()
    out = torch.empty(b, h, sq, d, dtype=torch.float32, device=q.device)
    rows = max(1, int(budget_bytes // (2 * 4 * b * h * sk)))
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        for start in range(0, sq, rows):
            stop = min(sq, start + rows)
            scores = torch.matmul(q[:, :, start:stop].float(), kf.transpose(-1, -2)).mul_(scale)
            if causal:
                i = torch.arange(start, stop, device=q.device)[:, None]
                j = torch.arange(sk, device=q.device)[None, :]
                scores.masked_fill_(j > i, float("-inf"))
            out[:, :, start:stop] = torch.matmul(torch.softmax(scores, dim=-1), vf)
            del scores
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    return out
