"""text-to-audio of SeamlessM4TForTextToSpeech and SeamlessM4Tv2ForTextToSpeech: transformers' ``generate``
(translate the text, then its speech units, then a waveform) as one graph a stage, the loops the runtime's.

Files (``b`` the batch; a decoder's cache ``past_key_values.%d.decoder.key`` / ``.value`` (self-attention,
``past_decoder_sequence_length`` positions) and ``past_key_values.%d.encoder.key`` / ``.value``
(cross-attention, ``past_encoder_sequence_length``), each ``b`` x heads x length x head size, its outputs
``present.*`` named alike):

- ``text_encoder.onnx``: ``input_ids``, ``attention_mask`` (``b`` x ``encoder_sequence_length``) to
  ``encoder_hidden_states`` (the text encoder's last states).
- ``text_decoder_model_merged.onnx``: one step of the text decoder, the first and the later ones alike:
  ``input_ids`` (``b`` x ``decoder_sequence_length``), ``encoder_hidden_states``,
  ``encoder_attention_mask`` and the cache to ``logits`` (its ``lm_head``'s), ``last_hidden_state`` (the
  decoder's final states, before the head) and ``present.*``. With an empty cross past the step projects
  the cross-attention keys and values from ``encoder_hidden_states``; with a full one it projects nothing,
  so ``present.*.encoder`` is fed back unchanged.
- SeamlessM4T (v1): ``t2u_encoder.onnx``: ``inputs_embeds`` (``b`` x ``t2u_sequence_length`` x hidden),
  ``attention_mask`` to ``encoder_hidden_states``; ``t2u_decoder_model_merged.onnx``: the text-to-unit
  decoder's step as the text decoder's (its ``logits`` are units, its ``last_hidden_state`` unused).
- SeamlessM4T v2: ``t2u_model.onnx``: the non-autoregressive text-to-unit model. ``inputs_embeds``,
  ``attention_mask``, ``char_input_ids`` (``b`` x ``char_sequence_length``: the largest row's characters)
  and ``char_count_per_id`` (``b`` x ``t2u_sequence_length``: characters per position) to ``logits``
  (``b`` x ``unit_sequence_length`` x units) and ``padding_mask`` (``b`` x ``unit_sequence_length``, float:
  1 where a row's units are). Its lengths are data-dependent: the predicted character durations summed.
- ``vocoder.onnx``: the unit HiFi-GAN. ``input_ids`` (``b`` x ``unit_length``: units, ``t2u_pad_token_id``
  where none), ``speaker_id`` and ``lang_id`` (``b`` x 1, int64: rows of its speaker and language
  embeddings) to ``waveform`` (``b`` x samples) and ``waveform_lengths`` (``b``). Every position (pads too)
  is repeated by its predicted duration; a row shorter than the longest is zeros past its frames, as
  transformers pads it; ``waveform_lengths`` is transformers' length (``_get_dur_output_lengths``: the
  durations summed through position ``min(units that are not pad, unit_length - 1)``, then the HiFi-GAN's
  convolution lengths).

The loop (what ``generate(input_ids, attention_mask=mask, tgt_lang=L, do_sample=False, ...)`` does; ``G``
the checkpoint's generation_config.json, whose maps give the language's ids: ``tgt_lang`` is the
runtime's choice, its ids the graphs' inputs):

1. ``encoder_hidden_states = text_encoder(input_ids, attention_mask)``.
2. Text, greedy (transformers' ``generate`` with ``G``, ``text_``-prefixed arguments such as
   ``text_max_new_tokens`` overriding): each row starts with ``[G.decoder_start_token_id,
   G.text_decoder_lang_to_code_id[L]]`` (transformers puts the start token before the language's; the
   language's alone where they are the same id), the cache empty. Each step feeds the new tokens (the
   start tokens, then the last one), ``encoder_hidden_states``,
   ``attention_mask`` as ``encoder_attention_mask`` and the cache; the argmax of the last position's logits
   (after ``G``'s logits processors where it sets any) is the next token; a row that gave
   ``G.eos_token_id`` gives ``G.pad_token_id`` from then on; stop when every row has, or after
   ``max_new_tokens``. ``sequences``: the start tokens and the generated ones.
3. The units' input: ``text_decoder_model_merged`` once more from an empty cache over ``S`` = ``sequences``
   (v1) or ``sequences[:, :-1]`` (v2: without the last token); its ``last_hidden_state`` is ``inputs_embeds``
   and the units' ``attention_mask`` is 1 on each row's first ``count(S != G.pad_token_id)`` positions.
4. Units. v1: ``t2u_encoder(inputs_embeds, attention_mask)``, then greedy steps of
   ``t2u_decoder_model_merged`` as in 2, each row starting with ``[config.t2u_eos_token_id,
   G.t2u_lang_code_to_id[L]]`` (``config.t2u_decoder_start_token_id`` put before them where it is not the
   first), with the text-to-unit model's own generation settings (transformers'
   ``t2u_model.generation_config``: eos ``t2u_eos_token_id``, pad ``t2u_pad_token_id``, at most
   ``t2u_max_new_tokens``; ``speech_``-prefixed arguments override); the units are the sequence less its
   first two tokens, ``t2u_eos_token_id`` replaced by ``t2u_pad_token_id``.
   v2: the text ids ``T = sequences[:, 2:-1]`` with ``G.eos_token_id`` replaced by ``G.pad_token_id``;
   each id's subword ``G.id_to_text[str(id)]``; the characters of each subword up to the row's first pad
   (transformers' ``_count_character_length_in_subword``: a subword's length, an unknown id's 1, a
   punctuation mark followed by a subword starting with "▁" one more and that subword one less), with a 0
   column added before and after; ``char_input_ids`` those subwords' characters through ``G.char_to_id``
   (unknown ones 1, an unknown id's one character 1) one after the other, each row right-padded with
   ``G.pad_token_id`` to the longest. ``t2u_model`` gives ``logits`` and ``padding_mask``; the units are the
   argmax, ``t2u_pad_token_id`` where it is ``t2u_eos_token_id`` or ``padding_mask`` is 0.
5. ``vocoder`` on the units, each not ``t2u_pad_token_id`` less ``config.vocoder_offset``, ``speaker_id``
   the speaker (``generate``'s ``spkr_id`` / ``speaker_id``, default 0) and ``lang_id``
   ``G.vocoder_lang_code_to_id[L]``; transformers returns ``waveform_lengths`` of a batch of one squeezed
   to a scalar.

Sampling (``do_sample``) replaces the argmaxes; the check runs greedy: transformers' own ``generate``
with each stage's forward replaced by its onnxruntime session (``through_sessions``), against plain
``generate``: equal text and unit tokens, the waveform within tolerance. The model draws nothing at
random in eval.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from fastonnx.diagnostics.verdicts import VerificationInfo, compare
from fastonnx.errors import InputError
from fastonnx.pretrained.audio_code_loops import cross_keys
from fastonnx.pretrained.graph_spec import BATCH, GraphSpec
from fastonnx.pretrained.task_inputs import cache_of, empty_layers, seq2seq_cache_names
from fastonnx.torch_internals import pytree

CLASSES = frozenset({"SeamlessM4TForTextToSpeech", "SeamlessM4Tv2ForTextToSpeech"})

TEXT_ENCODER_FILE, TEXT_DECODER_FILE, T2U_ENCODER_FILE, T2U_DECODER_FILE, T2U_FILE, VOCODER_FILE = (
    "text_encoder.onnx",
    "text_decoder_model_merged.onnx",
    "t2u_encoder.onnx",
    "t2u_decoder_model_merged.onnx",
    "t2u_model.onnx",
    "vocoder.onnx",
)
ENCODER_SEQUENCE, DECODER_SEQUENCE, PAST_DECODER, PAST_ENCODER = (
    "encoder_sequence_length",
    "decoder_sequence_length",
    "past_decoder_sequence_length",
    "past_encoder_sequence_length",
)
STEP_INPUTS = ["input_ids", "encoder_hidden_states", "encoder_attention_mask"]
LANGUAGE_MAPS = ("text_decoder_lang_to_code_id", "t2u_lang_code_to_id", "vocoder_lang_code_to_id")
CHARACTER_MAPS = ("id_to_text", "char_to_id")


def own_layout(model: torch.nn.Module) -> bool:
    return type(model).__name__ in CLASSES


def is_v2(model: Any) -> bool:
    return type(model).__name__ == "SeamlessM4Tv2ForTextToSpeech"


class TextEncoder(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        encoder: Any = self.model.text_encoder
        out: torch.Tensor = encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return out


class UnitEncoder(torch.nn.Module):
    """v1's text-to-unit encoder (no embeddings: it reads the text decoder's states)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        model: Any = self.model
        encoder = model.t2u_model.model.encoder
        out: torch.Tensor = encoder(
            inputs_embeds=inputs_embeds, attention_mask=attention_mask
        ).last_hidden_state
        return out


def _decoder(model: Any, unit: bool) -> tuple[Any, Any]:
    """(the decoder, its head): the text decoder's or v1's text-to-unit decoder's."""
    if unit:
        return model.t2u_model.model.decoder, model.t2u_model.lm_head
    return model.text_decoder, model.lm_head


class DecoderStep(torch.nn.Module):
    """One step of a decoder with its self- and cross-attention cache (empty on the first step): logits,
    the final states and the grown cache."""

    def __init__(self, model: torch.nn.Module, unit: bool) -> None:
        super().__init__()
        self.model = model
        self.unit = unit

    def forward(
        self,
        input_ids: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        encoder_attention_mask: torch.Tensor,
        past_key_values: list[torch.Tensor],
    ) -> tuple[torch.Tensor, ...]:
        from transformers import EncoderDecoderCache

        decoder, head = _decoder(self.model, self.unit)
        own: list[torch.Tensor] = []
        cross: list[torch.Tensor] = []
        rows = encoder_hidden_states.transpose(0, 1).clone(memory_format=torch.contiguous_format)
        for i, layer in enumerate(decoder.layers):
            keys, values, cross_keys_past, cross_values_past = past_key_values[4 * i : 4 * i + 4]
            own += [keys, values]
            attention = layer.cross_attention
            heads = int(attention.num_heads)
            cross.append(cross_keys(attention.k_proj, heads, cross_keys_past, rows))
            cross.append(cross_keys(attention.v_proj, heads, cross_values_past, rows))
        # the cross cache complete before the layers run: each reads its keys and values from it
        cache = EncoderDecoderCache(cache_of(own), empty_layers(len(own) // 2, cross[0][:, :, :0]))
        cache.cross_attention_cache = cache_of(cross)
        cache.is_updated = dict.fromkeys(range(len(own) // 2), True)
        out = decoder(
            input_ids=input_ids,
            encoder_hidden_states=encoder_hidden_states,
            encoder_attention_mask=encoder_attention_mask,
            past_key_values=cache,
            use_cache=True,
            return_dict=True,
        )
        grown = out.past_key_values
        presents = [
            t
            for own_layer, cross_layer in zip(
                grown.self_attention_cache.layers, grown.cross_attention_cache.layers, strict=True
            )
            for t in (own_layer.keys, own_layer.values, cross_layer.keys, cross_layer.values)
        ]
        return (head(out.last_hidden_state), out.last_hidden_state, *presents)


def upsampled(states: torch.Tensor, durations: torch.Tensor, frames: Any = None) -> torch.Tensor:
    """transformers' ``_hard_upsample`` (each row's positions repeated by their durations, rows
    right-padded with zeros to the longest) as a gather: frame ``f`` of a row reads the position
    ``#{i : ends[i] <= f}``. ``frames``: the output's length where the caller knows it (else the longest
    row's total: a data-dependent size)."""
    ends = durations.cumsum(dim=1)
    totals = ends[:, -1]
    count = totals.max().item() if frames is None else frames
    positions = torch.arange(count, device=states.device)
    index = (ends.unsqueeze(1) <= positions[None, :, None]).sum(-1).clamp(max=states.shape[1] - 1)
    picked = states.gather(1, index.unsqueeze(-1).expand(-1, -1, states.shape[2]))
    return torch.where((positions[None, :] < totals[:, None]).unsqueeze(-1), picked, 0.0)


def _lengths_mask(like: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """``_compute_new_attention_mask``: ones of ``like``'s dtype on each row's first ``lengths``."""
    positions = torch.arange(like.shape[1], device=like.device)
    return (positions[None, :] < lengths[:, None]).to(like.dtype)


@contextmanager
def eager_attention(config: Any) -> Iterator[None]:
    """While active, ``config``'s attention is transformers' eager one: sdpa's tests whether the queries
    are more than one (its causal flag) first, a guard on the unit frames' data-dependent count; the
    text-to-unit decoder's attention is bidirectional, the same softmax either way."""
    kept = config._attn_implementation
    config._attn_implementation = "eager"
    try:
        yield
    finally:
        config._attn_implementation = kept


class UnitModel(torch.nn.Module):
    """v2's text-to-unit model (``SeamlessM4Tv2TextToUnitForConditionalGeneration``'s forward) with its
    two hard upsamplings as gathers: to the characters (``char_input_ids``' length), then by the
    predicted durations."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        attention_mask: torch.Tensor,
        char_input_ids: torch.Tensor,
        char_count_per_id: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        from transformers.masking_utils import create_bidirectional_mask

        t2u: Any = self.model.t2u_model
        states = t2u.model.encoder(
            inputs_embeds=inputs_embeds, attention_mask=attention_mask
        ).last_hidden_state
        decoder = t2u.model.decoder
        char_mask = _lengths_mask(char_input_ids, char_count_per_id.sum(1))
        chars = upsampled(states, char_count_per_id, char_input_ids.shape[1])
        positions = decoder.pos_emb_alpha_char * decoder.embed_char_positions(inputs_embeds=chars)
        chars = decoder.embed_char(char_input_ids) * decoder.embed_scale + positions + chars
        log_durations = decoder.duration_predictor(chars, padding_mask=char_mask)
        durations = torch.clamp(torch.round(torch.expm1(log_durations)).long(), min=1)
        durations = durations.masked_fill(~char_mask.bool(), 0)
        hidden = upsampled(chars, durations)
        hidden = hidden + decoder.pos_emb_alpha * decoder.embed_positions(inputs_embeds=hidden)
        padding_mask = _lengths_mask(hidden, durations.sum(1))
        with eager_attention(decoder.config):
            mask = create_bidirectional_mask(
                config=decoder.config, inputs_embeds=hidden, attention_mask=padding_mask
            )
            for layer in decoder.layers:
                hidden = layer(hidden, attention_mask=mask, padding_mask=padding_mask)
        logits: torch.Tensor = t2u.lm_head(decoder.layer_norm(hidden))
        return logits, padding_mask


class Vocoder(torch.nn.Module):
    """The unit HiFi-GAN's forward (``SeamlessM4TCodeHifiGan``'s, v2's alike), its per-row repeat by the
    predicted durations a gather (``upsampled``) and its lengths a vector at every batch size."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, input_ids: torch.Tensor, speaker_id: torch.Tensor, lang_id: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        vocoder: Any = self.model.vocoder
        units = vocoder.unit_embedding(input_ids)  # b x units x width
        log_durations = vocoder.dur_predictor(units)
        durations = torch.clamp(torch.round(torch.expm1(log_durations)).long(), min=1)
        frames = upsampled(units, durations)
        count = frames.shape[1]
        speaker = vocoder.speaker_embedding(speaker_id).expand(-1, count, -1)
        language = vocoder.language_embedding(lang_id).expand(-1, count, -1)
        waveform: torch.Tensor = vocoder.hifi_gan(
            torch.cat([language, frames, speaker], dim=-1).transpose(1, 2)
        )
        # _get_dur_output_lengths without its squeeze (a batch of one's scalar)
        kept = (input_ids != vocoder.pad_token_id).sum(1).clamp(0, durations.shape[1] - 1)
        summed = durations.cumsum(dim=1).gather(1, kept.unsqueeze(1))[:, 0]
        lengths: torch.Tensor = vocoder._get_output_hifigan_lengths(summed)
        return waveform, lengths


def generation_maps(model: Any) -> None:
    """An InputError where the generation config lacks the maps ``generate`` reads (the languages' ids;
    v2's subwords and characters)."""
    needed = LANGUAGE_MAPS + (CHARACTER_MAPS if is_v2(model) else ())
    missing = [k for k in needed if not isinstance(getattr(model.generation_config, k, None), dict)]
    if missing:
        raise InputError(
            f"{type(model).__name__}'s generation config has no {', '.join(missing)} (its "
            "generation_config.json, which maps the target language to its token ids): its generate "
            "cannot run without it, nor the package's loop"
        )


def _step_graph(model: torch.nn.Module, unit: bool, g: torch.Generator) -> GraphSpec:
    decoder, _ = _decoder(model, unit)
    layers = len(decoder.layers)
    attention = decoder.layers[0].self_attn
    heads, size = int(attention.num_heads), int(attention.head_dim)
    width, vocab = int(decoder.embed_tokens.embedding_dim), int(decoder.embed_tokens.num_embeddings)
    # the cross past's example is the first step's (0): its size then stays symbolic
    batch, source, target, past, cross_past = 2, 6, 3, 4, 0
    b = torch.export.Dim(BATCH, min=1, max=1024)
    e = torch.export.Dim(ENCODER_SEQUENCE, min=1, max=1 << 20)
    d = torch.export.Dim(DECODER_SEQUENCE, min=1, max=1 << 20)
    p = torch.export.Dim(PAST_DECODER, min=0, max=1 << 20)
    pe = torch.export.Dim(PAST_ENCODER, min=0, max=1 << 20)
    cache: list[torch.Tensor] = []
    for _ in range(layers):
        cache += [torch.randn(batch, heads, past, size, generator=g) for _ in range(2)]
        cache += [torch.randn(batch, heads, cross_past, size, generator=g) for _ in range(2)]
    args = (
        torch.randint(4, vocab, (batch, target), generator=g),
        torch.randn(batch, source, width, generator=g),
        torch.ones(batch, source, dtype=torch.int64),
        cache,
    )
    own, cross = {0: b, 2: p}, {0: b, 2: pe}
    return GraphSpec(
        DecoderStep(model, unit),
        tuple(pytree.tree_map(lambda t: t.to("meta"), args)),
        {
            "input_ids": {0: b, 1: d},
            "encoder_hidden_states": {0: b, 1: e},
            "encoder_attention_mask": {0: b, 1: e},
            "past_key_values": [own, own, cross, cross] * layers,
        },
        [*STEP_INPUTS, *seq2seq_cache_names(layers, "past_key_values")],
        ["logits", "last_hidden_state", *seq2seq_cache_names(layers, "present")],
    )


def stage_graphs(model: torch.nn.Module, config: Any) -> dict[str, GraphSpec]:
    """The files of the module docstring (v1's five, v2's four), at examples on the meta device."""
    g = torch.Generator().manual_seed(0)
    b = torch.export.Dim(BATCH, min=1, max=1024)
    e = torch.export.Dim(ENCODER_SEQUENCE, min=1, max=1 << 20)
    t = torch.export.Dim("t2u_sequence_length", min=1, max=1 << 20)
    batch, tokens, width = 2, 6, int(config.hidden_size)
    text = torch.randint(4, int(config.vocab_size), (batch, tokens), generator=g).to("meta")
    mask = torch.ones(batch, tokens, dtype=torch.int64).to("meta")
    embeds = torch.randn(batch, tokens, width, generator=g).to("meta")
    specs = {
        TEXT_ENCODER_FILE: GraphSpec(
            TextEncoder(model),
            (text, mask),
            {"input_ids": {0: b, 1: e}, "attention_mask": {0: b, 1: e}},
            ["input_ids", "attention_mask"],
            ["encoder_hidden_states"],
        ),
        TEXT_DECODER_FILE: _step_graph(model, False, g),
    }
    if is_v2(model):
        counts = torch.randint(1, 4, (batch, tokens), generator=g)
        chars = torch.randint(4, int(config.char_vocab_size), (batch, int(counts.sum(1).max())), generator=g)
        specs[T2U_FILE] = GraphSpec(
            UnitModel(model),
            (embeds, mask, chars.to("meta"), counts.to("meta")),
            {
                "inputs_embeds": {0: b, 1: t},
                "attention_mask": {0: b, 1: t},
                "char_input_ids": {0: b, 1: torch.export.Dim("char_sequence_length", min=1, max=1 << 20)},
                "char_count_per_id": {0: b, 1: t},
            },
            ["inputs_embeds", "attention_mask", "char_input_ids", "char_count_per_id"],
            ["logits", "padding_mask"],
        )
    else:
        specs[T2U_ENCODER_FILE] = GraphSpec(
            UnitEncoder(model),
            (embeds, mask),
            {"inputs_embeds": {0: b, 1: t}, "attention_mask": {0: b, 1: t}},
            ["inputs_embeds", "attention_mask"],
            ["encoder_hidden_states"],
        )
        specs[T2U_DECODER_FILE] = _step_graph(model, True, g)
    units = torch.randint(4, int(config.unit_hifi_gan_vocab_size), (batch, 5), generator=g)
    specs[VOCODER_FILE] = GraphSpec(
        Vocoder(model),
        (
            units.to("meta"),
            torch.zeros(batch, 1, dtype=torch.int64).to("meta"),
            torch.zeros_like(units[:, :1]).to("meta"),
        ),
        {
            "input_ids": {0: b, 1: torch.export.Dim("unit_length", min=1, max=1 << 20)},
            "speaker_id": {0: b},
            "lang_id": {0: b},
        },
        ["input_ids", "speaker_id", "lang_id"],
        ["waveform", "waveform_lengths"],
    )
    return specs


def _step_cache(decoder: Any, batch: int, past: Any) -> list[torch.Tensor]:
    """The step's cache inputs from transformers' ``EncoderDecoderCache`` (empty tensors while it holds
    nothing: the first step)."""
    attention = decoder.layers[0].self_attn
    layers, heads, size = len(decoder.layers), int(attention.num_heads), int(attention.head_dim)
    if past is None or past.get_seq_length() == 0:
        return [torch.zeros(batch, heads, 0, size) for _ in range(4 * layers)]
    own, cross = past.self_attention_cache.layers, past.cross_attention_cache.layers
    return [t for i in range(layers) for t in (own[i].keys, own[i].values, cross[i].keys, cross[i].values)]


def _grown_cache(presents: list[torch.Tensor]) -> Any:
    from transformers import EncoderDecoderCache

    own = [t for i, t in enumerate(presents) if i % 4 < 2]
    cross = [t for i, t in enumerate(presents) if i % 4 >= 2]
    cache = EncoderDecoderCache(cache_of(own), cache_of(cross))
    cache.is_updated = dict.fromkeys(range(len(own) // 2), True)
    return cache


@contextmanager
def through_sessions(model: Any, sessions: dict[str, Any], run: Any, calls: Counter[str]) -> Iterator[None]:
    """Inside the block, each stage's forward that ``generate`` calls runs its file's session instead
    (``run(session, names, tensors)``), counted in ``calls``: the text encoder, the text model's step
    (its decoder step), the text decoder's pass over the translation, the text-to-unit encoder and step
    (v1) or model (v2) and the vocoder."""
    from transformers.modeling_outputs import (
        BaseModelOutput,
        BaseModelOutputWithPastAndCrossAttentions,
        Seq2SeqLMOutput,
    )

    def ran(name: str, names: list[str], tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        calls[name] += 1
        out: list[torch.Tensor] = run(sessions[name], names, tensors)
        return out

    def mask_of(mask: Any, like: torch.Tensor) -> torch.Tensor:
        return torch.ones(like.shape[:2], dtype=torch.int64) if mask is None else mask.long()

    def step(name: str, unit: bool, ids: torch.Tensor, states: torch.Tensor, mask: Any, past: Any) -> Any:
        decoder, _ = _decoder(model, unit)
        layers = len(decoder.layers)
        names = [*STEP_INPUTS, *seq2seq_cache_names(layers, "past_key_values")]
        feeds = [ids, states, mask_of(mask, states), *_step_cache(decoder, ids.shape[0], past)]
        logits, hidden, *presents = ran(name, names, feeds)
        return logits, hidden, _grown_cache(presents)

    def encoder(name: str, key: str) -> Any:
        def forward(attention_mask: Any = None, **kwargs: Any) -> Any:
            given = kwargs[key]
            (states,) = ran(name, [key, "attention_mask"], [given, mask_of(attention_mask, given)])
            # generate reads the states (its t2u input: encoder_hidden_states[-1]), the same tensor
            return BaseModelOutput(last_hidden_state=states, hidden_states=(states,))

        return forward

    def lm_step(name: str, unit: bool) -> Any:
        def forward(
            decoder_input_ids: Any = None,
            encoder_outputs: Any = None,
            attention_mask: Any = None,
            past_key_values: Any = None,
            **kwargs: Any,
        ) -> Any:
            logits, _, cache = step(
                name, unit, decoder_input_ids, encoder_outputs[0], attention_mask, past_key_values
            )
            return Seq2SeqLMOutput(logits=logits, past_key_values=cache)

        return forward

    def text_pass(
        input_ids: Any = None,
        encoder_hidden_states: Any = None,
        encoder_attention_mask: Any = None,
        **kwargs: Any,
    ) -> Any:
        _, hidden, _ = step(
            TEXT_DECODER_FILE, False, input_ids, encoder_hidden_states, encoder_attention_mask, None
        )
        return BaseModelOutputWithPastAndCrossAttentions(last_hidden_state=hidden)

    def unit_model(
        inputs_embeds: Any = None,
        attention_mask: Any = None,
        char_input_ids: Any = None,
        char_count_per_id: Any = None,
        **kwargs: Any,
    ) -> Any:
        from transformers.models.seamless_m4t_v2.modeling_seamless_m4t_v2 import SeamlessM4Tv2TextToUnitOutput

        names = ["inputs_embeds", "attention_mask", "char_input_ids", "char_count_per_id"]
        feeds = [inputs_embeds, mask_of(attention_mask, inputs_embeds), char_input_ids, char_count_per_id]
        logits, padding = ran(T2U_FILE, names, feeds)
        return SeamlessM4Tv2TextToUnitOutput(last_hidden_state=logits, padding_mask=padding)

    def vocoder(input_ids: Any, lang_id: Any, **kwargs: Any) -> Any:
        speaker = kwargs["speaker_id" if is_v2(model) else "spkr_id"]  # v1 names it spkr_id
        waveform, lengths = ran(
            VOCODER_FILE, ["input_ids", "speaker_id", "lang_id"], [input_ids, speaker, lang_id]
        )
        return waveform, lengths.squeeze()  # transformers' squeeze: a batch of one's length a scalar

    swaps: list[tuple[Any, Any]] = [
        (model.text_encoder, encoder(TEXT_ENCODER_FILE, "input_ids")),
        (model, lm_step(TEXT_DECODER_FILE, False)),
        (model.text_decoder, text_pass),
        (model.vocoder, vocoder),
    ]
    if is_v2(model):
        swaps.append((model.t2u_model, unit_model))
    else:
        swaps.append((model.t2u_model.model.encoder, encoder(T2U_ENCODER_FILE, "inputs_embeds")))
        swaps.append((model.t2u_model, lm_step(T2U_DECODER_FILE, True)))
    for module, forward in swaps:
        module.forward = forward
    try:
        yield
    finally:
        for module, _ in swaps:
            del module.forward


def target_language(model: Any) -> str:
    """The check's ``tgt_lang``: the first language of the text decoder's map that the unit model and the
    vocoder have too."""
    generation = model.generation_config
    common = [
        lang
        for lang in generation.text_decoder_lang_to_code_id
        if lang in generation.t2u_lang_code_to_id and lang in generation.vocoder_lang_code_to_id
    ]
    if not common:
        raise InputError(f"{type(model).__name__}'s generation config has no language all three stages map")
    return str(common[0])


CHECKED = ((2, 7, 0), (1, 5, 1))
"""(batch, text tokens, speaker) of the verification's generations: a padded batch of two (its second row
shorter), and one row (transformers' batch of one: its own repeat and its scalar lengths)."""
TEXT_TOKENS, UNIT_TOKENS = 6, 12
"""The generated text tokens at most, and v1's unit tokens."""


def check_inputs(model: Any, batch: int, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    vocab = int(model.config.vocab_size)
    g = torch.Generator().manual_seed(batch * 100 + tokens)
    ids = torch.randint(4, vocab, (batch, tokens), generator=g)
    mask = torch.ones_like(ids)
    if batch > 1:
        mask[1, tokens // 2 + 1 :] = 0
        ids[1, tokens // 2 + 1 :] = int(model.config.pad_token_id)
    return ids, mask


def check_package(
    sessions: dict[str, Any], model: Any, specs: dict[str, GraphSpec], run: Any, tolerance: Any
) -> list[VerificationInfo]:
    """transformers' ``generate`` (greedy) with every stage's forward running its session
    (``through_sessions``) against plain ``generate``, at each of ``CHECKED``: the text and unit tokens
    equal, the waveform and its lengths; a stage whose session never ran fails."""
    generation_maps(model)
    language = target_language(model)
    speaker_key = "speaker_id" if is_v2(model) else "spkr_id"
    infos: list[VerificationInfo] = []
    calls: Counter[str] = Counter()
    for batch, tokens, speaker in CHECKED:
        ids, mask = check_inputs(model, batch, tokens)
        kwargs: dict[str, Any] = {
            "attention_mask": mask,
            "tgt_lang": language,
            speaker_key: speaker,
            "do_sample": False,
            "return_intermediate_token_ids": True,
            "text_max_new_tokens": TEXT_TOKENS,
        }
        if not is_v2(model):
            kwargs["speech_max_new_tokens"] = UNIT_TOKENS
        with torch.no_grad():
            want = model.generate(ids, **kwargs)
            with through_sessions(model, sessions, run, calls):
                got = model.generate(ids, **kwargs)
        at = f"{batch}x{tokens}, tgt_lang {language}"
        infos.append(compare(f"text tokens ({at})", want.sequences, got.sequences))
        infos.append(compare(f"unit tokens ({at})", want.unit_sequences, got.unit_sequences))
        infos.append(compare(f"waveform_lengths ({at})", want.waveform_lengths, got.waveform_lengths))
        e, a = want.waveform, got.waveform
        infos.append(compare(f"waveform ({at})", e, a, *(tolerance(e) if e.shape == a.shape else ())))
    for name in specs:
        if not calls[name]:
            infos.append(compare(f"{name}: onnxruntime runs", torch.tensor(1), torch.tensor(0)))
    return infos
