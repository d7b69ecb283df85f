"""Each optimization pass on random graphs that contain its pattern among random surroundings: the pass
must fire, and onnxruntime must give the same outputs before and after."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnxruntime
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastonnx import dtypes
from fastonnx._core import GraphBuilder, TensorAttr

F = dtypes.FLOAT


def const(g: GraphBuilder, a: np.ndarray) -> str:
    dt = {np.dtype(np.float32): dtypes.FLOAT, np.dtype(np.int64): dtypes.INT64}[a.dtype]
    return g.add_constant(np.ascontiguousarray(a).tobytes(), dt, list(a.shape))


def weight(g: GraphBuilder, a: np.ndarray, hint: str) -> str:
    """A borrowed initializer, as the exporter adds weights."""
    return g.add_initializer(
        hint, np.ascontiguousarray(a).reshape(-1).view(np.uint8), dtypes.FLOAT, list(a.shape)
    )


def _surroundings(g: GraphBuilder, x: str, ops: list[str]) -> str:
    """Random elementwise nodes before or after a pattern."""
    for op in ops:
        if op == "Add":
            x = g.add_node("Add", [x, const(g, np.float32(0.5))])[0]
        else:
            x = g.add_node(op, [x])[0]
    return x


Builder = Callable[[GraphBuilder, str, Any], str]


def _fold(g: GraphBuilder, x: str, p: Any) -> str:
    # Reshape x by a shape computed from constants: Concat(Mul(Gather(shape constant)...))
    dims = const(g, np.array([p["rows"], p["cols"]], dtype=np.int64))
    first = g.add_node("Gather", [dims, const(g, np.array([0], dtype=np.int64))], attrs={"axis": 0})[0]
    rest = g.add_node("Mul", [const(g, np.array([p["cols"]], dtype=np.int64)), const(g, np.int64(1))])[0]
    shape = g.add_node("Concat", [first, rest], attrs={"axis": 0})[0]
    return g.add_node("Reshape", [x, shape])[0]


def _noop(g: GraphBuilder, x: str, p: Any) -> str:
    y = g.add_node("Cast", [x], attrs={"to": F})[0]
    g.set_type(y, F, [p["rows"], p["cols"]])
    z = g.add_node("Mul", [y, const(g, np.float32(1.0))])[0]
    g.set_type(z, F, [p["rows"], p["cols"]])
    return z


def _cse(g: GraphBuilder, x: str, p: Any) -> str:
    a = g.add_node("Sigmoid", [x])[0]
    b = g.add_node("Sigmoid", [x])[0]
    return g.add_node("Mul", [a, b])[0]


def _transpose(g: GraphBuilder, x: str, p: Any) -> str:
    # over 4 KiB: a weight, which constant folding never copies (only tiny buffers are read)
    w = np.random.default_rng(p["seed"]).standard_normal((p["out"] * 1100, p["cols"])).astype(np.float32)
    wt = g.add_node("Transpose", [weight(g, w, "w")], attrs={"perm": [1, 0]})[0]
    return g.add_node("MatMul", [x, wt])[0]


def _identity(g: GraphBuilder, x: str, p: Any) -> str:
    # from a computed value: an Identity between a graph input and a graph output must stay
    x = g.add_node("Relu", [x])[0]
    for _ in range(p["depth"]):
        x = g.add_node("Identity", [x])[0]
    return x


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


def _equal_weights(g: GraphBuilder, x: str, p: Any) -> str:
    """Two weights with the same bytes in separate memory (zero biases of untrained layers), and a
    third that differs: the equal two are stored once."""
    cols = p["cols"]
    values = np.random.default_rng(p["seed"]).standard_normal(cols).astype(np.float32)
    y = g.add_node("Add", [x, weight(g, values.copy(), "b1")])[0]
    y = g.add_node("Mul", [y, weight(g, values.copy(), "b2")])[0]
    return g.add_node("Sub", [y, weight(g, values + 1, "b3")])[0]


# pattern -> (builder, the pass's count in optimize()'s result, level, opset)
Pattern = tuple[Builder, str, str, int]
PATTERNS: dict[str, Pattern] = {
    "pattern rewrites": (_rewrite, "patterns_rewritten", "default", 18),
    "constant folding": (_fold, "constants_folded", "default", 18),
    "no-op removal": (_noop, "noops_removed", "default", 18),
    "CSE": (_cse, "cse_merged", "default", 18),
    "weight transposes": (_transpose, "weights_transposed", "default", 18),
    "identity removal": (_identity, "identity_removed", "default", 18),
    "conv + batch norm": (_conv_bn, "conv_batchnorm_fused", "default", 18),
    "equal small initializers": (_equal_weights, "initializers_deduplicated", "default", 18),
    "RMS norm (standard, opset 23)": (_rms_norm, "rms_norm_fused", "default", 23),
    "RMS norm (onnxruntime)": (_rms_norm, "rms_norm_fused", "onnxruntime", 18),
}

_elementwise = st.lists(st.sampled_from(["Relu", "Neg", "Add", "Tanh", "Abs"]), max_size=3)
params = st.fixed_dictionaries(
    {
        "rows": st.integers(1, 4),
        "cols": st.integers(1, 5),
        "out": st.integers(1, 4),
        "depth": st.integers(1, 3),
        "seed": st.integers(0, 1000),
        "before": _elementwise,
        "after": _elementwise,
    }
)


def build(builder: Builder, opset: int, p: dict[str, Any]) -> GraphBuilder:
    """A graph of input x (rows x cols): random elementwise nodes, the pattern, random nodes again."""
    g = GraphBuilder(opset, 8 if opset < 21 else 10)
    x = g.add_input("x", F, [p["rows"], p["cols"]])
    y = _surroundings(g, x, p["before"])
    y = builder(g, y, p)
    y = _surroundings(g, y, p["after"])
    g.set_type(y, F, g.shape(y))  # keep a shape the pattern recorded
    g.add_output(y, "y")
    return g


def run(model: bytes, x: np.ndarray) -> np.ndarray:
    sess = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def check_pass(
    builder: Builder, count: str, level: str, opset: int, p: dict[str, Any], tol: float = 1e-5
) -> None:
    """The pass counted under `count` fires on the pattern, and onnxruntime's outputs do not change."""
    before = build(builder, opset, p).to_bytes()
    g = build(builder, opset, p)
    counts = g.optimize(level)
    assert counts[count] >= 1, counts
    x = np.random.default_rng(p["seed"]).standard_normal((p["rows"], p["cols"])).astype(np.float32)
    np.testing.assert_allclose(run(g.to_bytes(), x), run(before, x), rtol=tol, atol=tol)


def fires_and_keeps_outputs(patterns: dict[str, Pattern]) -> Callable[..., None]:
    """The hypothesis test of a module's patterns, each checked by check_pass (assign it to a test_ name)."""

    @pytest.mark.parametrize("pattern", sorted(patterns))
    @settings(max_examples=15, deadline=None)
    @given(p=params)
    def test(pattern: str, p: dict[str, Any]) -> None:
        builder, count, level, opset = patterns[pattern]
        check_pass(builder, count, level, opset, p)

    return test


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
