"""Kernels that loop over chunks of the sequence, swapped while torch.export captures for forms whose loop
follows the length: the ONNX file is then right at every length, with no guard on it.

transformers' ``torch_chunk_gated_delta_rule`` (Qwen3-Next, Qwen3.5, Qwen3.5-MoE, OLMo-Hybrid... linear
attention) pads the sequence to a multiple of the chunk size with ``(C - L % C) % C`` and runs a Python
loop over ``L // C`` chunks. Under torch.export the loop is unrolled to the example's chunk count and the
padding leaves guards (the program is right for 2..64 tokens only, guards.py refuses it), and the
triangular solve is replaced by a 63-step forward substitution (a capture of minutes).

The form swapped in (``gated_delta_rule_by_chunks``) computes the same function:

- it always pads, ``2 C - L % C`` positions (C + 1 to 2 C), so there are ``L // C + 2`` chunks, an
  expression torch proves without a guard, and never fewer than 2 (torch specialises a loop whose
  example trip count is 1); padded positions have zero keys, values and beta and zero log-decay, so they
  leave the state as it is, and their outputs are dropped (one chunk of zeros more than needed: the
  price of no guard);
- the unit lower-triangular system of each chunk, ``(I + N) x = b`` with ``N`` strictly lower (so
  ``N**C = 0``), is solved with its inverse as a product of ``log2(C)`` factors,
  ``(I - N)(I + N**2)(I + N**4)...``: six batched matmuls for C = 64 instead of 63 sequential steps;
- the sequential part, the state carried from chunk to chunk, is a ``scan`` over the chunks (an ONNX
  ``Scan`` whose trip count is the chunk count).

Only the functions of transformers' modules already imported are swapped, for the duration of the
capture, under the capture's lock.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

from fastonnx.torch_internals import scan

KERNEL = "torch_chunk_gated_delta_rule"
"""The name of transformers' chunked kernel in each of its linear-attention modeling modules."""


@contextlib.contextmanager
def length_following_kernels() -> Iterator[None]:
    """While active, every loaded ``transformers.models.*`` module's chunked gated delta rule is
    ``gated_delta_rule_by_chunks``."""
    swapped: list[tuple[Any, Any]] = []
    for name, module in list(sys.modules.items()):
        if name.startswith("transformers.models.") and callable(getattr(module, KERNEL, None)):
            swapped.append((module, getattr(module, KERNEL)))
            setattr(module, KERNEL, gated_delta_rule_by_chunks)
    try:
        yield
    finally:
        for module, original in swapped:
            setattr(module, KERNEL, original)


def gated_delta_rule_by_chunks(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    chunk_size: int = 64,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """transformers' chunked gated delta rule (same arguments and results: query / key ``[B, L, Hk, Dk]``,
    value ``[B, L, Hv, Dv]``, log-decay ``g`` and ``beta`` ``[B, L, Hv]``; the output ``[B, L, Hv, Dv]`` and
    the state ``[B, Hv, Dk, Dv]``), in the guard-free form of this module's docstring."""
    dtype = query.dtype
    length = query.shape[1]
    heads = value.shape[-2]
    if key.shape[-2] != heads:  # grouped value heads: each key head serves consecutive value heads
        query = query.repeat_interleave(heads // key.shape[-2], dim=2)
        key = key.repeat_interleave(heads // key.shape[-2], dim=2)
    query, key, value, beta, g = (x.transpose(1, 2).float() for x in (query, key, value, beta, g))
    if use_qk_l2norm_in_kernel:
        query, key = _l2norm(query), _l2norm(key)
    query = query * query.shape[-1] ** -0.5
    # always two chunks more than L // C (C + 1 to 2 C padded positions): n * C - L needs no Mod, the
    # padded length n * C is what torch proves the chunks' reshape and the final split against, and n is
    # at least 2 whatever the example's length (a scan over a trip count of 1 is specialised to 1)
    n = length // chunk_size + 2
    pad = n * chunk_size - length
    query, key, value = (F.pad(x, (0, 0, 0, pad)) for x in (query, key, value))
    beta, g = (F.pad(x, (0, pad)) for x in (beta, g))
    chunked = _intra_chunk(query, key, value, beta, g, n, chunk_size)
    state = (
        torch.zeros(
            *value.shape[:2], key.shape[-1], value.shape[-1], dtype=torch.float32, device=value.device
        )
        if initial_state is None
        else initial_state.float()
    )
    state, out = scan(_chunk_step, state, chunked)  # over the chunks: dim 0 of each of ``chunked``
    out = out.movedim(0, 2).flatten(2, 3).split([length, pad], dim=2)[0]  # a split: no guard on L
    out = out.transpose(1, 2).to(dtype)
    return out, (state if output_final_state else None)


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    # as transformers' l2norm (and the FLA library's): eps inside the root
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + 1e-6)


def _intra_chunk(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor,
    n: Any,
    c: int,
) -> tuple[torch.Tensor, ...]:
    """What each chunk computes on its own, every chunk at once, chunk-major for the scan: the values
    and decayed keys the UT transform gives, the queries and keys decayed, the intra-chunk attention,
    the chunk's total decay."""

    def chunks(x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], x.shape[1], n, c, x.shape[-1])

    k_beta = chunks(key * beta.unsqueeze(-1))
    v_beta = chunks(value * beta.unsqueeze(-1))
    query, key = chunks(query), chunks(key)
    cum = g.reshape(g.shape[0], g.shape[1], n, c).cumsum(dim=3)
    upper = torch.ones(c, c, dtype=torch.bool, device=query.device).triu(1)
    pairwise = (cum.unsqueeze(4) - cum.unsqueeze(3)).masked_fill(upper, float("-inf")).exp()
    lower = ((k_beta @ key.transpose(-1, -2)) * pairwise).tril(-1)
    inverse = _unit_lower_inverse(lower, c)
    new_values = inverse @ v_beta
    k_cumdecay = inverse @ (k_beta * cum.exp().unsqueeze(-1))
    attn = (query @ key.transpose(-1, -2)) * pairwise
    query = query * cum.exp().unsqueeze(-1)
    key = key * (cum[..., -1:] - cum).exp().unsqueeze(-1)
    decay = cum[..., -1].exp()[..., None, None]
    return tuple(x.movedim(2, 0) for x in (new_values, k_cumdecay, query, key, attn, decay))


def _unit_lower_inverse(lower: torch.Tensor, c: int) -> torch.Tensor:
    """``(I + lower)^-1`` for a strictly lower-triangular ``lower`` of size ``c``: with ``M = -lower``,
    ``M**c = 0`` and ``(I + M)(I + M**2)...(I + M**(2**(m-1))) = I + M + ... + M**(2**m - 1)``."""
    eye = torch.eye(c, dtype=lower.dtype, device=lower.device)
    power = -lower
    inverse = eye + power
    for _ in range(math.ceil(math.log2(c)) - 1):
        power = power @ power
        inverse = inverse + inverse @ power
    return inverse


def _chunk_step(state: torch.Tensor, chunk: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk: its output from the state carried in (inter-chunk) and its own attention, and the
    state carried out."""
    new_values, k_cumdecay, query, key, attn, decay = chunk
    v_new = new_values - k_cumdecay @ state
    out = query @ state + attn @ v_new
    return state * decay + key.transpose(-1, -2) @ v_new, out
