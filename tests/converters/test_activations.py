"""Activation, softmax and dropout converters against torch's OpInfo samples and hand-written cases."""

from __future__ import annotations

import pytest
import torch

import fastonnx
from support.export_check import Fn, check_export
from support.opinfo_harness import (
    assert_case_converts,
    opinfo_cases,
    ops_supporting,
)

# nn.functional.rrelu and the dropouts are in tests/converters/test_random.py: their OpInfo samples
# include training=True with 0 < p < 1 (random masks / slopes, checked on their support there).
OPS = [
    "nn.functional.relu",
    "nn.functional.relu6",
    "nn.functional.hardtanh",
    "nn.functional.hardswish",
    "nn.functional.hardsigmoid",
    "nn.functional.elu",
    "nn.functional.selu",
    "nn.functional.celu",
    "nn.functional.leaky_relu",
    "nn.functional.prelu",
    "nn.functional.softplus",
    "nn.functional.mish",
    "nn.functional.glu",
    "nn.functional.logsigmoid",
    "nn.functional.threshold",
    "nn.functional.hardshrink",
    "nn.functional.softshrink",
    "nn.functional.gelu",
    "nn.functional.silu",
    "softmax",
    "softmax.with_dtype",
    "log_softmax",
    "log_softmax.with_dtype",
    "torch.ops.aten._safe_softmax.default",
    # these reach aten as other ops (softmax.int plus elementwise / where ops of other families)
    "nn.functional.softsign",
    "nn.functional.tanhshrink",
    "nn.functional.softmin",
    "nn.functional.softmin.with_dtype",
    "masked.softmax",
    "masked.log_softmax",
    "masked.softmin",
]


FLOAT16_OPS = ops_supporting(OPS, torch.float16, "masked.")
INT_OPS = ops_supporting(OPS, torch.int64, "masked.")
BOOL_OPS = ops_supporting(OPS, torch.bool, "masked.")


@pytest.mark.parametrize(
    ("op_name", "dtype"), opinfo_cases(OPS, float16=FLOAT16_OPS, int64=INT_OPS, bool=BOOL_OPS)
)
def test_opinfo(op_name: str, dtype: torch.dtype) -> None:
    assert_case_converts(op_name, dtype)


aten = torch.ops.aten
X = torch.linspace(-6, 6, 97).reshape(1, 97)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_modes(approximate: str) -> None:
    check_export(Fn(lambda x: aten.gelu(x, approximate=approximate)), (X,), opsets=(17, 19, 20, 26))


def test_gelu_bad_mode_names_argument() -> None:
    with pytest.raises(fastonnx.ConversionError, match="approximate"):
        ep = torch.export.export(Fn(lambda x: aten.gelu(x, approximate="tanh")), (X,), strict=False)
        node = next(n for n in ep.graph.nodes if n.op == "call_function")
        node.kwargs = {"approximate": "cubic"}
        fastonnx.to_onnx(ep, (X,))


def test_elu_scales() -> None:
    check_export(Fn(lambda x: aten.elu(x, 0.7, 1.3, 0.5)), (X,))


@pytest.mark.parametrize(("beta", "threshold"), [(1, 20), (2.0, 3.0), (0.5, 1.0)])
def test_softplus_threshold(beta: float, threshold: float) -> None:
    check_export(Fn(lambda x: torch.nn.functional.softplus(x, beta, threshold)), (X * 2,))


def test_prelu_per_channel() -> None:
    model = torch.nn.PReLU(3)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([0.1, -0.5, 2.0]))
    check_export(model, (torch.randn(2, 3, 4, 5),))
    check_export(
        Fn(lambda x, w: aten._prelu_kernel(x, w)), (torch.randn(2, 3, 4), torch.tensor([[0.2], [0.3], [0.4]]))
    )


def test_rrelu_eval_uses_mean_slope() -> None:
    check_export(torch.nn.RReLU(0.1, 0.3).eval(), (X,))
    check_export(Fn(lambda x: aten.rrelu(x, 0.2, 0.2, True)), (X,))  # lower == upper: no randomness


def test_log_sigmoid_forward_outputs() -> None:
    check_export(Fn(lambda x: aten.log_sigmoid_forward(x)), (X * 10,))


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_glu_dims(dim: int) -> None:
    check_export(Fn(lambda x: torch.nn.functional.glu(x, dim)), (torch.randn(4, 6, 2),), opsets=(17, 18, 26))


def test_glu_dynamic() -> None:
    x = torch.randn(3, 8)
    dyn = (({0: torch.export.Dim("b"), 1: 2 * torch.export.Dim("h")},),)  # forward(*xs)
    check_export(
        Fn(lambda v: torch.nn.functional.glu(v, 1)),
        (x,),
        dynamic_shapes=dyn,
        run_args=[(torch.randn(5, 12),)],
        opsets=(17, 26),
    )


@pytest.mark.parametrize("op", [aten._softmax.default, aten._log_softmax.default])
# half_to_float=True has no CPU kernel in eager torch, so it cannot be compared here
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_internal_softmax(op, dtype: torch.dtype) -> None:
    x = (torch.randn(3, 5) * 4).to(dtype)
    tol = 1e-4 if dtype == torch.float32 else 1e-2
    check_export(Fn(lambda v: op(v, 1, False)), (x,), atol=tol, rtol=tol)


def test_softmax_dtype_argument() -> None:
    x = (torch.randn(3, 5) * 4).to(torch.float16)
    check_export(Fn(lambda v: torch.softmax(v, 0, dtype=torch.float32)), (x,))
    check_export(Fn(lambda v: torch.log_softmax(v, -1, dtype=torch.float64)), (x,), atol=1e-7, rtol=1e-7)


@pytest.mark.parametrize(
    "module",
    [
        torch.nn.Dropout(0.5),
        torch.nn.Dropout2d(0.3),
        torch.nn.AlphaDropout(0.2),
        torch.nn.FeatureAlphaDropout(0.4),
    ],
)
def test_dropout_eval_is_identity(module: torch.nn.Module) -> None:
    check_export(module.eval(), (torch.randn(2, 3, 4, 4),))


@pytest.mark.parametrize(
    "fn",
    [
        aten.dropout.default,
        aten.feature_dropout.default,
        aten.alpha_dropout.default,
        aten.feature_alpha_dropout.default,
    ],
)
@pytest.mark.parametrize("p", [0.0, 1.0])
def test_dropout_training_deterministic_p(fn, p: float) -> None:
    x = torch.randn(2, 3, 4)
    x[0, 0, 0] = float("nan")
    check_export(Fn(lambda v: fn(v, p, True)), (x,))


@pytest.mark.parametrize(("p", "train"), [(0.0, True), (1.0, True), (0.5, False), (0.0, None)])
def test_native_dropout(p: float, train: bool | None) -> None:
    check_export(Fn(lambda v: aten.native_dropout(v, p, train)), (torch.randn(2, 5),))


def test_threshold_fractional_on_integers() -> None:
    x = torch.arange(-4, 5).reshape(3, 3)
    check_export(Fn(lambda v: torch.nn.functional.threshold(v, -1.5, 7)), (x,))
    check_export(Fn(lambda v: torch.nn.functional.threshold(v, 1.5, -7)), (x,))


def test_safe_softmax_fully_masked_rows() -> None:
    inf = float("inf")
    x = torch.tensor([[-inf, -inf, -inf], [0.0, -inf, 1.0], [2.0, 2.0, 2.0]])
    check_export(Fn(lambda v: (aten._safe_softmax(v, 1), aten._safe_softmax(v, 0, torch.float64))), (x,))


def test_softmax_gelu_dynamic() -> None:
    fn = Fn(lambda x: (torch.softmax(x, -1), torch.log_softmax(x, 1), torch.nn.functional.gelu(x)))
    dyn = (({0: torch.export.Dim("b"), 1: torch.export.Dim("s")},),)  # forward(*xs)
    check_export(fn, (torch.randn(2, 3, 8),), dynamic_shapes=dyn, run_args=[(torch.randn(3, 5, 8),)])
