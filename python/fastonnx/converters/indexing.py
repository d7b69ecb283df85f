"""Indexing: gather / scatter families, advanced indexing, index_put, sorting, nonzero, one_hot.

Advanced indexing (``x[idx]``, ``x[:, i, j]``) follows torch: one index tensor is a Gather; several
are broadcast, stacked and read with GatherND after moving the indexed dims to the front. When the
indexed dims are adjacent torch puts the broadcast dims where they were, otherwise in front.
Boolean masks become integer indices through NonZero, as torch itself does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from fastonnx.context import ConversionContext, Converter, Value
from fastonnx.converters.lib.kernels import NATIVE
from fastonnx.converters.lib.ops import normalize_axis, unsqueeze, where
from fastonnx.converters.lib.ops import reduce as helper_reduce
from fastonnx.converters.lib.shape_graphs import (
    INT64_MAX,
    diagonal_positions,
    dim_scalar,
    is_static,
    slice_axis,
    transpose,
)

aten = torch.ops.aten

_MASK_DTYPES = (torch.bool, torch.uint8)


# ---- helpers ----------------------------------------------------------------------------------------
def _index_i64(ctx: ConversionContext, index: Any) -> str:
    return ctx.cast(index, torch.int64)


def _mask_to_indices(ctx: ConversionContext, mask: Value) -> list[Value]:
    """A k-D boolean mask as k 1-D int64 index tensors (the rows of NonZero), as torch does.
    Their length is data-dependent (None in the Value's shape)."""
    nz = ctx.op("NonZero", ctx.cast(mask, torch.bool))
    return [Value(ctx.op("Gather", nz, ctx.i64(r), axis=0), torch.int64, (None,)) for r in range(mask.rank)]


def _expand_masks(ctx: ConversionContext, indices: Sequence[Any]) -> tuple[list[Any], bool]:
    out: list[Any] = []
    had_mask = False
    for ix in indices:
        if isinstance(ix, Value) and ix.dtype in _MASK_DTYPES:
            had_mask = True
            out.extend(_mask_to_indices(ctx, ix))
        else:
            out.append(ix)
    return out, had_mask


def _positions(indices: Sequence[Any]) -> tuple[list[int], bool]:
    pos = [i for i, ix in enumerate(indices) if ix is not None]
    adjacent = pos == list(range(pos[0], pos[0] + len(pos)))
    return pos, adjacent


def _stacked(ctx: ConversionContext, indices: Sequence[Any], bshape: str | None) -> str:
    """The index tensors broadcast to ``bshape`` and stacked on a new last axis: [B..., k]."""
    cols = []
    for ix in indices:
        v = _index_i64(ctx, ix)
        if bshape is not None:
            v = ctx.op("Expand", v, bshape)
        cols.append(ctx.op("Unsqueeze", v, ctx.i64([-1])))
    return cols[0] if len(cols) == 1 else ctx.op("Concat", *cols, axis=-1)


def _broadcast_static(indices: Sequence[Any]) -> tuple[int, ...] | None:
    shapes = []
    for ix in indices:
        if not isinstance(ix, Value) or ix.static_shape() is None:
            return None
        shapes.append(ix.static_shape())
    return tuple(torch.broadcast_shapes(*shapes))


def _runtime_broadcast(ctx: ConversionContext, indices: Sequence[Any]) -> str:
    """The broadcast shape of index tensors at runtime (Expand broadcasts both ways)."""
    acc = _index_i64(ctx, indices[0])
    for ix in indices[1:]:
        acc = ctx.op("Expand", acc, ctx.op("Shape", ix))
    return ctx.op("Shape", acc)


# ---- advanced indexing ------------------------------------------------------------------------------
def convert_index(ctx: ConversionContext, x: Value, indices: Sequence[Any]) -> str:
    idx, _ = _expand_masks(ctx, indices)
    if all(ix is None for ix in idx):
        return ctx.op("Identity", x)
    pos, adjacent = _positions(idx)
    if len(pos) == 1:
        return ctx.op("Gather", x, idx[pos[0]], axis=pos[0])
    used = [idx[p] for p in pos]
    static_b = _broadcast_static(used)
    if static_b is not None:
        bshape: str | None = ctx.i64(list(static_b))
        nb = len(static_b)
        if all(ix.static_shape() == static_b for ix in used):
            bshape = None
    else:
        bshape = _runtime_broadcast(ctx, used)
        nb = max(ix.rank for ix in used)
    others = [i for i in range(x.rank) if i not in pos]
    xt = transpose(ctx, x, pos + others)
    gathered = ctx.op("GatherND", xt, _stacked(ctx, used, bshape))
    p0 = pos[0]
    if not adjacent or p0 == 0:
        return gathered
    # adjacent indexed dims: torch keeps the broadcast dims where the indexed dims were
    total = nb + len(others)
    perm = list(range(nb, nb + p0)) + list(range(nb)) + list(range(nb + p0, total))
    return transpose(ctx, gathered, perm)


def _clamped(ctx: ConversionContext, x: Value, indices: Sequence[Any]) -> list[Any]:
    """Index tensors clamped into range: the _unsafe_masked_* ops read anywhere where masked out."""
    out: list[Any] = []
    for axis, ix in enumerate(indices):
        if ix is None:
            out.append(None)
            continue
        n = dim_scalar(ctx, x, axis)
        hi = ctx.operand(n - 1, torch.int64) if isinstance(n, int) else ctx.op("Sub", n, ctx.i64(1))
        lo = ctx.operand(-n, torch.int64) if isinstance(n, int) else ctx.op("Neg", n)
        clipped = ctx.op("Max", ctx.op("Min", _index_i64(ctx, ix), hi), lo)
        out.append(Value(clipped, torch.int64, tuple(ix.shape)))
    return out


def convert_unsafe_masked_index(
    ctx: ConversionContext, x: Value, mask: Value, indices: Sequence[Any], fill: Any
) -> str:
    taken = convert_index(ctx, x, _clamped(ctx, x, indices))
    return where(ctx, ctx.cast(mask, torch.bool), taken, fill, x.dtype)


def convert_unsafe_masked_index_put_accumulate(
    ctx: ConversionContext, x: Value, mask: Value, indices: Sequence[Any], values: Value
) -> str:
    masked = where(ctx, ctx.cast(mask, torch.bool), values, 0, x.dtype)
    vals = Value(masked, x.dtype, tuple(values.shape))
    return convert_index_put(ctx, x, _clamped(ctx, x, indices), vals, True)


def _mask_put(
    ctx: ConversionContext, x: Value, indices: Sequence[Any], values: Value, accumulate: bool
) -> str | None:
    """x[mask] = v with a single-element v: a Where, no data-dependent shape."""
    pos = [i for i, ix in enumerate(indices) if ix is not None]
    if len(pos) != 1:
        return None
    mask = indices[pos[0]]
    if not (isinstance(mask, Value) and mask.dtype in _MASK_DTYPES):
        return None
    vshape = values.static_shape()
    if vshape is None or any(d != 1 for d in vshape):
        return None
    cond = ctx.cast(mask, torch.bool)
    trailing = x.rank - pos[0] - mask.rank
    if trailing:
        cond = ctx.op("Unsqueeze", cond, ctx.i64(list(range(mask.rank, mask.rank + trailing))))
    v = ctx.op("Reshape", ctx.cast(values, x.dtype), ctx.i64([]))
    new = v
    if accumulate:
        new = ctx.op("Or", x, v) if x.dtype == torch.bool else ctx.op("Add", x, v)
    return where(ctx, cond, new, x, x.dtype)


def convert_index_put(
    ctx: ConversionContext, x: Value, indices: Sequence[Any], values: Value, accumulate: bool = False
) -> str:
    if isinstance(values, Value):
        fast = _mask_put(ctx, x, indices, values, accumulate)
        if fast is not None:
            return fast
    idx, _ = _expand_masks(ctx, indices)
    pos, adjacent = _positions(idx)
    used = [idx[p] for p in pos]
    others = [i for i in range(x.rank) if i not in pos]
    static_b = _broadcast_static(used)
    if static_b is not None:
        bdims: list[Any] = list(static_b)
        bshape = ctx.i64(bdims)
    else:
        bshape = _runtime_broadcast(ctx, used)
        bdims = []
    xt = transpose(ctx, x, pos + others)
    # updates: values broadcast to the B-first layout [B..., other dims]
    other_shape = (
        ctx.op("Shape", xt, start=len(pos))
        if x.static_shape() is None
        else ctx.i64([x.shape[o] for o in others])
    )
    p0 = pos[0]
    vals: Any = values if isinstance(values, Value) else ctx.operand(values, x.dtype)
    vals = ctx.cast(vals, x.dtype)
    if adjacent and p0 > 0:
        # torch's layout puts B after the leading dims; broadcast there, then move B to the front
        lead = (
            ctx.op("Shape", x, start=0, end=p0) if x.static_shape() is None else ctx.i64(list(x.shape[:p0]))
        )
        after = (
            ctx.op("Shape", x, start=pos[-1] + 1)
            if x.static_shape() is None
            else ctx.i64(list(x.shape[pos[-1] + 1 :]))
        )
        expanded = ctx.op("Expand", vals, ctx.op("Concat", lead, bshape, after, axis=0))
        nb = len(bdims) if static_b is not None else max(ctx.rank(ix) or 0 for ix in used)
        total = nb + len(others)
        perm = list(range(p0, p0 + nb)) + list(range(p0)) + list(range(p0 + nb, total))
        updates = transpose(ctx, expanded, perm)
    else:
        updates = ctx.op("Expand", vals, ctx.op("Concat", bshape, other_shape, axis=0))
    reduction = "add" if accumulate else None
    stacked = _stacked(ctx, used, bshape)
    if reduction is not None and x.dtype in _WIDEN:
        wide = _WIDEN[x.dtype]
        scattered = ctx.op(
            "ScatterND", ctx.cast(xt, wide), stacked, ctx.cast(updates, wide), reduction=reduction
        )
        scattered = ctx.cast(scattered, x.dtype)
    else:
        scattered = ctx.op("ScatterND", xt, stacked, updates, reduction=reduction)
    inverse = [0] * x.rank
    for i, p in enumerate(pos + others):
        inverse[p] = i
    return transpose(ctx, scattered, inverse)


# ---- gather / scatter ---------------------------------------------------------------------------------
def _as_1d(ctx: ConversionContext, x: Any) -> str:
    return ctx.op("Reshape", x, ctx.i64([1]))


def _crop_to(
    ctx: ConversionContext, src: Value, shape: tuple[Any, ...], skip: int | None = None
) -> Value | str:
    """Slices ``src`` down to ``shape`` on the (static) dims where it is larger (torch allows it)."""
    y: Value | str = src
    for axis, (s, t) in enumerate(zip(src.shape, shape)):
        if axis != skip and isinstance(s, int) and isinstance(t, int) and s > t:
            y = slice_axis(ctx, y, axis, 0, t)
    return y


def convert_gather(
    ctx: ConversionContext, x: Value, dim: int, index: Value, sparse_grad: bool = False
) -> str:
    if index.static_shape() is not None and 0 in index.shape:
        # torch accepts an empty index of any rank
        return ctx.const(torch.zeros(ctx.out_shape, dtype=ctx.out_dtype), ctx.out_dtype)
    if x.rank == 0:
        out = ctx.op("GatherElements", _as_1d(ctx, x), _as_1d(ctx, _index_i64(ctx, index)), axis=0)
        return ctx.op("Reshape", out, ctx.i64(list(index.shape)))
    axis = normalize_axis(dim, x.rank)
    data = _crop_to(ctx, x, index.shape, skip=axis)
    return ctx.op("GatherElements", data, _index_i64(ctx, index), axis=axis)


def convert_take_along_dim(ctx: ConversionContext, x: Value, indices: Value, dim: Any = None) -> str:
    if dim is None:
        flat = ctx.op("Reshape", x, ctx.i64([-1]))
        return ctx.op(
            "GatherElements", flat, ctx.op("Reshape", _index_i64(ctx, indices), ctx.i64([-1])), axis=0
        )
    axis = normalize_axis(dim, x.rank)
    xs, ixs = x.static_shape(), indices.static_shape()
    if xs is None or ixs is None:
        if list(map(str, x.shape)) != list(map(str, indices.shape)):
            raise ctx.error("take_along_dim with broadcasting needs static shapes")
        return ctx.op("GatherElements", x, _index_i64(ctx, indices), axis=axis)
    # both sides broadcast against each other, except along dim
    b = list(
        torch.broadcast_shapes(
            tuple(1 if i == axis else d for i, d in enumerate(xs)),
            tuple(1 if i == axis else d for i, d in enumerate(ixs)),
        )
    )
    xt = [xs[axis] if i == axis else d for i, d in enumerate(b)]
    it = [ixs[axis] if i == axis else d for i, d in enumerate(b)]
    data = ctx.op("Expand", x, ctx.i64(xt)) if list(xs) != xt else x.name
    idx = _index_i64(ctx, indices)
    idx = ctx.op("Expand", idx, ctx.i64(it)) if list(ixs) != it else idx
    return ctx.op("GatherElements", data, idx, axis=axis)


# onnxruntime has no float16 / bfloat16 / bool kernels for Scatter* with a reduction: reduce in a wider
# type (bool as int64: a sum or max > 0 is torch's logical or, a product is its logical and)
_WIDEN = {torch.float16: torch.float32, torch.bfloat16: torch.float32, torch.bool: torch.int64}


def _scatter_elements(
    ctx: ConversionContext, x: Any, axis: int, index: Any, updates: Any, reduction: str | None, rank: int
) -> str:
    dtype = ctx.dtype(x)
    if reduction is not None and dtype in _WIDEN:
        wide = _WIDEN[dtype]
        out = _scatter_elements(ctx, ctx.cast(x, wide), axis, index, ctx.cast(updates, wide), reduction, rank)
        return ctx.cast(out, dtype)
    if rank == 0:
        out = ctx.op(
            "ScatterElements",
            _as_1d(ctx, x),
            _as_1d(ctx, index),
            _as_1d(ctx, updates),
            axis=0,
            reduction=reduction,
        )
        return ctx.op("Reshape", out, ctx.i64([]))
    return ctx.op("ScatterElements", x, index, updates, axis=axis, reduction=reduction)


_SCATTER_REDUCE = {"add": "add", "sum": "add", "multiply": "mul", "prod": "mul", "amax": "max", "amin": "min"}


def _scatter(
    ctx: ConversionContext, x: Value, dim: int, index: Value, src: Any, reduce: str | None = None
) -> str:
    axis = normalize_axis(dim, x.rank) if x.rank else 0
    reduction = None if reduce is None else _SCATTER_REDUCE.get(reduce)
    if reduce is not None and reduction is None:
        raise ctx.error(f"scatter reduce={reduce!r} is not supported")
    if reduction in ("max", "min"):
        ctx.require_opset(18, f"scatter with reduce={reduce!r} (ScatterElements reduction max/min)")
    if isinstance(src, Value):
        updates: Any = ctx.cast(_crop_to(ctx, src, index.shape), x.dtype)
    else:
        updates = ctx.op("Expand", ctx.const(src, x.dtype), ctx.dims_of(index))
    return _scatter_elements(ctx, x, axis, _index_i64(ctx, index), updates, reduction, x.rank)


def convert_scatter_src(ctx: ConversionContext, x: Value, dim: int, index: Value, src: Any) -> str:
    return _scatter(ctx, x, dim, index, src)


def convert_scatter_reduce_legacy(
    ctx: ConversionContext, x: Value, dim: int, index: Value, src: Any, *, reduce: str
) -> str:
    return _scatter(ctx, x, dim, index, src, reduce)


def convert_scatter_add(ctx: ConversionContext, x: Value, dim: int, index: Value, src: Value) -> str:
    return _scatter(ctx, x, dim, index, src, "add")


def _identity_of(reduce: str, dtype: torch.dtype) -> Any:
    if reduce in ("sum", "mean"):
        return 0
    if reduce == "prod":
        return 1
    if dtype.is_floating_point:
        return float("-inf") if reduce == "amax" else float("inf")
    if dtype == torch.bool:
        return reduce == "amin"
    info = torch.iinfo(dtype)
    return info.min if reduce == "amax" else info.max


def convert_scatter_reduce(
    ctx: ConversionContext,
    x: Value,
    dim: int,
    index: Value,
    src: Value,
    reduce: str,
    *,
    include_self: bool = True,
) -> str:
    axis = normalize_axis(dim, x.rank) if x.rank else 0
    upd = ctx.cast(_crop_to(ctx, src, index.shape), x.dtype)
    return _reduce_into(
        ctx, x, axis, _index_i64(ctx, index), upd, ctx.dims_of(index), reduce, include_self, index.shape
    )


def _reduce_into(
    ctx: ConversionContext,
    x: Value,
    axis: int,
    idx: str,
    upd: str,
    idx_shape: str,
    reduce: str,
    include_self: bool,
    idx_dims: Sequence[Any] = (),
) -> str:
    """scatter_reduce / index_reduce: ``upd`` reduced into ``x`` at ``idx`` (both of shape ``idx_shape``,
    whose dims ``idx_dims`` are)."""
    if reduce not in ("sum", "prod", "amax", "amin", "mean"):
        raise ctx.error(f"reduce={reduce!r} is not supported (sum, prod, amax, amin, mean)")
    if reduce in ("amax", "amin") and ctx.opset < 18:
        return _scatter_extreme_opset17(ctx, x, axis, idx, upd, reduce, include_self, idx_dims)
    base: Any = x
    if not include_self:
        # scattered positions start from the reduction's identity instead of x
        ident = ctx.op("Expand", ctx.const(_identity_of(reduce, x.dtype), x.dtype), idx_shape)
        base = _scatter_elements(ctx, x, axis, idx, ident, None, x.rank)
    op = {"sum": "add", "mean": "add", "prod": "mul", "amax": "max", "amin": "min"}[reduce]
    total = _scatter_elements(ctx, base, axis, idx, upd, op, x.rank)
    if reduce != "mean":
        return total
    ones = ctx.op("Expand", ctx.const(1, x.dtype), idx_shape)
    count_base = ctx.op("Expand", ctx.const(1, x.dtype), ctx.dims_of(x))
    if not include_self:
        zero = ctx.op("Expand", ctx.const(0, x.dtype), idx_shape)
        count_base = _scatter_elements(ctx, count_base, axis, idx, zero, None, x.rank)
    count = _scatter_elements(ctx, count_base, axis, idx, ones, "add", x.rank)
    if x.dtype.is_floating_point:
        return ctx.op("Div", total, count)
    # integer mean rounds down, as torch does
    return ctx.op("Div", ctx.op("Sub", total, ctx.op("Mod", total, count, fmod=0)), count)


def _scatter_extreme_opset17(
    ctx: ConversionContext,
    x: Value,
    axis: int,
    idx: str,
    upd: str,
    reduce: str,
    include_self: bool,
    dims: Sequence[Any],
) -> str:
    """amax / amin scatter without ScatterElements' max / min reduction (opset 18): each index is
    compared with every position along ``axis`` (a one-hot mask), the masked updates are reduced over
    the index axis, and positions that received anything combine with ``x`` (or replace it)."""
    if x.rank == 0:  # reduced as 1-element vectors
        one = Value(_as_1d(ctx, x), x.dtype, (1,))
        out = _scatter_extreme_opset17(
            ctx, one, 0, _as_1d(ctx, idx), _as_1d(ctx, upd), reduce, include_self, (1,)
        )
        return ctx.op("Reshape", out, ctx.i64([]))
    if x.static_shape() is None or not all(isinstance(d, int) for d in dims):
        raise ctx.error(f"reduce={reduce!r} below opset 18 needs static shapes")
    n = int(x.shape[axis])
    # ReduceMax / ReduceMin have no 16-bit integer kernels in onnxruntime: int32 holds them exactly
    compute = {torch.int16: torch.int32, torch.uint16: torch.int32}.get(x.dtype, _WIDEN.get(x.dtype, x.dtype))
    rank = x.rank
    perm = [d for d in range(rank) if d != axis] + [axis]  # the index axis last
    inv = [perm.index(d) for d in range(rank)]
    it = ctx.op("Transpose", idx, perm=perm)
    ut = ctx.op("Transpose", ctx.cast(upd, compute), perm=perm)
    mask = ctx.op("Equal", unsqueeze(ctx, it, [rank]), ctx.i64(list(range(n))))  # (..., K, N)
    fill = ctx.const(_identity_of(reduce, compute), compute)
    masked = ctx.op("Where", mask, unsqueeze(ctx, ut, [rank]), fill)
    op_type = "ReduceMax" if reduce == "amax" else "ReduceMin"
    red = ctx.op("Transpose", helper_reduce(ctx, op_type, masked, [rank - 1], False), perm=inv)
    hits = ctx.op(
        "Transpose", helper_reduce(ctx, "ReduceSum", ctx.cast(mask, torch.int64), [rank - 1], False), perm=inv
    )
    # an index smaller than x in the other dims covers only their leading part
    short = [x.shape[d] - dims[d] if d != axis else 0 for d in range(rank)]
    if any(short):
        pads = ctx.i64([0] * rank + short)
        red = ctx.op("Pad", red, pads, fill)
        hits = ctx.op("Pad", hits, pads, ctx.i64(0))
    xv = ctx.cast(x, compute)
    combined = ctx.op("Max" if reduce == "amax" else "Min", xv, red) if include_self else red
    out = ctx.op("Where", ctx.op("Greater", hits, ctx.i64(0)), combined, xv)
    return ctx.cast(out, x.dtype)


def convert_index_reduce(
    ctx: ConversionContext,
    x: Value,
    dim: int,
    index: Value,
    source: Value,
    reduce: str,
    *,
    include_self: bool = True,
) -> str:
    if x.rank == 0:
        # a 0-d tensor is reduced as a 1-element vector
        def one(v: Value) -> Value:
            return Value(_as_1d(ctx, v), v.dtype, (1,))

        out = convert_index_reduce(ctx, one(x), 0, one(index), one(source), reduce, include_self=include_self)
        return ctx.op("Reshape", out, ctx.i64([]))
    axis = normalize_axis(dim, x.rank)
    idx = _index_along(ctx, index, axis, x.rank, source)
    upd = ctx.cast(source, x.dtype)
    return _reduce_into(ctx, x, axis, idx, upd, ctx.dims_of(source), reduce, include_self, source.shape)


def convert_put(
    ctx: ConversionContext, x: Value, index: Value, source: Value, accumulate: bool = False
) -> str:
    flat = ctx.op("Reshape", x, ctx.i64([-1]))
    idx = ctx.op("Reshape", _index_i64(ctx, index), ctx.i64([-1]))
    src = ctx.op("Reshape", ctx.cast(source, x.dtype), ctx.i64([-1]))
    put = _scatter_elements(ctx, flat, 0, idx, src, "add" if accumulate else None, 1)
    return ctx.op("Reshape", put, ctx.dims_of(x))


def convert_masked_scatter(ctx: ConversionContext, x: Value, mask: Value, source: Value) -> str:
    """Positions where mask holds take source's elements in order: the k-th true reads source[k]."""
    shape = (
        ctx.i64(list(ctx.out_shape))
        if is_static(ctx.out_shape)
        else ctx.op("Shape", ctx.op("Expand", x, ctx.op("Shape", mask)))
    )
    flat_x = ctx.op("Reshape", ctx.op("Expand", x, shape), ctx.i64([-1]))
    flat_m = ctx.op("Reshape", ctx.op("Expand", ctx.cast(mask, torch.bool), shape), ctx.i64([-1]))
    if source.static_shape() is not None and 0 in source.shape:
        return ctx.op("Reshape", flat_x, shape)
    rank = ctx.op("CumSum", ctx.cast(flat_m, torch.int64), ctx.i64(0))
    # positions before the first true read index 0; Where discards them
    pos = ctx.op("Max", ctx.op("Sub", rank, ctx.i64(1)), ctx.i64(0))
    taken = ctx.op("Gather", ctx.op("Reshape", ctx.cast(source, x.dtype), ctx.i64([-1])), pos, axis=0)
    return ctx.op("Reshape", where(ctx, flat_m, taken, flat_x, x.dtype), shape)


def _index_along(ctx: ConversionContext, index: Value, axis: int, rank: int, like: Any) -> str:
    """A 1-D index along ``axis`` reshaped to [1, .., n, .., 1] and expanded to the shape of ``like``."""
    idx = _index_i64(ctx, index)
    if rank == 0:
        return ctx.op("Reshape", idx, ctx.i64([]))
    shape = [1] * rank
    shape[axis] = -1
    idx = ctx.op("Reshape", idx, ctx.i64(shape))
    like_shape = like if isinstance(like, str) else ctx.dims_of(like)
    return ctx.op("Expand", idx, like_shape)


def convert_index_add(
    ctx: ConversionContext, x: Value, dim: int, index: Value, source: Value, *, alpha: Any = 1
) -> str:
    axis = normalize_axis(dim, x.rank) if x.rank else 0
    # bool adds as a logical or: sum as int64, then back to bool
    dtype = torch.int64 if x.dtype == torch.bool else x.dtype
    src = ctx.cast(source, dtype)
    if alpha != 1:
        src = ctx.op("Mul", src, ctx.operand(alpha, dtype))
    if x.rank == 0:
        return ctx.cast(ctx.op("Add", ctx.cast(x, dtype), ctx.op("Reshape", src, ctx.i64([]))), x.dtype)
    idx = _index_along(ctx, index, axis, x.rank, source)
    return ctx.cast(_scatter_elements(ctx, ctx.cast(x, dtype), axis, idx, src, "add", x.rank), x.dtype)


def convert_index_copy(ctx: ConversionContext, x: Value, dim: int, index: Value, source: Value) -> str:
    axis = normalize_axis(dim, x.rank) if x.rank else 0
    src = ctx.cast(source, x.dtype)
    if x.rank == 0:
        return ctx.op("Reshape", src, ctx.i64([]))
    idx = _index_along(ctx, index, axis, x.rank, source)
    return ctx.op("ScatterElements", x, idx, src, axis=axis)


def convert_index_fill(ctx: ConversionContext, x: Value, dim: int, index: Value, value: Any) -> str:
    axis = normalize_axis(dim, x.rank) if x.rank else 0
    if x.rank == 0:
        return ctx.cast(ctx.op("Reshape", ctx.operand(value, x.dtype), ctx.i64([])), x.dtype)
    # the updates have x's shape with dim replaced by the number of indices
    n = ctx.op("Reshape", ctx.op("Size", index), ctx.i64([1]))
    parts = [ctx.op("Shape", x, start=0, end=axis), n, ctx.op("Shape", x, start=axis + 1)]
    if x.static_shape() is not None and index.static_shape() is not None:
        dims = list(x.shape)
        dims[axis] = max(1, index.shape[0]) if index.rank else 1
        if index.rank and index.shape[0] == 0:
            return ctx.op("Identity", x)
        upd_shape = ctx.i64(dims)
    else:
        upd_shape = ctx.op("Concat", *parts, axis=0)
    val = ctx.op("Reshape", ctx.operand(value, x.dtype), ctx.i64([]))
    updates = ctx.op("Expand", val, upd_shape)
    idx = _index_along(ctx, index, axis, x.rank, upd_shape)
    return ctx.op("ScatterElements", x, idx, updates, axis=axis)


def convert_index_select(ctx: ConversionContext, x: Value, dim: int, index: Value) -> str:
    idx = ctx.unsqueeze0(index) if index.rank == 0 else index.name
    if x.rank == 0:
        return ctx.op("Reshape", ctx.op("Gather", _as_1d(ctx, x), idx, axis=0), ctx.i64([]))
    return ctx.op("Gather", x, idx, axis=normalize_axis(dim, x.rank))


def convert_take(ctx: ConversionContext, x: Value, index: Value) -> str:
    return ctx.op("Gather", ctx.op("Reshape", x, ctx.i64([-1])), index, axis=0)


def convert_slice_scatter(
    ctx: ConversionContext,
    x: Value,
    src: Value,
    dim: int = 0,
    start: Any = None,
    end: Any = None,
    step: int = 1,
) -> str:
    axis = normalize_axis(dim, x.rank)
    size = x.shape[axis]
    src_t = ctx.cast(src, x.dtype)
    start = 0 if start is None else start
    end = INT64_MAX if end is None else end
    if isinstance(size, int) and isinstance(start, int) and isinstance(end, int):
        positions = list(range(size))[slice(start, end, step)]
        if not positions:
            return ctx.op("Identity", x)
        if step == 1:
            parts = [
                slice_axis(ctx, x, axis, 0, positions[0]),
                src_t,
                slice_axis(ctx, x, axis, positions[-1] + 1, INT64_MAX),
            ]
            return ctx.op("Concat", *parts, axis=axis)
        idx = torch.tensor(positions, dtype=torch.int64).reshape(
            [-1 if i == axis else 1 for i in range(x.rank)]
        )
        full = ctx.op("Expand", ctx.const(idx, torch.int64), ctx.dims_of(src))
        return ctx.op("ScatterElements", x, full, src_t, axis=axis)
    if step != 1:
        raise ctx.error("slice_scatter with a step and symbolic bounds is not supported")
    # step 1 and symbolic bounds: before + src + after (Slice clamps the bounds like Python)
    s = ctx.i64([start]) if isinstance(start, int) else ctx.unsqueeze0(ctx.sym_value(start))
    n_src = ctx.op("Shape", src, start=axis, end=axis + 1)
    if isinstance(start, int) and start < 0:
        raise ctx.error("slice_scatter with a negative start on a symbolic dim is not supported")
    before = ctx.op("Slice", x, ctx.i64([0]), s, ctx.i64([axis]))
    after = ctx.op("Slice", x, ctx.op("Add", s, n_src), ctx.i64([INT64_MAX]), ctx.i64([axis]))
    return ctx.op("Concat", before, src_t, after, axis=axis)


def convert_select_scatter(ctx: ConversionContext, x: Value, src: Value, dim: int, index: Any) -> str:
    axis = normalize_axis(dim, x.rank)
    size = x.shape[axis]
    if isinstance(index, int) and isinstance(size, int):
        index = index % size if size else index
    elif isinstance(index, int) and index < 0:
        raise ctx.error("select_scatter with a negative index on a symbolic dim is not supported")
    src_u = Value(
        ctx.op("Unsqueeze", src, ctx.i64([axis])), src.dtype, (*src.shape[:axis], 1, *src.shape[axis:])
    )
    end = index + 1 if isinstance(index, int) else ctx.op("Add", ctx.sym_value(index), ctx.i64(1))
    return convert_slice_scatter(ctx, x, src_u, axis, index, end, 1)


def convert_diagonal_scatter(
    ctx: ConversionContext, x: Value, src: Value, offset: int = 0, dim1: int = 0, dim2: int = 1
) -> str:
    a, b = normalize_axis(dim1, x.rank), normalize_axis(dim2, x.rank)
    rows, cols = x.shape[a], x.shape[b]
    if x.static_shape() is None:
        raise ctx.error("diagonal_scatter needs static shapes")

    r, c = diagonal_positions(rows, cols, offset)
    if not r:
        return ctx.op("Identity", x)
    perm = [i for i in range(x.rank) if i not in (a, b)] + [a, b]
    xt = transpose(ctx, x, perm)
    batch = [x.shape[i] for i in perm[:-2]]
    flat = ctx.op("Reshape", xt, ctx.i64([*batch, rows * cols]))
    # src is [..., L]: scatter it into the flattened matrix at the diagonal's positions
    idx = torch.tensor([i * cols + j for i, j in zip(r, c)], dtype=torch.int64).reshape(
        [1] * len(batch) + [-1]
    )
    full_idx = ctx.op("Expand", ctx.const(idx, torch.int64), ctx.dims_of(src))
    scattered = ctx.op("ScatterElements", flat, full_idx, ctx.cast(src, x.dtype), axis=len(batch))
    back = ctx.op("Reshape", scattered, ctx.i64([*batch, rows, cols]))
    inverse = [0] * x.rank
    for i, p in enumerate(perm):
        inverse[p] = i
    return transpose(ctx, back, inverse)


# ---- data-dependent selections ----------------------------------------------------------------------
def convert_nonzero(ctx: ConversionContext, x: Value) -> str:
    if x.rank == 0:
        # a 0-d tensor gives (n, 0) with n in {0, 1}
        nz = ctx.op("NonZero", ctx.cast(_as_1d(ctx, x), torch.bool))
        return ctx.op("Slice", ctx.op("Transpose", nz, perm=[1, 0]), ctx.i64([0]), ctx.i64([0]), ctx.i64([1]))
    return ctx.op("Transpose", ctx.op("NonZero", ctx.cast(x, torch.bool)), perm=[1, 0])


def convert_nonzero_numpy(ctx: ConversionContext, x: Value) -> list[str]:
    if x.rank == 0:
        nz = ctx.op("NonZero", ctx.cast(_as_1d(ctx, x), torch.bool))
        return [ctx.op("Gather", nz, ctx.i64(0), axis=0)]
    return [v.name for v in _mask_to_indices(ctx, x)]


def convert_where_one(ctx: ConversionContext, condition: Value) -> list[str]:
    return convert_nonzero_numpy(ctx, condition)


def convert_nonzero_static(ctx: ConversionContext, x: Value, *, size: int, fill_value: int = -1) -> str:
    if x.rank == 0:
        return ctx.const(torch.zeros(size, 0, dtype=torch.int64), torch.int64)
    nz = ctx.op("Transpose", ctx.op("NonZero", ctx.cast(x, torch.bool)), perm=[1, 0])
    # pad with fill_value rows, then keep exactly ``size`` rows
    pad = ctx.op("ConstantOfShape", ctx.i64([size, x.rank]), value=ctx.tensor_attr(fill_value, torch.int64))
    both = ctx.op("Concat", nz, pad, axis=0)
    return slice_axis(ctx, both, 0, 0, size)


def convert_masked_select(ctx: ConversionContext, x: Value, mask: Value) -> str:
    xb = ctx.op("Expand", x, ctx.op("Shape", mask))
    mb = ctx.op("Expand", ctx.cast(mask, torch.bool), ctx.op("Shape", xb))
    flat = ctx.op("Reshape", xb, ctx.i64([-1]))
    return ctx.op("Compress", flat, ctx.op("Reshape", mb, ctx.i64([-1])), axis=0)


# ---- sorting ------------------------------------------------------------------------------------------
# dtypes without a TopK kernel (lib.kernels.NATIVE) are sorted as a wider type (exact conversions)


def _topk(ctx: ConversionContext, x: Value, k: Any, dim: int, largest: bool, sorted_: bool) -> list[str]:
    if x.rank == 0:
        values, indices = _topk(ctx, Value(_as_1d(ctx, x), x.dtype, (1,)), k, 0, largest, sorted_)
        return [ctx.op("Reshape", values, ctx.i64([])), ctx.op("Reshape", indices, ctx.i64([]))]
    axis = normalize_axis(dim, x.rank)
    kk = ctx.i64([k]) if isinstance(k, int) else ctx.unsqueeze0(ctx.sym_value(k))
    data = x.name
    if x.dtype not in NATIVE["TopK"]:
        wide = torch.float32 if x.dtype.is_floating_point and x.dtype != torch.float64 else torch.int64
        data = ctx.cast(x, wide)
    values, indices = ctx.op(
        "TopK", data, kk, axis=axis, largest=int(largest), sorted=int(sorted_), outputs=2
    )
    return [ctx.cast(values, x.dtype), indices]


def convert_topk(
    ctx: ConversionContext, x: Value, k: Any, dim: int = -1, largest: bool = True, sorted: bool = True
) -> list[str]:
    return _topk(ctx, x, k, dim, largest, True)


def _sort(ctx: ConversionContext, x: Value, dim: int, descending: bool) -> list[str]:
    if x.rank == 0:
        return [ctx.op("Identity", x), ctx.const(0, torch.int64)]
    axis = normalize_axis(dim, x.rank)
    return _topk(ctx, x, dim_scalar(ctx, x, axis), axis, descending, True)


def convert_sort(
    ctx: ConversionContext, x: Value, dim: int = -1, descending: bool = False, **kw: Any
) -> list[str]:
    # TopK breaks ties by the lower index, which is a stable sort
    return _sort(ctx, x, kw.get("dim", dim), kw.get("descending", descending))


def convert_sort_stable(
    ctx: ConversionContext, x: Value, *, stable: Any = None, dim: int = -1, descending: bool = False
) -> list[str]:
    return _sort(ctx, x, dim, descending)


def convert_argsort(ctx: ConversionContext, x: Value, dim: int = -1, descending: bool = False) -> str:
    return _sort(ctx, x, dim, descending)[1]


def convert_argsort_stable(
    ctx: ConversionContext, x: Value, *, stable: bool = False, dim: int = -1, descending: bool = False
) -> str:
    return _sort(ctx, x, dim, descending)[1]


def convert_msort(ctx: ConversionContext, x: Value) -> str:
    return _sort(ctx, x, 0, False)[0]


# ---- encodings and searches ------------------------------------------------------------------------------
def convert_one_hot(ctx: ConversionContext, x: Value, num_classes: int = -1) -> str:
    n = ctx.out_shape[-1]
    if not isinstance(n, int):
        raise ctx.error("one_hot needs a static num_classes")
    classes = ctx.i64(list(range(n)))
    hit = ctx.op("Equal", ctx.op("Unsqueeze", _index_i64(ctx, x), ctx.i64([-1])), classes)
    return ctx.cast(hit, ctx.out_dtype)


def _count_below(ctx: ConversionContext, seq: Any, values: Any, right: bool, dtype: torch.dtype) -> str:
    """How many entries of the sorted last axis of ``seq`` come before each value: the insertion point."""
    out = ctx.out_shape
    if is_static(out) and 0 in out:
        # an empty result: onnxruntime's ReduceSum mishandles empty inputs
        return ctx.const(torch.zeros(out, dtype=dtype), dtype)
    # right=False counts seq < v, right=True counts seq <= v
    cmp = ctx.op("LessOrEqual" if right else "Less", seq, values)
    return ctx.op("ReduceSum", ctx.cast(cmp, dtype), ctx.i64([-1]), keepdims=0)


def convert_bucketize(
    ctx: ConversionContext, x: Any, boundaries: Value, *, out_int32: bool = False, right: bool = False
) -> str:
    dtype = ctx.out_dtype
    common = torch.promote_types(x.dtype if isinstance(x, Value) else boundaries.dtype, boundaries.dtype)
    xv = ctx.op("Unsqueeze", ctx.operand(x, common), ctx.i64([-1]))
    return _count_below(ctx, ctx.cast(boundaries, common), xv, right, dtype)


def convert_searchsorted(
    ctx: ConversionContext,
    seq: Value,
    x: Any,
    *,
    out_int32: bool = False,
    right: bool = False,
    side: str | None = None,
    sorter: Value | None = None,
) -> str:
    dtype = ctx.out_dtype
    right = right or side == "right"
    common = torch.promote_types(seq.dtype, x.dtype if isinstance(x, Value) else seq.dtype)
    s: Any = seq
    if sorter is not None:
        s = ctx.op("GatherElements", seq, _index_i64(ctx, sorter), axis=seq.rank - 1)
    s = ctx.cast(s, common)
    xv = ctx.operand(x, common)
    if seq.rank > 1:
        # batched: seq [..., n] against values [..., m] -> compare [..., m, n]
        return _count_below(
            ctx, ctx.op("Unsqueeze", s, ctx.i64([-2])), ctx.op("Unsqueeze", xv, ctx.i64([-1])), right, dtype
        )
    return _count_below(ctx, s, ctx.op("Unsqueeze", xv, ctx.i64([-1])), right, dtype)


def convert_as_strided_scatter(
    ctx: ConversionContext,
    x: Value,
    src: Value,
    size: Sequence[Any],
    stride: Sequence[Any],
    storage_offset: Any = None,
) -> str:
    """``src`` written into x's storage through the given strides: a ScatterElements over the flattened
    tensor at positions computed at conversion time. Exact when torch recorded x as contiguous from the
    start of its storage (ONNX has no other layout) and no position is written twice (an overlapping
    view's result depends on torch's write order)."""
    assert ctx.node is not None
    arg = ctx.node.args[0]
    val = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
    shape = x.static_shape()
    offset = 0 if storage_offset is None else storage_offset
    if val is None or shape is None or not all(isinstance(v, int) for v in (*size, *stride, offset)):
        raise ctx.error("as_strided_scatter needs static sizes, strides and storage offset")
    if not val.is_contiguous() or val.storage_offset() != 0:
        raise ctx.error("as_strided_scatter into a tensor that is not contiguous from its storage start")
    idx = torch.full(tuple(size), offset, dtype=torch.int64)
    for axis, (n, st) in enumerate(zip(size, stride)):
        view = [1] * len(size)
        view[axis] = n
        idx = idx + (torch.arange(n, dtype=torch.int64) * st).reshape(view)
    flat_idx = idx.reshape(-1)
    if flat_idx.numel() and (int(flat_idx.max()) >= max(1, math.prod(shape)) or int(flat_idx.min()) < 0):
        raise ctx.error("as_strided_scatter reaches outside the tensor's storage")
    if flat_idx.unique().numel() != flat_idx.numel():
        raise ctx.error("as_strided_scatter with overlapping positions (a stride of 0) is not supported")
    flat = ctx.op("Reshape", x, ctx.i64([-1]))
    updates = ctx.op("Reshape", ctx.op("Expand", ctx.cast(src, x.dtype), ctx.i64(list(size))), ctx.i64([-1]))
    out = ctx.op("ScatterElements", flat, ctx.const(flat_idx, torch.int64), updates, axis=0)
    return ctx.op("Reshape", out, ctx.i64(list(shape)))


CONVERTERS: dict[str, Converter] = {
    "aten.index.Tensor": convert_index,
    "aten._unsafe_index.Tensor": convert_index,
    "aten.index_put.default": convert_index_put,
    "aten._unsafe_masked_index.default": convert_unsafe_masked_index,
    "aten._unsafe_masked_index_put_accumulate.default": convert_unsafe_masked_index_put_accumulate,
    "aten._unsafe_index_put.default": convert_index_put,
    "aten.gather.default": convert_gather,
    "aten.take_along_dim.default": convert_take_along_dim,
    "aten.take.default": convert_take,
    "aten.index_select.default": convert_index_select,
    "aten.scatter.src": convert_scatter_src,
    "aten.scatter.value": convert_scatter_src,
    "aten.scatter.reduce": convert_scatter_reduce_legacy,
    "aten.scatter.value_reduce": convert_scatter_reduce_legacy,
    "aten.scatter_add.default": convert_scatter_add,
    "aten.scatter_reduce.two": convert_scatter_reduce,
    "aten.index_add.default": convert_index_add,
    "aten.index_copy.default": convert_index_copy,
    "aten.index_fill.int_Scalar": convert_index_fill,
    "aten.index_fill.int_Tensor": convert_index_fill,
    "aten.slice_scatter.default": convert_slice_scatter,
    "aten.as_strided_scatter.default": convert_as_strided_scatter,
    "aten.select_scatter.default": convert_select_scatter,
    "aten.diagonal_scatter.default": convert_diagonal_scatter,
    "aten.nonzero.default": convert_nonzero,
    "aten.argwhere.default": convert_nonzero,
    "aten.nonzero_numpy.default": convert_nonzero_numpy,
    "aten.where.default": convert_where_one,
    "aten.masked_select.default": convert_masked_select,
    "aten.masked_scatter.default": convert_masked_scatter,
    "aten.nonzero_static.default": convert_nonzero_static,
    "aten.index_reduce.default": convert_index_reduce,
    "aten.put.default": convert_put,
    "aten.topk.default": convert_topk,
    "aten.sort.default": convert_sort,
    "aten.sort.stable": convert_sort_stable,
    "aten.argsort.default": convert_argsort,
    "aten.argsort.stable": convert_argsort_stable,
    "aten.msort.default": convert_msort,
    "aten.one_hot.default": convert_one_hot,
    "aten.bucketize.Tensor": convert_bucketize,
    "aten.bucketize.Scalar": convert_bucketize,
    "aten.searchsorted.Tensor": convert_searchsorted,
    "aten.searchsorted.Scalar": convert_searchsorted,
}
