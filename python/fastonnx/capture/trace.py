"""capture="trace": the aten ops a module runs on its real example inputs, recorded into an ExportedProgram.

torch.export traces with fake tensors and pays ~2 ms of symbolic bookkeeping per op; with static shapes
none of it is needed. Here the model runs once, eagerly, on the user's tensors under a
``TorchDispatchMode`` that appends one FX node per aten op it sees, so capture costs about one eager
forward plus a few microseconds per op. What the graph holds:

- placeholders in torch.export's order and naming: parameters (``p_...``), buffers (``b_...``),
  tensors the forward reads that are neither (``c_...``, CONSTANT_TENSOR), then the user inputs (named
  after ``forward``'s parameters, nested ones by their pytree path); every parameter and buffer is
  lifted, also those the forward does not read (``num_batches_tracked``), as torch.export lifts them.
- one ``call_function`` node per aten op overload below autograd, run under ``torch.no_grad()``; the
  functions torch.export keeps whole (``linear``, ``scaled_dot_product_attention``, convolutions,
  ``layer_norm``, eval ``batch_norm``, ``matmul``, ``softmax``, pools, ``flatten``, the recurrent cells:
  ``_KEPT``, also where ``nn.MultiheadAttention``'s functional form calls them: ``_SEE_THROUGH``) are
  recorded as that one op by a ``TorchFunctionMode``, so the converters and the optimizer's fusions see
  torch.export's graph; other composite ops arrive decomposed (``reshape`` as ``view``); a multi-output
  op is followed by ``getitem`` nodes; trailing arguments equal to the schema's defaults are dropped,
  as torch.export records them.
- ``meta["val"]``: a meta-device tensor of the output's dtype, shape and strides (the walker reads no
  values, and activations are not kept alive); ``meta["nn_module_stack"]`` kept by forward pre / post
  hooks on the model's submodules, in torch.export's format; ``meta["stack_trace"]``: the ``forward``
  frames from the model's down to the op, innermost last (torch.export keeps those only).
- dead nodes removed (torch.export does the same); ``torch.compiler.is_compiling()`` / ``is_exporting()``
  answer True while tracing, as under torch.export, so models that branch on them take the same path.

What differs from torch.export's program: composite ops other than ``_KEPT`` are recorded as autograd
runs them (``x.to(...)`` as ``_to_copy``, ``x & y`` as ``bitwise_and``, ``x.reshape`` as ``view``), and
torch.export's ``_assert_tensor_metadata`` checks are absent; in the model suites they convert to the
same ONNX ops in the same order, but the FX node names differ and reach the file through the metadata
(``pkg.torch.onnx.fx_node``, ``namespace``...), the names of folded values and, where a model's last op
is such a composite op (``prelu``, ``instance_norm``, ``F.pad``...), the output's name; a lone composite
op may also convert to other (equivalent) ONNX ops than torch.export's whole one. So the file is byte for byte torch.export's where every
torch call of the model is one aten op in both (MLPs, CNNs such as resnet18), and otherwise the same graph
(op types in order, inputs and outputs) with other names (the transformers models):
``tests/support/export_check.py`` checks that for every static-shape model of the suites.

The inputs are the pytree leaves of the arguments, as torch.export takes them (input_tensors.py): a
leaf that is neither a plain tensor nor a basic constant (an object of an unregistered class) refuses
the trace, and so does a tensor read from the arguments' memory that is no leaf (a ``register_constant``
class holding one); a tensor read from a global or closure is lifted as a constant, as torch.export
lifts it.

What a real-tensor trace could silently specialise raises :class:`TraceRefused`, and ``capture/__init__.py``
falls back to torch.export, with a warning naming the reason under capture="trace" and an INFO log
under capture="auto" (the default; ``stats["capture"]`` says which path ran):
a tensor's value read into Python (ops tagged ``data_dependent_output``: ``item()``, ``bool(t)``,
``tolist()``, ``equal``...), an op whose output shape depends on the data (tagged
``dynamic_output_shape``: ``nonzero``, ``unique``, ``masked_select``...), an in-place write into a user
input, parameter, buffer or captured constant (or through a view of one), a tensor subclass, a copy
of a meta tensor's values to another device (a meta-device trace holds none), a recurrent layer
(torch.export keeps it one op over any length), a
higher-order op (torch.cond...), an op outside the aten namespace (a custom op such as torchvision's
``nms``, whose output size torch.export takes from its fake kernel, or an op of ``torch.onnx.ops``),
``as_strided`` (it addresses the storage under a view), ``tensor_split`` by a tensor of indices (its C++ reads them) or anything else the
recorder does not understand (any exception while tracing). ``capture/__init__.py`` also refuses a recorded
program holding an op fastonnx does not convert (one torch.export keeps inside a composite op it
converts) or one needing torch.export's functionalization (writes through views the walker cannot
write: run_decompositions would re-trace the recorded meta values). Each reason names the user's line. Reading values without an aten op (``tolist()``,
``numpy()``, ``__array__``) is caught by patching those methods on the tracing thread.
``dynamic_shapes`` with capture="trace" is an InputError (a trace fixes every size).

A model on the meta device (weights, or inputs) is recorded the same way, on meta tensors: the run
computes no values, only each output's metadata, and meta_cache.py computes that once per distinct
call (op, input metadata, other arguments) instead of once per layer. The run sees the devices
torch.export's fake tensors of that model report (meta), so device checks take torch.export's branch.
"""

from __future__ import annotations

import functools
import inspect
import linecache
import operator
import os
import re
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import torch
from torch.export.exported_program import ModuleCallEntry, ModuleCallSignature
from torch.export.graph_signature import (
    ConstantArgument,
    ExportGraphSignature,
    InputKind,
    InputSpec,
    OutputKind,
    OutputSpec,
    TensorArgument,
)
from torch.overrides import TorchFunctionMode
from torch.utils.weak import WeakIdKeyDictionary

from fastonnx.capture.input_tensors import (
    forward_names,
    forward_params,
    key_text,
    reachable_tensors,
    storage_address,
    unsupported_leaf,
)
from fastonnx.capture.meta_cache import MetaCache, meta_cache_for
from fastonnx.capture.refusal import TraceRefused
from fastonnx.torch_internals import (
    DispatchModeWithoutDynamo,
    LazyGraphModule,
    OpOverload,
    as_under_export,
    graph_used_names,
    no_dispatch,
    non_persistent_buffer_names,
    op_name,
    op_schema,
    pytree,
    set_graph_module,
    set_plain_codegen,
    view_base,
)


class LazyProgram(torch.export.ExportedProgram):
    """An ExportedProgram fastonnx built itself (the trace's, stamping.py's), without torch's
    validation and with its graph module's Python code generated only when something asks for it."""

    def __init__(self, root: torch.nn.Module, graph: torch.fx.Graph, *args: Any, **kwargs: Any) -> None:
        # the graph module's Python code generated when something asks for it (torch's lazy graph
        # module: ep.module(), .code), not here: ~0.3 s at 2,300 nodes, which the converters never read.
        # torch's constructor would compile it; it gets an empty graph, the real one comes after
        # (its getitems are unique already: one per output of a node)
        super().__init__(root, torch.fx.Graph(), *args, **kwargs)
        set_graph_module(self, LazyGraphModule(root, graph))

    def validate(self) -> None:
        return None


class TracedProgram(LazyProgram):
    """An ExportedProgram built from a trace, without torch's validation: its verifiers read every
    node's meta["val"] through torch.fx.experimental.symbolic_shapes, whose import (sympy) costs
    ~0.7 s of a fresh process. The graph comes from a run that succeeded and its signature is built
    with it; like torch.export's training IR it may hold in-place ops (the walker writes them,
    aliasing.py)."""

    def __init__(self, root: torch.nn.Module, graph: torch.fx.Graph, *args: Any, **kwargs: Any) -> None:
        set_plain_codegen(graph)
        super().__init__(root, graph, *args, **kwargs)


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_OWN_DIR = os.path.dirname(__file__) + os.sep
_GETITEM = operator.getitem


def _meta_like(t: torch.Tensor) -> torch.Tensor:
    with no_dispatch():  # not an op of the model's (from _KeptFunctions: no node)
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


def _static_indexing(func: Any, args: Any) -> bool:
    """aten.index / index_put with integer indices: tagged dynamic_output_shape for boolean masks only."""
    if func.overloadpacket not in (torch.ops.aten.index, torch.ops.aten.index_put, torch.ops.aten.index_put_):
        return False
    indices = args[1] if len(args) > 1 else ()
    return all(i is None or i.dtype not in (torch.bool, torch.uint8) for i in indices)


class _Recorder(DispatchModeWithoutDynamo):
    """Appends one FX node per aten op to ``graph``; tensors are matched to nodes by identity."""

    def __init__(self, graph: torch.fx.Graph, nodes: WeakIdKeyDictionary, roots: dict[int, str]) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.graph = graph
        self.nodes = nodes  # tensor -> the FX node that holds it now
        self.roots = roots  # id of a weight / input / constant tensor -> what it is (for mutation checks)
        self.constants: dict[str, torch.Tensor] = {}
        self.constant_nodes: list[torch.fx.Node] = []
        self.attributes: dict[int, str] = {}  # id of a plain tensor attribute of a module -> its path
        self.stack: dict[str, tuple[str, str]] = {}
        self.inside = False  # within a function recorded as one node: its aten ops are not recorded
        self.root_code: Any = None  # the code of the model's forward: where stack traces start
        self._trace_cache: dict[tuple[Any, int], str] = {}
        # storage address -> path of every tensor reached from the arguments (input_tensors.py)
        self.input_memory: dict[int, str] = {}
        self.meta_cache: MetaCache | None = None  # on the meta device: meta_cache.py

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        cache = self.meta_cache
        if self.inside:  # an op of a function recorded whole (_KeptFunctions)
            return func(*args, **kwargs) if cache is None else cache.call(func, args, kwargs)
        if not isinstance(func, OpOverload):
            raise TraceRefused(f"{func} is not an aten op overload")
        if func.namespace in ("onnx", "onnx_symbolic"):
            # torch.onnx.ops (ONNX's RotaryEmbedding and Attention, the symbolic ops whose eager kernels
            # return zeros): no output size depends on values, but the recorder takes aten ops only;
            # torch.export keeps each one node, which fastonnx converts (converters/onnx_ops.py)
            raise TraceRefused(
                f"{func} is a custom op (not aten) from torch.onnx.ops: the recorder takes aten ops only, "
                "torch.export keeps it as one node"
            )
        if func.namespace != "aten":
            # torch.export asks a custom op's fake kernel for its output sizes, which may depend on the
            # values (torchvision's nms); its tags do not say so, and a real run would fix them
            raise TraceRefused(
                f"{func} is a custom op (not aten): its output sizes may depend on the input's values"
            )
        tags = func.tags
        if torch.Tag.data_dependent_output in tags:
            raise TraceRefused(
                f"{func} reads a tensor's value into Python (item(), bool(t), int(t), tolist(), equal...): "
                "the trace would fix the branch or size it decides"
            )
        if func.overloadpacket in (torch.ops.aten.as_strided, torch.ops.aten.as_strided_):
            raise TraceRefused(
                f"{func} addresses the storage under its input, which the recorded graph does not hold"
            )
        if torch.Tag.dynamic_output_shape in tags and not _static_indexing(func, args):
            raise TraceRefused(f"{func}'s output shape depends on the input's values")
        if op_schema(func).is_mutable:
            self._check_writes(func, args, kwargs)
        out = func(*args, **kwargs) if cache is None else cache.call(func, args, kwargs)
        self.record(func, args, kwargs, out)
        return out

    def record(self, func: OpOverload, args: Any, kwargs: Any, out: Any) -> None:
        """One node for ``func(*args, **kwargs) -> out`` (and a getitem per tensor of a tuple out)."""
        node = self.graph.create_node(
            "call_function",
            func,
            self._to_nodes(_without_defaults(func, args)),
            self._to_nodes(kwargs),
            name=op_name(func),
        )
        meta = node.meta
        meta["nn_module_stack"] = self.stack
        meta["stack_trace"] = self._user_stack()
        if isinstance(out, torch.Tensor):
            meta["val"] = _meta_like(out)
            self.nodes[out] = node
        elif isinstance(out, (tuple, list)):
            meta["val"] = [_meta_like(o) if isinstance(o, torch.Tensor) else o for o in out]
            for i, o in enumerate(out):
                if isinstance(o, torch.Tensor):
                    item = self.graph.create_node("call_function", _GETITEM, (node, i), name="getitem")
                    item.meta.update(val=meta["val"][i], nn_module_stack=self.stack)
                    item.meta["stack_trace"] = meta["stack_trace"]
                    self.nodes[o] = item
        elif out is None or isinstance(out, (int, float, bool)):
            meta["val"] = out
        else:
            raise TraceRefused(f"{func} returned a {type(out).__name__}, which the recorder does not hold")

    def _check_writes(self, func: Any, args: Any, kwargs: Any) -> None:
        for i, arg in enumerate(op_schema(func).arguments):
            info = arg.alias_info
            if info is None or not info.is_write:
                continue
            value = kwargs.get(arg.name) if arg.kwarg_only or i >= len(args) else args[i]
            for t in value if isinstance(value, (list, tuple)) else (value,):
                if not isinstance(t, torch.Tensor):
                    continue
                # the tensor itself (an input may be a view of the caller's tensor) or what it views
                what = self.roots.get(id(t)) or (
                    self.roots.get(id(base)) if (base := view_base(t)) is not None else None
                )
                if what is not None:
                    raise TraceRefused(f"{func} writes in place into {what}")

    def _to_nodes(self, a: Any) -> Any:
        if isinstance(a, torch.Tensor):
            node = self.nodes.get(a)  # type: ignore[no-untyped-call]
            return node if node is not None else self._constant(a)
        if isinstance(a, (list, tuple)):
            return type(a)(self._to_nodes(x) for x in a)
        if isinstance(a, dict):
            return {k: self._to_nodes(v) for k, v in a.items()}
        return a

    def _constant(self, t: torch.Tensor) -> torch.fx.Node:
        """A tensor the forward reads that is no weight, input or op result: lifted as torch.export
        lifts it (a CONSTANT_TENSOR placeholder)."""
        if type(t) not in (torch.Tensor, torch.nn.Parameter):
            raise TraceRefused(f"the forward reads a {type(t).__name__} (a tensor subclass)")
        if (base := view_base(t)) is not None and id(base) in self.roots:
            raise TraceRefused("the forward reads a view made outside the traced ops")
        reached = self.input_memory.get(storage_address(t))
        if reached is not None:
            # a tensor of the arguments that is no pytree leaf (a registered constant's, say): lifting
            # it would bake the example's values into the file
            raise TraceRefused(
                f"the forward reads the memory of input {reached!r}, which is not a pytree leaf of the "
                "arguments: it would become a constant"
            )
        # a tensor attribute of a module keeps its path (as torch.export names it); others are numbered
        target = self.attributes.get(id(t)) or f"lifted_tensor_{len(self.constants)}"
        self.constants[target] = t
        self.roots[id(t)] = f"the captured constant tensor {target!r}"
        node = self.graph.placeholder("c_" + re.sub(r"[^a-zA-Z0-9]", "_", target).lower())
        node.meta["constant_target"] = target
        node.meta["val"] = _meta_like(t)
        self.nodes[t] = node
        self.constant_nodes.append(node)
        return node

    def _user_stack(self) -> str:
        """The ``forward`` frames from the model's down to the op, as torch.export's stack_trace
        prints them (innermost last)."""
        frame: FrameType | None = sys._getframe(2)
        lines: list[str] = []
        cache = self._trace_cache
        root = self.root_code
        while frame is not None:
            code = frame.f_code
            if code.co_name == "forward":  # the only frames kept (_frame_text): others not looked up
                key = (code, frame.f_lineno)
                text = cache.get(key)
                if text is None:
                    text = cache[key] = _frame_text(code, frame.f_lineno)
                if text:
                    lines.append(text)
            if code is root:
                break
            frame = frame.f_back
        lines.reverse()
        return "".join(lines).strip()


_DEFAULTS: dict[Any, list[Any]] = {}
_NO_DEFAULT = object()


def _without_defaults(func: OpOverload, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """``args`` without the trailing ones equal to the schema's defaults, as torch.export records a
    call (the node's text in the metadata, pkg.torch.onnx.fx_node, reads the same)."""
    defaults = _DEFAULTS.get(func)
    if defaults is None:
        defaults = _DEFAULTS[func] = [
            a.default_value if a.has_default_value() else _NO_DEFAULT
            for a in op_schema(func).arguments
            if not a.kwarg_only
        ]
    n = len(args)
    while n and n <= len(defaults) and _same(args[n - 1], defaults[n - 1]):
        n -= 1
    return args if n == len(args) else tuple(args[:n])


def _same(value: Any, default: Any) -> bool:
    if default is _NO_DEFAULT or isinstance(value, torch.Tensor) or isinstance(default, torch.Tensor):
        return False
    if isinstance(value, (list, tuple)) and isinstance(default, int):
        return all(type(v) is int and v == default for v in value)  # int[2] stride=1
    if isinstance(value, (list, tuple)) and isinstance(default, (list, tuple)):
        return list(value) == list(default)
    return type(value) is type(default) and value == default


def _user_line(tb: Any) -> str:
    """Where in the model's code a traceback ends ('file:line in fn: code')."""
    where = "an unknown line"
    while tb is not None:
        code = tb.tb_frame.f_code
        if not (code.co_filename.startswith((_TORCH_DIR, _OWN_DIR)) or code.co_filename.startswith("<")):
            source = linecache.getline(code.co_filename, tb.tb_lineno).strip()
            where = f"{code.co_filename}:{tb.tb_lineno} in {code.co_name}: {source}"
        tb = tb.tb_next
    return where


def _frame_text(code: Any, line: int) -> str:
    """A frame as a traceback prints it, or "" for a frame torch.export's stack traces leave out:
    they keep the ``forward`` methods only (the chain of modules down to the op)."""
    if code.co_name != "forward" or code.co_filename.startswith(_OWN_DIR):
        return ""
    source = linecache.getline(code.co_filename, line).strip()
    return f'  File "{code.co_filename}", line {line}, in forward\n    {source}\n'


def _ints(v: Any, n: int) -> list[int]:
    return [v] * n if isinstance(v, int) else list(v)


def _linear(input: Any, weight: Any, bias: Any = None) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    return torch.ops.aten.linear.default, (input, weight, bias), {}


def _sdpa(
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    kwargs: dict[str, Any] = {}
    if scale is not None:
        kwargs["scale"] = scale
    if enable_gqa:
        kwargs["enable_gqa"] = True
    args = (query, key, value, attn_mask, dropout_p, is_causal)
    return torch.ops.aten.scaled_dot_product_attention.default, args, kwargs


def _layer_norm(
    input: Any, normalized_shape: Any, weight: Any = None, bias: Any = None, eps: float = 1e-5
) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    args = (input, list(normalized_shape), weight, bias, eps)
    return torch.ops.aten.layer_norm.default, args, {}


def _conv(n: int) -> Any:
    packet = getattr(torch.ops.aten, f"conv{n}d")

    def conv(
        input: Any,
        weight: Any,
        bias: Any = None,
        stride: Any = 1,
        padding: Any = 0,
        dilation: Any = 1,
        groups: int = 1,
    ) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
        args: tuple[Any, ...]
        if isinstance(padding, str):
            args = (input, weight, bias, _ints(stride, n), padding, _ints(dilation, n), groups)
            return packet.padding, args, {}
        args = (input, weight, bias, _ints(stride, n), _ints(padding, n), _ints(dilation, n), groups)
        return packet.default, args, {}

    return conv


def _batch_norm(
    input: Any,
    running_mean: Any,
    running_var: Any,
    weight: Any = None,
    bias: Any = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> tuple[Any, tuple[Any, ...], dict[str, Any]] | None:
    if training:
        return None  # it updates the running statistics: recorded op by op, where that is refused
    args = (input, weight, bias, running_mean, running_var, False, momentum, eps, True)
    return torch.ops.aten.batch_norm.default, args, {}


def _max_pool2d(
    input: Any,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    dilation: Any = 1,
    ceil_mode: bool = False,
    return_indices: bool = False,
) -> tuple[Any, tuple[Any, ...], dict[str, Any]] | None:
    if return_indices:
        return None
    stride = _ints(stride, 2) if stride not in ((), None, []) else []
    args = (input, _ints(kernel_size, 2), stride, _ints(padding, 2), _ints(dilation, 2), ceil_mode)
    return torch.ops.aten.max_pool2d.default, args, {}


def _adaptive_avg_pool2d(input: Any, output_size: Any) -> tuple[Any, tuple[Any, ...], dict[str, Any]] | None:
    size = _ints(output_size, 2)
    if any(d is None for d in size):
        return None
    return torch.ops.aten.adaptive_avg_pool2d.default, (input, size), {}


def _flatten(
    input: Any, start_dim: int = 0, end_dim: int = -1
) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    return torch.ops.aten.flatten.using_ints, (input, start_dim, end_dim), {}


def _matmul(input: Any, other: Any) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    return torch.ops.aten.matmul.default, (input, other), {}


def _softmax(op: Any) -> Any:
    def softmax(
        input: Any, dim: int | None = None, _stacklevel: int = 3, dtype: Any = None
    ) -> tuple[Any, tuple[Any, ...], dict[str, Any]] | None:
        if dim is None:
            return None  # torch's implicit-dim rule: recorded op by op
        return op, (input, dim) if dtype is None else (input, dim, dtype), {}

    return softmax


def _softmax_method(op: Any) -> Any:
    def softmax(input: Any, dim: int, dtype: Any = None) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
        return op, (input, dim) if dtype is None else (input, dim, dtype), {}

    return softmax


def _addr(
    input: Any, vec1: Any, vec2: Any, *, beta: Any = 1, alpha: Any = 1
) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    kwargs = {k: v for k, v in (("beta", beta), ("alpha", alpha)) if v != 1}
    return torch.ops.aten.addr.default, (input, vec1, vec2), kwargs


def _tensor_split(input: Any, indices_or_sections: Any, dim: int = 0) -> None:
    if isinstance(indices_or_sections, torch.Tensor):
        # its C++ reads the tensor's values with no aten op the recorder would see
        raise TraceRefused(
            "tensor_split reads a tensor's value into Python (its tensor of indices): the trace would "
            "fix the pieces' sizes"
        )
    return None


def _inner(input: Any, other: Any) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    return torch.ops.aten.inner.default, (input, other), {}


def _dropout(
    input: Any, p: float = 0.5, training: bool = True, inplace: bool = False
) -> tuple[Any, tuple[Any, ...], dict[str, Any]] | None:
    if training or inplace:
        return None  # random, or a write: recorded op by op
    return torch.ops.aten.dropout.default, (input, p, False), {}


def _cell(op: Any) -> Any:
    def cell(
        input: Any, hx: Any, w_ih: Any, w_hh: Any, b_ih: Any = None, b_hh: Any = None
    ) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
        return op, (input, list(hx) if isinstance(hx, (list, tuple)) else hx, w_ih, w_hh, b_ih, b_hh), {}

    return cell


# torch functions recorded as the one aten op torch.export keeps for them (its training IR), not as
# the ops they decompose into below autograd (linear -> t + addmm, sdpa -> its CPU kernel...): the same
# graph for the converters and the optimizer's fusions, and fewer nodes. Each maps the call's arguments
# to that op's, or None to record the call op by op.
_KEPT: dict[Any, Any] = {
    torch.nn.functional.linear: _linear,
    torch.nn.functional.scaled_dot_product_attention: _sdpa,
    torch.nn.functional.layer_norm: _layer_norm,
    torch.nn.functional.batch_norm: _batch_norm,
    torch.conv1d: _conv(1),
    torch.conv2d: _conv(2),
    torch.conv3d: _conv(3),
    torch.nn.functional.max_pool2d: _max_pool2d,
    torch.nn.functional.adaptive_avg_pool2d: _adaptive_avg_pool2d,
    torch.flatten: _flatten,
    torch.Tensor.flatten: _flatten,
    torch.matmul: _matmul,
    torch.Tensor.matmul: _matmul,
    torch.Tensor.__matmul__: _matmul,
    torch.nn.functional.softmax: _softmax(torch.ops.aten.softmax.int),
    torch.nn.functional.log_softmax: _softmax(torch.ops.aten.log_softmax.int),
    torch.softmax: _softmax_method(torch.ops.aten.softmax.int),
    torch.Tensor.softmax: _softmax_method(torch.ops.aten.softmax.int),
    torch.log_softmax: _softmax_method(torch.ops.aten.log_softmax.int),
    torch.Tensor.log_softmax: _softmax_method(torch.ops.aten.log_softmax.int),
    torch.inner: _inner,
    torch.Tensor.inner: _inner,
    torch.nn.functional.dropout: _dropout,
    torch.addr: _addr,
    torch.Tensor.addr: _addr,
    torch.tensor_split: _tensor_split,
    torch.Tensor.tensor_split: _tensor_split,
    # nn.LSTMCell / GRUCell / RNNCell (torch._VF's are these)
    torch.lstm_cell: _cell(torch.ops.aten.lstm_cell.default),
    torch.gru_cell: _cell(torch.ops.aten.gru_cell.default),
    torch.rnn_tanh_cell: _cell(torch.ops.aten.rnn_tanh_cell.default),
    torch.rnn_relu_cell: _cell(torch.ops.aten.rnn_relu_cell.default),
}


_SEE_THROUGH = {torch.nn.functional.multi_head_attention_forward}
"""Python functions of torch.nn.functional that reach the mode through their has_torch_function
prologue and call functions of ``_KEPT``: a mode's handler runs with the mode off, so without this their
linear / sdpa calls would be recorded decomposed (nn.MultiheadAttention: torchvision's ViT)."""


@contextmanager
def _prologue_skipped() -> Iterator[None]:
    """torch.nn.functional's ``has_torch_function`` answers False once: the prologue of the function
    called next, which would hand the call to the mode again (endlessly)."""
    module: Any = torch.nn.functional  # its has_torch_function is imported there, untyped for mypy
    original = module.has_torch_function

    def once(*args: Any) -> bool:
        module.has_torch_function = original
        return False

    module.has_torch_function = once
    try:
        yield
    finally:
        module.has_torch_function = original


class _KeptFunctions(TorchFunctionMode):
    """Records the functions of ``_KEPT`` as one node each; everything else goes on to the dispatch."""

    def __init__(self, recorder: _Recorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        mapping = _KEPT.get(func)
        recorder = self.recorder
        if func in _SEE_THROUGH and not recorder.inside:
            # its body calls linear and sdpa: run it with this mode active, as torch.export sees them
            with _prologue_skipped(), self:
                return func(*args, **kwargs)
        if mapping is None or recorder.inside:
            return func(*args, **kwargs)
        try:
            kept = mapping(*args, **kwargs)
        except TypeError:
            kept = None  # a call form the mapping does not know: recorded op by op
        if kept is None:
            return func(*args, **kwargs)
        op, op_args, op_kwargs = kept
        recorder.inside = True
        cache = recorder.meta_cache
        try:
            out = func(*args, **kwargs) if cache is None else cache.call(func, args, kwargs, op)
        finally:
            recorder.inside = False
        recorder.record(op, op_args, op_kwargs, out)
        return out


@contextmanager
def _module_stack(model: torch.nn.Module, recorder: _Recorder) -> Iterator[None]:
    """Forward pre / post hooks on every submodule keep ``recorder.stack`` as torch.export's
    nn_module_stack: {key: (path, qualified class)} from the root's children down; the n-th call
    (from 0) of a module called again has the key ``...@n``, as torch.export marks it (local functions
    tell calls apart by it)."""
    handles = []
    saved: list[dict[str, tuple[str, str]]] = []
    calls: dict[str, int] = {}

    def pre(key: str, entry: tuple[str, str], _m: Any, _a: Any) -> None:
        saved.append(recorder.stack)
        n = calls.get(key, 0)
        calls[key] = n + 1
        recorder.stack = {**recorder.stack, f"{key}@{n}" if n else key: entry}

    def post(_m: Any, _a: Any, _o: Any) -> None:
        recorder.stack = saved.pop()

    root = type(model)
    recorder.stack = {"L__self__": ("", f"{root.__module__}.{root.__qualname__}")}
    for path, module in model.named_modules():
        if not path:
            continue
        cls = type(module)
        entry = (path, f"{cls.__module__}.{cls.__qualname__}")
        # each module's own key and entry bound to the hook (the loop's variables change)
        handles.append(module.register_forward_pre_hook(functools.partial(pre, "L__self__" + path, entry)))
        handles.append(module.register_forward_hook(post, always_call=True))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


@contextmanager
def _as_under_export() -> Iterator[None]:
    """torch.compiler.is_compiling() / is_exporting() True, as torch.export sets them while tracing."""
    with as_under_export():
        yield


@contextmanager
def _value_reads_refused() -> Iterator[None]:
    """``tolist()``, ``numpy()`` and ``__array__`` read a tensor's memory without an aten op the
    recorder would see: on the tracing thread they refuse the trace (other threads are left alone)."""
    tracer = threading.get_ident()
    originals = {name: getattr(torch.Tensor, name) for name in ("tolist", "numpy", "__array__")}

    def guarded(name: str, original: Any) -> Any:
        def read(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() == tracer:
                raise TraceRefused(
                    f"the forward reads a tensor's values into Python with Tensor.{name}(): the trace "
                    "would fix what they decide"
                )
            return original(self, *args, **kwargs)

        return read

    for name, original in originals.items():
        setattr(torch.Tensor, name, guarded(name, original))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


def _input_names(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[str]:
    """Placeholder names of the flattened user inputs as torch.export gives them: the forward's
    parameter name, followed by the pytree path of a nested value (``past_key_values_0_key``)."""
    positional, var = forward_params(model)
    names = []
    for path, _ in pytree.tree_flatten_with_path((args, kwargs))[0]:
        first = path[1]
        if path[0].idx == 0:  # type: ignore[attr-defined]
            i = first.idx  # type: ignore[attr-defined]
            top = positional[i] if i < len(positional) else f"{var}_{i - len(positional)}"
        else:
            top = str(first.key)  # type: ignore[attr-defined]
        rest = [key_text(k) for k in path[2:]]
        names.append("_".join([top, *rest]))
    return names


def _placeholder(graph: torch.fx.Graph, name: str) -> torch.fx.Node:
    """A placeholder named ``name`` also where FX would rename it (``input`` -> ``input_1``: FX keeps
    its names off Python's builtins); torch.export names the forward's parameters as they are."""
    node = graph.placeholder(name)
    used = graph_used_names(graph)
    if node.name != name and name not in used:
        used.add(name)
        node.name = name
    return node


def trace_model(
    model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> torch.export.ExportedProgram:
    """Run ``model`` once on the real ``args`` / ``kwargs``, recording its aten ops (see the module's
    docstring); raises TraceRefused where the recording could differ from torch.export's capture."""
    graph = torch.fx.Graph()
    nodes: WeakIdKeyDictionary = WeakIdKeyDictionary()  # tensor -> the FX node that holds it now
    roots: dict[int, str] = {}  # id of a weight / input / constant tensor -> what it is
    weights = _weights(model, roots)
    _refuse_recurrent(model)
    arg_names = forward_names(model, len(args), kwargs)
    unsupported = unsupported_leaf(args, kwargs, arg_names)
    if unsupported is not None:
        raise TraceRefused(unsupported)
    flat_in, in_spec = pytree.tree_flatten((args, kwargs))
    # fresh containers around the same tensors: a forward that updates a cache object in place
    # (transformers' DynamicCache.update) leaves the caller's untouched
    fresh_args, fresh_kwargs = pytree.tree_unflatten(flat_in, in_spec)
    recorder = _recorder(
        model, graph, nodes, roots, weights, reachable_tensors(args, kwargs, arg_names), flat_in
    )
    weight_nodes = _weight_placeholders(graph, nodes, weights)
    user_nodes = _input_placeholders(graph, nodes, roots, _input_names(model, args, kwargs), flat_in)
    out = _run(model, recorder, fresh_args, fresh_kwargs)
    out_specs, out_spec = _record_outputs(graph, nodes, recorder, out)
    _move_constants(graph, recorder.constant_nodes, user_nodes)
    input_specs, state_dict, constants = _input_specs(model, weights, weight_nodes, recorder, user_nodes)
    signature = ExportGraphSignature(input_specs=input_specs, output_specs=out_specs)
    # forward_arg_names: the names ep.module() gives its forward, which run_decompositions (the
    # functionalization of prepare()) names the user inputs after, as for torch.export's program
    call = ModuleCallEntry(
        "",
        ModuleCallSignature(
            inputs=[],
            outputs=[],
            in_spec=in_spec,
            out_spec=out_spec,
            forward_arg_names=forward_names(model, len(args), kwargs),
        ),
    )
    root = torch.nn.Module()
    return TracedProgram(
        root,
        graph,
        signature,
        state_dict,
        {},
        [call],
        (args, kwargs),
        {**constants, **recorder.constants},
    )


def _weights(model: torch.nn.Module, roots: dict[int, str]) -> dict[int, tuple[str, InputKind, torch.Tensor]]:
    """The model's parameters and buffers by id (a shared one once, by its first name), each also a
    root in ``roots`` (with the tensor it views), so that writes into them are refused."""
    weights: dict[int, tuple[str, InputKind, torch.Tensor]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        weights.setdefault(id(p), (name, InputKind.PARAMETER, p))
    for name, b in model.named_buffers(remove_duplicate=False):
        weights.setdefault(id(b), (name, InputKind.BUFFER, b))
    for name, _kind, t in weights.values():
        if type(t) not in (torch.Tensor, torch.nn.Parameter):
            raise TraceRefused(f"weight {name!r} is a {type(t).__name__}")
        roots[id(t)] = f"the weight {name!r}"
        if (base := view_base(t)) is not None:
            roots.setdefault(id(base), f"the weight {name!r}")
    return weights


def _refuse_recurrent(model: torch.nn.Module) -> None:
    """A recurrent layer is refused: the trace would fix its sequence length."""
    recurrent = next((type(m).__name__ for m in model.modules() if isinstance(m, torch.nn.RNNBase)), None)
    if recurrent is not None:
        raise TraceRefused(
            f"the model holds a {recurrent}: torch.export keeps it one recurrent op over any sequence "
            "length, the trace would unroll it to the example's"
        )


def _recorder(
    model: torch.nn.Module,
    graph: torch.fx.Graph,
    nodes: WeakIdKeyDictionary,
    roots: dict[int, str],
    weights: dict[int, tuple[str, InputKind, torch.Tensor]],
    input_memory: dict[int, str],
    flat_in: list[Any],
) -> _Recorder:
    """The recorder for ``model``: what it needs to refuse reads and writes of the inputs' memory,
    to name constants after module attributes and to start stack traces at the model's forward."""
    recorder = _Recorder(graph, nodes, roots)
    recorder.input_memory = input_memory
    recorder.meta_cache = meta_cache_for([t for _, _, t in weights.values()], flat_in)
    for path, module in model.named_modules():
        for attr, value in vars(module).items():
            if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
                recorder.attributes.setdefault(id(value), f"{path}.{attr}" if path else attr)
    forward = inspect.unwrap(type(model).forward)
    recorder.root_code = getattr(forward, "__code__", None)
    return recorder


def _weight_placeholders(
    graph: torch.fx.Graph, nodes: WeakIdKeyDictionary, weights: dict[int, tuple[str, InputKind, torch.Tensor]]
) -> dict[int, torch.fx.Node]:
    """A placeholder per weight, all of them, read or not: torch.export's order and signature."""
    weight_nodes: dict[int, torch.fx.Node] = {}
    for key, (name, kind, t) in weights.items():
        prefix = "p_" if kind == InputKind.PARAMETER else "b_"
        node = graph.placeholder(prefix + re.sub(r"[^a-zA-Z0-9]", "_", name).lower())
        node.meta["val"] = _meta_like(t)
        nodes[t] = node
        weight_nodes[key] = node
    return weight_nodes


def _input_placeholders(
    graph: torch.fx.Graph,
    nodes: WeakIdKeyDictionary,
    roots: dict[int, str],
    names: list[str],
    flat_in: list[Any],
) -> list[torch.fx.Node]:
    """A placeholder per flattened user input, a tensor one also a root in ``roots``."""
    user_nodes = []
    for name, value in zip(names, flat_in):
        node = _placeholder(graph, name)
        if isinstance(value, torch.Tensor):
            if type(value) is not torch.Tensor:
                raise TraceRefused(f"input {name} is a {type(value).__name__} (a tensor subclass)")
            node.meta["val"] = _meta_like(value)
            roots[id(value)] = f"the user input {name!r}"
            if (base := view_base(value)) is not None:
                # writes through views of the input have that base as theirs (the caller's tensor)
                roots.setdefault(id(base), f"the user input {name!r}")
            nodes[value] = node
        else:
            node.meta["val"] = value
        user_nodes.append(node)
    return user_nodes


def _run(model: torch.nn.Module, recorder: _Recorder, args: Any, kwargs: Any) -> Any:
    """The forward run under the recorder, as under torch.export; what goes wrong is a TraceRefused
    naming the user's line."""
    try:
        with (
            torch.no_grad(),
            _as_under_export(),
            _value_reads_refused(),
            _module_stack(model, recorder),
            recorder,
            _KeptFunctions(recorder),
        ):
            return model(*args, **kwargs)
    except TraceRefused as e:
        raise TraceRefused(f"{e}; at {_user_line(e.__traceback__)}") from None
    except Exception as e:  # whatever the recorder did not understand: torch.export gets the model
        hop = re.search(r"HigherOrderOperator (\w+)", str(e))
        if hop is not None:
            # torch's message for a higher-order op under a dispatch mode tells how to write a mode
            raise TraceRefused(
                f"the forward calls the higher-order op {hop.group(1)} (torch.cond, while_loop...): "
                f"torch.export captures its subgraphs, the recorder does not; at {_user_line(e.__traceback__)}"
            ) from e
        raise TraceRefused(f"tracing raised {type(e).__name__}: {e}; at {_user_line(e.__traceback__)}") from e


def _record_outputs(
    graph: torch.fx.Graph, nodes: WeakIdKeyDictionary, recorder: _Recorder, out: Any
) -> tuple[list[OutputSpec], pytree.TreeSpec]:
    """The forward's flattened outputs as the graph's output node (then dead nodes removed, as
    torch.export removes them); returns their specs and the outputs' tree spec."""
    flat_out, out_spec = pytree.tree_flatten(out)
    outputs: list[Any] = []
    out_specs = []
    for o in flat_out:
        if isinstance(o, torch.Tensor):
            node = nodes.get(o)  # type: ignore[no-untyped-call]
            if node is None:
                node = recorder._constant(o)
            outputs.append(node)
            out_specs.append(OutputSpec(OutputKind.USER_OUTPUT, TensorArgument(node.name), None))
        else:
            outputs.append(o)
            out_specs.append(OutputSpec(OutputKind.USER_OUTPUT, ConstantArgument("", o), None))
    graph.output(tuple(outputs))
    graph.eliminate_dead_code()
    return out_specs, out_spec


def _move_constants(
    graph: torch.fx.Graph, constant_nodes: list[torch.fx.Node], user_nodes: list[torch.fx.Node]
) -> None:
    """The constants' placeholders, appended while tracing, moved after the weights' (torch.export's
    order)."""
    anchor = next(n for n in graph.nodes if n.op != "placeholder" or n in user_nodes)
    for c in constant_nodes:
        anchor.prepend(c)


def _input_specs(
    model: torch.nn.Module,
    weights: dict[int, tuple[str, InputKind, torch.Tensor]],
    weight_nodes: dict[int, torch.fx.Node],
    recorder: _Recorder,
    user_nodes: list[torch.fx.Node],
) -> tuple[list[InputSpec], dict[str, torch.Tensor], dict[str, Any]]:
    """The program's input specs (weights, constants, user inputs), its state dict and the weights
    it keeps as constants."""
    state_dict: dict[str, torch.Tensor] = {}
    constants: dict[str, Any] = {}
    transient = _non_persistent_buffers(model)
    input_specs = []
    for key, (name, kind, t) in weights.items():
        persistent = None if kind == InputKind.PARAMETER else name not in transient
        # as torch.export keeps them: a non-persistent buffer is a constant of the program
        (constants if persistent is False else state_dict)[name] = t
        input_specs.append(InputSpec(kind, TensorArgument(weight_nodes[key].name), name, persistent))
    for c in recorder.constant_nodes:
        target = c.meta.pop("constant_target")
        input_specs.append(InputSpec(InputKind.CONSTANT_TENSOR, TensorArgument(c.name), target, None))
    for node in user_nodes:
        arg = (
            TensorArgument(node.name)
            if isinstance(node.meta["val"], torch.Tensor)
            else ConstantArgument(node.name, node.meta["val"])
        )
        input_specs.append(InputSpec(InputKind.USER_INPUT, arg, None, None))
    return input_specs, state_dict, constants


def _non_persistent_buffers(model: torch.nn.Module) -> set[str]:
    return {
        f"{path}.{name}" if path else name
        for path, module in model.named_modules(remove_duplicate=False)
        for name in non_persistent_buffer_names(module)
    }
