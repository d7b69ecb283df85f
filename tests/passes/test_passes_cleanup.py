"""The clean-up (rust/core/src/passes/cleanup.rs): Identity removal and the merging of equal small
initializers, among random surroundings; onnxruntime's outputs stay."""

from __future__ import annotations

from typing import Any

import numpy as np

from fastonnx._core import GraphBuilder
from support.pass_harness import Pattern, fires_and_keeps_outputs, weight


def _identity(g: GraphBuilder, x: str, p: Any) -> str:
    # from a computed value: an Identity between a graph input and a graph output must stay
    x = g.add_node("Relu", [x])[0]
    for _ in range(p["depth"]):
        x = g.add_node("Identity", [x])[0]
    return x


def _equal_weights(g: GraphBuilder, x: str, p: Any) -> str:
    """Two weights with the same bytes in separate memory (zero biases of untrained layers), and a
    third that differs: the equal two are stored once."""
    cols = p["cols"]
    values = np.random.default_rng(p["seed"]).standard_normal(cols).astype(np.float32)
    y = g.add_node("Add", [x, weight(g, values.copy(), "b1")])[0]
    y = g.add_node("Mul", [y, weight(g, values.copy(), "b2")])[0]
    return g.add_node("Sub", [y, weight(g, values + 1, "b3")])[0]


# pattern -> (builder, the pass's count in optimize()'s result, level, opset)
PATTERNS: dict[str, Pattern] = {
    "identity removal": (_identity, "identity_removed", "default", 18),
    "equal small initializers": (_equal_weights, "initializers_deduplicated", "default", 18),
}


test_pass_fires_and_keeps_outputs = fires_and_keeps_outputs(PATTERNS)
