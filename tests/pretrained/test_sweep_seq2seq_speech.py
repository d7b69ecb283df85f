"""Speech seq2seq models besides Whisper, and seq2seq decoders reading their own encoder output class,
found failing by the architecture sweep; each built from the sweep's tiny config, exported by
``export_pretrained`` and verified (encoder states, the first decoder step and a step with its past, in
onnxruntime against transformers eager):

- an encoder reading features of any length (Speech2Text: frames x features, its length bounded below
  by its subsampling convolutions and above by its position table) or the waveform (Moonshine; SpeechT5
  from the samples that make 2 frames);
- a decoder reading ``encoder_outputs.last_hidden_state`` and its class's other fields (Moonshine's
  ``attention_mask``, Switch Transformers' ``router_logits``).
"""

from __future__ import annotations

import pathlib

import pytest
from checkpoint_folders import architecture_sweep

import fastonnx
from support.matrix import sampled

_sweep = architecture_sweep


FIXED = [
    ("automatic-speech-recognition", "speech_to_text", "input_features"),
    ("automatic-speech-recognition", "moonshine", "input_values"),
    ("automatic-speech-recognition", "speecht5", "input_values"),
    ("text2text-generation", "switch_transformers", "input_ids"),
]


@pytest.mark.parametrize(
    ("task", "model_type", "encoder_input"),
    # Switch Transformers in CI (a decoder reading its own output class's encoder fields, as Moonshine's,
    # whose export took 25 s of CI; the speech encoders are in CI through test_sweep_audio_rows' Pop2Piano);
    # Speech2Text's bounded frames (34 s: the refusal, then the bounded capture) and the rest under
    # FASTONNX_FULL_MATRIX=1
    sampled(FIXED, lambda c: c[1] == "switch_transformers"),
    ids=lambda v: str(v),
)
def test_seq2seq_package_verifies(
    tmp_path: pathlib.Path, task: str, model_type: str, encoder_input: str
) -> None:
    sweep = _sweep()
    class_name = dict(sweep.architectures(task))[model_type]
    folder = tmp_path / "checkpoint"
    sweep.build_checkpoint(task, model_type, class_name, folder)
    written = fastonnx.export_pretrained(folder, tmp_path / "package", task=task, progress=False)
    assert written.verified is True, written.verify_note
    assert written.graphs["encoder_model.onnx"][0][0] == encoder_input
    assert "genai_config.json" not in written.files  # genai's speech type is Whisper's alone
