"""The contenders of ragged problems (``Problem.ragged``: packed variable-length sequences, a
bucket; ``--preset ragged``) besides tiledattention's, and which of them each problem gets.

A ragged problem is timed on its family's ragged case (``tiledattention.core._case.RaggedCase``):
``problem.batch`` packed sequences of 1, 3/4, 1/2 and 1/4 of the bucket's longest query length
(:func:`case_lengths`), ``[tokens, H, D]`` tensors with offsets ``cu_seq_q``/``cu_seq_k``.

- ``torch-varlen``: ``torch.nn.attention.varlen.varlen_attn`` on the packed tensors, where the
  installed torch has it (causal as ``window_size=(-1, 0)``, or ``is_causal=True`` on a torch
  without ``window_size``); a torch without ``enable_gqa`` (2.11) gets K/V heads repeated to
  H_q, outside the timing. Its causal mask and window align bottom-right per sequence, so it
  takes a top-left problem only where each sequence has as many keys as queries;
- ``cudnn-padded``, ``efficient-padded``: ``F.scaled_dot_product_attention`` on the batch padded
  to its longest sequence (``[sequences, H, longest, D]``, built outside the timing) with the
  boolean padding, causal and window mask (:func:`padded_mask`) on torch's cuDNN or efficient
  backend (the efficient backend takes no grouped heads with a mask: K/V heads repeated, as
  transformers' ``repeat_kv`` does). Padded query rows see every key (transformers'
  ``_unmask_unattended``: no NaN rows); their outputs are dropped.

Each is checked against the case's float32 reference (the output, or for the backward the
worst of dQ's, dK's and dV's relative L2 error) before it is timed; the backward times
``torch.autograd.grad`` of the output, its graph built once, for the case's dO, with the
contender's own layout (padded, or heads repeated) as the leaves. TFLOP/s count the family's
``flops`` of the ragged problem: the attended (query, key) pairs of the case's sequences, the
valid tokens only (padding counts for nothing). :func:`applies_ragged` decides without torch.
"""

from __future__ import annotations

import inspect
import math
from typing import Any, Callable, NamedTuple

from ..errors import NotRunnable, UsageError

__all__ = ["MASK_LIMIT", "RAGGED_CONTENDERS", "applies_ragged", "build_ragged_contender",
           "case_lengths", "case_sequences", "is_ragged", "padded_mask", "ragged_varlen_window",
           "valid_tokens"]

#: The contenders only ragged problems get, in the order tables show them.
RAGGED_CONTENDERS = ("torch-varlen", "cudnn-padded", "efficient-padded")
#: The padded contenders' boolean mask holds ``sequences·longest_q·longest_k`` bytes (torch's
#: efficient backend turns it into twice that of bias): larger batches skip them.
MASK_LIMIT = 1 << 31


def is_ragged(problem: Any) -> bool:
    """Whether ``problem`` is a ragged bucket (problems of families without the field are
    not)."""
    return bool(getattr(problem, "ragged", False))


def case_lengths(problem: Any) -> list[tuple[int, int]]:
    """``(queries, keys)`` of each sequence the family's ragged case packs for ``problem``:
    ``tiledattention.core._case.ragged_lengths`` (1, 3/4, 1/2, 1/4 of the longest, cycling) and keys
    scaled by ``S_k / S_q`` (at least one), as ``RaggedCase`` builds them."""
    from tiledattention.tooling import ragged_lengths

    return [(n, max(1, n * problem.seqlen_k // problem.seqlen_q))
            for n in ragged_lengths(problem)]


def case_sequences(problem: Any) -> list[Any]:
    """The case's sequences of ``problem`` as plain problems (batch 1, each its own lengths,
    the mask and window aligned by them): what the valid-token counts are taken of."""
    import dataclasses

    return [dataclasses.replace(problem, batch=1, seqlen_q=n, seqlen_k=keys, ragged=False)
            for n, keys in case_lengths(problem)]


def valid_tokens(problem: Any) -> int:
    """Query tokens of the case's packed batch (the sum of its sequences' lengths)."""
    return sum(n for n, _ in case_lengths(problem))


def _no_softcap_or_sinks(problem: Any) -> bool:
    return not problem.softcap > 0 and not problem.sinks


def ragged_varlen_window(problem: Any) -> tuple[int, int] | None:
    """``varlen_attn``'s ``window_size`` for ragged ``problem`` (``(-1, 0)``: causal;
    ``(-1, -1)``: no mask), or ``None`` where it cannot say the mask: a softcap or sinks, or a
    top-left mask where a sequence's key count differs from its query count (FlashAttention
    aligns bottom-right)."""
    if not is_ragged(problem) or not _no_softcap_or_sinks(problem):
        return None
    masked = problem.causal or problem.window_left >= 0 or problem.window_right >= 0
    if masked and not problem.bottom_right and problem.seqlen_q != problem.seqlen_k:
        return None
    return problem.window_left, 0 if problem.causal else problem.window_right


def applies_ragged(name: str, problem: Any) -> bool:
    """Whether ragged contender ``name`` runs at ``problem`` (a ragged one, not a paged cache:
    those get ``_paged``'s): ``torch-varlen`` where :func:`ragged_varlen_window` can say its
    mask, the padded ones without a softcap or sinks (torch's SDPA has neither)."""
    if not is_ragged(problem) or getattr(problem, "page_size", 0) or \
            name not in RAGGED_CONTENDERS:
        return False
    if name == "torch-varlen":
        return ragged_varlen_window(problem) is not None
    return _no_softcap_or_sinks(problem)


def padded_mask(problem: Any, lens_q: list[int], lens_k: list[int], device: Any) -> Any:
    """The boolean ``[sequences, 1, max(lens_q), max(lens_k)]`` mask of the padded batch:
    query row ``i`` of sequence ``b`` sees key ``j`` iff ``j < lens_k[b]`` and the causal mask
    and window allow it, aligned by the sequence's own lengths (``off = lens_k[b] - lens_q[b]``
    bottom-right, else 0). Padded query rows (``i >= lens_q[b]``) see every key; their outputs
    are dropped. Plain tensor code: it runs anywhere."""
    import torch

    lq = torch.tensor(lens_q, device=device)[:, None, None]
    lk = torch.tensor(lens_k, device=device)[:, None, None]
    i = torch.arange(max(lens_q), device=device)[None, :, None]
    j = torch.arange(max(lens_k), device=device)[None, None, :]
    at = i + ((lk - lq) if problem.bottom_right else 0)
    keep = j < lk
    if problem.causal:
        keep = keep & (j <= at)
    if problem.window_left >= 0:
        keep = keep & (j >= at - problem.window_left)
    if problem.window_right >= 0:
        keep = keep & (j <= at + problem.window_right)
    return (keep | (i >= lq))[:, None]


def _varlen_call(problem: Any) -> tuple[Callable[..., Any], dict[str, Any], bool]:
    """``(varlen_attn, its mask and head keywords, whether K/V heads must be repeated)``;
    raises :class:`NotRunnable` where the installed torch cannot run ``problem``."""
    import torch

    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        raise NotRunnable(f"torch {torch.__version__} has no "
                          f"torch.nn.attention.varlen.varlen_attn") from None
    window = ragged_varlen_window(problem)
    if window is None:
        raise NotRunnable(f"varlen_attn cannot say the mask of {problem.describe()}")
    params = inspect.signature(varlen_attn).parameters
    kwargs: dict[str, Any] = {}
    if window != (-1, -1):
        if "window_size" in params:
            kwargs["window_size"] = window
        elif window == (-1, 0) and "is_causal" in params:
            kwargs["is_causal"] = True
        else:
            raise NotRunnable(f"torch {torch.__version__}'s varlen_attn takes no window_size")
    repeat = problem.heads_q != problem.heads_kv and "enable_gqa" not in params
    if problem.heads_q != problem.heads_kv and not repeat:
        kwargs["enable_gqa"] = True
    return varlen_attn, kwargs, repeat


class _Layout(NamedTuple):
    """A contender's call ``fn(q, k, v)`` on its own layout of the case's packed tensors:
    ``pack_q``/``pack_kv`` make it (outside the timing), ``unpack_q``/``unpack_kv`` bring its
    output and gradients back to ``[tokens, H, D]`` (repeated K/V heads summed back)."""

    fn: Callable[..., Any]
    pack_q: Callable[[Any], Any]
    pack_kv: Callable[[Any], Any]
    unpack_q: Callable[[Any], Any]
    unpack_kv: Callable[[Any], Any]


def _layout(name: str, problem: Any, case: Any) -> _Layout:
    import torch

    group = problem.heads_q // problem.heads_kv
    lens_q = torch.diff(case.cu_seq_q).tolist()
    lens_k = torch.diff(case.cu_seq_k).tolist()

    def fold(x: Any, dim: int) -> Any:  # repeated K/V heads (dim) summed back, for gradients
        shape = list(x.shape)
        return x.unflatten(dim, (shape[dim] // group, group)).sum(dim + 1)

    if name == "torch-varlen":
        varlen_attn, kwargs, repeat = _varlen_call(problem)
        cu_q, cu_k, max_q, max_k = case.cu_seq_q, case.cu_seq_k, max(lens_q), max(lens_k)

        def packed(q: Any, k: Any, v: Any) -> Any:
            return varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, **kwargs)

        same = lambda x: x  # noqa: E731
        if not repeat:
            return _Layout(packed, same, same, same, same)
        return _Layout(packed, same, lambda x: x.repeat_interleave(group, 1), same,
                       lambda x: fold(x, 1))
    if name not in ("cudnn-padded", "efficient-padded"):
        raise UsageError(f"unknown ragged contender {name!r}; expected one of "
                         f"{RAGGED_CONTENDERS}")
    from torch.nn.attention import SDPBackend, sdpa_kernel

    sequences, max_q, max_k = len(lens_q), max(lens_q), max(lens_k)
    if sequences * max_q * max_k > MASK_LIMIT:
        raise NotRunnable(f"the padding mask of {sequences} sequences of up to {max_q} "
                          f"queries and {max_k} keys would hold "
                          f"{sequences * max_q * max_k / 2**30:.1f} GiB")
    device = case.q.device
    mask = padded_mask(problem, lens_q, lens_k, device)
    backend = (SDPBackend.CUDNN_ATTENTION if name == "cudnn-padded"
               else SDPBackend.EFFICIENT_ATTENTION)
    repeat = name == "efficient-padded" and group > 1
    extra = dict(enable_gqa=True) if group > 1 and not repeat else {}

    def slots(lens: list[int], longest: int) -> Any:  # each token's row of the padded batch
        return torch.cat([torch.arange(b * longest, b * longest + n, device=device)
                          for b, n in enumerate(lens)])

    rows_q, rows_k = slots(lens_q, max_q), slots(lens_k, max_k)

    def pad(x: Any, rows: Any, longest: int) -> Any:  # [tokens, H, D] -> [B, H, longest, D]
        out = x.new_zeros(sequences * longest, *x.shape[1:]).index_copy(0, rows, x)
        return out.view(sequences, longest, *x.shape[1:]).transpose(1, 2)

    def unpad(y: Any, rows: Any) -> Any:  # [B, H, longest, D] -> [tokens, H, D]
        return y.transpose(1, 2).flatten(0, 1)[rows]

    def padded(q: Any, k: Any, v: Any) -> Any:
        with sdpa_kernel(backend):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                                    **extra)

    def pack_kv(x: Any) -> Any:
        x = pad(x, rows_k, max_k)
        return x.repeat_interleave(group, 1) if repeat else x

    def unpack_kv(y: Any) -> Any:
        return unpad(fold(y, 1) if repeat else y, rows_k)

    return _Layout(padded, lambda x: pad(x, rows_q, max_q), pack_kv,
                   lambda y: unpad(y, rows_q), unpack_kv)


def _rel_l2(got: Any, want: Any) -> float:
    import torch

    got = got.float()
    if not torch.isfinite(got).all():
        return math.inf
    return (torch.linalg.vector_norm(got - want.float())
            / torch.linalg.vector_norm(want.float())).item()


def build_ragged_contender(name: str, problem: Any, case: Any, *, backward: bool
                           ) -> tuple[Callable[[], Any], float]:
    """``(run, rel_err)`` of ragged contender ``name`` on ``case`` (a family's ragged case:
    packed ``q, k, v [tokens, H, D]``, ``cu_seq_q``, ``cu_seq_k``, the float32 ``reference``,
    or for the backward ``grad_out`` and ``reference_grads``). Forward: ``run`` computes the
    output on the contender's layout, made once here. Backward: ``run`` is
    ``torch.autograd.grad`` of the output (its graph built once, here; the leaves are the
    contender's layout) for the case's dO; the error is the worst of dQ's, dK's and dV's.
    Raises :class:`NotRunnable` when it cannot run for a known reason."""
    import torch

    if not applies_ragged(name, problem):
        raise NotRunnable(f"{name} does not take {problem.describe()}")
    lay = _layout(name, problem, case)
    q, k, v = lay.pack_q(case.q), lay.pack_kv(case.k), lay.pack_kv(case.v)
    if not backward:
        with torch.no_grad():
            err = _rel_l2(lay.unpack_q(lay.fn(q, k, v)), case.reference)
        return (lambda: lay.fn(q, k, v)), err
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    grad_out = lay.pack_q(case.grad_out)
    with torch.enable_grad():
        out = lay.fn(*leaves)

    def run() -> Any:
        return torch.autograd.grad(out, leaves, grad_out, retain_graph=True)

    dq, dk, dv = run()
    got = (lay.unpack_q(dq), lay.unpack_kv(dk), lay.unpack_kv(dv))
    err = max(_rel_l2(g, want) for g, want in zip(got, case.reference_grads))
    return run, err
