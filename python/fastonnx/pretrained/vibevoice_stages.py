"""text-to-audio of VibeVoiceForConditionalGeneration: transformers' ``generate`` (next-token diffusion) as
seven graphs, one a stage, the loop and the noise scheduler the runtime's.

Files (``b`` the batch, ``H`` the language model's hidden size, ``A`` the acoustic latent size
(``audio_config.hidden_size``), ``S`` the semantic one (``semantic_model_config.hidden_size``), ``R`` the
samples a latent frame decodes to (``audio_config.hop_length``, the product of its upsampling ratios)):

- ``embed_tokens.onnx``: ``input_ids`` (``b`` x ``sequence_length``) to ``inputs_embeds`` (x ``H``): the
  language model's token embeddings.
- ``language_model.onnx``: one step of the Qwen2 language model with its cache, the first and the later
  ones alike. ``inputs_embeds``, ``attention_mask`` (``b`` x ``total_sequence_length``: past and new
  positions), ``position_ids`` (``b`` x ``sequence_length``) and ``past_key_values.%d.key`` / ``.value``
  to ``logits`` (``b`` x ``sequence_length`` x vocabulary), ``last_hidden_state`` (x ``H``: the
  diffusion head's condition) and ``present.%d.key`` / ``.value``.
- ``diffusion_head.onnx``: ``noisy_latents`` (``n`` x ``A``), ``timesteps`` (``n``, float) and
  ``condition`` (``n`` x ``H``) to ``prediction`` (``n`` x ``A``: the scheduler's model output, a
  velocity for the released checkpoints' v-prediction).
- ``acoustic_connector.onnx``: ``latents`` (``n`` x 1 x ``A``) to ``embeds`` (``n`` x 1 x ``H``).
- ``semantic_connector.onnx``: ``features`` (``n`` x 1 x ``S``) to ``embeds`` (``n`` x 1 x ``H``).
- ``acoustic_decoder.onnx``: the acoustic tokenizer's streaming decode of one latent frame with its
  convolution states: ``latents`` (``b`` x 1 x ``A``) and ``past_conv.%d`` (``b`` x channels x left
  padding, zeros on the first step) to ``audio`` (``b`` x 1 x ``R``) and ``present_conv.%d``.
- ``semantic_encoder.onnx``: the semantic tokenizer's streaming encode of that audio with its states:
  ``audio`` (``b`` x 1 x ``R``) and ``past_conv.%d`` to ``features`` (``b`` x 1 x ``S``) and
  ``present_conv.%d``.

The loop (``generate(input_ids, attention_mask, noise_scheduler=..., max_new_tokens=N)``; greedy, no voice
prompt; ``bos``, ``eos``, ``audio`` and ``end`` the config's ``audio_bos_token_id``, ``eos_token_id``,
``audio_token_id``, ``audio_eos_token_id``; ``G`` the generation config's ``guidance_scale`` (1 where
unset); the scheduler the generation config's ``noise_scheduler_class`` with its
``noise_scheduler_config`` (diffusers' DPMSolverMultistepScheduler, squaredcos_cap_v2, v-prediction in the
released checkpoints), ``num_diffusion_steps`` of them (10 where unset)):

1. Prefill: ``embed_tokens`` of the prompt, ``language_model`` with the prompt's mask, position ids
   ``arange(length)`` for every row (transformers does not shift them by the left padding), an empty
   cache. The negative (unconditional) branch: one ``bos`` token, mask ``[1]``, its own empty cache,
   position ids its past length.
2. Each step: the last position's logits, every id but ``bos``, ``end``, ``audio`` and ``eos`` to -inf,
   argmax; a finished row (one that gave ``eos``) gives ``eos`` (the pad) from then on. The next input is
   ``embed_tokens`` of the token; the mask grows by a 1 column; position ids are the past length.
3. Where a live row picks ``bos``, its negative branch restarts: its negative mask becomes 0 everywhere
   but its last column, its negative input the ``bos`` embedding, and its negative cache's last position
   (keys and values of every layer) a copy of position 0's.
4. Where any live row picks ``audio``: the negative branch runs one step (every row, on this step's
   input embeddings, its mask grown by a 1 column; the first negative step after the prefill feeds the
   ``bos`` embedding) and its ``last_hidden_state``'s last position is the negative condition; the
   positive one is this step's ``last_hidden_state``'s last position. For those ``m`` rows: latents drawn
   from N(0, 1) (``m`` x ``A``); for each of the scheduler's timesteps ``t``, ``diffusion_head`` on the
   latents twice over (``2m`` rows), ``t`` repeated, the conditions positive then negative; ``uncond +
   G * (cond - uncond)`` is the scheduler's model output for ``step(output, t, latents)``. The latent is
   then ``latent / latent_scaling_factor - latent_bias_factor`` (the checkpoint's two scalars), placed
   in a ``b`` x 1 x ``A`` batch of zeros at those rows, ``acoustic_decoder`` with its states (all rows;
   states start at zeros and are kept across steps), its audio that row's next ``R`` samples;
   ``semantic_encoder`` on the whole batch's audio with its own states; for the ``m`` rows, the next
   input is ``acoustic_connector(unscaled latent) + semantic_connector(features)``, not the token's
   embedding.
5. Stop when every row has given ``eos`` or after ``N`` steps. Each row's waveform is its chunks in order.

A voice prompt (``input_values``: the acoustic tokenizer's encoder, not exported) is not supported.
The check (``check_package``) runs transformers' own ``generate`` twice from the same torch seed with the
same scheduler (``CosineDdim``: diffusers is not a dependency of fastonnx): once as it is, once with each
stage's forward an onnxruntime session; equal tokens, waveforms within the tolerances.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from fastonnx.diagnostics.verdicts import VerificationInfo, compare
from fastonnx.errors import InputError
from fastonnx.pretrained.graph_spec import BATCH, PAST, SEQUENCE, TOTAL, GraphSpec
from fastonnx.pretrained.loop_caches import cache_names
from fastonnx.pretrained.task_inputs import cache_of
from fastonnx.torch_internals import pytree

EMBED_FILE, LM_FILE, DIFFUSION_FILE = "embed_tokens.onnx", "language_model.onnx", "diffusion_head.onnx"
ACOUSTIC_CONNECTOR_FILE, SEMANTIC_CONNECTOR_FILE = "acoustic_connector.onnx", "semantic_connector.onnx"
DECODER_FILE, SEMANTIC_FILE = "acoustic_decoder.onnx", "semantic_encoder.onnx"
FILES = (
    EMBED_FILE,
    LM_FILE,
    DIFFUSION_FILE,
    ACOUSTIC_CONNECTOR_FILE,
    SEMANTIC_CONNECTOR_FILE,
    DECODER_FILE,
    SEMANTIC_FILE,
)
LATENTS = "latents"


def own_layout(model: torch.nn.Module) -> bool:
    return type(model).__name__ == "VibeVoiceForConditionalGeneration"


class ConvStates:
    """transformers' convolution padding cache (``VibeVoiceAcousticTokenizerConv1dPaddingCache``'s
    ``update``) over states given as tensors: each key's state replaced as the convolutions run. A
    convolution without left padding reads and keeps nothing."""

    def __init__(self, keys: list[str], states: list[torch.Tensor]) -> None:
        self.states = dict(zip(keys, states, strict=True))
        self.seen: list[tuple[str, int, int]] = []  # (key, channels, left padding) in call order

    def update(self, hidden_states: torch.Tensor, cache_key: str, conv_module: Any) -> torch.Tensor:
        pad, channels = int(conv_module.left_pad), int(conv_module.in_channels)
        if pad == 0:
            return hidden_states
        if cache_key not in self.states:  # the dry run finding the keys: zeros, as transformers starts
            self.states[cache_key] = hidden_states.new_zeros(hidden_states.shape[0], channels, pad)
            self.seen.append((cache_key, channels, pad))
        past = self.states[cache_key]
        width = hidden_states.shape[-1]
        kept = (
            hidden_states[:, :, -pad:] if width >= pad else torch.cat([past[:, :, width:], hidden_states], -1)
        )
        self.states[cache_key] = kept
        return torch.cat([past, hidden_states], dim=-1)


def conv_layout(run: Any, frame: torch.Tensor) -> list[tuple[str, int, int]]:
    """The states ``run(frame, cache)`` keeps: (key, channels, left padding) in the order first used."""
    states = ConvStates([], [])
    with torch.no_grad():
        run(frame, states)
    return states.seen


def _decode(model: Any, latents: torch.Tensor, cache: Any) -> Any:
    return model.model.audio_tower.decode(latents, padding_cache=cache, use_cache=True).audio


def _encode(model: Any, audio: torch.Tensor, cache: Any) -> Any:
    return model.model.semantic_tokenizer_encoder(audio, padding_cache=cache, use_cache=True).latents


def sizes(model: Any) -> dict[str, int]:
    config = model.config
    text = config.text_config
    heads = int(text.num_attention_heads)
    return {
        "layers": int(text.num_hidden_layers),
        "kv_heads": int(getattr(text, "num_key_value_heads", None) or heads),
        "head_dim": int(getattr(text, "head_dim", None) or int(text.hidden_size) // heads),
        "hidden": int(text.hidden_size),
        "acoustic": int(config.audio_config.hidden_size),
        "semantic": int(config.semantic_model_config.hidden_size),
        "hop": int(config.audio_config.hop_length),
    }


class LanguageStep(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past_key_values: list[torch.Tensor],
    ) -> tuple[torch.Tensor, ...]:
        model: Any = self.model
        out = model.model.language_model(
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache_of(past_key_values),
            use_cache=True,
            return_dict=True,
        )
        hidden = out.last_hidden_state
        present = [t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)]
        return (model.lm_head(hidden), hidden, *present)


class Embed(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.model.get_input_embeddings()(input_ids)  # type: ignore[operator]
        return out


class Diffusion(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, noisy_latents: torch.Tensor, timesteps: torch.Tensor, condition: torch.Tensor) -> Any:
        model: Any = self.model
        return model.model.diffusion_head(noisy_latents, timesteps, condition)


class Connector(torch.nn.Module):
    """``model.model.<name>``: the acoustic or semantic connector (the whole model kept, so that the
    weights keep their checkpoint names)."""

    def __init__(self, model: torch.nn.Module, name: str) -> None:
        super().__init__()
        self.model, self.name = model, name

    def forward(self, features: torch.Tensor) -> Any:
        return getattr(self.model.model, self.name)(features)


class Streaming(torch.nn.Module):
    """One streaming step of the acoustic decoder or the semantic encoder: its states in and out."""

    def __init__(self, model: torch.nn.Module, decode: bool, keys: list[str]) -> None:
        super().__init__()
        self.model, self.decode, self.keys = model, decode, keys

    def forward(self, frame: torch.Tensor, past_conv: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        states = ConvStates(self.keys, past_conv)
        out = (_decode if self.decode else _encode)(self.model, frame, states)
        return (out, *[states.states[k] for k in self.keys])


def conv_names(count: int, prefix: str) -> list[str]:
    return [f"{prefix}.{i}" for i in range(count)]


def _streaming_spec(model: Any, decode: bool, frame: torch.Tensor, name: str, out: str) -> GraphSpec:
    device = next(model.parameters()).device  # meta where the export builds the model there
    layout = conv_layout(lambda x, c: (_decode if decode else _encode)(model, x, c), frame.to(device))
    b = torch.export.Dim(BATCH, min=1, max=1024)
    states = [torch.zeros(2, channels, pad) for _, channels, pad in layout]
    frames = torch.cat([frame, frame])
    return GraphSpec(
        Streaming(model, decode, [key for key, _, _ in layout]),
        (frames.to("meta"), [s.to("meta") for s in states]),
        {"frame": {0: b}, "past_conv": [{0: b} for _ in states]},
        [name, *conv_names(len(states), "past_conv")],
        [out, *conv_names(len(states), "present_conv")],
    )


def stage_graphs(model: torch.nn.Module, config: Any) -> dict[str, GraphSpec]:
    """The seven files' graphs."""
    del config
    m: Any = model
    size = sizes(m)
    g = torch.Generator().manual_seed(0)
    b = torch.export.Dim(BATCH, min=1, max=1024)
    s = torch.export.Dim(SEQUENCE, min=1, max=1 << 16)
    p = torch.export.Dim(PAST, min=0, max=1 << 16)
    n = torch.export.Dim("latent_rows", min=1, max=1 << 16)
    batch, tokens, past, hidden = 2, 5, 3, size["hidden"]
    cache = [
        torch.randn(batch, size["kv_heads"], past, size["head_dim"], generator=g)
        for _ in range(2 * size["layers"])
    ]
    lm_args = (
        torch.randn(batch, tokens, hidden, generator=g),
        torch.ones(batch, past + tokens, dtype=torch.int64),
        torch.arange(past, past + tokens).expand(batch, -1),
        cache,
    )
    lm = GraphSpec(
        LanguageStep(model),
        tuple(pytree.tree_map(lambda t: t.to("meta"), lm_args)),
        {
            "inputs_embeds": {0: b, 1: s},
            "attention_mask": {0: b, 1: torch.export.Dim(TOTAL, min=1, max=1 << 17)},
            "position_ids": {0: b, 1: s},
            "past_key_values": [{0: b, 2: p} for _ in cache],
        },
        ["inputs_embeds", "attention_mask", "position_ids", *cache_names(size["layers"], "past_key_values")],
        ["logits", "last_hidden_state", *cache_names(size["layers"], "present")],
    )
    vocab = int(m.config.text_config.vocab_size)
    embed = GraphSpec(
        Embed(model),
        (torch.randint(0, vocab, (batch, tokens), generator=g).to("meta"),),
        {"input_ids": {0: b, 1: s}},
        ["input_ids"],
        ["inputs_embeds"],
    )
    diffusion = GraphSpec(
        Diffusion(model),
        (
            torch.randn(4, size["acoustic"]).to("meta"),
            torch.tensor([3.0, 3.0, 3.0, 3.0]).to("meta"),
            torch.randn(4, hidden).to("meta"),
        ),
        {"noisy_latents": {0: n}, "timesteps": {0: n}, "condition": {0: n}},
        ["noisy_latents", "timesteps", "condition"],
        ["prediction"],
    )

    def connector(name: str, width: int) -> GraphSpec:
        return GraphSpec(
            Connector(model, name),
            (torch.randn(3, 1, width).to("meta"),),
            {"features": {0: n}},
            ["features"],
            ["embeds"],
        )

    decoder = _streaming_spec(m, True, torch.zeros(1, 1, size["acoustic"]), LATENTS, "audio")
    semantic = _streaming_spec(m, False, torch.zeros(1, 1, size["hop"]), "audio", "features")
    return {
        EMBED_FILE: embed,
        LM_FILE: lm,
        DIFFUSION_FILE: diffusion,
        ACOUSTIC_CONNECTOR_FILE: connector("multi_modal_projector", size["acoustic"]),
        SEMANTIC_CONNECTOR_FILE: connector("semantic_connector", size["semantic"]),
        DECODER_FILE: decoder,
        SEMANTIC_FILE: semantic,
    }


class CosineDdim:
    """A deterministic DDIM scheduler for v-prediction over squaredcos_cap_v2 betas (1000 training steps,
    the released checkpoints' schedule): the check's, so that it needs no diffusers. It has what
    ``generate`` reads: ``set_timesteps``, ``timesteps`` and ``step(output, t, sample).prev_sample``."""

    def __init__(self, train_steps: int = 1000) -> None:
        def alpha_bar(t: float) -> float:
            return math.cos((t + 0.008) / 1.008 * math.pi / 2) ** 2

        betas = [
            min(1 - alpha_bar((i + 1) / train_steps) / alpha_bar(i / train_steps), 0.999)
            for i in range(train_steps)
        ]
        self.train_steps = train_steps
        self.alphas = torch.cumprod(1 - torch.tensor(betas, dtype=torch.float64), 0).float()
        self.timesteps = torch.zeros(0, dtype=torch.int64)

    def set_timesteps(self, num_inference_steps: int) -> None:
        self.timesteps = torch.linspace(self.train_steps - 1, 0, num_inference_steps).round().long()

    def step(self, model_output: torch.Tensor, timestep: torch.Tensor, sample: torch.Tensor) -> Any:
        at = int((self.timesteps == timestep).nonzero()[0])
        alpha = self.alphas[int(timestep)]
        after = (
            self.alphas[int(self.timesteps[at + 1])] if at + 1 < len(self.timesteps) else torch.tensor(1.0)
        )
        clean = alpha.sqrt() * sample - (1 - alpha).sqrt() * model_output
        noise = alpha.sqrt() * model_output + (1 - alpha).sqrt() * sample
        return _Stepped(after.sqrt() * clean + (1 - after).sqrt() * noise)


@dataclass
class _Stepped:
    prev_sample: torch.Tensor


@dataclass
class _Streamed:
    """What the acoustic decode and the semantic encode return to ``generate``: the output and the states
    (kept by ``generate`` and handed back on the next call)."""

    audio: torch.Tensor
    padding_cache: list[torch.Tensor]
    latents: torch.Tensor = field(init=False)

    def __post_init__(self) -> None:
        self.latents = self.audio


class _Sessions:
    """Each stage's forward as a call of its session (``run(session, names, tensors)``), counted."""

    def __init__(self, sessions: dict[str, Any], run: Any, model: Any) -> None:
        self.sessions, self.run, self.model = sessions, run, model
        self.calls = dict.fromkeys(FILES, 0)
        self.size = sizes(model)

    def __call__(self, name: str, names: list[str], tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        self.calls[name] += 1
        out: list[torch.Tensor] = self.run(self.sessions[name], names, tensors)
        return out

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        # generate embeds its next tokens as one id a row (1-d): the graph's rows of one id each
        out = self(EMBED_FILE, ["input_ids"], [input_ids.reshape(-1, 1)])[0]
        return out.reshape(*input_ids.shape, -1)

    def language(self, **kwargs: Any) -> Any:
        from transformers.models.vibevoice.modeling_vibevoice import VibeVoiceCausalLMOutputWithPast

        if kwargs.get("input_values") is not None:
            raise InputError("VibeVoice's package does not take a voice prompt (input_values)")
        cache = kwargs["past_key_values"]
        embeds = kwargs.get("inputs_embeds")
        if embeds is None:
            embeds = self.model.get_input_embeddings()(kwargs["input_ids"])
        past = cache.get_seq_length()
        positions = kwargs.get("position_ids")
        if positions is None:  # the language model's own: the past length on
            positions = torch.arange(past, past + embeds.shape[1]).unsqueeze(0)
        positions = positions.expand(embeds.shape[0], -1)
        layers = self.size["layers"]
        flat = [
            t
            for i in range(layers)
            for t in (
                (cache.layers[i].keys, cache.layers[i].values)
                if past
                else [embeds.new_zeros(embeds.shape[0], self.size["kv_heads"], 0, self.size["head_dim"])] * 2
            )
        ]
        names = ["inputs_embeds", "attention_mask", "position_ids", *cache_names(layers, "past_key_values")]
        logits, hidden, *present = self(LM_FILE, names, [embeds, kwargs["attention_mask"], positions, *flat])
        for i in range(layers):
            cache.update(present[2 * i][:, :, past:], present[2 * i + 1][:, :, past:], i)
        return VibeVoiceCausalLMOutputWithPast(logits=logits, last_hidden_state=hidden, past_key_values=cache)

    def diffusion(self, noisy_images: torch.Tensor, timesteps: torch.Tensor, condition: torch.Tensor) -> Any:
        names = ["noisy_latents", "timesteps", "condition"]
        return self(DIFFUSION_FILE, names, [noisy_images, timesteps, condition])[0]

    def connector(self, name: str) -> Any:
        return lambda features: self(name, ["features"], [features])[0]

    def streaming(self, name: str, frame_name: str) -> Any:
        def call(frame: torch.Tensor, padding_cache: Any = None, use_cache: bool = True) -> _Streamed:
            del use_cache
            spec_states = self.sessions[name].get_inputs()[1:]
            states = padding_cache or [
                frame.new_zeros(frame.shape[0], int(i.shape[1]), int(i.shape[2])) for i in spec_states
            ]
            out, *kept = self(name, [frame_name, *conv_names(len(states), "past_conv")], [frame, *states])
            return _Streamed(out, kept)

        return call


@contextmanager
def through_sessions(model: Any, stages: _Sessions) -> Iterator[None]:
    """Inside the block, each stage module's forward (the acoustic tokenizer's ``decode``) is its
    session."""
    inner = model.model
    swaps = [
        (model, "forward", stages.language),
        (inner.language_model.embed_tokens, "forward", stages.embed),
        (inner.diffusion_head, "forward", stages.diffusion),
        (inner.multi_modal_projector, "forward", stages.connector(ACOUSTIC_CONNECTOR_FILE)),
        (inner.semantic_connector, "forward", stages.connector(SEMANTIC_CONNECTOR_FILE)),
        (inner.audio_tower, "decode", stages.streaming(DECODER_FILE, LATENTS)),
        (inner.semantic_tokenizer_encoder, "forward", stages.streaming(SEMANTIC_FILE, "audio")),
    ]
    for owner, attribute, call in swaps:
        setattr(owner, attribute, call)
    try:
        yield
    finally:
        for owner, attribute, _ in swaps:
            delattr(owner, attribute)


SEED = 0
NEW_TOKENS = 10
DIFFUSION_STEPS = 3


def check_inputs(model: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Two prompts of 6 ids below the special tokens, the second left-padded by 2."""
    config = model.config
    special = [
        config.audio_bos_token_id,
        config.audio_eos_token_id,
        config.audio_token_id,
        config.eos_token_id,
    ]
    top = min(int(i) for i in special)
    ids = torch.randint(0, top, (2, 6), generator=torch.Generator().manual_seed(SEED))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    return ids, mask


def generate(model: Any, ids: torch.Tensor, mask: torch.Tensor) -> Any:
    torch.manual_seed(SEED)  # the diffusion's draws
    with torch.no_grad():
        return model.generate(
            input_ids=ids,
            attention_mask=mask,
            noise_scheduler=CosineDdim(),
            num_diffusion_steps=DIFFUSION_STEPS,
            max_new_tokens=NEW_TOKENS,
            return_dict_in_generate=True,
        )


def check_package(
    sessions: dict[str, Any], model: Any, specs: dict[str, GraphSpec], run: Any, tolerance: Any
) -> list[VerificationInfo]:
    """transformers' ``generate`` with every stage an onnxruntime session against ``generate`` as it is,
    from the same seed and scheduler: equal tokens, each row's waveform within ``tolerance``."""
    del specs
    ids, mask = check_inputs(model)
    want = generate(model, ids, mask)
    stages = _Sessions(sessions, run, model)
    with through_sessions(model, stages):
        got = generate(model, ids, mask)
    infos = [compare("tokens", want.sequences, got.sequences)]
    for row, (e, a) in enumerate(zip(want.audio, got.audio, strict=True)):
        if e is None or a is None:
            infos.append(
                compare(f"waveform {row} (samples)", torch.tensor(e is None), torch.tensor(a is None))
            )
        else:
            infos.append(compare(f"waveform {row}", e, a, *(tolerance(e) if e.shape == a.shape else ())))
    unused = [name for name, count in stages.calls.items() if count == 0]
    infos.append(compare("stages run (sessions never called)", torch.tensor(len(unused)), torch.tensor(0)))
    return infos
