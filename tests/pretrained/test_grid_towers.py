"""image_grid_thw vision towers beyond Qwen2/2.5-VL in image-text-to-text (grid_vision.py), each built
from the architecture sweep's own tiny config:

- Qwen3-VL, Qwen3.5 (their MoE, Qwen3-Omni's thinker, Qwen4-Exp, Cohere Compass, Cosmos 3 Omni): a learned position table resampled to the grid
  (bilinear, corners aligned), and Qwen3-VL's deepstack rows, a second output the decoder adds at the
  image tokens of its first layers (``DeepstackStep``);
- GLM-4V (GLM-4.5V, GLM-4.6V, GLM-OCR): a position table sampled bicubically at each patch, a convolution
  over each merged block, GLM-OCR's per-head norms;
- EXAONE 4.5: Qwen2.5-VL's windows with grouped keys and values; Qwen2.5-Omni's thinker: separate q, k, v;
  HyperCLOVA X: Qwen2.5-VL's tower under a projector;
- PaddleOCR-VL (grid_towers.py): SigLIP over raster-order patches, its projector merging the blocks.

The grid form is compared with transformers' ``get_image_features`` at several grids (non-square, and for
a windowed tower several windows); the packages are exported and verified, and the vision graph run at
grids other than the capture's.
"""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np
import pytest
import torch
from checkpoint_folders import architecture_sweep

import fastonnx
from fastonnx.pretrained.grid_vision import (
    deepstack_layers,
    grid_encoder,
    is_grid_tower,
    patch_shape,
    vision_tower,
)
from support.matrix import sampled

TASK = "image-text-to-text"
TOWERS = ["qwen3_vl", "qwen3_5", "glm4v", "glm_ocr", "exaone4_5", "qwen2_5_omni_thinker", "paddleocr_vl"]
FIXED = [
    *("qwen3_vl", "qwen3_5", "qwen3_5_moe", "qwen3_omni_moe_thinker", "qwen4_exp"),
    *("qwen2_5_omni_thinker", "cohere_compass", "cosmos3_omni"),
    *("glm4v", "glm4v_moe", "glm46v", "glm_ocr", "exaone4_5", "hyperclovax_vision_v2", "paddleocr_vl"),
]
IN_CI = {"qwen3_vl"}  # deepstack and the resampled table (GLM's table and convolution: its unit test in CI)
CASES = sampled(FIXED, lambda name: name in IN_CI)

_sweep = architecture_sweep


def _model(model_type: str) -> Any:
    import transformers

    sweep = _sweep()
    config = sweep.tiny_config(model_type, sweep._tokens_in_vocabulary(sweep._defaults(model_type)))
    cls = getattr(transformers, dict(sweep.architectures(TASK))[model_type])
    torch.manual_seed(0)
    return cls(config).eval()


def _grids(model: Any) -> list[tuple[int, int, int]]:
    """Square, wide, tall and one-token grids; for a windowed tower, one spanning windows both ways."""
    config = vision_tower(model).config
    m = int(config.spatial_merge_size)
    grids = [(1, 2 * m, 3 * m), (1, 5 * m, 2 * m), (1, m, m), (1, 3 * m, 7 * m)]
    window = getattr(config, "window_size", None)
    if window:
        n = int(window) // m // int(config.patch_size)  # merged tokens a window spans
        grids.append((1, m * (n + 2), m * (2 * n + 1)))
    return grids


def _expected(
    model: Any, pixels: torch.Tensor, grid: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None]:
    with torch.no_grad():
        out = model.get_image_features(pixel_values=pixels, image_grid_thw=grid, return_dict=True)
    features = torch.cat(list(out.pooler_output))
    stacked = getattr(out, "deepstack_features", None)
    return features, torch.stack([torch.cat(list(f)) for f in stacked]) if stacked else None


def _pixels(model: Any, t: int, h: int, w: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(t * h * w, *patch_shape(model), generator=g), torch.tensor([[t, h, w]])


@pytest.mark.parametrize("model_type", TOWERS)
def test_the_grid_form_is_get_image_features(model_type: str) -> None:
    model = _model(model_type)
    assert is_grid_tower(model)
    encoder = grid_encoder(model)
    for seed, (t, h, w) in enumerate(_grids(model)):
        pixels, grid = _pixels(model, t, h, w, seed)
        want, want_deepstack = _expected(model, pixels, grid)
        with torch.no_grad():
            got = encoder(pixels, grid)
        features, deepstack = got if isinstance(got, tuple) else (got, None)
        torch.testing.assert_close(features, want, msg=f"{model_type} at {(t, h, w)}")
        if want_deepstack is not None:
            assert deepstack is not None and deepstack.shape[0] == deepstack_layers(model) > 0
            torch.testing.assert_close(
                deepstack, want_deepstack, msg=f"{model_type} deepstack at {(t, h, w)}"
            )


@pytest.mark.parametrize("model_type", CASES)
def test_the_tower_exports_and_verifies(tmp_path: pathlib.Path, model_type: str) -> None:
    import onnxruntime as ort
    import transformers

    folder = tmp_path / "checkpoint"
    class_name = dict(_sweep().architectures(TASK))[model_type]
    _sweep().build_checkpoint(TASK, model_type, class_name, folder)
    written = fastonnx.export_pretrained(folder, tmp_path / "package", task=TASK, progress=False)
    assert written.verified is True, written.verify_note
    # the vision graph at grids the capture did not see
    model = getattr(transformers, class_name).from_pretrained(folder).eval()
    session = ort.InferenceSession(
        str(written.outdir / "vision_encoder.onnx"), providers=["CPUExecutionProvider"]
    )
    for seed, (t, h, w) in enumerate(_grids(model)):
        pixels, grid = _pixels(model, t, h, w, seed)
        want, want_deepstack = _expected(model, pixels, grid)
        got = session.run(None, {"pixel_values": pixels.numpy(), "image_grid_thw": grid.numpy()})
        torch.testing.assert_close(torch.from_numpy(np.asarray(got[0])), want, atol=1e-4, rtol=1e-3)
        if want_deepstack is not None:
            torch.testing.assert_close(
                torch.from_numpy(np.asarray(got[1])), want_deepstack, atol=1e-4, rtol=1e-3
            )
