"""The onnxruntime sessions of a package's stage files, and a ``run(session, names, tensors)`` for a
package check's loop that counts each file's runs and lets a test perturb their outputs (to show the
check failing)."""

from __future__ import annotations

import pathlib
from collections.abc import Callable, Iterable
from typing import Any

import onnxruntime as ort
import torch

from fastonnx.pretrained.package_check import _run

Run = Callable[[Any, list[str], list[torch.Tensor]], list[torch.Tensor]]


def stage_sessions(outdir: pathlib.Path, files: Iterable[str]) -> dict[str, Any]:
    """A CPU session of each of ``files`` in ``outdir``, by file name."""
    return {n: ort.InferenceSession(str(outdir / n), providers=["CPUExecutionProvider"]) for n in files}


def perturbed_runs(
    sessions: dict[str, Any], perturb: Callable[[str, int, list[torch.Tensor]], None]
) -> tuple[Run, dict[str, int]]:
    """A run over ``sessions`` that calls ``perturb(file, n, outputs)`` on the outputs of the file's
    ``n``-th run (from 1; the outputs changed in place), and the runs counted by file."""
    calls = dict.fromkeys(sessions, 0)

    def run(session: Any, names: list[str], tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        file = next(f for f, s in sessions.items() if s is session)
        calls[file] += 1
        out = _run(session, names, tensors)
        perturb(file, calls[file], out)
        return out

    return run, calls
