"""Makes torchvision's detection models capturable by torch.export.

torchvision's ``batched_nms`` branches on ``boxes.numel()`` (``> 4000`` picks a per-class Python loop,
``== 0`` returns early). Inside a detection model the number of boxes is data-dependent (an unbacked
symbol after ``torch.where`` / score filtering), so torch.export stops at these guards. While
:func:`traceable_detection_ops` is active, ``torchvision.ops.boxes.batched_nms`` is replaced by the
coordinate-offset form torchvision itself uses for small inputs, without the two branches: one
``torchvision.nms`` on boxes shifted by ``class * (max coordinate + 1)``, so boxes of different classes
never overlap. Its result is the same set of indices in the same order (sorted by decreasing score).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch


def traceable_batched_nms(
    boxes: torch.Tensor, scores: torch.Tensor, idxs: torch.Tensor, iou_threshold: float
) -> torch.Tensor:
    """``torchvision.ops.batched_nms`` without data-dependent branches (the coordinate-offset trick)."""
    import torchvision

    # the largest coordinate, -inf for no boxes (then there is no offset to compute either):
    # the same value as torchvision's boxes.max() without its numel() == 0 guard
    lowest = boxes.new_full((1,), float("-inf"))
    max_coordinate = torch.cat([boxes.reshape(-1), lowest]).max()
    offsets = idxs.to(boxes) * (max_coordinate + torch.tensor(1).to(boxes))
    kept: torch.Tensor = torchvision.ops.nms(boxes + offsets[:, None], scores, iou_threshold)
    return kept


def traceable_multiscale_roi_align(
    x_filtered: list[torch.Tensor],
    boxes: list[torch.Tensor],
    output_size: list[int],
    sampling_ratio: int,
    scales: list[float] | None,
    mapper: Any,
) -> torch.Tensor:
    """``torchvision.ops.poolers._multiscale_roi_align`` with ``rois.shape[0]`` for its ``len(rois)``
    (an int conversion of a data-dependent size) and an out-of-place ``index_put`` per level."""
    from torchvision.ops import poolers, roi_align

    if scales is None or mapper is None:
        raise ValueError("scales and mapper should not be None")
    rois = poolers._convert_to_roi_format(boxes)
    if len(x_filtered) == 1:
        pooled: torch.Tensor = roi_align(x_filtered[0], rois, output_size, scales[0], sampling_ratio)
        return pooled
    levels = mapper(boxes)
    first = x_filtered[0]
    result = first.new_zeros((rois.shape[0], first.shape[1], *output_size))
    for level, (feature, scale) in enumerate(zip(x_filtered, scales, strict=True)):
        in_level = torch.where(levels == level)[0]
        pooled = roi_align(feature, rois[in_level], output_size, scale, sampling_ratio)
        result = result.index_put((in_level,), pooled.to(result.dtype))
    return result


# (module, attribute, replacement): what traceable_detection_ops swaps in
_REPLACEMENTS = (
    ("torchvision.ops.boxes", "batched_nms", traceable_batched_nms),
    ("torchvision.ops.poolers", "_multiscale_roi_align", traceable_multiscale_roi_align),
)


@contextmanager
def traceable_detection_ops() -> Iterator[None]:
    """Within this block torchvision's detection helpers are their traceable forms above.

    A no-op for the modules not imported (then no model can call them).
    """
    saved = []
    for module_name, attr, replacement in _REPLACEMENTS:
        module = sys.modules.get(module_name)
        if module is not None:
            saved.append((module, attr, getattr(module, attr)))
            setattr(module, attr, replacement)
    try:
        yield
    finally:
        for module, attr, original in reversed(saved):
            setattr(module, attr, original)
