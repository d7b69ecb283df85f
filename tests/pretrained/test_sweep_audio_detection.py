"""Speech families the architecture sweep (scripts/architecture_sweep.py) found failing to export:

- SEW and SEW-D pool their frames by ``squeeze_factor`` and upsample back, aligning the halves with
  ``min()`` and padding under ``if`` on the length; wav2vec2-conformer skews its relative position
  scores with views whose divisibility guards sympy cannot prove. The forms swapped in while torch.export
  captures (capture/speech_encoders.py) are checked against eager at lengths other than the example's;
- LASR's unpadded subsampling convolutions make no frame of fewer than 13 feature frames: its feature
  length starts at the frames that make 2 (``min_features``), as a waveform's does (``min_samples``).

Each is built from the sweep's own tiny config, exported by ``export_pretrained`` and verified against
transformers eager.
"""

from __future__ import annotations

import pathlib

import pytest
import torch
from checkpoint_folders import architecture_sweep

import fastonnx
from fastonnx.capture.speech_encoders import (
    conformer_relative_position_encoding,
    guard_free_speech_encoders,
    skewed_relative_scores,
)
from fastonnx.pretrained.encoder_tasks import min_features, min_samples
from support.matrix import sampled

EXPORTS = [
    ("audio-classification", "sew"),
    ("automatic-speech-recognition", "sew"),
    ("audio-classification", "sew-d"),
    ("automatic-speech-recognition", "sew-d"),
    ("audio-classification", "wav2vec2-conformer"),
    ("audio-frame-classification", "wav2vec2-conformer"),
    ("audio-xvector", "wav2vec2-conformer"),
    ("automatic-speech-recognition", "wav2vec2-conformer"),
    ("automatic-speech-recognition", "lasr_ctc"),
]


@pytest.mark.parametrize(
    ("task", "model_type"),
    sampled(
        EXPORTS,
        # CI: SEW's per-frame logits (the upsampling's padding) and LASR; the conformer's form below
        lambda case: (
            case in {("automatic-speech-recognition", "sew"), ("automatic-speech-recognition", "lasr_ctc")}
        ),
    ),
)
def test_sweep_speech_exports_verified(tmp_path: pathlib.Path, task: str, model_type: str) -> None:
    sweep = architecture_sweep()
    class_name = dict(sweep.architectures(task))[model_type]
    folder = tmp_path / "checkpoint"
    sweep.build_checkpoint(task, model_type, class_name, folder)
    written = fastonnx.export_pretrained(folder, tmp_path / "package", task=task, progress=False)
    assert written.verified is True, written.verify_note


def _sew(model_type: str) -> torch.nn.Module:
    from transformers import SEWConfig, SEWDConfig, SEWDModel, SEWModel

    sizes = dict(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        conv_dim=(16, 16),
        conv_kernel=(10, 3),
        conv_stride=(5, 2),
        num_conv_pos_embeddings=15,  # odd: the positions outnumber the pooled frames by one at times
        num_conv_pos_embedding_groups=4,
        squeeze_factor=3,
    )
    torch.manual_seed(0)
    if model_type == "sew":
        return SEWModel(SEWConfig(**sizes)).eval()
    return SEWDModel(SEWDConfig(**sizes, position_buckets=16, max_position_embeddings=64)).eval()


@pytest.mark.parametrize("model_type", ["sew", "sew-d"])
def test_sew_forms_match_eager_at_every_length(model_type: str) -> None:
    """Captured once, the program run at frame counts of every remainder by the squeeze factor (3) equals
    eager SEW: the positions read at the pooled frames, the upsampled frames zero-padded."""
    model = _sew(model_type)

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, wave: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.model(input_values=wave).last_hidden_state
            return out

    # as the capture's refinement does: guards torch cannot prove over a range (views' divisibility)
    # are kept, and ep.module() checks them on each call
    samples = torch.export.Dim.DYNAMIC
    with guard_free_speech_encoders():
        ep = torch.export.export(
            Encoder(), (torch.randn(2, 400),), dynamic_shapes=({1: samples},), strict=False
        )
    captured = ep.module()
    for n in (70, 80, 90, 400, 410, 1001):  # 6, 7, 8, 39, 40, 99 frames
        wave = torch.randn(2, n, generator=torch.Generator().manual_seed(n))
        with torch.no_grad():
            expected = Encoder()(wave)
            got = captured(wave)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_sew_starts_at_two_pooled_frames() -> None:
    """2 frames after pooling by 3: 6 frames of the convolutions, 60 samples."""
    model = _sew("sew")
    frames = model._get_feat_extract_output_lengths  # type: ignore[operator]
    assert int(frames(min_samples(model))) == 6 and int(frames(min_samples(model) - 1)) == 5


def test_conformer_skew_matches_transformers() -> None:
    """The gathered relative position scores equal wav2vec2-conformer's pad-view-slice skew."""
    from transformers import Wav2Vec2ConformerConfig
    from transformers.models.wav2vec2_conformer import modeling_wav2vec2_conformer as conformer

    config = Wav2Vec2ConformerConfig(
        hidden_size=32, num_attention_heads=4, position_embeddings_type="relative"
    )
    torch.manual_seed(0)
    attention = conformer.Wav2Vec2ConformerSelfAttention(config).eval()
    torch.nn.init.normal_(attention.pos_bias_u)
    torch.nn.init.normal_(attention.pos_bias_v)
    positions = conformer.Wav2Vec2ConformerRelPositionalEmbedding(config)
    for frames in (1, 2, 5, 17):
        hidden = torch.randn(2, frames, 32)
        relative = positions(hidden)
        query = torch.randn(2, 4, frames, 8)
        key = torch.randn(2, 4, frames, 8)
        with torch.no_grad():
            expected = conformer._apply_relative_position_encoding(attention, query, key, relative)
            with guard_free_speech_encoders():
                assert conformer._apply_relative_position_encoding is conformer_relative_position_encoding
                got = conformer._apply_relative_position_encoding(attention, query, key, relative)
        torch.testing.assert_close(got, expected)
    scores = torch.arange(3 * 5, dtype=torch.float32).reshape(3, 5)  # 3 queries, positions 2..-2
    torch.testing.assert_close(
        skewed_relative_scores(scores, 3), torch.tensor([[2.0, 3, 4], [6, 7, 8], [10, 11, 12]])
    )


def test_lasr_features_start_at_two_frames() -> None:
    """LASR's two unpadded convolutions (kernel 5, stride 2) make 2 frames of 17 feature frames, none
    of 12; Parakeet's padded ones make one of a single frame, so its features start at 1."""
    from transformers import LasrEncoderConfig, ParakeetEncoderConfig
    from transformers.models.lasr.modeling_lasr import LasrEncoder
    from transformers.models.parakeet.modeling_parakeet import ParakeetEncoder

    lasr = LasrEncoder(LasrEncoderConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2))
    assert min_features(lasr) == 17
    parakeet = ParakeetEncoder(
        ParakeetEncoderConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2)
    )
    assert min_features(parakeet) == 1
