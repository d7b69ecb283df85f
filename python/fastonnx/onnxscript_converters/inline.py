"""An onnxscript function's FunctionProto inlined: its nodes emitted into the graph being built.

The call binds the function's formal inputs to graph values and its attributes to the caller's values
(the FunctionProto's defaults filling the others); a node attribute referring to a function attribute
(``<value_float = @alpha>``) takes the bound value, or is left out when the attribute was not given and
has no default, as ONNX's function semantics say. Subgraphs (If / Loop / Scan bodies) become subgraph
builders; calls to other functions of the script (a node whose domain and op name a function of the
call tree) are inlined in turn. Every node goes through ``script_nodes.emit_script_node`` with the version its function
imports for its domain.
"""

from __future__ import annotations

import contextlib
from collections import ChainMap
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from typing import Any

import onnx
import onnx.helper

from fastonnx._core import GraphBuilder
from fastonnx.context import ConversionContext
from fastonnx.errors import ConversionError
from fastonnx.onnxscript_converters.script_nodes import (
    Dims,
    TypeLookup,
    as_tensor_proto,
    dims_of,
    emit_script_node,
    value_type,
)

A = onnx.AttributeProto
Scope = MutableMapping[str, str]


@contextlib.contextmanager
def emitting_into(ctx: ConversionContext, sub: GraphBuilder) -> Iterator[None]:
    """``ctx`` emits into subgraph ``sub`` inside the block (the walker's ``emitting_into`` for what
    the context holds)."""
    saved = (ctx.g, dict(ctx.sym_values))
    ctx.g = sub
    try:
        yield
    finally:
        ctx.g, ctx.sym_values = saved


# ---- attribute values ------------------------------------------------------------------------------
def _text(v: Any) -> Any:
    return v.decode() if isinstance(v, bytes) else v


def coerce(value: Any, attr_type: int, what: str) -> Any:
    """A caller's Python value as an attribute of ONNX type ``attr_type`` (an int given for a float
    attribute becomes a float...); unknown types pass as they are."""
    try:
        if attr_type == A.FLOAT:
            return float(value)
        if attr_type == A.INT:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(f"{value} is not an integer")
            return int(value)
        if attr_type == A.STRING:
            return _text(value) if isinstance(value, (str, bytes)) else str(value)
        if attr_type == A.FLOATS:
            return [float(v) for v in value]
        if attr_type == A.INTS:
            return [int(v) for v in value]
        if attr_type == A.STRINGS:
            return [_text(v) for v in value]
        if attr_type == A.TENSOR:
            return as_tensor_proto(value)
    except (TypeError, ValueError) as e:
        raise ConversionError(
            f"{what}: {value!r} cannot be a {A.AttributeType.Name(attr_type)} attribute ({e})"
        ) from None
    return value


def _proto_attr_value(a: onnx.AttributeProto) -> Any:
    """A plain (not graph) AttributeProto's value as the builder takes it."""
    if a.type == A.TENSOR:
        return a.t
    if a.type in (
        A.GRAPH,
        A.GRAPHS,
        A.TENSORS,
        A.SPARSE_TENSOR,
        A.SPARSE_TENSORS,
        A.TYPE_PROTO,
        A.TYPE_PROTOS,
    ):
        raise ConversionError(
            f"attribute {a.name!r} is a {A.AttributeType.Name(a.type)}, which fastonnx cannot emit from "
            "an onnxscript function"
        )
    value = onnx.helper.get_attribute_value(a)
    if isinstance(value, list):
        return [_text(v) for v in value]
    return _text(value)


def function_defaults(fp: onnx.FunctionProto) -> dict[str, Any]:
    """The attribute defaults a FunctionProto declares."""
    return {a.name: _proto_attr_value(a) for a in fp.attribute_proto if a.type != A.UNDEFINED}


# ---- inlining --------------------------------------------------------------------------------------
class Inliner:
    """Inlines FunctionProtos into ``ctx.g``; ``functions`` holds those of the call tree by (domain,
    name)."""

    def __init__(
        self,
        ctx: ConversionContext,
        functions: Mapping[tuple[str, str], onnx.FunctionProto],
        lookup: TypeLookup | None = None,
    ) -> None:
        self.ctx = ctx
        self.functions = functions
        self._lookup = lookup
        self._outer: list[GraphBuilder] = []  # the builders around the subgraph being filled
        self._depth = 0

    def type_of(self, name: str) -> tuple[int, Dims | None] | None:
        """The type of a value of an enclosing builder, or the caller's lookup's."""
        for g in reversed(self._outer):
            elem = g.dtype(name)
            if elem:
                return elem, g.shape(name)
        return self._lookup(name) if self._lookup is not None else None

    def call(self, fp: onnx.FunctionProto, inputs: Sequence[str], attrs: Mapping[str, Any]) -> list[str]:
        """The names of ``fp``'s outputs once its nodes are emitted with ``inputs`` ("" for an omitted
        optional input) and ``attrs`` (None: not given)."""
        self._depth += 1
        if self._depth > 64:
            raise ConversionError(f"function {fp.domain}.{fp.name} calls itself (inlined 64 levels deep)")
        try:
            versions = {o.domain: o.version for o in fp.opset_import}
            scope: Scope = {}
            for i, formal in enumerate(fp.input):
                scope[formal] = inputs[i] if i < len(inputs) else ""
            bound = function_defaults(fp)
            bound.update({k: v for k, v in attrs.items() if v is not None})
            for node in fp.node:
                self._node(node, scope, bound, versions)
            missing = [o for o in fp.output if not scope.get(o)]
            if missing:
                raise ConversionError(f"function {fp.name} does not compute its outputs {missing}")
            return [scope[o] for o in fp.output]
        finally:
            self._depth -= 1

    def _node(
        self,
        node: onnx.NodeProto,
        scope: Scope,
        attrs: Mapping[str, Any],
        versions: Mapping[str, int],
    ) -> None:
        inputs = []
        for name in node.input:
            if name and name not in scope:
                raise ConversionError(f"{node.op_type} reads {name!r}, which the function does not define")
            inputs.append(scope[name] if name else "")
        node_attrs: dict[str, Any] = {}
        for a in node.attribute:
            if a.ref_attr_name:
                if a.ref_attr_name in attrs:
                    node_attrs[a.name] = coerce(
                        attrs[a.ref_attr_name], a.type, f"{node.op_type}'s attribute {a.name}"
                    )
            elif a.type == A.GRAPH:
                formal = self._body_input_types(node, inputs, node_attrs if a.name == "body" else {})
                node_attrs[a.name] = self.graph(a.g, scope, attrs, versions, formal)
            else:
                node_attrs[a.name] = _proto_attr_value(a)
        callee = self.functions.get((node.domain, node.op_type))
        if callee is not None:
            outputs = self.call(callee, inputs, node_attrs)
        else:
            written = versions.get(node.domain)
            if written is None and node.domain == "ai.onnx":
                written = versions.get("")
            outputs = emit_script_node(
                self.ctx,
                node.op_type,
                node.domain,
                written,
                inputs,
                node_attrs,
                [name for name in node.output],
                self.type_of,
            )
        for name, value in zip(node.output, outputs):
            if name:
                scope[name] = value

    def _body_input_types(
        self, node: onnx.NodeProto, inputs: Sequence[str], attrs: Mapping[str, Any]
    ) -> list[tuple[int, Dims | None] | None]:
        """The types of a Loop or Scan body's formal inputs, from the node's inputs (what the
        body's untyped inputs take: onnxscript leaves the loop-carried ones untyped)."""
        if node.domain not in ("", "ai.onnx") or node.op_type not in ("Loop", "Scan"):
            return []
        known = [value_type(self.ctx.g, name, self.type_of) if name else None for name in inputs]
        if node.op_type == "Loop":
            scalar: Dims = []
            return [(onnx.TensorProto.INT64, scalar), (onnx.TensorProto.BOOL, scalar), *known[2:]]
        scans = int(attrs.get("num_scan_inputs", 0) or 0)
        states = len(known) - scans
        # a scan input's element drops the scanned axis: its element type only
        return [*known[:states], *((k[0], None) if k is not None else None for k in known[states:])]

    def graph(
        self,
        gp: onnx.GraphProto,
        scope: Scope,
        attrs: Mapping[str, Any],
        versions: Mapping[str, int],
        formal: Sequence[tuple[int, Dims | None] | None] = (),
    ) -> GraphBuilder:
        """A graph attribute (an If branch, a Loop or Scan body) as a subgraph builder; names of the
        enclosing scopes stay visible inside it."""
        ctx = self.ctx
        sub = ctx.g.subgraph(ctx.g.unique_name(gp.name or "subgraph"))
        inner: Scope = ChainMap({}, scope)
        self._outer.append(ctx.g)
        try:
            with emitting_into(ctx, sub):
                self._fill(sub, gp, inner, attrs, versions, formal)
        finally:
            self._outer.pop()
        return sub

    def _fill(
        self,
        sub: GraphBuilder,
        gp: onnx.GraphProto,
        inner: Scope,
        attrs: Mapping[str, Any],
        versions: Mapping[str, int],
        formal: Sequence[tuple[int, Dims | None] | None],
    ) -> None:
        """Declares ``gp``'s inputs in ``sub`` (typed from ``formal`` where the proto leaves them
        untyped), emits its nodes, declares its outputs (typed: ONNX needs a subgraph output's type)."""
        ctx = self.ctx
        for i, vi in enumerate(gp.input):
            elem, dims = dims_of(vi.type)
            hint = formal[i] if i < len(formal) else None
            if not elem and hint is not None:
                elem, dims = hint
            inner[vi.name] = sub.add_input(sub.unique_name(vi.name), elem, dims)
        for init in gp.initializer:
            inner[init.name] = emit_script_node(ctx, "Constant", "", None, [], {"value": init}, [init.name])[
                0
            ]
        for node in gp.node:
            self._node(node, inner, attrs, versions)
        for vo in gp.output:
            if not inner.get(vo.name):
                raise ConversionError(f"subgraph {gp.name} does not compute its output {vo.name!r}")
            source = inner[vo.name]
            elem, dims = dims_of(vo.type)
            if not elem:
                known = value_type(sub, source, self.type_of)
                if known is None:
                    raise ConversionError(
                        f"the type of {vo.name!r}, an output of subgraph {gp.name}, cannot be told: "
                        "annotate it in the function (e.g. `x: FLOAT[...]`)"
                    )
                elem, dims = known
            out = sub.add_output(source, sub.unique_name(vo.name))
            sub.set_type(out, elem, dims)
