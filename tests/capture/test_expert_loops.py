"""Mixture-of-experts blocks that loop over the experts hit (capture/expert_loops.py): captured with a
dynamic token count, they loop over every expert instead, and the file routes each token as eager does,
experts without tokens included; a fake-tensor run (the cache layout's prefill) goes through too."""

from __future__ import annotations

import pathlib

import torch
import torch.nn.functional as F
from torch.export import Dim

import fastonnx
from fastonnx.capture.expert_loops import every_expert, loops_over_hit_experts
from fastonnx.torch_internals import fake_mode_with_shape_env

HIDDEN, FFN, EXPERTS, TOP_K = 8, 16, 6, 2  # 2 tokens leave 2 experts or more without any


class HitExperts(torch.nn.Module):
    """DBRX's loop: a one-hot of a class more than the experts, each expert hit a tensor index."""

    def __init__(self) -> None:
        super().__init__()
        self.num_experts = EXPERTS
        self.w1 = torch.nn.Parameter(torch.randn(EXPERTS * FFN, HIDDEN) / 3)
        self.w2 = torch.nn.Parameter(torch.randn(EXPERTS * FFN, HIDDEN) / 3)

    def forward(
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        out = torch.zeros_like(hidden_states)
        with torch.no_grad():
            mask = F.one_hot(top_k_index, num_classes=self.num_experts + 1).permute(2, 1, 0)
            hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
        for expert_idx in hit:
            expert_idx = expert_idx[0]
            with torch.no_grad():
                slot, token = torch.where(mask[expert_idx])
            w1 = self.w1.view(-1, FFN, HIDDEN)[expert_idx]
            w2 = self.w2.view(-1, FFN, HIDDEN)[expert_idx]
            states = F.silu(hidden_states[token] @ w1.T) @ w2
            out.index_add_(0, token, states * top_k_weights[token, slot, None])
        return out


class SkippingExperts(torch.nn.Module):
    """LongCat-Flash's loop: the expert read with .item(), identity experts past the routed ones, and
    an expert without tokens skipped."""

    def __init__(self) -> None:
        super().__init__()
        self.routed = EXPERTS - 1  # the last expert is an identity
        self.gate_up = torch.nn.Parameter(torch.randn(self.routed, 2 * FFN, HIDDEN) / 3)
        self.down = torch.nn.Parameter(torch.randn(self.routed, HIDDEN, FFN) / 3)

    def forward(
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        out = torch.zeros_like(hidden_states)
        mask = F.one_hot(top_k_index, num_classes=EXPERTS).permute(2, 1, 0)
        for expert_tensor in torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero(as_tuple=False):
            expert = int(expert_tensor.item())
            slot, token = torch.where(mask[expert].squeeze(0))
            if token.numel() == 0:
                continue
            state = hidden_states[token]
            if expert < self.routed:
                gate, up = F.linear(state, self.gate_up[expert]).chunk(2, dim=-1)
                state = F.linear(F.silu(gate) * up, self.down[expert])
            out.index_add_(0, token, state * top_k_weights[token, slot, None])
        return out


class Block(torch.nn.Module):
    """A router, then the experts the way transformers' MoE blocks call them."""

    def __init__(self, experts: torch.nn.Module) -> None:
        super().__init__()
        self.router = torch.nn.Linear(HIDDEN, EXPERTS, bias=False)
        self.experts = experts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, index = torch.topk(self.router(x).softmax(-1), TOP_K, dim=-1)
        return self.experts(x, index, weights)


def _inputs(tokens: int) -> torch.Tensor:
    return torch.randn(tokens, HIDDEN, generator=torch.Generator().manual_seed(tokens))


def _check(block: Block, tmp_path: pathlib.Path) -> None:
    result = fastonnx.to_onnx(
        block, (_inputs(6),), dynamic_shapes=({0: Dim("tokens")},), filename=tmp_path / "m.onnx"
    )
    unhit = 0
    for tokens in (2, 3, 6, 40):
        x = _inputs(tokens)
        with torch.no_grad():
            index = torch.topk(block.router(x), TOP_K, dim=-1).indices
            want = block(x)
        unhit += EXPERTS - len(index.unique())
        torch.testing.assert_close(result(x), want, msg=lambda m, t=tokens: f"{t} tokens: {m}")
    assert unhit, "every expert got tokens at every size: the empty selections went unchecked"


def test_a_loop_over_the_experts_hit_by_tensor_index(tmp_path: pathlib.Path) -> None:
    torch.manual_seed(0)
    _check(Block(HitExperts()).eval(), tmp_path)


def test_a_loop_reading_the_expert_and_skipping_empty_ones(tmp_path: pathlib.Path) -> None:
    torch.manual_seed(1)
    _check(Block(SkippingExperts()).eval(), tmp_path)


def test_a_fake_tensor_run_loops_over_every_expert() -> None:
    block = Block(HitExperts()).eval()
    with torch.no_grad(), every_expert(block), fake_mode_with_shape_env():
        out = block(torch.empty(5, HIDDEN))
    assert tuple(out.shape) == (5, HIDDEN)
    assert not hasattr(HitExperts.forward, "__wrapped__")  # the forward is the class's own again


def test_only_experts_transformers_does_not_dispatch_are_swapped() -> None:
    from transformers.models.mixtral.modeling_mixtral import MixtralExperts

    assert loops_over_hit_experts(HitExperts) and loops_over_hit_experts(SkippingExperts)
    assert not loops_over_hit_experts(Block)
    assert not loops_over_hit_experts(MixtralExperts)  # use_experts_implementation's dispatch
