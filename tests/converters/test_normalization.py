"""Normalization converters against torch's OpInfo samples and hand-written cases."""

from __future__ import annotations

import copy

import pytest
import torch

import fastonnx
from support.export_check import ENDS, Fn, check_export
from support.opinfo_harness import (
    assert_case_converts,
    opinfo_cases,
    ops_supporting,
)

OPS = [
    "nn.functional.batch_norm",
    "nn.functional.batch_norm.without_cudnn",
    "native_batch_norm",
    "_native_batch_norm_legit",
    "_batch_norm_with_update",
    "nn.functional.layer_norm",
    "native_layer_norm",
    "nn.functional.group_norm",
    "native_group_norm",
    "nn.functional.instance_norm",
    "nn.functional.rms_norm",
    # reaches aten as pad / avg_pool / elementwise ops (no converter of this family, kept for coverage)
    "nn.functional.local_response_norm",
]


FLOAT16_OPS = ops_supporting(OPS, torch.float16)
# No int64 or bool list: no op here declares bool, and the only one declaring int64,
# local_response_norm, goes through an integer avg_pool, which the nn converters refuse with a clear
# error (torch truncates integer window means; a float mean cast back is not always equal).


@pytest.mark.parametrize(("op_name", "dtype"), opinfo_cases(OPS, float16=FLOAT16_OPS))
def test_opinfo(op_name: str, dtype: torch.dtype) -> None:
    assert_case_converts(op_name, dtype)


aten = torch.ops.aten


def _bn(cls: type, c: int) -> torch.nn.Module:
    m = cls(c)
    with torch.no_grad():
        m.weight.uniform_(0.5, 1.5)
        m.bias.uniform_(-0.5, 0.5)
        m.running_mean.uniform_(-1, 1)
        m.running_var.uniform_(0.5, 2)
    return m


@pytest.mark.parametrize(
    ("cls", "shape"),
    [(torch.nn.BatchNorm1d, (4, 3)), (torch.nn.BatchNorm1d, (4, 3, 7)), (torch.nn.BatchNorm2d, (2, 3, 5, 5))],
)
def test_batch_norm_eval_modules(cls: type, shape: tuple[int, ...]) -> None:
    check_export(_bn(cls, shape[1]), (torch.randn(shape),))


def test_batch_norm_eval_decomposed() -> None:
    """_native_batch_norm_legit_no_training, as run_decompositions() writes it."""
    model = _bn(torch.nn.BatchNorm2d, 3).eval()
    x = torch.randn(2, 3, 4, 4)
    ep = torch.export.export(model, (x,), strict=False).run_decompositions()
    targets = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert "aten._native_batch_norm_legit_no_training.default" in targets
    for opset in ENDS:
        got = fastonnx.to_onnx(ep, (x,), opset=opset)(x)
        torch.testing.assert_close(got, model(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("decompose", [False, True])
def test_batch_norm_training_uses_batch_statistics(decompose: bool) -> None:
    model = _bn(torch.nn.BatchNorm2d, 3).train()
    x = torch.randn(4, 3, 5, 5) * 3 + 1
    ep = torch.export.export(model, (x,), strict=False)
    if decompose:
        ep = ep.run_decompositions()  # _native_batch_norm_legit_functional, running stats as outputs
    eager = copy.deepcopy(model)  # the exported program shares the model's buffers: keep them as they were
    with torch.no_grad():
        expected = eager(x)  # train mode: batch statistics (and updates the buffers)
    for opset in ENDS:
        result = fastonnx.to_onnx(ep, (x,), opset=opset)
        torch.testing.assert_close(result(x), expected, atol=1e-5, rtol=1e-5)
        if decompose:
            names = result._layout.extra_outputs
            feeds = {result._layout.inputs[0].onnx_name: x.numpy()}
            running_mean, running_var = result.session().run(names[:2], feeds)
            torch.testing.assert_close(
                torch.from_numpy(running_mean), eager.running_mean, atol=1e-5, rtol=1e-5
            )
            torch.testing.assert_close(torch.from_numpy(running_var), eager.running_var, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("training", [False, True])
def test_native_batch_norm_outputs(training: bool) -> None:
    w, b, rm, rv = torch.rand(3) + 0.5, torch.randn(3), torch.randn(3), torch.rand(3) + 0.5
    fn = Fn(lambda x: aten.native_batch_norm(x, w, b, rm.clone(), rv.clone(), training, 0.1, 1e-5))
    check_export(fn, (torch.randn(4, 3, 6),))
    fn = Fn(lambda x: aten._native_batch_norm_legit.no_stats(x, w, None, True, 0.1, 1e-3))
    check_export(fn, (torch.randn(4, 3, 6),))


def test_batch_norm_functional_outputs() -> None:
    w, b, rm, rv = torch.rand(3) + 0.5, torch.randn(3), torch.randn(3), torch.rand(3) + 0.5
    fn = Fn(lambda x: aten._native_batch_norm_legit_functional(x, w, b, rm, rv, True, 0.3, 1e-5))
    check_export(fn, (torch.randn(4, 3, 6),))
    fn = Fn(lambda x: aten._batch_norm_no_update(x, w, b, rm, rv, 0.3, 1e-5))
    check_export(fn, (torch.randn(4, 3, 6),))


@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_module(affine: bool) -> None:
    model = torch.nn.LayerNorm([5, 6], elementwise_affine=affine, eps=1e-3)
    if affine:
        with torch.no_grad():
            model.weight.uniform_(0.5, 1.5)
            model.bias.uniform_(-1, 1)
    check_export(model, (torch.randn(2, 3, 5, 6),))


def test_native_layer_norm_without_weight_outputs() -> None:
    check_export(
        Fn(lambda x: aten.native_layer_norm(x, [8], None, None, 1e-5)), (torch.randn(3, 4, 8) * 2 + 1,)
    )


def test_layer_norm_dynamic_batch() -> None:
    model = torch.nn.LayerNorm(8)
    dyn = {"input": {0: torch.export.Dim("b"), 1: torch.export.Dim("s")}}
    check_export(
        model,
        (torch.randn(2, 3, 8),),
        dynamic_shapes=dyn,
        run_args=[(torch.randn(4, 7, 8),)],
        opsets=(17, 26),
    )


def test_group_norm_module_dynamic_batch() -> None:
    model = torch.nn.GroupNorm(2, 6)
    with torch.no_grad():
        model.weight.uniform_(0.5, 1.5)
        model.bias.uniform_(-1, 1)
    dyn = {"input": {0: torch.export.Dim("b"), 2: torch.export.Dim("h")}}
    check_export(
        model,
        (torch.randn(2, 6, 5, 4),),
        dynamic_shapes=dyn,
        run_args=[(torch.randn(3, 6, 7, 4),)],
        opsets=(17, 21, 26),
    )


@pytest.mark.parametrize("affine", [False, True])
def test_instance_norm_modules(affine: bool) -> None:
    model = torch.nn.InstanceNorm2d(3, affine=affine)
    check_export(model, (torch.randn(2, 3, 5, 5) * 2 + 1,))


def test_instance_norm_running_stats() -> None:
    rm, rv = torch.randn(3), torch.rand(3) + 0.5
    fn = Fn(lambda x: aten.instance_norm(x, None, None, rm, rv, False, 0.1, 1e-5, False))
    check_export(fn, (torch.randn(2, 3, 5),))


@pytest.mark.parametrize("weight", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rms_norm(weight: bool, dtype: torch.dtype) -> None:
    w = (torch.rand(6) + 0.5).to(dtype) if weight else None
    fn = Fn(lambda x: torch.nn.functional.rms_norm(x, [6], w))
    tol = 1e-4 if dtype == torch.float32 else 1e-2
    check_export(fn, ((torch.randn(2, 3, 6) * 3).to(dtype),), opsets=(17, 22, 23, 26), atol=tol, rtol=tol)


def test_fused_rms_norm_outputs() -> None:
    fn = Fn(lambda x: aten._fused_rms_norm(x, [3, 4], None, 1e-6))
    check_export(fn, (torch.randn(2, 3, 4),))


def test_rms_norm_dynamic_batch_and_sequence() -> None:
    w = torch.rand(8) + 0.5
    fn = Fn(lambda x: torch.nn.functional.rms_norm(x, [8], w, 1e-6))
    dyn = (({0: torch.export.Dim("b"), 1: torch.export.Dim("s")},),)  # forward(*xs)
    check_export(
        fn,
        (torch.randn(2, 3, 8),),
        dynamic_shapes=dyn,
        run_args=[(torch.randn(3, 5, 8),)],
        opsets=(17, 23, 26),
    )
