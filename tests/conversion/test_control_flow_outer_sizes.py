"""Subgraph bodies (Scan, If, Loop) reading the outer graph's symbolic sizes, with writes in place inside
the body (torch.onnx's test_scan_loop_inplace). A body's formal inputs carry torch's shapes, so a size
read inside it is an outer input's symbol, recomputed in the body from that input's Shape (an outer
value, read by name); a converter handing back an outer value unchanged (a cached size, an operand)
leaves it typed where it was made. Checked at sizes other than the exported ones."""

from __future__ import annotations

from typing import Any

import onnx
import torch
from torch._higher_order_ops.scan import scan
from torch._higher_order_ops.while_loop import while_loop

from support.export_check import check_export

DYN = torch.export.Dim.DYNAMIC


def _dummy_loop(padded: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """What the scan computes, as a Python loop (eager runs this; torch.export records the scan)."""
    copy = torch.zeros(padded.shape)
    for i in range(pos.shape[0]):
        p = pos[i]
        copy[i, :p] = padded[i, :p]
    return copy


def _dummy_loop_with_scan(padded: torch.Tensor, pos: torch.Tensor) -> Any:
    def pad_row(padded: torch.Tensor, p: torch.Tensor) -> tuple[torch.Tensor]:
        row = torch.zeros((padded.shape[0],))  # padded.shape[0] is images.shape[1], an outer size
        torch._check(p.item() > 0)
        torch._check(p.item() < padded.shape[0] + 1)
        x = padded[: p.item()]
        row[: p.item()] = x  # a write in place into the body's buffer
        return (row,)

    return torch.ops.higher_order.scan(pad_row, [], [padded, pos], [])


class ScanModel(torch.nn.Module):
    def forward(self, images: torch.Tensor, position: torch.Tensor) -> Any:
        if torch.compiler.is_exporting():
            return _dummy_loop_with_scan(images, position)
        return (_dummy_loop(images, position),)


def _body_reads(proto: onnx.ModelProto, op_type: str, outer: str) -> list[onnx.NodeProto]:
    """The Shape nodes inside the bodies of ``op_type`` nodes that read the outer value ``outer``."""
    found = []
    for node in proto.graph.node:
        if node.op_type != op_type:
            continue
        for attr in node.attribute:
            for g in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else []:
                found += [n for n in g.node if n.op_type == "Shape" and n.input[0] == outer]
    return found


def test_scan_loop_inplace() -> None:
    x = torch.randn((5, 6))
    y = torch.arange(5, dtype=torch.int64) + 1
    results = check_export(
        ScanModel(),
        (x, y),
        dynamic_shapes={"images": {0: DYN, 1: DYN}, "position": {0: DYN}},
        run_args=[
            (torch.randn(7, 9), torch.tensor([1, 9, 4, 2, 8, 3, 5])),
            (torch.randn(3, 4), torch.tensor([4, 1, 2])),
        ],
        atol=0,
        rtol=0,
    )
    for result in results:
        # the body's row size is images.shape[1], read from the outer input inside the body
        assert _body_reads(result.model_proto, "Scan", "images"), "no Shape(images) in the Scan body"


class ScanCarryReadsOuterSize(torch.nn.Module):
    """A carried buffer updated in place where the update's extent is an outer input's size, scaled by
    sizes of the carry (a formal input of the body) and of the scanned input."""

    def forward(self, init: torch.Tensor, xs: torch.Tensor, limit: torch.Tensor) -> Any:
        def combine(carry: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            buf = carry.clone()
            buf[: limit.shape[0]] += x[: limit.shape[0]] * xs.shape[0] / carry.shape[0]
            return buf, buf.sum()

        return scan(combine, init, xs)


def test_scan_carry_written_in_place_reads_outer_sizes() -> None:
    check_export(
        ScanCarryReadsOuterSize(),
        (torch.randn(6), torch.randn(4, 6), torch.randn(3)),
        dynamic_shapes=({0: DYN}, {0: DYN, 1: DYN}, {0: DYN}),
        run_args=[(torch.randn(8), torch.randn(5, 8), torch.randn(2))],
    )


class CondWritesAndReadsSizes(torch.nn.Module):
    """Each branch reads the operands' symbolic sizes; one writes in place into a buffer it made."""

    def forward(self, images: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        def yes(images: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
            row = torch.zeros((images.shape[1],))
            row[: position.shape[0]] = position
            return row + images.shape[0]

        def no(images: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
            return images.sum(0) * images.shape[1]

        return torch.cond(images.sum() > 0, yes, no, (images, position))


class CondClosesOverOuterSize(torch.nn.Module):
    """The branches read an outer input's size through a closure (torch.export passes it in)."""

    def forward(self, images: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        n = images.shape[1]

        def yes(position: torch.Tensor) -> torch.Tensor:
            out = torch.zeros(n)
            out[: position.shape[0]] = position
            return out

        def no(position: torch.Tensor) -> torch.Tensor:
            return torch.ones(n) * position.shape[0]

        return torch.cond(position.sum() > 0, yes, no, (position,))


def _cond_runs() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    runs = []
    for rows, cols, k in ((4, 9, 7), (3, 4, 2)):
        images, position = torch.randn(rows, cols, generator=g), torch.randn(k, generator=g)
        runs += [(images.abs(), position.abs()), (-images.abs(), -position.abs())]  # both branches
    return runs


def test_cond_branches_read_outer_sizes() -> None:
    args = (torch.randn(5, 6).abs(), torch.randn(3).abs())
    shapes = ({0: DYN, 1: DYN}, {0: DYN})
    for model in (CondWritesAndReadsSizes(), CondClosesOverOuterSize()):
        check_export(model, args, dynamic_shapes=shapes, run_args=_cond_runs())


class WhileLoopReadsOuterSizes(torch.nn.Module):
    """The condition and the body read outer sizes; the condition runs once outside the Loop too, so
    the size it computes there is an outer value the body reads again."""

    def forward(self, images: torch.Tensor, position: torch.Tensor) -> Any:
        def cond_fn(i: torch.Tensor, acc: torch.Tensor) -> torch.Tensor:
            return i < images.shape[0]

        def body_fn(i: torch.Tensor, acc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            buf = torch.zeros(images.shape[1])
            buf[: position.shape[0]] = position
            return i + 1, acc + buf

        start = (torch.zeros((), dtype=torch.int64), torch.zeros(images.shape[1]))
        return while_loop(cond_fn, body_fn, start)


def test_while_loop_reads_outer_sizes() -> None:
    check_export(
        WhileLoopReadsOuterSizes(),
        (torch.randn(5, 6), torch.randn(3)),
        dynamic_shapes=({0: DYN, 1: DYN}, {0: DYN}),
        run_args=_cond_runs(),
    )
