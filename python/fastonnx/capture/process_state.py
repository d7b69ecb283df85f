"""What a capture changes of the process: the lock every trace holds, and transformers' cache classes
registered with torch's pytree once.

torch.export is not thread-safe, nor are the module patches applied while capturing: everything that
traces runs under :data:`TRACE_LOCK`; conversion and writing do not take it.
"""

from __future__ import annotations

import sys
import threading

from fastonnx.capture.transformers_caches import register_transformers_caches

TRACE_LOCK = threading.RLock()
"""Held by every fastonnx call that traces (torch.export, run_decompositions) or patches process-wide
state for it (torch._VF, torchvision's detection helpers, torch.fx.experimental._config). Reentrant, so
a user who exports their own ExportedProgram under it may call to_onnx inside."""

_pytree_registered = False


def register_pytree_types() -> None:
    """transformers' cache classes registered with torch's pytree (process-wide, once, under the lock;
    a no-op without a lock once done or while transformers is not imported)."""
    global _pytree_registered
    if _pytree_registered or "transformers" not in sys.modules:
        return
    with TRACE_LOCK:
        register_transformers_caches()
        _pytree_registered = True
