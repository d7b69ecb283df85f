"""PaddleOCR-VL's vision tower and projector as one graph over one image's patches, for any grid (the
grid_vision.py way: what transformers makes from ``grid_thw.tolist()`` made from the grid's values).

Its tower is SigLIP's over the patches in raster order (no merge inside it): patch ``k`` of a frame is at
row ``k // w``, column ``k % w``, its rotary position (row, column) and its learned position the table
resampled to the grid bilinearly (corners not aligned), attention within each frame under a mask. Its
projector then merges each ``merge x merge`` block of patches into a token (transformers reshapes by the
grid's values): here a gather of each token's patches, in the projector's order.

The graph takes ``pixel_values`` as the processor gives them, patches x channels x patch x patch, and
``image_grid_thw``; its output is the merged tokens' features, ``num_image_tokens`` x hidden.
"""

from __future__ import annotations

from typing import Any

import torch


def axis_taps(
    index: torch.Tensor, size: torch.Tensor, side: int, bicubic: bool, corners: bool, zeros: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Taps into a ``side``-long table and their weights for positions ``index`` of an axis of ``size``:
    ``F.interpolate``'s sampling (bilinear: 2 taps, bicubic: 4, Keys' kernel at a = -0.75); ``zeros``:
    taps past the table's ends weigh nothing (``grid_sample``'s zero padding), else they take its edge."""
    index = index.to(torch.float32)
    size = size.to(torch.float32)
    src = index * (side - 1) / torch.clamp(size - 1, min=1) if corners else (index + 0.5) * side / size - 0.5
    floor = torch.floor(src)
    offsets = torch.arange(-1, 3, device=index.device) if bicubic else torch.arange(0, 2, device=index.device)
    raw = floor.long()[:, None] + offsets
    taps = raw.clamp(0, side - 1)
    distance = (src[:, None] - floor[:, None] - offsets).abs()
    if bicubic:
        a = -0.75
        near = ((a + 2) * distance - (a + 3)) * distance * distance + 1
        far = ((a * distance - 5 * a) * distance + 8 * a) * distance - 4 * a
        weights = torch.where(distance <= 1, near, far)
    else:
        weights = (1 - distance).clamp(min=0)
    if zeros:
        weights = weights * ((raw >= 0) & (raw <= side - 1))
    return taps, weights


def paddle_tower(model: torch.nn.Module) -> bool:
    """Whether the model's tower is PaddleOCR-VL's: SigLIP's under ``.model.visual.vision_model`` and a
    ``projector`` merging its patches."""
    inner = getattr(model, "model", model)
    tower = getattr(getattr(inner, "visual", None), "vision_model", None)
    embeddings = getattr(tower, "embeddings", None)
    return (
        hasattr(embeddings, "patch_embedding")
        and hasattr(embeddings, "num_grid_per_side")
        and hasattr(getattr(getattr(tower, "encoder", None), "rotary_pos_emb", None), "inv_freq")
        and hasattr(getattr(inner, "projector", None), "merge_kernel_size")
    )


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


class PaddleGridEncoder(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model  # the model's own paths: the checkpoint's names

    def forward(self, pixel_values: torch.Tensor, image_grid_thw: torch.Tensor) -> torch.Tensor:

        inner: Any = getattr(self.model, "model", self.model)
        tower, projector = inner.visual.vision_model, inner.projector
        embeddings = tower.embeddings
        merge = int(projector.merge_kernel_size[0])
        grid = image_grid_thw[0]
        h, w = grid[1], grid[2]
        patches = torch.arange(pixel_values.shape[0], device=pixel_values.device)
        frame, at = patches // (h * w), patches % (h * w)
        row, column = at // w, at % w

        hidden = embeddings.patch_embedding(pixel_values.to(embeddings.patch_embedding.weight.dtype))
        hidden = hidden.reshape(pixel_values.shape[0], -1)
        side = int(embeddings.num_grid_per_side)
        bicubic = embeddings.interpolation_mode == "bicubic"
        corners = bool(embeddings.interpolation_align_corners)
        h_taps, h_weights = axis_taps(row, h, side, bicubic, corners)
        w_taps, w_weights = axis_taps(column, w, side, bicubic, corners)
        n = h_taps.shape[1]
        taps = (h_taps[:, :, None] * side + w_taps[:, None, :]).reshape(-1, n * n)
        weights = (h_weights[:, :, None] * w_weights[:, None, :]).reshape(-1, n * n)
        hidden = hidden + (embeddings.position_embedding(taps) * weights[:, :, None]).sum(1).to(hidden.dtype)

        rotary = tower.encoder.rotary_pos_emb
        inv_freq = rotary.inv_freq.float()
        angles = torch.cat([row[:, None] * inv_freq, column[:, None] * inv_freq], dim=-1)
        angles = torch.cat([angles, angles], dim=-1)
        scale = float(getattr(rotary, "attention_scaling", 1.0))
        cos, sin = angles.cos()[:, None, :] * scale, angles.sin()[:, None, :] * scale
        mask = (frame[:, None] == frame[None, :])[None, None]
        for layer in tower.encoder.layers:
            hidden = hidden + self._attention(layer.self_attn, layer.layer_norm1(hidden), cos, sin, mask)
            hidden = hidden + layer.mlp(layer.layer_norm2(hidden))
        hidden = tower.post_layernorm(hidden)

        # the projector: each merged token's merge x merge patches, rows then columns within the block
        unit = merge * merge
        tokens = torch.arange(pixel_values.shape[0] // unit, device=pixel_values.device)
        rows, columns = h // merge, w // merge
        t_frame, t_at = tokens // (rows * columns), tokens % (rows * columns)
        t_row, t_column = t_at // columns, t_at % columns
        within = torch.arange(unit, device=pixel_values.device)
        index = (
            t_frame[:, None] * (h * w)
            + (t_row[:, None] * merge + within // merge) * w
            + t_column[:, None] * merge
            + within % merge
        )
        blocks = projector.pre_norm(hidden)[index.reshape(-1)].reshape(tokens.shape[0], -1)
        result: torch.Tensor = projector.linear_2(projector.act(projector.linear_1(blocks)))
        return result

    @staticmethod
    def _attention(
        attn: Any, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        length, heads = x.shape[0], int(attn.num_heads)
        q, k, v = (p(x).reshape(length, heads, -1) for p in (attn.q_proj, attn.k_proj, attn.v_proj))
        q = (q.float() * cos + _rotate_half(q.float()) * sin).to(v.dtype)
        k = (k.float() * cos + _rotate_half(k.float()) * sin).to(v.dtype)
        out = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], attn_mask=mask
        )
        result: torch.Tensor = attn.out_proj(out[0].transpose(0, 1).reshape(length, -1))
        return result
