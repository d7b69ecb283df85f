"""torchvision's detection operators: nms, roi_align, roi_pool, ps_roi_align, ps_roi_pool, deform_conv2d.

They are torch.library ops (``torchvision.nms.default``...), looked up by name. Where ONNX has the
operator and onnxruntime runs it, it is used: ``NonMaxSuppression`` (17-26), ``RoiAlign`` and
``MaxRoiPool`` (17-21: onnxruntime 1.31 has no kernels for them at opset 22+), ``DeformConv`` (19+).
Elsewhere the op is composed from standard operators, following torchvision's CPU kernels:

- bilinear samples are four ``Gather``s from the flattened input, weighted as torchvision weighs them
  (roi_align's clamping at the borders, deform_conv2d's zero padding);
- the samples of a bin (roi_align's sampling grid, roi_pool's integer window) are visited one offset at
  a time, for every ROI and bin at once, accumulated with ``Add`` / ``Max``: unrolled when the grid is a
  constant (``sampling_ratio > 0``), else a ``Loop`` up to the largest grid of any ROI, each ROI masking
  the offsets past its own grid. Memory stays at one output-sized tensor per step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from fastonnx import dtypes
from fastonnx.context import ConversionContext, Converter, Value
from fastonnx.converters.lib.ops import split, unsqueeze

# onnxruntime 1.31 runs RoiAlign / MaxRoiPool up to this opset ("NOT_IMPLEMENTED" above)
_ORT_ROI_KERNELS_MAX_OPSET = 21
# a constant sampling grid up to this many samples per bin is unrolled; larger ones run as a Loop
_UNROLL_SAMPLES = 16


def _static_int(ctx: ConversionContext, v: Any, what: str) -> int:
    if isinstance(v, int):
        return v
    raise ctx.error(f"{what} must be a constant int, got {v!r}")


def _float_input(ctx: ConversionContext, x: Value, op: str) -> None:
    if x.dtype not in (torch.float32, torch.float64):
        raise ctx.error(f"{op}: input of dtype {x.dtype} is not supported (float32 and float64 are)")
    if x.rank != 4:
        raise ctx.error(f"{op}: input must be 4-D (N, C, H, W), got rank {x.rank}")


# ---- nms ----------------------------------------------------------------------------------------


def nms(ctx: ConversionContext, boxes: Value, scores: Value, iou_threshold: float) -> str:
    """torchvision.nms: indices (int64, 1-D) of the kept boxes by decreasing score; a box is dropped
    when its IoU with a kept higher-scoring box is > iou_threshold.

    ONNX NonMaxSuppression (center_point_box=0) reads a box as two opposite corners, so torchvision's
    (x1, y1, x2, y2) gives the same areas and intersections as the (y1, x1, y2, x2) of its
    specification. It returns (batch, class, box) triples in the order it selects them, which is by
    decreasing score; every box may be kept (max_output_boxes_per_class = the number of boxes).
    """
    if boxes.rank != 2 or scores.rank != 1:
        raise ctx.error(f"nms expects boxes (N, 4) and scores (N,), got ranks {boxes.rank} and {scores.rank}")
    b = unsqueeze(ctx, ctx.cast(boxes, torch.float32), [0])  # (1, N, 4)
    s = unsqueeze(ctx, ctx.cast(scores, torch.float32), [0, 1])  # (1, 1, N)
    count = ctx.op("Shape", boxes, start=0, end=1)
    iou = ctx.const([float(iou_threshold)], torch.float32)
    selected = ctx.op("NonMaxSuppression", b, s, count, iou, center_point_box=0)
    return ctx.op("Gather", selected, ctx.i64(2), axis=1)


# ---- shared pieces of the compositions -----------------------------------------------------------


class _Geometry:
    """What the compositions need of the input (N, C, H, W) and the rois (K, 5)."""

    def __init__(self, ctx: ConversionContext, x: Value, rois: Value) -> None:
        self.dt = x.dtype
        dims = ctx.dims_of(x)
        self.c, self.h, self.w = (ctx.op("Gather", dims, ctx.i64(a), axis=0) for a in (1, 2, 3))
        self.hf = ctx.cast(self.h, self.dt)
        self.wf = ctx.cast(self.w, self.dt)
        self.flat = ctx.op("Reshape", x, ctx.i64([-1]))
        cols = split(ctx, unsqueeze(ctx, ctx.cast(rois, self.dt), [2, 3]), [1] * 5, axis=1)
        self.batch = ctx.cast(cols[0], torch.int64)  # (K, 1, 1, 1), as every per-ROI value below
        self.x1, self.y1, self.x2, self.y2 = cols[1:]
        self.k = ctx.op("Shape", rois, start=0, end=1)

    def f(self, ctx: ConversionContext, v: float) -> str:
        return ctx.const(v, self.dt)

    def plane_base(self, ctx: ConversionContext, channels: str) -> str:
        """Flat index of element (0, 0) of plane (roi's image, channel): channels broadcast against
        (K, 1, 1, 1)."""
        plane = ctx.op("Add", ctx.op("Mul", self.batch, self.c), channels)
        return ctx.op("Mul", plane, ctx.op("Mul", self.h, self.w))

    def out_init(self, ctx: ConversionContext, channels: str, ph: int, pw: int, value: float) -> str:
        shape = ctx.op("Concat", self.k, ctx.op("Reshape", channels, ctx.i64([1])), ctx.i64([ph, pw]), axis=0)
        return ctx.op("ConstantOfShape", shape, value=ctx.tensor_attr(value, self.dt))


def _input_channels(
    ctx: ConversionContext, g: Any, ph: int, pw: int, position_sensitive: bool
) -> tuple[str, str]:
    """(the input channel each output bin reads, shaped (1, C_out, ph, pw) or (1, C, 1, 1); C_out).
    Position-sensitive pooling reads channel c * ph * pw + (i * pw + j) for bin (i, j) of output c."""
    if position_sensitive:
        mapping = torch.arange(ph * pw, dtype=torch.int64).reshape(1, 1, ph, pw)
        c_out = ctx.op("Div", g.c, ctx.i64(ph * pw))
        first = ctx.op("Mul", ctx.op("Range", ctx.i64(0), c_out, ctx.i64(1)), ctx.i64(ph * pw))
        channels = ctx.op(
            "Add", ctx.op("Reshape", first, ctx.i64([1, -1, 1, 1])), ctx.const(mapping, torch.int64)
        )
        return channels, c_out
    channels = ctx.op("Reshape", ctx.op("Range", ctx.i64(0), g.c, ctx.i64(1)), ctx.i64([1, -1, 1, 1]))
    return channels, g.c


def _bin_index(ctx: ConversionContext, n: int, axis: int, dtype: torch.dtype) -> str:
    """0..n-1 along ``axis`` of a rank-4 tensor of ones elsewhere."""
    shape = [1, 1, 1, 1]
    shape[axis] = n
    return ctx.const(torch.arange(n, dtype=dtype).reshape(shape), dtype)


def _bilinear_clamped(ctx: ConversionContext, g: _Geometry, base: str, y: str, x: str) -> str:
    """torchvision's roi_align interpolation at (y, x) of the planes starting at ``base``: 0 outside
    [-1, H] x [-1, W], coordinates in [-1, 0) read as 0, the last row / column repeated past it."""
    zero, one = g.f(ctx, 0.0), g.f(ctx, 1.0)
    valid = ctx.op(
        "And",
        ctx.op("And", ctx.op("GreaterOrEqual", y, g.f(ctx, -1.0)), ctx.op("LessOrEqual", y, g.hf)),
        ctx.op("And", ctx.op("GreaterOrEqual", x, g.f(ctx, -1.0)), ctx.op("LessOrEqual", x, g.wf)),
    )

    def axis(v: str, size: str, size_f: str) -> tuple[str, str, str, str]:
        vc = ctx.op("Min", ctx.op("Max", v, zero), ctx.op("Sub", size_f, one))
        low_f = ctx.op("Floor", vc)
        frac = ctx.op("Sub", vc, low_f)
        low = ctx.cast(low_f, torch.int64)
        high = ctx.op("Min", ctx.op("Add", low, ctx.i64(1)), ctx.op("Sub", size, ctx.i64(1)))
        return low, high, frac, ctx.op("Sub", one, frac)

    yl, yh, ly, hy = axis(y, g.h, g.hf)
    xl, xh, lx, hx = axis(x, g.w, g.wf)
    row_l = ctx.op("Add", base, ctx.op("Mul", yl, g.w))
    row_h = ctx.op("Add", base, ctx.op("Mul", yh, g.w))
    corners = [(row_l, xl, hy, hx), (row_l, xh, hy, lx), (row_h, xl, ly, hx), (row_h, xh, ly, lx)]
    total: str | None = None
    for row, col, wy, wx in corners:
        v = ctx.op("Gather", g.flat, ctx.op("Add", row, col), axis=0)
        term = ctx.op("Mul", ctx.op("Mul", wy, wx), v)
        total = term if total is None else ctx.op("Add", total, term)
    assert total is not None
    return ctx.op("Where", valid, total, zero)


Step = Callable[[str, str, bool], str]


def _grid(
    ctx: ConversionContext,
    g: _Geometry,
    init: str,
    combine: str,
    step: Step,
    static: tuple[int, int] | None,
    trips: tuple[str, str] | None,
) -> str:
    """acc = combine(acc, step(iy, ix)) over the offsets (iy, ix) of a sampling grid, row-major.

    ``step(iy, ix, masked)`` gets the offsets as 0-d values of the input's dtype. A ``static`` grid is
    unrolled (``masked`` False); else a Loop runs ``trips`` = (rows, cols) 0-d int64 offsets and the
    step masks what lies past each ROI's own grid (``masked`` True).
    """
    if static is not None and static[0] * static[1] <= _UNROLL_SAMPLES:
        acc = init
        for row in range(static[0]):
            for col in range(static[1]):
                acc = ctx.op(combine, acc, step(g.f(ctx, float(row)), g.f(ctx, float(col)), False))
        return acc
    if static is not None:
        rows, cols = ctx.i64(static[0]), ctx.i64(static[1])
        masked = False
    else:
        assert trips is not None
        rows, cols = trips
        masked = True
    parent = ctx.g
    body = parent.subgraph(parent.unique_name("grid"))
    onnx_dt = dtypes.to_onnx_dtype(g.dt)
    it = body.add_input(parent.unique_name("offset"), dtypes.INT64, [])
    body.add_input(parent.unique_name("cond_in"), dtypes.BOOL, [])
    acc_in = body.add_input(parent.unique_name("acc_in"), onnx_dt, [None, None, None, None])
    ctx.g = body
    try:
        iy = ctx.cast(ctx.op("Div", it, cols), g.dt)
        ix = ctx.cast(ctx.op("Mod", it, cols), g.dt)
        acc = ctx.op(combine, acc_in, step(iy, ix, masked))
        cond = body.add_output(
            ctx.op("Identity", ctx.const(True, torch.bool)), parent.unique_name("cond_out")
        )
        body.set_type(cond, dtypes.BOOL, [])
        out = body.add_output(acc, parent.unique_name("acc_out"))
        body.set_type(out, onnx_dt, [None, None, None, None])
    finally:
        ctx.g = parent
    (result,) = ctx.op(
        "Loop", ctx.op("Mul", rows, cols), ctx.const(True, torch.bool), init, outputs=1, body=body
    )
    return result


def _largest(ctx: ConversionContext, v: str) -> str:
    """The largest element of an int64 tensor as a 0-d value, 0 when it is empty or all negative."""
    flat = ctx.op("Concat", ctx.op("Reshape", v, ctx.i64([-1])), ctx.i64([0]), axis=0)
    return ctx.op("ReduceMax", flat, keepdims=0)


# ---- roi_align / ps_roi_align ----------------------------------------------------------------------


def _sampled_bins(
    ctx: ConversionContext,
    x: Value,
    rois: Value,
    spatial_scale: float,
    ph: int,
    pw: int,
    sampling_ratio: int,
    aligned: bool,
    position_sensitive: bool,
) -> str:
    """roi_align (average of bilinear samples on a grid per bin) as a composition. Position-sensitive:
    output channel c of bin (i, j) reads input channel (c * ph + i) * pw + j, the rois are always
    shifted by half a pixel and torchvision divides by the grid size unclamped."""
    g = _Geometry(ctx, x, rois)
    dt = g.dt
    scale = g.f(ctx, float(spatial_scale))
    offset = g.f(ctx, 0.5 if aligned else 0.0)

    def corner(v: str) -> str:
        return ctx.op("Sub", ctx.op("Mul", v, scale), offset)

    x1, y1, x2, y2 = corner(g.x1), corner(g.y1), corner(g.x2), corner(g.y2)
    roi_w, roi_h = ctx.op("Sub", x2, x1), ctx.op("Sub", y2, y1)
    if not aligned:  # torchvision makes a misaligned ROI at least 1x1
        roi_w = ctx.op("Max", roi_w, g.f(ctx, 1.0))
        roi_h = ctx.op("Max", roi_h, g.f(ctx, 1.0))
    bin_h = ctx.op("Div", roi_h, g.f(ctx, float(ph)))
    bin_w = ctx.op("Div", roi_w, g.f(ctx, float(pw)))
    if sampling_ratio > 0:
        grid_h = grid_w = g.f(ctx, float(sampling_ratio))
        static: tuple[int, int] | None = (sampling_ratio, sampling_ratio)
        trips = None
    else:  # torchvision: ceil(roi size / pooled size) samples per bin side, per ROI
        grid_h, grid_w = ctx.op("Ceil", bin_h), ctx.op("Ceil", bin_w)
        static = None
        trips = (_largest(ctx, ctx.cast(grid_h, torch.int64)), _largest(ctx, ctx.cast(grid_w, torch.int64)))
    bin_y0 = ctx.op("Add", y1, ctx.op("Mul", _bin_index(ctx, ph, 2, dt), bin_h))  # (K, 1, ph, 1)
    bin_x0 = ctx.op("Add", x1, ctx.op("Mul", _bin_index(ctx, pw, 3, dt), bin_w))  # (K, 1, 1, pw)

    channels, out_channels = _input_channels(ctx, g, ph, pw, position_sensitive)
    base = g.plane_base(ctx, channels)
    half = g.f(ctx, 0.5)

    # an empty grid (a ROI of size <= 0) has no samples; its divisor only must not make inf / NaN
    # coordinates (their int64 cast would be an arbitrary index)
    div_h = grid_h if static is not None else ctx.op("Max", grid_h, g.f(ctx, 1.0))
    div_w = grid_w if static is not None else ctx.op("Max", grid_w, g.f(ctx, 1.0))

    def step(iy: str, ix: str, masked: bool) -> str:
        dy = ctx.op("Div", ctx.op("Mul", ctx.op("Add", iy, half), bin_h), div_h)
        dx = ctx.op("Div", ctx.op("Mul", ctx.op("Add", ix, half), bin_w), div_w)
        v = _bilinear_clamped(ctx, g, base, ctx.op("Add", bin_y0, dy), ctx.op("Add", bin_x0, dx))
        if not masked:
            return v
        inside = ctx.op("And", ctx.op("Less", iy, grid_h), ctx.op("Less", ix, grid_w))
        return ctx.op("Where", inside, v, g.f(ctx, 0.0))

    total = _grid(ctx, g, g.out_init(ctx, out_channels, ph, pw, 0.0), "Add", step, static, trips)
    count = ctx.op("Mul", grid_h, grid_w)
    if not position_sensitive:
        count = ctx.op("Max", count, g.f(ctx, 1.0))
    return ctx.op("Div", total, count)


def roi_align(
    ctx: ConversionContext,
    x: Value,
    rois: Value,
    spatial_scale: float,
    pooled_height: int,
    pooled_width: int,
    sampling_ratio: int,
    aligned: bool,
) -> str:
    """torchvision.roi_align: ONNX RoiAlign at opsets 17-21 (its adaptive grid, sampling_ratio 0, is
    torchvision's ceil(roi size / output size) too; aligned picks half_pixel, else output_half_pixel),
    a composition above."""
    _float_input(ctx, x, "roi_align")
    ph = _static_int(ctx, pooled_height, "roi_align's pooled_height")
    pw = _static_int(ctx, pooled_width, "roi_align's pooled_width")
    if ctx.opset <= _ORT_ROI_KERNELS_MAX_OPSET:
        batch = ctx.cast(ctx.op("Gather", rois, ctx.i64(0), axis=1), torch.int64)
        boxes = ctx.op("Slice", rois, ctx.i64([1]), ctx.i64([5]), ctx.i64([1]))
        return ctx.op(
            "RoiAlign",
            x,
            ctx.cast(boxes, x.dtype),
            batch,
            coordinate_transformation_mode="half_pixel" if aligned else "output_half_pixel",
            mode="avg",
            output_height=ph,
            output_width=pw,
            sampling_ratio=max(int(sampling_ratio), 0),
            spatial_scale=float(spatial_scale),
        )
    return _sampled_bins(ctx, x, rois, spatial_scale, ph, pw, int(sampling_ratio), bool(aligned), False)


def ps_roi_align(
    ctx: ConversionContext,
    x: Value,
    rois: Value,
    spatial_scale: float,
    pooled_height: int,
    pooled_width: int,
    sampling_ratio: int,
) -> tuple[str, None]:
    """torchvision.ps_roi_align (no ONNX operator): the composition, at every opset. The second result
    (channel mapping, for the backward pass) is not produced."""
    _float_input(ctx, x, "ps_roi_align")
    ph = _static_int(ctx, pooled_height, "ps_roi_align's pooled_height")
    pw = _static_int(ctx, pooled_width, "ps_roi_align's pooled_width")
    out = _sampled_bins(ctx, x, rois, spatial_scale, ph, pw, int(sampling_ratio), True, True)
    return out, None


# ---- roi_pool / ps_roi_pool --------------------------------------------------------------------------


def _round_half_away(ctx: ConversionContext, g: _Geometry, v: str) -> str:
    """std::round (ties away from zero); ONNX Round rounds ties to even."""
    a = ctx.op("Abs", v)
    fa = ctx.op("Floor", a)
    up = ctx.cast(ctx.op("GreaterOrEqual", ctx.op("Sub", a, fa), g.f(ctx, 0.5)), g.dt)
    return ctx.op("Mul", ctx.op("Sign", v), ctx.op("Add", fa, up))


def _pooled_windows(
    ctx: ConversionContext,
    x: Value,
    rois: Value,
    spatial_scale: float,
    ph: int,
    pw: int,
    position_sensitive: bool,
) -> str:
    """roi_pool (max over each bin's integer window) or ps_roi_pool (mean) as a composition."""
    g = _Geometry(ctx, x, rois)
    dt = g.dt
    scale = g.f(ctx, float(spatial_scale))

    def corner(v: str) -> str:
        return _round_half_away(ctx, g, ctx.op("Mul", v, scale))

    x1, y1, x2, y2 = corner(g.x1), corner(g.y1), corner(g.x2), corner(g.y2)
    extra = g.f(ctx, 0.0 if position_sensitive else 1.0)  # roi_pool counts both ends
    roi_w = ctx.op("Max", ctx.op("Add", ctx.op("Sub", x2, x1), extra), g.f(ctx, 1.0))
    roi_h = ctx.op("Max", ctx.op("Add", ctx.op("Sub", y2, y1), extra), g.f(ctx, 1.0))
    bin_h = ctx.op("Div", roi_h, g.f(ctx, float(ph)))
    bin_w = ctx.op("Div", roi_w, g.f(ctx, float(pw)))

    def window(idx: str, size: str, start: str, bin_size: str) -> tuple[str, str]:
        lo = ctx.op("Add", ctx.op("Floor", ctx.op("Mul", idx, bin_size)), start)
        hi = ctx.op("Add", ctx.op("Ceil", ctx.op("Mul", ctx.op("Add", idx, g.f(ctx, 1.0)), bin_size)), start)
        zero = g.f(ctx, 0.0)
        lo = ctx.cast(ctx.op("Min", ctx.op("Max", lo, zero), size), torch.int64)
        hi = ctx.cast(ctx.op("Min", ctx.op("Max", hi, zero), size), torch.int64)
        return lo, ctx.op("Sub", hi, lo)

    # torchvision clips windows to [0, H] for roi_pool, to [0, H - 1] for ps_roi_pool (whose last row
    # and column are never read)
    one = g.f(ctx, 1.0)
    limit_h = ctx.op("Sub", g.hf, one) if position_sensitive else g.hf
    limit_w = ctx.op("Sub", g.wf, one) if position_sensitive else g.wf
    h0, eh = window(_bin_index(ctx, ph, 2, dt), limit_h, y1, bin_h)  # (K, 1, ph, 1)
    w0, ew = window(_bin_index(ctx, pw, 3, dt), limit_w, x1, bin_w)  # (K, 1, 1, pw)
    empty = ctx.op("Or", ctx.op("LessOrEqual", eh, ctx.i64(0)), ctx.op("LessOrEqual", ew, ctx.i64(0)))

    channels, out_channels = _input_channels(ctx, g, ph, pw, position_sensitive)
    base = g.plane_base(ctx, channels)
    last_row = ctx.op("Sub", g.h, ctx.i64(1))
    last_col = ctx.op("Sub", g.w, ctx.i64(1))
    fill = 0.0 if position_sensitive else float("-inf")

    def step(iy: str, ix: str, masked: bool) -> str:
        dy, dx = ctx.cast(iy, torch.int64), ctx.cast(ix, torch.int64)
        row = ctx.op("Min", ctx.op("Add", h0, dy), last_row)  # clamped where masked out
        col = ctx.op("Min", ctx.op("Add", w0, dx), last_col)
        index = ctx.op("Add", ctx.op("Add", base, ctx.op("Mul", row, g.w)), col)
        v = ctx.op("Gather", g.flat, index, axis=0)
        inside = ctx.op("And", ctx.op("Less", dy, eh), ctx.op("Less", dx, ew))
        return ctx.op("Where", inside, v, g.f(ctx, fill))

    trips = (_largest(ctx, eh), _largest(ctx, ew))
    init = g.out_init(ctx, out_channels, ph, pw, fill)
    acc = _grid(ctx, g, init, "Add" if position_sensitive else "Max", step, None, trips)
    if position_sensitive:
        area = ctx.cast(ctx.op("Mul", eh, ew), dt)
        acc = ctx.op("Div", acc, ctx.op("Max", area, g.f(ctx, 1.0)))
    return ctx.op("Where", empty, g.f(ctx, 0.0), acc)


def roi_pool(
    ctx: ConversionContext,
    x: Value,
    rois: Value,
    spatial_scale: float,
    pooled_height: int,
    pooled_width: int,
) -> tuple[str, None]:
    """torchvision.roi_pool: ONNX MaxRoiPool at opsets 17-21 (it takes the (K, 5) rois as they are),
    a composition above. The second result (argmax, for the backward pass) is not produced."""
    _float_input(ctx, x, "roi_pool")
    ph = _static_int(ctx, pooled_height, "roi_pool's pooled_height")
    pw = _static_int(ctx, pooled_width, "roi_pool's pooled_width")
    if ctx.opset <= _ORT_ROI_KERNELS_MAX_OPSET:
        out = ctx.op(
            "MaxRoiPool",
            x,
            ctx.cast(rois, x.dtype),
            pooled_shape=[ph, pw],
            spatial_scale=float(spatial_scale),
        )
        return out, None
    return _pooled_windows(ctx, x, rois, spatial_scale, ph, pw, False), None


def ps_roi_pool(
    ctx: ConversionContext,
    x: Value,
    rois: Value,
    spatial_scale: float,
    pooled_height: int,
    pooled_width: int,
) -> tuple[str, None]:
    """torchvision.ps_roi_pool (no ONNX operator): the composition at every opset."""
    _float_input(ctx, x, "ps_roi_pool")
    ph = _static_int(ctx, pooled_height, "ps_roi_pool's pooled_height")
    pw = _static_int(ctx, pooled_width, "ps_roi_pool's pooled_width")
    return _pooled_windows(ctx, x, rois, spatial_scale, ph, pw, True), None


# ---- deform_conv2d ---------------------------------------------------------------------------------


def deform_conv2d(
    ctx: ConversionContext,
    x: Value,
    weight: Value,
    offset: Value,
    mask: Value,
    bias: Value,
    stride_h: int,
    stride_w: int,
    pad_h: int,
    pad_w: int,
    dilation_h: int,
    dilation_w: int,
    groups: int,
    offset_groups: int,
    use_mask: bool,
) -> str:
    """torchvision.deform_conv2d: ONNX DeformConv from opset 19 (same offset layout: per offset group
    and kernel position a (dy, dx) pair; same zero-padded bilinear sampling), else a composition."""
    _float_input(ctx, x, "deform_conv2d")
    params = [stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, groups, offset_groups]
    sh, sw, ph, pw, dh, dw, groups, off_groups = (
        _static_int(ctx, p, "deform_conv2d's parameters") for p in params
    )
    ws = weight.static_shape()
    if ws is None or x.static_shape() is None or offset.static_shape() is None:
        raise ctx.error("deform_conv2d needs static input, weight and offset shapes")
    kh, kw = ws[2], ws[3]
    if ctx.opset >= 19:
        return ctx.op(
            "DeformConv",
            x,
            weight,
            offset,
            bias,
            mask if use_mask else None,
            dilations=[dh, dw],
            group=groups,
            kernel_shape=[kh, kw],
            offset_group=off_groups,
            pads=[ph, pw, ph, pw],
            strides=[sh, sw],
        )
    return _deform_conv_composed(
        ctx, x, weight, offset, mask if use_mask else None, bias, (sh, sw, ph, pw, dh, dw), groups, off_groups
    )


def _deform_conv_composed(
    ctx: ConversionContext,
    x: Value,
    weight: Value,
    offset: Value,
    mask: Value | None,
    bias: Value,
    geometry: tuple[int, int, int, int, int, int],
    groups: int,
    off_groups: int,
) -> str:
    """Deformable im2col by Gathers (every kernel position and channel at once), then a grouped MatMul."""
    sh, sw, ph, pw, dh, dw = geometry
    # static shapes: the caller refuses symbolic ones
    n, c, h, w = x.static_shape()  # type: ignore[misc]
    o, _, kh, kw = weight.static_shape()  # type: ignore[misc]
    oh, ow = offset.static_shape()[2:]  # type: ignore[index]
    kk = kh * kw
    dt = x.dtype
    cg = c // off_groups

    def f(v: float) -> str:
        return ctx.const(v, dt)

    off = ctx.op("Reshape", offset, ctx.i64([n, off_groups, 1, kk, 2, oh, ow]))
    off_y, off_x = split(ctx, off, [1, 1], axis=4)
    off_y = ctx.op("Squeeze", off_y, ctx.i64([4]))  # (n, G, 1, kk, oh, ow)
    off_x = ctx.op("Squeeze", off_x, ctx.i64([4]))
    # where each kernel tap reads before the offsets: (1, 1, 1, kk, oh, ow) broadcastable
    ky = torch.arange(kh, dtype=dt).repeat_interleave(kw) * dh
    kx = torch.arange(kw, dtype=dt).repeat(kh) * dw
    base_y = ky.reshape(1, 1, 1, kk, 1, 1) + (torch.arange(oh, dtype=dt) * sh - ph).reshape(1, 1, 1, 1, oh, 1)
    base_x = kx.reshape(1, 1, 1, kk, 1, 1) + (torch.arange(ow, dtype=dt) * sw - pw).reshape(1, 1, 1, 1, 1, ow)
    y = ctx.op("Add", ctx.const(base_y, dt), off_y)
    xx = ctx.op("Add", ctx.const(base_x, dt), off_x)
    # flat index of plane (image, channel): (n, G, C/G, 1, 1, 1)
    planes = torch.arange(n * c, dtype=torch.int64).reshape(n, off_groups, cg, 1, 1, 1) * (h * w)
    base = ctx.const(planes, torch.int64)
    flat = ctx.op("Reshape", x, ctx.i64([-1]))

    inside = ctx.op(
        "And",
        ctx.op("And", ctx.op("Greater", y, f(-1.0)), ctx.op("Less", y, f(float(h)))),
        ctx.op("And", ctx.op("Greater", xx, f(-1.0)), ctx.op("Less", xx, f(float(w)))),
    )
    y0f, x0f = ctx.op("Floor", y), ctx.op("Floor", xx)
    ly, lx = ctx.op("Sub", y, y0f), ctx.op("Sub", xx, x0f)
    hy, hx = ctx.op("Sub", f(1.0), ly), ctx.op("Sub", f(1.0), lx)
    y0, x0 = ctx.cast(y0f, torch.int64), ctx.cast(x0f, torch.int64)
    y1, x1 = ctx.op("Add", y0, ctx.i64(1)), ctx.op("Add", x0, ctx.i64(1))

    def in_range(v: str, size: int) -> str:
        return ctx.op(
            "And", ctx.op("GreaterOrEqual", v, ctx.i64(0)), ctx.op("LessOrEqual", v, ctx.i64(size - 1))
        )

    def clamp(v: str, size: int) -> str:
        return ctx.op("Min", ctx.op("Max", v, ctx.i64(0)), ctx.i64(size - 1))

    total: str | None = None
    for ry, rx, wy, wx in ((y0, x0, hy, hx), (y0, x1, hy, lx), (y1, x0, ly, hx), (y1, x1, ly, lx)):
        ok = ctx.op("And", in_range(ry, h), in_range(rx, w))
        index = ctx.op("Add", base, ctx.op("Add", ctx.op("Mul", clamp(ry, h), ctx.i64(w)), clamp(rx, w)))
        v = ctx.op("Where", ok, ctx.op("Gather", flat, index, axis=0), f(0.0))
        term = ctx.op("Mul", ctx.op("Mul", wy, wx), v)
        total = term if total is None else ctx.op("Add", total, term)
    assert total is not None
    cols = ctx.op("Where", inside, total, f(0.0))  # (n, G, C/G, kk, oh, ow)
    if mask is not None:
        cols = ctx.op("Mul", cols, ctx.op("Reshape", mask, ctx.i64([n, off_groups, 1, kk, oh, ow])))
    cols = ctx.op("Reshape", cols, ctx.i64([n, groups, (c // groups) * kk, oh * ow]))
    wmat = ctx.op("Reshape", weight, ctx.i64([groups, o // groups, (c // groups) * kk]))
    out = ctx.op("Reshape", ctx.op("MatMul", wmat, cols), ctx.i64([n, o, oh, ow]))
    return ctx.op("Add", out, ctx.op("Reshape", bias, ctx.i64([1, o, 1, 1])))


CONVERTERS: dict[str, Converter] = {
    "torchvision.nms.default": nms,
    "torchvision.roi_align.default": roi_align,
    "torchvision.roi_pool.default": roi_pool,
    "torchvision.ps_roi_align.default": ps_roi_align,
    "torchvision.ps_roi_pool.default": ps_roi_pool,
    "torchvision.deform_conv2d.default": deform_conv2d,
}
