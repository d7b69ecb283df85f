"""Weights read through a Transpose are stored transposed (rust/core/src/passes/weight_transposes.rs), among
random surroundings, and onnxruntime's outputs stay."""

from __future__ import annotations

from typing import Any

import numpy as np

from fastonnx._core import GraphBuilder
from pass_harness import Pattern, fires_and_keeps_outputs, weight


def _transpose(g: GraphBuilder, x: str, p: Any) -> str:
    # over 4 KiB: a weight, which constant folding never copies (only tiny buffers are read)
    w = np.random.default_rng(p["seed"]).standard_normal((p["out"] * 1100, p["cols"])).astype(np.float32)
    wt = g.add_node("Transpose", [weight(g, w, "w")], attrs={"perm": [1, 0]})[0]
    return g.add_node("MatMul", [x, wt])[0]


# pattern -> (builder, the pass's count in optimize()'s result, level, opset)
PATTERNS: dict[str, Pattern] = {
    "weight transposes": (_transpose, "weights_transposed", "default", 18),
}


test_pass_fires_and_keeps_outputs = fires_and_keeps_outputs(PATTERNS)
