"""Conversion errors carry the builder's state (``.debug``, debug.py); the message shows it with
FASTONNX_DEBUG=1 or verbose=True; verbose=True logs each stage."""

from __future__ import annotations

import logging

import pytest
import torch

import fastonnx


@torch.library.custom_op("fastonnx_debug_test::enigma", mutates_args=())
def enigma(x: torch.Tensor) -> torch.Tensor:
    """A user's op without converter."""
    return x.cos()


@enigma.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class UsesEnigma(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(x * 3)
        return enigma(y) + 1


class Small(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x * 2) + 1


def test_unsupported_op_carries_the_dump_but_a_short_message(monkeypatch) -> None:
    monkeypatch.delenv("FASTONNX_DEBUG", raising=False)
    with pytest.raises(fastonnx.UnsupportedOpError) as info:
        fastonnx.to_onnx(UsesEnigma(), (torch.randn(2, 5),), opset=19)
    text = info.value.debug
    assert text.startswith("fastonnx debug: opset 19, FX node 4 of 6")
    assert "FX node: %enigma" in text and "target: fastonnx_debug_test.enigma.default" in text
    assert "  arg 0: relu: float32[2, 5]" in text
    assert "expected result: float32[2, 5]" in text
    # the last nodes added, with their inputs and outputs (and the outputs' types)
    assert "Mul: Mul(x, const) -> mul: float32[2, 5]" in text
    assert "Relu: Relu(mul) -> relu: float32[2, 5]" in text
    assert "fastonnx debug" not in str(info.value)


@pytest.mark.parametrize("how", ["env", "verbose"])
def test_message_includes_the_dump_when_asked(monkeypatch, how) -> None:
    monkeypatch.delenv("FASTONNX_DEBUG", raising=False)
    if how == "env":
        monkeypatch.setenv("FASTONNX_DEBUG", "1")
    with pytest.raises(fastonnx.UnsupportedOpError) as info:
        fastonnx.to_onnx(UsesEnigma(), (torch.randn(2, 5),), verbose=how == "verbose")
    msg = str(info.value)
    assert msg.startswith("no converter for fastonnx_debug_test.enigma.default")
    assert "fastonnx debug: opset 20, FX node 4 of 6" in msg and "Relu(mul)" in msg


def test_conversion_error_from_a_failing_converter_carries_the_dump() -> None:
    def broken(ctx, x):
        raise ValueError("this converter is broken")

    with pytest.raises(fastonnx.ConversionError, match="this converter is broken") as info:
        fastonnx.to_onnx(Small(), (torch.randn(3),), custom_converters={torch.ops.aten.relu.default: broken})
    assert "FX node 3 of 5" in info.value.debug and "target: aten.relu.default" in info.value.debug
    assert info.value.fx_node.name == "relu"


def test_graph_error_from_the_builder_carries_the_dump() -> None:
    def reads_nothing(ctx, x):
        return ctx.op("Relu", "no_such_value")

    with pytest.raises(fastonnx.GraphError, match="no_such_value") as info:
        fastonnx.to_onnx(
            Small(), (torch.randn(3),), custom_converters={torch.ops.aten.relu.default: reads_nothing}
        )
    text = info.value.debug
    assert "FX node 3 of 5" in text and "Mul: Mul(x, const) -> mul: float32[3]" in text


def test_verbose_logs_each_stage(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="fastonnx"):
        fastonnx.to_onnx(Small(), (torch.randn(3),), verbose=True, verify=True)
    messages = [r.getMessage() for r in caplog.records if r.name == "fastonnx"]
    for stage in ("capture:", "convert:", "optimize:", "verify:"):
        assert any(m.startswith(stage) for m in messages), (stage, messages)
    assert logging.getLogger("fastonnx").level == logging.NOTSET  # restored


def test_verbose_prints_stages_on_stderr_when_nothing_handles_the_logger(tmp_path) -> None:
    import os
    import subprocess
    import sys

    script = (
        "import torch, fastonnx\n"
        "class M(torch.nn.Module):\n"
        "    def forward(self, x): return x * 2\n"
        "fastonnx.to_onnx(M(), (torch.randn(3),), verbose=True)\n"
        "fastonnx.to_onnx(M(), (torch.randn(3),))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("[fastonnx]")]
    assert [ln.split(":")[0] for ln in lines[:3]] == [
        "[fastonnx] capture",
        "[fastonnx] convert",
        "[fastonnx] optimize",
    ]
    assert len([ln for ln in lines if ln.startswith("[fastonnx] capture")]) == 1  # the second call is quiet


def test_graph_error_outside_any_node_carries_the_stage_and_builder(monkeypatch, tmp_path) -> None:
    from fastonnx.pipeline import options

    # an optimization level the Rust side refuses: a GraphError raised by optimize, after every node
    monkeypatch.setitem(options.OPTIMIZE_LEVELS, True, "bogus")
    path = tmp_path / "r.md"
    with pytest.raises(fastonnx.GraphError, match="unknown optimization level") as info:
        fastonnx.to_onnx(Small(), (torch.randn(3),), report=path)
    text = info.value.debug
    assert text.startswith("fastonnx debug: opset 20, stage optimize")
    assert "Add: Add(relu, const_1) -> add: float32[3]" in text
    assert "export FAILED at optimize (GraphError)" in path.read_text()


def test_a_refused_opset_carries_a_dump_of_the_stage() -> None:
    with pytest.raises(fastonnx.OpsetError) as info:
        fastonnx.to_onnx(Small(), (torch.randn(3),), opset=3)
    assert info.value.debug == "fastonnx debug: opset 3, stage checking arguments"
