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

The walker hands the builder one scope per FX node (``GraphBuilder.add_scope``) and switches to it
before converting the node; the builder stores the scope once and each node an index into it. The
parts that depend on the module stack only are computed once per stack.
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

    __slots__ = ("classes", "namespace", "paths", "prefix")

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
        self.current: torch.fx.Node | None = None

    def enter(self, g: GraphBuilder, node: torch.fx.Node) -> None:
        """Nodes ``g`` makes from now on come from ``node``."""
        index = self._index.get(node)
        if index is None:
            index = self._index[node] = g.add_scope(*self.scope_of(node))
        g.set_scope(index)
        self.current = node

    def scope_of(self, node: torch.fx.Node) -> tuple[str, list[tuple[str, str]]]:
        """(name prefix, metadata_props) of the nodes made from ``node``."""
        stack = node.meta.get("nn_module_stack") or {}
        key = tuple(stack)
        levels = self._levels.get(key)
        if levels is None:
            levels = self._levels[key] = _ModuleLevels(stack)
        target = str(node.target)
        props = [
            (NAMESPACE, f"{levels.namespace}{node.name}: {target}"),
            (CLASS_HIERARCHY, repr([*levels.classes, target])),
            (NAME_SCOPES, repr([*levels.paths, node.name])),
            (FX_NODE, node.format_node() or node.name),
            (STACK_TRACE, node.meta.get("stack_trace") or ""),
        ]
        return levels.prefix, props


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
