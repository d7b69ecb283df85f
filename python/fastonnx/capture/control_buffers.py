"""Buffers a forward reads in Python control flow, made Python numbers while torch.export captures.

EoMT's (and EoMT-DINOv3's) ``attn_mask_probs`` decides per block whether the masked-attention branch
runs (``if self.training or self.attn_mask_probs[i] > 0``) and whether queries are unmasked at random
(``if prob < 1``). torch.export makes every buffer a fake tensor, so those ``if``s fail the capture
("Could not guard on data-dependent expression Eq(u0, 1)"). The buffer is constant at inference (mask
annealing leaves it 0 in released checkpoints; a fresh model has 1): while capturing it is a tuple of
its values, and the graph has the branch the model's values take. A value strictly between 0 and 1 is
refused: transformers then unmasks random queries at inference, which no graph reproduces.

A model built on the meta device (``fastonnx export``) has no values there: the package export reads
them from the checkpoint first (meta_init.stored_control_buffers)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from fastonnx.errors import CaptureError
from fastonnx.torch_internals import module_buffers

CONTROL_BUFFERS = {"eomt": ("attn_mask_probs",), "eomt_dinov3": ("attn_mask_probs",)}
"""transformers' model type -> the buffers its modeling module's forwards branch on."""


def control_buffer_names(module: torch.nn.Module) -> tuple[str, ...]:
    """The buffers of ``CONTROL_BUFFERS`` that ``module`` (one module, not its children) holds."""
    for model_type, names in CONTROL_BUFFERS.items():
        if type(module).__module__ == f"transformers.models.{model_type}.modeling_{model_type}":
            return tuple(n for n in names if module_buffers(module).get(n) is not None)
    return ()


def _numbers(path: str, name: str, buffer: torch.Tensor) -> tuple[float, ...]:
    where = f"{path + '.' if path else ''}{name}"
    if buffer.device.type == "meta":
        raise CaptureError(
            f"{where} decides the forward's branches, and its values are not known (a model on the meta "
            "device): load the model's weights, or export the checkpoint folder with fastonnx export"
        )
    values = tuple(float(v) for v in buffer.detach().flatten().tolist())
    for i, v in enumerate(values):
        if 0.0 < v < 1.0:
            raise CaptureError(
                f"{where}[{i}] is {v:g}: transformers then unmasks random queries at inference, which a "
                "graph cannot reproduce; the exporter takes 0 (no masked attention) or 1 (masked attention)"
            )
    return values


@contextlib.contextmanager
def buffers_as_numbers(model: torch.nn.Module) -> Iterator[None]:
    """While active, each control buffer of ``model``'s modules is a tuple of its values (put back
    after, in every case)."""
    swapped: list[tuple[torch.nn.Module, str, torch.Tensor]] = []
    try:
        for path, module in model.named_modules():
            for name in control_buffer_names(module):
                buffer = module_buffers(module)[name]
                assert buffer is not None  # control_buffer_names keeps only held ones
                values = _numbers(path, name, buffer)
                del module_buffers(module)[name]
                swapped.append((module, name, buffer))
                module.__dict__[name] = values
        yield
    finally:
        for module, name, buffer in reversed(swapped):
            module.__dict__.pop(name, None)
            module_buffers(module)[name] = buffer
