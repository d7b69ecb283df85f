"""fastonnx: the fastest correct PyTorch -> ONNX exporter."""

from fastonnx._core import __version__
from fastonnx.api import to_onnx
from fastonnx.compile_backend import FastOnnxBackend, backend, debug_backend
from fastonnx.diagnostics.verdicts import Verification, VerificationInfo
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
    SizeGuardError,
    UnsupportedOpError,
)
from fastonnx.opsets import DEFAULT_OPSET, MAX_OPSET, MIN_OPSET
from fastonnx.pretrained import export_pretrained
from fastonnx.result import ExportResult
from fastonnx.stored_weights.attach import attach_weights
from fastonnx.stored_weights.weight_quantization import WeightQuantization
from fastonnx.torch_compat import ONNXProgram, export, patch_torch_onnx
from fastonnx.walker.graph_module import graph_module_to_onnx
from fastonnx.walker.local_functions import inline_functions

__all__ = [
    "CaptureError",
    "ConversionError",
    "DEFAULT_OPSET",
    "ExportResult",
    "FastOnnxBackend",
    "FastOnnxError",
    "GraphError",
    "InputError",
    "MAX_OPSET",
    "MIN_OPSET",
    "ModelTooLargeError",
    "ONNXProgram",
    "OpsetError",
    "RuntimeCheckError",
    "SerializationError",
    "SizeGuardError",
    "UnsupportedOpError",
    "Verification",
    "VerificationInfo",
    "WeightQuantization",
    "__version__",
    "attach_weights",
    "backend",
    "debug_backend",
    "export",
    "export_pretrained",
    "inline_functions",
    "graph_module_to_onnx",
    "patch_torch_onnx",
    "to_onnx",
]
