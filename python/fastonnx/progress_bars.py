"""Progress of long exports on stderr: one tqdm bar per stage (capture, convert, optimize, write).

``progress=None`` (automatic) shows a stage's bar only when stderr is a terminal and the stage has run
for a second: short exports print nothing and never import tqdm. ``True`` shows every stage at once,
whatever stderr is; ``False`` prints nothing.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from fastonnx.errors import InputError

if TYPE_CHECKING:
    from tqdm import tqdm

# automatic bars appear once a stage has run this long
_DELAY_S = 1.0
# bars are redrawn at most this often (updates in between only store the count)
_REFRESH_S = 0.1


def _stderr_is_terminal() -> bool:
    stream = sys.stderr
    try:
        return stream is not None and stream.isatty()
    except (AttributeError, ValueError):  # replaced by an object without isatty, or closed
        return False


class Progress:
    """The progress setting of one export (``None``, ``True`` or ``False``)."""

    def __init__(self, setting: bool | None) -> None:
        if setting not in (None, True, False):
            raise InputError(f"progress must be None (automatic), True or False, got {setting!r}")
        self.enabled = setting is True or (setting is None and _stderr_is_terminal())
        self.delay = 0.0 if setting is True else _DELAY_S

    @contextmanager
    def stage(self, desc: str, *, unit: str = "it", byte_counts: bool = False) -> Iterator[Stage]:
        """A stage's bar. It is completed (100%) when the block ends normally and left where it stood
        when the block raises (Ctrl-C shows how far the export got)."""
        stage = Stage(desc, self.enabled, self.delay, unit, byte_counts)
        try:
            yield stage
        except BaseException:
            stage.close(completed=False)
            raise
        stage.close(completed=True)

    @contextmanager
    def timed(self, desc: str) -> Iterator[None]:
        """A stage that reports nothing while it runs (torch.export's capture): a one-step bar, shown
        and redrawn by a background thread so that its elapsed time moves."""
        with self.stage(desc) as stage:
            stage.bar_format = "{desc}: {percentage:3.0f}%|{bar}| {elapsed}"  # one step: no rate
            stage.update(0, 1)
            if not self.enabled:
                yield
                return
            done = threading.Event()

            def tick() -> None:
                while not done.wait(_REFRESH_S * 5):
                    stage.update(0, 1, force=True)

            ticker = threading.Thread(target=tick, name=f"fastonnx-progress-{desc}", daemon=True)
            ticker.start()
            try:
                yield
            finally:
                done.set()
                ticker.join()


class Stage:
    """One stage's count. ``update`` is cheap (a clock read) until the bar is due; the bar is made
    lazily, so a stage that ends within the delay costs no tqdm at all."""

    def __init__(self, desc: str, enabled: bool, delay: float, unit: str, byte_counts: bool) -> None:
        self.desc = desc
        self.enabled = enabled
        self.delay = delay
        self.unit = unit
        self.byte_counts = byte_counts
        self.bar_format: str | None = None
        self.started = time.monotonic()
        self.drawn = float("-inf")
        self.n = 0
        self.total: int | None = None
        self.bar: tqdm[Any] | None = None
        self.lock = threading.Lock()  # the capture's ticker thread redraws from its own thread

    def update(self, n: int, total: int | None = None, *, force: bool = False) -> None:
        """``n`` of ``total`` done. Usable as the Rust writer's and optimizer's ``progress`` callback."""
        if not self.enabled:
            return
        self.n = n
        if total is not None:
            self.total = total
        now = time.monotonic()
        if not force and now - self.drawn < _REFRESH_S:
            return
        if self.bar is None and now - self.started < self.delay:
            return
        self.drawn = now
        self._draw()

    def _draw(self) -> None:
        with self.lock:
            if self.bar is None:
                self.bar = self._make_bar()
            if self.total is not None and self.bar.total != self.total:
                self.bar.total = self.total
            self.bar.n = self.n
            self.bar.refresh()

    def _make_bar(self) -> tqdm[Any]:
        from tqdm import tqdm

        style: dict[str, Any] = {"unit_scale": True} if self.byte_counts else {}
        if self.bar_format is not None:
            style["bar_format"] = self.bar_format
        bar = tqdm(
            desc=self.desc,
            total=self.total,
            unit=self.unit,
            file=sys.stderr,
            dynamic_ncols=True,
            mininterval=_REFRESH_S,
            leave=True,
            **style,
        )
        # the bar appears late: its clock (wall time, as tqdm keeps it) starts with the stage
        bar.start_t = time.time() - (time.monotonic() - self.started)
        return bar

    def close(self, completed: bool) -> None:
        if not self.enabled:
            return
        if completed:
            if self.total is not None:
                self.n = self.total
            if self.bar is None and time.monotonic() - self.started >= self.delay:
                self._draw()  # a stage that ran past the delay between two updates still shows
        if self.bar is not None:
            with self.lock:
                self.bar.n = self.n
                self.bar.refresh()
                self.bar.close()
