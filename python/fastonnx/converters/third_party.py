"""Ops that libraries define with torch.library, known by their qualified name.

Their OpOverload objects exist only once the defining library is imported; the registry's keys are
names, so they need not exist when the registry is built.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from fastonnx import dtypes
from fastonnx.context import ConversionContext, Converter, Value

# the element types ONNX's sequence operators take (SequenceInsert, ConcatFromSequence, SequenceMap):
# no bfloat16 or float8
_SEQUENCE_FLOATS = (torch.float16, torch.float32, torch.float64)


def _static(shape: Sequence[Any]) -> list[int | None]:
    """A shape's static dims, None for symbolic ones."""
    return [d if isinstance(d, int) else None for d in shape]


def convert_grouped_linear_stored(ctx: ConversionContext, x: Value, weight: Value, offs: Value) -> str:
    """fastonnx's grouped linear over experts' weights as transformers stores them, (E, N, K)
    (capture/grouped_linear.py): ``convert_grouped_mm_fallback``'s routed form, each step's one expert
    weight read through ``Gemm(transB=1)`` instead of the whole (E, N, K) tensor transposed first."""
    return convert_grouped_mm_fallback(ctx, x, weight, offs, stored=True)


def convert_grouped_mm_fallback(
    ctx: ConversionContext, x: Value, weight: Value, offs: Value, stored: bool = False
) -> str:
    """transformers' mixture-of-experts matmul: rows of ``x`` (S, K) are sorted by expert, expert ``e``
    owning rows offs[e-1]:offs[e]; each block is multiplied by weight[e] (K, N); rows past offs[-1]
    stay 0.

    Routed: a ``SequenceMap`` runs over the experts that own rows only (``NonZero`` of the block
    sizes), each step slicing its block, gathering its one expert's (K, N) weight and multiplying;
    ``ConcatFromSequence`` joins the blocks once. The work follows the routed rows (tokens × top-k): a
    decode step of Qwen3-MoE (128 experts, top-8) reads 8 experts' weights, not 128, and no weight is
    copied per token.

    Chosen by measuring the forms on the gate_up product of a Qwen3-30B-A3B layer (K 2048, N 1536, 128
    experts, top-8; onnxruntime 1.31, CPU, 1 thread; ranges over runs on a shared 2-core machine), at
    1 token / 2048 tokens: a Loop over every expert growing its result by Concat (the form before)
    99-179 ms / 3.0 s; a Loop over the hit experts with Concat 10-18 ms / 3.1-3.2 s (Concat copies all
    rows so far at each step: quadratic in the experts hit); that Loop carrying a tensor sequence
    (SequenceInsert, one ConcatFromSequence) 8-13 ms / 1.4-2.1 s; blocks padded to the largest as a
    Loop's scan output 14-19 ms / 1.8-2.4 s (and up to experts × tokens rows of memory when routing is
    skewed); one batched MatMul over the hit experts padded likewise 24-26 ms / 2.3 s; SequenceMap
    8-9 ms / 1.4-2.4 s, level with the Loop carrying a sequence, without sequence-typed loop state,
    and with a body that reads nothing from outside (onnx's reference evaluator runs it). What stays
    above the dense floor is the copy of each hit expert's weight that Gather makes (onnxruntime has
    no view of a slice). SequenceMap is ONNX's from opset 17; onnxruntime's SplitToSequence takes the
    ids as int32; ONNX's sequence ops take no bfloat16, so such blocks travel as float32.
    """
    if x.rank != 2 or weight.rank != 3 or offs.rank != 1:
        raise ctx.error(
            f"grouped_mm_fallback expects input (S, K), weight (E, K, N) or (E, N, K) stored, offs (E,); got ranks "
            f"{x.rank}, {weight.rank}, {offs.rank}"
        )
    # blocks of another float type travel through the sequence as float32 (exact both ways)
    carried = x.dtype if x.dtype in _SEQUENCE_FLOATS else torch.float32
    dt = dtypes.to_onnx_dtype(carried)
    out_axis = 1 if stored else 2  # of the weight: (E, N, K) stored, (E, K, N) otherwise
    (width,) = _static(weight.shape[out_axis : out_axis + 1])
    axis0 = ctx.i64([0])
    ends = ctx.operand(offs, torch.int64)
    bounds = ctx.op("Concat", axis0, ends, axis=0)  # E + 1 row bounds, bounds[e] the first of e
    starts = ctx.op("Slice", bounds, axis0, ctx.i64([-1]), axis0)
    owning = ctx.op("Greater", ctx.op("Sub", ends, starts), ctx.i64(0))
    # the experts that own rows, int32 (onnxruntime's SplitToSequence has no int64), one per element
    hit = ctx.op("Cast", ctx.op("Reshape", ctx.op("NonZero", owning), ctx.i64([-1])), to=dtypes.INT32)
    experts = ctx.op("SplitToSequence", hit, keepdims=0)
    ctx.g.set_type(experts, dtypes.INT32, [], sequence=True)

    g = ctx.g
    body = g.subgraph(g.unique_name("expert_block"))
    e32 = body.add_input(g.unique_name("expert"), dtypes.INT32, [])
    # what the body reads comes as SequenceMap's extra inputs (the same tensor every step): onnx's
    # reference evaluator passes no outer scope to its body. SequenceMap takes no bfloat16 or float8
    # tensor there: those the body reads from the outer scope, as onnxruntime allows.
    extra: list[str] = []

    def passed(value: Value, hint: str) -> str:
        if value.dtype not in _SEQUENCE_FLOATS:
            return value.name
        extra.append(value.name)
        return body.add_input(g.unique_name(hint), dtypes.to_onnx_dtype(value.dtype), _static(value.shape))

    rows_in, w_in = passed(x, "rows"), passed(weight, "weights")
    extra.append(bounds)
    bounds_in = body.add_input(g.unique_name("bounds"), dtypes.INT64, [None])
    ctx.g = body
    try:
        first = ctx.i64([0])  # the body's own constants: no read of the outer scope
        e = ctx.op("Cast", e32, to=dtypes.INT64)
        e1 = ctx.op("Unsqueeze", e, first)
        start = ctx.op("Gather", bounds_in, e1, axis=0)
        end = ctx.op("Gather", bounds_in, ctx.op("Add", e1, ctx.i64(1)), axis=0)
        rows = ctx.op("Slice", rows_in, start, end, first)
        one = ctx.op("Gather", w_in, e, axis=0)  # one expert's weight
        block = ctx.op("Gemm", rows, one, transB=1) if stored else ctx.op("MatMul", rows, one)
        if carried != x.dtype:
            block = ctx.op("Cast", block, to=dt)
        out = body.add_output(block, g.unique_name("block"))
        body.set_type(out, dt, [None, width])
    finally:
        ctx.g = g
    blocks = ctx.op("SequenceMap", experts, *extra, body=body)
    ctx.g.set_type(blocks, dt, [None, width], sequence=True)
    # rows past the last expert's block are zeros, as in transformers' implementation (appended to
    # the sequence, which is then never empty: ConcatFromSequence refuses an empty one)
    last = ctx.op("Slice", bounds, ctx.i64([-1]), ctx.i64([2**62]), axis0)
    rest = ctx.op("Sub", ctx.op("Shape", x, start=0, end=1), last)
    zeros = ctx.op(
        "ConstantOfShape",
        ctx.op("Concat", rest, ctx.op("Shape", weight, start=out_axis, end=out_axis + 1), axis=0),
        value=ctx.tensor_attr(0, carried),
    )
    every = ctx.op("SequenceInsert", blocks, zeros)
    ctx.g.set_type(every, dt, [None, width], sequence=True)
    joined = ctx.op("ConcatFromSequence", every, axis=0)
    ctx.g.set_type(joined, dt, [None, width])
    return joined if carried == x.dtype else ctx.op("Cast", joined, to=dtypes.to_onnx_dtype(x.dtype))


def convert_routed_experts(
    ctx: ConversionContext,
    hidden: Value,
    top_k_index: Value,
    top_k_weights: Value,
    gate_up: Value,
    down: Value,
) -> str:
    """fastonnx's routed SwiGLU experts (capture/fused_experts.py, captured inside fused_experts(True)) as
    onnxruntime's ``com.microsoft.MoE``. Its CPU kernel takes the gate and up rows of fc1 interleaved
    (``swiglu_fusion=1``; transformers stores them gate rows then up rows) and routes by itself: a softmax
    over its router input, then the top k. Given the log of each chosen weight and -1e30 elsewhere, that
    softmax gives each chosen weight over their sum (the others underflow to 0; the log is clamped above
    -1e30 so a zero weight is still chosen over the rest), and the output times that sum is the model's."""
    experts, fused, width = (int(d) for d in gate_up.shape)
    k = top_k_index.shape[-1]
    if not isinstance(k, int) or hidden.dtype != torch.float32:
        raise ctx.error("onnxruntime's MoE takes float32 experts with a static top-k")
    inter = fused // 2
    tokens = ctx.op("Shape", hidden, start=0, end=1)
    floor = ctx.op(
        "ConstantOfShape",
        ctx.op("Concat", tokens, ctx.i64([experts]), axis=0),
        value=ctx.tensor_attr(-1e30, torch.float32),
    )
    weights = ctx.cast(top_k_weights, torch.float32)
    chosen = ctx.op("Log", ctx.op("Max", weights, ctx.const(1e-30, torch.float32)))
    logits = ctx.op("ScatterElements", floor, ctx.cast(top_k_index, torch.int64), chosen, axis=1)
    # [E, 2I, H] gate rows then up rows -> [E, I, 2, H] -> interleaved [E, 2I, H]
    split = ctx.op("Reshape", gate_up, ctx.i64([experts, 2, inter, width]))
    fc1 = ctx.op("Reshape", ctx.op("Transpose", split, perm=[0, 2, 1, 3]), ctx.i64([experts, fused, width]))
    mixed = ctx.op(
        "MoE",
        hidden,
        logits,
        fc1,
        None,
        down,
        domain="com.microsoft",
        k=k,
        activation_type="swiglu",
        swiglu_fusion=1,
        activation_alpha=1.0,
        activation_beta=0.0,
        normalize_routing_weights=1,
    )
    ctx.g.set_type(mixed, dtypes.FLOAT, _static(hidden.shape))
    return ctx.op("Mul", mixed, ctx.op("ReduceSum", weights, ctx.i64([1]), keepdims=1))


CONVERTERS: dict[str, Converter] = {
    "transformers.grouped_mm_fallback.default": convert_grouped_mm_fallback,
    "fastonnx.routed_experts.default": convert_routed_experts,
    "fastonnx.grouped_linear_stored.default": convert_grouped_linear_stored,
}
