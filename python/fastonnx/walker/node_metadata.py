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

The walker marks where each FX node's ONNX nodes start in the top graph (a list append) and, once the
graph is walked, ``Scopes.assign`` gives the builder one bare scope per FX node and each node an index
into it (one call for the graph; FX nodes of If / Loop bodies enter their scope in their own builder).
``Scopes.compose`` then fills in each scope's name prefix and metadata: the parts that depend on the
module stack only, or on the target only, are computed here once; the builder's scope table composes
each FX node's values (``ScopeTable.compose_fx_scopes``), torch's printer gives the FX node's text
where arguments are not plain; the metadata of inputs, initializers and the graph is composed there
too (``Scopes.apply`` gives it to the builder). to_onnx composes on a second thread while its passes
run (``pipeline.stages.run_optimize``) and names the nodes from their scopes' prefixes once the passes are
done (``GraphBuilder.name_nodes_by_scope``): on two cores or more the metadata costs the walk a list
append per FX node, then the naming and the larger file (benches/metadata_cost.py).
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

    The walk only marks where each FX node's ONNX nodes start in the ``top`` builder's graph (a list
    append, no call into the builder) and ``assign`` gives those nodes their FX node's scope once the
    graph is walked; FX nodes of subgraphs (If / Loop bodies, made in other builders) enter a scope
    in their builder as they are converted (one call). ``compose`` gives the scopes their name prefix
    and metadata later, in bulk, and ``GraphBuilder.name_nodes_by_scope`` then names the nodes
    (composing during the walk costs far more than one call per FX node: docs/benchmarks.md,
    metadata cost). The metadata of inputs and initializers is
    gathered likewise (``value``), composed by ``compose`` and given to the builder in one call by
    ``apply``."""

    def __init__(self, top: GraphBuilder | None = None) -> None:
        self._top = top
        self._levels: dict[tuple[str, ...], _ModuleLevels] = {(): _ModuleLevels(None)}
        self._index: dict[torch.fx.Node, int] = {}
        # the scopes added, in three lists rather than a tuple each: no object per FX node for the
        # garbage collector to count (tuples made during the walk added collections, ~8 ms at 64x256)
        self._made_index: list[int] = []
        self._made_node: list[torch.fx.Node] = []
        # the top graph's marks: where the nodes of _marked[i] start (assign)
        self._marks: list[int] = []
        self._marked: list[torch.fx.Node] = []
        # (ONNX name, FX node, input spec) of the top graph's inputs and initializers (assign)
        self._values: list[tuple[str, torch.fx.Node, Any]] = []
        # id(target) -> (its str, that str's repr, how format_node prints it (None: it cannot be told));
        # by id, as an OpOverload's hash is a Python call. The targets are kept alive in _target_objs.
        self._targets: dict[int, tuple[str, str, str | None]] = {}
        self._target_objs: list[Any] = []
        # the same for the targets whose printed text is known: what the builder is handed
        self._printable: dict[int, tuple[str, str, str]] = {}
        self.current: torch.fx.Node | None = None
        self._by_name: dict[str, int] | None = None
        # the top graph's FX nodes with a scope, in order, and the first one's scope (assign)
        self._marked_first = 0
        self._marked_unique: list[torch.fx.Node] = []
        # what apply gives the builder: composed by compose
        self._program: torch.export.ExportedProgram | None = None
        self._value_rows: tuple[list[str], list[tuple[str, str, str]]] | None = None
        self._graph_props: list[tuple[str, str]] = []

    def enter(self, g: GraphBuilder, node: torch.fx.Node, start: int = 0) -> None:
        """Nodes ``g`` makes from now on come from ``node``; in the top builder, they start at node
        ``start`` of its graph (``g.num_nodes`` now)."""
        if g is self._top:
            # run once per FX node: two appends
            self._marks.append(start)
            self._marked.append(node)
        else:
            index = self._index.get(node)
            if index is None:
                index = self._index[node] = g.enter_new_scope()
                self._made_index.append(index)
                self._made_node.append(node)
            else:
                g.set_scope(index)
        self.current = node

    def value(self, onnx_name: str, node: torch.fx.Node, spec: Any) -> None:
        """``onnx_name`` (a top-graph input or initializer) is FX placeholder ``node`` of input spec
        ``spec`` (None: a user input): its kind, persistence and FX name, composed by ``compose`` and
        given to the builder by ``apply``."""
        self._values.append((onnx_name, node, spec))

    def program(self, ep: torch.export.ExportedProgram) -> None:
        """The graph's metadata is ``ep``'s signature and range constraints (``compose``, ``apply``)."""
        self._program = ep

    def assign(self) -> None:
        """Gives the top graph's nodes the scopes of the FX nodes they were marked with: once, when
        the top graph is walked (before the passes, which keep a replaced node's scope on what
        replaces it)."""
        top, marked = self._top, self._marked
        if top is None or not marked:
            return
        # the FX nodes in the order of their first mark; a node marked again reuses its scope
        unique = list(dict.fromkeys(marked))
        keys = None
        if len(unique) != len(marked):
            position = {node: k for k, node in enumerate(unique)}
            keys = [position[node] for node in marked]
        first = top.assign_scopes(self._marks, keys)
        self._made_index.extend(range(first, first + len(unique)))
        self._made_node.extend(unique)
        self._marked_first, self._marked_unique = first, unique
        self._marks, self._marked = [], []

    def index_of(self, fx_name: str) -> int | None:
        """The scope of the top-graph FX node named ``fx_name`` (None: it made no scope)."""
        if self._by_name is None:
            self._by_name = {node.name: index for node, index in self._index.items()}
            first = self._marked_first
            self._by_name.update((n.name, first + k) for k, n in enumerate(self._marked_unique))
        return self._by_name.get(fx_name)

    def compose(self, table: ScopeTable, used: set[int] | None = None) -> None:
        """Give the scopes made so far (those in ``used`` only, when given) their metadata, through the
        builder's scope ``table``. Run once, when no more nodes will be made from these FX nodes: to_onnx
        runs it alongside the passes (``stages.run_optimize``), before they decide which nodes survive."""
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
        self._compose_values()

    def _compose_values(self) -> None:
        """The metadata of inputs, initializers and the graph, for ``apply``."""
        if self._values:
            names, rows = [], []
            for onnx_name, node, spec in self._values:
                kind = spec.kind.name if spec is not None else InputKind.USER_INPUT.name
                names.append(onnx_name)
                rows.append((kind, str(getattr(spec, "persistent", None)), node.name))
            self._value_rows = (names, rows)
            self._values = []
        if self._program is not None:
            ep, self._program = self._program, None
            self._graph_props = [
                (GRAPH_SIGNATURE, str(ep.graph_signature)),
                (RANGE_CONSTRAINTS, str(ep.range_constraints)),
            ]

    def apply(self, g: GraphBuilder) -> None:
        """Gives ``g`` (the top builder) the metadata ``compose`` made of its inputs, initializers and
        graph: after the passes, which composing may overlap (a value the passes removed keeps an entry
        the writer never reads)."""
        if self._value_rows is not None:
            names, rows = self._value_rows
            g.add_values_metadata([INPUT_KIND, INPUT_PERSISTENT, ORIGINAL_NAME], names, rows)
            self._value_rows = None
        for key, value in self._graph_props:
            g.set_graph_metadata(key, value)
        self._graph_props = []

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


def output_metadata(g: GraphBuilder, onnx_name: str, node: torch.fx.Node, kind: str) -> None:
    """Kind and FX name of a graph output."""
    g.add_value_metadata(onnx_name, OUTPUT_KIND, kind)
    g.add_value_metadata(onnx_name, ORIGINAL_NAME, node.name)
