"""Worker processes that an interrupted search ends at once, with everything they started.

Every process the tuner starts to do work (a compile process of a pool, the isolated GPU
worker) calls :func:`become_worker` first. It then

* ignores Ctrl-C: the terminal sends SIGINT to its whole foreground process group, and a
  worker that took it would die printing a ``KeyboardInterrupt`` traceback; the tuner ends
  its workers itself;
* leads a process group of its own, which the ``tileiras`` compiles it starts inherit:
  :func:`kill_group` kills the worker and its compiles together, and the terminal's Ctrl-C no
  longer reaches them;
* on Linux, asks to be killed when the tuner dies (``PR_SET_PDEATHSIG``), so a tuner killed
  outright (SIGKILL) leaves no idle worker behind either.

A child is started inside :func:`interrupts_held`: SIGINT and SIGTERM are blocked in the
starting thread (a child inherits the mask: a Ctrl-C between its start and its
``become_worker`` waits, and is then discarded by the child), and the tuner's own handlers
wait for the end of the block (Python runs them in the main thread whichever thread took the
signal), so the ``KeyboardInterrupt`` is raised once the child is started and recorded, never
half-way through ``Process.start()``, which would leave a child nobody knows of.

:class:`CompilePool` is a ``ProcessPoolExecutor`` of such workers with :meth:`~CompilePool.kill`.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import sys
import threading
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import resource_tracker
from typing import Any

__all__ = ["CompilePool", "become_worker", "interrupts_held", "kill_group"]

_HELD = {signal.SIGINT, signal.SIGTERM}
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


@contextlib.contextmanager
def interrupts_held(*, children: bool = True):
    """For the block, SIGINT and SIGTERM wait: in the main thread their Python handlers are
    deferred to the end of the block, where one that arrived meanwhile runs (raising
    ``KeyboardInterrupt``); with ``children`` they are also blocked in this thread, so that
    children started in the block begin with them blocked. (``children=False``: a few storage
    calls that must not be cut in half, as the search driver's bookkeeping of a trial.)"""
    deferred: dict[int, Any] = {}
    arrived: list[int] = []
    holding = [True]

    def hold(signum, frame):
        if holding[0]:
            arrived.append(signum)
        else:  # the block has ended (a signal between its last steps)
            deferred[signum](signum, frame)

    # multiprocessing starts its resource tracker with the first spawned process and then
    # *unblocks* SIGINT and SIGTERM (not restoring the mask): start it before blocking them
    if children:
        resource_tracker.ensure_running()
    if threading.current_thread() is threading.main_thread():
        for sig in _HELD:
            handler = signal.getsignal(sig)
            if callable(handler):  # a Python handler (not SIG_IGN / SIG_DFL)
                deferred[sig] = handler
                signal.signal(sig, hold)
    old = (signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
           if children and hasattr(signal, "pthread_sigmask") else None)
    try:
        yield
    finally:
        if old is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        holding[0] = False
        for sig, handler in deferred.items():
            signal.signal(sig, handler)
        for signum in dict.fromkeys(arrived):
            deferred[signum](signum, None)


def become_worker(parent_pid: int, die_with_parent: bool = True) -> None:
    """Make this process a worker (the module docstring says what that means). ``parent_pid``:
    the tuner's pid; ``die_with_parent``: whether to die with it (only when the tuner started
    this process from its main thread: Linux ties the death signal to the starting thread)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # also discards one held since the start
    try:
        os.setpgid(0, 0)
    except OSError:  # already a group (or session) leader
        pass
    if die_with_parent and sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL),
                                                    0, 0, 0)
        except (OSError, AttributeError):  # no prctl: only a killed tuner leaves it behind
            pass
        if os.getppid() != parent_pid:  # the tuner died before the request took effect
            os._exit(1)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _HELD)


def kill_group(pid: int) -> None:
    """SIGKILL worker ``pid`` and its process group (its compiles). A worker that had not yet
    made its group has started nothing; killing ``pid`` alone is enough then."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


class CompilePool(ProcessPoolExecutor):
    """A process pool of workers (``spawn``-ed: the tuner may hold a CUDA context or threads,
    which must not be forked) that :meth:`kill` ends at once, with their compiles."""

    def __init__(self, max_workers: int) -> None:
        super().__init__(max_workers=max_workers,
                         mp_context=multiprocessing.get_context("spawn"),
                         initializer=become_worker,
                         initargs=(os.getpid(),
                                   threading.current_thread() is threading.main_thread()))

    def submit(self, fn, /, *args, **kwargs):
        with interrupts_held():  # the pool starts its processes here
            return super().submit(fn, *args, **kwargs)

    def kill(self) -> None:
        """Cancel what is queued and SIGKILL every worker's process group; returns at once."""
        # CPython's own list of the pool's processes (what 3.14's kill_workers() reads too);
        # copied first, as shutdown() drops it
        processes = dict(getattr(self, "_processes", None) or {})
        manager = getattr(self, "_executor_manager_thread", None)
        self.shutdown(wait=False, cancel_futures=True)
        for pid in processes:
            kill_group(pid)
        for process in processes.values():  # reap them: killed processes exit at once
            process.join(timeout=1)
        # the pool's manager thread sees its workers die and closes its wake-up pipe; until
        # Python 3.12, interpreter exit writes to that pipe unlocked, and one closed meanwhile
        # prints an "OSError: Bad file descriptor" traceback: let the thread finish first
        if manager is not None:
            manager.join(timeout=1)

    def close(self, *, now: bool = False) -> None:
        """``kill()`` when ``now``, else wait for the running jobs (queued ones are
        cancelled)."""
        if now:
            self.kill()
        else:
            self.shutdown(wait=True, cancel_futures=True)

    def __exit__(self, exc_type, exc, tb):
        self.close(now=exc_type is not None)
        return False
