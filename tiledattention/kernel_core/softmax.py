"""The online softmax (cuTile): the step that folds a score tile into a row's running state
``(m, l)`` (the running max of its scaled scores, base 2 with ``EXP2``, and the denominator
``sum exp(s - m)``; the caller rescales its ``P V`` accumulator by ``alpha``), the epilogue to
the output and the log-sum-exp, and a merge of splits.
"""

from __future__ import annotations

import cuda.tile as ct
import numpy as np

from .numbers import LOG2_E

__all__ = ["online_softmax", "online_softmax_parts", "reciprocal", "normalised", "merged_splits",
           "merged_slices", "log_sum_exp"]


def online_softmax(qk, m_i, l_i, scale, EXP2, prescaled, shift=0.0):
    """Fold a ``[rows, TILE_N]`` tile of raw scores ``qk`` into the running ``(m_i, l_i)``
    (``[rows, 1]``): ``(p, m, l, alpha)``, the tile's probabilities against the new max, the
    new state and ``alpha``, the factor that rescales what was accumulated against the old
    max. Scores are ``qk * scale`` (``scale`` in the units of ``m_i``), or with ``prescaled``
    (a compile-time bool) ``qk`` itself. ``shift`` (a compile-time float, in the units of
    ``m_i``): ``p`` and ``l`` come out times ``2^shift`` (``e^shift`` without ``EXP2``)."""
    ps, m_ij, l_i, alpha = online_softmax_parts((qk,), m_i, l_i, scale, EXP2, prescaled, shift)
    return ps[0], m_ij, l_i, alpha


def online_softmax_parts(qks, m_i, l_i, scale, EXP2, prescaled, shift=0.0):
    """:func:`online_softmax` of one key tile held as parts: ``qks``, a tuple of ``[rows, n]``
    raw score tiles (its keys, part by part), folded as one step (one new max, one ``alpha``);
    ``ps``: the parts' probabilities."""
    # the parts joined element by element first: one reduction across a row's threads a step
    joined = qks[0]
    for i in ct.static_iter(range(1, len(qks))):
        joined = max(joined, qks[i])  # [rows, n]
    if prescaled:
        m_ij = max(m_i, ct.max(joined, axis=-1, keepdims=True))  # [rows, 1]
    else:
        m_ij = max(m_i, ct.max(joined, axis=-1, keepdims=True) * scale)
    # the shift joins the row's max (one subtraction a row), so that each score costs one
    # fused multiply-add before its exponential, not a multiply-add and an add
    offset = m_ij - shift if shift else m_ij  # [rows, 1]
    ps = ()
    for i in ct.static_iter(range(len(qks))):
        qk = qks[i]
        shifted = qk - offset if prescaled else qk * scale - offset  # [rows, n]
        if EXP2:
            ps += (ct.exp2(shifted, flush_to_zero=True),)
        else:
            ps += (ct.exp(shifted),)
    if EXP2:
        alpha = ct.exp2(m_i - m_ij, flush_to_zero=True)  # [rows, 1]
    else:
        alpha = ct.exp(m_i - m_ij)
    total = ps[0]
    for i in ct.static_iter(range(1, len(ps))):
        total = total + ps[i]  # [rows, n]
    l_i = l_i * alpha + ct.sum(total, axis=-1, keepdims=True)
    return ps, m_ij, l_i, alpha


def reciprocal(l_i, TILE_M, APPROX_DIV, EMPTY_ROWS):
    """``1 / l_i`` of the ``[TILE_M, 1]`` denominators: one reciprocal per row, so that
    normalising costs a multiply per element (``TILE_M x D`` exact divisions cost 7-8% at D=256,
    S <= 2k on an H100). ``EMPTY_ROWS``: a row may have seen no key (nor a finite sink), with
    ``l_i == 0`` and a zero accumulator: its reciprocal is 0, not inf (0 * inf is NaN)."""
    ones = ct.full((TILE_M, 1), 1.0, dtype=np.float32)
    if APPROX_DIV:
        inverse = ct.truediv(ones, l_i, flush_to_zero=True,
                             rounding_mode=ct.RoundingMode.APPROX)
    else:
        inverse = ones / l_i
    if EMPTY_ROWS:
        inverse = ct.where(l_i > 0.0, inverse, 0.0)
    return inverse


def normalised(acc, total):
    """``acc / total`` per row, and zeros for rows whose ``total`` is 0 (they saw no key):
    the division never sees a zero."""
    seen = total > 0.0
    return acc * ct.where(seen, 1.0 / ct.where(seen, total, 1.0), 0.0)


def merged_splits(m, total, acc, lses, parts, UNROLL):
    """A merge's running ``(m, total, acc)`` and ``UNROLL`` more splits: their base-2
    log-sum-exps ``lses`` (-inf: weight 0) and partial outputs ``parts``."""
    m_new = m
    for u in ct.static_iter(range(UNROLL)):
        m_new = max(m_new, lses[u])
    alpha = ct.exp2(m - m_new, flush_to_zero=True)
    total = total * alpha
    acc = acc * alpha
    for u in ct.static_iter(range(UNROLL)):
        weight = ct.exp2(lses[u] - m_new, flush_to_zero=True)
        total = total + weight
        acc = acc + parts[u] * weight
    return m_new, total, acc


def merged_slices(m_i, l_i, acc, EXP2):
    """One ``(m, l, acc)`` a row (``[rows, 1]``, ``[rows, 1]``, ``[rows, D]``) from the running
    states of slices of its keys, stacked on the first axis (``[W, rows, ...]``; a slice that
    saw no key has ``l`` and ``acc`` 0 and a finite ``m``): each rescaled to the largest max.
    """
    m = ct.max(m_i, axis=0, keepdims=True)  # [1, rows, 1]
    if EXP2:
        weight = ct.exp2(m_i - m, flush_to_zero=True)  # [W, rows, 1]
    else:
        weight = ct.exp(m_i - m)
    rows = m_i.shape[1]
    return (m.reshape((rows, 1)), ct.sum(l_i * weight, axis=0),
            ct.sum(acc * weight, axis=0))


def log_sum_exp(m_i, l_i, EXP2, EMPTY):
    """Each row's log-sum-exp, base 2, in the units of scaled scores (``log2(e) * s``: ``P =
    2^(log2(e) * s - lse)``), from its final ``(m_i, l_i)``; ``EMPTY`` for a row that saw no
    key (``+inf`` makes its probabilities 0 in the backward, ``-inf`` its weight 0 in a
    merge of splits)."""
    seen = l_i > 0.0
    if EXP2:
        lse = m_i + ct.log2(ct.where(seen, l_i, 1.0))
    else:
        lse = (m_i + ct.log(ct.where(seen, l_i, 1.0))) * LOG2_E
    return ct.where(seen, lse, EMPTY)
