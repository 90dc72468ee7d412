"""Three `tiledtune search` workers share one study on a real PostgreSQL server.

It starts its own server (own data directory and port), stops it after, and skips without
PostgreSQL's server binaries (.ci/run installs them).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import optuna
import pytest

from tiledattention import FORWARD, Problem, open_database
from tuner.search import study_name

ROOT = Path(__file__).resolve().parents[2]


def _pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def postgres_url():
    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    if not (initdb and pg_ctl):
        pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl)")
    pytest.importorskip("psycopg")
    base = tempfile.mkdtemp(prefix="tiledtune-pg-", dir="/tmp")
    os.chmod(base, 0o777)
    data, port = os.path.join(base, "data"), _free_port()
    prefix: list[str] = []
    if os.geteuid() == 0:  # PostgreSQL refuses root
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("root, and no 'postgres' user to run the server")
        prefix = ["runuser", "-u", "postgres", "--"]
    subprocess.run([*prefix, initdb, "-D", data, "-A", "trust", "-U", "postgres"], check=True,
                   capture_output=True)
    subprocess.run([*prefix, pg_ctl, "-D", data, "-w", "-l", os.path.join(base, "log"), "-o",
                    f"-p {port} -h 127.0.0.1 -k {base}", "start"], check=True,
                   capture_output=True)
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*prefix, pg_ctl, "-D", data, "-m", "immediate", "stop"],
                       capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def test_three_workers_share_one_study_exactly(postgres_url, tmp_path):
    argv = [sys.executable, "-m", "tuner.cli", "search", "--device", "sm_90", "--backend",
            "simulated", "--shape", "2,8,1024,64", "--causal", "yes,no", "--trials", "12",
            "--space", "compact", "--patience", "0", "--storage", postgres_url, "--db",
            postgres_url]
    workers = [subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True) for _ in range(3)]
    outputs = [w.communicate(timeout=600)[0] for w in workers]
    assert [w.returncode for w in workers] == [0, 0, 0], "\n".join(outputs)[-3000:]

    storage = optuna.storages.RDBStorage(postgres_url)
    with open_database(postgres_url) as db:
        rows = db.rows()
    assert {r.family for r in rows} == {"forward"}
    assert sorted(r.problem.causal for r in rows) == [False, True]  # one winner per key
    for causal in (False, True):
        problem = Problem(batch=2, heads_q=8, heads_kv=8, seqlen_q=1024, seqlen_k=1024,
                          head_dim=64, dtype="bf16", causal=causal)
        study = optuna.load_study(study_name=study_name("tiledtune", FORWARD, "sm_90", problem,
                                                        backend="simulated"),
                                  storage=storage)
        measured = [t for t in study.trials if t.user_attrs.get("ticket")
                    and t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL)
                    and t.user_attrs.get("status") not in (None, "cancelled")]
        assert len(measured) == 12  # the budget, over 3 workers
        keys = [t.user_attrs["schedule_key"] for t in measured]
        assert len(set(keys)) == len(keys)  # no candidate measured twice
    storage.engine.dispose()  # psycopg warns if collected
