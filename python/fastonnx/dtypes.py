"""torch dtype <-> ONNX TensorProto.DataType, without importing onnx."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

# ONNX TensorProto.DataType values (onnx.proto); kept here so that `import fastonnx` does not import onnx.
FLOAT = 1
UINT8 = 2
INT8 = 3
UINT16 = 4
INT16 = 5
INT32 = 6
INT64 = 7
STRING = 8
BOOL = 9
FLOAT16 = 10
DOUBLE = 11
UINT32 = 12
UINT64 = 13
COMPLEX64 = 14
COMPLEX128 = 15
BFLOAT16 = 16
FLOAT8E4M3FN = 17
FLOAT8E4M3FNUZ = 18
FLOAT8E5M2 = 19
FLOAT8E5M2FNUZ = 20
FLOAT4E2M1 = 23

TORCH_TO_ONNX: dict[torch.dtype, int] = {
    torch.float32: FLOAT,
    torch.uint8: UINT8,
    torch.int8: INT8,
    torch.uint16: UINT16,
    torch.int16: INT16,
    torch.int32: INT32,
    torch.int64: INT64,
    torch.bool: BOOL,
    torch.float16: FLOAT16,
    torch.float64: DOUBLE,
    torch.uint32: UINT32,
    torch.uint64: UINT64,
    torch.complex64: COMPLEX64,
    torch.complex128: COMPLEX128,
    torch.bfloat16: BFLOAT16,
    torch.float8_e4m3fn: FLOAT8E4M3FN,
    torch.float8_e4m3fnuz: FLOAT8E4M3FNUZ,
    torch.float8_e5m2: FLOAT8E5M2,
    torch.float8_e5m2fnuz: FLOAT8E5M2FNUZ,
    torch.float4_e2m1fn_x2: FLOAT4E2M1,
}
ONNX_TO_TORCH: dict[int, torch.dtype] = {v: k for k, v in TORCH_TO_ONNX.items()}

# The first opset whose operators accept these types (Cast, QuantizeLinear... define float8 from 19,
# float4 e2m1 from 23).
MIN_OPSET_OF: dict[torch.dtype, int] = {
    torch.float8_e4m3fn: 19,
    torch.float8_e4m3fnuz: 19,
    torch.float8_e5m2: 19,
    torch.float8_e5m2fnuz: 19,
    torch.float4_e2m1fn_x2: 23,
}

# torch dtypes whose one element packs two 4-bit ONNX elements (low nibble first, as ONNX packs them):
# the ONNX tensor has the same bytes and a last dim twice torch's.
PACKED_X2 = frozenset({torch.float4_e2m1fn_x2})

# e2m1's non-negative values by 3-bit code (exponent bits 2-1 with bias 1, mantissa bit 0, as the ONNX
# spec defines FLOAT4E2M1; no inf, no NaN); bit 3 is the sign
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)

FLOAT_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})


def to_onnx_dtype(dtype: torch.dtype) -> int:
    """The ONNX element type of a torch dtype; an unsupported dtype raises TypeError naming it."""
    try:
        return TORCH_TO_ONNX[dtype]
    except KeyError:
        raise TypeError(f"torch dtype {dtype} has no ONNX equivalent") from None


def onnx_dims(dtype: torch.dtype, dims: list[Any]) -> list[Any]:
    """The ONNX dims of a torch tensor of ``dtype`` and ``dims``: torch's, except that a dtype packing two
    4-bit values per element (float4_e2m1fn_x2) doubles the last one. ``dims`` are ints or the
    builder's dims (a symbolic last dim of a packed dtype is refused)."""
    if dtype not in PACKED_X2:
        return dims
    if not dims:
        raise TypeError(f"a 0-d {dtype} tensor has no ONNX equivalent (ONNX packs along the last dim)")
    last = dims[-1]
    if not isinstance(last, int):
        raise TypeError(f"a {dtype} tensor with a symbolic last dim ({last}) has no ONNX equivalent")
    return [*dims[:-1], 2 * last]


def e2m1_code(value: float) -> int:
    """The 4-bit code of a value float4 e2m1 holds exactly (torch cannot convert a number to
    float4_e2m1fn_x2); ValueError for any other value."""
    magnitude = abs(float(value))
    if magnitude not in E2M1_VALUES:
        raise ValueError(f"{value!r} is not a float4 e2m1 value (one of ±{list(E2M1_VALUES)})")
    return E2M1_VALUES.index(magnitude) | (8 if math.copysign(1.0, value) < 0 else 0)


def to_torch_dtype(elem_type: int) -> torch.dtype:
    try:
        return ONNX_TO_TORCH[elem_type]
    except KeyError:
        raise TypeError(f"ONNX element type {elem_type} has no torch equivalent") from None


def on_host(t: torch.Tensor) -> bool:
    """Whether ``t``'s bytes are in host memory (a CPU tensor), as opposed to a GPU's or another
    accelerator's (meta and fake tensors have no bytes at all: the caller tells them apart first)."""
    return t.device.type == "cpu"


def tensor_bytes(t: torch.Tensor) -> np.ndarray:
    """The bytes of ``t`` in row-major order as a uint8 array sharing its memory (a copy only when ``t``
    is not contiguous): the one path from a tensor to ONNX bytes, bfloat16 and float8 included
    (numpy has no such dtypes; their bytes pass as uint8). ``reshape(-1)`` handles 0-d tensors.

    A tensor that is not on the CPU is copied to the host here, and only here (``t.to("cpu")``): the
    exporter calls this for such weights while it writes the file, one tensor at a time (the writer's
    prefetching worker asks for the next one as it writes the previous), so the host holds one copy at
    a time, never the whole model."""
    host = t.detach()
    if not on_host(host):
        host = host.to("cpu")
    flat = host.contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy()
