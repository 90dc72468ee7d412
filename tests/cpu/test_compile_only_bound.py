"""``tiledtune search --compile-only`` is bounded: per key it compiles ``--trials`` candidates
(the architecture default first, then a seeded sample), and the full space only with
``--sweep``, which first says how many candidates that is and how long it should take (issue 19,
item 4). The compile job is replaced by stand-ins (module functions, so that the spawned compile
processes import them), which keeps these tests fast; ``test_interrupt`` and ``test_tuner``
compile for real."""

from __future__ import annotations

import json

import optuna
import pytest

import search_spaces
from tiledattention import FORWARD, Problem
from tiledattention.tooling import KernelResources
from tuner.cli import main

SHAPE = ["--device", "sm_121", "--shape", "1,4,256,64", "--space", "compact", "--jobs", "2"]
PROBLEM = Problem(batch=1, heads_q=4, heads_kv=4, seqlen_q=256, seqlen_k=256, head_dim=64,
                  dtype="bf16", causal=False)


def compiles(family, problem, schedule, arch):
    """Every candidate compiles, in 2 s (as ``compile_job`` reports it), to a kernel of 48 to
    80 KiB of shared memory; those of 128-row tiles keep 16 bytes a thread on the stack."""
    spills = schedule.tile_m == 128
    return 2.0, (KernelResources(symbol="attention_fwd", registers=168, threads=256,
                                 stack_bytes=16 if spills else 0,
                                 shared_bytes=(80 if spills else 48) * 1024),), None


def refuses(family, problem, schedule, arch):
    """Every candidate fails to compile (so each is recorded in the study, by its key)."""
    return 0.1, None, f"{schedule.describe()} does not compile for {arch} (test)"


def _feasible() -> int:
    spaces = search_spaces.family_space("forward")
    space = spaces.restrict(spaces.space("sm_121", "compact"), PROBLEM)
    return len({FORWARD.normalise(PROBLEM, s).key for s in space.feasible(PROBLEM)})


def _recorded(tmp_path) -> list[str]:
    """The schedule keys the compile-only runs recorded as failed, in the one study."""
    storage = f"sqlite:///{tmp_path / 'tiledtune-studies.sqlite'}"
    (summary,) = optuna.get_all_study_summaries(storage)
    study = optuna.load_study(study_name=summary.study_name, storage=storage)
    assert all(t.user_attrs["status"] == "compile-error" for t in study.trials)
    return [t.user_attrs["schedule_key"] for t in study.trials]


def test_without_sweep_exactly_trials_candidates_are_compiled_and_a_rerun_resumes(
        tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("tuner.search.compile_job", refuses)
    argv = ["search", "--compile-only", *SHAPE, "--trials", "5", "--db",
            str(tmp_path / "schedules.sqlite"), "--json"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    total = _feasible()
    assert total > 5
    assert f"compiling 5 of {total} feasible candidates (--sweep compiles all)" in captured.err
    (key,) = json.loads(captured.out)["keys"]
    assert (key["candidates"], key["feasible"], key["failed"], key["compiled"]) == (5, total, 5, 0)
    keys = _recorded(tmp_path)
    assert len(keys) == 5 == len(set(keys))  # five distinct normalised candidates
    assert FORWARD.normalise(PROBLEM, FORWARD.default_schedule("sm_121", PROBLEM)).key in keys

    # the same command again: the same five, all settled, so nothing is compiled or recorded
    assert main(argv) == 0
    (key,) = json.loads(capsys.readouterr().out)["keys"]
    assert (key["settled_before"], key["failed"], key["compiled"]) == (5, 0, 0)
    assert sorted(_recorded(tmp_path)) == sorted(keys)


def test_a_sweep_first_prints_its_size_and_time_and_nothing_failed_prints_no_failures(
        tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("tuner.search.compile_job", compiles)
    assert main(["search", "--compile-only", "--sweep", *SHAPE, "--db",
                 str(tmp_path / "schedules.sqlite")]) == 0
    captured = capsys.readouterr()
    total = _feasible()
    size = (f"full sweep of B1 H4 S256 D64 bf16 full for sm_121: {total} candidates to compile "
            f"({total} feasible, 0 settled before) on 2 processes")
    # one compile timed first (the stand-in's 2 s), the others two at a time
    rounds = -(-(total - 1) // 2)
    estimate = (f"estimated time: about {2 * rounds} s for the other {total - 1} (2.0 s per "
                f"compile, 2 at a time)")
    assert " ".join(captured.err.split()).startswith(f"{size} {estimate}"), captured.err
    assert f"{total} of {total}" in captured.out  # the table: every candidate compiled
    assert "infeasible" not in captured.out + captured.err  # nothing failed: nothing recorded

    # the sweep into another database, as JSON: the main kernels' shared-memory range and the
    # candidates that spill
    assert main(["search", "--compile-only", "--sweep", *SHAPE, "--db",
                 str(tmp_path / "other.sqlite"), "--json"]) == 0
    (key,) = json.loads(capsys.readouterr().out)["keys"]
    spaces = search_spaces.family_space("forward")
    space = spaces.restrict(spaces.space("sm_121", "compact"), PROBLEM)
    tall = {FORWARD.normalise(PROBLEM, s).key for s in space.feasible(PROBLEM)
            if FORWARD.normalise(PROBLEM, s).tile_m == 128}
    assert 0 < len(tall) < total
    assert key["spilling"] == len(tall) and key["shared_memory_bytes"] == [48 << 10, 80 << 10]


@pytest.mark.parametrize("argv, message", [
    (["--sweep"], "--sweep compiles every candidate with --compile-only; add --compile-only"),
    (["--compile-only", "--sweep", "--limit", "3"], "drop --limit"),
], ids=["without-compile-only", "with-limit"])
def test_sweep_is_refused_where_it_means_nothing(argv, message, capsys):
    assert main(["search", *SHAPE, *argv]) == 2
    assert message in capsys.readouterr().err
