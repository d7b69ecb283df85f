"""Common-subexpression elimination (rust/core/src/passes/cse.rs) among random surroundings: equal nodes
merge and onnxruntime's outputs stay."""

from __future__ import annotations

from typing import Any

from fastonnx._core import GraphBuilder
from support.pass_harness import Pattern, fires_and_keeps_outputs


def _cse(g: GraphBuilder, x: str, p: Any) -> str:
    a = g.add_node("Sigmoid", [x])[0]
    b = g.add_node("Sigmoid", [x])[0]
    return g.add_node("Mul", [a, b])[0]


# pattern -> (builder, the pass's count in optimize()'s result, level, opset)
PATTERNS: dict[str, Pattern] = {
    "CSE": (_cse, "cse_merged", "default", 18),
}


test_pass_fires_and_keeps_outputs = fires_and_keeps_outputs(PATTERNS)
