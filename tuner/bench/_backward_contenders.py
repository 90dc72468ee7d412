"""The contenders of ``tiledtune bench --kernel backward`` (``BACKWARD_CONTENDERS``) and the
float32 reference gradients they are checked against.

Each contender prepares two calls at a point: ``backward()`` returns ``(dq, dk, dv)`` for the
fixed ``grad_out``, its forward having run once before (untimed; the first call runs it, and
the first call is the accuracy check), and ``forward_backward()`` runs one whole training step
of attention and returns ``(out, (dq, dk, dv))``.

Ours: ``tiledattention`` is ``tiledattention.sdpa_with_lse`` (the forward family's looked-up
schedule) then ``tiledattention.sdpa_backward`` with the backward family's looked-up schedule
passed explicitly (what a call without one runs; the row names it); ``tiledattention-default``
passes ``BACKWARD.default_schedule`` and is timed only where that differs from the lookup's
(elsewhere its rows are ``skipped``: the same kernels would be timed twice). PyTorch's:
``F.scaled_dot_product_attention`` with one backend pinned, gradients by
``torch.autograd.grad(out, (q, k, v), grad_out, retain_graph=True)``. Nothing here touches the
GPU at import; torch and tiledattention's launchers are imported where they are used.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any, Callable

from tiledattention import torch_sdpa_kwargs

from ._backward_grid import BACKWARD_CONTENDERS, BackwardPoint

__all__ = ["BackwardContender", "BackwardPrepared", "SameSchedule",
           "make_backward_contenders", "reference_gradients", "torch_backward"]


class SameSchedule(Exception):
    """A contender would time exactly what another contender times at this point."""


@dataclass(frozen=True)
class BackwardPrepared:
    """A contender ready to run at one point; ``context`` wraps the check and every sample."""

    backward: Callable[[], tuple]
    forward_backward: Callable[[], tuple]
    context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    schedule: str = ""
    lookup_source: str = ""
    lookup_detail: str = ""


@dataclass(frozen=True)
class BackwardContender:
    """``prepare(q, k, v, grad_out, point, arch)`` -> :class:`BackwardPrepared` (it may raise
    :class:`SameSchedule`, which makes the contender's rows ``skipped``)."""

    name: str
    prepare: Callable[..., BackwardPrepared]


def _ours(q, k, v, grad_out, point: BackwardPoint, schedule: Any) -> tuple[Callable, Callable]:
    from tiledattention import sdpa_backward, sdpa_with_lse

    causal = point.causal
    saved: list = []

    def backward() -> tuple:
        if not saved:
            saved.append(sdpa_with_lse(q, k, v, causal))
        out, lse = saved[0]
        return sdpa_backward(grad_out, q, k, v, out, lse, causal, schedule=schedule)

    def forward_backward() -> tuple:
        out, lse = sdpa_with_lse(q, k, v, causal)
        return out, sdpa_backward(grad_out, q, k, v, out, lse, causal, schedule=schedule)

    return backward, forward_backward


def _lookup(q, point: BackwardPoint) -> Any:
    from tiledattention import BACKWARD, runtime

    return runtime().resolution(BACKWARD, point.problem, q.device.index)


def _looked_up(q, k, v, grad_out, point: BackwardPoint, arch: str) -> BackwardPrepared:
    resolution = _lookup(q, point)
    backward, forward_backward = _ours(q, k, v, grad_out, point, resolution.schedule)
    return BackwardPrepared(backward, forward_backward,
                            schedule=resolution.schedule.describe(),
                            lookup_source=resolution.source,
                            lookup_detail=f"BACKWARD lookup: {resolution.detail}; the forward: "
                                          "sdpa_with_lse's lookup")


def _default(q, k, v, grad_out, point: BackwardPoint, arch: str) -> BackwardPrepared:
    from tiledattention import BACKWARD

    problem = point.problem
    schedule = BACKWARD.default_schedule(arch, problem)
    resolution = _lookup(q, point)
    if BACKWARD.normalise(problem, resolution.schedule) == BACKWARD.normalise(problem, schedule):
        raise SameSchedule(f"the lookup's schedule ({resolution.source}) is the default "
                           f"{schedule.describe()}: tiledattention's rows time it")
    backward, forward_backward = _ours(q, k, v, grad_out, point, schedule)
    return BackwardPrepared(backward, forward_backward, schedule=schedule.describe(),
                            lookup_source="forced",
                            lookup_detail=f"BACKWARD.default_schedule({arch!r})")


def torch_backward(backend: str) -> Callable[..., BackwardPrepared]:
    """A contender's ``prepare``: torch's SDPA with ``backend`` (an ``SDPBackend`` name) pinned
    by ``sdpa_kernel`` around the check and every sample, differentiated by autograd."""
    def prepare(q, k, v, grad_out, point: BackwardPoint, arch: str) -> BackwardPrepared:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        kwargs = torch_sdpa_kwargs(point.problem)
        leaves = [x.detach().requires_grad_() for x in (q, k, v)]
        graph: list = []

        def forward() -> Any:
            with torch.enable_grad():
                return F.scaled_dot_product_attention(*leaves, **kwargs)

        def backward() -> tuple:
            if not graph:
                graph.append(forward())
            return torch.autograd.grad(graph[0], leaves, grad_out, retain_graph=True)

        def forward_backward() -> tuple:
            out = forward()
            return out.detach(), torch.autograd.grad(out, leaves, grad_out)

        chosen = getattr(SDPBackend, backend)
        return BackwardPrepared(backward, forward_backward, context=lambda: sdpa_kernel(chosen))
    return prepare


def make_backward_contenders() -> dict[str, BackwardContender]:
    """Every backward-grid contender, by name (``BACKWARD_CONTENDERS`` order)."""
    table = {
        "tiledattention": BackwardContender("tiledattention", _looked_up),
        "tiledattention-default": BackwardContender("tiledattention-default", _default),
        "torch-cudnn": BackwardContender("torch-cudnn", torch_backward("CUDNN_ATTENTION")),
        "torch-flash": BackwardContender("torch-flash", torch_backward("FLASH_ATTENTION")),
        "torch-efficient": BackwardContender("torch-efficient",
                                             torch_backward("EFFICIENT_ATTENTION")),
    }
    if tuple(table) != BACKWARD_CONTENDERS:
        raise RuntimeError("make_backward_contenders() is out of step with BACKWARD_CONTENDERS")
    return table


def reference_gradients(q, k, v, grad_out, causal: bool, *, budget_bytes: int,
                        bottom_right: bool = False) -> tuple[Any, Any, Any, Any]:
    """float32 ``(out, dq, dk, dv)`` of attention (scale ``1/sqrt(D)``) for ``grad_out``, with
    full-precision matmuls (no TF32), computed in query chunks whose float32 scores fit
    ``budget_bytes`` (three ``[chunk, S_k]`` arrays per head at a time): per chunk ``P =
    softmax(S)``, ``out = P V``, ``dV += P^T dO``, ``dS = P * (dO V^T - rowsum(dO * out))``,
    ``dQ = scale * dS K``, ``dK += scale * dS^T Q``. Masking as ``reference_attention``
    (``causal``: row ``i`` sees keys ``0..i``; with ``bottom_right`` ``0..i + S_k - S_q``; a row
    that sees no key is 0, as the kernels make it). Grouped-query K/V get their group's sum."""
    import torch

    b, hq, sq, d = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    group = hq // hkv
    offset = sk - sq if causal and bottom_right else 0
    scale = 1.0 / math.sqrt(d)
    kf, vf = k.float(), v.float()
    out = torch.empty(b, hkv, group, sq, d, dtype=torch.float32, device=q.device)
    dq = torch.empty_like(out)
    dk = torch.zeros(b, hkv, sk, d, dtype=torch.float32, device=q.device)
    dv = torch.zeros_like(dk)
    qg, dog = q.reshape(b, hkv, group, sq, d), grad_out.reshape(b, hkv, group, sq, d)
    rows = max(1, int(budget_bytes // (3 * 4 * b * hq * sk)))
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        for start in range(0, sq, rows):
            stop = min(sq, start + rows)
            n = group * (stop - start)  # the group's query heads stacked along the rows
            qc = qg[:, :, :, start:stop].float().reshape(b, hkv, n, d)
            doc = dog[:, :, :, start:stop].float().reshape(b, hkv, n, d)
            p = torch.matmul(qc, kf.transpose(-1, -2)).mul_(scale)  # [b, hkv, n, sk]
            if causal:
                i = torch.arange(start, stop, device=q.device).repeat(group)[:, None]
                j = torch.arange(sk, device=q.device)[None, :]
                p.masked_fill_(j > i + offset, float("-inf"))
            p = torch.softmax(p, dim=-1).nan_to_num_(0.0)  # a row without keys: 0
            oc = torch.matmul(p, vf)
            dv += torch.matmul(p.transpose(-1, -2), doc)
            ds = torch.matmul(doc, vf.transpose(-1, -2))
            ds.sub_((doc * oc).sum(-1, keepdim=True)).mul_(p)
            del p
            dq[:, :, :, start:stop] = (torch.matmul(ds, kf) * scale).reshape(
                b, hkv, group, stop - start, d)
            dk += torch.matmul(ds.transpose(-1, -2), qc) * scale
            out[:, :, :, start:stop] = oc.reshape(b, hkv, group, stop - start, d)
            del ds, oc
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    return (out.reshape(b, hq, sq, d), dq.reshape(b, hq, sq, d), dk, dv)
