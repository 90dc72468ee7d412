"""FP8 (e4m3) attention on the GPU: ``tiledattention.sdpa`` of float8_e4m3fn q, k, v with
descale factors, against the float32 attention of the dequantised inputs.

Grouped and multi-query heads, D 64/128/256 and a split head dim (96), odd lengths with S_q !=
S_k in both causal alignments, per-tensor and per-(batch, head) factors, P·V in e4m3 and in
bf16 (``pv_wide``), windows, softcaps and sinks, decode-shaped calls, heavy-tailed inputs, the
family's tuner case. Outputs are NaN-poisoned (``out=``) before each call; errors are relative
L2. The tolerances are the family's (5e-2) for P·V in e4m3 and 1e-2 for bf16 P·V (measured
2.1-2.5e-2 and 2.1e-3 on an H200, ``docs/records/benchmarks/fp8``).
"""

from __future__ import annotations

import pytest
import torch

import tiledattention as ta
from tiledattention import FORWARD, Problem
from tiledattention.core._reference import attention_reference
from tiledattention.tooling import dequantise_fp8, quantise_fp8

from ._reference import rel_l2

pytestmark = pytest.mark.gpu

E4M3_TOL = FORWARD.tolerances["e4m3"]
WIDE_TOL = 1e-2


def _arch() -> str:
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


def _problem(b, hq, hkv, sq, sk, d, causal=False, **variant) -> Problem:
    return Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=sq, seqlen_k=sk, head_dim=d,
                   dtype="e4m3", causal=causal, **variant)


def _inputs(problem: Problem, seed: int = 0, heavy: bool = False):
    """e4m3 q, k, v and their [B, H_kv] descale factors (random; ``heavy``: Student-t with
    3 degrees of freedom, the outliers FP8 quantisation meets in real activations)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def rand(heads, seqlen):
        shape = (problem.batch, heads, seqlen, problem.head_dim)
        x = torch.randn(shape, device="cuda", generator=gen)
        if heavy:
            chi2 = sum(torch.randn(shape, device="cuda", generator=gen) ** 2 for _ in range(3))
            x = x / (chi2 / 3).sqrt()
        return x

    raw = [rand(problem.heads_q, problem.seqlen_q), rand(problem.heads_kv, problem.seqlen_k),
           rand(problem.heads_kv, problem.seqlen_k)]
    quantised = [quantise_fp8(x, problem.heads_kv) for x in raw]
    return [x for x, _ in quantised], [d for _, d in quantised]


def _reference(problem, values, descales, sinks=None, scale=None):
    q, k, v = (dequantise_fp8(x, d) for x, d in zip(values, descales))
    return attention_reference(q, k, v, problem, scale=scale, sinks=sinks)


def _causal_arg(problem):
    if not problem.causal:
        return False
    return "bottom_right" if problem.bottom_right else True


def _call(problem, values, descales, schedule=None, **kwargs):
    q, k, v = values
    out = torch.full(q.shape, float("nan"), dtype=torch.bfloat16, device="cuda")
    result = ta.sdpa(q, k, v, _causal_arg(problem), q_descale=descales[0],
                     k_descale=descales[1], v_descale=descales[2], schedule=schedule, out=out,
                     **kwargs)
    assert result is out
    assert not torch.isnan(out).any()
    return out


CASES = [
    _problem(2, 8, 2, 1000, 1000, 128, causal=True),  # GQA 4, odd length
    _problem(1, 16, 16, 2048, 2048, 128),  # MHA, whole tiles
    _problem(2, 14, 2, 777, 1537, 128, causal=True, bottom_right=True),  # GQA 7, S_q < S_k
    _problem(1, 8, 1, 1500, 1023, 64, causal=True, bottom_right=True),  # MQA, S_q > S_k
    _problem(2, 8, 8, 513, 513, 256, causal=True),  # D 256
    _problem(1, 8, 4, 700, 1100, 192),  # D 192 (128 + 64), full, S_q != S_k
    _problem(1, 12, 4, 900, 900, 96),  # a split head dim, full
    _problem(3, 8, 2, 4, 3001, 128, causal=True, bottom_right=True),  # decode-shaped
]


@pytest.mark.parametrize("problem", CASES, ids=lambda p: p.describe())
@pytest.mark.parametrize("wide, fast", [(False, None), (True, None), (False, True),
                                        (False, False), (True, True)],
                         ids=["pv_e4m3", "pv_bf16", "pv_e4m3-fast_acc", "pv_e4m3-exact_acc",
                              "pv_bf16-fast_acc"])
def test_fp8_sdpa_matches_the_dequantised_reference(problem, wide, fast):
    """The lookup's schedule (``fast``: None), and the default with ``pv_wide`` and with the
    e4m3 products accumulated in the tensor core's precision (``fast_acc``) or in float32."""
    values, descales = _inputs(problem)
    schedule = FORWARD.default_schedule(_arch(), problem).replace(pv_wide=wide)
    if fast is not None:
        schedule = schedule.replace(fast_acc=fast)
    explicit = wide or fast is not None
    out = _call(problem, values, descales, schedule=schedule if explicit else None)
    err = rel_l2(out, _reference(problem, values, descales))
    assert err < (WIDE_TOL if wide else E4M3_TOL), err


def test_fp8_descale_factors_per_tensor_and_per_head_are_applied():
    """Inputs whose real sizes differ by (batch, K/V head) up to 16x, quantised per head (the
    factors differ as much), then per tensor (a 0-dim factor): a factor applied to the wrong
    head or batch entry, or not at all, moves the output far past the tolerance."""
    problem = _problem(2, 8, 4, 640, 640, 128, causal=True)
    gen = torch.Generator(device="cuda").manual_seed(5)
    reals = []
    for heads, seqlen in ((8, 640), (4, 640), (4, 640)):
        size = torch.rand(2, 4, device="cuda", generator=gen) * 3.75 + 0.25  # per K/V head
        x = torch.randn(2, heads, seqlen, 128, device="cuda", generator=gen)
        reals.append(x * size.repeat_interleave(heads // 4, 1)[:, :, None, None])
    per_head = [quantise_fp8(x, 4) for x in reals]
    values, descales = [x for x, _ in per_head], [d for _, d in per_head]
    assert (descales[0].max() / descales[0].min()) > 4  # the factors do differ
    ref = _reference(problem, values, descales)
    assert rel_l2(_call(problem, values, descales), ref) < E4M3_TOL
    per_tensor = [x.abs().amax() / 448.0 for x in reals]  # 0-dim float32 factors
    flat = [(x / t).to(torch.float8_e4m3fn) for x, t in zip(reals, per_tensor)]
    ref_flat = _reference(problem, flat, [t.expand(2, 4) for t in per_tensor])
    assert rel_l2(_call(problem, flat, per_tensor), ref_flat) < E4M3_TOL
    # v's factor doubled doubles the output
    doubled = _call(problem, flat, [per_tensor[0], per_tensor[1], per_tensor[2] * 2])
    assert rel_l2(doubled, 2 * ref_flat) < E4M3_TOL


@pytest.mark.parametrize("variant", [dict(window=(100, 0)), dict(softcap=20.0),
                                     dict(sinks=True)], ids=["window", "softcap", "sinks"])
def test_fp8_variants(variant):
    extra = {}
    if "window" in variant:
        problem = _problem(2, 8, 2, 1100, 1100, 128, causal=True, window_left=100)
        extra["window"] = variant["window"]
    elif "softcap" in variant:
        problem = _problem(2, 8, 2, 1100, 1100, 128, softcap=20.0)
        extra["softcap"] = 20.0
    else:
        problem = _problem(2, 8, 2, 1100, 1100, 128, causal=True, sinks=True)
        extra["sinks"] = torch.randn(8, device="cuda") + 2.0
    values, descales = _inputs(problem, seed=7)
    out = _call(problem, values, descales, **extra)
    err = rel_l2(out, _reference(problem, values, descales, sinks=extra.get("sinks")))
    assert err < E4M3_TOL, err


def test_fp8_heavy_tailed_inputs_stay_within_tolerance():
    """Student-t inputs (outliers stretch each head's factor, so most values use few of e4m3's
    exponents): the error against the dequantised reference stays within the family's
    tolerance (what the README quotes)."""
    problem = _problem(1, 16, 4, 2048, 2048, 128, causal=True)
    values, descales = _inputs(problem, seed=11, heavy=True)
    err = rel_l2(_call(problem, values, descales), _reference(problem, values, descales))
    assert err < E4M3_TOL, err


def test_fp8_scale_argument_is_applied():
    problem = _problem(1, 8, 2, 700, 700, 64)
    values, descales = _inputs(problem, seed=2)
    out = _call(problem, values, descales, scale=0.05)
    assert rel_l2(out, _reference(problem, values, descales, scale=0.05)) < E4M3_TOL


def test_fp8_family_case_checks_the_default_schedule():
    """The tuner's case of an e4m3 problem: quantised inputs, the dequantised reference and a
    launcher that transposes the values; the default schedule passes its correctness gate."""
    problem = _problem(2, 8, 2, 1024, 1024, 128, causal=True)
    case = FORWARD.case(problem, torch.cuda.current_device())
    assert case.q.dtype == torch.float8_e4m3fn and case.out.dtype == torch.bfloat16
    schedule = FORWARD.default_schedule(_arch(), problem)
    assert case.error(case.launcher(schedule)) < E4M3_TOL


# -- an FP8 K/V cache under bf16 / fp16 queries (the decode family) ------------------------------

CACHE_CASES = [
    # (B, H_q, H_kv, S_q, S_k, D, query dtype): one split and many, GQA 4/7/8, MQA, S_q > 1
    (1, 32, 8, 1, 32768, 128, torch.bfloat16),
    (4, 28, 4, 1, 3001, 128, torch.bfloat16),
    (2, 8, 1, 4, 5000, 64, torch.float16),
    (2, 16, 8, 1, 4097, 256, torch.bfloat16),
    (16, 32, 8, 1, 1999, 128, torch.bfloat16),
]


def _cache(b, hq, hkv, sq, sk, d, dtype, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, hq, sq, d, device="cuda", generator=gen).to(dtype)
    reals = [torch.randn(b, hkv, sk, d, device="cuda", generator=gen) * (1 + h)
             for h in range(2)]
    (k, kd), (v, vd) = (quantise_fp8(x, hkv) for x in reals)
    return q, k, v, kd, vd


@pytest.mark.parametrize("shape", CACHE_CASES, ids=lambda s: f"B{s[0]}H{s[1]}/{s[2]}"
                         f"Sq{s[3]}Sk{s[4]}D{s[5]}-{str(s[6])[6:]}")
def test_fp8_cache_decode_matches_the_dequantised_reference(shape):
    b, hq, hkv, sq, sk, d, dtype = shape
    q, k, v, kd, vd = _cache(*shape)
    problem = Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=sq, seqlen_k=sk, head_dim=d,
                      dtype="bf16" if dtype == torch.bfloat16 else "fp16", causal=sq > 1,
                      bottom_right=sq > 1, kv_dtype="e4m3")
    out = torch.full_like(q, float("nan"))
    result = ta.sdpa(q, k, v, "bottom_right" if sq > 1 else False, k_descale=kd, v_descale=vd,
                     out=out)
    assert result is out and not torch.isnan(out).any()
    ref = attention_reference(q, dequantise_fp8(k, kd), dequantise_fp8(v, vd), problem)
    assert rel_l2(out, ref) < ta.DECODE.tolerances[problem.dtype]
    # it ran the decode family's kernels, and the factors matter
    assert ta.explain(q, k, v, "bottom_right" if sq > 1 else False).family == "decode"
    doubled = ta.sdpa(q, k, v, "bottom_right" if sq > 1 else False, k_descale=kd,
                      v_descale=vd * 2)
    assert rel_l2(doubled, 2 * ref) < ta.DECODE.tolerances[problem.dtype]


def test_fp8_cache_decode_variants_and_per_tensor_factors():
    """A window and sinks over an FP8 cache, with 0-dim (per-tensor) factors."""
    b, hq, hkv, sk, d = 2, 16, 4, 6000, 128
    gen = torch.Generator(device="cuda").manual_seed(9)
    q = torch.randn(b, hq, 1, d, device="cuda", generator=gen).to(torch.bfloat16)
    reals = [torch.randn(b, hkv, sk, d, device="cuda", generator=gen) for _ in range(2)]
    factors = [x.abs().amax() / 448.0 for x in reals]
    k, v = ((x / f).to(torch.float8_e4m3fn) for x, f in zip(reals, factors))
    sinks = torch.randn(hq, device="cuda", generator=gen) + 2.0
    problem = Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=1, seqlen_k=sk, head_dim=d,
                      dtype="bf16", causal=True, bottom_right=True, window_left=511,
                      sinks=True, kv_dtype="e4m3")
    out = ta.sdpa(q, k, v, "bottom_right", window=(511, 0), sinks=sinks,
                  k_descale=factors[0], v_descale=factors[1])
    ref = attention_reference(q, k.float() * factors[0], v.float() * factors[1], problem,
                              sinks=sinks)
    assert rel_l2(out, ref) < ta.DECODE.tolerances["bf16"]


def test_fp8_cache_decode_of_queries_beyond_float16s_range():
    """The split kernel widens an e4m3 cache's value tiles (and P) to float16, not the
    scores' operands: a group whose query heads range from past float16's largest value
    (65504) to far below it attends as the float32 reference does (with the queries cast
    to float16 as they come, the first head's scores are inf and its output NaN)."""
    b, hq, hkv, sk, d = 2, 8, 2, 3001, 128
    gen = torch.Generator(device="cuda").manual_seed(11)
    size = torch.tensor([3e5, 1e-3, 1.0, 40.0], device="cuda").repeat(hkv)  # per query head
    q = (torch.randn(b, hq, 1, d, device="cuda", generator=gen)
         * size[None, :, None, None]).to(torch.bfloat16)
    reals = [torch.randn(b, hkv, sk, d, device="cuda", generator=gen) for _ in range(2)]
    (k, kd), (v, vd) = (quantise_fp8(x, hkv) for x in reals)
    problem = Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=1, seqlen_k=sk, head_dim=d,
                      dtype="bf16", causal=False, kv_dtype="e4m3")
    out = ta.sdpa(q, k, v, k_descale=kd, v_descale=vd)
    ref = attention_reference(q, dequantise_fp8(k, kd), dequantise_fp8(v, vd), problem)
    assert not torch.isnan(out).any()
    for head in range(hq):  # each head on its own: their outputs differ in scale
        assert rel_l2(out[:, head], ref[:, head]) < ta.DECODE.tolerances["bf16"], head


def test_fp8_cache_family_case_checks_the_default_schedule():
    problem = Problem(batch=2, heads_q=32, heads_kv=8, seqlen_q=1, seqlen_k=8192,
                      head_dim=128, dtype="bf16", causal=False, kv_dtype="e4m3")
    case = ta.DECODE.case(problem, torch.cuda.current_device())
    assert case.k.dtype == torch.float8_e4m3fn and case.q.dtype == torch.bfloat16
    schedule = ta.DECODE.default_schedule(_arch(), problem)
    assert case.error(case.launcher(schedule)) < ta.DECODE.tolerances["bf16"]


def test_a_repeated_fp8_call_runs_its_kept_plan(monkeypatch):
    """The second call of a signature skips validation and lookup (a failing validation
    would raise) and gives the first call's output; a decode loop whose FP8 cache grows by a
    key a step keeps one plan for the band; a changed factor layout validates again."""
    from tiledattention.entry_points import _fp8

    problem = _problem(2, 8, 2, 700, 700, 128, causal=True)
    values, descales = _inputs(problem, seed=4)
    q, k, v = values
    first = ta.sdpa(q, k, v, True, q_descale=descales[0], k_descale=descales[1],
                    v_descale=descales[2])

    def refuse(*args, **kwargs):
        raise AssertionError("validated again")

    monkeypatch.setattr(_fp8, "_check_inputs", refuse)
    again = ta.sdpa(q, k, v, True, q_descale=descales[0], k_descale=descales[1],
                    v_descale=descales[2])
    assert torch.equal(first, again)
    with pytest.raises(AssertionError, match="validated again"):  # per-tensor: a new layout
        ta.sdpa(q, k, v, True, q_descale=descales[0][0, 0])
    monkeypatch.undo()
    # a growing FP8 cache: one validation, then the band's plan
    q1, k8, v8, kd, vd = _cache(1, 32, 8, 1, 1100, 128, torch.bfloat16, seed=6)
    ta.sdpa(q1, k8[:, :, :1000], v8[:, :, :1000], k_descale=kd, v_descale=vd)
    monkeypatch.setattr(_fp8, "_check_inputs", refuse)
    for n in (1001, 1050, 1100):
        out = ta.sdpa(q1, k8[:, :, :n], v8[:, :, :n], k_descale=kd, v_descale=vd)
        problem = Problem(batch=1, heads_q=32, heads_kv=8, seqlen_q=1, seqlen_k=n,
                          head_dim=128, dtype="bf16", causal=False, kv_dtype="e4m3")
        ref = attention_reference(q1, dequantise_fp8(k8[:, :, :n], kd),
                                  dequantise_fp8(v8[:, :, :n], vd), problem)
        assert rel_l2(out, ref) < ta.DECODE.tolerances["bf16"]
