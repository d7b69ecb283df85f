"""``genai_config.json`` and ``processor_config.json`` of a vision-language package for onnxruntime-genai.

genai 0.18 runs a vision-language model of its own types (``qwen2_5_vl``, ``gemma3``) from three graphs:
the vision graph, the embedding graph (token embeddings with the image features merged) and the decoder
from ``inputs_embeds``: the three files image-text-to-text writes (vision_language.py), under the names
genai's config gives them. Its image processor is onnxruntime-extensions' pipeline of
``processor_config.json``, written here from the checkpoint's ``preprocessor_config.json`` (transformers'
image processor defaults where the file is silent). The contract, with its sources, is
docs/genai_vision_contract.md; its rules that shape the files:

- genai's parser refuses a key it does not know: only its keys are written;
- the image features are rank 2 (rows x hidden) in the vision output and the embedding input alike, so
  that a text-only prompt and every decode step (0 rows) fit the same graph;
- Qwen's grid reaches the vision graph under its literal name ``image_grid_thw``, int64; the image, video
  and vision-start token ids sit at the model level (genai's mrope positions read them);
- genai's Gemma 3 processor puts 256 tokens per image (a constant of its code) and passes the token
  types to no graph: the decoder takes ``input_ids`` (genai feeds them where the graph declares them)
  and makes the image blocks of the bidirectional mask from them;
- a Qwen vision graph taking one image a call (``image_grid_thw`` 1 x 3) makes genai loop over images;
- ``decoder.pipeline``, ``vision.pipeline`` and ``decoder.sliding_window`` are never written (another
  runtime path each).
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

from fastonnx.pretrained.genai_config import build_genai_config, unmet_contract
from fastonnx.pretrained.graph_spec import GraphSpec
from fastonnx.pretrained.vision_language import DECODER_FILE, EMBED_FILE, VISION_FILE, image_token_id

VISION_TYPES = ("qwen2_5_vl", "gemma3")
"""transformers model types whose packages genai runs under the same type name."""

PROCESSOR_FILE = "processor_config.json"


def _session(filename: str) -> dict[str, Any]:
    return {"session_options": {"log_id": "onnxruntime-genai", "provider_options": []}, "filename": filename}


def build_vision_genai_config(
    config: Any, generation: dict[str, Any], specs: dict[str, GraphSpec]
) -> dict[str, Any]:
    decoder_spec = specs[DECODER_FILE]
    built = build_genai_config(config, generation, decoder_spec, DECODER_FILE)
    model = built["model"]
    inputs = model["decoder"]["inputs"]
    if "input_ids" not in decoder_spec.input_names:
        del inputs["input_ids"]  # genai feeds input_ids to a decoder only where its graph declares them
    model["decoder"]["inputs"] = {"inputs_embeds": "inputs_embeds", **inputs}
    model["type"] = str(config.model_type)
    model["image_token_id"] = image_token_id(config)
    vision: dict[str, Any] = {**_session(VISION_FILE), "config_filename": PROCESSOR_FILE}
    if config.model_type == "qwen2_5_vl":
        for key in ("video_token_id", "vision_start_token_id"):
            model[key] = int(getattr(config, key))
        v = config.vision_config
        vision.update(
            spatial_merge_size=int(v.spatial_merge_size),
            tokens_per_second=float(getattr(v, "tokens_per_second", 2.0)),
            patch_size=int(v.patch_size),
            window_size=int(v.window_size),
        )
        vision["inputs"] = {"pixel_values": "pixel_values", "image_grid_thw": "image_grid_thw"}
    else:
        vision["inputs"] = {"pixel_values": "pixel_values"}
    vision["outputs"] = {"image_features": "image_features"}
    model["embedding"] = {
        **_session(EMBED_FILE),
        "inputs": {"input_ids": "input_ids", "image_features": "image_features"},
        "outputs": {"inputs_embeds": "inputs_embeds"},
    }
    model["vision"] = vision
    return built


def _qwen_processor(settings: dict[str, Any]) -> dict[str, Any]:
    """onnxruntime-extensions' Qwen2.5-VL pipeline: RGB decode, ``ConvertRGB`` then ``Normalize`` with
    ``qwen2_5_vl`` (a channel swap and its undoing), transformers' ``smart_resize`` between the minimum
    and maximum pixels, rescale, normalize and the patching into rows of 3 x 2 x 14 x 14."""
    size = settings.get("size") or {}
    low = int(settings.get("min_pixels") or size["shortest_edge"])
    high = int(settings.get("max_pixels") or size["longest_edge"])
    patch, merge = int(settings["patch_size"]), int(settings["merge_size"])
    side = patch * merge
    transforms = [
        ("decode_image", "DecodeImage", {"color_space": "RGB"}),
        ("convert_to_rgb", "ConvertRGB", {}),
        (
            "resize",
            "Resize",
            # width and height are the pipeline's fallback only: smart_resize sizes every image
            {"width": side, "height": side, "smart_resize": 1, "min_pixels": low, "max_pixels": high}
            | {"patch_size": patch, "merge_size": merge},
        ),
        ("rescale", "Rescale", {"rescale_factor": float(settings["rescale_factor"])}),
        (
            "normalize",
            "Normalize",
            {
                "mean": [float(x) for x in settings["image_mean"]],
                "std": [float(x) for x in settings["image_std"]],
                "qwen2_5_vl": 1,
            },
        ),
        (
            "patch_image",
            "PatchImage",
            {
                "patch_size": patch,
                "temporal_patch_size": int(settings["temporal_patch_size"]),
                "merge_size": merge,
            },
        ),
    ]
    return {
        "processor": {
            "name": "qwen2_5_image_processor",
            "transforms": [
                {"operation": {"name": n, "type": t, **({"attrs": a} if a else {})}} for n, t, a in transforms
            ],
        }
    }


def _gemma_processor(settings: dict[str, Any]) -> dict[str, Any]:
    """onnxruntime-extensions' Gemma 3 pipeline: RGB decode (no ``ConvertRGB``: it swaps the channels),
    a resize to the processor's square without keeping the aspect ratio (bilinear, transformers'
    resample), rescale, normalize, channels first."""
    size = settings["size"]
    resize = {"interpolation": "LINEAR", "width": int(size["width"]), "height": int(size["height"])}
    transforms = [
        ("decode_image", "DecodeImage", {"color_space": "RGB"}),
        ("resize", "Resize", {**resize, "keep_aspect_ratio": 0}),
        ("rescale", "Rescale", {"rescale_factor": float(settings["rescale_factor"])}),
        (
            "normalize",
            "Normalize",
            {
                "mean": [float(x) for x in settings["image_mean"]],
                "std": [float(x) for x in settings["image_std"]],
            },
        ),
        ("to_channel_first", "Permute3D", {"dims": [2, 0, 1]}),
    ]
    return {
        "processor": {
            "name": "gemma_3_image_processing",
            "transforms": [{"operation": {"name": n, "type": t, "attrs": a}} for n, t, a in transforms],
        }
    }


GENAI_GEMMA_IMAGE_TOKENS = 256
"""The tokens genai's Gemma 3 processor puts for an image, whatever the config says."""


def image_processor_settings(folder: pathlib.Path, config: Any) -> dict[str, Any]:
    """The checkpoint's image processor settings: transformers' defaults for the model's processor class,
    overridden by its ``preprocessor_config.json``."""
    import transformers

    path = folder / "preprocessor_config.json"
    saved = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    default = {"qwen2_5_vl": "Qwen2VLImageProcessor", "gemma3": "Gemma3ImageProcessor"}[config.model_type]
    name = saved.get("image_processor_type") or default
    defaults: dict[str, Any] = getattr(transformers, name)().to_dict()
    return {**defaults, **saved}


def write_vision_genai_config(
    folder: pathlib.Path,
    checkpoint: pathlib.Path,
    config: Any,
    generation: dict[str, Any],
    specs: dict[str, GraphSpec],
) -> pathlib.Path | str:
    """Writes ``genai_config.json`` and ``processor_config.json`` into ``folder``, or returns why genai
    cannot run the package and writes nothing."""
    if config.model_type not in VISION_TYPES:
        return (
            f"onnxruntime-genai runs no {config.model_type} vision-language model (its types: "
            f"{', '.join(VISION_TYPES)}); the package is the three-file layout"
        )
    unmet = unmet_contract(specs[DECODER_FILE])
    tokens = getattr(config, "mm_tokens_per_image", GENAI_GEMMA_IMAGE_TOKENS)
    if unmet is None and config.model_type == "gemma3" and tokens != GENAI_GEMMA_IMAGE_TOKENS:
        unmet = f"its Gemma 3 processor puts {GENAI_GEMMA_IMAGE_TOKENS} tokens per image, this model {tokens}"
    if unmet is not None:
        return f"onnxruntime-genai cannot run this package: {unmet}"
    settings = image_processor_settings(checkpoint, config)
    pipeline = _qwen_processor(settings) if config.model_type == "qwen2_5_vl" else _gemma_processor(settings)
    (folder / PROCESSOR_FILE).write_text(json.dumps(pipeline, indent=4) + "\n")
    path = folder / "genai_config.json"
    built = build_vision_genai_config(config, generation, specs)
    path.write_text(json.dumps(built, indent=4) + "\n")
    return path
