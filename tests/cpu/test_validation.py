"""Bad input to sdpa: an InputTypeError / InputValueError (a TypeError / ValueError and a
TiledAttentionError) naming the argument; nothing is launched. The runtime's memory (resolutions
per family, problem and device; launch plans) and the forward family's launch plan."""

from __future__ import annotations

import dataclasses

import cuda.tile
import pytest
import torch

import tiledattention
from tiledattention import (FORWARD, Call, InputTypeError, InputValueError, Problem,
                            TiledAttentionError, UnsupportedProblemError)
from tiledattention.tooling import Runtime


@pytest.fixture
def launches(monkeypatch):
    calls = []
    monkeypatch.setattr(cuda.tile, "launch", lambda *a, **k: calls.append(a))
    return calls


def qkv(b=1, hq=4, hkv=4, sq=16, sk=16, d=64, dtype=torch.bfloat16):
    return (torch.randn(b, hq, sq, d, dtype=dtype), torch.randn(b, hkv, sk, d, dtype=dtype),
            torch.randn(b, hkv, sk, d, dtype=dtype))


def case(**kw):
    return qkv(**kw)


BAD = {
    "cpu tensor": (lambda: case(), {}, InputValueError,
                   "q must be a CUDA tensor; got a tensor on cpu"),
    "fp32": (lambda: case(dtype=torch.float32), {}, InputTypeError,
             "q must be bfloat16 or float16"),
    "ndim": (lambda: (torch.randn(4, 16, 64, dtype=torch.bfloat16),) + case()[1:], {},
             InputValueError, "q must have 4 dims"),
    "dtype mismatch": (lambda: (case()[0], *case(dtype=torch.float16)[1:]), {}, InputTypeError,
                       "one dtype"),
    "batch mismatch": (lambda: (case(b=2)[0], *case(b=1)[1:]), {}, InputValueError,
                       "k must have the batch size of q"),
    "head_dim mismatch": (lambda: (case(d=64)[0], *case(d=128)[1:]), {}, InputValueError,
                          "k must have the head_dim of q"),
    "gqa ratio": (lambda: case(hq=6, hkv=4), {}, InputValueError, "multiple of k's heads"),
    "unsupported D": (lambda: case(d=20), {}, InputValueError, "head_dim must be a multiple of 8"),
    "D too big": (lambda: case(d=512), {}, InputValueError, "head_dim must be a multiple of 8"),
    "k/v shapes": (lambda: (*case()[:2], torch.randn(1, 4, 17, 64, dtype=torch.bfloat16)), {},
                   InputValueError, "v must have the shape of k"),
    "last dim strided": (lambda: (torch.randn(1, 4, 16, 128, dtype=torch.bfloat16)[..., ::2],
                                  *case()[1:]), {}, InputValueError, "contiguous in its last dim"),
    "not an array": (lambda: ([[1.0]], *case()[1:]), {}, InputTypeError,
                     "q must be a torch.Tensor or cupy.ndarray"),
    "causal type": (lambda: case(), {"causal": 1}, InputTypeError, "causal must be a bool"),
    "scale type": (lambda: case(), {"scale": "0.1"}, InputTypeError, "scale must be a float"),
    "scale value": (lambda: case(), {"scale": -1.0}, InputValueError, "scale must be a finite"),
    "schedule type": (lambda: case(), {"schedule": {"tile_m": 64}}, InputTypeError,
                      "schedule must be a tiledattention.DecodeSchedule, a "
                      "tiledattention.Schedule or None"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input_is_rejected_before_any_launch(name, launches):
    make, kwargs, error, message = BAD[name]
    q, k, v = make()
    with pytest.raises(error, match=message) as exc:
        tiledattention.sdpa(q, k, v, **kwargs)
    assert launches == []
    # what Python code expects of bad arguments, and catchable as ours
    assert isinstance(exc.value, ValueError if error is InputValueError else TypeError)
    assert isinstance(exc.value, TiledAttentionError)


def test_problem_rejects_impossible_keys():
    with pytest.raises(UnsupportedProblemError, match="heads_q"):
        Problem(batch=1, heads_q=6, heads_kv=4, seqlen_q=8, seqlen_k=8, head_dim=64,
                dtype="bf16", causal=False)
    with pytest.raises(UnsupportedProblemError, match="dtype"):
        Problem(batch=1, heads_q=4, heads_kv=4, seqlen_q=8, seqlen_k=8, head_dim=64,
                dtype="fp32", causal=False)
    with pytest.raises(UnsupportedProblemError, match="seqlen_k must be a positive int"):
        Problem(batch=1, heads_q=4, heads_kv=4, seqlen_q=8, seqlen_k=0, head_dim=64,
                dtype="bf16", causal=False)


@pytest.mark.parametrize("sq, sk", [(1, 1), (5, 9), (9, 5), (17, 17), (1000, 33)])
def test_causal_flops_count_exactly_the_unmasked_pairs(sq, sk):
    p = Problem(batch=2, heads_q=3, heads_kv=3, seqlen_q=sq, seqlen_k=sk, head_dim=64,
                dtype="bf16", causal=True)
    mask = torch.ones(sq, sk, dtype=torch.bool).tril()  # torch's is_causal: top-left aligned
    assert p.attended_pairs == int(mask.sum())
    assert p.flops == 4 * 2 * 3 * 64 * int(mask.sum())


def test_runtime_memoises_resolution_per_family_problem_and_device(monkeypatch):
    import types

    import tiledattention.core._runtime as runtime_module

    monkeypatch.setattr(runtime_module, "device_info", lambda index: index)  # no GPU here
    calls = []
    runtime = Runtime(lambda family, problem, device: calls.append((family.name, problem, device))
                      or "answer")
    p = Problem(batch=1, heads_q=4, heads_kv=4, seqlen_q=8, seqlen_k=8, head_dim=64,
                dtype="bf16", causal=False)
    assert runtime.resolution(FORWARD, p, 0) == "answer"
    assert runtime.resolution(FORWARD, p, 0) == "answer"
    assert calls == [("forward", p, 0)]
    other = types.SimpleNamespace(name="other")  # another family: its own resolution
    runtime.resolution(other, p, 0)
    runtime.resolution(FORWARD, p, 1)  # another device: its own resolution
    assert calls[1:] == [("other", p, 0), ("forward", p, 1)]
    runtime.clear()
    runtime.resolution(FORWARD, p, 0)
    assert len(calls) == 4


def test_runtime_keeps_at_most_max_plans_oldest_out():
    runtime = Runtime(lambda family, problem, device: None, max_plans=2)
    assert runtime.plan("a") is None
    for name in "abc":
        runtime.keep_plan(name, name.upper())
    assert [runtime.plan(n) for n in "abc"] == [None, "B", "C"]
    runtime.clear()
    assert runtime.plan("c") is None


def test_launch_plan_carries_the_arguments_kernel_args_defines(monkeypatch):
    import math

    import tiledattention.core._device as device_module
    from tiledattention import Schedule
    from tiledattention.core._device import DeviceInfo
    from tiledattention.kernels.forward._launch import NO_LSE, UNUSED, constant_args

    device = DeviceInfo(index=0, arch="sm_90", name="NVIDIA H100 80GB HBM3", sm_count=132)
    monkeypatch.setattr(device_module, "device_info", lambda index: device)
    p = Problem(batch=2, heads_q=8, heads_kv=2, seqlen_q=300, seqlen_k=500, head_dim=64,
                dtype="bf16", causal=True)
    schedule = Schedule(tile_m=128, tile_n=64, exp2=True)

    def plan_for(problem, schedule):
        return FORWARD.plan(Call.of(problem), schedule, 0)

    plan = plan_for(p, schedule)
    assert plan.grid == (3, 16, 1)  # ceil(300 / 128) query tiles, B * H_q
    assert plan.out_shape == (2, 8, 300, 64)
    assert plan.scalars[:3] == (1 / math.sqrt(64), 8, 4)  # scale, heads_q, group size
    # no log-sum-exp, no window, softcap, sinks, ranges, work table, pages or descales
    assert plan.scalars[3:] == (NO_LSE, *(UNUSED,) * 10, *constant_args(p, schedule))

    def grid(problem, schedule):
        return plan_for(problem, schedule).grid

    # persistent: occupancy CTAs per SM, never more than the 3 x 16 work items
    persistent = schedule.replace(persistent=True, occupancy=2)
    assert grid(p, persistent) == (48, 1, 1)
    big = Problem(batch=8, heads_q=32, heads_kv=32, seqlen_q=4096, seqlen_k=4096, head_dim=64,
                  dtype="bf16", causal=False)
    assert grid(big, persistent) == (264, 1, 1)
    # paired tiles: (n-1-i, i) pairs of the 3 query tiles, so 2 work items; causal only
    paired = schedule.replace(paired_tiles=True)
    assert grid(p, paired) == (2, 16, 1)
    assert grid(p, paired.replace(persistent=True, occupancy=2)) == (32, 1, 1)
    assert grid(dataclasses.replace(p, causal=False), paired) == (3, 16, 1)


def test_launch_plan_uses_the_resolved_schedule_normalised(monkeypatch):
    """The plan of what the runtime resolved for (FORWARD, problem, device) runs it
    normalised for the problem."""
    import tiledattention.core._device as device_module
    import tiledattention.core._runtime as runtime_module
    from tiledattention import Resolution, Schedule
    from tiledattention.core._device import DeviceInfo
    from tiledattention.kernels.forward._launch import NO_LSE, UNUSED, constant_args

    device = DeviceInfo(index=0, arch="sm_90", name="NVIDIA H100 80GB HBM3", sm_count=132)
    monkeypatch.setattr(device_module, "device_info", lambda index: device)
    monkeypatch.setattr(runtime_module, "device_info", lambda index: device)
    p = Problem(batch=2, heads_q=8, heads_kv=2, seqlen_q=300, seqlen_k=500, head_dim=64,
                dtype="bf16", causal=False)
    resolved = Schedule(tile_m=128, tile_n=64, paired_tiles=True, longest_first=True)
    asked = []

    def resolve(family, problem, dev):
        asked.append((family, problem, dev))
        return Resolution(resolved, "default", "test")

    plan = FORWARD.plan(Call.of(p), Runtime(resolve).resolution(FORWARD, p, 0).schedule, 0)
    assert asked == [(FORWARD, p, device)]
    assert FORWARD.normalise(p, resolved) == Schedule(tile_m=128, tile_n=64)  # not causal
    assert plan.grid == (3, 16, 1)  # unpaired
    assert plan.scalars[3:] == (NO_LSE, *(UNUSED,) * 10,
                                *constant_args(p, FORWARD.normalise(p, resolved)))
