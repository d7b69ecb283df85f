"""More image_grid_thw vision towers as one graph over one image's patches, for any grid (the
grid_vision.py way: what transformers makes from ``grid_thw.tolist()`` made from the grid's values):

- VideoLLaMA3: SigLIP over raster-order patches with a 2-D rotary position (row, column), attention
  within each frame under a mask, its projector per patch. Its images are merged by 1 (the image
  processor's ``merge_size``; 2 is its videos'), so ``pixel_unshuffle``'s bilinear resize to the grid
  over 1 is the identity: the graph takes the grid alone and gives ``image_merge_sizes`` = 1 to
  transformers' side of the check.

The graph's inputs are grid_vision.py's: ``pixel_values`` (patches x channels · patch², rows in the
processor's order) and ``image_grid_thw`` (1 x 3, int64); its output the image's feature rows. Each form
is a ``GridForm`` (grid_vision.py's ``grid_form`` finds it by model type): its class says where its tower
is, the shape of a row of ``pixel_values`` and how many rows a side an image token spans.
axial_grid_forms.py holds more (Inkling2, Kimi-K2.5, LFM3-VL, MiniMax-M3-VL, Muse Glimmer).
"""

from __future__ import annotations

from typing import Any

import torch


class GridForm(torch.nn.Module):
    """A tower's grid form; its class says where the tower is and what its inputs look like."""

    TOWER = "vision_tower"
    BARE_OUTPUT = "last_hidden_state"  # the field of the tower's own forward the form computes when bare

    @classmethod
    def tower_of(cls, model: torch.nn.Module) -> torch.nn.Module:
        found: torch.nn.Module = getattr(getattr(model, "model", model), cls.TOWER)
        return found

    def __init__(self, model: torch.nn.Module, bare: bool = False) -> None:
        super().__init__()
        self.model = model  # the model's own paths: the checkpoint's names
        # the tower alone (tower_features.py): its own output, before the vision-language model's projector
        self.bare = bare

    @property
    def inner(self) -> Any:
        return getattr(self.model, "model", self.model)

    @property
    def tower(self) -> Any:
        return self.model if self.bare else getattr(self.inner, self.TOWER)

    @staticmethod
    def merge_size(config: Any) -> int:
        return int(config.spatial_merge_size)

    @staticmethod
    def patch_shape(config: Any) -> tuple[int, ...]:
        return (int(config.num_channels) * int(config.patch_size) ** 2,)

    @staticmethod
    def generate_inputs(images: int) -> dict[str, torch.Tensor]:
        return {}


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


def _attention(
    attn: Any,
    out: torch.nn.Module,
    x: torch.Tensor,
    mask: torch.Tensor,
    rotary: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Attention over the patches under ``mask`` (patches x patches): the same values as transformers'
    attention over each ``cu_seqlens`` piece alone."""
    length, heads = x.shape[0], int(attn.num_heads)
    q, k, v = (p(x).reshape(length, heads, -1) for p in (attn.q_proj, attn.k_proj, attn.v_proj))
    if rotary is not None:
        cos, sin = rotary
        q = (q.float() * cos + _rotate_half(q.float()) * sin).to(v.dtype)
        k = (k.float() * cos + _rotate_half(k.float()) * sin).to(v.dtype)
    o = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1)[None],
        k.transpose(0, 1)[None],
        v.transpose(0, 1)[None],
        attn_mask=mask[None, None],
        scale=float(attn.scaling),
    )
    result: torch.Tensor = out(o[0].transpose(0, 1).reshape(length, -1))
    return result


def _raster(pixel_values: torch.Tensor, grid: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Each patch's frame, row and column, the patches in raster order within each frame."""
    h, w = grid[1], grid[2]
    patches = torch.arange(pixel_values.shape[0], device=pixel_values.device)
    frame, at = patches // (h * w), patches % (h * w)
    return frame, at // w, at % w


class VideoLlama3GridEncoder(GridForm):
    TOWER = "vision_model"

    @staticmethod
    def merge_size(config: Any) -> int:
        return 1  # its images'

    @staticmethod
    def generate_inputs(images: int) -> dict[str, torch.Tensor]:
        return {"image_merge_sizes": torch.ones(images, dtype=torch.int64)}

    def forward(self, pixel_values: torch.Tensor, image_grid_thw: torch.Tensor) -> torch.Tensor:
        visual = self.tower
        frame, row, column = _raster(pixel_values, image_grid_thw[0])
        hidden = visual.embeddings(pixel_values.to(visual.embeddings.patch_embedding.weight.dtype))
        rotary = visual.rotary_pos_emb
        inv_freq = rotary.inv_freq.float()
        angles = torch.cat([row[:, None] * inv_freq, column[:, None] * inv_freq], dim=-1)
        angles = torch.cat([angles, angles], dim=-1)
        scale = float(rotary.attention_scaling)
        cos, sin = angles.cos()[:, None, :] * scale, angles.sin()[:, None, :] * scale
        mask = frame[:, None] == frame[None, :]
        for layer in visual.encoder.layers:
            attn = layer.self_attn
            hidden = hidden + _attention(attn, attn.out_proj, layer.layer_norm1(hidden), mask, (cos, sin))
            hidden = hidden + layer.mlp(layer.layer_norm2(hidden))
        states: torch.Tensor = visual.post_layernorm(hidden)
        if self.bare:  # pixel_unshuffle by its images' merge size of 1: the identity
            return states
        result: torch.Tensor = self.inner.projector(states)
        return result


FORMS: dict[str, type[GridForm]] = {"video_llama_3": VideoLlama3GridEncoder}
