"""Chunked kernels swapped while torch.export captures (capture/chunked_kernels.py, issue 41 part 4):
transformers' chunked gated delta rule in a form whose loop follows the length, so a linear-attention
model's file is right at every length and keeps no guard on it."""

from __future__ import annotations

import sys

import pytest
import torch
from torch.export import Dim

import fastonnx
from fastonnx.capture.chunked_kernels import KERNEL, gated_delta_rule_by_chunks, length_following_kernels

transformers = pytest.importorskip("transformers")  # a test dependency, pinned in constraints.txt
from transformers.models.qwen3_next import modeling_qwen3_next  # noqa: E402

LENGTHS = (1, 63, 64, 65, 300)  # below, at and above one chunk of 64, and several chunks


def _kernel_inputs(length: int, v_heads: int = 2) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(length)
    b, k_heads, d = 2, 1, 16
    q, k = (torch.randn(b, length, k_heads, d, generator=g) for _ in range(2))
    v = torch.randn(b, length, v_heads, d, generator=g)
    decay = -torch.rand(b, length, v_heads, generator=g)  # log-decay <= 0
    beta = torch.rand(b, length, v_heads, generator=g)
    state = torch.randn(b, v_heads, d, d, generator=g)
    return q, k, v, decay, beta, state


@pytest.mark.parametrize("length", (*LENGTHS, 130))
def test_the_form_computes_transformers_kernel(length: int) -> None:
    q, k, v, decay, beta, state = _kernel_inputs(length)
    kwargs = dict(initial_state=state, output_final_state=True, use_qk_l2norm_in_kernel=True)
    want, want_state = modeling_qwen3_next.torch_chunk_gated_delta_rule(q, k, v, decay, beta, **kwargs)
    got, got_state = gated_delta_rule_by_chunks(q, k, v, decay, beta, **kwargs)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_state, want_state)


def test_the_swap_is_undone() -> None:
    original = getattr(modeling_qwen3_next, KERNEL)
    with length_following_kernels():
        assert getattr(modeling_qwen3_next, KERNEL) is gated_delta_rule_by_chunks
        swapped = [
            m for n, m in sys.modules.items() if n.startswith("transformers.models.") and hasattr(m, KERNEL)
        ]
        assert all(getattr(m, KERNEL) is gated_delta_rule_by_chunks for m in swapped)
    assert getattr(modeling_qwen3_next, KERNEL) is original


@pytest.fixture(scope="module")
def qwen3_next() -> torch.nn.Module:
    cfg = transformers.Qwen3NextConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        linear_num_value_heads=2,
        linear_num_key_heads=1,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        num_experts=2,
        num_experts_per_tok=1,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
        use_cache=False,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = model

        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            return self.m(input_ids=input_ids).logits

    return Logits()


def test_qwen3_next_is_right_at_every_length(qwen3_next: torch.nn.Module) -> None:
    """4 tiny layers (3 linear-attention, 1 full) with dynamic batch and sequence, exported from 9
    tokens: no guard kept on the length, and the file agrees with eager PyTorch across chunk edges."""
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(0))
    result = fastonnx.to_onnx(qwen3_next, (ids,), dynamic_shapes=({0: Dim.DYNAMIC, 1: Dim.DYNAMIC},))
    assert "guards_kept" not in result.stats and "narrowed" not in result.stats, result.stats
    for length in LENGTHS:
        x = torch.randint(0, 128, (1 + length % 3, length), generator=torch.Generator().manual_seed(length))
        with torch.no_grad():
            want = qwen3_next(x)
        torch.testing.assert_close(result(x), want, msg=f"{length} tokens")
