"""Supported ONNX opsets and the IR version each needs (no import of onnx at runtime)."""

from __future__ import annotations

from fastonnx.errors import OpsetError

MIN_OPSET = 17
# The newest opset the pinned onnxruntime (1.31) loads; tests/conversion/test_opsets.py guards it.
MAX_OPSET = 26
# The official exporter's default, so that files are interchangeable by default.
DEFAULT_OPSET = 20

# Lowest IR version each default-domain opset needs (onnx.helper.find_min_ir_version_for; tested).
_IR_VERSION = {17: 8, 18: 8, 19: 9, 20: 9, 21: 10, 22: 10, 23: 11, 24: 12, 25: 13, 26: 13}


def resolve_opset(opset: int | None) -> int:
    if opset is None:
        return DEFAULT_OPSET
    if isinstance(opset, bool) or not isinstance(opset, int):
        raise OpsetError(f"opset must be an int from {MIN_OPSET} to {MAX_OPSET}, got {opset!r}")
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise OpsetError(
            f"opset {opset} is not supported: fastonnx emits opsets {MIN_OPSET} to {MAX_OPSET} "
            f"(MAX_OPSET is the newest the pinned onnxruntime loads)"
        )
    return opset


def ir_version_for(opset: int) -> int:
    return _IR_VERSION[opset]
