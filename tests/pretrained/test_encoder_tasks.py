"""optimum's other tasks (issue 42, part 3): one architecture a task, built by the architecture sweep's
tiny-config maker (transformers' own defaults shrunk, random weights), exported by ``export_pretrained``
with its verification, then run again in onnxruntime against transformers eager on inputs of other sizes
than the verification's: a batch of 3, four choices, a longer waveform, another number of prompts."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import torch
from checkpoint_folders import architecture_sweep

import fastonnx
from fastonnx.pretrained.encoder_tasks import encoder_inputs
from support.matrix import sampled

_sweep = architecture_sweep


# task, model type, class, the graph's outputs
CASES = [
    ("multiple-choice", "bert", "BertForMultipleChoice", ["logits"]),
    ("object-detection", "detr", "DetrForObjectDetection", ["logits", "pred_boxes"]),
    (
        "image-segmentation",
        "mask2former",
        "Mask2FormerForUniversalSegmentation",
        ["class_queries_logits", "masks_queries_logits"],
    ),
    ("semantic-segmentation", "segformer", "SegformerForSemanticSegmentation", ["logits"]),
    ("depth-estimation", "glpn", "GLPNForDepthEstimation", ["predicted_depth"]),
    ("masked-im", "vit", "ViTForMaskedImageModeling", ["reconstruction"]),
    ("image-to-image", "swin2sr", "Swin2SRForImageSuperResolution", ["reconstruction"]),
    (
        "zero-shot-image-classification",
        "clip",
        "CLIPModel",
        ["logits_per_image", "logits_per_text", "text_embeds", "image_embeds"],
    ),
    ("audio-classification", "audio-spectrogram-transformer", "ASTForAudioClassification", ["logits"]),
    ("audio-frame-classification", "wav2vec2", "Wav2Vec2ForAudioFrameClassification", ["logits"]),
    ("audio-xvector", "wavlm", "WavLMForXVector", ["logits", "embeddings"]),
    ("automatic-speech-recognition", "hubert", "HubertForCTC", ["logits"]),
    ("automatic-speech-recognition", "parakeet_ctc", "ParakeetForCTC", ["logits"]),
    # encoder-decoder base models: the decoder's states and the encoder's, from decoder tokens beside
    # the text or the audio
    ("feature-extraction", "t5", "T5Model", ["last_hidden_state", "encoder_last_hidden_state"]),
    ("feature-extraction", "marian", "MarianModel", ["last_hidden_state", "encoder_last_hidden_state"]),
    (
        "feature-extraction",
        "speech_to_text",
        "Speech2TextModel",
        ["last_hidden_state", "encoder_last_hidden_state"],
    ),
    # its forward returns an LM output: the encoder's states alone are features
    ("feature-extraction", "seamless_m4t", "SeamlessM4TModel", ["encoder_last_hidden_state"]),
]


def _other_sizes(model: Any, task: str) -> dict[str, torch.Tensor]:
    """The task's inputs at sizes the verification did not use."""
    inputs, _ = encoder_inputs(model, model.config, task, 3, "cpu")
    g = torch.Generator().manual_seed(11)
    if task == "multiple-choice":  # four choices of 9 tokens, the last choice of the second row padded
        ids = torch.randint(3, int(model.config.vocab_size), (3, 4, 9), generator=g)
        mask = torch.ones_like(ids)
        mask[1, 3, 5:] = 0
        return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
    if "input_ids" in inputs:  # two prompts of 5 tokens against the 3 images
        inputs["input_ids"] = inputs["input_ids"][:2, :5]
        inputs["attention_mask"] = inputs["attention_mask"][:2, :5]
    if "input_values" in inputs and inputs["input_values"].dim() == 2:
        inputs["input_values"] = torch.randn(3, 23_456, generator=g)  # not the 16000 verified
    if "input_features" in inputs:
        inputs["input_features"] = torch.randn(3, 57, inputs["input_features"].shape[-1], generator=g)
    if "decoder_input_ids" in inputs:  # 3 decoder tokens a row of the encoder's
        rows = len(next(iter(inputs.values())))
        inputs["decoder_input_ids"] = inputs["decoder_input_ids"][:rows, :3]
    return inputs


# CI runs one case a kind of input (text choices, images and the detector, frames, text and decoder
# tokens; the waveform and CLIP's image and text, as feature-extraction, in the tests below it); every
# task under FASTONNX_FULL_MATRIX=1
IN_CI = {"bert", "detr", "parakeet_ctc", "t5"}


@pytest.mark.parametrize(
    ("task", "model_type", "class_name", "outputs"),
    sampled(CASES, lambda c: c[1] in IN_CI),
    ids=[c[1] for c in sampled(CASES, lambda c: c[1] in IN_CI)],
)
def test_task_package_matches_transformers(
    tmp_path: pathlib.Path, task: str, model_type: str, class_name: str, outputs: list[str]
) -> None:
    import transformers

    folder, package = tmp_path / "checkpoint", tmp_path / "package"
    _sweep().build_checkpoint(task, model_type, class_name, folder)
    written = fastonnx.export_pretrained(folder, package, "auto", progress=False)
    assert (written.task, written.architecture) == (task, class_name)  # task="auto" finds it
    assert written.verified is True, written.verify_note
    assert written.output_names == outputs

    eager = getattr(transformers, class_name).from_pretrained(folder, dtype=torch.float32).eval()
    inputs = _other_sizes(eager, task)
    assert list(inputs) == written.input_names
    with torch.no_grad():
        out = eager(**inputs)
    session = ort.InferenceSession(str(written.model_path), providers=["CPUExecutionProvider"])
    results = session.run(None, {k: v.numpy() for k, v in inputs.items()})
    for name, got in zip(outputs, results, strict=True):
        want = getattr(out, name)
        assert float(want.abs().max()) > 1e-3, name  # a comparison that can fail
        torch.testing.assert_close(torch.from_numpy(np.asarray(got)), want, atol=1e-4, rtol=1e-3, msg=name)


def test_a_waveform_starts_at_two_frames(tmp_path: pathlib.Path) -> None:
    """The waveform's length is proven from the samples that make 2 frames (at 1 frame the captured program
    is not transformers'): the file's proven sizes say so, and the shortest admitted length runs right."""
    import onnx
    import transformers

    folder, package = tmp_path / "checkpoint", tmp_path / "package"
    _sweep().build_checkpoint("automatic-speech-recognition", "hubert", "HubertForCTC", folder)
    written = fastonnx.export_pretrained(folder, package, progress=False, verify=False)
    eager = transformers.HubertForCTC.from_pretrained(folder).eval()
    least = next(n for n in range(1, 1 << 16) if int(eager._get_feat_extract_output_lengths(n)) >= 2)
    meta = {
        p.key: p.value for p in onnx.load(str(written.model_path), load_external_data=False).metadata_props
    }
    proven = json.loads(meta["pkg.fastonnx.proven_sizes"])["dims"]
    assert proven["input_values[1]"] == [least, 1 << 20]
    wave = torch.randn(2, least, generator=torch.Generator().manual_seed(3))
    session = ort.InferenceSession(str(written.model_path), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {"input_values": wave.numpy()})
    with torch.no_grad():
        want = eager(input_values=wave).logits
    assert want.shape[1] == 2
    torch.testing.assert_close(torch.from_numpy(got), want, atol=1e-4, rtol=1e-3)


def test_a_two_tower_base_model_extracts_its_embeddings(tmp_path: pathlib.Path) -> None:
    """feature-extraction of a base model without states (CLIP's two towers) returns its text and image
    embeddings, as optimum's does; the package verifies against transformers' CLIPModel."""
    from checkpoint_folders import architecture_sweep

    sweep = architecture_sweep()
    folder = tmp_path / "checkpoint"
    sweep.build_checkpoint("feature-extraction", "clip", "CLIPModel", folder)
    written = fastonnx.export_pretrained(folder, tmp_path / "package", "feature-extraction", progress=False)
    assert written.verified is True, written.verify_note
    assert written.output_names == ["text_embeds", "image_embeds"]


# text and audio or video towers (media_text_towers.py): CI runs PE's video model (frames of any number);
# PE's audio model and VideoPrism's (each ~30 s: its capture narrows the waveform's or the prompt's
# length, then captures again) under FASTONNX_FULL_MATRIX=1
MEDIA_TOWERS = {
    "pe_video": ("PeVideoModel", ["text_video_embeds", "video_embeds"]),
    "pe_audio": ("PeAudioModel", ["text_audio_embeds", "audio_embeds"]),
    "videoprism": ("VideoPrismClipModel", ["text_embeds", "video_embeds"]),
}


@pytest.mark.parametrize("model_type", sampled(MEDIA_TOWERS, lambda t: t == "pe_video"))
def test_text_and_media_towers_extract_their_embeddings(tmp_path: pathlib.Path, model_type: str) -> None:
    """feature-extraction of two towers of text and audio or video returns both embeddings, as CLIP's
    does; run again on 3 waveforms or clips (a longer waveform, 5 frames where any number is taken) and
    2 prompts of 5 tokens."""
    import transformers
    from checkpoint_folders import export_swept

    class_name, outputs = MEDIA_TOWERS[model_type]
    written = export_swept(tmp_path, "feature-extraction", model_type, class_name)
    assert written.verified is True, written.verify_note
    assert written.output_names == outputs
    eager = getattr(transformers, class_name).from_pretrained(tmp_path / "checkpoint").eval()
    g = torch.Generator().manual_seed(11)
    ids = torch.randint(3, 128, (2, 5), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 3:] = 0
    inputs = {"input_ids": ids, "attention_mask": mask}
    if model_type == "pe_audio":
        inputs["input_values"] = torch.randn(3, 1, 23_456, generator=g)
    else:
        size = 32  # the tiny towers' image size
        frames = 5 if model_type == "pe_video" else int(eager.config.vision_config.num_frames)
        inputs["pixel_values_videos"] = torch.randn(3, frames, 3, size, size, generator=g)
    assert list(inputs) == written.input_names
    session = ort.InferenceSession(str(written.model_path), providers=["CPUExecutionProvider"])
    results = session.run(None, {k: v.numpy() for k, v in inputs.items()})
    with torch.no_grad():
        out = eager(**inputs)
    for name, got in zip(outputs, results, strict=True):
        want = getattr(out, name)
        assert want.shape[0] == (2 if name.startswith("text") else 3)
        assert float(want.abs().max()) > 1e-3, name
        torch.testing.assert_close(torch.from_numpy(np.asarray(got)), want, atol=1e-4, rtol=1e-3, msg=name)
