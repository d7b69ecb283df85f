"""Mixture-of-experts blocks that loop over the experts their tokens were routed to, looped over every
expert while capturing.

transformers' experts modules that ``use_experts_implementation`` does not decorate (DBRX, LongCat-Flash,
NLLB-MoE, Switch Transformers) compute ``forward(hidden_states, top_k_index, top_k_weights)`` as a Python
loop over ``one_hot(top_k_index).sum(...).nonzero()``, the experts hit. That list has a data-dependent
length: torch.export cannot iterate it (``Could not guard on data-dependent expression Eq(u0, 0)``), and
a fake-tensor run of the model (the cache layout read in ``pretrained/decoder_cache.py``) fails the same.

Inside ``every_expert(model)`` those modules' forwards run under a TorchFunctionMode in which

- the ``nonzero()`` of a 1-D boolean tensor of static length (the experts hit) gives every expert
  index, each a one-element tensor, as iterating the ``[n, 1]`` result would: an expert no token chose
  selects no rows (``torch.where`` of its mask row is empty), and its ``index_add_`` of nothing changes
  nothing, so the sum is the same. The tensors are made of Python numbers, so torch keeps their values
  (``.item()`` is the number: LongCat-Flash branches on it for its identity experts). The indices stop
  at the module's ``num_experts`` where it has fewer experts than the mask's classes: DBRX's one-hot
  has a class more, never routed to, and reading its weights would be out of range;
- the ``numel()`` of a tensor of data-dependent size (an expert's selected rows) is at least 1: a loop
  that skips an expert without rows (``if token_idx.numel() == 0: continue``) runs it instead, which
  adds nothing, where the test itself would be a guard on a data-dependent size. Where the count is
  used as a size instead, torch must prove it equal to the size it is used with, and fails the
  capture rather than leave it wrong.

The selection stays data-dependent (each expert's rows are gathered, not every row), so the graph
computes what the routing asks for, as transformers' grouped forms do.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from fastonnx.torch_internals import symint_hint

EXPERTS_ARGUMENTS = ("hidden_states", "top_k_index", "top_k_weights")
"""The forward arguments of transformers' experts modules, after the router."""

_NONZERO = (torch.nonzero, torch.Tensor.nonzero)


def loops_over_hit_experts(cls: type[torch.nn.Module]) -> bool:
    """Whether ``cls`` is an experts module transformers does not dispatch itself: its forward takes
    ``EXPERTS_ARGUMENTS`` first, and ``use_experts_implementation`` (which sets ``has_gate`` on the
    instance, and whose dispatch picks a grouped form under torch.export) did not decorate it."""
    forward = getattr(cls, "forward", None)
    if forward is None or hasattr(forward, "__wrapped__"):  # decorated: transformers' own dispatch
        return False
    try:
        names = list(inspect.signature(forward).parameters)[1:]
    except (TypeError, ValueError):
        return False
    return tuple(names[: len(EXPERTS_ARGUMENTS)]) == EXPERTS_ARGUMENTS


class _EveryExpert(TorchFunctionMode):
    """The mode of the module's docstring, for one experts module of ``experts`` experts (None: as
    many as the mask has classes)."""

    def __init__(self, experts: int | None) -> None:
        super().__init__()
        self.experts = experts

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if func in _NONZERO and len(args) == 1 and not kwargs.get("as_tuple", False):
            hit = args[0]
            if hit.dim() == 1 and hit.dtype == torch.bool and isinstance(hit.shape[0], int):
                count = hit.shape[0] if self.experts is None else min(self.experts, hit.shape[0])
                # Python numbers: one element each, so torch keeps the value (.item() reads it)
                return [torch.tensor([e], device="cpu") for e in range(count)]
        out = func(*args, **kwargs)
        if func is torch.Tensor.numel and isinstance(out, torch.SymInt) and symint_hint(out) is None:
            return torch.sym_max(out, 1)
        return out


def _looping_every_expert(forward: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(forward)  # the signature stays the forward's: torch.export binds arguments by it
    def every_expert_forward(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        experts = getattr(self, "num_experts", None)
        with _EveryExpert(experts if isinstance(experts, int) else None):
            return forward(self, *args, **kwargs)

    return every_expert_forward


@contextlib.contextmanager
def every_expert(model: Any) -> Iterator[None]:
    """While active, the experts modules of ``model`` that loop over the experts hit
    (``loops_over_hit_experts``) loop over every expert (their classes' forwards swapped; call it under
    the capture's lock)."""
    classes = (
        {type(m) for m in model.modules() if loops_over_hit_experts(type(m))}
        if isinstance(model, torch.nn.Module)
        else set()
    )
    # each class's own forward, None where it inherits it (then the swap is deleted after)
    swapped = [(cls, cls.__dict__.get("forward")) for cls in classes]
    for cls, _ in swapped:
        cls.forward = _looping_every_expert(cls.forward)
    try:
        yield
    finally:
        for cls, own in swapped:
            if own is None:
                del cls.forward
            else:
                cls.forward = own
