"""Carry tuned rows over a change of kernel template that left their compiled code unchanged.

A row whose template identity is not the current one is ignored by the lookup. When the change
between the code that tuned it (a git revision of this repository, or a directory holding that
code's packages) and the code installed now did
not change what its schedule compiles to, its timing still holds: ``restamp`` compiles every such
row's schedule with both versions of the code (compile-only, for the row's architecture) and
compares the executable ``.text`` sections of the two cubins (debug-line sections change with
comments and do not count). Rows whose code is identical get the current identity; the others
are listed for re-tuning.

The old code runs in a separate Python process whose ``PYTHONPATH`` starts with a ``git archive``
of the revision (or the directory); it is driven by a small script that speaks both the family
API (``tiledattention.get_family``) and the single-kernel API the project had before families.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from db import ScheduleRow, canonical_json
from tiledattention import CompileError, get_family
from tiledattention.tooling import text_digest

from ..errors import RestampError, UsageError

__all__ = ["RestampResult", "restamp", "check_source", "old_code_digests", "current_digest",
           "describe_row"]

#: Run by the old code's interpreter: reads JSON jobs on stdin, prints the old code's identity of
#: each family named and, per job, the cubin (base64) or the error. The digest is taken here, by
#: the current ``text_digest``, so both sides are compared by one function.
_OLD_SCRIPT = r'''
import base64, json, sys
from concurrent.futures import ProcessPoolExecutor
import tiledattention

def family_api(name):
    get = getattr(tiledattention, "get_family", None)
    return get(name) if get is not None else None

def identity(name):
    fam = family_api(name)
    if fam is not None:
        return fam.template_identity()
    from tiledattention._provenance import template_hash   # before kernel families
    return template_hash()

def compile_one(job):
    name, problem, schedule, arch = job
    try:
        fam = family_api(name)
        if fam is not None:
            built = fam.compile(fam.problem_type.from_dict(problem),
                                fam.schedule_type.from_dict(schedule), arch)
        else:
            from tiledattention import Problem, Schedule, compile_schedule
            built = compile_schedule(Problem(**problem), Schedule.from_dict(schedule), arch)
        return {"cubins": [base64.b64encode(c).decode()
                           for c in (built.cubin, *getattr(built, "other_cubins", ()))]}
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {str(exc).strip()[:300]}"}

if __name__ == "__main__":
    request = json.load(sys.stdin)
    where = tiledattention.__file__
    answers = {"module": where,
               "identities": {n: identity(n) for n in request["families"]}}
    with ProcessPoolExecutor(max_workers=request["jobs"]) as pool:
        answers["results"] = list(pool.map(compile_one, [tuple(j) for j in request["jobs_list"]]))
    print(json.dumps(answers))
'''


@dataclass
class RestampResult:
    restamped: list[ScheduleRow]  # the rows with their new identity
    retune: list[tuple[ScheduleRow, str]]  # rows whose code changed (or could not be checked)
    current: list[ScheduleRow]  # rows already of the current template


def _job(row: ScheduleRow) -> tuple:
    """What both codes compile for ``row``. The schedule leaves out the fields its type added
    since its format was first written (``ADDED_FIELDS``) where they hold their default, the
    value that means "what the kernel did before the field existed": code older than a field
    reads the schedule it tuned, and code that has the field fills the same default in."""
    schedule = row.schedule.to_dict()
    defaults = {f.name: f.default for f in dataclasses.fields(row.schedule)}
    for name in getattr(type(row.schedule), "ADDED_FIELDS", ()):
        if name in schedule and schedule[name] == defaults.get(name):
            del schedule[name]
    return (row.family, row.problem.to_dict(), schedule, row.arch)


def current_digest(job: tuple) -> str:
    """The ``.text`` digest of a row's schedule compiled by the code installed now (or
    ``"error: ..."``)."""
    name, problem, schedule, arch = job
    family = get_family(name)
    try:
        built = family.compile(family.problem_type.from_dict(problem),
                               family.schedule_type.from_dict(schedule), arch)
    except CompileError as exc:
        return f"error: {exc}"
    return _digest((built.cubin, *built.other_cubins))


def _digest(cubins: Sequence[bytes]) -> str:
    """One digest over the ``.text`` of every kernel a schedule builds (decode: split and
    combine)."""
    return "+".join(text_digest(c) for c in cubins)


def _repository() -> Path:
    import tiledattention

    root = Path(tiledattention.__file__).resolve().parents[1]
    if not (root / ".git").exists():
        raise RestampError(f"the installed tiledattention ({root}) is not a git checkout: "
                           "restamp needs the repository to read the old revision from")
    return root


def check_source(source: str) -> None:
    """Raise :class:`UsageError` (``--from`` named) unless ``source`` is a directory holding a
    ``tiledattention`` package or a commit of this repository; :class:`RestampError` when the
    installed package is not a git checkout to read a revision from."""
    if (Path(source) / "tiledattention" / "__init__.py").is_file():
        return
    expected = "a git revision of this repository or a directory holding tiledattention/"
    if not source.strip() or source.startswith("-"):
        raise UsageError(f"--from must be {expected}; got {source!r}")
    root = _repository()
    done = subprocess.run(["git", "-C", str(root), "rev-parse", "--verify", "--quiet",
                           f"{source}^{{commit}}"], capture_output=True, text=True)
    if done.returncode != 0:
        raise UsageError(f"--from must be {expected}; got {source!r}, which is neither (no "
                         f"such commit in {root}, and no tiledattention/ in a directory of "
                         "that name)")


def _old_tree(source: str, tmp: Path) -> Path:
    """The directory holding the old ``tiledattention`` package: ``source`` itself when it is
    such a directory, else a ``git archive`` of revision ``source`` of this repository."""
    if (Path(source) / "tiledattention" / "__init__.py").is_file():
        return Path(source).resolve()  # the old code's process runs in another directory
    root = _repository()
    archive = tmp / "old.tar"
    done = subprocess.run(["git", "-C", str(root), "archive", "--format=tar", "-o",
                           str(archive), source], capture_output=True, text=True)
    if done.returncode != 0:
        raise UsageError(f"--from {source!r}: neither a directory holding tiledattention/ nor "
                         f"a revision git archive can read: {done.stderr.strip()[:300]}")
    tree = tmp / "tree"
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    return tree


def old_code_digests(source: str, jobs: Sequence[tuple], families: Iterable[str], *,
                     workers: int) -> tuple[dict[str, str], list[str]]:
    """``({family: old identity}, [digest or "error: ..." per job])`` from the old code:
    ``source`` is a git revision of this repository or a directory holding its packages."""
    with tempfile.TemporaryDirectory(prefix="tiledtune-restamp-") as tmp:
        tree = _old_tree(source, Path(tmp))
        script = Path(tmp) / "old_code.py"
        script.write_text(_OLD_SCRIPT)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(tree), *filter(None, [os.environ.get("PYTHONPATH")])])}
        request = {"families": sorted(set(families)), "jobs": workers,
                   "jobs_list": [list(j) for j in jobs]}
        done = subprocess.run([sys.executable, str(script)], input=json.dumps(request),
                              capture_output=True, text=True, cwd=tmp, env=env)
        if done.returncode != 0:
            raise RestampError(f"the code of {source!r} failed: "
                               f"{done.stderr.strip().splitlines()[-1:]}")
        answer = json.loads(done.stdout.strip().splitlines()[-1])
        if not Path(answer["module"]).resolve().is_relative_to(tree.resolve()):
            raise RestampError(f"the old code was not the one imported ({answer['module']})")
    results = [_digest([base64.b64decode(c) for c in r["cubins"]]) if "cubins" in r
               else f"error: {r.get('error')}" for r in answer["results"]]
    return answer["identities"], results


def restamp(rows: Sequence[ScheduleRow], revision: str, *, workers: int = 2) -> RestampResult:
    """Re-stamp the rows of ``rows`` that ``revision``'s code tuned and whose compiled code is
    unchanged now (see the module docstring). ``revision`` is checked first, whether or not a
    row is stale (:func:`check_source`)."""
    check_source(revision)
    current_ids = {name: get_family(name).template_identity() for name in {r.family for r in rows}}
    fresh = [r for r in rows if r.provenance.template_hash == current_ids[r.family]]
    stale = [r for r in rows if r.provenance.template_hash != current_ids[r.family]]
    result = RestampResult(restamped=[], retune=[], current=fresh)
    if not stale:
        return result
    jobs = [_job(r) for r in stale]
    old_ids, old = old_code_digests(revision, jobs, current_ids, workers=workers)
    with ProcessPoolExecutor(max_workers=workers) as pool:
        new = list(pool.map(current_digest, jobs))
    for row, before, after in zip(stale, old, new):
        if row.provenance.template_hash != old_ids.get(row.family):
            result.retune.append((row, f"tuned with template {row.provenance.template_hash}, "
                                       f"not {revision}'s ({old_ids.get(row.family)})"))
        elif before.startswith("error") or after.startswith("error"):
            failed = before if before.startswith("error") else after
            result.retune.append((row, f"cannot compare: {failed}"[:300]))
        elif before != after:
            result.retune.append((row, "compiled code changed"))
        else:
            provenance = dataclasses.replace(row.provenance,
                                             template_hash=current_ids[row.family])
            result.restamped.append(dataclasses.replace(row, provenance=provenance))
    return result


def describe_row(row: ScheduleRow) -> str:
    return (f"{row.family} {row.arch} {row.problem.describe()} "
            f"{canonical_json(row.schedule.to_dict())}")
