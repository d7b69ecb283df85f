"""Qwen2.5-VL and Gemma 3 through onnxruntime-genai (issue 42, part 1): ``export_pretrained`` of a tiny folder
(a byte-level tokenizer with the model's special tokens, transformers' image processor config) writes the
three graphs, ``genai_config.json`` (type ``qwen2_5_vl`` / ``gemma3``) and ``processor_config.json``;
genai's own processor and greedy search over them, on a PNG and a prompt, give the tokens of transformers'
``generate`` on the inputs genai's processor made, every step's logits within 1e-4; and genai's pixels are
transformers' image processor's.

genai runs in a subprocess: a crash in its native code fails the test instead of ending the run."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
import torch
from checkpoint_folders import save_byte_tokenizer

import fastonnx

QWEN_SPECIALS = ["<|im_end|>", "<|endoftext|>", "<|im_start|>", "<|vision_start|>", "<|vision_end|>"]
QWEN_SPECIALS += ["<|image_pad|>", "<|video_pad|>"]
IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"
MAX_LENGTH = 16  # new tokens beyond the prompt

GENAI_GREEDY = """
import json, sys
import numpy as np
import onnxruntime_genai as og

package, images, prompt, new, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5]
model = og.Model(package)
processor = model.create_multimodal_processor()
inputs = processor(prompt, images=og.Images.open(*images) if images else None)
np.savez(out, **{k: np.asarray(inputs[k].as_numpy()) for k in inputs.keys()})
max_length = inputs["input_ids"].as_numpy().shape[-1] + new
params = og.GeneratorParams(model)
params.set_search_options(do_sample=False, max_length=max_length)
generator = og.Generator(model, params)
generator.set_inputs(inputs)  # the vision graph once an image, the embedding and the decoder's prefill


def logits():
    return np.asarray(generator.get_logits(), dtype=np.float32).reshape(-1).tolist()


# get_logits holds the logits the next token is chosen from: the prompt's after set_inputs, then those
# of each appended token
steps = [logits()]
while not generator.is_done() and len(generator.get_sequence(0)) < max_length:
    generator.generate_next_token()
    steps.append(logits())
print(json.dumps({"sequence": [int(t) for t in generator.get_sequence(0)], "logits": steps}))
"""


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, pathlib.Path, dict[str, int]]:
    import transformers

    tmp = tmp_path_factory.mktemp("qwen_vl_genai")
    folder, package = tmp / "checkpoint", tmp / "package"
    folder.mkdir()
    ids = save_byte_tokenizer(folder, QWEN_SPECIALS, "Qwen2Tokenizer", eos="<|im_end|>", pad="<|endoftext|>")
    tokens = {"eos_token_id": ids["<|im_end|>"], "pad_token_id": ids["<|endoftext|>"]}
    config = transformers.Qwen2_5_VLConfig(
        text_config={
            "vocab_size": 272,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 512,
            # Qwen2.5-VL's [16, 24, 24] of 64 rotary frequencies, for head_dim 16's 8
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
            "tie_word_embeddings": False,
            **tokens,
        },
        vision_config={
            "depth": 2,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "out_hidden_size": 64,
            "window_size": 56,  # windows of 2 x 2 merged tokens: a 56 x 84 image spans two
            "fullatt_block_indexes": [1],
        },
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        **tokens,
    )
    torch.manual_seed(0)
    model = transformers.Qwen2_5_VLForConditionalGeneration(config).eval()
    with torch.no_grad():  # matrices at std 0.2: at the initial 0.02 greedy decoding repeats one token
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.2)
    model.save_pretrained(folder)
    # 28 x 28 pixels (one merged token) up to 64 of them: the test's images need no resizing
    transformers.Qwen2VLImageProcessor(size={"shortest_edge": 784, "longest_edge": 784 * 64}).save_pretrained(
        folder
    )
    written = fastonnx.export_pretrained(folder, package, progress=False)
    assert (written.task, written.architecture) == (
        "image-text-to-text",
        "Qwen2_5_VLForConditionalGeneration",
    )
    assert written.verified is True, written.verify_note
    return folder, package, ids


def _png(path: pathlib.Path, height: int, width: int, seed: int) -> pathlib.Path:
    from PIL import Image

    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(path)
    return path


def _genai(
    package: pathlib.Path, images: list[pathlib.Path], prompt: str, tmp: pathlib.Path
) -> dict[str, Any]:
    script, processed = tmp / "genai_greedy.py", tmp / "processed.npz"
    script.write_text(GENAI_GREEDY)
    names = json.dumps([str(p) for p in images])
    run = subprocess.run(
        [sys.executable, str(script), str(package), names, prompt, str(MAX_LENGTH), str(processed)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, f"onnxruntime-genai exited with {run.returncode}: {run.stderr[-3000:]}"
    result: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
    with np.load(processed) as arrays:
        result["inputs"] = {k: torch.from_numpy(arrays[k]) for k in arrays.files}
    return result


def test_genai_config_is_qwen_vl(qwen: tuple[pathlib.Path, pathlib.Path, dict[str, int]]) -> None:
    _, package, ids = qwen
    model = json.loads((package / "genai_config.json").read_text())["model"]
    assert model["type"] == "qwen2_5_vl"
    assert (model["image_token_id"], model["vision_start_token_id"]) == (
        ids["<|image_pad|>"],
        ids["<|vision_start|>"],
    )
    assert model["vision"]["inputs"] == {"pixel_values": "pixel_values", "image_grid_thw": "image_grid_thw"}
    assert "input_ids" not in model["decoder"]["inputs"]
    steps = json.loads((package / "processor_config.json").read_text())["processor"]["transforms"]
    assert [s["operation"]["type"] for s in steps] == [
        "DecodeImage",
        "ConvertRGB",
        "Resize",
        "Rescale",
        "Normalize",
        "PatchImage",
    ]


CASES = {
    "28x28": [(28, 28)],
    "56x84": [(56, 84)],  # 2 x 3 merged tokens: two attention windows
    "two images": [(56, 84), (28, 56)],
    "text only": [],
}


@pytest.mark.parametrize("sizes", list(CASES.values()), ids=list(CASES))
def test_qwen_generates_as_transformers(
    qwen: tuple[pathlib.Path, pathlib.Path, dict[str, int]],
    tmp_path: pathlib.Path,
    sizes: list[tuple[int, int]],
) -> None:
    import transformers
    from PIL import Image

    folder, package, ids = qwen
    images = [_png(tmp_path / f"image{i}.png", h, w, seed=i) for i, (h, w) in enumerate(sizes)]
    prompt = (
        f"<|im_start|>user\n{IMAGE * len(images)}What is in the picture?<|im_end|>\n<|im_start|>assistant\n"
    )
    result = _genai(package, images, prompt, tmp_path)
    inputs = result["inputs"]
    prompt_ids = inputs["input_ids"].to(torch.int64)
    assert int((prompt_ids == ids["<|vision_start|>"]).sum()) == len(images)

    model = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(
        folder, dtype=torch.float32
    ).eval()
    feeds: dict[str, torch.Tensor] = {}
    if images:
        # genai's processor made the pixels transformers' image processor makes (no resizing at these sizes)
        processor = transformers.AutoImageProcessor.from_pretrained(folder)
        want = processor(images=[Image.open(p) for p in images], return_tensors="pt")
        torch.testing.assert_close(inputs["image_grid_thw"], want["image_grid_thw"])
        pixels = inputs["pixel_values"]
        patches = want["image_grid_thw"].prod(-1).tolist()
        if len(images) > 1:  # onnxruntime-extensions pads each image's patches to the largest's
            pixels = torch.cat(
                [rows[:n] for rows, n in zip(pixels.reshape(len(images), -1, pixels.shape[-1]), patches)]
            )
        torch.testing.assert_close(pixels, want["pixel_values"], atol=1e-5, rtol=1e-5)
        feeds = {"pixel_values": pixels, "image_grid_thw": inputs["image_grid_thw"]}
        # Qwen-VL's image positions (mrope) need the token types, as its processor gives them
        feeds["mm_token_type_ids"] = (prompt_ids == ids["<|image_pad|>"]).to(torch.int32)
    with torch.no_grad():
        generated = model.generate(
            input_ids=prompt_ids,
            attention_mask=torch.ones_like(prompt_ids),
            **feeds,
            do_sample=False,
            max_new_tokens=MAX_LENGTH,
            output_logits=True,
            return_dict_in_generate=True,
        )
    _same_generation(result, generated, prompt_ids.shape[1])


def _same_generation(result: dict[str, Any], generated: Any, prompt: int) -> None:
    """genai's greedy tokens are transformers', at least 5 distinct; each step's logits within 1e-4."""
    sequence = result["sequence"]
    assert sequence == generated.sequences[0].tolist()
    new = sequence[prompt:]
    assert len(set(new)) >= 5, new
    assert len(new) == len(generated.logits)
    for step in range(len(new)):
        want_logits = generated.logits[step][0]
        assert float(want_logits.abs().max()) > 1.0
        torch.testing.assert_close(torch.tensor(result["logits"][step]), want_logits, atol=1e-4, rtol=1e-4)


GEMMA_SPECIALS = ["<bos>", "<eos>", "<pad>", "<start_of_image>", "<image_soft_token>", "<end_of_image>"]
GEMMA_SPECIALS += ["<start_of_turn>", "<end_of_turn>"]
GEMMA_SIDE = 32  # 16 x 16 patches of 2 pixels: genai's 256 tokens per image, pooled by 1


@pytest.fixture(scope="module")
def gemma(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, pathlib.Path, dict[str, int]]:
    import transformers

    tmp = tmp_path_factory.mktemp("gemma3_genai")
    folder, package = tmp / "checkpoint", tmp / "package"
    folder.mkdir()
    ids = save_byte_tokenizer(
        folder, GEMMA_SPECIALS, "Qwen2Tokenizer", bos="<bos>", eos="<eos>", pad="<pad>"
    )  # a byte-level BPE: genai needs the special tokens, not Gemma's own vocabulary
    tokens = {f"{k}_token_id": ids[f"<{k}>"] for k in ("bos", "eos", "pad")}
    config = transformers.Gemma3Config(
        text_config={
            "vocab_size": 272,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "max_position_embeddings": 1024,
            "sliding_window": 8,
            "layer_types": ["sliding_attention", "full_attention"],
            # untied: tied to the embeddings, the random model repeats its last token
            "tie_word_embeddings": False,
            **tokens,
        },
        vision_config={
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "image_size": GEMMA_SIDE,
            "patch_size": 2,
        },
        mm_tokens_per_image=256,
        image_token_index=ids["<image_soft_token>"],
        boi_token_index=ids["<start_of_image>"],
        eoi_token_index=ids["<end_of_image>"],
        tie_word_embeddings=False,
        **tokens,
    )
    torch.manual_seed(0)
    model = transformers.Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():  # matrices at std 0.2, as Qwen's
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.2)
    model.save_pretrained(folder)
    transformers.Gemma3ImageProcessor(size={"height": GEMMA_SIDE, "width": GEMMA_SIDE}).save_pretrained(
        folder
    )
    written = fastonnx.export_pretrained(folder, package, progress=False)
    assert (written.task, written.architecture) == ("image-text-to-text", "Gemma3ForConditionalGeneration")
    assert written.verified is True, written.verify_note
    return folder, package, ids


def test_genai_config_is_gemma3(gemma: tuple[pathlib.Path, pathlib.Path, dict[str, int]]) -> None:
    _, package, _ = gemma
    model = json.loads((package / "genai_config.json").read_text())["model"]
    assert model["type"] == "gemma3"
    # the decoder takes the ids: its image blocks attend both ways
    assert model["decoder"]["inputs"]["input_ids"] == "input_ids"
    steps = json.loads((package / "processor_config.json").read_text())["processor"]["transforms"]
    assert [s["operation"]["type"] for s in steps] == [
        "DecodeImage",
        "Resize",
        "Rescale",
        "Normalize",
        "Permute3D",
    ]


@pytest.mark.parametrize("images", [1, 0], ids=["one image", "text only"])
def test_gemma3_generates_as_transformers(
    gemma: tuple[pathlib.Path, pathlib.Path, dict[str, int]], tmp_path: pathlib.Path, images: int
) -> None:
    import transformers
    from PIL import Image

    folder, package, ids = gemma
    paths = [_png(tmp_path / "image.png", GEMMA_SIDE, GEMMA_SIDE, seed=3)][:images]
    image = "<start_of_image>" * images
    prompt = f"<bos><start_of_turn>user\n{image}What is it?<end_of_turn>\n<start_of_turn>model\n"
    result = _genai(package, paths, prompt, tmp_path)
    inputs = result["inputs"]
    prompt_ids = inputs["input_ids"].to(torch.int64)
    assert int((prompt_ids == ids["<image_soft_token>"]).sum()) == 256 * images

    model = transformers.Gemma3ForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()
    feeds: dict[str, torch.Tensor] = {}
    if images:
        processor = transformers.AutoImageProcessor.from_pretrained(folder)
        want = processor(images=[Image.open(p) for p in paths], return_tensors="pt")["pixel_values"]
        torch.testing.assert_close(inputs["pixel_values"], want, atol=1e-5, rtol=1e-5)
        # the image's tokens attend to each other both ways: transformers reads them from the token types
        feeds = {
            "pixel_values": inputs["pixel_values"],
            "token_type_ids": inputs["token_type_ids"].to(torch.int64),
        }
    with torch.no_grad():
        generated = model.generate(
            input_ids=prompt_ids,
            attention_mask=torch.ones_like(prompt_ids),
            **feeds,
            do_sample=False,
            max_new_tokens=MAX_LENGTH,
            output_logits=True,
            return_dict_in_generate=True,
        )
    _same_generation(result, generated, prompt_ids.shape[1])
