"""text-to-audio of GradiumPhononTTSForConditionalGeneration: transformers' ``generate`` (Pocket TTS's
latent loop) as three graphs, the loop itself the runtime's.

Gradium Phonon generates no tokens: each step of its backbone yields a hidden state, from which a flow head
samples one continuous audio latent (one frame, ``config.frame_rate`` a second) and an end-of-speech head
gives one logit. The waveform is the processor's audio tokenizer's decode of the latents: a separate model
(``PocketTTSAudioTokenizerModel``, Gradium's codec), whose weights the checkpoint does not hold
(transformers leaves its ``mimi.`` tensors unexpected), so not in this package.

Files (``b`` the batch, ``L`` layers, ``H`` x ``D`` the key/value heads and head size, ``d`` the
``latent_dim``, ``W`` the ``hidden_size``):

- ``decoder_model_merged.onnx``: one backbone step with its cache, the prefill and the later steps alike.
  ``input_ids`` (``b`` x ``sequence_length``), ``audio_latents`` (``b`` x ``sequence_length`` x ``d``:
  the normalised latent placed at each ``audio_latent_token_id`` position, anything elsewhere),
  ``attention_mask`` (``b`` x ``total_sequence_length``), ``position_ids`` (``b`` x ``sequence_length``)
  and ``past_key_values.%d.key`` / ``.value`` (``b`` x H x ``past_sequence_length`` x D) to ``logits``
  (the end-of-speech logits, ``b`` x ``sequence_length`` x 1), ``last_hidden_state`` (``b`` x
  ``sequence_length`` x W) and ``present.%d.key`` / ``.value``. The ``audio_bos_token_id`` position gets
  the learnt BOS latent inside the graph.
- ``flow_head.onnx``: one call of the flow head. With ``flow_type="lsd"`` (the released checkpoints but
  one): ``latents`` (``b`` x ``d``), ``condition`` (``b`` x W), ``start_times``, ``end_times`` (``b`` x 1)
  to ``velocity`` (``b`` x ``d``); with ``"drifting"``: ``latents`` (the noise) and ``condition`` to
  ``latents`` (the sampled latent).
- ``denormalize_latents.onnx``: ``audio_latents`` (``b`` x frames x ``d``, normalised) to
  ``audio_latents`` in the audio tokenizer's space (``latent_std``, ``latent_mean``).

The loop (``generated_by_sessions``; ``generate(input_ids, attention_mask, max_new_tokens=N, ...)``;
``num_flow_steps`` S, ``eos_threshold``, ``min_frames_before_eos`` and ``frames_after_eos`` from the call,
else the generation config, else 1, -4.0, 6 and 1; N the call's, else ``ceil((T / 3 + 2) * frame_rate)``
with T the longest row's text tokens, as ``generate`` sets it):

1. The prompt (PocketTTSProcessor's: left-padded, each row ending with ``audio_bos_token_id``) with its
   mask; ``position_ids`` = cumsum(mask) - 1, 0 where the mask is 0; ``audio_latents`` zeros; an empty
   cache. Run the decoder.
2. Each frame: ``condition`` = ``last_hidden_state[:, -1]``, the eos logit ``logits[:, -1, 0]``. The noise
   ``randn(b, d) * sqrt(temperature)`` when sampling, zeros when greedy (transformers draws the randn in
   both: a runtime reproducing a seeded sampled run draws it every frame). LSD: ``x`` = noise, then for
   ``k`` in 0..S-1, ``x += flow_head(x, condition, k / S, (k + 1) / S) / S`` (times as ``b`` x 1
   columns); drifting: ``x = flow_head(noise, condition)``. ``x`` is the frame's (normalised) latent.
3. The end of speech, per row: at frame ``f`` (from 0), a row not yet ended whose eos logit exceeds
   ``eos_threshold`` with ``f >= min_frames_before_eos`` starts a countdown of ``frames_after_eos`` (an
   int, or one per row); a row whose countdown is 0 is done (a running countdown then drops by 1). The
   frame counts for every row not done before it. Stop when every row is done or after N frames.
4. Otherwise the next step: ``input_ids`` = ``audio_latent_token_id`` (``b`` x 1), ``audio_latents`` =
   ``x`` (``b`` x 1 x ``d``), the mask grown by a column of ones, ``position_ids`` the last ones + 1, the
   cache the step's ``present``. Back to 2.
5. ``denormalize_latents`` on the frames (``b`` x frames x ``d``), zeroed past each row's own count (its
   ``audio_latents_mask``): what ``generate`` returns, and what the audio tokenizer decodes.

A voice is either the cache of a voice prefix (Gradium's shipped voices: fed as the first step's past,
the mask covering it) or ``audio_prompt_latents`` scattered into ``audio_prompt_token_id`` positions; the
latter is not in the graph (an InputError names it when the prompt holds such a position).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from fastonnx.diagnostics.verdicts import VerificationInfo, compare
from fastonnx.errors import InputError
from fastonnx.pretrained.graph_spec import BATCH, PAST, SEQUENCE, TOTAL, GraphSpec
from fastonnx.pretrained.loop_caches import cache_names
from fastonnx.pretrained.loop_caches import decoder_sizes as _sizes
from fastonnx.pretrained.task_inputs import cache_of
from fastonnx.torch_internals import pytree

DECODER_FILE, FLOW_FILE, DENORMALIZE_FILE = (
    "decoder_model_merged.onnx",
    "flow_head.onnx",
    "denormalize_latents.onnx",
)
DEFAULTS = {"num_flow_steps": 1, "eos_threshold": -4.0, "min_frames_before_eos": 6}
"""Pocket TTS's defaults where neither the call nor the generation config sets them (transformers')."""


def own_layout(model: torch.nn.Module) -> bool:
    return type(model).__name__ == "GradiumPhononTTSForConditionalGeneration"


def _lsd(config: Any) -> bool:
    return str(config.flow_head_config.flow_type) == "lsd"


class DecoderStep(torch.nn.Module):
    """The backbone and its end-of-speech head on one step: the latents placed position-wise (the model's
    own path for a step's latents, which the prefill's zeros leave untouched where no latent token is)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        input_ids: torch.Tensor,
        audio_latents: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past_key_values: list[torch.Tensor],
    ) -> tuple[torch.Tensor, ...]:
        out = self.model(
            input_ids=input_ids,
            audio_latents=audio_latents,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache_of(past_key_values),
            use_cache=True,
            return_dict=True,
        )
        cache = out.past_key_values
        presents = [t for layer in cache.layers for t in (layer.keys, layer.values)]
        return (out.logits, out.last_hidden_state, *presents)


class FlowStep(torch.nn.Module):
    """One LSD flow-head call: the velocity at ``latents`` over the step from ``start_times`` to
    ``end_times``."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        latents: torch.Tensor,
        condition: torch.Tensor,
        start_times: torch.Tensor,
        end_times: torch.Tensor,
    ) -> torch.Tensor:
        head: Any = self.model.flow_head
        out: torch.Tensor = head(latents, condition, times=[start_times, end_times])
        return out


class DriftingFlow(torch.nn.Module):
    """The drifting flow head: noise to the latent in one call, no times."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, latents: torch.Tensor, condition: torch.Tensor) -> torch.Tensor:
        head: Any = self.model.flow_head
        out: torch.Tensor = head(latents, condition)
        return out


class Denormalize(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, audio_latents: torch.Tensor) -> torch.Tensor:
        model: Any = self.model
        out: torch.Tensor = model.denormalize_latents(audio_latents)
        return out


def loop_graphs(model: torch.nn.Module, config: Any) -> dict[str, GraphSpec]:
    """The three files' graphs."""
    layers, heads, size = _sizes(config)
    latent, width = int(config.latent_dim), int(config.hidden_size)
    g = torch.Generator().manual_seed(0)
    batch, tokens, past = 2, 3, 4
    b = torch.export.Dim(BATCH, min=1, max=1024)
    s = torch.export.Dim(SEQUENCE, min=1, max=1 << 20)
    p = torch.export.Dim(PAST, min=0, max=1 << 20)
    args: tuple[Any, ...] = (
        torch.randint(0, int(config.vocab_size), (batch, tokens), generator=g),
        torch.randn(batch, tokens, latent, generator=g),
        torch.ones(batch, past + tokens, dtype=torch.int64),
        torch.arange(past, past + tokens).repeat(batch, 1),
        [torch.randn(batch, heads, past, size, generator=g) for _ in range(2 * layers)],
    )
    decoder = GraphSpec(
        DecoderStep(model),
        tuple(pytree.tree_map(lambda t: t.to("meta"), args)),
        {
            "input_ids": {0: b, 1: s},
            "audio_latents": {0: b, 1: s},
            "attention_mask": {0: b, 1: TOTAL},
            "position_ids": {0: b, 1: s},
            "past_key_values": [{0: b, 2: p} for _ in range(2 * layers)],
        },
        [
            "input_ids",
            "audio_latents",
            "attention_mask",
            "position_ids",
            *cache_names(layers, "past_key_values"),
        ],
        ["logits", "last_hidden_state", *cache_names(layers, "present")],
    )
    pair = (torch.randn(batch, latent).to("meta"), torch.randn(batch, width).to("meta"))
    flow: GraphSpec
    if _lsd(config):
        column = torch.zeros(batch, 1).to("meta")
        flow = GraphSpec(
            FlowStep(model),
            (*pair, column, column.clone()),
            {"latents": {0: b}, "condition": {0: b}, "start_times": {0: b}, "end_times": {0: b}},
            ["latents", "condition", "start_times", "end_times"],
            ["velocity"],
        )
    else:
        flow = GraphSpec(
            DriftingFlow(model),
            pair,
            {"latents": {0: b}, "condition": {0: b}},
            ["latents", "condition"],
            ["latents"],
        )
    frames = torch.export.Dim("frames", min=1, max=1 << 20)
    denormalize = GraphSpec(
        Denormalize(model),
        (torch.randn(batch, 5, latent).to("meta"),),
        {"audio_latents": {0: b, 1: frames}},
        ["audio_latents"],
        ["audio_latents"],
    )
    return {DECODER_FILE: decoder, FLOW_FILE: flow, DENORMALIZE_FILE: denormalize}


def settings(model: Any, given: dict[str, Any]) -> dict[str, Any]:
    """``num_flow_steps``, ``eos_threshold``, ``min_frames_before_eos`` and ``frames_after_eos``: the
    call's (``given``), else the generation config's, else Pocket TTS's defaults (``frames_after_eos`` 1)."""
    generation = model.generation_config
    out = {}
    for key, default in {**DEFAULTS, "frames_after_eos": 1}.items():
        value = given.get(key)
        if value is None and key != "frames_after_eos":
            value = getattr(generation, key, None)
        out[key] = default if value is None else value
    return out


Run = Callable[[Any, list[str], list[torch.Tensor]], list[torch.Tensor]]


def generated_by_sessions(
    sessions: dict[str, Any],
    run: Run,
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    max_new_tokens: int,
    noise: Callable[[int, int], torch.Tensor] | None = None,
    temperature: float = 1.0,
    **given: Any,
) -> dict[str, torch.Tensor]:
    """The module docstring's loop over the package's sessions (``run(session, names, tensors)``), greedy
    unless ``noise(batch, latent_dim)`` draws each frame's standard normal noise: ``audio_latents`` (``b``
    x frames x ``d``, zeroed past each row's frames) and ``audio_latents_mask``."""
    config = model.config
    if bool((input_ids == int(config.audio_prompt_token_id)).any()):
        raise InputError(
            "the prompt holds audio_prompt_token_id positions (a voice as audio_prompt_latents), which the "
            "package's decoder does not take: pass a voice as the cache of its prefix"
        )
    if not bool((input_ids[:, -1] == int(config.audio_bos_token_id)).all()):
        raise InputError("every prompt must end with audio_bos_token_id, left-padded (PocketTTSProcessor's)")
    knobs = settings(model, given)
    steps = int(knobs["num_flow_steps"])
    layers, heads, size = _sizes(config)
    batch, latent = input_ids.shape[0], int(config.latent_dim)
    names = [
        "input_ids",
        "audio_latents",
        "attention_mask",
        "position_ids",
        *cache_names(layers, "past_key_values"),
    ]
    flow_names = (
        ["latents", "condition", "start_times", "end_times"] if _lsd(config) else ["latents", "condition"]
    )
    mask = attention_mask.long()
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    ids, latents = input_ids, torch.zeros(batch, input_ids.shape[1], latent)
    cache = [torch.zeros(batch, heads, 0, size) for _ in range(2 * layers)]
    after = knobs["frames_after_eos"]
    after = after.long() if isinstance(after, torch.Tensor) else torch.full((batch,), int(after))
    remaining = torch.full((batch,), -1)
    running = torch.ones(batch, dtype=torch.long)
    frames = torch.zeros(batch, dtype=torch.long)
    made: list[torch.Tensor] = []
    for frame in range(max_new_tokens):
        logits, hidden, *cache = run(sessions[DECODER_FILE], names, [ids, latents, mask, positions, *cache])
        condition, eos = hidden[:, -1], logits[:, -1, 0]
        drawn = noise(batch, latent) if noise is not None else torch.zeros(batch, latent)
        x = drawn * (math.sqrt(temperature) if noise is not None else 0.0)
        if _lsd(config):
            ones = torch.ones(batch, 1)
            for k in range(steps):
                times = [ones * (k / steps), ones * ((k + 1) / steps)]
                (velocity,) = run(sessions[FLOW_FILE], flow_names, [x, condition, *times])
                x = x + velocity / steps
        else:
            (x,) = run(sessions[FLOW_FILE], flow_names, [x, condition])
        made.append(x)
        frames += running
        ended = (
            (remaining < 0)
            & (eos > float(knobs["eos_threshold"]))
            & (frame >= int(knobs["min_frames_before_eos"]))
        )
        remaining = torch.where(ended, after, remaining)
        done = remaining == 0
        remaining = torch.where(remaining > 0, remaining - 1, remaining)
        running = running & ~done
        if not bool(running.any()):
            break
        ids = torch.full((batch, 1), int(config.audio_latent_token_id))
        latents = x[:, None, :]
        mask = torch.cat([mask, torch.ones(batch, 1, dtype=torch.long)], dim=1)
        positions = positions[:, -1:] + 1
    (audio,) = run(sessions[DENORMALIZE_FILE], ["audio_latents"], [torch.stack(made, dim=1)])
    kept = (torch.arange(audio.shape[1]) < frames[:, None]).long()
    return {"audio_latents": audio * kept[..., None], "audio_latents_mask": kept}


def check_inputs(model: Any, batch: int, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch`` prompts of ``tokens`` text ids then ``audio_bos_token_id``, the second row shorter
    (left-padded with the pad id, as PocketTTSProcessor pads)."""
    config = model.config
    special = {
        int(config.audio_prompt_token_id),
        int(config.audio_latent_token_id),
        int(config.audio_bos_token_id),
    }
    special.add(int(config.pad_token_id))
    text = torch.tensor([i for i in range(int(config.vocab_size)) if i not in special])
    g = torch.Generator().manual_seed(batch * 100 + tokens)
    ids = torch.full((batch, tokens + 1), int(config.pad_token_id))
    mask = torch.zeros(batch, tokens + 1, dtype=torch.long)
    for row in range(batch):
        n = max(1, tokens - 2 * row)
        ids[row, tokens - n : tokens] = text[torch.randint(0, len(text), (n,), generator=g)]
        mask[row, tokens - n :] = 1
    ids[:, -1] = int(config.audio_bos_token_id)
    return ids, mask


CHECKED: tuple[dict[str, Any], ...] = (
    # the checkpoint's own settings, greedy, N frames unless its end of speech comes first
    {"batch": 1, "tokens": 5, "max_new_tokens": 5, "frames_after_eos": 2},
    # sampled at temperature 0.5 (the noise drawn from the check's seed by transformers and the loop
    # alike), two Euler steps, every logit over the threshold from frame 2 on: the rows end after 1 and 3
    # more frames (their lengths differ)
    {
        "batch": 2,
        "tokens": 6,
        "max_new_tokens": 12,
        "do_sample": True,
        "temperature": 0.5,
        "seed": 7,
        "num_flow_steps": 2,
        "eos_threshold": -math.inf,
        "min_frames_before_eos": 2,
        "frames_after_eos": torch.tensor([1, 3]),
    },
)
"""The verification's generations."""


def check_package(
    sessions: dict[str, Any], model: Any, specs: dict[str, GraphSpec], run: Run, tolerance: Any
) -> list[VerificationInfo]:
    """The loop over the sessions against ``model.generate(..., return_dict_in_generate=True)`` at each of
    ``CHECKED``: equal frame counts (the ``audio_latents_mask``), the latents within ``tolerance``."""
    del specs
    infos: list[VerificationInfo] = []
    for case in CHECKED:
        knobs = dict(case)
        batch, tokens, seed = knobs.pop("batch"), knobs.pop("tokens"), knobs.pop("seed", 0)
        sampled, temperature = bool(knobs.pop("do_sample", False)), float(knobs.pop("temperature", 1.0))
        ids, mask = check_inputs(model, batch, tokens)
        drawn = torch.Generator().manual_seed(seed)

        def noise(rows: int, width: int, drawn: torch.Generator = drawn) -> torch.Tensor:
            return torch.randn(rows, width, generator=drawn)

        got = generated_by_sessions(
            sessions,
            run,
            model,
            ids,
            mask,
            noise=noise if sampled else None,
            temperature=temperature,
            **knobs,
        )
        torch.manual_seed(seed)  # transformers draws from the global generator: the same stream
        with torch.no_grad():
            want = model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=sampled,
                return_dict_in_generate=True,
                **({"temperature": temperature} if sampled else {}),
                **knobs,
            )
        at = f"{batch}x{tokens}{', sampled' if sampled else ''}"
        infos.append(
            compare(f"audio_latents_mask ({at})", want.audio_latents_mask, got["audio_latents_mask"])
        )
        e, a = want.audio_latents, got["audio_latents"]
        infos.append(compare(f"audio_latents ({at})", e, a, *(tolerance(e) if e.shape == a.shape else ())))
    return infos
