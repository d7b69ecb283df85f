"""The markdown report (export_report.py): written on success and on failure at each stage, each section
present and naming the right op and source line."""

from __future__ import annotations

import re

import pytest
import torch

import fastonnx


class DataDependent(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # data-dependent control flow: torch.export cannot capture it
            return x * 2
        return x - 1


@torch.library.custom_op("fastonnx_report_test::riddle", mutates_args=())
def riddle(x: torch.Tensor) -> torch.Tensor:
    """A user's op without converter."""
    return x.sin()


@riddle.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class UsesRiddle(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(x * 3)
        return riddle(y) + 1


class ConvNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.bn = torch.nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x))).relu()


def sections(text: str) -> list[str]:
    return re.findall(r"^## (.+)$", text, flags=re.M)


def test_report_on_capture_failure_names_the_users_line(tmp_path) -> None:
    path = tmp_path / "capture.md"
    with pytest.raises(fastonnx.CaptureError) as info:
        fastonnx.to_onnx(DataDependent(), (torch.randn(3),), report=path)
    assert str(path) in str(info.value)  # the message names the report
    text = path.read_text()
    assert "export FAILED at capture (CaptureError)" in text
    assert sections(text)[:3] == ["Versions", "Model", "Capture"]
    assert f"| torch | {torch.__version__} |" in text
    assert "- args: `(float32[3],)`" in text
    capture = text.split("## Capture")[1]
    assert "test_report.py:" in capture and "`if x.sum() > 0:" in capture
    assert "torch.export.export failed on DataDependent" in capture
    assert "## Failure at" not in text  # the capture section holds the failure


def test_report_on_conversion_failure_names_op_node_and_builder_state(tmp_path) -> None:
    path = tmp_path / "convert.md"
    with pytest.raises(fastonnx.UnsupportedOpError) as info:
        fastonnx.to_onnx(UsesRiddle(), (torch.randn(2, 5),), report=path)
    assert f"(fastonnx report: {path})" in str(info.value)
    text = path.read_text()
    assert "export FAILED at convert (UnsupportedOpError)" in text
    assert sections(text) == [
        "Versions",
        "Model",
        "Capture",
        "Op inventory",
        "Failure at convert",
        "Stage timings (s)",
    ]
    assert "| `fastonnx_report_test.riddle.default` | 1 | **missing** | - |" in text
    assert "| `aten.relu.default` | 1 | yes | activations |" in text
    assert "| `aten.mul.Tensor` | 1 | yes | elementwise |" in text
    assert "missing converters: `fastonnx_report_test.riddle.default`" in text
    failure = text.split("## Failure at convert")[1]
    assert "- FX node: `riddle` = `fastonnx_report_test.riddle.default`" in failure
    assert "test_report.py" in failure and "return riddle(y) + 1" in failure
    assert "  - arg 0: `relu: float32[2, 5]`" in failure
    # the builder state: the values made before the failing node, with dtype and shape
    assert "| `mul` | float32[2, 5] | Mul |" in failure
    assert "| `relu` | float32[2, 5] | Relu |" in failure
    assert "### Debug dump" in failure and "FX node 4 of 6" in failure


def test_report_on_success_with_optimization_and_verification(tmp_path) -> None:
    target = tmp_path / "net.onnx"
    x = torch.randn(1, 3, 8, 8)

    def relu_mine(ctx, x):  # a correct custom converter: listed as custom in the inventory
        return ctx.op("Relu", x)

    result = fastonnx.to_onnx(
        ConvNet().eval(),
        (x,),
        filename=target,
        report=True,
        verify=True,
        custom_converters={torch.ops.aten.relu.default: relu_mine},
    )
    path = tmp_path / "net.report.md"  # report=True: next to the model file
    assert result.stats["report"] == str(path)
    text = path.read_text()
    assert "**Status:** export succeeded." in text
    assert sections(text) == [
        "Versions",
        "Model",
        "Capture",
        "Op inventory",
        "Stage timings (s)",
        "ONNX nodes by op type",
        "Verification (onnxruntime vs eager PyTorch)",
    ]
    assert "| `aten.relu.default` | 2 | custom | your custom_converters |" in text
    assert "| `aten.conv2d.default` | 1 | yes | convolution |" in text
    assert "custom converters used: `aten.relu.default`" in text
    for stage in ("capture", "convert", "optimize", "write", "verify"):
        assert re.search(rf"^\| {stage} \| \d+\.\d{{3}} \|$", text, flags=re.M), stage
    # the BatchNorm is folded into the convolution by the optimizer: before 1, after 0
    assert "| BatchNormalization | 1 | 0 |" in text
    passes = re.search(r"changed the graph \(times applied\): (.+)", text)
    assert passes is not None and "none" not in passes.group(1)
    assert "| Conv | 1 | 1 |" in text
    assert re.search(
        r"\| `relu_1` \| float32 \| \[1, 4, 6, 6\] \| [^|]+ \| [^|]+ \| [^|]+ \| [^|]+ \| pass \|", text
    )
    assert "**All outputs agree.**" in text


def test_report_true_without_filename_goes_to_the_current_folder(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    fastonnx.to_onnx(ConvNet().eval(), (torch.randn(1, 3, 8, 8),), report=True)
    assert (tmp_path / "ConvNet.report.md").exists()


def test_report_of_bad_arguments_says_capture_was_not_reached(tmp_path) -> None:
    path = tmp_path / "args.md"
    with pytest.raises(fastonnx.OpsetError):
        fastonnx.to_onnx(ConvNet(), (torch.randn(1, 3, 8, 8),), opset=3, report=path)
    text = path.read_text()
    assert "FAILED at checking arguments (OpsetError)" in text and "- not reached" in text


@pytest.mark.parametrize(
    ("stage", "method", "error"),
    [
        ("write", "save", fastonnx.SerializationError("no space left on device")),
        ("verify", "__call__", fastonnx.RuntimeCheckError("onnxruntime failed to run the exported model")),
    ],
)
def test_report_on_failure_after_conversion(tmp_path, monkeypatch, stage, method, error) -> None:
    # the writer and onnxruntime do not fail on request: their failure is simulated where it surfaces
    def fail(*args, **kwargs):
        raise error

    message = str(error)  # before to_onnx appends the report's path to it
    monkeypatch.setattr(fastonnx.ExportResult, method, fail)
    path = tmp_path / "late.md"
    with pytest.raises(type(error)) as info:
        fastonnx.to_onnx(
            ConvNet().eval(),
            (torch.randn(1, 3, 8, 8),),
            filename=tmp_path / "n.onnx",
            verify=True,
            report=path,
        )
    assert str(path) in str(info.value)
    text = path.read_text()
    assert f"export FAILED at {stage} ({type(error).__name__})" in text
    assert f"## Failure at {stage}" in text
    assert message in text.split(f"## Failure at {stage}")[1]
    # conversion and optimization ran: their node counts are in the report
    assert "| BatchNormalization | 1 | 0 |" in text


def test_report_of_a_wrong_type_is_refused() -> None:
    with pytest.raises(fastonnx.InputError, match="report must be False, True or a path, got int"):
        fastonnx.to_onnx(ConvNet(), (torch.randn(1, 3, 8, 8),), report=3)  # type: ignore[arg-type]
