"""The architecture sweep (issue 32, part 5): every architecture of the pinned transformers in the
causal-LM, masked-LM, sequence-classification, question-answering and image-classification auto-mappings,
built from a tiny config with random weights, saved with ``save_pretrained`` (and a tiny tokenizer for text
tasks) to a temporary folder, then exported by the ``fastonnx export`` command with verification on (the package run
in onnxruntime against transformers eager). Writes the "transformers architectures" section of
docs/coverage.md (between its markers; scripts/sweep.py keeps the section when it rewrites the rest),
stamped with the commit, after each architecture: an interrupted run leaves an honest partial section.

    python scripts/architecture_sweep.py                          # every task, rewrite the section
    python scripts/architecture_sweep.py --tasks text-generation  # one task (the others listed as not run)
    python scripts/architecture_sweep.py --only llama,bert        # these model types (prints, no write)
    python scripts/architecture_sweep.py --limit 10               # the first 10 of each task (no write)
    python scripts/architecture_sweep.py --only-build             # only build the tiny checkpoints: counts
    python scripts/architecture_sweep.py --render                 # the section from the store, no sweep

Each architecture runs in a worker process (imports paid once per worker) with a timeout; a worker that
crashes or times out is replaced. Every folder written is deleted.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import io
import json
import multiprocessing as mp
import os
import pathlib
import re
import shutil
import sys
import tempfile
import time
import traceback
from collections import Counter
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COVERAGE = os.path.join(ROOT, "docs", "coverage.md")
SECTION = "transformers-architectures"

sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import higgs_audio_sweep  # noqa: E402
from fastonnx.pretrained import tasks as _tasks  # noqa: E402  (after the path: a checkout's own package)
from tiny_config_fixes import tiny_fixes  # noqa: E402

# task -> the transformers.models.auto.modeling_auto mappings listing its architectures: every task
# `fastonnx export` knows
TASKS = {name: t.mappings for name, t in _tasks.TASKS.items()}
STORE = os.path.join(ROOT, "docs", "data", "architecture_sweep.json")  # every task's last run, kept
VOCAB = 128
MAX_PARAMS = 20_000_000  # a tiny config still above this: the shrinking missed a size of the architecture

# config keys set where the architecture's config has them (a key absent from its defaults is left out)
_SIZES: dict[str, Any] = {
    **dict.fromkeys(
        (
            "num_hidden_layers",
            "n_layer",
            "n_layers",
            "num_layers",
            "encoder_layers",
            "decoder_layers",
            "num_decoder_layers",
        ),
        2,
    ),
    **dict.fromkeys(("hidden_size", "n_embd", "n_embed", "d_model", "dim", "model_dim"), 64),
    **dict.fromkeys(
        (
            "num_attention_heads",
            "n_head",
            "n_heads",
            "encoder_attention_heads",
            "decoder_attention_heads",
        ),
        4,
    ),
    **dict.fromkeys(("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num"), 2),
    **dict.fromkeys(("head_dim", "kv_channels", "d_kv", "d_head", "attention_head_dim"), 16),
    **dict.fromkeys(
        (
            "intermediate_size",
            "ffn_dim",
            "n_inner",
            "d_ff",
            "hidden_dim",
            "ffn_hidden_size",
            "encoder_ffn_dim",
            "decoder_ffn_dim",
            "moe_intermediate_size",
            "shared_expert_intermediate_size",
            "expert_intermediate_size",
        ),
        128,
    ),
    **dict.fromkeys(("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len"), 128),
    **dict.fromkeys(("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts"), 4),
    **dict.fromkeys(("num_experts_per_tok", "num_experts_per_token", "moe_topk", "moe_k", "top_k"), 2),
    **dict.fromkeys(("n_group", "num_expert_group", "topk_group"), 1),
    "vocab_size": VOCAB,
    "embedding_size": 32,
    "word_embed_proj_dim": 64,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "num_labels": 3,
    # vision
    "image_size": 32,
    "patch_size": 8,
    "num_channels": 3,
}
_VISION_LISTS = {
    "num_attention_heads": 1,
    "depths": 1,
    "hidden_sizes": None,
    "num_heads": 2,
    "embed_dim": None,
    "embed_dims": None,
    "neck_hidden_sizes": None,  # DPT's reassembly widths
}
TINY_TIMM = "test_resnet"  # timm's own test ResNet (0.4M parameters): detectors' timm backbones
# sizes a checkpoint always sets that some configs leave None by default, the model then failing on them
# (HunYuan's head_dim, Nemotron's key-value heads, Dots1's experts, Qwen4-Exp's sparse-attention indexer)
_NONE_FILLED = {
    **{k: _SIZES[k] for k in ("head_dim", "num_key_value_heads", "n_routed_experts", "num_local_experts")},
    "num_experts_per_tok": _SIZES["num_experts_per_tok"],
    "n_shared_experts": 1,
    "vocab_size": VOCAB,  # ESM's
    "indexer_n_heads": 4,
    "indexer_kv_heads": 1,
    "indexer_head_dim": 16,
    "indexer_budget": 8,
    "indexer_compress_ratio": 4,
}
# what the checkpoints set that no default has and no rule can tell (the kinds of layers, a value the
# model reads from a sub-config whose class lacks it): these architectures' released config.json
_CHECKPOINT_VALUES: dict[str, dict[str, Any]] = {
    "lfm2_moe": {"layer_types": ["conv", "full_attention"]},  # LiquidAI/LFM2-8B-A1B: convolutions, attention
    # Qwen/Qwen3-Omni-30B-A3B-Instruct's talker: its config.json sets a shared expert's width and the
    # vision merge (2 x 2 patches), which its config class does not define and its model reads
    "qwen3_omni_moe": {
        "talker_config": {"spatial_merge_size": 2, "text_config": {"shared_expert_intermediate_size": 128}}
    },
    # IDEA-Research/grounding-dino-tiny keeps the top 900 of its encoder's proposal scores: at random weights
    # the 900th and 901st of the tiny image's 4165 lie 2e-5 apart, within float32 rounding, so which one
    # makes the cut (and the order of near-equal ones) says nothing of the export: the top 20 are far apart
    **dict.fromkeys(("grounding-dino", "mm-grounding-dino"), {"num_queries": 20}),
    # D-FINE's family draws its HGNetV2 backbone's and encoder's convolutions N(0, 0.02) and N(0, 0.01): at
    # tiny widths each shrinks the features ~10x, the encoder's scores of all 1029 anchors come out equal
    # (the score head's bias), and torch and onnxruntime break that tie of their top 300 differently,
    # which says nothing of the export. At std 0.1 the scores spread; their top 20 lie over 1e-4 apart
    **dict.fromkeys(
        ("d_fine", "deimv2", "pp_doclayout_v2", "pp_doclayout_v3", "pp_doclayout_v4"),
        {"initializer_range": 0.1, "backbone_config": {"initializer_range": 0.1}, "num_queries": 20},
    ),
    "dbrx": {"attn_config": {"rope_theta": 500000.0, "clip_qkv": 8}},  # databricks/dbrx-instruct
    # Zyphra/Zamba-7B-v1 has 13 hybrid layers sharing one attention block; transformers ties the others to
    # the first and fails where there is no other (one of each kind of layer at two layers)
    "zamba": {"layers_block_type": ["hybrid", "hybrid"]},
    "t5": {"decoder_start_token_id": 0},  # google-t5/t5-small: T5ForSequenceClassification shifts with it
    # google/pix2struct-base: the text model's 12 heads of d_kv 64 make its width 768 (its projections
    # are width to width); the tiny width 64 takes 4 heads of 16
    "pix2struct": {"text_config": {"num_heads": 4}},
    # microsoft/udop-large: the decoder starts at the pad token (0), as T5's; generate needs it
    "udop": {"decoder_start_token_id": 0},
    # usyd-community/vitpose-base-simple: one MLP a layer (ViTPose++'s experts read a dataset_index input)
    "vitpose": {"backbone_config": {"num_experts": 1}},
    # Qwen/Qwen2-VL-2B, Qwen/Qwen2.5-VL-3B (PaddlePaddle/PaddleOCR-VL too): mrope_section [16, 24, 24] splits
    # the 64 rotary frequencies of head_dim 128 over the temporal, row and column planes; the tiny head_dim
    # 16 has 8, split alike
    **dict.fromkeys(
        ("qwen2_vl", "qwen2_5_vl", "paddleocr_vl"),
        {"text_config": {"rope_parameters": {"rope_type": "default", "mrope_section": [2, 3, 3]}}},
    ),
    # Qwen/Qwen3-VL-2B-Instruct, Qwen/Qwen3.5-2B (and the towers built on theirs): the merger's output is the text's width (out_hidden_size 2048,
    # text hidden_size 2048), the tower's 24 blocks of 16 heads of 64; Qwen3-VL's deepstack mergers read 3
    # of them ([5, 11, 17]) into the text's first 3 layers: 2 of the 2 tiny blocks, into the 2 layers
    **dict.fromkeys(
        ("qwen3_vl", "qwen3_vl_moe", "cohere_compass", "cosmos3_omni"),
        {
            "vision_config": {
                "depth": 2,
                "num_heads": 4,
                "out_hidden_size": 64,
                "deepstack_visual_indexes": [0, 1],
            }
        },
    ),
    **dict.fromkeys(
        ("qwen3_5", "qwen3_5_moe", "qwen4_exp"),
        {"vision_config": {"depth": 2, "num_heads": 4, "out_hidden_size": 64}},
    ),
    # zai-org/GLM-4.1V-9B-Thinking: the tower's 24 blocks of 12 heads (of 128), its downsampling to the text's
    # width (out_hidden_size 4096 = hidden_size); the tiny width 64 takes 4 heads, 2 blocks. Its mrope_section
    # [8, 12, 12] splits the 32 rotary frequencies of head_dim 128 at partial_rotary_factor 0.5: the tiny
    # head_dim 16 has 8 (GLM-4.5V's factor 0.5 leaves it 4), split alike
    **{
        t: {
            "vision_config": {"depth": 2, "num_heads": 4, "out_hidden_size": 64},
            "text_config": {
                "rope_parameters": {"mrope_section": [1, 1, 2] if t == "glm4v_moe" else [2, 3, 3]}
            },
        }
        for t in ("glm4v", "glm4v_moe", "glm46v", "glm_ocr")
    },
    # Qwen/Qwen3-Omni-30B-A3B-Instruct's thinker_config sets the vision start token (151652), which the config
    # class has no default for and get_rope_index reads: one of the tiny vocabulary's unused last ids
    # Qwen/Qwen2.5-Omni-7B's thinker_config: its vision start token (151652) as above; its tower Qwen2.5-VL's
    # (32 blocks of 16 heads, full attention in 4: [7, 15, 23, 31]), its mrope_section [16, 24, 24]
    "qwen2_5_omni_thinker": {
        "vision_start_token_id": VOCAB - 7,
        "vision_config": {"depth": 2, "num_heads": 4, "fullatt_block_indexes": [1]},
        "text_config": {"rope_parameters": {"mrope_section": [2, 3, 3]}},
    },
    # Its vision tower is Qwen3-VL's (out_hidden_size 2048 = the thinker's hidden_size, deepstack [8, 16, 24])
    "qwen3_omni_moe_thinker": {
        "vision_start_token_id": VOCAB - 6,
        "vision_config": {
            "depth": 2,
            "num_heads": 4,
            "out_hidden_size": 64,
            "deepstack_visual_indexes": [0, 1],
        },
    },
    # ibm-granite/granite-speech-3.3-2b: the projector's Q-Former reads the encoder's states, as wide as its
    # hidden_dim (1024 both); the Q-Former's default (1408) is not the encoder's
    **dict.fromkeys(
        ("granite_speech", "granite_speech_plus"),
        {"projector_config": {"encoder_hidden_size": _SIZES["hidden_dim"]}},
    ),
    # Qwen/Qwen3-ASR-1.7B-hf: the projector's rows replace text embeddings, so its output_dim is the text's
    # width; the audio config's default (3584) is not the default text's (2048)
    "qwen3_asr": {"audio_config": {"output_dim": _SIZES["hidden_size"]}},
    "voxtral": {"audio_token_id": 24},  # mistralai/Voxtral-Mini-3B-2507: the audio's placeholder token
    # nvidia/Nemotron-3-Diarization leaves num_key_value_heads unset (as many as the 8 heads): its v_proj
    # has num_attention_heads heads, which the tiny 2 key-value heads do not repeat to
    "nemotron3_diarization": {"audio_config": {"num_key_value_heads": _SIZES["num_attention_heads"]}},
    # llava-hf/vip-llava-7b-hf reads hidden states (-2, -5, -8, -11, 6) of its 24-layer CLIP tower; the tiny
    # tower's 2 layers have 3: five of those, the projector as wide
    "vipllava": {"vision_feature_layers": [-2, -1, -3, 0, 1]},
    # tencent/HunyuanOCR: its xdrope_section [16, 16, 16, 16] splits the 64 rotary frequencies of head_dim 128
    # over four planes (sequence, width, height, image), which get_rope_index requires (3 at least); the
    # tiny head_dim 16 has 8, split alike
    "hunyuan_vl": {
        "text_config": {"rope_parameters": {"rope_type": "default", "mrope_section": [2, 2, 2, 2]}}
    },
    # Muse Glimmer's (and Muse Spark's) defaults: the pixel shuffle (merge 2) makes 4 x the vision hidden
    # (1536) the adapter's input (out_hidden_size 6144); the adapter's width (projector_hidden_size 4096)
    # the text's
    **dict.fromkeys(
        ("muse_glimmer", "muse_spark"),
        {"out_hidden_size": 4 * _SIZES["hidden_size"], "projector_hidden_size": _SIZES["hidden_size"]},
    ),
    # meta-llama/Llama-4-Scout-17B-16E: the pixel shuffle (ratio 0.5) makes 4 x the vision hidden (1408) the
    # adapter's input (intermediate_size 5632), whose projector and output are the text's width (4096)
    "llama4": {
        "vision_config": {
            "intermediate_size": 4 * _SIZES["hidden_size"],
            **dict.fromkeys(
                ("projector_input_dim", "projector_output_dim", "vision_output_dim"), _SIZES["hidden_size"]
            ),
        }
    },
    # Salesforce/blip2-opt-2.7b, Salesforce/instructblip-vicuna-7b: the query tokens' placeholder (50265,
    # 32001), which the processor repeats num_query_tokens times; the config's default (None) names none
    **dict.fromkeys(("blip-2", "instructblip"), {"image_token_index": VOCAB - 1}),
    # openbmb/MiniCPM-V-4.6, MiniCPM-OCR: the checkpoint names its image token (the tokenizer's), the config
    # class none; the window merger follows vision layer 6 of 27 (insert_layer_id), inside the tiny 2 here
    "minicpmv4_6": {"image_token_id": VOCAB - 1, "insert_layer_id": 0},
    "minicpm_ocr": {"image_token_id": VOCAB - 1},
    # nvidia/Nemotron-3-Nano-Omni-30B-A3B-Reasoning-BF16 names its image token (img_context_token_id, the
    # tokenizer's <image>), the config class none
    "nemotron_h_omni": {"image_token_id": VOCAB - 1},
    # allenai/Molmo2-8B's image patch token (151938) is an added token, past the text's vocabulary (151936) in
    # the additional one (additional_vocab_size 128): the tiny vocabulary's 128 + 2 alike
    "molmo2": {"image_patch_id": VOCAB + 2},
    # openbmb/MiniCPM-V-4.7 names its image token and the markers around each crop, where its canvas
    # M-RoPE anchors (the config class: None)
    "minicpmv4_7": {
        "insert_layer_id": 0,
        **{
            k: VOCAB - 1 - i
            for i, k in enumerate(
                (
                    "image_token_id",
                    "image_start_id",
                    "image_end_id",
                    "slice_start_id",
                    "slice_end_id",
                    "newline_id",
                )
            )
        },
    },
    # Salesforce/instructblip-vicuna-7b used for video: the video token, and positions (2048) for a video's
    # 4 frames of 32 query rows, which the tiny 128 do not hold with a prompt
    "instructblipvideo": {"video_token_index": VOCAB - 1, "text_config": {"max_position_embeddings": 256}},
    # meta-llama/Llama-3.2-11B-Vision: a cross-attention layer among the text layers (its 3, 8, 13...
    # are past the tiny 2), the vision tower's taps among its layers (the projector reads them: 3 x 64)
    "mllama": {
        "text_config": {"num_hidden_layers": 3, "cross_attention_layers": [1]},
        "vision_config": {
            "intermediate_layers_indices": [0, 1],
            "vision_output_dim": 192,
            "num_global_layers": 2,
        },
    },
    # deepseek-community/deepseek-vl-7b-chat: its SAM tower's 12 layers attend globally in [2, 5, 8, 11], the
    # first of which feeds the high-resolution features; the tiny tower's 2 layers: the last
    "deepseek_vl_hybrid": {"high_res_vision_config": {"global_attn_indexes": [1]}},
    # google/gemma-4-E2B-it: the config class has no default vision tower (None: a text model), the
    # checkpoints one (16 layers of 12 heads of 64, patches of 16 pooled 3 x 3); the tiny tower 2 layers of
    # 4 heads, patches of 4 pooled 2 x 2
    "gemma4": {
        "vision_config": {
            "model_type": "gemma4_vision",
            "hidden_size": _SIZES["hidden_size"],
            "intermediate_size": 2 * _SIZES["hidden_size"],
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "head_dim": _SIZES["hidden_size"] // 4,
            "patch_size": 4,
            "pooling_kernel_size": 2,
            "position_embedding_size": 64,
        }
    },
    # Gemma 4 Unified's encoder-free patch embedder (no default either): merged patches of 4 x 4 pixels
    "gemma4_unified": {
        "vision_config": {
            "model_type": "gemma4_unified_vision",
            "patch_size": 2,
            "pooling_kernel_size": 2,
            **dict.fromkeys(("mm_embed_dim", "output_proj_dims"), _SIZES["hidden_size"]),
            "mm_posemb_size": 64,
        }
    },
}
_HIDDEN_KEYS = ("hidden_size", "n_embd", "n_embed", "d_model", "dim", "model_dim")
_NOT_WIDTHS = re.compile("position|window|chunk|batch|image|patch")  # sizes that make no weight wider


def _kept_layers(defaults: dict[str, Any], layers: int) -> list[int]:
    """The layers of the full depth that the two tiny layers stand for: the first layer of each of the
    first two kinds of its per-layer kinds list (layer_types...), else the first layer and the first one
    that ``per_layer_config`` sets apart."""
    lists = sorted(defaults.items(), key=lambda item: item[0] != "layer_types")  # layer_types first
    for _, value in lists:
        if isinstance(value, list) and len(value) == layers and all(isinstance(v, str) for v in value):
            kinds = list(dict.fromkeys(value))
            if len(kinds) > 1:
                return [0, value.index(kinds[1])]
    special = sorted(i for i in (int(k) for k in defaults.get("per_layer_config") or {}) if i > 0)
    return [0, special[0] if special else 1]


def _per_layer_config(defaults: dict[str, Any], tiny: dict[str, Any], kept: list[int]) -> dict[int, Any]:
    """``per_layer_config`` (layer index -> the settings where that layer differs from the global ones)
    for the kept layers, renumbered, its sizes scaled as the tiny config scales the global ones: Gemma 4's
    full-attention heads stay twice as wide as the others."""
    per_layer = {int(k): v for k, v in (defaults.get("per_layer_config") or {}).items()}
    out: dict[int, Any] = {}
    for new, old in enumerate(kept):
        if not isinstance(layer := per_layer.get(old), dict):
            continue
        out[new] = {}
        for key, value in layer.items():
            full, small = defaults.get(key), tiny.get(key)
            if _is_int(value) and _is_int(full) and _is_int(small) and full > 0:
                value = (
                    small * value // full if (small * value) % full == 0 and small * value >= full else small
                )
            out[new][key] = value
        full, small = {**defaults, **layer}, {**tiny, **out[new]}
        parts = ("head_dim", "qk_nope_head_dim", "qk_rope_head_dim")
        if all(_is_int(full.get(k)) and _is_int(small.get(k)) for k in parts) and full[parts[0]] == (
            full[parts[1]] + full[parts[2]]
        ):  # heads as wide as their parts without and with rotary (Dots 3's sliding-window layers)
            out[new]["head_dim"] = small[parts[1]] + small[parts[2]]
    return out


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_sub_config(key: str, value: Any) -> bool:
    """A config dict's entry holding a sub-config (text_config, Musicgen's decoder)."""
    return (
        isinstance(value, dict)
        and key != "per_layer_config"
        and (key.endswith("_config") or "model_type" in value)
    )


def _hidden_sizes(defaults: dict[str, Any]) -> set[int]:
    """The hidden sizes of a config and its sub-configs."""
    found = {v for k in _HIDDEN_KEYS if _is_int(v := defaults.get(k))}
    return found.union(*(_hidden_sizes(v) for k, v in defaults.items() if _is_sub_config(k, v)))


def _shrunk(defaults: dict[str, Any], vision: bool, hiddens: set[int] | None = None) -> dict[str, Any]:
    """Overrides making a config of these defaults tiny (recursing into sub-configs; ``hiddens``: the
    hidden sizes of the whole config, which other widths may repeat)."""
    out: dict[str, Any] = {}
    hiddens = _hidden_sizes(defaults) if hiddens is None else hiddens
    layers = next(
        (v for k in ("num_hidden_layers", "n_layer", "num_layers") if _is_int(v := defaults.get(k))),
        None,
    )
    kept = _kept_layers(defaults, layers) if layers is not None and layers > 2 else [0, 1]
    hidden = next((v for k in _HIDDEN_KEYS if _is_int(v := defaults.get(k))), None)
    for key, value in defaults.items():
        if key == "per_layer_config":
            continue  # after the global sizes, which it scales
        if _is_sub_config(key, value):
            out[key] = {**value, **_shrunk(value, vision, hiddens)}
            if out[key].get("backbone") == TINY_TIMM != value.get("backbone"):
                out[key] = _timm_stand_in(out[key])
        elif key in _NONE_FILLED and value is None:
            out[key] = _NONE_FILLED[key]
        elif key.endswith("_groups") and _is_int(value) and value > 1 and value == hidden:
            out[key] = _SIZES["hidden_size"]  # depthwise convolutions, a group a channel (Mimi's upsampling)
        elif key.endswith("_dim_factor") and isinstance(value, float) and value < 1:
            out[key] = 1.0  # xLSTM's cache rounds hidden x factor up to 64s, its layers do not: whole
        elif key == "backbone" and isinstance(value, str) and defaults.get("model_type") == "timm_backbone":
            out[key] = TINY_TIMM
        elif key == "rotary_dim" and _is_int(value):
            out[key] = 8  # partial rotary within the 16-wide heads (GPT-J, CodeGen)
        elif key == "embedding_size" and _is_int(value) and value == hidden:
            out[key] = _SIZES["hidden_size"]  # embeddings as wide as the layers (SqueezeBERT needs it)
        elif key in _SIZES and _is_int(value):
            out[key] = _SIZES[key]
            if key == "patch_size" and value < 8:
                # hierarchical vision models (Swin...) keep their small patches, on larger images
                out[key], out["image_size"] = value, 16 * value
        elif (
            _is_int(value)
            and value > 256
            and value in hiddens
            and key.endswith(("_dim", "_size", "_width"))
            and "vocab" not in key
            and not _NOT_WIDTHS.search(key)
        ):  # a width that is one of the hidden sizes (Dots 3's adapters between vision and text)
            out[key] = _SIZES["hidden_size"]
        elif "vocab" in key and _is_int(value) and value > VOCAB:
            out[key] = VOCAB  # the other vocabularies (Gemma 3n's per-layer inputs, BLT's hashed bytes)
        elif key == "window_size" and _is_int(value) and vision:
            out[key] = 2  # windows that the last stage's resolution still holds
        elif key in _VISION_LISTS and isinstance(value, list) and value and _is_int(value[0]):
            fixed = _VISION_LISTS[key]
            out[key] = [fixed] * len(value) if fixed else [16 * 2**i for i in range(len(value))]
        elif key in _VISION_LISTS and key == "embed_dim" and _is_int(value):
            out[key] = 32 if vision else 64
        elif isinstance(value, list) and layers is not None and layers > 2 and len(value) == layers:
            # per-layer lists (layer_types...) follow the layer count, keeping one layer of each kind
            kinds = list(dict.fromkeys(v for v in value if isinstance(v, str)))
            if kinds == ["linear_attention"]:  # a hybrid's attention layer (Granite 4 hybrids: none)
                out[key] = ["linear_attention", "full_attention"]
            elif len(kinds) > 1:
                out[key] = (kinds + value[:2])[:2]
            elif key in _SIZES and all(_is_int(v) for v in value):  # Gemma 3n's per-layer widths
                out[key] = [_SIZES[key]] * 2
            else:
                out[key] = value[:2]
        elif (
            isinstance(value, list)
            and key.endswith("_types")
            and all(isinstance(v, str) for v in value)
            and len(kinds := list(dict.fromkeys(value))) > 1
        ):  # a repeating pattern of kinds (RecurrentGemma's block_types): one of each in the two layers
            out[key] = kinds[:2]
        elif (
            isinstance(value, list)
            and hidden
            and len(value) > 1
            and all(_is_int(v) for v in value)
            and sum(value) == hidden
        ):  # parts of the hidden size (Reformer's axial position embeddings)
            out[key] = [v * _SIZES["hidden_size"] // hidden for v in value]
    # hybrid models (Jamba, Bamba...): one attention layer among the two
    for key, value in (("attn_layer_period", 2), ("attn_layer_offset", 1), ("expert_layer_period", 2)):
        if _is_int(defaults.get(key)):
            out[key] = value
    if _is_int(defaults.get("expert_layer_offset")):
        out["expert_layer_offset"] = 1
    if "attn_layer_indices" in defaults and (
        defaults["attn_layer_indices"] is None or isinstance(defaults["attn_layer_indices"], list)
    ):
        out["attn_layer_indices"] = [1]
    if _is_int(defaults.get("num_dense_layers")) and defaults["num_dense_layers"] > 1:
        out["num_dense_layers"] = 1  # the second layer a MoE one (LFM2-MoE)
    kinds = out.get("layer_types", defaults.get("layer_types"))
    if defaults.get("rope_parameters") == {} and isinstance(kinds, list) and kinds:
        # rotary settings by kind of layer that the defaults leave empty (Cohere Compass): the default's
        out["rope_parameters"] = {
            k: {"rope_type": "default", "rope_theta": 10000.0} for k in dict.fromkeys(kinds)
        }
    if _is_int(defaults.get("num_kv_shared_layers")) and defaults["num_kv_shared_layers"] > 0:
        out["num_kv_shared_layers"] = 0  # Gemma 3n's last layers reuse earlier caches: none at two layers
    if isinstance(defaults.get("qk_rope_head_dim"), int):  # multi-head latent attention (DeepSeek)
        out.update(qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, kv_lora_rank=32)
        out.update({k: 4 for k in ("num_key_value_heads",) if k in defaults})
        out.update({k: 8 for k in ("head_dim",) if k in defaults})
        if isinstance(defaults.get("q_lora_rank"), int):
            out["q_lora_rank"] = 32
    if all(_is_int(defaults.get(k)) for k in ("num_heads", "head_dim", "expand", "hidden_size")) and (
        defaults["num_heads"] * defaults["head_dim"] == defaults["expand"] * defaults["hidden_size"]
    ):  # Mamba 2's heads span the expanded width
        out["num_heads"] = defaults["expand"] * out["hidden_size"] // out["head_dim"]
    if defaults.get("default_language", 0) is None and defaults.get("languages"):
        out["default_language"] = list(defaults["languages"])[0]  # X-MOD's adapters need one
    out.update(_backbone_outputs(defaults, layers))
    if isinstance(defaults.get("per_layer_config"), dict):  # last: it scales as the global sizes scale
        out["per_layer_config"] = _per_layer_config(defaults, {**defaults, **out}, kept)
    return out


def _timm_stand_in(backbone: dict[str, Any]) -> dict[str, Any]:
    """A timm backbone's config with timm's test ResNet standing in for its model: without the arguments
    of the model it replaces that the config carries for ``timm.create_model`` (OmDet-Turbo's Swin:
    img_size, always_partition, its config's timm_kwargs), which the ResNet does not take."""
    return {k: v for k, v in backbone.items() if k not in ("img_size", "always_partition")}


def _backbone_outputs(defaults: dict[str, Any], layers: int | None) -> dict[str, Any]:
    """A layered backbone's outputs (DINOv2 under Depth Anything: out_features stage9..12; BEiT's and DPT's
    out_indices) picked among its first layers, as many layers kept as it outputs: the heads fed by them
    (DPT's neck) take one input each."""
    if layers is None:
        return {}
    indices = {
        k: v
        for k in ("out_indices", "backbone_out_indices")
        if isinstance(v := defaults.get(k), list) and v and all(_is_int(i) for i in v)
    }
    features = defaults.get("out_features")
    stages = [int(f.removeprefix("stage")) for f in features or [] if re.fullmatch(r"stage\d+", str(f))]
    count = max([len(v) for v in indices.values()] + [len(stages)], default=0)
    if not count or max([*stages, *(i for v in indices.values() for i in v)]) <= 2:
        return {}  # its outputs are among the two layers kept already
    kept = max(count, 2)
    out: dict[str, Any] = {"num_hidden_layers": kept} if _is_int(defaults.get("num_hidden_layers")) else {}
    picked = list(range(1, kept + 1))
    out.update({k: picked[-len(v) :] for k, v in indices.items()})
    if stages:
        out["out_features"] = [f"stage{i}" for i in picked[-len(stages) :]]
    return out


def _defaults(model_type: str) -> dict[str, Any]:
    """The architecture's default config as a dict (where the defaults break the config's own validation,
    as Gemma 4 Assistant's do, with the values its validator asks for)."""
    return _config(model_type, {}).to_dict()


def _config(model_type: str, overrides: dict[str, Any]) -> Any:
    """``AutoConfig.for_model(model_type, **overrides)``; where a validator refuses a value and names the
    one it wants (``X must be 0, got 256``, ``supports `X=1` only``, ``X must match Y``), that value, then
    again."""
    from huggingface_hub.errors import StrictDataclassClassValidationError
    from transformers import AutoConfig

    for _ in range(8):
        try:
            return AutoConfig.for_model(model_type, **overrides)
        except StrictDataclassClassValidationError as e:
            fix = _validator_fix(str(e))
            owner = _owner(model_type, e, fix[0]) if fix else None
            values = overrides if owner is None else overrides.get(owner)
            values = values if isinstance(values, dict) else {}
            if fix is None or (fix[1] and fix[2] not in values):
                raise
            key, value = fix[0], values[fix[2]] if fix[1] else fix[2]
            if values.get(key, object()) == value:
                raise
            values = {**values, key: value}
            overrides = values if owner is None else {**overrides, owner: values}
    return AutoConfig.for_model(model_type, **overrides)


def _validator_fix(message: str) -> tuple[str, bool, Any] | None:
    """What a config validator's message asks for, if it names it: (key, False, the value) or (key, True,
    the key whose value it must have)."""
    import ast

    if m := re.search(r"\b(\w+)`?(?: \(\S+\))? must (?:match|equal) `?(\w+)", message):
        return m.group(1), True, m.group(2)
    m = re.search(r"\b(\w+) must be (\w+), got\b", message) or re.search(r"`(\w+)=([^`\s]+)`", message)
    if m is None:
        return None
    try:
        return m.group(1), False, ast.literal_eval(m.group(2))
    except (ValueError, SyntaxError):
        return None


def _owner(model_type: str, error: BaseException, key: str) -> str | None:
    """The sub-config of ``model_type``'s config that holds ``key`` (None: the config itself): the one
    whose validator raised ``error``, from the validator's own frame, else the one with that field."""
    from transformers import CONFIG_MAPPING

    failing, tb = None, error.__cause__.__traceback__ if error.__cause__ else None
    while tb is not None:
        if hasattr(obj := tb.tb_frame.f_locals.get("self"), "model_type"):
            failing = type(obj)
        tb = tb.tb_next
    cls = CONFIG_MAPPING[model_type]
    specs = getattr(cls, "sub_configs_defaults", None) or {}
    subs = {}
    for name, sub in (getattr(cls, "sub_configs", None) or {}).items():
        spec = getattr(specs.get(name), "model_type", None) or getattr(specs.get(name), "config_class", None)
        subs[str(name)] = (
            CONFIG_MAPPING[spec] if isinstance(spec, str) and spec in CONFIG_MAPPING else spec or sub
        )
    if failing is not None and failing is not cls:
        return next((name for name, sub in subs.items() if sub is failing), None)
    if key in getattr(cls, "__dataclass_fields__", {}):
        return None
    # the config's validator checking a sub-config's value (Gemma 4 Assistant's text_config)
    return next((name for name, sub in subs.items() if key in getattr(sub, "__dataclass_fields__", {})), None)


def tiny_config(model_type: str, extra: dict[str, Any] | None = None) -> Any:
    """The architecture's config at tiny sizes (with ``extra`` overrides on top, sub-configs merged);
    raises where it cannot be built."""
    defaults = _defaults(model_type)
    vision = "image_size" in defaults or any(
        isinstance(v, dict) and "image_size" in v for v in defaults.values()
    )
    overrides = {k: v for k, v in _shrunk(defaults, vision).items() if k != "model_type"}
    if not vision:  # the special tokens inside the tiny vocabulary (a classifier needs its pad token)
        overrides.update(pad_token_id=0, bos_token_id=1, eos_token_id=2)
    overrides = _merged(overrides, _CHECKPOINT_VALUES.get(model_type, {}))
    overrides = _merged(overrides, tiny_fixes(model_type))  # sizes made consistent (tiny_config_fixes.py)
    return _config(model_type, _merged(overrides, extra or {}))


def _merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        out[key] = (
            _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out


def _model_config(cls: Any, config: Any) -> Any:
    """The config ``cls`` takes: its own, or the sub-config of a composite config made for it, as
    transformers' auto classes pass a composite's text config (Qwen3_5ForCausalLM takes Qwen3_5Config's
    text_config; MusicgenForCausalLM, MusicgenConfig's decoder)."""
    want = getattr(cls, "config_class", None)
    if not isinstance(want, type) or isinstance(config, want):
        return config
    for name in getattr(config, "sub_configs", None) or {}:
        if isinstance(sub := getattr(config, name, None), want):
            return sub
    return config


def _unshrunk(model: Any, config: Any) -> dict[str, Any]:
    """Overrides for the sizes the shrinking missed, found from the model's largest parameters: each of
    their dimensions over 256 is put down to the config values that make it (a value dividing it),
    which become 64 (a vocabulary, 128). Nested as the config's dict is (sub-configs)."""
    shapes = sorted((p.numel(), tuple(p.shape)) for p in model.parameters())[-8:]
    dims = {d for _, shape in shapes for d in shape if d > 256}

    def walk(values: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in values.items():
            if _is_sub_config(key, value):
                if sub := walk(value):
                    out[key] = sub
            elif (
                _is_int(value)
                and value > 256
                and not (key.endswith(("_id", "_index")) or _NOT_WIDTHS.search(key))
            ):
                if any(d % value == 0 for d in dims):
                    out[key] = VOCAB if "vocab" in key else _SIZES["hidden_size"]
        return out

    return walk(config.to_dict())


def _save_tokenizer(folder: pathlib.Path, vocab: int) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {f"t{i}": i for i in range(vocab)}
    inner = Tokenizer(models.WordLevel(words, unk_token="t3"))
    inner.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(
        tokenizer_object=inner, pad_token="t0", bos_token="t1", eos_token="t2", unk_token="t3"
    ).save_pretrained(folder)


def build_checkpoint(task: str, model_type: str, class_name: str, folder: pathlib.Path) -> int:
    """Saves a tiny random ``class_name`` (and its tokenizer for text tasks) to ``folder``; returns its
    parameter count. Raises where the architecture cannot be built at tiny sizes."""
    import torch
    import transformers
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()
    cls = getattr(transformers, class_name, None)
    if cls is None:
        raise LookupError(f"transformers has no class {class_name}")
    # special tokens inside the tiny vocabulary: a vision-language model's image tokens, which prompts
    # hold; a seq2seq decoder's start token (Whisper's 50257), which its first step reads. Not for
    # text-generation, whose prompts are random ids: its swept results stand as they are
    extra: dict[str, Any] = _tokens_in_vocabulary(_defaults(model_type)) if task != "text-generation" else {}
    composite = tiny_config(model_type, extra)
    for _ in range(4):  # the size first, on the meta device: sizes the shrinking missed, found and shrunk
        config = _model_config(cls, composite)
        if task == "text-generation" and getattr(config, "is_decoder", None) is False:
            # an encoder family's causal LM (BertLMHeadModel, RobertaForCausalLM...): its checkpoints for
            # generation are decoders (causal, with a cache), as transformers' own warning asks
            config.is_decoder = True
        with torch.device("meta"):
            meta = cls(config)
        params = sum(p.numel() for p in meta.parameters())
        if params <= MAX_PARAMS or (more := _merged(extra, _unshrunk(meta, composite))) == extra:
            break
        extra = more
        composite = tiny_config(model_type, extra)
    if params > MAX_PARAMS:
        name, p = max(meta.named_parameters(), key=lambda item: item[1].numel())
        raise ValueError(
            f"{params / 1e6:.0f}M parameters at the tiny sizes (a size not shrunk; the largest: {name} "
            f"{list(p.shape)})"
        )
    torch.manual_seed(0)
    model = cls(config).eval()
    _bark_generation_config(model)
    _seamless_generation(model)
    _untie_zero_matrices(model)
    _unit_batch_norm_scales(model)
    _spread_keypoint_scores(model)
    _spread_speech_token_rows(model)
    _released_generation(model)
    _omni_speaker(model)
    _eager_check(task, model)
    save_reloadable(model, folder)
    _pocket_audio_tokenizer(model, folder)
    higgs_audio_sweep.save_audio_tokenizer(model, folder)  # its audio tokenizer: a checkpoint beside
    if getattr(model, "speaker_map", None):  # Qwen2.5-Omni's from_pretrained reads its spk_dict.pt
        torch.save(model.speaker_map, folder / "spk_dict.pt")
    vocab = getattr(text_config(model.config, encoder=True), "vocab_size", None)
    if "input_ids" in inspect.signature(model.forward).parameters and isinstance(vocab, int):
        _save_tokenizer(folder, vocab)
    return params


def _lost_on_reload(model: Any, folder: pathlib.Path) -> list[str]:
    """The weights transformers' ``from_pretrained`` does not read back from ``folder`` into
    ``type(model)`` (left newly initialized: random, a different draw at each load)."""
    try:
        _, info = type(model).from_pretrained(folder, output_loading_info=True)
    except Exception:  # a class that cannot load itself: the export's verification reports it
        return []
    return sorted(info["missing_keys"])


def save_reloadable(model: Any, folder: pathlib.Path) -> None:
    """``model.save_pretrained(folder)``, in the keys its own ``from_pretrained`` reads back. The default
    save writes the checkpoint's original key names (transformers' conversion mapping reverted), which
    for some classes its loading does not map back: Gemma3ForConditionalGeneration under a ShieldGemma 2
    config (image-text-to-text's class for ``shieldgemma2``) gets the ``shieldgemma2`` mapping meant for
    ShieldGemma2ForImageClassification, whose language model then loads as random weights, a new draw at
    each load, so no export could match what a user's ``from_pretrained`` gives. There the weights are
    saved under the model's own names (``save_original_format=False``), which load back whole."""
    model.save_pretrained(folder)
    lost = _lost_on_reload(model, folder)
    if not lost:
        return
    model.save_pretrained(folder, save_original_format=False)
    if len(_lost_on_reload(model, folder)) >= len(lost):  # weights never saved (none of a naming's doing)
        model.save_pretrained(folder)


# generation settings the released checkpoints' generation_config.json sets and no config default has
_RELEASED_GENERATION: dict[str, dict[str, Any]] = {
    # facebook/musicgen-small's and musicgen-melody's: classifier-free guidance at 3
    **dict.fromkeys(("musicgen", "musicgen_melody"), {"guidance_scale": 3.0}),
}


def _released_generation(model: Any) -> None:
    """The released checkpoints' generation settings (``_RELEASED_GENERATION``) on a composite model's
    generation config, which ``save_pretrained`` writes to ``generation_config.json``."""
    settings = _RELEASED_GENERATION.get(getattr(model.config, "model_type", ""), {})
    generation = getattr(model, "generation_config", None)
    if generation is not None and getattr(model.config, "is_encoder_decoder", False):
        for key, value in settings.items():
            setattr(generation, key, value)


def _spread_keypoint_scores(model: Any) -> None:
    """Redraws SuperPoint's score head (weights of std 2, no bias): at its initialization every pixel
    scores about 1/65, so its non-maximum suppression (``scores == max_pool(scores)``) and threshold pick
    among values float32 rounding orders, which says nothing of the export; a trained head's map peaks."""
    import torch

    head = getattr(model, "keypoint_decoder", None)
    if head is None or not hasattr(head, "conv_score_b"):
        return
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 2 if p.dim() > 1 else torch.zeros_like(p))


def _spread_speech_token_rows(model: Any) -> None:
    """Redraws VibeVoice's head rows for the four tokens its generate picks among (N(0, 1)): a tiny random
    head scores them alike and picks the same one every step, never the audio token that runs the
    diffusion head and the codec, and the package check refuses a generation that runs no stage."""
    import torch

    if type(model).__name__ != "VibeVoiceForConditionalGeneration":
        return
    config = model.config
    rows = [config.audio_bos_token_id, config.audio_eos_token_id, config.audio_token_id, config.eos_token_id]
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for row in rows:
            model.lm_head.weight[row].normal_(generator=g)


def _untie_zero_matrices(model: Any) -> None:
    """Redraws the matrices a model initializes to zeros (routers: AFMoE's, ...): a zero router scores every
    expert alike, and torch and onnxruntime break the tie of their top-k differently, which says nothing of
    the export."""
    import torch

    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2 and p.is_floating_point() and not p.any():
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
        # EnCodec's code vectors (buffers, learned by k-means in training) start at zero, Mimi's sums of
        # them too: every code would decode alike, and a codec's output would not depend on the codes
        for name, b in model.named_buffers():
            vectors = name.endswith(("codebook.embed", "codebook.embed_sum"))
            if vectors and b.is_floating_point() and not b.any():
                b.copy_(torch.randn(b.shape, generator=g))


def _unit_batch_norm_scales(model: Any) -> None:
    """Sets to one the BatchNorm scales a model draws around zero (RT-DETR's, PP-DocLayout's: N(0, 0.01)),
    as torch's default and trained checkpoints have them near one: each such layer shrinks the features a
    hundredfold, and RT-DETR's encoder then scores every anchor alike to float rounding, so torch and
    onnxruntime pick different top-k queries, which says nothing of the export. Drawn around zero: all
    small, or (a tiny config's larger initializer_range, PP-DocLayoutV4's N(0, 0.1)) centred within their
    spread."""
    import torch

    with torch.no_grad():
        for m in model.modules():
            scale = getattr(m, "weight", None)
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and scale is not None:
                centred = scale.numel() > 1 and bool(scale.mean().abs() < scale.std())
                if scale.abs().max() < 0.1 or centred:
                    scale.fill_(1.0)


_DERIVED_DECODER_IDS = frozenset({"text-classification", "question-answering", "fill-mask"})


def _eager_check(task: str, model: Any) -> None:
    """One eager forward on a small input: a tiny checkpoint whose forward fails on it is a sweep gap. A
    forward needing inputs that fastonnx's task graphs do not make (``_unmade_inputs``), or whose inputs
    fastonnx cannot make for this config, is not run: that is fastonnx's gap, which the export reports."""
    import torch

    from fastonnx.pretrained import (
        frame_paired_speech,
        media_text_towers,
        pocket_tts_stages,
        streamed_audio_steps,
    )
    from fastonnx.pretrained.encoder_tasks import encoder_inputs, paired_columns
    from fastonnx.pretrained.graph_spec import takes

    g = torch.Generator().manual_seed(0)
    config = model.config
    try:
        with torch.no_grad():
            if task == "image-text-to-text":  # a prompt holding the image's tokens
                _vision_language_check(model)
            elif frame_paired_speech.own_layout(model):  # Kyutai's: text paired with the audio's frames
                frame_paired_speech.generated(model, frame_paired_speech.waveform(model, 3))
            elif streamed_audio_steps.own_layout(model):  # Voxtral Realtime's: its audio a step at a time
                streamed_audio_steps.generated(model, *streamed_audio_steps.check_inputs(model))
            elif streamed_audio_steps.owns_bare(model, task):  # its base model: a prompt and its audio
                model(**streamed_audio_steps.bare_inputs(model, 1, 3))
            elif paired_columns(model, config):  # its bare model: the paired ids alone
                model(**encoder_inputs(model, config, task, 1, "cpu")[0])
            elif task == "image-classification" and takes(model, "input_ids") and _image_prompted(model):
                _vision_language_check(model, classifier=True)  # ShieldGemma 2's: the image of its prompt
            elif task == "text-to-audio" and hasattr(model, "generate_speech"):
                _speech_loop_check(model)
            elif task == "text-to-audio" and type(model).__name__ == "BarkModel":
                _bark_check(model)
            elif task == "text-to-audio" and type(model).__name__ == "CsmForConditionalGeneration":
                _csm_check(model)
            elif task == "text-to-audio" and pocket_tts_stages.own_layout(model):
                pocket_tts_stages.eager_generate(model)  # its generate: latents from the flow head
            elif task == "text-to-audio" and type(model).__name__ == higgs_audio_sweep.CLASS:
                higgs_audio_sweep.generate_check(model)
            elif task == "text-to-audio" and type(model).__name__ in _SEAMLESS_SPEECH:
                _seamless_check(model)
            elif task == "text-to-audio" and type(model).__name__.startswith("GradiumPhononTTS"):
                _phonon_check(model)
            elif task == "text-to-audio" and type(model).__name__ == "VibeVoiceForConditionalGeneration":
                _vibevoice_check(model)
            elif task == "text-to-audio" and type(model).__name__ == "Qwen2_5OmniForConditionalGeneration":
                from fastonnx.pretrained import omni_speech_stages as omni

                omni.generated(model, *omni.check_inputs(model), next(iter(model.speaker_map)))
            elif task == "text-to-audio" and type(model).__name__ == "Qwen3OmniMoeForConditionalGeneration":
                from fastonnx.pretrained import omni3_speech_stages as omni3

                omni3.generated(
                    model, *omni3.check_inputs(model), next(iter(model.config.talker_config.speaker_id))
                )
            elif media_text_towers.owns(model, task):  # CLAP's, PE's two towers: both inputs
                model(**media_text_towers.tower_inputs(model, config, 1, "cpu")[0])
            elif task not in ("text-generation", "text2text-generation") and (
                not takes(model, "input_ids") or takes(model, "pixel_values") or task == "multiple-choice"
            ):  # a vision-language model's text path (text-generation) reads no image
                if _unmade_inputs(model):
                    return  # inputs no task graph makes: the export says so (an export error)
                try:
                    inputs, _ = encoder_inputs(model, config, task, 1, "cpu")  # the task's own inputs
                except Exception:  # fastonnx cannot make them (Bark's, V-JEPA 2's): the export says so
                    return
                if takes(model, "decoder_input_ids"):  # speech-to-text: the decoder's first token
                    inputs["decoder_input_ids"] = torch.ones(1, 1, dtype=torch.int64)
                if "input_ids" in inputs:
                    inputs.update(_required_side_inputs(model, inputs["input_ids"]))
                if not _unmade_inputs(model, inputs):
                    model(**inputs)
            else:
                text = text_config(config)
                codebooks = getattr(text, "num_codebooks", 1)  # Musicgen's decoder: a row a codebook
                if isinstance(delays := getattr(config, "delay_pattern", None), list):
                    codebooks = len(delays)  # Dia's decoder: a channel a delay
                rows = codebooks if _is_int(codebooks) and codebooks > 0 else 1
                vocab = getattr(text, "vocab_size", None)  # none for CANINE's characters: code points
                ids = torch.randint(3, int(vocab) if _is_int(vocab) else VOCAB, (rows, 8), generator=g)
                ids[:, -1] = 2  # ends with eos: BART-family classifiers pool there
                # the encoder tasks' graphs feed no decoder ids: a seq2seq classifier / QA / masked LM
                # shifts input_ids into its decoder (BART's classifier pools the decoder at input_ids' eos)
                feeds = takes(model, "decoder_input_ids") and task not in _DERIVED_DECODER_IDS
                extra = {"decoder_input_ids": ids[:, :2]} if feeds else {}
                if feeds and rows > 1:
                    # MusicGen's text-to-audio: one row of text, its decoder a row a codebook (batch *
                    # num_codebooks rows of codes, below the decoder's vocabulary: its codebook)
                    extra["decoder_input_ids"] = ids[:, :2]
                    text_vocab = getattr(text_config(config, encoder=True), "vocab_size", VOCAB)
                    ids = torch.randint(3, int(text_vocab), (1, 8), generator=g)
                    if isinstance(delays, list):  # Dia's: batch x steps x channels, as its generate makes
                        extra["decoder_input_ids"] = extra["decoder_input_ids"].T[None].contiguous()
                extra.update(_required_side_inputs(model, ids))
                if not _unmade_inputs(model, {"input_ids": ids, "attention_mask": ids, **extra}):
                    model(input_ids=ids, attention_mask=torch.ones_like(ids), **extra)
    except Exception as e:
        raise RuntimeError(f"eager forward fails: {type(e).__name__}: {_first_line(str(e))}") from e


# the inputs fastonnx's task graphs make (encoder_tasks.encoder_inputs) and the side inputs the eager check
# adds (_required_side_inputs)
_MADE_INPUTS = frozenset(
    {
        "input_ids",
        "attention_mask",
        "token_type_ids",
        "pixel_values",
        "pixel_values_videos",
        "input_values",
        "input_features",
        "past_values",
        "decoder_input_ids",
        "bbox",
        "global_attention_mask",
        "visual_feats",
        "visual_pos",
        "pixel_attention_mask",  # SigLIP 2's padded patches (naflex_images.py)
        "spatial_shapes",
        "states",  # a Decision Transformer's trajectories (encoder_tasks.trajectory_inputs)
        "actions",
        "returns_to_go",
        "timesteps",
    }
)


def _required_inputs(model: Any) -> set[str]:
    """The arguments ``model.forward`` cannot be called without (no default)."""
    return _required_args(model.forward)


def _required_args(method: Any) -> set[str]:
    """The arguments ``method`` cannot be called without (no default)."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    params = inspect.signature(method).parameters.values()
    return {p.name for p in params if p.kind in kinds and p.default is inspect.Parameter.empty}


def _unmade_inputs(model: Any, inputs: dict[str, Any] | None = None) -> set[str]:
    """The required arguments of the forward that no task graph of fastonnx makes (Qwen-VL's towers' packed
    patches and grid_thw, SegGPT's prompts, TimesFM's frequency): without ``inputs``, those outside every
    task's inputs; with them, those the task's inputs lack. Such a forward is not run by the eager check: a
    TypeError on its missing arguments says nothing of whether transformers runs the tiny model, and the
    export then refuses it with its reason (an export error, not "not buildable")."""
    required = _required_inputs(model)
    return required - set(inputs) if inputs is not None else required - _MADE_INPUTS


def text_config(config: Any, encoder: bool = False) -> Any:
    """``config.get_text_config()``; where a config holds several text configs (MusicGen's text_encoder and
    decoder), its decoder's, or with ``encoder`` its text encoder's (the tokenizer's vocabulary)."""
    try:
        return config.get_text_config()
    except ValueError:
        return config.get_text_config(encoder=True) if encoder else config.get_text_config(decoder=True)


def _speech_loop_check(model: Any) -> None:
    """SpeechT5's text-to-speech: its forward needs the spectrogram so far (``decoder_input_values``),
    which only its own loop makes: ``generate_speech`` on a short text and a speaker embedding."""
    import torch

    config = model.config
    ids = torch.randint(3, int(config.vocab_size), (1, 8), generator=torch.Generator().manual_seed(0))
    speaker = torch.zeros(1, int(config.speaker_embedding_dim))
    model.generate_speech(ids, speaker, maxlenratio=2.0)


def _bark_generation_config(model: Any) -> None:
    """Bark's nested generation config (BarkGenerationConfig's defaults: its vocabulary offsets, windows
    and lengths), which its ``generate`` reads and a model built from a config lacks. Set as
    ``from_pretrained`` loads suno/bark's generation_config.json: a GenerationConfig holding the stages'
    settings as dicts."""
    if type(model).__name__ != "BarkModel":
        return
    from transformers import GenerationConfig
    from transformers.models.bark.generation_configuration_bark import BarkGenerationConfig

    model.generation_config = GenerationConfig.from_dict(BarkGenerationConfig().to_dict())


def _pocket_audio_tokenizer(model: Any, folder: pathlib.Path) -> None:
    """Pocket TTS's waveform decoder is its processor's audio tokenizer, a checkpoint of its own which
    processor_config.json names: a tiny one saved beside the weights, named so."""
    import torch
    import transformers

    if type(model).__name__ != "PocketTTSForConditionalGeneration":
        return
    torch.manual_seed(0)
    config = tiny_config("pocket_tts_audio_tokenizer", {"latent_dim": int(model.config.latent_dim)})
    transformers.PocketTTSAudioTokenizerModel(config).eval().save_pretrained(folder / "audio_tokenizer")
    named = {
        "audio_tokenizer_class": "PocketTTSAudioTokenizerModel",
        "audio_tokenizer_name_or_path": "audio_tokenizer",
    }
    (folder / "processor_config.json").write_text(json.dumps({"audio_tokenizer": named}))


def _omni_speaker(model: Any) -> None:
    """Qwen2.5-Omni's generate reads a speaker (its checkpoints' spk_dict.pt: the thinker's text token it
    starts the talker with, its DiT's speaker vector and reference mel spectrogram), which a model built
    from a config lacks: one drawn at random."""
    import torch

    if type(model).__name__ != "Qwen2_5OmniForConditionalGeneration" or not model.has_talker:
        return
    dit, g = model.config.token2wav_config.dit_config, torch.Generator().manual_seed(0)
    cond, mel = torch.randn(1, dit.enc_emb_dim, generator=g), torch.randn(1, 30, dit.mel_dim, generator=g)
    model.speaker_map["Chelsie"] = {"bos_token": VOCAB - 24, "cond": cond, "ref_mel": mel}


def _bark_check(model: Any) -> None:
    """Bark has no forward: ``generate`` greedy on a short text (the processor pads it to the semantic
    model's 256 input tokens), a few semantic tokens (which bound the coarse and fine stages' lengths)."""
    import torch

    ids = torch.zeros(1, 256, dtype=torch.int64)
    mask = torch.zeros(1, 256, dtype=torch.int64)
    ids[0, :8] = torch.randint(0, 100, (8,), generator=torch.Generator().manual_seed(0))
    mask[0, :8] = 1
    model.generate(ids, attention_mask=mask, do_sample=False, semantic_max_new_tokens=4, fine_temperature=1.0)


def _csm_check(model: Any) -> None:
    """CSM's text-to-audio is its ``generate``: greedy frames (the backbone's codebook 0, the depth
    decoder's others) from a short text, decoded by Mimi."""
    import torch

    vocab = min(100, int(model.config.text_vocab_size))
    ids = torch.randint(3, vocab, (1, 8), generator=torch.Generator().manual_seed(0))
    model.generate(ids, do_sample=False, depth_decoder_do_sample=False, max_new_tokens=2, output_audio=True)


_SEAMLESS_SPEECH = frozenset({"SeamlessM4TForTextToSpeech", "SeamlessM4Tv2ForTextToSpeech"})
_SUBWORDS = ["▁he", "llo", ",", "▁wor", "ld", ".", "▁a", "b", "?", "▁c"]


def _seamless_generation(model: Any) -> None:
    """SeamlessM4T's generate reads its generation_config.json's maps (the target language's text, unit
    and vocoder ids; v2's subword of every text id and id of every character), which a model built from a
    config lacks: two languages at the tiny vocabularies' ends, subwords and characters of a few letters.
    Its unit decoder's head rows of the control ids below the vocoder's offset (but its pad) zeroed: a
    random one predicts them, which transformers would offset to a negative vocoder unit."""
    if type(model).__name__ not in _SEAMLESS_SPEECH:
        return
    import torch
    from transformers import GenerationConfig

    config = model.config
    generation = GenerationConfig.from_dict(model.generation_config.to_dict())
    generation._from_model_config = False  # saved as it is: from_pretrained would remake a derived one
    generation.text_decoder_lang_to_code_id = {"eng": config.vocab_size - 2, "fra": config.vocab_size - 1}
    generation.t2u_lang_code_to_id = {"eng": config.t2u_vocab_size - 2, "fra": config.t2u_vocab_size - 1}
    generation.vocoder_lang_code_to_id = {"eng": 0, "fra": 1}
    if config.model_type == "seamless_m4t_v2":
        generation.id_to_text = {str(i): _SUBWORDS[i % len(_SUBWORDS)] for i in range(config.vocab_size)}
        generation.char_to_id = {c: 4 + i for i, c in enumerate(sorted(set("".join(_SUBWORDS))))}
    model.generation_config = generation
    with torch.no_grad():
        for i in range(int(config.vocoder_offset)):
            if i != config.t2u_pad_token_id:
                model.t2u_model.lm_head.weight[i] = 0.0


def _seamless_check(model: Any) -> None:
    """SeamlessM4T's text-to-speech: ``generate`` (text, then units, then the vocoder) greedy on a short
    text, a few tokens of each."""
    import torch

    ids = torch.randint(4, 100, (1, 8), generator=torch.Generator().manual_seed(0))
    lengths = {} if model.config.model_type == "seamless_m4t_v2" else {"speech_max_new_tokens": 8}
    model.generate(ids, tgt_lang="eng", do_sample=False, text_max_new_tokens=6, **lengths)


def _phonon_check(model: Any) -> None:
    """Gradium Phonon generates latents in a loop: ``generate`` greedy on a short left-padded prompt ending
    with its audio BOS (PocketTTSProcessor's), a few frames."""
    from fastonnx.pretrained.phonon_latent_loops import check_inputs

    ids, mask = check_inputs(model, 2, 6)
    model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=4, frames_after_eos=1)


def _vibevoice_check(model: Any) -> None:
    """VibeVoice generates with a noise scheduler (diffusers' by default, not installed): ``generate``
    greedy on a short prompt with the package check's scheduler and inputs."""
    from fastonnx.pretrained import vibevoice_stages

    vibevoice_stages.generate(model, *vibevoice_stages.check_inputs(model))


def _required_side_inputs(model: Any, ids: Any) -> dict[str, Any]:
    """Inputs beside the text that the model's forward refuses to run without and no task graph of
    fastonnx feeds (BROS's boxes, LXMERT's region features, Longformer's global attention where its QA head
    cannot find its separators): zeros and ones, so that the check says whether transformers runs the tiny
    model; the export then says what it cannot feed."""
    import torch

    from fastonnx.pretrained.graph_spec import takes

    out: dict[str, Any] = {}
    config = model.config
    if takes(model, "bbox") and type(model).__name__.startswith("Bros"):
        out["bbox"] = torch.zeros(*ids.shape, 4)  # BROS's boxes are 4 floats (layoutlm's are ints)
    if takes(model, "global_attention_mask"):
        out["global_attention_mask"] = torch.zeros_like(ids)
        out["global_attention_mask"][..., 0] = 1
    if takes(model, "visual_feats") and _is_int(dim := getattr(config, "visual_feat_dim", None)):
        out["visual_feats"] = torch.zeros(ids.shape[0], 2, dim)
        out["visual_pos"] = torch.zeros(ids.shape[0], 2, int(getattr(config, "visual_pos_dim", 4)))
    return out


def _tokens_in_vocabulary(defaults: dict[str, Any]) -> dict[str, Any]:
    """The special token ids past the tiny vocabulary (LLaVA's image token 32000), each given one of its
    last ids (pad, bos and eos are 0, 1, 2)."""
    keys = [
        k
        for k, v in defaults.items()
        if k.endswith(("_token_id", "_token_index")) and _is_int(v) and v >= VOCAB
    ]
    return {k: VOCAB - 1 - i for i, k in enumerate(keys)}


def _vision_language_check(model: Any, classifier: bool = False) -> None:
    """The forward on one image and a prompt holding its tokens; skipped where fastonnx cannot make the
    image's inputs or tell its token (grids, tiles, no image_token_id): the export then says so, as an
    export error, not a model that cannot be built. ``classifier``: a classifier over a vision-language
    model (``_image_prompted``), whose base model makes the image's rows."""
    import torch

    from fastonnx.errors import InputError
    from fastonnx.pretrained import vision_language as vl
    from fastonnx.pretrained.graph_spec import takes

    if not hasattr(model, "get_image_features") and not classifier:
        _plain_image_forward(model)
        return
    try:
        images = (
            _anyres_images(model) or _packed_slices(model) or vl.vision_inputs(model, model.config, 1, "cpu")
        )
        vl.image_token_id(model.config)
        owners = (model, getattr(model, "model", None))
        wanted = set().union(
            *(_required_args(o.get_image_features) for o in owners if hasattr(o, "get_image_features"))
        )
        if wanted - set(images):
            return  # the tower's own inputs (Dots 3 Note's image_grid_thw) fastonnx does not make for it
        rows = vl.image_features(model, **images).shape[0]  # Llama 4's are the tower's, not projected
    except InputError:
        return
    ids = vl.image_prompt(model.config, torch.full((1, 2), 3), rows, torch.full((1, 2), 4))
    if packed := _packed_slices(model):  # MiniCPM-V's crops between their markers
        from fastonnx.pretrained import minicpm_vlms

        plan = minicpm_vlms.prompt_plan(model, torch.full((1, 4), 3), packed)
        model(
            input_ids=plan["ids"], attention_mask=torch.ones_like(plan["ids"]), **images, **plan["generate"]
        )
        return
    _, _, placed = vl.prompt_positions(model, ids, images)  # Qwen-VL's image positions need the token types
    # an encoder-decoder's decoder (T5Gemma 2's) reads its own first token
    start = {"decoder_input_ids": ids[:, :1]} if takes(model, "decoder_input_ids") else {}
    model(input_ids=ids, attention_mask=torch.ones_like(ids), **images, **placed, **start)


def _image_prompted(model: Any) -> bool:
    """A classifier over a vision-language model (ShieldGemma 2's over Gemma 3): its base model makes the
    image's rows, which its prompt's image tokens take."""
    inner = getattr(model, "model", None)
    return not hasattr(model, "get_image_features") and hasattr(inner, "get_image_features")


def _anyres_images(model: Any) -> dict[str, Any] | None:
    """One image of the tower's size as LLaVA-NeXT's processor cuts it (anyres: ``image_grid_pinpoints``): its
    base view and the tiles of the best pinpoint, batch x tiles x channels x height x width; None for a
    model of plain images. fastonnx's own inputs are plain images, which these models do not take."""
    import torch
    from transformers.models.llava_next.modeling_llava_next import image_size_to_num_patches

    config = model.config
    pinpoints, vision = getattr(config, "image_grid_pinpoints", None), getattr(config, "vision_config", None)
    side = getattr(vision, "image_size", None)
    if not pinpoints or not _is_int(side):
        return None
    tiles = image_size_to_num_patches((side, side), pinpoints, side)
    g = torch.Generator().manual_seed(0)
    pixels = torch.randn(1, tiles, getattr(vision, "num_channels", 3), side, side, generator=g)
    return {"pixel_values": pixels, "image_sizes": torch.tensor([[side, side]])}


def _packed_slices(model: Any) -> dict[str, Any] | None:
    """One image as MiniCPM-V's processor packs its source and slices (``target_sizes``); None for others."""
    from fastonnx.pretrained import minicpm_vlms

    return minicpm_vlms.image_example(model.config, "cpu") if minicpm_vlms.own_layout(model) else None


def _patch_rows(model: Any) -> dict[str, Any] | None:
    """One image as Fuyu's processor gives it: its patches as rows of patch_size² x channels pixels
    (batch x patches x pixels), which its linear patch embedding reads; None for other models."""
    import torch

    config, embed = model.config, getattr(getattr(model, "model", model), "vision_embed_tokens", None)
    side, patch = getattr(config, "image_size", None), getattr(config, "patch_size", None)
    if not isinstance(embed, torch.nn.Linear) or not (_is_int(side) and _is_int(patch)):
        return None
    g = torch.Generator().manual_seed(0)
    return {"pixel_values": torch.randn(1, (side // patch) ** 2, embed.in_features, generator=g)}


def _plain_image_forward(model: Any) -> None:
    """A model with no ``get_image_features`` (BLIP, GIT, Idefics, Kosmos-2, Mllama, a vision encoder-decoder):
    its own forward on one image of its vision encoder's size and a short text, where it takes
    ``pixel_values``. The export then refuses it with its reason (an export error, not "not buildable").
    A forward asking for inputs a plain image and text do not make (Mllama's aspect ratios, a prompt's
    image tokens, PI0's state: a TypeError or the model's ValueError on its inputs) is not run: that says
    nothing of whether transformers runs the tiny model."""
    import torch

    from fastonnx.pretrained.encoder_tasks import image_inputs
    from fastonnx.pretrained.graph_spec import takes

    if not takes(model, "pixel_values"):
        return  # its images come as other inputs (Fuyu's patches, Pix2Struct's flattened patches)
    inner = getattr(model, "model", None)
    if hasattr(inner, "get_image_features") and _required_args(inner.get_image_features) - {"pixel_values"}:
        return  # its tower's own inputs (Dots 3 Note's image_grid_thw), which a plain image does not make
    config = model.config
    encoder = getattr(config, "encoder", None)  # a vision encoder-decoder's image size is its encoder's
    vision = encoder if hasattr(encoder, "image_size") else config
    vocab = getattr(text_config(config), "vocab_size", None)
    g = torch.Generator().manual_seed(0)
    latent = getattr(config, "latent_query_num", 0)  # Kosmos-2: the image's features, as many tokens
    image = int(latent) if _is_int(latent) else 0
    ids = torch.randint(3, int(vocab) if _is_int(vocab) else VOCAB, (1, 4 + image), generator=g)
    where = torch.zeros_like(ids)
    where[:, 2 : 2 + image] = 1  # the tokens Kosmos-2 puts the image's features at
    inputs = _patch_rows(model) or {"pixel_values": image_inputs(vision, 1, "cpu")["pixel_values"]}
    for name, value in (
        ("input_ids", ids),
        ("attention_mask", torch.ones_like(ids)),
        ("decoder_input_ids", ids[:, :2]),
        ("image_embeds_position_mask", where),
    ):
        if takes(model, name):
            inputs[name] = value
    try:
        model(**inputs)
    except (TypeError, ValueError):
        return


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    line = lines[0] if lines else "(no message)"
    return line[:240]


def _max_diff(report: pathlib.Path) -> str:
    """The largest max abs diff of the failed rows of a package report's verification table."""
    worst: tuple[float, str] | None = None
    if report.is_file():
        for row in report.read_text(encoding="utf-8").splitlines():
            if "**FAIL**" in row:
                cells = [c.strip() for c in row.strip("|").split("|")]
                try:
                    diff = float(cells[3])
                except (IndexError, ValueError):
                    continue
                if worst is None or diff > worst[0]:
                    worst = (diff, cells[0].strip("`"))
    return f"max abs diff {worst[0]:.3g} ({worst[1]})" if worst else "max diff not found in the report"


def sweep_one(
    task: str, model_type: str, class_name: str, workdir: str | None = None, build_only: bool = False
) -> dict[str, Any]:
    """One architecture through ``fastonnx export`` with verification; returns {"status", "detail",
    "seconds"}: status pass, verify-failed (the max diff), export error (the exception's first line) or
    a build failure (``build_failure``: a sweep gap or not buildable, why); with ``build_only``, buildable
    (its parameter count) or that build failure, without
    the export. Writes into a temporary folder, deleted before returning."""
    from fastonnx.pretrained.cli import main

    t0 = time.perf_counter()
    root = pathlib.Path(tempfile.mkdtemp(prefix=f"archsweep-{model_type}-", dir=workdir))
    try:
        checkpoint, package = root / "checkpoint", root / "package"
        try:
            params = build_checkpoint(task, model_type, class_name, checkpoint)
        except Exception as e:
            detail = f"{type(e).__name__}: {_first_line(str(e))}"
            return {"status": build_failure(detail), "detail": detail, "seconds": time.perf_counter() - t0}
        if build_only:
            return {
                "status": "buildable",
                "detail": f"{params} parameters",
                "seconds": time.perf_counter() - t0,
            }
        out, err = io.StringIO(), io.StringIO()
        argv = ["export", str(checkpoint), str(package), "--task", task, "--no-progress"]
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = main(argv)
        except Exception as e:  # not one of fastonnx's errors: the exception itself
            code, message = -1, f"{type(e).__name__}: {_first_line(str(e))}"
        else:  # the command's own line (stderr also holds log lines)
            said = [ln for ln in err.getvalue().splitlines() if ln.startswith("fastonnx export: ")]
            message = _first_line(said[0].removeprefix("fastonnx export: ") if said else err.getvalue())
        if code == 0:
            verified = "verification: verified" in out.getvalue()
            status, detail = ("pass", "") if verified else ("export error", "not verified: " + out.getvalue())
        elif code == 1 and "verification failed" in err.getvalue():
            status, detail = "verify-failed", _max_diff(package / "fastonnx_report.md")
        else:
            status, detail = "export error", message
        return {"status": status, "detail": detail, "seconds": time.perf_counter() - t0}
    finally:
        shutil.rmtree(root, ignore_errors=True)


# ---------------------------------------------------------------- workers


def _worker(conn: Any, workdir: str, build_only: bool) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import fastonnx.pretrained.cli  # noqa: F401  (imports paid once)

    while True:
        job = conn.recv()
        if job is None:
            return
        try:
            result = sweep_one(*job, workdir=workdir, build_only=build_only)
        except BaseException as e:  # the worker survives whatever one architecture does
            tb = traceback.format_exc(limit=-1).strip().splitlines()
            status = "not buildable" if build_only else "export error"
            result = {"status": status, "detail": f"{type(e).__name__}: {e} {tb[-1:]}", "seconds": 0}
        conn.send(result)


class Worker:
    def __init__(self, workdir: str, build_only: bool = False) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.build_only = build_only
        self.proc = ctx.Process(target=_worker, args=(child, workdir, build_only), daemon=True)
        self.proc.start()

    def run(self, job: tuple[str, str, str], timeout: float) -> dict[str, Any]:
        t0 = time.perf_counter()
        self.conn.send(job)
        try:
            if self.conn.poll(timeout):
                result: dict[str, Any] = self.conn.recv()
                return result
            status = f"timeout after {timeout:.0f} s"
        except (EOFError, OSError):
            status = f"the worker crashed (exit code {self.proc.exitcode})"
        self.stop()
        failed = "not buildable" if self.build_only else "export error"
        return {"status": failed, "detail": status, "seconds": time.perf_counter() - t0, "dead": True}

    def stop(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join()


# ---------------------------------------------------------------- the section


def architectures(task: str) -> list[tuple[str, str]]:
    """(model type, class name) of the task's mapping, in its order (the first class of a tuple)."""
    return [(t, cs[0]) for t, cs in _tasks.task_mapping(_tasks.TASKS[task]).items() if cs]


def _group(detail: str) -> str:
    """A failure's reason without its particulars (names, numbers), to count alike reasons."""
    text = re.sub(r"torch\.export\.export failed on \w+: ", "torch.export: ", detail)
    text = re.sub(
        r"\b[A-Z]\w*(ForCausalLM|ForMaskedLM|ForSequenceClassification|ForImageClassification)\w*", "X", text
    )
    text = re.sub(r"\d+(\.\d+)?(e-?\d+)?", "N", text)
    return text[:110]


def load_store(path: str = STORE) -> dict[str, Any]:
    """Every task's last run: {task: {"commit", "transformers", "torch", "command", "planned", "results"}}."""
    try:
        with open(path, encoding="utf-8") as f:
            store: dict[str, Any] = json.load(f)
    except FileNotFoundError:
        return {}
    return store


def save_store(store: dict[str, Any], path: str = STORE) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(dict(sorted(store.items(), key=lambda kv: list(TASKS).index(kv[0]))), f, indent=1)
        f.write("\n")


def run_entry(results: list[dict[str, Any]], planned: int, argv: str) -> dict[str, Any]:
    """A task's run as the store keeps it, stamped with what ran it."""
    import torch
    import transformers

    return {
        "commit": _commit(),
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "command": f"python scripts/architecture_sweep.py {argv}".strip(),
        "planned": planned,
        "results": results,
    }


UNINSTALLABLE = ("detectron2", "natten")
"""Libraries a model's module requires that the package index has no build of for the pinned torch: a
model needing one cannot run here at any size."""


def build_failure(detail: str) -> str:
    """The status of an architecture whose tiny checkpoint the sweep could not build or run eagerly.
    "not buildable" only where no input and no size would do: transformers' mapping names a class it
    lacks, or the model needs a library nothing here can install. Anything else (transformers' forward
    failing on the sweep's inputs, a tiny config that is still too large, a config the tiny sizes make
    inconsistent) is the sweep's gap: fastonnx's, counted against the task (issue 42)."""
    if detail.startswith("LookupError: transformers has no class"):
        return "not buildable"
    if any(f"requires the {lib} library" in detail for lib in UNINSTALLABLE):
        return "not buildable"
    return SWEEP_GAP


SWEEP_GAP = "sweep gap"


def status_of(row: dict[str, Any]) -> str:
    """A stored row's status under today's rule: runs stored before the sweep-gap status called every
    build failure "not buildable"."""
    status: str = row["status"]
    return build_failure(row["detail"]) if status == "not buildable" else status


def _counts(entry: dict[str, Any]) -> tuple[int, int, Counter[str]]:
    rs = entry["results"]
    c = Counter(status_of(r) for r in rs)
    return len(rs), len(rs) - c["not buildable"], c


def _row(task: str, entry: dict[str, Any]) -> str:
    swept, buildable, c = _counts(entry)
    mappings = ", ".join(m.removesuffix("_MAPPING_NAMES") for m in TASKS[task])
    share = f" ({100 * c['pass'] / buildable:.1f}%)" if buildable else ""  # 89.6 is not 90
    return (
        f"| {task} | {mappings} | {entry['planned']} | {swept} | **{c['pass']} of {buildable}**{share} | "
        f"{c['verify-failed']} | {c['export error']} | {c[SWEEP_GAP]} | {c['not buildable']} | "
        f"`{entry['commit']}` |"
    )


def render(store: dict[str, Any], before: dict[str, Any] | None = None) -> str:
    """The section from the store: a row a task (each from its own last run, its commit named), the run
    before of the tasks this run swept again, the failures and the passing model types."""
    lines = [
        "## transformers architectures",
        "",
        "Generated by `python scripts/architecture_sweep.py` from its store, docs/data/architecture_sweep.json "
        "(each task's last run); do not edit by hand. Every architecture of each task's transformers "
        "auto-mappings, built from its config at tiny sizes (2 layers, hidden 64, 4 heads, vocabulary 128, "
        "32-pixel images) with random weights, saved with `save_pretrained` (and a tiny tokenizer) and exported "
        "by `fastonnx export FOLDER OUT --task T` with verification on (the package run in onnxruntime against "
        "transformers eager, atol 1e-4, rtol 1e-3). Statuses: **pass**, **verify-failed** (the largest "
        "difference), **export error** (the exception's first line: torch.export's message where the "
        "capture failed), **sweep gap** (the sweep could not build the tiny checkpoint or run its eager "
        "forward on the inputs it makes: fastonnx's gap, counted against the task), **not buildable** "
        "(transformers' mapping names a class it lacks, or the model needs a library the package index "
        f"has no build of here: {', '.join(UNINSTALLABLE)}; the only rows left out of a task's count). "
        "Runs stored before the sweep-gap status are shown under this rule.",
        "",
        "| task | mappings | architectures | swept | pass of buildable | verify-failed | export error | "
        "sweep gap | not buildable | commit |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [_row(t, store[t]) for t in TASKS if t in store]
    not_run = [t for t in TASKS if t not in store]
    totals = [_counts(store[t]) for t in store]
    lines += [
        "",
        f"All tasks: **{sum(c['pass'] for _, _, c in totals)} of {sum(b for _, b, _ in totals)}** buildable "
        "(task, architecture) pairs pass.",
        "",
    ]
    runs = Counter((e["commit"], e["transformers"], e["torch"], e["command"]) for e in store.values())
    for (commit, tf, th, command), _ in runs.most_common():
        tasks = [
            t
            for t, e in store.items()
            if (e["commit"], e["transformers"], e["torch"], e["command"]) == (commit, tf, th, command)
        ]
        lines.append(f"- {', '.join(tasks)}: commit `{commit}`, transformers {tf}, torch {th}; `{command}`.")
    lines.append("")
    if before:
        lines += ["The run before, of the tasks swept again:", ""]
        lines += [
            "| task | mappings | architectures | swept | pass of buildable | verify-failed | export error | "
            "sweep gap | not buildable | commit |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        lines += [_row(t, before[t]) for t in TASKS if t in before]
        lines.append("")
    partial = [t for t, e in store.items() if len(e["results"]) < e["planned"]]
    if partial or not_run:
        lines.append(
            "**Partial.** "
            + (f"Swept in part (stopped before the end): {', '.join(partial)}. " if partial else "")
            + (f"Never swept: {', '.join(not_run)}. " if not_run else "")
            + "A task's full run: `python scripts/architecture_sweep.py --tasks T --workers 2`."
        )
        lines.append("")
    failures = [(t, r) for t in TASKS if t in store for r in store[t]["results"] if r["status"] != "pass"]
    if failures:
        groups = Counter(f"{status_of(r)}: {_group(r['detail'])}" for _, r in failures)
        lines += ["Most common reasons (numbers and names folded):", "", "| count | reason |", "|---|---|"]
        lines += [f"| {n} | {_cell(g)} |" for g, n in groups.most_common(12)]
        lines += ["", "| task | model type | class | status | reason |", "|---|---|---|---|---|"]
        lines += [
            f"| {t} | {r['model_type']} | {r['class_name']} | {status_of(r)} | {_cell(r['detail'])} |"
            for t, r in failures
        ]
        lines.append("")
    verified = {
        t: [r["model_type"] for r in store[t]["results"] if r["status"] == "pass"]
        for t in TASKS
        if t in store
    }
    lines += _optimum().render(verified, list(verified))
    for t, names in verified.items():
        if names:
            lines += [f"Passing ({t}): {', '.join(names)}.", ""]
    return "\n".join(lines)


def _optimum() -> Any:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import optimum_comparison

    return optimum_comparison


def _commit() -> str:
    """HEAD, with "+changes" when what the sweep runs (python/, this script) differs from it: others'
    edits elsewhere (and this section itself) are not its inputs."""
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=ROOT).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    changed = git(
        "status", "--porcelain", "--untracked-files=no", "--", "python", "scripts/architecture_sweep.py"
    )
    return head + ("+changes" if changed else "")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")[:240]


def _ledger() -> Any:
    sys.path.insert(0, os.path.join(ROOT, "benches"))
    import ledger

    return ledger


def write_section(body: str) -> None:
    _ledger().write_section(SECTION, body, path=COVERAGE, header="# Converter coverage\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", default=",".join(TASKS), help="comma-separated tasks (default: every one)")
    p.add_argument("--only", default=None, help="comma-separated model types; prints, no write")
    p.add_argument("--limit", type=int, default=None, help="the first N of each task; prints, no write")
    p.add_argument("--workers", type=int, default=1, help="worker processes (default 1)")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds an architecture (default 180)")
    p.add_argument(
        "--only-build",
        action="store_true",
        help="only build each tiny checkpoint (no export): counts buildable ones and lists why the others are "
        "not; prints, no write",
    )
    p.add_argument(
        "--render",
        action="store_true",
        help="rewrite the section from the store under today's rules, sweeping nothing",
    )
    a = p.parse_args()
    if a.render:
        write_section(render(load_store()))
        print(f"wrote the {SECTION} section of {COVERAGE} from {STORE}")
        return
    tasks = [t.strip() for t in a.tasks.split(",") if t.strip()]
    for t in tasks:
        if t not in TASKS:
            p.error(f"unknown task {t!r}: one of {', '.join(TASKS)}")
    only = {s.strip() for s in a.only.split(",")} if a.only else None
    write = only is None and a.limit is None and not a.only_build
    jobs: list[tuple[str, str, str]] = []
    planned: dict[str, int] = {}
    for task in tasks:
        archs = architectures(task)
        planned[task] = len(archs)
        archs = [x for x in archs if only is None or x[0] in only][: a.limit]
        jobs += [(task, t, c) for t, c in archs]
    for task in TASKS:
        planned.setdefault(task, len(architectures(task)))
    argv = " ".join(sys.argv[1:])
    store = load_store()
    before = {t: store[t] for t in tasks if t in store}  # the tasks' runs this one replaces
    results: dict[str, list[dict[str, Any]]] = {}

    def record() -> None:
        for task in tasks:
            if results.get(task):
                store[task] = run_entry(results[task], planned[task], argv)
        save_store(store)
        write_section(render(store, before))

    workdir = tempfile.mkdtemp(prefix="archsweep-")
    workers: list[Worker | None] = [None] * max(1, a.workers)
    pending = list(jobs)
    try:
        import concurrent.futures as cf

        def run(slot: int, job: tuple[str, str, str]) -> dict[str, Any]:
            w = workers[slot]
            if w is None:
                w = workers[slot] = Worker(workdir, a.only_build)
            r = w.run(job, a.timeout)
            if r.pop("dead", False):
                workers[slot] = None
            return r

        free = list(range(len(workers)))
        with cf.ThreadPoolExecutor(len(workers)) as pool:
            running: dict[cf.Future[dict[str, Any]], tuple[int, tuple[str, str, str]]] = {}
            while pending or running:
                while pending and free:
                    slot, job = free.pop(), pending.pop(0)
                    running[pool.submit(run, slot, job)] = (slot, job)
                done, _ = cf.wait(running, return_when=cf.FIRST_COMPLETED)
                for fut in done:
                    slot, (task, model_type, class_name) = running.pop(fut)
                    free.append(slot)
                    r = {"model_type": model_type, "class_name": class_name, **fut.result()}
                    results.setdefault(task, []).append(r)
                    print(
                        f"[{task}] {model_type} ({class_name}): {r['status']} {r['seconds']:.0f}s {r['detail']}",
                        flush=True,
                    )
                    if write:
                        record()
    finally:
        for w in workers:
            if w is not None:
                with contextlib.suppress(Exception):
                    w.conn.send(None)
                w.proc.join(5)
                w.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    for task in tasks:
        rs = results.get(task, [])
        c = Counter(r["status"] for r in rs)
        if a.only_build:
            print(f"{task}: {c['buildable']} of {len(rs)} buildable ({planned[task]} in the mapping)")
            for r in rs:
                if r["status"] != "buildable":
                    print(f"  {r['status']}: {r['model_type']} ({r['class_name']}): {r['detail']}")
            continue
        print(f"{task}: {c['pass']} pass of {len(rs)} swept ({planned[task]} in the mapping); {dict(c)}")
    if write:
        record()
        print(f"wrote the {SECTION} section of {COVERAGE} and {STORE}")


if __name__ == "__main__":
    main()
