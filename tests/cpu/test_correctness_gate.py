"""The tuner's correctness gate (``GpuExecutor.measure``): a candidate whose relative L2 error
against the float32 reference is NaN, infinite or above its family's tolerance is "wrong" and is
never timed; one at or under the tolerance is timed. And each family's tolerances, pinned: a
gate 10x looser than the code's would let wrong kernels win.

The executor runs here with a stand-in case whose ``error()`` returns the value under test (the
real case needs a GPU) and the real families' ``tolerance``; ``time_cuda`` is replaced, so that a
candidate passing the gate is "timed" without CUDA.
"""

from __future__ import annotations

import math

import pytest

from tiledattention import BACKWARD, DECODE, DTYPES, FORWARD, Problem
from tuner.measure import GpuExecutor, Timing

#: what the code says (tiledattention/{forward,decode,backward}/_family.py ``tolerances``)
TOLERANCES = {
    "forward": {"bf16": 1e-2, "fp16": 5e-3, "e4m3": 5e-2},
    "decode": {"bf16": 1e-2, "fp16": 5e-3},
    "backward": {"bf16": 2e-2, "fp16": 1e-2},
}
FAMILIES = {"forward": FORWARD, "decode": DECODE, "backward": BACKWARD}
TIMED = Timing(median_ms=1.0, spread_ms=0.01, mean_ms=1.0, min_ms=0.99, samples=30)


def _problem(family: str, dtype: str) -> Problem:
    return Problem(batch=1, heads_q=8, heads_kv=8, seqlen_q=1 if family == "decode" else 512,
                   seqlen_k=512, head_dim=64, dtype=dtype, causal=family != "decode")


class _Case:
    """A case whose candidate output has relative error ``err``."""

    def __init__(self, err: float) -> None:
        self.err = err
        self.ran = 0

    def launcher(self, schedule):
        def run():
            self.ran += 1
        return run

    def error(self, run):
        run()
        return self.err


class _Family:
    """``family`` with its GPU case replaced by :class:`_Case` (its tolerance is its own)."""

    def __init__(self, family, err: float) -> None:
        self.family, self.name, self.made = family, family.name, _Case(err)

    def case(self, problem, device_index):
        return self.made

    def tolerance(self, problem):
        return self.family.tolerance(problem)


@pytest.fixture
def timed(monkeypatch) -> list:
    """The launches ``time_cuda`` was asked to time."""
    import tuner.measure._timing as timing

    calls: list = []
    monkeypatch.setattr(timing, "time_cuda", lambda fn, **kw: calls.append(fn) or TIMED)
    return calls


def _measure(family: str, dtype: str, err: float):
    fake = _Family(FAMILIES[family], err)
    return GpuExecutor(fake, 0).measure(_problem(family, dtype), object()), fake.made


CASES = [(f, d) for f in TOLERANCES for d in TOLERANCES[f]]


@pytest.mark.parametrize("family,dtype", CASES, ids=[f"{f}-{d}" for f, d in CASES])
@pytest.mark.parametrize("err", [
    pytest.param(lambda tol: math.nan, id="nan"),
    pytest.param(lambda tol: math.inf, id="inf"),
    pytest.param(lambda tol: -math.inf, id="minus-inf"),
    pytest.param(lambda tol: math.nextafter(tol, math.inf), id="just-over"),
    pytest.param(lambda tol: tol * 1.01, id="one-percent-over"),
    pytest.param(lambda tol: tol * 10, id="ten-times"),
])
def test_the_gate_rejects_nan_infinite_and_over_tolerance_errors(family, dtype, err, timed):
    value = err(TOLERANCES[family][dtype])
    m, case = _measure(family, dtype, value)
    assert m.status == "wrong", (value, m)
    assert not m.ok and m.timing is None
    assert case.ran == 1  # the candidate ran (its output was checked) ...
    assert timed == []  # ... and was never timed
    assert "relative L2 error" in m.reason and f"{TOLERANCES[family][dtype]:g}" in m.reason
    assert m.rel_err is value or m.rel_err == value  # NaN is kept as it came (nan != nan)


@pytest.mark.parametrize("family,dtype", CASES, ids=[f"{f}-{d}" for f, d in CASES])
@pytest.mark.parametrize("err", [
    pytest.param(lambda tol: tol, id="exactly-at"),
    pytest.param(lambda tol: math.nextafter(tol, 0.0), id="just-under"),
    pytest.param(lambda tol: tol / 10, id="tenth"),
    pytest.param(lambda tol: 0.0, id="zero"),
])
def test_the_gate_passes_errors_at_or_under_the_tolerance(family, dtype, err, timed):
    value = err(TOLERANCES[family][dtype])
    m, case = _measure(family, dtype, value)
    assert m.status == "ok", (value, m)
    assert m.timing == TIMED and m.rel_err == value
    assert len(timed) == 1


@pytest.mark.parametrize("family", sorted(TOLERANCES))
def test_each_familys_tolerances_are_pinned(family):
    """Exactly the documented values, for every dtype a problem can have: a looser (or
    tighter) tolerance is a decision to make here, not by accident."""
    got = {dtype: FAMILIES[family].tolerance(_problem(family, dtype))
           for dtype in FAMILIES[family].dtypes}
    assert got == TOLERANCES[family]


def test_the_tolerance_table_names_known_dtypes():
    assert all(set(t) <= set(DTYPES) for t in TOLERANCES.values())
