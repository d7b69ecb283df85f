"""Batch, layer, group, instance and RMS normalization.

Everything is computed in the opmath dtype (float32 for float16 / bfloat16 inputs, whose parameters
torch also allows in float32) and cast once to the dtype torch recorded for each output. Statistics
are two-pass (mean first, then the mean of squared deviations), like torch's Welford kernels.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from fastonnx.context import ConversionContext, Converter, Value
from fastonnx.converters.lib.kernels import opmath_dtype
from fastonnx.converters.lib.ops import reduce, squeeze, unsqueeze
from fastonnx.converters.lib.reduction_graphs import reduced_count

aten = torch.ops.aten


# ---- shared pieces ------------------------------------------------------------------------------
def _out_meta(ctx: ConversionContext, i: int) -> torch.Tensor:
    val = ctx.out
    meta: torch.Tensor = val[i] if isinstance(val, (list, tuple)) else val
    return meta


def _finish(ctx: ConversionContext, i: int, v: str) -> str:
    """Output ``i`` of the node from compute-dtype value ``v``, cast to the dtype torch recorded."""
    return ctx.cast(v, _out_meta(ctx, i).dtype)


def _empty(ctx: ConversionContext, i: int) -> str:
    """The empty tensor torch returns for statistics it did not compute (eval-mode save_mean...)."""
    meta = _out_meta(ctx, i)
    if not all(isinstance(d, int) for d in meta.shape):
        raise ctx.error(f"output {i} has a symbolic shape where torch returns an empty tensor")
    return ctx.const(torch.zeros(tuple(meta.shape), dtype=meta.dtype), meta.dtype)


def _channel_param(ctx: ConversionContext, p: Value | None, rank: int, dtype: torch.dtype) -> str | None:
    """A per-channel [C] tensor shaped [1, C, 1, ...] to broadcast against a rank-``rank`` input."""
    if p is None:
        return None
    v = ctx.cast(p, dtype)
    axes = [0, *range(2, rank)]
    return unsqueeze(ctx, v, axes) if rank >= 2 else v


def _affine(ctx: ConversionContext, y: str, weight: str | None, bias: str | None) -> str:
    if weight is not None:
        y = ctx.op("Mul", y, weight)
    if bias is not None:
        y = ctx.op("Add", y, bias)
    return y


def _moments(ctx: ConversionContext, v: str, axes: Sequence[int]) -> tuple[str, str, str]:
    """(mean, biased variance, centered input) over ``axes``, all with the axes kept."""
    mean = reduce(ctx, "ReduceMean", v, list(axes), True)
    centered = ctx.op("Sub", v, mean)
    var = reduce(ctx, "ReduceMean", ctx.op("Mul", centered, centered), list(axes), True)
    return mean, var, centered


def _rstd(ctx: ConversionContext, var: str, eps: float, dtype: torch.dtype) -> str:
    """1 / sqrt(var + eps), as torch's save_invstd / rstd."""
    return ctx.op("Reciprocal", ctx.op("Sqrt", ctx.op("Add", var, ctx.const(eps, dtype))))


# ---- batch norm ---------------------------------------------------------------------------------
def _bn_eval(
    ctx: ConversionContext,
    x: Value,
    weight: Value | None,
    bias: Value | None,
    mean: Value,
    var: Value,
    eps: float,
    dtype: torch.dtype,
) -> str:
    """Running-statistics batch norm: ONNX BatchNormalization (which onnxruntime fuses into convs)."""
    if x.rank < 2:
        raise ctx.error(f"batch_norm expects an input of rank >= 2, got rank {x.rank}")
    c = x.shape[1]
    if weight is None or bias is None:
        if not isinstance(c, int):
            raise ctx.error("batch_norm without weight or bias needs a static channel dim")
    scale = ctx.cast(weight, dtype) if weight is not None else ctx.const(torch.ones(c), dtype)
    shift = ctx.cast(bias, dtype) if bias is not None else ctx.const(torch.zeros(c), dtype)
    v = ctx.cast(x, dtype)
    return ctx.op(
        "BatchNormalization",
        v,
        scale,
        shift,
        ctx.cast(mean, dtype),
        ctx.cast(var, dtype),
        epsilon=float(eps),
    )


def _bn_train(
    ctx: ConversionContext,
    x: Value,
    weight: Value | None,
    bias: Value | None,
    eps: float,
    dtype: torch.dtype,
) -> tuple[str, str, str, str]:
    """Batch-statistics batch norm: (output, mean [C], invstd [C], biased var [C])."""
    if x.rank < 2:
        raise ctx.error(f"batch_norm expects an input of rank >= 2, got rank {x.rank}")
    axes = [0, *range(2, x.rank)]
    mean, var, centered = _moments(ctx, ctx.cast(x, dtype), axes)
    rstd = _rstd(ctx, var, eps, dtype)
    y = _affine(
        ctx,
        ctx.op("Mul", centered, rstd),
        _channel_param(ctx, weight, x.rank, dtype),
        _channel_param(ctx, bias, x.rank, dtype),
    )
    return y, squeeze(ctx, mean, axes), squeeze(ctx, rstd, axes), squeeze(ctx, var, axes)


def _batch_norm(
    ctx: ConversionContext,
    x: Value,
    weight: Value | None,
    bias: Value | None,
    running_mean: Value | None,
    running_var: Value | None,
    training: bool,
    eps: float,
) -> tuple[str, str | None, str | None]:
    """(output, save_mean, save_invstd) in the compute dtype; the statistics are None in eval mode."""
    dtype = opmath_dtype(x.dtype)
    if x.rank < 2 and x.static_shape() is not None and 0 in x.shape:
        return ctx.op("Identity", ctx.cast(x, dtype)), None, None  # torch accepts an empty 1-D input
    if training or running_mean is None or running_var is None:
        if not training:
            raise ctx.error("batch_norm with training=False needs running_mean and running_var")
        y, mean, rstd, _ = _bn_train(ctx, x, weight, bias, eps, dtype)
        return y, mean, rstd
    return _bn_eval(ctx, x, weight, bias, running_mean, running_var, eps, dtype), None, None


def convert_batch_norm(
    ctx: ConversionContext,
    x: Value,
    weight: Value | None,
    bias: Value | None,
    running_mean: Value | None,
    running_var: Value | None,
    training: bool,
    momentum: float,
    eps: float,
    cudnn_enabled: bool = True,
) -> str:
    # training=True normalizes with the batch's statistics, as torch does; the running-stat update is
    # a side effect the exported graph does not carry (torch.export does not list it as an output)
    y, _, _ = _batch_norm(ctx, x, weight, bias, running_mean, running_var, training, eps)
    return ctx.cast(y, ctx.out_dtype)


def _stat_outputs(ctx: ConversionContext, y: str, mean: str | None, rstd: str | None) -> list[str]:
    out = [ctx.cast(y, _out_meta(ctx, 0).dtype)]
    out.append(_finish(ctx, 1, mean) if mean is not None else _empty(ctx, 1))
    out.append(_finish(ctx, 2, rstd) if rstd is not None else _empty(ctx, 2))
    return out


def convert_native_batch_norm(
    ctx: ConversionContext,
    x: Value,
    weight: Value | None,
    bias: Value | None,
    running_mean: Value | None,
    running_var: Value | None,
    training: bool,
    momentum: float,
    eps: float,
) -> list[str]:
    y, mean, rstd = _batch_norm(ctx, x, weight, bias, running_mean, running_var, training, eps)
    return _stat_outputs(ctx, y, mean, rstd)


def convert_bn_legit_no_training(
    ctx: ConversionContext,
    x: Value,
    weight: Value | None,
    bias: Value | None,
    running_mean: Value,
    running_var: Value,
    momentum: float,
    eps: float,
) -> list[str]:
    y, mean, rstd = _batch_norm(ctx, x, weight, bias, running_mean, running_var, False, eps)
    return _stat_outputs(ctx, y, mean, rstd)


def convert_bn_legit_no_stats(
    ctx: ConversionContext,
    x: Value,
    weight: Value | None,
    bias: Value | None,
    training: bool,
    momentum: float,
    eps: float,
) -> list[str]:
    y, mean, rstd = _batch_norm(ctx, x, weight, bias, None, None, True, eps)
    return _stat_outputs(ctx, y, mean, rstd)


def convert_bn_legit_functional(
    ctx: ConversionContext,
    x: Value,
    weight: Value | None,
    bias: Value | None,
    running_mean: Value,
    running_var: Value,
    training: bool,
    momentum: float,
    eps: float,
) -> list[str]:
    """(output, save_mean, save_invstd, new running_mean, new running_var)."""
    dtype = opmath_dtype(x.dtype)
    if not training:
        y = _bn_eval(ctx, x, weight, bias, running_mean, running_var, eps, dtype)
        outs = _stat_outputs(ctx, y, None, None)
        return [*outs, ctx.op("Identity", running_mean), ctx.op("Identity", running_var)]
    y, mean, rstd, var = _bn_train(ctx, x, weight, bias, eps, dtype)
    outs = _stat_outputs(ctx, y, mean, rstd)
    # running stats: (1 - momentum) * old + momentum * batch, the variance unbiased (n / (n - 1))
    n = reduced_count(ctx, x, [0, *range(2, x.rank)], dtype)
    unbiased = ctx.op("Div", ctx.op("Mul", var, n), ctx.op("Sub", n, ctx.const(1, dtype)))
    keep = ctx.const(1 - momentum, dtype)
    take = ctx.const(momentum, dtype)
    new_stats = []
    for old, batch in ((running_mean, mean), (running_var, unbiased)):
        mixed = ctx.op("Add", ctx.op("Mul", ctx.cast(old, dtype), keep), ctx.op("Mul", batch, take))
        new_stats.append(ctx.cast(mixed, old.dtype))
    return [*outs, *new_stats]


def convert_bn_with_update(
    ctx: ConversionContext,
    x: Value,
    weight: Value | None,
    bias: Value | None,
    running_mean: Value,
    running_var: Value,
    momentum: float,
    eps: float,
) -> list[str]:
    y, mean, rstd = _batch_norm(ctx, x, weight, bias, None, None, True, eps)
    return [*_stat_outputs(ctx, y, mean, rstd), _empty(ctx, 3)]


def convert_bn_with_update_functional(
    ctx: ConversionContext,
    x: Value,
    weight: Value | None,
    bias: Value | None,
    running_mean: Value,
    running_var: Value,
    momentum: float,
    eps: float,
) -> list[str]:
    """(output, save_mean, save_invstd, reserve, new running_mean, new running_var)."""
    out, mean, rstd, new_mean, new_var = convert_bn_legit_functional(
        ctx, x, weight, bias, running_mean, running_var, True, momentum, eps
    )
    return [out, mean, rstd, _empty(ctx, 3), new_mean, new_var]


def convert_bn_no_update(
    ctx: ConversionContext,
    x: Value,
    weight: Value | None,
    bias: Value | None,
    running_mean: Value | None,
    running_var: Value | None,
    momentum: float,
    eps: float,
) -> list[str]:
    training = running_mean is None or running_var is None  # no stats: the batch's own
    y, mean, rstd = _batch_norm(ctx, x, weight, bias, running_mean, running_var, training, eps)
    return [*_stat_outputs(ctx, y, mean, rstd), _empty(ctx, 3)]


# ---- layer norm -----------------------------------------------------------------------------------
def _ones(ctx: ConversionContext, shape: Sequence[Any], dtype: torch.dtype) -> str:
    if all(isinstance(d, int) for d in shape):
        return ctx.const(torch.ones(tuple(shape)), dtype)
    return ctx.op("ConstantOfShape", ctx.shape_tensor(list(shape)), value=ctx.tensor_attr(1, dtype))


def _layer_norm(
    ctx: ConversionContext,
    x: Value,
    normalized_shape: Sequence[Any],
    weight: Value | None,
    bias: Value | None,
    eps: float,
    outputs: int,
) -> list[str]:
    dtype = opmath_dtype(x.dtype)
    k = len(normalized_shape)
    if k == 0 or k > x.rank:
        raise ctx.error(
            f"layer_norm: normalized_shape {list(normalized_shape)} does not fit a rank-{x.rank} input"
        )
    scale = ctx.cast(weight, dtype) if weight is not None else _ones(ctx, normalized_shape, dtype)
    shift = ctx.cast(bias, dtype) if bias is not None else None
    return ctx.op(
        "LayerNormalization",
        ctx.cast(x, dtype),
        scale,
        shift,
        axis=x.rank - k,
        epsilon=float(eps),
        stash_type=1,
        outputs=outputs,
    )


def convert_layer_norm(
    ctx: ConversionContext,
    x: Value,
    normalized_shape: Sequence[Any],
    weight: Value | None = None,
    bias: Value | None = None,
    eps: float = 1e-5,
    cudnn_enable: bool = True,
) -> str:
    y = _layer_norm(ctx, x, normalized_shape, weight, bias, eps, 1)[0]
    return ctx.cast(y, ctx.out_dtype)


def convert_native_layer_norm(
    ctx: ConversionContext,
    x: Value,
    normalized_shape: Sequence[Any],
    weight: Value | None,
    bias: Value | None,
    eps: float,
) -> list[str]:
    # ONNX's Mean and InvStdDev outputs keep the normalized axes as 1s, like torch's mean / rstd
    y, mean, rstd = _layer_norm(ctx, x, normalized_shape, weight, bias, eps, 3)
    return [_finish(ctx, 0, y), _finish(ctx, 1, mean), _finish(ctx, 2, rstd)]


# ---- group norm -----------------------------------------------------------------------------------
def _prod(dims: Sequence[int]) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def _group_norm(
    ctx: ConversionContext,
    x: Value,
    groups: int,
    weight: Value | None,
    bias: Value | None,
    eps: float,
) -> tuple[str, str, str]:
    """(output, mean [N, G], rstd [N, G]) in the compute dtype."""
    if x.rank < 2:
        raise ctx.error(f"group_norm expects an input of rank >= 2, got rank {x.rank}")
    c = x.shape[1]
    if isinstance(c, int) and (groups <= 0 or c % groups):
        raise ctx.error(f"group_norm: {c} channels cannot be split into num_groups={groups} groups")
    dtype = opmath_dtype(x.dtype)
    # [N, G, C/G * spatial]
    static = x.static_shape()
    if static is not None:
        target = ctx.i64([static[0], groups, (c // groups) * _prod(static[2:])])  # exact even when empty
    else:
        target = ctx.i64([0, groups, -1])  # 0 copies N, so a symbolic batch needs no Shape node
    grouped = ctx.op("Reshape", ctx.cast(x, dtype), target)
    mean, var, centered = _moments(ctx, grouped, [2])
    rstd = _rstd(ctx, var, eps, dtype)
    y = ctx.op("Reshape", ctx.op("Mul", centered, rstd), ctx.dims_of(x))
    y = _affine(
        ctx,
        y,
        _channel_param(ctx, weight, x.rank, dtype),
        _channel_param(ctx, bias, x.rank, dtype),
    )
    return y, squeeze(ctx, mean, [2]), squeeze(ctx, rstd, [2])


def convert_group_norm(
    ctx: ConversionContext,
    x: Value,
    num_groups: int,
    weight: Value | None = None,
    bias: Value | None = None,
    eps: float = 1e-5,
    cudnn_enabled: bool = True,
) -> str:
    y, _, _ = _group_norm(ctx, x, num_groups, weight, bias, eps)
    return ctx.cast(y, ctx.out_dtype)


def convert_native_group_norm(
    ctx: ConversionContext,
    x: Value,
    weight: Value | None,
    bias: Value | None,
    n: Any,
    c: Any,
    hxw: Any,
    group: int,
    eps: float,
) -> list[str]:
    y, mean, rstd = _group_norm(ctx, x, group, weight, bias, eps)
    return [_finish(ctx, 0, y), _finish(ctx, 1, mean), _finish(ctx, 2, rstd)]


# ---- instance norm --------------------------------------------------------------------------------
def convert_instance_norm(
    ctx: ConversionContext,
    x: Value,
    weight: Value | None,
    bias: Value | None,
    running_mean: Value | None,
    running_var: Value | None,
    use_input_stats: bool,
    momentum: float,
    eps: float,
    cudnn_enabled: bool = True,
) -> str:
    dtype = opmath_dtype(x.dtype)
    if not use_input_stats:
        if running_mean is None or running_var is None:
            raise ctx.error("instance_norm with use_input_stats=False needs running_mean and running_var")
        y = _bn_eval(ctx, x, weight, bias, running_mean, running_var, eps, dtype)
        return ctx.cast(y, ctx.out_dtype)
    if x.rank < 3:
        raise ctx.error(f"instance_norm expects an input of rank >= 3, got rank {x.rank}")
    _, var, centered = _moments(ctx, ctx.cast(x, dtype), list(range(2, x.rank)))
    y = _affine(
        ctx,
        ctx.op("Mul", centered, _rstd(ctx, var, eps, dtype)),
        _channel_param(ctx, weight, x.rank, dtype),
        _channel_param(ctx, bias, x.rank, dtype),
    )
    return ctx.cast(y, ctx.out_dtype)


# ---- RMS norm -------------------------------------------------------------------------------------
def _rms_norm(
    ctx: ConversionContext,
    x: Value,
    normalized_shape: Sequence[Any],
    weight: Value | None,
    eps: float | None,
) -> tuple[str, str]:
    """(output, rstd) in the compute dtype: x * rsqrt(mean(x^2) + eps) * weight, all in opmath."""
    dtype = opmath_dtype(x.dtype)
    k = len(normalized_shape)
    if k == 0 or k > x.rank:
        raise ctx.error(
            f"rms_norm: normalized_shape {list(normalized_shape)} does not fit a rank-{x.rank} input"
        )
    if eps is None:
        eps = float(torch.finfo(dtype).eps)  # torch's default: the compute dtype's epsilon
    v = ctx.cast(x, dtype)
    axes = list(range(x.rank - k, x.rank))
    ms = reduce(ctx, "ReduceMean", ctx.op("Mul", v, v), axes, True)
    rstd = _rstd(ctx, ms, eps, dtype)
    y = ctx.op("Mul", v, rstd)
    if weight is not None:
        y = ctx.op("Mul", y, ctx.cast(weight, dtype))
    return y, rstd


def convert_rms_norm(
    ctx: ConversionContext,
    x: Value,
    normalized_shape: Sequence[Any],
    weight: Value | None = None,
    eps: float | None = None,
) -> str:
    out = ctx.out_dtype
    k = len(normalized_shape)
    if ctx.opset >= 23 and x.dtype == out and x.dtype in (torch.float32, torch.float64) and 0 < k <= x.rank:
        # same arithmetic as the decomposition when nothing needs upcasting
        eps_value = float(torch.finfo(x.dtype).eps) if eps is None else float(eps)
        scale = ctx.cast(weight, x.dtype) if weight is not None else _ones(ctx, normalized_shape, x.dtype)
        return ctx.op("RMSNormalization", x, scale, axis=x.rank - k, epsilon=eps_value, stash_type=1)
    y, _ = _rms_norm(ctx, x, normalized_shape, weight, eps)
    return ctx.cast(y, out)


def convert_fused_rms_norm(
    ctx: ConversionContext,
    x: Value,
    normalized_shape: Sequence[Any],
    weight: Value | None,
    eps: float | None,
) -> list[str]:
    y, rstd = _rms_norm(ctx, x, normalized_shape, weight, eps)
    return [_finish(ctx, 0, y), _finish(ctx, 1, rstd)]


CONVERTERS: dict[str, Converter] = {
    "aten.batch_norm.default": convert_batch_norm,
    "aten.native_batch_norm.default": convert_native_batch_norm,
    "aten._native_batch_norm_legit_no_training.default": convert_bn_legit_no_training,
    "aten._native_batch_norm_legit.default": convert_native_batch_norm,
    "aten._native_batch_norm_legit.no_stats": convert_bn_legit_no_stats,
    "aten._native_batch_norm_legit_functional.default": convert_bn_legit_functional,
    "aten._batch_norm_with_update.default": convert_bn_with_update,
    "aten._batch_norm_no_update.default": convert_bn_no_update,
    "aten._batch_norm_with_update_functional.default": convert_bn_with_update_functional,
    "aten.layer_norm.default": convert_layer_norm,
    "aten.native_layer_norm.default": convert_native_layer_norm,
    "aten.group_norm.default": convert_group_norm,
    "aten.native_group_norm.default": convert_native_group_norm,
    "aten.instance_norm.default": convert_instance_norm,
    "aten.rms_norm.default": convert_rms_norm,
    "aten._fused_rms_norm.default": convert_fused_rms_norm,
}
