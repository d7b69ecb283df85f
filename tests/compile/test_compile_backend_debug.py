"""backend="fastonnx_debug": graphs run in onnx's reference evaluator, checked against torch as they
run, dumped for inspection."""

from __future__ import annotations

from typing import Any

import onnx
import pytest
import torch

import fastonnx
from support.model_zoo import MLP, SmallCNN, with_calibrated_batchnorm

ATOL, RTOL = 1e-5, 1e-4


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    torch._dynamo.reset()


@pytest.mark.parametrize("name", ["mlp", "small_cnn"])
def test_matches_eager_and_dumps(tmp_path, name: str) -> None:
    if name == "mlp":
        model, x = MLP().eval(), torch.randn(4, 16)
    else:
        model, x = with_calibrated_batchnorm(SmallCNN(), 16), torch.randn(2, 3, 16, 16)
    backend = fastonnx.debug_backend(check=True, dump_dir=tmp_path)
    with torch.no_grad():
        got = torch.compile(model, backend=backend)(x)
        expected = model(x)
    assert float(expected.abs().max()) > 1e-2
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=RTOL)
    assert [s.fell_back for s in backend.stats] == [False]
    path = backend.stats[0].path
    assert path is not None and path.startswith(str(tmp_path))
    onnx.checker.check_model(onnx.load(path), full_check=True)


def test_training_graphs_run_in_the_evaluator() -> None:
    model, x = MLP(), torch.randn(4, 16)
    eager = MLP()
    eager.load_state_dict(model.state_dict())
    backend = fastonnx.debug_backend(check=True)
    torch.compile(model, backend=backend)(x).square().mean().backward()
    eager(x).square().mean().backward()
    for p, q in zip(model.parameters(), eager.parameters(), strict=True):
        assert p.grad is not None and q.grad is not None
        torch.testing.assert_close(p.grad, q.grad, atol=ATOL, rtol=RTOL)
    assert sorted(s.name for s in backend.stats) == ["graph_1_backward", "graph_1_forward"]


def test_divergence_names_the_graph() -> None:
    def wrong_relu(ctx: Any, x: Any) -> str:
        return ctx.op("Abs", x)  # a deliberately wrong converter: the check must catch it

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * 2

    backend = fastonnx.debug_backend(check=True, custom_converters={torch.ops.aten.relu.default: wrong_relu})
    with pytest.raises(Exception, match="graph_1_inference diverges from torch at output 0") as info:
        torch.compile(f, backend=backend)(torch.randn(5) - 10)
    assert isinstance(info.value, fastonnx.RuntimeCheckError)
