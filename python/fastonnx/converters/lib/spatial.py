"""What the spatial families (convolution, pooling, resampling, pixel rearrangements) share: torch's
int-or-list window arguments, static sizes, unbatched inputs and ConvTranspose with torch's output_padding.

torch accepts unbatched inputs (no N dim) for most spatial ops; ONNX's Conv / Pool / Resize ops need N,
so such inputs get a leading dim of 1 added (``batched``) and removed (``unbatch``) around the ONNX op.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastonnx.context import ConversionContext, Value
from fastonnx.converters.lib.ops import squeeze, unsqueeze

IntOrList = int | Sequence[int]


def expand_ints(v: IntOrList | None, n: int, default: int) -> list[int]:
    """torch's int-or-list conv/pool argument as n ints (a 1-element list repeats, like torch)."""
    if v is None:
        return [default] * n
    if isinstance(v, int):
        return [v] * n
    v = list(v)
    if not v:
        return [default] * n
    return v * n if len(v) == 1 else v


def batched(ctx: ConversionContext, x: Value, spatial: int) -> tuple[str, bool]:
    """``x`` with an N dim (added when torch got an unbatched input), and whether one was added."""
    if x.rank == spatial + 1:
        return unsqueeze(ctx, x, [0]), True
    return x.name, False


def unbatch(ctx: ConversionContext, y: str, added: bool) -> str:
    return squeeze(ctx, y, [0]) if added else y


def static_ints(ctx: ConversionContext, dims: Sequence[Any], what: str) -> list[int]:
    if not all(isinstance(d, int) for d in dims):
        raise ctx.error(f"{what} must be static, got {list(dims)}")
    return [int(d) for d in dims]


def conv_transpose(
    ctx: ConversionContext,
    x: str,
    weight: Value,
    bias: Value | None,
    attrs: dict[str, Any],
    out_pad: list[int],
) -> str:
    """ConvTranspose with torch's output_padding. onnxruntime wants output_padding < stride while torch
    allows up to max(stride, dilation) - 1, so it is expressed as less end padding instead (the same
    values: those outputs are computed, then cropped by the padding); what is left beyond the full
    output holds only the bias, added after zero padding."""
    nd = len(out_pad)
    pads = attrs["pads"]
    begin, end = pads[:nd], pads[nd:]
    new_end = [max(e - o, 0) for e, o in zip(end, out_pad)]
    extra = [max(o - e, 0) for e, o in zip(end, out_pad)]
    attrs = {**attrs, "pads": begin + new_end}
    if not any(extra):
        # annotated: with **attrs of Any the overloads of ctx.op cannot tell one output from several
        y: str = ctx.op("ConvTranspose", x, weight, bias, **attrs)
        return y
    y = ctx.op("ConvTranspose", x, weight, **attrs)
    y = ctx.op("Pad", y, ctx.i64([0] * (nd + 2) + [0, 0, *extra]))
    if bias is None:
        return y
    return ctx.op("Add", y, ctx.op("Reshape", bias, ctx.i64([-1] + [1] * nd)))
