"""The OCR models whose images are a global view and local crops (local_patch_towers.py) in
image-text-to-text, each built from the architecture sweep's own tiny config: DeepSeek-OCR 2 and Step3p7
(the crops' rows, then the view's), Unlimited-OCR (its rows laid out by the crops' grid with newlines,
from ``patches_grid``'s values). The graph's module is compared with transformers'
``get_image_features`` at several crop counts and grids (none included); the packages are exported and
verified (the vision encoder at 2 crops, then at 0 and 3, and a generation over the three files).

Aria (tile_towers.py): one image's padded tiles and their ``pixel_mask``, the projector's queries picked
by the tile's patch count; its package verified, its vision graph run at other tile counts.
"""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
import torch
from checkpoint_folders import architecture_sweep

import fastonnx
from fastonnx.pretrained.local_patch_towers import (
    LocalPatchEncoder,
    grid_rows,
    local_feeds,
    local_inputs,
)
from fastonnx.pretrained.vision_language import image_features
from support.matrix import sampled

TASK = "image-text-to-text"
EXPORTED = ["deepseek_ocr2", "step3p7"]  # Unlimited-OCR's decoder cache (R-SWA) is not exported yet
IN_CI = {"step3p7"}  # the smallest tower; the others' forms: their unit tests below


def _model(model_type: str) -> Any:
    import transformers

    sweep = architecture_sweep()
    config = sweep.tiny_config(model_type, sweep._tokens_in_vocabulary(sweep._defaults(model_type)))
    cls = getattr(transformers, dict(sweep.architectures(TASK))[model_type])
    torch.manual_seed(0)
    model = cls(config).eval()
    sweep._untie_zero_matrices(model)
    return model


@pytest.mark.parametrize("model_type", ["step3p7", "deepseek_ocr2", "unlimited_ocr"])
def test_the_encoder_gives_get_image_features_rows(model_type: str) -> None:
    model = _model(model_type)
    encoder = LocalPatchEncoder(model)
    # crops side by side, stacked; none: the package's check (transformers' towers reshape by -1, which
    # eager torch refuses on 0 crops, where the graph's shapes are known)
    for grid in [(2, 1), (1, 3)]:
        images = local_inputs(model, grid, "cpu")
        with torch.no_grad():
            want = image_features(model, **images)
            got = encoder(*local_feeds(model, images))
        torch.testing.assert_close(got, want, msg=f"{model_type} {grid}")


def test_unlimited_ocr_lines_follow_the_grid() -> None:
    """``grid_rows`` against the reshape transformers does by the grid's Python values, at a grid neither
    square nor one line (2 columns, 3 rows of 2 x 2 queries), and the queries' own grid of 3 x 3."""
    for columns, rows, q in [(2, 3, 2), (3, 1, 3), (1, 2, 1)]:
        crops = torch.randn(columns * rows, q * q, 5)
        newline = torch.randn(5)
        want = crops.reshape(rows, columns, q, q, 5).transpose(1, 2).reshape(rows * q, columns * q, 5)
        want = torch.cat([want, newline.expand(rows * q, 1, 5)], dim=1).reshape(-1, 5)
        got = grid_rows(crops, torch.tensor([[columns, rows]]), newline, q)
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("model_type", sampled(EXPORTED, lambda name: name in IN_CI))
def test_the_package_verifies(tmp_path: pathlib.Path, model_type: str) -> None:
    sweep = architecture_sweep()
    folder = tmp_path / "checkpoint"
    sweep.build_checkpoint(TASK, model_type, dict(sweep.architectures(TASK))[model_type], folder)
    written = fastonnx.export_pretrained(folder, tmp_path / "package", TASK, progress=False)
    assert written.verified is True, written.verify_note
    report = (written.outdir / "fastonnx_report.md").read_text()
    for crops in (0, 3):  # the graph at other crop counts than its capture's
        assert f"image_features of {crops} crops" in report


@pytest.mark.full_matrix  # the module runs in CI with step3p7; Aria's tile form by its unit test
@pytest.mark.parametrize("model_type", ["aria"])
def test_aria_tiles_and_pixel_mask(tmp_path: pathlib.Path, model_type: str) -> None:
    import onnxruntime as ort
    import transformers

    from fastonnx.pretrained.tile_towers import aria_inputs

    sweep = architecture_sweep()
    folder, class_name = tmp_path / "checkpoint", dict(sweep.architectures(TASK))[model_type]
    sweep.build_checkpoint(TASK, model_type, class_name, folder)
    written = fastonnx.export_pretrained(folder, tmp_path / "package", TASK, progress=False)
    assert written.verified is True, written.verify_note
    model = getattr(transformers, class_name).from_pretrained(folder).eval()
    session = ort.InferenceSession(str(written.outdir / "vision_encoder.onnx"))
    for tiles in (1, 3):  # the capture's were 2
        images = aria_inputs(model, tiles, "cpu")
        with torch.no_grad():
            want = image_features(model, **images)
        (got,) = session.run(None, {k: v.numpy() for k, v in images.items()})
        torch.testing.assert_close(torch.from_numpy(got), want, rtol=1e-3, atol=1e-4)
