"""automatic-speech-recognition of Kyutai's speech-to-text (KyutaiSpeechToTextForConditionalGeneration): a
decoder-only LM that reads, at each position, one text token and one audio frame's codes (its Mimi
codec's ``num_codebooks``), their embeddings summed; it writes a text token a frame. Two files:

- ``audio_encoder.onnx``: ``input_values`` (``batch_size`` x 1 x ``audio_sequence_length``: the
  processor's waveform, its padding included) to ``audio_codes`` (``batch_size`` x ``audio_frames`` x
  ``num_codebooks``): the codec's codes of the whole frames the waveform holds
  (``audio_sequence_length // frame_size``; a rest shorter than a frame is dropped, as ``generate``
  drops it). ``generate`` encodes them in streaming windows; with empty caches and whole frames that
  is the codec's plain ``encode`` (causal: no frame reads a later sample), which the package check
  confirms against the codes ``generate`` read.
- ``decoder_model_merged.onnx``: ``input_ids`` (``batch_size`` x ``sequence_length`` x
  ``1 + num_codebooks``: at each position the text token and an audio frame's codes), ``attention_mask``,
  ``position_ids`` and the cache ``past_key_values.%d.key`` / ``.value`` to ``logits`` (over the text
  vocabulary) and ``present.*``: text-generation's decoder step with three-dimensional ids.

The loop (``generate(input_values=...)``, greedy; ``check_package`` below runs it over the sessions):
``codes = audio_encoder(input_values)``; position 0 reads ``[bos_token_id, audio_bos_token_id x K]``;
position ``t >= 1`` reads ``[the token written at t - 1, codes[:, t - 1]]``; one step a frame, as many
steps as frames (generate's ``max_new_tokens`` is capped there).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from fastonnx.diagnostics.verdicts import VerificationInfo, compare
from fastonnx.pretrained.decoder_cache import filled_cache, flat_tensors
from fastonnx.pretrained.graph_spec import BATCH, GraphSpec
from fastonnx.pretrained.task_inputs import text_generation

CLASSES = frozenset({"KyutaiSpeechToTextForConditionalGeneration"})  # its bare model: encoder_tasks
AUDIO_FILE, DECODER_FILE = "audio_encoder.onnx", "decoder_model_merged.onnx"
SAMPLES = "audio_sequence_length"
CHECK_FRAMES = 8  # steps the package check generates (one a frame)


def own_layout(model: torch.nn.Module) -> bool:
    return type(model).__name__ in CLASSES


class FrameCodes(torch.nn.Module):
    """The codec's codes of the waveform's whole frames, a row a frame."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model  # whole: the package's weights are found under the model's path
        self.frame = int(model.config.frame_size)

    def forward(self, input_values: torch.Tensor) -> torch.Tensor:
        # Mimi is causal: a frame's codes read no later sample, so the whole frames' codes of the
        # waveform are those of its whole frames alone (a slice of the input would guard its length)
        codec: Any = self.model.codec_model
        codes: torch.Tensor = codec.encode(input_values, return_dict=True).audio_codes
        return codes[..., : input_values.shape[-1] // self.frame].transpose(1, 2)


def waveform(model: Any, frames: int, batch: int = 1, seed: int = 0) -> torch.Tensor:
    """A waveform of ``frames`` whole frames and a rest of half a frame (which the codes drop)."""
    frame = int(model.config.frame_size)
    g = torch.Generator().manual_seed(seed)
    return 0.1 * torch.randn(batch, 1, frames * frame + frame // 2, generator=g)


def paired_graphs(model: torch.nn.Module, config: Any) -> dict[str, GraphSpec]:
    """The two files' specs: the codec's codes, and text-generation's decoder step over paired ids."""
    frame = int(config.frame_size)
    samples = torch.export.Dim(SAMPLES, min=frame, max=1 << 26)
    b = torch.export.Dim(BATCH, min=1, max=1024)
    audio = GraphSpec(
        FrameCodes(model),
        (waveform(model, 3, batch=2),),
        {"input_values": {0: b, 2: samples}},
        ["input_values"],
        ["audio_codes"],
    )
    decoder = text_generation(model, config)  # over paired ids (encoder_tasks.paired_columns)
    return {AUDIO_FILE: audio, DECODER_FILE: decoder}


@contextmanager
def recorded_codes(model: Any) -> Iterator[list[torch.Tensor]]:
    """The codes each codec ``encode`` of ``generate`` returns, a row a frame."""
    codec = model.codec_model
    encode = codec.encode
    seen: list[torch.Tensor] = []

    def record(*args: Any, **kwargs: Any) -> Any:
        out = encode(*args, **kwargs)
        seen.append(out.audio_codes.transpose(1, 2))
        return out

    codec.encode = record
    try:
        yield seen
    finally:
        del codec.encode  # the class's own again


def generated(model: Any, wave: torch.Tensor) -> tuple[Any, torch.Tensor]:
    """transformers' greedy ``generate`` on ``wave`` (a text token a frame), with its logits, and the codes
    it read."""
    with torch.no_grad(), recorded_codes(model) as seen:
        out = model.generate(
            input_values=wave,
            do_sample=False,
            max_new_tokens=wave.shape[-1] // int(model.config.frame_size),
            eos_token_id=None,
            output_logits=True,
            return_dict_in_generate=True,
        )
    return out, torch.cat(seen, dim=1)


def check_package(
    sessions: dict[str, Any], model: Any, specs: dict[str, GraphSpec], run: Any, tolerance: Any
) -> list[VerificationInfo]:
    """``CHECK_FRAMES`` frames of audio: the codes against those ``generate`` read, then the loop over the
    sessions against ``generate``: every step's logits, and the tokens."""
    config = model.config
    wave = waveform(model, CHECK_FRAMES)
    (codes,) = run(sessions[AUDIO_FILE], ["input_values"], [wave])
    want, want_codes = generated(model, wave)
    infos = [compare("audio_encoder: audio_codes", want_codes, codes)]
    spec = specs[DECODER_FILE]
    cache = flat_tensors(filled_cache(spec.cache_layout or [], 1, 0, "cpu", torch.Generator()))
    books = int(config.num_codebooks)
    token, tokens = int(config.bos_token_id), []
    for step, expected in enumerate(want.logits):
        audio = torch.full((1, books), int(config.audio_bos_token_id)) if step == 0 else codes[:, step - 1]
        ids = torch.cat([torch.tensor([[token]]), audio], dim=1)[None]
        mask = torch.ones(1, step + 1, dtype=torch.int64)
        got = run(sessions[DECODER_FILE], spec.input_names, [ids, mask, torch.tensor([[step]]), *cache])
        infos.append(compare(f"step {step}: logits", expected, got[0][:, -1], *tolerance(expected)))
        cache = got[1:]
        token = int(got[0][0, -1].argmax())
        tokens.append(token)
    infos.append(compare("generated tokens", want.sequences[0, 1:], torch.tensor(tokens)))
    return infos
