"""Ops that libraries define with torch.library, known by their qualified name.

Their OpOverload objects exist only once the defining library is imported; the registry's keys are
names, so they need not exist when the registry is built.
"""

from __future__ import annotations

import torch

from fastonnx import dtypes
from fastonnx.context import ConversionContext, Converter, Value


def convert_grouped_mm_fallback(ctx: ConversionContext, x: Value, weight: Value, offs: Value) -> str:
    """transformers' mixture-of-experts matmul: rows of ``x`` (S, K) are sorted by expert, expert ``e``
    owning rows offs[e-1]:offs[e]; each block is multiplied by weight[e] (K, N); rows past offs[-1]
    stay 0. A Loop over experts multiplies each block by its own weight only (no E-fold dense work)."""
    if x.rank != 2 or weight.rank != 3 or offs.rank != 1:
        raise ctx.error(
            f"grouped_mm_fallback expects input (S, K), weight (E, K, N), offs (E,); got ranks "
            f"{x.rank}, {weight.rank}, {offs.rank}"
        )
    dt = dtypes.to_onnx_dtype(x.dtype)
    n = weight.shape[2]
    bounds = ctx.op("Concat", ctx.i64([0]), ctx.operand(offs, torch.int64), axis=0)  # E + 1 row bounds
    experts = ctx.op("Shape", offs)

    g = ctx.g
    body = g.subgraph(g.unique_name("experts"))
    e = body.add_input(g.unique_name("expert"), dtypes.INT64, [])
    body.add_input(g.unique_name("cond_in"), dtypes.BOOL, [])
    done = body.add_input(g.unique_name("rows_done"), dt, [None, n])
    ctx.g = body
    try:
        axis0 = ctx.i64([0])
        start = ctx.op("Gather", bounds, ctx.op("Unsqueeze", e, axis0), axis=0)
        end = ctx.op("Gather", bounds, ctx.op("Unsqueeze", ctx.op("Add", e, ctx.i64(1)), axis0), axis=0)
        rows = ctx.op("Slice", x, start, end, axis0)
        w = ctx.op("Gather", weight, e, axis=0)
        block = ctx.op("MatMul", rows, w)
        grown = ctx.op("Concat", done, block, axis=0)
        out = body.add_output(ctx.op("Identity", ctx.const(True, torch.bool)), g.unique_name("cond_out"))
        body.set_type(out, dtypes.BOOL, [])
        out = body.add_output(grown, g.unique_name("rows_out"))
        body.set_type(out, dt, [None, n])
    finally:
        ctx.g = g
    trips = ctx.op("Squeeze", experts, ctx.i64([0]))  # E, also the index of the last bound
    empty = ctx.op("ConstantOfShape", ctx.i64([0, n]), value=ctx.tensor_attr(0, x.dtype))
    (computed,) = ctx.op("Loop", trips, ctx.const(True, torch.bool), empty, outputs=1, body=body)
    # rows after the last expert's block are zeros, as in transformers' implementation
    last = ctx.op("Gather", bounds, ctx.op("Unsqueeze", trips, ctx.i64([0])), axis=0)
    rest = ctx.op("Sub", ctx.op("Gather", ctx.dims_of(x), ctx.i64([0]), axis=0), last)
    zeros = ctx.op(
        "ConstantOfShape", ctx.op("Concat", rest, ctx.i64([n]), axis=0), value=ctx.tensor_attr(0, x.dtype)
    )
    return ctx.op("Concat", computed, zeros, axis=0)


CONVERTERS: dict[str, Converter] = {
    "transformers.grouped_mm_fallback.default": convert_grouped_mm_fallback,
}
