"""What ``tiledtune`` prints, and where (issue 19): results on standard output, progress and
messages on standard error; tables printed in full when the output is not a terminal (a pipe, a
log file, CI: pytest's capture is one), ``--json`` for scripts; the ``B,HQ/HKV,SQ:SK,D`` shape
syntax; every numeric flag validated with a one-line message that names it."""

from __future__ import annotations

import argparse
import io
import json
import math
import re
from pathlib import Path

import pytest
from rich.console import Console
from rich.table import Table

from tiledattention import Problem
from tuner.bench import CONTENDERS, BenchResult, write_csv
from tuner.cli import build_parser, main
from tuner.commands import _problems, _report, search_cmd

ELLIPSIS = "…"


def _search_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tiledtune search")
    search_cmd.configure(parser)
    return parser.parse_args(["--device", "sm_90", *argv])


def _one_line_error(err: str, prefix: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(prefix), err
    return lines[0]


# -- item 1: streams, full tables, --json ---------------------------------------------------------

def _wide_table() -> Table:
    table = Table(title="wide")
    for name in ("key", "best schedule", "a long column heading", "another long heading"):
        table.add_column(name)
    table.add_row("B4 H32/8 S4096x8192 D128 bf16 causal",
                  "128x128 occ2 w8 exp2 approx lat(K4,V2) Kt persistent paired-tiles",
                  "cell three with words", "cell four with words")
    return table


def test_print_table_is_never_cut_on_a_narrow_terminal():
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=40, color_system=None)
    _report.print_table(console, _wide_table())
    text = buffer.getvalue()
    assert ELLIPSIS not in text
    assert max(len(line) for line in text.splitlines()) <= 40
    for part in ("paired-", "tiles", "H32/8", "causal"):  # wrapped, not dropped
        assert part in text


def test_results_console_off_a_terminal_prints_tables_at_full_width(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")  # rich would take this width, or 80, off a terminal
    console = _report.results_console()
    assert not console.is_terminal
    _report.print_table(console, _wide_table())
    out, err = capsys.readouterr()
    assert err == ""
    assert ELLIPSIS not in out
    row = next(line for line in out.splitlines() if "B4 H32/8" in line)
    assert "128x128 occ2 w8 exp2 approx lat(K4,V2) Kt persistent paired-tiles" in row
    assert len(row) > 80
    assert all(line == line.rstrip() for line in out.splitlines())  # no padded titles
    assert "\x1b[" not in out  # no colour codes in a log


def test_print_json_is_strict_json_with_a_header(capsys):
    problem = Problem(batch=1, heads_q=32, heads_kv=8, seqlen_q=1, seqlen_k=4096, head_dim=128,
                      dtype="bf16", causal=False)
    _report.print_json("explain", {"problem": problem, "ms": float("inf"), "path": Path("/x"),
                                   "nan": math.nan, "pair": (1, 2)})
    document = json.loads(capsys.readouterr().out)
    assert document == {"command": "explain", "format": _report.JSON_FORMAT,
                        "problem": problem.to_dict(), "ms": None, "path": "/x", "nan": None,
                        "pair": [1, 2]}


@pytest.mark.slow  # spawns the simulated backend's worker process
def test_search_results_go_to_stdout_and_name_the_database_and_storage(tmp_path, capsys):
    db = tmp_path / "s.sqlite"
    argv = ["search", "--device", "sm_90", "--backend", "simulated", "--space", "compact",
            "--shape", "2,8/2,1024,64", "--shape", "1,8,16:2048,64", "--trials", "3",
            "--db", str(db)]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "B2 H8/2 S1024 D64 bf16 full" in out and "B1 H8 S16x2048 D64 bf16 full" in out
    assert ELLIPSIS not in out
    assert f"schedule database: {db}" in out
    assert f"study storage: sqlite:///{tmp_path / 'tiledtune-studies.sqlite'}" in out
    assert "best schedule" not in err  # the table is not on stderr; progress is
    assert "B2 H8/2 S1024 D64" in err

    assert main(argv[:-2] + ["--db", str(db), "--json"]) == 0
    out, err = capsys.readouterr()
    document = json.loads(out)  # stdout holds the document and nothing else
    assert document["command"] == "search" and document["mode"] == "search"
    assert document["database"] == str(db)
    assert document["storage"] == f"sqlite:///{tmp_path / 'tiledtune-studies.sqlite'}"
    assert document["backend"] == "simulated" and document["arch"] == "sm_90"
    problems = [k["problem"] for k in document["keys"]]
    assert {(p["heads_q"], p["heads_kv"], p["seqlen_q"], p["seqlen_k"]) for p in problems} == {
        (8, 2, 1024, 1024), (8, 8, 16, 2048)}
    key = document["keys"][0]
    assert key["schedule"]["tile_m"] > 0 and key["median_ms"] > 0 and key["tflops"] > 0
    assert key["timings"]["best"]["median_ms"] == key["median_ms"]
    # the baselines are the simulated family's, named by the data
    assert key["baselines"] == ["torch-cudnn", "torch-flash"]
    assert set(key["speedup"]) == {"default", "torch-cudnn", "torch-flash"}
    assert key["speedup"]["torch-flash"] == pytest.approx(
        key["timings"]["torch-flash"]["median_ms"] / key["median_ms"])

    assert main(["list", "--db", str(db), "--json", "--limit", "1"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["command"] == "list" and listed["total"] == 2 and len(listed["rows"]) == 1
    assert listed["next_offset"] == 1
    assert listed["rows"][0]["problem"] in problems
    assert set(listed["rows"][0]["baselines_ms"]) == {"torch-cudnn", "torch-flash"}
    assert main(["list", "--db", str(db)]) == 0
    out, err = capsys.readouterr()
    assert "B1 H8 S16x2048 D64 bf16 full" in out and ELLIPSIS not in out and err == ""
    assert "vs torch-cudnn" in out and "vs torch-flash" in out and "cuDNN" not in out


def _search_summary(capsys, *, json_output: bool):
    """``search_cmd._print_results`` of two keys whose re-timings hold baselines no layer names
    (one of them failed on a key, one measured on one key only)."""
    from tuner.measure import TimingMode, summarize
    from tuner.search import KeyResult

    from tiledattention import FORWARD

    problems = [Problem(batch=1, heads_q=8, heads_kv=8, seqlen_q=s, seqlen_k=s, head_dim=64,
                        dtype="bf16", causal=False) for s in (256, 512)]
    results = [KeyResult(problem=p, arch="sm_90", best=FORWARD.default_schedule("sm_90", p),
                         timings={"best": summarize([1.0] * 5), "default": summarize([1.5] * 5),
                                  "vendor-lib": summarize([2.0] * 5),
                                  "torch-cudnn": "RuntimeError: no kernel"})
               for p in problems]
    results[1].timings["other-lib"] = summarize([0.5] * 5)
    args = argparse.Namespace(json=json_output, backend="simulated", study="tiledtune")
    search_cmd._print_results(args, FORWARD, results, database="/x/s.sqlite",
                              storage="sqlite:////x/st.sqlite", arch="sm_90",
                              device_name="Simulated GPU", timing=TimingMode())
    return capsys.readouterr().out


def test_search_summary_names_the_baselines_from_the_results(capsys):
    out = _search_summary(capsys, json_output=False)
    header = next(line for line in out.splitlines() if "best schedule" in line)
    assert [c.strip() for c in header.split("┃")[4:8]] == [
        "vs default", "vs other-lib", "vs torch-cudnn", "vs vendor-lib"]
    assert "cuDNN" not in out and "vs flash" not in out
    assert "2.00x" in out and "0.50x" in out and "RuntimeError: no ker" in out
    document = json.loads(_search_summary(capsys, json_output=True))
    first, second = document["keys"]
    assert first["baselines"] == ["torch-cudnn", "vendor-lib"]
    assert first["speedup"] == {"default": 1.5, "torch-cudnn": None, "vendor-lib": 2.0}
    assert second["baselines"] == ["other-lib", "torch-cudnn", "vendor-lib"]
    assert second["speedup"]["other-lib"] == 0.5
    assert second["timings"]["torch-cudnn"] == "RuntimeError: no kernel"


def test_list_json_without_a_database(tmp_path, capsys):
    assert main(["list", "--db", str(tmp_path / "absent.sqlite"), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["exists"] is False and document["rows"] == [] and document["total"] == 0


def _bench_rows() -> list[BenchResult]:
    rows = []
    for index, name in enumerate(CONTENDERS):
        ok = index % 3 != 2
        rows.append(BenchResult(
            contender=name, status="ok" if ok else "unavailable",
            reason="" if ok else "RuntimeError: no kernel for this shape",
            batch=4, heads=32, seqlen=4096, head_dim=64, dtype="bf16", causal=False,
            median_ms=1.0 + index if ok else None, tflops=100.0 + index if ok else None,
            spread_ms=0.01 if ok else None, samples=50 if ok else None))
    return rows


def test_bench_report_only_prints_tables_on_stdout_in_full_and_json(tmp_path, capsys):
    csv_path = write_csv(_bench_rows(), tmp_path / "bench.csv")
    assert main(["bench", "--report-only", str(csv_path), "--no-plots"]) == 0
    out, err = capsys.readouterr()
    assert ELLIPSIS not in out
    header = next(line for line in out.splitlines() if "tiledattention" in line)
    assert all(name in header for name in CONTENDERS)  # every column, none cut
    assert f"wrote {tmp_path / 'summary.md'}" in out
    assert "TFLOP/s" not in err

    assert main(["bench", "--report-only", str(csv_path), "--no-plots", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["command"] == "bench" and document["kernel"] == "forward"
    assert len(document["results"]) == len(CONTENDERS)
    assert document["results"][2]["status"] == "unavailable"
    assert document["written"] == [str(tmp_path / "summary.md")]
    assert "re-rendered from" in document["info"]["command"]


def test_top_level_help_describes_the_tool(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "one command registry" not in out and "``" not in out
    assert "Tune the schedules" in out and "standard output" in out


@pytest.mark.parametrize("command", ["search", "list", "bench", "import", "restamp"])
def test_every_option_has_help(command):
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = [a.option_strings[0] for a in sub.choices[command]._actions
               if a.option_strings and a.help is None]
    assert not missing, f"tiledtune {command}: options without help: {missing}"


@pytest.mark.parametrize("command", ["search", "list", "bench"])
def test_json_flag(command):
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert "--json" in sub.choices[command]._option_string_actions


# -- item 3: the shape syntax ---------------------------------------------------------------------

@pytest.mark.parametrize("text, parsed", [
    ("4,16,4096,128", (4, 16, None, 4096, None, 128)),
    ("4,32/8,4096,128", (4, 32, 8, 4096, None, 128)),
    ("1,16,1:4096,128", (1, 16, None, 1, 4096, 128)),
    ("2, 32/8, 16:8192, 128", (2, 32, 8, 16, 8192, 128)),
])
def test_shape_syntax(text, parsed):
    assert tuple(_problems.parse_shape(text))[1:] == parsed


@pytest.mark.parametrize("text", ["1,8,1024", "1,8,1024,64,1", "1,8/3/2,256,64", "1,8,1:2:3,64",
                                  "1,8,0,64", "1,8,-1,64", "1,8,1:,64", "1,/8,4,64", "a,b,c,d",
                                  "", "1,8,1e3,64"])
def test_bad_shapes_are_refused_naming_the_syntax(text, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["search", "--device", "sm_90", "--shape", text])
    assert exc.value.code == 2
    line = _one_line_error(capsys.readouterr().err, "tiledtune search: error: argument --shape")
    assert "B,HQ/HKV,SQ:SK,D" in line


def test_shapes_become_grouped_query_and_cross_attention_problems():
    args = _search_args("--shape", "4,32/8,4096,128", "--shape", "1,16,16:8192,64",
                        "--dtype", "bf16,fp16", "--causal", "yes")
    problems = _problems.problems_from(args)
    assert len(problems) == 4
    shapes = {(p.batch, p.heads_q, p.heads_kv, p.seqlen_q, p.seqlen_k, p.head_dim)
              for p in problems}
    assert shapes == {(4, 32, 8, 4096, 4096, 128), (1, 16, 16, 16, 8192, 64)}
    assert {p.dtype for p in problems} == {"bf16", "fp16"} and all(p.causal for p in problems)


def test_deprecated_kv_heads_and_seqlen_k_apply_to_exactly_one_shape():
    args = _search_args("--shape", "1,8,256,64", "--kv-heads", "2", "--seqlen-k", "512")
    (problem,) = _problems.problems_from(args)
    assert (problem.heads_kv, problem.seqlen_k) == (2, 512)
    for argv, words in [
        (["--shape", "1,8,256,64", "--shape", "2,8,256,64", "--kv-heads", "2"],
         "--kv-heads 2 needs exactly one --shape (got 2)"),
        (["--preset", "llama-gqa", "--seqlen-k", "512"], "--seqlen-k 512 needs exactly one"),
        (["--shape", "1,8/4,256,64", "--kv-heads", "2"], "gives it already"),
        (["--shape", "1,8,256:300,64", "--seqlen-k", "512"], "gives it already"),
    ]:
        with pytest.raises(ValueError, match=re.escape(words)):
            _problems.problems_from(_search_args(*argv))


@pytest.mark.slow  # spawns the simulated backend's worker process
def test_deprecated_flags_still_work_and_print_the_new_syntax(tmp_path, capsys):
    assert main(["search", "--device", "sm_90", "--backend", "simulated", "--space", "compact",
                 "--shape", "1,8,256,64", "--kv-heads", "2", "--seqlen-k", "512",
                 "--trials", "1", "--db", str(tmp_path / "s.sqlite")]) == 0
    out, err = capsys.readouterr()
    assert ("tiledtune search: note: --kv-heads and --seqlen-k are deprecated; write --shape "
            "1,8/2,256:512,64") in err
    assert "B1 H8/2 S256x512 D64 bf16 full" in out


# -- item 3: numeric (and empty) values are refused, naming the flag ------------------------------

@pytest.mark.parametrize("argv, words", [
    (["search", "--workers", "0"], "argument --workers: expected an integer >= 1; got '0'"),
    (["search", "--timeout", "0"], "argument --timeout: expected a duration above zero"),
    (["search", "--timeout", "-5m"], "argument --timeout"),
    (["search", "--patience", "-3"], "argument --patience: expected an integer >= 0"),
    (["search", "--jobs", "-1"], "argument --jobs: expected an integer >= 1; got '-1'"),
    (["search", "--trials", "0"], "argument --trials: expected an integer >= 1"),
    (["search", "--limit", "-1"], "argument --limit: expected an integer >= 1"),
    (["search", "--seed", "-1"], "argument --seed: expected an integer in 0..4294967295"),
    (["search", "--seed", "4294967296"], "argument --seed"),
    (["search", "--kv-heads", "0"], "argument --kv-heads: expected an integer >= 1"),
    (["search", "--seqlen-k", "x"], "argument --seqlen-k: expected an integer >= 1"),
    (["search", "--neighbour-trials", "-1"], "argument --neighbour-trials: expected an integer"),
    (["search", "--db", ""], "argument --db: expected a non-empty value"),
    (["search", "--storage", " "], "argument --storage: expected a non-empty value"),
    (["search", "--study", ""], "argument --study: expected a non-empty value"),
    (["list", "--limit", "-1"], "argument --limit: expected an integer >= 0"),
    (["list", "--offset", "x"], "argument --offset: expected an integer >= 0"),
    (["list", "--db", ""], "argument --db: expected a non-empty value"),
    (["import", "x.json", "--db", ""], "argument --db: expected a non-empty value"),
    (["restamp", "--from", "HEAD", "--jobs", "0"], "argument --jobs: expected an integer >= 1"),
], ids=lambda x: " ".join(x) if isinstance(x, list) else None)
def test_bad_values_are_one_line_naming_the_flag(argv, words, capsys):
    command = argv[0]
    if command == "search":
        argv = [*argv, "--device", "sm_90", "--shape", "1,8,256,64"]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    line = _one_line_error(capsys.readouterr().err, f"tiledtune {command}: error: ")
    assert words in line


@pytest.mark.parametrize("argv, words", [
    (["--neighbour-trials", "80", "--trials", "60"],
     "--neighbour-trials 80 is more than --trials 60"),
    (["--limit", "5"], "--limit 5 applies to --compile-only only"),
    (["--space", "nope"], "--space nope: space must be one of"),
    (["--workers", "2", "--backend", "simulated"], "--workers 2 starts one search per local GPU"),
    (["--shape", "1,8,99999999999,64"], "--shape 1,8,99999999999,64: not a problem the forward "
                                        "kernel takes: seqlen_q must be at most 2147483647"),
    (["--shape", "1,8/3,256,64"], "--shape 1,8/3,256,64: not a problem the forward kernel "
                                  "takes: heads_q (8) must be a multiple of heads_kv (3)"),
    (["--shape", "1,8,256,64", "--seqlen-k", "99999999999"],
     "--shape 1,8,256,64 --seqlen-k 99999999999: not a problem"),
    (["--preset", "llama-gqa", "--kv-heads", "4"], "--kv-heads 4 needs exactly one --shape"),
    (["--problem", "batch=1,heads_q=2,heads_kv=1,seqlen_q=0,seqlen_k=4,head_dim=64,"
                   "dtype=bf16,causal=false"], "--problem batch=1,"),
], ids=lambda x: " ".join(x) if isinstance(x, list) else None)
def test_values_that_depend_on_each_other_are_one_line_naming_the_flag(argv, words, tmp_path,
                                                                        capsys):
    db = tmp_path / "s.sqlite"
    shape = [] if any(a in argv for a in ("--shape", "--preset", "--problem")) else [
        "--shape", "1,8,256,64"]
    code = main(["search", "--device", "sm_90", "--backend", "simulated", *shape, *argv,
                 "--db", str(db)])
    assert code == 2
    line = _one_line_error(capsys.readouterr().err, "tiledtune search: ")
    assert words in line
    assert not db.exists()  # refused before anything was opened


@pytest.mark.parametrize("argv, words", [
    (["--tokens", "99999999999", "--seqlens", "99999999999"],
     "--tokens/--hidden/--seqlens/--head-dims: B=1 H=32 S=99999999999 D=64"),
    (["--kernel", "backward", "--tokens", "99999999999", "--seqlens", "99999999999"],
     "is not a problem the kernels take"),
], ids=["forward", "backward"])
def test_bench_grid_points_must_be_problems(argv, words, capsys):
    assert main(["bench", *argv, "--head-dims", "64"]) == 2
    assert words in " ".join(capsys.readouterr().err.split())


def test_a_reader_that_closes_stdout_early_ends_the_command_quietly(tmp_path):
    """``tiledtune explain ... | head -1``: the reader goes away before the command has written
    its answer. The command ends with 141 (SIGPIPE's status) and no traceback, no "internal
    error" and no "Exception ignored" from the interpreter's last flush."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "TILEDATTN_DB": str(tmp_path / "db.sqlite")}
    reader_gone = subprocess.Popen(
        [sys.executable, "-m", "tuner.cli", "explain", "--device", "sm_90", "--shape",
         "2,32/8,4096,128", "--dtype", "bf16", "--causal", "yes"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    reader_gone.stdout.close()  # like head after its first line, only sooner
    _, err = reader_gone.communicate(timeout=120)
    assert reader_gone.returncode == 141, err.decode()
    assert b"Traceback" not in err and b"internal error" not in err and b"Exception" not in err
