"""The peephole rewrites (rust/core/src/passes/peephole.rs): Reshape∘Reshape, Transpose∘Transpose, lossless
Cast∘Cast and 2-D MatMul + Add → Gemm fire among random surroundings and keep onnxruntime's outputs."""

from __future__ import annotations

from typing import Any

import numpy as np

from fastonnx import dtypes
from fastonnx._core import GraphBuilder
from support.pass_harness import F, Pattern, const, fires_and_keeps_outputs


def _rewrite(g: GraphBuilder, x: str, p: Any) -> str:
    """One of the local rewrites, chosen by the seed."""
    rows, cols = p["rows"], p["cols"]
    kind = p["seed"] % 4
    if kind == 0:  # Reshape of a Reshape
        flat = g.add_node("Reshape", [x, const(g, np.array([rows * cols], dtype=np.int64))])[0]
        return g.add_node("Reshape", [flat, const(g, np.array([cols, rows], dtype=np.int64))])[0]
    if kind == 1:  # Transpose of a Transpose
        t = g.add_node("Transpose", [x], attrs={"perm": [1, 0]})[0]
        return g.add_node("Transpose", [t], attrs={"perm": [1, 0]})[0]
    if kind == 2:  # a lossless Cast, then another
        wide = g.add_node("Cast", [x], attrs={"to": dtypes.DOUBLE})[0]
        return g.add_node("Cast", [wide], attrs={"to": F})[0]
    # MatMul + Add on 2-D operands
    w = np.random.default_rng(p["seed"]).standard_normal((cols, p["out"])).astype(np.float32)
    mm = g.add_node("MatMul", [x, const(g, w)])[0]
    g.set_type(x, F, [rows, cols])  # the rewrite needs known 2-D shapes, as torch records them
    out = g.add_node("Add", [mm, const(g, np.arange(p["out"], dtype=np.float32))])[0]
    g.set_type(out, F, [rows, p["out"]])
    return out


# pattern -> (builder, the pass's count in optimize()'s result, level, opset)
PATTERNS: dict[str, Pattern] = {
    "pattern rewrites": (_rewrite, "patterns_rewritten", "default", 18),
}


test_pass_fires_and_keeps_outputs = fires_and_keeps_outputs(PATTERNS)
