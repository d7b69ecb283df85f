"""Distances and norms of vectors: pairwise_distance, cdist, cosine_similarity and weight_norm."""

from __future__ import annotations

from fastonnx.context import ConversionContext, Converter, Value
from fastonnx.converters.lib.ops import reduce, unsqueeze
from fastonnx.converters.lib.reduction_graphs import axis_norm


def convert_pairwise_distance(
    ctx: ConversionContext, x1: Value, x2: Value, p: float = 2.0, eps: float = 1e-6, keepdim: bool = False
) -> str:
    dtype = ctx.out_dtype
    diff = ctx.op("Add", ctx.op("Sub", ctx.operand(x1, dtype), ctx.operand(x2, dtype)), ctx.const(eps, dtype))
    rank = max(x1.rank, x2.rank)
    if rank == 0:
        return ctx.op("Abs", diff)
    return axis_norm(ctx, diff, p, rank - 1, keepdim)


def convert_cdist(
    ctx: ConversionContext, x1: Value, x2: Value, p: float = 2.0, compute_mode: int | None = None
) -> str:
    # the direct difference form; torch's matrix-product form for p=2 differs only in rounding
    dtype = ctx.out_dtype
    a = unsqueeze(ctx, ctx.operand(x1, dtype), [-2])  # (..., P, 1, M)
    b = unsqueeze(ctx, ctx.operand(x2, dtype), [-3])  # (..., 1, R, M)
    diff = ctx.op("Sub", a, b)
    return axis_norm(ctx, diff, p, max(x1.rank, x2.rank), False)


def convert_cosine_similarity(
    ctx: ConversionContext, x1: Value, x2: Value, dim: int = 1, eps: float = 1e-8
) -> str:
    # torch: sum(x1 * x2) / sqrt(clamp_min(|x1|^2 * |x2|^2, eps^2)), on the broadcast operands
    dtype = ctx.out_dtype
    a, b = ctx.operand(x1, dtype), ctx.operand(x2, dtype)
    a = ctx.op("Expand", a, ctx.op("Shape", b))  # Expand broadcasts both ways: a gets the common shape
    b = ctx.op("Expand", b, ctx.op("Shape", a))
    rank = max(x1.rank, x2.rank)
    if rank == 0:
        denom = ctx.op(
            "Sqrt",
            ctx.op(
                "Max", ctx.op("Mul", ctx.op("Mul", a, a), ctx.op("Mul", b, b)), ctx.const(eps * eps, dtype)
            ),
        )
        return ctx.op("Div", ctx.op("Mul", a, b), denom)
    axis = dim + rank if dim < 0 else dim
    dot = reduce(ctx, "ReduceSum", ctx.op("Mul", a, b), [axis], False)
    n1 = reduce(ctx, "ReduceSumSquare", a, [axis], False)
    n2 = reduce(ctx, "ReduceSumSquare", b, [axis], False)
    denom = ctx.op("Sqrt", ctx.op("Max", ctx.op("Mul", n1, n2), ctx.const(eps * eps, dtype)))
    return ctx.op("Div", dot, denom)


def convert_weight_norm(ctx: ConversionContext, v: Value, g: Value, dim: int = 0) -> str:
    """v * g / ||v||, the 2-norm taken over every dim but ``dim`` (over all of v when dim is -1)."""
    dtype = ctx.out_dtype
    vn, gn = ctx.operand(v, dtype), ctx.operand(g, dtype)
    axes = list(range(v.rank)) if dim == -1 else [i for i in range(v.rank) if i != dim % max(v.rank, 1)]
    if axes:
        norm = ctx.op("Sqrt", reduce(ctx, "ReduceSumSquare", vn, axes, True))
    else:
        norm = ctx.op("Abs", vn)
    return ctx.op("Mul", vn, ctx.op("Div", gn, norm))


CONVERTERS: dict[str, Converter] = {
    "aten._weight_norm.default": convert_weight_norm,
    "aten.pairwise_distance.default": convert_pairwise_distance,
    "aten.cdist.default": convert_cdist,
    "aten._cdist_forward.default": convert_cdist,
    "aten.cosine_similarity.default": convert_cosine_similarity,
}
