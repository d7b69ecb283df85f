"""Constants a forward makes from Python numbers, on the CPU while a meta-device model is captured.

``fastonnx export`` builds the model on the meta device (no weights in memory) and captures it with
example inputs there. A forward that makes a tensor of a Python number on its inputs' device
(GPT-Neo's ``torch.tensor(mask_value, device=attn_weights.device)``, Gemma 3n's sparsity target) then
makes it on the meta device: torch.export lifts it as a constant without a value, and the file would
have no bytes for it. While capturing, such a tensor of a number is made on the CPU instead: a 0-d CPU
tensor mixes with tensors of any device (``masked_fill``, which does not take it for a meta tensor, gets its
number), and the constant keeps its value. An index given as a list of numbers (Falcon's
``fused_qkv[..., [-2], :]``) is made a tensor on the meta device the same way; it becomes a CPU tensor,
which indexes a meta tensor as it would a CUDA one. A table of numbers (Mask2Former's
``torch.as_tensor(spatial_shapes_list, device=...)``) is made on the CPU, where the forward's ``.tolist()``
reads its values; an op that meets it with meta tensors gets it copied to the meta device in the graph:
the constant keeps its values, and the copy converts to nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from fastonnx.torch_internals import pytree

_FACTORIES = (torch.tensor, torch.scalar_tensor, torch.as_tensor)
_FILLS = (torch.masked_fill, torch.Tensor.masked_fill, torch.Tensor.masked_fill_)
_INDEXING = (torch.Tensor.__getitem__, torch.Tensor.__setitem__)


def _on_meta(device: Any) -> bool:
    return device is not None and torch.device(device).type == "meta"


def _number_list(value: Any, kinds: tuple[type, ...] = (list,)) -> bool:
    return (
        isinstance(value, kinds)
        and bool(value)
        and all(isinstance(v, (bool, int, float)) or _number_list(v, kinds) for v in value)  # type: ignore[attr-defined]
    )


def _cpu_lists(index: Any) -> Any:
    """The index with each list of numbers (one element or the whole) a CPU tensor."""
    if _number_list(index):
        return torch.tensor(index, device="cpu")
    if isinstance(index, tuple):
        return tuple(torch.tensor(i, device="cpu") if _number_list(i) else i for i in index)
    return index


def _cpu_number(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() == 0 and value.device.type == "cpu"


def _is_table(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == "cpu" and value.dim() > 0


def _mixes_tables(args: Any, kwargs: Any) -> bool:
    """Whether an op takes a CPU table (a tensor of more than one number, which only the numbers made
    here are while a meta-device model is captured: its buffers are on the meta device) with meta tensors."""
    leaves = [x for x in pytree.tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
    return any(_is_table(x) for x in leaves) and any(x.device.type == "meta" for x in leaves)


def _table_to_meta(value: Any) -> Any:
    return value.to("meta") if _is_table(value) else value


class _NumbersOnCpu(TorchFunctionMode):
    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if (
            func in _FACTORIES
            and args
            and isinstance(args[0], (bool, int, float))
            and _on_meta(kwargs.get("device"))
        ):
            kwargs = {**kwargs, "device": "cpu"}
        elif (
            func in _FACTORIES
            and args
            and _number_list(args[0], (list, tuple))
            and _on_meta(kwargs.get("device"))
        ):
            # a table of Python numbers (Mask2Former's feature-map sizes, Mistral 3's image sizes): made
            # on the CPU, where it keeps its values (``.tolist()`` reads them: static sizes); it meets the
            # meta tensors through a copy to their device (below), its values the lifted constant's
            kwargs = {**kwargs, "device": "cpu"}
        elif func not in _INDEXING and _mixes_tables(args, kwargs):
            args, kwargs = pytree.tree_map(_table_to_meta, (args, kwargs))
            return func(*args, **kwargs)
        if func in _FILLS and len(args) == 3 and _cpu_number(args[2]) and _on_meta(args[0].device):
            # masked_fill takes no CPU tensor for a meta one (CpmAnt fills with such a scalar_tensor):
            # its number instead
            args = (args[0], args[1], args[2].item())
        elif (
            func in _INDEXING
            and len(args) >= 2
            and isinstance(args[0], torch.Tensor)
            and _on_meta(args[0].device)
        ):
            args = (args[0], _cpu_lists(args[1]), *args[2:])
        return func(*args, **kwargs)


@contextlib.contextmanager
def numbers_on_cpu() -> Iterator[None]:
    """While active, a 0-d tensor made of a Python number for the meta device is made on the CPU."""
    with _NumbersOnCpu():
        yield
