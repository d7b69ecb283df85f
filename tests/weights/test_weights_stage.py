"""The weights stage (pipeline/stages.py): ``plan_weights`` before the passes, ``place_weights`` after
them. Each returns what it decided (what is still deferred, which checkpoint tensors remain to be
referenced) and leaves the converter's records and the plan it was given as they were; run by hand,
the stages write the file to_onnx writes."""

from __future__ import annotations

import pathlib

import onnxruntime
import torch
from safetensors.torch import save_file

import fastonnx
from fastonnx.pipeline import stages
from fastonnx.pipeline.options import ExportOptions, new_builder
from fastonnx.registry import Registry
from fastonnx.result import ExportResult
from fastonnx.stored_weights import checkpoints


class TwoLinears(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(64, 64)
        self.fc2 = torch.nn.Linear(64, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def _names(converted: stages.Converted) -> dict[str, str]:
    """state-dict key -> initializer name."""
    return {key: name for name, (key, _, _) in converted.interp.weights_read.items()}


def test_the_stage_returns_its_plan_and_leaves_the_records_alone(tmp_path: pathlib.Path) -> None:
    torch.manual_seed(0)
    real = TwoLinears().eval()
    save_file(real.state_dict(), str(tmp_path / "model.safetensors"))
    with torch.device("meta"):
        meta = TwoLinears().eval()
    x = torch.randn(2, 3, 64)  # 3-D: the Linear is a MatMul of the transposed weight, then read as stored
    # fc1's weight quantized from the checkpoint, fc2's referenced in place, both biases referenced
    keywords = dict(weights=tmp_path, quantize=fastonnx.WeightQuantization(bits=8, exclude=("fc2",)))
    options = ExportOptions.from_keywords(filename=tmp_path / "by_hand.onnx", **keywords)
    registry = Registry()
    args = (x.to("meta"),)
    captured = stages.run_capture(meta, args, {}, options, registry)
    builder = new_builder(options.opset)
    converted = stages.run_convert(captured.ep, builder, (args, {}), captured.requested, options, registry)
    names = _names(converted)
    every = set(names.values())
    assert set(converted.interp.deferred) == every  # a meta-device model: no weight has bytes

    planned = stages.plan_weights(converted, meta, options)
    assert planned.quantized is not None and list(planned.quantized["quantized"]) == ["fc1"]
    # read from the checkpoint by the quantizer: neither deferred nor to be referenced any more
    assert set(planned.deferred) == every - {names["fc1.weight"]}
    assert planned.plan is not None
    assert set(planned.plan.entries) == every - {names["fc1.weight"]}
    assert planned.read_as_stored == 1  # fc2's Linear reads its weight as stored
    assert set(converted.interp.deferred) == every  # the converter's record is unchanged

    optimized = stages.run_optimize(converted, options)
    placed = stages.place_weights(builder, planned)
    assert placed.deferred is None  # every hole filled from the checkpoint: nothing for attach_weights
    assert placed.referenced is not None
    assert placed.referenced.referenced_names == every - {names["fc1.weight"]}
    assert set(planned.plan.entries) == every - {names["fc1.weight"]}  # the plan is unchanged
    assert set(converted.interp.deferred) == every

    stats = stages.optimize_stats(converted, optimized, placed)
    assert list(stats) == ["optimize", "metadata_s", "quantize", "optimize_s", "nodes", "initializers"]
    ep = captured.ep
    result = ExportResult(builder, converted.layout, ep.call_spec.in_spec, ep.call_spec.out_spec, stats)
    written = stages.run_write(result, placed.referenced, options)
    assert written.file is not None and written.file["weights"]["referenced_tensors"] == 3

    expected = fastonnx.to_onnx(meta, args, filename=tmp_path / "to_onnx.onnx", **keywords)
    assert list(expected.stats)[list(expected.stats).index("optimize") :][:6] == list(stats)
    for suffix in (".onnx", ".onnx.data"):
        by_hand = (tmp_path / f"by_hand{suffix}").read_bytes()
        assert by_hand == (tmp_path / f"to_onnx{suffix}").read_bytes().replace(b"to_onnx", b"by_hand")

    session = onnxruntime.InferenceSession(str(tmp_path / "by_hand.onnx"), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    with torch.no_grad():
        # int8 blocks of 32 in fc1: a few thousandths off the float model
        torch.testing.assert_close(torch.from_numpy(got), real(x), atol=2e-2, rtol=2e-2)


def test_a_plan_without_some_entries_is_a_new_plan() -> None:
    entry = checkpoints.ShardTensor("s.safetensors", torch.float32, (2,), 8, 8)
    plan = checkpoints.ReferencePlan(
        "folder", {"a": (entry, torch.float32), "b": (entry, torch.float32)}, convert_names={"b"}
    )
    less = plan.without({"a"})
    assert set(less.entries) == {"b"} and set(plan.entries) == {"a", "b"}
    assert (less.folder, less.convert_names) == (plan.folder, plan.convert_names)
