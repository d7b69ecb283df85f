"""Constant folding (rust/core/src/passes/constant_folding.rs): shape arithmetic on constants folds among random
surroundings and keeps onnxruntime's outputs; ConstantOfShape folds with its value."""

from __future__ import annotations

from typing import Any

import numpy as np

from fastonnx._core import GraphBuilder, TensorAttr
from support.pass_harness import F, Pattern, const, fires_and_keeps_outputs, run


def _fold(g: GraphBuilder, x: str, p: Any) -> str:
    # Reshape x by a shape computed from constants: Concat(Mul(Gather(shape constant)...))
    dims = const(g, np.array([p["rows"], p["cols"]], dtype=np.int64))
    first = g.add_node("Gather", [dims, const(g, np.array([0], dtype=np.int64))], attrs={"axis": 0})[0]
    rest = g.add_node("Mul", [const(g, np.array([p["cols"]], dtype=np.int64)), const(g, np.int64(1))])[0]
    shape = g.add_node("Concat", [first, rest], attrs={"axis": 0})[0]
    return g.add_node("Reshape", [x, shape])[0]


# pattern -> (builder, the pass's count in optimize()'s result, level, opset)
PATTERNS: dict[str, Pattern] = {
    "constant folding": (_fold, "constants_folded", "default", 18),
}


test_pass_fires_and_keeps_outputs = fires_and_keeps_outputs(PATTERNS)


def test_constant_of_shape_folds_with_its_value() -> None:
    g = GraphBuilder(18, 8)
    x = g.add_input("x", F, [2, 3])
    fill = g.add_node(
        "ConstantOfShape",
        [const(g, np.array([2, 3], dtype=np.int64))],
        attrs={"value": TensorAttr(np.float32([2.5]).tobytes(), F, [1])},
    )[0]
    y = g.add_node("Add", [x, fill])[0]
    g.set_type(y, F, [2, 3])
    g.add_output(y, "y")
    assert g.optimize("default")["constants_folded"] == 1
    x_val = np.ones((2, 3), dtype=np.float32)
    np.testing.assert_array_equal(run(g.to_bytes(), x_val), x_val + 2.5)
