"""feature-extraction of bare image-grid vision towers (tower_features.py): the sweep's tiny tower exported
and verified against the tower's own forward on two grids, and the check failing on a file that is off."""

from __future__ import annotations

import pathlib
from typing import Any

import onnxruntime as ort
import pytest
import torch
from checkpoint_folders import architecture_sweep

import fastonnx
from fastonnx.pretrained import tower_features
from fastonnx.pretrained.half_package import float32_tolerance
from support.matrix import sampled
from support.off_sessions import OffSession

# CI: a form's bare tower (LFM3-VL's: its states before the model's projector); Qwen2.5-VL's (attention
# windows, the merged tokens reordered: exported and verified in CI as test_vision_genai.py's vision encoder,
# two windows included), Qwen3-VL's (a learned position table resampled, deepstack features), GLM-4V's (its
# sampled table, a merging convolution), the forms whose tower merges (Inkling2's, HunYuan-VL's
# pooler_output) and the rest under FASTONNX_FULL_MATRIX=1; GLM-Image's plain tower (no merger, no rotary:
# its patches' states) in CI by its own test below
TOWERS = {
    "qwen2_5_vl_vision": ("Qwen2_5_VisionTransformerPretrainedModel", "pooler_output"),
    "qwen3_vl_vision": ("Qwen3VLVisionModel", "pooler_output"),
    "glm4v_vision": ("Glm4vVisionModel", "pooler_output"),
    "exaone4_5_vision": ("Exaone4_5_VisionModel", "pooler_output"),
    "glm_ocr_vision": ("GlmOcrVisionModel", "pooler_output"),
    "lfm3_vl_vision": ("Lfm3VlVisionModel", "last_hidden_state"),
    "kimi_k25_vision": ("Kimi_K25VisionModel", "last_hidden_state"),
    "muse_glimmer_vision": ("MuseGlimmerVisionModel", "last_hidden_state"),
    "video_llama_3_vision": ("VideoLlama3VisionModel", "last_hidden_state"),
    "inkling2_vision": ("Inkling2VisionModel", "pooler_output"),
    "hunyuan_vl_vision": ("HunYuanVLVisionTransformer", "pooler_output"),
    "glm_image_vision": ("GlmImageVisionModel", "last_hidden_state"),
}
IN_CI = ("lfm3_vl_vision",)


def _run(s: Any, names: list[str], tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    feeds = {n: t.numpy() for n, t in zip(names, tensors, strict=True)}
    return [torch.from_numpy(v) for v in s.run(None, feeds)]


@pytest.mark.parametrize("model_type", sampled(sorted(TOWERS), lambda name: name in IN_CI))
def test_the_tower_exports_verified_and_the_check_can_fail(tmp_path: pathlib.Path, model_type: str) -> None:
    import transformers

    folder = tmp_path / "checkpoint"
    class_name, output = TOWERS[model_type]
    architecture_sweep().build_checkpoint("feature-extraction", model_type, class_name, folder)
    written = fastonnx.export_pretrained(
        folder, tmp_path / "package", task="feature-extraction", progress=False
    )
    assert written.verified is True, written.verify_note
    session = ort.InferenceSession(str(tmp_path / "package" / "model.onnx"))
    assert [i.name for i in session.get_inputs()] == ["pixel_values", "image_grid_thw"]
    outputs = [o.name for o in session.get_outputs()]
    assert outputs[0] == output
    assert ("deepstack_features" in outputs) == (model_type == "qwen3_vl_vision")

    # the check itself: both grids pass on the file, and fail on a file off in one row
    model = getattr(transformers, class_name).from_pretrained(folder).eval()
    spec = tower_features.tower_graph(model)
    good = tower_features.check(session, model, spec, _run, float32_tolerance)
    assert len(good) == 2 * len(outputs) and all(i.passed for i in good), good
    bad = tower_features.check(OffSession(session), model, spec, _run, float32_tolerance)
    assert [i.passed for i in bad if i.name.startswith(output)] == [False, False], bad


def test_the_plain_tower_matches_its_forward_on_another_image(tmp_path: pathlib.Path) -> None:
    """GLM-Image's tower (no merger, no rotary) at a grid neither the export nor the check runs."""
    import transformers

    folder = tmp_path / "checkpoint"
    architecture_sweep().build_checkpoint(
        "feature-extraction", "glm_image_vision", "GlmImageVisionModel", folder
    )
    written = fastonnx.export_pretrained(
        folder, tmp_path / "package", task="feature-extraction", progress=False
    )
    assert written.verified is True, written.verify_note
    model = transformers.GlmImageVisionModel.from_pretrained(folder).eval()
    c = model.config
    grid = torch.tensor([[1, 3, 5]])
    patches = torch.randn(15, c.in_channels * c.patch_size**2, generator=torch.Generator().manual_seed(3))
    session = ort.InferenceSession(str(tmp_path / "package" / "model.onnx"))
    (got,) = session.run(None, {"pixel_values": patches.numpy(), "image_grid_thw": grid.numpy()})
    with torch.no_grad():
        expected = model(patches, grid).last_hidden_state
    torch.testing.assert_close(torch.from_numpy(got), expected, atol=1e-4, rtol=1e-3)
