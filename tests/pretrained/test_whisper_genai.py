"""Whisper through onnxruntime-genai: ``export_pretrained`` writes genai's two graphs
(``genai_encoder.onnx``, ``genai_decoder.onnx``), ``genai_config.json`` and ``audio_processor_config.json``
beside onnxruntime's three files; genai's greedy search over them gives the tokens of transformers' greedy
loop over the model's forward from the same prompt, each step's logits within 1e-4.

The tiny model reads genai's fixed input, 80 mel bins by 3000 frames (``max_source_positions`` 1500),
and its features are real log-mel features: a sine sweep through transformers' ``WhisperFeatureExtractor``
at its defaults (80 bins, 30 s at 16 kHz). genai runs in a subprocess: a crash in its native code fails
the test instead of ending the test run."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
import torch
from checkpoint_folders import TOKENS, VOCAB, save_checkpoint
from test_text2text import speech_greedy

import fastonnx

WHISPER = {
    "vocab_size": VOCAB,
    "d_model": 64,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 128,
    "decoder_ffn_dim": 128,
    "max_target_positions": 64,
    "num_mel_bins": 80,
    "max_source_positions": 1500,
    "decoder_start_token_id": 1,
    **TOKENS,
}
# the decoder prompt, as Whisper's <|startoftranscript|><|en|><|transcribe|><|notimestamps|>: the start
# token, then three ids of the tiny vocabulary
PROMPT = [1, 5, 6, 7]
MAX_LENGTH = 24  # genai's max_length counts the prompt: 20 new tokens

GENAI_GREEDY = """
import json, sys
import numpy as np
import onnxruntime_genai as og

package, features, prompt, max_length = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
model = og.Model(package)
params = og.GeneratorParams(model)
params.set_search_options(do_sample=False, max_length=max_length, batch_size=1)
generator = og.Generator(model, params)
inputs = og.NamedTensors()
inputs["audio_features"] = np.load(features)
inputs["input_ids"] = np.array([prompt], dtype=np.int32)
generator.set_inputs(inputs)  # runs the encoder and the decoder over the prompt


def logits():
    return np.asarray(generator.get_logits(), dtype=np.float32).reshape(-1).tolist()


# get_logits holds the logits the next token is chosen from: the prompt's after set_inputs, and after
# each generate_next_token those of the token it appended (the decoder runs as the token is appended)
steps = [logits()]
while not generator.is_done() and len(generator.get_sequence(0)) < max_length:
    generator.generate_next_token()
    steps.append(logits())
sequence = [int(t) for t in generator.get_sequence(0)]
print(json.dumps({"sequence": sequence, "logits": steps[: len(sequence) - len(prompt)]}))
"""


def _sweep_features() -> torch.Tensor:
    """Log-mel features (1, 80, 3000) of a 5 s sine sweep from 200 Hz to 4 kHz, padded to 30 s."""
    from transformers import WhisperFeatureExtractor

    rate, seconds = 16000, 5.0
    t = np.arange(int(rate * seconds)) / rate
    f0, f1 = 200.0, 4000.0
    phase = 2 * np.pi * (f0 * t + (f1 - f0) / (2 * seconds) * t**2)
    audio = (0.5 * np.sin(phase)).astype(np.float32)
    extractor = WhisperFeatureExtractor(feature_size=80)
    features = extractor(audio, sampling_rate=rate, return_tensors="pt").input_features
    assert tuple(features.shape) == (1, 80, 3000)
    return features


def _genai_greedy(package: pathlib.Path, features: torch.Tensor, tmp: pathlib.Path) -> dict[str, Any]:
    path = tmp / "features.npy"
    np.save(path, features.numpy())
    script = tmp / "genai_greedy.py"
    script.write_text(GENAI_GREEDY)
    run = subprocess.run(
        [sys.executable, str(script), str(package), str(path), json.dumps(PROMPT), str(MAX_LENGTH)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, f"onnxruntime-genai exited with {run.returncode}: {run.stderr[-3000:]}"
    result: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
    return result


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, pathlib.Path]:
    tmp = tmp_path_factory.mktemp("whisper_genai")
    folder, package = tmp / "checkpoint", tmp / "package"
    # matrices redrawn at std 0.3: at the initial scale the tiny decoder repeats one token; at std 1 the
    # package's own check of the 1500-position encoder's states misses 1e-4 (5.8e-4), at std 0.5 the
    # logits (up to 10) lose 1.1e-4 to float32 rounding by step 15
    save_checkpoint(folder, "whisper", "WhisperForConditionalGeneration", WHISPER, seed=0, redraw_std=0.3)
    written = fastonnx.export_pretrained(folder, package, progress=False)
    assert written.task == "automatic-speech-recognition"
    assert written.verified is True, written.verify_note
    return folder, package


def test_package_holds_genai_layout(exported: tuple[pathlib.Path, pathlib.Path]) -> None:
    import onnx

    _, package = exported
    config = json.loads((package / "genai_config.json").read_text())
    model = config["model"]
    assert model["type"] == "whisper"
    assert (model["encoder"]["filename"], model["decoder"]["filename"]) == (
        "genai_encoder.onnx",
        "genai_decoder.onnx",
    )
    assert (package / "audio_processor_config.json").is_file()
    # the package's own check compared genai's two files with transformers too, both decoder steps
    report = (package / "fastonnx_report.md").read_text()
    for value in ("genai_encoder: present_value_cross_1", "genai_decoder step with past: logits"):
        assert f"| `{value}` |" in report
    # onnxruntime's three files are still there
    for name in ("encoder_model.onnx", "decoder_model.onnx", "decoder_with_past_model.onnx"):
        assert (package / name).is_file()
    encoder = onnx.load(str(package / "genai_encoder.onnx"), load_external_data=False)
    decoder = onnx.load(str(package / "genai_decoder.onnx"), load_external_data=False)
    assert [i.name for i in encoder.graph.input] == ["audio_features"]
    assert [o.name for o in encoder.graph.output] == [
        "hidden_states",
        *(f"present_{kv}_cross_{i}" for i in range(2) for kv in ("key", "value")),
    ]
    assert [i.name for i in decoder.graph.input] == [
        "input_ids",
        *(f"past_{kv}_self_{i}" for i in range(2) for kv in ("key", "value")),
        *(f"past_{kv}_cross_{i}" for i in range(2) for kv in ("key", "value")),
    ]
    assert [o.name for o in decoder.graph.output] == [
        "logits",
        *(f"present_{kv}_self_{i}" for i in range(2) for kv in ("key", "value")),
    ]


def test_genai_greedy_matches_transformers(
    exported: tuple[pathlib.Path, pathlib.Path], tmp_path: pathlib.Path
) -> None:
    import transformers

    folder, package = exported
    model: Any = transformers.WhisperForConditionalGeneration.from_pretrained(
        folder, dtype=torch.float32
    ).eval()
    features = _sweep_features()
    expected_tokens, expected_logits = speech_greedy(
        model, features, PROMPT, MAX_LENGTH - len(PROMPT), int(model.config.eos_token_id)
    )
    assert len(set(expected_tokens)) >= 5, expected_tokens

    got = _genai_greedy(package, features, tmp_path)
    assert got["sequence"] == PROMPT + expected_tokens
    assert len(got["logits"]) == len(expected_logits)
    for step, (logits, want) in enumerate(zip(got["logits"], expected_logits, strict=True)):
        torch.testing.assert_close(
            torch.tensor(logits), want, atol=1e-4, rtol=1e-4, msg=lambda m, s=step: f"step {s}: {m}"
        )


@pytest.mark.full_matrix  # the float32 layout runs in CI; half packages in test_half_precision
def test_half_package_holds_float16_genai_files(
    exported: tuple[pathlib.Path, pathlib.Path], tmp_path: pathlib.Path
) -> None:
    # all five files calibrated on what the float32 ones give one another (the audio's states, the
    # genai encoder's cross caches, the first step's presents), converted and checked against
    # transformers' float32 at the half tolerance
    import onnx

    from fastonnx import half_precision

    folder, _ = exported
    written = fastonnx.export_pretrained(folder, tmp_path / "half", dtype="fp16", progress=False)
    assert written.verified is True, written.verify_note
    for name in written.graphs:
        model = onnx.load(str(tmp_path / "half" / name), load_external_data=False)
        flops = half_precision.matmul_flops(model, {"batch_size": 2, "sequence_length": 5})
        assert half_precision.half_share(flops, "fp16") == 1.0, name
    decoder = onnx.load(str(tmp_path / "half" / "genai_decoder.onnx"), load_external_data=False)
    assert decoder.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16
