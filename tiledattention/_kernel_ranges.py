"""Kernel helpers (cuTile) that cut one sequence out of an array by a ragged call's range
table (``Problem.ragged``: an int32 ``[4, sequences]`` array of query starts, query ends, key
starts and key ends along the sequence axis). The forward, backward and decode kernels call
them under their ``RAGGED`` constant; their families count this module in their template
identity."""

from __future__ import annotations

import cuda.tile as ct


def sequence_view(A, Ranges, seq, which):
    """``A`` (``[B, H, S, ...]``) cut along its sequence axis to sequence ``seq``'s range,
    ``Ranges[which:which + 2, seq]`` = ``[start, end)``; an empty range stays empty even where
    it starts at the end of ``A`` (a slice must start inside the array)."""
    start = ct.gather(Ranges, (which, seq))
    length = ct.gather(Ranges, (which + 1, seq)) - start
    start = min(start, A.shape[2] - 1)
    return A.slice(axis=2, start=start, stop=start + length)


def sequence_view_at_least(A, Ranges, seq, which, at_least=0):
    """:func:`sequence_view`, holding at least ``at_least`` rows (clipped to ``A``): a view
    that loads read but nothing stores to, whose rows past the range are never used (a load
    from an empty view faults)."""
    start = ct.gather(Ranges, (which, seq))
    length = max(ct.gather(Ranges, (which + 1, seq)) - start, at_least)
    start = min(start, A.shape[2] - 1)
    return A.slice(axis=2, start=start, stop=min(start + length, A.shape[2]))


def sequence_length(Ranges, seq, which):
    """Sequence ``seq``'s length in ``Ranges`` (rows ``which``, ``which + 1``)."""
    return ct.gather(Ranges, (which + 1, seq)) - ct.gather(Ranges, (which, seq))
