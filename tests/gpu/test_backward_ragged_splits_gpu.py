"""Ragged batches with their dK/dV walk split (``dkdv_splits`` on a ``varlen_attn`` backward)
on the GPU: each sequence's key tile walk over (query head, query tile) pairs shared by
several CTAs, which write zeroed float32 partials cut per sequence, summed in a fixed order.
Gradients against the float32 reference with NaN poison sequences between the real ones
(``check_grads``: a split reading or writing another sequence's rows shows as NaN or as a
wrong gradient; rows outside every sequence must come out zero), grouped and multi-query
heads, odd lengths, both ragged launch modes, the two-kernel and one-pass backward.
"""

from __future__ import annotations

import pytest
import torch

from . import test_varlen_gpu as varlen
from ._backward_fields import force_backward_fields
from .test_varlen_gpu import LENGTHS, check_grads

pytestmark = pytest.mark.gpu

launch_mode = varlen.launch_mode  # the fixture: every ragged launch on a work table, or none


@pytest.fixture(params=[("kernel", 4), ("kernel", 2), ("atomic", 4)],
                ids=["two-kernel-4", "two-kernel-2", "one-pass-4"])
def split_ragged(request, monkeypatch):
    """Every ragged backward runs ``dkdv_splits`` splits (at most its walk's pairs) in the
    given dQ mode, whatever the lookup gave; the plans it made."""
    mode, splits = request.param
    return force_backward_fields(monkeypatch, dkdv_splits=splits, dq_mode=mode)


@pytest.mark.parametrize("is_causal", [True, False, "top_left"])
def test_split_ragged_walks_give_the_reference_gradients(split_ragged, launch_mode, is_causal):
    check_grads(LENGTHS, LENGTHS[::-1], is_causal=is_causal, hq=8, hkv=2)
    check_grads([3, 100, 0, 50, 129, 700], [10, 100, 7, 49, 200, 700], is_causal=is_causal,
                hq=16, hkv=1, d=64, dtype=torch.float16)
    assert split_ragged and max(s.dkdv_splits for _, s in split_ragged) > 1
