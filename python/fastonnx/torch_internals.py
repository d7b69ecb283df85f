"""The one door to torch's internals: every private torch module, function or attribute fastonnx uses.

Each name below says what it relies on in torch and what fastonnx uses it for, so that a torch
upgrade that moves an internal breaks here (and in ``tests/test_torch_internals.py``, which exercises
every name against the installed torch) instead of somewhere deep in a capture. The rest of the
package imports these names and never spells ``torch._...``, ``torch.utils._pytree`` or a private
attribute of a torch object itself (the same test checks the sources).

Only torch and the standard library are imported here, and at import time only modules that
``import torch`` has loaded already; the costly ones (``torch._dynamo``, ``symbolic_shapes`` and
sympy, ``torch.onnx._internal``) are imported inside the functions that need them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import FrameType
from typing import Any

import torch
import torch.fx.experimental._config as _fx_config
import torch.utils._pytree as pytree
from torch._guards import SLoc
from torch._ops import HigherOrderOperator, OpOverload, OpOverloadPacket
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, unset_fake_temporarily
from torch.export.dynamic_shapes import _DerivedDim as DerivedDim
from torch.export.dynamic_shapes import _DimHint as DimHint
from torch.export.dynamic_shapes import _DimHintType as DimHintType
from torch.fx._lazy_graph_module import _LazyGraphModule as LazyGraphModule
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass

__all__ = [
    "DerivedDim",
    "DimHint",
    "DimHintType",
    "DispatchModeWithoutDynamo",
    "DropoutNd",
    "FakeTensor",
    "FakeTensorMode",
    "HigherOrderOperator",
    "LazyGraphModule",
    "NormBase",
    "OpOverload",
    "OpOverloadPacket",
    "SLoc",
    "TensorType",
    "TorchDispatchMode",
    "VARIABLE_FUNCTIONS",
    "aot_autograd",
    "as_under_export",
    "backed_size_oblivious",
    "backed_values",
    "check_size",
    "compiling_state",
    "core_aten_decompositions",
    "dynamo_backend_registered",
    "fake_mode_with_shape_env",
    "graph_used_names",
    "guard_namespace",
    "has_composite_implicit_kernel",
    "has_schema",
    "is_traceable_wrapper_subclass",
    "mark_boxed_call",
    "module_buffers",
    "module_parameters",
    "no_dispatch",
    "non_persistent_buffer_names",
    "onnx_exporting",
    "op_name",
    "op_overload_name",
    "op_schema",
    "pytree",
    "register_dynamo_backend",
    "rename_node",
    "set_graph_module",
    "set_plain_codegen",
    "scan",
    "shape_env_of_symint",
    "symint_expr",
    "symint_hint",
    "input_guards",
    "storage_id",
    "swap_child_modules",
    "sympy_python",
    "unset_fake_temporarily",
    "user_guard_locations",
    "value_ranges",
    "vf_module",
    "view_base",
]

# ---- re-exported names (isinstance checks, annotations, base classes) --------------------------------
# pytree: torch.utils._pytree (semi-public; torch.export's own flattening of inputs and outputs).
# OpOverload / OpOverloadPacket / HigherOrderOperator: torch._ops, the types of FX call targets.
# FakeTensor / FakeTensorMode / unset_fake_temporarily: torch._subclasses.fake_tensor (tensors without
#   data in torch.export's programs; the fake prefill of pretrained/task_inputs.py; the compile backend
#   building real constants under aot_autograd's fake mode).
# TorchDispatchMode / is_traceable_wrapper_subclass: torch.utils._python_dispatch (the trace's recorder;
#   tensor-subclass weights such as torchao's).
# DimHint / DimHintType / DerivedDim: torch.export.dynamic_shapes' private _DimHint (Dim.AUTO /
#   Dim.DYNAMIC, since torch 2.6), _DimHintType and _DerivedDim (2 * Dim("n")).
# LazyGraphModule: torch.fx._lazy_graph_module._LazyGraphModule, the GraphModule whose code is
#   generated on first call (the trace's program: no codegen for a graph that is only walked).
# SLoc: torch._guards.SLoc, the source location each ShapeGuard keeps (a frozen dataclass).

TensorType = torch._C.TensorType
"""``torch._C.TensorType``: the schema type of a plain Tensor return (meta_cache.py caches ops whose
returns are all tensors)."""

DropoutNd = torch.nn.modules.dropout._DropoutNd
"""``torch.nn.modules.dropout._DropoutNd``: the base of nn.Dropout and its kin (a training dropout
sends capture="auto" to torch.export)."""

NormBase = torch.nn.modules.batchnorm._NormBase
"""``torch.nn.modules.batchnorm._NormBase``: the base of the batch and instance norms (training ones
send capture="auto" to torch.export)."""

VARIABLE_FUNCTIONS: Any = torch._C._VariableFunctions
"""``torch._C._VariableFunctions``: the C functions ``torch._VF`` falls through to (lstm, gru...),
looked up on the C class so that a patched ``torch._VF`` never recurses into itself (capture/rnn_custom_ops.py)."""


class DispatchModeWithoutDynamo(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch's hook is untyped
    """A TorchDispatchMode whose ``__torch_dispatch__`` torch does not wrap in ``torch._dynamo.disable``.

    Relies on the private classmethod ``TorchDispatchMode._should_skip_dynamo`` (torch 2.6+), which
    torch consults before wrapping: the wrapper's first call imports torch._dynamo, ~1 s of a fresh
    process, for a mode (the trace's recorder) that never runs under torch.compile."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False


# ---- operators ----------------------------------------------------------------------------------------


def op_schema(op: Any) -> Any:
    """``op._schema`` (a ``torch.FunctionSchema``) of an OpOverload: its arguments, defaults, alias info and
    returns (the trace's defaults and writes, the aliasing walker's bound arguments, the meta cache)."""
    return op._schema


def op_name(op: OpOverload) -> str:
    """``OpOverload._opname``: the packet's bare name (``"add"`` for ``aten.add.Tensor``), which the trace
    gives the node as torch.export does."""
    name: str = op._opname
    return name


def op_overload_name(op: OpOverload) -> str:
    """``OpOverload._overloadname``: ``"default"``, ``"Tensor"``... (the metadata's qualified target)."""
    name: str = op._overloadname
    return name


def has_schema(qualified: str, overload: str) -> bool:
    """Whether torch knows the op ``ns::name`` with ``overload`` (``""`` for default), through
    ``torch._C._get_schema`` (the registry checks its families' names against torch's table)."""
    try:
        torch._C._get_schema(qualified, overload)
    except RuntimeError:
        return False
    return True


def has_composite_implicit_kernel(qualified: str) -> bool:
    """Whether the op ``ns::name[.overload]`` has a CompositeImplicitAutograd kernel, through
    ``torch._C._dispatch_has_kernel_for_dispatch_key`` (such ops the trace records decomposed); raises
    RuntimeError for an op not (yet) registered."""
    return bool(torch._C._dispatch_has_kernel_for_dispatch_key(qualified, "CompositeImplicitAutograd"))


def no_dispatch() -> contextlib.AbstractContextManager[Any]:
    """``torch._C._DisableTorchDispatch()``: tensors made inside skip the active dispatch modes (the
    trace's meta tensors and cached outputs, made outside its recorder)."""
    manager: contextlib.AbstractContextManager[Any] = torch._C._DisableTorchDispatch()
    return manager


def vf_module() -> Any:
    """``torch._VF``: the module object nn.LSTM / GRU / RNN call; setting an attribute shadows the C
    function, deleting it restores it (capture/rnn_custom_ops.py routes them to fastonnx's custom ops)."""
    return torch._VF


# ---- tensors and modules -----------------------------------------------------------------------------


def storage_id(t: torch.Tensor) -> int:
    """``t.untyped_storage()._cdata``: the storage object's address, the same for every view of it (a
    meta storage has no data pointer)."""
    return int(t.untyped_storage()._cdata)


def view_base(t: torch.Tensor) -> torch.Tensor | None:
    """``Tensor._base``: the tensor ``t`` is a view of, or None."""
    return t._base


def module_buffers(module: torch.nn.Module) -> dict[str, torch.Tensor | None]:
    """``nn.Module._buffers``, the live dict (read and written: buffers moved to the meta device, or put
    back after a forward replaced them)."""
    return module._buffers


def module_parameters(module: torch.nn.Module) -> dict[str, torch.nn.Parameter | None]:
    """``nn.Module._parameters``, the live dict (parameters swapped without ``register_parameter``)."""
    return module._parameters


def non_persistent_buffer_names(module: torch.nn.Module) -> set[str]:
    """``nn.Module._non_persistent_buffers_set``: the module's own buffers left out of its state dict."""
    return module._non_persistent_buffers_set


def swap_child_modules(module: torch.nn.Module, children: dict[str, Any]) -> dict[str, Any]:
    """``module._modules`` replaced by ``children``; returns the dict it held. A ModuleList indexes,
    iterates and takes its len() from that dict (stamping exports a stack of fewer layers)."""
    kept: dict[str, Any] = module._modules
    module._modules = children
    return kept


# ---- FX graphs ---------------------------------------------------------------------------------------


def graph_used_names(graph: torch.fx.Graph) -> set[str]:
    """``Graph._graph_namespace._used_names``: the live set of the names the graph has handed out."""
    used: set[str] = graph._graph_namespace._used_names
    return used


def rename_node(node: torch.fx.Node, name: str) -> None:
    """``Node._rename(name)``: the node named ``name`` through its graph's namespace (suffixed where the
    name is handed out already)."""
    node._rename(name)


def set_graph_module(program: torch.export.ExportedProgram, graph_module: torch.fx.GraphModule) -> None:
    """``ExportedProgram._graph_module`` replaced (what ``program.graph_module`` returns): a program built
    around a graph module torch's constructor did not make (the trace's lazy one)."""
    program._graph_module = graph_module


def set_plain_codegen(graph: torch.fx.Graph) -> None:
    """``graph._codegen`` set to a plain ``torch.fx.graph.CodeGen()`` (the trace's graph: no pytree
    codegen of its own)."""
    graph._codegen = torch.fx.graph.CodeGen()


# ---- flags and configuration ------------------------------------------------------------------------


@contextlib.contextmanager
def as_under_export() -> Iterator[None]:
    """``torch.compiler._is_compiling_flag`` and ``_is_exporting_flag`` True inside, as torch.export sets
    them while tracing (``torch.compiler.is_compiling()`` / ``is_exporting()`` read them)."""
    compiling, exporting = torch.compiler._is_compiling_flag, torch.compiler._is_exporting_flag
    torch.compiler._is_compiling_flag = torch.compiler._is_exporting_flag = True
    try:
        yield
    finally:
        torch.compiler._is_compiling_flag, torch.compiler._is_exporting_flag = compiling, exporting


def compiling_state() -> contextlib.AbstractContextManager[Any]:
    """``torch._export.utils._compiling_state_context()``: torch's compiling flags set, as torch.export
    sets them; a null context where this torch lacks it."""
    try:
        from torch._export.utils import _compiling_state_context
    except ImportError:
        return contextlib.nullcontext()
    manager: contextlib.AbstractContextManager[Any] = _compiling_state_context()
    return manager


def backed_size_oblivious() -> contextlib.AbstractContextManager[Any]:
    """``torch.fx.experimental._config.patch(backed_size_oblivious=True)``: size-oblivious reasoning
    for backed sizes (a dynamic dim whose example size is 0 or 1 stays symbolic)."""
    # patch() is added at import by torch's install_config_module, which mypy cannot see
    manager: contextlib.AbstractContextManager[Any] = _fx_config.patch(backed_size_oblivious=True)  # type: ignore[attr-defined]
    return manager


@contextlib.contextmanager
def onnx_exporting() -> Iterator[None]:
    """``torch.onnx._internal.exporter._flags._is_onnx_exporting`` True inside, so that
    ``torch.onnx.is_in_onnx_export()`` is True as under torch's exporters; nothing where this torch
    lacks the module."""
    try:
        from torch.onnx._internal.exporter import _flags
    except ImportError:
        yield
        return
    before = getattr(_flags, "_is_onnx_exporting", False)
    _flags._is_onnx_exporting = True
    try:
        yield
    finally:
        _flags._is_onnx_exporting = before


# ---- symbolic shapes ---------------------------------------------------------------------------------


def shape_env_of_symint(d: torch.SymInt) -> Any:
    """``SymInt.node.shape_env``: the ShapeEnv a symbolic size belongs to."""
    return d.node.shape_env


def symint_expr(d: torch.SymInt) -> Any:
    """``SymInt.node.expr``: the sympy expression of a symbolic size over the ShapeEnv's symbols
    (``s0``, ``2*s0 + 1``; a number when torch specialised it)."""
    return d.node.expr


def symint_hint(d: torch.SymInt) -> int | None:
    """``SymInt.node.hint``: the example value torch traced a symbolic size with (None for an
    unbacked size)."""
    hint = d.node.hint
    return None if hint is None else int(hint)


def input_guards(env: Any) -> list[tuple[Any, str]]:
    """``ShapeEnv.guards``, each as ``(expr, where)``: the guard's sympy boolean with the ShapeEnv's
    replacements applied (``ShapeEnv.replace``: a symbol torch found equal to another expression
    written as that expression), and where it was made (``guard.sloc``: its ``SLoc``'s user line,
    else torch's own frame)."""
    return [(env.replace(g.expr), g.sloc.maybe_user_loc or str(g.sloc)) for g in env.guards]


def scan(combine: Callable[[Any, Any], tuple[Any, Any]], init: Any, xs: Any) -> tuple[Any, Any]:
    """``torch._higher_order_ops.scan.scan(combine, init, xs)``: ``combine(carry, x) -> (carry, y)`` over
    dim 0 of ``xs``; torch.export captures it as ``torch.ops.higher_order.scan`` whatever the trip count
    (converters/control_flow.py writes an ONNX ``Scan``). Returns the last carry and the stacked ``y``."""
    from torch._higher_order_ops.scan import scan as torch_scan

    return torch_scan(combine, init, xs)


def check_size(condition: Any) -> None:
    """``torch._check(condition)``: a size fact told to the capture (kept as a range or a runtime
    assert), where a swapped form states what the model declares (a length at most one chunk)."""
    torch._check(condition)


def backed_values(env: Any) -> Mapping[Any, Any]:
    """``ShapeEnv.backed_var_to_val``: each backed symbol's example value (torch 2.10+; before,
    ``var_to_val``)."""
    values: Mapping[Any, Any] = env.backed_var_to_val
    return values


def value_ranges(env: Any) -> Mapping[Any, Any]:
    """``ShapeEnv.var_to_range``: each symbol's ``ValueRanges`` (``.lower``, ``.upper``; sympy ints,
    ``int_oo`` unbounded)."""
    ranges: Mapping[Any, Any] = env.var_to_range
    return ranges


def guard_namespace() -> Mapping[str, Any]:
    """``torch.fx.experimental.symbolic_shapes.SYMPY_INTERP``: the names torch's printed guards call
    (``FloorDiv``, ``Mod``...), the namespace guards are evaluated in."""
    from torch.fx.experimental.symbolic_shapes import SYMPY_INTERP

    namespace: Mapping[str, Any] = SYMPY_INTERP
    return namespace


def sympy_python(expr: Any) -> str:
    """A sympy expression printed as Python by ``torch.utils._sympy.printers.PythonPrinter`` (``//`` for
    FloorDiv, ``%`` for Mod, ``max`` / ``min``), as torch prints its guards."""
    from torch.utils._sympy.printers import PythonPrinter

    return str(PythonPrinter().doprint(expr))


@contextlib.contextmanager
def user_guard_locations(user_line: Callable[[FrameType | None], str | None]) -> Iterator[None]:
    """Inside the block, every guard's ``SLoc`` whose ``maybe_user_loc`` is None gets
    ``user_line(frame)`` there, ``frame`` being the caller of ``ShapeEnv._get_sloc``. Relies on the
    private method ``ShapeEnv._get_sloc(framework_loc)`` making the ``SLoc`` each guard keeps, and on
    ``SLoc`` being a frozen dataclass with ``maybe_user_loc`` (None under non-strict export, which has
    no dynamo frames). Process-wide: patches the class."""
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    original = ShapeEnv._get_sloc

    def located(self: ShapeEnv, framework_loc: str | None = None) -> SLoc:
        sloc = original(self, framework_loc)
        if sloc.maybe_user_loc is None:
            line = user_line(sys._getframe(1))
            if line is not None:
                sloc = dataclasses.replace(sloc, maybe_user_loc=line)
        return sloc

    ShapeEnv._get_sloc = located  # type: ignore[method-assign]
    try:
        yield
    finally:
        ShapeEnv._get_sloc = original  # type: ignore[method-assign]


def fake_mode_with_shape_env() -> FakeTensorMode:
    """A ``FakeTensorMode`` over a fresh ``ShapeEnv`` (torch.fx.experimental.symbolic_shapes) that takes
    real tensors too (``allow_non_fake_inputs``): a model run without data."""
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    return FakeTensorMode(shape_env=ShapeEnv(), allow_non_fake_inputs=True)


# ---- torch.compile -----------------------------------------------------------------------------------


def aot_autograd(**kwargs: Any) -> Callable[[torch.fx.GraphModule, Sequence[Any]], Callable[..., Any]]:
    """``torch._dynamo.backends.common.aot_autograd(**kwargs)``: a dynamo backend from aten-graph
    compilers (the compile backend's)."""
    from torch._dynamo.backends.common import aot_autograd as make

    backend: Callable[[torch.fx.GraphModule, Sequence[Any]], Callable[..., Any]] = make(**kwargs)
    return backend


def core_aten_decompositions() -> Mapping[Any, Callable[..., Any]]:
    """``torch._decomp.core_aten_decompositions()``: torch's table down to the core aten op set."""
    from torch._decomp import core_aten_decompositions as table

    return table()


def mark_boxed_call(fn: Callable[..., Any]) -> None:
    """``fn._boxed_call = True``: aot_autograd's mark of a compiled function taking its inputs as one
    list it may clear (the boxed calling convention)."""
    fn._boxed_call = True  # type: ignore[attr-defined]


def dynamo_backend_registered(name: str) -> bool:
    """Whether dynamo's registry (``torch._dynamo.backends.registry._COMPILER_FNS``) holds a backend
    ``name`` already."""
    from torch._dynamo.backends.registry import _COMPILER_FNS

    return name in _COMPILER_FNS


def register_dynamo_backend(fn: Callable[..., Any], name: str) -> None:
    """``torch._dynamo.backends.registry.register_backend``: ``backend=name`` works by name."""
    from torch._dynamo.backends.registry import register_backend

    register_backend(fn, name=name)
