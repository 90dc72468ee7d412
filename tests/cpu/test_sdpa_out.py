"""``tiledattention.sdpa``'s ``out=`` and its warm path (``tiledattention.entry_points._sdpa``) on the CPU.

The real validation refuses CPU tensors before anything launches, so most tests here run with
the CPU standing in for a CUDA device (``cpu_device``): the validator's CUDA check is waived
(every other check runs), the device is an sm_90 with 132 SMs, schedules come from the family
defaults, the current stream is a number the test sets, and ``cuda.tile.launch`` records its
calls instead of launching. That is enough to see which calls validate, which take a kept plan,
what each launch gets, and what ``out`` may be.
"""

from __future__ import annotations

import inspect

import cuda.tile
import pytest
import torch

import tiledattention
import tiledattention.core._device as device_module
import tiledattention.core._plans as hot
import tiledattention.core._runtime as runtime_module
import tiledattention.entry_points._sdpa as sdpa_module
from tiledattention import InputTypeError, InputValueError, Resolution, TiledAttentionError
from tiledattention.tooling import Runtime
from tiledattention.core._device import DeviceInfo

DEVICE = DeviceInfo(index=0, arch="sm_90", name="NVIDIA H100 80GB HBM3", sm_count=132)


class Launches(list):
    """``cuda.tile.launch``'s calls: (stream, grid, kernel, args, kwargs)."""

    def __call__(self, stream, grid, kernel, args, **kwargs):
        self.append((stream, grid, kernel, args, kwargs))

    def outs(self):  # the Out argument (4th) of each launch
        return [call[3][3] for call in self]


@pytest.fixture
def launches(monkeypatch) -> Launches:
    calls = Launches()
    monkeypatch.setattr(cuda.tile, "launch", calls)
    return calls


class CpuDevice:
    """What ``cpu_device`` set up: the validations run, the stream, the runtime."""

    def __init__(self, runtime: Runtime) -> None:
        self.validations = 0
        self.stream = 7
        self.runtime = runtime


@pytest.fixture
def cpu_device(monkeypatch, launches) -> CpuDevice:
    real = sdpa_module.problem_of_arrays

    def problem_of_arrays(q, k, v, causal, scale, window=None, softcap=None, sinks=None):
        state.validations += 1  # every shape, dtype and argument check; the device's is next
        return real(q, k, v, causal, scale, window, softcap, sinks)

    def resolve(family, problem, device):
        return Resolution(family.default_schedule(device.arch, problem), "default", "test",
                          family.name)

    state = CpuDevice(Runtime(resolve))
    monkeypatch.setattr(sdpa_module, "problem_of_arrays", problem_of_arrays)
    # CPU tensors stand in for CUDA ones: the device check, the last one, passes
    monkeypatch.setattr(sdpa_module, "check_cuda", lambda arrays, kind: None)
    monkeypatch.setattr(device_module, "device_info", lambda index: DEVICE)
    monkeypatch.setattr(runtime_module, "device_info", lambda index: DEVICE)
    monkeypatch.setattr(hot, "raw_stream", lambda device: state.stream)
    monkeypatch.setattr(hot, "current_device", lambda: 0)
    monkeypatch.setattr(hot, "capturing", lambda: False)
    monkeypatch.setattr(sdpa_module, "_warm", [])
    monkeypatch.setattr(tiledattention.core._runtime, "current", state.runtime)
    return state


def qkv(b=1, hq=4, hkv=4, sq=128, sk=128, d=64, dtype=torch.bfloat16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(b, hq, sq, d, generator=gen).to(dtype),
            torch.randn(b, hkv, sk, d, generator=gen).to(dtype),
            torch.randn(b, hkv, sk, d, generator=gen).to(dtype))


def contiguous_strides(shape):
    return torch.empty(shape, device="meta").stride()


# ------------------------------------------------------------------------- the real validation
def test_out_is_keyword_only():
    parameter = inspect.signature(tiledattention.sdpa).parameters["out"]
    assert parameter.kind is inspect.Parameter.KEYWORD_ONLY and parameter.default is None


def test_cpu_inputs_with_out_fail_validation_before_any_launch(launches):
    q, k, v = qkv()
    with pytest.raises(InputValueError, match="q must be a CUDA tensor"):
        tiledattention.sdpa(q, k, v, out=torch.empty_like(q))
    assert launches == []


def test_out_on_a_differentiable_call_is_refused_before_any_launch(launches):
    q, k, v = qkv()
    q.requires_grad_(True)
    with pytest.raises(InputValueError, match="out must be None on a differentiable call") as exc:
        tiledattention.sdpa(q, k, v, out=torch.empty_like(q))
    assert isinstance(exc.value, TiledAttentionError)
    assert launches == []


# ------------------------------------------------------------------------ the forward plans
def test_a_warm_call_launches_the_kept_plan_into_a_fresh_output(cpu_device, launches):
    q, k, v = qkv()
    first = tiledattention.sdpa(q, k, v, causal=True)
    second = tiledattention.sdpa(q, k, v, causal=True)
    assert cpu_device.validations == 1  # the second call took the plan
    assert len(launches) == 2
    (s1, g1, k1, a1, _), (s2, g2, k2, a2, _) = launches
    assert (s1, g1, k1) == (s2, g2, k2) and s1 == cpu_device.stream
    assert a1[:3] == (q, k, v) and a2[:3] == (q, k, v) and a1[4:] == a2[4:]
    assert launches.outs() == [first, second]
    # never aliasing: each call's output is its own memory
    assert first.data_ptr() != second.data_ptr()
    for out in (first, second):
        assert out.shape == q.shape and out.dtype == q.dtype
        assert out.stride() == contiguous_strides(q.shape)
    assert cpu_device.runtime.sizes()[1] == 1


def test_each_call_launches_on_the_stream_current_then(cpu_device, launches):
    q, k, v = qkv()
    for stream in (7, 0, 12345678, 7):
        cpu_device.stream = stream
        tiledattention.sdpa(q, k, v)
    assert [call[0] for call in launches] == [7, 0, 12345678, 7]
    assert cpu_device.validations == 1


@pytest.mark.parametrize("sq", [1, 33, 130], ids=["decode", "decode-sparse", "forward"])
@pytest.mark.parametrize("layout", ["contiguous", "bshd view", "odd size-1 stride"])
def test_a_fresh_output_is_contiguous_whatever_q_is(cpu_device, launches, layout, sq):
    b, h, d = 2, 4, 64
    if layout == "contiguous":
        q = torch.randn(b, h, sq, d, dtype=torch.bfloat16)
    elif layout == "bshd view":
        q = torch.randn(b, sq, h, d, dtype=torch.bfloat16).transpose(1, 2)
    else:  # [B, S, H=1, D] viewed [B, 1, S, D]: contiguous, yet H's stride is D, not S*D
        h = 1
        q = torch.randn(b, sq, h, d, dtype=torch.bfloat16).transpose(1, 2)
        assert q.is_contiguous() and (sq == 1 or q.stride() != contiguous_strides(q.shape))
    k = torch.randn(b, h, 40, d, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    for _ in range(2):  # cold and warm
        out = tiledattention.sdpa(q, k, v)
        assert out.shape == q.shape and out.stride() == contiguous_strides(q.shape)
    assert cpu_device.validations == 1


def test_the_signature_keeps_types_apart(cpu_device, launches):
    """True == 1 == 1.0 hash alike: the type is in the key, so a warm call cannot skip the
    validation that rejects a bool scale or an int causal."""
    q, k, v = qkv()
    tiledattention.sdpa(q, k, v, causal=True, scale=1.0)
    with pytest.raises(InputTypeError, match="scale must be a float"):
        tiledattention.sdpa(q, k, v, causal=True, scale=True)
    with pytest.raises(InputTypeError, match="causal must be a bool"):
        tiledattention.sdpa(q, k, v, causal=1, scale=1.0)
    assert len(launches) == 1


def test_dtype_and_kv_layout_are_in_the_key(cpu_device, launches):
    q, k, v = qkv()
    tiledattention.sdpa(q, k, v)
    tiledattention.sdpa(*(x.half() for x in (q, k, v)))
    tiledattention.sdpa(q, k[:, :, :100], v[:, :, :100])  # another length: its own plan
    strided_k = torch.randn(1, 128, 4, 64, dtype=torch.bfloat16).transpose(1, 2)
    tiledattention.sdpa(q, strided_k, v)
    assert cpu_device.validations == 4 and len(launches) == 4
    tiledattention.sdpa(q, strided_k, v)
    assert cpu_device.validations == 4


def test_a_prefill_call_looks_up_one_key(cpu_device, launches):
    q, k, v = qkv()
    tiledattention.sdpa(q, k, v)
    looked = []
    plans = cpu_device.runtime.plan
    cpu_device.runtime.plan = lambda key: looked.append(key) or plans(key)
    tiledattention.sdpa(q, k, v)
    assert len(looked) == 1 and cpu_device.validations == 1


# -------------------------------------------------------------------------------- out=
def test_out_is_written_and_returned(cpu_device, launches):
    q, k, v = qkv()
    out = torch.empty_like(q)
    assert tiledattention.sdpa(q, k, v, out=out) is out
    assert tiledattention.sdpa(q, k, v, out=out) is out
    other = torch.empty_like(q)
    assert tiledattention.sdpa(q, k, v, out=other) is other  # same layout: the same plan
    assert launches.outs() == [out, out, other]
    assert cpu_device.validations == 1


def test_out_with_other_strides_gets_its_own_plan(cpu_device, launches):
    q, k, v = qkv(b=2, hq=4, sq=130)  # the forward family (few rows would go to decode)
    fresh = tiledattention.sdpa(q, k, v)
    bshd = torch.empty(2, 130, 4, 64, dtype=torch.bfloat16).transpose(1, 2)  # a view
    padded = torch.empty(2, 4, 140, 128, dtype=torch.bfloat16)[:, :, 3:133, :64]
    for out in (bshd, padded, bshd, padded):
        assert tiledattention.sdpa(q, k, v, out=out) is out
    assert cpu_device.validations == 3  # no out, bshd, padded; then both warm
    first = launches[0]
    for stream, grid, kernel, args, _ in launches[1:]:  # one kernel, grid and arguments
        assert (stream, grid, kernel) == first[:3] and args[4:] == first[3][4:]
    assert launches.outs() == [fresh, bshd, padded, bshd, padded]
    assert cpu_device.runtime.sizes()[1] == 3


def _bad_outs(q, k, v):
    """(name, out, error, message) for ``q [1, 4, 128, 64]`` bf16 and k, v like it."""
    b, h, s, d = q.shape
    return [
        ("list", [[0.0]], InputTypeError, "out must be a torch.Tensor like q; got list"),
        ("shape", torch.empty(b, h, s - 1, d, dtype=q.dtype), InputValueError,
         r"out must have q's shape \[B, H_q, S_q, D\] = \(1, 4, 128, 64\); got \(1, 4, 127, 64\)"),
        ("4 dims", torch.empty(b, h, s * d, dtype=q.dtype), InputValueError,
         "out must have q's shape"),
        ("dtype", torch.empty(b, h, s, d, dtype=torch.float16), InputTypeError,
         "out must have q's dtype torch.bfloat16; got torch.float16"),
        ("device", torch.empty(b, h, s, d, dtype=q.dtype, device="meta"), InputValueError,
         "out must be on q's device cpu; got a tensor on meta"),
        ("requires grad", torch.empty_like(q).requires_grad_(True), InputValueError,
         "out must not require grad"),
        ("last dim strided", torch.empty(b, h, s, 2 * d, dtype=q.dtype)[..., ::2],
         InputValueError, "out must be contiguous in its last dim"),
        ("expanded", torch.empty(b, 1, s, d, dtype=q.dtype).expand(b, h, s, d),
         InputValueError, "out must not overlap itself"),
        ("rows overlap", torch.empty(b * h * s * d, dtype=q.dtype).as_strided(
            (b, h, s, d), (h * s * d, s * d, d // 2, 1)), InputValueError,
         "out must not overlap itself"),
        ("is q", q, InputValueError, "out must not overlap q"),
        ("in k", k.view(b, h, s, d), InputValueError, "out must not overlap k"),
        ("shares one byte with v", None, InputValueError, "out must not overlap v"),  # below
    ]


@pytest.mark.parametrize("index", range(12), ids=[c[0] for c in _bad_outs(*qkv())])
def test_a_bad_out_is_refused_before_any_launch(cpu_device, launches, index):
    q, k, v = qkv()
    name, out, error, message = _bad_outs(q, k, v)[index]
    if out is None:  # one buffer: v, then out starting at v's last element
        buffer = torch.empty(2 * q.numel(), dtype=q.dtype)
        v = buffer[:v.numel()].view(v.shape)
        out = buffer[v.numel() - 1:v.numel() - 1 + q.numel()].view(q.shape)
    with pytest.raises(error, match=message) as exc:
        tiledattention.sdpa(q, k, v, out=out)
    assert "out" in str(exc.value) and isinstance(exc.value, TiledAttentionError)
    assert launches == []


def test_overlap_is_caught_on_a_warm_signature(cpu_device, launches):
    """The overlap depends on addresses, not on the layouts in the key: every call checks it."""
    q, k, v = qkv()
    tiledattention.sdpa(q, k, v, out=torch.empty_like(q))  # warms q's layout as out's
    for out in (q, k.view(q.shape), v.view(q.shape)):
        with pytest.raises(InputValueError, match="out must not overlap"):
            tiledattention.sdpa(q, k, v, out=out)
    assert len(launches) == 1


def test_out_of_another_library_is_refused(cpu_device, launches):
    np = pytest.importorskip("numpy")
    q, k, v = qkv()
    with pytest.raises(InputTypeError, match="out must be a torch.Tensor like q; got ndarray"):
        tiledattention.sdpa(q, k, v, out=np.empty((1, 4, 128, 64), dtype=np.float16))
    assert launches == []


# ------------------------------------------------------------------------------- decode plans
def decode_qkv(sk=4096, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 32, 1, 128, generator=gen).to(torch.bfloat16)
    k = torch.randn(1, 8, sk, 128, generator=gen).to(torch.bfloat16)
    return q, k, torch.randn_like(k)


def test_a_decode_bucket_reuses_its_plan_with_and_without_out(cpu_device, launches):
    q, k, v = decode_qkv()
    first = tiledattention.sdpa(q, k, v)
    per_call = len(launches)  # the split kernel, and the combine with several splits
    assert per_call in (1, 2) and dict(sdpa_module._warm) == {tiledattention.DECODE: 1}
    longer_k, longer_v = decode_qkv(sk=4100, seed=1)[1:]
    second = tiledattention.sdpa(q, longer_k, longer_v)  # same bucket: the same plan
    assert cpu_device.validations == 1
    assert first.data_ptr() != second.data_ptr() and second.shape == q.shape
    split_args = launches[per_call][3]
    assert split_args[1] is longer_k and split_args[2] is longer_v
    out = torch.empty_like(q)
    assert tiledattention.sdpa(q, k, v, out=out) is out
    assert tiledattention.sdpa(q, longer_k, longer_v, out=out) is out
    assert cpu_device.validations == 2  # out's layout: one more signature
    # the output view the kernels write is out's memory
    assert launches[-per_call][3][3].data_ptr() == out.data_ptr()
    with pytest.raises(InputValueError, match="out must not overlap k"):
        tiledattention.sdpa(q, k, v, out=k.flatten()[:q.numel()].view(q.shape))
    assert len(launches) == 4 * per_call


def test_a_decode_plan_makes_short_queries_look_up_decode_keys_first(cpu_device, launches):
    q, k, v = decode_qkv()
    tiledattention.sdpa(q, k, v)
    prefill = qkv(sq=128)
    looked = []
    plans = cpu_device.runtime.plan
    cpu_device.runtime.plan = lambda key: looked.append(key) or plans(key)
    tiledattention.sdpa(*prefill)  # 128 rows > any decode plan's, and no forward plan yet
    assert looked == []
    tiledattention.sdpa(*prefill)  # the forward key, found; still no decode lookup
    assert len(looked) == 1
    tiledattention.sdpa(q, k, v)
    assert len(looked) == 2  # the decode key, found first (decode is asked before forward)


def test_decode_scratch_buffers_are_kept_per_device_stream_and_thread(cpu_device, launches,
                                                                      monkeypatch):
    q, k, v = decode_qkv()
    schedule = tiledattention.DecodeSchedule(splits=4, tile_n=128)

    def scratch():  # the (Opart, Lse) of a call's launches
        before = len(launches)
        tiledattention.sdpa(q, k, v, schedule=schedule)
        assert len(launches) == before + 2  # the split kernel, then the combine
        split_args, combine_args = launches[-2][3], launches[-1][3]
        assert combine_args[0] is split_args[4] and combine_args[1] is split_args[5]
        return split_args[4], split_args[5]

    # the warm path's device is q.get_device(): -1 for these CPU tensors
    monkeypatch.setattr(hot, "current_device", lambda: -1)
    scratch()  # the validating call
    first = scratch()
    opart, lse = first
    assert opart.dtype == lse.dtype == torch.float32
    assert opart.shape == (8, 4, 16, 128) and lse.shape == (8, 4, 16)
    assert all(a is b for a, b in zip(scratch(), first))  # kept: one stream's calls in order
    cpu_device.stream = 8  # another stream: its own set, and the first is still kept
    assert not any(a is b for a, b in zip(scratch(), first))
    cpu_device.stream = 7
    assert scratch()[0] is opart
    import threading  # another thread on the same stream: its own set

    found = []
    thread = threading.Thread(target=lambda: found.append(scratch()))
    thread.start()
    thread.join()
    assert not any(a is b for a, b in zip(found[0], first))
    monkeypatch.setattr(hot, "capturing", lambda: True)  # a graph: fresh each call
    captured = scratch(), scratch()
    assert captured[0][0] is not captured[1][0]
    assert not any(a is b for a, b in zip(captured[0], first))
    monkeypatch.setattr(hot, "capturing", lambda: False)
    monkeypatch.setattr(hot, "current_device", lambda: 1)  # q is not on it: fresh
    assert scratch()[0] is not opart
    monkeypatch.setattr(hot, "current_device", lambda: -1)
    assert scratch()[0] is opart
    cpu_device.runtime.clear()
    scratch()  # the validating call again
    kept = scratch()
    assert kept[0] is not opart and scratch()[0] is kept[0]
    own = tiledattention.sdpa(q, k, v, schedule=schedule, keep_scratch=False)  # the torch op's
    assert launches[-1][3][0] is not kept[0] and launches[-1][3][1] is not kept[1]
    assert own.shape == q.shape and scratch()[0] is kept[0]  # and the kept set stays


def test_the_runtime_keeps_a_bounded_number_of_workspaces():
    runtime = Runtime(lambda *a: None, max_workspaces=2)
    for key in "abc":
        runtime.keep_workspace(key, key.upper())
    assert runtime.workspace("a") is None and runtime.workspace("c") == "C"
    runtime.clear()
    assert runtime.workspace("c") is None


# --------------------------------------------------------------------------------- helpers
def test_layout_helpers():
    overlapping = sdpa_module._self_overlapping
    assert not overlapping((2, 4, 8, 64), (2048, 512, 64, 1))
    assert not overlapping((2, 4, 8, 64), (2048, 64, 256, 1))  # [B, S, H, D] viewed
    assert not overlapping((2, 4, 8, 64), (4096, 1024, 128, 1))  # padded rows
    assert overlapping((2, 4, 8, 64), (2048, 0, 64, 1))
    assert overlapping((2, 4, 8, 64), (2048, 512, 32, 1))
    assert not overlapping((1, 1, 1, 64), (0, 0, 0, 1))  # size-1 dims: any stride
    assert not overlapping((2, 4, 8, 64), (-2048, 512, 64, 1))  # CuPy: negative strides
    byte_range = sdpa_module._byte_range
    assert byte_range((2, 3), (3, 1), 2, 1000) == (1000, 1012)
    assert byte_range((2, 3), (-3, 1), 2, 1000) == (994, 1006)
    assert byte_range((1, 3), (-3, 1), 2, 1000) == (1000, 1006)


# ------------------------------------------------------------ the torch op under torch.compile
def test_compiled_attention_has_no_python_guard_of_ours(monkeypatch):
    """Every guard a compiled call of ``integrations.attention`` evaluates is a C++ one: no
    Python lambda over tiledattention's modules (one came from reading ``torch`` through the
    globals of two of them), so the per-call guard check stays cheap."""
    import tiledattention.integrations as ti

    try:
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    except ImportError:
        pytest.skip("this torch has no _debug_get_cache_entry_list")
    monkeypatch.setattr(tiledattention, "sdpa", lambda q, k, v, causal=False, scale=None, **kw:
                        torch.empty_like(q))

    def decode_step(q, k, v):
        return ti.attention(q, k, v, True)

    torch._dynamo.reset()
    try:
        with torch.no_grad():
            torch.compile(decode_step, backend="eager", fullgraph=True)(*decode_qkv(sk=64))
        entries = _debug_get_cache_entry_list(decode_step.__code__)
        assert len(entries) == 1
        guards = str(entries[0].guard_manager)
    finally:
        torch._dynamo.reset()
    lambdas = [line for line in guards.splitlines() if "LAMBDA_GUARD" in line]
    assert not [line for line in lambdas if "tiledattention" in line], lambdas


# ------------------------------------------------------------------ a family sdpa never named
class _MeanPlan(tiledattention.Plan):
    """The toy family's plan: each output row is the mean of V's rows (attention with equal
    scores), computed by torch on the CPU."""

    def __init__(self, out_shape, group):
        self.out_shape, self.group = out_shape, group

    def for_torch(self, q, out, k, v):
        return self

    def run(self, runtime, q, k, v, device, out):
        mean = v.float().mean(dim=2, keepdim=True).repeat_interleave(self.group, dim=1)
        result = mean.expand(self.out_shape).to(q.dtype)
        if out is None:
            return result.clone()
        out.copy_(result)
        return out

    def run_cupy(self, q, k, v, out, problem):
        raise tiledattention.UnsupportedOperationError("the toy plan runs on torch only")


class _MeanFamily(type(tiledattention.FORWARD)):
    """A third attention family that takes head dim 40 calls ahead of every other."""

    name = "mean_toy"
    serves = ("sdpa",)
    dispatch_priority = 100
    planned: list = []

    def takes(self, arch, problem):
        return problem.head_dim == 40

    def why_taken(self, arch, problem):
        return f"head_dim {problem.head_dim} {'is' if self.takes(arch, problem) else 'is not'} 40"

    def plan(self, call, schedule, device_index):
        problem = call.problem
        self.planned.append((problem, schedule))
        return _MeanPlan((problem.batch, problem.heads_q, problem.seqlen_q, problem.head_dim),
                         problem.group_size)


@pytest.fixture
def mean_family():
    family = tiledattention.register_family(_MeanFamily())
    yield family
    tiledattention.unregister_family(family.name)


def test_a_registered_family_serves_sdpa_with_no_edit_of_the_entry_points(cpu_device, launches,
                                                                          mean_family):
    """Registering a family that serves "sdpa" is all it takes: ``choose_family`` asks it
    first, the runtime resolves its schedule, its plan runs and is kept for warm calls; calls
    it does not take go on to the families below it."""
    q, k, v = qkv(hq=4, hkv=2, d=40)
    expected = v.float().mean(2, keepdim=True).repeat_interleave(2, 1).expand(q.shape)
    out = tiledattention.sdpa(q, k, v)
    assert torch.equal(out, expected.to(q.dtype)) and launches == []
    assert tiledattention.sdpa(q, k, v).shape == q.shape  # warm: the kept plan
    assert len(mean_family.planned) == 1 and cpu_device.validations == 1
    problem, schedule = mean_family.planned[0]
    assert schedule == mean_family.default_schedule("sm_90", problem)  # the runtime resolved it
    family, why = tiledattention.explain_choice("sm_90", problem)
    assert family is mean_family and why == "head_dim 40 is 40"
    tiledattention.sdpa(*qkv(d=64))  # not its call: the forward kernel launches
    assert len(launches) == 1 and len(mean_family.planned) == 1


def test_a_decode_plan_keeps_the_callers_bottom_right_alignment(cpu_device, launches):
    """At S_q == S_k bottom-right is top-left, and the problem's canonical form drops it; the
    plan kept for that length's bucket must still offset a longer cache of the same bucket by
    S_k - S_q, as the caller asked."""
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, 32, 4, 128, generator=gen).to(torch.bfloat16)
    offsets = []
    for sk in (4, 5):  # one bucket: the second call reuses the first call's plan
        k = torch.randn(1, 8, sk, 128, generator=gen).to(torch.bfloat16)
        before = len(launches)
        tiledattention.sdpa(q, k, torch.randn_like(k), causal="bottom_right")
        offsets.append(launches[before][3][7])  # the split kernel's causal offset
    assert cpu_device.validations == 1 and offsets == [0, 1]
