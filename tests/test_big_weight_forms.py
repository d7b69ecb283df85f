"""Every big-weight form streams (issue 14, section 2): weights read through a Transpose of any rank are
stored permuted (mixture-of-experts models: no Transpose of an initializer left in the graph), and
weights that are not on the CPU are copied to the host one tensor at a time while the file is written."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import onnx
import pytest
import torch

import fastonnx
import model_zoo

LEVELS = [True, "onnxruntime"]


def _nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node of the graph and of its subgraphs (Loop / If bodies read outer weights by name)."""
    for n in graph.node:
        yield n
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from _nodes(a.g)
            for g in a.graphs:
                yield from _nodes(g)


def _transposed_initializers(model: onnx.ModelProto) -> list[str]:
    """Initializers some Transpose node reads (what onnxruntime would permute at run time)."""
    names = {i.name for i in model.graph.initializer}
    return [n.input[0] for n in _nodes(model.graph) if n.op_type == "Transpose" and n.input[0] in names]


def _export_and_run(
    model: torch.nn.Module, args: tuple[torch.Tensor, ...], level: object, path: Path
) -> tuple[onnx.ModelProto, object]:
    """Exported to `path` with the weights in external data (the streaming writer's path), run from the
    file in onnxruntime."""
    result = fastonnx.to_onnx(model, args, filename=path, optimize=level, external_data=True)
    assert result.stats["optimize"]["weights_transposed"] >= 1
    proto = onnx.load(str(path), load_external_data=False)
    return proto, result(*args)


@pytest.mark.parametrize("level", LEVELS)
def test_mixtral_experts_are_stored_permuted(tmp_path: Path, level: object) -> None:
    # transformers' grouped experts read each layer's [experts, out, in] weights as
    # weight.transpose(-2, -1) (integrations/moe.py, _grouped_linear): a Transpose of a 3-D initializer
    model, args = model_zoo.causal_lm(
        "mixtral", "MixtralForCausalLM", num_local_experts=4, num_experts_per_tok=2
    )
    captured = torch.export.export(model, args, strict=False)
    before = fastonnx.to_onnx(captured, args, optimize=False).model_proto
    experts = [n for n in _transposed_initializers(before) if ".experts." in n]
    assert len(experts) == 4, experts  # gate_up_proj and down_proj of 2 layers: the case exists

    proto, got = _export_and_run(model, args, level, tmp_path / "mixtral.onnx")
    assert _transposed_initializers(proto) == []
    permuted = {tuple(i.dims) for i in proto.graph.initializer if len(i.dims) == 3}
    cfg = model.m.config
    assert (4, cfg.hidden_size, 2 * cfg.intermediate_size) in permuted  # [experts, in, out]
    with torch.no_grad():
        want = model(*args)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


class BatchedExperts(torch.nn.Module):
    """Dense mixture of experts written the three ways batched weights are read transposed: bmm with
    ``w.transpose(-1, -2)``, a ``transpose(1, 2)`` then matmul, and einsum; plus a 4-D weight read
    through a general permutation."""

    def __init__(self, experts: int = 3, hidden: int = 40, inner: int = 72) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.up = torch.nn.Parameter(torch.randn(experts, inner, hidden, generator=g) / hidden**0.5)
        self.gate = torch.nn.Parameter(torch.randn(experts, inner, hidden, generator=g) / hidden**0.5)
        self.down = torch.nn.Parameter(torch.randn(experts, hidden, inner, generator=g) / inner**0.5)
        # [heads, hidden, experts, 8] read as [experts, heads, 8, hidden]
        self.mix = torch.nn.Parameter(torch.randn(2, hidden, experts, 8, generator=g) / hidden**0.5)
        self.router = torch.nn.Linear(hidden, experts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xe = x.unsqueeze(0).expand(self.up.shape[0], -1, -1)  # (E, T, H)
        up = torch.bmm(xe, self.up.transpose(-1, -2))
        gate = torch.matmul(xe, self.gate.transpose(1, 2))
        h = torch.nn.functional.silu(gate) * up
        y = torch.einsum("eti,ehi->eth", h, self.down)  # (E, T, H)
        probs = torch.softmax(self.router(x), dim=-1)  # (T, E)
        mixed = torch.einsum("te,eth->th", probs, y)
        extra = torch.matmul(x, self.mix.permute(2, 0, 3, 1).reshape(-1, 16, x.shape[-1]).sum(1).T)
        return mixed + extra.sum(-1, keepdim=True)


@pytest.mark.parametrize("level", LEVELS)
def test_batched_weights_read_transposed_are_stored_permuted(tmp_path: Path, level: object) -> None:
    model = BatchedExperts().eval()
    x = torch.randn(5, 40, generator=torch.Generator().manual_seed(1))
    captured = torch.export.export(model, (x,), strict=False)
    before = fastonnx.to_onnx(captured, (x,), optimize=False).model_proto
    assert len(_transposed_initializers(before)) >= 3

    proto, got = _export_and_run(model, (x,), level, tmp_path / "experts.onnx")
    assert _transposed_initializers(proto) == []
    with torch.no_grad():
        want = model(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
