"""text-to-audio (pretrained/speech_synthesis.py): the one-forward text-to-speech models, each built from
the architecture sweep's tiny config with random weights, exported by ``export_pretrained`` and verified
against transformers' forward (VITS with its noise scales at 0: no random draw compared):

- VITS: its output length (ceiled, summed durations) is a data-dependent dim of ``waveform``; the noise
  scales are graph inputs;
- FastSpeech2Conformer (spectrogram) and with HiFi-GAN (waveform): its length regulator (a Python loop of
  ``repeat_interleave`` over the rows), its relative positional table (rebuilt past 5000 frames) and its
  attention's relative shift (views guarding on the frames) are swapped (capture/length_regulators.py).

The classes generating their audio in a loop are refused with an InputError naming why.
"""

from __future__ import annotations

import math
import pathlib

import onnx
import pytest
import torch
from checkpoint_folders import architecture_sweep

import fastonnx
from fastonnx.capture.length_regulators import (
    length_regulator_by_gather,
    relative_positions_by_formula,
    shifted_relative_scores,
)
from fastonnx.errors import InputError
from fastonnx.pretrained.speech_synthesis import refuse
from fastonnx.pretrained.tasks import choose
from support.matrix import sampled

SYNTHESIZERS = {
    "fastspeech2_conformer": ("FastSpeech2ConformerModel", "spectrogram", 1),
    "fastspeech2_conformer_with_hifigan": ("FastSpeech2ConformerWithHifiGan", "waveform", 1),
    "vits": ("VitsModel", "waveform", 1),
}
"""model type -> (class, first output, the axis of its data-dependent length)."""


def _lengthen_durations(folder: pathlib.Path, class_name: str) -> None:
    """FastSpeech2's duration predictor biased to about 2 frames a token: the tiny random one predicts 0
    everywhere, which only transformers' all-zero branch (1 frame a token) would then exercise."""
    import transformers

    model = getattr(transformers, class_name).from_pretrained(folder).eval()
    inner = getattr(model, "model", model)
    with torch.no_grad():
        inner.duration_predictor.linear.bias.fill_(math.log(3.0))
    model.save_pretrained(folder)


# CI: FastSpeech2Conformer (the one-forward form, its frames a data-dependent length); VITS, the HiFi-GAN
# variant and SpeechT5's frame loop (three files, checked by a greedy loop against generate_speech; its
# modules' loop is compared with generate_speech in CI by test_text_to_audio_speecht5.py) under
# FASTONNX_FULL_MATRIX=1
@pytest.mark.parametrize(
    "model_type",
    sampled([*sorted(SYNTHESIZERS), "speecht5"], lambda name: name == "fastspeech2_conformer"),
)
def test_text_to_audio_package_is_verified(tmp_path: pathlib.Path, model_type: str) -> None:
    if model_type == "speecht5":
        _speecht5_package_is_verified(tmp_path)
        return
    class_name, first, axis = SYNTHESIZERS[model_type]
    folder = tmp_path / "checkpoint"
    architecture_sweep().build_checkpoint("text-to-audio", model_type, class_name, folder)
    if model_type.startswith("fastspeech2"):
        _lengthen_durations(folder, class_name)
    written = fastonnx.export_pretrained(folder, tmp_path / "package", task="text-to-audio", progress=False)
    assert written.verified is True, written.verify_note
    graph = onnx.load(str(written.outdir / "model.onnx"), load_external_data=False).graph
    outputs = {o.name: o for o in graph.output}
    assert list(outputs)[0] == first
    # the length is the data's (an unbacked size), not the example's
    assert outputs[first].type.tensor_type.shape.dim[axis].dim_param
    if model_type == "vits":
        assert [i.name for i in graph.input][2:] == ["noise_scale", "noise_scale_duration"]


@pytest.mark.parametrize(
    "durations",
    [
        [[2, 0, 3], [1, 1, 0]],  # rows of different lengths, a zero duration inside
        [[0, 0, 0], [0, 0, 0]],  # the all-zero batch: every row 1 frame a token
        [[0, 0, 0], [1, 0, 2]],  # a zero row in a batch that is not all zero: no frame
        [[4, 1, 0]],
    ],
)
@pytest.mark.parametrize("speed", [1.0, 1.7])
def test_length_regulator_by_gather_is_transformers(durations: list[list[int]], speed: float) -> None:
    from transformers.models.fastspeech2_conformer import modeling_fastspeech2_conformer as modeling

    labels = torch.tensor(durations)
    states = torch.randn(labels.shape[0], labels.shape[1], 8, generator=torch.Generator().manual_seed(0))
    ours, theirs = labels.clone(), labels.clone()
    got = length_regulator_by_gather(states, ours, speed)
    torch.testing.assert_close(got, modeling.length_regulator(states, theirs, speed))
    assert torch.equal(ours, theirs)  # the all-zero branch writes into the durations, as transformers' does


def test_relative_positions_and_shift_are_transformers() -> None:
    from transformers import FastSpeech2ConformerConfig
    from transformers.models.fastspeech2_conformer import modeling_fastspeech2_conformer as modeling

    config = FastSpeech2ConformerConfig(hidden_size=16, encoder_num_attention_heads=2)
    encoding = modeling.FastSpeech2ConformerRelPositionalEncoding(config, {"positional_dropout_rate": 0.0})
    attention = modeling.FastSpeech2ConformerAttention(
        config, {"num_attention_heads": 2, "attention_dropout_rate": 0.0}
    )
    g = torch.Generator().manual_seed(0)
    for frames in (1, 2, 7):
        x = torch.randn(2, frames, 16, generator=g)
        for want, got in zip(encoding(x), relative_positions_by_formula(encoding, x), strict=True):
            torch.testing.assert_close(got, want)
        scores = torch.randn(2, 2, frames, 2 * frames - 1, generator=g)
        want = attention.shift_relative_position_tensor(scores)
        torch.testing.assert_close(shifted_relative_scores(attention, scores), want)


def test_generating_models_are_refused_with_the_reason() -> None:
    # every generating class of the task's mappings is exported now (Qwen3-Omni-MoE the last): a class
    # outside them is refused with the generic reason
    with pytest.raises(
        InputError, match="SomeSpeechLoopModel generates its audio in a loop: not a one-forward"
    ):
        refuse("SomeSpeechLoopModel")


def test_auto_takes_the_synthesizers_to_text_to_audio() -> None:
    for model_type, (class_name, _, _) in SYNTHESIZERS.items():
        task, chosen = choose({"model_type": model_type, "architectures": [class_name]}, "auto")
        assert (task.name, chosen) == ("text-to-audio", class_name)


def _speecht5_package_is_verified(tmp_path: pathlib.Path) -> None:
    from fastonnx.pretrained import spectrogram_loops as loops

    folder = tmp_path / "checkpoint"
    # the sweep's own check runs generate_speech (its forward needs decoder_input_values)
    architecture_sweep().build_checkpoint("text-to-audio", "speecht5", "SpeechT5ForTextToSpeech", folder)
    written = fastonnx.export_pretrained(folder, tmp_path / "package", task="text-to-audio", progress=False)
    assert written.verified is True, written.verify_note
    graph = onnx.load(str(written.outdir / loops.DECODER_FILE), load_external_data=False).graph
    assert [i.name for i in graph.input][:5] == [*loops.STEP_INPUTS, loops.DROPOUT]
    assert [o.name for o in graph.output][:3] == ["output_sequence_out", "spectrum", "prob"]
    assert {loops.ENCODER_FILE, loops.POSTNET_FILE} <= set(written.files)
