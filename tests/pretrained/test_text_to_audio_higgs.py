"""text-to-audio of HiggsAudioV2ForConditionalGeneration (pretrained/higgs_audio_stages.py): its decoder
step (text and audio positions, with its cache) and its audio tokenizer's decode as two graphs, the
delay-pattern loop the runtime's; verified by that loop over onnxruntime against transformers' greedy
``generate`` and HiggsAudioV2Processor's ``batch_decode``: equal audio frames, the waveforms within
fastonnx's tolerances, on a text prompt and a voice prompt.

The tiny checkpoint: 4 codebooks of 16 codes (18 in the model: its stream bos and eos), and an audio
tokenizer of the same 4 codebooks (a DAC decoder of one block, 16 samples a frame) in a folder beside it, named by
its processor_config.json."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
import torch

import fastonnx
from fastonnx.errors import InputError
from fastonnx.pretrained import higgs_audio_stages as stages
from fastonnx.pretrained.tasks import choose
from support.stage_sessions import perturbed_runs, stage_sessions

BOOKS, CODES = 4, 16


def _tiny_tokenizer() -> stages.TokenizerDecode:
    from transformers import HiggsAudioV2TokenizerConfig

    config = HiggsAudioV2TokenizerConfig(
        # 1600 Hz, 16 samples a frame: 100 frames a second of 4 bits a code, 4 codebooks at 1.6 kbps
        sample_rate=1600,
        target_bandwidths=[1.6],
        codebook_size=CODES,
        codebook_dim=8,
        acoustic_model_config={
            "encoder_hidden_size": 4,
            "downsampling_ratios": [16],
            "decoder_hidden_size": 16,
            "upsampling_ratios": [16],
            "hidden_size": 8,
        },
        semantic_model_config={
            "hidden_size": 8,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "intermediate_size": 16,
            "num_conv_pos_embedding_groups": 2,
            "conv_dim": [8] * 7,
        },
    )
    torch.manual_seed(1)
    decode = stages.TokenizerDecode(config).eval()
    with torch.no_grad():  # the code vectors start at zero in transformers: every code would decode alike
        for quantizer in decode.quantizer.quantizers:
            quantizer.codebook.embed.normal_()
    return decode


def _tiny_model() -> Any:
    from transformers import HiggsAudioV2Config, HiggsAudioV2ForConditionalGeneration

    config = HiggsAudioV2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        num_codebooks=BOOKS,
        codebook_size=CODES + 2,
        audio_stream_bos_id=CODES,
        audio_stream_eos_id=CODES + 1,
        audio_token_id=60,
        audio_bos_token_id=61,
        audio_delay_token_id=62,
        eos_token_id=63,
        pad_token_id=0,
        bos_token_id=1,
        initializer_range=0.2,
    )
    torch.manual_seed(0)
    model = HiggsAudioV2ForConditionalGeneration(config).eval()
    # repetition-aware sampling (the released generation config's): a codebook repeating a code of the
    # last 4 frames is drawn anew, in the check from the seeded generator on both sides
    model.generation_config.ras_win_len, model.generation_config.ras_win_max_num_repeat = 4, 1
    # a generation config of its own, as released: from_pretrained rebuilds one marked as made from the
    # model's config from that config, without the keys above
    model.generation_config._from_model_config = False
    return model


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("higgs")
    _tiny_model().save_pretrained(tmp / "checkpoint")
    stages.save_tokenizer_decode(_tiny_tokenizer(), tmp / "checkpoint")
    return fastonnx.export_pretrained(
        tmp / "checkpoint", tmp / "package", task="text-to-audio", progress=False
    )


def test_auto_takes_higgs_to_text_to_audio() -> None:
    task, chosen = choose(
        {"model_type": "higgs_audio_v2", "architectures": ["HiggsAudioV2ForConditionalGeneration"]}, "auto"
    )
    assert (task.name, chosen) == ("text-to-audio", "HiggsAudioV2ForConditionalGeneration")


def test_a_checkpoint_naming_no_audio_tokenizer_is_refused(tmp_path: pathlib.Path) -> None:
    with pytest.raises(InputError, match="no processor_config.json naming it"):
        stages.audio_tokenizer_path(tmp_path)
    (tmp_path / stages.PROCESSOR_FILE).write_text(
        '{"audio_tokenizer": {"audio_tokenizer_name_or_path": "./gone"}}'
    )
    with pytest.raises(InputError, match="no checkpoint folder at ./gone"):
        stages.audio_tokenizer_path(tmp_path)


def test_higgs_package_is_verified(package: Any) -> None:
    assert package.verified is True, package.verify_note
    assert {stages.DECODER_FILE, stages.DECODE_FILE} <= set(package.files)


def _sessions(outdir: pathlib.Path) -> dict[str, Any]:
    names = (stages.DECODER_FILE, stages.DECODE_FILE)
    return stage_sessions(outdir, names)


def test_check_fails_on_perturbed_sessions(package: Any) -> None:
    from transformers import HiggsAudioV2ForConditionalGeneration

    from fastonnx.pretrained.half_package import float32_tolerance

    model = HiggsAudioV2ForConditionalGeneration.from_pretrained(package.outdir.parent / "checkpoint").eval()
    sessions = _sessions(package.outdir)

    def perturb(file: str, call: int, out: list[torch.Tensor]) -> None:
        if file == stages.DECODER_FILE and call == stages.NEW_TOKENS:
            # the last step's logits of the first row reversed: its free codebooks pick other codes (the
            # last step: no later draw of the repetition-aware sampling shifts for the second row)
            out[0][0, -1] *= -1
        if file == stages.DECODE_FILE and call == 2:
            out[0] += 1e-3  # the second row's waveform off by 10 x atol

    perturbed, calls = perturbed_runs(sessions, perturb)

    text = stages.check_inputs(model)[0]
    reference = stages.reference_decode(stages.audio_tokenizer_path(package.outdir.parent / "checkpoint"))
    infos = stages.check_prompt(sessions, model, perturbed, float32_tolerance, text, 0, reference)
    frames, first, second = infos
    assert not frames.passed and not first.passed
    # the second row's codes are unchanged: its waveform fails by the offset alone
    assert not second.passed and second.max_abs_diff == pytest.approx(1e-3, rel=1e-2)
    assert calls == {stages.DECODER_FILE: stages.NEW_TOKENS, stages.DECODE_FILE: 2}
