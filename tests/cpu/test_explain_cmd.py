"""``tiledtune explain`` on the CPU: each lookup step named with its reason, the family sdpa
picks by shape (decode at its cache-length band), the training pair (forward + backward), the
nearest row's problem and distance, the same answer as the library's runtime, and no GPU asked."""

from __future__ import annotations

import dataclasses
import json
import warnings

import pytest

import db
import tiledattention
from tiledattention import BACKWARD, DECODE, FORWARD, DeviceInfo, Problem, Schedule, shipped_table
from tiledattention.tooling import codecs, current_provenance
from tuner import cli
from tuner.commands.explain_cmd import WHY

H100 = "NVIDIA H100 80GB HBM3"
H200 = "NVIDIA H200"
PROBLEM = Problem(batch=2, heads_q=8, heads_kv=8, seqlen_q=1024, seqlen_k=1024, head_dim=96,
                  dtype="bf16", causal=True)  # D 96: a bucket the shipped table lacks
FAST = Schedule(tile_m=64, tile_n=32, occupancy=3)
OTHER = Schedule(tile_m=128, tile_n=64, occupancy=2)


def row(problem, schedule, device, ms, template=None):
    prov = current_provenance(FORWARD)
    if template:
        prov = dataclasses.replace(prov, template_hash=template)
    return db.ScheduleRow(family="forward", arch="sm_90", device_name=device, problem=problem,
                          schedule=schedule, median_ms=ms, spread_ms=0.01, tflops=10.0,
                          trials=9, provenance=prov, default_ms=ms * 1.2)


@pytest.fixture
def user_db(tmp_path):
    path = tmp_path / "user.sqlite"
    with db.ScheduleDB(path, codecs=codecs()) as store:
        store.put(row(PROBLEM, FAST, H100, 0.5))
        store.put(row(PROBLEM, OTHER, H200, 0.4))  # faster, but another device
        store.put(row(dataclasses.replace(PROBLEM, seqlen_q=1000, seqlen_k=1000), OTHER, H200,
                      0.3, template="0000000000ff"))  # another template: skipped, said once
    return path


@pytest.fixture(autouse=True)
def no_gpu(monkeypatch):
    """explain must never ask a GPU what it is."""
    import torch

    def refuse(*args, **kwargs):
        raise AssertionError("explain asked the GPU")

    monkeypatch.setattr(torch.cuda, "get_device_properties", refuse)
    monkeypatch.setattr(torch.cuda, "is_available", refuse)


def explain(capsys, *argv):
    code = cli.main(["explain", *map(str, argv), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out), err


@pytest.mark.parametrize("device_name, source, schedule, device", [
    (H100, "exact-device", FAST, H100),  # this device's row, though another GPU's is faster
    ("NVIDIA A100", "exact-arch", OTHER, H200),  # no row of its own: the fastest of the arch
    ("", "exact-arch", OTHER, H200),  # no name given: no row is this device's
], ids=["exact-device", "exact-arch", "no-device-name"])
def test_user_rows_answer_first(capsys, user_db, device_name, source, schedule, device):
    doc, err = explain(capsys, "--device", "sm_90", "--device-name", device_name, "--db",
                       user_db, "--shape", "2,8,1024,96", "--causal", "yes")
    (step,) = doc["lookups"]
    assert (step["role"], step["family"], step["source"]) == ("sdpa", "forward", source)
    assert Schedule.from_dict(step["schedule"]) == schedule
    assert step["row"]["device"] == device and step["row"]["source"] == "user"
    assert step["why"] == WHY[source].format(arch="sm_90", device=device_name or "-")
    assert doc["sources"]["user"] == {"location": str(user_db), "found": True}
    assert "tuned with another kernel template" in err  # the runtime's warning, one line
    assert err.count("\n") == 1 and err.startswith("tiledtune explain: warning: ")


def test_text_output_names_family_schedule_source_and_why(capsys, user_db):
    code = cli.main(["explain", "--device", "sm_90", "--device-name", H100, "--db", str(user_db),
                     "--shape", "2,8,1024,96", "--causal", "yes"])
    out = capsys.readouterr().out
    assert code == 0
    assert "family forward: sdpa's dispatch rule for sm_90" in out
    assert f"schedule {FAST.describe()}" in out
    assert "source   exact-device: a row of the user database for this exact problem, measured " \
           f"on this device ({H100})" in out
    assert f"row      B2 H8 S1024 D96 bf16 causal on {H100}: 0.5 ms, 9 trials (user)" in out


def test_without_a_database_the_shipped_table_answers(capsys, tmp_path):
    shipped = [r for r in shipped_table("sm_90") if r.family == "forward"][0]
    p = shipped.problem
    shape = f"{p.batch},{p.heads_q}/{p.heads_kv},{p.seqlen_q}:{p.seqlen_k},{p.head_dim}"
    doc, _ = explain(capsys, "--device", "sm_90", "--db", tmp_path / "none.sqlite", "--shape",
                     shape, "--dtype", p.dtype, "--causal", "yes" if p.causal else "no")
    (step,) = doc["lookups"]
    assert step["source"] == "shipped" and step["family"] == "forward"
    assert Schedule.from_dict(step["schedule"]) == shipped.schedule
    assert step["row"]["source"] == "shipped" and step["row"]["median_ms"] == shipped.median_ms
    assert doc["sources"]["user"]["found"] is False
    assert doc["sources"]["shipped"]["table"] == "tiledattention/pretuned/sm_90.json"
    assert not (tmp_path / "none.sqlite").exists()  # looking creates no database


def test_nearest_shows_the_stored_problem_and_its_distance(capsys, user_db):
    doc, _ = explain(capsys, "--device", "sm_121", "--db", user_db, "--shape", "2,8,1024,96",
                     "--causal", "yes")  # no sm_121 rows, no shipped table: the default
    assert doc["lookups"][0]["source"] == "default" and doc["lookups"][0]["row"] is None
    assert doc["sources"]["shipped"] is None
    doc, _ = explain(capsys, "--device", "sm_90", "--db", user_db, "--shape", "2,8,2048,96",
                     "--causal", "yes")  # distance 2 > FORWARD.nearest_limit: the default
    assert doc["lookups"][0]["source"] == "default"
    doc, _ = explain(capsys, "--device", "sm_90", "--db", user_db, "--shape", "3,8,1024,96",
                     "--causal", "yes")
    (step,) = doc["lookups"]
    assert step["source"] == "nearest"
    assert Problem.from_dict(step["row"]["problem"]) == PROBLEM
    assert step["detail"].startswith(PROBLEM.describe())
    stored = Problem.from_dict(step["row"]["problem"])
    asked = Problem.from_dict(step["problem"])
    assert step["row"]["distance"] == pytest.approx(FORWARD.distance(stored, asked))
    assert step["row"]["distance"] > 0
    # two rows at that distance: the faster one (another device's) answers
    assert Schedule.from_dict(step["schedule"]) == OTHER and step["row"]["device"] == H200


def test_decode_shapes_run_the_decode_family_at_the_cache_band(capsys, tmp_path):
    doc, _ = explain(capsys, "--device", "sm_90", "--db", tmp_path / "none.sqlite", "--shape",
                     "1,32/8,1:30000,128")
    (step,) = doc["lookups"]
    assert step["family"] == "decode"
    assert "S_q = 1" in step["why_family"]
    assert Problem.from_dict(step["problem"]).seqlen_k == 32768  # sdpa's lookup key
    assert Problem.from_dict(doc["problem"]).seqlen_k == 30000
    assert step["source"] == "shipped"  # the shipped table holds this decode key


def test_training_explains_the_forward_and_the_backward(capsys, tmp_path):
    doc, _ = explain(capsys, "--device", "sm_90", "--db", tmp_path / "none.sqlite", "--shape",
                     "1,32/8,16:4096,128", "--training")  # decode-sized, still the forward
    forward, backward = doc["lookups"]
    assert (forward["role"], forward["family"]) == ("forward", "forward")
    assert (backward["role"], backward["family"]) == ("backward", "backward")
    assert "whatever the shape" in forward["why_family"]
    assert BACKWARD.schedule_type.from_dict(backward["schedule"]) is not None
    only, _ = explain(capsys, "--device", "sm_90", "--db", tmp_path / "none.sqlite",
                      "--kernel", "backward", "--shape", "1,32/8,16:4096,128")
    assert only["lookups"] == [dict(backward, why_family="--kernel")]


def test_kernel_flag_says_when_sdpa_would_run_another_family(capsys, tmp_path):
    doc, _ = explain(capsys, "--device", "sm_90", "--db", tmp_path / "none.sqlite", "--kernel",
                     "decode", "--problem", "batch=4,heads_q=16,heads_kv=16,seqlen_q=4096,"
                     "seqlen_k=4096,head_dim=128,dtype=bf16,causal=no")
    (step,) = doc["lookups"]
    assert step["family"] == "decode"
    assert step["why_family"] == "--kernel (sdpa itself would run forward for this shape)"
    assert DECODE.schedule_type.from_dict(step["schedule"]) == DECODE.default_schedule(
        "sm_90", Problem.from_dict(step["problem"]))


def test_bottom_right_causal(capsys, tmp_path):
    doc, _ = explain(capsys, "--device", "sm_90", "--db", tmp_path / "none.sqlite", "--shape",
                     "2,8,512:2048,96", "--causal", "bottom_right")
    assert Problem.from_dict(doc["problem"]).bottom_right is True


def test_agrees_with_the_library_runtime(capsys, user_db, monkeypatch):
    """The command's answer is the one sdpa's runtime gives on an H100 with this database."""
    import tiledattention.core._runtime as runtime_module

    monkeypatch.setattr(runtime_module, "device_info",
                        lambda index: DeviceInfo(index=index, arch="sm_90", name=H100,
                                                 sm_count=132))
    tiledattention.use_database(str(user_db))
    try:
        for shape, causal in (("2,8,1024,96", "yes"), ("2,8,2048,96", "yes"),
                              ("4,16,4096,128", "no"), ("1,32/8,1:30000,128", "no")):
            doc, _ = explain(capsys, "--device", "sm_90", "--device-name", H100, "--db",
                             user_db, "--shape", shape, "--causal", causal)
            (step,) = doc["lookups"]
            family = tiledattention.get_family(step["family"])
            key = Problem.from_dict(step["problem"])
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the stale row, said by both
                resolution = tiledattention.runtime().resolution(family, key, 0)
            assert (resolution.source, resolution.detail) == (step["source"], step["detail"])
            assert family.schedule_type.from_dict(step["schedule"]) == resolution.schedule
    finally:
        tiledattention.use_database(None)


@pytest.mark.parametrize("argv, message", [
    (["--shape", "2,8,1024"], "expected B,H,S,D or B,HQ/HKV,SQ:SK,D"),
    (["--shape", "2,8,1024,96", "--causal", "maybe"], "expected yes, no or bottom_right"),
    ([], "give one problem"),
    (["--shape", "2,8/3,1024,96"], "must be a multiple of heads_kv"),
    (["--shape", "2,8,1024,96", "--kernel", "no_such_family"], "no_such_family"),
], ids=["short-shape", "causal", "no-problem", "bad-gqa", "unknown-kernel"])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, message):
    try:
        code = cli.main(["explain", "--device", "sm_90", *argv])
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and err.startswith("tiledtune explain: ") and err.count("\n") == 1
