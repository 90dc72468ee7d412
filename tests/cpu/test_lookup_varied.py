"""Issue 29's held-out transfer sets (``tuner.lookup.VARIED``), the policies of every family and
the regret script's plan-only modes, on the CPU."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
from pathlib import Path

import pytest

import tiledattention
from tiledattention import BACKWARD, DECODE, FORWARD, choose_family, shipped_table, tooling
from tuner.errors import NotMeasuredError
from tuner.lookup import (DIMENSIONS, POLICIES, RETIRED_KEYS, SLOWER_THAN_DEFAULT,
                          VARIED, Policy, dimensions_apart, evaluate, pick, policies_for,
                          regret_table, shape_set, shipped_rows, summarise)

ROOT = Path(__file__).resolve().parents[2]
FAMILIES = {"forward": FORWARD, "decode": DECODE, "backward": BACKWARD}
OPERATION = {"forward": "sdpa", "decode": "sdpa", "backward": "sdpa_backward"}
SMALLEST = {"forward": 34, "decode": 34, "backward": 10}


def shipped_keys(family) -> list:
    return [r.problem for r in shipped_table("sm_90") if r.family == family.name]


def rows_of(family) -> list:
    """The family's shipped rows as current ones (the study's tests must not turn trivial while
    a kernel edit waits for the table to be restamped)."""
    return shipped_rows(family, "sm_90", any_template=True)


# -- the sets ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_varied_set_is_held_out_and_a_transfer_test(name):
    family, shapes = FAMILIES[name], VARIED[name]
    # the plain held-out shapes against the plain keys: a window's, a softcap's, sinks' or a
    # ragged batch's rows lie in buckets of their own and never serve them
    keys = [k for k in shipped_keys(family)
            if not any(k.to_dict().get(f, None) is not None
                       for f in type(k).VARIANT_FIELDS)]
    # the keys the set was drawn around that have left the table since
    assert not set(RETIRED_KEYS[name]) & set(keys)
    keys += RETIRED_KEYS[name]
    assert len(shapes) >= SMALLEST[name]
    assert shape_set("varied", name) == shapes
    assert len({s.problem for s in shapes}) == len(shapes)
    assert len({s.name for s in shapes}) == len(shapes)
    for s in shapes:
        p = s.problem
        assert p not in keys, s.name
        # a valid problem of the family, which the runtime hands to this family
        assert family.problem_type.from_dict(p.to_dict()) == p, s.name
        assert choose_family("sm_90", p, OPERATION[name]) is family, s.name
        apart = min((dimensions_apart(k, p) for k in keys), key=len)
        assert 1 <= len(apart) <= 2, (s.name, apart)


def test_dimensions_apart_names_each_dimension():
    (base,) = [k for k in shipped_keys(FORWARD)
               if k.describe() == "B4 H32/8 S4096 D128 bf16 causal"]
    fields = base.to_dict()

    def moved(**change):
        return type(base).from_dict({**fields, **change})

    assert dimensions_apart(base, base) == ()
    assert dimensions_apart(base, moved(batch=2)) == ("batch",)
    assert dimensions_apart(base, moved(heads_q=64, heads_kv=16)) == ("heads",)
    assert dimensions_apart(base, moved(heads_kv=1)) == ("group",)
    assert dimensions_apart(base, moved(heads_q=8, heads_kv=1)) == ("heads", "group")
    assert dimensions_apart(base, moved(dtype="fp16")) == ("dtype",)
    assert dimensions_apart(base, moved(head_dim=96)) == ("head_dim",)
    assert dimensions_apart(base, moved(causal=False)) == ("causal",)
    assert dimensions_apart(base, moved(seqlen_q=1024, bottom_right=True)) == ("causal",
                                                                                "length")
    assert set(DIMENSIONS) == {"batch", "heads", "group", "dtype", "head_dim", "causal",
                               "length"}


def test_varied_sets_cover_what_issue_29_names():
    def has(shapes, text):
        return any(s.problem.describe() == text for s in shapes)

    assert has(VARIED["forward"], "B16 H12 S1025 D64 fp16 full")
    assert has(VARIED["decode"], "B16 H32/8 S1x4096 D128 bf16 full")
    assert has(VARIED["decode"], "B1 H64/8 S1x32768 D128 bf16 full")
    for name, shapes in VARIED.items():  # every dimension varies in every family's set...
        keys = shipped_keys(FAMILIES[name])
        seen = {d for s in shapes for d in min((dimensions_apart(k, s.problem) for k in keys),
                                               key=len)}
        # ...but dtype in decode: every decode key is shipped in both dtypes
        assert seen >= set(DIMENSIONS) - ({"dtype"} if name == "decode" else set()), name
    decode = [s.problem for s in VARIED["decode"]]
    assert {p.seqlen_q for p in decode} >= {1, 8} and max(p.seqlen_q for p in decode) <= 8
    assert min(p.seqlen_k for p in decode) <= 1024 and max(p.seqlen_k for p in decode) >= 65536
    assert min(p.batch for p in decode) == 1 and max(p.batch for p in decode) == 64
    assert {p.heads_q // p.heads_kv for p in decode} >= {1, 4, 8}
    assert any(p.heads_kv == 1 for p in decode)
    backward = [s.problem for s in VARIED["backward"]]
    assert all(1 <= p.batch <= 8 and 1024 <= p.seqlen_k <= 8192 for p in backward)
    assert any((p.heads_q, p.heads_kv) == (32, 8) for p in backward)
    assert any((p.heads_q, p.heads_kv) == (8, 1) for p in backward)
    assert any(p.causal for p in backward)


# -- the policies ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_runtime_policy_is_the_resolver_over_the_same_rows(name):
    """The 'runtime' policy answers what the lookup answers with these rows as its shipped
    table (asked for the problem the runtime resolves: decode's cache-length bucket)."""
    import db

    family = FAMILIES[name]
    rows = rows_of(family)
    assert rows
    table = db.RowTable(rows, codecs=tooling.codecs())
    resolver = tooling.Resolver(open_user=lambda: None, open_shipped=lambda arch: table)
    device = tiledattention.DeviceInfo(index=0, arch="sm_90", name="NVIDIA H100 80GB HBM3",
                                       sm_count=132)
    (runtime,) = [p for p in POLICIES if p.name == "runtime"]
    sources = set()
    for shape in VARIED[name]:
        found = resolver(family, family.plan_problem(shape.problem), device)
        sources.add(found.source)
        assert runtime.choose(family, shape.problem, rows, "sm_90") == found.schedule, shape.name
    assert "shipped" not in sources or name == "decode"  # decode: two shapes' buckets are keys


def test_policies_of_each_family():
    assert {p.name for p in policies_for(FORWARD)} >= {"default", "runtime",
                                                       "nearest (issue 18 rule)",
                                                       "nearest, any distance", "before"}
    for family in (DECODE, BACKWARD):
        assert [p.name for p in policies_for(family)] == [
            "default", "runtime", "nearest (issue 18 rule)", "nearest, any distance"]


def test_issue_18_rule_takes_the_nearest_row_the_issue_names():
    """Before issue 29 the forward lookup answered the fp16 [16, 12, 1025, 64] call with the
    B16 H32 S1024 row's schedule, and decode B16 H32/8 S_k 4096 with B8's row."""
    (rule,) = [p for p in POLICIES if p.name == "nearest (issue 18 rule)"]
    for name, text, source in (("forward", "B16 H12 S1025 D64 fp16 full",
                                "B16 H32 S1024 D64 fp16 full"),
                               ("decode", "B16 H32/8 S1x4096 D128 bf16 full",
                                "B8 H32/8 S1x4096 D128 bf16 full")):
        family = FAMILIES[name]
        rows = rows_of(family)
        (shape,) = [s for s in VARIED[name] if s.problem.describe() == text]
        found = [r for r in rows if r.problem.describe() == source]
        if not found:  # a key that left the table since (RETIRED_KEYS): a row for it, whose
            # schedule is no other row's nor the default's
            (key,) = [k for k in RETIRED_KEYS[name] if k.describe() == source]
            found = [dataclasses.replace(rows[0], problem=key, schedule=family.default_schedule(
                "sm_90", key).replace(tile_m=32))]
            rows = rows + found
        (row,) = found
        assert rule.choose(family, shape.problem, rows, "sm_90") == row.schedule


def record(family, problem, times: dict, default_ms: float, picks=None) -> dict:
    """A measured shape as scripts/lookup_regret.py stores it (times by schedule key)."""
    default = pick(policies_for(family)[0], family, problem, [], "sm_90")
    times = {**times, default.key: default_ms}
    best = min(times, key=times.get)
    return {"family": family.name, "name": problem.describe(), "problem": problem.to_dict(),
            "times": times, "best_ms": times[best], "best_key": best,
            "default_key": default.key, "picks": picks or {}}


def test_a_pick_slower_than_the_default_is_counted():
    family = DECODE
    problems = [s.problem for s in VARIED["decode"][:3]]
    other = family.default_schedule("sm_90", problems[0]).replace(splits=3, combine="kernel")
    slow = Policy("always split 3", lambda f, p, rows, arch: other)
    records = []
    for problem, (other_ms, default_ms) in zip(problems, ((1.0, 1.0), (1.5, 1.0), (0.8, 1.0))):
        key = family.normalise(problem, other).key
        records.append(record(family, problem, {key: other_ms}, default_ms))
    scored = evaluate(slow, family, records, [], "sm_90")
    assert [s["vs_default"] for s in scored] == pytest.approx([1.0, 1.5, 0.8])
    assert [s["regret"] for s in scored] == pytest.approx([1.0, 1.5, 1.0])
    (default,) = [p for p in POLICIES if p.name == "default"]
    slow_row, default_row = regret_table(family, records, [], "sm_90", [slow, default])
    assert slow_row["slower_than_default"] == 1
    assert slow_row["worst_vs_default"] == pytest.approx(1.5)
    assert slow_row["worst_regret"] == pytest.approx(1.5)
    assert slow_row["geomean_regret"] == pytest.approx(1.5 ** (1 / 3))
    assert default_row["slower_than_default"] == 0
    assert default_row["geomean_regret"] == pytest.approx(1.25 ** (1 / 3))
    # the bar is strict: 2% slower is not counted, a hair over is
    edge = summarise("edge", [{"regret": 1.0, "vs_default": SLOWER_THAN_DEFAULT},
                              {"regret": 1.0, "vs_default": 1.0201}])
    assert edge["slower_than_default"] == 1


def test_a_pick_that_was_not_timed_is_an_error_naming_the_shape():
    family = BACKWARD
    problem = VARIED["backward"][0].problem
    other = family.default_schedule("sm_90", problem).replace(dq_occupancy=4)
    rec = record(family, problem, {}, 1.0)
    never = Policy("never timed", lambda f, p, rows, arch: other)
    with pytest.raises(NotMeasuredError, match=problem.describe()):
        evaluate(never, family, [rec], [], "sm_90")
    with pytest.raises(KeyError):  # the script's tables catch it as a KeyError
        regret_table(family, [rec], [], "sm_90", [never])


# -- the script --------------------------------------------------------------------------------
def load_script():
    """scripts/lookup_regret.py as a module; its folder on ``sys.path`` while it loads, as when
    it runs (it imports its sibling ``_gpu``)."""
    import sys

    spec = importlib.util.spec_from_file_location("lookup_regret",
                                                  ROOT / "scripts" / "lookup_regret.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    return module


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_dry_run_counts_candidates_without_a_gpu(name, capsys):
    script = load_script()
    assert script.main(["--family", name, "--sets", "varied", "--dry-run", "sm_90",
                        "--any-template"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == len(VARIED[name]) + 1
    counts = [int(line.split(" | ")[3].split()[0]) for line in out[:-1]]
    assert all(1 <= n <= 14 for n in counts)  # --max-candidates' default
    assert out[-1].endswith(f"{sum(counts)} candidates (= compiles)")


def test_candidates_hold_every_policy_pick_and_respect_the_cap():
    script = load_script()
    family = FORWARD
    rows = rows_of(family)
    shape = VARIED["forward"][0]
    pool = script.candidates(family, shape, rows, "sm_90", samples=4, neighbours=6, cap=5,
                             seed=29)
    keys = {pick(p, family, shape.problem, rows, "sm_90").key for p in policies_for(family)}
    assert keys <= set(pool)
    assert len(pool) <= max(5, len(keys))
    again = script.candidates(family, shape, rows, "sm_90", samples=4, neighbours=6, cap=5,
                              seed=29)
    assert list(again) == list(pool)  # seeded: the same candidates every run


def test_script_rejects_a_set_its_family_has_not(capsys):
    script = load_script()
    with pytest.raises(SystemExit):
        script.main(["--family", "decode", "--sets", "report", "--dry-run", "sm_90"])
    assert "not a set of the decode family" in capsys.readouterr().err


def test_from_json_reprints_the_tables(tmp_path, capsys):
    """A saved run's tables, with a policy whose pick was not timed shown as not scored."""
    script = load_script()
    family = DECODE
    rows = rows_of(family)
    records = []
    for shape in VARIED["decode"][:2]:
        picks = {p.name: pick(p, family, shape.problem, rows, "sm_90")
                 for p in policies_for(family)}
        times = {s.key: 1.0 + i / 10 for i, s in enumerate(dict.fromkeys(picks.values()))}
        rec = record(family, shape.problem, {}, 1.0, {n: s.key for n, s in picks.items()})
        rec["times"] = {**times, rec["default_key"]: times.get(rec["default_key"], 1.0)}
        rec["best_key"] = min(rec["times"], key=rec["times"].get)
        rec["best_ms"] = rec["times"][rec["best_key"]]
        rec.update(set="varied", schedules={s.key: s.to_dict() for s in picks.values()},
                   runtime_source="default", baseline="torch-cudnn", baseline_ms=1.0)
        records.append(rec)
    out = tmp_path / "decode.json"
    out.write_text(json.dumps({"family": "decode", "arch": "sm_90", "any_template": True,
                               "shapes": records}))
    assert script.main(["--out", str(out), "--from-json"]) == 0
    text = capsys.readouterr().out
    assert "| runtime, as measured |" in text
    assert text.count("| varied |") == 2
    assert not math.isnan(float(text.split("| runtime, as measured | ")[1].split(" |")[0]))



class _FakeCase:
    """A case whose launches do nothing: one schedule computes wrongly, one fails to launch."""

    def __init__(self, wrong: str, broken: str) -> None:
        self.wrong, self.broken = wrong, broken

    def launcher(self, schedule):
        if schedule.key == self.broken:
            raise RuntimeError("no launch\nsecond line")
        return lambda: schedule.key

    def error(self, run) -> float:
        return math.inf if run() == self.wrong else 0.0

    def baselines(self):
        def refuses():
            raise RuntimeError("No available kernel")
        return {"torch-cudnn": lambda: None, "torch-flash": refuses}


def test_a_measured_run_writes_every_field_and_prints_the_tables(tmp_path, monkeypatch, capsys):
    """main() on two decode shapes with the GPU faked out: compiles, launches and timings are
    stand-ins; what the record holds and what the tables print are the script's own."""
    from tuner.measure import summarize

    script = load_script()
    family = DECODE
    rows = rows_of(family)
    shapes = VARIED["decode"][:2]
    pools = {s.name: script.candidates(family, s, rows, "sm_90", samples=4, neighbours=6,
                                       cap=14, seed=29) for s in shapes}
    (first,) = [s for s in shapes if s.name.startswith("Llama-3-8B decode, batch 16")]
    extra = [k for k, (why, _) in pools[first.name].items() if not why.startswith("policy")]
    wrong, broken, uncompiled = extra[:3]
    monkeypatch.setattr(tiledattention, "use_database", lambda location: None)
    monkeypatch.setattr(script, "require_gpu", lambda: None)  # the GPU is faked out
    monkeypatch.setattr(tiledattention, "device_info", lambda index: tiledattention.DeviceInfo(
        index=0, arch="sm_90", name="NVIDIA H100 80GB HBM3", sm_count=132))
    monkeypatch.setattr(script, "compile_ahead", lambda jobs, arch, n, fam: {
        (first.problem, uncompiled): "tileiras: out of registers"})
    monkeypatch.setattr(script, "versions", lambda fam: {"template_hash": "x"})
    monkeypatch.setattr(family, "case", lambda problem, index: _FakeCase(wrong, broken))
    speed = {k: 1.0 + int(k[:4], 16) / 65536 for s in shapes for k in pools[s.name]}

    def timed(fns, rounds):
        return {k: summarize([speed.get(k, 2.0)] * rounds) for k in fns}

    monkeypatch.setattr(script, "time_interleaved", timed)
    out = tmp_path / "decode.json"
    assert script.main(["--family", "decode", "--only", "0,1", "--any-template",
                        "--out", str(out)]) == 0
    saved = json.loads(out.read_text())
    assert saved["family"] == "decode" and saved["arch"] == "sm_90"
    records = {r["name"]: r for r in saved["shapes"]}
    r = records[first.name]
    assert r["errors"][wrong].startswith("wrong:")
    assert r["errors"][broken] == "launch: no launch"
    assert r["errors"][uncompiled] == "compile: tileiras: out of registers"
    assert r["errors"]["baseline:torch-flash"] == "No available kernel"
    assert r["baselines_ms"] == {"torch-cudnn": 2.0} and r["baseline"] == "torch-cudnn"
    assert set(r["times"]) == set(pools[first.name]) - {wrong, broken, uncompiled}
    assert r["best_ms"] == min(r["times"].values())
    assert set(r["picks"]) == {p.name for p in policies_for(family)}
    assert r["default_key"] == r["picks"]["default"] and r["runtime_source"]
    for key in ("spread", "schedules", "why", "set", "problem", "best_key"):
        assert key in r
    text = capsys.readouterr().out
    assert text.count("| varied |") == 2 and "| runtime, as measured |" in text
