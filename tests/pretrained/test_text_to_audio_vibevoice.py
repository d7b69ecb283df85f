"""text-to-audio of VibeVoiceForConditionalGeneration (pretrained/vibevoice_stages.py): its language model
step, diffusion head, connectors and streaming acoustic decoder / semantic encoder as seven graphs, the loop
the runtime's; verified by transformers' own ``generate`` with each stage an onnxruntime session against
``generate`` as it is (same seed, same scheduler): equal tokens, the waveforms within fastonnx's tolerances.

The tiny checkpoint's special tokens sit at the top of a 64-id vocabulary; the language model's rows for
them redrawn wide so that the greedy choice among them follows the hidden state (a random tiny head picks
the same token every step); its tokenizers' convolutions drawn at unit gain (layer scales 1) so that the
waveform is of order 1, not 1e-10 where any error passes the tolerance."""

from __future__ import annotations

from typing import Any

import onnx
import onnxruntime as ort
import pytest
import torch

import fastonnx
from fastonnx.pretrained import vibevoice_stages as stages
from fastonnx.pretrained.package_check import _run

# a full-matrix family (deselected in CI, the suite being over its 12 minutes): Gradium Phonon's and Higgs
# Audio V2's tests run a cached step with a generated-latent loop in CI
pytestmark = pytest.mark.full_matrix

BOS, END, AUDIO, EOS = 60, 61, 62, 63
CODEC = {
    "num_filters": 4,
    "depths": [1, 0, 0],  # one ConvNeXt block (its depthwise convolution's state), at the stem
    "hidden_size": 8,
    "downsampling_ratios": [4, 4],  # 16 samples a latent frame
    "initializer_range": 0.2,
    "layer_scale_init_value": 1.0,
}


def _tiny_model() -> Any:
    from transformers import VibeVoiceConfig, VibeVoiceForConditionalGeneration

    text = {"model_type": "qwen2", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64}
    text.update({"num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2})
    config = VibeVoiceConfig(
        text_config={**text, "max_position_embeddings": 256},
        audio_config=CODEC,
        semantic_model_config={**CODEC, "hidden_size": 16},
        diffusion_head_config={
            "num_hidden_layers": 2,
            "intermediate_size": 48,
            "frequency_embedding_size": 16,
        },
        pad_token_id=EOS,
        eos_token_id=EOS,
        audio_bos_token_id=BOS,
        audio_eos_token_id=END,
        audio_token_id=AUDIO,
    )
    torch.manual_seed(0)
    model = VibeVoiceForConditionalGeneration(config).eval()
    with torch.no_grad():
        model.lm_head.weight[BOS:].normal_(generator=torch.Generator().manual_seed(3))
    return model


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("vibevoice")
    _tiny_model().save_pretrained(tmp / "checkpoint")
    return fastonnx.export_pretrained(
        tmp / "checkpoint", tmp / "package", task="text-to-audio", progress=False
    )


def test_vibevoice_package_is_verified(package: Any) -> None:
    assert package.verified is True, package.verify_note
    assert set(stages.FILES) <= set(package.files)
    step = onnx.load(str(package.outdir / stages.LM_FILE), load_external_data=False).graph
    names = ["inputs_embeds", "attention_mask", "position_ids", "past_key_values.0.key"]
    assert [i.name for i in step.input][:4] == names
    assert [o.name for o in step.output][:3] == ["logits", "last_hidden_state", "present.0.key"]
    head = onnx.load(str(package.outdir / stages.DIFFUSION_FILE), load_external_data=False).graph
    assert [i.name for i in head.input] == ["noisy_latents", "timesteps", "condition"]


def test_check_fails_on_a_perturbed_decoder(package: Any) -> None:
    from transformers import VibeVoiceForConditionalGeneration

    from fastonnx.pretrained.half_package import float32_tolerance

    model = VibeVoiceForConditionalGeneration.from_pretrained(package.outdir.parent / "checkpoint").eval()
    sessions = {
        n: ort.InferenceSession(str(package.outdir / n), providers=["CPUExecutionProvider"])
        for n in stages.FILES
    }
    decoder = sessions[stages.DECODER_FILE]
    frames: list[int] = []

    def perturbed(session: Any, names: list[str], tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        out = _run(session, names, tensors)
        if session is decoder:
            frames.append(tensors[0].shape[0])
            out[0] += 1e-3  # 10 x atol on every sample
        return out

    infos = stages.check_package(sessions, model, {}, perturbed, float32_tolerance)
    failed = {i.name for i in infos if not i.passed}
    assert failed == {"waveform 0", "waveform 1"}, [str(i) for i in infos]
    # the diffusion ran on several steps, each decoding the whole batch's frame (a row without one at zero)
    assert len(frames) >= 2 and set(frames) == {2}
