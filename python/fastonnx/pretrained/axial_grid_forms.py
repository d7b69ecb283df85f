"""Grid forms (grid_forms.py's way) of the towers with an axial rotary position over the patch grid:
what transformers makes from ``grid_thw.tolist()`` (positions, position-table taps, attention pieces,
merge gathers) made from the grid's values, the tower's own layers run over them.

- Inkling2: ``pixel_values`` has a row per image token (``merge·patch`` square x channels) and the grid
  counts tokens; the tower embeds each token's merge² patches, adds the table resampled to the patch
  grid (bilinear), puts a class token first (position (0, 0), patches at (row + 1, column + 1)) and
  attends over the whole image; the merger takes each token's patches, the class token dropped.
- Kimi-K2.5: raster patches, the table resampled bicubically plus a time embedding (none for one
  frame), the whole clip one attention piece, each merge block pooled over the frames. Its images
  are one frame (the token count is the pixels' over merge²; a clip's would be its grid's).
- LFM3-VL: merge-block-ordered patches, attention within each frame (a mask) with grouped keys and
  values, and a gated depthwise convolution over each frame's grid: each patch's neighbours gathered by
  their block-ordered index, those past the frame's edge masked (the convolution's zero padding).
- MiniMax-M3-VL: merge-block-ordered patches, a rotary over (frame, row, column) on the heads' first
  channels, the whole clip one attention piece; its projector merges each block.
- Muse Glimmer: raster patches, the table resampled bilinearly with zero padding, Qwen2.5-VL's windows
  (over patches: ``pos_emb_height`` a side) in the window layers and whole frames in the others, the
  blocks shuffled into tokens channel-major.

The graphs take one image a call, so attention over a whole image or clip needs no mask.
"""

from __future__ import annotations

from typing import Any

import torch

from fastonnx.pretrained.grid_forms import GridForm, _rotate_half
from fastonnx.pretrained.grid_towers import axis_taps


def _blocks(count: int | torch.SymInt, h: torch.Tensor, w: torch.Tensor, merge: int, device: Any) -> Any:
    """Each of ``count`` patches' frame, row and column when a frame's patches come merge block by merge
    block (raster blocks, raster within one: ``get_vision_position_ids``'s order; raster for merge 1)."""
    patches = torch.arange(count, device=device)
    frame, at = patches // (h * w), patches % (h * w)
    unit = merge * merge
    block, within = at // unit, at % unit
    blocks_w = w // merge
    row = (block // blocks_w) * merge + within // merge
    column = (block % blocks_w) * merge + within % merge
    return frame, row, column


def _table(
    table: Any, row: torch.Tensor, column: torch.Tensor, h: torch.Tensor, w: torch.Tensor, **how: bool
) -> torch.Tensor:
    """A square learned position table (an embedding of side² rows) resampled to each patch."""
    side = int(round(int(table.weight.shape[0]) ** 0.5))
    h_taps, h_weights = axis_taps(row, h, side, **how)
    w_taps, w_weights = axis_taps(column, w, side, **how)
    n = h_taps.shape[1]
    taps = (h_taps[:, :, None] * side + w_taps[:, None, :]).reshape(-1, n * n)
    weights = (h_weights[:, :, None] * w_weights[:, None, :]).reshape(-1, n * n)
    found: torch.Tensor = (table(taps) * weights[:, :, None]).sum(1)
    return found


def _rotate_pairs(x: torch.Tensor) -> torch.Tensor:
    pairs = x.reshape(*x.shape[:-1], -1, 2)
    return torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pairs: bool = False) -> torch.Tensor:
    """The rotary on the first ``cos.shape[-1]`` channels of each head (x: length x heads x head size)."""
    span = cos.shape[-1]
    part, rest = x[..., :span].float(), x[..., span:]
    turned = _rotate_pairs(part) if pairs else _rotate_half(part)
    rotated = (part * cos[:, None] + turned * sin[:, None]).to(x.dtype)
    return torch.cat([rotated, rest], dim=-1) if rest.shape[-1] else rotated


def _attend(
    attn: Any,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of length x heads x head size queries (keys and values grouped or not) under ``mask``
    (length x length, or none: the whole image), as rows of length x heads · head size."""
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1)[None],
        k.transpose(0, 1)[None],
        v.transpose(0, 1)[None],
        attn_mask=None if mask is None else mask[None, None],
        scale=float(attn.scaling),
    )
    return out[0].transpose(0, 1).reshape(q.shape[0], -1)


def _qkv(attn: Any, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    head = int(getattr(attn, "head_dim", 0) or x.shape[-1] // int(attn.num_heads))
    return tuple(p(x).reshape(x.shape[0], -1, head) for p in (attn.q_proj, attn.k_proj, attn.v_proj))


def _angles(inv_freq: torch.Tensor, *positions: torch.Tensor) -> torch.Tensor:
    """Each position's angles at each frequency: patches x positions x frequencies."""
    stacked = torch.stack(positions, dim=-1).float()
    return stacked[..., None] * inv_freq.float()


class Inkling2GridEncoder(GridForm):
    BARE_OUTPUT = "pooler_output"  # its merger is the tower's

    @staticmethod
    def merge_size(config: Any) -> int:
        return 1  # a row of pixel_values is an image token

    @staticmethod
    def patch_shape(config: Any) -> tuple[int, ...]:
        side = int(config.spatial_merge_size) * int(config.patch_size)
        return side, side, int(config.num_channels)

    def forward(self, pixel_values: torch.Tensor, image_grid_thw: torch.Tensor) -> torch.Tensor:
        visual = self.tower
        embeddings = visual.embeddings
        merge, patch = int(visual.config.spatial_merge_size), int(visual.config.patch_size)
        h, w = image_grid_thw[0, 1] * merge, image_grid_thw[0, 2] * merge  # in patches
        pixels = pixel_values.to(embeddings.patch_embedding.weight.dtype)
        channels = pixels.shape[-1]
        patches = pixels.reshape(-1, merge, patch, merge, patch, channels).transpose(2, 3)
        x = embeddings.patch_embedding(patches.reshape(-1, patch * patch * channels))
        _, row, column = _blocks(x.shape[0], h, w, merge, x.device)
        x = x + _table(embeddings.position_embedding, row, column, h, w, bicubic=False, corners=False).to(
            x.dtype
        )
        first = (embeddings.class_embedding + embeddings.cls_position_embedding).to(x.dtype)
        hidden = visual.pre_layernorm(torch.cat([first[None], x]))
        zero = torch.zeros(1, dtype=row.dtype, device=row.device)
        angles = _angles(
            visual.rotary_emb.inv_freq, torch.cat([zero, column + 1]), torch.cat([zero, row + 1])
        )
        angles = angles.flatten(1).repeat_interleave(2, dim=-1)  # (w, w, ..., h, h, ...): pairs
        scale = float(visual.rotary_emb.attention_scaling)
        cos, sin = angles.cos() * scale, angles.sin() * scale
        for layer in visual.layers:
            attn = layer.self_attn
            q, k, v = _qkv(attn, layer.layernorm_before(hidden))
            q, k = _rotate(q, cos, sin, pairs=True), _rotate(k, cos, sin, pairs=True)
            hidden = hidden + layer.lambda_1 * attn.out_proj(_attend(attn, q, k, v))
            hidden = hidden + layer.lambda_2 * layer.mlp(layer.layernorm_after(hidden))
        result: torch.Tensor = visual.merger(hidden[1:].reshape(-1, merge * merge * hidden.shape[-1]))
        return result


class KimiK25GridEncoder(GridForm):
    @staticmethod
    def merge_size(config: Any) -> int:
        return int(config.merge_kernel_size[0])

    @staticmethod
    def patch_shape(config: Any) -> tuple[int, ...]:
        return 3, int(config.patch_size), int(config.patch_size)

    def forward(self, pixel_values: torch.Tensor, image_grid_thw: torch.Tensor) -> torch.Tensor:
        visual = self.tower
        embed, positions = visual.patch_embed, visual.patch_embed.pos_emb
        t, h, w = image_grid_thw[0, 0], image_grid_thw[0, 1], image_grid_thw[0, 2]
        x = embed.proj(pixel_values).reshape(pixel_values.shape[0], -1)
        frame, row, column = _blocks(x.shape[0], h, w, 1, x.device)
        table = positions.position_embeddings
        side = int(table.shape[0])
        h_taps, h_weights = axis_taps(row, h, side, True, False)
        w_taps, w_weights = axis_taps(column, w, side, True, False)
        taps = (h_taps[:, :, None] * side + w_taps[:, None, :]).reshape(-1, 16)
        weights = (h_weights[:, :, None] * w_weights[:, None, :]).reshape(-1, 16).to(table.dtype)
        spatial = (table.flatten(0, 1)[taps] * weights[:, :, None]).sum(1)
        # the time table's row 0 is zeros: a one-frame clip's; frame f of more is row f + 1
        timed = spatial + positions.time_position_embeddings[frame + (t > 1).to(frame.dtype)]
        hidden = x + timed.to(x.dtype)
        angles = _angles(visual.rotary_emb.inv_freq, column, row).transpose(1, 2).flatten(1)  # w, h pairs
        angles = torch.cat([angles, angles], dim=-1)
        scale = float(visual.rotary_emb.attention_scaling)
        cos, sin = angles.cos() * scale, angles.sin() * scale
        for layer in visual.layers:
            attn = layer.attn
            q, k, v = _qkv(attn, layer.norm1(hidden))
            hidden = hidden + attn.proj(_attend(attn, _rotate(q, cos, sin), _rotate(k, cos, sin), v))
            hidden = hidden + layer.mlp(layer.norm2(hidden))
        hidden = visual.final_layernorm(hidden)
        if self.bare:
            states: torch.Tensor = hidden
            return states
        # each merge block's patches (one frame: the pooling over frames is the identity)
        kh, kw = (int(s) for s in visual.merge_kernel_size)
        tokens = torch.arange(hidden.shape[0] // (kh * kw), device=hidden.device)
        columns = w // kw
        within = torch.arange(kh * kw, device=hidden.device)
        index = (
            ((tokens // columns)[:, None] * kh + within // kw) * w
            + (tokens % columns)[:, None] * kw
            + within % kw
        )
        pooled = hidden[index]  # tokens x block x hidden
        result: torch.Tensor = self.inner.mm_projector(pooled).squeeze(1)
        return result


class Lfm3VlGridEncoder(GridForm):
    @staticmethod
    def patch_shape(config: Any) -> tuple[int, ...]:
        return (int(config.in_channels) * int(config.temporal_patch_size) * int(config.patch_size) ** 2,)

    def forward(self, pixel_values: torch.Tensor, image_grid_thw: torch.Tensor) -> torch.Tensor:
        visual = self.tower
        merge = int(visual.config.spatial_merge_size)
        h, w = image_grid_thw[0, 1], image_grid_thw[0, 2]
        hidden = visual.embedding_norm(visual.patch_embed(pixel_values))
        frame, row, column = _blocks(hidden.shape[0], h, w, merge, hidden.device)
        angles = _angles(visual.rotary_pos_emb.inv_freq, row, column).flatten(1)  # h..., w...
        angles = torch.cat([angles, angles], dim=-1)
        scale = float(visual.rotary_pos_emb.attention_scaling)
        cos, sin = angles.cos() * scale, angles.sin() * scale
        mask = frame[:, None] == frame[None, :]
        neighbours = self._neighbours(frame, row, column, h, w, merge, int(visual.config.conv_kernel_size))
        for layer in visual.layers:
            x = layer.operator_norm(hidden)
            if layer.is_attention_layer:
                attn = layer.self_attn
                q, k, v = _qkv(attn, x)
                q, k = _rotate(attn.q_norm(q), cos, sin), _rotate(attn.k_norm(k), cos, sin)
                hidden = hidden + attn.out_proj(_attend(attn, q, k, v, mask))
            else:
                hidden = hidden + self._convolution(layer.conv, x, neighbours)
            hidden = hidden + layer.feed_forward(layer.ffn_norm(hidden))
        if self.bare:
            states: torch.Tensor = hidden
            return states
        result: torch.Tensor = self.inner.multi_modal_projector(hidden)
        return result

    @staticmethod
    def _neighbours(
        frame: torch.Tensor,
        row: torch.Tensor,
        column: torch.Tensor,
        h: torch.Tensor,
        w: torch.Tensor,
        merge: int,
        kernel: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each patch's kernel² neighbours (row-major over the kernel) as block-ordered indices, and
        whether each lies inside its frame (the convolution pads with zeros)."""
        offsets = torch.arange(kernel, device=row.device) - kernel // 2
        rows = (row[:, None] + offsets)[:, :, None].expand(-1, kernel, kernel).reshape(row.shape[0], -1)
        columns = (column[:, None] + offsets)[:, None, :].expand(-1, kernel, kernel).reshape(row.shape[0], -1)
        inside = (rows >= 0) & (rows < h) & (columns >= 0) & (columns < w)
        rows, columns = rows.clamp(min=0), columns.clamp(min=0)
        index = (
            frame[:, None] * (h * w)
            + ((rows // merge) * (w // merge) + columns // merge) * (merge * merge)
            + (rows % merge) * merge
            + columns % merge
        )
        return torch.where(inside, index, 0), inside

    @staticmethod
    def _convolution(
        conv: Any, x: torch.Tensor, neighbours: tuple[torch.Tensor, torch.Tensor]
    ) -> torch.Tensor:
        index, inside = neighbours
        input_gate, output_gate, conv_input = conv.in_proj(x).chunk(3, dim=-1)
        gated = input_gate * conv_input
        taps = gated[index] * inside[:, :, None].to(gated.dtype)  # patches x kernel² x channels
        weight = conv.spatial_conv.weight.reshape(gated.shape[-1], -1).transpose(0, 1)  # kernel² x channels
        result: torch.Tensor = conv.out_proj(output_gate * (taps * weight).sum(1))
        return result


class MiniMaxM3VlGridEncoder(GridForm):
    @staticmethod
    def patch_shape(config: Any) -> tuple[int, ...]:
        return (int(config.num_channels) * int(config.temporal_patch_size) * int(config.patch_size) ** 2,)

    def forward(self, pixel_values: torch.Tensor, image_grid_thw: torch.Tensor) -> torch.Tensor:
        visual = self.tower
        merge = int(visual.config.spatial_merge_size)
        h, w = image_grid_thw[0, 1], image_grid_thw[0, 2]
        x = visual.embeddings(pixel_values).to(visual.pre_layrnorm.weight.dtype)
        frame, row, column = _blocks(x.shape[0], h, w, merge, x.device)
        angles = _angles(visual.rotary_emb.inv_freq, frame, row, column).flatten(1)  # t..., h..., w...
        angles = torch.cat([angles, angles], dim=-1)
        scale = float(visual.rotary_emb.attention_scaling)
        cos, sin = (angles.cos() * scale).to(x.dtype), (angles.sin() * scale).to(x.dtype)
        hidden = visual.pre_layrnorm(x)
        for layer in visual.layers:
            attn = layer.self_attn
            q, k, v = _qkv(attn, layer.layer_norm1(hidden))
            hidden = hidden + attn.out_proj(_attend(attn, _rotate(q, cos, sin), _rotate(k, cos, sin), v))
            hidden = hidden + layer.mlp(layer.layer_norm2(hidden))
        result: torch.Tensor = self.inner.multi_modal_projector(hidden)
        return result


class MuseGlimmerGridEncoder(GridForm):
    @staticmethod
    def merge_size(config: Any) -> int:
        return int(config.merge_size)

    @staticmethod
    def patch_shape(config: Any) -> tuple[int, ...]:
        return (int(config.patch_temporal) * 3 * int(config.patch_size) ** 2,)

    def forward(self, pixel_values: torch.Tensor, image_grid_thw: torch.Tensor) -> torch.Tensor:
        visual = self.tower
        embedder = visual.patch_embedder
        h, w = image_grid_thw[0, 1], image_grid_thw[0, 2]
        x = embedder.patch_embedding(pixel_values.to(embedder.patch_embedding.weight.dtype))
        frame, row, column = _blocks(x.shape[0], h, w, 1, x.device)
        x = x + self._positions(embedder.position_embedding_table, row, column, h, w).to(x.dtype)
        # Qwen2.5-VL's windows over patches: each side padded to the next multiple above it
        n = int(visual.window_size) // int(visual.patch_size)
        window = (frame * (h // n + 1) + row // n) * (w // n + 1) + column // n
        order = torch.argsort((window * n + row % n) * n + column % n)
        hidden = visual.ln_pre(x)[order]
        angles = _angles(visual.rotary_emb.inv_freq, column[order] + 1, row[order] + 1).flatten(1)
        angles = torch.cat([angles, angles], dim=-1)
        scale = float(visual.rotary_emb.attention_scaling)
        cos, sin = (angles.cos() * scale).to(x.dtype), (angles.sin() * scale).to(x.dtype)
        masks = {
            "window_attention": window[order][:, None] == window[order][None, :],
            "full_attention": frame[order][:, None] == frame[order][None, :],
        }
        for kind, layer in zip(visual.config.layer_types, visual.layers, strict=True):
            attn = layer.attn
            q, k, v = _qkv(attn, layer.norm1(hidden))
            q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
            hidden = hidden + attn.proj(_attend(attn, q, k, v, masks[kind]))
            hidden = hidden + layer.mlp(layer.norm2(hidden))
        hidden = visual.ln_post(hidden[torch.argsort(order)])
        # each merge block's patches, then channel-major within the token (pixel_shuffle's)
        merge = int(visual.merge_size)
        unit = merge * merge
        tokens = torch.arange(hidden.shape[0] // unit, device=hidden.device)
        per_frame = (h // merge) * (w // merge)
        t_frame, at = tokens // per_frame, tokens % per_frame
        within = torch.arange(unit, device=hidden.device)
        index = (
            t_frame[:, None] * (h * w)
            + ((at // (w // merge))[:, None] * merge + within // merge) * w
            + (at % (w // merge))[:, None] * merge
            + within % merge
        )
        blocks = hidden[index].transpose(1, 2).reshape(tokens.shape[0], -1)
        if self.bare:  # the tower's pixel_shuffle
            shuffled: torch.Tensor = blocks
            return shuffled
        inner = self.inner
        features = inner.vision_projection(inner.vision_adapter(blocks))
        result: torch.Tensor = inner.perception_emb_norm(features)
        return result

    @staticmethod
    def _positions(
        table: Any, row: torch.Tensor, column: torch.Tensor, h: torch.Tensor, w: torch.Tensor
    ) -> torch.Tensor:
        """The table resampled to each raster patch (``grid_sample``'s: bilinear, zero padding)."""
        return _table(table, row, column, h, w, bicubic=False, corners=False, zeros=True)


FORMS: dict[str, type[GridForm]] = {
    "inkling2": Inkling2GridEncoder,
    "kimi_k25": KimiK25GridEncoder,
    "lfm3_vl": Lfm3VlGridEncoder,
    "minimax_m3_vl": MiniMaxM3VlGridEncoder,
    "muse_glimmer": MuseGlimmerGridEncoder,
}
