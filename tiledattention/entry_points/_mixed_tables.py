"""The index tables of a serving engine's mixed paged step (``_paged.packed_paged_forward``),
written by one small kernel instead of a score of torch operations on the offsets: the
forward's ranges, and the decode step's keys, query rows and output rows. Nothing is read on
the host."""

from __future__ import annotations

from typing import Any, NamedTuple


from ..core import _aot

__all__ = ["MixedTables", "mixed_tables", "compile_mixed_tables"]

#: sequences a CTA of the kernel writes
CHUNK = 128


class MixedTables(NamedTuple):
    """``ranges``: the forward's int32 ``[4, B]`` (query starts and ends, key starts and ends);
    with the decode step apart, ``keys`` (int32 ``[B]``: its keys a sequence, none but for
    sequences of one query) and ``rows`` (int64 ``[2, B]``: each sequence's first query row,
    below the tokens, and its output row: its own, or the spare row ``tokens``); else
    ``None``."""
    ranges: Any
    keys: Any
    rows: Any


def mixed_tables(cu_seq_q: Any, seqused_k: Any, tokens: int,
                 key_stride: int, key_limit: int, apart: bool) -> MixedTables:
    """The tables of sequences ``b`` with queries ``cu_seq_q[b]:cu_seq_q[b + 1]`` of ``tokens``
    rows over their first ``seqused_k[b]`` keys (at most ``key_limit``, from ``b *
    key_stride`` on); ``apart``: the forward takes only the sequences of more than one query
    (the others' query ranges empty), and a decode step the rest. Enqueued on the current
    stream."""
    import torch

    from ..core._page_kernel import mixed_step_tables  # with cuda.tile, on first use

    sequences, device = seqused_k.shape[0], seqused_k.device
    ranges = torch.empty((4, sequences), dtype=torch.int32, device=device)
    keys = torch.empty((sequences,), dtype=torch.int32, device=device) if apart else None
    rows = torch.empty((2, sequences), dtype=torch.int64, device=device) if apart else None
    # without the decode step its arrays are not written: any int32 / int64 array stands in
    _aot.launch(torch.cuda.current_stream(device), (max(1, -(-sequences // CHUNK)),),
                mixed_step_tables,
                (cu_seq_q, seqused_k, ranges, ranges[0] if keys is None else keys,
                 ranges.new_empty((2, 1), dtype=torch.int64) if rows is None else rows,
                 tokens, key_stride, key_limit, CHUNK, apart))
    return MixedTables(ranges, keys, rows)


def compile_mixed_tables(sequences: int, arch: str, offsets: str = "int32") -> None:
    """Compile (only) the tables kernel of a mixed step of ``sequences`` sequences on
    ``arch`` (both forms: with and without the decode step apart)."""
    from cuda.tile import compilation as ctc
    import cuda.tile as ct

    from ..core._compile import array_constraint, export_cubin
    from ..core._page_kernel import mixed_step_tables

    scalar = ctc.ScalarConstraint(ct.int32)
    for apart in (False, True):
        export_cubin(mixed_step_tables,
                     (array_constraint(offsets, (sequences + 1,)),
                      array_constraint("int32", (sequences,)),
                      array_constraint("int32", (4, sequences)),
                      array_constraint("int32", (sequences,)),
                      array_constraint("int64", (2, sequences if apart else 1)),
                      scalar, scalar, scalar, CHUNK, apart),
                 arch, "mixed_step_tables")
