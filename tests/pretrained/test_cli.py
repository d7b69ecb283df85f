"""``fastonnx export`` end to end (issue 32): the command in a fresh process writes a verified package;
a checkpoint that lacks a weight its outputs read (an untied LM head removed from the file) writes the
package and a report that shows the mismatch and exits 1; ``--no-verify`` skips the check and exits 0."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
from checkpoint_folders import DECODER, save_checkpoint

from fastonnx.pretrained import cli


def test_command_writes_a_verified_package(tmp_path: pathlib.Path) -> None:
    folder, package = tmp_path / "checkpoint", tmp_path / "package"
    save_checkpoint(folder, "qwen2", "Qwen2ForCausalLM", DECODER)
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(
        [sys.executable, "-m", "fastonnx", "export", str(folder), str(package), "--no-progress"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "text-generation (Qwen2ForCausalLM)" in done.stdout and "verification: verified" in done.stdout
    names = {p.name for p in package.iterdir()}
    assert {
        "model.onnx",
        "model.safetensors",
        "genai_config.json",
        "fastonnx_report.md",
        "tokenizer.json",
    } <= names
    assert json.loads((package / "genai_config.json").read_text())["model"]["type"] == "qwen2"
    assert "All outputs agree." in (package / "fastonnx_report.md").read_text()
    # nothing but the package beside it: the temporary folder was renamed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint", "package"]


def test_a_missing_weight_is_a_mismatch(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "checkpoint"
    save_checkpoint(folder, "llama", "LlamaForCausalLM", {**DECODER, "tie_word_embeddings": False})
    tensors = load_file(folder / "model.safetensors")
    del tensors["lm_head.weight"]  # from_pretrained draws it at random, the export another draw
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})

    package = tmp_path / "package"
    assert cli.main(["export", str(folder), str(package), "--no-progress"]) == 1
    assert "verification failed" in capsys.readouterr().err
    report = (package / "fastonnx_report.md").read_text()
    assert "Some outputs DISAGREE." in report and "`lm_head.weight`" in report
    assert (package / "fastonnx_missing.safetensors").is_file()  # the values the graph reads

    skipped = tmp_path / "skipped"
    assert cli.main(["export", str(folder), str(skipped), "--no-verify", "--no-progress"]) == 0
    assert "verification: skipped (verify=False)" in capsys.readouterr().out


def test_verification_skipped_when_the_model_does_not_fit(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fastonnx
    from fastonnx.pretrained import package_check
    from fastonnx.pretrained.folder import read_folder

    folder = tmp_path / "checkpoint"
    save_checkpoint(folder, "llama", "LlamaForCausalLM", DECODER)
    need = 2 * package_check.float32_bytes(read_folder(folder))
    # the rule: 2 x the float32 weights at most half of the available memory
    monkeypatch.setattr(package_check, "available_memory", lambda: 2 * need - 1)
    written = fastonnx.export_pretrained(folder, tmp_path / "package", progress=False)
    assert written.verified is None and written.verify_note.startswith("skipped: the model needs")
    assert "Verification skipped: the model needs" in written.report_path.read_text()
    monkeypatch.setattr(package_check, "available_memory", lambda: 2 * need)
    assert package_check.fits(read_folder(folder)) == (True, "")
