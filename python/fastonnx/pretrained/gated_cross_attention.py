"""image-text-to-text for IDEFICS (IdeficsForVisionText2Text): a Llama decoder with a gated cross-attention
layer before every ``cross_layer_interval``-th layer, reading the images' rows (the vision tower's, or
its perceiver resampler's latents). vision_language.py's three files:

- ``vision_encoder.onnx``: ``pixel_values`` as the processor gives them, batch x images x channels x the
  config's image size, to ``image_hidden_states`` batch x images x rows x hidden: what transformers'
  forward returns as ``image_hidden_states`` (the tower's states, through the resampler where
  ``use_resampler``) and ``generate`` passes back on every step;
- ``embed_tokens.onnx``: ``input_ids`` to ``inputs_embeds`` (the image tokens are ordinary tokens; the
  additional vocabulary's rows, a data-dependent boolean index in transformers, picked by a select);
- ``decoder_model_merged.onnx``: text-generation's step plus ``image_hidden_states`` and
  ``image_attention_mask`` (batch x sequence x images, the processor's: 1 where a token sees an image; a
  step's row is the prompt's last, as ``generate`` repeats it) on every step. transformers recomputes the
  cross-attention's keys and values from the rows every step and caches none: so does this graph, with
  its own forward. ``present.N.*`` are the self-attention layers' (every decoder layer has one).
"""

from __future__ import annotations

from typing import Any

import torch

from fastonnx.pretrained.decoder_cache import (
    cache_dims,
    cache_names,
    config_layout,
    filled_cache,
    text_config,
)
from fastonnx.pretrained.graph_spec import BATCH, PAST, SEQUENCE, TOTAL, GraphSpec
from fastonnx.pretrained.vision_language import DECODER_FILE, EMBED_FILE, VISION_FILE, EmbedsStep, text_sizes

GATED_FAMILIES = ("idefics",)
"""Model types whose package this module makes."""

IMAGES = "num_images"
STATES = "image_hidden_states"


def own_layout(model: torch.nn.Module) -> bool:
    return getattr(model.config, "model_type", None) in GATED_FAMILIES


def pixels_example(config: Any, images: int, device: str | torch.device) -> torch.Tensor:
    """``images`` images of the vision config's size, one prompt's (batch 1)."""
    vision = config.vision_config
    size, channels = int(vision.image_size), int(vision.num_channels)
    g = torch.Generator().manual_seed(0)
    return torch.randn(1, images, channels, size, size, generator=g).to(device)


def image_hidden_states(model: torch.nn.Module, pixel_values: torch.Tensor) -> torch.Tensor:
    """The images' rows as IdeficsModel's forward makes them from ``pixel_values``."""
    inner: Any = getattr(model, "model", model)
    batch, images = pixel_values.shape[:2]
    flat = pixel_values.reshape(batch * images, *pixel_values.shape[2:])
    states = inner.vision_model(pixel_values=flat.to(inner.dtype)).last_hidden_state
    if inner.config.use_resampler:
        states = inner.perceiver_resampler(states)
    out: torch.Tensor = states.reshape(batch, images, states.shape[-2], states.shape[-1])
    return out


class ImageStates(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return image_hidden_states(self.model, pixel_values)


class DecoupledEmbeddings(torch.nn.Module):
    """IDEFICS' token embeddings: ids past the base vocabulary read the additional table (transformers
    gathers them by a boolean index, a data-dependent size; here both tables are read and selected)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        table: Any = self.model.get_input_embeddings()  # type: ignore[operator]
        count = int(table.num_embeddings)
        if int(getattr(table, "num_additional_embeddings", 0)) == 0:
            plain: torch.Tensor = torch.nn.functional.embedding(input_ids, table.weight)
            return plain
        extra = input_ids >= count
        base = torch.nn.functional.embedding(torch.where(extra, 0, input_ids), table.weight)
        added = table.additional_embedding(torch.where(extra, input_ids - count, 0))
        out: torch.Tensor = torch.where(extra.unsqueeze(-1), added, base)
        return out


class GatedCrossAttentionStep(EmbedsStep):
    """IDEFICS one step: its forward from the embeddings, the images' rows given as the ones it computed
    (``perceiver_embeddings`` where it resamples, else ``image_encoder_embeddings``, as ``generate``
    passes them back)."""

    def forward(  # type: ignore[override]
        self,
        inputs_embeds: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past_key_values: Any,
        image_hidden_states: torch.Tensor,
        image_attention_mask: torch.Tensor,
    ) -> tuple[torch.Tensor, Any]:
        model: Any = self.model
        rows = "perceiver_embeddings" if model.config.use_resampler else "image_encoder_embeddings"
        extra = {"image_attention_mask": image_attention_mask, rows: image_hidden_states}
        return self.step(model, inputs_embeds, attention_mask, position_ids, past_key_values, **extra)


def gated_cross_attention_graphs(model: torch.nn.Module, config: Any) -> dict[str, GraphSpec]:
    """The three graphs of a ``GATED_FAMILIES`` model's package."""
    b = torch.export.Dim(BATCH, min=1, max=1024)
    s = torch.export.Dim(SEQUENCE, min=1, max=1 << 20)
    p = torch.export.Dim(PAST, min=0, max=1 << 20)
    images = torch.export.Dim(IMAGES, min=1, max=1024)
    pixels = pixels_example(config, 2, "meta").repeat(2, 1, 1, 1, 1)
    vision = GraphSpec(
        ImageStates(model), (pixels,), {"pixel_values": {0: b, 1: images}}, ["pixel_values"], [STATES]
    )
    hidden, vocab = text_sizes(config)
    ids = torch.randint(0, vocab, (2, 3), device="meta")
    embed = GraphSpec(
        DecoupledEmbeddings(model), (ids,), {"input_ids": {0: b, 1: s}}, ["input_ids"], ["inputs_embeds"]
    )
    # every decoder layer self-attends: the config's layers (a prefill to find them would need images)
    layout = config_layout(text_config(config))
    rows = image_hidden_states(model, pixels_example(config, 2, "meta"))
    args = (
        torch.zeros(2, 3, hidden, device="meta"),
        torch.ones(2, 4 + 3, dtype=torch.int64, device="meta"),
        torch.arange(4, 4 + 3, device="meta").repeat(2, 1),
        filled_cache(layout, 2, 4, "meta", torch.Generator().manual_seed(0)),
        rows.repeat(2, 1, 1, 1),
        torch.ones(2, 3, 2, dtype=torch.int64, device="meta"),
    )
    dims: dict[str, Any] = {
        "inputs_embeds": {0: b, 1: s},
        "attention_mask": {0: b, 1: TOTAL},
        "position_ids": {0: b, 1: s},
        "past_key_values": cache_dims(layout, b, p),
        "image_hidden_states": {0: b, 1: images},
        "image_attention_mask": {0: b, 1: s, 2: images},
    }
    names = [
        "inputs_embeds",
        "attention_mask",
        "position_ids",
        *cache_names(layout, "past_key_values"),
        STATES,
        "image_attention_mask",
    ]
    decoder = GraphSpec(
        GatedCrossAttentionStep(model), args, dims, names, ["logits", *cache_names(layout, "present")], layout
    )
    return {VISION_FILE: vision, EMBED_FILE: embed, DECODER_FILE: decoder}


def check_package(
    sessions: dict[str, Any], model: Any, config: Any, specs: dict[str, GraphSpec], check: Any
) -> list[Any]:
    """Two images and a prompt of 8 tokens, the first 2 seeing no image, the next 2 the first image, the
    rest both: the images' rows against transformers' ``image_hidden_states``, then a greedy generation
    of 6 tokens over the three files against ``generate``: every step's logits, and the tokens.
    ``check``: package_check's module, as cross_attention_vlms.check_package takes it."""
    from fastonnx.diagnostics.verdicts import compare

    pc = check
    pixels = pixels_example(config, 2, "cpu")
    (got,) = pc._run(sessions[VISION_FILE], ["pixel_values"], [pixels])
    _, vocab = text_sizes(config)
    ids = torch.randint(3, vocab, (1, 8), generator=torch.Generator().manual_seed(1))
    mask = torch.zeros(1, ids.shape[1], 2, dtype=torch.int64)
    mask[:, 2:, 0] = 1
    mask[:, 4:, 1] = 1
    with torch.no_grad():
        expected = model(input_ids=ids, pixel_values=pixels, image_attention_mask=mask).image_hidden_states
    infos = [compare(f"vision_encoder: {STATES}", expected, got)]
    generated = pc._generate(model, ids, {"pixel_values": pixels, "image_attention_mask": mask})

    def positions(step: int, past: int, length: int) -> torch.Tensor:
        return torch.arange(past, past + length).unsqueeze(0)

    def extra(step: int, step_ids: torch.Tensor, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"image_attention_mask": mask if step == 0 else mask[:, -1:], STATES: got}

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
