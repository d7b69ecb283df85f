"""fastonnx against torch.onnx.export(dynamo=True) on a ladder of Llama configs, side by side.

Both convert the same ExportedProgram to a file with external data; the runs alternate, and each figure
is the median of --runs runs. W is one plain write() of the same weight bytes into the same folder
(no fsync): the disk's yardstick for the write stage. Before each timed stage the page cache is flushed
(os.sync, outside the timing), so that no stage pays for the writeback of another's files. Regenerates its section of docs/benchmarks.md.

    python benches/compare.py                      # the whole ladder (16x2048 takes several minutes)
    python benches/compare.py --ladder 2x256,16x256 --runs 3
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import sys
import tempfile
import time
import warnings
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
import fastonnx
import ledger
from support import memory
from support.model_zoo import Logits
from support.model_zoo import ladder_llama as llama

LADDER = ["2x256", "16x256", "64x256", "16x1024", "16x2048"]


def weights_bytes(model: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())


def plain_write(model: torch.nn.Module, folder: str) -> float:
    """W: the weights' bytes written once with write(), no fsync."""
    path = os.path.join(folder, "plain.bin")
    settle()
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        for t in model.state_dict().values():
            f.write(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy())
    dt = time.perf_counter() - t0
    os.remove(path)
    return dt


def settle() -> None:
    """Flush what earlier runs left dirty in the page cache, so that no write stage pays for another's."""
    gc.collect()
    os.sync()


def run_fastonnx(ep: Any, args: tuple, folder: str) -> dict[str, float]:
    path = os.path.join(folder, "fast.onnx")
    settle()
    rss = memory.reset_peak()
    t0 = time.perf_counter()
    result = fastonnx.to_onnx(ep, args, filename=path, external_data=True)
    total = time.perf_counter() - t0
    peak = memory.peak_since(rss)
    s = result.stats
    out = {
        "total": total,
        "translate": s["convert_s"],
        "optimize": s["optimize_s"],
        "write": s["write_s"],
        "peak": peak,
        "nodes": s["nodes"],
    }
    del result
    for f in (path, path + ".data"):
        if os.path.exists(f):
            os.remove(f)
    return out


def run_official(ep: Any, args: tuple, folder: str) -> dict[str, float]:
    path = os.path.join(folder, "official.onnx")
    settle()
    rss = memory.reset_peak()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        program = torch.onnx.export(ep, args, dynamo=True, optimize=False, external_data=True)
        t1 = time.perf_counter()
        program.optimize()
        t2 = time.perf_counter()
        program.save(path, external_data=True)
        t3 = time.perf_counter()
    peak = memory.peak_since(rss)
    del program
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder, exist_ok=True)
    return {"total": t3 - t0, "translate": t1 - t0, "optimize": t2 - t1, "write": t3 - t2, "peak": peak}


def measure(name: str, runs: int, folder: str) -> dict[str, Any]:
    layers, hidden = (int(v) for v in name.split("x"))
    model = Logits(llama(layers, hidden))
    ids = torch.randint(0, 32000, (2, 32))
    mask = torch.ones(2, 32, dtype=torch.int64)
    w_bytes = weights_bytes(model)
    exports, fast, official, plain = [], [], [], []
    ep = None
    for i in range(runs):
        t0 = time.perf_counter()
        ep = torch.export.export(model, (ids, mask), strict=False)
        exports.append(time.perf_counter() - t0)
        # alternate which goes first, so that neither always meets a warm or a cold cache
        order = [run_fastonnx, run_official] if i % 2 == 0 else [run_official, run_fastonnx]
        for fn in order:
            (fast if fn is run_fastonnx else official).append(fn(ep, (ids, mask), folder))
        plain.append(plain_write(model, folder))
        print(
            f"  {name} run {i + 1}/{runs}: fastonnx {fast[-1]['total']:.2f}s, official {official[-1]['total']:.2f}s",
            flush=True,
        )

    def med(rows: list[dict[str, float]], key: str) -> float:
        return ledger.median([r[key] for r in rows])

    return {
        "name": name,
        "params": sum(p.numel() for p in model.parameters()),
        "weights": w_bytes,
        "export": ledger.median(exports),
        "W": ledger.median(plain),
        "fast": {k: med(fast, k) for k in fast[0]},
        "official": {k: med(official, k) for k in official[0]},
    }


def report(rows: list[dict[str, Any]], runs: int) -> str:
    mib = 1 << 20
    speed = []
    for r in rows:
        f, o, e, w = r["fast"], r["official"], r["export"], r["W"]
        speed.append(
            [
                r["name"],
                f"{r['params'] / 1e6:.0f} M",
                f"{e:.2f}",
                f"{f['translate']:.2f} / {f['optimize']:.2f} / {f['write']:.2f}",
                f"{(f['total'] - w) / e:.1%}",
                f"{f['write'] / w:.2f}" if w > 0 else "-",
                f"{o['translate']:.2f} / {o['optimize']:.2f} / {o['write']:.2f}",
                f"{o['total'] / e:.1f}x",
                f"{o['total'] / f['total']:.1f}x",
                f"{f['peak'] / mib:.0f} ({f['peak'] / r['weights']:.1%})",
                f"{o['peak'] / mib:.0f} ({o['peak'] / r['weights']:.1%})",
            ]
        )
    lines = [
        "## Conversion speed: Llama ladder (benches/compare.py)",
        "",
        f"Machine: {ledger.machine()}. Median of {runs} alternated runs. Conversion = ExportedProgram → "
        "file with external data. W = one plain write() of the weights into the same folder.",
        "",
        ledger.table(
            [
                "layers x hidden",
                "params",
                "torch.export s",
                "fastonnx translate / optimize / write s",
                "(fastonnx - W) / export",
                "write / W",
                "official translate / optimize / save s",
                "official / export",
                "speed-up",
                "fastonnx extra peak MiB (of weights)",
                "official extra peak MiB (of weights)",
            ],
            speed,
        ),
    ]
    by_name = {r["name"]: r for r in rows}
    if "16x256" in by_name and "64x256" in by_name:
        ratio = by_name["64x256"]["fast"]["total"] / by_name["16x256"]["fast"]["total"]
        lines += [
            "",
            f"Linearity: 64x256 costs {ratio:.2f}x what 16x256 costs (4 times the layers; target <= 4.4x).",
        ]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ladder", default=",".join(LADDER), help="comma-separated LAYERSxHIDDEN configs")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--dir", default=None, help="folder for the files (default: a temporary folder)")
    a = p.parse_args()
    folder = a.dir or tempfile.mkdtemp(prefix="fastonnx-bench-")
    os.makedirs(folder, exist_ok=True)
    rows = []
    for name in a.ladder.split(","):
        print(f"{name}: building and measuring", flush=True)
        rows.append(measure(name, a.runs, folder))
        gc.collect()
    text = report(rows, a.runs)
    ledger.write_section("compare", text)
    print(text)


if __name__ == "__main__":
    main()
