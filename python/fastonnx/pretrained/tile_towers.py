"""The vision encoders of the tiled-image models (Idefics2, Idefics3, SmolVLM, Granite Docling) as one
graph over one image's tiles, the layout transformers.js ships.

Their processors cut an image into tiles (Idefics3 and SmolVLM: a grid of tiles of the vision config's
``image_size``, plus a global view of that size; Idefics2 splitting an image into 4 crops and the
image), padded to the largest in the batch; ``pixel_attention_mask`` marks each tile's real pixels. The
graph takes:

- ``pixel_values``: ``num_tiles`` x channels x height x width, the tiles of one image (``num_tiles``
  dynamic: an image of another size has more tiles). Idefics3's and SmolVLM's tiles are ``image_size``
  square (their connector's pixel shuffle reads the side from the square patch count); Idefics2's are of
  any size, height and width dynamic (its perceiver resamples any number of patches to its latents);
- ``pixel_attention_mask``: ``num_tiles`` x height x width, 1 at real pixels (int64, the processor's);

and gives ``image_features``: every tile's features as rows, ``num_tiles`` x tokens per tile x hidden
flattened to rows, the order of the tiles (that of the image tokens the processor writes).

What ``get_image_features`` does from data, and what the graph does instead:

- it drops padding tiles (all pixels 0) by a boolean index ``real_images_inds``, whose size is data, and
  splits the rows by ``num_real_images_per_batch.tolist()``. Padding tiles come only from padding a batch of
  images to the same tile count; the graph encodes one image a call, whose tiles are all real, so it takes
  real tiles only and encodes every tile it is given (a caller batching images drops its padding tiles
  before, as it knows them). A real tile whose pixels are all exactly 0 would be dropped by transformers
  and kept here: normalized pixels of a real image are not all 0;
- the patch mask (a patch is real where any of its pixels is, Idefics2: where all are) from
  ``pixel_attention_mask.unfold`` and a sum, and the patch positions (the patch counts of each tile's first
  row and column, bucketed into the position table): tensor arithmetic of the mask's values, traced as is.

Granite Docling's tiles are always the vision config's size, its ``pixel_attention_mask`` (batch x tiles)
only marks the batch's padding tiles: its graph takes ``pixel_values`` alone, one image's real tiles, and
gives its tower's rows and, where its config taps encoder layers, ``deepstack_features`` (layers x rows x
hidden), which the decoder adds at the image tokens of its first layers as Qwen3-VL's does
(vision_language.py's ``DeepstackStep``). Its graph is the coarse path, the processor's default: the
fine path (``fine_route=True``, four times the tokens a tile) is a second connector the processor picks
for a whole batch, not exported.

LFM2-VL's tower is SigLIP2's NaFlex: each tile (a split image's tiles and thumbnail, or an unsplit image)
comes as its patches, ``spatial_shapes`` its rows and columns in patches, padded to the batch's longest
(``pixel_attention_mask``). transformers resizes the position table to each tile's shape by
``spatial_shapes[i].tolist()`` (bilinear, antialiased) and cuts and reshapes each tile's rows by those
values: sizes from data. Its graph takes one tile a call, unpadded (a split image runs it once per tile
and concatenates the rows in order, as the processor writes the tiles' image tokens): ``pixel_values`` 1 x
patches x channels · patch² (patches dynamic, a multiple of the downsample factor²) and ``spatial_shapes``
1 x 2 (int64); from their values, as grid_vision.py does for Qwen-VL's grids: patch ``k`` lies at row
``k // w``, column ``k % w``; its position is the table resampled by antialiased bilinear weights computed
from the shape (capture/naflex_positions.py's ``antialiased_taps``: every table row's weight, a table of a few rows a side); the
projector's pixel unshuffle is a gather of each merged token's factor² patches. Its output is the tile's
features, patches / factor² x hidden.

Aria's processor resizes each crop (one an image; several where it splits the image) into a square tile of
``max_image_size`` pixels (490 or 980), pads it at the bottom and right, and gives ``pixel_mask`` (tiles x
height x width, bool: the real pixels); its tower (Idefics3's) reads the patch mask (a patch real where any
pixel is) as the patch attention mask and position buckets, its projector attends from a number of
queries picked by the tile's patch count (``projector_patch_to_query_dict``: a Python lookup, fixed by the
tile's size) to the real patches only. Its graph takes one image's tiles, ``pixel_values`` ``num_tiles`` x
channels x side x side and ``pixel_mask`` ``num_tiles`` x side x side (``num_tiles`` dynamic), the side
that of the processor's default 980 pixel tiles: the dict's largest patch count, a square of patches; it
gives every tile's query rows in order, as the processor writes each tile's image tokens.

LLaVA-OneVision, whose feature rows are a function of ``image_sizes``' values, is anyres_towers.py's.
"""

from __future__ import annotations

from typing import Any

import torch

from fastonnx.capture.naflex_positions import naflex_embeddings_forward
from fastonnx.pretrained.graph_spec import GraphSpec

TILES = "num_tiles"


def _inner(model: torch.nn.Module) -> Any:
    return getattr(model, "model", model)


def granite_tiles(model: torch.nn.Module) -> bool:
    """Whether the model's tower is Granite Docling's: a ``vision_model`` holding its ``connector`` and
    encoding real tiles of one size (``encode``)."""
    vision = getattr(_inner(model), "vision_model", None)
    return hasattr(vision, "encode") and isinstance(getattr(vision, "connector", None), torch.nn.Module)


def tile_deepstack_layers(model: torch.nn.Module) -> int:
    """How many deepstack features Granite Docling's tower gives (the encoder layers its config taps that
    the tower has, each with a merger), 0 for none or another tower."""
    if not granite_tiles(model):
        return 0
    vision: Any = _inner(model).vision_model
    taps = [i for i in range(len(vision.encoder.layers)) if i in vision.config.deepstack_visual_indexes]
    return min(len(taps), len(vision.connector.coarse.deepstack_mergers))


def naflex_tiles(model: torch.nn.Module) -> bool:
    """Whether the model's tower is LFM2-VL's: SigLIP2's NaFlex ``vision_tower`` (a position table
    resized to each tile's ``spatial_shapes``) under a pixel-unshuffling ``multi_modal_projector``."""
    inner = _inner(model)
    embeddings = getattr(getattr(inner, "vision_tower", None), "embeddings", None)
    return hasattr(embeddings, "resize_positional_embeddings") and hasattr(
        getattr(inner, "multi_modal_projector", None), "pixel_unshuffle"
    )


def aria_tiles(model: torch.nn.Module) -> bool:
    """Whether the model's tower is Aria's: a projector whose queries are picked by the tile's patch count
    (``patch_to_query_dict``) over a tower taking a patch mask."""
    projector = getattr(_inner(model), "multi_modal_projector", None)
    return isinstance(getattr(projector, "patch_to_query_dict", None), dict)


def aria_side(model: torch.nn.Module) -> int:
    """The side in pixels of Aria's tiles: the processor's default (980), the largest patch count its
    projector knows, a square of patches."""
    inner = _inner(model)
    patches = max(int(k) for k in inner.multi_modal_projector.patch_to_query_dict)
    side = round(patches**0.5)
    return int(side * int(inner.config.vision_config.patch_size))


class AriaTileEncoder(torch.nn.Module):
    """Aria's ``get_image_features`` of one image's tiles and their pixel mask, as rows (the module
    docstring): its forward's layer (``vision_feature_layer``)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model  # the model's own paths: the checkpoint's names

    def forward(self, pixel_values: torch.Tensor, pixel_mask: torch.Tensor) -> torch.Tensor:
        inner = _inner(self.model)
        out = inner.get_image_features(
            pixel_values=pixel_values,
            pixel_mask=pixel_mask,
            vision_feature_layer=inner.config.vision_feature_layer,
            return_dict=True,
        )
        rows: torch.Tensor = out.pooler_output.reshape(-1, out.pooler_output.shape[-1])
        return rows


def tile_tower(model: torch.nn.Module) -> bool:
    """Whether the model's images are tiles this module exports: Granite Docling's, Aria's, or
    Idefics-style (a variable-resolution SigLIP ``vision_model``, its embeddings bucketing positions by the
    patch mask, and a ``connector``)."""
    if granite_tiles(model) or naflex_tiles(model) or aria_tiles(model):
        return True
    inner = _inner(model)
    embeddings = getattr(getattr(inner, "vision_model", None), "embeddings", None)
    connector = getattr(inner, "connector", None)
    return (
        hasattr(embeddings, "num_patches_per_side")
        and hasattr(embeddings, "position_embedding")
        and isinstance(connector, torch.nn.Module)
        and hasattr(connector, "modality_projection")
    )


def _resampled(model: torch.nn.Module) -> bool:
    """Idefics2's connector: a perceiver over the patches, which reads the patch mask."""
    return hasattr(getattr(_inner(model), "connector", None), "perceiver_resampler")


def patch_mask(pixel_attention_mask: torch.Tensor, patch: int, every_pixel: bool) -> torch.Tensor:
    """Which patches of each tile are real, tiles x rows x columns in patches: transformers' unfold of the
    pixel mask into patches, a patch real where any pixel is (Idefics3), or every pixel (Idefics2)."""
    cells = pixel_attention_mask.unfold(1, patch, patch).unfold(2, patch, patch).sum(dim=(-1, -2))
    return cells == patch * patch if every_pixel else cells > 0


class TileVisionEncoder(torch.nn.Module):
    """``get_image_features`` of one image's real tiles (the module docstring)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model  # the model's own paths: the checkpoint's names
        self.resampled = _resampled(model)

    def forward(self, pixel_values: torch.Tensor, pixel_attention_mask: torch.Tensor) -> torch.Tensor:
        inner = _inner(self.model)
        patch = int(inner.config.vision_config.patch_size)
        mask = patch_mask(pixel_attention_mask, patch, self.resampled)
        states = inner.vision_model(
            pixel_values=pixel_values.to(inner.dtype), patch_attention_mask=mask, return_dict=True
        ).last_hidden_state
        if self.resampled:
            features = inner.connector(states, attention_mask=mask.reshape(mask.shape[0], -1))
        else:
            features = inner.connector(states)
        rows: torch.Tensor = features.reshape(-1, features.shape[-1])
        return rows


class GraniteTileEncoder(torch.nn.Module):
    """Granite Docling's tower on one image's real tiles: its rows, and its deepstack rows where it has
    them (the module docstring)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model  # the model's own paths: the checkpoint's names
        self.deepstack = tile_deepstack_layers(model)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        inner = _inner(self.model)
        out = inner.vision_model(pixel_values=pixel_values.to(inner.dtype), fine=False, return_dict=True)
        rows: torch.Tensor = out.pooler_output
        if self.deepstack:
            return rows, torch.stack(list(out.deepstack_features))
        return rows


class NaflexTileEncoder(torch.nn.Module):
    """LFM2-VL's tower and projector on one unpadded tile, its shape from ``spatial_shapes``' values (the
    module docstring)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model  # the model's own paths: the checkpoint's names

    def forward(self, pixel_values: torch.Tensor, spatial_shapes: torch.Tensor) -> torch.Tensor:
        inner = _inner(self.model)
        tower, projector = inner.vision_tower, inner.multi_modal_projector
        patches, w = pixel_values.shape[1], spatial_shapes[0, 1]
        # one unpadded tile: SigLIP 2's embeddings with the per-image positions of naflex_positions.py
        hidden = naflex_embeddings_forward(tower.embeddings, pixel_values, spatial_shapes)
        hidden = tower.encoder(inputs_embeds=hidden, attention_mask=None).last_hidden_state
        hidden = tower.post_layernorm(hidden)[0]

        # the projector's pixel unshuffle: each merged token's f x f patches, rows then columns
        f = int(projector.factor)
        tokens = torch.arange(patches // (f * f), device=pixel_values.device)
        t_row, t_column = tokens // (w // f), tokens % (w // f)
        within = torch.arange(f * f, device=pixel_values.device)
        index = (t_row[:, None] * f + within // f) * w + t_column[:, None] * f + within % f
        blocks = hidden[index.reshape(-1)].reshape(tokens.shape[0], -1)
        if projector.use_layer_norm:
            blocks = projector.layer_norm(blocks)
        result: torch.Tensor = projector.linear_2(projector.act(projector.linear_1(blocks)))
        return result


def tile_inputs(model: torch.nn.Module, tiles: int, device: str | torch.device) -> dict[str, torch.Tensor]:
    """What transformers' forward takes for one image of ``tiles`` tiles of the vision config's size
    (1 x tiles x ...): the last tile padded (its real pixels a little more than the top three quarters
    and the left half, 0 elsewhere, as a processor pads), so that the patch mask (partly real patches
    too) and the positions it gives are exercised."""
    vision = _inner(model).config.vision_config
    if naflex_tiles(model):  # one tile a call: of 4 x 6 patches
        return naflex_inputs(model, 4, 6, device)
    if aria_tiles(model):
        return aria_inputs(model, tiles, device)
    size, channels = int(vision.image_size), int(getattr(vision, "num_channels", 3))
    g = torch.Generator().manual_seed(0)
    pixels = torch.randn(1, tiles, channels, size, size, generator=g)
    if granite_tiles(model):  # its mask: which of the batch's tiles are real
        return {
            "pixel_values": pixels.to(device),
            "pixel_attention_mask": torch.ones(1, tiles, dtype=torch.bool, device=device),
        }
    mask = torch.ones(1, tiles, size, size, dtype=torch.int64)
    if tiles > 1:
        mask[0, -1, size * 3 // 4 + 1 :] = 0
        mask[0, -1, :, size // 2 + 1 :] = 0
        pixels[0, -1] *= mask[0, -1]
    return {"pixel_values": pixels.to(device), "pixel_attention_mask": mask.to(device)}


def aria_inputs(model: torch.nn.Module, tiles: int, device: str | torch.device) -> dict[str, torch.Tensor]:
    """What transformers' forward takes for one Aria image of ``tiles`` tiles (tiles x ..., no batch): the
    last one padded as its processor pads a wide crop (its real rows a little more than the top half), the
    others whole."""
    side = aria_side(model)
    channels = int(getattr(_inner(model).config.vision_config, "num_channels", 3))
    pixels = torch.randn(tiles, channels, side, side, generator=torch.Generator().manual_seed(tiles))
    mask = torch.ones(tiles, side, side, dtype=torch.bool)
    mask[-1, side // 2 + 3 :] = False
    pixels[-1] *= mask[-1]
    return {"pixel_values": pixels.to(device), "pixel_mask": mask.to(device)}


def naflex_inputs(
    model: torch.nn.Module, h: int, w: int, device: str | torch.device
) -> dict[str, torch.Tensor]:
    """What transformers' forward takes for one LFM2-VL tile of ``h`` x ``w`` patches, unpadded."""
    vision = _inner(model).config.vision_config
    width = int(getattr(vision, "num_channels", 3)) * int(vision.patch_size) ** 2
    pixels = torch.randn(1, h * w, width, generator=torch.Generator().manual_seed(h * w))
    return {
        "pixel_values": pixels.to(device),
        "spatial_shapes": torch.tensor([[h, w]], device=device),
        "pixel_attention_mask": torch.ones(1, h * w, dtype=torch.bool, device=device),
    }


def tile_feeds(model: torch.nn.Module, images: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """The vision encoder's inputs for ``tile_inputs``' image: its tiles without transformers' batch
    (and their pixel mask, but for Granite Docling)."""
    if naflex_tiles(model):  # one tile, its batch of 1 kept, as the processor's
        return [images["pixel_values"], images["spatial_shapes"]]
    if aria_tiles(model):  # the processor's, without a batch
        return [images["pixel_values"], images["pixel_mask"]]
    names = ["pixel_values"] if granite_tiles(model) else ["pixel_values", "pixel_attention_mask"]
    return [images[n].flatten(0, 1) for n in names]


def tile_spec(model: torch.nn.Module) -> GraphSpec:
    """``vision_encoder.onnx`` of a tiled-image model: one image's tiles to their features' rows."""
    tiles = torch.export.Dim(TILES, min=1, max=1024)
    feeds = tile_feeds(model, tile_inputs(model, 2, "meta"))
    if granite_tiles(model):
        deepstack = ["deepstack_features"] if tile_deepstack_layers(model) else []
        return GraphSpec(
            GraniteTileEncoder(model),
            (feeds[0],),
            {"pixel_values": {0: tiles}},
            ["pixel_values"],
            ["image_features", *deepstack],
        )
    if naflex_tiles(model):
        f = int(_inner(model).multi_modal_projector.factor)
        tokens = torch.export.Dim("num_image_tokens", min=1, max=1 << 16)
        return GraphSpec(
            NaflexTileEncoder(model),
            tuple(feeds),
            {"pixel_values": {1: f * f * tokens}, "spatial_shapes": {}},
            ["pixel_values", "spatial_shapes"],
            ["image_features"],
        )
    if aria_tiles(model):
        return GraphSpec(
            AriaTileEncoder(model),
            tuple(feeds),
            {"pixel_values": {0: tiles}, "pixel_mask": {0: tiles}},
            ["pixel_values", "pixel_mask"],
            ["image_features"],
        )
    pixels, mask = feeds
    config: Any = _inner(model).config
    pixel_dims: dict[int, Any] = {0: tiles}
    mask_dims: dict[int, Any] = {0: tiles}
    if _resampled(model):  # Idefics2's tiles are of any size
        patch = int(config.vision_config.patch_size)
        height = torch.export.Dim("height", min=patch, max=1 << 14)
        width = torch.export.Dim("width", min=patch, max=1 << 14)
        pixel_dims.update({2: height, 3: width})
        mask_dims.update({1: height, 2: width})
    return GraphSpec(
        TileVisionEncoder(model),
        (pixels, mask),
        {"pixel_values": pixel_dims, "pixel_attention_mask": mask_dims},
        ["pixel_values", "pixel_attention_mask"],
        ["image_features"],
    )
