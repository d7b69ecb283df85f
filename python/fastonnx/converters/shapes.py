"""Shape and layout ops: views, reshapes, transposes, slicing, concatenation, splitting, padding.

Static shapes become constants (no Shape node when every dim is an int); symbolic dims are read from
the graph inputs they come from (``ctx.sym_value``) or from a tensor that carries the same dim.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from fastonnx.context import ConversionContext, Converter, Value
from fastonnx.converters.lib.kernels import NATIVE
from fastonnx.converters.lib.ops import normalize_axis, where
from fastonnx.converters.lib.shape_graphs import (
    INT64_MAX,
    diagonal_positions,
    dim_piece,
    dim_scalar,
    is_static,
    shape_of,
    slice_axis,
    transpose,
)

aten = torch.ops.aten

INT64_MIN = -(2**63)


def expand_shape(ctx: ConversionContext, dims: Sequence[Any], sources: Sequence[Value] = ()) -> str:
    """A shape for Expand (no -1 allowed: a 1 keeps the input's dim), so every dim must be found."""
    shape = shape_of(ctx, dims, sources, unknown_ok=0)
    if shape is None:
        raise ctx.error(f"cannot build the runtime shape {list(dims)}: a symbolic dim is not available")
    return shape


def reshape(ctx: ConversionContext, x: Any, dims: Sequence[Any], sources: Sequence[Value] = ()) -> str:
    """Reshape ``x`` to ``dims`` (torch sizes, no -1) read from FX metadata."""
    if tuple(getattr(x, "shape", ())) == tuple(dims) and isinstance(x, Value):
        return ctx.op("Identity", x)
    # a 0 in a torch shape is a real 0, not "copy the input dim"; with it, no -1 (allowzero forbids both)
    zero = _empty_dim(dims)
    shape = shape_of(
        ctx, dims, (*sources, *([x] if isinstance(x, Value) else [])), unknown_ok=0 if zero else 1
    )
    if shape is None:
        raise ctx.error(f"cannot build the runtime shape {list(dims)}: a symbolic dim is not available")
    return ctx.op("Reshape", x, shape, allowzero=1 if zero else None)


def _empty_dim(dims: Sequence[Any]) -> bool:
    """Whether a torch shape has a static 0 (an empty dim): ONNX's Reshape reads a 0 as "copy the input
    dim" unless ``allowzero``."""
    return any(isinstance(d, int) and d == 0 for d in dims)


def _empty_reshape(ctx: ConversionContext, x: Value, out: Sequence[Any]) -> str | None:
    """The Reshape to ``out``, an empty dim beside symbolic ones, with ``allowzero`` and every dim found
    (no -1 beside it); None where ``out`` has no empty dim or a dim is not found."""
    shape = shape_of(ctx, out, (x,), unknown_ok=0) if _empty_dim(out) else None
    return None if shape is None else ctx.op("Reshape", x, shape, allowzero=1)


def cast_all(ctx: ConversionContext, tensors: Sequence[Any], dtype: torch.dtype) -> list[str]:
    return [ctx.operand(t, dtype) for t in tensors]


def _out_shapes(ctx: ConversionContext) -> list[tuple[Any, ...]]:
    return [tuple(v.shape) for v in ctx.out]


# ---- views and reshapes ---------------------------------------------------------------------------
def convert_view(ctx: ConversionContext, x: Value, size: Sequence[Any]) -> str:
    out = ctx.out_shape
    if is_static(out):
        return reshape(ctx, x, out)
    if (empty := _empty_reshape(ctx, x, out)) is not None:
        return empty
    shape = shape_of(ctx, out, (x,))
    if shape is None:
        # the requested sizes themselves: ints (one may be -1) and symbolic values
        shape = ctx.shape_tensor([d for d in size])
    return ctx.op("Reshape", x, shape)


def convert_view_as(ctx: ConversionContext, x: Value, other: Value) -> str:
    if is_static(ctx.out_shape):
        return reshape(ctx, x, ctx.out_shape)
    zero = _empty_dim(ctx.out_shape)  # a shape read at runtime has no -1: allowzero is safe
    return ctx.op("Reshape", x, ctx.op("Shape", other), allowzero=1 if zero else None)


def convert_flatten(ctx: ConversionContext, x: Value, start_dim: int = 0, end_dim: int = -1) -> str:
    out = ctx.out_shape
    if is_static(out):
        return reshape(ctx, x, out)
    if (empty := _empty_reshape(ctx, x, out)) is not None:
        return empty
    shape = shape_of(ctx, out, (x,))
    if shape is None:
        start = normalize_axis(start_dim, x.rank)
        end = normalize_axis(end_dim, x.rank)
        parts = [ctx.op("Shape", x, start=0, end=start), ctx.i64([-1]), ctx.op("Shape", x, start=end + 1)]
        shape = ctx.op("Concat", *parts, axis=0)
    return ctx.op("Reshape", x, shape)


def convert_unflatten(ctx: ConversionContext, x: Value, dim: int, sizes: Sequence[Any]) -> str:
    return convert_view(ctx, x, ctx.out_shape)


def convert_transpose(ctx: ConversionContext, x: Value, dim0: int, dim1: int) -> str:
    if x.rank < 2:
        return ctx.op("Identity", x)
    perm = list(range(x.rank))
    a, b = normalize_axis(dim0, x.rank), normalize_axis(dim1, x.rank)
    perm[a], perm[b] = perm[b], perm[a]
    return transpose(ctx, x, perm)


def convert_permute(ctx: ConversionContext, x: Value, dims: Sequence[int]) -> str:
    return transpose(ctx, x, [normalize_axis(d, x.rank) for d in dims])


def convert_t(ctx: ConversionContext, x: Value) -> str:
    return convert_transpose(ctx, x, 0, 1)


def convert_movedim(ctx: ConversionContext, x: Value, source: Any, destination: Any) -> str:
    src = [source] if isinstance(source, int) else list(source)
    dst = [destination] if isinstance(destination, int) else list(destination)
    src = [normalize_axis(d, x.rank) for d in src]
    dst = [normalize_axis(d, x.rank) for d in dst]
    perm: list[int | None] = [None] * x.rank
    for s, d in zip(src, dst):
        perm[d] = s
    rest = iter(i for i in range(x.rank) if i not in src)
    return transpose(ctx, x, [p if p is not None else next(rest) for p in perm])


def convert_unsqueeze(ctx: ConversionContext, x: Value, dim: int) -> str:
    return ctx.op("Unsqueeze", x, ctx.i64([normalize_axis(dim, x.rank + 1)]))


def _squeeze_axes(ctx: ConversionContext, x: Value, dims: Sequence[int]) -> str:
    # torch ignores dims whose size is not 1
    axes = sorted({normalize_axis(d, x.rank) for d in dims if x.rank > 0})
    axes = [a for a in axes if isinstance(x.shape[a], int) and x.shape[a] == 1]
    if len(axes) != x.rank - len(ctx.out_shape):
        raise ctx.error(f"squeeze of a symbolic dim of size 1 (input shape {x.shape}) is not supported")
    if not axes:
        return ctx.op("Identity", x)
    return ctx.op("Squeeze", x, ctx.i64(axes))


def convert_squeeze(ctx: ConversionContext, x: Value, dim: Any = None) -> str:
    if dim is None:
        return _squeeze_axes(ctx, x, list(range(x.rank)))
    return _squeeze_axes(ctx, x, [dim] if isinstance(dim, int) else list(dim))


def convert_expand(ctx: ConversionContext, x: Value, size: Sequence[Any], *, implicit: bool = False) -> str:
    out = ctx.out_shape
    if is_static(out):
        return ctx.op("Expand", x, ctx.i64(list(out)))
    # Expand broadcasts both ways: a 1 keeps the input's dim, which is what torch's -1 means
    dims = [
        1 if isinstance(s, int) and s == -1 else (o if isinstance(o, int) else s) for s, o in zip(size, out)
    ]
    return ctx.op("Expand", x, expand_shape(ctx, dims, (x,)))


def convert_expand_as(ctx: ConversionContext, x: Value, other: Value) -> str:
    if is_static(ctx.out_shape):
        return ctx.op("Expand", x, ctx.i64(list(ctx.out_shape)))
    return ctx.op("Expand", x, ctx.op("Shape", other))


def convert_broadcast_to(ctx: ConversionContext, x: Value, size: Sequence[Any]) -> str:
    return convert_expand(ctx, x, size)


# ---- slicing --------------------------------------------------------------------------------------
def convert_slice(
    ctx: ConversionContext, x: Value, dim: int = 0, start: Any = None, end: Any = None, step: int = 1
) -> str:
    axis = normalize_axis(dim, x.rank)
    start = 0 if start is None else start
    end = INT64_MAX if end is None else end
    size = x.shape[axis]
    if isinstance(start, int) and isinstance(end, int) and isinstance(size, int) and step == 1:
        if start in (0, -size if size else 0) and end >= size:
            return ctx.op("Identity", x)
    return slice_axis(ctx, x, axis, start, end, step)


def convert_narrow(ctx: ConversionContext, x: Value, dim: int, start: Any, length: Any) -> str:
    axis = normalize_axis(dim, x.rank)
    if isinstance(start, int) and isinstance(length, int):
        end = start + length
        if start < 0 and end >= 0:
            end = INT64_MAX  # a negative start reaching the last element: slice to the end
        return slice_axis(ctx, x, axis, start, end)
    s = ctx.sym_value(start) if not isinstance(start, int) else ctx.i64(start)
    n = ctx.sym_value(length) if not isinstance(length, int) else ctx.i64(length)
    return slice_axis(ctx, x, axis, s, ctx.op("Add", s, n))


def convert_select(ctx: ConversionContext, x: Value, dim: int, index: Any) -> str:
    axis = normalize_axis(dim, x.rank)
    idx = ctx.i64(index) if isinstance(index, int) else ctx.sym_value(index)
    return ctx.op("Gather", x, idx, axis=axis)


# ---- joining and splitting ----------------------------------------------------------------------
def convert_cat(ctx: ConversionContext, tensors: Sequence[Value], dim: int = 0) -> str:
    dtype = ctx.out_dtype
    out_rank = len(ctx.out_shape)
    # torch skips 1-D tensors of shape (0,) whatever the other tensors' rank
    kept = [t for t in tensors if not (t.rank == 1 and isinstance(t.shape[0], int) and t.shape[0] == 0)]
    if not kept:
        return ctx.const(torch.zeros(ctx.out_shape, dtype=dtype), dtype)
    parts = cast_all(ctx, kept, dtype)
    if len(parts) == 1:
        return ctx.op("Identity", parts[0])
    return ctx.op("Concat", *parts, axis=normalize_axis(dim, out_rank))


def convert_stack(ctx: ConversionContext, tensors: Sequence[Value], dim: int = 0) -> str:
    dtype = ctx.out_dtype
    axis = normalize_axis(dim, tensors[0].rank + 1)
    parts = [ctx.op("Unsqueeze", t, ctx.i64([axis])) for t in cast_all(ctx, tensors, dtype)]
    return parts[0] if len(parts) == 1 else ctx.op("Concat", *parts, axis=axis)


def _at_least(ctx: ConversionContext, t: Value, rank: int) -> str:
    """torch.atleast_{1,2,3}d: 0-d -> (1,)*rank, 1-D (n) -> (1, n[, 1]), 2-D (m, n) -> (m, n, 1)."""
    if t.rank >= rank:
        return t.name
    axes = {(0, 1): [0], (0, 2): [0, 1], (0, 3): [0, 1, 2], (1, 2): [0], (1, 3): [0, 2], (2, 3): [2]}
    return ctx.op("Unsqueeze", t, ctx.i64(axes[(t.rank, rank)]))


def _stack_along(ctx: ConversionContext, tensors: Sequence[Value], rank: int, axis: int) -> str:
    dtype = ctx.out_dtype
    parts = [ctx.cast(_at_least(ctx, t, rank), dtype) for t in tensors]
    return parts[0] if len(parts) == 1 else ctx.op("Concat", *parts, axis=axis)


def convert_hstack(ctx: ConversionContext, tensors: Sequence[Value]) -> str:
    if all(t.rank <= 1 for t in tensors):
        return _stack_along(ctx, tensors, 1, 0)
    return _stack_along(ctx, tensors, 1, 1)


def convert_vstack(ctx: ConversionContext, tensors: Sequence[Value]) -> str:
    return _stack_along(ctx, tensors, 2, 0)


def convert_dstack(ctx: ConversionContext, tensors: Sequence[Value]) -> str:
    return _stack_along(ctx, tensors, 3, 2)


def convert_column_stack(ctx: ConversionContext, tensors: Sequence[Value]) -> str:
    dtype = ctx.out_dtype
    parts = []
    for t in tensors:
        # 0-d and 1-D tensors become columns (n, 1)
        col = ctx.op("Reshape", t, ctx.i64([-1, 1])) if t.rank <= 1 else t.name
        parts.append(ctx.cast(col, dtype))
    return parts[0] if len(parts) == 1 else ctx.op("Concat", *parts, axis=1)


def _atleast(rank: int) -> Callable[..., Any]:
    def convert(ctx: ConversionContext, x: Any) -> Any:
        if isinstance(x, Value):
            return ctx.op("Identity", _at_least(ctx, x, rank)) if x.rank >= rank else _at_least(ctx, x, rank)
        return [_at_least(ctx, t, rank) if t.rank < rank else ctx.op("Identity", t) for t in x]

    convert.__name__ = f"convert_atleast_{rank}d"
    return convert


def split_pieces(ctx: ConversionContext, x: Value, axis: int, sizes: Sequence[Any]) -> list[str]:
    """Pieces of ``x`` along ``axis`` with the given sizes (from FX metadata; SymInts allowed)."""
    if len(sizes) == 1:
        return [ctx.op("Identity", x)]
    if is_static(sizes):
        return ctx.op("Split", x, ctx.i64([int(s) for s in sizes]), axis=axis, outputs=len(sizes))
    # symbolic sizes: one Slice per piece, offsets accumulated at runtime
    pieces = []
    start: Any = 0
    for i, s in enumerate(sizes):
        if i == len(sizes) - 1:
            pieces.append(slice_axis(ctx, x, axis, start, INT64_MAX))
            break
        size = s if isinstance(s, int) else ctx.op("Squeeze", _require(ctx, dim_piece(ctx, s, (x,)), s))
        if isinstance(start, int) and isinstance(size, int):
            end: Any = start + size
        else:
            end = ctx.op("Add", ctx.operand(start, torch.int64), ctx.operand(size, torch.int64))
        pieces.append(slice_axis(ctx, x, axis, start, end))
        start = end
    return pieces


def _require(ctx: ConversionContext, piece: str | None, d: Any) -> str:
    if piece is None:
        raise ctx.error(f"the symbolic size {d} is not available at runtime")
    return piece


def _split_from_meta(ctx: ConversionContext, x: Value, dim: int) -> list[str]:
    axis = normalize_axis(dim, x.rank)
    return split_pieces(ctx, x, axis, [s[axis] for s in _out_shapes(ctx)])


def convert_split(ctx: ConversionContext, x: Value, split_size: Any, dim: int = 0) -> list[str]:
    return _split_from_meta(ctx, x, dim)


def convert_chunk(ctx: ConversionContext, x: Value, chunks: int, dim: int = 0) -> list[str]:
    return _split_from_meta(ctx, x, dim)


def convert_tensor_split(ctx: ConversionContext, x: Value, sections: Any, dim: int = 0) -> list[str]:
    axis = normalize_axis(dim, x.rank)
    if isinstance(sections, Value) and not is_static([s[axis] for s in _out_shapes(ctx)]):
        sizes = _constant_split_sizes(ctx, x, sections, axis)
        if sizes is not None:
            return split_pieces(ctx, x, axis, sizes)
        if sections.rank != 1:
            raise ctx.error(
                "tensor_split into a number of sections held in a tensor gives a data-dependent number "
                "of pieces; pass an int"
            )
        return _split_at_indices(ctx, x, sections, axis)
    return _split_from_meta(ctx, x, dim)


def _split_at_indices(ctx: ConversionContext, x: Value, indices: Value, axis: int) -> list[str]:
    """tensor_split at runtime indices: piece i is x[idx[i-1]:idx[i]] along ``axis`` with Python slice
    semantics (negative indices wrap, bounds clamp, a start past its end gives an empty piece), which
    are ONNX Slice's."""
    count = indices.shape[0]
    if not isinstance(count, int):
        raise ctx.error("tensor_split needs a static number of indices (the number of pieces)")
    idx = ctx.cast(indices, torch.int64)
    axes = ctx.i64([axis])
    bounds = [ctx.i64([0])]
    bounds += [ctx.op("Slice", idx, ctx.i64([i]), ctx.i64([i + 1])) for i in range(count)]
    bounds.append(ctx.i64([torch.iinfo(torch.int64).max]))
    return [ctx.op("Slice", x, bounds[i], bounds[i + 1], axes) for i in range(count + 1)]


def _constant_split_sizes(ctx: ConversionContext, x: Value, sections: Value, axis: int) -> list[int] | None:
    """Piece sizes when the indices / sections tensor is a graph constant and the dim is static."""
    raw = ctx.g.constant_bytes(sections.name)
    n = x.shape[axis]
    if raw is None or not isinstance(n, int) or sections.dtype != torch.int64:
        return None
    values = torch.frombuffer(bytearray(raw), dtype=torch.int64).tolist() if raw else []
    probe = torch.empty(n)
    if sections.rank == 0:
        pieces = torch.tensor_split(probe, int(values[0]))
    else:
        pieces = torch.tensor_split(probe, [int(v) for v in values])
    return [int(p.shape[0]) for p in pieces]


def _numpy_split(dim_for_rank: Callable[[int], int], name: str, min_rank: int) -> Callable[..., Any]:
    """hsplit / vsplit / dsplit: tensor_split along a fixed dim (sizes from the FX metadata)."""

    def convert(ctx: ConversionContext, x: Value, sections: Any) -> list[str]:
        if x.rank < min_rank:
            raise ctx.error(f"{name} needs a tensor of rank >= {min_rank}")
        return _split_from_meta(ctx, x, dim_for_rank(x.rank))

    convert.__name__ = f"convert_{name}"
    return convert


convert_hsplit = _numpy_split(lambda rank: 1 if rank > 1 else 0, "hsplit", 1)
convert_vsplit = _numpy_split(lambda rank: 0, "vsplit", 2)
convert_dsplit = _numpy_split(lambda rank: 2, "dsplit", 3)


def convert_chunk_cat(ctx: ConversionContext, tensors: Sequence[Value], dim: int, num_chunks: int) -> str:
    """Each tensor padded with zeros along ``dim`` to a multiple of ``num_chunks``, viewed as
    ``shape[:dim] + (num_chunks, -1)`` and concatenated along ``dim + 1``."""
    dtype = ctx.out_dtype
    parts = []
    for t in tensors:
        axis = normalize_axis(dim, t.rank)
        n = t.shape[axis]
        if not isinstance(n, int):
            raise ctx.error("_chunk_cat needs a static size along dim")
        v = ctx.cast(t, dtype)
        padded = -(-n // num_chunks) * num_chunks
        if padded != n:
            pads = [0] * (2 * t.rank)
            pads[t.rank + axis] = padded - n
            # Pad has no 16-bit integer kernels in onnxruntime: int32 holds them exactly
            wide = torch.int32 if dtype in (torch.int16, torch.uint16) else dtype
            v = ctx.cast(ctx.op("Pad", ctx.cast(v, wide), ctx.i64(pads), ctx.const(0, wide)), dtype)
        shape = shape_of(ctx, [*t.shape[:axis], num_chunks, -1], (t,), unknown_ok=0)
        if shape is None:
            raise ctx.error("_chunk_cat: a symbolic leading dim is not available at runtime")
        parts.append(ctx.op("Reshape", v, shape))
    if len(parts) == 1:
        return parts[0]
    return ctx.op("Concat", *parts, axis=normalize_axis(dim, tensors[0].rank) + 1)


def convert_unbind(ctx: ConversionContext, x: Value, dim: int = 0) -> list[str]:
    axis = normalize_axis(dim, x.rank)
    n = len(ctx.out)
    if n == 0:
        return []
    pieces = split_pieces(ctx, x, axis, [1] * n) if n > 1 else [x.name]
    return [ctx.op("Squeeze", p, ctx.i64([axis])) for p in pieces]


# ---- reordering and repeating --------------------------------------------------------------------
def convert_flip(ctx: ConversionContext, x: Value, dims: Sequence[int]) -> str:
    axes = sorted({normalize_axis(d, x.rank) for d in dims}) if x.rank else []
    if not axes:
        return ctx.op("Identity", x)
    static = [a for a in axes if isinstance(x.shape[a], int)]
    y = x.name
    # static dims: Gather with reversed indices (the builder's no-op pass would drop a reversing Slice
    # whose output has the input's static shape)
    for a in static:
        y = ctx.op("Gather", y, ctx.i64(list(range(x.shape[a] - 1, -1, -1))), axis=a)
    rest = [a for a in axes if a not in static]
    if rest:
        n = len(rest)
        y = ctx.op("Slice", y, ctx.i64([-1] * n), ctx.i64([INT64_MIN] * n), ctx.i64(rest), ctx.i64([-1] * n))
    return y


def convert_fliplr(ctx: ConversionContext, x: Value) -> str:
    return convert_flip(ctx, x, [1])


def convert_flipud(ctx: ConversionContext, x: Value) -> str:
    return convert_flip(ctx, x, [0])


def _roll_axis(ctx: ConversionContext, x: Any, axis: int, shift: int, size: Any) -> str:
    if isinstance(size, int):
        if size == 0:
            return x if isinstance(x, str) else x.name
        s = shift % size
        if s == 0:
            return ctx.op("Identity", x)
        tail = slice_axis(ctx, x, axis, size - s, INT64_MAX)
        head = slice_axis(ctx, x, axis, 0, size - s)
        return ctx.op("Concat", tail, head, axis=axis)
    n = ctx.sym_value(size)
    cut = ctx.op("Sub", n, ctx.op("Mod", ctx.i64(shift), n))
    tail = slice_axis(ctx, x, axis, cut, INT64_MAX)
    head = slice_axis(ctx, x, axis, 0, cut)
    return ctx.op("Concat", tail, head, axis=axis)


def convert_roll(ctx: ConversionContext, x: Value, shifts: Sequence[int], dims: Sequence[int] = ()) -> str:
    shifts = [shifts] if isinstance(shifts, int) else list(shifts)
    dims = [dims] if isinstance(dims, int) else list(dims)
    if not dims:
        # roll the flattened tensor, then restore the shape
        flat = ctx.op("Reshape", x, ctx.i64([-1]))
        static = x.static_shape()
        total: Any = (
            math.prod(static) if static is not None else ctx.op("ReduceProd", ctx.op("Shape", x), keepdims=0)
        )
        return reshape(ctx, _roll_axis(ctx, flat, 0, shifts[0], total), x.shape, (x,))
    y: Any = x
    for shift, dim in zip(shifts, dims):
        axis = normalize_axis(dim, x.rank)
        y = _roll_axis(ctx, y, axis, shift, dim_scalar(ctx, x, axis))
    return y if isinstance(y, str) and y != x.name else ctx.op("Identity", y)


def convert_repeat(ctx: ConversionContext, x: Value, repeats: Sequence[Any]) -> str:
    extra = len(repeats) - x.rank
    y: Any = x
    if extra > 0:
        y = ctx.op("Unsqueeze", x, ctx.i64(list(range(extra))))
    return ctx.op("Tile", y, ctx.shape_tensor(list(repeats)))


def convert_tile(ctx: ConversionContext, x: Value, dims: Sequence[Any]) -> str:
    reps = list(dims)
    if len(reps) < x.rank:
        reps = [1] * (x.rank - len(reps)) + reps
    return convert_repeat(ctx, x, reps)


# ---- padding --------------------------------------------------------------------------------------
def _crop_negative(ctx: ConversionContext, x: Value, pad: Sequence[int]) -> tuple[Any, list[int]]:
    """Applies the negative entries of a torch pad list as slices; returns what is left to pad."""
    y: Any = x
    left = list(pad)
    for i in range(len(pad) // 2):
        axis = x.rank - 1 - i
        lo, hi = pad[2 * i], pad[2 * i + 1]
        if lo < 0 or hi < 0:
            y = slice_axis(ctx, y, axis, -lo if lo < 0 else 0, hi if hi < 0 else INT64_MAX)
            left[2 * i] = max(lo, 0)
            left[2 * i + 1] = max(hi, 0)
    return y, left


def _onnx_pads(rank: int, pad: Sequence[Any]) -> list[Any]:
    """torch's pad list ((begin, end) pairs, last axis first) in ONNX's layout: every axis's begin,
    then every axis's end. The amounts are kept as they are (ints, or symbolic ones)."""
    begins: list[Any] = [0] * rank
    ends: list[Any] = [0] * rank
    for i in range(len(pad) // 2):
        begins[rank - 1 - i] = pad[2 * i]
        ends[rank - 1 - i] = pad[2 * i + 1]
    return begins + ends


def _pad(ctx: ConversionContext, x: Value, pad: Sequence[Any], mode: str, value: Any = None) -> str:
    out = ctx.out_shape
    if is_static(out) and 0 in out:
        # an empty result (onnxruntime refuses edge/reflect padding next to an empty dim)
        return ctx.const(torch.zeros(out, dtype=x.dtype), x.dtype)
    if len(pad) % 2 or len(pad) // 2 > x.rank:
        raise ctx.error(f"pad has {len(pad)} entries for a tensor of rank {x.rank}")
    if not is_static(pad):
        return _pad_computed(ctx, x, pad, mode, value)
    if mode == "edge" and any(p < 0 for p in pad):
        return _pad_replicate_gather(ctx, x, pad)
    y, rest = _crop_negative(ctx, x, pad)
    if not any(rest):
        return y if isinstance(y, str) and y != x.name else ctx.op("Identity", y)
    if mode == "circular":
        return _pad_circular(ctx, y, x.rank, rest)
    pads = ctx.i64(_onnx_pads(x.rank, rest))
    if mode == "constant":
        fill = ctx.const(0 if value is None else value, x.dtype)
        return ctx.op("Pad", y, pads, fill, mode="constant")
    return ctx.op("Pad", y, pads, mode=mode)


def _pad_computed(ctx: ConversionContext, x: Value, pad: Sequence[Any], mode: str, value: Any) -> str:
    """Pad amounts computed at run time (from sizes: ``target - x.shape[2]``): one Pad whose ``pads``
    input is assembled from the int64 pieces in ONNX's order. Pad crops where an amount turns out
    negative, as torch does; circular padding is Pad's "wrap" mode there (opset 19)."""
    pads = ctx.shape_tensor(_onnx_pads(x.rank, pad))
    if mode == "circular":
        ctx.require_opset(19, "circular padding by amounts computed at run time (Pad's wrap mode)")
        mode = "wrap"
    if mode == "constant":
        fill = ctx.const(0 if value is None else value, x.dtype)
        return ctx.op("Pad", x, pads, fill, mode="constant")
    return ctx.op("Pad", x, pads, mode=mode)


def _pad_replicate_gather(ctx: ConversionContext, x: Value, pad: Sequence[int]) -> str:
    """Replicate padding with negative amounts: out[i] = x[clamp(i - left, 0, n - 1)] per padded dim."""
    y: Any = x
    for i in range(len(pad) // 2):
        axis = x.rank - 1 - i
        lo, hi = pad[2 * i], pad[2 * i + 1]
        n = x.shape[axis]
        if not isinstance(n, int):
            raise ctx.error("replicate padding with negative amounts needs static sizes")
        if lo == 0 and hi == 0:
            continue
        idx = [min(max(j - lo, 0), n - 1) for j in range(n + lo + hi)]
        y = ctx.op("Gather", y, ctx.i64(idx), axis=axis)
    return y if isinstance(y, str) else ctx.op("Identity", y)


def _pad_circular(ctx: ConversionContext, x: Value | str, rank: int, pad: Sequence[int]) -> str:
    # wrap-around by concatenating slices: the same graph at every opset (Pad's "wrap" needs 19)
    y = x.name if isinstance(x, Value) else x
    for i in range(len(pad) // 2):
        axis = rank - 1 - i
        lo, hi = pad[2 * i], pad[2 * i + 1]
        parts = []
        if lo:
            parts.append(slice_axis(ctx, y, axis, -lo, INT64_MAX))
        parts.append(y)
        if hi:
            parts.append(slice_axis(ctx, y, axis, 0, hi))
        if len(parts) > 1:
            y = ctx.op("Concat", *parts, axis=axis)
    return y


def convert_constant_pad_nd(ctx: ConversionContext, x: Value, pad: Sequence[int], value: Any = 0) -> str:
    return _pad(ctx, x, pad, "constant", value)


_PAD_MODES = {"constant": "constant", "reflect": "reflect", "replicate": "edge", "circular": "circular"}


def convert_pad(
    ctx: ConversionContext, x: Value, pad: Sequence[int], mode: str = "constant", value: Any = None
) -> str:
    if mode not in _PAD_MODES:
        raise ctx.error(f"pad mode {mode!r} is not supported (constant, reflect, replicate, circular)")
    return _pad(ctx, x, pad, _PAD_MODES[mode], value)


def _pad_mode(mode: str) -> Callable[..., Any]:
    def convert(ctx: ConversionContext, x: Value, padding: Sequence[int]) -> str:
        return _pad(ctx, x, padding, mode)

    convert.__name__ = f"convert_pad_{mode}"
    return convert


# ---- triangles and diagonals ---------------------------------------------------------------------


def _trilu(ctx: ConversionContext, x: Value, diagonal: Any, upper: int) -> str:
    k = ctx.i64(diagonal) if isinstance(diagonal, int) else ctx.sym_value(diagonal)
    if x.dtype in NATIVE["Trilu"]:
        return ctx.op("Trilu", x, k, upper=upper)
    # onnxruntime's Trilu has no kernel for this dtype: select with a mask, exact for every dtype
    ones = ctx.op("Shape", x, start=-2) if x.static_shape() is None else ctx.i64(list(x.shape[-2:]))
    mask = ctx.op(
        "Trilu", ctx.op("ConstantOfShape", ones, value=ctx.tensor_attr(True, torch.bool)), k, upper=upper
    )
    return where(ctx, mask, x, 0, x.dtype)


def convert_tril(ctx: ConversionContext, x: Value, diagonal: Any = 0) -> str:
    return _trilu(ctx, x, diagonal, 0)


def convert_triu(ctx: ConversionContext, x: Value, diagonal: Any = 0) -> str:
    return _trilu(ctx, x, diagonal, 1)


def convert_diagonal(ctx: ConversionContext, x: Value, offset: int = 0, dim1: int = 0, dim2: int = 1) -> str:
    a, b = normalize_axis(dim1, x.rank), normalize_axis(dim2, x.rank)
    rows, cols = x.shape[a], x.shape[b]
    if not (isinstance(rows, int) and isinstance(cols, int)):
        raise ctx.error("diagonal needs static sizes for dim1 and dim2")
    perm = [i for i in range(x.rank) if i not in (a, b)] + [a, b]
    y = transpose(ctx, x, perm)
    r, c = diagonal_positions(rows, cols, offset)
    flat_idx = [i * cols + j for i, j in zip(r, c)]
    batch = [x.shape[i] for i in perm[:-2]]
    flat = reshape(ctx, y, [*batch, rows * cols], (x,)) if x.rank > 2 else ctx.op("Reshape", y, ctx.i64([-1]))
    return ctx.op("Gather", flat, ctx.i64(flat_idx), axis=x.rank - 2)


def convert_diag_embed(
    ctx: ConversionContext, x: Value, offset: int = 0, dim1: int = -2, dim2: int = -1
) -> str:
    n = x.shape[-1]
    if not isinstance(n, int):
        raise ctx.error("diag_embed needs a static last dim")
    m = n + abs(offset)
    out_rank = x.rank + 1
    a, b = normalize_axis(dim1, out_rank), normalize_axis(dim2, out_rank)
    # rows hold x[..., i] where the column is i + offset; Where (not Mul) keeps inf/nan exact
    eye = torch.zeros(m, m, dtype=torch.bool)
    r, c = diagonal_positions(m, m, offset)
    eye[r, c] = True
    src = torch.zeros(m, m, dtype=torch.int64)
    src[r, c] = torch.arange(len(r))
    # value at (r, c) comes from x[..., k]: gather x along its last dim with a (m*m) index, then mask
    gathered = ctx.op("Gather", x, ctx.i64(src.reshape(-1).tolist()), axis=x.rank - 1)
    batch = list(x.shape[:-1])
    square = (
        reshape(ctx, gathered, [*batch, m, m], (x,))
        if batch
        else ctx.op("Reshape", gathered, ctx.i64([m, m]))
    )
    masked = where(ctx, ctx.const(eye, torch.bool), square, 0, x.dtype)
    # the two new dims sit last (rows, cols); move them to dim1, dim2
    perm: list[int | None] = [None] * out_rank
    perm[a], perm[b] = out_rank - 2, out_rank - 1
    rest = iter(range(out_rank - 2))
    return transpose(ctx, masked, [p if p is not None else next(rest) for p in perm])


# ---- more layout ops ------------------------------------------------------------------------------
def convert_ravel(ctx: ConversionContext, x: Value) -> str:
    return ctx.op("Reshape", x, ctx.i64([-1]))


def convert_matrix_t(ctx: ConversionContext, x: Value) -> str:
    if x.dtype.is_complex:
        raise ctx.error("complex tensors are not supported")
    return convert_transpose(ctx, x, -2, -1)


def convert_resize(ctx: ConversionContext, x: Value, size: Sequence[Any], **_: Any) -> str:
    """``resize_``: the first numel(size) elements of x's (contiguous) storage in the new shape. A
    growing resize exposes uninitialised memory in torch; here those elements are zeros."""
    assert ctx.node is not None
    arg = ctx.node.args[0]
    val = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
    shape = x.static_shape()
    if val is None or shape is None or not is_static(size):
        raise ctx.error("resize_ needs static sizes")
    if not val.is_contiguous():
        raise ctx.error("resize_ of a tensor that is not contiguous")
    old, new = math.prod(shape), math.prod(size)
    flat = ctx.op("Reshape", x, ctx.i64([-1]))
    if new < old:
        flat = slice_axis(ctx, flat, 0, 0, new)
    elif new > old:
        flat = ctx.op("Pad", flat, ctx.i64([0, new - old]), ctx.const(0, x.dtype))
    return ctx.op("Reshape", flat, ctx.i64([int(d) for d in size]), allowzero=1 if 0 in size else None)


def convert_resize_as(ctx: ConversionContext, x: Value, template: Value, **_: Any) -> str:
    return convert_resize(ctx, x, template.shape)


def convert_numpy_t(ctx: ConversionContext, x: Value) -> str:
    """``x.T``: every dim reversed."""
    return transpose(ctx, x, list(range(x.rank))[::-1])


def convert_matrix_h(ctx: ConversionContext, x: Value) -> str:
    """``x.H`` of a 2-D (real) tensor: its transpose."""
    if x.rank != 2:
        raise ctx.error("matrix_H needs a 2-D tensor")
    return convert_matrix_t(ctx, x)


def convert_rot90(ctx: ConversionContext, x: Value, k: int = 1, dims: Sequence[int] = (0, 1)) -> str:
    a, b = (normalize_axis(d, x.rank) for d in dims)
    k %= 4
    if k == 0:
        return ctx.op("Identity", x)
    if k == 2:
        return convert_flip(ctx, x, [a, b])
    # k=1: flip dims[1] then swap; k=3: flip dims[0] then swap (torch's definition)
    flipped = convert_flip(ctx, x, [b] if k == 1 else [a])
    perm = list(range(x.rank))
    perm[a], perm[b] = perm[b], perm[a]
    return transpose(ctx, flipped, perm)


def convert_unfold(ctx: ConversionContext, x: Value, dimension: int, size: int, step: int) -> str:
    """Sliding windows along ``dimension``: [..., n_windows, ...] with the window as a new last dim."""
    if x.rank == 0:
        return ctx.op("Reshape", x, ctx.i64([1]))
    axis = normalize_axis(dimension, x.rank)
    n = x.shape[axis]
    if isinstance(n, int):
        windows = (n - size) // step + 1
        idx = [[w * step + j for j in range(size)] for w in range(windows)]
        index: Any = ctx.const(torch.tensor(idx, dtype=torch.int64).reshape(windows, size), torch.int64)
    else:  # a symbolic length: the windows' starts from a Range over (n - size) // step + 1
        length = ctx.op("Shape", x, start=axis, end=axis + 1)
        count = ctx.op(
            "Add", ctx.op("Div", ctx.op("Sub", length, ctx.i64([size])), ctx.i64([step])), ctx.i64([1])
        )
        count = ctx.op("Reshape", count, ctx.i64([]))
        starts = ctx.op("Mul", ctx.op("Range", ctx.i64(0), count, ctx.i64(1)), ctx.i64(step))
        within = ctx.const(torch.arange(size, dtype=torch.int64).reshape(1, size), torch.int64)
        index = ctx.op("Add", ctx.op("Unsqueeze", starts, ctx.i64([1])), within)
    # Gather with a [windows, size] index puts both dims where the axis was; move size last
    gathered = ctx.op("Gather", x, index, axis=axis)
    perm = [i for i in range(x.rank + 1) if i != axis + 1] + [axis + 1]
    return transpose(ctx, gathered, perm)


def convert_repeat_interleave(
    ctx: ConversionContext, x: Value, repeats: Any, dim: int | None = None, *, output_size: Any = None
) -> str:
    if isinstance(repeats, Value) and repeats.static_shape() in ((1,), ()):
        repeats_v: Any = ctx.op("Reshape", ctx.cast(repeats, torch.int64), ctx.i64([]))
    elif isinstance(repeats, Value):
        return _repeat_interleave_tensor(ctx, x, repeats, dim)
    else:
        repeats_v = repeats
    src: Any = x
    axis = 0 if dim is None else normalize_axis(dim, x.rank)
    if dim is None:
        src = ctx.op("Reshape", x, ctx.i64([-1]))
        rank = 1
    else:
        rank = x.rank
    # insert a new axis after ``axis``, repeat along it, merge the two
    up = ctx.op("Unsqueeze", src, ctx.i64([axis + 1]))
    reps = [1] * (rank + 1)
    tiles = ctx.shape_tensor(reps[: axis + 1] + [repeats_v] + reps[axis + 2 :])
    tiled = ctx.op("Tile", up, tiles)
    if is_static(ctx.out_shape):
        return reshape(ctx, tiled, ctx.out_shape)
    before = ctx.op("Shape", src, start=0, end=axis)
    after = ctx.op("Shape", src, start=axis + 1)
    return ctx.op("Reshape", tiled, ctx.op("Concat", before, ctx.i64([-1]), after, axis=0))


def _repeat_interleave_tensor(
    ctx: ConversionContext, x: Value | None, repeats: Value, dim: int | None
) -> str:
    """Per-element repeats: output position j reads element i where cumsum[i-1] <= j < cumsum[i]."""
    reps = ctx.cast(repeats, torch.int64)
    ends = ctx.op("CumSum", reps, ctx.i64(0))
    total = ctx.op("ReduceSum", reps, ctx.i64([0]), keepdims=0)
    positions = ctx.op("Range", ctx.i64(0), total, ctx.i64(1))
    # index of each output position: how many cumulative ends are <= it
    le = ctx.op(
        "LessOrEqual", ctx.op("Unsqueeze", ends, ctx.i64([0])), ctx.op("Unsqueeze", positions, ctx.i64([1]))
    )
    idx = ctx.op("ReduceSum", ctx.cast(le, torch.int64), ctx.i64([1]), keepdims=0)
    if x is None:
        return idx
    if dim is None:
        return ctx.op("Gather", ctx.op("Reshape", x, ctx.i64([-1])), idx, axis=0)
    return ctx.op("Gather", x, idx, axis=normalize_axis(dim, x.rank))


def convert_repeat_interleave_indices(
    ctx: ConversionContext, repeats: Value, *, output_size: Any = None
) -> str:
    return _repeat_interleave_tensor(ctx, None, repeats, None)


def convert_meshgrid(ctx: ConversionContext, tensors: Sequence[Value], *, indexing: str = "ij") -> list[str]:
    shapes = [tuple(o.shape) for o in ctx.out]
    out_shape = shapes[0]
    n = len(tensors)
    outs = []
    for i, t in enumerate(tensors):
        # tensor i varies along output axis i ("ij"); "xy" swaps the first two axes
        axis = i
        if indexing == "xy" and n >= 2 and i < 2:
            axis = 1 - i
        shape = [1] * n
        shape[axis] = -1
        col = ctx.op("Reshape", t, ctx.i64(shape))
        outs.append(ctx.op("Expand", col, expand_shape(ctx, out_shape, tensors)))
    return outs


def convert_broadcast_tensors(ctx: ConversionContext, tensors: Sequence[Value]) -> list[str]:
    out_shape = tuple(ctx.out[0].shape)
    if is_static(out_shape):
        shape = ctx.i64(list(out_shape))
    else:
        acc: Any = tensors[0]
        for t in tensors[1:]:
            acc = ctx.op("Expand", acc, ctx.op("Shape", t))
        shape = ctx.op("Shape", acc)
    return [ctx.op("Expand", t, shape) for t in tensors]


def convert_linalg_diagonal(
    ctx: ConversionContext, a: Value, *, offset: int = 0, dim1: int = -2, dim2: int = -1
) -> str:
    return convert_diagonal(ctx, a, offset, dim1, dim2)


def convert_diag(ctx: ConversionContext, x: Value, diagonal: int = 0) -> str:
    if x.rank == 2:
        return convert_diagonal(ctx, x, diagonal, 0, 1)
    if x.rank != 1:
        raise ctx.error(f"diag expects a 1-D or 2-D tensor, got rank {x.rank}")
    return convert_diag_embed(ctx, x, diagonal, 0, 1)


def convert_diagflat(ctx: ConversionContext, x: Value, offset: int = 0) -> str:
    numel = x.static_shape()
    if numel is None:
        raise ctx.error("diagflat needs a static shape")
    flat = Value(ctx.op("Reshape", x, ctx.i64([-1])), x.dtype, (math.prod(numel),))
    return convert_diag_embed(ctx, flat, offset, 0, 1)


def convert_as_strided(
    ctx: ConversionContext, x: Value, size: Sequence[int], stride: Sequence[int], storage_offset: Any = None
) -> str:
    """Reads the storage behind x with the given strides: a Gather over the flattened storage. When x is a
    view (a slice, a transpose... of a base tensor, known from the walker's alias tracking:
    ``ctx.base``), the storage is the base's, so views with a storage offset or other strides read
    what torch reads; otherwise x itself. Exact when torch recorded that tensor as contiguous from the
    start of its storage (ONNX has no other layout)."""
    assert ctx.node is not None
    src = ctx.node.args[0]
    val = src.meta.get("val") if isinstance(src, torch.fx.Node) else None
    if val is None or x.static_shape() is None or not (is_static(size) and is_static(stride)):
        raise ctx.error("as_strided needs static sizes and strides")
    storage, layout = x, val
    if ctx.base is not None and ctx.base_node is not None:
        base_val = ctx.base_node.meta.get("val")
        if isinstance(base_val, torch.Tensor) and base_val.dtype == val.dtype:
            storage, layout = ctx.base, base_val
    if storage.static_shape() is None:
        raise ctx.error("as_strided needs a static shape of the tensor whose storage it reads")
    if not layout.is_contiguous() or layout.storage_offset() != 0:
        what = "a view of a tensor" if storage is not x else "a tensor"
        raise ctx.error(f"as_strided of {what} that is not contiguous from its storage start")
    # an explicit storage offset is absolute; without one, torch keeps the input's own offset
    offset = int(storage_offset) if storage_offset is not None else int(val.storage_offset())
    idx = torch.full(tuple(size), offset, dtype=torch.int64)
    for axis, (n, st) in enumerate(zip(size, stride)):
        view = [1] * len(size)
        view[axis] = n
        idx = idx + (torch.arange(n, dtype=torch.int64) * st).reshape(view)
    numel = math.prod(storage.static_shape() or ())
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= numel):
        raise ctx.error(
            f"as_strided reads positions {int(idx.min())}..{int(idx.max())} of a storage of {numel} elements"
        )
    flat = ctx.op("Reshape", storage, ctx.i64([-1]))
    return ctx.op("Gather", flat, ctx.const(idx, torch.int64), axis=0)


# ---- block-structured products ---------------------------------------------------------------------
def convert_block_diag(ctx: ConversionContext, tensors: Sequence[Value]) -> str:
    dtype = ctx.out_dtype
    blocks = []
    for t in tensors:
        if t.static_shape() is None:
            raise ctx.error("block_diag needs static shapes")
        rows, cols = {0: (1, 1), 1: (1, t.shape[0] if t.rank else 1)}.get(t.rank, tuple(t.shape[:2]))
        blocks.append((ctx.op("Reshape", ctx.cast(t, dtype), ctx.i64([rows, cols])), rows, cols))
    total = sum(c for _, _, c in blocks)
    rows_out = []
    left = 0
    for name, rows, cols in blocks:
        if rows == 0:
            left += cols
            continue
        # each block is padded with zeros to the full width, then the rows are stacked
        parts = []
        if left:
            parts.append(ctx.const(torch.zeros(rows, left, dtype=dtype), dtype))
        parts.append(name)
        if total - left - cols:
            parts.append(ctx.const(torch.zeros(rows, total - left - cols, dtype=dtype), dtype))
        rows_out.append(parts[0] if len(parts) == 1 else ctx.op("Concat", *parts, axis=1))
        left += cols
    if not rows_out:
        return ctx.const(torch.zeros(ctx.out_shape, dtype=dtype), dtype)
    return rows_out[0] if len(rows_out) == 1 else ctx.op("Concat", *rows_out, axis=0)


def convert_cartesian_prod(ctx: ConversionContext, tensors: Sequence[Value]) -> str:
    dtype = ctx.out_dtype
    if len(tensors) == 1:
        return ctx.op("Identity", ctx.cast(tensors[0], dtype))
    sizes = [t.shape[0] for t in tensors]
    if not is_static(sizes):
        raise ctx.error("cartesian_prod needs static sizes")
    n = len(tensors)
    cols = []
    for i, t in enumerate(tensors):
        shape = [1] * n
        shape[i] = -1
        grid = ctx.op("Expand", ctx.op("Reshape", ctx.cast(t, dtype), ctx.i64(shape)), ctx.i64(sizes))
        cols.append(ctx.op("Reshape", grid, ctx.i64([-1, 1])))
    return ctx.op("Concat", *cols, axis=1)


def convert_kron(ctx: ConversionContext, a: Value, b: Value) -> str:
    dtype = ctx.out_dtype
    sa, sb = a.static_shape(), b.static_shape()
    if sa is None or sb is None:
        raise ctx.error("kron needs static shapes")
    r = max(len(sa), len(sb))
    sa = (1,) * (r - len(sa)) + sa
    sb = (1,) * (r - len(sb)) + sb
    # a as [a0, 1, a1, 1, ...] times b as [1, b0, 1, b1, ...], then merge each pair of dims
    ia = [d for x in sa for d in (x, 1)]
    ib = [d for x in sb for d in (1, x)]
    prod = ctx.op(
        "And" if dtype == torch.bool else "Mul",
        ctx.op("Reshape", ctx.cast(a, dtype), ctx.i64(ia)),
        ctx.op("Reshape", ctx.cast(b, dtype), ctx.i64(ib)),
    )
    return reshape(ctx, prod, [x * y for x, y in zip(sa, sb)])


def convert_combinations(ctx: ConversionContext, x: Value, r: int = 2, with_replacement: bool = False) -> str:
    import itertools

    n = x.shape[0]
    if not isinstance(n, int):
        raise ctx.error("combinations needs a static size")
    pick = itertools.combinations_with_replacement if with_replacement else itertools.combinations
    idx = list(pick(range(n), r))
    if not idx or r == 0:
        return ctx.const(torch.zeros(ctx.out_shape, dtype=x.dtype), x.dtype)
    return ctx.op("Gather", x, ctx.const(torch.tensor(idx, dtype=torch.int64), torch.int64), axis=0)


CONVERTERS: dict[str, Converter] = {
    "aten.view.default": convert_view,
    "aten._unsafe_view.default": convert_view,
    "aten.view_copy.default": convert_view,
    "aten.reshape.default": convert_view,
    "aten.view_as.default": convert_view_as,
    "aten.reshape_as.default": convert_view_as,
    "aten.flatten.using_ints": convert_flatten,
    "aten.unflatten.int": convert_unflatten,
    "aten.transpose.int": convert_transpose,
    "aten.transpose_copy.int": convert_transpose,
    "aten.swapaxes.default": convert_transpose,
    "aten.swapdims.default": convert_transpose,
    "aten.permute.default": convert_permute,
    "aten.permute_copy.default": convert_permute,
    "aten.t.default": convert_t,
    "aten.t_copy.default": convert_t,
    "aten.movedim.int": convert_movedim,
    "aten.movedim.intlist": convert_movedim,
    "aten.moveaxis.int": convert_movedim,
    "aten.moveaxis.intlist": convert_movedim,
    "aten.unsqueeze.default": convert_unsqueeze,
    "aten.unsqueeze_copy.default": convert_unsqueeze,
    "aten.squeeze.default": convert_squeeze,
    "aten.squeeze.dim": convert_squeeze,
    "aten.squeeze.dims": convert_squeeze,
    "aten.squeeze_copy.default": convert_squeeze,
    "aten.squeeze_copy.dim": convert_squeeze,
    "aten.squeeze_copy.dims": convert_squeeze,
    "aten.expand.default": convert_expand,
    "aten.expand_copy.default": convert_expand,
    "aten.expand_as.default": convert_expand_as,
    "aten.broadcast_to.default": convert_broadcast_to,
    "aten.slice.Tensor": convert_slice,
    "aten.slice_copy.Tensor": convert_slice,
    "aten.narrow.default": convert_narrow,
    "aten.narrow_copy.default": convert_narrow,
    "aten.select.int": convert_select,
    "aten.select_copy.int": convert_select,
    "aten.cat.default": convert_cat,
    "aten.concat.default": convert_cat,
    "aten.concatenate.default": convert_cat,
    "aten.stack.default": convert_stack,
    "aten.hstack.default": convert_hstack,
    "aten.vstack.default": convert_vstack,
    "aten.dstack.default": convert_dstack,
    "aten.column_stack.default": convert_column_stack,
    "aten.atleast_1d.default": _atleast(1),
    "aten.atleast_1d.Sequence": _atleast(1),
    "aten.atleast_2d.default": _atleast(2),
    "aten.atleast_2d.Sequence": _atleast(2),
    "aten.atleast_3d.default": _atleast(3),
    "aten.atleast_3d.Sequence": _atleast(3),
    "aten.split.Tensor": convert_split,
    "aten.split.sizes": convert_split,
    "aten.split_with_sizes.default": convert_split,
    "aten.split_with_sizes_copy.default": convert_split,
    "aten.unsafe_split.Tensor": convert_split,
    "aten.unsafe_split_with_sizes.default": convert_split,
    "aten.chunk.default": convert_chunk,
    "aten.unsafe_chunk.default": convert_chunk,
    "aten.tensor_split.sections": convert_tensor_split,
    "aten.tensor_split.indices": convert_tensor_split,
    "aten.tensor_split.tensor_indices_or_sections": convert_tensor_split,
    "aten.unbind.int": convert_unbind,
    "aten.unbind_copy.int": convert_unbind,
    "aten.flip.default": convert_flip,
    "aten.fliplr.default": convert_fliplr,
    "aten.flipud.default": convert_flipud,
    "aten.roll.default": convert_roll,
    "aten.repeat.default": convert_repeat,
    "aten.tile.default": convert_tile,
    "aten.constant_pad_nd.default": convert_constant_pad_nd,
    "aten.pad.default": convert_pad,
    "aten.reflection_pad1d.default": _pad_mode("reflect"),
    "aten.reflection_pad2d.default": _pad_mode("reflect"),
    "aten.reflection_pad3d.default": _pad_mode("reflect"),
    "aten.replication_pad1d.default": _pad_mode("edge"),
    "aten.replication_pad2d.default": _pad_mode("edge"),
    "aten.replication_pad3d.default": _pad_mode("edge"),
    "aten._pad_circular.default": _pad_mode("circular"),
    "aten.tril.default": convert_tril,
    "aten.triu.default": convert_triu,
    "aten.diagonal.default": convert_diagonal,
    "aten.diagonal_copy.default": convert_diagonal,
    "aten.diag_embed.default": convert_diag_embed,
    "aten.diag.default": convert_diag,
    "aten.diagflat.default": convert_diagflat,
    "aten.linalg_diagonal.default": convert_linalg_diagonal,
    "aten.ravel.default": convert_ravel,
    "aten.mT.default": convert_matrix_t,
    "aten.mH.default": convert_matrix_t,
    "aten.adjoint.default": convert_matrix_t,
    "aten.matrix_H.default": convert_matrix_h,
    "aten.numpy_T.default": convert_numpy_t,
    "aten.hsplit.int": convert_hsplit,
    "aten.hsplit.array": convert_hsplit,
    "aten.vsplit.int": convert_vsplit,
    "aten.vsplit.array": convert_vsplit,
    "aten.dsplit.int": convert_dsplit,
    "aten.dsplit.array": convert_dsplit,
    "aten._chunk_cat.default": convert_chunk_cat,
    "aten.resize.default": convert_resize,
    "aten.resize_as.default": convert_resize_as,
    "aten.rot90.default": convert_rot90,
    "aten.unfold.default": convert_unfold,
    "aten.unfold_copy.default": convert_unfold,
    "aten.repeat_interleave.self_int": convert_repeat_interleave,
    "aten.repeat_interleave.self_Tensor": convert_repeat_interleave,
    "aten.repeat_interleave.Tensor": convert_repeat_interleave_indices,
    "aten.meshgrid.default": convert_meshgrid,
    "aten.meshgrid.indexing": convert_meshgrid,
    "aten.broadcast_tensors.default": convert_broadcast_tensors,
    "aten.block_diag.default": convert_block_diag,
    "aten.as_strided.default": convert_as_strided,
    "aten.as_strided_copy.default": convert_as_strided,
    "aten.cartesian_prod.default": convert_cartesian_prod,
    "aten.kron.default": convert_kron,
    "aten.combinations.default": convert_combinations,
}
