"""Vision-language models whose images are not one plain picture, in image-text-to-text, built from the
architecture sweep's own tiny configs:

- MiniCPM-V 4.6, MiniCPM-OCR and MiniCPM-V 4.7 (minicpm_vlms.py): their config classes name no image
  token (the checkpoints do; 4.7 the markers around each crop too, where its canvas M-RoPE anchors), and
  their processor packs an image's source and slices, each of its own size, into one
  row of patches with ``target_sizes``, from whose ``.tolist()`` transformers runs the tower. The vision
  encoder computes the same from the sizes' values; these tests hold it to transformers'
  ``get_image_features`` at sizes and slice counts other than the capture's;
- Fuyu's patch rows and Perception LM's tiles (pixel_layouts.py): the vision encoder was captured on one
  plain picture, which neither reads ("a and b must have same reduction dim", "not enough values to
  unpack"); Fuyu's features are ``get_image_features``' ``last_hidden_state``.
"""

from __future__ import annotations

import pathlib
from typing import Any

import onnxruntime as ort
import pytest
import torch
from checkpoint_folders import architecture_sweep

import fastonnx
from fastonnx.pretrained import minicpm_vlms, pixel_layouts, vision_language
from support.matrix import sampled

TASK = "image-text-to-text"
FIXED = ["minicpmv4_6", "minicpm_ocr", "minicpmv4_7", "fuyu", "perception_lm"]
CASES = sampled(FIXED, lambda name: name == "fuyu")  # the quickest export; MiniCPM's tower: unit tests
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


@pytest.mark.parametrize("model_type", ["minicpmv4_6", "minicpm_ocr", "minicpmv4_7"])
def test_the_packed_tower_matches_get_image_features_at_other_sizes(model_type: str) -> None:
    model = _tiny(model_type)
    for sizes in (((4, 8), (4, 4), (4, 4)), OTHER_SIZES, ((12, 4),)):
        image = minicpm_vlms.image_example(model.config, "cpu", sizes)
        with torch.no_grad():
            want = torch.cat(model.get_image_features(**image, return_dict=True).pooler_output)
            got = minicpm_vlms.image_features(model, **image)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("model_type", CASES)
def test_the_model_exports_verified(tmp_path: pathlib.Path, model_type: str) -> None:
    import transformers

    sweep = _sweep()
    folder = tmp_path / "checkpoint"
    name = dict(sweep.architectures(TASK))[model_type]
    sweep.build_checkpoint(TASK, model_type, name, folder)
    written = fastonnx.export_pretrained(folder, tmp_path / "package", task=TASK, progress=False)
    assert written.verified is True, written.verify_note
    # the vision encoder at slice sizes, patch and tile counts the capture did not see
    model = getattr(transformers, name).from_pretrained(folder).eval()
    image = _other_image(model)
    session = ort.InferenceSession(str(written.outdir / "vision_encoder.onnx"))
    (got,) = session.run(None, {k: v.numpy() for k, v in image.items()})
    with torch.no_grad():
        want = vision_language.image_features(model, **image)
    torch.testing.assert_close(torch.from_numpy(got), want, rtol=1e-3, atol=1e-4)


def _other_image(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """An image of another size than the capture's: MiniCPM's ``OTHER_SIZES``, Fuyu's patches of a
    taller image, Perception LM's 3 tiles."""
    config: Any = model.config
    if minicpm_vlms.own_layout(model):
        return minicpm_vlms.image_example(config, "cpu", OTHER_SIZES)
    pixels = pixel_layouts.pixel_example(config, "cpu")
    more = torch.cat([pixels, pixels[:, :1].flip(-1)], dim=1)
    return {"pixel_values": more if config.model_type == "perception_lm" else more[:, :-2]}


def test_fuyus_image_is_its_patch_rows_one_feature_row_each() -> None:
    model = _tiny("fuyu")
    images = vision_language.vision_inputs(model, model.config, 1, "cpu")
    patch, channels = int(model.config.patch_size), int(model.config.num_channels)
    assert images["pixel_values"].shape == (1, 16, patch * patch * channels)
    with torch.no_grad():
        rows = vision_language.image_features(model, **images)
    want = model.model.vision_embed_tokens(images["pixel_values"])[0]
    torch.testing.assert_close(rows, want)
