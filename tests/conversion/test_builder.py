"""The native GraphBuilder seen from Python: unique names, types, attributes, dedup, round trips
through the onnx package, errors, and the checked-in stubs."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import onnx
import onnx.numpy_helper
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fastonnx
from fastonnx import dtypes
from fastonnx._core import GraphBuilder, TensorAttr

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_stubs_match_the_native_module(tmp_path) -> None:
    # only the stub, in a package of its own: mypy would otherwise analyse all of fastonnx and torch
    pkg = tmp_path / "fastonnx"
    pkg.mkdir()
    (pkg / "__init__.pyi").write_text("")
    (pkg / "_core.pyi").write_text(open(os.path.join(ROOT, "python", "fastonnx", "_core.pyi")).read())
    env = dict(os.environ, MYPYPATH=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "fastonnx._core"], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Success" in proc.stdout


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(alphabet="ab_1.", max_size=5), min_size=1, max_size=80))
def test_unique_names_never_collide(hints: list[str]) -> None:
    g = GraphBuilder(18, 8)
    x = g.add_input("x", dtypes.FLOAT, [2])
    names = {x}
    for h in hints:
        kind = len(names) % 3
        if kind == 0:
            name = g.unique_name(h)
        elif kind == 1:
            # "" as an output name means "omitted optional output": request a name only when given
            name = g.add_node("Relu", [x], [h] if h else 1)[0]
        else:
            name = g.add_constant(np.float32(len(names)).tobytes(), dtypes.FLOAT, [], h)
        assert name not in names, f"{name!r} handed out twice"
        if h and h not in names and kind != 1:
            assert name == h, "a free requested name is kept"
        names.add(name)


_DTYPES = [torch.float32, torch.float16, torch.int64, torch.int32, torch.bool, torch.uint8, torch.float64]


@st.composite
def small_graphs(draw: st.DrawFn) -> tuple[GraphBuilder, dict]:
    """A random chain of unary/binary nodes over inputs and initializers, with what it should contain."""
    g = GraphBuilder(draw(st.integers(17, fastonnx.MAX_OPSET)), 10)
    expect: dict = {"inputs": [], "inits": {}, "nodes": []}
    dtype = draw(st.sampled_from([torch.float32, torch.float16, torch.float64]))
    shape = draw(st.lists(st.integers(1, 4), min_size=0, max_size=3))
    dims = [draw(st.sampled_from([d, f"s{i}", None])) for i, d in enumerate(shape)]
    x = g.add_input(draw(st.sampled_from(["x", "input", "a.b"])), dtypes.to_onnx_dtype(dtype), dims)
    expect["inputs"].append((x, dtypes.to_onnx_dtype(dtype), dims))
    values = [x]
    for i in range(draw(st.integers(1, 6))):
        if draw(st.booleans()):
            data = torch.randn(shape or [1]).to(dtype) if shape else torch.randn(()).to(dtype)
            name = g.add_initializer(
                f"w{i}",
                data.reshape(-1).view(torch.uint8).numpy(),
                dtypes.to_onnx_dtype(dtype),
                list(data.shape),
            )
            expect["inits"][name] = data
            values.append(name)
        op = draw(st.sampled_from(["Relu", "Neg", "Add", "Mul", "Identity"]))
        inputs = [draw(st.sampled_from(values))]
        if op in ("Add", "Mul"):
            inputs.append(draw(st.sampled_from(values)))
        attrs = draw(
            st.sampled_from(
                [
                    {},
                    {"i": 3},
                    {"f": 0.5},
                    {"s": "text"},
                    {"ints": [1, 2]},
                    {"floats": [1.5, 2.0]},
                    {"strs": ["a", "b"]},
                ]
            )
        )
        out = g.add_node(op, inputs, 1, attrs, domain="custom.domain" if attrs else "")[0]
        expect["nodes"].append((op, inputs, out, attrs))
        values.append(out)
    g.set_type(values[-1], dtypes.to_onnx_dtype(dtype), dims)
    out_name = g.add_output(values[-1], "y")
    expect["outputs"] = [out_name]
    return g, expect


def _as_stored(v: object) -> object:
    """An attribute value as ONNX stores it: strings as bytes, floats as float32."""
    if isinstance(v, str):
        return v.encode()
    if isinstance(v, float):
        return float(np.float32(v))
    if isinstance(v, list):
        return [_as_stored(x) for x in v]
    return v


@settings(max_examples=40, deadline=None)
@given(small_graphs())
def test_any_small_graph_loads_back_unchanged(case: tuple[GraphBuilder, dict]) -> None:
    g, expect = case
    model = onnx.load_from_string(g.to_bytes())
    graph = model.graph
    assert [i.name for i in graph.input] == [n for n, _, _ in expect["inputs"]]
    for vi, (_, elem, dims) in zip(graph.input, expect["inputs"]):
        assert vi.type.tensor_type.elem_type == elem
        got = [
            d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
            for d in vi.type.tensor_type.shape.dim
        ]
        assert got == dims
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in graph.initializer}
    for name, data in expect["inits"].items():
        np.testing.assert_array_equal(inits[name], data.numpy())
    real_nodes = [n for n in graph.node]
    for node, (op, inputs, out, attrs) in zip(real_nodes, expect["nodes"]):
        assert node.op_type == op
        assert list(node.input) == inputs or "y" in inputs
        assert list(node.output) in ([out], ["y"])
        got_attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert got_attrs == {k: _as_stored(v) for k, v in attrs.items()}
    assert [o.name for o in graph.output] == ["y"]


def test_types_and_shapes_are_tracked() -> None:
    g = GraphBuilder(18, 8)
    x = g.add_input("x", dtypes.FLOAT16, ["batch", 4, None])
    assert g.dtype(x) == dtypes.FLOAT16 and g.shape(x) == ["batch", 4, None] and g.rank(x) == 3
    s = g.add_node("Shape", [x])[0]
    assert g.dtype(s) == dtypes.INT64 and g.shape(s) is None
    g.set_type(s, dtypes.INT64, [3])
    assert g.shape(s) == [3]
    c = g.add_node("Cast", [x], attrs={"to": dtypes.FLOAT})[0]
    assert g.dtype(c) == dtypes.FLOAT


def test_constants_dedup_and_tied_weights() -> None:
    g = GraphBuilder(18, 8)
    one = np.float32(1).tobytes()
    assert g.add_constant(one, dtypes.FLOAT, []) == g.add_constant(one, dtypes.FLOAT, [])
    w = torch.randn(4, 3)
    flat = w.reshape(-1).view(torch.uint8)
    a = g.add_initializer("w", flat.numpy(), dtypes.FLOAT, [4, 3])
    b = g.add_initializer("w", flat.numpy(), dtypes.FLOAT, [4, 3])  # tied: same memory, same meaning
    c = g.add_initializer("w", flat[:12].numpy(), dtypes.FLOAT, [3])  # w[0]: same address, other shape
    assert a == b and c != a
    assert g.num_initializers == 3 - 1 + 1  # one constant, w, w[0]
    assert g.constant_bytes(a) is None  # weights are borrowed, not constants


def test_tensor_and_subgraph_attributes() -> None:
    g = GraphBuilder(18, 8)
    cond = g.add_input("cond", dtypes.BOOL, [])
    x = g.add_input("x", dtypes.FLOAT, [2])
    then_g = g.subgraph("then")
    t_out = then_g.add_node("Neg", [x])[0]
    then_g.set_type(t_out, dtypes.FLOAT, [2])
    then_g.add_output(t_out)
    else_g = g.subgraph("else")
    e_out = else_g.add_node("Relu", [x])[0]
    else_g.set_type(e_out, dtypes.FLOAT, [2])
    else_g.add_output(e_out)
    y = g.add_node("If", [cond], attrs={"then_branch": then_g, "else_branch": else_g})[0]
    g.set_type(y, dtypes.FLOAT, [2])
    g.add_output(y)
    z = g.add_node(
        "ConstantOfShape",
        [g.add_constant(np.int64([2]).tobytes(), dtypes.INT64, [1])],
        attrs={"value": TensorAttr(np.float32([3]).tobytes(), dtypes.FLOAT, [1])},
    )[0]
    g.set_type(z, dtypes.FLOAT, [2])
    g.add_output(z)
    model = onnx.load_from_string(g.to_bytes())
    onnx.checker.check_model(model, full_check=True)
    import onnxruntime

    sess = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    xv = np.array([-1.0, 2.0], dtype=np.float32)
    yes, fill = sess.run(None, {"cond": np.array(True), "x": xv})
    no, _ = sess.run(None, {"cond": np.array(False), "x": xv})
    np.testing.assert_array_equal(yes, -xv)
    np.testing.assert_array_equal(no, np.maximum(xv, 0))
    np.testing.assert_array_equal(fill, [3, 3])


def test_builder_errors_are_named() -> None:
    g = GraphBuilder(18, 8)
    with pytest.raises(fastonnx.GraphError, match="not a value of the graph"):
        g.add_node("Relu", ["missing"])
    with pytest.raises(fastonnx.GraphError, match="bytes expected"):
        g.add_constant(b"\x00" * 3, dtypes.FLOAT, [1])
    with pytest.raises(fastonnx.GraphError, match="cannot store"):
        g.add_node("Relu", [g.add_input("x", dtypes.FLOAT, [1])], attrs={"bad": object()})
    with pytest.raises(fastonnx.GraphError, match="unknown optimization level"):
        g.optimize("fast")
    with pytest.raises(fastonnx.GraphError, match="not a byte buffer"):
        g.add_initializer("w", 3.5, dtypes.FLOAT, [1])


def test_nodes_lists_a_range_of_nodes_read_only() -> None:
    g = GraphBuilder(18, 8)
    x = g.add_input("x", dtypes.FLOAT, [2])
    (a,) = g.add_node("Relu", [x])
    (b,) = g.add_node("Neg", [a])
    assert g.nodes() == [(g.nodes()[0][0], "Relu", [x], [a]), (g.nodes()[1][0], "Neg", [a], [b])]
    assert [n[1] for n in g.nodes(1)] == ["Neg"]
    assert [n[1] for n in g.nodes(0, 1)] == ["Relu"]
    assert g.nodes(5) == [] and g.nodes(2, 1) == [] and len(g.nodes(0, 99)) == 2
    assert g.node_names() == [n[0] for n in g.nodes()] and g.node_names(1, 9) == [g.nodes()[1][0]]
    g.nodes()[0][2].append("changed")  # a copy: the graph is not touched
    assert g.nodes()[0][2] == [x]
