"""onnxruntime latency (1 thread) of a PT2E-quantized model's files, side by side: the fp32 export of the
float model, fastonnx's QDQ file of the quantized model and the official exporter's
(`torch.onnx.export(..., dynamo=True)`) of the same quantized model; each session at onnxruntime's
default optimization level (its QDQ fusions on), runs alternated (the order rotates every round),
medians of --runs single calls after a warm-up. Also reports each file's output error against the
converted torch model, with the fusions on (the integer kernels) and off (the file's own QDQ
arithmetic): reported, not gated. Regenerates the quantized_latency section of docs/benchmarks.md.

    python benches/quantized_latency.py                   # both models, 300 runs
    python benches/quantized_latency.py --runs 50 --no-ledger
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import onnxruntime as ort
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
    X86InductorQuantizer,
    get_default_x86_inductor_quantization_config,
)

import fastonnx
import ledger


class SmallConvLinear(torch.nn.Module):
    """tests/models/test_quantized_models.py's model: Conv 3→8 + ReLU, Linear 288→10."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3)
        self.fc = torch.nn.Linear(8 * 6 * 6, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).flatten(1))


class ConvNet(torch.nn.Module):
    """Two Conv + ReLU (3→32→64 channels at 32x32) and a Linear 16384→10: a model whose convolutions
    outweigh the session's per-call overhead."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 32, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(32, 64, 3, stride=2, padding=1)
        self.fc = torch.nn.Linear(64 * 16 * 16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv2(torch.relu(self.conv1(x)))).flatten(1))


MODELS: dict[str, tuple[Callable[[], torch.nn.Module], tuple[int, ...]]] = {
    "conv-linear-small": (SmallConvLinear, (2, 3, 8, 8)),
    "convnet-32": (ConvNet, (1, 3, 32, 32)),
}


def quantized(make: Callable[[], torch.nn.Module], shape: tuple[int, ...]) -> tuple[Any, Any, torch.Tensor]:
    """(float model, PT2E-converted model, input): X86InductorQuantizer, 8 calibration batches."""
    torch.manual_seed(0)
    model = make().eval()
    x = torch.randn(*shape)
    quantizer = X86InductorQuantizer()
    quantizer.set_global(get_default_x86_inductor_quantization_config())
    prepared = prepare_pt2e(torch.export.export(model, (x,)).module(), quantizer)
    for _ in range(8):
        prepared(torch.randn(*shape))
    return model, convert_pt2e(prepared), torch.randn(*shape)


def session(path: str, optimized: bool) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    if not optimized:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def measure(name: str, runs: int, folder: str) -> dict[str, Any]:
    make, shape = MODELS[name]
    model, converted, x = quantized(make, shape)
    paths = {k: os.path.join(folder, f"{name}-{k}.onnx") for k in ("fp32", "fastonnx", "official")}
    fastonnx.to_onnx(model, (x,), filename=paths["fp32"])
    fastonnx.to_onnx(converted, (x,), filename=paths["fastonnx"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(converted, (x,), paths["official"], dynamo=True, verbose=False)
    with torch.no_grad():
        expected = converted(x).numpy()
        float_out = model(x).numpy()
    feed = x.numpy()
    sessions = {k: session(p, True) for k, p in paths.items()}
    errors: dict[str, float] = {}
    for k in ("fastonnx", "official"):
        fused = sessions[k].run(None, {sessions[k].get_inputs()[0].name: feed})[0]
        plain = session(paths[k], False)
        unfused = plain.run(None, {plain.get_inputs()[0].name: feed})[0]
        errors[f"{k} fused"] = float(np.abs(fused - expected).max())
        errors[f"{k} unfused"] = float(np.abs(unfused - expected).max())
    errors["fp32 file vs quantized torch"] = float(
        np.abs(sessions["fp32"].run(None, {sessions["fp32"].get_inputs()[0].name: feed})[0] - expected).max()
    )
    errors["float torch vs quantized torch"] = float(np.abs(float_out - expected).max())
    names = list(sessions)
    feeds = {k: {s.get_inputs()[0].name: feed} for k, s in sessions.items()}
    for k in names:  # warm-up
        for _ in range(20):
            sessions[k].run(None, feeds[k])
    times: dict[str, list[float]] = {k: [] for k in names}
    for r in range(runs):
        for k in names[r % 3 :] + names[: r % 3]:  # the order rotates: no file always runs first
            t0 = time.perf_counter()
            sessions[k].run(None, feeds[k])
            times[k].append(time.perf_counter() - t0)
    return {
        "name": name,
        "shape": shape,
        "ms": {k: ledger.median(v) * 1e3 for k, v in times.items()},
        # the official exporter writes its weights to a .data file beside the .onnx
        "kib": {
            k: sum(os.path.getsize(f) for f in (p, p + ".data") if os.path.exists(f)) / 1024
            for k, p in paths.items()
        },
        "errors": errors,
        "scale": float(np.abs(expected).max()),
    }


def report(rows: list[dict[str, Any]], runs: int, load: tuple[float, float]) -> str:
    latency = [
        [
            r["name"],
            "x".join(map(str, r["shape"])),
            f"{r['ms']['fp32']:.3f}",
            f"{r['ms']['fastonnx']:.3f}",
            f"{r['ms']['official']:.3f}",
            f"{r['ms']['fastonnx'] / r['ms']['official']:.2f}",
            f"{r['kib']['fp32']:.0f} / {r['kib']['fastonnx']:.0f} / {r['kib']['official']:.0f}",
        ]
        for r in rows
    ]
    errors = [
        [
            r["name"],
            f"{r['scale']:.3f}",
            f"{r['errors']['fastonnx unfused']:.2e}",
            f"{r['errors']['fastonnx fused']:.2e}",
            f"{r['errors']['official unfused']:.2e}",
            f"{r['errors']['official fused']:.2e}",
            f"{r['errors']['float torch vs quantized torch']:.2e}",
        ]
        for r in rows
    ]
    return "\n".join(
        [
            "## Quantized models in onnxruntime (benches/quantized_latency.py)",
            "",
            f"{ledger.machine()}; load average {load[0]:.1f} at the start, {load[1]:.1f} at the end.",
            "Models quantized with torchao's PT2E flow (X86InductorQuantizer, 8 calibration batches,",
            "convert_pt2e). One onnxruntime session per file, 1 thread, default optimization level (the QDQ",
            f"fusions on: QLinearConv), medians of {runs} single calls per file, alternated (the order rotates",
            "every round) after 20 warm-up calls. fp32: fastonnx's export of the float model; fastonnx /",
            "official: the quantized model by fastonnx.to_onnx and by torch.onnx.export(dynamo=True).",
            "",
            ledger.table(
                [
                    "model",
                    "input",
                    "fp32 ms",
                    "fastonnx QDQ ms",
                    "official QDQ ms",
                    "fastonnx / official",
                    "KiB with .data (fp32 / fastonnx / official)",
                ],
                latency,
            ),
            "",
            "Largest absolute output error against the converted torch model (reported, not gated): with",
            "onnxruntime's optimizations off (the files' own QuantizeLinear / DequantizeLinear) and on (its",
            "fused integer kernels, which round differently on CPUs without VNNI); the last column is how far",
            "the float model is from the quantized one.",
            "",
            ledger.table(
                [
                    "model",
                    "largest output",
                    "fastonnx, unfused",
                    "fastonnx, fused",
                    "official, unfused",
                    "official, fused",
                    "float vs quantized torch",
                ],
                errors,
            ),
        ]
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated: " + ", ".join(MODELS))
    p.add_argument("--runs", type=int, default=300)
    p.add_argument("--no-ledger", action="store_true", help="print only, leave docs/benchmarks.md alone")
    a = p.parse_args()
    start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as folder:
        rows = [measure(name, a.runs, folder) for name in a.models.split(",")]
    text = report(rows, a.runs, (start, os.getloadavg()[0]))
    print(text)
    if not a.no_ledger:
        ledger.write_section("quantized_latency", text)


if __name__ == "__main__":
    main()
