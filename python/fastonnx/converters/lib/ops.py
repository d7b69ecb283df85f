"""Building blocks several converter families share: opset-dependent forms of common ONNX ops."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from fastonnx.context import ConversionContext, Operand, Value


def normalize_axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def reduce(
    ctx: ConversionContext,
    op_type: str,
    x: Operand,
    axes: Sequence[int] | None,
    keepdims: bool,
) -> str:
    """ReduceX over ``axes`` (None = all). Axes are an input for ReduceSum (opset 13+) and, from opset
    18, for every Reduce op; an attribute before that."""
    keep = 1 if keepdims else 0
    if axes is None or len(axes) == 0:
        return ctx.op(op_type, x, keepdims=keep)
    if op_type == "ReduceSum" or ctx.opset >= 18:
        return ctx.op(op_type, x, ctx.i64(list(axes)), keepdims=keep)
    return ctx.op(op_type, x, keepdims=keep, axes=list(axes))


def unsqueeze(ctx: ConversionContext, x: Operand, axes: Sequence[int]) -> str:
    return ctx.op("Unsqueeze", x, ctx.i64(list(axes)))


def squeeze(ctx: ConversionContext, x: Operand, axes: Sequence[int] | None = None) -> str:
    if axes is None:
        return ctx.op("Squeeze", x)
    return ctx.op("Squeeze", x, ctx.i64(list(axes)))


def split(ctx: ConversionContext, x: Operand, sizes: Sequence[int], axis: int) -> list[str]:
    """Split into pieces of the given static sizes along ``axis``."""
    return ctx.op("Split", x, ctx.i64(list(sizes)), axis=axis, outputs=len(sizes))


def _category(dtype: torch.dtype) -> int:
    """torch's promotion categories: bool < integer < floating < complex."""
    if dtype == torch.bool:
        return 0
    if dtype.is_complex:
        return 3
    if dtype.is_floating_point:
        return 2
    return 1


def _scalar_dtype(x: bool | int | float | complex) -> torch.dtype:
    if isinstance(x, bool):
        return torch.bool
    if isinstance(x, int):
        return torch.int64
    if isinstance(x, float):
        return torch.get_default_dtype()
    return torch.complex64 if torch.get_default_dtype() == torch.float32 else torch.complex128


def promote(ctx: ConversionContext, *args: Any) -> torch.dtype:
    """The dtype ``torch.result_type`` gives for tensors (Values / names) and Python scalars.

    Tensors with dims decide first; 0-d tensors (symbolic scalars included), then Python scalars, only
    win when their category (bool < int < float < complex) is higher: an int tensor with a float
    scalar gives the default float dtype, a float16 tensor with a float scalar stays float16.
    ``None`` arguments are ignored.
    """
    groups: list[torch.dtype | None] = [None, None, None]  # dims, 0-d, scalars
    for a in args:
        if a is None:
            continue
        if isinstance(a, (Value, str)):
            dt = ctx.dtype(a)
            if dt is None:
                raise ctx.error(f"the dtype of {a!r} is not known")
            slot = 0 if ctx.rank(a) != 0 else 1
        elif isinstance(a, (bool, int, float, complex)):
            dt, slot = _scalar_dtype(a), 2
        else:
            raise ctx.error(f"cannot promote {type(a).__name__} {a!r} with tensors")
        prev = groups[slot]
        groups[slot] = dt if prev is None else torch.promote_types(prev, dt)
    result: torch.dtype | None = None
    for dt in groups:
        if dt is not None and (result is None or _category(dt) > _category(result)):
            result = dt
    if result is None:
        raise ctx.error("no operand to promote")
    return result


def opmath_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype torch's CPU kernels compute a float op in: float32 for float16 / bfloat16 (rounded once
    at the end), the dtype itself otherwise."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def overloads(name: str, *names: str) -> list[Any]:
    """The overloads ``names`` (default: "default") of ``aten.<name>`` that this torch has."""
    packet = getattr(torch.ops.aten, name, None)
    if packet is None:
        return []
    return [getattr(packet, o) for o in names or ("default",) if o in packet.overloads()]


def register(table: dict[Any, Any], fn: Any, name: str, *names: str) -> None:
    """Serves ``aten.<name>``'s overloads ``names`` (default: "default") by ``fn`` in ``table``."""
    for op in overloads(name, *names):
        table[op] = fn


# Numerical Recipes' fit of erfc: erfc(z) = t exp(-z^2 + P(t)), t = 1 / (1 + z/2), z >= 0, relative
# error < 1.2e-7 everywhere; P's coefficients from t^0 up
ERFC_FIT = (
    -1.26551223,
    1.00002368,
    0.37409196,
    0.09678418,
    -0.18628806,
    0.27886807,
    -1.13520398,
    1.48851587,
    -0.82215223,
    0.17087277,
)
