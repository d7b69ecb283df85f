"""``export_pretrained(target=...)`` / ``fastonnx export --target`` (issue 43, part 3): each target's
package of a tiny Llama (and, under the full matrix, Qwen2, Gemma 3 and GPT-OSS) at the standard and
onnxruntime levels loads and runs on the CPU and verifies
against transformers, holds only ops its provider has kernels for, and carries the builder's provider
section in genai_config.json; an op the target lacks, and a precision it cannot run, are named errors.

CI exports the cpu and webgpu packages (IN_CI) and DirectML's up to its refused check; every pair under
FASTONNX_FULL_MATRIX=1.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from checkpoint_folders import save_decoder
from onnx import TensorProto, helper

import fastonnx
from fastonnx.pretrained import targets
from support.matrix import sampled

LEVELS = {"default": True, "onnxruntime": "onnxruntime"}
FAMILIES = ("llama", "qwen2", "gemma3", "gpt_oss")
CASES = [(f, t, level) for f in FAMILIES for t in targets.TARGETS for level in LEVELS]
# CI: the default target through the CLI and the one whose package is rewritten (WebGPU: no FusedMatMul);
# DirectML is exported up to its check by the refusal test; every pair under FASTONNX_FULL_MATRIX=1
IN_CI = {("cpu", "default"), ("webgpu", "onnxruntime")}

# the builder's genai_config provider_options for each EP (onnxruntime_genai builders/base.py ep_attrs,
# its defaults), written out here so that the module's table is checked against them
BUILDER_PROVIDER_OPTIONS: dict[str, list[dict[str, Any]]] = {
    "cpu": [],
    "cuda": [{"cuda": {"enable_cuda_graph": "0"}}],
    "dml": [{"dml": {"enable_graph_capture": "1"}}],
    "webgpu": [{"webgpu": {"enableGraphCapture": "0", "validationMode": "basic"}}],
}
DEFAULT_DTYPES = {"cpu": "fp32", "cuda": "fp16", "dml": "fp16", "webgpu": "fp16"}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pathlib.Path]:
    """Each family's tiny folder, saved once for the module."""
    return {}


def _folder(
    folders: dict[str, pathlib.Path], family: str, tmp_path_factory: pytest.TempPathFactory
) -> pathlib.Path:
    if family not in folders:
        folders[family] = tmp_path_factory.mktemp(family)
        save_decoder(folders[family], family)
    return folders[family]


@pytest.fixture(scope="module")
def llama(folders: dict[str, pathlib.Path], tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return _folder(folders, "llama", tmp_path_factory)


def _ops(path: pathlib.Path) -> set[tuple[str, str]]:
    return {(n.domain, n.op_type) for n in onnx.load(str(path), load_external_data=False).graph.node}


@pytest.mark.parametrize(
    ("family", "target", "level"), sampled(CASES, lambda c: c[0] == "llama" and c[1:] in IN_CI)
)
def test_target_package(
    folders: dict[str, pathlib.Path],
    tmp_path_factory: pytest.TempPathFactory,
    tmp_path: pathlib.Path,
    family: str,
    target: str,
    level: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    folder = _folder(folders, family, tmp_path_factory)
    out = tmp_path / "out"
    if family == "gpt_oss" and target != "cpu":
        # GPT-OSS's routed experts (a SequenceMap over SplitToSequence) run on the CPU's kernels only
        with pytest.raises(fastonnx.InputError, match=f"not for target '{target}'.*SplitToSequence"):
            fastonnx.export_pretrained(folder, out, target=target, optimize=LEVELS[level], progress=False)
        assert not out.exists()
        return
    if (target, level) == ("cpu", "default"):  # the CLI's path once: its flag and its summary line
        from fastonnx.pretrained.cli import main

        assert main(["export", str(folder), str(out), "--target", target, "--no-progress"]) == 0
        printed = capsys.readouterr().out
        assert "verification: verified" in printed
        assert "target: cpu, dtype fp32; op set checked against cpu's kernels (onnxruntime 1.31" in printed
        report = (out / "fastonnx_report.md").read_text(encoding="utf-8")
    else:
        written = fastonnx.export_pretrained(
            folder, out, target=target, optimize=LEVELS[level], progress=False
        )
        # run on the CPU in onnxruntime against transformers (fp16 within the half tolerance)
        assert written.verified is True, written.verify_note
        assert written.stats["target"] == {"name": target, "dtype": DEFAULT_DTYPES[target]}
        report = written.report_path.read_text(encoding="utf-8")
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    half = DEFAULT_DTYPES[target] == "fp16"
    logits = next(o for o in model.graph.output if o.name == "logits")
    assert logits.type.tensor_type.elem_type == (TensorProto.FLOAT16 if half else TensorProto.FLOAT)
    assert targets.missing_kernels(model, target) == []
    contrib = {op for domain, op in _ops(out / "model.onnx") if domain == "com.microsoft"}
    if level == "onnxruntime":
        # the rotary embedding fused: into GroupQueryAttention over genai's shared caches (do_rotary),
        # else RotaryEmbedding (GPT-OSS's two halves rotated apart too: rotary_live)
        rotating = {
            n.op_type
            for n in model.graph.node
            if n.op_type == "RotaryEmbedding" or any(a.name == "do_rotary" and a.i == 1 for a in n.attribute)
        }
        assert rotating, [n.op_type for n in model.graph.node]
        # WebGPU has no FusedMatMul: the weights' products are MatMuls there
        assert ("FusedMatMul" in contrib) == (target != "webgpu")
    else:
        assert not contrib
    session = json.loads((out / "genai_config.json").read_text())["model"]["decoder"]["session_options"]
    assert session["provider_options"] == BUILDER_PROVIDER_OPTIONS[target]
    assert f"op set checked against {target}'s kernels (onnxruntime " in report


def test_precision_the_target_lacks_is_named(tmp_path: pathlib.Path) -> None:
    # refused before the folder is read (it does not exist)
    for target in ("cpu", "dml", "webgpu"):
        with pytest.raises(fastonnx.InputError, match=f"dtype='bf16' on target '{target}'"):
            fastonnx.export_pretrained(tmp_path / "none", tmp_path / "out", target=target, dtype="bf16")
    with pytest.raises(fastonnx.InputError, match="target must be one of cpu, cuda, dml, webgpu"):
        fastonnx.export_pretrained(tmp_path / "none", tmp_path / "out", target="tpu")
    assert targets.resolve("cuda", "bf16", True).dtype == "bf16"
    assert targets.resolve("webgpu", "fp32", True).dtype is None  # --dtype overrides the default
    assert {t: targets.resolve(t, None, False).dtype_name for t in targets.TARGETS} == DEFAULT_DTYPES
    assert {t: [e] if (e := targets.PROVIDER_OPTIONS[t]) else [] for t in targets.TARGETS} == (
        BUILDER_PROVIDER_OPTIONS
    )


def _one_node_model(domain: str, op: str, inputs: int) -> onnx.ModelProto:
    names = [f"x{i}" for i in range(inputs)]
    node = helper.make_node(op, names, ["y"], domain=domain)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 4]) for n in names],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid(domain, 1)]
    )


def test_an_op_the_target_lacks_is_named(tmp_path: pathlib.Path) -> None:
    # a contrib op the CPU has and DirectML lacks, read from the kernel lists themselves
    cpu, dml = targets.kernels("cpu")["com.microsoft"], targets.kernels("dml")["com.microsoft"]
    op = sorted(set(cpu) - set(dml))[0]
    onnx.save(_one_node_model("com.microsoft", op, 1), str(tmp_path / "model.onnx"))
    targets.check_package(tmp_path, ["model.onnx"], "cpu")
    with pytest.raises(fastonnx.InputError) as e:
        targets.check_package(tmp_path, ["model.onnx"], "dml")
    message = str(e.value)
    assert f"com.microsoft.{op}" in message and "'dml'" in message and "--optimize default" in message
    # a standard op out of the provider's opset versions: the versions it has are named
    model = _one_node_model("", "Add", 2)
    del model.opset_import[:]
    model.opset_import.extend([helper.make_opsetid("", 5)])  # Add's version 1 here; no kernel below 6
    (missing,) = targets.missing_kernels(model, "cuda")
    assert (missing.op, missing.version) == ("Add", 1) and "opset versions" in targets.fix([missing], "cuda")
    # a Constant node is an initializer once onnxruntime loads the model: no kernel needed
    constant = helper.make_node(
        "Constant", [], ["c"], value=helper.make_tensor("v", TensorProto.FLOAT, [], [1.0])
    )
    model.graph.node.append(constant)
    assert len(targets.missing_kernels(model, "webgpu")) == 1


def test_fused_matmul_lowered_computes_the_same() -> None:
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    w = rng.standard_normal((6, 4)).astype(np.float32)  # [out, in], read as stored
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    node = helper.make_node("FusedMatMul", ["x", "wc"], ["y"], domain="com.microsoft", transB=1)
    cast = helper.make_node("Cast", ["w"], ["wc"], to=TensorProto.FLOAT)
    graph = helper.make_graph(
        [cast, node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("com.microsoft", 1)],
        ir_version=10,
    )

    def run(m: onnx.ModelProto) -> Any:
        session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        return torch.from_numpy(session.run(None, {"x": x})[0])

    expected = run(model)
    assert targets.lower_fused_matmul(model) == 1
    assert [n.op_type for n in model.graph.node] == ["Cast", "Transpose", "MatMul"]
    assert targets.missing_kernels(model, "webgpu") == []
    torch.testing.assert_close(run(model), expected)
    torch.testing.assert_close(expected, torch.from_numpy(x @ w.T))


def test_export_refused_for_a_missing_kernel_leaves_nothing(
    llama: pathlib.Path, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # DirectML's list less GroupQueryAttention: the onnxruntime level's attention is then one it lacks
    data = json.loads(targets.KERNELS_FILE.read_text(encoding="utf-8"))
    del data["kernels"]["dml"]["com.microsoft"]["GroupQueryAttention"]
    monkeypatch.setattr(targets, "_kernel_data", lambda: data)
    out = tmp_path / "out"
    with pytest.raises(fastonnx.InputError, match=r"no kernel for com\.microsoft\.GroupQueryAttention") as e:
        fastonnx.export_pretrained(llama, out, target="dml", optimize="onnxruntime", progress=False)
    assert "'dml'" in str(e.value) and "--optimize default" in str(e.value)
    assert not out.exists() and not list(tmp_path.glob("*.partial"))
