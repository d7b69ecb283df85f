"""Elementwise arithmetic and math with explicit type promotion (ONNX casts nothing implicitly).

Results follow torch's dtype (``ctx.out_dtype``). When onnxruntime's CPU provider has no kernel for
that dtype, the op runs in a wider dtype that holds every value exactly and the result is cast back
(``compute_dtype``). Composite formulas on float16 / bfloat16 run in float32, as torch's CPU kernels
do ("opmath"); the simple arithmetic ops stay in half precision (one correctly rounded operation).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from fastonnx.context import ConversionContext, Converter, Value
from fastonnx.converters.lib.kernels import (
    HALF,
    NATIVE,
    compute_dtype,
    emit,
    f32,
    i8,
    i16,
    i32,
    i64,
    opmath_dtype,
    u8,
    u16,
    u32,
    u64,
)
from fastonnx.converters.lib.ops import ERFC_FIT, atan2, hypot, log1p, signbit, where

aten = torch.ops.aten


def _floating_out(ctx: ConversionContext, op: str) -> torch.dtype:
    dtype = ctx.out_dtype
    if not dtype.is_floating_point:
        raise ctx.error(f"{op} is only converted for floating point results, got {dtype}")
    return dtype


# ---- arithmetic -------------------------------------------------------------------------------


def _scaled(ctx: ConversionContext, b: Any, alpha: Any, dtype: torch.dtype, scalar_dtype: torch.dtype) -> Any:
    """``alpha * b`` (``b`` itself when alpha is 1); alpha is first rounded to ``scalar_dtype``."""
    if alpha is None or (not isinstance(alpha, Value) and alpha == 1):
        return b
    return emit(ctx, "Mul", [b, ctx.cast(ctx.operand(alpha, scalar_dtype), dtype)], dtype)


def _add_sub(op_type: str, reverse: bool = False) -> Converter:
    def convert(ctx: ConversionContext, a: Any, b: Any, *, alpha: Any = None) -> str:
        dtype = ctx.out_dtype
        if reverse:
            a, b = b, a
        scaled = alpha is not None and (isinstance(alpha, Value) or alpha != 1)
        # half precision with alpha: torch rounds alpha to the tensor's dtype, then a + alpha * b
        # once (float32 opmath); so do we
        cd = opmath_dtype(dtype) if scaled else dtype
        lhs = ctx.cast(ctx.operand(a, dtype), cd)
        rhs = _scaled(ctx, ctx.cast(ctx.operand(b, dtype), cd), alpha, cd, dtype)
        return ctx.cast(emit(ctx, op_type, [lhs, rhs], cd), dtype)

    convert.__name__ = f"convert_{'r' if reverse else ''}{op_type.lower()}"
    return convert


convert_add = _add_sub("Add")
convert_sub = _add_sub("Sub")
convert_rsub = _add_sub("Sub", reverse=True)


def _inexact_half_scalar(x: Any, dtype: torch.dtype) -> bool:
    """A Python float that the half type ``dtype`` cannot hold exactly."""
    if dtype not in HALF or not isinstance(x, float):
        return False
    value = torch.tensor(x, dtype=f32)
    return bool(value.to(dtype).to(f32) != value)


def _scalar_opmath(ctx: ConversionContext, op_type: str, a: Any, b: Any, dtype: torch.dtype) -> str:
    """Half tensor (op) Python float: torch's kernels keep the scalar in float32 and round once."""
    return ctx.cast(ctx.op(op_type, ctx.cast(ctx.operand(a, dtype), f32), ctx.const(b, f32)), dtype)


def convert_mul(ctx: ConversionContext, a: Any, b: Any) -> str:
    dtype = ctx.out_dtype
    if _inexact_half_scalar(b, dtype):
        return _scalar_opmath(ctx, "Mul", a, b, dtype)
    if _inexact_half_scalar(a, dtype):
        return _scalar_opmath(ctx, "Mul", b, a, dtype)
    return emit(ctx, "Mul", [a, b], dtype)


def _trunc(ctx: ConversionContext, x: str, dtype: torch.dtype) -> str:
    """Round toward zero; ONNX has no Trunc."""
    neg = ctx.op("Less", x, ctx.const(0.0, dtype))
    return ctx.op("Where", neg, ctx.op("Ceil", x), ctx.op("Floor", x))


def _float_floor_div(ctx: ConversionContext, a: str, b: str, dtype: torch.dtype, round_steps: bool) -> str:
    """torch's floor division of floats (c10 div_floor_floating) on ``opmath_dtype`` operands: exact
    where floor(a / b) is not.

    With ``round_steps`` (half types divided by a tensor) every step is rounded back to the half type
    (Cast there and back), as torch's half arithmetic does; onnxruntime's own float16 graphs may keep
    intermediate results in float32 and differ.
    """
    dt = opmath_dtype(dtype)

    def rnd(x: str) -> str:
        return ctx.cast(ctx.cast(x, dtype), dt) if round_steps and dt != dtype else x

    zero, one = ctx.const(0.0, dt), ctx.const(1.0, dt)
    mod = ctx.op("Mod", a, b, fmod=1)  # exact in any precision
    div = rnd(ctx.op("Div", rnd(ctx.op("Sub", a, mod)), b))
    signs_differ = ctx.op("Xor", ctx.op("Less", b, zero), ctx.op("Less", mod, zero))
    adjust = ctx.op("And", ctx.op("Not", ctx.op("Equal", mod, zero)), signs_differ)
    div = ctx.op("Where", adjust, rnd(ctx.op("Sub", div, one)), div)
    floor = ctx.op("Floor", div)
    round_up = ctx.op("Greater", rnd(ctx.op("Sub", div, floor)), ctx.const(0.5, dt))
    floor = ctx.op("Where", round_up, rnd(ctx.op("Add", floor, one)), floor)
    quotient = rnd(ctx.op("Div", a, b))
    signed_zero = ctx.op("Mul", zero, quotient)  # copysign(0, a / b); a / b is finite here
    floor = ctx.op("Where", ctx.op("Equal", div, zero), signed_zero, floor)
    return ctx.cast(ctx.op("Where", ctx.op("Equal", b, zero), quotient, floor), dtype)


def _int_floor_div(ctx: ConversionContext, a: Any, b: Any, dtype: torch.dtype) -> str:
    """a - python_mod(a, b) is an exact multiple of b, so the truncating Div then floors."""
    cd = compute_dtype("Mod", dtype)
    lhs, rhs = ctx.cast(ctx.operand(a, dtype), cd), ctx.cast(ctx.operand(b, dtype), cd)
    exact = ctx.op("Sub", lhs, ctx.op("Mod", lhs, rhs, fmod=0))
    return ctx.cast(ctx.op("Div", exact, rhs), dtype)


def _div_mode(ctx: ConversionContext, a: Any, b: Any, mode: str | None) -> str:
    dtype = ctx.out_dtype
    if mode is None:
        if _inexact_half_scalar(b, dtype):
            return _scalar_opmath(ctx, "Div", a, b, dtype)
        return emit(ctx, "Div", [a, b], dtype)
    if mode not in ("trunc", "floor"):
        raise ctx.error(f"div: unknown rounding_mode {mode!r}")
    if dtype == torch.bool:
        raise ctx.error("div with a rounding_mode on bool tensors is not converted")
    if not dtype.is_floating_point:
        if mode == "trunc":  # ONNX integer Div truncates, like C
            return emit(ctx, "Div", [a, b], dtype)
        return _int_floor_div(ctx, a, b, dtype)
    dt = opmath_dtype(dtype)
    lhs = ctx.cast(ctx.operand(a, dtype), dt)
    # torch's kernels take a scalar divisor (Python number or 0-d tensor) in float32 opmath as it
    # is, and then compute in float32; a tensor divisor makes half types compute in half precision
    scalar_divisor = not isinstance(b, Value) or b.rank == 0
    rhs = ctx.operand(b, dt) if scalar_divisor else ctx.cast(ctx.operand(b, dtype), dt)
    round_steps = dtype in HALF and not scalar_divisor
    if mode == "trunc":
        quotient = ctx.op("Div", lhs, rhs)
        if round_steps:
            quotient = ctx.cast(ctx.cast(quotient, dtype), dt)
        return ctx.cast(_trunc(ctx, quotient, dt), dtype)
    return _float_floor_div(ctx, lhs, rhs, dtype, round_steps)


def convert_div(ctx: ConversionContext, a: Any, b: Any, *, rounding_mode: str | None = None) -> str:
    return _div_mode(ctx, a, b, rounding_mode)


def convert_floor_divide(ctx: ConversionContext, a: Any, b: Any) -> str:
    return _div_mode(ctx, a, b, "floor")


def convert_remainder(ctx: ConversionContext, a: Any, b: Any) -> str:
    """Python's modulo: the result takes the divisor's sign."""
    dtype = ctx.out_dtype
    if not dtype.is_floating_point:
        return emit(ctx, "Mod", [a, b], dtype, fmod=0)
    dt = opmath_dtype(dtype)
    lhs, rhs = ctx.cast(ctx.operand(a, dtype), dt), ctx.cast(ctx.operand(b, dtype), dt)
    zero = ctx.const(0.0, dt)
    mod = ctx.op("Mod", lhs, rhs, fmod=1)
    signs_differ = ctx.op("Xor", ctx.op("Less", rhs, zero), ctx.op("Less", mod, zero))
    adjust = ctx.op("And", ctx.op("Not", ctx.op("Equal", mod, zero)), signs_differ)
    return ctx.cast(ctx.op("Where", adjust, ctx.op("Add", mod, rhs), mod), dtype)


def convert_fmod(ctx: ConversionContext, a: Any, b: Any) -> str:
    """C's fmod: the result takes the dividend's sign."""
    return emit(ctx, "Mod", [a, b], ctx.out_dtype, fmod=1)


def _pow_special(ctx: ConversionContext, x: str, exponent: float, dtype: torch.dtype) -> str | None:
    """torch evaluates these exponents without pow (exact squares, sqrt...); None for the others."""
    if exponent == 1:
        return x
    if exponent == 2:
        return emit(ctx, "Mul", [x, x], dtype)
    if exponent == 3:
        return emit(ctx, "Mul", [emit(ctx, "Mul", [x, x], dtype), x], dtype)
    if not dtype.is_floating_point:
        return None
    if exponent == 0.5:
        return emit(ctx, "Sqrt", [x], dtype)
    if exponent == -1:
        return emit(ctx, "Reciprocal", [x], dtype)
    if exponent == -0.5:
        return emit(ctx, "Reciprocal", [emit(ctx, "Sqrt", [x], dtype)], dtype)
    if exponent == -2:
        return emit(ctx, "Reciprocal", [emit(ctx, "Mul", [x, x], dtype)], dtype)
    return None


_VALUE_BITS = {i8: 7, u8: 8, i16: 15, u16: 16, i32: 31, u32: 32, i64: 63, u64: 64}


def _int_power_scalar(ctx: ConversionContext, base: str, exponent: int, dtype: torch.dtype) -> str:
    """Square-and-multiply unrolled at conversion time: exact, and wrapping like torch's integers
    (onnxruntime's integer Pow goes through double and is off above 2**53)."""
    result: str | None = None
    square = base
    while exponent:
        if exponent & 1:
            result = square if result is None else emit(ctx, "Mul", [result, square], dtype)
        exponent >>= 1
        if exponent:
            square = emit(ctx, "Mul", [square, square], dtype)
    return result if result is not None else emit(ctx, "Add", [emit(ctx, "Mul", [base, 0], dtype), 1], dtype)


def _int_power_tensor(ctx: ConversionContext, base: str, exponent: str, dtype: torch.dtype) -> str:
    """Square-and-multiply over every value bit of the exponent (one step per bit, unrolled).

    A negative exponent gives 1 for base 1, +-1 for base -1 and 0 otherwise, as torch."""
    cd = compute_dtype("Max", dtype)  # Mod, Mul, Add, Sub, Equal have kernels for it too
    b, e = ctx.cast(base, cd), ctx.cast(exponent, cd)
    one, two = ctx.const(1, cd), ctx.const(2, cd)
    e_pos = ctx.op("Max", e, ctx.const(0, cd)) if dtype.is_signed else e
    acc = ctx.op("Add", ctx.op("Mul", b, ctx.const(0, cd)), one)  # ones of the broadcast shape
    acc = ctx.op("Mul", acc, ctx.op("Add", ctx.op("Mul", e, ctx.const(0, cd)), one))
    for step in range(_VALUE_BITS[dtype]):
        bit = ctx.op("Mod", e_pos, two, fmod=0)
        # bit ? b : 1, as 1 + bit * (b - 1) (no Where kernel for every integer type)
        acc = ctx.op("Mul", acc, ctx.op("Add", one, ctx.op("Mul", bit, ctx.op("Sub", b, one))))
        if step + 1 < _VALUE_BITS[dtype]:
            b = ctx.op("Mul", b, b)
            e_pos = ctx.op("Div", e_pos, two)
    if dtype.is_signed:
        b0 = ctx.cast(base, cd)
        odd = ctx.op("Mod", e, two, fmod=0)
        minus_one = ctx.const(-1, cd)
        # base -1: 1 - 2 * odd; base 1: 1; anything else: 0
        unit = ctx.op("Sub", one, ctx.op("Mul", two, odd))
        is_minus_one = ctx.cast(ctx.op("Equal", b0, minus_one), cd)
        is_one = ctx.cast(ctx.op("Equal", b0, one), cd)
        negative = ctx.op("Add", is_one, ctx.op("Mul", is_minus_one, unit))
        neg_exp = ctx.cast(ctx.op("Less", e, ctx.const(0, cd)), cd)
        keep = ctx.op("Sub", one, neg_exp)
        acc = ctx.op("Add", ctx.op("Mul", acc, keep), ctx.op("Mul", negative, neg_exp))
    return ctx.cast(acc, dtype)


def convert_pow(ctx: ConversionContext, base: Any, exponent: Any) -> str:
    dtype = ctx.out_dtype
    if dtype == torch.bool:
        raise ctx.error("pow on bool tensors is not converted")
    scalar_exponent = isinstance(exponent, (int, float)) and not isinstance(exponent, bool)
    if scalar_exponent and isinstance(base, Value):
        if not dtype.is_floating_point and exponent < 0:
            raise ctx.error(f"pow: integer tensor to the negative power {exponent}")
        special = _pow_special(ctx, ctx.cast(base, dtype), exponent, dtype)
        if special is not None:
            return special
        if not dtype.is_floating_point:
            return _int_power_scalar(ctx, ctx.cast(base, dtype), int(exponent), dtype)
    if dtype.is_floating_point:
        return emit(ctx, "Pow", [base, exponent], dtype)
    return _int_power_tensor(ctx, ctx.operand(base, dtype), ctx.operand(exponent, dtype), dtype)


def convert_float_power(ctx: ConversionContext, base: Any, exponent: Any) -> str:
    """float_power computes in float64 whatever the inputs."""
    return emit(ctx, "Pow", [base, exponent], ctx.out_dtype)


def convert_neg(ctx: ConversionContext, x: Value) -> str:
    dtype = ctx.out_dtype
    if dtype == torch.bool:
        raise ctx.error("neg on bool tensors is not defined in torch")
    if dtype in NATIVE["Neg"]:
        return ctx.op("Neg", ctx.cast(x, dtype))
    return emit(ctx, "Sub", [0, x], dtype)  # unsigned: 0 - x wraps like torch


def convert_abs(ctx: ConversionContext, x: Value) -> str:
    dtype = ctx.out_dtype
    if dtype == torch.bool:
        return ctx.cast(x, dtype)
    return emit(ctx, "Abs", [x], dtype)


def convert_sign(ctx: ConversionContext, x: Value) -> str:
    dtype = ctx.out_dtype
    if dtype == torch.bool:
        return ctx.cast(x, dtype)
    result = emit(ctx, "Sign", [x], dtype)
    if not dtype.is_floating_point:
        return result
    # torch's sign of NaN is 0 (it computes (0 < x) - (x < 0)); ONNX Sign keeps the NaN
    nan_dt = compute_dtype("IsNaN", dtype)
    return where(ctx, ctx.op("IsNaN", ctx.cast(x, nan_dt)), 0.0, result, dtype)


def convert_square(ctx: ConversionContext, x: Value) -> str:
    return emit(ctx, "Mul", [x, x], ctx.out_dtype)


def convert_identity(ctx: ConversionContext, x: Any, *args: Any, **kwargs: Any) -> str:
    """alias / clone / detach / positive...: the same value (memory_format has no meaning in ONNX)."""
    return ctx.cast(ctx.operand(x, ctx.out_dtype), ctx.out_dtype)


def convert_to(ctx: ConversionContext, x: Any, *args: Any, **kwargs: Any) -> str:
    """to.dtype / to.device / _to_copy...: only the dtype matters; device, layout, copy, non_blocking
    and memory_format have no meaning in an ONNX graph. ONNX Cast truncates floats toward zero when
    casting to integers and maps nonzero to True, like torch."""
    return ctx.cast(x, ctx.out_dtype)


def convert_copy(ctx: ConversionContext, dst: Value, src: Any, non_blocking: bool = False) -> str:
    """aten.copy(dst, src): src cast to dst's dtype and broadcast to dst's shape."""
    value = ctx.operand(src, ctx.out_dtype)
    src_shape = src.shape if isinstance(src, Value) else ()
    # compare dims as the graph writes them: comparing SymInts would add guards to torch's shape env
    if [ctx.dim(d) for d in src_shape] == [ctx.dim(d) for d in dst.shape]:
        return value
    return ctx.op("Expand", value, ctx.dims_of(dst))


# ---- unary math -------------------------------------------------------------------------------


def _unary(op_type: str) -> Converter:
    """A float op: integer inputs promote to the (float) output dtype first."""

    def convert(ctx: ConversionContext, x: Value) -> str:
        return emit(ctx, op_type, [x], _floating_out(ctx, op_type))

    convert.__name__ = f"convert_{op_type.lower()}"
    return convert


def _composite(build: Callable[[ConversionContext, str, torch.dtype], str]) -> Converter:
    """A float formula on one tensor, evaluated in ``opmath_dtype`` and cast back."""

    def convert(ctx: ConversionContext, x: Value) -> str:
        dtype = _floating_out(ctx, build.__name__)
        dt = opmath_dtype(dtype)
        return ctx.cast(build(ctx, ctx.cast(x, dt), dt), dtype)

    convert.__name__ = f"convert_{build.__name__.lstrip('_')}"
    return convert


def _rsqrt(ctx: ConversionContext, x: str, dt: torch.dtype) -> str:
    return ctx.op("Reciprocal", ctx.op("Sqrt", x))


def _exp2(ctx: ConversionContext, x: str, dt: torch.dtype) -> str:
    return ctx.op("Pow", ctx.const(2.0, dt), x)


def _expm1(ctx: ConversionContext, x: str, dt: torch.dtype) -> str:
    """Kahan's accurate expm1: (u - 1) * x / log(u) with u = exp(x); exp(x) - 1 loses small x."""
    one = ctx.const(1.0, dt)
    u = ctx.op("Exp", x)
    um1 = ctx.op("Sub", u, one)
    general = ctx.op("Div", ctx.op("Mul", um1, x), ctx.op("Log", u))
    result = ctx.op("Where", ctx.op("Equal", um1, ctx.const(-1.0, dt)), um1, general)
    result = ctx.op("Where", ctx.op("Equal", u, ctx.const(math.inf, dt)), u, result)
    return ctx.op("Where", ctx.op("Equal", u, one), x, result)


def _log1p(ctx: ConversionContext, x: str, dt: torch.dtype) -> str:
    return log1p(ctx, x, dt)


def _log2(ctx: ConversionContext, x: str, dt: torch.dtype) -> str:
    return ctx.op("Div", ctx.op("Log", x), ctx.const(math.log(2.0), dt))


def _log10(ctx: ConversionContext, x: str, dt: torch.dtype) -> str:
    return ctx.op("Div", ctx.op("Log", x), ctx.const(math.log(10.0), dt))


def _erfc(ctx: ConversionContext, x: str, dt: torch.dtype) -> str:
    z = ctx.op("Abs", x)
    t = ctx.op("Reciprocal", ctx.op("Add", ctx.const(1.0, dt), ctx.op("Mul", z, ctx.const(0.5, dt))))
    poly = ctx.const(ERFC_FIT[-1], dt)
    for c in reversed(ERFC_FIT[:-1]):
        poly = ctx.op("Add", ctx.const(c, dt), ctx.op("Mul", t, poly))
    tail = ctx.op("Mul", t, ctx.op("Exp", ctx.op("Sub", poly, ctx.op("Mul", z, z))))
    tail = ctx.op(
        "Where", ctx.op("Less", x, ctx.const(0.0, dt)), ctx.op("Sub", ctx.const(2.0, dt), tail), tail
    )
    near_zero = ctx.op("Less", z, ctx.const(0.5, dt))
    return ctx.op("Where", near_zero, ctx.op("Sub", ctx.const(1.0, dt), ctx.op("Erf", x)), tail)


def _ndtr(ctx: ConversionContext, x: str, dt: torch.dtype) -> str:
    """The standard normal CDF, 0.5 * erfc(-x / sqrt(2)), with the accurate erfc for the far tail."""
    scaled = ctx.op("Mul", x, ctx.const(-math.sqrt(0.5), dt))
    return ctx.op("Mul", ctx.const(0.5, dt), _erfc(ctx, scaled, dt))


def _entr(ctx: ConversionContext, x: str, dt: torch.dtype) -> str:
    """-x * log(x); 0 at 0, -inf for negative x, NaN stays NaN."""
    zero = ctx.const(0.0, dt)
    value = ctx.op("Neg", ctx.op("Mul", x, ctx.op("Log", x)))
    value = ctx.op("Where", ctx.op("Equal", x, zero), zero, value)
    return ctx.op("Where", ctx.op("Less", x, zero), ctx.const(-math.inf, dt), value)


def _tan(ctx: ConversionContext, x: str, dt: torch.dtype) -> str:
    return ctx.op("Tan", x)


def _sinc(ctx: ConversionContext, x: str, dt: torch.dtype) -> str:
    px = ctx.op("Mul", x, ctx.const(math.pi, dt))
    ratio = ctx.op("Div", ctx.op("Sin", px), px)
    return ctx.op("Where", ctx.op("Equal", x, ctx.const(0.0, dt)), ctx.const(1.0, dt), ratio)


def _frac(ctx: ConversionContext, x: str, dt: torch.dtype) -> str:
    return ctx.op("Sub", x, _trunc(ctx, x, dt))


def _trunc_float(ctx: ConversionContext, x: str, dt: torch.dtype) -> str:
    return _trunc(ctx, x, dt)


def _rounding(
    op_type: str, build: Callable[[ConversionContext, str, torch.dtype], str] | None = None
) -> Converter:
    """floor / ceil / round / trunc: the identity on integers."""

    def convert(ctx: ConversionContext, x: Value) -> str:
        dtype = ctx.out_dtype
        if not dtype.is_floating_point:
            return ctx.cast(x, dtype)
        if build is not None:
            dt = opmath_dtype(dtype)
            return ctx.cast(build(ctx, ctx.cast(x, dt), dt), dtype)
        return emit(ctx, op_type, [x], dtype)

    convert.__name__ = f"convert_{op_type.lower()}"
    return convert


def convert_round(ctx: ConversionContext, x: Value, *, decimals: int = 0) -> str:
    """Round half to even (as ONNX Round); decimals scale by 10**decimals like torch's kernel."""
    dtype = ctx.out_dtype
    if not dtype.is_floating_point:
        return ctx.cast(x, dtype)
    if decimals == 0:
        return emit(ctx, "Round", [x], dtype)
    dt = opmath_dtype(dtype)
    v = ctx.cast(x, dt)
    scale = ctx.const(10.0 ** abs(decimals), dt)
    if decimals > 0:
        result = ctx.op("Div", ctx.op("Round", ctx.op("Mul", v, scale)), scale)
    else:
        result = ctx.op("Mul", ctx.op("Round", ctx.op("Div", v, scale)), scale)
    return ctx.cast(result, dtype)


def _scale(factor: float) -> Converter:
    def convert(ctx: ConversionContext, x: Value) -> str:
        return emit(ctx, "Mul", [x, factor], _floating_out(ctx, "deg2rad/rad2deg"))

    return convert


def convert_logit(ctx: ConversionContext, x: Value, eps: float | None = None) -> str:
    dtype = _floating_out(ctx, "logit")
    dt = opmath_dtype(dtype)
    v = ctx.cast(x, dt)
    if eps is not None and eps >= 0:
        # torch tests the low bound first: with eps > 0.5 the bounds cross and Clip would differ
        lo, hi = ctx.const(eps, dt), ctx.const(1.0 - eps, dt)
        v = ctx.op("Where", ctx.op("Less", v, lo), lo, ctx.op("Where", ctx.op("Greater", v, hi), hi, v))
    odds = ctx.op("Div", v, ctx.op("Sub", ctx.const(1.0, dt), v))
    return ctx.cast(ctx.op("Log", odds), dtype)


def convert_nan_to_num(
    ctx: ConversionContext,
    x: Value,
    nan: float | None = None,
    posinf: float | None = None,
    neginf: float | None = None,
) -> str:
    dtype = ctx.out_dtype
    if not dtype.is_floating_point:
        return ctx.cast(x, dtype)
    info = torch.finfo(dtype)
    dt = compute_dtype("IsNaN", dtype)
    v = ctx.cast(x, dt)

    def c(value: float) -> str:
        return ctx.cast(ctx.const(value, dtype), dt)  # the replacement, rounded to x's dtype

    result = ctx.op("Where", ctx.op("IsNaN", v), c(0.0 if nan is None else nan), v)
    big = info.max if posinf is None else posinf
    result = ctx.op("Where", ctx.op("Equal", v, c(math.inf)), c(big), result)
    small = info.min if neginf is None else neginf
    result = ctx.op("Where", ctx.op("Equal", v, c(-math.inf)), c(small), result)
    return ctx.cast(result, dtype)


# ---- binary math ------------------------------------------------------------------------------


def _binary_composite(build: Callable[[ConversionContext, str, str, torch.dtype], str]) -> Converter:
    """A float formula on two operands (tensors or scalars) in ``opmath_dtype``, cast back."""

    def convert(ctx: ConversionContext, a: Any, b: Any) -> str:
        dtype = _floating_out(ctx, build.__name__)
        dt = opmath_dtype(dtype)
        lhs, rhs = ctx.cast(ctx.operand(a, dtype), dt), ctx.cast(ctx.operand(b, dtype), dt)
        return ctx.cast(build(ctx, lhs, rhs, dt), dtype)

    convert.__name__ = f"convert_{build.__name__.lstrip('_')}"
    return convert


def _copysign(ctx: ConversionContext, a: str, b: str, dt: torch.dtype) -> str:
    magnitude = ctx.op("Abs", a)
    return ctx.op("Where", signbit(ctx, b, dt), ctx.op("Neg", magnitude), magnitude)


def _xlogy(ctx: ConversionContext, x: str, y: str, dt: torch.dtype) -> str:
    zero = ctx.const(0.0, dt)
    product = ctx.op("Where", ctx.op("Equal", x, zero), zero, ctx.op("Mul", x, ctx.op("Log", y)))
    return ctx.op("Where", ctx.op("IsNaN", ctx.cast(y, compute_dtype("IsNaN", dt))), y, product)


def _xlog1py(ctx: ConversionContext, x: str, y: str, dt: torch.dtype) -> str:
    zero = ctx.const(0.0, dt)
    product = ctx.op("Where", ctx.op("Equal", x, zero), zero, ctx.op("Mul", x, log1p(ctx, y, dt)))
    return ctx.op("Where", ctx.op("IsNaN", y), y, product)


def _logaddexp(ctx: ConversionContext, a: str, b: str, dt: torch.dtype) -> str:
    """max + log1p(exp(-|a - b|)); equal infinities give themselves (their difference is NaN)."""
    top = ctx.op("Max", a, b)
    gap = ctx.op("Neg", ctx.op("Abs", ctx.op("Sub", a, b)))
    result = ctx.op("Add", top, log1p(ctx, ctx.op("Exp", gap), dt))
    same_inf = ctx.op("And", ctx.op("Equal", a, b), ctx.op("IsInf", a))
    return ctx.op("Where", same_inf, a, result)


def _logaddexp2(ctx: ConversionContext, a: str, b: str, dt: torch.dtype) -> str:
    top = ctx.op("Max", a, b)
    gap = ctx.op("Neg", ctx.op("Abs", ctx.op("Sub", a, b)))
    tail = ctx.op("Div", log1p(ctx, ctx.op("Pow", ctx.const(2.0, dt), gap), dt), ctx.const(math.log(2.0), dt))
    result = ctx.op("Add", top, tail)
    same_inf = ctx.op("And", ctx.op("Equal", a, b), ctx.op("IsInf", a))
    return ctx.op("Where", same_inf, a, result)


def _ldexp(ctx: ConversionContext, x: str, e: str, dt: torch.dtype) -> str:
    return ctx.op("Mul", x, ctx.op("Pow", ctx.const(2.0, dt), e))


def _fmax_fmin(op_type: str) -> Converter:
    """fmax / fmin: a NaN operand yields the other one (Max / Min propagate NaN)."""

    def convert(ctx: ConversionContext, a: Any, b: Any) -> str:
        dtype = ctx.out_dtype
        if not dtype.is_floating_point:
            return emit(ctx, op_type, [a, b], dtype)
        dt = compute_dtype(op_type, dtype)
        lhs, rhs = ctx.cast(ctx.operand(a, dtype), dt), ctx.cast(ctx.operand(b, dtype), dt)
        nan_dt = compute_dtype("IsNaN", dt)
        result = ctx.op(op_type, lhs, rhs)
        result = ctx.op("Where", ctx.op("IsNaN", ctx.cast(rhs, nan_dt)), lhs, result)
        result = ctx.op("Where", ctx.op("IsNaN", ctx.cast(lhs, nan_dt)), rhs, result)
        return ctx.cast(result, dtype)

    convert.__name__ = f"convert_f{op_type.lower()}"
    return convert


def _min_max(op_type: str) -> Converter:
    def convert(ctx: ConversionContext, a: Any, b: Any) -> str:
        dtype = ctx.out_dtype
        if dtype == torch.bool:  # max = or, min = and
            logic = "Or" if op_type == "Max" else "And"
            return ctx.op(logic, ctx.operand(a, dtype), ctx.operand(b, dtype))
        return emit(ctx, op_type, [a, b], dtype)

    convert.__name__ = f"convert_{op_type.lower()}"
    return convert


def convert_heaviside(ctx: ConversionContext, x: Any, values: Any) -> str:
    dtype = ctx.out_dtype
    cd = compute_dtype("Where", dtype)
    v = ctx.cast(ctx.operand(x, dtype), compute_dtype("Greater", dtype))
    step = ctx.cast(ctx.op("Greater", v, ctx.cast(ctx.const(0, dtype), ctx.dtype(v) or dtype)), cd)
    is_zero = ctx.op("Equal", v, ctx.cast(ctx.const(0, dtype), ctx.dtype(v) or dtype))
    return ctx.cast(ctx.op("Where", is_zero, ctx.cast(ctx.operand(values, dtype), cd), step), dtype)


def convert_clamp(ctx: ConversionContext, x: Value, min: Any = None, max: Any = None) -> str:
    """Clip for scalar bounds; Max / Min (they propagate NaN like torch) for tensor or NaN bounds."""
    dtype = ctx.out_dtype
    if min is None and max is None:
        raise ctx.error("clamp: at least one of min and max must be given")
    tensor_bound = any(isinstance(b, Value) for b in (min, max))
    nan_bound = any(isinstance(b, float) and math.isnan(b) for b in (min, max))
    if dtype == torch.bool or tensor_bound or nan_bound:
        result: Any = x
        if min is not None:
            result = emit(ctx, "Max", [result, min], dtype)
        if max is not None:
            result = emit(ctx, "Min", [result, max], dtype)
        return ctx.cast(result, dtype)
    cd = compute_dtype("Clip", dtype)
    lo = ctx.cast(ctx.operand(min, dtype), cd) if min is not None else None
    hi = ctx.cast(ctx.operand(max, dtype), cd) if max is not None else None
    return ctx.cast(ctx.op("Clip", ctx.cast(ctx.cast(x, dtype), cd), lo, hi), dtype)


def convert_clamp_min(ctx: ConversionContext, x: Value, min: Any) -> str:
    return convert_clamp(ctx, x, min, None)


def convert_clamp_max(ctx: ConversionContext, x: Value, max: Any) -> str:
    return convert_clamp(ctx, x, None, max)


def convert_lerp(ctx: ConversionContext, start: Any, end: Any, weight: Any) -> str:
    """torch's two-sided lerp: exact at both ends (weight 0 gives start, weight 1 gives end)."""
    dtype = _floating_out(ctx, "lerp")
    dt = opmath_dtype(dtype)
    s, e, w = (ctx.cast(ctx.operand(v, dtype), dt) for v in (start, end, weight))
    diff = ctx.op("Sub", e, s)
    near_start = ctx.op("Add", s, ctx.op("Mul", w, diff))
    near_end = ctx.op("Sub", e, ctx.op("Mul", diff, ctx.op("Sub", ctx.const(1.0, dt), w)))
    small = ctx.op("Less", ctx.op("Abs", w), ctx.const(0.5, dt))
    return ctx.cast(ctx.op("Where", small, near_start, near_end), dtype)


def _addc(op_type: str) -> Converter:
    """addcmul / addcdiv: self + value * t1 (op) t2, in torch's evaluation order."""

    def convert(ctx: ConversionContext, x: Any, t1: Any, t2: Any, *, value: Any = 1) -> str:
        dtype = ctx.out_dtype
        if op_type == "Div" and not dtype.is_floating_point:
            raise ctx.error("addcdiv with integer tensors is not supported by torch")
        dt = opmath_dtype(dtype) if dtype.is_floating_point else dtype
        a, b, c = (ctx.cast(ctx.operand(v, dtype), dt) for v in (x, t1, t2))
        scaled = _scaled(ctx, b, value, dt, dt)  # torch keeps value in float32 opmath
        return ctx.cast(emit(ctx, "Add", [a, emit(ctx, op_type, [scaled, c], dt)], dt), dtype)

    convert.__name__ = f"convert_addc{op_type.lower()}"
    return convert


# ---- where / masked_fill ------------------------------------------------------------------------


def convert_where(ctx: ConversionContext, cond: Value, a: Any, b: Any) -> str:
    return where(ctx, cond, a, b, ctx.out_dtype)


def convert_masked_fill(ctx: ConversionContext, x: Value, mask: Value, value: Any) -> str:
    return where(ctx, mask, value, x, ctx.out_dtype)


# ---- bitwise ----------------------------------------------------------------------------------


def _bitwise(logic: str, bitwise: str) -> Converter:
    def convert(ctx: ConversionContext, a: Any, b: Any) -> str:
        dtype = ctx.out_dtype
        if dtype == torch.bool:
            return ctx.op(logic, ctx.operand(a, dtype), ctx.operand(b, dtype))
        if dtype.is_floating_point:
            raise ctx.error(f"{bitwise} on floating point tensors is not defined")
        ctx.require_opset(18, f"{bitwise} on integer tensors")
        return ctx.op(bitwise, ctx.operand(a, dtype), ctx.operand(b, dtype))

    convert.__name__ = f"convert_{bitwise.lower()}"
    return convert


def convert_bitwise_not(ctx: ConversionContext, x: Value) -> str:
    dtype = ctx.out_dtype
    if dtype == torch.bool:
        return ctx.op("Not", x)
    if dtype.is_floating_point:
        raise ctx.error("bitwise_not on floating point tensors is not defined")
    if dtype.is_signed:
        return emit(ctx, "Sub", [-1, x], dtype)  # ~x == -1 - x in two's complement, at every opset
    ctx.require_opset(18, "bitwise_not on unsigned tensors")
    return ctx.op("BitwiseNot", x)


_BITS = {i8: 8, u8: 8, i16: 16, u16: 16, i32: 32, u32: 32, i64: 64, u64: 64}


def _shift(direction: str) -> Converter:
    """Shifts run on uint32 / uint64 (BitShift's onnxruntime kernels); torch gives 0 for shifts of a
    whole width or more, and a sign-filled value for signed right shifts (shift clamped to width-1).
    Signed right shifts use ~((~x) >> s) for negative x."""

    def convert(ctx: ConversionContext, a: Any, b: Any) -> str:
        dtype = ctx.out_dtype
        if dtype not in _BITS:
            raise ctx.error(f"bit shifts are converted for integer tensors only, got {dtype}")
        bits = _BITS[dtype]
        wide_u, wide_s = (u64, i64) if bits == 64 else (u32, i64 if dtype == u32 else i32)
        x = ctx.operand(a, dtype)
        amount = ctx.cast(ctx.operand(b, dtype), wide_u)
        width = ctx.const(bits, wide_u)
        in_range = ctx.cast(ctx.op("Less", amount, width), wide_u)
        if direction == "LEFT" or not dtype.is_signed:
            shifted = ctx.op("BitShift", ctx.cast(ctx.cast(x, wide_s), wide_u), amount, direction=direction)
            return ctx.cast(ctx.op("Mul", shifted, in_range), dtype)
        amount = ctx.op("Min", amount, ctx.const(bits - 1, wide_u))
        xs = ctx.cast(x, wide_s)
        minus_one = ctx.const(-1, wide_s)
        negative = ctx.op("Less", xs, ctx.const(0, wide_s))
        magnitude = ctx.op("Where", negative, ctx.op("Sub", minus_one, xs), xs)
        shifted = ctx.cast(ctx.op("BitShift", ctx.cast(magnitude, wide_u), amount, direction="RIGHT"), wide_s)
        return ctx.cast(ctx.op("Where", negative, ctx.op("Sub", minus_one, shifted), shifted), dtype)

    convert.__name__ = f"convert_{direction.lower()}_shift"
    return convert


# ---- registry -----------------------------------------------------------------------------------

_UNARY_OPS = {
    "exp": "Exp",
    "log": "Log",
    "sqrt": "Sqrt",
    "reciprocal": "Reciprocal",
    "sin": "Sin",
    "cos": "Cos",
    "asin": "Asin",
    "acos": "Acos",
    "atan": "Atan",
    "sinh": "Sinh",
    "cosh": "Cosh",
    "asinh": "Asinh",
    "acosh": "Acosh",
    "atanh": "Atanh",
    "tanh": "Tanh",
    "sigmoid": "Sigmoid",
    "erf": "Erf",
}
_COMPOSITE_UNARY = {
    "rsqrt": _rsqrt,
    "exp2": _exp2,
    "expm1": _expm1,
    "log1p": _log1p,
    "log2": _log2,
    "log10": _log10,
    "erfc": _erfc,
    "tan": _tan,
    "sinc": _sinc,
    "special_ndtr": _ndtr,
    "special_entr": _entr,
}
_BINARY_COMPOSITE = {
    "atan2": atan2,
    "hypot": hypot,
    "copysign": _copysign,
    "xlogy": _xlogy,
    "special_xlog1py": _xlog1py,
    "logaddexp": _logaddexp,
    "logaddexp2": _logaddexp2,
    "ldexp": _ldexp,
}


CONVERTERS: dict[str, Converter] = {
    "aten.add.Tensor": convert_add,
    "aten.add.Scalar": convert_add,
    "aten.sub.Tensor": convert_sub,
    "aten.sub.Scalar": convert_sub,
    "aten.rsub.Tensor": convert_rsub,
    "aten.rsub.Scalar": convert_rsub,
    "aten.mul.Tensor": convert_mul,
    "aten.mul.Scalar": convert_mul,
    "aten.div.Tensor": convert_div,
    "aten.div.Scalar": convert_div,
    "aten.div.Tensor_mode": convert_div,
    "aten.div.Scalar_mode": convert_div,
    "aten.true_divide.Tensor": convert_div,
    "aten.true_divide.Scalar": convert_div,
    "aten.divide.Tensor": convert_div,
    "aten.divide.Scalar": convert_div,
    "aten.divide.Tensor_mode": convert_div,
    "aten.divide.Scalar_mode": convert_div,
    "aten.multiply.Tensor": convert_mul,
    "aten.multiply.Scalar": convert_mul,
    "aten.subtract.Tensor": convert_sub,
    "aten.subtract.Scalar": convert_sub,
    "aten.floor_divide.default": convert_floor_divide,
    "aten.floor_divide.Scalar": convert_floor_divide,
    "aten.remainder.Tensor": convert_remainder,
    "aten.remainder.Scalar": convert_remainder,
    "aten.remainder.Scalar_Tensor": convert_remainder,
    "aten.fmod.Tensor": convert_fmod,
    "aten.fmod.Scalar": convert_fmod,
    "aten.pow.Tensor_Tensor": convert_pow,
    "aten.pow.Tensor_Scalar": convert_pow,
    "aten.pow.Scalar": convert_pow,
    "aten.float_power.Tensor_Tensor": convert_float_power,
    "aten.float_power.Tensor_Scalar": convert_float_power,
    "aten.float_power.Scalar": convert_float_power,
    "aten.neg.default": convert_neg,
    "aten.abs.default": convert_abs,
    "aten.sign.default": convert_sign,
    "aten.sgn.default": convert_sign,
    "aten.square.default": convert_square,
    "aten.exp.default": _unary("Exp"),
    "aten.log.default": _unary("Log"),
    "aten.sqrt.default": _unary("Sqrt"),
    "aten.reciprocal.default": _unary("Reciprocal"),
    "aten.sin.default": _unary("Sin"),
    "aten.cos.default": _unary("Cos"),
    "aten.asin.default": _unary("Asin"),
    "aten.acos.default": _unary("Acos"),
    "aten.atan.default": _unary("Atan"),
    "aten.sinh.default": _unary("Sinh"),
    "aten.cosh.default": _unary("Cosh"),
    "aten.asinh.default": _unary("Asinh"),
    "aten.acosh.default": _unary("Acosh"),
    "aten.atanh.default": _unary("Atanh"),
    "aten.tanh.default": _unary("Tanh"),
    "aten.sigmoid.default": _unary("Sigmoid"),
    "aten.erf.default": _unary("Erf"),
    "aten.rsqrt.default": _composite(_rsqrt),
    "aten.exp2.default": _composite(_exp2),
    "aten.expm1.default": _composite(_expm1),
    "aten.log1p.default": _composite(_log1p),
    "aten.log2.default": _composite(_log2),
    "aten.log10.default": _composite(_log10),
    "aten.erfc.default": _composite(_erfc),
    "aten.tan.default": _composite(_tan),
    "aten.sinc.default": _composite(_sinc),
    "aten.special_ndtr.default": _composite(_ndtr),
    "aten.special_entr.default": _composite(_entr),
    "aten.floor.default": _rounding("Floor", None),
    "aten.ceil.default": _rounding("Ceil", None),
    "aten.trunc.default": _rounding("Trunc", _trunc_float),
    "aten.fix.default": _rounding("Trunc", _trunc_float),
    "aten.frac.default": _rounding("Frac", _frac),
    "aten.round.default": convert_round,
    "aten.round.decimals": convert_round,
    "aten.deg2rad.default": _scale(0.017453292519943295),
    "aten.rad2deg.default": _scale(57.29577951308232),
    "aten.logit.default": convert_logit,
    "aten.special_logit.default": convert_logit,  # torch.special.logit: the same (x, eps)
    "aten.nan_to_num.default": convert_nan_to_num,
    "aten.atan2.default": _binary_composite(atan2),
    "aten.hypot.default": _binary_composite(hypot),
    "aten.copysign.default": _binary_composite(_copysign),
    "aten.copysign.Tensor": _binary_composite(_copysign),
    "aten.copysign.Scalar": _binary_composite(_copysign),
    "aten.xlogy.Tensor": _binary_composite(_xlogy),
    "aten.xlogy.Scalar_Self": _binary_composite(_xlogy),
    "aten.xlogy.Scalar_Other": _binary_composite(_xlogy),
    "aten.special_xlog1py.default": _binary_composite(_xlog1py),
    "aten.special_xlog1py.self_scalar": _binary_composite(_xlog1py),
    "aten.special_xlog1py.other_scalar": _binary_composite(_xlog1py),
    "aten.logaddexp.default": _binary_composite(_logaddexp),
    "aten.logaddexp2.default": _binary_composite(_logaddexp2),
    "aten.ldexp.default": _binary_composite(_ldexp),
    "aten.ldexp.Tensor": _binary_composite(_ldexp),
    "aten.fmax.default": _fmax_fmin("Max"),
    "aten.fmin.default": _fmax_fmin("Min"),
    "aten.maximum.default": _min_max("Max"),
    "aten.minimum.default": _min_max("Min"),
    "aten.max.other": _min_max("Max"),
    "aten.min.other": _min_max("Min"),
    "aten.heaviside.default": convert_heaviside,
    "aten.clamp.default": convert_clamp,
    "aten.clamp.Tensor": convert_clamp,
    "aten.clip.default": convert_clamp,
    "aten.clip.Tensor": convert_clamp,
    "aten.clamp_min.default": convert_clamp_min,
    "aten.clamp_min.Tensor": convert_clamp_min,
    "aten.clamp_max.default": convert_clamp_max,
    "aten.clamp_max.Tensor": convert_clamp_max,
    "aten.lerp.Scalar": convert_lerp,
    "aten.lerp.Tensor": convert_lerp,
    "aten.addcmul.default": _addc("Mul"),
    "aten.addcdiv.default": _addc("Div"),
    "aten.where.self": convert_where,
    "aten.where.ScalarSelf": convert_where,
    "aten.where.ScalarOther": convert_where,
    "aten.where.Scalar": convert_where,
    "aten.masked_fill.Scalar": convert_masked_fill,
    "aten.masked_fill.Tensor": convert_masked_fill,
    "aten.alias.default": convert_identity,
    "aten.clone.default": convert_identity,
    "aten.contiguous.default": convert_identity,
    "aten.detach.default": convert_identity,
    "aten.lift_fresh_copy.default": convert_identity,
    "aten.lift_fresh.default": convert_identity,
    "aten.positive.default": convert_identity,
    "aten.alias_copy.default": convert_identity,
    "aten.resolve_conj.default": convert_identity,
    "aten.resolve_neg.default": convert_identity,
    "aten.to.dtype": convert_to,
    "aten.to.device": convert_to,
    "aten.to.dtype_layout": convert_to,
    "aten.to.other": convert_to,
    "aten._to_copy.default": convert_to,
    # what torch's decompositions (core ATen, as torch.compile backends use) emit for a dtype change
    "prims.convert_element_type.default": convert_to,
    "aten.type_as.default": convert_to,
    "aten.copy.default": convert_copy,
    "aten.bitwise_and.Tensor": _bitwise("And", "BitwiseAnd"),
    "aten.bitwise_and.Scalar": _bitwise("And", "BitwiseAnd"),
    "aten.bitwise_and.Scalar_Tensor": _bitwise("And", "BitwiseAnd"),
    "aten.__and__.Tensor": _bitwise("And", "BitwiseAnd"),
    "aten.__and__.Scalar": _bitwise("And", "BitwiseAnd"),
    "aten.bitwise_or.Tensor": _bitwise("Or", "BitwiseOr"),
    "aten.bitwise_or.Scalar": _bitwise("Or", "BitwiseOr"),
    "aten.bitwise_or.Scalar_Tensor": _bitwise("Or", "BitwiseOr"),
    "aten.__or__.Tensor": _bitwise("Or", "BitwiseOr"),
    "aten.__or__.Scalar": _bitwise("Or", "BitwiseOr"),
    "aten.bitwise_xor.Tensor": _bitwise("Xor", "BitwiseXor"),
    "aten.bitwise_xor.Scalar": _bitwise("Xor", "BitwiseXor"),
    "aten.bitwise_xor.Scalar_Tensor": _bitwise("Xor", "BitwiseXor"),
    "aten.__xor__.Tensor": _bitwise("Xor", "BitwiseXor"),
    "aten.__xor__.Scalar": _bitwise("Xor", "BitwiseXor"),
    "aten.bitwise_not.default": convert_bitwise_not,
    "aten.bitwise_left_shift.Tensor": _shift("LEFT"),
    "aten.bitwise_left_shift.Tensor_Scalar": _shift("LEFT"),
    "aten.bitwise_left_shift.Scalar_Tensor": _shift("LEFT"),
    "aten.__lshift__.Tensor": _shift("LEFT"),
    "aten.__lshift__.Scalar": _shift("LEFT"),
    "aten.bitwise_right_shift.Tensor": _shift("RIGHT"),
    "aten.bitwise_right_shift.Tensor_Scalar": _shift("RIGHT"),
    "aten.bitwise_right_shift.Scalar_Tensor": _shift("RIGHT"),
    "aten.__rshift__.Tensor": _shift("RIGHT"),
    "aten.__rshift__.Scalar": _shift("RIGHT"),
}
