"""text-to-audio of Qwen3OmniMoeForConditionalGeneration (pretrained/omni3_speech_stages.py): the thinker's
and the talker's MoE decoder steps with their caches, the code predictor's step and code2wav as four graphs;
verified by transformers' generate with each stage's forward on its onnxruntime session (the talker's inputs
built as the module's loop says) against plain generate, greedy: equal tokens and codes, the waveforms within
fastonnx's tolerances.

The tiny checkpoint keeps Qwen3-Omni's layout at small numbers: the talker's vocabulary 1024 past its
codebook (generate suppresses its last 1024 ids but the eos), its special ids inside the tiny vocabularies."""

from __future__ import annotations

import pathlib
from typing import Any

import onnx
import pytest
import torch

import fastonnx
from fastonnx.pretrained import omni3_speech_stages as stages
from support.stage_sessions import perturbed_runs, stage_sessions

# a full-matrix family (deselected in CI, the suite being over its 12 minutes): Qwen2.5-Omni's test covers
# the thinker/talker layout and its generate-driven check
pytestmark = pytest.mark.full_matrix

TEXT, CODEBOOK = 96, 32
CODES = 1024 + CODEBOOK  # the talker's: generate suppresses its last 1024 ids but its eos
ROPE = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 2], "interleaved": True}
MOE = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "moe_intermediate_size": 16,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "max_position_embeddings": 256,
    "rope_parameters": ROPE,
}
MEDIA = {  # the thinker's media tokens, the last of its vocabulary
    "audio_token_id": TEXT - 1,
    "image_token_id": TEXT - 2,
    "video_token_id": TEXT - 3,
    "audio_start_token_id": TEXT - 4,
    "vision_start_token_id": TEXT - 5,
}


def _tiny_model() -> Any:
    from transformers import Qwen3OmniMoeConfig, Qwen3OmniMoeForConditionalGeneration

    thinker = {
        "text_config": {"vocab_size": TEXT, **MOE},
        "audio_config": {
            "d_model": 16,
            "encoder_layers": 1,
            "encoder_attention_heads": 2,
            "encoder_ffn_dim": 32,
            "num_mel_bins": 8,
            "output_dim": 32,
            "n_window": 4,
            "max_source_positions": 32,
            "downsample_hidden_size": 8,
        },
        "vision_config": {
            "depth": 1,
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_heads": 2,
            "out_hidden_size": 32,
            "deepstack_visual_indexes": [0],
        },
        **MEDIA,
    }
    talker = {
        "text_config": {"vocab_size": CODES, **MOE, "shared_expert_intermediate_size": 32},
        "code_predictor_config": {
            "vocab_size": CODEBOOK,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 8,
            "num_code_groups": 4,
        },
        "num_code_groups": 4,
        "thinker_hidden_size": 32,
        "accept_hidden_layer": 1,
        "codec_eos_token_id": CODES - 1,
        "codec_nothink_id": CODES - 2,
        "codec_think_bos_id": CODES - 3,
        "codec_think_eos_id": CODES - 4,
        "codec_pad_id": CODES - 5,
        "codec_bos_id": CODES - 6,
        "speaker_id": {"ethan": CODES - 7},
        "spatial_merge_size": 2,
        **MEDIA,
    }
    code2wav = {
        "codebook_size": CODEBOOK,
        "hidden_size": 16,
        "max_position_embeddings": 256,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "sliding_window": 8,
        "intermediate_size": 32,
        "num_hidden_layers": 1,
        "num_quantizers": 4,
        "upsample_rates": [2, 2],
        "upsampling_ratios": [2],
        "decoder_dim": 16,
    }
    config = Qwen3OmniMoeConfig(
        thinker_config=thinker,
        talker_config=talker,
        code2wav_config=code2wav,
        **{
            name: TEXT - i
            for i, name in enumerate(
                (
                    "im_start_token_id",
                    "im_end_token_id",
                    "tts_pad_token_id",
                    "tts_bos_token_id",
                    "tts_eos_token_id",
                    "system_token_id",
                    "user_token_id",
                    "assistant_token_id",
                ),
                6,
            )
        },
    )
    torch.manual_seed(0)
    model = Qwen3OmniMoeForConditionalGeneration(config).eval()
    with torch.no_grad():
        # transformers' _init_weights leaves the talker's fused experts as torch.empty made them (whatever
        # the memory held, so the codes depended on the tests run before): drawn here like the thinker's
        for name, weight in model.talker.named_parameters():
            if ".experts." in name:
                weight.normal_(0, 0.02)
        for weight in model.code2wav.parameters():  # a waveform far above atol: wider than std 0.02
            if weight.dim() > 1:
                weight.normal_(0, 0.3)
    return model


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("omni3")
    _tiny_model().save_pretrained(tmp / "checkpoint")
    return fastonnx.export_pretrained(
        tmp / "checkpoint", tmp / "package", task="text-to-audio", progress=False
    )


def test_omni3_package_is_verified(package: Any) -> None:
    assert package.verified is True, package.verify_note
    files = {stages.THINKER_FILE, stages.TALKER_FILE, stages.PREDICTOR_FILE, stages.CODE2WAV_FILE}
    assert files <= set(package.files)
    talker = onnx.load(str(package.outdir / stages.TALKER_FILE), load_external_data=False).graph
    assert [i.name for i in talker.input][:5] == [*stages.TALKER_INPUTS, "past_key_values.0.key"]
    predictor = onnx.load(str(package.outdir / stages.PREDICTOR_FILE), load_external_data=False).graph
    assert [i.name for i in predictor.input][:4] == [*stages.PREDICTOR_INPUTS, "past_key_values.0.key"]


def _sessions(outdir: pathlib.Path) -> dict[str, Any]:
    names = (stages.THINKER_FILE, stages.TALKER_FILE, stages.PREDICTOR_FILE, stages.CODE2WAV_FILE)
    return stage_sessions(outdir, names)


def test_every_stage_runs_its_session_and_the_check_fails_on_perturbed_ones(package: Any) -> None:
    from transformers import Qwen3OmniMoeForConditionalGeneration

    from fastonnx.pretrained.half_package import float32_tolerance

    checkpoint = package.outdir.parent / "checkpoint"
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(checkpoint).eval()
    sessions = _sessions(package.outdir)

    def perturb(file: str, call: int, out: list[torch.Tensor]) -> None:
        if file == stages.PREDICTOR_FILE and call == 5:
            out[0][1, -1, 0] += 100.0  # the second row's second frame, code group 2: code 0
        if file == stages.CODE2WAV_FILE:
            assert float(out[0].abs().max()) > 100 * 1e-4  # the waveform compared far above atol
            out[0][0] += 1e-3  # the first row's waveform off by 10 x atol

    perturbed, calls = perturbed_runs(sessions, perturb)
    infos = stages.check_package(sessions, model, {}, perturbed, float32_tolerance)
    failed = {i.name for i in infos if not i.passed}
    assert failed == {"talker codes", "waveform (row 0)", "waveform (row 1)"}
    groups = model.config.talker_config.num_code_groups
    # a thinker step a text token and one for tts_pad/bos/eos's embeddings, a talker step a frame, the code
    # predictor's groups - 1 steps a frame after the first, code2wav once (one chunk)
    assert calls == {
        stages.THINKER_FILE: stages.THINKER_TOKENS + 1,
        stages.TALKER_FILE: stages.TALKER_TOKENS,
        stages.PREDICTOR_FILE: (stages.TALKER_TOKENS - 1) * (groups - 1),
        stages.CODE2WAV_FILE: 1,
    }
