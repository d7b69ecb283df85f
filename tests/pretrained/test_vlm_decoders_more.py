"""More image-text-to-text decoders the architecture sweep (scripts/architecture_sweep.py) found failing,
each built from the sweep's own tiny config with random weights, exported by ``export_pretrained`` and
verified (the image features, then a greedy generation over the three files against transformers'
``generate`` on the model ``from_pretrained`` loads):

- ShieldGemma 2 (Gemma3ForConditionalGeneration under a ShieldGemma 2 config): transformers' own
  ``save_pretrained`` writes its language model under key names its ``from_pretrained`` does not read
  back (the ``shieldgemma2`` conversion mapping is ShieldGemma2ForImageClassification's), which then loads
  random weights, a new draw at each load; the sweep saves such a model under its own key names.
"""

from __future__ import annotations

import pathlib

import pytest
import torch
from checkpoint_folders import architecture_sweep

import fastonnx
from support.matrix import sampled

TASK = "image-text-to-text"
FIXED = ["shieldgemma2"]
IN_CI: set[str] = set()  # the unit test below covers ShieldGemma 2 in CI (its export: Gemma 3's)
CASES = sampled(FIXED, lambda name: name in IN_CI)

_sweep = architecture_sweep


def _build(tmp_path: pathlib.Path, model_type: str) -> pathlib.Path:
    sweep = _sweep()
    folder = tmp_path / "checkpoint"
    sweep.build_checkpoint(TASK, model_type, dict(sweep.architectures(TASK))[model_type], folder)
    return folder


@pytest.mark.parametrize("model_type", CASES)
def test_the_decoder_exports_verified(tmp_path: pathlib.Path, model_type: str) -> None:
    folder = _build(tmp_path, model_type)
    written = fastonnx.export_pretrained(folder, tmp_path / "package", task=TASK, progress=False)
    assert written.verified is True, written.verify_note


def _tiny_shieldgemma2() -> torch.nn.Module:
    from transformers import Gemma3ForConditionalGeneration

    sweep = _sweep()
    defaults = sweep._tokens_in_vocabulary(sweep._defaults("shieldgemma2"))
    config = sweep._model_config(Gemma3ForConditionalGeneration, sweep.tiny_config("shieldgemma2", defaults))
    torch.manual_seed(0)
    model: torch.nn.Module = Gemma3ForConditionalGeneration(config).eval()
    return model


def test_transformers_does_not_reload_its_own_shieldgemma2_save(tmp_path: pathlib.Path) -> None:
    """transformers against itself: the default save's language model is lost on reload, the sweep's
    save loads back every weight as built."""
    model = _tiny_shieldgemma2()
    cls = type(model)
    model.save_pretrained(tmp_path / "default")
    _, info = cls.from_pretrained(tmp_path / "default", output_loading_info=True)
    assert any(k.startswith("model.language_model.") for k in info["missing_keys"])

    _sweep().save_reloadable(model, tmp_path / "sweep")
    reloaded, info = cls.from_pretrained(tmp_path / "sweep", output_loading_info=True)
    assert not info["missing_keys"]
    built = model.state_dict()
    for name, value in reloaded.state_dict().items():
        torch.testing.assert_close(value, built[name], rtol=0, atol=0, msg=name)
