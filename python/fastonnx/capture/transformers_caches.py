"""pytree support for transformers' KV caches, so that ``past_key_values`` can be an input or output.

torch.export flattens inputs and outputs with torch's pytree. Recent transformers releases do not
register their cache classes (torch.export then fails with "Unsupported input type DynamicCache"), so
fastonnx registers them here, once, when transformers is already imported and has not done it itself.

Flattening scheme (it also names the ONNX inputs and outputs): a cache is a list of layers, each a dict
of the tensors the layer holds (``LAYER_FIELDS``):

- an attention layer: ``{"key", "value"}``; a ``past_key_values`` argument therefore becomes the ONNX
  inputs ``past_key_values.0.key``, ``past_key_values.0.value``, ``past_key_values.1.key``, ...;
- a linear-attention or state-space layer (Mamba, Qwen3-Next's gated delta rule, LFM2's short
  convolution): ``{"conv_state", "recurrent_state"}``, those it holds (LFM2's layers hold no recurrent
  state): the names onnxruntime-genai looks for (``past_key_values.%d.conv_state``);
- a layer holding both (transformers' ``hybrid`` type): the four;
- an indexed layer (the indexer keys of DeepSeek-V3.2's sparse attention): ``key``, ``value`` and
  ``indexer_key``, and ``indexer_position`` where it keeps the positions of the keys it indexed
  (Qwen4-Exp's multimodal positions, ``[3, batch, past]`` in transformers, flattened batch first:
  ``[batch, 3, past]``, int64);
- a layer holding nothing (a KV-sharing or attention-free layer): ``{}``, no input.

Uninitialized layers make a cache unexportable. A rebuilt linear-attention layer has a previous state (its
inputs), and updates it by returning new tensors instead of copying into the old ones: one graph serves
the prefill (states of zeros, as a fresh cache pads) and every decode step, and no input is mutated.

An ``EncoderDecoderCache`` (the cache of a seq2seq decoder step: T5, BART, Whisper...) is a list of
layers, each ``{"decoder": {"key", "value"}, "encoder": {"key", "value"}}`` (the self-attention
cache, then the cross-attention cache over the encoder's states): the inputs
``past_key_values.0.decoder.key``, ``past_key_values.0.encoder.key``, ... as optimum and onnxruntime
name a seq2seq decoder's past. Rebuilt, a filled cross-attention layer is marked updated, so the
decoder reads it instead of projecting the encoder's states again, as in generation's later steps.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from fastonnx.torch_internals import pytree

_done = False

LAYER_FIELDS = ("key", "value", "indexer_key", "indexer_position", "conv_state", "recurrent_state")
"""Every tensor a cache layer can hold, in the order they are flattened; a layer of several states
(Inkling's convolutions of queries, keys and values) names its state ``i`` > 0 ``conv_state_i`` /
``recurrent_state_i``, after the first."""


def state_field(kind: str, index: int) -> str:
    """The field of a layer's state ``index`` of ``kind`` ("conv_state" or "recurrent_state")."""
    return kind if index == 0 else f"{kind}_{index}"


@dataclass(frozen=True)
class LayerContext:
    """What rebuilds a layer besides its tensors: its transformers class, its sliding window and, for a
    linear-attention layer, its number of states and each one's convolution kernel size."""

    kind: type
    sliding_window: int | None = None
    conv_kernel_sizes: tuple[int | None, ...] = ()


def _cache_classes() -> tuple[type | None, type | None]:
    """transformers' attention-layer base and linear-attention-layer base (None where it has none)."""
    try:
        from transformers.cache_utils import CacheLayerMixin
    except ImportError:
        return None, None
    try:
        from transformers.cache_utils import LinearAttentionCacheLayerMixin
    except ImportError:  # a transformers without linear-attention caches
        return CacheLayerMixin, None
    return CacheLayerMixin, LinearAttentionCacheLayerMixin


def layer_tensors(layer: Any, where: str = "the cache") -> dict[str, torch.Tensor]:
    """The tensors ``layer`` holds, by field name, in ``LAYER_FIELDS``' order; a ValueError names a layer
    that is not filled."""
    attention, linear = _cache_classes()
    out: dict[str, torch.Tensor] = {}
    is_linear = linear is not None and isinstance(layer, linear)
    states: dict[str, torch.Tensor] = {}
    if is_linear:
        for i in range(layer.number_of_states):
            if layer.is_conv_states_initialized[i]:
                states[state_field("conv_state", i)] = layer.conv_states[i]
            if layer.is_recurrent_states_initialized[i]:
                states[state_field("recurrent_state", i)] = layer.recurrent_states[i]
    # an attention layer (also the attention half of a hybrid one), or any other object with keys
    if isinstance(layer, attention) if attention is not None else hasattr(layer, "keys"):
        if not getattr(layer, "is_initialized", True) or getattr(layer, "keys", None) is None:
            raise ValueError(
                f"{where} has an empty layer ({type(layer).__name__}): fill the cache "
                "(e.g. with cache.update(k, v, layer_idx)) before exporting with it"
            )
        out["key"], out["value"] = layer.keys, layer.values
        indexer = getattr(layer, "indexer_keys", None)
        if getattr(layer, "is_indexer_initialized", False) and indexer is not None:
            out["indexer_key"] = indexer
        positions = getattr(layer, "indexer_position_ids", None)
        if positions is not None:  # [dims, batch, past]: batch first, as every field has it
            view, stored = getattr(layer, "_fastonnx_indexer_position", (None, None))
            # the tensor it was rebuilt from where it still holds it: torch.export finds an input's
            # dynamic dims by the tensor's identity, so flattening twice must give the same object
            kept = stored if view is positions and isinstance(stored, torch.Tensor) else None
            out["indexer_position"] = kept if kept is not None else positions.transpose(0, 1)
    if is_linear and not (out or states):
        raise ValueError(
            f"{where} has an empty layer ({type(layer).__name__}): run the model once with the cache (a "
            "prefill) before exporting with it"
        )
    return {**{f: out[f] for f in LAYER_FIELDS if f in out}, **states}


class _ReadNoted(dict):  # type: ignore[type-arg]
    """A rebuilt layer's recurrent states: a read is noted for Mamba's selective scan, which the mixer
    calls without the state it read (chunked_kernels.selective_scan_by_steps)."""

    def __getitem__(self, key: Any) -> Any:
        from fastonnx.capture.chunked_kernels import note_recurrent_state

        value = super().__getitem__(key)
        if isinstance(value, torch.Tensor):
            note_recurrent_state(value)
        return value


class _StatesAsValues:
    """Mixed into a rebuilt linear-attention layer: it has a previous state (the graph's input), and an
    update returns new tensors instead of copying into the input's (``copy_`` would mutate an input)."""

    conv_states: dict[int, torch.Tensor]
    recurrent_states: dict[int, torch.Tensor]
    conv_kernel_size: dict[int, int]

    def update_conv_state(self, conv_states: torch.Tensor, state_idx: int = 0, **kwargs: Any) -> torch.Tensor:
        # the previous inputs and the new ones, as transformers' decode path sees them; the last kernel
        # size of them are the next state
        full = torch.cat([self.conv_states[state_idx], conv_states], dim=-1)
        self.conv_states[state_idx] = full[..., -self.conv_kernel_size[state_idx] :]
        return full

    def update_recurrent_state(
        self, recurrent_states: torch.Tensor, state_idx: int = 0, **kwargs: Any
    ) -> torch.Tensor:
        self.recurrent_states[state_idx] = recurrent_states
        return recurrent_states


@functools.cache
def _rebuilt_class(kind: type) -> type:
    """``kind`` itself, or for a linear-attention layer its subclass with ``_StatesAsValues``."""
    _, linear = _cache_classes()
    if linear is None or not issubclass(kind, linear):
        return kind
    return type(kind.__name__, (_StatesAsValues, kind), {"_fastonnx_base": kind})


def layer_context(layer: Any, tensors: dict[str, torch.Tensor]) -> LayerContext:
    """What rebuilds ``layer`` (holding ``tensors``) besides its tensors."""
    kernels: list[int | None] = []
    for i in range(getattr(layer, "number_of_states", 0)):
        conv = tensors.get(state_field("conv_state", i))
        kernels.append(layer.conv_kernel_size[i] or (int(conv.shape[-1]) if conv is not None else None))
    kind = getattr(type(layer), "_fastonnx_base", type(layer))
    return LayerContext(kind, getattr(layer, "sliding_window", None), tuple(kernels))


def layer_arguments(context: LayerContext) -> dict[str, Any]:
    """The keyword arguments a layer class of ``context`` is made with: its window, its states' count."""
    kwargs: dict[str, Any] = {}
    if context.sliding_window is not None:
        kwargs["sliding_window"] = context.sliding_window
    if context.conv_kernel_sizes:
        kwargs["number_of_states"] = len(context.conv_kernel_sizes)
    return kwargs


def rebuild_layer(context: LayerContext, tensors: dict[str, Any]) -> Any:
    """A layer of ``context``'s kind holding ``tensors`` (``layer_tensors``' fields), set directly:
    ``update`` would add a concatenation with an empty tensor to the graph."""
    kind = _rebuilt_class(context.kind)
    layer = kind(**layer_arguments(context))
    if kind is not context.kind:
        layer.recurrent_states = _ReadNoted(layer.recurrent_states)
    if "key" in tensors:
        keys = tensors["key"]
        layer.dtype, layer.device = keys.dtype, keys.device
        layer.keys, layer.values = keys, tensors["value"]
        layer.is_initialized = True
    if "indexer_key" in tensors:
        layer.indexer_keys = tensors["indexer_key"]
        layer.indexer_dtype, layer.indexer_device = layer.indexer_keys.dtype, layer.indexer_keys.device
        layer.is_indexer_initialized = True
    if "indexer_position" in tensors:
        stored = tensors["indexer_position"]
        # pytree also unflattens what is not a tensor of positions (dims specs, placeholders): as it is
        batch_first = isinstance(stored, torch.Tensor) and stored.dim() == 3
        layer.indexer_position_ids = stored.transpose(0, 1) if batch_first else stored
        layer._fastonnx_indexer_position = (layer.indexer_position_ids, stored)
    for i, kernel in enumerate(context.conv_kernel_sizes):
        for field, store, flag in (
            ("conv_state", "conv_states", "is_conv_states_initialized"),
            ("recurrent_state", "recurrent_states", "is_recurrent_states_initialized"),
        ):
            state = tensors.get(state_field(field, i))
            if state is not None:
                getattr(layer, store)[i] = state
                getattr(layer, flag)[i] = True
                layer.has_previous_state[i] = True
                if layer.device is None:
                    layer.dtype, layer.device = state.dtype, state.device
        if kernel is not None:
            layer.conv_kernel_size[i] = kernel
    return layer


def _flatten(cache: Any) -> tuple[list[dict[str, Any]], list[LayerContext]]:
    layers, context = [], []
    for i, layer in enumerate(cache.layers):
        tensors = layer_tensors(layer, f"{type(cache).__name__} (layer {i})")
        layers.append(tensors)
        context.append(layer_context(layer, tensors))
    return layers, context


def _flatten_with_keys(cache: Any) -> tuple[list[tuple[Any, Any]], Any]:
    layers, context = _flatten(cache)
    return [(pytree.SequenceKey(i), layer) for i, layer in enumerate(layers)], context


# pytree hands the leaves back as any iterable (its UnflattenFn takes Iterable[Any])
def _unflatten(cache_type: type, layers: Iterable[dict[str, Any]], context: list[LayerContext]) -> Any:
    cache = cache_type()
    cache.layers = [rebuild_layer(c, tensors) for c, tensors in zip(context, layers)]
    return cache


def _flatten_encoder_decoder(cache: Any) -> tuple[list[dict[str, Any]], tuple[Any, Any]]:
    own, own_context = _flatten(cache.self_attention_cache)
    cross, cross_context = _flatten(cache.cross_attention_cache)
    if len(own) != len(cross):
        raise ValueError(
            f"{type(cache).__name__} holds {len(own)} self-attention and {len(cross)} cross-attention "
            "layers: fill both for every decoder layer before exporting with it"
        )
    layers = [{"decoder": d, "encoder": e} for d, e in zip(own, cross)]
    return layers, (own_context, cross_context)


def _flatten_encoder_decoder_with_keys(cache: Any) -> tuple[list[tuple[Any, Any]], Any]:
    layers, context = _flatten_encoder_decoder(cache)
    return [(pytree.SequenceKey(i), layer) for i, layer in enumerate(layers)], context


def _unflatten_encoder_decoder(
    cache_type: type, dynamic_type: type, layers: Iterable[dict[str, Any]], context: tuple[Any, Any]
) -> Any:
    layers = list(layers)
    own = _unflatten(dynamic_type, [layer["decoder"] for layer in layers], context[0])
    cross = _unflatten(dynamic_type, [layer["encoder"] for layer in layers], context[1])
    # not through __init__: it decides is_updated from the cross-attention lengths, a guard on a
    # symbolic size under torch.export; every flattened layer holds tensors, so all are updated
    cache: Any = object.__new__(cache_type)
    cache.self_attention_cache, cache.cross_attention_cache = own, cross
    cache.is_updated = dict.fromkeys(range(len(layers)), True)
    return cache


def register_transformers_caches() -> None:
    """Registers DynamicCache (and its subclasses that keep the same layout) and EncoderDecoderCache
    with torch's pytree."""
    global _done
    if _done or "transformers" not in sys.modules:
        return
    try:
        from transformers.cache_utils import DynamicCache, EncoderDecoderCache
    except ImportError:  # a transformers without these cache classes: nothing to register
        _done = True
        return
    for cls in (DynamicCache,):
        if cls in pytree.SUPPORTED_NODES:
            continue  # transformers (or the user) registered it already
        pytree.register_pytree_node(
            cls,
            _flatten,
            functools.partial(_unflatten, cls),
            serialized_type_name=f"{cls.__module__}.{cls.__qualname__}",
            flatten_with_keys_fn=_flatten_with_keys,
        )
    if EncoderDecoderCache not in pytree.SUPPORTED_NODES:
        pytree.register_pytree_node(
            EncoderDecoderCache,
            _flatten_encoder_decoder,
            functools.partial(_unflatten_encoder_decoder, EncoderDecoderCache, DynamicCache),
            serialized_type_name=f"{EncoderDecoderCache.__module__}.{EncoderDecoderCache.__qualname__}",
            flatten_with_keys_fn=_flatten_encoder_decoder_with_keys,
        )
    _done = True
