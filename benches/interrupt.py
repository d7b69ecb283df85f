"""How fast an export stops, and what durable=True costs. Regenerates its section of docs/benchmarks.md.

Latency: an export runs in a subprocess; SIGINT is sent during one stage and the child reports (wall
clock, same machine) when the KeyboardInterrupt reached its top level; also the time until the process
had exited. Stages:
- capture: torch.export of a chain of CHAIN ReLUs, signalled 0.5 s in;
- convert: the same chain's ExportedProgram, each ReLU converted by a custom converter that computes
  for 1 ms in Python (a large graph's conversion, made long without a huge capture), signalled 0.5 s in;
- write: 2 GiB of zero weights (tests/zeros_export.py), signalled once the data file has bytes.

Durable: to_onnx(ep, filename, external_data=True) with durable=False and durable=True, alternated, on
the Llama ladder of benches/compare.py; the page cache is flushed (os.sync) before each run.

    python benches/interrupt.py                       # latency x5, durable on the whole ladder x3
    python benches/interrupt.py --ladder 2x256,16x256 --runs 2 --latency-runs 3
"""

from __future__ import annotations

import argparse
import gc
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))

CHAIN = 3000
WRITE_BYTES = 2 << 30
# idle: a process that ran one tiny torch.export and waits; its exit time is torch's own teardown
STAGES = ["idle", "capture", "convert", "write"]


# ---- the child: one export, interrupted -------------------------------------------------------------
def chain_model() -> Any:
    import torch

    class Chain(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for _ in range(CHAIN):
                x = torch.relu(x)
            return x

    return Chain()


def busy_relu(ctx: Any, x: Any) -> str:
    end = time.perf_counter() + 0.001
    while time.perf_counter() < end:
        pass
    return str(ctx.op("Relu", x))


def child(stage: str, folder: str) -> None:
    import torch

    import fastonnx

    x = torch.randn(4)
    try:
        if stage == "idle":
            torch.export.export(torch.nn.ReLU(), (x,), strict=False)  # torch's exit grows once it has run
            print("started", flush=True)
            time.sleep(600)
        elif stage == "capture":
            print("started", flush=True)
            fastonnx.to_onnx(chain_model(), (x,))
        elif stage == "convert":
            ep = torch.export.export(chain_model(), (x,), strict=False)
            print("started", flush=True)
            fastonnx.to_onnx(ep, (x,), custom_converters={torch.ops.aten.relu.default: busy_relu})
        else:
            from zeros_export import Zeros

            ep = torch.export.export(Zeros(WRITE_BYTES).eval(), (torch.ones(1),), strict=False)
            print("started", flush=True)
            fastonnx.to_onnx(
                ep, (torch.ones(1),), filename=f"{folder}/m.onnx", external_data=True, optimize=False
            )
        print("finished", flush=True)
    except KeyboardInterrupt:
        print(f"interrupted {time.time():.6f}", flush=True)
        raise


def latency(stage: str, folder: str) -> dict[str, float]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.join(ROOT, "python"), env.get("PYTHONPATH")) if p)
    proc = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--child", stage, folder],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == "started", line + proc.communicate()[1]
    if stage == "write":
        while not any(
            n.startswith("m.onnx.data.tmp-") and os.path.getsize(os.path.join(folder, n)) > 0
            for n in os.listdir(folder)
        ):
            time.sleep(0.002)
    elif stage != "idle":
        time.sleep(0.5)
    sent = time.time()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate()
    ended = time.time()
    marks = [ln for ln in out.splitlines() if ln.startswith("interrupted ")]
    assert marks and "finished" not in out, out + err
    assert sorted(os.listdir(folder)) == [], os.listdir(folder)
    return {"stopped": float(marks[0].split()[1]) - sent, "exited": ended - sent}


# ---- durable=True on the Llama ladder ---------------------------------------------------------------
def durable_cost(name: str, runs: int, folder: str) -> dict[str, Any]:
    import torch

    import fastonnx
    from compare import llama, settle, weights_bytes
    from support.model_zoo import Logits

    layers, hidden = (int(v) for v in name.split("x"))
    model = Logits(llama(layers, hidden))
    ids = torch.randint(0, 32000, (2, 32))
    mask = torch.ones(2, 32, dtype=torch.int64)
    ep = torch.export.export(model, (ids, mask), strict=False)
    path = os.path.join(folder, "m.onnx")
    times: dict[bool, list[float]] = {False: [], True: []}
    for i in range(runs):
        for durable in (False, True) if i % 2 == 0 else (True, False):
            settle()
            result = fastonnx.to_onnx(ep, (ids, mask), filename=path, external_data=True, durable=durable)
            times[durable].append(result.stats["write_s"])
            del result
            for f in (path, path + ".data"):
                os.remove(f)
        print(
            f"  {name} run {i + 1}/{runs}: {times[False][-1]:.2f}s / durable {times[True][-1]:.2f}s",
            flush=True,
        )
    return {"name": name, "weights": weights_bytes(model), "plain": times[False], "durable": times[True]}


def fsync_yardstick(folder: str) -> tuple[float, float]:
    """Seconds to write 1 GiB with write() (no fsync), then to fsync it."""
    from compare import settle

    piece = os.urandom(1 << 20)
    path = os.path.join(folder, "yardstick.bin")
    settle()
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        for _ in range(1024):
            f.write(piece)
        f.flush()
        t1 = time.perf_counter()
        os.fsync(f.fileno())
        t2 = time.perf_counter()
    os.remove(path)
    return t1 - t0, t2 - t1


def report(
    lat: dict[str, list[dict[str, float]]],
    lat_runs: int,
    rows: list[dict[str, Any]],
    runs: int,
    yardstick: tuple[float, float],
) -> str:
    import ledger

    def ms(xs: list[float]) -> str:
        return f"{ledger.median(xs) * 1000:.0f} (max {max(xs) * 1000:.0f})"

    lat_rows = [
        [stage, ms([r["stopped"] for r in rs]), ms([r["exited"] for r in rs])] for stage, rs in lat.items()
    ]
    dur_rows = []
    for r in rows:
        plain, durable = ledger.median(r["plain"]), ledger.median(r["durable"])
        dur_rows.append(
            [
                r["name"],
                f"{r['weights'] / (1 << 20):.0f}",
                f"{plain:.2f}",
                f"{durable:.2f}",
                f"{durable - plain:+.2f} s ({durable / plain:.2f}x)" if plain > 0 else "-",
            ]
        )
    return "\n".join(
        [
            "## Stopping and durable writes (benches/interrupt.py)",
            "",
            f"Machine: {ledger.machine()}.",
            "",
            f"SIGINT to KeyboardInterrupt at the top of the exporting process, and to the process's exit "
            f"(median of {lat_runs}, ms). capture: torch.export of {CHAIN} ReLUs; convert: {CHAIN} nodes at "
            f"1 ms each (a custom converter computing in Python); write: {WRITE_BYTES >> 30} GiB of external "
            "data, signalled once the data file has bytes; idle: a process that ran one tiny torch.export "
            "and waits (its exit time is the interpreter's and torch's teardown, which any exit pays). "
            "Every run left the folder empty.",
            "",
            ledger.table(["stage", "to KeyboardInterrupt ms", "to exit ms"], lat_rows),
            "",
            f"durable=True on the Llama ladder of benches/compare.py: write stage in s, median of {runs} "
            "alternated runs, page cache flushed before each (the fsyncs then store this run's files only).",
            "",
            ledger.table(["layers x hidden", "weights MiB", "write s", "durable write s", "cost"], dur_rows),
            "",
            f"The disk's yardstick: 1 GiB written with write() in {yardstick[0]:.2f} s, then fsync() in "
            f"{yardstick[1]:.2f} s (the system writes back while the file is written, so an fsync at the "
            "end finds only the tail left to store).",
        ]
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--child", nargs=2, metavar=("STAGE", "FOLDER"), help=argparse.SUPPRESS)
    p.add_argument("--ladder", default="2x256,16x256,64x256,16x1024,16x2048")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--latency-runs", type=int, default=5)
    a = p.parse_args()
    if a.child:
        child(*a.child)
        return
    import ledger

    lat: dict[str, list[dict[str, float]]] = {}
    for stage in STAGES:
        lat[stage] = []
        for i in range(a.latency_runs):
            with tempfile.TemporaryDirectory(prefix="fastonnx-stop-") as folder:
                lat[stage].append(latency(stage, folder))
            print(f"  {stage} {i + 1}/{a.latency_runs}: {lat[stage][-1]}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="fastonnx-durable-") as folder:
        yardstick = fsync_yardstick(folder)
        for name in a.ladder.split(","):
            print(f"{name}: durable cost", flush=True)
            rows.append(durable_cost(name, a.runs, folder))
            gc.collect()
    text = report(lat, a.latency_runs, rows, a.runs, yardstick)
    ledger.write_section("interrupt", text)
    print(text)


if __name__ == "__main__":
    main()
