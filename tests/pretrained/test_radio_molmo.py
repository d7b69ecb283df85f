"""image-text-to-text of Nemotron-H Omni (radio_towers.py), each built from the architecture sweep's own
tiny config:

- its RADIO tower runs from ``image_grid_hw.tolist()``; the grid form (the table's resize and crop, each
  image's prefix tokens, attention within an image, the pixel shuffle, from the grid's values) is compared
  with transformers' ``get_image_features`` at non-square grids, one image and several packed;
- the package is exported and verified, and its vision graph run at grids and image counts the capture
  did not see.
"""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np
import pytest
import torch
from checkpoint_folders import architecture_sweep

import fastonnx
from fastonnx.pretrained.radio_towers import RadioGridEncoder, radio_inputs, radio_tower
from support.matrix import sampled

TASK = "image-text-to-text"
RADIO_GRIDS = [((4, 6),), ((6, 2),), ((2, 10), (8, 4), (2, 2))]
IN_CI = {"nemotron_h_omni"}
CASES = sampled(["nemotron_h_omni"], lambda name: name in IN_CI)

_sweep = architecture_sweep


def _model(model_type: str) -> Any:
    import transformers

    sweep = _sweep()
    config = sweep.tiny_config(model_type, sweep._tokens_in_vocabulary(sweep._defaults(model_type)))
    cls = getattr(transformers, dict(sweep.architectures(TASK))[model_type])
    torch.manual_seed(0)
    return cls(config).eval()


def _radio_expected(model: Any, images: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat(model.get_image_features(**images, return_dict=True).pooler_output)


def test_the_radio_form_is_get_image_features() -> None:
    model = _model("nemotron_h_omni")
    assert radio_tower(model)
    encoder = RadioGridEncoder(model)
    for grids in RADIO_GRIDS:
        images = radio_inputs(model, grids, "cpu")
        with torch.no_grad():
            got = encoder(**images)
        torch.testing.assert_close(got, _radio_expected(model, images), msg=f"at {grids}")


@pytest.mark.parametrize("model_type", CASES)
def test_the_package_exports_and_verifies(tmp_path: pathlib.Path, model_type: str) -> None:
    import onnxruntime as ort
    import transformers

    folder = tmp_path / "checkpoint"
    class_name = dict(_sweep().architectures(TASK))[model_type]
    _sweep().build_checkpoint(TASK, model_type, class_name, folder)
    written = fastonnx.export_pretrained(folder, tmp_path / "package", task=TASK, progress=False)
    assert written.verified is True, written.verify_note
    model = getattr(transformers, class_name).from_pretrained(folder).eval()
    session = ort.InferenceSession(
        str(written.outdir / "vision_encoder.onnx"), providers=["CPUExecutionProvider"]
    )
    for grids in RADIO_GRIDS:  # one image and several, at grids the capture did not see
        images = radio_inputs(model, grids, "cpu")
        got = session.run(None, {k: v.numpy() for k, v in images.items()})[0]
        torch.testing.assert_close(
            torch.from_numpy(np.asarray(got)), _radio_expected(model, images), atol=1e-4, rtol=1e-3
        )
