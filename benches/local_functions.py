"""export_modules_as_functions={LlamaDecoderLayer} against the flat export on the Llama ladder.

For each rung the model is captured once; the flat and the function exports of that ExportedProgram
alternate (--runs each; external data, optimize=True). Reported per variant: file size (.onnx + .data),
conversion time (to_onnx of the program: convert + optimize + write, median), the main graph's node
count, and onnxruntime's latency on the (2, 32) prompt (one thread, median of --iters runs after a
warm-up; the two sessions alternate). The outputs of the two files are checked equal. Regenerates its
section of docs/benchmarks.md.

    python benches/local_functions.py                       # 16x256 and 64x256
    python benches/local_functions.py --ladder 16x256 --runs 3 --iters 30
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
import fastonnx
import ledger
from support.model_zoo import Logits
from support.model_zoo import ladder_llama as llama

LADDER = ["16x256", "64x256"]
VARIANTS = ("flat", "functions")


def export(ep: Any, args: tuple, path: str, variant: str) -> dict[str, Any]:
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    selection = {LlamaDecoderLayer} if variant == "functions" else False
    t0 = time.perf_counter()
    result = fastonnx.to_onnx(
        ep, args, filename=path, external_data=True, export_modules_as_functions=selection
    )
    total = time.perf_counter() - t0
    size = sum(os.path.getsize(f) for f in (path, path + ".data") if os.path.exists(f))
    functions = len(result.stats.get("functions", {}).get("functions", []))
    return {
        "s": total,
        "bytes": size,
        "onnx_bytes": os.path.getsize(path),
        "nodes": result.stats["nodes"],
        "functions": functions,
    }


def latency(paths: dict[str, str], feeds: dict[str, Any], iters: int) -> tuple[dict[str, float], float]:
    """Median seconds per run of each file's session, the sessions alternating; and the largest
    difference between their outputs."""
    import onnxruntime

    so = onnxruntime.SessionOptions()
    so.intra_op_num_threads = 1
    sessions = {
        v: onnxruntime.InferenceSession(p, so, providers=["CPUExecutionProvider"]) for v, p in paths.items()
    }
    outs = {v: s.run(None, feeds)[0] for v, s in sessions.items()}  # warm-up
    diff = float(abs(outs["flat"] - outs["functions"]).max())
    times: dict[str, list[float]] = {v: [] for v in sessions}
    for i in range(iters):
        order = list(sessions) if i % 2 == 0 else list(reversed(sessions))
        for v in order:
            t0 = time.perf_counter()
            sessions[v].run(None, feeds)
            times[v].append(time.perf_counter() - t0)
    return {v: ledger.median(t) for v, t in times.items()}, diff


def measure(name: str, runs: int, iters: int, folder: str) -> dict[str, Any]:
    layers, hidden = (int(v) for v in name.split("x"))
    model = Logits(llama(layers, hidden))
    ids = torch.randint(0, 32000, (2, 32))
    mask = torch.ones(2, 32, dtype=torch.int64)
    ep = torch.export.export(model, (ids, mask), strict=False)
    rows: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    paths = {v: os.path.join(folder, f"{name}-{v}.onnx") for v in VARIANTS}
    for i in range(runs):
        for v in VARIANTS if i % 2 == 0 else tuple(reversed(VARIANTS)):
            rows[v].append(export(ep, (ids, mask), paths[v], v))
    lat, diff = latency(paths, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}, iters)
    for p in paths.values():
        for f in (p, p + ".data"):
            if os.path.exists(f):
                os.remove(f)
    out: dict[str, Any] = {"name": name, "diff": diff}
    for v in VARIANTS:
        last = rows[v][-1]
        out[v] = {
            "s": ledger.median([r["s"] for r in rows[v]]),
            "bytes": last["bytes"],
            "onnx_bytes": last["onnx_bytes"],
            "nodes": last["nodes"],
            "functions": last["functions"],
            "latency": lat[v],
        }
    return out


def section(results: list[dict[str, Any]], runs: int, iters: int, stamp: str) -> str:
    mib = 1 << 20
    rows = []
    for r in results:
        for v in VARIANTS:
            x = r[v]
            rows.append(
                [
                    r["name"],
                    v,
                    f"{x['bytes'] / mib:.1f} ({x['onnx_bytes'] / 1024:.0f} KiB .onnx)",
                    f"{x['s']:.2f}",
                    x["nodes"],
                    x["functions"],
                    f"{x['latency'] * 1e3:.2f}",
                ]
            )
        f, g = r["flat"], r["functions"]
        rows.append(
            [
                r["name"],
                "functions / flat",
                f"{g['bytes'] / f['bytes']:.3f}x ({g['onnx_bytes'] / f['onnx_bytes']:.2f}x .onnx)",
                f"{g['s'] / f['s']:.2f}x",
                f"{g['nodes'] / f['nodes']:.3f}x",
                "",
                f"{g['latency'] / f['latency']:.2f}x (outputs differ by {r['diff']:.1e} at most)",
            ]
        )
    lines = [
        "## Modules as local functions: Llama ladder (benches/local_functions.py)",
        "",
        f"Machine: {stamp}. `export_modules_as_functions={{LlamaDecoderLayer}}` against the "
        f"flat export of the same ExportedProgram (optimize=True, external data); conversion is "
        f"to_onnx of the program (convert + optimize + write), median of {runs} alternated runs. "
        f"Latency: onnxruntime, one thread, input (2, 32), median of {iters} alternated runs "
        "(onnxruntime inlines the functions when it loads the model). Nodes: the main graph's.",
        "",
        ledger.table(
            [
                "layers x hidden",
                "variant",
                "file MiB",
                "conversion s",
                "main-graph nodes",
                "functions",
                "ms / run",
            ],
            rows,
        ),
    ]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ladder", default=",".join(LADDER), help="comma-separated LAYERSxHIDDEN configs")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--no-ledger", action="store_true", help="print the section without writing it")
    a = p.parse_args()
    stamp = ledger.machine()  # the commit measured: taken before the runs
    folder = tempfile.mkdtemp(prefix="fastonnx-functions-")
    try:
        results = [measure(name, a.runs, a.iters, folder) for name in a.ladder.split(",")]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    text = section(results, a.runs, a.iters, stamp)
    print(text)
    if not a.no_ledger:
        ledger.write_section("local_functions", text)


if __name__ == "__main__":
    main()
