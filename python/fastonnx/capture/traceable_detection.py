"""Makes torchvision's detection models capturable by torch.export.

torchvision's ``batched_nms`` branches on ``boxes.numel()`` (``> 4000`` picks a per-class Python loop,
``== 0`` returns early). Inside a detection model the number of boxes is data-dependent (an unbacked
symbol after ``torch.where`` / score filtering), so torch.export stops at these guards. While
:func:`traceable_detection_ops` is active, ``torchvision.ops.boxes.batched_nms`` is replaced by the
coordinate-offset form torchvision itself uses for small inputs, without the two branches: one
``torchvision.nms`` on boxes shifted by ``class * (max coordinate + 1)``, so boxes of different classes
never overlap. Its result is the same set of indices in the same order (sorted by decreasing score).

The RoI pooling of several FPN levels reads ``len(rois)``; Mask R-CNN pastes each mask into the image
at its box's integer size and Keypoint R-CNN upsamples each ROI's heatmaps to the ROI's size, both in
Python loops over the detections with sizes read from tensors. Their replacements below work on every
detection at once from torch's own interpolation taps and weights, with data-dependent sizes only as
tensor values (and, for the keypoints, one unbacked size: the largest ROI).

transformers' RT-DETR family (RT-DETR, RT-DETRv2, D-FINE, DEIMv2, PP-DocLayout) reads its batch as
``batch_size = len(source_flatten)`` (OmDet-Turbo's decoder as ``len(vision_features)``): Python's ``len`` must return an int, so torch.export specialises the
batch there. While the block is active those modules' ``len`` is :func:`tensor_len`, which gives a
tensor's ``shape[0]`` as it is (a SymInt when the batch is dynamic) and is the builtin for anything else.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

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


def _linear_taps(
    out_index: torch.Tensor, out_size: torch.Tensor, in_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Source rows (or columns) and weights of ``F.interpolate(mode="bilinear", align_corners=False)``
    from ``in_size`` to ``out_size`` (one size per row of ``out_index``), as torch's CPU kernel computes
    them: scale = in / out, source = max((i + 0.5) * scale - 0.5, 0), taps floor(source) and the next
    one (the last one repeated), weights 1 - frac and frac."""
    scale = torch.tensor(float(in_size), device=out_size.device) / out_size.to(torch.float32)
    src = ((out_index.to(torch.float32) + 0.5) * scale[:, None] - 0.5).clamp(min=0)
    i0 = src.floor().to(torch.int64).clamp(max=in_size - 1)
    w1 = (src - i0.to(torch.float32)).clamp(0, 1)
    i1 = i0 + (i0 < in_size - 1).to(torch.int64)
    return i0, i1, 1 - w1, w1


def traceable_paste_masks_in_image(
    masks: torch.Tensor, boxes: torch.Tensor, img_shape: tuple[int, int], padding: int = 1
) -> torch.Tensor:
    """``torchvision.models.detection.roi_heads.paste_masks_in_image`` for every detection at once.

    torchvision resizes each (padded) mask to its box's integer size with bilinear ``F.interpolate`` and
    writes it into a zero image at the box's corner, one detection at a time (sizes read with ``int``).
    Here every image pixel (y, x) of detection n reads the resized mask at (y - y0, x - x0) when it lies
    inside the box, else 0: the resized value is computed directly from torch's bilinear taps and
    weights (:func:`_linear_taps`), four gathers from the flattened masks. The boxes, the pixels
    covered and the taps are exactly torchvision's; the values agree up to float32 rounding (torch's
    vectorised kernel rounds its weights and sums differently: up to ~1e-6 for masks in [0, 1]).
    """
    from torchvision.models.detection import roi_heads

    masks, scale = roi_heads.expand_masks(masks, padding=padding)
    boxes = roi_heads.expand_boxes(boxes, scale).to(dtype=torch.int64)
    im_h, im_w = img_shape
    n, size_h, size_w = masks.shape[0], masks.shape[-2], masks.shape[-1]
    x0, y0, x1, y1 = boxes.unbind(1)
    # torchvision's w = max(x1 - x0 + 1, 1), h likewise: the size of the resized mask
    w = (x1 - x0 + 1).clamp(min=1)
    h = (y1 - y0 + 1).clamp(min=1)
    rows = torch.arange(im_h, device=boxes.device)[None, :] - y0[:, None]  # (N, im_h): row in the box
    cols = torch.arange(im_w, device=boxes.device)[None, :] - x0[:, None]  # (N, im_w)
    inside = ((rows >= 0) & (rows < h[:, None]))[:, :, None] & ((cols >= 0) & (cols < w[:, None]))[:, None, :]
    r0, r1, wr0, wr1 = _linear_taps(rows, h, size_h)
    c0, c1, wc0, wc1 = _linear_taps(cols, w, size_w)
    flat = masks.reshape(n, size_h * size_w)

    def at(r: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        index = (r[:, :, None] * size_w + c[:, None, :]).reshape(n, im_h * im_w)
        return flat.gather(1, index).reshape(n, im_h, im_w)

    wc0, wc1 = wc0[:, None, :], wc1[:, None, :]
    top = at(r0, c0) * wc0 + at(r0, c1) * wc1
    bottom = at(r1, c0) * wc0 + at(r1, c1) * wc1
    pasted = top * wr0[:, :, None] + bottom * wr1[:, :, None]
    return torch.where(inside, pasted, torch.zeros((), dtype=pasted.dtype, device=pasted.device))[:, None]


def _cubic_taps(
    out_index: torch.Tensor, out_size: torch.Tensor, in_size: int
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Source rows (or columns) and weights of ``F.interpolate(mode="bicubic", align_corners=False)``
    from ``in_size`` to ``out_size`` (one size per row of ``out_index``), as torch's CPU kernel computes
    them: source = (i + 0.5) * in / out - 0.5 (not clamped), taps floor(source) - 1 .. + 2 clamped into
    the input, Keys' cubic convolution weights with A = -0.75 at t = source - floor(source)."""
    a = -0.75
    scale = torch.tensor(float(in_size), device=out_size.device) / out_size.to(torch.float32)
    src = (out_index.to(torch.float32) + 0.5) * scale[:, None] - 0.5
    i0 = src.floor().to(torch.int64).clamp(max=in_size - 1)
    t = (src - i0.to(torch.float32)).clamp(0, 1)

    def near(x: torch.Tensor) -> torch.Tensor:  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x: torch.Tensor) -> torch.Tensor:  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    weights = [far(t + 1), near(t), near(1 - t), far(2 - t)]
    taps = [(i0 - 1 + j).clamp(0, in_size - 1) for j in range(4)]
    return taps, weights


def traceable_heatmaps_to_keypoints(
    maps: torch.Tensor, rois: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``torchvision.models.detection.roi_heads.heatmaps_to_keypoints`` for every ROI at once.

    torchvision upsamples each ROI's heatmaps (K, H, W) bicubically to the ROI's size rounded up
    (sizes read with ``.item()``, one ROI at a time) and takes each keypoint's argmax. Here every ROI's
    maps are upsampled to the largest ROI size (an unbacked size) from torch's bicubic taps and weights
    (:func:`_cubic_taps`), columns first then rows as torch's kernel sums them, and the pixels past the
    ROI's own size are -inf: the argmax is over the same values in the same row-major order (first of
    equal maxima), so the same pixel wins unless two candidates are within float32 rounding. Memory:
    ROIs x keypoints x the largest ROI's area, where torchvision needs keypoints x one ROI's area.
    """
    n, k, in_h, in_w = maps.shape
    widths = (rois[:, 2] - rois[:, 0]).clamp(min=1)
    heights = (rois[:, 3] - rois[:, 1]).clamp(min=1)
    out_w = widths.ceil().to(torch.int64)
    out_h = heights.ceil().to(torch.int64)
    one = torch.ones(1, dtype=torch.int64, device=rois.device)
    # an int64 tensor's item is an int (an unbacked SymInt while tracing: int() would specialise it)
    max_w = cast(int, torch.cat([out_w, one]).max().item())
    max_h = cast(int, torch.cat([out_h, one]).max().item())
    cols = torch.arange(max_w, device=rois.device)[None, :].expand(n, max_w)  # (N, max_w)
    rows = torch.arange(max_h, device=rois.device)[None, :].expand(n, max_h)
    col_taps, col_weights = _cubic_taps(cols, out_w, in_w)
    row_taps, row_weights = _cubic_taps(rows, out_h, in_h)
    # along the columns: (N, K, in_h, max_w)
    across = None
    for tap, weight in zip(col_taps, col_weights, strict=True):
        index = tap[:, None, None, :].expand(n, k, in_h, max_w)
        term = maps.gather(3, index) * weight[:, None, None, :]
        across = term if across is None else across + term
    assert across is not None
    # along the rows: (N, K, max_h, max_w)
    upsampled = None
    for tap, weight in zip(row_taps, row_weights, strict=True):
        index = tap[:, None, :, None].expand(n, k, max_h, max_w)
        term = across.gather(2, index) * weight[:, None, :, None]
        upsampled = term if upsampled is None else upsampled + term
    assert upsampled is not None
    inside = (rows < out_h[:, None])[:, :, None] & (cols < out_w[:, None])[:, None, :]  # (N, max_h, max_w)
    lowest = torch.tensor(float("-inf"), dtype=upsampled.dtype, device=upsampled.device)
    flat = torch.where(inside[:, None], upsampled, lowest).reshape(n, k, max_h * max_w)
    pos = flat.argmax(dim=2)  # (N, K)
    end_scores = flat.gather(2, pos[:, :, None])[:, :, 0]
    x_int = pos % max_w
    y_int = torch.div(pos - x_int, max_w, rounding_mode="floor")
    width_correction = widths / out_w.to(widths.dtype)
    height_correction = heights / out_h.to(heights.dtype)
    x = (x_int.float() + 0.5) * width_correction[:, None] + rois[:, 0, None]
    y = (y_int.float() + 0.5) * height_correction[:, None] + rois[:, 1, None]
    xy_preds = torch.stack([x, y, torch.ones_like(x)], dim=2)  # (N, K, 3)
    return xy_preds.to(torch.float32), end_scores


def traceable_phrase_masks(
    input_ids: torch.Tensor, special_tokens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Grounding DINO's ``generate_masks_with_special_tokens_and_transfer_map``: a token attends to the
    tokens of its phrase (those sharing the next delimiter), its position counts from the previous one.
    transformers makes the "no next delimiter" fill as ``torch.tensor(seq_len)``, which torch.export
    cannot trace for a symbolic length; here it is ``where``'s scalar operand."""
    batch, length = input_ids.shape
    delimiter = torch.isin(input_ids, special_tokens)
    index = torch.arange(length, device=input_ids.device).unsqueeze(0).expand(batch, -1)
    previous = torch.cummax(torch.where(delimiter, index, -1), dim=1)[0]
    previous = torch.cat([previous.new_full((batch, 1), -1), previous[:, :-1]], dim=1)
    following = torch.flip(torch.cummin(torch.flip(torch.where(delimiter, index, length), [1]), 1)[0], [1])
    # phrases closed at the first or last token, or never, are not phrases
    phrase = (following != 0) & (following != length - 1) & (following != length)
    mask = (following.unsqueeze(2) == following.unsqueeze(1)) & phrase.unsqueeze(1)
    mask = torch.eye(length, device=input_ids.device, dtype=torch.bool).unsqueeze(0) | mask
    positions = torch.where(phrase, index - previous - 1, 0).clamp(min=0).to(torch.long)
    return mask, positions


def tensor_len(obj: Any) -> Any:
    """``len(obj)``, but a tensor's first size as it is: a SymInt stays symbolic."""
    if isinstance(obj, torch.Tensor):
        if obj.dim() == 0:
            raise TypeError("len() of a 0-d tensor")
        return obj.shape[0]
    return len(obj)


# the modules whose forward reads the batch as len(source_flatten): their own name ``len`` shadows the builtin
_BATCH_BY_LEN = tuple(
    f"transformers.models.{name}.modeling_{name}"
    for name in (
        "rt_detr",
        "rt_detr_v2",
        "d_fine",
        "deimv2",
        "pp_doclayout_v2",
        "pp_doclayout_v3",
        "omdet_turbo",
    )
)

# (module, attribute, replacement): what traceable_detection_ops swaps in
_REPLACEMENTS = (
    ("torchvision.ops.boxes", "batched_nms", traceable_batched_nms),
    ("torchvision.ops.poolers", "_multiscale_roi_align", traceable_multiscale_roi_align),
    # transform.py imports it by name: both module attributes
    ("torchvision.models.detection.roi_heads", "paste_masks_in_image", traceable_paste_masks_in_image),
    ("torchvision.models.detection.transform", "paste_masks_in_image", traceable_paste_masks_in_image),
    ("torchvision.models.detection.roi_heads", "heatmaps_to_keypoints", traceable_heatmaps_to_keypoints),
    *(
        (
            f"transformers.models.{name}.modeling_{name}",
            "generate_masks_with_special_tokens_and_transfer_map",
            traceable_phrase_masks,
        )
        for name in ("grounding_dino", "mm_grounding_dino")
    ),
)


@contextmanager
def traceable_detection_ops() -> Iterator[None]:
    """Within this block torchvision's detection helpers are their traceable forms above, and the RT-DETR
    family's ``len`` is :func:`tensor_len`.

    A no-op for the modules not imported (then no model can call them).
    """
    saved = []
    for module_name, attr, replacement in _REPLACEMENTS:
        module = sys.modules.get(module_name)
        if module is not None:
            saved.append((module, attr, getattr(module, attr)))
            setattr(module, attr, replacement)
    shadowed = [
        m for name in _BATCH_BY_LEN if (m := sys.modules.get(name)) is not None and "len" not in vars(m)
    ]
    for module in shadowed:
        module.len = tensor_len  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for module in shadowed:
            del module.len
        for module, attr, original in reversed(saved):
            setattr(module, attr, original)
