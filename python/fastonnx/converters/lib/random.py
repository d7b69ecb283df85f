"""Uniform and normal draws and dropout masks at every opset (see random_sampling's docstring for why
opset 22+ builds them from training-mode Dropout masks): shared by random ops, activations (rrelu) and
attention (dropout)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from fastonnx import dtypes
from fastonnx.context import ConversionContext, Value
from fastonnx.converters.lib.ops import reduce
from fastonnx.converters.lib.shape_graphs import shape_of

Shape = Value | str | Sequence[Any]


# random bits per uniform: torch's resolution for half types, the full significand otherwise
DIGITS = {torch.float16: 11, torch.bfloat16: 8, torch.float32: 24, torch.float64: 53}


# the opset whose random ops onnxruntime 1.31 has no kernels for (see the module docstring)
NO_RANDOM_KERNELS_OPSET = 22


def reject_generator(ctx: ConversionContext, generator: Any) -> None:
    if generator is not None:
        raise ctx.error(
            "an explicit torch.Generator cannot be exported: ONNX random ops draw from the runtime's own "
            "generator (pass generator=None)"
        )


def float_dtype(ctx: ConversionContext, dtype: torch.dtype) -> torch.dtype:
    """The dtype a draw is computed in: float64 for float64, float32 otherwise (onnxruntime has no
    half-precision kernels for the random ops)."""
    if dtype.is_complex:
        raise ctx.error(f"random draws of complex dtype {dtype} are not supported")
    return torch.float64 if dtype == torch.float64 else torch.float32


def static_dims(shape: Shape) -> list[int] | None:
    if isinstance(shape, Value):
        static = shape.static_shape()
        return None if static is None else list(static)
    if isinstance(shape, str):
        return None
    dims = list(shape)
    return [int(d) for d in dims] if all(isinstance(d, int) for d in dims) else None


def empty_of(ctx: ConversionContext, shape: Shape, dtype: torch.dtype) -> str | None:
    """A tensor of ``shape`` when it statically has no element (nothing to draw), else None.
    onnxruntime's Dropout / MatMul mishandle empty tensors; nothing random is needed for them."""
    static = static_dims(shape)
    if static is None or 0 not in static:
        return None
    return ctx.op("ConstantOfShape", ctx.i64(static), value=ctx.tensor_attr(0, dtype))


def shape_value(ctx: ConversionContext, shape: Shape) -> str:
    """``shape`` as a 1-D int64 value: a Value's runtime shape, a shape value as it is, or dims."""
    static = static_dims(shape)
    if static is not None:
        return ctx.i64(static)
    if isinstance(shape, Value):
        return ctx.op("Shape", shape)
    if isinstance(shape, str):
        return shape
    runtime = shape_of(ctx, list(shape), (), unknown_ok=0)
    if runtime is None:
        raise ctx.error(f"cannot build the runtime size {list(shape)} of the random draw")
    return runtime


def onnx_draw(ctx: ConversionContext, kind: str, shape: Shape, work: torch.dtype) -> str:
    """RandomUniform ([0, 1)) or RandomNormal (0, 1) of ``work`` dtype (below opset 22)."""
    onnx_dtype = dtypes.to_onnx_dtype(work)
    static = static_dims(shape)
    if static is not None:
        return ctx.op(kind, dtype=onnx_dtype, shape=static)
    like = shape if isinstance(shape, Value) else ctx.op("ConstantOfShape", shape_value(ctx, shape))
    return ctx.op(f"{kind}Like", like, dtype=onnx_dtype)


def keep_mask(ctx: ConversionContext, shape: Shape, p: float) -> str:
    """A bool mask of ``shape``, True with probability ``p`` (0 < p < 1): the mask of
    Dropout(ratio = 1 - p) in training mode.

    onnxruntime 1.31's Dropout decides the first element of its mask deterministically (always dropped
    at ratio 0.5, always kept at 0.2 and 0.9): the mask is drawn flat with one extra leading element,
    which is sliced off."""
    empty = empty_of(ctx, shape, torch.bool)
    if empty is not None:
        return empty
    dims = shape_value(ctx, shape)
    static = static_dims(shape)
    if static is not None:
        count = ctx.i64([1 + math.prod(static)])
    else:
        count = ctx.op("Add", reduce(ctx, "ReduceProd", dims, [0], keepdims=True), ctx.i64([1]))
    ones = ctx.op("ConstantOfShape", count, value=ctx.tensor_attr(1.0, torch.float32))
    ratio = ctx.const(1.0 - p, torch.float32)
    _, mask = ctx.op("Dropout", ones, ratio, ctx.const(True, torch.bool), outputs=2)
    mask = ctx.op("Slice", mask, ctx.i64([1]), ctx.i64([2**62]), ctx.i64([0]))
    return ctx.op("Reshape", mask, dims)


def bits_uniform(ctx: ConversionContext, shape: Shape, digits: int, work: torch.dtype) -> str:
    """U = sum_k b_k 2^-k over ``digits`` fair bits from Dropout masks: exactly uniform on the multiples
    of 2^-digits in [0, 1)."""
    static = static_dims(shape)
    if static is not None:
        bits = keep_mask(ctx, [*static, digits], 0.5)
    else:
        bits = keep_mask(ctx, ctx.op("Concat", shape_value(ctx, shape), ctx.i64([digits]), axis=0), 0.5)
    weights = ctx.const([2.0 ** -(k + 1) for k in range(digits)], work)
    # (..., digits) @ (digits,): every partial sum is exact, so the order of the additions is free
    return ctx.op("MatMul", ctx.cast(bits, work), weights)


def unit_uniform(ctx: ConversionContext, shape: Shape, dtype: torch.dtype) -> str:
    """U in [0, 1) for a result of ``dtype``, in its compute dtype (float32 / float64), with the
    dtype's resolution (so that a cast back never rounds up to 1)."""
    work = float_dtype(ctx, dtype)
    digits = DIGITS.get(dtype, DIGITS[work])
    empty = empty_of(ctx, shape, work)
    if empty is not None:
        return empty
    if ctx.opset >= NO_RANDOM_KERNELS_OPSET:
        return bits_uniform(ctx, shape, digits, work)
    u = onnx_draw(ctx, "RandomUniform", shape, work)
    if digits < DIGITS[work]:
        scale = ctx.const(float(2**digits), work)
        return ctx.op("Div", ctx.op("Floor", ctx.op("Mul", u, scale)), scale)
    # std::uniform_real_distribution may return its upper bound (LWG 2524)
    return ctx.op("Min", u, ctx.const(1.0 - 2.0**-digits, work))


def attention_dropout(ctx: ConversionContext, probs: str, p: float, dtype: torch.dtype) -> str:
    """Dropout of attention weights (scaled_dot_product_attention with dropout_p > 0): each weight
    is kept with probability 1 - p and scaled by 1 / (1 - p), as torch's math kernel does."""
    if p == 1:
        return ctx.op("Mul", probs, ctx.const(0.0, dtype))
    keep = ctx.cast(keep_mask(ctx, ctx.op("Shape", probs), 1.0 - p), dtype)
    return ctx.op("Mul", probs, ctx.op("Mul", keep, ctx.const(1.0 / (1.0 - p), dtype)))


def rrelu_slopes(ctx: ConversionContext, x: Value, lower: float, upper: float, dtype: torch.dtype) -> str:
    """One slope per element, uniform in [lower, upper), in ``dtype`` (the compute dtype)."""
    u = unit_uniform(ctx, x if x.static_shape() is None else list(x.shape), dtype)
    return ctx.op("Add", ctx.op("Mul", u, ctx.const(upper - lower, dtype)), ctx.const(lower, dtype))
