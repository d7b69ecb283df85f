"""text-to-audio of SeamlessM4T (pretrained/seamless_stages.py): the text encoder, the text and unit
decoders' steps (v1) or the non-autoregressive text-to-unit model (v2) and the unit HiFi-GAN as one graph a
stage, verified by transformers' own ``generate`` with each stage's forward running its onnxruntime
session, against plain ``generate``: equal text and unit tokens, the waveform within fastonnx's tolerances.

The tiny checkpoints carry the generation config maps that ``generate`` reads (the languages' ids, v2's
subwords and characters); their unit models never predict the control ids below the vocoder's offset
(those rows of the head zero: transformers would index the vocoder's units at a negative id)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import onnx
import onnxruntime as ort
import pytest
import torch

import fastonnx
from fastonnx.pretrained import seamless_stages as stages
from fastonnx.pretrained.package_check import _run

# a full-matrix family (deselected in CI, the suite being over its 12 minutes): the text2text and MusicGen
# tests run its encoder, merged decoder steps and a vocoder-like decode in CI
pytestmark = pytest.mark.full_matrix

SUBWORDS = ["▁he", "llo", ",", "▁wor", "ld", ".", "▁a", "b", "?", "▁c"]
CHARACTERS = "▁helowrd,.abc?"


def tiny_generation(model: Any, vocab: int) -> None:
    """The maps of ``generate``: two languages, and (v2) a subword for every id and an id for every
    character."""
    from transformers import GenerationConfig

    # made anew, not the one derived from the model's config (from_pretrained remakes that one from it)
    generation = GenerationConfig.from_dict(model.generation_config.to_dict())
    generation._from_model_config = False
    generation.text_decoder_lang_to_code_id = {"eng": vocab - 8, "fra": vocab - 7}
    generation.t2u_lang_code_to_id = {"eng": vocab - 4, "fra": vocab - 3}
    generation.vocoder_lang_code_to_id = {"eng": 1, "fra": 2}
    if stages.is_v2(model):
        generation.id_to_text = {str(i): SUBWORDS[i % len(SUBWORDS)] for i in range(vocab)}
        generation.char_to_id = {c: 4 + i for i, c in enumerate(CHARACTERS)}
    model.generation_config = generation


def _tiny_model(v2: bool) -> Any:
    from transformers import (
        SeamlessM4TConfig,
        SeamlessM4TForTextToSpeech,
        SeamlessM4Tv2Config,
        SeamlessM4Tv2ForTextToSpeech,
    )

    vocab = 64
    sizes: dict[str, Any] = {
        "vocab_size": vocab,
        "t2u_vocab_size": vocab,
        "hidden_size": 16,
        "initializer_range": 0.2,
        "max_position_embeddings": 64,
        "t2u_max_position_embeddings": 64,
        **{f"{side}_layers": 1 for side in ("encoder", "decoder", "t2u_encoder", "t2u_decoder")},
        **{f"{side}_ffn_dim": 32 for side in ("encoder", "decoder", "t2u_encoder", "t2u_decoder")},
        **{f"{side}_attention_heads": 2 for side in ("encoder", "decoder", "t2u_encoder", "t2u_decoder")},
        "upsample_initial_channel": 16,
        "upsample_rates": [4, 2],
        "upsample_kernel_sizes": [8, 4],
        "resblock_kernel_sizes": [3],
        "resblock_dilation_sizes": [[1, 3]],
        "unit_hifi_gan_vocab_size": vocab,
        "unit_embed_dim": 16,
        "lang_embed_dim": 4,
        "spkr_embed_dim": 4,
        "vocoder_num_langs": 4,
        "vocoder_num_spkrs": 4,
    }
    torch.manual_seed(0)
    if v2:
        config: Any = SeamlessM4Tv2Config(
            **sizes,
            char_vocab_size=32,
            t2u_variance_predictor_embed_dim=16,
            t2u_variance_predictor_hidden_dim=16,
        )
        model: Any = SeamlessM4Tv2ForTextToSpeech(config).eval()
    else:
        model = SeamlessM4TForTextToSpeech(SeamlessM4TConfig(**sizes)).eval()
    with torch.no_grad():  # the control ids below the vocoder's offset (but its pad): never a unit
        for i in range(model.config.vocoder_offset):
            if i != model.config.t2u_pad_token_id:
                model.t2u_model.lm_head.weight[i] = 0.0
    tiny_generation(model, vocab)
    return model


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("seamless")
    _tiny_model(v2=True).save_pretrained(tmp / "checkpoint")
    return fastonnx.export_pretrained(
        tmp / "checkpoint", tmp / "package", task="text-to-audio", progress=False
    )


FILES = (stages.TEXT_ENCODER_FILE, stages.TEXT_DECODER_FILE, stages.T2U_FILE, stages.VOCODER_FILE)


def test_seamless_v2_package_is_verified(package: Any) -> None:
    assert package.verified is True, package.verify_note
    assert set(FILES) <= set(package.files)
    t2u = onnx.load(str(package.outdir / stages.T2U_FILE), load_external_data=False).graph
    assert [i.name for i in t2u.input] == [
        "inputs_embeds",
        "attention_mask",
        "char_input_ids",
        "char_count_per_id",
    ]
    step = onnx.load(str(package.outdir / stages.TEXT_DECODER_FILE), load_external_data=False).graph
    assert [o.name for o in step.output][:3] == ["logits", "last_hidden_state", "present.0.decoder.key"]


def test_check_runs_every_stage_in_onnxruntime_and_fails_on_perturbed_sessions(package: Any) -> None:
    from transformers import SeamlessM4Tv2ForTextToSpeech

    from fastonnx.errors import InputError
    from fastonnx.pretrained.half_package import float32_tolerance

    model = SeamlessM4Tv2ForTextToSpeech.from_pretrained(package.outdir.parent / "checkpoint").eval()
    sessions = {
        n: ort.InferenceSession(str(package.outdir / n), providers=["CPUExecutionProvider"]) for n in FILES
    }
    by_session = {id(s): n for n, s in sessions.items()}
    calls: Counter[str] = Counter()

    def perturbed(session: Any, names: list[str], tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        name = by_session[id(session)]
        calls[name] += 1
        out = _run(session, names, tensors)
        generation = calls[stages.TEXT_ENCODER_FILE]  # one text encoder run a generation
        if generation == 1 and name == stages.VOCODER_FILE:
            out[0] += 1e-3  # the first generation's waveform off by 10 x atol
        if generation == 2 and name == stages.T2U_FILE:
            out[0][..., 5] += 100.0  # the second's units: 5 everywhere
        return out

    infos = stages.check_package(sessions, model, {n: None for n in FILES}, perturbed, float32_tolerance)
    failed = {i.name for i in infos if not i.passed}
    first, second = "2x7, tgt_lang eng", "1x5, tgt_lang eng"
    must = {f"waveform ({first})", f"unit tokens ({second})", f"waveform ({second})"}
    # the units' durations may give the second waveform its length anyway
    assert must <= failed <= must | {f"waveform_lengths ({second})"}
    # each generation: one text encoder, text unit model and vocoder run; a text decoder step a generated
    # token, then its pass over the translation
    texts = [i for i in infos if i.name.startswith("text tokens")]
    steps = sum(i.shape[1] - 2 + 1 for i in texts)
    assert calls == {
        stages.TEXT_ENCODER_FILE: 2,
        stages.T2U_FILE: 2,
        stages.VOCODER_FILE: 2,
        stages.TEXT_DECODER_FILE: steps,
    }
    # without the generation config's maps, the check says what the package's loop lacks
    del model.generation_config.char_to_id
    with pytest.raises(InputError, match="char_to_id"):
        stages.check_package(sessions, model, {}, perturbed, float32_tolerance)
