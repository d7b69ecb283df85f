"""LDL^T with Bunch-Kaufman pivoting: linalg.ldl_factor(_ex) (LAPACK's sytf2, lower) and
linalg.ldl_solve (sytrs), unrolled at conversion time over the static matrix size (``lib.matrices``);
each step decides per batch element between no pivot, a 1 x 1 and a 2 x 2 pivot.
"""

from __future__ import annotations

import math

import torch

from fastonnx.context import ConversionContext, Converter, Value
from fastonnx.converters.lib.matrices import (
    col_of,
    const_mask,
    diag_of,
    empty_multi,
    empty_outputs,
    empty_single,
    entry_of,
    first_true,
    float_dtype,
    full_of,
    matrix_dims,
    matrix_transpose,
    row_of,
    slice_axes,
)
from fastonnx.converters.lib.ops import reduce

f32, f64, i32, i64 = torch.float32, torch.float64, torch.int32, torch.int64


# ---- LDL^T with Bunch-Kaufman pivoting -----------------------------------------------------------


# sytf2's threshold between 1 x 1 and 2 x 2 pivots
_BK_ALPHA = (1.0 + math.sqrt(17.0)) / 8.0


def _gather_row(ctx: ConversionContext, x: str, index: str, n: int) -> str:
    """x[..., index, :] for a (*B, 1, 1) index: (*B, 1, n)."""
    return ctx.op("GatherElements", x, ctx.op("Expand", index, ctx.i64([1, n])), axis=-2)


def _symmetrize(ctx: ConversionContext, x: str, n: int, rank: int) -> str:
    """The lower triangle mirrored into the upper one."""
    return ctx.op("Where", const_mask(ctx, n, n, lambda i, j: i >= j), x, matrix_transpose(ctx, x, rank))


class _LDLStep:
    """What step k of sytf2 decided, per batch element."""

    def __init__(self, zero: str, is2: str | None, kp: str) -> None:
        self.zero = zero  # (*B,1,1) bool: column k is zero (or NaN on the diagonal): no update, info
        self.is2 = is2  # (*B,1,1) bool: a 2 x 2 pivot on k, k+1 (None: impossible at this k)
        self.kp = kp  # (*B,1,1) int64: the row interchanged with k (1 x 1) or k+1 (2 x 2)


def _ldl_pivot(ctx: ConversionContext, t: str, k: int, n: int, dtype: torch.dtype) -> _LDLStep:
    """sytf2's choice of pivot at step k on the symmetric trailing matrix t."""
    absakk = ctx.op("Abs", entry_of(ctx, t, k, k))
    nan = ctx.op("IsNaN", absakk)
    zero_value = ctx.const(0.0, dtype)
    if k == n - 1:
        zero = ctx.op("Or", ctx.op("Equal", absakk, zero_value), nan)
        # kp is k; the Where gives it the batch dims
        return _LDLStep(zero, None, ctx.op("Where", zero, ctx.i64(k), ctx.i64(k)))
    below = ctx.op("Abs", slice_axes(ctx, t, [k + 1, k], [n, k + 1], [-2, -1]))
    imax = ctx.op("Add", ctx.op("ArgMax", below, axis=-2, keepdims=1, select_last_index=0), ctx.i64(k + 1))
    colmax = reduce(ctx, "ReduceMax", below, [-2], keepdims=True)
    zero = ctx.op("Or", ctx.op("Equal", ctx.op("Max", absakk, colmax), zero_value), nan)
    row = ctx.op("Abs", _gather_row(ctx, t, imax, n))  # row imax of the trailing matrix
    cols = ctx.const(torch.arange(n).reshape(1, n), i64)
    others = ctx.op(
        "And", const_mask(ctx, 1, n, lambda _r, j: j >= k), ctx.op("Not", ctx.op("Equal", cols, imax))
    )
    rowmax = reduce(ctx, "ReduceMax", ctx.op("Where", others, row, zero_value), [-1], keepdims=True)
    aimax = ctx.op("GatherElements", row, imax, axis=-1)
    alpha = ctx.const(_BK_ALPHA, dtype)
    alpha_colmax = ctx.op("Mul", alpha, colmax)
    keep_k = ctx.op(
        "Or",
        ctx.op("GreaterOrEqual", absakk, alpha_colmax),
        ctx.op("GreaterOrEqual", absakk, ctx.op("Mul", alpha_colmax, ctx.op("Div", colmax, rowmax))),
    )
    keep_k = ctx.op("Or", zero, keep_k)
    is2 = ctx.op("And", ctx.op("Not", keep_k), ctx.op("Less", aimax, ctx.op("Mul", alpha, rowmax)))
    kp = ctx.op("Where", keep_k, ctx.i64(k), imax)
    return _LDLStep(zero, is2, kp)


def _sym_interchange(ctx: ConversionContext, t: str, kk: str, kp: str, k: int, n: int, rank: int) -> str:
    """Rows and columns kk and kp swapped in the trailing block t[k:, k:] (finished columns stay)."""
    rows = ctx.const(torch.arange(n).reshape(n, 1), i64)
    index = ctx.op(
        "Where", ctx.op("Equal", rows, kk), kp, ctx.op("Where", ctx.op("Equal", rows, kp), kk, rows)
    )
    swapped = ctx.op("GatherElements", t, ctx.op("Expand", index, ctx.i64([1, n])), axis=-2)
    swapped = ctx.op(
        "GatherElements",
        swapped,
        ctx.op("Expand", matrix_transpose(ctx, index, rank), ctx.i64([n, 1])),
        axis=-1,
    )
    return ctx.op("Where", const_mask(ctx, n, n, lambda i, j: i >= k and j >= k), swapped, t)


def _ldl_update_1x1(ctx: ConversionContext, t: str, k: int, n: int, rank: int, dtype: torch.dtype) -> str:
    """A[k+1:, k+1:] -= x x^T / d and L[k+1:, k] = x / d with x = A[k+1:, k], d = A[k, k]."""
    if k == n - 1:
        return t
    r1 = ctx.op("Div", ctx.const(1.0, dtype), entry_of(ctx, t, k, k))
    x = col_of(ctx, t, k)
    update = ctx.op("Mul", x, ctx.op("Mul", ctx.op("Neg", r1), matrix_transpose(ctx, x, rank)))
    out = ctx.op("Where", const_mask(ctx, n, n, lambda i, j: i > k and j > k), ctx.op("Add", t, update), t)
    out = ctx.op("Where", const_mask(ctx, n, n, lambda i, j: i > k and j == k), ctx.op("Mul", x, r1), out)
    return _symmetrize(ctx, out, n, rank)


def _ldl_update_2x2(ctx: ConversionContext, t: str, k: int, n: int, rank: int, dtype: torch.dtype) -> str:
    """sytf2's 2 x 2 update with D = [[A[k,k], A[k+1,k]], [A[k+1,k], A[k+1,k+1]]]."""
    if k >= n - 2:
        return t
    d21 = entry_of(ctx, t, k + 1, k)
    d11 = ctx.op("Div", entry_of(ctx, t, k + 1, k + 1), d21)
    d22 = ctx.op("Div", entry_of(ctx, t, k, k), d21)
    one = ctx.const(1.0, dtype)
    scale = ctx.op("Div", ctx.op("Div", one, ctx.op("Sub", ctx.op("Mul", d11, d22), one)), d21)
    ck, ck1 = col_of(ctx, t, k), col_of(ctx, t, k + 1)
    wk = ctx.op("Mul", scale, ctx.op("Sub", ctx.op("Mul", d11, ck), ck1))
    wkp1 = ctx.op("Mul", scale, ctx.op("Sub", ctx.op("Mul", d22, ck1), ck))
    updated = ctx.op("Sub", t, ctx.op("Mul", ck, matrix_transpose(ctx, wk, rank)))
    updated = ctx.op("Sub", updated, ctx.op("Mul", ck1, matrix_transpose(ctx, wkp1, rank)))
    out = ctx.op("Where", const_mask(ctx, n, n, lambda i, j: i > k + 1 and j > k + 1), updated, t)
    out = ctx.op("Where", const_mask(ctx, n, n, lambda i, j: i > k + 1 and j == k), wk, out)
    out = ctx.op("Where", const_mask(ctx, n, n, lambda i, j: i > k + 1 and j == k + 1), wkp1, out)
    return _symmetrize(ctx, out, n, rank)


def _ldl(ctx: ConversionContext, a: str, n: int, rank: int, dtype: torch.dtype) -> tuple[str, str, str]:
    """sytf2 (lower): (LD with the upper triangle zeroed, 1-based int32 pivots, int32 info).

    Each step decides per batch element between no pivot (zero column), a 1 x 1 pivot and a 2 x 2
    pivot; a column that was the second of a 2 x 2 block is skipped (``Where`` keeps the state)."""
    t = _symmetrize(ctx, a, n, rank)
    skip: str | None = None  # (*B,1,1) bool: column k was the second of a 2 x 2 block
    carry = ""  # the pivot entry of such a column
    pivots, zeros = [], []
    for k in range(n):
        step = _ldl_pivot(ctx, t, k, n, dtype)
        kk = ctx.i64(k) if step.is2 is None else ctx.op("Add", ctx.cast(step.is2, i64), ctx.i64(k))
        swapped = _sym_interchange(ctx, t, kk, step.kp, k, n, rank) if k < n - 1 else t
        new = _ldl_update_1x1(ctx, swapped, k, n, rank, dtype)
        if step.is2 is not None:
            new = ctx.op("Where", step.is2, _ldl_update_2x2(ctx, swapped, k, n, rank, dtype), new)
        new = ctx.op("Where", step.zero, t, new)
        ipiv = ctx.op("Add", step.kp, ctx.i64(1))
        if step.is2 is not None:
            ipiv = ctx.op("Where", step.is2, ctx.op("Neg", ipiv), ipiv)
        zero = step.zero
        if skip is not None:
            new = ctx.op("Where", skip, t, new)
            ipiv = ctx.op("Where", skip, carry, ipiv)
            zero = ctx.op("And", zero, ctx.op("Not", skip))
        pivots.append(ipiv)
        zeros.append(zero)
        if step.is2 is not None:
            active2 = step.is2 if skip is None else ctx.op("And", step.is2, ctx.op("Not", skip))
            skip, carry = active2, ctx.op("Neg", ctx.op("Add", step.kp, ctx.i64(1)))
        t = new
    ld = ctx.op("Where", const_mask(ctx, n, n, lambda i, j: i >= j), t, ctx.const(0.0, dtype))
    info = first_true(ctx, diag_of(ctx, zeros), n, a)
    return ld, ctx.cast(diag_of(ctx, pivots), i32), info


def _ldl_factor(ctx: ConversionContext, a: Value, hermitian: bool, what: str) -> list[str]:
    dtype = float_dtype(ctx, what)
    n, _ = matrix_dims(ctx, a, what)
    if n == 0:
        return [ctx.cast(a, dtype), *empty_outputs(ctx, [0.0, 0, 0])[1:]]
    # hermitian only differs from symmetric for complex matrices
    return list(_ldl(ctx, ctx.cast(a, dtype), n, a.rank, dtype))


def convert_linalg_ldl_factor(ctx: ConversionContext, a: Value, *, hermitian: bool = False) -> list[str]:
    if (empty := empty_multi(ctx)) is not None:
        return empty
    return _ldl_factor(ctx, a, hermitian, "linalg.ldl_factor")[:2]


def convert_linalg_ldl_factor_ex(
    ctx: ConversionContext, a: Value, *, hermitian: bool = False, check_errors: bool = False
) -> list[str]:
    if (empty := empty_multi(ctx)) is not None:
        return empty
    return _ldl_factor(ctx, a, hermitian, "linalg.ldl_factor_ex")


def _swap_rows(ctx: ConversionContext, b: str, k: int, kp: str, n: int, dtype: torch.dtype) -> str:
    """Rows k and kp ((*B,1,1) int64) of b exchanged; b's batch may broadcast with kp's."""
    rows = ctx.const(torch.arange(n).reshape(n, 1), i64)
    is_kp = ctx.op("Equal", rows, kp)
    row_kp = reduce(ctx, "ReduceSum", ctx.op("Where", is_kp, b, ctx.const(0.0, dtype)), [-2], keepdims=True)
    at_k = const_mask(ctx, n, 1, lambda i, _c: i == k)
    return ctx.op("Where", at_k, row_kp, ctx.op("Where", is_kp, row_of(ctx, b, k), b))


def _eliminate_below(ctx: ConversionContext, b: str, ld: str, k: int, n: int, first: int) -> str:
    """b[first:] -= L[first:, k] b[k] (ger)."""
    below = const_mask(ctx, n, 1, lambda i, _c: i >= first)
    return ctx.op("Where", below, ctx.op("Sub", b, ctx.op("Mul", col_of(ctx, ld, k), row_of(ctx, b, k))), b)


def _dot_below(ctx: ConversionContext, b: str, ld: str, row: int, first: int, n: int, rank: int) -> str:
    """b[row] - L[first:, row]^T b[first:] (gemv), as (*B, 1, m); rank is ld's."""
    coeffs = slice_axes(ctx, ld, [first, row], [n, row + 1], [-2, -1])
    rest = slice_axes(ctx, b, [first], [n], [-2])
    return ctx.op("Sub", row_of(ctx, b, row), ctx.op("MatMul", matrix_transpose(ctx, coeffs, rank), rest))


def _set_row(ctx: ConversionContext, b: str, k: int, value: str, n: int) -> str:
    return ctx.op("Where", const_mask(ctx, n, 1, lambda i, _c: i == k), value, b)


def _solve_2x2(ctx: ConversionContext, b: str, ld: str, k: int, n: int, dtype: torch.dtype) -> str:
    """sytrs's solve of the 2 x 2 diagonal block on rows k, k+1."""
    akm1k = entry_of(ctx, ld, k + 1, k)
    akm1 = ctx.op("Div", entry_of(ctx, ld, k, k), akm1k)
    ak = ctx.op("Div", entry_of(ctx, ld, k + 1, k + 1), akm1k)
    denom = ctx.op("Sub", ctx.op("Mul", akm1, ak), ctx.const(1.0, dtype))
    bkm1 = ctx.op("Div", row_of(ctx, b, k), akm1k)
    bk = ctx.op("Div", row_of(ctx, b, k + 1), akm1k)
    first = ctx.op("Div", ctx.op("Sub", ctx.op("Mul", ak, bkm1), bk), denom)
    second = ctx.op("Div", ctx.op("Sub", ctx.op("Mul", akm1, bk), bkm1), denom)
    return _set_row(ctx, _set_row(ctx, b, k, first, n), k + 1, second, n)


def _ldl_solve(
    ctx: ConversionContext, ld: str, pivots: str, b: str, n: int, rank: int, dtype: torch.dtype
) -> str:
    """sytrs (lower): L D L^T X = B with sytrf's interchanges, block sizes read from the pivots."""
    piv = ctx.op("Unsqueeze", ctx.cast(pivots, i64), ctx.i64([-1]))  # (*B, n, 1)
    entries = [row_of(ctx, piv, k) for k in range(n)]
    one = ctx.i64(1)
    # a negative pivot starts a 2 x 2 block unless the column before started it
    starts2: list[str] = []
    skips: list[str | None] = [None]
    for k in range(n):
        negative = ctx.op("Less", entries[k], ctx.i64(0))
        skip = skips[k]
        starts2.append(negative if skip is None else ctx.op("And", negative, ctx.op("Not", skip)))
        skips.append(starts2[k])
    one_by_one = [ctx.op("Sub", e, one) for e in entries]  # kp of a 1 x 1 pivot, 0-based
    two_by_two = [ctx.op("Sub", ctx.op("Neg", e), one) for e in entries]
    # L D Y = P B
    for k in range(n):
        b1 = _eliminate_below(ctx, _swap_rows(ctx, b, k, one_by_one[k], n, dtype), ld, k, n, k + 1)
        b1 = _set_row(
            ctx, b1, k, ctx.op("Mul", row_of(ctx, b1, k), ctx.op("Reciprocal", entry_of(ctx, ld, k, k))), n
        )
        new = b1
        if k < n - 1:
            b2 = _swap_rows(ctx, b, k + 1, two_by_two[k], n, dtype)
            b2 = _eliminate_below(ctx, _eliminate_below(ctx, b2, ld, k, n, k + 2), ld, k + 1, n, k + 2)
            new = ctx.op("Where", starts2[k], _solve_2x2(ctx, b2, ld, k, n, dtype), new)
        skip = skips[k]
        b = new if skip is None else ctx.op("Where", skip, b, new)
    # L^T X = Y, then the interchanges back
    for k in range(n - 1, -1, -1):
        c1 = b if k == n - 1 else _set_row(ctx, b, k, _dot_below(ctx, b, ld, k, k + 1, n, rank), n)
        new = ctx.op("Where", starts2[k], b, _swap_rows(ctx, c1, k, one_by_one[k], n, dtype))
        skip = skips[k]
        if skip is not None:
            c2 = b
            if k < n - 1:
                c2 = _set_row(ctx, c2, k, _dot_below(ctx, b, ld, k, k + 1, n, rank), n)
                c2 = _set_row(ctx, c2, k - 1, _dot_below(ctx, b, ld, k - 1, k + 1, n, rank), n)
            new = ctx.op("Where", skip, _swap_rows(ctx, c2, k, two_by_two[k], n, dtype), new)
        b = new
    return b


def convert_linalg_ldl_solve(
    ctx: ConversionContext, ld: Value, pivots: Value, b: Value, *, hermitian: bool = False
) -> str:
    if (empty := empty_single(ctx)) is not None:
        return empty
    dtype = float_dtype(ctx, "linalg.ldl_solve")
    n, _ = matrix_dims(ctx, ld, "linalg.ldl_solve")
    if n == 0:
        return full_of(ctx, ctx.out_shape, 0.0, dtype)
    return _ldl_solve(ctx, ctx.cast(ld, dtype), pivots.name, ctx.cast(b, dtype), n, ld.rank, dtype)


CONVERTERS: dict[str, Converter] = {
    "aten.linalg_ldl_factor.default": convert_linalg_ldl_factor,
    "aten.linalg_ldl_factor_ex.default": convert_linalg_ldl_factor_ex,
    "aten.linalg_ldl_solve.default": convert_linalg_ldl_solve,
}
