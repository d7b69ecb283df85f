"""feature-extraction of the audio base models whose forward reads more than their audio (encoder_tasks.py
would feed them ``input_features`` alone):

- an audio-language base model (Voxtral's, Qwen2-Audio's, GLM-ASR's... bare ``XModel``) reads its audio
  and its prompt as its automatic-speech-recognition package does (audio_language.py): ``input_ids`` and
  ``attention_mask`` of ``batch_size`` prompts holding the audio placeholder tokens its processor writes
  for their audios' frames, ``input_features`` of ``num_audios`` audios (the example's first prompt holds
  two, the others one each: the audios are not the prompts) and, where ``get_audio_features`` reads it,
  the frames' mask (Qwen2-Audio's forward calls it ``feature_attention_mask``); it returns the language
  model's ``last_hidden_state``. The frames are audio_language.feature_layout's: a Whisper-style tower's
  fixed number, else any number (in whole blocks where the tower reads blocks: Qwen3-ASR, GLM-ASR);
- a transducer (Parakeet's RNN-T and TDT, Nemotron ASR's) reads ``input_features`` and the prediction
  network's ``decoder_input_ids``, ``batch_size`` x 1: the one step its forward declares (it squeezes
  the joint's output on that axis), and Nemotron 3.5 ASR's language ``prompt_ids`` (one a row, as its
  processor writes them); it returns what its output class declares: the encoder's states
  (``last_hidden_state``), their projection the joint reads (``pooler_output``) and the joint's
  ``logits``, frames x vocabulary.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import torch

from fastonnx.pretrained import audio_language as al
from fastonnx.pretrained.encoder_tasks import (
    FEATURES,
    Named,
    Outputs,
    _fewest,
    _length_function,
    audio_inputs,
    dynamic_shapes,
    output_fields,
    reads_text_alone,
)
from fastonnx.pretrained.graph_spec import BATCH, SEQUENCE, GraphSpec, takes

TASK = "feature-extraction"
AUDIOS = "num_audios"
TRANSDUCER_OUTPUTS = ("last_hidden_state", "pooler_output", "logits")
_MAX = 1 << 20

Inputs = dict[str, torch.Tensor]


def is_transducer(model: torch.nn.Module) -> bool:
    """An RNN-T / TDT transducer: audio features, a prediction network's ``decoder_input_ids`` and its
    ``decoder_cache`` (an encoder-decoder's decoder takes no such cache)."""
    return all(takes(model, n) for n in ("input_features", "decoder_input_ids", "decoder_cache"))


def is_audio_prompted(model: torch.nn.Module) -> bool:
    """An audio-language model whose forward merges its audio's rows into a prompt's tokens."""
    return takes(model, "input_ids") and takes(model, "input_features") and al.is_audio_language(model)


def owns(model: torch.nn.Module, task: str) -> bool:
    """Whether this module makes ``task``'s graph of ``model``."""
    if task != TASK or reads_text_alone(getattr(model, "config", None), task):
        return False  # an omni model also naming image tokens (Gemma 4, Qwen2.5-Omni) reads text alone
    return is_transducer(model) or is_audio_prompted(model)


def base_inputs(model: torch.nn.Module, config: Any, batch: int, device: str | torch.device) -> Inputs:
    """The forward's inputs, by its names, for ``batch`` rows."""
    if is_transducer(model):
        return _transducer_inputs(model, config, batch, device)
    return _prompted_inputs(model, config, batch, device)


def base_graph(model: torch.nn.Module, config: Any) -> GraphSpec:
    """The one graph of ``model``'s feature-extraction package."""
    if is_transducer(model):
        inputs = _transducer_inputs(model, config, 2, "meta")
        names = {
            "input_features": {0: BATCH, 1: FEATURES},
            "decoder_input_ids": {0: BATCH},
            **({"prompt_ids": {0: BATCH}} if "prompt_ids" in inputs else {}),
        }
        declared = _declared(model)
        fields = tuple(f for f in TRANSDUCER_OUTPUTS if f in declared) or output_fields(model, TASK)
        module: torch.nn.Module = (
            _PromptedTransducer(model, fields) if "prompt_ids" in inputs else _Transducer(model, fields)
        )
        shapes = _within_positions(model, dynamic_shapes(model, names))
        return GraphSpec(module, tuple(inputs.values()), shapes, list(inputs), list(fields))
    inputs = _prompted_inputs(model, config, 2, "meta")
    fields = output_fields(model, TASK)
    mask = _mask_name(model)
    module = PromptFeatures(model, fields) if mask is None else _MaskedPrompt(model, fields, mask)
    return GraphSpec(
        module, tuple(inputs.values()), _prompted_dims(model, config, mask), list(inputs), list(fields)
    )


def _declared(model: torch.nn.Module) -> set[str]:
    cls = inspect.signature(model.forward).return_annotation
    return {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()


def _within_positions(model: torch.nn.Module, shapes: dict[str, Any]) -> dict[str, Any]:
    """``shapes`` with the frames bounded where the encoder's relative position encoding itself raises on
    more subsampled frames than its ``max_position_embeddings`` (Nemotron ASR's: "Sequence Length: ... has
    to be less or equal than config.max_position_embeddings"): the most frames its subsampling turns
    into that many. Parakeet's holds the number but reads it nowhere."""
    limits = [
        limit
        for m in model.modules()
        if isinstance(limit := getattr(m, "max_position_embeddings", None), int) and _reads_limit(m)
    ]
    lengths = _length_function(model, "_get_subsampling_output_length")
    if not limits or lengths is None:
        return shapes
    most = _fewest(lambda frames: int(lengths(torch.tensor(frames))), min(limits) + 1) - 1
    frames = shapes["input_features"][1]
    shapes["input_features"][1] = torch.export.Dim(FEATURES, min=frames.min, max=most)
    return shapes


def _reads_limit(module: torch.nn.Module) -> bool:
    try:
        source = inspect.getsource(type(module).forward)
    except (OSError, TypeError):
        return False
    return "self.max_position_embeddings" in source


def _transducer_inputs(model: torch.nn.Module, config: Any, batch: int, device: str | torch.device) -> Inputs:
    features, _ = audio_inputs(model, config, batch, device)
    g = torch.Generator().manual_seed(2)
    inputs = {
        **features,
        "decoder_input_ids": torch.randint(0, int(config.vocab_size), (batch, 1), generator=g).to(device),
    }
    if takes(model, "prompt_ids"):  # Nemotron 3.5 ASR's language, one a row
        prompts = int(config.num_prompts)
        inputs["prompt_ids"] = torch.randint(0, prompts, (batch,), generator=g).to(device)
    return inputs


def _mask_name(model: torch.nn.Module) -> str | None:
    """The forward's name of the frames' mask ``get_audio_features`` reads, None where it reads none."""
    if al.MASK not in al.audio_arguments(model):
        return None
    return al.MASK if takes(model, al.MASK) else "feature_attention_mask"


def _held(batch: int) -> list[list[int]]:
    """Which audios each prompt holds: the first prompt two, the others one each."""
    return [[0, 1]] + [[r + 1] for r in range(1, batch)]


def _prompted_inputs(model: torch.nn.Module, config: Any, batch: int, device: str | torch.device) -> Inputs:
    shape, axis, _ = al.feature_layout(model, config)
    names = al.audio_arguments(model)
    g = torch.Generator().manual_seed(0)
    features = torch.randn(batch + 1, *shape, generator=g)
    frames = shape[axis - 1]
    mask = torch.ones(batch + 1, frames, dtype=torch.int64)
    mask[-1, max(1, frames * 3 // 4) :] = 0  # the last audio padded, where the mask says so
    held = _held(batch)
    prompts = [_prompt(model, config, names, features[i], mask[i], device) for i in held]
    length = max(p.shape[1] for p in prompts)
    token = al.audio_token_id(config)
    ids = torch.full((batch, length), 4 if token == 3 else 3, dtype=torch.int64)
    attention = torch.zeros(batch, length, dtype=torch.int64)
    for r, p in enumerate(prompts):  # right-padded, as the processor pads a batch
        ids[r, : p.shape[1]], attention[r, : p.shape[1]] = p[0], 1
    inputs = {"input_ids": ids, "attention_mask": attention, "input_features": features}
    name = _mask_name(model)
    if name is not None:
        inputs[name] = mask
    return {k: v.to(device) for k, v in inputs.items()}


def _prompt(
    model: torch.nn.Module,
    config: Any,
    names: list[str],
    features: torch.Tensor,
    mask: torch.Tensor,
    device: str | torch.device,
) -> torch.Tensor:
    """One prompt holding as many audio tokens as the model makes rows of ``features``' audios."""
    if al.PROMPT in names:  # MusicFlamingo's rows follow the mask's lengths
        return al.prompt_ids(model, config, mask)
    if str(device) == "meta" and al.MASK in names:
        # the capture reads no values: a count standing for the data-dependent one the mask decides
        return al.prompt_holding(config, 1)
    audio = {"input_features": features.to(device)}
    if al.MASK in names:
        audio[al.MASK] = mask.to(device)
    with torch.no_grad():
        rows = al.audio_features(model, **audio).shape[0]
    return al.prompt_holding(config, int(rows))


def _prompted_dims(model: torch.nn.Module, config: Any, mask: str | None) -> dict[str, dict[int, Any]]:
    _, axis, fixed = al.feature_layout(model, config)
    batch = torch.export.Dim(BATCH, min=1, max=1024)
    sequence = torch.export.Dim(SEQUENCE, min=1, max=_MAX)
    audios = torch.export.Dim(AUDIOS, min=1, max=1024)
    text = {0: batch, 1: sequence}
    dims: dict[str, dict[int, Any]] = {"input_ids": text, "attention_mask": text}
    frames: Any = None
    if not fixed:
        multiple = al.frame_multiple(model, config)
        name = FEATURES if multiple == 1 else f"{FEATURES}_blocks"
        frames = torch.export.Dim(name, min=1, max=al.most_frames(config) // multiple)
        if multiple > 1:  # whole blocks of frames: a dim derived from their number
            frames = multiple * frames
    dims["input_features"] = {0: audios, **({axis: frames} if frames is not None else {})}
    if mask is not None:  # the module's parameter: _MaskedPrompt's features_mask
        dims["features_mask"] = {0: audios, **({1: frames} if frames is not None else {})}
    return dims


class PromptFeatures(torch.nn.Module):
    """A prompt and its audio's features (media_text_towers.py's CLAP spectrograms too)."""

    def __init__(self, model: torch.nn.Module, fields: tuple[str, ...]) -> None:
        super().__init__()
        self.inner = Named(model, fields)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, input_features: torch.Tensor
    ) -> Outputs:
        out: Outputs = self.inner(
            input_ids=input_ids, attention_mask=attention_mask, input_features=input_features
        )
        return out


class _MaskedPrompt(torch.nn.Module):
    def __init__(self, model: torch.nn.Module, fields: tuple[str, ...], mask: str) -> None:
        super().__init__()
        self.inner, self.mask = Named(model, fields), mask

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        input_features: torch.Tensor,
        features_mask: torch.Tensor,
    ) -> Outputs:
        out: Outputs = self.inner(
            input_ids=input_ids,
            attention_mask=attention_mask,
            input_features=input_features,
            **{self.mask: features_mask},
        )
        return out


class _Transducer(torch.nn.Module):
    def __init__(self, model: torch.nn.Module, fields: tuple[str, ...]) -> None:
        super().__init__()
        self.inner = Named(model, fields)

    def forward(self, input_features: torch.Tensor, decoder_input_ids: torch.Tensor) -> Outputs:
        out: Outputs = self.inner(input_features=input_features, decoder_input_ids=decoder_input_ids)
        return out


class _PromptedTransducer(_Transducer):
    def forward(  # type: ignore[override]
        self, input_features: torch.Tensor, decoder_input_ids: torch.Tensor, prompt_ids: torch.Tensor
    ) -> Outputs:
        out: Outputs = self.inner(
            input_features=input_features, decoder_input_ids=decoder_input_ids, prompt_ids=prompt_ids
        )
        return out
