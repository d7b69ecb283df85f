"""Building blocks of the unrolled matrix algorithms (the linalg_lu, linalg_cholesky, linalg_ldl and
linalg_products families): static matrix sizes, slices of rows / columns / entries, constant masks,
outputs of zero-size matrices, LAPACK's ``info``, LU with partial pivoting, triangular substitution and
what is solved with them.

ONNX has no factorisation ops (``Det`` alone, float32 only in onnxruntime), so the algorithms are
unrolled at conversion time over the static matrix size n: O(n) steps of a few nodes each, every step
working on the whole batch at once (batch dims may be symbolic, matrix dims may not). Row and column
updates use constant masks and ``Where`` so that untouched entries keep their exact values. LU uses
partial pivoting exactly like LAPACK's getrf (the first row with the largest absolute value in the
column), so pivots, permutations and factors match torch's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from fastonnx.context import ConversionContext, Operand, Value
from fastonnx.converters.lib.ops import reduce

f32, f64, i32, i64 = torch.float32, torch.float64, torch.int32, torch.int64


# ---- small building blocks -----------------------------------------------------------------------


def matrix_dims(ctx: ConversionContext, x: Value, what: str) -> tuple[int, int]:
    """The static (rows, cols) of a batch of matrices; a symbolic matrix size cannot be unrolled."""
    if x.rank < 2:
        raise ctx.error(f"{what}: expected a batch of matrices, got rank {x.rank}")
    m, n = x.shape[-2], x.shape[-1]
    if not isinstance(m, int) or not isinstance(n, int):
        raise ctx.error(
            f"{what}: the matrix size ({m} x {n}) must be static; the algorithm is unrolled over it "
            "at conversion time"
        )
    return m, n


def float_dtype(ctx: ConversionContext, what: str) -> torch.dtype:
    dtype = ctx.out_dtype
    if dtype not in (f32, f64):
        raise ctx.error(f"{what}: only float32 and float64 are converted, got {dtype}")
    return dtype


def matrix_transpose(ctx: ConversionContext, x: Operand, rank: int) -> str:
    """Swap the last two dims."""
    perm = list(range(rank))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    return ctx.op("Transpose", x, perm=perm)


def slice_axes(
    ctx: ConversionContext, x: Operand, starts: Sequence[int], ends: Sequence[int], axes: Sequence[int]
) -> str:
    return ctx.op("Slice", x, ctx.i64(list(starts)), ctx.i64(list(ends)), ctx.i64(list(axes)))


def row_of(ctx: ConversionContext, x: Operand, i: int) -> str:
    return slice_axes(ctx, x, [i], [i + 1], [-2])


def col_of(ctx: ConversionContext, x: Operand, j: int) -> str:
    return slice_axes(ctx, x, [j], [j + 1], [-1])


def entry_of(ctx: ConversionContext, x: Operand, i: int, j: int) -> str:
    """x[..., i:i+1, j:j+1]"""
    return slice_axes(ctx, x, [i, j], [i + 1, j + 1], [-2, -1])


def concat_parts(ctx: ConversionContext, parts: Sequence[str], axis: int) -> str:
    return parts[0] if len(parts) == 1 else ctx.op("Concat", *parts, axis=axis)


def const_mask(ctx: ConversionContext, rows: int, cols: int, pred: Any) -> str:
    """A constant bool (rows, cols) mask with pred(i, j)."""
    return ctx.const([[bool(pred(i, j)) for j in range(cols)] for i in range(rows)], torch.bool)


def eye_const(ctx: ConversionContext, n: int, dtype: torch.dtype) -> str:
    return ctx.const(torch.eye(n, dtype=dtype), dtype)


def full_of(ctx: ConversionContext, dims: Sequence[Any], value: float | int, dtype: torch.dtype) -> str:
    """A tensor of torch's (possibly symbolic) dims filled with ``value``."""
    return ctx.op("ConstantOfShape", ctx.shape_tensor(list(dims)), value=ctx.tensor_attr(value, dtype))


def out_shapes(ctx: ConversionContext) -> list[tuple[Any, ...]]:
    val = ctx.out
    vals = val if isinstance(val, (list, tuple)) else [val]
    return [tuple(v.shape) for v in vals]


def out_dtypes(ctx: ConversionContext) -> list[torch.dtype]:
    val = ctx.out
    vals = val if isinstance(val, (list, tuple)) else [val]
    return [v.dtype for v in vals]


def empty_outputs(ctx: ConversionContext, fill: Sequence[float | int]) -> list[str]:
    """Every output of the node as a constant tensor of its recorded shape (for zero-size matrices)."""
    return [
        full_of(ctx, shape, value, dtype)
        for shape, dtype, value in zip(out_shapes(ctx), out_dtypes(ctx), fill, strict=True)
    ]


def empty_result(ctx: ConversionContext) -> str | list[str] | None:
    """When every output of the node has no elements (a zero batch or matrix dim), the outputs as
    constants of their recorded shapes, else None. The unrolled graphs do not run on empty batches in
    onnxruntime (ArgMax), and there is nothing to compute."""
    shapes = out_shapes(ctx)
    if not all(any(isinstance(d, int) and d == 0 for d in shape) for shape in shapes):
        return None
    outs = [full_of(ctx, shape, 0, dtype) for shape, dtype in zip(shapes, out_dtypes(ctx), strict=True)]
    return outs if isinstance(ctx.out, (list, tuple)) else outs[0]


def empty_single(ctx: ConversionContext) -> str | None:
    """``empty_result`` of an op with one output."""
    empty = empty_result(ctx)
    assert not isinstance(empty, list), "a single-output op"
    return empty


def empty_multi(ctx: ConversionContext) -> list[str] | None:
    """``empty_result`` of an op with several outputs."""
    empty = empty_result(ctx)
    assert not isinstance(empty, str), "a multi-output op"
    return empty


def first_true(ctx: ConversionContext, flags: str, count: int, batch_of: str) -> str:
    """LAPACK's ``info``: 1 + the index of the first true flag along the last axis, 0 when none, int32.

    ``flags`` is (*B, count) bool; ``batch_of`` gives the batch shape when count is 0.
    """
    if count == 0:
        return ctx.op("ConstantOfShape", ctx.op("Shape", batch_of, end=-2), value=ctx.tensor_attr(0, i32))
    as_int = ctx.cast(flags, i32)  # ArgMax has no bool kernel
    first = ctx.op("ArgMax", as_int, axis=-1, keepdims=0, select_last_index=0)
    anyset = ctx.cast(reduce(ctx, "ReduceMax", as_int, [-1], keepdims=False), torch.bool)
    info = ctx.op("Add", ctx.cast(first, i32), ctx.const(1, i32))
    return ctx.op("Where", anyset, info, ctx.const(0, i32))


# ---- LU with partial pivoting --------------------------------------------------------------------


class LUFactors:
    """The packed LU factors of a batch of m x n matrices and what the pivoting did."""

    def __init__(self, lu: str, rel_pivots: list[str], diag: list[str], perm: str | None, m: int, n: int):
        self.lu = lu  # L below the diagonal (unit diagonal implied), U on and above it
        self.rel_pivots = rel_pivots  # per step: (*B,1,1) int64 offset of the chosen row from the step
        self.diag = diag  # per step: (*B,1,1) pivot value U[j, j]
        self.perm = perm  # (*B, m, 1) int64: row i of L U is row perm[i] of A
        self.m, self.n = m, n


def lu_decompose(
    ctx: ConversionContext, a: str, m: int, n: int, dtype: torch.dtype, with_perm: bool
) -> LUFactors:
    """getrf, right-looking, unrolled over min(m, n) columns; works on the full matrix with masks."""
    k = min(m, n)
    rows = ctx.const(torch.arange(m).reshape(m, 1), i64)
    perm: str | None = rows if with_perm else None
    zero, one = ctx.const(0.0, dtype), ctx.const(1.0, dtype)
    rel_pivots, diag = [], []
    for j in range(k):
        col = slice_axes(ctx, a, [j, j], [m, j + 1], [-2, -1])
        rel = ctx.op("ArgMax", ctx.op("Abs", col), axis=-2, keepdims=1, select_last_index=0)
        rel_pivots.append(rel)
        if j < m - 1:
            p = ctx.op("Add", rel, ctx.i64(j)) if j else rel
            row_j = row_of(ctx, a, j)
            row_p = ctx.op("GatherElements", a, ctx.op("Expand", p, ctx.i64([1, n])), axis=-2)
            is_p = ctx.op("Equal", rows, p)
            at_j = const_mask(ctx, m, 1, lambda i, _c, j=j: i == j)
            a = ctx.op("Where", at_j, row_p, ctx.op("Where", is_p, row_j, a))
            if perm is not None:
                perm_p = reduce(
                    ctx, "ReduceSum", ctx.op("Where", is_p, perm, ctx.i64(0)), [-2], keepdims=True
                )
                perm_j = row_of(ctx, perm, j)
                perm = ctx.op("Where", at_j, perm_p, ctx.op("Where", is_p, perm_j, perm))
        else:
            row_p = row_of(ctx, a, j)
        pivot = col_of(ctx, row_p, j)
        diag.append(pivot)
        if j == m - 1:
            continue
        # an exactly zero pivot leaves its column alone (everything below it is zero too), as getrf does
        safe = ctx.op("Where", ctx.op("Equal", pivot, zero), one, pivot)
        multipliers = ctx.op("Div", col_of(ctx, a, j), safe)
        updated = ctx.op("Sub", a, ctx.op("Mul", multipliers, row_p))
        a = ctx.op("Where", const_mask(ctx, m, n, lambda i, c, j=j: i > j and c > j), updated, a)
        a = ctx.op("Where", const_mask(ctx, m, n, lambda i, c, j=j: i > j and c == j), multipliers, a)
    return LUFactors(a, rel_pivots, diag, perm, m, n)


def diag_of(ctx: ConversionContext, values: list[str]) -> str:
    """Per-step (*B,1,1) values as one (*B, k) tensor."""
    return ctx.op("Squeeze", concat_parts(ctx, values, axis=-1), ctx.i64([-2]))


def lu_info(ctx: ConversionContext, f: LUFactors, batch_of: str, dtype: torch.dtype) -> str:
    """getrf's info: 1 + the first step whose pivot is exactly zero."""
    if not f.diag:
        return first_true(ctx, "", 0, batch_of)
    zero_pivot = ctx.op("Equal", diag_of(ctx, f.diag), ctx.const(0.0, dtype))
    return first_true(ctx, zero_pivot, len(f.diag), batch_of)


def perm_sign(ctx: ConversionContext, f: LUFactors, dtype: torch.dtype) -> str:
    """(*B, k) +1 / -1 per step: -1 where the step swapped two rows."""
    kept = ctx.op("Equal", diag_of(ctx, f.rel_pivots), ctx.i64(0))
    return ctx.op("Where", kept, ctx.const(1.0, dtype), ctx.const(-1.0, dtype))


def lapack_pivots(ctx: ConversionContext, f: LUFactors) -> str:
    """LAPACK's 1-based ipiv (int32, (*B, k)): the row swapped with row j at step j."""
    absolute = [ctx.op("Add", rel, ctx.i64(j + 1)) for j, rel in enumerate(f.rel_pivots)]
    return ctx.cast(diag_of(ctx, absolute), i32)


def perm_matrix_t(ctx: ConversionContext, perm: str, m: int, dtype: torch.dtype) -> str:
    """P^T as a (*B, m, m) matrix: (P^T A)[i] = A[perm[i]]."""
    cols = ctx.const(torch.arange(m).reshape(1, m), i64)
    return ctx.cast(ctx.op("Equal", perm, cols), dtype)


# ---- triangular solves ---------------------------------------------------------------------------


def tri_solve(ctx: ConversionContext, t: str, b: str, n: int, lower: bool, unit: bool) -> str:
    """Solve T X = B for X, reading only T's lower (or upper) triangle; B is (*B, n, k).

    Row by row (substitution), each row one MatMul with the rows already solved.
    """
    solved: dict[int, str] = {}
    order = range(n) if lower else range(n - 1, -1, -1)
    for i in order:
        rhs = row_of(ctx, b, i)
        done = sorted(solved)
        if done:
            lo, hi = (0, i) if lower else (i + 1, n)
            coeffs = slice_axes(ctx, t, [i, lo], [i + 1, hi], [-2, -1])
            prev = concat_parts(ctx, [solved[r] for r in done], axis=-2)
            rhs = ctx.op("Sub", rhs, ctx.op("MatMul", coeffs, prev))
        if not unit:
            rhs = ctx.op("Div", rhs, entry_of(ctx, t, i, i))
        elif not done:  # the first row meets no entry of T: give it T's batch dims too
            rhs = ctx.op("Expand", rhs, ctx.op("Concat", ctx.op("Shape", t, end=-2), ctx.i64([1, 1]), axis=0))
        solved[i] = rhs
    return concat_parts(ctx, [solved[r] for r in range(n)], axis=-2)


def lu_solve(
    ctx: ConversionContext, lu: str, perm_t: str, b: str, n: int, lu_rank: int, adjoint: bool
) -> str:
    """A X = B (or A^T X = B) from A = P L U, with perm_t = P^T as a matrix."""
    if not adjoint:
        y = tri_solve(ctx, lu, ctx.op("MatMul", perm_t, b), n, lower=True, unit=True)
        return tri_solve(ctx, lu, y, n, lower=False, unit=False)
    # A^T = U^T L^T P^T: X = P (L^-T (U^-T B))
    lut = matrix_transpose(ctx, lu, lu_rank)
    y = tri_solve(ctx, lut, b, n, lower=True, unit=False)
    z = tri_solve(ctx, lut, y, n, lower=False, unit=True)
    return ctx.op("MatMul", matrix_transpose(ctx, perm_t, lu_rank), z)


def factor_and_solve(
    ctx: ConversionContext, a: Value, b: str, n: int, dtype: torch.dtype
) -> tuple[str, LUFactors]:
    f = lu_decompose(ctx, ctx.cast(a, dtype), n, n, dtype, with_perm=True)
    assert f.perm is not None
    perm_t = perm_matrix_t(ctx, f.perm, n, dtype)
    return lu_solve(ctx, f.lu, perm_t, b, n, a.rank, adjoint=False), f


# ---- inverse -------------------------------------------------------------------------------------


def lu_inverse(ctx: ConversionContext, a: Value, what: str) -> tuple[str, str]:
    dtype = float_dtype(ctx, what)
    n, _ = matrix_dims(ctx, a, what)
    if n == 0:
        return ctx.cast(a, dtype), first_true(ctx, "", 0, a.name)
    x, f = factor_and_solve(ctx, a, eye_const(ctx, n, dtype), n, dtype)
    return x, lu_info(ctx, f, a.name, dtype)
