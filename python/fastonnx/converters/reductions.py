"""Reductions (sum, mean, max, var, norms, any/all, arg-max...) and cumulative ops.

Conventions shared by every converter here:
- ``dim=None`` and ``dim=[]`` both mean "all dims" (torch's rule for sum/mean/amax...; any/all.dims
  with ``[]`` is the exception: it reduces nothing).
- A 0-d input is viewed as a 1-element 1-D tensor reduced over everything (torch accepts dim 0 / -1
  on it; ONNX has no axis to name).
- float16 / bfloat16 are computed in float32 and rounded once, as torch's CPU kernels accumulate.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from fastonnx import dtypes
from fastonnx.context import ConversionContext, Converter, Value
from fastonnx.converters.lib.kernels import opmath_dtype
from fastonnx.converters.lib.ops import normalize_axis, reduce, squeeze, unsqueeze
from fastonnx.converters.lib.reduction_graphs import (
    Axes,
    nan_reduce,
    prepared_for_norm,
    reduce_axes,
    reduced_count,
    vector_norm,
    vector_norm_of,
)

aten = torch.ops.aten


def _squeeze_reduced(ctx: ConversionContext, x: Value, v: str, axes: Axes) -> str:
    """Drop the reduced axes of a keepdims=1 result."""
    if x.rank == 0:
        return squeeze(ctx, v, [0]) if ctx.rank(v) == 1 else v
    return squeeze(ctx, v, axes if axes is not None else list(range(x.rank)))


def _nonzero(ctx: ConversionContext, x: Value) -> str:
    """``x != 0`` as bool (NaN counts as nonzero, as in torch)."""
    if x.dtype == torch.bool:
        return x.name
    if x.dtype.is_floating_point:
        v = ctx.cast(x, opmath_dtype(x.dtype))
        return ctx.op("Not", ctx.op("Equal", v, ctx.const(0, ctx.dtype(v) or torch.float32)))
    return ctx.cast(x, torch.bool)  # exact for integers


def _simple(
    op_type: str, x: Value, ctx: ConversionContext, dim: Any, keepdim: bool, dtype: torch.dtype
) -> str:
    """ReduceX computed in the opmath dtype of ``dtype`` (the input is cast to ``dtype`` first)."""
    # integers accumulate in int64 (a narrower result wraps the same way after the Cast); bool as int64
    # too (sum/prod with dtype=bool are any/all)
    compute = opmath_dtype(dtype) if dtype.is_floating_point else torch.int64
    v = ctx.cast(ctx.cast(x, dtype), compute)
    v, axes, keep = prepared_for_norm(ctx, x, v, reduce_axes(x, dim), keepdim)
    if op_type == "ReduceMean":
        return ctx.cast(_mean(ctx, x, v, axes, keep, compute), ctx.out_dtype)
    return ctx.cast(reduce(ctx, op_type, v, axes, keep), ctx.out_dtype)


def _mean(ctx: ConversionContext, x: Value, v: str, axes: Axes, keepdim: bool, dtype: torch.dtype) -> str:
    """ReduceMean when the reduced dims are known to be non-empty; otherwise sum / count, so that an empty
    reduction gives NaN as in torch (onnxruntime's ReduceMean does not)."""
    reduced = range(x.rank) if axes is None else axes
    if all(isinstance(x.shape[a], int) and x.shape[a] > 0 for a in reduced):
        return reduce(ctx, "ReduceMean", v, axes, keepdim)
    total = reduce(ctx, "ReduceSum", v, axes, keepdim)
    return ctx.op("Div", total, reduced_count(ctx, x, axes, dtype))


# ---- sum / mean / prod ----------------------------------------------------------------------------
def convert_sum(
    ctx: ConversionContext,
    x: Value,
    dim: Any = None,
    keepdim: bool = False,
    *,
    dtype: torch.dtype | None = None,
) -> str:
    # integer and bool inputs promote to int64 (in ctx.out_dtype)
    return _simple("ReduceSum", x, ctx, dim, keepdim, ctx.out_dtype)


def convert_sum_default(ctx: ConversionContext, x: Value, *, dtype: torch.dtype | None = None) -> str:
    return convert_sum(ctx, x)


def convert_mean(
    ctx: ConversionContext,
    x: Value,
    dim: Any = None,
    keepdim: bool = False,
    *,
    dtype: torch.dtype | None = None,
) -> str:
    return _simple("ReduceMean", x, ctx, dim, keepdim, ctx.out_dtype)


def convert_mean_default(ctx: ConversionContext, x: Value, *, dtype: torch.dtype | None = None) -> str:
    return convert_mean(ctx, x)


def convert_prod(
    ctx: ConversionContext, x: Value, dim: int | None = None, keepdim: bool = False, *, dtype: Any = None
) -> str:
    return _simple("ReduceProd", x, ctx, dim, keepdim, ctx.out_dtype)


def convert_prod_default(ctx: ConversionContext, x: Value, *, dtype: torch.dtype | None = None) -> str:
    return convert_prod(ctx, x)


def _without_nan(ctx: ConversionContext, x: Value, dtype: torch.dtype) -> str:
    v = ctx.cast(ctx.cast(x, dtype), opmath_dtype(dtype))
    if not dtype.is_floating_point:
        return v
    return ctx.op("Where", ctx.op("IsNaN", v), ctx.const(0, opmath_dtype(dtype)), v)


def convert_nansum(
    ctx: ConversionContext,
    x: Value,
    dim: Any = None,
    keepdim: bool = False,
    *,
    dtype: torch.dtype | None = None,
) -> str:
    out = ctx.out_dtype
    v, axes, keep = prepared_for_norm(ctx, x, _without_nan(ctx, x, out), reduce_axes(x, dim), keepdim)
    return ctx.cast(reduce(ctx, "ReduceSum", v, axes, keep), out)


def convert_nanmean(
    ctx: ConversionContext,
    x: Value,
    dim: Any = None,
    keepdim: bool = False,
    *,
    dtype: torch.dtype | None = None,
) -> str:
    out = ctx.out_dtype
    compute = opmath_dtype(out)
    v = ctx.cast(ctx.cast(x, out), compute)
    v, axes, keep = prepared_for_norm(ctx, x, v, reduce_axes(x, dim), keepdim)
    is_nan = ctx.op("IsNaN", v)
    total = reduce(ctx, "ReduceSum", ctx.op("Where", is_nan, ctx.const(0, compute), v), axes, keep)
    count = reduce(ctx, "ReduceSum", ctx.cast(ctx.op("Not", is_nan), compute), axes, keep)
    return ctx.cast(ctx.op("Div", total, count), out)


# ---- max / min --------------------------------------------------------------------------------------
def _minmax_dtype(dtype: torch.dtype) -> torch.dtype:
    """A dtype onnxruntime's ReduceMax/Min and ArgMax/Min accept that holds ``dtype`` exactly."""
    if dtype == torch.bool or dtype in (torch.int8, torch.int16, torch.uint8):
        return torch.int32
    return opmath_dtype(dtype)


def _extreme(ctx: ConversionContext, op_type: str, x: Value, dim: Any, keepdim: bool) -> str:
    v = ctx.cast(x, _minmax_dtype(x.dtype))
    v, axes, keep = prepared_for_norm(ctx, x, v, reduce_axes(x, dim), keepdim)
    return ctx.cast(nan_reduce(ctx, op_type, v, axes, keep), ctx.out_dtype)


def convert_amax(ctx: ConversionContext, x: Value, dim: Any = (), keepdim: bool = False) -> str:
    return _extreme(ctx, "ReduceMax", x, dim, keepdim)


def convert_amin(ctx: ConversionContext, x: Value, dim: Any = (), keepdim: bool = False) -> str:
    return _extreme(ctx, "ReduceMin", x, dim, keepdim)


def convert_max_all(ctx: ConversionContext, x: Value) -> str:
    return _extreme(ctx, "ReduceMax", x, None, False)


def convert_min_all(ctx: ConversionContext, x: Value) -> str:
    return _extreme(ctx, "ReduceMin", x, None, False)


def _arg(ctx: ConversionContext, op_type: str, x: Value, dim: int | None, keepdim: bool) -> str:
    """ArgMax/ArgMin returning torch's index: the first occurrence (select_last_index=0), and the first
    NaN where there is one (torch ranks NaN above everything, for both)."""
    v = ctx.cast(x, _minmax_dtype(x.dtype))
    flat = dim is None or x.rank == 0
    if flat:
        v = ctx.op("Reshape", v, ctx.i64([-1]))
    axis = 0 if dim is None or flat else normalize_axis(dim, x.rank)
    keep = 1 if keepdim and not flat else 0
    idx = ctx.op(op_type, v, axis=axis, keepdims=keep, select_last_index=0)
    if x.dtype.is_floating_point:
        flags = ctx.cast(ctx.op("IsNaN", v), torch.int32)
        first_nan = ctx.op("ArgMax", flags, axis=axis, keepdims=keep, select_last_index=0)
        seen = ctx.cast(reduce(ctx, "ReduceMax", flags, [axis], bool(keep)), torch.bool)
        idx = ctx.op("Where", seen, first_nan, idx)
    if flat and keepdim and x.rank > 0:
        idx = ctx.op("Reshape", idx, ctx.i64([1] * x.rank))
    return idx


def convert_argmax(ctx: ConversionContext, x: Value, dim: int | None = None, keepdim: bool = False) -> str:
    return _arg(ctx, "ArgMax", x, dim, keepdim)


def convert_argmin(ctx: ConversionContext, x: Value, dim: int | None = None, keepdim: bool = False) -> str:
    return _arg(ctx, "ArgMin", x, dim, keepdim)


def convert_max_dim(ctx: ConversionContext, x: Value, dim: int, keepdim: bool = False) -> list[str]:
    return [_extreme(ctx, "ReduceMax", x, dim, keepdim), _arg(ctx, "ArgMax", x, dim, keepdim)]


def convert_min_dim(ctx: ConversionContext, x: Value, dim: int, keepdim: bool = False) -> list[str]:
    return [_extreme(ctx, "ReduceMin", x, dim, keepdim), _arg(ctx, "ArgMin", x, dim, keepdim)]


def convert_aminmax(
    ctx: ConversionContext, x: Value, *, dim: int | None = None, keepdim: bool = False
) -> list[str]:
    return [_extreme(ctx, "ReduceMin", x, dim, keepdim), _extreme(ctx, "ReduceMax", x, dim, keepdim)]


# ---- var / std --------------------------------------------------------------------------------------
def var_mean(
    ctx: ConversionContext, x: Value, dim: Any, correction: float, keepdim: bool, dtype: torch.dtype
) -> tuple[str, str]:
    """(variance, mean) in ``dtype`` with torch's divisor max(N - correction, 0), two-pass."""
    if not dtype.is_floating_point:
        raise ctx.error(f"var/std of a {x.dtype} tensor is not supported (torch needs a float input)")
    compute = opmath_dtype(dtype)
    axes = reduce_axes(x, dim)
    v, axes_p, keep = prepared_for_norm(ctx, x, ctx.cast(x, compute), axes, keepdim)
    mean = _mean(ctx, x, v, axes_p, True, compute)
    d = ctx.op("Sub", v, mean)
    ss = reduce(ctx, "ReduceSum", ctx.op("Mul", d, d), axes_p, keep)
    n = reduced_count(ctx, x, axes, compute)
    divisor = ctx.op("Max", ctx.op("Sub", n, ctx.const(correction, compute)), ctx.const(0, compute))
    var = ctx.op("Div", ss, divisor)
    if not keep:
        mean = squeeze(ctx, mean, axes_p if axes_p is not None else list(range(max(x.rank, 1))))
    return ctx.cast(var, dtype), ctx.cast(mean, dtype)


def _variance(with_sqrt: bool, with_mean: bool) -> tuple[Any, Any, Any]:
    """Converters for the .default, .dim and .correction overloads of var / std / var_mean / std_mean."""

    def compute(ctx: ConversionContext, x: Value, dim: Any, correction: float, keepdim: bool) -> Any:
        out = ctx.out_dtype
        var, mean = var_mean(ctx, x, dim, correction, keepdim, opmath_dtype(out))
        result = ctx.cast(ctx.op("Sqrt", var) if with_sqrt else var, out)
        return [result, ctx.cast(mean, out)] if with_mean else result

    def default(ctx: ConversionContext, x: Value, unbiased: bool = True) -> Any:
        return compute(ctx, x, None, 1.0 if unbiased else 0.0, False)

    def by_dim(
        ctx: ConversionContext, x: Value, dim: Any, unbiased: bool = True, keepdim: bool = False
    ) -> Any:
        return compute(ctx, x, dim, 1.0 if unbiased else 0.0, keepdim)

    def by_correction(
        ctx: ConversionContext,
        x: Value,
        dim: Any = None,
        *,
        correction: float | None = None,
        keepdim: bool = False,
    ) -> Any:
        return compute(ctx, x, dim, 1.0 if correction is None else float(correction), keepdim)

    return default, by_dim, by_correction


convert_var, convert_var_dim, convert_var_correction = _variance(with_sqrt=False, with_mean=False)
convert_std, convert_std_dim, convert_std_correction = _variance(with_sqrt=True, with_mean=False)
convert_var_mean, convert_var_mean_dim, convert_var_mean_correction = _variance(
    with_sqrt=False, with_mean=True
)
convert_std_mean, convert_std_mean_dim, convert_std_mean_correction = _variance(
    with_sqrt=True, with_mean=True
)


def convert_norm(
    ctx: ConversionContext,
    x: Value,
    p: float | None = 2,
    dim: Any = None,
    keepdim: bool = False,
    *,
    dtype: torch.dtype | None = None,
) -> str:
    return vector_norm_of(ctx, x, 2 if p is None else p, dim, keepdim)


def convert_norm_dtype(ctx: ConversionContext, x: Value, p: float | None, *, dtype: torch.dtype) -> str:
    return vector_norm_of(ctx, x, 2 if p is None else p, None, False)


# ---- any / all / count_nonzero ------------------------------------------------------------------------
def _any_all(ctx: ConversionContext, x: Value, dim: Any, keepdim: bool, want_all: bool) -> str:
    if isinstance(dim, (list, tuple)) and len(dim) == 0 and x.rank > 0:
        return ctx.cast(_nonzero(ctx, x), ctx.out_dtype)  # any/all.dims with []: no reduction
    flags = _nonzero(ctx, x)
    if want_all:
        flags = ctx.op("Not", flags)
    # counting (not ReduceMax) keeps empty reductions right: any([]) is False, all([]) is True
    v, axes, keep = prepared_for_norm(ctx, x, ctx.cast(flags, torch.int64), reduce_axes(x, dim), keepdim)
    count = reduce(ctx, "ReduceSum", v, axes, keep)
    zero = ctx.const(0, torch.int64)
    result = ctx.op("Equal", count, zero) if want_all else ctx.op("Greater", count, zero)
    return ctx.cast(result, ctx.out_dtype)


def convert_any(ctx: ConversionContext, x: Value, dim: Any = None, keepdim: bool = False) -> str:
    return _any_all(ctx, x, dim, keepdim, want_all=False)


def convert_all(ctx: ConversionContext, x: Value, dim: Any = None, keepdim: bool = False) -> str:
    return _any_all(ctx, x, dim, keepdim, want_all=True)


def convert_count_nonzero(ctx: ConversionContext, x: Value, dim: Any = None) -> str:
    v, axes, _ = prepared_for_norm(
        ctx, x, ctx.cast(_nonzero(ctx, x), torch.int64), reduce_axes(x, dim), False
    )
    return reduce(ctx, "ReduceSum", v, axes, False)


# ---- logsumexp --------------------------------------------------------------------------------------
def _stable_max(ctx: ConversionContext, v: str, axes: Axes, dtype: torch.dtype) -> str:
    """max over ``axes`` (kept), with infinities replaced by 0 as torch does before subtracting it."""
    m = reduce(ctx, "ReduceMax", v, axes, True)
    return ctx.op("Where", ctx.op("IsInf", m), ctx.const(0, dtype), m)


def convert_logsumexp(ctx: ConversionContext, x: Value, dim: Any = (), keepdim: bool = False) -> str:
    out = ctx.out_dtype  # integer inputs give the default float dtype
    compute = opmath_dtype(out)
    v, axes, keep = prepared_for_norm(ctx, x, ctx.cast(x, compute), reduce_axes(x, dim), keepdim)
    m = _stable_max(ctx, v, axes, compute)
    s = reduce(ctx, "ReduceSum", ctx.op("Exp", ctx.op("Sub", v, m)), axes, True)
    r = ctx.op("Add", ctx.op("Log", s), m)
    if not keep:
        r = squeeze(ctx, r, axes if axes is not None else list(range(max(x.rank, 1))))
    return ctx.cast(r, out)


# ---- cumulative ops -----------------------------------------------------------------------------------
def convert_cumsum(ctx: ConversionContext, x: Value, dim: int, *, dtype: torch.dtype | None = None) -> str:
    out = ctx.out_dtype  # integer and bool inputs promote to int64
    compute = opmath_dtype(out)
    if out in (torch.int8, torch.int16, torch.uint8):
        compute = torch.int64  # CumSum kernels: float, double, int32, int64; wraps like torch after Cast
    v = ctx.cast(ctx.cast(x, out), compute)
    if x.rank == 0:
        return ctx.cast(ctx.op("Identity", v), out)
    axis = normalize_axis(dim, x.rank)
    return ctx.cast(ctx.op("CumSum", v, ctx.i64(axis)), out)


def _triangle(ctx: ConversionContext, v: str, x: Value, axis: int, fill: str) -> str:
    """T[..., i, j, ...] = v[..., j, ...] if j <= i else ``fill``, i at ``axis``, j at ``axis + 1``.

    Reducing T over ``axis + 1`` gives an inclusive scan along ``axis`` for any associative reduction,
    exactly (no logs, zeros and signs kept), at the cost of n times the input's memory.
    """
    n = x.shape[axis]
    limit = ctx.const(n, torch.int64) if isinstance(n, int) else ctx.sym_value(n)
    idx = ctx.op("Range", ctx.const(0, torch.int64), limit, ctx.const(1, torch.int64))
    mask = ctx.op("LessOrEqual", unsqueeze(ctx, idx, [0]), unsqueeze(ctx, idx, [1]))  # [i, j]: j <= i
    trailing = x.rank - axis - 1
    if trailing:
        mask = unsqueeze(ctx, mask, list(range(2, 2 + trailing)))
    return ctx.op("Where", mask, unsqueeze(ctx, v, [axis]), fill)


def convert_cumprod(ctx: ConversionContext, x: Value, dim: int, *, dtype: torch.dtype | None = None) -> str:
    out = ctx.out_dtype
    compute = opmath_dtype(out)
    if not out.is_floating_point:
        compute = torch.int64
    v = ctx.cast(ctx.cast(x, out), compute)
    if x.rank == 0:
        return ctx.cast(ctx.op("Identity", v), out)
    axis = normalize_axis(dim, x.rank)
    t = _triangle(ctx, v, x, axis, ctx.const(1, compute))
    return ctx.cast(reduce(ctx, "ReduceProd", t, [axis + 1], False), out)


def convert_logcumsumexp(ctx: ConversionContext, x: Value, dim: int) -> str:
    out = ctx.out_dtype
    compute = opmath_dtype(out)
    v = ctx.cast(x, compute)
    if x.rank == 0:
        return ctx.cast(ctx.op("Identity", v), out)
    axis = normalize_axis(dim, x.rank)
    # a per-prefix max keeps every prefix stable (one global max would underflow small prefixes)
    t = _triangle(ctx, v, x, axis, ctx.const(float("-inf"), compute))
    m = _stable_max(ctx, t, [axis + 1], compute)
    s = reduce(ctx, "ReduceSum", ctx.op("Exp", ctx.op("Sub", t, m)), [axis + 1], True)
    r = ctx.op("Add", ctx.op("Log", s), m)
    return ctx.cast(squeeze(ctx, r, [axis + 1]), out)


def _cum_extreme(ctx: ConversionContext, x: Value, dim: int, op_type: str) -> list[str]:
    """cummax / cummin: (values, indices) with torch's rules: ties and NaNs move the index to the
    latest position, and a NaN, once seen, stays the value."""
    dtype = _minmax_dtype(x.dtype)
    v = ctx.cast(x, dtype)
    if x.rank == 0:
        return [ctx.op("Identity", x), ctx.const(0, torch.int64)]
    axis = normalize_axis(dim, x.rank)
    j = axis + 1
    if dtype.is_floating_point:
        fill = float("-inf") if op_type == "ReduceMax" else float("inf")
    else:
        info = torch.iinfo(dtype)
        fill = info.min if op_type == "ReduceMax" else info.max
    t = _triangle(ctx, v, x, axis, ctx.const(fill, dtype))  # [..., i, j, ...]
    values = nan_reduce(ctx, op_type, t, [j], True)
    hit = ctx.op("Equal", t, values)
    if dtype.is_floating_point:
        both_nan = ctx.op("And", ctx.op("IsNaN", t), ctx.op("IsNaN", values))
        hit = ctx.op("Or", hit, both_nan)
    # the latest j <= i holding the running extreme (positions j > i hold the fill and never win,
    # except when the fill itself is the extreme: then j <= i also holds it, mask them out)
    n = x.shape[axis]
    limit = ctx.const(n, torch.int64) if isinstance(n, int) else ctx.sym_value(n)
    pos = ctx.op("Range", ctx.const(0, torch.int64), limit, ctx.const(1, torch.int64))
    after = ctx.op("Greater", unsqueeze(ctx, pos, [0]), unsqueeze(ctx, pos, [1]))  # [i, j]: j > i
    trailing = x.rank - axis - 1
    if trailing:
        pos_j = unsqueeze(ctx, pos, list(range(1, 1 + trailing)))
        after = unsqueeze(ctx, after, list(range(2, 2 + trailing)))
    else:
        pos_j = pos
    hit = ctx.op("And", hit, ctx.op("Not", after))
    candidates = ctx.op("Where", hit, pos_j, ctx.const(-1, torch.int64))
    indices = reduce(ctx, "ReduceMax", candidates, [j], False)
    return [ctx.cast(squeeze(ctx, values, [j]), x.dtype), indices]


def convert_cummax(ctx: ConversionContext, x: Value, dim: int) -> list[str]:
    return _cum_extreme(ctx, x, dim, "ReduceMax")


def convert_cummin(ctx: ConversionContext, x: Value, dim: int) -> list[str]:
    return _cum_extreme(ctx, x, dim, "ReduceMin")


# ---- sum_to_size, renorm ------------------------------------------------------------------------------
def convert_sum_to_size(ctx: ConversionContext, x: Value, size: Sequence[Any]) -> str:
    """Sums the leading dims away and the dims that ``size`` has as 1 (broadcasting's inverse)."""
    lead = x.rank - len(size)
    axes = list(range(lead)) + [lead + i for i, s in enumerate(size) if s == 1 and x.shape[lead + i] != 1]
    dtype = ctx.out_dtype
    if not axes:
        return ctx.op("Identity", ctx.cast(x, dtype))
    compute = opmath_dtype(dtype) if dtype.is_floating_point else torch.int64
    summed = reduce(ctx, "ReduceSum", ctx.cast(x, compute), axes, keepdims=True)
    if lead:
        summed = squeeze(ctx, summed, list(range(lead)))
    return ctx.cast(summed, dtype)


def convert_renorm(ctx: ConversionContext, x: Value, p: float, dim: int, maxnorm: float) -> str:
    """Each slice along ``dim`` whose p-norm exceeds ``maxnorm`` is scaled by maxnorm / (norm + 1e-7)."""
    dtype = ctx.out_dtype
    compute = opmath_dtype(dtype)
    axis = normalize_axis(dim, x.rank)
    others = [a for a in range(x.rank) if a != axis]
    norm = _vector_norm_as(ctx, x, float(p), others, compute)
    maxn = ctx.const(maxnorm, compute)
    scale = ctx.op("Div", maxn, ctx.op("Add", norm, ctx.const(1e-7, compute)))
    factor = ctx.op("Where", ctx.op("Greater", norm, maxn), scale, ctx.const(1.0, compute))
    return ctx.cast(ctx.op("Mul", ctx.cast(x, compute), factor), dtype)


def _vector_norm_as(ctx: ConversionContext, x: Value, p: float, axes: list[int], compute: torch.dtype) -> str:
    """The p-norm over ``axes`` (kept as 1s) in ``compute``. No axes (renorm of a 1-D tensor: each
    slice is one element) gives the element's own norm."""
    v = ctx.cast(x, compute)
    if not axes:
        if p == 0:
            return ctx.cast(ctx.op("Not", ctx.op("Equal", v, ctx.const(0, compute))), compute)
        return ctx.op("Abs", v)
    if p == 2:
        return reduce(ctx, "ReduceL2", v, axes, True)
    if p == 1:
        return reduce(ctx, "ReduceL1", v, axes, True)
    if p == float("inf"):
        return nan_reduce(ctx, "ReduceMax", ctx.op("Abs", v), axes, True)
    if p == float("-inf"):
        return nan_reduce(ctx, "ReduceMin", ctx.op("Abs", v), axes, True)
    if p == 0:
        nz = ctx.op("Not", ctx.op("Equal", v, ctx.const(0, compute)))
        return reduce(ctx, "ReduceSum", ctx.cast(nz, compute), axes, True)
    powered = ctx.op("Pow", ctx.op("Abs", v), ctx.const(p, compute))
    return ctx.op("Pow", reduce(ctx, "ReduceSum", powered, axes, True), ctx.const(1.0 / p, compute))


# ---- differences and integration ----------------------------------------------------------------------
def _slice(ctx: ConversionContext, v: str, axis: int, start: int, end: int) -> str:
    return ctx.op("Slice", v, ctx.i64([start]), ctx.i64([end]), ctx.i64([axis]))


_END = 2**63 - 1


def _zeros_out(ctx: ConversionContext) -> str | None:
    """Zeros of the output's static shape when there is nothing to compute (an empty dim)."""
    shape = ctx.out_shape
    if all(isinstance(d, int) for d in shape):
        return ctx.op("ConstantOfShape", ctx.i64(list(shape)), value=ctx.tensor_attr(0, ctx.out_dtype))
    return None


def convert_diff(
    ctx: ConversionContext,
    x: Value,
    n: int = 1,
    dim: int = -1,
    prepend: Value | None = None,
    append: Value | None = None,
) -> str:
    """``n`` times ``v[1:] - v[:-1]`` along ``dim`` of ``cat(prepend, x, append)``; bool gives ``!=``."""
    dtype = ctx.out_dtype
    if n == 0:
        return ctx.op("Identity", x)  # torch returns the input itself, without prepend / append
    axis = normalize_axis(dim, x.rank)
    parts = [ctx.cast(t, dtype) for t in (prepend, x, append) if t is not None]
    v = parts[0] if len(parts) == 1 else ctx.op("Concat", *parts, axis=axis)
    for _ in range(n):
        right, left = _slice(ctx, v, axis, 1, _END), _slice(ctx, v, axis, 0, -1)
        v = ctx.op("Xor" if dtype == torch.bool else "Sub", right, left)
    return v


def _x_spacing(ctx: ConversionContext, y: Value, x: Value, axis: int, dtype: torch.dtype) -> str:
    """``x[1:] - x[:-1]`` along ``axis``, with a 1-D ``x`` laid along ``axis`` of ``y`` and a
    lower-rank ``x`` padded with leading 1s (torch broadcasts the differences, not ``x``)."""
    v = ctx.cast(x, dtype)
    if x.rank == 1:
        shape = [1] * y.rank
        shape[axis] = -1
        v = ctx.op("Reshape", v, ctx.i64(shape))
    elif x.rank < y.rank:
        v = unsqueeze(ctx, v, list(range(y.rank - x.rank)))
    return ctx.op("Sub", _slice(ctx, v, axis, 1, _END), _slice(ctx, v, axis, 0, -1))


def _pair_sum(ctx: ConversionContext, y: str, axis: int) -> str:
    return ctx.op("Add", _slice(ctx, y, axis, 1, _END), _slice(ctx, y, axis, 0, -1))


def _trapezoid(cumulative: bool, with_x: bool) -> Any:
    def convert(ctx: ConversionContext, y: Value, x: Any = None, *, dx: Any = 1, dim: int = -1) -> str:
        dtype = ctx.out_dtype
        axis = normalize_axis(dim, y.rank)
        if y.shape[axis] == 0 or (cumulative and any(d == 0 for d in ctx.out_shape)):
            zeros = _zeros_out(ctx)
            if zeros is not None:
                return zeros
        compute = opmath_dtype(dtype)
        v = ctx.cast(ctx.cast(y, dtype), compute)
        two = ctx.const(2.0, compute)
        if with_x:
            spacing = _x_spacing(ctx, y, x, axis, compute)
            terms = ctx.op("Div", ctx.op("Mul", spacing, _pair_sum(ctx, v, axis)), two)
        elif cumulative:
            terms = ctx.op("Mul", ctx.op("Div", ctx.operand(dx, compute), two), _pair_sum(ctx, v, axis))
        else:
            # torch: (sum(y) - (y[0] + y[-1]) * 0.5) * dx
            total = reduce(ctx, "ReduceSum", v, [axis], keepdims=False)
            ends = ctx.op("Add", _select(ctx, v, axis, 0), _select(ctx, v, axis, -1))
            inner = ctx.op("Sub", total, ctx.op("Mul", ends, ctx.const(0.5, compute)))
            return ctx.cast(ctx.op("Mul", inner, ctx.operand(dx, compute)), dtype)
        if cumulative:
            return ctx.cast(ctx.op("CumSum", terms, ctx.i64(axis)), dtype)
        return ctx.cast(reduce(ctx, "ReduceSum", terms, [axis], keepdims=False), dtype)

    convert.__name__ = f"convert_{'cumulative_' if cumulative else ''}trapezoid_{'x' if with_x else 'dx'}"
    return convert


def _select(ctx: ConversionContext, v: str, axis: int, index: int) -> str:
    return ctx.op("Gather", v, ctx.i64(index), axis=axis)


# ---- gradient -------------------------------------------------------------------------------------------
def convert_gradient(
    ctx: ConversionContext,
    x: Value,
    *,
    spacing: Any = None,
    dim: Any = None,
    edge_order: int = 1,
) -> list[str]:
    """numpy.gradient as torch computes it: central differences inside, one-sided differences of order
    ``edge_order`` at both ends, for uniform (scalar) spacings or coordinate tensors."""
    dims = list(range(x.rank)) if dim is None else ([dim] if isinstance(dim, int) else list(dim))
    if spacing is None:
        spacings: list[Any] = [1.0] * len(dims)
    elif isinstance(spacing, (list, tuple)):
        spacings = list(spacing) * len(dims) if len(spacing) == 1 else list(spacing)
    else:
        spacings = [spacing] * len(dims)
    if len(spacings) != len(dims):
        raise ctx.error("gradient: spacing must give one entry per dim")
    if edge_order not in (1, 2):
        raise ctx.error("gradient: edge_order must be 1 or 2")
    outs = []
    for i, (d, h) in enumerate(zip(dims, spacings)):
        dtype = _output_dtype(ctx, i)
        axis = normalize_axis(d, x.rank)
        v = ctx.cast(x, dtype)
        if isinstance(h, Value):
            outs.append(_gradient_coords(ctx, v, x.rank, axis, ctx.cast(h, dtype), edge_order, dtype))
        else:
            outs.append(_gradient_uniform(ctx, v, axis, h, edge_order, dtype))
    return outs


def _output_dtype(ctx: ConversionContext, i: int) -> torch.dtype:
    out = ctx.out
    return out[i].dtype if isinstance(out, (list, tuple)) else ctx.out_dtype


def _gradient_uniform(
    ctx: ConversionContext, v: str, axis: int, h: Any, edge_order: int, dt: torch.dtype
) -> str:
    def sl(start: int, end: int) -> str:
        return _slice(ctx, v, axis, start, end)

    def c(value: float) -> str:
        return ctx.const(value, dt)

    hh = ctx.operand(h, dt)
    center = ctx.op("Div", ctx.op("Div", ctx.op("Sub", sl(2, _END), sl(0, -2)), hh), c(2.0))
    if edge_order == 1:
        first = ctx.op("Div", ctx.op("Sub", sl(1, 2), sl(0, 1)), hh)
        last = ctx.op("Div", ctx.op("Sub", sl(-1, _END), sl(-2, -1)), hh)
    else:
        first = ctx.op(
            "Sub",
            ctx.op("Add", ctx.op("Mul", sl(0, 1), c(-1.5)), ctx.op("Mul", sl(1, 2), c(2.0))),
            ctx.op("Mul", sl(2, 3), c(0.5)),
        )
        first = ctx.op("Div", first, hh)
        last = ctx.op(
            "Add",
            ctx.op("Add", ctx.op("Mul", sl(-3, -2), c(0.5)), ctx.op("Mul", sl(-2, -1), c(-2.0))),
            ctx.op("Mul", sl(-1, _END), c(1.5)),
        )
        last = ctx.op("Div", last, hh)
    return ctx.op("Concat", first, center, last, axis=axis)


def _gradient_coords(
    ctx: ConversionContext, v: str, rank: int, axis: int, coords: str, edge_order: int, dt: torch.dtype
) -> str:
    def sl(start: int, end: int) -> str:
        return _slice(ctx, v, axis, start, end)

    def at(t: str, i: int) -> str:
        return ctx.op("Gather", t, ctx.i64(i), axis=0)

    def along(t: str) -> str:
        shape = [1] * rank
        shape[axis] = -1
        return ctx.op("Reshape", t, ctx.i64(shape))

    def binary(op: str) -> Callable[[str, str], str]:
        return lambda a, b: ctx.op(op, a, b)

    mul, add, sub, div = (binary(op) for op in ("Mul", "Add", "Sub", "Div"))
    dx = sub(_slice(ctx, coords, 0, 1, _END), _slice(ctx, coords, 0, 0, -1))
    dx1, dx2 = _slice(ctx, dx, 0, 0, -1), _slice(ctx, dx, 0, 1, _END)
    a = along(div(ctx.op("Neg", dx2), mul(dx1, add(dx1, dx2))))
    b = along(div(sub(dx2, dx1), mul(dx1, dx2)))
    c = along(div(dx1, mul(dx2, add(dx1, dx2))))
    center = add(add(mul(a, sl(0, -2)), mul(b, sl(1, -1))), mul(c, sl(2, _END)))
    d0, d1, dm1, dm2 = at(dx, 0), at(dx, 1), at(dx, -1), at(dx, -2)
    if edge_order == 1:
        first = div(sub(sl(1, 2), sl(0, 1)), d0)
        last = div(sub(sl(-1, _END), sl(-2, -1)), dm1)
    else:
        two = ctx.const(2.0, dt)
        fa = ctx.op("Neg", div(add(mul(two, d0), d1), mul(d0, add(d0, d1))))
        fb = div(add(d0, d1), mul(d0, d1))
        fc = div(ctx.op("Neg", d0), mul(d1, add(d0, d1)))
        first = add(add(mul(fa, sl(0, 1)), mul(fb, sl(1, 2))), mul(fc, sl(2, 3)))
        la = div(dm1, mul(dm2, add(dm1, dm2)))
        lb = ctx.op("Neg", div(add(dm1, dm2), mul(dm1, dm2)))
        lc = div(add(mul(two, dm1), dm2), mul(dm1, add(dm1, dm2)))
        last = add(add(mul(la, sl(-3, -2)), mul(lb, sl(-2, -1))), mul(lc, sl(-1, _END)))
    return ctx.op("Concat", first, center, last, axis=axis)


# ---- hash_tensor ----------------------------------------------------------------------------------------
def convert_hash_tensor(
    ctx: ConversionContext, x: Value, dim: Sequence[int] = (), *, keepdim: bool = False, mode: int = 0
) -> str:
    """torch.hash_tensor (mode 0): the XOR of the 64-bit patterns of the values, taken as int64 for
    integers and bool and as float64 for floats. ONNX has no XOR reduction: each of the 64 bits is
    summed separately, its parity kept, and the bits put back together (disjoint bits: a sum is an OR)."""
    if mode != 0:
        raise ctx.error(f"hash_tensor mode={mode} is not supported (only 0, xor_sum)")
    if x.dtype.is_complex:
        raise ctx.error("hash_tensor of complex tensors is not supported")
    if x.dtype.is_floating_point:
        ctx.require_opset(26, "hash_tensor of a floating point tensor (BitCast)")
        bits = ctx.op("BitCast", ctx.cast(x, torch.float64), to=dtypes.to_onnx_dtype(torch.int64))
    else:
        bits = ctx.cast(x, torch.int64)
    u = ctx.cast(bits, torch.uint64)
    if x.rank == 0:
        u = unsqueeze(ctx, u, [0])
    rank = max(x.rank, 1)
    shifts = ctx.const(torch.arange(64, dtype=torch.int64), torch.uint64)
    shifted = ctx.op("BitShift", unsqueeze(ctx, u, [rank]), shifts, direction="RIGHT")
    one_bit = ctx.op("Mod", shifted, ctx.const(2, torch.uint64))
    axes = reduce_axes(x, dim) if x.rank else None
    axes = list(range(rank)) if axes is None else axes
    keep = keepdim and x.rank > 0
    counts = reduce(ctx, "ReduceSum", ctx.cast(one_bit, torch.int64), axes, keepdims=keep)
    last = rank if keep else rank - len(axes)  # the bit axis of the counts
    parity = ctx.cast(ctx.op("Mod", counts, ctx.i64(2)), torch.uint64)
    placed = ctx.cast(ctx.op("BitShift", parity, shifts, direction="LEFT"), torch.int64)
    # onnxruntime's int64 ReduceSum is not exact near 2**63: sum runs of 16 bits (16 significant bits,
    # exact), then add the four partial sums elementwise (int64 Add wraps exactly)
    lead = ctx.op("Shape", placed, start=0, end=last)
    groups = ctx.op("Reshape", placed, ctx.op("Concat", lead, ctx.i64([4, 16]), axis=0))
    partial = reduce(ctx, "ReduceSum", groups, [last + 1], keepdims=False)
    out = None
    for i in range(4):
        piece = ctx.op("Gather", partial, ctx.i64(i), axis=last)
        out = piece if out is None else ctx.op("Add", out, piece)
    return ctx.cast(out, torch.uint64)


CONVERTERS: dict[str, Converter] = {
    "aten.sum.dim_IntList": convert_sum,
    "aten.sum.default": convert_sum_default,
    "aten.mean.dim": convert_mean,
    "aten.mean.default": convert_mean_default,
    "aten.prod.dim_int": convert_prod,
    "aten.prod.default": convert_prod_default,
    "aten.nansum.default": convert_nansum,
    "aten.nanmean.default": convert_nanmean,
    "aten.amax.default": convert_amax,
    "aten.amin.default": convert_amin,
    "aten.max.default": convert_max_all,
    "aten.min.default": convert_min_all,
    "aten.max.dim": convert_max_dim,
    "aten.min.dim": convert_min_dim,
    "aten.aminmax.default": convert_aminmax,
    "aten.argmax.default": convert_argmax,
    "aten.argmin.default": convert_argmin,
    "aten.var.default": convert_var,
    "aten.var.dim": convert_var_dim,
    "aten.var.correction": convert_var_correction,
    "aten.std.default": convert_std,
    "aten.std.dim": convert_std_dim,
    "aten.std.correction": convert_std_correction,
    "aten.var_mean.default": convert_var_mean,
    "aten.var_mean.dim": convert_var_mean_dim,
    "aten.var_mean.correction": convert_var_mean_correction,
    "aten.std_mean.default": convert_std_mean,
    "aten.std_mean.dim": convert_std_mean_dim,
    "aten.std_mean.correction": convert_std_mean_correction,
    "aten.linalg_vector_norm.default": vector_norm,
    "aten.norm.Scalar": convert_norm,
    "aten.norm.ScalarOpt_dim": convert_norm,
    "aten.norm.ScalarOpt_dim_dtype": convert_norm,
    "aten.norm.ScalarOpt_dtype": convert_norm_dtype,
    "aten.any.default": convert_any,
    "aten.any.dim": convert_any,
    "aten.any.dims": convert_any,
    "aten.all.default": convert_all,
    "aten.all.dim": convert_all,
    "aten.all.dims": convert_all,
    "aten._is_all_true.default": convert_all,
    "aten.count_nonzero.default": convert_count_nonzero,
    "aten.count_nonzero.dim_IntList": convert_count_nonzero,
    "aten.logsumexp.default": convert_logsumexp,
    "aten.cumsum.default": convert_cumsum,
    "aten.cumprod.default": convert_cumprod,
    "aten.logcumsumexp.default": convert_logcumsumexp,
    "aten.cummax.default": convert_cummax,
    "aten.cummin.default": convert_cummin,
    "aten.sum_to_size.default": convert_sum_to_size,
    "aten.hash_tensor.default": convert_hash_tensor,
    "aten.renorm.default": convert_renorm,
    "aten.diff.default": convert_diff,
    "aten.trapezoid.x": _trapezoid(False, True),
    "aten.trapezoid.dx": _trapezoid(False, False),
    "aten.trapz.x": _trapezoid(False, True),
    "aten.trapz.dx": _trapezoid(False, False),
    "aten.cumulative_trapezoid.x": _trapezoid(True, True),
    "aten.cumulative_trapezoid.dx": _trapezoid(True, False),
    "aten.gradient.scalarint": convert_gradient,
    "aten.gradient.scalararray": convert_gradient,
    "aten.gradient.array": convert_gradient,
    "aten.gradient.scalarrayint": convert_gradient,
    "aten.gradient.scalarrayarray": convert_gradient,
    "aten.gradient.tensorarrayint": convert_gradient,
    "aten.gradient.tensorarray": convert_gradient,
}
