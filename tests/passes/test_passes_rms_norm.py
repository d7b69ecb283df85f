"""The RMS-norm fusion (rust/core/src/passes/rms_norm.rs) on its spellings among random surroundings:
RMSNormalization from opset 23, SimplifiedLayerNormalization at the onnxruntime level; outputs stay."""

from __future__ import annotations

from typing import Any

import numpy as np

from fastonnx._core import GraphBuilder
from support.pass_harness import F, Pattern, const, fires_and_keeps_outputs, weight


def _rms_norm(g: GraphBuilder, x: str, p: Any) -> str:
    """An RMS norm as models write it, in one of its spellings (chosen by the seed)."""
    rows, cols = p["rows"], p["cols"]
    g.set_type(x, F, [rows, cols])  # the fusion checks the weight against the last dim
    squared = (
        g.add_node("Mul", [x, x])[0]
        if p["seed"] % 2
        else g.add_node("Pow", [x, const(g, np.float32(2.0))])[0]
    )
    mean = g.add_node(
        "ReduceMean", [squared, const(g, np.array([-1], dtype=np.int64))], attrs={"keepdims": 1}
    )[0]
    root = g.add_node("Sqrt", [g.add_node("Add", [mean, const(g, np.float32(1e-5))])[0]])[0]
    if p["seed"] % 3:
        normed = g.add_node("Mul", [x, g.add_node("Reciprocal", [root])[0]])[0]
    else:
        normed = g.add_node("Div", [x, root])[0]
    w = np.random.default_rng(p["seed"]).standard_normal(cols).astype(np.float32)
    out = g.add_node("Mul", [weight(g, w, "norm_w"), normed])[0]
    g.set_type(out, F, [rows, cols])
    return out


# pattern -> (builder, the pass's count in optimize()'s result, level, opset)
PATTERNS: dict[str, Pattern] = {
    "RMS norm (standard, opset 23)": (_rms_norm, "rms_norm_fused", "default", 23),
    "RMS norm (onnxruntime)": (_rms_norm, "rms_norm_fused", "onnxruntime", 18),
}


test_pass_fires_and_keeps_outputs = fires_and_keeps_outputs(PATTERNS)
