"""Reduction pieces shared by families: the axes a dim argument names, the count of reduced elements,
NaN-propagating Max / Min reductions, and vector norms (also used by the matrix norms)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from fastonnx.context import ConversionContext, Value
from fastonnx.converters.lib.kernels import opmath_dtype
from fastonnx.converters.lib.ops import normalize_axis, reduce, unsqueeze

Axes = list[int] | None  # None: every axis


# ---- shared pieces ------------------------------------------------------------------------------
def reduce_axes(x: Value, dim: int | Sequence[int] | None) -> Axes:
    """Sorted non-negative axes, or None for all of them."""
    if x.rank == 0 or dim is None:
        return None
    dims = [dim] if isinstance(dim, int) else list(dim)
    if not dims:
        return None
    return sorted({normalize_axis(int(d), x.rank) for d in dims})


def prepared_for_norm(
    ctx: ConversionContext, x: Value, v: str, axes: Axes, keepdim: bool
) -> tuple[str, Axes, bool]:
    """A 0-d input becomes 1-D, reduced over all with keepdims off: the result is 0-d as in torch."""
    if x.rank == 0:
        return unsqueeze(ctx, v, [0]), None, False
    return v, axes, keepdim


def reduced_count(ctx: ConversionContext, x: Value, axes: Axes, dtype: torch.dtype) -> str:
    """The number of elements each output reduces over, as a 0-d ``dtype`` value."""
    picked = list(range(x.rank)) if axes is None else axes
    dims = [x.shape[a] for a in picked]
    if all(isinstance(d, int) for d in dims):
        n = 1
        for d in dims:
            n *= d
        return ctx.const(n, dtype)
    sizes = ctx.op("Gather", ctx.dims_of(x), ctx.i64(picked), axis=0)
    return ctx.cast(reduce(ctx, "ReduceProd", sizes, None, False), dtype)


def nan_reduce(ctx: ConversionContext, op_type: str, v: str, axes: Axes, keepdim: bool) -> str:
    """ReduceMax/Min that returns NaN where a NaN was reduced, as torch does (onnxruntime skips them)."""
    r = reduce(ctx, op_type, v, axes, keepdim)
    dtype = ctx.dtype(v)
    if dtype is None or not dtype.is_floating_point:
        return r
    flags = ctx.cast(ctx.op("IsNaN", v), torch.int32)
    seen = ctx.cast(reduce(ctx, "ReduceMax", flags, axes, keepdim), torch.bool)
    return ctx.op("Where", seen, ctx.const(float("nan"), dtype), r)


# ---- norms ------------------------------------------------------------------------------------------
def vector_norm_of(ctx: ConversionContext, x: Value, ord: float, dim: Any, keepdim: bool) -> str:
    out = ctx.out_dtype
    if not out.is_floating_point:
        raise ctx.error(f"vector norm of a {x.dtype} tensor is not supported (torch needs a float input)")
    compute = opmath_dtype(out)
    v = ctx.cast(ctx.cast(x, out), compute)  # dtype= casts the input first
    v, axes, keep = prepared_for_norm(ctx, x, v, reduce_axes(x, dim), keepdim)
    p = float(ord)
    if p == 2:
        r = reduce(ctx, "ReduceL2", v, axes, keep)
    elif p == 1:
        r = reduce(ctx, "ReduceL1", v, axes, keep)
    elif p == float("inf"):
        r = nan_reduce(ctx, "ReduceMax", ctx.op("Abs", v), axes, keep)
    elif p == float("-inf"):
        r = nan_reduce(ctx, "ReduceMin", ctx.op("Abs", v), axes, keep)
    elif p == 0:
        nz = ctx.op("Not", ctx.op("Equal", v, ctx.const(0, compute)))
        r = reduce(ctx, "ReduceSum", ctx.cast(nz, compute), axes, keep)
    else:
        powered = ctx.op("Pow", ctx.op("Abs", v), ctx.const(p, compute))
        r = ctx.op("Pow", reduce(ctx, "ReduceSum", powered, axes, keep), ctx.const(1.0 / p, compute))
    return ctx.cast(r, out)


def vector_norm(
    ctx: ConversionContext,
    x: Value,
    ord: float = 2,
    dim: Any = None,
    keepdim: bool = False,
    *,
    dtype: torch.dtype | None = None,
) -> str:
    return vector_norm_of(ctx, x, ord, dim, keepdim)


def axis_norm(ctx: ConversionContext, x: str, p: float, axis: int, keepdims: bool) -> str:
    """torch.linalg.vector_norm over one axis for p in {0, 1, 2, inf, -inf, other}, in x's own dtype and
    without NaN propagation: the distances' and embedding_renorm's form (``vector_norm_of`` is
    linalg.vector_norm's: in opmath, NaN-propagating max / min)."""
    if p == 2:
        return ctx.op("Sqrt", reduce(ctx, "ReduceSumSquare", x, [axis], keepdims))
    if p == 1:
        return reduce(ctx, "ReduceL1", x, [axis], keepdims)
    if p == math.inf:
        return reduce(ctx, "ReduceMax", ctx.op("Abs", x), [axis], keepdims)
    if p == -math.inf:
        return reduce(ctx, "ReduceMin", ctx.op("Abs", x), [axis], keepdims)
    dtype = ctx.dtype(x) or torch.float32
    if p == 0:
        nonzero = ctx.cast(ctx.op("Not", ctx.op("Equal", x, ctx.const(0, dtype))), dtype)
        return reduce(ctx, "ReduceSum", nonzero, [axis], keepdims)
    powered = ctx.op("Pow", ctx.op("Abs", x), ctx.const(p, dtype))
    return ctx.op("Pow", reduce(ctx, "ReduceSum", powered, [axis], keepdims), ctx.const(1.0 / p, dtype))
