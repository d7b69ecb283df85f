"""Quantization as ONNX QDQ: PT2E's ``quantized_decomposed`` ops (registered when torchao is imported,
known here by name only) and QAT's fake quantization.

- ``quantize_per_tensor`` / ``quantize_per_channel`` → ``QuantizeLinear`` (per axis with 1-D scale and
  zero point), the zero point's type giving the integer type (int8 / uint8; int16 / uint16 from opset
  21). torch clamps to the op's ``[quant_min, quant_max]``, ONNX saturates to the type's range: a
  narrower range adds a ``Clip`` on the integer result.
- ``dequantize_per_tensor`` / ``dequantize_per_channel`` → ``DequantizeLinear`` (float32), then a Cast
  to ``out_dtype`` when given.
- ``fake_quantize_per_tensor_affine`` / ``fake_quantize_per_channel_affine`` (and their ``_cachemask``
  forms, whose mask is the in-range test of the rounded value, built only when read) →
  ``QuantizeLinear`` → [``Clip``] → ``DequantizeLinear`` when the range fits a QDQ type, otherwise the
  same arithmetic in float.

Rounding: QuantizeLinear rounds half to even, as ``torch.round`` does. torch multiplies by ``1 / scale``
where ONNX divides by ``scale``: the two may differ in the last bit of the float, which moves a value
lying exactly on a rounding boundary by one step at most.
"""

from __future__ import annotations

from typing import Any

import torch

from fastonnx import dtypes
from fastonnx.context import ConversionContext, Converter, Value

# the integer types QuantizeLinear / DequantizeLinear take, with their range and first opset
_QDQ_TYPES: dict[torch.dtype, tuple[int, int, int]] = {
    torch.uint8: (0, 255, 10),
    torch.int8: (-128, 127, 10),
    torch.uint16: (0, 65535, 21),
    torch.int16: (-32768, 32767, 21),
}


def _qdq_type(ctx: ConversionContext, qdtype: torch.dtype, what: str) -> None:
    if qdtype not in _QDQ_TYPES:
        raise ctx.error(
            f"{what} to {qdtype} has no ONNX QuantizeLinear form (its types: "
            f"{', '.join(str(t) for t in _QDQ_TYPES)})"
        )
    ctx.require_opset(_QDQ_TYPES[qdtype][2], f"{what} to {qdtype}")


def _weight(ctx: ConversionContext, v: Any) -> torch.Tensor | None:
    """The tensor a value borrows when it is a (small enough, real) weight or buffer, else None."""
    t = ctx.weights.get(v.name) if isinstance(v, Value) else None
    return None if t is None or t.is_meta or not dtypes.on_host(t) else t


def _stored(ctx: ConversionContext, v: Value | torch.Tensor, dtype: torch.dtype, per_tensor: bool) -> str:
    """``v`` as ``dtype`` (0-d per tensor: a 1-D one would mean per axis); a weight (PT2E's scales and
    zero points are buffers) becomes a constant of that type at export instead of a Cast and Reshape
    at every run (constant folding keeps no int8 values). A torch tensor is a weight the converter
    already shaped as ONNX wants it (``_shaped``)."""
    t = v if isinstance(v, torch.Tensor) else _weight(ctx, v)
    if t is not None and t.numel() <= 1 << 16:
        return ctx.const(t.reshape(()) if per_tensor else t, dtype)
    assert isinstance(v, Value)
    out = ctx.cast(v, dtype)
    return ctx.op("Reshape", out, ctx.i64([])) if per_tensor and v.rank != 0 else out


def _scale(ctx: ConversionContext, scale: Any, per_tensor: bool) -> str:
    """The scale as float32: a 0-d value per tensor, 1-D per channel."""
    if isinstance(scale, (Value, torch.Tensor)):
        return _stored(ctx, scale, torch.float32, per_tensor)
    return ctx.const(float(scale), torch.float32)


def _zero_point(ctx: ConversionContext, zero_point: Any, qdtype: torch.dtype, per_tensor: bool) -> str | None:
    if zero_point is None:
        return None
    if isinstance(zero_point, str):  # a constant already of the quantized type (int4)
        return zero_point
    if isinstance(zero_point, (Value, torch.Tensor)):
        return _stored(ctx, zero_point, qdtype, per_tensor)
    return ctx.const(int(zero_point), qdtype)


def _narrowed(qdtype: torch.dtype, quant_min: Any, quant_max: Any) -> bool:
    lo, hi, _ = _QDQ_TYPES[qdtype]
    if isinstance(quant_min, Value) or isinstance(quant_max, Value):
        return True
    return bool(quant_min > lo or quant_max < hi)


def _bound(ctx: ConversionContext, b: Any, qdtype: torch.dtype) -> str:
    if isinstance(b, Value):
        return ctx.op("Reshape", ctx.cast(b, qdtype), ctx.i64([])) if b.rank != 0 else ctx.cast(b, qdtype)
    return ctx.const(int(b), qdtype)


def _quantize(
    ctx: ConversionContext,
    x: Value,
    scale: Any,
    zero_point: Any,
    quant_min: Any,
    quant_max: Any,
    qdtype: torch.dtype,
    axis: int | None = None,
    block_size: int | None = None,
    zero_point_first: bool = False,
) -> str:
    """round(x / scale) + zero_point clamped to [quant_min, quant_max], as ``qdtype``; per ``axis``,
    in blocks of ``block_size`` along it (opset 21) when given. ``zero_point_first``: the op adds the
    zero point before rounding (per token / per group), which only moves an exact tie."""
    per_tensor = axis is None
    if axis is not None:
        axis %= max(x.rank, 1)
    pre = _prequantized(
        ctx, x, scale, zero_point, quant_min, quant_max, qdtype, axis, block_size, zero_point_first
    )
    if pre is not None:
        return pre
    xf = ctx.cast(x, torch.float32)
    s = _scale(ctx, scale, per_tensor)
    z = _zero_point(ctx, zero_point, qdtype, per_tensor)
    narrowed = _narrowed(qdtype, quant_min, quant_max)
    if narrowed and qdtype not in (torch.int8, torch.uint8):
        if block_size is not None:
            raise ctx.error(
                f"a {qdtype} range narrower than the type's, per block, has no QuantizeLinear form"
            )
        # onnxruntime has no 16-bit Clip: clamp the float to (bound - zero_point) * scale instead, which
        # QuantizeLinear maps back onto the bound exactly (the quotient is within a few ulps of an integer)
        zf = ctx.const(0.0, torch.float32) if z is None else ctx.cast(z, torch.float32)
        lo, hi = (
            ctx.op("Mul", ctx.op("Sub", _bound(ctx, b, torch.float32), zf), s) for b in (quant_min, quant_max)
        )
        xf = ctx.op("Min", ctx.op("Max", xf, _along(ctx, lo, axis, x.rank)), _along(ctx, hi, axis, x.rank))
        narrowed = False
    q = ctx.op("QuantizeLinear", xf, s, z, axis=axis, block_size=block_size)
    if narrowed:
        q = ctx.op("Clip", q, _bound(ctx, quant_min, qdtype), _bound(ctx, quant_max, qdtype))
    return q


def _prequantized(
    ctx: ConversionContext,
    x: Value,
    scale: Any,
    zero_point: Any,
    quant_min: Any,
    quant_max: Any,
    qdtype: torch.dtype,
    axis: int | None,
    block_size: int | None = None,
    zero_point_first: bool = False,
) -> str | None:
    """A weight quantized at export (QAT's fake-quantized weights): the integer tensor as a constant, so
    that the file stores it as ``qdtype`` and reads it through DequantizeLinear; None when any operand
    is computed at run time. torch's arithmetic: round(x * (1 / scale)) + zero_point, clamped."""
    w = _weight(ctx, x)
    qparams = [
        v if isinstance(v, torch.Tensor) else _weight(ctx, v) if isinstance(v, Value) else v
        for v in (scale, zero_point)
    ]
    if (
        w is None
        or not w.dtype.is_floating_point
        or any(isinstance(v, Value) for v in (quant_min, quant_max))
    ):
        return None
    if any(p is None for p, v in zip(qparams, (scale, zero_point)) if v is not None):
        return None
    s, z = qparams
    if s is None:
        return None

    def spread(t: torch.Tensor) -> torch.Tensor:
        # the qparam broadcast over the weight: blocks repeated along the axis, a per-axis one reshaped
        if block_size is not None and axis is not None:
            return t.repeat_interleave(block_size, dim=axis)
        shape = [1] * w.dim()
        if axis is not None:
            shape[axis] = -1
        return t.reshape(shape)

    s = spread(s) if isinstance(s, torch.Tensor) else float(s)
    z = 0 if z is None else (spread(z) if isinstance(z, torch.Tensor) else z)
    with torch.no_grad():
        scaled = w.float() * (1.0 / s)
        r = torch.round(scaled + z) if zero_point_first else torch.round(scaled) + z
        q = torch.clamp(r, int(quant_min), int(quant_max))
    return ctx.const(q.to(qdtype), qdtype, "quantized")


def _dequantize(
    ctx: ConversionContext,
    x: Any,
    scale: Any,
    zero_point: Any,
    qdtype: torch.dtype,
    out_dtype: torch.dtype | None,
    axis: int | None = None,
    rank: int = 0,
    block_size: int | None = None,
    product_dtype: torch.dtype | None = None,
) -> str:
    """DequantizeLinear (float32). ``product_dtype``: the type torch's product is computed in, when
    narrower than float32 (a float16 / bfloat16 scale): the float32 product of the integer and the
    scale is exact, a Cast to that type rounds it once, as torch does."""
    per_tensor = axis is None
    y = ctx.op(
        "DequantizeLinear",
        x,
        _scale(ctx, scale, per_tensor),
        _zero_point(ctx, zero_point, qdtype, per_tensor),
        axis=None if axis is None else axis % max(rank, 1),
        block_size=block_size,
    )
    if product_dtype in (torch.float16, torch.bfloat16) and product_dtype != out_dtype:
        y = ctx.op("Cast", y, to=dtypes.to_onnx_dtype(product_dtype))
    # DequantizeLinear gives float32 (the scale's type)
    if out_dtype is None or out_dtype == torch.float32:
        return ctx.cast(y, torch.float32) if product_dtype in (torch.float16, torch.bfloat16) else y
    return ctx.op("Cast", y, to=dtypes.to_onnx_dtype(out_dtype))


def _input_type(ctx: ConversionContext, x: Value, qdtype: torch.dtype) -> None:
    if x.dtype != qdtype:
        raise ctx.error(f"dequantizing a {x.dtype} tensor declared {qdtype}")


# ---- quantized_decomposed ------------------------------------------------------------------------


def convert_quantize_per_tensor(
    ctx: ConversionContext,
    x: Value,
    scale: Any,
    zero_point: Any,
    quant_min: Any,
    quant_max: Any,
    dtype: torch.dtype,
) -> str:
    _qdq_type(ctx, dtype, "quantize_per_tensor")
    return _quantize(ctx, x, scale, zero_point, quant_min, quant_max, dtype)


def convert_dequantize_per_tensor(
    ctx: ConversionContext,
    x: Value,
    scale: Any,
    zero_point: Any,
    quant_min: Any,
    quant_max: Any,
    dtype: torch.dtype,
    *,
    out_dtype: torch.dtype | None = None,
) -> str:
    # DequantizeLinear also reads int32 (biases quantized to int32)
    if dtype != torch.int32:
        _qdq_type(ctx, dtype, "dequantize_per_tensor")
    _input_type(ctx, x, dtype)
    return _dequantize(ctx, x, scale, zero_point, dtype, out_dtype)


def convert_quantize_per_channel(
    ctx: ConversionContext,
    x: Value,
    scales: Value,
    zero_points: Value,
    axis: int,
    quant_min: int,
    quant_max: int,
    dtype: torch.dtype,
) -> str:
    _qdq_type(ctx, dtype, "quantize_per_channel")
    return _quantize(ctx, x, scales, zero_points, quant_min, quant_max, dtype, axis)


def convert_dequantize_per_channel(
    ctx: ConversionContext,
    x: Value,
    scales: Value,
    zero_points: Value | None,
    axis: int,
    quant_min: int,
    quant_max: int,
    dtype: torch.dtype,
    *,
    out_dtype: torch.dtype | None = None,
) -> str:
    if dtype != torch.int32:
        _qdq_type(ctx, dtype, "dequantize_per_channel")
    _input_type(ctx, x, dtype)
    return _dequantize(ctx, x, scales, zero_points, dtype, out_dtype, axis, x.rank)


# ---- per token, per channel group ----------------------------------------------------------------


def _shaped(ctx: ConversionContext, v: Any, shape: list[Any]) -> Any:
    """A qparam in the shape the ONNX op wants: a weight's tensor reshaped at export (a constant
    later), a run-time value through a Reshape; None and numbers as they are."""
    if not isinstance(v, Value):
        return v
    t = _weight(ctx, v)
    if t is not None and t.numel() <= 1 << 16:
        return t.reshape([-1 if not isinstance(d, int) else d for d in shape])
    return Value(ctx.op("Reshape", v, ctx.shape_tensor(shape)), v.dtype, tuple(shape))


def _rows(ctx: ConversionContext, x: Value) -> Value:
    """``x`` as (tokens, last dim): per token is per axis 0 of the rows."""
    n = x.shape[-1]
    return Value(ctx.op("Reshape", x, ctx.shape_tensor([-1, n])), x.dtype, (-1, n))


def _product_dtype(scale: Any) -> torch.dtype | None:
    return scale.dtype if isinstance(scale, (Value, torch.Tensor)) else None


def convert_quantize_per_token(
    ctx: ConversionContext,
    x: Value,
    scales: Value,
    zero_points: Value,
    quant_min: int,
    quant_max: int,
    dtype: torch.dtype,
) -> str:
    """One scale and zero point per row of the last dim: QuantizeLinear along axis 0 of ``x`` seen as
    (tokens, last dim)."""
    _qdq_type(ctx, dtype, "quantize_per_token")
    rows = _rows(ctx, x)
    q = _quantize(
        ctx,
        rows,
        _shaped(ctx, scales, [-1]),
        _shaped(ctx, zero_points, [-1]),
        quant_min,
        quant_max,
        dtype,
        0,
        zero_point_first=True,
    )
    return ctx.op("Reshape", q, ctx.dims_of(x))


def convert_dequantize_per_token(
    ctx: ConversionContext,
    x: Value,
    scales: Value,
    zero_points: Value,
    quant_min: int,
    quant_max: int,
    dtype: torch.dtype,
    output_dtype: torch.dtype = torch.float32,
) -> str:
    if dtype != torch.int32:
        _qdq_type(ctx, dtype, "dequantize_per_token")
    _input_type(ctx, x, dtype)
    rows = _rows(ctx, x)
    y = _dequantize(
        ctx,
        rows,
        _shaped(ctx, scales, [-1]),
        _shaped(ctx, zero_points, [-1]),
        dtype,
        output_dtype,
        0,
        2,
        product_dtype=_product_dtype(scales),
    )
    return ctx.op("Reshape", y, ctx.dims_of(x))


def _group(
    ctx: ConversionContext, op: str, x: Value, scales: Value, group_size: int
) -> tuple[int, list[int]]:
    """The block size and the (rows, groups) shape of the qparams of a per-channel-group op on a 2-D
    ``x``; blocked QuantizeLinear / DequantizeLinear are opset 21's."""
    ctx.require_opset(21, f"{op} (a blocked QuantizeLinear / DequantizeLinear)")
    shape = x.static_shape()
    if x.rank != 2 or shape is None:
        raise ctx.error(f"{op} takes a 2-D tensor of static shape, got {x.shape}")
    rows, cols = shape
    if group_size > cols and scales.shape[-1] == 1:  # torch's rule: one group per row
        group_size = cols
    if group_size <= 1 or cols % group_size:
        raise ctx.error(f"{op}: group_size {group_size} does not divide the last dim {cols}")
    return group_size, [rows, cols // group_size]


def convert_quantize_per_channel_group(
    ctx: ConversionContext,
    x: Value,
    scales: Value,
    zero_points: Value,
    quant_min: int,
    quant_max: int,
    dtype: torch.dtype,
    group_size: int = 128,
) -> str:
    _qdq_type(ctx, dtype, "quantize_per_channel_group")
    block, qshape = _group(ctx, "quantize_per_channel_group", x, scales, group_size)
    return _quantize(
        ctx,
        x,
        _shaped(ctx, scales, qshape),
        _shaped(ctx, zero_points, qshape),
        quant_min,
        quant_max,
        dtype,
        1,
        block,
        zero_point_first=True,
    )


def convert_dequantize_per_channel_group(
    ctx: ConversionContext,
    x: Value,
    scales: Value,
    zero_points: Value | None,
    quant_min: int,
    quant_max: int,
    dtype: torch.dtype,
    group_size: int = 128,
    output_dtype: torch.dtype = torch.float32,
) -> str:
    _qdq_type(ctx, x.dtype, "dequantize_per_channel_group")
    block, qshape = _group(ctx, "dequantize_per_channel_group", x, scales, group_size)
    if isinstance(zero_points, Value) and zero_points.dtype.is_floating_point:
        raise ctx.error(
            f"dequantize_per_channel_group with {zero_points.dtype} zero_points (a float zero-point "
            "domain) has no DequantizeLinear form"
        )
    return _dequantize(
        ctx,
        x,
        _shaped(ctx, scales, qshape),
        _shaped(ctx, zero_points, qshape),
        x.dtype,
        output_dtype,
        1,
        2,
        block,
        product_dtype=_product_dtype(scales),
    )


# ---- choose_qparams (dynamic quantization) -------------------------------------------------------
# DynamicQuantizeLinear is not used: torch clamps the scale to ``eps`` (a constant input gets scale eps
# and zero point 0 where DynamicQuantizeLinear divides by a zero range), and the per-token and affine
# forms reduce over rows / blocks, which it cannot. The ReduceMin / ReduceMax arithmetic below follows
# torch's definitions op by op, each result rounded to the type torch computes it in.

_F32 = torch.float32


def _rounded_to(ctx: ConversionContext, v: str, dt: torch.dtype) -> str:
    """A float32 result rounded to ``dt`` (kept as float32): torch computes float16 / bfloat16 ops in
    float32 and rounds each result."""
    if dt in (torch.float32, torch.float64):
        return v
    return ctx.op("Cast", ctx.op("Cast", v, to=dtypes.to_onnx_dtype(dt)), to=dtypes.to_onnx_dtype(_F32))


def _c(ctx: ConversionContext, value: float, dt: torch.dtype) -> str:
    """A Python scalar as torch uses it in a ``dt`` op (rounded to ``dt``), as a float32 constant."""
    return ctx.const(float(torch.tensor(value, dtype=dt if dt != torch.float64 else _F32)), _F32)


def _float_input(ctx: ConversionContext, x: Value, op: str) -> torch.dtype:
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ctx.error(f"{op} of a {x.dtype} tensor (torch takes float32, float16 or bfloat16)")
    return x.dtype


def _min_max(ctx: ConversionContext, xf: str, axes: list[int] | None) -> tuple[str, str]:
    """min(amin, 0) and max(amax, 0) (exact in float32 for every input type)."""
    from fastonnx.converters.lib.ops import reduce

    zero = ctx.const(0.0, _F32)
    mn = reduce(ctx, "ReduceMin", xf, axes, axes is not None)
    mx = reduce(ctx, "ReduceMax", xf, axes, axes is not None)
    return ctx.op("Min", mn, zero), ctx.op("Max", mx, zero)


def _asymmetric(
    ctx: ConversionContext, min_neg: str, max_pos: str, qmin: int, qmax: int, eps: str, dt: torch.dtype
) -> tuple[str, str]:
    """scale = max((max_pos - min_neg) / (qmax - qmin), eps); zero point = clamp(qmin - round(min_neg /
    scale), qmin, qmax): torch's per-tensor affine qparams (the scale's own rounding in ``dt``)."""
    span = _rounded_to(ctx, ctx.op("Sub", max_pos, min_neg), dt)
    scale = _rounded_to(ctx, ctx.op("Div", span, ctx.const(float(qmax - qmin), _F32)), dt)
    scale = ctx.op("Max", scale, eps)
    return scale, _zero_from_min(ctx, min_neg, scale, qmin, qmax, dt)


def _zero_from_min(
    ctx: ConversionContext, min_neg: str, scale: str, qmin: int, qmax: int, dt: torch.dtype
) -> str:
    q = _rounded_to(ctx, ctx.op("Round", _rounded_to(ctx, ctx.op("Div", min_neg, scale), dt)), dt)
    zp = _rounded_to(ctx, ctx.op("Sub", ctx.const(float(qmin), _F32), q), dt)
    return ctx.op("Clip", zp, ctx.const(float(qmin), _F32), ctx.const(float(qmax), _F32))


def _choose_per_tensor(
    ctx: ConversionContext, x: Value, qmin: int, qmax: int, eps: float, dtype: torch.dtype, symmetric: bool
) -> list[str]:
    op = "choose_qparams_symmetric" if symmetric else "choose_qparams"
    dt = _float_input(ctx, x, op)
    if any(d == 0 for d in x.shape):  # torch's answer for an empty tensor
        return [ctx.const([1.0], torch.float64), ctx.const([0], torch.int64)]
    min_neg, max_pos = _min_max(ctx, ctx.cast(x, _F32), None)
    # torch.max(scale, Tensor([eps])): a float32 [1] tensor, so float32 from there on
    eps_t = ctx.const(float(torch.tensor(eps, dtype=_F32)), _F32)
    if symmetric:
        top = ctx.op("Max", ctx.op("Neg", min_neg), max_pos)
        scale = ctx.op(
            "Max", _rounded_to(ctx, ctx.op("Div", top, ctx.const((qmax - qmin) / 2, _F32)), dt), eps_t
        )
        zp = ctx.const(128 if dtype == torch.uint8 else 0, torch.int64)
    else:
        span = _rounded_to(ctx, ctx.op("Sub", max_pos, min_neg), dt)
        scale = ctx.op(
            "Max", _rounded_to(ctx, ctx.op("Div", span, ctx.const(float(qmax - qmin), _F32)), dt), eps_t
        )
        # round(min_neg / scale) with the float32 scale, then integers
        zp = ctx.op(
            "Clip",
            ctx.op("Sub", ctx.const(float(qmin), _F32), ctx.op("Round", ctx.op("Div", min_neg, scale))),
            ctx.const(float(qmin), _F32),
            ctx.const(float(qmax), _F32),
        )
        zp = ctx.cast(zp, torch.int64)
    one = ctx.i64([1])
    return [
        ctx.op("Reshape", ctx.cast(scale, torch.float64), one),
        ctx.op("Reshape", zp, one),
    ]


def convert_choose_qparams(
    ctx: ConversionContext, x: Value, quant_min: int, quant_max: int, eps: float, dtype: torch.dtype
) -> list[str]:
    return _choose_per_tensor(ctx, x, quant_min, quant_max, eps, dtype, symmetric=False)


def convert_choose_qparams_symmetric(
    ctx: ConversionContext, x: Value, quant_min: int, quant_max: int, eps: float, dtype: torch.dtype
) -> list[str]:
    return _choose_per_tensor(ctx, x, quant_min, quant_max, eps, dtype, symmetric=True)


def convert_choose_qparams_per_token(ctx: ConversionContext, x: Value, dtype: torch.dtype) -> list[str]:
    """scale = max(amax(|x|, -1), 1e-5) / 127 (symmetric int8), zero point 0; float16 inputs get their
    scale computed in float32 (torch's ``scales.float()``)."""
    dt = _float_input(ctx, x, "choose_qparams_per_token")
    if dtype != torch.int8:
        raise ctx.error(f"choose_qparams_per_token to {dtype}: torch defines it for int8 only")
    from fastonnx.converters.lib.ops import reduce

    top = reduce(ctx, "ReduceMax", ctx.op("Abs", ctx.cast(x, _F32)), [-1], True)
    if dt == torch.float16:
        dt = _F32
    scale = ctx.op("Max", top, _c(ctx, 1e-5, dt))
    scale = _rounded_to(ctx, ctx.op("Div", scale, ctx.const(127.0, _F32)), dt)
    scale_out, zp_out = (v.dtype for v in ctx.out)
    zeros = ctx.op("Expand", ctx.const(0, zp_out), ctx.op("Shape", scale))
    return [ctx.cast(scale, scale_out), zeros]


def convert_choose_qparams_per_token_asymmetric(
    ctx: ConversionContext, x: Value, dtype: torch.dtype
) -> list[str]:
    """XNNPACK's per-token asymmetric int8 qparams, as torch defines them: the scale from the row's
    range (zero included) clamped to float32's eps, the zero point from whichever end has the smaller
    error, rounded and clamped to [-128, 127]."""
    dt = _float_input(ctx, x, "choose_qparams_per_token_asymmetric")
    qmin, qmax = -128, 127
    min_neg, max_pos = _min_max(ctx, ctx.cast(x, _F32), [-1])
    span = _rounded_to(ctx, ctx.op("Sub", max_pos, min_neg), dt)
    scale = _rounded_to(ctx, ctx.op("Div", span, ctx.const(float(qmax - qmin), _F32)), dt)
    scale = ctx.op("Max", scale, _c(ctx, float(torch.finfo(_F32).eps), dt))
    lo = _rounded_to(ctx, ctx.op("Div", min_neg, scale), dt)
    hi = _rounded_to(ctx, ctx.op("Div", max_pos, scale), dt)
    err_min = _rounded_to(ctx, ctx.op("Add", ctx.const(float(qmin), _F32), lo), dt)
    err_max = _rounded_to(ctx, ctx.op("Add", ctx.const(float(qmax), _F32), hi), dt)
    from_min = _rounded_to(ctx, ctx.op("Sub", ctx.const(float(qmin), _F32), lo), dt)
    from_max = _rounded_to(ctx, ctx.op("Sub", ctx.const(float(qmax), _F32), hi), dt)
    above = ctx.op("Greater", _rounded_to(ctx, ctx.op("Add", err_min, err_max), dt), ctx.const(0.0, _F32))
    zp = ctx.op("Where", above, from_min, from_max)
    zp = ctx.op("Round", ctx.op("Clip", zp, ctx.const(float(qmin), _F32), ctx.const(float(qmax), _F32)))
    return [ctx.cast(scale, torch.float64), ctx.cast(zp, torch.int64)]


# ---- torchao's affine ops ------------------------------------------------------------------------

# torchao's integer types and their ranges; sub-byte unsigned ones are held in uint8, the signed
# ones (int1..int7) in int8 (IntxWeightOnlyConfig's qdata: int8 with quant_min / quant_max)
_AFFINE_BOUNDS: dict[torch.dtype, tuple[int, int]] = {
    torch.uint8: (0, 255),
    torch.int8: (-128, 127),
    torch.uint16: (0, 65535),
    torch.int16: (-32768, 32767),
    torch.int32: (-(2**31), 2**31 - 1),
    **{getattr(torch, f"uint{b}"): (0, 2**b - 1) for b in range(1, 8)},
    **{getattr(torch, f"int{b}"): (-(2 ** (b - 1)), 2 ** (b - 1) - 1) for b in range(1, 8)},
}


def _affine_bounds(
    ctx: ConversionContext, op: str, dtype: torch.dtype, arg: str, quant_min: Any, quant_max: Any
) -> tuple[int, int]:
    if dtype not in _AFFINE_BOUNDS:
        raise ctx.error(
            f"torchao.{op} with {arg}={dtype}: only integer types have a QuantizeLinear form here"
        )
    lo, hi = _AFFINE_BOUNDS[dtype]
    return (lo if quant_min is None else int(quant_min)), (hi if quant_max is None else int(quant_max))


def _granularity(
    ctx: ConversionContext, op: str, x: Value, block_size: list[int], shown: list[int] | None = None
) -> tuple[int | None, int | None, list[int]]:
    """torchao's block_size as ONNX sees it: (axis, block, qparam shape) — per tensor (None, None,
    []), per axis (axis, None, [n]) or blocked along one axis, per element along the others (axis,
    block, x's shape with n / block at the axis: opset 21)."""
    named = block_size if shown is None else shown
    shape = x.static_shape()
    if shape is None or len(block_size) != len(shape):
        raise ctx.error(f"torchao.{op}: block_size {named} for a tensor of shape {tuple(x.shape)}")
    whole = [n == 1 or b == n for b, n in zip(block_size, shape)]
    single = [b == 1 and n > 1 for b, n in zip(block_size, shape)]
    if all(whole):
        return None, None, []
    if sum(single) == 1 and all(w or s for w, s in zip(whole, single)):
        axis = single.index(True)
        return axis, None, [shape[axis]]
    blocked = [i for i, (b, n) in enumerate(zip(block_size, shape)) if b > 1 and n > 1]
    if len(blocked) == 1 and all(single[i] or shape[i] == 1 for i in range(len(shape)) if i != blocked[0]):
        axis, b = blocked[0], block_size[blocked[0]]
        if shape[axis] % b:
            raise ctx.error(f"torchao.{op}: block_size {named} does not divide the shape {shape}")
        ctx.require_opset(
            21, f"torchao.{op} with block_size {named} (a blocked QuantizeLinear / DequantizeLinear)"
        )
        return axis, b, [n // b if i == axis else n for i, n in enumerate(shape)]
    raise ctx.error(
        f"torchao.{op}: block_size {named} on shape {shape} has no QuantizeLinear / DequantizeLinear "
        "form (ONNX blocks along one axis, per element along the others)"
    )


def _affine_zero_point(ctx: ConversionContext, op: str, zero_point: Value | None) -> Value | None:
    if zero_point is None or any(d == 0 for d in zero_point.shape):  # torchao: an empty one is none
        return None
    if zero_point.dtype.is_floating_point:
        raise ctx.error(
            f"torchao.{op} with a {zero_point.dtype} zero_point (a float zero-point domain) has no "
            "QuantizeLinear / DequantizeLinear form"
        )
    return zero_point


def convert_quantize_affine(
    ctx: ConversionContext,
    x: Value,
    block_size: list[int],
    scale: Value,
    zero_point: Value | None,
    output_dtype: torch.dtype,
    quant_min: Any = None,
    quant_max: Any = None,
) -> str:
    """clamp(round(x * (1 / scale)) + zero_point, quant_min, quant_max) per block → QuantizeLinear."""
    lo, hi = _affine_bounds(ctx, "quantize_affine", output_dtype, "output_dtype", quant_min, quant_max)
    qdtype = ctx.out_dtype  # uint1..uint7 come out as uint8
    _qdq_type(ctx, qdtype, "torchao.quantize_affine")
    if x.dtype != torch.float32 or scale.dtype != torch.float32:
        raise ctx.error(
            f"torchao.quantize_affine of a {x.dtype} input with a {scale.dtype} scale: torch rounds "
            "x * (1 / scale) in that type, which QuantizeLinear (a float32 division) does not reproduce"
        )
    axis, block, qshape = _granularity(ctx, "quantize_affine", x, list(block_size))
    zp = _affine_zero_point(ctx, "quantize_affine", zero_point)
    return _quantize(
        ctx, x, _shaped(ctx, scale, qshape), _shaped(ctx, zp, qshape), lo, hi, qdtype, axis, block
    )


def convert_dequantize_affine(
    ctx: ConversionContext,
    x: Value,
    block_size: list[int],
    scale: Value,
    zero_point: Value | None,
    input_dtype: torch.dtype,
    quant_min: Any = None,
    quant_max: Any = None,
    output_dtype: torch.dtype = torch.float32,
) -> str:
    """(x - zero_point) * scale per block → DequantizeLinear, the integer tensor read as stored.

    A 2-D weight only Linears read (IntxWeightOnlyConfig) is dequantized transposed, ``[K, N]``, and
    transposed back: the Linear's own Transpose cancels it, leaving ``DequantizeLinear → MatMul``, the
    form onnxruntime fuses into MatMulNBits, instead of a Transpose of the dequantized weight at every
    run. The integers are the model's, transposed at export."""
    _affine_bounds(ctx, "dequantize_affine", input_dtype, "input_dtype", quant_min, quant_max)
    if x.dtype != torch.int32:
        _qdq_type(ctx, x.dtype, "torchao.dequantize_affine")
    zp = _affine_zero_point(ctx, "dequantize_affine", zero_point)
    product = torch.promote_types(scale.dtype, output_dtype)
    w = _weight(ctx, x)
    if w is not None and w.dim() == 2 and _only_linear_weight(ctx):
        wt = Value("", w.dtype, (w.shape[1], w.shape[0]))  # named below, once its type is known
        axis, block, qshape = _granularity(
            ctx, "dequantize_affine", wt, list(block_size)[::-1], list(block_size)
        )
        qs = [_shaped(ctx, v, qshape[::-1]) for v in (scale, zp)]
        if block is not None:  # blocked qparams are 2-D, [N, K / b]: transposed with the weight
            qs = [v.T if isinstance(v, torch.Tensor) else _transposed(ctx, v) for v in qs]
        packed = _as_int4(ctx, w.T, qs[1], quant_min, quant_max, input_dtype)
        if packed is not None:
            y = _dequantize(ctx, packed[0], qs[0], packed[1], x.dtype, output_dtype, axis, 2, block, product)
        else:
            wt.name = ctx.const(w.T, w.dtype, "quantized")
            y = _dequantize(ctx, wt, qs[0], qs[1], x.dtype, output_dtype, axis, 2, block, product)
        return ctx.op("Transpose", y, perm=[1, 0])
    axis, block, qshape = _granularity(ctx, "dequantize_affine", x, list(block_size))
    return _dequantize(
        ctx,
        x,
        _shaped(ctx, scale, qshape),
        _shaped(ctx, zp, qshape),
        x.dtype,
        output_dtype,
        axis,
        x.rank,
        block,
        product_dtype=product,
    )


_INT4 = 22  # ONNX TensorProto.INT4: two values a byte, the first in the low nibble


def _as_int4(
    ctx: ConversionContext, w: torch.Tensor, zp: Any, quant_min: Any, quant_max: Any, input_dtype: torch.dtype
) -> tuple[str, str | None] | None:
    """An int8 weight holding int4 values (torchao's IntxWeightOnlyConfig(torch.int4): ``input_dtype``
    int4, or int8 with ``quant_min`` / ``quant_max`` within [-8, 7]) as an ONNX INT4 constant (opset 21),
    the same values in half the bytes, with its zero points (None when all zero); None otherwise."""
    lo, hi = _AFFINE_BOUNDS.get(input_dtype, (-128, 127))
    lo, hi = (lo if quant_min is None else int(quant_min)), (hi if quant_max is None else int(quant_max))
    if ctx.opset < 21 or w.dtype != torch.int8 or lo < -8 or hi > 7:
        return None
    if zp is not None and not isinstance(zp, torch.Tensor):
        return None  # zero points computed at run time: kept int8 with the weight
    if int(w.min()) < -8 or int(w.max()) > 7:
        return None

    def pack(t: torch.Tensor, hint: str) -> str:
        nibbles = (t.contiguous().reshape(-1).to(torch.int16) & 0x0F).to(torch.uint8)
        if nibbles.numel() % 2:
            nibbles = torch.cat([nibbles, nibbles.new_zeros(1)])
        raw = (nibbles[0::2] | (nibbles[1::2] << 4)).numpy().tobytes()
        return ctx.g.add_constant(raw, _INT4, list(t.shape), hint)

    zero = None
    if zp is not None and bool(zp.any()):
        if int(zp.min()) < -8 or int(zp.max()) > 7:
            return None
        zero = pack(zp.to(torch.int8), "zero_point")
    return pack(w, "quantized"), zero


def _only_linear_weight(ctx: ConversionContext) -> bool:
    """Whether every reader of the node's result is an aten.linear taking it as its weight."""
    node = ctx.node
    assert node is not None
    return bool(node.users) and all(
        str(u.target) == "aten.linear.default"
        and len(u.args) > 1
        and u.args[1] is node
        and u.args[0] is not node
        for u in node.users
    )


def _transposed(ctx: ConversionContext, v: Any) -> Any:
    if not isinstance(v, Value):
        return v
    return Value(ctx.op("Transpose", v, perm=[1, 0]), v.dtype, tuple(reversed(v.shape)))


def convert_choose_qparams_affine(
    ctx: ConversionContext,
    x: Value,
    mapping_type: str,
    block_size: list[int],
    target_dtype: torch.dtype,
    quant_min: Any = None,
    quant_max: Any = None,
    eps: float | None = None,
    scale_dtype: torch.dtype | None = None,
    zero_point_dtype: torch.dtype | None = None,
    keepdim: bool = False,
) -> list[str]:
    """torchao's qparams per block: min / max over each block (zero included), then its symmetric,
    symmetric-without-clipping or asymmetric formula in the input's type."""
    op = "choose_qparams_affine"
    if mapping_type not in ("SYMMETRIC", "SYMMETRIC_NO_CLIPPING_ERR", "ASYMMETRIC"):
        raise ctx.error(f"torchao.{op} with mapping_type={mapping_type!r}: not one torchao defines")
    qmin, qmax = _affine_bounds(ctx, op, target_dtype, "target_dtype", quant_min, quant_max)
    dt = _float_input(ctx, x, f"torchao.{op}")
    shape = x.static_shape()
    if shape is None or len(block_size) != len(shape):
        raise ctx.error(f"torchao.{op}: block_size {list(block_size)} for a tensor of shape {tuple(x.shape)}")
    # torchao's reduction: a blocked dim splits into (n / b, b), the b part (or a whole dim) reduced
    split: list[int] = []
    axes: list[int] = []
    for b, n in zip(block_size, shape):
        if b != n and b > 1:
            if n % b:
                raise ctx.error(
                    f"torchao.{op}: block_size {list(block_size)} does not divide the shape {shape}"
                )
            split += [n // b, b]
            axes.append(len(split) - 1)
        else:
            split.append(n)
            if b != 1:
                axes.append(len(split) - 1)
    xf = ctx.op("Reshape", ctx.cast(x, _F32), ctx.i64(split))
    min_neg, max_pos = _min_max(ctx, xf, axes or None) if axes else _min_max_elementwise(ctx, xf)
    eps_c = _c(ctx, float(torch.finfo(dt).smallest_normal) if eps is None else float(eps), dt)
    if mapping_type == "ASYMMETRIC":
        scale, zp = _asymmetric(ctx, min_neg, max_pos, qmin, qmax, eps_c, dt)
    else:
        if mapping_type == "SYMMETRIC":
            top = ctx.op("Max", ctx.op("Neg", min_neg), max_pos)
            scale = _rounded_to(ctx, ctx.op("Div", top, ctx.const((qmax - qmin) / 2, _F32)), dt)
        else:
            smin = _rounded_to(ctx, ctx.op("Div", min_neg, ctx.const(float(qmin), _F32)), dt)
            smax = _rounded_to(ctx, ctx.op("Div", max_pos, ctx.const(float(qmax), _F32)), dt)
            scale = ctx.op("Where", ctx.op("Greater", smin, smax), smin, smax)
        zp = ctx.op("Expand", ctx.const(float(int((qmax + qmin + 1) / 2)), _F32), ctx.op("Shape", scale))
        scale = ctx.op("Max", scale, eps_c)
    out_scale, out_zp = ctx.out
    return [
        ctx.op("Reshape", ctx.cast(scale, out_scale.dtype), ctx.i64(list(out_scale.shape))),
        ctx.op("Reshape", ctx.cast(zp, out_zp.dtype), ctx.i64(list(out_zp.shape))),
    ]


def _min_max_elementwise(ctx: ConversionContext, xf: str) -> tuple[str, str]:
    """min(x, 0), max(x, 0) when no dim is reduced (block_size all ones)."""
    zero = ctx.const(0.0, _F32)
    return ctx.op("Min", xf, zero), ctx.op("Max", xf, zero)


# ---- integer products ----------------------------------------------------------------------------


def convert_int_mm(ctx: ConversionContext, a: Value, b: Value) -> str:
    """int8 x int8 → int32 matrix product (torchao's dynamic int8 activation x int8 weight Linears):
    MatMulInteger, exact as torch's (int32 accumulation). On CPUs with VNNI torchao quantizes the
    activation to uint8 (with a zero point) and torch's CPU kernel takes uint8 x int8. onnxruntime's
    uint8 x int8 kernel on AVX2 without VNNI sums pairs of products in int16 and saturates (255 x 127 x 2
    > 32767: off by up to 1e6 on such a CPU), so that product runs as uint8 x uint8 instead: the int8
    operand shifted by 128 into uint8 with a zero point of 128 (folded at load for a weight), exact on
    every CPU."""
    if a.dtype not in (torch.int8, torch.uint8) or b.dtype != torch.int8:
        raise ctx.error(f"_int_mm of {a.dtype} x {b.dtype}: torch defines it for int8 or uint8 x int8")
    if a.dtype == torch.int8:
        return ctx.op("MatMulInteger", a, b)
    shifted = ctx.op("Add", ctx.cast(b, torch.int16), ctx.const(128, torch.int16))
    return ctx.op(
        "MatMulInteger",
        a,
        ctx.cast(shifted, torch.uint8),
        ctx.const(0, torch.uint8),
        ctx.const(128, torch.uint8),
    )


# ---- tensor subclasses (torchao's quantized weights) ----------------------------------------------


def convert_access_subclass_inner_tensor(ctx: ConversionContext, weight: Any, attr: str) -> Any:
    """An inner tensor of a tensor-subclass weight (torchao's Int8Tensor, IntxUnpackedToInt8Tensor...):
    the walker made each one an initializer as stored (walker/interpreter.py)."""
    if not isinstance(weight, dict) or attr not in weight:
        raise ctx.error(
            f"access_subclass_inner_tensor of {attr!r}: not an inner tensor of a weight's subclass"
        )
    inner = weight[attr]
    return inner if isinstance(inner, dict) else inner.name


# ---- fake quantization (QAT) -----------------------------------------------------------------------


def _fitting_type(ctx: ConversionContext, quant_min: int, quant_max: int) -> torch.dtype | None:
    """The narrowest QDQ type holding [quant_min, quant_max] at the model's opset, or None."""
    for t, (lo, hi, opset) in _QDQ_TYPES.items():
        if lo <= quant_min and quant_max <= hi and ctx.opset >= opset:
            return t
    return None


def _along(ctx: ConversionContext, v: str, axis: int | None, rank: int) -> str:
    """A per-channel 1-D value shaped to broadcast along ``axis`` of a rank-``rank`` tensor."""
    if axis is None:
        return v
    shape = [1] * rank
    shape[axis] = -1
    return ctx.op("Reshape", v, ctx.i64(shape))


def _rounded(ctx: ConversionContext, x: str, scale: str, zero_point: str, axis: int | None, rank: int) -> str:
    """round(x / scale + zero_point) in float32: the unclamped quantized value."""
    s = _along(ctx, scale, axis, rank)
    z = _along(ctx, zero_point, axis, rank)
    return ctx.op("Round", ctx.op("Add", ctx.op("Div", x, s), z))


def _fake_quantize(
    ctx: ConversionContext,
    x: Value,
    scale: Any,
    zero_point: Any,
    quant_min: int,
    quant_max: int,
    axis: int | None,
    with_mask: bool,
) -> tuple[str, str | None]:
    if not x.dtype.is_floating_point:
        raise ctx.error(f"fake quantization of a {x.dtype} tensor")
    if axis is not None:
        axis %= max(x.rank, 1)
    per_tensor = axis is None
    xf = ctx.cast(x, torch.float32)
    float_zp = isinstance(zero_point, Value) and zero_point.dtype.is_floating_point
    qdtype = None if float_zp else _fitting_type(ctx, quant_min, quant_max)
    mask = None
    if with_mask or qdtype is None:
        s = _scale(ctx, scale, per_tensor)
        z = (
            ctx.cast(zero_point, torch.float32)
            if isinstance(zero_point, Value)
            else ctx.const(float(zero_point), torch.float32)
        )
        if per_tensor and isinstance(zero_point, Value) and zero_point.rank != 0:
            z = ctx.op("Reshape", z, ctx.i64([]))
        r = _rounded(ctx, xf, s, z, axis, x.rank)
        lo, hi = ctx.const(float(quant_min), torch.float32), ctx.const(float(quant_max), torch.float32)
        if with_mask:
            mask = ctx.op("And", ctx.op("GreaterOrEqual", r, lo), ctx.op("LessOrEqual", r, hi))
        if qdtype is None:
            # no QDQ type holds the range (or the zero point is a float): the same arithmetic in float
            q = ctx.op("Min", ctx.op("Max", r, lo), hi)
            sa, za = _along(ctx, s, axis, x.rank), _along(ctx, z, axis, x.rank)
            return ctx.cast(ctx.op("Mul", ctx.op("Sub", q, za), sa), x.dtype), mask
    assert qdtype is not None
    q = _quantize(ctx, x, scale, zero_point, quant_min, quant_max, qdtype, axis)
    return _dequantize(ctx, q, scale, zero_point, qdtype, x.dtype, axis, x.rank), mask


def _mask_read(ctx: ConversionContext) -> bool:
    assert ctx.node is not None
    return any(u.args[1] == 1 and u.users for u in ctx.node.users if len(u.args) > 1)


def convert_fake_quantize_per_tensor_affine(
    ctx: ConversionContext, x: Value, scale: Any, zero_point: Any, quant_min: int, quant_max: int
) -> str:
    return _fake_quantize(ctx, x, scale, zero_point, quant_min, quant_max, None, False)[0]


def convert_fake_quantize_per_tensor_affine_cachemask(
    ctx: ConversionContext, x: Value, scale: Any, zero_point: Any, quant_min: int, quant_max: int
) -> list[str | None]:
    out, mask = _fake_quantize(ctx, x, scale, zero_point, quant_min, quant_max, None, _mask_read(ctx))
    return [out, mask]


def convert_fake_quantize_per_tensor_cachemask_tensor_qparams(
    ctx: ConversionContext,
    x: Value,
    scale: Value,
    zero_point: Value,
    fake_quant_enabled: Value,
    quant_min: int,
    quant_max: int,
) -> list[str | None]:
    """torch.ao's FakeQuantize: fake quantization where ``fake_quant_enabled[0]`` is set, ``x`` (and an
    all-true mask) otherwise."""
    with_mask = _mask_read(ctx)
    out, mask = _fake_quantize(ctx, x, scale, zero_point, quant_min, quant_max, None, with_mask)
    on = ctx.op(
        "Reshape",
        ctx.op("Not", ctx.op("Equal", ctx.cast(fake_quant_enabled, torch.int64), ctx.i64(0))),
        ctx.i64([]),
    )
    out = ctx.op("Where", on, out, x)
    if mask is not None:
        mask = ctx.op("Or", mask, ctx.op("Not", on))
    return [out, mask]


def convert_fake_quantize_per_channel_affine(
    ctx: ConversionContext,
    x: Value,
    scale: Value,
    zero_point: Value,
    axis: int,
    quant_min: int,
    quant_max: int,
) -> str:
    return _fake_quantize(ctx, x, scale, zero_point, quant_min, quant_max, axis, False)[0]


def convert_fake_quantize_per_channel_affine_cachemask(
    ctx: ConversionContext,
    x: Value,
    scale: Value,
    zero_point: Value,
    axis: int,
    quant_min: int,
    quant_max: int,
) -> list[str | None]:
    out, mask = _fake_quantize(ctx, x, scale, zero_point, quant_min, quant_max, axis, _mask_read(ctx))
    return [out, mask]


def convert_fused_moving_avg_obs_fq(
    ctx: ConversionContext,
    x: Value,
    observer_on: Value,
    fake_quant_on: Value,
    running_min: Value,
    running_max: Value,
    scale: Value,
    zero_point: Value,
    averaging_const: float,
    quant_min: int,
    quant_max: int,
    ch_axis: int,
    per_row_fake_quant: bool = False,
    symmetric_quant: bool = False,
) -> list[str | None]:
    """torch.ao / torchao's FakeQuantize (QAT, ``fused_moving_avg_obs_fake_quant``) with its observer
    off, as after torchao's ``move_exported_model_to_eval``: fake quantization with the scale and zero
    point observed in training (their buffers come out unchanged). An observer still on would update
    them at every run: refused."""
    on = _weight(ctx, observer_on)
    if on is None or bool(on.any()):
        raise ctx.error(
            "fused_moving_avg_obs_fake_quant with its observer on (a QAT model in training mode) would "
            "update its scale and zero point at every run; export the model in eval mode (torchao's "
            "move_exported_model_to_eval, or disable_observer) or after convert_pt2e"
        )
    axis = ch_axis if per_row_fake_quant else None
    enabled = _weight(ctx, fake_quant_on)
    with_mask = _mask_read(ctx)
    unchanged = [ctx.op("Identity", v) for v in (running_min, running_max, scale, zero_point)]
    if enabled is not None and not bool(enabled.any()):
        ones = ctx.op("ConstantOfShape", ctx.dims_of(x), value=ctx.tensor_attr(True, torch.bool))
        return [ctx.op("Identity", x), ones if with_mask else None, *unchanged]
    out, mask = _fake_quantize(ctx, x, scale, zero_point, quant_min, quant_max, axis, with_mask)
    if enabled is None:  # read at run time
        on_now = ctx.op(
            "Reshape",
            ctx.op("Not", ctx.op("Equal", ctx.cast(fake_quant_on, torch.int64), ctx.i64(0))),
            ctx.i64([]),
        )
        out = ctx.op("Where", on_now, out, x)
        if mask is not None:
            mask = ctx.op("Or", mask, ctx.op("Not", on_now))
    return [out, mask, *unchanged]


CONVERTERS: dict[str, Converter] = {
    "quantized_decomposed.quantize_per_tensor.default": convert_quantize_per_tensor,
    "quantized_decomposed.quantize_per_tensor.tensor": convert_quantize_per_tensor,
    "quantized_decomposed.quantize_per_tensor.tensor2": convert_quantize_per_tensor,
    "quantized_decomposed.dequantize_per_tensor.default": convert_dequantize_per_tensor,
    "quantized_decomposed.dequantize_per_tensor.tensor": convert_dequantize_per_tensor,
    "quantized_decomposed.dequantize_per_tensor.tensor2": convert_dequantize_per_tensor,
    "quantized_decomposed.quantize_per_channel.default": convert_quantize_per_channel,
    "quantized_decomposed.dequantize_per_channel.default": convert_dequantize_per_channel,
    "quantized_decomposed.quantize_per_token.default": convert_quantize_per_token,
    "quantized_decomposed.dequantize_per_token.default": convert_dequantize_per_token,
    "quantized_decomposed.quantize_per_channel_group.default": convert_quantize_per_channel_group,
    "quantized_decomposed.dequantize_per_channel_group.default": convert_dequantize_per_channel_group,
    "quantized_decomposed.choose_qparams.tensor": convert_choose_qparams,
    "quantized_decomposed.choose_qparams_symmetric.tensor": convert_choose_qparams_symmetric,
    "quantized_decomposed.choose_qparams_per_token.default": convert_choose_qparams_per_token,
    "quantized_decomposed.choose_qparams_per_token_asymmetric.default": (
        convert_choose_qparams_per_token_asymmetric
    ),
    "quantized_decomposed._choose_qparams_per_token_asymmetric_impl.default": (
        convert_choose_qparams_per_token_asymmetric
    ),
    "export.access_subclass_inner_tensor.default": convert_access_subclass_inner_tensor,
    "aten._int_mm.default": convert_int_mm,
    "torchao.quantize_affine.default": convert_quantize_affine,
    "torchao.dequantize_affine.default": convert_dequantize_affine,
    "torchao.choose_qparams_affine.default": convert_choose_qparams_affine,
    "aten.fake_quantize_per_tensor_affine.default": convert_fake_quantize_per_tensor_affine,
    "aten.fake_quantize_per_tensor_affine.tensor_qparams": convert_fake_quantize_per_tensor_affine,
    "aten.fake_quantize_per_tensor_affine_cachemask.default": convert_fake_quantize_per_tensor_affine_cachemask,
    "aten._fake_quantize_per_tensor_affine_cachemask_tensor_qparams.default": (
        convert_fake_quantize_per_tensor_cachemask_tensor_qparams
    ),
    "aten.fake_quantize_per_channel_affine.default": convert_fake_quantize_per_channel_affine,
    "aten._fused_moving_avg_obs_fq_helper_functional.default": convert_fused_moving_avg_obs_fq,
    "aten.fake_quantize_per_channel_affine_cachemask.default": convert_fake_quantize_per_channel_affine_cachemask,
}
