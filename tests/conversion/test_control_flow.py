"""torch.cond → If, while_loop → Loop, scan → Scan, with subgraphs reading outer values, nested once."""

from __future__ import annotations

import torch
from torch._higher_order_ops.scan import scan
from torch._higher_order_ops.while_loop import while_loop

from support.export_check import ENDS, check_export


class Cond(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(3))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        def yes(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return x.sin() + y * self.w  # reads a weight from the outer graph

        def no(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return x.cos() - y

        return torch.cond(x.sum() > 0, yes, no, (x, y))


def test_cond_takes_both_branches() -> None:
    x, y = torch.randn(3).abs(), torch.randn(3)
    check_export(Cond(), (x, y), opsets=ENDS, run_args=[(-x, y)])


class NestedCond(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def outer_yes(x: torch.Tensor) -> torch.Tensor:
            return torch.cond(x.mean() > 1, lambda t: t * 3, lambda t: t + 1, (x,))

        return torch.cond(x.sum() > 0, outer_yes, lambda t: -t, (x,))


def test_nested_cond() -> None:
    x = torch.rand(4)
    check_export(NestedCond(), (x,), opsets=ENDS, run_args=[(x + 2,), (-x,)])


class WhileLoop(torch.nn.Module):
    def forward(self, x: torch.Tensor, limit: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        def cond_fn(i: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            return i < limit  # an additional input read by the condition

        def body_fn(i: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return i + 1, x * 2 + 1

        return while_loop(cond_fn, body_fn, (torch.zeros((), dtype=torch.int64), x))


def test_while_loop() -> None:
    x = torch.randn(2, 3)
    check_export(
        WhileLoop(), (x, torch.tensor(3)), opsets=ENDS, run_args=[(x, torch.tensor(0)), (x, torch.tensor(5))]
    )


class CumulativeScan(torch.nn.Module):
    def forward(
        self, init: torch.Tensor, xs: torch.Tensor, w: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        def combine(carry: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            nxt = carry + x * w  # w comes from the outer graph
            return nxt, nxt.sin()

        return scan(combine, init, xs)


def test_scan() -> None:
    check_export(CumulativeScan(), (torch.randn(3), torch.randn(5, 3), torch.randn(3)), opsets=ENDS)
