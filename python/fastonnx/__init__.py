"""fastonnx: the fastest correct PyTorch -> ONNX exporter."""

from fastonnx._core import __version__
from fastonnx.api import to_onnx
from fastonnx.errors import (
    CaptureError,
    ConversionError,
    FastOnnxError,
    GraphError,
    InputError,
    ModelTooLargeError,
    OpsetError,
    RuntimeCheckError,
    SerializationError,
    UnsupportedOpError,
)
from fastonnx.opsets import DEFAULT_OPSET, MAX_OPSET, MIN_OPSET
from fastonnx.result import ExportResult
from fastonnx.torch_compat import ONNXProgram, export, patch_torch_onnx
from fastonnx.verification import Verification, VerificationInfo
from fastonnx.weights import attach_weights

__all__ = [
    "DEFAULT_OPSET",
    "MAX_OPSET",
    "MIN_OPSET",
    "CaptureError",
    "ConversionError",
    "ExportResult",
    "FastOnnxError",
    "GraphError",
    "InputError",
    "ModelTooLargeError",
    "ONNXProgram",
    "OpsetError",
    "RuntimeCheckError",
    "SerializationError",
    "UnsupportedOpError",
    "Verification",
    "VerificationInfo",
    "__version__",
    "attach_weights",
    "export",
    "patch_torch_onnx",
    "to_onnx",
]
