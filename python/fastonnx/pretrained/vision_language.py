"""image-text-to-text: a vision-language model's package in three files, the layout optimum and
transformers.js use, each graph captured from transformers' own model:

- ``vision_encoder.onnx``: ``pixel_values`` of one image (1 x channels x the config's image size; its
  size given as ``image_sizes`` where ``get_image_features`` takes them; vision_extras.py's inputs where it
  takes those: a second image, a Q-Former prompt) to ``image_features``, the image's
  features as rows, ``num_image_tokens`` x hidden. One image a call: transformers' ``get_image_features``
  makes a Python list of the images (LLaVA's ``list(image_features)``), which fixes their number in a
  capture; a prompt with several images runs it once for each and concatenates the rows in order.
  Qwen2-VL and Qwen2.5-VL take an image of any size as patches and its grid (``pixel_values`` patches x
  1176, ``image_grid_thw`` 1 x 3): their tower is grid_vision.py's, and the number of feature rows follows
  the grid (Qwen3-VL, Qwen3.5, GLM-4V, PaddleOCR-VL... too: ``GRID_TYPES``; Qwen3-VL's deepstack rows are
  a second output, ``deepstack_features``); Idefics2, Idefics3 and SmolVLM take one image's tiles and
  their pixel mask (``pixel_values`` tiles x 3 x height x width, ``pixel_attention_mask``), Granite
  Docling its tiles alone (and gives deepstack rows where it taps layers), LFM2-VL one tile's patches and
  ``spatial_shapes``: tile_towers.py; DeepSeek-OCR 2, Unlimited-OCR and Step3p7 a global view and its
  crops (``pixel_values_local``, their number dynamic): local_patch_towers.py; Nemotron-H Omni packed
  images' patches and ``image_grid_hw`` (images x 2, their number dynamic): radio_towers.py;
- ``embed_tokens.onnx``: ``input_ids`` and ``image_features`` to ``inputs_embeds``: the token embeddings
  with the image features put at the image token's positions, in order, as transformers' merge does
  (``masked_scatter``). A step without an image passes ``image_features`` of 0 rows;
- ``decoder_model_merged.onnx``: ``inputs_embeds``, ``attention_mask``, ``position_ids`` and the cache,
  to ``logits`` and the grown cache, as text-generation's one graph for the prefill and every step. A
  model with multimodal rotary positions (Qwen-VL's mrope) takes them as 3 x batch x sequence: the
  temporal, row and column planes transformers' ``get_rope_index`` makes (``prompt_positions``).
  Qwen3-VL's decoder takes ``input_ids`` and ``deepstack_features`` too (``DeepstackStep``): the prefill's
  image rows, 0 rows on the steps.

A generation loop: the vision encoder once per prompt, then embed and decode for the prefill (the prompt
holding as many image tokens as the images have feature rows: the processor expands each image's
placeholder), then embed and decode one token a step (package_check.py runs it against ``generate``).
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

import torch

from fastonnx.errors import InputError
from fastonnx.pretrained.anyres_towers import (
    HookedDeepstackStep,
    anyres_feeds,
    anyres_inputs,
    anyres_spec,
    anyres_tower,
    expected_deepstack,
    granite_layers,
)
from fastonnx.pretrained.decoder_cache import (
    cache_dims,
    cache_names,
    check_cache_layers,
    config_layout,
    filled_cache,
    produced_layout,
    reference_windowed,
    returned_cache,
    text_config,
)
from fastonnx.pretrained.encoder_tasks import image_inputs
from fastonnx.pretrained.graph_spec import BATCH, PAST, SEQUENCE, TOTAL, GraphSpec, takes
from fastonnx.pretrained.grid_vision import (
    deepstack_layers,
    grid_encoder,
    grid_inputs,
    is_grid_tower,
    merge_size,
    patch_shape,
    vision_tower,
)
from fastonnx.pretrained.local_patch_towers import (
    EXAMPLE_GRID,
    local_feeds,
    local_inputs,
    local_names,
    local_patch_tower,
    local_spec,
)
from fastonnx.pretrained.multimodal_features import as_frames, is_video
from fastonnx.pretrained.pixel_layouts import own_pixels, pixel_dims, pixel_example
from fastonnx.pretrained.radio_towers import NAMES as RADIO_NAMES
from fastonnx.pretrained.radio_towers import radio_inputs, radio_spec, radio_tower
from fastonnx.pretrained.reference_windows import prefill_length_step
from fastonnx.pretrained.tile_towers import (
    tile_deepstack_layers,
    tile_feeds,
    tile_inputs,
    tile_spec,
    tile_tower,
)
from fastonnx.pretrained.vision_extras import (
    VIDEO_TOKENS,
    VISION_EXTRAS,
    VideoFrames,
    extra_vision_inputs,
    extras_spec,
    vision_extras,
)

VISION_FILE, EMBED_FILE, DECODER_FILE = (
    "vision_encoder.onnx",
    "embed_tokens.onnx",
    "decoder_model_merged.onnx",
)
IMAGE_TOKENS = "num_image_tokens"


def image_token_id(config: Any) -> int:
    """The id of the token each image's features replace (``image_token_id``, older ``image_token_index``)."""
    for key in ("image_token_id", "image_token_index", *(VIDEO_TOKENS if is_video(config) else ())):
        value = getattr(config, key, None)
        if isinstance(value, int):
            return value
    raise InputError(
        f"{type(config).__name__} names no image_token_id: where images go in a prompt is unknown"
    )


_PLAIN = (
    "self",
    "pixel_values",
    "image_sizes",
    "vision_feature_layer",
    "vision_feature_select_strategy",
    "interpolate_pos_encoding",
)
"""What ``get_image_features`` of a model taking plain images has: the pixels, their sizes, and which
of the vision tower's layers to read (the config's by default)."""


def _needed(get: Any) -> list[str]:
    """The arguments of ``get_image_features`` beyond plain images' (Qwen-VL's ``image_grid_thw``,
    Idefics3's ``pixel_attention_mask``): the images come as grids or tiles."""
    return [
        name
        for name, p in inspect.signature(get).parameters.items()
        if name not in _PLAIN
        and p.kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)
    ]


def plain_images(cls: type) -> bool:
    """Whether a vision-language class takes its images as ``pixel_values`` alone (and their sizes)."""
    get = getattr(cls, "get_image_features", None)
    return get is not None and not _needed(get)


def feature_model(model: torch.nn.Module) -> Any:
    """The module whose ``get_image_features`` makes the image's rows: the model's own, else its base
    model's (DeepSeek-VL's generation class has none; its ``model`` does), else None."""
    for owner in (model, getattr(model, "model", None)):
        if callable(getattr(owner, "get_image_features", None)):
            return owner
    return VideoFrames(model) if callable(getattr(model, "get_video_features", None)) else None


def vision_arguments(model: torch.nn.Module) -> list[str]:
    """What ``get_image_features`` takes besides ``pixel_values`` that the graph passes."""
    if is_grid_tower(model):
        return ["pixel_values", "image_grid_thw"]
    if tile_tower(model):
        return list(tile_inputs(model, 1, "meta"))
    if anyres_tower(model):
        return list(anyres_inputs(model, "meta"))
    if local_patch_tower(model):
        return local_names(model)
    if radio_tower(model):
        return list(RADIO_NAMES)
    get: Any = feature_model(model).get_image_features
    params = inspect.signature(get).parameters
    unsupported = [n for n in _needed(get) if n not in VISION_EXTRAS]
    if unsupported:
        raise InputError(
            f"{type(model).__name__}.get_image_features takes {', '.join(unsupported)}: its images are not "
            "pixel_values of one size (grids, tiles), which the three-file layout does not export yet"
        )
    return ["pixel_values", *vision_extras(get), *(["image_sizes"] if "image_sizes" in params else [])]


def _rows(features: Any) -> torch.Tensor:
    """Every image's features as rows: transformers returns a tensor per image (a list) or one batch."""
    if isinstance(features, (list, tuple)):
        return torch.cat([f.reshape(-1, f.shape[-1]) for f in features], dim=0)
    if isinstance(features, torch.Tensor):
        return features.reshape(-1, features.shape[-1])
    raise InputError(f"get_image_features returned {type(features).__name__}, not image features")


STATES_THEN_PROJECTOR = ("llama4",)
"""Model types whose ``get_image_features`` returns the tower's states (``last_hidden_state``, no
pooled rows) and whose forward then projects them with ``multi_modal_projector`` (Llama 4's)."""


STATES_ARE_FEATURES = ("fuyu",)
"""Model types whose ``get_image_features`` returns the rows as ``last_hidden_state`` alone, which their
forward merges (Fuyu's patch embeddings)."""


def image_features(model: torch.nn.Module, **inputs: Any) -> torch.Tensor:
    out = feature_model(model).get_image_features(**inputs)
    if granite_layers(model):  # Granite 4 Vision's image tokens embed as zeros (anyres_towers.py)
        return torch.zeros_like(expected_deepstack(model, out)[0])
    if getattr(model.config, "model_type", None) in STATES_ARE_FEATURES:
        return _rows(out.last_hidden_state)
    if getattr(model.config, "model_type", None) in STATES_THEN_PROJECTOR:
        inner: Any = getattr(model, "model", model)
        return _rows(inner.multi_modal_projector(_rows(out.last_hidden_state)))
    pooled = getattr(out, "pooler_output", None)
    return _rows(pooled if pooled is not None else out)


class VisionEncoder(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return image_features(self.model, pixel_values=pixel_values)


class VisionEncoderWithSizes(VisionEncoder):
    """A model whose images may be of any size (Pixtral under Mistral 3, LLaVA-NeXT) takes their sizes:
    here the one size of ``pixel_values``, a constant of the graph (as an input its values would decide
    the patching, data the capture cannot follow). Given as Python ints, not a tensor: Pixtral slices
    its patches by ``size[0] // patch_size``, which on a tensor is an ``item()`` the capture cannot see
    through (an unbacked size), on an int a constant."""

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        sizes = [(int(pixel_values.shape[-2]), int(pixel_values.shape[-1]))]
        return image_features(self.model, pixel_values=pixel_values, image_sizes=sizes)


PAD_PLACEHOLDER_TYPES = ("kimi_k25", "muse_glimmer", "muse_spark")
"""Model types whose forward embeds every image and video (Muse Spark's: and audio) placeholder token as
token 0 (``llm_input_ids[multimodal_mask] = 0``): a generation step that drew one embeds token 0's row,
not the placeholder's."""


def placeholders_as_pad(model: torch.nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """The ids the token embedding looks up: ``PAD_PLACEHOLDER_TYPES``' placeholders as 0."""
    config: Any = model.config
    if getattr(config, "model_type", None) not in PAD_PLACEHOLDER_TYPES:
        return input_ids
    for name in ("image_token_id", "video_token_id", "audio_token_id"):
        if isinstance(token := getattr(config, name, None), int):
            input_ids = torch.where(input_ids == token, 0, input_ids)
    return input_ids


class MergedEmbeddings(torch.nn.Module):
    """The token embeddings with the image features' rows put, in order, at the image token's positions:
    transformers' ``masked_scatter``, as a gather of the k-th row at the k-th image token (a zero row
    appended for the other tokens, so that 0 rows of features gather nothing)."""

    def __init__(self, model: torch.nn.Module, token: int) -> None:
        super().__init__()
        self.model, self.token = model, token  # the model's own paths: the checkpoint's names

    def forward(self, input_ids: torch.Tensor, image_features: torch.Tensor) -> torch.Tensor:
        looked_up = placeholders_as_pad(self.model, input_ids)
        embeds: torch.Tensor = self.model.get_input_embeddings()(looked_up)  # type: ignore[operator]
        return rows_placed(embeds, input_ids == self.token, image_features)


def deepstack_rows(model: torch.nn.Module, out: Any) -> torch.Tensor:
    """transformers' ``deepstack_features`` of one image as the vision encoder gives them: layers x rows x
    hidden (Granite 4 Vision's pairs of a layer and its rows: anyres_towers.py's)."""
    if granite_layers(model):
        return expected_deepstack(model, out)
    return torch.stack([_rows(f) for f in out.deepstack_features])


def rows_placed(embeds: torch.Tensor, marked: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """``embeds`` (batch x sequence x width) with ``features``' rows put, in order, where ``marked`` (batch
    x sequence, bool) is set: the k-th row at the k-th mark, a gather (a zero row appended, so that 0 rows
    of features gather nothing)."""
    flat = embeds.reshape(-1, embeds.shape[-1])
    marks = marked.reshape(-1)
    rows = torch.cat([features.to(flat.dtype), flat.new_zeros(1, flat.shape[-1])], dim=0)
    order = torch.cumsum(marks.to(torch.int64), dim=0) - 1
    # a mark past the features' rows keeps its own embedding: a generation step with no image that drew
    # the image token, which transformers embeds as any token (no pixel_values, no merge)
    placed = marks & (order < features.shape[0])
    picked = rows[torch.where(placed, order, features.shape[0])]
    return torch.where(placed.unsqueeze(-1), picked, flat).reshape(embeds.shape)


class EmbedsStep(torch.nn.Module):
    """One generation step from embeddings: logits and the grown cache."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past_key_values: Any,
    ) -> tuple[torch.Tensor, Any]:
        return self.step(self.model, inputs_embeds, attention_mask, position_ids, past_key_values)

    @staticmethod
    def step(
        module: Any,
        inputs_embeds: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past_key_values: Any,
        **extra: Any,
    ) -> tuple[torch.Tensor, Any]:
        """``module`` (the model, or its language model) run one step with the cache: logits and cache."""
        out = module(
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            use_cache=True,
            **extra,
        )
        return out.logits, returned_cache(out)


def _rows_at_tokens(ids: torch.Tensor, token: int, features: torch.Tensor, width: int) -> torch.Tensor:
    """``features``' rows at the ``token`` positions of ``ids``, in order, zeros elsewhere (and at a token
    past the rows): ``features`` k x rows x width to k x ids' shape x width."""
    is_token = (ids == token).reshape(-1)
    rows = torch.cat([features, features.new_zeros(features.shape[0], 1, width)], dim=1)
    order = torch.cumsum(is_token.to(torch.int64), dim=0) - 1
    placed = is_token & (order < features.shape[1])
    picked = rows[:, torch.where(placed, order, features.shape[1])]
    return picked.reshape(features.shape[0], *ids.shape, width)


class DeepstackStep(EmbedsStep):
    """``EmbedsStep`` of Qwen3-VL, whose decoder adds the tower's deepstack rows at the image tokens after
    each of its first layers (``deepstack_features``: layers x rows x hidden, 0 rows on the steps; where
    the image tokens are: ``input_ids``). transformers adds them with a boolean-mask assignment, whose size
    is data; here each layer's rows, scattered to the prompt's shape with zeros elsewhere, are added to all
    the hidden states: the same sums, and no change where there is no image. Granite Docling's decoder
    (``text_model``, its logits divided by ``logits_scaling``) adds them alike."""

    def __init__(self, model: torch.nn.Module, token: int) -> None:
        super().__init__(model)
        self.token = token

    def forward(  # type: ignore[override]
        self,
        inputs_embeds: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past_key_values: Any,
        input_ids: torch.Tensor,
        deepstack_features: torch.Tensor,
    ) -> tuple[torch.Tensor, Any]:
        model: Any = self.model
        lm = getattr(model.model, "language_model", None)
        lm = model.model.text_model if lm is None else lm  # Granite Docling's
        width = inputs_embeds.shape[-1]
        layers = _rows_at_tokens(input_ids, self.token, deepstack_features.to(inputs_embeds.dtype), width)
        lm._deepstack_process = lambda hidden, _mask, rows: hidden + rows  # the instance's, while it runs
        try:
            out = lm(
                inputs_embeds=inputs_embeds,
                attention_mask=attention_mask,
                position_ids=position_ids,
                past_key_values=past_key_values,
                visual_pos_masks=input_ids == self.token,
                deepstack_visual_embeds=list(layers.unbind(0)),
                use_cache=True,
            )
        finally:
            del lm._deepstack_process
        logits = model.lm_head(out.last_hidden_state)
        scaling = getattr(model.config.get_text_config(), "logits_scaling", None)  # Granite Docling divides
        return logits if scaling is None else logits / scaling, returned_cache(out)


IMAGE_BLOCK_TYPES = ("gemma3", "shieldgemma2")
"""Model types whose image tokens attend to each other both ways in the prefill, each image's block of
them at once (transformers builds that mask from ``token_type_ids``, 1 at the image tokens). ShieldGemma 2
is Gemma 3's model (Gemma3ForConditionalGeneration) under a type of its own."""


class EmbedsStepWithImageBlocks(EmbedsStep):
    """``EmbedsStep`` taking ``input_ids`` too, whose image tokens are the token types transformers' mask
    reads: onnxruntime-genai feeds a decoder the ids where its graph declares them, never token types."""

    def __init__(self, model: torch.nn.Module, token: int) -> None:
        super().__init__(model)
        self.token = token

    def forward(  # type: ignore[override]
        self,
        inputs_embeds: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past_key_values: Any,
        input_ids: torch.Tensor,
    ) -> tuple[torch.Tensor, Any]:
        types = (input_ids == self.token).to(torch.int64)
        return self.step(
            self.model, inputs_embeds, attention_mask, position_ids, past_key_values, token_type_ids=types
        )


PREFIX_TYPES = ("paligemma",)
"""Model types whose prompt (its image and text) is a prefix attending both ways, the generated tokens
after it causal: transformers reads that from ``token_type_ids`` (0 in the prefix, 1 after), which the
decoder then takes as an input: the prefix is the caller's to say. Their positions count from 1 (PaliGemma's
``prepare_inputs_for_generation`` adds one)."""


class EmbedsStepWithTokenTypes(EmbedsStep):
    """``EmbedsStep`` taking ``token_type_ids`` (``PREFIX_TYPES``): 0 for the prompt, 1 for each token
    generated after it. transformers applies the prefix only on a first step, which it tells from the
    cache in Python (a capture would fix the answer): here the prefix blocks are always in the mask (a step
    after the prompt has type 1, no block, so the mask is causal as transformers' is then), and the rest
    is its forward: the language model over the embeddings, the head and the soft cap where set."""

    def forward(  # type: ignore[override]
        self,
        inputs_embeds: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past_key_values: Any,
        token_type_ids: torch.Tensor,
    ) -> tuple[torch.Tensor, Any]:
        model: Any = self.model
        text = model.config.get_text_config()
        masks = sys.modules[type(model.model).__module__]
        blocks = torch.where(token_type_ids == 0, 0, -1)
        settings = {
            "config": text,
            "inputs_embeds": inputs_embeds,
            "attention_mask": attention_mask,
            "past_key_values": past_key_values,
            "position_ids": position_ids,
            "block_sequence_ids": blocks,
        }
        mask: Any = masks.create_causal_mask(**settings)
        if getattr(text, "sliding_window", None) is not None:
            sliding = masks.create_sliding_window_causal_mask(**settings)
            mask = {"full_attention": mask, "sliding_attention": sliding}
        out = model.model.language_model(
            inputs_embeds=inputs_embeds,
            attention_mask=mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            use_cache=True,
        )
        logits = model.lm_head(out.last_hidden_state)
        cap = getattr(text, "final_logit_softcapping", None)
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits, returned_cache(out)


def language_model_steps(model: torch.nn.Module) -> bool:
    """Whether the generation steps are the model's language model alone: BLIP-2's forward always reads
    ``pixel_values`` and takes no positions; its ``generate`` merges the query tokens' features once, then
    runs its causal language model (``language_model``) on the embeddings."""
    lm: Any = getattr(model, "language_model", None)
    return (
        not takes(model, "position_ids")
        and isinstance(lm, torch.nn.Module)
        and takes(lm, "inputs_embeds")
        and takes(lm, "position_ids")
        and callable(head := getattr(lm, "get_output_embeddings", None))
        and head() is not None  # a causal LM: its logits, not a base model's states
    )


class LanguageModelStep(EmbedsStep):
    """``EmbedsStep`` of the model's language model (``language_model_steps``); it keeps the whole model
    so that the weights keep the checkpoint's names."""

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past_key_values: Any,
    ) -> tuple[torch.Tensor, Any]:
        lm: Any = self.model.language_model
        return self.step(lm, inputs_embeds, attention_mask, position_ids, past_key_values)


def text_sizes(config: Any) -> tuple[int, int]:
    text = text_config(config)
    return int(text.hidden_size), int(text.vocab_size)


def mrope(model: torch.nn.Module) -> bool:
    """Whether the decoder's rotary positions are Qwen-VL's three planes (``get_rope_index``)."""
    return hasattr(getattr(model, "model", model), "get_rope_index")


SECTION_PLANES = ("hunyuan_vl",)
"""Model types whose ``get_rope_index`` gives a plane per ``mrope_section`` entry (HunYuan-VL's: the
sequence, width, height and image planes, or the last three alone)."""


def rope_planes(model: torch.nn.Module) -> int:
    """How many planes of positions an mrope decoder takes (``mrope``): Qwen-VL's 3 (temporal, row and
    column), or one per ``mrope_section`` entry (``SECTION_PLANES``)."""
    if getattr(model.config, "model_type", None) in SECTION_PLANES:
        return len(text_config(model.config).rope_parameters["mrope_section"])
    return 3


def image_prompt(config: Any, before: torch.Tensor, rows: int, after: torch.Tensor) -> torch.Tensor:
    """Token ids ``before``, an image of ``rows`` feature rows and ``after``: the image tokens between
    the model's vision start and end tokens where it has them (Qwen-VL's, where ``get_rope_index`` and
    genai find the image)."""
    start, end = (getattr(config, f"vision_{k}_token_id", None) for k in ("start", "end"))
    block = [torch.full((1, rows), image_token_id(config))]
    if isinstance(start, int) and isinstance(end, int):
        block = [torch.tensor([[start]]), *block, torch.tensor([[end]])]
    return torch.cat([before, *block, after], dim=1)


def verification_prompt(config: Any, rows: int) -> torch.Tensor:
    """The check's prompt (one row): 2 random tokens, an image of ``rows`` feature rows, 4 random tokens;
    no special token of any modality among the random ones, so the image's tokens are only where the
    image goes (Qwen-Omni's get_rope_index reads an audio token's audio). The half calibration
    (half_package.vision_language_feeds) runs the same prompt."""
    _, vocab = text_sizes(config)
    g = torch.Generator().manual_seed(1)
    text = torch.randint(min(3, vocab - 1), vocab, (1, 6), generator=g)
    special = {
        image_token_id(config),
        *(getattr(config, f"vision_{k}_token_id", None) for k in ("start", "end")),
    }
    kinds = ("video", "audio", "audio_start", "audio_end")
    special |= {getattr(config, f"{k}_token_{e}", None) for k in kinds for e in ("id", "index")}
    for t in special - {None}:
        text[text == t] = 3
    return image_prompt(config, text[:, :2], rows, text[:, 2:])


def step_extras(
    step: int, step_ids: torch.Tensor, rows: int, prompt: torch.Tensor, deepstack: Any
) -> dict[str, Any]:
    """A step's inputs beyond the embeddings, mask, positions and cache, by name (each file takes those it
    declares): its ids, the token types (image blocks in the prompt only), the prompt's length
    (reference_windows.py) and, with ``deepstack`` (the vision encoder's deepstack output), its first
    ``rows`` rows, which generate adds in the prefill only. The check's loop and the half calibration
    (half_package.vision_language_feeds) feed the same."""
    from fastonnx.pretrained.reference_windows import prefill_length_feed

    extras: dict[str, Any] = {
        "input_ids": step_ids,
        "token_type_ids": torch.full_like(step_ids, int(step > 0)),
    }
    extras.update(prefill_length_feed(prompt))
    if deepstack is not None:
        extras["deepstack_features"] = deepstack[:, :rows]
    return extras


def prompt_positions(
    model: torch.nn.Module, ids: torch.Tensor, images: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """The position ids of a prompt ``ids`` (one row) holding ``images``, the offset of the positions of
    the steps after it from their cache length, and what ``generate`` takes besides to place them (and
    their attention) alike: transformers' own ``get_rope_index`` for mrope (text tokens count on, an
    image's tokens take their row and column), else 0, 1, 2... (and the token types of image blocks)."""
    if not mrope(model):
        placed = {}
        kind = getattr(model.config, "model_type", None)
        if kind in IMAGE_BLOCK_TYPES:
            placed["token_type_ids"] = (ids == image_token_id(model.config)).to(torch.int64)
        start = 0
        if kind in PREFIX_TYPES:  # the whole prompt is the prefix; positions from 1
            placed["token_type_ids"], start = torch.zeros_like(ids), 1
        return torch.arange(start, start + ids.shape[1]).unsqueeze(0), torch.tensor(start), placed
    inner: Any = getattr(model, "model", model)
    types = {"mm_token_type_ids": (ids == image_token_id(model.config)).to(torch.int32)}
    if "mm_token_type_ids" not in inspect.signature(inner.get_rope_index).parameters:
        types = {}  # Qwen-Omni's thinkers find the image tokens by their id
    grid, mask = images.get("image_grid_thw"), torch.ones_like(ids)  # Qwen-Omni's reads the mask
    positions, delta = inner.get_rope_index(ids, image_grid_thw=grid, attention_mask=mask, **types)
    # as int64, the graph's: Qwen-Omni's thinkers compute them in float
    return positions.to(torch.int64), delta.reshape(()).to(torch.int64), types


def step_positions(model: torch.nn.Module, past: int, length: int, offset: torch.Tensor) -> torch.Tensor:
    """The position ids of ``length`` tokens after ``past`` cached ones."""
    positions = (torch.arange(past, past + length) + offset).unsqueeze(0)
    return positions.repeat(rope_planes(model), 1, 1) if mrope(model) else positions


def image_grid(model: torch.nn.Module) -> tuple[int, int, int]:
    """A grid (frames, rows, columns in patches) for the check of a grid tower: one frame, wider than
    tall, one attention window more than fits in its rows (so that the windows split it)."""
    visual: Any = vision_tower(model)
    merge = merge_size(model)
    window = getattr(visual.config, "window_size", None)
    across = int(window) // merge // int(visual.config.patch_size) if window else 2
    return 1, merge * (across + 1), merge * 3


def vision_inputs(
    model: torch.nn.Module, config: Any, images: int, device: str | torch.device
) -> dict[str, torch.Tensor]:
    """What transformers' forward takes for ``images`` images of the processor's size (the vision encoder
    graph reads ``pixel_values`` alone), or of ``image_grid``'s grid for a grid tower."""
    if is_grid_tower(model):
        t, h, w = image_grid(model)
        return {
            "pixel_values": torch.randn(images * t * h * w, *patch_shape(model), device=device),
            "image_grid_thw": torch.tensor([[t, h, w]] * images, device=device),
            **{k: v.to(device) for k, v in grid_inputs(model, images).items()},
        }
    if tile_tower(model):  # one image of 2 tiles
        return tile_inputs(model, 2, device)
    if anyres_tower(model):  # one wide image of several tiles
        return anyres_inputs(model, device)
    if local_patch_tower(model):  # a global view and 2 crops side by side
        return local_inputs(model, EXAMPLE_GRID, device)  # type: ignore[return-value]
    if radio_tower(model):  # packed patches of non-square grids (radio_towers.py)
        return radio_inputs(model, ((4, 6),) * images, device)
    if own_pixels(config):  # Fuyu's patch rows, Perception LM's tiles (one image)
        return {"pixel_values": pixel_example(config, device)}
    pixels = as_frames(config, image_inputs(config, images, device)["pixel_values"])
    inputs = {"pixel_values": pixels, **extra_vision_inputs(config, vision_arguments(model), device)}
    if "image_sizes" in vision_arguments(model):
        inputs["image_sizes"] = torch.tensor([list(pixels.shape[-2:])] * images, device=device)
    return inputs


def vision_feeds(
    model: torch.nn.Module, images: dict[str, torch.Tensor], names: list[str]
) -> list[torch.Tensor]:
    """The vision encoder's inputs ``names`` for ``vision_inputs``' images (tiles without the batch)."""
    if anyres_tower(model):
        return anyres_feeds(images)
    if local_patch_tower(model):
        return local_feeds(model, images)
    return tile_feeds(model, images) if tile_tower(model) else [images[n] for n in names]


def image_text_to_text(
    model: torch.nn.Module, config: Any, vision: GraphSpec | None = None
) -> dict[str, GraphSpec]:
    """The three graphs of a vision-language model's package; ``vision``: the vision encoder's graph of a
    family whose images a module of its own takes (minicpm_vlms.py's packed slices)."""
    if feature_model(model) is None:
        raise InputError(f"{type(model).__name__} has no get_image_features: not a vision-language model")
    token = image_token_id(config)
    steps: Any = model.language_model if language_model_steps(model) else model
    if not takes(steps, "inputs_embeds") or not takes(steps, "position_ids"):
        raise InputError(f"{type(model).__name__}'s forward takes no inputs_embeds and position_ids")
    if vision is not None:
        vision_spec = vision
    elif is_grid_tower(model):
        grid = vision_inputs(model, config, 1, "meta")
        unit = merge_size(model) ** 2
        tokens = torch.export.Dim(IMAGE_TOKENS, min=1, max=1 << 20)
        vision_spec = GraphSpec(
            grid_encoder(model),
            (grid["pixel_values"], grid["image_grid_thw"]),
            {"pixel_values": {0: unit * tokens}, "image_grid_thw": {}},
            ["pixel_values", "image_grid_thw"],
            ["image_features", *(["deepstack_features"] if deepstack_layers(model) else [])],
        )
    elif tile_tower(model):
        vision_spec = tile_spec(model)
    elif anyres_tower(model):
        vision_spec = anyres_spec(model)
    elif local_patch_tower(model):
        vision_spec = local_spec(model)
    elif radio_tower(model):
        vision_spec = radio_spec(model)
    else:
        names = vision_arguments(model)
        pixels = as_frames(config, image_inputs(config, 1, "meta")["pixel_values"])  # the processor's size
        pixel_axes: dict[int, Any] = {}
        if own_pixels(config):
            pixels, pixel_axes = pixel_example(config, "meta"), pixel_dims(config)
        encoder = VisionEncoderWithSizes(model) if "image_sizes" in names else VisionEncoder(model)
        vision_spec = GraphSpec(
            encoder, (pixels,), {"pixel_values": pixel_axes}, ["pixel_values"], ["image_features"]
        )
        if extras := [n for n in names if n in VISION_EXTRAS]:
            vision_spec = extras_spec(model, config, pixels, extras, image_features)

    hidden, vocab = text_sizes(config)
    b = torch.export.Dim(BATCH, min=1, max=1024)
    s = torch.export.Dim(SEQUENCE, min=1, max=1 << 20)
    rows = torch.export.Dim(IMAGE_TOKENS, min=0, max=1 << 20)
    ids = torch.randint(0, vocab, (2, 5), device="meta")
    embed_spec = GraphSpec(
        MergedEmbeddings(model, token),
        (ids, torch.zeros(3, hidden, device="meta")),
        {"input_ids": {0: b, 1: s}, "image_features": {0: rows}},
        ["input_ids", "image_features"],
        ["inputs_embeds"],
    )
    return {
        VISION_FILE: vision_spec,
        EMBED_FILE: embed_spec,
        DECODER_FILE: embeds_decoder(model, config, token),
    }


def embeds_decoder(model: torch.nn.Module, config: Any, token: int) -> GraphSpec:
    """``decoder_model_merged.onnx``: one step from ``inputs_embeds`` (the merged embeddings of
    ``embed_tokens.onnx``) and the cache to the logits and the grown cache; ``token`` is the id of the
    tokens the features replace (image blocks read it). Shared with audio_language.py."""
    hidden, vocab = text_sizes(config)
    b = torch.export.Dim(BATCH, min=1, max=1024)
    s = torch.export.Dim(SEQUENCE, min=1, max=1 << 20)
    ids = torch.randint(0, vocab, (2, 3), device="meta")
    check_cache_layers(model, config, reads_prefill_length=True)  # reference windows: the last branch
    layout = produced_layout(model, config, True)
    if layout == []:
        raise InputError(f"{type(model).__name__} returns no cache: a multimodal decoder without one")
    layout = layout or config_layout(text_config(config))
    cache = filled_cache(layout, 2, 4, "meta", torch.Generator().manual_seed(0))  # 4 past positions
    mask = torch.ones(2, 4 + 3, dtype=torch.int64, device="meta")
    positions = torch.arange(4, 4 + 3, device="meta").repeat(2, 1)
    planes = mrope(model)
    if planes:  # temporal, row and column positions
        positions = positions.repeat(rope_planes(model), 1, 1)
    embeds = torch.zeros(2, 3, hidden, device="meta")
    p = torch.export.Dim(PAST, min=0, max=1 << 20)
    dims: dict[str, Any] = {
        "inputs_embeds": {0: b, 1: s},
        "attention_mask": {0: b, 1: TOTAL},
        "position_ids": {1: b, 2: s} if planes else {0: b, 1: s},
        "past_key_values": cache_dims(layout, b, p),
    }
    names = ["inputs_embeds", "attention_mask", "position_ids", *cache_names(layout, "past_key_values")]
    step: torch.nn.Module = LanguageModelStep(model) if language_model_steps(model) else EmbedsStep(model)
    args: tuple[Any, ...] = (embeds, mask, positions, cache)
    if config.model_type in IMAGE_BLOCK_TYPES:
        step, args = EmbedsStepWithImageBlocks(model, token), (*args, ids)
        dims["input_ids"] = {0: b, 1: s}
        names.append("input_ids")
    elif layers := deepstack_layers(model) or tile_deepstack_layers(model) or len(granite_layers(model)):
        rows = torch.export.Dim(IMAGE_TOKENS, min=0, max=1 << 20)
        deepstack = torch.zeros(layers, 3, hidden, device="meta")
        hooked = HookedDeepstackStep(model, token) if granite_layers(model) else None
        step, args = hooked or DeepstackStep(model, token), (*args, ids, deepstack)
        dims.update(input_ids={0: b, 1: s}, deepstack_features={1: rows})
        names += ["input_ids", "deepstack_features"]
    elif config.model_type in PREFIX_TYPES:
        step, args = EmbedsStepWithTokenTypes(model), (*args, torch.zeros_like(ids))
        dims["token_type_ids"] = {0: b, 1: s}
        names.append("token_type_ids")
    elif reference_windowed(config):
        step, args = prefill_length_step(model, args, dims, names)
    return GraphSpec(step, args, dims, names, ["logits", *cache_names(layout, "present")], layout)
