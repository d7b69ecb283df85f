"""The Attention pass (rust/core/src/passes/attention/standard.rs): scale, QKᵀ, mask, softmax and V become
ONNX Attention from opset 23; it must fire, keep onnxruntime's outputs (see pass_harness.py), and leave
alone what Attention does not compute."""

from __future__ import annotations

import numpy as np

from fastonnx import dtypes
from fastonnx._core import GraphBuilder
from support.attention_graphs import HEADS, attention, padded_bert_matches_eager, per_head
from support.pass_harness import F, Pattern, build, const, fires_and_keeps_outputs

# pattern -> (builder, the pass's count in optimize()'s result, level, opset)
PATTERNS: dict[str, Pattern] = {
    "attention (standard, opset 23)": (attention, "attention_fused", "default", 23),
    "attention (onnxruntime level, opset 24)": (attention, "attention_fused", "onnxruntime", 24),
}


test_pass_fires_and_keeps_outputs = fires_and_keeps_outputs(PATTERNS)


def test_attention_is_not_fused_below_opset_23() -> None:
    p = {"rows": 3, "cols": 4, "seed": 1, "before": [], "after": []}
    g = build(attention, 22, p)
    counts = g.optimize("onnxruntime")
    assert counts["attention_fused"] + counts["multi_head_attention_fused"] == 0, counts


def test_a_where_on_rows_the_mask_leaves_open_blocks_the_fusion() -> None:
    """Zeroing rows the mask does not close is not what Attention does: the chain stays as it is."""
    rows, cols = 3, 4
    g = GraphBuilder(23, 10)
    x = g.add_input("x", F, [rows, cols])
    p = {"rows": rows, "cols": cols}
    q, k, v = (per_head(g, x, p, op, HEADS) for op in ("Sin", "Cos", "Neg"))
    scaled = g.add_node("Mul", [q, const(g, np.float32(0.5))])[0]
    scores = g.add_node("MatMul", [scaled, g.add_node("Transpose", [k], attrs={"perm": [0, 1, 3, 2]})[0]])[0]
    mask = g.add_constant(np.ones((1, 1, rows, rows), dtype=bool).tobytes(), dtypes.BOOL, [1, 1, rows, rows])
    scores = g.add_node("Where", [mask, scores, const(g, np.float32(-np.inf))])[0]
    probs = g.add_node("Softmax", [scores], attrs={"axis": -1})[0]
    flag = g.add_constant(np.array([[True], [False], [False]]).tobytes(), dtypes.BOOL, [rows, 1])
    probs = g.add_node("Where", [flag, const(g, np.float32(0.0)), probs])[0]
    out = g.add_node("MatMul", [probs, v])[0]
    g.set_type(out, F, [1, HEADS, rows, cols])
    g.add_output(out, "y")
    assert g.optimize("default")["attention_fused"] == 0


def test_padded_bert_matches_eager_with_attention() -> None:
    padded_bert_matches_eager(23, True, "attention_fused")
