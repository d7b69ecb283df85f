"""A graph's torch module run where a package check runs an onnxruntime session: the loop checks
(spectrogram_loops, audio_code_loops...) take ``run(session, names, tensors)``, which this gives for
modules, so a test can run a check's loop on the modules the graphs were exported from."""

from __future__ import annotations

from typing import Any

import torch


def run_module(session: Any, names: list[str], tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """``session`` (a module or callable) on ``tensors`` in order; its output as a list."""
    del names  # a module takes its inputs by position, as the graph's are ordered
    with torch.no_grad():
        out = session(*tensors)
    return list(out) if isinstance(out, tuple) else [out]
