"""The backward's dQ kernel with a K/V group's query heads packed into one tile
(``BackwardSchedule.dq_pack_gqa``) on the GPU: dQ, dK and dV against the float32 reference
(``BACKWARD.case``: autograd through float32 attention) from NaN-poisoned gradients, within the
family's tolerance and no worse than the same schedule unpacked by more than rounding; groups
of 2 to 16 (multi-query), 16- to 64-position tiles, odd lengths, S_q != S_k in both
alignments, a window with a softcap, a head dim in two parts; and packed variable-length
batches (``varlen_attn``'s backward with every ragged dQ tile packed) in both ragged launch
modes, with NaN poison sequences between the real ones. The delta the dQ kernel stores under
the group's head index is what the dK/dV kernel reads: a row stored under another head's index
shows in dK and dV.
"""

from __future__ import annotations

import pytest
import torch

from tiledattention import BACKWARD, Problem
from tiledattention.kernels.backward._launch import dq_packed_heads, normalise

from . import test_varlen_gpu as varlen
from ._backward_fields import force_backward_fields
from .test_varlen_gpu import LENGTHS, check_grads

pytestmark = pytest.mark.gpu

ARCH = "sm_90"
launch_mode = varlen.launch_mode  # the fixture: every ragged launch on a work table, or none


def _problem(b, hq, hkv, sq, sk, d, dtype, causal, bottom_right=False, **variant):
    return Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=sq, seqlen_k=sk, head_dim=d,
                   dtype=dtype, causal=causal, bottom_right=bottom_right, **variant)


#: (id, problem, the default's fields replaced besides dq_pack_gqa)
CASES = [
    ("gqa4-d128-causal-bf16", _problem(2, 8, 2, 1000, 1000, 128, "bf16", True), {}),
    ("gqa4-d128-rows64", _problem(2, 16, 4, 777, 777, 128, "bf16", True),
     {"dq_tile_m": 64}),
    ("gqa8-d64-full-fp16-odd", _problem(2, 16, 2, 113, 4097, 64, "fp16", False), {}),
    ("mqa16-d128-bottom-right-fp16", _problem(1, 16, 1, 333, 1000, 128, "fp16", True, True),
     {"dq_tile_m": 128}),
    ("gqa2-d64-bottom-right-sq>sk", _problem(1, 4, 2, 1000, 17, 64, "bf16", True, True), {}),
    ("gqa4-few-queries", _problem(3, 32, 8, 24, 2048, 128, "bf16", True, True), {}),
    ("gqa4-d64-window-softcap", _problem(1, 8, 2, 1000, 1000, 64, "bf16", True,
                                         window_left=100, softcap=20.0),
     {"dq_mode": "kernel"}),
    ("gqa2-d96-split-d", _problem(2, 8, 4, 900, 900, 96, "bf16", True), {"split_d": True}),
    ("gqa2-d256-full-fp16", _problem(1, 8, 4, 700, 700, 256, "fp16", False), {}),
]


@pytest.mark.parametrize("name, problem, fields", CASES, ids=[c[0] for c in CASES])
def test_packed_dq_tiles_match_the_reference_and_the_unpacked_kernel(name, problem, fields):
    case = BACKWARD.case(problem, 0)
    packed = BACKWARD.default_schedule(ARCH, problem).replace(dq_pack_gqa=True, **fields)
    assert dq_packed_heads(problem, normalise(problem, packed)) == problem.group_size
    error = case.error(case.launcher(packed))
    assert error <= BACKWARD.tolerance(problem), f"{name}: relative L2 {error:.3g}"
    unpacked = case.error(case.launcher(packed.replace(dq_pack_gqa=False)))
    assert error <= 1.5 * unpacked + 1e-3


@pytest.fixture
def packed_ragged(monkeypatch):
    """Every ragged backward packs its dQ tiles' group heads (``dq_pack_gqa``), whatever the
    lookup gave; the plans it made."""
    return force_backward_fields(monkeypatch, dq_pack_gqa=True)


@pytest.mark.parametrize("is_causal", [True, False, "top_left"])
def test_packed_variable_length_gradients(packed_ragged, launch_mode, is_causal):
    check_grads(LENGTHS, LENGTHS[::-1], is_causal=is_causal, hq=8, hkv=2)
    check_grads([3, 100, 0, 50, 129, 700], [10, 100, 7, 49, 200, 700], is_causal=is_causal,
                hq=16, hkv=1, d=64, dtype=torch.float16)
    assert packed_ragged and all(dq_packed_heads(p, s) > 1 for p, s in packed_ragged)
