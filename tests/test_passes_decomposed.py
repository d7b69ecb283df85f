"""The fusions of hand-written LayerNorm, GELU and SiLU (rust/core/src/passes/decomposed.rs): each spelling
fires among random surroundings and keeps onnxruntime's outputs; the tiny GPT-2 ends with Gelu nodes."""

from __future__ import annotations

import collections
import math
from typing import Any

import numpy as np
import onnx
import pytest
import torch

import fastonnx
from fastonnx._core import GraphBuilder
from model_zoo import TRANSFORMERS_MODELS
from test_passes import (
    Builder,
    F,
    Pattern,
    build,
    const,
    fires_and_keeps_outputs,
    run,
    weight,
)


def _scalar(g: GraphBuilder, value: float, p: dict[str, Any]) -> str:
    """A one-element constant, 0-D or (1,) as the seed says (both broadcast over a 2-D x)."""
    a = np.float32(value) if p["seed"] % 7 < 4 else np.array([value], dtype=np.float32)
    return const(g, a)


def _mul(g: GraphBuilder, a: str, b: str, flip: bool) -> str:
    return g.add_node("Mul", [b, a] if flip else [a, b])[0]


def _add(g: GraphBuilder, a: str, b: str, flip: bool) -> str:
    return g.add_node("Add", [b, a] if flip else [a, b])[0]


def _layer_norm(g: GraphBuilder, x: str, p: dict[str, Any]) -> str:
    """A LayerNorm over the last axis in one of its spellings: the square as Pow or Mul, the division
    as Div or Mul by a Reciprocal, x - mean once or twice, with or without gamma and beta, axes -1 or 1
    (an attribute below opset 18), operands in either order."""
    rows, cols, seed = p["rows"], p["cols"], p["seed"]
    g.set_type(x, F, [rows, cols])  # the exporter records every shape; the fusion checks the last dim

    def mean(v: str) -> str:
        axes = [-1] if seed % 5 < 3 else [1]
        if g.opset < 18:
            return g.add_node("ReduceMean", [v], attrs={"axes": axes, "keepdims": 1})[0]
        return g.add_node("ReduceMean", [v, const(g, np.array(axes, dtype=np.int64))], attrs={"keepdims": 1})[
            0
        ]

    m = mean(x)
    d = g.add_node("Sub", [x, m])[0]
    # `(x - u).pow(2)` and `(x - u) / ...` in a model's code: x - u computed twice
    d_num = g.add_node("Sub", [x, m])[0] if seed & 256 else d
    for v in {d, d_num}:
        g.set_type(v, F, [rows, cols])
    sq = g.add_node("Mul", [d, d])[0] if seed % 2 else g.add_node("Pow", [d, const(g, np.float32(2.0))])[0]
    root = g.add_node("Sqrt", [_add(g, mean(sq), _scalar(g, 1e-5, p), bool(seed & 16))])[0]
    if (seed // 2) % 2:
        n = g.add_node("Div", [d_num, root])[0]
    else:
        n = _mul(g, d_num, g.add_node("Reciprocal", [root])[0], bool(seed & 32))
    g.set_type(n, F, [rows, cols])
    rng = np.random.default_rng(seed)
    affine = (seed // 4) % 4
    if affine & 1:
        n = _mul(g, n, weight(g, rng.standard_normal(cols).astype(np.float32), "ln_w"), bool(seed & 64))
    if affine & 2:
        n = _add(g, n, weight(g, rng.standard_normal(cols).astype(np.float32), "ln_b"), bool(seed & 128))
    g.set_type(n, F, [rows, cols])
    return n


def _layer_norm_affine(g: GraphBuilder, x: str, p: dict[str, Any]) -> str:
    """The LayerNorm with gamma (and beta when the seed says): at opset >= 23 and at the onnxruntime level
    the RMS-norm fusion takes its inner part first, and this fusion completes it."""
    return _layer_norm(g, x, {**p, "seed": p["seed"] | 4})


def _half_x_times(g: GraphBuilder, x: str, a: str, p: dict[str, Any]) -> str:
    """0.5 * x * a in one of the three associations a model or a decomposition writes, either order."""
    seed = p["seed"]
    flips = [bool(seed & b) for b in (8, 16, 32)]
    half = _scalar(g, 0.5, p)
    kind = seed % 3
    if kind == 0:  # (x * 0.5) * a
        return _mul(g, _mul(g, x, half, flips[0]), a, flips[1])
    if kind == 1:  # x * (a * 0.5)
        return _mul(g, x, _mul(g, a, half, flips[0]), flips[1])
    return _mul(g, _mul(g, x, a, flips[0]), half, flips[1])  # (x * a) * 0.5


def _gelu_erf(g: GraphBuilder, x: str, p: dict[str, Any]) -> str:
    """0.5 * x * (1 + Erf(x * 1/sqrt(2) | x / sqrt(2)))."""
    seed = p["seed"]
    g.set_type(x, F, [p["rows"], p["cols"]])
    if (seed // 3) % 2:
        inner = g.add_node("Div", [x, _scalar(g, math.sqrt(2), p)])[0]
    else:
        inner = _mul(g, x, _scalar(g, 1 / math.sqrt(2), p), bool(seed & 64))
    a = _add(g, g.add_node("Erf", [inner])[0], _scalar(g, 1.0, p), bool(seed & 128))
    return _half_x_times(g, x, a, p)


def _gelu_tanh(g: GraphBuilder, x: str, p: dict[str, Any]) -> str:
    """0.5 * x * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * x^3))), x^3 as Pow or two Muls."""
    seed = p["seed"]
    g.set_type(x, F, [p["rows"], p["cols"]])
    cube_kind = (seed // 3) % 3
    if cube_kind == 0:
        cube = g.add_node("Pow", [x, _scalar(g, 3.0, p)])[0]
    elif cube_kind == 1:
        cube = g.add_node("Mul", [g.add_node("Mul", [x, x])[0], x])[0]
    else:
        cube = g.add_node("Mul", [x, g.add_node("Mul", [x, x])[0]])[0]
    poly = _mul(g, cube, _scalar(g, 0.044715, p), bool(seed & 64))
    inner = _mul(
        g, _add(g, x, poly, bool(seed & 128)), _scalar(g, math.sqrt(2 / math.pi), p), bool(seed & 256)
    )
    a = _add(g, g.add_node("Tanh", [inner])[0], _scalar(g, 1.0, p), bool(seed & 512))
    return _half_x_times(g, x, a, p)


def _silu(g: GraphBuilder, x: str, p: dict[str, Any]) -> str:
    return _mul(g, x, g.add_node("Sigmoid", [x])[0], bool(p["seed"] % 2))


# pattern -> (builder, the pass's count in optimize()'s result, level, opset)
PATTERNS: dict[str, Pattern] = {
    "layer norm (opset 18)": (_layer_norm, "layer_norm_fused", "default", 18),
    "layer norm (opset 17, axes attribute)": (_layer_norm, "layer_norm_fused", "default", 17),
    "layer norm (onnxruntime)": (_layer_norm, "layer_norm_fused", "onnxruntime", 18),
    "layer norm after the RMS fusion (opset 24)": (_layer_norm_affine, "layer_norm_fused", "default", 24),
    "layer norm after the RMS fusion (onnxruntime)": (
        _layer_norm_affine,
        "layer_norm_fused",
        "onnxruntime",
        18,
    ),
    "gelu erf (standard, opset 20)": (_gelu_erf, "gelu_fused", "default", 20),
    "gelu erf (onnxruntime contrib, opset 18)": (_gelu_erf, "gelu_fused", "onnxruntime", 18),
    "gelu tanh (standard, opset 20)": (_gelu_tanh, "gelu_fused", "default", 20),
    "gelu tanh (onnxruntime contrib, opset 18)": (_gelu_tanh, "gelu_fused", "onnxruntime", 18),
    "silu (onnxruntime, opset 18)": (_silu, "silu_fused", "onnxruntime", 18),
    "silu (onnxruntime, opset 26)": (_silu, "silu_fused", "onnxruntime", 26),
}


test_pass_fires_and_keeps_outputs = fires_and_keeps_outputs(PATTERNS)


def _ops(g: GraphBuilder) -> collections.Counter[tuple[str, str]]:
    return collections.Counter((n.domain, n.op_type) for n in onnx.load_from_string(g.to_bytes()).graph.node)


P = {"rows": 3, "cols": 4, "out": 1, "depth": 1, "before": [], "after": []}


@pytest.mark.parametrize(
    ("builder", "level", "opset", "fused"),
    [
        (_gelu_erf, "onnxruntime", 18, ("com.microsoft", "Gelu")),
        (_gelu_tanh, "onnxruntime", 18, ("com.microsoft", "FastGelu")),
        (_gelu_erf, "default", 20, ("", "Gelu")),
        (_gelu_tanh, "default", 20, ("", "Gelu")),
        (_silu, "onnxruntime", 20, ("com.microsoft", "QuickGelu")),
        (_layer_norm_affine, "onnxruntime", 18, ("", "LayerNormalization")),
        (_layer_norm_affine, "default", 23, ("", "LayerNormalization")),
        (_layer_norm, "default", 18, ("", "LayerNormalization")),
    ],
)
def test_chain_becomes_one_node(builder: Builder, level: str, opset: int, fused: tuple[str, str]) -> None:
    for seed in range(1024):  # every combination of the spelling bits
        g = build(builder, opset, {**P, "seed": seed})
        g.optimize(level)
        ops = _ops(g)
        assert ops == {fused: 1}, (seed, ops)


@pytest.mark.parametrize(
    ("builder", "level", "opset"),
    [
        (_gelu_erf, "default", 18),  # no standard Gelu before opset 20
        (_gelu_tanh, "default", 19),
        (_silu, "default", 24),  # Swish runs slower than Mul(x, Sigmoid(x)) in onnxruntime
        (_silu, "default", 26),
        (_layer_norm, "onnxruntime", 16),  # no LayerNormalization before opset 17
    ],
)
def test_level_and_opset_gate(builder: Builder, level: str, opset: int) -> None:
    g = build(builder, opset, {**P, "seed": 1})
    counts = g.optimize(level)
    assert counts["layer_norm_fused"] + counts["gelu_fused"] + counts["silu_fused"] == 0, counts


def _also_output(inner_op: str, builder: Builder, nth: int = 0) -> Builder:
    """The pattern, with the nth `inner_op` value of the chain also a graph output: it must stay."""

    def wrapped(g: GraphBuilder, x: str, p: dict[str, Any]) -> str:
        before = g.num_nodes
        y = builder(g, x, p)
        nodes = onnx.load_from_string(g.to_bytes()).graph.node[before:]
        g.add_output([n.output[0] for n in nodes if n.op_type == inner_op][nth], "extra")
        return y

    return wrapped


@pytest.mark.parametrize(
    ("builder", "level", "opset", "seed"),
    [
        (_also_output("Erf", _gelu_erf), "default", 20, 3),
        (_also_output("Tanh", _gelu_tanh), "default", 20, 3),
        (_also_output("Mul", _gelu_tanh), "onnxruntime", 18, 3),  # x * x
        (_also_output("Sigmoid", _silu), "onnxruntime", 24, 3),
        (_also_output("Sub", _layer_norm), "default", 18, 3),
        (_also_output("Sqrt", _layer_norm), "default", 18, 3),
        (_also_output("ReduceMean", _layer_norm), "default", 18, 3),  # the mean
        (_also_output("Sub", _layer_norm, 1), "default", 18, 3 | 256),  # the second x - mean
    ],
)
def test_shared_intermediate_blocks_fusion(builder: Builder, level: str, opset: int, seed: int) -> None:
    p = {**P, "seed": seed}
    g = build(builder, opset, p)
    counts = g.optimize(level)
    assert counts["layer_norm_fused"] + counts["gelu_fused"] + counts["silu_fused"] == 0, counts
    x = np.random.default_rng(0).standard_normal((p["rows"], p["cols"])).astype(np.float32)
    np.testing.assert_allclose(run(g.to_bytes(), x), run(build(builder, opset, p).to_bytes(), x), rtol=1e-5)


def test_wrong_constant_is_left_alone() -> None:
    def almost_gelu(g: GraphBuilder, x: str, p: dict[str, Any]) -> str:
        g.set_type(x, F, [p["rows"], p["cols"]])
        inner = g.add_node("Mul", [x, const(g, np.float32(0.7071))])[0]  # not 1/sqrt(2) within 1e-6
        a = g.add_node("Add", [g.add_node("Erf", [inner])[0], const(g, np.float32(1.0))])[0]
        return _half_x_times(g, x, a, p)

    g = build(almost_gelu, 20, {**P, "seed": 0})
    assert g.optimize("default")["gelu_fused"] == 0


@pytest.fixture(scope="module")
def gpt2() -> tuple[torch.nn.Module, tuple[Any, ...], torch.export.ExportedProgram]:
    model, args = TRANSFORMERS_MODELS["gpt2"]()
    model = model.eval()
    return model, args, torch.export.export(model, args, strict=False)


def test_gpt2_gelu_is_fused(
    gpt2: tuple[torch.nn.Module, tuple[Any, ...], torch.export.ExportedProgram],
) -> None:
    model, args, ep = gpt2
    result = fastonnx.to_onnx(ep, args, opset=20, optimize=True)
    ops = collections.Counter(n.op_type for n in result.model_proto.graph.node)
    assert ops["Gelu"] == 2 and ops["Tanh"] == 0, ops  # one NewGELUActivation per layer
    assert result.stats["optimize"]["gelu_fused"] == 2
    with torch.no_grad():
        expected = model(*args)
    torch.testing.assert_close(result(*args), expected, atol=1e-4, rtol=1e-4)
