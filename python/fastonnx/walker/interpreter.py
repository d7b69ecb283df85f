"""One pass over the FX graph of an ExportedProgram, calling one converter per node."""

from __future__ import annotations

import contextlib
import functools
import operator
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch.export.graph_signature import InputKind, OutputKind

from fastonnx import dtypes
from fastonnx._core import GraphBuilder
from fastonnx.capture import dynamic_dims
from fastonnx.context import ConversionContext, Value
from fastonnx.diagnostics import debug
from fastonnx.errors import ConversionError, FastOnnxError, GraphError, InputError, UnsupportedOpError
from fastonnx.registry import Entry, Registry, packed_val
from fastonnx.torch_internals import FakeTensor, OpOverload, is_traceable_wrapper_subclass, op_overload_name
from fastonnx.walker import aliasing, node_metadata


@dataclass
class InputSlot:
    """One flattened user input: a graph input (onnx name) or a constant torch.export specialised."""

    onnx_name: str | None
    dtype: torch.dtype | None = None


@dataclass
class OutputSlot:
    """One flattened output: a graph output (onnx name, and whether it was a SymInt) or a constant."""

    onnx_name: str | None
    constant: Any = None
    is_scalar: bool = False
    is_complex: bool = False  # stored as (..., 2) real, returned through torch.view_as_complex


@dataclass(frozen=True)
class Alias:
    """A value sharing its base's memory: a view, a piece of one, or an in-place op's result. It was
    computed from ``parent`` when the base was at ``version``; a write to the base since makes it
    stale, and it is recomputed from the parent on its next read (see aliasing.py)."""

    base: torch.fx.Node
    parent: torch.fx.Node
    version: int


@dataclass
class Layout:
    inputs: list[InputSlot] = field(default_factory=list)
    outputs: list[OutputSlot] = field(default_factory=list)
    extra_outputs: list[str] = field(default_factory=list)  # mutated buffers, after the user's outputs


def source_line(node: torch.fx.Node) -> str:
    """The user's source line that produced a node ('file:line in fn: code'), from its stack trace."""
    trace = node.meta.get("stack_trace") or ""
    lines = [ln.strip() for ln in trace.strip().splitlines() if ln.strip()]
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("File "):
            code = lines[i + 1] if i + 1 < len(lines) else ""
            return f"{lines[i]}: {code}".strip()
    return "unknown source line"


class Interpreter:
    def __init__(
        self,
        ep: torch.export.ExportedProgram,
        ctx: ConversionContext,
        registry: Registry,
        input_names: Sequence[str] | None,
        output_names: Sequence[str] | None,
        user_args: tuple[tuple[Any, ...], dict[str, Any]],
        requested_dims: dynamic_dims.Requested,
        with_metadata: bool = True,
    ) -> None:
        self.ep = ep
        self.ctx = ctx
        self.g = ctx.g
        self.registry = registry
        self.input_names = list(input_names) if input_names is not None else None
        self.output_names = list(output_names) if output_names is not None else None
        self.env: dict[torch.fx.Node, Any] = {}
        self.layout = Layout()
        self.custom_used: set[str] = set()
        # initializer name -> state-dict key of weights without bytes (meta device)
        self.deferred: dict[str, str] = {}
        # initializer name -> (state-dict key, dtype, shape) of every weight: what to_onnx(weights=...)
        # looks up in a checkpoint
        self.weights_read: dict[str, tuple[str, torch.dtype, tuple[int, ...]]] = {}
        self.user_args = user_args
        self.requested_dims = requested_dims
        # writes through views (aliasing.py): what each alias came from, how often each base was written
        self.aliases: dict[torch.fx.Node, Alias] = {}
        self.versions: dict[torch.fx.Node, int] = {}
        self.mutated_placeholders: dict[torch.fx.Node, None] = {}  # in graph order
        # value names the builder changed to an output's name (one value may be several outputs)
        self.renamed: dict[str, str] = {}
        # which FX node made which values and nodes of the top graph (report, intermediate verification)
        self.trace = debug.Trace(renamed=self.renamed)
        self._top = ctx.g
        # readable node names and node / value metadata (node_metadata.py); None with metadata=False
        self.scopes = node_metadata.Scopes(self._top) if with_metadata else None
        ctx.find_dim = self._find_dim
        # the first top-graph node made for the graph outputs (functions.extract leaves them in main)
        self.outputs_start = 0

    # ---- driver ---------------------------------------------------------------------------------
    def run(self, progress: Callable[[int, int], None] | None = None) -> Layout:
        """Converts every node; ``progress(i, n)`` is called before node i of n (a Ctrl-C raises
        KeyboardInterrupt between two nodes: nothing here catches it)."""
        # the per-node complex check costs a walk over every argument: skip it for real-only programs
        self._complex = _program_has_complex(self.ep.graph_module)
        self._packed = _program_has(self.ep.graph_module, packed_val)  # float4_e2m1fn_x2
        sig = self.ep.graph_signature
        specs = {s.arg.name: s for s in sig.input_specs if hasattr(s.arg, "name")}
        nodes = list(self.ep.graph.nodes)
        paths = dynamic_dims.input_paths(self.ep, *self.user_args)
        user_nodes = [n for n in nodes if n.op == "placeholder" and _is_user(specs.get(n.name))]
        if self.input_names is not None:
            tensor_slots = [
                i for i, n in enumerate(user_nodes) if isinstance(n.meta.get("val"), torch.Tensor)
            ]
            if len(self.input_names) != len(tensor_slots):
                raise InputError(
                    f"input_names has {len(self.input_names)} names but the model has {len(tensor_slots)} "
                    f"tensor inputs ({', '.join(paths[i] for i in tensor_slots)})"
                )
            for i, name in zip(tensor_slots, self.input_names):
                paths[i] = name
        self.ctx.dim_names = dynamic_dims.dim_names(
            [(p, n.meta.get("val")) for p, n in zip(paths, user_nodes)], self.requested_dims
        )
        user_index = 0
        for i, node in enumerate(nodes):
            if progress is not None:
                progress(i, len(nodes))
            if node.op == "placeholder":
                spec = specs.get(node.name)
                if _is_user(spec):
                    name = paths[user_index]
                    user_index += 1
                    self._user_input(node, name, spec)
                else:
                    self._lifted_input(node, spec)
            elif node.op == "call_function":
                self._call(node, i, len(nodes))
            elif node.op == "output":
                self.outputs_start = self.g.num_nodes  # the output Identities belong to no FX node
                self._outputs(node)
                if self.scopes is not None:
                    self.scopes.assign()
            elif node.op == "get_attr":
                attr = getattr(self.ep.graph_module, str(node.target))
                # a tensor constant torch.export would have lifted (plain GraphModules keep them as
                # attributes): an initializer like the lifted ones; submodules stay as they are
                is_tensor = isinstance(attr, torch.Tensor)
                self.env[node] = self.initializer(str(node.target), attr) if is_tensor else attr
            else:
                raise ConversionError(f"unexpected FX node kind {node.op!r} at node {node.name}")
        return self.layout

    def _find_dim(self, key: str) -> tuple[str, int] | None:
        """(value, axis) of the first top-graph value converted so far with a dim written ``key``.
        Top-graph values only: they are visible inside subgraphs too, a subgraph's are not outside."""
        for node, value in self.env.items():
            if node.graph is not self.ep.graph:
                continue
            for v in value if isinstance(value, (list, tuple)) else (value,):
                if not isinstance(v, Value):
                    continue
                for axis, d in enumerate(v.shape):
                    if not isinstance(d, int) and str(self.ctx.dim(d)) == key:
                        return v.name, axis
        return None

    # ---- inputs ---------------------------------------------------------------------------------
    def _user_input(self, node: torch.fx.Node, name: str, spec: Any) -> None:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            onnx_name = self.g.add_input(name, *self.ctx.onnx_type(val.dtype, val.shape))
            if self.scopes is not None:
                self.scopes.value(onnx_name, node, spec)
            self.env[node] = Value(onnx_name, val.dtype, tuple(val.shape))
            self.layout.inputs.append(InputSlot(onnx_name, val.dtype))
            for axis, d in enumerate(val.shape):
                dim = self.ctx.dim(d)
                if isinstance(dim, str) and dim not in self.ctx.sym_sources:
                    self.ctx.sym_sources[dim] = (onnx_name, axis)
        else:
            # ints, floats, None...: torch.export specialised the graph to this value
            self.env[node] = val
            self.layout.inputs.append(InputSlot(None))

    def _lifted_input(self, node: torch.fx.Node, spec: Any) -> None:
        target = spec.target
        if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER):
            tensor = self.ep.state_dict.get(target)
            if tensor is None:
                tensor = self.ep.constants.get(target)
        elif spec.kind == InputKind.CONSTANT_TENSOR:
            tensor = self.ep.constants.get(target)
        else:
            raise ConversionError(f"input {node.name} is a {spec.kind.name}, which ONNX cannot hold")
        if not isinstance(tensor, torch.Tensor):
            raise ConversionError(
                f"no tensor was found for {spec.kind.name.lower()} {target!r} ({node.name})"
            )
        if is_traceable_wrapper_subclass(tensor):
            # a tensor subclass (torchao's quantized weights): torch.export reads its inner tensors
            # through export.access_subclass_inner_tensor; they are the initializers, as stored
            inner = self.env[node] = self._subclass_initializers(target, tensor)
            if self.scopes is not None:
                for v in _flat_values(inner):
                    self.scopes.value(v.name, node, spec)
            return
        value = self.env[node] = self.initializer(target, tensor)
        if self.scopes is not None:
            self.scopes.value(value.name, node, spec)

    def _subclass_initializers(self, hint: str, tensor: torch.Tensor) -> dict[str, Any]:
        """The inner tensors of a traceable tensor subclass by attribute name (nested ones as dicts)."""
        attrs, _ = tensor.__tensor_flatten__()  # type: ignore[attr-defined]
        inner: dict[str, Any] = {}
        for attr in attrs:
            t = getattr(tensor, attr)
            if not isinstance(t, torch.Tensor):
                continue
            name = f"{hint}.{attr}"
            inner[attr] = (
                self._subclass_initializers(name, t)
                if is_traceable_wrapper_subclass(t)
                else self.initializer(name, t)
            )
        return inner

    def initializer(self, hint: str, tensor: torch.Tensor) -> Value:
        """A weight as an initializer whose bytes stay in torch's storage (no copy unless strided); a
        weight off the CPU is copied to the host only while the file is written, a tensor at a time."""
        t = tensor.detach()
        if isinstance(t, torch.nn.Parameter):
            t = t.data
        if t.is_complex():
            # stored in the (..., 2) real layout: a view of the same bytes
            value = self.initializer(hint, torch.view_as_real(t))
            return Value(value.name, t.dtype, tuple(t.shape))
        # float8 / float4 weights: OpsetError below their first opset; float4's last dim doubles
        elem_type, dims = self.ctx.onnx_type(t.dtype, t.shape)
        shape = [d for d in dims if isinstance(d, int)]
        if len(shape) != len(dims):
            raise ConversionError(f"weight {hint!r} has a symbolic shape {dims}; weights need static ones")
        if t.is_meta or isinstance(t, FakeTensor):
            # no bytes to write: the data file gets a hole that fastonnx.attach_weights fills later
            name = self.g.add_deferred_initializer(hint, elem_type, shape)
            self.deferred[name] = hint
            self.weights_read[name] = (hint, t.dtype, tuple(t.shape))
            return Value(name, t.dtype, tuple(t.shape))
        if dtypes.on_host(t):
            name = self.g.add_initializer(hint, dtypes.tensor_bytes(t), elem_type, shape)
        else:
            # a GPU (or other device) weight stays there: the writer asks for a host copy of it while
            # it writes the file, one tensor at a time (dtypes.tensor_bytes makes the copy)
            name = self.g.add_fetched_initializer(
                hint,
                functools.partial(dtypes.tensor_bytes, t),
                t.numel() * t.element_size(),
                elem_type,
                shape,
                t.data_ptr(),
            )
        self.ctx.weights[name] = t
        self.weights_read[name] = (hint, t.dtype, tuple(t.shape))
        return Value(name, t.dtype, tuple(t.shape))

    # ---- calls ----------------------------------------------------------------------------------
    def map_arg(self, a: Any) -> Any:
        """An FX argument with every node replaced by what it was converted to."""
        if isinstance(a, torch.fx.Node):
            return self.value_of(a)
        if isinstance(a, (list, tuple)):
            return type(a)(self.map_arg(x) for x in a)
        if isinstance(a, dict):
            return {k: self.map_arg(v) for k, v in a.items()}
        return a

    @contextlib.contextmanager
    def emitting_into(self, sub: GraphBuilder) -> Iterator[None]:
        """Converters emit into ``sub`` (a subgraph builder) inside the block."""
        saved = (self.g, self.ctx.g, dict(self.ctx.sym_values))
        self.g = self.ctx.g = sub
        try:
            yield
        finally:
            # values created inside the subgraph are not visible outside it
            self.g, self.ctx.g, self.ctx.sym_values = saved

    def value_of(self, node: torch.fx.Node) -> Any:
        """What ``node`` converted to, as it is now: an alias whose base was written since it was
        computed is recomputed from its (current) parent first."""
        alias = self.aliases.get(node)
        if alias is None or alias.version == self.versions.get(alias.base, 0):
            return self.env[node]
        parent = self.value_of(alias.parent)
        if node.target is operator.getitem:
            value = parent[node.args[1]]
        elif aliasing.is_in_place(node):
            value = parent  # an in-place op returns what it wrote
        else:
            entry = self.registry.lookup(node.target)
            assert entry is not None  # it was converted once already
            args = (parent, *self.map_arg(node.args[1:]))
            where = f"FX node {node.name!r}, recomputed after a write to {alias.base.name}"
            reader = self.scopes.current if self.scopes is not None else None
            if self.scopes is not None:
                self.scopes.enter(self.g, node, self.g.num_nodes)
            value = self._apply(node, entry, args, self.map_arg(node.kwargs), where)
            if self.scopes is not None and reader is not None:
                # back to the node that read the alias
                self.scopes.enter(self.g, reader, self.g.num_nodes)
        self.env[node] = value
        self.aliases[node] = replace(alias, version=self.versions.get(alias.base, 0))
        return value

    def _call(self, node: torch.fx.Node, index: int, total: int) -> None:
        """Convert one node; an error leaves the builder's state on it (``.debug``, see debug.py), and
        on the top graph the node's value and where its ONNX nodes start are traced (debug.Trace)."""
        start = self.g.num_nodes
        try:
            self._convert_call(node, index, total, start)
        except FastOnnxError as e:
            debug.add_dump(e, debug.node_dump(self.g, node, index, total, self.ctx.opset), node)
            raise
        if self.g is self._top:
            self.trace.steps.append((node.name, start, self.env.get(node)))

    def _convert_call(self, node: torch.fx.Node, index: int, total: int, start: int) -> None:
        target = node.target
        if target is operator.getitem:
            seq, i = node.args
            self.env[node] = self.value_of(seq)[i]  # type: ignore[arg-type]
            if seq in self.aliases:
                base = self.aliases[seq].base  # type: ignore[index]
                self.aliases[node] = Alias(base, seq, self.versions.get(base, 0))  # type: ignore[arg-type]
            return
        where = f"FX node {node.name!r}, node {index + 1} of {total}"
        entry = self.registry.lookup(target)
        if entry is None:
            raise UnsupportedOpError(
                f"no converter for {target} ({where}), called at {source_line(node)}. Converted so far: "
                f"{index} nodes. Pass custom_converters={{{_qualname(target)}: fn}} or a decompositions "
                "table to go on."
            )
        if entry.custom:
            self.custom_used.add(str(target))
        if self.scopes is not None:
            self.scopes.enter(self.g, node, start)
        self.ctx.node = node
        self.ctx.base_node = self.ctx.base = None
        if entry.takes_node:
            # a higher-order op: its operands are subgraphs, converted through this walker
            try:
                result = entry.convert(self, node)
            except FastOnnxError as e:
                e.add_note(f"while converting {target} ({where}), called at {source_line(node)}")
                raise
            self.env[node] = self._bind(node, result)
            return
        value = self._apply(node, entry, self.map_arg(node.args), self.map_arg(node.kwargs), where)
        self.env[node] = value
        self._note_symbol(node, value)
        first = node.args[0] if node.args else None
        if not isinstance(first, torch.fx.Node):
            return
        if entry.in_place:
            self._written(node, first, value)
        elif aliasing.is_view(node):
            base = self.aliases[first].base if first in self.aliases else first
            self.aliases[node] = Alias(base, first, self.versions.get(base, 0))

    def _note_symbol(self, node: torch.fx.Node, value: Any) -> None:
        """A node whose result is a size torch.export made a symbol of (an unbacked ``u0`` from
        ``.item()`` / ``.tolist()``: JetMoE's expert sizes) is that symbol's runtime value from here on;
        no input or shape carries it, and splits and views sized by it read it here."""
        val = node.meta.get("val")
        if not isinstance(val, torch.SymInt) or not isinstance(value, (Value, str)):
            return
        key = str(self.ctx.dim(val))
        if key not in self.ctx.sym_values and key not in self.ctx.sym_sources:
            self.ctx.sym_values[key] = self.ctx.sym_value(value)

    def _apply(self, node: torch.fx.Node, entry: Entry, args: Any, kwargs: Any, where: str) -> Any:
        """Convert ``node`` with its mapped arguments; the result bound to torch's dtype and shape."""
        target = node.target
        fn = entry.convert
        if self._complex and _involves_complex(node, args, kwargs):
            complex_fn = self.registry.complex_converter(entry)
            if complex_fn is None:
                what = "inputs" if _has_complex(args) or _has_complex(kwargs) else "outputs"
                raise UnsupportedOpError(
                    f"complex {what} are not supported by {target} ({where}), called at "
                    f"{source_line(node)}; fastonnx converts complex values only for FFTs and "
                    "the complex-number operators (converters/complex_numbers.py)"
                )
            fn = complex_fn
        if self._packed and not self.registry.converts_packed(entry) and _involves_packed(node, args, kwargs):
            raise UnsupportedOpError(
                f"{target} is not converted for torch.float4_e2m1fn_x2 tensors ({where}), called at "
                f"{source_line(node)}: their ONNX tensors hold two values per torch element (the last "
                "dim doubled), and fastonnx converts only their creation, copies and sizes. Pass "
                f"custom_converters={{{_qualname(target)}: fn}} to convert it"
            )
        self.ctx.node = node
        self._set_base(node)
        try:
            result = fn(self.ctx, *args, **kwargs)
        except FastOnnxError as e:
            e.add_note(f"while converting {target} ({where}), called at {source_line(node)}")
            raise
        except Exception as e:
            raise ConversionError(
                f"converting {target} ({where}) failed: {type(e).__name__}: {e}; called at "
                f"{source_line(node)}"
            ) from e
        return self._bind(node, result)

    def _set_base(self, node: torch.fx.Node) -> None:
        """``ctx.base_node`` / ``ctx.base``: the base of ``node``'s first argument when that is an alias
        (a view of a base tensor), with the base's current value; None otherwise."""
        first = node.args[0] if node.args else None
        alias = self.aliases.get(first) if isinstance(first, torch.fx.Node) else None
        if alias is None:
            self.ctx.base_node = self.ctx.base = None
            return
        base = self.value_of(alias.base)
        self.ctx.base_node = alias.base
        self.ctx.base = base if isinstance(base, Value) else None

    def _written(self, node: torch.fx.Node, target: torch.fx.Node, value: Any) -> None:
        """An in-place op wrote ``value`` into ``target``: rebind the base (through the views between
        them) and make the op's own result an alias of ``target``."""
        alias = self.aliases.get(target)
        base = alias.base if alias is not None else target
        new = value
        child = target
        while child is not base:
            # the parent as it is now, with the part ``child`` shows replaced
            link = self.aliases[child]
            parent = self.value_of(link.parent)
            if aliasing.is_in_place(child):
                pass  # the in-place result is its target itself
            elif child.target is operator.getitem or not isinstance(parent, Value):
                raise ConversionError(f"cannot write through {child.name} ({child.target})")
            else:
                args = aliasing.bound_args(child, self.map_arg(child.args), self.map_arg(child.kwargs))
                self.ctx.node = child
                self.ctx.base_node = self.ctx.base = None
                name = aliasing.write_into(self.ctx, child, args, parent, new)
                self._declare(name, *self.ctx.onnx_type(parent.dtype, parent.shape))
                new = Value(name, parent.dtype, parent.shape)
            child = link.parent
        self.env[base] = new
        version = self.versions[base] = self.versions.get(base, 0) + 1
        if target is not base:
            self.env[target] = value
            self.aliases[target] = Alias(self.aliases[target].base, self.aliases[target].parent, version)
        self.aliases[node] = Alias(base, target, version)
        if base.op == "placeholder":
            self.mutated_placeholders[base] = None

    def _declare(self, name: str, elem_type: int, dims: list[Any]) -> None:
        """Records the ONNX type torch gives a value. Inside a subgraph a converter may hand back a
        value of an enclosing graph (its operand unchanged, a size the outer graph computed already):
        that value was typed where it was made, and ONNX reads it by name from the subgraph as it is."""
        try:
            self.g.set_type(name, elem_type, dims)
        except GraphError:
            if self.g is self._top or not self.g.has_value(name):
                raise

    def _bind(self, node: torch.fx.Node, result: Any) -> Any:
        return self._bind_val(node, node.meta.get("val"), result)

    def _bind_val(self, node: torch.fx.Node, val: Any, result: Any) -> Any:
        if isinstance(val, torch.Tensor):
            name = result.name if isinstance(result, Value) else result
            if not isinstance(name, str) or not name:
                raise ConversionError(
                    f"the converter for {node.target} (node {node.name!r}) returned {result!r}, "
                    "not an ONNX value name"
                )
            elem_type, dims = self.ctx.onnx_type(val.dtype, val.shape)
            made = self.g.dtype(name)
            if made and made != elem_type:
                # The converter made eager's dtype where torch's meta kernel records another (the
                # functional batch norm's float16 running stats come out float32 from meta): the graph
                # follows the record, which every later converter reads, so the value's declared type
                # (value_info) is its real one.
                name = self.ctx.cast(name, val.dtype)
            self._declare(name, elem_type, dims)
            return Value(name, val.dtype, tuple(val.shape))
        if isinstance(val, (list, tuple)):
            if not isinstance(result, (list, tuple)) or len(result) < len(val):
                raise ConversionError(
                    f"the converter for {node.target} (node {node.name!r}) returned {result!r}; "
                    f"the node has {len(val)} outputs"
                )
            return [self._bind_val(node, v, r) if r is not None else None for v, r in zip(val, result)]
        if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            dt = {torch.SymInt: torch.int64, torch.SymFloat: torch.float32, torch.SymBool: torch.bool}[
                type(val)
            ]
            if isinstance(result, Value):
                return result
            if isinstance(result, str):
                self._declare(result, dtypes.to_onnx_dtype(dt), [])
                return Value(result, dt, ())
            return result  # a Python number the converter folded
        return result

    def run_subgraph(self, graph: torch.fx.Graph, operands: Sequence[Any]) -> Any:
        """Convert a submodule's graph in place, its placeholders bound to ``operands``."""
        placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        for ph, val in zip(placeholders, operands, strict=True):
            self.env[ph] = val
        nodes = list(graph.nodes)
        for i, n in enumerate(nodes):
            if n.op == "call_function":
                self._call(n, i, len(nodes))
            elif n.op == "get_attr":
                self.env[n] = getattr(graph.owning_module, str(n.target))
            elif n.op == "output":
                return self.map_arg(n.args[0])
        return None

    # ---- outputs --------------------------------------------------------------------------------
    def _outputs(self, node: torch.fx.Node) -> None:
        if self.scopes is not None:
            self.scopes.enter(self.g, node, self.g.num_nodes)  # the Identity nodes outputs may need
        flat = list(node.args[0]) if isinstance(node.args[0], (list, tuple)) else [node.args[0]]
        specs = self.ep.graph_signature.output_specs
        user = [(a, s) for a, s in zip(flat, specs) if s.kind == OutputKind.USER_OUTPUT]
        if self.output_names is not None:
            n_tensors = sum(1 for a, _ in user if isinstance(a, torch.fx.Node))
            if len(self.output_names) != n_tensors:
                raise InputError(
                    f"output_names has {len(self.output_names)} names but the model has {n_tensors} "
                    "tensor outputs"
                )
        paths = dynamic_dims.output_paths(self.ep.call_spec.out_spec, len(user))
        k = 0
        # the user's outputs first, then mutated buffers and inputs (torch.export lists those first)
        for (a, _spec), path in zip(user, paths):
            if isinstance(a, torch.fx.Node):
                wanted = self.output_names[k] if self.output_names else (path or a.name)
                k += 1
                name, is_scalar = self._output_value(a, wanted)
                if self.scopes is not None:
                    node_metadata.output_metadata(self.g, name, a, OutputKind.USER_OUTPUT.name)
                value = self.value_of(a)
                is_complex = isinstance(value, Value) and value.dtype.is_complex
                self.layout.outputs.append(OutputSlot(name, is_scalar=is_scalar, is_complex=is_complex))
            else:
                self.layout.outputs.append(OutputSlot(None, constant=a))
        for a, spec in zip(flat, specs):
            if spec.kind == OutputKind.USER_OUTPUT:
                continue
            if spec.kind in (OutputKind.BUFFER_MUTATION, OutputKind.USER_INPUT_MUTATION):
                assert isinstance(a, torch.fx.Node)
                name, _ = self._output_value(a, f"mutated.{spec.target}")
                if self.scopes is not None:
                    node_metadata.output_metadata(self.g, name, a, spec.kind.name)
                self.layout.extra_outputs.append(name)
            else:
                raise ConversionError(f"output {a} is a {spec.kind.name}, which fastonnx does not export")
        # inputs and buffers the walker wrote in place (aliasing.py), named as functionalization would
        kinds = {s.arg.name: s for s in self.ep.graph_signature.input_specs if hasattr(s.arg, "name")}
        for ph in (n for n in self.ep.graph.nodes if n in self.mutated_placeholders):
            spec = kinds.get(ph.name)
            target = spec.target if spec is not None and spec.kind == InputKind.BUFFER else ph.name
            name, _ = self._output_value(ph, f"mutated.{target}")
            if self.scopes is not None:
                kind = OutputKind.BUFFER_MUTATION if target != ph.name else OutputKind.USER_INPUT_MUTATION
                node_metadata.output_metadata(self.g, name, ph, kind.name)
            self.layout.extra_outputs.append(name)
        if not self.layout.extra_outputs and all(o.onnx_name is None for o in self.layout.outputs):
            raise InputError(
                "the model returns no tensor (torch.export made every output a constant: "
                f"{[o.constant for o in self.layout.outputs]}); an ONNX model needs at least one output"
            )

    def _output_value(self, a: torch.fx.Node, wanted: str) -> tuple[str, bool]:
        value = self.value_of(a)
        if isinstance(value, Value) and value.name in self.renamed:
            value = Value(self.renamed[value.name], value.dtype, value.shape)
        if not isinstance(value, Value):
            # a constant the converters folded (e.g. a static size); it becomes a constant output
            val = a.meta.get("val")
            dt = torch.int64 if isinstance(val, (int, torch.SymInt)) else torch.float32
            name = self.ctx.const(value, dt)
            return self.g.add_output(name, wanted), True
        name = self.g.add_output(value.name, wanted)
        if name != value.name:
            # the builder renamed the value to the output's name: later outputs of the same node
            # (an input mutated in place and also returned) must read it under its new name
            self.renamed[value.name] = name
        return name, value.rank == 0 and isinstance(
            a.meta.get("val"), (torch.SymInt, torch.SymFloat, torch.SymBool, int, float)
        )


def _has_complex(a: Any) -> bool:
    if isinstance(a, (Value, torch.Tensor)):
        return a.dtype.is_complex
    if isinstance(a, (list, tuple)):
        return any(_has_complex(x) for x in a)
    if isinstance(a, dict):
        return any(_has_complex(x) for x in a.values())
    return False


def _program_has_complex(root: torch.nn.Module) -> bool:
    """Whether any node of the program or of its subgraphs holds a complex tensor."""
    return _program_has(root, _has_complex)


def _program_has(root: torch.nn.Module, holds: Callable[[Any], bool]) -> bool:
    """Whether any node of the program or of its subgraphs records a value that ``holds``."""
    return any(
        holds(node.meta.get("val"))
        for gm in root.modules()
        if isinstance(gm, torch.fx.GraphModule)
        for node in gm.graph.nodes
    )


def _involves_packed(node: torch.fx.Node, args: Any, kwargs: Any) -> bool:
    """Whether a node reads or makes a float4_e2m1fn_x2 tensor."""
    return packed_val(node.meta.get("val")) or packed_val(list(args)) or packed_val(list(kwargs.values()))


def _involves_complex(node: torch.fx.Node, args: Any, kwargs: Any) -> bool:
    """Whether a node reads or produces a complex tensor (stored in the (..., 2) real layout)."""
    return _has_complex(node.meta.get("val")) or _has_complex(args) or _has_complex(kwargs)


def _is_user(spec: Any) -> bool:
    return spec is None or spec.kind == InputKind.USER_INPUT


def _qualname(target: Any) -> str:
    if isinstance(target, OpOverload):
        return f"torch.ops.{target.namespace}.{target.overloadpacket.__name__}.{op_overload_name(target)}"
    return getattr(target, "__qualname__", str(target))


def _flat_values(inner: dict[str, Any]) -> Iterator[Value]:
    for v in inner.values():
        if isinstance(v, dict):
            yield from _flat_values(v)
        else:
            yield v
