"""Convolutions, pooling, embedding, resampling (upsample / grid_sample) and pixel rearrangements.

torch accepts unbatched inputs (no N dim) for most of these; ONNX's Conv / Pool / Resize ops need N, so
such inputs get a leading dim of 1 added and removed around the ONNX op.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Literal, overload

import torch

from fastonnx.context import ConversionContext, Converter, Operand, Value
from fastonnx.converters.lib.ops import reduce, squeeze, unsqueeze

aten = torch.ops.aten

IntOrList = int | Sequence[int]


def _expand(v: IntOrList | None, n: int, default: int) -> list[int]:
    """torch's int-or-list conv/pool argument as n ints (a 1-element list repeats, like torch)."""
    if v is None:
        return [default] * n
    if isinstance(v, int):
        return [v] * n
    v = list(v)
    if not v:
        return [default] * n
    return v * n if len(v) == 1 else v


def _batched(ctx: ConversionContext, x: Value, spatial: int) -> tuple[str, bool]:
    """``x`` with an N dim (added when torch got an unbatched input), and whether one was added."""
    if x.rank == spatial + 1:
        return unsqueeze(ctx, x, [0]), True
    return x.name, False


def _unbatch(ctx: ConversionContext, y: str, added: bool) -> str:
    return squeeze(ctx, y, [0]) if added else y


def _static_ints(ctx: ConversionContext, dims: Sequence[Any], what: str) -> list[int]:
    if not all(isinstance(d, int) for d in dims):
        raise ctx.error(f"{what} must be static, got {list(dims)}")
    return [int(d) for d in dims]


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
    strides = _expand(stride, nd, 1)
    dilations = _expand(dilation, nd, 1)
    if isinstance(padding, str):
        if padding == "valid":
            pads = [0] * (2 * nd)
        elif padding == "same":
            kernel = _static_ints(ctx, weight.shape[2:], "the kernel size of a padding='same' conv")
            # torch pads d*(k-1) in total, the odd element at the end
            total = [d * (k - 1) for d, k in zip(dilations, kernel)]
            pads = [t // 2 for t in total] + [t - t // 2 for t in total]
        else:
            raise ctx.error(f"conv padding must be 'same', 'valid' or ints, got {padding!r}")
    else:
        p = _expand(padding, nd, 0)
        pads = p + p
    xin, added = _batched(ctx, x, nd)
    attrs: dict[str, Any] = {"strides": strides, "pads": pads, "dilations": dilations, "group": groups}
    if transposed:
        y = _conv_transpose(ctx, xin, weight, bias, attrs, _expand(output_padding, nd, 0))
    else:
        y = ctx.op("Conv", xin, weight, bias, **attrs)
    return _unbatch(ctx, y, added)


def _conv_transpose(
    ctx: ConversionContext,
    x: str,
    weight: Value,
    bias: Value | None,
    attrs: dict[str, Any],
    out_pad: list[int],
) -> str:
    """ConvTranspose with torch's output_padding. onnxruntime wants output_padding < stride while torch
    allows up to max(stride, dilation) - 1, so it is expressed as less end padding instead (the same
    values: those outputs are computed, then cropped by the padding); what is left beyond the full
    output holds only the bias, added after zero padding."""
    nd = len(out_pad)
    pads = attrs["pads"]
    begin, end = pads[:nd], pads[nd:]
    new_end = [max(e - o, 0) for e, o in zip(end, out_pad)]
    extra = [max(o - e, 0) for e, o in zip(end, out_pad)]
    attrs = {**attrs, "pads": begin + new_end}
    if not any(extra):
        # annotated: with **attrs of Any the overloads of ctx.op cannot tell one output from several
        y: str = ctx.op("ConvTranspose", x, weight, bias, **attrs)
        return y
    y = ctx.op("ConvTranspose", x, weight, **attrs)
    y = ctx.op("Pad", y, ctx.i64([0] * (nd + 2) + [0, 0, *extra]))
    if bias is None:
        return y
    return ctx.op("Add", y, ctx.op("Reshape", bias, ctx.i64([-1] + [1] * nd)))


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
    strides, dilations = _expand(stride, nd, 1), _expand(dilation, nd, 1)
    pads = _expand(padding, nd, 0)
    in_shape = _static_ints(ctx, x.shape, "the input shape of a convolution backward")
    out_shape = _static_ints(ctx, grad_out.shape, "the grad_output shape of a convolution backward")
    w_shape = _static_ints(ctx, weight.shape, "the weight shape of a convolution backward")
    kernel = w_shape[2:]
    results: list[str | None] = [None, None, None]
    if output_mask[0]:
        # the rows / columns the forward never read (beyond its last window) get zero gradient
        extra = [
            i - ((o - 1) * st + dl * (k - 1) + 1 - 2 * p)
            for i, o, st, dl, k, p in zip(in_shape[2:], out_shape[2:], strides, dilations, kernel, pads)
        ]
        attrs = {"strides": strides, "pads": pads + pads, "dilations": dilations, "group": groups}
        results[0] = _conv_transpose(ctx, grad_out.name, weight, None, attrs, extra)
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
    kernel = _expand(kernel_size, 2, 1)
    strides = _expand(stride, 2, 1) if stride else kernel
    pads = _expand(padding, 2, 0)
    if divisor_override is None and (any(pads) or ceil_mode):
        raise ctx.error(
            "avg_pool2d backward is converted without padding and ceil_mode only (or with a "
            "divisor_override): border windows would need their own divisors"
        )
    divisor = divisor_override or kernel[0] * kernel[1]
    batched = x.rank == 4
    in_shape = _static_ints(ctx, x.shape[-3:], "the input shape of an avg_pool2d backward")
    out_shape = _static_ints(ctx, grad_out.shape[-2:], "the grad_output shape of an avg_pool2d backward")
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
    y = _conv_transpose(ctx, g, weight, None, attrs, extra)
    return y if batched else squeeze(ctx, y, [0])


# ---- pooling ------------------------------------------------------------------------------------
def _pool_args(
    nd: int, kernel: IntOrList, stride: IntOrList | None, padding: IntOrList, dilation: IntOrList = 1
) -> tuple[list[int], list[int], list[int], list[int]]:
    k = _expand(kernel, nd, 1)
    s = _expand(stride, nd, 0)
    if not any(s):
        s = list(k)  # torch: an empty stride means stride = kernel
    p = _expand(padding, nd, 0)
    return k, s, p + p, _expand(dilation, nd, 1)


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
    xin, added = _batched(ctx, x, nd)
    xin = _float_for_pool(ctx, xin, x.dtype, exact=True)
    attrs: dict[str, Any] = {
        "kernel_shape": k,
        "strides": s,
        "pads": pads,
        "dilations": d,
        "ceil_mode": int(ceil_mode),
    }
    if not with_indices:
        y = ctx.op("MaxPool", xin, **attrs)
        return _unbatch(ctx, ctx.cast(y, x.dtype), added)
    y, flat = ctx.op("MaxPool", xin, outputs=2, **attrs)
    indices = _plane_indices(ctx, flat, xin)
    return [_unbatch(ctx, ctx.cast(y, x.dtype), added), _unbatch(ctx, indices, added)]


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
        xin, added = _batched(ctx, x, nd)
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
        return _unbatch(ctx, ctx.cast(y, x.dtype), added)

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
    xin, added = _batched(ctx, x, nd)
    ones = ctx.const(torch.ones([channels, 1, *k]), dtype)
    y = ctx.op("Conv", ctx.cast(xin, dtype), ones, strides=s, pads=p + end, group=channels)
    if not x.dtype.is_floating_point:
        # integer sums (exact in float32 below 2**24), divided with truncation as torch does
        return _unbatch(ctx, ctx.op("Div", ctx.cast(y, x.dtype), ctx.const(divisor, x.dtype)), added)
    y = ctx.op("Div", y, ctx.const(float(divisor), dtype))
    return _unbatch(ctx, ctx.cast(y, x.dtype), added)


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
        xin, added = _batched(ctx, x, nd)
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
        return _unbatch(ctx, ctx.cast(y, x.dtype), added)

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
            spatial = _static_ints(ctx, x.shape[-nd:], "the input sizes of a global max pool with indices")
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
    xin, added = _batched(ctx, x, nd)
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
    return [_unbatch(ctx, ctx.cast(vals, x.dtype), added), _unbatch(ctx, idx, added)]


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
    norms = _norm(ctx, weight.name, norm_type, 1, True)  # (rows, 1)
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


# ---- resampling ---------------------------------------------------------------------------------
def _resize(
    ctx: ConversionContext,
    x: Value,
    nd: int,
    output_size: Sequence[Any] | None,
    scales: Sequence[float | None] | None,
    **attrs: Any,
) -> str:
    """Resize of the last ``nd`` dims. torch computes source coordinates from the user's scale factors
    when given (not from the rounded output size), so those are passed as Resize's scales; otherwise the
    output sizes are passed."""
    if scales is not None and output_size is not None and all(s is not None for s in scales):
        spatial = x.shape[-nd:]
        for size, scale, out in zip(spatial, scales, output_size):
            if (
                isinstance(size, int)
                and isinstance(out, int)
                and scale is not None
                and math.floor(size * scale) != out
            ):
                # Resize derives the output size from its scales; torch takes both separately
                raise ctx.error(
                    f"upsample with output_size {list(output_size)} and scales {list(scales)} that do not "
                    f"give that size from input size {list(spatial)} is not supported"
                )
    xin, added = _batched(ctx, x, nd)
    dtype = x.dtype
    work = xin if dtype == torch.float32 else ctx.cast(xin, torch.float32)
    if scales is not None and all(s is not None for s in scales):
        # no None among the scales (checked above; all() does not narrow)
        scale_t = ctx.const([1.0, 1.0, *[float(s) for s in scales]], torch.float32)  # type: ignore[arg-type]
        y = ctx.op("Resize", work, "", scale_t, **attrs)
    else:
        if output_size is None:
            output_size = ctx.out_shape[-nd:]
        lead = ctx.op("Shape", work, start=0, end=2)
        sizes = ctx.op("Concat", lead, ctx.shape_tensor(list(output_size)), axis=0)
        y = ctx.op("Resize", work, "", "", sizes, **attrs)
    if dtype != torch.float32:
        if not dtype.is_floating_point:
            # torch rounds (nearest is exact anyway); float -> int Cast truncates
            y = ctx.op("Round", y) if attrs.get("mode") != "nearest" else y
        y = ctx.cast(y, dtype)
    return _unbatch(ctx, y, added)


def _scales_from(
    nd: int, scale_factors: Sequence[float] | None, per_axis: Sequence[float | None]
) -> Sequence[float | None] | None:
    if scale_factors is not None:
        return list(scale_factors)
    if per_axis and all(s is not None for s in per_axis) and len(per_axis) == nd:
        return list(per_axis)
    return None


def _upsample_converter(
    nd: int, mode: str, exact: bool = False
) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """(vec overload, default overload) converters for upsample_{nearest,linear,bilinear,...}."""
    # declared: the two branches define them with different signatures (align_corners or not)
    vec: Callable[..., str]
    default: Callable[..., str]
    if mode == "nearest":

        def attrs_for(align: bool) -> dict[str, Any]:
            if exact:
                # torch nearest-exact: src = floor((dst + 0.5) * in/out), i.e. half_pixel rounded half up
                return {
                    "mode": "nearest",
                    "coordinate_transformation_mode": "half_pixel",
                    "nearest_mode": "round_prefer_ceil",
                }
            # torch nearest: src = floor(dst * in/out)
            return {
                "mode": "nearest",
                "coordinate_transformation_mode": "asymmetric",
                "nearest_mode": "floor",
            }

        def vec(ctx: ConversionContext, x: Value, output_size: Any, scale_factors: Any) -> str:
            return _resize(ctx, x, nd, output_size, _scales_from(nd, scale_factors, []), **attrs_for(False))

        def default(ctx: ConversionContext, x: Value, output_size: Sequence[Any], *scales: Any) -> str:
            return _resize(ctx, x, nd, output_size, _scales_from(nd, None, scales), **attrs_for(False))

    else:

        def attrs_for(align: bool) -> dict[str, Any]:
            a: dict[str, Any] = {
                "mode": mode,
                "coordinate_transformation_mode": "align_corners" if align else "half_pixel",
            }
            if mode == "cubic":
                a["cubic_coeff_a"] = -0.75  # torch's bicubic kernel
            return a

        def vec(
            ctx: ConversionContext, x: Value, output_size: Any, align_corners: bool, scale_factors: Any
        ) -> str:
            scales = _scales_from(nd, scale_factors, [])
            if align_corners:
                scales = None  # align_corners maps corners to corners: the sizes decide
            return _resize(ctx, x, nd, output_size, scales, **attrs_for(align_corners))

        def default(
            ctx: ConversionContext, x: Value, output_size: Sequence[Any], align_corners: bool, *scales: Any
        ) -> str:
            s = None if align_corners else _scales_from(nd, None, scales)
            return _resize(ctx, x, nd, output_size, s, **attrs_for(align_corners))

    vec.__name__ = f"convert_upsample_{mode}{nd}d_vec"
    default.__name__ = f"convert_upsample_{mode}{nd}d"
    return vec, default


# ---- grid sampling --------------------------------------------------------------------------------
_GRID_MODES = {0: ("bilinear", "linear"), 1: ("nearest", "nearest"), 2: ("bicubic", "cubic")}
_GRID_PADDING = {0: "zeros", 1: "border", 2: "reflection"}


def convert_grid_sampler(
    ctx: ConversionContext,
    x: Value,
    grid: Value,
    interpolation_mode: int,
    padding_mode: int,
    align_corners: bool,
) -> str:
    nd = x.rank - 2
    if interpolation_mode not in _GRID_MODES or padding_mode not in _GRID_PADDING:
        raise ctx.error(f"grid_sampler mode {interpolation_mode} / padding {padding_mode} is not known")
    if nd == 3 and ctx.opset < 20 and interpolation_mode in (0, 1):
        return _grid_sample_3d_gather(ctx, x, grid, interpolation_mode, padding_mode, align_corners)
    if nd != 2:
        ctx.require_opset(20, f"GridSample on {nd}-D inputs")
    old, new = _GRID_MODES[interpolation_mode]
    mode = new if ctx.opset >= 20 else old
    dtype = x.dtype
    xin = x.name if dtype in (torch.float32, torch.float16, torch.float64) else ctx.cast(x, torch.float32)
    y = ctx.op(
        "GridSample",
        xin,
        ctx.cast(grid, ctx.dtype(xin) or torch.float32),
        mode=mode,
        padding_mode=_GRID_PADDING[padding_mode],
        align_corners=int(align_corners),
    )
    return ctx.cast(y, dtype)


def _grid_source(
    ctx: ConversionContext, g: str, k: int, size: int, padding: int, align: bool, dt: torch.dtype
) -> str:
    """Grid coordinate ``k`` (x, y, z) unnormalised to input indices along an axis of ``size``, then
    clipped (border) or reflected and clipped (reflection), as torch's grid sampler does."""

    def c(v: float) -> str:
        return ctx.const(v, dt)

    v = ctx.op("Gather", g, ctx.i64(k), axis=4)
    if align:
        v = ctx.op("Mul", ctx.op("Div", ctx.op("Add", v, c(1.0)), c(2.0)), c(size - 1.0))
    else:
        v = ctx.op(
            "Div", ctx.op("Sub", ctx.op("Mul", ctx.op("Add", v, c(1.0)), c(float(size))), c(1.0)), c(2.0)
        )
    if padding == 2:
        v = _reflect(ctx, v, 0.0 if align else -1.0, 2.0 * (size - 1) if align else 2.0 * size - 1, dt)
    if padding in (1, 2):
        v = ctx.op("Min", ctx.op("Max", v, c(0.0)), c(size - 1.0))
    return v


def _reflect(ctx: ConversionContext, v: str, twice_low: float, twice_high: float, dt: torch.dtype) -> str:
    """torch's reflect_coordinates: mirror ``v`` into [twice_low / 2, twice_high / 2]."""
    if twice_low == twice_high:
        return ctx.op("Mul", v, ctx.const(0.0, dt))
    low, span = ctx.const(twice_low / 2, dt), ctx.const((twice_high - twice_low) / 2, dt)
    v = ctx.op("Abs", ctx.op("Sub", v, low))
    extra = ctx.op("Mod", v, span, fmod=1)
    flips = ctx.op("Floor", ctx.op("Div", v, span))
    even = ctx.op("Equal", ctx.op("Mod", flips, ctx.const(2.0, dt), fmod=1), ctx.const(0.0, dt))
    return ctx.op("Where", even, ctx.op("Add", extra, low), ctx.op("Add", ctx.op("Sub", span, extra), low))


def _grid_sample_3d_gather(
    ctx: ConversionContext, x: Value, grid: Value, mode: int, padding: int, align: bool
) -> str:
    """5-D grid sampling below opset 20 (GridSample takes 3-D grids from 20): every corner of the
    sampling cell is a GatherElements from the flattened volume, out-of-range corners read as zeros,
    combined with torch's trilinear weights (or the rounded nearest voxel)."""
    d, h, w = x.shape[2:]
    if not all(isinstance(v, int) for v in (d, h, w)):
        raise ctx.error("grid_sampler_3d below opset 20 needs static input depth, height and width")
    dtype = x.dtype
    dt = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    g = ctx.cast(grid, dt)
    ix, iy, iz = (_grid_source(ctx, g, k, n, padding, align, dt) for k, n in enumerate((w, h, d)))
    volume = ctx.op("Reshape", ctx.cast(x, dt), ctx.i64([0, 0, -1]))  # (N, C, D*H*W)
    lead = ctx.op("Shape", x, start=0, end=2)

    def corner(zi: str, yi: str, xi: str) -> tuple[str, str]:
        """Values (N, C, P) at integer voxel coordinates and whether each lies inside (N, 1, P)."""
        inside = None
        for v, n in ((xi, w), (yi, h), (zi, d)):
            ok = ctx.op("And", ctx.op("GreaterOrEqual", v, ctx.i64(0)), ctx.op("Less", v, ctx.i64(n)))
            inside = ok if inside is None else ctx.op("And", inside, ok)
        assert inside is not None
        lin = ctx.op(
            "Add", ctx.op("Add", ctx.op("Mul", zi, ctx.i64(h * w)), ctx.op("Mul", yi, ctx.i64(w))), xi
        )
        lin = ctx.op("Reshape", ctx.op("Where", inside, lin, ctx.i64(0)), ctx.i64([0, 1, -1]))
        idx = ctx.op("Expand", lin, ctx.op("Concat", lead, ctx.op("Shape", lin, start=2), axis=0))
        vals = ctx.op("GatherElements", volume, idx, axis=2)
        return vals, ctx.op("Reshape", inside, ctx.i64([0, 1, -1]))

    def as_int(v: str) -> str:
        return ctx.cast(v, torch.int64)

    zero = ctx.const(0.0, dt)
    if mode == 1:  # nearest: round half to even, as nearbyint
        vals, inside = corner(*(as_int(ctx.op("Round", v)) for v in (iz, iy, ix)))
        out = ctx.op("Where", inside, vals, zero)
    else:
        x0, y0, z0 = (ctx.op("Floor", v) for v in (ix, iy, iz))
        one = ctx.const(1.0, dt)
        x1, y1, z1 = (ctx.op("Add", v, one) for v in (x0, y0, z0))
        # distances to the far (1) and near (0) planes along each axis
        fx = {0: ctx.op("Sub", x1, ix), 1: ctx.op("Sub", ix, x0)}
        fy = {0: ctx.op("Sub", y1, iy), 1: ctx.op("Sub", iy, y0)}
        fz = {0: ctx.op("Sub", z1, iz), 1: ctx.op("Sub", iz, z0)}
        xs, ys, zs = (
            {0: as_int(x0), 1: as_int(x1)},
            {0: as_int(y0), 1: as_int(y1)},
            {0: as_int(z0), 1: as_int(z1)},
        )
        out = None
        for cz in (0, 1):  # torch's order: tnw, tne, tsw, tse, bnw, bne, bsw, bse
            for cy in (0, 1):
                for cx in (0, 1):
                    weight = ctx.op("Mul", ctx.op("Mul", fx[cx], fy[cy]), fz[cz])
                    vals, inside = corner(zs[cz], ys[cy], xs[cx])
                    term = ctx.op("Mul", vals, ctx.op("Reshape", weight, ctx.i64([0, 1, -1])))
                    term = ctx.op("Where", inside, term, zero)
                    out = term if out is None else ctx.op("Add", out, term)
        assert out is not None
    shape = ctx.op("Concat", lead, ctx.op("Shape", grid, start=1, end=4), axis=0)
    return ctx.cast(ctx.op("Reshape", out, shape), dtype)


# ---- pixel / channel rearrangements -------------------------------------------------------------
def _shape_slice(ctx: ConversionContext, x: Operand, start: int, end: int | None = None) -> str:
    if end is None:
        return ctx.op("Shape", x, start=start)
    return ctx.op("Shape", x, start=start, end=end)


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
    flat = ctx.op("Reshape", x, ctx.op("Concat", ctx.i64([-1]), _shape_slice(ctx, x, -3), axis=0))
    y = ctx.op("DepthToSpace", flat, blocksize=r, mode="CRD")
    shape = ctx.op("Concat", _shape_slice(ctx, x, 0, -3), _shape_slice(ctx, y, 1), axis=0)
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
    flat = ctx.op("Reshape", x, ctx.op("Concat", ctx.i64([-1]), _shape_slice(ctx, x, -3), axis=0))
    y = ctx.op("SpaceToDepth", flat, blocksize=r)
    spatial = _shape_slice(ctx, y, 2)
    split = ctx.op("Reshape", y, ctx.op("Concat", ctx.i64([0, r * r, -1]), spatial, axis=0))
    swapped = ctx.op("Transpose", split, perm=[0, 2, 1, 3, 4])
    lead_dims = _shape_slice(ctx, x, 0, -3)
    return ctx.op("Reshape", swapped, ctx.op("Concat", lead_dims, ctx.i64([-1]), spatial, axis=0))


def convert_channel_shuffle(ctx: ConversionContext, x: Value, groups: int) -> str:
    rest = _shape_slice(ctx, x, 2)
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
    """One strided Slice per kernel offset of the zero-padded input, stacked: (N, C*kh*kw, L)."""
    k = _expand(kernel_size, 2, 1)
    d = _expand(dilation, 2, 1)
    p = _expand(padding, 2, 0)
    s = _expand(stride, 2, 1)
    h, w = _static_ints(ctx, x.shape[-2:], "im2col's input height and width")
    out_h = (h + 2 * p[0] - d[0] * (k[0] - 1) - 1) // s[0] + 1
    out_w = (w + 2 * p[1] - d[1] * (k[1] - 1) - 1) // s[1] + 1
    xin, added = _batched(ctx, x, 2)
    if any(p):
        pads = ctx.i64([0, 0, p[0], p[1], 0, 0, p[0], p[1]])
        xin = ctx.op("Pad", xin, pads)
    pieces = []
    axes = ctx.i64([2, 3])
    steps = ctx.i64(s)
    for i in range(k[0]):
        for j in range(k[1]):
            start = [i * d[0], j * d[1]]
            end = [start[0] + (out_h - 1) * s[0] + 1, start[1] + (out_w - 1) * s[1] + 1]
            piece = ctx.op("Slice", xin, ctx.i64(start), ctx.i64(end), axes, steps)
            pieces.append(unsqueeze(ctx, piece, [2]))
    stacked = ctx.op("Concat", *pieces, axis=2) if len(pieces) > 1 else pieces[0]
    n, c = (1 if added else x.shape[0]), x.shape[-3]
    if isinstance(c, int) and isinstance(n, int):
        y = ctx.op("Reshape", stacked, ctx.i64([n, c * k[0] * k[1], out_h * out_w]))
    else:
        y = ctx.op("Reshape", stacked, ctx.i64([0, -1, out_h * out_w]))
    return _unbatch(ctx, y, added)


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
    k = _expand(kernel_size, 2, 1)
    d = _expand(dilation, 2, 1)
    p = _expand(padding, 2, 0)
    s = _expand(stride, 2, 1)
    h, w = _expand(output_size, 2, 1)
    rows, length = _static_ints(ctx, x.shape[-2:], "col2im's patch rows and count")
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
    xin, added = _batched(ctx, x, 1)
    patches = ctx.op("Reshape", xin, ctx.i64([0, c, -1]))
    lead = ctx.op("Shape", patches, start=0, end=2)
    indices = ctx.op("Expand", ctx.const(idx, torch.int64), ctx.op("Shape", patches))
    zero = ctx.const(torch.zeros(1, 1, 1), x.dtype)
    plane = ctx.op("Expand", zero, ctx.op("Concat", lead, ctx.i64([hp * wp]), axis=0))
    summed = ctx.op("ScatterElements", plane, indices, patches, axis=2, reduction="add")
    y = ctx.op("Reshape", summed, ctx.i64([0, 0, hp, wp]))
    if any(p):
        y = ctx.op("Slice", y, ctx.i64(p), ctx.i64([p[0] + h, p[1] + w]), ctx.i64([2, 3]))
    return _unbatch(ctx, y, added)


# ---- distances ------------------------------------------------------------------------------------
def _norm(ctx: ConversionContext, x: str, p: float, axis: int, keepdims: bool) -> str:
    """torch.linalg.vector_norm over one axis for p in {0, 1, 2, inf, -inf, other}."""
    if p == 2:
        return ctx.op("Sqrt", reduce(ctx, "ReduceSumSquare", x, [axis], keepdims))
    if p == 1:
        return reduce(ctx, "ReduceL1", x, [axis], keepdims)
    if p == math.inf:
        return reduce(ctx, "ReduceMax", ctx.op("Abs", x), [axis], keepdims)
    if p == -math.inf:
        return reduce(ctx, "ReduceMin", ctx.op("Abs", x), [axis], keepdims)
    dtype = ctx.dtype(x) or torch.float32
    if p == 0:
        nonzero = ctx.cast(ctx.op("Not", ctx.op("Equal", x, ctx.const(0, dtype))), dtype)
        return reduce(ctx, "ReduceSum", nonzero, [axis], keepdims)
    powered = ctx.op("Pow", ctx.op("Abs", x), ctx.const(p, dtype))
    return ctx.op("Pow", reduce(ctx, "ReduceSum", powered, [axis], keepdims), ctx.const(1.0 / p, dtype))


def convert_pairwise_distance(
    ctx: ConversionContext, x1: Value, x2: Value, p: float = 2.0, eps: float = 1e-6, keepdim: bool = False
) -> str:
    dtype = ctx.out_dtype
    diff = ctx.op("Add", ctx.op("Sub", ctx.operand(x1, dtype), ctx.operand(x2, dtype)), ctx.const(eps, dtype))
    rank = max(x1.rank, x2.rank)
    if rank == 0:
        return ctx.op("Abs", diff)
    return _norm(ctx, diff, p, rank - 1, keepdim)


def convert_cdist(
    ctx: ConversionContext, x1: Value, x2: Value, p: float = 2.0, compute_mode: int | None = None
) -> str:
    # the direct difference form; torch's matrix-product form for p=2 differs only in rounding
    dtype = ctx.out_dtype
    a = unsqueeze(ctx, ctx.operand(x1, dtype), [-2])  # (..., P, 1, M)
    b = unsqueeze(ctx, ctx.operand(x2, dtype), [-3])  # (..., 1, R, M)
    diff = ctx.op("Sub", a, b)
    return _norm(ctx, diff, p, max(x1.rank, x2.rank), False)


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
    sizes = _static_ints(ctx, output_size, "max_unpool output_size")
    plane = math.prod(sizes)
    lead = x.rank - nd  # 1 (channels) or 2 (batch, channels)
    flat_shape = ctx.i64([0] * lead + [-1])  # 0 copies the leading dims
    values = ctx.op("Reshape", x, flat_shape)
    idx = ctx.op("Reshape", ctx.cast(indices, torch.int64), flat_shape)
    zeros_shape = ctx.op("Concat", _shape_slice(ctx, x, 0, lead), ctx.i64([plane]), axis=0)
    zeros = ctx.op("ConstantOfShape", zeros_shape, value=ctx.tensor_attr(0, x.dtype))
    out = ctx.op("ScatterElements", zeros, idx, values, axis=lead)
    out_shape = ctx.op("Concat", _shape_slice(ctx, x, 0, lead), ctx.i64(sizes), axis=0)
    return ctx.op("Reshape", out, out_shape)


# ---- antialiased bilinear resize ---------------------------------------------------------------------
def _aa_weights(size_in: int, size_out: int, align_corners: bool, scale: float | None) -> torch.Tensor:
    """The (out, in) matrix of torch's antialiased bilinear filter along one axis: torch's own kernel
    applied to the basis vectors (the filter is linear and separable, so this is exact)."""
    # the other axis is 2 wide and kept (torch's kernel mishandles a width of 1)
    basis = torch.eye(size_in, dtype=torch.float64).reshape(size_in, 1, size_in, 1).expand(-1, -1, -1, 2)
    y: torch.Tensor = aten._upsample_bilinear2d_aa.default(
        basis.contiguous(), [size_out, 2], align_corners, scale, None
    )
    return y[:, 0, :, 0].T.contiguous()


def _upsample_aa(
    ctx: ConversionContext, x: Value, align_corners: bool, scales: Sequence[float | None]
) -> str:
    """out = Wh @ x @ Ww^T over the last two dims, with the weights computed at conversion time."""
    (oh, ow), (h, w) = ctx.out_shape[-2:], x.shape[-2:]
    if not all(isinstance(d, int) for d in (oh, ow, h, w)):
        raise ctx.error("_upsample_bilinear2d_aa needs static spatial sizes")
    dtype = x.dtype
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    wh = ctx.const(_aa_weights(h, oh, align_corners, scales[0]), compute)
    wwt = ctx.const(_aa_weights(w, ow, align_corners, scales[1]).T, compute)
    rows = ctx.op("MatMul", wh, ctx.cast(x, compute))
    return ctx.cast(ctx.op("MatMul", rows, wwt), dtype)


def convert_upsample_bilinear2d_aa_vec(
    ctx: ConversionContext, x: Value, output_size: Any, align_corners: bool, scale_factors: Any
) -> str:
    scales = list(scale_factors) if scale_factors is not None else [None, None]
    return _upsample_aa(ctx, x, align_corners, scales)


def convert_upsample_bilinear2d_aa(
    ctx: ConversionContext,
    x: Value,
    output_size: Sequence[Any],
    align_corners: bool,
    scales_h: float | None = None,
    scales_w: float | None = None,
) -> str:
    return _upsample_aa(ctx, x, align_corners, [scales_h, scales_w])


upsample_nearest1d_vec, upsample_nearest1d = _upsample_converter(1, "nearest", False)
upsample_nearest2d_vec, upsample_nearest2d = _upsample_converter(2, "nearest", False)
upsample_nearest3d_vec, upsample_nearest3d = _upsample_converter(3, "nearest", False)
_upsample_nearest_exact1d_vec, _upsample_nearest_exact1d = _upsample_converter(1, "nearest", True)
_upsample_nearest_exact2d_vec, _upsample_nearest_exact2d = _upsample_converter(2, "nearest", True)
_upsample_nearest_exact3d_vec, _upsample_nearest_exact3d = _upsample_converter(3, "nearest", True)
upsample_linear1d_vec, upsample_linear1d = _upsample_converter(1, "linear", False)
upsample_bilinear2d_vec, upsample_bilinear2d = _upsample_converter(2, "linear", False)
upsample_trilinear3d_vec, upsample_trilinear3d = _upsample_converter(3, "linear", False)
upsample_bicubic2d_vec, upsample_bicubic2d = _upsample_converter(2, "cubic", False)


CONVERTERS: dict[str, Converter] = {
    "aten._weight_norm.default": convert_weight_norm,
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
    "aten.embedding.default": convert_embedding,
    "aten.embedding_renorm.default": convert_embedding_renorm,
    "aten.embedding_bag.default": convert_embedding_bag,
    "aten.embedding_bag.padding_idx": convert_embedding_bag,
    "aten.grid_sampler.default": convert_grid_sampler,
    "aten.grid_sampler_2d.default": convert_grid_sampler,
    "aten.grid_sampler_3d.default": convert_grid_sampler,
    "aten.pixel_shuffle.default": convert_pixel_shuffle,
    "aten.pixel_unshuffle.default": convert_pixel_unshuffle,
    "aten.channel_shuffle.default": convert_channel_shuffle,
    "aten.native_channel_shuffle.default": convert_channel_shuffle,
    "aten.im2col.default": convert_im2col,
    "aten.col2im.default": convert_col2im,
    "aten.pairwise_distance.default": convert_pairwise_distance,
    "aten.cdist.default": convert_cdist,
    "aten._cdist_forward.default": convert_cdist,
    "aten.cosine_similarity.default": convert_cosine_similarity,
    "aten.max_unpool2d.default": convert_max_unpool,
    "aten.max_unpool3d.default": convert_max_unpool,
    "aten._upsample_bilinear2d_aa.vec": convert_upsample_bilinear2d_aa_vec,
    "aten._upsample_bilinear2d_aa.default": convert_upsample_bilinear2d_aa,
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
    "aten.upsample_nearest1d.vec": upsample_nearest1d_vec,
    "aten.upsample_nearest1d.default": upsample_nearest1d,
    "aten.upsample_nearest2d.vec": upsample_nearest2d_vec,
    "aten.upsample_nearest2d.default": upsample_nearest2d,
    "aten.upsample_nearest3d.vec": upsample_nearest3d_vec,
    "aten.upsample_nearest3d.default": upsample_nearest3d,
    "aten._upsample_nearest_exact1d.vec": _upsample_nearest_exact1d_vec,
    "aten._upsample_nearest_exact1d.default": _upsample_nearest_exact1d,
    "aten._upsample_nearest_exact2d.vec": _upsample_nearest_exact2d_vec,
    "aten._upsample_nearest_exact2d.default": _upsample_nearest_exact2d,
    "aten._upsample_nearest_exact3d.vec": _upsample_nearest_exact3d_vec,
    "aten._upsample_nearest_exact3d.default": _upsample_nearest_exact3d,
    "aten.upsample_linear1d.vec": upsample_linear1d_vec,
    "aten.upsample_linear1d.default": upsample_linear1d,
    "aten.upsample_bilinear2d.vec": upsample_bilinear2d_vec,
    "aten.upsample_bilinear2d.default": upsample_bilinear2d,
    "aten.upsample_trilinear3d.vec": upsample_trilinear3d_vec,
    "aten.upsample_trilinear3d.default": upsample_trilinear3d,
    "aten.upsample_bicubic2d.vec": upsample_bicubic2d_vec,
    "aten.upsample_bicubic2d.default": upsample_bicubic2d,
}
