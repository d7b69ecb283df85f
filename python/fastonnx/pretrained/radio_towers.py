"""Nemotron-H Omni's RADIO vision tower and projector as one graph over packed images' patches, for any
grids (the grid_vision.py way: what transformers makes from ``image_grid_hw.tolist()`` made from the grid's
values as tensor arithmetic).

transformers' ``get_image_features`` runs the tower from Python lists: ``_embed_packed_patches`` splits the
patches by image, resizes the learned position table bilinearly to ``max(h, w)`` a side and crops it to
``h x w``, and puts the class and register tokens before each image's patches; ``_forward_packed`` splits
the attention at each image's length (``cu_seqlens``); then each image's features are pixel-shuffled
(``view`` by its grid's values) and projected. Here:

- patch ``k``'s image, row and column come from the grid's cumulative sizes; its position is the table's
  bilinear taps for the square of ``max(h, w)`` (grid_towers.py's ``axis_taps``), cropping being reading
  that square at the patch's own row and column;
- the sequence (each image's prefix tokens, then its patches) is a gather from the prefix rows and the
  patches; attention within an image is attention under a mask of the positions sharing it (the same
  values as each piece alone), and the features a gather of the patch positions;
- the pixel shuffle by 2 is a gather of each merged token's 2 x 2 patches (rows, then columns within the
  block: transformers' channel order) into one row.

The graph's inputs are the processor's: ``pixel_values`` (patches x channels · patch², each patch
channel-major) and ``image_grid_hw`` (images x 2, int64: rows and columns in patches, each even); its
output every image's feature rows in order, ``num_image_tokens`` x the text's width.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from fastonnx.errors import InputError
from fastonnx.pretrained.graph_spec import GraphSpec
from fastonnx.pretrained.grid_towers import axis_taps

GRID = "image_grid_hw"
NAMES = ("pixel_values", GRID)
IMAGES = "num_images"
IMAGE_TOKENS = "num_image_tokens"
EXAMPLE_GRIDS = ((4, 6), (6, 2))
"""The capture's images (two, so that their number is not fixed at 1): non-square, each side even."""


def radio_tower(model: torch.nn.Module) -> bool:
    """Whether the model's images are RADIO's packed patches and ``image_grid_hw`` (Nemotron-H Omni's)."""
    vision = getattr(model, "vision_model", None)
    get = getattr(model, "get_image_features", None)
    return (
        hasattr(getattr(vision, "embeddings", None), "cls_register_token")
        and callable(get)
        and GRID in inspect.signature(get).parameters
        and callable(getattr(model, "pixel_shuffle", None))
        and hasattr(model, "multi_modal_projector")
    )


def _shuffle(model: torch.nn.Module) -> int:
    """The pixel shuffle's merge a side: ``1 / downsample_ratio`` (transformers splits the rows by 2²)."""
    config: Any = model.config
    ratio = float(config.downsample_ratio)
    merge = round(1 / ratio)
    if merge != 2:
        raise InputError(
            f"{type(model).__name__}'s downsample_ratio is {ratio}: get_image_features "
            "splits each image's rows by 2² whatever the ratio, which only 0.5 keeps"
        )
    return merge


def radio_inputs(
    model: torch.nn.Module, grids: tuple[tuple[int, int], ...], device: str | torch.device
) -> dict[str, torch.Tensor]:
    """Images of ``grids`` (rows, columns in patches) as the processor packs them."""
    model_config: Any = model.config
    config = model_config.vision_config
    row = int(config.num_channels) * int(config.patch_size) ** 2
    g = torch.Generator().manual_seed(0)
    pixels = torch.randn(sum(h * w for h, w in grids), row, generator=g)
    return {"pixel_values": pixels.to(device), GRID: torch.tensor(grids, device=device)}


def _image_of(index: torch.Tensor, sizes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each ``index``'s piece among consecutive pieces of ``sizes`` and its offset within it."""
    ends = torch.cumsum(sizes, dim=0)
    piece = (ends.unsqueeze(0) <= index.unsqueeze(1)).to(torch.int64).sum(dim=1)
    return piece, index - (ends - sizes)[piece]


def _attention(attn: Any, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    length, heads = x.shape[0], int(attn.num_attention_heads)
    q, k, v = (
        p(x).reshape(length, heads, -1).transpose(0, 1)[None] for p in (attn.q_proj, attn.k_proj, attn.v_proj)
    )
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask[None, None], scale=float(attn.scaling)
    )
    result: torch.Tensor = attn.o_proj(out[0].transpose(0, 1).reshape(length, -1))
    return result


class RadioGridEncoder(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model  # the model's own paths: the checkpoint's names
        self.merge = _shuffle(model)

    def forward(self, pixel_values: torch.Tensor, image_grid_hw: torch.Tensor) -> torch.Tensor:
        model: Any = self.model
        vision = model.vision_model
        config, embeddings = vision.config, vision.embeddings
        prefix = int(embeddings.cls_register_token.shape[0])
        channels, patch = int(config.num_channels), int(config.patch_size)
        dtype = embeddings.patch_projection.weight.dtype
        pixels = vision.input_conditioner(pixel_values.to(dtype).view(-1, channels, patch, patch))
        patches = embeddings.patch_projection(pixels.flatten(1))
        count, device = patches.shape[0], patches.device

        grid = image_grid_hw.to(torch.int64)
        h, w = grid[:, 0], grid[:, 1]
        k = torch.arange(count, device=device)
        image, local = _image_of(k, h * w)
        width = w[image]
        row, column = local // width, local % width
        # the table resized to max(h, w) a side, then cropped: read at the patch's row and column
        side = torch.maximum(h, w)[image]
        rows_, columns_ = int(embeddings.max_rows), int(embeddings.max_cols)
        h_taps, h_weights = axis_taps(row, side, rows_, False, False)
        w_taps, w_weights = axis_taps(column, side, columns_, False, False)
        taps = (h_taps[:, :, None] * columns_ + w_taps[:, None, :]).reshape(count, -1)
        weights = (h_weights[:, :, None] * w_weights[:, None, :]).reshape(count, -1)
        table = embeddings.position_embedding.reshape(rows_ * columns_, -1).float()
        positions = (table[taps] * weights[:, :, None]).sum(1).to(patches.dtype)

        # each image's prefix tokens, then its patches: a gather from the prefix rows and the patches
        images = grid.shape[0]
        at = torch.arange(count + images * prefix, device=device)
        in_image, offset = _image_of(at, h * w + prefix)
        first = (torch.cumsum(h * w, dim=0) - h * w)[in_image]
        source = torch.where(offset < prefix, offset, prefix + first + (offset - prefix).clamp(min=0))
        hidden = torch.cat([embeddings.cls_register_token.to(patches.dtype), patches + positions])[source]
        mask = in_image[:, None] == in_image[None, :]
        for layer in vision.encoder.layer:
            attended = _attention(layer.attention, layer.norm1(hidden), mask)
            hidden = hidden + layer.layer_scale1(attended)
            hidden = hidden + layer.layer_scale2(layer.mlp(layer.norm2(hidden)))
        features = hidden[k + prefix * (image + 1)]  # the patches' positions, past each image's prefix
        if model.vision_final_layernorm is not None:
            features = model.vision_final_layernorm(features)

        # the pixel shuffle: each merged token's merge x merge patches, rows then columns within the block
        m = self.merge
        unit = m * m
        tokens = torch.arange(count // unit, device=device)
        t_image, t_local = _image_of(tokens, h * w // unit)
        across = w[t_image] // m
        t_row, t_column = t_local // across, t_local % across
        within = torch.arange(unit, device=device)
        start = (torch.cumsum(h * w, dim=0) - h * w)[t_image]
        index = (
            start[:, None]
            + (t_row[:, None] * m + within // m) * w[t_image][:, None]
            + t_column[:, None] * m
            + within % m
        )
        blocks = features[index.reshape(-1)].reshape(tokens.shape[0], -1)
        result: torch.Tensor = model.multi_modal_projector(blocks)
        return result


def radio_spec(model: torch.nn.Module) -> GraphSpec:
    """``vision_encoder.onnx``: the patches' number a multiple of the shuffle's 2 x 2, the images' dynamic."""
    unit = _shuffle(model) ** 2
    images = radio_inputs(model, EXAMPLE_GRIDS, "meta")
    tokens = torch.export.Dim(IMAGE_TOKENS, min=1, max=1 << 20)
    count = torch.export.Dim(IMAGES, min=1, max=1 << 10)
    return GraphSpec(
        RadioGridEncoder(model),
        tuple(images[n] for n in NAMES),
        {"pixel_values": {0: unit * tokens}, GRID: {0: count}},
        list(NAMES),
        ["image_features"],
    )
