"""Attention's building blocks, shared by torch's scaled_dot_product_attention (``attention``) and
ONNX's Attention as ``torch.onnx.ops`` records it (``onnx_ops``): the default scale, key / value heads
repeated for grouped-query attention, the causal mask (top-left or shifted by a past), and the rows a
mask closes entirely.

Their forms are the ones the attention fusions match (docs/architecture.md, "Converter output the
fusions rely on"): a change here must keep tests/passes green.
"""

from __future__ import annotations

import math

import torch

from fastonnx.context import ConversionContext, Value
from fastonnx.converters.lib.kernels import opmath_dtype
from fastonnx.converters.lib.ops import reduce, unsqueeze


def repeat_kv_heads(ctx: ConversionContext, x: str, value: Value, q_heads: int) -> str:
    """Each of the key / value heads of ``x`` (recorded as ``value``: heads on dim -3) repeated
    q_heads / kv_heads times in place (repeat_interleave on the heads dim), as torch's math kernel and
    ONNX's Attention do; unchanged when the head counts are equal."""
    kv_heads = value.shape[-3]
    if not isinstance(kv_heads, int):
        raise ctx.error("grouped-query attention needs a static number of key/value heads")
    if q_heads % kv_heads:
        raise ctx.error(f"{q_heads} query heads are not a multiple of {kv_heads} key/value heads")
    group = q_heads // kv_heads
    if group == 1:
        return x
    rank = value.rank
    spread = unsqueeze(ctx, x, [rank - 2])  # (..., Hkv, 1, S, E)
    spread = ctx.op("Expand", spread, ctx.i64([1] * (rank - 2) + [group, 1, 1]))
    shape = ctx.op(
        "Concat",
        ctx.op("Shape", x, start=0, end=rank - 3),
        ctx.i64([q_heads]),
        ctx.op("Shape", x, start=rank - 2),
        axis=0,
    )
    return ctx.op("Reshape", spread, shape)


def causal_mask(ctx: ConversionContext, q: Value, k: Value, offset: int | str = 0) -> str:
    """True where query row i may attend key column j: j <= i + offset (``ones(L, S).tril(offset)``).

    ``offset`` 0 is torch's is_causal (aligned top-left); ONNX's Attention shifts it by the past's
    length (an int, or a 0-d int64 value) so that the new queries see every past key."""
    lq, sk = q.shape[-2], k.shape[-2]
    if isinstance(lq, int) and isinstance(sk, int) and isinstance(offset, int):
        return ctx.const(torch.ones(lq, sk, dtype=torch.bool).tril(offset), torch.bool)
    zero, one = ctx.i64(0), ctx.i64(1)
    rows = ctx.op("Range", zero, ctx.op("Squeeze", ctx.op("Shape", q, start=-2, end=-1), ctx.i64([0])), one)
    cols = ctx.op("Range", zero, ctx.op("Squeeze", ctx.op("Shape", k, start=-2, end=-1), ctx.i64([0])), one)
    if offset != 0:
        rows = ctx.op("Add", rows, ctx.i64(offset) if isinstance(offset, int) else offset)
    return ctx.op("GreaterOrEqual", unsqueeze(ctx, rows, [1]), cols)


def attention_scale(ctx: ConversionContext, q: Value, scale: float | None, dtype: torch.dtype) -> str:
    """``scale``, or 1 / sqrt(head size of q) (a Shape read when that size is symbolic), as ``dtype``."""
    if scale is not None:
        return ctx.const(float(scale), dtype)
    e = q.shape[-1]
    if isinstance(e, int):
        return ctx.const(1.0 / math.sqrt(e), dtype)
    e_value = ctx.cast(ctx.op("Shape", q, start=-1), dtype)
    return ctx.op("Reciprocal", ctx.op("Sqrt", e_value))


def closed_rows(ctx: ConversionContext, mask: Value) -> str:
    """True where a row of the mask lets nothing through (all False, or all -inf for a float mask)."""
    last = [mask.rank - 1]
    if mask.dtype == torch.bool:
        open_any = reduce(ctx, "ReduceMax", ctx.cast(mask, torch.int32), last, keepdims=True)
        closed = ctx.op("Equal", open_any, ctx.const(0, torch.int32))
    else:
        work = opmath_dtype(mask.dtype)
        row_max = reduce(ctx, "ReduceMax", ctx.cast(mask, work), last, keepdims=True)
        closed = ctx.op("Equal", row_max, ctx.const(-math.inf, work))
    # recorded so that the attention fusion can see it is one flag per row
    ctx.g.set_type(closed, *ctx.onnx_type(torch.bool, (*mask.shape[:-1], 1)))
    return closed
