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

Once built, the export moves the buffers to the meta device too (``buffers_on_meta``), their computed
values written beside the checkpoint's shards: a capture on the meta device must not meet CPU tensors.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import torch

from fastonnx.torch_internals import module_buffers, module_parameters

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
            stored = module_parameters(module).get(name)
            if stored is None or stored.device.type == "meta":
                return
            extra = dict(stored.__dict__)  # a Parameter subclass's attributes (e.g. quantization state)
            extra["requires_grad"] = stored.requires_grad
            module_parameters(module)[name] = type(stored)(stored.to("meta"), **extra)

        torch.nn.Module.register_parameter = register_parameter  # type: ignore[method-assign, assignment]
        try:
            yield
        finally:
            torch.nn.Module.register_parameter = original  # type: ignore[method-assign]


def build_on_meta(factory: Callable[[], T]) -> T:
    """``factory()`` (e.g. ``lambda: LlamaForCausalLM(config)``) with its parameters on meta."""
    with parameters_on_meta():
        return factory()


def _known_keys(model: torch.nn.Module, shards: list[str]) -> tuple[set[str], dict[str, list[str]]]:
    from fastonnx.stored_weights.checkpoints import aliases, index_shards, renamed_keys

    index = index_shards(shards)
    return set(index) | set(renamed_keys(model, list(index))), aliases(model)


def buffers_on_meta(model: torch.nn.Module, shards: list[str]) -> dict[str, torch.Tensor]:
    """Moves every buffer to the meta device, the parameters' device; returns the values (on the CPU)
    of those the checkpoint's ``shards`` do not hold, for the export to read beside the shards.

    The architectures' code puts a buffer with the activations only where it expects them apart
    (rotary frequencies' ``.to(x.device)``); elsewhere it relies on the whole model being on one device:
    GPT-Neo's and OpenAI GPT's causal-mask ``bias``, BERT's ``token_type_ids`` gathered at the position
    ids, XGLM's sinusoidal table indexed by them. A CPU buffer meeting a meta activation there fails the
    capture ("found at least two devices, cpu and meta"), so no buffer stays on the CPU. Buffers the
    checkpoint holds (Marian's ``final_logits_bias``) are read from it, as ``from_pretrained`` loads
    them; the others (non-persistent ones: computed by the model's ``__init__``) keep the value computed
    there. A buffer registered under several names stays one tensor."""
    known, tied = _known_keys(model, shards)
    moved: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id: (the CPU buffer, kept alive; its meta)
    values: dict[str, torch.Tensor] = {}
    for path, module in model.named_modules(remove_duplicate=False):
        for leaf, buffer in list(module_buffers(module).items()):
            if buffer is None or buffer.device.type == "meta" or buffer.is_complex():
                continue  # complex (rotary ``freqs_cis``): no safetensors dtype holds it, left on the CPU
            name = f"{path}.{leaf}" if path else leaf
            if id(buffer) not in moved:
                moved[id(buffer)] = (buffer, buffer.to("meta"))
                if not any(n in known for n in [name, *tied.get(name, [])]):
                    # contiguous and owning its storage: safetensors writes neither views nor shared memory
                    values[name] = buffer.detach().clone(memory_format=torch.contiguous_format)
            module_buffers(module)[leaf] = moved[id(buffer)][1]
    return values


def missing_parameters(model: torch.nn.Module, shards: list[str]) -> dict[str, torch.Tensor]:
    """The meta parameters that the checkpoint's ``shards`` do not hold, each on the CPU with the value
    the model's own initialization gives it (transformers' ``_init_weights`` on a copy of its module),
    as ``from_pretrained`` initializes them ("newly initialized"): Marian's sinusoidal position tables
    (computed, not saved) get their real values; random ones (BERT's pooler under a masked-LM
    checkpoint) random values, unused by the task's outputs or a verification mismatch. Keys are matched
    as the export's ``weights=`` matches them: tied names, transformers' renamings, the base model's
    prefix."""
    known, tied = _known_keys(model, shards)
    missing = [
        name
        for name, param in model.named_parameters()
        if param.device.type == "meta" and not any(n in known for n in [name, *tied.get(name, [])])
    ]
    init = getattr(model, "_init_weights", None)
    values: dict[str, torch.Tensor] = {}
    by_module: dict[str, list[str]] = {}
    for name in missing:
        owner, _, leaf = name.rpartition(".")
        by_module.setdefault(owner, []).append(leaf)
    for owner, leaves in by_module.items():
        module = copy.deepcopy(model.get_submodule(owner) if owner else model)
        for leaf in leaves:
            meta = module_parameters(module)[leaf]
            assert meta is not None
            module_parameters(module)[leaf] = torch.nn.Parameter(
                torch.zeros(meta.shape, dtype=meta.dtype), requires_grad=meta.requires_grad
            )
        if callable(init):
            try:
                with torch.no_grad():
                    init(module)
            except (RuntimeError, NotImplementedError, AttributeError, TypeError):
                pass  # an initialization that needs the other (meta) weights: zeros
        for leaf in leaves:
            value = module_parameters(module)[leaf]
            assert value is not None
            values[f"{owner}.{leaf}" if owner else leaf] = value.detach().to("cpu").clone()
    return values


def stored_control_buffers(
    model: torch.nn.Module, shards: list[str], computed: dict[str, torch.Tensor]
) -> None:
    """Puts each control buffer (capture/control_buffers.py: EoMT's ``attn_mask_probs``) back on the
    CPU after ``buffers_on_meta``, with the checkpoint's value, else the one computed at construction
    (``computed``, its values): the capture branches on its values."""
    from safetensors import safe_open

    from fastonnx.capture.control_buffers import control_buffer_names
    from fastonnx.stored_weights.checkpoints import aliases, index_shards, renamed_keys

    held = [(path, m, leaf) for path, m in model.named_modules() for leaf in control_buffer_names(m)]
    if not held:  # most models: no shard header read for them
        return
    index = index_shards(shards)
    renamed, tied = renamed_keys(model, list(index)), aliases(model)
    for path, module, leaf in held:
        name = f"{path}.{leaf}" if path else leaf
        names = [name, *tied.get(name, [])]
        key = next((k for k in names if k in index), None) or next(
            (renamed[k] for k in names if k in renamed), None
        )
        if key is not None:
            with safe_open(index[key].shard, "pt") as f:
                value = f.get_tensor(key)
        elif name in computed:
            value = computed[name]
        else:
            continue  # left on meta: the capture names it
        module_buffers(module)[leaf] = value.to(torch.float32)
