"""``patch_torch_onnx()``: torch.onnx.export (and torch.onnx.utils.export) routed to fastonnx.export for
code the user does not own (ultralytics, timm, a script), torch's functions restored afterwards.

    with fastonnx.patch_torch_onnx():
        YOLO("yolo11n.yaml").export(format="onnx")

    patch = fastonnx.patch_torch_onnx()     # in a script: patched until restore()
    ...
    patch.restore()

The replacements keep torch's signature for ``inspect.signature`` (timm branches on it) and bind the
caller's arguments against it, so a call torch would refuse is refused the same way. Only the
arguments the caller passed reach fastonnx.export: torch's defaults never override fastonnx's (torch's
``external_data=True`` default would otherwise always split the weights into a .data file). Patches
nest and may be restored in any order: torch's functions come back when the last one is restored.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

from fastonnx.torch_compat.onnx_export import export

_lock = threading.Lock()
_active: list[PatchedTorchOnnx] = []
# (module, attribute) -> torch's own function, while at least one patch is active
_originals: dict[tuple[Any, str], Callable[..., Any]] = {}


def _targets() -> list[tuple[Any, str]]:
    # imported here: torch.onnx costs ~60 ms to import, which only a patch needs
    import torch.onnx
    import torch.onnx.utils

    targets: list[tuple[Any, str]] = [(torch.onnx, "export")]
    # the TorchScript-era entry point, still called by older code
    if callable(getattr(torch.onnx.utils, "export", None)):
        targets.append((torch.onnx.utils, "export"))
    return targets


def _routed(original: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def routed(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)  # torch's own TypeError for a call torch refuses
        with _lock:
            keep = bool(_active) and _active[-1].keep_narrowed  # the innermost patch's choice
        return export(**bound.arguments, keep_narrowed=keep)

    routed.__fastonnx_patch__ = True  # type: ignore[attr-defined]
    return routed


class PatchedTorchOnnx:
    """An active patch: a context manager, or ``restore()`` it."""

    def __init__(self, keep_narrowed: bool = False) -> None:
        self.keep_narrowed = keep_narrowed
        self._restored = False
        with _lock:
            if not _active:
                for module, attr in _targets():
                    original = getattr(module, attr)
                    _originals[(module, attr)] = original
                    setattr(module, attr, _routed(original))
            _active.append(self)

    def restore(self) -> None:
        """Undo this patch (torch's functions are back once every patch is restored). Idempotent."""
        with _lock:
            if self._restored:
                return
            self._restored = True
            _active.remove(self)
            if not _active:
                for (module, attr), original in _originals.items():
                    setattr(module, attr, original)
                _originals.clear()

    @property
    def active(self) -> bool:
        return not self._restored

    def __enter__(self) -> PatchedTorchOnnx:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.restore()


def patch_torch_onnx(keep_narrowed: bool = False) -> PatchedTorchOnnx:
    """Route torch.onnx.export to fastonnx.export until the returned object is restored (or its
    ``with`` block ends). ``keep_narrowed``: as fastonnx.export's, for code whose calls cannot pass
    it (ultralytics' ``dynamic=True``: a YOLO program is right at the sizes its strided feature maps
    concatenate at only; refused by default, kept with the guards when True)."""
    return PatchedTorchOnnx(keep_narrowed)
