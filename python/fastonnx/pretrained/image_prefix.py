"""image-text-to-text for the vision-language models without ``get_image_features`` whose image still
becomes rows of the decoder's input: vision_language.py's three files, each family's own graphs.

- Kosmos-2: ``vision_encoder.onnx`` is its base model's image path (the tower's states through its post
  layer norm, normalized, then the latent queries of ``image_to_text_projection``). The rows go where the
  processor's ``image_embeds_position_mask`` is 1, not at one token id (the processor writes distinct ids
  there), so ``embed_tokens.onnx`` takes that mask too (zeros on the steps). Its text decoder scales the
  embeddings and adds sinusoidal positions counting from ``pad_token_id + 1``: transformers makes them
  from the ids, the decoder takes them as ``position_ids`` (0, 1, 2... plus ``pad_token_id + 1``);
- GIT: the image's rows are a prefix before the whole prompt (no image token), attending to each other
  both ways, the text after them causal; the text's positions count from 0 without the image.
  ``embed_tokens.onnx`` puts the features' rows before the word embeddings (its output is longer than
  ``input_ids`` by the rows; no rows on the steps). ``decoder_model_merged.onnx`` takes ``token_type_ids``
  (1 at the image's rows, 0 else) and does what GIT's embeddings do to the text's rows only (position
  embeddings, layer norm), and makes the prefix's block mask from the types, as PaliGemma's decoder; its
  ``attention_mask`` covers the image's rows too (GIT widens a step's mask over them in Python);
- Kosmos-2.5: Kosmos-2's layout, its image Pix2Struct's ``flattened_patches`` (1 x patches x 2 + patch
  pixels: row and column from 1, then the pixels; zero rows padding, which its tower masks itself), the
  patches' number dynamic; its rows the ``latent_query_num`` queries of ``image_to_text_projection``. Its
  decoder adds a segment embedding (1 at the image's rows, 0 else), so ``decoder_model_merged.onnx`` takes
  ``image_embeds_position_mask`` too (the prompt's in the prefill, zeros on the steps, as ``generate``
  passes none then and transformers adds segment 0).
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from fastonnx.pretrained.decoder_cache import (
    cache_dims,
    cache_names,
    config_layout,
    filled_cache,
    produced_layout,
    returned_cache,
    text_config,
)
from fastonnx.pretrained.encoder_tasks import image_inputs
from fastonnx.pretrained.graph_spec import BATCH, PAST, SEQUENCE, TOTAL, GraphSpec
from fastonnx.pretrained.vision_language import (
    DECODER_FILE,
    EMBED_FILE,
    IMAGE_TOKENS,
    VISION_FILE,
    EmbedsStep,
    rows_placed,
    text_sizes,
)

PREFIX_FAMILIES = ("kosmos-2", "kosmos-2.5", "git")
"""Model types whose package this module makes."""


def own_layout(model: torch.nn.Module) -> bool:
    return getattr(model.config, "model_type", None) in PREFIX_FAMILIES


def _git(model: torch.nn.Module) -> bool:
    return getattr(model.config, "model_type", None) == "git"


def _patches(config: Any) -> bool:
    """Whether the image comes as Kosmos-2.5's flattened patches."""
    return getattr(config, "model_type", None) == "kosmos-2.5"


def image_features(model: torch.nn.Module, image: torch.Tensor) -> torch.Tensor:
    """One image's feature rows, as the model's forward makes them (``image``: its pixels, or
    Kosmos-2.5's flattened patches)."""
    m: Any = model
    if _git(model):
        states = m.git.image_encoder(image).last_hidden_state
        rows = m.git.visual_projection(states)
    elif _patches(model.config):  # Kosmos-2.5's forward
        states = m.vision_model(flattened_patches=image).last_hidden_state
        rows, _ = m.image_to_text_projection(torch.nn.functional.normalize(states, dim=-1))
    else:  # Kosmos-2's forward
        states = m.vision_model.model.post_layernorm(m.vision_model(pixel_values=image)[0])
        rows, _ = m.image_to_text_projection(torch.nn.functional.normalize(states, dim=-1))
    out: torch.Tensor = rows.reshape(-1, rows.shape[-1])
    return out


def vision_config(config: Any) -> Any:
    """The config of the image's size: GIT's and Kosmos-2's ``vision_config``."""
    return config.vision_config


PATCHES = "num_patches"


def image_input(config: Any, device: str | torch.device) -> tuple[str, torch.Tensor]:
    """The vision encoder's input and an example of one image: pixels of the vision config's size, or
    Kosmos-2.5's flattened patches (2 rows of 3, row and column from 1 as its processor numbers them)."""
    if not _patches(config):
        return "pixel_values", image_inputs(vision_config(config), 1, device)["pixel_values"]
    columns, patches = 3, 6
    width = int(vision_config(config).patch_embed_hidden_size)
    pixels = torch.randn(1, patches, width, generator=torch.Generator().manual_seed(0))
    where = torch.arange(patches)
    place = torch.stack([(where // columns + 1).float(), (where % columns + 1).float()], dim=-1)
    return "flattened_patches", torch.cat([place.unsqueeze(0), pixels], dim=-1).to(device)


class _Features(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return image_features(self.model, image)


class PositionMaskEmbeddings(torch.nn.Module):
    """Kosmos-2's token embeddings with the image's rows, in order, where ``image_embeds_position_mask``
    is 1 (transformers' boolean-mask assignment, as a gather of the k-th row at the k-th marked token; a
    marked token past the rows keeps its embedding)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, input_ids: torch.Tensor, image_features: torch.Tensor, image_embeds_position_mask: torch.Tensor
    ) -> torch.Tensor:
        embeds: torch.Tensor = self.model.get_input_embeddings()(input_ids)  # type: ignore[operator]
        return rows_placed(embeds, image_embeds_position_mask != 0, image_features)


class PrefixEmbeddings(torch.nn.Module):
    """GIT's word embeddings after the image's rows (each sequence of the batch the same image)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, image_features: torch.Tensor) -> torch.Tensor:
        model: Any = self.model
        words: torch.Tensor = model.git.embeddings.word_embeddings(input_ids)
        prefix = image_features.to(words.dtype).unsqueeze(0).expand(words.shape[0], -1, -1)
        return torch.cat([prefix, words], dim=1)


class KosmosStep(EmbedsStep):
    """Kosmos-2's text decoder one step from the embeddings (it scales them and adds the positions)."""

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past_key_values: Any,
    ) -> tuple[torch.Tensor, Any]:
        text: Any = self.model.text_model
        return self.step(text, inputs_embeds, attention_mask, position_ids, past_key_values)


class Kosmos25Step(EmbedsStep):
    """Kosmos-2.5's text decoder one step from the embeddings; ``image_embeds_position_mask`` picks each
    position's segment embedding (1 at the image's rows)."""

    def forward(  # type: ignore[override]
        self,
        inputs_embeds: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past_key_values: Any,
        image_embeds_position_mask: torch.Tensor,
    ) -> tuple[torch.Tensor, Any]:
        text: Any = self.model.text_model
        return self.step(
            text,
            inputs_embeds,
            attention_mask,
            position_ids,
            past_key_values,
            image_embeds_position_mask=image_embeds_position_mask,
        )


class GitStep(torch.nn.Module):
    """GIT's forward from ``PrefixEmbeddings``' rows: GIT's embeddings (positions, layer norm) on the text's
    rows (``token_type_ids`` 0), the image's as they are; the mask causal but for the image's block."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past_key_values: Any,
        token_type_ids: torch.Tensor,
    ) -> tuple[torch.Tensor, Any]:
        model: Any = self.model
        git = model.git
        embeddings = git.embeddings
        image = (token_type_ids == 1).unsqueeze(-1)
        text = embeddings.LayerNorm(inputs_embeds + embeddings.position_embeddings(position_ids))
        hidden = torch.where(image, inputs_embeds, text)
        masks = sys.modules[type(git).__module__]
        mask = masks.create_causal_mask(
            config=git.config.get_text_config(),
            inputs_embeds=hidden,
            attention_mask=attention_mask,
            past_key_values=past_key_values,
            block_sequence_ids=torch.where(token_type_ids == 1, 0, -1),
        )
        out = git.encoder(hidden, attention_mask=mask, past_key_values=past_key_values, use_cache=True)
        return model.output(out.last_hidden_state), returned_cache(out)


def position_offset(config: Any) -> int:
    """What the decoder's first position is: Kosmos-2's sinusoidal table starts past its padding row."""
    if getattr(config, "model_type", None) in ("kosmos-2", "kosmos-2.5"):
        return int(config.text_config.pad_token_id) + 1
    return 0


def _decoder(model: torch.nn.Module, config: Any) -> GraphSpec:
    hidden, vocab = text_sizes(config)
    b = torch.export.Dim(BATCH, min=1, max=1024)
    s = torch.export.Dim(SEQUENCE, min=1, max=1 << 20)
    p = torch.export.Dim(PAST, min=0, max=1 << 20)
    text: Any = model if _git(model) else model.text_model
    layout = produced_layout(text, text_config(config), True) or config_layout(text_config(config))
    cache = filled_cache(layout, 2, 4, "meta", torch.Generator().manual_seed(0))  # 4 past positions
    offset = position_offset(config)
    args: tuple[Any, ...] = (
        torch.zeros(2, 3, hidden, device="meta"),
        torch.ones(2, 4 + 3, dtype=torch.int64, device="meta"),
        torch.arange(offset + 4, offset + 4 + 3, device="meta").repeat(2, 1),
        cache,
    )
    dims: dict[str, Any] = {
        "inputs_embeds": {0: b, 1: s},
        "attention_mask": {0: b, 1: TOTAL},
        "position_ids": {0: b, 1: s},
        "past_key_values": cache_dims(layout, b, p),
    }
    names = ["inputs_embeds", "attention_mask", "position_ids", *cache_names(layout, "past_key_values")]
    step: torch.nn.Module = KosmosStep(model)
    if _git(model):
        step, args = GitStep(model), (*args, torch.zeros(2, 3, dtype=torch.int64, device="meta"))
        dims["token_type_ids"] = {0: b, 1: s}
        names.append("token_type_ids")
    elif _patches(config):
        step, args = Kosmos25Step(model), (*args, torch.zeros(2, 3, dtype=torch.int64, device="meta"))
        dims["image_embeds_position_mask"] = {0: b, 1: s}
        names.append("image_embeds_position_mask")
    return GraphSpec(step, args, dims, names, ["logits", *cache_names(layout, "present")], layout)


def image_prefix_graphs(model: torch.nn.Module, config: Any) -> dict[str, GraphSpec]:
    """The three graphs of a ``PREFIX_FAMILIES`` model's package."""
    name, image = image_input(config, "meta")
    patches = {1: torch.export.Dim(PATCHES, min=1, max=1 << 16)} if _patches(config) else {}
    vision = GraphSpec(_Features(model), (image,), {"image": patches}, [name], ["image_features"])
    hidden, vocab = text_sizes(config)
    b = torch.export.Dim(BATCH, min=1, max=1024)
    s = torch.export.Dim(SEQUENCE, min=1, max=1 << 20)
    rows = torch.export.Dim(IMAGE_TOKENS, min=0, max=1 << 20)
    ids = torch.randint(0, vocab, (2, 5), device="meta")
    features = torch.zeros(3, hidden, device="meta")
    dims: dict[str, Any] = {"input_ids": {0: b, 1: s}, "image_features": {0: rows}}
    if _git(model):
        embed = GraphSpec(
            PrefixEmbeddings(model), (ids, features), dims, ["input_ids", "image_features"], ["inputs_embeds"]
        )
    else:
        dims["image_embeds_position_mask"] = {0: b, 1: s}
        embed = GraphSpec(
            PositionMaskEmbeddings(model),
            (ids, features, torch.zeros_like(ids)),
            dims,
            ["input_ids", "image_features", "image_embeds_position_mask"],
            ["inputs_embeds"],
        )
    return {VISION_FILE: vision, EMBED_FILE: embed, DECODER_FILE: _decoder(model, config)}


def check_plan(model: torch.nn.Module, config: Any, text: torch.Tensor, rows: int) -> dict[str, Any]:
    """What package_check's greedy loop needs for a ``PREFIX_FAMILIES`` model, one image of ``rows``
    feature rows and the prompt ``text``: the prompt's ids, ``generate``'s inputs besides the image, and
    the positions and extra inputs of each step (as package_check.Positions and Extra)."""
    if _git(model):  # the image before the whole prompt; text positions from 0

        def git_positions(step: int, past: int, length: int) -> torch.Tensor:
            if step == 0:
                return torch.cat(
                    [torch.zeros(rows, dtype=torch.int64), torch.arange(text.shape[1])]
                ).unsqueeze(0)
            return torch.arange(past - rows, past - rows + length).unsqueeze(0)

        def git_extra(step: int, step_ids: torch.Tensor, features: torch.Tensor) -> dict[str, torch.Tensor]:
            types = [torch.ones(1, features.shape[0], dtype=torch.int64), torch.zeros_like(step_ids)]
            return {"token_type_ids": torch.cat(types, dim=1)}

        return {"ids": text, "generate": {}, "positions": git_positions, "extra": git_extra}
    # Kosmos-2: the image's rows between the prompt's first two tokens and the rest, at marked tokens
    # (the processor's ids there: any; these avoid the special ones)
    ids = torch.cat([text[:, :2], torch.full((1, rows), 4), text[:, 2:]], dim=1)
    where = torch.zeros_like(ids)
    where[:, 2 : 2 + rows] = 1
    offset = position_offset(config)

    def kosmos_positions(step: int, past: int, length: int) -> torch.Tensor:
        return torch.arange(offset + past, offset + past + length).unsqueeze(0)

    def kosmos_extra(step: int, step_ids: torch.Tensor, features: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"image_embeds_position_mask": where if step == 0 else torch.zeros_like(step_ids)}

    return {
        "ids": ids,
        "generate": {"image_embeds_position_mask": where},
        "positions": kosmos_positions,
        "extra": kosmos_extra,
    }
