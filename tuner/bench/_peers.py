"""Other attention libraries as benchmark contenders: FlashAttention-4 (``flash-attn-4``, the
CuTe-DSL kernels of ``flash_attn.cute``), at every kind of problem its interface takes.

FlashAttention-4 is a contender, never a dependency: its row is ``unavailable`` (with the
reason) where ``flash_attn.cute`` cannot be imported, and nothing else here needs it. Where it
runs, each problem goes to the entry point a user of it would call, on inputs made once in its
own layout (contiguous, outside the timing), and is checked against the family case's float32
reference like every contender:

- a plain or variant problem (``AttentionCase``: ``[B, H, S, D]``): ``flash_attn_func`` on
  ``[B, S, H, D]`` copies (:func:`to_fa4`), with the softmax scale, the causal mask, the
  window (``window_size``, ``None`` for an unbounded side), the softcap and the sink logits
  (``learnable_sink``); grouped heads as they are (it packs them itself);
- a ragged problem (``RaggedCase``: packed ``[tokens, H, D]``, already its layout):
  ``flash_attn_varlen_func`` with ``cu_seqlens_q``/``cu_seqlens_k`` and the longest lengths;
- a paged problem (``PagedCase``: pools ``[pages, page_size, H_kv, D]``, already its layout):
  ``flash_attn_varlen_func`` with ``page_table`` (its unused slots, -1, pointed at page 0 in
  a copy made outside the timing; nothing past ``seqused_k`` is read) and ``seqused_k``; a
  forward only, its default ``num_splits`` (1: it asserts on split-KV where it has none).

Its causal mask and window align bottom-right (query row ``i`` of a sequence with ``S_q``
queries and ``S_k`` keys sees keys up to ``i + S_k - S_q``), per sequence; a problem whose
mask is top-left where a sequence has more keys than queries gets a ``skipped`` row, with the
reason (:func:`fa4_mask`). The backward times ``torch.autograd.grad`` of its output (its
forward run once, outside the timing, the graph kept) for the case's dO, as the other
contenders of the backward family do; its error is the worst of dQ's, dK's and dV's.
"""

from __future__ import annotations

import importlib
import math
import sys
from typing import Any, Callable, NamedTuple

from ..errors import NotRunnable, PeerUnavailable, UsageError
from ._paged import case_lengths as paged_case_lengths
from ._paged import is_paged
from ._ragged import _rel_l2
from ._ragged import case_lengths as ragged_case_lengths
from ._ragged import is_ragged

__all__ = ["FA4", "PEER_CONTENDERS", "PeerUnavailable", "applies_peer", "build_peer_contender",
           "fa4_functions", "fa4_mask", "from_fa4", "to_fa4"]

#: FlashAttention-4's contender.
FA4 = "flash-attn-4"
#: The other libraries' contenders, in the order tables show them.
PEER_CONTENDERS = (FA4,)
#: The module FlashAttention-4's interface is imported from.
FA4_MODULE = "flash_attn.cute"


def applies_peer(name: str, problem: Any) -> bool:
    """Whether peer contender ``name`` gets a row at ``problem``: FlashAttention-4 at every
    problem (plain, variant, ragged, paged); where its mask differs from the problem's, its
    row says so (``skipped``, :func:`fa4_mask`)."""
    return name in PEER_CONTENDERS


def fa4_functions() -> tuple[Callable[..., Any], Callable[..., Any]]:
    """``(flash_attn_func, flash_attn_varlen_func)`` of the installed FlashAttention-4; raises
    :class:`PeerUnavailable` (the reason) where ``flash_attn.cute`` cannot be imported."""
    try:
        module = importlib.import_module(FA4_MODULE)
    except Exception as exc:  # a missing package, or one whose CUDA DSL fails to load
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PeerUnavailable(f"{FA4} needs {FA4_MODULE}, which cannot be imported here "
                              f"({type(exc).__name__}: {reason}); install flash-attn-4 to "
                              f"time it") from None
    missing = [n for n in ("flash_attn_func", "flash_attn_varlen_func")
               if not callable(getattr(module, n, None))]
    if missing:
        raise PeerUnavailable(f"{FA4_MODULE} has no {' or '.join(missing)}: not the "
                              f"FlashAttention-4 interface this contender calls")
    return module.flash_attn_func, module.flash_attn_varlen_func


def _lengths(problem: Any) -> list[tuple[int, int]]:
    """``(queries, keys)`` of each sequence the family's case holds for ``problem``."""
    if is_paged(problem):
        return [(problem.seqlen_q, n) for n in paged_case_lengths(problem)]
    if is_ragged(problem):
        return ragged_case_lengths(problem)
    return [(problem.seqlen_q, problem.seqlen_k)]


def _side(value: int) -> int | None:
    return None if value < 0 else value


def fa4_mask(problem: Any) -> dict[str, Any]:
    """FlashAttention-4's ``causal`` and ``window_size`` (``None``: an unbounded side) for
    ``problem``. Its mask aligns bottom-right in each sequence; raises :class:`NotRunnable`
    where that is not the problem's mask: a top-left causal mask or window while some
    sequence of the family's case has more (or fewer) keys than queries."""
    masked = problem.causal or getattr(problem, "windowed", False)
    if masked and not problem.bottom_right:
        uneven = [(q, k) for q, k in _lengths(problem) if q != k]
        if uneven:
            q, k = uneven[0]
            raise NotRunnable(f"{FA4} aligns its causal mask and window bottom-right (query i "
                              f"sees keys up to i + S_k - S_q); this problem's are top-left "
                              f"with S_q {q} != S_k {k}")
    return dict(causal=bool(problem.causal),
                window_size=(_side(problem.window_left), _side(problem.window_right)))


def to_fa4(x: Any) -> Any:
    """``[B, H, S, D]`` (ours) as FlashAttention-4's ``[B, S, H, D]``, a contiguous copy."""
    return x.transpose(1, 2).contiguous()


def from_fa4(x: Any) -> Any:
    """FlashAttention-4's ``[B, S, H, D]`` viewed as ``[B, H, S, D]``."""
    return x.transpose(1, 2)


def _output(result: Any) -> Any:
    """The output of a FlashAttention-4 call: it returns ``(out, lse)``."""
    return result[0] if isinstance(result, (tuple, list)) else result


def _sink_logits(sinks: Any) -> Any:
    """The case's float32 sink logits as FlashAttention-4 takes them: float32 where its
    interface lists it (``_LEARNABLE_SINK_DTYPES``), else bfloat16 (what every version takes);
    ``None`` without sinks."""
    import torch

    if sinks is None:
        return None
    interface = sys.modules.get(f"{FA4_MODULE}.interface")
    accepted = getattr(interface, "_LEARNABLE_SINK_DTYPES", (torch.bfloat16,))
    return sinks.to(torch.float32 if torch.float32 in accepted else torch.bfloat16).contiguous()


class _Call(NamedTuple):
    """FlashAttention-4's call ``fn(q, k, v) -> out`` on ``inputs`` (its layout, made once),
    ``grad_out`` in its layout (backward only), and ``unpack_q``/``unpack_kv``: its output
    and gradients back in the case's layout."""

    fn: Callable[..., Any]
    inputs: tuple[Any, Any, Any]
    grad_out: Callable[[], Any]
    unpack_q: Callable[[Any], Any]
    unpack_kv: Callable[[Any], Any]


def _scale(problem: Any, case: Any) -> float:
    return getattr(case, "scale", None) or 1.0 / math.sqrt(problem.head_dim)


def _dense_call(problem: Any, case: Any, mask: dict[str, Any]) -> _Call:
    flash_attn_func, _ = fa4_functions()
    kwargs = dict(softmax_scale=_scale(problem, case), softcap=float(problem.softcap),
                  learnable_sink=_sink_logits(getattr(case, "sinks", None)), **mask)

    def fn(q: Any, k: Any, v: Any) -> Any:
        return _output(flash_attn_func(q, k, v, **kwargs))

    return _Call(fn, tuple(to_fa4(x) for x in (case.q, case.k, case.v)),
                 lambda: to_fa4(case.grad_out), from_fa4, from_fa4)


def _ragged_call(problem: Any, case: Any, mask: dict[str, Any]) -> _Call:
    import torch

    _, flash_attn_varlen_func = fa4_functions()
    cu_q, cu_k = case.cu_seq_q, case.cu_seq_k
    kwargs = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                  max_seqlen_q=int(torch.diff(cu_q).max()),
                  max_seqlen_k=int(torch.diff(cu_k).max()),
                  softmax_scale=_scale(problem, case), **mask)

    def fn(q: Any, k: Any, v: Any) -> Any:
        return _output(flash_attn_varlen_func(q, k, v, **kwargs))

    same = lambda x: x  # noqa: E731  (the case's packed tensors are FlashAttention-4's layout)
    return _Call(fn, (case.q, case.k, case.v), lambda: case.grad_out, same, same)


def _paged_run(problem: Any, case: Any, mask: dict[str, Any]) -> tuple[Callable[[], Any], Any]:
    """``(run, unpack)`` of FlashAttention-4 on a paged case: queries ``[B, S_q, H_q, D]``,
    the pools as they are, the block table with its unused slots pointing at page 0."""
    _, flash_attn_varlen_func = fa4_functions()
    q = to_fa4(case.q)
    table = case.table.clamp(min=0).contiguous()  # unused slots: a real page, never read
    kwargs = dict(seqused_k=case.seqused, page_table=table,
                  max_seqlen_k=max(paged_case_lengths(problem)),
                  softmax_scale=_scale(problem, case), **mask)
    k_pages, v_pages = case.k_pages, case.v_pages

    def run() -> Any:
        return _output(flash_attn_varlen_func(q, k_pages, v_pages, **kwargs))

    return run, from_fa4


def build_peer_contender(name: str, problem: Any, case: Any, *, backward: bool
                         ) -> tuple[Callable[[], Any], float]:
    """``(run, rel_err)`` of peer contender ``name`` at ``problem`` on the family's ``case``:
    ``run`` the call to time (its inputs made once, here), ``rel_err`` its relative L2 error
    against the case's float32 reference, checked once here (the backward: ``run`` is
    ``torch.autograd.grad`` of the output, built once, for the case's dO; the error the
    worst of dQ's, dK's and dV's against ``case.reference_grads``). Raises
    :class:`NotRunnable` where it cannot take the problem (``skipped``) and
    :class:`PeerUnavailable` where it is not installed."""
    import torch

    if name not in PEER_CONTENDERS:
        raise UsageError(f"unknown peer contender {name!r}; expected one of "
                         f"{PEER_CONTENDERS}")
    mask = fa4_mask(problem)
    if is_paged(problem):
        if backward:
            raise NotRunnable("a paged cache serves inference: no backward")
        run, unpack = _paged_run(problem, case, mask)
        with torch.no_grad():
            err = _rel_l2(unpack(run()), case.reference)
        return run, err
    call = (_ragged_call if is_ragged(problem) else _dense_call)(problem, case, mask)
    q, k, v = call.inputs
    if not backward:
        with torch.no_grad():
            err = _rel_l2(call.unpack_q(call.fn(q, k, v)), case.reference)
        return (lambda: call.fn(q, k, v)), err
    leaves = [x.detach().requires_grad_() for x in call.inputs]
    grad_out = call.grad_out()
    with torch.enable_grad():
        out = call.fn(*leaves)

    def run() -> Any:
        return torch.autograd.grad(out, leaves, grad_out, retain_graph=True)

    dq, dk, dv = run()
    got = (call.unpack_q(dq), call.unpack_kv(dk), call.unpack_kv(dv))
    return run, max(_rel_l2(g, want) for g, want in zip(got, case.reference_grads))
