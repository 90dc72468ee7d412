"""Faults of issue 45, point 4, each as a user met it on a CPU machine: warnings in the tool's
own one-line form, the README's exit statuses (2: usage or environment, 1: a bug or a result),
architectures validated by one validator, and public-API calls on CPU tensors that name the
argument that is wrong rather than the device of q. Nothing here launches a kernel."""

from __future__ import annotations

import sqlite3
import warnings
from pathlib import Path

import pytest
import torch

import db
import tiledattention as ta
from tiledattention import FORWARD, Problem, Schedule, TiledAttentionError, tooling
from tiledattention.tooling import codecs
from tuner import cli

PROV = tooling.current_provenance(FORWARD)
BF16 = torch.bfloat16


def _malformed_db(tmp_path: Path) -> Path:
    """A database of two rows, the first with a schedule that is not JSON."""
    path = tmp_path / "rows.sqlite"
    with db.ScheduleDB(path, codecs=codecs()) as store:
        for s in (100, 200):
            problem = Problem(batch=1, heads_q=16, heads_kv=16, seqlen_q=s, seqlen_k=s,
                              head_dim=128, dtype="bf16", causal=False)
            store.put(db.ScheduleRow(family="forward", arch="sm_90", device_name="Other GPU",
                                     problem=problem, schedule=Schedule(tile_m=32, tile_n=32),
                                     median_ms=1.0, spread_ms=0.0, tflops=1.0, trials=1,
                                     provenance=PROV, default_ms=1.2))
    connection = sqlite3.connect(path)
    connection.execute("UPDATE schedules SET schedule = '{bad' WHERE id = 1")
    connection.commit()
    connection.close()
    return path


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


# -- warnings through the tool's own reporting ------------------------------------------------
@pytest.mark.parametrize("command", ["export", "search"])
def test_a_malformed_row_is_one_warning_line_without_source_or_code(command, tmp_path, capfd,
                                                                    monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path = _malformed_db(tmp_path)
    if command == "export":
        argv = ["export", "--db", str(path), "-o", str(tmp_path / "rows.json")]
    else:  # a simulated search reads the stored rows for its seeds
        argv = ["search", "--device", "sm_90", "--backend", "simulated", "--shape",
                "1,16,300,128", "--trials", "1", "--patience", "0", "--db", str(path)]
    before = warnings.showwarning
    assert cli.main(argv) == 0
    err = capfd.readouterr().err
    told = [line for line in _lines(err) if "skipping the stored forward schedule" in line]
    assert len(told) == 1, err
    assert told[0].startswith(f"tiledtune {command}: warning: tiledattention: skipping"), err
    assert "RuntimeWarning" not in err and "_queries.py" not in err, err
    assert "return self." not in err, err  # Python's echo of the warning's code line
    assert warnings.showwarning is before  # the hook is the command's, not the process's


def test_the_runtime_keeps_plain_python_warnings(tmp_path):
    """Outside ``tiledtune`` the runtime's warnings are Python warnings users can filter."""
    path = _malformed_db(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with db.ScheduleDB.open_for_lookup(path, codecs=codecs()) as store:
            assert len(store.rows()) == 1
    assert [w.category for w in caught] == [RuntimeWarning]


# -- exit statuses: a usage or environment condition is 2, in one line --------------------------
def _no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


def _not_text(tmp_path: Path) -> Path:
    path = tmp_path / "bench.csv"
    path.write_bytes(b"contender,status\n\xa0\xff\xfe not utf-8\n")
    return path


ENVIRONMENT = {
    "bench-without-gpu": (lambda tmp: ["bench", "--quick", "--out", str(tmp / "b")],
                          "no CUDA device"),
    "bench-report-not-text": (lambda tmp: ["bench", "--report-only", str(_not_text(tmp))],
                              "not UTF-8 text"),
    "profile-without-gpu": (lambda tmp: ["profile", "--device", "sm_90", "--shape",
                                         "1,8,256,64"], "no CUDA GPU"),
    "search-without-gpu": (lambda tmp: ["search", "--device", "sm_90", "--shape", "1,8,512,64",
                                        "--trials", "1", "--db", str(tmp / "s.sqlite")],
                           "no local GPU is sm_90"),
    "search-workers-without-gpu": (lambda tmp: ["search", "--device", "sm_90", "--shape",
                                                "1,8,512,64", "--workers", "2", "--db",
                                                str(tmp / "s.sqlite")], "--workers 2"),
    "hub-build-under-a-file": (lambda tmp: ["hub-build", "-o", str(_a_file(tmp) / "kernel")],
                               "hub-build"),
    "list-not-a-database": (lambda tmp: ["list", "--db", str(_a_file(tmp))],
                            "not a SQLite database"),
    "export-not-a-database": (lambda tmp: ["export", "--db", str(_a_file(tmp)), "-o",
                                           str(tmp / "x.json")], "not a SQLite database"),
}


def _a_file(tmp: Path) -> Path:
    path = tmp / "plain.txt"
    path.write_text("not a directory, not a database\n")
    return path


@pytest.mark.parametrize("case", list(ENVIRONMENT))
def test_usage_and_environment_conditions_exit_2_in_one_line(case, tmp_path, capsys,
                                                             monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    _no_gpu(monkeypatch)
    argv, said = ENVIRONMENT[case]
    assert cli.main(argv(tmp_path)) == 2
    err = _lines(capsys.readouterr().err)
    assert len(err) == 1 and said in err[0] and "Traceback" not in err[0], err


# -- --arch / --device: one validator --------------------------------------------------------
@pytest.mark.parametrize("argv, flag", [
    (["list", "--arch", "sm_999"], "--arch"),
    (["export", "--arch", "sm_90,sm_999", "-o", "x.json"], "--arch"),
    (["explain", "--device", "sm_999", "--shape", "1,8,512,64"], "--device"),
    (["profile", "--device", "sm_999", "--shape", "1,8,512,64"], "--device"),
    (["search", "--device", "sm_999", "--shape", "1,8,512,64"], "--device"),
], ids=["list", "export", "explain", "profile", "search"])
def test_an_unknown_architecture_is_refused_naming_the_option(argv, flag, tmp_path, capsys,
                                                              monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    try:
        code = cli.main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    assert code == 2
    err = _lines(capsys.readouterr().err)
    assert len(err) == 1, err
    assert flag in err[0] and "sm_90, sm_100" in err[0] and "'sm_999'" in err[0], err
    assert not (tmp_path / "x.json").exists()


# -- public-API calls on CPU tensors name the argument that is wrong ----------------------------
def _t(*shape, dtype=BF16, grad=False):
    return torch.randn(*shape, dtype=dtype).requires_grad_(grad)


def _i32(*values):
    return torch.tensor(values, dtype=torch.int32)


Q, K, V = _t(1, 4, 16, 64), _t(1, 4, 16, 64), _t(1, 4, 16, 64)
LSE = torch.zeros(1, 4, 16)
PACKED = _t(32, 4, 64)
CU = _i32(0, 16, 32)
QD, PAGES, TABLE, USED = _t(1, 4, 1, 64), _t(4, 16, 4, 64), _i32(0, 1, 2, 3).reshape(1, 4), _i32(40)

BAD_CALLS = {
    # sdpa: the arrays
    "sdpa-rank": (lambda: ta.sdpa(Q[0], K, V), "q must have 4 dims"),
    "sdpa-head-dim": (lambda: ta.sdpa(Q, _t(1, 4, 16, 32), _t(1, 4, 16, 32)),
                      "k must have the head_dim of q"),
    "sdpa-batch": (lambda: ta.sdpa(Q, _t(2, 4, 16, 64), _t(2, 4, 16, 64)),
                   "k must have the batch size of q"),
    "sdpa-dtype-mix": (lambda: ta.sdpa(Q, _t(1, 4, 16, 64, dtype=torch.float16), V),
                       "q, k and v must have one dtype"),
    "sdpa-heads": (lambda: ta.sdpa(_t(1, 3, 16, 64), _t(1, 2, 16, 64), _t(1, 2, 16, 64)),
                   "q's heads (3) must be a multiple of k's heads (2)"),
    "sdpa-scale-type": (lambda: ta.sdpa(Q, K, V, scale="0.1"), "scale must be a float"),
    "sdpa-window": (lambda: ta.sdpa(Q, K, V, window=(4,)), "window must be None or a pair"),
    # sdpa: arguments checked after the problem
    "sdpa-out-shape": (lambda: ta.sdpa(Q, K, V, out=_t(1, 4, 16, 32)), "out must have q's shape"),
    "sdpa-out-dtype": (lambda: ta.sdpa(Q, K, V, out=_t(1, 4, 16, 64, dtype=torch.float16)),
                       "out must have q's dtype"),
    "sdpa-sinks-shape": (lambda: ta.sdpa(Q, K, V, sinks=torch.zeros(3)),
                         "sinks must have shape [H_q]"),
    "sdpa-sinks-type": (lambda: ta.sdpa(Q, K, V, sinks=[0.0] * 4), "sinks must be a torch.Tensor"),
    "sdpa-grad-sinks": (lambda: ta.sdpa(_t(1, 4, 16, 64, grad=True), K, V,
                                        sinks=torch.zeros(3)), "sinks must have shape [H_q]"),
    "sdpa-ranges-with-out": (lambda: ta.sdpa(Q, K, V, ranges=torch.zeros(4, 1, dtype=torch.int32),
                                             out=torch.empty_like(Q)),
                             "ranges= takes no schedule= or out="),
    "explain-sinks": (lambda: ta.explain(Q, K, V, sinks=torch.zeros(3)),
                      "sinks must have shape [H_q]"),
    # training entry points
    "sdpa_with_lse-sinks": (lambda: ta.sdpa_with_lse(Q, K, V, sinks=torch.zeros(3)),
                            "sinks must have shape [H_q]"),
    "sdpa_backward-grad_out": (lambda: ta.sdpa_backward(_t(1, 4, 16, 32), Q, K, V, Q, LSE),
                               "grad_out must have q's shape"),
    "sdpa_backward-out": (lambda: ta.sdpa_backward(Q, Q, K, V, _t(1, 4, 16, 32), LSE),
                          "out must have q's shape"),
    "sdpa_backward-lse": (lambda: ta.sdpa_backward(Q, Q, K, V, Q, torch.zeros(1, 4, 15)),
                          "lse must be the float32"),
    "sdpa_backward-grads": (lambda: ta.sdpa_backward(Q, Q, K, V, Q, LSE,
                                                     grads=(Q, K, _t(1, 4, 16, 32))),
                            "grads[2] must have v's shape"),
    "sdpa_backward-grads-type": (lambda: ta.sdpa_backward(Q, Q, K, V, Q, LSE, grads=True),
                                 "grads must be a tuple (dq, dk, dv)"),
    "sdpa_backward-grads-count": (lambda: ta.sdpa_backward(Q, Q, K, V, Q, LSE, grads=(Q, K)),
                                  "or None; got tuple of 2"),
    # an unhashable flag is named, not hashed into the warm path's key
    "sdpa_backward-deterministic": (lambda: ta.sdpa_backward(Q, Q, K, V, Q, LSE,
                                                             deterministic=[True]),
                                    "deterministic must be a bool; got [True]"),
    # varlen
    "varlen-cu_seqlens": (lambda: ta.varlen_attn(PACKED, PACKED, PACKED, _i32(0, 16), CU, 16, 16),
                          "cu_seq_q and cu_seq_k must have one length"),
    # (a packed batch past a grid's second dimension runs: its launches walk work tables; a
    # padded one is refused)
    "ranges-grid": (lambda: ta.sdpa(*(_t(65, 1024, 1, 64),) * 3,
                                    ranges=torch.zeros(4, 65, dtype=torch.int32)), "65535"),
    # paged
    "paged-page-table": (lambda: ta.paged_attention(QD, PAGES, PAGES, TABLE.float(), USED),
                         "block_table must be an int32 tensor"),
    "paged-max_k": (lambda: ta.paged_attention(QD, PAGES, PAGES, TABLE, USED, max_k=0),
                    "max_k must be a positive int"),
    "paged-scale": (lambda: ta.paged_attention(QD, PAGES, PAGES, TABLE, USED, scale=-1.0),
                    "scale must be a finite positive number"),
    "paged-window": (lambda: ta.paged_attention(QD, PAGES, PAGES, TABLE, USED, window=(1,)),
                     "window must be None or a pair"),
    "paged-causal": (lambda: ta.paged_attention(_t(1, 4, 2, 64), PAGES, PAGES, TABLE, USED,
                                                causal="top_left"), "causal='top_left'"),
    "paged-sinks": (lambda: ta.paged_attention(QD, PAGES, PAGES, TABLE, USED,
                                               sinks=torch.zeros(3)),
                    "sinks must have shape [H_q]"),
    "paged-grad": (lambda: ta.paged_attention(_t(1, 4, 1, 64, grad=True), PAGES, PAGES, TABLE,
                                              USED), "no autograd"),
    "explain_paged-max_k": (lambda: ta.explain_paged(QD, PAGES, PAGES, TABLE, USED, max_k=0),
                            "max_k must be a positive int"),
}


@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_a_bad_call_on_cpu_tensors_names_the_wrong_argument(case):
    call, said = BAD_CALLS[case]
    with pytest.raises(TiledAttentionError) as raised:
        call()
    message = str(raised.value)
    assert said in message and "CUDA" not in message, message


@pytest.mark.parametrize("call, said", [
    (lambda: ta.sdpa(Q, K, V, out=torch.empty_like(Q)), "q must be a CUDA tensor; got a tensor "
                                                        "on cpu"),
    (lambda: ta.sdpa_backward(Q, Q, K, V, Q, LSE), "q must be a CUDA tensor"),
    (lambda: ta.varlen_attn(PACKED, PACKED, PACKED, CU, CU, 16, 16), "query must be a CUDA "
                                                                    "tensor"),
    (lambda: ta.paged_attention(QD, PAGES, PAGES, TABLE, USED), "q, k_pages and v_pages must be "
                                                              "CUDA tensors"),
], ids=["sdpa", "sdpa_backward", "varlen_attn", "paged_attention"])
def test_a_right_call_on_cpu_tensors_is_still_told_its_device(call, said):
    with pytest.raises(ta.InputValueError, match=said.replace("[", r"\[")):
        call()


def test_profile_to_an_out_folder_that_cannot_be_made_exits_2(tmp_path, capsys, monkeypatch):
    """On the GPU path (faked: ncu found, nothing measured) an ``--out`` under a regular file
    is a usage error, refused before the ceilings are measured."""
    from tuner import profile
    from tuner.commands import profile_cmd

    monkeypatch.setattr(profile, "check_profilable", lambda arch: "ncu")
    monkeypatch.setattr(profile_cmd, "_ceilings", lambda: pytest.fail("measured before --out"))
    argv = ["profile", "--device", "sm_90", "--shape", "1,8,256,64", "--default", "--out",
            str(_a_file(tmp_path) / "prof")]
    assert cli.main(argv) == 2
    err = _lines(capsys.readouterr().err)
    assert len(err) == 1 and "--out" in err[0] and "Traceback" not in err[0], err


def test_bench_to_an_out_folder_that_cannot_be_written_exits_2_before_measuring(
        tmp_path, capsys, monkeypatch):
    """``bench --out`` naming a file (a folder that cannot be made) is refused in one line,
    exit 2, before any point is measured (it used to fail with a traceback after the grid)."""
    import torch

    from tuner.commands import bench_cmd

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: None)

    def measured(*args, **kwargs):
        raise AssertionError("the grid was measured")

    monkeypatch.setattr(bench_cmd, "run_grid", measured)
    monkeypatch.setattr(bench_cmd, "copy_gbps", measured)
    monkeypatch.setattr(bench_cmd, "matmul_tflops", measured)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    assert cli.main(["bench", "--quick", "--out", str(blocker / "results")]) == 2
    err = capsys.readouterr().err
    assert "--out" in err and "cannot write" in err and "Traceback" not in err
    assert len([line for line in err.splitlines() if line.strip()]) == 1
