"""The runs of a Whisper package's onnxruntime-genai files (task_inputs.GENAI_WHISPER_ENCODER /
GENAI_WHISPER_DECODER): the package check's comparison with transformers, and the inputs the half
calibration records (half_package.py).

The steps, as genai runs them: the encoder on a batch of 2 of 3000 frames of features (its states and
every decoder layer's cross-attention keys and values); the decoder on a prompt of 3 tokens (the start
token and two others) with an empty self-attention past and the encoder's cross caches; then one token
with the past it returned. The check feeds each file transformers' own values (the reference's cross
caches, its presents), so that each file is compared on its own; the calibration feeds each file what the
float32 files gave.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from fastonnx.diagnostics.verdicts import VerificationInfo, compare
from fastonnx.pretrained.encoder_tasks import audio_inputs
from fastonnx.pretrained.graph_spec import GraphSpec
from fastonnx.pretrained.task_inputs import (
    GENAI_WHISPER_DECODER,
    GENAI_WHISPER_ENCODER,
    WhisperGenaiDecoder,
    WhisperGenaiEncoder,
    decoder_start,
    seq2seq_shape,
)

BATCH = 2
Run = Callable[[Any, list[str], list[torch.Tensor]], list[torch.Tensor]]
Tolerance = Callable[[torch.Tensor], tuple[float | None, float | None]]


def prompt(config: Any) -> torch.Tensor:
    """The first step's tokens: the start token and two others, in each row."""
    vocab = int(config.vocab_size)
    g = torch.Generator().manual_seed(2)
    rest = torch.randint(min(3, vocab - 1), vocab, (BATCH, 2), generator=g)
    return torch.cat([torch.full((BATCH, 1), decoder_start(config)), rest], dim=1)


def empty_past(config: Any) -> list[torch.Tensor]:
    """The first step's self-attention past: every layer's keys and values of length 0."""
    layers, heads, size, _ = seq2seq_shape(config)
    return [torch.zeros(BATCH, heads, 0, size) for _ in range(2 * layers)]


def features(model: Any, config: Any) -> torch.Tensor:
    audio, _ = audio_inputs(model, config, BATCH, "cpu")
    return audio["input_features"]


def check(
    sessions: dict[str, Any],
    model: Any,
    config: Any,
    specs: dict[str, GraphSpec],
    run: Run,
    tolerance: Tolerance,
) -> list[VerificationInfo]:
    """Both genai files against transformers (the modules they were exported from, on the loaded
    model): the encoder's states and cross caches, the decoder's logits and presents on both steps."""
    encoder_spec, decoder_spec = specs[GENAI_WHISPER_ENCODER], specs[GENAI_WHISPER_DECODER]
    audio = features(model, config)
    with torch.no_grad():
        expected = list(WhisperGenaiEncoder(model)(audio))
    got = run(sessions[GENAI_WHISPER_ENCODER], encoder_spec.input_names, [audio])
    infos = [
        compare(f"genai_encoder: {name}", e, a, *tolerance(e))
        for name, e, a in zip(encoder_spec.output_names, expected, got, strict=True)
    ]
    cross, ids, past = expected[1:], prompt(config), empty_past(config)
    decoder = WhisperGenaiDecoder(model)
    for step in ("first step", "step with past"):
        with torch.no_grad():
            want = list(decoder(ids, past, cross))
        got = run(sessions[GENAI_WHISPER_DECODER], decoder_spec.input_names, [ids, *past, *cross])
        infos += [
            compare(f"genai_decoder {step}: {name}", e, a, *tolerance(e))
            for name, e, a in zip(decoder_spec.output_names, want, got, strict=True)
        ]
        ids, past = want[0][:, -1:].argmax(-1), want[1:]
    return infos


def calibration_feeds(
    sessions: dict[str, Any], model: Any, config: Any, specs: dict[str, GraphSpec]
) -> dict[str, list[dict[str, Any]]]:
    """The feeds of both float32 files on check's inputs, each file fed what the other gave
    (``sessions``: onnxruntime sessions of the float32 files)."""
    encoder_spec, decoder_spec = specs[GENAI_WHISPER_ENCODER], specs[GENAI_WHISPER_DECODER]
    encoder = {encoder_spec.input_names[0]: features(model, config).numpy()}
    _, *cross = sessions[GENAI_WHISPER_ENCODER].run(None, encoder)
    ids, past = prompt(config).numpy(), [t.numpy() for t in empty_past(config)]
    steps = []
    for _ in range(2):
        feed = dict(zip(decoder_spec.input_names, [ids, *past, *cross], strict=True))
        steps.append(feed)
        logits, *past = sessions[GENAI_WHISPER_DECODER].run(None, feed)
        ids = logits[:, -1:].argmax(-1).astype("int64")
    return {GENAI_WHISPER_ENCODER: [encoder], GENAI_WHISPER_DECODER: steps}
