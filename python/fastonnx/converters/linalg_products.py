"""Matrices built from products: matrix powers (a negative power through the LU inverse of
``lib.matrices``), the matrix exponential (scaling and squaring), Vandermonde matrices, and products of
Householder reflectors (householder_product, ormqr).
"""

from __future__ import annotations

import math

import torch

from fastonnx.context import ConversionContext, Converter, Value
from fastonnx.converters.lib.matrices import (
    col_of,
    concat_parts,
    const_mask,
    empty_single,
    eye_const,
    float_dtype,
    lu_inverse,
    matrix_dims,
    matrix_transpose,
    slice_axes,
)
from fastonnx.converters.lib.ops import reduce

f32, f64, i32, i64 = torch.float32, torch.float64, torch.int32, torch.int64


# ---- powers and exponential ----------------------------------------------------------------------


def convert_linalg_matrix_power(ctx: ConversionContext, a: Value, k: int) -> str:
    if (empty := empty_single(ctx)) is not None:
        return empty
    dtype = ctx.out_dtype
    n, _ = matrix_dims(ctx, a, "linalg.matrix_power")
    if k == 0:
        return ctx.op("Expand", eye_const(ctx, n, dtype), ctx.dims_of(a))
    base = ctx.cast(a, dtype)
    if k < 0:
        if dtype not in (f32, f64):
            raise ctx.error(
                f"linalg.matrix_power: a negative power needs a float32/float64 matrix, got {dtype}"
            )
        base = lu_inverse(ctx, a, "linalg.matrix_power")[0] if n else base
    # torch's order of products: the powers of two from the lowest bit up, multiplied in as they come
    power, result, remaining = None, None, abs(k)
    while remaining:
        power = base if power is None else ctx.op("MatMul", power, power)
        if remaining % 2:
            result = power if result is None else ctx.op("MatMul", result, power)
        remaining //= 2
    assert result is not None
    return result


# the scaled matrix has a 1-norm of at most 1: the Taylor tail of degree 18 is below 1 / 19! ~ 8e-18
_EXP_DEGREE = 18


# squarings unrolled; covers 1-norms up to 2**40 (exp of anything larger overflows any float type
# unless the matrix is very special)
_EXP_MAX_SQUARINGS = 40


def convert_matrix_exp(ctx: ConversionContext, a: Value) -> str:
    """Scaling and squaring: A / 2^s has a 1-norm <= 1, a Taylor polynomial of degree 18 gives its
    exponential, s squarings undo the scaling. s is data-dependent, so every batch element runs its own
    count through the unrolled squarings (``Where`` keeps the finished ones)."""
    if (empty := empty_single(ctx)) is not None:
        return empty
    dtype = ctx.out_dtype
    if not dtype.is_floating_point:
        raise ctx.error(f"matrix_exp: only floating point matrices are converted, got {dtype}")
    n, _ = matrix_dims(ctx, a, "matrix_exp")
    if n == 0:
        return ctx.cast(a, dtype)
    # half types compute in float32, as torch's opmath does; float32 in float64 for headroom
    cd = f64 if dtype in (f32, f64) else f32
    x = ctx.cast(a, cd)
    norm = reduce(ctx, "ReduceSum", ctx.op("Abs", x), [-2], keepdims=True)
    norm = reduce(ctx, "ReduceMax", norm, [-1], keepdims=True)  # (*B, 1, 1)
    steps = ctx.op("Ceil", ctx.op("Div", ctx.op("Log", norm), ctx.const(math.log(2.0), cd)))
    # Max/Min rather than Clip: a zero norm gives -inf, which clamps to 0 squarings
    steps = ctx.op("Min", ctx.op("Max", steps, ctx.const(0.0, cd)), ctx.const(float(_EXP_MAX_SQUARINGS), cd))
    scaled = ctx.op("Div", x, ctx.op("Pow", ctx.const(2.0, cd), steps))
    eye = eye_const(ctx, n, cd)
    # Horner: I + A/1 (I + A/2 (I + ... (I + A/18)))
    result = eye
    for i in range(_EXP_DEGREE, 0, -1):
        result = ctx.op("Add", eye, ctx.op("Div", ctx.op("MatMul", scaled, result), ctx.const(float(i), cd)))
    for i in range(_EXP_MAX_SQUARINGS):
        squared = ctx.op("MatMul", result, result)
        result = ctx.op("Where", ctx.op("Less", ctx.const(float(i), cd), steps), squared, result)
    return ctx.cast(result, dtype)


# ---- Vandermonde matrices ------------------------------------------------------------------------


def convert_linalg_vander(ctx: ConversionContext, x: Value, *, N: int | None = None) -> str:
    """Columns 1, x, x^2, ... as torch builds them: a running product (cumprod), not powers."""
    if (empty := empty_single(ctx)) is not None:
        return empty
    dtype = ctx.out_dtype
    count = ctx.out_shape[-1]
    if not isinstance(count, int):
        raise ctx.error(f"linalg.vander: the number of columns N ({count}) must be static")
    # a 0-d x counts as a vector of one element
    base = ctx.op("Unsqueeze", ctx.cast(x, dtype), ctx.i64([-1] if x.rank else [0, 1]))
    ones = ctx.op("Expand", ctx.const(1, dtype), ctx.shape_tensor(list(ctx.out_shape[:-1]) + [1]))
    columns = [ones]
    for _ in range(1, count):
        columns.append(base if len(columns) == 1 else ctx.op("Mul", columns[-1], base))
    return concat_parts(ctx, columns, axis=-1)


# ---- Householder products ------------------------------------------------------------------------


def _reflector(ctx: ConversionContext, a: str, rows: int, i: int, dtype: torch.dtype) -> str:
    """v_i: column i of A below the diagonal, a 1 on it, zeros above; (*B, rows, 1)."""
    col = col_of(ctx, a, i)
    col = ctx.op("Where", const_mask(ctx, rows, 1, lambda r, _c: r == i), ctx.const(1.0, dtype), col)
    return ctx.op("Where", const_mask(ctx, rows, 1, lambda r, _c: r < i), ctx.const(0.0, dtype), col)


def _tau(ctx: ConversionContext, tau: str, i: int) -> str:
    """tau[..., i] as (*B, 1, 1)."""
    return ctx.op("Unsqueeze", slice_axes(ctx, tau, [i], [i + 1], [-1]), ctx.i64([-1]))


def _apply_reflectors(
    ctx: ConversionContext,
    a: Value,
    tau: Value,
    c: str,
    k: int,
    left: bool,
    reverse: bool,
    dtype: torch.dtype,
) -> str:
    """H_i = I - tau_i v_i v_i^T applied to C on the left (H C) or right (C H), for i in 0..k-1 or
    in reverse order."""
    rows, rank = a.shape[-2], a.rank
    reflectors, taus = ctx.cast(a, dtype), ctx.cast(tau, dtype)
    order = range(k - 1, -1, -1) if reverse else range(k)
    for i in order:
        v, t = _reflector(ctx, reflectors, rows, i, dtype), _tau(ctx, taus, i)
        if left:  # C - tau v (v^T C)
            w = reduce(ctx, "ReduceSum", ctx.op("Mul", v, c), [-2], keepdims=True)
            c = ctx.op("Sub", c, ctx.op("Mul", ctx.op("Mul", t, v), w))
        else:  # C - tau (C v) v^T
            cv = ctx.op("MatMul", c, v)
            c = ctx.op("Sub", c, ctx.op("Mul", ctx.op("Mul", t, cv), matrix_transpose(ctx, v, rank)))
    return c


def convert_linalg_householder_product(ctx: ConversionContext, a: Value, tau: Value) -> str:
    """orgqr: the first n columns of H_0 H_1 ... H_{k-1}."""
    if (empty := empty_single(ctx)) is not None:
        return empty
    dtype = float_dtype(ctx, "linalg.householder_product")
    m, n = matrix_dims(ctx, a, "linalg.householder_product")
    k = tau.shape[-1]
    if not isinstance(k, int):
        raise ctx.error(f"linalg.householder_product: the number of reflectors ({k}) must be static")
    eye = ctx.const(torch.eye(m, n, dtype=dtype), dtype)
    start = ctx.op("Expand", eye, ctx.dims_of(a))
    return _apply_reflectors(ctx, a, tau, start, k, left=True, reverse=True, dtype=dtype)


def convert_ormqr(
    ctx: ConversionContext, a: Value, tau: Value, c: Value, left: bool = True, transpose: bool = False
) -> str:
    """Q C, Q^T C, C Q or C Q^T with Q = H_0 ... H_{k-1} from geqrf's reflectors."""
    if (empty := empty_single(ctx)) is not None:
        return empty
    dtype = float_dtype(ctx, "ormqr")
    matrix_dims(ctx, a, "ormqr")
    k = tau.shape[-1]
    if not isinstance(k, int):
        raise ctx.error(f"ormqr: the number of reflectors ({k}) must be static")
    # Q C applies H_{k-1} first; Q^T C applies H_0 first; on the right the other way round
    reverse = left != transpose
    x = ctx.cast(c, dtype)
    if k == 0:
        return ctx.op("Identity", x)
    return _apply_reflectors(ctx, a, tau, x, k, left=left, reverse=reverse, dtype=dtype)


CONVERTERS: dict[str, Converter] = {
    "aten.linalg_matrix_power.default": convert_linalg_matrix_power,
    "aten.matrix_power.default": convert_linalg_matrix_power,
    "aten.matrix_exp.default": convert_matrix_exp,
    "aten.linalg_matrix_exp.default": convert_matrix_exp,
    "aten.linalg_vander.default": convert_linalg_vander,
    "aten.linalg_householder_product.default": convert_linalg_householder_product,
    "aten.ormqr.default": convert_ormqr,
}
