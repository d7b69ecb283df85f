"""The package check's reference sorts ties as the graph does (pretrained/stable_sorts.py): under
StableSorts an unstable sort of values with ties gives onnxruntime's order, every form of the call."""

from __future__ import annotations

import pathlib

import onnxruntime as ort
import pytest
import torch

import fastonnx
from fastonnx.pretrained.stable_sorts import StableSorts


class _MaskOrder(torch.nn.Module):
    """PP-DocLayout V2's box order: an unstable argsort of a 0/1 mask, ties in every row."""

    def __init__(self, descending: bool) -> None:
        super().__init__()
        self.descending = descending

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mask = (x > 0).int()
        return torch.argsort(mask, dim=1, descending=self.descending), mask.sort(1, self.descending)[1]


@pytest.mark.parametrize("descending", [True, False])
def test_the_graph_sorts_ties_as_the_stable_reference(descending: bool, tmp_path: pathlib.Path) -> None:
    x = torch.randn(3, 40, generator=torch.Generator().manual_seed(0))
    model = _MaskOrder(descending)
    fastonnx.to_onnx(model, (x,), filename=str(tmp_path / "m.onnx"))
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    with StableSorts():
        expected = model(x)
    for e, g in zip(expected, got, strict=True):
        torch.testing.assert_close(torch.from_numpy(g), e, rtol=0, atol=0)


def test_every_form_of_the_call_is_stable() -> None:
    x = torch.tensor([[1, 0, 1, 0, 1, 0]])
    first = torch.tensor([[0, 2, 4, 1, 3, 5]])  # equal values in their order: the stable result
    with StableSorts():
        assert torch.equal(torch.argsort(x, 1, True), first)
        assert torch.equal(torch.argsort(x, dim=1, descending=True), first)
        assert torch.equal(x.argsort(1, True), first)
        assert torch.equal(torch.sort(x, 1, True).indices, first)
        assert torch.equal(x.sort(dim=1, descending=True)[1], first)
        assert torch.equal(x.sort(1)[1], torch.tensor([[1, 3, 5, 0, 2, 4]]))
