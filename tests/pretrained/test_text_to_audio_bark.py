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
import pytest
import torch

import fastonnx
from fastonnx.pretrained import bark_stages as stages
from fastonnx.pretrained.package_check import _run
from fastonnx.pretrained.tasks import choose
from support.stage_sessions import stage_sessions

# a full-matrix family (deselected in CI, the suite being over its 12 minutes): MusicGen's test runs
# EnCodec's decode and a cached decoder step in CI
pytestmark = pytest.mark.full_matrix

CODES = 16  # the codec's codebook
SEMANTIC = 100  # semantic tokens; the eos is the next id
INIT = 0.2  # wide enough that the text and the codes steer the argmaxes

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

    causal = {"num_layers": 2, "num_heads": 2, "hidden_size": 16, "block_size": 64, "initializer_range": INIT}
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
            # 320 samples a frame as suno/bark's EnCodec (75 frames a second at 24 kHz), in two upsamplings
            "upsampling_ratios": [20, 16],
        },
    )
    torch.manual_seed(0)
    model = BarkModel(config).eval()
    with torch.no_grad():  # EnCodec's code vectors start at zero: every code would decode alike
        for layer in model.codec_model.quantizer.layers:
            layer.codebook.embed.normal_()
        # the eos more likely, so that a generation ends early and the second's rows differ in length
        model.semantic.lm_head.weight[SEMANTIC] *= 2
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
    return stage_sessions(outdir, names)


def test_loop_runs_several_windows_and_the_check_fails_on_perturbed_sessions(package: Any) -> None:
    from transformers import BarkModel

    from fastonnx.pretrained.half_package import float32_tolerance

    model = BarkModel.from_pretrained(package.outdir.parent / "checkpoint").eval()
    sessions = _sessions(package.outdir)
    semantic, coarse, fine, codec = (sessions[n] for n in sorted(sessions, key=list(sessions).index))
    starts = {"semantic": 0, "coarse": 0, "fine": 0}
    decoded: list[int] = []  # each waveform's frames

    def perturbed(session: Any, names: list[str], tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        # a generation starts the semantic model from an empty cache, a coarse window the coarse one
        for name, causal in (("semantic", semantic), ("coarse", coarse)):
            starts[name] += session is causal and tensors[-1].shape[2] == 0
        starts["fine"] += session is fine
        if session is codec:
            decoded.append(tensors[0].shape[2])
        out = _run(session, names, tensors)
        if starts["semantic"] == 1 and session is fine and int(tensors[0]) == 3:
            out[0][..., 0] += 100.0  # the first generation's third codebook: code 0 everywhere
        if starts["semantic"] == 2 and session is codec:
            out[0] += 1e-3  # the second generation's waveform off by 10 x atol
        return out

    infos = stages.check_package(sessions, model, {}, perturbed, float32_tolerance)
    # the first generation's fine tokens (and so its waveform) differ, the second's waveform alone
    failed = {i.name for i in infos if not i.passed}
    assert failed == {"fine tokens (1x5)", "waveform (1x5)", "waveform (2x7)"}
    # the first generation: 5 semantic tokens then the eos, 2 x floor(5 x 75 / 49.9 / 2) = 14 coarse tokens
    # in windows of 8, 7 frames in one fine window of 16; the second: its longer row's 24 semantic tokens
    # make 72 coarse tokens (nine windows), 36 frames (fine windows start every 8: four); 6 codebooks
    # predicted in each fine window
    assert starts == {"semantic": 2, "coarse": 2 + 9, "fine": 6 * (1 + 4)}
    # a row decoded alone at its own length: the second's shorter row gave 13 semantic tokens, then its eos
    assert decoded == [7, 36, 19]
