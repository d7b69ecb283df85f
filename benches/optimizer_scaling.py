"""The optimizer's own time against torch.export's, and how it grows with the graph.

For Llamas of 4, 16 and 64 layers (hidden 256) and the 16-layer hidden-1024 one: torch.export once,
then fastonnx's conversion at each optimize setting, median of --runs runs, no file written (the
optimizer's time does not depend on the weights' bytes). Reports optimize seconds, its share of
torch.export's time, and microseconds per node of the converted graph (flat when it grows linearly).
Regenerates its section of docs/benchmarks.md.

    python benches/optimizer_scaling.py
    python benches/optimizer_scaling.py --runs 3 --opset 23
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fastonnx
import ledger
from compare import llama

SIZES = ((4, 256), (16, 256), (64, 256), (16, 1024))
LEVELS = (True, "onnxruntime")


def measure(layers: int, hidden: int, runs: int, opset: int) -> dict[str, Any]:
    model = llama(layers, hidden)
    args = (torch.randint(0, 32000, (1, 32)),)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        ep = torch.export.export(model, args, strict=False)
        export_s = time.perf_counter() - t0
    nodes = fastonnx.to_onnx(ep, args, opset=opset, optimize=False).stats["nodes"]
    row: dict[str, Any] = {"name": f"llama {layers}x{hidden}", "export": export_s, "nodes": nodes}
    for level in LEVELS:
        times = [
            fastonnx.to_onnx(ep, args, opset=opset, optimize=level).stats["optimize_s"] for _ in range(runs)
        ]
        row[level] = ledger.median(times)
    return row


def report(rows: list[dict[str, Any]], runs: int, opset: int) -> str:
    body = []
    for r in rows:
        cells = [r["name"], r["nodes"], f"{r['export']:.2f}"]
        for level in LEVELS:
            cells += [
                f"{r[level] * 1e3:.1f}",
                f"{100 * r[level] / r['export']:.2f}%",
                f"{1e6 * r[level] / r['nodes']:.1f}",
            ]
        body.append(cells)
    headers = ["model", "nodes converted", "torch.export s"]
    for name in ("True", '"onnxruntime"'):
        headers += [f"optimize={name} ms", "of export", "µs per node"]
    return "\n".join(
        [
            "## Optimizer time (benches/optimizer_scaling.py)",
            "",
            f"Machine: {ledger.machine()}. Opset {opset}, sequence 32, torch.export once per model, the "
            f"optimizer's median of {runs} conversions per setting (stats['optimize_s']).",
            "",
            ledger.table(headers, body),
        ]
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--opset", type=int, default=20)
    a = p.parse_args()
    rows = []
    for layers, hidden in SIZES:
        print(f"llama {layers}x{hidden} ...", flush=True)
        rows.append(measure(layers, hidden, a.runs, a.opset))
        print(f"  {rows[-1]}", flush=True)
    text = report(rows, a.runs, a.opset)
    ledger.write_section("optimizer_scaling", text)
    print(text)


if __name__ == "__main__":
    main()
