"""Weights read through a Transpose (2-D, batched 3-D, a general 4-D perm) are stored transposed (rust/core/src/passes/weight_transposes.rs), among
random surroundings, and onnxruntime's outputs stay."""

from __future__ import annotations

from typing import Any

import numpy as np

from fastonnx._core import GraphBuilder
from support.pass_harness import Pattern, fires_and_keeps_outputs, weight


def _transpose(g: GraphBuilder, x: str, p: Any) -> str:
    # over 4 KiB: a weight, which constant folding never copies (only tiny buffers are read)
    w = np.random.default_rng(p["seed"]).standard_normal((p["out"] * 1100, p["cols"])).astype(np.float32)
    wt = g.add_node("Transpose", [weight(g, w, "w")], attrs={"perm": [1, 0]})[0]
    return g.add_node("MatMul", [x, wt])[0]


def _batched(g: GraphBuilder, x: str, p: Any) -> str:
    # experts' [E, out, in] weights read as [E, in, out]: x (rows, cols) @ (E, cols, n) -> (E, rows, n)
    rng = np.random.default_rng(p["seed"])
    w = rng.standard_normal((3, p["out"] * 400, p["cols"])).astype(np.float32)
    wt = g.add_node("Transpose", [weight(g, w, "experts")], attrs={"perm": [0, 2, 1]})[0]
    return g.add_node("MatMul", [x, wt])[0]


def _general(g: GraphBuilder, x: str, p: Any) -> str:
    # (cols, 2, n, 3) read as (2, 3, cols, n): x @ it -> (2, 3, rows, n)
    rng = np.random.default_rng(p["seed"])
    w = rng.standard_normal((p["cols"], 2, p["out"] * 200, 3)).astype(np.float32)
    wt = g.add_node("Transpose", [weight(g, w, "w4")], attrs={"perm": [1, 3, 0, 2]})[0]
    return g.add_node("MatMul", [x, wt])[0]


# pattern -> (builder, the pass's count in optimize()'s result, level, opset)
PATTERNS: dict[str, Pattern] = {
    "weight transposes": (_transpose, "weights_transposed", "default", 18),
    "batched weight transposes": (_batched, "weights_transposed", "default", 18),
    "4-D weight permutations": (_general, "weights_transposed", "onnxruntime", 18),
}


test_pass_fires_and_keeps_outputs = fires_and_keeps_outputs(PATTERNS)
