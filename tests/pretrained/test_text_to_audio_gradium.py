"""text-to-audio of GradiumPhononTTSForConditionalGeneration (pretrained/phonon_latent_loops.py): its backbone
step (with its cache), its flow head and the latents' denormalization as three graphs, the latent loop the
runtime's; verified by that loop over onnxruntime against transformers' ``generate`` (greedy, and sampled
with the check's seed): equal frame counts, the latents within fastonnx's tolerances.

The tiny checkpoint's weights are drawn wide (``initializer_range``) and its BOS latent and latent statistics
random (their initial values are zeros and ones), so that every input steers the latents."""

from __future__ import annotations

from typing import Any

import onnx
import onnxruntime as ort
import pytest
import torch

import fastonnx
from fastonnx.pretrained import phonon_latent_loops as loops
from fastonnx.pretrained.half_package import float32_tolerance
from fastonnx.pretrained.package_check import _run


def _tiny_model() -> Any:
    from transformers import GradiumPhononTTSConfig, GradiumPhononTTSForConditionalGeneration

    config = GradiumPhononTTSConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=64,
        latent_dim=8,
        audio_prompt_dim=12,
        num_speakers_embedding_dim=4,
        duration_delta_embedding_dim=8,
        max_position_embeddings=128,
        pad_token_id=0,
        initializer_range=0.2,
        flow_head_config={
            "hidden_size": 24,
            "num_hidden_layers": 1,
            "latent_dim": 8,
            "condition_dim": 32,
            "frequency_embedding_size": 16,
        },
    )
    torch.manual_seed(0)
    model = GradiumPhononTTSForConditionalGeneration(config).eval()
    with torch.no_grad():
        model.model.bos_latent.normal_()
        model.latent_mean.normal_()
        model.latent_std.uniform_(0.5, 2.0)
    return model


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("gradium")
    _tiny_model().save_pretrained(tmp / "checkpoint")
    return fastonnx.export_pretrained(
        tmp / "checkpoint", tmp / "package", task="text-to-audio", progress=False
    )


def test_gradium_package_is_verified(package: Any) -> None:
    assert package.verified is True, package.verify_note
    assert {loops.DECODER_FILE, loops.FLOW_FILE, loops.DENORMALIZE_FILE} <= set(package.files)
    decoder = onnx.load(str(package.outdir / loops.DECODER_FILE), load_external_data=False).graph
    assert [i.name for i in decoder.input][:5] == [
        "input_ids",
        "audio_latents",
        "attention_mask",
        "position_ids",
        "past_key_values.0.key",
    ]
    assert [o.name for o in decoder.output][:3] == ["logits", "last_hidden_state", "present.0.key"]


def test_check_fails_on_perturbed_sessions(package: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import GradiumPhononTTSForConditionalGeneration

    model = GradiumPhononTTSForConditionalGeneration.from_pretrained(
        package.outdir.parent / "checkpoint"
    ).eval()
    names = (loops.DECODER_FILE, loops.FLOW_FILE, loops.DENORMALIZE_FILE)
    sessions = {
        n: ort.InferenceSession(str(package.outdir / n), providers=["CPUExecutionProvider"]) for n in names
    }
    decoder, flow, denormalize = (sessions[n] for n in names)
    calls = {"decoder": 0, "flow": 0, "generations": 0}
    masks: list[torch.Tensor] = []

    def perturbed(session: Any, names: list[str], tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        calls["generations"] += session is decoder and tensors[-1].shape[2] == 0  # a prefill: a new one
        calls["decoder"] += session is decoder
        calls["flow"] += session is flow
        out = _run(session, names, tensors)
        if calls["generations"] == 1 and session is denormalize:
            out[0] += 1e-3  # the first generation's latents off by 10 x atol
        if calls["generations"] == 2 and session is flow and calls["flow"] == 5 + 2 * 2 + 1:
            out[0][1, 0] += 1e-2  # the sampled generation's third frame: its first Euler step's velocity
        return out

    real = loops.generated_by_sessions

    def keeping(*args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:
        got = real(*args, **kwargs)
        masks.append(got["audio_latents_mask"])
        return got

    monkeypatch.setattr(loops, "generated_by_sessions", keeping)
    infos = loops.check_package(sessions, model, {}, perturbed, float32_tolerance)
    assert {i.name for i in infos if not i.passed} == {"audio_latents (1x5)", "audio_latents (2x6, sampled)"}
    # 5 frames (no end of speech before min_frames_before_eos, 6); then every row over the threshold from
    # frame 2: rows of 2 + 1 + 1 and 2 + 3 + 1 frames, two Euler steps each
    assert [m.sum(1).tolist() for m in masks] == [[5], [4, 6]]
    assert calls == {"decoder": 5 + 6, "flow": 5 + 2 * 6, "generations": 2}
