"""From what the user passed to an ExportedProgram: torch.export (non-strict), decompositions only on
request, and functionalization only when the graph mutates a view or an input."""

from __future__ import annotations

import warnings
from typing import Any

import torch

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


def _mutated_args(node: torch.fx.Node) -> list[Any]:
    schema = getattr(node.target, "_schema", None)
    if schema is None or not schema.is_mutable:
        return []
    out = []
    for i, a in enumerate(schema.arguments):
        if a.alias_info is not None and a.alias_info.is_write:
            if a.kwarg_only or i >= len(node.args):
                out.append(node.kwargs.get(a.name))
            else:
                out.append(node.args[i])
    return out


def _is_view(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and bool(getattr(node.target, "is_view", False))


def functionalization_reason(ep: torch.export.ExportedProgram) -> str | None:
    """Why in-place ops in the graph cannot simply be rebound, or None when they can.

    Rebinding (the mutated value's later readers see the op's result) is right for a value that is
    neither a view, nor viewed, nor a graph input; anything else needs torch's functionalization.
    """
    for node in ep.graph.nodes:
        if node.op != "call_function":
            continue
        for target in _mutated_args(node):
            if not isinstance(target, torch.fx.Node):
                return f"{node.name} ({node.target}) mutates a non-tensor argument"
            if target.op == "placeholder":
                return f"{node.name} ({node.target}) mutates the input or buffer {target.name}"
            if _is_view(target):
                return f"{node.name} ({node.target}) mutates {target.name}, a view"
            if any(_is_view(u) for u in target.users if u is not node):
                return f"{node.name} ({node.target}) mutates {target.name}, which has views"
    return None


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
