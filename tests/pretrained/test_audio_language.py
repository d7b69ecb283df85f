"""Audio-language models (decoder-only audio-LLMs that transformers lists as seq2seq / speech seq2seq) in
the three-file layout: a checkpoint built by the architecture sweep's tiny-config maker, exported for
text2text-generation and verified by the package's own check (one audio, six greedy steps against
transformers' ``generate``), then run here by hand on a prompt holding a padded audio: the audio
encoder, its rows merged into the embeddings and decoded, against transformers' forward."""

from __future__ import annotations

import pathlib

import numpy as np
import onnxruntime as ort
import pytest
import torch
from checkpoint_folders import architecture_sweep

import fastonnx
from fastonnx.pretrained import audio_language as al

_sweep = architecture_sweep

CASES = [
    # a Whisper-style tower of fixed frames, no mask
    ("voxtral", "VoxtralForConditionalGeneration"),
    # frames of any number in whole blocks (a derived dim), a mask whose sum decides the rows
    ("glmasr", "GlmAsrForConditionalGeneration"),
]


def _session(path: pathlib.Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize(("model_type", "class_name"), CASES, ids=[c[0] for c in CASES])
def test_audio_in_a_prompt(tmp_path: pathlib.Path, model_type: str, class_name: str) -> None:
    import transformers

    folder, package = tmp_path / "checkpoint", tmp_path / "package"
    _sweep().build_checkpoint("text2text-generation", model_type, class_name, folder)
    written = fastonnx.export_pretrained(folder, package, "text2text-generation", progress=False)
    assert written.architecture == class_name
    assert written.verified is True, written.verify_note
    assert {al.AUDIO_FILE, al.EMBED_FILE, al.DECODER_FILE} <= set(written.files)
    if model_type == "voxtral":
        return  # the hand-run below once, on the masked family (fewer frames: faster)

    model = getattr(transformers, class_name).from_pretrained(folder, dtype=torch.float32).eval()
    config = model.config
    audio_file, embed, decoder = (
        _session(package / f) for f in (al.AUDIO_FILE, al.EMBED_FILE, al.DECODER_FILE)
    )
    assert [i.name for i in audio_file.get_inputs()] == ["input_features", al.MASK]
    audio = al.audio_inputs(model, config, "cpu", kept=0.5)
    frames = audio["input_features"].shape[2] * 2  # another length than the export's example
    g = torch.Generator().manual_seed(5)
    audio["input_features"] = torch.randn(1, audio["input_features"].shape[1], frames, generator=g)
    audio[al.MASK] = (torch.arange(frames) < frames * 5 // 8).to(torch.int64)[None]
    (rows,) = audio_file.run(None, {k: v.numpy() for k, v in audio.items()})
    token = al.audio_token_id(config)
    text = torch.randint(3, int(config.text_config.vocab_size), (1, 5), generator=g)
    text[text == token] = 3
    ids = torch.cat([text[:, :2], torch.full((1, rows.shape[0]), token), text[:, 2:]], dim=1)
    (embeds,) = embed.run(None, {"input_ids": ids.numpy(), "audio_features": rows})
    feeds = {
        "inputs_embeds": embeds,
        "attention_mask": np.ones(ids.shape, np.int64),
        "position_ids": np.arange(ids.shape[1], dtype=np.int64)[None],
    }
    for i in decoder.get_inputs()[3:]:  # an empty past: its length axis 0
        shape = [1 if d == "batch_size" else 0 if isinstance(d, str) else d for d in i.shape]
        feeds[i.name] = np.zeros(shape, np.float32)
    logits = torch.from_numpy(decoder.run(None, feeds)[0])

    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=torch.ones_like(ids), **audio).logits
    assert float(want.abs().max()) > 1e-3
    torch.testing.assert_close(logits, want, atol=1e-4, rtol=1e-3)


def test_frame_layout_and_blocks() -> None:
    """The features' layout and the frames' multiple come from the model: GLM-ASR's Whisper-like
    convolution reads bins x frames and merges its halved frames by ``intermediate_size / hidden_size``."""
    import transformers

    config = _sweep().tiny_config("glmasr")
    with torch.device("meta"):
        model = transformers.GlmAsrForConditionalGeneration(config)
    audio = config.audio_config
    multiple = 2 * audio.intermediate_size // audio.hidden_size
    assert al.frame_multiple(model, config) == multiple
    shape, axis, fixed = al.feature_layout(model, config)
    assert (shape, axis, fixed) == ((audio.num_mel_bins, al.EXAMPLE_FRAMES * multiple), 2, False)
