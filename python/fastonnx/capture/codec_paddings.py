"""EnCodec's, Mimi's and PocketTTS's padded convolutions, swapped while torch.export captures for a form
that computes the same function at every length without a data-dependent guard.

``EncodecConv1d.forward`` computes its extra right padding from tensor buffers (``stride``,
``kernel_size``, ``padding_total``: ``ceil`` of a float division of the length), so the padding is a
tensor value, and its reflect padding (``_pad1d``) branches on ``length <= max(pads)``: a guard on data.
``encodec_conv1d_by_sizes`` computes the same paddings from the convolution's own ints (the buffers are
made from them): the extra padding ``ceil(L / stride) * stride - L`` is ``(-L) mod stride``, 0 for a
stride of 1 (every convolution of EnCodec's decoder); and the reflection (``F.pad``'s needs pads shorter
than the input, transformers appends zeros to a short one first and cuts them after) is one gather of
reflected positions over the zero-extended length, the same values at every length.
``mimi_conv1d_by_sizes`` does the same for ``MimiConv1d`` (PocketTTS's audio tokenizer has Mimi's code
under its own name): the same paddings from the same buffers, no normalization, and its streaming
``padding_cache`` prepended as Mimi does.

``mimi_codebook_quantize``: Mimi's codebook picks its codes by ``argmin`` of ``torch.cdist``, whose
default mode computes by matrix product only where either side has more than 25 rows, a branch on the
frames (a guard ``batch x frames <= 25``). The form asks for each mode by name: the product alone where
the codebook has more than 25 entries (every released Mimi: eager takes it at every length), else both,
picked by the row count as a tensor, so the codes are eager's at every length.

``neucodec_encode_symbolic``: NeuCodec trims its semantic and acoustic frames to the shorter with
Python's ``min``, a guard on which is shorter; the form takes ``torch.sym_min``.

``conv1d_output_length_by_ints``: X-Codec counts its acoustic frames by ``int()`` of a float division
(to decide whether to pad the waveform as its semantic model does), which made the length an int.

``encodec_encode_whole``: ``EncodecModel.encode`` loops ``range(0, length, stride)``, the stride the
length itself where the model does not chunk: one frame, the same codes, without the int.

Only the modules already imported are swapped (model_swaps.py), for the duration of the capture.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import Any

import torch

from fastonnx.capture.model_swaps import Forms, swapped_forms


def reflect_pad_any_length(hidden_states: torch.Tensor, left: Any, right: Any) -> torch.Tensor:
    """``EncodecConv1d._pad1d`` in reflect mode as one gather: zeros appended up to ``max(left, right) + 1``
    where the input is shorter (reflection needs that), positions reflected over that length, the
    appended zeros' reflected share cut again (the output is ``left + L + right`` long)."""
    length = hidden_states.shape[-1]
    extended = torch.sym_max(length, max(left, right) + 1)
    device = hidden_states.device
    source = (torch.arange(left + length + right, device=device) - left).abs()
    source = torch.where(source >= extended, 2 * (extended - 1) - source, source)
    inside = source < length
    picked = hidden_states.index_select(-1, torch.where(inside, source, 0))
    return torch.where(inside, picked, 0.0)


def conv1d_paddings(conv: torch.nn.Conv1d, causal: bool, length: Any) -> tuple[Any, Any]:
    """The (left, right) padding transformers' codecs give ``conv`` on an input ``length`` long: the
    padding total ``effective kernel - stride`` (all left when causal, else the larger half left), and
    the extra right padding ``ceil(L / stride) * stride - L`` making a whole number of strides."""
    stride = int(conv.stride[0])
    total = (int(conv.kernel_size[0]) - 1) * int(conv.dilation[0]) + 1 - stride
    extra = (-length) % stride
    if causal:
        return total, extra
    return total - total // 2, total // 2 + extra


def pad_by_mode(hidden_states: torch.Tensor, left: Any, right: Any, mode: str) -> torch.Tensor:
    """``_pad1d`` of transformers' codecs: reflect as one gather at any length, the other modes F.pad's."""
    if mode == "reflect":
        return reflect_pad_any_length(hidden_states, left, right)
    return torch.nn.functional.pad(hidden_states, (left, right), mode)


def encodec_conv1d_by_sizes(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    """``EncodecConv1d.forward`` with its paddings from the convolution's ints, not its tensor buffers."""
    left, right = conv1d_paddings(self.conv, self.causal, hidden_states.shape[-1])
    hidden_states = pad_by_mode(hidden_states, left, right, self.pad_mode)
    hidden_states = self.conv(hidden_states)
    if self.norm_type == "time_group_norm":
        hidden_states = self.norm(hidden_states)
    return hidden_states


def mimi_conv1d_by_sizes(self: Any, hidden_states: torch.Tensor, padding_cache: Any = None) -> torch.Tensor:
    """``MimiConv1d.forward`` (and PocketTTS's copy) with its paddings from the convolution's ints."""
    if padding_cache is not None:
        if not self.causal:
            raise ValueError("`padding_cache` is not supported for non-causal convolutions.")
        cached = padding_cache.update(hidden_states, self.layer_idx)
        hidden_states = torch.cat([cached, hidden_states], dim=2)
    else:
        left, right = conv1d_paddings(self.conv, self.causal, hidden_states.shape[-1])
        hidden_states = pad_by_mode(hidden_states, left, right, self.pad_mode)
    convolved: torch.Tensor = self.conv(hidden_states)
    return convolved


def encodec_encode_whole(
    self: Any,
    input_values: torch.Tensor,
    padding_mask: torch.Tensor | None = None,
    bandwidth: float | None = None,
    return_dict: bool | None = None,
) -> Any:
    """``EncodecModel.encode`` without its ``range(0, length, length)`` over a model that does not chunk
    (``chunk_length`` None: one frame of the whole input), which made the length an int; a chunking one
    (48 kHz) loops over its chunks as transformers does, their count the length's."""
    output: Any = importlib.import_module("transformers.models.encodec.modeling_encodec").EncodecEncoderOutput
    config = self.config
    bandwidth = config.target_bandwidths[0] if bandwidth is None else bandwidth
    if bandwidth not in config.target_bandwidths:
        raise ValueError(
            f"This model doesn't support the bandwidth {bandwidth}. Select one of {config.target_bandwidths}."
        )
    channels, length = input_values.shape[1], input_values.shape[-1]
    if channels < 1 or channels > 2:
        raise ValueError(f"Number of audio channels must be 1 or 2, but got {channels}")
    if padding_mask is None:
        mask = torch.ones_like(input_values).bool()
    else:
        mask = padding_mask.view(padding_mask.shape[0], -1, padding_mask.shape[-1]).bool()
    if config.chunk_length is None:
        starts, width = [0], length
    else:
        starts, width = list(range(0, int(length), config.chunk_stride)), config.chunk_length
    codes, scales = [], []
    for start in starts:
        chunk = input_values[..., start : start + width]
        code, scale = self._encode_frame(mask[..., start : start + width] * chunk, bandwidth)
        codes.append(code)
        scales.append(scale)
    pad = codes[0].shape[-1] - codes[-1].shape[-1]
    if len(codes) > 1 and pad > 0:  # the last chunk's codes padded to the others'
        codes[-1] = torch.nn.functional.pad(codes[-1], (0, pad), value=0)
    frames = torch.stack(codes)
    last_pad = pad if len(codes) > 1 else 0
    if return_dict is False or (return_dict is None and not config.return_dict):
        return frames, scales, last_pad
    return output(frames, scales, last_pad)


def neucodec_encode_symbolic(
    self: Any,
    input_values: torch.Tensor,
    input_features: torch.Tensor,
    padding_mask: torch.Tensor | None = None,
    input_features_mask: torch.Tensor | None = None,
    output_latents: bool = False,
    **kwargs: Any,
) -> Any:
    """``NeuCodecModel.encode`` with its semantic and acoustic frames trimmed to ``torch.sym_min`` of the
    two, not Python's ``min``, which decided which is shorter on the example's sizes."""
    module: Any = importlib.import_module("transformers.models.neucodec.modeling_neucodec")
    with torch.no_grad():
        semantic = self.semantic_encoder(input_features, attention_mask=input_features_mask)
    semantic_states = self.semantic_adapter(semantic.last_hidden_state.transpose(1, 2))
    acoustic_states = self.acoustic_encoder(input_values)
    frames = torch.sym_min(acoustic_states.shape[-1], semantic_states.shape[-1])
    hidden_states = torch.cat([semantic_states[..., :frames], acoustic_states[..., :frames]], dim=1)
    latents, audio_codes = self.quantizer(self.fc_encoder(hidden_states.transpose(1, 2)))
    audio_codes = audio_codes.transpose(1, 2)
    codes_mask = None
    if padding_mask is not None:  # the codes' mask from the samples kept, as transformers computes it
        kept = padding_mask.sum(dim=-1, keepdim=True) * self.sample_rate_conversion_factor
        positions = torch.arange(audio_codes.shape[-1], device=padding_mask.device).view(1, -1)
        codes_mask = (positions < kept // self.hop_length).to(padding_mask.dtype)
    return module.NeuCodecEncoderOutput(
        audio_codes=audio_codes,
        latents=latents.transpose(1, 2) if output_latents else None,
        audio_codes_mask=codes_mask,
    )


def conv1d_output_length_by_ints(module: torch.nn.Conv1d, input_length: Any) -> Any:
    """transformers' ``audio_utils.conv1d_output_length`` as integer arithmetic: its ``int()`` of a
    float division made the length an int. The same count wherever the convolution has an output (its
    numerator not negative: there truncation is the floor)."""
    span = int(module.dilation[0]) * (int(module.kernel_size[0]) - 1) + 1
    return (input_length + 2 * int(module.padding[0]) - span) // int(module.stride[0]) + 1


_CDIST_ROWS = 25  # torch.cdist's default mode computes by matrix product past this many rows


def mimi_codebook_quantize(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    """``MimiEuclideanCodebook.quantize`` with torch.cdist's mode chosen without a branch on the rows."""
    x, embed = hidden_states[None].float(), self.embed[None].float()
    by_product = torch.cdist(x, embed, p=2, compute_mode="use_mm_for_euclid_dist")[0].argmin(dim=-1)
    if embed.shape[1] > _CDIST_ROWS:
        return by_product
    direct = torch.cdist(x, embed, p=2, compute_mode="donot_use_mm_for_euclid_dist")[0].argmin(dim=-1)
    rows = torch.full((), hidden_states.shape[0], device=hidden_states.device)
    return torch.where(rows > _CDIST_ROWS, by_product, direct)


SWAPS: Forms = {
    "encodec": {
        "EncodecConv1d.forward": encodec_conv1d_by_sizes,
        "EncodecModel.encode": encodec_encode_whole,
    },
    "mimi": {
        "MimiConv1d.forward": mimi_conv1d_by_sizes,
        "MimiEuclideanCodebook.quantize": mimi_codebook_quantize,
    },
    "pocket_tts_audio_tokenizer": {"PocketTTSAudioTokenizerConv1d.forward": mimi_conv1d_by_sizes},
    "neucodec": {"NeuCodecModel.encode": neucodec_encode_symbolic},
    "xcodec": {"conv1d_output_length": conv1d_output_length_by_ints},
}
"""transformers' model types and the ``Class.method``s swapped (model_swaps.py)."""


@contextlib.contextmanager
def guard_free_codec_paddings() -> Iterator[None]:
    """While active, the loaded modules of ``SWAPS`` have their guard-free forms."""
    with swapped_forms(SWAPS):
        yield
