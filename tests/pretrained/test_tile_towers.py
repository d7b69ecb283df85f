"""Tiled-image vision-language models in image-text-to-text's three-file layout (tile_towers.py), each
built from the architecture sweep's own tiny config:

- Idefics3, SmolVLM: tiles of the vision config's size, a patch real where any pixel is, a pixel
  shuffle; Idefics2: tiles of any size, a patch real where every pixel is, a perceiver over the patches;
- LFM2-VL: one NaFlex tile, its position table resampled (antialiased bilinear) to ``spatial_shapes``
  values, shrunk and grown;
- Granite Docling: real tiles alone, and its deepstack rows where its config taps encoder layers (the
  sweep's two layers tap none: a config tapping both is tested too, ``granite_docling+deepstack``).

The tile form is compared with transformers' ``get_image_features`` at two tile counts (the last tile
padded); the packages are exported and verified (6 greedy tokens over the three files against
``generate``), and the vision graph run at tile counts (and Idefics2's tile sizes) the capture did not see.
"""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np
import pytest
import torch
from checkpoint_folders import architecture_sweep

import fastonnx
from fastonnx.capture.naflex_positions import antialiased_taps
from fastonnx.pretrained.tile_towers import (
    naflex_inputs,
    naflex_tiles,
    tile_feeds,
    tile_inputs,
    tile_spec,
    tile_tower,
)
from support.matrix import sampled

TASK = "image-text-to-text"
DEEPSTACK = "granite_docling+deepstack"
TOWERS = ["idefics3", "smolvlm", "idefics2", "lfm2_vl", "granite_docling", DEEPSTACK]
IN_CI = {"idefics3"}
CASES = sampled(TOWERS, lambda name: name in IN_CI)

_sweep = architecture_sweep


def _model(case: str) -> Any:
    """The sweep's tiny model of ``case`` (``DEEPSTACK``: Granite Docling tapping both its layers)."""
    import transformers

    sweep = _sweep()
    model_type = case.split("+")[0]
    extra = sweep._tokens_in_vocabulary(sweep._defaults(model_type))
    if case == DEEPSTACK:
        extra["vision_config"] = {"deepstack_visual_indexes": [0, 1]}
    cls = getattr(transformers, dict(sweep.architectures(TASK))[model_type])
    torch.manual_seed(0)
    return cls(sweep.tiny_config(model_type, extra)).eval()


def _rows(features: Any) -> torch.Tensor:
    return torch.cat([f.reshape(-1, f.shape[-1]) for f in features])


def _expected(model: Any, images: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """transformers' features as rows (and deepstack rows, layers x rows x hidden, where there are)."""
    with torch.no_grad():
        out = model.get_image_features(**images, return_dict=True)
    deepstack = getattr(out, "deepstack_features", None)
    return [_rows(out.pooler_output), *([torch.stack([_rows(f) for f in deepstack])] if deepstack else [])]


def _images(model: Any, tiles: int, size: tuple[int, int] | None = None) -> dict[str, torch.Tensor]:
    """``tile_inputs``' image of ``tiles`` tiles, cropped to ``size`` (Idefics2's tiles of any size; an
    LFM2-VL tile of ``size`` patches)."""
    if naflex_tiles(model):
        assert size is not None
        return naflex_inputs(model, *size, "cpu")
    images = tile_inputs(model, tiles, "cpu")
    if size is None:
        return images
    h, w = size
    pixels = torch.randn(1, tiles, 3, h, w, generator=torch.Generator().manual_seed(tiles))
    mask = torch.ones(1, tiles, h, w, dtype=torch.int64)
    mask[0, -1, h // 2 :] = 0
    return {"pixel_values": pixels * mask[:, :, None], "pixel_attention_mask": mask}


def _sizes(model_type: str) -> list[tuple[int, tuple[int, int] | None]]:
    """Tile counts, and for Idefics2 tiles of other sizes (one not a multiple of the patch)."""
    if model_type == "lfm2_vl":  # its table is 16 a side: shrunk, grown, both
        return [(1, (4, 6)), (1, (20, 24)), (1, (2, 18))]
    cases: list[tuple[int, tuple[int, int] | None]] = [(1, None), (3, None)]
    if model_type == "idefics2":
        cases += [(2, (40, 24)), (1, (28, 52))]
    return cases


@pytest.mark.parametrize("case", TOWERS)
def test_the_tile_form_is_get_image_features(case: str) -> None:
    model = _model(case)
    assert tile_tower(model)
    spec = tile_spec(model)
    assert len(spec.output_names) == (2 if case == DEEPSTACK else 1)
    for tiles, size in _sizes(case):
        images = _images(model, tiles, size)
        with torch.no_grad():
            got = spec.module(*tile_feeds(model, images))
        got = list(got) if isinstance(got, tuple) else [got]
        torch.testing.assert_close(got, _expected(model, images), msg=f"{case}: {tiles} tiles {size}")


@pytest.mark.parametrize("case", CASES)
def test_the_tiles_export_and_verify(tmp_path: pathlib.Path, case: str) -> None:
    import onnxruntime as ort
    import transformers

    folder = tmp_path / "checkpoint"
    model_type = case.split("+")[0]
    class_name = dict(_sweep().architectures(TASK))[model_type]
    if case == DEEPSTACK:  # the sweep's config, tapping both layers
        built = _model(case)
        built.save_pretrained(folder)
        _sweep()._save_tokenizer(folder, int(built.config.text_config.vocab_size))
    else:
        _sweep().build_checkpoint(TASK, model_type, class_name, folder)
    written = fastonnx.export_pretrained(folder, tmp_path / "package", task=TASK, progress=False)
    assert written.verified is True, written.verify_note
    # the vision graph at tile counts (sizes) the capture did not see
    model = getattr(transformers, class_name).from_pretrained(folder).eval()
    session = ort.InferenceSession(
        str(written.outdir / "vision_encoder.onnx"), providers=["CPUExecutionProvider"]
    )
    names = [i.name for i in session.get_inputs()]
    for tiles, size in _sizes(case):
        images = _images(model, tiles, size)
        got = session.run(None, {n: t.numpy() for n, t in zip(names, tile_feeds(model, images), strict=True)})
        for g, want in zip(got, _expected(model, images), strict=True):
            torch.testing.assert_close(torch.from_numpy(np.asarray(g)), want, atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize("size", [3, 16, 40])
def test_the_antialiased_taps_are_interpolate(size: int) -> None:
    table = torch.randn(1, 5, 16, 16, generator=torch.Generator().manual_seed(size))
    want = torch.nn.functional.interpolate(
        table, size=(size, 7), mode="bilinear", align_corners=False, antialias=True
    )
    rows = antialiased_taps(torch.arange(size), torch.tensor(size), 16)
    columns = antialiased_taps(torch.arange(7), torch.tensor(7), 16)
    torch.testing.assert_close(torch.einsum("ha,wb,cab->chw", rows, columns, table[0]), want[0])
