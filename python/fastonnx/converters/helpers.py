"""Building blocks several converter families share: opset-dependent forms of common ONNX ops."""

from __future__ import annotations

from collections.abc import Sequence

from fastonnx.context import ConversionContext, Operand


def normalize_axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def reduce(
    ctx: ConversionContext,
    op_type: str,
    x: Operand,
    axes: Sequence[int] | None,
    keepdims: bool,
) -> str:
    """ReduceX over ``axes`` (None = all). Axes are an input for ReduceSum (opset 13+) and, from opset
    18, for every Reduce op; an attribute before that."""
    keep = 1 if keepdims else 0
    if axes is None or len(axes) == 0:
        return ctx.op(op_type, x, keepdims=keep)
    if op_type == "ReduceSum" or ctx.opset >= 18:
        return ctx.op(op_type, x, ctx.i64(list(axes)), keepdims=keep)
    return ctx.op(op_type, x, keepdims=keep, axes=list(axes))


def unsqueeze(ctx: ConversionContext, x: Operand, axes: Sequence[int]) -> str:
    return ctx.op("Unsqueeze", x, ctx.i64(list(axes)))


def squeeze(ctx: ConversionContext, x: Operand, axes: Sequence[int] | None = None) -> str:
    if axes is None:
        return ctx.op("Squeeze", x)
    return ctx.op("Squeeze", x, ctx.i64(list(axes)))


def split(ctx: ConversionContext, x: Operand, sizes: Sequence[int], axis: int) -> list[str]:
    """Split into pieces of the given static sizes along ``axis``."""
    return ctx.op("Split", x, ctx.i64(list(sizes)), axis=axis, outputs=len(sizes))
