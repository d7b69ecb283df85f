"""image-text-to-text for the encoder-decoders over an image: BLIP, Pix2Struct, Florence-2, UDOP,
PP-FormulaNet and T5Gemma 2. Their images go through an encoder that the decoder cross-attends; no image
features are merged into a decoder prompt, so the three-file layout of decoder-only vision-language models
(vision_language.py: vision encoder, embeddings, decoder) does not fit them.

Decision: they take text2text's layout, as vision encoder-decoders (TrOCR, Donut) do, and transformers'
own ``generate`` is the reference (package_check.py runs a greedy generation over the three files):

- ``encoder_model.onnx``: what the class's encoder reads to ``last_hidden_state``, the states the
  decoder cross-attends: BLIP's and PP-FormulaNet's ``pixel_values`` (PP-FormulaNet's states are its
  vision model's ``pooler_output``); Pix2Struct's ``flattened_patches`` (row, column, then the patch's
  pixels; its processor makes them) and their ``attention_mask``; Florence-2's and T5Gemma 2's prompt
  (``input_ids`` with an image token a feature row, ``attention_mask``) and ``pixel_values``: the image's
  features merged into the prompt's embeddings, which its language model's encoder reads; UDOP's prompt,
  its words' ``bbox`` (x0, y0, x1, y1 in 0..1) and ``pixel_values``, to the states of the words and the
  image patches no word lies on, with the ``encoder_attention_mask`` it makes over them (a second output);
- ``decoder_model.onnx``: ``decoder_input_ids`` (the decoder's prompt: its start token; BLIP's bos and
  the text prompt), ``encoder_hidden_states``, ``encoder_attention_mask`` (ones for the states of an
  image; the prompt's or UDOP's mask otherwise) to ``logits`` and ``present.%d.decoder`` / ``.encoder``;
- ``decoder_with_past_model.onnx``: one token and the cache on.

package_export.py sends these classes here (``image_kind``), before task_inputs' ``graph_specs``
(which this module imports from: the other way round would be an import cycle); ``task="auto"``
takes them to image-text-to-text (tasks.py).

The encoder inputs' example values beyond pixels (flattened patches, boxes, prompts with image tokens)
come from the model's config, each kind's in ``ImageKind.example``. Kosmos-2.5 is not one of them: a
decoder-only language model whose prompt holds the image's features (``image_embeds_position_mask``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from unittest import mock

import torch

from fastonnx.capture.document_patches import gathered_document_patches
from fastonnx.errors import InputError
from fastonnx.pretrained.encoder_tasks import image_inputs
from fastonnx.pretrained.graph_spec import BATCH, SEQUENCE, GraphSpec
from fastonnx.pretrained.task_inputs import (
    DECODER_SEQUENCE,
    ENCODER_SEQUENCE,
    PAST_DECODER,
    cache_of,
    encoder_output,
    seq2seq_cache_names,
)

ENCODER_FILE, DECODER_FILE, WITH_PAST_FILE = (
    "encoder_model.onnx",
    "decoder_model.onnx",
    "decoder_with_past_model.onnx",
)
ENCODER_MASK = "encoder_attention_mask"
STEPS = 6  # the tokens package_check generates over the files


def _random_text(vocab: int, batch: int, length: int, avoid: set[int], seed: int = 0) -> torch.Tensor:
    """Token ids from 3 up (past the usual special tokens), none of ``avoid`` (image tokens...)."""
    ids = torch.randint(
        min(3, vocab - 1), vocab, (batch, length), generator=torch.Generator().manual_seed(seed)
    )
    for t in avoid:
        ids[ids == t] = 3
    return ids


class ImageKind:
    """How one class feeds its encoder and decoder: its encoder's inputs (example values from the
    config), the states and mask the decoder reads, its decoder's call and what ``generate`` takes."""

    inputs: tuple[str, ...] = ("pixel_values",)
    length_varies = False  # the states' length follows the inputs (a prompt, the patches), not fixed
    makes_mask = False  # the encoder makes the mask over its states (UDOP's): a second output

    def example(self, model: Any, batch: int, device: str | torch.device) -> dict[str, torch.Tensor]:
        return image_inputs(model.config, batch, device)

    def dims(self, b: Any, e: Any) -> dict[str, dict[int, Any]]:
        return {"pixel_values": {0: b}}

    def pad(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``inputs`` with the last row's last position padding, where the encoder takes a mask."""
        return inputs

    def encode(self, model: Any, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(the states the decoder cross-attends, their mask)."""
        states = self.states(model, inputs)
        return states, torch.ones(states.shape[:2], dtype=torch.int64, device=states.device)

    def states(self, model: Any, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        out: torch.Tensor = model.get_encoder()(**inputs).last_hidden_state
        return out

    def encoder_outputs(self, states: torch.Tensor, mask: torch.Tensor | None) -> Any:
        return encoder_output(states)

    def decode(
        self, model: Any, ids: torch.Tensor, states: torch.Tensor, mask: torch.Tensor | None, cache: Any
    ) -> Any:
        """The decoder's output (``logits``, ``past_key_values``) on ``ids`` after ``cache``."""
        return model(
            decoder_input_ids=ids,
            encoder_outputs=self.encoder_outputs(states, mask),
            attention_mask=mask,
            past_key_values=cache,
            use_cache=True,
        )

    def generate_inputs(self, model: Any, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """What ``generate`` takes for the encoder ``inputs``: the same, by the same names."""
        return inputs


class Blip(ImageKind):
    """BLIP: the vision model's states; a BERT text decoder cross-attending them, prompted with bos and
    the text (``generate`` takes the processor's ids, [CLS] text [SEP]: it makes the first bos and drops
    the last)."""

    def states(self, model: Any, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        out: torch.Tensor = model.vision_model(pixel_values=inputs["pixel_values"]).last_hidden_state
        return out

    def decode(
        self, model: Any, ids: torch.Tensor, states: torch.Tensor, mask: torch.Tensor | None, cache: Any
    ) -> Any:
        return model.text_decoder(
            input_ids=ids,
            encoder_hidden_states=states,
            encoder_attention_mask=mask,
            past_key_values=cache,
            use_cache=True,
        )

    def generate_inputs(self, model: Any, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        text = model.config.text_config
        batch = inputs["pixel_values"].shape[0]
        words = _random_text(int(text.vocab_size), batch, 2, {text.sep_token_id, text.bos_token_id}, seed=1)
        ends = [torch.full((batch, 1), int(t)) for t in (text.bos_token_id, text.sep_token_id)]
        return {**inputs, "input_ids": torch.cat([ends[0], words, ends[1]], dim=1)}


class PPFormulaNet(ImageKind):
    """PP-FormulaNet: the decoder cross-attends the vision model's ``pooler_output`` (its neck's)."""

    def states(self, model: Any, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        out: torch.Tensor = model.get_encoder()(pixel_values=inputs["pixel_values"]).pooler_output
        return out

    def encoder_outputs(self, states: torch.Tensor, mask: torch.Tensor | None) -> Any:
        from transformers.modeling_outputs import BaseModelOutputWithPooling

        return BaseModelOutputWithPooling(last_hidden_state=states, pooler_output=states)


class Pix2Struct(ImageKind):
    """Pix2Struct: ``flattened_patches`` (batch, patches, 2 + patch pixels: row and column from 1, 0 for
    padding) and their mask; the patches' number varies with the image's shape."""

    inputs = ("flattened_patches", "attention_mask")
    length_varies = True

    def example(self, model: Any, batch: int, device: str | torch.device) -> dict[str, torch.Tensor]:
        vision = model.config.vision_config
        columns, patches = 3, 6
        g = torch.Generator().manual_seed(0)
        pixels = torch.randn(batch, patches, int(vision.patch_embed_hidden_size), generator=g)
        where = torch.arange(patches)
        rows, cols = (where // columns + 1).float(), (where % columns + 1).float()
        place = torch.stack([rows, cols], dim=-1).expand(batch, patches, 2)
        flattened = torch.cat([place, pixels], dim=-1)
        mask = torch.ones(batch, patches)
        return {"flattened_patches": flattened.to(device), "attention_mask": mask.to(device)}

    def dims(self, b: Any, e: Any) -> dict[str, dict[int, Any]]:
        return {"flattened_patches": {0: b, 1: e}, "attention_mask": {0: b, 1: e}}

    def pad(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        flattened, mask = inputs["flattened_patches"].clone(), inputs["attention_mask"].clone()
        flattened[-1, -1], mask[-1, -1] = 0, 0  # the processor's padding: a zero row
        return {"flattened_patches": flattened, "attention_mask": mask}

    def encode(self, model: Any, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        return self.states(model, inputs), inputs["attention_mask"]


class Florence2(ImageKind):
    """Florence-2: the image's features take the places of the prompt's image tokens (one a feature
    row) in its embeddings, which the language model's encoder reads with the prompt's mask."""

    inputs = ("input_ids", "attention_mask", "pixel_values")
    length_varies = True

    def example(self, model: Any, batch: int, device: str | torch.device) -> dict[str, torch.Tensor]:
        config = model.config
        pixels = image_inputs(config, batch, device)["pixel_values"]
        rows = image_rows(model, pixels)
        token = int(config.image_token_id)
        text = _random_text(self.vocab(config), batch, 4, {token})
        ids = torch.cat([torch.full((batch, rows), token), text], dim=1)
        mask = torch.ones_like(ids)
        return {"input_ids": ids.to(device), "attention_mask": mask.to(device), "pixel_values": pixels}

    def vocab(self, config: Any) -> int:
        return int(config.text_config.vocab_size)

    def dims(self, b: Any, e: Any) -> dict[str, dict[int, Any]]:
        return {"input_ids": {0: b, 1: e}, "attention_mask": {0: b, 1: e}, "pixel_values": {0: b}}

    def pad(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        mask = inputs["attention_mask"].clone()
        mask[-1, -1] = 0  # the last text token: the image's come first
        return {**inputs, "attention_mask": mask}

    def states(self, model: Any, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        ids = inputs["input_ids"]
        embeds = model.get_input_embeddings()(ids)
        features = model.get_image_features(inputs["pixel_values"]).pooler_output.to(embeds.dtype)
        where = (ids == model.config.image_token_id).unsqueeze(-1).expand_as(embeds)
        embeds = embeds.masked_scatter(where, features)
        encoder = model.get_encoder()
        out: torch.Tensor = encoder(
            inputs_embeds=embeds, attention_mask=inputs["attention_mask"]
        ).last_hidden_state
        return out

    def encode(self, model: Any, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        return self.states(model, inputs), inputs["attention_mask"]


class T5Gemma2(Florence2):
    """T5Gemma 2: Florence-2's inputs and merge (its encoder's own merge checks the image tokens' count
    with an ``item()``), its text sizes in its encoder's config; its decoder attends to itself and the
    states in one (merged) attention, whose cross-attention keys and values the cache holds as others'."""

    def vocab(self, config: Any) -> int:
        return int(config.encoder.text_config.vocab_size)


def image_rows(model: Any, pixels: torch.Tensor) -> int:
    """How many feature rows one image of ``pixels``' size has (Florence-2's image tokens)."""
    with torch.no_grad():
        device = next(model.parameters()).device  # meta in an export, the checked model's after
        features = model.get_image_features(pixels[:1].to(device)).pooler_output
    return int(features.shape[1])


class Udop(ImageKind):
    """UDOP: the prompt's embeddings (each word's the image patch under its box added), its words'
    boxes and the patches no word lies on; the encoder returns the mask over them."""

    inputs = ("input_ids", "attention_mask", "bbox", "pixel_values")
    length_varies = True
    makes_mask = True

    def example(self, model: Any, batch: int, device: str | torch.device) -> dict[str, torch.Tensor]:
        config = model.config
        words = 5
        ids = _random_text(int(config.vocab_size), batch, words, set())
        g = torch.Generator().manual_seed(2)
        corners = torch.rand(batch, words, 2, 2, generator=g).sort(dim=2).values  # x0 <= x1, y0 <= y1
        bbox = corners.transpose(2, 3).reshape(batch, words, 4)  # x0, y0, x1, y1
        return {
            "input_ids": ids.to(device),
            "attention_mask": torch.ones(batch, words, dtype=torch.int64).to(device),
            "bbox": bbox.to(device),
            "pixel_values": image_inputs(config, batch, device)["pixel_values"],
        }

    def dims(self, b: Any, e: Any) -> dict[str, dict[int, Any]]:
        s = torch.export.Dim(SEQUENCE, min=2, max=1 << 20)
        text = {0: b, 1: s}
        return {"input_ids": text, "attention_mask": text, "bbox": text, "pixel_values": {0: b}}

    def pad(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        mask = inputs["attention_mask"].clone()
        mask[-1, -1] = 0
        return {**inputs, "attention_mask": mask}

    def encode(self, model: Any, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        out = model.get_encoder()(**inputs)
        return out.last_hidden_state, out.attention_mask

    def encoder_outputs(self, states: torch.Tensor, mask: torch.Tensor | None) -> Any:
        from transformers.models.udop.modeling_udop import BaseModelOutputWithAttentionMask

        return BaseModelOutputWithAttentionMask(last_hidden_state=states, attention_mask=mask)


KINDS: dict[str, ImageKind] = {
    "BlipForConditionalGeneration": Blip(),
    "Pix2StructForConditionalGeneration": Pix2Struct(),
    "Florence2ForConditionalGeneration": Florence2(),
    "UdopForConditionalGeneration": Udop(),
    "PPFormulaNetForConditionalGeneration": PPFormulaNet(),
    "T5Gemma2ForConditionalGeneration": T5Gemma2(),
}
"""The image-text-to-text classes exported as encoder-decoders over an image, by class name."""


def image_kind(model: Any) -> ImageKind | None:
    """The kind of an image-conditioned encoder-decoder (a class or a model), None for another class."""
    cls = model if isinstance(model, type) else type(model)
    return KINDS.get(cls.__name__)


class ImageStatesEncoder(torch.nn.Module):
    """The encoder file: the kind's inputs, by name, to the states (and UDOP's mask). A subclass a set of
    inputs, so that the forward names them (the dynamic shapes are given by name)."""

    def __init__(self, model: torch.nn.Module, kind: ImageKind) -> None:
        super().__init__()
        self.model, self.kind = model, kind

    def encode(self, **inputs: torch.Tensor) -> Any:
        states, mask = self.kind.encode(self.model, inputs)
        return (states, mask) if self.kind.makes_mask else states


class PixelsEncoder(ImageStatesEncoder):
    def forward(self, pixel_values: torch.Tensor) -> Any:
        return self.encode(pixel_values=pixel_values)


class PatchesEncoder(ImageStatesEncoder):
    def forward(self, flattened_patches: torch.Tensor, attention_mask: torch.Tensor) -> Any:
        return self.encode(flattened_patches=flattened_patches, attention_mask=attention_mask)


class PromptImageEncoder(ImageStatesEncoder):
    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, pixel_values: torch.Tensor
    ) -> Any:
        return self.encode(input_ids=input_ids, attention_mask=attention_mask, pixel_values=pixel_values)


class DocumentEncoder(ImageStatesEncoder):
    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        bbox: torch.Tensor,
        pixel_values: torch.Tensor,
    ) -> Any:
        return self.encode(
            input_ids=input_ids, attention_mask=attention_mask, bbox=bbox, pixel_values=pixel_values
        )


ENCODERS: dict[tuple[str, ...], type[ImageStatesEncoder]] = {
    ("pixel_values",): PixelsEncoder,
    ("flattened_patches", "attention_mask"): PatchesEncoder,
    ("input_ids", "attention_mask", "pixel_values"): PromptImageEncoder,
    ("input_ids", "attention_mask", "bbox", "pixel_values"): DocumentEncoder,
}


def _flat(cache: Any) -> tuple[torch.Tensor, ...]:
    own, cross = cache.self_attention_cache.layers, cache.cross_attention_cache.layers
    return tuple(t for a, c in zip(own, cross, strict=True) for t in (a.keys, a.values, c.keys, c.values))


class ImageDecoderFirst(torch.nn.Module):
    """The decoder's first step: the prompt, no past; the cross-attention cache projected from the
    states. The empty caches are made from the inputs (a cache left to make its own adds a constant)."""

    def __init__(self, model: torch.nn.Module, kind: ImageKind, heads: int, size: int, layers: int) -> None:
        super().__init__()
        self.model, self.kind, self.heads, self.size, self.layers = model, kind, heads, size, layers

    def forward(
        self,
        decoder_input_ids: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        encoder_attention_mask: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        from transformers import EncoderDecoderCache

        from fastonnx.pretrained.task_inputs import empty_layers

        empty = encoder_hidden_states.new_zeros((decoder_input_ids.shape[0], self.heads, 0, self.size))
        cache = EncoderDecoderCache(empty_layers(self.layers, empty), empty_layers(self.layers, empty))
        out = self.kind.decode(
            self.model, decoder_input_ids, encoder_hidden_states, encoder_attention_mask, cache
        )
        return (out.logits, *_flat(out.past_key_values))


class ImageDecoderWithPast(torch.nn.Module):
    """A later step: the cache (self-attention past, the first step's cross-attention keys and values)."""

    def __init__(self, model: torch.nn.Module, kind: ImageKind) -> None:
        super().__init__()
        self.model, self.kind = model, kind

    def forward(
        self,
        decoder_input_ids: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        encoder_attention_mask: torch.Tensor,
        past_key_values: list[torch.Tensor],
    ) -> tuple[torch.Tensor, ...]:
        from transformers import EncoderDecoderCache

        own = [t for i, t in enumerate(past_key_values) if i % 4 < 2]
        cross = [t for i, t in enumerate(past_key_values) if i % 4 >= 2]
        cache = EncoderDecoderCache(cache_of(own), cache_of(cross))
        out = self.kind.decode(
            self.model, decoder_input_ids, encoder_hidden_states, encoder_attention_mask, cache
        )
        return (out.logits, *_flat(out.past_key_values))


@contextlib.contextmanager
def _probing() -> Iterator[None]:
    """A run on the meta device, for shapes: transformers' masks skip themselves where a mask is all
    ones, which a meta tensor cannot say: they are built whole instead (same shapes); UDOP's merge of
    words and patches is the capture's (a data-dependent size has no meta shape)."""
    from transformers import masking_utils

    skips = ("_ignore_bidirectional_mask_sdpa", "_ignore_causal_mask_sdpa")
    with contextlib.ExitStack() as stack:
        stack.enter_context(gathered_document_patches())  # UDOP's merge, as the capture runs it
        for name in skips:
            if hasattr(masking_utils, name):
                stack.enter_context(mock.patch.object(masking_utils, name, lambda *a, **k: False))
        with torch.no_grad():
            yield


def cache_shape(
    model: Any, kind: ImageKind, states: torch.Tensor, mask: torch.Tensor
) -> tuple[int, int, int]:
    """(layers, heads, head size) of the decoder's cache, read off one step on the meta device (the
    decoder's own config names them in as many ways as there are kinds)."""
    ids = torch.zeros(states.shape[0], 1, dtype=torch.int64, device=states.device)
    with _probing():
        cache = kind.decode(model, ids, states, mask, None).past_key_values
    shapes = {tuple(t.shape[1:4:2]) for t in _flat(cache)}
    if len(shapes) != 1:
        raise InputError(
            f"{type(model).__name__}'s decoder layers differ in heads or head size: {sorted(shapes)}"
        )
    ((heads, size),) = shapes
    return len(cache.self_attention_cache.layers), int(heads), int(size)


def image_encoder_decoder(model: torch.nn.Module) -> dict[str, GraphSpec]:
    """The three files of an encoder-decoder over an image (the module docstring)."""
    kind = image_kind(model)
    if kind is None:
        raise InputError(f"{type(model).__name__} is not an image-conditioned encoder-decoder fastonnx knows")
    batch, target, past = 2, 3, 4
    inputs = kind.example(model, batch, "meta")
    with _probing():
        states, mask = kind.encode(model, inputs)
    source = int(states.shape[1])
    layers, heads, size = cache_shape(model, kind, states, mask)
    b = torch.export.Dim(BATCH, min=1, max=1024)
    e: Any = torch.export.Dim(ENCODER_SEQUENCE, min=2, max=1 << 20) if kind.length_varies else None
    d = torch.export.Dim(DECODER_SEQUENCE, min=1, max=1 << 20)
    p = torch.export.Dim(PAST_DECODER, min=1, max=1 << 20)
    encoder = GraphSpec(
        ENCODERS[kind.inputs](model, kind),
        tuple(inputs[n] for n in kind.inputs),
        kind.dims(b, e),
        list(kind.inputs),
        ["last_hidden_state", *([ENCODER_MASK] if kind.makes_mask else [])],
    )
    along = {0: b, 1: e} if e is not None else {0: b}
    step_inputs = ["decoder_input_ids", "encoder_hidden_states", ENCODER_MASK]
    step_shapes: dict[str, Any] = {
        "decoder_input_ids": {0: b, 1: d},
        "encoder_hidden_states": along,
        "encoder_attention_mask": along,
    }
    vocab = 3  # the ids' values do not shape the graph
    ids = torch.randint(0, vocab, (batch, target)).to("meta")
    first = GraphSpec(
        ImageDecoderFirst(model, kind, heads, size, layers),
        (ids, states, mask),
        step_shapes,
        step_inputs,
        ["logits", *seq2seq_cache_names(layers, "present")],
    )
    cache = [
        torch.randn(batch, heads, past if i % 4 < 2 else source, size).to("meta") for i in range(4 * layers)
    ]
    own, cross = {0: b, 2: p}, ({0: b, 2: e} if e is not None else {0: b})
    with_past = GraphSpec(
        ImageDecoderWithPast(model, kind),
        (ids, states, mask, cache),
        {**step_shapes, "past_key_values": [own if i % 4 < 2 else cross for i in range(4 * layers)]},
        [*step_inputs, *seq2seq_cache_names(layers, "past_key_values")],
        ["logits", *seq2seq_cache_names(layers, "present")],
    )
    return {ENCODER_FILE: encoder, DECODER_FILE: first, WITH_PAST_FILE: with_past}


def check_package(sessions: dict[str, Any], model: Any, run: Any) -> list[Any]:
    """The package against transformers: the encoder's states on a batch of 2 (the last row's last
    position padding where the encoder takes a mask), then a greedy generation of 6 tokens over the
    decoder files against ``generate`` on the same inputs: every step's logits, and the tokens.
    ``run(session, names, tensors)`` runs a file (package_check's)."""
    from transformers import GenerationConfig

    from fastonnx.diagnostics.verdicts import compare

    kind = image_kind(model)
    assert kind is not None
    inputs = kind.pad(kind.example(model, 2, "cpu"))
    got = run(sessions[ENCODER_FILE], list(kind.inputs), [inputs[n] for n in kind.inputs])
    with torch.no_grad():
        states, mask = kind.encode(model, inputs)
    infos = [compare("encoder: last_hidden_state", states, got[0])]
    if kind.makes_mask:
        infos.append(compare(f"encoder: {ENCODER_MASK}", mask, got[1]))
    # 6 tokens whatever the random weights prefer: generate masks the stop tokens until then
    settings = GenerationConfig(  # type: ignore[no-untyped-call]
        do_sample=False,
        max_new_tokens=STEPS,
        min_new_tokens=STEPS,
        pad_token_id=0,
        output_logits=True,
        output_scores=True,
        return_dict_in_generate=True,
    )
    with torch.no_grad():
        generated = model.generate(**kind.generate_inputs(model, inputs), generation_config=settings)
    want = generated.sequences[:, generated.sequences.shape[1] - STEPS :]
    prompt = generated.sequences[:, :-STEPS]  # the decoder's, as generate made it (BLIP's bos and text)
    states_got, mask_got = got[0], (got[1] if kind.makes_mask else mask)
    feeds, cache, tokens = [prompt, states_got, mask_got], list[torch.Tensor](), list[torch.Tensor]()
    names = ["decoder_input_ids", "encoder_hidden_states", ENCODER_MASK]
    for step in range(STEPS):
        filename = DECODER_FILE if step == 0 else WITH_PAST_FILE
        past = seq2seq_cache_names(len(cache) // 4, "past_key_values")
        logits, *cache = run(sessions[filename], names + past, feeds + cache)
        infos.append(compare(f"step {step}: logits", generated.logits[step], logits[:, -1]))
        # the files' greedy choice under the tokens generate's processors ruled out (stop tokens before
        # the minimum length, the forced eos at the last step)
        barred = generated.scores[step] == float("-inf")
        tokens.append(logits[:, -1].masked_fill(barred, float("-inf")).argmax(-1))
        feeds = [tokens[-1][:, None], states_got, mask_got]
    infos.append(compare("generated tokens", want, torch.stack(tokens, dim=1)))
    return infos
