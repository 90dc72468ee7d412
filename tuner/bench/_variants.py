"""The contenders of variant problems (a sliding window, a logit softcap, attention sinks: issue
32) besides tiledattention's, and which of them each problem gets.

- ``flex``: ``torch.compile(flex_attention)`` with the problem's mask as a ``BlockMask`` built
  once, outside the timing (:func:`flex_mask_mod`: the causal mask and the window sides, aligned
  by ``problem.causal_offset``), the softcap as its ``score_mod`` (:func:`flex_score_mod`),
  ``enable_gqa`` for grouped heads, and sinks through the returned log-sum-exp
  (``out * sigmoid(lse - sink)``, what a FlexAttention user writes);
- ``sdpa-mask``: ``F.scaled_dot_product_attention`` with the materialised boolean mask on torch's
  efficient backend (what transformers does for a sliding window); windows only;
- ``varlen``: ``torch.nn.attention.varlen.varlen_attn(window_size=...)`` (FlashAttention's
  sliding window) where the installed torch has it, windows only, and only where the problem's
  alignment is FlashAttention's (bottom-right, or ``S_q == S_k``).

Plain problems keep their family's contenders (torch's SDPA backends); variant problems get
tiledattention's and these; ragged problems tiledattention's and those of ``_ragged``
(``varlen_attn`` on the packed batch, SDPA on the padded one), paged ones those of ``_paged``
(``varlen_attn`` with a block table, cuDNN's SDPA on the padded caches). :func:`applies`
decides, without torch. The builders run on a GPU with a family's case (its q, k, v, sink
logits, dO and float32 reference): each contender is checked against that reference (relative
L2 error of the output, or of the worst gradient for the backward) before it is timed.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

from ..errors import NotRunnable, UsageError
from ._paged import PAGED_CONTENDERS, applies_paged, is_paged
from ._peers import PEER_CONTENDERS, applies_peer
from ._ragged import RAGGED_CONTENDERS, applies_ragged, is_ragged

__all__ = ["NotRunnable", "VARIANT_CONTENDERS", "applies", "build_contender", "flex_mask_mod",
           "flex_score_mod", "is_variant", "varlen_support", "varlen_window"]

#: The contenders only variant problems get, in the order tables show them.
VARIANT_CONTENDERS = ("flex", "sdpa-mask", "varlen")


def is_variant(problem: Any) -> bool:
    """Whether ``problem`` has a window, a softcap or sinks (problems of families without these
    fields are plain)."""
    return bool(getattr(problem, "windowed", False) or getattr(problem, "softcap", 0.0) > 0
                or getattr(problem, "sinks", False))


def _window_only(problem: Any) -> bool:
    return bool(getattr(problem, "windowed", False)) and problem.softcap == 0 \
        and not problem.sinks


def varlen_window(problem: Any) -> tuple[int, int] | None:
    """``varlen_attn``'s ``window_size`` for ``problem``, or ``None`` where FlashAttention's
    window cannot say the mask: it aligns the diagonal bottom-right, so a top-left problem with
    ``S_q != S_k`` is out; ``(left, 0)`` is causal with a left window."""
    if not _window_only(problem) or problem.causal_offset != problem.seqlen_k - problem.seqlen_q:
        return None
    return problem.window_left, 0 if problem.causal else problem.window_right


def _tunes_pages(name: str) -> bool:
    """Whether tiledattention contender ``name`` may read a paged cache: the grid family's own
    (``tiledattention``, ``tiledattention-default``: its case decides), another family's
    (``tiledattention-<f>``) where that family's tuner case takes paged problems
    (``Family.tunes_pages``: the forward reads pages for chunked prefill but tunes none)."""
    if name in ("tiledattention", "tiledattention-default"):
        return True
    from tiledattention import InputValueError, get_family

    try:
        return get_family(name.removeprefix("tiledattention-")).tunes_pages
    except InputValueError:  # an unknown family: its row says why it cannot run
        return True


def applies(name: str, problem: Any) -> bool:
    """Whether contender ``name`` runs at ``problem``: tiledattention's everywhere (but
    ``tiledattention-<f>`` at a paged problem where family ``f`` reads no paged cache), the
    other libraries' (``_peers``: FlashAttention-4) everywhere; at a paged problem only the
    paged contenders that take it (``_paged.applies_paged``); at a ragged problem only the
    ragged contenders that take it (``_ragged.applies_ragged``); the variant contenders at
    variant problems (``sdpa-mask`` and ``varlen`` at window-only ones), every other (torch's
    SDPA backends) at plain problems."""
    if name.startswith("tiledattention"):
        return not is_paged(problem) or _tunes_pages(name)
    if name in PEER_CONTENDERS:
        return applies_peer(name, problem)
    if is_paged(problem) or name in PAGED_CONTENDERS:
        return applies_paged(name, problem)
    if is_ragged(problem) or name in RAGGED_CONTENDERS:
        return applies_ragged(name, problem)
    if name not in VARIANT_CONTENDERS:
        return not is_variant(problem)
    if name == "flex":
        return is_variant(problem)
    if name == "sdpa-mask":
        return _window_only(problem)
    return varlen_window(problem) is not None


def flex_mask_mod(problem: Any) -> Callable[[Any, Any, Any, Any], Any]:
    """FlexAttention's ``mask_mod(b, h, q_idx, kv_idx)`` of ``problem``: query row ``i`` sees
    key ``j`` iff ``(not causal or j <= i + off)`` and ``j >= i + off - window_left`` and
    ``j <= i + off + window_right`` (an unbounded side, -1, binds nothing; ``off`` the alignment
    offset). Plain tensor code: it runs on index tensors anywhere."""
    off, causal = problem.causal_offset, problem.causal
    left, right = problem.window_left, problem.window_right

    def mask_mod(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        i = q_idx + off
        keep = kv_idx >= 0
        if causal:
            keep = keep & (kv_idx <= i)
        if left >= 0:
            keep = keep & (kv_idx >= i - left)
        if right >= 0:
            keep = keep & (kv_idx <= i + right)
        return keep

    return mask_mod


def flex_score_mod(problem: Any) -> Callable[..., Any] | None:
    """FlexAttention's ``score_mod`` of ``problem``'s softcap (``cap * tanh(score / cap)`` of
    the scaled score), or ``None`` without one."""
    cap = problem.softcap
    if not cap > 0:
        return None

    def softcap(score: Any, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        import torch

        return cap * torch.tanh(score / cap)

    return softcap


def varlen_support(problem: Any) -> str:
    """Why the installed torch cannot run ``varlen`` at ``problem`` (``""``: it can)."""
    import torch

    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return f"torch {torch.__version__} has no torch.nn.attention.varlen.varlen_attn"
    params = inspect.signature(varlen_attn).parameters
    if "window_size" not in params:
        return f"torch {torch.__version__}'s varlen_attn takes no window_size"
    if problem.heads_q != problem.heads_kv and "enable_gqa" not in params:
        return f"torch {torch.__version__}'s varlen_attn takes no enable_gqa (grouped heads)"
    return ""


# -- the contenders on a GPU ----------------------------------------------------------------------

def _rel_l2(got: Any, want: Any) -> float:
    import torch

    return (torch.linalg.vector_norm(got.float() - want.float())
            / torch.linalg.vector_norm(want.float())).item()


def _forward_fn(name: str, problem: Any, case: Any
                ) -> tuple[Callable[..., Any], Callable, Callable]:
    """``(fn(q, k, v) -> out, pack, unpack)``: the contender's call on tensors of the layout
    ``pack`` gives (from the case's ``[B, H, S, D]``), and ``unpack`` of its output back."""
    import torch
    import torch.nn.functional as F

    same = (lambda x: x), (lambda x: x)
    gqa = problem.heads_q != problem.heads_kv
    if name == "flex":
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        torch._dynamo.reset()  # each point compiles its own (a fresh score_mod recompiles anyway)
        block_mask = create_block_mask(flex_mask_mod(problem), None, None, problem.seqlen_q,
                                       problem.seqlen_k, device=case.q.device)
        compiled = torch.compile(flex_attention, dynamic=False)
        kwargs = dict(score_mod=flex_score_mod(problem), block_mask=block_mask,
                      enable_gqa=gqa)
        sinks = case.sinks
        if sinks is None:
            return (lambda q, k, v: compiled(q, k, v, **kwargs)), *same
        sink = sinks.float().view(1, -1, 1)
        lse_kwargs = dict(return_lse=True) if "return_lse" in inspect.signature(
            flex_attention).parameters else None
        if lse_kwargs is None:
            from torch.nn.attention.flex_attention import AuxRequest

            lse_kwargs = dict(return_aux=AuxRequest(lse=True))

        def with_sinks(q: Any, k: Any, v: Any) -> Any:
            out, aux = compiled(q, k, v, **kwargs, **lse_kwargs)
            lse = aux if torch.is_tensor(aux) else aux.lse  # natural log, [B, H_q, S_q]
            return (out.float() * torch.sigmoid(lse - sink)[..., None]).to(q.dtype)

        return with_sinks, *same
    if name == "sdpa-mask":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        from tiledattention.tooling import torch_sdpa_kwargs

        sdpa_kwargs = torch_sdpa_kwargs(problem)  # the materialised mask, built once

        def masked(q: Any, k: Any, v: Any) -> Any:
            with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, **sdpa_kwargs)

        return masked, *same
    if name == "varlen":
        from torch.nn.attention.varlen import varlen_attn

        why = varlen_support(problem)
        if why:
            raise NotRunnable(why)
        b, sq, sk = problem.batch, problem.seqlen_q, problem.seqlen_k
        device = case.q.device
        cu_q = torch.arange(b + 1, device=device, dtype=torch.int32) * sq
        cu_k = torch.arange(b + 1, device=device, dtype=torch.int32) * sk
        extra = dict(enable_gqa=True) if gqa else {}
        window = varlen_window(problem)

        def packed(q: Any, k: Any, v: Any) -> Any:
            return varlen_attn(q, k, v, cu_q, cu_k, sq, sk, window_size=window, **extra)

        def pack(x: Any) -> Any:  # [B, H, S, D] -> [B·S, H, D]
            return x.transpose(1, 2).reshape(-1, x.shape[1], x.shape[3]).contiguous()

        def unpack(x: Any) -> Any:  # [B·S_q, H_q, D] -> [B, H_q, S_q, D]
            return x.view(b, sq, x.shape[1], x.shape[2]).transpose(1, 2)

        return packed, pack, unpack
    raise UsageError(f"unknown variant contender {name!r}; expected one of {VARIANT_CONTENDERS}")



def build_contender(name: str, problem: Any, case: Any, *, backward: bool
                    ) -> tuple[Callable[[], Any], float]:
    """``(run, rel_err)``: the call to time and its relative L2 error against ``case``'s float32
    reference, checked once here. Forward (``backward=False``): ``run`` computes the output of
    the case's q, k, v (``case.reference``). Backward: ``run`` is ``torch.autograd.grad`` of the
    output (its graph built once, here) for the case's dO, as torch's baselines of the backward
    family time it; the error is the worst of dQ's, dK's and dV's against
    ``case.reference_grads``. Raises :class:`NotRunnable` when it cannot run for a known
    reason."""
    import torch

    fn, pack, unpack = _forward_fn(name, problem, case)
    q, k, v = (pack(x) for x in (case.q, case.k, case.v))
    if not backward:
        with torch.no_grad():
            err = _rel_l2(unpack(fn(q, k, v)), case.reference)
        return (lambda: fn(q, k, v)), err
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    grad_out = pack(case.grad_out)
    with torch.enable_grad():
        out = fn(*leaves)

    def run() -> Any:
        return torch.autograd.grad(out, leaves, grad_out, retain_graph=True)

    grads = run()
    err = max(_rel_l2(unpack(g) if i == 0 else _unpack_kv(g, problem, name), want)
              for i, (g, want) in enumerate(zip(grads, case.reference_grads)))
    return run, err


def _unpack_kv(x: Any, problem: Any, name: str) -> Any:
    """A K/V gradient back in ``[B, H_kv, S_k, D]`` (``varlen`` packs it ``[B·S_k, H_kv, D]``)."""
    if name != "varlen":
        return x
    return x.view(problem.batch, problem.seqlen_k, x.shape[1], x.shape[2]).transpose(1, 2)
