"""The steps after a strategy returned a program: each checks it against the request and records what
it found in the ``CaptureInfo``. A strategy names the ones it needs (strategies.py).

- ``no_input_constants``: no input became a constant of the graph;
- ``record_ranges``: the ranges torch.export gave each dynamic dim;
- ``refuse_specialised``: a dim asked to be dynamic that came out fixed is a CaptureError (a warning
  with ``strict_dynamic=False``);
- ``keep_proven``: what the program is proven for (guards.py); a dim it narrows is a CaptureError (a
  warning with ``keep_narrowed=True``, the narrowed sizes then kept in ``CaptureInfo.proven``).
"""

from __future__ import annotations

import time
import warnings

import torch

from fastonnx.capture import dynamic_dims
from fastonnx.capture.guards import Narrowing, locating_seconds, prove, shape_env_of
from fastonnx.capture.info import CaptureInfo
from fastonnx.capture.input_tensors import check_no_input_constants, forward_names
from fastonnx.capture.request import Request
from fastonnx.errors import CaptureError

Program = torch.export.ExportedProgram


def no_input_constants(request: Request, ep: Program, info: CaptureInfo) -> None:
    """An input the capture turned into a constant is an InputError (input_tensors.py)."""
    names = forward_names(request.model, len(request.args), request.kwargs)
    check_no_input_constants(ep, request.args, request.kwargs, names)


def record_ranges(request: Request, ep: Program, info: CaptureInfo) -> None:
    """``info.dynamic_ranges``: each symbolic input dim's range, with dynamic shapes."""
    if request.dynamic_shapes is not None:
        info.dynamic_ranges = dynamic_dims.ranges(ep, request.args, request.kwargs)


def refuse_specialised(request: Request, ep: Program, info: CaptureInfo) -> None:
    """A requested dim torch.export fixed: a CaptureError under ``strict_dynamic`` (dynamic_dims.names
    warns when the walker reads it otherwise)."""
    fixed = dynamic_dims.specialised(ep, request.args, request.kwargs, request.requested)
    if fixed and request.strict_dynamic:
        where = "; ".join(f"input {path!r} axis {axis} to {size}" for path, axis, size in fixed)
        why = f" torch.export said:\n{info.refusal}\n" if info.refusal else " "
        raise CaptureError(
            f"dynamic_shapes asked for dynamic dims that torch.export specialised: {where}: the ONNX model "
            f"would only accept that size there.{why}Make the model's code keep the dim symbolic, give an "
            f"example input whose size there is not special, or pass strict_dynamic=False to export with "
            f"the fixed size (with a warning)"
        )


def keep_proven(request: Request, ep: Program, info: CaptureInfo) -> None:
    """What ``ep`` is proven for, in ``info.proven``, against the ranges asked."""
    if request.dynamic_shapes is not None:
        _prove(request, ep, info, request.asked)


def keep_proven_of_program(request: Request, ep: Program, info: CaptureInfo) -> None:
    """The same for a program exported elsewhere, checked against the ranges torch kept in it."""
    if has_symbolic_inputs(ep):
        _prove(request, ep, info, None)


def _prove(request: Request, ep: Program, info: CaptureInfo, asked: dynamic_dims.Asked | None) -> None:
    t0 = time.perf_counter()
    paths = dynamic_dims.input_paths(ep, request.args, request.kwargs)
    proven, narrowed = prove(ep, paths, asked, request.requested)
    info.proven, info.guards_s = proven, locating_seconds() + time.perf_counter() - t0
    if info.dynamic_ranges is not None:
        info.dynamic_ranges.update({f"{d.input}[{d.axis}]": [d.lower, d.upper] for d in proven.dims})
    if not narrowed:
        return
    text = "".join(n.describe() for n in narrowed)
    if not request.keep_narrowed:
        raise _narrowed_error(narrowed, text, info.dynamic_shapes_refined)
    info.narrowed = text.strip()
    warnings.warn(
        f"keep_narrowed=True: the export keeps the narrowed sizes, and the result refuses others "
        f"(SizeGuardError):\n{text}",
        # _prove, the check, capture_program, stages.run_capture, pipeline.run, to_onnx: the caller
        stacklevel=7,
    )


def _narrowed_error(narrowed: list[Narrowing], text: str, fixes: list[str] | None) -> CaptureError:
    bounds = "; ".join(f"input {n.input!r} axis {n.axis}: {n.fix()}" for n in narrowed)
    torch_fixes = f" (torch.export suggested {'; '.join(fixes)}, applied above)" if fixes else ""
    error = CaptureError(
        "the captured program is not right at every size dynamic_shapes asks for, and the ONNX file "
        f"would accept the others silently:\n{text}"
        f"Fix: ask for the sizes it is right for, {bounds}{torch_fixes} (the file then refuses other "
        "sizes at run time); or change the model's code (or switch it to a form) that does not decide on "
        "this size; or pass keep_narrowed=True to export with those sizes kept, with a warning"
    )
    error.narrowed = narrowed  # type: ignore[attr-defined]  # what a caller may ask for instead
    return error


def has_symbolic_inputs(ep: Program) -> bool:
    """Whether a placeholder of ``ep`` has a symbolic size."""
    return shape_env_of(ep) is not None
