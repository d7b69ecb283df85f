"""Direct linear-algebra solvers: LU, Cholesky, triangular solves and what is built on them (inverse,
solve, determinants, matrix powers and exponential, Householder products).

ONNX has no factorisation ops (``Det`` alone, float32 only in onnxruntime), so the algorithms are
unrolled at conversion time over the static matrix size n: O(n) steps of a few nodes each, every step
working on the whole batch at once (batch dims may be symbolic, matrix dims may not). Row and column
updates use constant masks and ``Where`` so that untouched entries keep their exact values. LU uses
partial pivoting exactly like LAPACK's getrf (the first row with the largest absolute value in the
column), so pivots, permutations and factors match torch's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from fastonnx.context import ConversionContext, Converter, Operand, Value
from fastonnx.converters.lib.ops import reduce

aten = torch.ops.aten
f32, f64, i32, i64 = torch.float32, torch.float64, torch.int32, torch.int64

# ---- small building blocks ----------------------------------------------------------------------


def _matrix_dims(ctx: ConversionContext, x: Value, what: str) -> tuple[int, int]:
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


def _float_dtype(ctx: ConversionContext, what: str) -> torch.dtype:
    dtype = ctx.out_dtype
    if dtype not in (f32, f64):
        raise ctx.error(f"{what}: only float32 and float64 are converted, got {dtype}")
    return dtype


def _tr(ctx: ConversionContext, x: Operand, rank: int) -> str:
    """Swap the last two dims."""
    perm = list(range(rank))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    return ctx.op("Transpose", x, perm=perm)


def _slice(
    ctx: ConversionContext, x: Operand, starts: Sequence[int], ends: Sequence[int], axes: Sequence[int]
) -> str:
    return ctx.op("Slice", x, ctx.i64(list(starts)), ctx.i64(list(ends)), ctx.i64(list(axes)))


def _row(ctx: ConversionContext, x: Operand, i: int) -> str:
    return _slice(ctx, x, [i], [i + 1], [-2])


def _col(ctx: ConversionContext, x: Operand, j: int) -> str:
    return _slice(ctx, x, [j], [j + 1], [-1])


def _entry(ctx: ConversionContext, x: Operand, i: int, j: int) -> str:
    """x[..., i:i+1, j:j+1]"""
    return _slice(ctx, x, [i, j], [i + 1, j + 1], [-2, -1])


def _concat(ctx: ConversionContext, parts: Sequence[str], axis: int) -> str:
    return parts[0] if len(parts) == 1 else ctx.op("Concat", *parts, axis=axis)


def _mask(ctx: ConversionContext, rows: int, cols: int, pred: Any) -> str:
    """A constant bool (rows, cols) mask with pred(i, j)."""
    return ctx.const([[bool(pred(i, j)) for j in range(cols)] for i in range(rows)], torch.bool)


def _eye(ctx: ConversionContext, n: int, dtype: torch.dtype) -> str:
    return ctx.const(torch.eye(n, dtype=dtype), dtype)


def _full(ctx: ConversionContext, dims: Sequence[Any], value: float | int, dtype: torch.dtype) -> str:
    """A tensor of torch's (possibly symbolic) dims filled with ``value``."""
    return ctx.op("ConstantOfShape", ctx.shape_tensor(list(dims)), value=ctx.tensor_attr(value, dtype))


def _out_shapes(ctx: ConversionContext) -> list[tuple[Any, ...]]:
    val = ctx.out
    vals = val if isinstance(val, (list, tuple)) else [val]
    return [tuple(v.shape) for v in vals]


def _out_dtypes(ctx: ConversionContext) -> list[torch.dtype]:
    val = ctx.out
    vals = val if isinstance(val, (list, tuple)) else [val]
    return [v.dtype for v in vals]


def _empty_outputs(ctx: ConversionContext, fill: Sequence[float | int]) -> list[str]:
    """Every output of the node as a constant tensor of its recorded shape (for zero-size matrices)."""
    return [
        _full(ctx, shape, value, dtype)
        for shape, dtype, value in zip(_out_shapes(ctx), _out_dtypes(ctx), fill, strict=True)
    ]


def _empty_result(ctx: ConversionContext) -> str | list[str] | None:
    """When every output of the node has no elements (a zero batch or matrix dim), the outputs as
    constants of their recorded shapes, else None. The unrolled graphs do not run on empty batches in
    onnxruntime (ArgMax), and there is nothing to compute."""
    shapes = _out_shapes(ctx)
    if not all(any(isinstance(d, int) and d == 0 for d in shape) for shape in shapes):
        return None
    outs = [_full(ctx, shape, 0, dtype) for shape, dtype in zip(shapes, _out_dtypes(ctx), strict=True)]
    return outs if isinstance(ctx.out, (list, tuple)) else outs[0]


def _empty_single(ctx: ConversionContext) -> str | None:
    """``_empty_result`` of an op with one output."""
    empty = _empty_result(ctx)
    assert not isinstance(empty, list), "a single-output op"
    return empty


def _empty_multi(ctx: ConversionContext) -> list[str] | None:
    """``_empty_result`` of an op with several outputs."""
    empty = _empty_result(ctx)
    assert not isinstance(empty, str), "a multi-output op"
    return empty


def _first_true(ctx: ConversionContext, flags: str, count: int, batch_of: str) -> str:
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


# ---- LU with partial pivoting ---------------------------------------------------------------------


class _LU:
    """The packed LU factors of a batch of m x n matrices and what the pivoting did."""

    def __init__(self, lu: str, rel_pivots: list[str], diag: list[str], perm: str | None, m: int, n: int):
        self.lu = lu  # L below the diagonal (unit diagonal implied), U on and above it
        self.rel_pivots = rel_pivots  # per step: (*B,1,1) int64 offset of the chosen row from the step
        self.diag = diag  # per step: (*B,1,1) pivot value U[j, j]
        self.perm = perm  # (*B, m, 1) int64: row i of L U is row perm[i] of A
        self.m, self.n = m, n


def _lu(ctx: ConversionContext, a: str, m: int, n: int, dtype: torch.dtype, with_perm: bool) -> _LU:
    """getrf, right-looking, unrolled over min(m, n) columns; works on the full matrix with masks."""
    k = min(m, n)
    rows = ctx.const(torch.arange(m).reshape(m, 1), i64)
    perm: str | None = rows if with_perm else None
    zero, one = ctx.const(0.0, dtype), ctx.const(1.0, dtype)
    rel_pivots, diag = [], []
    for j in range(k):
        col = _slice(ctx, a, [j, j], [m, j + 1], [-2, -1])
        rel = ctx.op("ArgMax", ctx.op("Abs", col), axis=-2, keepdims=1, select_last_index=0)
        rel_pivots.append(rel)
        if j < m - 1:
            p = ctx.op("Add", rel, ctx.i64(j)) if j else rel
            row_j = _row(ctx, a, j)
            row_p = ctx.op("GatherElements", a, ctx.op("Expand", p, ctx.i64([1, n])), axis=-2)
            is_p = ctx.op("Equal", rows, p)
            at_j = _mask(ctx, m, 1, lambda i, _c, j=j: i == j)
            a = ctx.op("Where", at_j, row_p, ctx.op("Where", is_p, row_j, a))
            if perm is not None:
                perm_p = reduce(
                    ctx, "ReduceSum", ctx.op("Where", is_p, perm, ctx.i64(0)), [-2], keepdims=True
                )
                perm_j = _row(ctx, perm, j)
                perm = ctx.op("Where", at_j, perm_p, ctx.op("Where", is_p, perm_j, perm))
        else:
            row_p = _row(ctx, a, j)
        pivot = _col(ctx, row_p, j)
        diag.append(pivot)
        if j == m - 1:
            continue
        # an exactly zero pivot leaves its column alone (everything below it is zero too), as getrf does
        safe = ctx.op("Where", ctx.op("Equal", pivot, zero), one, pivot)
        multipliers = ctx.op("Div", _col(ctx, a, j), safe)
        updated = ctx.op("Sub", a, ctx.op("Mul", multipliers, row_p))
        a = ctx.op("Where", _mask(ctx, m, n, lambda i, c, j=j: i > j and c > j), updated, a)
        a = ctx.op("Where", _mask(ctx, m, n, lambda i, c, j=j: i > j and c == j), multipliers, a)
    return _LU(a, rel_pivots, diag, perm, m, n)


def _diag_of(ctx: ConversionContext, values: list[str]) -> str:
    """Per-step (*B,1,1) values as one (*B, k) tensor."""
    return ctx.op("Squeeze", _concat(ctx, values, axis=-1), ctx.i64([-2]))


def _lu_info(ctx: ConversionContext, f: _LU, batch_of: str, dtype: torch.dtype) -> str:
    """getrf's info: 1 + the first step whose pivot is exactly zero."""
    if not f.diag:
        return _first_true(ctx, "", 0, batch_of)
    zero_pivot = ctx.op("Equal", _diag_of(ctx, f.diag), ctx.const(0.0, dtype))
    return _first_true(ctx, zero_pivot, len(f.diag), batch_of)


def _perm_sign(ctx: ConversionContext, f: _LU, dtype: torch.dtype) -> str:
    """(*B, k) +1 / -1 per step: -1 where the step swapped two rows."""
    kept = ctx.op("Equal", _diag_of(ctx, f.rel_pivots), ctx.i64(0))
    return ctx.op("Where", kept, ctx.const(1.0, dtype), ctx.const(-1.0, dtype))


def _pivots(ctx: ConversionContext, f: _LU) -> str:
    """LAPACK's 1-based ipiv (int32, (*B, k)): the row swapped with row j at step j."""
    absolute = [ctx.op("Add", rel, ctx.i64(j + 1)) for j, rel in enumerate(f.rel_pivots)]
    return ctx.cast(_diag_of(ctx, absolute), i32)


def _perm_matrix_t(ctx: ConversionContext, perm: str, m: int, dtype: torch.dtype) -> str:
    """P^T as a (*B, m, m) matrix: (P^T A)[i] = A[perm[i]]."""
    cols = ctx.const(torch.arange(m).reshape(1, m), i64)
    return ctx.cast(ctx.op("Equal", perm, cols), dtype)


# ---- triangular solves ----------------------------------------------------------------------------


def _tri_solve(ctx: ConversionContext, t: str, b: str, n: int, lower: bool, unit: bool) -> str:
    """Solve T X = B for X, reading only T's lower (or upper) triangle; B is (*B, n, k).

    Row by row (substitution), each row one MatMul with the rows already solved.
    """
    solved: dict[int, str] = {}
    order = range(n) if lower else range(n - 1, -1, -1)
    for i in order:
        rhs = _row(ctx, b, i)
        done = sorted(solved)
        if done:
            lo, hi = (0, i) if lower else (i + 1, n)
            coeffs = _slice(ctx, t, [i, lo], [i + 1, hi], [-2, -1])
            prev = _concat(ctx, [solved[r] for r in done], axis=-2)
            rhs = ctx.op("Sub", rhs, ctx.op("MatMul", coeffs, prev))
        if not unit:
            rhs = ctx.op("Div", rhs, _entry(ctx, t, i, i))
        elif not done:  # the first row meets no entry of T: give it T's batch dims too
            rhs = ctx.op("Expand", rhs, ctx.op("Concat", ctx.op("Shape", t, end=-2), ctx.i64([1, 1]), axis=0))
        solved[i] = rhs
    return _concat(ctx, [solved[r] for r in range(n)], axis=-2)


def _lu_solve(
    ctx: ConversionContext, lu: str, perm_t: str, b: str, n: int, lu_rank: int, adjoint: bool
) -> str:
    """A X = B (or A^T X = B) from A = P L U, with perm_t = P^T as a matrix."""
    if not adjoint:
        y = _tri_solve(ctx, lu, ctx.op("MatMul", perm_t, b), n, lower=True, unit=True)
        return _tri_solve(ctx, lu, y, n, lower=False, unit=False)
    # A^T = U^T L^T P^T: X = P (L^-T (U^-T B))
    lut = _tr(ctx, lu, lu_rank)
    y = _tri_solve(ctx, lut, b, n, lower=True, unit=False)
    z = _tri_solve(ctx, lut, y, n, lower=False, unit=True)
    return ctx.op("MatMul", _tr(ctx, perm_t, lu_rank), z)


def _factor_and_solve(
    ctx: ConversionContext, a: Value, b: str, n: int, dtype: torch.dtype
) -> tuple[str, _LU]:
    f = _lu(ctx, ctx.cast(a, dtype), n, n, dtype, with_perm=True)
    assert f.perm is not None
    perm_t = _perm_matrix_t(ctx, f.perm, n, dtype)
    return _lu_solve(ctx, f.lu, perm_t, b, n, a.rank, adjoint=False), f


# ---- inverse, solve, determinants ---------------------------------------------------------------


def _inverse(ctx: ConversionContext, a: Value, what: str) -> tuple[str, str]:
    dtype = _float_dtype(ctx, what)
    n, _ = _matrix_dims(ctx, a, what)
    if n == 0:
        return ctx.cast(a, dtype), _first_true(ctx, "", 0, a.name)
    x, f = _factor_and_solve(ctx, a, _eye(ctx, n, dtype), n, dtype)
    return x, _lu_info(ctx, f, a.name, dtype)


def convert_linalg_inv(ctx: ConversionContext, a: Value) -> str:
    if (empty := _empty_single(ctx)) is not None:
        return empty
    return _inverse(ctx, a, "linalg.inv")[0]


def convert_linalg_inv_ex(ctx: ConversionContext, a: Value, *, check_errors: bool = False) -> list[str]:
    if (empty := _empty_multi(ctx)) is not None:
        return empty
    return list(_inverse(ctx, a, "linalg.inv_ex"))


def _is_vector_rhs(a: Value, b: Value) -> bool:
    """torch's rule: B is a (batch of) vector(s) when 1-D or shaped like A without its last dim."""
    return b.rank == 1 or (b.rank == a.rank - 1 and tuple(b.shape) == tuple(a.shape[:-1]))


def _solve(ctx: ConversionContext, a: Value, b: Value, left: bool, what: str) -> tuple[str, _LU | None]:
    dtype = _float_dtype(ctx, what)
    n, _ = _matrix_dims(ctx, a, what)
    vector = _is_vector_rhs(a, b)
    if n == 0 or 0 in [d for d in ctx.out_shape if isinstance(d, int)]:
        return _full(ctx, ctx.out_shape, 0.0, dtype), None
    rhs = ctx.cast(b, dtype)
    if vector:
        rhs = ctx.op("Unsqueeze", rhs, ctx.i64([-1]))
    elif not left:
        rhs = _tr(ctx, rhs, b.rank)
    mat = a
    if not left:
        mat = Value(_tr(ctx, a, a.rank), a.dtype, a.shape)
    x, f = _factor_and_solve(ctx, mat, rhs, n, dtype)
    if vector:
        return ctx.op("Squeeze", x, ctx.i64([-1])), f
    if not left:
        return _tr(ctx, x, len(ctx.out_shape)), f
    return x, f


def convert_linalg_solve(ctx: ConversionContext, a: Value, b: Value, *, left: bool = True) -> str:
    if (empty := _empty_single(ctx)) is not None:
        return empty
    return _solve(ctx, a, b, left, "linalg.solve")[0]


def convert_linalg_solve_ex(
    ctx: ConversionContext, a: Value, b: Value, *, left: bool = True, check_errors: bool = False
) -> list[str]:
    if (empty := _empty_multi(ctx)) is not None:
        return empty
    x, f = _solve(ctx, a, b, left, "linalg.solve_ex")
    dtype = ctx.out_dtype
    info = _first_true(ctx, "", 0, a.name) if f is None else _lu_info(ctx, f, a.name, dtype)
    return [x, info]


def _det_parts(ctx: ConversionContext, a: Value, dtype: torch.dtype, what: str) -> tuple[str, str] | None:
    """(*B, n) pivots and (*B, n) +-1 row-swap signs: det(A) is the product of both; None for 0 x 0."""
    n, _ = _matrix_dims(ctx, a, what)
    if n == 0:
        return None
    f = _lu(ctx, ctx.cast(a, dtype), n, n, dtype, with_perm=False)
    return _diag_of(ctx, f.diag), _perm_sign(ctx, f, dtype)


def convert_linalg_det(ctx: ConversionContext, a: Value) -> str:
    if (empty := _empty_single(ctx)) is not None:
        return empty
    dtype = _float_dtype(ctx, "linalg.det")
    n, _ = _matrix_dims(ctx, a, "linalg.det")
    if n == 0:
        return _full(ctx, ctx.out_shape, 1.0, dtype)
    if dtype == f32:  # onnxruntime's Det has a float32 kernel only
        return ctx.op("Det", a)
    parts = _det_parts(ctx, a, dtype, "linalg.det")
    assert parts is not None
    return reduce(ctx, "ReduceProd", ctx.op("Mul", parts[0], parts[1]), [-1], keepdims=False)


def _slogdet(ctx: ConversionContext, a: Value, what: str) -> tuple[str, str]:
    dtype = _float_dtype(ctx, what)
    parts = _det_parts(ctx, a, dtype, what)
    if parts is None:
        shape = _out_shapes(ctx)[0]
        return _full(ctx, shape, 1.0, dtype), _full(ctx, shape, 0.0, dtype)
    diag, signs = parts
    sign = reduce(ctx, "ReduceProd", ctx.op("Mul", ctx.op("Sign", diag), signs), [-1], keepdims=False)
    logabs = reduce(ctx, "ReduceSum", ctx.op("Log", ctx.op("Abs", diag)), [-1], keepdims=False)
    return sign, logabs


def convert_linalg_slogdet(ctx: ConversionContext, a: Value) -> list[str]:
    if (empty := _empty_multi(ctx)) is not None:
        return empty
    return list(_slogdet(ctx, a, "linalg.slogdet"))


def convert_logdet(ctx: ConversionContext, a: Value) -> str:
    if (empty := _empty_single(ctx)) is not None:
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
        return _tr(ctx, x, a.rank)
    return x


def convert_linalg_det_internal(ctx: ConversionContext, a: Value) -> list[str]:
    """_linalg_det: (det, LU, pivots)."""
    if (empty := _empty_multi(ctx)) is not None:
        return empty
    n, _ = _matrix_dims(ctx, a, "_linalg_det")
    if n == 0:
        return _empty_outputs(ctx, [1.0, 0.0, 0])
    det = convert_linalg_det(ctx, a)
    f = _lu(ctx, _torch_lu_input(ctx, a), n, n, _float_dtype(ctx, "_linalg_det"), with_perm=False)
    return [det, f.lu, _pivots(ctx, f)]


def convert_linalg_slogdet_internal(ctx: ConversionContext, a: Value) -> list[str]:
    """_linalg_slogdet: (sign, logabsdet, LU, pivots); det(A^T) = det(A), so one factorisation serves."""
    if (empty := _empty_multi(ctx)) is not None:
        return empty
    dtype = _float_dtype(ctx, "_linalg_slogdet")
    n, _ = _matrix_dims(ctx, a, "_linalg_slogdet")
    if n == 0:
        return _empty_outputs(ctx, [1.0, 0.0, 0.0, 0])
    f = _lu(ctx, _torch_lu_input(ctx, a), n, n, dtype, with_perm=False)
    diag = _diag_of(ctx, f.diag)
    signs = ctx.op("Mul", ctx.op("Sign", diag), _perm_sign(ctx, f, dtype))
    sign = reduce(ctx, "ReduceProd", signs, [-1], keepdims=False)
    logabs = reduce(ctx, "ReduceSum", ctx.op("Log", ctx.op("Abs", diag)), [-1], keepdims=False)
    return [sign, logabs, f.lu, _pivots(ctx, f)]


def convert_linalg_solve_ex_internal(
    ctx: ConversionContext, a: Value, b: Value, *, left: bool = True, check_errors: bool = False
) -> list[str]:
    """_linalg_solve_ex: (result, LU, pivots, info), the LU of A itself."""
    if (empty := _empty_multi(ctx)) is not None:
        return empty
    dtype = _float_dtype(ctx, "_linalg_solve_ex")
    n, _ = _matrix_dims(ctx, a, "_linalg_solve_ex")
    if n == 0:
        return _empty_outputs(ctx, [0.0, 0.0, 0, 0])
    x, f = _solve(ctx, a, b, left, "_linalg_solve_ex")
    if f is None or not left:  # the solve factored A^T (or nothing): factor A for the outputs
        f = _lu(ctx, ctx.cast(a, dtype), n, n, dtype, with_perm=False)
    return [x, f.lu, _pivots(ctx, f), _lu_info(ctx, f, a.name, dtype)]


# ---- LU family ------------------------------------------------------------------------------------


def _lu_factor(ctx: ConversionContext, a: Value, pivot: bool, what: str, with_perm: bool) -> _LU:
    if not pivot:
        raise ctx.error(f"{what}: pivot=False (LU without pivoting) is not converted; torch's CPU has none")
    dtype = _float_dtype(ctx, what)
    m, n = _matrix_dims(ctx, a, what)
    return _lu(ctx, ctx.cast(a, dtype), m, n, dtype, with_perm)


def _lu_factor_outputs(ctx: ConversionContext, a: Value, pivot: bool, what: str) -> list[str]:
    """(LU, pivots, info)"""
    m, n = _matrix_dims(ctx, a, what)
    if min(m, n) == 0:
        return [ctx.cast(a, ctx.out_dtype), *_empty_outputs(ctx, [0.0, 0, 0])[1:]]
    f = _lu_factor(ctx, a, pivot, what, with_perm=False)
    return [f.lu, _pivots(ctx, f), _lu_info(ctx, f, a.name, ctx.out_dtype)]


def convert_lu_with_info(
    ctx: ConversionContext, a: Value, pivot: bool = True, check_errors: bool = True
) -> list[str]:
    if (empty := _empty_multi(ctx)) is not None:
        return empty
    return _lu_factor_outputs(ctx, a, pivot, "lu")


def convert_linalg_lu_factor(ctx: ConversionContext, a: Value, *, pivot: bool = True) -> list[str]:
    if (empty := _empty_multi(ctx)) is not None:
        return empty
    return _lu_factor_outputs(ctx, a, pivot, "linalg.lu_factor")[:2]


def convert_linalg_lu_factor_ex(
    ctx: ConversionContext, a: Value, *, pivot: bool = True, check_errors: bool = False
) -> list[str]:
    if (empty := _empty_multi(ctx)) is not None:
        return empty
    return _lu_factor_outputs(ctx, a, pivot, "linalg.lu_factor_ex")


def _unpack(ctx: ConversionContext, lu: str, m: int, n: int) -> tuple[str, str]:
    """L (m x k, unit lower) and U (k x n, upper) from packed factors, k = min(m, n)."""
    k = min(m, n)
    dtype = ctx.out_dtype
    zero, one = ctx.const(0.0, dtype), ctx.const(1.0, dtype)
    l_part = _slice(ctx, lu, [0], [k], [-1]) if k < n else lu
    u_part = _slice(ctx, lu, [0], [k], [-2]) if k < m else lu
    lower = ctx.op("Where", _mask(ctx, m, k, lambda i, j: i > j), l_part, zero)
    lower = ctx.op("Where", _mask(ctx, m, k, lambda i, j: i == j), one, lower)
    upper = ctx.op("Where", _mask(ctx, k, n, lambda i, j: i <= j), u_part, zero)
    return lower, upper


def convert_linalg_lu(ctx: ConversionContext, a: Value, *, pivot: bool = True) -> list[str]:
    if (empty := _empty_multi(ctx)) is not None:
        return empty
    m, n = _matrix_dims(ctx, a, "linalg.lu")
    if min(m, n) == 0:
        return _lu_outputs_empty(ctx, m)
    f = _lu_factor(ctx, a, pivot, "linalg.lu", with_perm=True)
    assert f.perm is not None
    lower, upper = _unpack(ctx, f.lu, m, n)
    p = _tr(ctx, _perm_matrix_t(ctx, f.perm, m, ctx.out_dtype), a.rank)
    return [p, lower, upper]


def _lu_outputs_empty(ctx: ConversionContext, m: int) -> list[str]:
    """P is the identity, L and U are empty."""
    shapes = _out_shapes(ctx)
    dtype = ctx.out_dtype
    p = ctx.op("Expand", _eye(ctx, m, dtype), ctx.shape_tensor(list(shapes[0])))
    return [p, _full(ctx, shapes[1], 0.0, dtype), _full(ctx, shapes[2], 0.0, dtype)]


def _perm_from_pivots(ctx: ConversionContext, pivots: Value, m: int) -> str:
    """Replays LAPACK's row swaps: (*B, m, 1) int64 perm with row i of L U = row perm[i] of A."""
    rows = ctx.const(torch.arange(m).reshape(m, 1), i64)
    piv = ctx.op("Sub", ctx.cast(pivots, i64), ctx.i64(1))
    piv = ctx.op("Unsqueeze", piv, ctx.i64([-1]))  # (*B, k, 1)
    perm = rows
    k = pivots.shape[-1]
    for j in range(k):
        p = _row(ctx, piv, j)  # (*B, 1, 1)
        is_p = ctx.op("Equal", rows, p)
        at_j = _mask(ctx, m, 1, lambda i, _c, j=j: i == j)
        perm_p = reduce(ctx, "ReduceSum", ctx.op("Where", is_p, perm, ctx.i64(0)), [-2], keepdims=True)
        perm_j = _row(ctx, perm, j)
        perm = ctx.op("Where", at_j, perm_p, ctx.op("Where", is_p, perm_j, perm))
    if k == 0:  # no swaps, but the batch shape still comes from the pivots
        perm = ctx.op("Add", perm, ctx.op("Unsqueeze", ctx.op("Mul", piv, ctx.i64(0)), ctx.i64([-1])))
    return perm


def convert_lu_unpack(
    ctx: ConversionContext, lu: Value, pivots: Value, unpack_data: bool = True, unpack_pivots: bool = True
) -> list[str | None]:
    if (empty := _empty_multi(ctx)) is not None:
        return [*empty]
    m, n = _matrix_dims(ctx, lu, "lu_unpack")
    shapes = _out_shapes(ctx)
    dtype = ctx.out_dtype
    outs: list[str | None] = []
    if unpack_pivots and m > 0:
        perm = _perm_from_pivots(ctx, pivots, m)
        outs.append(_tr(ctx, _perm_matrix_t(ctx, perm, m, dtype), len(shapes[0])))
    else:  # torch returns an empty P
        outs.append(_full(ctx, shapes[0], 0.0, dtype))
    if unpack_data and min(m, n) > 0:
        outs.extend(_unpack(ctx, ctx.cast(lu, dtype), m, n))
    else:
        outs.extend([_full(ctx, shapes[1], 0.0, dtype), _full(ctx, shapes[2], 0.0, dtype)])
    return outs


def _lu_solve_common(
    ctx: ConversionContext, lu: Value, pivots: Value, b: Value, left: bool, adjoint: bool, what: str
) -> str:
    dtype = _float_dtype(ctx, what)
    n, _ = _matrix_dims(ctx, lu, what)
    if n == 0 or 0 in [d for d in ctx.out_shape if isinstance(d, int)]:
        return _full(ctx, ctx.out_shape, 0.0, dtype)
    perm_t = _perm_matrix_t(ctx, _perm_from_pivots(ctx, pivots, n), n, dtype)
    rhs = ctx.cast(b, dtype)
    if left:
        return _lu_solve(ctx, ctx.cast(lu, dtype), perm_t, rhs, n, lu.rank, adjoint)
    # X A = B  <=>  A^T X^T = B^T (and X A^T = B  <=>  A X^T = B^T)
    x = _lu_solve(ctx, ctx.cast(lu, dtype), perm_t, _tr(ctx, rhs, b.rank), n, lu.rank, not adjoint)
    return _tr(ctx, x, len(ctx.out_shape))


def convert_linalg_lu_solve(
    ctx: ConversionContext, lu: Value, pivots: Value, b: Value, *, left: bool = True, adjoint: bool = False
) -> str:
    if (empty := _empty_single(ctx)) is not None:
        return empty
    return _lu_solve_common(ctx, lu, pivots, b, left, adjoint, "linalg.lu_solve")


def convert_lu_solve(ctx: ConversionContext, b: Value, lu: Value, pivots: Value) -> str:
    if (empty := _empty_single(ctx)) is not None:
        return empty
    return _lu_solve_common(ctx, lu, pivots, b, True, False, "lu_solve")


# ---- Cholesky family ------------------------------------------------------------------------------


def _cholesky_lower(ctx: ConversionContext, a: str, n: int, rank: int, dtype: torch.dtype) -> tuple[str, str]:
    """potrf on the lower triangle, column by column: (L, (*B, n) diagonal before the square root)."""
    cols: list[str] = []
    squares: list[str] = []
    zero = ctx.const(0.0, dtype)
    for j in range(n):
        v = _col(ctx, a, j)  # (*B, n, 1); only rows >= j are used
        if cols:
            prev = _concat(ctx, cols, axis=-1)  # (*B, n, j)
            v = ctx.op("Sub", v, ctx.op("MatMul", prev, _tr(ctx, _row(ctx, prev, j), rank)))
        d = _row(ctx, v, j)
        squares.append(d)
        root = ctx.op("Sqrt", d)
        col = ctx.op("Div", v, root)
        col = ctx.op("Where", _mask(ctx, n, 1, lambda i, _c, j=j: i == j), root, col)
        cols.append(ctx.op("Where", _mask(ctx, n, 1, lambda i, _c, j=j: i < j), zero, col))
    return _concat(ctx, cols, axis=-1), _diag_of(ctx, squares)


def _cholesky(ctx: ConversionContext, a: Value, upper: bool, what: str) -> tuple[str, str]:
    dtype = _float_dtype(ctx, what)
    n, _ = _matrix_dims(ctx, a, what)
    if n == 0:
        return ctx.cast(a, dtype), _first_true(ctx, "", 0, a.name)
    x = ctx.cast(a, dtype)
    # the upper factor of A is the transposed lower factor of A^T, read from A's upper triangle
    lower, squares = _cholesky_lower(ctx, _tr(ctx, x, a.rank) if upper else x, n, a.rank, dtype)
    # potrf stops at the first pivot that is not positive (NaN included)
    bad = ctx.op("Not", ctx.op("Greater", squares, ctx.const(0.0, dtype)))
    info = _first_true(ctx, bad, n, a.name)
    return (_tr(ctx, lower, a.rank) if upper else lower), info


def convert_linalg_cholesky(ctx: ConversionContext, a: Value, *, upper: bool = False) -> str:
    if (empty := _empty_single(ctx)) is not None:
        return empty
    return _cholesky(ctx, a, upper, "linalg.cholesky")[0]


def convert_linalg_cholesky_ex(
    ctx: ConversionContext, a: Value, *, upper: bool = False, check_errors: bool = False
) -> list[str]:
    if (empty := _empty_multi(ctx)) is not None:
        return empty
    return list(_cholesky(ctx, a, upper, "linalg.cholesky_ex"))


def _cholesky_solve_with(
    ctx: ConversionContext, b: str, factor: Value, upper: bool, n: int, dtype: torch.dtype
) -> str:
    """A X = B with A = L L^T (or U^T U), reading only the given triangle of the factor."""
    f = ctx.cast(factor, dtype)
    ft = _tr(ctx, f, factor.rank)
    lower, lower_t = (ft, f) if upper else (f, ft)
    y = _tri_solve(ctx, lower, b, n, lower=True, unit=False)
    return _tri_solve(ctx, lower_t, y, n, lower=False, unit=False)


def convert_cholesky_solve(ctx: ConversionContext, b: Value, factor: Value, upper: bool = False) -> str:
    if (empty := _empty_single(ctx)) is not None:
        return empty
    dtype = _float_dtype(ctx, "cholesky_solve")
    n, _ = _matrix_dims(ctx, factor, "cholesky_solve")
    if n == 0 or 0 in [d for d in ctx.out_shape if isinstance(d, int)]:
        return _full(ctx, ctx.out_shape, 0.0, dtype)
    return _cholesky_solve_with(ctx, ctx.cast(b, dtype), factor, upper, n, dtype)


def convert_cholesky_inverse(ctx: ConversionContext, factor: Value, upper: bool = False) -> str:
    if (empty := _empty_single(ctx)) is not None:
        return empty
    dtype = _float_dtype(ctx, "cholesky_inverse")
    n, _ = _matrix_dims(ctx, factor, "cholesky_inverse")
    if n == 0 or 0 in [d for d in ctx.out_shape if isinstance(d, int)]:
        return _full(ctx, ctx.out_shape, 0.0, dtype)
    eye = ctx.op("Expand", _eye(ctx, n, dtype), ctx.dims_of(factor))
    return _cholesky_solve_with(ctx, eye, factor, upper, n, dtype)


# ---- triangular solves ----------------------------------------------------------------------------


def convert_linalg_solve_triangular(
    ctx: ConversionContext, a: Value, b: Value, *, upper: bool, left: bool = True, unitriangular: bool = False
) -> str:
    if (empty := _empty_single(ctx)) is not None:
        return empty
    dtype = _float_dtype(ctx, "linalg.solve_triangular")
    n, _ = _matrix_dims(ctx, a, "linalg.solve_triangular")
    if n == 0 or 0 in [d for d in ctx.out_shape if isinstance(d, int)]:
        return _full(ctx, ctx.out_shape, 0.0, dtype)
    t, rhs = ctx.cast(a, dtype), ctx.cast(b, dtype)
    if left:
        return _tri_solve(ctx, t, rhs, n, lower=not upper, unit=unitriangular)
    # X A = B  <=>  A^T X^T = B^T; A^T's triangle is the other one
    x = _tri_solve(ctx, _tr(ctx, t, a.rank), _tr(ctx, rhs, b.rank), n, lower=upper, unit=unitriangular)
    return _tr(ctx, x, len(ctx.out_shape))


def convert_triangular_solve(
    ctx: ConversionContext,
    b: Value,
    a: Value,
    upper: bool = True,
    transpose: bool = False,
    unitriangular: bool = False,
) -> list[str]:
    if (empty := _empty_multi(ctx)) is not None:
        return empty
    dtype = _float_dtype(ctx, "triangular_solve")
    n, _ = _matrix_dims(ctx, a, "triangular_solve")
    shapes = _out_shapes(ctx)
    clone = ctx.op("Expand", ctx.cast(a, dtype), ctx.shape_tensor(list(shapes[1])))
    if n == 0 or 0 in [d for d in shapes[0] if isinstance(d, int)]:
        return [_full(ctx, shapes[0], 0.0, dtype), clone]
    t = ctx.cast(a, dtype)
    lower = not upper
    if transpose:
        t, lower = _tr(ctx, t, a.rank), upper
    return [_tri_solve(ctx, t, ctx.cast(b, dtype), n, lower=lower, unit=unitriangular), clone]


# ---- LDL^T with Bunch-Kaufman pivoting ------------------------------------------------------------

# sytf2's threshold between 1 x 1 and 2 x 2 pivots
_BK_ALPHA = (1.0 + math.sqrt(17.0)) / 8.0


def _gather_row(ctx: ConversionContext, x: str, index: str, n: int) -> str:
    """x[..., index, :] for a (*B, 1, 1) index: (*B, 1, n)."""
    return ctx.op("GatherElements", x, ctx.op("Expand", index, ctx.i64([1, n])), axis=-2)


def _symmetrize(ctx: ConversionContext, x: str, n: int, rank: int) -> str:
    """The lower triangle mirrored into the upper one."""
    return ctx.op("Where", _mask(ctx, n, n, lambda i, j: i >= j), x, _tr(ctx, x, rank))


class _LDLStep:
    """What step k of sytf2 decided, per batch element."""

    def __init__(self, zero: str, is2: str | None, kp: str) -> None:
        self.zero = zero  # (*B,1,1) bool: column k is zero (or NaN on the diagonal): no update, info
        self.is2 = is2  # (*B,1,1) bool: a 2 x 2 pivot on k, k+1 (None: impossible at this k)
        self.kp = kp  # (*B,1,1) int64: the row interchanged with k (1 x 1) or k+1 (2 x 2)


def _ldl_pivot(ctx: ConversionContext, t: str, k: int, n: int, dtype: torch.dtype) -> _LDLStep:
    """sytf2's choice of pivot at step k on the symmetric trailing matrix t."""
    absakk = ctx.op("Abs", _entry(ctx, t, k, k))
    nan = ctx.op("IsNaN", absakk)
    zero_value = ctx.const(0.0, dtype)
    if k == n - 1:
        zero = ctx.op("Or", ctx.op("Equal", absakk, zero_value), nan)
        # kp is k; the Where gives it the batch dims
        return _LDLStep(zero, None, ctx.op("Where", zero, ctx.i64(k), ctx.i64(k)))
    below = ctx.op("Abs", _slice(ctx, t, [k + 1, k], [n, k + 1], [-2, -1]))
    imax = ctx.op("Add", ctx.op("ArgMax", below, axis=-2, keepdims=1, select_last_index=0), ctx.i64(k + 1))
    colmax = reduce(ctx, "ReduceMax", below, [-2], keepdims=True)
    zero = ctx.op("Or", ctx.op("Equal", ctx.op("Max", absakk, colmax), zero_value), nan)
    row = ctx.op("Abs", _gather_row(ctx, t, imax, n))  # row imax of the trailing matrix
    cols = ctx.const(torch.arange(n).reshape(1, n), i64)
    others = ctx.op("And", _mask(ctx, 1, n, lambda _r, j: j >= k), ctx.op("Not", ctx.op("Equal", cols, imax)))
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
        "GatherElements", swapped, ctx.op("Expand", _tr(ctx, index, rank), ctx.i64([n, 1])), axis=-1
    )
    return ctx.op("Where", _mask(ctx, n, n, lambda i, j: i >= k and j >= k), swapped, t)


def _ldl_update_1x1(ctx: ConversionContext, t: str, k: int, n: int, rank: int, dtype: torch.dtype) -> str:
    """A[k+1:, k+1:] -= x x^T / d and L[k+1:, k] = x / d with x = A[k+1:, k], d = A[k, k]."""
    if k == n - 1:
        return t
    r1 = ctx.op("Div", ctx.const(1.0, dtype), _entry(ctx, t, k, k))
    x = _col(ctx, t, k)
    update = ctx.op("Mul", x, ctx.op("Mul", ctx.op("Neg", r1), _tr(ctx, x, rank)))
    out = ctx.op("Where", _mask(ctx, n, n, lambda i, j: i > k and j > k), ctx.op("Add", t, update), t)
    out = ctx.op("Where", _mask(ctx, n, n, lambda i, j: i > k and j == k), ctx.op("Mul", x, r1), out)
    return _symmetrize(ctx, out, n, rank)


def _ldl_update_2x2(ctx: ConversionContext, t: str, k: int, n: int, rank: int, dtype: torch.dtype) -> str:
    """sytf2's 2 x 2 update with D = [[A[k,k], A[k+1,k]], [A[k+1,k], A[k+1,k+1]]]."""
    if k >= n - 2:
        return t
    d21 = _entry(ctx, t, k + 1, k)
    d11 = ctx.op("Div", _entry(ctx, t, k + 1, k + 1), d21)
    d22 = ctx.op("Div", _entry(ctx, t, k, k), d21)
    one = ctx.const(1.0, dtype)
    scale = ctx.op("Div", ctx.op("Div", one, ctx.op("Sub", ctx.op("Mul", d11, d22), one)), d21)
    ck, ck1 = _col(ctx, t, k), _col(ctx, t, k + 1)
    wk = ctx.op("Mul", scale, ctx.op("Sub", ctx.op("Mul", d11, ck), ck1))
    wkp1 = ctx.op("Mul", scale, ctx.op("Sub", ctx.op("Mul", d22, ck1), ck))
    updated = ctx.op("Sub", t, ctx.op("Mul", ck, _tr(ctx, wk, rank)))
    updated = ctx.op("Sub", updated, ctx.op("Mul", ck1, _tr(ctx, wkp1, rank)))
    out = ctx.op("Where", _mask(ctx, n, n, lambda i, j: i > k + 1 and j > k + 1), updated, t)
    out = ctx.op("Where", _mask(ctx, n, n, lambda i, j: i > k + 1 and j == k), wk, out)
    out = ctx.op("Where", _mask(ctx, n, n, lambda i, j: i > k + 1 and j == k + 1), wkp1, out)
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
    ld = ctx.op("Where", _mask(ctx, n, n, lambda i, j: i >= j), t, ctx.const(0.0, dtype))
    info = _first_true(ctx, _diag_of(ctx, zeros), n, a)
    return ld, ctx.cast(_diag_of(ctx, pivots), i32), info


def _ldl_factor(ctx: ConversionContext, a: Value, hermitian: bool, what: str) -> list[str]:
    dtype = _float_dtype(ctx, what)
    n, _ = _matrix_dims(ctx, a, what)
    if n == 0:
        return [ctx.cast(a, dtype), *_empty_outputs(ctx, [0.0, 0, 0])[1:]]
    # hermitian only differs from symmetric for complex matrices
    return list(_ldl(ctx, ctx.cast(a, dtype), n, a.rank, dtype))


def convert_linalg_ldl_factor(ctx: ConversionContext, a: Value, *, hermitian: bool = False) -> list[str]:
    if (empty := _empty_multi(ctx)) is not None:
        return empty
    return _ldl_factor(ctx, a, hermitian, "linalg.ldl_factor")[:2]


def convert_linalg_ldl_factor_ex(
    ctx: ConversionContext, a: Value, *, hermitian: bool = False, check_errors: bool = False
) -> list[str]:
    if (empty := _empty_multi(ctx)) is not None:
        return empty
    return _ldl_factor(ctx, a, hermitian, "linalg.ldl_factor_ex")


def _swap_rows(ctx: ConversionContext, b: str, k: int, kp: str, n: int, dtype: torch.dtype) -> str:
    """Rows k and kp ((*B,1,1) int64) of b exchanged; b's batch may broadcast with kp's."""
    rows = ctx.const(torch.arange(n).reshape(n, 1), i64)
    is_kp = ctx.op("Equal", rows, kp)
    row_kp = reduce(ctx, "ReduceSum", ctx.op("Where", is_kp, b, ctx.const(0.0, dtype)), [-2], keepdims=True)
    at_k = _mask(ctx, n, 1, lambda i, _c: i == k)
    return ctx.op("Where", at_k, row_kp, ctx.op("Where", is_kp, _row(ctx, b, k), b))


def _eliminate_below(ctx: ConversionContext, b: str, ld: str, k: int, n: int, first: int) -> str:
    """b[first:] -= L[first:, k] b[k] (ger)."""
    below = _mask(ctx, n, 1, lambda i, _c: i >= first)
    return ctx.op("Where", below, ctx.op("Sub", b, ctx.op("Mul", _col(ctx, ld, k), _row(ctx, b, k))), b)


def _dot_below(ctx: ConversionContext, b: str, ld: str, row: int, first: int, n: int, rank: int) -> str:
    """b[row] - L[first:, row]^T b[first:] (gemv), as (*B, 1, m); rank is ld's."""
    coeffs = _slice(ctx, ld, [first, row], [n, row + 1], [-2, -1])
    rest = _slice(ctx, b, [first], [n], [-2])
    return ctx.op("Sub", _row(ctx, b, row), ctx.op("MatMul", _tr(ctx, coeffs, rank), rest))


def _set_row(ctx: ConversionContext, b: str, k: int, value: str, n: int) -> str:
    return ctx.op("Where", _mask(ctx, n, 1, lambda i, _c: i == k), value, b)


def _solve_2x2(ctx: ConversionContext, b: str, ld: str, k: int, n: int, dtype: torch.dtype) -> str:
    """sytrs's solve of the 2 x 2 diagonal block on rows k, k+1."""
    akm1k = _entry(ctx, ld, k + 1, k)
    akm1 = ctx.op("Div", _entry(ctx, ld, k, k), akm1k)
    ak = ctx.op("Div", _entry(ctx, ld, k + 1, k + 1), akm1k)
    denom = ctx.op("Sub", ctx.op("Mul", akm1, ak), ctx.const(1.0, dtype))
    bkm1 = ctx.op("Div", _row(ctx, b, k), akm1k)
    bk = ctx.op("Div", _row(ctx, b, k + 1), akm1k)
    first = ctx.op("Div", ctx.op("Sub", ctx.op("Mul", ak, bkm1), bk), denom)
    second = ctx.op("Div", ctx.op("Sub", ctx.op("Mul", akm1, bk), bkm1), denom)
    return _set_row(ctx, _set_row(ctx, b, k, first, n), k + 1, second, n)


def _ldl_solve(
    ctx: ConversionContext, ld: str, pivots: str, b: str, n: int, rank: int, dtype: torch.dtype
) -> str:
    """sytrs (lower): L D L^T X = B with sytrf's interchanges, block sizes read from the pivots."""
    piv = ctx.op("Unsqueeze", ctx.cast(pivots, i64), ctx.i64([-1]))  # (*B, n, 1)
    entries = [_row(ctx, piv, k) for k in range(n)]
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
            ctx, b1, k, ctx.op("Mul", _row(ctx, b1, k), ctx.op("Reciprocal", _entry(ctx, ld, k, k))), n
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
    if (empty := _empty_single(ctx)) is not None:
        return empty
    dtype = _float_dtype(ctx, "linalg.ldl_solve")
    n, _ = _matrix_dims(ctx, ld, "linalg.ldl_solve")
    if n == 0:
        return _full(ctx, ctx.out_shape, 0.0, dtype)
    return _ldl_solve(ctx, ctx.cast(ld, dtype), pivots.name, ctx.cast(b, dtype), n, ld.rank, dtype)


# ---- powers and exponential -----------------------------------------------------------------------


def convert_linalg_matrix_power(ctx: ConversionContext, a: Value, k: int) -> str:
    if (empty := _empty_single(ctx)) is not None:
        return empty
    dtype = ctx.out_dtype
    n, _ = _matrix_dims(ctx, a, "linalg.matrix_power")
    if k == 0:
        return ctx.op("Expand", _eye(ctx, n, dtype), ctx.dims_of(a))
    base = ctx.cast(a, dtype)
    if k < 0:
        if dtype not in (f32, f64):
            raise ctx.error(
                f"linalg.matrix_power: a negative power needs a float32/float64 matrix, got {dtype}"
            )
        base = _inverse(ctx, a, "linalg.matrix_power")[0] if n else base
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
    if (empty := _empty_single(ctx)) is not None:
        return empty
    dtype = ctx.out_dtype
    if not dtype.is_floating_point:
        raise ctx.error(f"matrix_exp: only floating point matrices are converted, got {dtype}")
    n, _ = _matrix_dims(ctx, a, "matrix_exp")
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
    eye = _eye(ctx, n, cd)
    # Horner: I + A/1 (I + A/2 (I + ... (I + A/18)))
    result = eye
    for i in range(_EXP_DEGREE, 0, -1):
        result = ctx.op("Add", eye, ctx.op("Div", ctx.op("MatMul", scaled, result), ctx.const(float(i), cd)))
    for i in range(_EXP_MAX_SQUARINGS):
        squared = ctx.op("MatMul", result, result)
        result = ctx.op("Where", ctx.op("Less", ctx.const(float(i), cd), steps), squared, result)
    return ctx.cast(result, dtype)


# ---- tensor inverse and solve -------------------------------------------------------------------


def _static_shape(ctx: ConversionContext, x: Value, what: str) -> tuple[int, ...]:
    shape = x.static_shape()
    if shape is None:
        raise ctx.error(f"{what}: the input shape {tuple(x.shape)} must be static")
    return shape


def convert_linalg_tensorinv(ctx: ConversionContext, a: Value, ind: int = 2) -> str:
    if (empty := _empty_single(ctx)) is not None:
        return empty
    dtype = _float_dtype(ctx, "linalg.tensorinv")
    shape = _static_shape(ctx, a, "linalg.tensorinv")
    rows = math.prod(shape[:ind])
    square = ctx.op("Reshape", ctx.cast(a, dtype), ctx.i64([rows, math.prod(shape[ind:])]))
    inverse = _inverse(ctx, Value(square, dtype, (rows, rows)), "linalg.tensorinv")[0]
    return ctx.op("Reshape", inverse, ctx.i64([*shape[ind:], *shape[:ind]]))


def convert_linalg_tensorsolve(
    ctx: ConversionContext, a: Value, b: Value, dims: Sequence[int] | None = None
) -> str:
    if (empty := _empty_single(ctx)) is not None:
        return empty
    dtype = _float_dtype(ctx, "linalg.tensorsolve")
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
    solution, _ = _factor_and_solve(ctx, Value(square, dtype, (rows, rows)), rhs, rows, dtype)
    return ctx.op("Reshape", solution, ctx.i64(list(shape[b.rank :])))


def convert_linalg_vander(ctx: ConversionContext, x: Value, *, N: int | None = None) -> str:
    """Columns 1, x, x^2, ... as torch builds them: a running product (cumprod), not powers."""
    if (empty := _empty_single(ctx)) is not None:
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
    return _concat(ctx, columns, axis=-1)


# ---- Householder products -----------------------------------------------------------------------


def _reflector(ctx: ConversionContext, a: str, rows: int, i: int, dtype: torch.dtype) -> str:
    """v_i: column i of A below the diagonal, a 1 on it, zeros above; (*B, rows, 1)."""
    col = _col(ctx, a, i)
    col = ctx.op("Where", _mask(ctx, rows, 1, lambda r, _c: r == i), ctx.const(1.0, dtype), col)
    return ctx.op("Where", _mask(ctx, rows, 1, lambda r, _c: r < i), ctx.const(0.0, dtype), col)


def _tau(ctx: ConversionContext, tau: str, i: int) -> str:
    """tau[..., i] as (*B, 1, 1)."""
    return ctx.op("Unsqueeze", _slice(ctx, tau, [i], [i + 1], [-1]), ctx.i64([-1]))


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
            c = ctx.op("Sub", c, ctx.op("Mul", ctx.op("Mul", t, cv), _tr(ctx, v, rank)))
    return c


def convert_linalg_householder_product(ctx: ConversionContext, a: Value, tau: Value) -> str:
    """orgqr: the first n columns of H_0 H_1 ... H_{k-1}."""
    if (empty := _empty_single(ctx)) is not None:
        return empty
    dtype = _float_dtype(ctx, "linalg.householder_product")
    m, n = _matrix_dims(ctx, a, "linalg.householder_product")
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
    if (empty := _empty_single(ctx)) is not None:
        return empty
    dtype = _float_dtype(ctx, "ormqr")
    _matrix_dims(ctx, a, "ormqr")
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
    "aten.linalg_cholesky.default": convert_linalg_cholesky,
    "aten.linalg_cholesky_ex.default": convert_linalg_cholesky_ex,
    "aten.cholesky_solve.default": convert_cholesky_solve,
    "aten.cholesky_inverse.default": convert_cholesky_inverse,
    "aten.linalg_solve_triangular.default": convert_linalg_solve_triangular,
    "aten.triangular_solve.default": convert_triangular_solve,
    "aten._lu_with_info.default": convert_lu_with_info,
    "aten.linalg_lu.default": convert_linalg_lu,
    "aten.linalg_lu_factor.default": convert_linalg_lu_factor,
    "aten.linalg_lu_factor_ex.default": convert_linalg_lu_factor_ex,
    "aten.lu_unpack.default": convert_lu_unpack,
    "aten.linalg_lu_solve.default": convert_linalg_lu_solve,
    "aten.lu_solve.default": convert_lu_solve,
    "aten.linalg_ldl_factor.default": convert_linalg_ldl_factor,
    "aten.linalg_ldl_factor_ex.default": convert_linalg_ldl_factor_ex,
    "aten.linalg_ldl_solve.default": convert_linalg_ldl_solve,
    "aten.linalg_matrix_power.default": convert_linalg_matrix_power,
    "aten.matrix_power.default": convert_linalg_matrix_power,
    "aten.matrix_exp.default": convert_matrix_exp,
    "aten.linalg_matrix_exp.default": convert_matrix_exp,
    "aten.linalg_tensorinv.default": convert_linalg_tensorinv,
    "aten.linalg_tensorsolve.default": convert_linalg_tensorsolve,
    "aten.linalg_vander.default": convert_linalg_vander,
    "aten.linalg_householder_product.default": convert_linalg_householder_product,
    "aten.ormqr.default": convert_ormqr,
}
