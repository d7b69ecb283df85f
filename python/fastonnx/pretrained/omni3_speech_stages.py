"""text-to-audio of Qwen3OmniMoeForConditionalGeneration: transformers' ``generate`` for a text prompt as four
graphs, one a stage's forward, the loops the runtime's.

Files (``b`` the batch, ``G`` the talker's ``num_code_groups``, ``Q`` code2wav's ``num_quantizers``, equal):

- ``thinker_model.onnx``: one step of the thinker's MoE text decoder with its cache. ``input_ids`` (``b`` x
  ``sequence_length``), ``attention_mask`` (``b`` x ``total_sequence_length``: the past's positions then the
  new ones), ``position_ids`` (3 x ``b`` x ``sequence_length``, a text's three rows equal) and
  ``past_key_values.%d.key`` / ``.value`` (0 positions on the first step) to ``logits``, ``inputs_embeds``
  (the token embeddings: the hidden states 0), ``accepted_hidden_states`` (the hidden states
  ``talker_config.accept_hidden_layer``) and ``present.%d.key`` / ``.value``.
- ``talker_model.onnx``: one step of the talker (MoE) with its cache. ``thinker_embeds`` (``b`` x
  ``sequence_length`` x the thinker's width: thinker token embeddings, through the talker's
  ``text_projection`` in the graph), ``codes`` (``b`` x ``sequence_length`` x ``G``: a position's codec ids,
  group 0 through the talker's codec embedding, group ``g`` through the code predictor's embedding ``g - 1``,
  -1 where none is added), ``attention_mask``, ``position_ids`` and the cache as above to ``logits`` (group 0),
  ``hidden_states`` (the last layer's, normed) and ``present.*``.
- ``code_predictor_model.onnx``: one step of the code predictor with its cache (no mask: its rows are never
  padded). ``input_ids`` (``b`` x ``sequence_length``, -1 where none), ``inputs_embeds`` (``b`` x
  ``sequence_length`` x its width, added to the ids' embeddings), ``generation_step`` (an int64 scalar ``k``:
  ids embed through the talker's codec embedding at 0, through the predictor's embedding ``k - 1`` later;
  the logits are its head ``k``'s, group ``k + 1``'s codes) and the cache to ``logits``, ``inputs_embeds``
  (the step's embeddings) and ``present.*``.
- ``code2wav_model.onnx``: ``codes`` (``b`` x ``Q`` x ``frames``) to ``waveform`` (``b`` x 1 x samples, in
  [-1, 1]).

The loop (``generate(input_ids, attention_mask=..., speaker=S, thinker_do_sample=False,
talker_do_sample=False)``, a text prompt only, in the chat layout: ``<|im_start|>user ...`` turns ending
``<|im_start|>assistant X``; ``on_sessions`` runs transformers' own loop with each stage's forward on its
session and the talker's inputs built as below, which is how the package is verified):

1. Thinker. Positions ``cumsum(attention_mask) - 1`` (1 where the mask is 0), three equal rows, the new
   positions' of the grown mask each step. First step the whole prompt, then the last token, the mask grown by
   a 1; greedy over the last logits until the thinker's eos or ``thinker_max_new_tokens``. ``E`` (``b`` x
   ``T`` x width) is the steps' ``inputs_embeds`` concatenated (prompt and generated tokens but the last).
2. Talker prefill. User positions: those whose previous ``im_start_token_id`` is followed by
   ``user_token_id`` and whose mask is 1, right-aligned over ``u`` (the most any row has), the rest masked.
   ``a``: the last ``im_start_token_id, assistant_token_id`` pair of row 0; ``A = E[:, a:]``. The first step's
   ``thinker_embeds`` are [``E`` at the user positions, ``A[:, :3]``, 4 x ``P``, ``B``, ``A[:, 3:4]``] (``P``,
   ``B``, ``Z``: the thinker embeddings of ``tts_pad_token_id``, ``tts_bos_token_id``, ``tts_eos_token_id``:
   ``inputs_embeds`` of a thinker step on them), ``codes`` -1 but group 0 at the last six positions:
   ``codec_nothink_id, codec_think_bos_id, codec_think_eos_id, speaker_id[S], codec_pad_id, codec_bos_id``;
   the mask the user positions' then 9 ones.
3. Each talker step: its last code ``c0`` greedy after the repetition penalty (``talker_repetition_penalty``,
   over the codes so far) with ids ``vocab - 1024`` up suppressed but ``codec_eos_token_id``; the code
   predictor then runs ``G - 1`` steps: the first on ``input_ids [-1, c0]``, ``inputs_embeds`` [the talker's
   last ``hidden_states``, 0], ``generation_step`` 0; step ``k`` on its last code, ``generation_step`` ``k``;
   each greedy, giving ``c1 .. c(G-1)``. The next talker step reads ``codes`` [c0, c1, ...] and
   ``thinker_embeds`` the ``j``-th (from 0) of the trailing list ``A[:, 4:]`` then ``Z``, ``P`` once it runs
   out; a row whose thinker gave its eos as its ``e``-th generated token has ``Z`` at ``e`` and ``P`` after.
   Until ``codec_eos_token_id`` or ``talker_max_new_tokens``; a step's codes are the [c0, c1, ...] the
   next step reads (the last step's residuals too), a row's those before its eos.
4. code2wav over the codes (``b`` x ``G`` x frames, 0 past a row's end), in chunks of 300 frames with 25
   frames of left context whose ``25 * total_upsample`` samples are dropped; a row's waveform cut at its
   codes' samples less the chunks' lost tails.

Sampling (the checkpoints' talker: top-k 50, temperature 0.9; the code predictor top-k 50, top-p 0.8) is the
runtime's choice over the same logits; the check runs greedy.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import torch

from fastonnx.diagnostics.verdicts import VerificationInfo, compare
from fastonnx.errors import InputError
from fastonnx.pretrained.graph_spec import BATCH, SEQUENCE, TOTAL, GraphSpec
from fastonnx.pretrained.loop_caches import cache_names, cached_step_spec, decoder_sizes
from fastonnx.pretrained.loop_caches import present as _present
from fastonnx.pretrained.omni_speech_stages import NO_CODE, _refuse_media, _swapped
from fastonnx.pretrained.task_inputs import cache_of

CLASSES = frozenset({"Qwen3OmniMoeForConditionalGeneration"})
"""The classes exported as their stages' graphs."""

THINKER_FILE, TALKER_FILE, PREDICTOR_FILE, CODE2WAV_FILE = (
    "thinker_model.onnx",
    "talker_model.onnx",
    "code_predictor_model.onnx",
    "code2wav_model.onnx",
)
THINKER_INPUTS = ["input_ids", "attention_mask", "position_ids"]
TALKER_INPUTS = ["thinker_embeds", "codes", "attention_mask", "position_ids"]
PREDICTOR_INPUTS = ["input_ids", "inputs_embeds", "generation_step"]


def own_layout(model: torch.nn.Module) -> bool:
    return type(model).__name__ in CLASSES


class ThinkerStep(torch.nn.Module):
    """The thinker's text decoder and head: logits, the embeddings, the accepted layer's states, the cache."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past_key_values: list[torch.Tensor],
    ) -> tuple[torch.Tensor, ...]:
        model: Any = self.model
        decoder = model.thinker.model.language_model
        embeds = decoder.embed_tokens(input_ids)
        out = decoder(
            inputs_embeds=embeds,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache_of(past_key_values),
            use_cache=True,
            output_hidden_states=True,
            return_dict=True,
        )
        accepted = out.hidden_states[model.config.talker_config.accept_hidden_layer]
        logits = model.thinker.lm_head(out.last_hidden_state)
        return (logits, embeds, accepted, *_present(out.past_key_values))


def _residual_tables(model: Any) -> torch.Tensor:
    """The code predictor's embeddings, stacked: (G - 1) x its vocabulary x its width."""
    return torch.stack([e.weight for e in model.talker.code_predictor.model.codec_embedding])


class TalkerStep(torch.nn.Module):
    """The talker on the projected thinker embeddings plus the codec embeddings of each group's code."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        thinker_embeds: torch.Tensor,
        codes: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past_key_values: list[torch.Tensor],
    ) -> tuple[torch.Tensor, ...]:
        talker: Any = self.model.talker
        first = talker.get_input_embeddings()(codes[..., 0].clamp(min=0))
        tables = _residual_tables(self.model)
        groups = torch.arange(tables.shape[0], device=codes.device)
        rest = tables[groups, codes[..., 1:].clamp(min=0, max=tables.shape[1] - 1)]
        codec = torch.cat([first.unsqueeze(2), rest], dim=2)  # b x s x G x width
        codec = torch.where((codes != NO_CODE).unsqueeze(-1), codec, 0.0).sum(2)
        embeds = codec + talker.text_projection(thinker_embeds)
        out = talker.model(
            inputs_embeds=embeds,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache_of(past_key_values),
            use_cache=True,
            output_hidden_states=True,
            return_dict=True,
        )
        states = out.hidden_states[-1]
        return (talker.codec_head(out.last_hidden_state), states, *_present(out.past_key_values))


class PredictorStep(torch.nn.Module):
    """The code predictor: step ``k``'s ids through its table, its head ``k``."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        input_ids: torch.Tensor,
        inputs_embeds: torch.Tensor,
        generation_step: torch.Tensor,
        past_key_values: list[torch.Tensor],
    ) -> tuple[torch.Tensor, ...]:
        model: Any = self.model
        predictor = model.talker.code_predictor
        tables = _residual_tables(model)
        step = generation_step.reshape(1)
        table = tables.index_select(0, (step - 1).clamp(min=0)).squeeze(0)
        ids = input_ids.clamp(min=0)
        residual = torch.nn.functional.embedding(ids.clamp(max=tables.shape[1] - 1), table)
        first = model.talker.get_input_embeddings()(ids)
        codec = torch.where(step == 0, first, residual)
        embeds = inputs_embeds + torch.where((input_ids != NO_CODE).unsqueeze(-1), codec, 0.0)
        past = past_key_values[0].shape[2]
        positions = (torch.arange(input_ids.shape[1]) + past).unsqueeze(0).expand(input_ids.shape[0], -1)
        out = predictor.model(
            inputs_embeds=embeds,
            position_ids=positions,
            past_key_values=cache_of(past_key_values),
            use_cache=True,
            return_dict=True,
        )
        heads = torch.stack([h.weight for h in predictor.lm_head]).index_select(0, step).squeeze(0)
        logits = out.last_hidden_state @ heads.T
        return (logits, embeds, *_present(out.past_key_values))


def _causal_padding(conv: Any, hidden_state: torch.Tensor) -> Any:
    """A causal convolution's right padding to whole strides, in integers: transformers' float ``ceil``
    of the frames leaves guards on them torch.export cannot prove (each convolution's ``ceil`` nested in the
    next), which fail the dynamic capture. Its padding is ``kernel - stride``, so the frames' overshoot
    ``(length - stride) / stride`` rounds up by ``-length mod stride``."""
    return (-hidden_state.shape[-1]) % conv.stride


class Code2Wav(torch.nn.Module):
    """code2wav, its causal convolutions' padding computed in integers."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        model: Any = self.model
        convs = [m for m in model.code2wav.modules() if hasattr(m, "_get_extra_padding_for_conv1d")]
        with ExitStack() as stack:
            for conv in convs:
                padding = functools.partial(_causal_padding, conv)
                stack.enter_context(_swapped(conv, "_get_extra_padding_for_conv1d", padding))
            out: torch.Tensor = model.code2wav(codes)
        return out


def refuse_unsupported(model: Any) -> None:
    if not getattr(model, "has_talker", False):
        raise InputError(
            f"{type(model).__name__}: its config has enable_audio_output false (no talker nor code2wav): "
            "it generates no audio"
        )


def stage_graphs(model: torch.nn.Module, config: Any) -> dict[str, GraphSpec]:
    """The four files' graphs, at examples on the meta device."""
    refuse_unsupported(model)
    g = torch.Generator().manual_seed(0)
    batch, tokens, past = 2, 3, 4
    b = torch.export.Dim(BATCH, min=1, max=1024)
    s = torch.export.Dim(SEQUENCE, min=1, max=1 << 20)
    total = torch.export.Dim(TOTAL, min=1, max=1 << 21)
    text = config.thinker_config.text_config
    talker_config = config.talker_config
    positions = torch.arange(past, past + tokens).expand(3, batch, tokens)
    mask = torch.ones(batch, past + tokens, dtype=torch.int64)
    step_dims = {"attention_mask": {0: b, 1: total}, "position_ids": {1: b, 2: s}}
    thinker = cached_step_spec(
        ThinkerStep(model),
        text,
        [torch.randint(0, int(text.vocab_size), (batch, tokens), generator=g), mask, positions],
        {"input_ids": {0: b, 1: s}, **step_dims},
        b,
    )
    thinker.output_names = [
        "logits",
        "inputs_embeds",
        "accepted_hidden_states",
        *cache_names(decoder_sizes(text)[0], "present"),
    ]
    groups = int(talker_config.num_code_groups)
    predictor_config = talker_config.code_predictor_config
    codes = torch.randint(0, int(predictor_config.vocab_size), (batch, tokens, groups), generator=g)
    codes[0, 0] = NO_CODE
    talker = cached_step_spec(
        TalkerStep(model),
        talker_config.text_config,
        [torch.randn(batch, tokens, int(text.hidden_size), generator=g), codes, mask, positions],
        {"thinker_embeds": {0: b, 1: s}, "codes": {0: b, 1: s}, **step_dims},
        b,
    )
    talker_layers = decoder_sizes(talker_config.text_config)[0]
    talker.output_names = ["logits", "hidden_states", *cache_names(talker_layers, "present")]
    width = int(predictor_config.hidden_size)
    predictor = cached_step_spec(
        PredictorStep(model),
        predictor_config,
        [
            torch.randint(0, int(predictor_config.vocab_size), (batch, tokens), generator=g),
            torch.randn(batch, tokens, width, generator=g),
            torch.tensor(1),
        ],
        {"input_ids": {0: b, 1: s}, "inputs_embeds": {0: b, 1: s}, "generation_step": {}},
        b,
    )
    predictor_layers = decoder_sizes(predictor_config)[0]
    predictor.output_names = ["logits", "inputs_embeds", *cache_names(predictor_layers, "present")]
    wav_config = config.code2wav_config
    frames = torch.export.Dim("frames", min=2, max=1 << 16)
    code2wav = GraphSpec(
        Code2Wav(model),
        (
            torch.randint(
                0, int(wav_config.codebook_size), (batch, int(wav_config.num_quantizers), 5), generator=g
            ).to("meta"),
        ),
        {"codes": {0: b, 2: frames}},
        ["codes"],
        ["waveform"],
    )
    return {THINKER_FILE: thinker, TALKER_FILE: talker, PREDICTOR_FILE: predictor, CODE2WAV_FILE: code2wav}


def _past(cache: Any, batch: int, config: Any) -> list[torch.Tensor]:
    layers, heads, size = decoder_sizes(config)
    if cache is None or cache.get_seq_length() == 0:
        return [torch.zeros(batch, heads, 0, size) for _ in range(2 * layers)]
    return _present(cache)


def step_positions(attention_mask: torch.Tensor, new: int) -> torch.Tensor:
    """The last ``new`` positions of a grown mask: ``cumsum - 1`` (1 where 0), three equal rows."""
    positions = (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 1)
    return positions[:, -new:].expand(3, -1, -1)


def talker_prefill(
    config: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    sequences: torch.Tensor,
    embeds: torch.Tensor,
    special: torch.Tensor,
    speaker: int,
    eos: list[int],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Step 2 of the loop: the talker's first ``thinker_embeds``, ``codes`` and mask, and the trailing list
    (``special``: 1 x 3 x width, the embeddings of ``tts_pad``, ``tts_bos``, ``tts_eos``)."""
    pad, bos, end = special[:, 0:1], special[:, 1:2], special[:, 2:3]
    batch, length = input_ids.shape
    at = torch.arange(length).expand(batch, -1)
    starts = torch.where(input_ids == config.im_start_token_id, at, -1).cummax(-1).values.clamp(min=0)
    roles = input_ids.gather(1, (starts + 1).clamp(max=length - 1))
    user = (roles == config.user_token_id) & attention_mask.bool()
    counts = user.sum(-1)
    u = int(counts.max())
    order = torch.where(user, length + at, at).argsort(-1)[:, length - u :]
    user_embeds = embeds[:, :length].gather(1, order.unsqueeze(-1).expand(-1, -1, embeds.shape[-1]))
    user_mask = (torch.arange(u).unsqueeze(0) >= (u - counts).unsqueeze(1)).long()
    pairs = (input_ids[0, :-1] == config.im_start_token_id) & (input_ids[0, 1:] == config.assistant_token_id)
    if not bool(pairs.any()):
        raise InputError("the prompt has no '<|im_start|>assistant' turn, which the talker starts from")
    a = int(pairs.nonzero().flatten()[-1])
    reply = embeds[:, a:]
    thinker_embeds = torch.cat(
        [user_embeds, reply[:, :3], pad.expand(batch, 4, -1), bos.expand(batch, -1, -1), reply[:, 3:4]], 1
    )
    talker = config.talker_config
    codes = torch.full((batch, u + 9, int(talker.num_code_groups)), NO_CODE, dtype=torch.int64)
    special_codes = [
        talker.codec_nothink_id,
        talker.codec_think_bos_id,
        talker.codec_think_eos_id,
        speaker,
        talker.codec_pad_id,
        talker.codec_bos_id,
    ]
    codes[:, -6:, 0] = torch.tensor(special_codes)
    mask = torch.cat([user_mask, torch.ones(batch, 9, dtype=torch.long)], 1)
    trailing = torch.cat([reply[:, 4:], end.expand(batch, -1, -1)], 1)
    generated = sequences[:, length:]
    n = generated.shape[1]
    is_eos = torch.isin(generated, torch.tensor(eos))
    first = torch.where(is_eos, torch.arange(n), n).min(-1).values.view(-1, 1, 1)
    j = torch.arange(trailing.shape[1]).view(1, -1, 1)
    trailing = torch.where(j > first, pad, torch.where(j == first, end, trailing))
    return thinker_embeds, codes, mask, trailing


def _run_thinker(session: Any, run: Any, config: Any, ids: torch.Tensor, mask: torch.Tensor) -> list[Any]:
    names = [*THINKER_INPUTS, *cache_names(decoder_sizes(config)[0], "past_key_values")]
    past = _past(None, ids.shape[0], config)
    return list(run(session, names, [ids, mask, step_positions(mask, ids.shape[1]), *past]))


@contextmanager
def on_sessions(
    model: Any, sessions: dict[str, Any], run: Any, speaker: str, eos: list[int]
) -> Iterator[None]:
    """Inside the block, each stage's forward runs its session (``run(session, names, tensors)``) and the
    talker reads the inputs of steps 2 and 3, built from what the thinker's session gave."""
    config = model.config
    text = config.thinker_config.text_config
    talker_text = config.talker_config.text_config
    predictor_config = config.talker_config.code_predictor_config
    accept = int(config.talker_config.accept_hidden_layer)
    thinker_names = [*THINKER_INPUTS, *cache_names(decoder_sizes(text)[0], "past_key_values")]
    talker_names = [*TALKER_INPUTS, *cache_names(decoder_sizes(talker_text)[0], "past_key_values")]
    predictor_names = [*PREDICTOR_INPUTS, *cache_names(decoder_sizes(predictor_config)[0], "past_key_values")]
    state: dict[str, Any] = {"embeds": []}
    thinker, talker, predictor = model.thinker, model.talker, model.talker.code_predictor

    @functools.wraps(thinker.forward)
    def thinker_forward(
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        past_key_values: Any = None,
        **kwargs: Any,
    ) -> Any:
        from transformers.modeling_outputs import CausalLMOutputWithPast

        _refuse_media(kwargs)
        past = _past(past_key_values, input_ids.shape[0], text)
        positions = step_positions(attention_mask, input_ids.shape[1])
        logits, embeds, accepted, *present = run(
            sessions[THINKER_FILE], thinker_names, [input_ids, attention_mask, positions, *past]
        )
        state["embeds"].append(embeds)
        hidden: list[Any] = [None] * (decoder_sizes(text)[0] + 1)
        hidden[0], hidden[accept] = embeds, accepted
        return CausalLMOutputWithPast(
            logits=logits, past_key_values=cache_of(present), hidden_states=tuple(hidden)
        )

    original_generate = thinker.generate

    @functools.wraps(original_generate)
    def thinker_generate(input_ids: torch.Tensor, **kwargs: Any) -> Any:
        result = original_generate(input_ids=input_ids, **kwargs)
        mask = kwargs.get("attention_mask", torch.ones_like(input_ids))
        ids = torch.tensor(
            [[config.tts_pad_token_id, config.tts_bos_token_id, config.tts_eos_token_id]], dtype=torch.int64
        )
        special = _run_thinker(sessions[THINKER_FILE], run, text, ids, torch.ones_like(ids))[1]
        state["special"] = special
        embeds = torch.cat(state["embeds"], 1)
        speaker_id = int(config.talker_config.speaker_id[speaker.lower()])
        state["prefill"] = talker_prefill(
            config, input_ids, mask, result.sequences, embeds, special, speaker_id, eos
        )
        return result

    @functools.wraps(talker.forward)
    def talker_forward(
        attention_mask: torch.Tensor,
        past_key_values: Any = None,
        residual_codes: torch.Tensor | None = None,
        generation_step: int | None = None,
        **kwargs: Any,
    ) -> Any:
        from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
            Qwen3OmniMoeTalkerOutputWithPast,
        )

        batch = attention_mask.shape[0]
        past = _past(past_key_values, batch, talker_text)
        if past[0].shape[2] == 0:
            embeds, codes, mask, trailing = state["prefill"]
            if not torch.equal(mask, attention_mask.long()):
                raise InputError("the talker's first mask differs from the loop's step 2")
            step = -1
        else:
            if residual_codes is None or generation_step is None:
                raise InputError("the talker's later steps read the last step's codes")
            trailing = state["prefill"][3]
            step = generation_step
            pad = state["special"][:, :1].expand(batch, -1, -1)  # tts_pad's embedding
            embeds = trailing[:, step : step + 1] if step < trailing.shape[1] else pad
            codes = residual_codes.unsqueeze(1)
        positions = step_positions(attention_mask, codes.shape[1])
        logits, states, *present = run(
            sessions[TALKER_FILE], talker_names, [embeds, codes, attention_mask, positions, *past]
        )
        return Qwen3OmniMoeTalkerOutputWithPast(
            logits=logits,
            past_key_values=cache_of(present),
            # generate reads the last states at [0][-1] and the step's codes at [-1], as its forward returns them
            hidden_states=((states,), residual_codes),  # type: ignore[arg-type]
            generation_step=step + 1,
        )

    original_prepare = talker.prepare_inputs_for_generation

    @functools.wraps(original_prepare)
    def talker_prepare(input_ids: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        state["code"] = input_ids[:, -1:]  # the code predictor's first step reads it
        return original_prepare(input_ids, *args, **kwargs)

    @functools.wraps(predictor.forward)
    def predictor_forward(
        input_ids: torch.Tensor | None = None,
        past_key_values: Any = None,
        inputs_embeds: torch.Tensor | None = None,
        generation_steps: int | None = None,
        **kwargs: Any,
    ) -> Any:
        from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
            Qwen3OmniMoeTalkerCodePredictorOutputWithPast,
        )

        if inputs_embeds is not None and inputs_embeds.shape[1] > 1:
            hidden = inputs_embeds[:, :1]
            ids = torch.cat([torch.full_like(state["code"], NO_CODE), state["code"]], 1)
            embeds = torch.cat([hidden, torch.zeros_like(hidden)], 1)
            step = 0
        else:
            if input_ids is None or generation_steps is None:
                raise InputError("the code predictor's later steps read its last code")
            ids, step = input_ids, generation_steps
            embeds = torch.zeros(*ids.shape, int(predictor_config.hidden_size))
        past = _past(past_key_values, ids.shape[0], predictor_config)
        logits, step_embeds, *present = run(
            sessions[PREDICTOR_FILE], predictor_names, [ids, embeds, torch.tensor(step), *past]
        )
        return Qwen3OmniMoeTalkerCodePredictorOutputWithPast(
            logits=logits,
            past_key_values=cache_of(present),
            hidden_states=(step_embeds,),
            generation_steps=step + 1,
        )

    code2wav = model.code2wav

    @functools.wraps(code2wav.forward)
    def code2wav_forward(codes: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        del kwargs
        (wave,) = run(sessions[CODE2WAV_FILE], ["codes"], [codes])
        return wave  # type: ignore[no-any-return]

    with ExitStack() as stack:
        for module, name, value in (
            (thinker, "forward", thinker_forward),
            (thinker, "generate", thinker_generate),
            (talker, "forward", talker_forward),
            (talker, "prepare_inputs_for_generation", talker_prepare),
            (predictor, "forward", predictor_forward),
            (code2wav, "forward", code2wav_forward),
        ):
            stack.enter_context(_swapped(module, name, value))
        yield


THINKER_TOKENS, TALKER_TOKENS = 4, 5
"""The check's text tokens and codec steps."""


def check_inputs(model: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Two chat prompts (a user turn, then the assistant's start), the second left-padded by 2."""
    config = model.config
    vocab = min(int(config.thinker_config.text_config.vocab_size), 64)
    words = torch.randint(0, vocab, (2, 4), generator=torch.Generator().manual_seed(0))
    start, user, reply = config.im_start_token_id, config.user_token_id, config.assistant_token_id
    pad, end = int(config.tts_pad_token_id), config.im_end_token_id
    ids = torch.tensor(
        [
            [start, user, *words[0, :3].tolist(), end, start, reply, int(words[0, 3])],
            [pad, pad, start, user, int(words[1, 0]), end, start, reply, int(words[1, 3])],
        ]
    )
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    return ids, mask


def _eos(model: Any) -> list[int]:
    return [int(model.config.im_end_token_id)]


def generated(model: Any, ids: torch.Tensor, mask: torch.Tensor, speaker: str) -> dict[str, Any]:
    """``generate``'s text tokens, codes and waveforms, greedy."""
    seen: dict[str, list[torch.Tensor]] = {"codes": []}
    decode = model.code2wav.chunked_decode

    def chunked(codes: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        seen["codes"].append(codes.clone())
        return decode(codes, *args, **kwargs)

    with torch.no_grad(), _swapped(model.code2wav, "chunked_decode", chunked):
        text, waves = model.generate(
            ids,
            attention_mask=mask,
            speaker=speaker,
            thinker_max_new_tokens=THINKER_TOKENS,
            thinker_eos_token_id=_eos(model),
            thinker_do_sample=False,
            talker_max_new_tokens=TALKER_TOKENS,
            talker_do_sample=False,
        )
    return {"text": text, "waveform": waves if isinstance(waves, list) else [waves], **seen}


def check_package(
    sessions: dict[str, Any], model: Any, specs: dict[str, GraphSpec], run: Any, tolerance: Any
) -> list[VerificationInfo]:
    """transformers' ``generate`` with each stage's forward on its session against plain ``generate``
    (greedy): equal text tokens and codes, waveforms within ``tolerance``."""
    del specs
    speakers = model.config.talker_config.speaker_id or {}
    if not speakers:
        raise InputError(
            f"{type(model).__name__}: its talker_config names no speaker_id, which generate reads"
        )
    speaker = next(iter(speakers))
    ids, mask = check_inputs(model)
    want = generated(model, ids, mask, speaker)
    with on_sessions(model, sessions, run, speaker, _eos(model)):
        got = generated(model, ids, mask, speaker)
    infos = [compare("thinker tokens", want["text"], got["text"])]
    infos.append(compare("talker codes", want["codes"][0], got["codes"][0]))
    for row, (e, a) in enumerate(zip(want["waveform"], got["waveform"], strict=True)):
        same = e.shape == a.shape
        infos.append(compare(f"waveform (row {row})", e, a, *(tolerance(e) if same else ())))
    return infos
