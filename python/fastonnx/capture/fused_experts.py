"""transformers' routed experts as one op for onnxruntime's ``MoE`` kernel, on request.

transformers 5 computes a mixture-of-experts block's routed experts in one module per layer, decorated
with ``use_experts_implementation``: ``forward(hidden_states, top_k_index, top_k_weights)`` after the
model's own router, dispatched by name (``ExpertsInterface``) to ``grouped_mm``, ``batched_mm`` or the
module's loop. Inside ``fused_experts(True)``, the dispatch returns ``fused_experts_forward`` instead
for the experts onnxruntime's CPU ``com.microsoft.MoE`` computes: float32 SwiGLU experts (SiLU of the gate times up, transformers' default gate), weights
``gate_up_proj`` [E, 2I, H] (gate rows then up rows) and ``down_proj`` [E, H, I], no bias, no post-expert
norm. They become the custom op ``fastonnx::routed_experts``, written as one ``MoE`` node
(converters/third_party.py). Every other experts module keeps transformers' forward (the routed
``SequenceMap`` form of ``grouped_mm``).

The float ``MoE`` is not the default at any optimize level: measured on a Qwen3-30B-A3B-shaped block (benches/moe_experts.py,
docs/benchmarks.md), onnxruntime 1.31's CPU ``MoE`` takes ~190 ms a decode step where the routed form takes
~14 ms (the dense floor 9 ms), also with fc1 interleaved ahead (onnxruntime does not fold a weight over
1 GB, so in the graph the interleave runs at every step); it pays only at a long prefill on one thread.
To use it anyway (for an execution provider whose MoE is fast), capture inside the context manager; the
file then loads in onnxruntime only::

    with fastonnx.capture.fused_experts.fused_experts(True):
        fastonnx.to_onnx(model, args, optimize="onnxruntime", ...)

Quantized (``quantize=`` at the "onnxruntime" level) the capture uses it by itself (pipeline/stages.py):
the writer then reads the experts as ``QMoE`` int4 / int8 codes (rust/core/src/passes/
expert_quantization.rs), which onnxruntime's CPU runs faster than the float routed form (1.5 ms against
11.6 ms a decode-step block on one thread; docs/benchmarks.md).

Routing stays the model's: the op takes the experts and weights the router chose, whatever its rule
(softmax, sigmoid with a bias, group-limited...). ``MoE`` routes by itself (softmax over its router input,
then top-k), so the converter hands it logits that give back the chosen ones (the log of each chosen
weight, a large negative number elsewhere: the softmax then gives each chosen weight over their sum) and
multiplies its output by that sum.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor


@torch.library.custom_op("fastonnx::routed_experts", mutates_args=())
def routed_experts(
    hidden: Tensor, top_k_index: Tensor, top_k_weights: Tensor, gate_up: Tensor, down: Tensor
) -> Tensor:
    """SwiGLU experts: for each token, the sum over its chosen experts ``e`` (``top_k_index``) of its
    weight times ``down[e] @ (silu(gate) * up)``, ``gate; up = gate_up[e] @ hidden``."""
    out = torch.zeros_like(hidden)
    for e in top_k_index.unique().tolist():
        rows, slots = (top_k_index == e).nonzero(as_tuple=True)
        gate, up = (hidden[rows] @ gate_up[e].T).chunk(2, dim=-1)
        expert = (F.silu(gate) * up) @ down[e].T
        out.index_add_(0, rows, expert * top_k_weights[rows, slots, None].to(hidden.dtype))
    return out


@routed_experts.register_fake
def _(hidden: Tensor, top_k_index: Tensor, top_k_weights: Tensor, gate_up: Tensor, down: Tensor) -> Tensor:
    return hidden.new_empty(hidden.shape)


def fusable(module: Any) -> bool:
    """Whether onnxruntime's CPU ``MoE`` computes ``module`` (see the module's docstring)."""
    from transformers.integrations.moe import _default_apply_gate

    weights = (getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None))
    return (
        getattr(module, "has_gate", False)
        and not getattr(module, "has_bias", True)
        and not getattr(module, "is_transposed", True)
        and getattr(module, "is_concatenated", False)
        and not getattr(module, "has_post_expert_norm", True)
        and getattr(type(module), "_apply_gate", None) is _default_apply_gate
        and type(getattr(module, "act_fn", None)).__name__ in ("SiLU", "SiLUActivation")
        and all(isinstance(w, Tensor) and w.dtype == torch.float32 and w.dim() == 3 for w in weights)
    )


def fused_experts_forward(
    module: Any, hidden_states: Tensor, top_k_index: Tensor, top_k_weights: Tensor
) -> Tensor:
    out: Tensor = torch.ops.fastonnx.routed_experts(
        hidden_states, top_k_index, top_k_weights, module.gate_up_proj, module.down_proj
    )
    return out


@contextlib.contextmanager
def fused_experts(enabled: bool) -> Iterator[None]:
    """While active (and ``enabled``), transformers' experts dispatch gives ``fused_experts_forward`` for
    the modules onnxruntime's ``MoE`` computes (``fusable``), transformers' own forward for the others."""
    if not enabled or "transformers" not in sys.modules:  # no transformers model: nothing to route
        yield  # (and no import of transformers, which loads torch._dynamo and sympy)
        return
    try:
        from transformers.integrations.moe import ExpertsInterface
    except ImportError:  # a transformers without the experts interface: nothing to route
        yield
        return
    original = ExpertsInterface.get_interface

    def get_interface(self: Any, implementation: str, default: Callable[..., Any]) -> Callable[..., Any]:
        chosen = original(self, implementation, default)

        def forward(module: Any, *args: Any, **kwargs: Any) -> Any:
            if fusable(module) and not kwargs and len(args) == 3:
                return fused_experts_forward(module, *args)
            return chosen(module, *args, **kwargs)

        return forward

    ExpertsInterface.get_interface = get_interface  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        ExpertsInterface.get_interface = original  # type: ignore[method-assign]
