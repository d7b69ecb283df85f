"""automatic-speech-recognition of Voxtral Realtime (VoxtralRealtimeForConditionalGeneration): a decoder
that adds to each token's embedding one token's worth of audio, ``downsample_factor`` frames of its causal
audio encoder, projected. The audio encoder runs step by step beside the decoder, with a cache of its
own. Two files:

- ``audio_embedder.onnx``: ``input_features`` (``batch_size`` x mel bins x ``feature_length``: the
  processor's log-mel) to ``encoder_inputs_embeds`` (``batch_size`` x ``audio_frames`` x the audio
  encoder's width): the encoder's causal convolutions over the whole audio, which ``generate`` runs once
  before its first step.
- ``decoder_model_merged.onnx``: one step of ``sequence_length`` tokens: ``input_ids``; their rows of
  ``encoder_inputs_embeds`` (``downsample_factor * sequence_length`` of them, from row
  ``downsample_factor * past_sequence_length``); ``attention_mask``; ``position_ids``; ``num_delay_tokens``
  (the processor's, one int64); the decoder's cache ``past_key_values.%d.key`` / ``.value``; and the audio
  encoder's ``encoder_past_key_values.%d.key`` / ``.value`` (``downsample_factor * past_sequence_length``
  positions). Outputs: ``logits``, ``present.*`` and ``encoder_present.*``.

The loop (``generate(input_ids, input_features, num_delay_tokens)``, greedy; ``check_package`` runs it over
the sessions): ``embeds = audio_embedder(input_features)``; the prompt reads rows ``[0, ds * P)``; each
later step reads its one token and the next ``ds`` rows; the tokens in all, prompt included, are
``ceil(feature_length / audio_length_per_tok)``. Both caches keep every position: the masks apply the
sliding windows, as transformers' sliding caches drop the positions past them.
"""

from __future__ import annotations

from typing import Any

import torch

from fastonnx.diagnostics.verdicts import VerificationInfo, compare
from fastonnx.pretrained.decoder_cache import (
    cache_dims,
    cache_names,
    config_layout,
    filled_cache,
    flat_tensors,
)
from fastonnx.pretrained.graph_spec import BATCH, FEATURES, PAST, SEQUENCE, TOTAL, GraphSpec

CLASSES = frozenset({"VoxtralRealtimeForConditionalGeneration"})
BARE = frozenset({"VoxtralRealtimeModel"})
"""Its base model, whose feature-extraction graph reads the prompt and its audio whole (``bare_graph``)."""
EMBEDDER_FILE, DECODER_FILE = "audio_embedder.onnx", "decoder_model_merged.onnx"
STEP_INPUTS = ["input_ids", "encoder_inputs_embeds", "attention_mask", "position_ids", "num_delay_tokens"]
PROMPT, NEW_TOKENS = 4, 6  # the check's prompt and the tokens generated after it


def own_layout(model: torch.nn.Module) -> bool:
    return type(model).__name__ in CLASSES


def owns_bare(model: torch.nn.Module, task: str) -> bool:
    return task == "feature-extraction" and type(model).__name__ in BARE


class BareFeatures(torch.nn.Module):
    """The base model's forward on a prompt and its whole audio, at its default delay (the forward's own
    fallback when no ``num_delay_tokens`` is given), to the language model's states."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, input_features: torch.Tensor
    ) -> torch.Tensor:
        delay = int(self.model.config.default_num_delay_tokens)
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            input_features=input_features,
            num_delay_tokens=delay,
        )
        states: torch.Tensor = out.last_hidden_state
        return states


def bare_inputs(model: Any, batch: int, length: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """``batch`` prompts of ``length`` tokens and their audio, ``audio_length_per_tok`` frames a token."""
    config = model.config
    g = torch.Generator().manual_seed(seed)
    frames = int(config.audio_length_per_tok) * length
    return {
        "input_ids": torch.randint(3, int(config.text_config.vocab_size), (batch, length), generator=g),
        "attention_mask": torch.ones(batch, length, dtype=torch.int64),
        "input_features": torch.randn(batch, int(config.audio_config.num_mel_bins), frames, generator=g),
    }


def bare_graph(model: torch.nn.Module, config: Any) -> GraphSpec:
    """feature-extraction of the base model: ``input_ids``, ``attention_mask`` and ``input_features`` of
    ``audio_length_per_tok`` frames a token to ``last_hidden_state``."""
    b = torch.export.Dim(BATCH, min=1, max=1024)
    s = torch.export.Dim(SEQUENCE, min=1, max=1 << 16)
    inputs = bare_inputs(model, 2, 3)
    dims = {
        "input_ids": {0: b, 1: s},
        "attention_mask": {0: b, 1: s},
        "input_features": {0: b, 2: int(config.audio_length_per_tok) * s},
    }
    names = list(inputs)
    return GraphSpec(BareFeatures(model), tuple(inputs.values()), dims, names, ["last_hidden_state"])


def check_bare(session: Any, model: Any, spec: GraphSpec, run: Any, tolerance: Any) -> list[VerificationInfo]:
    """The base model's states on a batch of 2 at another length than the example's."""
    inputs = bare_inputs(model, 2, 7, seed=1)
    (got,) = run(session, spec.input_names, [inputs[n] for n in spec.input_names])
    with torch.no_grad():
        want = BareFeatures(model)(**inputs)
    return [compare("last_hidden_state", want, got, *tolerance(want))]


class AudioEmbedder(torch.nn.Module):
    """The audio encoder's causal convolutions over the whole log-mel."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model  # whole: the package's weights are found under the model's path

    def forward(self, input_features: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.model.model.audio_tower.embedder(input_features)
        return out


class StreamedStep(torch.nn.Module):
    """One step of the decoder and of the audio encoder beside it, as VoxtralRealtimeModel's forward
    composes them, with ``num_delay_tokens`` a tensor (its forward reads a Python number)."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        input_ids: torch.Tensor,
        encoder_inputs_embeds: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        num_delay_tokens: torch.Tensor,
        past_key_values: Any,
        encoder_past_key_values: Any,
    ) -> tuple[torch.Tensor, Any, Any]:
        inner = self.model.model
        audio = inner.get_audio_features(
            encoder_inputs_embeds=encoder_inputs_embeds,
            past_key_values=encoder_past_key_values,
            use_cache=True,
            return_dict=True,
        )
        embeds = inner.get_input_embeddings()(input_ids) + audio.pooler_output
        time = inner.time_embedding(num_delay_tokens.to(embeds.dtype))[None]
        out = inner.language_model(
            inputs_embeds=embeds,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            use_cache=True,
            t_cond=time,
        )
        return self.model.lm_head(out.last_hidden_state), out.past_key_values, audio.past_key_values


def streamed_graphs(model: torch.nn.Module, config: Any) -> dict[str, GraphSpec]:
    """The two files' specs."""
    ds = int(config.downsample_factor)
    text, audio = config.text_config, config.audio_config
    layout, audio_layout = config_layout(text), config_layout(audio)
    b = torch.export.Dim(BATCH, min=1, max=1024)
    s = torch.export.Dim(SEQUENCE, min=1, max=1 << 16)
    p = torch.export.Dim(PAST, min=0, max=1 << 16)
    frames = torch.export.Dim(FEATURES, min=2, max=1 << 20)
    g = torch.Generator().manual_seed(0)
    features = torch.randn(2, int(audio.num_mel_bins), 24, generator=g)
    embedder = GraphSpec(
        AudioEmbedder(model),
        (features,),
        {"input_features": {0: b, 2: frames}},
        ["input_features"],
        ["encoder_inputs_embeds"],
    )
    batch, length, past = 2, 3, 4
    args = (
        torch.randint(3, int(text.vocab_size), (batch, length), generator=g),
        torch.randn(batch, ds * length, int(audio.hidden_size), generator=g),
        torch.ones(batch, past + length, dtype=torch.int64),
        torch.arange(past, past + length).repeat(batch, 1),
        torch.tensor([int(config.default_num_delay_tokens)]),
        filled_cache(layout, batch, past, "cpu", g),
        filled_cache(audio_layout, batch, ds * past, "cpu", g),
    )
    dims = {
        "input_ids": {0: b, 1: s},
        "encoder_inputs_embeds": {0: b, 1: ds * s},
        "attention_mask": {0: b, 1: TOTAL},
        "position_ids": {0: b, 1: s},
        "num_delay_tokens": {},
        "past_key_values": cache_dims(layout, b, p),
        "encoder_past_key_values": cache_dims(audio_layout, b, ds * p),
    }
    names = [
        *STEP_INPUTS,
        *cache_names(layout, "past_key_values"),
        *cache_names(audio_layout, "encoder_past_key_values"),
    ]
    outputs = ["logits", *cache_names(layout, "present"), *cache_names(audio_layout, "encoder_present")]
    step = GraphSpec(StreamedStep(model), args, dims, names, outputs, layout)
    return {EMBEDDER_FILE: embedder, DECODER_FILE: step}


def check_inputs(model: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """A prompt of ``PROMPT`` tokens (bos first) and the log-mel of as many tokens again and
    ``NEW_TOKENS`` more."""
    config = model.config
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, int(config.text_config.vocab_size), (1, PROMPT), generator=g)
    ids[0, 0] = int(config.text_config.bos_token_id)
    frames = int(config.audio_length_per_tok) * (PROMPT + NEW_TOKENS)
    return ids, torch.randn(1, int(config.audio_config.num_mel_bins), frames, generator=g)


def generated(model: Any, ids: torch.Tensor, features: torch.Tensor) -> Any:
    """transformers' greedy ``generate`` (as many tokens as the audio holds), with its logits."""
    per_token = int(model.config.audio_length_per_tok)
    tokens = -(-features.shape[-1] // per_token)  # the audio's, prompt included (generate's own bound)
    with torch.no_grad():
        return model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            input_features=features,
            num_delay_tokens=int(model.config.default_num_delay_tokens),
            max_new_tokens=tokens - ids.shape[1],
            do_sample=False,
            eos_token_id=None,
            output_logits=True,
            return_dict_in_generate=True,
        )


def check_package(
    sessions: dict[str, Any], model: Any, specs: dict[str, GraphSpec], run: Any, tolerance: Any
) -> list[VerificationInfo]:
    """The embedder's rows against transformers', then the loop over the sessions against ``generate``:
    every step's logits, and the tokens."""
    config = model.config
    ds = int(config.downsample_factor)
    ids, features = check_inputs(model)
    (embeds,) = run(sessions[EMBEDDER_FILE], ["input_features"], [features])
    with torch.no_grad():
        want_embeds = model.model.audio_tower.embedder(features)
    infos = [compare("audio_embedder: encoder_inputs_embeds", want_embeds, embeds, *tolerance(want_embeds))]
    want = generated(model, ids, features)
    spec = specs[DECODER_FILE]
    layout, audio_layout = config_layout(config.text_config), config_layout(config.audio_config)
    cache = flat_tensors(filled_cache(layout, 1, 0, "cpu", torch.Generator()))
    audio_cache = flat_tensors(filled_cache(audio_layout, 1, 0, "cpu", torch.Generator()))
    delay = torch.tensor([int(config.default_num_delay_tokens)])
    step_ids, past, tokens = ids, 0, []
    for step, expected in enumerate(want.logits):
        n = step_ids.shape[1]
        rows = embeds[:, ds * past : ds * (past + n)]
        mask = torch.ones(1, past + n, dtype=torch.int64)
        positions = torch.arange(past, past + n)[None]
        feeds = [step_ids, rows, mask, positions, delay, *cache, *audio_cache]
        got = run(sessions[DECODER_FILE], spec.input_names, feeds)
        infos.append(compare(f"step {step}: logits", expected, got[0][:, -1], *tolerance(expected)))
        cache, audio_cache = got[1 : 1 + len(cache)], got[1 + len(cache) :]
        tokens.append(int(got[0][0, -1].argmax()))
        step_ids, past = torch.tensor([[tokens[-1]]]), past + n
    infos.append(compare("generated tokens", want.sequences[0, ids.shape[1] :], torch.tensor(tokens)))
    return infos
