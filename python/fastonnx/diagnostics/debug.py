"""The builder-state dump attached to conversion errors as ``.debug``, and the trace of which FX node
made which ONNX values and nodes (read by the report and by intermediate verification).

``.debug`` is always attached (it costs nothing until an error happens); the message shows it only when
``FASTONNX_DEBUG=1`` is set or ``to_onnx(verbose=True)`` was passed, so a plain error stays short.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch

from fastonnx import dtypes
from fastonnx._core import GraphBuilder
from fastonnx.context import Value

LAST_NODES = 10  # ONNX nodes shown in the dump: enough to see the converter's last pattern
LAST_VALUES = 20  # values (with dtype and shape) shown in the report's builder state


@dataclass
class Trace:
    """What each top-level FX node converted to, recorded as one ``(FX node name, number of ONNX nodes
    before it, its converted value)`` step per node (the cheapest record: one append), read lazily.

    The value is the one bound when the node was converted (a view recomputed later gets a new name;
    the first is the one matching eager's value at that point). A node's ONNX nodes run from its start
    to the next step's start, the last one's to the end of the graph before optimization."""

    steps: list[tuple[str, int, Any]] = field(default_factory=list)
    # the top graph's node names before optimization (the steps' starts index them); set after
    # conversion without metadata
    node_names: list[str] = field(default_factory=list)
    # with metadata: the FX nodes' scopes, and the builder whose final nodes carry them (nodes are
    # named after the passes, so names before them mean nothing)
    scopes: Any = None
    builder: Any = None
    _by_scope: dict[int, list[str]] | None = None
    # value -> the graph output name the builder renamed it to (the interpreter's dict, shared)
    renamed: dict[str, str] = field(default_factory=dict)
    _by_name: dict[str, tuple[int, int, Any]] | None = None

    def _index(self) -> dict[str, tuple[int, int, Any]]:
        if self._by_name is None:
            stops = [start for _, start, _ in self.steps[1:]] + [len(self.node_names)]
            self._by_name = {
                name: (start, stop, value) for (name, start, value), stop in zip(self.steps, stops)
            }
        return self._by_name

    def values_of(self, fx_name: str) -> list[str | None] | None:
        """The ONNX value names (as finally named) of an FX node's outputs, None where an output is not
        a tensor; None when the node was not converted on the top graph."""
        step = self._index().get(fx_name)
        if step is None:
            return None
        value = step[2]
        names: list[str | None]
        if isinstance(value, Value):
            names = [value.name]
        elif isinstance(value, (list, tuple)):
            names = [v.name if isinstance(v, Value) else None for v in value]
        else:
            names = [None]
        return [self.renamed.get(n, n) if n is not None else None for n in names]

    def onnx_nodes_of(self, fx_name: str) -> list[str]:
        """The ONNX nodes made from an FX node: with metadata, those of the final graph carrying its
        scope (fusions included); without, the names before optimization its converter emitted."""
        if self.scopes is not None and self.builder is not None:
            if self._by_scope is None:
                self._by_scope = {}
                for name, scope in zip(self.builder.node_names(), self.builder.node_scopes(), strict=True):
                    if scope is not None:
                        self._by_scope.setdefault(scope, []).append(name)
            index = self.scopes.index_of(fx_name)
            return list(self._by_scope.get(index, [])) if index is not None else []
        start, stop, _ = self._index().get(fx_name, (0, 0, None))
        return self.node_names[start:stop]


def env_enabled() -> bool:
    """FASTONNX_DEBUG=1 (or any value but 0/empty) asks for the dump in every error message."""
    return os.environ.get("FASTONNX_DEBUG", "") not in ("", "0")


def describe_val(val: Any) -> str:
    """``f32[2, s0]`` for a tensor (FX meta or real), the value for a number, a list for several."""
    if isinstance(val, torch.Tensor):
        dims = ", ".join(str(d) for d in val.shape)
        return f"{_short_dtype(val.dtype)}[{dims}]"
    if isinstance(val, (list, tuple)):
        return "(" + ", ".join(describe_val(v) for v in val) + ")"
    if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return f"{type(val).__name__}({val})"
    return repr(val)


def describe_arg(a: Any) -> str:
    """An FX argument as ``name: f32[2, 3]`` (its recorded value), constants as they are."""
    if isinstance(a, torch.fx.Node):
        return f"{a.name}: {describe_val(a.meta.get('val'))}"
    if isinstance(a, (list, tuple)):
        return "[" + ", ".join(describe_arg(x) for x in a) + "]"
    return repr(a)


def _short_dtype(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def describe_value_type(g: GraphBuilder, name: str) -> str:
    """What the builder knows of a value: ``float32[2, batch]``, ``?`` for what it does not."""
    elem = g.dtype(name)
    shape = g.shape(name)
    try:
        dt = _short_dtype(dtypes.to_torch_dtype(elem)) if elem is not None else "?"
    except Exception:  # an ONNX type torch has no dtype for
        dt = f"onnx#{elem}"
    dims = (
        " (no shape)" if shape is None else "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"
    )
    return f"{dt}{dims}"


def last_nodes(g: GraphBuilder, count: int = LAST_NODES) -> list[str]:
    """The last ``count`` nodes added, one line each: ``name: Op(inputs) -> outputs (types)``."""
    n = g.num_nodes
    lines = []
    for index, (name, op_type, inputs, outputs) in enumerate(
        g.nodes(max(0, n - count)), start=max(0, n - count)
    ):
        outs = ", ".join(f"{o}: {describe_value_type(g, o)}" for o in outputs if o)
        lines.append(f"  #{index} {name}: {op_type}({', '.join(inputs)}) -> {outs}")
    return lines


def last_values(g: GraphBuilder, count: int = LAST_VALUES) -> list[tuple[str, str, str]]:
    """The last ``count`` values the nodes produced, newest last: (value, type, producing op)."""
    out: list[tuple[str, str, str]] = []
    start = g.num_nodes
    while start > 0 and len(out) < count:
        start = max(0, start - count)
        out = [
            (o, describe_value_type(g, o), op_type)
            for _, op_type, _, outputs in g.nodes(start)
            for o in outputs
            if o
        ]
    return out[-count:]


def node_dump(
    g: GraphBuilder, node: torch.fx.Node, index: int, total: int, opset: int, where: str = ""
) -> str:
    """The ``.debug`` text of an error raised while converting ``node`` (index ``index`` of ``total``)."""
    lines = [
        f"fastonnx debug: opset {opset}, FX node {index + 1} of {total}{where}",
        f"FX node: {node.format_node()}",
        f"target: {node.target}",
        "arguments (as torch recorded them):",
    ]
    for i, a in enumerate(node.args):
        lines.append(f"  arg {i}: {describe_arg(a)}")
    for k, a in node.kwargs.items():
        lines.append(f"  {k}: {describe_arg(a)}")
    lines.append(f"expected result: {describe_val(node.meta.get('val'))}")
    lines.append(f"ONNX nodes so far: {g.num_nodes}; the last {min(LAST_NODES, g.num_nodes)}:")
    lines.extend(last_nodes(g) or ["  (none)"])
    return "\n".join(lines)


def stage_dump(g: GraphBuilder | None, stage: str, opset: int | None) -> str:
    """The ``.debug`` text of an error raised outside any node (optimizing, writing, the outputs)."""
    lines = [f"fastonnx debug: opset {opset}, stage {stage}"]
    if g is not None:
        lines.append(f"ONNX nodes: {g.num_nodes}; the last {min(LAST_NODES, g.num_nodes)}:")
        lines.extend(last_nodes(g) or ["  (none)"])
    return "\n".join(lines)


def add_dump(exc: BaseException, text: str, node: torch.fx.Node | None = None) -> None:
    """Give ``exc`` its ``.debug`` text (and ``.fx_node``, the node being converted); the innermost
    (first attached) dump wins, it is the most precise."""
    if getattr(exc, "debug", None) is None:
        try:
            exc.debug = text  # type: ignore[attr-defined]
            exc.fx_node = node  # type: ignore[attr-defined]
        except AttributeError:  # an exception type with __slots__: keep going without
            pass


def show_in_message(exc: BaseException) -> None:
    """Append ``exc.debug`` to the exception's message (once)."""
    text = getattr(exc, "debug", None)
    if not text or getattr(exc, "_debug_shown", False):
        return
    if exc.args and isinstance(exc.args[0], str):
        exc.args = (f"{exc.args[0]}\n\n{text}", *exc.args[1:])
    else:
        exc.args = (*exc.args, text)
    exc._debug_shown = True  # type: ignore[attr-defined]
