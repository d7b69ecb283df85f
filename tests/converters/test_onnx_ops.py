"""torch.onnx.ops: symbolic / symbolic_multi_out (the named op, its domain, attributes, declared
types and opset import), rotary_embedding and attention (ONNX's ops from opset 23, a composition of
standard ops below) against eager torch in onnxruntime, and against onnx's reference evaluator where
torch's eager kernel and ONNX differ (converters/onnx_ops.py's docstring lists where).

Tolerances: float32 throughout. RotaryEmbedding is two products and a sum per element, computed as
torch does; onnxruntime fuses multiply-adds, so the results differ by a few ulps of operands of
magnitude <= ~10 (measured <= 5e-7; the composition below opset 23 is exact): atol 2e-6. Attention
scales q (ONNX: q and k by sqrt(scale)), and its matmuls and softmax sum in another order than torch's
or the reference's: measured <= 4e-7 on outputs of magnitude <= ~3, atol / rtol 2e-6. Half precision:
one float16 rounding of outputs <= ~2 (eps 1e-3), 2e-3.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from onnx import helper
from onnx.reference import ReferenceEvaluator

import fastonnx
from fastonnx.errors import ConversionError, OpsetError
from fastonnx.opsets import MAX_OPSET
from support.export_check import check_export

torch.onnx.ops  # noqa: B018  (imported with torch.onnx: defines the onnx / onnx_symbolic op namespaces)

OPSETS = (17, 20, 23, MAX_OPSET)
ROPE_TOL = {"atol": 2e-6, "rtol": 1e-6}
ATTN_TOL = {"atol": 2e-6, "rtol": 2e-6}


def _randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _ops(result: fastonnx.ExportResult) -> list[str]:
    return [n.op_type for n in result.model_proto.graph.node]


# ---- rotary_embedding -----------------------------------------------------------------------------
class Rope(torch.nn.Module):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self.kwargs = kwargs

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *ids: torch.Tensor
    ) -> torch.Tensor:
        return torch.onnx.ops.rotary_embedding(x, cos, sin, *ids, **self.kwargs)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rotary_dim", [0, 4], ids=["full", "partial"])
@pytest.mark.parametrize("positions", [False, True], ids=["caches_3d", "position_ids"])
@pytest.mark.parametrize("rank", [4, 3])
def test_rotary_embedding(interleaved: bool, rotary_dim: int, positions: bool, rank: int) -> None:
    b, h, s, d = 2, 3, 5, 8
    half = (rotary_dim or d) // 2
    x = _randn(b, h, s, d)
    kwargs: dict[str, Any] = {"interleaved": interleaved, "rotary_embedding_dim": rotary_dim}
    if rank == 3:
        x = x.transpose(1, 2).reshape(b, s, h * d)
        kwargs["num_heads"] = h
    if positions:
        caches = (_randn(11, half, seed=1), _randn(11, half, seed=2))
        ids: tuple[torch.Tensor, ...] = (
            torch.randint(0, 11, (b, s), generator=torch.Generator().manual_seed(3)),
        )
    else:
        caches, ids = (_randn(b, s, half, seed=1), _randn(b, s, half, seed=2)), ()
    results = check_export(Rope(**kwargs), (x, *caches, *ids), opsets=OPSETS, **ROPE_TOL)
    for result in results:
        has_op = "RotaryEmbedding" in _ops(result)
        assert has_op == (result.stats["opset"] >= 23), _ops(result)


def test_rotary_embedding_dynamic_shapes() -> None:
    b, h, s, d = 2, 3, 5, 8
    x, cos, sin = _randn(b, h, s, d), _randn(b, s, d // 2, seed=1), _randn(b, s, d // 2, seed=2)
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
    dims = ({0: batch, 2: seq}, {0: batch, 1: seq}, {0: batch, 1: seq})
    run = [(_randn(3, h, 7, d, seed=4), _randn(3, 7, d // 2, seed=5), _randn(3, 7, d // 2, seed=6))]
    check_export(
        Rope(interleaved=True), (x, cos, sin), opsets=(17, 23), dynamic_shapes=dims, run_args=run, **ROPE_TOL
    )


# ---- attention ---------------------------------------------------------------------------------
class Attn(torch.nn.Module):
    """torch.onnx.ops.attention on (q, k, v[, mask][, past_key, past_value]), the inputs named by
    ``names``; returns every output or the first ``outputs``."""

    def __init__(self, names: tuple[str, ...] = (), outputs: int = 3, **kwargs: Any) -> None:
        super().__init__()
        self.names, self.outputs, self.kwargs = names, outputs, kwargs

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *rest: torch.Tensor) -> Any:
        extra = dict(zip(self.names, rest))
        return torch.onnx.ops.attention(q, k, v, **extra, **self.kwargs)[: self.outputs]


def _qkv(
    b: int = 2, hq: int = 4, hkv: int = 2, lq: int = 3, s: int = 5, e: int = 8
) -> tuple[torch.Tensor, ...]:
    return _randn(b, hq, lq, e, seed=10), _randn(b, hkv, s, e, seed=11), _randn(b, hkv, s, e, seed=12)


def _past(b: int = 2, hkv: int = 2, p: int = 4, e: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    return _randn(b, hkv, p, e, seed=13), _randn(b, hkv, p, e, seed=14)


def _reference(inputs: dict[str, torch.Tensor], outputs: int = 3, **attrs: Any) -> list[np.ndarray]:
    """onnx's reference evaluator on one Attention node (opset 23): the inputs named as the op's."""
    order = ["Q", "K", "V", "attn_mask", "past_key", "past_value"]
    names = [n if n in inputs else "" for n in order]
    while names[-1] == "":
        names.pop()
    node = helper.make_node(
        "Attention", names, ["Y", "present_key", "present_value", "qk"][:outputs], **attrs
    )
    feeds = {n: inputs[n].numpy() for n in names if n}
    graph = helper.make_graph(
        [node],
        "attention",
        [
            helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
            for n, a in feeds.items()
        ],
        [helper.make_tensor_value_info(o, onnx.TensorProto.FLOAT, None) for o in node.output],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    return list(ReferenceEvaluator(model).run(None, feeds))


def _check_reference(
    model: Attn, args: tuple[torch.Tensor, ...], ref_inputs: dict[str, torch.Tensor], **attrs: Any
) -> list[torch.Tensor]:
    """Exports ``model`` at every opset; each run's outputs match the reference evaluator's. Returns
    the outputs of the last run."""
    expected = [torch.from_numpy(a) for a in _reference(ref_inputs, model.outputs, **attrs)]
    ep = torch.export.export(model, args)
    got: list[torch.Tensor] = []
    for opset in OPSETS:
        got = list(fastonnx.to_onnx(ep, args, opset=opset)(*args))
        for i, (g, want) in enumerate(zip(got, expected, strict=True)):
            torch.testing.assert_close(
                g, want, **ATTN_TOL, msg=lambda m, o=opset, i=i: f"opset {o} output {i}: {m}"
            )
    return got


def test_attention_gqa() -> None:
    optimize = (False, True, "onnxruntime")
    results = check_export(Attn(), _qkv(), opsets=OPSETS, optimize=optimize, **ATTN_TOL)
    for result in results:
        assert ("Attention" in _ops(result)) == (result.stats["opset"] >= 23)


def test_attention_scale_and_softmax_precision() -> None:
    check_export(Attn(scale=0.3, softmax_precision=1), _qkv(hkv=4), opsets=OPSETS, **ATTN_TOL)


def test_attention_bool_mask_with_a_closed_row() -> None:
    q, k, v = _qkv()
    mask = torch.rand(2, 1, 3, 5, generator=torch.Generator().manual_seed(1)) > 0.4
    mask[0, 0, 1] = False  # a row attending nothing: zeros in torch and ONNX
    check_export(Attn(("attn_mask",)), (q, k, v, mask), opsets=OPSETS, **ATTN_TOL)


def test_attention_float_mask() -> None:
    q, k, v = _qkv()
    check_export(Attn(("attn_mask",)), (q, k, v, _randn(3, 5, seed=2)), opsets=OPSETS, **ATTN_TOL)


def test_attention_float_mask_closed_row_is_zero() -> None:
    """A float mask closing a row: ONNX gives zeros there, torch's eager kernel NaN."""
    q, k, v = _qkv()
    mask = _randn(2, 1, 3, 5, seed=2)
    mask[1, 0, 2] = -math.inf
    model = Attn(("attn_mask",))
    assert model(q, k, v, mask)[0].isnan().any()
    got = _check_reference(model, (q, k, v, mask), {"Q": q, "K": k, "V": v, "attn_mask": mask})
    assert not got[0].isnan().any() and got[0][1, :, 2].abs().max() == 0


@pytest.mark.parametrize(("lq", "s"), [(5, 5), (3, 5)])
def test_attention_causal_without_past(lq: int, s: int) -> None:
    check_export(Attn(is_causal=True), _qkv(lq=lq, s=s), opsets=OPSETS, **ATTN_TOL)


def test_attention_past_key_value() -> None:
    q, k, v = _qkv()
    pk, pv = _past()
    results = check_export(Attn(("past_key", "past_value")), (q, k, v, pk, pv), opsets=OPSETS, **ATTN_TOL)
    for result in results:  # the present outputs are the past followed by the new keys / values
        outputs = result.model_proto.graph.output[1:]
        assert [o.type.tensor_type.shape.dim[2].dim_value for o in outputs] == [9, 9]


def test_attention_causal_with_past_follows_onnx() -> None:
    """is_causal with a past: ONNX aligns the mask bottom-right (query i sees keys up to past + i),
    torch's eager kernel top-left; the export follows ONNX at every opset."""
    q, k, v = _qkv(lq=3, s=3)
    pk, pv = _past()
    model = Attn(("past_key", "past_value"), is_causal=True)
    inputs = {"Q": q, "K": k, "V": v, "past_key": pk, "past_value": pv}
    got = _check_reference(model, (q, k, v, pk, pv), inputs, is_causal=1)
    eager = model(q, k, v, pk, pv)
    assert not torch.allclose(got[0], eager[0], atol=1e-3)  # the documented difference
    torch.testing.assert_close(got[1], eager[1], atol=0, rtol=0)  # the present keys agree


def test_attention_causal_with_past_dynamic_lengths() -> None:
    q, k, v = _qkv(lq=3, s=3)
    pk, pv = _past()
    seq, past = torch.export.Dim("seq"), torch.export.Dim("past")
    dims = ({2: seq}, {2: seq}, {2: seq}, ({2: past}, {2: past}))  # *rest is one pytree node
    model = Attn(("past_key", "past_value"), is_causal=True)
    ep = torch.export.export(model, (q, k, v, pk, pv), dynamic_shapes=dims)
    runs = [(q, k, v, pk, pv), (*_qkv(lq=2, s=2), *_past(p=6))]
    for opset in (17, 23):
        result = fastonnx.to_onnx(ep, (q, k, v, pk, pv), opset=opset)
        for a in runs:
            inputs = dict(zip(["Q", "K", "V", "past_key", "past_value"], a))
            want = [torch.from_numpy(x) for x in _reference(inputs, is_causal=1)]
            torch.testing.assert_close(list(result(*a)), want, **ATTN_TOL)


def test_attention_3d_inputs() -> None:
    b, hq, hkv, lq, s, e = 2, 4, 2, 3, 5, 8
    q, k, v = (x.transpose(1, 2).reshape(b, x.shape[2], -1) for x in _qkv(b, hq, hkv, lq, s, e))
    mask = torch.rand(lq, s, generator=torch.Generator().manual_seed(1)) > 0.3
    model = Attn(("attn_mask",), q_num_heads=hq, kv_num_heads=hkv)
    check_export(model, (q, k, v, mask), opsets=OPSETS, **ATTN_TOL)


@pytest.mark.parametrize("mode", [0, 3])
def test_attention_qk_output_agreeing_modes(mode: int) -> None:
    """Modes 0 (scaled Q·Kᵀ) and 3 (the softmax) mean the same in torch and ONNX."""
    q, k, v = _qkv()
    mask = torch.rand(2, 1, 3, 5, generator=torch.Generator().manual_seed(1)) > 0.3
    model = Attn(("attn_mask",), outputs=4, qk_matmul_output_mode=mode)
    check_export(model, (q, k, v, mask), opsets=OPSETS, **ATTN_TOL)


@pytest.mark.parametrize("mode", [1, 2, 3])
def test_attention_softcap_and_qk_modes_follow_onnx(mode: int) -> None:
    """A softcap applies before the mask in ONNX (after it in torch's eager kernel); modes 1 and 2
    are ONNX's (the capped scores, then with the mask added)."""
    q, k, v = _qkv()
    mask = _randn(2, 1, 3, 5, seed=3)
    mask[0, 0, 0, :2] = -math.inf
    model = Attn(("attn_mask",), outputs=4, qk_matmul_output_mode=mode, softcap=2.0)
    inputs = {"Q": q, "K": k, "V": v, "attn_mask": mask}
    _check_reference(model, (q, k, v, mask), inputs, qk_matmul_output_mode=mode, softcap=2.0)


def test_attention_causal_and_mask_follow_onnx() -> None:
    """is_causal with a mask (torch refuses the pair): both apply, and a row both close is zeros."""
    q, k, v = _qkv(lq=4, s=4)
    bool_mask = torch.rand(4, 4, generator=torch.Generator().manual_seed(5)) > 0.5
    for mask in (bool_mask, _randn(2, 1, 4, 4, seed=6)):
        # row 2 lets only key 3 through, which the causal mask closes
        mask[..., 2, :3] = False if mask.dtype == torch.bool else -math.inf
        model = Attn(("attn_mask",), is_causal=True)
        inputs = {"Q": q, "K": k, "V": v, "attn_mask": mask}
        got = _check_reference(model, (q, k, v, mask), inputs, is_causal=1)
        assert got[0][..., 2, :].abs().max() == 0


def test_attention_half_precision() -> None:
    q, k, v = (x.half() for x in _qkv())
    check_export(Attn(outputs=1, is_causal=True), (q, k, v), opsets=(17, 23), atol=2e-3, rtol=2e-3)


def test_attention_short_mask_is_refused() -> None:
    q, k, v = _qkv()
    pk, pv = _past()
    mask = torch.ones(3, 5, dtype=torch.bool)  # covers the new keys only, not the past
    ep = torch.export.export(Attn(("attn_mask", "past_key", "past_value")), (q, k, v, mask, pk, pv))
    for opset in (17, 23):
        with pytest.raises(ConversionError, match=r"attn_mask's last dim is 5, the keys number 9"):
            fastonnx.to_onnx(ep, (q, k, v, mask, pk, pv), opset=opset)


# ---- symbolic ----------------------------------------------------------------------------------
class Symbolic(torch.nn.Module):
    def __init__(self, fn: Any) -> None:
        super().__init__()
        self.fn = fn
        self.register_buffer("k", torch.tensor([2]))

    def forward(self, x: torch.Tensor) -> Any:
        return self.fn(self, x)


def _abs(m: Symbolic, x: torch.Tensor) -> torch.Tensor:
    return torch.onnx.ops.symbolic("Abs", (x,), dtype=x.dtype, shape=x.shape) * 2


def _elu(m: Symbolic, x: torch.Tensor) -> torch.Tensor:
    # an int for a float attribute: widened to the float ONNX's schema wants
    return torch.onnx.ops.symbolic("Elu", [x], {"alpha": 2}, dtype=x.dtype, shape=x.shape)


def _topk(m: Symbolic, x: torch.Tensor) -> Any:
    shape = (*x.shape[:-1], 2)
    return torch.onnx.ops.symbolic_multi_out(
        "TopK", [x, m.k], {"axis": -1, "largest": 1}, dtypes=(x.dtype, torch.int64), shapes=(shape, shape)
    )


@pytest.mark.parametrize(
    ("fn", "eager", "tol"),
    [
        (_abs, lambda m, x: x.abs() * 2, 0.0),  # exact
        (_elu, lambda m, x: torch.nn.functional.elu(x, 2.0), 3e-7),  # exp(x) - 1 against torch's expm1
        (_topk, lambda m, x: tuple(torch.topk(x, 2)), 0.0),
    ],
    ids=["Abs", "Elu", "TopK"],
)
@pytest.mark.parametrize("capture", ["auto", "export"])
def test_symbolic_standard_ops_run(fn: Any, eager: Any, tol: float, capture: str) -> None:
    model, x = Symbolic(fn), _randn(2, 3, 5)
    want = eager(model, x)
    for opset in OPSETS:
        result = fastonnx.to_onnx(model, (x,), opset=opset, capture=capture)
        torch.testing.assert_close(result(x), want, atol=tol, rtol=tol)
        assert result.stats["capture"] == "export"
        assert {o.domain: o.version for o in result.model_proto.opset_import} == {"": opset}


def _custom(m: Symbolic, x: torch.Tensor) -> Any:
    first = torch.onnx.ops.symbolic(
        "my.domain::Mix",
        (x, None, m.k),
        {
            "i": 3,
            "f": 0.5,
            "s": "text",
            "ints": [1, 2],
            "floats": [1.5, 2.0],
            "strs": ["a", "b"],
            "flag": True,
        },
        dtype=torch.float16,
        shape=(x.shape[0], 7),
        version=2,
    )
    second, third = torch.onnx.ops.symbolic_multi_out(
        "my.domain::Pair",
        [first],
        dtypes=(torch.int32, torch.bool),
        shapes=((x.shape[0],), (3, 1)),
        version=2,
    )
    return first, second, third  # graph outputs: their declared types are in the file


def test_symbolic_custom_domain_structure() -> None:
    x = _randn(4, 5)
    batch = torch.export.Dim("batch")
    result = fastonnx.to_onnx(Symbolic(_custom), (x,), dynamic_shapes=({0: batch},), opset=20, verify=False)
    proto = result.model_proto
    onnx.checker.check_model(proto)
    assert {o.domain: o.version for o in proto.opset_import} == {"": 20, "my.domain": 2}
    mix, pair = (n for n in proto.graph.node if n.domain == "my.domain")
    assert (mix.op_type, pair.op_type) == ("Mix", "Pair")
    assert mix.input[0] == "x" and mix.input[1] == "" and len(mix.input) == 3
    attrs = {a.name: helper.get_attribute_value(a) for a in mix.attribute}
    assert attrs == {
        "i": 3,
        "f": 0.5,
        "s": b"text",
        "ints": [1, 2],
        "floats": [1.5, 2.0],
        "strs": [b"a", b"b"],
        "flag": 1,
    }
    kinds = {a.name: a.type for a in mix.attribute}
    A = onnx.AttributeProto
    assert kinds == {
        "i": A.INT, "f": A.FLOAT, "s": A.STRING, "ints": A.INTS, "floats": A.FLOATS, "strs": A.STRINGS, "flag": A.INT
    }  # fmt: skip
    assert [o.name for o in proto.graph.output] == [mix.output[0], *pair.output]
    declared = [
        (o.type.tensor_type.elem_type, [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim])
        for o in proto.graph.output
    ]
    assert declared == [
        (onnx.TensorProto.FLOAT16, ["batch", 7]),
        (onnx.TensorProto.INT32, ["batch"]),
        (onnx.TensorProto.BOOL, [3, 1]),
    ]


def _versions(first: int | None, second: int | None, domain: str = "dom") -> Any:
    a_op, b_op = ("dom::A", "dom::B") if domain else ("Abs", "Neg")

    def fn(m: Symbolic, x: torch.Tensor) -> Any:
        a = torch.onnx.ops.symbolic(a_op, [x], dtype=x.dtype, shape=x.shape, version=first)
        return torch.onnx.ops.symbolic(b_op, [a], dtype=x.dtype, shape=x.shape, version=second)

    return fn


def test_symbolic_domain_versions() -> None:
    x = _randn(2, 3)
    for first, second, want in [(None, None, 1), (3, None, 3), (None, 1, 1), (4, 4, 4)]:
        proto = fastonnx.to_onnx(Symbolic(_versions(first, second)), (x,), verify=False).model_proto
        assert {o.domain: o.version for o in proto.opset_import}["dom"] == want
    with pytest.raises(
        OpsetError, match=r"'dom' at version 2, but the model already imports it at version 1"
    ) as e:
        fastonnx.to_onnx(Symbolic(_versions(1, 2)), (x,), verify=False)
    assert "FX node '_symbolic_1'" in str(e.value) and "dom::B" in str(e.value)
    with pytest.raises(
        OpsetError, match=r"version 17 of the standard ONNX domain, the export targets opset 20"
    ):
        fastonnx.to_onnx(Symbolic(_versions(17, None, "")), (x,), opset=20, verify=False)


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (
            lambda m, x: torch.onnx.ops.symbolic("Abs", [x], {"alpha": 1.0}, dtype=x.dtype, shape=x.shape),
            r"torch.onnx.ops.symbolic \(FX node '_symbolic'\) 'Abs': Abs \(opset 20\) has no attribute 'alpha'",
        ),
        (
            lambda m, x: torch.onnx.ops.symbolic("Elu", [x], {"alpha": "big"}, dtype=x.dtype, shape=x.shape),
            r"'Elu': attribute 'alpha' of Elu is FLOAT, got str 'big'",
        ),
        (
            lambda m, x: torch.onnx.ops.symbolic("NoSuchOp", [x], dtype=x.dtype, shape=x.shape),
            r"'NoSuchOp': ONNX has no operator 'NoSuchOp' at opset 20",
        ),
        (
            lambda m, x: torch.onnx.ops.symbolic("Abs", [x, x], dtype=x.dtype, shape=x.shape),
            r"'Abs': Abs takes 1 to 1 inputs, got 2",
        ),
        (
            lambda m, x: torch.onnx.ops.symbolic("dom::Pack", [x], dtype=22, shape=x.shape),
            r"'dom::Pack': output 0 is declared ONNX INT4 \(22\)",
        ),
    ],
    ids=["unknown_attribute", "attribute_type", "unknown_op", "inputs", "int4"],
)
def test_symbolic_errors_name_the_op_and_node(fn: Any, message: str) -> None:
    with pytest.raises(ConversionError, match=message):
        fastonnx.to_onnx(Symbolic(fn), (_randn(2, 3),), opset=20, verify=False)


def test_symbolic_unknown_dtype_and_bad_encoding() -> None:
    """What torch's own checks stop at capture, in a graph edited after it, is a clear error too."""
    x = _randn(2, 3)
    model = Symbolic(
        lambda m, x: torch.onnx.ops.symbolic("dom::Op", [x], {"a": 1}, dtype=x.dtype, shape=x.shape)
    )
    for edit, message in [
        (lambda n: n.update_arg(2, 99), r"output 0 has dtype 99, not an ONNX data type fastonnx knows"),
        (lambda n: n.update_kwarg("attr_types", ["x"]), r"attribute 'a' has type code 'x'"),
        (
            lambda n: n.update_kwarg("attr_pos", [[0, 5]]),
            r"attribute 'a' \(i\) points at \[0, 5\] of 1 encoded ints",
        ),
    ]:
        ep = torch.export.export(model, (x,))
        node = next(n for n in ep.graph.nodes if n.op == "call_function")
        edit(node)
        with pytest.raises(ConversionError, match=message) as e:
            fastonnx.to_onnx(ep, (x,), verify=False)
        assert "torch.onnx.ops.symbolic (FX node '_symbolic') 'dom::Op'" in str(e.value)


# ---- capture -------------------------------------------------------------------------------------
class Everything(torch.nn.Module):
    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> Any:
        q = torch.onnx.ops.rotary_embedding(q, cos, sin)
        k = torch.onnx.ops.rotary_embedding(k, cos, sin)
        out = torch.onnx.ops.attention(q, k, v, is_causal=True)[0]
        return torch.onnx.ops.symbolic("Relu", [out], dtype=out.dtype, shape=out.shape)


@pytest.mark.parametrize("capture", ["auto", "export"])
def test_capture_paths_reach_the_converters(capture: str, caplog: pytest.LogCaptureFixture) -> None:
    q, k, v = _qkv(hkv=4, s=3)
    cos, sin = _randn(2, 3, 4, seed=1), _randn(2, 3, 4, seed=2)
    args = (q, k, v, cos, sin)
    with caplog.at_level("INFO", logger="fastonnx"):
        result = fastonnx.to_onnx(Everything(), args, capture=capture, opset=23)
    rope = torch.onnx.ops.rotary_embedding
    eager = torch.onnx.ops.attention(rope(q, cos, sin), rope(k, cos, sin), v, is_causal=True)[0].relu()
    torch.testing.assert_close(result(*args), eager, **ATTN_TOL)
    assert _ops(result) == ["RotaryEmbedding", "RotaryEmbedding", "Attention", "Relu"]
    if capture == "auto":
        reason = result.stats["trace_refused"]
        assert "onnx.RotaryEmbedding.opset23 is a custom op (not aten) from torch.onnx.ops" in reason
        assert "torch.export keeps it as one node" in reason and "test_onnx_ops.py" in reason
