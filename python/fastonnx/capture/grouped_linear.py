"""transformers' grouped linear over experts' weights as stored, captured as one op.

transformers' ``grouped_mm`` experts (``integrations/moe.py``) store each projection's weights as
(experts, out, in) and multiply by ``weight.transpose(-2, -1)``: captured as it is, the graph transposes
the whole stacked tensor before the routed product. Where the weights are in memory the optimizer
pre-transposes them, but a package references them in the checkpoint, and onnxruntime does not fold a
transpose over 1 GiB: a Qwen3.5-35B-A3B layer's 2 GiB of experts were transposed at every decode step
(benches/moe_vs_builder.py). While capturing, ``_grouped_linear`` with stored weights (not
``is_transposed``) becomes the custom op ``fastonnx::grouped_linear_stored(input, weight, offs)``,
whose converter reads each routed expert's weight through ``Gemm(transB=1)`` (converters/third_party.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor


@torch.library.custom_op("fastonnx::grouped_linear_stored", mutates_args=())
def grouped_linear_stored(input: Tensor, weight: Tensor, offs: Tensor) -> Tensor:
    """Rows of ``input`` (S, K) sorted by expert, expert ``e`` owning rows offs[e-1]:offs[e], each
    block times weight[e].T (weight (E, N, K)); rows past offs[-1] are zeros."""
    # eager only (tests, ep.module()): transformers' own fallback on the transposed view
    out: Tensor = torch.ops.transformers.grouped_mm_fallback(input, weight.transpose(-2, -1), offs=offs)
    return out


@grouped_linear_stored.register_fake
def _(input: Tensor, weight: Tensor, offs: Tensor) -> Tensor:
    return input.new_empty(input.shape[0], weight.shape[1])


@contextlib.contextmanager
def stored_grouped_linear() -> Iterator[None]:
    """While active, transformers' ``_grouped_linear`` of stored (not transposed) weights without bias
    in float32 calls ``fastonnx::grouped_linear_stored``; the others keep transformers' code."""
    try:
        from transformers.integrations import moe
    except ImportError:  # a transformers without grouped experts: nothing to swap
        yield
        return
    original = getattr(moe, "_grouped_linear", None)
    if original is None:
        yield
        return

    def swapped(
        input: Tensor, weight: Tensor, offs: Tensor, bias: Tensor | None = None, is_transposed: bool = False
    ) -> Any:
        if is_transposed or weight.dim() != 3 or input.dtype != weight.dtype:
            return original(input, weight, offs, bias=bias, is_transposed=is_transposed)
        out = torch.ops.fastonnx.grouped_linear_stored(input, weight, offs)
        return out + bias if bias is not None else out

    moe._grouped_linear = swapped
    try:
        yield
    finally:
        moe._grouped_linear = original
