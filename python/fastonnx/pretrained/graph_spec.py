"""What one file of a package is exported from: the module, its example inputs and dynamic shapes, and the
ONNX input and output names; the dims' names every task shares."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch

from fastonnx.pretrained.decoder_cache import CacheLayer

BATCH, SEQUENCE, PAST, TOTAL = (
    "batch_size",
    "sequence_length",
    "past_sequence_length",
    "total_sequence_length",
)
FEATURES = "feature_length"  # the frames of a speech model's features (encoder_tasks, speech_features)


@dataclass
class GraphSpec:
    module: torch.nn.Module
    args: tuple[Any, ...]
    dynamic_shapes: dict[str, Any]
    input_names: list[str]
    output_names: list[str]
    cache_layout: list[CacheLayer] | None = None  # text-generation: what the model's cache holds
    stateless: bool = False  # text-generation of a model that keeps no cache: the whole sequence a step
    codebooks: int = 1  # rows of input_ids a sequence (MusicGen's decoder: one a codebook)


def takes(model: torch.nn.Module, name: str) -> bool:
    return name in inspect.signature(model.forward).parameters
