"""The vision encoders of the anyres models (LLaVA-NeXT, LLaVA-NeXT-Video, LLaVA-OneVision, Granite 4
Vision) as one graph over one image's tiles and its original size.

Their processors resize an image to the best of ``image_grid_pinpoints`` for its original size, cut it
into tiles of the vision config's ``image_size`` and put a base view (the whole image at that size)
first. transformers' ``get_image_features`` encodes every tile, then ``pack_image_features`` lays the
tiles' features out as the image's grid of patches, crops the grid's padding (``unpad_image``), shrinks
a grid larger than ``anyres_max_N`` allows (OneVision's bilinear downscale), appends ``image_newline``
to each row and puts the base view's rows first. The graph takes:

- ``pixel_values``: ``num_tiles`` x channels x height x width, one image's tiles as the processor
  gives them, base view first (``num_tiles`` dynamic: 1 + the grid's tiles, or 1: below);
- ``image_sizes``: 1 x 2 (int64), the image's original height and width;

and gives ``image_features``: the packed rows, as many as the image tokens the processor writes.

Everything transformers decides from ``image_sizes``' values in Python (``.tolist()``) is tensor
arithmetic over them here, so one package takes an image of any size:

- the best pinpoint (``select_best_resolution``): every pinpoint's effective and wasted resolution, in
  float64 as Python computes them (so the truncations agree), the first of the largest effective and
  then least wasted; its grid of tiles is the pinpoint over ``image_size``;
- the crop (``unpad_image``): the kept rows or columns of the grid of patches, from the aspect ratios
  (``int(round(x, 7))`` as ``floor(x + 5e-8)``: the same integer unless ``x``'s fraction is, within
  float error, exactly 1 - 5e-8, a tie of rounding to 7 decimals);
- OneVision's downscale: the output rows and columns ``floor(kept / ratio)`` where the ratio is past
  1.1, each output patch the bilinear blend (``align_corners=False``) of four kept patches, the weights
  ``F.interpolate`` computes in float32 (where there is no downscale, the weights are 1 and 0: the patch);
- the packing: every position of the largest grid the pinpoints allow (plus a newline column) is
  marked where the image's packed grid has it, and ``nonzero`` lists the marked ones in row order: the
  row count is data (an unbacked size of the capture), each row a gather of its tile's patch (or of
  ``image_newline``).

A caller passing fewer tiles than the image's size asks for gets an out-of-range gather (an error), not
a silent wrong answer (extra tiles are ignored, as transformers slices them off). One image a call: a batch's images have their own grids. A single tile (the base
view alone) gives its rows and one newline, transformers' packing of an untiled image: LLaVA-OneVision
does not tile the images of a sample holding several (``batch_num_images``), and a caller runs the graph
on each one's base view then; the graph tiles exactly where it is given tiles.

Granite 4 Vision packs its tiles alike (its projectors' tiles downsampled by ``downsample_rate``), but
gives no rows for the image tokens: its forward zeroes their embeddings and adds packed rows to the hidden
states at them before some of its decoder layers (``deepstack_features``: one pair of layer and rows per
projector, a later pair for a layer replacing an earlier, as its dict of them does). Its graph gives
``image_features`` (zeros, as many rows as the image's tokens: the embeddings ``embed_tokens.onnx`` puts
there) and ``deepstack_features`` (layers x rows x hidden, the layers in ``granite_layers``' order); its
decoder (``HookedDeepstackStep``) takes ``input_ids`` and ``deepstack_features`` (0 rows on the steps)
and adds each layer's rows, scattered to the image tokens with zeros elsewhere, before that layer.
"""

from __future__ import annotations

from typing import Any

import torch

from fastonnx.pretrained.graph_spec import GraphSpec

TILES = "num_tiles"
SIZES = "image_sizes"


def _inner(model: torch.nn.Module) -> Any:
    return getattr(model, "model", model)


def anyres_tower(model: torch.nn.Module) -> bool:
    """Whether the model's images are anyres tiles this module exports: a ``pack_image_features`` laying
    out tiles by ``image_grid_pinpoints`` with an ``image_newline``, over a ``vision_tower`` and one
    ``multi_modal_projector`` (or Granite 4 Vision's projectors: ``granite_layers``)."""
    inner = _inner(model)
    config = getattr(inner, "config", None)
    return (
        callable(getattr(inner, "pack_image_features", None))
        and bool(getattr(config, "image_grid_pinpoints", None))
        and isinstance(getattr(inner, "image_newline", None), torch.nn.Parameter)
        and isinstance(getattr(inner, "vision_tower", None), torch.nn.Module)
        and (
            isinstance(getattr(inner, "multi_modal_projector", None), torch.nn.Module)
            or bool(granite_layers(model))
        )
    )


def granite_layers(model: torch.nn.Module) -> dict[int, int]:
    """Granite 4 Vision's decoder layers that take packed rows, each with the projector whose rows it
    takes (its layer-wise projectors, then its spatial ones, numbered in that order; a later one for a
    layer replacing an earlier, as its forward's dict does); empty for another model."""
    inner = _inner(model)
    if not isinstance(getattr(inner, "spatial_projectors", None), torch.nn.ModuleList):
        return {}
    config = inner.config
    targets = [llm for _, llm in config.deepstack_layer_map] + list(config.spatial_target_layers)
    return {int(layer): k for k, layer in enumerate(targets)}


def max_patches(config: Any) -> int | None:
    """OneVision's ``anyres_max_N``: how many tiles' worth of patches a packed grid may hold (None: no
    downscale, LLaVA-NeXT's)."""
    ratio = getattr(config, "vision_aspect_ratio", None)
    if not isinstance(ratio, str) or not ratio.startswith("anyres_max_"):
        return None
    return int(ratio.removeprefix("anyres_max_"))


def best_grid(sizes: torch.Tensor, pinpoints: list[list[int]], side: int) -> tuple[torch.Tensor, ...]:
    """The grid of tiles (rows, columns) of an image of ``sizes`` (height, width: a 2-vector): transformers'
    ``select_best_resolution`` over ``pinpoints`` (height, width), in float64 as Python's floats."""
    points = torch.tensor(pinpoints, dtype=torch.float64, device=sizes.device)
    height, width = sizes[0].to(torch.float64), sizes[1].to(torch.float64)
    scale = torch.minimum(points[:, 1] / width, points[:, 0] / height)
    down_w, down_h = torch.trunc(width * scale), torch.trunc(height * scale)
    effective = torch.minimum(down_w * down_h, width * height)
    wasted = points[:, 0] * points[:, 1] - effective
    best = effective == effective.max()
    least = torch.where(best, wasted, torch.inf).min()
    pick = torch.argmax((best & (wasted == least)).to(torch.int64))  # the first, as the loop keeps it
    chosen = torch.tensor(pinpoints, dtype=torch.int64, device=sizes.device)[pick]
    return chosen[0] // side, chosen[1] // side


def _unpadded(sizes: torch.Tensor, rows: torch.Tensor, columns: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The kept window (top, bottom, left, right) of a ``rows`` x ``columns`` grid of patches holding an
    image of ``sizes``: transformers' ``unpad_image``."""
    height, width = sizes[0].to(torch.float64), sizes[1].to(torch.float64)
    rows_f, columns_f = rows.to(torch.float64), columns.to(torch.float64)
    wide = width / height > columns_f / rows_f
    # int(round(x, 7)): x rounded to 7 decimals, truncated
    new_h = torch.floor(height * (columns_f / width) + 5e-8).to(torch.int64)
    new_w = torch.floor(width * (rows_f / height) + 5e-8).to(torch.int64)
    pad_h = torch.where(wide, (rows - new_h) // 2, 0)
    pad_w = torch.where(wide, 0, (columns - new_w) // 2)
    return pad_h, rows - pad_h, pad_w, columns - pad_w


def _bilinear_taps(out: torch.Tensor, size: torch.Tensor, index: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``F.interpolate``'s bilinear source (``align_corners=False``, a size given) of output ``index`` of
    an axis from ``size`` to ``out``: the two source indices and their weights, in float32 as its kernel."""
    scale = size.to(torch.float32) / out.to(torch.float32)
    source = torch.clamp(scale * (index.to(torch.float32) + 0.5) - 0.5, min=0)
    low = source.to(torch.int64)
    high = low + (low < size - 1).to(torch.int64)
    weight = source - low.to(torch.float32)
    return low, high, 1 - weight, weight


def packed_rows(
    features: torch.Tensor,
    sizes: torch.Tensor,
    newline: torch.Tensor,
    pinpoints: list[list[int]],
    side: int,
    tile_side: tuple[int, int],
    most: int | None,
) -> torch.Tensor:
    """transformers' ``pack_image_features`` of one image: ``features`` (tiles x patches x hidden, the base
    view first) of an image of ``sizes`` (height, width) packed to rows (the module docstring). ``side``
    is a tile's pixels, ``tile_side`` its patches (rows, columns), ``most`` OneVision's ``anyres_max``."""
    h, w = tile_side
    tiles, per_tile, width = features.shape
    grid_h, grid_w = best_grid(sizes, pinpoints, side)
    top, bottom, left, right = _unpadded(sizes, grid_h * h, grid_w * w)
    kept_h, kept_w = bottom - top, right - left
    out_h, out_w = kept_h, kept_w
    if most is not None:
        area = (kept_h * kept_w).to(torch.float64) / float(most * h * h)
        ratio = torch.sqrt(area)
        shrink = ratio > 1.1
        out_h = torch.where(shrink, torch.floor(kept_h.to(torch.float64) / ratio).to(torch.int64), kept_h)
        out_w = torch.where(shrink, torch.floor(kept_w.to(torch.float64) / ratio).to(torch.int64), kept_w)

    # every position of the largest grid, a newline column after it; the packed grid's, in row order
    most_h = max(p[0] // side for p in pinpoints) * h
    most_w = max(p[1] // side for p in pinpoints) * w
    i = torch.arange(most_h, device=features.device)[:, None]
    j = torch.arange(most_w + 1, device=features.device)[None, :]
    # the base view alone (OneVision's images of a several-image sample: not tiled) is followed by one
    # newline: the position past the grid, marked instead of the grid
    alone = torch.ones(1, dtype=torch.int64, device=features.device) * tiles == 1
    marked = (i < out_h) & ((j < out_w) | (j == most_w)) & ~alone
    at = torch.nonzero(torch.cat([marked.reshape(-1), alone])).reshape(-1)
    row, column = at // (most_w + 1), at % (most_w + 1)
    is_newline = (column == most_w) | alone

    table = torch.cat([features.reshape(tiles * per_tile, width), newline.to(features.dtype)[None]])
    newline_at = tiles * per_tile

    def source(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The table's row of the grid's patch (``y``, ``x``) in the kept window; the newline's for the
        newline column."""
        y, x = y + top, x + left
        flat = (1 + (y // h) * grid_w + x // w) * per_tile + (y % h) * w + x % w
        return table[torch.where(is_newline, newline_at, flat)]

    if most is None:
        picked = source(row, column)
    else:
        y0, y1, wy0, wy1 = _bilinear_taps(out_h, kept_h, row)
        x0, x1, wx0, wx1 = _bilinear_taps(out_w, kept_w, column)
        wy0, wy1, wx0, wx1 = (t.to(features.dtype)[:, None] for t in (wy0, wy1, wx0, wx1))
        blended = wy0 * (wx0 * source(y0, x0) + wx1 * source(y0, x1)) + wy1 * (
            wx0 * source(y1, x0) + wx1 * source(y1, x1)
        )
        picked = torch.where(is_newline[:, None], table[newline_at][None], blended)
    return torch.cat([features[0], picked])


def tower_features(model: torch.nn.Module, pixel_values: torch.Tensor) -> torch.Tensor:
    """Every tile's projected features, tiles x patches x hidden: ``get_image_features`` before the
    packing (the config's feature layers and select strategy)."""
    inner = _inner(model)
    config = inner.config
    out = inner.vision_tower(pixel_values, output_hidden_states=True, return_dict=True)
    layer = config.vision_feature_layer
    if isinstance(layer, int):
        chosen = out.hidden_states[layer]
    else:
        chosen = torch.cat([out.hidden_states[k] for k in layer], dim=-1)
    if config.vision_feature_select_strategy == "default":
        chosen = chosen[:, 1:]
    projected: torch.Tensor = inner.multi_modal_projector(chosen)
    return projected


class AnyresVisionEncoder(torch.nn.Module):
    """``get_image_features`` of one image's tiles and original size (the module docstring)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model  # the model's own paths: the checkpoint's names

    def forward(self, pixel_values: torch.Tensor, image_sizes: torch.Tensor) -> torch.Tensor:
        inner = _inner(self.model)
        config = inner.config
        vision = config.vision_config
        side, patch = int(vision.image_size), int(vision.patch_size)
        features = tower_features(self.model, pixel_values.to(inner.dtype))
        return packed_rows(
            features,
            image_sizes[0],
            inner.image_newline,
            [list(p) for p in config.image_grid_pinpoints],
            side,
            (side // patch, side // patch),
            max_patches(config),
        )


def _granite_rows(model: torch.nn.Module, pixel_values: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
    """Granite 4 Vision's packed rows of each projector ``granite_layers`` names, in its layers' order:
    layers x rows x hidden."""
    from fractions import Fraction

    inner = _inner(model)
    config = inner.config
    vision = config.vision_config
    side, patch = int(vision.image_size), int(vision.patch_size)
    tile = int(side // patch * Fraction(config.downsample_rate))
    out = inner.vision_tower(pixel_values, output_hidden_states=True, return_dict=True)
    sources = [
        (layer, inner.layerwise_projectors[k]) for k, (layer, _) in enumerate(config.deepstack_layer_map)
    ]
    sources += [(config.spatial_vision_layer, projector) for projector in inner.spatial_projectors]
    rows = []
    for k in granite_layers(model).values():
        layer, projector = sources[k]
        chosen = out.hidden_states[layer]
        if config.vision_feature_select_strategy == "default":
            chosen = chosen[:, 1:]
        pinpoints = [list(p) for p in config.image_grid_pinpoints]
        rows.append(
            packed_rows(projector(chosen), sizes, inner.image_newline, pinpoints, side, (tile, tile), None)
        )
    return torch.stack(rows)


class GraniteVisionEncoder(torch.nn.Module):
    """Granite 4 Vision's one image's tiles and size to zero rows at its tokens and its packed rows for
    its decoder layers (the module docstring)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model  # the model's own paths: the checkpoint's names

    def forward(self, pixel_values: torch.Tensor, image_sizes: torch.Tensor) -> tuple[torch.Tensor, ...]:
        pixels = pixel_values.to(_inner(self.model).dtype)
        deepstack = _granite_rows(self.model, pixels, image_sizes[0])
        return torch.zeros_like(deepstack[0]), deepstack


def expected_deepstack(model: torch.nn.Module, out: Any) -> torch.Tensor:
    """transformers' ``deepstack_features`` of one image (a list of a layer and its rows per projector)
    as ``GraniteVisionEncoder`` gives them: layers x rows x hidden, ``granite_layers``' order."""
    pairs = out.deepstack_features
    return torch.stack([torch.cat(list(pairs[k][1])) for k in granite_layers(model).values()])


class HookedDeepstackStep(torch.nn.Module):
    """One generation step of Granite 4 Vision: ``EmbedsStep``'s, the rows of ``deepstack_features``
    (layers x rows x hidden) added at the image tokens of ``input_ids`` before their decoder layers. Its
    forward adds them by a boolean-mask scatter, whose size is data; here each layer's rows, scattered to
    the prompt's shape with zeros elsewhere, are added to all its hidden states by a pre-hook of the layer:
    the same sums, and none where there is no image."""

    def __init__(self, model: torch.nn.Module, token: int) -> None:
        super().__init__()
        self.model, self.token = model, token

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past_key_values: Any,
        input_ids: torch.Tensor,
        deepstack_features: torch.Tensor,
    ) -> tuple[torch.Tensor, Any]:
        from fastonnx.pretrained.decoder_cache import returned_cache

        model: Any = self.model
        marked = (input_ids == self.token).reshape(-1)
        order = torch.cumsum(marked.to(torch.int64), dim=0) - 1
        rows = deepstack_features.shape[1]
        placed = marked & (order < rows)
        width = inputs_embeds.shape[-1]
        table = torch.cat(
            [deepstack_features, deepstack_features.new_zeros(deepstack_features.shape[0], 1, width)], 1
        )
        scattered = table[:, torch.where(placed, order, rows)].reshape(-1, *input_ids.shape, width)
        layers = model.model.language_model.layers
        handles = []
        for k, layer in enumerate(granite_layers(model)):
            add = scattered[k].to(inputs_embeds.dtype)

            def hook(_module: Any, args: tuple[Any, ...], add: torch.Tensor = add) -> tuple[Any, ...]:
                return (args[0] + add, *args[1:])

            handles.append(layers[layer].register_forward_pre_hook(hook))
        try:
            out = model(
                inputs_embeds=inputs_embeds,
                attention_mask=attention_mask,
                position_ids=position_ids,
                past_key_values=past_key_values,
                use_cache=True,
            )
        finally:
            for handle in handles:
                handle.remove()
        return out.logits, returned_cache(out)


def tile_count(model: torch.nn.Module, height: int, width: int) -> int:
    """How many tiles the processor gives an image of ``height`` x ``width``: the base view and the best
    pinpoint's grid."""
    config = _inner(model).config
    side = int(config.vision_config.image_size)
    rows, columns = best_grid(torch.tensor([height, width]), config.image_grid_pinpoints, side)
    return 1 + int(rows) * int(columns)


def check_size(model: torch.nn.Module) -> tuple[int, int]:
    """The original size of the verification's image: wider than tall past the pinpoints' shapes, so that
    it takes several tiles and the unpadding crops rows."""
    side = int(_inner(model).config.vision_config.image_size)
    return max(1, side * 3 // 8), side * 3 // 2 + 1


def anyres_inputs(
    model: torch.nn.Module, device: str | torch.device, size: tuple[int, int] | None = None
) -> dict[str, torch.Tensor]:
    """What transformers' forward takes for one image of ``size`` (``check_size``'s by default) as the
    processor cuts it: 1 x tiles x channels x height x width, and its size (1 x 2)."""
    height, width = size or check_size(model)
    vision = _inner(model).config.vision_config
    side, channels = int(vision.image_size), int(getattr(vision, "num_channels", 3))
    tiles = tile_count(model, height, width)
    g = torch.Generator().manual_seed(height * 1000 + width)
    pixels = torch.randn(1, tiles, channels, side, side, generator=g)
    return {"pixel_values": pixels.to(device), SIZES: torch.tensor([[height, width]], device=device)}


def anyres_feeds(images: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """The vision encoder's inputs for ``anyres_inputs``' image: its tiles without the batch, its size."""
    return [images["pixel_values"][0], images[SIZES]]


def anyres_spec(model: torch.nn.Module) -> GraphSpec:
    """``vision_encoder.onnx`` of an anyres model: one image's tiles and size to its packed rows."""
    tiles = torch.export.Dim(TILES, min=1, max=1 << 14)
    pixels, sizes = anyres_feeds(anyres_inputs(model, "meta"))
    granite = bool(granite_layers(model))
    return GraphSpec(
        GraniteVisionEncoder(model) if granite else AnyresVisionEncoder(model),
        (pixels, sizes),
        {"pixel_values": {0: tiles}, SIZES: {}},
        ["pixel_values", SIZES],
        ["image_features", *(["deepstack_features"] if granite else [])],
    )
