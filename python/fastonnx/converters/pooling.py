"""Pooling: max / average / adaptive pools in 1, 2 and 3 dims (with torch's indices), the input
gradients of max_pool2d and avg_pool2d, and max unpooling.

torch accepts unbatched inputs (no N dim); ONNX's pools need N, so such inputs get a leading dim of 1
added and removed around the ONNX op (``lib.spatial``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Literal, overload

import torch

from fastonnx.context import ConversionContext, Converter, Value
from fastonnx.converters.lib.ops import reduce, squeeze, unsqueeze
from fastonnx.converters.lib.shape_graphs import shape_slice
from fastonnx.converters.lib.spatial import (
    IntOrList,
    batched,
    conv_transpose,
    expand_ints,
    static_ints,
    unbatch,
)


# ---- pooling ------------------------------------------------------------------------------------
def _pool_args(
    nd: int, kernel: IntOrList, stride: IntOrList | None, padding: IntOrList, dilation: IntOrList = 1
) -> tuple[list[int], list[int], list[int], list[int]]:
    k = expand_ints(kernel, nd, 1)
    s = expand_ints(stride, nd, 0)
    if not any(s):
        s = list(k)  # torch: an empty stride means stride = kernel
    p = expand_ints(padding, nd, 0)
    return k, s, p + p, expand_ints(dilation, nd, 1)


def _float_for_pool(ctx: ConversionContext, x: str, dtype: torch.dtype, exact: bool = False) -> str:
    """onnxruntime's pools have float / float16 kernels (MaxPool also double, which holds integers
    exactly up to 2**53: ``exact`` asks for it)."""
    if dtype in (torch.float32, torch.float16):
        return x
    return ctx.cast(x, torch.float64 if exact else torch.float32)


# the pooled value, or [pooled, indices] with_indices
@overload
def _max_pool(
    ctx: ConversionContext,
    x: Value,
    nd: int,
    kernel: IntOrList,
    stride: IntOrList | None,
    padding: IntOrList,
    dilation: IntOrList,
    ceil_mode: bool,
    with_indices: Literal[False],
) -> str: ...
@overload
def _max_pool(
    ctx: ConversionContext,
    x: Value,
    nd: int,
    kernel: IntOrList,
    stride: IntOrList | None,
    padding: IntOrList,
    dilation: IntOrList,
    ceil_mode: bool,
    with_indices: Literal[True],
) -> list[str]: ...
@overload
def _max_pool(
    ctx: ConversionContext,
    x: Value,
    nd: int,
    kernel: IntOrList,
    stride: IntOrList | None,
    padding: IntOrList,
    dilation: IntOrList,
    ceil_mode: bool,
    with_indices: bool,
) -> str | list[str]: ...
def _max_pool(
    ctx: ConversionContext,
    x: Value,
    nd: int,
    kernel: IntOrList,
    stride: IntOrList | None,
    padding: IntOrList,
    dilation: IntOrList,
    ceil_mode: bool,
    with_indices: bool,
) -> str | list[str]:
    k, s, pads, d = _pool_args(nd, kernel, stride, padding, dilation)
    xin, added = batched(ctx, x, nd)
    xin = _float_for_pool(ctx, xin, x.dtype, exact=True)
    attrs: dict[str, Any] = {
        "kernel_shape": k,
        "strides": s,
        "pads": pads,
        "dilations": d,
        "ceil_mode": int(ceil_mode),
    }
    # onnxruntime's PadFusion (Pad-11..19 into MaxPool-8..12, at load) moves a zero Pad into the
    # MaxPool's pads, which pool as -inf: values below 0 beside the border change (BiT's stem: 0.04 off).
    # It leaves a MaxPool with an indices output alone: one after a Pad gets one, unread.
    if not with_indices and not _made_by_pad(ctx, xin):
        y = ctx.op("MaxPool", xin, **attrs)
        return unbatch(ctx, ctx.cast(y, x.dtype), added)
    y, flat = ctx.op("MaxPool", xin, outputs=2, **attrs)
    if not with_indices:
        return unbatch(ctx, ctx.cast(y, x.dtype), added)
    indices = _plane_indices(ctx, flat, xin)
    return [unbatch(ctx, ctx.cast(y, x.dtype), added), unbatch(ctx, indices, added)]


_PRODUCER_WINDOW = 256
"""How many of the last emitted nodes ``_made_by_pad`` looks through: a Pad feeding a pool is emitted
just before it (constant_pad_nd, then max_pool)."""


def _made_by_pad(ctx: ConversionContext, value: str) -> bool:
    """Whether ``value`` is the output of a Pad among the last emitted nodes."""
    n = ctx.g.num_nodes
    return any(op == "Pad" and value in outs for _, op, _, outs in ctx.g.nodes(max(0, n - _PRODUCER_WINDOW)))


def _plane_indices(ctx: ConversionContext, flat: str, xin: str) -> str:
    """onnxruntime's MaxPool indices count over N*C*spatial; torch's over the spatial plane only. Each
    index lies in its own (n, c) plane, so the plane offset is removed by a modulo by the plane size."""
    # no axes: reduce everything, the same form at every opset
    plane = ctx.op("ReduceProd", ctx.op("Shape", xin, start=2), keepdims=1)
    return ctx.op("Mod", flat, plane)


def _max_pool_converter(nd: int, with_indices: bool) -> Callable[..., Any]:
    def convert(
        ctx: ConversionContext,
        x: Value,
        kernel_size: IntOrList,
        stride: IntOrList | None = None,
        padding: IntOrList = 0,
        dilation: IntOrList = 1,
        ceil_mode: bool = False,
    ) -> str | list[str]:
        return _max_pool(ctx, x, nd, kernel_size, stride, padding, dilation, ceil_mode, with_indices)

    convert.__name__ = f"convert_max_pool{nd}d{'_with_indices' if with_indices else ''}"
    return convert


def _torch_pool_out(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """torch's pooling output size (pooling_output_shape): a ceil-mode window must start inside the
    input or the left padding."""
    span = size + 2 * p - d * (k - 1) - 1
    out = (span + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def _avg_pool_converter(nd: int) -> Callable[..., Any]:
    def convert(
        ctx: ConversionContext,
        x: Value,
        kernel_size: IntOrList,
        stride: IntOrList | None = None,
        padding: IntOrList = 0,
        ceil_mode: bool = False,
        count_include_pad: bool = True,
        divisor_override: int | None = None,
    ) -> str:
        k, s, pads, _ = _pool_args(nd, kernel_size, stride, padding)
        if divisor_override is not None:
            return _sum_pool(ctx, x, nd, k, s, pads, ceil_mode, divisor_override)
        if not x.dtype.is_floating_point:
            # torch divides integer sums with truncation; a float average cast back may land one below
            raise ctx.error(f"avg_pool of {x.dtype} tensors is only supported with divisor_override")
        xin, added = batched(ctx, x, nd)
        xin = _float_for_pool(ctx, xin, x.dtype)
        y = ctx.op(
            "AveragePool",
            xin,
            kernel_shape=k,
            strides=s,
            pads=pads,
            ceil_mode=int(ceil_mode),
            count_include_pad=int(count_include_pad),
        )
        return unbatch(ctx, ctx.cast(y, x.dtype), added)

    convert.__name__ = f"convert_avg_pool{nd}d"
    return convert


def _sum_pool(
    ctx: ConversionContext,
    x: Value,
    nd: int,
    k: list[int],
    s: list[int],
    pads: list[int],
    ceil_mode: bool,
    divisor: int,
) -> str:
    """avg_pool with divisor_override: window sums (a depthwise Conv with a kernel of ones; zero padding
    adds nothing) divided by the divisor. Extra end padding gives ceil_mode's last windows."""
    channels = x.shape[-nd - 1]
    spatial = x.shape[-nd:]
    if not isinstance(channels, int) or not all(isinstance(v, int) for v in spatial):
        raise ctx.error("avg_pool with divisor_override needs static channels and spatial sizes")
    p = pads[:nd]
    end = list(p)
    for i in range(nd):
        out = _torch_pool_out(int(spatial[i]), k[i], s[i], p[i], 1, ceil_mode)
        needed = (out - 1) * s[i] + k[i] - int(spatial[i]) - p[i]
        end[i] = max(needed, 0)
    dtype = x.dtype if x.dtype in (torch.float32, torch.float16) else torch.float32
    xin, added = batched(ctx, x, nd)
    ones = ctx.const(torch.ones([channels, 1, *k]), dtype)
    y = ctx.op("Conv", ctx.cast(xin, dtype), ones, strides=s, pads=p + end, group=channels)
    if not x.dtype.is_floating_point:
        # integer sums (exact in float32 below 2**24), divided with truncation as torch does
        return unbatch(ctx, ctx.op("Div", ctx.cast(y, x.dtype), ctx.const(divisor, x.dtype)), added)
    y = ctx.op("Div", y, ctx.const(float(divisor), dtype))
    return unbatch(ctx, ctx.cast(y, x.dtype), added)


def _adaptive_sizes(
    ctx: ConversionContext, x: Value, nd: int, output_size: Sequence[Any]
) -> tuple[list[int], list[int]] | None:
    """(input sizes, output sizes) of an adaptive pool, static; None when every output size is 1 (a
    global pool, which needs no static sizes)."""
    out = [x.shape[-nd + i] if o is None else o for i, o in enumerate(output_size)]
    if all(isinstance(o, int) and o == 1 for o in out):
        return None
    spatial = x.shape[-nd:]
    if not all(isinstance(v, int) for v in (*spatial, *out)):
        raise ctx.error(
            f"adaptive pooling from {list(spatial)} to {list(out)} needs static sizes unless the output is 1"
        )
    return [int(i) for i in spatial], [int(o) for o in out]


def _even_kernel(sizes: list[int], outs: list[int]) -> list[int] | None:
    """The kernel (= stride) of a plain pool equal to the adaptive one, when every size divides evenly."""
    if any(i % o for i, o in zip(sizes, outs)):
        return None
    return [i // o for i, o in zip(sizes, outs)]


def _adaptive_avg_converter(nd: int) -> Callable[..., Any]:
    def convert(ctx: ConversionContext, x: Value, output_size: Sequence[Any]) -> str:
        found = _adaptive_sizes(ctx, x, nd, output_size)
        xin, added = batched(ctx, x, nd)
        xin = _float_for_pool(ctx, xin, x.dtype)
        if found is None:
            y = ctx.op("GlobalAveragePool", xin)
        elif (kernel := _even_kernel(*found)) is not None:
            y = ctx.op("AveragePool", xin, kernel_shape=kernel, strides=kernel)
        elif 0 in x.shape:
            # onnxruntime's MatMul cannot broadcast against an empty batch; the result is empty
            return ctx.op(
                "ConstantOfShape", ctx.shape_tensor(ctx.out_shape), value=ctx.tensor_attr(0, x.dtype)
            )
        else:
            y = _adaptive_avg_matmul(ctx, xin, nd, *found)
        return unbatch(ctx, ctx.cast(y, x.dtype), added)

    convert.__name__ = f"convert_adaptive_avg_pool{nd}d"
    return convert


def _adaptive_avg_matmul(ctx: ConversionContext, x: str, nd: int, sizes: list[int], outs: list[int]) -> str:
    """Uneven adaptive average pooling, axis by axis: a box average over a rectangle is the product of
    the per-axis averages, each a MatMul with an (out, in) matrix of torch's windows
    [floor(i*in/out), ceil((i+1)*in/out)). The pooled axis is made the second to last by a Reshape that
    folds the axes after it, so no Transpose is needed."""
    dtype = ctx.dtype(x) or torch.float32
    current = list(sizes)
    for axis in range(nd):
        n_in, n_out = sizes[axis], outs[axis]
        m = torch.zeros(n_out, n_in, dtype=torch.float64)
        for o in range(n_out):
            start = (o * n_in) // n_out
            end = -(-((o + 1) * n_in) // n_out)
            m[o, start:end] = 1.0 / (end - start)
        after = math.prod(current[axis + 1 :])
        folded = ctx.op("Reshape", x, ctx.i64([0, 0, math.prod(current[:axis]), n_in, after]))
        pooled = ctx.op("MatMul", ctx.const(m, dtype), folded)
        current[axis] = n_out
        x = ctx.op("Reshape", pooled, ctx.i64([0, 0, *current]))
    return x


def _adaptive_max_converter(nd: int) -> Callable[..., Any]:
    def convert(ctx: ConversionContext, x: Value, output_size: Sequence[Any]) -> list[str]:
        found = _adaptive_sizes(ctx, x, nd, output_size)
        if found is None:
            # a global max pool, as a MaxPool over the whole plane to get indices
            spatial = static_ints(ctx, x.shape[-nd:], "the input sizes of a global max pool with indices")
            found = (spatial, [1] * nd)
        kernel = _even_kernel(*found)
        if kernel is None:
            return _adaptive_max_uneven(ctx, x, nd, *found)
        return _max_pool(ctx, x, nd, kernel, kernel, 0, 1, False, with_indices=True)

    convert.__name__ = f"convert_adaptive_max_pool{nd}d"
    return convert


def _adaptive_max_uneven(
    ctx: ConversionContext, x: Value, nd: int, sizes: list[int], outs: list[int]
) -> list[str]:
    """Adaptive max pooling with uneven windows, one axis at a time from the last: a Gather takes each
    output's window (padded to the longest by repeating its last element, which cannot change the max
    or its first position), ReduceMax / ArgMax pick the value and its first position. Taking the first
    maximum per axis, last axis first, gives torch's first maximum in row-major order."""
    xin, added = batched(ctx, x, nd)
    vals = _float_for_pool(ctx, xin, x.dtype, exact=True)
    idx: str | None = None
    for a in reversed(range(nd)):
        n_in, n_out = sizes[a], outs[a]
        starts = [(o * n_in) // n_out for o in range(n_out)]
        ends = [-(-((o + 1) * n_in) // n_out) for o in range(n_out)]
        width = max(e - b for b, e in zip(starts, ends))
        table = [[min(b + k, e - 1) for k in range(width)] for b, e in zip(starts, ends)]
        axis = 2 + a
        trailing = nd - 1 - a
        windows = ctx.op("Gather", vals, ctx.const(table, torch.int64), axis=axis)
        vals = reduce(ctx, "ReduceMax", windows, [axis + 1], keepdims=False)
        first = ctx.op("Squeeze", ctx.op("ArgMax", windows, axis=axis + 1, keepdims=1), ctx.i64([axis + 1]))
        pos = ctx.op(
            "Add", first, ctx.const(torch.tensor(starts).reshape([n_out] + [1] * trailing), torch.int64)
        )
        if idx is None:
            idx = pos
        else:
            inner = ctx.op("GatherElements", idx, pos, axis=axis)
            idx = ctx.op("Add", ctx.op("Mul", pos, ctx.i64(math.prod(sizes[a + 1 :]))), inner)
    assert idx is not None
    return [unbatch(ctx, ctx.cast(vals, x.dtype), added), unbatch(ctx, idx, added)]


# ---- backward: input gradients ---------------------------------------------------------------
def convert_max_pool2d_backward(
    ctx: ConversionContext,
    grad_out: Value,
    x: Value,
    kernel_size: IntOrList,
    stride: IntOrList,
    padding: IntOrList,
    dilation: IntOrList,
    ceil_mode: bool,
    indices: Value,
) -> str:
    """max_pool2d's input gradient: each output's gradient added at the input position its index
    names (torch's indices are flat within each (batch, channel) plane), ScatterElements with "add"
    as overlapping windows may pick the same input twice. Window arguments are in the indices."""
    lead = ctx.op("Shape", x, start=0, end=x.rank - 2)
    flat = ctx.op("Concat", lead, ctx.i64([-1]), axis=0)
    # zeros of the flattened input's shape (not x * 0: an inf or NaN in x would leak into it)
    zeros = ctx.op("Expand", ctx.const(0.0, grad_out.dtype), ctx.op("Shape", ctx.op("Reshape", x, flat)))
    updates = ctx.op("Reshape", grad_out, flat)
    index = ctx.op("Reshape", ctx.cast(indices, torch.int64), flat)
    summed = ctx.op("ScatterElements", zeros, index, updates, axis=x.rank - 2, reduction="add")
    return ctx.op("Reshape", summed, ctx.op("Shape", x))


def convert_avg_pool2d_backward(
    ctx: ConversionContext,
    grad_out: Value,
    x: Value,
    kernel_size: IntOrList,
    stride: IntOrList,
    padding: IntOrList,
    ceil_mode: bool,
    count_include_pad: bool,
    divisor_override: int | None,
) -> str:
    """avg_pool2d's input gradient when every window has one divisor (no padding and no ceil_mode, or
    a divisor_override): grad_out / divisor spread over each window by a depthwise ConvTranspose with
    a kernel of ones, sized back to the input (rows no window read get zero)."""
    kernel = expand_ints(kernel_size, 2, 1)
    strides = expand_ints(stride, 2, 1) if stride else kernel
    pads = expand_ints(padding, 2, 0)
    if divisor_override is None and (any(pads) or ceil_mode):
        raise ctx.error(
            "avg_pool2d backward is converted without padding and ceil_mode only (or with a "
            "divisor_override): border windows would need their own divisors"
        )
    divisor = divisor_override or kernel[0] * kernel[1]
    batched = x.rank == 4
    in_shape = static_ints(ctx, x.shape[-3:], "the input shape of an avg_pool2d backward")
    out_shape = static_ints(ctx, grad_out.shape[-2:], "the grad_output shape of an avg_pool2d backward")
    channels = in_shape[0]
    g = ctx.op("Mul", grad_out, ctx.const(1.0 / divisor, grad_out.dtype))
    if not batched:
        g = unsqueeze(ctx, g, [0])
    ones = ctx.const(torch.ones(channels, 1, *kernel, dtype=grad_out.dtype), grad_out.dtype)
    extra = [
        i - ((o - 1) * st + k - 2 * p)
        for i, o, st, k, p in zip(in_shape[1:], out_shape, strides, kernel, pads)
    ]
    attrs = {"strides": strides, "pads": pads + pads, "dilations": [1, 1], "group": channels}
    weight = Value(ones, grad_out.dtype, (channels, 1, *kernel))
    y = conv_transpose(ctx, g, weight, None, attrs, extra)
    return y if batched else squeeze(ctx, y, [0])


# ---- max unpooling ----------------------------------------------------------------------------------
def convert_max_unpool(
    ctx: ConversionContext,
    x: Value,
    indices: Value,
    output_size: Sequence[Any],
    stride: Sequence[int] | None = None,
    padding: Sequence[int] | None = None,
) -> str:
    """Each value written at its flat index within its (batch, channel) plane of a zero output:
    ScatterElements along the flattened spatial axis (stride and padding only shaped the indices)."""
    nd = len(output_size)
    sizes = static_ints(ctx, output_size, "max_unpool output_size")
    plane = math.prod(sizes)
    lead = x.rank - nd  # 1 (channels) or 2 (batch, channels)
    flat_shape = ctx.i64([0] * lead + [-1])  # 0 copies the leading dims
    values = ctx.op("Reshape", x, flat_shape)
    idx = ctx.op("Reshape", ctx.cast(indices, torch.int64), flat_shape)
    zeros_shape = ctx.op("Concat", shape_slice(ctx, x, 0, lead), ctx.i64([plane]), axis=0)
    zeros = ctx.op("ConstantOfShape", zeros_shape, value=ctx.tensor_attr(0, x.dtype))
    out = ctx.op("ScatterElements", zeros, idx, values, axis=lead)
    out_shape = ctx.op("Concat", shape_slice(ctx, x, 0, lead), ctx.i64(sizes), axis=0)
    return ctx.op("Reshape", out, out_shape)


CONVERTERS: dict[str, Converter] = {
    "aten.max_unpool2d.default": convert_max_unpool,
    "aten.max_unpool3d.default": convert_max_unpool,
    "aten.max_pool1d.default": _max_pool_converter(1, False),
    "aten.max_pool1d_with_indices.default": _max_pool_converter(1, True),
    "aten.avg_pool1d.default": _avg_pool_converter(1),
    "aten.adaptive_avg_pool1d.default": _adaptive_avg_converter(1),
    "aten.adaptive_max_pool1d.default": _adaptive_max_converter(1),
    "aten.max_pool2d.default": _max_pool_converter(2, False),
    "aten.max_pool2d_with_indices.default": _max_pool_converter(2, True),
    "aten.avg_pool2d.default": _avg_pool_converter(2),
    "aten.avg_pool2d_backward.default": convert_avg_pool2d_backward,
    "aten.max_pool2d_with_indices_backward.default": convert_max_pool2d_backward,
    "aten.adaptive_avg_pool2d.default": _adaptive_avg_converter(2),
    "aten.adaptive_max_pool2d.default": _adaptive_max_converter(2),
    "aten.max_pool3d.default": _max_pool_converter(3, False),
    "aten.max_pool3d_with_indices.default": _max_pool_converter(3, True),
    "aten.avg_pool3d.default": _avg_pool_converter(3),
    "aten.adaptive_avg_pool3d.default": _adaptive_avg_converter(3),
    "aten.adaptive_max_pool3d.default": _adaptive_max_converter(3),
}
