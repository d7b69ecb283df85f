"""The SiLU fusion (rust/core/src/passes/silu.rs): x * Sigmoid(x) becomes onnxruntime's QuickGelu at the
onnxruntime level among random surroundings, keeping onnxruntime's outputs; it stays as it is at the
standard level and where the Sigmoid has another reader."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from fastonnx._core import GraphBuilder
from support.pass_harness import (
    CHAIN_PARAMS,
    Builder,
    Pattern,
    also_output,
    build,
    fires_and_keeps_outputs,
    mul,
    ops_of,
    run,
)


def _silu(g: GraphBuilder, x: str, p: dict[str, Any]) -> str:
    return mul(g, x, g.add_node("Sigmoid", [x])[0], bool(p["seed"] % 2))


# pattern -> (builder, the pass's count in optimize()'s result, level, opset)
PATTERNS: dict[str, Pattern] = {
    "silu (onnxruntime, opset 18)": (_silu, "silu_fused", "onnxruntime", 18),
    "silu (onnxruntime, opset 26)": (_silu, "silu_fused", "onnxruntime", 26),
}


test_pass_fires_and_keeps_outputs = fires_and_keeps_outputs(PATTERNS)


def test_chain_becomes_one_node() -> None:
    for seed in range(1024):  # every combination of the spelling bits
        g = build(_silu, 20, {**CHAIN_PARAMS, "seed": seed})
        g.optimize("onnxruntime")
        ops = ops_of(g)
        assert ops == {("com.microsoft", "QuickGelu"): 1}, (seed, ops)


@pytest.mark.parametrize(
    ("builder", "level", "opset"),
    [
        (_silu, "default", 24),  # Swish runs slower than Mul(x, Sigmoid(x)) in onnxruntime
        (_silu, "default", 26),
    ],
)
def test_level_and_opset_gate(builder: Builder, level: str, opset: int) -> None:
    g = build(builder, opset, {**CHAIN_PARAMS, "seed": 1})
    counts = g.optimize(level)
    assert counts["layer_norm_fused"] + counts["gelu_fused"] + counts["silu_fused"] == 0, counts


@pytest.mark.parametrize(
    ("builder", "level", "opset", "seed"),
    [
        (also_output("Sigmoid", _silu), "onnxruntime", 24, 3),
    ],
)
def test_shared_intermediate_blocks_fusion(builder: Builder, level: str, opset: int, seed: int) -> None:
    p = {**CHAIN_PARAMS, "seed": seed}
    g = build(builder, opset, p)
    counts = g.optimize(level)
    assert counts["layer_norm_fused"] + counts["gelu_fused"] + counts["silu_fused"] == 0, counts
    x = np.random.default_rng(0).standard_normal((p["rows"], p["cols"])).astype(np.float32)
    np.testing.assert_allclose(run(g.to_bytes(), x), run(build(builder, opset, p).to_bytes(), x), rtol=1e-5)
