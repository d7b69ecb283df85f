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
from support import model_zoo

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
def test_mixtral_experts_are_read_as_stored(tmp_path: Path, level: object) -> None:
    # transformers' grouped experts read each layer's [experts, out, in] weights as
    # weight.transpose(-2, -1) (integrations/moe.py, _grouped_linear): a Transpose of a 3-D initializer
    # in a program torch.export captured by itself; to_onnx captures that product as one op reading
    # each routed expert's weight as stored (capture/grouped_linear.py): no Transpose, none permuted
    model, args = model_zoo.causal_lm(
        "mixtral", "MixtralForCausalLM", num_local_experts=4, num_experts_per_tok=2
    )
    captured = torch.export.export(model, args, strict=False)
    before = fastonnx.to_onnx(captured, args, optimize=False).model_proto
    experts = [n for n in _transposed_initializers(before) if ".experts." in n]
    assert len(experts) == 4, experts  # gate_up_proj and down_proj of 2 layers: the case exists

    path = tmp_path / "mixtral.onnx"
    result = fastonnx.to_onnx(model, args, filename=path, optimize=level, external_data=True)
    proto = onnx.load(str(path), load_external_data=False)
    assert _transposed_initializers(proto) == []
    stacked = {tuple(i.dims) for i in proto.graph.initializer if len(i.dims) == 3}
    cfg = model.m.config
    h, i = cfg.hidden_size, cfg.intermediate_size
    assert {(4, 2 * i, h), (4, h, i)} <= stacked  # [experts, out, in], as transformers stores them
    with torch.no_grad():
        want = model(*args)
    torch.testing.assert_close(result(*args), want, rtol=1e-5, atol=1e-5)


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


# ---- weights off the CPU ------------------------------------------------------------------------------


class OnDevice(torch.Tensor):
    """A CPU tensor that says it lives on a GPU, and logs each copy to the host (this machine has no
    GPU: the exporter sees a device tensor and must copy it through ``.to("cpu")``)."""

    copies: list[tuple[int, ...]] = []

    @staticmethod
    def __new__(cls, t: torch.Tensor) -> OnDevice:
        return t.detach().as_subclass(cls)

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return torch.device("cuda", 0)

    def to(self, *args: object, **kwargs: object) -> torch.Tensor:  # type: ignore[override]
        OnDevice.copies.append(tuple(self.shape))
        # a real copy: what a GPU tensor's .to("cpu") makes
        return self.as_subclass(torch.Tensor).clone()


class Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(24, 64)
        self.b = torch.nn.Linear(64, 8)
        self.register_buffer("shift", torch.randn(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x))) + self.shift


def _on_device(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.export.ExportedProgram, int]:
    """The model's program with every weight an OnDevice tensor, and how many weights there are."""
    captured = torch.export.export(model, (x,), strict=False)
    for key in captured.state_dict:
        captured.state_dict[key] = OnDevice(captured.state_dict[key])
    return captured, len(captured.state_dict)


@pytest.mark.parametrize("level", [False, *LEVELS])
def test_device_weights_are_copied_to_the_host_one_at_a_time_while_written(
    tmp_path: Path, level: object
) -> None:
    model, x = Mlp().eval(), torch.randn(3, 24)
    with torch.no_grad():
        want = model(x)
    captured, n = _on_device(model, x)
    OnDevice.copies.clear()
    result = fastonnx.to_onnx(captured, (x,), optimize=level)
    assert OnDevice.copies == []  # converted and optimized without touching the device's memory
    torch.testing.assert_close(result(x), want, rtol=1e-6, atol=1e-6)
    # building the session wrote the model: each weight copied once, the biggest (64, 24) among them
    assert len(OnDevice.copies) == n and (64, 24) in OnDevice.copies

    OnDevice.copies.clear()
    path = tmp_path / "mlp.onnx"
    fastonnx.to_onnx(captured, (x,), filename=path, optimize=level, external_data=True)
    assert len(OnDevice.copies) == n
    import onnxruntime

    sess = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (got,) = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})
    torch.testing.assert_close(torch.from_numpy(got), want, rtol=1e-6, atol=1e-6)


def test_a_failing_host_copy_names_the_problem(tmp_path: Path) -> None:
    model, x = Mlp().eval(), torch.randn(3, 24)
    captured, _ = _on_device(model, x)

    class Lost(OnDevice):
        def to(self, *args: object, **kwargs: object) -> torch.Tensor:  # type: ignore[override]
            raise RuntimeError("CUDA error: device lost")

    captured.state_dict["a.weight"] = Lost(captured.state_dict["a.weight"])
    path = tmp_path / "lost.onnx"
    with pytest.raises(fastonnx.FastOnnxError, match="copying a weight to the host failed.*device lost"):
        fastonnx.to_onnx(captured, (x,), filename=path, external_data=True)
    assert not path.exists()


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_every_device_here(tmp_path: Path, device: str) -> None:
    """cpu: weights borrowed in place, no copy; meta: no bytes, the deferred path (attach_weights)."""
    real, x = Mlp().eval(), torch.randn(3, 24)
    with torch.no_grad():
        want = real(x)
    with torch.device(device):
        model = Mlp().eval()
    if device == "cpu":
        model.load_state_dict(real.state_dict())
    path = tmp_path / f"{device}.onnx"
    result = fastonnx.to_onnx(model, (x.to(device),), filename=path, external_data=True)
    if device == "meta":
        assert result.stats["deferred_weights"] == 5
        assert fastonnx.attach_weights(path, real) == 5
    import onnxruntime

    sess = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (got,) = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})
    torch.testing.assert_close(torch.from_numpy(got), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("level", LEVELS)
def test_device_expert_weights_are_permuted_as_they_are_copied(tmp_path: Path, level: object) -> None:
    model = BatchedExperts().eval()
    x = torch.randn(5, 40, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(x)
    captured, n = _on_device(model, x)
    OnDevice.copies.clear()
    path = tmp_path / "experts.onnx"
    result = fastonnx.to_onnx(captured, (x,), filename=path, optimize=level, external_data=True)
    assert result.stats["optimize"]["weights_transposed"] >= 3
    assert _transposed_initializers(onnx.load(str(path), load_external_data=False)) == []
    # each weight copied once, permuted from that one host copy
    assert sorted(OnDevice.copies) == sorted(tuple(t.shape) for t in captured.state_dict.values())
    assert len(OnDevice.copies) == n
    import onnxruntime

    sess = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (got,) = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})
    torch.testing.assert_close(torch.from_numpy(got), want, rtol=1e-5, atol=1e-5)
