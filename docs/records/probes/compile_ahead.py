"""Compile a probe's candidate schedules for sm_90 before it times them, in a pool of processes
(cuTile's on-disk cache then serves the launches), so a sweep does not wait on each build in
turn on the GPU machine.

    from compile_ahead import compile_ahead
    compile_ahead([(problem, schedule), ...])             # decode schedules
    compile_ahead(jobs, family="FORWARD")                 # another family's
    compile_ahead(jobs, family="BACKWARD", launchable=True)  # every kernel a call may launch

A schedule that does not compile is printed (``not compiled: ...``) and left to its launch,
which reports it again.
"""

import os
from concurrent.futures import ProcessPoolExecutor

import tiledattention as ta


def _compile(job):
    family, problem, schedule, launchable = job
    try:
        found = getattr(ta, family)
        (found.compile_launchable if launchable else found.compile)(problem, schedule, "sm_90")
    except Exception as exc:  # noqa: BLE001 - reported, and again by the launch that follows
        return f"{type(exc).__name__}: {exc}"[:160]
    return None


def compile_ahead(jobs, family="DECODE", launchable=False):
    """Compile every ``(problem, schedule)`` of ``jobs`` with ``ta.<family>``, up to 16 at a
    time (``launchable``: every kernel variant a call may launch, ``compile_launchable``, not
    only ``compile``'s); print the ones that fail."""
    work = [(family, p, s, launchable) for p, s in jobs]
    with ProcessPoolExecutor(max_workers=min(16, os.cpu_count() or 1)) as pool:
        for failed in pool.map(_compile, work):
            if failed:
                print("  not compiled:", failed)
