"""Codecs' encodings (feature-extraction, encoder_tasks.CODEC_OUTPUTS) at any waveform length: the capture
forms of capture/codec_paddings.py against transformers' own modules, exported with a symbolic length and
run in onnxruntime at lengths other than the example's. The codecs' full exports are in
test_sweep_buildable.py's EXPORTED list."""

from __future__ import annotations

import pathlib
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import fastonnx


class _MimiConvolutions(torch.nn.Module):
    """Mimi's padded convolutions: causal zero-padded at a stride of 4, non-causal reflect-padded at 5,
    and PocketTTS's copy of the class, causal, dilated and replicate-padded."""

    def __init__(self) -> None:
        super().__init__()
        from transformers.models.mimi.modeling_mimi import MimiConv1d
        from transformers.models.pocket_tts_audio_tokenizer.modeling_pocket_tts_audio_tokenizer import (
            PocketTTSAudioTokenizerConv1d,
        )

        causal = SimpleNamespace(use_causal_conv=True, pad_mode="constant")
        centred = SimpleNamespace(use_causal_conv=False, pad_mode="reflect")
        self.layers = torch.nn.ModuleList(
            [
                MimiConv1d(causal, 1, 4, kernel_size=8, stride=4),
                MimiConv1d(centred, 4, 4, kernel_size=10, stride=5),
                PocketTTSAudioTokenizerConv1d(causal, 4, 3, kernel_size=3, dilation=2, pad_mode="replicate"),
            ]
        )

    def forward(self, waveform: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            waveform = layer(waveform)
        return waveform


def test_mimis_convolution_paddings_follow_the_length(tmp_path: pathlib.Path) -> None:
    """Mimi's (and PocketTTS's) extra padding is a tensor computed from buffers, a data-dependent size
    torch.export cannot capture symbolically; the form computes it from the convolution's ints."""
    torch.manual_seed(0)
    model = _MimiConvolutions().eval()
    length = torch.export.Dim("length", min=2, max=4096)
    result = fastonnx.to_onnx(
        model,
        (torch.randn(2, 1, 300),),
        dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=8), 2: length},),
        filename=tmp_path / "convolutions.onnx",
    )
    for samples in (2, 41, 1001):  # shorter than the reflect padding, odd, past a stride
        assert result.verify(torch.randn(1, 1, samples)).passed, samples


@pytest.mark.parametrize(("codebook", "rows"), [(16, 3), (16, 26), (16, 40), (64, 3), (64, 40)])
def test_mimis_codes_are_torch_cdists_argmin_at_every_row_count(codebook: int, rows: int) -> None:
    """torch.cdist computes by matrix product past 25 rows (a branch on the frames); the form asks for
    each mode by name and picks as the default mode does: the same codes, exactly."""
    from transformers.models.mimi.modeling_mimi import MimiEuclideanCodebook

    from fastonnx.capture.codec_paddings import mimi_codebook_quantize

    g = torch.Generator().manual_seed(0)
    book = MimiEuclideanCodebook(SimpleNamespace(codebook_size=codebook, codebook_dim=8))
    book.embed_sum.copy_(torch.randn(codebook, 8, generator=g))
    states = torch.randn(rows, 8, generator=g)
    torch.testing.assert_close(mimi_codebook_quantize(book, states), book.quantize(states), rtol=0, atol=0)


def test_a_codec_graph_reads_its_encode_not_its_decoding_forward() -> None:
    """Mimi's forward decodes too (its trim to the input's length guards the length): the graph calls
    ``encode`` where its output declares the fields; VibeVoice's encode, annotated with none, is not."""
    from transformers import MimiConfig, MimiModel

    from fastonnx.pretrained.encoder_tasks import CodecEncoding, codec_encode

    config = MimiConfig(
        hidden_size=16,
        num_filters=4,
        num_residual_layers=1,
        upsampling_ratios=[4, 2],
        codebook_size=16,
        codebook_dim=8,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=8,
        intermediate_size=32,
        num_quantizers=2,
        num_semantic_quantizers=1,
        upsample_groups=16,
    )
    model = MimiModel(config).eval()
    assert codec_encode(model, ("audio_codes",)) == model.encode
    assert CodecEncoding.of(model, ("audio_codes",)) is not None
    assert codec_encode(model, ("audio_values",)) is None
    assert codec_encode(torch.nn.Linear(2, 2), ("audio_codes",)) is None


def test_a_scaled_size_one_guard_is_size_oblivious() -> None:
    """``16*max(1, f) != 16`` (heads x frames reshaped) says frames != 1: what size-oblivious reasoning
    assumes of every size, as ``f != 1`` itself."""
    import sympy

    from fastonnx.capture.guards import _oblivious

    f = sympy.Symbol("f", integer=True, positive=True)
    assert _oblivious(sympy.Ne(16 * sympy.Max(1, f), 16))
    assert not _oblivious(sympy.Ne(16 * f, 32))
    assert not _oblivious(sympy.Ne(16 * f, 17))


class _EncodecCodes(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_values: torch.Tensor) -> torch.Tensor:
        codes: torch.Tensor = self.model.encode(input_values, return_dict=True).audio_codes
        return codes


def test_encodecs_codes_follow_the_length(tmp_path: pathlib.Path) -> None:
    """EnCodec's encode loops ``range(0, length, length)`` (one frame where it does not chunk), which made
    the length an int: the form encodes the one frame, the file reads other lengths as eager does."""
    from transformers import EncodecConfig, EncodecModel

    torch.manual_seed(0)
    config = EncodecConfig(
        hidden_size=8,
        num_filters=4,
        upsampling_ratios=[2],
        codebook_size=16,
        codebook_dim=8,
        num_lstm_layers=1,
        target_bandwidths=[1.5],
        sampling_rate=400,
    )
    model = _EncodecCodes(EncodecModel(config).eval())
    result = fastonnx.to_onnx(
        model,
        (torch.randn(2, 1, 160),),
        dynamic_shapes=(
            {0: torch.export.Dim("batch", min=1, max=8), 2: torch.export.Dim("length", min=16, max=4096)},
        ),
        filename=tmp_path / "encodec.onnx",
    )
    for samples in (17, 1001):
        assert result.verify(torch.randn(1, 1, samples)).passed, samples


def _tiny_neucodec() -> torch.nn.Module:
    from transformers import NeuCodecConfig, NeuCodecModel

    torch.manual_seed(0)
    semantic = {
        "model_type": "wav2vec2-bert",
        "hidden_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "intermediate_size": 64,
        "output_hidden_size": 32,
        "conv_depthwise_kernel_size": 3,
        "left_max_position_embeddings": 8,
        "right_max_position_embeddings": 2,
    }
    config = NeuCodecConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=16,
        encoder_hidden_size=2,
        quantization_dim=64,  # the two encodings concatenated
        semantic_model_config=semantic,
    )
    return NeuCodecModel(config).eval()


def test_a_semantic_codec_reads_its_waveform_and_its_semantic_frames() -> None:
    """X-Codec2 concatenates its semantic and acoustic encodings: its features one frame a hop of the
    waveform, the two dims linked; NeuCodec trims both to the shorter, its features their own length."""
    from transformers import NeuCodecConfig, Xcodec2Config

    from fastonnx.pretrained.encoder_tasks import AUDIO, AUDIO_FRAMES, FEATURES, semantic_codec_inputs

    g = torch.Generator().manual_seed(0)
    xcodec2 = Xcodec2Config()
    inputs, dims = semantic_codec_inputs(xcodec2, 2, 1, g, "cpu")
    hop, width = xcodec2.hop_length, xcodec2.semantic_model_config.feature_projection_input_dim
    assert inputs["input_values"].shape[-1] == hop * inputs["input_features"].shape[1]
    assert inputs["input_features"].shape[-1] == width == 160  # two 80-bin mel frames a 20 ms hop
    assert dims == {
        "input_values": {0: "batch_size", 2: f"{hop}*{AUDIO_FRAMES}"},
        "input_features": {0: "batch_size", 1: AUDIO_FRAMES},
    }
    _, dims = semantic_codec_inputs(NeuCodecConfig(), 2, 1, g, "cpu")
    assert dims["input_values"][2] == AUDIO and dims["input_features"][1] == FEATURES


def test_neucodecs_frames_trim_to_the_shorter_as_transformers() -> None:
    """NeuCodec trims its two encodings with Python's min (a guard on which is shorter); the form's
    torch.sym_min encodes as transformers' encode does, with either the shorter."""
    from fastonnx.capture.codec_paddings import neucodec_encode_symbolic

    model = _tiny_neucodec()
    g = torch.Generator().manual_seed(0)
    hop = model.config.encoder_hop_length
    waveform = torch.randn(1, 1, 6 * hop, generator=g)
    mask = torch.ones(1, 1, 6 * hop, dtype=torch.int64)
    width = model.config.semantic_model_config.feature_projection_input_dim
    for features in (3, 9):  # fewer semantic frames than the 6 acoustic ones, then more
        frames = torch.randn(1, features, width, generator=g)
        with torch.no_grad():
            expected = model.encode(
                waveform, frames, padding_mask=mask, output_latents=True, return_dict=True
            )
            got = neucodec_encode_symbolic(model, waveform, frames, padding_mask=mask, output_latents=True)
        assert got.audio_codes.shape[-1] == min(features, 6)
        for field in ("audio_codes", "latents", "audio_codes_mask"):
            torch.testing.assert_close(getattr(got, field), getattr(expected, field), rtol=0, atol=0)


def test_xcodecs_frame_count_is_transformers_without_a_float() -> None:
    """X-Codec counts its acoustic frames by int() of a float division (audio_utils), which made the
    length an int; the form's integer arithmetic gives the same counts."""
    from transformers.audio_utils import conv1d_output_length

    from fastonnx.capture.codec_paddings import conv1d_output_length_by_ints

    for conv in (
        torch.nn.Conv1d(1, 1, kernel_size=7, padding=3),
        torch.nn.Conv1d(1, 1, kernel_size=16, stride=8, padding=4),
        torch.nn.Conv1d(1, 1, kernel_size=3, dilation=9, padding=9),
        torch.nn.Conv1d(1, 1, kernel_size=10, stride=5),
    ):
        for length in (10, 11, 319, 320, 16000, 16001):
            assert conv1d_output_length_by_ints(conv, length) == conv1d_output_length(conv, length)


class _XcodecForward(torch.nn.Module):
    """XcodecModel's forward as audio_inputs reads it (its signature and documented shape), without
    importing its modeling module (HuBERT and DAC with it: seconds)."""

    def forward(self, input_values: torch.Tensor, audio_codes: Any = None, bandwidth: Any = None) -> Any:
        """input_values (`torch.Tensor` of shape `(batch_size, channels, num_samples)`): the waveform."""
        raise NotImplementedError


def test_xcodec_reads_its_waveform_in_whole_hops() -> None:
    """X-Codec pads its waveform for its acoustic encoder or not by whether its acoustic and semantic
    frames differ, a branch on the length's remainder; its extractor (DAC's) pads to whole hops, where
    they never differ: the graph's waveform is hop_length x audio_frames samples."""
    from transformers import XcodecConfig

    from fastonnx.pretrained.encoder_tasks import AUDIO_FRAMES, audio_inputs

    config = XcodecConfig()
    inputs, dims = audio_inputs(_XcodecForward(), config, 2, "meta")
    assert dims == {"input_values": {0: "batch_size", 2: f"{config.hop_length}*{AUDIO_FRAMES}"}}
    assert inputs["input_values"].shape[-1] % config.hop_length == 0


def test_torchs_crash_stating_its_fixes_captures_the_dims_as_dynamic() -> None:
    """Mimi's length through its nested // and %: torch refuses, then asserts "Cannot create Dim with
    inconsistent min" building its fixes, naming no Dim; refinement 0 captures every named Dim as
    Dim.DYNAMIC (guards.py checks the sizes asked), keeping size-oblivious reasoning."""
    from torch.export import Dim

    from fastonnx.capture import refinement

    length = Dim("audio_sequence_length", min=2, max=1 << 20)
    shapes = {"input_values": {0: Dim("batch_size"), 2: length}}
    attempt = refinement._Attempt(shapes, shapes, oblivious=True, may_drop=True)
    crash = "Cannot create Dim with inconsistent min=0, max=-1092"
    assert refinement.REFINEMENTS[0] is refinement.crashed_suggestions_as_dynamic
    assert refinement.crashed_suggestions_as_dynamic(attempt, crash, "WaveformEncoder")
    assert attempt.shapes == {"input_values": {0: Dim.DYNAMIC, 2: Dim.DYNAMIC}}
    assert attempt.checked and attempt.oblivious
    assert not refinement.crashed_suggestions_as_dynamic(attempt, crash, "WaveformEncoder")  # once


def test_a_frames_greater_than_one_guard_is_a_size_one_guard() -> None:
    """PocketTTS's first refusal names ``frames != 1`` and ``frames > 1`` (transformers' sdpa
    ``q_length > 1``): both what size-oblivious reasoning makes of a size of 1."""
    from fastonnx.capture.dynamic_dims import size_one_guards_only

    guard = "  - Not all values of n = L['x'].size()[2] in the specified range satisfy the generated guard "
    ones = guard + "((L['x'].size()[2] + 3) // 4) != 1.\n" + guard + "((L['x'].size()[2] + 3) // 4) > 1.\n"
    assert size_one_guards_only(ones)
    assert not size_one_guards_only(ones + guard + "L['x'].size()[2] <= 512.\n")
