"""UDOP's merge of a document's words and image patches, swapped while torch.export captures (and while
image_encoder_decoders.py reads shapes on the meta device) for a form without data-dependent sizes.

transformers' ``combine_image_text_embeddings`` adds to each word's embedding the patch under its box's
centre, then keeps the patches no word's centre falls on: ``image_embeddings[i][patch_inds[i]]`` a row at
a time (as many as that row keeps: a data-dependent size, ``nonzero``), padded with zeros back to the
patches' number, and their boxes and a mask of ones alike; the words' points are set by a Python loop
over ``zip(*ind)`` (one iteration a word: the length fixed in a capture). ``combine_by_gather`` computes
the same: the kept patches' slots found by counting (slot ``k`` reads the ``k``-th kept patch, the
slots past a row's count zeros), every shape the inputs' own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from fastonnx.capture.model_swaps import swapped_forms


def combine_by_gather(
    image_embeddings: torch.Tensor,
    inputs_embeds: torch.Tensor,
    bbox: torch.Tensor,
    visual_bbox: torch.Tensor | None,
    attention_mask: torch.Tensor | None = None,
    num_patches: int = 14,
    max_len: int = 0,
    image_size: int = 224,
    patch_size: int = 16,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """transformers' ``combine_image_text_embeddings`` of UDOP (``max_len`` 0, as its stack calls it)."""
    from transformers.models.udop.modeling_udop import get_visual_bbox

    if max_len != 0:
        raise NotImplementedError("UDOP's stack merges with max_len=0: the patches' own number")
    side = num_patches
    centre_x = torch.floor((bbox[:, :, 0] + bbox[:, :, 2]) / 2.0 * side).long().clamp(0, side - 1)
    centre_y = torch.floor((bbox[:, :, 1] + bbox[:, :, 3]) / 2.0 * side).long().clamp(0, side - 1)
    points = centre_x + centre_y * side  # (batch, words): the patch under each word
    bbox = bbox.to(torch.float64)
    whole = (bbox.mean(-1) == 0.0) | (bbox.mean(-1) == 1.0)  # a word boxing nothing, or the page
    width = image_embeddings.shape[-1]
    under = image_embeddings.gather(1, points.unsqueeze(-1).expand(-1, -1, width))
    inputs_embeds = inputs_embeds + under.masked_fill(whole.unsqueeze(-1), 0.0)

    batch, patches = image_embeddings.shape[:2]
    hit = torch.zeros(batch, patches, dtype=torch.bool, device=points.device).scatter(1, points, True)
    kept = (~hit).to(torch.int64)
    count = kept.sum(1, keepdim=True)  # (batch, 1)
    slots = torch.arange(patches, device=points.device)
    # slot k reads the first patch with k + 1 kept patches up to it: the number of patches with fewer
    source = (kept.cumsum(1).unsqueeze(1) <= slots.view(1, -1, 1)).sum(-1).clamp(max=patches - 1)
    filled = slots.unsqueeze(0) < count  # (batch, patches)

    def compacted(rows: torch.Tensor) -> torch.Tensor:
        taken = rows.gather(1, source.unsqueeze(-1).expand(-1, -1, rows.shape[-1]))
        return taken.masked_fill(~filled.unsqueeze(-1), 0)

    if visual_bbox is None:
        visual_bbox = get_visual_bbox(image_size=image_size, patch_size=patch_size)  # type: ignore[no-untyped-call]
        visual_bbox = visual_bbox.unsqueeze(0).expand(batch, -1, -1).to(image_embeddings.device)
    inputs_embeds = torch.cat([inputs_embeds, compacted(image_embeddings)], 1)
    bbox = torch.cat([bbox, compacted(visual_bbox)], 1)
    if attention_mask is not None:
        attention_mask = torch.cat([attention_mask, filled.to(attention_mask.dtype)], 1)
    return inputs_embeds, bbox, attention_mask


SWAPS: dict[str, dict[str, Any]] = {"udop": {"combine_image_text_embeddings": combine_by_gather}}


@contextlib.contextmanager
def gathered_document_patches() -> Iterator[None]:
    """While active, a loaded UDOP modeling module merges words and patches by ``combine_by_gather``."""
    with swapped_forms(SWAPS):
        yield
