"""The isolated worker's deadlines cover the request, not the worker's start-up: on a loaded
machine a fresh worker may take seconds to import its libraries, and a healthy candidate must
not be recorded as a timeout for it (this was the CPU suite's flaky failure)."""

from __future__ import annotations

import os
import time

import pytest

from tiledattention import Problem, Schedule
from tuner.measure import IsolatedExecutor, SimulatedExecutor, WorkerDied, WorkerTimeout

PROBLEM = Problem(batch=1, heads_q=8, heads_kv=8, seqlen_q=512, seqlen_k=512, head_dim=64,
                  dtype="bf16", causal=False)


def slow_start() -> SimulatedExecutor:
    """A worker that takes 3 s to start (a cold import on a busy 2-core machine)."""
    time.sleep(3)
    return SimulatedExecutor()


def dies_at_start() -> SimulatedExecutor:
    os._exit(5)


def hangs_at_start() -> SimulatedExecutor:
    time.sleep(3600)
    return SimulatedExecutor()


@pytest.mark.slow  # starts worker processes
def test_a_slow_start_does_not_count_against_the_request_deadline():
    with IsolatedExecutor(slow_start) as executor:
        measured = executor.measurement("measure", PROBLEM, Schedule(), deadline=2)
        assert measured.status == "ok", measured.reason
        assert executor.started == 1


@pytest.mark.slow  # starts worker processes
def test_a_worker_that_dies_or_hangs_while_starting_is_reported():
    with IsolatedExecutor(dies_at_start) as executor:
        with pytest.raises(WorkerDied, match="exit code 5"):
            executor.call("info", deadline=2)
    with IsolatedExecutor(hangs_at_start, startup_s=2) as executor:
        start = time.monotonic()
        with pytest.raises(WorkerTimeout, match="start"):
            executor.call("info", deadline=2)
        assert time.monotonic() - start < 30
