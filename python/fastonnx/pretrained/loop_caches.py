"""What the generation-loop packages' decoder steps share about their self-attention cache (text-to-audio's
stages: Bark's, CSM's, Higgs Audio V2's, MusicGen Melody's, Qwen2.5-Omni's, Gradium Phonon's, Pocket
TTS's, VibeVoice's): the names of its inputs and outputs, the tensors a step returns, and its sizes.

A step's cache is ``2 * layers`` tensors, layer by layer its key then its value, each ``batch`` x key/value
heads x positions x head size, named ``{prefix}.{layer}.key`` / ``.value`` (``past_key_values`` in,
``present`` out); ``cached_step_spec`` a step's graph with that cache (the Omni modules' thinker, talker and
code predictor)."""

from __future__ import annotations

from typing import Any

import torch

from fastonnx.pretrained.graph_spec import PAST, GraphSpec
from fastonnx.torch_internals import pytree


def cache_names(layers: int, prefix: str) -> list[str]:
    """``{prefix}.0.key``, ``{prefix}.0.value``, ``{prefix}.1.key``... for ``layers`` layers."""
    return [f"{prefix}.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]


def present(cache: Any) -> list[torch.Tensor]:
    """A transformers cache's tensors in that order (its layers' ``keys`` and ``values``)."""
    return [t for layer in cache.layers for t in (layer.keys, layer.values)]


def decoder_sizes(config: Any) -> tuple[int, int, int]:
    """(layers, key/value heads, head size) of a decoder config's cache: ``num_key_value_heads`` where it
    groups them, ``head_dim`` where it declares one (else hidden size over heads)."""
    heads = int(config.num_attention_heads)
    size = getattr(config, "head_dim", None) or int(config.hidden_size) // heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    return int(config.num_hidden_layers), int(kv), int(size)


def cached_step_spec(
    step: torch.nn.Module, config: Any, inputs: list[Any], dims: dict[str, Any], batch: Any
) -> GraphSpec:
    """A decoder step's graph: ``inputs`` (named and shaped by ``dims``, in its order) then the cache of
    ``config``'s sizes (an example of 4 positions; its batch ``batch``, its positions ``past_sequence_length``),
    on the meta device; output names left to the caller."""
    layers, heads, size = decoder_sizes(config)
    g = torch.Generator().manual_seed(1)
    past = torch.export.Dim(PAST, min=0, max=1 << 20)
    cache = [torch.randn(2, heads, 4, size, generator=g) for _ in range(2 * layers)]
    shapes = dict(dims)
    shapes["past_key_values"] = [{0: batch, 2: past} for _ in range(2 * layers)]
    names = [n for n in shapes if n != "past_key_values"]
    return GraphSpec(
        step,
        tuple(pytree.tree_map(lambda t: t.to("meta"), [*inputs, cache])),
        shapes,
        [*names, *cache_names(layers, "past_key_values")],
        [],
    )
