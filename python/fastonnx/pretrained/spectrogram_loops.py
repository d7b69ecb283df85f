"""text-to-audio of SpeechT5ForTextToSpeech: the mel-frame loop of transformers' ``generate_speech`` as
three graphs, optimum's layout, the loop itself the runtime's.

- ``encoder_model.onnx``: ``input_ids``, ``attention_mask`` (``batch_size`` x ``encoder_sequence_length``)
  to ``last_hidden_state``.
- ``decoder_model_merged.onnx``: one step. ``output_sequence`` (``batch_size`` x ``decoder_sequence_length``
  x mel bins: the frames so far, an all-zero frame first, as transformers keeps them), ``speaker_embeddings``
  (``batch_size`` x ``config.speaker_embedding_dim``), ``encoder_hidden_states``, ``encoder_attention_mask``,
  ``prenet_dropout`` (a float32 scalar) and the self-attention cache ``past_key_values.%d.decoder.key`` /
  ``.value`` (``past_decoder_sequence_length`` 0 on the first step) to ``output_sequence_out`` (the frames
  with the step's last new frame appended), ``spectrum`` (``batch_size`` x ``config.reduction_factor`` x
  mel bins: the step's new frames), ``prob`` (``batch_size`` x ``reduction_factor``: the stop probabilities,
  summed and thresholded as transformers does) and ``present.%d.decoder.key`` / ``.value``. The prenet runs
  on every frame (its positions are the sequence's), the decoder layers on the last one. The
  cross-attention keys and values are recomputed from the encoder's states each step (no cross cache: one
  graph for the first step and the later ones).
- ``decoder_postnet.onnx``: ``spectrogram`` (``batch_size`` x frames x mel bins: the steps' ``spectrum``
  concatenated) to ``postnet_spectrogram`` (the postnet's residual convolutions): what transformers'
  ``generate_speech`` returns without a vocoder. The vocoder (SpeechT5HifiGan) is a separate checkpoint and
  not in the package yet: run it on ``postnet_spectrogram``.

The speech-decoder prenet applies its dropout in evaluation too ("always applied", transformers' comment;
an element kept where ``bernoulli(p)`` draws 1, scaled by ``1 / (1 - p)``, the mask shared by the batch's
rows). The graph draws it too (RandomUniformLike) and takes ``p`` as the input ``prenet_dropout``: the
config's ``speech_decoder_prenet_dropout`` synthesizes as transformers does; 0 makes the run deterministic
(every element dropped, as transformers' at 0), which is how it is verified (random draws are never
compared).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from fastonnx.diagnostics.verdicts import VerificationInfo, compare
from fastonnx.pretrained.encoder_tasks import text_inputs
from fastonnx.pretrained.graph_spec import BATCH, GraphSpec
from fastonnx.pretrained.task_inputs import cache_of, empty_layers
from fastonnx.torch_internals import pytree

ENCODER_FILE, DECODER_FILE, POSTNET_FILE = (
    "encoder_model.onnx",
    "decoder_model_merged.onnx",
    "decoder_postnet.onnx",
)
ENCODER_SEQUENCE, FRAMES, PAST_FRAMES = (
    "encoder_sequence_length",
    "decoder_sequence_length",
    "past_decoder_sequence_length",
)
CLASS = "SpeechT5ForTextToSpeech"
STEP_INPUTS = ["output_sequence", "speaker_embeddings", "encoder_hidden_states", "encoder_attention_mask"]
DROPOUT = "prenet_dropout"


def own_layout(model: torch.nn.Module) -> bool:
    return type(model).__name__ == CLASS


def consistent_dropout(inputs_embeds: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """transformers' ``SpeechT5SpeechDecoderPrenet._consistent_dropout`` with ``p`` a tensor: an element
    kept where a uniform draw is below ``p`` (``bernoulli(p)`` drawing 1), one mask for every row."""
    keep = torch.rand_like(inputs_embeds[0]) < p
    return torch.where(keep.unsqueeze(0), inputs_embeds, 0.0) * (1 / (1 - p))


@contextmanager
def dropout_of(prenet: Any, p: torch.Tensor) -> Iterator[None]:
    """The prenet's dropout drawn at the tensor ``p`` inside the block (its config's float otherwise)."""
    prenet._consistent_dropout = lambda embeds, _: consistent_dropout(embeds, p)
    try:
        yield
    finally:
        del prenet._consistent_dropout


class TextToSpeechEncoder(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        encoder: Any = self.model.speecht5.encoder  # type: ignore[union-attr]
        out: torch.Tensor = encoder(input_values=input_ids, attention_mask=attention_mask).last_hidden_state
        return out


class TextToSpeechStep(torch.nn.Module):
    """One step of ``_generate_speech``'s loop: the prenet over the frames so far, the decoder layers on
    the last one with the self-attention past, the postnet's frames and stop probabilities."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        output_sequence: torch.Tensor,
        speaker_embeddings: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        encoder_attention_mask: torch.Tensor,
        prenet_dropout: torch.Tensor,
        past_key_values: list[torch.Tensor],
    ) -> tuple[torch.Tensor, ...]:
        from transformers import EncoderDecoderCache

        model: Any = self.model
        config = model.config
        decoder = model.speecht5.decoder
        with dropout_of(decoder.prenet, prenet_dropout):
            hidden = decoder.prenet(output_sequence, speaker_embeddings)
        # an empty cross cache made from the inputs: the cross-attention computes its keys and values
        empty = past_key_values[0][:, :, :0]
        cross = empty_layers(len(past_key_values) // 2, empty)
        out = decoder.wrapped_decoder(
            hidden_states=hidden[:, -1:],
            attention_mask=None,
            encoder_hidden_states=encoder_hidden_states,
            encoder_attention_mask=encoder_attention_mask,
            past_key_values=EncoderDecoderCache(cache_of(past_key_values), cross),
            use_cache=True,
            return_dict=True,
        )
        last = out.last_hidden_state.squeeze(1)
        postnet = model.speech_decoder_postnet
        bins = int(config.num_mel_bins)
        spectrum = postnet.feat_out(last).view(last.shape[0], int(config.reduction_factor), bins)
        prob = torch.sigmoid(postnet.prob_out(last))
        grown = torch.cat([output_sequence, spectrum[:, -1:]], dim=1)
        own = out.past_key_values.self_attention_cache
        return (grown, spectrum, prob, *(t for layer in own.layers for t in (layer.keys, layer.values)))


class TextToSpeechPostnet(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, spectrogram: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.model.speech_decoder_postnet.postnet(spectrogram)  # type: ignore[union-attr,operator]
        return out


def cache_names(layers: int, prefix: str) -> list[str]:
    return [f"{prefix}.{i}.decoder.{kv}" for i in range(layers) for kv in ("key", "value")]


def _sizes(config: Any) -> tuple[int, int, int]:
    """(decoder layers, heads, head size)."""
    heads = int(config.decoder_attention_heads)
    return int(config.decoder_layers), heads, int(config.hidden_size) // heads


def loop_graphs(model: torch.nn.Module, config: Any) -> dict[str, GraphSpec]:
    layers, heads, size = _sizes(config)
    g = torch.Generator().manual_seed(0)
    batch, tokens, frames, bins = 2, 7, 4, int(config.num_mel_bins)
    vocab, width = int(config.vocab_size), int(config.hidden_size)
    b = torch.export.Dim(BATCH, min=1, max=1024)
    # the text prenet's positions: a table of max_text_positions rows
    e = torch.export.Dim(ENCODER_SEQUENCE, min=2, max=int(config.max_text_positions))
    # the prenet's positions are a table of max_speech_positions rows (sliced by the frames' count)
    positions = int(config.max_speech_positions)
    f = torch.export.Dim(FRAMES, min=1, max=positions)
    p = torch.export.Dim(PAST_FRAMES, min=0, max=positions - 1)
    ids = torch.randint(min(3, vocab - 1), vocab, (batch, tokens), generator=g)
    mask = torch.ones(batch, tokens, dtype=torch.int64)
    encoder = GraphSpec(
        TextToSpeechEncoder(model),
        (ids.to("meta"), mask.to("meta")),
        {"input_ids": {0: b, 1: e}, "attention_mask": {0: b, 1: e}},
        ["input_ids", "attention_mask"],
        ["last_hidden_state"],
    )
    step_args = (
        torch.randn(batch, frames, bins, generator=g),
        torch.randn(batch, int(config.speaker_embedding_dim), generator=g),
        torch.randn(batch, tokens, width, generator=g),
        mask,
        torch.tensor(0.5),
        [torch.randn(batch, heads, frames - 1, size, generator=g) for _ in range(2 * layers)],
    )
    step = GraphSpec(
        TextToSpeechStep(model),
        tuple(pytree.tree_map(lambda t: t.to("meta"), step_args)),
        {
            "output_sequence": {0: b, 1: f},
            "speaker_embeddings": {0: b},
            "encoder_hidden_states": {0: b, 1: e},
            "encoder_attention_mask": {0: b, 1: e},
            DROPOUT: {},
            "past_key_values": [{0: b, 2: p} for _ in range(2 * layers)],
        },
        [*STEP_INPUTS, DROPOUT, *cache_names(layers, "past_key_values")],
        ["output_sequence_out", "spectrum", "prob", *cache_names(layers, "present")],
    )
    postnet = GraphSpec(
        TextToSpeechPostnet(model),
        (torch.randn(batch, 2 * frames, bins, generator=g).to("meta"),),
        {"spectrogram": {0: b, 1: torch.export.Dim("frames", min=1, max=1 << 20)}},
        ["spectrogram"],
        ["postnet_spectrogram"],
    )
    return {ENCODER_FILE: encoder, DECODER_FILE: step, POSTNET_FILE: postnet}


CHECKED = (((1, 7), (0.0, 20.0)), ((2, 9), (1.0, 2.0)))
"""(batch, tokens), (minlenratio, maxlenratio) of the verification's generations: transformers' defaults,
and a batch with a padded row kept looping past its first steps (the cache grown)."""


def generated_by_sessions(
    sessions: dict[str, Any],
    run: Any,
    config: Any,
    inputs: dict[str, torch.Tensor],
    ratios: tuple[float, float],
    threshold: float = 0.5,
) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """``_generate_speech`` over the package's sessions (``run(session, names, tensors)``), the prenet's
    dropout at 0: the encoder's states, the spectrograms (padded as transformers pads them) and their
    lengths in frames."""
    ids, mask, speakers = inputs["input_ids"], inputs["attention_mask"], inputs["speaker_embeddings"]
    (states,) = run(sessions[ENCODER_FILE], ["input_ids", "attention_mask"], [ids, mask])
    layers, heads, size = _sizes(config)
    batch, bins, factor = ids.shape[0], int(config.num_mel_bins), int(config.reduction_factor)
    maxlen = int(states.shape[1] * ratios[1] / factor)
    minlen = int(states.shape[1] * ratios[0] / factor)
    sequence = torch.zeros(batch, 1, bins)
    cache = [torch.zeros(batch, heads, 0, size) for _ in range(2 * layers)]
    names = [*STEP_INPUTS, DROPOUT, *cache_names(layers, "past_key_values")]
    spectra: list[torch.Tensor] = []
    done: dict[int, torch.Tensor] = {}
    step = 0
    while len(done) < batch:
        step += 1
        feeds = [sequence, speakers, states, mask, torch.tensor(0.0), *cache]
        sequence, spectrum, prob, *cache = run(sessions[DECODER_FILE], names, feeds)
        spectra.append(spectrum)
        if step < minlen:
            continue
        meet = range(batch) if step >= maxlen else torch.where(prob.sum(-1) >= threshold)[0].tolist()
        fresh = [i for i in meet if i not in done]
        if fresh:
            (post,) = run(sessions[POSTNET_FILE], ["spectrogram"], [torch.cat(spectra, dim=1)])
            done.update({i: post[i] for i in fresh})
    rows = [done[i] for i in range(batch)]
    padded = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)
    return states, padded, [r.shape[0] for r in rows]


def speaker_embeddings(config: Any, batch: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return torch.randn(batch, int(config.speaker_embedding_dim), generator=g)


def check_package(
    sessions: dict[str, Any], model: Any, specs: dict[str, GraphSpec], run: Any, tolerance: Any
) -> list[VerificationInfo]:
    """The frame loop over the sessions against transformers' ``generate_speech`` (threshold 0.5, the
    ratios of ``CHECKED``), the prenet's dropout at 0 on both sides: the encoder's states, the
    spectrograms and their lengths."""
    del specs
    config = model.config
    infos: list[VerificationInfo] = []
    kept = config.speech_decoder_prenet_dropout
    config.speech_decoder_prenet_dropout = 0.0  # read by the prenet's forward: no random draw
    try:
        for (batch, tokens), ratios in CHECKED:
            inputs = text_inputs(config, batch, tokens, "cpu", False)
            inputs["speaker_embeddings"] = speaker_embeddings(config, batch)
            states, spectrogram, lengths = generated_by_sessions(sessions, run, config, inputs, ratios)
            with torch.no_grad():
                encoder = model.speecht5.encoder
                want_states = encoder(
                    input_values=inputs["input_ids"], attention_mask=inputs["attention_mask"]
                ).last_hidden_state
                want, want_lengths = model.generate_speech(
                    inputs["input_ids"],
                    inputs["speaker_embeddings"],
                    attention_mask=inputs["attention_mask"],
                    minlenratio=ratios[0],
                    maxlenratio=ratios[1],
                    return_output_lengths=True,
                )
            size = f"{batch}x{tokens}"
            name = f"encoder ({size}): last_hidden_state"
            infos.append(compare(name, want_states, states, *tolerance(want_states)))
            infos.append(compare(f"frames ({size})", torch.tensor(want_lengths), torch.tensor(lengths)))
            if want.shape == spectrogram.shape:
                infos.append(compare(f"spectrogram ({size})", want, spectrogram, *tolerance(want)))
            else:
                infos.append(compare(f"spectrogram ({size})", want, spectrogram))  # the shapes differ
    finally:
        config.speech_decoder_prenet_dropout = kept
    return infos
