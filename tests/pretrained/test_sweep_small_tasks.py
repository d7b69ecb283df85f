"""Small tasks the architecture sweep (scripts/architecture_sweep.py) found failing to export:

- Grounding DINO ties its decoder's ``bbox_embed`` to the head's: the tied name cut at
  ``model.decoder.`` meets the head's own key in the shards, so the export's wrapper prefix was
  ambiguous and the weights it reads (``model.level_embed``) were not found. Each weight's names now
  count together (``wrapper_prefix``).
- Nemotron 3 Diarization's offline forward loops over chunks of ``chunk_length`` encoder frames, a
  loop whose count torch.export decides on the length: captured as the one chunk the config declares
  (capture/diarization_chunks.py), its feature length bounded to that chunk.
- SuperPoint's keypoints are a count per image only the data decides, padded to the batch's largest in
  a Python loop over the images: exported for one image a run, the count a data-dependent length of
  its outputs (ONNX NonZero); onnxruntime refuses a batch of 2.

Each is built from the sweep's own tiny config, exported by ``export_pretrained`` and verified against
transformers eager.
"""

from __future__ import annotations

import pathlib

import pytest
import torch
from checkpoint_folders import architecture_sweep

import fastonnx
from fastonnx.capture.diarization_chunks import offline_chunk_features, one_chunk_diarization
from fastonnx.stored_weights.checkpoints import wrapper_prefix
from support.matrix import sampled

EXPORTS = [
    ("zero-shot-object-detection", "grounding-dino"),
    ("zero-shot-object-detection", "mm-grounding-dino"),
    ("audio-frame-classification", "nemotron3_diarization"),
    ("keypoint-detection", "superpoint"),
]

# CI: at most one export of this file (<= 20 s)
CI_EXPORTS = {("keypoint-detection", "superpoint")}


@pytest.mark.parametrize(("task", "model_type"), sampled(EXPORTS, lambda case: case in CI_EXPORTS))
def test_sweep_small_task_exports_verified(tmp_path: pathlib.Path, task: str, model_type: str) -> None:
    sweep = architecture_sweep()
    class_name = dict(sweep.architectures(task))[model_type]
    folder = tmp_path / "checkpoint"
    sweep.build_checkpoint(task, model_type, class_name, folder)
    written = fastonnx.export_pretrained(folder, tmp_path / "package", task=task, progress=False)
    assert written.verified is True, written.verify_note
    if model_type == "superpoint":  # one image a run: a batch of 2 is refused, not padded silently
        import numpy as np
        import onnxruntime as ort

        session = ort.InferenceSession(str(tmp_path / "package" / "model.onnx"))
        with pytest.raises(Exception, match="pixel_values"):
            session.run(None, {"pixel_values": np.zeros((2, 3, 224, 224), np.float32)})


def test_wrapper_prefix_counts_a_tied_weights_names_together() -> None:
    # Grounding DINO's shards: the head's bbox_embed, not the decoder's tied name for it
    index = dict.fromkeys(["model.level_embed", "bbox_embed.0.weight"])
    decoder, head = "inner.model.model.decoder.bbox_embed.0.weight", "inner.model.bbox_embed.0.weight"
    keys = ["inner.model.model.level_embed", decoder]
    tied = {decoder: [decoder, head], head: [decoder, head]}
    assert wrapper_prefix(keys, index, tied) == "inner.model."  # type: ignore[arg-type]
    assert wrapper_prefix(keys, index) == ""  # type: ignore[arg-type]  # untied: two cuts disagree


def _diarizer() -> torch.nn.Module:
    from transformers import Nemotron3DiarizationConfig, Nemotron3DiarizationForAudioFrameClassification

    audio = dict(
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=2,
        num_key_value_heads=2,
        num_hidden_layers=1,
        num_mel_bins=16,
        subsampling_factor=8,
    )
    head = dict(audio_hidden_size=32, hidden_size=32, num_speakers=8, subsampling_factor=8)
    config = Nemotron3DiarizationConfig(
        audio_config=audio, head_config=head, chunk_length=4, chunk_right_context=2
    )
    torch.manual_seed(0)
    return Nemotron3DiarizationForAudioFrameClassification(config).eval()


def test_one_chunk_diarization_matches_transformers_offline_forward() -> None:
    model = _diarizer()
    assert offline_chunk_features(model) == (9, 32)  # 2 encoder frames to chunk_length 4 of 8 frames
    g = torch.Generator().manual_seed(0)
    for frames in (9, 13, 24, 32):  # a padded last group (13) and none (24)
        features = torch.randn(2, frames, 16, generator=g)
        with torch.no_grad():
            expected = model(input_features=features).logits
            with one_chunk_diarization():
                got = model(input_features=features).logits
        torch.testing.assert_close(got, expected)
