"""The GELU fusion (rust/core/src/passes/gelu.rs): the erf and tanh spellings fire among random surroundings
and keep onnxruntime's outputs, become one node (standard Gelu from opset 20, onnxruntime's Gelu /
FastGelu below it), and are left alone where an intermediate value has another reader, a constant is off
or the level and opset allow no Gelu; the tiny GPT-2 ends with Gelu nodes."""

from __future__ import annotations

import collections
import math
from typing import Any

import numpy as np
import pytest
import torch

import fastonnx
from fastonnx._core import GraphBuilder
from support.model_zoo import TRANSFORMERS_MODELS
from support.pass_harness import (
    CHAIN_PARAMS,
    Builder,
    F,
    Pattern,
    add,
    also_output,
    build,
    const,
    fires_and_keeps_outputs,
    mul,
    ops_of,
    run,
    scalar,
)


def _half_x_times(g: GraphBuilder, x: str, a: str, p: dict[str, Any]) -> str:
    """0.5 * x * a in one of the three associations a model or a decomposition writes, either order."""
    seed = p["seed"]
    flips = [bool(seed & b) for b in (8, 16, 32)]
    half = scalar(g, 0.5, p)
    kind = seed % 3
    if kind == 0:  # (x * 0.5) * a
        return mul(g, mul(g, x, half, flips[0]), a, flips[1])
    if kind == 1:  # x * (a * 0.5)
        return mul(g, x, mul(g, a, half, flips[0]), flips[1])
    return mul(g, mul(g, x, a, flips[0]), half, flips[1])  # (x * a) * 0.5


def _gelu_erf(g: GraphBuilder, x: str, p: dict[str, Any]) -> str:
    """0.5 * x * (1 + Erf(x * 1/sqrt(2) | x / sqrt(2)))."""
    seed = p["seed"]
    g.set_type(x, F, [p["rows"], p["cols"]])
    if (seed // 3) % 2:
        inner = g.add_node("Div", [x, scalar(g, math.sqrt(2), p)])[0]
    else:
        inner = mul(g, x, scalar(g, 1 / math.sqrt(2), p), bool(seed & 64))
    a = add(g, g.add_node("Erf", [inner])[0], scalar(g, 1.0, p), bool(seed & 128))
    return _half_x_times(g, x, a, p)


def _gelu_tanh(g: GraphBuilder, x: str, p: dict[str, Any]) -> str:
    """0.5 * x * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * x^3))), x^3 as Pow or two Muls."""
    seed = p["seed"]
    g.set_type(x, F, [p["rows"], p["cols"]])
    cube_kind = (seed // 3) % 3
    if cube_kind == 0:
        cube = g.add_node("Pow", [x, scalar(g, 3.0, p)])[0]
    elif cube_kind == 1:
        cube = g.add_node("Mul", [g.add_node("Mul", [x, x])[0], x])[0]
    else:
        cube = g.add_node("Mul", [x, g.add_node("Mul", [x, x])[0]])[0]
    poly = mul(g, cube, scalar(g, 0.044715, p), bool(seed & 64))
    inner = mul(g, add(g, x, poly, bool(seed & 128)), scalar(g, math.sqrt(2 / math.pi), p), bool(seed & 256))
    a = add(g, g.add_node("Tanh", [inner])[0], scalar(g, 1.0, p), bool(seed & 512))
    return _half_x_times(g, x, a, p)


# pattern -> (builder, the pass's count in optimize()'s result, level, opset)
PATTERNS: dict[str, Pattern] = {
    "gelu erf (standard, opset 20)": (_gelu_erf, "gelu_fused", "default", 20),
    "gelu erf (onnxruntime contrib, opset 18)": (_gelu_erf, "gelu_fused", "onnxruntime", 18),
    "gelu tanh (standard, opset 20)": (_gelu_tanh, "gelu_fused", "default", 20),
    "gelu tanh (onnxruntime contrib, opset 18)": (_gelu_tanh, "gelu_fused", "onnxruntime", 18),
}


test_pass_fires_and_keeps_outputs = fires_and_keeps_outputs(PATTERNS)


@pytest.mark.parametrize(
    ("builder", "level", "opset", "fused"),
    [
        (_gelu_erf, "onnxruntime", 18, ("com.microsoft", "Gelu")),
        (_gelu_tanh, "onnxruntime", 18, ("com.microsoft", "FastGelu")),
        (_gelu_erf, "default", 20, ("", "Gelu")),
        (_gelu_tanh, "default", 20, ("", "Gelu")),
    ],
)
def test_chain_becomes_one_node(builder: Builder, level: str, opset: int, fused: tuple[str, str]) -> None:
    for seed in range(1024):  # every combination of the spelling bits
        g = build(builder, opset, {**CHAIN_PARAMS, "seed": seed})
        g.optimize(level)
        ops = ops_of(g)
        assert ops == {fused: 1}, (seed, ops)


@pytest.mark.parametrize(
    ("builder", "level", "opset"),
    [
        (_gelu_erf, "default", 18),  # no standard Gelu before opset 20
        (_gelu_tanh, "default", 19),
    ],
)
def test_level_and_opset_gate(builder: Builder, level: str, opset: int) -> None:
    g = build(builder, opset, {**CHAIN_PARAMS, "seed": 1})
    counts = g.optimize(level)
    assert counts["layer_norm_fused"] + counts["gelu_fused"] + counts["silu_fused"] == 0, counts


@pytest.mark.parametrize(
    ("builder", "level", "opset", "seed"),
    [
        (also_output("Erf", _gelu_erf), "default", 20, 3),
        (also_output("Tanh", _gelu_tanh), "default", 20, 3),
        (also_output("Mul", _gelu_tanh), "onnxruntime", 18, 3),  # x * x
    ],
)
def test_shared_intermediate_blocks_fusion(builder: Builder, level: str, opset: int, seed: int) -> None:
    p = {**CHAIN_PARAMS, "seed": seed}
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

    g = build(almost_gelu, 20, {**CHAIN_PARAMS, "seed": 0})
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
