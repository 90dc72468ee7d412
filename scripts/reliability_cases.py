"""Reproduces the schedule-database reliability cases of docs/reliability.md (CPU only).

    python scripts/reliability_cases.py [--rows 51000]

Each case runs the real CLI (``python -m tuner.cli``, in a subprocess with its own cache
directory) or the real lookup on SQLite files in a temporary folder, and prints one line:
the case and what happened; two commits give the before/after columns.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cli(tmp: Path, *args: str, env: dict | None = None, timeout: float = 600):
    environment = {**os.environ, "XDG_CACHE_HOME": str(tmp / "cache"), "COLUMNS": "200",
                   **(env or {})}
    environment.pop("TILEDATTN_DB", None)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "tuner.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, env=environment, timeout=timeout)
    return done.returncode, done.stdout + done.stderr, time.perf_counter() - start


def exited(code: int, text: str) -> str:
    """``exit CODE, no traceback`` (or ``TRACEBACK`` where ``text`` holds one)."""
    return f"exit {code}, {'TRACEBACK' if 'Traceback' in text else 'no traceback'}"


def summary(code: int, text: str) -> str:
    last = [line.strip() for line in text.strip().splitlines() if line.strip()][-1:] or [""]
    return f"{exited(code, text)}: {last[0][:110]}"


def search(tmp: Path, db: str | None, *extra: str):
    args = ["search", "--device", "sm_90", "--backend", "simulated", "--shape", "1,8,512,64",
            "--trials", "4", "--patience", "0", *extra]
    if db is not None:
        args += ["--db", db]
    return cli(tmp, *args)


def case_import_replaces(tmp: Path) -> str:
    db = str(tmp / "a.sqlite")
    search(tmp, db, "--dtype", "bf16,fp16", "--causal", "yes,no")
    cli(tmp, "export", "--db", db, "-o", str(tmp / "rows.json"))
    data = json.loads((tmp / "rows.json").read_text())
    for row in data["rows"]:
        row["provenance"]["template_hash"] = "0123456789ab"
        row["median_ms"] *= 5
    (tmp / "old.json").write_text(json.dumps(data))
    code, text, _ = cli(tmp, "import", "--db", db, str(tmp / "old.json"))
    code, listed, _ = cli(tmp, "export", "--db", db, "-o", str(tmp / "after.json"))
    kept = sum(r["provenance"]["template_hash"] != "0123456789ab"
               for r in json.loads((tmp / "after.json").read_text())["rows"]) \
        if (tmp / "after.json").exists() else 0
    return f"{len(data['rows'])} stale rows imported over current ones: current rows left {kept}"


def case_simulated_default(tmp: Path) -> str:
    search(tmp, None)
    default = tmp / "cache" / "tiledattention" / "schedules.sqlite"
    if not default.exists():
        return "no default user database written"
    rows = sqlite3.connect(default).execute("SELECT count(*) FROM schedules").fetchone()[0]
    return f"default user database holds {rows} simulated row(s)"


def case_lookup_order(tmp: Path) -> str:
    import db as dbmod
    import tiledattention as ta
    from tiledattention import tooling

    shipped = ta.shipped_table("sm_90")
    exact = next(r for r in shipped if r.problem.seqlen_q == 4096 and not r.problem.causal
                 and r.problem.head_dim == 128 and r.problem.dtype == "bf16")
    near = ta.Problem(**{**exact.problem.to_dict(), "seqlen_q": 4000, "seqlen_k": 4000})
    path = tmp / "user.sqlite"
    with dbmod.ScheduleDB(path, codecs=tooling.codecs()) as store:
        store.put(dbmod.ScheduleRow(
            family="forward", arch="sm_90", device_name="Other GPU", problem=near,
            schedule=ta.Schedule(tile_m=32, tile_n=32), median_ms=1.0, spread_ms=0.0,
            tflops=1.0, trials=1, provenance=tooling.current_provenance(ta.FORWARD)))
    resolver = tooling.Resolver(
        open_user=lambda: dbmod.ScheduleDB.open_for_lookup(path, codecs=tooling.codecs()),
        open_shipped=ta.shipped_table)
    device = ta.DeviceInfo(index=0, arch="sm_90", name="NVIDIA H100 80GB HBM3", sm_count=132)
    answer = resolver(ta.FORWARD, exact.problem, device)
    return f"exact shipped key with a user-db neighbour: answered by {answer.source}"


def _bad_databases(tmp: Path) -> dict[str, str]:
    made = {}
    directory = tmp / "dir.sqlite"
    directory.mkdir()
    made["directory"] = str(directory)
    made["bogus URL"] = "bogus://x"
    made["unreachable PostgreSQL"] = "postgresql+psycopg://u:p@127.0.0.1:1/none"
    random_bytes = tmp / "random.sqlite"
    random_bytes.write_bytes(os.urandom(4096))
    made["random bytes"] = str(random_bytes)
    good = tmp / "good.sqlite"
    search(tmp, str(good))
    truncated = tmp / "truncated.sqlite"
    truncated.write_bytes(good.read_bytes()[:5000])
    made["truncated"] = str(truncated)
    foreign = tmp / "foreign.sqlite"
    connection = sqlite3.connect(foreign)
    connection.execute("CREATE TABLE notes (x TEXT)")
    connection.commit()
    connection.close()
    made["foreign SQLite"] = str(foreign)
    readonly = tmp / "readonly.sqlite"
    shutil.copyfile(good, readonly)
    readonly.chmod(0o444)
    made["read-only file"] = str(readonly)
    for label, name, statement in (
            ("bad created_at", "badtime.sqlite", "UPDATE schedules SET created_at = 'yesterday'"),
            ("newer schema", "newer.sqlite",
             "UPDATE tiledattention_schema_version SET version_num = '0099'")):
        changed = tmp / name
        shutil.copyfile(good, changed)
        connection = sqlite3.connect(changed)
        connection.execute(statement)
        connection.commit()
        connection.close()
        made[label] = str(changed)
    return made


def case_bad_databases(tmp: Path) -> list[str]:
    lines = []
    for name, location in _bad_databases(tmp).items():
        before = Path(location).read_bytes() if Path(location).is_file() else None
        for command in ("search", "list"):
            if command == "search":
                code, text, seconds = search(tmp, location)
            else:
                code, text, seconds = cli(tmp, "list", "--db", location)
            after = Path(location).read_bytes() if Path(location).is_file() else None
            sidecars = [p.name for p in Path(location).parent.glob(Path(location).name + "-*")]
            changed = "file changed" if before != after else "file unchanged"
            lines.append(f"{name:>22} | {command:>6} | {summary(code, text)} | {changed}"
                         f"{', sidecars ' + ','.join(sidecars) if sidecars else ''} | "
                         f"{seconds:.1f} s")
    return lines


def case_size(tmp: Path, count: int) -> list[str]:
    import db as dbmod
    import tiledattention as ta
    from tiledattention import tooling

    path = tmp / "big.sqlite"
    prov = tooling.current_provenance(ta.FORWARD)
    start = time.perf_counter()
    with dbmod.ScheduleDB(path, codecs=tooling.codecs()) as store:
        for i in range(count):
            problem = ta.Problem(batch=1 + i % 5, heads_q=32, heads_kv=(32, 8)[i % 2],
                                 seqlen_q=64 + i, seqlen_k=64 + i, head_dim=(64, 128, 256)[i % 3],
                                 dtype=("bf16", "fp16")[i // 6 % 2], causal=bool(i // 12 % 2))
            store.put(dbmod.ScheduleRow(
                family="forward", arch="sm_90", device_name="GPU", problem=problem,
                schedule=ta.Schedule(), median_ms=1.0, spread_ms=0.0, tflops=1.0, trials=1,
                provenance=prov))
    filled = time.perf_counter() - start
    code, text, list_s = cli(tmp, "list", "--db", str(path))
    resolver = tooling.Resolver(
        open_user=lambda: dbmod.ScheduleDB.open_for_lookup(path, codecs=tooling.codecs()),
        open_shipped=lambda arch: None)
    device = ta.DeviceInfo(index=0, arch="sm_90", name="GPU", sm_count=132)
    times = []
    for s in range(100_000, 100_011):
        problem = ta.Problem(batch=3, heads_q=32, heads_kv=8, seqlen_q=s, seqlen_k=s,
                             head_dim=128, dtype="bf16", causal=False)
        start = time.perf_counter()
        resolver(ta.FORWARD, problem, device)
        times.append((time.perf_counter() - start) * 1e3)
    first, rest = times[0], sorted(times[1:])
    return [f"{count} rows (stored in {filled:.0f} s): `tiledtune list` {list_s:.1f} s "
            f"(exit {code}); lookup of a new shape: first {first:.0f} ms (opens the database), "
            f"then median {rest[len(rest) // 2]:.1f} ms, max {rest[-1]:.1f} ms"]


def case_same_key_workers(tmp: Path, workers: int = 8) -> str:
    environment = {**os.environ, "XDG_CACHE_HOME": str(tmp / "cache")}
    args = [sys.executable, "-m", "tuner.cli", "search", "--device", "sm_90", "--backend",
            "simulated", "--shape", "1,8,1024,64", "--trials", "24", "--patience", "0",
            "--db", str(tmp / "s.sqlite"), "--storage", f"sqlite:///{tmp}/studies.sqlite"]
    procs = [subprocess.Popen(args, cwd=ROOT, env=environment, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for _ in range(workers)]
    outputs = [(p.wait(timeout=900), p.stdout.read()) for p in procs]
    crashed = sum(code != 0 or "Traceback" in out for code, out in outputs)
    import optuna

    study = optuna.load_study(study_name=optuna.get_all_study_names(
        f"sqlite:///{tmp}/studies.sqlite")[0], storage=f"sqlite:///{tmp}/studies.sqlite")
    measured = [t for t in study.trials if t.user_attrs.get("ticket")
                and t.user_attrs.get("status") not in ("stale", "cancelled", None)]
    keys = [t.user_attrs.get("schedule_key") for t in measured]
    return (f"{workers} processes, one key, budget 24: {crashed} crashed; {len(measured)} "
            f"measured, {len(keys) - len(set(keys))} measured twice")


def case_hostile_values(tmp: Path) -> list[str]:
    db = str(tmp / "h.sqlite")
    search(tmp, db)
    cli(tmp, "export", "--db", db, "-o", str(tmp / "rows.json"))
    data = json.loads((tmp / "rows.json").read_text())
    good = data["rows"][0]
    lines = []
    for name, change in (("batch 10**400", ("problem", "batch", 10 ** 400)),
                         ("seqlen_q 2**62", ("problem", "seqlen_q", 2 ** 62)),
                         ("=HYPERLINK device", (None, "device_name",
                                                '=HYPERLINK("http://x","y")'))):
        item = json.loads(json.dumps(good))
        where = item if change[0] is None else item[change[0]]
        where[change[1]] = change[2]
        (tmp / "bad.json").write_text(json.dumps({"format": data["format"], "rows": [item]}))
        fresh = str(tmp / f"{len(lines)}.sqlite")
        code, text, _ = cli(tmp, "import", "--db", fresh, str(tmp / "bad.json"))
        outcome = summary(code, text)
        if name.startswith("="):
            cli(tmp, "export", "--db", fresh, "-o", str(tmp / "out.csv"))
            cell = next((c for c in (tmp / "out.csv").read_text().splitlines()[1].split(",")
                         if "HYPERLINK" in c), "") if (tmp / "out.csv").exists() else ""
            outcome += f"; exported CSV cell starts with {cell[:2]!r}"
        lines.append(f"{name}: {outcome}")
    return lines


def _gpu_database(path: Path) -> str:
    """A database as a GPU search leaves it (WAL mode, writer closed): one forward row of H100's
    for B1 H16 S4096 D128 bf16; returns that device's name."""
    import db as dbmod
    import tiledattention as ta
    from tiledattention import tooling

    name = "NVIDIA H100 80GB HBM3"
    problem = ta.Problem(batch=1, heads_q=16, heads_kv=16, seqlen_q=4096, seqlen_k=4096,
                         head_dim=128, dtype="bf16", causal=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    with dbmod.ScheduleDB(path, codecs=tooling.codecs()) as store:
        store.put(dbmod.ScheduleRow(
            family="forward", arch="sm_90", device_name=name, problem=problem,
            schedule=ta.Schedule(tile_m=64, tile_n=32, occupancy=2), median_ms=1.0,
            spread_ms=0.0, tflops=1.0, trials=1,
            provenance=tooling.current_provenance(ta.FORWARD)))
    return name


def case_read_only_mount(tmp: Path) -> list[str]:
    """The runtime and the read-only commands on a tuned database behind a read-only bind mount
    (a private mount namespace: ``unshare -m``; root cannot write there either)."""
    source = tmp / "image" / "schedules.sqlite"
    device = _gpu_database(source)
    mount = tmp / "mnt"
    mount.mkdir()
    line = f"mount --bind {source.parent} {mount} && mount -o remount,bind,ro {mount}"
    if subprocess.run(["unshare", "-m", "sh", "-c", line], capture_output=True).returncode:
        return ["skipped: cannot make a read-only bind mount here (needs unshare -m and mount)"]
    target = str(mount / "schedules.sqlite")
    lookup = ("import sys, tiledattention as ta, tiledattention.core._runtime as r; "
              "from tiledattention import DeviceInfo, FORWARD, Problem; "
              "r.device_info = lambda i: DeviceInfo(index=0, arch='sm_90', name=sys.argv[2], "
              "sm_count=132); ta.use_database(sys.argv[1]); "
              "p = Problem(batch=1, heads_q=16, heads_kv=16, seqlen_q=4096, seqlen_k=4096, "
              "head_dim=128, dtype='bf16', causal=False); "
              "print('sdpa schedule from:', ta.runtime().resolution(FORWARD, p, 0).source)")
    readers = {"list": ["-m", "tuner.cli", "list", "--db", target],
               "export": ["-m", "tuner.cli", "export", "--db", target, "-o",
                          str(tmp / "out.json")],
               "explain": ["-m", "tuner.cli", "explain", "--device", "sm_90", "--device-name",
                           device, "--db", target, "--shape", "1,16,4096,128", "--causal", "no"],
               "runtime": ["-c", lookup, target, device]}
    before = (source.read_bytes(), sorted(p.name for p in source.parent.iterdir()))
    lines = []
    for name, args in readers.items():
        environment = {**os.environ, "XDG_CACHE_HOME": str(tmp / "cache"), "COLUMNS": "200"}
        environment.pop("TILEDATTN_DB", None)
        done = subprocess.run(["unshare", "-m", "sh", "-c", line + ' && exec "$@"', "sh",
                               sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                              env=environment, timeout=600)
        text = done.stdout + done.stderr
        said = [s.strip() for s in text.splitlines()
                if "exact-device" in s or "tiledtune" in s or "Warning" in s or "wrote" in s
                or "schedules in" in s or "sdpa schedule" in s][:2]
        lines.append(f"{name:>8} | {exited(done.returncode, text)} | {' / '.join(said)[:160]}")
    after = (source.read_bytes(), sorted(p.name for p in source.parent.iterdir()))
    lines.append(f"database file and folder {'unchanged' if after == before else 'CHANGED'}: "
                 f"{after[1]}")
    return lines


def case_simulated_import(tmp: Path) -> list[str]:
    """A simulated search's export imported into the database the runtime reads, then exported
    as a ByTarget module (issue 30, item 5)."""
    sim = str(tmp / "sim.sqlite")
    search(tmp, sim)
    cli(tmp, "export", "--db", sim, "-o", str(tmp / "sim.json"))
    code, text, _ = cli(tmp, "import", str(tmp / "sim.json"))
    default = tmp / "cache" / "tiledattention" / "schedules.sqlite"
    held = sqlite3.connect(default).execute(
        "SELECT count(*) FROM schedules WHERE backend = 'simulated'").fetchone()[0] \
        if default.exists() else "no file"
    said = next((t for t in text.splitlines() if "simulated row" in t), "")
    lines = [f"import sim.json (no --db): exit {code}; {said[said.find('row '):][:150]}; "
             f"simulated rows in the runtime's database: {held}"]
    for label, extra in (("export --format bytarget (no --db)", []),
                         ("export --format bytarget --db sim.sqlite", ["--db", sim])):
        out = tmp / "module.py"
        out.unlink(missing_ok=True)
        code, text, _ = cli(tmp, "export", "--format", "bytarget", "-o", str(out), *extra)
        title = next((t for t in out.read_text().splitlines() if t.startswith('"""')),
                     "") if out.exists() else ""
        lines.append(f"{label}: {summary(code, text)}; docstring: {title[:70]}")
    return lines


def case_restamp_then_export(tmp: Path) -> list[str]:
    """``restamp`` with no database, then ``export``; and ``export`` of an empty database."""
    code, text, _ = cli(tmp, "restamp", "--from", "HEAD")
    default = tmp / "cache" / "tiledattention" / "schedules.sqlite"
    lines = [f"restamp (no database): {summary(code, text)}; database created: "
             f"{default.exists()}"]
    code, text, _ = cli(tmp, "export", "-o", str(tmp / "rows.json"))
    lines.append(f"then export: {summary(code, text)}")
    import db as dbmod
    from tiledattention import tooling

    empty = tmp / "empty.sqlite"  # what `restamp` left before: a database without rows
    dbmod.ScheduleDB(empty, codecs=tooling.codecs()).close()
    code, text, _ = cli(tmp, "export", "--db", str(empty), "-o", str(tmp / "rows2.json"))
    lines.append(f"export of an empty database: {summary(code, text)}; names --source shipped: "
                 f"{'--source shipped' in text}")
    return lines


_FAKE_GPU = """
import functools, sys
sys.path.insert(0, {root!r})
from concurrent.futures import Future
from tiledattention import DeviceInfo
from tuner.commands import search_cmd
from tuner.measure import SimulatedExecutor
from tuner.search import _driver


class AtOnce:  # the compile pool, answering at once (nothing compiles)
    def __init__(self, workers):
        pass

    def submit(self, fn, *args):
        done = Future()
        done.set_result((0.0, None, None))
        return done

    def close(self, now=False):
        pass


search_cmd.select_device = lambda arch, index=None: DeviceInfo(
    index=0, arch=arch, name="NVIDIA H100 80GB HBM3", sm_count=132)
search_cmd._GpuFactory = lambda family, index, timing: functools.partial(
    SimulatedExecutor, "sm_90", family=family, timing=timing)
_driver.CompilePool = AtOnce
if __name__ == "__main__":
    from tuner.cli import main
    sys.exit(main(sys.argv[1:]))
"""


def fake_gpu_cli(tmp: Path, *args: str, timeout: float = 600):
    """``tiledtune`` as on a machine with an H100 whose measurements the simulated executor
    makes: the GPU path of ``search`` (storage, budget, study, database) runs for real."""
    script = tmp / "fake_gpu.py"
    script.write_text(_FAKE_GPU.format(root=str(ROOT)))
    environment = {**os.environ, "XDG_CACHE_HOME": str(tmp / "cache"), "COLUMNS": "200"}
    environment.pop("TILEDATTN_DB", None)
    done = subprocess.run([sys.executable, str(script), *args], cwd=ROOT, capture_output=True,
                          text=True, env=environment, timeout=timeout)
    return done.returncode, done.stdout + done.stderr


def case_simulated_then_gpu(tmp: Path) -> list[str]:
    """The sequence of issue 30, item 1: a simulated search without --db, then the same command
    on the GPU (its executor replaced by the simulated one)."""
    command = ["search", "--device", "sm_90", "--shape", "2,8,1024,64", "--trials", "12"]
    code, text, _ = cli(tmp, *command, "--backend", "simulated")
    lines = [f"simulated search: {summary(code, text)}"]
    code, text = fake_gpu_cli(tmp, *command, "--json")
    try:
        key = json.loads(text[:text.rindex("}") + 1])["keys"][0]
        measured = f"{key['measured']}, winner {key['schedule_text']!r} ({key['stored']})"
    except ValueError:
        measured = "?"
    default = tmp / "cache" / "tiledattention" / "schedules.sqlite"
    stored = sqlite3.connect(default).execute(
        "SELECT backend, trials FROM schedules").fetchall() if default.exists() else "no file"
    lines.append(f"GPU search: {exited(code, text)}, measured {measured}; the runtime's "
                 f"database holds (backend, trials) {stored}")
    return lines


def _orphans(storage: Path) -> list[int]:
    """Running trials with no heartbeat row."""
    if not storage.exists():
        return []
    connection = sqlite3.connect(storage)
    try:
        return [r[0] for r in connection.execute(
            "SELECT trial_id FROM trials WHERE state = 'RUNNING' AND trial_id NOT IN "
            "(SELECT trial_id FROM trial_heartbeats)")]
    except sqlite3.Error:  # the tables are still being created
        return []
    finally:
        connection.close()


def case_sigkilled_search(tmp: Path, attempts: int = 30) -> list[str]:
    """A simulated search SIGKILLed (with its worker) until it leaves a running trial that has
    no heartbeat row, then the same command again more than a minute later (issue 30, item 8)."""
    import random
    import signal

    environment = {**os.environ, "XDG_CACHE_HOME": str(tmp / "cache")}
    environment.pop("TILEDATTN_DB", None)
    command = ["search", "--device", "sm_90", "--backend", "simulated", "--shape", "2,8,1024,64",
               "--trials", "400", "--patience", "0"]
    storage = tmp / "cache" / "tiledattention" / "tiledtune-studies.sqlite"
    rng = random.Random(0)
    for attempt in range(1, attempts + 1):
        proc = subprocess.Popen([sys.executable, "-m", "tuner.cli", *command], cwd=ROOT,
                                env=environment, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        time.sleep(rng.uniform(4.0, 9.0))
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        orphans = _orphans(storage)
        if orphans:
            break
    else:
        return [f"no SIGKILL of {attempts} left a running trial without a heartbeat row"]
    time.sleep(65)
    code, text, _ = cli(tmp, *command[:-4], "--trials", "1", "--patience", "0")
    left = [t for t in _orphans(storage) if t in orphans]
    return [f"SIGKILL #{attempt} left running trial(s) {orphans} with no heartbeat row; the same "
            f"search 65 s later: {summary(code, text)}; still running: {left or 'none'}"]


def case_empty_file(tmp: Path) -> list[str]:
    """A 0-byte database file given to readers and to a writer (issue 30, item 8)."""
    lines = []
    for name, args in (("list", ["list"]), ("export", ["export", "-o", str(tmp / "out.json")]),
                       ("search", ["search", "--device", "sm_90", "--backend", "simulated",
                                   "--shape", "1,8,512,64", "--trials", "2"])):
        empty = tmp / f"{name}.sqlite"
        empty.touch()
        code, text, _ = cli(tmp, *args, "--db", str(empty))
        lines.append(f"{name:>6} on a 0-byte file: {summary(code, text)}; file now "
                     f"{empty.stat().st_size} bytes")
    return lines


def _export_to(tmp: Path, db: str, output: str, *extra: str, cwd: Path | None = None):
    """``tiledtune export --db DB -o OUTPUT`` in ``cwd`` (default: the test folder, so that an
    export that writes a file named ``-`` writes it there): (exit, stdout bytes, stderr)."""
    environment = {**os.environ, "XDG_CACHE_HOME": str(tmp / "cache"),
                   "PYTHONPATH": str(ROOT)}
    environment.pop("TILEDATTN_DB", None)
    done = subprocess.run([sys.executable, "-m", "tuner.cli", "export", "--db", db, "-o",
                           output, *extra], cwd=cwd or tmp, capture_output=True, env=environment,
                          timeout=600)
    return done.returncode, done.stdout, done.stderr.decode(errors="replace")


def case_export_output(tmp: Path) -> list[str]:
    """Issue 30, item 3: ``export -o`` at a symlink, a FIFO, a directory, a link to
    ``/proc/self/fd/1`` (what ``/dev/stdout`` is) while standard output is a pipe, and ``-o -``.
    Every path is the case's own: the machine's ``/dev/stdout`` is never given (code without
    the fix replaced it)."""
    import stat as st

    db = str(tmp / "s.sqlite")
    search(tmp, db)
    lines = []
    _export_to(tmp, db, str(tmp / "direct.json"))
    expected = (tmp / "direct.json").read_bytes() if (tmp / "direct.json").exists() else b""
    (tmp / "data").mkdir()
    (tmp / "data" / "rows.json").write_text("old\n")
    (tmp / "link.json").symlink_to(Path("data") / "rows.json")
    code, out, err = _export_to(tmp, db, str(tmp / "link.json"))
    lines.append(f"-o a symlink: {summary(code, out.decode() + err)} | link still a link: "
                 f"{(tmp / 'link.json').is_symlink()}, its target updated: "
                 f"{(tmp / 'data' / 'rows.json').read_bytes() == expected}")
    os.mkfifo(tmp / "fifo.json")
    code, out, err = _export_to(tmp, db, str(tmp / "fifo.json"))
    lines.append(f"-o a FIFO: {summary(code, out.decode() + err)} | still a FIFO: "
                 f"{st.S_ISFIFO(os.lstat(tmp / 'fifo.json').st_mode)}")
    (tmp / "folder.json").mkdir()
    code, out, err = _export_to(tmp, db, str(tmp / "folder.json"))
    lines.append(f"-o a directory: {summary(code, out.decode() + err)} | still a directory: "
                 f"{(tmp / 'folder.json').is_dir()}")
    (tmp / "stdout").symlink_to("/proc/self/fd/1")
    code, out, err = _export_to(tmp, db, str(tmp / "stdout"), "--format", "json")
    lines.append(f"-o a link to /proc/self/fd/1, standard output a pipe: {summary(code, err)} "
                 f"| still that link: {(tmp / 'stdout').is_symlink()}, {len(out)} bytes on the "
                 "pipe")
    code, out, err = _export_to(tmp, db, "-", "--format", "json")
    lines.append(f"-o - --format json: {summary(code, err)} | standard output holds the "
                 f"export: {out == expected}, a file named '-' written: {(tmp / '-').exists()}")
    return lines


def _fill_rows(path: Path, count: int) -> None:
    """``count`` distinct forward rows (with baselines), stored through
    ``ScheduleDB.merge_many`` (a batch of inserts per transaction: seconds instead of the
    minutes a ``put`` per row takes)."""
    import db as dbmod
    import tiledattention as ta
    from tiledattention import tooling

    prov = tooling.current_provenance(ta.FORWARD)
    rows = []
    for i in range(count):
        problem = ta.Problem(batch=1 + i % 2, heads_q=32, heads_kv=(32, 8)[i % 2],
                             seqlen_q=64 + i, seqlen_k=64 + i, head_dim=(64, 128, 256)[i % 3],
                             dtype=("bf16", "fp16")[i // 6 % 2], causal=bool(i // 12 % 2))
        rows.append(dbmod.ScheduleRow(
            family="forward", arch="sm_90", device_name="NVIDIA H100 80GB HBM3",
            problem=problem, schedule=ta.Schedule(tile_m=(64, 128)[i % 2]),
            # a time its FLOPs allow at ~500 TFLOP/s (import refuses impossible ones)
            median_ms=4e3 * problem.batch * 32 * problem.seqlen_q ** 2 * problem.head_dim
            / 500e12 + 0.01, spread_ms=0.001, tflops=512.5, trials=40,
            default_ms=0.2, baselines={"torch-cudnn": 0.15, "torch-flash": 0.18},
            provenance=prov))
    with dbmod.ScheduleDB(path, codecs=tooling.codecs()) as store:
        for start in range(0, count, 5000):  # merge_many's callers keep to a few thousand rows
            store.merge_many(rows[start:start + 5000])


def _stored(path: Path) -> list[tuple]:
    connection = sqlite3.connect(path)
    columns = [c[1] for c in connection.execute("PRAGMA table_info(schedules)") if c[1] != "id"]
    found = connection.execute(f"SELECT {', '.join(columns)} FROM schedules ORDER BY family, "
                               "arch, problem, device_name").fetchall()
    connection.close()
    return found


def case_scale(tmp: Path, count: int) -> list[str]:
    """Issue 30, item 4: export and import ``count`` rows through the real CLI (JSON), the
    import rate, and ``list``'s first page and ``explain`` on that database, each a process
    (the interpreter's start-up and imports included; ``--help``'s time says how much that
    is)."""
    big = tmp / "big.sqlite"
    _fill_rows(big, count)
    lines = []
    _, _, start_s = cli(tmp, "--help")
    for fmt in ("json", "csv"):
        out = tmp / f"rows.{fmt}"
        code, text, seconds = cli(tmp, "export", "--db", str(big), "-o", str(out))
        size = out.stat().st_size / 2 ** 20 if out.exists() else 0
        lines.append(f"export {count} rows ({fmt}): {seconds:.1f} s, {size:.1f} MiB, "
                     f"{summary(code, text)}")
        target = tmp / f"new-{fmt}.sqlite"
        code, text, seconds = cli(tmp, "import", "--db", str(target), str(out))
        same = target.exists() and _stored(target) == _stored(big)
        rate = (f"{count / seconds:,.0f} rows/s (start-up included)" if code == 0
                else summary(code, text))
        lines.append(f"import {count} rows ({fmt}) into a new database: {seconds:.1f} s, "
                     f"{rate}, every row back unchanged: {same}")
        if fmt == "json" and code == 0:
            code, text, seconds = cli(tmp, "import", "--db", str(target), str(out))
            lines.append(f"import the same {count} rows again (all kept): {seconds:.1f} s = "
                         f"{count / seconds:,.0f} rows/s, exit {code}")
    for name, args in (("list (first page)", ("list", "--db", str(big))),
                       ("explain", ("explain", "--db", str(big), "--device", "sm_90",
                                    "--shape", "3,32/8,30007,128"))):
        times = []
        for _ in range(5):
            code, text, seconds = cli(tmp, *args)
            times.append(seconds)
        lines.append(f"{name} on {count} rows: best {min(times):.2f} s, median "
                     f"{sorted(times)[2]:.2f} s of 5 processes (exit {code}); "
                     f"`tiledtune --help` alone: {start_s:.2f} s; in one process after its "
                     f"imports (tuner.cli.main): best {_in_process(args):.3f} s of 5")
    return lines


def _in_process(args: tuple[str, ...]) -> float:
    """The best of 5 runs of ``tuner.cli.main(args)`` in this process, after a first run that
    imports what the command needs: the command's own time, without the interpreter's."""
    import contextlib
    import io

    from tuner.cli import main as tiledtune

    times = []
    for _ in range(6):
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            tiledtune(list(args))
        times.append(time.perf_counter() - start)
    return min(times[1:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=51000)
    parser.add_argument("--scale-rows", type=int, default=60000,
                        help="rows of the export/import/list/explain case (issue 30 item 4)")
    parser.add_argument("--only", default=None, help="run only the cases whose name has this")
    args = parser.parse_args()
    cases = [("import over current rows", case_import_replaces),
             ("simulated search, no --db", case_simulated_default),
             ("lookup precedence", case_lookup_order),
             ("same-key workers", case_same_key_workers),
             ("bad databases", case_bad_databases),
             ("hostile values", case_hostile_values),
             ("size", lambda tmp: case_size(tmp, args.rows)),
             ("read-only mount", case_read_only_mount),
             ("simulated import", case_simulated_import),
             ("restamp then export", case_restamp_then_export),
             ("simulated then GPU", case_simulated_then_gpu),
             ("SIGKILLed search", case_sigkilled_search),
             ("0-byte file", case_empty_file),
             ("export -o", case_export_output),
             ("scale", lambda tmp: case_scale(tmp, args.scale_rows))]
    for name, case in cases:
        if args.only and args.only not in name:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            try:
                result = case(Path(tmp))
            except Exception as exc:  # a case that crashes is a finding too
                result = f"CRASHED: {type(exc).__name__}: {exc}"
        for line in result if isinstance(result, list) else [result]:
            print(f"{name}: {line}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
