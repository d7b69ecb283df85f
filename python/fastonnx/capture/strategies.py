"""The ways a program is captured, tried in order (``STRATEGIES``). Each says when it applies; it
returns the program, or None when it does not apply or refuses (the reason kept in the CaptureInfo), and
names the checks (checks.py) its program goes through.

1. ``given_program``: the model is an ExportedProgram already: used as it is.
2. ``real_trace``: ``capture="trace"``, or "auto" without dynamic shapes: one eager run on the real
   inputs recorded (trace.py). It refuses where its program could differ from torch.export's.
3. ``stamped_export``: "auto" with dynamic shapes, and a model whose layers repeat: torch.export of the
   first layers, the rest stamped from them (stamping.py), refined like 4.
4. ``torch_export``: torch.export of the whole model, refined when it refuses the dynamic shapes
   (refinement.py). Always applies: the last resort.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from fastonnx.capture import checks
from fastonnx.capture.info import CaptureInfo
from fastonnx.capture.process_state import TRACE_LOCK
from fastonnx.capture.refinement import Exported, export_refined, log_stamp_refusal
from fastonnx.capture.request import Request
from fastonnx.torch_internals import OpOverload
from fastonnx.walker.aliasing import unsupported_mutation

if TYPE_CHECKING:
    from fastonnx.capture.stamping import LayerPlan

log = logging.getLogger("fastonnx")

Program = torch.export.ExportedProgram
Check = Callable[[Request, Program, CaptureInfo], None]


@dataclasses.dataclass(frozen=True)
class Strategy:
    """One way to capture: ``run`` returns the program or None; ``checks`` run on what it returns."""

    name: str
    run: Callable[[Request, CaptureInfo], Program | None]
    checks: tuple[Check, ...]


def given_program(request: Request, info: CaptureInfo) -> Program | None:
    """Applies to an ExportedProgram: it is the program."""
    model = request.model
    return model if isinstance(model, torch.export.ExportedProgram) else None


def real_trace(request: Request, info: CaptureInfo) -> Program | None:
    """Applies when ``request.how`` is "trace": the recorded program, or None with why it refused
    (a warning when the trace was asked for, an INFO line under "auto")."""
    if request.how != "trace":
        return None
    traced = trace_or_refusal(request.model, request.args, request.kwargs, request.convertible)
    if not isinstance(traced, str):
        info.path = "trace"
        return traced
    log.log(
        logging.INFO if request.quiet else logging.WARNING,
        "capture=%r refused %s, capturing with torch.export instead: %s",
        "auto" if request.quiet else "trace",
        request.name,
        traced,
    )
    info.trace_refused = traced
    return None


def stamped_export(request: Request, info: CaptureInfo) -> Program | None:
    """Applies under capture="auto" with dynamic shapes when stamping.py finds the repeated layers
    (why not kept in ``info.stamp_refused``); stamping given up midway captures the whole model."""
    if not (request.quiet and request.dynamic_shapes is not None):
        return None
    with TRACE_LOCK:
        layers = _layer_plan(request, info)
        if layers is None:
            return None
        exported = export_refined(request, layers)
    if exported.stamped:
        info.path = "stamped"
        info.stamped = f"{layers.layers - layers.prefix} of {layers.layers} layers of {layers.path}"
    else:
        info.stamp_refused = exported.stamp_refused
    return _refined(exported, info)


def torch_export(request: Request, info: CaptureInfo) -> Program:
    """Always applies: torch.export of the whole model, refined (refinement.py)."""
    with TRACE_LOCK:
        exported = export_refined(request)
    return _refined(exported, info)


def _refined(exported: Exported, info: CaptureInfo) -> Program:
    info.dynamic_shapes_refined, info.size_oblivious = exported.fixes, exported.oblivious
    info.refusal = exported.reason
    return exported.ep


def _layer_plan(request: Request, info: CaptureInfo) -> LayerPlan | None:
    """stamping.py's plan, or None with the reason kept in ``info`` (and logged at INFO level)."""
    from fastonnx.capture import stamping

    try:
        return stamping.plan_layers(request.model, request.args, request.kwargs)
    except stamping.StampRefused as e:
        info.stamp_refused = str(e)
        log_stamp_refusal(request.name, e)
        return None


_EXPORT_CHECKS: tuple[Check, ...] = (
    checks.no_input_constants,
    checks.record_ranges,
    checks.refuse_specialised,
    checks.keep_proven,
)

STRATEGIES = (
    Strategy("program", given_program, (checks.keep_proven_of_program,)),
    Strategy("trace", real_trace, (checks.no_input_constants,)),
    Strategy("stamped", stamped_export, _EXPORT_CHECKS),
    Strategy("export", torch_export, _EXPORT_CHECKS),
)
"""The strategies in the order they are tried; the first to return a program wins."""


def trace_or_refusal(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    convertible: Callable[[Any], bool] | None = None,
) -> Program | str:
    """The real-tensor trace (trace.py), or why it cannot stand for torch.export's capture;
    ``convertible(node)``: whether fastonnx converts an FX node's op (one it does not refuses the trace)."""
    # imported here: `import fastonnx` loads none of torch's modules it does not already need
    from fastonnx.capture.refusal import TraceRefused
    from fastonnx.capture.trace import trace_model

    try:
        with TRACE_LOCK:
            ep = trace_model(model, args, kwargs)
        _check_trace(ep, convertible)
    except TraceRefused as e:
        return str(e)
    return ep


def _check_trace(ep: Program, convertible: Callable[[Any], bool] | None) -> None:
    """Refuses a recorded program that torch.export's capture would convert where this one would not."""
    from fastonnx.capture.refusal import TraceRefused

    if convertible is not None:
        for node in ep.graph.nodes:
            if isinstance(node.target, OpOverload) and not convertible(node):
                # an op below autograd that the composite op torch.export keeps decomposes into
                raise TraceRefused(f"the trace records {node.target}, which fastonnx does not convert")
    reason = unsupported_mutation(ep)
    if reason is not None:
        # run_decompositions would re-trace the recorded program on its meta-tensor values
        raise TraceRefused(f"the graph needs torch.export's functionalization: {reason}")
