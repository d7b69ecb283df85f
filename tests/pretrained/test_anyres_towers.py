"""Anyres vision-language models in image-text-to-text's three-file layout (anyres_towers.py), each built
from the architecture sweep's own tiny config: LLaVA-NeXT, LLaVA-NeXT-Video (tiles by ``image_grid_pinpoints``,
the grid's padding cropped, a newline a row), LLaVA-OneVision (its ``anyres_max_9`` downscale too) and
Granite 4 Vision (its projectors' packed rows added at the image tokens before some decoder layers).

The graph's form (tiles and the original size, the packing as tensor arithmetic over the size's values) is
compared with transformers' ``get_image_features`` at image sizes giving other grids, crops and downscales
(and the base view alone); the packages are exported and verified (a wide image of several tiles, 6 greedy
tokens over the three files against ``generate``), and the vision graph run at sizes the capture did not see.
"""

from __future__ import annotations

import inspect
import pathlib
from typing import Any

import numpy as np
import pytest
import torch
from checkpoint_folders import architecture_sweep

import fastonnx
from fastonnx.pretrained import vision_language as vl
from fastonnx.pretrained.anyres_towers import (
    AnyresVisionEncoder,
    GraniteVisionEncoder,
    HookedDeepstackStep,
    anyres_feeds,
    anyres_inputs,
    anyres_tower,
    check_size,
    expected_deepstack,
    granite_layers,
    tile_count,
)
from support.matrix import sampled

TASK = "image-text-to-text"
TOWERS = ["llava_next", "llava_next_video", "llava_onevision", "granite4_vision"]
IN_CI = {"llava_next"}
CASES = sampled(TOWERS, lambda name: name in IN_CI)
# (height, width): tall (another grid), large and squarish (a 2 x 2 grid), taller than any pinpoint,
# a thin strip (a crop of rows)
SIZES = [(40, 20), (70, 66), (100, 31), (7, 90)]


def _model(model_type: str) -> Any:
    import transformers

    sweep = architecture_sweep()
    extra = sweep._tokens_in_vocabulary(sweep._defaults(model_type))
    cls = getattr(transformers, dict(sweep.architectures(TASK))[model_type])
    torch.manual_seed(0)
    return cls(sweep.tiny_config(model_type, extra)).eval()


def _expected(model: Any, images: dict[str, torch.Tensor]) -> torch.Tensor:
    """transformers' packed features as rows (a single tile: OneVision's untiled image, or LLaVA-NeXT's)."""
    untiled = images["pixel_values"].shape[1] == 1  # OneVision: one of a sample's two images
    takes = "batch_num_images" in inspect.signature(model.get_image_features).parameters
    alone = {"batch_num_images": torch.tensor([2])} if untiled and takes else {}
    with torch.no_grad():
        out = model.get_image_features(**images, **alone, return_dict=True)
    return torch.cat([f.reshape(-1, f.shape[-1]) for f in out.pooler_output])


@pytest.mark.parametrize("model_type", ["llava_next", "llava_onevision"])
def test_the_anyres_form_is_get_image_features(model_type: str) -> None:
    model = _model(model_type)
    assert anyres_tower(model)
    encoder = AnyresVisionEncoder(model)
    counts = set()
    # OneVision's 145 tiles a size: two sizes (the thin strip downscaled, the tall one not)
    sizes = [check_size(model), *SIZES[:2]] if model_type == "llava_next" else [SIZES[3], SIZES[2]]
    for size in sizes:
        images = anyres_inputs(model, "cpu", size)
        counts.add(images["pixel_values"].shape[1])
        with torch.no_grad():
            got = encoder(*anyres_feeds(images))
        torch.testing.assert_close(got, _expected(model, images), msg=f"{model_type}: {size}")
    if model_type == "llava_next":  # the sizes take grids of 2 and 4 tiles
        assert counts == {3, 5}
    else:  # OneVision's base view alone: its rows and a newline
        alone = anyres_inputs(model, "cpu", (20, 50))
        alone["pixel_values"] = alone["pixel_values"][:, :1]
        with torch.no_grad():
            got = encoder(*anyres_feeds(alone))
        torch.testing.assert_close(got, _expected(model, alone))


def test_the_grid_is_select_best_resolution() -> None:
    from transformers.image_processing_utils import select_best_resolution

    model = _model("llava_onevision")
    config = model.model.config
    side = int(config.vision_config.image_size)
    for height, width in [(12, 49), (400, 900), (2000, 300), (383, 385), (1, 5000)]:
        best = select_best_resolution((height, width), config.image_grid_pinpoints)
        assert tile_count(model, height, width) == 1 + (best[0] // side) * (best[1] // side)


@pytest.mark.parametrize("model_type", CASES)
def test_the_anyres_models_export_and_verify(tmp_path: pathlib.Path, model_type: str) -> None:
    import onnxruntime as ort
    import transformers

    folder = tmp_path / "checkpoint"
    class_name = dict(architecture_sweep().architectures(TASK))[model_type]
    architecture_sweep().build_checkpoint(TASK, model_type, class_name, folder)
    written = fastonnx.export_pretrained(folder, tmp_path / "package", task=TASK, progress=False)
    assert written.verified is True, written.verify_note
    # the vision graph at sizes (tile counts, crops) the capture did not see
    model = getattr(transformers, class_name).from_pretrained(folder).eval()
    session = ort.InferenceSession(
        str(written.outdir / "vision_encoder.onnx"), providers=["CPUExecutionProvider"]
    )
    names = [i.name for i in session.get_inputs()]
    for size in SIZES[:2]:
        images = anyres_inputs(model, "cpu", size)
        feeds = {n: t.numpy() for n, t in zip(names, anyres_feeds(images), strict=True)}
        got = torch.from_numpy(np.asarray(session.run(None, feeds)[-1]))  # Granite's: its deepstack rows
        if granite_layers(model):
            with torch.no_grad():
                want = expected_deepstack(model, model.get_image_features(**images, return_dict=True))
        else:
            want = _expected(model, images)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-3)


def test_the_granite_form_is_get_image_features() -> None:
    model = _model("granite4_vision")
    assert anyres_tower(model) and granite_layers(model)
    encoder = GraniteVisionEncoder(model)
    for size in [check_size(model), SIZES[1]]:  # 2 and 4 tiles
        images = anyres_inputs(model, "cpu", size)
        with torch.no_grad():
            zeros, got = encoder(*anyres_feeds(images))
            want = expected_deepstack(model, model.get_image_features(**images, return_dict=True))
        torch.testing.assert_close(got, want, msg=f"{size}")
        assert zeros.shape == want.shape[1:] and not zeros.any()


def test_the_hooked_step_is_granites_forward() -> None:
    """The prefill's logits from the merged embeddings (zeros at the image tokens) and the rows added by
    the layers' hooks are the model's own forward on the image; without the rows they are not."""
    from transformers import DynamicCache

    model = _model("granite4_vision")
    token = vl.image_token_id(model.config)
    images = anyres_inputs(model, "cpu", check_size(model))
    with torch.no_grad():
        zeros, deepstack = GraniteVisionEncoder(model)(*anyres_feeds(images))
        text = torch.randint(3, 60, (1, 5), generator=torch.Generator().manual_seed(0))
        ids = vl.image_prompt(model.config, text[:, :2], zeros.shape[0], text[:, 2:])
        want = model(input_ids=ids, **images).logits
        embeds = vl.MergedEmbeddings(model, token)(ids, zeros)
        mask, positions = torch.ones_like(ids), torch.arange(ids.shape[1])[None]
        step = HookedDeepstackStep(model, token)
        got, _ = step(embeds, mask, positions, DynamicCache(config=model.config), ids, deepstack)
        bare, _ = step(embeds, mask, positions, DynamicCache(config=model.config), ids, deepstack[:, :0])
    torch.testing.assert_close(got, want)
    assert not torch.allclose(bare, want, atol=1e-3)
