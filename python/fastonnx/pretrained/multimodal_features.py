"""feature-extraction of multimodal base models (the bare ``XModel`` classes): which of them read text
alone, and the video input of the video encoders.

- A base model that merges image (or video) features into its text at placeholder tokens (its config names
  an image token: ``image_token_id``, ``image_token_index``, ``image_token``, or a video token) reads text
  alone: ``input_ids``, ``attention_mask``, returning its language model's ``last_hidden_state``, as the
  text tasks do for such models' classifiers. Its images need their placeholder tokens in the text, as
  many as the image has feature rows, which the processor expands; they go through the image-text-to-text
  package's ``vision_encoder.onnx`` instead. Two-tower models (CLIP, SigLIP, BridgeTower...) name no image
  token and keep images and text. Llama 4's base class (``Llama4ForConditionalGeneration``, which
  transformers' base mapping lists) returns logits alone: its states are its bare language model's.
- A video encoder whose forward reads 5-D ``pixel_values`` (TimeSformer, VideoMAE, ViViT, X-CLIP: batch x
  frames x channels x height x width) takes the config's ``num_frames`` frames of its image size: the batch
  dynamic, the frames fixed, as the models' position embeddings (or frame embeddings) are one a frame.
"""

from __future__ import annotations

from typing import Any

import torch

PLACEHOLDER_KEYS = (
    "image_token_id",
    "image_token_index",
    "image_token",
    "video_token_id",
    "video_token_index",
    "video_token",
)
"""Config keys naming the token an image's (or a video's) features replace in the text."""


def merges_at_placeholders(config: Any) -> bool:
    """Whether the model puts image or video features into its text at a placeholder token."""
    return any(getattr(config, key, None) is not None for key in PLACEHOLDER_KEYS)


def video_frames(config: Any) -> int | None:
    """The frames a video encoder reads (its config's, or its vision tower's, ``num_frames``); None for a
    model of still images. Perceiver's ``num_frames`` is its multimodal autoencoder's: its image
    classifiers read one image."""
    if getattr(config, "model_type", None) == "perceiver":
        return None
    for c in (config, getattr(config, "vision_config", None)):
        frames = getattr(c, "num_frames", None)
        if isinstance(frames, int) and frames > 0:
            return frames
    return None


def as_video(images: dict[str, torch.Tensor], frames: int) -> dict[str, torch.Tensor]:
    """``frames`` frames of each image's size: batch x frames x channels x height x width."""
    pixels = images["pixel_values"]
    g = torch.Generator().manual_seed(0)
    video = torch.randn(pixels.shape[0], frames, *pixels.shape[1:], generator=g)
    return {"pixel_values": video.to(pixels.device)}


def bare_decoder(model: torch.nn.Module) -> torch.nn.Module:
    """The bare language model under ``get_decoder()`` (Llama 4's is its causal LM, logits alone: the
    model under it)."""
    decoder: Any = model.get_decoder()  # type: ignore[operator]
    bare = getattr(decoder, "model", None)
    return bare if isinstance(bare, torch.nn.Module) else decoder


def states_from_decoder(model: torch.nn.Module, declared: set[str] | None, fields: tuple[str, ...]) -> bool:
    """Whether a text-alone model's ``fields`` come from its bare decoder: its own output (fields
    ``declared``) has none of them (Llama 4's ``Llama4ForConditionalGeneration``, which transformers' base
    mapping lists: logits alone)."""
    decoder = callable(getattr(model, "get_decoder", None))
    return decoder and declared is not None and not declared & set(fields)


VIDEO_TYPES = ("instructblipvideo",)
"""Model types whose images are a video's frames (``get_video_features``)."""
FRAMES = 4
"""InstructBLIP-Video's frames a video: its processor's, and what its ``generate`` expects."""


def is_video(config: Any) -> bool:
    return getattr(config, "model_type", None) in VIDEO_TYPES


def as_frames(config: Any, pixels: torch.Tensor) -> torch.Tensor:
    """One image's ``pixels`` as a video of ``FRAMES`` frames where the model reads videos."""
    if not is_video(config):
        return pixels
    g = torch.Generator().manual_seed(3)
    frames = torch.randn(pixels.shape[0], FRAMES, *pixels.shape[1:], generator=g)
    return frames.to(pixels.device)
