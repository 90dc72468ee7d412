"""Run an executor in a worker process that may crash or hang without taking the tuner down.

The parent sends one request at a time over a pipe and waits at most ``deadline`` seconds. A
worker that dies (a segfault, an illegal address that poisoned its CUDA context, ``os._exit``)
or misses its deadline is killed, the request is answered with a ``crash`` / ``timeout``
measurement, and the next request starts a fresh worker. A fresh worker first says it is ready
(its libraries imported, its executor built), within ``startup_s``: a request's deadline starts
only then, so a slow start on a busy machine never turns a healthy candidate into a timeout.

The worker is a :func:`~._processes.become_worker` process: a Ctrl-C reaches only the tuner,
and a killed worker takes the JIT compiles (``tileiras``) it started with it. Leaving the
``with`` block on an exception (a Ctrl-C) kills the worker at once instead of waiting for it.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
import traceback
from typing import Any, Callable

from ..errors import MeasurementError, WorkerDied, WorkerTimeout
from ._executors import Measurement
from ._processes import become_worker, interrupts_held, kill_group

__all__ = ["IsolatedExecutor", "WorkerDied", "WorkerTimeout"]


def _serve(conn, factory: Callable[[], Any], parent_pid: int, die_with_parent: bool) -> None:
    become_worker(parent_pid, die_with_parent)
    try:
        executor = factory()
    except Exception:  # the parent reports it; no request is served
        conn.send(("error", traceback.format_exc(limit=5)))
        return
    conn.send(("ready", None))
    while True:
        try:
            request = conn.recv()
        except EOFError:
            return
        if request is None:
            return
        method, args = request
        try:
            conn.send(("ok", getattr(executor, method)(*args)))
        except Exception:  # report to the parent; the worker lives on
            conn.send(("error", traceback.format_exc(limit=5)))


class IsolatedExecutor:
    """Proxy to an executor built by ``factory()`` in a ``spawn``-ed worker process."""

    def __init__(self, factory: Callable[[], Any], *, name: str = "tiledtune-worker",
                 startup_s: float = 300.0) -> None:
        self._factory = factory
        self._name = name
        self._startup_s = startup_s
        self._ctx = mp.get_context("spawn")
        self._proc = None
        self._conn = None
        self.started = 0  # worker processes started so far (restarts: started - 1)

    def _ensure(self) -> None:
        """A live worker that has said it is ready (a fresh one if there is none)."""
        if self._proc is not None and self._proc.is_alive():
            return
        self._kill()
        self.started += 1
        parent, child = self._ctx.Pipe()
        main = threading.current_thread() is threading.main_thread()
        self._proc = self._ctx.Process(target=_serve,
                                       args=(child, self._factory, os.getpid(), main),
                                       name=self._name, daemon=True)
        with interrupts_held():
            self._proc.start()
        child.close()
        self._conn = parent
        status, value = self._receive("start", self._startup_s)
        if status != "ready":  # the factory's own exception, with its traceback
            self._kill()
            raise WorkerDied(f"the worker process could not start: {value}")

    def _receive(self, what: str, deadline: float) -> tuple[str, Any]:
        """The worker's next message, within ``deadline`` seconds of now; kills the worker and
        raises :class:`WorkerTimeout` / :class:`WorkerDied` otherwise."""
        end = time.monotonic() + deadline
        while True:
            left = end - time.monotonic()
            if left <= 0:
                self._kill()
                raise WorkerTimeout(f"{what} exceeded its {deadline:.0f} s deadline")
            try:
                ready = self._conn.poll(min(left, 0.5))
            except (EOFError, OSError):
                ready = True
            if ready:
                try:
                    return self._conn.recv()
                except (EOFError, OSError):
                    code = self._exit_code()
                    self._kill()
                    raise WorkerDied(f"the worker process died (exit code {code}) during "
                                     f"{what}") from None
            if not self._proc.is_alive():
                code = self._proc.exitcode
                self._kill()
                raise WorkerDied(f"the worker process died (exit code {code}) during {what}")

    def _exit_code(self) -> int | None:
        """The exit code of a worker whose end of the pipe closed: the pipe closes a moment
        before the process is reaped, so wait briefly for it."""
        if self._proc is None:
            return None
        self._proc.join(timeout=5)
        return self._proc.exitcode

    def _kill(self) -> None:
        if self._proc is not None and self._proc.pid is not None:  # started
            kill_group(self._proc.pid)  # the worker with its compiles
            self._proc.join(timeout=10)
        if self._conn is not None:
            self._conn.close()
        self._proc = self._conn = None

    def call(self, method: str, *args: Any, deadline: float) -> Any:
        """Run ``executor.method(*args)`` in the worker; raise WorkerDied / WorkerTimeout,
        or a MeasurementError carrying the worker's traceback when the request raised there."""
        self._ensure()
        try:
            self._conn.send((method, args))
        except (BrokenPipeError, OSError):
            self._kill()
            raise WorkerDied("the worker process died before the request") from None
        status, value = self._receive(method, deadline)
        if status == "error":
            raise MeasurementError(value)
        return value

    def measurement(self, method: str, *args: Any, deadline: float) -> Measurement:
        """Like ``call`` for requests answering a Measurement: faults become measurements."""
        start = time.monotonic()
        try:
            return self.call(method, *args, deadline=deadline)
        except WorkerTimeout as exc:
            return Measurement("timeout", str(exc), seconds=time.monotonic() - start)
        except WorkerDied as exc:
            return Measurement("crash", str(exc), seconds=time.monotonic() - start)
        except MeasurementError as exc:  # the request raised in the worker
            last = str(exc).strip().splitlines()[-1] if str(exc).strip() else ""
            return Measurement("crash", f"worker raised: {last}"[:500],
                               seconds=time.monotonic() - start)

    def close(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            try:
                self._conn.send(None)
                self._proc.join(timeout=5)
            except (BrokenPipeError, OSError):
                pass
        self._kill()

    def __enter__(self) -> "IsolatedExecutor":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:  # an interrupted search: the worker may be mid-request; do not wait for it
            self._kill()
