"""pytree support for transformers' KV caches, so that ``past_key_values`` can be an input or output.

torch.export flattens inputs and outputs with torch's pytree. Recent transformers releases do not
register their cache classes (torch.export then fails with "Unsupported input type DynamicCache"), so
fastonnx registers them here, once, when transformers is already imported and has not done it itself.

Flattening scheme (it also names the ONNX inputs and outputs): a cache is a list of layers, each a dict
``{"key": tensor, "value": tensor}``; a ``past_key_values`` argument therefore becomes the ONNX inputs
``past_key_values.0.key``, ``past_key_values.0.value``, ``past_key_values.1.key``, ...
Only layers that hold tensors are flattened; uninitialized layers make a cache unexportable.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Iterable
from typing import Any

import torch.utils._pytree as pytree

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


def register_transformers_caches() -> None:
    """Registers DynamicCache (and its subclasses that keep the same layout) with torch's pytree."""
    global _done
    if _done or "transformers" not in sys.modules:
        return
    try:
        from transformers.cache_utils import DynamicCache
    except ImportError:  # a transformers without cache classes: nothing to register
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
    _done = True
