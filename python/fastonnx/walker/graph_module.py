"""FX GraphModule of aten ops -> ONNX, through the same Interpreter and converters as ``to_onnx``.

What torch.compile hands a backend (after aot_autograd) is a plain GraphModule: every input is a
placeholder (parameters included, already lifted by dynamo), every output one element of the output
node's tuple, and ``node.meta["val"]`` holds fake tensors / SymInts. ``GraphProgram`` presents such a
module with the few attributes of an ExportedProgram the Interpreter reads (signature, state dict,
call spec), so the walker is shared and nothing here walks the graph itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, cast

import torch
from torch.export.graph_signature import (
    ConstantArgument,
    ExportGraphSignature,
    InputKind,
    InputSpec,
    OutputKind,
    OutputSpec,
    SymIntArgument,
    TensorArgument,
)

from fastonnx.errors import InputError
from fastonnx.pipeline import stages
from fastonnx.pipeline.options import ExportOptions, new_builder
from fastonnx.registry import Registry
from fastonnx.result import ExportResult


class _CallSpec(NamedTuple):
    in_spec: Any
    out_spec: Any


class GraphProgram:
    """A GraphModule seen as an ExportedProgram whose inputs are all user inputs (no lifted weights:
    the Interpreter then makes every placeholder a graph input) and whose outputs are all user outputs."""

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        self.graph_module = gm
        self.graph = gm.graph
        self.state_dict: dict[str, torch.Tensor] = {}
        self.constants: dict[str, Any] = {}
        self.call_spec = _CallSpec(None, None)  # flat in, flat out: placeholders keep their FX names
        inputs = [
            InputSpec(InputKind.USER_INPUT, _argument(n), None)
            for n in gm.graph.nodes
            if n.op == "placeholder"
        ]
        output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
        flat = output.args[0] if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
        outputs = [
            OutputSpec(
                OutputKind.USER_OUTPUT, _argument(a) if isinstance(a, torch.fx.Node) else _constant(a), None
            )
            for a in flat
        ]
        self.graph_signature = ExportGraphSignature(input_specs=inputs, output_specs=outputs)


def _constant(a: Any) -> ConstantArgument:
    return ConstantArgument(name="", value=a)


def _argument(node: torch.fx.Node) -> TensorArgument | SymIntArgument:
    if isinstance(node.meta.get("val"), torch.SymInt):
        return SymIntArgument(name=node.name)
    return TensorArgument(name=node.name)


def graph_module_to_onnx(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any] | None = None,
    *,
    opset: int | None = None,
    optimize: bool | str = True,
    custom_converters: dict[Any, Callable[..., Any]] | None = None,
) -> ExportResult:
    """Convert an FX GraphModule of aten ops (what aot_autograd hands a torch.compile backend) to ONNX.

    Every placeholder must carry ``node.meta["val"]`` (a fake tensor, SymInt or Python value): tensor
    placeholders become graph inputs named after the FX placeholders, with a dynamic dim wherever the
    value's dim is a SymInt; SymInt and Python-value placeholders are not graph inputs (their values
    are read from the tensor inputs' shapes, or were specialised). Every element of the output tuple
    is one graph output (a SymInt as a 0-d int64, a non-tensor as a constant of the layout).
    ``example_inputs`` are not read (the placeholders' values are) but are checked to be as many as the
    placeholders. The model has no ``value_info`` (to_onnx's default writes it). Returns an
    ``ExportResult`` (flat inputs, flat outputs) with ``stats`` like ``to_onnx``'s, without ``capture_s``.
    """
    # to_onnx's checks of these keywords, before anything is converted; no value_info: the compile
    # backends hand the model to onnxruntime, which infers the types itself
    options = ExportOptions.from_keywords(
        opset=opset, optimize=optimize, custom_converters=custom_converters, value_info=False
    )
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    missing = [n.name for n in placeholders if "val" not in n.meta]
    if missing:
        raise InputError(
            f"placeholders {missing} of the GraphModule have no meta['val'] (fake tensor or value): "
            "pass a graph traced by torch.compile / aot_autograd / make_fx"
        )
    if example_inputs is not None and len(example_inputs) != len(placeholders):
        raise InputError(
            f"got {len(example_inputs)} example inputs, the GraphModule has {len(placeholders)} placeholders"
        )
    program = cast(torch.export.ExportedProgram, GraphProgram(gm))  # has every attribute the walker reads
    vals = tuple(n.meta["val"] for n in placeholders)
    builder = new_builder(options.opset)
    converted = stages.run_convert(
        program, builder, (vals, {}), {}, options, Registry(custom_converters), program=False
    )
    # the weights stage too, as to_onnx runs it: a GraphModule's weights are inputs, so it has nothing
    # to reference or quantize, but a weight without bytes would still be listed for attach_weights
    planned = stages.plan_weights(converted, None, options)
    optimized = stages.run_optimize(converted, options)
    placed = stages.place_weights(builder, planned)
    stats = {
        "opset": options.opset,
        **converted.stats(),
        **stages.optimize_stats(converted, optimized, placed),
    }
    return ExportResult(builder, converted.layout, None, None, stats)
