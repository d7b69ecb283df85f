"""From what the user passed to an ExportedProgram: torch.export (non-strict), decompositions only on
request, and functionalization only when the graph mutates a view or an input.

With dynamic shapes the capture runs with size-oblivious reasoning, so that a dim whose example size
is 0 or 1 stays dynamic; when torch.export refuses the dynamic shapes and suggests fixes, it is tried
once more with them. A dim asked to be dynamic that still comes out fixed is an error (a warning with
``strict_dynamic=False``).

torch.export is not thread-safe, nor are the module patches applied while capturing: everything that
traces runs under :data:`TRACE_LOCK`; conversion and writing do not take it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from fastonnx.capture import dynamic_dims
from fastonnx.capture.guards import Narrowing, Proven, locate_guards, locating_seconds, prove
from fastonnx.capture.input_tensors import check_no_input_constants, forward_names
from fastonnx.capture.rnn_custom_ops import rnn_as_custom_ops
from fastonnx.capture.traceable_detection import traceable_detection_ops
from fastonnx.capture.transformers_caches import register_transformers_caches
from fastonnx.errors import CaptureError, InputError
from fastonnx.torch_internals import (
    DropoutNd,
    NormBase,
    OpOverload,
    backed_size_oblivious,
    is_traceable_wrapper_subclass,
    pytree,
)
from fastonnx.walker.aliasing import unsupported_mutation

if TYPE_CHECKING:  # stamping.py is imported when a dynamic-shape capture first needs it
    from fastonnx.capture.stamping import LayerPlan

log = logging.getLogger("fastonnx")

TRACE_LOCK = threading.RLock()
"""Held by every fastonnx call that traces (torch.export, run_decompositions) or patches process-wide
state for it (torch._VF, torchvision's detection helpers, torch.fx.experimental._config). Reentrant, so
a user who exports their own ExportedProgram under it may call to_onnx inside."""

CAPTURES = ("auto", "export", "trace")
"""to_onnx(capture=...): the trace where it stands for torch.export and nothing asked needs torch.export
(the default), torch.export (any shapes), or the real-tensor trace (static shapes, faster)."""

_pytree_registered = False


def register_pytree_types() -> None:
    """transformers' cache classes registered with torch's pytree (process-wide, once, under the lock;
    a no-op without a lock once done or while transformers is not imported)."""
    global _pytree_registered
    if _pytree_registered or "transformers" not in sys.modules:
        return
    with TRACE_LOCK:
        register_transformers_caches()
        _pytree_registered = True


_TRAINING_SENSITIVE = (DropoutNd, NormBase)


@dataclasses.dataclass
class CaptureInfo:
    """What a capture found: the path that ran and why, and what it changed of the user's request."""

    path: str = "export"  # "trace", "export" or "stamped"
    trace_refused: str | None = None  # why the trace did not run, when it could have
    stamp_refused: str | None = None  # why dynamic shapes were not captured by stamping (stamping.py)
    stamped: str | None = None  # "N of M layers of <path> stamped" when they were
    training_mode: bool = False
    dynamic_shapes_refined: list[str] | None = None  # torch's fixes, when the first try was refused
    size_oblivious: bool | None = None  # False when the capture was retried without it
    dynamic_ranges: dict[str, list[int | None]] | None = None  # "input[axis]": [min, max or None]
    proven: Proven | None = None  # the sizes the program is right for (guards.py), with dynamic shapes
    guards_s: float | None = None  # what checking them cost: naming guards' lines, then the proof
    narrowed: str | None = None  # the narrowing keep_narrowed=True accepted
    decompositions: int | None = None  # entries of the user's table applied
    functionalized: str | None = None  # why run_decompositions({}) ran

    def stats(self) -> dict[str, Any]:
        """The keys to_onnx's ``stats`` holds for the capture (unset ones left out)."""
        found: dict[str, Any] = {"capture": self.path}
        if self.trace_refused is not None:
            found["trace_refused"] = self.trace_refused
        if self.stamp_refused is not None:
            found["stamp_refused"] = self.stamp_refused
        if self.stamped is not None:
            found["stamped"] = self.stamped
        if self.training_mode:
            found["training_mode"] = True
        if self.size_oblivious is False:
            found["size_oblivious"] = False
        for key in (
            "dynamic_shapes_refined",
            "dynamic_ranges",
            "decompositions",
            "functionalized",
            "guards_s",
        ):
            if getattr(self, key) is not None:
                found[key] = getattr(self, key)
        if self.proven is not None and self.proven.guards:
            found["guards_kept"] = [g.text for g in self.proven.guards]
        if self.narrowed is not None:
            found["narrowed"] = self.narrowed
        return found


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
    """An ExportedProgram of ``model``; ``requested`` are the dims the user asked to be dynamic
    and ``asked`` their ranges (``dynamic_dims.normalize``), checked against what torch.export made of
    them: a dim specialised is a CaptureError (a warning with ``strict_dynamic=False``); one narrowed
    by the range or the guards torch kept (guards.py) too (a warning with ``keep_narrowed=True``, the
    narrowed sizes then kept in ``CaptureInfo.proven``).

    ``how="trace"`` records the model's aten ops on the real inputs instead (trace.py), and
    falls back to torch.export with a warning where that could differ from torch.export's capture.
    ``how="auto"`` traces an nn.Module without ``dynamic_shapes``, in training mode only when no
    dropout or norm layer trains, and ``needs_export`` None (what else the caller was asked for that
    needs torch.export's program: pipeline.stages.needs_export); otherwise, and where the trace refuses, it uses
    torch.export with an INFO log only. The CaptureInfo says which ran and why the trace did not."""
    if how not in CAPTURES:
        raise InputError(f"capture must be one of {', '.join(map(repr, CAPTURES))}, got {how!r}")
    info = CaptureInfo()
    locating_seconds()  # what earlier captures spent is theirs
    quiet = how == "auto"
    if quiet:
        how, info.trace_refused = _auto(model, dynamic_shapes, needs_export)
    _check_request(model, how, dynamic_shapes)
    if isinstance(model, torch.export.ExportedProgram):
        _keep_proven(model, args, kwargs or {}, None, {}, keep_narrowed, info)
        return model, info
    if model.training:
        # torch.export traces what the module does now; only dropout and norms behave differently
        info.training_mode = True
        _warn_training(model)
    names = forward_names(model, len(args), kwargs or {})
    if how == "trace":
        traced = trace_or_refusal(model, args, kwargs or {}, convertible)
        if not isinstance(traced, str):
            check_no_input_constants(traced, args, kwargs or {}, names)
            info.path = "trace"
            return traced, info
        _log_refusal(model, traced, quiet)
        info.trace_refused = traced
    with TRACE_LOCK:
        layers = (
            _stamping_plan(model, args, kwargs or {}, info) if quiet and dynamic_shapes is not None else None
        )
        exported = _export_refined(model, args, kwargs, dynamic_shapes, requested or {}, layers)
    ep = exported.ep
    if layers is not None and exported.stamped:
        info.path = "stamped"
        info.stamped = f"{layers.layers - layers.prefix} of {layers.layers} layers of {layers.path}"
    elif layers is not None:
        info.stamp_refused = exported.stamp_refused
    info.dynamic_shapes_refined, info.size_oblivious = exported.fixes, exported.oblivious
    check_no_input_constants(ep, args, kwargs or {}, names)
    if dynamic_shapes is not None:
        info.dynamic_ranges = dynamic_dims.ranges(ep, args, kwargs or {})
    fixed = dynamic_dims.specialised(ep, args, kwargs or {}, requested or {})
    if fixed and strict_dynamic:
        raise _specialised_error(fixed, exported.reason)
    if dynamic_shapes is not None:
        _keep_proven(
            ep, args, kwargs or {}, asked or {}, requested or {}, keep_narrowed, info, exported.fixes
        )
    return ep, info


def _keep_proven(
    ep: torch.export.ExportedProgram,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    asked: dynamic_dims.Asked | None,
    requested: dynamic_dims.Requested,
    keep_narrowed: bool,
    info: CaptureInfo,
    fixes: list[str] | None = None,
) -> None:
    """What ``ep`` is proven for, in ``info.proven``; a requested dim it narrows is a CaptureError,
    or with ``keep_narrowed=True`` a warning and the narrowed sizes kept (``asked`` None: a program
    exported elsewhere, checked against the ranges torch kept in it)."""
    if asked is None and not _has_symbolic_inputs(ep):
        return
    t0 = time.perf_counter()
    proven, narrowed = prove(ep, dynamic_dims.input_paths(ep, args, kwargs), asked, requested)
    info.proven, info.guards_s = proven, locating_seconds() + time.perf_counter() - t0
    if info.dynamic_ranges is not None:
        info.dynamic_ranges.update({f"{d.input}[{d.axis}]": [d.lower, d.upper] for d in proven.dims})
    if not narrowed:
        return
    text = "".join(n.describe() for n in narrowed)
    if not keep_narrowed:
        raise _narrowed_error(narrowed, text, fixes)
    info.narrowed = text.strip()
    warnings.warn(
        f"keep_narrowed=True: the export keeps the narrowed sizes, and the result refuses others "
        f"(SizeGuardError):\n{text}",
        stacklevel=5,  # _keep_proven, capture, stages.run_capture, pipeline.run, to_onnx: the caller
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


def _check_request(model: Any, how: str, dynamic_shapes: Any) -> None:
    """The combinations of model, capture and dynamic_shapes that cannot be honoured."""
    if how == "trace":
        if isinstance(model, torch.export.ExportedProgram):
            raise InputError(
                "capture='trace' was given with an ExportedProgram, which is captured already: pass the "
                "nn.Module to trace it, or leave capture at 'auto'"
            )
        if dynamic_shapes is not None:
            raise InputError(
                "capture='trace' records one run on the example inputs, so every size is fixed: it "
                "cannot honour dynamic_shapes; use capture='auto' (the default) or 'export' for dynamic shapes"
            )
    if isinstance(model, torch.export.ExportedProgram):
        if dynamic_shapes is not None:
            raise InputError(
                "dynamic_shapes was given with an ExportedProgram: its shapes were fixed when it was "
                "exported; pass dynamic_shapes to torch.export.export instead"
            )
    elif not isinstance(model, torch.nn.Module):
        raise InputError(
            f"model must be a torch.nn.Module or a torch.export.ExportedProgram, got {type(model).__name__}"
        )


def _warn_training(model: torch.nn.Module) -> None:
    sensitive = _training_layers(model)
    if sensitive:
        warnings.warn(
            f"{type(model).__name__} is in training mode: it is exported as traced, with "
            f"{', '.join(sensitive)} in their training form; call model.eval() first for inference",
            stacklevel=6,  # _warn_training, capture, stages.run_capture, pipeline.run, to_onnx: the caller
        )


def _specialised_error(fixed: list[tuple[str, int, int]], reason: str | None) -> CaptureError:
    where = "; ".join(f"input {path!r} axis {axis} to {size}" for path, axis, size in fixed)
    why = f" torch.export said:\n{reason}\n" if reason else " "
    return CaptureError(
        f"dynamic_shapes asked for dynamic dims that torch.export specialised: {where}: the ONNX model "
        f"would only accept that size there.{why}Make the model's code keep the dim symbolic, give an "
        f"example input whose size there is not special, or pass strict_dynamic=False to export with "
        f"the fixed size (with a warning)"
    )


def _auto(model: Any, dynamic_shapes: Any, needs_export: str | None) -> tuple[str, str | None]:
    """What capture="auto" runs: "trace" (falling back to torch.export quietly) or "export", with why
    (also logged at INFO level) when the model could have been traced."""
    if not isinstance(model, torch.nn.Module):
        return "export", None  # an ExportedProgram is captured already; anything else is an error below
    reason = needs_export
    if dynamic_shapes is not None:
        reason = "dynamic_shapes were given: a trace fixes every size"
    elif reason is None and model.training and _training_layers(model):
        # the trace refuses batch norm's running-statistics update and records dropout below its
        # training IR op: torch.export keeps what the converters know of a model in training mode
        reason = f"the model is in training mode with {', '.join(_training_layers(model))} training"
    if reason is None:
        return "trace", None
    log.info("capture='auto' uses torch.export for %s: %s", type(model).__name__, reason)
    return "export", reason


def _training_layers(model: torch.nn.Module) -> list[str]:
    return sorted(
        {type(m).__name__ for m in model.modules() if isinstance(m, _TRAINING_SENSITIVE) and m.training}
    )


def _log_refusal(model: torch.nn.Module, reason: str, quiet: bool) -> None:
    """Where the trace cannot stand for torch.export's capture: a warning when the trace was asked
    for, an INFO line under "auto"."""
    log.log(
        logging.INFO if quiet else logging.WARNING,
        "capture=%r refused %s, capturing with torch.export instead: %s",
        "auto" if quiet else "trace",
        type(model).__name__,
        reason,
    )


def trace_or_refusal(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    convertible: Callable[[Any], bool] | None = None,
) -> torch.export.ExportedProgram | str:
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


def _check_trace(ep: torch.export.ExportedProgram, convertible: Callable[[Any], bool] | None) -> None:
    """Refuses a recorded program that torch.export's capture would convert where this one would not."""
    from fastonnx.capture.refusal import TraceRefused

    if convertible is not None:
        for node in ep.graph.nodes:
            if isinstance(node.target, OpOverload) and not convertible(node):
                # an op below autograd that the composite op torch.export keeps decomposes into
                raise TraceRefused(f"the trace records {node.target}, which fastonnx does not convert")
    reason = functionalization_reason(ep)
    if reason is not None:
        # run_decompositions would re-trace the recorded program on its meta-tensor values
        raise TraceRefused(f"the graph needs torch.export's functionalization: {reason}")


def _stamping_plan(
    model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], info: CaptureInfo
) -> LayerPlan | None:
    """stamping.py's plan for a dynamic-shape capture under capture="auto", or None with the reason
    kept in ``info`` (and logged at INFO level): torch.export then captures the whole model."""
    from fastonnx.capture import stamping

    try:
        return stamping.plan_layers(model, args, kwargs)
    except stamping.StampRefused as e:
        info.stamp_refused = str(e)
        _log_stamp_refusal(model, e)
        return None


def _log_stamp_refusal(model: torch.nn.Module, reason: Exception) -> None:
    log.info("capture='auto' captures every layer of %s with torch.export: %s", type(model).__name__, reason)


def _export(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None,
    dynamic_shapes: Any,
    oblivious: bool,
    layers: LayerPlan | None = None,
) -> tuple[torch.export.ExportedProgram, str | None]:
    """torch.export of ``model``, with ``layers`` (a stamping.LayerPlan) of the prefix and the rest
    stamped; the second value is why stamping was given up (the whole model then captured)."""
    # nn.LSTM / GRU / RNN as custom ops whose batch and sequence dims stay symbolic; torchvision's
    # detection post-processing in a traceable form (see rnn_custom_ops.py, traceable_detection.py)
    with rnn_as_custom_ops(), traceable_detection_ops(), size_oblivious(oblivious), locate_guards():

        def whole() -> torch.export.ExportedProgram:
            return torch.export.export(model, args, kwargs, dynamic_shapes=dynamic_shapes, strict=False)

        if layers is None:
            return whole(), None
        from fastonnx.capture import stamping

        try:
            return stamping.export_stamped(model, layers, whole), None
        except stamping.StampRefused as e:
            _log_stamp_refusal(model, e)
            return whole(), str(e)


@dataclasses.dataclass
class _Exported:
    ep: torch.export.ExportedProgram
    reason: str | None  # torch's explanation of the last refusal, when there was one
    fixes: list[str] | None  # torch's suggested fixes applied
    oblivious: bool | None  # size-oblivious reasoning at the end (None: no dynamic shapes)
    stamped: bool = False  # layers stamped (stamping.py)
    stamp_refused: str | None = None  # why stamping was given up after the plan was made


_MAX_ATTEMPTS = 5  # the first try, without size-oblivious reasoning, unproven Dims checked by
# guards.py, and two rounds of torch's fixes


def _export_refined(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None,
    dynamic_shapes: Any,
    requested: dynamic_dims.Requested,
    layers: LayerPlan | None = None,
) -> _Exported:
    """torch.export, retried the way that keeps the most of the user's dynamic shapes when its
    constraints refuse them: first without size-oblivious reasoning (process-wide in torch, so only
    when no requested dim's example size is 0 or 1: size-oblivious reasoning is what keeps those
    symbolic, and it generates guards such as ``batch != 1`` that plain torch.export does not), then
    with the named Dims whose guards torch could not prove over their ranges as Dim.DYNAMIC (the
    ranges asked for are checked size by size afterwards: guards.py), then with the bounds torch
    suggests (``Dim('sequence', max=512)``), each change logged."""
    name = type(model).__name__
    shapes, oblivious = dynamic_shapes, dynamic_shapes is not None
    may_drop = oblivious and not _example_size_below_two(args, kwargs or {}, requested)
    fixes: list[str] = []
    reason: str | None = None
    failures: list[Exception] = []
    checked = False  # named Dims captured as Dim.DYNAMIC for guards.py to check
    for _ in range(_MAX_ATTEMPTS):
        try:
            ep, given_up = _export(model, args, kwargs, shapes, oblivious, layers)
            return _Exported(
                ep,
                reason,
                fixes or None,
                oblivious if dynamic_shapes is not None else None,
                stamped=layers is not None and given_up is None,
                stamp_refused=given_up,
            )
        except Exception as e:  # torch raises many types; its message is what the user needs
            message = getattr(e, "msg", None) or str(e)
            failures.append(e)
            if "Constraints violated" not in message:
                break
        reason = message.split("\nThe error above occurred")[0]
        if may_drop and oblivious:
            oblivious = False
            log.warning(
                "torch.export refused the dynamic_shapes of %s under size-oblivious reasoning; retrying "
                "without it (no requested dim has an example size of 0 or 1)",
                name,
            )
            continue
        unproven = dynamic_dims.unproven_dims(message, shapes) if not checked else set()
        if unproven and dynamic_dims.fixes_bound_or_fix(message, unproven):
            # torch cannot prove a guard over a named Dim's range and would bound or fix the Dim
            # (its solver does not prove (s + (64 - s % 64) % 64) // 64 == 1 over [2, 64] either):
            # captured as Dim.DYNAMIC instead, guards.py checks the range asked for size by size and
            # names the guards (fixes that relate Dims, n = 2*_n, are applied below, checked the same)
            shapes, checked = dynamic_dims.as_dynamic(shapes, unproven), True
            log.info(
                "torch.export could not prove its guards over %s of %s; capturing them as Dim.DYNAMIC, "
                "the sizes asked for are checked after the capture",
                ", ".join(sorted(unproven)),
                name,
            )
            continue
        refined = dynamic_dims.refine(message, shapes)
        if refined is None:
            break
        shapes, new = refined
        fixes.extend(new)
        log.warning(
            "torch.export refused the dynamic_shapes of %s; retrying with its suggested fixes: %s",
            name,
            "; ".join(new),
        )
    retried = (
        ""
        if len(failures) == 1
        else "\nand failed again after retrying ("
        + "; ".join((["without size-oblivious reasoning"] if may_drop else []) + fixes)
        + f"): {failures[-1]}"
    )
    # chained to torch's first error: its traceback holds the user's line (the report reads it there)
    raise CaptureError(
        f"torch.export.export failed on {name}: {failures[0]}{retried}{_subclass_weights(model)}"
    ) from failures[0]


def _subclass_weights(model: torch.nn.Module) -> str:
    """A note naming the weights that are tensor subclasses (torchao's quantized tensors...): their
    own kernels run inside torch.export, and an error there is theirs."""
    found = [
        f"{n} ({type(t).__module__}.{type(t).__qualname__})"
        for n, t in itertools.chain(model.named_parameters(), model.named_buffers())
        if is_traceable_wrapper_subclass(t.data if isinstance(t, torch.nn.Parameter) else t)
    ]
    if not found:
        return ""
    shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
    return (
        f"\n(the model's weights {shown} are tensor subclasses: the error above may come from their "
        "own kernels, which torch.export runs)"
    )


def _example_size_below_two(
    args: tuple[Any, ...], kwargs: dict[str, Any], requested: dynamic_dims.Requested
) -> bool:
    """Whether a dim asked to be dynamic has an example size of 0 or 1 (``requested`` keys: the
    tensor's place among the tensor leaves of the inputs, the axis)."""
    tensors = [leaf for leaf in pytree.tree_leaves((args, kwargs)) if isinstance(leaf, torch.Tensor)]
    return any(i < len(tensors) and tensors[i].shape[axis] < 2 for i, axis in requested)


@contextlib.contextmanager
def size_oblivious(enabled: bool) -> Iterator[None]:
    """torch.export's size-oblivious reasoning (as torch.onnx sets it): a dynamic dim whose example
    size is 0 or 1 stays symbolic instead of being specialised to that size."""
    if not enabled:
        yield
        return
    with backed_size_oblivious():
        yield


def functionalization_reason(ep: torch.export.ExportedProgram) -> str | None:
    """Why the walker cannot write every in-place op of ``ep`` itself (see aliasing.py), or None."""
    return unsupported_mutation(ep)


def prepare(
    ep: torch.export.ExportedProgram, decompositions: Any, info: CaptureInfo
) -> tuple[torch.export.ExportedProgram, CaptureInfo]:
    """Apply the user's decomposition table, then functionalize if rebinding cannot be trusted; the
    CaptureInfo returned says what was done."""
    if decompositions is not None:  # a dict: pipeline.options checked it before the capture
        with TRACE_LOCK, size_oblivious(_has_symbolic_inputs(ep)):
            ep = ep.run_decompositions(decompositions)
        info = dataclasses.replace(info, decompositions=len(decompositions))
    reason = functionalization_reason(ep)
    if reason is not None:
        with TRACE_LOCK, size_oblivious(_has_symbolic_inputs(ep)):
            ep = ep.run_decompositions({})
        info = dataclasses.replace(info, functionalized=reason)
    return ep, info


def _has_symbolic_inputs(ep: torch.export.ExportedProgram) -> bool:
    for node in ep.graph.nodes:
        val = node.meta.get("val") if node.op == "placeholder" else None
        if isinstance(val, torch.Tensor) and any(not isinstance(d, int) for d in val.shape):
            return True
    return False
