"""feature-extraction of speech encoders exported alone (issue 42), each built from the architecture
sweep's tiny config, exported by ``export_pretrained`` with its verification, then run again in
onnxruntime against transformers eager at another number of frames than the verification's:

- Nemotron 3 Diarization's and Nemotron 3.5 Transcribe's audio encoders: frames x mel bins, stacked
  ``subsampling_factor`` frames a row (the fewest frames those that make 2 rows);
- Qwen3-ASR's encoder: mel bins x whole chunks of frames and their mask, to the kept frames' rows packed;
- Gemma 3n's audio encoder: ``audio_mel`` and its mask (True at padding), from 2 attention blocks.

The Nemotron and Gemma 3n exports run under ``FASTONNX_FULL_MATRIX=1`` (their captures are slow); CI
checks the forms their captures swap in against transformers eager, and Qwen3-ASR's export.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import torch
from checkpoint_folders import export_swept

from fastonnx.capture.speech_encoders import guard_free_speech_encoders
from fastonnx.pretrained.speech_features import least_frames
from support.matrix import sampled

TASK = "feature-extraction"


def _eager(folder: pathlib.Path, class_name: str) -> Any:
    import transformers

    return getattr(transformers, class_name).from_pretrained(folder, dtype=torch.float32).eval()


def _session(written: Any) -> ort.InferenceSession:
    return ort.InferenceSession(str(written.model_path), providers=["CPUExecutionProvider"])


def _close(got: np.ndarray[Any, Any], want: torch.Tensor) -> None:
    assert float(want.abs().max()) > 1e-3  # a comparison that can fail
    torch.testing.assert_close(torch.from_numpy(np.asarray(got)), want, atol=1e-4, rtol=1e-3)


def _stacking(tmp_path: pathlib.Path, written: Any, class_name: str) -> None:
    """Frames of mel bins, 2 rows at the fewest and 61 frames (not a multiple of the 8 stacked)."""
    assert (written.input_names, written.output_names) == (["input_features"], ["last_hidden_state"])
    eager = _eager(tmp_path / "checkpoint", class_name)
    factor, bins = int(eager.config.subsampling_factor), int(eager.config.num_mel_bins)
    session = _session(written)
    g = torch.Generator().manual_seed(5)
    for frames in (factor + 1, 61):
        features = torch.randn(3, frames, bins, generator=g)
        (got,) = session.run(None, {"input_features": features.numpy()})
        with torch.no_grad():
            want = eager(input_features=features).last_hidden_state
        assert want.shape[1] == -(-frames // factor)
        _close(got, want)


def _qwen3_asr(tmp_path: pathlib.Path, written: Any, class_name: str) -> None:
    """3 chunks of frames a row (the verification's 2), three audios of 300, 150 and 37 frames."""
    assert written.input_names == ["input_features", "input_features_mask"]
    eager = _eager(tmp_path / "checkpoint", class_name)
    chunk, bins = 2 * int(eager.config.n_window), int(eager.config.num_mel_bins)
    features = torch.randn(3, bins, 3 * chunk, generator=torch.Generator().manual_seed(5))
    mask = torch.zeros(3, 3 * chunk, dtype=torch.int64)
    for row, kept in enumerate((3 * chunk, chunk + chunk // 2, 37)):
        mask[row, :kept] = 1
    (got,) = _session(written).run(
        None, {"input_features": features.numpy(), "input_features_mask": mask.numpy()}
    )
    with torch.no_grad():
        want = eager(input_features=features, input_features_mask=mask).last_hidden_state
    assert want.dim() == 2  # the rows of the three audios, packed
    _close(got, want)


def _gemma3n_audio(tmp_path: pathlib.Path, written: Any, class_name: str) -> None:
    """The fewest frames (2 blocks of its attention) and 157, the last audio padded (True in its mask)."""
    assert written.input_names == ["audio_mel", "audio_mel_mask"]
    eager = _eager(tmp_path / "checkpoint", class_name)
    session = _session(written)
    g = torch.Generator().manual_seed(5)
    for frames in (least_frames(eager), 157):
        mel = torch.randn(3, frames, int(eager.config.input_feat_size), generator=g)
        padding = torch.zeros(3, frames, dtype=torch.bool)
        padding[2, frames // 2 :] = True
        (got,) = session.run(None, {"audio_mel": mel.numpy(), "audio_mel_mask": padding.numpy()})
        with torch.no_grad():
            want = eager(audio_mel=mel, audio_mel_mask=padding).last_hidden_state
        _close(got, want)


Check = Callable[[pathlib.Path, Any, str], None]
ENCODERS: dict[str, tuple[str, Check]] = {
    "qwen3_asr_encoder": ("Qwen3ASREncoder", _qwen3_asr),
    "nemotron3_diarization_audio": ("Nemotron3DiarizationAudioModel", _stacking),
    "nemotron3_5_transcribe_asr_audio": ("Nemotron3_5TranscribeAsrAudioModel", _stacking),
    "gemma3n_audio": ("Gemma3nAudioEncoder", _gemma3n_audio),
}
"""Each encoder's class and its run at other lengths than the verification's. CI exports Qwen3-ASR's;
the Nemotron encoders' (~4 s each past the imports) and Gemma 3n's (a 9 s capture) under
FASTONNX_FULL_MATRIX=1, their capture forms checked below in CI."""


@pytest.mark.parametrize("model_type", sampled(ENCODERS, lambda t: t == "qwen3_asr_encoder"))
def test_the_encoder_verifies_and_runs_at_other_lengths(tmp_path: pathlib.Path, model_type: str) -> None:
    class_name, check = ENCODERS[model_type]
    written = export_swept(tmp_path, TASK, model_type, class_name)
    assert written.verified is True, written.verify_note
    check(tmp_path, written, class_name)


def test_gemma3n_attention_form_is_transformers(tmp_path: pathlib.Path) -> None:
    """The captured form of Gemma 3n's attention (whole blocks always padded, the frames read by index)
    gives transformers' encoder output at one block, at a partial last block and at whole blocks."""
    from checkpoint_folders import architecture_sweep

    sweep = architecture_sweep()
    config = sweep.tiny_config("gemma3n_audio")
    import transformers

    torch.manual_seed(0)
    eager = transformers.Gemma3nAudioEncoder(config).eval()
    g = torch.Generator().manual_seed(5)
    for frames in (9, 100, 4 * 12 * 3):
        mel = torch.randn(2, frames, int(config.input_feat_size), generator=g)
        padding = torch.zeros(2, frames, dtype=torch.bool)
        padding[1, frames // 3 :] = True
        with torch.no_grad():
            want = eager(audio_mel=mel, audio_mel_mask=padding).last_hidden_state
            with guard_free_speech_encoders():
                got = eager(audio_mel=mel, audio_mel_mask=padding).last_hidden_state
        assert float(want.abs().max()) > 1e-3
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_stacking_form_and_fewest_frames() -> None:
    """Nemotron 3.5 Transcribe's encoder under the capture's stacking form gives transformers' states at
    a number of frames that is no multiple of the 8 stacked, and its graph's frames start at 2 rows."""
    import transformers
    from checkpoint_folders import architecture_sweep

    from fastonnx.capture.diarization_chunks import one_chunk_diarization
    from fastonnx.pretrained.encoder_tasks import min_features

    config = architecture_sweep().tiny_config("nemotron3_5_transcribe_asr_audio")
    torch.manual_seed(0)
    eager = transformers.Nemotron3_5TranscribeAsrAudioModel(config).eval()
    factor = int(config.subsampling_factor)
    assert min_features(eager) == factor + 1
    g = torch.Generator().manual_seed(5)
    features = torch.randn(2, 3 * factor + 5, int(config.num_mel_bins), generator=g)
    with torch.no_grad():
        want = eager(input_features=features).last_hidden_state
        with one_chunk_diarization():
            got = eager(input_features=features).last_hidden_state
    assert want.shape[1] == 4 and float(want.abs().max()) > 1e-3
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
