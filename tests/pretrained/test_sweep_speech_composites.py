"""Audio-LLMs the architecture sweep found failing, each built from the sweep's tiny config, exported by
``export_pretrained`` in the three-file layout (audio_language.py) and verified (the audio features, then
a greedy generation against transformers' ``generate``):

- Granite Speech (and Granite Speech Plus): its conformer attends within blocks of ``context_size``
  frames and pads and masks the last one under ``if frames % context_size > 0``, a guard on the frames;
  speech_encoders.py swaps in a form that always pads to whole blocks and masks the padded keys;
- Qwen2-Audio: no ``get_audio_features``, its forward runs the audio tower inline on the frames' mask it
  calls ``feature_attention_mask``; audio_language.py calls the same modules the same way.
"""

from __future__ import annotations

import pathlib

import pytest
import torch
from checkpoint_folders import architecture_sweep
from torch.export import Dim

import fastonnx
from fastonnx.capture.speech_encoders import granite_conformer_attention_forward
from support.matrix import sampled

_sweep = architecture_sweep

FIXED = [
    ("text2text-generation", "granite_speech", "GraniteSpeechForConditionalGeneration"),
    ("automatic-speech-recognition", "granite_speech_plus", "GraniteSpeechPlusForConditionalGeneration"),
    ("text2text-generation", "qwen2_audio", "Qwen2AudioForConditionalGeneration"),
]


@pytest.mark.parametrize(
    ("task", "model_type", "class_name"),
    # Qwen2-Audio (7 s) in CI; Granite Speech's (35 s: its swap is tested below on its own) under
    # FASTONNX_FULL_MATRIX=1
    sampled(FIXED, lambda c: c[1] == "qwen2_audio"),
    ids=lambda v: str(v),
)
def test_audio_language_model_exports_verified(
    tmp_path: pathlib.Path, task: str, model_type: str, class_name: str
) -> None:
    folder = tmp_path / "checkpoint"
    _sweep().build_checkpoint(task, model_type, class_name, folder)
    written = fastonnx.export_pretrained(folder, tmp_path / "package", task=task, progress=False)
    assert written.verified is True, written.verify_note
    assert {"audio_encoder.onnx", "embed_tokens.onnx", "decoder_model_merged.onnx"} <= {
        p.name for p in written.outdir.iterdir()
    }


@pytest.mark.parametrize("model_type", ["granite_speech", "granite_speech_plus"])
def test_granite_block_attention_matches_eager_at_every_remainder(model_type: str) -> None:
    import importlib

    module = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    prefix = "".join(p.capitalize() for p in model_type.split("_"))
    config = getattr(module, f"{prefix}EncoderConfig")(
        hidden_dim=32, num_heads=2, dim_head=16, context_size=8, max_pos_emb=12
    )
    torch.manual_seed(0)
    attention = getattr(module, f"{prefix}ConformerAttention")(config).eval()
    distances = torch.arange(8)
    dists = torch.clamp(distances[:, None] - distances[None, :], -8, 8) + 12
    # one partial block, whole blocks, and several blocks with a partial last one, batch 2
    for frames in (1, 5, 8, 9, 16, 21):
        states = torch.randn(2, frames, 32)
        with torch.no_grad():
            want = attention(states, dists)
            got = granite_conformer_attention_forward(attention, states, dists)
        torch.testing.assert_close(got, want, msg=f"{frames} frames")


def test_granite_block_attention_converts_for_every_frame_count() -> None:
    """Exported by fastonnx (which swaps the form in) with the frames dynamic from 21 (three blocks):
    no guard kept, and the file agrees with transformers' eager attention at every remainder."""
    from transformers.models.granite_speech import modeling_granite_speech as granite

    config = granite.GraniteSpeechEncoderConfig(
        hidden_dim=32, num_heads=2, dim_head=16, context_size=8, max_pos_emb=12
    )
    attention = granite.GraniteSpeechConformerAttention(config).eval()
    distances = torch.arange(8)
    dists = torch.clamp(distances[:, None] - distances[None, :], -8, 8) + 12

    class Attend(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attention = attention

        def forward(self, states: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.attention(states, dists)
            return out

    result = fastonnx.to_onnx(Attend(), (torch.randn(1, 21, 32),), dynamic_shapes=({1: Dim.DYNAMIC},))
    assert "guards_kept" not in result.stats and "narrowed" not in result.stats, result.stats
    for count in (3, 8, 13, 40):
        states = torch.randn(1, count, 32)
        with torch.no_grad():
            torch.testing.assert_close(result(states), attention(states, dists), msg=f"{count} frames")
