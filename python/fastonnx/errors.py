"""The exceptions fastonnx raises: one hierarchy, rooted in the native module's FastOnnxError.

FastOnnxError
├── GraphError              (native) the graph being built is inconsistent
├── SerializationError      (native) the model could not be written
│   └── ModelTooLargeError  (native) over 2 GiB with external data refused
├── InputError              the model, args or options given to to_onnx are not valid
│   └── SizeGuardError      inputs outside the sizes an export was proven for
├── CaptureError            torch.export could not capture the model
├── ConversionError         a node could not be converted
│   ├── UnsupportedOpError  no converter for an aten op
│   └── OpsetError          the op has no form at the requested opset
└── RuntimeCheckError       onnxruntime refused or failed the exported model
"""

from __future__ import annotations

from fastonnx._core import FastOnnxError, GraphError, ModelTooLargeError, SerializationError

__all__ = [
    "CaptureError",
    "ConversionError",
    "FastOnnxError",
    "GraphError",
    "InputError",
    "ModelTooLargeError",
    "OpsetError",
    "RuntimeCheckError",
    "SerializationError",
    "SizeGuardError",
    "UnsupportedOpError",
]


class InputError(FastOnnxError, TypeError):
    """What the user passed to to_onnx is not valid (wrong type, bad option)."""


class SizeGuardError(InputError, ValueError):
    """Inputs whose sizes are outside what the exported program was proven for (its dims' ranges and
    the guards kept with it: capture/guards.py); onnxruntime would run them and could answer wrong."""


class CaptureError(FastOnnxError):
    """torch.export failed; the message carries torch's own explanation."""


class ConversionError(FastOnnxError):
    """A node of the FX graph could not be converted; the message names the node and source line."""


class UnsupportedOpError(ConversionError):
    """No converter is registered for an aten op (and none was given in custom_converters)."""


class OpsetError(ConversionError, ValueError):
    """The requested opset is outside the supported range, or an op has no form at that opset."""


class RuntimeCheckError(FastOnnxError):
    """onnxruntime could not load or run the exported model."""
