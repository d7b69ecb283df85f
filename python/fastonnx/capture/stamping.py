"""Dynamic-shape capture of a deep model: torch.export of its first layers, the others stamped.

torch.export with dynamic shapes costs about 0.45 s per decoder layer of an 8B-shaped model (symbolic
reasoning over fake tensors for every op), and every layer of a transformer stack is the same code on
weights of the same shapes. Here torch.export captures the model with its layer stack cut to a prefix
(every layer up to the first of each kind), and each later layer is a copy of the captured span of its
representative (the first layer of its kind) with its own weights, its own entries of the inputs that
are indexed by layer (a KV cache) and the previous layer's output as its input.

Stamping is done only on proof of sameness; anything else is a refusal with a reason, and the caller
captures the whole model with torch.export instead:

- the stack is an ``nn.ModuleList`` of one class whose layers hold parameters of the same names,
  shapes and dtypes;
- layers are of one kind when every attribute of theirs and of their submodules (recursively, other
  than parameters and buffers) is equal, other than attributes holding the layer's own index
  (``layer_idx``: an int equal to the layer's position in every layer), and their non-meta buffers
  hold equal values: SmolLM3's ``use_rope``, Gemma3's ``attention_type`` and GPT-OSS's
  ``sliding_window`` make layers of different kinds;
- the prefix is captured with its layers at their own indices, so a loop that picks a layer's mask by
  its position sees the same positions as in the whole model;
- a static trace of the whole model on the example inputs (capture/trace.py: about one eager forward on
  meta tensors) must show every stamped layer running the same ops as its representative, on the same
  values from outside the layer (which mask, which rotary cos / sin), on its own weights and its own
  cache entries (the layer's index in an input's name), the previous layer's output as its input: what
  an index read in Python (``config.layer_types[self.layer_idx]``, a cache layer of another class) would
  change shows up there;
- in torch.export's capture of the prefix, each representative's span must take values from outside
  only from its own weights and cache entries, the previous layer's output, values computed before the
  stack, and symbolic sizes; its output be used only by the next layer (or what follows the stack) and
  by the program's outputs; and each stamped layer's cache entries be passed through to the outputs
  untouched by the prefix program.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import operator
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch.export.graph_signature import (
    ExportGraphSignature,
    InputKind,
    InputSpec,
    OutputSpec,
    TensorArgument,
)

from fastonnx.capture.refusal import TraceRefused
from fastonnx.capture.trace import LazyProgram, trace_model
from fastonnx.torch_internals import graph_used_names, rename_node, swap_child_modules, symint_expr

log = logging.getLogger("fastonnx")

MIN_LAYERS = 3
"""Stacks shorter than this are captured whole: stamping one layer saves less than the proof costs."""


class StampRefused(Exception):
    """Why a model's layers cannot be stamped (the caller captures it whole with torch.export)."""


@dataclasses.dataclass
class LayerPlan:
    """What to capture and what to stamp: ``reps[k]`` is the first layer of layer ``k``'s kind (what
    the static trace compares it with), ``templates[k]`` the captured layer a stamped layer ``k``
    (``k >= prefix``) is copied from."""

    path: str  # the stack's module path in the model ("model.layers")
    stack: torch.nn.ModuleList
    reps: list[int]
    prefix: int
    templates: dict[int, int] = dataclasses.field(default_factory=dict)  # stamped layer: captured one

    @property
    def layers(self) -> int:
        return len(self.reps)


# ---------------------------------------------------------------------------------------------
# the stack and its kinds of layers


def find_stack(model: torch.nn.Module) -> tuple[str, torch.nn.ModuleList]:
    """The model's largest ModuleList of at least MIN_LAYERS layers of one class with parameters of
    the same names, shapes and dtypes."""
    best: tuple[int, str, torch.nn.ModuleList] | None = None
    for path, module in model.named_modules():
        if not isinstance(module, torch.nn.ModuleList) or len(module) < MIN_LAYERS:
            continue
        layers = list(module)
        if len({type(m) for m in layers}) != 1:
            continue
        shapes = [_weight_shapes(m) for m in layers]
        if any(s != shapes[0] for s in shapes) or not shapes[0]:
            continue
        size = sum(p.numel() for p in module.parameters())
        if best is None or size > best[0]:
            best = (size, path, module)
    if best is None:
        raise StampRefused(f"no stack of {MIN_LAYERS} or more layers of one class and the same weights")
    return best[1], best[2]


def _weight_shapes(m: torch.nn.Module) -> list[tuple[str, tuple[int, ...], torch.dtype, str]]:
    return [
        (n, tuple(t.shape), t.dtype, t.device.type)
        for n, t in [*m.named_parameters(remove_duplicate=False), *m.named_buffers(remove_duplicate=False)]
    ]


_SKIPPED = frozenset(
    {
        "_parameters",
        "_buffers",
        "_modules",
        "_non_persistent_buffers_set",
        "_state_dict_hooks",
        "_state_dict_pre_hooks",
        "_load_state_dict_pre_hooks",
        "_load_state_dict_post_hooks",
    }
)
_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


def _attributes(layer: torch.nn.Module) -> dict[str, Any]:
    """Every attribute of the layer and its submodules other than weights and submodules, by
    ``path:name``; hooks as the tuple of their functions."""
    found: dict[str, Any] = {}
    for sub_path, sub in layer.named_modules(remove_duplicate=False):
        for name, value in vars(sub).items():
            if name in _SKIPPED:
                continue
            if name in _HOOKS or name.endswith("_hooks") or name.endswith("_hooks_with_kwargs"):
                value = tuple(value.values()) if isinstance(value, dict) else value
            found[f"{sub_path}:{name}"] = value
    return found


def _same(a: Any, b: Any, depth: int = 0) -> bool:
    """Whether two attribute values are equal as far as the layers' code can tell them apart."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
            return False
        return a.device.type == "meta" or bool(torch.equal(a, b))
    if isinstance(a, (int, float, str, bytes, bool, type(None), torch.dtype, torch.device)):
        return bool(a == b) or (isinstance(a, float) and a != a and b != b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y, depth + 1) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k], depth + 1) for k in a)
    if isinstance(a, (set, frozenset)):
        return bool(a == b)
    if isinstance(a, functools.partial):  # an activation with its arguments bound (Gemma's gelu)
        return (
            a.func is b.func and _same(a.args, b.args, depth + 1) and _same(a.keywords, b.keywords, depth + 1)
        )
    if callable(a) or depth > 4:
        return False  # different functions or objects too deep to compare: not proven the same
    if hasattr(a, "__dict__"):
        return _same(vars(a), vars(b), depth + 1)
    return False


def kinds(stack: torch.nn.ModuleList) -> list[int]:
    """reps[k]: the first layer of layer k's kind (see the module's docstring)."""
    attrs = [_attributes(m) for m in stack]
    keys = set(attrs[0])
    if any(set(a) != keys for a in attrs):
        return list(range(len(stack)))  # layers with other attributes: each its own kind
    # an int equal to the layer's position in every layer is its index (layer_idx)
    index_keys = {
        key for key in keys if all(type(a[key]) is int and a[key] == k for k, a in enumerate(attrs))
    }
    buffers = [dict(m.named_buffers(remove_duplicate=False)) for m in stack]
    reps: list[int] = []
    for k in range(len(stack)):
        rep = next(
            (
                r
                for r in sorted(set(reps))
                if all(_same(attrs[k][key], attrs[r][key]) for key in keys - index_keys)
                and all(_same(buffers[k][n], buffers[r][n]) for n in buffers[k])
            ),
            k,
        )
        reps.append(rep)
    return reps


def plan_layers(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> LayerPlan:
    """What to capture and what to stamp, proven by attributes and by a static trace of the whole
    model on the example inputs (raises StampRefused)."""
    path, stack = find_stack(model)
    reps = kinds(stack)
    # each stamped layer is copied from the second layer of its kind, not the first: torch.export binds
    # a symbolic size to the first node computing it, so the first layer reading a size computed before
    # the stack (past + sequence from the mask) reads that node where later layers compute their own
    seen: dict[int, list[int]] = {}
    for k, r in enumerate(reps):
        seen.setdefault(r, []).append(k)
    prefix = max(ks[1] if len(ks) > 1 else ks[0] for ks in seen.values()) + 1
    if prefix >= len(stack):
        raise StampRefused(f"no layer of {path} is a third of its kind: nothing to stamp")
    templates = {k: seen[reps[k]][1] for k in range(prefix, len(stack))}
    found = LayerPlan(path, stack, reps, prefix, templates)
    _check_trace(model, args, kwargs, found)
    return found


# ---------------------------------------------------------------------------------------------
# spans of layers in an FX graph


def _layer_of(node: torch.fx.Node, path: str, layers: int) -> int | None:
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return None
    head = path + "."
    for entry in stack.values():
        where = entry[0]
        if where.startswith(head):
            index = where[len(head) :].split(".", 1)[0]
            if index.isdigit() and int(index) < layers:
                return int(index)
    return None


@dataclasses.dataclass
class _Spans:
    nodes: dict[int, list[torch.fx.Node]]
    where: dict[torch.fx.Node, int]
    carry_in: dict[int, torch.fx.Node]
    carry_out: dict[int, torch.fx.Node]


def _spans(graph: torch.fx.Graph, path: str, layers: Iterable[int], count: int) -> _Spans:
    nodes: dict[int, list[torch.fx.Node]] = {k: [] for k in layers}
    where: dict[torch.fx.Node, int] = {}
    for node in graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue
        k = _layer_of(node, path, count)
        if k is not None and k in nodes:
            nodes[k].append(node)
            where[node] = k
    for k, span in nodes.items():
        if not span:
            raise StampRefused(f"layer {path}.{k} runs no op in the captured program")
    carry_out: dict[int, torch.fx.Node] = {}
    carry_in: dict[int, torch.fx.Node] = {}
    first = min(nodes)
    for k, span in nodes.items():
        carry_out[k] = _carry_out(span, where, k, carry_in.get(k), f"{path}.{k}")
        if k + 1 in nodes:
            carry_in[k + 1] = carry_out[k]
    carry_in[first] = _first_carry(nodes[first], where, carry_out[first], f"{path}.{first}")
    return _Spans(nodes, where, carry_in, carry_out)


def _carry_out(
    span: list[torch.fx.Node],
    where: dict[torch.fx.Node, int],
    k: int,
    carry_in: torch.fx.Node | None,
    name: str,
) -> torch.fx.Node:
    """The one tensor a layer hands to what follows it (the next layer, or what follows the stack);
    the last layer of a model may hand it to the outputs only, beside its cache entries."""
    outside = [
        n for n in span if not _symbolic(n) and any(u.op != "output" and where.get(u) != k for u in n.users)
    ]
    if not outside:
        outside = [n for n in span if any(u.op == "output" for u in n.users)]
        if len(outside) > 1 and carry_in is not None:
            outside = [n for n in outside if _signature(n) == _signature(carry_in)]
    if len(outside) != 1:
        raise StampRefused(f"layer {name} hands {len(outside)} tensors to what follows it, not one")
    return outside[0]


def _first_carry(
    span: list[torch.fx.Node], where: dict[torch.fx.Node, int], out: torch.fx.Node, name: str
) -> torch.fx.Node:
    """The first layer's input: the one tensor it reads from outside the stack with the metadata of
    its output (the hidden states)."""
    want = _signature(out)
    candidates = {
        a
        for n in span
        for a in n.all_input_nodes
        if a not in where and not _symbolic(a) and _signature(a) == want
    }
    if len(candidates) != 1:
        raise StampRefused(f"cannot tell which input of {name} is the previous layer's output")
    return next(iter(candidates))


def _value(t: Any) -> Any:
    if not isinstance(t, torch.Tensor):
        return repr(t)
    if t.device.type == "meta" or t.numel() > 4096:
        return (str(t.dtype), tuple(t.shape), t.device.type, "meta" if t.device.type == "meta" else id(t))
    return (str(t.dtype), tuple(t.shape), t.detach().cpu().flatten().tolist())


def _signature(node: torch.fx.Node) -> tuple[str, str] | None:
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return None
    return str(tuple(val.shape)), str(val.dtype)


def _symbolic(node: torch.fx.Node) -> bool:
    val = node.meta.get("val")
    return isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool))


def _unindexed(name: str, k: int) -> str:
    """An input's name with the layer's index as a token (``past_3_key``) written ``#``."""
    return re.sub(rf"(?<![0-9a-zA-Z]){k}(?![0-9a-zA-Z])", "#", name.replace("_", " ")).replace(" ", "_")


def _describe(
    graph_targets: dict[str, str], spans: _Spans, k: int, path: str, constants: dict[str, Any] | None = None
) -> list[tuple[Any, ...]]:
    """Layer k's span as a comparable list: each node's op and arguments, a node argument written as
    its role (own node by position, the previous layer's output, its weight by name within the layer,
    an input with the layer's index written ``#``, or a node from outside the stack as itself)."""
    own = {n: i for i, n in enumerate(spans.nodes[k])}
    layer_prefix = f"{path}.{k}."

    def role(a: torch.fx.Node) -> Any:
        if a in own:
            return ("own", own[a])
        if a is spans.carry_in[k]:
            return ("carry",)
        if a.op == "placeholder":
            target = graph_targets.get(a.name)
            if target is not None and target.startswith(layer_prefix):
                return ("weight", target[len(layer_prefix) :])
            if target is not None and constants is not None and target in constants:
                # a tensor the forward creates (torch.tensor(...)), lifted once per call: by value
                return ("constant", _value(constants[target]))
            if target is not None:
                return ("outer weight", target)
            return ("input", _unindexed(a.name, k))
        if a in spans.where and not _symbolic(a):
            raise StampRefused(f"layer {path}.{k} reads a tensor of layer {path}.{spans.where[a]}")
        return ("outer", a)

    out: list[tuple[Any, ...]] = []
    for node in spans.nodes[k]:
        args = torch.fx.node.map_arg((node.args, node.kwargs), role)
        out.append((node.op, node.target, repr(args), node in spans.carry_out.values()))
    return out


def _targets(ep: torch.export.ExportedProgram) -> dict[str, str]:
    return {
        s.arg.name: s.target
        for s in ep.graph_signature.input_specs
        if s.target is not None and isinstance(s.arg, TensorArgument)
    }


def _check_trace(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], p: LayerPlan) -> None:
    """Every stamped layer does in the static trace what its representative does (see the
    module's docstring)."""
    try:
        traced = trace_model(model, args, kwargs)
    except TraceRefused as e:
        raise StampRefused(f"the static trace that proves the layers the same refused: {e}") from None
    spans = _spans(traced.graph, p.path, range(p.layers), p.layers)
    targets = _targets(traced)
    described: dict[int, list[tuple[Any, ...]]] = {}
    for k in range(p.prefix, p.layers):
        r = p.reps[k]
        if r not in described:
            described[r] = _describe(targets, spans, r, p.path, traced.constants)
        mine = _describe(targets, spans, k, p.path, traced.constants)
        if mine != described[r]:
            at = next(
                (i for i, (a, b) in enumerate(zip(mine, described[r])) if a != b),
                min(len(mine), len(described[r])),
            )
            op = mine[at][1] if at < len(mine) else "(none)"
            raise StampRefused(
                f"layer {p.path}.{k} does not run what layer {p.path}.{r} runs: in the static trace its op "
                f"{at} of {len(mine)}, {op}, differs in what it runs or reads"
            )
        outputs = _output_uses(traced.graph, spans, k)
        if len(outputs) != len(_output_uses(traced.graph, spans, r)):
            raise StampRefused(f"layer {p.path}.{k} gives the program other outputs than layer {p.path}.{r}")
    # what the model does outside the stack must not depend on its depth (a cache the forward
    # creates for every layer, a mask per layer kind...): the prefix's trace has the same outer ops
    with _cut(p):
        try:
            short = trace_model(model, args, kwargs)
        except TraceRefused as e:
            raise StampRefused(f"the static trace of the first {p.prefix} layers refused: {e}") from None
    whole = _outer(traced.graph, spans.where)
    cut = _outer(short.graph, _spans(short.graph, p.path, range(p.prefix), p.layers).where)
    if whole != cut:
        at = next((i for i, (a, b) in enumerate(zip(whole, cut)) if a != b), min(len(whole), len(cut)))
        shown = whole[at][0] if at < len(whole) else cut[at][0]
        raise StampRefused(
            f"what the model runs outside {p.path} depends on its number of layers ({len(whole)} ops with "
            f"all {p.layers}, {len(cut)} with the first {p.prefix}; op {at}, {shown}, differs)"
        )


def _outer(graph: torch.fx.Graph, where: dict[torch.fx.Node, int]) -> list[tuple[str, str]]:
    """The ops outside the stack, each with its arguments (a layer's value written ``layer``)."""
    order: dict[torch.fx.Node, int] = {}
    found = []
    for node in graph.nodes:
        if node.op != "call_function" or node in where:
            continue

        def role(a: torch.fx.Node) -> Any:
            if a in where:
                return "layer"
            return ("op", order[a]) if a in order else a.name

        order[node] = len(order)
        found.append((str(node.target), repr(torch.fx.node.map_arg((node.args, node.kwargs), role))))
    return found


def _output_uses(graph: torch.fx.Graph, spans: _Spans, k: int) -> list[int]:
    """Positions of the program's outputs that layer k's span makes, other than its output to the
    next layer (the last layer's may be the program's output)."""
    out: Any = graph.output_node().args[0]
    return [
        i
        for i, o in enumerate(out)
        if isinstance(o, torch.fx.Node) and spans.where.get(o) == k and o is not spans.carry_out[k]
    ]


# ---------------------------------------------------------------------------------------------
# capture of the prefix and stamping


@contextlib.contextmanager
def _cut(p: LayerPlan) -> Iterator[None]:
    """The stack holding its prefix only, for the capture of the prefix."""
    kept = _swap_layers(p.stack, {str(k): p.stack[k] for k in range(p.prefix)})
    try:
        yield
    finally:
        _swap_layers(p.stack, kept)


def _swap_layers(
    stack: torch.nn.ModuleList, layers: dict[str, torch.nn.Module]
) -> dict[str, torch.nn.Module]:
    """``stack`` made to hold ``layers`` (keyed by index); returns the layers it held."""
    return swap_child_modules(stack, layers)


def export_stamped(
    model: torch.nn.Module, p: LayerPlan, capture: Callable[[], torch.export.ExportedProgram]
) -> torch.export.ExportedProgram:
    """``capture()`` (torch.export of ``model``) run with the stack cut to the prefix, then the other
    layers stamped into its program."""
    with _cut(p):
        ep = capture()
    try:
        return _stamp(model, ep, p)
    except StampRefused:
        raise
    except Exception as e:  # a program this module does not understand: torch.export captures it whole
        log.warning("stamping the layers of %s failed, capturing them all: %r", p.path, e)
        raise StampRefused(f"stamping failed: {type(e).__name__}: {e}") from e


def _stamp(
    model: torch.nn.Module, ep: torch.export.ExportedProgram, p: LayerPlan
) -> torch.export.ExportedProgram:
    """The prefix's program with every later layer copied in from its template (see the module's
    docstring); raises StampRefused where the program is not one the copies would be right for."""
    stamper = _Stamper(model, ep, p)
    stamper.refuse_unprovable()
    stamper.add_weights()
    stamper.stamp_layers()
    return stamper.program()


class _Stamper:
    """The state the steps of one ``_stamp`` share: the prefix's program, edited in place, and the
    signature, weights and outputs that grow with each stamped layer."""

    def __init__(self, model: torch.nn.Module, ep: torch.export.ExportedProgram, p: LayerPlan) -> None:
        self.model, self.ep, self.p = model, ep, p
        self.graph: torch.fx.Graph = ep.graph
        self.spans = _spans(self.graph, p.path, range(p.prefix), p.layers)
        self.targets = _targets(ep)
        self.by_name: dict[str, torch.fx.Node] = {
            n.name: n for n in self.graph.nodes if n.op == "placeholder"
        }
        self.specs = list(ep.graph_signature.input_specs)
        self.output = self.graph.output_node()
        self.outputs: list[Any] = list(self.output.args[0])
        self.user_inputs = [
            s.arg.name
            for s in self.specs
            if s.kind == InputKind.USER_INPUT and isinstance(s.arg, TensorArgument)
        ]
        self.state_dict = dict(ep.state_dict)
        self.constants = dict(ep.constants)
        # (stamped layer, weight's name within the layer) -> its placeholder
        self.weight_nodes: dict[tuple[int, str], torch.fx.Node] = {}
        # the last spec of the stack's parameters / buffers: the new ones go after it
        self.anchors: dict[InputKind, int | None] = {}
        self.added: dict[InputKind, list[InputSpec]] = {InputKind.PARAMETER: [], InputKind.BUFFER: []}
        self.copies: dict[torch.fx.Node, tuple[int, torch.fx.Node]] = {}  # stamped node: (layer, original)
        # hoisted sizes of the inputs, by (input, dim), and where new ones go (_size_of)
        self.sizes: dict[tuple[Any, Any], torch.fx.Node] = {}
        self.order: dict[torch.fx.Node, int] = {}
        self.first_op: torch.fx.Node | None = None

    def refuse_unprovable(self) -> None:
        """Raises StampRefused for what the copies would get wrong: tensors the forward creates
        outside the stack, and a template reading another layer's tensors."""
        graph, p = self.graph, self.p
        # tensors the forward creates outside the stack and lifts as constants (a cache with a state per
        # layer built inside the forward, as transformers' sliding-window cache layers are): torch.export
        # orders the layers' ops around them differently with another number of layers
        created = [
            n.name
            for n in graph.nodes
            if n.op == "call_function" and n not in self.spans.where and "lift_fresh" in str(n.target)
        ]
        if created:
            raise StampRefused(
                f"the forward creates tensors outside {p.path} ({', '.join(created[:3])}): a state per "
                "layer built inside the forward, which torch.export captures differently for another depth"
            )
        # the prefix's representatives: what each reads from outside
        for r in set(p.templates.values()):
            _describe(self.targets, self.spans, r, p.path)  # refuses reads of another layer's tensors

    def add_weights(self) -> None:
        """Placeholders for the stamped layers' weights, after the prefix layers' own, in layer order
        (as torch.export orders the whole model's), with their tensors in the program's state."""
        p = self.p
        self.anchors = {kind: self._last_stack_spec(kind) for kind in (InputKind.PARAMETER, InputKind.BUFFER)}
        template_specs = {r: self._layer_specs(r) for r in set(p.templates.values())}
        insert_after: dict[InputKind, torch.fx.Node] = {}
        for kind, i in self.anchors.items():
            if i is not None:
                insert_after[kind] = self.by_name[self.specs[i].arg.name]
        for k in range(p.prefix, p.layers):
            r = p.templates[k]
            for s in template_specs[r]:
                insert_after[s.kind] = self._add_weight(s, r, k, insert_after[s.kind])

    def _last_stack_spec(self, kind: InputKind) -> int | None:
        return max(
            (
                i
                for i, s in enumerate(self.specs)
                if s.kind == kind and s.target and s.target.startswith(f"{self.p.path}.")
            ),
            default=None,
        )

    def _layer_specs(self, r: int) -> list[InputSpec]:
        """Layer r's parameter and buffer specs, in the program's order."""
        head = f"{self.p.path}.{r}."
        return [
            s
            for s in self.specs
            if s.kind in (InputKind.PARAMETER, InputKind.BUFFER) and s.target and s.target.startswith(head)
        ]

    def _add_weight(self, s: InputSpec, r: int, k: int, after: torch.fx.Node) -> torch.fx.Node:
        """Layer k's weight for template r's spec ``s``: its placeholder (after ``after``), spec and
        tensor."""
        path = self.p.path
        relative = str(s.target)[len(f"{path}.{r}.") :]
        target = f"{path}.{k}.{relative}"
        name = ("p_" if s.kind == InputKind.PARAMETER else "b_") + re.sub(
            r"[^a-zA-Z0-9]", "_", target
        ).lower()
        with self.graph.inserting_after(after):
            node = self.graph.placeholder(name)
        node.meta.update(self.by_name[s.arg.name].meta)
        self.weight_nodes[(k, relative)] = node
        self.added[s.kind].append(InputSpec(s.kind, TensorArgument(node.name), target, s.persistent))
        model = self.model
        tensor = model.get_parameter(target) if s.kind == InputKind.PARAMETER else model.get_buffer(target)
        (self.constants if s.persistent is False else self.state_dict)[target] = tensor
        return node

    def stamp_layers(self) -> None:
        """Each later layer copied from its template after the prefix's last layer, in order, its
        output handed on to what followed the prefix, the copies named as torch.export names them."""
        graph, p, spans = self.graph, self.p, self.spans
        prefix_out = spans.carry_out[p.prefix - 1]
        tail_users = [u for u in prefix_out.users if u not in spans.where and u.op != "output"]
        self.sizes = {
            (n.args[0], n.args[1]): n
            for n in graph.nodes
            if n.op == "call_function"
            and n.target == torch.ops.aten.sym_size.int
            and n.args[0].op == "placeholder"
        }
        self.first_op = next(n for n in graph.nodes if n.op != "placeholder")
        self.order = {n: i for i, n in enumerate(graph.nodes) if n.op == "placeholder"}
        carry, cursor = prefix_out, spans.nodes[p.prefix - 1][-1]
        for k in range(p.prefix, p.layers):
            carry, cursor = self._stamp_layer(k, carry, cursor)
        for u in tail_users:
            u.replace_input_with(prefix_out, carry)
        self.outputs = [carry if o is prefix_out else o for o in self.outputs]
        self.output.args = (tuple(self.outputs),)
        _rename(graph, p, spans, self.copies, cursor)

    def _stamp_layer(
        self, k: int, carry: torch.fx.Node, cursor: torch.fx.Node
    ) -> tuple[torch.fx.Node, torch.fx.Node]:
        """Layer k copied from its template after ``cursor``, reading ``carry`` (the previous layer's
        output); returns its output and its last node."""
        p, spans = self.p, self.spans
        r = p.templates[k]
        env: dict[torch.fx.Node, torch.fx.Node] = {spans.carry_in[r]: carry}
        template_outputs = _output_uses(self.graph, spans, r)
        remap = functools.partial(self._remap, r=r, k=k, env=env)
        for node in spans.nodes[r]:
            with self.graph.inserting_after(cursor):
                copy = self.graph.node_copy(node, remap)
            copy.meta = {
                **node.meta,
                "nn_module_stack": _restack(
                    node.meta.get("nn_module_stack"), f"{p.path}.{r}", f"{p.path}.{k}"
                ),
            }
            _resize(copy)
            env[node] = copy
            self.copies[copy] = (k, node)
            cursor = copy
        self._own_outputs(k, r, env, template_outputs)
        return env[spans.carry_out[r]], cursor

    def _remap(
        self, a: torch.fx.Node, r: int, k: int, env: dict[torch.fx.Node, torch.fx.Node]
    ) -> torch.fx.Node:
        """What layer k's copy of template r's argument ``a`` reads: the copy of a node of the span,
        layer k's own weight, cache entry or cache entry's size, or else ``a`` itself."""
        if a in env:
            return env[a]
        head = f"{self.p.path}.{r}."
        if a.op == "placeholder":
            target = self.targets.get(a.name)
            if (
                target is not None
                and target.startswith(head)
                and (k, target[len(head) :]) in self.weight_nodes
            ):
                return self.weight_nodes[(k, target[len(head) :])]
            if a.name in self.user_inputs and "#" in _unindexed(a.name, r):
                env[a] = self._indexed_input(a, r, k)
                return env[a]
            # other placeholders are shared: a constant the layer's code creates has the same
            # value in every layer of its kind (the static trace compared them)
        elif a.target == torch.ops.aten.sym_size.int and isinstance(a.args[0], torch.fx.Node):
            # the size of one of the layer's own inputs (past.r.key's length): layer k's input's
            source = a.args[0]
            if (
                source.op == "placeholder"
                and source.name in self.user_inputs
                and "#" in _unindexed(source.name, r)
            ):
                env[a] = self._size_of(self._indexed_input(source, r, k), int(a.args[1]), a)  # type: ignore[arg-type]
                return env[a]
        return a

    def _indexed_input(self, node: torch.fx.Node, r: int, k: int) -> torch.fx.Node:
        """Layer k's input for template r's input ``node`` indexed by layer (``past_r_key``): the
        prefix program passes it through."""
        want = _unindexed(node.name, r)
        found = [n for n in self.user_inputs if _unindexed(n, k) == want and n != node.name]
        if len(found) != 1 or "#" not in want:
            raise StampRefused(
                f"cannot tell which input layer {self.p.path}.{k} reads for {node.name!r} of layer {r}"
            )
        return self.by_name[found[0]]

    def _size_of(self, node: torch.fx.Node, dim: int, like: torch.fx.Node) -> torch.fx.Node:
        """``aten.sym_size.int(node, dim)`` where torch.export hoists it: before the program's ops,
        among the other inputs' sizes in the order of the inputs."""
        sizes, order = self.sizes, self.order
        if (node, dim) not in sizes:
            later = sorted(
                ((order[src], d), i, n)
                for i, ((src, d), n) in enumerate(sizes.items())
                if (order[src], d) > (order[node], dim)
            )
            before = later[0][2] if later else self.first_op
            with self.graph.inserting_before(before):
                made = self.graph.call_function(torch.ops.aten.sym_size.int, (node, dim))
            made.meta = {**like.meta, "val": node.meta["val"].shape[dim]}
            sizes[(node, dim)] = made
        return sizes[(node, dim)]

    def _own_outputs(
        self, k: int, r: int, env: dict[torch.fx.Node, torch.fx.Node], template_outputs: list[int]
    ) -> None:
        """The program's outputs of layer k (its cache entries, which the prefix program passes
        through) made by layer k's copies of template r's output nodes."""
        path = self.p.path
        read = set(env.values())
        mine = [
            i
            for i, o in enumerate(self.outputs)
            if isinstance(o, torch.fx.Node)
            and o.op == "placeholder"
            and o in read
            and "#" in _unindexed(o.name, k)
        ]
        if len(mine) != len(template_outputs):
            raise StampRefused(
                f"layer {path}.{k} has {len(mine)} entries among the outputs, layer {path}.{r} makes {len(template_outputs)}"
            )
        for i, j in zip(template_outputs, mine):
            self.outputs[j] = env[self.outputs[i]]

    def program(self) -> torch.export.ExportedProgram:
        """The edited graph as a program, its signature holding the added weights."""
        input_specs: list[InputSpec] = []
        for i, s in enumerate(self.specs):
            input_specs.append(s)
            for kind, at in self.anchors.items():
                if at == i:
                    input_specs.extend(self.added[kind])
        ep = self.ep
        out_specs = [
            OutputSpec(s.kind, TensorArgument(o.name), s.target)
            if isinstance(o, torch.fx.Node) and isinstance(s.arg, TensorArgument)
            else s
            for s, o in zip(ep.graph_signature.output_specs, self.outputs)
        ]
        self.graph.eliminate_dead_code()
        self.graph.lint()
        return LazyProgram(
            ep.graph_module,
            self.graph,
            ExportGraphSignature(input_specs=input_specs, output_specs=out_specs),
            self.state_dict,
            ep.range_constraints,
            ep.module_call_graph,
            ep.example_inputs,
            self.constants,
            verifiers=ep.verifiers,
        )


_COMMUTATIVE = (operator.add, operator.mul)


def _resize(node: torch.fx.Node) -> None:
    """A stamped size computation (``past + seq`` of the layer's own cache length) made of the layer's
    own symbols, its operands in the order torch.export writes them: the order of the sum's terms in
    sympy's canonical form, which follows the symbols' names."""
    if node.op != "call_function" or not callable(node.target) or not _symbolic(node):
        return
    if not str(node.target).startswith("<built-in function"):
        return
    vals = [a.meta.get("val") if isinstance(a, torch.fx.Node) else a for a in node.args]
    if any(v is None for v in vals):
        return
    val = node.target(*vals)
    node.meta["val"] = val
    if node.target in _COMMUTATIVE and len(node.args) == 2 and isinstance(val, torch.SymInt):
        terms = symint_expr(val).args
        exprs = [symint_expr(v) if isinstance(v, torch.SymInt) else v for v in vals]
        if len(terms) == 2 and list(terms) == exprs[::-1]:
            node.args = (node.args[1], node.args[0])


_NAME = re.compile(r"^(.*?)(?:_(\d+))?$")


def _split(name: str) -> tuple[str, int]:
    """An FX name's base and counter (``layer_norm_2`` -> ("layer_norm", 2); ``layer_norm`` -> 0)."""
    m = _NAME.match(name)
    assert m is not None  # the pattern matches every string
    return m.group(1), int(m.group(2) or 0)


def _rename(
    graph: torch.fx.Graph,
    p: LayerPlan,
    spans: _Spans,
    copies: dict[torch.fx.Node, tuple[int, torch.fx.Node]],
    last_stamped: torch.fx.Node,
) -> None:
    """The stamped nodes and those after the stack named as torch.export names them in the whole
    model (its namespace counts each op's name up through every layer): a program output named after
    its node (a bare tensor returned) gets torch.export's name."""
    counts: list[dict[str, int]] = []
    for j in range(p.layers):
        span = spans.nodes[j if j < p.prefix else p.templates[j]]
        found: dict[str, int] = {}
        for n in span:
            base = _split(n.name)[0]
            found[base] = found.get(base, 0) + 1
        counts.append(found)

    def shift(base: str, start: int, stop: int) -> int:
        return sum(counts[j].get(base, 0) for j in range(start, stop))

    wanted: dict[torch.fx.Node, str] = {}
    for copy, (k, original) in copies.items():
        base, count = _split(original.name)
        wanted[copy] = _joined(base, count + shift(base, p.templates[k], k))
    after = False
    for node in graph.nodes:
        if node is last_stamped:
            after = True
            continue
        if after and node.op not in ("placeholder", "output") and node not in spans.where:
            base, count = _split(node.name)
            wanted[node] = _joined(base, count + shift(base, p.prefix, p.layers))
    # every name freed first: a wanted name may still be held by another node that is renamed too
    for node in wanted:
        _free_name(graph, node.name)
        _rename_node(node, f"__stamped_{id(node)}")
    for node, name in wanted.items():
        _rename_node(node, name)


def _free_name(graph: torch.fx.Graph, name: str) -> None:
    """``name`` no longer taken in ``graph``, so that another node may have it."""
    graph_used_names(graph).discard(name)


def _rename_node(node: torch.fx.Node, name: str) -> None:
    """``node`` named ``name``, or ``name`` suffixed where the graph has handed it out already."""
    rename_node(node, name)


def _joined(base: str, n: int) -> str:
    return f"{base}_{n}" if n else base


def _restack(
    stack: dict[str, tuple[str, str]] | None, old: str, new: str
) -> dict[str, tuple[str, str]] | None:
    """A copied node's nn_module_stack with the representative's path made the stamped layer's
    (keys are ``L__self__`` + path, with ``@n`` for a module's later calls)."""
    if stack is None:
        return None

    def moved(text: str) -> str:
        if text == old or text.startswith((old + ".", old + "@")):
            return new + text[len(old) :]
        return text

    root = "L__self__"
    return {
        (root + moved(key[len(root) :]) if key.startswith(root) else key): (moved(path), cls)
        for key, (path, cls) in stack.items()
    }
