"""What the user asked a capture for (``Request``), checked before anything traces: the combinations
of model, ``capture=`` and ``dynamic_shapes`` that cannot be honoured are InputErrors, ``capture="auto"``
is resolved to the trace or torch.export (with why), and a model in training mode is warned about."""

from __future__ import annotations

import dataclasses
import logging
import warnings
from collections.abc import Callable
from typing import Any

import torch

from fastonnx.capture import dynamic_dims
from fastonnx.capture.info import CaptureInfo
from fastonnx.errors import InputError
from fastonnx.torch_internals import DropoutNd, NormBase

log = logging.getLogger("fastonnx")

CAPTURES = ("auto", "export", "trace")
"""to_onnx(capture=...): the trace where it stands for torch.export and nothing asked needs torch.export
(the default), torch.export (any shapes), or the real-tensor trace (static shapes, faster)."""

_TRAINING_SENSITIVE = (DropoutNd, NormBase)


@dataclasses.dataclass
class Request:
    """One capture's inputs. ``requested``: the dims the user asked to be dynamic, ``asked`` their
    ranges (``dynamic_dims.normalize``); ``how``: "trace" or "export" once resolved (``quiet``: it was
    "auto", so a refused trace is an INFO line, not a warning); ``needs_export``: what else the caller
    was asked for that needs torch.export's program (pipeline.stages.needs_export); ``convertible(node)``:
    whether fastonnx converts an FX node's op."""

    model: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    dynamic_shapes: Any
    requested: dynamic_dims.Requested
    asked: dynamic_dims.Asked
    strict_dynamic: bool
    keep_narrowed: bool
    how: str
    needs_export: str | None
    convertible: Callable[[Any], bool] | None
    quiet: bool = False

    @property
    def name(self) -> str:
        return type(self.model).__name__


def resolve(request: Request, info: CaptureInfo) -> None:
    """Step 1 of every capture: ``request.how`` resolved and checked against the model and its dynamic
    shapes (InputError), and a model in training mode noted (with a warning where it matters)."""
    if request.how not in CAPTURES:
        raise InputError(f"capture must be one of {', '.join(map(repr, CAPTURES))}, got {request.how!r}")
    if request.how == "auto":
        request.quiet = True
        request.how, info.trace_refused = _auto(request)
    _check_combination(request.model, request.how, request.dynamic_shapes)
    if isinstance(request.model, torch.nn.Module) and request.model.training:
        # torch.export traces what the module does now; only dropout and norms behave differently
        info.training_mode = True
        _warn_training(request.model)


def _check_combination(model: Any, how: str, dynamic_shapes: Any) -> None:
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


def _auto(request: Request) -> tuple[str, str | None]:
    """What capture="auto" runs: "trace" (falling back to torch.export quietly) or "export", with why
    (also logged at INFO level) when the model could have been traced."""
    model = request.model
    if not isinstance(model, torch.nn.Module):
        return "export", None  # an ExportedProgram is captured already; anything else is an error
    reason = request.needs_export
    if request.dynamic_shapes is not None:
        reason = "dynamic_shapes were given: a trace fixes every size"
    elif reason is None and model.training and training_layers(model):
        # the trace refuses batch norm's running-statistics update and records dropout below its
        # training IR op: torch.export keeps what the converters know of a model in training mode
        reason = f"the model is in training mode with {', '.join(training_layers(model))} training"
    if reason is None:
        return "trace", None
    log.info("capture='auto' uses torch.export for %s: %s", request.name, reason)
    return "export", reason


def training_layers(model: torch.nn.Module) -> list[str]:
    """The classes of the model's layers that behave differently in training mode and are training."""
    return sorted(
        {type(m).__name__ for m in model.modules() if isinstance(m, _TRAINING_SENSITIVE) and m.training}
    )


def _warn_training(model: torch.nn.Module) -> None:
    sensitive = training_layers(model)
    if sensitive:
        warnings.warn(
            f"{type(model).__name__} is in training mode: it is exported as traced, with "
            f"{', '.join(sensitive)} in their training form; call model.eval() first for inference",
            # _warn_training, resolve, capture_program, stages.run_capture, pipeline.run, to_onnx
            stacklevel=7,
        )
