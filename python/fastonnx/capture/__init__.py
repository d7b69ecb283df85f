"""From what the user passed to an ExportedProgram, as one sequence of steps (``capture_program``):

1. the request resolved and checked (request.py): ``capture="auto"`` decided, bad combinations refused;
2. the strategies tried in order until one returns a program (strategies.py): the ExportedProgram given,
   the real-tensor trace, torch.export with stamped layers, torch.export of the whole model, the last two
   refined when torch refuses the dynamic shapes (refinement.py);
3. the checks the winning strategy names (checks.py): no input made a constant, the ranges, no requested
   dim specialised, what the program is proven for (guards.py);
4. then ``prepare``: the user's decompositions, and functionalization only when the graph mutates a view
   or an input that the walker cannot write itself.

torch.export is not thread-safe, nor are the module patches applied while capturing: everything that
traces runs under :data:`TRACE_LOCK` (process_state.py); conversion and writing do not take it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from fastonnx.capture import dynamic_dims
from fastonnx.capture.checks import has_symbolic_inputs
from fastonnx.capture.guards import locating_seconds
from fastonnx.capture.info import CaptureInfo
from fastonnx.capture.process_state import TRACE_LOCK, register_pytree_types
from fastonnx.capture.refinement import size_oblivious
from fastonnx.capture.request import CAPTURES, Request, resolve
from fastonnx.capture.strategies import STRATEGIES, trace_or_refusal
from fastonnx.walker.aliasing import unsupported_mutation

__all__ = [
    "CAPTURES",
    "TRACE_LOCK",
    "CaptureInfo",
    "capture_program",
    "prepare",
    "register_pytree_types",
    "size_oblivious",
    "trace_or_refusal",
]


def capture_program(
    model: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None,
    dynamic_shapes: Any,
    *,
    requested: dynamic_dims.Requested | None = None,
    asked: dynamic_dims.Asked | None = None,
    strict_dynamic: bool = True,
    keep_narrowed: bool = False,
    how: str = "auto",
    needs_export: str | None = None,
    convertible: Callable[[Any], bool] | None = None,
) -> tuple[torch.export.ExportedProgram, CaptureInfo]:
    """An ExportedProgram of ``model`` and what the capture found (the steps: this module's docstring).

    ``requested`` are the dims the user asked to be dynamic and ``asked`` their ranges
    (``dynamic_dims.normalize``). ``how``: "auto" traces an nn.Module without ``dynamic_shapes``, in
    training mode only when no dropout or norm layer trains, and ``needs_export`` None (what else the
    caller was asked for that needs torch.export's program: pipeline.stages.needs_export); "trace" asks
    for the trace (a refusal is then a warning); "export" for torch.export. ``convertible(node)``:
    whether fastonnx converts an FX node's op (the trace refuses one it does not)."""
    request = Request(
        model,
        args,
        kwargs or {},
        dynamic_shapes,
        requested or {},
        asked or {},
        strict_dynamic,
        keep_narrowed,
        how,
        needs_export,
        convertible,
    )
    info = CaptureInfo()
    locating_seconds()  # what earlier captures spent is theirs
    resolve(request, info)
    for strategy in STRATEGIES:
        ep = strategy.run(request, info)
        if ep is None:
            continue
        for check in strategy.checks:
            check(request, ep, info)
        return ep, info
    raise AssertionError("torch_export, the last strategy, always returns a program")


def prepare(
    ep: torch.export.ExportedProgram, decompositions: Any, info: CaptureInfo
) -> tuple[torch.export.ExportedProgram, CaptureInfo]:
    """Apply the user's decomposition table, then functionalize if rebinding cannot be trusted; the
    CaptureInfo returned says what was done."""
    if decompositions is not None:  # a dict: pipeline.options checked it before the capture
        with TRACE_LOCK, size_oblivious(has_symbolic_inputs(ep)):
            ep = ep.run_decompositions(decompositions)
        info = dataclasses.replace(info, decompositions=len(decompositions))
    reason = unsupported_mutation(ep)  # why the walker cannot write every in-place op itself
    if reason is not None:
        with TRACE_LOCK, size_oblivious(has_symbolic_inputs(ep)):
            ep = ep.run_decompositions({})
        info = dataclasses.replace(info, functionalized=reason)
    return ep, info
