"""What value_info costs: to_onnx with value_info=True (the default) and value_info=False on the Llama
ladder of benches/compare.py, same process, same ExportedProgram, runs alternated (which goes first
switches every run), medians of --runs. Conversion time is to_onnx's wall time from the ExportedProgram
to the written file (convert + optimize + write), weights in a .data file (the .onnx then holds the graph
only, the form where value_info weighs most) and inline (the default under 2 GiB). The budget is +2% of
the conversion time. Prints the cost as the ratio of the medians and as the median of the paired runs'
ratios; regenerates its section of docs/benchmarks.md.

    python benches/value_info_cost.py                          # 2x256,16x256,64x256,16x1024, 5 runs
    python benches/value_info_cost.py --ladder 2x256 --runs 3 --no-ledger
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Any

import onnx
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
import fastonnx
import ledger
from compare import llama, settle
from support.model_zoo import Logits

LADDER = ["2x256", "16x256", "64x256", "16x1024"]


def run(ep: Any, args: tuple[Any, ...], path: str, value_info: bool, external: bool) -> dict[str, float]:
    settle()
    c0, t0 = time.process_time(), time.perf_counter()
    result = fastonnx.to_onnx(ep, args, filename=path, external_data=external, value_info=value_info)
    total, cpu = time.perf_counter() - t0, time.process_time() - c0
    s = result.stats
    out = {
        "total": total,
        "cpu": cpu,
        "write": s["write_s"],
        "onnx_bytes": float(os.path.getsize(path)),
        "nodes": float(s["nodes"]),
    }
    del result
    for f in (path, path + ".data"):
        if os.path.exists(f):
            os.remove(f)
    return out


def value_infos(ep: Any, args: tuple[Any, ...]) -> tuple[int, int]:
    """(value_info entries, values the graph's nodes make but graph outputs, which ``output`` types):
    how much of the graph is typed."""
    graph = fastonnx.to_onnx(ep, args).model_proto.graph
    outputs = {o.name for o in graph.output}
    made = sum(1 for n in graph.node for o in n.output if o and o not in outputs)
    return len(graph.value_info), made


def graph_only_saves(layers: int, hidden: int, folder: str, saves: int) -> tuple[float, float]:
    """The value infos' own time, apart from the rest of an export: the rung's model built on the meta
    device (its weights deferred: the data file is holes, nothing is written) without node metadata
    (which would make the .onnx megabytes and a save's time; the values' names and types are the same),
    exported once, then saved ``saves`` times with the builder's value_info on and off, alternated; the
    fastest save of each (a save is a few ms: the fastest is the one no other process interrupted).
    The meta graph has a few more nodes than the real one (nothing of a meta tensor folds): an upper
    bound. Returns (on, off) seconds."""
    with torch.device("meta"):
        model = Logits(llama(layers, hidden))
    args = (torch.zeros(2, 32, dtype=torch.int64, device="meta"),) * 2
    path = os.path.join(folder, "meta.onnx")
    result = fastonnx.to_onnx(model, args, filename=path, metadata=False)
    best = {True: float("inf"), False: float("inf")}
    for i in range(saves):
        for flag in (True, False) if i % 2 == 0 else (False, True):
            result._builder.value_info = flag
            t0 = time.perf_counter()
            result.save(path, external_data=True)
            best[flag] = min(best[flag], time.perf_counter() - t0)
    for f in (path, path + ".data"):
        os.remove(f)
    return best[True], best[False]


def measure(name: str, runs: int, saves: int, folder: str) -> list[dict[str, Any]]:
    layers, hidden = (int(v) for v in name.split("x"))
    model = Logits(llama(layers, hidden))
    args = (torch.randint(0, 32000, (2, 32)), torch.ones(2, 32, dtype=torch.int64))
    ep = torch.export.export(model, args, strict=False)
    path = os.path.join(folder, "m.onnx")
    typed, made = value_infos(ep, args)
    own = graph_only_saves(layers, hidden, folder, saves)
    out = []
    for external in (True, False):
        form = ".data file" if external else "inline"
        rows: dict[bool, list[dict[str, float]]] = {True: [], False: []}
        run(ep, args, path, True, external)  # warm-up: converter families imported, caches filled
        for i in range(runs):
            for flag in (True, False) if i % 2 == 0 else (False, True):
                rows[flag].append(run(ep, args, path, flag, external))
            on, off = rows[True][-1], rows[False][-1]
            print(
                f"  {name} {form} run {i + 1}/{runs}: value_info {on['total']:.4f}s ({on['cpu']:.4f}s CPU), "
                f"without {off['total']:.4f}s ({off['cpu']:.4f}s CPU)",
                flush=True,
            )
        med = {flag: {k: ledger.median([r[k] for r in rs]) for k in rs[0]} for flag, rs in rows.items()}
        # each pair of neighbouring runs' cost, then their median: a slow spell of the machine moves
        # both runs of a pair, not the difference of the medians
        paired = {
            k: ledger.median([(a[k] - b[k]) / b[k] for a, b in zip(rows[True], rows[False])])
            for k in ("total", "cpu")
        }
        fastest = min(r["total"] for r in rows[False])
        out.append(
            {
                "name": name,
                "form": form,
                "on": med[True],
                "off": med[False],
                "paired": paired,
                "typed": (typed, made),
                "own": own,
                "fastest": fastest,
            }
        )
    return out


def report(rows: list[dict[str, Any]], runs: int, saves: int, load: tuple[float, float]) -> str:
    def pct(on: float, off: float) -> str:
        return f"{100 * (on - off) / off:+.1f}%"

    table = []
    for r in rows:
        on, off = r["on"], r["off"]
        typed, made = r["typed"]
        own_on, own_off = r["own"]
        table.append(
            [
                r["name"],
                r["form"],
                int(on["nodes"]),
                f"{typed} / {made}",
                f"{off['total']:.4f} / {on['total']:.4f}",
                pct(on["total"], off["total"]),
                f"{100 * r['paired']['total']:+.1f}%",
                f"{100 * r['paired']['cpu']:+.1f}%",
                f"{(own_on - own_off) * 1000:.2f}",
                f"{100 * (own_on - own_off) / r['fastest']:+.2f}%",
                f"{off['onnx_bytes'] / 1024:.0f} / {on['onnx_bytes'] / 1024:.0f}",
                pct(on["onnx_bytes"], off["onnx_bytes"]),
            ]
        )
    headers = [
        "config (layers x hidden)",
        "weights",
        "nodes",
        "value_info entries / values made (graph outputs aside)",
        "to_onnx s (off / on)",
        "time cost (of the medians)",
        "time cost (median of pairs)",
        "CPU time cost (median of pairs)",
        "value infos' own ms (graph-only saves)",
        "own ms / fastest to_onnx",
        ".onnx KiB (off / on)",
        "size cost",
    ]
    return "\n".join(
        [
            "## Cost of value_info (benches/value_info_cost.py)",
            "",
            f"{ledger.machine()}; onnx {onnx.__version__}; load average {load[0]:.1f} at the start, {load[1]:.1f}",
            f"at the end; medians of {runs} alternated runs per setting, the same ExportedProgram. to_onnx",
            "from the ExportedProgram to the written file, weights in a .data file (the .onnx holds the",
            "graph only) or inline (to_onnx's default under 2 GiB). The",
            "time cost is given as the difference of the medians, as the median of the costs of each pair of",
            "neighbouring runs (with and without), which a slow spell of the machine moves less, and as that",
            "median for the CPU time (every thread's, time.process_time), which waiting for a busy core does",
            "not move. A cost of a few tenths of a percent is below what wall times resolve on a shared",
            "machine: the value infos' own time is also measured apart, as the difference between the",
            f"fastest of {saves} saves with and without them of the rung's graph exported from the meta device",
            "(weights deferred: no weight is written; no node metadata, which leaves the values as they are),",
            "and given as a share of the fastest to_onnx run (value_info=False) of its row.",
            "The budget is +2% on time. The value infos are encoded by the Rust writer straight from the",
            "types the builder holds, completed by one inference walk over the model before writing",
            "(rust/core/src/infer: the values converters and passes add that torch recorded nothing for),",
            "one entry per value a node makes, graph outputs excepted (writer/value_info.rs), with the",
            "graph's other fields after the nodes, before the first byte is written; no Python call per",
            "value. The own time includes the inference walk.",
            "",
            ledger.table(headers, table),
        ]
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ladder", default=",".join(LADDER), help="comma-separated LAYERSxHIDDEN configs")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--saves", type=int, default=100, help="graph-only saves per setting (the own time)")
    p.add_argument("--no-ledger", action="store_true", help="print only, leave docs/benchmarks.md alone")
    a = p.parse_args()
    rows = []
    start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as folder:
        for name in a.ladder.split(","):
            rows.extend(measure(name, a.runs, a.saves, folder))
    text = report(rows, a.runs, a.saves, (start, os.getloadavg()[0]))
    print(text)
    if not a.no_ledger:
        ledger.write_section("value_info_cost", text)


if __name__ == "__main__":
    main()
