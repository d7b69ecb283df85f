"""image-text-to-text for MiniCPM-V 4.6 and MiniCPM-OCR, whose processor gives an image NaViT-packed: the
source image and its slices (each of its own size) as one row of patches, ``pixel_values`` 1 x channels x
patch x (patches · patch), and each slice's size in patches, ``target_sizes`` slices x 2 (int32).
vision_language.py's three files:

- ``vision_encoder.onnx``: one image's ``pixel_values`` and ``target_sizes`` as the processor gives them
  (the patches' and the slices' numbers dynamic) to ``image_features``, the rows of all its slices in
  order (patches / 16, or / 4 where ``downsample_mode`` is "4x"). transformers runs the tower from
  ``target_sizes.tolist()``: each slice's position ids (its rows and columns bucketed onto the learned
  table), attention split at each slice's length, the window merger's 2 x 2 windows
  (``get_vision_window_index``) and the merger's 2 x 2 blocks. A capture would fix the sizes; here each
  patch's slice, row and column come from ``target_sizes``' values as tensor arithmetic, attention within
  a slice is attention under a mask of the patches sharing it (the same values as each slice alone), and
  the windows and blocks are gathers whose indices are computed the same way;
- ``embed_tokens.onnx``: vision_language.py's merge at ``image_token_id`` (``masked_scatter``'s order);
- ``decoder_model_merged.onnx``: vision_language.py's step from ``inputs_embeds`` (the text model is
  Qwen3.5's). MiniCPM-V 4.7's positions are its canvas M-RoPE planes (3 x batch x sequence, its
  ``get_rope_index`` over the prompt's markers and ``mm_token_type_ids``; the steps after the prompt
  count on from ``rope_deltas``), MiniCPM-V 4.6's and MiniCPM-OCR's plain.
"""

from __future__ import annotations

from typing import Any

import torch

from fastonnx.errors import InputError
from fastonnx.pretrained import vision_language as vl
from fastonnx.pretrained.graph_spec import GraphSpec

MINICPM_TYPES = ("minicpmv4_6", "minicpm_ocr", "minicpmv4_7")
"""Model types whose package this module's graphs make."""

PATCHES = "num_patches"
SLICES = "num_slices"


def own_layout(model: torch.nn.Module) -> bool:
    return getattr(model.config, "model_type", None) in MINICPM_TYPES


def _window_merger(config: Any) -> bool:
    """Whether the tower's window merger runs (``downsample_mode`` other than "4x")."""
    return str(config.downsample_mode) != "4x"


def rows_per_patch_block(config: Any) -> int:
    """The patches a feature row stands for: the window merger's 2 x 2 (where it runs) times the merger's
    2 x 2 each round; the processor's ``image_token_divisor``."""
    merge_h, merge_w = (int(k) for k in config.merge_kernel_size)
    window = 4 if _window_merger(config) else 1
    rounds = int(config.merger_times)
    return window * int((merge_h * merge_w) ** rounds)


def image_example(
    config: Any, device: str | torch.device, sizes: tuple[tuple[int, int], ...] = ((4, 8), (4, 4), (4, 4))
) -> dict[str, torch.Tensor]:
    """One image as the processor packs it: a source image of ``sizes[0]`` patches and slices of the
    others, each slice's patches in raster order, side by side along the last axis."""
    vision = config.vision_config
    channels, patch = int(vision.num_channels), int(vision.patch_size)
    total = sum(h * w for h, w in sizes)
    g = torch.Generator().manual_seed(0)
    pixels = torch.randn(1, channels, patch, total * patch, generator=g)
    return {
        "pixel_values": pixels.to(device),
        "target_sizes": torch.tensor(sizes, dtype=torch.int32, device=device),
    }


def _raster(count: Any, sizes: torch.Tensor, device: Any) -> tuple[torch.Tensor, ...]:
    """Each of ``count`` packed patches' slice, the slice's first patch, its row and column, and its
    slice's height and width: the slices' patches side by side in raster order (``sizes`` slices x 2)."""
    h, w = sizes[:, 0], sizes[:, 1]
    ends = torch.cumsum(h * w, dim=0)
    k = torch.arange(count, device=device)
    slice_of = (ends.unsqueeze(0) <= k.unsqueeze(1)).to(torch.int64).sum(dim=1)
    start = (ends - h * w)[slice_of]
    local = k - start
    width = w[slice_of]
    return slice_of, start, local // width, local % width, h[slice_of], width


def _buckets(coordinate: torch.Tensor, extent: torch.Tensor, side: int) -> torch.Tensor:
    """``torch.bucketize(coordinate / extent, arange(1/side, 1, 1/side), right=True)``: how many of the
    table's boundaries lie at or below the fraction (``get_vision_nearest_position_ids``)."""
    boundaries = torch.arange(1 / side, 1.0, 1 / side, device=coordinate.device)
    fraction = coordinate / extent  # int / int: float32, as transformers' arange(h) / h
    return (boundaries.unsqueeze(0) <= fraction.unsqueeze(1)).to(torch.int64).sum(dim=1)


def _attend(attn: Any, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The tower's attention over ``x`` (groups x length x width), each group alone, under ``mask``
    (groups x length x length, True where attending) where given."""
    groups, length = x.shape[0], x.shape[1]
    heads = int(attn.num_heads)
    q, k, v = (
        p(x).reshape(groups, length, heads, -1).transpose(1, 2)
        for p in (attn.q_proj, attn.k_proj, attn.v_proj)
    )
    o = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=None if mask is None else mask.unsqueeze(1), scale=float(attn.scaling)
    )
    result: torch.Tensor = attn.out_proj(o.transpose(1, 2).reshape(groups, length, -1))
    return result


def _layer(layer: Any, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    x = x + _attend(layer.self_attn, layer.layer_norm1(x).unsqueeze(0), mask.unsqueeze(0))[0]
    out: torch.Tensor = x + layer.mlp(layer.layer_norm2(x))
    return out


def _window_order(count: Any, sizes: torch.Tensor, device: Any) -> torch.Tensor:
    """The patch at each slot of ``get_vision_window_index``'s order (window 2, merge 1): each slice's 2 x
    2 windows in raster order, a window's 4 patches in raster order."""
    _, start, _, _, _, width = _raster(count, sizes, device)
    slot = torch.arange(count, device=device) - start
    window, within = slot // 4, slot % 4
    across = width // 2
    row = 2 * (window // across) + within // 2
    column = 2 * (window % across) + within % 2
    return start + row * width + column


def _vit_merger(merger: Any, x: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
    """``MiniCPMV4_6ViTWindowAttentionMerger``: attention within each 2 x 2 window, then each window's 4
    patches to one row."""
    order = _window_order(x.shape[0], sizes, x.device)
    width = x.shape[-1]
    windows = merger.layer_norm1(x)[order].reshape(-1, 4, width)
    x = x[order] + _attend(merger.self_attn, windows, None).reshape(-1, width)
    patch = x.reshape(-1, 4, width)
    out = merger.linear_2(merger.act(merger.linear_1(merger.pre_norm(patch.flatten(1)))))
    merged: torch.Tensor = out + patch.mean(dim=1)
    return merged


def _shrunk(sizes: torch.Tensor, kernel: tuple[int, int]) -> torch.Tensor:
    return torch.stack([sizes[:, 0] // kernel[0], sizes[:, 1] // kernel[1]], dim=1)


def _blocks(x: torch.Tensor, sizes: torch.Tensor, kernel: tuple[int, int]) -> torch.Tensor:
    """The merger's ``view(h/kh, kh, w/kw, kw, d).permute(0, 2, 1, 3, 4)`` of each slice: each kh x kw block
    of its patches (``sizes``' grid) as one row of their features, in raster order, the slices in turn."""
    kh, kw = kernel
    blocks = _shrunk(sizes, kernel)
    slice_of, _, row, column, _, _ = _raster(x.shape[0] // (kh * kw), blocks, x.device)
    patches = sizes[:, 0] * sizes[:, 1]
    start = (torch.cumsum(patches, dim=0) - patches)[slice_of]  # the merger's start counts by sizes
    width = sizes[:, 1][slice_of]
    tap = torch.arange(kh * kw, device=x.device)
    rows = (kh * row).unsqueeze(1) + tap // kw
    columns = (kw * column).unsqueeze(1) + tap % kw
    index = start.unsqueeze(1) + rows * width.unsqueeze(1) + columns
    return x[index].reshape(index.shape[0], -1)


def image_features(
    model: torch.nn.Module, pixel_values: torch.Tensor, target_sizes: torch.Tensor
) -> torch.Tensor:
    """transformers' ``get_image_features(...).pooler_output`` of one packed image, concatenated, computed
    from ``target_sizes``' values as tensors (the module's docstring)."""
    inner: Any = getattr(model, "model", model)
    config: Any = model.config
    tower = inner.vision_tower
    sizes = target_sizes.to(torch.int64)
    embeddings = tower.embeddings
    x = embeddings.patch_embedding(pixel_values.to(embeddings.patch_embedding.weight.dtype))
    x = x.flatten(2).transpose(1, 2)[0]  # patches x width, in the packed order
    count = x.shape[0]
    _, _, row, column, height, width = _raster(count, sizes, x.device)
    side = int(embeddings.num_patches_per_side)
    positions = _buckets(row, height, side) * side + _buckets(column, width, side)
    x = x + embeddings.position_embedding(positions)

    def same_slice(n: Any, grid: torch.Tensor) -> torch.Tensor:
        slice_of = _raster(n, grid, x.device)[0]
        return slice_of.unsqueeze(0) == slice_of.unsqueeze(1)

    mask = same_slice(count, sizes)
    merging = _window_merger(config)
    insert = int(tower.config.insert_layer_id) if merging else -1
    grid = sizes
    for index, layer in enumerate(tower.encoder.layers):
        x = _layer(layer, x, mask)
        if merging and index == insert:
            x = _vit_merger(tower.vit_merger, x, grid)
            grid = grid // 2
            mask = same_slice(x.shape[0], grid)
    rows: torch.Tensor = tower.post_layernorm(x)
    grid = sizes // 2 if merging else sizes  # get_image_features halves the sizes the merger reads
    kernel = (int(config.merge_kernel_size[0]), int(config.merge_kernel_size[1]))
    for mlp in inner.merger.mlp:
        rows = mlp(_blocks(rows, grid, kernel))
        grid = _shrunk(grid, kernel)
    return rows


class PackedImageFeatures(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model  # the model's own paths: the checkpoint's names

    def forward(self, pixel_values: torch.Tensor, target_sizes: torch.Tensor) -> torch.Tensor:
        return image_features(self.model, pixel_values, target_sizes)


def vision_spec(model: torch.nn.Module, config: Any) -> GraphSpec:
    """``vision_encoder.onnx``: the patches' number a multiple of the patches a row stands for (the
    model's own check: ``Patch grids ... must be divisible``), the slices' number dynamic."""
    layers = int(config.vision_config.num_hidden_layers)
    if _window_merger(config) and not 0 <= int(config.vision_config.insert_layer_id) < layers:
        raise InputError(
            f"{type(model).__name__}'s window merger is after layer {config.vision_config.insert_layer_id} "
            f"of {layers}: it never runs, and the merger then reads a quarter of each slice's patches"
        )
    image = image_example(config, "meta")
    patch = int(config.vision_config.patch_size)
    rows = torch.export.Dim(PATCHES, min=1, max=1 << 16)
    slices = torch.export.Dim(SLICES, min=1, max=1 << 10)
    return GraphSpec(
        PackedImageFeatures(model),
        tuple(image.values()),
        {"pixel_values": {3: patch * rows_per_patch_block(config) * rows}, "target_sizes": {0: slices}},
        list(image),
        ["image_features"],
    )


def minicpm_graphs(model: torch.nn.Module, config: Any) -> dict[str, GraphSpec]:
    """The three graphs of a ``MINICPM_TYPES`` model's package: vision_language.py's embeddings and
    decoder, this module's vision encoder."""
    return vl.image_text_to_text(model, config, vision=vision_spec(model, config))


MARKERS = ("image_start_id", "image_end_id", "slice_start_id", "slice_end_id", "newline_id")
"""MiniCPM-V 4.7's tokens around an image's crops, where its ``get_rope_index`` anchors the canvas."""


def image_block(config: Any, rows: list[int]) -> torch.Tensor:
    """The processor's placeholder of one image whose crops (the source, then its slices in one row) have
    ``rows`` feature rows each: ``<image>`` ... ``</image>`` around the source's image tokens, each slice's
    between ``<slice>`` and ``</slice>`` (MiniCPM-V 4.6's and MiniCPM-OCR's configs name no markers: their
    image tokens alone)."""
    token = vl.image_token_id(config)
    start, end, slice_start, slice_end = (getattr(config, k, None) for k in MARKERS[:4])
    if not all(isinstance(t, int) for t in (start, end, slice_start, slice_end)):
        return torch.full((1, sum(rows)), token)
    parts = [[start, *[token] * rows[0], end]]
    parts += [[slice_start, *[token] * n, slice_end] for n in rows[1:]]
    return torch.tensor([[t for part in parts for t in part]])


def prompt_plan(model: Any, text: torch.Tensor, image: dict[str, torch.Tensor]) -> dict[str, Any]:
    """A prompt of ``text``'s first 2 tokens, the ``image`` (``image_example``'s) and the rest: its
    ``ids``, what ``generate`` takes besides the image (``mm_token_type_ids`` where the model reads them),
    the prefill's ``positions`` and the steps' position ``offset`` (4.7's canvas M-RoPE; else 0, 1, 2...)."""
    config = model.config
    sizes = image["target_sizes"].to(torch.int64)
    rows = (sizes[:, 0] * sizes[:, 1] // rows_per_patch_block(config)).tolist()
    ids = torch.cat([text[:, :2], image_block(config, rows), text[:, 2:]], dim=1)
    if not vl.mrope(model):
        return {"ids": ids, "generate": {}, "positions": None, "offset": torch.tensor(0)}
    types = (ids == vl.image_token_id(config)).to(torch.int32)
    inner = getattr(model, "model", model)
    positions, delta = inner.get_rope_index(
        ids, mm_token_type_ids=types, target_sizes=image["target_sizes"], attention_mask=torch.ones_like(ids)
    )
    offset = delta.reshape(()).to(torch.int64)
    return {"ids": ids, "generate": {"mm_token_type_ids": types}, "positions": positions, "offset": offset}


def check_package(
    sessions: dict[str, Any], model: Any, config: Any, specs: dict[str, GraphSpec], check: Any
) -> list[Any]:
    """One packed image (a source of 4 x 8 patches, two slices of 4 x 4) and a prompt holding its rows
    after 2 text tokens: the image's rows against transformers' ``get_image_features``, then a greedy
    generation of 6 tokens over the three files against ``generate``: every step's logits, and the
    tokens. ``check``: package_check's module, passed in as it imports this one."""
    from fastonnx.diagnostics.verdicts import compare

    pc = check
    image = image_example(config, "cpu")
    names = specs[vl.VISION_FILE].input_names
    (features,) = pc._run(sessions[vl.VISION_FILE], names, [image[n] for n in names])
    with torch.no_grad():
        out = model.get_image_features(**image, return_dict=True)
    infos = [compare("vision_encoder: image_features", torch.cat(out.pooler_output), features)]
    _, vocab = vl.text_sizes(config)
    text = torch.randint(3, vocab, (1, 6), generator=torch.Generator().manual_seed(1))
    for name in ("image_token_id", "video_token_id", *MARKERS):
        if isinstance(other := getattr(config, name, None), int):
            text[text == other] = 3  # the image's tokens and markers only where the image goes
    plan = prompt_plan(model, text, image)
    ids = plan["ids"]
    generated = pc._generate(model, ids, {**image, **plan["generate"]})

    def positions(step: int, past: int, length: int) -> torch.Tensor:
        if step == 0 and plan["positions"] is not None:
            prefill: torch.Tensor = plan["positions"]
            return prefill
        return vl.step_positions(model, past, length, plan["offset"])

    steps = pc._greedy_over_files(
        sessions, (vl.EMBED_FILE, "image_features"), specs[vl.DECODER_FILE], config, ids, features, generated
    )
    greedy: list[Any] = steps(positions, lambda *_: {})
    return infos + greedy
