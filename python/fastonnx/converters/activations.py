"""Activation functions and softmax (dropout, random in training mode, lives in py).

float16 / bfloat16 inputs are computed in float32 and rounded once at the end: torch's CPU kernels do
the same (opmath), and onnxruntime lacks most half-precision kernels for these ops anyway.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from fastonnx.context import ConversionContext, Converter, Value
from fastonnx.converters.lib.kernels import opmath_dtype
from fastonnx.converters.lib.ops import normalize_axis, reduce, unsqueeze
from fastonnx.converters.lib.random import reject_generator, rrelu_slopes

aten = torch.ops.aten

Body = Callable[[ConversionContext, str, torch.dtype], str]


def _float_op(ctx: ConversionContext, x: Value, body: Body) -> str:
    """Run ``body(ctx, x_in_compute_dtype, compute_dtype)`` and cast back to the output dtype."""
    out = ctx.out_dtype
    compute = opmath_dtype(out)
    y = body(ctx, ctx.cast(x, compute), compute)
    return ctx.cast(y, out)


def _is_float(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point


# ---- relu family ------------------------------------------------------------------------------
def convert_relu(ctx: ConversionContext, x: Value) -> str:
    if not _is_float(x.dtype):
        # onnxruntime's Relu has float kernels only
        return ctx.op("Max", x, ctx.const(0, x.dtype))
    return _float_op(ctx, x, lambda c, v, dt: c.op("Relu", v))


def _clamp(ctx: ConversionContext, x: Value, lo: float, hi: float) -> str:
    if not _is_float(x.dtype):
        return ctx.op("Min", ctx.op("Max", x, ctx.const(lo, x.dtype)), ctx.const(hi, x.dtype))
    return _float_op(ctx, x, lambda c, v, dt: c.op("Clip", v, c.const(lo, dt), c.const(hi, dt)))


def convert_relu6(ctx: ConversionContext, x: Value) -> str:
    return _clamp(ctx, x, 0, 6)


def convert_hardtanh(ctx: ConversionContext, x: Value, min_val: float = -1, max_val: float = 1) -> str:
    if min_val > max_val:
        raise ctx.error(f"hardtanh: min_val ({min_val}) must not exceed max_val ({max_val})")
    return _clamp(ctx, x, min_val, max_val)


def convert_hardswish(ctx: ConversionContext, x: Value) -> str:
    return _float_op(ctx, x, lambda c, v, dt: c.op("HardSwish", v))


def convert_hardsigmoid(ctx: ConversionContext, x: Value) -> str:
    return _float_op(ctx, x, lambda c, v, dt: c.op("HardSigmoid", v, alpha=1.0 / 6.0, beta=0.5))


def convert_elu(
    ctx: ConversionContext, x: Value, alpha: float = 1, scale: float = 1, input_scale: float = 1
) -> str:
    def body(c: ConversionContext, v: str, dt: torch.dtype) -> str:
        if scale == 1 and input_scale == 1:
            return c.op("Elu", v, alpha=float(alpha))
        # torch: x > 0 ? scale * x : scale * alpha * (exp(x * input_scale) - 1)
        pos = c.op("Mul", v, c.const(scale, dt))
        e = c.op("Exp", c.op("Mul", v, c.const(input_scale, dt)))
        neg = c.op("Mul", c.op("Sub", e, c.const(1, dt)), c.const(scale * alpha, dt))
        return c.op("Where", c.op("Greater", v, c.const(0, dt)), pos, neg)

    return _float_op(ctx, x, body)


def convert_selu(ctx: ConversionContext, x: Value) -> str:
    return _float_op(ctx, x, lambda c, v, dt: c.op("Selu", v))


def convert_celu(ctx: ConversionContext, x: Value, alpha: float = 1.0) -> str:
    if alpha == 0:
        raise ctx.error("celu: alpha must not be 0 (torch divides by it)")
    return _float_op(ctx, x, lambda c, v, dt: c.op("Celu", v, alpha=float(alpha)))


def convert_leaky_relu(ctx: ConversionContext, x: Value, negative_slope: float = 0.01) -> str:
    return _float_op(ctx, x, lambda c, v, dt: c.op("LeakyRelu", v, alpha=float(negative_slope)))


def convert_rrelu(
    ctx: ConversionContext,
    x: Value,
    lower: float = 0.125,
    upper: float = 1.0 / 3.0,
    training: bool = False,
    generator: Any = None,
) -> str:
    if lower > upper:
        raise ctx.error(f"rrelu: lower ({lower}) must not exceed upper ({upper})")
    if not training or lower == upper:
        return convert_leaky_relu(ctx, x, (lower + upper) / 2)
    reject_generator(ctx, generator)

    def body(c: ConversionContext, v: str, dt: torch.dtype) -> str:
        # training: a slope drawn per element, uniform in [lower, upper]; torch's test is x <= 0
        slopes = rrelu_slopes(c, x, float(lower), float(upper), dt)
        return c.op("Where", c.op("LessOrEqual", v, c.const(0, dt)), c.op("Mul", v, slopes), v)

    return _float_op(ctx, x, body)


def convert_prelu(ctx: ConversionContext, x: Value, weight: Value) -> str:
    def body(c: ConversionContext, v: str, dt: torch.dtype) -> str:
        w = c.cast(weight, dt)
        if weight.rank == 1 and x.rank >= 2:
            # torch applies one slope per channel (dim 1); ONNX broadcasts from the right
            w = unsqueeze(c, w, list(range(1, x.rank - 1)))
        elif weight.rank == 1 and x.rank == 0:
            w = c.op("Squeeze", w, c.i64([0]))  # a 0-d input keeps its rank
        return c.op("PRelu", v, w)

    if weight.rank > 1 and x.rank >= 2:
        raise ctx.error(f"prelu: weight of rank {weight.rank} is not supported (torch expects 0-d or 1-D)")
    return _float_op(ctx, x, body)


def convert_prelu_kernel(ctx: ConversionContext, x: Value, weight: Value) -> str:
    # the kernel behind prelu: the weight is already shaped to broadcast (numpy rules)
    return _float_op(ctx, x, lambda c, v, dt: c.op("PRelu", v, c.cast(weight, dt)))


def convert_softplus(ctx: ConversionContext, x: Value, beta: float = 1, threshold: float = 20) -> str:
    def body(c: ConversionContext, v: str, dt: torch.dtype) -> str:
        # torch: x * beta > threshold ? x : log1p(exp(x * beta)) / beta
        bx = v if beta == 1 else c.op("Mul", v, c.const(beta, dt))
        soft = c.op("Softplus", bx)
        if beta != 1:
            soft = c.op("Div", soft, c.const(beta, dt))
        return c.op("Where", c.op("Greater", bx, c.const(threshold, dt)), v, soft)

    return _float_op(ctx, x, body)


def convert_mish(ctx: ConversionContext, x: Value) -> str:
    # x * tanh(softplus(x)), the same expression at every opset (Mish itself needs opset 18)
    return _float_op(ctx, x, lambda c, v, dt: c.op("Mul", v, c.op("Tanh", c.op("Softplus", v))))


def _log_sigmoid(c: ConversionContext, v: str, dt: torch.dtype) -> str:
    # stable form: min(x, 0) - log1p(exp(-|x|))
    e = c.op("Exp", c.op("Neg", c.op("Abs", v)))
    return c.op("Sub", c.op("Min", v, c.const(0, dt)), c.op("Log", c.op("Add", e, c.const(1, dt))))


def convert_log_sigmoid(ctx: ConversionContext, x: Value) -> str:
    return _float_op(ctx, x, _log_sigmoid)


def convert_log_sigmoid_forward(ctx: ConversionContext, x: Value) -> list[str]:
    out = _float_op(ctx, x, _log_sigmoid)
    # torch's CPU buffer (kept for the backward pass) is exp(-|x|)
    compute = opmath_dtype(x.dtype)
    buffer = ctx.op("Exp", ctx.op("Neg", ctx.op("Abs", ctx.cast(x, compute))))
    return [out, ctx.cast(buffer, x.dtype)]


def convert_glu(ctx: ConversionContext, x: Value, dim: int = -1) -> str:
    axis = normalize_axis(dim, x.rank)
    size = x.shape[axis]
    if isinstance(size, int) and size % 2:
        raise ctx.error(f"glu: dim {dim} has odd size {size}; torch requires it to be even")

    def body(c: ConversionContext, v: str, dt: torch.dtype) -> str:
        if c.opset >= 18:
            a, b = c.op("Split", v, axis=axis, num_outputs=2, outputs=2)
        else:
            a, b = c.op("Split", v, axis=axis, outputs=2)  # no sizes: equal halves
        return c.op("Mul", a, c.op("Sigmoid", b))

    return _float_op(ctx, x, body)


def convert_threshold(ctx: ConversionContext, x: Value, threshold: float, value: float) -> str:
    dt = ctx.out_dtype
    v = ctx.cast(x, dt)
    # for integer inputs torch converts threshold and value to the input's dtype first, as ctx.const does
    # torch: x <= threshold ? value : x (NaN stays NaN)
    return ctx.op("Where", ctx.op("LessOrEqual", v, ctx.const(threshold, dt)), ctx.const(value, dt), v)


def convert_hardshrink(ctx: ConversionContext, x: Value, lambd: float = 0.5) -> str:
    def body(c: ConversionContext, v: str, dt: torch.dtype) -> str:
        # torch: -lambd <= x <= lambd ? 0 : x (NaN stays NaN)
        inside = c.op(
            "And",
            c.op("GreaterOrEqual", v, c.const(-lambd, dt)),
            c.op("LessOrEqual", v, c.const(lambd, dt)),
        )
        return c.op("Where", inside, c.const(0, dt), v)

    return _float_op(ctx, x, body)


def convert_softshrink(ctx: ConversionContext, x: Value, lambd: float = 0.5) -> str:
    if lambd < 0:
        raise ctx.error(f"softshrink: lambd must be >= 0, got {lambd}")

    def body(c: ConversionContext, v: str, dt: torch.dtype) -> str:
        # torch: x > l ? x - l : (x < -l ? x + l : 0); NaN stays NaN
        lo = c.op("Where", c.op("Less", v, c.const(-lambd, dt)), c.op("Add", v, c.const(lambd, dt)), v)
        mid = c.op(
            "Where",
            c.op(
                "And",
                c.op("GreaterOrEqual", v, c.const(-lambd, dt)),
                c.op("LessOrEqual", v, c.const(lambd, dt)),
            ),
            c.const(0, dt),
            lo,
        )
        return c.op("Where", c.op("Greater", v, c.const(lambd, dt)), c.op("Sub", v, c.const(lambd, dt)), mid)

    return _float_op(ctx, x, body)


# ---- gelu / silu --------------------------------------------------------------------------------
def convert_gelu(ctx: ConversionContext, x: Value, *, approximate: str = "none") -> str:
    if approximate not in ("none", "tanh"):
        raise ctx.error(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")

    def body(c: ConversionContext, v: str, dt: torch.dtype) -> str:
        if c.opset >= 20:
            return c.op("Gelu", v, approximate=approximate)
        if approximate == "none":
            # 0.5 * x * (1 + erf(x / sqrt(2)))
            inner = c.op("Erf", c.op("Mul", v, c.const(1 / math.sqrt(2), dt)))
        else:
            # 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))
            cube = c.op("Mul", c.op("Mul", v, v), v)
            poly = c.op("Add", v, c.op("Mul", cube, c.const(0.044715, dt)))
            inner = c.op("Tanh", c.op("Mul", poly, c.const(math.sqrt(2 / math.pi), dt)))
        half_x = c.op("Mul", v, c.const(0.5, dt))
        return c.op("Mul", half_x, c.op("Add", inner, c.const(1, dt)))

    return _float_op(ctx, x, body)


def convert_silu(ctx: ConversionContext, x: Value) -> str:
    return _float_op(ctx, x, lambda c, v, dt: c.op("Mul", v, c.op("Sigmoid", v)))


# ---- softmax ------------------------------------------------------------------------------------
def _softmax(ctx: ConversionContext, op_type: str, x: Value, dim: int) -> str:
    out = ctx.out_dtype
    compute = opmath_dtype(out)
    v = ctx.cast(ctx.cast(x, out), compute)  # dtype= casts the input first, as torch does
    if x.rank == 0:
        # ONNX Softmax needs an axis; a 0-d tensor is one element on its own
        y = ctx.op(op_type, unsqueeze(ctx, v, [0]), axis=0)
        y = ctx.op("Squeeze", y, ctx.i64([0]))
    else:
        y = ctx.op(op_type, v, axis=normalize_axis(dim, x.rank))
    return ctx.cast(y, out)


def convert_softmax(ctx: ConversionContext, x: Value, dim: int, dtype: torch.dtype | None = None) -> str:
    return _softmax(ctx, "Softmax", x, dim)


def convert_log_softmax(ctx: ConversionContext, x: Value, dim: int, dtype: torch.dtype | None = None) -> str:
    return _softmax(ctx, "LogSoftmax", x, dim)


def convert__softmax(ctx: ConversionContext, x: Value, dim: int, half_to_float: bool) -> str:
    # half_to_float shows in the output dtype torch recorded (float32 for a half input)
    return _softmax(ctx, "Softmax", x, dim)


def convert__log_softmax(ctx: ConversionContext, x: Value, dim: int, half_to_float: bool) -> str:
    return _softmax(ctx, "LogSoftmax", x, dim)


def convert_safe_softmax(ctx: ConversionContext, x: Value, dim: int, dtype: torch.dtype | None = None) -> str:
    """Softmax that gives 0 (not NaN) on slices that are entirely -inf (fully masked attention rows)."""
    y = _softmax(ctx, "Softmax", x, dim)
    out = ctx.out_dtype
    v = ctx.cast(ctx.cast(x, out), opmath_dtype(out))
    finite = ctx.cast(
        ctx.op("Not", ctx.op("Equal", v, ctx.const(float("-inf"), opmath_dtype(out)))), torch.int64
    )
    if x.rank == 0:
        live = finite
    else:
        live = reduce(ctx, "ReduceSum", finite, [normalize_axis(dim, x.rank)], True)
    masked = ctx.op("Equal", live, ctx.const(0, torch.int64))
    return ctx.op("Where", masked, ctx.const(0, out), y)


CONVERTERS: dict[str, Converter] = {
    "aten.relu.default": convert_relu,
    "aten.relu6.default": convert_relu6,
    "aten.hardtanh.default": convert_hardtanh,
    "aten.hardswish.default": convert_hardswish,
    "aten.hardsigmoid.default": convert_hardsigmoid,
    "aten.elu.default": convert_elu,
    "aten.selu.default": convert_selu,
    "aten.celu.default": convert_celu,
    "aten.leaky_relu.default": convert_leaky_relu,
    "aten.rrelu.default": convert_rrelu,
    "aten.prelu.default": convert_prelu,
    "aten._prelu_kernel.default": convert_prelu_kernel,
    "aten.softplus.default": convert_softplus,
    "aten.mish.default": convert_mish,
    "aten.log_sigmoid.default": convert_log_sigmoid,
    "aten.log_sigmoid_forward.default": convert_log_sigmoid_forward,
    "aten.glu.default": convert_glu,
    "aten.threshold.default": convert_threshold,
    "aten.hardshrink.default": convert_hardshrink,
    "aten.softshrink.default": convert_softshrink,
    "aten.gelu.default": convert_gelu,
    "aten.silu.default": convert_silu,
    "aten.softmax.int": convert_softmax,
    "aten.log_softmax.int": convert_log_softmax,
    "aten._softmax.default": convert__softmax,
    "aten._log_softmax.default": convert__log_softmax,
    "aten._safe_softmax.default": convert_safe_softmax,
}
