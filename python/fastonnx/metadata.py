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

The walker hands the builder one scope per FX node as it starts converting the node (one call: the
builder stores the scope once and each node an index into it). ``Scopes.compose`` then fills in each
scope's name prefix and metadata: the parts that depend on the module stack only, or on the target
only, are computed here once; the builder's scope table composes each FX node's values
(``ScopeTable.compose_fx_scopes``), torch's printer gives the FX node's text where arguments are not
plain. to_onnx composes while its passes run on another thread (``Interpreter.optimize``) and names
the nodes from their scopes' prefixes once the passes are done (``GraphBuilder.name_nodes_by_scope``):
on two cores or more the metadata costs the walk one call per FX node, the naming and the larger file
(benches/metadata_cost.py).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.export.graph_signature import InputKind

from fastonnx._core import GraphBuilder, ScopeTable

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
    """What a module stack gives every node under it: the name prefix and the per-level parts. Built from
    its parent stack's (the stack without its innermost level): one level's text per stack."""

    __slots__ = ("classes_head", "namespace", "parts", "path", "paths_head", "prefix")

    def __init__(self, parent: _ModuleLevels | None, path: str = "", cls: Any = None) -> None:
        if parent is None:  # the empty stack: a node of the top level
            self.path = self.prefix = self.namespace = ""
            self.classes_head = self.paths_head = "["
        else:
            self.path = path
            qualified = _qualified(cls)
            # "model.layers.0" under "model" reads "layers.0"; the root module has the empty path
            up = parent.path
            segment = path[len(up) + 1 :] if up and path.startswith(up + ".") else path
            self.prefix = f"{parent.prefix}/{segment}" if segment else parent.prefix
            self.namespace = f"{parent.namespace}{path}: {qualified}/"
            # the lists' reprs without their closing bracket: a node appends its own last item
            self.classes_head = f"{parent.classes_head}{qualified!r}, "
            self.paths_head = f"{parent.paths_head}{path!r}, "
        self.parts = (self.namespace, self.classes_head, self.paths_head)


def _qualified(cls: Any) -> str:
    if isinstance(cls, str):
        return cls
    module = getattr(cls, "__module__", None)
    name = str(getattr(cls, "__qualname__", None) or getattr(cls, "__name__", cls))
    return name if module in (None, "builtins") else f"{module}.{name}"


class Scopes:
    """The builder scope of each FX node, made on the node's first conversion.

    The walk only adds each scope and remembers its FX node (one call); ``compose`` gives the scopes
    their name prefix and metadata later, in bulk, and ``GraphBuilder.name_nodes_by_scope`` then names
    the nodes. Composing during the walk cost ~7 us per FX node, and even the prefix alone ~2 us
    (benches/metadata_cost.py, issue 13)."""

    def __init__(self) -> None:
        self._levels: dict[tuple[str, ...], _ModuleLevels] = {(): _ModuleLevels(None)}
        self._index: dict[torch.fx.Node, int] = {}
        # the scopes added, in three lists rather than a tuple each: no object per FX node for the
        # garbage collector to count (tuples made during the walk added collections, ~8 ms at 64x256)
        self._made_index: list[int] = []
        self._made_node: list[torch.fx.Node] = []
        # id(target) -> (its str, that str's repr, how format_node prints it (None: it cannot be told));
        # by id, as an OpOverload's hash is a Python call. The targets are kept alive in _target_objs.
        self._targets: dict[int, tuple[str, str, str | None]] = {}
        self._target_objs: list[Any] = []
        # the same for the targets whose printed text is known: what the builder is handed
        self._printable: dict[int, tuple[str, str, str]] = {}
        self.current: torch.fx.Node | None = None
        self._by_name: dict[str, int] | None = None

    def enter(self, g: GraphBuilder, node: torch.fx.Node) -> None:
        """Nodes ``g`` makes from now on come from ``node``."""
        index = self._index.get(node)
        if index is None:
            # run once per FX node: one lookup and one call. Reading the node's module stack here cost
            # more than the rest of the metadata together (its dicts and strings are cold by then):
            # compose reads it, off the walk
            index = self._index[node] = g.enter_new_scope()
            self._made_index.append(index)
            self._made_node.append(node)
        else:
            g.set_scope(index)
        self.current = node

    def index_of(self, fx_name: str) -> int | None:
        """The scope of the top-graph FX node named ``fx_name`` (None: it made no scope)."""
        if self._by_name is None:
            self._by_name = {node.name: index for node, index in self._index.items()}
        return self._by_name.get(fx_name)

    def compose(self, table: ScopeTable, used: set[int] | None = None) -> None:
        """Give the scopes made so far (those in ``used`` only, when given) their metadata, through the
        builder's scope ``table``. Run once, when no more nodes will be made from these FX nodes: to_onnx
        runs it alongside the passes (``Interpreter.optimize``), before they decide which nodes survive."""
        # the builder composes the values of plain calls (parallel lists, as above); torch's printer
        # gives the others
        indices: list[int] = []
        parts: list[tuple[str, str, str]] = []
        nodes: list[torch.fx.Node] = []
        targets: list[tuple[str, str, str]] = []
        other: list[tuple[int, torch.fx.Node]] = []
        # run once per FX node: bound methods and plain lookups only
        add_index, add_parts, add_node, add_target = (
            indices.append,
            parts.append,
            nodes.append,
            targets.append,
        )
        printable = self._printable
        # the name prefix of every scope (GraphBuilder.name_nodes_by_scope names the nodes from it)
        named: list[int] = []
        prefixes: list[str] = []
        add_named, add_prefix = named.append, prefixes.append
        known = self._levels
        for index, node in zip(self._made_index, self._made_node):
            if used is not None and index not in used:
                continue
            stack = node.meta.get("nn_module_stack")
            levels = known.get(tuple(stack) if stack else ()) or self._levels_of(node)
            add_named(index)
            add_prefix(levels.prefix)
            if node.op == "call_function" and node.type is None:
                target = printable.get(id(node.target)) or self._printable_target(node)
                if target is not None:
                    add_index(index)
                    add_parts(levels.parts)
                    add_node(node)
                    add_target(target)
                    continue
            other.append((index, node))
        self._made_index, self._made_node = [], []
        table.set_prefixes(named, prefixes)
        for position in table.compose_fx_scopes(NODE_KEYS, indices, parts, nodes, targets):
            other.append((indices[position], nodes[position]))
        for index, node in other:
            table.set_scope_props(index, self.scope_of(node)[1])

    def _levels_of(self, node: torch.fx.Node) -> _ModuleLevels:
        stack = node.meta.get("nn_module_stack") or {}
        key = tuple(stack)
        levels = self._levels.get(key)
        if levels is None:
            # the innermost level on top of the levels of the stack without it
            items = list(stack.values())
            for depth in range(len(key)):
                sub = key[: depth + 1]
                if sub not in self._levels:
                    path, cls = items[depth]
                    self._levels[sub] = _ModuleLevels(self._levels[key[:depth]], str(path), cls)
            levels = self._levels[key]
        return levels

    def _target_of(self, node: torch.fx.Node) -> tuple[str, str, str | None]:
        names = self._targets.get(id(node.target))
        if names is None:
            text = str(node.target)
            names = self._targets[id(node.target)] = (text, repr(text), _printed_target(node))
            self._target_objs.append(node.target)
        return names

    def _printable_target(self, node: torch.fx.Node) -> tuple[str, str, str] | None:
        text, text_repr, printed = self._target_of(node)
        if printed is None:
            return None
        names = self._printable[id(node.target)] = (text, text_repr, printed)
        return names

    def scope_of(self, node: torch.fx.Node) -> tuple[str, list[tuple[str, str]]]:
        """(name prefix, metadata_props) of the nodes made from ``node``, composed in Python."""
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
