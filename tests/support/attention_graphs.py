"""Graphs holding attention as the converter (converters/attention.py) decomposes it, for the attention
passes' tests (rust/core/src/passes/attention/): one builder per form the passes match."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

import fastonnx
from fastonnx import dtypes
from fastonnx._core import GraphBuilder
from support.model_zoo import TRANSFORMERS_MODELS
from support.pass_harness import F, const

HEADS = 2


def per_head(g: GraphBuilder, x: str, p: Any, op: str, heads: int) -> str:
    """(rows, cols) -> (1, heads, rows, cols), each head a different elementwise function of x."""
    rows, cols = p["rows"], p["cols"]
    one = g.add_node("Reshape", [x, const(g, np.array([1, 1, rows, cols], dtype=np.int64))])[0]
    parts = [one] + [
        g.add_node(op, [g.add_node("Mul", [one, const(g, np.float32(h + 1))])[0]])[0]
        for h in range(heads - 1)
    ]
    out = g.add_node("Concat", parts, attrs={"axis": 1})[0] if heads > 1 else one
    g.set_type(out, F, [1, heads, rows, cols])
    return out


def repeated(g: GraphBuilder, x: str, p: Any) -> str:
    """One key/value head repeated for each query head, as transformers' repeat_kv writes it."""
    rows, cols = p["rows"], p["cols"]
    single = per_head(g, x, p, "Tanh", 1)
    wide = g.add_node("Unsqueeze", [single, const(g, np.array([2], dtype=np.int64))])[0]
    g.set_type(wide, F, [1, 1, 1, rows, cols])
    wide = g.add_node("Expand", [wide, const(g, np.array([1, 1, HEADS, rows, cols], dtype=np.int64))])[0]
    g.set_type(wide, F, [1, 1, HEADS, rows, cols])
    out = g.add_node("Reshape", [wide, const(g, np.array([1, HEADS, rows, cols], dtype=np.int64))])[0]
    g.set_type(out, F, [1, HEADS, rows, cols])
    return out


def attention(g: GraphBuilder, x: str, p: Any) -> str:
    """Attention over rows x rows positions, its mask spelling and key/value layout chosen by the seed."""
    rows, seed = p["rows"], p["seed"]
    g.set_type(x, F, [rows, p["cols"]])
    q = per_head(g, x, p, "Sin", HEADS)
    k, v = (
        (repeated(g, x, p), repeated(g, x, p))
        if seed % 2
        else (per_head(g, x, p, "Cos", HEADS), per_head(g, x, p, "Neg", HEADS))
    )
    return scores_to_output(g, x, p, q, k, v)


def scores_to_output(g: GraphBuilder, x: str, p: Any, q: str, k: str, v: str) -> str:
    """The converter's attention chain on 4-D q, k, v of (1, heads, rows, cols) (HEADS unless p["heads"]
    says); the mask by the seed."""
    rows, seed = p["rows"], p["seed"]
    rng = np.random.default_rng(seed)
    scaled = g.add_node("Mul", [q, const(g, np.float32(1.0 / np.sqrt(p["cols"])))])[0]
    scores = g.add_node("MatMul", [scaled, g.add_node("Transpose", [k], attrs={"perm": [0, 1, 3, 2]})[0]])[0]
    kind = p.get("kind", seed % 5)
    closed = None
    if kind == 4:  # no padding: a constant all-True mask, whose closed-rows flag folds to all-False
        mask = g.add_constant(
            np.ones((1, 1, rows, rows), dtype=bool).tobytes(), dtypes.BOOL, [1, 1, rows, rows]
        )
        wide = g.add_node("Cast", [mask], attrs={"to": dtypes.INT32})[0]
        top = g.add_node("ReduceMax", [wide, const(g, np.array([3], dtype=np.int64))], attrs={"keepdims": 1})[
            0
        ]
        closed = g.add_node("Equal", [top, g.add_constant(np.int32(0).tobytes(), dtypes.INT32, [])])[0]
        scores = g.add_node("Where", [mask, scores, const(g, np.float32(-np.inf))])[0]
    if kind in (1, 2):  # a boolean mask (random, or causal), -inf where it is False
        allowed = np.tril(np.ones((rows, rows), dtype=bool)) if kind == 2 else rng.random((rows, rows)) > 0.4
        if kind == 1:
            allowed[0, rng.integers(rows)] = False
            allowed[rng.integers(rows)] = False  # a row closed entirely: its output must be 0
        mask = g.add_constant(allowed.tobytes(), dtypes.BOOL, [1, 1, rows, rows], "mask")
        if kind == 1:
            # computed at run time, as padding masks are (x * 0 is 0 for finite x): not folded away
            zero = g.add_node(
                "Mul", [g.add_node("ReduceSum", [x], attrs={"keepdims": 1})[0], const(g, np.float32(0))]
            )[0]
            open_ = g.add_node("Add", [zero, const(g, allowed.astype(np.float32).reshape(1, 1, rows, rows))])[
                0
            ]
            mask = g.add_node("Greater", [open_, const(g, np.float32(0.5))])[0]
            g.set_type(mask, dtypes.BOOL, [1, 1, rows, rows])
            # the converter's flag for closed rows, as in converters/attention.py
            wide = g.add_node("Cast", [mask], attrs={"to": dtypes.INT32})[0]
            top = g.add_node(
                "ReduceMax", [wide, const(g, np.array([3], dtype=np.int64))], attrs={"keepdims": 1}
            )[0]
            closed = g.add_node("Equal", [top, g.add_constant(np.int32(0).tobytes(), dtypes.INT32, [])])[0]
        scores = g.add_node("Where", [mask, scores, const(g, np.float32(-np.inf))])[0]
    elif kind == 3:  # an additive float bias
        bias = rng.standard_normal((1, 1, rows, rows)).astype(np.float32)
        scores = g.add_node("Add", [scores, const(g, bias)])[0]
    probs = g.add_node("Softmax", [scores], attrs={"axis": -1})[0]
    if closed is not None:
        g.set_type(closed, dtypes.BOOL, [1, 1, rows, 1])  # as the converter records it
        probs = g.add_node("Where", [closed, const(g, np.float32(0.0)), probs])[0]
    out = g.add_node("MatMul", [probs, v])[0]
    g.set_type(out, F, [1, p.get("heads", HEADS), rows, p["cols"]])
    return out


def open_attention(g: GraphBuilder, x: str, p: Any) -> str:
    """Attention whose mask is all-true constants: its Wheres go at any opset."""
    return attention(g, x, {**p, "kind": 4})


def multi_head(g: GraphBuilder, x: str, p: Any) -> str:
    """Heads split from 3-D projections and merged back (BERT, ViT), around the attention chain."""
    rows, cols = p["rows"], p["cols"]
    g.set_type(x, F, [rows, cols])
    wide = g.add_node("Concat", [x, g.add_node("Neg", [x])[0]], attrs={"axis": -1})[0]
    hidden = g.add_node("Reshape", [wide, const(g, np.array([1, rows, HEADS * cols], dtype=np.int64))])[0]
    g.set_type(hidden, F, [1, rows, HEADS * cols])

    def split(op: str) -> str:
        x3 = g.add_node(op, [hidden])[0]
        g.set_type(x3, F, [1, rows, HEADS * cols])
        x4 = g.add_node("Reshape", [x3, const(g, np.array([1, rows, HEADS, cols], dtype=np.int64))])[0]
        g.set_type(x4, F, [1, rows, HEADS, cols])
        heads = g.add_node("Transpose", [x4], attrs={"perm": [0, 2, 1, 3]})[0]
        g.set_type(heads, F, [1, HEADS, rows, cols])
        return heads

    out = scores_to_output(g, x, p, split("Sin"), split("Cos"), split("Tanh"))
    merged = g.add_node("Transpose", [out], attrs={"perm": [0, 2, 1, 3]})[0]
    g.set_type(merged, F, [1, rows, HEADS, cols])
    y = g.add_node("Reshape", [merged, const(g, np.array([1, rows, HEADS * cols], dtype=np.int64))])[0]
    g.set_type(y, F, [1, rows, HEADS * cols])
    return y


def padded_bert_matches_eager(opset: int, optimize: str | bool, fused: str) -> None:
    """Right padding and an entry that is padding only, whose every query row is closed: torch gives
    finite values there, and so must the fused graph."""
    model, (ids, mask) = TRANSFORMERS_MODELS["bert"]()
    ids, mask = ids.repeat(3, 1), mask.repeat(3, 1).clone()
    mask[1, -3:] = 0
    mask[2, :] = 0
    result = fastonnx.to_onnx(model, (ids, mask), opset=opset, optimize=optimize)
    assert result.stats["optimize"][fused] >= 1, result.stats["optimize"]
    with torch.no_grad():
        expected = model(ids, mask)
    torch.testing.assert_close(result(ids, mask), expected, atol=1e-4, rtol=1e-4)
