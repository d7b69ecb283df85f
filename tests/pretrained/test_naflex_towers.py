"""SigLIP 2's NaFlex images in the tasks that run its whole model (issue 42): the two towers of
zero-shot classification and feature-extraction, and its classifier. Their forward resizes the position
table per image with ``spatial_shapes[i].tolist()``; capture swaps in capture/naflex_positions.py's tensor
form, so one file takes images of any shape and any batch."""

from __future__ import annotations

import pathlib

import numpy as np
import onnxruntime
import torch
from checkpoint_folders import architecture_sweep
from transformers import Siglip2VisionConfig
from transformers.models.siglip2.modeling_siglip2 import Siglip2VisionEmbeddings

import fastonnx
from fastonnx.capture.naflex_positions import naflex_embeddings_forward
from fastonnx.pretrained.naflex_images import naflex_example


def test_the_tensor_positions_are_transformers_resize() -> None:
    """Shapes smaller and larger than the 4 x 4 table, padded, in one batch: each patch's row as
    transformers' antialiased interpolation gives it, padding patches the first patch's."""
    torch.manual_seed(0)
    config = Siglip2VisionConfig(hidden_size=32, num_patches=16, patch_size=4)
    embeddings = Siglip2VisionEmbeddings(config).eval()
    example = naflex_example(config, [(3, 5), (7, 2), (1, 9), (6, 6)], 40)
    pixels, shapes = example["pixel_values"], example["spatial_shapes"]
    with torch.no_grad():
        want = embeddings(pixels, shapes)
        got = naflex_embeddings_forward(embeddings, pixels, shapes)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_two_towers_take_images_of_other_shapes(tmp_path: pathlib.Path) -> None:
    from transformers import AutoModel

    sweep = architecture_sweep()
    task, folder = "zero-shot-image-classification", tmp_path / "checkpoint"
    sweep.build_checkpoint(task, "siglip2", "Siglip2Model", folder)
    written = fastonnx.export_pretrained(folder, tmp_path / "package", task=task, progress=False)
    assert written.verified is True, written.verify_note

    model = AutoModel.from_pretrained(folder).eval()
    images = naflex_example(model.config.vision_config, [(5, 7), (2, 3), (6, 6)], 44)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, int(model.config.text_config.vocab_size), (2, 9), generator=g)
    feeds = {"input_ids": ids, "attention_mask": torch.ones_like(ids), **images}
    session = onnxruntime.InferenceSession(str(tmp_path / "package" / "model.onnx"))
    names = [o.name for o in session.get_outputs()]
    got = session.run(None, {i.name: feeds[i.name].numpy() for i in session.get_inputs()})
    with torch.no_grad():
        out = model(**feeds)
    assert names == ["logits_per_image", "logits_per_text", "text_embeds", "image_embeds"]
    for name, value in zip(names, got, strict=True):
        assert value.shape[0] == (3 if name.endswith("image") or name == "image_embeds" else 2), name
        torch.testing.assert_close(
            torch.from_numpy(np.asarray(value)), getattr(out, name), atol=1e-4, rtol=1e-3
        )
