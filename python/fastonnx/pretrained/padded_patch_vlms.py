"""image-text-to-text for Gemma 4 and Gemma 4 Unified, whose processor gives an image as patches padded to
a fixed count (``max_soft_tokens`` x k² patches, ``image_position_ids`` (x, y) a patch and (-1, -1) on the
padding). vision_language.py's three files:

- ``vision_encoder.onnx``: one image's ``pixel_values`` (1 x patches x 3·p²) and ``image_position_ids``
  (1 x patches x 2) as the processor gives them, the patches' number dynamic (a multiple of the pooling's
  k² for Gemma 4), to ``image_features``, the image's real rows only: Gemma 4's tower pools each k x k block
  of real patches to a row and drops the pooled rows no real patch reached (``hidden_states[pooler_mask]``),
  Gemma 4 Unified keeps a row per real patch. Their number is read from the positions' values (a
  data-dependent size, which ONNX shapes allow), so the rows go to ``embed_tokens.onnx`` as they come,
  as many as the prompt's image tokens; several images: one call each, rows concatenated in order;
- ``embed_tokens.onnx``: vision_language.py's merge, the image, video and audio tokens looked up as the
  text's pad token (transformers' ``llm_input_ids``);
- ``decoder_model_merged.onnx``: the step from ``inputs_embeds`` taking ``input_ids`` too: Gemma 4's
  per-layer inputs are looked up from the ids (the placeholders as pad, their embeddings the pad token's
  row, as its forward does), and where the text config attends both ways within an image
  (``use_bidirectional_attention == "vision"``) the image tokens' blocks come from the ids, as
  ``mm_token_type_ids`` (1 at the image tokens) would give them (EmbedsStepWithImageBlocks' way).
"""

from __future__ import annotations

from typing import Any

import torch

from fastonnx.pretrained.decoder_cache import text_config
from fastonnx.pretrained.graph_spec import GraphSpec
from fastonnx.pretrained.vision_language import EmbedsStep, rows_placed

PADDED_PATCH_TYPES = ("gemma4", "gemma4_unified")
"""Model types whose package this module's graphs make."""

PATCHES = "num_patches"


def own_layout(model: torch.nn.Module) -> bool:
    return getattr(model.config, "model_type", None) in PADDED_PATCH_TYPES


def _unified(config: Any) -> bool:
    return getattr(config, "model_type", None) == "gemma4_unified"


def patch_sizes(config: Any) -> tuple[int, int]:
    """The pixels of one patch (3·p²) and the patches a row pools (k², 1 for Unified's merged patches)."""
    vision = config.vision_config
    if _unified(config):
        return 3 * int(vision.model_patch_size) ** 2, 1
    return tower_patch_sizes(vision)


def tower_patch_sizes(vision: Any) -> tuple[int, int]:
    """Gemma 4's tower's (its vision config's) pixels of one patch and patches a row pools."""
    return 3 * int(vision.patch_size) ** 2, int(vision.pooling_kernel_size) ** 2


def image_example(
    config: Any, device: str | torch.device, rows: int = 2, columns: int = 3, soft_tokens: int = 9
) -> dict[str, torch.Tensor]:
    """One image as the processor gives it: ``rows`` x ``columns`` soft tokens' patches, row by row with
    their (x, y), padded with zeros at (-1, -1) to ``soft_tokens`` soft tokens' patches."""
    return _padded_image(patch_sizes(config), device, rows, columns, soft_tokens)


def tower_image(vision: Any, rows: int, columns: int, soft_tokens: int) -> dict[str, torch.Tensor]:
    """``image_example``'s image for Gemma 4's tower alone (its vision config; towers_alone.py)."""
    return _padded_image(tower_patch_sizes(vision), "cpu", rows, columns, soft_tokens)


def _padded_image(
    sizes: tuple[int, int], device: str | torch.device, rows: int, columns: int, soft_tokens: int
) -> dict[str, torch.Tensor]:
    width, pooled = sizes
    k = int(round(pooled**0.5))
    high, wide = rows * k, columns * k
    real = high * wide
    total = soft_tokens * pooled
    g = torch.Generator().manual_seed(0)
    pixels = torch.zeros(1, total, width)
    pixels[0, :real] = torch.rand(real, width, generator=g)
    ys, xs = torch.meshgrid(torch.arange(high), torch.arange(wide), indexing="ij")
    positions = torch.full((1, total, 2), -1, dtype=torch.int64)
    positions[0, :real] = torch.stack([xs.reshape(-1), ys.reshape(-1)], dim=-1)
    return {"pixel_values": pixels.to(device), "image_position_ids": positions.to(device)}


def image_features(
    model: torch.nn.Module, pixel_values: torch.Tensor, image_position_ids: torch.Tensor
) -> torch.Tensor:
    """One image's real rows, as transformers' ``get_image_features`` makes them (its split by the
    images' counts, a ``.tolist()``, left out: one image)."""
    inner: Any = getattr(model, "model", model)
    if _unified(model.config):
        out = inner.embed_vision(pixel_values, image_position_ids).pooler_output
        rows: torch.Tensor = out[(image_position_ids != -1).all(dim=-1)]
        return rows
    states = inner.vision_tower(
        pixel_values=pixel_values, pixel_position_ids=image_position_ids
    ).last_hidden_state
    projected: torch.Tensor = inner.embed_vision(inputs_embeds=states)
    return projected.reshape(-1, projected.shape[-1])


class PaddedPatchFeatures(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor, image_position_ids: torch.Tensor) -> torch.Tensor:
        return image_features(self.model, pixel_values, image_position_ids)


def vision_spec(model: torch.nn.Module, config: Any) -> GraphSpec:
    image = image_example(config, "meta")
    _, pooled = patch_sizes(config)
    blocks = torch.export.Dim(PATCHES, min=1, max=1 << 16)
    patches = {1: pooled * blocks}
    return GraphSpec(
        PaddedPatchFeatures(model),
        tuple(image.values()),
        {"pixel_values": patches, "image_position_ids": patches},
        list(image),
        ["image_features"],
    )


def _placeholders(config: Any, input_ids: torch.Tensor) -> torch.Tensor:
    """Where transformers' ``get_placeholder_mask`` finds the image, video and audio tokens."""
    found = torch.zeros_like(input_ids, dtype=torch.bool)
    for name in ("image_token_id", "video_token_id", "audio_token_id"):
        if isinstance(token := getattr(config, name, None), int):
            found = found | (input_ids == token)
    return found


class PadPlaceholderEmbeddings(torch.nn.Module):
    """vision_language.MergedEmbeddings' merge, the placeholders looked up as the text's pad token."""

    def __init__(self, model: torch.nn.Module, token: int) -> None:
        super().__init__()
        self.model, self.token = model, token

    def forward(self, input_ids: torch.Tensor, image_features: torch.Tensor) -> torch.Tensor:
        pad = int(text_config(self.model.config).pad_token_id)
        looked_up = torch.where(_placeholders(self.model.config, input_ids), pad, input_ids)
        embeds: torch.Tensor = self.model.get_input_embeddings()(looked_up)  # type: ignore[operator]
        return rows_placed(embeds, input_ids == self.token, image_features)


class PerLayerInputsStep(EmbedsStep):
    """Gemma 4's step from the embeddings and the ids (see the module's docstring)."""

    def __init__(self, model: torch.nn.Module, token: int) -> None:
        super().__init__(model)
        self.token = token

    def forward(  # type: ignore[override]
        self,
        inputs_embeds: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past_key_values: Any,
        input_ids: torch.Tensor,
    ) -> tuple[torch.Tensor, Any]:
        model: Any = self.model
        text = text_config(model.config)
        language = model.model.language_model
        extra: dict[str, Any] = {}
        if getattr(text, "hidden_size_per_layer_input", None):
            found = _placeholders(model.config, input_ids)
            ids = torch.where(found, int(text.pad_token_id), input_ids)
            pad_row = language.embed_tokens.weight[int(text.pad_token_id), :]
            embeds = torch.where(found.unsqueeze(-1), pad_row.view(1, 1, -1), inputs_embeds)
            extra["per_layer_inputs"] = language.get_per_layer_inputs(ids, embeds)
        if getattr(text, "use_bidirectional_attention", None) == "vision":
            extra["mm_token_type_ids"] = (input_ids == self.token).to(torch.int64)
        return self.step(model, inputs_embeds, attention_mask, position_ids, past_key_values, **extra)


def padded_patch_graphs(model: torch.nn.Module, config: Any) -> dict[str, GraphSpec]:
    """The three graphs of a ``PADDED_PATCH_TYPES`` model's package: vision_language.py's decoder, its
    step taking the ids too."""
    import dataclasses

    from fastonnx.pretrained import vision_language as vl

    token = vl.image_token_id(config)
    decoder = vl.embeds_decoder(model, config, token)
    b, s = decoder.dynamic_shapes["inputs_embeds"][0], decoder.dynamic_shapes["inputs_embeds"][1]
    hidden, vocab = vl.text_sizes(config)
    ids = torch.randint(0, vocab, tuple(decoder.args[0].shape[:2]), device="meta")
    decoder = dataclasses.replace(
        decoder,
        module=PerLayerInputsStep(model, token),
        args=(*decoder.args, ids),
        dynamic_shapes={**decoder.dynamic_shapes, "input_ids": {0: b, 1: s}},
        input_names=[*decoder.input_names, "input_ids"],
    )
    rows = torch.export.Dim(vl.IMAGE_TOKENS, min=0, max=1 << 20)
    embed = GraphSpec(
        PadPlaceholderEmbeddings(model, token),
        (torch.randint(0, vocab, (2, 5), device="meta"), torch.zeros(3, hidden, device="meta")),
        {"input_ids": {0: b, 1: s}, "image_features": {0: rows}},
        ["input_ids", "image_features"],
        ["inputs_embeds"],
    )
    return {vl.VISION_FILE: vision_spec(model, config), vl.EMBED_FILE: embed, vl.DECODER_FILE: decoder}


def check_package(
    sessions: dict[str, Any], model: Any, config: Any, specs: dict[str, GraphSpec], check: Any
) -> list[Any]:
    """One padded image (6 soft tokens of 9) and a prompt holding its tokens after 2 text tokens: the
    image's rows against transformers' ``get_image_features``, then a greedy generation of 6 tokens over
    the three files against ``generate`` (given ``mm_token_type_ids``, as the processor makes them):
    every step's logits, and the tokens. ``check``: package_check's module, passed in as it imports
    this one."""
    from fastonnx.diagnostics.verdicts import compare
    from fastonnx.pretrained import vision_language as vl

    pc = check
    image = image_example(config, "cpu")
    names = specs[vl.VISION_FILE].input_names
    (features,) = pc._run(sessions[vl.VISION_FILE], names, [image[n] for n in names])
    with torch.no_grad():
        out = model.get_image_features(**image, return_dict=True)
    infos = [compare("vision_encoder: image_features", torch.cat(out.pooler_output), features)]
    token = vl.image_token_id(config)
    _, vocab = vl.text_sizes(config)
    text = torch.randint(3, vocab, (1, 6), generator=torch.Generator().manual_seed(1))
    text[_placeholders(config, text)] = 3
    ids = torch.cat([text[:, :2], torch.full((1, features.shape[0]), token), text[:, 2:]], dim=1)
    types = (ids == token).to(torch.int64)
    generated = pc._generate(model, ids, {**image, "mm_token_type_ids": types})

    def positions(step: int, past: int, length: int) -> torch.Tensor:
        return torch.arange(past, past + length).unsqueeze(0)

    def extra(step: int, step_ids: torch.Tensor, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"input_ids": step_ids}

    steps = pc._greedy_over_files(
        sessions, (vl.EMBED_FILE, "image_features"), specs[vl.DECODER_FILE], config, ids, features, generated
    )
    greedy: list[Any] = steps(positions, extra)
    return infos + greedy
