"""Training under torch.compile(backend="fastonnx"): the forward and the backward graph both run in
onnxruntime, and three optimizer steps give eager's losses, gradients and weights."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch

import fastonnx
from support.model_zoo import MLP, SmallCNN, tiny_llama

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


def _cnn() -> tuple[torch.nn.Module, Callable[[torch.nn.Module], torch.Tensor]]:
    # convolutions, BatchNorm in training mode (batch statistics, running stats updated), max / avg pooling
    g = torch.Generator().manual_seed(0)
    x, labels = torch.randn(4, 3, 16, 16, generator=g), torch.randint(0, 10, (4,), generator=g)
    torch.manual_seed(0)
    model = SmallCNN().train()
    for m in model.modules():
        if isinstance(m, torch.nn.Conv2d) and m.bias is not None:
            # each conv feeds a BatchNorm, which cancels its bias: a zero gradient, whose rounding noise
            # AdamW would turn into O(lr) steps (and shifted running means); frozen, as it changes nothing
            m.bias.requires_grad_(False)
    return model, lambda m: torch.nn.functional.cross_entropy(m(x), labels)


MODELS = {"mlp": _mlp, "tiny_llama": _llama, "small_cnn": _cnn}
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
    names = [n for n, _ in model.named_parameters()]
    # parameters whose true gradient is 0 (a conv bias before BatchNorm): only rounding noise flows
    noise_only: set[str] = set()
    for step in range(3):
        expected = loss_of(eager)
        got = loss_of(compiled)
        torch.testing.assert_close(
            got, expected, atol=ATOL, rtol=RTOL, msg=lambda m, s=step: f"step {s}: {m}"
        )
        expected.backward()
        got.backward()
        for (pname, p), q in zip(model.named_parameters(), eager.parameters(), strict=True):
            if not q.requires_grad:
                assert p.grad is None and q.grad is None
                continue
            assert p.grad is not None, f"step {step}: no gradient for {pname}"
            assert q.grad is not None
            torch.testing.assert_close(
                p.grad,
                q.grad,
                atol=ATOL,
                rtol=RTOL,
                msg=lambda m, s=step, n=pname: f"step {s}, grad of {n}: {m}",
            )
        noise_only.update(
            n
            for n, q in zip(names, eager.parameters())
            if q.grad is not None and float(q.grad.abs().max()) < 1e-6
        )
        opt_eager.step()
        opt.step()
        opt_eager.zero_grad()
        opt.zero_grad()
    # AdamW divides by sqrt(v): a weight whose gradients are ~1e-9 moves by O(lr) in a direction set by
    # float32 rounding noise; 1e-4 is 1% of its lr (1e-2), far below one wrong step
    weight_atol = 1e-4 if optimizer == "adamw" else ATOL
    for (pname, p), q in zip(model.named_parameters(), eager.parameters(), strict=True):
        if optimizer == "adamw" and pname in noise_only:
            continue  # AdamW normalises a zero gradient's rounding noise (~1e-9) into O(lr) steps
        torch.testing.assert_close(p, q, atol=weight_atol, rtol=RTOL)
    for b, c in zip(model.buffers(), eager.buffers(), strict=True):  # BatchNorm's running statistics
        torch.testing.assert_close(b, c, atol=ATOL, rtol=RTOL)
    kinds = {s.name.rsplit("_", 1)[-1] for s in backend.stats}
    assert kinds == {"forward", "backward"}, [s.name for s in backend.stats]
    for s in backend.stats:
        assert not s.fell_back, f"{s.name} fell back: {s.reason}"
