"""Embeddings: embedding (a Gather), embedding_renorm's functional form and embedding_bag's bags."""

from __future__ import annotations

import math

import torch

from fastonnx.context import ConversionContext, Converter, Value
from fastonnx.converters.lib.ops import reduce, unsqueeze
from fastonnx.converters.lib.reduction_graphs import axis_norm


# ---- embedding ----------------------------------------------------------------------------------
def convert_embedding(
    ctx: ConversionContext,
    weight: Value,
    indices: Value,
    padding_idx: int = -1,
    scale_grad_by_freq: bool = False,
    sparse: bool = False,
) -> str:
    # padding_idx, scale_grad_by_freq and sparse only change the gradient
    return ctx.op("Gather", weight, indices, axis=0)


def convert_embedding_renorm(
    ctx: ConversionContext, weight: Value, indices: Value, max_norm: float, norm_type: float
) -> str:
    """The functional form of embedding_renorm_: rows named in ``indices`` whose norm exceeds max_norm
    are scaled to max_norm / (norm + 1e-7), as torch does; other rows are unchanged."""
    dtype = weight.dtype
    norms = axis_norm(ctx, weight.name, norm_type, 1, True)  # (rows, 1)
    flat = ctx.op("Reshape", indices, ctx.i64([-1]))
    rows = ctx.op("Shape", weight, start=0, end=1)
    zeros = ctx.op("ConstantOfShape", rows, value=ctx.tensor_attr(0, torch.int64))
    ones = ctx.op("Expand", ctx.i64(1), ctx.op("Shape", flat))
    named = ctx.op("ScatterElements", zeros, flat, ones, axis=0)
    named = ctx.op("Unsqueeze", ctx.op("Cast", named, to=9), ctx.i64([1]))  # bool, (rows, 1)
    too_long = ctx.op("And", named, ctx.op("Greater", norms, ctx.const(max_norm, dtype)))
    scale = ctx.op("Div", ctx.const(max_norm, dtype), ctx.op("Add", norms, ctx.const(1e-7, dtype)))
    return ctx.op("Mul", weight, ctx.op("Where", too_long, scale, ctx.const(1.0, dtype)))


_BAG_MODES = {0: "sum", 1: "mean", 2: "max"}


def convert_embedding_bag(
    ctx: ConversionContext,
    weight: Value,
    indices: Value,
    offsets: Value,
    scale_grad_by_freq: bool = False,
    mode: int = 0,
    sparse: bool = False,
    per_sample_weights: Value | None = None,
    include_last_offset: bool = False,
    padding_idx: int | None = None,
) -> list[str | None]:
    """Bags of gathered rows reduced by ScatterND: bag i holds indices[offsets[i]:offsets[i+1]]. Entries
    equal to padding_idx are left out; empty bags give zeros, as in torch. Only the first output (the
    bags) is produced: offset2bag / bag_size / max_indices are training bookkeeping."""
    assert ctx.node is not None
    if any(u.args[1] != 0 and u.users for u in ctx.node.users if len(u.args) > 1):
        raise ctx.error("only the first output of embedding_bag is supported")
    if indices.rank != 1:
        raise ctx.error("embedding_bag with 2-D indices reaches the converter flattened; got a 2-D input")
    name = _BAG_MODES.get(mode)
    if name is None:
        raise ctx.error(f"embedding_bag mode {mode} is not known")
    out_dtype = weight.dtype
    # onnxruntime's ScatterND has no float16 / bfloat16 reduction kernels: bags are reduced in float32
    dtype = torch.float32 if out_dtype in (torch.float16, torch.bfloat16) else out_dtype
    starts = offsets.name
    if include_last_offset:
        starts = ctx.op("Slice", offsets, ctx.i64([0]), ctx.i64([-1]), ctx.i64([0]))
    n = ctx.op("Shape", indices)
    positions = ctx.op("Range", ctx.i64(0), ctx.op("Squeeze", n, ctx.i64([0])), ctx.i64(1))
    # bag of entry i: how many bag starts are <= i, minus one
    started = ctx.op(
        "GreaterOrEqual", unsqueeze(ctx, positions, [1]), unsqueeze(ctx, ctx.cast(starts, torch.int64), [0])
    )
    bag = ctx.op("Sub", reduce(ctx, "ReduceSum", ctx.cast(started, torch.int64), [1], True), ctx.i64(1))
    rows = ctx.cast(ctx.op("Gather", weight, indices, axis=0), dtype)
    if per_sample_weights is not None:
        rows = ctx.op("Mul", rows, unsqueeze(ctx, ctx.cast(per_sample_weights, dtype), [1]))
    keep = ctx.const(True, torch.bool)
    keep_col = keep
    if padding_idx is not None:
        rows_count = weight.shape[0]
        if padding_idx < 0:
            if not isinstance(rows_count, int):
                raise ctx.error("embedding_bag with a negative padding_idx needs a static number of rows")
            padding_idx += rows_count  # the aten op counts a negative padding_idx from the end
        keep = ctx.op("Not", ctx.op("Equal", indices, ctx.cast(ctx.i64(padding_idx), indices.dtype)))
        keep_col = unsqueeze(ctx, keep, [1])
    n_bags = ctx.op("Shape", starts)
    width = ctx.op("Shape", weight, start=1, end=2)
    count = ctx.op(
        "ScatterND",
        ctx.op("ConstantOfShape", n_bags, value=ctx.tensor_attr(0, torch.int64)),
        bag,
        ctx.op("Expand", ctx.cast(keep, torch.int64), n),
        reduction="add",
    )
    empty = unsqueeze(ctx, ctx.op("Equal", count, ctx.i64(0)), [1])
    out_shape = ctx.op("Concat", n_bags, width, axis=0)
    zero = ctx.const(0, dtype)
    if name == "max":
        rows = ctx.op("Where", keep_col, rows, ctx.const(-math.inf, dtype))
        if ctx.opset >= 18:
            init = ctx.op("ConstantOfShape", out_shape, value=ctx.tensor_attr(-math.inf, dtype))
            total = ctx.op("ScatterND", init, bag, rows, reduction="max")
        else:
            total = _bag_max_opset17(ctx, bag, rows, n_bags, dtype)
        return [ctx.cast(ctx.op("Where", empty, zero, total), out_dtype), None, None, None]
    rows = ctx.op("Where", keep_col, rows, zero)
    init = ctx.op("ConstantOfShape", out_shape, value=ctx.tensor_attr(0, dtype))
    total = ctx.op("ScatterND", init, bag, rows, reduction="add")
    if name == "mean":
        divisor = ctx.op("Max", ctx.cast(unsqueeze(ctx, count, [1]), dtype), ctx.const(1, dtype))
        total = ctx.op("Div", total, divisor)
    return [ctx.cast(total, out_dtype), None, None, None]


def _bag_max_opset17(ctx: ConversionContext, bag: str, rows: str, n_bags: str, dtype: torch.dtype) -> str:
    """Per-bag max without ScatterND's max reduction (opset 18): an (entries, bags) membership mask
    selects each entry's row for its bag, -inf elsewhere, and ReduceMax runs over the entries."""
    bag_ids = ctx.op("Range", ctx.i64(0), ctx.op("Squeeze", n_bags, ctx.i64([0])), ctx.i64(1))
    member = ctx.op("Equal", bag, bag_ids)  # (n, 1) == (B,) -> (n, B)
    picked = ctx.op(
        "Where", unsqueeze(ctx, member, [2]), unsqueeze(ctx, rows, [1]), ctx.const(-math.inf, dtype)
    )
    return reduce(ctx, "ReduceMax", picked, [0], keepdims=False)


CONVERTERS: dict[str, Converter] = {
    "aten.embedding.default": convert_embedding,
    "aten.embedding_renorm.default": convert_embedding_renorm,
    "aten.embedding_bag.default": convert_embedding_bag,
    "aten.embedding_bag.padding_idx": convert_embedding_bag,
}
