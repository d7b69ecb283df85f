"""image-text-to-text in the three-file layout (issue 42, part 1): a vision-language checkpoint built by the
architecture sweep's tiny-config maker, exported with ``task="auto"`` and verified by the package's own
check (one image, six greedy steps against transformers' ``generate``), then run here on a prompt with two
images: the vision encoder once an image, the rows concatenated, merged into the embeddings and decoded,
against transformers' forward on the same prompt and images."""

from __future__ import annotations

import pathlib

import numpy as np
import onnxruntime as ort
import pytest
import torch
from checkpoint_folders import architecture_sweep

import fastonnx
from fastonnx.pretrained import vision_language as vl

_sweep = architecture_sweep


CASES = [
    ("llava", "LlavaForConditionalGeneration"),
    ("internvl", "InternVLForConditionalGeneration"),
]


def _session(path: pathlib.Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize(("model_type", "class_name"), CASES, ids=[c[0] for c in CASES])
def test_two_images_in_one_prompt(tmp_path: pathlib.Path, model_type: str, class_name: str) -> None:
    import transformers

    folder, package = tmp_path / "checkpoint", tmp_path / "package"
    _sweep().build_checkpoint("image-text-to-text", model_type, class_name, folder)
    written = fastonnx.export_pretrained(folder, package, progress=False)
    assert (written.task, written.architecture) == ("image-text-to-text", class_name)
    assert written.verified is True, written.verify_note
    assert {vl.VISION_FILE, vl.EMBED_FILE, vl.DECODER_FILE} <= set(written.files)

    model = getattr(transformers, class_name).from_pretrained(folder, dtype=torch.float32).eval()
    config = model.config
    vision, embed, decoder = (_session(package / f) for f in (vl.VISION_FILE, vl.EMBED_FILE, vl.DECODER_FILE))
    assert [i.name for i in vision.get_inputs()] == ["pixel_values"]
    g = torch.Generator().manual_seed(5)
    pixels = [vl.vision_inputs(model, config, 1, "cpu") for _ in range(2)]
    for p in pixels:  # two different images
        p["pixel_values"] = torch.randn(p["pixel_values"].shape, generator=g)
    rows = [
        torch.from_numpy(vision.run(None, {"pixel_values": p["pixel_values"].numpy()})[0]) for p in pixels
    ]
    token = vl.image_token_id(config)
    _, vocab = vl.text_sizes(config)
    text = torch.randint(3, vocab, (1, 7), generator=g)
    text[text == token] = 3
    image_tokens = [torch.full((1, r.shape[0]), token) for r in rows]
    ids = torch.cat([text[:, :2], image_tokens[0], text[:, 2:4], image_tokens[1], text[:, 4:]], dim=1)
    (embeds,) = embed.run(None, {"input_ids": ids.numpy(), "image_features": torch.cat(rows).numpy()})
    decoder_names = [i.name for i in decoder.get_inputs()]
    feeds = {
        "inputs_embeds": embeds,
        "attention_mask": np.ones(ids.shape, np.int64),
        "position_ids": np.arange(ids.shape[1], dtype=np.int64)[None],
    }
    for i in decoder.get_inputs()[3:]:  # an empty past: its length axis 0
        shape = [1 if d == "batch_size" else 0 if isinstance(d, str) else d for d in i.shape]
        feeds[i.name] = np.zeros(shape, np.float32)
    assert list(feeds) == decoder_names
    logits = torch.from_numpy(decoder.run(None, feeds)[0])

    stacked = {k: torch.cat([p[k] for p in pixels]) for k in pixels[0]}
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=torch.ones_like(ids), **stacked).logits
    assert float(want.abs().max()) > 1e-3
    torch.testing.assert_close(logits, want, atol=1e-4, rtol=1e-3)
