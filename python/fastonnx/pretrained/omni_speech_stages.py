"""text-to-audio of Qwen2_5OmniForConditionalGeneration: transformers' ``generate`` for a text prompt as four
graphs, one a stage's forward, the loops the runtime's.

Files (``b`` the batch, ``L`` / ``H`` / ``D`` a decoder's layers, key-value heads and head size):

- ``thinker_model.onnx``: one step of the thinker's text decoder with its cache (the first step and the
  later ones alike). ``input_ids`` (``b`` x ``sequence_length``), ``attention_mask`` (``b`` x
  ``total_sequence_length``: the past's positions then the new ones), ``position_ids`` (3 x ``b`` x
  ``sequence_length``: the multimodal rotary positions; a text's three rows are equal) and
  ``past_key_values.%d.key`` / ``.value`` (``b`` x H x ``past_sequence_length`` x D, 0 positions on the
  first step) to ``logits``, ``inputs_embeds`` (the token embeddings: the thinker's hidden states 0),
  ``hidden_states`` (its last layer's, normed: the hidden states -1) and ``present.%d.key`` / ``.value``.
- ``talker_model.onnx``: one step of the talker with its cache. ``input_ids`` (``b`` x ``sequence_length``
  codec ids, -1 where none is added), ``thinker_embeds`` (``b`` x ``sequence_length`` x the thinker's
  width), ``attention_mask``, ``position_ids`` and the cache as above to ``logits`` (codec ids) and
  ``present.*``. A position's input is ``thinker_embeds`` plus, where ``input_ids`` is not -1, the codec
  embedding of ``input_ids``, through ``thinker_to_talker_proj``.
- ``dit_model.onnx``: one evaluation of token2wav's DiT flow model for one row (generate decodes a row at a
  time), with classifier-free guidance's two halves. ``hidden_states`` (1 x ``mel_frames`` x ``mel_dim``:
  the flow's state, noise at its start), ``quantized_code`` (1 x ``codes``: the talker's codes;
  ``mel_frames = repeats * codes``), ``reference_mel`` (1 x ``reference_frames`` x ``mel_dim``, at least
  the speaker encoder's widest kernel: the speaker's ``ref_mel``), ``speaker_embedding`` (1 x
  ``mel_frames`` x ``enc_emb_dim``: the speaker's ``cond`` repeated a frame) and ``time_step`` (a float
  scalar) to ``prediction`` (2 x ``mel_frames`` x ``mel_dim``: the conditioned row, then the
  unconditioned: no speaker, no reference, code 0).
- ``bigvgan_model.onnx``: the BigVGAN vocoder. ``mel_spectrogram`` (``b`` x ``mel_dim`` x frames) to
  ``waveform`` (``b`` x samples, clamped to [-1, 1]).

The loop (``generate(input_ids, attention_mask=..., speaker=S, thinker_do_sample=False,
talker_do_sample=False)``, a text prompt only: no audio, image nor video; ``on_sessions`` runs transformers'
own loop with each stage's forward replaced by its session, which is how the package is verified):

1. Thinker. Positions: ``cumsum(attention_mask) - 1`` (1 where the mask is 0), three equal rows;
   ``delta = max(position) + 1 - prompt length`` a row. First step the whole prompt, each later step the
   last token at ``past length + delta``, the mask grown by a 1. Greedy over the last position's logits
   (the generation config's processors), until its eos or ``thinker_max_new_tokens``; the step's
   ``inputs_embeds`` and ``hidden_states`` kept.
2. Talker, from the speaker's ``bos_token`` (the checkpoint's ``spk_dict.pt``: ``bos_token``, ``cond``,
   ``ref_mel`` a speaker). With ``E``/``S`` the thinker's embeddings/states of the prompt (step 1's first)
   and ``R_0``, ``R_1``... their ``S + E`` at the thinker's later steps (its generated tokens fed back,
   the last never): the first talker step reads
   ``thinker_embeds`` = [``S + E`` of the prompt, the embedding of ``bos_token``, ``R_0``], ``input_ids`` -1
   but the last two positions, ``tts_codec_pad_token_id`` then ``tts_codec_start_token_id``; its mask the
   prompt's then two 1s. Positions as step 1 over the prompt's mask, then ``delta`` less the row's padded
   positions. Each later step feeds its last code with the next of [``R_1``, ``R_2``..., the embedding of
   ``tts_text_end_token_id``, then that of ``tts_text_pad_token_id``] (the last one repeated once they run
   out); a row whose thinker gave its eos as its ``k``-th generated token (from 0; clamped to 1 to ``n -
   1``, ``n`` the tokens generated) has the end embedding at ``k - 1`` of that list and the pad from ``k``. Greedy after the generation's repetition penalty (``talker_repetition_penalty``, 1.05) and with
   ``tts_codec_start_token_id`` suppressed, until ``talker_eos_token_id`` (the pad and end codes) or
   ``talker_max_new_tokens``. A row's codes are those before its first eos.
3. token2wav, a row at a time over its codes: ``mel_frames = repeats * codes`` (at most the DiT's
   ``max_position_embeddings``); the state ``x`` drawn N(0, 1) (1 x ``mel_frames`` x ``mel_dim``: the
   runtime's draw, torch's ``randn`` in the check, seeded); ``t`` = ``linspace(0, 1, num_steps)`` then
   ``t + sway * (cos(pi / 2 * t) - 1 + t)`` (sway -1); ``f(t, x)`` = ``c + (c - u) * guidance`` (0.5) with
   ``c``, ``u`` the halves of ``dit_model(x, codes, ref_mel, cond repeated, t)``; over each interval
   ``[t0, t1]`` (``h = t1 - t0``) the 3/8 Runge-Kutta step: ``k1 = f(t0, x)``, ``k2 = f(t0 + h / 3, x + h *
   k1 / 3)``, ``k3 = f(t0 + 2h / 3, x + h * (k2 - k1 / 3))``, ``k4 = f(t1, x + h * (k1 - k2 + k3))``, ``x +=
   (k1 + 3 (k2 + k3) + k4) * h / 8``. The last ``x`` transposed (1 x ``mel_dim`` x frames) is
   ``bigvgan_model``'s ``mel_spectrogram``; the package carries the checkpoint's ``spk_dict.pt``.

Sampling (the checkpoints' talker samples: top-k 40, top-p 0.8, temperature 0.9) is the runtime's choice
over the same logits; the check runs greedy.
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
from fastonnx.pretrained.task_inputs import cache_of

CLASSES = frozenset({"Qwen2_5OmniForConditionalGeneration"})
"""The classes exported as their stages' graphs."""

THINKER_FILE, TALKER_FILE, DIT_FILE, VOCODER_FILE = (
    "thinker_model.onnx",
    "talker_model.onnx",
    "dit_model.onnx",
    "bigvgan_model.onnx",
)
NO_CODE = -1
"""``input_ids`` of the talker where no codec embedding is added."""

THINKER_INPUTS = ["input_ids", "attention_mask", "position_ids"]
TALKER_INPUTS = ["input_ids", "thinker_embeds", "attention_mask", "position_ids"]
DIT_INPUTS = ["hidden_states", "quantized_code", "reference_mel", "speaker_embedding", "time_step"]


def own_layout(model: torch.nn.Module) -> bool:
    return type(model).__name__ in CLASSES


class ThinkerStep(torch.nn.Module):
    """The thinker's text decoder and head: logits, the embeddings and the last states, the grown cache."""

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
        thinker: Any = self.model.thinker
        decoder = thinker.model.language_model
        embeds = decoder.embed_tokens(input_ids)
        out = decoder(
            inputs_embeds=embeds,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache_of(past_key_values),
            use_cache=True,
            return_dict=True,
        )
        states = out.last_hidden_state
        return (thinker.lm_head(states), embeds, states, *_present(out.past_key_values))


class TalkerStep(torch.nn.Module):
    """The talker on the thinker's embeddings plus the codec embeddings of ``input_ids`` (none at -1)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        input_ids: torch.Tensor,
        thinker_embeds: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past_key_values: list[torch.Tensor],
    ) -> tuple[torch.Tensor, ...]:
        talker: Any = self.model.talker
        codec = talker.get_input_embeddings()(input_ids.clamp(min=0))
        embeds = thinker_embeds + torch.where((input_ids != NO_CODE).unsqueeze(-1), codec, 0.0)
        out = talker.model(
            inputs_embeds=talker.thinker_to_talker_proj(embeds),
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache_of(past_key_values),
            use_cache=True,
            return_dict=True,
        )
        return (talker.codec_head(out.last_hidden_state).float(), *_present(out.past_key_values))


class DitStep(torch.nn.Module):
    """token2wav's DiT with classifier-free guidance's conditioned and unconditioned halves."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        hidden_states: torch.Tensor,
        quantized_code: torch.Tensor,
        reference_mel: torch.Tensor,
        speaker_embedding: torch.Tensor,
        time_step: torch.Tensor,
    ) -> torch.Tensor:
        model: Any = self.model
        dit = model.token2wav.code2wav_dit_model
        out: torch.Tensor = dit(
            hidden_states=hidden_states,
            condition_vector=reference_mel,
            speaker_embedding=speaker_embedding,
            quantized_code=quantized_code,
            time_step=time_step,
            apply_cfg=True,
        )
        return out


class Vocoder(torch.nn.Module):
    """BigVGAN's forward without its final squeeze: a row a waveform."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, mel_spectrogram: torch.Tensor) -> torch.Tensor:
        model: Any = self.model
        vocoder = model.token2wav.code2wav_bigvgan_model
        hidden = vocoder.conv_pre(vocoder.process_mel_spectrogram(mel_spectrogram))
        blocks = vocoder.num_residual_blocks
        for i in range(vocoder.num_upsample_layers):
            hidden = vocoder.ups[i][0](hidden)
            hidden = sum(vocoder.resblocks[i * blocks + j](hidden) for j in range(blocks)) / blocks
        out = vocoder.conv_post(vocoder.activation_post(hidden))
        return torch.clamp(out, min=-1.0, max=1.0).squeeze(1)


def refuse_unsupported(model: Any) -> None:
    if not getattr(model, "has_talker", False):
        raise InputError(
            f"{type(model).__name__}: its config has enable_audio_output false (no talker nor token2wav): "
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
    layers = decoder_sizes(text)[0]
    thinker.output_names = ["logits", "inputs_embeds", "hidden_states", *cache_names(layers, "present")]
    talker_config = config.talker_config
    talker = cached_step_spec(
        TalkerStep(model),
        talker_config,
        [
            torch.randint(0, int(talker_config.vocab_size), (batch, tokens), generator=g),
            torch.randn(batch, tokens, int(talker_config.embedding_size), generator=g),
            mask,
            positions,
        ],
        {"input_ids": {0: b, 1: s}, "thinker_embeds": {0: b, 1: s}, **step_dims},
        b,
    )
    talker.output_names = ["logits", *cache_names(decoder_sizes(talker_config)[0], "present")]
    dit_config = config.token2wav_config.dit_config
    mel, repeats = int(dit_config.mel_dim), int(dit_config.repeats)
    codes, reference = 5, 6
    c = torch.export.Dim("codes", min=1, max=int(dit_config.max_position_embeddings) // repeats)
    # the speaker encoder's widest convolution pads by reflection: at least its kernel's frames
    r = torch.export.Dim("reference_frames", min=max(dit_config.enc_kernel_sizes), max=1 << 20)
    dit = GraphSpec(
        DitStep(model),
        tuple(
            t.to("meta")
            for t in (
                torch.randn(1, codes * repeats, mel, generator=g),
                torch.randint(0, int(dit_config.num_embeds), (1, codes), generator=g),
                torch.randn(1, reference, mel, generator=g),
                torch.randn(1, codes * repeats, int(dit_config.enc_emb_dim), generator=g),
                torch.tensor(0.5),
            )
        ),
        {  # one row: generate decodes a row at a time (the speaker encoder takes its batch as an int)
            "hidden_states": {1: repeats * c},
            "quantized_code": {1: c},
            "reference_mel": {1: r},
            "speaker_embedding": {1: repeats * c},
            "time_step": {},
        },
        DIT_INPUTS,
        ["prediction"],
    )
    vocoder = GraphSpec(
        Vocoder(model),
        (torch.randn(batch, mel, 7, generator=g).to("meta"),),
        {"mel_spectrogram": {0: b, 2: torch.export.Dim("frames", min=1, max=1 << 20)}},
        ["mel_spectrogram"],
        ["waveform"],
    )
    return {THINKER_FILE: thinker, TALKER_FILE: talker, DIT_FILE: dit, VOCODER_FILE: vocoder}


def _past(cache: Any, batch: int, config: Any) -> list[torch.Tensor]:
    """A DynamicCache's keys and values, layer by layer; zeros of 0 positions for an empty one."""
    layers, heads, size = decoder_sizes(config)
    if cache is None or cache.get_seq_length() == 0:
        return [torch.zeros(batch, heads, 0, size) for _ in range(2 * layers)]
    return _present(cache)


def text_positions(attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A text prompt's rotary positions (3 equal rows) and each row's delta (step 1 of the loop)."""
    positions = (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 1)
    delta = positions.max(-1, keepdim=True).values + 1 - attention_mask.shape[1]
    return positions.expand(3, -1, -1), delta


def _refuse_media(kwargs: dict[str, Any]) -> None:
    media = [
        k for k in ("input_features", "pixel_values", "pixel_values_videos") if kwargs.get(k) is not None
    ]
    if media:
        raise InputError(f"the text-to-audio package reads a text prompt only; got {', '.join(media)}")


def thinker_on_session(model: Any, session: Any, run: Any) -> Any:
    """The thinker's forward as generate calls it, on ``thinker_model.onnx``."""
    thinker = model.thinker
    config = model.config.thinker_config.text_config
    names = [*THINKER_INPUTS, *cache_names(decoder_sizes(config)[0], "past_key_values")]

    @functools.wraps(thinker.forward)
    def forward(
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        past_key_values: Any = None,
        **kwargs: Any,
    ) -> Any:
        from transformers.modeling_outputs import CausalLMOutputWithPast

        _refuse_media(kwargs)
        if position_ids is None:
            raise InputError("the thinker's step takes its positions from generate: none given")
        positions = position_ids[1:] if position_ids.shape[0] == 4 else position_ids  # less the text row
        past = _past(past_key_values, input_ids.shape[0], config)
        logits, embeds, states, *present = run(
            session, names, [input_ids, attention_mask, positions.long(), *past]
        )
        hidden = (embeds, states) if kwargs.get("output_hidden_states") else None
        return CausalLMOutputWithPast(logits=logits, past_key_values=cache_of(present), hidden_states=hidden)

    return forward


def talker_on_session(model: Any, session: Any, run: Any) -> Any:
    """The talker's forward as generate calls it, on ``talker_model.onnx``: step 2's positions and inputs."""
    talker = model.talker
    config = model.config.talker_config
    names = [*TALKER_INPUTS, *cache_names(decoder_sizes(config)[0], "past_key_values")]
    deltas: list[torch.Tensor] = []

    @functools.wraps(talker.forward)
    def forward(
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values: Any = None,
        thinker_reply_part: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> Any:
        from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import (
            Qwen2_5OmniTalkerCausalLMOutputWithPast,
        )

        if attention_mask is None or thinker_reply_part is None:
            raise InputError("the talker's step needs the attention mask and the thinker's reply")
        _refuse_media(kwargs)
        batch = attention_mask.shape[0]
        past = _past(past_key_values, batch, config)
        length = past[0].shape[2]
        if length == 0:
            if inputs_embeds is None:
                raise InputError("the talker's first step reads the thinker's embeddings (inputs_embeds)")
            positions, delta = text_positions(attention_mask)
            deltas[:] = [delta - (1 - attention_mask).sum(-1, keepdim=True)]
            ids = torch.full(inputs_embeds.shape[:2], NO_CODE, dtype=torch.int64)
            ids[:, -1], ids[:, -2] = talker.codec_bos_token, talker.codec_pad_token
            embeds = inputs_embeds
        else:
            if input_ids is None:
                raise InputError("the talker's later steps read the last codec id")
            ids = input_ids
            positions = (torch.arange(ids.shape[1]) + length + deltas[0]).expand(3, -1, -1)
            embeds = thinker_reply_part[:, :1]
            if thinker_reply_part.shape[1] > 1:
                thinker_reply_part = thinker_reply_part[:, 1:]
        logits, *present = run(session, names, [ids, embeds, attention_mask, positions.long(), *past])
        return Qwen2_5OmniTalkerCausalLMOutputWithPast(
            logits=logits, past_key_values=cache_of(present), thinker_reply_part=thinker_reply_part
        )

    return forward


def dit_on_session(model: Any, session: Any, run: Any) -> Any:
    dit = model.token2wav.code2wav_dit_model

    @functools.wraps(dit.forward)
    def forward(
        hidden_states: torch.Tensor,
        condition_vector: torch.Tensor,
        speaker_embedding: torch.Tensor,
        quantized_code: torch.Tensor,
        time_step: torch.Tensor,
        drop_audio_conditioning: bool = False,
        drop_code: bool = False,
        apply_cfg: bool = True,
        **kwargs: Any,
    ) -> torch.Tensor:
        del drop_audio_conditioning, drop_code, kwargs  # read without guidance only
        if not apply_cfg:
            raise InputError("dit_model.onnx evaluates with classifier-free guidance (guidance_scale > 0)")
        tensors = [hidden_states, quantized_code, condition_vector, speaker_embedding, time_step.float()]
        (out,) = run(session, DIT_INPUTS, tensors)
        return out  # type: ignore[no-any-return]

    return forward


def vocoder_on_session(model: Any, session: Any, run: Any) -> Any:
    vocoder = model.token2wav.code2wav_bigvgan_model

    @functools.wraps(vocoder.forward)
    def forward(mel_spectrogram: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        del kwargs
        (wave,) = run(session, ["mel_spectrogram"], [mel_spectrogram])
        return wave.squeeze()  # type: ignore[no-any-return]

    return forward


@contextmanager
def _swapped(module: Any, name: str, value: Any) -> Iterator[None]:
    setattr(module, name, value)
    try:
        yield
    finally:
        delattr(module, name)


@contextmanager
def on_sessions(model: Any, sessions: dict[str, Any], run: Any) -> Iterator[None]:
    """Inside the block, each stage's forward runs its session (``run(session, names, tensors)``)."""
    token2wav = model.token2wav
    with ExitStack() as stack:
        for module, make, file in (
            (model.thinker, thinker_on_session, THINKER_FILE),
            (model.talker, talker_on_session, TALKER_FILE),
            (token2wav.code2wav_dit_model, dit_on_session, DIT_FILE),
            (token2wav.code2wav_bigvgan_model, vocoder_on_session, VOCODER_FILE),
        ):
            stack.enter_context(_swapped(module, "forward", make(model, sessions[file], run)))
        yield


@contextmanager
def recorded(model: Any, seen: dict[str, list[torch.Tensor]]) -> Iterator[None]:
    """Inside the block, each row's codes and mel spectrogram kept in ``seen``."""
    token2wav = model.token2wav
    dit = token2wav.code2wav_dit_model
    forward, sample = token2wav.forward, dit.sample

    def codes(code: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        seen["codes"].append(code.clone())
        return forward(code, *args, **kwargs)

    def mel(*args: Any, **kwargs: Any) -> Any:
        out = sample(*args, **kwargs)
        seen["mel"].append(out.clone())
        return out

    seen.update(codes=[], mel=[])
    with _swapped(token2wav, "forward", codes), _swapped(dit, "sample", mel):
        yield


THINKER_TOKENS, TALKER_TOKENS, ODE_STEPS, SEED = 4, 6, 3, 0
"""The check's text tokens, codec tokens, ODE time points and noise seed."""


def check_inputs(model: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Two prompts of 6 tokens, the second left-padded by 2 (as generate pads a batch)."""
    vocab = int(model.config.thinker_config.text_config.vocab_size)
    ids = torch.randint(0, min(vocab, 64), (2, 6), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    return ids, mask


def generated(model: Any, ids: torch.Tensor, mask: torch.Tensor, speaker: str) -> dict[str, Any]:
    """``generate``'s text tokens, codes, mel spectrograms and waveforms, greedy, the noise seeded."""
    talker = model.talker
    seen: dict[str, Any] = {}
    torch.manual_seed(SEED)
    with torch.no_grad(), recorded(model, seen):
        text, waves = model.generate(
            ids,
            attention_mask=mask,
            speaker=speaker,
            thinker_max_new_tokens=THINKER_TOKENS,
            thinker_do_sample=False,
            talker_max_new_tokens=TALKER_TOKENS,
            # at least two codes a row: transformers' token2wav fails on a row without one
            talker_min_new_tokens=2,
            talker_do_sample=False,
            talker_eos_token_id=[talker.codec_pad_token, talker.codec_eos_token],
            token2wav_num_steps=ODE_STEPS,
        )
    return {"text": text, "waveform": waves if isinstance(waves, list) else [waves], **seen}


def check_package(
    sessions: dict[str, Any], model: Any, specs: dict[str, GraphSpec], run: Any, tolerance: Any
) -> list[VerificationInfo]:
    """transformers' ``generate`` with each stage's forward on its session against plain ``generate``
    (greedy, the same noise): equal text tokens and codes, mel spectrograms and waveforms within
    ``tolerance``."""
    del specs
    if not model.speaker_map:
        raise InputError(
            f"{type(model).__name__}: the checkpoint has no spk_dict.pt (the speakers' bos_token, cond and "
            "ref_mel, which generate reads)"
        )
    speaker = next(iter(model.speaker_map))
    ids, mask = check_inputs(model)
    want = generated(model, ids, mask, speaker)
    with on_sessions(model, sessions, run):
        got = generated(model, ids, mask, speaker)
    infos = [compare("thinker tokens", want["text"], got["text"])]
    for row, (codes, e_mel, a_mel, e, a) in enumerate(
        zip(want["codes"], want["mel"], got["mel"], want["waveform"], got["waveform"], strict=True)
    ):
        infos.append(compare(f"talker codes (row {row})", codes, got["codes"][row]))
        for name, want_t, got_t in (("mel_spectrogram", e_mel, a_mel), ("waveform", e, a)):
            same = want_t.shape == got_t.shape
            infos.append(compare(f"{name} (row {row})", want_t, got_t, *(tolerance(want_t) if same else ())))
    return infos
