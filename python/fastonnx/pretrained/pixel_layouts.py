"""The ``pixel_values`` of vision-language models whose processor gives an image as something other than
one picture (1 x channels x height x width), for vision_language.py's ``vision_encoder.onnx``:

- Fuyu: the image's patches as rows, 1 x patches x (patch² · channels), which its linear patch embedding
  reads; one feature row a patch, the patches' number dynamic (the processor's follows the image's size);
- Perception LM: the image's tiles (a thumbnail and crops), 1 x tiles x channels x height x width, its
  ``get_image_features`` flattening them into the tower's batch; the tiles' number dynamic.
"""

from __future__ import annotations

from typing import Any

import torch

from fastonnx.pretrained.encoder_tasks import image_inputs, timm_image_size

PATCH_ROW_TYPES = ("fuyu",)
TILE_TYPES = ("perception_lm",)
PATCHES, TILES = "num_patches", "num_tiles"
EXAMPLE_TILES = 2


def own_pixels(config: Any) -> bool:
    """Whether ``config``'s model takes its image as this module's ``pixel_values``."""
    return getattr(config, "model_type", None) in (*PATCH_ROW_TYPES, *TILE_TYPES)


def _tile_size(config: Any) -> tuple[int, int]:
    """A tile's height and width: the timm tower's ``img_size`` where its config sets one (Perception LM's
    encoder is a timm model), else the vision config's ``image_size``."""
    size = timm_image_size(config.vision_config)
    if size is None:
        pixels = image_inputs(config, 1, "cpu")["pixel_values"]
        return int(pixels.shape[-2]), int(pixels.shape[-1])
    return (int(size), int(size)) if isinstance(size, int) else (int(size[0]), int(size[1]))


def pixel_example(config: Any, device: str | torch.device) -> torch.Tensor:
    """One image's ``pixel_values`` as the processor gives them: Fuyu's patch rows of an image of the
    config's size, Perception LM's ``EXAMPLE_TILES`` tiles of the tower's size."""
    g = torch.Generator().manual_seed(0)
    if getattr(config, "model_type", None) in PATCH_ROW_TYPES:
        side, patch = int(config.image_size), int(config.patch_size)
        width = patch * patch * int(config.num_channels)
        return torch.randn(1, (side // patch) ** 2, width, generator=g).to(device)
    h, w = _tile_size(config)
    channels = int(getattr(config.vision_config, "num_channels", 3))
    return torch.randn(1, EXAMPLE_TILES, channels, h, w, generator=g).to(device)


def pixel_dims(config: Any) -> dict[int, Any]:
    """``pixel_values``' dynamic dims: Fuyu's patches, Perception LM's tiles."""
    if getattr(config, "model_type", None) in PATCH_ROW_TYPES:
        return {1: torch.export.Dim(PATCHES, min=1, max=1 << 16)}
    return {1: torch.export.Dim(TILES, min=1, max=1 << 10)}
