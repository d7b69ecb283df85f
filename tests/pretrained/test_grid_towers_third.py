"""The last image_grid_thw towers of image-text-to-text (more_grid_forms.py), each built from the
architecture sweep's own tiny config:

- Cosmos3 Edge: its table resized with ``F.interpolate(antialias=True)``: shrunk (the triangle widens)
  and grown (plain bilinear), the weights compared with torch's own resize;
- HunYuan-VL: a newline row after each row of tokens and begin and end rows, so the image's row count is
  read from the grid; its decoder's positions have one plane per ``mrope_section`` entry (4);
- Muse Spark: Muse Glimmer's tower reading its table with the grid's rows and columns swapped (only a
  non-square grid tells), and every placeholder (audio too) embedded as token 0.

Each form is compared with transformers' ``get_image_features`` at two grids (non-square); the packages
are exported and verified, and the vision graph run at grids the capture did not see.
"""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np
import pytest
import torch
from checkpoint_folders import architecture_sweep

import fastonnx
from fastonnx.pretrained.grid_vision import grid_encoder, is_grid_tower, patch_shape
from fastonnx.pretrained.more_grid_forms import antialiased_weights
from fastonnx.pretrained.vision_language import MergedEmbeddings, step_positions
from support.matrix import sampled

TASK = "image-text-to-text"
GRIDS = {
    "cosmos3_edge": [(1, 4, 6), (1, 18, 4)],  # its 16 x 16 table shrunk, then grown down the rows
    "hunyuan_vl": [(1, 4, 6), (1, 6, 2)],
    "muse_spark": [(1, 4, 6), (1, 34, 2)],  # non-square; two windows down (32 patches a side)
}
IN_CI = {"hunyuan_vl"}  # its row count read from the grid (the others' forms: their unit tests in CI)
CASES = sampled(list(GRIDS), lambda name: name in IN_CI)

_sweep = architecture_sweep


def _model(model_type: str) -> Any:
    import transformers

    sweep = _sweep()
    config = sweep.tiny_config(model_type, sweep._tokens_in_vocabulary(sweep._defaults(model_type)))
    cls = getattr(transformers, dict(sweep.architectures(TASK))[model_type])
    torch.manual_seed(0)
    return cls(config).eval()


def _pixels(model: Any, grid: tuple[int, int, int], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    t, h, w = grid
    g = torch.Generator().manual_seed(seed)
    return torch.randn(t * h * w, *patch_shape(model), generator=g), torch.tensor([[t, h, w]])


def _expected(model: Any, pixels: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = model.get_image_features(pixel_values=pixels, image_grid_thw=grid, return_dict=True)
    return torch.cat(list(out.pooler_output))


@pytest.mark.parametrize("model_type", list(GRIDS))
def test_the_grid_form_is_get_image_features(model_type: str) -> None:
    model = _model(model_type)
    assert is_grid_tower(model)
    encoder = grid_encoder(model)
    for seed, grid in enumerate(GRIDS[model_type]):
        pixels, thw = _pixels(model, grid, seed)
        with torch.no_grad():
            got = encoder(pixels, thw)
        torch.testing.assert_close(got, _expected(model, pixels, thw), msg=f"{model_type} at {grid}")


@pytest.mark.parametrize(("side", "size"), [(16, 4), (16, 6), (16, 7), (16, 16), (5, 13), (3, 2)])
def test_the_antialiased_weights_are_torchs_resize(side: int, size: int) -> None:
    table = torch.randn(1, 3, side, 2)  # 2 columns kept as they are (torch's resize of 1 differs)
    want = torch.nn.functional.interpolate(
        table, size=(size, 2), mode="bilinear", align_corners=False, antialias=True
    )[0, :, :, 0]
    weights = antialiased_weights(torch.arange(size), torch.tensor(size), side)
    torch.testing.assert_close(weights @ table[0, :, :, 0].T, want.T)


def test_hunyuan_vl_positions_have_a_plane_per_section() -> None:
    model = _model("hunyuan_vl")
    assert step_positions(model, 3, 2, torch.tensor(0)).shape == (4, 1, 2)


def test_every_muse_spark_placeholder_embeds_as_token_0() -> None:
    model = _model("muse_spark")
    config = model.config
    image, video, audio = (int(getattr(config, f"{k}_token_id")) for k in ("image", "video", "audio"))
    ids = torch.tensor([[5, image, video, audio, 7]])
    features = torch.randn(1, config.text_config.hidden_size)
    with torch.no_grad():
        got = MergedEmbeddings(model, image)(ids, features)
        want = model.get_input_embeddings()(torch.tensor([[5, 0, 0, 0, 7]]))
    want[0, 1] = features[0]
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("model_type", CASES)
def test_the_package_exports_and_verifies(tmp_path: pathlib.Path, model_type: str) -> None:
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
    for seed, grid in enumerate(GRIDS[model_type]):
        pixels, thw = _pixels(model, grid, seed)
        got = session.run(None, {"pixel_values": pixels.numpy(), "image_grid_thw": thw.numpy()})[0]
        torch.testing.assert_close(
            torch.from_numpy(np.asarray(got)), _expected(model, pixels, thw), atol=1e-4, rtol=1e-3
        )
