"""torchvision's detection operators and detection models: onnxruntime against eager torchvision.

Operators run at opsets 17 (onnxruntime's RoiAlign / MaxRoiPool kernels, DeformConv composed) and
MAX_OPSET (RoiAlign / MaxRoiPool composed, DeformConv), with several shapes and parameters each.
"""

from __future__ import annotations

import copy
import re
import unittest.mock

import pytest
import torch

import fastonnx
from support.export_check import ENDS, Fn, check_export
from support.matrix import sampled

torchvision = pytest.importorskip("torchvision")
ops = torchvision.ops


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _rois(n: int, images: int, h: int, w: int, seed: int) -> torch.Tensor:
    """(n, 5) rois: batch index, then x1, y1, x2, y2 in pixels of an h x w image, some reaching past
    its borders, one degenerate (a point), one tiny."""
    g = _gen(seed)
    xy = torch.rand(n, 2, generator=g) * torch.tensor([w, h]) * 1.1 - 2
    wh = torch.rand(n, 2, generator=g) * torch.tensor([w, h]) * 0.8
    boxes = torch.cat([xy, xy + wh], dim=1)
    boxes[0, 2:] = boxes[0, :2]  # a point
    boxes[1, 2:] = boxes[1, :2] + 0.3  # smaller than a pixel
    batch = torch.randint(0, images, (n, 1), generator=g).float()
    return torch.cat([batch, boxes], dim=1)


# ---- nms --------------------------------------------------------------------------------------------


def _boxes(n: int, seed: int, spread: float) -> tuple[torch.Tensor, torch.Tensor]:
    g = _gen(seed)
    xy = torch.rand(n, 2, generator=g) * spread
    wh = torch.rand(n, 2, generator=g) * 30 + 1
    return torch.cat([xy, xy + wh], dim=1), torch.rand(n, generator=g)


@pytest.mark.parametrize(
    ("n", "iou", "spread"), [(1, 0.5, 10.0), (40, 0.5, 50.0), (300, 0.3, 100.0), (200, 0.9, 20.0)]
)
def test_nms(n: int, iou: float, spread: float) -> None:
    boxes, scores = _boxes(n, n, spread)
    check_export(Fn(lambda b, s: ops.nms(b, s, iou)), (boxes, scores), opsets=ENDS, atol=0, rtol=0)


def test_nms_dynamic_count() -> None:
    boxes, scores = _boxes(50, 1, 40.0)
    other = _boxes(7, 2, 40.0)
    n = torch.export.Dim("n")
    check_export(
        Fn(lambda b, s: ops.nms(b, s, 0.5)),
        (boxes, scores),
        opsets=ENDS,
        atol=0,
        rtol=0,
        dynamic_shapes=(({0: n}, {0: n}),),  # Fn takes *xs
        run_args=[other],
    )


def test_batched_nms_traceable() -> None:
    """The capture-time replacement of batched_nms keeps what torchvision keeps, in its order."""
    from fastonnx.capture.traceable_detection import traceable_batched_nms

    boxes, scores = _boxes(400, 3, 60.0)
    labels = torch.randint(0, 5, (400,), generator=_gen(4))
    expected = ops.batched_nms(boxes, scores, labels, 0.5)
    torch.testing.assert_close(traceable_batched_nms(boxes, scores, labels, 0.5), expected, atol=0, rtol=0)
    check_export(
        Fn(lambda b, s, c: traceable_batched_nms(b, s, c, 0.5)),
        (boxes, scores, labels),
        opsets=ENDS,
        atol=0,
        rtol=0,
    )


# ---- roi_align / roi_pool ------------------------------------------------------------------------------

# (images, channels, height, width, rois, output size, spatial scale)
ROI_CASES = [
    (1, 3, 12, 15, 6, (3, 4), 1.0),
    (2, 4, 17, 11, 9, (2, 2), 0.5),
    (3, 2, 8, 8, 5, (7, 7), 0.25),
]
# float32 sums of 4 products per sample, up to 16 samples per bin; composed forms add them in another
# order than torchvision: a few ulp of values of size ~4
TOL = {"atol": 2e-6, "rtol": 1e-5}


@pytest.mark.parametrize("case", ROI_CASES)
@pytest.mark.parametrize("sampling_ratio", [-1, 0, 2, 5])
@pytest.mark.parametrize("aligned", [False, True])
def test_roi_align(case: tuple, sampling_ratio: int, aligned: bool) -> None:
    n, c, h, w, k, size, scale = case
    x = torch.randn(n, c, h, w, generator=_gen(1))
    rois = _rois(k, n, int(h / scale), int(w / scale), seed=k)
    fn = Fn(lambda a, r: ops.roi_align(a, r, size, scale, sampling_ratio, aligned))
    check_export(fn, (x, rois), opsets=ENDS, **TOL)


@pytest.mark.parametrize("case", ROI_CASES)
def test_roi_pool(case: tuple) -> None:
    n, c, h, w, k, size, scale = case
    x = torch.randn(n, c, h, w, generator=_gen(2))
    rois = _rois(k, n, int(h / scale), int(w / scale), seed=k + 1)
    check_export(Fn(lambda a, r: ops.roi_pool(a, r, size, scale)), (x, rois), opsets=ENDS, atol=0, rtol=0)


@pytest.mark.parametrize("case", ROI_CASES)
@pytest.mark.parametrize("sampling_ratio", [-1, 2])
def test_ps_roi_align(case: tuple, sampling_ratio: int) -> None:
    n, _, h, w, k, size, scale = case
    c = 2 * size[0] * size[1]
    x = torch.randn(n, c, h, w, generator=_gen(3))
    rois = _rois(k, n, int(h / scale), int(w / scale), seed=k + 2)[
        2:
    ]  # no zero-size roi: 0 / 0 in torchvision
    fn = Fn(lambda a, r: ops.ps_roi_align(a, r, size, scale, sampling_ratio))
    check_export(fn, (x, rois), opsets=ENDS, **TOL)


@pytest.mark.parametrize("case", ROI_CASES)
def test_ps_roi_pool(case: tuple) -> None:
    n, _, h, w, k, size, scale = case
    c = 3 * size[0] * size[1]
    x = torch.randn(n, c, h, w, generator=_gen(4))
    rois = _rois(k, n, int(h / scale), int(w / scale), seed=k + 3)
    check_export(Fn(lambda a, r: ops.ps_roi_pool(a, r, size, scale)), (x, rois), opsets=ENDS, **TOL)


def test_roi_align_dynamic_rois() -> None:
    x = torch.randn(1, 3, 10, 10, generator=_gen(5))
    rois = _rois(6, 1, 10, 10, seed=5)
    k = torch.export.Dim("k")
    check_export(
        Fn(lambda a, r: ops.roi_align(a, r, (3, 3), 1.0, -1, True)),
        (x, rois),
        opsets=ENDS,
        dynamic_shapes=(({}, {0: k}),),  # Fn takes *xs
        run_args=[(x, _rois(11, 1, 10, 10, seed=6))],
        **TOL,
    )


# ---- deform_conv2d ---------------------------------------------------------------------------------------

# (batch, in, out, H, W, kernel, stride, padding, dilation, groups, offset groups, mask)
DEFORM_CASES = [
    (1, 3, 4, 7, 8, (3, 3), (1, 1), (1, 1), (1, 1), 1, 1, True),
    (2, 4, 6, 9, 10, (3, 3), (2, 1), (1, 1), (1, 1), 2, 2, True),
    (1, 6, 3, 8, 6, (2, 3), (1, 2), (0, 1), (2, 1), 3, 3, False),
    (2, 2, 2, 5, 5, (1, 1), (1, 1), (0, 0), (1, 1), 1, 2, False),
]


@pytest.mark.parametrize("case", DEFORM_CASES)
def test_deform_conv2d(case: tuple) -> None:
    b, cin, cout, h, w, k, s, p, d, groups, off_groups, use_mask = case
    g = _gen(7)
    oh = (h + 2 * p[0] - d[0] * (k[0] - 1) - 1) // s[0] + 1
    ow = (w + 2 * p[1] - d[1] * (k[1] - 1) - 1) // s[1] + 1
    x = torch.randn(b, cin, h, w, generator=g)
    weight = torch.randn(cout, cin // groups, *k, generator=g)
    bias = torch.randn(cout, generator=g)
    # offsets of a few pixels: samples land between pixels and past the borders
    offset = torch.randn(b, 2 * off_groups * k[0] * k[1], oh, ow, generator=g) * 2
    mask = torch.rand(b, off_groups * k[0] * k[1], oh, ow, generator=g)

    def fn(x: torch.Tensor, offset: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return ops.deform_conv2d(
            x, offset, weight, bias, stride=s, padding=p, dilation=d, mask=mask if use_mask else None
        )

    # sums of cin / groups * kernel products of values ~3: float32 rounding in another order
    check_export(Fn(fn), (x, offset, mask), opsets=ENDS, atol=2e-5, rtol=1e-5)


# ---- whole detection models --------------------------------------------------------------------------


def _detector(name: str, classifier_scale: float, fpn_scale: float = 1.0, **extra: object) -> torch.nn.Module:
    """A detection model with random weights and random BatchNorm statistics, every box kept (score
    threshold 0), its classifier's weights scaled: with torchvision's initialisation, random weights
    give nearly equal scores (~1 / classes) to every box, and the order of equal scores is arbitrary
    (torch's sort and onnxruntime's NonMaxSuppression break ties differently).

    ``fpn_scale`` scales the FPN's output convolutions: a random ResNet-50 gives features ~800, box
    deltas of tens and boxes ~exp(delta) that float32 itself cannot pin down (eager float32 and float64
    then differ by 0.4 pixel); features ~10 make the boxes as well conditioned as the other models'."""
    from support.model_zoo import with_random_batchnorm_stats

    kwargs: dict = {"weights": None, "weights_backbone": None}
    if not name.startswith("ssd"):  # SSD's input size is part of the model
        kwargs.update(min_size=320, max_size=320)
    kwargs["score_thresh" if name.startswith(("retinanet", "ssd")) else "box_score_thresh"] = 0.0
    kwargs.update(extra)
    torch.manual_seed(0)
    model = with_random_batchnorm_stats(torchvision.models.get_model(name, **kwargs)).eval()
    # the last convolution of each of SSDlite's classification heads
    ssd_classifier = re.compile(r"classification_head\.module_list\.\d+\.1\.")
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "cls_score" in pname or "cls_logits" in pname or ssd_classifier.search(pname):
                p.mul_(classifier_scale)
            if "fpn.layer_blocks" in pname:
                p.mul_(fpn_scale)
    return model


def _pasted_boxes(boxes: torch.Tensor) -> torch.Tensor:
    """The integer boxes torchvision pastes 28 x 28 masks into (expanded by 30 / 28, truncated)."""
    from torchvision.models.detection import roi_heads

    return roi_heads.expand_boxes(boxes, 30 / 28).to(torch.int64)


# Detection scores are softmax / sigmoid probabilities: onnxruntime's (float32) and eager float64's are
# ~2e-6 apart (measured: 1.7e-6 Faster R-CNN, 1.2e-6 RetinaNet). Two candidates closer than this are
# ordered by rounding, which differs between CPUs (and between torch's kernels and onnxruntime's).
SCORE_TOL = 1e-5
BOX_RTOL = 2e-5


def _eager_float64(model: torch.nn.Module, batch: list[torch.Tensor]) -> tuple[list[dict], list[tuple]]:
    """The model's detections in eager float64 (the reference: what float32 approximates on any CPU)
    and, per image, the candidates of its last NMS with its IoU threshold: the boxes, scores and labels
    the detection head offered, from which the kept ones are picked. torchvision's detection models call
    ``torchvision.ops.boxes.batched_nms`` once per image for that, after every other call (the RPN's)."""
    calls: list[tuple] = []
    original = ops.boxes.batched_nms

    def recording(boxes: torch.Tensor, scores: torch.Tensor, idxs: torch.Tensor, iou: float) -> torch.Tensor:
        calls.append(({"boxes": boxes, "scores": scores, "labels": idxs}, iou))
        return original(boxes, scores, idxs, iou)

    model64 = copy.deepcopy(model).double()
    with unittest.mock.patch.object(ops.boxes, "batched_nms", recording), torch.no_grad():
        detections = model64([image.double() for image in batch])
    return detections, calls[-len(batch) :]


def _close_boxes(a: torch.Tensor, b: torch.Tensor, atol: float) -> torch.Tensor:
    """(n, m): every coordinate of a[i] within atol + BOX_RTOL * |b[j]| of b[j]'s."""
    return ((a[:, None] - b[None]).abs() <= atol + BOX_RTOL * b[None].abs()).all(dim=-1)


def _greedy_pairs(cost: torch.Tensor) -> list[tuple[int, int]]:
    """Pairs (i, j) of finite cost, cheapest first, each row and each column in one pair at most."""
    pairs: list[tuple[int, int]] = []
    rows: set[int] = set()
    cols: set[int] = set()
    finite = torch.isfinite(cost).nonzero().tolist()
    for i, j in sorted(finite, key=lambda ij: float(cost[ij[0], ij[1]])):
        if i not in rows and j not in cols:
            pairs.append((i, j))
            rows.add(i)
            cols.add(j)
    return pairs


def _match_detections(
    got: dict,
    ref: dict,
    candidates: dict,
    nms_thresh: float,
    score_thresh: float,
    limit: int,
    box_atol: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Checks onnxruntime's detections ``got`` against eager float64's ``ref`` as sets, whatever their
    order (scores a rounding apart are ordered differently by different CPUs), and returns the indices
    (into got, into ref) of the detections that are the same: same label, every box coordinate within
    ``box_atol`` (+ BOX_RTOL relative), paired nearest first. Boxes are compared coordinate by
    coordinate, not by IoU: RetinaNet keeps boxes clipped to zero width, whose IoU is 0 / 0.

    The others must be explained by rounding deciding a near-tie, each one named in the failure:
    - NMS: ORT kept candidate c where eager kept r (same label, overlapping by more than the NMS
      threshold: only one of them survives) and their scores are within SCORE_TOL. c is checked as one
      of eager float64's candidates (box to ``box_atol``, score to SCORE_TOL), so only the choice is
      left to rounding, not the arithmetic.
    - what such a near-tie suppresses: a candidate overlapping (beyond the threshold) only one side's
      winner, at a lower score, is kept on the other side only.
    - the cut-off of the top ``limit`` (or the score threshold): a detection one side has and the other
      has not, when the other side is full and its lowest score is within SCORE_TOL of it.
    An extra ORT detection must always be one of eager's candidates.
    Every pair's scores are within SCORE_TOL (+ 1e-5 relative)."""
    assert got.keys() == ref.keys()
    gb, rb, cb = got["boxes"].double(), ref["boxes"], candidates["boxes"]
    gs, rs, cs = got["scores"].double(), ref["scores"], candidates["scores"]
    gl, rl, cl = got["labels"], ref["labels"], candidates["labels"]
    # the recorded candidates are the NMS's: each kept detection is one of them, exactly
    for box, score, label in zip(rb, rs, rl):
        assert bool(((cb == box).all(dim=1) & (cs == score) & (cl == label)).any())

    apart = torch.cdist(gb, rb, p=float("inf"))  # the largest coordinate difference
    same = (gl[:, None] == rl[None]) & _close_boxes(gb, rb, box_atol)
    pairs = _greedy_pairs(apart.masked_fill(~same, float("inf")))
    left_got = sorted(set(range(len(gb))) - {i for i, _ in pairs})
    left_ref = sorted(set(range(len(rb))) - {j for _, j in pairs})

    # which float64 candidates each ORT detection is (the direct pairs' are their ref detections)
    is_candidate = (
        (gl[:, None] == cl[None])
        & _close_boxes(gb, cb, box_atol)
        & ((gs[:, None] - cs[None]).abs() <= SCORE_TOL)
    )
    overlaps_ref = ops.box_iou(cb, rb) > nms_thresh  # (candidates, ref): NaN for zero-area boxes: False
    near_ref = (cs[:, None] - rs[None]).abs() <= SCORE_TOL
    ties = torch.full((len(gb), len(rb)), float("inf"), dtype=torch.float64)
    for i in left_got:
        for j in left_ref:
            if gl[i] == rl[j] and abs(float(gs[i] - rs[j])) <= SCORE_TOL:
                if bool((is_candidate[i] & overlaps_ref[:, j] & near_ref[:, j]).any()):
                    ties[i, j] = abs(float(gs[i] - rs[j]))
    tied = _greedy_pairs(ties)
    left_got = [i for i in left_got if i not in {i for i, _ in tied}]
    left_ref = [j for j in left_ref if j not in {j for _, j in tied}]

    def at_a_cut(score: float, other: torch.Tensor) -> bool:
        full = len(other) == limit and score <= float(other.min()) + SCORE_TOL
        return full or score <= score_thresh + SCORE_TOL

    def suppressed(box: torch.Tensor, score: float, boxes: torch.Tensor, scores: torch.Tensor) -> bool:
        """Whether one of ``boxes`` scoring at least ``score`` overlaps ``box`` beyond the threshold."""
        return bool(((ops.box_iou(box[None], boxes)[0] > nms_thresh) & (scores >= score)).any())

    # what a near-tie's two sides suppress differs: a candidate that only eager's winner suppresses is
    # kept by onnxruntime alone, one that only onnxruntime's winner suppresses by eager alone
    tied_got = torch.tensor([i for i, _ in tied], dtype=torch.long)
    tied_ref = torch.tensor([j for _, j in tied], dtype=torch.long)

    def extra(i: int) -> bool:
        by_eager = suppressed(gb[i], float(gs[i]), rb[tied_ref], rs[tied_ref])
        return bool(is_candidate[i].any()) and (by_eager or at_a_cut(float(gs[i]), rs))

    def missing(j: int) -> bool:
        return suppressed(rb[j], float(rs[j]), gb[tied_got], gs[tied_got]) or at_a_cut(float(rs[j]), gs)

    def describe(boxes: torch.Tensor, scores: torch.Tensor, labels: torch.Tensor, k: int) -> str:
        return f"label {int(labels[k])} score {float(scores[k]):.8f} box {[round(float(v), 4) for v in boxes[k]]}"

    unexplained = [
        f"onnxruntime's {describe(gb, gs, gl, i)}"
        + ("" if bool(is_candidate[i].any()) else " (none of eager float64's NMS candidates)")
        for i in left_got
        if not extra(i)
    ] + [f"eager float64's {describe(rb, rs, rl, j)}" for j in left_ref if not missing(j)]
    assert not unexplained, (
        f"{len(unexplained)} detections unmatched ({len(pairs)} pairs, {len(tied)} NMS near-ties):\n"
        + "\n".join(unexplained)
    )
    every = pairs + tied
    g, r = (
        torch.tensor([i for i, _ in every], dtype=torch.long),
        torch.tensor([j for _, j in every], dtype=torch.long),
    )
    torch.testing.assert_close(gs[g], rs[r], atol=SCORE_TOL, rtol=1e-5)
    direct = (
        torch.tensor([i for i, _ in pairs], dtype=torch.long),
        torch.tensor([j for _, j in pairs], dtype=torch.long),
    )
    return direct


def _check_detector(
    model: torch.nn.Module, opset: int = 20, box_atol: float = 5e-3, images: int = 1
) -> tuple[dict, dict]:
    """Exports ``model``, runs it in onnxruntime and checks its detections against eager float64's (see
    _match_detections). Returns the first image's detections that are the same, eager's (as float32)
    then onnxruntime's, in the same order (for the models' other outputs: masks, keypoints)."""
    batch = [torch.rand(3, 320, 320, generator=_gen(i)) for i in range(images)]
    exact_all, candidates_all = _eager_float64(model, batch)
    result = fastonnx.to_onnx(model, (batch,), opset=opset)
    got_all = result(batch)
    assert len(got_all) == images
    head = getattr(model, "roi_heads", model)  # Faster / Mask / Keypoint R-CNN's, RetinaNet's own
    same = []
    for exact, (candidates, nms_thresh), got in zip(exact_all, candidates_all, got_all):
        assert len(exact["boxes"]) > 0
        # boxes are pixel coordinates up to 320 after ~60 float32 convolutions (and an exp of the box
        # deltas); onnxruntime's convolutions round differently from torch's: ~1e-5 relative (measured
        # against float64: 1e-5 to 5e-4 px, by model)
        same.append(
            _match_detections(
                got, exact, candidates, nms_thresh, head.score_thresh, head.detections_per_img, box_atol
            )
        )
    g, r = same[0]
    expected = {k: (v.float() if v.is_floating_point() else v)[r] for k, v in exact_all[0].items()}
    return expected, {k: v[g] for k, v in got_all[0].items()}


# under FASTONNX_FULL_MATRIX=1: CI runs Faster R-CNN on a batch of two images below (each image checked
# as here); RetinaNet has its own head, with the same NMS and matching
SINGLE_IMAGE = [("fasterrcnn_mobilenet_v3_large_320_fpn", 300.0), ("retinanet_resnet50_fpn", 1.0)]


@pytest.mark.full_matrix
@pytest.mark.parametrize(("name", "scale"), SINGLE_IMAGE)
def test_single_image_detector(name: str, scale: float) -> None:
    """Faster R-CNN (MobileNet v3, 320): The RPN's NMS runs per FPN level, so a box found on two levels is proposed twice: the box head
    then offers candidates a rounding apart. Measured on an AMD EPYC (Zen 3): label 31 had three
    candidates overlapping far beyond the NMS threshold, scores 0.49782722460, 0.49782722451 and
    0.49782709358 (1.3e-7 apart: 2 float32 ulps), boxes up to 0.285 px apart; float64 eager kept the
    first, onnxruntime the third, whose float64 box it matches to 1e-5 px (an NMS near-tie, not the
    box arithmetic). Two more of its boxes 1.8e-3 px from float64's are near-duplicate candidates too
    (1.3e-5 px from theirs). Proposals: onnxruntime's and float64's the same set, 2.2e-5 px apart.

    RetinaNet: Scores too close for their order to be the same everywhere, compared as sets: on an AMD EPYC
    eager float32 gives two of them exactly the same score, float64's closest are 9.9e-7 apart (and
    float32 eager swaps the 300th detection, at the cut-off: 0.5242386 against 0.5242399). Measured:
    onnxruntime's 300 are float64's, boxes 4.6e-4 px and scores 1.2e-6 apart. Each FPN level keeps
    its top 1000 candidates before NMS: those cuts are below 0.455, under the lowest detection (0.524),
    so they cannot change the detections."""
    _check_detector(_detector(name, scale))


def test_fasterrcnn_batch_of_two_images() -> None:
    # each image's box count is data-dependent (Min(150, u2)...): the per-image split reads it from the
    # value that first had that size
    _check_detector(_detector("fasterrcnn_mobilenet_v3_large_320_fpn", 300.0), images=2)


def test_paste_masks_traceable() -> None:
    """The capture-time paste covers torchvision's pixels with its values (to float32 rounding)."""
    from torchvision.models.detection import roi_heads

    from fastonnx.capture.traceable_detection import traceable_paste_masks_in_image

    g = _gen(8)
    masks = torch.rand(40, 1, 28, 28, generator=g)
    # boxes anywhere in a 300 x 310 image, some on its borders, some under a pixel wide
    xy = torch.rand(40, 2, generator=g) * 320 - 10
    wh = torch.rand(40, 2, generator=g) * torch.tensor([[200.0], [0.5]]).repeat(20, 1) + 0.02
    boxes = torch.cat([xy, xy + wh], dim=1).clamp(0, 300)
    boxes[:, 2:] = torch.maximum(boxes[:, 2:], boxes[:, :2] + 0.02)
    expected = roi_heads.paste_masks_in_image(masks, boxes, (300, 310))
    got = traceable_paste_masks_in_image(masks, boxes, (300, 310))
    assert torch.equal(got == 0, expected == 0)  # the same pixels
    # bilinear weights of values in [0, 1]: torch's kernel rounds the weights differently (~1e-6)
    torch.testing.assert_close(got, expected, atol=2e-6, rtol=0)
    assert traceable_paste_masks_in_image(masks[:0], boxes[:0], (300, 310)).shape == (0, 1, 300, 310)


def test_heatmaps_to_keypoints_traceable() -> None:
    """The capture-time keypoint decoding picks torchvision's pixels, with its scores."""
    from torchvision.models.detection import roi_heads

    from fastonnx.capture.traceable_detection import traceable_heatmaps_to_keypoints

    g = _gen(9)
    maps = torch.randn(12, 17, 56, 56, generator=g)
    xy = torch.rand(12, 2, generator=g) * 200
    rois = torch.cat([xy, xy + torch.rand(12, 2, generator=g) * 120 + 0.3], dim=1)
    rois[0, 2:] = rois[0, :2] + 0.5  # under a pixel: clamped to 1
    expected = roi_heads.heatmaps_to_keypoints(maps, rois)
    got = traceable_heatmaps_to_keypoints(maps, rois)
    torch.testing.assert_close(got[0], expected[0], atol=0, rtol=0)
    # 16 bicubic products of values ~3 summed in torch's order with weights rounded differently
    torch.testing.assert_close(got[1], expected[1], atol=1e-5, rtol=1e-6)
    empty = traceable_heatmaps_to_keypoints(maps[:0], rois[:0])
    assert empty[0].shape == (0, 17, 3) and empty[1].shape == (0, 17)


def _check_masks() -> None:
    # features ~10 (fpn_scale): eager float32 and float64 boxes then differ by ~7e-5 pixel, ONNX and
    # float64 by ~7e-5
    model = _detector("maskrcnn_resnet50_fpn", 10.0, fpn_scale=0.01, box_detections_per_img=10)
    expected, got = _check_detector(model, box_atol=5e-4)
    # the masks are pasted into integer boxes: the same ones (else the comparison is not well defined)
    assert torch.equal(_pasted_boxes(got["boxes"]), _pasted_boxes(expected["boxes"]))
    assert expected["masks"].shape == (len(expected["boxes"]), 1, 320, 320)
    # sigmoid probabilities in [0, 1] after 5 more convolutions and a bilinear resize: ONNX and float64
    # ~3e-6 apart (eager float32 and float64: ~3e-6)
    torch.testing.assert_close(got["masks"], expected["masks"], atol=2e-5, rtol=0)


def _check_keypoints() -> None:
    # 10 detections: the keypoint decoding holds ROIs x 17 x the largest ROI's area at once
    model = _detector("keypointrcnn_resnet50_fpn", 3.0, fpn_scale=0.01, box_detections_per_img=10)
    expected, got = _check_detector(model, box_atol=5e-4)
    # keypoints are (pixel + 0.5) * ROI size / its ceiling + ROI corner: the same pixels (an argmax
    # that picked another would be off by a pixel or more), positions within the boxes' tolerance
    torch.testing.assert_close(got["keypoints"], expected["keypoints"], atol=5e-4, rtol=2e-5)
    # heatmap values ~1.5 after 8 convolutions, a transposed convolution and a bicubic resize: ~3e-6
    # from float64
    torch.testing.assert_close(got["keypoints_scores"], expected["keypoints_scores"], atol=2e-5, rtol=1e-5)


# Keypoint R-CNN (the same backbone, RPN and box head as Mask R-CNN; its own keypoint head) under
# FASTONNX_FULL_MATRIX=1
RCNN_HEADS = sampled(["maskrcnn_resnet50_fpn", "keypointrcnn_resnet50_fpn"], lambda n: n.startswith("mask"))


@pytest.mark.parametrize("name", RCNN_HEADS)
def test_rcnn_with_a_head(name: str) -> None:
    (_check_masks if name.startswith("mask") else _check_keypoints)()


def test_ssdlite320_mobilenet_v3_large() -> None:
    """SSDlite with random weights gives many detections exactly the same score (its coarse feature
    maps are constant along rows), so their order is arbitrary; which of them a cut at
    detections_per_img or topk_candidates keeps, and which of two tied boxes overlapping by more than
    the NMS threshold survives, are arbitrary too (torch and onnxruntime break ties differently: 306
    against 332 detections at torchvision's 0.55). So every detection above a score threshold is kept
    (no cut), NMS suppresses nothing (IoU > 1 never holds: NMS still runs) and the two sets are
    compared: each detection matched with the one of the same label whose box is nearest (boxes of
    one label are far apart)."""
    model = _detector(
        "ssdlite320_mobilenet_v3_large",
        100.0,
        score_thresh=0.99,
        nms_thresh=1.0,
        topk_candidates=100_000,
        detections_per_img=100_000,
    )
    image = torch.rand(3, 320, 320, generator=_gen(0))
    with torch.no_grad():
        (expected,) = model([image])
    n = len(expected["boxes"])
    assert n > 100
    assert len(expected["scores"].unique()) < n // 4  # ties: what this test is about
    # the lowest score is well above the threshold: the set is not decided by rounding
    assert float(expected["scores"].min()) > 0.99 + 1e-3
    # pixel coordinates up to 320 after ~50 float32 convolutions and an exp of the box deltas: ONNX and
    # eager ~3e-5 apart (801 detections); boxes of one label are >= 16 pixels apart
    box_atol = 5e-4
    inf = float("inf")

    def distances(a: dict, b: dict) -> torch.Tensor:  # largest coordinate difference, inf across labels
        d = torch.cdist(a["boxes"].double(), b["boxes"].double(), p=inf)
        return d.masked_fill(a["labels"][:, None] != b["labels"][None, :], inf)

    apart = distances(expected, expected).fill_diagonal_(inf)
    assert float(apart.min()) > 4 * box_atol, "two detections too close for a well-defined matching"
    result = fastonnx.to_onnx(model, ([image],), opset=20)
    (got,) = result([image])
    assert got.keys() == expected.keys()
    assert len(got["boxes"]) == n
    nearest = distances(expected, got).argmin(dim=1)
    assert len(nearest.unique()) == n  # a one-to-one matching
    got = {name: value[nearest] for name, value in got.items()}
    torch.testing.assert_close(got["labels"], expected["labels"], atol=0, rtol=0)
    torch.testing.assert_close(got["boxes"], expected["boxes"], atol=box_atol, rtol=2e-5)
    # scores ~0.99 from a softmax over 91 classes: ~1e-7 apart
    torch.testing.assert_close(got["scores"], expected["scores"], atol=1e-6, rtol=1e-6)
