"""The BART and T5 families' shift of ``input_ids`` into ``decoder_input_ids``, swapped while torch.export
captures for a form that computes the same function at every length without a guard.

Given no decoder ids (their classifiers, question answering and masked LM graphs), those models shift
``input_ids`` right with ``shifted[:, 1:] = input_ids[:, :-1].clone()``: a tensor of length ``L - 1``,
whose contiguity check leaves the guard ``L - 1 != 1`` (guards.py then refuses length 2).
``shift_right_from_start`` (BART, MVP, BigBird-Pegasus, LED), ``shift_right_wrapping_eos`` (mBART, PLBart:
each row's last non-pad token moved to the front) and ``t5_shift_right`` (T5, mT5, UMT5) read position
``max(i - 1, 0)`` for every ``i`` and put the start token at 0: no tensor of length ``L - 1`` at all.

Their sequence classifiers' pooling at the last eos (a boolean-mask read, then ``view(batch, -1, width)``)
is left as transformers writes it: torch.export keeps its data-dependent size unbacked, and the file is
transformers' function on every input it accepts (as many eos tokens in every row, at least one); its
checks of the counts become runtime asserts, which ONNX drops (converters/checks.py).

M2M100's, NLLB-MoE's, SeamlessM4T's (v2's) and Kosmos-2's (2.5's) sinusoidal position embeddings read a table sized at init
and rebuild it larger when ``padding_idx + 1 + L + past`` exceeds it: a branch on the length (the guard
``L <= 129`` for a table of 128 positions; where torch does not keep it, a graph gathering past its
table). ``sinusoidal_positions_by_formula`` computes each position's row from the
table's own formula instead, the same function at every length; ``musicgen_positions_by_formula`` does
the same for MusicGen's and MusicGen Melody's decoders (cosines first, positions ``past..past + L - 1``, no padding row), whose
table of ``max_position_embeddings`` rows is rebuilt past ``L + past``. ProphetNet's positions after the past
go through ``int(padding_idx + past + length)``, which specialises the past length;
``prophetnet_positions`` makes the same position from the sizes as a tensor.

Long-input encoders split the sequence into blocks of a length padded to a multiple, whose reshape
torch cannot prove for a symbolic length. LongT5's local attention (``split_into_padded_blocks``,
``longt5_local_attention``) and PEGASUS-X's encoder (``pegasus_x_encoder_by_blocks``, wrapping the
original) always pad, to ``L // block + 1`` blocks, and keep the first ``L`` positions. LED's windowed
attention chunks with ``as_strided`` over a count read by ``.item()``, and branches on ``.item()`` of
"any global token"; ``led_attention_dense`` computes the same attention dense with masks (quadratic in
the length, as a dense attention is), global tokens included, and the encoder no longer pads to the
window (``led_no_window_padding``).

Only the modules of ``SWAPS`` already imported are swapped, for the duration of the capture.
"""

from __future__ import annotations

import contextlib
import functools
import math
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch

from fastonnx.capture.model_swaps import swapped_forms


def _shifted(ids: torch.Tensor, first: int | torch.Tensor) -> torch.Tensor:
    """``ids`` moved one position right along the last dim, ``first`` at position 0 (a number, or a
    tensor broadcasting against ``ids[..., :1]``)."""
    positions = torch.arange(ids.shape[-1], device=ids.device)
    previous = ids.index_select(-1, (positions - 1).clamp(min=0))
    return torch.where(positions == 0, first, previous)


def shift_right_from_start(
    input_ids: torch.Tensor, pad_token_id: int | None, decoder_start_token_id: int
) -> torch.Tensor:
    """transformers' ``shift_tokens_right`` of BART, MVP, BigBird-Pegasus and LED."""
    if pad_token_id is None:
        raise ValueError("self.model.config.pad_token_id has to be defined.")
    shifted = _shifted(input_ids, decoder_start_token_id)
    return shifted.masked_fill(shifted == -100, pad_token_id)  # labels' ignored positions made pad


def shift_right_wrapping_eos(input_ids: torch.Tensor, pad_token_id: int | None) -> torch.Tensor:
    """transformers' ``shift_tokens_right`` of mBART and PLBart: each row's last non-pad token (its
    language code / eos) moved to the front."""
    if pad_token_id is None:
        raise ValueError("self.model.config.pad_token_id has to be defined.")
    tokens = input_ids.masked_fill(input_ids == -100, pad_token_id)
    last = (tokens.ne(pad_token_id).sum(dim=1) - 1).unsqueeze(-1)
    return _shifted(tokens, tokens.gather(1, last))


def t5_shift_right(self: Any, input_ids: torch.Tensor) -> torch.Tensor:
    """``T5PreTrainedModel._shift_right`` (mT5's, UMT5's alike)."""
    start, pad = self.config.decoder_start_token_id, self.config.pad_token_id
    if start is None:
        raise ValueError("self.model.config.decoder_start_token_id has to be defined.")
    if pad is None:
        raise ValueError("self.model.config.pad_token_id has to be defined.")
    shifted = _shifted(input_ids, start)
    return shifted.masked_fill(shifted == -100, pad)


@torch.no_grad()
def sinusoidal_positions_by_formula(
    self: Any,
    input_ids: torch.Tensor | None = None,
    inputs_embeds: torch.Tensor | None = None,
    past_key_values_length: int | torch.Tensor = 0,
    position_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """``M2M100SinusoidalPositionalEmbedding.forward`` (NLLB-MoE's, Kosmos-2's and Kosmos-2.5's alike,
    those taking ``position_ids`` too): the rows of ``get_embedding``'s table at the positions, computed
    for those positions alone (the same float32 products, sines and cosines), so no table has to cover
    the length."""
    if position_ids is not None:
        positions = position_ids
    elif input_ids is not None:
        positions = self.create_position_ids_from_input_ids(
            input_ids, self.padding_idx, past_key_values_length
        )
    else:
        assert inputs_embeds is not None
        positions = self.create_position_ids_from_inputs_embeds(
            inputs_embeds, past_key_values_length, self.padding_idx
        )
    half = self.embedding_dim // 2
    step = math.log(10000) / (half - 1)
    device = positions.device
    frequencies = torch.exp(torch.arange(half, dtype=torch.int64, device=device).float() * -step)
    angles = positions.float().unsqueeze(-1) * frequencies
    rows = torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1)
    if self.embedding_dim % 2 == 1:
        rows = torch.nn.functional.pad(rows, (0, 1))
    if self.padding_idx is not None:  # the table's padding row is zeros
        rows = rows.masked_fill((positions == self.padding_idx).unsqueeze(-1), 0.0)
    return rows.to(self.weights.dtype)


def _sinusoidal_rows(embedding_dim: int, positions: torch.Tensor) -> torch.Tensor:
    """``get_embedding``'s rows of MusicGen's table (cosines, then sines) at ``positions`` alone."""
    half = embedding_dim // 2
    step = math.log(10000) / (half - 1)
    frequencies = torch.exp(torch.arange(half, dtype=torch.int64, device=positions.device).float() * -step)
    angles = positions.float().unsqueeze(-1) * frequencies
    rows = torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1)
    return torch.nn.functional.pad(rows, (0, 1)) if embedding_dim % 2 == 1 else rows


def musicgen_positions_by_formula(
    self: Any, input_ids: torch.Tensor, past_key_values_length: int | torch.Tensor = 0
) -> torch.Tensor:
    """``MusicgenSinusoidalPositionalEmbedding.forward``: the table's rows at positions ``past .. past +
    L - 1`` (``input_ids``: batch x codebooks x L), computed for those positions alone, so no table has to
    cover the length."""
    positions = torch.arange(input_ids.shape[-1], device=input_ids.device) + past_key_values_length
    return _sinusoidal_rows(self.embedding_dim, positions).to(self.weights.dtype)


def melody_positions_by_formula(
    self: Any, inputs_embeds: torch.Tensor, past_key_values_length: int | torch.Tensor = 0
) -> torch.Tensor:
    """``MusicgenMelodySinusoidalPositionalEmbedding.forward`` (``inputs_embeds``: batch x L x width)
    likewise."""
    positions = torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device) + past_key_values_length
    return _sinusoidal_rows(self.embedding_dim, positions).to(self.weights.dtype)


def prophetnet_positions(
    self: Any,
    inputs_shape: tuple[int, int],
    device: torch.device,
    attention_mask: torch.Tensor | None = None,
    past_key_values: Any = None,
    position_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``ProphetNetPositionalEmbeddings.forward``: a step after the past reads position
    ``padding_idx + past + length`` as a tensor made from the lengths, not through ``int()``."""
    if position_ids is None:
        past = past_key_values.get_seq_length() if past_key_values is not None else 0
        if past_key_values is not None and past != 0:
            position = self.padding_idx + inputs_shape[1] + past
            position_ids = torch.ones((1, 1), dtype=torch.long, device=device) * position
        else:
            if attention_mask is None:
                attention_mask = torch.ones(inputs_shape, dtype=torch.long, device=device)
            positions = torch.cumsum(attention_mask, dim=1).type_as(attention_mask) * attention_mask
            position_ids = (positions.long() + self.padding_idx).clamp(0, self.max_length - 1)
    return torch.nn.Embedding.forward(self, position_ids), position_ids


def split_into_padded_blocks(x: torch.Tensor, block_len: int, dim: int) -> torch.Tensor:
    """LongT5's ``_split_into_blocks``, always padded: ``L // block_len + 1`` blocks (1 to ``block_len``
    zero positions), a count torch proves the reshape against. Where ``L`` is a multiple the extra block
    is all zeros, keys and values and mask, as the zero block ``_concatenate_3_blocks`` pads the last
    block's neighbours with: the real positions' outputs are the same."""
    length = x.shape[dim]
    blocks = length // block_len + 1
    pad = [0, 0] * (x.ndim - 1 - dim) + [0, blocks * block_len - length]
    padded = torch.nn.functional.pad(x, pad)
    return padded.reshape(*x.shape[:dim], blocks, block_len, *x.shape[dim + 1 :])


def longt5_local_attention(
    self: Any,
    hidden_states: torch.Tensor,
    mask: torch.Tensor | None = None,
    position_bias: torch.Tensor | None = None,
    output_attentions: bool = False,
) -> tuple[torch.Tensor, ...]:
    """``LongT5LocalAttention.forward`` over ``split_into_padded_blocks``' blocks, its output's first
    ``L`` positions gathered (a slice would leave the guard ``L <= block_len * (L // block_len + 1)``,
    which torch's range reasoning cannot prove)."""
    from fastonnx.capture.chunked_kernels import first_positions

    batch, length = hidden_states.shape[:2]
    heads, size = self.n_heads, self.key_value_proj_dim
    q, k, v = (
        split_into_padded_blocks(proj(hidden_states).view(batch, length, heads, size), self.block_len, 1)
        for proj in (self.q, self.k, self.v)
    )
    module = sys.modules[type(self).__module__]
    k, v = (module._concatenate_3_blocks(x, block_dim=1, sequence_dim=2) for x in (k, v))
    scores = torch.einsum("...qhd,...khd->...hqk", q, k)
    if position_bias is None:
        if not self.has_relative_attention_bias:
            position_bias = scores.new_zeros((1, 1, heads, self.block_len, 3 * self.block_len))
        else:
            position_bias = self.compute_bias(self.block_len)
        if mask is not None:  # -1e10 where masked, as the original implementation
            position_bias = position_bias + torch.where(mask > 0, 0.0, -1e10).transpose(1, 2)
    scores = scores + position_bias
    weights = torch.nn.functional.softmax(scores.float(), dim=-1).type_as(scores).type(v.dtype)
    out = torch.einsum("...hqk,...khd->...qhd", weights, v).reshape(batch, -1, self.inner_dim)
    out = self.o(first_positions(out, length, dim=1))
    return (out, position_bias, weights) if output_attentions else (out, position_bias)


def pegasus_x_encoder_by_blocks(
    original: Callable[..., Any],
    self: Any,
    input_ids: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    inputs_embeds: torch.Tensor | None = None,
    **kwargs: Any,
) -> Any:
    """``PegasusXEncoder.forward`` (``original``) on inputs padded to ``L // block_size + 1`` blocks (1
    to ``block_size`` masked positions), a length whose blocks torch proves; the states' first ``L``
    positions returned. transformers pads to a multiple only where ``L`` is none, zeros at the mask's
    minimum: every query sees its global tokens unmasked, so masked keys weigh exactly 0 whatever their
    states, and the real positions' and global tokens' states are the same."""
    from fastonnx.capture.chunked_kernels import first_positions

    given = input_ids if input_ids is not None else inputs_embeds
    assert given is not None, "PegasusXEncoder takes input_ids or inputs_embeds"
    length = given.shape[1]
    pad = (length // self.config.block_size + 1) * self.config.block_size - length
    if attention_mask is None:
        attention_mask = torch.ones(given.shape[:2], dtype=torch.long, device=given.device)
    attention_mask = torch.nn.functional.pad(attention_mask, (0, pad))
    if input_ids is not None:
        filler = self.config.pad_token_id if self.config.pad_token_id is not None else 0
        input_ids = torch.nn.functional.pad(input_ids, (0, pad), value=filler)
    else:
        assert inputs_embeds is not None
        inputs_embeds = torch.nn.functional.pad(inputs_embeds, (0, 0, 0, pad))
    out = original(
        self, input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds, **kwargs
    )
    out.last_hidden_state = first_positions(out.last_hidden_state, length, dim=1)
    return out


def led_attention_dense(
    self: Any,
    hidden_states: torch.Tensor,
    attention_mask: torch.Tensor,
    is_index_masked: torch.Tensor,
    is_index_global_attn: torch.Tensor,
    is_global_attn: Any = None,
    output_attentions: bool = False,
) -> tuple[torch.Tensor]:
    """``LEDEncoderSelfAttention.forward`` over all the positions at once, with masks instead of chunks
    and index lists. A local query attends to the keys within ``one_sided_attn_window_size`` whose mask
    is 0 (not padding, not global) and to every global key, with the local projections; a global query
    to every key not padded, with the global ones; a padded query's output is 0. transformers' chunks
    compute the same scores and leave other keys at -inf or the dtype's minimum (a weight of 0), and
    its global branch, taken where ``.item()`` finds a global token, is the ``where`` here."""
    if output_attentions:
        raise NotImplementedError("the dense LED attention returns no attention weights")
    batch, length, _ = hidden_states.shape
    heads, size = self.num_heads, self.head_dim

    def split(x: torch.Tensor) -> torch.Tensor:
        return x.view(batch, length, heads, size).transpose(1, 2)

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
        scores = torch.matmul(split(q / math.sqrt(size)), split(k).transpose(-1, -2))
        scores = scores.masked_fill(masked, torch.finfo(scores.dtype).min)
        probs = torch.nn.functional.softmax(scores, dim=-1, dtype=torch.float32).type_as(scores)
        return torch.matmul(probs, split(v))

    positions = torch.arange(length, device=hidden_states.device)
    near = (positions[:, None] - positions[None, :]).abs() <= self.one_sided_attn_window_size
    local_keys = (near & (attention_mask == 0)[:, None, :]) | is_index_global_attn[:, None, :]
    states = hidden_states
    local = attend(self.query(states), self.key(states), self.value(states), ~local_keys[:, None])
    local = local.masked_fill(is_index_masked[:, None, :, None], 0.0)
    every = is_index_masked[:, None, None, :]
    glob = attend(self.query_global(states), self.key_global(states), self.value_global(states), every)
    out = torch.where(is_index_global_attn[:, None, :, None], glob, local)
    return (out.transpose(1, 2).reshape(batch, length, heads * size),)


def led_no_window_padding(
    self: Any,
    input_ids: torch.Tensor | None,
    attention_mask: torch.Tensor,
    inputs_embeds: torch.Tensor,
    pad_token_id: int,
) -> tuple[int, torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """``LEDEncoder._pad_to_window_size`` padding nothing: ``led_attention_dense`` needs no multiple of
    the window, and the padding it adds is masked keys and dropped queries."""
    return 0, input_ids, attention_mask, inputs_embeds


WRAPPING = frozenset({pegasus_x_encoder_by_blocks})
"""Forms that take the method they replace as their first argument (called around it)."""


def _around(form: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def method(*args: Any, **kwargs: Any) -> Any:
        return form(original, *args, **kwargs)

    return method


SWAPS: dict[str, dict[str, Callable[..., Any]]] = {
    "bart": {"shift_tokens_right": shift_right_from_start},
    "mvp": {"shift_tokens_right": shift_right_from_start},
    "bigbird_pegasus": {"shift_tokens_right": shift_right_from_start},
    "mbart": {"shift_tokens_right": shift_right_wrapping_eos},
    "plbart": {"shift_tokens_right": shift_right_wrapping_eos},
    "t5": {"T5PreTrainedModel._shift_right": t5_shift_right},
    "mt5": {"MT5PreTrainedModel._shift_right": t5_shift_right},
    "umt5": {"UMT5PreTrainedModel._shift_right": t5_shift_right},
    "m2m_100": {"M2M100SinusoidalPositionalEmbedding.forward": sinusoidal_positions_by_formula},
    "nllb_moe": {"NllbMoeSinusoidalPositionalEmbedding.forward": sinusoidal_positions_by_formula},
    "kosmos2": {"Kosmos2TextSinusoidalPositionalEmbedding.forward": sinusoidal_positions_by_formula},
    "kosmos2_5": {"Kosmos2_5TextSinusoidalPositionalEmbedding.forward": sinusoidal_positions_by_formula},
    "seamless_m4t": {"SeamlessM4TSinusoidalPositionalEmbedding.forward": sinusoidal_positions_by_formula},
    "seamless_m4t_v2": {
        "SeamlessM4Tv2SinusoidalPositionalEmbedding.forward": sinusoidal_positions_by_formula
    },
    "prophetnet": {"ProphetNetPositionalEmbeddings.forward": prophetnet_positions},
    "musicgen": {"MusicgenSinusoidalPositionalEmbedding.forward": musicgen_positions_by_formula},
    "musicgen_melody": {"MusicgenMelodySinusoidalPositionalEmbedding.forward": melody_positions_by_formula},
    "longt5": {
        "_split_into_blocks": split_into_padded_blocks,
        "LongT5LocalAttention.forward": longt5_local_attention,
    },
    "pegasus_x": {"PegasusXEncoder.forward": pegasus_x_encoder_by_blocks},
    "led": {
        "shift_tokens_right": shift_right_from_start,
        "LEDEncoderSelfAttention.forward": led_attention_dense,
        "LEDEncoder._pad_to_window_size": led_no_window_padding,
    },
}
"""transformers' model types (``transformers.models.<type>.modeling_<type>``), each with its functions or
``Class.method``s and the forms swapped in: listed per module, as other modules' ``shift_tokens_right``
(FSMT's, MusicGen's...) are other functions of the same name."""


@contextlib.contextmanager
def guard_free_seq2seq_shifts() -> Iterator[None]:
    """While active, the loaded modules of ``SWAPS`` have the forms of this module."""
    with swapped_forms(SWAPS, lambda form, original: _around(form, original) if form in WRAPPING else form):
        yield
