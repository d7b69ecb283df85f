"""The shared harness of the pass tests (one test file per pass module, tests/passes/test_passes_*.py): graphs of
random elementwise surroundings around a pattern, and the hypothesis test that the pass counted under a
key fires on them and that onnxruntime gives the same outputs before and after."""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import onnxruntime
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastonnx import dtypes
from fastonnx._core import GraphBuilder

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

# pattern -> (builder, the pass's count in optimize()'s result, level, opset)
Pattern = tuple[Builder, str, str, int]

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


# ---- spellings shared by the fusions' builders -----------------------------------------------------------


def scalar(g: GraphBuilder, value: float, p: dict[str, Any]) -> str:
    """A one-element constant, 0-D or (1,) as the seed says (both broadcast over a 2-D x)."""
    a = np.float32(value) if p["seed"] % 7 < 4 else np.array([value], dtype=np.float32)
    return const(g, a)


def mul(g: GraphBuilder, a: str, b: str, flip: bool) -> str:
    return g.add_node("Mul", [b, a] if flip else [a, b])[0]


def add(g: GraphBuilder, a: str, b: str, flip: bool) -> str:
    return g.add_node("Add", [b, a] if flip else [a, b])[0]


def ops_of(g: GraphBuilder) -> collections.Counter[tuple[str, str]]:
    """(domain, op_type) -> how many nodes of the graph have it."""
    return collections.Counter((n.domain, n.op_type) for n in onnx.load_from_string(g.to_bytes()).graph.node)


# one instance of a chain, in the smallest surroundings (the fused-chain tests loop over its seeds)
CHAIN_PARAMS: dict[str, Any] = {"rows": 3, "cols": 4, "out": 1, "depth": 1, "before": [], "after": []}


def also_output(inner_op: str, builder: Builder, nth: int = 0) -> Builder:
    """The pattern, with the nth `inner_op` value of the chain also a graph output: it must stay."""

    def wrapped(g: GraphBuilder, x: str, p: dict[str, Any]) -> str:
        before = g.num_nodes
        y = builder(g, x, p)
        nodes = onnx.load_from_string(g.to_bytes()).graph.node[before:]
        g.add_output([n.output[0] for n in nodes if n.op_type == inner_op][nth], "extra")
        return y

    return wrapped
