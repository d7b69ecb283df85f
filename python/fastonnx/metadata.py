"""Node metadata and readable node names, under the keys the official exporter (torch.onnx.export with
dynamo=True) writes, so that Netron and the tools reading those keys work unchanged.

Every ONNX node made from an FX node carries, in ``metadata_props``:

- ``namespace``: ``"{path}: {class}"`` per module level then ``"{fx node}: {aten op}"``, joined by ``/``;
- ``pkg.torch.onnx.class_hierarchy``: the modules' classes then the aten op (a Python list's repr);
- ``pkg.torch.onnx.name_scopes``: the modules' paths then the FX node's name (a list's repr);
- ``pkg.torch.onnx.fx_node``: the FX node as ``torch.fx.Node.format_node`` prints it;
- ``pkg.torch.onnx.stack_trace``: the user's stack where the op was called.

Its name reads where it comes from, as the TorchScript exporter's did: ``/model/layers.0/self_attn/
q_proj/MatMul`` (``/MatMul`` at the top level), made unique with ``_1``, ``_2``... in graph order.

The walker hands the builder one scope per FX node and switches to it before converting the node; the
builder stores the scope once and each node an index into it. The parts that depend on the module
stack only, or on the target only, are computed here once; the builder composes each FX node's values
(``GraphBuilder.add_fx_scope``: formatting them in Python cost ~25 us per FX node, most of the
metadata's cost), torch's printer gives the FX node's text where arguments are not plain.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.export.graph_signature import InputKind

from fastonnx._core import GraphBuilder

NAMESPACE = "namespace"
CLASS_HIERARCHY = "pkg.torch.onnx.class_hierarchy"
NAME_SCOPES = "pkg.torch.onnx.name_scopes"
FX_NODE = "pkg.torch.onnx.fx_node"
STACK_TRACE = "pkg.torch.onnx.stack_trace"
NODE_KEYS = (NAMESPACE, CLASS_HIERARCHY, NAME_SCOPES, FX_NODE, STACK_TRACE)

GRAPH_SIGNATURE = "pkg.torch.export.ExportedProgram.graph_signature"
RANGE_CONSTRAINTS = "pkg.torch.export.ExportedProgram.range_constraints"
INPUT_KIND = "pkg.torch.export.graph_signature.InputSpec.kind"
INPUT_PERSISTENT = "pkg.torch.export.graph_signature.InputSpec.persistent"
OUTPUT_KIND = "pkg.torch.export.graph_signature.OutputSpec.kind"
ORIGINAL_NAME = "pkg.torch.onnx.original_node_name"


class _ModuleLevels:
    """What a module stack gives every node under it: the name prefix and the per-level parts."""

    __slots__ = ("classes", "classes_head", "namespace", "parts", "paths", "paths_head", "prefix")

    def __init__(self, stack: dict[str, Any]) -> None:
        self.paths: list[str] = []
        self.classes: list[str] = []
        segments: list[str] = []
        parent = ""
        for path, cls in stack.values():
            path = str(path)
            self.paths.append(path)
            self.classes.append(_qualified(cls))
            # "model.layers.0" under "model" reads "layers.0"; the root module has the empty path
            segment = path[len(parent) + 1 :] if parent and path.startswith(parent + ".") else path
            if segment:
                segments.append(segment)
            parent = path
        self.prefix = "".join("/" + s for s in segments)
        self.namespace = "".join(f"{p}: {c}/" for p, c in zip(self.paths, self.classes))
        # the lists' reprs without their closing bracket: a node appends its own last item
        self.classes_head = "[" + "".join(repr(c) + ", " for c in self.classes)
        self.paths_head = "[" + "".join(repr(p) + ", " for p in self.paths)
        self.parts = (self.namespace, self.classes_head, self.paths_head)


def _qualified(cls: Any) -> str:
    if isinstance(cls, str):
        return cls
    module = getattr(cls, "__module__", None)
    name = str(getattr(cls, "__qualname__", None) or getattr(cls, "__name__", cls))
    return name if module in (None, "builtins") else f"{module}.{name}"


class Scopes:
    """The builder scope of each FX node, made on the node's first conversion."""

    def __init__(self) -> None:
        self._levels: dict[tuple[str, ...], _ModuleLevels] = {}
        self._index: dict[torch.fx.Node, int] = {}
        # target -> (its str, that str's repr, how format_node prints it (None: it cannot be told))
        self._targets: dict[Any, tuple[str, str, str | None]] = {}
        self.current: torch.fx.Node | None = None

    def enter(self, g: GraphBuilder, node: torch.fx.Node) -> None:
        """Nodes ``g`` makes from now on come from ``node``."""
        index = self._index.get(node)
        if index is None:
            index = self._index[node] = self._add(g, node)
        g.set_scope(index)
        self.current = node

    def _add(self, g: GraphBuilder, node: torch.fx.Node) -> int:
        # the builder composes the values of a plain call itself (Python's formatting was most of
        # the cost); anything else is composed here, torch's printer giving the FX node's text.
        # Run once per FX node: kept to a few lookups and one call.
        if node.op == "call_function" and node.type is None:
            target = self._targets.get(node.target) or self._target_of(node)
            if target[2] is not None:
                meta = node.meta
                levels = self._levels.get(tuple(meta.get("nn_module_stack") or ())) or self._levels_of(node)
                index = g.add_fx_scope(
                    NODE_KEYS,
                    levels.prefix,
                    levels.parts,
                    node.name,
                    len(node.users),
                    target,  # type: ignore[arg-type]  # its third item was checked above
                    node.args,
                    node.kwargs,
                    meta.get("stack_trace") or "",
                )
                if index is not None:
                    return index
        return g.add_scope(*self.scope_of(node))

    def _levels_of(self, node: torch.fx.Node) -> _ModuleLevels:
        stack = node.meta.get("nn_module_stack") or {}
        key = tuple(stack)
        levels = self._levels.get(key)
        if levels is None:
            levels = self._levels[key] = _ModuleLevels(stack)
        return levels

    def _target_of(self, node: torch.fx.Node) -> tuple[str, str, str | None]:
        names = self._targets.get(node.target)
        if names is None:
            text = str(node.target)
            names = self._targets[node.target] = (text, repr(text), _printed_target(node))
        return names

    def scope_of(self, node: torch.fx.Node) -> tuple[str, list[tuple[str, str]]]:
        """(name prefix, metadata_props) of the nodes made from ``node``."""
        levels = self._levels_of(node)
        target, target_repr, printed = self._target_of(node)
        props = [
            (NAMESPACE, f"{levels.namespace}{node.name}: {target}"),
            (CLASS_HIERARCHY, f"{levels.classes_head}{target_repr}]"),
            (NAME_SCOPES, f"{levels.paths_head}{node.name!r}]"),
            (FX_NODE, node.format_node() or node.name),
            (STACK_TRACE, node.meta.get("stack_trace") or ""),
        ]
        return levels.prefix, props


def _printed_target(node: torch.fx.Node) -> str | None:
    """The target as ``node.format_node()`` prints it ("torch.ops.aten.linear.default"), read from the
    node's own text once per target (None when the text has another form)."""
    text = node.format_node() or ""
    _, sep, rest = text.partition(f"{node.op}[target=")
    target, sep2, _ = rest.partition("](args = ")
    return target if sep and sep2 else None


def graph_metadata(g: GraphBuilder, ep: torch.export.ExportedProgram) -> None:
    """The ExportedProgram's signature and range constraints on the graph, as the official exporter
    writes them (their ``str``)."""
    g.set_graph_metadata(GRAPH_SIGNATURE, str(ep.graph_signature))
    g.set_graph_metadata(RANGE_CONSTRAINTS, str(ep.range_constraints))


def input_metadata(g: GraphBuilder, onnx_name: str, node: torch.fx.Node, spec: Any) -> None:
    """Kind, persistence and FX name of a graph input or an initializer (a lifted weight)."""
    kind = spec.kind.name if spec is not None else InputKind.USER_INPUT.name
    g.add_value_metadata(onnx_name, INPUT_KIND, kind)
    g.add_value_metadata(onnx_name, INPUT_PERSISTENT, str(getattr(spec, "persistent", None)))
    g.add_value_metadata(onnx_name, ORIGINAL_NAME, node.name)


def output_metadata(g: GraphBuilder, onnx_name: str, node: torch.fx.Node, kind: str) -> None:
    """Kind and FX name of a graph output."""
    g.add_value_metadata(onnx_name, OUTPUT_KIND, kind)
    g.add_value_metadata(onnx_name, ORIGINAL_NAME, node.name)
