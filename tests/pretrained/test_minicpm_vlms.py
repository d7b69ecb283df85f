"""MiniCPM-V 4.6 and MiniCPM-OCR in image-text-to-text (minicpm_vlms.py), built from the architecture
sweep's own tiny configs: their config classes name no image token (the checkpoints do), and their
processor packs an image's source and slices, each of its own size, into one row of patches with
``target_sizes``, from whose ``.tolist()`` transformers runs the tower. The vision encoder computes the
same from the sizes' values; these tests hold it to transformers' ``get_image_features`` at sizes and
slice counts other than the capture's.
"""

from __future__ import annotations

import pathlib

import onnxruntime as ort
import pytest
import torch
from checkpoint_folders import architecture_sweep

import fastonnx
from fastonnx.pretrained import minicpm_vlms
from support.matrix import sampled

TASK = "image-text-to-text"
FIXED = ["minicpmv4_6", "minicpm_ocr"]
CASES = sampled(FIXED, lambda name: name == "minicpmv4_6")  # the window merger's path too
OTHER_SIZES = ((8, 4), (4, 12), (8, 8), (4, 4))
"""An image of a taller source and three slices of other sizes: none is the capture's example."""

_sweep = architecture_sweep


def _tiny(model_type: str) -> torch.nn.Module:
    import transformers

    sweep = _sweep()
    name = dict(sweep.architectures(TASK))[model_type]
    config = sweep.tiny_config(model_type)
    torch.manual_seed(0)
    model: torch.nn.Module = getattr(transformers, name)(config).eval()
    return model


@pytest.mark.parametrize("model_type", FIXED)
def test_the_packed_tower_matches_get_image_features_at_other_sizes(model_type: str) -> None:
    model = _tiny(model_type)
    for sizes in (((4, 8), (4, 4), (4, 4)), OTHER_SIZES, ((12, 4),)):
        image = minicpm_vlms.image_example(model.config, "cpu", sizes)
        with torch.no_grad():
            want = torch.cat(model.get_image_features(**image, return_dict=True).pooler_output)
            got = minicpm_vlms.image_features(model, **image)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("model_type", CASES)
def test_the_minicpm_model_exports_verified(tmp_path: pathlib.Path, model_type: str) -> None:
    import transformers

    sweep = _sweep()
    folder = tmp_path / "checkpoint"
    name = dict(sweep.architectures(TASK))[model_type]
    sweep.build_checkpoint(TASK, model_type, name, folder)
    written = fastonnx.export_pretrained(folder, tmp_path / "package", task=TASK, progress=False)
    assert written.verified is True, written.verify_note
    # the vision encoder at slice sizes and a count the capture did not see
    model = getattr(transformers, name).from_pretrained(folder).eval()
    image = minicpm_vlms.image_example(model.config, "cpu", OTHER_SIZES)
    session = ort.InferenceSession(str(written.outdir / "vision_encoder.onnx"))
    (got,) = session.run(None, {k: v.numpy() for k, v in image.items()})
    with torch.no_grad():
        want = torch.cat(model.get_image_features(**image, return_dict=True).pooler_output)
    torch.testing.assert_close(torch.from_numpy(got), want, rtol=1e-3, atol=1e-4)
