"""Speech encoders' length-dependent code, swapped while torch.export captures for forms that compute the
same function at every waveform length without a guard on it.

SEW's and SEW-D's encoders pool the ``T`` frames by ``squeeze_factor`` (``s``) into ``T // s``, add a
strided positional convolution, run their layers and upsample back to ``s * (T // s)`` frames, zero-padded
to ``T``. transformers aligns the two halves with ``min(positions, pooled)`` and a slice, and pads under
``if upsampled < T``: the first compares two sizes sympy writes differently but that are the same number
(``(T - 2) // 2 + 1`` and ``T // 2``), the second depends on ``T % s``, so torch.export keeps a guard
either way. The forms here read the positions at the pooled frames' indices (the convolution, padded by
half its kernel, always gives at least that many) and pad by a read clamped to the upsampled frames, zeros
past them.

wav2vec2-conformer's relative position scores (Transformer-XL's) are skewed by padding a column, viewing
the ``(T, 2T)`` scores as ``(2T, T)``, dropping a row and viewing back: each view leaves a divisibility
guard (``(2T - 1) % T != 0``...) true at every ``T >= 2`` that sympy cannot prove, and torch.export
narrows the waveform to multiples of 320 samples. The form here gathers the same entries: query ``i``
and key ``j`` read column ``T - 1 - i + j`` (relative position ``i - j``).

Granite Speech's conformer attends within blocks of ``context_size`` frames and pads and masks the last
block under ``if frames % context_size > 0``: a guard on the frames. The form here always pads to whole
blocks (none when they divide) and masks the padded keys.

Granite Speech 5's conformer (its CTC model's) pads and masks the same way under ``if num_padded > 0``,
and slices the blocks' output back with ``[:, :frames]``; its subsampling blocks add a stride-2
convolution's ``ceil(T / 2)`` frames, sliced to the ``T // 2`` of a pairwise mean (``unfold``), and halve
a mask the same way: torch.export keeps the branch and, from each slice, whether it is whole (``T`` even).
The forms here always pad and mask, and read the first frames by index.

VibeVoice ASR's ``get_audio_features`` runs its two tokenizers' encoders over chunks of
``acoustic_tokenizer_chunk_size`` samples with streaming caches: each causal convolution pads its input
from its cache (zeros on the first chunk) and keeps the input's last samples for the next chunk, under
``if shortfall > 0`` (the input shorter than the kernel's context): a guard on the samples. The package's
graph reads one chunk (audio_language.most_frames), whose first, fresh caches pad with zeros as the
encoders' own uncached path does: the form here runs that path, the rest as transformers does.

Gemma 3n's audio encoder cuts its queries into blocks of ``chunk_size`` frames and pads the last under
``if blocks * chunk_size - frames > 0``: the same guard on the frames; it then slices the padded frames'
attention back to ``frames``, a length sympy writes ``min(frames, blocks * chunk_size)``. The form here
always pads (by zero frames when they divide) and reads the first ``frames`` rows by index.

Only the modules of ``SWAPS`` already imported are swapped, for the duration of the capture; in training
(LayerDrop) SEW's encoders run transformers' own forward.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch

from fastonnx.capture.model_swaps import swapped_forms


def squeeze_frames(
    encoder: Any, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """SEW's frames pooled by ``squeeze_factor`` plus the positional convolution at each, and the mask
    pooled alike (padded frames zeroed first, as transformers does)."""
    factor = int(encoder.config.squeeze_factor)
    if attention_mask is not None:
        hidden_states = hidden_states.masked_fill(~attention_mask.bool().unsqueeze(-1), 0.0)
        pooled_mask = torch.nn.functional.max_pool1d(
            attention_mask.float().unsqueeze(1), kernel_size=factor, stride=factor
        )
        attention_mask = pooled_mask.squeeze(1).long()
    frames = hidden_states.transpose(1, 2)
    pooled = encoder.pool(frames)
    positions = encoder.pos_conv_embed(frames)
    # the first pooled.shape[-1] positions, read by index: no comparison of the two lengths
    first = torch.arange(pooled.shape[-1], device=positions.device)
    squeezed = pooled + positions.index_select(-1, first)
    return squeezed.transpose(1, 2), attention_mask


def unsqueeze_frames(upsampled: torch.Tensor, frames: int | torch.SymInt) -> torch.Tensor:
    """``upsampled`` (batch, ``s * (T // s)``, width) zero-padded to ``frames`` (``T``) along dim 1."""
    count = upsampled.shape[1]
    index = torch.arange(frames, device=upsampled.device)
    read = upsampled.index_select(1, index.clamp(max=count - 1))
    return read.masked_fill((index >= count).unsqueeze(-1), 0.0)


def sew_encoder_forward(
    self: Any, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs: Any
) -> Any:
    """``SEWEncoder.forward``."""
    if self.training:
        return _original(self)(self, hidden_states, attention_mask, **kwargs)
    module = sys.modules[type(self).__module__]
    frames = hidden_states.shape[1]
    hidden_states, attention_mask = squeeze_frames(self, hidden_states, attention_mask)
    mask = module.create_bidirectional_mask(
        config=self.config, inputs_embeds=hidden_states, attention_mask=attention_mask
    )
    hidden_states = self.dropout(self.layer_norm(hidden_states))
    for layer in self.layers:
        hidden_states = layer(hidden_states, attention_mask=mask, **kwargs)
    upsampled = unsqueeze_frames(self.upsample(hidden_states), frames)
    return module.BaseModelOutput(last_hidden_state=upsampled)


def sew_d_encoder_forward(
    self: Any, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs: Any
) -> Any:
    """``SEWDEncoder.forward``."""
    if self.training:
        return _original(self)(self, hidden_states, attention_mask, **kwargs)
    module = sys.modules[type(self).__module__]
    frames = hidden_states.shape[1]
    hidden_states, attention_mask = squeeze_frames(self, hidden_states, attention_mask)
    if attention_mask is None:  # every pooled frame, sized from the pooled frames themselves
        attention_mask = hidden_states.new_ones(hidden_states.shape[:2], dtype=torch.long)
    encoded = self.encoder(hidden_states, attention_mask, **kwargs)
    upsampled = unsqueeze_frames(self.upsample(encoded.last_hidden_state), frames)
    return module.BaseModelOutput(last_hidden_state=upsampled)


def skewed_relative_scores(scores: torch.Tensor, keys: int | torch.SymInt) -> torch.Tensor:
    """Transformer-XL's shift of ``scores`` (..., ``T`` queries, ``2T - 1`` relative positions, from
    ``T - 1`` down to ``1 - T``) to (..., ``T``, ``keys``): entry ``i, j`` is column ``T - 1 - i + j``."""
    queries = scores.shape[-2]
    rows = torch.arange(queries, device=scores.device).unsqueeze(-1)
    cols = torch.arange(keys, device=scores.device)
    index = (cols - rows) + (queries - 1)
    return scores.gather(-1, index.expand(*scores.shape[:-2], queries, keys))


def conformer_relative_position_encoding(
    module: Any, query: torch.Tensor, key: torch.Tensor, relative_position_embeddings: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """wav2vec2-conformer's ``_apply_relative_position_encoding``: the query biased by ``pos_bias_u`` and
    the scaled relative position scores (matrices b + d)."""
    if relative_position_embeddings is None:
        raise ValueError(
            "`relative_position_embeddings` has to be defined when `self.position_embeddings_type == 'relative'`"
        )
    positions = module.linear_pos(relative_position_embeddings)
    # (1, 2T - 1, heads * size) -> (1, heads, size, 2T - 1); the heads named, not inferred (a -1 leaves
    # a divisibility guard)
    positions = positions.unflatten(-1, (module.num_heads, module.head_size)).permute(0, 2, 3, 1)
    scores = torch.matmul(query + module.pos_bias_v[None, :, None, :], positions)
    scores = skewed_relative_scores(scores, key.shape[2]) * module.scaling
    return query + module.pos_bias_u[None, :, None, :], scores


def granite_conformer_attention_forward(
    self: Any, hidden_states: torch.Tensor, attention_dists: torch.Tensor
) -> torch.Tensor:
    """``GraniteSpeechConformerAttention.forward``: the frames always padded to whole blocks of
    ``context_size`` (by zero frames when they divide) and the padded keys masked, where transformers pads
    and masks under ``if frames % context_size > 0``."""
    hidden_states = self.pre_norm(hidden_states)
    batch, frames, _ = hidden_states.shape
    size = int(self.context_size)
    blocks = (frames + size - 1) // size
    hidden_states = torch.nn.functional.pad(hidden_states, (0, 0, 0, blocks * size - frames))

    def per_block(states: torch.Tensor) -> torch.Tensor:
        return states.reshape(batch * blocks, size, self.num_heads, self.dim_head).transpose(1, 2)

    query = per_block(self.to_q(hidden_states))
    key, value = (per_block(t) for t in self.to_kv(hidden_states).chunk(2, dim=-1))
    # Shaw's relative positions (transformers' einsum, whose reshapes guard on the number of blocks
    # being 1): each query against the embeddings of every distance from c - 1 down to 1 - c, then query
    # i and key j read distance i - j (attention_dists depends on i - j alone)
    distances = torch.cat([attention_dists[:, 0].flip(0), attention_dists[0, 1:]])
    every = torch.matmul(query, self.rel_pos_emb(distances).transpose(0, 1))
    offsets = torch.arange(size, device=query.device)
    column = offsets.unsqueeze(0) - offsets.unsqueeze(1) + (size - 1)
    bias = every.gather(-1, column.expand(*every.shape[:-1], size)) * self.scale
    # the padded keys of the last block get the same fill as transformers'; padded queries are dropped
    padded = (torch.arange(blocks * size, device=bias.device) >= frames).reshape(blocks, 1, 1, size)
    bias = bias.masked_fill(padded.repeat(batch, 1, 1, 1), -torch.finfo(bias.dtype).max)
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=bias, scale=self.scale
        )
    out = out.transpose(1, 2).reshape(batch, blocks * size, -1)
    # the first ``frames`` rows read by index: a slice's length would be min(frames, blocks * size), which
    # sympy cannot simplify to frames
    kept = out.index_select(1, torch.arange(frames, device=out.device))
    result: torch.Tensor = self.dropout(self.to_out(kept))
    return result


def _first(states: torch.Tensor, count: int | torch.SymInt) -> torch.Tensor:
    """The first ``count`` frames (dim 1) of ``states``, read by index: a slice leaves a guard on whether
    it is whole, or a length sympy writes ``min(count, frames)``."""
    return states.index_select(1, torch.arange(count, device=states.device))


def granite5_attention_forward(
    self: Any,
    hidden_states: torch.Tensor,
    position_embeddings: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """``GraniteSpeech5EncoderAttention.forward``: the frames always padded to whole blocks of
    ``context_size`` (by zero frames when they divide) and the padded keys always masked, where
    transformers pads and masks under ``if num_padded > 0`` (no mask and whole blocks: nothing masked,
    the same scores)."""
    module = sys.modules[type(self).__module__]
    batch, frames, _ = hidden_states.shape
    size, heads = int(self.context_size), int(self.config.num_attention_heads)
    blocks = (frames + size - 1) // size
    pad = blocks * size - frames
    hidden_states = torch.nn.functional.pad(hidden_states, (0, 0, 0, pad))
    if attention_mask is None:
        attention_mask = torch.ones(batch, frames, dtype=torch.bool, device=hidden_states.device)
    attention_mask = torch.nn.functional.pad(attention_mask, (0, pad), value=False)

    def per_block(states: torch.Tensor) -> torch.Tensor:  # (batch x blocks, heads, size, head_dim)
        return states.reshape(batch * blocks, size, heads, self.head_dim).transpose(1, 2)

    query = per_block(self.q_proj(hidden_states))
    key, value = per_block(self.k_proj(hidden_states)), per_block(self.v_proj(hidden_states))
    relative = self.rel_pos_emb(position_embeddings) * self.scaling  # (size, size, head_dim)
    # each query row i against the embeddings of its distances to every key j of its block
    queries = query.permute(2, 0, 1, 3).reshape(size, batch * blocks * heads, self.head_dim)
    bias = torch.matmul(queries, relative.transpose(1, 2))  # (size, batch x blocks x heads, size)
    bias = bias.reshape(size, batch * blocks, heads, size).permute(1, 2, 0, 3).contiguous()
    key_mask = attention_mask.reshape(batch * blocks, size)
    bias = bias.masked_fill(~key_mask[:, None, None, :], torch.finfo(bias.dtype).min)
    attend: Callable[..., Any] = module.ALL_ATTENTION_FUNCTIONS.get_interface(
        self.config._attn_implementation, module.eager_attention_forward
    )
    out, _ = attend(
        self,
        query,
        key,
        value,
        attention_mask=bias,
        dropout=0.0 if not self.training else self.attention_dropout,
        scaling=self.scaling,
        **kwargs,
    )
    out = out.reshape(batch, blocks * size, heads * self.head_dim)
    return self.o_proj(_first(out, frames)), None


def granite5_subsampling_forward(
    self: Any,
    hidden_states: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    position_embeddings: torch.Tensor | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    """``GraniteSpeech5EncoderSubsamplingBlock.forward``: the pairwise mean of the frames (an odd last
    one dropped) and the strided convolution's first as many frames, read by index."""
    residual = hidden_states
    hidden_states = residual + 0.5 * self.feed_forward1(self.norm_feed_forward1(hidden_states))
    attn_output, _ = self.self_attn(
        hidden_states=self.norm_self_att(hidden_states),
        attention_mask=attention_mask,
        position_embeddings=position_embeddings,
        **kwargs,
    )
    hidden_states = hidden_states + attn_output
    conv_output = self.conv(self.norm_conv(hidden_states), attention_mask=attention_mask)
    half = hidden_states.shape[1] // 2
    even = torch.arange(half, device=hidden_states.device) * 2
    pairs = torch.stack([hidden_states.index_select(1, even), hidden_states.index_select(1, even + 1)], -1)
    hidden_states = pairs.mean(-1) + _first(conv_output, half)
    hidden_states = hidden_states + 0.5 * self.feed_forward2(self.norm_feed_forward2(hidden_states))
    out: torch.Tensor = self.norm_out(hidden_states)
    return out


def granite5_downsample_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """``downsample_attention_mask``: a half-rate frame is valid where both its frames are (an odd last
    frame dropped), the pairs read by index."""
    even = torch.arange(attention_mask.shape[1] // 2, device=attention_mask.device) * 2
    return attention_mask.index_select(1, even).bool() & attention_mask.index_select(1, even + 1).bool()


def vibevoice_asr_audio_features(
    self: Any,
    input_values: torch.Tensor,
    padding_mask: torch.Tensor | None = None,
    sample: bool = True,
    **kwargs: Any,
) -> Any:
    """``VibeVoiceAsrModel.get_audio_features`` on one chunk: the tokenizers' encoders without their
    streaming caches (a fresh cache pads with zeros, as their uncached path does), then the noise where
    ``sample``, the projector and the rows of the tokens ``padding_mask`` covers, as transformers does."""
    module = sys.modules[type(self).__module__]
    with torch.no_grad():
        acoustic = self.acoustic_tokenizer_encoder(input_values).latents
        semantic = self.semantic_tokenizer_encoder(input_values).latents
        if sample:
            std = self.config.acoustic_tokenizer_encoder_config.vae_std * torch.randn(
                acoustic.shape[0], device=acoustic.device, dtype=acoustic.dtype
            )
            acoustic = acoustic + std[:, None, None] * torch.randn_like(acoustic)
    combined = self.multi_modal_projector(acoustic, semantic)
    if padding_mask is not None:
        hop = int(self.config.acoustic_tokenizer_encoder_config.hop_length)
        tokens = (padding_mask.sum(dim=-1) + hop - 1) // hop
        kept = torch.arange(combined.shape[1], device=tokens.device) < tokens[:, None]
        combined = combined[kept]
    return module.BaseModelOutputWithPooling(last_hidden_state=acoustic, pooler_output=combined)


def gemma3n_blocks(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    """``Gemma3nAudioAttention._convert_to_block``: ``[batch, blocks, chunk_size, ...]``, the frames always
    padded with zeros to whole blocks (none where they divide)."""
    batch, frames = hidden_states.shape[:2]
    size = int(self.chunk_size)
    # written as the keys' unfold counts its blocks ((frames + pads - context) // size + 1), so that
    # torch.export sees the two counts as one
    blocks = (frames - 1) // size + 1
    inner = [0, 0] * (hidden_states.dim() - 2)  # F.pad's pairs start at the last dim
    padded = torch.nn.functional.pad(hidden_states, (*inner, 0, blocks * size - frames))
    return padded.reshape(batch, blocks, size, *hidden_states.shape[2:]).contiguous()


def gemma3n_attention_forward(self: Any, hidden_states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``Gemma3nAudioAttention.forward``: each block's queries against its context's keys (the module's own
    ``_extract_block_context`` and relative position embedding), masked where the key is padding
    (``mask`` True) or outside the local window, with ``gemma3n_blocks``' queries and the frames' rows
    read by index."""
    shape = (*hidden_states.shape[:-1], self.num_heads, self.head_dim)
    query, key, value = (p(hidden_states).reshape(shape) for p in (self.q_proj, self.k_proj, self.v_proj))
    scale = torch.nn.functional.softplus(self.per_dim_scale).view(1, 1, 1, self.head_dim)
    query = query * self.q_scale * scale
    batch, frames = query.shape[:2]
    queries = gemma3n_blocks(self, query)
    keys, values = self._extract_block_context(key), self._extract_block_context(value)
    valid = self._extract_block_context(~mask)  # [batch, blocks, context]
    window = self.local_causal_valid_mask.to(valid.device)  # [chunk, context]
    allowed = valid[:, None, :, None, :] & window[None, None, None]
    logits = self.relative_position_embedding(queries, keys)  # [batch, heads, blocks, chunk, context]
    cap = self.softcap.to(logits.device)
    logits = torch.tanh(logits / cap) * cap
    logits = torch.where(allowed, logits, torch.finfo(logits.dtype).min)
    weights = torch.nn.functional.softmax(logits, dim=-1, dtype=torch.float32).to(values.dtype)
    # per block and head (one bmm over batch x blocks x heads), weights [chunk, context] x values
    # [context, head_dim]
    _, heads, blocks, chunk, width = weights.shape
    flat_weights = weights.permute(0, 2, 1, 3, 4).reshape(-1, chunk, width)
    flat_values = values.permute(0, 1, 3, 2, 4).reshape(-1, width, self.head_dim)
    context = torch.bmm(flat_weights, flat_values).reshape(batch, blocks, heads, chunk, self.head_dim)
    context = context.permute(0, 1, 3, 2, 4).reshape(batch, blocks * chunk, heads, self.head_dim)
    out: torch.Tensor = context.index_select(1, torch.arange(frames, device=context.device))
    return out


SWAPS: dict[str, dict[str, Callable[..., Any]]] = {
    "gemma3n": {"Gemma3nAudioAttention.forward": gemma3n_attention_forward},
    "sew": {"SEWEncoder.forward": sew_encoder_forward},
    "sew_d": {"SEWDEncoder.forward": sew_d_encoder_forward},
    "wav2vec2_conformer": {"_apply_relative_position_encoding": conformer_relative_position_encoding},
    "granite_speech": {"GraniteSpeechConformerAttention.forward": granite_conformer_attention_forward},
    "granite_speech_plus": {
        "GraniteSpeechPlusConformerAttention.forward": granite_conformer_attention_forward
    },
    "vibevoice_asr": {"VibeVoiceAsrModel.get_audio_features": vibevoice_asr_audio_features},
    "granite_speech5": {
        "GraniteSpeech5EncoderAttention.forward": granite5_attention_forward,
        "GraniteSpeech5EncoderSubsamplingBlock.forward": granite5_subsampling_forward,
        "downsample_attention_mask": granite5_downsample_mask,
    },
}
"""transformers' model types (``transformers.models.<type>.modeling_<type>``), each with its functions or
``Class.method``s and the forms swapped in."""

_ORIGINALS: dict[tuple[Any, str], Callable[..., Any]] = {}
"""The methods swapped out while a swap is active, for SEW's training path."""


def _original(encoder: Any) -> Callable[..., Any]:
    """transformers' ``forward`` of ``encoder``'s class, swapped out."""
    return next(_ORIGINALS[c, "forward"] for c in type(encoder).__mro__ if (c, "forward") in _ORIGINALS)


@contextlib.contextmanager
def guard_free_speech_encoders() -> Iterator[None]:
    """While active, the loaded modules of ``SWAPS`` have the forms of this module."""
    with swapped_forms(SWAPS) as swapped:
        for owner, name, original in swapped:
            _ORIGINALS[owner, name] = original
        try:
            yield
        finally:
            for owner, name, _ in swapped:
                _ORIGINALS.pop((owner, name), None)
