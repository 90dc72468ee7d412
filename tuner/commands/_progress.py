"""Progress of a long command on standard error: rich's bar on a terminal; elsewhere (a pipe, a
log, ``| tee``, a batch job), where rich draws nothing until the bar ends, plain lines at a low
rate (:class:`LineProgress`). ``tiledtune search`` (measuring on a GPU or on the simulated
backend) and ``search --compile-only`` both report through it."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from ..errors import TunerValueError

__all__ = ["EVERY_S", "LineProgress", "progress"]

#: Seconds without a progress line after which :class:`LineProgress` prints one (read when a
#: ``LineProgress`` is made; tests set it lower).
EVERY_S = 30.0


def progress(console, bar: Callable[[], Any], *, what: str, unit: str) -> Any:
    """``bar()`` (a rich ``Progress`` on ``console``) when ``console`` is a terminal, else a
    :class:`LineProgress` whose lines begin with ``what`` and count ``unit`` (``"compiled"``,
    ``"measured"``)."""
    if console.is_terminal:
        return bar()
    return LineProgress(console, what=what, unit=unit)


class LineProgress:
    """Progress as plain lines on ``console`` (standard error), at a low rate: a line each time
    a task's count passes another tenth of its total (the last one when it ends), and one
    whenever ``every_s`` seconds pass without a line, whether or not the count moved (a GPU
    search's slow candidates, the re-timing of a key's finalists, the slow compiles of a large
    sweep): the latter from a background thread while the object is entered as a context
    manager, else at the next update. At most 10 count-driven lines a task.

    The methods are the subset of rich's ``Progress`` that the commands call: ``add_task``
    (extra keyword fields, such as ``status``, are shown after the count), ``advance`` and
    ``update``. A line reads ``<what> <task>: <done>/<total> <unit> (<percent>%), <seconds> s``,
    then ``| <status>`` when the task has a non-empty ``status`` field."""

    def __init__(self, console, every_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic, *, what: str = "compile-only",
                 unit: str = "compiled") -> None:
        self.console, self.clock = console, clock
        self.every_s = EVERY_S if every_s is None else every_s
        if not self.every_s > 0:
            raise TunerValueError(f"every_s must be a positive number of seconds; got "
                                  f"{self.every_s!r}")
        self.what, self.unit = what, unit
        self.tasks: list[dict] = []
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "LineProgress":
        self._stop.clear()
        self._thread = threading.Thread(target=self._tick, name="line-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def add_task(self, description: str, total: int, **fields: Any) -> int:
        with self._lock:
            now = self.clock()
            self.tasks.append(dict(description=description, total=total, done=0, tenth=0,
                                   start=now, last=now, fields=dict(fields)))
            return len(self.tasks) - 1

    def advance(self, task_id: int, advance: int = 1) -> None:
        self.update(task_id, advance=advance)

    def update(self, task_id: int, *, completed: int | None = None, advance: int = 0,
               **fields: Any) -> None:
        with self._lock:
            task = self.tasks[task_id]
            task["fields"].update(fields)
            task["done"] = (task["done"] if completed is None else completed) + advance
            now = self.clock()
            tenth = task["done"] * 10 // max(task["total"], 1)
            if tenth > task["tenth"] or now - task["last"] >= self.every_s:
                task["tenth"] = max(tenth, task["tenth"])
                self._say(task, now)

    def _say(self, task: dict, now: float) -> None:
        task["last"] = now
        done, total = task["done"], task["total"]
        status = task["fields"].get("status")
        self.console.print(f"{self.what} {task['description']}: {done:,}/{total:,} {self.unit} "
                           f"({done * 100 // max(total, 1)}%), {now - task['start']:.0f} s"
                           + (f" | {status}" if status else ""), markup=False, highlight=False,
                           soft_wrap=True)

    def _tick(self) -> None:
        """The background thread: a line for the newest task whenever ``every_s`` passed
        since its last one."""
        while True:
            with self._lock:
                wait = self.every_s
                if self.tasks:
                    task = self.tasks[-1]
                    now = self.clock()
                    if now - task["last"] >= self.every_s:
                        self._say(task, now)
                    wait = max(0.01, self.every_s - (now - task["last"]))
            if self._stop.wait(wait):
                return
