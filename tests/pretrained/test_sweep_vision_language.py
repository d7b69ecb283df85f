"""Vision-language models the architecture sweep (scripts/architecture_sweep.py) found failing in
image-text-to-text's three-file layout, each built from the sweep's own tiny config with random weights,
exported by ``export_pretrained`` and verified (the image features, then a greedy generation over the three
files against transformers' ``generate``):

- Pixtral's patching (Mistral 3, LightOn OCR, Mistral Large 4) slices by the image's size: given as a
  tensor, ``size // patch_size`` is an ``item()`` the capture cannot follow ("Could not guard on
  data-dependent expression u1*u3 > 1"); the vision encoder now passes the one size as Python ints;
- a generated token that is the image token (Video-LLaVA's tiny model draws it) is embedded by transformers
  as any token (a step has no image): the merged embeddings gave it a zero row;
- BLIP-2's query tokens go where ``image_token_index`` is (transformers' ``masked_scatter``), and its steps
  are its language model's (its own forward always reads the image);
- PaliGemma's prompt is a prefix attending both ways (``token_type_ids`` 0), which transformers applies
  only on a first step it tells from the cache in Python: the decoder takes the token types and always
  puts the prefix blocks in its mask;
- a vision encoder-decoder (TrOCR, Donut: ``VisionEncoderDecoderModel``) is text2text's three files over an
  image encoder;
- the sweep's own classification: a model without ``get_image_features`` (GIT, Kosmos-2...) runs its plain
  forward and builds (the export then refuses it, an export error), and tiny configs the model cannot run
  only for the tiny sizes (VipLLaVA's feature layers, Llama 4's adapter widths) are made as the
  checkpoints are.
"""

from __future__ import annotations

import pathlib
import types

import pytest
import torch
from checkpoint_folders import architecture_sweep

import fastonnx
from fastonnx.pretrained.vision_language import MergedEmbeddings
from support.matrix import sampled

TASK = "image-text-to-text"
FIXED = ["mistral3", "lighton_ocr", "mistral_large4", "video_llava", "vipllava", "blip-2", "paligemma"]
# the image's size as ints, the language model's steps, the prefix's token types
IN_CI = {"mistral3", "blip-2", "paligemma"}
CASES = sampled(FIXED, lambda name: name in IN_CI)

_sweep = architecture_sweep


def _build(tmp_path: pathlib.Path, model_type: str) -> pathlib.Path:
    sweep = _sweep()
    folder = tmp_path / "checkpoint"
    sweep.build_checkpoint(TASK, model_type, dict(sweep.architectures(TASK))[model_type], folder)
    return folder


@pytest.mark.parametrize("model_type", CASES)
def test_the_vision_language_model_exports_verified(tmp_path: pathlib.Path, model_type: str) -> None:
    folder = _build(tmp_path, model_type)
    written = fastonnx.export_pretrained(folder, tmp_path / "package", task=TASK, progress=False)
    assert written.verified is True, written.verify_note


def test_a_vision_encoder_decoder_exports_encoder_and_decoder_files(tmp_path: pathlib.Path) -> None:
    folder = _build(tmp_path, "vision-encoder-decoder")
    written = fastonnx.export_pretrained(folder, tmp_path / "package", progress=False)  # task auto
    assert (written.task, written.architecture) == (TASK, "VisionEncoderDecoderModel")
    assert written.verified is True, written.verify_note
    assert written.graphs["encoder_model.onnx"] == (["pixel_values"], ["last_hidden_state"])
    assert {"decoder_model.onnx", "decoder_with_past_model.onnx"} <= set(written.files)


class _Embeds(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Embedding(10, 4)
        self.config = types.SimpleNamespace(model_type="llava")  # a family that embeds its image tokens

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.table


def test_an_image_token_past_the_features_keeps_its_embedding() -> None:
    torch.manual_seed(0)
    model, token = _Embeds(), 9
    merged = MergedEmbeddings(model, token)
    ids = torch.tensor([[1, 9, 9, 2, 9]])  # two rows of features, then a generated image token
    features = torch.randn(2, 4)
    want = model.table(ids).detach().clone()
    want[0, 1:3] = features  # transformers' masked_scatter puts the rows in order
    torch.testing.assert_close(merged(ids, features), want)
    # a step with no image (0 rows) that drew the image token: transformers embeds it as any token
    step = torch.tensor([[9]])
    torch.testing.assert_close(merged(step, torch.zeros(0, 4)), model.table(step))


@pytest.mark.parametrize("model_type", ["git", "kosmos-2", "llama4"])
def test_the_sweep_builds_what_transformers_runs(tmp_path: pathlib.Path, model_type: str) -> None:
    """No longer "not buildable": GIT and Kosmos-2 have no ``get_image_features`` (their plain forward
    runs), Llama 4's tiny adapter is as wide as its pixel shuffle makes it. (Their exports:
    test_image_prefix_models.py, test_grid_towers_more.py.)"""
    folder = _build(tmp_path, model_type)
    assert (folder / "config.json").exists() and list(folder.glob("*.safetensors"))
