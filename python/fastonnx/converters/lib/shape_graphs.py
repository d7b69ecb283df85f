"""Shapes as tensors: a dim or a whole shape from ints, SymInts and Values (the runtime shape of a
graph input or of another value carrying the same symbol), slicing one axis, transposes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastonnx.context import ConversionContext, Operand, Value

INT64_MAX = 2**63 - 1


# ---- shape building blocks (indexing.py and creation.py use them too) ----------------------------
def is_static(dims: Sequence[Any]) -> bool:
    return all(isinstance(d, int) for d in dims)


def dim_key(ctx: ConversionContext, d: Any) -> str:
    return str(ctx.dim(d))


def dim_piece(ctx: ConversionContext, d: Any, sources: Sequence[Value] = ()) -> str | None:
    """A 1-element 1-D int64 tensor holding one dim (int, SymInt or Value), or None when a SymInt is
    neither a graph input's dim, nor a dim of one of ``sources``, nor of a value computed so far."""
    if isinstance(d, int):
        return ctx.i64([d])
    if isinstance(d, (Value, str)):
        return ctx.unsqueeze0(ctx.sym_value(d))
    key = dim_key(ctx, d)
    if key in ctx.sym_values or key in ctx.sym_sources:
        return ctx.unsqueeze0(ctx.sym_value(d))
    for src in sources:
        for axis, sd in enumerate(src.shape):
            if not isinstance(sd, int) and dim_key(ctx, sd) == key:
                return ctx.op("Shape", src, start=axis, end=axis + 1)
    found = ctx.find_dim(key) if ctx.find_dim is not None else None
    if found is not None:
        ctx.sym_sources[key] = found
        return ctx.unsqueeze0(ctx.sym_value(d))
    return None


def dim_scalar(ctx: ConversionContext, x: Value, axis: int) -> int | str:
    """The size of ``x`` along ``axis``: an int when static, else a 0-d int64 value."""
    d = x.shape[axis]
    if isinstance(d, int):
        return d
    key = dim_key(ctx, d)
    if key in ctx.sym_values or key in ctx.sym_sources:
        return ctx.sym_value(d)  # shared with every other use of this dim
    piece = dim_piece(ctx, d, (x,))
    assert piece is not None  # x itself carries the dim
    return ctx.op("Squeeze", piece, ctx.i64([0]))


def shape_of(
    ctx: ConversionContext, dims: Sequence[Any], sources: Sequence[Value] = (), unknown_ok: int = 1
) -> str | None:
    """A 1-D int64 shape tensor for ``dims`` (ints, SymInts, Values); a constant when all are ints.
    Up to ``unknown_ok`` dims that cannot be found become -1 (Reshape infers one); None when more are
    unknown (nothing is emitted then)."""
    if is_static(dims):
        return ctx.i64([int(d) for d in dims])
    found = [d if isinstance(d, int) else dim_piece(ctx, d, sources) for d in dims]
    if sum(1 for p in found if p is None) > unknown_ok:
        return None
    return ctx.concat_dims([-1 if p is None else p for p in found])


def shape_slice(ctx: ConversionContext, x: Operand, start: int, end: int | None = None) -> str:
    """Shape(x, start[, end]): a piece of x's runtime shape (no end: to the last dim)."""
    if end is None:
        return ctx.op("Shape", x, start=start)
    return ctx.op("Shape", x, start=start, end=end)


def slice_axis(ctx: ConversionContext, x: Any, axis: int, start: Any, end: Any, step: int = 1) -> str:
    """Slice one axis; start/end are ints (negative counts from the end, clamped as in Python) or Values."""
    starts = ctx.i64([start]) if isinstance(start, int) else ctx.unsqueeze0(ctx.sym_value(start))
    ends = ctx.i64([end]) if isinstance(end, int) else ctx.unsqueeze0(ctx.sym_value(end))
    steps = ctx.i64([step]) if step != 1 else None
    return ctx.op("Slice", x, starts, ends, ctx.i64([axis]), steps)


def transpose(ctx: ConversionContext, x: Any, perm: Sequence[int]) -> str:
    if list(perm) == sorted(perm):
        return ctx.op("Identity", x)
    return ctx.op("Transpose", x, perm=list(perm))


def diagonal_positions(rows: int, cols: int, offset: int) -> tuple[list[int], list[int]]:
    if offset >= 0:
        n = max(0, min(rows, cols - offset))
        return list(range(n)), [i + offset for i in range(n)]
    n = max(0, min(rows + offset, cols))
    return [i - offset for i in range(n)], list(range(n))
