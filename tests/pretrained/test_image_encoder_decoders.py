"""image-text-to-text's encoder-decoders over an image (image_encoder_decoders.py): BLIP, Pix2Struct,
Florence-2, UDOP and PP-FormulaNet, each built from the architecture sweep's own tiny config with random
weights, exported as text2text's three files and verified by a greedy generation of 6 tokens over them
against transformers' ``generate`` (every step's logits, and the tokens). They used to fail: no
``get_image_features`` (BLIP, Pix2Struct, UDOP, PP-FormulaNet), or the image features merged into the
encoder's prompt, not a decoder's (Florence-2). UDOP's merge of words and patches is swapped for a form
without data-dependent sizes (capture/document_patches.py), checked here against transformers' own.
"""

from __future__ import annotations

import pathlib

import pytest
import torch
from checkpoint_folders import architecture_sweep

import fastonnx
from support.matrix import sampled

TASK = "image-text-to-text"
CASES = [
    ("pix2struct", "Pix2StructForConditionalGeneration"),  # CI's one: the quickest
    ("blip", "BlipForConditionalGeneration"),
    ("florence2", "Florence2ForConditionalGeneration"),
    ("udop", "UdopForConditionalGeneration"),
    ("pp_formulanet", "PPFormulaNetForConditionalGeneration"),
]


@pytest.mark.parametrize(
    ("model_type", "class_name"), sampled(CASES, lambda c: c[0] == "pix2struct"), ids=lambda v: str(v)
)
def test_an_image_encoder_decoder_generates_as_transformers(
    tmp_path: pathlib.Path, model_type: str, class_name: str
) -> None:
    folder = tmp_path / "checkpoint"
    architecture_sweep().build_checkpoint(TASK, model_type, class_name, folder)
    written = fastonnx.export_pretrained(folder, tmp_path / "package", task="auto", progress=False)
    assert written.task == TASK and written.verified is True, written.verify_note
    assert set(written.graphs) == {"encoder_model.onnx", "decoder_model.onnx", "decoder_with_past_model.onnx"}
    report = written.report_path.read_text(encoding="utf-8")
    assert all(f"`step {i}: logits`" in report for i in range(6)) and "`generated tokens`" in report


def test_every_image_encoder_decoder_class_goes_to_image_text_to_text() -> None:
    from fastonnx.pretrained.tasks import choose

    for model_type, class_name in CASES:
        task, chosen = choose({"model_type": model_type, "architectures": [class_name]}, "auto")
        assert (task.name, chosen) == (TASK, class_name)


def test_udop_words_and_patches_merge_by_gathers_as_transformers() -> None:
    from transformers.models.udop.modeling_udop import combine_image_text_embeddings

    from fastonnx.capture.document_patches import combine_by_gather

    g = torch.Generator().manual_seed(0)
    batch, words, side, width = 3, 7, 4, 8
    patches = torch.randn(batch, side * side, width, generator=g)
    embeds = torch.randn(batch, words, width, generator=g)
    corners = torch.rand(batch, words, 2, 2, generator=g).sort(dim=2).values
    bbox = corners.transpose(2, 3).reshape(batch, words, 4)
    bbox[0, 1], bbox[1, 2] = 0.0, 1.0  # a word boxing nothing, one boxing the page
    bbox[2] = bbox[2, :1]  # every word on one patch: the row keeps all but one
    mask = torch.ones(batch, words, dtype=torch.int64)
    mask[1, -1] = 0
    for visual in (None, torch.rand(batch, side * side, 4, generator=g)):
        want = combine_image_text_embeddings(patches, embeds.clone(), bbox, visual, mask, side, 0, 32, 8)
        got = combine_by_gather(patches, embeds.clone(), bbox, visual, mask, side, 0, 32, 8)
        for w, a in zip(want, got, strict=True):
            torch.testing.assert_close(a, w, rtol=0, atol=0)
