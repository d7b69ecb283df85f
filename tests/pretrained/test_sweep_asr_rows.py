"""Automatic-speech-recognition rows the architecture sweep found failing to export, each built from
the sweep's tiny config, exported by ``export_pretrained`` and verified, then its audio graph run here
at another length than the export's example, against transformers eager:

- Fun-ASR-Nano: its encoder adds a sinusoid table of ``max_position_embeddings`` rows counted from 1,
  so it reads at most one frame fewer; the audio graph's frames are bounded so up front
  (audio_language.most_frames), and the file records the bound; so are its bare model's
  (feature-extraction: audio_base_models);
- Granite Speech 5 (CTC): its conformer pads its blocks and masks under ``if num_padded > 0`` and its
  subsampling blocks slice a convolution's frames to a pairwise mean's, guards on the frames (right at
  multiples of 4 alone); speech_encoders.py swaps in forms that always pad and read frames by index;
- Moonshine Streaming: its decoder adds its positions to the encoder states in place, which made the
  decoder files return their input as an extra output (``mutated.encoder_hidden_states``) that the
  package's check could not pair with transformers' cache; the decoders now read a copy
  (task_inputs.encoder_output);
- VibeVoice ASR: its ``get_audio_features`` reads the waveform (``input_values``, whole tokens of 3200
  samples) and ``padding_mask``, with ``sample`` adding noise by default; its audio graph reads one
  chunk of ``acoustic_tokenizer_chunk_size`` samples without the noise (``sample=False``), and a form
  runs its tokenizers without the streaming caches whose update branches on the samples;
- Kyutai STT: a text token and an audio frame's codes a position (frame_paired_speech.py); its codes'
  graph runs here on a batch of two at another length, its rest of samples dropped as generate drops it;
- Voxtral Realtime: its audio encoder steps beside the decoder with a cache of its own
  (streamed_audio_steps.py); the check crosses both sliding windows (the tiny config shrinks them), and
  its embedder runs here on a batch of two at another length;
- VibeVoice and Dia: text-to-speech models transformers also lists in its speech-seq2seq mapping; the
  export says so (speech_synthesis.refuse_recognition) rather than failing on a missing audio path.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import onnx
import onnxruntime as ort
import pytest
import torch
from checkpoint_folders import architecture_sweep
from torch.export import Dim

import fastonnx
from fastonnx.errors import InputError
from fastonnx.pretrained import audio_language as al
from fastonnx.pretrained import task_inputs

ASR = "automatic-speech-recognition"


def _session(path: pathlib.Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _verified_package(tmp_path: pathlib.Path, model_type: str) -> tuple[pathlib.Path, Any]:
    """The sweep's tiny ``model_type`` exported for speech recognition, verified: its package folder and
    the checkpoint as transformers loads it (float32, eval)."""
    import transformers

    folder, package = tmp_path / "checkpoint", tmp_path / "package"
    sweep = architecture_sweep()
    class_name = dict(sweep.architectures(ASR))[model_type]
    sweep.build_checkpoint(ASR, model_type, class_name, folder)
    written = fastonnx.export_pretrained(folder, package, task=ASR, progress=False)
    assert written.verified is True, written.verify_note
    return package, getattr(transformers, class_name).from_pretrained(folder, dtype=torch.float32).eval()


@pytest.mark.full_matrix  # 18 s; its audio graph alone below, in CI
def test_fun_asr_nano_package_verifies(tmp_path: pathlib.Path) -> None:
    package, model = _verified_package(tmp_path, "fun_asr_nano")
    top = int(model.config.audio_config.max_position_embeddings) - 1
    session = _session(package / al.AUDIO_FILE)
    g = torch.Generator().manual_seed(3)
    size = model.config.audio_config.input_size
    # a length the export did not see, half padded, and the longest the table holds
    for frames, kept in ((37, 20), (top, top)):
        features = torch.randn(1, frames, size, generator=g)
        mask = (torch.arange(frames) < kept).to(torch.int64)[None]
        (got,) = session.run(None, {"input_features": features.numpy(), al.MASK: mask.numpy()})
        with torch.no_grad():
            want = model.get_audio_features(input_features=features, input_features_mask=mask).pooler_output
        torch.testing.assert_close(torch.from_numpy(got), want, atol=1e-4, rtol=1e-3, msg=f"{frames} frames")
    # the file keeps the bound: the table's rows less the one position 0 takes
    proto = onnx.load(str(package / al.AUDIO_FILE), load_external_data=False)
    proven = json.loads({p.key: p.value for p in proto.metadata_props}["pkg.fastonnx.proven_sizes"])["dims"]
    assert proven["input_features[1]"][1] == top


def test_fun_asr_nano_audio_graph_bounded_by_its_table() -> None:
    """The package's audio graph alone, from the sweep's tiny config: captured at once for every length
    the table holds (no CaptureError), and right at another length and at the bound."""
    import transformers

    config = architecture_sweep().tiny_config("fun_asr_nano")
    torch.manual_seed(0)
    model = transformers.FunAsrNanoForConditionalGeneration(config).eval()
    spec = al.audio_text_to_text(model, config)[al.AUDIO_FILE]
    top = int(config.audio_config.max_position_embeddings) - 1
    assert al.most_frames(config) == top
    # the bare model's feature-extraction graph (audio_base_models) takes the same bound
    from fastonnx.pretrained import audio_base_models

    bare = audio_base_models._prompted_dims(model.model, config, al.MASK)
    assert bare["input_features"][1].max == top
    g = torch.Generator().manual_seed(3)
    example = [torch.randn(a.shape, generator=g) if a.is_floating_point() else a for a in spec.args]
    example[1] = torch.ones(1, example[0].shape[1], dtype=torch.int64)
    result = fastonnx.to_onnx(spec.module, tuple(example), dynamic_shapes=spec.dynamic_shapes)
    assert result.stats["dynamic_ranges"]["input_features[1]"][1] == top
    size = example[0].shape[-1]
    for frames, kept in ((37, 20), (top, top)):
        features = torch.randn(1, frames, size, generator=g)
        mask = (torch.arange(frames) < kept).to(torch.int64)[None]
        with torch.no_grad():
            want = model.get_audio_features(input_features=features, input_features_mask=mask).pooler_output
        torch.testing.assert_close(result(features, mask), want, atol=1e-4, rtol=1e-3, msg=f"{frames} frames")


@pytest.mark.full_matrix  # 12 s; its forms through the encoder alone below, in CI
def test_granite_speech5_ctc_at_every_remainder(tmp_path: pathlib.Path) -> None:
    package, model = _verified_package(tmp_path, "granite_speech5_ctc")
    session = _session(package / "model.onnx")
    assert [i.name for i in session.get_inputs()] == ["input_features"]
    g = torch.Generator().manual_seed(4)
    width = model.encoder.input_linear.in_features
    # odd, even not a multiple of 4, and over one block of context_size (128) frames at each rate
    for frames in (9, 30, 131, 517):
        features = torch.randn(2, frames, width, generator=g)
        (got,) = session.run(None, {"input_features": features.numpy()})
        with torch.no_grad():
            want = model(input_features=features).logits
        torch.testing.assert_close(torch.from_numpy(got), want, atol=1e-4, rtol=1e-3, msg=f"{frames} frames")


def test_granite_speech5_encoder_with_a_mask_converts_for_every_frame_count() -> None:
    """The encoder alone with a padding mask (the mask's path, which the CTC package's graph does not
    take), exported by fastonnx (which swaps the forms in) with the frames dynamic: no guard kept, and
    the file agrees with transformers' eager encoder at every remainder of the blocks and pairs."""
    from transformers.models.granite_speech5 import modeling_granite_speech5 as granite5

    config = granite5.GraniteSpeech5EncoderConfig(
        hidden_size=32,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=64,
        num_hidden_layers=2,
        context_size=8,
        max_position_embeddings=8,
        num_mel_bins=4,
        vocab_size=16,
        subsample_layers=[0, 1],
    )
    torch.manual_seed(0)
    encoder = granite5.GraniteSpeech5Encoder(config).eval()

    class Encode(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = encoder

        def forward(self, features: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.encoder(features, attention_mask=mask).last_hidden_state
            return out

    def padded(frames: int) -> tuple[torch.Tensor, torch.Tensor]:
        mask = torch.ones(2, frames, dtype=torch.long)
        mask[1, frames - 5 :] = 0
        return torch.randn(2, frames, 16), mask

    frames = Dim("frames", min=8, max=96)
    result = fastonnx.to_onnx(Encode(), padded(36), dynamic_shapes=({1: frames}, {1: frames}))
    assert "guards_kept" not in result.stats and "narrowed" not in result.stats, result.stats
    for count in (13, 30, 37, 67):
        features, mask = padded(count)
        with torch.no_grad():
            want = encoder(features, attention_mask=mask).last_hidden_state
        torch.testing.assert_close(result(features, mask), want, msg=f"{count} frames")


@pytest.mark.full_matrix  # 14 s; its decoder step alone below, in CI
def test_moonshine_streaming_package_verifies(tmp_path: pathlib.Path) -> None:
    package, model = _verified_package(tmp_path, "moonshine_streaming")
    encoder, decoder = (_session(package / f) for f in ("encoder_model.onnx", "decoder_model.onnx"))
    assert not [o.name for o in decoder.get_outputs() if o.name.startswith("mutated.")]
    g = torch.Generator().manual_seed(5)
    wave = torch.randn(1, 80 * 150, generator=g)  # 150 frames of 80 samples: another length than the export's
    (states,) = encoder.run(None, {"input_values": wave.numpy()})
    ids = torch.tensor([[int(model.config.bos_token_id), 5]])
    mask = torch.ones(states.shape[:2], dtype=torch.int64)
    got = decoder.run(
        None,
        {
            "decoder_input_ids": ids.numpy(),
            "encoder_hidden_states": states,
            "encoder_attention_mask": mask.numpy(),
        },
    )
    with torch.no_grad():
        # the encoder's states before the decoder adds its positions to them in place (transformers then
        # returns them so as encoder_last_hidden_state)
        want_states = model.get_encoder()(input_values=wave).last_hidden_state.clone()
        want = model(input_values=wave, decoder_input_ids=ids)
    torch.testing.assert_close(torch.from_numpy(states), want_states, atol=1e-4, rtol=1e-3)
    torch.testing.assert_close(torch.from_numpy(got[0]), want.logits, atol=1e-4, rtol=1e-3)


def test_moonshine_streaming_decoder_reads_a_copy_of_the_states() -> None:
    """The first decoder step alone, from the sweep's tiny config: no ``mutated.`` output (the model adds
    its positions to the states in place), and the logits and cross-attention cache transformers
    returns at another encoder length than the example's, the states fed left as they were; with a
    padded row, the encoder mask read as transformers reads it (its encoder output's
    ``attention_mask``)."""
    import transformers
    from transformers.models.moonshine_streaming import modeling_moonshine_streaming as streaming

    config = architecture_sweep().tiny_config("moonshine_streaming")
    torch.manual_seed(0)
    model = transformers.MoonshineStreamingForConditionalGeneration(config).eval()
    spec = task_inputs.text2text(model, config, speech=True)["decoder_model.onnx"]
    g = torch.Generator().manual_seed(2)
    example = tuple(
        torch.randn(a.shape, generator=g) if a.is_floating_point() else torch.ones(a.shape, dtype=a.dtype)
        for a in spec.args
    )
    result = fastonnx.to_onnx(
        spec.module,
        example,
        dynamic_shapes=spec.dynamic_shapes,
        input_names=spec.input_names,
        output_names=spec.output_names,
    )
    assert not [n for n in result.output_names if n.startswith("mutated.")], result.output_names
    ids = torch.tensor([[1, 7, 9], [1, 4, 2]])
    states = torch.randn(2, 11, example[1].shape[-1], generator=g)
    mask = torch.ones(2, 11, dtype=torch.int64)
    mask[1, 7:] = 0  # the second audio's last states are padding
    fed = states.clone()
    got = result(ids, states, mask)
    torch.testing.assert_close(states, fed)
    encoded = streaming.MoonshineStreamingEncoderModelOutput(
        last_hidden_state=states.clone(), attention_mask=mask
    )
    with torch.no_grad():
        out = model(decoder_input_ids=ids, encoder_outputs=encoded, use_cache=True)
    torch.testing.assert_close(got[0], out.logits, atol=1e-4, rtol=1e-3)
    for mine, theirs in zip(
        got[1].cross_attention_cache.layers, out.past_key_values.cross_attention_cache.layers, strict=True
    ):
        torch.testing.assert_close(mine.keys, theirs.keys, atol=1e-4, rtol=1e-3)
        torch.testing.assert_close(mine.values, theirs.values, atol=1e-4, rtol=1e-3)


def _vibevoice_audio(frames: int, kept: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    wave = torch.randn(1, 1, frames, generator=g)
    return wave, (torch.arange(frames) < kept).to(torch.int64)[None]


@pytest.mark.full_matrix  # 15 s; its audio graph alone below, in CI
def test_vibevoice_asr_package_verifies(tmp_path: pathlib.Path) -> None:
    package, model = _verified_package(tmp_path, "vibevoice_asr")
    session = _session(package / al.AUDIO_FILE)
    assert [i.name for i in session.get_inputs()] == ["input_values", "padding_mask"]
    g = torch.Generator().manual_seed(6)
    for frames, kept in ((3200, 3200), (3200 * 12, 3200 * 9 + 17)):  # 1 token; 12, the last 2.99 padded
        wave, mask = _vibevoice_audio(frames, kept, g)
        (got,) = session.run(None, {"input_values": wave.numpy(), "padding_mask": mask.numpy()})
        with torch.no_grad():
            want = model.get_audio_features(input_values=wave, padding_mask=mask, sample=False).pooler_output
        torch.testing.assert_close(torch.from_numpy(got), want, atol=1e-4, rtol=1e-3, msg=f"{frames} samples")


@pytest.mark.full_matrix  # 11 s (its tokenizers' convolution stacks): the suite's time budget
def test_vibevoice_asr_audio_graph_reads_whole_tokens_of_one_chunk() -> None:
    """The package's audio graph alone, from the sweep's tiny config: the waveform in whole tokens of
    ``hop_length`` samples up to one chunk, captured once (the form swapped in), and right against
    transformers' chunked, cached ``get_audio_features`` (``sample=False``) at other lengths."""
    import transformers

    config = architecture_sweep().tiny_config("vibevoice_asr")
    torch.manual_seed(0)
    model = transformers.VibeVoiceAsrForConditionalGeneration(config).eval()
    spec = al.audio_text_to_text(model, config)[al.AUDIO_FILE]
    assert spec.input_names == ["input_values", "padding_mask"]
    hop = int(config.acoustic_tokenizer_encoder_config.hop_length)
    g = torch.Generator().manual_seed(6)
    result = fastonnx.to_onnx(
        spec.module,
        _vibevoice_audio(hop * al.EXAMPLE_TOKENS, hop * 4 + 5, g),
        dynamic_shapes=spec.dynamic_shapes,
    )
    assert result.stats["dynamic_ranges"]["input_values[2]"] == [hop, config.acoustic_tokenizer_chunk_size]
    for tokens, kept in ((1, hop), (3, 2 * hop + 1), (11, 11 * hop)):
        wave, mask = _vibevoice_audio(hop * tokens, kept, g)
        with torch.no_grad():
            want = model.get_audio_features(input_values=wave, padding_mask=mask, sample=False).pooler_output
        torch.testing.assert_close(result(wave, mask), want, atol=1e-4, rtol=1e-3, msg=f"{tokens} tokens")


@pytest.mark.parametrize(
    ("model_type", "evidence"),
    [
        ("vibevoice", "MODEL_FOR_TEXT_TO_WAVEFORM_MAPPING_NAMES too"),
        ("dia", "reads text (input_ids) and no audio"),
    ],
)
def test_text_to_speech_models_are_no_speech_recognizers(model_type: str, evidence: str) -> None:
    import transformers

    config = architecture_sweep().tiny_config(model_type)
    class_name = dict(architecture_sweep().architectures(ASR))[model_type]
    with torch.device("meta"):  # the refusal reads the class, not weights
        model = getattr(transformers, class_name)(config)
    with pytest.raises(InputError, match="it is a text-to-speech model, not a speech recognizer") as caught:
        task_inputs.graph_specs(ASR, model, config)
    assert evidence in str(caught.value)
    assert "pipeline cannot run it (it hands generate the audio as input_ids" in str(caught.value)


@pytest.mark.parametrize("model_type", ["moonshine", "pop2piano", "kyutai_speech_to_text", "vibevoice_asr"])
def test_speech_recognizers_are_not_refused(model_type: str) -> None:
    """Pop2Piano's output is audio too but it reads input_features; Kyutai's forward reads text ids
    alone (its audio through generate's codec) but it outputs text."""
    import transformers

    from fastonnx.pretrained.speech_synthesis import refuse_recognition

    class_name = dict(architecture_sweep().architectures(ASR))[model_type]
    cls = getattr(transformers, class_name)
    refuse_recognition(cls.__new__(cls))  # the class's forward and modalities alone


@pytest.mark.full_matrix  # 12 s; its bound is checked in CI by the audio graph's test above
def test_fun_asr_nano_bare_model_features_verify(tmp_path: pathlib.Path) -> None:
    folder = tmp_path / "checkpoint"
    task = "feature-extraction"
    sweep = architecture_sweep()
    sweep.build_checkpoint(task, "fun_asr_nano", dict(sweep.architectures(task))["fun_asr_nano"], folder)
    written = fastonnx.export_pretrained(folder, tmp_path / "package", task=task, progress=False)
    assert written.verified is True, written.verify_note


def test_kyutai_stt_package_verifies_and_codes_any_batch_and_length(tmp_path: pathlib.Path) -> None:
    from fastonnx.pretrained import frame_paired_speech as fp

    package, model = _verified_package(tmp_path, "kyutai_speech_to_text")
    for frames, batch in ((5, 2), (13, 1)):
        wave = fp.waveform(model, frames, batch=batch, seed=frames)
        (codes,) = _session(package / fp.AUDIO_FILE).run(None, {"input_values": wave.numpy()})
        with torch.no_grad():
            want = model.codec_model.encode(wave[..., : frames * model.config.frame_size]).audio_codes
        assert codes.shape == (batch, frames, model.config.num_codebooks)
        torch.testing.assert_close(torch.from_numpy(codes), want.transpose(1, 2), rtol=0, atol=0)


def test_voxtral_realtime_package_verifies_and_embeds_any_batch_and_length(tmp_path: pathlib.Path) -> None:
    from fastonnx.pretrained import streamed_audio_steps as sa

    package, model = _verified_package(tmp_path, "voxtral_realtime")
    features = torch.randn(
        2, model.config.audio_config.num_mel_bins, 37, generator=torch.Generator().manual_seed(5)
    )
    (embeds,) = _session(package / sa.EMBEDDER_FILE).run(None, {"input_features": features.numpy()})
    with torch.no_grad():
        want = model.model.audio_tower.embedder(features)
    torch.testing.assert_close(torch.from_numpy(embeds), want)
