"""Loss and distance converters against torch's OpInfo samples, at both ends of the opset range."""

from __future__ import annotations

import pytest
import torch

from support.export_check import ENDS, Fn, check_export
from support.opinfo_harness import (
    assert_case_converts,
    opinfo_cases,
    ops_supporting,
)

OPS = [
    "nn.functional.mse_loss",
    "nn.functional.l1_loss",
    "nn.functional.smooth_l1_loss",
    "nn.functional.huber_loss",
    "nn.functional.nll_loss",
    "nn.functional.cross_entropy",
    "nn.functional.binary_cross_entropy",
    "nn.functional.binary_cross_entropy_with_logits",
    "nn.functional.kl_div",
    "nn.functional.hinge_embedding_loss",
    "nn.functional.margin_ranking_loss",
    "nn.functional.soft_margin_loss",
    "nn.functional.multi_margin_loss",
    "nn.functional.multilabel_margin_loss",
    "nn.functional.multilabel_soft_margin_loss",
    "nn.functional.poisson_nll_loss",
    "nn.functional.cosine_embedding_loss",
    "nn.functional.triplet_margin_loss",
    "nn.functional.triplet_margin_with_distance_loss",
    "nn.functional.pdist",
    "nn.functional.pairwise_distance",
    "dist",
    "cdist",
    "nn.functional.linear_cross_entropy",
    "nn.functional.linear_cross_entropy.chunked",
    "nn.functional.linear_cross_entropy.chunked_none",
]


# integer inputs: these ops promote them to a floating result (or compute in integers where torch does)
INT_OPS = ops_supporting(OPS, torch.int64)


@pytest.mark.parametrize(
    ("op_name", "dtype"),
    opinfo_cases(
        OPS,
        float16=ops_supporting(OPS, torch.float16),
        int64=INT_OPS,
        bool=["nn.functional.cosine_embedding_loss"],
    ),
)
def test_opinfo(op_name: str, dtype: torch.dtype) -> None:
    assert_case_converts(op_name, dtype)


# ---- hand-written cases: arguments and overloads the OpInfo samples do not reach ---------------------

aten = torch.ops.aten
F = torch.nn.functional


def _classes(shape: tuple[int, ...], n: int, ignore: int | None = None) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    t = torch.randint(0, n, shape, generator=gen)
    if ignore is not None:
        t.view(-1)[::3] = ignore
    return t


@pytest.mark.parametrize("reduction", [0, 1, 2])
def test_nll_loss_overloads(reduction: int) -> None:
    x = torch.randn(4, 5, 3, 2).log_softmax(1)
    t = _classes((4, 3, 2), 5, ignore=2)
    w = torch.rand(5) + 0.5

    def fn(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, ...]:
        flat_a, flat_b = a[:, :, 0, 0], b[:, 0, 0]
        return (
            aten.nll_loss2d(a, b, c, reduction, 2),
            *aten.nll_loss2d_forward(a, b, c, reduction, 2),
            *aten.nll_loss_forward(flat_a, flat_b, c, reduction, 2),
            aten.nll_loss(flat_a, flat_b, None, reduction, -100),
            aten.nll_loss_nd(a, b, None, reduction, 1),
        )

    check_export(Fn(fn), (x, t, w), opsets=ENDS)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_cross_entropy_arguments(reduction: str) -> None:
    x = torch.randn(6, 4, 3)
    t = _classes((6, 3), 4, ignore=1)
    probs = torch.rand(6, 4, 3).softmax(1)
    w = torch.rand(4) + 0.5

    def fn(a: torch.Tensor, b: torch.Tensor, p: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            F.cross_entropy(a, b, c, ignore_index=1, label_smoothing=0.2, reduction=reduction),
            F.cross_entropy(a, b, ignore_index=1, label_smoothing=0.1, reduction=reduction),
            F.cross_entropy(a, p, c, label_smoothing=0.3, reduction=reduction),
            F.cross_entropy(a[0, :, 0], b[0, 0], reduction=reduction),  # unbatched
            F.cross_entropy(a[:, :, 0], p[:, :, 0], reduction=reduction),
        )

    check_export(Fn(fn), (x, t, probs, w), opsets=ENDS)


def test_binary_losses_arguments() -> None:
    x = torch.tensor([0.0, 1.0, 0.3, 1e-30, 0.999, 0.5])  # log(0) clamps at -100
    t = torch.tensor([1.0, 0.0, 0.2, 1.0, 1.0, 0.5])
    logits = torch.tensor([-80.0, 80.0, 0.3, -2.0, 15.0, 0.0])
    w = torch.rand(6)
    pos = torch.tensor([0.5, 2.0, 3.0, 1.0, 0.1, 4.0])

    def fn(a: torch.Tensor, b: torch.Tensor, z: torch.Tensor, c: torch.Tensor, pw: torch.Tensor) -> tuple:
        return (
            F.binary_cross_entropy(a, b, reduction="none"),
            F.binary_cross_entropy(a, b, c, reduction="sum"),
            F.binary_cross_entropy_with_logits(z, b, c, pos_weight=pw, reduction="none"),
            F.binary_cross_entropy_with_logits(z, b, pos_weight=pw),
            F.kl_div(z / 100, b, reduction="batchmean", log_target=False),
            F.kl_div(z / 100, b.log(), reduction="none", log_target=True),
            F.poisson_nll_loss(a + 0.1, b * 3, log_input=False, full=True, reduction="none"),
            F.poisson_nll_loss(z / 100, b * 3, log_input=True, full=True, eps=1e-3),
        )

    check_export(Fn(fn), (x, t, logits, w, pos), opsets=ENDS)


def test_margin_and_distance_arguments() -> None:
    gen = torch.Generator().manual_seed(3)
    a, p, n = (torch.randn(5, 7, generator=gen) for _ in range(3))
    y = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0])
    labels = torch.tensor([0, 3, 6, 2, 2])
    multi = torch.tensor([[3, 0, -1, 1, 1, 2, 2], [6, 5, 4, 3, 2, 1, 0], [-1, 1, 2, 3, 4, 5, 6]] * 2)[:5]

    def fn(x1: torch.Tensor, x2: torch.Tensor, x3: torch.Tensor, t: torch.Tensor) -> tuple:
        return (
            F.triplet_margin_loss(x1, x2, x3, margin=0.5, p=1, swap=True, reduction="none"),
            F.triplet_margin_loss(x1, x2, x3, p=3, eps=1e-3),
            F.smooth_l1_loss(x1, x2, beta=0.0, reduction="none"),
            F.smooth_l1_loss(x1, x2, beta=0.5),
            F.huber_loss(x1, x2, delta=2.0, reduction="sum"),
            F.multi_margin_loss(x1, labels, p=2, margin=0.7, weight=x3[0].abs(), reduction="none"),
            F.multilabel_margin_loss(x1, multi, reduction="none"),
            aten.multilabel_margin_loss_forward(x1, multi, 2),
            F.cosine_embedding_loss(x1, x2, t, margin=0.2, reduction="none"),
            F.hinge_embedding_loss(x1, t[:, None].expand(5, 7), margin=0.3),
            F.margin_ranking_loss(x1[:, 0], x2[:, 0], t, margin=0.1, reduction="none"),
            F.pdist(x1, p=1),
            F.pdist(x1, p=float("inf")),
            F.pdist(x1, p=0.5),
            torch.dist(x1, x2, p=0),
            torch.dist(x1, x2[0], p=float("inf")),
            torch.dist(x1, x2, p=1.5),
        )

    check_export(Fn(fn), (a, p, n, y), opsets=ENDS)


def test_dynamic_batch() -> None:
    batch = torch.export.Dim("batch")

    def fn(x: torch.Tensor, t: torch.Tensor, y: torch.Tensor) -> tuple:
        return (
            F.cross_entropy(x, t, label_smoothing=0.1),
            F.nll_loss(x.log_softmax(-1), t, reduction="sum"),
            F.mse_loss(x, y),
            F.multi_margin_loss(x, t),
            F.multilabel_margin_loss(x, t[:, None].expand(-1, 4)),
        )

    args = (torch.randn(3, 4), torch.tensor([0, 3, 1]), torch.randn(3, 4))
    check_export(
        Fn(fn),
        args,
        opsets=ENDS,
        dynamic_shapes=(({0: batch}, {0: batch}, {0: batch}),),  # Fn's forward takes *xs
        run_args=[(torch.randn(6, 4), torch.tensor([2, 2, 0, 1, 3, 0]), torch.randn(6, 4))],
    )


def test_half_exp_overflows_like_torch() -> None:
    # torch stores exp(-x * y) in float16 before log1p: it overflows to inf there
    x = torch.tensor([-8.5, -1.8, 4.3, 12.0], dtype=torch.float16)
    y = torch.tensor([3.6, -8.0, -0.6, -1.0], dtype=torch.float16)
    check_export(Fn(lambda a, b: F.soft_margin_loss(a, b, reduction="none")), (x, y), atol=1e-2, rtol=1e-2)


def test_dynamic_classes() -> None:
    classes = torch.export.Dim("classes", min=2, max=1024)

    def fn(x: torch.Tensor, p: torch.Tensor) -> tuple:
        t = torch.zeros(x.shape[0], dtype=torch.long)
        return F.cross_entropy(x, t, label_smoothing=0.2), F.cross_entropy(x, p, label_smoothing=0.1)

    gen = torch.Generator().manual_seed(0)
    check_export(
        Fn(fn),
        (torch.randn(3, 4, generator=gen), torch.rand(3, 4, generator=gen).softmax(1)),
        opsets=ENDS,
        dynamic_shapes=(({1: classes}, {1: classes}),),  # Fn's forward takes *xs
        run_args=[(torch.randn(3, 9, generator=gen), torch.rand(3, 9, generator=gen).softmax(1))],
    )
