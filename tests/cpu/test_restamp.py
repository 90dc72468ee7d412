"""``tiledtune restamp`` end to end: real old code in a separate process, real compiles for
sm_90, a real rows file. The "old code" is a copy of the current packages with one change."""

from __future__ import annotations

import dataclasses
import importlib.util
import shutil
from pathlib import Path

import pytest

import db
from tiledattention import FORWARD, Problem, Schedule
from tiledattention.tooling import codecs, current_provenance
from tiledattention.core._identity import source_identity
from tuner.cli import main

ROOT = Path(__file__).resolve().parents[2]
PROBLEM = Problem(batch=1, heads_q=2, heads_kv=2, seqlen_q=128, seqlen_k=128, head_dim=64,
                  dtype="bf16", causal=True)


def _old_code(tmp_path: Path, module: str, old: str, new: str) -> tuple[Path, str]:
    """A copy of tiledattention/ and db/ whose ``module`` has ``old`` replaced by ``new``, and
    that copy's forward template identity."""
    tree = tmp_path / "old"
    for package in ("tiledattention", "db"):
        shutil.copytree(ROOT / package, tree / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    path = tree / (module.replace(".", "/") + ".py")
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    texts = []
    for name in FORWARD.template_modules:
        origin = Path(importlib.util.find_spec(name).origin)
        texts.append((name, (tree / origin.relative_to(ROOT)).read_text()))
    return tree, source_identity(texts)


def _rows_file(tmp_path: Path, identity: str) -> Path:
    stamped = dataclasses.replace(current_provenance(FORWARD), template_hash=identity)
    rows = [db.ScheduleRow(family="forward", arch="sm_90", device_name="GPU", problem=p,
                           schedule=Schedule(tile_m=64, tile_n=64, occupancy=2),
                           median_ms=1.0, spread_ms=0.01, tflops=1.0, trials=3,
                           provenance=prov)
            for p, prov in ((PROBLEM, stamped),
                            (dataclasses.replace(PROBLEM, seqlen_q=256),
                             dataclasses.replace(stamped, template_hash="000000000000")))]
    path = tmp_path / "rows.json"
    db.dump_rows(rows, path)
    return path


def _identities(path: Path) -> list[str]:
    return [r.provenance.template_hash for r in db.load_rows_file(path, codecs())]


@pytest.mark.slow  # compiles in a separate process
@pytest.mark.parametrize("relative", [False, True], ids=["absolute", "relative"])
def test_code_change_without_effect_on_text_is_restamped(tmp_path, capsys, monkeypatch,
                                                         relative):
    old, identity = _old_code(tmp_path, "tiledattention.kernels.forward._launch",
                              "def default_scale(", "_UNUSED = 1\n\n\ndef default_scale(")
    assert identity != FORWARD.template_identity()
    path = _rows_file(tmp_path, identity)
    if relative:  # --from DIR relative to the working directory, not the old code's process's
        monkeypatch.chdir(old.parent)
        old = Path(old.name)
    assert main(["restamp", "--from", str(old), "--file", str(path), "--jobs", "2"]) == 1
    out = capsys.readouterr().out
    assert "re-stamped 1; 1 need re-tuning" in out and "not " in out  # the unrelated row
    assert _identities(path) == [FORWARD.template_identity(), "000000000000"]


@pytest.mark.slow  # compiles in a separate process
def test_code_change_that_changes_text_is_listed_for_retuning(tmp_path, capsys):
    old, identity = _old_code(tmp_path, "tiledattention.kernel_core.numbers",
                              "NEG_BIG = -1.0e30", "NEG_BIG = -1.0e29")
    path = _rows_file(tmp_path, identity)
    before = path.read_bytes()
    assert main(["restamp", "--from", str(old), "--file", str(path), "--jobs", "2"]) == 1
    assert "compiled code changed" in capsys.readouterr().out
    assert path.read_bytes() == before  # nothing re-stamped, nothing written


def test_unknown_revision_is_one_line(tmp_path, capsys):
    path = _rows_file(tmp_path, "111111111111")
    code = main(["restamp", "--from", "no-such-revision-xyz", "--file", str(path)])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("tiledtune restamp: ") and "Traceback" not in err


@pytest.mark.parametrize("where", ["--file", "--db"])
def test_an_unknown_revision_is_refused_when_no_row_is_stale(tmp_path, capsys, where):
    """Issue 45: with every row current, ``--from nosuchrev`` was never looked at (exit 0)."""
    path = _rows_file(tmp_path, FORWARD.template_identity())
    if where == "--db":
        rows = db.load_rows_file(path, codecs())
        path = tmp_path / "current.sqlite"
        with db.ScheduleDB(path, codecs=codecs()) as store:
            for row in rows:
                store.put(dataclasses.replace(row, provenance=current_provenance(FORWARD)))
    before = path.read_bytes()
    capsys.readouterr()
    assert main(["restamp", "--from", "nosuchrev", where, str(path)]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("tiledtune restamp: --from must be a git revision") and \
        "'nosuchrev'" in err and len(err.strip().splitlines()) == 1, err
    assert path.read_bytes() == before
