"""FP8 attention without a GPU: the problem's FP8 fields, dispatch (FP8 inputs to the forward,
an FP8 K/V cache to decode, neither before Hopper), the forward's FP8 constants, schedule
field and search space, compile-only builds for every architecture that has FP8 (and the
e4m3 tensor-core instruction on sm_90), the transposed values' layout, and ``sdpa``'s errors
for bad FP8 arguments, each before any launch."""

from __future__ import annotations

import re

import pytest
import torch

import tiledattention as ta
from tiledattention import (BACKWARD, DECODE, FORWARD, InputTypeError, InputValueError, Problem,
                            Schedule, UnsupportedOperationError, UnsupportedProblemError,
                            choose_family)
from tiledattention.kernels.decode._launch import split_constants
from tiledattention.kernels.forward._launch import (VALUE_ROW_ALIGN, kernel_constants,
                                                    normalise, transpose_values)

from .test_backward_atomic import _sass

E4M3 = torch.float8_e4m3fn
FP8_ARCHES = ("sm_90", "sm_100", "sm_120", "sm_121")


def _problem(**fields) -> Problem:
    base = dict(batch=2, heads_q=8, heads_kv=2, seqlen_q=1000, seqlen_k=1000, head_dim=128,
                dtype="e4m3", causal=True)
    return Problem(**{**base, **fields})


STEP = dict(seqlen_q=1, seqlen_k=30000, causal=False)


# -- the problem -----------------------------------------------------------------------------

def test_an_fp8_cache_is_a_kv_dtype_under_16_bit_queries():
    p = _problem(dtype="bf16", kv_dtype="e4m3", **STEP)
    assert p.kv_dtype == "e4m3" and "kv-e4m3" in p.describe()
    assert Problem.from_dict(p.to_dict()) == p
    assert "kv_dtype" not in _problem().to_dict()  # stored keys of other problems unchanged
    for dtype, kv in (("e4m3", "e4m3"), ("bf16", "bf16"), ("bf16", "e5m2")):
        with pytest.raises(UnsupportedProblemError, match="kv_dtype must be"):
            _problem(dtype=dtype, kv_dtype=kv)


# -- dispatch --------------------------------------------------------------------------------

def test_fp8_inputs_go_to_the_forward_and_an_fp8_cache_to_decode():
    assert choose_family("sm_90", _problem()) is FORWARD
    assert choose_family("sm_90", _problem(**STEP)) is FORWARD  # decode takes no FP8 queries
    assert choose_family("sm_90", _problem(dtype="bf16", kv_dtype="e4m3", **STEP)) is DECODE
    assert choose_family("sm_100", _problem(dtype="fp16", kv_dtype="e4m3", **STEP)) is DECODE


def test_what_no_family_runs_is_refused_with_the_reasons():
    with pytest.raises(UnsupportedOperationError, match="reads K and V in the queries' dtype"):
        choose_family("sm_90", _problem(dtype="bf16", kv_dtype="e4m3", seqlen_q=4096,
                                        seqlen_k=4096))  # prefill over an FP8 cache
    with pytest.raises(UnsupportedOperationError, match="backward family takes dtype bf16 or "
                                                        "fp16; got e4m3"):
        choose_family("sm_90", _problem(), "sdpa_backward")
    with pytest.raises(UnsupportedOperationError, match="dense"):
        choose_family("sm_90", _problem(ragged=True))


@pytest.mark.parametrize("arch", ["sm_80", "sm_86", "sm_89"])
def test_fp8_needs_hopper_or_later(arch):
    for problem in (_problem(), _problem(dtype="bf16", kv_dtype="e4m3", **STEP)):
        with pytest.raises(UnsupportedOperationError, match="FP8 attention needs sm_90"):
            choose_family(arch, problem)
    with pytest.raises(UnsupportedProblemError, match="FP8 attention needs sm_90"):
        FORWARD.compile(_problem(), Schedule(), arch)
    with pytest.raises(UnsupportedProblemError, match="FP8 attention needs sm_90"):
        DECODE.compile(_problem(dtype="bf16", kv_dtype="e4m3", **STEP),
                       DECODE.default_schedule("sm_90", _problem(dtype="bf16", **STEP)), arch)


# -- constants, schedule, search space -------------------------------------------------------

def test_fp8_constants_follow_the_problem_and_pv_wide():
    s = Schedule(tile_m=128, tile_n=128)
    c = kernel_constants(_problem(), s)
    assert (c["FP8"], c["V_TRANSPOSED"], c["PV_WIDE"]) == (True, True, False)
    c = kernel_constants(_problem(), s.replace(pv_wide=True))
    assert c["PV_WIDE"] is True
    bf16 = _problem(dtype="bf16")
    assert normalise(bf16, s.replace(pv_wide=True)) == s  # no narrower P·V to widen
    c = kernel_constants(bf16, s)
    assert (c["FP8"], c["V_TRANSPOSED"], c["PV_WIDE"]) == (False, False, False)
    assert Schedule.from_dict(s.replace(pv_wide=True).to_dict()).pv_wide is True
    assert "pv_wide" not in s.to_dict()  # rows stored before it keep their keys
    step = _problem(dtype="bf16", **STEP)
    schedule = DECODE.default_schedule("sm_90", step)
    assert split_constants(step, schedule)["KV_FP8"] is False
    assert split_constants(_problem(dtype="bf16", kv_dtype="e4m3", **STEP),
                           schedule)["KV_FP8"] is True


def test_fast_acc_reaches_the_kernel_of_fp8_problems_only():
    s = Schedule(tile_m=128, tile_n=128)
    assert kernel_constants(_problem(), s)["FAST_ACC"] is False
    assert kernel_constants(_problem(), s.replace(fast_acc=True))["FAST_ACC"] is True
    bf16 = _problem(dtype="bf16")
    assert normalise(bf16, s.replace(fast_acc=True)) == s  # no e4m3 product to accumulate
    assert kernel_constants(bf16, s.replace(fast_acc=True))["FAST_ACC"] is False
    assert Schedule.from_dict(s.replace(fast_acc=True).to_dict()).fast_acc is True
    assert "fast_acc" not in s.to_dict()  # rows stored before it keep their keys
    assert "fast_acc" in s.replace(fast_acc=True).describe()


def test_the_fp8_search_space_has_256_key_steps_and_pv_wide():
    from search_spaces.forward import FORWARD_SPACE, restricted

    space = FORWARD_SPACE.spaces["full"]("sm_90")
    fp8 = restricted(space, _problem(causal=False))
    assert 256 in fp8.choices["tile_n"] and fp8.choices["pv_wide"] == (False, True)
    assert fp8.choices["fast_acc"] == (False, True)
    bf16 = restricted(space, _problem(dtype="bf16", causal=False))
    assert 256 not in bf16.choices["tile_n"] and "pv_wide" not in bf16.choices
    assert "fast_acc" not in bf16.choices


def test_fp8_defaults_accumulate_in_the_tensor_core_on_hopper_only():
    """sm_90: ``fast_acc`` (measured faster with the same error), and at D 256 tiles without a
    cluster (the e4m3 kernel spilled there with float32 adds); bf16, and other architectures
    (tileiras ignores it there), keep float32 adds."""
    for problem in (_problem(), _problem(causal=False, seqlen_q=4096, seqlen_k=4096),
                    _problem(head_dim=256), _problem(head_dim=256, causal=False)):
        s = FORWARD.default_schedule("sm_90", problem)
        assert s.fast_acc and (problem.head_dim <= 128 or s.num_ctas == 1), problem
    assert not FORWARD.default_schedule("sm_90", _problem(dtype="bf16")).fast_acc
    assert not FORWARD.default_schedule("sm_100", _problem()).fast_acc


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_the_sm90_fp8_d256_defaults_do_not_spill_without_a_cluster(causal):
    """The D 256 rules run without a two-CTA cluster because ``fast_acc`` keeps their e4m3
    kernels off the stack (sm_90 cubins): the causal tile with float32 adds spills."""
    problem = _problem(head_dim=256, causal=causal, seqlen_q=4096, seqlen_k=4096)
    s = FORWARD.default_schedule("sm_90", problem)
    assert s.num_ctas == 1 and s.fast_acc
    (fast,) = FORWARD.compile(problem, s, "sm_90").resources()
    assert fast.stack_bytes == 0, fast
    if causal:
        (adds,) = FORWARD.compile(problem, s.replace(fast_acc=False), "sm_90").resources()
        assert adds.stack_bytes > 0, adds


def test_fp8_defaults_fit_every_architecture_with_fp8():
    for arch in FP8_ARCHES:
        for problem in (_problem(), _problem(causal=False, seqlen_q=4096, seqlen_k=4096),
                        _problem(head_dim=256), _problem(head_dim=96, **STEP)):
            schedule = FORWARD.default_schedule(arch, problem)
            assert FORWARD.normalise(problem, schedule) is not None


# -- compile-only builds ---------------------------------------------------------------------

@pytest.mark.parametrize("arch", FP8_ARCHES)
def test_fp8_forward_compiles_for_each_architecture_with_fp8(arch):
    problem = _problem(seqlen_q=777, seqlen_k=1537, bottom_right=True, heads_q=14)
    for schedule in (FORWARD.default_schedule(arch, problem),
                     Schedule(tile_m=64, tile_n=64, pv_wide=True)):
        result = FORWARD.compile(problem, schedule, arch)
        assert result.arch == arch and result.cubin[:4] == b"\x7fELF"


@pytest.mark.parametrize("arch", FP8_ARCHES)
def test_fp8_cache_decode_compiles_for_each_architecture_with_fp8(arch):
    problem = _problem(dtype="bf16", kv_dtype="e4m3", heads_q=32, heads_kv=8, **STEP)
    schedule = DECODE.default_schedule(arch, problem)
    assert DECODE.compile(problem, schedule, arch).cubin[:4] == b"\x7fELF"


def test_on_sm_90_fp8_products_run_on_the_e4m3_tensor_core_instruction(tmp_path):
    """QGMMA ... E4M3.E4M3 (Hopper's FP8 wgmma) for both products of P·V in e4m3; with
    ``pv_wide`` P·V is a bf16 HGMMA; a bf16 problem has no QGMMA."""
    s = Schedule(tile_m=128, tile_n=128, occupancy=2, exp2=True)
    sass = {}
    for name, problem, schedule in (("e4m3", _problem(), s),
                                    ("fast", _problem(), s.replace(fast_acc=True)),
                                    ("wide", _problem(), s.replace(pv_wide=True)),
                                    ("bf16", _problem(dtype="bf16"), s)):
        sass[name] = _sass(FORWARD.compile(problem, schedule, "sm_90").cubin,
                           tmp_path / f"{name}.cubin")
    assert "QGMMA" in sass["e4m3"] and "E4M3.E4M3" in sass["e4m3"]
    assert "HGMMA" not in sass["e4m3"]
    assert "QGMMA" in sass["wide"] and "HGMMA" in sass["wide"]
    assert "QGMMA" not in sass["bf16"]
    # fast_acc: the products accumulate in place, without a float32 add an element each
    # (tileiras's default sums each into a zeroed tile first: FADD R, RZ, R)
    assert sass["fast"].count("QGMMA") == sass["e4m3"].count("QGMMA")
    adds = {name: len(re.findall(r"\bFADD\b", sass[name])) for name in ("e4m3", "fast")}
    assert adds["fast"] < adds["e4m3"] - 100, adds
    zeroed = {name: len(re.findall(r"FADD (R\d+), RZ, \1\b", sass[name]))
              for name in ("e4m3", "fast")}
    assert zeroed["e4m3"] >= 64 and 4 * zeroed["fast"] < zeroed["e4m3"], zeroed
    # P's shift into e4m3's range (2^8) joins each row's max: one fused multiply-add a score
    # before its exponential, no separate add of the shift (FADD R, R, 8) a score
    for name in ("e4m3", "fast"):
        shift_adds = len(re.findall(r"FADD R\d+, R\d+, 8 ;", sass[name]))
        assert shift_adds < 8, (name, shift_adds)


# -- the transposed values -------------------------------------------------------------------

def test_transposed_values_keep_each_row_16_byte_aligned():
    v = torch.randn(2, 3, 37, 64).to(E4M3)
    vt = transpose_values(v)
    assert vt.shape == (2, 3, 64, 37) and vt.stride(2) % VALUE_ROW_ALIGN == 0
    assert vt.stride() == (3 * 64 * 48, 64 * 48, 48, 1)
    assert torch.equal(vt.view(torch.uint8), v.view(torch.uint8).transpose(2, 3))


# -- sdpa's errors (CPU tensors: every check before the device's, nothing launched) ----------

def _fp8(*shape):
    return torch.randn(*shape).to(E4M3)


Q, K = _fp8(2, 8, 64, 64), _fp8(2, 2, 64, 64)


@pytest.mark.parametrize("args, kwargs, error, message", [
    ((Q, K.float(), K), {}, InputTypeError, "k must be torch.float8_e4m3fn"),
    ((Q.float(), K, K), {}, InputTypeError, "q must be torch.float8_e4m3fn .* or bfloat16"),
    ((Q, K, K), dict(q_descale=1.0), InputTypeError, "q_descale must be a float32 torch"),
    ((Q, K, K), dict(k_descale=torch.ones(2, 2, dtype=torch.float16)), InputTypeError,
     "k_descale must be float32"),
    ((Q, K, K), dict(v_descale=torch.ones(3)), InputValueError,
     r"v_descale must have shape \[B, H_kv\] = \[2, 2\]"),
    ((Q, K, K), dict(v_descale=torch.ones(2, 2, 1)), InputValueError, "v_descale must have"),
    ((Q.bfloat16(), K, K), dict(q_descale=torch.ones(())), InputValueError,
     "q_descale goes with"),
    ((Q.bfloat16(), K.bfloat16(), K.bfloat16()), dict(k_descale=torch.ones(())),
     InputTypeError, "k must be torch.float8_e4m3fn"),
    ((Q, K, K), dict(out=torch.empty(2, 8, 64, 64, dtype=E4M3)), InputTypeError,
     "out must have the output's dtype torch.bfloat16"),
    ((Q, K, K), dict(ranges=torch.zeros(4, 2, dtype=torch.int32)),
     UnsupportedOperationError, "FP8 attention runs dense"),
    ((Q, K, K), dict(q_descale=torch.ones(2, 2)), InputValueError, "q must be a CUDA tensor"),
], ids=["k-dtype", "q-dtype", "descale-type", "descale-dtype", "descale-shape",
        "descale-rank", "q-descale-over-a-cache", "descale-without-fp8", "out-dtype", "ranges",
        "valid-but-on-cpu"])
def test_bad_fp8_arguments_are_refused_naming_them(args, kwargs, error, message):
    with pytest.raises(error, match=message):
        ta.sdpa(*args, **kwargs)


def test_fp8_inputs_requiring_grad_are_refused():
    q = Q.clone().requires_grad_() if Q.dtype.is_floating_point else Q
    with pytest.raises(UnsupportedOperationError, match="FP8 attention has no backward"):
        ta.sdpa(q, K, K)


def test_entry_points_without_fp8_refuse_it_as_a_dtype():
    with pytest.raises(InputTypeError, match="query must be bfloat16 or float16; got "
                                             "torch.float8_e4m3fn"):
        ta.varlen_attn(_fp8(64, 8, 64), _fp8(64, 2, 64), _fp8(64, 2, 64),
                       torch.tensor([0, 64], dtype=torch.int32),
                       torch.tensor([0, 64], dtype=torch.int32), 64, 64)
    with pytest.raises(InputTypeError, match="must be bfloat16 or float16"):
        ta.sdpa_with_lse(Q, K, K)
    assert BACKWARD.dtype_refusal(_problem()) is not None


def test_tiledtune_explain_fp8_and_its_refusal(capsys, tmp_path):
    import json

    from tuner import cli
    from tuner.commands._problems import parse_problem_fields

    db = str(tmp_path / "none.sqlite")
    # a paged FP8 cache's decode step: the architecture default (the shipped table has no FP8
    # decode row: the searches of 2026-12-01 found the default best, docs/shipped-table.md)
    problem = ("batch=16,heads_q=32,heads_kv=8,seqlen_q=1,seqlen_k=32768,head_dim=128,"
               "dtype=bf16,causal=true,bottom_right=true,ragged=true,page_size=16,kv_dtype=e4m3")
    code = cli.main(["explain", "--device", "sm_90", "--db", db, "--json", "--problem", problem])
    out, err = capsys.readouterr()
    assert code == 0, err
    (step,) = json.loads(out)["lookups"]
    assert step["family"] == "decode" and step["source"] == "default"
    expected = DECODE.default_schedule("sm_90", Problem(**parse_problem_fields(problem)))
    assert {k: step["schedule"][k] for k in ("splits", "tile_n", "v_latency")} == {
        "splits": expected.splits, "tile_n": expected.tile_n, "v_latency": 4}
    code = cli.main(["explain", "--device", "sm_90", "--db", db, "--json", "--shape",
                     "1,32/8,8192,128", "--dtype", "e4m3", "--causal", "yes"])
    out, err = capsys.readouterr()
    assert code == 0 and json.loads(out)["lookups"][0]["family"] == "forward"
    code = cli.main(["explain", "--device", "sm_89", "--db", db, "--shape", "1,32/8,4096,128",
                     "--dtype", "e4m3"])
    out, err = capsys.readouterr()
    assert code == 2 and "FP8 attention needs sm_90" in err and "Traceback" not in err


def test_the_fp8_bench_preset_and_its_bytes():
    from tuner.bench import BenchConfigError
    from tuner.bench._engine import problem_bytes, result_fields
    from tuner.bench._presets import build_grid

    prefill = build_grid("forward", preset="fp8").problems
    assert prefill and all(p.dtype == "e4m3" for p in prefill)
    assert {p.head_dim for p in prefill} == {128, 256} and any(not p.causal for p in prefill)
    decode = build_grid("decode", preset="fp8").problems
    assert decode and all(p.kv_dtype == "e4m3" and p.seqlen_q == 1 for p in decode)
    with pytest.raises(BenchConfigError, match="FP8 has no backward"):
        build_grid("backward", preset="fp8")
    step = decode[0]
    plain = Problem.from_dict({**step.to_dict(), "kv_dtype": ""})
    # K and V at one byte an element: the cache's bytes halve, q and the output stay
    q_out = 2 * 2 * step.batch * step.heads_q * step.head_dim
    assert problem_bytes(step) - q_out == (problem_bytes(plain) - q_out) // 2
    assert result_fields(step)["kv_dtype"] == "e4m3" and "kv_dtype" not in result_fields(plain)
    e4m3 = prefill[0]
    bf16 = Problem.from_dict({**e4m3.to_dict(), "dtype": "bf16"})
    elems = e4m3.batch * e4m3.heads_q * e4m3.seqlen_q * e4m3.head_dim
    assert problem_bytes(bf16) - problem_bytes(e4m3) == elems + (problem_bytes(bf16) - 4 * elems) // 2


def test_tiledtune_aot_builds_fp8_model_calls_and_refuses_fp8_training(capsys, tmp_path):
    from tuner import cli

    args = ["aot", "--arch", "sm_90", "--out", str(tmp_path), "--no-shipped", "--model",
            "32/8,128", "--lengths", "1000", "--dtypes", "e4m3", "--batch", "1", "--jobs", "1"]
    assert cli.main(args + ["--training"]) == 2
    out, err = capsys.readouterr()
    assert "--model: no registered kernel family serves sdpa_backward" in err
    assert "got e4m3" in err and "Traceback" not in err
    assert cli.main(args) == 0  # an e4m3 prefill and an e4m3 decode step (the forward's)
    assert (tmp_path / "cubins-sm_90.zip").stat().st_size > 0


def test_descale_factors_reach_the_kernel_contiguous_and_outside_autograd():
    """A kept plan's factors: a contiguous ``[B, H_kv]`` float32 tensor passes as it is; a
    per-tensor or strided one, or one requiring grad, as a detached contiguous expansion (a
    tensor requiring grad cannot be handed to a launch); ``None`` as the kept ones."""
    from tiledattention.entry_points._fp8 import _Kept, is_fp8_call

    target = (2, 4)
    given = torch.rand(target)
    grad = torch.rand(target, requires_grad=True)
    kept = _Kept("plan", target, "ones", (None, given, grad))
    ones, same, detached = kept.factors((None, given, grad))
    assert ones == "ones" and same is given
    assert not detached.requires_grad and torch.equal(detached, grad.detach())
    strided = torch.rand(4, 2).t()
    one = _Kept("plan", target, "ones", (torch.tensor(0.5), strided, None))
    scalar, copied, _ = one.factors((torch.tensor(0.5), strided, None))
    assert scalar.shape == target and torch.all(scalar == 0.5)
    assert copied.is_contiguous() and torch.equal(copied, strided)
    bf16 = torch.zeros(1, 2, 3, 4, dtype=torch.bfloat16)
    assert not is_fp8_call(bf16, bf16, (None, None, None))
    assert is_fp8_call(bf16.to(E4M3), bf16, (None, None, None))
    assert is_fp8_call(bf16, bf16.to(E4M3), (None, None, None))
    assert is_fp8_call(bf16, bf16, (None, None, given))
