"""feature-extraction of speech encoders exported alone (issue 42), each built from the architecture
sweep's tiny config, exported by ``export_pretrained`` with its verification, then run again in
onnxruntime against transformers eager at another number of frames than the verification's:

- Nemotron 3 Diarization's and Nemotron 3.5 Transcribe's audio encoders: frames x mel bins, stacked
  ``subsampling_factor`` frames a row (the fewest frames those that make 2 rows).
"""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import torch
from checkpoint_folders import export_swept

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


STACKING = {
    "nemotron3_diarization_audio": "Nemotron3DiarizationAudioModel",
    "nemotron3_5_transcribe_asr_audio": "Nemotron3_5TranscribeAsrAudioModel",
}


# CI runs Nemotron 3.5 Transcribe's (its stacking swapped as Diarization's is); both in the full matrix
@pytest.mark.parametrize("model_type", sampled(STACKING, lambda t: t == "nemotron3_5_transcribe_asr_audio"))
def test_stacking_encoder_at_another_length(tmp_path: pathlib.Path, model_type: str) -> None:
    """Frames of mel bins, 2 rows at the fewest and 61 frames (not a multiple of the 8 stacked)."""
    written = export_swept(tmp_path, TASK, model_type, STACKING[model_type])
    assert written.verified is True, written.verify_note
    assert (written.input_names, written.output_names) == (["input_features"], ["last_hidden_state"])
    eager = _eager(tmp_path / "checkpoint", STACKING[model_type])
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
