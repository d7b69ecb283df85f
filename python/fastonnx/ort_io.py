"""Tensors to and from onnxruntime: torch tensors as the arrays (or OrtValues) a session reads, and its
outputs back as torch tensors, the dtypes numpy lacks (bfloat16, float8, uint64) included."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from fastonnx import dtypes

if TYPE_CHECKING:
    import onnxruntime

FLOAT8_ONNX_TYPES: dict[torch.dtype, int] = {
    torch.float8_e4m3fn: dtypes.FLOAT8E4M3FN,
    torch.float8_e4m3fnuz: dtypes.FLOAT8E4M3FNUZ,
    torch.float8_e5m2: dtypes.FLOAT8E5M2,
    torch.float8_e5m2fnuz: dtypes.FLOAT8E5M2FNUZ,
}
FLOAT8_TYPE_STRINGS = frozenset(
    {"tensor(float8e4m3fn)", "tensor(float8e4m3fnuz)", "tensor(float8e5m2)", "tensor(float8e5m2fnuz)"}
)


def run_bound(
    sess: onnxruntime.InferenceSession, names: list[str], tensors: dict[str, torch.Tensor]
) -> list[torch.Tensor]:
    """One run through I/O binding: float8 inputs bound as OrtValues of their ONNX type, float8 outputs
    read back from onnxruntime's buffer as bytes and viewed as the torch dtype."""
    import onnxruntime

    binding = sess.io_binding()
    keep: list[Any] = []  # the arrays the bound OrtValues read from, alive until the run ends
    for name, t in tensors.items():
        onnx_type = FLOAT8_ONNX_TYPES.get(t.dtype)
        if onnx_type is not None:
            raw = t.detach().cpu().contiguous().view(torch.uint8).numpy()
            value = onnxruntime.OrtValue.ortvalue_from_numpy_with_onnx_type(raw, onnx_type)
        else:
            raw = to_numpy(t)
            value = onnxruntime.OrtValue.ortvalue_from_numpy(raw)
        keep.append(raw)
        binding.bind_ortvalue_input(name, value)
    for name in names:
        binding.bind_output(name, "cpu")
    sess.run_with_iobinding(binding)
    return [ortvalue_to_torch(v) for v in binding.get_outputs()]


def ortvalue_to_torch(value: Any) -> torch.Tensor:
    dtype = dtypes.ONNX_TO_TORCH.get(value.element_type())
    if dtype not in FLOAT8_ONNX_TYPES:
        return from_numpy(value.numpy())
    import ctypes

    size = value.tensor_size_in_bytes()
    shape = list(value.shape())
    if size == 0:
        return torch.empty(shape, dtype=dtype)
    buffer = (ctypes.c_uint8 * size).from_address(value.data_ptr())
    raw = torch.frombuffer(bytearray(buffer), dtype=torch.uint8)  # a copy: the OrtValue owns its buffer
    return raw.view(dtype).reshape(shape)


def from_numpy(a: Any) -> torch.Tensor:
    if a.dtype.char == "Q":  # onnxruntime's uint64 arrays are numpy ulonglong, which torch refuses
        a = a.view("uint64")
    return torch.from_numpy(a)


def to_numpy(t: torch.Tensor) -> Any:
    t = t.detach().cpu()
    if t.is_complex():
        t = torch.view_as_real(t.resolve_conj())  # the graph's layout of complex values
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.view(torch.uint16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()
