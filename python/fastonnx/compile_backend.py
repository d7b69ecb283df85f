"""torch.compile backends: ``backend="fastonnx"`` runs each graph dynamo captures in onnxruntime,
``backend="fastonnx_debug"`` in onnx's reference evaluator.

Each graph goes through aot_autograd (functional aten ops; a forward and a backward graph when
gradients are needed), then ``graph_module_to_onnx`` (the walker ``to_onnx`` uses), then one runner per
graph. Decisions:

- Decompositions: in inference, torch's core ATen table minus the ops fastonnx converts itself (fused
  forms such as attention or layer norm stay whole, so onnxruntime runs them fused); in training, the
  core ATen table (it writes backward ops such as ``native_layer_norm_backward`` in primitives) except
  CPU flash attention, whose decomposition gives autograd a wrong logsumexp: it and its backward are
  converted whole. ``decompositions=`` replaces the table.
- Shapes: a dim dynamo marks dynamic (``mark_dynamic``, ``dynamic=True`` or its automatic second
  compile) is a SymInt in the graph and a dynamic dim in ONNX, so other sizes reuse the same session.
  Static graphs get one session each: dynamo compiles one graph per static shape signature.
- Fallback: a graph with an op that has no converter, or that fails to convert or to load in
  onnxruntime, runs in eager PyTorch (aot_autograd's aten graph), with one warning per op / problem;
  ``fallback=False`` raises instead. Tensors not on the CPU also fall back (the runners bind CPU memory).
- Memory: CPU inputs are handed to onnxruntime without a copy (DLPack; bool through numpy, which shares
  memory too) and outputs come back as torch tensors over onnxruntime's buffers (DLPack), through
  I/O binding. Non-contiguous inputs are made contiguous first (a copy).
"""

from __future__ import annotations

import operator
import os
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from fastonnx.errors import FastOnnxError, InputError, RuntimeCheckError, UnsupportedOpError
from fastonnx.pipeline.options import ExportOptions
from fastonnx.registry import Registry
from fastonnx.result import ExportResult
from fastonnx.torch_internals import (
    aot_autograd,
    core_aten_decompositions,
    dynamo_backend_registered,
    mark_boxed_call,
    register_dynamo_backend,
    symint_hint,
    unset_fake_temporarily,
)
from fastonnx.walker.graph_module import graph_module_to_onnx

if TYPE_CHECKING:
    import onnxruntime

BACKEND_NAMES = ("fastonnx", "fastonnx_debug")


class FallbackWarning(UserWarning):
    """A graph compiled by a fastonnx backend runs in eager PyTorch."""


@dataclass
class GraphStats:
    """What happened to one graph the backend was given."""

    name: str  # "graph_3_forward", "graph_3_backward", "graph_3_inference"
    fx_nodes: int
    onnx_nodes: int = 0
    convert_s: float = 0.0  # graph_module_to_onnx, optimization included
    session_s: float = 0.0  # building the onnxruntime session / reference evaluator
    fell_back: bool = False
    reason: str = ""  # why it fell back
    missing_ops: list[str] = field(default_factory=list)
    dynamic_inputs: int = 0  # tensor inputs with at least one symbolic dim
    path: str | None = None  # the dumped model, when dump_dir is set


class FastOnnxBackend:
    """A torch.compile backend: ``torch.compile(model, backend=fastonnx.backend(...))``.

    ``opset`` and ``optimize`` (False / "none", True / "default", "onnxruntime") are ``to_onnx``'s,
    checked as it checks them when the backend is made (``ExportOptions.from_keywords``, with
    ``decompositions`` and ``custom_converters``); ``providers`` are
    onnxruntime's (CPU by default), ``session_options`` too (threads...); ``dump_dir`` writes each graph's model there as ``<name>.onnx``;
    ``fallback`` (default True) runs graphs that cannot be converted in eager PyTorch with a warning,
    False raises. ``decompositions`` replaces the table aot_autograd decomposes with (see the module's
    docstring); ``custom_converters`` are ``to_onnx``'s. ``stats`` lists one ``GraphStats`` per graph
    compiled so far. ``debug=True`` runs the graphs in ``onnx.reference.ReferenceEvaluator`` instead,
    and with ``check=True`` also in eager torch, raising ``RuntimeCheckError`` naming the first graph
    whose outputs diverge.
    """

    def __init__(
        self,
        *,
        opset: int | None = None,
        optimize: bool | str = True,
        providers: Sequence[str] | None = None,
        session_options: onnxruntime.SessionOptions | None = None,
        dump_dir: str | os.PathLike[str] | None = None,
        fallback: bool = True,
        decompositions: dict[Any, Callable[..., Any]] | None = None,
        custom_converters: dict[Any, Callable[..., Any]] | None = None,
        debug: bool = False,
        check: bool = False,
        rtol: float = 1e-4,
        atol: float = 1e-5,
    ) -> None:
        # to_onnx's checks of its keywords, with its messages, before any graph is captured
        options = ExportOptions.from_keywords(
            opset=opset, optimize=optimize, custom_converters=custom_converters, decompositions=decompositions
        )
        if debug and options.level == "onnxruntime":
            raise InputError(
                "optimize='onnxruntime' emits onnxruntime's contrib ops, which the reference evaluator of "
                "the debug backend cannot run: use optimize=True or False"
            )
        if check and not debug:
            raise InputError("check=True compares the reference evaluator with torch: it needs debug=True")
        self.opset = opset
        self.optimize = optimize
        self.providers = list(providers) if providers is not None else ["CPUExecutionProvider"]
        self.session_options = session_options
        self.dump_dir = os.fspath(dump_dir) if dump_dir is not None else None
        self.fallback = fallback
        self.decompositions = decompositions
        self.debug = debug
        self.check = check
        self.rtol, self.atol = rtol, atol
        self.stats: list[GraphStats] = []
        self._graphs = 0
        self._warned: set[str] = set()
        self.custom_converters = custom_converters
        self._registry = Registry(custom_converters)

    # ---- the backend protocol -------------------------------------------------------------------
    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        """Called by dynamo with a torch-level graph; returns the callable dynamo runs instead."""
        # counted once aot_autograd returns: dynamo may restart its analysis from inside it
        index = self._graphs + 1
        training = torch.is_grad_enabled() and any(
            isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs
        )

        def compiler(kind: str) -> Callable[[torch.fx.GraphModule, Sequence[Any]], Callable[..., Any]]:
            # boxed: aot_autograd hands the inputs as one list it may free early
            return lambda g, inputs: _boxed(self.compile_graph(g, inputs, f"graph_{index}_{kind}"))

        table = self.decompositions if self.decompositions is not None else self._table(training)
        compiled = aot_autograd(
            fw_compiler=compiler("forward"),
            bw_compiler=compiler("backward"),
            inference_compiler=compiler("inference"),
            decompositions=table,
        )(gm, example_inputs)
        self._graphs = index
        return compiled

    def _table(self, training: bool) -> dict[Any, Callable[..., Any]]:
        table = dict(core_aten_decompositions())
        if training:
            # torch's decomposition of CPU flash attention returns the attention weights where the op
            # returns its logsumexp; autograd then feeds those to the fused backward, whose gradients
            # are wrong. Kept whole: fastonnx converts the op and its backward.
            table.pop(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default, None)
            return table
        return {op: fn for op, fn in table.items() if self._registry.lookup(op) is None}

    # ---- one aten graph -------------------------------------------------------------------------
    def compile_graph(
        self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], name: str
    ) -> Callable[..., Any]:
        """The runner of one aten graph (what aot_autograd hands its compilers), or ``gm`` itself
        (eager) when it falls back."""
        # aot_autograd calls its compilers under its fake mode: converters build real constants
        with unset_fake_temporarily():
            return self._compile_graph(gm, example_inputs, name)

    def _compile_graph(
        self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], name: str
    ) -> Callable[..., Any]:
        stats = GraphStats(name, len(gm.graph.nodes))
        self.stats.append(stats)
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        stats.dynamic_inputs = sum(
            1
            for n in placeholders
            if isinstance(v := n.meta.get("val"), torch.Tensor)
            and any(isinstance(d, torch.SymInt) for d in v.shape)
        )
        missing = sorted(
            {
                str(n.target)
                for n in gm.graph.nodes
                if n.op == "call_function"
                and n.target is not operator.getitem
                and self._registry.lookup(n.target) is None
            }
        )
        if missing:
            stats.missing_ops = missing
            return self._fall_back(
                gm,
                stats,
                f"no converter for {', '.join(missing)}",
                missing,
                UnsupportedOpError,
            )
        devices = {
            x.device.type for x in example_inputs if isinstance(x, torch.Tensor) and x.device.type != "cpu"
        }
        if devices:
            return self._fall_back(
                gm, stats, f"inputs on {', '.join(sorted(devices))} (runners bind CPU memory)", [], InputError
            )
        t0 = time.perf_counter()
        try:
            result = graph_module_to_onnx(
                gm,
                example_inputs,
                opset=self.opset,
                optimize=self.optimize,
                custom_converters=self.custom_converters,
            )
        except FastOnnxError as e:
            return self._fall_back(gm, stats, f"conversion failed: {e}", [], type(e), e)
        stats.convert_s = time.perf_counter() - t0
        stats.onnx_nodes = int(result.stats["nodes"])
        if self.dump_dir is not None:
            os.makedirs(self.dump_dir, exist_ok=True)
            stats.path = os.path.join(self.dump_dir, f"{name}.onnx")
            result.save(stats.path)
        t1 = time.perf_counter()
        try:
            runner: Callable[..., Any]
            if self.debug:
                runner = ReferenceRunner(
                    result, name, gm if self.check else None, self.rtol, self.atol, _memory_orders(gm)
                )
            else:
                runner = OrtRunner(result, name, self.providers, _memory_orders(gm), self.session_options)
        except RuntimeCheckError as e:
            return self._fall_back(gm, stats, str(e), [], RuntimeCheckError, e)
        stats.session_s = time.perf_counter() - t1
        return runner

    def _fall_back(
        self,
        gm: torch.fx.GraphModule,
        stats: GraphStats,
        reason: str,
        keys: list[str],
        error: type[Exception],
        cause: BaseException | None = None,
    ) -> Callable[..., Any]:
        stats.fell_back = True
        stats.reason = reason
        if not self.fallback:
            raise error(f"fastonnx backend: {stats.name}: {reason} (fallback=False)") from cause
        new = [k for k in (keys or [reason]) if k not in self._warned]
        if new:
            self._warned.update(new)
            warnings.warn(
                f"fastonnx backend: {stats.name} runs in eager PyTorch: {reason}",
                FallbackWarning,
                stacklevel=2,
            )
        return gm


class OrtRunner:
    """One onnxruntime session for one graph, called with aot_autograd's flat inputs."""

    def __init__(
        self,
        result: ExportResult,
        name: str,
        providers: Sequence[str],
        orders: list[list[int] | None],
        options: onnxruntime.SessionOptions | None = None,
    ) -> None:
        import onnxruntime

        self.name = name
        self._orders = orders
        self._layout = result._layout
        try:
            self.session: onnxruntime.InferenceSession = onnxruntime.InferenceSession(
                result.to_bytes(), options, providers=list(providers)
            )
        except Exception as e:
            raise RuntimeCheckError(f"onnxruntime could not load {name}: {e}") from e
        used = {i.name for i in self.session.get_inputs()}
        # (placeholder index, onnx name) of the tensor inputs the session reads
        self._inputs = [(i, s.onnx_name) for i, s in enumerate(self._layout.inputs) if s.onnx_name in used]
        self._outputs = [s.onnx_name for s in self._layout.outputs if s.onnx_name is not None]

    def __call__(self, *args: Any) -> list[Any]:
        import onnxruntime

        binding = self.session.io_binding()
        keep: list[torch.Tensor] = []  # the tensors the bound OrtValues read, alive until the run ends
        for i, onnx_name in self._inputs:
            t = args[i]
            if not isinstance(t, torch.Tensor):
                raise InputError(f"{self.name}: input {onnx_name} must be a tensor, got {type(t).__name__}")
            t = t.detach()
            if not t.is_contiguous():
                t = t.contiguous()
            keep.append(t)
            if t.dtype == torch.bool:
                value = onnxruntime.OrtValue.ortvalue_from_numpy(t.numpy())  # DLPack has no bool here
            else:
                value = onnxruntime.OrtValue.from_dlpack(t)
            binding.bind_ortvalue_input(onnx_name, value)
        for name in self._outputs:
            binding.bind_output(name, "cpu")
        try:
            self.session.run_with_iobinding(binding)
        except Exception as e:
            raise RuntimeCheckError(f"onnxruntime failed to run {self.name}: {e}") from e
        values = binding.get_outputs()
        return _unflatten(self._layout, [_to_torch(v) for v in values], self._orders)


def _boxed(fn: Callable[..., Any]) -> Callable[[list[Any]], Any]:
    """aot_autograd's boxed calling convention: the inputs as one list, which the callee clears so
    that tensors it no longer needs can be freed early."""

    def run(args: list[Any]) -> Any:
        flat = list(args)
        args.clear()
        return fn(*flat)

    mark_boxed_call(run)
    return run


def _to_torch(value: Any) -> torch.Tensor:
    if value.data_type() == "tensor(bool)":
        return torch.from_numpy(value.numpy())  # DLPack has no bool in this onnxruntime: one copy
    return torch.utils.dlpack.from_dlpack(value)


def _memory_orders(gm: torch.fx.GraphModule) -> list[list[int] | None]:
    """Per output of ``gm``: the order of its dims in memory (outermost first) when torch lays it out
    other than contiguously (attention outputs, channels-last...), None otherwise. ONNX values are
    contiguous; the graphs that read saved tensors were traced with torch's strides (a fallen-back
    backward's ``view`` / ``as_strided`` assume them), so such outputs are handed over in that layout,
    as inductor does. Read from the strides' example values, without adding guards."""
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    flat = output.args[0] if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
    orders: list[list[int] | None] = []
    for a in flat:
        val = a.meta.get("val") if isinstance(a, torch.fx.Node) else None
        if not isinstance(val, torch.Tensor) or val.dim() < 2:
            orders.append(None)
            continue
        strides = [_hint(st) for st in val.stride()]
        if any(st is None for st in strides):
            orders.append(None)
            continue
        # outermost first: larger stride, then (equal strides of size-1 dims) the original order
        order = sorted(range(val.dim()), key=lambda d: (-(strides[d] or 0), d))
        orders.append(None if order == list(range(val.dim())) else order)
    return orders


def _hint(x: Any) -> int | None:
    """An int, or a SymInt's example value read without a guard (int() would specialise it)."""
    if isinstance(x, torch.SymInt):
        return symint_hint(x)
    return int(x)


def _in_order(t: torch.Tensor, order: list[int] | None) -> torch.Tensor:
    if order is None or t.dim() != len(order):
        return t
    inverse = [0] * len(order)
    for i, d in enumerate(order):
        inverse[d] = i
    return t.permute(order).contiguous().permute(inverse)


def _unflatten(
    layout: Any, tensors: list[torch.Tensor], orders: list[list[int] | None] | None = None
) -> list[Any]:
    """The graph's outputs in order: tensors (in torch's memory layout when ``orders`` name one),
    SymInts as Python ints, constants as they were."""
    it = iter(tensors)
    out: list[Any] = []
    for k, slot in enumerate(layout.outputs):
        if slot.onnx_name is None:
            out.append(slot.constant)
            continue
        t = next(it)
        if slot.is_scalar:
            out.append(int(t.item()))
        else:
            out.append(_in_order(t, orders[k]) if orders is not None else t)
    return out


class ReferenceRunner:
    """One graph run by ``onnx.reference.ReferenceEvaluator``; with ``check`` the graph also runs in
    eager torch and every output is compared."""

    def __init__(
        self,
        result: ExportResult,
        name: str,
        check: torch.fx.GraphModule | None,
        rtol: float,
        atol: float,
        orders: list[list[int] | None],
    ) -> None:
        from onnx.reference import ReferenceEvaluator

        self.name = name
        self._orders = orders
        self._layout = result._layout
        self._check = check
        self.rtol, self.atol = rtol, atol
        try:
            self.evaluator = ReferenceEvaluator(result.model_proto)
        except Exception as e:
            raise RuntimeCheckError(f"the reference evaluator could not load {name}: {e}") from e
        self._inputs = [(i, s.onnx_name) for i, s in enumerate(self._layout.inputs) if s.onnx_name]
        self._outputs = [s.onnx_name for s in self._layout.outputs if s.onnx_name is not None]

    def __call__(self, *args: Any) -> list[Any]:
        feeds = {name: args[i].detach().cpu().numpy() for i, name in self._inputs}
        try:
            arrays = self.evaluator.run(self._outputs, feeds)
        except Exception as e:
            raise RuntimeCheckError(f"the reference evaluator failed to run {self.name}: {e}") from e
        out = _unflatten(self._layout, [torch.from_numpy(_native(a)) for a in arrays], self._orders)
        if self._check is not None:
            self._compare(out, self._check(*args))
        return out

    def _compare(self, got: list[Any], expected: Sequence[Any]) -> None:
        for k, (g, e) in enumerate(zip(got, expected, strict=True)):
            if not isinstance(e, torch.Tensor):
                if g != e:
                    raise RuntimeCheckError(f"{self.name} diverges from torch at output {k}: {g!r} != {e!r}")
                continue
            try:
                torch.testing.assert_close(g, e.detach(), rtol=self.rtol, atol=self.atol)
            except AssertionError as err:
                raise RuntimeCheckError(f"{self.name} diverges from torch at output {k}: {err}") from None


def _native(a: Any) -> Any:
    import numpy as np

    a = np.asarray(a)
    # the evaluator may hand back a 0-d numpy scalar or a non-writable view: torch wants an array
    return np.ascontiguousarray(a)


def backend(**options: Any) -> FastOnnxBackend:
    """A configured ``backend="fastonnx"``: ``torch.compile(m, backend=fastonnx.backend(opset=18))``.
    See ``FastOnnxBackend`` for the options."""
    return FastOnnxBackend(**options)


def debug_backend(**options: Any) -> FastOnnxBackend:
    """A configured ``backend="fastonnx_debug"`` (onnx's reference evaluator; ``check=True`` compares
    every graph's outputs with torch as it runs)."""
    return FastOnnxBackend(debug=True, **options)


_DEFAULTS: dict[str, FastOnnxBackend] = {}


def default_backend(name: str = "fastonnx") -> FastOnnxBackend:
    """The backend object behind ``backend="fastonnx"`` (or ``"fastonnx_debug"``): default options,
    one per process, so its ``stats`` list every graph compiled by name."""
    if name not in BACKEND_NAMES:
        raise InputError(f"unknown fastonnx backend {name!r}; there are {', '.join(BACKEND_NAMES)}")
    if name not in _DEFAULTS:
        _DEFAULTS[name] = FastOnnxBackend(debug=name == "fastonnx_debug")
    return _DEFAULTS[name]


def fastonnx_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
    """``backend="fastonnx"`` (the ``torch_dynamo_backends`` entry point), default options."""
    return default_backend("fastonnx")(gm, example_inputs)


def fastonnx_debug_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
    """``backend="fastonnx_debug"`` (the ``torch_dynamo_backends`` entry point), default options."""
    return default_backend("fastonnx_debug")(gm, example_inputs)


def register_by_name() -> None:
    """Make ``backend="fastonnx"`` / ``"fastonnx_debug"`` work by name when the package's
    ``torch_dynamo_backends`` entry points are not installed (a source checkout on ``PYTHONPATH``).
    Installed packages need not call it; calling it twice, or after the entry points, does nothing."""
    for name, fn in zip(BACKEND_NAMES, (fastonnx_backend, fastonnx_debug_backend), strict=True):
        if not dynamo_backend_registered(name) and not _entry_point_declared(name):
            register_dynamo_backend(fn, name)


def _entry_point_declared(name: str) -> bool:
    from importlib.metadata import entry_points

    return any(ep.name == name for ep in entry_points(group="torch_dynamo_backends"))
