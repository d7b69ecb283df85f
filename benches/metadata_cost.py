"""What node metadata and readable names cost: to_onnx with metadata=True and metadata=False on the Llama
ladder of benches/compare.py, same process, same ExportedProgram, runs alternated (which goes first
switches every run), medians of --runs. Conversion time is to_onnx's wall time from the ExportedProgram
to the written file (convert + optimize + write), with the weights in a .data file and inline (the
default under 2 GiB); the .onnx size is the graph file's. Regenerates its section of docs/benchmarks.md.

    python benches/metadata_cost.py                          # 2x256,16x256,64x256,16x1024, 5 runs
    python benches/metadata_cost.py --ladder 2x256 --runs 3
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
import fastonnx
import ledger
from compare import llama, settle
from support.model_zoo import Logits

LADDER = ["2x256", "16x256", "64x256", "16x1024"]


def run(ep: Any, args: tuple[Any, ...], path: str, metadata: bool, external: bool) -> dict[str, float]:
    settle()
    t0 = time.perf_counter()
    result = fastonnx.to_onnx(ep, args, filename=path, external_data=external, metadata=metadata)
    total = time.perf_counter() - t0
    s = result.stats
    out = {
        "total": total,
        "convert": s["convert_s"],
        "optimize": s["optimize_s"],
        "metadata": s.get("metadata_s", 0.0),
        "write": s["write_s"],
        "onnx_bytes": float(os.path.getsize(path)),
        "nodes": float(s["nodes"]),
    }
    del result
    for f in (path, path + ".data"):
        if os.path.exists(f):
            os.remove(f)
    return out


def measure(name: str, runs: int, folder: str) -> list[dict[str, Any]]:
    """One row per file form: weights in a .data file, and in the .onnx (to_onnx's default under 2 GiB)."""
    layers, hidden = (int(v) for v in name.split("x"))
    model = Logits(llama(layers, hidden))
    args = (torch.randint(0, 32000, (2, 32)), torch.ones(2, 32, dtype=torch.int64))
    ep = torch.export.export(model, args, strict=False)
    path = os.path.join(folder, "m.onnx")
    out = []
    for external in (True, False):
        form = ".data file" if external else "inline"
        rows: dict[bool, list[dict[str, float]]] = {True: [], False: []}
        run(ep, args, path, True, external)  # warm-up: converter families imported, caches filled
        for i in range(runs):
            for flag in (True, False) if i % 2 == 0 else (False, True):
                rows[flag].append(run(ep, args, path, flag, external))
            on, off = rows[True][-1]["total"], rows[False][-1]["total"]
            print(f"  {name} {form} run {i + 1}/{runs}: metadata {on:.3f}s, without {off:.3f}s", flush=True)
        med = {flag: {k: ledger.median([r[k] for r in rs]) for k in rs[0]} for flag, rs in rows.items()}
        # the cost of each pair of neighbouring runs, then their median: a slow spell of the machine
        # moves both runs of a pair, not the difference of the medians
        paired = ledger.median(
            [(a["total"] - b["total"]) / b["total"] for a, b in zip(rows[True], rows[False])]
        )
        out.append({"name": name, "form": form, "on": med[True], "off": med[False], "paired": paired})
    return out


def report(rows: list[dict[str, Any]], runs: int) -> str:
    def pct(on: float, off: float) -> str:
        return f"{100 * (on - off) / off:+.1f}%"

    table = []
    for r in rows:
        on, off = r["on"], r["off"]
        table.append(
            [
                r["name"],
                r["form"],
                int(on["nodes"]),
                f"{off['total']:.3f}",
                f"{on['total']:.3f}",
                pct(on["total"], off["total"]),
                f"{100 * r['paired']:+.1f}%",
                f"{off['convert']:.3f} / {on['convert']:.3f}",
                pct(on["convert"], off["convert"]),
                f"{on['metadata'] * 1000:.1f}",
                f"{off['write']:.3f} / {on['write']:.3f}",
                f"{off['onnx_bytes'] / 1024:.0f}",
                f"{on['onnx_bytes'] / 1024:.0f}",
                pct(on["onnx_bytes"], off["onnx_bytes"]),
            ]
        )
    headers = [
        "config (layers x hidden)",
        "weights",
        "nodes",
        "to_onnx s, metadata=False",
        "to_onnx s, metadata=True",
        "time cost (of the medians)",
        "time cost (median of pairs)",
        "convert stage s (off / on)",
        "convert cost",
        "metadata compose ms (beside the passes)",
        "write stage s (off / on)",
        ".onnx KiB, off",
        ".onnx KiB, on",
        "size cost",
    ]
    return "\n".join(
        [
            "## Cost of node metadata and readable names (benches/metadata_cost.py)",
            "",
            f"{ledger.machine()}; medians of {runs} alternated runs per setting, the same ExportedProgram;",
            "the time cost is given both as the difference of the medians and as the median of the costs of",
            "each pair of neighbouring runs (with and without), which a slow spell of the machine moves less.",
            "to_onnx from the ExportedProgram to the written file, weights in a .data file (the .onnx holds",
            "the graph only) or inline (to_onnx's default under 2 GiB); the weights are equal either way.",
            "The budget is +5% on time.",
            "The convert stage walks the FX graph (with metadata: it marks where each FX node's ONNX nodes",
            "start, and gives them their scopes in one call at the end); the metadata is composed alongside",
            "the passes (on a second thread, while they run on the calling one), the nodes named after them,",
            "and the .onnx file written alongside the .data file (each node's metadata encoded straight into",
            "it).",
            "",
            ledger.table(headers, table),
        ]
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ladder", default=",".join(LADDER), help="comma-separated LAYERSxHIDDEN configs")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--no-ledger", action="store_true", help="print only, leave docs/benchmarks.md alone")
    a = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for name in a.ladder.split(","):
            rows.extend(measure(name, a.runs, folder))
    text = report(rows, a.runs)
    print(text)
    if not a.no_ledger:
        ledger.write_section("metadata_cost", text)


if __name__ == "__main__":
    main()
