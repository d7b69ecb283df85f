"""Loss functions and distances as they arrive in exported training / evaluation graphs.

aten's losses take ``reduction`` as an int (0 none, 1 mean, 2 sum). Formulas follow torch's kernels
(clamps, masks, the order of the terms); float16 / bfloat16 inputs are computed in float32 and the
result rounded once, as torch's CPU kernels do (opmath).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from fastonnx.context import ConversionContext, Converter, Value
from fastonnx.converters.lib.kernels import opmath_dtype
from fastonnx.converters.lib.ops import reduce, unsqueeze

aten = torch.ops.aten

NONE, MEAN, SUM = 0, 1, 2


# ---- shared pieces -------------------------------------------------------------------------------


def _float_dtypes(ctx: ConversionContext) -> tuple[torch.dtype, torch.dtype]:
    """(result dtype, compute dtype) of a floating loss."""
    dtype = ctx.out_dtype
    if not dtype.is_floating_point:
        raise ctx.error(f"losses are converted for floating point results only, got {dtype}")
    return dtype, opmath_dtype(dtype)


def _reduce(ctx: ConversionContext, loss: str, reduction: int, dtype: torch.dtype) -> str:
    """Applies ``reduction`` to an elementwise loss and casts to the result dtype."""
    if reduction == NONE:
        return ctx.cast(loss, dtype)
    if reduction == MEAN:
        return ctx.cast(ctx.op("ReduceMean", loss, keepdims=0), dtype)
    if reduction == SUM:
        return ctx.cast(reduce(ctx, "ReduceSum", loss, None, False), dtype)
    raise ctx.error(f"reduction must be 0 (none), 1 (mean) or 2 (sum), got {reduction!r}")


def _c(ctx: ConversionContext, value: float, dtype: torch.dtype) -> str:
    return ctx.const(value, dtype)


def _clamp_min0(ctx: ConversionContext, x: str, dtype: torch.dtype) -> str:
    # Max propagates NaN like torch's clamp_min
    return ctx.op("Max", x, _c(ctx, 0.0, dtype))


def _rounded(ctx: ConversionContext, x: str, dtype: torch.dtype, cd: torch.dtype) -> str:
    """``x`` rounded to the result dtype and back: torch's composite losses store each intermediate
    in the tensor's dtype, so a float16 exp overflows to inf there; so must ours."""
    return x if dtype == cd else ctx.cast(ctx.cast(x, dtype), cd)


def _exp(ctx: ConversionContext, x: str, dtype: torch.dtype, cd: torch.dtype) -> str:
    return _rounded(ctx, ctx.op("Exp", x), dtype, cd)


def _softplus_neg(ctx: ConversionContext, x: str, dtype: torch.dtype) -> str:
    """-log_sigmoid(x) = max(-x, 0) + log(1 + exp(-|x|)), stable for every x."""
    neg = ctx.op("Neg", x)
    tail = ctx.op("Log", ctx.op("Add", _c(ctx, 1.0, dtype), ctx.op("Exp", ctx.op("Neg", ctx.op("Abs", x)))))
    return ctx.op("Add", _clamp_min0(ctx, neg, dtype), tail)


def _pnorm(
    ctx: ConversionContext, x: str, p: float, axes: list[int] | None, keepdim: bool, dtype: torch.dtype
) -> str:
    """The p-norm of ``x`` over ``axes`` (None: all elements), as torch.norm computes it."""
    if p == 2:
        return ctx.op("Sqrt", reduce(ctx, "ReduceSumSquare", x, axes, keepdim))
    a = ctx.op("Abs", x)
    if p == 1:
        return reduce(ctx, "ReduceSum", a, axes, keepdim)
    if p == math.inf:
        return reduce(ctx, "ReduceMax", a, axes, keepdim)
    if p == -math.inf:
        return reduce(ctx, "ReduceMin", a, axes, keepdim)
    if p == 0:
        nonzero = ctx.cast(ctx.op("Not", ctx.op("Equal", a, _c(ctx, 0.0, dtype))), dtype)
        return reduce(ctx, "ReduceSum", nonzero, axes, keepdim)
    powered = reduce(ctx, "ReduceSum", ctx.op("Pow", a, _c(ctx, float(p), dtype)), axes, keepdim)
    return ctx.op("Pow", powered, _c(ctx, 1.0 / float(p), dtype))


def _pairwise(ctx: ConversionContext, x1: Value, x2: Value, p: float, eps: float, dtype: torch.dtype) -> str:
    """torch.pairwise_distance: ||x1 - x2 + eps||_p over the last dim (|x1 - x2 + eps| for 0-d)."""
    diff = ctx.op("Add", ctx.op("Sub", ctx.cast(x1, dtype), ctx.cast(x2, dtype)), _c(ctx, eps, dtype))
    rank = max(x1.rank, x2.rank)
    if rank == 0:
        return ctx.op("Abs", diff)
    return _pnorm(ctx, diff, p, [rank - 1], False, dtype)


# ---- regression losses -----------------------------------------------------------------------------


def convert_mse_loss(ctx: ConversionContext, x: Value, target: Value, reduction: int = MEAN) -> str:
    dtype, cd = _float_dtypes(ctx)
    d = ctx.op("Sub", ctx.cast(x, cd), ctx.cast(target, cd))
    return _reduce(ctx, ctx.op("Mul", d, d), reduction, dtype)


def convert_l1_loss(ctx: ConversionContext, x: Value, target: Value, reduction: int = MEAN) -> str:
    dtype, cd = _float_dtypes(ctx)
    return _reduce(ctx, ctx.op("Abs", ctx.op("Sub", ctx.cast(x, cd), ctx.cast(target, cd))), reduction, dtype)


def _quadratic_below(
    ctx: ConversionContext, x: Value, target: Value, threshold: float, cd: torch.dtype
) -> tuple[str, str, str]:
    """(|x - target|, 0.5 * z**2, z < threshold) shared by smooth_l1 and huber."""
    z = ctx.op("Abs", ctx.op("Sub", ctx.cast(x, cd), ctx.cast(target, cd)))
    half_sq = ctx.op("Mul", _c(ctx, 0.5, cd), ctx.op("Mul", z, z))
    return z, half_sq, ctx.op("Less", z, _c(ctx, threshold, cd))


def convert_smooth_l1_loss(
    ctx: ConversionContext, x: Value, target: Value, reduction: int = MEAN, beta: float = 1.0
) -> str:
    dtype, cd = _float_dtypes(ctx)
    if beta == 0:  # torch falls back to l1_loss (the quadratic branch would divide by zero)
        return convert_l1_loss(ctx, x, target, reduction)
    z, half_sq, below = _quadratic_below(ctx, x, target, beta, cd)
    quad = ctx.op("Div", half_sq, _c(ctx, beta, cd))
    lin = ctx.op("Sub", z, _c(ctx, 0.5 * beta, cd))
    return _reduce(ctx, ctx.op("Where", below, quad, lin), reduction, dtype)


def convert_huber_loss(
    ctx: ConversionContext, x: Value, target: Value, reduction: int = MEAN, delta: float = 1.0
) -> str:
    dtype, cd = _float_dtypes(ctx)
    z, half_sq, below = _quadratic_below(ctx, x, target, delta, cd)
    lin = ctx.op("Mul", _c(ctx, delta, cd), ctx.op("Sub", z, _c(ctx, 0.5 * delta, cd)))
    return _reduce(ctx, ctx.op("Where", below, half_sq, lin), reduction, dtype)


def convert_poisson_nll_loss(
    ctx: ConversionContext,
    x: Value,
    target: Value,
    log_input: bool,
    full: bool,
    eps: float,
    reduction: int,
) -> str:
    dtype, cd = _float_dtypes(ctx)
    xi, t = ctx.cast(x, cd), ctx.cast(target, cd)
    if log_input:
        loss = ctx.op("Sub", _exp(ctx, xi, dtype, cd), ctx.op("Mul", t, xi))
    else:
        loss = ctx.op("Sub", xi, ctx.op("Mul", t, ctx.op("Log", ctx.op("Add", xi, _c(ctx, eps, cd)))))
    if full:
        # Stirling's term t*log(t) - t + 0.5*log(2*pi*t), only where t > 1
        stirling = ctx.op(
            "Add",
            ctx.op("Sub", ctx.op("Mul", t, ctx.op("Log", t)), t),
            ctx.op("Mul", _c(ctx, 0.5, cd), ctx.op("Log", ctx.op("Mul", _c(ctx, 2 * math.pi, cd), t))),
        )
        above = ctx.op("Greater", t, _c(ctx, 1.0, cd))
        loss = ctx.op("Add", loss, ctx.op("Where", above, stirling, _c(ctx, 0.0, cd)))
    return _reduce(ctx, loss, reduction, dtype)


# ---- binary / probabilistic losses -----------------------------------------------------------------


def _weighted(ctx: ConversionContext, loss: str, weight: Value | None, cd: torch.dtype) -> str:
    return loss if weight is None else ctx.op("Mul", loss, ctx.cast(weight, cd))


def convert_binary_cross_entropy(
    ctx: ConversionContext, x: Value, target: Value, weight: Value | None = None, reduction: int = MEAN
) -> str:
    dtype, cd = _float_dtypes(ctx)
    xi, t = ctx.cast(x, cd), ctx.cast(target, cd)
    floor = _c(ctx, -100.0, cd)  # torch clamps each log at -100 so that 0 * log(0) stays finite
    log_x = ctx.op("Max", ctx.op("Log", xi), floor)
    log_1mx = ctx.op("Max", ctx.op("Log", ctx.op("Sub", _c(ctx, 1.0, cd), xi)), floor)
    loss = ctx.op("Sub", ctx.op("Mul", ctx.op("Sub", t, _c(ctx, 1.0, cd)), log_1mx), ctx.op("Mul", t, log_x))
    return _reduce(ctx, _weighted(ctx, loss, weight, cd), reduction, dtype)


def convert_binary_cross_entropy_with_logits(
    ctx: ConversionContext,
    x: Value,
    target: Value,
    weight: Value | None = None,
    pos_weight: Value | None = None,
    reduction: int = MEAN,
) -> str:
    dtype, cd = _float_dtypes(ctx)
    xi, t = ctx.cast(x, cd), ctx.cast(target, cd)
    one = _c(ctx, 1.0, cd)
    # (1 - t) * x - log_weight * log_sigmoid(x), log_weight = 1 + (pos_weight - 1) * t
    softplus = _softplus_neg(ctx, xi, cd)
    if pos_weight is not None:
        log_weight = ctx.op("Add", ctx.op("Mul", ctx.op("Sub", ctx.cast(pos_weight, cd), one), t), one)
        softplus = ctx.op("Mul", log_weight, softplus)
    loss = ctx.op("Add", ctx.op("Mul", ctx.op("Sub", one, t), xi), softplus)
    return _reduce(ctx, _weighted(ctx, loss, weight, cd), reduction, dtype)


def convert_kl_div(
    ctx: ConversionContext, x: Value, target: Value, reduction: int = MEAN, *, log_target: bool = False
) -> str:
    dtype, cd = _float_dtypes(ctx)
    xi, t = ctx.cast(x, cd), ctx.cast(target, cd)
    if log_target:
        loss = ctx.op("Mul", _exp(ctx, t, dtype, cd), ctx.op("Sub", t, xi))
    else:
        # xlogy(t, t) - t * x; xlogy is 0 where t == 0 (NaN stays NaN)
        t_log_t = ctx.op(
            "Where",
            ctx.op("Equal", t, _c(ctx, 0.0, cd)),
            _c(ctx, 0.0, cd),
            ctx.op("Mul", t, ctx.op("Log", t)),
        )
        loss = ctx.op("Sub", t_log_t, ctx.op("Mul", t, xi))
    return _reduce(ctx, loss, reduction, dtype)


def convert_soft_margin_loss(ctx: ConversionContext, x: Value, target: Value, reduction: int = MEAN) -> str:
    dtype, cd = _float_dtypes(ctx)
    z = ctx.op("Mul", ctx.op("Neg", ctx.cast(x, cd)), ctx.cast(target, cd))
    z = _rounded(ctx, z, dtype, cd)
    loss = ctx.op("Log", ctx.op("Add", _c(ctx, 1.0, cd), _exp(ctx, z, dtype, cd)))
    return _reduce(ctx, loss, reduction, dtype)


# ---- margin losses ---------------------------------------------------------------------------------


def convert_hinge_embedding_loss(
    ctx: ConversionContext, x: Value, target: Value, margin: float = 1.0, reduction: int = MEAN
) -> str:
    dtype, cd = _float_dtypes(ctx)
    xi, t = ctx.cast(x, cd), ctx.cast(target, cd)
    zero = _c(ctx, 0.0, cd)
    margin_part = _clamp_min0(ctx, ctx.op("Sub", _c(ctx, margin, cd), xi), cd)
    not_pos = ctx.op("Not", ctx.op("Equal", t, _c(ctx, 1.0, cd)))
    not_neg = ctx.op("Not", ctx.op("Equal", t, _c(ctx, -1.0, cd)))
    loss = ctx.op("Add", ctx.op("Where", not_pos, margin_part, zero), ctx.op("Where", not_neg, xi, zero))
    return _reduce(ctx, loss, reduction, dtype)


def convert_margin_ranking_loss(
    ctx: ConversionContext, x1: Value, x2: Value, target: Value, margin: float = 0.0, reduction: int = MEAN
) -> str:
    dtype, cd = _float_dtypes(ctx)
    diff = ctx.op("Sub", ctx.cast(x1, cd), ctx.cast(x2, cd))
    z = ctx.op("Add", ctx.op("Mul", ctx.op("Neg", ctx.cast(target, cd)), diff), _c(ctx, margin, cd))
    return _reduce(ctx, _clamp_min0(ctx, z, cd), reduction, dtype)


def convert_cosine_embedding_loss(
    ctx: ConversionContext, x1: Value, x2: Value, target: Value, margin: float = 0.0, reduction: int = MEAN
) -> str:
    dtype, cd = _float_dtypes(ctx)
    a, b = ctx.cast(x1, cd), ctx.cast(x2, cd)
    axis = [max(x1.rank, x2.rank) - 1]
    eps = _c(ctx, 1e-12, cd)  # torch's EPSILON, added to both squared magnitudes
    prod = reduce(ctx, "ReduceSum", ctx.op("Mul", a, b), axis, False)
    m1 = ctx.op("Add", reduce(ctx, "ReduceSum", ctx.op("Mul", a, a), axis, False), eps)
    m2 = ctx.op("Add", reduce(ctx, "ReduceSum", ctx.op("Mul", b, b), axis, False), eps)
    cos = ctx.op("Div", prod, ctx.op("Sqrt", ctx.op("Mul", m1, m2)))
    t = ctx.cast(target, cd)
    zero = _c(ctx, 0.0, cd)
    pos = ctx.op("Sub", _c(ctx, 1.0, cd), cos)
    neg = _clamp_min0(ctx, ctx.op("Sub", cos, _c(ctx, margin, cd)), cd)
    loss = ctx.op(
        "Add",
        ctx.op("Where", ctx.op("Equal", t, _c(ctx, 1.0, cd)), pos, zero),
        ctx.op("Where", ctx.op("Equal", t, _c(ctx, -1.0, cd)), neg, zero),
    )
    return _reduce(ctx, loss, reduction, dtype)


def convert_triplet_margin_loss(
    ctx: ConversionContext,
    anchor: Value,
    positive: Value,
    negative: Value,
    margin: float = 1.0,
    p: float = 2.0,
    eps: float = 1e-6,
    swap: bool = False,
    reduction: int = MEAN,
) -> str:
    dtype, cd = _float_dtypes(ctx)
    d_pos = _pairwise(ctx, anchor, positive, p, eps, cd)
    d_neg = _pairwise(ctx, anchor, negative, p, eps, cd)
    if swap:
        d_neg = ctx.op("Min", d_neg, _pairwise(ctx, positive, negative, p, eps, cd))
    z = ctx.op("Sub", ctx.op("Add", _c(ctx, margin, cd), d_pos), d_neg)
    return _reduce(ctx, _clamp_min0(ctx, z, cd), reduction, dtype)


def _class_axis(x: Value) -> int:
    return 1 if x.rank >= 2 else 0


def _class_count(ctx: ConversionContext, x: str, axis: int) -> str:
    """The size of ``x`` along ``axis`` as a 0-d int64 (a Shape slice: works for symbolic dims)."""
    return ctx.op("Squeeze", ctx.op("Shape", x, start=axis, end=axis + 1), ctx.i64([0]))


def _positions(ctx: ConversionContext, count: str) -> str:
    return ctx.op("Range", ctx.const(0, torch.int64), count, ctx.const(1, torch.int64))


def _as_rows(ctx: ConversionContext, x: Value, target: Value, cd: torch.dtype) -> tuple[str, str, int]:
    """Input as (N, C) or (C,), target as (N, 1) or (1,) int64 indices, and the class axis."""
    xi = ctx.cast(x, cd)
    if x.rank == 0:
        xi = unsqueeze(ctx, xi, [0])
    axis = max(x.rank, 1) - 1
    t = ctx.op("Reshape", ctx.cast(target, torch.int64), ctx.i64([-1, 1] if axis == 1 else [1]))
    return xi, t, axis


def convert_multi_margin_loss(
    ctx: ConversionContext,
    x: Value,
    target: Value,
    p: Any = 1,
    margin: Any = 1,
    weight: Value | None = None,
    reduction: int = MEAN,
) -> str:
    dtype, cd = _float_dtypes(ctx)
    if p not in (1, 2):
        raise ctx.error(f"multi_margin_loss supports p=1 or p=2, got p={p!r}")
    xi, t, axis = _as_rows(ctx, x, target, cd)
    picked = ctx.op("GatherElements", xi, t, axis=axis)
    h = _clamp_min0(ctx, ctx.op("Add", ctx.op("Sub", _c(ctx, float(margin), cd), picked), xi), cd)
    if p == 2:
        h = ctx.op("Mul", h, h)
    if weight is not None:
        h = ctx.op("Mul", h, ctx.op("Gather", ctx.cast(weight, cd), t, axis=0))
    count = _class_count(ctx, xi, axis)
    # the target class itself does not count
    h = ctx.op("Where", ctx.op("Equal", _positions(ctx, count), t), _c(ctx, 0.0, cd), h)
    loss = ctx.op("Div", reduce(ctx, "ReduceSum", h, [axis], False), ctx.cast(count, cd))
    if reduction == NONE:
        loss = ctx.op("Reshape", loss, ctx.shape_tensor(ctx.out_shape))
    return _reduce(ctx, loss, reduction, dtype)


def convert_multilabel_margin_loss(
    ctx: ConversionContext, x: Value, target: Value, reduction: int = MEAN
) -> str:
    return _multilabel_margin(ctx, x, target, reduction)[0]


def convert_multilabel_margin_loss_forward(
    ctx: ConversionContext, x: Value, target: Value, reduction: int
) -> list[str]:
    return _multilabel_margin(ctx, x, target, reduction)


def _multilabel_margin(ctx: ConversionContext, x: Value, target: Value, reduction: int) -> list[str]:
    dtype, cd = _float_dtypes(ctx)
    xi, t = ctx.cast(x, cd), ctx.cast(target, torch.int64)
    if x.rank == 0:
        xi, t = unsqueeze(ctx, xi, [0]), unsqueeze(ctx, t, [0])
    axis = max(x.rank, 1) - 1
    zero_i, one = ctx.const(0, torch.int64), _c(ctx, 1.0, cd)
    # targets are the prefix of ``target`` before its first negative entry
    bad = ctx.cast(ctx.op("Less", t, zero_i), torch.int64)
    valid = ctx.op("Equal", ctx.op("CumSum", bad, ctx.const(axis, torch.int64)), zero_i)
    safe_t = ctx.op("Where", valid, t, zero_i)
    classes = _positions(ctx, _class_count(ctx, xi, axis))
    # is_target[.., k] = any j: valid[.., j] and t[.., j] == k
    hit = ctx.op(
        "And", unsqueeze(ctx, valid, [axis + 1]), ctx.op("Equal", unsqueeze(ctx, safe_t, [axis + 1]), classes)
    )
    is_target = ctx.cast(reduce(ctx, "ReduceMax", ctx.cast(hit, torch.int32), [axis], False), cd)
    picked = ctx.op("GatherElements", xi, safe_t, axis=axis)  # x[t[j]]
    # max(0, 1 - x[t[j]] + x[k]) for every pair (j, k), kept where j is a target slot and k no target
    z = ctx.op("Add", ctx.op("Sub", one, unsqueeze(ctx, picked, [axis + 1])), unsqueeze(ctx, xi, [axis]))
    keep = ctx.op(
        "Mul",
        unsqueeze(ctx, ctx.cast(valid, cd), [axis + 1]),
        unsqueeze(ctx, ctx.op("Sub", one, is_target), [axis]),
    )
    total = reduce(ctx, "ReduceSum", ctx.op("Mul", _clamp_min0(ctx, z, cd), keep), [axis, axis + 1], False)
    loss = ctx.op("Div", total, ctx.cast(_class_count(ctx, xi, axis), cd))
    if reduction == NONE:
        loss = ctx.op("Reshape", loss, ctx.shape_tensor(ctx.out_shape))
    if x.rank == 0:
        is_target = ctx.op("Reshape", is_target, ctx.i64([]))
    return [_reduce(ctx, loss, reduction, dtype), ctx.cast(is_target, dtype)]


# ---- classification: nll and cross entropy ---------------------------------------------------------


def _nll_terms(
    ctx: ConversionContext,
    logp: str,
    rank: int,
    target: Value,
    weight: Value | None,
    ignore_index: int,
    cd: torch.dtype,
) -> tuple[str, str]:
    """(-w[t] * logp[.., t, ..] per target element, w[t] per element), both 0 where t == ignore_index."""
    t = ctx.cast(target, torch.int64)
    keep = ctx.op("Not", ctx.op("Equal", t, ctx.const(int(ignore_index), torch.int64)))
    safe_t = ctx.op("Where", keep, t, ctx.const(0, torch.int64))
    axis = 1 if rank >= 2 else 0
    picked = ctx.op("GatherElements", logp, unsqueeze(ctx, safe_t, [axis]), axis=axis)
    picked = ctx.op("Squeeze", picked, ctx.i64([axis]))
    zero = _c(ctx, 0.0, cd)
    if weight is None:
        w = ctx.cast(keep, cd)
    else:
        w = ctx.op("Where", keep, ctx.op("Gather", ctx.cast(weight, cd), safe_t, axis=0), zero)
    return ctx.op("Neg", ctx.op("Mul", picked, w)), w


def _nll(
    ctx: ConversionContext,
    x: Value,
    target: Value,
    weight: Value | None,
    reduction: int,
    ignore_index: int,
    cd: torch.dtype,
) -> tuple[str, str]:
    """(loss before the final cast, total weight)."""
    loss, w = _nll_terms(ctx, ctx.cast(x, cd), x.rank, target, weight, ignore_index, cd)
    total = reduce(ctx, "ReduceSum", w, None, False)
    if reduction == NONE:
        return loss, total
    summed = reduce(ctx, "ReduceSum", loss, None, False)
    if reduction == SUM:
        return summed, total
    if reduction == MEAN:
        return ctx.op("Div", summed, total), total
    raise ctx.error(f"reduction must be 0 (none), 1 (mean) or 2 (sum), got {reduction!r}")


def convert_nll_loss(
    ctx: ConversionContext,
    x: Value,
    target: Value,
    weight: Value | None = None,
    reduction: int = MEAN,
    ignore_index: int = -100,
) -> str:
    dtype, cd = _float_dtypes(ctx)
    return ctx.cast(_nll(ctx, x, target, weight, reduction, ignore_index, cd)[0], dtype)


def convert_nll_loss_forward(
    ctx: ConversionContext, x: Value, target: Value, weight: Value | None, reduction: int, ignore_index: int
) -> list[str]:
    dtype, cd = _float_dtypes(ctx)
    loss, total = _nll(ctx, x, target, weight, reduction, ignore_index, cd)
    if reduction == NONE:
        # torch leaves total_weight at 0 when nothing is reduced
        total = _c(ctx, 0.0, cd)
    return [ctx.cast(loss, dtype), ctx.cast(total, dtype)]


def convert_cross_entropy_loss(
    ctx: ConversionContext,
    x: Value,
    target: Value,
    weight: Value | None = None,
    reduction: int = MEAN,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
) -> str:
    dtype, cd = _float_dtypes(ctx)
    axis = _class_axis(x)
    logp = ctx.op("LogSoftmax", ctx.cast(x, cd), axis=axis)
    if target.dtype.is_floating_point:
        return _cross_entropy_probs(ctx, x, logp, target, weight, reduction, label_smoothing, dtype, cd)
    loss, w = _nll_terms(ctx, logp, x.rank, target, weight, ignore_index, cd)
    nll = _nll_reduce(ctx, loss, w, reduction)
    if label_smoothing <= 0:
        return ctx.cast(nll, dtype)
    # smooth term: -sum_c w_c logp_c, 0 at ignored targets, mean divides by the same total weight
    weighted = logp if weight is None else ctx.op("Mul", logp, _class_shaped(ctx, weight, x.rank, axis, cd))
    smooth = ctx.op("Neg", reduce(ctx, "ReduceSum", weighted, [axis], False))
    t = ctx.cast(target, torch.int64)
    ignored = ctx.op("Equal", t, ctx.const(int(ignore_index), torch.int64))
    smooth = ctx.op("Where", ignored, _c(ctx, 0.0, cd), smooth)
    smooth = _nll_reduce(ctx, smooth, w, reduction)
    eps = float(label_smoothing)
    share = ctx.op("Div", _c(ctx, eps, cd), _class_total(ctx, x, axis, cd))
    result = ctx.op("Add", ctx.op("Mul", _c(ctx, 1.0 - eps, cd), nll), ctx.op("Mul", smooth, share))
    return ctx.cast(result, dtype)


def _class_total(ctx: ConversionContext, x: Value, axis: int, cd: torch.dtype) -> str:
    """The number of classes as a 0-d float (a constant when static)."""
    n = x.shape[axis]
    if isinstance(n, int):
        return _c(ctx, float(n), cd)
    return ctx.cast(_class_count(ctx, x.name, axis), cd)


def _nll_reduce(ctx: ConversionContext, loss: str, w: str, reduction: int) -> str:
    if reduction == NONE:
        return loss
    summed = reduce(ctx, "ReduceSum", loss, None, False)
    if reduction == SUM:
        return summed
    if reduction == MEAN:
        return ctx.op("Div", summed, reduce(ctx, "ReduceSum", w, None, False))
    raise ctx.error(f"reduction must be 0 (none), 1 (mean) or 2 (sum), got {reduction!r}")


def _class_shaped(ctx: ConversionContext, weight: Value, rank: int, axis: int, cd: torch.dtype) -> str:
    """A (C,) weight shaped to broadcast along the class axis of a rank-``rank`` input."""
    w = ctx.cast(weight, cd)
    trailing = rank - axis - 1
    return unsqueeze(ctx, w, list(range(1, trailing + 1))) if trailing > 0 else w


def _cross_entropy_probs(
    ctx: ConversionContext,
    x: Value,
    logp: str,
    target: Value,
    weight: Value | None,
    reduction: int,
    label_smoothing: float,
    dtype: torch.dtype,
    cd: torch.dtype,
) -> str:
    """Class-probability targets: -sum_c w_c t_c logp_c; mean divides by the element count over C."""
    axis = _class_axis(x)
    t = ctx.cast(target, cd)
    if label_smoothing > 0:
        t = ctx.op(
            "Add",
            ctx.op("Mul", t, _c(ctx, 1.0 - label_smoothing, cd)),
            ctx.op("Div", _c(ctx, label_smoothing, cd), _class_total(ctx, x, axis, cd)),
        )
    prod = ctx.op("Mul", logp, t)
    if weight is not None:
        prod = ctx.op("Mul", prod, _class_shaped(ctx, weight, x.rank, axis, cd))
    per_item = ctx.op("Neg", reduce(ctx, "ReduceSum", prod, [axis], False))
    if reduction == MEAN and x.rank >= 2:
        # torch divides the sum by numel / C, the batch (and spatial) size: the mean over per_item
        return ctx.cast(ctx.op("ReduceMean", per_item, keepdims=0), dtype)
    return _reduce(ctx, per_item, reduction, dtype)


# ---- distances -------------------------------------------------------------------------------------


def convert_dist(ctx: ConversionContext, x: Value, other: Value, p: Any = 2) -> str:
    dtype, cd = _float_dtypes(ctx)
    diff = ctx.op("Sub", ctx.cast(x, cd), ctx.cast(other, cd))
    if max(x.rank, other.rank) == 0:
        diff = unsqueeze(ctx, diff, [0])
    return ctx.cast(_pnorm(ctx, diff, float(p), None, False, cd), dtype)


def convert_pdist(ctx: ConversionContext, x: Value, p: float = 2.0) -> str:
    dtype, cd = _float_dtypes(ctx)
    n = x.shape[0]
    if not isinstance(n, int):
        raise ctx.error("pdist needs a static number of rows (its output has n * (n - 1) / 2 entries)")
    if p < 0:
        raise ctx.error(f"pdist needs p >= 0, got {p}")
    rows = [i for i in range(n) for _ in range(i + 1, n)]
    cols = [j for i in range(n) for j in range(i + 1, n)]
    xi = ctx.cast(x, cd)
    if not rows:
        return ctx.const(torch.zeros(0), dtype)
    diff = ctx.op(
        "Sub", ctx.op("Gather", xi, ctx.i64(rows), axis=0), ctx.op("Gather", xi, ctx.i64(cols), axis=0)
    )
    return ctx.cast(_pnorm(ctx, diff, float(p), [1], False, cd), dtype)


# ---- linear_cross_entropy's chunked custom ops -----------------------------------------------------
# torch.nn.functional.linear_cross_entropy(options=...) calls torch_nn._linear_cross_entropy_batch_chunked
# (and its _no_reduction twin): cross_entropy(linear(input, weight, bias), target, ...) computed in batch
# chunks to bound memory. One graph computes the same loss; its other outputs are gradient buffers that
# the forward leaves empty.

_REDUCTIONS = {"none": NONE, "mean": MEAN, "sum": SUM}


def _logits(ctx: ConversionContext, x: Value, w: Value, bias: Value | None, cd: torch.dtype) -> Value:
    y = ctx.op("MatMul", ctx.cast(x, cd), ctx.op("Transpose", ctx.cast(w, cd), perm=[1, 0]))
    if bias is not None:
        y = ctx.op("Add", y, ctx.cast(bias, cd))
    return Value(y, cd, (*x.shape[:-1], w.shape[0]))


def convert_linear_cross_entropy_chunked(
    ctx: ConversionContext,
    x: Value,
    linear_weight: Value,
    target: Value,
    linear_bias: Value | None,
    weight: Value | None,
    reduction: str,
    ignore_index: int,
    label_smoothing: float,
    *options: Any,
) -> list[str]:
    if reduction not in _REDUCTIONS:
        raise ctx.error(f"linear_cross_entropy: reduction must be 'none', 'mean' or 'sum', got {reduction!r}")
    _, cd = _float_dtypes(ctx)
    logits = _logits(ctx, x, linear_weight, linear_bias, cd)
    loss = convert_cross_entropy_loss(
        ctx, logits, target, weight, _REDUCTIONS[reduction], ignore_index, label_smoothing
    )
    buffers = [ctx.const(torch.zeros(tuple(v.shape)), v.dtype) for v in ctx.out[1:]]
    return [loss, *buffers]


def convert_linear_cross_entropy_chunked_none(
    ctx: ConversionContext,
    x: Value,
    linear_weight: Value,
    target: Value,
    linear_bias: Value | None,
    weight: Value | None,
    ignore_index: int,
    *options: Any,
) -> str:
    _, cd = _float_dtypes(ctx)
    logits = _logits(ctx, x, linear_weight, linear_bias, cd)
    return convert_cross_entropy_loss(ctx, logits, target, weight, NONE, ignore_index, 0.0)


CONVERTERS: dict[str, Converter] = {
    "aten.mse_loss.default": convert_mse_loss,
    "aten.l1_loss.default": convert_l1_loss,
    "aten.smooth_l1_loss.default": convert_smooth_l1_loss,
    "aten.huber_loss.default": convert_huber_loss,
    "aten.poisson_nll_loss.default": convert_poisson_nll_loss,
    "aten.binary_cross_entropy.default": convert_binary_cross_entropy,
    "aten.binary_cross_entropy_with_logits.default": convert_binary_cross_entropy_with_logits,
    "aten.kl_div.default": convert_kl_div,
    "aten.soft_margin_loss.default": convert_soft_margin_loss,
    "aten.hinge_embedding_loss.default": convert_hinge_embedding_loss,
    "aten.margin_ranking_loss.default": convert_margin_ranking_loss,
    "aten.cosine_embedding_loss.default": convert_cosine_embedding_loss,
    "aten.triplet_margin_loss.default": convert_triplet_margin_loss,
    "aten.multi_margin_loss.default": convert_multi_margin_loss,
    "aten.multilabel_margin_loss.default": convert_multilabel_margin_loss,
    "aten.multilabel_margin_loss_forward.default": convert_multilabel_margin_loss_forward,
    "aten.nll_loss.default": convert_nll_loss,
    "aten.nll_loss_nd.default": convert_nll_loss,
    "aten.nll_loss2d.default": convert_nll_loss,
    "aten.nll_loss_forward.default": convert_nll_loss_forward,
    "aten.nll_loss2d_forward.default": convert_nll_loss_forward,
    "aten.cross_entropy_loss.default": convert_cross_entropy_loss,
    "aten.dist.default": convert_dist,
    "aten.pdist.default": convert_pdist,
    "aten._pdist_forward.default": convert_pdist,
    "torch_nn._linear_cross_entropy_batch_chunked.default": convert_linear_cross_entropy_chunked,
    "torch_nn._linear_cross_entropy_batch_chunked_no_reduction.default": convert_linear_cross_entropy_chunked_none,
}
