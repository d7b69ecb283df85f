"""``torch.take_along_dim`` in a form whose sizes stay symbolic, swapped in while torch.export captures.

torch's own (a C++ composite) broadcasts its two tensors from their concrete ``sizes()``, which makes every
dynamic dim of both an int: torch.export then specialises the batch of PP-DocLayoutV2's detector (its
ordering of the boxes by ``take_along_dim(class_ids, argsort(mask))``) to the example's. The form below
is the same broadcast done on the tensors' symbolic shapes, then the ``gather`` torch's ends with. Anything
else (an ``out=``, ranks or index dtypes torch refuses) goes to torch's own, with its own errors.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

_ORIGINAL = torch.take_along_dim


def symbolic_take_along_dim(
    input: torch.Tensor, indices: torch.Tensor, dim: int | None = None, **kwargs: Any
) -> torch.Tensor:
    """``torch.take_along_dim(input, indices, dim)`` from ``expand`` and ``gather`` on symbolic sizes."""
    usual = not kwargs and indices.dtype == torch.int64 and input.dim() == indices.dim() > 0
    if not usual:
        out: torch.Tensor = _ORIGINAL(input, indices, dim, **kwargs)
        return out
    if dim is None:  # torch's: the flattened input at the flattened indices
        return input.reshape(-1).gather(0, indices.reshape(-1))
    axis = dim % input.dim()
    # both broadcast against each other except along ``axis``, where each keeps its own length
    others = torch.broadcast_shapes(
        tuple(1 if i == axis else s for i, s in enumerate(input.shape)),
        tuple(1 if i == axis else s for i, s in enumerate(indices.shape)),
    )
    data = input.expand(*(input.shape[i] if i == axis else s for i, s in enumerate(others)))
    where = indices.expand(*(indices.shape[i] if i == axis else s for i, s in enumerate(others)))
    return data.gather(axis, where)


@contextlib.contextmanager
def symbolic_take_along_dims() -> Iterator[None]:
    """While active, ``torch.take_along_dim`` is :func:`symbolic_take_along_dim`."""
    saved = torch.take_along_dim
    torch.take_along_dim = symbolic_take_along_dim
    try:
        yield
    finally:
        torch.take_along_dim = saved
