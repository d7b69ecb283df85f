"""text-to-audio of CsmForConditionalGeneration (Sesame's CSM): transformers' ``generate(output_audio=True)``
as three graphs, one a stage of its generation, the loop the runtime's.

Files (``b`` the batch, ``K`` = ``num_codebooks``, ``V`` = ``vocab_size``: the codes of a codebook):

- ``backbone_model.onnx``: one step of the backbone decoder with its cache (one graph for the first step
  and the later ones). ``input_ids`` (``b`` x ``sequence_length``: text token ids, or -1 where the
  position is an audio frame), ``audio_codes`` (``b`` x ``sequence_length`` x ``K``: the frame's codes,
  read where ``input_ids`` is -1; any code, 0, elsewhere), ``attention_mask`` (``b`` x
  ``total_sequence_length``: past and new positions, 0 at left padding), ``position_ids`` (``b`` x
  ``sequence_length``) and ``past_key_values.%d.key`` / ``.value`` (``b`` x kv heads x
  ``past_sequence_length`` x head size; 0 positions on the first step) to ``logits`` (``b`` x
  ``sequence_length`` x ``V``: codebook 0's), ``hidden_states`` (``b`` x ``sequence_length`` x hidden: the
  backbone's normalized last states, which the depth decoder starts from) and ``present.%d.key`` /
  ``.value``. A text position's input is ``embed_text_tokens`` of its id, an audio position's the sum over
  the codebooks of ``embed_audio_tokens(code + k * V)``.
- ``depth_decoder.onnx``: one step of the depth decoder with its cache. ``input_ids`` (``b`` x
  ``sequence_length``), ``backbone_last_hidden_state`` (``b`` x the backbone's hidden size) and
  ``past_key_values.%d.key`` / ``.value`` (0 to ``K - 1`` positions) to ``logits`` (``b`` x
  ``sequence_length`` x ``V``) and ``present.*``. Position ``p`` (the past's length plus its index) is
  codebook ``p - 1``'s code embedded (``embed_tokens(id + (p - 1) * V)``), position 0 the backbone's state
  instead (its id unread); position ``p``'s logits are codebook ``p``'s (the codebook head ``p - 1``;
  position 0's row predicts nothing: head 0 over it).
- ``codec_decode.onnx``: Mimi's decode. ``audio_codes`` (``b`` x ``K`` x frames) to ``audio_values``
  (``b`` x 1 x samples).

The loop (``generated_by_sessions`` runs it; greedy, as ``generate(input_ids, attention_mask,
do_sample=False, depth_decoder_do_sample=False, max_new_tokens=N, output_audio=True)``; ``eos`` =
``codebook_eos_token_id``, ``pad`` = ``codebook_pad_token_id``):

1. Prefill: the prompt's ids (CsmProcessor's, left-padded) as ``input_ids``, ``audio_codes`` zeros,
   ``attention_mask`` the prompt's, ``position_ids`` its cumulative sum less one (0 at padding), an empty
   cache.
2. Each frame: ``backbone_model``; codebook 0 is the argmax of the last position's ``logits``. Then
   ``depth_decoder`` from an empty cache: first ``input_ids`` = ``[0, code 0]`` with
   ``backbone_last_hidden_state`` = the last position's ``hidden_states``; each later step the code just
   chosen (``b`` x 1), the state fed again (unread). The argmax of the last position's logits at each of
   the ``K - 1`` steps is codebooks 1 to ``K - 1``.
3. Where the generation config has an ``eos_token_id``, a row already finished gets a frame of ``pad``.
   A row finishes when its frame's codebooks 0 to ``K - 2`` are all ``eos``; the loop stops when every row
   has, or after ``N`` frames.
4. The next backbone step: ``input_ids`` -1 (``b`` x 1), ``audio_codes`` the frame (``b`` x 1 x ``K``),
   the mask grown by a column of ones, ``position_ids`` the last plus one, the cache returned.
5. Decode: each row alone, its frames up to the first whose ``K`` codes are all ``eos``, as ``audio_codes``
   (1 x ``K`` x frames); ``audio_values[0, 0]`` is its waveform.

Sampling (sesame/csm-1b's generation config samples both decoders: temperature and top-k) is the
runtime's choice over the same logits; the check runs greedy. A prompt with audio context (the processor's
``input_values``, which transformers encodes with Mimi's encoder and places at ``audio_token_id``
positions, ``audio_eos_token_id`` positions an all-``eos`` frame) is the same first step with those
positions' ``input_ids`` -1 and their codes in ``audio_codes``; the package has no Mimi encoder, and the
check runs text prompts.
"""

from __future__ import annotations

from typing import Any

import torch

from fastonnx.diagnostics.verdicts import VerificationInfo, compare
from fastonnx.errors import InputError
from fastonnx.pretrained.graph_spec import BATCH, PAST, SEQUENCE, TOTAL, GraphSpec
from fastonnx.pretrained.loop_caches import cache_names
from fastonnx.pretrained.loop_caches import decoder_sizes as _sizes
from fastonnx.pretrained.loop_caches import present as _present
from fastonnx.pretrained.task_inputs import cache_of
from fastonnx.torch_internals import pytree

BACKBONE_FILE, DEPTH_FILE, CODEC_FILE = "backbone_model.onnx", "depth_decoder.onnx", "codec_decode.onnx"
AUDIO_POSITION = -1
"""``input_ids`` at a position whose input is the frame in ``audio_codes``."""
BACKBONE_INPUTS = ["input_ids", "audio_codes", "attention_mask", "position_ids"]
DEPTH_INPUTS = ["input_ids", "backbone_last_hidden_state"]


def own_layout(model: torch.nn.Module) -> bool:
    return type(model).__name__ == "CsmForConditionalGeneration"


class BackboneStep(torch.nn.Module):
    """The backbone over text and audio-frame positions (``input_ids`` -1), with its codebook-0 head."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        input_ids: torch.Tensor,
        audio_codes: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past_key_values: list[torch.Tensor],
    ) -> tuple[torch.Tensor, ...]:
        model: Any = self.model
        text = model.embed_text_tokens(input_ids.clamp(min=0))
        audio = model.backbone_model.embed_tokens(audio_codes)  # the codebooks' embeddings summed
        embeds = torch.where((input_ids != AUDIO_POSITION).unsqueeze(-1), text, audio)
        out = model.backbone_model(
            inputs_embeds=embeds,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache_of(past_key_values),
            use_cache=True,
        )
        hidden = out.last_hidden_state
        return (model.lm_head(hidden), hidden, *_present(out.past_key_values))


class DepthStep(torch.nn.Module):
    """The depth decoder's forward with its position 0 the backbone's state and every position's own
    codebook head (transformers picks the heads by the positions of the logits it keeps)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        input_ids: torch.Tensor,
        backbone_last_hidden_state: torch.Tensor,
        past_key_values: list[torch.Tensor],
    ) -> tuple[torch.Tensor, ...]:
        depth: Any = self.model.depth_decoder
        inner = depth.model
        past = past_key_values[0].shape[2]
        positions = torch.arange(input_ids.shape[1], device=input_ids.device) + past
        books = (positions - 1).clamp(min=0)
        embeds = inner.embed_tokens(input_ids + books * int(inner.vocab_size))
        first = (positions == 0)[None, :, None]
        embeds = torch.where(first, backbone_last_hidden_state[:, None], embeds)
        out = inner(inputs_embeds=embeds, past_key_values=cache_of(past_key_values), use_cache=True)
        heads = depth.codebooks_head.weight[books]  # positions x hidden x V
        # a position a batch of the product (matmul's decomposition would guard the batch size against 1)
        logits = torch.bmm(out.last_hidden_state.transpose(0, 1), heads).transpose(0, 1)
        return (logits, *_present(out.past_key_values))


class CodecDecode(torch.nn.Module):
    """Mimi's ``decode`` of the codes (no padding mask, no streaming cache). Its codebooks keep their code
    vectors (``embed_sum`` over ``cluster_usage``) in a plain attribute the first call computes: cleared
    around the call, so that the graph computes them from the checkpoint's buffers and no capture's value
    stays on the model."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, audio_codes: torch.Tensor) -> torch.Tensor:
        codec: Any = self.model.codec_model
        books = [m for m in codec.quantizer.modules() if hasattr(m, "embed_sum") and hasattr(m, "_embed")]
        for book in books:
            book._embed = None
        try:
            out: torch.Tensor = codec.decode(audio_codes).audio_values
        finally:
            for book in books:
                book._embed = None
        return out


def refuse_unsupported(model: Any) -> None:
    codec = type(model.codec_model).__name__
    if codec != "MimiModel":
        raise InputError(
            f"CsmForConditionalGeneration: its codec is {codec}; codec_decode.onnx exports Mimi's"
        )
    books, quantizers = int(model.config.num_codebooks), int(model.config.codec_config.num_quantizers)
    if books > quantizers:
        raise InputError(
            f"CsmForConditionalGeneration: {books} codebooks but its Mimi codec has {quantizers} quantizers: "
            "its frames cannot be decoded"
        )


def stage_graphs(model: torch.nn.Module, config: Any) -> dict[str, GraphSpec]:
    """The three files' graphs, at examples on the meta device."""
    refuse_unsupported(model)
    g = torch.Generator().manual_seed(0)
    books, vocab = int(config.num_codebooks), int(config.vocab_size)
    b = torch.export.Dim(BATCH, min=1, max=1024)
    s = torch.export.Dim(SEQUENCE, min=1, max=1 << 20)
    p = torch.export.Dim(PAST, min=0, max=1 << 20)
    layers, heads, size = _sizes(config)
    batch, tokens, past = 2, 3, 4
    args: list[Any] = [
        torch.randint(0, int(config.text_vocab_size), (batch, tokens), generator=g),
        torch.randint(0, vocab, (batch, tokens, books), generator=g),
        torch.ones(batch, past + tokens, dtype=torch.int64),
        torch.arange(past, past + tokens).repeat(batch, 1),
        [torch.randn(batch, heads, past, size, generator=g) for _ in range(2 * layers)],
    ]
    backbone = GraphSpec(
        BackboneStep(model),
        tuple(pytree.tree_map(lambda t: t.to("meta"), args)),
        {
            "input_ids": {0: b, 1: s},
            "audio_codes": {0: b, 1: s},
            "attention_mask": {0: b, 1: TOTAL},
            "position_ids": {0: b, 1: s},
            "past_key_values": [{0: b, 2: p} for _ in range(2 * layers)],
        },
        [*BACKBONE_INPUTS, *cache_names(layers, "past_key_values")],
        ["logits", "hidden_states", *cache_names(layers, "present")],
    )
    depth_config = config.depth_decoder_config
    d_layers, d_heads, d_size = _sizes(depth_config)
    # positions 2 and 3: codebooks 1 and 2 (a decoder step's example: 0 or 1 positions would specialize)
    d_tokens, d_past = 2, 2
    depth_args: list[Any] = [
        torch.randint(0, vocab, (batch, d_tokens), generator=g),
        torch.randn(batch, int(depth_config.backbone_hidden_size), generator=g),
        [torch.randn(batch, d_heads, d_past, d_size, generator=g) for _ in range(2 * d_layers)],
    ]
    depth = GraphSpec(
        DepthStep(model),
        tuple(pytree.tree_map(lambda t: t.to("meta"), depth_args)),
        {
            "input_ids": {0: b, 1: s},
            "backbone_last_hidden_state": {0: b},
            "past_key_values": [{0: b, 2: p} for _ in range(2 * d_layers)],
        },
        [*DEPTH_INPUTS, *cache_names(d_layers, "past_key_values")],
        ["logits", *cache_names(d_layers, "present")],
    )
    codes = torch.randint(0, int(config.codec_config.codebook_size), (batch, books, 5), generator=g)
    codec = GraphSpec(
        CodecDecode(model),
        (codes.to("meta"),),
        {"audio_codes": {0: b, 2: torch.export.Dim("frames", min=1, max=1 << 20)}},
        ["audio_codes"],
        ["audio_values"],
    )
    return {BACKBONE_FILE: backbone, DEPTH_FILE: depth, CODEC_FILE: codec}


def frame_codes(depth: Any, run: Any, config: Any, first: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """Step 2's depth decoder: the frame's ``K`` codes (``b`` x ``K``) from codebook 0's and the
    backbone's last state."""
    depth_config = config.depth_decoder_config
    layers, heads, size = _sizes(depth_config)
    batch = first.shape[0]
    cache = [torch.zeros(batch, heads, 0, size) for _ in range(2 * layers)]
    names = [*DEPTH_INPUTS, *cache_names(layers, "past_key_values")]
    ids = torch.stack([torch.zeros_like(first), first], dim=1)
    codes = [first]
    for _ in range(int(config.num_codebooks) - 1):
        logits, *cache = run(depth, names, [ids, state, *cache])
        code = logits[:, -1].argmax(-1)
        codes.append(code)
        ids = code[:, None]
    return torch.stack(codes, dim=1)


def generated_by_sessions(
    sessions: dict[str, Any],
    run: Any,
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    max_new_tokens: int,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The module docstring's loop over the package's sessions (``run(session, names, tensors)``): the
    frames' codes (``b`` x frames x ``K``) and each row's waveform."""
    config = model.config
    books = int(config.num_codebooks)
    eos, pad = int(config.codebook_eos_token_id), int(config.codebook_pad_token_id)
    pads_finished = model.generation_config.eos_token_id is not None
    layers, heads, size = _sizes(config)
    batch = input_ids.shape[0]
    names = [*BACKBONE_INPUTS, *cache_names(layers, "past_key_values")]
    cache = [torch.zeros(batch, heads, 0, size) for _ in range(2 * layers)]
    ids, mask = input_ids, attention_mask
    codes = torch.zeros(*ids.shape, books, dtype=torch.int64)
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    unfinished = torch.ones(batch, dtype=torch.bool)
    frames: list[torch.Tensor] = []
    for _ in range(max_new_tokens):
        logits, hidden, *cache = run(sessions[BACKBONE_FILE], names, [ids, codes, mask, positions, *cache])
        first = logits[:, -1].argmax(-1)
        frame = frame_codes(sessions[DEPTH_FILE], run, config, first, hidden[:, -1])
        if pads_finished:
            frame = torch.where(unfinished[:, None], frame, pad)
        frames.append(frame)
        unfinished &= ~(frame[:, :-1] == eos).all(-1)
        if not bool(unfinished.any()):
            break
        ids, codes = torch.full((batch, 1), AUDIO_POSITION), frame[:, None]
        mask = torch.cat([mask, torch.ones(batch, 1, dtype=mask.dtype)], dim=1)
        positions = positions[:, -1:] + 1
    sequences = torch.stack(frames, dim=1)
    waves = []
    for row in sequences:
        ended = (row == eos).all(-1).nonzero()
        count = int(ended.min()) if ended.numel() else row.shape[0]
        (audio,) = run(sessions[CODEC_FILE], ["audio_codes"], [row[:count].T[None]])
        waves.append(audio[0, 0])
    return sequences, waves


CHECKED = ((1, 5, 3), (2, 7, 4))
"""(batch, prompt tokens, frames) of the verification's generations: the second with its second row
left-padded by 3."""


def check_inputs(config: Any, batch: int, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch`` prompts of text ids (below the special ids CSM's tiny and released vocabularies end
    with), the second row left-padded as CsmProcessor pads."""
    vocab = int(config.text_vocab_size)
    specials = [
        int(v)
        for v in (config.pad_token_id, config.bos_token_id, config.audio_token_id, config.audio_eos_token_id)
        if isinstance(v, int)
    ]
    top = min([vocab, *(v for v in specials if v > 3)])
    ids = torch.randint(3, top, (batch, tokens), generator=torch.Generator().manual_seed(batch * 10 + tokens))
    mask = torch.ones_like(ids)
    if batch > 1:
        mask[1, :3] = 0
        ids[1, :3] = int(config.pad_token_id) if config.pad_token_id is not None else 0
    return ids, mask


def check_package(
    sessions: dict[str, Any], model: Any, specs: dict[str, GraphSpec], run: Any, tolerance: Any
) -> list[VerificationInfo]:
    """The loop over the sessions against ``generate(do_sample=False, depth_decoder_do_sample=False,
    output_audio=True)``: codebook 0's codes (the backbone's) and the others (the depth decoder's) equal,
    each row's waveform within ``tolerance``."""
    del specs
    infos: list[VerificationInfo] = []
    for batch, tokens, frames in CHECKED:
        ids, mask = check_inputs(model.config, batch, tokens)
        got, waves = generated_by_sessions(sessions, run, model, ids, mask, frames)
        with torch.no_grad():
            want = model.generate(
                ids,
                attention_mask=mask,
                do_sample=False,
                depth_decoder_do_sample=False,
                max_new_tokens=frames,
                output_audio=True,
                return_dict_in_generate=True,
            )
        size = f"{batch}x{tokens}"
        sequences = want.sequences
        if sequences.shape != got.shape:
            infos.append(compare(f"codes ({size})", sequences, got))
            continue
        infos.append(compare(f"backbone codes ({size})", sequences[..., 0], got[..., 0]))
        infos.append(compare(f"depth decoder codes ({size})", sequences[..., 1:], got[..., 1:]))
        for row, (e, a) in enumerate(zip(want.audio, waves, strict=True)):
            infos.append(
                compare(f"waveform ({size}, row {row})", e, a, *(tolerance(e) if e.shape == a.shape else ()))
            )
    return infos
