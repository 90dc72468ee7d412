"""The held-out shape sets of issue 18 and the offline scoring of fallback policies."""

from __future__ import annotations

import math

import pytest

from tiledattention import FORWARD, Schedule, shipped_table
from tuner.lookup import (FITTING, POLICIES, REPORT, evaluate, previous_default, regret_table,
                          shape_set, shipped_rows)


def test_sets_are_held_out_sized_and_disjoint():
    shipped = {r.problem for r in shipped_table("sm_90")}
    for shapes in (FITTING, REPORT):
        assert len(shapes) >= 16
        assert not {s.problem for s in shapes} & shipped
        assert len({s.problem for s in shapes}) == len(shapes)
    assert not {s.problem for s in FITTING} & {s.problem for s in REPORT}
    assert shape_set("both") == FITTING + REPORT
    # what the sets must cover: head dims 80, 96 and 192, batch 1 to 64, long context, GQA
    for shapes in (FITTING, REPORT):
        problems = [s.problem for s in shapes]
        assert {80, 96, 192} <= {p.head_dim for p in problems}
        assert min(p.batch for p in problems) == 1 and max(p.batch for p in problems) == 64
        assert max(p.seqlen_k for p in problems) >= 16384
        assert any(p.heads_q != p.heads_kv for p in problems)
    with pytest.raises(ValueError, match="shape set"):
        shape_set("all")
    with pytest.raises(ValueError, match="shape set"):
        shape_set("report", "decode")


def record(problem, times: dict, default_ms: float) -> dict:
    """A measured shape as scripts/lookup_regret.py stores it."""
    default = FORWARD.normalise(problem, FORWARD.default_schedule("sm_90", problem))
    times = {**times, default.key: default_ms}
    best = min(times, key=times.get)
    return {"family": "forward", "name": problem.describe(), "problem": problem.to_dict(),
            "times": times, "best_ms": times[best], "default_key": default.key}


def test_regret_is_the_picks_time_over_the_best():
    problem = FITTING[0].problem
    rows = shipped_rows(FORWARD, "sm_90", any_template=True)
    faster = Schedule(tile_m=128, tile_n=64)
    rec = record(problem, {FORWARD.normalise(problem, faster).key: 1.0}, default_ms=1.25)
    (policy,) = [p for p in POLICIES if p.name == "default"]
    (scored,) = evaluate(policy, FORWARD, [rec], rows, "sm_90")
    assert scored["regret"] == pytest.approx(1.25) and scored["vs_default"] == 1.0
    (summary,) = regret_table(FORWARD, [rec], rows, "sm_90", [policy])
    assert summary["geomean_regret"] == pytest.approx(1.25)
    assert summary["slower_than_default"] == 0
    # a pick that was never measured is an error naming the shape, not a silent skip
    (before,) = [p for p in POLICIES if p.name == "before"]
    with pytest.raises(KeyError, match=problem.describe()):
        evaluate(before, FORWARD, [rec], rows, "sm_90")


def test_runtime_policy_is_the_resolvers_rule():
    """The 'runtime' policy answers as the lookup does with only the shipped table."""
    import tiledattention
    from tiledattention import tooling

    resolver = tooling.Resolver(open_user=lambda: None, open_shipped=shipped_table)
    device = tiledattention.DeviceInfo(index=0, name="NVIDIA H100 80GB HBM3", arch="sm_90",
                                       sm_count=132)
    (policy,) = [p for p in POLICIES if p.name == "runtime"]
    rows = shipped_rows(FORWARD, "sm_90")
    for shape in FITTING + REPORT:
        got = resolver(FORWARD, shape.problem, device).schedule
        assert got == policy.choose(FORWARD, shape.problem, rows, "sm_90"), shape.name


def test_previous_default_is_the_padded_three_way_rule():
    p = FITTING[5].problem  # D 80, causal, S 700
    assert previous_default("sm_90", p) == Schedule(tile_m=64, tile_n=128, occupancy=2,
                                                    exp2=True, approx_div=True,
                                                    k_transposed=True)
    assert not previous_default("sm_90", p).split_d
    assert FORWARD.default_schedule("sm_90", p).split_d
    assert math.isfinite(FORWARD.nearest_limit)
