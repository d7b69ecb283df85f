"""Inputs beside the text or the image that a base model's forward cannot run without, or draws at random
where not given, made graph inputs of the encoder tasks (encoder_tasks.py):

- BROS's and UDOP's ``bbox``: each token's box, four normalised corner coordinates (x0, y0, x1, y1), dims
  ``batch_size`` x ``sequence_length`` like the ids' (UDOP's words beside its page's ``pixel_values``);
- LXMERT's ``visual_feats`` and ``visual_pos``: its image's regions (their detector features and boxes),
  ``batch_size`` x ``num_regions`` (36 in the checkpoints, any count in the model);
- Kosmos-2's ``image_embeds_position_mask``: 1 at the prompt's ``latent_query_num`` image positions (after
  its first token, as its processor writes ``<image>`` and the image's tokens there), where its forward puts
  the image's rows; its dims the ids', the prompt longer by those positions;
- IDEFICS' images a prompt: ``pixel_values`` ``batch_size`` x 1 image x channels x height x width and
  ``image_attention_mask``, ``batch_size`` x ``sequence_length`` x 1 (1 where a token attends to the image,
  every token here: its cross-attention layers read it on every forward);
- ViTMAE's ``noise``: the per-patch values whose argsort picks the patches it keeps (``mask_ratio`` of
  them masked). transformers draws them with ``torch.rand`` on every call where none is given, so a graph
  without them would be a different function on every run and match transformers on none; with them the
  graph is transformers' function of the pixels and the noise (uniform noise: its random masking; noise
  increasing along the patches: the first patches kept, in order). Not ``mask_ratio`` 0 instead: the patches
  would still be shuffled by the noise;
- OneFormer's ``task_inputs``: the task prompt its processor tokenizes ("the task is semantic", padded to
  the config's ``task_seq_len``), ``batch_size`` x ``task_seq_len`` int64 ids, which its task MLP reads as
  ``task_seq_len`` numbers (a length the weights fix).
"""

from __future__ import annotations

from typing import Any

import torch

from fastonnx.pretrained.graph_spec import BATCH, SEQUENCE, takes

REGIONS = "num_regions"
REGION_COUNT = 3  # the example's regions (LXMERT's checkpoints see 36; 3 is no special size)

Dims = dict[str, dict[int, str]]


def _masks_patches(model: torch.nn.Module) -> bool:
    """Whether the model masks random patches in eval (ViTMAE's ``random_masking``; Hiera's only as MAE)."""
    return any(
        callable(getattr(m, "random_masking", None)) and getattr(m, "is_mae", True) for m in model.modules()
    )


def text_side_inputs(
    model: torch.nn.Module, config: Any, text: dict[str, torch.Tensor], device: str | torch.device
) -> tuple[dict[str, torch.Tensor], Dims]:
    """BROS's boxes or LXMERT's regions for the ``text`` ids, with their dims' names; none for others."""
    g = torch.Generator().manual_seed(1)
    batch, length = text["input_ids"].shape[:2]
    if takes(model, "bbox") and type(model).__name__.startswith(
        ("Bros", "Udop")
    ):  # UDOP's words beside its page
        # two corners a box, each coordinate sorted across them: (x0, y0), (x1, y1), x0 <= x1, y0 <= y1
        corners = torch.rand(batch, length, 2, 2, generator=g).sort(dim=2).values
        bbox = corners.reshape(batch, length, 4)
        return {"bbox": bbox.to(device)}, {"bbox": {0: BATCH, 1: SEQUENCE}}
    dim = getattr(config, "visual_feat_dim", None)
    if takes(model, "visual_feats") and isinstance(dim, int):
        feats = torch.randn(batch, REGION_COUNT, dim, generator=g)
        pos = torch.rand(batch, REGION_COUNT, int(getattr(config, "visual_pos_dim", 4)), generator=g)
        inputs = {"visual_feats": feats.to(device), "visual_pos": pos.to(device)}
        return inputs, {name: {0: BATCH, 1: REGIONS} for name in inputs}
    return {}, {}


def image_positions(
    model: torch.nn.Module, config: Any, text: dict[str, torch.Tensor], dims: Dims, device: str | torch.device
) -> tuple[dict[str, torch.Tensor], Dims]:
    """Kosmos-2's prompt with its image's positions after the first token, and their mask; ``text`` as it is
    for a model reading no such mask."""
    count = getattr(config, "latent_query_num", None)
    if not (takes(model, "image_embeds_position_mask") and isinstance(count, int)):
        return text, dims
    ids, mask = text["input_ids"], text["attention_mask"]
    rows = ids.shape[0]
    image = torch.randint(
        3, int(config.text_config.vocab_size), (rows, count), generator=torch.Generator().manual_seed(3)
    )
    positions = torch.zeros(rows, ids.shape[1] + count, dtype=torch.int64)
    positions[:, 1 : 1 + count] = 1
    out = {
        "input_ids": torch.cat([ids[:, :1], image.to(ids.device), ids[:, 1:]], dim=1),
        "attention_mask": torch.cat(
            [mask[:, :1], torch.ones_like(image).to(mask.device), mask[:, 1:]], dim=1
        ),
        "image_embeds_position_mask": positions.to(device),
    }
    return out, {**dims, "image_embeds_position_mask": dims["input_ids"]}


def query_prefix(model: torch.nn.Module) -> int:
    """The image tokens BLIP-2's retrieval prompts start with where its config names an image token (one
    a query, ``num_query_tokens``: its processor's), else 0."""
    config: Any = getattr(model, "config", None)
    if (
        type(model).__name__ != "Blip2ForImageTextRetrieval"
        or getattr(config, "image_token_index", None) is None
    ):
        return 0
    return int(config.num_query_tokens)


def query_token_prefix(
    model: torch.nn.Module, config: Any, text: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """BLIP-2's retrieval prompts as its processor makes them: ``query_prefix`` image tokens before each
    text, which the forward cuts off again; ``text`` as it is for any other model (its text would be empty
    after the cut). The graph's prompts are then at least 2 text tokens past that prefix
    (``encoder_tasks.dynamic_shapes``): torch.export specialises a text of 1."""
    count = query_prefix(model)
    if not count:
        return text
    ids, mask = text["input_ids"], text["attention_mask"]
    prefix = torch.full((ids.shape[0], count), int(config.image_token_index), dtype=ids.dtype)
    return {
        "input_ids": torch.cat([prefix.to(ids.device), ids], dim=1),
        "attention_mask": torch.cat([torch.ones_like(prefix).to(mask.device), mask], dim=1),
    }


def attended_images(
    model: torch.nn.Module, inputs: dict[str, torch.Tensor], dims: Dims, device: str | torch.device
) -> tuple[dict[str, torch.Tensor], Dims]:
    """IDEFICS' one image a prompt (``pixel_values`` given an images axis) and the mask of the tokens
    attending to it; ``inputs`` as they are for a model reading no such mask."""
    # FLAVA's forward names an image_attention_mask too: its patches' padding, optional
    if not (takes(model, "image_attention_mask") and type(model).__name__.startswith("Idefics")):
        return inputs, dims
    ids = inputs["input_ids"]
    mask = torch.ones(*ids.shape, 1, dtype=torch.int64)
    out = {**inputs, "pixel_values": inputs["pixel_values"][:, None], "image_attention_mask": mask.to(device)}
    return out, {**dims, "image_attention_mask": dims["input_ids"]}


PROMPT_IMAGES = ("prompt_pixel_values", "prompt_masks")
"""SegGPT's in-context prompt beside ``pixel_values``: an example image and its segmentation mask."""


def image_side_inputs(
    model: torch.nn.Module, config: Any, images: dict[str, torch.Tensor], device: str | torch.device
) -> tuple[dict[str, torch.Tensor], Dims]:
    """ViTMAE's ``noise`` for the ``images``' pixels, one value a patch, OneFormer's ``task_inputs`` or
    SegGPT's prompt image and mask (``PROMPT_IMAGES``, the images' shape); none for other models."""
    pixels = images["pixel_values"]
    task_length = getattr(config, "task_seq_len", None)
    if takes(model, "task_inputs") and isinstance(task_length, int):
        vocab = int(getattr(config, "text_encoder_vocab_size", None) or 49408)  # CLIP's tokenizer's
        ids = torch.randint(
            0, vocab, (pixels.shape[0], task_length), generator=torch.Generator().manual_seed(1)
        )
        return {"task_inputs": ids.to(device)}, {"task_inputs": {0: BATCH}}
    if takes(model, "prompt_pixel_values") and takes(model, "prompt_masks"):
        # SegGPT's in-context prompt: an image and its mask (an image too), stacked above the input image;
        # its config's image_size is the stack's, so each image is half its height
        image = pixels[:, :, : pixels.shape[2] // 2]
        g = torch.Generator().manual_seed(1)
        prompt = {name: torch.randn(image.shape, generator=g).to(device) for name in PROMPT_IMAGES}
        return {"pixel_values": image, **prompt}, {name: {0: BATCH} for name in PROMPT_IMAGES}
    if not (takes(model, "noise") and _masks_patches(model)):
        return {}, {}
    patch = config.patch_size
    rows, cols = (pixels.shape[-2] // patch, pixels.shape[-1] // patch) if isinstance(patch, int) else (0, 0)
    noise = torch.rand(pixels.shape[0], rows * cols, generator=torch.Generator().manual_seed(1))
    return {"noise": noise.to(device)}, {"noise": {0: BATCH}}


def codebook_rows(model: torch.nn.Module, config: Any) -> int:
    """Rows of ``input_ids`` a sequence takes: MusicGen's decoder (its base model too) reads one a codebook,
    ``(batch * num_codebooks, length)``, one embedding table each; others 1 (task_inputs.codebooks, which
    imports encoder_tasks, is the same test for the text-generation graph)."""
    text = getattr(config, "text_config", None) or config
    books = getattr(getattr(config, "decoder", None) or text, "num_codebooks", None)
    if not isinstance(books, int) or books <= 1:
        return 1  # before asking for the tables: some models (VITS) raise rather than name none
    get = getattr(model, "get_input_embeddings", None)
    tables = get() if callable(get) else None
    return books if isinstance(tables, torch.nn.ModuleList) and len(tables) == books else 1


def rows_of(dim: str, rows: int) -> str:
    """The name of a dim ``rows`` times ``dim`` (``encoder_tasks.dynamic_shapes`` derives it from ``dim``)."""
    return f"{rows}*{dim}"
