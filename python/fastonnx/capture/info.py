"""What a capture found (``CaptureInfo``): the strategy that ran and why the others did not, and what
it changed of the user's request; ``stats()`` is what ``ExportResult.stats`` reports of it."""

from __future__ import annotations

import dataclasses
from typing import Any

from fastonnx.capture.guards import Proven


@dataclasses.dataclass
class CaptureInfo:
    """What a capture found: the path that ran and why, and what it changed of the user's request."""

    path: str = "export"  # "trace", "export" or "stamped"
    trace_refused: str | None = None  # why the trace did not run, when it could have
    stamp_refused: str | None = None  # why dynamic shapes were not captured by stamping (stamping.py)
    stamped: str | None = None  # "N of M layers of <path> stamped" when they were
    training_mode: bool = False
    dynamic_shapes_refined: list[str] | None = None  # torch's fixes, when the first try was refused
    size_oblivious: bool | None = None  # False when the capture was retried without it
    dynamic_ranges: dict[str, list[int | None]] | None = None  # "input[axis]": [min, max or None]
    proven: Proven | None = None  # the sizes the program is right for (guards.py), with dynamic shapes
    guards_s: float | None = None  # what checking them cost: naming guards' lines, then the proof
    narrowed: str | None = None  # the narrowing keep_narrowed=True accepted
    decompositions: int | None = None  # entries of the user's table applied
    functionalized: str | None = None  # why run_decompositions({}) ran
    refusal: str | None = None  # torch's explanation of its last refusal (errors quote it; not in stats)

    def stats(self) -> dict[str, Any]:
        """The keys to_onnx's ``stats`` holds for the capture (unset ones left out)."""
        found: dict[str, Any] = {"capture": self.path}
        if self.trace_refused is not None:
            found["trace_refused"] = self.trace_refused
        if self.stamp_refused is not None:
            found["stamp_refused"] = self.stamp_refused
        if self.stamped is not None:
            found["stamped"] = self.stamped
        if self.training_mode:
            found["training_mode"] = True
        if self.size_oblivious is False:
            found["size_oblivious"] = False
        for key in (
            "dynamic_shapes_refined",
            "dynamic_ranges",
            "decompositions",
            "functionalized",
            "guards_s",
        ):
            if getattr(self, key) is not None:
                found[key] = getattr(self, key)
        if self.proven is not None and self.proven.guards:
            found["guards_kept"] = [g.text for g in self.proven.guards]
        if self.narrowed is not None:
            found["narrowed"] = self.narrowed
        return found
