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


def _stored(ctx: ConversionContext, v: Value, dtype: torch.dtype, per_tensor: bool) -> str:
    """``v`` as ``dtype`` (0-d per tensor: a 1-D one would mean per axis); a weight (PT2E's scales and
    zero points are buffers) becomes a constant of that type at export instead of a Cast and Reshape
    at every run (constant folding keeps no int8 values)."""
    t = _weight(ctx, v)
    if t is not None and t.numel() <= 1 << 16:
        return ctx.const(t.reshape(()) if per_tensor else t, dtype)
    out = ctx.cast(v, dtype)
    return ctx.op("Reshape", out, ctx.i64([])) if per_tensor and v.rank != 0 else out


def _scale(ctx: ConversionContext, scale: Any, per_tensor: bool) -> str:
    """The scale as float32: a 0-d value per tensor, 1-D per channel."""
    if isinstance(scale, Value):
        return _stored(ctx, scale, torch.float32, per_tensor)
    return ctx.const(float(scale), torch.float32)


def _zero_point(ctx: ConversionContext, zero_point: Any, qdtype: torch.dtype, per_tensor: bool) -> str | None:
    if zero_point is None:
        return None
    if isinstance(zero_point, Value):
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
) -> str:
    """round(x / scale) + zero_point clamped to [quant_min, quant_max], as ``qdtype``."""
    per_tensor = axis is None
    if axis is not None:
        axis %= max(x.rank, 1)
    pre = _prequantized(ctx, x, scale, zero_point, quant_min, quant_max, qdtype, axis)
    if pre is not None:
        return pre
    xf = ctx.cast(x, torch.float32)
    s = _scale(ctx, scale, per_tensor)
    z = _zero_point(ctx, zero_point, qdtype, per_tensor)
    narrowed = _narrowed(qdtype, quant_min, quant_max)
    if narrowed and qdtype not in (torch.int8, torch.uint8):
        # onnxruntime has no 16-bit Clip: clamp the float to (bound - zero_point) * scale instead, which
        # QuantizeLinear maps back onto the bound exactly (the quotient is within a few ulps of an integer)
        zf = ctx.const(0.0, torch.float32) if z is None else ctx.cast(z, torch.float32)
        lo, hi = (
            ctx.op("Mul", ctx.op("Sub", _bound(ctx, b, torch.float32), zf), s) for b in (quant_min, quant_max)
        )
        xf = ctx.op("Min", ctx.op("Max", xf, _along(ctx, lo, axis, x.rank)), _along(ctx, hi, axis, x.rank))
        narrowed = False
    q = ctx.op("QuantizeLinear", xf, s, z, axis=axis)
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
) -> str | None:
    """A weight quantized at export (QAT's fake-quantized weights): the integer tensor as a constant, so
    that the file stores it as ``qdtype`` and reads it through DequantizeLinear; None when any operand
    is computed at run time. torch's arithmetic: round(x * (1 / scale)) + zero_point, clamped."""
    w = _weight(ctx, x)
    qparams = [_weight(ctx, v) if isinstance(v, Value) else v for v in (scale, zero_point)]
    if (
        w is None
        or not w.dtype.is_floating_point
        or any(isinstance(v, Value) for v in (quant_min, quant_max))
    ):
        return None
    if any(p is None for p, v in zip(qparams, (scale, zero_point)) if v is not None):
        return None
    s, z = qparams
    shape = [1] * w.dim()
    if axis is not None:
        shape[axis] = -1
    if s is None:
        return None
    s = s.reshape(shape) if isinstance(s, torch.Tensor) else float(s)
    z = 0 if z is None else (z.reshape(shape) if isinstance(z, torch.Tensor) else z)
    with torch.no_grad():
        q = torch.clamp(torch.round(w.float() * (1.0 / s)) + z, int(quant_min), int(quant_max))
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
) -> str:
    per_tensor = axis is None
    y = ctx.op(
        "DequantizeLinear",
        x,
        _scale(ctx, scale, per_tensor),
        _zero_point(ctx, zero_point, qdtype, per_tensor),
        axis=None if axis is None else axis % max(rank, 1),
    )
    # DequantizeLinear gives float32 (the scale's type)
    if out_dtype is None or out_dtype == torch.float32:
        return y
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
