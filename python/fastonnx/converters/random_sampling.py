"""Random ops and training-mode dropout, exported as ONNX random operators.

The values cannot match torch's generator: they follow the same distribution. Draws are computed in
float32 (float64 for float64 results) and cast; half-precision uniforms get torch's resolution (as many
random bits as the type has digits), so that casting never rounds up to 1.

Sources of randomness, by opset:
- below 22: RandomUniform / RandomNormal (static shapes) or their *Like forms (symbolic shapes);
- from 22: onnxruntime 1.31 has no kernel for the opset-22 versions of RandomUniform, RandomNormal,
  their *Like forms, Bernoulli and Multinomial, but it runs Dropout(22) in training mode. A uniform is
  then built from Dropout(ratio 0.5) masks, one fair bit per binary digit (U = sum b_k 2^-k), and a
  normal from two uniforms (Box-Muller).
Masks with a scalar probability (dropout, bernoulli(p=...)) take Dropout's mask directly at every
opset: it keeps an element with probability 1 - ratio (except its first element, which onnxruntime
decides deterministically: every Dropout mask is drawn one element longer and that element dropped).

Other distributions are transforms of a uniform U in [0, 1): exponential -log(1 - U) / lambda, cauchy
median + sigma * tan(pi * (U - 0.5)), geometric ceil(log(1 - U) / log(1 - p)), randint
floor(U * (high - low)) + low; log_normal is exp of a normal. ONNX's Bernoulli is not used: onnxruntime
1.31 draws 1 with probability 1 - p (the spec says p); the mask ``U < p`` is exact. Multinomial uses the
Gumbel-max trick (top k of log(p) - log(E), E ~ Exp(1)): without replacement the top k equals sampling
one category after another, with replacement each draw is the argmax of its own noise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from fastonnx.context import ConversionContext, Converter, Value
from fastonnx.converters.lib.random import (
    NO_RANDOM_KERNELS_OPSET,
    Shape,
    empty_of,
    float_dtype,
    keep_mask,
    onnx_draw,
    reject_generator,
    shape_value,
    unit_uniform,
)

aten = torch.ops.aten


def _std_normal(ctx: ConversionContext, shape: Shape, dtype: torch.dtype) -> str:
    work = float_dtype(ctx, dtype)
    empty = empty_of(ctx, shape, work)
    if empty is not None:
        return empty
    if ctx.opset < NO_RANDOM_KERNELS_OPSET:
        return onnx_draw(ctx, "RandomNormal", shape, work)
    # Box-Muller: sqrt(-2 log V) cos(2 pi U) with V = 1 - U' in (0, 1]
    v = ctx.op("Sub", ctx.const(1.0, work), unit_uniform(ctx, shape, work))
    radius = ctx.op("Sqrt", ctx.op("Mul", ctx.op("Log", v), ctx.const(-2.0, work)))
    angle = ctx.op("Mul", unit_uniform(ctx, shape, work), ctx.const(2 * math.pi, work))
    return ctx.op("Mul", radius, ctx.op("Cos", angle))


def _shape_of_output(ctx: ConversionContext, like: Value | None, size: Sequence[Any] | None = None) -> Shape:
    """What a draw for the current node's output is shaped after: the output's static shape, else
    ``like`` (same shape as the output), else the requested ``size``."""
    out = list(ctx.out_shape)
    if all(isinstance(d, int) for d in out):
        return out
    if like is not None:
        return like
    if size is None:
        raise ctx.error("the output shape is symbolic and no size was given")
    return size


def _finish(ctx: ConversionContext, x: str) -> str:
    return ctx.cast(x, ctx.out_dtype)


def _unit_open_below(ctx: ConversionContext, shape: Shape, dtype: torch.dtype) -> tuple[str, torch.dtype]:
    """1 - U, in (0, 1]: never 0, so that its log is finite. Drawn at the compute dtype's resolution:
    a transformed draw is rounded once, at the end."""
    work = float_dtype(ctx, dtype)
    return ctx.op("Sub", ctx.const(1.0, work), unit_uniform(ctx, shape, work)), work


# ---- creation: rand / randn / randint / randperm and their _like forms ---------------------------
def convert_rand(ctx: ConversionContext, size: Sequence[Any], *args: Any, **kwargs: Any) -> str:
    reject_generator(ctx, kwargs.get("generator"))
    return _finish(ctx, unit_uniform(ctx, _shape_of_output(ctx, None, size), ctx.out_dtype))


def convert_randn(ctx: ConversionContext, size: Sequence[Any], *args: Any, **kwargs: Any) -> str:
    reject_generator(ctx, kwargs.get("generator"))
    return _finish(ctx, _std_normal(ctx, _shape_of_output(ctx, None, size), ctx.out_dtype))


def convert_rand_like(ctx: ConversionContext, x: Value, **kwargs: Any) -> str:
    reject_generator(ctx, kwargs.get("generator"))
    return _finish(ctx, unit_uniform(ctx, _shape_of_output(ctx, x), ctx.out_dtype))


def convert_randn_like(ctx: ConversionContext, x: Value, **kwargs: Any) -> str:
    reject_generator(ctx, kwargs.get("generator"))
    return _finish(ctx, _std_normal(ctx, _shape_of_output(ctx, x), ctx.out_dtype))


def _as_double(ctx: ConversionContext, v: Any) -> str:
    """A bound (Python int, SymInt or a Value of a sym node / 0-d tensor) as a float64 scalar."""
    if isinstance(v, (Value, str)):
        return ctx.cast(v, torch.float64)
    if isinstance(v, torch.SymInt):
        return ctx.cast(ctx.sym_value(v), torch.float64)
    return ctx.const(float(v), torch.float64)


def _randint(ctx: ConversionContext, shape: Shape, low: Any, high: Any) -> str:
    """floor(U * (high - low)) + low, drawn in float64 (53 random bits), clamped below high."""
    if isinstance(low, int) and isinstance(high, int) and high <= low:
        raise ctx.error(f"randint: high ({high}) must be greater than low ({low})")
    u = unit_uniform(ctx, shape, torch.float64)
    lo, hi = _as_double(ctx, low), _as_double(ctx, high)
    span = ctx.op("Sub", hi, lo)
    k = ctx.op("Floor", ctx.op("Mul", u, span))
    k = ctx.op("Min", k, ctx.op("Sub", span, ctx.const(1.0, torch.float64)))
    return _finish(ctx, ctx.op("Add", k, lo))


def convert_randint(ctx: ConversionContext, high: Any, size: Sequence[Any], **kwargs: Any) -> str:
    reject_generator(ctx, kwargs.get("generator"))
    return _randint(ctx, _shape_of_output(ctx, None, size), 0, high)


def convert_randint_low(
    ctx: ConversionContext, low: Any, high: Any, size: Sequence[Any], **kwargs: Any
) -> str:
    reject_generator(ctx, kwargs.get("generator"))
    return _randint(ctx, _shape_of_output(ctx, None, size), low, high)


def convert_randint_like(ctx: ConversionContext, x: Value, high: Any, **kwargs: Any) -> str:
    reject_generator(ctx, kwargs.get("generator"))
    return _randint(ctx, _shape_of_output(ctx, x), 0, high)


def convert_randint_like_low(ctx: ConversionContext, x: Value, low: Any, high: Any, **kwargs: Any) -> str:
    reject_generator(ctx, kwargs.get("generator"))
    return _randint(ctx, _shape_of_output(ctx, x), low, high)


def convert_random_to(ctx: ConversionContext, x: Value, high: int, *, generator: Any = None) -> str:
    reject_generator(ctx, generator)
    return _randint(ctx, _shape_of_output(ctx, x), 0, high)


def convert_randperm(ctx: ConversionContext, n: Any, **kwargs: Any) -> str:
    """The order of n uniform keys (TopK sorts them): every permutation is equally likely."""
    reject_generator(ctx, kwargs.get("generator"))
    keys = unit_uniform(ctx, [n], torch.float64)
    count = ctx.unsqueeze0(ctx.sym_value(n)) if not isinstance(n, int) else ctx.i64([n])
    _, order = ctx.op("TopK", keys, count, axis=0, largest=1, sorted=1, outputs=2)
    return ctx.cast(order, ctx.out_dtype)


# ---- in-place samplers of a tensor's shape: uniform_, normal_, cauchy_, exponential_... -----------
def convert_uniform(
    ctx: ConversionContext, x: Value, low: float = 0.0, high: float = 1.0, *, generator: Any = None
) -> str:
    reject_generator(ctx, generator)
    if low > high:
        raise ctx.error(f"uniform_: from ({low}) must not exceed to ({high})")
    out = ctx.out_dtype
    work = float_dtype(ctx, out)
    u = unit_uniform(ctx, _shape_of_output(ctx, x), out)
    value = ctx.op("Add", ctx.op("Mul", u, ctx.const(high - low, work)), ctx.const(low, work))
    result = ctx.cast(value, out)
    # low + U * (high - low) can round up to `high`: keep the result in [low, high)
    below = torch.nextafter(torch.tensor(high, dtype=out), torch.tensor(-math.inf, dtype=out))
    lowest = torch.tensor(low, dtype=out)
    bound = torch.maximum(below, lowest)  # low == high gives low everywhere
    return ctx.op("Max", ctx.op("Min", result, ctx.const(bound, out)), ctx.const(lowest, out))


def _normal_work(ctx: ConversionContext, shape: Shape, mean: Any, std: Any) -> str:
    """mean + std * N(0, 1), in float32 (float64 for float64): not yet cast to the output dtype."""
    out = ctx.out_dtype
    work = float_dtype(ctx, out)
    if isinstance(std, (int, float)) and std < 0:
        raise ctx.error(f"normal: std must be >= 0, got {std}")
    n = _std_normal(ctx, shape, out)
    return ctx.op("Add", ctx.op("Mul", n, ctx.operand(std, work)), ctx.operand(mean, work))


def _normal_affine(ctx: ConversionContext, shape: Shape, mean: Any, std: Any) -> str:
    """mean + std * N(0, 1), cast to the output dtype."""
    return _finish(ctx, _normal_work(ctx, shape, mean, std))


def convert_normal_inplace(
    ctx: ConversionContext, x: Value, mean: float = 0.0, std: float = 1.0, *, generator: Any = None
) -> str:
    reject_generator(ctx, generator)
    return _normal_affine(ctx, _shape_of_output(ctx, x), mean, std)


def convert_normal_tensor_float(
    ctx: ConversionContext, mean: Value, std: float = 1.0, *, generator: Any = None
) -> str:
    reject_generator(ctx, generator)
    return _normal_affine(ctx, _shape_of_output(ctx, mean), mean, std)


def convert_normal_float_tensor(
    ctx: ConversionContext, mean: float, std: Value, *, generator: Any = None
) -> str:
    reject_generator(ctx, generator)
    return _normal_affine(ctx, _shape_of_output(ctx, std), mean, std)


def convert_normal_tensor_tensor(
    ctx: ConversionContext, mean: Value, std: Value, *, generator: Any = None
) -> str:
    reject_generator(ctx, generator)
    out_shape = tuple(ctx.out_shape)
    like = mean if tuple(mean.shape) == out_shape else std if tuple(std.shape) == out_shape else None
    shape: Shape
    if like is not None or all(isinstance(d, int) for d in out_shape):
        shape = _shape_of_output(ctx, like)
    else:
        # mean and std broadcast to a symbolic shape: the shape of their sum (its values are unused)
        work = float_dtype(ctx, ctx.out_dtype)
        shape = ctx.op("Shape", ctx.op("Add", ctx.cast(mean, work), ctx.cast(std, work)))
    return _normal_affine(ctx, shape, mean, std)


def convert_normal_float_float(
    ctx: ConversionContext, mean: float, std: float, size: Sequence[Any], **kwargs: Any
) -> str:
    reject_generator(ctx, kwargs.get("generator"))
    return _normal_affine(ctx, _shape_of_output(ctx, None, size), mean, std)


def convert_log_normal(
    ctx: ConversionContext, x: Value, mean: float = 1.0, std: float = 2.0, *, generator: Any = None
) -> str:
    reject_generator(ctx, generator)
    if std <= 0:
        raise ctx.error(f"log_normal_: std must be > 0, got {std}")
    # exponentiated before the cast to the output dtype: rounded once
    return _finish(ctx, ctx.op("Exp", _normal_work(ctx, _shape_of_output(ctx, x), mean, std)))


def convert_exponential(
    ctx: ConversionContext, x: Value, lambd: float = 1.0, *, generator: Any = None
) -> str:
    reject_generator(ctx, generator)
    if lambd <= 0:
        raise ctx.error(f"exponential_: lambd must be > 0, got {lambd}")
    v, work = _unit_open_below(ctx, _shape_of_output(ctx, x), ctx.out_dtype)
    value = ctx.op("Div", ctx.op("Neg", ctx.op("Log", v)), ctx.const(lambd, work))
    return _finish(ctx, value)


def convert_cauchy(
    ctx: ConversionContext, x: Value, median: float = 0.0, sigma: float = 1.0, *, generator: Any = None
) -> str:
    reject_generator(ctx, generator)
    if sigma <= 0:
        raise ctx.error(f"cauchy_: sigma must be > 0, got {sigma}")
    out = ctx.out_dtype
    work = float_dtype(ctx, out)
    u = unit_uniform(ctx, _shape_of_output(ctx, x), work)
    angle = ctx.op("Mul", ctx.op("Sub", u, ctx.const(0.5, work)), ctx.const(math.pi, work))
    # onnxruntime's Tan has no float64 kernel; Sin / Cos do
    tan = (
        ctx.op("Tan", angle)
        if work != torch.float64
        else ctx.op("Div", ctx.op("Sin", angle), ctx.op("Cos", angle))
    )
    value = ctx.op("Add", ctx.op("Mul", tan, ctx.const(sigma, work)), ctx.const(median, work))
    return _finish(ctx, value)


def convert_geometric(ctx: ConversionContext, x: Value, p: float, *, generator: Any = None) -> str:
    """The number of Bernoulli(p) trials up to the first success: ceil(log(V) / log(1 - p)), V in (0, 1]."""
    reject_generator(ctx, generator)
    if not 0 < p < 1:
        raise ctx.error(f"geometric_: p must be in (0, 1), got {p}")
    v, work = _unit_open_below(ctx, _shape_of_output(ctx, x), ctx.out_dtype)
    trials = ctx.op("Ceil", ctx.op("Div", ctx.op("Log", v), ctx.const(math.log1p(-p), work)))
    # V == 1 gives 0 trials: the support starts at 1
    return _finish(ctx, ctx.op("Max", trials, ctx.const(1.0, work)))


# ---- bernoulli ----------------------------------------------------------------------------------
def bernoulli_mask(ctx: ConversionContext, shape: Shape, p: Any, dtype: torch.dtype) -> str:
    """A bool mask, True with probability ``p`` (a Python float or a tensor broadcasting to the shape;
    ``dtype`` is the one p is compared in). p = 0 never and p = 1 always gives True."""
    if isinstance(p, (int, float)) and p in (0, 1):
        return ctx.op("ConstantOfShape", shape_value(ctx, shape), value=ctx.tensor_attr(p == 1, torch.bool))
    if isinstance(p, (int, float)):
        return keep_mask(ctx, shape, float(p))
    work = float_dtype(ctx, dtype)
    return ctx.op("Less", unit_uniform(ctx, shape, work), ctx.operand(p, work))


def convert_bernoulli(ctx: ConversionContext, p: Value, *, generator: Any = None) -> str:
    reject_generator(ctx, generator)
    return _finish(ctx, bernoulli_mask(ctx, _shape_of_output(ctx, p), p, p.dtype))


def convert_bernoulli_p(ctx: ConversionContext, x: Value, p: Any = 0.5, *, generator: Any = None) -> str:
    reject_generator(ctx, generator)
    if isinstance(p, float) and not 0 <= p <= 1:
        raise ctx.error(f"bernoulli: p must be in [0, 1], got {p}")
    dtype = p.dtype if isinstance(p, Value) else ctx.out_dtype
    return _finish(ctx, bernoulli_mask(ctx, _shape_of_output(ctx, x), p, dtype))


# ---- multinomial --------------------------------------------------------------------------------
def convert_multinomial(
    ctx: ConversionContext,
    probs: Value,
    num_samples: Any,
    replacement: bool = False,
    *,
    generator: Any = None,
) -> str:
    reject_generator(ctx, generator)
    if probs.rank not in (1, 2):
        raise ctx.error(f"multinomial: probabilities must be 1-D or 2-D, got rank {probs.rank}")
    if not isinstance(num_samples, int):
        raise ctx.error("multinomial: num_samples must be static")
    categories = probs.shape[-1]
    if not replacement and isinstance(categories, int) and num_samples > categories:
        raise ctx.error(
            f"multinomial: {num_samples} samples without replacement from {categories} categories"
        )
    work = float_dtype(ctx, probs.dtype)
    p = ctx.cast(probs, work)
    rows = p if probs.rank == 2 else ctx.op("Unsqueeze", p, ctx.i64([0]))
    if replacement:
        # one argmax per draw, each over its own noise: rows (B, C) -> keys (B, n, C)
        rows = ctx.op("Unsqueeze", rows, ctx.i64([1]))
        dims = [1 if probs.rank == 1 else probs.shape[0], num_samples, categories]
        keys = _gumbel_keys(ctx, rows, _noise_shape(ctx, rows, dims), work)
        picked = ctx.op("ArgMax", keys, axis=-1, keepdims=0)
    else:
        dims = [1 if probs.rank == 1 else probs.shape[0], categories]
        keys = _gumbel_keys(ctx, rows, _noise_shape(ctx, rows, dims), work)
        _, picked = ctx.op("TopK", keys, ctx.i64([num_samples]), axis=-1, largest=1, sorted=1, outputs=2)
    if probs.rank == 1:
        picked = ctx.op("Squeeze", picked, ctx.i64([0]))
    return picked


def _noise_shape(ctx: ConversionContext, rows: str, dims: list[Any]) -> Shape:
    """``dims`` when static, else the runtime shape of ``rows`` with its size-1 dims widened."""
    if all(isinstance(d, int) for d in dims):
        return dims
    n = dims[1] if len(dims) == 3 else 1
    return ctx.op("Mul", ctx.op("Shape", rows), ctx.i64([1, n, 1] if len(dims) == 3 else [1, 1]))


def _gumbel_keys(ctx: ConversionContext, rows: str, shape: Shape, work: torch.dtype) -> str:
    """log(p) - log(E) with E ~ Exp(1) of ``shape``: the largest key is a draw from p (Gumbel-max)."""
    v = ctx.op("Sub", ctx.const(1.0, work), unit_uniform(ctx, shape, work))
    exp_noise = ctx.op("Neg", ctx.op("Log", v))  # in [0, inf)
    keys = ctx.op("Sub", ctx.op("Log", rows), ctx.op("Log", exp_noise))
    # zero-probability categories are never drawn: -inf, also where E == 0 would give -inf + inf = NaN
    never = ctx.op("LessOrEqual", rows, ctx.const(0.0, work))
    return ctx.op("Where", never, ctx.const(-math.inf, work), keys)


# ---- dropout in training mode -------------------------------------------------------------------
def _check_p(ctx: ConversionContext, name: str, p: float) -> None:
    if not 0 <= p <= 1:
        raise ctx.error(f"{name}: p must be in [0, 1], got {p}")


def _feature_shape(ctx: ConversionContext, x: Value, name: str) -> Shape:
    """torch's feature noise: one draw per (N, C), broadcast over the remaining dims."""
    if x.rank < 2:
        raise ctx.error(f"{name}: feature dropout needs at least 2 dimensions, got {x.rank}")
    dims = [x.shape[0], x.shape[1]] + [1] * (x.rank - 2)
    if all(isinstance(d, int) for d in dims):
        return dims
    return ctx.op("Concat", ctx.op("Shape", x, start=0, end=2), ctx.i64([1] * (x.rank - 2)), axis=0)


def _is_identity(x: Value, p: float, train: bool) -> bool:
    return not train or p == 0 or (x.static_shape() is not None and 0 in x.shape)


def _dropout(name: str, feature: bool, alpha: bool) -> Any:
    def convert(ctx: ConversionContext, x: Value, p: float, train: bool) -> str:
        _check_p(ctx, name, p)
        if _is_identity(x, p, train):
            # the value itself, as clone / detach give it: an Identity node would stand between the
            # ops around it and hide patterns such as attention from the fusions
            return x.name
        dt = x.dtype
        if p == 1:
            return ctx.op("Mul", x, ctx.const(0, dt))  # x * 0 as torch does: NaN stays NaN
        shape = _feature_shape(ctx, x, name) if feature else x
        keep = ctx.cast(keep_mask(ctx, shape, 1.0 - p), dt)
        if not alpha:
            # torch: x * (mask / (1 - p)), the scale rounded to the input's dtype
            noise = ctx.op("Mul", keep, ctx.const(torch.tensor(1.0 / (1.0 - p)).to(dt), dt))
            return ctx.op("Mul", x, noise)
        # torch's alpha dropout keeps mean and variance of SELU outputs: kept x * a + alpha * a * p,
        # dropped -alpha * a + alpha * a * p
        sat = 1.7580993408473766
        a = 1.0 / math.sqrt((sat * sat * p + 1) * (1 - p))
        b = ctx.op(
            "Add",
            ctx.op("Mul", ctx.op("Sub", keep, ctx.const(1, dt)), ctx.const(sat * a, dt)),
            ctx.const(sat * a * p, dt),
        )
        return ctx.op("Add", ctx.op("Mul", x, ctx.op("Mul", keep, ctx.const(a, dt))), b)

    convert.__name__ = f"convert_{name}"
    return convert


convert_dropout = _dropout("dropout", feature=False, alpha=False)
convert_feature_dropout = _dropout("feature_dropout", feature=True, alpha=False)
convert_alpha_dropout = _dropout("alpha_dropout", feature=False, alpha=True)
convert_feature_alpha_dropout = _dropout("feature_alpha_dropout", feature=True, alpha=True)


def convert_native_dropout(ctx: ConversionContext, x: Value, p: float, train: bool | None) -> list[str]:
    """(x * mask * 1 / (1 - p), mask) in training mode (train None counts as training)."""
    _check_p(ctx, "native_dropout", p)
    train = True if train is None else train
    if _is_identity(x, p, train):
        ones = ctx.op("ConstantOfShape", ctx.dims_of(x), value=ctx.tensor_attr(True, torch.bool))
        return [ctx.op("Identity", x), ones]
    dt = x.dtype
    if p == 1:
        mask = ctx.op("ConstantOfShape", ctx.dims_of(x), value=ctx.tensor_attr(False, torch.bool))
        return [ctx.op("Mul", x, ctx.const(0.0, dt)), mask]
    mask = keep_mask(ctx, x, 1.0 - p)
    scale = 1.0 / (1.0 - p)
    out = ctx.op("Mul", ctx.op("Mul", x, ctx.cast(mask, dt)), ctx.const(scale, dt))
    return [out, mask]


CONVERTERS: dict[str, Converter] = {
    "aten.rand.default": convert_rand,
    "aten.rand.generator": convert_rand,
    "aten.randn.default": convert_randn,
    "aten.randn.generator": convert_randn,
    "aten.rand_like.default": convert_rand_like,
    "aten.rand_like.generator": convert_rand_like,
    "aten.randn_like.default": convert_randn_like,
    "aten.randn_like.generator": convert_randn_like,
    "aten.randint.default": convert_randint,
    "aten.randint.generator": convert_randint,
    "aten.randint.low": convert_randint_low,
    "aten.randint.low_generator": convert_randint_low,
    "aten.randint_like.default": convert_randint_like,
    "aten.randint_like.generator": convert_randint_like,
    "aten.randint_like.Tensor": convert_randint_like,
    "aten.randint_like.Tensor_generator": convert_randint_like,
    "aten.randint_like.low_dtype": convert_randint_like_low,
    "aten.randint_like.low_generator_dtype": convert_randint_like_low,
    "aten.random.to": convert_random_to,
    "aten.randperm.default": convert_randperm,
    "aten.randperm.generator": convert_randperm,
    "aten.uniform.default": convert_uniform,
    "aten.normal_.default": convert_normal_inplace,
    "aten.normal_functional.default": convert_normal_inplace,
    "aten.normal.Tensor_float": convert_normal_tensor_float,
    "aten.normal.float_Tensor": convert_normal_float_tensor,
    "aten.normal.Tensor_Tensor": convert_normal_tensor_tensor,
    "aten.normal.float_float": convert_normal_float_float,
    "aten.log_normal.default": convert_log_normal,
    "aten.exponential.default": convert_exponential,
    "aten.cauchy.default": convert_cauchy,
    "aten.geometric.default": convert_geometric,
    "aten.bernoulli.default": convert_bernoulli,
    "aten.bernoulli.p": convert_bernoulli_p,
    "aten.bernoulli.Tensor": convert_bernoulli_p,
    "aten.bernoulli_.float": convert_bernoulli_p,
    "aten.multinomial.default": convert_multinomial,
    "aten.dropout.default": convert_dropout,
    "aten.feature_dropout.default": convert_feature_dropout,
    "aten.alpha_dropout.default": convert_alpha_dropout,
    "aten.feature_alpha_dropout.default": convert_feature_alpha_dropout,
    "aten.native_dropout.default": convert_native_dropout,
}
