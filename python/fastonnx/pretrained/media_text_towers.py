"""feature-extraction of two-tower models of text and audio or video, which embed each apart as CLIP
embeds text and images (encoder_tasks.py's two towers) but read a waveform or clips and name their
embeddings otherwise:

- Perception Encoder's audio model (``PeAudioModel``): ``input_ids``, ``attention_mask`` of
  ``text_batch_size`` prompts and ``input_values``, ``batch_size`` waveforms of one channel x
  ``audio_sequence_length`` samples (its DAC encoder's convolutions), to ``text_audio_embeds`` and
  ``audio_embeds``;
- Perception Encoder's video model (``PeVideoModel``): the prompts and ``pixel_values_videos``,
  ``batch_size`` x ``num_frames`` x channels x its tower's image size (any number of frames: it encodes
  each, then attends across them), to ``text_video_embeds`` and ``video_embeds``;
- CLAP (``ClapModel``): the prompts and ``input_features``, ``batch_size`` log-mel spectrograms of one
  channel x its feature extractor's ``CLAP_FRAMES`` frames x ``num_mel_bins`` (10 s at 48 kHz, which it
  pads or crops every audio to), to ``text_embeds`` and ``audio_embeds``;
- VideoPrism's clip model (``VideoPrismClipModel``): the prompts and clips of its config's
  ``num_frames`` (its frame embeddings fix them), to ``text_embeds`` and ``video_embeds``; in
  zero-shot-image-classification, whose mapping lists it, ``logits_per_video`` and ``logits_per_text``
  first.

The graph returns those embeddings alone, as feature-extraction of CLIP returns ``text_embeds`` and
``image_embeds``; the similarity logits are their products. ``owns`` says which models this module
makes the graph of (``tower_graph``), ``tower_inputs`` their inputs (the package check's too).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from fastonnx.pretrained.audio_base_models import PromptFeatures  # CLAP's: text and spectrograms
from fastonnx.pretrained.encoder_tasks import (
    AUDIO,
    TEXT_BATCH,
    VIDEO_FRAMES,
    WAVEFORM_SAMPLES,
    Named,
    Outputs,
    _output_class,
    dynamic_shapes,
    text_inputs,
    video_clips,
)
from fastonnx.pretrained.graph_spec import BATCH, SEQUENCE, GraphSpec, takes

TASK = "feature-extraction"
ZERO_SHOT = "zero-shot-image-classification"
EMBEDS = ("text_embeds", "text_audio_embeds", "text_video_embeds", "audio_embeds", "video_embeds")
"""The embeddings these models' outputs declare, text's first (the order the graph returns them in)."""
LOGITS = ("logits_per_video", "logits_per_audio", "logits_per_text")
"""The similarity logits zero-shot classification returns before the embeddings (VideoPrism's clip
model sits in transformers' zero-shot image mapping), as CLIP's graph of that task does."""

Inputs = tuple[dict[str, torch.Tensor], dict[str, dict[int, str]]]


CLAP_FRAMES = 1001
"""The frames of CLAP's features: its feature extractor's 480000 samples (10 s at 48 kHz), hop 480."""


def _media(model: torch.nn.Module) -> str | None:
    """The input beside the text: ``input_values``, ``pixel_values_videos`` or ``input_features``, else None."""
    return next(
        (n for n in ("input_values", "pixel_values_videos", "input_features") if takes(model, n)), None
    )


def embed_fields(model: torch.nn.Module, task: str = TASK) -> tuple[str, ...]:
    """Those of ``EMBEDS`` the model's output class declares, after its ``LOGITS`` in zero-shot
    classification."""
    cls = _output_class(model)
    declared = {f.name for f in dataclasses.fields(cls)} if cls is not None else set()
    return tuple(f for f in (*LOGITS, *EMBEDS) if f in declared and (task == ZERO_SHOT or f in EMBEDS))


def owns(model: torch.nn.Module, task: str) -> bool:
    """A two-tower model of text and a waveform or clips, declaring their embeddings, in feature-extraction
    or zero-shot classification."""
    fields = embed_fields(model)
    return (
        task in (TASK, ZERO_SHOT)
        and takes(model, "input_ids")
        and _media(model) is not None
        and any(f.startswith("text") for f in fields)
        and any(not f.startswith("text") for f in fields)
    )


def tower_inputs(model: torch.nn.Module, config: Any, batch: int, device: str | torch.device) -> Inputs:
    """``batch + 1`` prompts (the second right-padded) beside ``batch`` waveforms or clips, and the dims."""
    text = text_inputs(config, batch + 1, 7, device, False)
    dims: dict[str, dict[int, str]] = {name: {0: TEXT_BATCH, 1: SEQUENCE} for name in text}
    if _media(model) == "input_values":
        wave = torch.randn(batch, 1, WAVEFORM_SAMPLES, generator=torch.Generator().manual_seed(0))
        return {**text, "input_values": wave.to(device)}, {**dims, "input_values": {0: BATCH, 2: AUDIO}}
    if _media(model) == "input_features":  # CLAP's one-channel spectrograms
        bins = int(config.audio_config.num_mel_bins)
        mels = torch.randn(batch, 1, CLAP_FRAMES, bins, generator=torch.Generator().manual_seed(0))
        return {**text, "input_features": mels.to(device)}, {**dims, "input_features": {0: BATCH}}
    video = getattr(config, "video_config", None) or config  # PE's video tower config, VideoPrism's own
    clips, fixed = video_clips(video, batch, device)
    frames = {0: BATCH} if fixed else {0: BATCH, 1: VIDEO_FRAMES}
    return {**text, **clips}, {**dims, "pixel_values_videos": frames}


class _AudioText(torch.nn.Module):
    def __init__(self, model: torch.nn.Module, fields: tuple[str, ...]) -> None:
        super().__init__()
        self.inner = Named(model, fields)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, input_values: torch.Tensor
    ) -> Outputs:
        out: Outputs = self.inner(
            input_ids=input_ids, attention_mask=attention_mask, input_values=input_values
        )
        return out


class _VideoText(torch.nn.Module):
    def __init__(self, model: torch.nn.Module, fields: tuple[str, ...]) -> None:
        super().__init__()
        self.inner = Named(model, fields)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, pixel_values_videos: torch.Tensor
    ) -> Outputs:
        out: Outputs = self.inner(
            input_ids=input_ids, attention_mask=attention_mask, pixel_values_videos=pixel_values_videos
        )
        return out


_GRAPHS = {"input_values": _AudioText, "pixel_values_videos": _VideoText, "input_features": PromptFeatures}


def tower_graph(model: torch.nn.Module, config: Any, task: str = TASK) -> GraphSpec:
    """The one graph of the package: the prompts and the waveforms, spectrograms or clips to the embeddings
    (and, in zero-shot classification, the logits first)."""
    inputs, names = tower_inputs(model, config, 2, "meta")
    fields = embed_fields(model, task)
    module = _GRAPHS[list(inputs)[-1]](model, fields)
    return GraphSpec(module, tuple(inputs.values()), dynamic_shapes(model, names), list(inputs), list(fields))
