"""One ONNX node written for one opset, emitted into a graph of another.

A function written with ``onnxscript.opset18`` may land in a model of opset 20 (fastonnx's default) or
23. Each node is checked against the definition the model's opset gives its op: a definition that did
not change between the two opsets, or changed only in ways the node does not touch (new types, new
optional inputs or attributes), is emitted as written; an attribute that became an input of the same
name (``axes`` of the reductions at 18, DFT's ``axis`` at 20), or the reverse for a constant input, is
moved; anything else is an ``OpsetError`` naming the op, both opsets and what differs. Domains other
than the default one get their version from the function (the first to use a domain sets it).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnx.defs
import onnx.helper
import onnx.numpy_helper
import onnx.shape_inference
import torch

from fastonnx import dtypes
from fastonnx._core import GraphBuilder, TensorAttr
from fastonnx.context import ConversionContext
from fastonnx.errors import OpsetError

log = logging.getLogger("fastonnx")

Dims = list[int | str | None]
# the type of a value the current builder does not hold (an outer scope's, seen from a subgraph)
TypeLookup = Callable[[str], tuple[int, Dims | None] | None]

_SINGLE = onnx.defs.OpSchema.FormalParameterOption.Single
_VARIADIC = onnx.defs.OpSchema.FormalParameterOption.Variadic


def standard_domain(domain: str) -> str:
    return "" if domain == "ai.onnx" else domain


@functools.lru_cache(maxsize=4096)
def schema(op_type: str, version: int, domain: str) -> onnx.defs.OpSchema | None:
    """ONNX's definition of ``domain.op_type`` in force at opset ``version``, None when there is none."""
    try:
        return onnx.defs.get_schema(op_type, version, domain)
    except onnx.defs.SchemaError:
        return None


def target_version(ctx: ConversionContext, domain: str, written: int | None) -> int | None:
    """The version of ``domain`` in the model: the export's opset for the default domain; for another
    one the version already imported, else ``written`` (imported from now on)."""
    if domain == "":
        return ctx.opset
    imported = ctx.g.opsets().get(domain)
    if imported is not None:
        return imported
    version = written if written is not None else 1
    ctx.g.set_opset(domain, version)
    return version


def emit_script_node(
    ctx: ConversionContext,
    op_type: str,
    domain: str,
    written: int | None,
    inputs: Sequence[str],
    attrs: Mapping[str, Any],
    outputs: int | Sequence[str],
    lookup: TypeLookup | None = None,
) -> list[str]:
    """Emit ``domain.op_type`` as written for opset ``written`` (None: the model's) into ``ctx.g``;
    ``outputs`` is a count or one name hint per output ("" for an omitted output); ``lookup`` gives the
    types of values ``ctx.g`` does not hold. Returns the output names ("" where omitted)."""
    domain = standard_domain(domain)
    hints = [op_type.lower()] * outputs if isinstance(outputs, int) else list(outputs)
    target = target_version(ctx, domain, written)
    names = list(inputs)
    clean = {k: v for k, v in attrs.items() if v is not None}
    if written is not None and target is not None and written != target:
        names, clean = reconcile(ctx, domain, op_type, written, target, names, clean, len(hints))
    while names and names[-1] == "":
        names.pop()
    if domain == "" and op_type == "Constant" and len(hints) == 1 and len(clean) == 1:
        constant = _constant(ctx, *next(iter(clean.items())), hints[0])
        if constant is not None:
            return [constant]
    if domain == "" and op_type in ("Cast", "CastLike") and len(hints) == 1:
        folded = _fold_cast(ctx, op_type, names, clean, lookup)
        if folded is not None:
            return [folded]
    stored = {k: _tensor_attr(v) if isinstance(v, onnx.TensorProto) else v for k, v in clean.items()}
    result = ctx.g.add_node(op_type, names, hints, stored, domain)
    if target is not None:
        _infer_types(ctx, domain, op_type, target, names, clean, result, lookup)
    return result


# ---- tensors -------------------------------------------------------------------------------------
def _onnx_ir_tensor(value: Any) -> bool:
    return type(value).__module__.split(".", 1)[0] == "onnx_ir" and callable(getattr(value, "numpy", None))


def is_tensor_like(value: Any) -> bool:
    """Whether ``value`` is a tensor of some library (not a Python number or list)."""
    return (
        isinstance(value, (onnx.TensorProto, torch.Tensor, np.ndarray, np.generic))
        or isinstance(getattr(value, "value", None), np.ndarray)
        or _onnx_ir_tensor(value)
    )


def as_tensor_proto(value: Any) -> onnx.TensorProto:
    """A TensorProto from a TensorProto, an onnx_ir tensor (``ir.tensor(...)``), a numpy array, a torch
    tensor, onnxscript's eager tensor or a Python number / list (int64, float32 or bool, as onnxscript
    makes them)."""
    if isinstance(value, onnx.TensorProto):
        return value
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        raw = dtypes.tensor_bytes(t).tobytes()
        return onnx.helper.make_tensor("", dtypes.to_onnx_dtype(t.dtype), list(t.shape), raw, raw=True)
    if _onnx_ir_tensor(value):
        import onnx_ir  # onnxscript's dependency: present whenever such a tensor is

        proto: onnx.TensorProto = onnx_ir.serde.serialize_tensor(value)
        return proto
    if isinstance(getattr(value, "value", None), np.ndarray):  # onnxscript's eager Tensor
        value = value.value
    if not isinstance(value, (np.ndarray, np.generic)):
        value = np.asarray(value, dtype=_python_np_dtype(value))
    return onnx.numpy_helper.from_array(np.ascontiguousarray(value))


def _python_np_dtype(value: Any) -> Any:
    first = value
    while isinstance(first, (list, tuple)) and first:
        first = first[0]
    if isinstance(first, bool):
        return np.bool_
    if isinstance(first, int):
        return np.int64
    return np.float32


def _raw(t: onnx.TensorProto) -> bytes | None:
    """A TensorProto's bytes in ONNX's layout; None for the types numpy does not lay out so (strings,
    sub-byte types stored in the typed fields)."""
    if t.HasField("raw_data"):
        return t.raw_data
    if t.data_type in (onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED) or t.data_type not in (
        dtypes.TORCH_TO_ONNX.values()
    ):
        return None
    return bytes(onnx.numpy_helper.to_array(t).tobytes())


def _tensor_attr(t: onnx.TensorProto) -> TensorAttr:
    raw = _raw(t)
    if raw is None:
        name = onnx.TensorProto.DataType.Name(t.data_type)
        raise ValueError(f"a {name} tensor attribute is not supported")
    return TensorAttr(raw, t.data_type, list(t.dims))


_CONSTANT_DTYPES = {
    "value_float": torch.float32,
    "value_floats": torch.float32,
    "value_int": torch.int64,
    "value_ints": torch.int64,
}


def _constant(ctx: ConversionContext, key: str, value: Any, hint: str) -> str | None:
    """A Constant node's value as a constant of the builder (deduplicated, folded by the passes); None
    when the builder cannot hold it (strings, sparse tensors)."""
    if key in _CONSTANT_DTYPES:
        return ctx.const(value, _CONSTANT_DTYPES[key], hint=hint or "const")
    if key == "value" and isinstance(value, onnx.TensorProto):
        raw = _raw(value)
        if raw is not None:
            return ctx.g.add_constant(raw, value.data_type, list(value.dims), hint or "const")
    return None


_FLOATS = {
    onnx.TensorProto.FLOAT,
    onnx.TensorProto.DOUBLE,
    onnx.TensorProto.FLOAT16,
    onnx.TensorProto.BFLOAT16,
}


def _fold_cast(
    ctx: ConversionContext,
    op_type: str,
    inputs: Sequence[str],
    attrs: Mapping[str, Any],
    lookup: TypeLookup | None,
) -> str | None:
    """A Cast / CastLike of a constant to a float type (or to its own type) as a constant of that type:
    onnxscript writes ``CastLike(attribute, x)`` for every number it meets. None when it is not one."""
    if op_type == "Cast":
        if len(inputs) != 1 or not isinstance(attrs.get("to"), int) or len(attrs) != 1:
            return None
        target: int | None = attrs["to"]
    else:
        if len(inputs) != 2 or attrs:
            return None
        known = value_type(ctx.g, inputs[1], lookup)
        target = known[0] if known is not None else None
    source = ctx.g.dtype(inputs[0])
    if target is None or source is None or (target != source and target not in _FLOATS):
        return None
    if target == source:
        return inputs[0]
    value = _constant_value(ctx.g, inputs[0])
    if value is None or target not in dtypes.ONNX_TO_TORCH:
        return None
    return ctx.const(value, dtypes.to_torch_dtype(target))


# ---- versions ------------------------------------------------------------------------------------
def _qualified(domain: str, op_type: str) -> str:
    return f"{domain}.{op_type}" if domain else op_type


def reconcile(
    ctx: ConversionContext,
    domain: str,
    op_type: str,
    written: int,
    target: int,
    inputs: list[str],
    attrs: dict[str, Any],
    n_outputs: int,
) -> tuple[list[str], dict[str, Any]]:
    """The node's inputs and attributes for opset ``target`` (see the module docstring)."""
    new = schema(op_type, target, domain)
    old = schema(op_type, written, domain)
    name = _qualified(domain, op_type)
    if new is None:
        if old is None:
            return inputs, attrs  # an op ONNX does not define (a runtime's own): nothing to check
        since = (
            f"ONNX defines it from opset {old.since_version}"
            if target < old.since_version
            else f"ONNX no longer defines it at opset {target}"
        )
        raise OpsetError(
            f"{name} is written for opset {written} but opset {target} has no {name} ({since}): export "
            f"with opset={written}, or write the function for opset {target}"
        )
    if old is not None and old.since_version == new.since_version:
        return inputs, attrs
    why: list[str] = []
    old_formals = list(old.inputs) if old is not None else list(new.inputs)
    new_names = [f.name for f in new.inputs]
    placed: dict[int, str] = {}
    for i, value in enumerate(inputs):
        if not value:
            continue
        last = len(old_formals) - 1
        if i >= last and old_formals and old_formals[-1].option == _VARIADIC:
            formal = old_formals[-1].name
            if not (new.inputs and new.inputs[-1].option == _VARIADIC and new_names[-1] == formal):
                why.append(f"its variadic input {formal!r} is not variadic there")
                continue
            placed[len(new_names) - 1 + i - last] = value
            continue
        if i > last:
            why.append(f"it has {len(inputs)} inputs, the definition {len(old_formals)}")
            break
        formal = old_formals[i].name
        if formal in new_names:
            placed[new_names.index(formal)] = value
        elif formal in new.attributes:
            constant = _constant_value(ctx.g, value)
            if constant is None:
                why.append(f"input {formal!r} is an attribute there and the node's is not a constant")
            else:
                attrs[formal] = constant
        else:
            why.append(f"input {formal!r} is gone")
    for key in list(attrs):
        if key in new.attributes:
            continue
        if key in new_names:
            j = new_names.index(key)
            moved = _attribute_as_input(ctx, new, j, attrs.pop(key), placed)
            if moved is None:
                why.append(f"attribute {key!r} is an input there whose type cannot be told")
            else:
                placed[j] = moved
        else:
            why.append(f"attribute {key!r} is gone")
    for key, attr in new.attributes.items():
        if attr.required and key not in attrs:
            why.append(f"attribute {key!r} is required there")
    for j, parameter in enumerate(new.inputs):
        if parameter.option == _SINGLE and j not in placed:
            why.append(f"input {parameter.name!r} is required there")
    variadic_out = bool(new.outputs) and new.outputs[-1].option == _VARIADIC
    if n_outputs > len(new.outputs) and not variadic_out:
        why.append(f"it has {n_outputs} outputs, the definition at opset {target} {len(new.outputs)}")
    if why:
        was = f"opset {old.since_version}'s" if old is not None else "its"
        raise OpsetError(
            f"{name} is written for opset {written} ({was} definition) but the model's opset {target} "
            f"defines it anew (opset {new.since_version}): {'; '.join(why)}. Export with "
            f"opset={written}, or write the function for opset {target}"
        )
    width = max(placed, default=-1) + 1
    return [placed.get(j, "") for j in range(width)], attrs


def _constant_value(g: GraphBuilder, name: str) -> Any:
    """The Python value (a number, or a list) of constant ``name``, None when it is not a constant."""
    raw = g.constant_bytes(name)
    elem = g.dtype(name)
    shape = g.shape(name)
    dims = _static(shape)
    if raw is None or elem is None or dims is None:
        return None
    array = np.frombuffer(raw, dtype=onnx.helper.tensor_dtype_to_np_dtype(elem)).reshape(dims)
    return array.tolist()


def dims_of(t: onnx.TypeProto) -> tuple[int, Dims | None]:
    """A tensor TypeProto's element type (0: not a tensor) and dims (None: no shape)."""
    if not t.HasField("tensor_type"):
        return 0, None
    tensor = t.tensor_type
    if not tensor.HasField("shape"):
        return tensor.elem_type, None
    dims: Dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor.shape.dim]
    return tensor.elem_type, dims


def _static(shape: Sequence[int | str | None] | None) -> list[int] | None:
    """The dims as ints, None when one is symbolic or unknown."""
    if shape is None or not all(isinstance(d, int) for d in shape):
        return None
    return [int(d) for d in shape if d is not None]


def _flat(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _flat(v)]
    return [value]


def _attribute_as_input(
    ctx: ConversionContext, new: onnx.defs.OpSchema, j: int, value: Any, placed: Mapping[int, str]
) -> str | None:
    """An attribute's value as the constant input ``j`` of definition ``new``: its type is the input's
    when the definition fixes it (``axes``: int64), else the type of an input sharing its type
    variable; None when neither tells it."""
    formal = new.inputs[j]
    constraint = {c.type_param_str: c.allowed_type_strs for c in new.type_constraints}
    allowed = constraint.get(formal.type_str, [formal.type_str])
    elem: int | None = None
    if "tensor(int64)" in allowed and all(isinstance(v, int) for v in _flat(value)):
        elem = onnx.TensorProto.INT64
    else:
        for k, other in enumerate(new.inputs):
            if k != j and other.type_str == formal.type_str and placed.get(k):
                elem = ctx.g.dtype(placed[k])
                break
    if elem is None:
        return None
    return ctx.const(value, dtypes.to_torch_dtype(elem), hint=formal.name)


# ---- types of what was emitted ---------------------------------------------------------------------
def value_type(g: GraphBuilder, name: str, lookup: TypeLookup | None) -> tuple[int, Dims | None] | None:
    """The element type and dims of ``name``: the builder's, else ``lookup``'s; None when unknown."""
    elem = g.dtype(name)
    if elem:
        return elem, g.shape(name)
    return lookup(name) if lookup is not None else None


def _infer_types(
    ctx: ConversionContext,
    domain: str,
    op_type: str,
    version: int,
    inputs: Sequence[str],
    attrs: Mapping[str, Any],
    outputs: Sequence[str],
    lookup: TypeLookup | None,
) -> None:
    """Declares the dtype and shape ONNX's inference gives each output (what the onnxscript functions
    read as ``x.dtype`` / ``x.shape`` of an intermediate value). Best effort: an op ONNX does not
    define, a tensor or graph attribute, an input of unknown type or a failing inference leave the
    builder's own guess."""
    s = schema(op_type, version, domain)
    if s is None or any(isinstance(v, (TensorAttr, GraphBuilder)) for v in attrs.values()):
        return  # a graph attribute, or a tensor given as the builder's TensorAttr (opaque)
    g = ctx.g
    types: dict[str, onnx.TypeProto] = {}
    data: dict[str, onnx.TensorProto] = {}
    for name in inputs:
        if not name:
            continue
        known = value_type(g, name, lookup)
        if known is None:
            return
        elem, shape = known
        types[name] = onnx.helper.make_tensor_type_proto(elem, shape)
        raw = g.constant_bytes(name)
        static = _static(shape)
        if raw is not None and static is not None:
            data[name] = onnx.helper.make_tensor(name, elem, static, raw, raw=True)
    try:
        node = onnx.helper.make_node(op_type, list(inputs), list(outputs), domain=domain, **attrs)
        inferred = onnx.shape_inference.infer_node_outputs(
            s,
            node,
            types,
            data,
            opset_imports=[onnx.helper.make_opsetid(domain, version)],
        )
    except Exception as e:
        log.debug("no type inference for %s: %s", op_type, e)
        return
    for name in outputs:
        t = inferred.get(name)
        if not name or t is None or not t.HasField("tensor_type") or not t.tensor_type.elem_type:
            continue
        g.set_type(name, *dims_of(t))
