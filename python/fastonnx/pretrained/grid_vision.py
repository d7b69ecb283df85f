"""The vision tower of Qwen2-VL and Qwen2.5-VL as one graph over one image's patches, for any grid.

transformers runs these towers from Python lists: ``image_grid_thw.tolist()`` makes the rotary positions,
the attention windows and their ``cu_seqlens``, and the attention splits the sequence at those lengths.
A capture would fix the grid. Here the same quantities come from the grid's values as tensor arithmetic:

- patch ``k`` of a frame lies in merged block ``k // merge²``, at row ``k // merge² // (w / merge)``; its
  rotary position is (row, column) in patches, as ``get_vision_position_ids`` lays them out;
- Qwen2.5-VL's windows tile the merged-token grid by ``window_size / merge / patch_size``; transformers
  pads each side to the next multiple above it and drops empty windows, so a token's window is
  ``(row // n) * (columns // n + 1) + column // n`` and the window order sorts the tokens by (frame, window,
  row, column), as ``get_vision_window_index`` does;
- attention within a window (or, in the full-attention blocks, within a frame) is attention under a mask
  of the tokens sharing it: the same values as attention over each piece alone.

The graph's inputs are genai's and transformers.js's: ``pixel_values`` (patches x channels · temporal
patch · patch², rows in the processor's order) and ``image_grid_thw`` (1 x 3, int64: frames, rows and
columns in patches); its output is the merged tokens' features, ``num_image_tokens`` x hidden.
"""

from __future__ import annotations

from typing import Any

import torch

from fastonnx.errors import InputError

GRID_TYPES = ("qwen2_vl", "qwen2_5_vl")
"""The model types whose towers this module is verified on (``task="auto"`` takes them to
image-text-to-text); another tower of the same parts is tried, and the package check judges it."""


def vision_tower(model: torch.nn.Module) -> torch.nn.Module:
    inner = getattr(model, "model", model)
    visual = getattr(inner, "visual", None) or getattr(model, "visual", None)
    if not isinstance(visual, torch.nn.Module):
        raise InputError(f"{type(model).__name__} has no vision tower at .model.visual")
    return visual


def is_grid_tower(model: torch.nn.Module) -> bool:
    """Whether the model's images are Qwen-VL patch grids this module exports (Qwen2-VL, Qwen2.5-VL)."""
    try:
        visual = vision_tower(model)
    except InputError:
        return False
    blocks = getattr(visual, "blocks", None)
    return (
        hasattr(visual, "patch_embed")
        and hasattr(visual, "merger")
        and isinstance(blocks, torch.nn.ModuleList)
        and all(hasattr(b, "attn") and hasattr(b.attn, "qkv") for b in blocks)
        and hasattr(getattr(visual, "rotary_pos_emb", None), "inv_freq")
        and getattr(visual.config, "deepstack_visual_indexes", None) is None  # Qwen3-VL's
    )


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


class GridVisionEncoder(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model  # the model's own paths: the checkpoint's names
        visual: Any = vision_tower(model)
        config: Any = visual.config
        self.merge = int(config.spatial_merge_size)
        window = getattr(config, "window_size", None)
        # Qwen2-VL has no windows: every block attends over the whole frame
        self.window = int(window) // self.merge // int(config.patch_size) if window else 0
        self.full = set(getattr(config, "fullatt_block_indexes", None) or range(len(visual.blocks)))

    def forward(self, pixel_values: torch.Tensor, image_grid_thw: torch.Tensor) -> torch.Tensor:
        visual: Any = vision_tower(self.model)
        unit = self.merge * self.merge
        grid = image_grid_thw[0]
        rows, columns = grid[1] // self.merge, grid[2] // self.merge  # merged tokens of a frame
        tokens = torch.arange(pixel_values.shape[0] // unit, device=pixel_values.device)
        frame, at = tokens // (rows * columns), tokens % (rows * columns)
        row, column = at // columns, at % columns

        within = torch.arange(unit, device=pixel_values.device)
        patch_rows = (row[:, None] * self.merge + within // self.merge).reshape(-1)
        patch_columns = (column[:, None] * self.merge + within % self.merge).reshape(-1)

        if self.window:
            n = self.window
            window = (frame * (rows // n + 1) + row // n) * (columns // n + 1) + column // n
            order = torch.argsort((window * n + row % n) * n + column % n)
        else:
            window, order = frame, tokens
        patch_order = (order[:, None] * unit + within).reshape(-1)

        hidden = visual.patch_embed(pixel_values)[patch_order]
        inv_freq = visual.rotary_pos_emb.inv_freq.float()
        angles = torch.cat(
            [patch_rows[patch_order, None] * inv_freq, patch_columns[patch_order, None] * inv_freq], dim=-1
        )
        angles = torch.cat([angles, angles], dim=-1)
        cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]  # broadcast over the heads

        in_window = window[order].repeat_interleave(unit)
        in_frame = frame[order].repeat_interleave(unit)
        window_mask = (in_window[:, None] == in_window[None, :])[None, None]
        frame_mask = (in_frame[:, None] == in_frame[None, :])[None, None]
        for index, block in enumerate(visual.blocks):
            mask = frame_mask if index in self.full else window_mask
            hidden = hidden + self._attention(block.attn, block.norm1(hidden), cos, sin, mask)
            hidden = hidden + block.mlp(block.norm2(hidden))
        merged: torch.Tensor = visual.merger(hidden)
        return merged[torch.argsort(order)]

    @staticmethod
    def _attention(
        attn: Any, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        length = x.shape[0]
        heads = int(attn.num_heads)
        q, k, v = attn.qkv(x).reshape(length, 3, heads, -1).unbind(1)  # each length x heads x head size
        q = (q.float() * cos + _rotate_half(q.float()) * sin).to(v.dtype)
        k = (k.float() * cos + _rotate_half(k.float()) * sin).to(v.dtype)
        out = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], attn_mask=mask
        )
        result: torch.Tensor = attn.proj(out[0].transpose(0, 1).reshape(length, -1))
        return result
