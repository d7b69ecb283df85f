"""The text2text-generation / automatic-speech-recognition architectures the sweep found failing, each built
from the sweep's tiny config, exported by ``export_pretrained`` and verified against transformers eager:

- Canary: a composite seq2seq config, its sizes in ``encoder_config`` and ``decoder_config``;
- Cohere ASR: a flat seq2seq config whose cache holds ``num_key_value_heads`` heads of ``head_dim``;
- Pop2Piano: ``input_features`` are the encoder's embeddings (frames of ``d_model`` values);
- Qwen3-ASR: its windowed audio attention as one attention masked to the windows (audio_windows.py);
- MOSS-Transcribe-Diarize: positions passed through the forward's keywords to its language model, and
  the ``padding_mask`` its ``get_audio_features`` requires but only documents given as its forward does;
- MusicFlamingo: its audio encoder reads the prompt's ``input_ids`` too (its rows' rotary timestamps
  follow each window's place in its audio), over all the prompt's windows in one run;
- SeamlessM4Tv2: its sinusoidal positions from their formula, no table regrown past its length
  (seq2seq_shifts.py, as M2M100's).
"""

from __future__ import annotations

import pathlib

import pytest
import torch
from checkpoint_folders import architecture_sweep

import fastonnx
from fastonnx.capture.audio_windows import masked_audio_windows, same_window
from fastonnx.capture.seq2seq_shifts import guard_free_seq2seq_shifts
from fastonnx.pretrained.task_inputs import seq2seq_shape
from support.matrix import sampled

FIXED = [
    ("automatic-speech-recognition", "cohere_asr"),
    ("automatic-speech-recognition", "pop2piano"),
    ("automatic-speech-recognition", "qwen3_asr"),
    ("text2text-generation", "qwen3_asr"),
    ("automatic-speech-recognition", "seamless_m4t_v2"),
    ("text2text-generation", "seamless_m4t_v2"),
    ("automatic-speech-recognition", "canary"),
    ("text2text-generation", "moss_transcribe_diarize"),
    ("text2text-generation", "musicflamingo"),
]


@pytest.mark.parametrize(
    ("task", "model_type"),
    # Pop2Piano in CI (the smallest: ~15 s); the rest under FASTONNX_FULL_MATRIX=1
    sampled(FIXED, lambda c: c[1] == "pop2piano"),
    ids=lambda v: str(v),
)
def test_audio_row_package_verifies(tmp_path: pathlib.Path, task: str, model_type: str) -> None:
    sweep = architecture_sweep()
    class_name = dict(sweep.architectures(task))[model_type]
    folder = tmp_path / "checkpoint"
    sweep.build_checkpoint(task, model_type, class_name, folder)
    written = fastonnx.export_pretrained(folder, tmp_path / "package", task=task, progress=False)
    assert written.verified is True, written.verify_note


def test_flat_seq2seq_cache_has_key_value_heads() -> None:
    from transformers import CohereAsrConfig

    config = CohereAsrConfig(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_hidden_layers=2
    )
    assert seq2seq_shape(config) == (2, 2, 8, 64)


def _qwen3_asr_encoder() -> torch.nn.Module:
    from transformers.models.qwen3_asr.configuration_qwen3_asr import Qwen3ASREncoderConfig
    from transformers.models.qwen3_asr.modeling_qwen3_asr import Qwen3ASREncoder

    torch.manual_seed(0)
    config = Qwen3ASREncoderConfig(
        d_model=32,
        encoder_layers=1,
        encoder_attention_heads=2,
        encoder_ffn_dim=64,
        num_mel_bins=16,
        downsample_hidden_size=8,
        max_position_embeddings=64,
        n_window=50,
        n_window_infer=200,  # windows of 2 chunks' rows: several windows an audio
        output_dim=32,
    )
    config._attn_implementation = "sdpa"
    return Qwen3ASREncoder(config).eval()


def test_qwen3_asr_windows_as_one_masked_attention() -> None:
    encoder = _qwen3_asr_encoder()
    features = torch.randn(2, 16, 700)
    mask = torch.zeros(2, 700, dtype=torch.int64)
    mask[0, :650], mask[1, :333] = 1, 1  # two audios, windows cut mid-audio, a short last one
    with torch.no_grad():
        expected = encoder(features, mask).last_hidden_state
        with masked_audio_windows():
            got = encoder(features, mask).last_hidden_state
    torch.testing.assert_close(got, expected)


def test_window_bounds_give_transformers_windows() -> None:
    from transformers.models.qwen3_asr import modeling_qwen3_asr as qwen3_asr

    chunks = torch.tensor([100, 100, 100, 40, 100, 7, 0, 0])  # two audios of 4 chunks: 340 and 107 frames
    lengths = torch.tensor([340, 107])
    cu = qwen3_asr.get_audio_cu_seqlens(chunks, lengths, 200, 50).tolist()
    rows = cu[-1]
    window = torch.zeros(rows, dtype=torch.long)
    for i, (start, end) in enumerate(zip(cu, cu[1:])):
        window[start:end] = i
    expected = window[:, None] == window[None, :]
    with masked_audio_windows():
        bounds = qwen3_asr.get_audio_cu_seqlens(chunks, lengths, 200, 50)
    assert len(cu) - 1 > len(lengths)  # a window cut within an audio
    torch.testing.assert_close(same_window(bounds, rows), expected)


def test_seamless_m4t_v2_positions_by_formula() -> None:
    from transformers.models.seamless_m4t_v2 import modeling_seamless_m4t_v2 as seamless

    table = seamless.SeamlessM4Tv2SinusoidalPositionalEmbedding(8, 16, padding_idx=1)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 1, 1]])  # past the 8 positions, padded
    with torch.no_grad():
        expected = table(ids, past_key_values_length=3)  # transformers regrows its table
        with guard_free_seq2seq_shifts():
            got = table(ids, past_key_values_length=3)
    torch.testing.assert_close(got, expected)
