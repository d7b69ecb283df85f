"""The vision tower of Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5, GLM-4V and EXAONE 4.5 (and the models
built on them) as one graph over one image's patches, for any grid (PaddleOCR-VL's: grid_towers.py).

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
  of the tokens sharing it: the same values as attention over each piece alone;
- Qwen3-VL's and Qwen3.5's learned position table (a square of ``num_grid_per_side``) is resampled to the
  image's rows and columns as ``get_vision_interpolation_indices_and_weights`` does (bilinear, corners
  aligned): each patch's taps and weights from its row and column and the grid's size;
- Qwen3-VL's deepstack mergers read the hidden states after their blocks: their rows are a second
  output, ``deepstack_features`` (deepstack layers x ``num_image_tokens`` x hidden), which the decoder
  adds at the image tokens of its first layers (vision_language.py's ``DeepstackStep``);
- GLM-4V's table is sampled at each patch (bicubic ``grid_sample`` from the grid's size: its own
  ``embeddings`` module, fed tensors) and a convolution merges each block; GLM-OCR norms each head's
  queries and keys; EXAONE 4.5's keys and values are grouped (repeated to the heads).

The graph's inputs are genai's and transformers.js's: ``pixel_values`` (patches x channels · temporal
patch · patch², rows in the processor's order) and ``image_grid_thw`` (1 x 3, int64: frames, rows and
columns in patches); its output is the merged tokens' features, ``num_image_tokens`` x hidden.
"""

from __future__ import annotations

from typing import Any

import torch

from fastonnx.errors import InputError
from fastonnx.pretrained.grid_forms import GridForm
from fastonnx.pretrained.grid_towers import axis_taps

GRID_TYPES = (
    *("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe", "qwen4_exp"),
    *("qwen2_5_omni_thinker", "qwen3_omni_moe_thinker", "cohere_compass", "cosmos3_omni"),
    *("glm4v", "glm4v_moe", "glm46v", "glm_ocr", "exaone4_5", "hyperclovax_vision_v2", "paddleocr_vl"),
    "video_llama_3",  # grid_forms.py's
    *("inkling2", "kimi_k25", "lfm3_vl", "minimax_m3_vl", "muse_glimmer"),  # axial_grid_forms.py's
    *("cosmos3_edge", "hunyuan_vl", "muse_spark"),  # more_grid_forms.py's
)
"""The model types whose towers this module is verified on (``task="auto"`` takes them to
image-text-to-text); another tower of the same parts is tried, and the package check judges it."""


def form_of_type(kind: str) -> type[GridForm] | None:
    """The grid form of the vision-language model type ``kind`` (grid_forms.py, axial_grid_forms.py,
    more_grid_forms.py), or None."""
    from fastonnx.pretrained import axial_grid_forms, grid_forms, more_grid_forms

    return {**grid_forms.FORMS, **axial_grid_forms.FORMS, **more_grid_forms.FORMS}.get(kind)


def grid_form(model: torch.nn.Module) -> type[GridForm] | None:
    """The form of a tower whose layout is its own, or None."""
    return form_of_type(str(getattr(getattr(model, "config", None), "model_type", None)))


def vision_tower(model: torch.nn.Module) -> torch.nn.Module:
    if form := grid_form(model):
        return form.tower_of(model)
    inner = getattr(model, "model", model)
    visual = getattr(inner, "visual", None) or getattr(model, "visual", None)
    if visual is None and hasattr(getattr(inner, "vision_model", None), "merger"):
        visual = inner.vision_model  # HyperCLOVA X's Qwen2.5-VL tower, under a projector
    if visual is None and hasattr(model, "patch_embed") and hasattr(model, "merger"):
        visual = model  # a bare tower (tower_features.py: feature-extraction of Qwen2.5-VL's vision model)
    if not isinstance(visual, torch.nn.Module):
        raise InputError(f"{type(model).__name__} has no vision tower at .model.visual")
    return visual


def is_grid_tower(model: torch.nn.Module) -> bool:
    """Whether the model's images are Qwen-VL patch grids this module (or grid_towers.py: PaddleOCR-VL)
    exports (Qwen2-VL to Qwen3.5, GLM-4V, EXAONE 4.5)."""
    from fastonnx.pretrained.grid_towers import paddle_tower

    if paddle_tower(model) or grid_form(model):
        return True
    try:
        visual = vision_tower(model)
    except InputError:
        return False
    blocks = getattr(visual, "blocks", None)
    return (
        hasattr(visual, "patch_embed")
        and hasattr(visual, "merger")
        and isinstance(blocks, torch.nn.ModuleList)
        and all(hasattr(b, "attn") and (hasattr(b.attn, "qkv") or hasattr(b.attn, "q")) for b in blocks)
        and hasattr(getattr(visual, "rotary_pos_emb", None), "inv_freq")
        and (not hasattr(visual, "pos_embed") or hasattr(visual, "num_grid_per_side"))
    )


def deepstack_layers(model: torch.nn.Module) -> int:
    """How many deepstack features a grid tower gives (Qwen3-VL's), 0 for none (or no grid tower)."""
    return (
        len(getattr(vision_tower(model), "deepstack_merger_list", None) or ()) if is_grid_tower(model) else 0
    )


def grid_encoder(model: torch.nn.Module) -> torch.nn.Module:
    """The grid form of a grid tower's ``get_image_features``."""
    from fastonnx.pretrained.grid_towers import PaddleGridEncoder, paddle_tower

    if form := grid_form(model):
        return form(model)
    return PaddleGridEncoder(model) if paddle_tower(model) else GridVisionEncoder(model)


def patch_shape(model: torch.nn.Module) -> tuple[int, ...]:
    """The shape of one patch of ``pixel_values`` as the tower's processor gives it: flat (Qwen-VL's
    channels x temporal patch x patch²), or channels x patch x patch (PaddleOCR-VL's)."""
    from fastonnx.pretrained.grid_towers import paddle_tower

    if form := grid_form(model):
        return form.patch_shape(form.tower_of(model).config)
    c: Any = vision_tower(model).config
    if paddle_tower(model):
        return int(c.num_channels), int(c.patch_size), int(c.patch_size)
    return (int(c.in_channels) * int(c.temporal_patch_size) * int(c.patch_size) ** 2,)


def merge_size(model: torch.nn.Module) -> int:
    """How many patches a side a merged token of a grid tower spans."""
    if form := grid_form(model):
        return form.merge_size(form.tower_of(model).config)
    visual: Any = vision_tower(model)
    return int(visual.config.spatial_merge_size)


def grid_inputs(model: torch.nn.Module, images: int) -> dict[str, torch.Tensor]:
    """What transformers takes with a grid tower's images besides the pixels and the grid."""
    form = grid_form(model)
    return form.generate_inputs(images) if form else {}


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

    def forward(
        self, pixel_values: torch.Tensor, image_grid_thw: torch.Tensor
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
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

        hidden = visual.patch_embed(pixel_values)
        if hasattr(visual, "post_conv_layernorm"):  # GLM-4V's
            hidden = visual.post_conv_layernorm(hidden)
        if hasattr(visual, "embeddings"):  # GLM-4V's table, sampled at each patch by the grid's size
            count = (grid[0] * grid[1] * grid[2]).reshape(1)
            hidden = visual.embeddings(hidden, count, image_grid_thw, patch_rows, patch_columns)
        elif hasattr(visual, "pos_embed"):  # the learned table resampled to this grid
            side = int(visual.num_grid_per_side)
            bicubic, corners = (
                visual.interpolation_mode == "bicubic",
                bool(visual.interpolation_align_corners),
            )
            h_taps, h_weights = axis_taps(patch_rows, grid[1], side, bicubic, corners)
            w_taps, w_weights = axis_taps(patch_columns, grid[2], side, bicubic, corners)
            n = h_taps.shape[1]
            taps = (h_taps[:, :, None] * side + w_taps[:, None, :]).reshape(-1, n * n)
            weights = (h_weights[:, :, None] * w_weights[:, None, :]).reshape(-1, n * n)
            hidden = hidden + (visual.pos_embed(taps) * weights[:, :, None]).sum(1).to(hidden.dtype)
        hidden = hidden[patch_order]
        inv_freq = visual.rotary_pos_emb.inv_freq.float()
        angles = torch.cat(
            [patch_rows[patch_order, None] * inv_freq, patch_columns[patch_order, None] * inv_freq], dim=-1
        )
        angles = torch.cat([angles, angles], dim=-1)
        scale = float(getattr(visual.rotary_pos_emb, "attention_scaling", 1.0))
        cos, sin = angles.cos()[:, None, :] * scale, angles.sin()[:, None, :] * scale  # over the heads

        in_window = window[order].repeat_interleave(unit)
        in_frame = frame[order].repeat_interleave(unit)
        window_mask = (in_window[:, None] == in_window[None, :])[None, None]
        frame_mask = (in_frame[:, None] == in_frame[None, :])[None, None]
        deepstack = list(getattr(visual, "deepstack_visual_indexes", None) or ())
        stacked = []
        for index, block in enumerate(visual.blocks):
            mask = frame_mask if index in self.full else window_mask
            hidden = hidden + self._attention(block.attn, block.norm1(hidden), cos, sin, mask)
            hidden = hidden + block.mlp(block.norm2(hidden))
            if index in deepstack:
                stacked.append(visual.deepstack_merger_list[deepstack.index(index)](hidden))
        if hasattr(visual, "downsample"):  # GLM-4V: a convolution over each merged block's patches
            hidden = visual.post_layernorm(hidden).view(-1, self.merge, self.merge, hidden.shape[-1])
            hidden = visual.downsample(hidden.permute(0, 3, 1, 2)).view(
                -1, int(visual.config.out_hidden_size)
            )
        merged: torch.Tensor = visual.merger(hidden)
        inner = getattr(self.model, "model", self.model)
        if getattr(inner, "vision_model", None) is visual and isinstance(inner.projector, torch.nn.Linear):
            merged = inner.projector(merged)  # HyperCLOVA X's, to the text's width
        back = torch.argsort(order)
        if stacked:
            return merged[back], torch.stack(stacked)[:, back]
        return merged[back]

    @staticmethod
    def _attention(
        attn: Any, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        length = x.shape[0]
        heads = int(attn.num_heads)
        groups = 1
        if hasattr(attn, "kv_dim"):  # EXAONE 4.5's grouped keys and values, repeated to the heads
            q, k, v = (
                t.reshape(length, -1, int(attn.head_dim))
                for t in attn.qkv(x).split([int(attn.q_dim), int(attn.kv_dim), int(attn.kv_dim)], dim=-1)
            )
            groups = heads // int(attn.num_key_value_heads)
        elif hasattr(attn, "q"):  # Qwen2.5-Omni's separate projections
            q, k, v = (p(x).reshape(length, heads, -1) for p in (attn.q, attn.k, attn.v))
        else:
            q, k, v = attn.qkv(x).reshape(length, 3, heads, -1).unbind(1)  # each length x heads x head size
        if hasattr(attn, "q_norm"):  # GLM-OCR's, each head's before the rotation
            q, k = attn.q_norm(q), attn.k_norm(k)
        q = (q.float() * cos + _rotate_half(q.float()) * sin).to(v.dtype)
        k = (k.float() * cos + _rotate_half(k.float()) * sin).to(v.dtype)
        if groups > 1:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], attn_mask=mask
        )
        result: torch.Tensor = attn.proj(out[0].transpose(0, 1).reshape(length, -1))
        return result
