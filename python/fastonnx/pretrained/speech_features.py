"""feature-extraction of speech encoders exported alone whose forward reads more than frames of features
(encoder_tasks.py makes the graph, ``MelEncoder`` Gemma 3n's; this module gives its inputs):

- Qwen3-ASR's encoder (``Qwen3ASREncoder``): ``input_features``, ``batch_size`` x mel bins x frames (mel
  bins first, as its Conv2d reads them), the frames whole chunks of ``2 * n_window`` (it raises on
  others: the dim is ``2 * n_window`` x ``feature_length_blocks``), and ``input_features_mask``,
  ``batch_size`` x frames, 1 at the frames that hold audio (each chunk's rows follow its sum). It returns
  ``last_hidden_state`` as transformers does: the rows of every audio's kept frames packed one after
  another, rows x hidden (no batch axis; their number follows the mask);
- Gemma 3n's audio encoder (``Gemma3nAudioEncoder``): ``audio_mel``, ``batch_size`` x frames x
  ``input_feat_size``, and ``audio_mel_mask``, ``batch_size`` x frames, bool, **True at padding** (the
  inverse of the feature extractor's ``input_features_mask``, as ``Gemma3nModel`` passes it); it returns
  ``last_hidden_state``, ``batch_size`` x frames / (4 x ``conf_reduction_factor``) x hidden, the rows of
  padding zeros.

``speech_inputs`` gives the inputs and their dynamic dims (None for any other model); ``least_frames``
the fewest frames Gemma 3n's graph takes.
"""

from __future__ import annotations

from typing import Any

import torch

from fastonnx.pretrained.graph_spec import BATCH, FEATURES, takes

Inputs = tuple[dict[str, torch.Tensor], dict[str, dict[int, str]]]

EXAMPLE_FRAMES = 100  # a second of 10 ms frames
BLOCKS = f"{FEATURES}_blocks"
"""The number of whole chunks of frames a Qwen3-ASR encoder reads (its frames' dim derives from it)."""


def chunk_frames(model: torch.nn.Module, config: Any) -> int | None:
    """The frames of one chunk of an encoder that reads whole chunks of ``2 * n_window`` and their mask
    (Qwen3-ASR's), None for any other model (a whole audio-language model takes its prompt too)."""
    window = getattr(config, "n_window", None)
    reads = takes(model, "input_features") and takes(model, "input_features_mask")
    if not isinstance(window, int) or not reads or takes(model, "input_ids"):
        return None
    return 2 * window


def speech_inputs(
    model: torch.nn.Module, config: Any, batch: int, device: str | torch.device
) -> Inputs | None:
    """The inputs of ``batch`` audios and their dynamic dims, for the encoders this module knows."""
    chunk = chunk_frames(model, config)
    if chunk is not None:
        return _chunked_inputs(config, chunk, batch, device)
    if takes(model, "audio_mel") and takes(model, "audio_mel_mask"):
        return _mel_inputs(config, batch, device)
    return None


def _chunked_inputs(config: Any, chunk: int, batch: int, device: str | torch.device) -> Inputs:
    """Two chunks of mel bins x frames an audio, the last audio holding 1.3 chunks of audio (its last
    chunk partly padded, as the processor pads a batch to whole chunks)."""
    g = torch.Generator().manual_seed(0)
    frames = 2 * chunk  # 2 chunks: torch.export would keep a count of 1
    features = torch.randn(batch, int(config.num_mel_bins), frames, generator=g)
    mask = torch.ones(batch, frames, dtype=torch.int64)
    mask[-1, chunk + chunk * 3 // 10 :] = 0
    dim = f"{chunk}*{BLOCKS}"  # encoder_tasks.dynamic_shapes derives it from BLOCKS
    inputs = {"input_features": features.to(device), "input_features_mask": mask.to(device)}
    return inputs, {"input_features": {0: BATCH, 2: dim}, "input_features_mask": {0: BATCH, 1: dim}}


def _mel_inputs(config: Any, batch: int, device: str | torch.device) -> Inputs:
    """A second of frames of ``input_feat_size`` mel bins an audio, the last audio's last quarter padding
    (True in the mask)."""
    g = torch.Generator().manual_seed(0)
    mel = torch.randn(batch, EXAMPLE_FRAMES, int(config.input_feat_size), generator=g)
    padding = torch.zeros(batch, EXAMPLE_FRAMES, dtype=torch.bool)
    padding[-1, EXAMPLE_FRAMES * 3 // 4 :] = True
    dims = {0: BATCH, 1: FEATURES}
    return {"audio_mel": mel.to(device), "audio_mel_mask": padding.to(device)}, {
        "audio_mel": dims,
        "audio_mel_mask": dims,
    }


def least_frames(model: torch.nn.Module) -> int | None:
    """The fewest frames of Gemma 3n's audio encoder, else None: those its convolutions subsample into 2
    blocks of ``conf_attention_chunk_size`` rows (at 1 block its attention is another program, a size-1
    dim broadcasting; shorter audio is padded, its mask True there)."""
    config = getattr(model, "config", None)
    strides, chunk = (
        getattr(config, k, None) for k in ("sscp_conv_stride_size", "conf_attention_chunk_size")
    )
    if not takes(model, "audio_mel") or not isinstance(chunk, int) or not strides:
        return None
    stride = 1
    for time_stride, _ in strides:
        stride *= int(time_stride)
    return stride * chunk + 1
