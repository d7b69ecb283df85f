"""SigLIP 2's NaFlex position embeddings, swapped while torch.export captures for a form that follows
``spatial_shapes`` as tensor arithmetic.

SigLIP 2's vision embeddings resize the learned position table to each image's rows and columns (in
patches) with ``spatial_shapes[i].tolist()`` in a Python loop over the batch and an antialiased bilinear
``F.interpolate``: the loop fixes the batch, and the shapes' values become constants of the capture, so
the file would be right for the example's image shapes alone. The form here weights the table's rows for
every patch from its own image's shape (``antialiased_taps``: the interpolation's taps, which LFM2-VL's tile encoder
(tile_towers.py) reads too), a
padding patch taking the first patch's row as transformers pads. It serves every model that runs SigLIP 2's
tower through its embeddings' forward (``Siglip2Model``, ``Siglip2ForImageClassification``);
``towers_alone.NaflexTower`` calls ``naflex_positions`` for the tower alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from fastonnx.capture.model_swaps import swapped_forms


def antialiased_taps(index: torch.Tensor, size: torch.Tensor, side: int) -> torch.Tensor:
    """The weights of a ``side``-long table's rows at positions ``index`` of an axis of ``size``:
    ``F.interpolate``'s bilinear sampling with ``antialias=True`` (corners not aligned): a triangle as wide
    as the scale where it shrinks, cut to the kernel's window and normalized. index x side. ``size``: the
    axis' one size, or one a position (towers_alone.py's batch of images, each of its own shape)."""
    scale = side / size.to(torch.float32)
    center = scale * (index.to(torch.float32) + 0.5)
    shrinks = scale >= 1
    support = torch.where(shrinks, scale, torch.ones_like(scale))
    inverse = torch.where(shrinks, 1 / scale, torch.ones_like(scale))
    low = torch.clamp(torch.trunc(center - support + 0.5), min=0)
    high = torch.clamp(torch.trunc(center + support + 0.5), max=side)
    k = torch.arange(side, dtype=torch.float32, device=index.device)[None, :]
    weights = torch.clamp(1 - ((k - center[:, None] + 0.5) * inverse[..., None]).abs(), min=0)
    weights = torch.where((k >= low[:, None]) & (k < high[:, None]), weights, 0)
    return weights / weights.sum(-1, keepdim=True)


def naflex_positions(embeddings: Any, spatial_shapes: torch.Tensor, patches: int) -> torch.Tensor:
    """Each image's position table resized to its ``spatial_shapes`` row (rows, columns), laid out over
    ``patches`` padded patches: batch x patches x hidden, float32 (transformers resizes in float32 on the
    CPU)."""
    batch = spatial_shapes.shape[0]
    h, w = spatial_shapes[:, :1], spatial_shapes[:, 1:]  # batch x 1, against each patch
    at = torch.arange(patches, device=spatial_shapes.device)[None, :].expand(batch, patches)
    at = torch.where(at < h * w, at, 0)  # a padding patch: the first patch's position
    rows, columns = (at // w).reshape(-1), (at % w).reshape(-1)
    side = int(embeddings.position_embedding_size)
    h_weights = antialiased_taps(rows, h.expand(batch, patches).reshape(-1), side)
    w_weights = antialiased_taps(columns, w.expand(batch, patches).reshape(-1), side)
    weights = (h_weights[:, :, None] * w_weights[:, None, :]).reshape(batch, patches, side * side)
    result: torch.Tensor = weights @ embeddings.position_embedding.weight.float()
    return result


def naflex_embeddings_forward(
    self: Any, pixel_values: torch.Tensor, spatial_shapes: torch.Tensor
) -> torch.Tensor:
    """``Siglip2VisionEmbeddings.forward`` with ``naflex_positions``."""
    hidden = self.patch_embedding(pixel_values.to(dtype=self.patch_embedding.weight.dtype))
    positions = naflex_positions(self, spatial_shapes, pixel_values.shape[1])
    result: torch.Tensor = hidden + positions.to(hidden.dtype)
    return result


SWAPS = {"siglip2": {"Siglip2VisionEmbeddings.forward": naflex_embeddings_forward}}
"""transformers' model type, and the method swapped while a capture runs."""


@contextlib.contextmanager
def tensor_naflex_positions() -> Iterator[None]:
    """While active, SigLIP 2's vision embeddings (if loaded) have ``naflex_embeddings_forward``."""
    with swapped_forms(SWAPS):
        yield
