"""The MultiHeadAttention pass (rust/core/src/passes/attention/multi_head.rs): heads split from 3-D
projections and merged back become com.microsoft.MultiHeadAttention at the onnxruntime level below opset
23; it must fire and keep onnxruntime's outputs (see pass_harness.py)."""

from __future__ import annotations

from support.attention_graphs import multi_head, padded_bert_matches_eager
from support.pass_harness import Pattern, fires_and_keeps_outputs

PATTERNS: dict[str, Pattern] = {
    "multi-head attention (onnxruntime level, opset 20)": (
        multi_head,
        "multi_head_attention_fused",
        "onnxruntime",
        20,
    ),
}


test_pass_fires_and_keeps_outputs = fires_and_keeps_outputs(PATTERNS)


def test_padded_bert_matches_eager_with_multi_head_attention() -> None:
    padded_bert_matches_eager(20, "onnxruntime", "multi_head_attention_fused")
