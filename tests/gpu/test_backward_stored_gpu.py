"""The stored-dS backward (``dq_mode="stored"``) on the GPU: dQ, dK and dV against the float32
reference (``BACKWARD.case``) within the backward family's tolerance, from NaN-poisoned
gradients, ``delta`` and dS workspace (a pair the dK/dV kernel did not walk is never written,
so a dQ kernel that read one would turn dQ into NaN); dQ query tiles larger than the dK/dV
kernel's (the dQ kernel then masks the rows whose step was not walked); bitwise reproducible
over three runs.

Causal alignments: ``causal`` alone is top-left; ``bottom_right`` aligns the last query with
the last key (S_q != S_k below; rows that see no key get zero gradients).
"""

from __future__ import annotations

import pytest
import torch

from tiledattention import BACKWARD, Problem
from tiledattention.kernels.backward._family import allocate_scratch
from tiledattention.kernels.backward._launch import launch, launches, normalise

pytestmark = pytest.mark.gpu

ARCH = "sm_90"


def _problem(b, hq, hkv, sq, sk, d, dtype, causal, bottom_right=False, **variant):
    return Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=sq, seqlen_k=sk, head_dim=d,
                   dtype=dtype, causal=causal, bottom_right=bottom_right, **variant)


#: (id, problem, the default's fields replaced besides dq_mode)
CASES = [
    ("gqa4-d128-top-left-bf16", _problem(2, 8, 2, 1000, 1000, 128, "bf16", True), {}),
    ("gqa4-d128-top-left-rows128", _problem(2, 8, 2, 1000, 1000, 128, "bf16", True),
     {"dkdv_tile_m": 64, "dq_tile_m": 128}),
    ("mha-d64-top-left-rows256-keys32", _problem(1, 4, 4, 1111, 1111, 64, "bf16", True),
     {"dkdv_tile_m": 64, "dkdv_tile_n": 32, "dq_tile_m": 256}),
    ("gqa8-d64-full-fp16-odd", _problem(2, 16, 2, 113, 4097, 64, "fp16", False), {}),
    ("mqa-d128-bottom-right-fp16", _problem(1, 8, 1, 333, 1000, 128, "fp16", True, True),
     {"dkdv_tile_m": 64, "dq_tile_m": 128}),
    ("mha-d64-bottom-right-sq>sk-bf16", _problem(1, 4, 4, 1000, 17, 64, "bf16", True, True),
     {"dq_tile_m": 128}),
    ("gqa4-d64-top-left-split4-bf16", _problem(1, 8, 2, 1000, 1000, 64, "bf16", True),
     {"dkdv_splits": 4}),
    ("gqa4-d128-softcap-bottom-right-bf16", _problem(2, 8, 2, 777, 1500, 128, "bf16", True,
                                                     True, softcap=20.0), {}),
    ("mha-d96-split-d-causal-bf16", _problem(2, 6, 6, 900, 900, 96, "bf16", True),
     {"split_d": True, "dq_tile_m": 128}),
    ("gqa2-d256-full-fp16", _problem(1, 8, 4, 700, 700, 256, "fp16", False), {}),
]


def _stored(problem: Problem, fields: dict):
    default = BACKWARD.default_schedule(ARCH, problem)
    return default.replace(dq_mode="stored", dq_worker_warps=None, **fields)


def _poisoned_run(case, schedule):
    """A run of ``schedule`` on ``case`` that first fills its gradients, ``delta`` and every
    scratch buffer (the dS workspace) with NaN."""
    plan = launches(case.problem, schedule, case.scale)
    scratch = allocate_scratch(plan, case.q.device, case.q.dtype)

    def run() -> None:
        for x in (*case.grads, case.delta, *scratch.values()):
            x.fill_(float("nan"))
        launch(torch.cuda.current_stream(), plan, case.q, case.k, case.v, case.out,
               case.grad_out, case.lse, case.delta, *case.grads, scratch)

    return plan, run


@pytest.mark.parametrize("name, problem, fields", CASES, ids=[c[0] for c in CASES])
def test_stored_ds_gradients_match_the_float32_reference(name, problem, fields):
    case = BACKWARD.case(problem, 0)
    schedule = _stored(problem, fields)
    plan, run = _poisoned_run(case, schedule)
    assert plan.stored and plan.ds_shape is not None
    for name_, value in fields.items():  # the case runs the fields it names
        assert getattr(normalise(problem, schedule), name_) == value or name_ == "dq_tile_m"
    error = case.error(run)
    assert error <= BACKWARD.tolerance(problem), f"{name}: relative L2 {error:.3g}"
    # no worse than the two-kernel backward by more than rounding
    _, two_kernel = _poisoned_run(case, schedule.replace(dq_mode="kernel"))
    assert error <= 1.5 * case.error(two_kernel) + 1e-3


def test_stored_ds_backward_is_bitwise_reproducible():
    problem = _problem(2, 8, 2, 1000, 1000, 128, "bf16", True)
    case = BACKWARD.case(problem, 0)
    _, run = _poisoned_run(case, _stored(problem, {"dkdv_tile_m": 64, "dq_tile_m": 128}))
    runs = []
    for _ in range(3):
        run()
        runs.append(tuple(g.clone() for g in case.grads))
    torch.cuda.synchronize()
    for again in runs[1:]:
        for a, b in zip(runs[0], again):
            assert torch.equal(a.view(torch.int16), b.view(torch.int16))
