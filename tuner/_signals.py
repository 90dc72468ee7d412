"""How ``tiledtune`` takes Ctrl-C and SIGTERM: once.

The first SIGINT raises ``KeyboardInterrupt`` where the command is; the command's ``with`` and
``finally`` blocks then kill its worker processes (with their tileiras compiles) and give back
what the interrupted trials held, so the same command resumes. Signals after the first are
ignored until the command has returned: a second Ctrl-C, which users press when the first seems
slow, would otherwise cut that cleanup short and leave processes behind. SIGTERM does the same
quietly (:class:`Terminated`): it is how ``search --workers`` stops its per-GPU searches.
Stdlib only, so that ``tiledtune --help`` stays light.
"""

from __future__ import annotations

import contextlib
import signal
import threading

__all__ = ["Terminated", "interrupts_once"]


class Terminated(KeyboardInterrupt):
    """A SIGTERM, taken as a Ctrl-C is (every ``except Exception`` lets it through) but ended
    without a message."""


@contextlib.contextmanager
def interrupts_once():
    """For the block (in the main thread; elsewhere it does nothing): the first SIGINT raises
    ``KeyboardInterrupt``, the first SIGTERM :class:`Terminated`; after either, both are
    ignored. A SIGINT ignored on entry (a background job) stays ignored; the handlers before
    the block are restored after it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def stop(signum, frame):
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)
        raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()

    for sig, handler in previous.items():
        if handler is not signal.SIG_IGN:
            signal.signal(sig, stop)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
