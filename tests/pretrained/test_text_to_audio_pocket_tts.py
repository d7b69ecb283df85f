"""text-to-audio of PocketTTSForConditionalGeneration (pretrained/pocket_tts_stages.py): its backbone step
(with its cache), its flow head's Euler step and its audio tokenizer's decode as three graphs, the loop the
runtime's; verified by that loop over onnxruntime against ``generate`` from the same seed, and the audio
tokenizer's decode of its latents: equal frame counts, the latents, end-of-speech logits and waveforms within
fastonnx's tolerances.

The tiny checkpoint keeps Pocket TTS's layout at small sizes: its four placeholder ids the vocabulary's last,
its latent statistics and BOS latent drawn (transformers starts them at 0 and 1: the denormalisation and the
BOS position would read nothing), an end of speech possible from the third frame (the released checkpoints'
seventh), and its processor's audio tokenizer a tiny one in a folder beside its weights."""

from __future__ import annotations

import json
from typing import Any

import onnx
import onnxruntime as ort
import pytest
import torch

import fastonnx
from fastonnx.pretrained import pocket_tts_stages as stages
from fastonnx.pretrained.package_check import _run
from fastonnx.pretrained.tasks import choose

# a full-matrix family (deselected in CI, the suite being over its 12 minutes): Gradium Phonon's test runs
# the same backbone-step and flow-head loop in CI
pytestmark = pytest.mark.full_matrix

VOCAB = 64
MIN_FRAMES = 2


def _tiny_model() -> Any:
    from transformers import PocketTTSConfig, PocketTTSForConditionalGeneration

    config = PocketTTSConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        latent_dim=8,
        max_position_embeddings=128,
        pad_token_id=0,
        audio_prompt_token_id=VOCAB - 4,
        audio_latent_token_id=VOCAB - 3,
        audio_prompt_bos_token_id=VOCAB - 2,
        audio_bos_token_id=VOCAB - 1,
        flow_head_config={
            "hidden_size": 32,
            "num_hidden_layers": 1,
            "latent_dim": 8,
            "condition_dim": 32,
            "frequency_embedding_size": 16,
        },
    )
    torch.manual_seed(0)
    model = PocketTTSForConditionalGeneration(config).eval()
    with torch.no_grad():
        model.latent_mean.normal_()
        model.latent_std.uniform_(0.5, 2.0)
        model.model.bos_latent.normal_()
    # fewer frames than the released 6; a generation config of its own, as released checkpoints have (one
    # made from the model's config is made again on loading, without it)
    model.generation_config.min_frames_before_eos = MIN_FRAMES
    model.generation_config._from_model_config = False
    return model


def _tiny_audio_tokenizer() -> Any:
    """A tiny PocketTTSAudioTokenizerModel: 8 samples a latent frame (the latent upsampled 2x, then 4x), its
    transformer's sliding window (4 positions) shorter than the frames decoded."""
    from transformers import PocketTTSAudioTokenizerConfig, PocketTTSAudioTokenizerModel

    config = PocketTTSAudioTokenizerConfig(
        hidden_size=16,
        num_filters=4,
        upsampling_ratios=[4],
        num_hidden_layers=1,
        intermediate_size=32,
        num_attention_heads=2,
        num_key_value_heads=2,
        latent_stride=2,
        latent_dim=8,
        upsample_groups=16,
        sliding_window=4,
    )
    torch.manual_seed(1)
    return PocketTTSAudioTokenizerModel(config).eval()


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("pocket_tts")
    _tiny_model().save_pretrained(tmp / "checkpoint")
    # the processor names its audio tokenizer (a checkpoint of its own), here a folder beside the weights
    _tiny_audio_tokenizer().save_pretrained(tmp / "checkpoint" / "audio_tokenizer")
    processor = {"audio_tokenizer_class": stages.CODEC, "audio_tokenizer_name_or_path": "audio_tokenizer"}
    (tmp / "checkpoint" / "processor_config.json").write_text(json.dumps({"audio_tokenizer": processor}))
    return fastonnx.export_pretrained(
        tmp / "checkpoint", tmp / "package", task="text-to-audio", progress=False
    )


def test_pocket_tts_package_is_verified(package: Any) -> None:
    assert package.verified is True, package.verify_note
    assert {stages.STEP_FILE, stages.FLOW_FILE, stages.DECODER_FILE} <= set(package.files)
    assert package.graphs[stages.DECODER_FILE] == (["audio_latents"], ["waveform"])
    flow = onnx.load(str(package.outdir / stages.FLOW_FILE), load_external_data=False).graph
    assert [i.name for i in flow.input] == [
        "condition",
        "latents",
        "start_times",
        "end_times",
        "num_flow_steps",
    ]


def test_auto_takes_pocket_tts_to_text_to_audio() -> None:
    task, chosen = choose({"model_type": "pocket_tts", "architectures": [stages.CLASS]}, "auto")
    assert (task.name, chosen) == ("text-to-audio", stages.CLASS)


def test_the_check_fails_on_perturbed_sessions(package: Any) -> None:
    from transformers import PocketTTSForConditionalGeneration

    from fastonnx.pretrained.half_package import float32_tolerance

    model = PocketTTSForConditionalGeneration.from_pretrained(package.outdir.parent / "checkpoint").eval()
    names = (stages.STEP_FILE, stages.FLOW_FILE, stages.DECODER_FILE)
    sessions = {
        n: ort.InferenceSession(str(package.outdir / n), providers=["CPUExecutionProvider"]) for n in names
    }
    step, flow, decoder = (sessions[n] for n in names)
    calls = {"generation": 0, "frame": 0, "flow": 0, "decoder": 0}

    def perturbed(session: Any, names: list[str], tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        out = _run(session, names, tensors)
        if session is step:
            first = tensors[-1].shape[2] == 0  # the prefill: an empty cache
            calls["generation"] += first
            calls["frame"] = 0 if first else calls["frame"] + 1
            if calls["generation"] == 2 and calls["frame"] == MIN_FRAMES:
                out[0][:, -1] = -100.0  # the second generation: no end of speech at its first chance
        calls["flow"] += session is flow
        if session is decoder:
            calls["decoder"] += 1
            if calls["generation"] == 1:
                out[0][:, 5] += 1e-3  # the first generation's sixth sample off by 10 x atol
        return out

    infos = stages.check_package(sessions, model, {}, perturbed, float32_tolerance)
    failed = {i.name for i in infos if not i.passed}
    # the first generation's waveform alone; the second's rows end later: its counts, its latents and
    # waveform (another frame kept) and the logit replaced
    second = {"frames (6x3)", "audio_latents (6x3)", "eos logits (6x3)", "waveform (6x3)"}
    assert failed == {"waveform (5)", *second}
    # greedy, one Euler step a frame: 2 frames, the end of speech, one more (frames_after_eos 1); sampled,
    # two steps a frame: the first row runs to the budget of 2 + 3 frames
    assert (calls["flow"], calls["decoder"]) == (4 + 2 * 5, 2)
