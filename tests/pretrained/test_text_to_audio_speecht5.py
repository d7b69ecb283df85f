"""text-to-audio of SpeechT5ForTextToSpeech (pretrained/spectrogram_loops.py): transformers' frame loop
(``generate_speech``) as an encoder, a decoder step with its self-attention cache and a postnet, the loop
the runtime's; verified by that loop over onnxruntime against ``generate_speech``, the prenet's dropout
(drawn in evaluation too) at 0 on both sides."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from fastonnx.pretrained import spectrogram_loops as loops
from fastonnx.pretrained.encoder_tasks import text_inputs
from fastonnx.pretrained.tasks import choose
from support.module_sessions import run_module


def _tiny_model() -> Any:
    from transformers import SpeechT5Config, SpeechT5ForTextToSpeech

    config = SpeechT5Config(
        vocab_size=32,
        hidden_size=16,
        encoder_layers=1,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        num_mel_bins=8,
        speech_decoder_prenet_units=16,
        speaker_embedding_dim=4,
        speech_decoder_postnet_units=16,
        speech_decoder_postnet_layers=2,
    )
    torch.manual_seed(0)
    return SpeechT5ForTextToSpeech(config).eval()


def test_auto_takes_speecht5_text_to_speech_to_text_to_audio() -> None:
    task, chosen = choose({"model_type": "speecht5", "architectures": ["SpeechT5ForTextToSpeech"]}, "auto")
    assert (task.name, chosen) == ("text-to-audio", "SpeechT5ForTextToSpeech")


def _modules_as_sessions(model: Any) -> tuple[dict[str, Any], Any]:
    """The three graphs' modules, run as the check runs sessions."""
    step = loops.TextToSpeechStep(model)
    sessions = {
        loops.ENCODER_FILE: loops.TextToSpeechEncoder(model),
        loops.DECODER_FILE: lambda *t: step(*t[:5], list(t[5:])),
        loops.POSTNET_FILE: loops.TextToSpeechPostnet(model),
    }
    return sessions, run_module


@pytest.mark.parametrize(("batch", "ratios"), [(1, (0.0, 20.0)), (2, (1.0, 3.0))])
def test_step_loop_is_generate_speech(batch: int, ratios: tuple[float, float]) -> None:
    model = _tiny_model()
    model.config.speech_decoder_prenet_dropout = 0.0
    inputs = text_inputs(model.config, batch, 6, "cpu", False)
    inputs["speaker_embeddings"] = loops.speaker_embeddings(model.config, batch)
    sessions, run = _modules_as_sessions(model)
    _, got, lengths = loops.generated_by_sessions(sessions, run, model.config, inputs, ratios)
    want, want_lengths = model.generate_speech(
        inputs["input_ids"],
        inputs["speaker_embeddings"],
        attention_mask=inputs["attention_mask"],
        minlenratio=ratios[0],
        maxlenratio=ratios[1],
        return_output_lengths=True,
    )
    assert lengths == want_lengths
    torch.testing.assert_close(got, want)


def test_consistent_dropout_is_transformers() -> None:
    from transformers.models.speecht5.modeling_speecht5 import SpeechT5SpeechDecoderPrenet

    prenet = SpeechT5SpeechDecoderPrenet(_tiny_model().config)
    embeds = torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(0)) + 10  # no zero
    # at 0 transformers' drops every element (kept where bernoulli(0) draws 1)
    torch.testing.assert_close(
        loops.consistent_dropout(embeds, torch.tensor(0.0)), prenet._consistent_dropout(embeds, 0.0)
    )
    out = loops.consistent_dropout(embeds, torch.tensor(0.5))
    kept = out != 0
    assert torch.equal(kept, kept[:1].expand_as(kept))  # one mask for every row
    torch.testing.assert_close(out[kept], embeds[kept] * 2)
    assert 0 < kept[0].float().mean() < 1
    # at the tensor p inside the block, the config's float after it
    with loops.dropout_of(prenet, torch.tensor(0.0)):
        assert not prenet._consistent_dropout(embeds, 0.5).any()
    assert "_consistent_dropout" not in vars(prenet)
