"""What each task's graph takes and returns: the module exported (the transformers model behind a thin
forward naming its inputs), example inputs, dynamic shapes and the ONNX input and output names.

text-generation: ``input_ids``, ``attention_mask``, ``position_ids`` (where the architecture takes them)
and ``past_key_values.%d.key`` / ``.value`` (``.conv_state`` / ``.recurrent_state`` for the layers of
linear attention and state-space models: decoder_cache.py); outputs ``logits`` and ``present.%d.key`` /
``.value`` (``.conv_state``...).
The dims are named ``batch_size``, ``sequence_length``, ``past_sequence_length`` and
``total_sequence_length`` (the attention mask covers past and new tokens). One graph serves the prefill
(past length 0) and every decode step. A decoder that keeps no transformers cache (GPT-1, Reformer,
XLNet, RWKV, RecurrentGemma: no cache at all, or state of its own kind) gets the same graph without one:
``input_ids``, ``attention_mask`` (and ``position_ids``) over the whole sequence to ``logits``; each step
then runs the whole sequence again, as optimum's text-generation without past does.
Encoders: ``input_ids``, ``attention_mask`` (and ``token_type_ids`` where the forward takes them) or
``pixel_values``; the output named as transformers names it: ``last_hidden_state`` or ``logits``.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch

from fastonnx.capture.chunked_kernels import recurrent_mask_by_length
from fastonnx.errors import InputError
from fastonnx.pretrained.decoder_cache import (
    CacheLayer,
    cache_argument,
    cache_dims,
    cache_names,
    check_cache_layers,
    config_layout,
    filled_cache,
    kv_shape,
    produced_layout,
    returned_cache,
    text_config,
)
from fastonnx.pretrained.embedded_features import encoder_states
from fastonnx.pretrained.encoder_tasks import (
    audio_inputs,
    dynamic_shapes,
    encoder,
    image_inputs,
    paired_columns,
    paired_ids,
    whisper_frames,
)
from fastonnx.pretrained.graph_spec import BATCH, PAST, SEQUENCE, TOTAL, GraphSpec, takes


class CausalLMStep(torch.nn.Module):
    """One generation step with position ids: logits and the grown cache."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past_key_values: Any,
    ) -> tuple[torch.Tensor, Any]:
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            use_cache=True,
        )
        return out.logits, out.past_key_values


class CausalLMStepNoPositions(torch.nn.Module):
    """One generation step of an architecture without position ids (the mask gives the positions)."""

    cache_argument = "past_key_values"  # the forward's name for the cache

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def model_mask(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return attention_mask

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, past_key_values: Any
    ) -> tuple[torch.Tensor, Any]:
        out = self.model(
            input_ids=input_ids,
            attention_mask=self.model_mask(input_ids, attention_mask),
            use_cache=True,
            **{self.cache_argument: past_key_values},
        )
        return out.logits, returned_cache(out)


def no_cache_flags(model: torch.nn.Module) -> dict[str, bool]:
    """The keywords that turn a forward's own state off: ``use_cache``, and XLNet's ``use_mems``."""
    return {"use_cache": False, **({"use_mems": False} if takes(model, "use_mems") else {})}


class CausalLMNoCache(torch.nn.Module):
    """The logits of a whole sequence, for a decoder that keeps no cache transformers' ``Cache`` holds:
    called with ``use_cache=False`` so that no state of its own kind (RecurrentGemma's buffers, RWKV's
    state, XLNet's mems) is made or written."""

    def __init__(self, model: torch.nn.Module, with_positions: bool) -> None:
        super().__init__()
        self.model, self.with_positions = model, with_positions

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        extra = {"position_ids": position_ids} if self.with_positions else {}
        out = self.model(
            input_ids=input_ids, attention_mask=attention_mask, **no_cache_flags(self.model), **extra
        )
        logits: torch.Tensor = out.logits
        return logits


class StateSpaceStep(CausalLMStepNoPositions):
    """One generation step of a state-space model whose forward takes ``cache_params`` (Mamba, Mamba2,
    FalconMamba): no positions, and a mask over the new tokens only; the graph takes the mask over past
    and new tokens as every other decoder's does, and passes the model its last ``sequence_length``
    columns (all ones in a decode step, where transformers passes none)."""

    cache_argument = "cache_params"

    def model_mask(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        mask = recurrent_mask_by_length(None, input_ids, attention_mask)
        return mask if mask is not None else attention_mask  # None only for a mask that is not 2-D


def decoder_inputs(
    layout: list[CacheLayer],
    vocab: int,
    batch: int,
    sequence: int,
    past: int,
    device: str | torch.device,
    with_positions: bool,
    seed: int = 0,
    codebooks: int = 1,
) -> tuple[Any, ...]:
    """Token ids (``codebooks`` rows a sequence), the mask over past and new tokens, positions, and a
    cache of ``layout`` with ``past`` positions."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(min(3, vocab - 1), vocab, (batch * codebooks, sequence), generator=g)
    mask = torch.ones(batch, past + sequence, dtype=torch.int64)
    positions = torch.arange(past, past + sequence).repeat(batch, 1)
    cache = filled_cache(layout, batch, past, device, g)
    tensors = (ids.to(device), mask.to(device), positions.to(device))
    return (*tensors, cache) if with_positions else (tensors[0], tensors[1], cache)


def text_generation(model: torch.nn.Module, config: Any) -> GraphSpec:
    """The decoder step's spec; its ids pair a text token with audio codes where the model reads them so
    (``paired_columns``: Kyutai's, frame_paired_speech.py)."""
    check_cache_layers(model, config)
    id_columns = paired_columns(model, config)
    with_positions = takes(model, "position_ids")
    step: torch.nn.Module
    if cache_argument(model) == "cache_params":
        step = StateSpaceStep(model)
    else:
        step = CausalLMStep(model) if with_positions else CausalLMStepNoPositions(model)
    layout = produced_layout(model, config, with_positions, id_columns)
    b = torch.export.Dim(BATCH, min=1, max=1024)
    s = torch.export.Dim(SEQUENCE, min=1, max=1 << 20)
    if layout == []:
        if getattr(config, "is_decoder", None) is False:
            raise InputError(
                f"{type(model).__name__} returns no cache from a forward with use_cache=True: its config has "
                "is_decoder=False: it attends both ways, as an encoder, and keeps no cache; a checkpoint meant "
                'for generation has "is_decoder": true in its config.json'
            )
        return no_cache_generation(model, config, with_positions, b, s)
    layout = layout or config_layout(text_config(config))
    books = codebooks(model, config)
    vocab = int(text_config(config).vocab_size)
    args = decoder_inputs(layout, vocab, 2, 3, 4, "meta", with_positions, codebooks=books)
    if id_columns:
        args = (paired_ids(args[0], config, id_columns), *args[1:])
    p = torch.export.Dim(PAST, min=0, max=1 << 20)
    rows = books * b if books > 1 else b
    dims: dict[str, Any] = {"input_ids": {0: rows, 1: s}, "attention_mask": {0: b, 1: TOTAL}}
    names = ["input_ids", "attention_mask"]
    if with_positions:
        dims["position_ids"] = {0: b, 1: s}
        names.append("position_ids")
    dims["past_key_values"] = cache_dims(layout, b, p)
    names += cache_names(layout, "past_key_values")
    outputs = ["logits", *cache_names(layout, "present")]
    return GraphSpec(step, args, dims, names, outputs, layout, codebooks=books)


def codebooks(model: torch.nn.Module, config: Any) -> int:
    """How many rows of ``input_ids`` a sequence takes: MusicGen's decoder reads one a codebook
    (``(batch * num_codebooks, length)``, its logits likewise): its input embedding is one table a
    codebook. Every other decoder one, ``num_codebooks`` or not (Moshi's text model has 8 and reads one)."""
    books = getattr(text_config(config), "num_codebooks", None)
    get = getattr(model, "get_input_embeddings", None)
    tables = get() if callable(get) else None
    if (
        isinstance(books, int)
        and books > 1
        and isinstance(tables, torch.nn.ModuleList)
        and len(tables) == books
    ):
        return books
    return 1


def no_cache_generation(
    model: torch.nn.Module, config: Any, with_positions: bool, b: Any, s: Any
) -> GraphSpec:
    """The graph of a decoder that returns no cache: the whole sequence in, its logits out."""
    ids, mask, positions, _ = decoder_inputs([], int(text_config(config).vocab_size), 2, 3, 0, "meta", True)
    names = ["input_ids", "attention_mask", *(["position_ids"] if with_positions else [])]
    args = (ids, mask, positions) if with_positions else (ids, mask)
    dims = {name: {0: b, 1: s} for name in names}
    return GraphSpec(
        CausalLMNoCache(model, with_positions), args, dims, names, ["logits"], [], stateless=True
    )


class Seq2SeqEncoder(torch.nn.Module):
    """The encoder of a seq2seq model: token ids and their mask to the encoder's states."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        encoder: Any = self.model.get_encoder()  # type: ignore[operator]
        out: torch.Tensor = encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return out


def cache_of(tensors: list[torch.Tensor]) -> Any:
    """A DynamicCache whose layers hold ``tensors`` (keys and values in turn), as they are: the cache is
    built from the graph's inputs, not grown from an empty one (which would add a constant)."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    cache = DynamicCache()
    cache.layers = []
    for keys, values in zip(tensors[::2], tensors[1::2], strict=True):
        layer: Any = DynamicLayer()  # type: ignore[no-untyped-call]
        layer.dtype, layer.device = keys.dtype, keys.device
        layer.keys, layer.values = keys, values
        layer.is_initialized = True
        cache.layers.append(layer)
    return cache


def empty_layers(count: int, empty: torch.Tensor) -> Any:
    """A DynamicCache of ``count`` initialized layers holding ``empty`` (no positions yet)."""
    return cache_of([empty] * (2 * count))


class Seq2SeqDecoderFirst(torch.nn.Module):
    """The decoder's first step: no past; it projects the encoder's states into the cross-attention
    cache, returned with the self-attention cache as ``present.%d.decoder`` / ``.encoder``."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        decoder_input_ids: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        encoder_attention_mask: torch.Tensor,
    ) -> tuple[torch.Tensor, Any]:
        from transformers import EncoderDecoderCache

        # empty layers made from the inputs: a cache left to initialize itself would add a constant
        # (``torch.tensor([])`` on the example's device) to the graph
        layers, heads, size, _ = seq2seq_shape(self.model.config)
        empty = encoder_hidden_states.new_zeros((decoder_input_ids.shape[0], heads, 0, size))
        out = self.model(
            decoder_input_ids=decoder_input_ids,
            encoder_outputs=encoder_output(encoder_hidden_states, encoder_attention_mask),
            attention_mask=encoder_attention_mask,
            past_key_values=EncoderDecoderCache(empty_layers(layers, empty), empty_layers(layers, empty)),
            use_cache=True,
        )
        return out.logits, out.past_key_values


class Seq2SeqDecoderWithPast(torch.nn.Module):
    """A later decoder step: the cache (self-attention past and the cross-attention keys and values of
    the first step) in, logits and the grown cache out."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        decoder_input_ids: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        encoder_attention_mask: torch.Tensor,
        past_key_values: Any,
    ) -> tuple[torch.Tensor, Any]:
        out = self.model(
            decoder_input_ids=decoder_input_ids,
            encoder_outputs=encoder_output(encoder_hidden_states, encoder_attention_mask),
            attention_mask=encoder_attention_mask,
            past_key_values=past_key_values,
            use_cache=True,
        )
        return out.logits, out.past_key_values


def seq2seq_sides(config: Any) -> tuple[Any, Any] | None:
    """(encoder's text config, decoder's config) of a composite seq2seq config (EncoderDecoderModel's,
    T5Gemma's: sizes in its ``encoder`` and ``decoder``; Canary's in ``encoder_config`` and
    ``decoder_config``); None for a flat one (BART's, T5's)."""
    from transformers import PreTrainedConfig

    encoder, decoder = getattr(config, "encoder", None), getattr(config, "decoder", None)
    if decoder is None:  # Canary's: encoder_config and decoder_config
        encoder, decoder = getattr(config, "encoder_config", None), getattr(config, "decoder_config", None)
    if not isinstance(encoder, PreTrainedConfig) or not isinstance(decoder, PreTrainedConfig):
        return None
    return text_config(encoder), decoder


def seq2seq_vocab(config: Any) -> int:
    """The ids both sides of a seq2seq model take: below either vocabulary's size."""
    sides = seq2seq_sides(config)
    if sides is None:
        return int(config.vocab_size)
    # a vision or speech encoder has no vocabulary: the decoder's alone then
    return min(int(v) for c in sides if isinstance(v := getattr(c, "vocab_size", None), int))


def decoder_start(config: Any) -> int:
    """The decoder's first token: ``decoder_start_token_id``, else the pad token (a composite config's may
    be its decoder's alone), else 0."""
    found = [
        getattr(c, k, None)
        for k in ("decoder_start_token_id", "pad_token_id")
        for c in (config, *(seq2seq_sides(config) or ()))
    ]
    return next((int(t) for t in found if isinstance(t, int)), 0)


def seq2seq_shape(config: Any) -> tuple[int, int, int, int]:
    """(decoder layers, decoder heads, head size, model width) of a seq2seq config (T5's or BART's names);
    of a composite one, the decoder's cache sizes and the encoder's width (the states it passes)."""
    sides = seq2seq_sides(config)
    if sides is not None:
        encoder, decoder = sides
        heads, head_size = kv_shape(decoder)
        return int(decoder.num_hidden_layers), heads, head_size, int(encoder.hidden_size)
    layers = int(getattr(config, "num_decoder_layers", None) or getattr(config, "decoder_layers", None) or 0)
    layers = layers or int(config.num_hidden_layers)
    width = int(getattr(config, "d_model", None) or config.hidden_size)
    named = getattr(config, "decoder_attention_heads", None)
    if named is None:
        # one decoder's sizes (Cohere ASR's): its cache holds the key-value heads, of its own head_dim
        heads, head_size = kv_shape(config)
        return layers, heads, int(getattr(config, "d_kv", None) or head_size), width
    heads = int(named)
    head_size = int(getattr(config, "d_kv", None) or width // heads)
    return layers, heads, head_size, width


def seq2seq_cache(
    config: Any, batch: int, past: int, source: int, device: str | torch.device, g: torch.Generator
) -> Any:
    from transformers import DynamicCache, EncoderDecoderCache

    layers, heads, size, _ = seq2seq_shape(config)
    own, cross = DynamicCache(), DynamicCache()
    for i in range(layers):
        k, v = (torch.randn(batch, heads, past, size, generator=g).to(device) for _ in range(2))
        own.update(k, v, i)
        k, v = (torch.randn(batch, heads, source, size, generator=g).to(device) for _ in range(2))
        cross.update(k, v, i)
    return EncoderDecoderCache(own, cross)


def seq2seq_cache_names(layers: int, prefix: str) -> list[str]:
    return [
        f"{prefix}.{i}.{side}.{kv}"
        for i in range(layers)
        for side in ("decoder", "encoder")
        for kv in ("key", "value")
    ]


ENCODER_SEQUENCE, DECODER_SEQUENCE, PAST_DECODER = (
    "encoder_sequence_length",
    "decoder_sequence_length",
    "past_decoder_sequence_length",
)


def encoder_output(states: torch.Tensor, mask: torch.Tensor | None = None) -> Any:
    """The encoder's states as transformers' output: indexable as the tuple most models read, with the
    ``last_hidden_state`` others read (Moonshine, Switch Transformers, ProphetNet), and None for the
    other fields of a model's own encoder output class (Switch Transformers' ``router_logits``): the
    decoder's graph gets the states alone. ``mask``, where given, is its ``attention_mask``, which the
    decoders of Moonshine, Moonshine Streaming, Canary and Cohere ASR read (not the forward's
    ``attention_mask``, the encoder's): an attribute, not a field, so the tuple stays the states alone.
    A copy of the states: Moonshine Streaming's decoder adds its positions to them in place, which
    would make the graph's input an output too (``mutated.encoder_hidden_states``) and the caller's
    states change under it."""
    out = _encoder_states_class()(last_hidden_state=states.clone())
    if mask is not None:
        out.attention_mask = mask
    return out


@functools.cache
def _encoder_states_class() -> Any:
    """Made once: transformers registers every ModelOutput subclass with torch's pytree."""
    from transformers.modeling_outputs import BaseModelOutput

    class EncoderStates(BaseModelOutput):
        def __getattr__(self, name: str) -> Any:
            if name.startswith("__"):
                raise AttributeError(name)
            return None

    return EncoderStates


class SpeechEncoder(torch.nn.Module):
    """The encoder of a speech seq2seq model (Whisper, Speech2Text): features to the encoder's states."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_features: torch.Tensor) -> torch.Tensor:
        return encoder_states(self.model, {"input_features": input_features})


class WaveformSpeechEncoder(SpeechEncoder):
    """The encoder of a speech seq2seq model reading the waveform itself (Moonshine)."""

    def forward(self, input_values: torch.Tensor) -> torch.Tensor:
        encoder: Any = self.model.get_encoder()  # type: ignore[operator]
        out: torch.Tensor = encoder(input_values=input_values).last_hidden_state
        return out


def speech_encoder(model: torch.nn.Module, config: Any, batch: int) -> GraphSpec:
    """The encoder file of a speech seq2seq model: Whisper's fixed frames of mel bins, or the features /
    waveform of another encoder (Speech2Text, Moonshine...) of a dynamic length (encoder_tasks)."""
    inputs, names = audio_inputs(model, config, batch, "meta")
    (name,) = inputs
    module = WaveformSpeechEncoder(model) if name == "input_values" else SpeechEncoder(model)
    return GraphSpec(module, (inputs[name],), dynamic_shapes(model, names), [name], ["last_hidden_state"])


class ImageEncoder(torch.nn.Module):
    """The encoder of a vision encoder-decoder (TrOCR, Donut): pixel values to the encoder's states."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        encoder: Any = self.model.get_encoder()  # type: ignore[operator]
        out: torch.Tensor = encoder(pixel_values=pixel_values).last_hidden_state
        return out


def encoder_images(config: Any, batch: int, device: str | torch.device) -> dict[str, torch.Tensor]:
    """``batch`` images of the vision encoder's size (a composite config's is its encoder's)."""
    sides = seq2seq_sides(config)
    return image_inputs(config if sides is None else sides[0], batch, device)


def encodes_images(model: Any) -> bool:
    """Whether a class of the image-text-to-text mapping is a vision encoder-decoder (TrOCR, Donut): its
    images go through an encoder that the decoder cross-attends, not merged as features into the prompt
    (BLIP-2's forward takes decoder ids too, for its T5 language models, but merges image features; so
    does InstructBLIP-Video's, its video's)."""
    params = inspect.signature(model.forward).parameters
    merges = hasattr(model, "get_image_features") or hasattr(model, "get_video_features")
    return not merges and {"decoder_input_ids", "pixel_values"} <= set(params)


def image_encoder(model: torch.nn.Module, batch: int) -> tuple[GraphSpec, int]:
    """The encoder file of a vision encoder-decoder and its states' length: fixed, as the image size is
    (the processor resizes every image to it)."""
    pixels = encoder_images(model.config, batch, "meta")["pixel_values"]
    encoder: Any = model.get_encoder()  # type: ignore[operator]
    with torch.no_grad():
        length = int(encoder(pixel_values=pixels).last_hidden_state.shape[1])
    b = torch.export.Dim(BATCH, min=1, max=1024)
    spec = GraphSpec(
        ImageEncoder(model), (pixels,), {"pixel_values": {0: b}}, ["pixel_values"], ["last_hidden_state"]
    )
    return spec, length


def speech_frames(config: Any) -> tuple[int, int]:
    """(mel bins, frames) of a Whisper-style encoder's input (encoder_tasks.whisper_frames)."""
    frames = whisper_frames(config)
    if frames is None:
        raise InputError(f"{type(config).__name__} has no max_source_positions: not a Whisper-style encoder")
    return frames


ONE_TOKEN_STEPS = frozenset({"prophetnet", "xlm-prophetnet"})
"""Model types whose decoder takes one token a step once it has a past: ProphetNet's asserts
``hidden_states.size(1) == 1`` there (its n-gram streams are laid out for a single step)."""


def text2text(
    model: torch.nn.Module, config: Any, speech: bool = False, images: bool = False
) -> dict[str, GraphSpec]:
    """Three files: the encoder, the decoder's first step and the decoder with its past. ``speech``:
    the encoder reads ``input_features`` (batch, mel bins, frames), the encoder length is fixed.
    ``images``: the encoder reads ``pixel_values`` of the processor's one size (a vision encoder-decoder:
    TrOCR, Donut), so its states' length is fixed too."""
    layers, _, _, width = seq2seq_shape(config)
    g = torch.Generator().manual_seed(0)
    vocab = seq2seq_vocab(config)
    batch, source, target, past = 2, 6, 3, 4
    b = torch.export.Dim(BATCH, min=1, max=1024)
    e: Any = torch.export.Dim(ENCODER_SEQUENCE, min=2, max=1 << 20)
    if speech and whisper_frames(config) is not None:  # Whisper's encoder: a fixed length
        source, e = int(config.max_source_positions), None
    if images:
        image_spec, source = image_encoder(model, batch)
        e = None
    d = torch.export.Dim(DECODER_SEQUENCE, min=1, max=1 << 20)
    p = torch.export.Dim(PAST_DECODER, min=1, max=1 << 20)
    ids = torch.randint(min(3, vocab - 1), vocab, (batch, source), generator=g).to("meta")
    mask = torch.ones(batch, source, dtype=torch.int64).to("meta")
    states = torch.randn(batch, source, width, generator=g).to("meta")
    dec_ids = torch.randint(min(3, vocab - 1), vocab, (batch, target), generator=g).to("meta")
    encoder_spec = GraphSpec(
        Seq2SeqEncoder(model),
        (ids, mask),
        {"input_ids": {0: b, 1: e}, "attention_mask": {0: b, 1: e}},
        ["input_ids", "attention_mask"],
        ["last_hidden_state"],
    )
    if speech:
        encoder_spec = speech_encoder(model, config, batch)
    if images:
        encoder_spec = image_spec
    step_inputs = ["decoder_input_ids", "encoder_hidden_states", "encoder_attention_mask"]
    along = {0: b, 1: e} if e is not None else {0: b}
    step_shapes: dict[str, Any] = {
        "decoder_input_ids": {0: b, 1: d},
        "encoder_hidden_states": along,
        "encoder_attention_mask": along,
    }
    first = GraphSpec(
        Seq2SeqDecoderFirst(model),
        (dec_ids, states, mask),
        step_shapes,
        step_inputs,
        ["logits", *seq2seq_cache_names(layers, "present")],
    )
    own = {"key": {0: b, 2: p}, "value": {0: b, 2: p}}
    cross = (
        {"key": {0: b, 2: e}, "value": {0: b, 2: e}} if e is not None else {"key": {0: b}, "value": {0: b}}
    )
    step_ids, past_shapes = dec_ids, step_shapes
    if getattr(config, "model_type", None) in ONE_TOKEN_STEPS:
        step_ids, past_shapes = dec_ids[:, :1], {**step_shapes, "decoder_input_ids": {0: b}}
    with_past = GraphSpec(
        Seq2SeqDecoderWithPast(model),
        (step_ids, states, mask, seq2seq_cache(config, batch, past, source, "meta", g)),
        {**past_shapes, "past_key_values": [{"decoder": own, "encoder": cross} for _ in range(layers)]},
        [*step_inputs, *seq2seq_cache_names(layers, "past_key_values")],
        ["logits", *seq2seq_cache_names(layers, "present")],
    )
    return {
        "encoder_model.onnx": encoder_spec,
        "decoder_model.onnx": first,
        "decoder_with_past_model.onnx": with_past,
    }


# onnxruntime-genai's Whisper (src/models/whisper.h): the encoder reads exactly 3000 frames of features
# (30 s at a hop of 10 ms), its cross-attention caches hold 1500 positions
GENAI_WHISPER_FRAMES = 3000
GENAI_WHISPER_ENCODER, GENAI_WHISPER_DECODER = "genai_encoder.onnx", "genai_decoder.onnx"


def genai_whisper_names(layers: int, prefix: str, side: str) -> list[str]:
    """genai's cache names, ``{prefix}_key_{side}_%d`` / ``{prefix}_value_{side}_%d``, layer by layer."""
    return [f"{prefix}_{kv}_{side}_{i}" for i in range(layers) for kv in ("key", "value")]


class WhisperGenaiEncoder(torch.nn.Module):
    """genai's Whisper encoder: ``audio_features`` to the encoder's states and, for every decoder layer,
    the cross-attention keys and values (batch, heads, frames / 2, head size), which genai computes once
    and feeds each decoder step. They are the decoder's own projections of the states, as its
    cross-attention computes them on the first step."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, audio_features: torch.Tensor) -> tuple[torch.Tensor, ...]:
        model: Any = self.model
        states: torch.Tensor = model.get_encoder()(input_features=audio_features).last_hidden_state
        cross: list[torch.Tensor] = []
        for layer in model.get_decoder().layers:
            attention = layer.encoder_attn
            shape = (states.shape[0], -1, attention.num_heads, attention.head_dim)
            for projection in (attention.k_proj, attention.v_proj):
                cross.append(projection(states).view(shape).transpose(1, 2))
        return (states, *cross)


class WhisperGenaiDecoder(torch.nn.Module):
    """genai's Whisper decoder step: ``input_ids`` (the prompt on the first step, past length 0, one
    token after), the self-attention past and the encoder's cross-attention keys and values in; logits
    and the grown self-attention cache out. There is no encoder-states input (genai feeds none when the
    encoder returns the cross caches): the model is given a placeholder, which its cross-attention does
    not read, because the cross cache it is handed is full (transformers' ``is_updated``)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, input_ids: torch.Tensor, past_self: list[torch.Tensor], past_cross: list[torch.Tensor]
    ) -> tuple[torch.Tensor, ...]:
        from transformers import EncoderDecoderCache

        model: Any = self.model
        width = int(model.config.d_model)
        placeholder = past_cross[0].new_zeros((input_ids.shape[0], 1, width))
        out = model(
            decoder_input_ids=input_ids,
            encoder_outputs=encoder_output(placeholder),
            past_key_values=EncoderDecoderCache(cache_of(past_self), cache_of(past_cross)),
            use_cache=True,
        )
        cache = out.past_key_values.self_attention_cache
        return (out.logits, *(t for layer in cache.layers for t in (layer.keys, layer.values)))


def genai_whisper(model: torch.nn.Module, config: Any) -> dict[str, GraphSpec]:
    """The two graphs onnxruntime-genai's ``whisper`` type runs (names from its model builder), or none
    where the encoder does not read genai's fixed 3000 frames."""
    whisper = whisper_frames(config)
    if whisper is None or whisper[1] != GENAI_WHISPER_FRAMES or config.model_type != "whisper":
        return {}  # genai's whisper type: Whisper's encoder of 3000 frames alone
    bins, frames = whisper
    layers, heads, size, _ = seq2seq_shape(config)
    g = torch.Generator().manual_seed(0)
    batch, source, target, past = 2, frames // 2, 3, 4
    b = torch.export.Dim(BATCH, min=1, max=1024)
    s = torch.export.Dim(SEQUENCE, min=1, max=1 << 20)
    # past 0 on the first step: genai feeds empty self-attention caches with the prompt
    p = torch.export.Dim(PAST, min=0, max=1 << 20)
    features = torch.randn(batch, bins, frames, generator=g).to("meta")
    encoder_spec = GraphSpec(
        WhisperGenaiEncoder(model),
        (features,),
        {"audio_features": {0: b}},
        ["audio_features"],
        [
            "hidden_states",
            *genai_whisper_names(layers, "present", "cross"),
        ],
    )
    vocab = int(config.vocab_size)
    ids = torch.randint(min(3, vocab - 1), vocab, (batch, target), generator=g).to("meta")
    own = [torch.randn(batch, heads, past, size, generator=g).to("meta") for _ in range(2 * layers)]
    cross = [torch.randn(batch, heads, source, size, generator=g).to("meta") for _ in range(2 * layers)]
    decoder_spec = GraphSpec(
        WhisperGenaiDecoder(model),
        (ids, own, cross),
        {
            "input_ids": {0: b, 1: s},
            "past_self": [{0: b, 2: p} for _ in own],
            "past_cross": [{0: b} for _ in cross],
        },
        [
            "input_ids",
            *genai_whisper_names(layers, "past", "self"),
            *genai_whisper_names(layers, "past", "cross"),
        ],
        ["logits", *genai_whisper_names(layers, "present", "self")],
    )
    return {GENAI_WHISPER_ENCODER: encoder_spec, GENAI_WHISPER_DECODER: decoder_spec}


def graph_specs(task: str, model: torch.nn.Module, config: Any) -> dict[str, GraphSpec]:
    """The files of ``task``'s package, each with its graph's spec."""
    if task == "text-generation":
        return {"model.onnx": text_generation(model, config)}
    if task == "automatic-speech-recognition":
        from fastonnx.pretrained.speech_synthesis import refuse_recognition

        refuse_recognition(model)  # VibeVoice's, Dia's: text to speech
    if task in ("text2text-generation", "automatic-speech-recognition"):
        from fastonnx.pretrained.audio_language import audio_text_to_text, is_audio_language

        if is_audio_language(model):  # a decoder-only audio-LLM these mappings list: three files
            return audio_text_to_text(model, config)
    if task == "text2text-generation":
        return text2text(model, config)
    if task == "image-text-to-text" and encodes_images(model):
        # a vision encoder-decoder (optimum's image-to-text): text2text's three files over an image encoder
        return text2text(model, config, images=True)
    if task == "image-text-to-text":
        from fastonnx.pretrained.cross_attention_vlms import cross_attention_graphs
        from fastonnx.pretrained.cross_attention_vlms import own_layout as cross_attention_layout
        from fastonnx.pretrained.image_prefix import image_prefix_graphs, own_layout
        from fastonnx.pretrained.vision_language import image_text_to_text

        if own_layout(model):  # Kosmos-2's image positions, GIT's image prefix
            return image_prefix_graphs(model, config)
        if cross_attention_layout(model):  # Mllama's cross-attention layers
            return cross_attention_graphs(model, config)
        from fastonnx.pretrained import padded_patch_vlms

        if padded_patch_vlms.own_layout(model):  # Gemma 4's padded patches, its per-layer inputs
            return padded_patch_vlms.padded_patch_graphs(model, config)
        from fastonnx.pretrained import minicpm_vlms

        if minicpm_vlms.own_layout(model):  # MiniCPM-V's NaViT-packed slices
            return minicpm_vlms.minicpm_graphs(model, config)
        from fastonnx.pretrained import molmo_vlms

        if molmo_vlms.own_layout(model):  # Molmo 2's pooled crops, its image rows added
            return molmo_vlms.molmo_graphs(model, config)
        return image_text_to_text(model, config)
    if task == "automatic-speech-recognition" and takes(model, "decoder_input_ids"):
        # onnxruntime's three files, and onnxruntime-genai's two beside them where genai can run them
        return {**text2text(model, config, speech=True), **genai_whisper(model, config)}
    if task == "text-to-audio":
        from fastonnx.pretrained.speech_synthesis import speech_graph

        return {"model.onnx": speech_graph(model, config)}  # VITS, FastSpeech2 (speech_synthesis.py)
    from fastonnx.pretrained import streamed_audio_steps, tower_features, towers_alone

    if streamed_audio_steps.owns_bare(model, task):  # Voxtral Realtime's base model: prompt and audio
        return {"model.onnx": streamed_audio_steps.bare_graph(model, config)}

    if tower_features.owns(model, task):  # a bare image-grid vision tower
        return {"model.onnx": tower_features.tower_graph(model)}
    if towers_alone.owns(model, task):  # SigLIP 2's, Gemma 4's, Pixtral's towers, BLIP-2's Q-Former
        return {"model.onnx": towers_alone.tower_graph(model)}
    from fastonnx.pretrained import media_text_towers

    if media_text_towers.owns(model, task):  # text and audio or video towers (PE's, VideoPrism's)
        return {"model.onnx": media_text_towers.tower_graph(model, config, task)}
    # CTC speech recognition (frames to logits) and the other tasks: one graph
    return {"model.onnx": _audio_base_graph(model, config, task) or encoder(model, config, task)}


def _audio_base_graph(model: torch.nn.Module, config: Any, task: str) -> GraphSpec | None:
    """feature-extraction of an audio-language base model or a transducer (audio_base_models.py)."""
    from fastonnx.pretrained import audio_base_models

    return audio_base_models.base_graph(model, config) if audio_base_models.owns(model, task) else None
