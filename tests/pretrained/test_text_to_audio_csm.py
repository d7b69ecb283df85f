"""text-to-audio of CsmForConditionalGeneration (pretrained/csm_stages.py): its backbone and depth decoder
(a step each, with their cache) and Mimi's decode as three graphs, the frame loop the runtime's; verified
by that loop over onnxruntime against ``generate`` (greedy): equal codes from both decoders, each row's
waveform within fastonnx's tolerances.

The tiny checkpoint keeps CSM's layout at small numbers: 3 codebooks of 8 codes (Mimi's codebook as large
as the decoders' vocabulary, so that any code decodes), the special text ids at the vocabulary's end as in
sesame/csm-1b, and Mimi's code vectors drawn (they start at zero: every code would decode alike). Its
codebook eos is a code one row of the check's padded batch reaches, so that the loop's end of a row runs."""

from __future__ import annotations

from typing import Any

import onnx
import onnxruntime as ort
import pytest
import torch

import fastonnx
from fastonnx.pretrained import csm_stages as stages
from fastonnx.pretrained.package_check import _run
from fastonnx.pretrained.tasks import choose

# a full-matrix family (deselected in CI, the suite being over its 12 minutes): Higgs Audio V2's test runs a
# codebook decoder step and a codec decode in CI
pytestmark = pytest.mark.full_matrix

BOOKS, CODES = 3, 8
# the draw and the eos code at which the padded batch's first row ends: its third frame's codes all 3, the
# frames after it padded and the row decoded up to it, as generate does (the other row runs on)
SEED, EOS, PAD = 2, 3, CODES - 1


def _tiny_model() -> Any:
    from transformers import CsmConfig, CsmForConditionalGeneration

    decoder = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2}
    config = CsmConfig(
        **decoder,
        num_hidden_layers=2,
        num_codebooks=BOOKS,
        vocab_size=CODES,
        text_vocab_size=40,
        audio_eos_token_id=36,
        audio_token_id=37,
        bos_token_id=38,
        pad_token_id=39,
        codebook_pad_token_id=PAD,
        codebook_eos_token_id=EOS,
        eos_token_id=2,
        max_position_embeddings=64,
        depth_decoder_config={
            **decoder,
            "num_hidden_layers": 1,
            "num_codebooks": BOOKS,
            "vocab_size": CODES,
            "backbone_hidden_size": 32,
            "max_position_embeddings": BOOKS + 1,
        },
        codec_config={
            "model_type": "mimi",
            "hidden_size": 16,
            "num_filters": 4,
            "codebook_size": CODES,
            "codebook_dim": 16,
            "num_quantizers": BOOKS,
            "vector_quantization_hidden_dimension": 16,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "head_dim": 8,
            "intermediate_size": 32,
            "upsampling_ratios": [2],
            "upsample_groups": 16,
            "num_residual_layers": 1,
            "sliding_window": 16,
            "max_position_embeddings": 64,
        },
    )
    torch.manual_seed(SEED)
    model = CsmForConditionalGeneration(config).eval()
    with torch.no_grad():
        for module in model.codec_model.quantizer.modules():
            if hasattr(module, "embed_sum"):
                module.embed_sum.normal_()
    return model


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("csm")
    _tiny_model().save_pretrained(tmp / "checkpoint")
    return fastonnx.export_pretrained(
        tmp / "checkpoint", tmp / "package", task="text-to-audio", progress=False
    )


def test_auto_takes_csm_to_text_to_audio() -> None:
    config = {"model_type": "csm", "architectures": ["CsmForConditionalGeneration"]}
    task, chosen = choose(config, "auto")
    assert (task.name, chosen) == ("text-to-audio", "CsmForConditionalGeneration")


def test_csm_package_is_verified(package: Any) -> None:
    assert package.verified is True, package.verify_note
    assert {stages.BACKBONE_FILE, stages.DEPTH_FILE, stages.CODEC_FILE} <= set(package.files)
    backbone = onnx.load(str(package.outdir / stages.BACKBONE_FILE), load_external_data=False).graph
    assert [i.name for i in backbone.input][:5] == [*stages.BACKBONE_INPUTS, "past_key_values.0.key"]
    assert [o.name for o in backbone.output][:3] == ["logits", "hidden_states", "present.0.key"]


def test_the_check_fails_on_perturbed_sessions(package: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import CsmForConditionalGeneration

    from fastonnx.pretrained.half_package import float32_tolerance

    # the padded batch's generation alone (the package's check ran both)
    monkeypatch.setattr(stages, "CHECKED", ((2, 7, 4),))
    model = CsmForConditionalGeneration.from_pretrained(package.outdir.parent / "checkpoint").eval()
    names = (stages.BACKBONE_FILE, stages.DEPTH_FILE, stages.CODEC_FILE)
    sessions = {
        n: ort.InferenceSession(str(package.outdir / n), providers=["CPUExecutionProvider"]) for n in names
    }
    backbone, depth, codec = (sessions[n] for n in names)
    calls = {"frames": 0, "depth": 0}
    decoded: list[int] = []  # each row's frames

    def perturbed(session: Any, feeds: list[str], tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        calls["frames"] += session is backbone
        calls["depth"] += session is depth
        if session is codec:
            decoded.append(tensors[0].shape[2])
        out = _run(session, feeds, tensors)
        if calls["frames"] == 4 and session is depth and tensors[-1].shape[2] == 2:
            # the last frame's codebook 2, second row (the first has ended): the second-best code
            out[0][1, -1, out[0][1, -1].argmax()] = -1e9
        if session is codec and len(decoded) == 1:
            out[0] += 1e-3  # the first row's waveform off by 10 x atol
        return out

    infos = stages.check_package(sessions, model, {}, perturbed, float32_tolerance)
    failed = {i.name for i in infos if not i.passed}
    assert failed == {"depth decoder codes (2x7)", "waveform (2x7, row 0)", "waveform (2x7, row 1)"}
    # 4 frames, K - 1 depth steps each; each row decoded alone, the first up to its eos frame
    assert calls == {"frames": 4, "depth": 4 * (BOOKS - 1)}
    assert decoded == [2, 4]
