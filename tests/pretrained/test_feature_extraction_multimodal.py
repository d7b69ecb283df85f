"""feature-extraction of multimodal base models the architecture sweep found "not buildable" for want of
the right inputs (multimodal_features.py), each built from the sweep's own tiny config with random weights,
exported by ``export_pretrained`` and verified against transformers eager:

- a vision-language model merging image features at placeholder tokens (LLaVA, Qwen2-VL, Gemma 3...) was
  fed ``pixel_values`` beside text holding no image token, which its forward refuses ("Image features and
  image tokens do not match", Qwen-VL's missing grid): it reads text alone; Llama 4's base class holds
  logits alone: its bare language model's states;
- video encoders read 5-D ``pixel_values`` (the config's ``num_frames``);
- BridgeTower reads its texts and images as pairs: as many of each;
- the M-RoPE text models' tiny configs split their rotary frequencies as they have them.
"""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
import torch
from checkpoint_folders import architecture_sweep, export_swept

from fastonnx.pretrained.encoder_tasks import BATCH, DecoderStates, encoder, encoder_inputs, from_decoder
from fastonnx.pretrained.multimodal_features import bare_decoder
from support.matrix import sampled

TASK = "feature-extraction"

TEXT_ALONE = (
    *("aria", "aya_vision", "chameleon", "cohere2_vision", "cohere_compass", "cosmos3_edge", "cosmos3_omni"),
    *("deepseek_ocr2", "deepseek_vl", "dots3_note", "emu3", "exaone4_5", "florence2", "fuyu", "gemma3"),
    *("glm46v", "glm4v", "glm4v_moe", "glm_image", "glm_ocr", "glmga", "got_ocr2", "granite4_vision"),
    *("hyperclovax_vision_v2", "idefics2", "idefics3", "inkling_mm_model", "internvl", "janus", "kimi_k25"),
    *("lfm2_vl", "lfm3_vl", "lighton_ocr", "llama4", "llava", "llava_next", "llava_next_video"),
    *("minicpm_ocr", "minicpmv4_6", "minicpmv4_7", "minimax_m3_vl", "mistral3", "mistral_large4"),
    *("modernvbert", "molmo2", "muse_glimmer", "muse_spark", "ovis2", "paddleocr_vl", "paligemma"),
    *("qianfan_ocr", "qwen2_5_omni_thinker", "qwen2_5_vl", "qwen2_vl", "qwen3_5", "qwen3_5_moe"),
    *("qwen3_omni_moe_thinker", "qwen3_vl", "qwen3_vl_moe", "qwen4_exp", "smolvlm", "step3p7"),
    *("ultravbert", "unlimited_ocr", "video_llama_3", "video_llava", "vipllava"),
    # an omni model's audio config does not take it to the audio base models' graph: it reads text alone
    *("embedding_gemma2", "gemma4", "gemma4_unified"),
)
VIDEO = ("timesformer", "videomae", "vivit", "xclip")
PAIRS = ("bridgetower", "git", "layoutlmv3")  # GIT, LayoutLMv3: their batch mismatched too
MROPE_TEXT = (
    *("glm4v_moe_text", "glm4v_text", "glm_image_text", "glm_ocr_text", "qwen2_5_vl_text", "qwen2_vl_text"),
)


def _sweep_model(model_type: str) -> Any:
    sweep = architecture_sweep()
    name = dict(sweep.architectures(TASK))[model_type]
    cls = getattr(__import__("transformers"), name)
    return cls(sweep.tiny_config(model_type)).eval()


@pytest.mark.parametrize(
    "model_type", sampled([*TEXT_ALONE, *VIDEO, *PAIRS, *MROPE_TEXT], lambda name: name == "llava")
)
def test_multimodal_base_model_exports_verified(tmp_path: pathlib.Path, model_type: str) -> None:
    written = export_swept(tmp_path, TASK, model_type)
    assert written.verified is True, written.verify_note


def test_placeholder_model_reads_text_alone() -> None:
    """LLaVA's feature-extraction takes text alone; its other image tasks keep their images."""
    model = _sweep_model("llava")
    inputs, dims = encoder_inputs(model, model.config, TASK, 2, "cpu")
    assert list(inputs) == ["input_ids", "attention_mask"]
    assert dims["input_ids"][0] == BATCH
    with torch.no_grad():
        model(**inputs)  # transformers' own forward runs on them
    other, _ = encoder_inputs(model, model.config, "zero-shot-image-classification", 2, "cpu")
    assert "pixel_values" in other


def test_video_encoder_reads_its_frames() -> None:
    model = _sweep_model("videomae")
    inputs, dims = encoder_inputs(model, model.config, TASK, 2, "cpu")
    frames = model.config.num_frames
    assert inputs["pixel_values"].shape[:2] == (2, frames) and inputs["pixel_values"].dim() == 5
    assert dims == {"pixel_values": {0: BATCH}}
    spec = encoder(model, model.config, TASK)
    with torch.no_grad():
        torch.testing.assert_close(spec.module(**inputs), model(**inputs).last_hidden_state)


def test_pairs_take_as_many_texts_as_images() -> None:
    model = _sweep_model("bridgetower")
    inputs, dims = encoder_inputs(model, model.config, TASK, 2, "cpu")
    assert inputs["input_ids"].shape[0] == inputs["pixel_values"].shape[0] == 2
    assert dims["input_ids"][0] == dims["pixel_values"][0] == BATCH
    spec = encoder(model, model.config, TASK)
    assert spec.output_names == ["text_features", "image_features", "pooler_output"]


def test_llama4_states_are_its_language_model_s() -> None:
    """Llama 4's base class returns logits alone: the graph's module gives its bare decoder's states."""
    model = _sweep_model("llama4")
    assert from_decoder(model, model.config, TASK, ("last_hidden_state",))
    inputs, _ = encoder_inputs(model, model.config, TASK, 2, "cpu")
    spec = encoder(model, model.config, TASK)
    assert isinstance(spec.module.inner, DecoderStates)
    with torch.no_grad():
        expected = model.language_model.model(**inputs).last_hidden_state
        torch.testing.assert_close(spec.module(**inputs), expected)
        assert bare_decoder(model) is model.language_model.model
