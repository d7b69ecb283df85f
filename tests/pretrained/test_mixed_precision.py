"""Mixed-precision quantization (issue 43 part 5): ``WeightQuantization.bits_for`` puts the products of
named modules (the LM head, a layer) in int8 within an int4 model, ``accuracy_level_for`` sets
MatMulNBits' accuracy level per product, and a quantized text-generation package's report gives the bytes
by precision and the logits' error on the verification prompt."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
import torch
from checkpoint_folders import save_decoder

import fastonnx
from fastonnx.errors import InputError
from fastonnx.pretrained import cli
from fastonnx.pretrained.quantization_error import logits_error


def _products(package: pathlib.Path) -> dict[str, dict[str, Any]]:
    """MatMulNBits nodes by the weight they read: their attributes."""
    import onnx

    proto = onnx.load(str(package / "model.onnx"), load_external_data=False)
    return {
        n.input[1]: {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        for n in proto.graph.node
        if n.op_type == "MatMulNBits"
    }


def _bits_of(products: dict[str, dict[str, Any]], part: str) -> set[int]:
    return {attrs["bits"] for weight, attrs in products.items() if part in weight}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    path = tmp_path_factory.mktemp("mixed") / "checkpoint"
    save_decoder(path, "llama")
    return path


def test_named_modules_in_int8_and_accuracy_per_product(folder: pathlib.Path, tmp_path: pathlib.Path) -> None:
    settings = fastonnx.WeightQuantization(
        bits=4,
        bits_for={"lm_head": 8, "model.layers.0.*": 8},
        accuracy_level_for={"model.layers.1.mlp.*": 0},
    )
    written = fastonnx.export_pretrained(
        folder, tmp_path / "p", quantize=settings, optimize="onnxruntime", progress=False
    )
    products = _products(tmp_path / "p")
    assert _bits_of(products, "lm_head") == {8}  # the head, float by default, quantized as named
    assert _bits_of(products, "layers.0.") == {8} and _bits_of(products, "layers.1.") == {4}
    levels = {w: a["accuracy_level"] for w, a in products.items()}
    assert {v for w, v in levels.items() if "layers.1.mlp" in w} == {0}
    assert {v for w, v in levels.items() if "layers.1.mlp" not in w} == {4}
    stats = written.stats["model.onnx"]["quantize"]
    bits = {label: entry["bits"] for label, entry in stats["quantized"].items()}
    assert [b for label, b in bits.items() if label.endswith("lm_head")] == [8], bits
    error = stats["logits_error"]
    assert 0 < error["max_abs"] and 0.9 < error["cosine"] <= 1.0
    # the measure itself, on known values: the head's rows differ by 1 in one logit of 4
    want = torch.tensor([[4.0, 0.0, 0.0, 0.0], [0.0, 2.0, 0.0, 0.0]])
    got = want + torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]])
    assert logits_error(got, want) == {
        "max_abs": 1.0,
        "max_rel": 0.25,
        "cosine": pytest.approx((1 + 2 / 5**0.5) / 2),
        "top1_agree": 1.0,
    }
    text = written.report_path.read_text()
    assert "## Quantization: bytes and logits on the verification prompt" in text
    assert "- int4: " in text and "- int8: " in text


def test_bad_settings_are_named(folder: pathlib.Path, tmp_path: pathlib.Path) -> None:
    with pytest.raises(InputError, match="bits_for must map"):
        fastonnx.WeightQuantization(bits_for={"lm_head": 3}).check()
    with pytest.raises(InputError, match="only the onnxruntime optimize level"):
        fastonnx.export_pretrained(
            folder,
            tmp_path / "a",
            quantize=fastonnx.WeightQuantization(accuracy_level_for={"lm_head": 0}),
            progress=False,
        )
    with pytest.raises(InputError, match=r"pattern\(s\) \['no_such_module'\] match no module"):
        fastonnx.export_pretrained(
            folder,
            tmp_path / "b",
            quantize=fastonnx.WeightQuantization(bits_for={"no_such_module": 8}),
            optimize="onnxruntime",
            progress=False,
        )


def test_cli_int8_and_accuracy_levels(
    folder: pathlib.Path, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The flags become the settings the export above runs with (export_pretrained stands in here)."""
    from fastonnx.pretrained import package_export

    seen: dict[str, Any] = {}

    def export(*args: Any, **options: Any) -> Any:
        seen.update(options)
        raise InputError("stand-in")

    monkeypatch.setattr(package_export, "export_pretrained", export)
    argv = ["export", str(folder), str(tmp_path / "c"), "--quantize", "int4", "--optimize", "onnxruntime"]
    extra = ["--int8", "lm_head,model.layers.0.*", "--accuracy-level", "0", "--accuracy-level", "lm_head=4"]
    assert cli.main(argv + extra) == 2  # the stand-in's error
    assert seen["quantize"] == fastonnx.WeightQuantization(
        bits=4,
        accuracy_level=0,
        bits_for={"lm_head": 8, "model.layers.0.*": 8},
        accuracy_level_for={"lm_head": 4},
    )
    assert cli.main(["export", str(folder), str(tmp_path / "d"), "--int8", "lm_head"]) == 2
    assert cli.main(argv[:2] + [str(tmp_path / "e"), "--quantize", "int4", "--accuracy-level", "x=9"]) == 2


def test_cli_block_size(
    folder: pathlib.Path, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--block-size sets MatMulNBits' block along K; the package verifies and its report gives the logits'
    error at that size; a size that is no power of two from 16 to 256 is named."""
    package = tmp_path / "b64"
    argv = ["export", str(folder), str(package), "--quantize", "int4", "--optimize", "onnxruntime"]
    assert cli.main([*argv, "--block-size", "64"]) == 0
    products = _products(package)
    assert products and {a["block_size"] for a in products.values()} == {64}
    assert "## Quantization: bytes and logits on the verification prompt" in (
        package / "fastonnx_report.md"
    ).read_text(encoding="utf-8")
    assert cli.main([*argv[:2], str(tmp_path / "b48"), *argv[3:], "--block-size", "48"]) == 2
    assert "block_size must be a power of two from 16 to 256, got 48" in capsys.readouterr().err
    assert cli.main(["export", str(folder), str(tmp_path / "b"), "--block-size", "64"]) == 2
