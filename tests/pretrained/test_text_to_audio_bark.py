"""text-to-audio of BarkModel (pretrained/bark_stages.py): its semantic and coarse causal models (a step
with their cache), its fine model (a codebook index as input) and EnCodec's decode as four graphs, the
loops the runtime's; verified by that loop over onnxruntime against ``BarkModel.generate`` (greedy):
equal tokens at every stage, the waveform within fastonnx's tolerances.

The tiny checkpoint keeps Bark's layout at small numbers: its generation config's offsets, windows and
histories shrunk together (a 16-code codebook, 100 semantic tokens), so that a few tokens run several
coarse windows and two fine windows."""

from __future__ import annotations

import pathlib
from typing import Any

import onnx
import onnxruntime as ort
import pytest
import torch

import fastonnx
from fastonnx.pretrained import bark_stages as stages
from fastonnx.pretrained.package_check import _run
from fastonnx.pretrained.tasks import choose

CODES = 16  # the codec's codebook
SEMANTIC = 100  # semantic tokens; the eos is the next id

GENERATION = {
    "semantic_config": {
        "eos_token_id": SEMANTIC,
        "semantic_vocab_size": SEMANTIC,
        "text_encoding_offset": 120,
        "text_pad_token": 220,
        "semantic_infer_token": 223,
        "max_input_semantic_length": 16,
    },
    "coarse_acoustics_config": {
        "coarse_semantic_pad_token": SEMANTIC + 2 * CODES,
        "coarse_infer_token": SEMANTIC + 2 * CODES + 2,
        "max_coarse_input_length": 16,
        "max_coarse_history": 20,
        "sliding_window_len": 8,
    },
    "fine_acoustics_config": {"max_fine_input_length": 16, "max_fine_history_length": 8},
    "codebook_size": CODES,
}


def _tiny_model() -> Any:
    from transformers import BarkConfig, BarkModel, GenerationConfig
    from transformers.models.bark.generation_configuration_bark import BarkGenerationConfig

    causal = {"num_layers": 2, "num_heads": 2, "hidden_size": 16, "block_size": 64}
    config = BarkConfig(
        semantic_config={**causal, "input_vocab_size": 224, "output_vocab_size": 120},
        coarse_acoustics_config={**causal, "input_vocab_size": 136, "output_vocab_size": 136},
        fine_acoustics_config={**causal, "input_vocab_size": CODES + 4, "output_vocab_size": CODES + 4},
        codec_config={
            "hidden_size": 16,
            "num_filters": 4,
            "codebook_size": CODES,
            "codebook_dim": 16,
            "num_lstm_layers": 1,
        },
    )
    torch.manual_seed(0)
    model = BarkModel(config).eval()
    model.generation_config = GenerationConfig.from_dict(BarkGenerationConfig(**GENERATION).to_dict())
    return model


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("bark")
    _tiny_model().save_pretrained(tmp / "checkpoint")
    written = fastonnx.export_pretrained(
        tmp / "checkpoint", tmp / "package", task="text-to-audio", progress=False
    )
    return written


def test_auto_takes_bark_to_text_to_audio() -> None:
    task, chosen = choose({"model_type": "bark", "architectures": ["BarkModel"]}, "auto")
    assert (task.name, chosen) == ("text-to-audio", "BarkModel")


def test_bark_package_is_verified(package: Any) -> None:
    assert package.verified is True, package.verify_note
    files = {stages.SEMANTIC_FILE, stages.COARSE_FILE, stages.FINE_FILE, stages.CODEC_FILE}
    assert files <= set(package.files)
    semantic = onnx.load(str(package.outdir / stages.SEMANTIC_FILE), load_external_data=False).graph
    assert [i.name for i in semantic.input][:3] == ["input_ids", "history_ids", "past_key_values.0.key"]
    fine = onnx.load(str(package.outdir / stages.FINE_FILE), load_external_data=False).graph
    assert [i.name for i in fine.input] == ["codebook_idx", "input_ids"]


def _sessions(outdir: pathlib.Path) -> dict[str, Any]:
    names = (stages.SEMANTIC_FILE, stages.COARSE_FILE, stages.FINE_FILE, stages.CODEC_FILE)
    return {n: ort.InferenceSession(str(outdir / n), providers=["CPUExecutionProvider"]) for n in names}


def test_loop_runs_several_windows_and_the_check_fails_on_perturbed_sessions(package: Any) -> None:
    from transformers import BarkModel

    from fastonnx.pretrained.half_package import float32_tolerance

    model = BarkModel.from_pretrained(package.outdir.parent / "checkpoint").eval()
    sessions = _sessions(package.outdir)
    windows = {stages.COARSE_FILE: 0, stages.FINE_FILE: 0}

    def waveform_off(session: Any, names: list[str], tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        if session is sessions[stages.COARSE_FILE] and tensors[-1].shape[2] == 0:
            windows[stages.COARSE_FILE] += 1  # a window starts from an empty cache
        if session is sessions[stages.FINE_FILE]:
            windows[stages.FINE_FILE] += 1
        out = _run(session, names, tensors)
        return [out[0] + 1e-3] if session is sessions[stages.CODEC_FILE] else out

    infos = stages.check_package(sessions, model, {}, waveform_off, float32_tolerance)
    # the tokens still agree, the waveform not
    assert {i.name for i in infos if not i.passed} == {"waveform (1x5)", "waveform (2x7)"}
    # 6 and 12 semantic tokens (no eos drawn): 2 x floor(n x 75 / 49.9 / 2) coarse tokens, 18 and 36, in
    # windows of 8; 9 and 18 frames, fine windows of 16 (18 frames: two), 6 codebooks predicted each
    assert windows == {stages.COARSE_FILE: 3 + 5, stages.FINE_FILE: 6 * (1 + 2)}

    def third_codebook_off(session: Any, names: list[str], tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        out = _run(session, names, tensors)
        if session is sessions[stages.FINE_FILE] and int(tensors[0]) == 3:
            out[0][..., 0] += 100.0  # code 0 wins everywhere
        return out

    infos = stages.check_package(sessions, model, {}, third_codebook_off, float32_tolerance)
    assert {i.name for i in infos if not i.passed} >= {"fine tokens (1x5)", "fine tokens (2x7)"}
    assert all(i.passed for i in infos if "semantic" in i.name or "coarse" in i.name)
