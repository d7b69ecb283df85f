"""torch.onnx.ops (torch >= 2.8): PyTorch code saying "emit this ONNX op".

- ``torch.onnx.ops.symbolic`` / ``symbolic_multi_out`` (FX: ``onnx_symbolic._symbolic`` /
  ``_symbolic_multi_out``) become the op they name, in its domain, with its attributes; its outputs get
  the declared dtypes and shapes (the walker declares what torch recorded, which is that). A custom
  domain is imported at the declared version (1 when none is given); an op of the standard domain must
  exist at the export's opset, take the attributes given (ints are widened to floats where the schema
  wants floats) and, when it declares a version, declare the export's opset. Two ops declaring one
  domain at two versions is an error naming both: a model imports one version per domain. The ops'
  ``metadata_props`` are not written (the node carries fastonnx's metadata, docs/guides/metadata.md).
- ``torch.onnx.ops.rotary_embedding`` (``onnx.RotaryEmbedding.opset23``) and
  ``torch.onnx.ops.attention`` (``onnx.Attention.opset23``) become ONNX's RotaryEmbedding / Attention
  from opset 23, and a composition of standard ops with the same results below it.

Attention follows ONNX (the reference evaluator and onnxruntime 1.31 agree on all of this), where
torch's eager implementation of ``torch.onnx.ops.attention`` differs (docs/troubleshooting.md,
"torch.onnx.ops.attention"):

- ``is_causal`` with a past: ONNX aligns the causal mask bottom-right (new query i sees keys
  j <= i + past length, so every past key), torch's eager kernel top-left (``tril`` of the
  (L, past + L) scores: the first query sees only the first key). Without a past both align top-left.
- ``softcap`` is applied to the scores before the mask is added (a masked key stays masked); torch's
  eager kernel caps the masked scores, so -inf becomes -softcap and masked keys get some weight.
- a row whose every key is masked gives zeros (torch: NaN with a float mask);
- ``qk_matmul_output_mode`` (the fourth output): 0 the scaled Q·Kᵀ, 1 that after the softcap, 2 after
  the softcap and the mask, 3 the softmax (torch: 1 scores + mask, 2 the softcap of that). With a
  softcap, mode 0 is onnxruntime's (Q·Kᵀ, not capped; the reference evaluator caps it).
- ``is_causal`` together with ``attn_mask`` is allowed (both apply; torch refuses the pair);
- ``attn_mask``'s last dim must be the total key length: ONNX pads a shorter mask, onnxruntime refuses
  it, so fastonnx refuses it at export.

The present key / value outputs are always produced (onnxruntime refuses a ``past_key`` without them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from fastonnx import dtypes
from fastonnx.context import ConversionContext, Converter, Value
from fastonnx.converters.lib.attention_graphs import (
    attention_scale,
    causal_mask,
    closed_rows,
    repeat_kv_heads,
)
from fastonnx.converters.lib.kernels import opmath_dtype
from fastonnx.converters.lib.ops import split, unsqueeze
from fastonnx.converters.lib.shape_graphs import INT64_MAX, dim_scalar
from fastonnx.errors import OpsetError

FIRST_OPSET = 23  # RotaryEmbedding and Attention enter the standard domain

# ONNX element types without a torch dtype fastonnx can declare (torch records UINT4 / INT4 as uint8)
_UNDECLARABLE = {8: "STRING", 21: "UINT4", 22: "INT4"}

# torch.onnx.ops' attribute encoding (torch/onnx/ops/_symbolic_impl.py): type code -> (list, scalar)
_ATTR_TYPES = {
    "i": ("ints", True),
    "f": ("floats", True),
    "s": ("strs", True),
    "is": ("ints", False),
    "fs": ("floats", False),
    "ss": ("strs", False),
}

# Attention's softmax_precision: the float types ONNX allows
_SOFTMAX_PRECISIONS = {1: torch.float32, 10: torch.float16, 11: torch.float64, 16: torch.bfloat16}


# ---- symbolic ----------------------------------------------------------------------------------
def _label(ctx: ConversionContext, what: str) -> str:
    node = ctx.node.name if ctx.node is not None else "?"
    return f"torch.onnx.ops.{what} (FX node {node!r})"


def _decode_attributes(
    ctx: ConversionContext,
    where: str,
    keys: Sequence[str],
    types: Sequence[str],
    positions: Sequence[Sequence[int]],
    pools: dict[str, Sequence[Any]],
) -> dict[str, Any]:
    """torch.onnx.ops' attribute lists back into {name: value}, every piece checked."""
    if not len(keys) == len(types) == len(positions):
        raise ctx.error(
            f"{where}: {len(keys)} attribute names, {len(types)} types and {len(positions)} positions: "
            "the attribute encoding is inconsistent"
        )
    attrs: dict[str, Any] = {}
    for key, code, pos in zip(keys, types, positions):
        if not isinstance(key, str) or not key:
            raise ctx.error(f"{where}: attribute name {key!r} is not a non-empty string")
        if key in attrs:
            raise ctx.error(f"{where}: attribute {key!r} is given twice")
        if code not in _ATTR_TYPES:
            raise ctx.error(
                f"{where}: attribute {key!r} has type code {code!r}; torch.onnx.ops encodes "
                f"{sorted(_ATTR_TYPES)} (int, float, str and their lists)"
            )
        pool_name, scalar = _ATTR_TYPES[code]
        pool = pools[pool_name]
        if len(pos) != 2 or not 0 <= pos[0] <= pos[1] <= len(pool) or (scalar and pos[1] - pos[0] != 1):
            raise ctx.error(
                f"{where}: attribute {key!r} ({code}) points at {list(pos)} of {len(pool)} encoded {pool_name}"
            )
        attrs[key] = pool[pos[0]] if scalar else list(pool[pos[0] : pos[1]])
    return attrs


def _check_standard_op(
    ctx: ConversionContext, where: str, op_type: str, attrs: dict[str, Any], n_inputs: int, n_outputs: int
) -> dict[str, Any]:
    """An op of the standard domain against onnx's schema at the export's opset: it exists, takes
    these attributes (ints widened to floats where floats are wanted) and these counts of inputs and
    outputs; every required attribute is given."""
    import onnx.defs

    try:
        schema = onnx.defs.get_schema(op_type, ctx.opset, "")
    except onnx.defs.SchemaError:
        raise ctx.error(f"{where}: ONNX has no operator {op_type!r} at opset {ctx.opset}") from None
    kinds = onnx.defs.OpSchema.AttrType
    known = schema.attributes
    out: dict[str, Any] = {}
    for name, value in attrs.items():
        if name not in known:
            raise ctx.error(
                f"{where}: {op_type} (opset {ctx.opset}) has no attribute {name!r}; its attributes: "
                f"{sorted(known) or 'none'}"
            )
        want = known[name].type
        if want == kinds.FLOAT and isinstance(value, int):
            value = float(value)
        elif want == kinds.FLOATS and isinstance(value, list) and all(isinstance(v, int) for v in value):
            value = [float(v) for v in value]
        if isinstance(value, list):
            got = {int: kinds.INTS, float: kinds.FLOATS, str: kinds.STRINGS}.get(
                type(value[0]) if value else int
            )
        else:
            got = {int: kinds.INT, float: kinds.FLOAT, str: kinds.STRING}.get(type(value))
        if got != want:
            raise ctx.error(
                f"{where}: attribute {name!r} of {op_type} is {str(want).rpartition('.')[2]}, got "
                f"{type(value).__name__} {value!r}"
            )
        out[name] = value
    missing = [n for n, a in known.items() if a.required and n not in attrs]
    if missing:
        raise ctx.error(f"{where}: {op_type} needs the attributes {missing}")
    if not schema.min_input <= n_inputs <= schema.max_input:
        raise ctx.error(
            f"{where}: {op_type} takes {schema.min_input} to {schema.max_input} inputs, got {n_inputs}"
        )
    if not schema.min_output <= n_outputs <= schema.max_output:
        raise ctx.error(
            f"{where}: {op_type} makes {schema.min_output} to {schema.max_output} outputs, "
            f"{n_outputs} declared"
        )
    return out


def _import_domain(ctx: ConversionContext, where: str, domain: str, version: int | None) -> None:
    """The model imports ``domain`` at ``version`` (1 when None and not imported yet); a second
    version of a domain already imported is an error naming both."""
    if domain == "":
        if version is not None and version != ctx.opset:
            raise OpsetError(
                f"{where}: the op declares version {version} of the standard ONNX domain, the export "
                f"targets opset {ctx.opset}; a model imports one version per domain (drop version= or "
                f"export with opset={version})"
            )
        return
    current = ctx.g.opsets().get(domain)
    if current is None:
        ctx.g.set_opset(domain, 1 if version is None else version)
    elif version is not None and version != current:
        raise OpsetError(
            f"{where}: the op declares domain {domain!r} at version {version}, but the model already "
            f"imports it at version {current} (declared by an earlier op); a model imports one version "
            "per domain"
        )


def _emit_symbolic(
    ctx: ConversionContext,
    what: str,
    inputs: Sequence[Value | None],
    op_type: str,
    onnx_dtypes: Sequence[int],
    shapes: Sequence[Any],
    attr_keys: Sequence[str],
    attr_types: Sequence[str],
    attr_pos: Sequence[Sequence[int]],
    attr_ints: Sequence[int],
    attr_floats: Sequence[float],
    attr_strs: Sequence[str],
    domain: str,
    version: int | None,
) -> list[str]:
    shown = f"{domain}::{op_type}" if domain else op_type
    where = f"{_label(ctx, what)} {shown!r}"
    if not isinstance(op_type, str) or not op_type:
        raise ctx.error(f"{where}: the op type must be a non-empty string")
    if domain == "ai.onnx":
        domain = ""
    if len(onnx_dtypes) != len(shapes):
        raise ctx.error(f"{where}: {len(onnx_dtypes)} output dtypes but {len(shapes)} output shapes")
    if not onnx_dtypes:
        raise ctx.error(f"{where}: the op declares no output")
    recorded = ctx.out if isinstance(ctx.out, (list, tuple)) else [ctx.out]
    for i, (code, val) in enumerate(zip(onnx_dtypes, recorded)):
        if code in _UNDECLARABLE:
            raise ctx.error(
                f"{where}: output {i} is declared ONNX {_UNDECLARABLE[code]} ({code}), which torch records "
                "as another dtype (uint8 for 4-bit integers, none for strings): fastonnx cannot declare it"
            )
        if code not in dtypes.ONNX_TO_TORCH:
            raise ctx.error(
                f"{where}: output {i} has dtype {code!r}, not an ONNX data type fastonnx knows "
                f"({sorted(dtypes.ONNX_TO_TORCH)})"
            )
        if isinstance(val, torch.Tensor) and val.dtype != dtypes.ONNX_TO_TORCH[code]:
            raise ctx.error(
                f"{where}: output {i} is declared ONNX type {code} ({dtypes.ONNX_TO_TORCH[code]}) but torch "
                f"recorded {val.dtype}"
            )
    attrs = _decode_attributes(
        ctx,
        where,
        attr_keys,
        attr_types,
        attr_pos,
        {"ints": attr_ints, "floats": attr_floats, "strs": attr_strs},
    )
    if any(x is not None and not isinstance(x, Value) for x in inputs):
        raise ctx.error(f"{where}: inputs must be tensors or None, got {list(inputs)!r}")
    names = [x.name if isinstance(x, Value) else "" for x in inputs]
    while names and names[-1] == "":
        names.pop()
    if domain == "":
        attrs = _check_standard_op(ctx, where, op_type, attrs, len(names), len(onnx_dtypes))
    _import_domain(ctx, where, domain, version)
    # the builder directly: ctx.op's own keywords (outputs=, domain=) could be attribute names
    return ctx.g.add_node(op_type, names, len(onnx_dtypes), attrs, domain)


def convert_symbolic(
    ctx: ConversionContext,
    inputs: Sequence[Value | None],
    op_type: str,
    onnx_dtype: int,
    *,
    shape: Sequence[Any],
    attr_keys: Sequence[str],
    attr_types: Sequence[str],
    attr_pos: Sequence[Sequence[int]],
    attr_ints: Sequence[int],
    attr_floats: Sequence[float],
    attr_strs: Sequence[str],
    metadata_props_keys: Sequence[str] = (),
    metadata_props_values: Sequence[str] = (),
    domain: str = "",
    version: int | None = None,
) -> str:
    """torch.onnx.ops.symbolic: the named op with one output of the declared dtype and shape."""
    return _emit_symbolic(
        ctx,
        "symbolic",
        inputs,
        op_type,
        [onnx_dtype],
        [shape],
        attr_keys,
        attr_types,
        attr_pos,
        attr_ints,
        attr_floats,
        attr_strs,
        domain,
        version,
    )[0]


def convert_symbolic_multi_out(
    ctx: ConversionContext,
    inputs: Sequence[Value | None],
    op_type: str,
    onnx_dtypes: Sequence[int],
    *,
    shapes: Sequence[Any],
    attr_keys: Sequence[str],
    attr_types: Sequence[str],
    attr_pos: Sequence[Sequence[int]],
    attr_ints: Sequence[int],
    attr_floats: Sequence[float],
    attr_strs: Sequence[str],
    metadata_props_keys: Sequence[str] = (),
    metadata_props_values: Sequence[str] = (),
    domain: str = "",
    version: int | None = None,
) -> list[str]:
    """torch.onnx.ops.symbolic_multi_out: the named op with the declared outputs."""
    return _emit_symbolic(
        ctx,
        "symbolic_multi_out",
        inputs,
        op_type,
        onnx_dtypes,
        shapes,
        attr_keys,
        attr_types,
        attr_pos,
        attr_ints,
        attr_floats,
        attr_strs,
        domain,
        version,
    )


# ---- RotaryEmbedding ----------------------------------------------------------------------------
def convert_rotary_embedding(
    ctx: ConversionContext,
    x: Value,
    cos_cache: Value,
    sin_cache: Value,
    position_ids: Value | None = None,
    *,
    interleaved: bool = False,
    num_heads: int = 0,
    rotary_embedding_dim: int = 0,
) -> str:
    """ONNX RotaryEmbedding (opset 23): x (batch, heads, seq, head size), or (batch, seq, heads · head
    size) with num_heads; its first ``rotary_embedding_dim`` features of each head (all when 0) rotated
    by pairs — halves, or neighbours when interleaved — with cos / sin read at ``position_ids`` from
    2-D caches, or given per (batch, seq) by 3-D ones. Below opset 23: Gather, Reshape into pairs,
    Split, Mul / Sub / Add, Concat."""
    where = _label(ctx, "rotary_embedding")
    if x.rank not in (3, 4):
        raise ctx.error(f"{where}: the input must be 3-D or 4-D, got shape {tuple(x.shape)}")
    if x.rank == 3 and num_heads <= 0:
        raise ctx.error(f"{where}: a 3-D input (batch, seq, hidden) needs num_heads")
    cache_rank = 2 if position_ids is not None else 3
    if cos_cache.rank != cache_rank or sin_cache.rank != cache_rank:
        raise ctx.error(
            f"{where}: cos_cache and sin_cache must be {cache_rank}-D "
            f"{'with' if position_ids is not None else 'without'} position_ids, got shapes "
            f"{tuple(cos_cache.shape)} and {tuple(sin_cache.shape)}"
        )
    if rotary_embedding_dim < 0 or rotary_embedding_dim % 2:
        raise ctx.error(f"{where}: rotary_embedding_dim must be even and >= 0, got {rotary_embedding_dim}")
    head = x.shape[-1] if x.rank == 4 else None
    if x.rank == 3 and isinstance(x.shape[-1], int):
        if x.shape[-1] % num_heads:
            raise ctx.error(f"{where}: hidden size {x.shape[-1]} is not a multiple of num_heads {num_heads}")
        head = x.shape[-1] // num_heads
    rotated = rotary_embedding_dim or head
    half = cos_cache.shape[-1]
    if isinstance(rotated, int) and isinstance(half, int) and half * 2 != rotated:
        raise ctx.error(
            f"{where}: the caches' last dim {half} must be half the rotated size {rotated} "
            f"({'rotary_embedding_dim' if rotary_embedding_dim else 'head size'})"
        )
    if isinstance(head, int) and rotary_embedding_dim > head:
        raise ctx.error(f"{where}: rotary_embedding_dim {rotary_embedding_dim} exceeds the head size {head}")
    cos = ctx.cast(cos_cache, x.dtype)
    sin = ctx.cast(sin_cache, x.dtype)
    if position_ids is not None:
        position_ids = Value(ctx.cast(position_ids, torch.int64), torch.int64, position_ids.shape)
    if ctx.opset >= FIRST_OPSET:
        return ctx.op(
            "RotaryEmbedding",
            x,
            cos,
            sin,
            position_ids,
            interleaved=int(bool(interleaved)),
            num_heads=num_heads if x.rank == 3 else None,  # ONNX's for 3-D inputs; torch ignores it for 4-D
            rotary_embedding_dim=rotary_embedding_dim or None,
        )
    if position_ids is not None:
        cos = ctx.op("Gather", cos, position_ids, axis=0)  # (batch, seq, half)
        sin = ctx.op("Gather", sin, position_ids, axis=0)
    if x.rank == 4:  # (batch, heads, seq, head): the caches broadcast over the heads
        xs = x.name
        cos, sin = unsqueeze(ctx, cos, [1]), unsqueeze(ctx, sin, [1])
    else:  # (batch, seq, heads, head)
        xs = ctx.op("Reshape", x, ctx.i64([0, 0, num_heads, -1]))
        cos, sin = unsqueeze(ctx, cos, [2]), unsqueeze(ctx, sin, [2])
    passed = None
    if rotary_embedding_dim and not (isinstance(head, int) and rotary_embedding_dim == head):
        axis = ctx.i64([3])
        passed = ctx.op("Slice", xs, ctx.i64([rotary_embedding_dim]), ctx.i64([INT64_MAX]), axis)
        xs = ctx.op("Slice", xs, ctx.i64([0]), ctx.i64([rotary_embedding_dim]), axis)
    # pairs on an axis of their own: (..., 2, half) for halves, (..., half, 2) for neighbours
    pair_axis = 4 if interleaved else 3
    pairs = ctx.op("Reshape", xs, ctx.i64([0, 0, 0, -1, 2] if interleaved else [0, 0, 0, 2, -1]))
    cos, sin = unsqueeze(ctx, cos, [pair_axis]), unsqueeze(ctx, sin, [pair_axis])
    x1, x2 = split(ctx, pairs, [1, 1], pair_axis)
    real = ctx.op("Sub", ctx.op("Mul", cos, x1), ctx.op("Mul", sin, x2))
    imag = ctx.op("Add", ctx.op("Mul", sin, x1), ctx.op("Mul", cos, x2))
    out = ctx.op("Reshape", ctx.op("Concat", real, imag, axis=pair_axis), ctx.i64([0, 0, 0, -1]))
    if passed is not None:
        out = ctx.op("Concat", out, passed, axis=3)
    if x.rank == 3:
        out = ctx.op("Reshape", out, ctx.i64([0, 0, -1]))
    return out


# ---- Attention ---------------------------------------------------------------------------------
def _output_used(ctx: ConversionContext, index: int) -> bool:
    """Whether output ``index`` of the current multi-output node is read."""
    assert ctx.node is not None
    return any(u.args[1] == index and u.users for u in ctx.node.users if len(u.args) > 1)


def _broadcast(a: Sequence[Any], b: Sequence[Any]) -> tuple[Any, ...]:
    """The broadcast of two recorded shapes (a static dim other than 1 preferred to a symbolic one)."""
    n = max(len(a), len(b))
    a = [1] * (n - len(a)) + list(a)
    b = [1] * (n - len(b)) + list(b)
    out = []
    for x, y in zip(a, b):
        if isinstance(x, int) and x == 1:
            out.append(y)
        elif isinstance(y, int) and y == 1:
            out.append(x)
        else:
            out.append(x if isinstance(x, int) else y)
    return tuple(out)


def _heads(ctx: ConversionContext, x: Value, rank3_heads: int, name: str) -> tuple[str, Value]:
    """(batch, heads, seq, head size) from a 4-D input as it is, or from a 3-D (batch, seq, heads ·
    head size) one with ``rank3_heads`` heads; with a Value recording what is known of its shape."""
    if x.rank == 4:
        return x.name, x
    hidden = x.shape[-1]
    if isinstance(hidden, int) and hidden % rank3_heads:
        raise ctx.error(f"{name}'s hidden size {hidden} is not a multiple of its {rank3_heads} heads")
    size = hidden // rank3_heads if isinstance(hidden, int) else None
    split_heads = ctx.op("Reshape", x, ctx.i64([0, 0, rank3_heads, -1]))
    out = ctx.op("Transpose", split_heads, perm=[0, 2, 1, 3])
    return out, Value(out, x.dtype, (x.shape[0], rank3_heads, x.shape[1], size))


def _same_dim(ctx: ConversionContext, a: Any, b: Any) -> bool:
    return ctx.dim(a) == ctx.dim(b)


def convert_attention(
    ctx: ConversionContext,
    q: Value,
    k: Value,
    v: Value,
    attn_mask: Value | None = None,
    past_key: Value | None = None,
    past_value: Value | None = None,
    *,
    is_causal: bool = False,
    kv_num_heads: int = 0,
    q_num_heads: int = 0,
    qk_matmul_output_mode: int = 0,
    scale: float | None = None,
    softcap: float = 0.0,
    softmax_precision: int | None = None,
) -> list[str | None]:
    """ONNX Attention (opset 23; the module docstring lists where torch's eager kernel differs):
    (output, present key, present value, Q·Kᵀ in the form ``qk_matmul_output_mode`` picks). Below
    opset 23, the composition torch's scaled_dot_product_attention converter emits (scale on q,
    MatMul, Where / Add mask, Softmax, rows closed zeroed, MatMul), with the past concatenated before
    the new keys and the causal mask shifted by its length."""
    where = _label(ctx, "attention")
    if not q.rank == k.rank == v.rank or q.rank not in (3, 4):
        raise ctx.error(
            f"{where}: Q, K and V must all be 3-D or all 4-D, got shapes {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}"
        )
    if q.rank == 3 and (q_num_heads <= 0 or kv_num_heads <= 0):
        raise ctx.error(f"{where}: 3-D Q, K and V need q_num_heads and kv_num_heads")
    if (past_key is None) != (past_value is None):
        raise ctx.error(f"{where}: past_key and past_value go together")
    if past_key is not None and past_key.rank != 4:
        raise ctx.error(f"{where}: past_key must be 4-D (batch, kv heads, past length, head size)")
    if qk_matmul_output_mode not in (0, 1, 2, 3):
        raise ctx.error(f"{where}: qk_matmul_output_mode must be 0, 1, 2 or 3, got {qk_matmul_output_mode}")
    if softmax_precision is not None and softmax_precision not in _SOFTMAX_PRECISIONS:
        raise ctx.error(
            f"{where}: softmax_precision must be one of the ONNX float types {sorted(_SOFTMAX_PRECISIONS)}, "
            f"got {softmax_precision}"
        )
    if softcap < 0:
        raise ctx.error(f"{where}: softcap must be >= 0, got {softcap}")
    q_heads = q.shape[1] if q.rank == 4 else q_num_heads
    kv_heads = k.shape[1] if k.rank == 4 else kv_num_heads
    if isinstance(q_heads, int) and isinstance(kv_heads, int) and q_heads % kv_heads:
        raise ctx.error(f"{where}: {q_heads} query heads are not a multiple of {kv_heads} key/value heads")
    total = k.shape[-2] if k.rank == 4 else k.shape[1]
    if past_key is not None:
        past_len = past_key.shape[2]
        total = total + past_len if isinstance(total, int) and isinstance(past_len, int) else None
    if attn_mask is not None:
        last = attn_mask.shape[-1] if attn_mask.rank else None
        if isinstance(last, int) and isinstance(total, int) and last != total:
            raise ctx.error(
                f"{where}: attn_mask's last dim is {last}, the keys number {total} (past + new): ONNX "
                "pads a shorter mask with masked keys, onnxruntime refuses it; pass a mask covering "
                "every key"
            )
        if attn_mask.dtype != torch.bool and attn_mask.dtype != q.dtype:
            attn_mask = Value(ctx.cast(attn_mask, q.dtype), q.dtype, attn_mask.shape)
    wants_qk = _output_used(ctx, 3)
    if ctx.opset >= FIRST_OPSET:
        three_d = q.rank == 3
        outs = ctx.op(
            "Attention",
            q,
            k,
            v,
            attn_mask,
            past_key,
            past_value,
            outputs=4 if wants_qk else 3,
            is_causal=int(bool(is_causal)),
            q_num_heads=q_num_heads if three_d else None,
            kv_num_heads=kv_num_heads if three_d else None,
            qk_matmul_output_mode=qk_matmul_output_mode or None,
            scale=None if scale is None else float(scale),
            softcap=float(softcap) if softcap else None,
            softmax_precision=softmax_precision,
        )
        return [*outs, None] if not wants_qk else list(outs)
    return _compose_attention(
        ctx,
        q,
        k,
        v,
        attn_mask,
        past_key,
        past_value,
        is_causal=is_causal,
        heads=(q_num_heads, kv_num_heads),
        mode=qk_matmul_output_mode if wants_qk else None,
        scale=scale,
        softcap=softcap,
        softmax_dtype=None if softmax_precision is None else _SOFTMAX_PRECISIONS[softmax_precision],
    )


def _compose_attention(
    ctx: ConversionContext,
    q: Value,
    k: Value,
    v: Value,
    attn_mask: Value | None,
    past_key: Value | None,
    past_value: Value | None,
    *,
    is_causal: bool,
    heads: tuple[int, int],
    mode: int | None,
    scale: float | None,
    softcap: float,
    softmax_dtype: torch.dtype | None,
) -> list[str | None]:
    """Attention of standard ops (opsets 17 to 22); ``mode`` None when the fourth output is unread."""
    where = _label(ctx, "attention")
    q4, qv = _heads(ctx, q, heads[0], "Q")
    k4, kv = _heads(ctx, k, heads[1], "K")
    v4, vv = _heads(ctx, v, heads[1], "V")
    if past_key is not None and past_value is not None:
        present_key = ctx.op("Concat", past_key, k4, axis=2)
        present_value = ctx.op("Concat", past_value, v4, axis=2)
        news, past = kv.shape[2], past_key.shape[2]
        length = news + past if isinstance(news, int) and isinstance(past, int) else None
        kv = Value(present_key, k.dtype, (*kv.shape[:2], length, kv.shape[3]))
        vv = Value(present_value, v.dtype, (*vv.shape[:2], length, vv.shape[3]))
    else:
        present_key, present_value = k4, v4
    work = opmath_dtype(q.dtype)
    qn, kn, vn = ctx.cast(q4, work), ctx.cast(present_key, work), ctx.cast(present_value, work)
    q_heads, kv_heads = qv.shape[1], kv.shape[1]
    if not _same_dim(ctx, q_heads, kv_heads):
        if not isinstance(q_heads, int):
            raise ctx.error(f"{where}: grouped-query attention needs a static number of query heads")
        kn = repeat_kv_heads(ctx, kn, kv, q_heads)
        vn = repeat_kv_heads(ctx, vn, vv, q_heads)
    scores = ctx.op(
        "MatMul",
        ctx.op("Mul", qn, attention_scale(ctx, qv, scale, work)),
        ctx.op("Transpose", kn, perm=[0, 1, 3, 2]),
    )
    raw = scores
    if softcap:
        cap = ctx.const(float(softcap), work)
        scores = ctx.op("Mul", ctx.op("Tanh", ctx.op("Div", scores, cap)), cap)
    capped = scores
    neg_inf = ctx.const(-math.inf, work)
    closed = None
    mask = attn_mask
    if is_causal:
        # ONNX aligns it bottom-right: the new queries come after the past keys
        offset = dim_scalar(ctx, past_key, 2) if past_key is not None else 0
        allowed = causal_mask(ctx, qv, kv, offset)
        rows_by_keys = (qv.shape[2], kv.shape[2])
        if mask is None:
            scores = ctx.op("Where", allowed, scores, neg_inf)
        elif mask.dtype == torch.bool:
            both = ctx.op("And", mask, allowed)
            scores = ctx.op("Where", both, scores, neg_inf)
            closed = closed_rows(ctx, Value(both, torch.bool, _broadcast(mask.shape, rows_by_keys)))
        else:
            bias = ctx.op("Where", allowed, ctx.cast(mask, work), neg_inf)
            scores = ctx.op("Add", scores, bias)
            closed = closed_rows(ctx, Value(bias, work, _broadcast(mask.shape, rows_by_keys)))
    elif mask is not None:
        if mask.dtype == torch.bool:
            scores = ctx.op("Where", mask, scores, neg_inf)
        else:
            scores = ctx.op("Add", scores, ctx.cast(mask, work))
        closed = closed_rows(ctx, mask)
    biased = scores
    if softmax_dtype is not None and softmax_dtype != work:
        probs = ctx.cast(ctx.op("Softmax", ctx.cast(scores, softmax_dtype), axis=-1), work)
    else:
        probs = ctx.op("Softmax", scores, axis=-1)
    if closed is not None:
        # rows whose every key is masked: zeros, as ONNX specifies (softmax gives NaN there)
        probs = ctx.op("Where", closed, ctx.const(0.0, work), probs)
    out = ctx.op("MatMul", probs, vn)
    if q.rank == 3:
        out = ctx.op("Reshape", ctx.op("Transpose", out, perm=[0, 2, 1, 3]), ctx.i64([0, 0, -1]))
    qk = None
    if mode is not None:
        qk = ctx.cast((raw, capped, biased, probs)[mode], q.dtype)
    return [ctx.cast(out, q.dtype), present_key, present_value, qk]


CONVERTERS: dict[str, Converter] = {
    "onnx_symbolic._symbolic.default": convert_symbolic,
    "onnx_symbolic._symbolic_multi_out.default": convert_symbolic_multi_out,
    "onnx.RotaryEmbedding.opset23": convert_rotary_embedding,
    "onnx.Attention.opset23": convert_attention,
}
