"""Bad input raises a named fastonnx error that says what and where, and leaves no file behind."""

from __future__ import annotations

import os

import pytest
import torch

import fastonnx


class Tiny(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1


def test_model_of_wrong_type() -> None:
    with pytest.raises(fastonnx.InputError, match="nn.Module or a torch.export.ExportedProgram"):
        fastonnx.to_onnx(lambda x: x, (torch.randn(2),))


def test_args_not_a_tuple() -> None:
    with pytest.raises(fastonnx.InputError, match="args must be a tuple"):
        fastonnx.to_onnx(Tiny(), [torch.randn(2)])  # type: ignore[arg-type]


@pytest.mark.parametrize("opset", [16, fastonnx.MAX_OPSET + 1, "18"])
def test_opset_out_of_range(opset) -> None:
    with pytest.raises(fastonnx.OpsetError, match="opset"):
        fastonnx.to_onnx(Tiny(), (torch.randn(2),), opset=opset)


def test_unwritable_filename(tmp_path) -> None:
    missing = tmp_path / "no" / "such" / "dir" / "m.onnx"
    with pytest.raises(fastonnx.FastOnnxError, match="does not exist"):
        fastonnx.to_onnx(Tiny(), (torch.randn(2),), filename=missing)
    assert not missing.parent.exists()


@torch.library.custom_op("fastonnx_test::mystery", mutates_args=())
def mystery(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """A user's own op: fastonnx has no converter for it, and never will."""
    return x * y


@mystery.register_fake
def _(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class UsesUnknownOp(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        return mystery(y, y)


def test_unsupported_op_names_op_node_and_line(tmp_path) -> None:
    target = tmp_path / "m.onnx"
    target.write_bytes(b"previous file")
    with pytest.raises(fastonnx.UnsupportedOpError) as info:
        fastonnx.to_onnx(UsesUnknownOp(), (torch.randn(3),), filename=target)
    msg = str(info.value)
    assert "fastonnx_test.mystery" in msg
    assert "FX node 'mystery'" in msg
    assert "test_errors.py" in msg and "return mystery(y, y)" in msg
    assert "node 3 of 4" in msg
    assert target.read_bytes() == b"previous file"
    assert os.listdir(tmp_path) == ["m.onnx"]


def test_custom_converter_is_used_and_reported() -> None:
    def mystery_as_mul(ctx, x, y):  # what the op computes, as a user would write it
        return ctx.op("Mul", x, y)

    x = torch.rand(3) + 1
    result = fastonnx.to_onnx(
        UsesUnknownOp(), (x,), custom_converters={torch.ops.fastonnx_test.mystery.default: mystery_as_mul}
    )
    torch.testing.assert_close(result(x), (x * 2) * (x * 2))
    assert result.stats["custom_converters_used"] == ["fastonnx_test.mystery.default"]


def test_input_names_of_wrong_length() -> None:
    with pytest.raises(fastonnx.InputError, match="input_names has 2 names"):
        fastonnx.to_onnx(Tiny(), (torch.randn(2),), input_names=["a", "b"])


class ReturnsOnlyASize(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Size:
        return x.shape


def test_model_without_tensor_outputs_is_refused() -> None:
    with pytest.raises(fastonnx.InputError, match="returns no tensor"):
        fastonnx.to_onnx(ReturnsOnlyASize(), (torch.randn(2, 3),))
