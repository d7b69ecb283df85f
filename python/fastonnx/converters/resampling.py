"""Resampling: upsample (nearest, nearest-exact, linear, bilinear, trilinear, bicubic) as Resize,
grid_sample (GridSample, or gathers for 3-D grids below opset 20) and the antialiased bilinear resize.

torch accepts unbatched inputs (no N dim); ONNX's Resize needs N, so such inputs get a leading dim of 1
added and removed around the ONNX op (``lib.spatial``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from fastonnx.context import ConversionContext, Converter, Value
from fastonnx.converters.lib.spatial import batched, unbatch

aten = torch.ops.aten


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
    if attrs.get("mode") == "linear" and (steps := _odd_strides(x, nd, output_size, scales, attrs)):
        # each output's source is one input pixel: a strided Slice is exact, as torch is, where
        # Resize's float scale (out/in: 32/224 is not 1/7) blends in a neighbour at ~1e-5
        starts = [(k - 1) // 2 for k in steps]
        ends = [int(d) for d in x.shape[-nd:]]
        axes = list(range(-nd, 0))
        return ctx.op("Slice", x, ctx.i64(starts), ctx.i64(ends), ctx.i64(axes), ctx.i64(steps))
    xin, added = batched(ctx, x, nd)
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
    return unbatch(ctx, y, added)


def _odd_strides(
    x: Value,
    nd: int,
    output_size: Sequence[Any] | None,
    scales: Sequence[float | None] | None,
    attrs: dict[str, Any],
) -> list[int] | None:
    """Per spatial dim, the odd factor ``in / out`` of a linear downscale by output size without
    align_corners, where every dim's is such a whole number (and one above 1); else None. torch's
    source coordinate is then ``k * dst + (k - 1) / 2``, a whole pixel, with weights of exactly 1 and 0."""
    if (
        scales is not None
        or output_size is None
        or attrs.get("coordinate_transformation_mode") != "half_pixel"
    ):
        return None
    steps: list[int] = []
    for size, out in zip(x.shape[-nd:], output_size, strict=True):
        if not (isinstance(size, int) and isinstance(out, int)) or out <= 0 or size % out:
            return None
        if (k := size // out) % 2 == 0:
            return None
        steps.append(k)
    return steps if any(k > 1 for k in steps) else None


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


# ---- antialiased bilinear and bicubic resize ------------------------------------------------------------
def _aa_weights(
    kernel: Any, size_in: int, size_out: int, align_corners: bool, scale: float | None
) -> torch.Tensor:
    """The (out, in) matrix of torch's antialiased filter (``kernel``: bilinear or bicubic) along one
    axis: torch's own kernel applied to the basis vectors (the filter is linear and separable, so this is
    exact)."""
    # the other axis is 2 wide and kept (torch's kernel mishandles a width of 1)
    basis = torch.eye(size_in, dtype=torch.float64).reshape(size_in, 1, size_in, 1).expand(-1, -1, -1, 2)
    y: torch.Tensor = kernel(basis.contiguous(), [size_out, 2], align_corners, scale, None)
    return y[:, 0, :, 0].T.contiguous()


def _upsample_aa(
    ctx: ConversionContext, kernel: Any, x: Value, align_corners: bool, scales: Sequence[float | None]
) -> str:
    """out = Wh @ x @ Ww^T over the last two dims, with the weights computed at conversion time."""
    (oh, ow), (h, w) = ctx.out_shape[-2:], x.shape[-2:]
    if not all(isinstance(d, int) for d in (oh, ow, h, w)):
        raise ctx.error("an antialiased resize needs static spatial sizes")
    dtype = x.dtype
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    wh = ctx.const(_aa_weights(kernel, h, oh, align_corners, scales[0]), compute)
    wwt = ctx.const(_aa_weights(kernel, w, ow, align_corners, scales[1]).T, compute)
    rows = ctx.op("MatMul", wh, ctx.cast(x, compute))
    return ctx.cast(ctx.op("MatMul", rows, wwt), dtype)


def _aa_converters(kernel: Any) -> tuple[Converter, Converter]:
    """The .vec and .default converters of an antialiased resize computed by ``kernel``."""

    def vec(
        ctx: ConversionContext, x: Value, output_size: Any, align_corners: bool, scale_factors: Any
    ) -> str:
        scales = list(scale_factors) if scale_factors is not None else [None, None]
        return _upsample_aa(ctx, kernel, x, align_corners, scales)

    def default(
        ctx: ConversionContext,
        x: Value,
        output_size: Sequence[Any],
        align_corners: bool,
        scales_h: float | None = None,
        scales_w: float | None = None,
    ) -> str:
        return _upsample_aa(ctx, kernel, x, align_corners, [scales_h, scales_w])

    return vec, default


convert_upsample_bilinear2d_aa_vec, convert_upsample_bilinear2d_aa = _aa_converters(
    aten._upsample_bilinear2d_aa.default
)
# RF-DETR resizes its backbone's position embeddings so
convert_upsample_bicubic2d_aa_vec, convert_upsample_bicubic2d_aa = _aa_converters(
    aten._upsample_bicubic2d_aa.default
)


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
    "aten.grid_sampler.default": convert_grid_sampler,
    "aten.grid_sampler_2d.default": convert_grid_sampler,
    "aten.grid_sampler_3d.default": convert_grid_sampler,
    "aten._upsample_bilinear2d_aa.vec": convert_upsample_bilinear2d_aa_vec,
    "aten._upsample_bilinear2d_aa.default": convert_upsample_bilinear2d_aa,
    "aten._upsample_bicubic2d_aa.vec": convert_upsample_bicubic2d_aa_vec,
    "aten._upsample_bicubic2d_aa.default": convert_upsample_bicubic2d_aa,
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
