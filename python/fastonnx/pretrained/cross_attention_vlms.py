"""image-text-to-text for the vision-language models whose text decoder reads the image through
cross-attention layers, not as rows of its input: Mllama (Llama 3.2 Vision). vision_language.py's three
files, laid out as a seq2seq decoder keeps its encoder's keys and values:

- ``vision_encoder.onnx``: one image's tiles, ``pixel_values`` 1 x 1 x ``max_num_tiles`` x channels x
  height x width (the processor pads to ``max_num_tiles``), ``aspect_ratio_ids`` 1 x 1 and
  ``aspect_ratio_mask`` 1 x 1 x tiles, to each cross-attention layer's keys and values of the image
  (``cross_attention.N.key`` / ``.value``, N the decoder layer, kv heads x ``tiles x patches`` x head
  size, the keys normed): what transformers' cross-attention layers compute from ``cross_attention_states``
  in the prefill and keep in their cache for the steps. Computed once a prompt, never grown. Several
  images: their keys and values concatenated along the vision axis, in the order of the mask's images;
- ``embed_tokens.onnx``: ``input_ids`` to ``inputs_embeds``, the token embeddings (the image token is an
  ordinary token: the image does not replace it);
- ``decoder_model_merged.onnx``: text-generation's step (``inputs_embeds``, ``attention_mask``,
  ``position_ids``, the self-attention layers' cache: ``past_key_values.N.key`` with N the decoder layer)
  plus ``cross_attention_mask`` (batch x sequence x images x tiles, the processor's: 1 where a token sees
  a tile; a step's row is the prompt's last row, as ``generate`` repeats it) and the vision encoder's
  ``cross_attention.N.*`` on every step (batch x kv heads x images·tiles·patches x head size). Its
  ``present.N.*`` are the self-attention layers' only.

IDEFICS' gated cross-attention layers are gated_cross_attention.py's (the images' rows on every step, as
transformers recomputes their keys and values); ``own_layout`` and the entry points here cover both.

A prompt without an image is not this package's: transformers skips the cross-attention layers then (no
states, nothing cached), a branch on whether there is an image at all; every graph here has one.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from fastonnx.pretrained.decoder_cache import (
    CacheLayer,
    cache_dims,
    config_layout,
    filled_cache,
    returned_cache,
    text_config,
)
from fastonnx.pretrained.graph_spec import BATCH, PAST, SEQUENCE, TOTAL, GraphSpec
from fastonnx.pretrained.vision_language import DECODER_FILE, EMBED_FILE, VISION_FILE, text_sizes

CROSS_ATTENTION_FAMILIES = ("mllama",)
"""Model types whose package this module makes."""

IMAGES = "num_images"


def own_layout(model: torch.nn.Module) -> bool:
    from fastonnx.pretrained import gated_cross_attention

    kind = getattr(model.config, "model_type", None)
    return kind in CROSS_ATTENTION_FAMILIES or gated_cross_attention.own_layout(model)


def cross_layers(config: Any) -> list[int]:
    """The decoder layers that cross-attend to the image (those of the text config's layers)."""
    text = text_config(config)
    return [i for i in text.cross_attention_layers if i < int(text.num_hidden_layers)]


def self_layers(config: Any) -> list[int]:
    cross = set(cross_layers(config))
    return [i for i in range(int(text_config(config).num_hidden_layers)) if i not in cross]


def _names(layers: list[int], prefix: str) -> list[str]:
    return [f"{prefix}.{i}.{field}" for i in layers for field in ("key", "value")]


def tiles_and_patches(config: Any) -> tuple[int, int]:
    """An image's tiles (the processor pads to the maximum) and each tile's patches (with its class)."""
    vision = config.vision_config
    return int(vision.max_num_tiles), (int(vision.image_size) // int(vision.patch_size)) ** 2 + 1


def vision_example(config: Any, device: str | torch.device) -> dict[str, torch.Tensor]:
    """One image as the processor gives it: 2 tiles (aspect ratio 1 x 2, id 2) padded to the maximum."""
    vision = config.vision_config
    tiles, _ = tiles_and_patches(config)
    size, channels = int(vision.image_size), int(vision.num_channels)
    g = torch.Generator().manual_seed(0)
    pixels = torch.randn(1, 1, tiles, channels, size, size, generator=g)
    used = min(2, tiles)
    pixels[:, :, used:] = 0
    mask = torch.zeros(1, 1, tiles, dtype=torch.int64)
    mask[..., :used] = 1
    ratio = next(i for i, r in enumerate(vision.supported_aspect_ratios, 1) if list(r) == [1, used])
    return {
        "pixel_values": pixels.to(device),
        "aspect_ratio_ids": torch.tensor([[ratio]], device=device),
        "aspect_ratio_mask": mask.to(device),
    }


def image_keys_values(model: torch.nn.Module, **image: torch.Tensor) -> list[torch.Tensor]:
    """Each cross-attention layer's keys and values of the image, as transformers' layers make them from
    ``cross_attention_states`` (a text batch of 1)."""
    inner: Any = getattr(model, "model", model)
    states = inner.vision_model(**image).last_hidden_state
    states = inner.multi_modal_projector(states).reshape(-1, states.shape[-2], inner.hidden_size)
    out: list[torch.Tensor] = []
    for i in cross_layers(model.config):
        attn = inner.language_model.layers[i].cross_attn
        shape = (1, -1, attn.num_key_value_heads, attn.head_dim)
        out.append(attn.k_norm(attn.k_proj(states).view(shape).transpose(1, 2)))
        out.append(attn.v_proj(states).view(shape).transpose(1, 2))
    return out


class ImageKeysValues(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, pixel_values: torch.Tensor, aspect_ratio_ids: torch.Tensor, aspect_ratio_mask: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        return tuple(
            image_keys_values(
                self.model,
                pixel_values=pixel_values,
                aspect_ratio_ids=aspect_ratio_ids,
                aspect_ratio_mask=aspect_ratio_mask,
            )
        )


class TokenEmbeddings(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.model.get_input_embeddings()(input_ids)  # type: ignore[operator]
        return out


class CrossAttentionStep(torch.nn.Module):
    """Mllama's language model one step: the self-attention layers' cache as given, the cross-attention
    layers' as the image's keys and values (transformers reads them from its cache when no states come),
    the cross-attention mask made by transformers' own ``_prepare_cross_attention_mask``."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past_key_values: Any,
        cross_attention_mask: torch.Tensor,
        cross: list[torch.Tensor],
    ) -> tuple[torch.Tensor, Any]:
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        from fastonnx.capture.transformers_caches import LayerContext, rebuild_layer

        model: Any = self.model
        config = model.config
        inner = model.model
        owned = iter(past_key_values.layers)
        pairs = iter(zip(cross[0::2], cross[1::2], strict=True))
        cache = DynamicCache()
        crossing = set(cross_layers(config))
        cache.layers = [
            rebuild_layer(LayerContext(DynamicLayer), dict(zip(("key", "value"), next(pairs), strict=True)))
            if i in crossing
            else next(owned)
            for i in range(int(text_config(config).num_hidden_layers))
        ]
        _, patches = tiles_and_patches(config)
        prepare = sys.modules[type(inner).__module__]._prepare_cross_attention_mask
        mask, rows = prepare(cross_attention_mask, num_vision_tokens=patches, dtype=inputs_embeds.dtype)
        out = inner.language_model(
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache,
            cross_attention_mask=mask,
            full_text_row_masked_out_mask=rows,
            use_cache=True,
        )
        grown = returned_cache(out)
        present = DynamicCache()
        present.layers = [grown.layers[i] for i in self_layers(config)]
        return model.lm_head(out.last_hidden_state), present


def self_layout(config: Any) -> list[CacheLayer]:
    """The cache of the self-attention layers: keys and values of the text config's sizes."""
    return config_layout(text_config(config))[: len(self_layers(config))]


def cross_attention_graphs(model: torch.nn.Module, config: Any) -> dict[str, GraphSpec]:
    """The three graphs of a ``CROSS_ATTENTION_FAMILIES`` model's package (or IDEFICS')."""
    from fastonnx.pretrained import gated_cross_attention

    if gated_cross_attention.own_layout(model):
        return gated_cross_attention.gated_cross_attention_graphs(model, config)
    image = vision_example(config, "meta")
    owned, crossing = self_layers(config), cross_layers(config)
    vision = GraphSpec(
        ImageKeysValues(model),
        tuple(image.values()),
        {name: {} for name in image},
        list(image),
        _names(crossing, "cross_attention"),
    )
    hidden, vocab = text_sizes(config)
    b = torch.export.Dim(BATCH, min=1, max=1024)
    s = torch.export.Dim(SEQUENCE, min=1, max=1 << 20)
    p = torch.export.Dim(PAST, min=0, max=1 << 20)
    images = torch.export.Dim(IMAGES, min=1, max=1024)
    ids = torch.randint(0, vocab, (2, 3), device="meta")
    embed = GraphSpec(
        TokenEmbeddings(model), (ids,), {"input_ids": {0: b, 1: s}}, ["input_ids"], ["inputs_embeds"]
    )

    layout = self_layout(config)
    tiles, patches = tiles_and_patches(config)
    heads, size = layout[0].shapes["key"][0], layout[0].shapes["key"][2]
    g = torch.Generator().manual_seed(0)
    count = 2  # images in the example
    cross = [
        torch.randn(2, heads, count * tiles * patches, size, generator=g) for _ in range(2 * len(crossing))
    ]
    args = (
        torch.zeros(2, 3, hidden, device="meta"),
        torch.ones(2, 4 + 3, dtype=torch.int64, device="meta"),
        torch.arange(4, 4 + 3, device="meta").repeat(2, 1),
        filled_cache(layout, 2, 4, "meta", g),
        torch.ones(2, 3, count, tiles, dtype=torch.int64, device="meta"),
        [c.to("meta") for c in cross],
    )
    vision_rows = images * (tiles * patches)
    dims: dict[str, Any] = {
        "inputs_embeds": {0: b, 1: s},
        "attention_mask": {0: b, 1: TOTAL},
        "position_ids": {0: b, 1: s},
        "past_key_values": cache_dims(layout, b, p),
        "cross_attention_mask": {0: b, 1: s, 2: images},
        "cross": [{0: b, 2: vision_rows}] * len(cross),
    }
    names = [
        "inputs_embeds",
        "attention_mask",
        "position_ids",
        *_names(owned, "past_key_values"),
        "cross_attention_mask",
        *_names(crossing, "cross_attention"),
    ]
    decoder = GraphSpec(
        CrossAttentionStep(model), args, dims, names, ["logits", *_names(owned, "present")], layout
    )
    return {VISION_FILE: vision, EMBED_FILE: embed, DECODER_FILE: decoder}


def check_package(
    sessions: dict[str, Any], model: Any, config: Any, specs: dict[str, GraphSpec], check: Any
) -> list[Any]:
    """One image of 2 tiles and a prompt holding its token after 2 text tokens (those 2 see no tile: their
    rows of the mask are 0): the image's keys and values against transformers', then a greedy generation
    of 6 tokens over the three files against ``generate``: every step's logits, and the tokens.
    ``check``: package_check's module (its ``_run``, ``_generate`` and ``_greedy_over_files``), passed in
    as it imports this one."""
    from fastonnx.diagnostics.verdicts import compare
    from fastonnx.pretrained import gated_cross_attention

    if gated_cross_attention.own_layout(model):
        return gated_cross_attention.check_package(sessions, model, config, specs, check)
    pc = check

    image = vision_example(config, "cpu")
    spec = specs[VISION_FILE]
    got = pc._run(sessions[VISION_FILE], spec.input_names, [image[n] for n in spec.input_names])
    with torch.no_grad():
        expected = image_keys_values(model, **image)
    infos = [
        compare(f"vision_encoder: {n}", e, a)
        for n, e, a in zip(spec.output_names, expected, got, strict=True)
    ]
    _, vocab = text_sizes(config)
    token = int(config.image_token_index)
    text = torch.randint(3, vocab, (1, 6), generator=torch.Generator().manual_seed(1))
    text[text == token] = 3
    ids = torch.cat([text[:, :2], torch.tensor([[token]]), text[:, 2:]], dim=1)
    mask = torch.zeros(1, ids.shape[1], 1, image["aspect_ratio_mask"].shape[-1], dtype=torch.int64)
    mask[:, 2:] = image["aspect_ratio_mask"][:, None]  # from the image token on, its tiles
    generated = pc._generate(model, ids, {**image, "cross_attention_mask": mask})
    cross = dict(zip(spec.output_names, got, strict=True))

    def positions(step: int, past: int, length: int) -> torch.Tensor:
        return torch.arange(past, past + length).unsqueeze(0)

    def extra(step: int, step_ids: torch.Tensor, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"cross_attention_mask": mask if step == 0 else mask[:, -1:], **cross}

    hidden, _ = text_sizes(config)
    steps = pc._greedy_over_files(
        sessions,
        (EMBED_FILE, "image_features"),
        specs[DECODER_FILE],
        config,
        ids,
        torch.zeros(0, hidden),
        generated,
    )
    greedy: list[Any] = steps(positions, extra)
    return infos + greedy
