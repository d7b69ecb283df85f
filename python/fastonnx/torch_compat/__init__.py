"""A drop-in for torch.onnx.export: ``export`` (same keywords), ``ONNXProgram`` (what it returns) and
``patch_torch_onnx`` (torch.onnx.export routed to fastonnx for code the user does not own)."""

from fastonnx.torch_compat.onnx_export import KEYWORDS, export
from fastonnx.torch_compat.patching import PatchedTorchOnnx, patch_torch_onnx
from fastonnx.torch_compat.program import ONNXProgram

__all__ = ["KEYWORDS", "ONNXProgram", "PatchedTorchOnnx", "export", "patch_torch_onnx"]
