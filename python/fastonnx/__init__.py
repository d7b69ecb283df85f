"""fastonnx: the fastest correct PyTorch -> ONNX exporter."""

from fastonnx._core import __version__
from fastonnx.api import to_onnx
from fastonnx.compile_backend import FastOnnxBackend, backend, debug_backend
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
from fastonnx.graph_module import graph_module_to_onnx
from fastonnx.opsets import DEFAULT_OPSET, MAX_OPSET, MIN_OPSET
from fastonnx.result import ExportResult
from fastonnx.weights import attach_weights

__all__ = [
    "DEFAULT_OPSET",
    "MAX_OPSET",
    "MIN_OPSET",
    "CaptureError",
    "ConversionError",
    "ExportResult",
    "FastOnnxBackend",
    "FastOnnxError",
    "GraphError",
    "InputError",
    "ModelTooLargeError",
    "OpsetError",
    "RuntimeCheckError",
    "SerializationError",
    "UnsupportedOpError",
    "__version__",
    "attach_weights",
    "backend",
    "debug_backend",
    "graph_module_to_onnx",
    "to_onnx",
]
