"""Pixel rearrangements: pixel_shuffle / pixel_unshuffle, channel_shuffle, and im2col / col2im
(nn.functional.unfold / fold), which move pixels between the spatial dims, channels and patches."""

from __future__ import annotations

import math

import torch

from fastonnx.context import ConversionContext, Converter, Value
from fastonnx.converters.lib.ops import unsqueeze
from fastonnx.converters.lib.shape_graphs import INT64_MAX, shape_slice
from fastonnx.converters.lib.spatial import IntOrList, batched, expand_ints, static_ints, unbatch


# ---- pixel / channel rearrangements -------------------------------------------------------------
def convert_pixel_shuffle(ctx: ConversionContext, x: Value, r: int) -> str:
    static = x.static_shape()
    if static is not None:
        # constant shapes; also serves the dtypes onnxruntime's DepthToSpace lacks (integers)
        *lead, c, h, w = static
        split = ctx.op("Reshape", x, ctx.i64([math.prod(lead), c // (r * r), r, r, h, w]), allowzero=1)
        moved = ctx.op("Transpose", split, perm=[0, 1, 4, 2, 5, 3])
        return ctx.op("Reshape", moved, ctx.i64([*lead, c // (r * r), h * r, w * r]), allowzero=1)
    # DepthToSpace in CRD mode is pixel_shuffle on (N, C*r*r, H, W); other ranks fold the batch dims
    if x.rank == 4:
        return ctx.op("DepthToSpace", x, blocksize=r, mode="CRD")
    flat = ctx.op("Reshape", x, ctx.op("Concat", ctx.i64([-1]), shape_slice(ctx, x, -3), axis=0))
    y = ctx.op("DepthToSpace", flat, blocksize=r, mode="CRD")
    shape = ctx.op("Concat", shape_slice(ctx, x, 0, -3), shape_slice(ctx, y, 1), axis=0)
    return ctx.op("Reshape", y, shape)


def convert_pixel_unshuffle(ctx: ConversionContext, x: Value, r: int) -> str:
    static = x.static_shape()
    if static is not None:
        # constant shapes (no -1, which Reshape refuses next to an empty dim)
        *lead, c, h, w = static
        # allowzero: a 0 here is an empty dim, not "copy the input's dim"
        split = ctx.op("Reshape", x, ctx.i64([math.prod(lead), c, h // r, r, w // r, r]), allowzero=1)
        moved = ctx.op("Transpose", split, perm=[0, 1, 3, 5, 2, 4])
        return ctx.op("Reshape", moved, ctx.i64([*lead, c * r * r, h // r, w // r]), allowzero=1)
    # SpaceToDepth orders the output channels (block row, block col, c); torch orders (c, row, col)
    flat = ctx.op("Reshape", x, ctx.op("Concat", ctx.i64([-1]), shape_slice(ctx, x, -3), axis=0))
    y = ctx.op("SpaceToDepth", flat, blocksize=r)
    spatial = shape_slice(ctx, y, 2)
    split = ctx.op("Reshape", y, ctx.op("Concat", ctx.i64([0, r * r, -1]), spatial, axis=0))
    swapped = ctx.op("Transpose", split, perm=[0, 2, 1, 3, 4])
    lead_dims = shape_slice(ctx, x, 0, -3)
    return ctx.op("Reshape", swapped, ctx.op("Concat", lead_dims, ctx.i64([-1]), spatial, axis=0))


def convert_channel_shuffle(ctx: ConversionContext, x: Value, groups: int) -> str:
    rest = shape_slice(ctx, x, 2)
    split = ctx.op("Reshape", x, ctx.op("Concat", ctx.i64([0, groups, -1]), rest, axis=0))
    perm = list(range(x.rank + 1))
    perm[1], perm[2] = 2, 1
    return ctx.op("Reshape", ctx.op("Transpose", split, perm=perm), ctx.op("Shape", x))


# ---- im2col (nn.functional.unfold) ----------------------------------------------------------------
def convert_im2col(
    ctx: ConversionContext,
    x: Value,
    kernel_size: IntOrList,
    dilation: IntOrList,
    padding: IntOrList,
    stride: IntOrList,
) -> str:
    """One strided Slice per kernel offset of the zero-padded input, stacked: (N, C*kh*kw, L).

    Offset i of a kernel of k taps spans [i*d, D - (k-1-i)*d) of the padded length D: out positions
    with step s whatever D is, so a dynamic height or width (ConvBERT's k x 1 kernel over the sequence)
    ends its Slice relative to the end instead of at a constant."""
    k = expand_ints(kernel_size, 2, 1)
    d = expand_ints(dilation, 2, 1)
    p = expand_ints(padding, 2, 0)
    s = expand_ints(stride, 2, 1)
    dims = x.shape[-2:]
    # output length per spatial axis where the input's is static (None: known only at run time)
    outs = [
        (dim + 2 * p[a] - d[a] * (k[a] - 1) - 1) // s[a] + 1 if isinstance(dim, int) else None
        for a, dim in enumerate(dims)
    ]
    xin, added = batched(ctx, x, 2)
    if any(p):
        pads = ctx.i64([0, 0, p[0], p[1], 0, 0, p[0], p[1]])
        xin = ctx.op("Pad", xin, pads)
    pieces = []
    axes = ctx.i64([2, 3])
    steps = ctx.i64(s)
    for i in range(k[0]):
        for j in range(k[1]):
            start = [i * d[0], j * d[1]]
            end = []
            for a, (off, out) in enumerate(zip(start, outs)):
                if out is not None:
                    end.append(off + (out - 1) * s[a] + 1)
                else:  # relative to the padded end; 0 from the end is "to the end"
                    back = (k[a] - 1) * d[a] - off
                    end.append(-back if back else INT64_MAX)
            piece = ctx.op("Slice", xin, ctx.i64(start), ctx.i64(end), axes, steps)
            pieces.append(unsqueeze(ctx, piece, [2]))
    stacked = ctx.op("Concat", *pieces, axis=2) if len(pieces) > 1 else pieces[0]
    n, c = (1 if added else x.shape[0]), x.shape[-3]
    out_h, out_w = outs
    if isinstance(c, int) and isinstance(n, int) and out_h is not None and out_w is not None:
        y = ctx.op("Reshape", stacked, ctx.i64([n, c * k[0] * k[1], out_h * out_w]))
    else:
        # (N, C, kh*kw, out_h, out_w) -> (N, C*kh*kw, out_h*out_w) from the runtime shape: no -1,
        # which Reshape cannot infer next to an empty dim
        rows = ctx.op("Mul", ctx.op("Shape", stacked, start=1, end=2), ctx.i64([k[0] * k[1]]))
        length = ctx.op("Mul", ctx.op("Shape", stacked, start=3, end=4), ctx.op("Shape", stacked, start=4))
        y = ctx.op(
            "Reshape",
            stacked,
            ctx.op("Concat", ctx.op("Shape", stacked, start=0, end=1), rows, length, axis=0),
        )
    return unbatch(ctx, y, added)


def convert_col2im(
    ctx: ConversionContext,
    x: Value,
    output_size: IntOrList,
    kernel_size: IntOrList,
    dilation: IntOrList,
    padding: IntOrList,
    stride: IntOrList,
) -> str:
    """nn.functional.fold: the patches (N, C*kh*kw, L) summed into the zero-padded image by one
    ScatterElements(reduction="add") over its flattened (H+2p, W+2p) plane, then the padding sliced off."""
    k = expand_ints(kernel_size, 2, 1)
    d = expand_ints(dilation, 2, 1)
    p = expand_ints(padding, 2, 0)
    s = expand_ints(stride, 2, 1)
    h, w = expand_ints(output_size, 2, 1)
    rows, length = static_ints(ctx, x.shape[-2:], "col2im's patch rows and count")
    c = rows // (k[0] * k[1])
    hp, wp = h + 2 * p[0], w + 2 * p[1]
    out_h = (hp - d[0] * (k[0] - 1) - 1) // s[0] + 1
    out_w = (wp - d[1] * (k[1] - 1) - 1) // s[1] + 1
    if out_h * out_w != length or c * k[0] * k[1] != rows:
        raise ctx.error(f"col2im: {rows} x {length} patches do not fold into a {h} x {w} image")
    # where each patch element lands in the padded plane, in the patches' (kh, kw, L) order
    ki, kj, oh, ow = torch.meshgrid(
        torch.arange(k[0]), torch.arange(k[1]), torch.arange(out_h), torch.arange(out_w), indexing="ij"
    )
    idx = ((oh * s[0] + ki * d[0]) * wp + ow * s[1] + kj * d[1]).reshape(1, 1, -1)
    xin, added = batched(ctx, x, 1)
    patches = ctx.op("Reshape", xin, ctx.i64([0, c, -1]))
    lead = ctx.op("Shape", patches, start=0, end=2)
    indices = ctx.op("Expand", ctx.const(idx, torch.int64), ctx.op("Shape", patches))
    zero = ctx.const(torch.zeros(1, 1, 1), x.dtype)
    plane = ctx.op("Expand", zero, ctx.op("Concat", lead, ctx.i64([hp * wp]), axis=0))
    summed = ctx.op("ScatterElements", plane, indices, patches, axis=2, reduction="add")
    y = ctx.op("Reshape", summed, ctx.i64([0, 0, hp, wp]))
    if any(p):
        y = ctx.op("Slice", y, ctx.i64(p), ctx.i64([p[0] + h, p[1] + w]), ctx.i64([2, 3]))
    return unbatch(ctx, y, added)


CONVERTERS: dict[str, Converter] = {
    "aten.pixel_shuffle.default": convert_pixel_shuffle,
    "aten.pixel_unshuffle.default": convert_pixel_unshuffle,
    "aten.channel_shuffle.default": convert_channel_shuffle,
    "aten.native_channel_shuffle.default": convert_channel_shuffle,
    "aten.im2col.default": convert_im2col,
    "aten.col2im.default": convert_col2im,
}
