"""Waiting for another process's lock on a SQLite file, and saying who holds it.

SQLite waits for a lock inside one C call (its busy timeout) that a Ctrl-C cannot cut short: a
signal is seen only when the call returns. So a wait is made of short attempts, each with a
busy timeout of :data:`BUSY_SLICE_S`, retried until :data:`LOCK_WAIT_S` (or the caller's
limit) has passed in all; then :class:`~db._errors.DatabaseLocked` names the file, the process
holding its lock where this process can see it, and what to do.

Who holds the lock is read from Linux's ``/proc/locks`` (SQLite's locks are POSIX record locks
on the file, its ``-shm`` in WAL mode, its ``-journal`` otherwise): the processes holding a
write lock on one of them. Where ``/proc/locks`` names none (another OS, a process of another
user in another PID namespace), the processes that have one of the files open
(``/proc/PID/fd``) are named instead, as candidates; where neither can be read, the message says
the holder was not found.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable, TypeVar

from ._errors import DatabaseLocked

__all__ = ["LOCK_WAIT_S", "BUSY_SLICE_S", "LockWait", "check_lock_wait", "holders",
           "locked_error"]

#: How long, in all, a command waits for another process's lock on a SQLite database before it
#: gives up (``ScheduleDB(lock_wait_s=...)``; ``tiledtune``: ``$TILEDATTN_LOCK_WAIT``).
LOCK_WAIT_S = 4.0
#: SQLite's busy timeout of one attempt: the longest a Ctrl-C waits to be seen.
BUSY_SLICE_S = 0.2
#: Pause between two attempts (each has already waited its busy timeout).
_PAUSE_S = 0.01
#: Beside a database, the files SQLite locks or keeps open while it writes.
_SIDE_FILES = ("-shm", "-wal", "-journal")

_T = TypeVar("_T")


def check_lock_wait(value: object, where: str = "lock_wait_s") -> float:
    """``value`` as seconds to wait for a lock: a finite number >= 0; else
    :class:`~db._errors.DatabaseArgumentError` naming ``where``."""
    import math

    from ._errors import DatabaseArgumentError

    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value < 0:
        raise DatabaseArgumentError(f"{where} must be a finite number of seconds >= 0; got "
                                    f"{value!r}")
    return float(value)


class LockWait:
    """One bounded wait for a lock: ``run(attempt, locked)`` calls ``attempt()`` until it
    returns, retrying it while it raises an exception ``locked(exc)`` calls a lock, until
    ``seconds`` have passed since the wait began (at least one attempt is made). Then
    :class:`DatabaseLocked` about ``path`` (``shown``: how messages name it)."""

    def __init__(self, seconds: float, path: Path | None, shown: str) -> None:
        self.seconds = seconds
        self.path = path
        self.shown = shown
        self._start = time.monotonic()

    def expired(self) -> bool:
        return time.monotonic() - self._start >= self.seconds

    def run(self, attempt: Callable[[], _T], locked: Callable[[BaseException], bool]) -> _T:
        while True:
            try:
                return attempt()
            except Exception as exc:
                if not locked(exc):
                    raise
                if self.expired():
                    raise self.error() from exc
            time.sleep(_PAUSE_S)

    def error(self) -> DatabaseLocked:
        return locked_error(self.path, self.shown, time.monotonic() - self._start)


def locked_error(path: Path | None, shown: str, waited_s: float) -> DatabaseLocked:
    """The error of a wait for ``path``'s lock that gave up after ``waited_s`` seconds."""
    found = holders(path) if path is not None else None
    if found is None:
        who = "another process (which one could not be found)"
    else:
        kind, pids = found
        listed = ", ".join(f"pid {pid} ({_command(pid)})" for pid in pids[:3])
        who = (f"another process: {listed}" if kind == "lock" else
               f"another process (not found in /proc/locks; {listed} "
               f"{'has' if len(pids) == 1 else 'have'} it open)")
    return DatabaseLocked(
        f"{shown} is locked by {who}; gave up after waiting {waited_s:.1f} s. Run the command "
        "again when that process has finished writing (or stop it), or wait longer: "
        "TILEDATTN_LOCK_WAIT=SECONDS")


def holders(path: Path) -> tuple[str, list[int]] | None:
    """Who holds ``path``'s lock: ``("lock", pids)`` holding a write lock on it or the files
    beside it (``/proc/locks``), else ``("open", pids)`` having one open, else ``None``. This
    process is never named."""
    files = [Path(f"{path}{suffix}") for suffix in ("", *_SIDE_FILES)]
    inodes = {}
    for file in files:
        try:
            inodes[os.stat(file).st_ino] = file
        except OSError:
            continue
    if not inodes:
        return None
    me = os.getpid()
    lockers = []
    try:
        with open("/proc/locks") as table:
            for line in table:
                fields = line.split()
                # "1: POSIX  ADVISORY  WRITE 7834 fe:00:2148189 120 120"; "1: -> ..." waits
                if len(fields) < 6 or fields[1] == "->" or fields[3] != "WRITE":
                    continue
                try:
                    pid, inode = int(fields[4]), int(fields[5].rsplit(":", 1)[1])
                except (ValueError, IndexError):
                    continue
                if inode in inodes and pid > 0 and pid != me and pid not in lockers:
                    lockers.append(pid)
    except OSError:
        pass
    if lockers:
        return "lock", lockers
    openers = _openers({str(f.resolve()) for f in inodes.values()}, me)
    return ("open", openers) if openers else None


def _openers(targets: set[str], me: int) -> list[int]:
    """The processes (other than ``me``) with one of ``targets`` open, as far as ``/proc``
    lets this process see."""
    found = []
    try:
        pids = sorted(int(name) for name in os.listdir("/proc") if name.isdigit())
    except OSError:
        return found
    for pid in pids:
        if pid == me:
            continue
        folder = f"/proc/{pid}/fd"
        try:
            links = os.listdir(folder)
        except OSError:
            continue
        for link in links:
            try:
                if os.readlink(f"{folder}/{link}") in targets:
                    found.append(pid)
                    break
            except OSError:
                continue
    return found


def _command(pid: int) -> str:
    """A process's command line, shortened ("?" when it cannot be read)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            text = f.read(400).replace(b"\x00", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"
    printable = "".join(c if c.isprintable() else "?" for c in text) or "?"
    return printable if len(printable) <= 80 else printable[:77] + "..."
