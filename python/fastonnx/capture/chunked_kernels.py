"""Kernels that loop over chunks of the sequence, swapped while torch.export captures for forms whose loop
follows the length: the ONNX file is then right at every length, with no guard on it.

transformers' ``torch_chunk_gated_delta_rule`` (Qwen3-Next, Qwen3.5, Qwen3.5-MoE, OLMo-Hybrid... linear
attention) pads the sequence to a multiple of the chunk size with ``(C - L % C) % C`` and runs a Python
loop over ``L // C`` chunks. Under torch.export the loop is unrolled to the example's chunk count and the
padding leaves guards (the program is right for 2..64 tokens only, guards.py refuses it), and the
triangular solve is replaced by a 63-step forward substitution (a capture of minutes).

The form swapped in (``gated_delta_rule_by_chunks``) computes the same function:

- it always pads, ``2 C - L % C`` positions (C + 1 to 2 C), so there are ``L // C + 2`` chunks, an
  expression torch proves without a guard, and never fewer than 2 (torch specialises a loop whose
  example trip count is 1); padded positions have zero keys, values and beta and zero log-decay, so they
  leave the state as it is, and their outputs are dropped (one chunk of zeros more than needed: the
  price of no guard);
- the unit lower-triangular system of each chunk, ``(I + N) x = b`` with ``N`` strictly lower (so
  ``N**C = 0``), is solved with its inverse as a product of ``log2(C)`` factors,
  ``(I - N)(I + N**2)(I + N**4)...``: six batched matmuls for C = 64 instead of 63 sequential steps;
- the sequential part, the state carried from chunk to chunk, is a ``scan`` over the chunks (an ONNX
  ``Scan`` whose trip count is the chunk count).

Mamba2's state-space duality scan (``mamba2_chunk_scan``, shared by Bamba, FalconH1, Zamba2,
GraniteMoeHybrid and NemotronH) has no loop over chunks, but its padding and the test ``pad_size > 0``
leave guards too; ``ssd_scan_by_chunks`` pads the same guard-free way.

Mamba's selective scan (``mamba_selective_scan``: Mamba, FalconMamba, Jamba, Zamba) loops over the positions
in Python, from a state of zeros (its mixer takes a recurrent step for a single token instead);
``selective_scan_by_steps`` is a ``scan`` over the positions from the state the mixer read from the cache
(Zamba's mixer scans head by head: each scan from its head's part of the state, in the mixer's order).

RWKV's CPU kernel (``rwkv_linear_attention_cpu``) loops over the positions in Python too;
``rwkv_attention_by_steps`` is a ``scan`` over them, carrying its three states (numerator, denominator and
the running maximum that keeps the exponentials finite).

RecurrentGemma's RG-LRU (``RecurrentGemmaRglru._rnn_scan``) loops over the positions too, or takes
one step where the example has one token; ``rglru_scan_by_steps`` is a ``scan`` for every length.

Qwen4-Exp's sparse-attention indexer (``Qwen4ExpTextQSAIndexer.forward``) loops over every batch row and
every query in Python; ``qsa_indexer_by_masks`` computes its selection for all of them at once.

CANINE's local attention (``CanineAttention.forward`` with ``local``: its first character encoder) loops
in Python over the blocks of ``local_transformer_stride`` characters, so the example's block count is
unrolled and the length specialised; ``canine_attention_by_mask`` attends over all the characters at
once with a mask that keeps each block to itself (blocks as tensor dims would need reshapes of a padded
length, whose divisibility torch cannot prove). Its molecules' mask
(``CanineModel._downsample_attention_mask``) is a ``MaxPool1d``, whose CPU kernel reads the length as an
int (torch specialises it); ``canine_mask_by_molecules`` takes the same maxima over a reshape. Its
upsampling (``CanineModel._repeat_molecules``) concatenates ``rate * (L // rate - 1)`` and
``L % rate + rate`` positions, a length torch cannot prove is L; ``canine_molecules_by_position``
gathers each character's molecule instead, L positions by construction.

The padding mask of those layers (``create_recurrent_attention_mask``, the mask's last L columns) is
swapped too, for a form without the guards its slicing leaves (``recurrent_mask_by_length``).

Doge's dynamic mask (``DogeAttention.prepare_dynamic_mask``) keeps each query's ``keep_window_size``
largest keys only where the keys outnumber it, a branch on the length that leaves the guard
``past + L <= 2048``; ``dynamic_mask_by_length`` keeps the ``min(keys, keep_window_size)`` largest at
every length, which keeps every key (masks nothing) where transformers skips the step.

MiniMax's lightning attention (``MiniMaxLightningAttention.forward``) loops over blocks of the sequence in
Python, or over the positions from a cached state; ``lightning_attention_by_blocks`` pads and scans over
the blocks as the gated delta rule's form does, from the cached state where there is one.

T5Gemma's (and T5Gemma 2's) classifiers shift the ids right for the decoder by a write into a slice,
which leaves a guard on the length; ``shift_right_by_concat`` joins the start token and the ids instead.

transformers' sdpa mask is built without ``vmap`` (``_masks_by_broadcast``): torch.export keeps vmap as
functorch calls no converter takes.

Only the functions of transformers' modules already imported are swapped (``KERNELS``), for the
duration of the capture, under the capture's lock.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import sys
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

from fastonnx.capture.pooled_indexers import pools_kept_whole
from fastonnx.torch_internals import scan


@contextlib.contextmanager
def length_following_kernels() -> Iterator[None]:
    """While active, every loaded ``transformers.models.*`` module's chunked kernels (``KERNELS``' keys)
    are the forms of this module."""
    swapped: list[tuple[Any, str, Any]] = []
    for name, module in list(sys.modules.items()):
        if not name.startswith("transformers.models."):
            continue
        for kernel, form in KERNELS.items():
            owner: Any = module
            if "." in kernel:  # a method, ``Class.method``, of a class the module defines or imports
                owner_name, kernel = kernel.split(".")
                owner = getattr(module, owner_name, None)
            original = getattr(owner, kernel, None) if owner is not None else None
            if callable(original) and original is not form:  # a class seen in two modules: swapped once
                swapped.append((owner, kernel, vars(owner)[kernel] if isinstance(owner, type) else original))
                setattr(owner, kernel, form)
    _SCAN_START.set(None)
    try:
        with _masks_by_broadcast():
            yield
    finally:
        _SCAN_START.set(None)
        for owner, kernel, original in reversed(swapped):
            setattr(owner, kernel, original)


@contextlib.contextmanager
def _masks_by_broadcast() -> Iterator[None]:
    """transformers' sdpa mask (the eager one calls it) made by broadcasting its index ranges, never by
    ``vmap``: it takes vmap for a mask combined with another (Gemma 3's image tokens, T5Gemma 2's sliding
    window), which torch.export keeps as functorch calls (``lazy_load_decompositions``...) no converter
    takes. The mask functions index with the ranges they are given, so broadcast ranges give the same."""
    masks = sys.modules.get("transformers.masking_utils")
    original = getattr(masks, "sdpa_mask", None)
    registry = getattr(masks, "ALL_MASK_ATTENTION_FUNCTIONS", None)
    if masks is None or not callable(original) or registry is None or registry["sdpa"] is not original:
        yield  # not loaded, or a mask of the user's own
        return

    def broadcast(*args: Any, **kwargs: Any) -> Any:
        return original(*args, **{**kwargs, "use_vmap": False})

    masks.sdpa_mask = broadcast  # type: ignore[attr-defined]
    registry["sdpa"] = broadcast  # a local override of the registry, deleted after
    try:
        yield
    finally:
        masks.sdpa_mask = original  # type: ignore[attr-defined]
        del registry["sdpa"]


def gated_delta_rule_by_chunks(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    chunk_size: int = 64,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """transformers' chunked gated delta rule (same arguments and results: query / key ``[B, L, Hk, Dk]``,
    value ``[B, L, Hv, Dv]``, log-decay ``g`` and ``beta`` ``[B, L, Hv]``; the output ``[B, L, Hv, Dv]`` and
    the state ``[B, Hv, Dk, Dv]``), in the guard-free form of this module's docstring."""
    dtype = query.dtype
    length = query.shape[1]
    heads = value.shape[-2]
    if key.shape[-2] != heads:  # grouped value heads: each key head serves consecutive value heads
        query = query.repeat_interleave(heads // key.shape[-2], dim=2)
        key = key.repeat_interleave(heads // key.shape[-2], dim=2)
    query, key, value, beta, g = (x.transpose(1, 2).float() for x in (query, key, value, beta, g))
    if use_qk_l2norm_in_kernel:
        query, key = _l2norm(query), _l2norm(key)
    query = query * query.shape[-1] ** -0.5
    # always two chunks more than L // C (C + 1 to 2 C padded positions): n * C - L needs no Mod, the
    # padded length n * C is what torch proves the chunks' reshape and the final split against, and n is
    # at least 2 whatever the example's length (a scan over a trip count of 1 is specialised to 1)
    n = length // chunk_size + 2
    pad = n * chunk_size - length
    query, key, value = (F.pad(x, (0, 0, 0, pad)) for x in (query, key, value))
    beta, g = (F.pad(x, (0, pad)) for x in (beta, g))
    chunked = _intra_chunk(query, key, value, beta, g, n, chunk_size)
    state = (
        torch.zeros(
            *value.shape[:2], key.shape[-1], value.shape[-1], dtype=torch.float32, device=value.device
        )
        if initial_state is None
        else initial_state.float()
    )
    state, out = scan(_chunk_step, state, chunked)  # over the chunks: dim 0 of each of ``chunked``
    out = first_positions(out.movedim(0, 2).flatten(2, 3), length, dim=2)
    out = out.transpose(1, 2).to(dtype)
    return out, (state if output_final_state else None)


_SCAN_START: contextvars.ContextVar[torch.Tensor | None] = contextvars.ContextVar(
    "fastonnx_selective_scan_start", default=None
)
# the head the next scan takes of a state read whole, [b, heads, d, n] (Zamba scans head by head)
_SCAN_HEAD: contextvars.ContextVar[int] = contextvars.ContextVar("fastonnx_selective_scan_head", default=0)


def note_recurrent_state(state: torch.Tensor) -> None:
    """Called when a rebuilt cache layer's recurrent state is read (transformers_caches.py): Mamba's
    mixer reads it, then calls ``mamba_selective_scan``, which takes no initial state."""
    _SCAN_START.set(state)
    _SCAN_HEAD.set(0)


def selective_scan_by_steps(
    hidden_states: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    delta_bias: torch.Tensor | None = None,
    delta_softplus: bool = False,
    return_last_state: bool = False,
    **kwargs: Any,
) -> Any:
    """transformers' ``mamba_selective_scan`` (Mamba, FalconMamba, Jamba, Zamba: ``hidden_states`` and
    ``dt`` ``[b, d, L]``, ``A`` ``[d, n]``, ``B`` / ``C`` ``[b, n, L]``; the output ``[b, d, L]`` and the
    state ``[b, d, n]``) as a ``scan`` over the positions, whatever L, starting from the recurrent state
    the mixer read from the cache (``note_recurrent_state``). transformers' reference loops over the
    example's positions in Python and starts from zeros: its mixer takes the recurrent step for a single
    new token instead, which one graph for every length cannot choose."""
    start = _SCAN_START.get()
    _SCAN_START.set(None)
    expected = (*hidden_states.shape[:2], A.shape[-1])
    if start is not None and start.dim() == 4 and B.dim() == 3 and start.shape[2:] == expected[1:]:
        # Zamba's mixer reads the state of every head, [b, heads, d, n], then scans head 0, 1... in
        # order: this scan starts from its head's part, and the next one from the next head's
        head = _SCAN_HEAD.get()
        if head + 1 < start.shape[1]:
            _SCAN_START.set(start)
            _SCAN_HEAD.set(head + 1)
        start = start[:, head]
    if start is not None and (start.dim() != 3 or B.dim() != 3):
        # a part of the state read that is not one head of it: which part is not known here
        raise NotImplementedError(
            f"a selective scan over part of the recurrent state read (state {list(start.shape)}, the scan's "
            f"{list(expected)}) cannot be exported with the state as a graph input"
        )
    dtype = hidden_states.dtype
    if delta_bias is not None:
        dt = dt + delta_bias.to(dt.dtype)[..., None]
    if delta_softplus:
        dt = F.softplus(dt)
    decay = torch.exp(A[None, :, None, :] * dt[..., None]).permute(2, 0, 1, 3)  # [L, b, d, n]
    inputs = (
        dt[..., None] * B[:, None].transpose(-1, -2).float() * hidden_states[..., None].float()
    ).permute(2, 0, 1, 3)
    readout = C.permute(2, 0, 1)  # [L, b, n]
    state = (
        start.float().contiguous()  # a head of the state read is a strided view; the carry is dense
        if start is not None
        else torch.zeros(*hidden_states.shape[:2], A.shape[-1], device=hidden_states.device)
    )
    state, out = scan(_selective_step, state, (decay, inputs, readout))
    out = out.permute(1, 2, 0).to(dtype)  # [b, d, L]
    if D is not None:
        out = out + hidden_states * D[None, :, None]
    if z is not None:
        out = out * F.silu(z)
    return (out, state) if return_last_state else out


def _selective_step(
    state: torch.Tensor, step: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    decay, inputs, readout = step
    state = decay * state + inputs
    return state, (state @ readout.to(state.dtype)[..., None])[..., 0]


def rwkv_attention_by_steps(
    time_decay: torch.Tensor,
    time_first: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    state: list[torch.Tensor] | None = None,
    return_state: bool = False,
) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
    """transformers' ``rwkv_linear_attention_cpu`` (``key`` / ``value`` ``[b, L, d]``, ``time_decay`` /
    ``time_first`` ``[d]``; the states ``[b, d]`` each) as a ``scan`` over the positions, whatever L."""
    b, _, d = key.shape
    if state is None:
        zeros = torch.zeros(b, d, dtype=torch.float32, device=key.device)
        num, den, top = zeros, torch.zeros_like(zeros), zeros - 1e38
    else:
        num, den, top = state
    length = key.shape[1]
    decay = (-torch.exp(time_decay.float())).expand(length, d)
    first = time_first.float().expand(length, d)
    steps = (key.float().transpose(0, 1), value.float().transpose(0, 1), decay, first)
    (num, den, top), out = scan(_rwkv_step, (num, den, top), steps)
    output = out.transpose(0, 1).to(key.dtype)
    return output, ([num, den, top] if return_state or state is not None else None)


def _rwkv_step(
    carry: tuple[torch.Tensor, torch.Tensor, torch.Tensor], step: tuple[torch.Tensor, ...]
) -> tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    num, den, top = carry
    k, v, decay, first = step
    # the output at this position, then the state past it: both rescaled by their own maximum
    out_top = torch.maximum(top, k + first)
    e1, e2 = torch.exp(top - out_top), torch.exp(k + first - out_top)
    out = (e1 * num + e2 * v) / (e1 * den + e2)
    state_top = torch.maximum(top + decay, k)
    e1, e2 = torch.exp(top + decay - state_top), torch.exp(k - state_top)
    return (e1 * num + e2 * v, e1 * den + e2, state_top), out


def rglru_scan_by_steps(
    self: Any,
    hidden_states: torch.Tensor,
    recurrent_gate: torch.Tensor,
    reset: torch.Tensor,
    recurrent_states: torch.Tensor | None,
    acc_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``RecurrentGemmaRglru._rnn_scan`` (``hidden_states`` / ``recurrent_gate`` ``[b, L, w]``, ``reset``
    ``[b, L, 1]``; the state ``[b, w]``): ``h_t = a_t * h_(t-1) + x_t`` as a ``scan`` whatever L, from
    zeros where no state is given. One step of it is the single-token branch transformers takes."""
    gate = (recurrent_gate * ~reset).to(acc_dtype).transpose(0, 1)
    state = (
        recurrent_states.to(acc_dtype)
        if recurrent_states is not None
        else torch.zeros(hidden_states[:, 0].shape, dtype=acc_dtype, device=hidden_states.device)
    )
    state, out = scan(_linear_recurrence_step, state, (gate, hidden_states.to(acc_dtype).transpose(0, 1)))
    return out.transpose(0, 1).to(hidden_states.dtype), state


def _linear_recurrence_step(
    state: torch.Tensor, step: tuple[torch.Tensor, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    gate, x = step
    state = gate * state + x
    return state, state.clone()  # a scan's output may not alias its carry


def qsa_indexer_by_masks(
    self: Any,
    hidden_states: torch.Tensor,
    position_embeddings: tuple[torch.Tensor, torch.Tensor],
    attention_mask: torch.Tensor,
    past_key_values: Any,
) -> torch.Tensor:
    """``Qwen4ExpTextQSAIndexer.forward`` for every row and query at once: each query's visible keys in
    blocks of ``compress_ratio`` (the complete ones pooled, normed and rotated at their first position),
    the ``min(block_topk, blocks)`` blocks its indexer heads score highest, and the incomplete tail;
    returns the mask of the tokens selected, ``[b, 1, queries, keys]``. Block sums are scattered (the
    keys' block ids from the running count of visible keys), so memory follows queries x keys x the
    index head size, and no size is read from the values."""
    rope = sys.modules[type(self).__module__].apply_rotary_pos_emb
    batch, length, _ = hidden_states.shape
    size, ratio, top = self.index_head_dim, self.compress_ratio, self.block_topk
    full_cos, full_sin = position_embeddings
    qk = self.index_qk_proj(hidden_states)
    q, token_k = torch.split(qk, [self.index_n_heads * size, self.index_kv_heads * size], dim=-1)
    q = self.q_layernorm(q.reshape(batch, length, -1, size))
    q = rope(q, cos=full_cos[:, -length:, :], sin=full_sin[:, -length:, :], unsqueeze_dim=2)
    raw_keys = token_k.reshape(batch, length, -1, size).squeeze(2)
    if past_key_values is not None:
        raw_keys = past_key_values.update_indexer(raw_keys, self.layer_idx)
    visible = (attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0)[:, 0]
    keys = visible.shape[-1]
    # the block ids a row can reach and one more, never valid, so that torch sees at least 2 (a matmul
    # over 1 block would guard); the slot after them is the dump of the invisible keys
    blocks = keys // ratio + 2
    rank = visible.long().cumsum(-1) - 1
    block = torch.where(visible, rank // ratio, blocks)
    complete = visible.sum(-1, keepdim=True) // ratio  # [b, q, 1]
    spread = (batch, length, keys, size)
    summed = raw_keys.new_zeros((batch, length, blocks + 1, size), dtype=torch.float32).scatter_add(
        2, block[..., None].expand(spread), raw_keys.float()[:, None].expand(spread)
    )
    pooled = self.k_layernorm((summed[:, :, :blocks] / ratio).to(raw_keys.dtype))
    starts = torch.where(visible & (rank % ratio == 0), block, blocks)
    where = torch.arange(keys, device=visible.device).expand(batch, length, keys)
    first = torch.zeros_like(where[:, :, :1]).expand(batch, length, blocks + 1).scatter(2, starts, where)
    first = first[:, :, :blocks, None].expand(batch, length, blocks, full_cos.shape[-1])
    # each query's block starts gathered from the table of every key (no reshape: its -1 would guard)
    cos, sin = (t[:, None].expand(batch, length, *t.shape[1:]).gather(2, first) for t in (full_cos, full_sin))
    block_keys = rope(pooled[..., None, :], cos=cos, sin=sin, unsqueeze_dim=-2)[..., 0, :]
    scores = torch.relu(q.float() @ block_keys.float().transpose(-1, -2)).sum(2) / math.sqrt(size)
    valid = torch.arange(blocks, device=visible.device) < complete
    scores = torch.cat(
        [scores.masked_fill(~valid, float("-inf")), scores.new_full((batch, length, top), float("-inf"))], -1
    )
    best = scores.topk(top, dim=-1)
    chosen = torch.zeros_like(scores, dtype=torch.bool).scatter(-1, best.indices, best.values > float("-inf"))
    in_chosen = chosen[:, :, : blocks + 1].gather(2, block)  # the dump slot is never chosen
    selected: torch.Tensor = (visible & in_chosen) | (visible & (rank >= complete * ratio))
    return selected.unsqueeze(1)


def lightning_attention_by_blocks(
    self: Any,
    hidden_states: torch.Tensor,
    position_embeddings: Any,
    attention_mask: torch.Tensor | None,
    past_key_values: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``MiniMaxLightningAttention.forward``: the decayed linear attention ``S_t = e^-s S_(t-1) + k_t' v_t``,
    ``o_t = q_t S_t`` (one slope ``s`` a head), by blocks of ``block_size`` as transformers' prefill, but
    padded as ``gated_delta_rule_by_chunks`` (``L // C + 2`` blocks, never one) and a ``scan`` over the
    blocks: transformers loops over the blocks in Python (a guard on the block count) and, from a cached
    state, over the positions. Padded positions have zero keys and values and no decay (a log-decay of 0
    instead of -s), so the state leaving the last block is the state after the last token."""
    module = sys.modules[type(self).__module__]
    batch, length, _ = hidden_states.shape
    heads, size, c = self.num_attention_heads, self.head_dim, self.block_size
    qkv = module.apply_mask_to_padding_states(self.act_fn(self.qkv_proj(hidden_states)), attention_mask)
    qkv = qkv.reshape(batch, length, heads, 3 * size)
    query, key, value = (x.transpose(1, 2) for x in torch.split(qkv, size, dim=3))
    state = past_key_values.get_linear_cache(self.layer_idx) if past_key_values is not None else None
    if state is None:
        state = torch.zeros(batch, heads, size, size, device=value.device, dtype=value.dtype)
    n = length // c + 2
    pad = n * c - length
    query, key, value = (
        F.pad(x, (0, 0, 0, pad)).reshape(batch, heads, n, c, size) for x in (query, key, value)
    )
    valid = torch.arange(n * c, device=query.device) < length
    log_decay = torch.where(valid, -self.slope_rate.reshape(heads, 1).to(query.dtype), 0.0)
    cum = log_decay.reshape(heads, n, c).cumsum(dim=-1)  # [h, n, c]
    upper = torch.ones(c, c, dtype=torch.bool, device=query.device).triu(1)
    pairwise = (cum.unsqueeze(-1) - cum.unsqueeze(-2)).masked_fill(upper, float("-inf")).exp()
    intra = ((query @ key.transpose(-1, -2)) * pairwise) @ value
    query = query * cum.exp().unsqueeze(-1)
    key = key * (cum[..., -1:] - cum).exp().unsqueeze(-1)
    decay = cum[..., -1].exp()[..., None, None].movedim(1, 0)  # [n, h, 1, 1]
    blocks = tuple(x.movedim(2, 0) for x in (query, key, value, intra))
    state, out = scan(_lightning_step, state, (*blocks, decay))
    out = first_positions(out.movedim(0, 2).flatten(2, 3), length, dim=2)
    out = self.norm(out.transpose(1, 2).reshape(batch, length, heads * size))
    out = self.out_proj(F.sigmoid(self.output_gate(hidden_states)) * out)
    if past_key_values is not None:
        past_key_values.set_linear_cache(self.layer_idx, state)
    return out, state


def _lightning_step(
    state: torch.Tensor, block: tuple[torch.Tensor, ...]
) -> tuple[torch.Tensor, torch.Tensor]:
    """One block: the state carried out, and the block's output from the state carried in and its own
    decayed attention."""
    query, key, value, intra, decay = block
    return state * decay + key.transpose(-1, -2) @ value, query @ state + intra


def shift_right_by_concat(self: Any, input_ids: torch.Tensor) -> torch.Tensor:
    """``T5GemmaPreTrainedModel._shift_right`` and T5Gemma 2's ``prepare_decoder_input_ids_from_labels`` (the
    decoder's ids of a classifier: the start token, then the ids but the last), joined instead of written into a slice: the write leaves torch's overlap check on
    the slice, a guard ``L - 1 >= 2``, so the file would refuse 2 tokens."""
    start, pad = self.config.decoder.bos_token_id, self.config.decoder.pad_token_id
    if start is None or pad is None:
        raise ValueError("self.model.config.decoder's bos_token_id and pad_token_id have to be defined")
    first = torch.full_like(input_ids[..., :1], start)
    shifted = torch.cat([first, input_ids[..., :-1]], dim=-1)
    return shifted.masked_fill(shifted == -100, pad)


def first_positions(x: torch.Tensor, length: Any, dim: int) -> torch.Tensor:
    """The first ``length`` positions of ``x`` along ``dim``, gathered: a split or a slice would need
    torch to prove ``length`` at most the padded length (``64 * (L // 64) + 128 >= L``), which its range
    reasoning cannot, and would leave that as a guard on L."""
    return x.index_select(dim, torch.arange(length, device=x.device))


def dynamic_mask_by_length(
    self: Any,
    hidden_states: torch.Tensor,
    dt_states: torch.Tensor,
    keep_window_size: int = 2048,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Doge's ``prepare_dynamic_mask`` (``dt_states`` ``[b, h, keys]``, the mask ``[b, 1, L, keys]``; the
    result ``[b, h, L, keys]``): the keys' scores, the masked ones at the dtype's minimum, then all but
    each query's ``min(keys, keep_window_size)`` largest masked too, at every length."""
    lowest = torch.finfo(hidden_states.dtype).min
    dtype = hidden_states.dtype
    scores = dt_states[:, :, None, :].expand(-1, -1, hidden_states.shape[1], -1)
    if isinstance(attention_mask, torch.Tensor):  # not a flex-attention BlockMask
        if attention_mask.dtype == torch.bool:
            zero = torch.full((), 0.0, device=attention_mask.device, dtype=dtype)
            attention_mask = torch.where(attention_mask, zero, lowest)
        scores = scores.masked_fill(attention_mask[:, :, :, : scores.shape[-1]] != 0, lowest)
    # keeping the largest min(keys, window) is keeping all of them up to the window: no branch, no guard
    kept = torch.topk(scores, torch.sym_min(scores.shape[-1], keep_window_size), dim=-1, sorted=False).indices
    active = torch.zeros_like(scores, dtype=dtype).scatter(-1, kept, 1.0)
    return scores.masked_fill(active == 0.0, lowest)


def recurrent_mask_by_length(
    config: Any,
    inputs_embeds: torch.Tensor,
    attention_mask: torch.Tensor | None,
    past_key_values: Any = None,
    **kwargs: Any,
) -> torch.Tensor | None:
    """transformers' ``create_recurrent_attention_mask`` (the padding mask of the mamba and linear-attention
    layers: the mask's last L columns), always: transformers skips it where it is all ones (a single new
    token, an unpadded batch), and multiplying by ones changes nothing. Gathered: a negative slice and
    ``.contiguous()`` leave guards on the batch and the lengths (that the slice is not of size 1, for its
    strides), and ``narrow`` needs bounds a state-space model's graph cannot prove (it relates the mask's
    length, past and new tokens, to L nowhere)."""
    if attention_mask is None or attention_mask.dim() != 2:
        return None
    total, length = attention_mask.shape[1], inputs_embeds.shape[1]
    return attention_mask.index_select(1, torch.arange(total - length, total, device=attention_mask.device))


def canine_attention_by_mask(
    self: Any,
    hidden_states: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    output_attentions: bool | None = False,
) -> tuple[torch.Tensor, ...]:
    """``CanineAttention.forward`` (``hidden_states`` ``[b, L, d]``, its local layer's 0/1 mask ``[b, L, L]``)
    with the local attention over blocks of ``w`` characters as one attention over all L characters
    whose mask keeps each block to itself: the same weights as transformers' loop over the blocks, at
    every length (L x L scores for its one shallow layer, where the loop computes L x w). The global
    form is transformers' own."""
    if not self.local:
        outputs = self.self(hidden_states, hidden_states, attention_mask, output_attentions)
        return (self.output(outputs[0], hidden_states), *outputs[1:])
    width = self.attend_from_chunk_width
    if (
        self.first_position_attends_to_all
        or self.always_attend_to_first_position
        or output_attentions
        or attention_mask is None
        or attention_mask.dim() != 3
        or {self.attend_from_chunk_stride, self.attend_to_chunk_width, self.attend_to_chunk_stride} != {width}
    ):
        # not what CanineModel builds (non-overlapping blocks, no first position, a 3-D mask)
        raise NotImplementedError("CANINE's local attention is exported for CanineModel's blocks only")
    length = hidden_states.shape[1]
    # position i attends to j where both are in one block (and the mask lets it), as the loop does: the
    # other blocks' keys at -inf weigh exactly 0; a key the mask hides in the block weighs as there
    positions = torch.arange(length, device=hidden_states.device)
    same_block = (positions // width)[:, None] == (positions // width)[None, :]
    dtype = hidden_states.dtype
    additive = (1.0 - attention_mask.to(dtype)) * torch.finfo(dtype).min  # as CanineSelfAttention
    additive = torch.where(same_block, additive, float("-inf"))[:, None]
    outputs = self.self(hidden_states, hidden_states, additive, False)
    return (self.output(outputs[0], hidden_states),)


def canine_mask_by_molecules(
    self: Any, char_attention_mask: torch.Tensor, downsampling_rate: int
) -> torch.Tensor:
    """``CanineModel._downsample_attention_mask``: the maximum of each whole group of ``downsampling_rate``
    characters' mask (``[b, L]`` to ``[b, L // rate]``, float), the trailing partial group dropped as
    ``MaxPool1d`` drops it."""
    batch, length = char_attention_mask.shape
    molecules = length // downsampling_rate
    whole = first_positions(char_attention_mask.float(), molecules * downsampling_rate, dim=1)
    return whole.reshape(batch, molecules, downsampling_rate).amax(-1)


def canine_molecules_by_position(self: Any, molecules: torch.Tensor, char_seq_length: Any) -> torch.Tensor:
    """``CanineModel._repeat_molecules`` (``molecules`` ``[b, M, d]``, the first the [CLS] one): character
    ``p`` takes molecule ``p // rate + 1``, the characters past the last whole group the last molecule."""
    rate = self.config.downsampling_rate
    positions = torch.arange(char_seq_length, device=molecules.device)
    return molecules.index_select(1, (positions // rate + 1).clamp(max=molecules.shape[1] - 1))


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    # as transformers' l2norm (and the FLA library's): eps inside the root
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + 1e-6)


def _intra_chunk(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor,
    n: Any,
    c: int,
) -> tuple[torch.Tensor, ...]:
    """What each chunk computes on its own, every chunk at once, chunk-major for the scan: the values
    and decayed keys the UT transform gives, the queries and keys decayed, the intra-chunk attention,
    the chunk's total decay."""

    def chunks(x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], x.shape[1], n, c, x.shape[-1])

    k_beta = chunks(key * beta.unsqueeze(-1))
    v_beta = chunks(value * beta.unsqueeze(-1))
    query, key = chunks(query), chunks(key)
    cum = g.reshape(g.shape[0], g.shape[1], n, c).cumsum(dim=3)
    upper = torch.ones(c, c, dtype=torch.bool, device=query.device).triu(1)
    pairwise = (cum.unsqueeze(4) - cum.unsqueeze(3)).masked_fill(upper, float("-inf")).exp()
    lower = ((k_beta @ key.transpose(-1, -2)) * pairwise).tril(-1)
    inverse = _unit_lower_inverse(lower, c)
    new_values = inverse @ v_beta
    k_cumdecay = inverse @ (k_beta * cum.exp().unsqueeze(-1))
    attn = (query @ key.transpose(-1, -2)) * pairwise
    query = query * cum.exp().unsqueeze(-1)
    key = key * (cum[..., -1:] - cum).exp().unsqueeze(-1)
    decay = cum[..., -1].exp()[..., None, None]
    return tuple(x.movedim(2, 0) for x in (new_values, k_cumdecay, query, key, attn, decay))


def _unit_lower_inverse(lower: torch.Tensor, c: int) -> torch.Tensor:
    """``(I + lower)^-1`` for a strictly lower-triangular ``lower`` of size ``c``: with ``M = -lower``,
    ``M**c = 0`` and ``(I + M)(I + M**2)...(I + M**(2**(m-1))) = I + M + ... + M**(2**m - 1)``."""
    eye = torch.eye(c, dtype=lower.dtype, device=lower.device)
    power = -lower
    inverse = eye + power
    for _ in range(math.ceil(math.log2(c)) - 1):
        power = power @ power
        inverse = inverse + inverse @ power
    return inverse


def _chunk_step(state: torch.Tensor, chunk: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk: its output from the state carried in (inter-chunk) and its own attention, and the
    state carried out."""
    new_values, k_cumdecay, query, key, attn, decay = chunk
    v_new = new_values - k_cumdecay @ state
    out = query @ state + attn @ v_new
    return state * decay + key.transpose(-1, -2) @ v_new, out


def ssd_scan_by_chunks(
    hidden_states: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,  # transformers' argument names
    B: torch.Tensor,
    C: torch.Tensor,
    chunk_size: int,
    D: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    initial_states: torch.Tensor | None = None,
    dt_softplus: bool = False,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
    return_final_states: bool = False,
    **kwargs: Any,
) -> Any:
    """transformers' ``mamba2_chunk_scan`` (Mamba2's state-space duality scan, shared by Bamba, FalconH1,
    Zamba2, GraniteMoeHybrid and NemotronH; same arguments and results: ``hidden_states`` ``[b, L, h, p]``,
    ``dt`` ``[b, L, h]``, ``A`` ``[h]``, ``B`` / ``C`` ``[b, L, g, n]``, the output ``[b, L, h, p]`` and with
    ``return_final_states`` the state ``[b, h, p, n]``). It has no loop, but pads by ``(C - L % C) % C``,
    tests ``pad_size > 0`` and slices the padding off, which leave guards on the length; here the
    padding is ``n * C - L`` for ``n = L // C + 2`` chunks (C + 1 to 2 C positions, with no input and no
    decay, so the state is unchanged by them; never one chunk, which torch would guard against) and taken
    off by a split."""
    length, heads = hidden_states.shape[1], hidden_states.shape[2]
    if dt_bias is not None:
        dt = dt + dt_bias.to(dt.dtype)
    if dt_softplus:
        dt = F.softplus(dt)
    dt = torch.clamp(dt, min=dt_limit[0], max=dt_limit[1]).float()
    x = hidden_states.float()
    groups = B.shape[2]
    B, C = (m.float().repeat_interleave(heads // groups, dim=2) for m in (B, C))
    residual = D[..., None] * x if D is not None else None
    n = length // chunk_size + 2  # at least 2 chunks, as gated_delta_rule_by_chunks pads: no guard n != 1
    pad = n * chunk_size - length

    def chunks(t: torch.Tensor) -> torch.Tensor:  # [b, L, ...] -> [b, n, chunk, ...], zeros padded
        t = F.pad(t, (0, 0) * (t.dim() - 2) + (0, pad))
        return t.reshape(t.shape[0], n, chunk_size, *t.shape[2:])

    x, B, C = chunks(x * dt[..., None]), chunks(B), chunks(C)
    a = chunks(A.to(torch.float32) * dt).permute(0, 3, 1, 2)  # [b, h, n, chunk]
    a_cum = a.cumsum(dim=-1)
    # within each chunk: attention-like scores, decayed between positions
    scores = torch.einsum("bclhn,bcshn->bclsh", C, B) * _segment_sum(a).exp().permute(0, 2, 3, 4, 1)
    y_diag = torch.einsum("bclsh,bcshp->bclhp", scores, x)
    # each chunk's contribution to the state, then the state at each chunk's start
    to_end = (a_cum[..., -1:] - a_cum).exp().permute(0, 2, 3, 1)[..., None]
    states = torch.einsum("bclhn,bclhp->bchpn", B * to_end, x)
    start = (
        initial_states[:, None].to(states.dtype)
        if initial_states is not None
        else torch.zeros_like(states[:, :1])
    )
    states = torch.cat([start, states], dim=1)
    between = _segment_sum(F.pad(a_cum[..., -1], (1, 0))).exp().transpose(1, 3)
    states, final = torch.split(torch.einsum("bzch,bzhpn->bchpn", between, states), [n, 1], dim=1)
    y_off = torch.einsum("bclhn,bchpn->bclhp", C, states) * a_cum.exp().permute(0, 2, 3, 1)[..., None]
    y = (y_diag + y_off).reshape(x.shape[0], n * chunk_size, heads, x.shape[-1])
    y = first_positions(y, length, dim=1)
    if residual is not None:
        y = y + residual
    return (y, final[:, 0]) if return_final_states else y


def _segment_sum(a: torch.Tensor) -> torch.Tensor:
    """``[..., T] -> [..., T, T]``: entry ``(i, j)`` the sum of ``a[j + 1 .. i]`` for ``i >= j`` (0 on the
    diagonal), ``-inf`` above it; summed as a masked cumulative sum, not a difference of cumulative sums
    (which would cancel)."""
    size = a.shape[-1]
    below = torch.ones(size, size, dtype=torch.bool, device=a.device).tril(-1)
    spread = a[..., None].expand(*a.shape, size).masked_fill(~below, 0.0)
    summed = spread.cumsum(dim=-2)
    keep = torch.ones(size, size, dtype=torch.bool, device=a.device).tril(0)
    return summed.masked_fill(~keep, float("-inf"))


KERNELS = {
    "torch_chunk_gated_delta_rule": gated_delta_rule_by_chunks,
    "mamba2_chunk_scan": ssd_scan_by_chunks,
    "create_recurrent_attention_mask": recurrent_mask_by_length,
    "mamba_selective_scan": selective_scan_by_steps,
    "rwkv_linear_attention_cpu": rwkv_attention_by_steps,
    "RecurrentGemmaRglru._rnn_scan": rglru_scan_by_steps,
    "DogeAttention.prepare_dynamic_mask": dynamic_mask_by_length,
    "Qwen4ExpTextQSAIndexer.forward": qsa_indexer_by_masks,
    "Glm5NextTextIndexer.get_pooled_states": pools_kept_whole,  # capture/pooled_indexers.py
    "MiniMaxLightningAttention.forward": lightning_attention_by_blocks,
    "T5GemmaPreTrainedModel._shift_right": shift_right_by_concat,
    "T5Gemma2PreTrainedModel.prepare_decoder_input_ids_from_labels": shift_right_by_concat,
    "CanineAttention.forward": canine_attention_by_mask,
    "CanineModel._downsample_attention_mask": canine_mask_by_molecules,
    "CanineModel._repeat_molecules": canine_molecules_by_position,
}
"""transformers' chunked kernels, by their name in its modeling modules, and the form swapped in."""
