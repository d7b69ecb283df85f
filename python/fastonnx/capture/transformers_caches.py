"""pytree support for transformers' KV caches, so that ``past_key_values`` can be an input or output.

torch.export flattens inputs and outputs with torch's pytree. Recent transformers releases do not
register their cache classes (torch.export then fails with "Unsupported input type DynamicCache"), so
fastonnx registers them here, once, when transformers is already imported and has not done it itself.

Flattening scheme (it also names the ONNX inputs and outputs): a cache is a list of layers, each a dict
``{"key": tensor, "value": tensor}``; a ``past_key_values`` argument therefore becomes the ONNX inputs
``past_key_values.0.key``, ``past_key_values.0.value``, ``past_key_values.1.key``, ...
Only layers that hold tensors are flattened; uninitialized layers make a cache unexportable.

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
from typing import Any

from fastonnx.torch_internals import pytree

_done = False


def _flatten(cache: Any) -> tuple[list[dict[str, Any]], list[tuple[type, Any]]]:
    layers = []
    context = []
    for layer in cache.layers:
        if not getattr(layer, "is_initialized", True) or getattr(layer, "keys", None) is None:
            raise ValueError(
                f"{type(cache).__name__} has an empty layer ({type(layer).__name__}): fill the cache "
                "(e.g. with cache.update(k, v, layer_idx)) before exporting with it"
            )
        layers.append({"key": layer.keys, "value": layer.values})
        context.append((type(layer), getattr(layer, "sliding_window", None)))
    return layers, context


def _flatten_with_keys(cache: Any) -> tuple[list[tuple[Any, Any]], Any]:
    layers, context = _flatten(cache)
    return [(pytree.SequenceKey(i), layer) for i, layer in enumerate(layers)], context


# pytree hands the leaves back as any iterable (its UnflattenFn takes Iterable[Any])
def _unflatten(cache_type: type, layers: Iterable[dict[str, Any]], context: list[tuple[type, Any]]) -> Any:
    cache = cache_type()
    cache.layers = []
    for (layer_type, window), kv in zip(context, layers):
        layer = layer_type(sliding_window=window) if window is not None else layer_type()
        keys, values = kv["key"], kv["value"]
        # set the state directly: update() would add a concatenation with an empty tensor to the graph
        layer.dtype, layer.device = keys.dtype, keys.device
        layer.keys, layer.values = keys, values
        layer.is_initialized = True
        cache.layers.append(layer)
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
