"""The architecture sweep's CI sample (issue 32, part 5): scripts/architecture_sweep.py's per-architecture
function on one causal LM, one masked LM and one image classifier, each built from its tiny config with
random weights, saved to a folder, exported by ``fastonnx export`` and verified against transformers.
The full sweep writes the "transformers architectures" section of docs/coverage.md."""

from __future__ import annotations

import importlib.util
import pathlib
from types import ModuleType

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _sweep() -> ModuleType:
    path = ROOT / "scripts" / "architecture_sweep.py"
    spec = importlib.util.spec_from_file_location("architecture_sweep", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SAMPLE = [
    ("text-generation", "qwen2", "Qwen2ForCausalLM"),
    ("fill-mask", "roberta", "RobertaForMaskedLM"),
    ("image-classification", "convnext", "ConvNextForImageClassification"),
]


@pytest.mark.parametrize(("task", "model_type", "class_name"), SAMPLE, ids=[s[1] for s in SAMPLE])
def test_sample_architecture_passes(
    tmp_path: pathlib.Path, task: str, model_type: str, class_name: str
) -> None:
    sweep = _sweep()
    assert (model_type, class_name) in sweep.architectures(task)  # the sweep's own list holds it
    result = sweep.sweep_one(task, model_type, class_name, workdir=str(tmp_path))
    assert result["status"] == "pass", result
    assert list(tmp_path.iterdir()) == []  # every folder it wrote is deleted


def test_tiny_config_is_tiny() -> None:
    sweep = _sweep()
    config = sweep.tiny_config("llama")
    assert (config.num_hidden_layers, config.hidden_size, config.vocab_size) == (2, 64, 128)
    assert (config.pad_token_id, config.bos_token_id, config.eos_token_id) == (0, 1, 2)
    vision = sweep.tiny_config("vit")
    assert (vision.image_size, vision.patch_size, vision.num_hidden_layers) == (32, 8, 2)


def test_unbuildable_architecture_is_reported(tmp_path: pathlib.Path) -> None:
    sweep = _sweep()
    result = sweep.sweep_one("text-generation", "llama", "NoSuchModelForCausalLM", workdir=str(tmp_path))
    assert result["status"] == "not buildable"
    assert "NoSuchModelForCausalLM" in result["detail"]
    assert list(tmp_path.iterdir()) == []


def test_a_composite_config_is_a_named_input_error(tmp_path: pathlib.Path) -> None:
    # Gemma3ForConditionalGeneration's config keeps the text sizes in text_config: a clear refusal
    import fastonnx
    from fastonnx.errors import InputError

    sweep = _sweep()
    folder = tmp_path / "gemma3"
    sweep.build_checkpoint("text-generation", "gemma3", "Gemma3ForConditionalGeneration", folder)
    with pytest.raises(InputError, match=r"Gemma3Config\) has no '(num_hidden_layers|vocab_size)'"):
        fastonnx.export_pretrained(folder, tmp_path / "out", task="text-generation")
    assert not (tmp_path / "out").exists()
