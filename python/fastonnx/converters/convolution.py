"""Convolutions: Conv / ConvTranspose with torch's padding modes ("same", "valid", ints) and its
output_padding, and convolution_backward (input, weight and bias gradients).

torch accepts unbatched inputs (no N dim); ONNX's Conv needs N, so such inputs get a leading dim of 1
added and removed around the ONNX op (``lib.spatial``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastonnx.context import ConversionContext, Converter, Value
from fastonnx.converters.lib.ops import reduce
from fastonnx.converters.lib.spatial import (
    IntOrList,
    batched,
    conv_transpose,
    expand_ints,
    static_ints,
    unbatch,
)


# ---- convolution --------------------------------------------------------------------------------
def _conv(
    ctx: ConversionContext,
    x: Value,
    weight: Value,
    bias: Value | None,
    stride: IntOrList,
    padding: IntOrList | str,
    dilation: IntOrList,
    transposed: bool,
    output_padding: IntOrList,
    groups: int,
) -> str:
    if not x.dtype.is_floating_point:
        # ONNX Conv / ConvTranspose are defined for floating types only; a float32 detour is not exact
        raise ctx.error(f"convolution of {x.dtype} tensors has no ONNX form (Conv takes floating types)")
    nd = weight.rank - 2
    strides = expand_ints(stride, nd, 1)
    dilations = expand_ints(dilation, nd, 1)
    if isinstance(padding, str):
        if padding == "valid":
            pads = [0] * (2 * nd)
        elif padding == "same":
            kernel = static_ints(ctx, weight.shape[2:], "the kernel size of a padding='same' conv")
            # torch pads d*(k-1) in total, the odd element at the end
            total = [d * (k - 1) for d, k in zip(dilations, kernel)]
            pads = [t // 2 for t in total] + [t - t // 2 for t in total]
        else:
            raise ctx.error(f"conv padding must be 'same', 'valid' or ints, got {padding!r}")
    else:
        p = expand_ints(padding, nd, 0)
        pads = p + p
    xin, added = batched(ctx, x, nd)
    attrs: dict[str, Any] = {"strides": strides, "pads": pads, "dilations": dilations, "group": groups}
    if transposed:
        y = conv_transpose(ctx, xin, weight, bias, attrs, expand_ints(output_padding, nd, 0))
    else:
        y = ctx.op("Conv", xin, weight, bias, **attrs)
    return unbatch(ctx, y, added)


def convert_convolution(
    ctx: ConversionContext,
    x: Value,
    weight: Value,
    bias: Value | None,
    stride: IntOrList,
    padding: IntOrList,
    dilation: IntOrList,
    transposed: bool,
    output_padding: IntOrList,
    groups: int,
    *_flags: Any,
) -> str:
    # *_flags: _convolution's benchmark / deterministic / cudnn_enabled / allow_tf32 do not change values
    return _conv(ctx, x, weight, bias, stride, padding, dilation, transposed, output_padding, groups)


def convert_conv(
    ctx: ConversionContext,
    x: Value,
    weight: Value,
    bias: Value | None = None,
    stride: IntOrList = 1,
    padding: IntOrList | str = 0,
    dilation: IntOrList = 1,
    groups: int = 1,
) -> str:
    return _conv(ctx, x, weight, bias, stride, padding, dilation, False, 0, groups)


def convert_conv_transpose(
    ctx: ConversionContext,
    x: Value,
    weight: Value,
    bias: Value | None = None,
    stride: IntOrList = 1,
    padding: IntOrList = 0,
    output_padding: IntOrList = 0,
    groups: int = 1,
    dilation: IntOrList = 1,
) -> str:
    return _conv(ctx, x, weight, bias, stride, padding, dilation, True, output_padding, groups)


def convert_convolution_backward(
    ctx: ConversionContext,
    grad_out: Value,
    x: Value,
    weight: Value,
    bias_sizes: Any,
    stride: IntOrList,
    padding: IntOrList,
    dilation: IntOrList,
    transposed: bool,
    output_padding: IntOrList,
    groups: int,
    output_mask: Sequence[bool],
) -> list[str | None]:
    """(grad_input, grad_weight, grad_bias) of a (non-transposed) convolution, each only when
    ``output_mask`` asks for it (what training graphs of torch.compile hold). grad_input is the
    transposed convolution of grad_out by the weight, its output padding chosen to give the input's
    size; grad_weight is a convolution of the input by grad_out with stride and dilation swapped, batch
    and channels exchanged so that each group's weight sums over the batch (static shapes); grad_bias
    sums grad_out over all but the channel dim."""
    if transposed:
        raise ctx.error("the backward of a transposed convolution is not supported")
    nd = weight.rank - 2
    if x.rank != nd + 2:
        raise ctx.error(f"convolution backward needs a batched input, got rank {x.rank}")
    strides, dilations = expand_ints(stride, nd, 1), expand_ints(dilation, nd, 1)
    pads = expand_ints(padding, nd, 0)
    in_shape = static_ints(ctx, x.shape, "the input shape of a convolution backward")
    out_shape = static_ints(ctx, grad_out.shape, "the grad_output shape of a convolution backward")
    w_shape = static_ints(ctx, weight.shape, "the weight shape of a convolution backward")
    kernel = w_shape[2:]
    results: list[str | None] = [None, None, None]
    if output_mask[0]:
        # the rows / columns the forward never read (beyond its last window) get zero gradient
        extra = [
            i - ((o - 1) * st + dl * (k - 1) + 1 - 2 * p)
            for i, o, st, dl, k, p in zip(in_shape[2:], out_shape[2:], strides, dilations, kernel, pads)
        ]
        attrs = {"strides": strides, "pads": pads + pads, "dilations": dilations, "group": groups}
        results[0] = conv_transpose(ctx, grad_out.name, weight, None, attrs, extra)
    if output_mask[1]:
        n, g = in_shape[0], groups
        cg, og = in_shape[1] // g, out_shape[1] // g
        spatial_in, spatial_out = in_shape[2:], out_shape[2:]
        rest = list(range(3, 3 + nd))
        # input as (Cg, G*N, ...): the batch of the new conv is a channel of the group, channels (g, n)
        xt = ctx.op("Reshape", x, ctx.i64([n, g, cg, *spatial_in]))
        xt = ctx.op("Transpose", xt, perm=[2, 1, 0, *rest])
        xt = ctx.op("Reshape", xt, ctx.i64([cg, g * n, *spatial_in]))
        # grad_out as the kernel (G*Og, N, ...): output channel (g, o) reads channels (g, n)
        wt = ctx.op("Reshape", grad_out, ctx.i64([n, g, og, *spatial_out]))
        wt = ctx.op("Transpose", wt, perm=[1, 2, 0, *rest])
        wt = ctx.op("Reshape", wt, ctx.i64([g * og, n, *spatial_out]))
        full = ctx.op("Conv", xt, wt, strides=dilations, dilations=strides, pads=pads + pads, group=g)
        grad_w = ctx.op("Transpose", full, perm=[1, 0, *range(2, 2 + nd)])
        # the conv may reach past the kernel (input rows after the last window): cut to its size
        axes = list(range(2, 2 + nd))
        results[1] = ctx.op("Slice", grad_w, ctx.i64([0] * nd), ctx.i64(kernel), ctx.i64(axes))
    if output_mask[2]:
        results[2] = reduce(ctx, "ReduceSum", grad_out, [0, *range(2, 2 + nd)], keepdims=False)
    return results


CONVERTERS: dict[str, Converter] = {
    "aten.convolution.default": convert_convolution,
    "aten.convolution_backward.default": convert_convolution_backward,
    "aten._convolution.default": convert_convolution,
    "aten.conv1d.default": convert_conv,
    "aten.conv1d.padding": convert_conv,
    "aten.conv2d.default": convert_conv,
    "aten.conv2d.padding": convert_conv,
    "aten.conv3d.default": convert_conv,
    "aten.conv3d.padding": convert_conv,
    "aten.conv_transpose1d.default": convert_conv_transpose,
    "aten.conv_transpose2d.input": convert_conv_transpose,
    "aten.conv_transpose3d.input": convert_conv_transpose,
}
