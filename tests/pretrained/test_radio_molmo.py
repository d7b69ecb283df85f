"""image-text-to-text of Nemotron-H Omni (radio_towers.py) and Molmo 2 (molmo_vlms.py), each built from
the architecture sweep's own tiny config:

- Nemotron-H Omni's RADIO tower runs from ``image_grid_hw.tolist()``; the grid form (the table's resize and
  crop, each image's prefix tokens, attention within an image, the pixel shuffle, from the grid's values)
  is compared with transformers' ``get_image_features`` at non-square grids, one image and several packed;
- Molmo 2's adapter gathers with the processor's ``image_token_pooling`` (the example's layout is the
  processor's own, -1 slots included); its form is compared with ``get_image_features``, one image and two
  in one call; its image rows are added to the placeholders' embeddings;
- the packages are exported and verified, and the vision graphs run at sizes the capture did not see.
  Molmo 2's adapter at the init's 0.02 gives rows of ~1e-7, which no tolerance tells from none: its test
  scales the adapter so the rows are of the embeddings' size.
"""

from __future__ import annotations

import functools
import pathlib
from typing import Any

import numpy as np
import pytest
import torch
from checkpoint_folders import architecture_sweep

import fastonnx
from fastonnx.pretrained import molmo_vlms
from fastonnx.pretrained.radio_towers import RadioGridEncoder, radio_inputs, radio_tower
from support.matrix import sampled

TASK = "image-text-to-text"
RADIO_GRIDS = [((4, 6),), ((6, 2),), ((2, 10), (8, 4), (2, 2))]
MOLMO_LAYOUTS = [((1, 2), (1, 0)), ((2, 1), (1, 1)), ((2, 3), (1, 0))]  # (tiling, overlap margins)
IN_CI = {"molmo2"}
CASES = sampled(["nemotron_h_omni", "molmo2"], lambda name: name in IN_CI)
ADAPTER_SCALE = 6.0

_sweep = functools.cache(architecture_sweep)  # the script loaded once


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


def _molmo_images(config: Any, layouts: list[tuple[Any, Any]]) -> dict[str, torch.Tensor]:
    """Images of ``layouts`` in one call, as the processor packs them: each one's indices past the
    patches of the ones before."""
    images = [molmo_vlms.image_example(config, "cpu", *layout) for layout in layouts]
    offsets = [0]
    for image in images:
        offsets.append(offsets[-1] + image["pixel_values"].shape[0] * image["pixel_values"].shape[1])
    pooling = [
        torch.where(i["image_token_pooling"] >= 0, i["image_token_pooling"] + o, -1)
        for i, o in zip(images, offsets)
    ]
    return {
        "pixel_values": torch.cat([i["pixel_values"] for i in images]),
        "image_token_pooling": torch.cat(pooling),
        "image_grids": torch.cat([i["image_grids"] for i in images]),
    }


def _molmo_expected(model: Any, images: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat(model.get_image_features(**images, return_dict=True).pooler_output)


def test_the_pooled_form_is_get_image_features() -> None:
    model = _model("molmo2")
    for layouts in [[layout] for layout in MOLMO_LAYOUTS] + [MOLMO_LAYOUTS[:2]]:
        images = _molmo_images(model.config, layouts)
        with torch.no_grad():
            got = molmo_vlms.image_features(model, images["pixel_values"], images["image_token_pooling"])
        torch.testing.assert_close(got, _molmo_expected(model, images), msg=f"at {layouts}")


@pytest.mark.parametrize(("tiling", "margins"), MOLMO_LAYOUTS)
def test_the_molmo_example_is_the_processors_layout(
    tiling: tuple[int, int], margins: tuple[int, int]
) -> None:
    pytest.importorskip("torchvision")  # the image processor's backend
    from transformers.models.molmo2.image_processing_molmo2 import Molmo2ImageProcessor

    config = _sweep().tiny_config("molmo2")
    vision = config.vision_config
    crop = int(round(vision.num_position_embeddings**0.5)) * int(vision.patch_size)
    processor = Molmo2ImageProcessor(
        size={"height": crop, "width": crop},
        patch_size=int(vision.patch_size),
        overlap_margins=list(margins),
        max_crops=tiling[0] * tiling[1],
    )
    window = crop - sum(margins) * int(vision.patch_size)
    height, width = (t * window + sum(margins) * int(vision.patch_size) - 2 for t in tiling)
    picture = (torch.rand(3, height, width, generator=torch.Generator().manual_seed(0)) * 255).to(torch.uint8)
    want = processor(images=[picture], return_tensors="pt")
    got = molmo_vlms.image_example(config, "cpu", tiling, margins)
    assert got["pixel_values"].shape == want["pixel_values"].shape
    for name in ("image_token_pooling", "image_grids"):
        torch.testing.assert_close(got[name], want[name])


def test_molmo_adds_the_image_rows_to_the_placeholders() -> None:
    model = _model("molmo2")
    token = int(model.config.image_token_id)
    ids = torch.tensor([[5, token, 7, token, token, 9]])
    features = torch.randn(3, model.config.text_config.hidden_size)
    with torch.no_grad():
        got = molmo_vlms.AddedEmbeddings(model, token)(ids, features)
        want = model.get_input_embeddings()(ids)
        want[ids == token] += features
        # a step's image token without rows keeps its embedding
        step = molmo_vlms.AddedEmbeddings(model, token)(ids[:, 1:2], features[:0])
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(step, model.get_input_embeddings()(ids[:, 1:2]))


def _scaled_adapter(folder: pathlib.Path, class_name: str) -> None:
    """Molmo 2's adapter scaled (the module's docstring): the checkpoint saved again."""
    import transformers

    model = getattr(transformers, class_name).from_pretrained(folder).eval()
    with torch.no_grad():
        for p in model.model.multi_modal_projector.parameters():
            p.mul_(ADAPTER_SCALE)
    model.save_pretrained(folder)


@pytest.mark.parametrize("model_type", CASES)
def test_the_package_exports_and_verifies(tmp_path: pathlib.Path, model_type: str) -> None:
    import onnxruntime as ort
    import transformers

    folder = tmp_path / "checkpoint"
    class_name = dict(_sweep().architectures(TASK))[model_type]
    _sweep().build_checkpoint(TASK, model_type, class_name, folder)
    if model_type == "molmo2":
        _scaled_adapter(folder, class_name)
    written = fastonnx.export_pretrained(folder, tmp_path / "package", task=TASK, progress=False)
    assert written.verified is True, written.verify_note
    model = getattr(transformers, class_name).from_pretrained(folder).eval()
    session = ort.InferenceSession(
        str(written.outdir / "vision_encoder.onnx"), providers=["CPUExecutionProvider"]
    )
    if model_type == "molmo2":  # other crop counts, two images in one call
        cases = [_molmo_images(model.config, [layout]) for layout in MOLMO_LAYOUTS[1:]]
        cases.append(_molmo_images(model.config, MOLMO_LAYOUTS[:2]))
        for images in cases:
            feeds = {n: images[n].numpy() for n in ("pixel_values", "image_token_pooling")}
            got = session.run(None, feeds)[0]
            want = _molmo_expected(model, images)
            assert want.abs().max() > 1e-2  # rows that tell
            torch.testing.assert_close(torch.from_numpy(np.asarray(got)), want, atol=1e-4, rtol=1e-3)
        return
    for grids in RADIO_GRIDS:  # one image and several, at grids the capture did not see
        images = radio_inputs(model, grids, "cpu")
        got = session.run(None, {k: v.numpy() for k, v in images.items()})[0]
        torch.testing.assert_close(
            torch.from_numpy(np.asarray(got)), _radio_expected(model, images), atol=1e-4, rtol=1e-3
        )
