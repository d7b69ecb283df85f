"""Building a model from its config with its parameters on the meta device and its buffers real.

The parameters of a checkpoint's model are what the checkpoint holds: they are referenced in place by
the export (``weights=``), so they need no memory. Buffers are different: non-persistent ones (rotary
frequencies, causal masks, position ids) are in no checkpoint, the model's ``__init__`` computes them
from the config. Building under ``torch.device("meta")`` would make them meta too, and a hand patch per
architecture would then have to re-create them. Instead, while the model is constructed,
``nn.Module.register_parameter`` is patched so that each parameter moves to the meta device as it is
registered (the technique accelerate's ``init_empty_weights`` uses; accelerate is not needed): every
buffer is computed on the CPU by the architecture's own code, whatever the architecture.

Each parameter exists on the CPU only between its creation and its registration (``torch.empty``,
whose pages are not touched), so memory stays near one tensor, not the model; initialisations that run
after registration (``reset_parameters``, transformers' ``_init_weights``) run on meta tensors and cost
nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import torch

_LOCK = threading.Lock()  # the patch is process-wide: one construction at a time

T = TypeVar("T")


@contextmanager
def parameters_on_meta() -> Iterator[None]:
    """While active, every parameter registered on any module is moved to the meta device (its class,
    ``requires_grad`` and attributes kept); buffers stay where their code puts them."""
    with _LOCK:
        original = torch.nn.Module.register_parameter

        def register_parameter(module: torch.nn.Module, name: str, param: Any) -> None:
            original(module, name, param)
            stored = module._parameters.get(name)
            if stored is None or stored.device.type == "meta":
                return
            extra = dict(stored.__dict__)  # a Parameter subclass's attributes (e.g. quantization state)
            extra["requires_grad"] = stored.requires_grad
            module._parameters[name] = type(stored)(stored.to("meta"), **extra)

        torch.nn.Module.register_parameter = register_parameter  # type: ignore[method-assign, assignment]
        try:
            yield
        finally:
            torch.nn.Module.register_parameter = original  # type: ignore[method-assign]


def build_on_meta(factory: Callable[[], T]) -> T:
    """``factory()`` (e.g. ``lambda: LlamaForCausalLM(config)``) with its parameters on meta."""
    with parameters_on_meta():
        return factory()


def missing_parameters(model: torch.nn.Module, shards: list[str]) -> dict[str, torch.Tensor]:
    """The meta parameters that the checkpoint's ``shards`` do not hold, each as zeros on the CPU
    (``from_pretrained`` gives them fresh values: "newly initialized"). Keys are matched as the export's
    ``weights=`` matches them: tied names, transformers' renamings and the base model's prefix. Such a
    weight is often unused by the task's outputs (BERT's pooler under ``last_hidden_state``: the
    optimizer drops it); one the outputs read makes the verification disagree, since the checkpoint does
    not hold what the model computes with."""
    from fastonnx.weights.checkpoints import aliases, index_shards, renamed_keys

    index = index_shards(shards)
    known = set(index) | set(renamed_keys(model, list(index)))
    tied = aliases(model)
    return {
        name: torch.zeros(param.shape, dtype=param.dtype)
        for name, param in model.named_parameters()
        if param.device.type == "meta" and not any(n in known for n in [name, *tied.get(name, [])])
    }
