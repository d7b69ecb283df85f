"""Grid forms (grid_forms.py's way) of three more image_grid_thw towers: what transformers makes from
``grid_thw.tolist()`` made from the grid's values, the tower's own layers run over them.

- Cosmos3 Edge: SigLIP2 over merge-block-ordered patches, its square table resized to each frame by
  ``F.interpolate(bilinear, antialias=True)``: an axis of ``n`` from a table side ``S`` weighs table
  entry ``j`` for output ``i`` by the triangle ``1 - |j + 0.5 - c| / max(S / n, 1)`` at
  ``c = (i + 0.5) S / n``, normalised over the table (torch's antialiased kernel: the triangle widens
  when it shrinks, and is plain bilinear when it grows); attention within each frame; the projector
  merges each block's consecutive rows.
- HunYuan-VL: raster patches, the table (past its class row) resampled as ``F.interpolate`` does,
  attention within each frame, then the merger's strided convolution as a linear map of each block's
  gathered patches, a newline row after each row of tokens and a begin and an end row: the image has
  ``rows · (columns + 1) + 2`` feature rows, so its row count is read from the grid (``.item()``, an
  unbacked size).
- Muse Spark: Muse Glimmer's tower, but its table is read with the grid's rows and columns swapped
  (``grid_thw[:, [0, 2, 1]]``): raster patch ``k`` takes the table at ``(k // h, k % h)`` resampled
  to ``w`` x ``h``.

The graphs take one image a call (grid_vision.py's inputs).
"""

from __future__ import annotations

from typing import Any, cast

import torch

from fastonnx.pretrained.axial_grid_forms import MuseGlimmerGridEncoder, _blocks, _table
from fastonnx.pretrained.grid_forms import GridForm
from fastonnx.pretrained.grid_towers import axis_taps
from fastonnx.torch_internals import check_size


def _attention(attn: Any, x: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """Attention without a rotary over the patches under ``mask``, before the output projection."""
    length, heads = x.shape[0], int(attn.num_heads)
    q, k, v = (
        p(x).reshape(length, heads, -1).transpose(0, 1)[None] for p in (attn.q_proj, attn.k_proj, attn.v_proj)
    )
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask[None, None], scale=scale)
    return out[0].transpose(0, 1).reshape(length, -1)


def antialiased_weights(index: torch.Tensor, size: torch.Tensor, side: int) -> torch.Tensor:
    """Each position ``index`` of an axis of ``size``'s weights over a ``side``-long table (positions x
    side): ``F.interpolate(bilinear, align_corners=False, antialias=True)``'s."""
    scale = side / size.to(torch.float32)
    stretch = torch.clamp(scale, min=1.0)  # the triangle's half-width in table entries
    center = (index.to(torch.float32) + 0.5) * scale
    taps = torch.arange(side, device=index.device, dtype=torch.float32)
    weights = (1 - ((taps[None, :] + 0.5 - center[:, None]) / stretch).abs()).clamp(min=0)
    return weights / weights.sum(-1, keepdim=True)


class Cosmos3EdgeGridEncoder(GridForm):
    TOWER = "visual"

    def forward(self, pixel_values: torch.Tensor, image_grid_thw: torch.Tensor) -> torch.Tensor:
        visual = self.tower
        embeddings = visual.embeddings
        merge = int(visual.config.spatial_merge_size)
        h, w = image_grid_thw[0, 1], image_grid_thw[0, 2]
        x = embeddings.patch_embedding(pixel_values.to(embeddings.patch_embedding.weight.dtype))
        frame, row, column = _blocks(x.shape[0], h, w, merge, x.device)
        table = embeddings.position_embedding.weight
        side = int(embeddings.position_embedding_size)
        taps = (
            antialiased_weights(row, h, side)[:, :, None] * antialiased_weights(column, w, side)[:, None, :]
        )
        hidden = x + (taps.reshape(-1, side * side) @ table.float()).to(x.dtype)
        mask = frame[:, None] == frame[None, :]
        for layer in visual.encoder.layers:
            attn = layer.self_attn
            hidden = hidden + attn.out_proj(
                _attention(attn, layer.layer_norm1(hidden), mask, float(attn.scale))
            )
            hidden = hidden + layer.mlp(layer.layer_norm2(hidden))
        states: torch.Tensor = visual.post_layernorm(hidden)
        if self.bare:
            return states
        result: torch.Tensor = self.inner.projector(states)
        return result


class HunYuanVlGridEncoder(GridForm):
    BARE_OUTPUT = "pooler_output"  # its patch merger is the tower's

    @staticmethod
    def patch_shape(config: Any) -> tuple[int, ...]:
        return (int(config.num_channels) * int(config.patch_size) ** 2,)

    def forward(self, pixel_values: torch.Tensor, image_grid_thw: torch.Tensor) -> torch.Tensor:
        visual = self.tower
        embeddings, merger = visual.embeddings, visual.patch_merger
        config = visual.config
        merge, patch = int(config.spatial_merge_size), int(config.patch_size)
        h, w = image_grid_thw[0, 1], image_grid_thw[0, 2]
        weight = embeddings.patch_embedding.weight
        pixels = pixel_values.to(weight.dtype).reshape(-1, int(config.num_channels), patch, patch)
        x = embeddings.patch_embedding(pixels).flatten(1)
        frame, row, column = _blocks(x.shape[0], h, w, 1, x.device)
        side = int(embeddings.position_edge)
        bicubic = config.interpolate_mode == "bicubic"
        h_taps, h_weights = axis_taps(row, h, side, bicubic, False)
        w_taps, w_weights = axis_taps(column, w, side, bicubic, False)
        n = h_taps.shape[1]
        taps = (h_taps[:, :, None] * side + w_taps[:, None, :]).reshape(-1, n * n) + 1  # past the class row
        weights = (h_weights[:, :, None] * w_weights[:, None, :]).reshape(-1, n * n)
        positions = (embeddings.position_embedding.weight.float()[taps] * weights[:, :, None]).sum(1)
        hidden = x + positions.to(x.dtype)
        mask = frame[:, None] == frame[None, :]
        for layer in visual.layers:
            attn = layer.self_attn
            hidden = hidden + attn.o_proj(
                _attention(attn, layer.layer_norm1(hidden), mask, float(attn.scaling))
            )
            hidden = hidden + layer.mlp(layer.layer_norm2(hidden))
        hidden = merger.before_rms(hidden)
        # the strided convolution over each merge block: a linear map of its patches, gathered
        columns = w // merge
        tokens = torch.arange(hidden.shape[0] // (merge * merge), device=hidden.device)
        within = torch.arange(merge * merge, device=hidden.device)
        index = ((tokens // columns)[:, None] * merge + within // merge) * w + (tokens % columns)[
            :, None
        ] * merge
        blocks = hidden[index + within % merge].reshape(tokens.shape[0], -1)  # (block row, column, channel)
        conv = merger.proj_conv
        kernel = conv.weight.permute(0, 2, 3, 1).reshape(conv.weight.shape[0], -1)
        x = merger.proj_act(torch.nn.functional.linear(blocks, kernel, conv.bias))
        x = torch.nn.functional.linear(x, merger.proj_out.weight.flatten(1), merger.proj_out.bias)
        # a newline after each row of tokens: rows · (columns + 1) rows, then the begin and end rows
        rows = cast(int, (h // merge).item())
        check_size(rows >= 1)
        at = torch.arange(tokens.shape[0] + rows, device=x.device)
        token_row, token_column = at // (columns + 1), at % (columns + 1)
        newline = (token_column == columns)[:, None]
        gathered = x[(token_row * columns + token_column).clamp(max=tokens.shape[0] - 1)]
        x = torch.where(newline, merger.image_newline.to(x.dtype), gathered)
        x = merger.mlp(x)
        x = torch.cat([merger.image_begin[None].to(x.dtype), x, merger.image_end[None].to(x.dtype)])
        result: torch.Tensor = merger.after_rms(x)
        return result


class MuseSparkGridEncoder(MuseGlimmerGridEncoder):
    @staticmethod
    def _positions(
        table: Any, row: torch.Tensor, column: torch.Tensor, h: torch.Tensor, w: torch.Tensor
    ) -> torch.Tensor:
        at = row * w + column  # read as a raster of the swapped grid: w rows of h
        return _table(table, at // h, at % h, w, h, bicubic=False, corners=False, zeros=True)


FORMS: dict[str, type[GridForm]] = {
    "cosmos3_edge": Cosmos3EdgeGridEncoder,
    "hunyuan_vl": HunYuanVlGridEncoder,
    "muse_spark": MuseSparkGridEncoder,
}
