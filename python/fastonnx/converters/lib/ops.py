"""Common ONNX forms shared by families: opset-dependent Reduce / Squeeze / Unsqueeze / Split, torch's
type promotion, ``where`` in a dtype with a kernel, and exact math pieces (log1p, signbit, atan2,
hypot, the erfc fit)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from fastonnx.context import ConversionContext, Operand, Value
from fastonnx.converters.lib.kernels import compute_dtype, f64


def normalize_axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def reduce(
    ctx: ConversionContext,
    op_type: str,
    x: Operand,
    axes: Sequence[int] | None,
    keepdims: bool,
) -> str:
    """ReduceX over ``axes`` (None = all). Axes are an input for ReduceSum (opset 13+) and, from opset
    18, for every Reduce op; an attribute before that."""
    keep = 1 if keepdims else 0
    if axes is None or len(axes) == 0:
        return ctx.op(op_type, x, keepdims=keep)
    if op_type == "ReduceSum" or ctx.opset >= 18:
        return ctx.op(op_type, x, ctx.i64(list(axes)), keepdims=keep)
    return ctx.op(op_type, x, keepdims=keep, axes=list(axes))


def unsqueeze(ctx: ConversionContext, x: Operand, axes: Sequence[int]) -> str:
    return ctx.op("Unsqueeze", x, ctx.i64(list(axes)))


def squeeze(ctx: ConversionContext, x: Operand, axes: Sequence[int] | None = None) -> str:
    if axes is None:
        return ctx.op("Squeeze", x)
    return ctx.op("Squeeze", x, ctx.i64(list(axes)))


def split(ctx: ConversionContext, x: Operand, sizes: Sequence[int], axis: int) -> list[str]:
    """Split into pieces of the given static sizes along ``axis``."""
    return ctx.op("Split", x, ctx.i64(list(sizes)), axis=axis, outputs=len(sizes))


def _category(dtype: torch.dtype) -> int:
    """torch's promotion categories: bool < integer < floating < complex."""
    if dtype == torch.bool:
        return 0
    if dtype.is_complex:
        return 3
    if dtype.is_floating_point:
        return 2
    return 1


def _scalar_dtype(x: bool | int | float | complex) -> torch.dtype:
    if isinstance(x, bool):
        return torch.bool
    if isinstance(x, int):
        return torch.int64
    if isinstance(x, float):
        return torch.get_default_dtype()
    return torch.complex64 if torch.get_default_dtype() == torch.float32 else torch.complex128


def promote(ctx: ConversionContext, *args: Any) -> torch.dtype:
    """The dtype ``torch.result_type`` gives for tensors (Values / names) and Python scalars.

    Tensors with dims decide first; 0-d tensors (symbolic scalars included), then Python scalars, only
    win when their category (bool < int < float < complex) is higher: an int tensor with a float
    scalar gives the default float dtype, a float16 tensor with a float scalar stays float16.
    ``None`` arguments are ignored.
    """
    groups: list[torch.dtype | None] = [None, None, None]  # dims, 0-d, scalars
    for a in args:
        if a is None:
            continue
        if isinstance(a, (Value, str)):
            dt = ctx.dtype(a)
            if dt is None:
                raise ctx.error(f"the dtype of {a!r} is not known")
            slot = 0 if ctx.rank(a) != 0 else 1
        elif isinstance(a, (bool, int, float, complex)):
            dt, slot = _scalar_dtype(a), 2
        else:
            raise ctx.error(f"cannot promote {type(a).__name__} {a!r} with tensors")
        prev = groups[slot]
        groups[slot] = dt if prev is None else torch.promote_types(prev, dt)
    result: torch.dtype | None = None
    for dt in groups:
        if dt is not None and (result is None or _category(dt) > _category(result)):
            result = dt
    if result is None:
        raise ctx.error("no operand to promote")
    return result


# Numerical Recipes' fit of erfc: erfc(z) = t exp(-z^2 + P(t)), t = 1 / (1 + z/2), z >= 0, relative
# error < 1.2e-7 everywhere; P's coefficients from t^0 up
ERFC_FIT = (
    -1.26551223,
    1.00002368,
    0.37409196,
    0.09678418,
    -0.18628806,
    0.27886807,
    -1.13520398,
    1.48851587,
    -0.82215223,
    0.17087277,
)


def log1p(ctx: ConversionContext, x: str, dt: torch.dtype) -> str:
    """Kahan's accurate log1p: log(u) * x / (u - 1) with u = 1 + x; log(1 + x) loses small x."""
    one = ctx.const(1.0, dt)
    u = ctx.op("Add", x, one)
    general = ctx.op("Div", ctx.op("Mul", ctx.op("Log", u), x), ctx.op("Sub", u, one))
    result = ctx.op("Where", ctx.op("Equal", u, ctx.const(math.inf, dt)), u, general)
    return ctx.op("Where", ctx.op("Equal", u, one), x, result)


def signbit(ctx: ConversionContext, x: str, dt: torch.dtype) -> str:
    """x < 0, or -0.0 (1 / -0.0 is -inf). The sign of a NaN is not visible without a bit cast."""
    zero = ctx.const(0.0, dt)
    negative_zero = ctx.op("Less", ctx.op("Reciprocal", x), zero)
    return ctx.op("Or", ctx.op("Less", x, zero), ctx.op("And", ctx.op("Equal", x, zero), negative_zero))


def atan2(ctx: ConversionContext, y: str, x: str, dt: torch.dtype) -> str:
    """atan(y / x) moved to the right quadrant by +-pi when x is negative (or -0.0)."""
    base = ctx.op("Atan", ctx.op("Div", y, x))
    pi = ctx.op("Where", signbit(ctx, y, dt), ctx.const(-math.pi, dt), ctx.const(math.pi, dt))
    shifted = ctx.op("Add", base, pi)
    result = ctx.op("Where", signbit(ctx, x, dt), shifted, base)
    # atan2(+-0, +-0) is +-0 or +-pi; y / x is NaN there
    zero = ctx.const(0.0, dt)
    both_zero = ctx.op("And", ctx.op("Equal", y, zero), ctx.op("Equal", x, zero))
    at_zero = ctx.op("Where", signbit(ctx, x, dt), pi, ctx.op("Mul", y, ctx.const(1.0, dt)))
    return ctx.op("Where", both_zero, at_zero, result)


def hypot(ctx: ConversionContext, a: str, b: str, dt: torch.dtype) -> str:
    """sqrt(a² + b²) in float64 (no overflow of the squares for float32 inputs); an infinite operand
    gives inf even when the other is NaN, as C's hypot."""
    wide = f64
    a64, b64 = ctx.cast(a, wide), ctx.cast(b, wide)
    root = ctx.op("Sqrt", ctx.op("Add", ctx.op("Mul", a64, a64), ctx.op("Mul", b64, b64)))
    infinite = ctx.op("Or", ctx.op("IsInf", a64), ctx.op("IsInf", b64))
    return ctx.cast(ctx.op("Where", infinite, ctx.const(math.inf, wide), root), dt)


def where(ctx: ConversionContext, cond: Any, a: Any, b: Any, dtype: torch.dtype) -> str:
    """Where with both branches as ``dtype`` (bool / int16 / uint64 run in a dtype with a kernel)."""
    cd = compute_dtype("Where", dtype)
    lhs = ctx.cast(ctx.operand(a, dtype), cd)
    rhs = ctx.cast(ctx.operand(b, dtype), cd)
    return ctx.cast(ctx.op("Where", ctx.cast(cond, torch.bool), lhs, rhs), dtype)
