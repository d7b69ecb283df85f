"""Peak resident memory of this process (Linux): what the zero-copy test asserts and the benches report."""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any


def status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def reset_peak() -> int:
    """Resets VmHWM to the current RSS (through /proc/self/clear_refs); returns that RSS in bytes."""
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return status_kib("VmRSS") * 1024


def peak_since(rss_before: int) -> int:
    """Bytes the peak RSS rose above ``rss_before`` (from reset_peak)."""
    return status_kib("VmHWM") * 1024 - rss_before


def peak_extra_bytes(fn: Callable[[], Any]) -> int:
    rss = reset_peak()
    fn()
    return peak_since(rss)
