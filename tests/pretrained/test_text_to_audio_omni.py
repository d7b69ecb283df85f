"""text-to-audio of Qwen2_5OmniForConditionalGeneration (pretrained/omni_speech_stages.py): the thinker's and
the talker's decoder steps with their caches, token2wav's DiT step and its BigVGAN vocoder as four graphs;
verified by transformers' generate with each stage's forward on its onnxruntime session against plain
generate (greedy, the DiT's noise seeded): equal tokens and codes, mel and waveform within fastonnx's
tolerances.

The tiny checkpoint keeps Qwen2.5-Omni's layout at small numbers: its special tokens inside the tiny
vocabularies, one speaker in its spk_dict.pt."""

from __future__ import annotations

import pathlib
from typing import Any

import onnx
import pytest
import torch

import fastonnx
from fastonnx.pretrained import omni_speech_stages as stages
from fastonnx.pretrained.tasks import choose
from support.stage_sessions import perturbed_runs, stage_sessions

# a full-matrix family (deselected in CI, the suite being over its 12 minutes): the text2text, Higgs Audio
# V2 and Gradium Phonon tests run cached decoder steps and a generate-driven check in CI
pytestmark = pytest.mark.full_matrix

TEXT, CODES, MEL = 96, 40, 8  # the thinker's and the talker's vocabularies, the mel bins
ROPE = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]}
SPECIAL = {  # the thinker's media tokens, the last of its vocabulary
    "audio_token_index": TEXT - 1,
    "image_token_index": TEXT - 2,
    "video_token_index": TEXT - 3,
    "vision_start_token_id": TEXT - 4,
    "vision_end_token_id": TEXT - 5,
    "audio_start_token_id": TEXT - 6,
    "audio_end_token_id": TEXT - 7,
}
DECODER = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "rope_parameters": ROPE,
}


def _tiny_model() -> Any:
    from transformers import Qwen2_5OmniConfig, Qwen2_5OmniForConditionalGeneration

    thinker = {
        "text_config": {"vocab_size": TEXT, **DECODER},
        "audio_config": {
            "d_model": 16,
            "encoder_layers": 1,
            "encoder_attention_heads": 2,
            "encoder_ffn_dim": 32,
            "num_mel_bins": 8,
            "output_dim": 32,
            "n_window": 4,
            "max_source_positions": 32,
        },
        "vision_config": {
            "depth": 1,
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_heads": 2,
            "out_hidden_size": 32,
            "fullatt_block_indexes": [0],
        },
        **SPECIAL,
    }
    talker = {
        "vocab_size": CODES,
        "embedding_size": 32,
        "head_dim": 8,
        **DECODER,
        "tts_codec_start_token_id": CODES - 3,
        "tts_codec_end_token_id": CODES - 2,
        "tts_codec_pad_token_id": CODES - 4,
        "tts_codec_mask_token_id": CODES - 1,
        "tts_text_start_token_id": TEXT - 8,
        "tts_text_end_token_id": TEXT - 9,
        "tts_text_pad_token_id": TEXT - 10,
        **SPECIAL,
    }
    dit = {
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "head_dim": 16,
        "ff_mult": 2,
        "emb_dim": 16,
        "num_embeds": CODES,
        "mel_dim": MEL,
        "repeats": 2,
        "block_size": 4,
        "look_ahead_layers": [1],
        "look_backward_layers": [0],
        "max_position_embeddings": 256,
        "enc_emb_dim": 16,
        "enc_dim": 16,
        "enc_channels": [16, 16, 16, 16, 48],
        "enc_attention_channels": 8,
        "enc_se_channels": 8,
    }
    vocoder = {
        "mel_dim": MEL,
        "upsample_initial_channel": 16,
        "upsample_rates": [2, 2],
        "upsample_kernel_sizes": [4, 4],
        "resblock_kernel_sizes": [3],
        "resblock_dilation_sizes": [[1, 3, 5]],
    }
    config = Qwen2_5OmniConfig(
        thinker_config=thinker,
        talker_config=talker,
        token2wav_config={"dit_config": dit, "bigvgan_config": vocoder},
    )
    torch.manual_seed(0)
    model = Qwen2_5OmniForConditionalGeneration(config).eval()
    with torch.no_grad():  # a waveform far above atol (0.1 at most), not clamped: the vocoder's weights wider
        for weight in model.token2wav.code2wav_bigvgan_model.parameters():
            if weight.dim() > 1:
                weight.normal_(0, 0.1)
        # the codes steer the mel spectrogram (at the initial std 0.02 it is the flow's noise, a changed code
        # moving it by 1e-2 and the waveform within atol)
        dit = model.token2wav.code2wav_dit_model
        dit.text_embed.codec_embed.weight.normal_(0, 1.0)
        dit.proj_out.weight.normal_(0, 0.3)
    model.speaker_map["Chelsie"] = {
        "bos_token": TEXT - 11,
        "cond": torch.randn(1, 16),
        "ref_mel": torch.randn(1, 12, MEL),
    }
    return model


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("omni")
    model = _tiny_model()
    model.save_pretrained(tmp / "checkpoint")
    torch.save(model.speaker_map, tmp / "checkpoint" / "spk_dict.pt")
    return fastonnx.export_pretrained(
        tmp / "checkpoint", tmp / "package", task="text-to-audio", progress=False
    )


def test_auto_takes_qwen2_5_omni_to_text_to_audio() -> None:
    # its only task: before, auto could tell none
    config = {"model_type": "qwen2_5_omni", "architectures": ["Qwen2_5OmniForConditionalGeneration"]}
    task, chosen = choose(config, "auto")
    assert (task.name, chosen) == ("text-to-audio", "Qwen2_5OmniForConditionalGeneration")


def test_omni_package_is_verified(package: Any) -> None:
    assert package.verified is True, package.verify_note
    files = {stages.THINKER_FILE, stages.TALKER_FILE, stages.DIT_FILE, stages.VOCODER_FILE}
    assert files <= set(package.files)
    assert (package.outdir / "spk_dict.pt").is_file()  # the speakers the runtime's loop reads
    talker = onnx.load(str(package.outdir / stages.TALKER_FILE), load_external_data=False).graph
    assert [i.name for i in talker.input][:5] == [*stages.TALKER_INPUTS, "past_key_values.0.key"]
    thinker = onnx.load(str(package.outdir / stages.THINKER_FILE), load_external_data=False).graph
    assert [o.name for o in thinker.output][:4] == [
        "logits",
        "inputs_embeds",
        "hidden_states",
        "present.0.key",
    ]


def _sessions(outdir: pathlib.Path) -> dict[str, Any]:
    names = (stages.THINKER_FILE, stages.TALKER_FILE, stages.DIT_FILE, stages.VOCODER_FILE)
    return stage_sessions(outdir, names)


def test_every_stage_runs_its_session_and_the_check_fails_on_perturbed_ones(package: Any) -> None:
    from transformers import Qwen2_5OmniForConditionalGeneration

    from fastonnx.pretrained.half_package import float32_tolerance

    checkpoint = package.outdir.parent / "checkpoint"
    model = Qwen2_5OmniForConditionalGeneration.from_pretrained(checkpoint).eval()
    sessions = _sessions(package.outdir)

    def perturb(file: str, call: int, out: list[torch.Tensor]) -> None:
        if file == stages.TALKER_FILE and call == 3:
            out[0][1, -1, 0] += 100.0  # the second row's third code: code 0
        if file == stages.VOCODER_FILE and call == 1:
            out[0] += 1e-3  # the first row's waveform off by 10 x atol

    perturbed, calls = perturbed_runs(sessions, perturb)
    infos = stages.check_package(sessions, model, {}, perturbed, float32_tolerance)
    failed = {i.name for i in infos if not i.passed}
    assert failed == {
        "talker codes (row 1)",
        "mel_spectrogram (row 1)",
        "waveform (row 1)",
        "waveform (row 0)",
    }
    # a thinker step a text token, a talker step a code, the 3/8 rule's four DiT evaluations an interval of
    # ODE_STEPS time points, a row at a time (2), and a vocoder run a row
    steps = 4 * (stages.ODE_STEPS - 1) * 2
    assert calls == {
        stages.THINKER_FILE: stages.THINKER_TOKENS,
        stages.TALKER_FILE: stages.TALKER_TOKENS,
        stages.DIT_FILE: steps,
        stages.VOCODER_FILE: 2,
    }
