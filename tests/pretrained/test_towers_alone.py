"""feature-extraction of the towers exported alone whose forward takes more than pixels (towers_alone.py):
the sweep's tiny checkpoint exported and verified, then the file run in onnxruntime on inputs of other
sizes than the export's and the check's, against the model's own forward."""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from typing import Any

import onnxruntime as ort
import pytest
import torch
from checkpoint_folders import architecture_sweep

import fastonnx
from fastonnx.pretrained import towers_alone
from fastonnx.pretrained.half_package import float32_tolerance
from support.matrix import sampled
from support.off_sessions import OffSession


def _naflex(config: Any) -> dict[str, torch.Tensor]:
    """Three images of their own shapes (one wider than the 16-row position table) padded to 36 patches."""
    shapes = [(2, 3), (5, 5), (2, 18)]
    width = int(config.num_channels) * int(config.patch_size) ** 2
    g = torch.Generator().manual_seed(11)
    pixels = torch.zeros(3, 36, width)
    mask = torch.zeros(3, 36, dtype=torch.int32)
    for i, (h, w) in enumerate(shapes):
        pixels[i, : h * w] = torch.randn(h * w, width, generator=g)
        mask[i, : h * w] = 1
    return {"pixel_values": pixels, "pixel_attention_mask": mask, "spatial_shapes": torch.tensor(shapes)}


def _padded_patches(config: Any) -> dict[str, torch.Tensor]:
    """One image of 1 x 4 soft tokens (3 x 12 patches at the tiny 3 x 3 pooling), padded to 6 tokens."""
    k = int(config.pooling_kernel_size)
    high, wide, total = k, 4 * k, 6 * k * k
    g = torch.Generator().manual_seed(12)
    pixels = torch.zeros(1, total, 3 * int(config.patch_size) ** 2)
    pixels[0, : high * wide] = torch.rand(high * wide, pixels.shape[-1], generator=g)
    ys, xs = torch.meshgrid(torch.arange(high), torch.arange(wide), indexing="ij")
    positions = torch.full((1, total, 2), -1, dtype=torch.int64)
    positions[0, : high * wide] = torch.stack([xs.reshape(-1), ys.reshape(-1)], dim=-1)
    return {"pixel_values": pixels, "pixel_position_ids": positions}


def _images(config: Any) -> dict[str, torch.Tensor]:
    """One image of 5 x 2 patches."""
    p = int(config.patch_size)
    return {"pixel_values": torch.randn(1, 3, 5 * p, 2 * p, generator=torch.Generator().manual_seed(13))}


def _queries(config: Any) -> dict[str, torch.Tensor]:
    """Three rows of 6 queries over 9 image positions."""
    g = torch.Generator().manual_seed(14)
    return {
        "query_embeds": torch.randn(3, 6, int(config.hidden_size), generator=g),
        "encoder_hidden_states": torch.randn(3, 9, int(config.encoder_hidden_size), generator=g),
    }


CASES: dict[str, tuple[str, Callable[[Any], dict[str, torch.Tensor]], list[str]]] = {
    "siglip2_vision_model": ("Siglip2VisionModel", _naflex, ["last_hidden_state", "pooler_output"]),
    "gemma4_vision": ("Gemma4VisionModel", _padded_patches, ["last_hidden_state"]),
    "pixtral": ("PixtralVisionModel", _images, ["last_hidden_state"]),
    "blip_2_qformer": ("Blip2QFormerModel", _queries, ["last_hidden_state"]),
}
# CI: the graphs computed here (SigLIP 2's resampled table per image, Pixtral's packed images); Gemma 4's
# and the Q-Former's graphs are their own forward (Gemma 4's also in its vision-language package's
# tests), under FASTONNX_FULL_MATRIX=1
IN_CI = ("siglip2_vision_model", "pixtral")


def _run(s: Any, names: list[str], tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    feeds = {n: t.numpy() for n, t in zip(names, tensors, strict=True)}
    return [torch.from_numpy(v) for v in s.run(None, feeds)]


@pytest.mark.parametrize("model_type", sampled(sorted(CASES), lambda name: name in IN_CI))
def test_the_tower_alone_exports_verified_and_matches_at_other_sizes(
    tmp_path: pathlib.Path, model_type: str
) -> None:
    import transformers

    class_name, inputs, outputs = CASES[model_type]
    folder = tmp_path / "checkpoint"
    architecture_sweep().build_checkpoint("feature-extraction", model_type, class_name, folder)
    written = fastonnx.export_pretrained(
        folder, tmp_path / "package", task="feature-extraction", progress=False
    )
    assert written.verified is True, written.verify_note

    model = getattr(transformers, class_name).from_pretrained(folder).eval()
    feeds = inputs(model.config)
    session = ort.InferenceSession(str(tmp_path / "package" / "model.onnx"))
    assert [i.name for i in session.get_inputs()] == list(feeds)
    assert [o.name for o in session.get_outputs()] == outputs
    got = session.run(None, {name: value.numpy() for name, value in feeds.items()})
    with torch.no_grad():
        expected = model(**feeds)
    for name, value in zip(outputs, got, strict=True):
        torch.testing.assert_close(torch.from_numpy(value), getattr(expected, name), atol=1e-4, rtol=1e-3)

    # the check itself: fails on a file off in one value, in each of its two examples
    spec = towers_alone.tower_graph(model)
    bad = towers_alone.check(OffSession(session), model, spec, _run, float32_tolerance)
    assert [i.passed for i in bad if i.name.startswith(outputs[0])] == [False, False], bad
