"""Cholesky and triangular solves: linalg.cholesky(_ex), cholesky_solve, cholesky_inverse,
linalg.solve_triangular and triangular_solve.

potrf and the substitutions are unrolled at conversion time over the static matrix size
(``lib.matrices``), reading only the triangle LAPACK reads.
"""

from __future__ import annotations

import torch

from fastonnx.context import ConversionContext, Converter, Value
from fastonnx.converters.lib.matrices import (
    col_of,
    concat_parts,
    const_mask,
    diag_of,
    empty_multi,
    empty_single,
    eye_const,
    first_true,
    float_dtype,
    full_of,
    matrix_dims,
    matrix_transpose,
    out_shapes,
    row_of,
    tri_solve,
)

f32, f64, i32, i64 = torch.float32, torch.float64, torch.int32, torch.int64


# ---- Cholesky family -----------------------------------------------------------------------------


def _cholesky_lower(ctx: ConversionContext, a: str, n: int, rank: int, dtype: torch.dtype) -> tuple[str, str]:
    """potrf on the lower triangle, column by column: (L, (*B, n) diagonal before the square root)."""
    cols: list[str] = []
    squares: list[str] = []
    zero = ctx.const(0.0, dtype)
    for j in range(n):
        v = col_of(ctx, a, j)  # (*B, n, 1); only rows >= j are used
        if cols:
            prev = concat_parts(ctx, cols, axis=-1)  # (*B, n, j)
            v = ctx.op("Sub", v, ctx.op("MatMul", prev, matrix_transpose(ctx, row_of(ctx, prev, j), rank)))
        d = row_of(ctx, v, j)
        squares.append(d)
        root = ctx.op("Sqrt", d)
        col = ctx.op("Div", v, root)
        col = ctx.op("Where", const_mask(ctx, n, 1, lambda i, _c, j=j: i == j), root, col)
        cols.append(ctx.op("Where", const_mask(ctx, n, 1, lambda i, _c, j=j: i < j), zero, col))
    return concat_parts(ctx, cols, axis=-1), diag_of(ctx, squares)


def _cholesky(ctx: ConversionContext, a: Value, upper: bool, what: str) -> tuple[str, str]:
    dtype = float_dtype(ctx, what)
    n, _ = matrix_dims(ctx, a, what)
    if n == 0:
        return ctx.cast(a, dtype), first_true(ctx, "", 0, a.name)
    x = ctx.cast(a, dtype)
    # the upper factor of A is the transposed lower factor of A^T, read from A's upper triangle
    lower, squares = _cholesky_lower(ctx, matrix_transpose(ctx, x, a.rank) if upper else x, n, a.rank, dtype)
    # potrf stops at the first pivot that is not positive (NaN included)
    bad = ctx.op("Not", ctx.op("Greater", squares, ctx.const(0.0, dtype)))
    info = first_true(ctx, bad, n, a.name)
    return (matrix_transpose(ctx, lower, a.rank) if upper else lower), info


def convert_linalg_cholesky(ctx: ConversionContext, a: Value, *, upper: bool = False) -> str:
    if (empty := empty_single(ctx)) is not None:
        return empty
    return _cholesky(ctx, a, upper, "linalg.cholesky")[0]


def convert_linalg_cholesky_ex(
    ctx: ConversionContext, a: Value, *, upper: bool = False, check_errors: bool = False
) -> list[str]:
    if (empty := empty_multi(ctx)) is not None:
        return empty
    return list(_cholesky(ctx, a, upper, "linalg.cholesky_ex"))


def _cholesky_solve_with(
    ctx: ConversionContext, b: str, factor: Value, upper: bool, n: int, dtype: torch.dtype
) -> str:
    """A X = B with A = L L^T (or U^T U), reading only the given triangle of the factor."""
    f = ctx.cast(factor, dtype)
    ft = matrix_transpose(ctx, f, factor.rank)
    lower, lower_t = (ft, f) if upper else (f, ft)
    y = tri_solve(ctx, lower, b, n, lower=True, unit=False)
    return tri_solve(ctx, lower_t, y, n, lower=False, unit=False)


def convert_cholesky_solve(ctx: ConversionContext, b: Value, factor: Value, upper: bool = False) -> str:
    if (empty := empty_single(ctx)) is not None:
        return empty
    dtype = float_dtype(ctx, "cholesky_solve")
    n, _ = matrix_dims(ctx, factor, "cholesky_solve")
    if n == 0 or 0 in [d for d in ctx.out_shape if isinstance(d, int)]:
        return full_of(ctx, ctx.out_shape, 0.0, dtype)
    return _cholesky_solve_with(ctx, ctx.cast(b, dtype), factor, upper, n, dtype)


def convert_cholesky_inverse(ctx: ConversionContext, factor: Value, upper: bool = False) -> str:
    if (empty := empty_single(ctx)) is not None:
        return empty
    dtype = float_dtype(ctx, "cholesky_inverse")
    n, _ = matrix_dims(ctx, factor, "cholesky_inverse")
    if n == 0 or 0 in [d for d in ctx.out_shape if isinstance(d, int)]:
        return full_of(ctx, ctx.out_shape, 0.0, dtype)
    eye = ctx.op("Expand", eye_const(ctx, n, dtype), ctx.dims_of(factor))
    return _cholesky_solve_with(ctx, eye, factor, upper, n, dtype)


# ---- triangular solves ---------------------------------------------------------------------------


def convert_linalg_solve_triangular(
    ctx: ConversionContext, a: Value, b: Value, *, upper: bool, left: bool = True, unitriangular: bool = False
) -> str:
    if (empty := empty_single(ctx)) is not None:
        return empty
    dtype = float_dtype(ctx, "linalg.solve_triangular")
    n, _ = matrix_dims(ctx, a, "linalg.solve_triangular")
    if n == 0 or 0 in [d for d in ctx.out_shape if isinstance(d, int)]:
        return full_of(ctx, ctx.out_shape, 0.0, dtype)
    t, rhs = ctx.cast(a, dtype), ctx.cast(b, dtype)
    if left:
        return tri_solve(ctx, t, rhs, n, lower=not upper, unit=unitriangular)
    # X A = B  <=>  A^T X^T = B^T; A^T's triangle is the other one
    x = tri_solve(
        ctx,
        matrix_transpose(ctx, t, a.rank),
        matrix_transpose(ctx, rhs, b.rank),
        n,
        lower=upper,
        unit=unitriangular,
    )
    return matrix_transpose(ctx, x, len(ctx.out_shape))


def convert_triangular_solve(
    ctx: ConversionContext,
    b: Value,
    a: Value,
    upper: bool = True,
    transpose: bool = False,
    unitriangular: bool = False,
) -> list[str]:
    if (empty := empty_multi(ctx)) is not None:
        return empty
    dtype = float_dtype(ctx, "triangular_solve")
    n, _ = matrix_dims(ctx, a, "triangular_solve")
    shapes = out_shapes(ctx)
    clone = ctx.op("Expand", ctx.cast(a, dtype), ctx.shape_tensor(list(shapes[1])))
    if n == 0 or 0 in [d for d in shapes[0] if isinstance(d, int)]:
        return [full_of(ctx, shapes[0], 0.0, dtype), clone]
    t = ctx.cast(a, dtype)
    lower = not upper
    if transpose:
        t, lower = matrix_transpose(ctx, t, a.rank), upper
    return [tri_solve(ctx, t, ctx.cast(b, dtype), n, lower=lower, unit=unitriangular), clone]


CONVERTERS: dict[str, Converter] = {
    "aten.linalg_cholesky.default": convert_linalg_cholesky,
    "aten.linalg_cholesky_ex.default": convert_linalg_cholesky_ex,
    "aten.cholesky_solve.default": convert_cholesky_solve,
    "aten.cholesky_inverse.default": convert_cholesky_inverse,
    "aten.linalg_solve_triangular.default": convert_linalg_solve_triangular,
    "aten.triangular_solve.default": convert_triangular_solve,
}
