"""The float64 referee of a one-graph package check (pretrained/float64_referee.py): a value torch's own
float32 forward gets wrong past the tolerances passes when the graph's is no further from float64 eager,
and fails when it is."""

from __future__ import annotations

import torch

from fastonnx.diagnostics.verdicts import compare
from fastonnx.pretrained.float64_referee import referee


class _IllConditioned(torch.nn.Module):
    """A reciprocal of a difference of nearly equal sums: float32's rounding of the sums is amplified
    ~1e4 times, as DepthPro's depth from a small inverse depth at random tiny weights."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.linspace(0.5, 1.5, 64))

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        s = (x * self.w).sum(-1, keepdim=True)
        return {"depth": 1.0 / (s - s.detach().double().round().to(s.dtype) + 1e-3) * x[..., :4]}


def _forward(m: torch.nn.Module, feeds: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        return dict(m(**feeds))


def _case() -> tuple[torch.nn.Module, dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    model = _IllConditioned()
    x = torch.rand(8, 64, generator=torch.Generator().manual_seed(0)) * 100
    feeds = {"x": x}
    expected = _forward(model, feeds)["depth"]
    exact = _forward(model.double(), {"x": x.double()})["depth"]
    model.float()
    assert not torch.allclose(expected.double(), exact, atol=1e-4, rtol=1e-3)  # float32 is off
    return model, feeds, expected, exact


def test_a_graph_closer_to_float64_than_torch_passes() -> None:
    model, feeds, expected, exact = _case()
    graph = exact.float()  # as exact as float32 holds it
    infos = [compare("depth", expected, graph)]
    assert not infos[0].passed
    judged = referee(infos, model, feeds, {"depth": expected}, {"depth": graph}, _forward, None)
    assert judged[0].passed
    assert "against float64 eager" in judged[0].note


def test_a_graph_further_from_float64_than_torch_fails() -> None:
    model, feeds, expected, exact = _case()
    graph = expected + (expected - exact.float()) * 3  # three times torch's own error, past it
    infos = [compare("depth", expected, graph)]
    judged = referee(infos, model, feeds, {"depth": expected}, {"depth": graph}, _forward, None)
    assert not judged[0].passed
    assert "further from the exact answer" in judged[0].note


def test_no_room_for_the_float64_copy_keeps_the_failure() -> None:
    model, feeds, expected, exact = _case()
    graph = exact.float()
    infos = [compare("depth", expected, graph)]
    judged = referee(infos, model, feeds, {"depth": expected}, {"depth": graph}, _forward, 1)
    assert not judged[0].passed
    assert "would not fit" in judged[0].note


def test_a_passing_check_runs_no_referee() -> None:
    def never(m: torch.nn.Module, feeds: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        raise AssertionError("the referee ran")

    value = torch.ones(3)
    infos = [compare("v", value, value)]
    assert referee(infos, torch.nn.Linear(1, 1), {}, {"v": value}, {"v": value}, never, None) == infos
