"""Compare the machine code (``.text``) of the kernels between an old revision and the tree now.

A rewrite of a kernel that is meant to change nothing is checked against the compiled code, not
against timings: every build below is compiled, compile-only, by the code of ``--from`` (a ``git
archive`` of that revision, in a process of its own) and by the working tree (likewise), and the
``.text`` digests of every cubin a build makes (decode: split and combine; backward: dK/dV, dQ
and the partials' sum) must agree. ``tiledtune restamp`` does this for the shipped table's rows
and re-stamps them; this script covers what has no row:

- ``defaults``: each family's per-architecture default schedule (``Family.default_schedule``)
  for every problem of the shipped table and for a list of variant problems (windows of either
  side, both causal alignments, softcap, sinks, ragged and paged batches, a split head dim);
- ``forward-extras``: the forward's constants that no family build compiles (the log-sum-exp
  output of the training forward, a ragged call's work table, a padded ragged batch);
- ``rows``: the shipped table's rows themselves (what restamp compiles, for iterating on a
  rewrite without writing the table).

Usage: ``python scripts/compare_kernel_text.py --from REV [--set defaults] [--family decode]
[--jobs 2] [--cache old.json]``; ``--cache`` keeps the old code's digests between runs (keyed by
the revision and the build). Exit status 0 when every build has the same ``.text``, 1 when some
differ or fail on one side only, 2 on a usage error.

Issue 46's kernel core was checked so (``--from 90dfbc4 --set all``: 500 builds, 0 differ; the
commit that re-stamped the shipped table quotes it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "tiledattention" / "pretuned" / "sm_90.json"
ARCH = "sm_90"

#: Variant problems beyond the table's, as ``Problem`` fields over a base shape per family.
_FORWARD = dict(batch=2, heads_q=16, heads_kv=4, seqlen_q=1000, seqlen_k=1000, head_dim=128,
                dtype="bf16", causal=True)
_DECODE = dict(batch=4, heads_q=32, heads_kv=8, seqlen_q=1, seqlen_k=8192, head_dim=128,
               dtype="bf16", causal=False)
_BACKWARD = dict(batch=2, heads_q=16, heads_kv=4, seqlen_q=1000, seqlen_k=1000, head_dim=128,
                 dtype="bf16", causal=True)
VARIANTS = {
    "forward": [
        {}, {"causal": False}, {"seqlen_k": 1500, "bottom_right": True},
        {"seqlen_q": 1500, "bottom_right": True}, {"head_dim": 96}, {"head_dim": 80},
        {"window_left": 127, "window_right": 0}, {"window_left": 100},
        {"causal": False, "window_left": 64, "window_right": 32},
        {"causal": False, "window_right": 64}, {"causal": False, "window_left": 64},
        {"seqlen_k": 1500, "bottom_right": True, "window_left": 200},
        {"softcap": 30.0}, {"sinks": True}, {"window_left": 127, "softcap": 20.0, "sinks": True},
        {"ragged": True}, {"ragged": True, "causal": False},
        {"ragged": True, "bottom_right": True, "seqlen_k": 1500, "window_left": 64},
        {"ragged": True, "sinks": True, "softcap": 10.0},
        {"ragged": True, "seqlen_q": 16, "seqlen_k": 4096, "bottom_right": True,
         "page_size": 64},
        {"ragged": True, "seqlen_q": 16, "seqlen_k": 4096, "bottom_right": True,
         "page_size": 16, "head_dim": 96},
    ],
    "decode": [
        {}, {"seqlen_k": 1000}, {"seqlen_q": 4, "causal": True, "bottom_right": True},
        {"seqlen_q": 4, "causal": True}, {"window_left": 1023, "window_right": 0},
        {"causal": True, "bottom_right": True, "window_left": 511},
        {"window_left": 256, "window_right": 16}, {"window_right": 100},
        {"softcap": 30.0}, {"sinks": True}, {"sinks": True, "seqlen_k": 300},
        {"causal": True, "bottom_right": True, "window_left": 1023, "softcap": 30.0,
         "sinks": True},
        {"ragged": True, "causal": True, "bottom_right": True},
        {"ragged": True, "causal": True, "bottom_right": True, "page_size": 64},
        {"ragged": True, "causal": True, "bottom_right": True, "page_size": 16,
         "window_left": 500, "sinks": True},
        {"head_dim": 64, "heads_q": 64}, {"head_dim": 256, "heads_q": 16},
    ],
    "backward": [
        {}, {"causal": False}, {"seqlen_k": 1500, "bottom_right": True},
        {"seqlen_q": 1500, "bottom_right": True}, {"head_dim": 96},
        {"window_left": 127, "window_right": 0}, {"window_left": 100},
        {"causal": False, "window_left": 64, "window_right": 32},
        {"causal": False, "window_right": 64}, {"causal": False, "window_left": 64},
        {"seqlen_k": 1500, "bottom_right": True, "window_left": 200},
        {"softcap": 30.0}, {"sinks": True}, {"window_left": 127, "softcap": 20.0},
        {"ragged": True}, {"ragged": True, "causal": False},
        {"ragged": True, "bottom_right": True, "seqlen_k": 1500, "window_left": 64},
        {"ragged": True, "softcap": 10.0},
        {"batch": 1, "heads_q": 8, "heads_kv": 1, "seqlen_q": 4096, "seqlen_k": 4096,
         "causal": False},
    ],
}
BASES = {"forward": _FORWARD, "decode": _DECODE, "backward": _BACKWARD}
#: the forward's constants no family build compiles: (problem change, kernel_constants flags)
FORWARD_EXTRAS = [
    ({}, {"store_lse": True}), ({"causal": False}, {"store_lse": True}),
    ({"window_left": 127, "sinks": True, "softcap": 20.0}, {"store_lse": True}),
    ({"ragged": True}, {"store_lse": True, "packed": True}),
    ({"ragged": True}, {"packed": False}),
    ({"ragged": True}, {"packed": True, "work_table": True}),
    ({"ragged": True, "window_left": 64, "bottom_right": True, "seqlen_k": 1500},
     {"packed": True, "work_table": True, "store_lse": True}),
]

#: Run by each side's interpreter (the old revision's tree or the working tree first on
#: PYTHONPATH): reads JSON jobs on stdin, prints one JSON list of digests (or "error: ...").
DRIVER = r'''
import json, sys
from concurrent.futures import ProcessPoolExecutor

def build(job):
    import tiledattention
    from tiledattention.tooling import text_digest
    family = tiledattention.get_family(job["family"])
    problem = family.problem_type.from_dict(job["problem"])
    try:
        if job["schedule"] is None:
            schedule = family.default_schedule(job["arch"], problem)
        else:
            schedule = family.schedule_type.from_dict(job["schedule"])
        if job.get("extra"):
            from tiledattention.core._compile import array_constraint
            from tiledattention.kernels.forward import _compile
            from tiledattention.kernels.forward._launch import kernel_constants, kernel_for
            p, ordered = problem, _compile.ordered_args
            entries, rows = ((1, p.batch * p.seqlen_q) if job["extra"].get("packed")
                             else (p.batch, p.seqlen_q))
            lse = array_constraint("fp32", (entries, p.heads_q, rows))
            # the log-sum-exp output where STORE_LSE asks for it (_export passes none)
            _compile.ordered_args = lambda runtime, constants: ordered(
                {**runtime, "Lse": lse} if constants["STORE_LSE"] else runtime, constants)
            built = _compile._export(problem, kernel_for(schedule),
                                     kernel_constants(problem, schedule, **job["extra"]),
                                     job["arch"], "extra")
        else:
            built = family.compile(problem, schedule, job["arch"])
    except Exception as exc:
        return f"error: {type(exc).__name__}: {str(exc).strip()[:300]}"
    return "+".join(text_digest(c) for c in (built.cubin, *built.other_cubins))

if __name__ == "__main__":
    request = json.load(sys.stdin)
    import tiledattention
    sys.stderr.write(f"compiling {len(request['jobs'])} builds with {tiledattention.__file__}\n")
    with ProcessPoolExecutor(max_workers=request["workers"]) as pool:
        print(json.dumps(list(pool.map(build, request["jobs"]))))
'''


def _problem(family: str, change: dict) -> dict:
    from tiledattention import Problem

    return Problem(**{**BASES[family], **change}).to_dict()


def jobs(which: str, families: list[str]) -> list[dict]:
    """The builds of set ``which`` for ``families``: dicts of family, problem, schedule (None:
    the family's default), arch and (forward extras) the ``kernel_constants`` flags."""
    rows = [r for r in json.loads(TABLE.read_text())["rows"] if r["family"] in families]
    out: list[dict] = []
    if which in ("rows", "all"):
        out += [{"family": r["family"], "problem": r["problem"], "schedule": r["schedule"],
                 "arch": r["arch"]} for r in rows]
    if which in ("defaults", "all"):
        seen = set()
        problems = [(r["family"], r["problem"]) for r in rows]
        problems += [(f, _problem(f, change)) for f in families for change in VARIANTS[f]]
        for family, problem in problems:
            key = json.dumps([family, problem], sort_keys=True)
            if key not in seen:
                seen.add(key)
                out.append({"family": family, "problem": problem, "schedule": None,
                            "arch": ARCH})
    if which in ("forward-extras", "all") and "forward" in families:
        out += [{"family": "forward", "problem": _problem("forward", change), "schedule": None,
                 "arch": ARCH, "extra": extra} for change, extra in FORWARD_EXTRAS]
    return out


def digests(tree: Path, todo: list[dict], workers: int) -> list[str]:
    """The ``.text`` digests of ``todo`` compiled by the ``tiledattention`` under ``tree``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tree), *filter(None, [os.environ.get("PYTHONPATH")])])}
    with tempfile.TemporaryDirectory(prefix="compare-text-") as tmp:
        script = Path(tmp) / "driver.py"
        script.write_text(DRIVER)
        done = subprocess.run([sys.executable, str(script)], cwd=tmp, env=env, text=True,
                              input=json.dumps({"jobs": todo, "workers": workers}),
                              stdout=subprocess.PIPE)
    if done.returncode != 0:
        raise SystemExit(f"the code under {tree} failed (exit {done.returncode})")
    return json.loads(done.stdout.strip().splitlines()[-1])


def old_digests(revision: str, todo: list[dict], workers: int, cache: Path | None) -> list[str]:
    """:func:`digests` of ``revision`` (a ``git archive`` of it), reusing ``cache``'s."""
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", revision + "^{commit}"],
                         capture_output=True, text=True)
    if sha.returncode != 0:
        raise SystemExit(f"--from {revision!r}: not a revision of {ROOT}")
    sha = sha.stdout.strip()
    known = json.loads(cache.read_text()) if cache and cache.exists() else {}
    keys = [json.dumps([sha, job], sort_keys=True) for job in todo]
    missing = [job for job, key in zip(todo, keys) if key not in known]
    if missing:
        with tempfile.TemporaryDirectory(prefix="compare-text-old-") as tmp:
            archive = Path(tmp) / "old.tar"
            subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", "-o",
                            str(archive), sha], check=True)
            with tarfile.open(archive) as tar:
                tar.extractall(Path(tmp) / "tree", filter="data")
            for job, digest in zip(missing, digests(Path(tmp) / "tree", missing, workers)):
                known[json.dumps([sha, job], sort_keys=True)] = digest
        if cache:
            cache.write_text(json.dumps(known))
    return [known[key] for key in keys]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--from", dest="revision", required=True,
                        help="the git revision whose compiled code is the reference")
    parser.add_argument("--set", choices=("defaults", "forward-extras", "rows", "all"),
                        default="defaults", help="which builds (default: defaults)")
    parser.add_argument("--family", action="append", choices=sorted(BASES),
                        help="only these families (repeatable; default: all three)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="parallel compile processes")
    parser.add_argument("--cache", type=Path, help="a JSON file keeping the old code's digests")
    args = parser.parse_args(argv)
    todo = jobs(args.set, args.family or sorted(BASES))
    before = old_digests(args.revision, todo, args.jobs, args.cache)
    after = digests(ROOT, todo, args.jobs)
    differ = 0
    for job, old, new in zip(todo, before, after):
        if old != new or old.startswith("error"):
            same_error = old == new
            differ += not same_error
            label = "both fail" if same_error else "DIFFERENT"
            print(f"{label}: {job['family']} {json.dumps(job['problem'], sort_keys=True)} "
                  f"{job['schedule'] or 'default'} {job.get('extra') or ''}\n  old {old[:200]}"
                  f"\n  new {new[:200]}")
    print(f"{len(todo) - differ} of {len(todo)} builds ({args.set}, "
          f"{', '.join(args.family or sorted(BASES))}) compile to the same .text as "
          f"{args.revision}; {differ} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
