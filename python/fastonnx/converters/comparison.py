"""Comparisons, logical ops and float predicates (isnan, isinf, signbit...): all give bool tensors.

The operands are compared in the dtype ``torch.result_type`` gives them (``helpers.promote``): an int
tensor against a float scalar compares as float, like torch. ONNX compares nothing of mixed types.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from fastonnx.context import ConversionContext, Converter, Value
from fastonnx.converters.lib.kernels import compute_dtype, opmath_dtype
from fastonnx.converters.lib.ops import promote, signbit

aten = torch.ops.aten


def _operands(ctx: ConversionContext, op_type: str, a: Any, b: Any) -> tuple[str, str]:
    dtype = promote(ctx, a, b)
    cd = compute_dtype(op_type, dtype)
    return ctx.cast(ctx.operand(a, dtype), cd), ctx.cast(ctx.operand(b, dtype), cd)


def _compare(op_type: str, negate: bool = False) -> Converter:
    def convert(ctx: ConversionContext, a: Any, b: Any) -> str:
        lhs, rhs = _operands(ctx, op_type, a, b)
        result = ctx.op(op_type, lhs, rhs)
        return ctx.op("Not", result) if negate else result

    convert.__name__ = f"convert_{'not_' if negate else ''}{op_type.lower()}"
    return convert


def _constant_like(ctx: ConversionContext, x: Value, value: bool) -> str:
    """A bool tensor of x's shape (the predicate is decided by the dtype alone)."""
    return ctx.op("ConstantOfShape", ctx.dims_of(x), value=ctx.tensor_attr(value, torch.bool))


def _float_input(ctx: ConversionContext, x: Value, op_type: str) -> str:
    return ctx.cast(x, compute_dtype(op_type, x.dtype))


def convert_isnan(ctx: ConversionContext, x: Value) -> str:
    if not x.dtype.is_floating_point:
        return _constant_like(ctx, x, False)
    return ctx.op("IsNaN", _float_input(ctx, x, "IsNaN"))


def _isinf(positive: bool, negative: bool) -> Converter:
    def convert(ctx: ConversionContext, x: Value) -> str:
        if not x.dtype.is_floating_point:
            return _constant_like(ctx, x, False)
        return ctx.op(
            "IsInf",
            _float_input(ctx, x, "IsInf"),
            detect_positive=int(positive),
            detect_negative=int(negative),
        )

    convert.__name__ = f"convert_isinf_{int(positive)}{int(negative)}"
    return convert


def convert_isfinite(ctx: ConversionContext, x: Value) -> str:
    if not x.dtype.is_floating_point:
        return _constant_like(ctx, x, True)
    v = _float_input(ctx, x, "IsInf")
    return ctx.op("Not", ctx.op("Or", ctx.op("IsNaN", v), ctx.op("IsInf", v)))


def convert_isreal(ctx: ConversionContext, x: Value) -> str:
    if x.dtype.is_complex:
        raise ctx.error("isreal on complex tensors is not converted (ONNX has no complex dtype)")
    return _constant_like(ctx, x, True)


def convert_signbit(ctx: ConversionContext, x: Value) -> str:
    if x.dtype == torch.bool or (not x.dtype.is_floating_point and not x.dtype.is_signed):
        return _constant_like(ctx, x, False)
    if not x.dtype.is_floating_point:
        return ctx.op(
            "Less", ctx.cast(x, compute_dtype("Less", x.dtype)), ctx.const(0, compute_dtype("Less", x.dtype))
        )
    dt = opmath_dtype(x.dtype)
    return signbit(ctx, ctx.cast(x, dt), dt)


def _logical(op_type: str) -> Converter:
    def convert(ctx: ConversionContext, a: Any, b: Any) -> str:
        return ctx.op(op_type, _truth(ctx, a), _truth(ctx, b))

    convert.__name__ = f"convert_logical_{op_type.lower()}"
    return convert


def _truth(ctx: ConversionContext, x: Any) -> str:
    """x != 0 as bool (Cast maps nonzero, NaN included, to True like torch)."""
    if isinstance(x, Value):
        return ctx.cast(x, torch.bool)
    return ctx.const(bool(x), torch.bool)


def convert_logical_not(ctx: ConversionContext, x: Value) -> str:
    return ctx.op("Not", _truth(ctx, x))


def convert_isclose(
    ctx: ConversionContext,
    a: Value,
    b: Value,
    rtol: float = 1e-5,
    atol: float = 1e-8,
    equal_nan: bool = False,
) -> str:
    """a == b, or |a - b| <= atol + rtol * |b| for finite values; NaNs equal when equal_nan."""
    dtype = promote(ctx, a, b)
    if not dtype.is_floating_point:
        raise ctx.error(f"isclose is converted for floating point tensors only, got {dtype}")
    dt = opmath_dtype(dtype)
    lhs, rhs = (ctx.cast(ctx.operand(v, dtype), dt) for v in (a, b))
    result = ctx.op("Equal", lhs, rhs)
    if equal_nan:
        result = ctx.op("Or", result, ctx.op("And", ctx.op("IsNaN", lhs), ctx.op("IsNaN", rhs)))
    if rtol == 0 and atol == 0:
        return result
    error = ctx.op("Abs", ctx.op("Sub", lhs, rhs))
    allowed = ctx.op("Add", ctx.const(atol, dt), ctx.op("Mul", ctx.const(rtol, dt), ctx.op("Abs", rhs)))
    # an infinite difference is never close (inf <= inf would say it is)
    close = ctx.op(
        "And", ctx.op("LessOrEqual", error, allowed), ctx.op("Less", error, ctx.const(math.inf, dt))
    )
    return ctx.op("Or", result, close)


CONVERTERS: dict[str, Converter] = {
    "aten.eq.Tensor": _compare("Equal", False),
    "aten.eq.Scalar": _compare("Equal", False),
    "aten.ne.Tensor": _compare("Equal", True),
    "aten.ne.Scalar": _compare("Equal", True),
    "aten.lt.Tensor": _compare("Less", False),
    "aten.lt.Scalar": _compare("Less", False),
    "aten.le.Tensor": _compare("LessOrEqual", False),
    "aten.le.Scalar": _compare("LessOrEqual", False),
    "aten.gt.Tensor": _compare("Greater", False),
    "aten.gt.Scalar": _compare("Greater", False),
    "aten.ge.Tensor": _compare("GreaterOrEqual", False),
    "aten.ge.Scalar": _compare("GreaterOrEqual", False),
    # torch's long names: a decomposition turns them into the short ones, but a body that
    # wrap_with_set_grad_enabled captures (code under torch.no_grad()) keeps them as called
    "aten.not_equal.Tensor": _compare("Equal", True),
    "aten.not_equal.Scalar": _compare("Equal", True),
    "aten.less.Tensor": _compare("Less", False),
    "aten.less.Scalar": _compare("Less", False),
    "aten.less_equal.Tensor": _compare("LessOrEqual", False),
    "aten.less_equal.Scalar": _compare("LessOrEqual", False),
    "aten.greater.Tensor": _compare("Greater", False),
    "aten.greater.Scalar": _compare("Greater", False),
    "aten.greater_equal.Tensor": _compare("GreaterOrEqual", False),
    "aten.greater_equal.Scalar": _compare("GreaterOrEqual", False),
    "aten.isnan.default": convert_isnan,
    "aten.isinf.default": _isinf(True, True),
    "aten.isposinf.default": _isinf(True, False),
    "aten.isneginf.default": _isinf(False, True),
    "aten.isfinite.default": convert_isfinite,
    "aten.isreal.default": convert_isreal,
    "aten.signbit.default": convert_signbit,
    "aten.logical_and.default": _logical("And"),
    "aten.logical_or.default": _logical("Or"),
    "aten.logical_xor.default": _logical("Xor"),
    "aten.logical_not.default": convert_logical_not,
    "aten.isclose.default": convert_isclose,
}
