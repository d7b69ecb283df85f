"""Speech seq2seq models whose ``input_features`` are the encoder's input rows themselves (Pop2Piano: its
forward hands them to the encoder as ``inputs_embeds``, and its feature extractor writes log-mel frames of
``feature_size`` bins, the model width): a frame holds ``d_model`` values and the encoder reads the
frames as embeddings. The composer token Pop2Piano's ``generate`` puts in front is a row of those frames,
prepended before the forward, as the forward's own input."""

from __future__ import annotations

import inspect
from typing import Any

import torch

from fastonnx.pretrained.graph_spec import takes


def features_as_embeddings(model: torch.nn.Module) -> bool:
    """Whether ``model`` reads ``input_features`` but its encoder takes ``inputs_embeds`` and no features."""
    get_encoder = getattr(model, "get_encoder", None)
    if not takes(model, "input_features") or get_encoder is None:
        return False
    params = inspect.signature(get_encoder().forward).parameters
    return "input_features" not in params and "inputs_embeds" in params


def embedded_frame_size(model: torch.nn.Module, config: Any) -> int | None:
    """The width of a frame such a model reads (its ``d_model``); None for other models."""
    if not features_as_embeddings(model):
        return None
    return int(getattr(config, "d_model", None) or config.hidden_size)


def encoder_states(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """The encoder's states for a speech model's inputs, as its forward computes them."""
    encoder: Any = model.get_encoder()  # type: ignore[operator]
    if features_as_embeddings(model):
        out: torch.Tensor = encoder(inputs_embeds=inputs["input_features"]).last_hidden_state
        return out
    out = encoder(**inputs).last_hidden_state
    return out
