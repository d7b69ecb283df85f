"""Hybrid and state-space caches as text-generation packages (issue 41, part 3): models whose cache holds
convolution and recurrent states next to (or instead of) keys and values, and the indexer keys of sparse
attention. The states are named inputs and outputs (``past_key_values.%d.conv_state`` /
``.recurrent_state``, ``present.%d...``), the package passes its verification (a prefill and a decode step
against transformers), and onnxruntime-genai runs the families it has a cache for with transformers'
greedy tokens and logits within 1e-4: its decoder finds the states by their names, LFM2's convolution
states need its ``lfm2`` type.

One tiny config per family, two layers: a state layer and an attention layer where the family mixes them.
CI runs a sample of the families (``CI``); ``FASTONNX_FULL_MATRIX=1`` runs every one.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest
from checkpoint_folders import DECODER, TOKENS, VOCAB, save_checkpoint
from test_sweep_decoders import _export
from test_text_generation import _check_greedy

import fastonnx
from support.matrix import sampled

pytest.importorskip("onnxruntime_genai")

BASE = {k: DECODER[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads")}
BASE.update(
    vocab_size=VOCAB, num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.1, **TOKENS
)
LINEAR_ATTENTION = {
    "layer_types": ["linear_attention", "full_attention"],
    "intermediate_size": 128,
    "head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
}
# model type, class, config, the fields of each layer's cache; initializer_range where greedy generation
# repeats a few tokens at 0.1
FAMILIES: dict[str, tuple[str, str, dict[str, Any], list[tuple[str, ...]]]] = {
    # genai's builder packages these three
    "lfm2": (
        "lfm2",
        "Lfm2ForCausalLM",
        {
            "layer_types": ["conv", "full_attention"],
            "intermediate_size": 128,
            "block_ff_dim": 128,
            "conv_L_cache": 3,
        },
        [("conv_state",), ("key", "value")],
    ),
    "qwen3_5": (
        "qwen3_5_text",
        "Qwen3_5ForCausalLM",
        LINEAR_ATTENTION,
        [("conv_state", "recurrent_state"), ("key", "value")],
    ),
    "granitemoehybrid": (
        "granitemoehybrid",
        "GraniteMoeHybridForCausalLM",
        {
            "layer_types": ["mamba", "attention"],
            "intermediate_size": 128,
            "shared_intermediate_size": 128,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            **{
                f"mamba_{k}": v for k, v in {"n_heads": 4, "d_head": 32, "d_state": 16, "n_groups": 1}.items()
            },
            "mamba_chunk_size": 8,
            "mamba_d_conv": 4,
        },
        [("conv_state", "recurrent_state"), ("key", "value")],
    ),
    # genai's decoder type runs these too (the graph meets its contract)
    "mamba": (  # Mamba's selective scan: states only, no attention
        "mamba",
        "MambaForCausalLM",
        {"state_size": 8, "expand": 2, "conv_kernel": 4, "time_step_rank": 8, "initializer_range": 0.3},
        [("conv_state", "recurrent_state")] * 2,
    ),
    "mamba2": (  # the state-space duality scan by chunks
        "mamba2",
        "Mamba2ForCausalLM",
        {"num_heads": 8, "head_dim": 16, "state_size": 16, "n_groups": 1, "chunk_size": 8, "expand": 2},
        [("conv_state", "recurrent_state")] * 2,
    ),
    "jamba": (
        "jamba",
        "JambaForCausalLM",
        {
            "intermediate_size": 128,
            **{
                "attn_layer_period": 2,
                "attn_layer_offset": 1,
                "expert_layer_period": 2,
                "expert_layer_offset": 1,
            },
            "num_experts": 4,
            "num_experts_per_tok": 2,
            **{"mamba_d_state": 8, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_dt_rank": 8},
            "use_mamba_kernels": False,
        },
        [("conv_state", "recurrent_state"), ("key", "value")],
    ),
    "qwen3_next": (
        "qwen3_next",
        "Qwen3NextForCausalLM",
        {
            **LINEAR_ATTENTION,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 32,
            "num_experts": 4,
            "num_experts_per_tok": 2,
        },
        [("conv_state", "recurrent_state"), ("key", "value")],
    ),
    "falcon_h1": (  # attention and a Mamba2 mixer in every layer: four tensors a layer
        "falcon_h1",
        "FalconH1ForCausalLM",
        {
            "intermediate_size": 128,
            "head_dim": 16,
            **{f"mamba_{k}": v for k, v in {"d_ssm": 64, "n_heads": 4, "d_head": 16, "d_state": 8}.items()},
            **{"mamba_n_groups": 1, "mamba_chunk_size": 8, "mamba_d_conv": 4},
        },
        [("key", "value", "conv_state", "recurrent_state")] * 2,
    ),
}


# CI: the builder's three families, Mamba's selective scan (states only) and Qwen3-Next (MoE and linear
# attention); Mamba2, Jamba and Falcon-H1 (a layer of four tensors) with FASTONNX_FULL_MATRIX=1
# Qwen3-Next (Qwen3.5's gated delta rule beside sparse experts) under FASTONNX_FULL_MATRIX=1
# granitemoehybrid (Mamba 2 layers beside attention) under the full matrix: lfm2 runs the hybrid cache of
# convolution and attention layers, and test_chunked_kernels Mamba 2's scan at every length, in CI
CI = ("lfm2", "mamba")  # Qwen3.5 is exported in CI by test_state_shapes_are_fixed_but_the_batch


@pytest.mark.parametrize("name", sampled(sorted(FAMILIES), lambda name: name in CI))
def test_hybrid_package_runs_in_genai_as_transformers(tmp_path: pathlib.Path, name: str) -> None:
    model_type, class_name, extra, fields = FAMILIES[name]
    saved = save_checkpoint(tmp_path / "checkpoint", model_type, class_name, {**BASE, **extra})
    written = _check_greedy(tmp_path, saved, name)
    assert written.output_names == ["logits"] + [
        f"present.{i}.{field}" for i, layer in enumerate(fields) for field in layer
    ]
    assert [n for n in written.input_names if n.startswith("past_key_values.")] == [
        f"past_key_values.{i}.{field}" for i, layer in enumerate(fields) for field in layer
    ]
    config = json.loads((tmp_path / "package" / "genai_config.json").read_text())
    assert config["model"]["type"] == ("lfm2" if name == "lfm2" else "decoder")


def test_indexed_cache_package_is_verified(tmp_path: pathlib.Path) -> None:
    """DeepSeek-V3.2's sparse attention caches indexer keys beside keys and values: inputs and outputs of
    their own, growing with the past; genai has no cache for them, so no genai_config.json is written and
    the report says why."""
    import onnx

    written = _export(tmp_path, "deepseek_v32", "DeepseekV32ForCausalLM")
    assert written.verified is True, written.verify_note
    assert "past_key_values.0.indexer_key" in written.input_names
    assert "present.0.indexer_key" in written.output_names
    proto = onnx.load(str(written.model_path), load_external_data=False)
    dims = {
        i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in proto.graph.input
    }
    assert dims["past_key_values.0.indexer_key"][:2] == ["batch_size", "past_sequence_length"]
    assert "genai_config.json" not in written.files
    assert "indexer keys of sparse attention" in written.report_path.read_text()


def test_state_shapes_are_fixed_but_the_batch(tmp_path: pathlib.Path) -> None:
    """genai allocates each state once, from the graph's input shape: only the batch may be symbolic."""
    import onnx

    model_type, class_name, extra, _ = FAMILIES["qwen3_5"]
    save_checkpoint(tmp_path / "checkpoint", model_type, class_name, {**BASE, **extra})
    written = fastonnx.export_pretrained(tmp_path / "checkpoint", tmp_path / "package", progress=False)
    proto = onnx.load(str(written.model_path), load_external_data=False)
    for tensor in proto.graph.input:
        if tensor.name.endswith(("conv_state", "recurrent_state")):
            dims = [d.dim_param or d.dim_value for d in tensor.type.tensor_type.shape.dim]
            assert dims[0] == "batch_size" and all(isinstance(d, int) and d > 0 for d in dims[1:]), dims


@pytest.mark.full_matrix  # a class mapping over the families above
def test_a_vision_language_checkpoint_of_a_hybrid_family_generates(tmp_path: pathlib.Path) -> None:
    """Qwen3.5-MoE ships as Qwen3_5MoeForConditionalGeneration (vision tower and text model in one
    config): text-generation packages its text path with that class (tasks.py), the linear-attention
    states and the experts included, and genai generates transformers' tokens."""
    text = {
        **{k: v for k, v in BASE.items() if k not in TOKENS},
        **LINEAR_ATTENTION,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        **TOKENS,
    }
    vision = {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 64}
    saved = save_checkpoint(
        tmp_path / "checkpoint",
        "qwen3_5_moe",
        "Qwen3_5MoeForConditionalGeneration",
        {"text_config": text, "vision_config": vision},
    )
    # asked for: task="auto" takes the whole vision-language model to image-text-to-text
    written = _check_greedy(tmp_path, saved, "qwen3_5_moe", task="text-generation")
    assert written.architecture == "Qwen3_5MoeForConditionalGeneration"
    assert "past_key_values.0.recurrent_state" in written.input_names
