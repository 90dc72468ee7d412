"""The contenders of paged problems (``Problem.page_size``: a decode step over a paged K/V cache,
a lookup bucket; ``--preset paged``) besides tiledattention's, which of them each problem gets,
and what a paged point's work and bytes are.

A paged problem is timed on its family's paged case (``tiledattention.core._case.PagedCase``, the
decode family's ``PagedDecodeCase``): ``problem.batch`` caches of 1, 3/4, 1/2 and 1/4 of the
bucket's longest (:func:`case_lengths`, cycling; at least ``S_q`` keys each) in shuffled pages
of ``page_size`` tokens (``k_pages``, ``v_pages [pages, page_size, H_kv, D]``, NaN in every
unused page and past each length), the int32 block table (-1 in unused slots) and
``seqused_k``; each entry's ``S_q`` queries are the last of its keys (bottom-right).

- ``torch-varlen-paged``: ``torch.nn.attention.varlen.varlen_attn`` on the pools themselves,
  with ``block_table=`` and ``seqused_k=`` (queries packed ``[B·S_q, H_q, D]``), where the
  installed torch's ``varlen_attn`` takes a block table; the block table's unused slots (-1)
  point at page 0 in its copy (serving engines pad their tables with a real page; nothing past
  ``seqused_k`` is read), made outside the timing;
- ``cudnn-padded-cache``: ``F.scaled_dot_product_attention`` on torch's cuDNN backend over the
  caches gathered into a contiguous batch padded to the longest (``[B, H_kv, L, D]``, zeros
  past each length, built outside the timing) with a boolean key-padding mask (``[B, 1, 1, L]``
  for one query row; ``_ragged.padded_mask``: the causal mask aligned bottom-right by each
  entry's length for more rows) and ``enable_gqa=True``: what a serving user without a paged
  kernel runs.

Each is checked against the case's float32 reference before it is timed. Work and bytes count
the valid keys only (:func:`paged_flops`, :func:`paged_bytes`): the sum of the case's lengths,
never the bucket's rectangle nor the padding. :func:`applies_paged` decides without torch.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable

from tiledattention.tooling import array_itemsize
from tiledattention.tooling import paged_flops as tooling_paged_flops
from tiledattention.tooling import paged_lengths

from ..errors import NotRunnable, UsageError

__all__ = ["PAGED_CONTENDERS", "applies_paged", "build_paged_contender", "case_entries",
           "case_lengths", "is_paged", "paged_bytes", "paged_flops", "valid_keys",
           "varlen_paged_support"]

#: The contenders only paged problems get, in the order tables show them.
PAGED_CONTENDERS = ("torch-varlen-paged", "cudnn-padded-cache")


def is_paged(problem: Any) -> bool:
    """Whether ``problem`` is a paged bucket (problems of families without the field are
    not)."""
    return bool(getattr(problem, "page_size", 0))


def case_lengths(problem: Any) -> list[int]:
    """The cache lengths the family's paged case holds for ``problem``
    (``tiledattention.tooling.paged_lengths``)."""
    return paged_lengths(problem)


def case_entries(problem: Any) -> list[Any]:
    """The case's entries of ``problem`` as plain problems (batch 1, each its own cache length,
    no pages; the mask and window aligned bottom-right by it): what the work is taken of."""
    return [dataclasses.replace(problem, batch=1, seqlen_k=n, ragged=False, page_size=0)
            for n in case_lengths(problem)]


def valid_keys(problem: Any) -> int:
    """Keys of the case's caches (the sum of their lengths)."""
    return sum(case_lengths(problem))


def _keys_read(entry: Any) -> int:
    """Keys of one entry some query row sees: all of them, or a sliding window's span."""
    if not getattr(entry, "windowed", False):
        return entry.seqlen_k
    lo, hi = entry.key_span(0, entry.seqlen_q - 1)
    return max(0, hi - lo)


def paged_bytes(problem: Any) -> int:
    """The valid K/V bytes a step must read at least: ``2 (K and V) · Σ lengths · H_kv · D ·
    itemsize`` over the case's caches (a window: the keys it lets some query see). Q and the
    output (``B·H_q·S_q·D`` each, under 0.1% here) are left out, as are the pages' padding and
    the unused pages: what ``scripts/paged_bench.py`` counts."""
    return sum(2 * problem.heads_kv * _keys_read(e) * problem.head_dim
               * array_itemsize(problem.dtype)
               for e in case_entries(problem))


def paged_flops(problem: Any) -> float:
    """``4·H_q·D`` per attended (query, key) pair of the case's caches, the valid keys only
    (``tiledattention.tooling.paged_flops``, the decode family's ``flops`` of a paged
    problem)."""
    return tooling_paged_flops(problem)


def _no_softcap_or_sinks(problem: Any) -> bool:
    return not problem.softcap > 0 and not problem.sinks


def applies_paged(name: str, problem: Any) -> bool:
    """Whether paged contender ``name`` runs at ``problem`` (a paged one): both without a
    softcap or sinks (torch's SDPA and ``varlen_attn`` have neither)."""
    if not is_paged(problem) or name not in PAGED_CONTENDERS:
        return False
    return _no_softcap_or_sinks(problem)


def varlen_paged_support() -> str:
    """Why the installed torch has no ``varlen_attn`` that reads a paged cache (``""``: it
    has one)."""
    import torch

    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return f"torch {torch.__version__} has no torch.nn.attention.varlen.varlen_attn"
    params = inspect.signature(varlen_attn).parameters
    missing = [p for p in ("block_table", "seqused_k") if p not in params]
    if missing:
        return (f"torch {torch.__version__}'s varlen_attn takes no {' or '.join(missing)} "
                f"(no paged cache)")
    return ""


def _varlen_paged(problem: Any, case: Any) -> tuple[Callable[[], Any], Callable[[Any], Any]]:
    """``(run, as [B, H_q, S_q, D])`` of ``torch-varlen-paged`` on ``case``."""
    import torch

    from ._ragged import _varlen_call

    why = varlen_paged_support()
    if why:
        raise NotRunnable(why)
    varlen_attn, kwargs, repeat = _varlen_call(problem)
    b, hq, sq, d = case.q.shape
    q = case.q.transpose(1, 2).reshape(b * sq, hq, d)  # packed, made once
    cu_q = torch.arange(0, b * sq + 1, sq, dtype=torch.int32, device=case.q.device)
    k_pages, v_pages = case.k_pages, case.v_pages
    if repeat:  # a torch without enable_gqa: the pools' K/V heads repeated, outside the timing
        group = hq // problem.heads_kv
        k_pages, v_pages = (x.repeat_interleave(group, 2) for x in (k_pages, v_pages))
    table = case.table.clamp(min=0)  # unused slots point at a real page; never read
    longest = max(case_lengths(problem))

    def run() -> Any:
        return varlen_attn(q, k_pages, v_pages, cu_q, None, sq, longest, seqused_k=case.seqused,
                           block_table=table, **kwargs)

    return run, lambda y: y.view(b, sq, hq, d).transpose(1, 2)


def _padded_cache(problem: Any, case: Any) -> Callable[[], Any]:
    """``run`` of ``cudnn-padded-cache`` on ``case``: the caches gathered and padded to the
    longest, the key-padding mask, cuDNN's SDPA."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from ._ragged import padded_mask

    lengths = case_lengths(problem)
    longest, device = max(lengths), case.q.device
    sq = case.q.shape[2]
    used = case.seqused.to(device=device, dtype=torch.long)
    slots = case.table.clamp(min=0).long()
    pad = torch.arange(longest, device=device)[None, :] >= used[:, None]  # [B, longest]

    def gathered(pages: Any) -> Any:  # [pages, P, H_kv, D] -> [B, H_kv, longest, D]
        x = pages[slots].flatten(1, 2)[:, :longest]  # [B, longest, H_kv, D]
        x = x.masked_fill(pad[:, :, None, None], 0)  # zeros past each length (not NaN)
        return x.transpose(1, 2).contiguous()

    k, v = gathered(case.k_pages), gathered(case.v_pages)
    mask = padded_mask(problem, [sq] * len(lengths), lengths, device)  # [B, 1, S_q, longest]
    extra = dict(enable_gqa=True) if problem.heads_q != problem.heads_kv else {}
    q = case.q

    def run() -> Any:
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                                    **extra)

    return run


def build_paged_contender(name: str, problem: Any, case: Any, *, backward: bool = False
                          ) -> tuple[Callable[[], Any], float]:
    """``(run, rel_err)`` of paged contender ``name`` on ``case`` (a family's paged case:
    ``q [B, H_q, S_q, D]``, ``k_pages``, ``v_pages``, ``table``, ``seqused`` and the float32
    ``reference``): ``run`` computes the output on the contender's layout, made once here; the
    error is its relative L2 error against the reference. Raises :class:`NotRunnable` when it
    cannot run for a known reason (paged caches are for inference: no backward)."""
    import torch

    from ._ragged import _rel_l2

    if backward:
        raise NotRunnable("a paged cache serves inference: no backward")
    if not applies_paged(name, problem):
        raise NotRunnable(f"{name} does not take {problem.describe()}")
    if name == "torch-varlen-paged":
        run, unpack = _varlen_paged(problem, case)
    elif name == "cudnn-padded-cache":
        run, unpack = _padded_cache(problem, case), (lambda y: y)
    else:
        raise UsageError(f"unknown paged contender {name!r}; expected one of "
                         f"{PAGED_CONTENDERS}")
    with torch.no_grad():
        err = _rel_l2(unpack(run()), case.reference)
    return run, err
