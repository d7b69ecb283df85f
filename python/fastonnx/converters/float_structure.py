"""The structure of floating-point numbers: frexp (mantissa and exponent) and nextafter, exact (powers of
two computed in float64, ``lib.float_math``)."""

from __future__ import annotations

import math

import torch

from fastonnx.context import ConversionContext, Converter, Value
from fastonnx.converters.lib.float_math import (
    FloatMath,
    f32,
    f64,
)

# ---- floating-point structure: frexp, nextafter --------------------------------------------------


def _exponent(m: FloatMath, ax: str) -> str:
    """floor(log2(ax)) for finite ax > 0, exactly: the logarithm's estimate corrected by comparing with
    powers of two (exact in float64)."""
    e = m.floor(m.div(m.log(ax), math.log(2.0)))
    power = m.pow(2.0, e)
    e = m.where(m.gt(power, ax), m.sub(e, 1.0), e)
    return m.where(m.le(m.mul(m.pow(2.0, e), 2.0), ax), m.add(e, 1.0), e)


def convert_frexp(ctx: ConversionContext, x: Value) -> list[str]:
    """x = mantissa * 2^exponent with |mantissa| in [0.5, 1); (x, 0) for 0, infinities and NaN."""
    dtype = x.dtype
    if not dtype.is_floating_point:
        raise ctx.error(f"frexp is only defined for floating point tensors, got {dtype}")
    m = FloatMath(ctx)
    v = ctx.cast(x, f64)
    ax = m.abs(v)
    special = m.or_(m.or_(m.eq(v, 0.0), m.isinf(v)), m.isnan(v))
    e = m.add(_exponent(m, m.where(special, 1.0, ax)), 1.0)
    e = m.where(special, 0.0, e)
    mantissa = m.div(v, m.pow(2.0, e))
    return [ctx.cast(mantissa, dtype), ctx.cast(e, torch.int32)]


def convert_nextafter(ctx: ConversionContext, x: Value, y: Value) -> str:
    """The next representable value after x toward y, from the spacing of x's binade (computed exactly
    in float64: a power of two), halved when stepping down from a power of two toward zero."""
    dtype = ctx.out_dtype
    if dtype not in (f32, torch.float16, torch.bfloat16, f64):
        raise ctx.error(f"nextafter is only converted for floating point tensors, got {dtype}")
    info = torch.finfo(dtype)
    mantissa_bits = round(-math.log2(info.eps))
    smallest = info.tiny * info.eps  # the smallest subnormal
    m = FloatMath(ctx)
    xv, yv = (ctx.cast(ctx.operand(v, dtype), f64) for v in (x, y))
    ax = m.abs(xv)
    finite_nonzero = m.and_(m.gt(ax, 0.0), m.not_(m.isinf(xv)))
    e = m.max(_exponent(m, m.where(finite_nonzero, ax, 1.0)), math.log2(info.tiny))
    spacing = m.pow(2.0, m.sub(e, float(mantissa_bits)))
    away = m.eq(m.lt(xv, yv), m.gt(xv, 0.0))  # moving away from zero
    at_power = m.and_(m.eq(ax, m.pow(2.0, e)), m.gt(ax, info.tiny))
    down = m.where(at_power, m.mul(spacing, 0.5), spacing)
    step = m.where(away, spacing, down)
    result = m.where(m.lt(xv, yv), m.add(xv, step), m.sub(xv, step))
    result = m.where(m.isinf(xv), m.where(m.gt(xv, 0.0), info.max, -info.max), result)
    result = m.where(m.eq(xv, 0.0), m.where(m.lt(xv, yv), smallest, -smallest), result)
    result = m.where(m.eq(xv, yv), yv, result)
    result = m.where(m.or_(m.isnan(xv), m.isnan(yv)), math.nan, result)
    return ctx.cast(result, dtype)


CONVERTERS: dict[str, Converter] = {
    "aten.frexp.Tensor": convert_frexp,
    "aten.nextafter.default": convert_nextafter,
}
