"""The live-positions rotary fusion (rust/core/src/passes/rotary_live.rs): rotate-half rotary embeddings
whose cos / sin are computed at run time from angles (as every decode step computes them from position
ids) become RotaryEmbedding from opset 23, com.microsoft.RotaryEmbedding below it at the onnxruntime
level. On random graphs holding the pattern among random surroundings (see pass_harness.py) it must fire
and keep onnxruntime's outputs; tables whose halves differ stay."""

from __future__ import annotations

from typing import Any

import numpy as np

from support.pass_harness import CHAIN_PARAMS, F, Pattern, build, const, fires_and_keeps_outputs, ops_of


def _i64(g: Any, values: list[int]) -> str:
    return const(g, np.array(values, dtype=np.int64))


def _live_rotary(g: Any, x: str, p: dict[str, Any], equal_halves: bool = True) -> str:
    """x (rows, cols) widened to head size 2·cols, as (1, 2 heads, rows, 2·cols), rotated by angles
    computed from x at run time: (1, rows, cols) = x · 0.7; the scale, Cast and operand orders by seed."""
    rows, cols = p["rows"], p["cols"]
    rng = np.random.default_rng(p["seed"])
    g.set_type(x, F, [rows, cols])
    h = 2 * cols
    wide = g.add_node("Concat", [x, g.add_node("Tanh", [x])[0]], attrs={"axis": 1})[0]
    one = g.add_node("Reshape", [wide, _i64(g, [1, 1, rows, h])])[0]
    x4 = g.add_node("Concat", [one, g.add_node("Neg", [one])[0]], attrs={"axis": 1})[0]
    g.set_type(x4, F, [1, 2, rows, h])
    angles = g.add_node(
        "Mul", [g.add_node("Reshape", [x, _i64(g, [1, rows, cols])])[0], const(g, np.float32(0.7))]
    )[0]
    g.set_type(angles, F, [1, rows, cols])
    second = angles if equal_halves else g.add_node("Neg", [angles])[0]
    emb = g.add_node("Concat", [angles, second], attrs={"axis": -1 if rng.integers(2) else 2})[0]
    g.set_type(emb, F, [1, rows, h])
    scale = const(g, np.float32(0.9)) if rng.integers(2) else None
    cast = bool(rng.integers(2))

    def table(op: str) -> str:
        t = g.add_node(op, [emb])[0]
        if scale is not None:
            t = g.add_node("Mul", [t, scale] if rng.integers(2) else [scale, t])[0]
        if cast:
            t = g.add_node("Cast", [t], attrs={"to": F})[0]
        g.set_type(t, F, [1, rows, h])
        t = g.add_node("Unsqueeze", [t, _i64(g, [1])])[0]
        g.set_type(t, F, [1, 1, rows, h])
        return t

    cos, sin = table("Cos"), table("Sin")
    lo = g.add_node("Slice", [x4, _i64(g, [0]), _i64(g, [cols]), _i64(g, [-1])])[0]
    hi = g.add_node("Slice", [x4, _i64(g, [cols]), _i64(g, [h]), _i64(g, [-1])])[0]
    rotated = g.add_node("Concat", [g.add_node("Neg", [hi])[0], lo], attrs={"axis": -1})[0]

    def mul(a: str, b: str) -> str:
        return g.add_node("Mul", [a, b] if rng.integers(2) else [b, a])[0]

    by_cos, by_sin = mul(x4, cos), mul(rotated, sin)
    out = g.add_node("Add", [by_cos, by_sin] if rng.integers(2) else [by_sin, by_cos])[0]
    g.set_type(out, F, [1, 2, rows, h])
    return g.add_node("Reshape", [out, _i64(g, [rows, 2 * h])])[0]


PATTERNS: dict[str, Pattern] = {
    "live rotary (standard, opset 23)": (_live_rotary, "rotary_live_fused", "default", 23),
    "live rotary (onnxruntime level, opset 24)": (_live_rotary, "rotary_live_fused", "onnxruntime", 24),
    "live rotary (onnxruntime level, contrib, opset 20)": (
        _live_rotary,
        "rotary_live_fused",
        "onnxruntime",
        20,
    ),
}

test_pass_fires_and_keeps_outputs = fires_and_keeps_outputs(PATTERNS)


def test_it_becomes_one_rotary_embedding() -> None:
    g = build(_live_rotary, 23, {**CHAIN_PARAMS, "seed": 4})
    assert g.optimize("default")["rotary_live_fused"] == 1
    ops = ops_of(g)
    assert ops[("", "RotaryEmbedding")] == 1 and ops[("", "Neg")] == 1, ops  # the heads' Neg stays


def test_unequal_halves_and_older_opsets_are_left_alone() -> None:
    def unequal(g: Any, x: str, p: dict[str, Any]) -> str:
        return _live_rotary(g, x, p, equal_halves=False)

    g = build(unequal, 23, {**CHAIN_PARAMS, "seed": 4})
    assert g.optimize("default")["rotary_live_fused"] == 0
    g = build(_live_rotary, 22, {**CHAIN_PARAMS, "seed": 4})
    assert g.optimize("default")["rotary_live_fused"] == 0


def test_below_opset_23_the_onnxruntime_level_uses_the_contrib_operator() -> None:
    g = build(_live_rotary, 20, {**CHAIN_PARAMS, "seed": 4})
    assert g.optimize("onnxruntime")["rotary_live_fused"] == 1
    ops = ops_of(g)
    assert ops[("com.microsoft", "RotaryEmbedding")] == 1 and ops[("", "RotaryEmbedding")] == 0, ops
