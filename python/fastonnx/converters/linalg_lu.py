"""LU-based linear algebra: inverse, solve, determinants (det, slogdet, logdet and aten's _linalg_*
forms with their LU outputs), the LU family (lu_factor, lu, lu_unpack, lu_solve) and tensorinv /
tensorsolve.

The factorisation is unrolled at conversion time over the static matrix size (``lib.matrices``: LU
with partial pivoting exactly like LAPACK's getrf, so pivots, permutations and factors match torch's).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from fastonnx.context import ConversionContext, Converter, Value
from fastonnx.converters.lib.matrices import (
    LUFactors,
    const_mask,
    diag_of,
    empty_multi,
    empty_outputs,
    empty_single,
    eye_const,
    factor_and_solve,
    first_true,
    float_dtype,
    full_of,
    lapack_pivots,
    lu_decompose,
    lu_info,
    lu_inverse,
    lu_solve,
    matrix_dims,
    matrix_transpose,
    out_shapes,
    perm_matrix_t,
    perm_sign,
    row_of,
    slice_axes,
)
from fastonnx.converters.lib.ops import reduce

f32, f64, i32, i64 = torch.float32, torch.float64, torch.int32, torch.int64


# ---- inverse, solve, determinants ----------------------------------------------------------------


def convert_linalg_inv(ctx: ConversionContext, a: Value) -> str:
    if (empty := empty_single(ctx)) is not None:
        return empty
    return lu_inverse(ctx, a, "linalg.inv")[0]


def convert_linalg_inv_ex(ctx: ConversionContext, a: Value, *, check_errors: bool = False) -> list[str]:
    if (empty := empty_multi(ctx)) is not None:
        return empty
    return list(lu_inverse(ctx, a, "linalg.inv_ex"))


def _is_vector_rhs(a: Value, b: Value) -> bool:
    """torch's rule: B is a (batch of) vector(s) when 1-D or shaped like A without its last dim."""
    return b.rank == 1 or (b.rank == a.rank - 1 and tuple(b.shape) == tuple(a.shape[:-1]))


def _solve(ctx: ConversionContext, a: Value, b: Value, left: bool, what: str) -> tuple[str, LUFactors | None]:
    dtype = float_dtype(ctx, what)
    n, _ = matrix_dims(ctx, a, what)
    vector = _is_vector_rhs(a, b)
    if n == 0 or 0 in [d for d in ctx.out_shape if isinstance(d, int)]:
        return full_of(ctx, ctx.out_shape, 0.0, dtype), None
    rhs = ctx.cast(b, dtype)
    if vector:
        rhs = ctx.op("Unsqueeze", rhs, ctx.i64([-1]))
    elif not left:
        rhs = matrix_transpose(ctx, rhs, b.rank)
    mat = a
    if not left:
        mat = Value(matrix_transpose(ctx, a, a.rank), a.dtype, a.shape)
    x, f = factor_and_solve(ctx, mat, rhs, n, dtype)
    if vector:
        return ctx.op("Squeeze", x, ctx.i64([-1])), f
    if not left:
        return matrix_transpose(ctx, x, len(ctx.out_shape)), f
    return x, f


def convert_linalg_solve(ctx: ConversionContext, a: Value, b: Value, *, left: bool = True) -> str:
    if (empty := empty_single(ctx)) is not None:
        return empty
    return _solve(ctx, a, b, left, "linalg.solve")[0]


def convert_linalg_solve_ex(
    ctx: ConversionContext, a: Value, b: Value, *, left: bool = True, check_errors: bool = False
) -> list[str]:
    if (empty := empty_multi(ctx)) is not None:
        return empty
    x, f = _solve(ctx, a, b, left, "linalg.solve_ex")
    dtype = ctx.out_dtype
    info = first_true(ctx, "", 0, a.name) if f is None else lu_info(ctx, f, a.name, dtype)
    return [x, info]


def _det_parts(ctx: ConversionContext, a: Value, dtype: torch.dtype, what: str) -> tuple[str, str] | None:
    """(*B, n) pivots and (*B, n) +-1 row-swap signs: det(A) is the product of both; None for 0 x 0."""
    n, _ = matrix_dims(ctx, a, what)
    if n == 0:
        return None
    f = lu_decompose(ctx, ctx.cast(a, dtype), n, n, dtype, with_perm=False)
    return diag_of(ctx, f.diag), perm_sign(ctx, f, dtype)


def convert_linalg_det(ctx: ConversionContext, a: Value) -> str:
    if (empty := empty_single(ctx)) is not None:
        return empty
    dtype = float_dtype(ctx, "linalg.det")
    n, _ = matrix_dims(ctx, a, "linalg.det")
    if n == 0:
        return full_of(ctx, ctx.out_shape, 1.0, dtype)
    if dtype == f32:  # onnxruntime's Det has a float32 kernel only
        return ctx.op("Det", a)
    parts = _det_parts(ctx, a, dtype, "linalg.det")
    assert parts is not None
    return reduce(ctx, "ReduceProd", ctx.op("Mul", parts[0], parts[1]), [-1], keepdims=False)


def _slogdet(ctx: ConversionContext, a: Value, what: str) -> tuple[str, str]:
    dtype = float_dtype(ctx, what)
    parts = _det_parts(ctx, a, dtype, what)
    if parts is None:
        shape = out_shapes(ctx)[0]
        return full_of(ctx, shape, 1.0, dtype), full_of(ctx, shape, 0.0, dtype)
    diag, signs = parts
    sign = reduce(ctx, "ReduceProd", ctx.op("Mul", ctx.op("Sign", diag), signs), [-1], keepdims=False)
    logabs = reduce(ctx, "ReduceSum", ctx.op("Log", ctx.op("Abs", diag)), [-1], keepdims=False)
    return sign, logabs


def convert_linalg_slogdet(ctx: ConversionContext, a: Value) -> list[str]:
    if (empty := empty_multi(ctx)) is not None:
        return empty
    return list(_slogdet(ctx, a, "linalg.slogdet"))


def convert_logdet(ctx: ConversionContext, a: Value) -> str:
    if (empty := empty_single(ctx)) is not None:
        return empty
    sign, logabs = _slogdet(ctx, a, "logdet")
    dtype = ctx.out_dtype
    # a negative determinant has no real logarithm
    negative = ctx.op("Less", sign, ctx.const(0.0, dtype))
    return ctx.op("Where", negative, ctx.const(float("nan"), dtype), logabs)


def _torch_lu_input(ctx: ConversionContext, a: Value) -> str:
    """The matrix torch's _linalg_det / _linalg_slogdet factor: A^T when A is contiguous (LAPACK wants
    column-major), A itself otherwise. Only their LU and pivots outputs depend on it."""
    assert ctx.node is not None
    source = ctx.node.args[0]
    val = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
    x = ctx.cast(a, ctx.out_dtype)
    if isinstance(val, torch.Tensor) and val.is_contiguous():
        return matrix_transpose(ctx, x, a.rank)
    return x


def convert_linalg_det_internal(ctx: ConversionContext, a: Value) -> list[str]:
    """_linalg_det: (det, LU, pivots)."""
    if (empty := empty_multi(ctx)) is not None:
        return empty
    n, _ = matrix_dims(ctx, a, "_linalg_det")
    if n == 0:
        return empty_outputs(ctx, [1.0, 0.0, 0])
    det = convert_linalg_det(ctx, a)
    f = lu_decompose(ctx, _torch_lu_input(ctx, a), n, n, float_dtype(ctx, "_linalg_det"), with_perm=False)
    return [det, f.lu, lapack_pivots(ctx, f)]


def convert_linalg_slogdet_internal(ctx: ConversionContext, a: Value) -> list[str]:
    """_linalg_slogdet: (sign, logabsdet, LU, pivots); det(A^T) = det(A), so one factorisation serves."""
    if (empty := empty_multi(ctx)) is not None:
        return empty
    dtype = float_dtype(ctx, "_linalg_slogdet")
    n, _ = matrix_dims(ctx, a, "_linalg_slogdet")
    if n == 0:
        return empty_outputs(ctx, [1.0, 0.0, 0.0, 0])
    f = lu_decompose(ctx, _torch_lu_input(ctx, a), n, n, dtype, with_perm=False)
    diag = diag_of(ctx, f.diag)
    signs = ctx.op("Mul", ctx.op("Sign", diag), perm_sign(ctx, f, dtype))
    sign = reduce(ctx, "ReduceProd", signs, [-1], keepdims=False)
    logabs = reduce(ctx, "ReduceSum", ctx.op("Log", ctx.op("Abs", diag)), [-1], keepdims=False)
    return [sign, logabs, f.lu, lapack_pivots(ctx, f)]


def convert_linalg_solve_ex_internal(
    ctx: ConversionContext, a: Value, b: Value, *, left: bool = True, check_errors: bool = False
) -> list[str]:
    """_linalg_solve_ex: (result, LU, pivots, info), the LU of A itself."""
    if (empty := empty_multi(ctx)) is not None:
        return empty
    dtype = float_dtype(ctx, "_linalg_solve_ex")
    n, _ = matrix_dims(ctx, a, "_linalg_solve_ex")
    if n == 0:
        return empty_outputs(ctx, [0.0, 0.0, 0, 0])
    x, f = _solve(ctx, a, b, left, "_linalg_solve_ex")
    if f is None or not left:  # the solve factored A^T (or nothing): factor A for the outputs
        f = lu_decompose(ctx, ctx.cast(a, dtype), n, n, dtype, with_perm=False)
    return [x, f.lu, lapack_pivots(ctx, f), lu_info(ctx, f, a.name, dtype)]


# ---- LU family -----------------------------------------------------------------------------------


def _lu_factor(ctx: ConversionContext, a: Value, pivot: bool, what: str, with_perm: bool) -> LUFactors:
    if not pivot:
        raise ctx.error(f"{what}: pivot=False (LU without pivoting) is not converted; torch's CPU has none")
    dtype = float_dtype(ctx, what)
    m, n = matrix_dims(ctx, a, what)
    return lu_decompose(ctx, ctx.cast(a, dtype), m, n, dtype, with_perm)


def _lu_factor_outputs(ctx: ConversionContext, a: Value, pivot: bool, what: str) -> list[str]:
    """(LU, pivots, info)"""
    m, n = matrix_dims(ctx, a, what)
    if min(m, n) == 0:
        return [ctx.cast(a, ctx.out_dtype), *empty_outputs(ctx, [0.0, 0, 0])[1:]]
    f = _lu_factor(ctx, a, pivot, what, with_perm=False)
    return [f.lu, lapack_pivots(ctx, f), lu_info(ctx, f, a.name, ctx.out_dtype)]


def convert_lu_with_info(
    ctx: ConversionContext, a: Value, pivot: bool = True, check_errors: bool = True
) -> list[str]:
    if (empty := empty_multi(ctx)) is not None:
        return empty
    return _lu_factor_outputs(ctx, a, pivot, "lu")


def convert_linalg_lu_factor(ctx: ConversionContext, a: Value, *, pivot: bool = True) -> list[str]:
    if (empty := empty_multi(ctx)) is not None:
        return empty
    return _lu_factor_outputs(ctx, a, pivot, "linalg.lu_factor")[:2]


def convert_linalg_lu_factor_ex(
    ctx: ConversionContext, a: Value, *, pivot: bool = True, check_errors: bool = False
) -> list[str]:
    if (empty := empty_multi(ctx)) is not None:
        return empty
    return _lu_factor_outputs(ctx, a, pivot, "linalg.lu_factor_ex")


def _unpack(ctx: ConversionContext, lu: str, m: int, n: int) -> tuple[str, str]:
    """L (m x k, unit lower) and U (k x n, upper) from packed factors, k = min(m, n)."""
    k = min(m, n)
    dtype = ctx.out_dtype
    zero, one = ctx.const(0.0, dtype), ctx.const(1.0, dtype)
    l_part = slice_axes(ctx, lu, [0], [k], [-1]) if k < n else lu
    u_part = slice_axes(ctx, lu, [0], [k], [-2]) if k < m else lu
    lower = ctx.op("Where", const_mask(ctx, m, k, lambda i, j: i > j), l_part, zero)
    lower = ctx.op("Where", const_mask(ctx, m, k, lambda i, j: i == j), one, lower)
    upper = ctx.op("Where", const_mask(ctx, k, n, lambda i, j: i <= j), u_part, zero)
    return lower, upper


def convert_linalg_lu(ctx: ConversionContext, a: Value, *, pivot: bool = True) -> list[str]:
    if (empty := empty_multi(ctx)) is not None:
        return empty
    m, n = matrix_dims(ctx, a, "linalg.lu")
    if min(m, n) == 0:
        return _lu_outputs_empty(ctx, m)
    f = _lu_factor(ctx, a, pivot, "linalg.lu", with_perm=True)
    assert f.perm is not None
    lower, upper = _unpack(ctx, f.lu, m, n)
    p = matrix_transpose(ctx, perm_matrix_t(ctx, f.perm, m, ctx.out_dtype), a.rank)
    return [p, lower, upper]


def _lu_outputs_empty(ctx: ConversionContext, m: int) -> list[str]:
    """P is the identity, L and U are empty."""
    shapes = out_shapes(ctx)
    dtype = ctx.out_dtype
    p = ctx.op("Expand", eye_const(ctx, m, dtype), ctx.shape_tensor(list(shapes[0])))
    return [p, full_of(ctx, shapes[1], 0.0, dtype), full_of(ctx, shapes[2], 0.0, dtype)]


def _perm_from_pivots(ctx: ConversionContext, pivots: Value, m: int) -> str:
    """Replays LAPACK's row swaps: (*B, m, 1) int64 perm with row i of L U = row perm[i] of A."""
    rows = ctx.const(torch.arange(m).reshape(m, 1), i64)
    piv = ctx.op("Sub", ctx.cast(pivots, i64), ctx.i64(1))
    piv = ctx.op("Unsqueeze", piv, ctx.i64([-1]))  # (*B, k, 1)
    perm = rows
    k = pivots.shape[-1]
    for j in range(k):
        p = row_of(ctx, piv, j)  # (*B, 1, 1)
        is_p = ctx.op("Equal", rows, p)
        at_j = const_mask(ctx, m, 1, lambda i, _c, j=j: i == j)
        perm_p = reduce(ctx, "ReduceSum", ctx.op("Where", is_p, perm, ctx.i64(0)), [-2], keepdims=True)
        perm_j = row_of(ctx, perm, j)
        perm = ctx.op("Where", at_j, perm_p, ctx.op("Where", is_p, perm_j, perm))
    if k == 0:  # no swaps, but the batch shape still comes from the pivots
        perm = ctx.op("Add", perm, ctx.op("Unsqueeze", ctx.op("Mul", piv, ctx.i64(0)), ctx.i64([-1])))
    return perm


def convert_lu_unpack(
    ctx: ConversionContext, lu: Value, pivots: Value, unpack_data: bool = True, unpack_pivots: bool = True
) -> list[str | None]:
    if (empty := empty_multi(ctx)) is not None:
        return [*empty]
    m, n = matrix_dims(ctx, lu, "lu_unpack")
    shapes = out_shapes(ctx)
    dtype = ctx.out_dtype
    outs: list[str | None] = []
    if unpack_pivots and m > 0:
        perm = _perm_from_pivots(ctx, pivots, m)
        outs.append(matrix_transpose(ctx, perm_matrix_t(ctx, perm, m, dtype), len(shapes[0])))
    else:  # torch returns an empty P
        outs.append(full_of(ctx, shapes[0], 0.0, dtype))
    if unpack_data and min(m, n) > 0:
        outs.extend(_unpack(ctx, ctx.cast(lu, dtype), m, n))
    else:
        outs.extend([full_of(ctx, shapes[1], 0.0, dtype), full_of(ctx, shapes[2], 0.0, dtype)])
    return outs


def _lu_solve_common(
    ctx: ConversionContext, lu: Value, pivots: Value, b: Value, left: bool, adjoint: bool, what: str
) -> str:
    dtype = float_dtype(ctx, what)
    n, _ = matrix_dims(ctx, lu, what)
    if n == 0 or 0 in [d for d in ctx.out_shape if isinstance(d, int)]:
        return full_of(ctx, ctx.out_shape, 0.0, dtype)
    perm_t = perm_matrix_t(ctx, _perm_from_pivots(ctx, pivots, n), n, dtype)
    rhs = ctx.cast(b, dtype)
    if left:
        return lu_solve(ctx, ctx.cast(lu, dtype), perm_t, rhs, n, lu.rank, adjoint)
    # X A = B  <=>  A^T X^T = B^T (and X A^T = B  <=>  A X^T = B^T)
    x = lu_solve(
        ctx, ctx.cast(lu, dtype), perm_t, matrix_transpose(ctx, rhs, b.rank), n, lu.rank, not adjoint
    )
    return matrix_transpose(ctx, x, len(ctx.out_shape))


def convert_linalg_lu_solve(
    ctx: ConversionContext, lu: Value, pivots: Value, b: Value, *, left: bool = True, adjoint: bool = False
) -> str:
    if (empty := empty_single(ctx)) is not None:
        return empty
    return _lu_solve_common(ctx, lu, pivots, b, left, adjoint, "linalg.lu_solve")


def convert_lu_solve(ctx: ConversionContext, b: Value, lu: Value, pivots: Value) -> str:
    if (empty := empty_single(ctx)) is not None:
        return empty
    return _lu_solve_common(ctx, lu, pivots, b, True, False, "lu_solve")


# ---- tensor inverse and solve --------------------------------------------------------------------


def _static_shape(ctx: ConversionContext, x: Value, what: str) -> tuple[int, ...]:
    shape = x.static_shape()
    if shape is None:
        raise ctx.error(f"{what}: the input shape {tuple(x.shape)} must be static")
    return shape


def convert_linalg_tensorinv(ctx: ConversionContext, a: Value, ind: int = 2) -> str:
    if (empty := empty_single(ctx)) is not None:
        return empty
    dtype = float_dtype(ctx, "linalg.tensorinv")
    shape = _static_shape(ctx, a, "linalg.tensorinv")
    rows = math.prod(shape[:ind])
    square = ctx.op("Reshape", ctx.cast(a, dtype), ctx.i64([rows, math.prod(shape[ind:])]))
    inverse = lu_inverse(ctx, Value(square, dtype, (rows, rows)), "linalg.tensorinv")[0]
    return ctx.op("Reshape", inverse, ctx.i64([*shape[ind:], *shape[:ind]]))


def convert_linalg_tensorsolve(
    ctx: ConversionContext, a: Value, b: Value, dims: Sequence[int] | None = None
) -> str:
    if (empty := empty_single(ctx)) is not None:
        return empty
    dtype = float_dtype(ctx, "linalg.tensorsolve")
    shape = _static_shape(ctx, a, "linalg.tensorsolve")
    x = ctx.cast(a, dtype)
    if dims:
        # torch moves the given dims of A to the end, in order
        moved = [d % a.rank for d in dims]
        perm = [d for d in range(a.rank) if d not in moved] + moved
        x = ctx.op("Transpose", x, perm=perm)
        shape = tuple(shape[d] for d in perm)
    rows = math.prod(shape[: b.rank])
    square = ctx.op("Reshape", x, ctx.i64([rows, math.prod(shape[b.rank :])]))
    rhs = ctx.op("Reshape", ctx.cast(b, dtype), ctx.i64([rows, 1]))
    solution, _ = factor_and_solve(ctx, Value(square, dtype, (rows, rows)), rhs, rows, dtype)
    return ctx.op("Reshape", solution, ctx.i64(list(shape[b.rank :])))


CONVERTERS: dict[str, Converter] = {
    "aten.linalg_inv.default": convert_linalg_inv,
    "aten.linalg_inv_ex.default": convert_linalg_inv_ex,
    "aten.linalg_solve.default": convert_linalg_solve,
    "aten.linalg_solve_ex.default": convert_linalg_solve_ex,
    "aten.linalg_det.default": convert_linalg_det,
    "aten.det.default": convert_linalg_det,
    "aten.linalg_slogdet.default": convert_linalg_slogdet,
    "aten.slogdet.default": convert_linalg_slogdet,
    "aten.logdet.default": convert_logdet,
    "aten._linalg_det.default": convert_linalg_det_internal,
    "aten._linalg_slogdet.default": convert_linalg_slogdet_internal,
    "aten._linalg_solve_ex.default": convert_linalg_solve_ex_internal,
    "aten._lu_with_info.default": convert_lu_with_info,
    "aten.linalg_lu.default": convert_linalg_lu,
    "aten.linalg_lu_factor.default": convert_linalg_lu_factor,
    "aten.linalg_lu_factor_ex.default": convert_linalg_lu_factor_ex,
    "aten.lu_unpack.default": convert_lu_unpack,
    "aten.linalg_lu_solve.default": convert_linalg_lu_solve,
    "aten.lu_solve.default": convert_lu_solve,
    "aten.linalg_tensorinv.default": convert_linalg_tensorinv,
    "aten.linalg_tensorsolve.default": convert_linalg_tensorsolve,
}
