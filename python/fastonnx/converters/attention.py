"""scaled_dot_product_attention and the fused variants torch.export may emit, decomposed into
MatMul / Softmax at every opset.

ONNX's Attention (opset 23) is not used: its masking and softmax conventions are not documented as
torch's (fully masked rows, GQA head order), and a plain decomposition is exact everywhere.

torch's CPU kernels compute float16 / bfloat16 attention in float32 and round once; so does this.
A row whose every score is masked gives zeros in torch (not NaN); the same is done here.
dropout_p > 0 drops attention weights at random (ONNX random ops: same distribution as torch, other
values).
"""

from __future__ import annotations

import math

import torch

from fastonnx.context import ConversionContext, Converter, Value
from fastonnx.converters.lib.attention_graphs import (
    attention_scale,
    causal_mask,
    closed_rows,
    repeat_kv_heads,
)
from fastonnx.converters.lib.kernels import opmath_dtype
from fastonnx.converters.lib.ops import reduce, unsqueeze
from fastonnx.converters.lib.random import attention_dropout

aten = torch.ops.aten


def _broadcast_heads(
    ctx: ConversionContext, values: tuple[Value, Value, Value], names: tuple[str, str, str]
) -> tuple[str, str, str]:
    """Without enable_gqa, head counts broadcast (equal or 1). MatMul broadcasts them by itself; the
    one-head operands are expanded explicitly only where ONNX Attention (which the attention fusion
    may form) has no broadcasting: a single query head, or key and value head counts that differ.
    Keys and values that both have one head (multi-query attention) are left as they are."""
    heads = [x.shape[-3] for x in values]
    if not all(isinstance(h, int) for h in heads) or len(set(heads)) == 1:
        return names
    target = max(heads)
    expand = [heads[0] == 1, heads[1] != heads[2] and heads[1] == 1, heads[1] != heads[2] and heads[2] == 1]
    shape = ctx.i64([target, 1, 1])
    out = [ctx.op("Expand", n, shape) if e else n for n, e in zip(names, expand)]
    return out[0], out[1], out[2]


def _attention(
    ctx: ConversionContext,
    q: Value,
    k: Value,
    v: Value,
    attn_mask: Value | None,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
    want_lse: bool = False,
    enable_gqa: bool = False,
) -> tuple[str, str | None]:
    """(output in q's dtype, logsumexp of the scores in float32 or None)."""
    if not 0 <= dropout_p <= 1:
        raise ctx.error(f"scaled_dot_product_attention: dropout_p must be in [0, 1], got {dropout_p}")
    if is_causal and attn_mask is not None:
        raise ctx.error("scaled_dot_product_attention takes attn_mask or is_causal, not both")
    work = opmath_dtype(q.dtype)
    qn, kn, vn = ctx.cast(q, work), ctx.cast(k, work), ctx.cast(v, work)
    if enable_gqa and q.rank >= 3 and k.rank >= 3 and v.rank >= 3:
        # torch's rule: with enable_gqa, key and value are each repeated to the query's head count
        # when the three head counts are not all equal. Without it nothing is repeated and heads
        # broadcast as MatMul does (one query head against several key/value heads is broadcasting)
        q_heads = q.shape[-3]
        if not isinstance(q_heads, int):
            raise ctx.error("enable_gqa needs a static number of query heads")
        if not q_heads == k.shape[-3] == v.shape[-3]:
            kn = repeat_kv_heads(ctx, kn, k, q_heads)
            vn = repeat_kv_heads(ctx, vn, v, q_heads)
    elif q.rank >= 3 and k.rank >= 3 and v.rank >= 3:
        qn, kn, vn = _broadcast_heads(ctx, (q, k, v), (qn, kn, vn))
    perm = list(range(k.rank))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    scores = ctx.op(
        "MatMul", ctx.op("Mul", qn, attention_scale(ctx, q, scale, work)), ctx.op("Transpose", kn, perm=perm)
    )
    neg_inf = ctx.const(-math.inf, work)
    masked = False
    if is_causal:
        scores = ctx.op("Where", causal_mask(ctx, q, k), scores, neg_inf)
    elif attn_mask is not None:
        masked = True
        if attn_mask.dtype == torch.bool:
            scores = ctx.op("Where", attn_mask, scores, neg_inf)
        else:
            scores = ctx.op("Add", scores, ctx.cast(attn_mask, work))
    probs = ctx.op("Softmax", scores, axis=-1)
    empty_rows = None
    if masked and attn_mask is not None:
        # rows the mask closes entirely: softmax gives NaN, torch gives 0. Found from the mask alone,
        # so that the layers sharing one mask share this computation too (CSE).
        empty_rows = closed_rows(ctx, attn_mask)
        probs = ctx.op("Where", empty_rows, ctx.const(0.0, work), probs)
    if dropout_p:
        # torch's math kernel drops attention weights (random; see py), after the softmax
        probs = attention_dropout(ctx, probs, dropout_p, work)
    out = ctx.cast(ctx.op("MatMul", probs, vn), q.dtype)
    lse = None
    if want_lse:
        lse = reduce(ctx, "ReduceLogSumExp", ctx.cast(scores, torch.float32), [q.rank - 1], keepdims=True)
        if empty_rows is not None:
            lse = ctx.op("Where", empty_rows, ctx.const(0.0, torch.float32), lse)
        lse = ctx.op("Squeeze", lse, ctx.i64([q.rank - 1]))
    return out, lse


def convert_sdpa(
    ctx: ConversionContext,
    q: Value,
    k: Value,
    v: Value,
    attn_mask: Value | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> str:
    out, _ = _attention(ctx, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa=enable_gqa)
    return out


def _output_used(ctx: ConversionContext, index: int) -> bool:
    """Whether output ``index`` of the current multi-output node is read by a getitem."""
    assert ctx.node is not None
    return any(u.args[1] == index and u.users for u in ctx.node.users if len(u.args) > 1)


def convert_flash_attention_for_cpu(
    ctx: ConversionContext,
    q: Value,
    k: Value,
    v: Value,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    attn_mask: Value | None = None,
    scale: float | None = None,
) -> list[str | None]:
    out, lse = _attention(ctx, q, k, v, attn_mask, dropout_p, is_causal, scale, _output_used(ctx, 1))
    return [out, lse]


def convert_efficient_attention(
    ctx: ConversionContext,
    q: Value,
    k: Value,
    v: Value,
    attn_bias: Value | None,
    compute_log_sumexp: bool,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    scale: float | None = None,
) -> list[str | None]:
    # its logsumexp is padded to a multiple of 32 rows and the philox outputs are RNG state: none of
    # them has a meaning here
    if any(_output_used(ctx, i) for i in (1, 2, 3)):
        raise ctx.error("only the attention output of _scaled_dot_product_efficient_attention is supported")
    out, _ = _attention(ctx, q, k, v, attn_bias, dropout_p, is_causal, scale)
    return [out, None, None, None]


def convert_flash_attention_for_cpu_backward(
    ctx: ConversionContext,
    grad_out: Value,
    q: Value,
    k: Value,
    v: Value,
    out: Value,
    logsumexp: Value,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    attn_mask: Value | None = None,
    scale: float | None = None,
) -> list[str]:
    """The gradients (query, key, value) of _scaled_dot_product_flash_attention_for_cpu (what
    training graphs of torch.compile hold), from the forward's saved output and logsumexp: the
    probabilities are recomputed as exp(scores - logsumexp), then dV = Pᵀ·dO, dS = P ⊙ (dO·Vᵀ −
    rowsum(dO ⊙ O)), dQ = dS·K·scale, dK = dSᵀ·Q·scale, in float32 for low-precision inputs."""
    if dropout_p:
        raise ctx.error(
            "the backward of attention with dropout_p > 0 needs the forward's random mask, which torch "
            "does not save; train with attention dropout 0 or let this graph fall back to eager"
        )
    if is_causal and attn_mask is not None:
        raise ctx.error("scaled_dot_product_attention takes attn_mask or is_causal, not both")
    if q.rank < 3 or not q.shape[-3] == k.shape[-3] == v.shape[-3]:
        raise ctx.error(
            f"attention backward needs query, key and value with the same number of heads, got shapes "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    work = opmath_dtype(q.dtype)
    qn, kn, vn = ctx.cast(q, work), ctx.cast(k, work), ctx.cast(v, work)
    dout, on = ctx.cast(grad_out, work), ctx.cast(out, work)
    perm = list(range(q.rank))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    s = attention_scale(ctx, q, scale, work)
    q_scaled = ctx.op("Mul", qn, s)
    scores = ctx.op("MatMul", q_scaled, ctx.op("Transpose", kn, perm=perm))
    neg_inf = ctx.const(-math.inf, work)
    if is_causal:
        scores = ctx.op("Where", causal_mask(ctx, q, k), scores, neg_inf)
    elif attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = ctx.op("Where", attn_mask, scores, neg_inf)
        else:
            scores = ctx.op("Add", scores, ctx.cast(attn_mask, work))
    lse = unsqueeze(ctx, ctx.cast(logsumexp, work), [q.rank - 1])
    probs = ctx.op("Exp", ctx.op("Sub", scores, lse))  # 0 where masked, rows closed included
    grad_v = ctx.op("MatMul", ctx.op("Transpose", probs, perm=perm), dout)
    grad_p = ctx.op("MatMul", dout, ctx.op("Transpose", vn, perm=perm))
    row = reduce(ctx, "ReduceSum", ctx.op("Mul", dout, on), [q.rank - 1], keepdims=True)
    grad_s = ctx.op("Mul", probs, ctx.op("Sub", grad_p, row))
    grad_q = ctx.op("Mul", ctx.op("MatMul", grad_s, kn), s)
    grad_k = ctx.op("MatMul", ctx.op("Transpose", grad_s, perm=perm), q_scaled)
    return [ctx.cast(grad_q, q.dtype), ctx.cast(grad_k, k.dtype), ctx.cast(grad_v, v.dtype)]


CONVERTERS: dict[str, Converter] = {
    "aten.scaled_dot_product_attention.default": convert_sdpa,
    "aten._scaled_dot_product_flash_attention_for_cpu.default": convert_flash_attention_for_cpu,
    "aten._scaled_dot_product_flash_attention_for_cpu_backward.default": (
        convert_flash_attention_for_cpu_backward
    ),
    "aten._scaled_dot_product_efficient_attention.default": convert_efficient_attention,
}
