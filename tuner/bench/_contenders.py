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

from tiledattention import torch_sdpa_kwargs

from ._grid import CONTENDERS, BenchPoint

__all__ = ["Contender", "Prepared", "make_contenders", "reference_attention", "torch_sdpa",
           "torch_sdpa_kwargs"]


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


def torch_sdpa(backend: str | None) -> Callable[..., Prepared]:
    """A contender's ``prepare``: torch's SDPA with ``backend`` (an ``SDPBackend`` name) pinned
    by ``sdpa_kernel`` around the check and every sample (``None``: torch picks)."""
    def prepare(q, k, v, point, arch: str) -> Prepared:
        import torch.nn.functional as F

        kwargs = torch_sdpa_kwargs(point.problem)
        fn = lambda: F.scaled_dot_product_attention(q, k, v, **kwargs)  # noqa: E731
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
        "torch-auto": Contender("torch-auto", torch_sdpa(None)),
        "torch-flash": Contender("torch-flash", torch_sdpa("FLASH_ATTENTION")),
        "torch-cudnn": Contender("torch-cudnn", torch_sdpa("CUDNN_ATTENTION")),
        "torch-efficient": Contender("torch-efficient", torch_sdpa("EFFICIENT_ATTENTION")),
        # the math backend upcasts half inputs: fp32 scores, fp32 probabilities and a copy
        "torch-math": Contender("torch-math", torch_sdpa("MATH"),
                                score_bytes=lambda p: 3 * 4 * _score_elements(p)),
        # eager: scores and probabilities in the input dtype (2 x 2 bytes: the fp32 size)
        "eager": Contender("eager", _eager, score_bytes=lambda p: 4 * _score_elements(p)),
    }
    assert tuple(table) == CONTENDERS
    return table


def reference_attention(q, k, v, causal: bool, *, budget_bytes: int,
                        bottom_right: bool = False) -> Any:
    """float32 attention, in query chunks whose fp32 scores fit ``budget_bytes``;
    full-precision matmuls (no TF32). ``causal``: query row ``i`` sees keys ``0..i`` (top-left),
    with ``bottom_right`` keys ``0..i + S_k - S_q``. Grouped-query inputs (``H_q`` a multiple
    of ``H_kv``) are computed per K/V head, without copies of K and V per query head."""
    import torch

    b, hq, sq, d = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    group = hq // hkv
    offset = sk - sq if causal and bottom_right else 0
    scale = 1.0 / math.sqrt(d)
    kf, vf = k.float(), v.float()
    out = torch.empty(b, hkv, group, sq, d, dtype=torch.float32, device=q.device)
    qg = q.reshape(b, hkv, group, sq, d)
    rows = max(1, int(budget_bytes // (2 * 4 * b * hq * sk)))
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        for start in range(0, sq, rows):
            stop = min(sq, start + rows)
            # the group's query heads stacked along the rows: row g * n + r is query start + r
            qc = qg[:, :, :, start:stop].float().reshape(b, hkv, group * (stop - start), d)
            scores = torch.matmul(qc, kf.transpose(-1, -2)).mul_(scale)
            if causal:
                i = torch.arange(start, stop, device=q.device).repeat(group)[:, None]
                j = torch.arange(sk, device=q.device)[None, :]
                scores.masked_fill_(j > i + offset, float("-inf"))
            chunk = torch.matmul(torch.softmax(scores, dim=-1), vf)
            out[:, :, :, start:stop] = chunk.reshape(b, hkv, group, stop - start, d)
            del scores, chunk
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    return out.reshape(b, hq, sq, d)
