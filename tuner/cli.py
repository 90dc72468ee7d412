"""``tiledtune``: one command registry; each subcommand lives in its own module with
``configure(parser)`` and ``run(args) -> int``. ``main(argv)`` returns the exit code, so tests
call it directly.

Exit status, whatever the command: 2 for a bad option (argparse, or a command's
:class:`~tuner.errors.UsageError`) and for the other errors the user can act on
(:data:`~tuner.errors.USER_ERRORS`: a problem the kernel does not take, a database, study or
file that cannot be used; a module of ``tiledattention[tune]`` the runtime-only install lacks),
printed as one line ``tiledtune COMMAND: ...``; 1 for any other exception, which is a bug: its
traceback and a request to report it; 130 on Ctrl-C, 143 on SIGTERM, 141 (as for SIGPIPE) when
standard output is closed early by its reader (``tiledtune explain ... | head``), quietly.
Commands give 0 and 1 their own meanings besides (see each ``--help``): 1 is a result (nothing
matched, some row refused, some key without a schedule), never a missing GPU or another
condition of the environment, which is 2.

A Python warning raised while a command runs (the runtime's and the database's ``warnings.warn``:
a stored row that no longer decodes, a database that cannot be read) is reported as one line
``tiledtune COMMAND: warning: ...`` on standard error, without the source file and code line
Python would print; the warning filters still decide which are shown. The hook is installed for
the command's run only: the runtime itself keeps plain ``warnings.warn``, for its users to filter."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
import traceback
import warnings
from typing import Iterable, Iterator

from ._signals import Terminated, interrupts_once
from .commands._report import say
from .errors import USER_ERRORS

#: subcommand -> (module, one-line help)
COMMANDS = {
    "search": ("tuner.commands.search_cmd",
               "tune a kernel's schedules on a GPU (or --compile-only)"),
    "list": ("tuner.commands.list_cmd", "show the stored schedules"),
    "explain": ("tuner.commands.explain_cmd", "the schedule sdpa would run for a shape, and why"),
    "bench": ("tuner.commands.bench_cmd", "benchmark against PyTorch's attention backends"),
    "export": ("tuner.commands.export_cmd", "export stored schedules (bytarget module, json, csv)"),
    "import": ("tuner.commands.import_cmd", "merge exported schedule files into the database"),
    "restamp": ("tuner.commands.restamp_cmd",
                "carry rows over a template change that left their compiled code unchanged"),
    "aot": ("tuner.commands.aot_cmd",
            "compile shipped schedules into cubin bundles the runtime launches without a compiler"),
    "warm": ("tuner.commands.warm_cmd",
             "compile a model's kernels for this machine into the cubin cache, ahead of serving"),
    "hub-build": ("tuner.commands.hub_cmd", "lay out a Hugging Face Kernel Hub kernel (-o DIR)"),
    "profile": ("tuner.commands.profile_cmd",
                "a schedule's kernels under Nsight Compute: table and roofline (GPU + ncu)"),
}


#: what ``tiledattention[tune]`` adds to the runtime's dependencies (``pyproject.toml``)
TUNE_MODULES = frozenset({"rich", "optuna", "sqlalchemy", "alembic", "cupy"})


DESCRIPTION = (
    "Tune the schedules of tiledattention's cuTile attention kernels for your GPUs and shapes,\n"
    "and manage the schedule database that tiledattention.sdpa reads.")
EPILOG = """\
examples:
  tiledtune search --device sm_90 --shape 4,32/8,4096,128 --dtype bf16 --causal yes
  tiledtune search --compile-only --device sm_121 --shape 4,16,4096,128 --limit 16
  tiledtune list --arch sm_90
  tiledtune bench --quick --out bench-results

Results (tables, --json documents) go to standard output; progress, warnings and errors to
standard error. Run 'tiledtune COMMAND --help' for a command's options."""


class _Parser(argparse.ArgumentParser):
    """An argument error is one line, ``tiledtune COMMAND: error: ...``, and exit status 2 (the
    usage block argparse would print first is in ``--help``)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def build_parser(configured: Iterable[str] | None = None) -> argparse.ArgumentParser:
    """The parser of every command; ``configured``: only these commands get their options (the
    others keep their name and help), ``None``: every command. Configuring a command imports
    its module, so :func:`main` configures only the command it runs: a ``list`` or ``explain``
    does not pay for importing ``search`` or ``bench``."""
    parser = _Parser(prog="tiledtune", description=DESCRIPTION, epilog=EPILOG,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    wanted = None if configured is None else set(configured)
    for name, (module, help_text) in COMMANDS.items():
        command = sub.add_parser(name, help=help_text, description=help_text)
        if wanted is None or name in wanted:
            importlib.import_module(module).configure(command)
        command.set_defaults(_module=module)
    return parser


@contextlib.contextmanager
def warnings_reported(command: str) -> Iterator[None]:
    """Within the block, a warning that the filters let through is printed as one line
    ``tiledtune COMMAND: warning: MESSAGE`` (:func:`~tuner.commands._report.say`), not as
    Python's ``FILE:LINE: Category: MESSAGE`` and the code line. The previous hook and filters
    are restored on the way out."""

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        say(command, f"warning: {message}")

    with warnings.catch_warnings():
        warnings.showwarning = show
        yield


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # the command is the first argument (tiledtune has no options of its own but --help)
    parser = build_parser(argv[:1] if argv and argv[0] in COMMANDS else ())
    args = parser.parse_args(argv)
    args.argv = argv  # for commands that start copies of themselves (search --workers)
    module = None
    # a second Ctrl-C must not cut the cleanup of the first short
    with interrupts_once(), warnings_reported(args.command):
        try:
            module = importlib.import_module(args._module)
            return module.run(args)
        except Terminated:  # SIGTERM: cleaned up like a Ctrl-C, quietly
            return 143
        except BrokenPipeError:  # the reader of stdout went away (| head): nothing to report
            _discard_stdout()
            return 141
        except KeyboardInterrupt:  # the command killed its processes on the way out
            print(getattr(module, "INTERRUPTED", "interrupted"), file=sys.stderr)
            return 130
        except USER_ERRORS as exc:  # the message says what to change
            say(args.command, exc)
            return 2
        except Exception as exc:  # not ours to explain: a bug, never a "bad option"
            missing = getattr(exc, "name", None) if isinstance(exc, ModuleNotFoundError) else None
            if (missing or "").split(".")[0] in TUNE_MODULES:
                say(args.command, f"needs {missing}, which the runtime-only install leaves "
                                  "out: pip install 'tiledattention[tune]'")
                return 2
            traceback.print_exc()
            say(args.command, "internal error: this is a bug in tiledtune, not in your "
                              "options; please report it with the traceback above and the "
                              "command line")
            return 1


def _discard_stdout() -> None:
    """Point standard output at the null device, so the interpreter's final flush of what is
    left in its buffer cannot fail on the closed pipe again (with a message of its own)."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is not a file descriptor (an in-process caller's)
        pass


def program() -> None:
    """The ``tiledtune`` program (its console entry point): :func:`main`, then exit with its
    status. After a Ctrl-C or SIGTERM the process exits with both signals ignored, so a late
    second Ctrl-C cannot interrupt the interpreter's own exit (its atexit handlers) with a
    traceback; in-process callers of :func:`main` keep their handlers."""
    code = main()
    if code in (130, 143):
        import signal

        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.exit(code)


if __name__ == "__main__":
    program()
