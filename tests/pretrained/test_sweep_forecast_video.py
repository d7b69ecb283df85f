"""Forecasters and a video segmenter the architecture sweep (scripts/architecture_sweep.py) found failing
to export:

- TimesFM's and TimesFM 2.5's prediction models return ``mean_predictions`` and ``full_predictions``
  (encoder_tasks.FALLBACK_OUTPUTS), and walk their series row by row in Python, which specialised the
  batch: capture/batched_forecasts.py computes the same forecast on the batch x steps tensor, the batch
  and the steps symbolic; TimesFM 2.5's decoder's running statistics as cumulative sums, not a loop over
  its 512 patches (its capture timed out);
- VideoMT walks its frames in Python (each frame's queries from the previous frame's): a ``scan`` over
  the frames (capture/video_queries.py) keeps their count symbolic.

Each row is built from the sweep's own tiny config, exported by ``export_pretrained`` and verified against
transformers eager (in the full matrix: about 35 s together; in CI the unit tests below export the forms
from smaller configs and check them in onnxruntime at other batches, steps and frames).
"""

from __future__ import annotations

import pathlib

import pytest
import torch
from checkpoint_folders import architecture_sweep, export_swept

import fastonnx
from fastonnx.capture.batched_forecasts import batched_forecasts, running_patch_stats
from fastonnx.capture.video_queries import scanned_video_frames
from fastonnx.errors import CaptureError

ROWS = [
    ("time-series-forecasting", "timesfm"),
    ("time-series-forecasting", "timesfm2_5"),
    ("image-segmentation", "videomt"),
]


# full matrix: the forms are exported by the unit tests below, the task's fields and dims checked there
@pytest.mark.full_matrix
@pytest.mark.parametrize(("task", "model_type"), ROWS)
def test_sweep_rows_export_verified(tmp_path: pathlib.Path, task: str, model_type: str) -> None:
    written = export_swept(tmp_path, task, model_type)
    assert written.verified is True, written.verify_note


class _Forecasts(torch.nn.Module):
    """A prediction model's two forecasts of a batch x steps tensor."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, past_values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.model(past_values=past_values)
        return out.mean_predictions, out.full_predictions


def _forecaster(model_type: str, **overrides: object) -> torch.nn.Module:
    import transformers

    sweep = architecture_sweep()
    cls = {"timesfm": "TimesFmModelForPrediction", "timesfm2_5": "TimesFm2_5ModelForPrediction"}[model_type]
    torch.manual_seed(0)
    model: torch.nn.Module = getattr(transformers, cls)(sweep.tiny_config(model_type, overrides)).eval()
    return model


def _series(batch: int, steps: int, seed: int) -> torch.Tensor:
    return torch.randn(batch, steps, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("model_type", ["timesfm", "timesfm2_5"])
def test_batched_forecast_is_transformers_forecast(model_type: str) -> None:
    """The form on a tensor equals transformers' forward on its rows as a list, at two batch sizes,
    with the steps shorter (front padding), longer (cut) and a shorter forecast context."""
    model = _forecaster(model_type, context_length=128)
    cases = [(1, 100, {}), (3, 160, {}), (2, 128, {"forecast_context_len": 64, "truncate_negative": True})]
    for batch, steps, options in cases:
        values = _series(batch, steps, batch)
        if options:
            values = values.abs()  # a non-negative series: truncate_negative clamps
        with torch.no_grad():
            expected = model(past_values=list(values), **options)
            with batched_forecasts():
                got = model(past_values=values, **options)
                as_tuple = model(past_values=values, return_dict=False, **options)
        for name in ("mean_predictions", "full_predictions"):
            torch.testing.assert_close(getattr(got, name), getattr(expected, name), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(as_tuple[-1], expected.full_predictions, atol=1e-5, rtol=1e-5)


def test_batched_forecast_refuses_what_it_does_not_compute() -> None:
    model = _forecaster("timesfm", context_length=64)
    with batched_forecasts(), pytest.raises(CaptureError, match="window_size"):
        model(past_values=_series(2, 64, 0), window_size=4)
    with torch.no_grad(), batched_forecasts():  # a list of series: transformers' own loop
        assert model(past_values=list(_series(2, 64, 0))).mean_predictions.shape[0] == 2


def test_running_patch_stats_are_transformers_loop() -> None:
    """Cumulative statistics of every prefix of patches equal TimesFM 2.5's Welford loop, with leading
    padded patches (no valid value yet) and a partly padded one."""
    from transformers.models.timesfm2_5.modeling_timesfm2_5 import TimesFm2_5Model

    values = 3.0 + 2.0 * torch.randn(3, 6, 8, generator=torch.Generator().manual_seed(0))
    masked = torch.zeros(3, 6, 8, dtype=torch.bool)
    masked[0, :2] = True
    masked[0, 2, :5] = True
    masked[1, 0, :3] = True
    count, mean, std = (torch.zeros(3) for _ in range(3))
    means, stds = [], []
    for i in range(6):
        count, mean, std = TimesFm2_5Model._update_running_stats(count, mean, std, values[:, i], masked[:, i])
        means.append(mean)
        stds.append(std)
    got_mean, got_std = running_patch_stats(values, masked)
    torch.testing.assert_close(got_mean, torch.stack(means, 1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_std, torch.stack(stds, 1), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("model_type", ["timesfm", "timesfm2_5"])
def test_forecasters_export_any_batch_and_steps(model_type: str) -> None:
    """Exported with the batch and the steps dynamic (without the forms torch.export specialises the
    batch), the file forecasts as transformers does at other batches and steps. One layer; TimesFM with
    its positional embedding (transformers concatenates a list of it the batch's length), TimesFM 2.5
    with one decoder run (the flip-invariant second run, the same decoder on the negated series, is in
    the sweep's row above and the eager test)."""
    options = (
        {"force_flip_invariance": False} if model_type == "timesfm2_5" else {"use_positional_embedding": True}
    )
    model = _forecaster(model_type, context_length=128, num_hidden_layers=1, **options)
    wrapped = _Forecasts(model).eval()
    result = fastonnx.to_onnx(wrapped, (_series(2, 128, 0),), dynamic_shapes=({0: "batch", 1: "steps"},))
    for batch, steps in ((1, 40), (3, 200)):
        values = _series(batch, steps, steps)
        with torch.no_grad():
            expected = model(past_values=list(values))
        mean, full = result(values)
        torch.testing.assert_close(mean, expected.mean_predictions, atol=1e-4, rtol=1e-3)
        torch.testing.assert_close(full, expected.full_predictions, atol=1e-4, rtol=1e-3)


def test_videomt_frames_scanned() -> None:
    """VideoMT's frames as a scan: the form equals transformers' loop eagerly, and the file exported with
    the batch and the frames dynamic (a Python loop specialises the frames) segments other counts as
    transformers does, each frame's queries following the previous frame's."""
    from transformers import VideomtForUniversalSegmentation

    torch.manual_seed(0)
    config = architecture_sweep().tiny_config("videomt", {"num_hidden_layers": 1, "num_blocks": 1})
    model = VideomtForUniversalSegmentation(config).eval()
    fields = ("masks_queries_logits", "class_queries_logits")
    clips = torch.randn(2, 3, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(pixel_values_videos=clips)
        with scanned_video_frames():
            got = model(pixel_values_videos=clips)
    for name in (*fields, "last_hidden_state"):
        torch.testing.assert_close(getattr(got, name), getattr(expected, name), atol=1e-5, rtol=1e-5)

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, pixel_values_videos: torch.Tensor) -> tuple[torch.Tensor, ...]:
            out = self.model(pixel_values_videos=pixel_values_videos)
            return tuple(getattr(out, name) for name in fields)

    result = fastonnx.to_onnx(Logits().eval(), (clips,), dynamic_shapes=({0: "batch", 1: "frames"},))
    for batch, frames in ((1, 1), (3, 4)):
        other = torch.randn(batch, frames, 3, 32, 32, generator=torch.Generator().manual_seed(frames))
        with torch.no_grad():
            want = model(pixel_values_videos=other)
        for name, tensor in zip(fields, result(other), strict=True):
            torch.testing.assert_close(tensor, getattr(want, name), atol=1e-4, rtol=1e-3)


def test_forecasters_task_reads_batch_by_steps_and_returns_their_forecasts() -> None:
    """time-series-forecasting of TimesFM's prediction model: ``past_values`` of ``batch_size`` x
    ``sequence_length`` (any steps), the forecasts its output declares (no ``prediction_outputs``)."""
    from fastonnx.pretrained.encoder_tasks import encoder_inputs, output_fields

    model = _forecaster("timesfm", context_length=64)
    task = "time-series-forecasting"
    assert output_fields(model, task) == ("mean_predictions", "full_predictions")
    inputs, dims = encoder_inputs(model, model.config, task, 2, "cpu")
    assert inputs["past_values"].shape == (2, 64)
    assert dims == {"past_values": {0: "batch_size", 1: "sequence_length"}}
