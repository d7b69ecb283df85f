"""What torch.export returns is not purely functional: in-place ops, view writes, buffer mutation,
odd outputs. Each case is compared with eager PyTorch."""

from __future__ import annotations

import torch

import fastonnx
from support.export_check import ENDS, check_export


class InplaceRelu(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        y.relu_()
        return y + 1


def test_inplace_relu_is_rebound() -> None:
    check_export(InplaceRelu(), (torch.randn(3, 4),), opsets=ENDS)


class ColumnWrite(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.clone()
        y[:, 0] = 3.5
        return y * 2


def test_write_through_select_view() -> None:
    check_export(ColumnWrite(), (torch.randn(3, 4),), opsets=ENDS)


class IndexAccumulate(torch.nn.Module):
    def forward(self, x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        y = x.clone()
        y[1] += v
        return y


def test_index_add_in_place() -> None:
    check_export(IndexAccumulate(), (torch.randn(3, 4), torch.randn(4)), opsets=ENDS)


class Counter(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count.add_(1)
        return x + self.count


def test_buffer_mutation_becomes_extra_output() -> None:
    model = Counter().eval()
    x = torch.randn(2)
    ep = torch.export.export(model, (x,), strict=False)
    result = fastonnx.to_onnx(ep, (x,))
    assert "mutated.count" in result.output_names
    # the walker writes the buffer itself: no re-trace by torch's functionalization
    assert "functionalized" not in result.stats
    sess = result.session()
    feeds = {result.input_names[0]: x.numpy()}
    got, updated = sess.run(None, feeds)
    torch.testing.assert_close(torch.from_numpy(got), x + 1)
    torch.testing.assert_close(torch.from_numpy(updated), torch.ones(2))


class OddOutputs(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(3))

    def forward(self, x: torch.Tensor) -> tuple:
        y = x + 1
        return x, y, y, None, x.shape[0], self.w


def test_odd_outputs() -> None:
    model = OddOutputs().eval()
    x = torch.randn(4, 3)
    result = fastonnx.to_onnx(model, (x,))
    got = result(x)
    expected = model(x)
    assert got[3] is None and got[4] == 4
    for i in (0, 1, 2, 5):
        torch.testing.assert_close(got[i], expected[i])
    assert len(set(result.output_names)) == len(result.output_names)


class SetGrad(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            y = x.sin()
        return y * 2


def test_set_grad_enabled_is_inlined() -> None:
    check_export(SetGrad(), (torch.randn(3),), opsets=ENDS)


def test_training_mode_is_reported() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Dropout(p=0.0))
    model.train()
    x = torch.randn(2, 3)
    import pytest

    with pytest.warns(UserWarning, match="training mode: it is exported as traced, with Dropout"):
        result = fastonnx.to_onnx(model, (x,))
    assert result.stats["training_mode"] is True
    torch.testing.assert_close(result(x), model(x))


class MutateInputAndReturnIt(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(2)
        return x


def test_input_mutated_in_place_and_returned() -> None:
    x = torch.randn(3, 4)
    result = fastonnx.to_onnx(MutateInputAndReturnIt(), (x.clone(),))
    # the user's output, then the mutated input as its own output
    assert len(result.output_names) == 2 and result.output_names[1] == "mutated.x"
    torch.testing.assert_close(result(x.clone()), x * 2)
    session = result.session()
    outs = session.run(None, {result.input_names[0]: x.numpy()})
    torch.testing.assert_close(torch.from_numpy(outs[1]), x * 2)
