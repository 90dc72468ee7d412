"""A family declares its input dtypes once (``Family.tolerances``) and dispatch refuses it a
problem of any other, with the reason, for every family at once (``Family.accepts``);
``explain`` shows the refusal. FP8 inputs are declared by the forward only (decode and
backward refuse them; decode reads an FP8 cache under 16-bit queries)."""

from __future__ import annotations

import json

import pytest

import tiledattention
from tiledattention import (BACKWARD, DECODE, DTYPES, FORWARD, InputValueError, Problem,
                            UnsupportedOperationError, UnsupportedProblemError, choose_family,
                            explain_choice)
from tuner import cli

#: a decode step (decode takes it by shape when it takes the dtype)
STEP = dict(batch=1, heads_q=32, heads_kv=8, seqlen_q=1, seqlen_k=30000, head_dim=128,
            causal=False)


def test_each_family_declares_the_dtypes_it_takes():
    """The forward takes every dtype (FP8 inputs too); decode and backward the 16-bit ones
    (decode reads an FP8 cache under them: ``kv_dtypes``)."""
    assert FORWARD.dtypes == tuple(FORWARD.tolerances) == DTYPES
    for family in (DECODE, BACKWARD):
        assert family.dtypes == tuple(family.tolerances) == ("bf16", "fp16")
    assert (DECODE.kv_dtypes, BACKWARD.kv_dtypes, FORWARD.kv_dtypes) == (("e4m3",), (), ())


@pytest.fixture
def decode_bf16_only(monkeypatch):
    """Decode declares bf16 only: fp16 is the dtype it does not take."""
    monkeypatch.setattr(DECODE, "tolerances", {"bf16": 1e-2}, raising=False)
    return DECODE


def test_a_dtype_a_family_does_not_declare_goes_to_the_next_family(decode_bf16_only):
    bf16, fp16 = (Problem(dtype=d, **STEP) for d in ("bf16", "fp16"))
    assert choose_family("sm_90", bf16) is DECODE
    assert choose_family("sm_90", fp16) is FORWARD
    family, why = explain_choice("sm_90", fp16)
    assert family is FORWARD
    assert why.startswith("the decode family takes dtype bf16; got fp16 (B1 H32/8 ")
    with pytest.raises(UnsupportedProblemError, match="decode family takes dtype bf16; got fp16"):
        DECODE.tolerance(fp16)


def test_a_dtype_no_family_declares_is_refused_with_each_reason(monkeypatch):
    monkeypatch.setattr(BACKWARD, "tolerances", {"bf16": 2e-2}, raising=False)
    problem = Problem(dtype="fp16", **dict(STEP, seqlen_q=4096, seqlen_k=4096))
    with pytest.raises(UnsupportedOperationError, match=r"no registered kernel family serves "
                       r"sdpa_backward for .* fp16 .*: the backward family takes dtype bf16; "
                       r"got fp16"):
        choose_family("sm_90", problem, "sdpa_backward")


def test_explain_shows_the_refusal(decode_bf16_only, capsys, tmp_path):
    code = cli.main(["explain", "--device", "sm_90", "--db", str(tmp_path / "none.sqlite"),
                     "--shape", "1,32/8,1:30000,128", "--dtype", "fp16", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    (step,) = json.loads(out)["lookups"]
    assert step["family"] == "forward"
    assert "the decode family takes dtype bf16; got fp16" in step["why_family"]


class _Fp16Only(type(FORWARD)):
    """A registered attention family, asked first, that declares fp16 only."""

    name = "fp16_only_toy"
    dispatch_priority = 100
    tolerances = {"fp16": 5e-3}

    def takes(self, arch, problem):
        return True


def test_a_registered_family_is_refused_the_dtypes_it_does_not_declare():
    family = tiledattention.register_family(_Fp16Only())
    try:
        shape = dict(STEP, seqlen_q=4096, seqlen_k=4096)
        assert choose_family("sm_90", Problem(dtype="fp16", **shape)) is family
        chosen, why = explain_choice("sm_90", Problem(dtype="bf16", **shape))
        assert chosen is FORWARD
        assert why.startswith("the fp16_only_toy family takes dtype fp16; got bf16")
    finally:
        tiledattention.unregister_family(family.name)


def test_a_family_declaring_an_unknown_dtype_is_not_registered():
    class Fp8(_Fp16Only):
        name = "fp8_toy"
        tolerances = {"fp8_e5m2": 0.1}

    with pytest.raises(InputValueError, match=r"fp8_toy's tolerances must name dtypes among "
                                              r"\('bf16', 'fp16', 'e4m3'\).*got \['fp8_e5m2'\]"):
        tiledattention.register_family(Fp8())
    assert "fp8_toy" not in [f.name for f in tiledattention.families()]
