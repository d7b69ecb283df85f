"""text-to-audio of MusicgenForConditionalGeneration: transformers' ``generate`` as three graphs (the layout
of optimum's and transformers.js' MusicGen packages), the generation loop itself the runtime's.

- ``text_encoder.onnx``: ``input_ids``, ``attention_mask`` (``batch_size`` x ``encoder_sequence_length``)
  to ``encoder_hidden_states``: the T5 encoder's states, through MusicGen's ``enc_to_dec_proj`` where the
  model has one (a text encoder narrower or wider than the decoder), times the attention mask (padded
  rows zero), as MusicGen's forward hands them to its decoder: the decoder step reads them as they are.
- ``decoder_model_merged.onnx``: one decoder step, the first and the later ones alike. ``input_ids``
  (``batch_size * num_codebooks`` x ``decoder_sequence_length``: a row a codebook, row ``b * K + k`` the
  codebook ``k`` of the batch's row ``b``), ``encoder_hidden_states``, ``encoder_attention_mask`` and the
  cache ``past_key_values.%d.decoder.key`` / ``.value`` (self-attention, ``past_decoder_sequence_length``)
  and ``past_key_values.%d.encoder.key`` / ``.value`` (cross-attention, ``past_encoder_sequence_length``)
  to ``logits`` (``batch_size * num_codebooks`` x ``decoder_sequence_length`` x vocabulary) and
  ``present.*`` named alike. The cache is ``batch_size`` x heads x length x head size. On the first step
  both pasts have length 0 and the cross-attention keys and values are projected from
  ``encoder_hidden_states``; on the later ones the cross past holds them all and nothing is projected
  (the graph projects the states' rows past the cross past's length: all of them, or none), so
  ``present.*.encoder`` is fed back unchanged.
- ``encodec_decode.onnx``: ``audio_codes`` (1 x ``batch_size`` x ``num_codebooks`` x ``frames``) to
  ``audio_values`` (``batch_size`` x channels x samples): ``model.audio_encoder.decode`` as ``generate``
  calls it (no audio scales; a stereo decoder's codebooks interleave left and right: each half decoded
  on its own and the two concatenated as channels).

The loop (what ``generate(input_ids, attention_mask, do_sample=False, guidance_scale=G,
max_new_tokens=N)`` does, ``generated_by_sessions`` below; ``K = num_codebooks``, ``B`` the batch):

1. ``encoder_hidden_states = text_encoder(input_ids, attention_mask)``. With guidance (``G > 1``) the
   batch is doubled with unconditional rows: the states concatenated with zeros of their shape, the
   mask with zeros (``2B`` rows; the first ``B`` conditional).
2. The delay pattern (``build_delay_pattern_mask`` for a one-token prompt, ``delay_pattern`` below): a
   ``B*K`` x ``L`` matrix, ``L = N + 1``, ``start = generation_config.decoder_start_token_id`` (else
   its ``bos_token_id``): ``start`` where codebook ``k`` is delayed (``c = k``, or ``k // 2`` for
   stereo, ``C`` the codebooks of a channel: column ``j <= c`` or ``j >= L - C + 1 + c``), -1 where a
   token is generated. Where ``L < 2C - 1`` nothing is delayed (all -1), as transformers does.
3. The sequence starts as its column 0 (``start``). Each of ``N`` steps feeds the new column(s) as
   ``input_ids`` (repeated twice along the rows with guidance) with the cache (empty at first), takes
   the last position's logits (``rows x vocabulary``), with guidance ``uncond + (cond - uncond) * G``
   (``cond`` the first half of the rows), the argmax of each row, replaced by the pattern's value where
   it is not -1, appended as the next column.
4. The codes are the sequence's tokens other than ``generation_config.pad_token_id``, reshaped to ``B`` x
   ``K`` x frames (``L - C`` frames with the pattern) and given a leading 1: ``encodec_decode``'s
   ``audio_codes``.

Sampling (the released checkpoints' ``do_sample=True``, ``top_k``) replaces the argmax; the package is
verified greedily.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from fastonnx.diagnostics.verdicts import VerificationInfo, compare
from fastonnx.errors import InputError
from fastonnx.pretrained.graph_spec import BATCH, GraphSpec
from fastonnx.pretrained.task_inputs import cache_of, empty_layers, seq2seq_cache_names
from fastonnx.torch_internals import pytree

CLASSES = frozenset({"MusicgenForConditionalGeneration"})
"""The classes exported as their generation loop's three graphs."""

TEXT_ENCODER_FILE, DECODER_FILE, DECODE_FILE = (
    "text_encoder.onnx",
    "decoder_model_merged.onnx",
    "encodec_decode.onnx",
)
ENCODER_SEQUENCE, DECODER_SEQUENCE, PAST_DECODER, PAST_ENCODER, FRAMES = (
    "encoder_sequence_length",
    "decoder_sequence_length",
    "past_decoder_sequence_length",
    "past_encoder_sequence_length",
    "frames",
)
STEP_INPUTS = ["input_ids", "encoder_hidden_states", "encoder_attention_mask"]


def own_layout(model: torch.nn.Module) -> bool:
    return type(model).__name__ in CLASSES


def projects(model: Any) -> bool:
    """Whether MusicGen's forward projects the text encoder's states (``enc_to_dec_proj``): their widths
    differ and the decoder declares no ``cross_attention_hidden_size`` of its own."""
    config = model.config
    return bool(
        config.text_encoder.hidden_size != config.decoder.hidden_size
        and config.decoder.cross_attention_hidden_size is None
    )


class TextEncoder(torch.nn.Module):
    """The T5 encoder's states as the decoder reads them: projected where the model projects (``project``,
    by default ``projects``: MusicGen Melody's rule is its own), padded rows zeroed (MusicGen's forward
    multiplies them by the mask)."""

    def __init__(self, model: torch.nn.Module, project: bool | None = None) -> None:
        super().__init__()
        self.model = model
        self.project = project

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        model: Any = self.model
        states: torch.Tensor = model.text_encoder(
            input_ids=input_ids, attention_mask=attention_mask
        ).last_hidden_state
        if projects(model) if self.project is None else self.project:
            states = model.enc_to_dec_proj(states)
        return states * attention_mask[..., None]


def cross_keys(
    projection: torch.nn.Linear, heads: int, past: torch.Tensor, rows: torch.Tensor
) -> torch.Tensor:
    """The cross-attention's keys (its ``k_proj``) or values (``v_proj``): the past's, then the projection
    of the encoder states' rows past its length (``rows``: the states sequence-first): all of them on
    the first step (an empty past), none on the later ones (the past holds them all). Sequence-first, a
    slice of the rows stays contiguous: no guard on its length, which the later steps make 0."""
    new = projection(rows[past.shape[2] :])  # new rows x batch x width
    return torch.cat([past, new.unflatten(-1, (heads, -1)).permute(1, 2, 0, 3)], dim=2)


def text_encoder_spec(
    module: torch.nn.Module, vocab: int, shape: tuple[int, int], dims: tuple[Any, Any], g: torch.Generator
) -> tuple[GraphSpec, torch.Tensor]:
    """``text_encoder.onnx``'s spec (MusicGen's and Melody's): ids and mask of ``shape`` (batch, tokens)
    over the ``dims`` (batch, encoder sequence) to ``encoder_hidden_states``; and the example mask."""
    ids = torch.randint(min(3, vocab - 1), vocab, shape, generator=g)
    mask = torch.ones(shape, dtype=torch.int64)
    text = {0: dims[0], 1: dims[1]}
    spec = GraphSpec(
        module,
        (ids.to("meta"), mask.to("meta")),
        {"input_ids": text, "attention_mask": text},
        ["input_ids", "attention_mask"],
        ["encoder_hidden_states"],
    )
    return spec, mask


class DecoderStep(torch.nn.Module):
    """One step of the decoder (``MusicgenForCausalLM``) over the text encoder's states: the self- and
    cross-attention cache in (empty on the first step), logits and the grown cache out."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        input_ids: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        encoder_attention_mask: torch.Tensor,
        past_key_values: list[torch.Tensor],
    ) -> tuple[torch.Tensor, ...]:
        from transformers import EncoderDecoderCache

        decoder: Any = self.model.decoder
        own: list[torch.Tensor] = []
        cross: list[torch.Tensor] = []
        rows = encoder_hidden_states.transpose(0, 1).clone(memory_format=torch.contiguous_format)
        for i, layer in enumerate(decoder.model.decoder.layers):
            keys, values, cross_keys_past, cross_values_past = past_key_values[4 * i : 4 * i + 4]
            own += [keys, values]
            attention = layer.encoder_attn
            heads = int(attention.num_heads)
            cross.append(cross_keys(attention.k_proj, heads, cross_keys_past, rows))
            cross.append(cross_keys(attention.v_proj, heads, cross_values_past, rows))
        # the cross cache complete before the layers run: each reads its keys and values from it (the
        # cache's is_updated), as transformers' does after its first step
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
        return (out.logits, *presents)


class CodecDecode(torch.nn.Module):
    """``audio_encoder.decode`` of the codes as ``generate`` calls it (no scales); a stereo decoder's
    codebooks interleaved left and right, each half decoded and the two concatenated as channels."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, audio_codes: torch.Tensor) -> torch.Tensor:
        model: Any = self.model
        codec = model.audio_encoder
        scales = [None]  # one frame (generate's list has a None a row; decode reads the frame's)
        if int(model.config.decoder.audio_channels) == 1:
            out: torch.Tensor = codec.decode(audio_codes, audio_scales=scales).audio_values
            return out
        left = codec.decode(audio_codes[:, :, ::2], audio_scales=scales).audio_values
        right = codec.decode(audio_codes[:, :, 1::2], audio_scales=scales).audio_values
        return torch.cat([left, right], dim=1)


def sizes(model: Any) -> tuple[int, int, int, int]:
    """(decoder layers, heads, head size, codebooks)."""
    decoder = model.config.decoder
    heads = int(decoder.num_attention_heads)
    return (
        int(decoder.num_hidden_layers),
        heads,
        int(decoder.hidden_size) // heads,
        int(decoder.num_codebooks),
    )


def step_cache_names(layers: int, prefix: str) -> list[str]:
    """``{prefix}.%d.decoder.key`` / ``.value``, ``.encoder.key`` / ``.value``, layer by layer."""
    return seq2seq_cache_names(layers, prefix)


def refuse_unsupported(model: Any) -> None:
    if type(model.audio_encoder).__name__ != "EncodecModel":
        raise InputError(
            f"{type(model).__name__}: its audio encoder is {type(model.audio_encoder).__name__}; the "
            "package's encodec_decode.onnx exports EnCodec's decode only"
        )


def loop_graphs(model: torch.nn.Module, config: Any) -> dict[str, GraphSpec]:
    """The three graphs of the module docstring, at examples on the meta device."""
    del config
    refuse_unsupported(model)
    layers, heads, size, books = sizes(model)
    m: Any = model
    text_vocab = int(m.config.text_encoder.vocab_size)
    codes = int(m.config.decoder.vocab_size)
    width = int(m.config.decoder.hidden_size)
    g = torch.Generator().manual_seed(0)
    # the cross past's example is the first step's (0): its size then stays symbolic (size-oblivious)
    batch, source, target, past, cross_past = 2, 6, 3, 4, 0
    b = torch.export.Dim(BATCH, min=1, max=1024)
    e = torch.export.Dim(ENCODER_SEQUENCE, min=1, max=1 << 20)
    # positions past the decoder's sinusoidal table are computed as transformers extends it (its rows'
    # formula, capture/seq2seq_shifts.py)
    d = torch.export.Dim(DECODER_SEQUENCE, min=1, max=1 << 20)
    p = torch.export.Dim(PAST_DECODER, min=0, max=1 << 20)
    pe = torch.export.Dim(PAST_ENCODER, min=0, max=1 << 20)
    encoder, mask = text_encoder_spec(TextEncoder(model), text_vocab, (batch, source), (b, e), g)
    cache: list[torch.Tensor] = []
    for _ in range(layers):
        cache += [torch.randn(batch, heads, past, size, generator=g) for _ in range(2)]
        cache += [torch.randn(batch, heads, cross_past, size, generator=g) for _ in range(2)]
    step_args = (
        torch.randint(0, codes, (batch * books, target), generator=g),
        torch.randn(batch, source, width, generator=g),
        mask,
        cache,
    )
    own, cross = {0: b, 2: p}, {0: b, 2: pe}
    step = GraphSpec(
        DecoderStep(model),
        tuple(pytree.tree_map(lambda t: t.to("meta"), step_args)),
        {
            "input_ids": {0: books * b, 1: d},
            "encoder_hidden_states": {0: b, 1: e},
            "encoder_attention_mask": {0: b, 1: e},
            "past_key_values": [own, own, cross, cross] * layers,
        },
        [*STEP_INPUTS, *step_cache_names(layers, "past_key_values")],
        ["logits", *step_cache_names(layers, "present")],
    )
    decode = loop_graphs_decode(model)
    return {TEXT_ENCODER_FILE: encoder, DECODER_FILE: step, DECODE_FILE: decode}


def loop_graphs_decode(model: torch.nn.Module) -> GraphSpec:
    """``encodec_decode.onnx``'s graph (MusicGen's and MusicGen Melody's)."""
    m: Any = model
    books, codes = int(m.config.decoder.num_codebooks), int(m.config.decoder.vocab_size)
    example = torch.randint(0, codes, (1, 2, books, 5), generator=torch.Generator().manual_seed(0))
    return GraphSpec(
        CodecDecode(model),
        (example.to("meta"),),
        {
            "audio_codes": {
                1: torch.export.Dim(BATCH, min=1, max=1024),
                3: torch.export.Dim(FRAMES, min=1, max=1 << 20),
            }
        },
        ["audio_codes"],
        ["audio_values"],
    )


def start_token(generation: Any) -> int:
    """The decoder's first token and delay padding: ``decoder_start_token_id``, else ``bos_token_id``
    (generate's ``_get_decoder_start_token_id``)."""
    for token in (generation.decoder_start_token_id, generation.bos_token_id):
        if isinstance(token, int):
            return token
    raise InputError("the generation config has no decoder_start_token_id nor bos_token_id")


def delay_pattern(codebooks: int, channels: int, length: int, start: int) -> torch.Tensor:
    """``build_delay_pattern_mask``'s mask for a one-token prompt of ``start``, one batch row
    (``codebooks`` x ``length``): ``start`` where a codebook is delayed, -1 where a token is generated."""
    per_channel = codebooks // 2 if channels == 2 else codebooks
    pattern = torch.full((codebooks, length), -1, dtype=torch.int64)
    if length < 2 * per_channel - 1:
        return pattern  # transformers applies no pattern then
    column = torch.arange(length)
    for k in range(codebooks):
        c = k // 2 if channels == 2 else k
        delayed = (column <= c) | (column >= length - per_channel + 1 + c)
        pattern[k, delayed] = start
    return pattern


def generated_codes(step: Any, model: Any, batch: int, new_tokens: int, guidance: float) -> torch.Tensor:
    """The codes (1 x ``batch`` x codebooks x frames) of the loop's steps 2 to 4 (module docstring):
    ``step(ids, first)`` runs the decoder on the new column(s) of ids (repeated for guidance) and gives
    the last position's logits, ``first`` on the first step."""
    books = int(model.config.decoder.num_codebooks)
    generation = model.generation_config
    start, pad = start_token(generation), generation.pad_token_id
    channels = int(model.config.decoder.audio_channels)
    pattern = delay_pattern(books, channels, new_tokens + 1, start).repeat(batch, 1)
    sequence = torch.full((batch * books, 1), start)  # the prompt: one start token a row
    guided = guidance > 1
    fed = sequence
    for i in range(new_tokens):
        scores = step(fed.repeat(2, 1) if guided else fed, i == 0)
        if guided:
            cond, uncond = scores.split(batch * books)
            scores = uncond + (cond - uncond) * guidance
        column = pattern[:, sequence.shape[1]]
        token = torch.where(column == -1, scores.argmax(-1), column)
        sequence = torch.cat([sequence, token[:, None]], dim=1)
        fed = token[:, None]
    return sequence[sequence != pad].reshape(batch, books, -1)[None]


def generated_by_sessions(
    sessions: dict[str, Any],
    run: Any,
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    new_tokens: int,
    guidance: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The loop of the module docstring over the package's sessions (``run(session, names, tensors)``):
    the text encoder's states, the codes (1 x batch x codebooks x frames) and the audio."""
    layers, heads, size, _ = sizes(model)
    (states,) = run(sessions[TEXT_ENCODER_FILE], ["input_ids", "attention_mask"], [input_ids, attention_mask])
    fed_states, fed_mask = states, attention_mask
    if guidance > 1:  # the unconditional rows: zeroed states and mask
        fed_states = torch.cat([states, torch.zeros_like(states)])
        fed_mask = torch.cat([attention_mask, torch.zeros_like(attention_mask)])
    cache = [torch.zeros(fed_states.shape[0], heads, 0, size) for _ in range(4 * layers)]
    names = [*STEP_INPUTS, *step_cache_names(layers, "past_key_values")]

    def step(ids: torch.Tensor, first: bool) -> torch.Tensor:
        del first  # the cross past's length tells the graph
        nonlocal cache
        logits, *cache = run(sessions[DECODER_FILE], names, [ids, fed_states, fed_mask, *cache])
        last: torch.Tensor = logits[:, -1]
        return last

    codes = generated_codes(step, model, input_ids.shape[0], new_tokens, guidance)
    (audio,) = run(sessions[DECODE_FILE], ["audio_codes"], [codes])
    return states, codes, audio


@contextmanager
def recorded_codes(model: Any) -> Iterator[list[torch.Tensor]]:
    """The codes ``generate`` hands to ``audio_encoder.decode`` inside the block."""
    seen: list[torch.Tensor] = []
    codec = model.audio_encoder
    decode = codec.decode

    def record(audio_codes: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        seen.append(audio_codes)
        return decode(audio_codes, *args, **kwargs)

    codec.decode = record
    try:
        yield seen
    finally:
        del codec.decode


NEW_TOKENS = 8
"""The tokens each verification generates: past the delay pattern's 2 * codebooks - 1 columns for 4
codebooks (the tiny checkpoints'), so the pattern applies."""


def guidance_scales(model: Any) -> list[float]:
    """1 (none), and the generation config's guidance where it guides (above 1)."""
    configured = getattr(model.generation_config, "guidance_scale", None)
    return [1.0, *([float(configured)] if isinstance(configured, (int, float)) and configured > 1 else [])]


def check_inputs(model: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Two rows of 7 text tokens, the second right-padded from its fourth."""
    vocab = int(model.config.text_encoder.vocab_size)
    ids = torch.randint(min(3, vocab - 1), vocab, (2, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 4:] = 0
    return ids, mask


def check_package(
    sessions: dict[str, Any], model: Any, specs: dict[str, GraphSpec], run: Any, tolerance: Any
) -> list[VerificationInfo]:
    """The loop over the sessions against ``generate(do_sample=False, max_new_tokens=NEW_TOKENS)`` at each
    of ``guidance_scales``, on a padded batch of two: the text encoder's states, the codes (equal) and
    the audio."""
    del specs
    ids, mask = check_inputs(model)
    infos: list[VerificationInfo] = []
    with torch.no_grad():
        want_states = TextEncoder(model)(ids, mask)
    for guidance in guidance_scales(model):
        states, codes, audio = generated_by_sessions(sessions, run, model, ids, mask, NEW_TOKENS, guidance)
        with torch.no_grad(), recorded_codes(model) as seen:
            want = model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=False,
                guidance_scale=guidance,
                max_new_tokens=NEW_TOKENS,
            )
        at = f"guidance {guidance:g}"
        if guidance == 1:
            name = "text_encoder: encoder_hidden_states"
            infos.append(compare(name, want_states, states, *tolerance(want_states)))
        infos.append(compare(f"audio codes ({at})", seen[-1], codes))
        if want.shape == audio.shape:
            infos.append(compare(f"audio_values ({at})", want, audio, *tolerance(want)))
        else:
            infos.append(compare(f"audio_values ({at})", want, audio))  # the shapes differ
    return infos
