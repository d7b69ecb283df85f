"""optimum's zero-shot-object-detection, keypoint-detection and time-series-forecasting tasks: one
architecture a task built by the architecture sweep's tiny-config maker, exported by ``export_pretrained``
with its verification; OWL-ViT's flattened queries run again at other numbers of images and queries;
Grounding DINO's phrase masks against transformers'."""

from __future__ import annotations

import pathlib

import numpy as np
import onnxruntime as ort
import pytest
import torch
from checkpoint_folders import architecture_sweep

import fastonnx
from support.matrix import sampled

# task, model type, class, the graph's inputs and outputs
CASES = [
    (
        "zero-shot-object-detection",
        "owlvit",
        "OwlViTForObjectDetection",
        ["input_ids", "attention_mask", "pixel_values"],
        ["logits", "pred_boxes"],
    ),
    (
        "zero-shot-object-detection",
        "owlv2",
        "Owlv2ForObjectDetection",
        ["input_ids", "attention_mask", "pixel_values"],
        ["logits", "pred_boxes"],
    ),
    ("keypoint-detection", "vitpose", "VitPoseForPoseEstimation", ["pixel_values"], ["heatmaps"]),
    ("time-series-forecasting", "patchtst", "PatchTSTForPrediction", ["past_values"], ["prediction_outputs"]),
    (
        "time-series-forecasting",
        "patchtsmixer",
        "PatchTSMixerForPrediction",
        ["past_values"],
        ["prediction_outputs"],
    ),
    # feature-extraction of the forecasters reading more than their values: the lagged ones' time features
    # and observed mask (a missing stretch), TimesFM's padding and frequency class
    (
        "feature-extraction",
        "time_series_transformer",
        "TimeSeriesTransformerModel",
        ["past_values", "past_time_features", "past_observed_mask"],
        ["last_hidden_state", "encoder_last_hidden_state", "loc", "scale"],
    ),
    # Informer's distilled encoder: no mask built where none is given (capture/series_masks.py)
    (
        "feature-extraction",
        "informer",
        "InformerModel",
        ["past_values", "past_time_features", "past_observed_mask"],
        ["last_hidden_state", "encoder_last_hidden_state", "loc", "scale"],
    ),
    # Autoformer's too, and its decoder runs only on future values: the encoder's states alone
    (
        "feature-extraction",
        "autoformer",
        "AutoformerModel",
        ["past_values", "past_time_features", "past_observed_mask"],
        ["encoder_last_hidden_state", "loc", "scale"],
    ),
    (
        "feature-extraction",
        "timesfm",
        "TimesFmModel",
        ["past_values", "past_values_padding", "freq"],
        ["last_hidden_state", "loc", "scale"],
    ),
    # video towers alone: V-JEPA 2's clips of its frames_per_clip; Perception Encoder's of any number of
    # frames (checked at another count below)
    ("feature-extraction", "vjepa2", "VJEPA2Model", ["pixel_values_videos"], ["last_hidden_state"]),
    (
        "feature-extraction",
        "pe_video_encoder",
        "PeVideoEncoder",
        ["pixel_values_videos"],
        ["last_hidden_state"],
    ),
]

# one a task (and the lagged forecasters' inputs: Autoformer's, whose encoder also needs its masks left
# out and whose decoder does not run, over Time Series Transformer's and Informer's); every case under
# FASTONNX_FULL_MATRIX=1
IN_CI = {"owlvit", "vitpose", "patchtst", "autoformer", "pe_video_encoder"}


@pytest.mark.parametrize(
    ("task", "model_type", "class_name", "inputs", "outputs"),
    sampled(CASES, lambda c: c[1] in IN_CI),
    ids=[c[1] for c in sampled(CASES, lambda c: c[1] in IN_CI)],
)
def test_task_package_matches_transformers(
    tmp_path: pathlib.Path, task: str, model_type: str, class_name: str, inputs: list[str], outputs: list[str]
) -> None:
    folder, package = tmp_path / "checkpoint", tmp_path / "package"
    architecture_sweep().build_checkpoint(task, model_type, class_name, folder)
    written = fastonnx.export_pretrained(folder, package, task, progress=False)
    assert (written.task, written.architecture) == (task, class_name)
    assert written.verified is True, written.verify_note
    assert (written.input_names, written.output_names) == (inputs, outputs)
    if model_type == "owlvit":
        _owl_at_other_sizes(folder, written.model_path)
    if model_type == "pe_video_encoder":
        _frames_at_another_count(folder, written.model_path)


def _frames_at_another_count(folder: pathlib.Path, model_path: pathlib.Path) -> None:
    """Clips of 5 frames (the export's example had 3), one clip and two, against transformers eager."""
    import transformers

    eager = transformers.PeVideoEncoder.from_pretrained(folder).eval()
    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    g = torch.Generator().manual_seed(3)
    for clips in (1, 2):
        video = torch.randn(clips, 5, 3, 32, 32, generator=g)
        with torch.no_grad():
            expected = eager(pixel_values_videos=video).last_hidden_state
        (got,) = session.run(None, {"pixel_values_videos": video.numpy()})
        torch.testing.assert_close(torch.from_numpy(got), expected, atol=1e-4, rtol=1e-4)


def _owl_at_other_sizes(folder: pathlib.Path, model_path: pathlib.Path) -> None:
    """The processor's rows of input_ids are images x queries, flattened: one image of three queries and
    three images of four, against transformers eager."""
    import transformers

    eager = transformers.OwlViTForObjectDetection.from_pretrained(folder).eval()
    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    g = torch.Generator().manual_seed(5)
    size = int(eager.config.vision_config.image_size)
    for images, queries, length in ((1, 3, 9), (3, 4, 6)):
        ids = torch.randint(
            3, int(eager.config.text_config.vocab_size), (images * queries, length), generator=g
        )
        mask = torch.ones_like(ids)
        mask[0, length // 2 :] = 0
        pixels = torch.randn(images, 3, size, size, generator=g)
        with torch.no_grad():
            want = eager(input_ids=ids, attention_mask=mask, pixel_values=pixels)
        got = session.run(
            None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "pixel_values": pixels.numpy()}
        )
        assert got[0].shape == (images, want.logits.shape[1], queries)
        for name, value in zip(("logits", "pred_boxes"), got, strict=True):
            expected = getattr(want, name)
            assert float(expected.abs().max()) > 1e-3, name
            torch.testing.assert_close(torch.from_numpy(np.asarray(value)), expected, atol=1e-4, rtol=1e-3)


def test_phrase_masks_match_grounding_dino() -> None:
    """The traceable phrase masks and positions are transformers' own, delimiters at the ends included."""
    from transformers.models.grounding_dino import modeling_grounding_dino as gd

    from fastonnx.capture.traceable_detection import traceable_phrase_masks

    special = torch.tensor([101, 102, 1012, 1013])
    ids = torch.randint(2000, 2100, (4, 11), generator=torch.Generator().manual_seed(2))
    ids[:, 0], ids[0, -1], ids[1, 4], ids[1, 7], ids[2, 3], ids[3, 10] = 101, 102, 1012, 1013, 1012, 1012
    want = gd.generate_masks_with_special_tokens_and_transfer_map(ids, special)
    got = traceable_phrase_masks(ids, special)
    for w, g in zip(want, got, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_special_logit_converts() -> None:
    """Grounding DINO's ``torch.special.logit(x, eps=1e-5)``: aten.special_logit, logit's converter."""

    class Logit(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.special.logit(x, eps=1e-5)

    x = torch.tensor([[0.0, 1e-7, 0.3, 0.5], [0.9, 1.0 - 1e-7, 1.0, 0.01]])
    ep = torch.export.export(Logit(), (x,))
    assert "aten.special_logit.default" in {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    torch.testing.assert_close(fastonnx.to_onnx(ep, (x,))(x), Logit()(x), atol=1e-4, rtol=1e-4)
