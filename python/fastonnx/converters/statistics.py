"""Order statistics and counting: kthvalue, median, mode, quantile, unique, histograms, isin, segments.

Everything here rests on one stable ascending sort along an axis in which NaN comes last, as torch
sorts: ONNX TopK breaks ties by the lower index, so sorting a key where NaN maps above +inf gives
torch's order (``_sort``). Where torch's own kernels return an implementation-defined index among equal
values (quickselect in kthvalue / median, std::sort in mode), ours is the lowest (kthvalue, median) or
the last (mode) index of the tied run; values always match.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from fastonnx.context import ConversionContext, Converter, Value
from fastonnx.converters.lib.kernels import NATIVE, opmath_dtype
from fastonnx.converters.lib.ops import normalize_axis, promote, reduce, unsqueeze

aten = torch.ops.aten
i64 = torch.int64


# ---- sorting -------------------------------------------------------------------------------------


def _sort_key(ctx: ConversionContext, x: Value) -> str:
    """A key TopK can sort (float32/float64/int64) whose ascending order is torch's, NaN last."""
    dt = x.dtype
    if not dt.is_floating_point:
        return ctx.cast(x, i64)
    if dt == torch.float64:
        # NaN -> +inf; a real +inf tied with a NaN may then sort after it (float64 has no wider type)
        return ctx.op("Where", ctx.op("IsNaN", x), ctx.const(math.inf, dt), x)
    # float16/bfloat16/float32 are exact in float64, where +inf can move below NaN's +inf
    wide = ctx.cast(x, torch.float64)
    big = ctx.op(
        "Where",
        ctx.op("IsInf", wide, detect_negative=0),
        ctx.const(1.7976931348623157e308, torch.float64),
        wide,
    )
    return ctx.op("Where", ctx.op("IsNaN", wide), ctx.const(math.inf, torch.float64), big)


def _axis_len(ctx: ConversionContext, x: Any, axis: int) -> str:
    """The size of ``x`` along ``axis`` as a 1-element int64 tensor."""
    return ctx.op("Shape", x, start=axis, end=axis + 1)


def _sort(ctx: ConversionContext, x: Value, axis: int, k: Any = None) -> str:
    """The indices of the ``k`` smallest (default: all) along ``axis``, ascending, stable, NaN last."""
    kk = _axis_len(ctx, x, axis) if k is None else k
    _, idx = ctx.op("TopK", _sort_key(ctx, x), kk, axis=axis, largest=0, sorted=1, outputs=2)
    return idx


def _nan_count(ctx: ConversionContext, x: Value, axis: int) -> str | None:
    """NaNs per slice along ``axis`` (kept dim, int64); None for types without NaN."""
    if not x.dtype.is_floating_point:
        return None
    return reduce(ctx, "ReduceSum", ctx.cast(ctx.op("IsNaN", x), i64), [axis], True)


def _pick(ctx: ConversionContext, x: Value, order: str, pos: str, axis: int, keepdim: bool) -> list[str]:
    """(values, indices) of the sorted position ``pos`` (kept dim) of each slice."""
    idx = ctx.op("GatherElements", order, pos, axis=axis)
    val = ctx.op("GatherElements", x, idx, axis=axis)
    if not keepdim:
        idx = ctx.op("Squeeze", idx, ctx.i64([axis]))
        val = ctx.op("Squeeze", val, ctx.i64([axis]))
    return [val, idx]


def _as_vector(ctx: ConversionContext, x: Value) -> Value:
    return Value(ctx.op("Reshape", x, ctx.i64([-1])), x.dtype, (x.shape[0] if x.rank == 1 else -1,))


# ---- kthvalue / median / mode -----------------------------------------------------------------------


def convert_kthvalue(
    ctx: ConversionContext, x: Value, k: Any, dim: int = -1, keepdim: bool = False
) -> list[str]:
    if x.rank == 0:
        return [ctx.op("Identity", x), ctx.const(0, i64)]
    axis = normalize_axis(dim, x.rank)
    kk = ctx.i64([k]) if isinstance(k, int) else ctx.unsqueeze0(ctx.sym_value(k))
    order = _sort(ctx, x, axis, kk)
    # the k-th smallest is the last of the k smallest
    last = ctx.op("Slice", order, ctx.op("Sub", kk, ctx.i64([1])), kk, ctx.i64([axis]))
    val = ctx.op("GatherElements", x, last, axis=axis)
    if not keepdim:
        last = ctx.op("Squeeze", last, ctx.i64([axis]))
        val = ctx.op("Squeeze", val, ctx.i64([axis]))
    return [val, last]


def _median(ctx: ConversionContext, x: Value, axis: int, keepdim: bool, ignore_nan: bool) -> list[str]:
    """torch's lower median along ``axis``: NaN (at the first NaN's index) when a slice has one,
    unless ``ignore_nan``, which takes the lower median of the non-NaN values."""
    order = _sort(ctx, x, axis)
    n = ctx.op("Reshape", _axis_len(ctx, x, axis), ctx.i64([]))
    nans = _nan_count(ctx, x, axis)
    one, two = ctx.const(1, i64), ctx.const(2, i64)
    if nans is None:
        # the lower middle, shaped like one slice of ``order``
        first = ctx.op("Slice", order, ctx.i64([0]), ctx.i64([1]), ctx.i64([axis]))
        pos = ctx.op(
            "Add", ctx.op("Mul", first, ctx.const(0, i64)), ctx.op("Div", ctx.op("Sub", n, one), two)
        )
    elif ignore_nan:
        count = ctx.op("Sub", n, nans)  # all-NaN slices: position 0, a NaN
        pos = ctx.op("Max", ctx.op("Div", ctx.op("Sub", count, one), two), ctx.const(0, i64))
    else:
        # NaNs sort last, stable: the first NaN sits at n - nans
        lower = ctx.op("Div", ctx.op("Sub", n, one), two)
        has_nan = ctx.op("Greater", nans, ctx.const(0, i64))
        pos = ctx.op("Where", has_nan, ctx.op("Sub", n, nans), lower)
    return _pick(ctx, x, order, pos, axis, keepdim)


def convert_median_dim(ctx: ConversionContext, x: Value, dim: int, keepdim: bool = False) -> list[str]:
    return _median_dim(ctx, x, dim, keepdim, False)


def convert_nanmedian_dim(ctx: ConversionContext, x: Value, dim: int, keepdim: bool = False) -> list[str]:
    return _median_dim(ctx, x, dim, keepdim, True)


def _median_dim(ctx: ConversionContext, x: Value, dim: int, keepdim: bool, ignore_nan: bool) -> list[str]:
    if x.rank == 0:
        return [ctx.op("Identity", x), ctx.const(0, i64)]
    _check_nonempty(ctx, x, normalize_axis(dim, x.rank))
    return _median(ctx, x, normalize_axis(dim, x.rank), keepdim, ignore_nan)


def _check_nonempty(ctx: ConversionContext, x: Value, axis: int) -> None:
    if x.shape[axis] == 0:
        raise ctx.error("median / mode of an empty dimension has no value (torch raises)")


def convert_median(ctx: ConversionContext, x: Value) -> str:
    return _median_all(ctx, x, False)


def convert_nanmedian(ctx: ConversionContext, x: Value) -> str:
    return _median_all(ctx, x, True)


def _median_all(ctx: ConversionContext, x: Value, ignore_nan: bool) -> str:
    if x.rank == 0:
        return ctx.op("Identity", x)
    if x.static_shape() is not None and math.prod(x.static_shape() or ()) == 0:
        return ctx.const(math.nan, x.dtype)  # torch gives NaN for an empty tensor
    return _median(ctx, _as_vector(ctx, x), 0, False, ignore_nan)[0]


def convert_mode(ctx: ConversionContext, x: Value, dim: int = -1, keepdim: bool = False) -> list[str]:
    if x.rank == 0:
        return [ctx.op("Identity", x), ctx.const(0, i64)]
    axis = normalize_axis(dim, x.rank)
    _check_nonempty(ctx, x, axis)
    order = _sort(ctx, x, axis)
    s = ctx.op("GatherElements", x, order, axis=axis)
    n = _axis_len(ctx, x, axis)
    ax = ctx.i64([axis])
    zeros = ctx.op("Mul", order, ctx.const(0, i64))  # int64 zeros shaped like x
    # run boundaries in the sorted values (NaN != NaN: each NaN is its own run, as in torch)
    head = ctx.op("Slice", zeros, ctx.i64([0]), ctx.i64([1]), ax)
    rest = ctx.op(
        "Not",
        ctx.op(
            "Equal",
            ctx.op("Slice", s, ctx.i64([1]), n, ax),
            ctx.op("Slice", s, ctx.i64([0]), ctx.op("Sub", n, ctx.i64([1])), ax),
        ),
    )
    run = ctx.op("CumSum", ctx.op("Concat", head, ctx.cast(rest, i64), axis=axis), ctx.const(axis, i64))
    counts = ctx.op(
        "ScatterElements", zeros, run, ctx.op("Add", zeros, ctx.const(1, i64)), axis=axis, reduction="add"
    )
    # the first longest run is the smallest value among the most frequent; its index is the last of it
    best = ctx.op("ArgMax", counts, axis=axis, keepdims=1)
    end = ctx.op(
        "Sub",
        ctx.op("GatherElements", ctx.op("CumSum", counts, ctx.const(axis, i64)), best, axis=axis),
        ctx.const(1, i64),
    )
    return _pick(ctx, x, order, end, axis, keepdim)


# ---- quantiles --------------------------------------------------------------------------------------

_MODES = ("linear", "lower", "higher", "midpoint", "nearest")


def convert_quantile(
    ctx: ConversionContext,
    x: Value,
    q: Any,
    dim: int | None = None,
    keepdim: bool = False,
    *,
    interpolation: str = "linear",
) -> str:
    return _quantile(ctx, x, q, dim, interpolation, ignore_nan=False)


def convert_nanquantile(
    ctx: ConversionContext,
    x: Value,
    q: Any,
    dim: int | None = None,
    keepdim: bool = False,
    *,
    interpolation: str = "linear",
) -> str:
    return _quantile(ctx, x, q, dim, interpolation, ignore_nan=True)


def _quantile(
    ctx: ConversionContext, x: Value, q: Any, dim: int | None, interpolation: str, ignore_nan: bool
) -> str:
    if interpolation not in _MODES:
        raise ctx.error(f"quantile interpolation must be one of {_MODES}, got {interpolation!r}")
    dtype = x.dtype
    if not dtype.is_floating_point:
        raise ctx.error(f"quantile needs a floating point input, got {dtype}")
    # sort along the last axis of (..., n): the reduced dim moved last, or everything flattened
    if dim is None or x.rank == 0:
        data = ctx.op("Reshape", x, ctx.i64([-1]))
        rank = 1
    else:
        axis = normalize_axis(dim, x.rank)
        perm = [i for i in range(x.rank) if i != axis] + [axis]
        data = ctx.op("Transpose", x, perm=perm) if axis != x.rank - 1 else x.name
        rank = x.rank
    last = rank - 1
    vx = Value(data, dtype, (0,) * rank)
    order = _sort(ctx, vx, last)
    sorted_ = ctx.op("GatherElements", data, order, axis=last)
    n = ctx.op("Reshape", _axis_len(ctx, data, last), ctx.i64([]))
    qv = ctx.op("Reshape", ctx.operand(q, dtype), ctx.i64([-1]))  # (Q,)
    nans = reduce(ctx, "ReduceSum", ctx.cast(ctx.op("IsNaN", data), i64), [last], True)  # (..., 1)
    # torch computes ranks in the input's dtype
    if ignore_nan:
        count = ctx.cast(ctx.op("Sub", ctx.op("Sub", n, nans), ctx.const(1, i64)), dtype)
        ranks = ctx.op("Mul", qv, count)
        ranks = ctx.op("Where", ctx.op("Less", ranks, ctx.const(0.0, dtype)), ctx.const(0.0, dtype), ranks)
    else:
        last_index = ctx.cast(ctx.op("Sub", n, ctx.const(1, i64)), dtype)
        ranks = ctx.op("Mul", qv, last_index)
        has_nan = ctx.op("Greater", nans, ctx.const(0, i64))
        ranks = ctx.op("Where", has_nan, last_index, ranks)  # a NaN slice reads its last (NaN) value
    if interpolation == "lower":
        ranks = ctx.op("Floor", ranks)
    elif interpolation == "higher":
        ranks = ctx.op("Ceil", ranks)
    elif interpolation == "nearest":
        ranks = ctx.op("Round", ranks)  # half to even, like torch's round
    below_i = ctx.cast(ranks, i64)
    below = ctx.op("GatherElements", sorted_, _broadcast_idx(ctx, below_i, sorted_, last), axis=last)
    result = below
    if interpolation in ("linear", "midpoint"):
        above_i = ctx.cast(ctx.op("Ceil", ranks), i64)
        above = ctx.op("GatherElements", sorted_, _broadcast_idx(ctx, above_i, sorted_, last), axis=last)
        if interpolation == "linear":
            weight = ctx.op("Sub", ranks, ctx.op("Floor", ranks))
        else:
            weight = ctx.op("Add", ctx.op("Mul", ranks, ctx.const(0.0, dtype)), ctx.const(0.5, dtype))
        result = _lerp(ctx, below, above, _broadcast_idx(ctx, weight, sorted_, last), dtype)
    # (..., Q) -> (Q, ...), then torch's output shape (q's dim dropped when q is a scalar; keepdim)
    if rank > 1:
        result = ctx.op("Transpose", result, perm=[last, *range(last)])
    return ctx.op("Reshape", result, ctx.shape_tensor(ctx.out_shape))


def _broadcast_idx(ctx: ConversionContext, idx: str, data: str, last: int) -> str:
    """``idx`` of shape (..., Q) or (Q,) expanded to data's leading dims with Q last."""
    if last == 0:
        return idx
    lead = ctx.op("Shape", data, start=0, end=last)
    q_len = ctx.op("Shape", idx, start=-1)
    return ctx.op("Expand", idx, ctx.op("Concat", lead, q_len, axis=0))


def _lerp(ctx: ConversionContext, a: str, b: str, w: str, dtype: torch.dtype) -> str:
    """torch.lerp's two-sided formula (exact at both ends), in opmath and rounded once."""
    cd = opmath_dtype(dtype)
    a, b, w = ctx.cast(a, cd), ctx.cast(b, cd), ctx.cast(w, cd)
    diff = ctx.op("Sub", b, a)
    low = ctx.op("Add", a, ctx.op("Mul", w, diff))
    high = ctx.op("Sub", b, ctx.op("Mul", diff, ctx.op("Sub", ctx.const(1.0, cd), w)))
    small = ctx.op("Less", ctx.op("Abs", w), ctx.const(0.5, cd))
    return ctx.cast(ctx.op("Where", small, low, high), dtype)


# ---- membership -------------------------------------------------------------------------------------


def convert_isin(
    ctx: ConversionContext,
    elements: Any,
    test_elements: Any,
    *,
    assume_unique: bool = False,
    invert: bool = False,
) -> str:

    dtype = promote(ctx, elements, test_elements)
    wide = torch.float64 if dtype.is_floating_point else i64
    e = ctx.cast(ctx.operand(elements, dtype), wide)
    t = ctx.op("Reshape", ctx.cast(ctx.operand(test_elements, dtype), wide), ctx.i64([-1]))
    hit = ctx.op("Equal", unsqueeze(ctx, e, [-1]), t)  # (..., M)
    found = ctx.cast(reduce(ctx, "ReduceMax", ctx.cast(hit, torch.int32), [-1], False), torch.bool)
    if _rank(ctx, elements) == 0:
        found = ctx.op("Reshape", found, ctx.i64([]))
    return ctx.op("Not", found) if invert else found


def _rank(ctx: ConversionContext, x: Any) -> int:
    return 0 if not isinstance(x, (Value, str)) else int(ctx.rank(x) or 0)


# ---- unique -----------------------------------------------------------------------------------------


def _empty_i64(ctx: ConversionContext) -> str:
    return ctx.const(torch.zeros(0, dtype=i64), i64)


def _runs(ctx: ConversionContext, starts: str, n: str) -> tuple[str, str, str]:
    """From a (n,) bool "a new run starts here": (start positions, run id per element, run lengths)."""
    positions = ctx.op("Range", ctx.const(0, i64), n, ctx.const(1, i64))
    first = ctx.op("Compress", positions, starts, axis=0)
    run_id = ctx.op("Sub", ctx.op("CumSum", ctx.cast(starts, i64), ctx.const(0, i64)), ctx.const(1, i64))
    ends = ctx.op("Concat", ctx.op("Slice", first, ctx.i64([1]), ctx.i64([2**62])), ctx.unsqueeze0(n), axis=0)
    return first, run_id, ctx.op("Sub", ends, first)


def _run_starts(ctx: ConversionContext, x: str, n: str, axis: int, rank: int) -> str:
    """(n,) bool: slice i along ``axis`` differs from slice i - 1 (always true for i = 0).
    NaN differs from everything, so every NaN is its own run, as in torch."""
    ax = ctx.i64([axis])
    one = ctx.i64([1])
    n1 = ctx.unsqueeze0(n)
    differ = ctx.op(
        "Not",
        ctx.op(
            "Equal",
            ctx.op("Slice", x, one, n1, ax),
            ctx.op("Slice", x, ctx.i64([0]), ctx.op("Sub", n1, one), ax),
        ),
    )
    if rank > 1:
        others = [i for i in range(rank) if i != axis]
        differ = ctx.cast(reduce(ctx, "ReduceMax", ctx.cast(differ, torch.int32), others, False), torch.bool)
    starts = ctx.op("Concat", ctx.const([True], torch.bool), differ, axis=0)
    return ctx.op("Slice", starts, ctx.i64([0]), n1)  # an empty input has no first run


def _flat_len(ctx: ConversionContext, x: str) -> str:
    return ctx.op("Reshape", ctx.op("Size", x), ctx.i64([]))


def convert_unique2(
    ctx: ConversionContext,
    x: Value,
    sorted: bool = True,
    return_inverse: bool = False,
    return_counts: bool = False,
) -> list[str]:
    # torch's CPU kernel sorts whatever ``sorted`` says; so do we
    flat = Value(ctx.op("Reshape", x, ctx.i64([-1])), x.dtype, (-1,))
    n = _flat_len(ctx, flat.name)
    order = _sort(ctx, flat, 0)
    values = ctx.op("GatherElements", flat.name, order, axis=0)
    starts = _run_starts(ctx, values, n, 0, 1)
    _, run_id, counts = _runs(ctx, starts, n)
    out = ctx.op("Compress", values, starts, axis=0)
    inverse = _empty_i64(ctx)
    if return_inverse:
        # the run of sorted element i belongs to original element order[i]
        inverse = ctx.op("ScatterElements", ctx.op("Mul", order, ctx.const(0, i64)), order, run_id, axis=0)
        inverse = ctx.op("Reshape", inverse, ctx.op("Shape", x))
    return [out, inverse, counts if return_counts else _empty_i64(ctx)]


def convert_unique_consecutive(
    ctx: ConversionContext,
    x: Value,
    return_inverse: bool = False,
    return_counts: bool = False,
    dim: int | None = None,
) -> list[str]:
    if dim is None or x.rank == 0:
        data, axis, rank = ctx.op("Reshape", x, ctx.i64([-1])), 0, 1
    else:
        data, axis, rank = x.name, normalize_axis(dim, x.rank), x.rank
    n = ctx.op("Reshape", _axis_len(ctx, data, axis), ctx.i64([]))
    starts = _run_starts(ctx, data, n, axis, rank)
    _, run_id, counts = _runs(ctx, starts, n)
    out = ctx.op("Compress", data, starts, axis=axis)
    inverse = _empty_i64(ctx)
    if return_inverse:
        inverse = run_id if dim is not None and x.rank else ctx.op("Reshape", run_id, ctx.op("Shape", x))
    return [out, inverse, counts if return_counts else _empty_i64(ctx)]


def convert_unique_dim(
    ctx: ConversionContext,
    x: Value,
    dim: int,
    sorted: bool = True,
    return_inverse: bool = False,
    return_counts: bool = False,
) -> list[str]:
    # ONNX Unique with an axis sorts the slices lexicographically, as torch's unique_dim does (torch's
    # CPU kernel sorts whatever ``sorted`` says). Slices holding NaN may order differently: onnxruntime
    # compares with <, where NaN is unordered.
    axis = normalize_axis(dim, max(x.rank, 1))
    data = x.name
    if x.dtype not in NATIVE["Unique"]:
        data = ctx.cast(x, torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else i64)
    y, _, inverse, counts = ctx.op("Unique", data, axis=axis, sorted=1, outputs=4)
    return [
        ctx.cast(y, x.dtype),
        inverse if return_inverse else _empty_i64(ctx),
        counts if return_counts else _empty_i64(ctx),
    ]


# ---- histograms -------------------------------------------------------------------------------------
# torch bins an element by a linear estimate of its bin in the input's dtype, int((x - lo) * bins /
# (hi - lo)); histc stops there, histogram / histogramdd then correct the estimate by an upper_bound
# search over the neighbouring edges. Elements outside [lo, hi] (and NaN) are skipped; the last bin
# includes its right edge.


_INTEGER_HIST = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def _hist_dtype(ctx: ConversionContext, x: Value) -> torch.dtype:
    if not x.dtype.is_floating_point or x.dtype == torch.bfloat16:
        raise ctx.error(f"histograms are converted for float16 / float32 / float64 inputs, got {x.dtype}")
    return x.dtype


def _outer_edges(
    ctx: ConversionContext, col: str, lo: float | None, hi: float | None, widen: float, dtype: torch.dtype
) -> tuple[str, str]:
    """(leftmost, rightmost) 0-d edges: the given range, else the data's min / max; equal ones are
    pushed apart by ``widen`` each way (histc: 1, histogram: 0.5)."""
    if lo is not None and hi is not None and lo != hi:
        return ctx.const(lo, dtype), ctx.const(hi, dtype)
    if lo is not None and hi is not None and lo == hi and widen == 0.5:
        return ctx.const(lo - widen, dtype), ctx.const(hi + widen, dtype)
    left = ctx.op("ReduceMin", col, keepdims=0)
    right = ctx.op("ReduceMax", col, keepdims=0)
    if widen == 0.5:
        # histogram of no element: torch's range is [0, 1]
        empty = ctx.op("Equal", ctx.op("Size", col), ctx.const(0, i64))
        left = ctx.op("Where", empty, ctx.const(0.0, dtype), left)
        right = ctx.op("Where", empty, ctx.const(1.0, dtype), right)
    same = ctx.op("Equal", left, right)
    w = ctx.const(widen, dtype)
    return ctx.op("Where", same, ctx.op("Sub", left, w), left), ctx.op(
        "Where", same, ctx.op("Add", right, w), right
    )


def _linspace(ctx: ConversionContext, start: str, end: str, steps: int, dtype: torch.dtype) -> str:
    """torch.linspace's CPU formula: from the start below the middle, from the end above it."""
    step = ctx.op("Div", ctx.op("Sub", end, start), ctx.const(float(steps - 1), dtype))
    idx = ctx.const(torch.arange(steps, dtype=torch.float64), dtype)
    back = ctx.const(torch.arange(steps - 1, -1, -1, dtype=torch.float64), dtype)
    low = ctx.op("Add", start, ctx.op("Mul", step, idx))
    high = ctx.op("Sub", end, ctx.op("Mul", step, back))
    first_half = ctx.const([i < steps // 2 for i in range(steps)], torch.bool)
    return ctx.op("Where", first_half, low, high)


def _estimate(ctx: ConversionContext, col: str, left: str, right: str, bins: int, dtype: torch.dtype) -> str:
    """int((x - left) * bins / (right - left)) clamped to [0, bins] (in-range elements only matter).

    torch rounds each step to the input's dtype; float16 steps run in float32 and are rounded back,
    which gives the correctly rounded float16 result (onnxruntime's float16 kernels may not)."""
    cd = opmath_dtype(dtype)

    def step(op: str, a: str, b: str) -> str:
        r = ctx.op(op, ctx.cast(a, cd), ctx.cast(b, cd))
        return r if cd == dtype else ctx.cast(ctx.cast(r, dtype), cd)

    pos = step(
        "Div", step("Mul", step("Sub", col, left), ctx.const(float(bins), dtype)), step("Sub", right, left)
    )
    pos = ctx.op("Where", ctx.op("IsNaN", pos), ctx.const(0.0, cd), pos)
    pos = ctx.op("Clip", pos, ctx.const(0.0, cd), ctx.const(float(bins), cd))
    return ctx.cast(pos, i64)


def _local_search(ctx: ConversionContext, col: str, edges: str, pos: str, bins: int) -> str:
    """upper_bound over edges[max(0, pos - 1) : min(pos + 2, bins + 1)], minus one."""
    pos_min = ctx.op("Max", ctx.op("Sub", pos, ctx.const(1, i64)), ctx.const(0, i64))
    pos_max = ctx.op("Min", ctx.op("Add", pos, ctx.const(2, i64)), ctx.const(bins + 1, i64))
    count = None
    for offset in range(3):
        j = ctx.op("Add", pos_min, ctx.const(offset, i64))
        edge = ctx.op("Gather", edges, ctx.op("Min", j, ctx.const(bins, i64)), axis=0)
        le = ctx.op("And", ctx.op("Less", j, pos_max), ctx.op("LessOrEqual", edge, col))
        le = ctx.cast(le, i64)
        count = le if count is None else ctx.op("Add", count, le)
    return ctx.op("Sub", ctx.op("Add", pos_min, count), ctx.const(1, i64))


def _binary_search(ctx: ConversionContext, col: str, edges: str) -> str:
    """upper_bound over all edges, minus one: the number of edges <= x, minus one."""
    le = ctx.op("LessOrEqual", unsqueeze(ctx, edges, [0]), unsqueeze(ctx, col, [-1]))
    return ctx.op("Sub", reduce(ctx, "ReduceSum", ctx.cast(le, i64), [-1], False), ctx.const(1, i64))


def _finish_bin(
    ctx: ConversionContext, col: str, pos: str, left: str, right: str, bins: Any
) -> tuple[str, str]:
    """(bin index clamped to the last bin, in-range mask)."""
    inside = ctx.op("And", ctx.op("GreaterOrEqual", col, left), ctx.op("LessOrEqual", col, right))
    last = bins if isinstance(bins, str) else ctx.const(bins, i64)
    pos = ctx.op("Where", ctx.op("Equal", pos, last), ctx.op("Sub", last, ctx.const(1, i64)), pos)
    pos = ctx.op("Where", inside, pos, ctx.const(0, i64))  # skipped elements add 0 to bin 0
    return pos, inside


def _accumulate(
    ctx: ConversionContext, flat_index: str, inside: str, weight: str | None, size: Any, dtype: torch.dtype
) -> str:
    """Sum of weights (or ones) of the in-range elements per flat bin, in float32 / float64."""
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    w = (
        ctx.cast(inside, acc)
        if weight is None
        else ctx.op("Where", inside, ctx.cast(weight, acc), ctx.const(0.0, acc))
    )
    zeros = ctx.op(
        "ConstantOfShape",
        ctx.shape_tensor([size]) if not isinstance(size, str) else ctx.unsqueeze0(size),
        value=ctx.tensor_attr(0.0, acc),
    )
    return ctx.op("ScatterElements", zeros, flat_index, w, axis=0, reduction="add")


def convert_histc(ctx: ConversionContext, x: Value, bins: int = 100, min: Any = 0, max: Any = 0) -> str:
    col = ctx.op("Reshape", x, ctx.i64([-1]))
    if x.dtype in _INTEGER_HIST:
        # torch's integer histc (CUDA's kernel; a meta-device model's code picks it, as transformers'
        # MoE routing loss does) works in the input's integers: the range truncated to ints, the bin
        # int((x - lo) * bins / (hi - lo)) by integer division. In-range terms are >= 0, so float64
        # division then truncation gives the same bin while (x - lo) * bins < 2**52 (int32 inputs with
        # up to 2**20 bins).
        dtype = torch.float64
        col = ctx.cast(col, dtype)
        lo, hi = float(int(min)), float(int(max))
    else:
        dtype = _hist_dtype(ctx, x)
        lo, hi = float(min), float(max)
    if lo == hi and x.static_shape() is not None and math.prod(x.static_shape() or ()) == 0:
        left, right = ctx.const(lo - 1, dtype), ctx.const(hi + 1, dtype)
    else:
        left, right = _outer_edges(ctx, col, None if lo == hi else lo, None if lo == hi else hi, 1.0, dtype)
    if lo > hi:
        raise ctx.error(f"histc needs min <= max, got min={lo} max={hi}")
    pos = _estimate(ctx, col, left, right, bins, dtype)
    pos, inside = _finish_bin(ctx, col, pos, left, right, bins)
    return ctx.cast(_accumulate(ctx, pos, inside, None, bins, dtype), x.dtype)


def _density(ctx: ConversionContext, hist: str, edges: list[str], shape: list[Any]) -> str:
    hist = ctx.op("Div", hist, reduce(ctx, "ReduceSum", hist, None, False))
    for d, e in enumerate(edges):
        n = ctx.op("Shape", e)
        lengths = ctx.op(
            "Sub",
            ctx.op("Slice", e, ctx.i64([1]), n),
            ctx.op("Slice", e, ctx.i64([0]), ctx.op("Sub", n, ctx.i64([1]))),
        )
        view = [1] * len(shape)
        view[d] = -1
        hist = ctx.op("Div", hist, ctx.op("Reshape", lengths, ctx.i64(view)))
    return hist


def _histogramdd(
    ctx: ConversionContext,
    x: Value,
    bins: list[Any],
    ranges: list[float] | None,
    weight: Value | None,
    density: bool,
) -> tuple[str, list[str]]:
    """hist (float32/float64, shape = bin counts) and the edges of each dim, for x of shape (..., D)."""
    dtype = _hist_dtype(ctx, x)
    dims = len(bins)
    static = x.static_shape()
    if static is not None and math.prod(static) == 0:
        return _empty_histogram(ctx, bins, ranges, density, dtype)
    points = ctx.op("Reshape", x, ctx.i64([-1, dims]))
    w = None if weight is None else ctx.op("Reshape", weight, ctx.i64([-1]))
    flat: str | None = None
    shape: list[Any] = []
    edges_out: list[str] = []
    inside_all: str | None = None
    for d, b in enumerate(bins):
        col = ctx.op(
            "Squeeze", ctx.op("Slice", points, ctx.i64([d]), ctx.i64([d + 1]), ctx.i64([1])), ctx.i64([1])
        )
        if isinstance(b, (Value, str)):
            edges = ctx.cast(b, dtype)
            nb = ctx.op("Sub", ctx.op("Reshape", ctx.op("Shape", edges), ctx.i64([])), ctx.const(1, i64))
            left = ctx.op("Gather", edges, ctx.const(0, i64), axis=0)
            right = ctx.op("Gather", edges, ctx.const(-1, i64), axis=0)
            pos, inside = _finish_bin(ctx, col, _binary_search(ctx, col, edges), left, right, nb)
            count: Any = b.shape[0] - 1 if isinstance(b, Value) and isinstance(b.shape[0], int) else nb
        else:
            lo = hi = None
            if ranges is not None:
                lo, hi = float(ranges[2 * d]), float(ranges[2 * d + 1])
            if lo is not None and hi is not None:
                left, right = _outer_edges(ctx, col, lo, hi, 0.5, dtype)
                start, end = (lo - 0.5, hi + 0.5) if lo == hi else (lo, hi)
                edges = ctx.const(torch.linspace(start, end, int(b) + 1, dtype=dtype), dtype)
            else:
                left, right = _outer_edges(ctx, col, None, None, 0.5, dtype)
                edges = _linspace(ctx, left, right, int(b) + 1, dtype)
            # the search reads the outer edges from the edge tensor, as torch does
            left = ctx.op("Gather", edges, ctx.const(0, i64), axis=0)
            right = ctx.op("Gather", edges, ctx.const(int(b), i64), axis=0)
            pos = _local_search(ctx, col, edges, _estimate(ctx, col, left, right, int(b), dtype), int(b))
            pos, inside = _finish_bin(ctx, col, pos, left, right, int(b))
            count = int(b)
        edges_out.append(edges)
        shape.append(count)
        inside_all = inside if inside_all is None else ctx.op("And", inside_all, inside)
        flat = pos if flat is None else ctx.op("Add", ctx.op("Mul", flat, _count_value(ctx, count)), pos)
    assert flat is not None and inside_all is not None
    flat = ctx.op("Where", inside_all, flat, ctx.const(0, i64))
    total = _count_value(ctx, shape[0])
    for c in shape[1:]:
        total = ctx.op("Mul", total, _count_value(ctx, c))
    hist = _accumulate(ctx, flat, inside_all, w, ctx.op("Reshape", total, ctx.i64([])), dtype)
    hist = ctx.op(
        "Reshape", hist, ctx.op("Concat", *[ctx.unsqueeze0(_count_value(ctx, c)) for c in shape], axis=0)
    )
    if density:
        hist = _density(ctx, hist, [ctx.cast(e, ctx.dtype(hist) or torch.float32) for e in edges_out], shape)
    return ctx.cast(hist, dtype), edges_out


def _empty_histogram(
    ctx: ConversionContext, bins: list[Any], ranges: list[float] | None, density: bool, dtype: torch.dtype
) -> tuple[str, list[str]]:
    """No element: every bin is 0 (NaN with density, 0 / 0); edges span the range or [0, 1]."""
    edges: list[str] = []
    shape: list[Any] = []
    for d, b in enumerate(bins):
        if isinstance(b, (Value, str)):
            edges.append(ctx.op("Identity", b))
            shape.append(ctx.op("Sub", ctx.op("Shape", b), ctx.i64([1])))
            continue
        lo, hi = (float(ranges[2 * d]), float(ranges[2 * d + 1])) if ranges is not None else (0.0, 1.0)
        if lo == hi:
            lo, hi = lo - 0.5, hi + 0.5
        edges.append(ctx.const(torch.linspace(lo, hi, int(b) + 1, dtype=dtype), dtype))
        shape.append(ctx.i64([int(b)]))
    dims = ctx.op("Concat", *shape, axis=0)
    hist = ctx.op("ConstantOfShape", dims, value=ctx.tensor_attr(math.nan if density else 0.0, dtype))
    return hist, edges


def _count_value(ctx: ConversionContext, c: Any) -> str:
    return ctx.const(c, i64) if isinstance(c, int) else c


def _column(ctx: ConversionContext, x: Value) -> Value:
    """x flattened to (N, 1) points; N stays static when x's shape is."""
    static = x.static_shape()
    n: Any = math.prod(static) if static is not None else -1
    return Value(ctx.op("Reshape", x, ctx.i64([-1, 1])), x.dtype, (n, 1))


def convert_histogram_bin_ct(
    ctx: ConversionContext,
    x: Value,
    bins: int = 100,
    *,
    range: list[float] | None = None,
    weight: Value | None = None,
    density: bool = False,
) -> list[str]:
    col = _column(ctx, x)
    hist, edges = _histogramdd(ctx, col, [bins], range, weight, density)
    return [hist, edges[0]]


def convert_histogram_bins_tensor(
    ctx: ConversionContext, x: Value, bins: Value, *, weight: Value | None = None, density: bool = False
) -> list[str]:
    col = _column(ctx, x)
    hist, _ = _histogramdd(ctx, col, [bins], None, weight, density)
    return [hist, ctx.op("Identity", bins)]


def convert_histogramdd(
    ctx: ConversionContext,
    x: Value,
    bins: Any,
    range: list[float] | None = None,
    weight: Value | None = None,
    density: bool = False,
) -> list[Any]:
    dims = x.shape[-1]
    if not isinstance(dims, int):
        raise ctx.error("histogramdd needs a static number of dimensions (the input's last dim)")
    bin_list: list[Any] = [bins] * dims if isinstance(bins, int) else list(bins)
    hist, edges = _histogramdd(ctx, x, bin_list, range, weight, density)
    if any(isinstance(b, (Value, str)) for b in bin_list):
        edges = [ctx.op("Identity", b) for b in bin_list]
    return [hist, edges]


# ---- segment reductions -----------------------------------------------------------------------------

_SEGMENT_REDUCE = {
    "sum": "ReduceSum",
    "prod": "ReduceProd",
    "max": "ReduceMax",
    "min": "ReduceMin",
    "mean": "ReduceSum",
}
_IDENTITY = {"sum": 0.0, "mean": 0.0, "prod": 1.0, "max": -math.inf, "min": math.inf}


def convert_segment_reduce(
    ctx: ConversionContext,
    data: Value,
    reduce_: str,
    *,
    lengths: Value | None = None,
    indices: Value | None = None,
    offsets: Value | None = None,
    axis: int = 0,
    unsafe: bool = False,
    initial: Any = None,
) -> str:
    if reduce_ not in _SEGMENT_REDUCE:
        raise ctx.error(f"segment_reduce: reduce must be one of {sorted(_SEGMENT_REDUCE)}, got {reduce_!r}")
    if indices is not None or (lengths is None) == (offsets is None):
        raise ctx.error("segment_reduce is converted with exactly one of lengths= or offsets= (not indices=)")
    dtype = ctx.out_dtype
    cd = opmath_dtype(dtype)
    a = normalize_axis(axis, data.rank)
    # segment lengths (lead..., S), lead = data's dims before the axis
    if lengths is not None:
        seg_len = ctx.cast(lengths, i64)
        last = lengths.rank - 1
    else:
        assert offsets is not None
        last = offsets.rank - 1
        off = ctx.cast(offsets, i64)
        n_off = _axis_len(ctx, off, last)
        ax = ctx.i64([last])
        seg_len = ctx.op(
            "Sub",
            ctx.op("Slice", off, ctx.i64([1]), n_off, ax),
            ctx.op("Slice", off, ctx.i64([0]), ctx.op("Sub", n_off, ctx.i64([1])), ax),
        )
    if last != a:
        raise ctx.error(f"segment_reduce: lengths / offsets must have {a + 1} dims for axis={axis}")
    ends = ctx.op("CumSum", seg_len, ctx.const(last, i64))
    starts = ctx.op("Sub", ends, seg_len)
    positions = ctx.op(
        "Range", ctx.const(0, i64), ctx.op("Reshape", _axis_len(ctx, data, a), ctx.i64([])), ctx.const(1, i64)
    )
    # member[lead..., s, p]: position p of the axis belongs to segment s
    p = positions
    member = ctx.op(
        "And",
        ctx.op("GreaterOrEqual", p, unsqueeze(ctx, starts, [-1])),
        ctx.op("Less", p, unsqueeze(ctx, ends, [-1])),
    )
    trailing = data.rank - a - 1
    if trailing:
        member = unsqueeze(ctx, member, list(range(-trailing, 0)))
    values = unsqueeze(ctx, ctx.cast(data, cd), [a])  # (lead..., 1, n, trail...)
    identity = ctx.const(_IDENTITY[reduce_], cd)
    picked = ctx.op("Where", member, values, identity)
    out = reduce(ctx, _SEGMENT_REDUCE[reduce_], picked, [a + 1], False)
    count = ctx.cast(seg_len, cd)
    if trailing:
        count = unsqueeze(ctx, count, list(range(-trailing, 0)))
    if initial is not None:
        init = ctx.const(float(initial), cd)
        combine = {"sum": "Add", "mean": "Add", "prod": "Mul", "max": "Max", "min": "Min"}[reduce_]
        out = ctx.op(combine, out, init)
        if reduce_ == "mean":
            empty = ctx.op("Equal", count, ctx.const(0.0, cd))
            out = ctx.op("Where", empty, init, ctx.op("Div", out, count))
    elif reduce_ == "mean":
        out = ctx.op("Div", out, count)  # an empty segment is 0 / 0 = NaN, as in torch
    return ctx.cast(out, dtype)


CONVERTERS: dict[str, Converter] = {
    "aten.kthvalue.default": convert_kthvalue,
    "aten.median.default": convert_median,
    "aten.median.dim": convert_median_dim,
    "aten.nanmedian.default": convert_nanmedian,
    "aten.nanmedian.dim": convert_nanmedian_dim,
    "aten.mode.default": convert_mode,
    "aten.quantile.default": convert_quantile,
    "aten.quantile.scalar": convert_quantile,
    "aten.nanquantile.default": convert_nanquantile,
    "aten.nanquantile.scalar": convert_nanquantile,
    "aten.isin.Tensor_Tensor": convert_isin,
    "aten.isin.Tensor_Scalar": convert_isin,
    "aten.isin.Scalar_Tensor": convert_isin,
    "aten._unique2.default": convert_unique2,
    "aten.unique_consecutive.default": convert_unique_consecutive,
    "aten.unique_dim.default": convert_unique_dim,
    "aten.histc.default": convert_histc,
    "aten.histogram.bin_ct": convert_histogram_bin_ct,
    "aten.histogram.bins_tensor": convert_histogram_bins_tensor,
    "aten.histogramdd.default": convert_histogramdd,
    "aten.histogramdd.int_bins": convert_histogramdd,
    "aten.histogramdd.TensorList_bins": convert_histogramdd,
    "aten.segment_reduce.default": convert_segment_reduce,
}
