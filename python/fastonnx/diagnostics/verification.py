"""Does the exported model compute what PyTorch computes? Per output, and down to the first FX node
whose value diverges.

Output verification runs the user's model eagerly (an ExportedProgram through ``ep.module()``) and the
ONNX model in onnxruntime on the same inputs, and compares each flattened output.

Intermediate verification runs the ExportedProgram's FX graph in torch recording every node's value,
then the exported ONNX model (the optimized one, as written) with every ONNX value that an FX node of the
top graph converted to exposed as an extra graph output, and compares them in FX (topological) order.
The first FX node whose value is outside tolerance is the one named; since the order is topological, all
its inputs that could be compared agreed. Values that cannot be compared are skipped and counted, never
guessed: removed or renamed by optimization, folded into a constant, computed inside If/Loop/Scan bodies
(they cannot be graph outputs), random or uninitialized (``empty``, ``rand``, dropout), non-tensors.
A divergent node whose inputs were partly skipped says so: the error may have started in one of those.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import torch

from fastonnx.diagnostics.verdicts import (
    Divergence,
    IntermediateVerification,
    NodeCheck,
    VerificationInfo,
    compare,
)
from fastonnx.ort_io import to_numpy
from fastonnx.torch_internals import pytree

if TYPE_CHECKING:
    import onnx

    from fastonnx._core import GraphBuilder
    from fastonnx.diagnostics.debug import Trace
    from fastonnx.walker.interpreter import Layout


class VerifiableResult(Protocol):
    """What verification reads of an ``fastonnx.ExportResult`` (result.py calls into this module, so
    this one names the attributes it needs instead of importing the class)."""

    _layout: Layout
    _builder: GraphBuilder
    _trace: Trace | None
    exported_program: Any

    @property
    def model_proto(self) -> onnx.ModelProto: ...

    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

    def _feeds(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, torch.Tensor]: ...


# ops whose value is undefined or random: their eager and ONNX values are not expected to match
_UNCOMPARABLE_OPS = (
    "empty",
    "rand",
    "bernoulli",
    "dropout",
    "normal",
    "uniform",
    "multinomial",
    "exponential",
)


def verify_outputs(
    result: VerifiableResult,
    eager: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    atol: float | None,
    rtol: float | None,
) -> list[VerificationInfo]:
    """Run ``eager`` and the ONNX model on the same inputs and compare each flattened output."""
    with torch.no_grad():
        expected = eager(*_cloned(args), **_cloned(kwargs))
    actual = result(*args, **kwargs)
    exp_leaves = pytree.tree_leaves(expected)
    act_leaves = pytree.tree_leaves(actual)
    names = [s.onnx_name or f"output {i} (constant)" for i, s in enumerate(result._layout.outputs)]
    if len(exp_leaves) != len(act_leaves):
        return [
            VerificationInfo(
                "outputs",
                "-",
                (),
                math.inf,
                math.inf,
                False,
                0.0,
                0.0,
                f"PyTorch returned {len(exp_leaves)} values, the ONNX model {len(act_leaves)}",
            )
        ]
    return [
        compare(names[i] if i < len(names) else f"output {i}", e, a, atol, rtol)
        for i, (e, a) in enumerate(zip(exp_leaves, act_leaves))
    ]


def _cloned(tree: Any) -> Any:
    """The inputs again, so that a model writing into its inputs leaves the caller's untouched."""
    return pytree.tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, tree)


# ---- intermediate values ------------------------------------------------------------------------
class _Recorder(torch.fx.Interpreter):
    """Runs the FX graph keeping a copy of every top-level node's value as it was when computed (a
    later in-place write must not change what was recorded)."""

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        super().__init__(gm)
        self.values: dict[str, Any] = {}

    def run_node(self, n: torch.fx.Node) -> Any:
        out = super().run_node(n)
        if n.op == "call_function":
            self.values[n.name] = pytree.tree_map(
                lambda x: x.detach().clone() if isinstance(x, torch.Tensor) else x, out
            )
        return out


def _flat_program_inputs(
    ep: torch.export.ExportedProgram, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> list[Any]:
    """The ExportedProgram's placeholders' values: the user's flattened inputs, weights, buffers and
    constants (buffers and inputs cloned: the graph may write into them)."""
    from torch.export.graph_signature import InputKind

    leaves = iter(pytree.tree_leaves((args, kwargs)))
    out: list[Any] = []
    for spec in ep.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            v = next(leaves)
            out.append(v.clone() if isinstance(v, torch.Tensor) else v)
        elif spec.kind == InputKind.PARAMETER:
            out.append(ep.state_dict[spec.target])
        elif spec.kind == InputKind.BUFFER:
            t = ep.state_dict[spec.target] if spec.target in ep.state_dict else ep.constants[spec.target]
            out.append(t.clone())
        elif spec.kind in (InputKind.CONSTANT_TENSOR, InputKind.CUSTOM_OBJ):
            c = ep.constants[spec.target]
            out.append(c.clone() if isinstance(c, torch.Tensor) else c)
        else:
            raise ValueError(f"cannot run a program with a {spec.kind.name} input ({spec.arg})")
    return out


def verify_intermediate(
    result: VerifiableResult,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    atol: float | None,
    rtol: float | None,
) -> IntermediateVerification:
    import onnx
    import onnxruntime

    from fastonnx import dtypes
    from fastonnx.walker.interpreter import source_line

    ep = result.exported_program
    trace = result._trace
    if ep is None or trace is None:
        raise ValueError(
            "this ExportResult has no ExportedProgram or trace kept: intermediate verification needs both"
        )

    recorder = _Recorder(ep.graph_module)
    with torch.no_grad():
        recorder.run(*_flat_program_inputs(ep, args, kwargs))

    model = onnx.ModelProto()
    model.CopyFrom(result.model_proto)
    graph = model.graph
    produced: dict[str, str] = {o: n.name for n in graph.node for o in n.output if o}
    initializers = {i.name for i in graph.initializer}
    exposed = {o.name for o in graph.output}
    report = IntermediateVerification()

    def skip(why: str) -> None:
        report.skipped[why] = report.skipped.get(why, 0) + 1

    # FX nodes inside subgraphs (If/Loop/Scan bodies) never reach the top graph: counted, not compared
    for gm in ep.graph_module.modules():
        if isinstance(gm, torch.fx.GraphModule) and gm is not ep.graph_module:
            for n in gm.graph.nodes:
                if n.op == "call_function":
                    skip("inside subgraphs (If/Loop/Scan bodies, wrapped regions)")

    pairs: list[tuple[torch.fx.Node, str, Any]] = []  # (FX node, ONNX value, torch value)
    for node in ep.graph.nodes:
        if node.op != "call_function" or node.name not in recorder.values:
            continue
        names = trace.values_of(node.name)
        torch_vals = recorder.values[node.name]
        if names is None:
            skip("not converted")
            continue
        if any(w in str(node.target) for w in _UNCOMPARABLE_OPS):
            skip("random or uninitialized")
            continue
        flat = list(torch_vals) if isinstance(torch_vals, (list, tuple)) else [torch_vals]
        for name, val in zip(names, flat):
            if not isinstance(val, torch.Tensor) or name is None:
                skip("not a tensor")
            elif name in produced:
                pairs.append((node, name, val))
                if name not in exposed:
                    elem = result._builder.dtype(name)
                    if elem is None:
                        elem = dtypes.to_onnx_dtype(val.dtype if not val.is_complex() else val.real.dtype)
                    graph.output.append(onnx.helper.make_tensor_value_info(name, elem, None))
                    exposed.add(name)
            elif name in initializers:
                skip("folded into a constant")
            elif name in result._builder.input_names():
                skip("a graph input")
            else:
                skip("removed by optimization")

    opts = onnxruntime.SessionOptions()
    # with every value an output there is little left to fuse; not optimizing keeps the session quick
    opts.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 3  # the instrumented copy draws warnings (unused initializers) of no use here
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), opts, providers=["CPUExecutionProvider"]
    )
    feeds = {k: to_numpy(v) for k, v in result._feeds(args, kwargs).items()}
    wanted = sorted({name for _, name, _ in pairs})
    ort_values = dict(zip(wanted, session.run(wanted, feeds)))

    status: dict[str, bool] = {}  # FX node name -> all its compared outputs agree
    for node, name, val in pairs:
        actual = torch.from_numpy(ort_values[name])
        info = compare(name, val, actual, atol, rtol)
        report.checks.append(NodeCheck(node.name, str(node.target), name, info))
        status[node.name] = status.get(node.name, True) and info.passed
        if not info.passed and report.first_divergence is None:
            report.first_divergence = _divergence(node, name, info, status, trace, produced, source_line)
    return report


def _divergence(
    node: torch.fx.Node,
    name: str,
    info: VerificationInfo,
    status: dict[str, bool],
    trace: Any,
    produced: dict[str, str],
    source_line: Callable[[torch.fx.Node], str],
) -> Divergence:
    # a getitem's value comes from its source node's converter: name that node
    import operator

    culprit = node
    while culprit.target is operator.getitem and isinstance(culprit.args[0], torch.fx.Node):
        culprit = culprit.args[0]
    agreeing: list[str] = []
    not_compared: list[str] = []
    for inp in culprit.all_input_nodes:
        if inp.op != "call_function":
            continue  # graph inputs and weights are fed as they are
        (agreeing if status.get(inp.name) else not_compared).append(inp.name)
    onnx_nodes = trace.onnx_nodes_of(culprit.name)
    if not onnx_nodes and name in produced:
        onnx_nodes = [produced[name]]
    return Divergence(
        culprit.name,
        str(culprit.target),
        source_line(culprit),
        name,
        onnx_nodes,
        info,
        agreeing,
        not_compared,
    )
