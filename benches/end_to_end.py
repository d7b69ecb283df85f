"""End to end as a one-model job runs: fastonnx.to_onnx(module) against torch.onnx's two exporters.

Each export runs in a fresh process: torch and the model's library are imported and the model is built
first (not timed); then the exporter's import and its export of the module to a file are timed, and the
file is checked in onnxruntime against eager PyTorch (not timed; a mismatch fails the row). Exporters:
``fastonnx`` (``fastonnx.to_onnx(module, args, filename=...)``, its default capture="auto": the real-tensor
trace for these static-shape models; a row fails if it fell back to torch.export), ``fastonnx_export``
(the same with ``capture="export"``: torch.export, the default before the real-tensor trace), ``torchscript``
(``torch.onnx.export(..., dynamo=False)``, the tracer that tools such as ultralytics call) and ``dynamo``
(``torch.onnx.export(..., dynamo=True)``, the official torch.export-based exporter). Processes alternate
between exporters round by round; figures are medians. fastonnx's modules are byte-compiled first, as a
wheel install does.

    python benches/end_to_end.py                          # every model, 2 rounds
    python benches/end_to_end.py --models resnet18,llama --runs 3 --no-ledger
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))

EXPORTERS = ("fastonnx", "fastonnx_export", "torchscript", "dynamo")
OPSET = 18  # the TorchScript exporter stops at 20; one opset for all three keeps the work comparable


def _builders() -> dict[str, Callable[[], tuple[Any, tuple[Any, ...]]]]:
    import torch

    def resnet18() -> tuple[Any, tuple[Any, ...]]:
        import torchvision

        torch.manual_seed(0)
        return torchvision.models.resnet18(weights=None), (torch.randn(1, 3, 224, 224),)

    def mobilenetv3() -> tuple[Any, tuple[Any, ...]]:
        import timm

        torch.manual_seed(0)
        return timm.create_model("mobilenetv3_large_100", pretrained=False), (torch.randn(1, 3, 224, 224),)

    def text() -> tuple[Any, ...]:
        g = torch.Generator().manual_seed(1)
        return torch.randint(0, 256, (2, 32), generator=g), torch.ones(2, 32, dtype=torch.int64)

    def llama() -> tuple[Any, tuple[Any, ...]]:
        from support.model_zoo import Logits, tiny_llama

        return Logits(tiny_llama(layers=2, hidden=64)), text()

    def bert() -> tuple[Any, tuple[Any, ...]]:
        from transformers import BertConfig, BertModel

        from support.model_zoo import Field

        torch.manual_seed(0)  # BERT base's width, 2 of its 12 layers
        return Field(BertModel(BertConfig(num_hidden_layers=2)).eval(), "last_hidden_state"), text()

    def ladder() -> tuple[Any, tuple[Any, ...]]:
        # the first rung of compare.py's Llama ladder, from model_zoo: compare.py imports fastonnx,
        # which would hide fastonnx's import from the timing
        from support.model_zoo import Logits, ladder_llama

        torch.manual_seed(0)
        model = ladder_llama(2, 256)
        ids = torch.randint(0, 32000, (2, 32))
        return Logits(model), (ids, torch.ones(2, 32, dtype=torch.int64))

    return {
        "resnet18": resnet18,
        "mobilenetv3_large_100": mobilenetv3,
        "llama": llama,
        "bert": bert,
        "llama_2x256": ladder,
    }


def worker(name: str, exporter: str) -> None:
    """One job: build the model, import the exporter and export to a file (timed), check in onnxruntime."""
    import numpy as np
    import torch

    model, args = _builders()[name]()
    model = model.eval()
    with torch.no_grad():
        expected = model(*args)
    # the exporter's import is part of the job: building the model must not have done it
    assert "fastonnx" not in sys.modules, f"building {name} imported fastonnx"
    with tempfile.TemporaryDirectory(dir=ROOT) as folder:
        path = os.path.join(folder, "model.onnx")
        t0 = time.perf_counter()
        if exporter in ("fastonnx", "fastonnx_export"):
            import fastonnx

            t1 = time.perf_counter()
            if exporter == "fastonnx":  # the default, as a job calls it
                result = fastonnx.to_onnx(model, args, filename=path, opset=OPSET)
                assert result.stats["capture"] == "trace", result.stats.get("trace_refused")
            else:
                result = fastonnx.to_onnx(model, args, filename=path, opset=OPSET, capture="export")
                assert result.stats["capture"] == "export"
        else:
            import torch.onnx

            t1 = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation warning
                torch.onnx.export(model, args, path, dynamo=exporter == "dynamo", opset_version=OPSET)
        end = time.perf_counter()

        import onnxruntime

        session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        feeds = {i.name: a.numpy() for i, a in zip(session.get_inputs(), args, strict=True)}
        got = session.run(None, feeds)[0]
        torch.testing.assert_close(torch.from_numpy(np.asarray(got)), expected, rtol=1e-3, atol=1e-4)
    print(json.dumps({"name": name, "exporter": exporter, "import": t1 - t0, "export": end - t1}))


def _total(runs: list[dict[str, float]]) -> float | None:
    """Median of import + export over the runs, None when every run failed."""
    return statistics.median(r["import"] + r["export"] for r in runs) if runs else None


def _cell(runs: list[dict[str, float]]) -> str:
    total = _total(runs)
    if total is None:
        return "failed"
    return f"{total:.2f} s ({statistics.median(r['import'] for r in runs):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--models", help="comma-separated names (default: all)")
    parser.add_argument("--runs", type=int, default=2, help="fresh processes per model and exporter")
    parser.add_argument("--no-ledger", action="store_true", help="do not rewrite docs/benchmarks.md")
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker)
        return

    names = args.models.split(",") if args.models else list(_builders())
    compileall.compile_dir(os.path.join(ROOT, "python", "fastonnx"), quiet=1)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    rows = []
    for name in names:
        runs: dict[str, list[dict[str, float]]] = {e: [] for e in EXPORTERS}
        failed: dict[str, str] = {}
        for _ in range(args.runs):
            for exporter in EXPORTERS:  # alternated: one process of each exporter per round
                if exporter in failed:
                    continue
                out = subprocess.run(
                    [sys.executable, __file__, "--worker", name, exporter],
                    capture_output=True,
                    text=True,
                    env=env,
                )
                if out.returncode != 0:
                    failed[exporter] = out.stderr.strip().splitlines()[-1][:120] if out.stderr else "failed"
                    print(f"{name} / {exporter}: failed\n{out.stderr[-2000:]}", file=sys.stderr)
                    continue
                runs[exporter].append(json.loads(out.stdout.strip().splitlines()[-1]))

        fast, export, ts, dyn = (_total(runs[e]) for e in EXPORTERS)
        row = (
            name,
            _cell(runs["fastonnx"]),
            _cell(runs["fastonnx_export"]),
            _cell(runs["torchscript"]),
            _cell(runs["dynamo"]),
            f"{fast / ts:.2f}x" if fast and ts else "",
            f"{export / ts:.2f}x" if export and ts else "",
            f"{fast / dyn:.2f}x" if fast and dyn else "",
        )
        rows.append(row)
        print(" | ".join(row), flush=True)

    if not args.no_ledger and rows:
        import ledger

        over = [r[0] for r in rows if r[5] and float(r[5].rstrip("x")) > 1.0]
        over_export = [r[0] for r in rows if r[6] and float(r[6].rstrip("x")) > 1.0]
        body = "\n".join(
            [
                "## End to end: fastonnx.to_onnx(module) against torch.onnx's exporters ",
                "",
                f"`python benches/end_to_end.py --runs {args.runs}`; {ledger.machine()}.",
                "One fresh process per export (torch, the model library and the model built beforehand, not",
                "timed); timed: the exporter's import (in parentheses) plus the export of the module to a file",
                f"at opset {OPSET}. Each file is then checked in onnxruntime against eager PyTorch. Medians over",
                "the rounds; the exporters alternate round by round. fastonnx = `to_onnx(module, args,",
                "filename=...)` as a job calls it (its default capture, 'auto', traces these static-shape",
                'models: README "Faster capture for static shapes"), fastonnx export = the same with',
                '`capture="export"` (torch.export, the default before the real-tensor trace), TorchScript =',
                "`torch.onnx.export(..., dynamo=False)`, dynamo = `torch.onnx.export(..., dynamo=True)`.",
                "",
                ledger.table(
                    [
                        "model",
                        "fastonnx",
                        "fastonnx export",
                        "TorchScript",
                        "dynamo",
                        "fastonnx / TorchScript",
                        "export / TorchScript",
                        "fastonnx / dynamo",
                    ],
                    rows,
                ),
                "",
                f"Models over the 1.0x TorchScript target: {', '.join(over) if over else 'none'} "
                f"(the default); {', '.join(over_export) if over_export else 'none'} (capture='export').",
            ]
        )
        ledger.write_section("end_to_end", body)


if __name__ == "__main__":
    main()
