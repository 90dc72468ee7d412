"""How ``tiledtune`` ends on an error (issue 28, item 5): what the user can fix is one line
``tiledtune COMMAND: ...`` and exit status 2; anything else escaping a command is a bug, reported
with its traceback and exit status 1, never as a bad option; no decision reads an exception's
message."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tuner.cli import main
from tuner.commands import explain_cmd, search_cmd
from tuner.errors import TunerValueError, UsageError

ROOT = Path(__file__).resolve().parents[2]
SEARCH = ["search", "--device", "sm_90", "--backend", "simulated", "--shape", "2,8,1024,64",
          "--trials", "2"]
EXPLAIN = ["explain", "--device", "sm_90", "--shape", "1,8,256,64"]


def _one_line(err: str, prefix: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(prefix), err
    return lines[0]


def test_a_bad_option_is_one_line_and_exit_status_2(capsys, tmp_path):
    code = main([*SEARCH, "--db", str(tmp_path / "s.sqlite"), "--neighbour-trials", "5"])
    assert code == 2
    line = _one_line(capsys.readouterr().err, "tiledtune search: --neighbour-trials 5 ")
    assert "Traceback" not in line


def test_a_database_that_is_not_one_is_one_line_and_exit_status_2(capsys, tmp_path):
    bad = tmp_path / "not.sqlite"
    bad.write_text("this is not SQLite\n" * 100)
    assert main(["list", "--db", str(bad)]) == 2
    _one_line(capsys.readouterr().err, "tiledtune list: ")


def test_an_argparse_error_stays_exit_status_2(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["search", "--device", "sm_90", "--trials", "0"])
    assert exc.value.code == 2
    _one_line(capsys.readouterr().err, "tiledtune search: error: ")


@pytest.mark.parametrize("error", [
    ZeroDivisionError("division by zero"),
    ValueError("an internal ValueError"),  # once taken for a bad option
    TypeError("an internal TypeError"),
    TunerValueError("pick_winner needs at least one timed schedule"),  # ours, but a bug here
], ids=lambda e: type(e).__name__)
@pytest.mark.parametrize("argv, module, name", [
    (SEARCH, search_cmd, "problems_from"),
    (EXPLAIN, explain_cmd, "_steps"),
], ids=["search", "explain"])
def test_an_unexpected_exception_is_a_bug_report_with_exit_status_1(
        capsys, monkeypatch, tmp_path, error, argv, module, name):
    def broken(*args, **kwargs):
        raise error

    monkeypatch.setattr(module, name, broken)
    assert main([*argv, "--db", str(tmp_path / "s.sqlite")]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err
    assert f"{type(error).__name__}: {error}" in err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"tiledtune {argv[0]}: internal error: this is a bug"), err
    assert "report it" in last


def test_a_usage_error_raised_anywhere_in_a_command_is_exit_status_2(capsys, monkeypatch,
                                                                     tmp_path):
    def refuse(*args, **kwargs):
        raise UsageError("--shape 2,8,1024,64: refused\nfor a reason")

    monkeypatch.setattr(search_cmd, "problems_from", refuse)
    assert main([*SEARCH, "--db", str(tmp_path / "s.sqlite")]) == 2
    assert _one_line(capsys.readouterr().err, "tiledtune search: ") == \
        "tiledtune search: --shape 2,8,1024,64: refused for a reason"


def _message_tests(path: Path) -> list[str]:
    """``file:line`` of each comparison inside an ``except ... as name:`` that reads the
    exception's text (``str(name)``, ``name.args``)."""
    found = []
    for handler in ast.walk(ast.parse(path.read_text())):
        if not isinstance(handler, ast.ExceptHandler) or handler.name is None:
            continue
        for node in ast.walk(ast.Module(body=handler.body, type_ignores=[])):
            if not isinstance(node, ast.Compare):
                continue
            for part in ast.walk(node):
                text = (isinstance(part, ast.Call) and isinstance(part.func, ast.Name)
                        and part.func.id in ("str", "repr") and part.args
                        and isinstance(part.args[0], ast.Name)
                        and part.args[0].id == handler.name)
                args = (isinstance(part, ast.Attribute) and part.attr == "args"
                        and isinstance(part.value, ast.Name) and part.value.id == handler.name)
                if text or args:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_no_command_decides_by_an_exception_message():
    files = [ROOT / "tuner" / "cli.py", *sorted((ROOT / "tuner" / "commands").glob("*.py"))]
    assert [f for path in files for f in _message_tests(path)] == []


def test_the_message_check_finds_a_message_test(tmp_path, monkeypatch):
    path = ROOT / "tuner" / "commands" / "_planted.py"
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: (
        "try:\n    f()\nexcept ValueError as exc:\n    if 'space must be' not in str(exc):\n"
        "        raise\n"))
    assert _message_tests(path) == ["tuner/commands/_planted.py:4"]


def test_a_command_of_the_tune_extra_names_the_install_it_needs(monkeypatch, capsys):
    """Under the runtime-only install (no rich, optuna, sqlalchemy...), a command that needs
    them says which install brings them: exit 2, one line, no traceback."""
    import sys

    monkeypatch.setitem(sys.modules, "rich", None)  # import rich: ModuleNotFoundError
    monkeypatch.setitem(sys.modules, "rich.console", None)
    for name in [m for m in sys.modules if m.startswith("tuner.commands._report")
                 or m == "tuner.commands.list_cmd"]:
        monkeypatch.delitem(sys.modules, name)
    from tuner.cli import main

    assert main(["list"]) == 2
    err = capsys.readouterr().err
    assert "tiledattention[tune]" in err and "Traceback" not in err
