"""No-op removal (rust/core/src/passes/noops.rs): a same-type Cast and a `*1` become Identity among random
surroundings, and onnxruntime's outputs stay."""

from __future__ import annotations

from typing import Any

import numpy as np

from fastonnx._core import GraphBuilder
from support.pass_harness import F, Pattern, const, fires_and_keeps_outputs


def _noop(g: GraphBuilder, x: str, p: Any) -> str:
    y = g.add_node("Cast", [x], attrs={"to": F})[0]
    g.set_type(y, F, [p["rows"], p["cols"]])
    z = g.add_node("Mul", [y, const(g, np.float32(1.0))])[0]
    g.set_type(z, F, [p["rows"], p["cols"]])
    return z


# pattern -> (builder, the pass's count in optimize()'s result, level, opset)
PATTERNS: dict[str, Pattern] = {
    "no-op removal": (_noop, "noops_removed", "default", 18),
}


test_pass_fires_and_keeps_outputs = fires_and_keeps_outputs(PATTERNS)
