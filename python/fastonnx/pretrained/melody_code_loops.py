"""text-to-audio of MusicgenMelodyForConditionalGeneration: transformers' ``generate`` as four graphs, the
generation loop itself the runtime's. MusicGen Melody's decoder has no cross-attention: its conditioning
(a melody's chroma and the text) is a prefix of rows prepended to the codes' embeddings on the first step,
which the self-attention cache then holds.

- ``text_encoder.onnx``: ``input_ids``, ``attention_mask`` (``batch_size`` x ``encoder_sequence_length``)
  to ``encoder_hidden_states``: the T5 encoder's states, through ``enc_to_dec_proj`` where the widths
  differ, times the mask (padded rows zero, yet attended as transformers attends them: its generate
  passes no mask to the decoder).
- ``chroma_prefix.onnx``: ``input_features`` (``batch_size`` x chroma frames x ``config.num_chroma``: the
  feature extractor's chroma of a melody) to ``audio_hidden_states`` (``batch_size`` x
  ``config.chroma_length`` x hidden): through ``audio_enc_to_dec_proj`` where ``num_chroma`` differs from
  the decoder's width, the frames repeated cyclically to ``chroma_length`` rows (transformers' repeat, then
  truncation). Without a melody transformers feeds one frame of ``[1, 0, ..., 0]`` (the "null" chroma).
- ``decoder_model_merged.onnx``: one decoder step, the first and the later ones alike. ``input_ids``
  (``batch_size * num_codebooks`` x ``decoder_sequence_length``), ``encoder_hidden_states`` (the prefix:
  ``batch_size`` x ``prefix_length`` x hidden on the first step, 0 rows on the later ones) and
  ``past_key_values.%d.key`` / ``.value`` (``past_sequence_length``: 0 on the first step, then the prefix
  and the codes so far) to ``logits`` (``batch_size * num_codebooks`` x ``decoder_sequence_length`` x
  vocabulary: the codes' positions) and ``present.%d.key`` / ``.value``.
- ``encodec_decode.onnx``: as MusicGen's (audio_code_loops.py).

The loop (``generate(input_ids, attention_mask, input_features=F, do_sample=False, guidance_scale=G,
max_new_tokens=N)``; ``generated_by_sessions``): the prefix is ``cat([chroma_prefix(F), text_encoder(ids,
mask)], dim=1)`` (``F`` the null chroma where no melody is given). With guidance (``G > 1``) the batch is
doubled with unconditional rows: ``cat([chroma_prefix(null), zeros of the text states' shape])``. Then
MusicGen's loop (audio_code_loops.py: the delay pattern, the guidance's ``uncond + (cond - uncond) * G``,
the argmax, the codes without the pad token, EnCodec's decode), the prefix fed on the first step only.
"""

from __future__ import annotations

from typing import Any

import torch

from fastonnx.diagnostics.verdicts import VerificationInfo, compare
from fastonnx.pretrained import audio_code_loops as codes
from fastonnx.pretrained.graph_spec import BATCH, GraphSpec
from fastonnx.pretrained.loop_caches import cache_names
from fastonnx.pretrained.task_inputs import cache_of
from fastonnx.torch_internals import pytree

CLASS = "MusicgenMelodyForConditionalGeneration"
TEXT_ENCODER_FILE, CHROMA_FILE, DECODER_FILE, DECODE_FILE = (
    codes.TEXT_ENCODER_FILE,
    "chroma_prefix.onnx",
    codes.DECODER_FILE,
    codes.DECODE_FILE,
)
PREFIX, PAST, CHROMA_FRAMES = "prefix_length", "past_sequence_length", "chroma_frames"
STEP_INPUTS = ["input_ids", "encoder_hidden_states"]


def own_layout(model: torch.nn.Module) -> bool:
    return type(model).__name__ == CLASS


def text_encoder(model: torch.nn.Module) -> codes.TextEncoder:
    """The T5 encoder's states as the decoder's prefix holds them: projected where the widths differ,
    padded rows zeroed."""
    m: Any = model
    return codes.TextEncoder(model, m.text_encoder.config.hidden_size != m.decoder.config.hidden_size)


class ChromaPrefix(torch.nn.Module):
    """The chroma's rows as the decoder's prefix holds them: projected where the widths differ, row ``i``
    of ``chroma_length`` the frame ``i mod frames`` (transformers repeats the frames and truncates)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_features: torch.Tensor) -> torch.Tensor:
        model: Any = self.model
        states = input_features
        if model.config.num_chroma != model.decoder.config.hidden_size:
            states = model.audio_enc_to_dec_proj(states)
        rows = torch.arange(int(model.config.chroma_length), device=states.device) % states.shape[1]
        return states.index_select(1, rows)


class MelodyStep(torch.nn.Module):
    """One step of the decoder (``MusicgenMelodyForCausalLM``): the prefix (0 rows after the first step)
    and the codes over the self-attention cache; the codes' logits and the grown cache."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        input_ids: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        past_key_values: list[torch.Tensor],
    ) -> tuple[torch.Tensor, ...]:
        decoder: Any = self.model.decoder
        out = decoder(
            input_ids=input_ids,
            encoder_hidden_states=encoder_hidden_states,
            past_key_values=cache_of(past_key_values),
            use_cache=True,
            return_dict=True,
        )
        logits: torch.Tensor = out.logits[:, encoder_hidden_states.shape[1] :]
        return (logits, *(t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)))


def loop_graphs(model: torch.nn.Module, config: Any) -> dict[str, GraphSpec]:
    """The four graphs of the module docstring, at examples on the meta device."""
    del config
    m: Any = model
    codes.refuse_unsupported(m)
    layers, heads, size, books = codes.sizes(m)
    text_vocab, vocab = int(m.config.text_encoder.vocab_size), int(m.config.decoder.vocab_size)
    width, chroma = int(m.config.decoder.hidden_size), int(m.config.num_chroma)
    g = torch.Generator().manual_seed(0)
    batch, source, target, past, prefix, frames = 2, 6, 3, 4, 5, 3
    b = torch.export.Dim(BATCH, min=1, max=1024)
    e = torch.export.Dim(codes.ENCODER_SEQUENCE, min=1, max=1 << 20)
    d = torch.export.Dim(codes.DECODER_SEQUENCE, min=1, max=1 << 20)
    p = torch.export.Dim(PAST, min=0, max=1 << 20)
    text, _ = codes.text_encoder_spec(text_encoder(model), text_vocab, (batch, source), (b, e), g)
    chroma_prefix = GraphSpec(
        ChromaPrefix(model),
        (torch.randn(batch, frames, chroma, generator=g).to("meta"),),
        {"input_features": {0: b, 1: torch.export.Dim(CHROMA_FRAMES, min=1, max=1 << 20)}},
        ["input_features"],
        ["audio_hidden_states"],
    )
    step_args = (
        torch.randint(0, vocab, (batch * books, target), generator=g),
        torch.randn(batch, prefix, width, generator=g),
        [torch.randn(batch, heads, past, size, generator=g) for _ in range(2 * layers)],
    )
    step = GraphSpec(
        MelodyStep(model),
        tuple(pytree.tree_map(lambda t: t.to("meta"), step_args)),
        {
            "input_ids": {0: books * b, 1: d},
            "encoder_hidden_states": {0: b, 1: torch.export.Dim(PREFIX, min=0, max=1 << 20)},
            "past_key_values": [{0: b, 2: p} for _ in range(2 * layers)],
        },
        [*STEP_INPUTS, *cache_names(layers, "past_key_values")],
        ["logits", *cache_names(layers, "present")],
    )
    decode = codes.loop_graphs_decode(model)
    return {TEXT_ENCODER_FILE: text, CHROMA_FILE: chroma_prefix, DECODER_FILE: step, DECODE_FILE: decode}


def null_chroma(model: Any, batch: int) -> torch.Tensor:
    """transformers' chroma without a melody: one frame of ``[1, 0, ..., 0]`` a row."""
    features = torch.zeros(batch, 1, int(model.config.num_chroma))
    features[:, :, 0] = 1
    return features


def generated_by_sessions(
    sessions: dict[str, Any],
    run: Any,
    model: Any,
    inputs: dict[str, torch.Tensor],
    new_tokens: int,
    guidance: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The loop of the module docstring over the package's sessions (``run(session, names, tensors)``;
    ``inputs``: ``input_ids``, ``attention_mask`` and optionally ``input_features``): the prefix, the codes
    (1 x batch x codebooks x frames) and the audio."""
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    batch = ids.shape[0]
    layers, heads, size, books = codes.sizes(model)
    (text,) = run(sessions[TEXT_ENCODER_FILE], ["input_ids", "attention_mask"], [ids, mask])
    features = inputs.get("input_features", null_chroma(model, batch))
    (chroma,) = run(sessions[CHROMA_FILE], ["input_features"], [features])
    prefix = torch.cat([chroma, text], dim=1)
    guided = guidance > 1
    if guided:  # the unconditional rows: the null chroma's prefix and zeroed text states
        (null,) = run(sessions[CHROMA_FILE], ["input_features"], [null_chroma(model, batch)])
        prefix = torch.cat([prefix, torch.cat([null, torch.zeros_like(text)], dim=1)])
    cache = [torch.zeros(prefix.shape[0], heads, 0, size) for _ in range(2 * layers)]
    names = [*STEP_INPUTS, *cache_names(layers, "past_key_values")]

    def step(ids: torch.Tensor, first: bool) -> torch.Tensor:
        nonlocal cache
        fed = prefix if first else prefix[:, :0]
        logits, *cache = run(sessions[DECODER_FILE], names, [ids, fed, *cache])
        last: torch.Tensor = logits[:, -1]
        return last

    found = codes.generated_codes(step, model, batch, new_tokens, guidance)
    (audio,) = run(sessions[DECODE_FILE], ["audio_codes"], [found])
    return prefix, found, audio


def check_inputs(model: Any) -> dict[str, torch.Tensor]:
    """MusicGen's text inputs (a padded batch of two) and a melody's chroma of 3 frames (one-hot)."""
    ids, mask = codes.check_inputs(model)
    chroma = int(model.config.num_chroma)
    notes = torch.randint(0, chroma, (2, 3), generator=torch.Generator().manual_seed(1))
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "input_features": torch.nn.functional.one_hot(notes, chroma).float(),
    }


def check_package(
    sessions: dict[str, Any], model: Any, specs: dict[str, GraphSpec], run: Any, tolerance: Any
) -> list[VerificationInfo]:
    """The loop over the sessions against ``generate(do_sample=False, max_new_tokens=NEW_TOKENS)`` at each
    of MusicGen's ``guidance_scales``, without a melody (the null chroma) and with one: the prefix (at
    guidance 1), the codes (equal) and the audio."""
    del specs
    full = check_inputs(model)
    infos: list[VerificationInfo] = []
    for melody in (False, True):
        inputs = full if melody else {k: v for k, v in full.items() if k != "input_features"}
        for guidance in codes.guidance_scales(model):
            prefix, found, audio = generated_by_sessions(
                sessions, run, model, inputs, codes.NEW_TOKENS, guidance
            )
            with torch.no_grad(), codes.recorded_codes(model) as seen:
                want = model.generate(
                    **inputs, do_sample=False, guidance_scale=guidance, max_new_tokens=codes.NEW_TOKENS
                )
            at = f"{'melody' if melody else 'no melody'}, guidance {guidance:g}"
            if guidance == 1:
                with torch.no_grad():
                    out = model(
                        **inputs, decoder_input_ids=found.new_zeros(found.shape[1] * found.shape[2], 1)
                    )
                want_prefix = out.encoder_hidden_states
                infos.append(compare(f"prefix ({at})", want_prefix, prefix, *tolerance(want_prefix)))
            infos.append(compare(f"audio codes ({at})", seen[-1], found))
            if want.shape == audio.shape:
                infos.append(compare(f"audio_values ({at})", want, audio, *tolerance(want)))
            else:
                infos.append(compare(f"audio_values ({at})", want, audio))  # the shapes differ
    return infos
