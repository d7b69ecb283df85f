"""SIGTERM during an export stops it the way Ctrl-C does.

Python leaves SIGTERM (what job runners and ``kill`` send) to the system, which ends the process on
the spot: an export cut there cannot remove its temporary files. While an export runs on the main
thread and SIGTERM still has that default disposition, a temporary handler turns it into
KeyboardInterrupt, which every stage handles like a Ctrl-C (the write stops between pieces, removes
its temporaries and leaves the old files as they were); the default comes back when the export
returns or raises. A handler the program installed itself is never replaced, and exports on other
threads leave signals alone (Python runs handlers on the main thread only).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


def _stop(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Inside the block, SIGTERM raises KeyboardInterrupt when nobody handles it (see the module)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield  # the program's own handler, or an export running inside another one
        return
    signal.signal(signal.SIGTERM, _stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
