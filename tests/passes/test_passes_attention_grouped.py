"""The grouped-attention pass (rust/core/src/passes/attention/grouped.rs): below opset 23, attention whose
keys and values are repeated per query-head group (transformers' repeat_kv) reads them unrepeated, the
query heads of a group stacked along the rows; it must fire, drop the Expand, keep onnxruntime's outputs
(see pass_harness.py) and leave alone keys read elsewhere."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from fastonnx._core import GraphBuilder
from support.attention_graphs import per_head, scores_to_output
from support.pass_harness import (
    CHAIN_PARAMS,
    F,
    Pattern,
    also_output,
    build,
    check_pass,
    const,
    fires_and_keeps_outputs,
    ops_of,
)

Q_HEADS, KV_HEADS = 6, 2  # groups of 3: a wrong head order or grouping changes the outputs


def repeated(g: GraphBuilder, x: str, p: Any, op: str) -> str:
    """KV_HEADS heads, each repeated for its group of query heads, as repeat_kv writes it."""
    rows, cols = p["rows"], p["cols"]
    group = Q_HEADS // KV_HEADS
    heads = per_head(g, x, p, op, KV_HEADS)
    wide = g.add_node("Unsqueeze", [heads, const(g, np.array([2], dtype=np.int64))])[0]
    g.set_type(wide, F, [1, KV_HEADS, 1, rows, cols])
    target = const(g, np.array([1, KV_HEADS, group, rows, cols], dtype=np.int64))
    wide = g.add_node("Expand", [wide, target])[0]
    g.set_type(wide, F, [1, KV_HEADS, group, rows, cols])
    out = g.add_node("Reshape", [wide, const(g, np.array([1, Q_HEADS, rows, cols], dtype=np.int64))])[0]
    g.set_type(out, F, [1, Q_HEADS, rows, cols])
    return out


def grouped(g: GraphBuilder, x: str, p: Any) -> str:
    """Grouped-query attention over rows x rows positions, the mask spelling chosen by the seed."""
    g.set_type(x, F, [p["rows"], p["cols"]])
    q = per_head(g, x, p, "Sin", Q_HEADS)
    k, v = repeated(g, x, p, "Cos"), repeated(g, x, p, "Tanh")
    return scores_to_output(g, x, {**p, "heads": Q_HEADS}, q, k, v)


# pattern -> (builder, the pass's count in optimize()'s result, level, opset)
PATTERNS: dict[str, Pattern] = {
    "grouped attention (standard, opset 20)": (grouped, "grouped_attention_unrepeated", "default", 20),
    "grouped attention (onnxruntime level, opset 18)": (
        grouped,
        "grouped_attention_unrepeated",
        "onnxruntime",
        18,
    ),
    "grouped attention (standard, opset 22)": (grouped, "grouped_attention_unrepeated", "default", 22),
}

test_pass_fires_and_keeps_outputs = fires_and_keeps_outputs(PATTERNS)


@pytest.mark.parametrize("kind", range(5))
def test_every_mask_spelling_loses_its_expand(kind: int) -> None:
    p = {**CHAIN_PARAMS, "seed": 3, "kind": kind}
    check_pass(grouped, "grouped_attention_unrepeated", "default", 20, p)
    g = build(grouped, 20, p)
    assert ops_of(g)[("", "Expand")] == 2
    g.optimize("default")
    ops = ops_of(g)
    assert ops[("", "Expand")] == 0, ops
    assert ops[("", "MatMul")] == 2, ops


def test_keys_read_elsewhere_keep_their_repeat() -> None:
    p = {**CHAIN_PARAMS, "seed": 5}
    g = build(also_output("Expand", grouped), 20, p)
    assert g.optimize("default")["grouped_attention_unrepeated"] == 0


def test_opset_23_fuses_attention_instead() -> None:
    g = build(grouped, 23, {**CHAIN_PARAMS, "seed": 7})
    counts = g.optimize("default")
    assert counts["attention_fused"] == 1 and counts["grouped_attention_unrepeated"] == 0, counts
