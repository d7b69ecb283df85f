"""image-text-to-text for Molmo 2, whose processor gives an image as crops (a low-resolution view of the
whole image, then overlapping high-resolution crops) and, for each image token, the patches it pools
(``image_token_pooling``: tokens x pool², indices into the crops' patches, -1 where a window overhangs the
canvas). vision_language.py's three files:

- ``vision_encoder.onnx``: ``pixel_values`` (crops x patches x 3·p², the crops' number dynamic) and
  ``image_token_pooling`` as the processor gives them (int32, the tokens' number dynamic) to
  ``image_features``. The tower runs each crop at its one size; the adapter only gathers with the indices:
  each token's patches (the -1 slots clipped and zeroed), their mean as the query of a cross-attention over
  them under the slots' mask, the projector, then the rows of the tokens with a patch at all
  (``pooled[valid_token_mask]``: a data-dependent row count, which ONNX shapes allow). transformers splits
  the rows per image by ``image_grids``' values and concatenates them back: the same rows in order, so the
  graph needs no grids, and several images (the processor offsets each one's indices) run in one call;
- ``embed_tokens.onnx``: the token embeddings with the image rows ADDED at the image patch tokens, in order
  (Molmo 2 keeps the placeholder's own embedding, ``inputs_embeds[mask] + image_features``);
- ``decoder_model_merged.onnx``: the step from ``inputs_embeds`` taking ``mm_token_type_ids`` too: in the
  prefill every image token (patches, column separators, the views' start and end tokens: type 1) attends
  to every other one, one block for all images (``block_sequence_ids``). transformers drops the block once
  the cache holds something, a Python branch a capture would fix; here the block ids are laid at the
  tokens' absolute positions (the past as no block), so a prefill gets the blocks and a step of one token
  (type 0 as the steps feed it, or a block of itself) a causal mask, as transformers' steps have.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import torch

from fastonnx.pretrained.decoder_cache import returned_cache
from fastonnx.pretrained.graph_spec import GraphSpec
from fastonnx.pretrained.vision_language import rows_placed

MOLMO_TYPES = ("molmo2",)
"""Model types whose package this module's graphs make."""

CROPS = "num_crops"
TYPES = "mm_token_type_ids"
POOL = (2, 2)
"""The processor's ``pooling_size``: the patches (rows x columns) an image token pools."""


def own_layout(model: torch.nn.Module) -> bool:
    return getattr(model.config, "model_type", None) in MOLMO_TYPES


def _pooled(grid: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """A grid of patch indices grouped into ``POOL`` windows (tokens x pool²), the grid padded with -1 to
    whole windows (half on each side, the extra one after), as the processor's ``arange_for_pooling``;
    and the pooled grid's rows and columns."""
    ph, pw = POOL
    pad_h, pad_w = -grid.shape[0] % ph, -grid.shape[1] % pw
    grid = torch.nn.functional.pad(
        grid, (pad_w // 2, (pad_w + 1) // 2, pad_h // 2, (pad_h + 1) // 2), mode="constant", value=-1
    )
    rows, columns = grid.shape[0] // ph, grid.shape[1] // pw
    windows = grid.reshape(rows, ph, columns, pw).permute(0, 2, 1, 3).reshape(rows * columns, ph * pw)
    return windows, rows, columns


def image_example(
    config: Any,
    device: str | torch.device,
    tiling: tuple[int, int] = (1, 2),
    margins: tuple[int, int] = (1, 0),
) -> dict[str, Any]:
    """One image in the processor's layout: the low-resolution view, then ``tiling`` crops overlapping by
    ``margins`` patches (each crop's inner margins dropped, the canvas laid out row by row), its pooling
    indices (-1 where a window overhangs an odd side) and ``image_grids`` (the pooled views' rows and
    columns); random pixels."""
    vision = config.vision_config
    side = int(round(int(vision.num_position_embeddings) ** 0.5))  # a crop's patches a side
    th, tw = tiling
    left, right = margins
    window = side - left - right
    index = torch.arange(th * tw * side * side, dtype=torch.int32).reshape(th, tw, side, side)
    if left:
        index[1:, :, :left, :] = -1
        index[:, 1:, :, :left] = -1
    if right:
        index[:-1, :, -right:, :] = -1
        index[:, :-1, :, -right:] = -1
    canvas = index.permute(0, 2, 1, 3).reshape(-1)
    canvas = canvas[canvas >= 0].reshape(th * window + left + right, tw * window + left + right)
    high, rows, columns = _pooled(canvas)
    low, low_rows, low_columns = _pooled(torch.arange(side * side, dtype=torch.int32).reshape(side, side))
    pooling = torch.cat([low, torch.where(high >= 0, high + side * side, -1)])
    patch = int(vision.num_channels) * int(vision.patch_size) ** 2
    g = torch.Generator().manual_seed(0)
    pixels = torch.randn(1 + th * tw, side * side, patch, generator=g)
    return {
        "pixel_values": pixels.to(device),
        "image_token_pooling": pooling.to(device),
        "image_grids": torch.tensor([[low_rows, low_columns, rows, columns]], device=device),
    }


def _cross_attention(attn: Any, query: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The adapter's pooling attention: each token's query (tokens x 1 x width) over its patches (tokens x
    pool² x width) under ``mask`` (tokens x pool², True where a patch is), keys and values grouped."""
    tokens, size = keys.shape[0], int(attn.head_dim)
    q = attn.q_proj(query).reshape(tokens, 1, -1, size).transpose(1, 2)
    k, v = (
        p(keys).reshape(tokens, keys.shape[1], -1, size).transpose(1, 2) for p in (attn.k_proj, attn.v_proj)
    )
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask[:, None, None, :], scale=float(attn.scaling)
    )
    result: torch.Tensor = attn.o_proj(out.transpose(1, 2).reshape(tokens, 1, -1))
    return result


def image_features(
    model: torch.nn.Module, pixel_values: torch.Tensor, image_token_pooling: torch.Tensor
) -> torch.Tensor:
    """transformers' ``get_image_features(...).pooler_output``, concatenated, without ``image_grids``."""
    inner: Any = getattr(model, "model", model)
    tower, adapter = inner.vision_tower, inner.multi_modal_projector
    hidden = tower.patch_embedding(pixel_values.to(tower.patch_embedding.weight.dtype))
    hidden = hidden + tower.positional_embedding[None].to(hidden)
    states = [hidden]
    for layer in tower.layers:
        hidden = layer(hidden, None)
        states.append(hidden)
    layers = inner.config.adapter_config.vision_feature_layer
    features = torch.cat([states[k + 1 if k >= 0 else k] for k in layers], dim=-1)
    flat = features.reshape(-1, features.shape[-1])

    index = image_token_pooling.to(torch.int64)
    valid = index >= 0
    patches = flat[index.clamp(min=0)] * valid.to(flat.dtype)[..., None]
    count = valid.to(torch.float32).sum(-1)
    count = torch.where(count == 0, 1, count)
    query = patches.sum(-2, keepdim=True) / count[:, None, None].to(patches.dtype)
    pooled = _cross_attention(adapter.image_pooling_2d, query, patches, valid).squeeze(1)
    rows: torch.Tensor = adapter.image_projector(pooled)[valid.any(-1)]
    return rows


class PooledImageFeatures(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model  # the model's own paths: the checkpoint's names

    def forward(self, pixel_values: torch.Tensor, image_token_pooling: torch.Tensor) -> torch.Tensor:
        return image_features(self.model, pixel_values, image_token_pooling)


def vision_spec(model: torch.nn.Module, config: Any) -> GraphSpec:
    image = image_example(config, "meta")
    crops = torch.export.Dim(CROPS, min=1, max=1 << 10)
    tokens = torch.export.Dim("num_pooled_tokens", min=1, max=1 << 20)
    return GraphSpec(
        PooledImageFeatures(model),
        (image["pixel_values"], image["image_token_pooling"]),
        {"pixel_values": {0: crops}, "image_token_pooling": {0: tokens}},
        ["pixel_values", "image_token_pooling"],
        ["image_features"],
    )


class AddedEmbeddings(torch.nn.Module):
    """The token embeddings with the image rows added at the image tokens, in order (vision_language.py's
    ``MergedEmbeddings`` puts them instead): a token past the rows (a step's) keeps its embedding."""

    def __init__(self, model: torch.nn.Module, token: int) -> None:
        super().__init__()
        self.model, self.token = model, token  # the model's own paths: the checkpoint's names

    def forward(self, input_ids: torch.Tensor, image_features: torch.Tensor) -> torch.Tensor:
        embeds: torch.Tensor = self.model.get_input_embeddings()(input_ids)  # type: ignore[operator]
        return embeds + rows_placed(torch.zeros_like(embeds), input_ids == self.token, image_features)


class ImageBlockStep(torch.nn.Module):
    """Molmo 2's step with its image tokens one block (the module's docstring): the mask as its forward
    makes it in a prefill, the language model over the embeddings and the head."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past_key_values: Any,
        mm_token_type_ids: torch.Tensor,
    ) -> tuple[torch.Tensor, Any]:
        model: Any = self.model
        masks = sys.modules[type(model.model).__module__]
        current = torch.where(mm_token_type_ids == 1, 0, -1)
        # at the absolute positions: the past (before this step's tokens) in no block
        at = torch.arange(attention_mask.shape[1], device=current.device) - (
            attention_mask.shape[1] - current.shape[1]
        )
        blocks = torch.where(at >= 0, current[:, at.clamp(min=0)], -1)
        mask = masks.create_causal_mask(
            config=model.config.get_text_config(),
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            past_key_values=past_key_values,
            position_ids=position_ids,
            block_sequence_ids=blocks,
        )
        out = model.model.language_model(
            inputs_embeds=inputs_embeds,
            attention_mask=mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            use_cache=True,
        )
        return model.lm_head(out.last_hidden_state), returned_cache(out)


def molmo_graphs(model: torch.nn.Module, config: Any) -> dict[str, GraphSpec]:
    """The three graphs of a ``MOLMO_TYPES`` model's package: vision_language.py's decoder, its step
    taking ``mm_token_type_ids`` too, and this module's vision encoder and added embeddings."""
    from fastonnx.pretrained import vision_language as vl

    token = vl.image_token_id(config)
    decoder = vl.embeds_decoder(model, config, token)
    b, s = decoder.dynamic_shapes["inputs_embeds"][0], decoder.dynamic_shapes["inputs_embeds"][1]
    hidden, vocab = vl.text_sizes(config)
    types = torch.zeros(tuple(decoder.args[0].shape[:2]), dtype=torch.int64, device="meta")
    decoder = dataclasses.replace(
        decoder,
        module=ImageBlockStep(model),
        args=(*decoder.args, types),
        dynamic_shapes={**decoder.dynamic_shapes, TYPES: {0: b, 1: s}},
        input_names=[*decoder.input_names, TYPES],
    )
    rows = torch.export.Dim(vl.IMAGE_TOKENS, min=0, max=1 << 20)
    embed = GraphSpec(
        AddedEmbeddings(model, token),
        (torch.randint(0, vocab, (2, 5), device="meta"), torch.zeros(3, hidden, device="meta")),
        {"input_ids": {0: b, 1: s}, "image_features": {0: rows}},
        ["input_ids", "image_features"],
        ["inputs_embeds"],
    )
    return {vl.VISION_FILE: vision_spec(model, config), vl.EMBED_FILE: embed, vl.DECODER_FILE: decoder}


def image_block(config: Any, grids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The processor's tokens of one image of ``image_grids`` row ``grids`` and their ``mm_token_type_ids``:
    the low-resolution view (its start token, each row's patch tokens and a column token, its end), then
    the crops' canvas alike between the image start and end tokens; all of them type 1. The column token
    is the one after the patch token (Molmo 2's tokenizer: ``<im_patch>``, ``<im_col>``)."""
    low_rows, low_columns, rows, columns = (int(v) for v in grids)
    patch = int(config.image_patch_id)
    column = patch + 1

    def view(start: int, height: int, width: int) -> list[int]:
        return [start, *([patch] * width + [column]) * height, int(config.image_end_token_id)]

    ids = view(int(config.low_res_image_start_token_id), low_rows, low_columns)
    ids += view(int(config.image_start_token_id), rows, columns)
    block = torch.tensor([ids])
    return block, torch.ones_like(block)


def check_package(
    sessions: dict[str, Any], model: Any, config: Any, specs: dict[str, GraphSpec], check: Any
) -> list[Any]:
    """One image of 3 crops (the view, and 1 x 2 crops whose canvas pads a side: -1 slots) and a prompt
    holding its block after 2 text tokens: the image's rows against transformers' ``get_image_features``,
    then a greedy generation of 6 tokens over the three files against ``generate`` (given the processor's
    ``mm_token_type_ids``): every step's logits, and the tokens. ``check``: package_check's module, passed
    in as it imports this one."""
    from fastonnx.diagnostics.verdicts import compare
    from fastonnx.pretrained import vision_language as vl

    pc = check
    image = image_example(config, "cpu")
    names = specs[vl.VISION_FILE].input_names
    (features,) = pc._run(sessions[vl.VISION_FILE], names, [image[n] for n in names])
    with torch.no_grad():
        out = model.get_image_features(**image, return_dict=True)
    infos = [compare("vision_encoder: image_features", torch.cat(out.pooler_output), features)]
    _, vocab = vl.text_sizes(config)
    text = torch.randint(3, vocab, (1, 6), generator=torch.Generator().manual_seed(1))
    block, block_types = image_block(config, image["image_grids"][0])
    for t in set(block[0].tolist()):
        text[text == t] = 3  # the image's tokens only where the image goes
    ids = torch.cat([text[:, :2], block, text[:, 2:]], dim=1)
    types = torch.cat([torch.zeros_like(text[:, :2]), block_types, torch.zeros_like(text[:, 2:])], dim=1)
    generated = pc._generate(model, ids, {**image, TYPES: types})

    def positions(step: int, past: int, length: int) -> torch.Tensor:
        return torch.arange(past, past + length).unsqueeze(0)

    def extra(step: int, step_ids: torch.Tensor, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        return {TYPES: types if step == 0 else torch.zeros_like(step_ids)}

    steps = pc._greedy_over_files(
        sessions, (vl.EMBED_FILE, "image_features"), specs[vl.DECODER_FILE], config, ids, features, generated
    )
    greedy: list[Any] = steps(positions, extra)
    return infos + greedy
