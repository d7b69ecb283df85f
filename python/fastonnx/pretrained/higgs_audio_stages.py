"""text-to-audio of HiggsAudioV2ForConditionalGeneration: transformers' ``generate`` and the audio
tokenizer's decode (HiggsAudioV2Processor's ``batch_decode``) as two graphs, the loop the runtime's.

Files (``b`` the batch, ``K`` = ``num_codebooks``, ``C`` = ``codebook_size`` of the model's config, ``L``
its layers, ``H`` x ``D`` its key/value heads and head size):

- ``decoder_model_merged.onnx``: one step of the Llama-like decoder with its dual (text / audio) layers,
  the first step and the later ones alike. ``input_ids`` (``b`` x ``sequence_length``),
  ``audio_input_ids`` (``b`` x ``sequence_length`` x K), ``attention_mask`` (``b`` x
  ``total_sequence_length``: past and new positions), ``position_ids`` (``b`` x ``sequence_length``) and
  ``past_key_values.%d.key`` / ``.value`` (``b`` x H x ``past_sequence_length`` x D; 0 positions on the
  first step) to ``logits`` (``b`` x ``sequence_length`` x ``K * C``: codebook ``k``'s scores at
  ``[k * C, (k + 1) * C)``) and ``present.%d.key`` / ``.value``. A position is an audio position where
  its ``input_ids`` is ``audio_token_id`` or ``audio_delay_token_id``: its input is the sum of its K
  codebooks' embeddings (``audio_input_ids``, codebook ``k``'s code at ``k * C + code`` of the audio
  table) and its layers take the audio norms and MLPs; any other position is a text token (its
  ``audio_input_ids`` are read but not used: give 0) through the text norms and MLPs. Attention is
  shared (causal, over the mask's positions).
- ``audio_tokenizer_decode.onnx``: HiggsAudioV2TokenizerModel's ``decode``. ``audio_codes`` (``b`` x K x
  ``frames``, codes below the tokenizer's ``codebook_size``) to ``audio_values`` (``b`` x 1 x samples):
  each quantizer's code vectors projected out and summed, ``fc2``, the DAC decoder (its transposed
  convolutions' output padding ``stride % 2``, no final tanh, as transformers adjusts it).

The audio tokenizer is a checkpoint of its own: the folder's ``processor_config.json`` names it
(``audio_tokenizer.audio_tokenizer_name_or_path``: a folder, absolute or relative to the checkpoint's,
or a Hub id in huggingface_hub's cache), as HiggsAudioV2Processor loads it. Its decode reads only the
quantizer's code vectors and output projections, ``fc2`` and the acoustic decoder; transformers'
HiggsAudioV2TokenizerModel (whose module imports torchaudio for its encoder's resampling) is not
needed to export it.

The loop (``generated_by_sessions``; what ``generate(input_ids, attention_mask, do_sample=False,
max_new_tokens=N)`` does; ``cfg`` the model's config, ``gen`` its generation config):

1. Prompt: ``input_ids`` (left-padded, ``attention_mask`` 0 on the padding; HiggsAudioV2Processor's chat
   template ends it with ``cfg.audio_bos_token_id``), ``position_ids`` = cumsum(mask) - 1, 0 on the
   padding. A voice prompt (``audio_input_ids``, ``b`` x frames x K, and its ``audio_input_ids_mask``,
   valid frames first) fills the placeholders (``audio_token_id`` / ``audio_delay_token_id``) in order,
   row by row (``b`` x ``sequence_length`` x K aligned with ``input_ids``, 0 elsewhere). Step 1 feeds it
   all with an empty cache.
2. The delay pattern (transformers' HiggsAudioV2DelayPatternLogitsProcessor), set on step 1 from the
   last K text tokens (``window``): ``bos[b, k] = k + 1``, less ``K - j`` where ``window`` holds
   ``audio_bos_token_id`` (``j`` its first index in the window), all 0 where no row's window holds one;
   ``eos[b, k] = k + 1``, less ``K - j`` likewise for ``audio_delay_token_id``. Each step, on the last
   position's logits as ``b`` x K x C: where ``bos >= 0`` only ``cfg.audio_stream_bos_id`` is allowed,
   then those ``bos`` decrease by 1; where the last text token is ``audio_delay_token_id`` the row's
   ``eos`` decrease by 1; where ``eos <= 0`` only ``cfg.audio_stream_eos_id`` is allowed (where both
   hold, nothing: every score -inf, the argmax 0, as in transformers). The argmax of each codebook is the
   new frame (``b`` x K).
3. Repetition-aware sampling, only where ``gen`` sets ``ras_win_len`` and ``ras_win_max_num_repeat``
   and audio frames precede: in the last ``ras_win_len`` frames (the voice prompt's padded frames
   included), a codebook whose new code is there ``ras_win_max_num_repeat`` times or more (stream bos
   and eos not counted) is drawn anew from softmax(its raw logits) (``torch.multinomial``, one draw
   each, batch-major, a call each step even with none to draw): a random draw, from torch's global
   generator as transformers draws it.
4. A finished row's frame is K times ``audio_stream_eos_id``. The frame is appended to the audio
   frames; the text token appended is ``audio_token_id``, ``audio_delay_token_id`` where the frame holds
   a stream eos or the last text token was the delay token, ``cfg.eos_token_id`` where the frame is all
   stream eos. A row finishes on ``gen.eos_token_id`` (any of them) or after N frames; stop when every
   row has.
5. Each later step feeds the new frame alone: ``input_ids`` ``audio_token_id`` (an audio position),
   ``audio_input_ids`` the frame, the mask grown by a 1, the next position, the cache.
6. Decode (``batch_decode``): from the last frame that is all ``audio_stream_bos_id`` (the batch's last
   such, flattened row-major), each row's frames after it up to its first all-``audio_stream_eos_id``
   frame; the delay undone (codebook ``k`` its codes ``[k, frames - K + 1 + k)``), clipped to
   ``[0, audio_stream_bos_id - 1]``; ``audio_tokenizer_decode`` row by row (1 x K x frames), its
   waveform ``audio_values[0, 0]``.

Sampling (``do_sample``, temperature, top-k, top-p: applied per codebook after step 2) is the runtime's
choice over the same logits; the check runs greedy.

The check (``check_package``) runs this loop over the onnxruntime sessions and transformers' ``generate``
then HiggsAudioV2Processor's ``batch_decode``, each from torch's generator seeded alike (step 3's draws),
on a text prompt and a voice prompt (``check_inputs``): the frames equal, each row's waveform within the
tolerances. The waveform's reference is transformers' HiggsAudioV2TokenizerModel where torchaudio is
installed, else ``TokenizerDecode`` run in torch (transformers' DAC decoder, the checkpoint's weights),
which the report names.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

import torch

from fastonnx.diagnostics.verdicts import VerificationInfo, compare
from fastonnx.errors import InputError
from fastonnx.pretrained.graph_spec import BATCH, PAST, SEQUENCE, TOTAL, GraphSpec
from fastonnx.pretrained.loop_caches import cache_names
from fastonnx.pretrained.task_inputs import cache_of
from fastonnx.torch_internals import pytree

CLASSES = frozenset({"HiggsAudioV2ForConditionalGeneration"})
DECODER_FILE, DECODE_FILE = "decoder_model_merged.onnx", "audio_tokenizer_decode.onnx"
STEP_INPUTS = ["input_ids", "audio_input_ids", "attention_mask", "position_ids"]
PROCESSOR_FILE = "processor_config.json"


def own_layout(model: torch.nn.Module) -> bool:
    return type(model).__name__ in CLASSES


def _layer(layer: Any, hidden: torch.Tensor, audio: torch.Tensor, **attention: Any) -> torch.Tensor:
    """HiggsAudioV2DecoderLayer's forward with its text / audio choice made per position by ``audio``
    (``b`` x s x 1): transformers scatters the positions of each kind through its own norms and MLP
    (boolean indexing, shapes torch.export cannot keep); each is per position, so computing both on
    every position and keeping one is the same."""
    normed = torch.where(audio, layer.audio_input_layernorm(hidden), layer.input_layernorm(hidden))
    out, _ = layer.self_attn(hidden_states=normed, **attention)
    hidden = hidden + out
    text = layer.mlp(layer.post_attention_layernorm(hidden))
    speech = layer.audio_mlp(layer.audio_post_attention_layernorm(hidden))
    return hidden + torch.where(audio, speech, text)


class DecoderStep(torch.nn.Module):
    """One step of the decoder: the module docstring's ``decoder_model_merged.onnx``."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        input_ids: torch.Tensor,
        audio_input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past_key_values: list[torch.Tensor],
    ) -> tuple[torch.Tensor, ...]:
        from transformers.masking_utils import create_causal_mask

        model: Any = self.model
        inner, config = model.model, model.config
        audio = (input_ids == int(config.audio_token_id)) | (input_ids == int(config.audio_delay_token_id))
        audio = audio.unsqueeze(-1)
        embeds = torch.where(audio, inner.embed_audio_tokens(audio_input_ids), inner.embed_tokens(input_ids))
        cache = cache_of(past_key_values)
        mask = create_causal_mask(
            config=inner.config,
            inputs_embeds=embeds,
            attention_mask=attention_mask,
            past_key_values=cache,
            position_ids=position_ids,
        )
        positions = inner.rotary_emb(embeds, position_ids)
        hidden = embeds
        for layer in inner.layers[: int(config.num_hidden_layers)]:
            hidden = _layer(
                layer,
                hidden,
                audio,
                attention_mask=mask,
                past_key_values=cache,
                position_embeddings=positions,
            )
        logits = model.audio_lm_head(inner.norm(hidden))
        return (logits, *[t for layer in cache.layers for t in (layer.keys, layer.values)])


class _Codebook(torch.nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self.embed = torch.nn.Buffer(torch.zeros(size, dim))


class _Quantization(torch.nn.Module):
    """One quantizer's decode side: its code vectors (``codebook.embed``) and ``project_out``."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.codebook = _Codebook(int(config.codebook_size), int(config.codebook_dim))
        self.project_out = torch.nn.Linear(int(config.codebook_dim), int(config.hidden_size))


class _Quantizer(torch.nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.quantizers = torch.nn.ModuleList(
            _Quantization(config) for _ in range(int(config.num_quantizers))
        )


def adjust_dac_decoder(decoder: torch.nn.Module) -> None:
    """What HiggsAudioV2TokenizerModel does to the DAC decoder it builds: each transposed convolution's
    output padding ``stride % 2``, the final tanh removed."""
    for module in decoder.modules():
        if isinstance(module, torch.nn.ConvTranspose1d):
            module.output_padding = (int(module.stride[0]) % 2,)
    if isinstance(getattr(decoder, "tanh", None), torch.nn.Tanh):
        decoder.tanh = torch.nn.Identity()


class TokenizerDecode(torch.nn.Module):
    """HiggsAudioV2TokenizerModel's ``decode``, its modules under transformers' names (the tokenizer
    checkpoint's keys): ``quantizer.quantizers.%d.codebook.embed`` / ``.project_out``, ``fc2``,
    ``acoustic_decoder``."""

    def __init__(self, config: Any) -> None:
        from transformers.models.dac.modeling_dac import DacDecoder

        super().__init__()
        self.config = config
        self.quantizer = _Quantizer(config)
        self.fc2 = torch.nn.Linear(int(config.hidden_size), int(config.acoustic_model_config.hidden_size))
        self.acoustic_decoder = DacDecoder(config.acoustic_model_config)
        adjust_dac_decoder(self.acoustic_decoder)

    def forward(self, audio_codes: torch.Tensor) -> torch.Tensor:
        quantized: Any = 0.0
        quantizer: Any
        for i, quantizer in enumerate(self.quantizer.quantizers):
            vectors = torch.nn.functional.embedding(audio_codes[:, i], quantizer.codebook.embed)
            quantized = quantized + quantizer.project_out(vectors)  # b x frames x hidden
        # channels first, contiguous: the decoder's convolutions on a transposed view guard frames != 1
        acoustic = self.fc2(quantized).transpose(1, 2).clone(memory_format=torch.contiguous_format)
        out: torch.Tensor = self.acoustic_decoder(acoustic)
        return out


def audio_tokenizer_path(checkpoint: pathlib.Path) -> pathlib.Path:
    """The audio tokenizer's folder ``processor_config.json`` names (the module docstring); an
    InputError where it names none or it is not there."""
    from fastonnx.pretrained.folder import resolve_folder

    config = checkpoint / PROCESSOR_FILE
    named = None
    if config.is_file():
        entry = json.loads(config.read_text(encoding="utf-8")).get("audio_tokenizer")
        named = entry.get("audio_tokenizer_name_or_path") if isinstance(entry, dict) else None
    if not isinstance(named, str) or not named:
        raise InputError(
            f"HiggsAudioV2ForConditionalGeneration generates audio codes that its audio tokenizer "
            f"(HiggsAudioV2TokenizerModel, a checkpoint of its own) decodes: {checkpoint} has no "
            f"{PROCESSOR_FILE} naming it (audio_tokenizer.audio_tokenizer_name_or_path), as "
            "HiggsAudioV2Processor's does"
        )
    beside = checkpoint / named
    found = resolve_folder(beside if beside.is_dir() else named)
    if not (found / "config.json").is_file():
        raise InputError(f"the audio tokenizer {named} ({found}) has no config.json")
    return found


def load_tokenizer_decode(path: pathlib.Path) -> TokenizerDecode:
    """``TokenizerDecode`` with the tokenizer checkpoint's weights (every one its decode reads)."""
    from safetensors import safe_open
    from transformers import AutoConfig

    from fastonnx.pretrained.folder import read_folder

    config = AutoConfig.from_pretrained(path)
    if config.model_type != "higgs_audio_v2_tokenizer":
        raise InputError(
            f"the audio tokenizer at {path} is a {config.model_type}, not higgs_audio_v2_tokenizer"
        )
    decode = TokenizerDecode(config).eval()
    wanted = decode.state_dict()
    found: dict[str, torch.Tensor] = {}
    for shard in read_folder(path).shards:  # only the decode's tensors read (not the encoders')
        with safe_open(os.fspath(shard), framework="pt") as f:
            found.update({k: f.get_tensor(k) for k in f.keys() if k in wanted})
    missing = sorted(set(wanted) - set(found))
    if missing:
        raise InputError(
            f"the audio tokenizer at {path} lacks weights its decode reads: {', '.join(missing[:5])}"
            + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        )
    decode.load_state_dict({k: v.float() for k, v in found.items()})
    return decode


def save_tokenizer_decode(
    decode: TokenizerDecode, checkpoint: pathlib.Path, name: str = "audio_tokenizer"
) -> None:
    """Writes ``decode``'s weights and config as an audio tokenizer checkpoint ``checkpoint / name`` and
    names it in the checkpoint's ``processor_config.json`` (what ``audio_tokenizer_path`` reads)."""
    from safetensors.torch import save_file

    folder = checkpoint / name
    folder.mkdir(parents=True, exist_ok=True)
    decode.config.save_pretrained(folder)
    save_file(
        {k: v.contiguous() for k, v in decode.state_dict().items()}, os.fspath(folder / "model.safetensors")
    )
    processor = checkpoint / PROCESSOR_FILE
    settings = json.loads(processor.read_text(encoding="utf-8")) if processor.is_file() else {}
    settings["audio_tokenizer"] = {
        "audio_tokenizer_class": "HiggsAudioV2TokenizerModel",
        "audio_tokenizer_name_or_path": name,
    }
    settings.setdefault("processor_class", "HiggsAudioV2Processor")
    processor.write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")


def sizes(model: Any) -> tuple[int, int, int, int, int]:
    """(layers, key/value heads, head size, codebooks, codebook size)."""
    c = model.config
    heads = int(c.num_key_value_heads or c.num_attention_heads)
    size = int(c.head_dim or c.hidden_size // c.num_attention_heads)
    return int(c.num_hidden_layers), heads, size, int(c.num_codebooks), int(c.codebook_size)


def refuse_unsupported(model: Any, tokenizer: Any) -> None:
    books = int(model.config.num_codebooks)
    if int(tokenizer.num_quantizers) != books:
        raise InputError(
            f"the audio tokenizer decodes {tokenizer.num_quantizers} codebooks, the model generates {books}"
        )
    bos = int(model.config.audio_stream_bos_id)
    if bos > int(tokenizer.codebook_size):
        raise InputError(
            f"the model's audio_stream_bos_id ({bos}) is past the audio tokenizer's codebook_size "
            f"({tokenizer.codebook_size}): the decode's codes are clipped below it"
        )


def stage_graphs(model: torch.nn.Module, config: Any) -> dict[str, GraphSpec]:
    """The two files' graphs, the decoder's at examples on the meta device; the audio tokenizer's decode
    (a real module: its weights are not the model checkpoint's) from the folder ``config`` was read from."""
    decode = load_tokenizer_decode(audio_tokenizer_path(pathlib.Path(config.name_or_path)))
    refuse_unsupported(model, decode.config)
    layers, heads, size, books, codes = sizes(model)
    m: Any = model
    g = torch.Generator().manual_seed(0)
    batch, tokens, past = 2, 3, 4
    b = torch.export.Dim(BATCH, min=1, max=1024)
    s = torch.export.Dim(SEQUENCE, min=1, max=1 << 20)
    p = torch.export.Dim(PAST, min=0, max=1 << 20)
    ids = torch.randint(0, int(m.config.vocab_size), (batch, tokens), generator=g)
    ids[0, 0] = int(m.config.audio_token_id)  # both kinds of positions in the example
    args = (
        ids,
        torch.randint(0, codes, (batch, tokens, books), generator=g),
        torch.ones(batch, past + tokens, dtype=torch.int64),
        torch.arange(past, past + tokens).repeat(batch, 1),
        [torch.randn(batch, heads, past, size, generator=g) for _ in range(2 * layers)],
    )
    step = GraphSpec(
        DecoderStep(model),
        tuple(pytree.tree_map(lambda t: t.to("meta"), args)),
        {
            "input_ids": {0: b, 1: s},
            "audio_input_ids": {0: b, 1: s},
            "attention_mask": {0: b, 1: TOTAL},
            "position_ids": {0: b, 1: s},
            "past_key_values": [{0: b, 2: p} for _ in range(2 * layers)],
        },
        [*STEP_INPUTS, *cache_names(layers, "past_key_values")],
        ["logits", *cache_names(layers, "present")],
    )
    frames = torch.export.Dim("frames", min=1, max=1 << 20)
    example = torch.randint(0, int(decode.config.codebook_size), (2, books, 5), generator=g)
    codec = GraphSpec(
        decode, (example,), {"audio_codes": {0: b, 2: frames}}, ["audio_codes"], ["audio_values"]
    )
    return {DECODER_FILE: step, DECODE_FILE: codec}


class DelayPattern:
    """Step 2 of the module docstring: the delay pattern's state over one generation."""

    def __init__(self, config: Any) -> None:
        self.config = config
        self.books, self.size = int(config.num_codebooks), int(config.codebook_size)
        self.bos: torch.Tensor | None = None
        self.eos: torch.Tensor | None = None

    def _start(self, window: torch.Tensor, token: int, none_found: str) -> torch.Tensor:
        delays = torch.arange(1, self.books + 1).repeat(window.shape[0], 1)
        found = window == token
        if not bool(found.any()):
            return torch.zeros_like(delays) if none_found == "zeros" else delays
        for row in range(window.shape[0]):
            columns = found[row].nonzero()
            if len(columns):
                delays[row] -= self.books - int(columns[0, 0])
        return delays

    def __call__(self, text: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        c = self.config
        scores = scores.reshape(-1, self.books, self.size).clone()
        window = text[:, -self.books :]
        if self.bos is None:
            self.bos = self._start(window, int(c.audio_bos_token_id), "zeros")
        if self.eos is None:
            self.eos = self._start(window, int(c.audio_delay_token_id), "pattern")
        codes = torch.arange(self.size)
        forced = self.bos >= 0
        scores[forced.unsqueeze(-1) & (codes != int(c.audio_stream_bos_id))] = -torch.inf
        self.bos[forced] -= 1
        self.eos[text[:, -1] == int(c.audio_delay_token_id)] -= 1
        ending = self.eos <= 0
        scores[ending.unsqueeze(-1) & (codes != int(c.audio_stream_eos_id))] = -torch.inf
        return scores


def _ids(value: Any) -> list[int]:
    return [] if value is None else [int(v) for v in (value if isinstance(value, list) else [value])]


def generated_frames(
    step: Any,
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    max_new_tokens: int,
    audio_input_ids: torch.Tensor | None = None,
    audio_input_ids_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Steps 1 to 5 of the module docstring over ``step(input_ids, audio_input_ids, attention_mask,
    position_ids)`` (the last position's logits, the cache kept by ``step``): the audio frames ``generate``
    returns (the voice prompt's, then the generated ones: ``b`` x frames x K)."""
    if max_new_tokens < 1:
        raise InputError(f"max_new_tokens must be 1 or more, got {max_new_tokens}")
    c, gen = model.config, model.generation_config
    batch = input_ids.shape[0]
    books = int(c.num_codebooks)
    placeholder = (input_ids == int(c.audio_token_id)) | (input_ids == int(c.audio_delay_token_id))
    aligned = torch.zeros(*input_ids.shape, books, dtype=torch.int64)
    if audio_input_ids is not None:
        valid = (
            audio_input_ids_mask
            if audio_input_ids_mask is not None
            else torch.ones(audio_input_ids.shape[:2])
        )
        aligned[placeholder] = audio_input_ids[valid.bool()]
    positions = (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 0)
    delays = DelayPattern(c)
    ras = getattr(gen, "ras_win_len", None), getattr(gen, "ras_win_max_num_repeat", None)
    stops, eos = _ids(gen.eos_token_id), c.eos_token_id
    text, mask = input_ids, attention_mask
    frames = (
        audio_input_ids if audio_input_ids is not None else torch.zeros(batch, 0, books, dtype=torch.int64)
    )
    prompted = audio_input_ids is not None  # transformers' audio_input_ids: None until a frame is made
    unfinished = torch.ones(batch, dtype=torch.bool)
    fed: tuple[torch.Tensor, torch.Tensor, torch.Tensor] = (input_ids, aligned, positions)
    bos, stream_eos = int(c.audio_stream_bos_id), int(c.audio_stream_eos_id)
    for generated in range(max_new_tokens):
        logits = step(fed[0], fed[1], mask, fed[2]).float()
        new = delays(text, logits).argmax(-1)  # b x K
        if ras[0] is not None and ras[1] is not None and (prompted or generated > 0):
            window = frames[:, -int(ras[0]) :, :]
            repeats = ((window == new.unsqueeze(1)) & (window != bos) & (window != stream_eos)).sum(1)
            redraw = repeats >= int(ras[1])
            raw = logits.reshape(batch, books, -1)
            new[redraw] = raw[redraw].softmax(dim=-1).multinomial(1, replacement=True).view(-1)
        if stops:
            new = torch.where(unfinished.unsqueeze(1), new, stream_eos)
        some_eos, all_eos = (new == stream_eos).any(-1), (new == stream_eos).all(-1)
        frames = torch.cat([frames, new.unsqueeze(1)], dim=1)
        token = torch.full((batch,), int(c.audio_token_id))
        token[some_eos | (text[:, -1] == int(c.audio_delay_token_id))] = int(c.audio_delay_token_id)
        if eos is not None:
            token[all_eos] = int(eos)
        text = torch.cat([text, token.unsqueeze(1)], dim=1)
        if stops:
            unfinished &= ~torch.isin(token, torch.tensor(stops))
        if not bool(unfinished.any()) or generated + 1 == max_new_tokens:
            break
        mask = torch.cat([mask, torch.ones(batch, 1, dtype=mask.dtype)], dim=1)
        position = fed[2][:, -1:] + 1
        fed = (torch.full((batch, 1), int(c.audio_token_id)), new.unsqueeze(1), position)
    return frames


def revert_delay(codes: torch.Tensor) -> torch.Tensor:
    """frames x K codes with codebook ``k`` delayed by ``k``: the aligned frames (frames - K + 1) x K."""
    count, books = codes.shape
    return torch.stack([codes[k : count - books + 1 + k, k] for k in range(books)], dim=1)


def decoded_rows(frames: torch.Tensor, config: Any) -> list[torch.Tensor]:
    """Step 6 of the module docstring: each row's codes for the decode, 1 x K x frames."""
    bos, eos = int(config.audio_stream_bos_id), int(config.audio_stream_eos_id)
    starts = (frames == bos).all(-1).nonzero()
    if not len(starts):
        raise InputError("the audio frames hold no all-bos frame: no generation to decode")
    frames = frames[:, int(starts[-1, -1]) :]
    rows = []
    for row in frames:
        ends = (row == eos).all(-1).nonzero()
        end = int(ends[0, 0]) if len(ends) else row.shape[0]
        codes = revert_delay(row[1:end]).clip(0, bos - 1)
        rows.append(codes.transpose(0, 1).unsqueeze(0))
    return rows


def generated_by_sessions(
    sessions: dict[str, Any],
    run: Any,
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    max_new_tokens: int,
    audio_input_ids: torch.Tensor | None = None,
    audio_input_ids_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The module docstring's loop over the package's sessions (``run(session, names, tensors)``): the
    audio frames and each row's waveform."""
    layers, heads, size, _, _ = sizes(model)
    cache = [torch.zeros(input_ids.shape[0], heads, 0, size) for _ in range(2 * layers)]
    names = [*STEP_INPUTS, *cache_names(layers, "past_key_values")]

    def step(*inputs: torch.Tensor) -> torch.Tensor:
        nonlocal cache
        logits, *cache = run(sessions[DECODER_FILE], names, [*inputs, *cache])
        last: torch.Tensor = logits[:, -1]
        return last

    frames = generated_frames(
        step, model, input_ids, attention_mask, max_new_tokens, audio_input_ids, audio_input_ids_mask
    )
    waves = [
        run(sessions[DECODE_FILE], ["audio_codes"], [codes])[0][0, 0]
        for codes in decoded_rows(frames, model.config)
    ]
    return frames, waves


def reference_decode(path: pathlib.Path) -> tuple[Any, str]:
    """What the check decodes the codes with: transformers' HiggsAudioV2TokenizerModel where it imports
    (torchaudio installed), else ``TokenizerDecode`` eager with the checkpoint's weights; and its name."""
    from transformers.utils.import_utils import is_torchaudio_available

    if is_torchaudio_available():
        from transformers import HiggsAudioV2TokenizerModel

        tokenizer: Any = HiggsAudioV2TokenizerModel.from_pretrained(path, dtype=torch.float32)
        tokenizer.eval()
        return (lambda codes: tokenizer.decode(codes, return_dict=False)), "HiggsAudioV2TokenizerModel.decode"
    # transformers' class imports torchaudio: its decode's modules run here with the checkpoint's weights
    return load_tokenizer_decode(path), "the decode's modules in torch: no torchaudio"


def check_inputs(model: Any) -> list[dict[str, torch.Tensor]]:
    """Two prompts of two rows, the second left-padded, ending on the audio bos token as the chat
    template ends them: text alone, and with a voice prompt (random codes of a few frames at the placeholders of the first row, one frame
    fewer in the second)."""
    c = model.config
    books = int(c.num_codebooks)
    specials = {int(c.audio_token_id), int(c.audio_delay_token_id), int(c.audio_bos_token_id)}
    specials |= set(_ids(c.eos_token_id)) | set(_ids(model.generation_config.eos_token_id))
    g = torch.Generator().manual_seed(0)
    words = [t for t in range(3, int(c.vocab_size)) if t not in specials]

    def text(n: int) -> list[int]:
        return [words[int(i)] for i in torch.randint(0, len(words), (n,), generator=g)]

    def batch(rows: list[list[int]]) -> dict[str, torch.Tensor]:
        width = max(len(r) for r in rows)
        pad = int(c.pad_token_id or 0)
        ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
        return {"input_ids": ids, "attention_mask": mask}

    bos = int(c.audio_bos_token_id)
    # wider than K tokens: the delay pattern reads the bos in the last K (transformers counts its place
    # from K, not from a shorter prompt's width: no all-bos first frame then)
    plain = batch([[*text(books + 2), bos], [*text(3), bos]])
    counts = (books + 2, books + 1)
    rows = []
    for n in counts:
        placeholders = [int(c.audio_token_id)] * (n - books + 1) + [int(c.audio_delay_token_id)] * (books - 1)
        # K text tokens after the voice: the pattern's window holds no delay token (the chat template's
        # turn markers), or the eos would be forced with the bos
        rows.append([*text(2), bos, *placeholders, *text(books), bos])
    voiced = batch(rows)
    audio = torch.randint(0, int(c.audio_stream_bos_id), (2, max(counts), books), generator=g)
    voiced["audio_input_ids"] = audio.masked_fill(
        torch.arange(max(counts))[None, :, None] >= torch.tensor(counts)[:, None, None],
        int(c.audio_stream_eos_id),
    )
    voiced["audio_input_ids_mask"] = torch.arange(max(counts))[None, :] < torch.tensor(counts)[:, None]
    return [plain, voiced]


NEW_TOKENS = 12
"""The frames each verification generates at most: past the delay pattern's K bos frames and K - 1 of
the decode's delay (the tiny checkpoints' K = 4)."""


def _processor(model: Any, decode: Any) -> Any:
    """What HiggsAudioV2Processor's ``batch_decode`` reads of its processor, ``decode`` its audio
    tokenizer's ``decode``."""
    from transformers import HiggsAudioV2Processor

    c = model.config

    class Decoded:
        def __init__(self, codes: torch.Tensor) -> None:
            self.audio_values = decode(codes)

    class Processor:
        audio_stream_bos_id, audio_stream_eos_id = int(c.audio_stream_bos_id), int(c.audio_stream_eos_id)
        audio_tokenizer = type("AudioTokenizer", (), {"decode": staticmethod(Decoded)})

        @staticmethod
        def revert_delay_pattern(ids: torch.Tensor) -> torch.Tensor:
            reverted: torch.Tensor = HiggsAudioV2Processor.revert_delay_pattern(None, ids)  # type: ignore[no-untyped-call, arg-type]
            return reverted

    return Processor()


def check_prompt(
    sessions: dict[str, Any],
    model: Any,
    run: Any,
    tolerance: Any,
    inputs: dict[str, torch.Tensor],
    seed: int,
    reference: tuple[Any, str],
) -> list[VerificationInfo]:
    """One prompt of ``check_package``: the loop over the sessions and transformers' ``generate`` from
    torch's generator seeded with ``seed`` (the repetition-aware sampling's draws), the frames and each
    row's waveform (``reference``: ``reference_decode``'s)."""
    from transformers import HiggsAudioV2Processor

    decode, decoded_by = reference
    torch.manual_seed(seed)
    frames, waves = generated_by_sessions(sessions, run, model, max_new_tokens=NEW_TOKENS, **inputs)
    torch.manual_seed(seed)
    with torch.no_grad():
        want = model.generate(**inputs, do_sample=False, max_new_tokens=NEW_TOKENS)
        expected = HiggsAudioV2Processor.batch_decode(_processor(model, decode), want)  # type: ignore[no-untyped-call]
    name = "voice prompt" if "audio_input_ids" in inputs else "text"
    infos = [compare(f"audio frames ({name})", want, frames)]
    for row, (e, a) in enumerate(zip(expected, waves, strict=True)):
        e = e.reshape(-1)
        at = tolerance(e) if e.shape == a.shape else ()
        infos.append(compare(f"waveform ({name}, row {row}; {decoded_by})", e, a, *at))
    return infos


def check_package(
    sessions: dict[str, Any], model: Any, specs: dict[str, GraphSpec], run: Any, tolerance: Any
) -> list[VerificationInfo]:
    """The loop over the sessions against ``generate(do_sample=False, max_new_tokens=NEW_TOKENS)`` and
    HiggsAudioV2Processor's ``batch_decode``, on each of ``check_inputs``: equal frames, the waveforms
    within ``tolerance``."""
    del specs
    reference = reference_decode(audio_tokenizer_path(pathlib.Path(model.config.name_or_path)))
    infos: list[VerificationInfo] = []
    for seed, inputs in enumerate(check_inputs(model)):
        infos += check_prompt(sessions, model, run, tolerance, inputs, seed, reference)
    return infos
