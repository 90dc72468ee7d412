"""A second kernel family (``toy_family.py``, no edit anywhere else) goes through the whole tool:
``search --backend simulated``, ``list``, ``export`` (json, csv, bytarget), ``import`` and the
lookup."""

from __future__ import annotations

import dataclasses
import importlib.util
import json

import pytest

import db
import search_spaces
from tiledattention import FORWARD, DeviceInfo, families, get_family
from tiledattention.tooling import Resolver, codecs
from tuner.cli import main
from tuner.measure import SimulatedExecutor

from .toy_family import TOY, ToyProblem, ToySchedule

DEVICE = DeviceInfo(index=0, arch="sm_90", name="Simulated GPU", sm_count=132)


def test_the_toy_family_is_registered_beside_the_forward_one():
    assert get_family("toy") is TOY and get_family("forward") is FORWARD
    assert {"forward", "toy"} <= {f.name for f in families()}
    assert set(codecs()) >= {"forward", "toy"}


@pytest.mark.slow
def test_search_list_export_import_and_lookup_serve_a_second_family(tmp_path, capsys,
                                                                    monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # rich tables: no truncated cells
    store = tmp_path / "tuned.sqlite"
    studies = f"sqlite:///{tmp_path}/studies.sqlite"
    search = ["search", "--kernel", "toy", "--device", "sm_90", "--backend", "simulated",
              "--trials", "9", "--patience", "0", "--db", str(store), "--storage", studies]
    assert main([*search, "--problem", "n=1024,dtype=bf16"]) == 0
    assert main([*search, "--problem", "n=4096,dtype=bf16", "--trials", "4"]) == 0
    with db.ScheduleDB.open_for_lookup(store, codecs=codecs()) as database:
        rows = database.rows(family="toy")
    assert [r.problem for r in rows] == [ToyProblem(n=1024, dtype="bf16"),
                                         ToyProblem(n=4096, dtype="bf16")]
    assert all(isinstance(r.schedule, ToySchedule) and r.family == "toy"
               and r.backend == "simulated" for r in rows)
    space = list(search_spaces.space_for("toy", "sm_90"))
    assert len(space) == 9  # 9 trials cover the whole space: the winner is the model's optimum
    assert rows[0].schedule == SimulatedExecutor(family=TOY).optimum(rows[0].problem, space)
    assert all(r.provenance.template_hash == TOY.template_identity() for r in rows)

    capsys.readouterr()
    assert main(["list", "--db", str(store), "--kernel", "toy"]) == 0
    listed = capsys.readouterr().out
    assert "toy" in listed and "n=1024 bf16" in listed
    assert main(["list", "--db", str(store), "--kernel", "forward"]) == 0
    assert "0 of 0 schedules" in capsys.readouterr().out

    exported = {fmt: tmp_path / f"toy.{fmt}" for fmt in ("json", "csv", "py")}
    for path in exported.values():
        assert main(["export", "--db", str(store), "--kernel", "toy", "-o", str(path)]) == 0
    assert {r["family"] for r in json.loads(exported["json"].read_text())["rows"]} == {"toy"}
    spec = importlib.util.spec_from_file_location("toy_bytarget", exported["py"])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.select("toy", "sm_90", n=1024, dtype="bf16") == rows[0].schedule.to_dict()
    assert module.select("toy", "sm_90", n=3000, dtype="bf16") == rows[1].schedule.to_dict()
    assert module.select("toy", "sm_90", n=1024, dtype="fp16") is None

    for fmt in ("json", "csv"):
        copy = tmp_path / f"imported-{fmt}.sqlite"
        assert main(["import", "--db", str(copy), str(exported[fmt])]) == 0
        with db.ScheduleDB.open_for_lookup(copy, codecs=codecs()) as database:
            assert database.rows() == rows

    # the simulated search's rows never answer a lookup; the same rows measured on a GPU do
    def resolver(path):
        return Resolver(open_user=lambda: db.ScheduleDB.open_for_lookup(path, codecs=codecs()),
                        open_shipped=lambda arch: None)

    simulated = resolver(store)(TOY, ToyProblem(n=1024, dtype="bf16"), DEVICE)
    assert (simulated.source, simulated.schedule) == ("default", ToySchedule(block=64))
    measured = tmp_path / "measured.sqlite"
    with db.ScheduleDB(measured, codecs=codecs()) as database:
        for r in rows:
            database.put(dataclasses.replace(r, backend="gpu"))
    resolve = resolver(measured)
    exact = resolve(TOY, ToyProblem(n=1024, dtype="bf16"), DEVICE)
    assert (exact.source, exact.schedule) == ("exact-device", rows[0].schedule)
    near = resolve(TOY, ToyProblem(n=3000, dtype="bf16"), DEVICE)
    assert (near.source, near.schedule) == ("nearest", rows[1].schedule)
    other = resolve(TOY, ToyProblem(n=1024, dtype="fp16"), DEVICE)
    assert (other.source, other.schedule) == ("default", ToySchedule(block=64))
    # the forward family's lookup does not see the toy rows
    forward = resolve(FORWARD, FORWARD.problem_type(
        batch=1, heads_q=8, heads_kv=8, seqlen_q=1024, seqlen_k=1024, head_dim=64,
        dtype="bf16", causal=False), DEVICE)
    assert forward.source != "exact-device"


def test_unknown_kernel_is_one_clear_line(tmp_path, capsys):
    code = main(["search", "--kernel", "nope", "--device", "sm_90", "--backend", "simulated",
                 "--problem", "n=1,dtype=bf16", "--db", str(tmp_path / "s.sqlite")])
    assert code == 2
    err = capsys.readouterr().err
    assert "kernel must be one of" in err and "'nope'" in err and "Traceback" not in err
    assert not (tmp_path / "s.sqlite").exists()
