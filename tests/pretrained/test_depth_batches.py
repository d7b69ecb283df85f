"""DepthPro's batch kept symbolic (capture/depth_patches.py), built from the architecture sweep's own tiny
config.

transformers' ``DepthProPatchEncoder.forward`` counted each scaled image's patches with ``len()``, an
int: torch.export guarded the count, a multiple of the batch, to the example's and specialised the batch
("input 'pixel_values' axis 0 to 2"). The swapped forward reads the counts as sizes; it is compared
with transformers' at batches 1, 2 and 3, captured with the batch dynamic and run at batches the capture
did not see.

The package's own verification (atol 1e-4, rtol 1e-3 element by element) does not pass on this tiny
model, and cannot: its random depth map reaches ~1000 (the kaiming fan-out initialisation gives the
one-channel head std sqrt(2)), so its near-zero depths after the last ReLU are differences of large
terms, and transformers' own float32 result departs from its float64 one by ~1e-3 there: the sweep
reports it verify-failed for that reason (measured: onnxruntime 8.8e-4 off float64, torch float32 1.27e-3).
"""

from __future__ import annotations

from typing import Any

import torch

from fastonnx.capture.depth_patches import patch_encoder_forward, symbolic_depth_patches

TASK = "depth-estimation"
SIDE = 128  # the tiny patch of 32 pixels at DepthPro's smallest scale (0.25): the model's own image size


def _patch_encoder() -> Any:
    """DepthPro's patch encoder at sizes smaller than the sweep's (a capture in CI): its three scales
    give 1, 9 and 25 patches an image, so both of ``merge_patches``' branches run."""
    from transformers import DepthProConfig
    from transformers.models.depth_pro.modeling_depth_pro import DepthProPatchEncoder

    tower = {"model_type": "dinov2", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2}
    tower.update(mlp_ratio=2, image_size=32, patch_size=8)
    config = DepthProConfig(
        patch_size=32,
        intermediate_hook_ids=[1, 0],
        intermediate_feature_dims=[16, 16],
        scaled_images_feature_dims=[16, 16, 16],
        fusion_hidden_size=16,
        image_model_config=dict(tower),
        patch_model_config=dict(tower),
        fov_model_config=dict(tower),
    )
    torch.manual_seed(0)
    return DepthProPatchEncoder(config).eval()


def _images(batch: int) -> torch.Tensor:
    return torch.randn(batch, 3, SIDE, SIDE, generator=torch.Generator().manual_seed(batch))


def test_the_swapped_patch_encoder_equals_transformers() -> None:
    encoder = _patch_encoder()
    with torch.no_grad():
        for batch in (1, 2, 3):
            pixels = _images(batch)
            expected = encoder(pixels)
            actual = patch_encoder_forward(encoder, pixels)
            assert len(actual) == len(expected)
            for a, e in zip(actual, expected, strict=True):
                torch.testing.assert_close(a, e, rtol=0, atol=0)


class _PatchEncoder(torch.nn.Module):
    def __init__(self, encoder: torch.nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, pixel_values: torch.Tensor) -> list[torch.Tensor]:
        out: list[torch.Tensor] = self.encoder(pixel_values)
        return out


def test_the_patch_encoder_is_captured_with_its_batch_symbolic() -> None:
    module = _PatchEncoder(_patch_encoder())
    shapes = {"pixel_values": {0: torch.export.Dim("batch", min=1, max=64)}}
    with symbolic_depth_patches():
        program = torch.export.export(module, (_images(2),), dynamic_shapes=shapes, strict=False)
    with torch.no_grad():
        for batch in (1, 3):
            pixels = _images(batch)
            for a, e in zip(program.module()(pixels), module(pixels), strict=True):
                torch.testing.assert_close(a, e)
