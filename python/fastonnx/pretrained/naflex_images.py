"""SigLIP 2's NaFlex images as its processor gives them: each image cut into patches and padded to a
batch-wide patch count, beside the mask of its real patches and its shape in patches. The inputs of SigLIP
2's tower alone (towers_alone.py) and of the models running it (encoder_tasks.py: its two towers and its
classifier)."""

from __future__ import annotations

from typing import Any

import torch

from fastonnx.pretrained.graph_spec import BATCH

PATCHES = "num_patches"


def naflex_example(config: Any, shapes: list[tuple[int, int]], patches: int) -> dict[str, torch.Tensor]:
    """Images of ``shapes`` (rows x columns in patches) as the processor pads them to ``patches``:
    ``pixel_values`` (images x patches x channels · patch²), ``pixel_attention_mask`` (int32, 1 on the
    real patches) and ``spatial_shapes`` (int64)."""
    width = int(config.num_channels) * int(config.patch_size) ** 2
    g = torch.Generator().manual_seed(patches)
    pixels = torch.zeros(len(shapes), patches, width)
    mask = torch.zeros(len(shapes), patches, dtype=torch.int32)
    for i, (h, w) in enumerate(shapes):
        pixels[i, : h * w] = torch.randn(h * w, width, generator=g)
        mask[i, : h * w] = 1
    return {"pixel_values": pixels, "pixel_attention_mask": mask, "spatial_shapes": torch.tensor(shapes)}


def naflex_images(
    config: Any, batch: int, device: str | torch.device
) -> tuple[dict[str, torch.Tensor], dict[str, dict[int, str]]]:
    """``batch`` images of different shapes (the first 4 x 6 patches, the others 3 x 5) padded to 32
    patches, and their dims (batch and patches dynamic)."""
    shapes = [(4, 6)] + [(3, 5)] * (batch - 1)
    patches = {0: BATCH, 1: PATCHES}
    dims = {"pixel_values": patches, "pixel_attention_mask": patches, "spatial_shapes": {0: BATCH}}
    return {k: v.to(device) for k, v in naflex_example(config, shapes, 32).items()}, dims
