"""Audio-language models (Voxtral, Granite Speech, AudioFlamingo3, GLM-ASR...): decoder-only LMs that read
audio features in place of a token, in three files, image-text-to-text's layout (vision_language.py)
with an audio tower:

- ``audio_encoder.onnx``: ``input_features`` of one audio (batch 1; mel bins x frames, or frames x
  features, as the tower reads them), and ``input_features_mask`` (1 at the frames that hold audio)
  where the model's ``get_audio_features`` takes one, to ``audio_features``: the audio's features as
  rows, ``num_audio_tokens`` x hidden, transformers' own ``get_audio_features``. A Whisper-style tower
  (a position table of ``max_source_positions``) reads exactly its ``2 * max_source_positions`` frames,
  which the model checks; other towers any number (``feature_length``). With a mask, the rows are those
  of the frames it keeps (their number follows the mask's sum). MusicFlamingo's also reads the prompt's
  ``input_ids``: its rows' rotary timestamps follow each window's place in its audio, found from the runs
  of audio tokens; its graph takes all the prompt's windows in one run (``audio_windows`` of them);
- ``embed_tokens.onnx``: ``input_ids`` and ``audio_features`` to ``inputs_embeds``, the rows put at the
  audio token's positions in order (vision_language.MergedEmbeddings); a step without audio passes 0 rows;
- ``decoder_model_merged.onnx``: image-text-to-text's decoder (vision_language.embeds_decoder).

transformers lists these classes in the seq2seq and speech-seq2seq mappings; they take no
``decoder_input_ids``, so text2text-generation and automatic-speech-recognition export them so.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

import torch

from fastonnx.errors import InputError
from fastonnx.pretrained.encoder_tasks import FEATURES, frame_size, whisper_frames
from fastonnx.pretrained.graph_spec import BATCH, SEQUENCE, GraphSpec, takes
from fastonnx.pretrained.vision_language import (
    DECODER_FILE,
    EMBED_FILE,
    MergedEmbeddings,
    embeds_decoder,
    mrope,
    text_sizes,
)

AUDIO_FILE = "audio_encoder.onnx"
AUDIO_TOKENS = "num_audio_tokens"
MASK = "input_features_mask"
PROMPT = "input_ids"
WAVE, WAVE_MASK = "input_values", "padding_mask"
WINDOWS = "audio_windows"
WAVE_TOKENS = "audio_tokens"
SWITCHES = {"sample": False}
"""Flags of ``get_audio_features`` the graph fixes: VibeVoice ASR's ``sample`` (True by default) adds
Gaussian noise to its acoustic latents, a draw of its own; the graph computes them without it, as
``sample=False`` does, and the package check runs transformers so."""
EXAMPLE_FRAMES = 100  # a second of 10 ms frames (times the frames the tower reads together)
EXAMPLE_TOKENS = 5  # a waveform's tokens of samples (VibeVoice ASR's: 3200 samples a token)

__all__ = ["AUDIO_FILE", "DECODER_FILE", "EMBED_FILE"]


def _get_audio_features(model: torch.nn.Module) -> Any:
    """The method computing the audio's features: the outer class's ``get_audio_features``, which most
    families forward as ``(*args, **kwargs)`` to their inner model's (whose signature tells the inputs);
    Qwen2-Audio's, which has none, its forward's inline audio path."""
    inner = getattr(model, "model", None)
    own = getattr(model, "get_audio_features", None)
    if own is None:
        return _inline_audio_features(model)
    named = [
        p
        for p in inspect.signature(own).parameters.values()
        if p.kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)
    ]
    if not named and inner is not None and hasattr(inner, "get_audio_features"):
        return inner.get_audio_features
    return own


def _inline_audio_features(model: torch.nn.Module) -> Any:
    """Qwen2-Audio's forward runs its audio tower inline, on ``input_features`` and the frames' mask it
    calls ``feature_attention_mask``: the same modules called the same way, as a ``get_audio_features``
    returning the rows of the frames kept (None for a model that has no such path)."""
    inner: Any = getattr(model, "model", model)
    tower: Any = getattr(inner, "audio_tower", None)
    projector: Any = getattr(inner, "multi_modal_projector", None)
    lengths: Any = getattr(tower, "_get_feat_extract_output_lengths", None)
    if projector is None or lengths is None or not takes(inner, "feature_attention_mask"):
        return None
    create_mask = sys.modules[type(inner).__module__].create_bidirectional_mask

    def get_audio_features(input_features: torch.Tensor, input_features_mask: torch.Tensor) -> torch.Tensor:
        feature_lengths, output_lengths = lengths(input_features_mask.sum(-1))
        batch, _, frames = input_features.shape
        states = (frames - 2) // 2 + 1  # the tower's strided convolution
        kept = torch.arange(states, device=input_features.device)[None, :] < feature_lengths[:, None]
        dtype = inner.get_input_embeddings().weight.dtype
        mask = create_mask(
            config=tower.config,
            inputs_embeds=torch.zeros(batch, states, 1, dtype=dtype, device=input_features.device),
            attention_mask=kept.long(),
        )
        features: torch.Tensor = projector(tower(input_features, attention_mask=mask).last_hidden_state)
        rows = torch.arange(features.shape[1], device=features.device)[None, :] < output_lengths[:, None]
        return features[rows]

    return get_audio_features


def model_audio_inputs(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> dict[str, Any]:
    """``inputs`` (audio_inputs') as the model's forward names them: Qwen2-Audio's mask is its
    ``feature_attention_mask``; with the ``SWITCHES`` the forward takes (VibeVoice ASR's ``sample``)."""
    if MASK in inputs and not takes(model, MASK) and takes(model, "feature_attention_mask"):
        inputs = {("feature_attention_mask" if k == MASK else k): v for k, v in inputs.items()}
    switches = {k: v for k, v in SWITCHES.items() if takes(model, k)}  # as the graph computes them
    return {**{k: v for k, v in inputs.items() if k != PROMPT}, **switches}  # the prompt's ids: as such


def is_audio_language(model: torch.nn.Module) -> bool:
    """Whether ``model`` is a decoder-only audio-LLM: audio features merged into its token embeddings
    (``get_audio_features``), no ``decoder_input_ids`` (not an encoder-decoder)."""
    inner = getattr(model, "model", model)
    tower = _get_audio_features(model) is not None or hasattr(inner, "audio_tower")
    return tower and not takes(model, "decoder_input_ids")


def _forwards_keywords(module: Any) -> bool:
    params = inspect.signature(module.forward).parameters.values()
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def positions_reach_decoder(model: torch.nn.Module) -> bool:
    """Whether ``position_ids`` reach the language model: a forward naming them, or (MOSS-Transcribe-
    Diarize's) one passing its keywords through its inner model to a language model that takes them."""
    if takes(model, "position_ids"):
        return True
    inner = getattr(model, "model", None)
    lm = getattr(inner, "language_model", None)
    return (
        isinstance(lm, torch.nn.Module)
        and takes(lm, "position_ids")
        and _forwards_keywords(model)
        and _forwards_keywords(inner)
    )


def audio_token_id(config: Any) -> int:
    """The id of the token the audio's feature rows replace (``audio_token_id``, or ``audio_token_index``)."""
    for key in ("audio_token_id", "audio_token_index"):
        value = getattr(config, key, None)
        if isinstance(value, int):
            return value
    raise InputError(
        f"{type(config).__name__} names no audio_token_id: where the audio goes in a prompt is unknown"
    )


def audio_arguments(model: torch.nn.Module) -> list[str]:
    """What ``get_audio_features`` takes: ``input_features`` and, for the families masking padded frames,
    ``input_features_mask``, and with it MusicFlamingo's ``input_ids`` (``prompted``)."""
    get = _get_audio_features(model)
    if get is None:
        raise InputError(
            f"{type(model).__name__} has no get_audio_features, nor Qwen2-Audio's inline audio tower: "
            "how its forward computes the audio's features is unknown"
        )
    names = [
        n
        for n, p in inspect.signature(get).parameters.items()
        if n != "self" and p.kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)
    ]
    # what the forward passes as None when not given (a base model's own MOSS-Transcribe-Diarize
    # padding_mask): not an input
    passed_none = set(_forward_defaults(model, {})) - {"input_features", MASK, PROMPT, WAVE}
    names = [n for n in names if n not in passed_none and n not in SWITCHES]
    # MusicFlamingo's: the prompt's ids, where its audio tokens sit (the windows' rotary timestamps);
    # VibeVoice ASR's: the waveform and its samples' mask
    unsupported = [
        n
        for n in names
        if n not in ("input_features", MASK, PROMPT, WAVE, WAVE_MASK)
        or n == PROMPT
        and MASK not in names
        or n == WAVE_MASK
        and WAVE not in names
    ]
    if unsupported or ("input_features" in names) == (WAVE in names):
        raise InputError(
            f"{type(model).__name__}.get_audio_features takes {', '.join(names)}: the audio encoder graph "
            "reads input_features (and input_features_mask, and with it input_ids), or input_values (and "
            "padding_mask), alone"
        )
    return names


def _audio_config(config: Any) -> Any:
    for key in ("audio_config", "encoder_config"):
        sub = getattr(config, key, None)
        if sub is not None:
            return sub
    return config


def _tower(model: torch.nn.Module) -> torch.nn.Module:
    inner: Any = getattr(model, "model", model)
    for name in ("audio_tower", "encoder"):
        tower = getattr(inner, name, None)
        if isinstance(tower, torch.nn.Module):
            return tower
    raise InputError(f"{type(model).__name__} has no audio_tower: its features' layout is unknown")


def feature_layout(model: torch.nn.Module, config: Any) -> tuple[tuple[int, int], int, bool]:
    """(the shape of one audio's ``input_features`` past the batch, the axis of its frames, whether their
    number is fixed): a Whisper-style tower's mel bins x ``2 * max_source_positions``, which the model
    requires exactly; else a second of frames, channels first where the tower starts with a convolution
    over the features, last where with a linear layer."""
    audio = _audio_config(config)
    if WAVE in audio_arguments(model):  # VibeVoice ASR's waveform (batch, 1 channel, samples)
        return (1, EXAMPLE_TOKENS * frame_multiple(model, config)), 2, False
    whisper = whisper_frames(audio)
    if whisper is not None:
        return whisper, 2, True
    frames = EXAMPLE_FRAMES * frame_multiple(model, config)
    context = getattr(audio, "context_size", None)
    if isinstance(context, int):
        # Granite Speech's conformer attends within blocks of context_size frames: an example of one
        # block would have torch.export specialise the number of blocks to 1
        frames = max(frames, 2 * context + 1)
    size = frame_size(config)
    if size is None and isinstance(getattr(audio, "input_dim", None), int):
        size = int(audio.input_dim)  # Granite Speech's encoder: a linear layer over each frame
    if size is None:
        raise InputError(
            f"{type(model).__name__}'s audio config names no mel bins: the frame size is unknown"
        )
    layers = list(_tower(model).modules())
    # a convolution over the bins (Whisper's Conv1d; Qwen3-ASR's Conv2d over bins x frames) reads them
    # channels first; a linear layer over a frame's features (Granite Speech's), frames first
    if any(
        (isinstance(m, torch.nn.Conv1d) and m.in_channels == size)
        or (isinstance(m, torch.nn.Conv2d) and m.in_channels == 1)
        for m in layers
    ):
        return (size, frames), 2, False
    if any(isinstance(m, torch.nn.Linear) and m.in_features == size for m in layers):
        return (frames, size), 1, False
    raise InputError(f"{type(model).__name__}'s audio tower has no layer reading frames of {size} features")


def frame_multiple(model: torch.nn.Module, config: Any) -> int:
    """The number of frames a tower that takes any number of them reads in whole multiples of, as the
    model itself requires: Qwen3-ASR's chunks of ``2 * n_window`` frames (its encoder raises on others);
    GLM-ASR's convolutions halve the frames and ``get_audio_features`` merges the states of
    ``intermediate_size / hidden_size`` of them into a row (a reshape that fails on a remainder);
    VibeVoice ASR's samples, whole tokens of its acoustic tokenizer's ``hop_length`` (3200), as its
    processor pads them."""
    audio = _audio_config(config)
    hop = getattr(getattr(config, "acoustic_tokenizer_encoder_config", None), "hop_length", None)
    if isinstance(hop, int):  # VibeVoice ASR's waveform: its processor pads it to whole tokens
        return hop
    window = getattr(audio, "n_window", None)
    if isinstance(window, int):
        return 2 * window
    if getattr(config, "model_type", None) == "glmasr":
        return 2 * int(audio.intermediate_size) // int(audio.hidden_size)
    return 1


def most_frames(config: Any) -> int:
    """The most frames a tower that takes any number of them reads, as its own position table bounds
    them: Fun-ASR-Nano's sinusoid table of ``max_position_embeddings`` rows, counted from 1 (its
    ``position_embeddings`` slices rows 1 to frames + 1), so one fewer frames; VibeVoice ASR's samples,
    its ``acoustic_tokenizer_chunk_size`` (60 s); else 2**20."""
    if getattr(config, "model_type", None) == "fun_asr_nano":
        return int(_audio_config(config).max_position_embeddings) - 1
    chunk = getattr(config, "acoustic_tokenizer_chunk_size", None)
    if isinstance(chunk, int):
        # VibeVoice ASR splits longer audio into chunks of that many samples in a Python loop, its
        # tokenizers' streaming caches carried between them: one chunk a graph
        return chunk
    return 1 << 20


def audio_inputs(
    model: torch.nn.Module, config: Any, device: str | torch.device, kept: float = 1.0
) -> dict[str, torch.Tensor]:
    """One audio's ``input_features`` (VibeVoice ASR's waveform, ``input_values``) and, where
    ``get_audio_features`` takes it, its mask: 1 at the first ``kept`` part of the frames (the processor
    pads the rest)."""
    shape, axis, _ = feature_layout(model, config)
    g = torch.Generator().manual_seed(0)
    names = audio_arguments(model)
    audio, mask_name = (WAVE, WAVE_MASK) if WAVE in names else ("input_features", MASK)
    windows = 2 if PROMPT in names else 1  # a prompted audio: two windows of one audio
    inputs = {audio: torch.randn(windows, *shape, generator=g).to(device)}
    if mask_name in names:
        frames = shape[axis - 1]
        mask = torch.ones(windows, frames, dtype=torch.int64)
        mask[-1, max(1, int(frames * kept)) :] = 0
        if PROMPT in names:
            inputs[PROMPT] = prompt_ids(model, config, mask).to(device)
        inputs[mask_name] = mask.to(device)
    return inputs


def prompt_ids(model: torch.nn.Module, config: Any, mask: torch.Tensor) -> torch.Tensor:
    """A prompt (1, length) holding the audio's tokens, as many as the tower keeps rows of the windows
    ``mask`` marks, between 2 and 4 text tokens."""
    _, rows = _tower(model)._get_feat_extract_output_lengths(mask.sum(-1))  # type: ignore[operator]
    return prompt_holding(config, int(rows.sum()))


def prompt_holding(config: Any, count: int) -> torch.Tensor:
    """A prompt (1, length) holding ``count`` audio tokens in one run, between 2 and 4 text tokens."""
    token = audio_token_id(config)
    _, vocab = text_sizes(config)
    text = torch.randint(min(3, vocab - 1), vocab, (1, 6), generator=torch.Generator().manual_seed(1))
    text[text == token] = 3  # the audio's tokens only where the audio goes
    return torch.cat([text[:, :2], torch.full((1, count), token), text[:, 2:]], dim=1)


def audio_features(model: torch.nn.Module, **inputs: torch.Tensor) -> torch.Tensor:
    """The audio's feature rows as the model merges them: ``get_audio_features``' pooled output."""
    get = _get_audio_features(model)
    params = inspect.signature(get).parameters
    switches = {k: v for k, v in SWITCHES.items() if k in params}
    out = get(**inputs, **_forward_defaults(model, inputs), **switches)
    pooled = getattr(out, "pooler_output", None)
    rows: torch.Tensor = pooled if pooled is not None else out
    return rows.reshape(-1, rows.shape[-1])


def _forward_defaults(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> dict[str, Any]:
    """The arguments the inner ``get_audio_features`` requires beyond ``inputs`` that the forward passes it
    from its own parameters of default None (MOSS-Transcribe-Diarize's ``padding_mask``, which it only
    documents): None, as the forward passes them when not given."""
    # the inner model's, or a base model's own (MOSS-Transcribe-Diarize's bare model)
    inner = getattr(getattr(model, "model", model), "get_audio_features", None)
    if inner is None:
        return {}
    forward = inspect.signature(model.forward).parameters
    return {
        n: None
        for n, p in inspect.signature(inner).parameters.items()
        if n not in inputs
        and p.default is inspect.Parameter.empty
        and p.kind is not inspect.Parameter.VAR_KEYWORD
        and p.kind is not inspect.Parameter.VAR_POSITIONAL
        and n in forward
        and forward[n].default is None
    }


class AudioEncoder(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_features: torch.Tensor) -> torch.Tensor:
        return audio_features(self.model, input_features=input_features)


class MaskedAudioEncoder(AudioEncoder):
    def forward(self, input_features: torch.Tensor, input_features_mask: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return audio_features(
            self.model, input_features=input_features, input_features_mask=input_features_mask
        )


class WaveformAudioEncoder(AudioEncoder):
    """VibeVoice ASR's: the waveform and its samples' mask (``padding_mask``, 1 at the samples holding
    audio), the rows those of the tokens it covers."""

    def forward(self, input_values: torch.Tensor, padding_mask: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return audio_features(self.model, input_values=input_values, padding_mask=padding_mask)


class PromptedAudioEncoder(AudioEncoder):
    def forward(  # type: ignore[override]
        self, input_features: torch.Tensor, input_features_mask: torch.Tensor, input_ids: torch.Tensor
    ) -> torch.Tensor:
        return audio_features(
            self.model,
            input_features=input_features,
            input_features_mask=input_features_mask,
            input_ids=input_ids,
        )


def audio_text_to_text(model: torch.nn.Module, config: Any) -> dict[str, GraphSpec]:
    """The three graphs of an audio-language model's package."""
    token = audio_token_id(config)
    names = audio_arguments(model)
    if not takes(model, "inputs_embeds") or not positions_reach_decoder(model):
        raise InputError(f"{type(model).__name__}'s forward takes no inputs_embeds and position_ids")
    if mrope(model):
        raise InputError(f"{type(model).__name__}'s positions are multimodal rotary ones (get_rope_index)")
    _, axis, fixed = feature_layout(model, config)
    example = audio_inputs(model, config, "meta")
    audio, mask = (WAVE, WAVE_MASK) if WAVE in names else ("input_features", MASK)
    dims: dict[str, Any] = {audio: {}}
    if not fixed:
        multiple = frame_multiple(model, config)
        unit = WAVE_TOKENS if audio == WAVE else FEATURES if multiple == 1 else f"{FEATURES}_blocks"
        frames: Any = torch.export.Dim(unit, min=1, max=most_frames(config) // multiple)
        if multiple > 1:  # whole blocks of frames: a dim derived from their number
            frames = multiple * frames
        dims[audio] = {axis: frames}
        if mask in names:
            dims[mask] = {1: frames}
    elif mask in names:
        dims[mask] = {}
    if PROMPT in names:  # the windows of the prompt's audios, all in one run: their timestamps follow
        windows = torch.export.Dim(WINDOWS, min=1, max=1024)
        dims = {k: {**v, 0: windows} for k, v in dims.items()}
        dims[PROMPT] = {1: torch.export.Dim(SEQUENCE, min=1, max=1 << 20)}
    encoder = MaskedAudioEncoder(model) if MASK in names else AudioEncoder(model)
    if WAVE in names:
        encoder = WaveformAudioEncoder(model)
    if PROMPT in names:
        encoder = PromptedAudioEncoder(model)
    audio_spec = GraphSpec(encoder, tuple(example[n] for n in names), dims, names, ["audio_features"])

    hidden, vocab = text_sizes(config)
    b = torch.export.Dim(BATCH, min=1, max=1024)
    s = torch.export.Dim(SEQUENCE, min=1, max=1 << 20)
    rows = torch.export.Dim(AUDIO_TOKENS, min=0, max=1 << 20)
    ids = torch.randint(0, vocab, (2, 5), device="meta")
    embed_spec = GraphSpec(
        MergedEmbeddings(model, token),
        (ids, torch.zeros(3, hidden, device="meta")),
        {"input_ids": {0: b, 1: s}, "image_features": {0: rows}},
        ["input_ids", "audio_features"],
        ["inputs_embeds"],
    )
    return {
        AUDIO_FILE: audio_spec,
        EMBED_FILE: embed_spec,
        DECODER_FILE: embeds_decoder(model, config, token),
    }
