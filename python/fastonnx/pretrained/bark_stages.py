"""text-to-audio of BarkModel: transformers' ``BarkModel.generate`` as four graphs, one a stage, the loops
the runtime's.

Files (``b`` the batch, ``L`` each causal model's layers, ``H`` x ``D`` its heads and head size):

- ``semantic_model.onnx``: BarkSemanticModel, one step of a causal GPT with its cache (one graph for the
  first step and the later ones). ``input_ids``, ``history_ids`` (``b`` x ``sequence_length``) and
  ``past_key_values.%d.key`` / ``.value`` (``b`` x H x ``past_sequence_length`` x D; 0 positions on the
  first step) to ``logits`` (``b`` x ``sequence_length`` x ``output_vocab_size``) and ``present.%d.key`` /
  ``.value``. A position's input is the embedding of its ``input_ids`` plus, where ``history_ids`` is not
  -1, the embedding of ``history_ids`` (Bark adds the voice's semantic history to the text's embeddings).
- ``coarse_model.onnx``: BarkCoarseModel, the same without ``history_ids``.
- ``fine_model.onnx``: BarkFineModel, non-causal. ``codebook_idx`` (an int64 scalar, 1 to
  ``n_codes_total - 1``: the codebook predicted) and ``input_ids`` (``b`` x ``sequence_length`` x
  ``n_codes_total``: every codebook's codes, ``codebook_size`` where not known) to ``logits`` (``b`` x
  ``sequence_length`` x ``output_vocab_size``). Its input sums the embeddings of codebooks 0 to
  ``codebook_idx``.
- ``codec_decode.onnx``: EnCodec's decode. ``audio_codes`` (``b`` x ``n_fine_codebooks`` x frames) to
  ``waveform`` (``b`` x samples: the quantizer's code vectors summed, then its decoder).

The loop (``generated_by_sessions`` runs it; the numbers are the checkpoint's generation_config.json
values, ``semantic_config`` ``s``, ``coarse_acoustics_config`` ``c``, ``fine_acoustics_config`` ``f``,
``codebook_size`` ``K``; greedy, no voice preset):

1. Semantic. The text's ids (BarkProcessor's, padded to ``s.max_input_semantic_length`` = N tokens) plus
   ``s.text_encoding_offset``, ``s.text_pad_token`` where the attention mask is 0. First step:
   ``input_ids`` = those N ids then ``s.semantic_infer_token``; ``history_ids`` = N times
   ``s.semantic_pad_token`` (``eos_token_id``) then -1. Each later step: the last token, ``history_ids``
   -1. On the last position's logits: ids from ``s.semantic_vocab_size`` to ``output_vocab_size``, but for
   the eos itself, to -inf; where ``min_eos_p`` is given (``BarkModel.generate``'s argument: it does not
   read the generation config's) and softmax(those scores)[eos] exceeds it, every
   id but the eos to -inf; argmax. A row that gave its eos gives the pad token (``s.pad_token_id``, else
   eos) from then on; stop when every row has, or after ``semantic_max_new_tokens`` (``generate``'s
   argument, else ``s.max_new_tokens``) tokens.
2. Coarse. The semantic tokens, eos/pad replaced by ``c.coarse_semantic_pad_token``. With ratio =
   ``c.coarse_rate_hz / s.semantic_rate_hz * c.n_coarse_codebooks``: each row's length ``round(floor(n *
   ratio / c.n_coarse_codebooks) * c.n_coarse_codebooks)`` (n its semantic tokens before the pad; float32
   arithmetic), T the longest; ``ceil(T / c.sliding_window_len)`` windows. Window: ``i = round(generated /
   ratio)`` (Python's round), the semantic tokens from ``max(0, i - floor(c.max_coarse_history / ratio))``,
   the first ``c.max_coarse_input_length`` of them right-padded to that length with the coarse pad, then
   ``c.coarse_infer_token``, then the last ``c.max_coarse_history`` coarse tokens generated so far. Each
   window runs from an empty cache (its whole input the first step) for ``min(c.sliding_window_len, T -
   generated)`` tokens: the k-th new token of the window (k from 0) picks among ids ``s.semantic_vocab_size
   + [0, K)`` when k is even, ``s.semantic_vocab_size + K`` and above when odd.
3. Fine. The coarse tokens as (frames x ``c.n_coarse_codebooks``), ``(t - s.semantic_vocab_size) mod K``;
   the other codebooks up to ``f.n_fine_codebooks`` filled with K, frames padded with K to at least
   ``f.max_fine_input_length`` = M (P the frames added). ``1 + max(0, ceil((frames - M) /
   f.max_fine_history_length))`` windows: window j starts at ``min(j * h, total - M)`` (h the history
   length) and fills from ``min(j * h, total - h)``; for each codebook from ``c.n_coarse_codebooks`` on,
   ``fine_model`` over the window's M frames, argmax of the logits' first K ids from the fill position on,
   written into the window (the next codebook reads it), then into the codes. Drop the P padded frames.
4. Decode. ``codec_decode`` on each row's codes alone (1 x ``f.n_fine_codebooks`` x frames), cut to its
   coarse length / ``c.n_coarse_codebooks`` frames: transformers' ``return_output_lengths`` (EnCodec's
   LSTMs would read a shorter row's padding).

Sampling (the checkpoints' do_sample and temperatures: the fine stage samples whenever its temperature is
not 1) is the runtime's choice over the same logits; the check runs greedy, the fine temperature at 1. A
voice preset (``history_prompt``) changes only the loop's inputs: its semantic prompt's last N ids as the
first step's ``history_ids`` (right-padded with the semantic pad), its coarse and fine prompts prepended
as transformers' ``BarkCoarseModel.preprocess_histories`` and ``BarkFineModel.generate`` do; the check
runs without one.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from fastonnx.capture.model_swaps import swapped_forms
from fastonnx.diagnostics.verdicts import VerificationInfo, compare
from fastonnx.errors import InputError
from fastonnx.pretrained.graph_spec import BATCH, PAST, SEQUENCE, GraphSpec
from fastonnx.pretrained.loop_caches import cache_names
from fastonnx.pretrained.loop_caches import present as _present
from fastonnx.pretrained.task_inputs import cache_of
from fastonnx.torch_internals import pytree

SEMANTIC_FILE, COARSE_FILE, FINE_FILE, CODEC_FILE = (
    "semantic_model.onnx",
    "coarse_model.onnx",
    "fine_model.onnx",
    "codec_decode.onnx",
)
NO_HISTORY = -1
"""``history_ids`` where a position adds no second embedding."""


def own_layout(model: torch.nn.Module) -> bool:
    return type(model).__name__ == "BarkModel"


def _attention(self: Any, query: Any, key: Any, value: Any, attention_mask: Any = None) -> tuple[Any, Any]:
    """``BarkSelfAttention._attn`` with its causal mask made for the keys' length: transformers slices a
    ``block_size`` square buffer at ``[keys - queries : keys, :keys]``, a length torch.export cannot prove
    within the block (past + new positions)."""
    weights = torch.matmul(query, key.transpose(-1, -2)) * (1.0 / math.sqrt(self.head_dim))
    if self.is_causal:
        queries, keys = query.size(-2), key.size(-2)
        rows = torch.arange(keys - queries, keys, device=query.device).unsqueeze(-1)
        hidden = torch.arange(keys, device=query.device) > rows
        weights = weights.masked_fill(hidden, torch.finfo(weights.dtype).min)
    if attention_mask is not None:
        weights = weights + attention_mask
    weights = self.attn_dropout(torch.nn.functional.softmax(weights, dim=-1).to(value.dtype))
    return torch.matmul(weights, value), weights


def _no_padding(**kwargs: Any) -> None:
    """No padding mask: Bark's generate passes all-ones masks (its text is padded with a pad id, not by
    the mask), which transformers skips in eager; traced, it would build one over the new positions only
    (not the cache's)."""
    del kwargs


def causal_masks() -> Any:
    """While active, Bark's attention masks from the lengths (``_attention``), no padding mask."""
    return swapped_forms(
        {"bark": {"BarkSelfAttention._attn": _attention, "create_bidirectional_mask": _no_padding}}
    )


class SemanticStep(torch.nn.Module):
    """BarkSemanticModel's forward on ``input_ids``' embeddings plus ``history_ids``' (none at -1)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, input_ids: torch.Tensor, history_ids: torch.Tensor, past_key_values: list[torch.Tensor]
    ) -> tuple[torch.Tensor, ...]:
        semantic: Any = self.model.semantic
        embed = semantic.input_embeds_layer
        added = embed(history_ids.clamp(min=0))
        embeds = embed(input_ids) + torch.where((history_ids != NO_HISTORY).unsqueeze(-1), added, 0.0)
        with causal_masks():
            out = semantic(
                inputs_embeds=embeds,
                past_key_values=cache_of(past_key_values),
                use_cache=True,
                return_dict=True,
            )
        return (out.logits, *_present(out.past_key_values))


class CoarseStep(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, input_ids: torch.Tensor, past_key_values: list[torch.Tensor]
    ) -> tuple[torch.Tensor, ...]:
        coarse: Any = self.model.coarse_acoustics
        with causal_masks():
            out = coarse(
                input_ids=input_ids,
                past_key_values=cache_of(past_key_values),
                use_cache=True,
                return_dict=True,
            )
        return (out.logits, *_present(out.past_key_values))


class FineStage(torch.nn.Module):
    """BarkFineModel's forward with ``codebook_idx`` a tensor: its embedding sum and head picked by value
    (transformers indexes its ModuleLists with the int)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, codebook_idx: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        fine: Any = self.model.fine_acoustics
        tables = fine.input_embeds_layers
        every = torch.stack([table(input_ids[:, :, i]) for i, table in enumerate(tables)], dim=-1)
        books = torch.arange(len(tables), device=input_ids.device)
        # transformers sums the first codebook_idx + 1 codebooks' embeddings
        embeds = torch.where(books <= codebook_idx, every, 0.0).sum(dim=-1)
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        hidden = fine.drop(embeds + fine.position_embeds_layer(positions))
        for block in fine.layers:
            hidden = block(hidden)[0]
        hidden = fine.layernorm_final(hidden)
        heads = torch.stack([head.weight for head in fine.lm_heads])
        weight = heads[codebook_idx - int(fine.config.n_codes_given)]
        return torch.nn.functional.linear(hidden, weight)


class CodecDecode(torch.nn.Module):
    """``BarkModel.codec_decode`` of one batch: the code vectors summed over the codebooks, the decoder."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, audio_codes: torch.Tensor) -> torch.Tensor:
        codec: Any = self.model.codec_model
        vectors = codec.quantizer.decode(audio_codes.transpose(0, 1))
        out: torch.Tensor = codec.decoder(vectors).squeeze(1)
        return out


def _causal_sizes(config: Any) -> tuple[int, int, int, int]:
    """(layers, heads, head size, block size) of a causal sub-model's config."""
    heads = int(config.num_heads)
    return int(config.num_layers), heads, int(config.hidden_size) // heads, int(config.block_size)


def generation_configs(model: Any) -> tuple[Any, Any, Any, int]:
    """The semantic, coarse and fine generation configs ``BarkModel.generate`` builds from its
    generation config, and the codebook size."""
    from transformers.models.bark.generation_configuration_bark import (
        BarkCoarseGenerationConfig,
        BarkFineGenerationConfig,
        BarkSemanticGenerationConfig,
    )

    generation = model.generation_config
    if not isinstance(getattr(generation, "semantic_config", None), dict):
        raise InputError(
            "BarkModel's generation config has no semantic_config (its generation_config.json, which "
            "holds the vocabulary offsets and windows of its generate): not exportable without it"
        )
    return (
        BarkSemanticGenerationConfig(**generation.semantic_config),  # type: ignore[no-untyped-call]
        BarkCoarseGenerationConfig(**generation.coarse_acoustics_config),
        BarkFineGenerationConfig(**generation.fine_acoustics_config),  # type: ignore[no-untyped-call]
        int(generation.codebook_size),
    )


def _causal_graph(step: torch.nn.Module, config: Any, ids: list[str], g: torch.Generator) -> GraphSpec:
    layers, heads, size, block = _causal_sizes(config)
    batch, tokens, past = 2, 5, 3
    b = torch.export.Dim(BATCH, min=1, max=1024)
    s = torch.export.Dim(SEQUENCE, min=1, max=block)
    p = torch.export.Dim(PAST, min=0, max=block - 1)
    vocab = int(config.input_vocab_size)
    args: list[Any] = [torch.randint(0, vocab, (batch, tokens), generator=g) for _ in ids]
    args.append([torch.randn(batch, heads, past, size, generator=g) for _ in range(2 * layers)])
    shapes: dict[str, Any] = {name: {0: b, 1: s} for name in ids}
    shapes["past_key_values"] = [{0: b, 2: p} for _ in range(2 * layers)]
    return GraphSpec(
        step,
        tuple(pytree.tree_map(lambda t: t.to("meta"), args)),
        shapes,
        [*ids, *cache_names(layers, "past_key_values")],
        ["logits", *cache_names(layers, "present")],
    )


def stage_graphs(model: torch.nn.Module, config: Any) -> dict[str, GraphSpec]:
    """The four files' graphs."""
    g = torch.Generator().manual_seed(0)
    semantic = _causal_graph(SemanticStep(model), config.semantic_config, ["input_ids", "history_ids"], g)
    coarse = _causal_graph(CoarseStep(model), config.coarse_acoustics_config, ["input_ids"], g)
    fine_config = config.fine_acoustics_config
    books = int(fine_config.n_codes_total)
    b = torch.export.Dim(BATCH, min=1, max=1024)
    fine = GraphSpec(
        FineStage(model),
        (
            torch.tensor(books - 1).to("meta"),
            torch.randint(0, int(fine_config.input_vocab_size), (2, 6, books), generator=g).to("meta"),
        ),
        {
            "codebook_idx": {},
            # a window of max_fine_input_length frames, never one: the capture proves its matmuls' shapes
            "input_ids": {0: b, 1: torch.export.Dim(SEQUENCE, min=2, max=fine_config.block_size)},
        },
        ["codebook_idx", "input_ids"],
        ["logits"],
    )
    codebooks = int(config.codec_config.codebook_size)
    codec = GraphSpec(
        CodecDecode(model),
        (torch.randint(0, codebooks, (2, books, 5), generator=g).to("meta"),),
        {"audio_codes": {0: b, 2: torch.export.Dim("frames", min=1, max=1 << 20)}},
        ["audio_codes"],
        ["waveform"],
    )
    return {SEMANTIC_FILE: semantic, COARSE_FILE: coarse, FINE_FILE: fine, CODEC_FILE: codec}


class _Causal:
    """Greedy steps of a causal stage's session from an empty cache."""

    def __init__(self, session: Any, run: Any, config: Any, ids: list[str], batch: int) -> None:
        layers, heads, size, _ = _causal_sizes(config)
        self.session, self.run = session, run
        self.names = [*ids, *cache_names(layers, "past_key_values")]
        self.cache = [torch.zeros(batch, heads, 0, size) for _ in range(2 * layers)]

    def last_logits(self, *ids: torch.Tensor) -> torch.Tensor:
        logits, *self.cache = self.run(self.session, self.names, [*ids, *self.cache])
        out: torch.Tensor = logits[:, -1].float()
        return out


def _eos(config: Any) -> int:
    eos = config.eos_token_id
    return int(eos[0] if isinstance(eos, list) else eos)


def semantic_tokens(
    session: Any,
    run: Any,
    model_config: Any,
    s: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    max_new_tokens: int,
    min_eos_p: float | None = None,
) -> torch.Tensor:
    """Step 1 of the module docstring."""
    batch, width = input_ids.shape
    if width != int(s.max_input_semantic_length):
        raise InputError(
            f"Bark's semantic model reads its text padded to max_input_semantic_length "
            f"({s.max_input_semantic_length}) tokens, as BarkProcessor pads it; got {width}"
        )
    eos = _eos(s)
    pad = eos if s.pad_token_id is None else int(s.pad_token_id)
    text = (input_ids + int(s.text_encoding_offset)).masked_fill(attention_mask == 0, int(s.text_pad_token))
    ids = torch.cat([text, torch.full((batch, 1), int(s.semantic_infer_token))], dim=1)
    history = torch.full((batch, width + 1), int(s.semantic_pad_token))
    history[:, -1] = NO_HISTORY
    stage = _Causal(session, run, model_config, ["input_ids", "history_ids"], batch)
    vocab = int(model_config.output_vocab_size)
    allowed = torch.zeros(vocab, dtype=torch.bool)
    allowed[: int(s.semantic_vocab_size)] = True
    allowed[int(s.semantic_pad_token)] = True
    done = torch.zeros(batch, dtype=torch.bool)
    tokens: list[torch.Tensor] = []
    for _ in range(max_new_tokens):
        scores = stage.last_logits(ids, history).masked_fill(~allowed, -math.inf)
        if min_eos_p:
            only_eos = torch.full_like(scores, -math.inf)
            only_eos[:, eos] = scores[:, eos]
            stop = scores.softmax(-1)[:, eos] > min_eos_p
            scores = torch.where(stop.unsqueeze(1), only_eos, scores)
        token = torch.where(done, pad, scores.argmax(-1))
        tokens.append(token)
        done |= token == eos
        if bool(done.all()):
            break
        ids, history = token.unsqueeze(1), torch.full((batch, 1), NO_HISTORY)
    return torch.stack(tokens, dim=1)


def coarse_tokens(
    session: Any, run: Any, model_config: Any, s: Any, c: Any, semantic: torch.Tensor, codebook: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 2 of the module docstring: the coarse tokens and each row's count."""
    semantic = semantic.masked_fill(semantic == int(s.semantic_pad_token), int(c.coarse_semantic_pad_token))
    books = int(c.n_coarse_codebooks)
    ratio = c.coarse_rate_hz / s.semantic_rate_hz * books
    max_semantic_history = math.floor(c.max_coarse_history / ratio)
    lengths = torch.floor((semantic != int(c.coarse_semantic_pad_token)).sum(1) * ratio / books)
    lengths = torch.round(lengths * books).int()
    total = int(lengths.max())
    batch, window_len, width = semantic.shape[0], int(c.sliding_window_len), int(c.max_coarse_input_length)
    first = int(s.semantic_vocab_size)
    coarse = torch.zeros(batch, 0, dtype=torch.int64)
    vocab = int(model_config.output_vocab_size)
    books_ids = torch.arange(vocab)
    even = (books_ids >= first) & (books_ids < first + codebook)
    for _ in range(math.ceil(total / window_len)):
        start = max(0, round(coarse.shape[1] / ratio) - max_semantic_history)
        window = semantic[:, start:][:, :width]
        window = torch.nn.functional.pad(
            window, (0, width - window.shape[1]), value=int(c.coarse_semantic_pad_token)
        )
        infer = torch.full((batch, 1), int(c.coarse_infer_token))
        ids = torch.cat(
            [window, infer, coarse[:, coarse.shape[1] - min(coarse.shape[1], int(c.max_coarse_history)) :]],
            dim=1,
        )
        stage = _Causal(session, run, model_config, ["input_ids"], batch)
        for k in range(min(window_len, total - coarse.shape[1])):
            allowed = even if k % 2 == 0 else books_ids >= first + codebook
            token = stage.last_logits(ids).masked_fill(~allowed, -math.inf).argmax(-1)
            coarse = torch.cat([coarse, token.unsqueeze(1)], dim=1)
            ids = token.unsqueeze(1)
    return coarse, lengths


def fine_tokens(
    session: Any, run: Any, s: Any, c: Any, f: Any, coarse: torch.Tensor, codebook: int
) -> torch.Tensor:
    """Step 3 of the module docstring: (b x ``f.n_fine_codebooks`` x frames) codes."""
    books = int(c.n_coarse_codebooks)
    codes = torch.remainder(coarse.view(coarse.shape[0], -1, books) - int(s.semantic_vocab_size), codebook)
    frames = codes.shape[1]
    window, history = int(f.max_fine_input_length), int(f.max_fine_history_length)
    codes = torch.nn.functional.pad(codes, (0, int(f.n_fine_codebooks) - books), value=codebook)
    padded = max(0, window - frames)
    codes = torch.nn.functional.pad(codes, (0, 0, 0, padded), value=codebook)
    total = codes.shape[1]
    for j in range(max(0, math.ceil((frames - window) / history)) + 1):
        start = min(j * history, total - window)
        fill = min(j * history, total - history)
        buffer = codes[:, start : start + window].clone()
        for book in range(books, int(f.n_fine_codebooks)):
            (logits,) = run(session, ["codebook_idx", "input_ids"], [torch.tensor(book), buffer])
            buffer[:, fill - start :, book] = logits[:, fill - start :, :codebook].argmax(-1)
        codes[:, fill : fill + window - (fill - start), books:] = buffer[:, fill - start :, books:]
    return codes.transpose(1, 2)[:, :, :frames]


def waveforms(session: Any, run: Any, codes: torch.Tensor, frames: list[int]) -> list[torch.Tensor]:
    """Step 4 of the module docstring: each row's waveform."""
    out = []
    for row, count in zip(codes, frames, strict=True):
        (wave,) = run(session, ["audio_codes"], [row[None, :, :count]])
        out.append(wave[0])
    return out


def generated_by_sessions(
    sessions: dict[str, Any],
    run: Any,
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    semantic_max_new_tokens: int,
    min_eos_p: float | None = None,
) -> dict[str, Any]:
    """The module docstring's loop over the package's sessions (``run(session, names, tensors)``): the
    semantic, coarse and fine tokens, the padded waveforms and their lengths in samples."""
    s, c, f, codebook = generation_configs(model)
    config = model.config
    semantic = semantic_tokens(
        sessions[SEMANTIC_FILE],
        run,
        config.semantic_config,
        s,
        input_ids,
        attention_mask,
        semantic_max_new_tokens,
        min_eos_p,
    )
    coarse, lengths = coarse_tokens(
        sessions[COARSE_FILE], run, config.coarse_acoustics_config, s, c, semantic, codebook
    )
    fine = fine_tokens(sessions[FINE_FILE], run, s, c, f, coarse, codebook)
    frames = (lengths // int(c.n_coarse_codebooks)).tolist()
    rows = waveforms(sessions[CODEC_FILE], run, fine, frames)
    return {
        "semantic": semantic,
        "coarse": coarse,
        "fine": fine,
        "waveform": torch.nn.utils.rnn.pad_sequence(rows, batch_first=True),
        "samples": [r.shape[0] for r in rows],
    }


@contextmanager
def recorded(model: Any, stages: dict[str, Any]) -> Iterator[None]:
    """Inside the block, each sub-model's ``generate`` output kept in ``stages`` (the semantic tokens
    copied before the coarse stage overwrites its pads in place)."""
    subs = {"semantic": model.semantic, "coarse": model.coarse_acoustics, "fine": model.fine_acoustics}

    def keeping(name: str, generate: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            out = generate(*args, **kwargs)
            stages[name] = (out[0] if isinstance(out, tuple) else out).clone()
            return out

        return call

    for name, sub in subs.items():
        sub.generate = keeping(name, sub.generate)
    try:
        yield
    finally:
        for sub in subs.values():
            del sub.generate


CHECKED = ((1, 5, 6), (2, 7, 24))
"""(batch, text tokens, semantic_max_new_tokens) of the verification's generations: the second with a
shorter text, and 72 coarse tokens unless an eos comes first (two of suno/bark's 60-token windows)."""


def text_inputs(s: Any, batch: int, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch`` texts of ``tokens`` ids (the second shorter), padded to the semantic input length as
    BarkProcessor pads them."""
    width = int(s.max_input_semantic_length)
    text_vocab = min(1000, int(s.text_pad_token) - int(s.text_encoding_offset))  # the ids below the pad
    g = torch.Generator().manual_seed(batch * 100 + tokens)
    ids = torch.zeros(batch, width, dtype=torch.int64)
    mask = torch.zeros(batch, width, dtype=torch.int64)
    for row in range(batch):
        n = min(width, tokens - 2 * row)
        ids[row, :n] = torch.randint(0, text_vocab, (n,), generator=g)
        mask[row, :n] = 1
    return ids, mask


def check_package(
    sessions: dict[str, Any], model: Any, specs: dict[str, GraphSpec], run: Any, tolerance: Any
) -> list[VerificationInfo]:
    """The loop over the sessions against ``model.generate(do_sample=False, fine_temperature=1.0,
    return_output_lengths=True)``: equal tokens at every stage, the waveforms within ``tolerance``."""
    del specs
    s = generation_configs(model)[0]
    infos: list[VerificationInfo] = []
    for batch, tokens, new in CHECKED:
        ids, mask = text_inputs(s, batch, tokens)
        got = generated_by_sessions(sessions, run, model, ids, mask, new)
        want: dict[str, Any] = {}
        with torch.no_grad(), recorded(model, want):
            want["waveform"], want["samples"] = model.generate(
                ids,
                attention_mask=mask,
                do_sample=False,
                semantic_max_new_tokens=new,
                fine_temperature=1.0,
                return_output_lengths=True,
            )
        size = f"{batch}x{tokens}"
        for stage in ("semantic", "coarse", "fine"):
            infos.append(compare(f"{stage} tokens ({size})", want[stage].long(), got[stage].long()))
        infos.append(
            compare(f"samples ({size})", torch.tensor(want["samples"]), torch.tensor(got["samples"]))
        )
        e, a = want["waveform"], got["waveform"]
        infos.append(compare(f"waveform ({size})", e, a, *(tolerance(e) if e.shape == a.shape else ())))
    return infos
