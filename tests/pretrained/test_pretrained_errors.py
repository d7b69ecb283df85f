"""Bad input to ``export_pretrained`` and ``fastonnx export`` (issue 32): a clear InputError naming what is
wrong, before anything is written (no OUTDIR, no temporary folder left beside it)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from typing import Any

import pytest
from checkpoint_folders import DECODER, save_checkpoint

import fastonnx
from fastonnx.pretrained import cli


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    folder = tmp_path_factory.mktemp("llama")
    save_checkpoint(folder, "llama", "LlamaForCausalLM", DECODER)
    return folder


def _refused(model: pathlib.Path | str, tmp_path: pathlib.Path, match: str, **kwargs: object) -> None:
    out = tmp_path / "out" / "package"
    out.parent.mkdir(exist_ok=True)
    with pytest.raises(fastonnx.InputError, match=match):
        fastonnx.export_pretrained(model, out, **kwargs)  # type: ignore[arg-type]
    assert not out.exists()
    assert list(out.parent.iterdir()) == []  # no temporary folder left either


def test_folder_without_config(tmp_path: pathlib.Path) -> None:
    folder = tmp_path / "empty"
    folder.mkdir()
    _refused(folder, tmp_path, "has no config.json")


def test_folder_without_weights(tmp_path: pathlib.Path, llama: pathlib.Path) -> None:
    folder = tmp_path / "config_only"
    folder.mkdir()
    (folder / "config.json").write_text((llama / "config.json").read_text())
    (folder / "pytorch_model.bin").write_bytes(b"")
    _refused(folder, tmp_path, r"no safetensors weights \(it holds pytorch_model.bin")


def test_index_naming_a_missing_shard(tmp_path: pathlib.Path, llama: pathlib.Path) -> None:
    folder = tmp_path / "sharded"
    folder.mkdir()
    (folder / "config.json").write_text((llama / "config.json").read_text())
    index = {"weight_map": {"lm_head.weight": "model-00001-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    _refused(folder, tmp_path, "model-00001-of-00002.safetensors")


def test_task_the_architecture_lacks(tmp_path: pathlib.Path, llama: pathlib.Path) -> None:
    _refused(
        llama,
        tmp_path,
        "'llama' .*LlamaForCausalLM.* has no image-classification model",
        task="image-classification",
    )


def test_unknown_task(tmp_path: pathlib.Path, llama: pathlib.Path) -> None:
    _refused(llama, tmp_path, "unknown task 'translation'", task="translation")


def test_hub_id_without_network(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    _refused("nobody-here/no-such-model", tmp_path, "nobody-here/no-such-model is not a local folder")


def test_outdir_not_empty(tmp_path: pathlib.Path, llama: pathlib.Path) -> None:
    out = tmp_path / "package"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(fastonnx.InputError, match="exists and is not empty"):
        fastonnx.export_pretrained(llama, out)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_options_export_pretrained_sets_itself(tmp_path: pathlib.Path, llama: pathlib.Path) -> None:
    _refused(llama, tmp_path, "sets weights itself", weights="x")


def test_options_are_checked_as_to_onnx_checks_them_before_the_folder_is_read(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fastonnx.pretrained import package_export

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the folder was read before the options were checked")

    monkeypatch.setattr(package_export.folder_mod, "read_folder", never)
    folder = tmp_path / "checkpoint"
    _refused(folder, tmp_path, "to_onnx has no keyword 'optimise'", optimise=True)
    _refused(folder, tmp_path, "optimize must be False / 'none', True / 'default'", optimize="fast")
    _refused(folder, tmp_path, "quantize must be None, 'int4', 'int8'", quantize="int3")


def test_cli_bad_input_exits_2(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nowhere" / "ckpt"
    assert cli.main(["export", str(missing), str(tmp_path / "out")]) == 2
    assert f"no checkpoint folder at {missing}" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_cli_help_lists_the_tasks() -> None:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(
        [sys.executable, "-m", "fastonnx", "export", "--help"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    for task in fastonnx.pretrained.TASKS:
        assert task in done.stdout
    assert "--no-verify" in done.stdout and "--quantize" in done.stdout


def test_onnxruntime_failing_on_the_package_is_a_failed_verification(
    tmp_path: pathlib.Path, llama: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # an onnxruntime error while verifying (here inputs of the wrong type) fails the verification, as a
    # mismatch does: the package and its report stay, the command exits 1, no traceback escapes
    import numpy as np

    from fastonnx.pretrained import package_check

    def run_with_wrong_types(session: Any, *args: object) -> list[object]:
        session.run(None, {i.name: np.zeros(1, np.float32) for i in session.get_inputs()})
        raise AssertionError("onnxruntime ran on inputs of the wrong type")

    monkeypatch.setattr(package_check, "_check_decoder", run_with_wrong_types)
    out = tmp_path / "package"
    with pytest.raises(fastonnx.RuntimeCheckError, match="onnxruntime could not run the package"):
        fastonnx.export_pretrained(llama, out)
    assert "onnxruntime could not run the package" in (out / "fastonnx_report.md").read_text()
    assert (out / "model.onnx").exists()
