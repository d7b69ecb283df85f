"""Training under torch.compile(backend="fastonnx"): the forward and the backward graph both run in
onnxruntime, and three optimizer steps give eager's losses, gradients and weights."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch

import fastonnx
from model_zoo import MLP, tiny_llama

# float32 gradients through a few layers: onnxruntime sums in another order than eager
ATOL, RTOL = 1e-5, 1e-4


def _mlp() -> tuple[torch.nn.Module, Callable[[torch.nn.Module], torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    x, target = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
    torch.manual_seed(0)
    return MLP(), lambda m: torch.nn.functional.mse_loss(m(x), target)


def _llama() -> tuple[torch.nn.Module, Callable[[torch.nn.Module], torch.Tensor]]:
    ids = torch.randint(3, 256, (2, 12), generator=torch.Generator().manual_seed(0))

    def loss(m: torch.nn.Module) -> torch.Tensor:
        logits = m(input_ids=ids).logits
        return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 256), ids[:, 1:].reshape(-1))

    return tiny_llama().train(), loss


MODELS = {"mlp": _mlp, "tiny_llama": _llama}
OPTIMIZERS: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-2),
}


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("name", sorted(MODELS))
def test_three_steps_match_eager(name: str, optimizer: str) -> None:
    torch._dynamo.reset()
    eager, loss_of = MODELS[name]()
    model = copy.deepcopy(eager)
    backend = fastonnx.backend()
    compiled = torch.compile(model, backend=backend)
    opt_eager = OPTIMIZERS[optimizer](eager.parameters())
    opt = OPTIMIZERS[optimizer](model.parameters())
    for step in range(3):
        expected = loss_of(eager)
        got = loss_of(compiled)
        torch.testing.assert_close(
            got, expected, atol=ATOL, rtol=RTOL, msg=lambda m, s=step: f"step {s}: {m}"
        )
        expected.backward()
        got.backward()
        for (pname, p), q in zip(model.named_parameters(), eager.parameters(), strict=True):
            assert p.grad is not None, f"step {step}: no gradient for {pname}"
            assert q.grad is not None
            torch.testing.assert_close(
                p.grad,
                q.grad,
                atol=ATOL,
                rtol=RTOL,
                msg=lambda m, s=step, n=pname: f"step {s}, grad of {n}: {m}",
            )
        opt_eager.step()
        opt.step()
        opt_eager.zero_grad()
        opt.zero_grad()
    # AdamW divides by sqrt(v): a weight whose gradients are ~1e-9 moves by O(lr) in a direction set by
    # float32 rounding noise; 1e-4 is 1% of its lr (1e-2), far below one wrong step
    weight_atol = 1e-4 if optimizer == "adamw" else ATOL
    for p, q in zip(model.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=weight_atol, rtol=RTOL)
    kinds = {s.name.rsplit("_", 1)[-1] for s in backend.stats}
    assert kinds == {"forward", "backward"}, [s.name for s in backend.stats]
    for s in backend.stats:
        assert not s.fell_back, f"{s.name} fell back: {s.reason}"
