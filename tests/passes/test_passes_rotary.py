"""The rotary-embedding fusion on random graphs that contain their patterns among random
surroundings (see pass_harness.py): each must fire, and onnxruntime must give the same outputs before and
after. Then what each fusion emits, and the graphs each must leave alone."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnx.numpy_helper
import onnxruntime
import pytest

from fastonnx._core import GraphBuilder
from support.pass_harness import F, Pattern, const, fires_and_keeps_outputs

INT64_MAX = 2**63 - 1


def _i64(g: GraphBuilder, values: list[int]) -> str:
    return const(g, np.array(values, dtype=np.int64))


def _rotary(g: GraphBuilder, x: str, p: dict[str, Any]) -> str:
    """Rotate-half rotary embedding of x widened to head size 2 * cols and reshaped to 4-D, in the
    spelling the seed picks: layout, cos/sin rank, slice axes, ends and steps, operand orders."""
    rows, cols = p["rows"], p["cols"]
    rng = np.random.default_rng(p["seed"])
    g.set_type(x, F, [rows, cols])
    wide = g.add_node("Concat", [x, g.add_node("Tanh", [x])[0]], attrs={"axis": 1})[0]
    # (batch, heads, seq, h): one sequence, one head per row, a batch of rows, or as attention lays
    # out queries: (1, rows, 2, cols) transposed to two heads of an even head size cols
    layouts = [[1, 1, rows, 2 * cols], [1, rows, 1, 2 * cols], [rows, 1, 1, 2 * cols]]
    layouts += [[1, 2, rows, cols]] if cols % 2 == 0 else []
    pick = rng.integers(len(layouts))
    layout = layouts[pick]
    h = layout[-1]
    if pick == 3:
        x4 = g.add_node("Reshape", [wide, _i64(g, [1, rows, 2, cols])])[0]
        x4 = g.add_node("Transpose", [x4], attrs={"perm": [0, 2, 1, 3]})[0]
    else:
        x4 = g.add_node("Reshape", [wide, _i64(g, layout)])[0]
    g.set_type(x4, F, layout)
    seq, half = layout[2], h // 2
    angles = rng.standard_normal((seq, half)).astype(np.float32)
    table_shape = [[seq, h], [1, seq, h], [1, 1, seq, h]][rng.integers(3)]
    cos = const(g, np.cos(np.concatenate([angles, angles], -1)).reshape(table_shape))
    sin = const(g, np.sin(np.concatenate([angles, angles], -1)).reshape(table_shape))
    axis = -1 if rng.integers(2) else 3
    end = INT64_MAX if rng.integers(2) else h
    steps = [_i64(g, [1])] if rng.integers(2) else []
    lo = g.add_node("Slice", [x4, _i64(g, [0]), _i64(g, [half]), _i64(g, [axis]), *steps])[0]
    hi = g.add_node("Slice", [x4, _i64(g, [half]), _i64(g, [end]), _i64(g, [axis]), *steps])[0]
    rotated = g.add_node("Concat", [g.add_node("Neg", [hi])[0], lo], attrs={"axis": axis})[0]

    def mul(a: str, b: str) -> str:
        return g.add_node("Mul", [a, b] if rng.integers(2) else [b, a])[0]

    by_cos, by_sin = mul(x4, cos), mul(rotated, sin)
    out = g.add_node("Add", [by_cos, by_sin] if rng.integers(2) else [by_sin, by_cos])[0]
    g.set_type(out, F, layout)
    return out


# pattern -> (builder, the pass's count in optimize()'s result, level, opset)
PATTERNS: dict[str, Pattern] = {
    "rotary (standard, opset 23)": (_rotary, "rotary_fused", "default", 23),
    "rotary (standard, onnxruntime, opset 23)": (_rotary, "rotary_fused", "onnxruntime", 23),
    "rotary (contrib, onnxruntime, opset 18)": (_rotary, "rotary_fused", "onnxruntime", 18),
}


test_pass_fires_and_keeps_outputs = fires_and_keeps_outputs(PATTERNS)


# ---- what the fusions emit, and what they leave alone -------------------------------------------------


def _nodes(g: GraphBuilder) -> list[onnx.NodeProto]:
    return list(onnx.load_from_string(g.to_bytes()).graph.node)


def _rotary_graph(
    opset: int,
    batch: Any = 1,
    heads: int = 2,
    seq: int = 3,
    h: int = 4,
    cos_input: bool = False,
    halves_differ: bool = False,
    swapped: bool = False,
) -> GraphBuilder:
    """out = x * cos + Concat(-x2, x1) * sin on x (batch, heads, seq, h); cos a graph input, or halves
    that differ, or the halves swapped (Concat(-x1, x2), not a rotation) when asked."""
    g = GraphBuilder(opset, 8 if opset < 21 else 10)
    shape = [batch, heads, seq, h]
    x = g.add_input("x", F, shape)
    angles = np.arange(seq * h, dtype=np.float32).reshape(1, 1, seq, h) / 7
    if not halves_differ and h % 2 == 0:
        angles[..., h // 2 :] = angles[..., : h // 2]
    cos = g.add_input("cos", F, [1, 1, seq, h]) if cos_input else const(g, np.cos(angles))
    sin = const(g, np.sin(angles))
    lo = g.add_node("Slice", [x, _i64(g, [0]), _i64(g, [h // 2]), _i64(g, [-1])])[0]
    hi = g.add_node("Slice", [x, _i64(g, [h // 2]), _i64(g, [INT64_MAX]), _i64(g, [-1])])[0]
    first, second = (lo, hi) if swapped else (hi, lo)
    rotated = g.add_node("Concat", [g.add_node("Neg", [first])[0], second], attrs={"axis": -1})[0]
    out = g.add_node("Add", [g.add_node("Mul", [x, cos])[0], g.add_node("Mul", [rotated, sin])[0]])[0]
    g.set_type(out, F, shape)
    g.add_output(out, "y")
    return g


def _rotary_run(g: GraphBuilder, x: np.ndarray, cos: np.ndarray | None = None) -> np.ndarray:
    sess = onnxruntime.InferenceSession(g.to_bytes(), providers=["CPUExecutionProvider"])
    feeds = {"x": x} if cos is None else {"x": x, "cos": cos}
    return sess.run(None, feeds)[0]


@pytest.mark.parametrize(
    ("opset", "level", "batch", "domain", "inputs", "cache"),
    [
        (18, "onnxruntime", 2, "com.microsoft", 4, [3, 2]),
        (23, "default", 1, "", 3, [1, 3, 2]),
        (23, "onnxruntime", 2, "", 4, [3, 2]),
    ],
)
def test_rotary_emits(opset: int, level: str, batch: int, domain: str, inputs: int, cache: list[int]) -> None:
    before = _rotary_graph(opset, batch)
    g = _rotary_graph(opset, batch)
    assert g.optimize(level)["rotary_fused"] == 1
    model = onnx.load_from_string(g.to_bytes())
    (node,) = model.graph.node
    assert (node.domain, node.op_type, len(node.input)) == (domain, "RotaryEmbedding", inputs)
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    cos = node.input[2] if domain else node.input[1]
    assert list(inits[cos].shape) == cache
    if inputs == 4:
        ids = inits[node.input[1] if domain else node.input[3]]
        expected = [0] if domain else np.tile(np.arange(3), (batch, 1))
        np.testing.assert_array_equal(ids, expected)
    x = np.random.default_rng(0).standard_normal((batch, 2, 3, 4)).astype(np.float32)
    np.testing.assert_allclose(_rotary_run(g, x), _rotary_run(before, x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "case",
    ["default below 23", "cos not constant", "halves differ", "halves swapped", "dynamic batch", "odd h"],
)
def test_rotary_leaves_alone(case: str) -> None:
    opset, level = (18, "default") if case == "default below 23" else (23, "default")
    g = _rotary_graph(
        opset,
        batch="batch" if case == "dynamic batch" else 1,
        h=5 if case == "odd h" else 4,
        cos_input=case == "cos not constant",
        halves_differ=case == "halves differ",
        swapped=case == "halves swapped",
    )
    assert g.optimize(level)["rotary_fused"] == 0
    assert "RotaryEmbedding" not in [n.op_type for n in _nodes(g)]


@pytest.mark.parametrize("opset", [18, 23])
def test_rotary_with_dynamic_batch_uses_the_contrib_op(opset: int) -> None:
    g = _rotary_graph(opset, batch="batch")
    assert g.optimize("onnxruntime")["rotary_fused"] == 1
    assert [(n.domain, n.op_type) for n in _nodes(g)] == [("com.microsoft", "RotaryEmbedding")]
    x = np.random.default_rng(0).standard_normal((3, 2, 3, 4)).astype(np.float32)
    before = _rotary_graph(opset, batch="batch")
    np.testing.assert_allclose(_rotary_run(g, x), _rotary_run(before, x), rtol=1e-5, atol=1e-5)
