"""From what the user passed to an ExportedProgram: torch.export (non-strict), decompositions only on
request, and functionalization only when the graph mutates a view or an input."""

from __future__ import annotations

import warnings
from typing import Any

import torch

from fastonnx.aliasing import unsupported_mutation
from fastonnx.detection_capture import traceable_detection_ops
from fastonnx.errors import CaptureError, InputError
from fastonnx.recurrent_capture import rnn_as_custom_ops

_TRAINING_SENSITIVE = (
    torch.nn.modules.dropout._DropoutNd,
    torch.nn.modules.batchnorm._NormBase,
)


def capture(
    model: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None,
    dynamic_shapes: Any,
    stats: dict[str, Any],
) -> torch.export.ExportedProgram:
    if isinstance(model, torch.export.ExportedProgram):
        if dynamic_shapes is not None:
            raise InputError(
                "dynamic_shapes was given with an ExportedProgram: its shapes were fixed when it was "
                "exported; pass dynamic_shapes to torch.export.export instead"
            )
        return model
    if not isinstance(model, torch.nn.Module):
        raise InputError(
            f"model must be a torch.nn.Module or a torch.export.ExportedProgram, got {type(model).__name__}"
        )
    if model.training:
        # torch.export traces what the module does now; only dropout and norms behave differently
        stats["training_mode"] = True
        sensitive = sorted(
            {type(m).__name__ for m in model.modules() if isinstance(m, _TRAINING_SENSITIVE) and m.training}
        )
        if sensitive:
            warnings.warn(
                f"{type(model).__name__} is in training mode: it is exported as traced, with "
                f"{', '.join(sensitive)} in their training form; call model.eval() first for inference",
                stacklevel=3,
            )
    try:
        # nn.LSTM / GRU / RNN as custom ops whose batch and sequence dims stay symbolic; torchvision's
        # detection post-processing in a traceable form (see recurrent_capture.py, detection_capture.py)
        with rnn_as_custom_ops(), traceable_detection_ops():
            return torch.export.export(model, args, kwargs, dynamic_shapes=dynamic_shapes, strict=False)
    except Exception as e:  # torch raises many types; its message is what the user needs
        raise CaptureError(f"torch.export.export failed on {type(model).__name__}: {e}") from e


def functionalization_reason(ep: torch.export.ExportedProgram) -> str | None:
    """Why the walker cannot write every in-place op of ``ep`` itself (see aliasing.py), or None."""
    return unsupported_mutation(ep)


def prepare(
    ep: torch.export.ExportedProgram, decompositions: Any, stats: dict[str, Any]
) -> torch.export.ExportedProgram:
    """Apply the user's decomposition table, then functionalize if rebinding cannot be trusted."""
    if decompositions is not None:
        if not isinstance(decompositions, dict):
            raise InputError(
                f"decompositions must be a dict of op overload -> function, got {type(decompositions).__name__}"
            )
        ep = ep.run_decompositions(decompositions)
        stats["decompositions"] = len(decompositions)
    reason = functionalization_reason(ep)
    if reason is not None:
        ep = ep.run_decompositions({})
        stats["functionalized"] = reason
    return ep
