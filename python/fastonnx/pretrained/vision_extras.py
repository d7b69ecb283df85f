"""The inputs of a vision-language model's ``get_image_features`` beyond ``pixel_values`` that
``vision_encoder.onnx`` takes as its own (vision_language.py's layout otherwise):

- DeepSeek-VL-Hybrid's second image, ``high_res_pixel_values`` (its SAM tower's size);
- InstructBLIP's Q-Former prompt: its Q-Former reads the instruction as well as the image
  (``qformer_input_ids`` and ``qformer_attention_mask``, the processor's Q-Former tokenization of the
  prompt, their length dynamic); the query rows then go at the image token and the steps are the
  language model's, as BLIP-2's. InstructBLIP-Video is the same over a video of 4 frames (its processor's
  and ``generate``'s number): ``pixel_values`` 1 x 4 x channels x height x width, ``get_video_features``,
  the rows at the video token.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from fastonnx.pretrained.encoder_tasks import image_inputs
from fastonnx.pretrained.graph_spec import GraphSpec

VISION_EXTRAS = ("high_res_pixel_values", "qformer_input_ids", "qformer_attention_mask")
"""Inputs of ``get_image_features`` beyond the pixels that ``vision_encoder.onnx`` takes as its own."""

QFORMER_TOKENS = "qformer_sequence_length"


def vision_extras(get: Any) -> list[str]:
    """The ``VISION_EXTRAS`` that ``get_image_features`` takes, in its order."""
    return [n for n in inspect.signature(get).parameters if n in VISION_EXTRAS]


def extra_vision_inputs(config: Any, names: list[str], device: str | torch.device) -> dict[str, torch.Tensor]:
    """``names``' example values for one image: the high-resolution image of the SAM tower's size, a
    Q-Former prompt of 5 tokens of its vocabulary."""
    out: dict[str, torch.Tensor] = {}
    if "high_res_pixel_values" in names:
        out["high_res_pixel_values"] = image_inputs(config.high_res_vision_config, 1, device)["pixel_values"]
    if "qformer_input_ids" in names:
        vocab = int(config.qformer_config.vocab_size)
        g = torch.Generator().manual_seed(2)
        out["qformer_input_ids"] = torch.randint(3, vocab, (1, 5), generator=g).to(device)
    if "qformer_attention_mask" in names:
        out["qformer_attention_mask"] = torch.ones(1, 5, dtype=torch.int64, device=device)
    return out


def extra_vision_dims(names: list[str]) -> dict[str, dict[int, Any]]:
    tokens = torch.export.Dim(QFORMER_TOKENS, min=1, max=1 << 16)
    return {n: ({1: tokens} if n.startswith("qformer_") else {}) for n in names}


class VisionEncoderWithExtras(torch.nn.Module):
    """``get_image_features`` of one image and its ``VISION_EXTRAS`` (one or two: ``first``, ``second``),
    as rows."""

    def __init__(
        self, model: torch.nn.Module, names: list[str], features: Callable[..., torch.Tensor]
    ) -> None:
        super().__init__()
        self.model, self.names, self.features = model, names, features  # vision_language.image_features

    def forward(
        self, pixel_values: torch.Tensor, first: torch.Tensor, second: torch.Tensor | None = None
    ) -> torch.Tensor:
        extras = [first] if second is None else [first, second]
        return self.features(
            self.model, pixel_values=pixel_values, **dict(zip(self.names, extras, strict=True))
        )


def extras_spec(
    model: torch.nn.Module,
    config: Any,
    pixels: torch.Tensor,
    names: list[str],
    features: Callable[..., torch.Tensor],
) -> GraphSpec:
    """``vision_encoder.onnx`` of one image of ``pixels``' size and its ``names`` extras."""
    extras = extra_vision_inputs(config, names, "meta")
    return GraphSpec(
        VisionEncoderWithExtras(model, names, features),
        (pixels, *extras.values()),
        dict(zip(["pixel_values", "first", "second"], [{}, *extra_vision_dims(names).values()])),
        ["pixel_values", *names],
        ["image_features"],
    )


VIDEO_TOKENS = ("video_token_id", "video_token_index")


class VideoFrames:
    """``get_video_features`` as vision_language.py calls ``get_image_features``."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def get_image_features(
        self,
        pixel_values: torch.Tensor,
        qformer_input_ids: torch.Tensor,
        qformer_attention_mask: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> Any:
        return self.model.get_video_features(
            pixel_values=pixel_values,
            qformer_input_ids=qformer_input_ids,
            qformer_attention_mask=qformer_attention_mask,
            **kwargs,
        )
