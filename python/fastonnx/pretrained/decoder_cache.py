"""What a decoder's cache holds, layer by layer, and caches of that layout for the capture and the checks.

A layer of transformers' cache holds attention keys and values, the indexer keys of sparse attention,
the convolution and recurrent states of linear attention and state-space mixers (Mamba, Qwen3-Next's gated
delta rule, LFM2's short convolution), several of these, or nothing (``capture/transformers_caches.py``
names the fields). The config does not say which, nor their sizes: multi-query attention (Falcon,
GPT-BigCode) keeps one head whatever ``num_key_value_heads`` says, multi-head latent attention (DeepSeek-V2/V3,
MiniCPM3) caches its compressed latent and rotary part, keys and values may differ in size (MiMo-V2-Flash)
and in heads from a layer to the next. So the layout is read from a prefill run on fake tensors
(``produced_layout``), with the cache transformers makes for the config, as ``generate`` does.

Every attention layer keeps all positions, sliding-window ones too (their mask hides the old ones): the
graph's past grows by the new tokens at each step, as onnxruntime-genai's cache does. Convolution and
recurrent states keep their size; a cache of no past positions holds states of zeros, which is what a
fresh cache's prefill pads with.
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from typing import Any

import torch

from fastonnx.capture.expert_loops import every_expert
from fastonnx.capture.pooled_indexers import pools_of_fixed_count
from fastonnx.capture.transformers_caches import (
    LayerContext,
    layer_arguments,
    layer_context,
    layer_tensors,
    rebuild_layer,
)
from fastonnx.errors import InputError
from fastonnx.torch_internals import compiling_state, fake_mode_with_shape_env, module_buffers

PAST_AXIS = {"key": 1, "value": 1, "indexer_key": 0, "indexer_position": 1}
"""The axis of each growing field (in a shape without the batch axis) that holds the past positions."""


@dataclass(frozen=True)
class CacheLayer:
    """One layer of a decoder's cache: how to rebuild it and the shape of each tensor it holds, without
    the batch axis, the past axis (``PAST_AXIS``) as -1."""

    context: LayerContext
    shapes: dict[str, tuple[int, ...]]

    @property
    def heads_and_size(self) -> tuple[int, int] | None:
        """(heads, head size) of the layer's keys, None for a layer without keys."""
        key = self.shapes.get("key")
        return (key[0], key[2]) if key is not None and len(key) == 3 else None


def kv_shape(config: Any) -> tuple[int, int]:
    """(key-value heads, head size) of a decoder config."""
    heads = int(config.num_attention_heads)
    # only where the config class has the field: an unknown keyword is kept on any config, unused
    grouped = "num_key_value_heads" in inspect.signature(type(config).__init__).parameters or (
        "num_key_value_heads" in getattr(config, "attribute_map", {})
    )
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads) if grouped else heads
    head_dim = getattr(config, "head_dim", None) or int(config.hidden_size) // heads
    return kv_heads, int(head_dim)


def text_config(config: Any) -> Any:
    """The config holding a decoder's sizes: its text config where it is composite (a vision-language
    model's causal LM: Gemma 3, Fuyu...), which text-generation exports the text path of."""
    get = getattr(config, "get_text_config", None)
    return get(decoder=True) if callable(get) else config


def config_layout(config: Any) -> list[CacheLayer]:
    """Every layer keys and values of the sizes a standard decoder config states."""
    from transformers.cache_utils import DynamicLayer

    heads, size = kv_shape(config)
    shapes: dict[str, tuple[int, ...]] = {"key": (heads, -1, size), "value": (heads, -1, size)}
    return [CacheLayer(LayerContext(DynamicLayer), shapes)] * int(config.num_hidden_layers)


def _full_attention_kind(kind: type) -> type:
    """The layer class keeping every position for a sliding-window one (see the module's docstring)."""
    from transformers import cache_utils

    full = {
        "DynamicSlidingWindowLayer": "DynamicLayer",
        "LinearAttentionAndSlidingWindowAttentionLayer": "LinearAttentionAndFullAttentionLayer",
        # every prompt position and a window of the generated ones: all kept, the mask hides the rest
        # (reference_windows.py), where check_cache_layers lets it through
        "UnlimitedOcrDynamicReferenceSlidingWindowLayer": "DynamicLayer",
    }
    name = full.get(kind.__name__)
    return getattr(cache_utils, name) if name and hasattr(cache_utils, name) else kind


def config_cache(config: Any) -> Any:
    """The cache transformers makes for ``config`` (``DynamicCache(config=...)``, as ``generate`` does),
    sliding-window layers as full ones; a plain ``DynamicCache()`` where the config gives no layer types."""
    from transformers import DynamicCache

    try:
        cache = DynamicCache(config=config)
    except Exception:  # a config the cache cannot read: layers made as the model fills them
        return DynamicCache()
    cache.layers = [_as_full_attention(layer) for layer in cache.layers]
    return cache


def _as_full_attention(layer: Any) -> Any:
    """``layer``, or a fresh full-attention one of as many states for a sliding-window one."""
    full = _full_attention_kind(type(layer))
    if full is type(layer):
        return layer
    return full(**layer_arguments(dataclasses.replace(layer_context(layer, {}), sliding_window=None)))


KNOWN_LAYERS = (
    "DynamicLayer",
    "DynamicSlidingWindowLayer",
    "DynamicIndexedLayer",
    "LinearAttentionLayer",
    "LinearAttentionAndFullAttentionLayer",
    "LinearAttentionAndSlidingWindowAttentionLayer",
    "DummyLayer",
)


REFERENCE_WINDOW = "reference_sliding_attention"
"""The layer type of Unlimited-OCR's reference sliding-window attention: every prompt position and a
window over the generated ones, its mask reading the prompt's length (reference_windows.py)."""


def reference_windowed(config: Any) -> bool:
    """Whether ``config``'s decoder has reference sliding-window layers (``REFERENCE_WINDOW``)."""
    return REFERENCE_WINDOW in (getattr(text_config(config), "layer_types", None) or [])


def check_cache_layers(model: torch.nn.Module, config: Any, *, reads_prefill_length: bool = False) -> None:
    """Refuses an architecture whose cache transformers makes of layers this module does not know (an
    InputError naming the layer's class): static, offloaded or quantized layers are no package's cache.
    Reference sliding-window layers only where the graph takes the prompt's length their mask reads
    (``reads_prefill_length``): kept whole without it, they would attend past their window."""
    if reference_windowed(config) and not reads_prefill_length:
        raise InputError(
            f"{type(model).__name__}: its {REFERENCE_WINDOW} layers attend to every prompt position and a "
            "window of the generated ones, a mask that reads the prompt's length: only image-text-to-text's "
            "decoder takes it (prefill_length)"
        )
    for i, layer in enumerate(config_cache(config).layers):
        if type(layer).__name__ not in KNOWN_LAYERS:
            raise InputError(
                f"{type(model).__name__}: cache type {type(layer).__name__} (layer {i} of transformers' "
                f"cache for its config) is not supported: text-generation exports {', '.join(KNOWN_LAYERS)}"
            )


def cache_argument(model: torch.nn.Module) -> str:
    """The forward's name for the cache: ``past_key_values``, or ``cache_params`` (Mamba's)."""
    parameters = inspect.signature(model.forward).parameters
    mamba = "cache_params" in parameters and "past_key_values" not in parameters
    return "cache_params" if mamba else "past_key_values"


def returned_cache(out: Any) -> Any:
    """The cache a forward returned: ``past_key_values``, or Mamba's ``cache_params`` (None: none)."""
    cache = getattr(out, "past_key_values", None)  # not ``or``: an empty cache is falsy
    return cache if cache is not None else getattr(out, "cache_params", None)


def cross_attention_layers(config: Any) -> set[int]:
    """The layers a decoder's config names as attending to an image (Mllama's ``cross_attention_layers``):
    a text-only prefill leaves their cache empty, and transformers skips them while it stays so."""
    layers = getattr(text_config(config), "cross_attention_layers", None)
    return {int(i) for i in layers} if isinstance(layers, (list, tuple)) else set()


def _filled(layer: Any) -> bool:
    return bool(getattr(layer, "is_initialized", False)) and getattr(layer, "keys", None) is not None


def _empty_layer(config: Any) -> CacheLayer:
    """A cross-attention layer of a text-only decoder: keys and values of 0 positions, always (not a
    dynamic past), so that the captured step skips it as transformers does and passes it through."""
    from transformers.cache_utils import DynamicLayer

    heads, size = kv_shape(text_config(config))
    return CacheLayer(LayerContext(DynamicLayer), {"key": (heads, 0, size), "value": (heads, 0, size)})


def present_tensors(cache: Any, layout: list[CacheLayer], batch: int) -> list[torch.Tensor]:
    """``flat_tensors`` of a cache transformers returned, an empty layer of ``layout`` (``_empty_layer``)
    as the 0 positions the graph returns for it."""
    out: list[torch.Tensor] = []
    for layer, spec in zip(cache.layers, layout, strict=True):
        if _filled(layer) or not all(0 in shape for shape in spec.shapes.values()):
            out.extend(layer_tensors(layer).values())
        else:
            out.extend(torch.zeros(batch, *shape) for shape in spec.shapes.values())
    return out


def produced_layout(
    model: torch.nn.Module, config: Any, with_positions: bool, id_columns: int = 0
) -> list[CacheLayer] | None:
    """The layout of the cache ``model`` fills from a prefill of 3 tokens run on fake tensors (no values,
    no memory); [] where the model returns no cache, None where that prefill fails (the capture then
    reports the model's own error). The prefill runs as the capture runs the model, with torch's
    compiling flags set (transformers' mask code takes the traceable path then instead of reading values),
    the experts loops over every expert (capture/expert_loops.py) and GLM-5 Next's indexer pools of a
    count the length gives (capture/pooled_indexers.py). ``id_columns``: ids of that many columns a
    position (Kyutai's text token and audio codes: frame_paired_speech.py)."""
    from fastonnx.capture import TRACE_LOCK

    batch, sequence = 2, 3
    # the forward may replace buffers (a rotary table grown for a longer input): put them back after
    buffers = [(m, dict(module_buffers(m))) for m in model.modules()]
    try:
        with TRACE_LOCK, torch.no_grad(), compiling_state(), every_expert(model), pools_of_fixed_count():
            with fake_mode_with_shape_env():
                columns = (id_columns,) if id_columns else ()
                ids = torch.zeros(batch, sequence, *columns, dtype=torch.int64, device="meta")
                mask = torch.ones(batch, sequence, dtype=torch.int64, device="meta")
                kwargs: dict[str, Any] = {"input_ids": ids, "attention_mask": mask}
                if with_positions:
                    kwargs["position_ids"] = torch.arange(sequence, device="meta").repeat(batch, 1)
                kwargs[cache_argument(model)] = config_cache(config)
                out = model(**kwargs, use_cache=True)
            cache = returned_cache(out)
            if cache is None:
                return []  # no cache returned: nothing a decode step could read
            layout = []
            unfilled = cross_attention_layers(config)
            for i, layer in enumerate(getattr(cache, "layers", None) or []):
                if i in unfilled and not _filled(layer):
                    layout.append(_empty_layer(config))
                    continue
                tensors = layer_tensors(layer)
                shapes = {}
                for field, t in tensors.items():
                    shape = [int(d) for d in t.shape[1:]]
                    if field in PAST_AXIS:
                        shape[PAST_AXIS[field]] = -1
                    shapes[field] = tuple(shape)
                context = layer_context(layer, tensors)
                full = dataclasses.replace(
                    context, kind=_full_attention_kind(context.kind), sliding_window=None
                )
                layout.append(CacheLayer(full, shapes))
            return layout or None
    except Exception:  # the model fails on fake tensors: the config's shapes, and the capture's own error
        return None
    finally:
        for module, saved in buffers:
            module_buffers(module).clear()
            module_buffers(module).update(saved)


def filled_cache(
    layout: list[CacheLayer], batch: int, past: int, device: str | torch.device, g: torch.Generator
) -> Any:
    """A DynamicCache of ``layout`` with ``past`` random positions in each attention layer and random
    states, or states of zeros where ``past`` is 0 (nothing seen yet)."""
    from transformers import DynamicCache

    cache = DynamicCache()
    cache.layers = []
    for layer in layout:
        tensors = {}
        for field, shape in layer.shapes.items():
            full = [batch, *(past if d == -1 else d for d in shape)]
            if field == "indexer_position":  # the positions of the past keys: 0, 1... in each dim
                value = torch.arange(past).expand(full).contiguous()
            else:
                value = torch.randn(full, generator=g) if field in PAST_AXIS or past else torch.zeros(full)
            tensors[field] = value.to(device)
        cache.layers.append(rebuild_layer(layer.context, tensors))
    return cache


def fresh_cache(layout: list[CacheLayer]) -> Any:
    """An empty cache of ``layout``'s layer classes, as transformers starts a generation with."""
    from transformers import DynamicCache

    cache = DynamicCache()
    cache.layers = [layer.context.kind(**layer_arguments(layer.context)) for layer in layout]
    return cache


def flat_tensors(cache: Any) -> list[torch.Tensor]:
    """A cache's tensors in the graph's order: layer by layer, each layer's fields in order."""
    return [t for layer in cache.layers for t in layer_tensors(layer).values()]


def cache_names(layout: list[CacheLayer], prefix: str) -> list[str]:
    return [f"{prefix}.{i}.{field}" for i, layer in enumerate(layout) for field in layer.shapes]


def cache_dims(layout: list[CacheLayer], batch: Any, past: Any) -> list[dict[str, Any]]:
    """The dynamic shapes of a cache of ``layout``: the batch, and the past of the growing fields."""
    return [
        {
            field: {0: batch, PAST_AXIS[field] + 1: past}
            if field in PAST_AXIS and layer.shapes[field][PAST_AXIS[field]] == -1
            else {0: batch}
            for field in layer.shapes
        }
        for layer in layout
    ]
