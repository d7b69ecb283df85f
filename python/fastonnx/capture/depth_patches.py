"""DepthPro's patch encoder, swapped while torch.export captures for a form whose patch counts follow
the batch.

transformers' ``DepthProPatchEncoder.forward`` counts each scaled image's patches with
``[len(i) for i in scaled_images]`` (modeling_depth_pro.py, the line after the patches are split).
``len()`` must return a Python int, so torch.export guards the count, a multiple of the batch, to the
example's (``Eq(batch, 2)``) and specialises the batch. ``patch_encoder_forward`` is that forward with
the counts read as ``shape[0]``, which stays symbolic; every other step is transformers' own function.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

from fastonnx.capture.model_swaps import swapped_forms


def patch_encoder_forward(self: Any, pixel_values: torch.Tensor) -> list[torch.Tensor]:
    """transformers' ``DepthProPatchEncoder.forward``, the patch counts as sizes instead of ``len()``."""
    modeling: Any = sys.modules[type(self).__module__]  # its split_to_patches, reconstruct_feature_maps
    batch_size, _, height, width = pixel_values.shape
    ratios, patch_size = self.scaled_images_ratios, self.config.patch_size
    if min(ratios) * min(height, width) < patch_size:
        raise ValueError(
            f"Image size {height}x{width} is too small to be scaled "
            f"with scaled_images_ratios={ratios} when patch_size={patch_size}."
        )
    scaled = [
        modeling.split_to_patches(
            F.interpolate(pixel_values, scale_factor=ratio, mode="bilinear", align_corners=False),
            patch_size=patch_size,
            overlap_ratio=overlap,
        )
        for ratio, overlap in zip(ratios, self.scaled_images_overlap_ratios, strict=True)
    ]
    counts = [patches.shape[0] for patches in scaled]  # symbolic: a multiple of the batch
    # the patch encoder takes the high-resolution patches first and gives them back first
    encodings = self.model(
        torch.cat(scaled[::-1], dim=0), output_hidden_states=self.n_intermediate_hooks > 0, return_dict=True
    )
    states = torch.split_with_sizes(encodings.last_hidden_state, counts[::-1])[::-1]

    exponent = int(math.log2(width / self.out_size))  # the lowest resolution's features
    base_height, base_width = height // 2**exponent, width // 2**exponent
    features = []
    for i, state in enumerate(states):
        features.append(
            modeling.reconstruct_feature_maps(
                state,
                batch_size=batch_size,
                padding=int(self.merge_padding_value * (1 / ratios[i])),
                output_size=(base_height * 2**i, base_width * 2**i),
            )
        )
    top = 2 ** (self.n_scaled_images - 1)
    for hook in self.intermediate_hook_ids:  # +1: hidden_states start with the embeddings' output
        features.append(
            modeling.reconstruct_feature_maps(
                encodings.hidden_states[hook + 1],
                batch_size=batch_size,
                padding=int(self.merge_padding_value * (1 / ratios[-1])),
                output_size=(base_height * top, base_width * top),
            )
        )
    return features


SWAPS = {"depth_pro": {"DepthProPatchEncoder.forward": patch_encoder_forward}}


@contextlib.contextmanager
def symbolic_depth_patches() -> Iterator[None]:
    """While active, a loaded DepthPro modeling module's patch encoder runs ``patch_encoder_forward``."""
    with swapped_forms(SWAPS):
        yield
