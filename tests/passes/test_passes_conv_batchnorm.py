"""BatchNormalization folded into the preceding Conv (rust/core/src/passes/conv_batchnorm.rs), among random
surroundings; onnxruntime's outputs stay."""

from __future__ import annotations

from typing import Any

import numpy as np

from fastonnx._core import GraphBuilder
from support.pass_harness import Pattern, const, fires_and_keeps_outputs, weight


def _conv_bn(g: GraphBuilder, x: str, p: Any) -> str:
    rng = np.random.default_rng(p["seed"])
    c = p["out"]
    img = g.add_node("Reshape", [x, const(g, np.array([1, 1, p["rows"], p["cols"]], dtype=np.int64))])[0]
    w = weight(g, rng.standard_normal((c, 1, 1, 1)).astype(np.float32), "conv_w")
    b = weight(g, rng.standard_normal(c).astype(np.float32), "conv_b")
    conv = g.add_node("Conv", [img, w, b])[0]
    params = [rng.standard_normal(c), rng.standard_normal(c), rng.standard_normal(c), rng.random(c) + 0.5]
    names = [weight(g, a.astype(np.float32), f"bn{i}") for i, a in enumerate(params)]
    return g.add_node("BatchNormalization", [conv, *names], attrs={"epsilon": 1e-3})[0]


# pattern -> (builder, the pass's count in optimize()'s result, level, opset)
PATTERNS: dict[str, Pattern] = {
    "conv + batch norm": (_conv_bn, "conv_batchnorm_fused", "default", 18),
}


test_pass_fires_and_keeps_outputs = fires_and_keeps_outputs(PATTERNS)
