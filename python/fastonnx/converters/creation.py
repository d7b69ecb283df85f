"""Tensor creation: arange, full / zeros / ones / empty and their _like / new_ variants, eye, linspace.

Static sizes and values become constants or ConstantOfShape over a constant shape; symbolic sizes read
their dims at runtime. ``empty`` is filled with zeros (any content is valid for it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from fastonnx import dtypes
from fastonnx.context import ConversionContext, Converter, Value
from fastonnx.converters.lib.kernels import NATIVE
from fastonnx.converters.lib.shape_graphs import is_static, shape_of

aten = torch.ops.aten

# ConstantOfShape takes bfloat16 values from opset 20 only; below that it is filled in float32 and cast.
# onnxruntime 1.31 has no float8 ConstantOfShape kernel at any opset: float8 fills are always cast
# (Cast rounds to nearest even as torch's conversion does).
_NEVER = 1 << 30
_CAST_FILL = {
    torch.bfloat16: 20,
    torch.float8_e4m3fn: _NEVER,
    torch.float8_e4m3fnuz: _NEVER,
    torch.float8_e5m2: _NEVER,
    torch.float8_e5m2fnuz: _NEVER,
}


def _shape(ctx: ConversionContext, size: Sequence[Any], like: Value | None = None) -> str:
    """The ONNX shape of the result: torch's, but for a float4_e2m1fn_x2 result (two values per torch
    element) whose static last dim doubles, as the ONNX tensor counts the values."""
    dims = list(ctx.out_shape) if is_static(ctx.out_shape) else list(size)
    if ctx.out_dtype in dtypes.PACKED_X2:
        last = ctx.out_shape[-1] if ctx.out_shape else None
        if not isinstance(last, int):
            raise ctx.error(f"a {ctx.out_dtype} tensor needs a static last dim, got shape {ctx.out_shape}")
        dims[-1] = 2 * last
    shape = shape_of(ctx, dims, (like,) if like is not None else ())
    if shape is None:
        raise ctx.error(f"cannot build the runtime size {list(size)}")
    return shape


def fill(ctx: ConversionContext, shape: str, value: Any, dtype: torch.dtype) -> str:
    """A tensor of ``shape`` (1-D int64 value) filled with ``value`` (Python number or 0-d Value)."""
    if isinstance(value, (Value, str)):
        return ctx.op("Expand", ctx.operand(value, dtype), shape)
    if isinstance(value, (torch.SymInt, torch.SymFloat)):
        return ctx.op("Expand", ctx.cast(ctx.sym_value(value), dtype), shape)
    if dtype in _CAST_FILL and ctx.opset < _CAST_FILL[dtype]:
        as_float = ctx.op("ConstantOfShape", shape, value=ctx.tensor_attr(value, torch.float32))
        return ctx.cast(as_float, dtype)
    return ctx.op("ConstantOfShape", shape, value=ctx.tensor_attr(value, dtype))


def _full(ctx: ConversionContext, size: Sequence[Any], value: Any, like: Value | None = None) -> str:
    return fill(ctx, _shape(ctx, size, like), value, ctx.out_dtype)


def convert_full(ctx: ConversionContext, size: Sequence[Any], fill_value: Any, **_: Any) -> str:
    return _full(ctx, size, fill_value)


def convert_zeros(ctx: ConversionContext, size: Sequence[Any], *args: Any, **_: Any) -> str:
    return _full(ctx, size, 0)


def convert_ones(ctx: ConversionContext, size: Sequence[Any], *args: Any, **_: Any) -> str:
    return _full(ctx, size, 1)


def convert_new_full(ctx: ConversionContext, x: Value, size: Sequence[Any], fill_value: Any, **_: Any) -> str:
    return _full(ctx, size, fill_value, x)


def convert_new_zeros(ctx: ConversionContext, x: Value, size: Sequence[Any], **_: Any) -> str:
    return _full(ctx, size, 0, x)


def convert_new_empty_strided(
    ctx: ConversionContext, x: Value, size: Sequence[Any], stride: Sequence[Any], **_: Any
) -> str:
    """Strides describe memory layout, which ONNX tensors do not have: zeros of ``size``."""
    return _full(ctx, size, 0, x)


def convert_new_ones(ctx: ConversionContext, x: Value, size: Sequence[Any], **_: Any) -> str:
    return _full(ctx, size, 1, x)


def _like(ctx: ConversionContext, x: Value, value: Any) -> str:
    if x.dtype in dtypes.PACKED_X2 or ctx.out_dtype in dtypes.PACKED_X2:
        # x's ONNX shape and the result's differ in their last dim unless both are float4
        return fill(ctx, _shape(ctx, ctx.out_shape, x), value, ctx.out_dtype)
    return fill(ctx, ctx.dims_of(x), value, ctx.out_dtype)


def convert_zeros_like(ctx: ConversionContext, x: Value, **_: Any) -> str:
    return _like(ctx, x, 0)


def convert_ones_like(ctx: ConversionContext, x: Value, **_: Any) -> str:
    return _like(ctx, x, 1)


def convert_full_like(ctx: ConversionContext, x: Value, fill_value: Any, **_: Any) -> str:
    return _like(ctx, x, fill_value)


def convert_fill(ctx: ConversionContext, x: Value, value: Any) -> str:
    if isinstance(value, Value) and value.rank:
        value = ctx.op("Reshape", value, ctx.i64([]))
    return _like(ctx, x, value)


def convert_zero(ctx: ConversionContext, x: Value) -> str:
    return _like(ctx, x, 0)


def convert_scalar_tensor(ctx: ConversionContext, s: Any, **_: Any) -> str:
    dtype = ctx.out_dtype
    if isinstance(s, (Value, str)):
        return ctx.cast(s, dtype)
    return ctx.const(s, dtype)


# ---- ranges ---------------------------------------------------------------------------------------
def _arange(ctx: ConversionContext, start: Any, end: Any, step: Any) -> str:
    dtype = ctx.out_dtype
    if all(isinstance(v, (int, float)) for v in (start, end, step)):
        # torch computes the values; they become a constant of exactly that content
        return ctx.const(torch.arange(start, end, step, dtype=dtype), dtype)
    compute = (
        dtype if dtype in NATIVE["Range"] else (torch.float32 if dtype.is_floating_point else torch.int64)
    )
    parts = [_scalar(ctx, v, compute) for v in (start, end, step)]
    return ctx.cast(ctx.op("Range", *parts), dtype)


def _scalar(ctx: ConversionContext, v: Any, dtype: torch.dtype) -> str:
    if isinstance(v, (torch.SymInt, torch.SymFloat)):
        v = ctx.sym_value(v)
    if isinstance(v, (Value, str)) and ctx.rank(v) not in (0, None):
        v = ctx.op("Reshape", v, ctx.i64([]))
    return ctx.operand(v, dtype)


def convert_arange(ctx: ConversionContext, end: Any, **_: Any) -> str:
    return _arange(ctx, 0, end, 1)


def convert_arange_start(ctx: ConversionContext, start: Any, end: Any, **_: Any) -> str:
    return _arange(ctx, start, end, 1)


def convert_arange_start_step(ctx: ConversionContext, start: Any, end: Any, step: Any = 1, **_: Any) -> str:
    return _arange(ctx, start, end, step)


def convert_linspace(ctx: ConversionContext, start: Any, end: Any, steps: Any, **_: Any) -> str:
    dtype = ctx.out_dtype
    if all(isinstance(v, (int, float)) for v in (start, end, steps)):
        return ctx.const(torch.linspace(start, end, steps, dtype=dtype), dtype)
    return _spaced(ctx, start, end, steps, None)


def convert_logspace(
    ctx: ConversionContext, start: Any, end: Any, steps: Any, base: float = 10.0, **_: Any
) -> str:
    dtype = ctx.out_dtype
    if all(isinstance(v, (int, float)) for v in (start, end, steps, base)):
        return ctx.const(torch.logspace(start, end, steps, base, dtype=dtype), dtype)
    return _spaced(ctx, start, end, steps, float(base))


def _endpoint(ctx: ConversionContext, v: Any, dtype: torch.dtype, compute: torch.dtype) -> str:
    """A start / end converted to the output dtype first (torch's ``Scalar.to<scalar_t>()``)."""
    if isinstance(v, (int, float)):
        return ctx.const(torch.tensor(v).to(dtype), compute)
    return ctx.cast(_scalar(ctx, v, dtype), compute)


def _spaced(ctx: ConversionContext, start: Any, end: Any, steps: Any, base: float | None) -> str:
    """linspace (``base`` None) or logspace with tensor endpoints, as torch's CPU kernel computes them:
    step = (end - start) / (steps - 1); the first half counts up from start, the second half down
    from end. Integer results (and every logspace) are computed in float64 and truncated."""
    dtype = ctx.out_dtype
    if not isinstance(steps, int):
        raise ctx.error("linspace / logspace need a Python int for steps")
    if steps == 0:
        return ctx.const(torch.zeros(0, dtype=dtype), dtype)
    wide = base is not None or not dtype.is_floating_point
    compute = (
        torch.float64 if wide else (torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype)
    )
    s = _endpoint(ctx, start, dtype, compute)
    if steps == 1:
        value = s
    else:
        e = _endpoint(ctx, end, dtype, compute)
        step = ctx.op("Div", ctx.op("Sub", e, s), ctx.const(steps - 1, compute))
        idx = torch.arange(steps, dtype=torch.float64)
        up = ctx.op("Add", s, ctx.op("Mul", step, ctx.const(idx, compute)))
        down = ctx.op("Sub", e, ctx.op("Mul", step, ctx.const(steps - 1 - idx, compute)))
        value = ctx.op("Where", ctx.const(idx < steps // 2, torch.bool), up, down)
    if base is not None:
        value = ctx.op("Pow", ctx.const(base, compute), value)
    return ctx.cast(ctx.op("Reshape", value, ctx.i64([steps])), dtype)


def convert_eye(ctx: ConversionContext, n: Any, m: Any = None, **_: Any) -> str:
    dtype = ctx.out_dtype
    m = n if m is None else m
    if isinstance(n, int) and isinstance(m, int):
        if n * m <= 4096:
            return ctx.const(torch.eye(n, m, dtype=dtype), dtype)
    shape = ctx.shape_tensor([n, m])
    # EyeLike has float and int kernels everywhere; bool and small types go through float32
    compute = dtype if dtype in {torch.float32, torch.float64, torch.int32, torch.int64} else torch.float32
    zeros = ctx.op("ConstantOfShape", shape, value=ctx.tensor_attr(0, compute))
    return ctx.cast(ctx.op("EyeLike", zeros), dtype)


CONVERTERS: dict[str, Converter] = {
    "aten.full.default": convert_full,
    "aten.zeros.default": convert_zeros,
    "aten.ones.default": convert_ones,
    "aten.empty.memory_format": convert_zeros,
    "aten.empty_permuted.default": convert_zeros,
    "aten.empty_strided.default": convert_zeros,
    "aten.new_full.default": convert_new_full,
    "aten.new_zeros.default": convert_new_zeros,
    "aten.new_ones.default": convert_new_ones,
    "aten.new_empty.default": convert_new_zeros,
    "aten.new_empty_strided.default": convert_new_empty_strided,
    "aten.zeros_like.default": convert_zeros_like,
    "aten.ones_like.default": convert_ones_like,
    "aten.full_like.default": convert_full_like,
    "aten.empty_like.default": convert_zeros_like,
    "aten.scalar_tensor.default": convert_scalar_tensor,
    "aten.fill.Scalar": convert_fill,
    "aten.fill.Tensor": convert_fill,
    "aten.zero.default": convert_zero,
    "aten.arange.default": convert_arange,
    "aten.arange.start": convert_arange_start,
    "aten.arange.start_step": convert_arange_start_step,
    "aten.linspace.default": convert_linspace,
    "aten.linspace.Tensor_Tensor": convert_linspace,
    "aten.linspace.Tensor_Scalar": convert_linspace,
    "aten.linspace.Scalar_Tensor": convert_linspace,
    "aten.logspace.default": convert_logspace,
    "aten.logspace.Tensor_Tensor": convert_logspace,
    "aten.logspace.Tensor_Scalar": convert_logspace,
    "aten.logspace.Scalar_Tensor": convert_logspace,
    "aten.eye.default": convert_eye,
    "aten.eye.m": convert_eye,
}
