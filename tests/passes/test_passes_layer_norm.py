"""The LayerNorm fusion (rust/core/src/passes/layer_norm.rs): each spelling of a hand-written LayerNorm fires
among random surroundings and keeps onnxruntime's outputs, becomes one node, and is left alone where an
intermediate value has another reader or the opset has no LayerNormalization."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from fastonnx._core import GraphBuilder
from support.pass_harness import (
    CHAIN_PARAMS,
    Builder,
    F,
    Pattern,
    add,
    also_output,
    build,
    const,
    fires_and_keeps_outputs,
    mul,
    ops_of,
    run,
    scalar,
    weight,
)


def _layer_norm(g: GraphBuilder, x: str, p: dict[str, Any]) -> str:
    """A LayerNorm over the last axis in one of its spellings: the square as Pow or Mul, the division
    as Div or Mul by a Reciprocal, x - mean once or twice, with or without gamma and beta, axes -1 or 1
    (an attribute below opset 18), operands in either order."""
    rows, cols, seed = p["rows"], p["cols"], p["seed"]
    g.set_type(x, F, [rows, cols])  # the exporter records every shape; the fusion checks the last dim

    def mean(v: str) -> str:
        axes = [-1] if seed % 5 < 3 else [1]
        if g.opset < 18:
            return g.add_node("ReduceMean", [v], attrs={"axes": axes, "keepdims": 1})[0]
        return g.add_node("ReduceMean", [v, const(g, np.array(axes, dtype=np.int64))], attrs={"keepdims": 1})[
            0
        ]

    m = mean(x)
    d = g.add_node("Sub", [x, m])[0]
    # `(x - u).pow(2)` and `(x - u) / ...` in a model's code: x - u computed twice
    d_num = g.add_node("Sub", [x, m])[0] if seed & 256 else d
    for v in {d, d_num}:
        g.set_type(v, F, [rows, cols])
    sq = g.add_node("Mul", [d, d])[0] if seed % 2 else g.add_node("Pow", [d, const(g, np.float32(2.0))])[0]
    root = g.add_node("Sqrt", [add(g, mean(sq), scalar(g, 1e-5, p), bool(seed & 16))])[0]
    if (seed // 2) % 2:
        n = g.add_node("Div", [d_num, root])[0]
    else:
        n = mul(g, d_num, g.add_node("Reciprocal", [root])[0], bool(seed & 32))
    g.set_type(n, F, [rows, cols])
    rng = np.random.default_rng(seed)
    affine = (seed // 4) % 4
    if affine & 1:
        n = mul(g, n, weight(g, rng.standard_normal(cols).astype(np.float32), "ln_w"), bool(seed & 64))
    if affine & 2:
        n = add(g, n, weight(g, rng.standard_normal(cols).astype(np.float32), "ln_b"), bool(seed & 128))
    g.set_type(n, F, [rows, cols])
    return n


def _layer_norm_affine(g: GraphBuilder, x: str, p: dict[str, Any]) -> str:
    """The LayerNorm with gamma (and beta when the seed says): at opset >= 23 and at the onnxruntime level
    the RMS-norm fusion takes its inner part first, and this fusion completes it."""
    return _layer_norm(g, x, {**p, "seed": p["seed"] | 4})


# pattern -> (builder, the pass's count in optimize()'s result, level, opset)
PATTERNS: dict[str, Pattern] = {
    "layer norm (opset 18)": (_layer_norm, "layer_norm_fused", "default", 18),
    "layer norm (opset 17, axes attribute)": (_layer_norm, "layer_norm_fused", "default", 17),
    "layer norm (onnxruntime)": (_layer_norm, "layer_norm_fused", "onnxruntime", 18),
    "layer norm after the RMS fusion (opset 24)": (_layer_norm_affine, "layer_norm_fused", "default", 24),
    "layer norm after the RMS fusion (onnxruntime)": (
        _layer_norm_affine,
        "layer_norm_fused",
        "onnxruntime",
        18,
    ),
}


test_pass_fires_and_keeps_outputs = fires_and_keeps_outputs(PATTERNS)


@pytest.mark.parametrize(
    ("builder", "level", "opset", "fused"),
    [
        (_layer_norm_affine, "onnxruntime", 18, ("", "LayerNormalization")),
        (_layer_norm_affine, "default", 23, ("", "LayerNormalization")),
        (_layer_norm, "default", 18, ("", "LayerNormalization")),
    ],
)
def test_chain_becomes_one_node(builder: Builder, level: str, opset: int, fused: tuple[str, str]) -> None:
    for seed in range(1024):  # every combination of the spelling bits
        g = build(builder, opset, {**CHAIN_PARAMS, "seed": seed})
        g.optimize(level)
        ops = ops_of(g)
        assert ops == {fused: 1}, (seed, ops)


def test_no_layer_normalization_before_opset_17() -> None:
    g = build(_layer_norm, 16, {**CHAIN_PARAMS, "seed": 1})
    counts = g.optimize("onnxruntime")
    assert counts["layer_norm_fused"] + counts["gelu_fused"] + counts["silu_fused"] == 0, counts


@pytest.mark.parametrize(
    ("builder", "level", "opset", "seed"),
    [
        (also_output("Sub", _layer_norm), "default", 18, 3),
        (also_output("Sqrt", _layer_norm), "default", 18, 3),
        (also_output("ReduceMean", _layer_norm), "default", 18, 3),  # the mean
        (also_output("Sub", _layer_norm, 1), "default", 18, 3 | 256),  # the second x - mean
    ],
)
def test_shared_intermediate_blocks_fusion(builder: Builder, level: str, opset: int, seed: int) -> None:
    p = {**CHAIN_PARAMS, "seed": seed}
    g = build(builder, opset, p)
    counts = g.optimize(level)
    assert counts["layer_norm_fused"] + counts["gelu_fused"] + counts["silu_fused"] == 0, counts
    x = np.random.default_rng(0).standard_normal((p["rows"], p["cols"])).astype(np.float32)
    np.testing.assert_allclose(run(g.to_bytes(), x), run(build(builder, opset, p).to_bytes(), x), rtol=1e-5)
