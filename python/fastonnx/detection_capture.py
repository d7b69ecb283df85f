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
    return torchvision.ops.nms(boxes + offsets[:, None], scores, iou_threshold)


@contextmanager
def traceable_detection_ops() -> Iterator[None]:
    """Within this block torchvision's ``batched_nms`` is :func:`traceable_batched_nms`.

    A no-op when torchvision has not been imported (then no model can call it).
    """
    boxes_module = sys.modules.get("torchvision.ops.boxes")
    if boxes_module is None:
        yield
        return
    original = boxes_module.batched_nms
    boxes_module.batched_nms = traceable_batched_nms
    try:
        yield
    finally:
        boxes_module.batched_nms = original
