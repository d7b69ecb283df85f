"""GLM-5 Next's pooled sparse-attention indexer in a form whose shapes follow the length alone.

transformers' ``Glm5NextTextIndexer.get_pooled_states`` groups the keys into pools of ``index_kpool`` and
returns only the pools some batch row can select (``pool_keys[:, pool_valid.any(0)]``): a count read
from the values (an unbacked size), which the indexer's forward then takes as ``select_k = min(index_topk
// index_kpool, pools)`` and pads its selection to a fixed width with (``F.pad`` by a data-dependent
amount: no fake tensor or capture runs it).

The form swapped in (``pools_kept_whole``) computes the same selection: it returns every pool, and
``index_topk // index_kpool`` pools more that no row can select (no key, index -1, invalid), so that the
forward's ``min`` is its budget at every length. A pool no row can select scores the lowest value
(``masked_fill`` with ``finfo.min``) and a selection of it is marked invalid (-1), as the pools transformers
drops or the ones it takes past the valid ones; the indices feed a mask built by scattering them (a set),
so which invalid ones and in what order does not change the attention.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

OWNER, METHOD = "Glm5NextTextIndexer", "get_pooled_states"


def pools_kept_whole(
    self: Any, packed_states: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``get_pooled_states`` of every pool and the budget's never-selectable ones (the module docstring):
    (pool keys ``[B, P, D]``, their key indices ``[B, P, kpool]``, -1 where invalid, valid ``[B, P]``)."""
    kpool = int(self.index_kpool)
    keys, gate_scores, valid = torch.split(packed_states, [self.head_dim, self.head_dim, 1], dim=-1)
    valid_keys = valid.bool().squeeze(-1)
    batch, length = keys.shape[:2]
    pools = (length + kpool - 1) // kpool
    # pools start at the first valid key (left padding skipped), as transformers' do
    first = torch.where(
        valid_keys.any(-1),
        valid_keys.long().argmax(-1),
        torch.full_like(valid_keys[:, 0], length, dtype=torch.long),
    )
    indices = first[:, None, None] + torch.arange(pools * kpool, device=keys.device).view(1, pools, kpool)
    rows = torch.arange(batch, device=keys.device)[:, None, None]
    safe = indices.clamp(0, length - 1)
    grouped_valid = valid_keys[rows, safe] & (indices < length)
    pool_valid = grouped_valid.all(-1)
    indices = indices.masked_fill(~grouped_valid, -1)
    logits = gate_scores[rows, safe].float() + self.index_kpool_compress_ape.float()[None, None]
    logits = logits.masked_fill(~grouped_valid[..., None], float("-inf"))
    weights = torch.nan_to_num(logits.softmax(dim=2)).to(keys.dtype)  # a pool of no valid key: zeros
    pool_keys = (weights * keys[rows, safe]).sum(dim=2)
    budget = int(self.index_topk) // kpool
    return (
        F.pad(pool_keys, (0, 0, 0, budget)),
        F.pad(indices, (0, 0, 0, budget), value=-1),
        F.pad(pool_valid, (0, budget), value=False),
    )


@contextlib.contextmanager
def pools_of_fixed_count() -> Iterator[None]:
    """While active, the loaded GLM-5 Next modeling modules' indexers pool with ``pools_kept_whole``."""
    swapped = []
    for name, module in list(sys.modules.items()):
        owner = getattr(module, OWNER, None) if name.startswith("transformers.models.") else None
        if isinstance(owner, type) and METHOD in vars(owner) and vars(owner)[METHOD] is not pools_kept_whole:
            swapped.append((owner, vars(owner)[METHOD]))
            setattr(owner, METHOD, pools_kept_whole)
    try:
        yield
    finally:
        for owner, original in reversed(swapped):
            setattr(owner, METHOD, original)
