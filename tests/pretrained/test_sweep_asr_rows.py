"""Automatic-speech-recognition rows the architecture sweep found failing to export, each built from
the sweep's tiny config, exported by ``export_pretrained`` and verified, then its audio graph run here
at another length than the export's example, against transformers eager:

- Fun-ASR-Nano: its encoder adds a sinusoid table of ``max_position_embeddings`` rows counted from 1,
  so it reads at most one frame fewer; the audio graph's frames are bounded so up front
  (audio_language.most_frames), and the file records the bound.
"""

from __future__ import annotations

import json
import pathlib

import onnx
import onnxruntime as ort
import torch
from checkpoint_folders import architecture_sweep

import fastonnx
from fastonnx.pretrained import audio_language as al

ASR = "automatic-speech-recognition"


def _session(path: pathlib.Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def test_fun_asr_nano_frames_bounded_by_its_table(tmp_path: pathlib.Path) -> None:
    import transformers

    folder, package = tmp_path / "checkpoint", tmp_path / "package"
    sweep = architecture_sweep()
    class_name = dict(sweep.architectures(ASR))["fun_asr_nano"]
    sweep.build_checkpoint(ASR, "fun_asr_nano", class_name, folder)
    written = fastonnx.export_pretrained(folder, package, task=ASR, progress=False)
    assert written.verified is True, written.verify_note

    model = getattr(transformers, class_name).from_pretrained(folder, dtype=torch.float32).eval()
    top = int(model.config.audio_config.max_position_embeddings) - 1
    session = _session(package / al.AUDIO_FILE)
    g = torch.Generator().manual_seed(3)
    size = model.config.audio_config.input_size
    # a length the export did not see, half padded, and the longest the table holds
    for frames, kept in ((37, 20), (top, top)):
        features = torch.randn(1, frames, size, generator=g)
        mask = (torch.arange(frames) < kept).to(torch.int64)[None]
        (got,) = session.run(None, {"input_features": features.numpy(), al.MASK: mask.numpy()})
        with torch.no_grad():
            want = model.get_audio_features(input_features=features, input_features_mask=mask).pooler_output
        torch.testing.assert_close(torch.from_numpy(got), want, atol=1e-4, rtol=1e-3, msg=f"{frames} frames")
    # the file keeps the bound: the table's rows less the one position 0 takes
    proto = onnx.load(str(package / al.AUDIO_FILE), load_external_data=False)
    proven = json.loads({p.key: p.value for p in proto.metadata_props}["pkg.fastonnx.proven_sizes"])["dims"]
    assert proven["input_features[1]"][1] == top
