"""Pad amounts computed at run time from symbolic sizes (onnxscript's test_dynamic_paddings): one Pad
whose ``pads`` input is assembled from the int64 pieces, torch's (begin, end) pairs of the last axis
first reordered into ONNX's every-begin-then-every-end layout; checked at sizes other than the
exported ones."""

from __future__ import annotations

import onnx
import pytest
import torch
import torch.nn.functional as F

import fastonnx
from fastonnx.errors import OpsetError
from support.export_check import check_export

DYN = torch.export.Dim.DYNAMIC


class PadToOther(torch.nn.Module):
    """Pads dim 2 of x up to y's size there (the amount is y.shape[2] - x.shape[2])."""

    def __init__(self, mode: str = "constant") -> None:
        super().__init__()
        self.mode = mode

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        target = y.shape[2]
        value = 0.5 if self.mode == "constant" else None
        return F.pad(x, (0, 0, 0, target - x.shape[2]), mode=self.mode, value=value)


class PadBySize(torch.nn.Module):
    """Pads by amounts read from x's own sizes, on two axes, both sides (begins and ends differ)."""

    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[2], x.shape[3]
        return F.pad(x, (w - 1, 1, h // 2, h - 1), mode=self.mode)


def _pads_of(result: fastonnx.ExportResult) -> list[onnx.NodeProto]:
    return [n for n in result.model_proto.graph.node if n.op_type == "Pad"]


def test_pad_to_another_inputs_size() -> None:
    x, y = torch.randn(2, 3, 4, 5), torch.randn(2, 3, 7, 5)
    results = check_export(
        PadToOther(),
        (x, y),
        dynamic_shapes=({2: DYN}, {2: DYN}),
        run_args=[(torch.randn(2, 3, 2, 5), torch.randn(2, 3, 9, 5)), (x, torch.randn(2, 3, 4, 5))],
        atol=0,
        rtol=0,
    )
    for result in results:
        (pad,) = _pads_of(result)
        assert pad.input[1] not in {i.name for i in result.model_proto.graph.initializer}  # computed


def test_pad_crops_where_the_amount_is_negative() -> None:
    # exported with a positive amount, run where the target is smaller: torch crops, so does Pad
    x, y = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 5, 4)
    check_export(
        PadToOther(),
        (x, y),
        dynamic_shapes=({2: DYN}, {2: DYN}),
        run_args=[(torch.randn(1, 2, 6, 4), torch.randn(1, 2, 2, 4))],
        atol=0,
        rtol=0,
    )


@pytest.mark.parametrize("mode", ["constant", "replicate", "reflect", "circular"])
def test_pad_by_own_sizes(mode: str) -> None:
    x = torch.randn(2, 3, 4, 5)
    shapes = ({2: DYN, 3: DYN},)
    opsets = (19, 23) if mode == "circular" else (17, 23)
    check_export(
        PadBySize(mode),
        (x,),
        dynamic_shapes=shapes,
        opsets=opsets,
        # within the ranges torch.export keeps for the program (circular: a height of 4 or more)
        run_args=[(torch.randn(2, 3, 6, 3),), (torch.randn(2, 3, 5, 8),)],
        atol=0,
        rtol=0,
    )


def test_pad_replicate_reads_its_own_size() -> None:
    """The form of onnxscript's test: replicate-pad the height by the height itself."""

    class Model(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.pad(x, (0, 0, 0, x.size(2)), mode="replicate")

    check_export(
        Model(),
        (torch.rand(2, 1, 3, 2),),
        dynamic_shapes=({0: DYN, 2: DYN},),
        run_args=[(torch.rand(3, 1, 5, 2),), (torch.rand(1, 1, 2, 2),)],
        atol=0,
        rtol=0,
    )


def test_circular_pad_by_computed_amounts_needs_opset_19() -> None:
    ep = torch.export.export(
        PadBySize("circular"), (torch.randn(2, 3, 4, 5),), dynamic_shapes=({2: DYN, 3: DYN},), strict=False
    )
    with pytest.raises(OpsetError, match=r"circular padding.*opset >= 19"):
        fastonnx.to_onnx(ep, (torch.randn(2, 3, 4, 5),), opset=18)
