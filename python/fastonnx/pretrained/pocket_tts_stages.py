"""text-to-audio of PocketTTSForConditionalGeneration: transformers' ``generate`` and its processor's decode as
three graphs, one a stage, the loop the runtime's.

Files (``b`` the batch, ``D`` the latent size ``config.latent_dim``, ``H`` the backbone's hidden size, ``L``
its layers, ``K`` x ``d`` its key-value heads and head size):

- ``decoder_model_merged.onnx``: one step of the backbone (the text conditioning and the flow language model,
  one causal transformer) with its cache, the first step and the later ones alike. ``input_ids`` (``b`` x
  ``sequence_length``), ``audio_latents`` (``b`` x ``sequence_length`` x D: per position, the latent it
  holds; read only at the placeholders, zeros elsewhere), ``attention_mask`` (``b`` x
  ``total_sequence_length``: past and new positions), ``position_ids`` (``b`` x ``sequence_length``) and
  ``past_key_values.%d.key`` / ``.value`` (``b`` x K x ``past_sequence_length`` x d; 0 positions on the
  first step) to ``logits`` (``b`` x ``sequence_length`` x 1: the end-of-speech logits),
  ``last_hidden_state`` (``b`` x ``sequence_length`` x H: what conditions the flow head) and
  ``present.%d.key`` / ``.value``. A position's input is the token's embedding; at
  ``config.audio_prompt_token_id`` (a voice-prompt frame) its latent through ``audio_prompt_proj``, at
  ``config.audio_latent_token_id`` (a generated frame) through ``audio_latent_proj``, at
  ``config.audio_bos_token_id`` the learnt BOS latent's projection, as transformers places them.
- ``flow_head.onnx``: one Euler step of the flow head (LSD checkpoints: ``flow_head_config.flow_type`` "lsd").
  ``condition`` (``b`` x H), ``latents`` (``b`` x D: the noise on the first Euler step, then the previous
  step's ``next_latents``), ``start_times`` and ``end_times`` (``b`` x 1, float32) and ``num_flow_steps`` (a
  float32 scalar) to ``next_latents`` (``latents + velocity / num_flow_steps``, the normalised space the
  backbone reads) and ``audio_latents`` (``next_latents * latent_std + latent_mean``: the audio tokenizer's
  space). A "drifting" head maps the noise to the latent in one call: the graph takes ``condition`` and
  ``latents`` (the noise) only.
- ``latent_decoder.onnx``: the audio tokenizer's decode (``PocketTTSAudioTokenizerModel.decode``: the
  latent projection, the upsampling, its transformer and SEANet decoder). ``audio_latents`` (``b`` x
  ``frames`` x D, the tokenizer's space) to ``waveform`` (``b`` x ``frames * frame_size`` samples at its
  ``sampling_rate``). The audio tokenizer is a checkpoint of its own, which the model's
  ``processor_config.json`` names (``audio_tokenizer_name_or_path``: a folder, beside the model's files or
  elsewhere, or a Hub id): the file is written where that names one it can load (its weights copied into
  the package) and left out, with a warning, where it names none or one it cannot load (a Hub id's folder:
  the export fetches no processor_config.json): the package then has the first two files.

The loop (``generated_by_sessions``; what ``generate(input_ids, attention_mask, frames_after_eos=F,
max_new_tokens=N)`` does with a cache; ``n`` = ``num_flow_steps``, ``eos_threshold``, ``min_frames_before_eos``
from the call, else the generation config, else 1, -4.0 and 6, the released checkpoints' values; ``F`` per row,
the processor's ``frames_after_eos``; ``N`` by default ``ceil((T / 3 + 2) * config.frame_rate)``, ``T`` the
longest row's text tokens, the four placeholder ids and padding not counted):

1. Prefill: the prompt (``PocketTTSProcessor``'s, left-padded, each row ending with ``audio_bos_token_id``),
   its ``attention_mask``, ``position_ids`` = ``cumsum(attention_mask) - 1`` (0 where the mask is 0),
   ``audio_latents`` the voice prompt's frames at its ``audio_prompt_token_id`` positions (in order, each row
   its own) and zeros elsewhere, an empty cache.
2. Each step ``k`` (from 0): ``condition`` = the last position's ``last_hidden_state``, the end-of-speech logit
   the last position's ``logits``. The noise: ``randn(b, D) * sqrt(temperature)`` when sampling (one draw a
   step, torch's global generator as transformers draws it), zeros when greedy. With ``latents`` = the noise,
   for ``i`` in 0..n-1: ``flow_head(condition, latents, i / n, (i + 1) / n, n)`` (the times as float32
   columns), ``latents`` = its ``next_latents``; the frame is the last call's ``audio_latents``.
3. Stopping: a row still running counts the frame. From step ``min_frames_before_eos`` on, a row whose logit
   exceeds ``eos_threshold`` (the first time) has ``F`` frames left; a row whose count left reaches 0 (the
   step it crossed, for ``F`` = 0) stops after this frame; every row stops after ``N`` frames; the loop ends
   when every row has stopped.
4. The next step: ``input_ids`` = ``audio_latent_token_id`` (``b`` x 1), ``audio_latents`` = the frame's
   ``next_latents`` (``b`` x 1 x D), the mask with a column of ones appended, ``position_ids`` = the last ones
   + 1, the cache the previous ``present.*``.
5. The output: ``b`` x frames x D latents, zero past each row's count (``audio_latents_mask``);
   ``latent_decoder`` on the whole batch (the decoder is causal: a row's padding leaves its samples alone),
   each row cut to its count x ``frame_size`` samples and faded in over its first
   ``processor.fade_in_duration`` seconds (linearly from 0), as ``PocketTTSProcessor.decode`` does.

A shipped voice (the cache of a voice prefix, the prompt then the text alone) is the prefill's
``past_key_values``: the mask then starts with ones over its positions, and ``position_ids`` are the prompt's
columns of ``cumsum(mask) - 1``, as transformers builds them.
"""

from __future__ import annotations

import json
import logging
import math
import pathlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from fastonnx.diagnostics.verdicts import VerificationInfo, compare
from fastonnx.errors import InputError
from fastonnx.pretrained.folder import resolve_folder
from fastonnx.pretrained.graph_spec import BATCH, PAST, SEQUENCE, TOTAL, GraphSpec
from fastonnx.pretrained.loop_caches import cache_names
from fastonnx.pretrained.loop_caches import decoder_sizes as _sizes
from fastonnx.pretrained.task_inputs import cache_of
from fastonnx.torch_internals import pytree

log = logging.getLogger("fastonnx")

CLASS = "PocketTTSForConditionalGeneration"
CODEC = "PocketTTSAudioTokenizerModel"
STEP_FILE, FLOW_FILE, DECODER_FILE = "decoder_model_merged.onnx", "flow_head.onnx", "latent_decoder.onnx"
STEP_INPUTS = ["input_ids", "audio_latents", "attention_mask", "position_ids"]
DEFAULTS = {"num_flow_steps": 1, "eos_threshold": -4.0, "min_frames_before_eos": 6}
"""transformers' values where neither the call nor the generation config sets them (the released ones)."""


def own_layout(model: torch.nn.Module) -> bool:
    return type(model).__name__ == CLASS


def _lsd(config: Any) -> bool:
    return bool(config.flow_head_config.flow_type == "lsd")


@contextmanager
def _voice_frames(model: Any, input_ids: torch.Tensor, latents: torch.Tensor) -> Iterator[None]:
    """While active, the token embedding gives the voice-prompt positions their latent's projection, before
    the model places the BOS and the generated latents over it (transformers scatters the voice's frames
    into those positions in order: here each position carries its own)."""
    backbone = model.model
    is_voice = (input_ids == int(model.config.audio_prompt_token_id)).unsqueeze(-1)

    def place(module: Any, args: Any, out: torch.Tensor) -> torch.Tensor:
        del module, args
        return torch.where(is_voice, backbone.audio_prompt_proj(latents).to(out.dtype), out)

    handle = backbone.embed_tokens.register_forward_hook(place)
    try:
        yield
    finally:
        handle.remove()


class BackboneStep(torch.nn.Module):
    """The backbone and its end-of-speech head on ``input_ids`` and each position's latent, with its cache."""

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
        model: Any = self.model
        with _voice_frames(model, input_ids, audio_latents):
            out = model(
                input_ids=input_ids,
                audio_latents=audio_latents,
                attention_mask=attention_mask,
                position_ids=position_ids,
                past_key_values=cache_of(past_key_values),
                use_cache=True,
                return_dict=True,
            )
        present = [t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)]
        return (out.logits, out.last_hidden_state, *present)


class FlowStep(torch.nn.Module):
    """One Euler step of an LSD flow head, and its result in the audio tokenizer's space."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        condition: torch.Tensor,
        latents: torch.Tensor,
        start_times: torch.Tensor,
        end_times: torch.Tensor,
        num_flow_steps: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        model: Any = self.model
        velocity = model.flow_head(latents, condition, times=[start_times, end_times])
        following = latents + velocity / num_flow_steps  # transformers divides by the int: the same float
        return following, model.denormalize_latents(following)


class DriftingFlow(torch.nn.Module):
    """A drifting flow head: the noise to the latent in one call."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, condition: torch.Tensor, latents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        model: Any = self.model
        following = model.flow_head(latents, condition)
        return following, model.denormalize_latents(following)


class LatentDecoder(torch.nn.Module):
    """The audio tokenizer's decode of a batch of latents, its one channel."""

    def __init__(self, codec: torch.nn.Module) -> None:
        super().__init__()
        self.codec = codec

    def forward(self, audio_latents: torch.Tensor) -> torch.Tensor:
        codec: Any = self.codec
        out: torch.Tensor = codec.decode(audio_latents).audio_values[:, 0]
        return out


def audio_tokenizer_folder(config: Any) -> pathlib.Path | None:
    """The folder of the audio tokenizer the checkpoint's ``processor_config.json`` names (its
    ``audio_tokenizer_name_or_path``: a folder beside the checkpoint's files or elsewhere, or a Hub id), or
    None (with a warning) where it names none or one that cannot be had."""
    folder = pathlib.Path(str(getattr(config, "_name_or_path", "") or "."))
    processor = folder / "processor_config.json"
    entry = json.loads(processor.read_text(encoding="utf-8")) if processor.is_file() else {}
    entry = entry.get("audio_tokenizer")
    if not isinstance(entry, dict) or not entry.get("audio_tokenizer_name_or_path"):
        log.warning(
            "%s names no audio tokenizer (processor_config.json's audio_tokenizer): %s is left out, the "
            "package gives latents, not waveforms",
            folder,
            DECODER_FILE,
        )
        return None
    if entry.get("audio_tokenizer_class", CODEC) != CODEC:
        raise InputError(
            f"{processor} names a {entry['audio_tokenizer_class']} audio tokenizer, not a {CODEC}"
        )
    name = str(entry["audio_tokenizer_name_or_path"])
    for candidate in (folder / name, pathlib.Path(name).expanduser()):
        if (candidate / "config.json").is_file():
            return candidate.resolve()
    try:
        return resolve_folder(name)
    except InputError as e:
        log.warning("%s is left out of the package: its audio tokenizer %s: %s", DECODER_FILE, name, e)
        return None


def load_audio_tokenizer(config: Any) -> Any:
    """The audio tokenizer ``audio_tokenizer_folder`` finds, loaded as transformers loads it (float32), or
    None."""
    folder = audio_tokenizer_folder(config)
    if folder is None:
        return None
    import transformers

    codec = getattr(transformers, CODEC).from_pretrained(folder, dtype=torch.float32).eval()
    if codec.config.decoder_config is None:
        raise InputError(f"the audio tokenizer at {folder} has no decoder (decoder_config null)")
    if int(codec.config.latent_dim) != int(config.latent_dim):
        raise InputError(
            f"the audio tokenizer at {folder} decodes {codec.config.latent_dim}-dim latents; "
            f"{CLASS} makes {config.latent_dim}"
        )
    return codec


def flow_inputs(config: Any) -> list[str]:
    """``flow_head.onnx``'s inputs: an LSD head's times and step count, a drifting head's noise alone."""
    if _lsd(config):
        return ["condition", "latents", "start_times", "end_times", "num_flow_steps"]
    return ["condition", "latents"]


def stage_graphs(model: torch.nn.Module, config: Any) -> dict[str, GraphSpec]:
    """The two files' graphs."""
    if config.flow_head_config.flow_type not in ("lsd", "drifting"):
        raise InputError(
            f"{CLASS}'s flow head is {config.flow_head_config.flow_type!r}: the package knows the 'lsd' and "
            "'drifting' samplers only"
        )
    g = torch.Generator().manual_seed(0)
    layers, heads, size = _sizes(config)
    batch, tokens, past, dim = 2, 3, 4, int(config.latent_dim)
    b = torch.export.Dim(BATCH, min=1, max=1024)
    s = torch.export.Dim(SEQUENCE, min=1, max=1 << 20)
    p = torch.export.Dim(PAST, min=0, max=1 << 20)
    ids = torch.randint(0, int(config.vocab_size), (batch, tokens), generator=g)
    step_args: list[Any] = [
        ids,
        torch.randn(batch, tokens, dim, generator=g),
        torch.ones(batch, past + tokens, dtype=torch.int64),
        torch.arange(past, past + tokens).repeat(batch, 1),
        [torch.randn(batch, heads, past, size, generator=g) for _ in range(2 * layers)],
    ]
    step = GraphSpec(
        BackboneStep(model),
        tuple(pytree.tree_map(lambda t: t.to("meta"), step_args)),
        {
            "input_ids": {0: b, 1: s},
            "audio_latents": {0: b, 1: s},
            "attention_mask": {0: b, 1: TOTAL},
            "position_ids": {0: b, 1: s},
            "past_key_values": [{0: b, 2: p} for _ in range(2 * layers)],
        },
        [*STEP_INPUTS, *cache_names(layers, "past_key_values")],
        ["logits", "last_hidden_state", *cache_names(layers, "present")],
    )
    hidden = int(config.hidden_size)
    flow_args: list[torch.Tensor] = [
        torch.randn(batch, hidden, generator=g),
        torch.randn(batch, dim, generator=g),
    ]
    shapes: dict[str, Any] = {"condition": {0: b}, "latents": {0: b}}
    flow_module: torch.nn.Module = DriftingFlow(model)
    if _lsd(config):
        flow_args += [torch.zeros(batch, 1), torch.ones(batch, 1), torch.tensor(1.0)]
        shapes.update(start_times={0: b}, end_times={0: b}, num_flow_steps={})
        flow_module = FlowStep(model)
    flow = GraphSpec(
        flow_module,
        tuple(t.to("meta") for t in flow_args),
        shapes,
        flow_inputs(config),
        ["next_latents", "audio_latents"],
    )
    specs = {STEP_FILE: step, FLOW_FILE: flow}
    codec = load_audio_tokenizer(config)
    if codec is not None:  # a real model: its weights written into the package (none are the checkpoint's)
        specs[DECODER_FILE] = GraphSpec(
            LatentDecoder(codec),
            (torch.randn(batch, 5, dim, generator=g),),
            {"audio_latents": {0: b, 1: torch.export.Dim("frames", min=1, max=1 << 16)}},
            ["audio_latents"],
            ["waveform"],
        )
    return specs


def generation_settings(model: Any, **given: Any) -> dict[str, Any]:
    """``num_flow_steps``, ``eos_threshold`` and ``min_frames_before_eos``: ``given``, else the generation
    config's, else transformers' defaults (``DEFAULTS``)."""
    generation = model.generation_config
    out = {}
    for key, default in DEFAULTS.items():
        value = given.get(key)
        if value is None:
            value = getattr(generation, key, None)
        out[key] = default if value is None else value
    return out


def _placeholders(config: Any) -> list[int]:
    """The ids of the prompt's audio positions (the voice's BOS and frames, the audio BOS, the latents)."""
    keys = (
        "audio_prompt_bos_token_id",
        "audio_prompt_token_id",
        "audio_bos_token_id",
        "audio_latent_token_id",
    )
    return [int(getattr(config, k)) for k in keys]


def default_frames(config: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> int:
    """transformers' frame budget where ``max_new_tokens`` is not given: from the longest row's text."""
    placeholders = torch.tensor(_placeholders(config))
    text = ~torch.isin(input_ids, placeholders) & attention_mask.bool()
    return math.ceil((int(text.sum(-1).max()) / 3 + 2) * float(config.frame_rate))


def generated_by_sessions(
    sessions: dict[str, Any],
    run: Any,
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    frames_after_eos: torch.Tensor,
    max_new_tokens: int,
    noise: Callable[[int, int], torch.Tensor],
    prompt_latents: torch.Tensor | None = None,
    **settings: Any,
) -> dict[str, torch.Tensor]:
    """The module docstring's loop over the package's sessions (``run(session, names, tensors)``): the
    latents (b x frames x D, zero past each row's frames), their mask and each frame's end-of-speech
    logits (b x frames). ``noise(batch, latent_dim)`` gives a step's noise (zeros when greedy);
    ``prompt_latents`` the voice frames as the step's ``audio_latents`` (b x prompt x D)."""
    config = model.config
    chosen = generation_settings(model, **settings)
    flows, threshold, before = (
        int(chosen["num_flow_steps"]),
        float(chosen["eos_threshold"]),
        int(chosen["min_frames_before_eos"]),
    )
    if not _lsd(config):
        flows = 1
    layers, heads, size = _sizes(config)
    batch, dim = input_ids.shape[0], int(config.latent_dim)
    step_names = [*STEP_INPUTS, *cache_names(layers, "past_key_values")]
    cache = [torch.zeros(batch, heads, 0, size) for _ in range(2 * layers)]
    ids = input_ids
    latents_in = torch.zeros(*ids.shape, dim) if prompt_latents is None else prompt_latents
    mask = attention_mask.long()
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    running = torch.ones(batch, dtype=torch.bool)
    left = torch.full((batch,), -1, dtype=torch.long)
    counts = torch.zeros(batch, dtype=torch.long)
    frames: list[torch.Tensor] = []
    logits_kept: list[torch.Tensor] = []
    for k in range(max_new_tokens):
        logits, hidden, *cache = run(
            sessions[STEP_FILE], step_names, [ids, latents_in, mask, positions, *cache]
        )
        condition, eos = hidden[:, -1], logits[:, -1, 0]
        latents = noise(batch, dim)
        for i in range(flows):
            feeds = [condition, latents]
            if _lsd(config):
                feeds += [
                    torch.full((batch, 1), i / flows),
                    torch.full((batch, 1), (i + 1) / flows),
                    torch.tensor(float(flows)),
                ]
            latents, frame = run(sessions[FLOW_FILE], flow_inputs(config), feeds)
        frames.append(frame)
        logits_kept.append(eos)
        counts += running.long()
        ended = (left < 0) & (eos > threshold) & (k >= before)
        left = torch.where(ended, frames_after_eos, left)
        done = left == 0
        left = torch.where(left > 0, left - 1, left)
        running &= ~done & (k + 1 < max_new_tokens)
        if not bool(running.any()):
            break
        ids = torch.full((batch, 1), int(config.audio_latent_token_id))
        latents_in = latents[:, None, :]
        mask = torch.cat([mask, torch.ones(batch, 1, dtype=mask.dtype)], dim=1)
        positions = positions[:, -1:] + 1
    kept = (torch.arange(len(frames)) < counts[:, None]).long()
    stacked = torch.stack(frames, dim=1) * kept[..., None]
    return {"audio_latents": stacked, "audio_latents_mask": kept, "eos_logits": torch.stack(logits_kept, 1)}


def _prompt(
    config: Any, texts: tuple[int, ...], voices: tuple[int, ...], g: torch.Generator
) -> dict[str, Any]:
    """A left-padded batch of prompts as PocketTTSProcessor writes them: a voice's BOS and frames (where the
    row has a voice), the text, the audio BOS; the voices' latents as ``generate`` takes them (right-padded,
    with their mask) and as the step graph does (each prompt position its own)."""
    rows = []
    words_below = min(_placeholders(config))  # the text's ids: none of the placeholders
    for text, voice in zip(texts, voices, strict=True):
        words = torch.randint(min(3, words_below - 1), words_below, (text,), generator=g)
        head = (
            [int(config.audio_prompt_bos_token_id), *[int(config.audio_prompt_token_id)] * voice]
            if voice
            else []
        )
        rows.append(torch.tensor([*head, *words.tolist(), int(config.audio_bos_token_id)]))
    width = max(len(r) for r in rows)
    pad = int(config.pad_token_id)
    ids = torch.stack([torch.nn.functional.pad(r, (width - len(r), 0), value=pad) for r in rows])
    mask = torch.stack([torch.arange(width) >= width - len(r) for r in rows]).long()
    dim = int(config.latent_dim)
    voice_frames = [torch.randn(v, dim, generator=g) for v in voices]
    out: dict[str, Any] = {"input_ids": ids, "attention_mask": mask}
    placed = torch.zeros(len(rows), width, dim)
    for row, frames in enumerate(voice_frames):
        placed[row, ids[row] == int(config.audio_prompt_token_id)] = frames
    out["placed"] = placed
    if any(voices):
        out["audio_prompt_latents"] = torch.nn.utils.rnn.pad_sequence(voice_frames, batch_first=True)
        out["audio_prompt_latents_mask"] = torch.nn.utils.rnn.pad_sequence(
            [torch.ones(v, dtype=torch.long) for v in voices], batch_first=True
        )
    return out


@dataclass(frozen=True)
class Case:
    """One generation of the verification: each row's text tokens, voice frames and ``frames_after_eos``."""

    texts: tuple[int, ...]
    voices: tuple[int, ...]
    frames_after_eos: tuple[int, ...]
    beyond: int  # frames at most past min_frames_before_eos
    sample: bool
    num_flow_steps: int | None = None  # None: the generation config's


CHECKED = (
    Case(texts=(5,), voices=(0,), frames_after_eos=(1,), beyond=4, sample=False),
    Case(texts=(6, 3), voices=(3, 2), frames_after_eos=(3, 0), beyond=3, sample=True, num_flow_steps=2),
)
"""The verification's generations: one greedy prompt at the generation config's settings; a batch of two
prompts of other lengths, each with its voice, sampled (seeded noise) through two Euler steps a frame. Each
runs ``min_frames_before_eos`` + ``beyond`` frames at most: an end of speech can come, and a row end by it
and another by the budget."""
SEED = 0


def _noise(scale: float) -> Callable[[int, int], torch.Tensor]:
    def draw(batch: int, dim: int) -> torch.Tensor:
        return torch.randn(batch, dim) * scale  # the global generator, as transformers' _sample draws

    return draw


def check_package(
    sessions: dict[str, Any], model: Any, specs: dict[str, GraphSpec], run: Any, tolerance: Any
) -> list[VerificationInfo]:
    """The loop over the sessions against ``model.generate`` at the sizes of ``CHECKED``, both from the
    same seed: equal frame counts, the latents and end-of-speech logits within ``tolerance``; with the
    decoder, its waveforms against the audio tokenizer's decode of transformers' latents."""
    del specs
    infos: list[VerificationInfo] = []
    codec = load_audio_tokenizer(model.config) if DECODER_FILE in sessions else None
    temperature = float(getattr(model.generation_config, "temperature", None) or 1.0)
    for n, case in enumerate(CHECKED):
        prompt = _prompt(model.config, case.texts, case.voices, torch.Generator().manual_seed(n))
        after = torch.tensor(case.frames_after_eos)
        settings = {"num_flow_steps": case.num_flow_steps}
        budget = int(generation_settings(model)["min_frames_before_eos"]) + case.beyond
        scale = math.sqrt(temperature) if case.sample else 0.0
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(SEED)
            got = generated_by_sessions(
                sessions,
                run,
                model,
                prompt["input_ids"],
                prompt["attention_mask"],
                after,
                budget,
                _noise(scale),
                prompt["placed"],
                **settings,
            )
        voice = {k: v for k, v in prompt.items() if k.startswith("audio_prompt")}
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(SEED)
            want = model.generate(
                input_ids=prompt["input_ids"],
                attention_mask=prompt["attention_mask"],
                do_sample=case.sample,
                temperature=temperature,
                max_new_tokens=budget,
                frames_after_eos=after,
                return_dict_in_generate=True,
                output_scores=True,
                **voice,
                **{k: v for k, v in settings.items() if v is not None},
            )
        size = "x".join(str(t) for t in case.texts)
        infos.append(compare(f"frames ({size})", want.audio_latents_mask, got["audio_latents_mask"]))
        e, a = want.audio_latents, got["audio_latents"]
        infos.append(compare(f"audio_latents ({size})", e, a, *(tolerance(e) if e.shape == a.shape else ())))
        e = torch.stack(want.scores, dim=1)
        a = got["eos_logits"]
        infos.append(compare(f"eos logits ({size})", e, a, *(tolerance(e) if e.shape == a.shape else ())))
        if codec is not None:  # the batch decoded at once, as PocketTTSProcessor.decode does
            with torch.no_grad():
                e = codec.decode(want.audio_latents).audio_values[:, 0]
            (a,) = run(sessions[DECODER_FILE], ["audio_latents"], [got["audio_latents"]])
            infos.append(compare(f"waveform ({size})", e, a, *(tolerance(e) if e.shape == a.shape else ())))
    return infos


def eager_generate(model: Any) -> None:
    """What the architecture sweep's eager check runs: ``generate`` greedy on a short prompt, a few frames."""
    prompt = _prompt(model.config, (4,), (0,), torch.Generator().manual_seed(0))
    with torch.no_grad():
        model.generate(
            input_ids=prompt["input_ids"],
            attention_mask=prompt["attention_mask"],
            do_sample=False,
            max_new_tokens=3,
            frames_after_eos=1,
        )
