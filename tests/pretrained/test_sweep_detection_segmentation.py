"""Detectors and segmenters the architecture sweep (scripts/architecture_sweep.py) found failing to export:

- RT-DETR and RT-DETRv2 read their batch as ``len(source_flatten)``, which torch.export specialises:
  while capturing, those modules' ``len`` gives a tensor's ``shape[0]`` as it is
  (capture/traceable_detection.py). Their tiny checkpoints' BatchNorm scales, drawn from N(0, 0.01),
  shrank the features until every anchor scored alike: the sweep sets them to one;
- RF-DETR's segmentation forward is annotated ``dict``: its outputs are those of the class it returns;
- PP-OCRv5's text detector returns its probability map as ``last_hidden_state``, which its
  post-processing reads (encoder_tasks.FALLBACK_OUTPUTS);
- OneFormer cannot run without its task prompt's ids, ``task_inputs`` (side_inputs.py), a graph input;
- EoMT branches on its ``attn_mask_probs`` buffer (its own test: test_control_buffers.py).

Each is built from the sweep's own tiny config, exported by ``export_pretrained`` and verified against
transformers eager.
"""

from __future__ import annotations

import dataclasses
import pathlib
import sys

import pytest
import torch
from checkpoint_folders import architecture_sweep

import fastonnx
from fastonnx.capture.traceable_detection import tensor_len, traceable_detection_ops
from fastonnx.errors import CaptureError
from fastonnx.pretrained.encoder_tasks import output_fields
from support.matrix import sampled

EXPORTS = [
    ("object-detection", "rt_detr"),
    ("object-detection", "rt_detr_v2"),
    ("object-detection", "pp_ocrv5_mobile_det"),
    ("image-segmentation", "rf_detr"),
    ("image-segmentation", "oneformer"),  # 70 s: the task prompt by the unit test below in CI
    ("image-segmentation", "eomt"),
    ("zero-shot-object-detection", "omdet-turbo"),  # 65 s: its prompt form by the unit test below in CI
]


@pytest.mark.parametrize(
    ("task", "model_type"),
    # CI: two of them; RT-DETR's batch read with len() by the unit tests below
    sampled(EXPORTS, lambda case: case[1] == "rf_detr"),  # output_fields' unit test covers PP-OCR's
)
def test_sweep_detection_exports_verified(tmp_path: pathlib.Path, task: str, model_type: str) -> None:
    sweep = architecture_sweep()
    class_name = dict(sweep.architectures(task))[model_type]
    folder = tmp_path / "checkpoint"
    sweep.build_checkpoint(task, model_type, class_name, folder)
    written = fastonnx.export_pretrained(folder, tmp_path / "package", task=task, progress=False)
    assert written.verified is True, written.verify_note


class _Queries(torch.nn.Module):
    """RT-DETR's learned queries tiled to the batch it reads with ``len``."""

    def __init__(self, length: object) -> None:
        super().__init__()
        self.length = length
        self.query = torch.nn.Parameter(torch.randn(1, 4, 8, generator=torch.Generator().manual_seed(0)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch = self.length(x)  # type: ignore[operator]
        return x + self.query.tile([batch, 1, 1])


def test_tensor_len_keeps_the_batch_dynamic() -> None:
    model = _Queries(tensor_len).eval()
    x = torch.randn(2, 4, 8)
    result = fastonnx.to_onnx(model, (x,), dynamic_shapes=({0: "batch"},))
    for n in (1, 3, 5):
        other = torch.randn(n, 4, 8, generator=torch.Generator().manual_seed(n))
        with torch.no_grad():
            torch.testing.assert_close(result(other), model(other), atol=1e-5, rtol=1e-5)
    assert tensor_len([1, 2, 3]) == 3
    with pytest.raises(TypeError):
        tensor_len(torch.tensor(1.0))


def test_builtin_len_specialises_the_batch() -> None:
    with pytest.raises(CaptureError, match="specialised"):
        fastonnx.to_onnx(_Queries(len).eval(), (torch.randn(2, 4, 8),), dynamic_shapes=({0: "batch"},))


def test_rt_detr_len_shadowed_while_capturing() -> None:
    from transformers.models.rt_detr import modeling_rt_detr

    assert "len" not in vars(modeling_rt_detr)
    with traceable_detection_ops():
        assert sys.modules[modeling_rt_detr.__name__].len is tensor_len  # type: ignore[attr-defined]
    assert "len" not in vars(modeling_rt_detr)


@dataclasses.dataclass
class _SegmentationOutput:
    logits: torch.Tensor | None = None
    pred_boxes: torch.Tensor | None = None
    pred_masks: torch.Tensor | None = None
    last_hidden_state: torch.Tensor | None = None


@dataclasses.dataclass
class _MapOutput:
    last_hidden_state: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None


class _DictAnnotated(torch.nn.Module):
    def forward(self, pixel_values: torch.Tensor) -> dict[str, torch.Tensor]:
        return _SegmentationOutput(logits=pixel_values)  # type: ignore[return-value]


class _TextDetector(torch.nn.Module):
    def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor] | _MapOutput:
        return _MapOutput(last_hidden_state=pixel_values)


def test_output_fields_of_the_returned_class() -> None:
    # RF-DETR: not class_queries_logits / masks_queries_logits, which its output has not
    assert output_fields(_DictAnnotated(), "image-segmentation") == ("logits", "pred_boxes", "pred_masks")
    # PP-OCR: neither logits nor pred_boxes; its post-processing reads last_hidden_state
    assert output_fields(_TextDetector(), "object-detection") == ("last_hidden_state",)


def test_oneformer_takes_its_task_prompt_as_an_input() -> None:
    from transformers import OneFormerForUniversalSegmentation

    from fastonnx.pretrained.encoder_tasks import TaskPromptedImageEncoder, encoder
    from fastonnx.pretrained.meta_init import build_on_meta
    from fastonnx.pretrained.side_inputs import image_side_inputs

    config = architecture_sweep().tiny_config("oneformer")
    model = build_on_meta(lambda: OneFormerForUniversalSegmentation(config)).eval()
    spec = encoder(model, config, "image-segmentation")
    assert isinstance(spec.module, TaskPromptedImageEncoder)
    assert spec.input_names == ["pixel_values", "task_inputs"]
    assert spec.args[1].dtype == torch.int64 and spec.args[1].shape[1] == config.task_seq_len
    made, _ = image_side_inputs(model, config, {"pixel_values": torch.zeros(3, 3, 8, 8)}, "cpu")
    assert made["task_inputs"].shape == (3, config.task_seq_len)  # the images' batch
    assert (
        0 <= int(made["task_inputs"].min())
        and int(made["task_inputs"].max()) < config.text_encoder_vocab_size
    )
    shapes = spec.dynamic_shapes["task_inputs"]  # its length is the task MLP's: fixed
    assert list(shapes) == [0] and shapes[0].__name__ == "batch_size"


@pytest.mark.parametrize("padded", ["one row", "every row"])
def test_omdet_prompts_embedded_as_one_batch_are_transformers(padded: str) -> None:
    """OmDet-Turbo's batched prompt form (capture/class_prompts.py) against transformers' cached, looped
    and cut embedding: the same detections where one task prompt is padded and where every one is (which
    transformers cuts to the longest, the form masks)."""
    from transformers import OmDetTurboForObjectDetection

    from fastonnx.capture.class_prompts import batched_class_prompts, equal_class_counts
    from fastonnx.pretrained.encoder_tasks import ClassPrompts, encoder_inputs

    config = architecture_sweep().tiny_config("omdet-turbo")
    torch.manual_seed(0)
    model = OmDetTurboForObjectDetection(config).eval()
    inputs, _ = encoder_inputs(model, config, "zero-shot-object-detection", 3, "cpu")
    if padded == "every row":
        inputs["tasks_attention_mask"][:, -3:] = 0
    reference = ClassPrompts(model)
    with torch.no_grad():
        want = reference(**inputs)
        model.language_cache_class.cache.clear()  # transformers' own cache: the form must compute anew
        model.language_cache_prompt.cache.clear()
        with batched_class_prompts(), equal_class_counts():
            got = reference(**inputs)
    for field in ("decoder_class_logits", "decoder_coord_logits"):
        torch.testing.assert_close(getattr(got, field), getattr(want, field), atol=1e-5, rtol=1e-4)
    assert not model.language_cache_class.cache  # the form read no cache and filled none
