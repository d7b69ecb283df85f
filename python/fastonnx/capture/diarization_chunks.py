"""Nemotron 3 Diarization's offline forward, captured as the one chunk its config declares.

Offline (no ``speaker_cache``, no look-back or look-ahead frames), transformers' forward splits the
encoder frames into chunks of ``config.chunk_length`` (340: 27.2 s of audio) in a Python loop,
``range(0, frames, chunk_length)``, and carries a FIFO queue and a speaker cache from one chunk to the next
(compressed by a data-dependent selection of frames). The loop's count is decided on the length, so
torch.export keeps the example's number of frames exactly. Up to one chunk the loop runs once, over an
empty queue and cache: the encoder and the classifier over all frames, the logits cut to the input's
frames. That is the form here, checked (``torch._check``) to hold no more than one chunk; the graph's
feature length is bounded by the same rule (``offline_chunk_features``) and refuses longer audio at run
time, which would need the cross-chunk state.

The feature stacking alone (``stacked_features``) is swapped for Nemotron 3.5 Transcribe's audio encoder
too (the same embedder), and ``stacking_factor`` tells an encoder exported alone what its stacking needs.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch

from fastonnx.capture.model_swaps import swapped_forms
from fastonnx.torch_internals import check_size

MODEL_TYPE = "nemotron3_diarization"
STACKING = {
    MODEL_TYPE: "Nemotron3DiarizationFeatureStacking",
    "nemotron3_5_transcribe": "Nemotron3_5TranscribeFeatureStacking",
}
"""transformers' model types whose audio encoder stacks feature frames, and the embedder's class."""


def one_chunk_forward(
    original: Callable[..., Any],
    self: Any,
    input_features: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    speaker_cache: Any = None,
    num_lookahead_frames: int | None = None,
    num_lookback_frames: int | None = None,
    **kwargs: Any,
) -> Any:
    """transformers' offline forward at no more than ``config.chunk_length`` encoder frames; streaming
    calls run transformers' own."""
    if speaker_cache is not None or num_lookahead_frames is not None or num_lookback_frames is not None:
        return original(
            self,
            input_features,
            attention_mask=attention_mask,
            speaker_cache=speaker_cache,
            num_lookahead_frames=num_lookahead_frames,
            num_lookback_frames=num_lookback_frames,
            **kwargs,
        )
    factor = int(self.config.audio_config.subsampling_factor)
    frames = input_features.shape[1]
    # one offline chunk, no state across chunks; on the features' length, a range torch.export keeps
    check_size(frames <= self.config.chunk_length * factor)
    embeds = self.model.audio_tower.embedder(input_features)
    mask = attention_mask[:, ::factor].bool() if attention_mask is not None else None
    positions = torch.arange(embeds.shape[1], device=embeds.device)[None, :]
    outputs = self.model(inputs_embeds=embeds, attention_mask=mask, position_ids=positions, **kwargs)
    logits = self.classifier(outputs.last_hidden_state)
    # the last encoder frame may be the padding of the feature stacking: the input's frames, by index
    logits = logits.index_select(1, torch.arange(frames, device=logits.device))
    output_class = vars(sys.modules[type(self).__module__])["Nemotron3DiarizationOutput"]
    return output_class(logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions)


def stacked_features(self: Any, input_features: torch.Tensor) -> torch.Tensor:
    """transformers' feature stacking (``subsampling_factor`` frames a row, the last group zero-padded),
    padded to ``factor * ceil(frames / factor)`` frames: a length sympy sees as a multiple of the factor,
    where transformers' ``frames + (-frames % factor)`` leaves an unprovable divisibility guard."""
    batch, frames, bins = input_features.shape
    factor = int(self.subsampling_factor)
    rows = (frames + factor - 1) // factor
    padded = torch.nn.functional.pad(input_features, (0, 0, 0, rows * factor - frames))
    out: torch.Tensor = self.projection(padded.reshape(batch, rows, bins * factor))
    return out


def offline_chunk_features(model: torch.nn.Module) -> tuple[int, int] | None:
    """The fewest and most feature frames of one offline chunk of a Nemotron 3 Diarization model in
    ``model``, else None: from the frames that make 2 encoder frames (at 1 the attention is another
    program, a size-1 dim broadcasting) to ``chunk_length`` encoder frames of ``subsampling_factor``
    feature frames each."""
    for module in model.modules():
        config: Any = getattr(module, "config", None)
        if getattr(config, "model_type", None) == MODEL_TYPE:
            factor = int(config.audio_config.subsampling_factor)
            return factor + 1, int(config.chunk_length) * factor
    return None


def stacking_factor(model: torch.nn.Module) -> int | None:
    """The ``subsampling_factor`` of a ``STACKING`` embedder in ``model`` (frames a row of the encoder),
    else None."""
    names = set(STACKING.values())
    for module in model.modules():
        if type(module).__name__ in names:
            factor: Any = module.subsampling_factor  # a plain int attribute, not a submodule
            return int(factor)
    return None


@contextlib.contextmanager
def one_chunk_diarization() -> Iterator[None]:
    """While active, Nemotron 3 Diarization's frame classifier (if loaded) has ``one_chunk_forward``."""

    def wrap(form: Callable[..., Any], original: Any) -> Any:
        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            return form(original, self, *args, **kwargs)

        return method

    chunks = {MODEL_TYPE: {"Nemotron3DiarizationForAudioFrameClassification.forward": one_chunk_forward}}
    stacking = {t: {f"{cls}.forward": stacked_features} for t, cls in STACKING.items()}
    with swapped_forms(chunks, wrap), swapped_forms(stacking):
        yield
