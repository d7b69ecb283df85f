"""Real clients of torch.onnx.export, timed through their default path and through fastonnx.

Each client is called exactly as a user calls it: ultralytics' ``YOLO(...).export(format="onnx")``
(which calls torch.onnx.export with ``dynamo=False``, then onnxslim) and timm's
``timm.utils.onnx.onnx_export`` (``use_dynamo=False`` by default; the ``use_dynamo=True`` row is its
other path, torch's dynamo exporter). "torch" is the call as it is, "fastonnx" the same call under
``fastonnx.patch_torch_onnx()``. Export time is the client's whole call (its own checks and
simplification included); latency is onnxruntime (CPU) on the file each path wrote. One untimed
warm-up per path first (imports, first-call caches), then --runs alternated runs; medians. Both files'
outputs are compared before timing (they must agree to 1e-4). Writes the "clients" section of
docs/benchmarks.md.

    python benches/clients.py              # every client, 3 runs
    python benches/clients.py --runs 5 --no-ledger
"""

from __future__ import annotations

import argparse
import atexit
import logging
import os
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

os.environ["YOLO_OFFLINE"] = "1"
if "YOLO_CONFIG_DIR" not in os.environ:
    # ultralytics writes its settings there: a folder of this process, removed when it exits
    _settings = tempfile.mkdtemp(prefix="fastonnx-yolo-settings-")
    atexit.register(shutil.rmtree, _settings, ignore_errors=True)
    os.environ["YOLO_CONFIG_DIR"] = _settings

import onnxruntime as ort
import torch

import fastonnx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ledger

# (name, builder) -> the builder returns (export(path) -> None, example input for latency)
Client = tuple[Callable[[str], None], torch.Tensor]


def ultralytics_detect(folder: str) -> Client:
    from ultralytics import YOLO
    from ultralytics.utils import LOGGER

    LOGGER.setLevel(logging.WARNING)
    torch.manual_seed(0)
    yolo = YOLO("yolo11n.yaml")

    def run(path: str) -> None:
        cwd = os.getcwd()
        os.chdir(folder)  # ultralytics writes yolo11n.onnx into the cwd
        try:
            out = yolo.export(format="onnx", imgsz=320, dynamic=False, simplify=True, verbose=False)
        finally:
            os.chdir(cwd)
        shutil.move(os.path.join(folder, out), path)

    return run, torch.rand(1, 3, 320, 320)


def timm_model(name: str, size: int, use_dynamo: bool) -> Callable[[str], Client]:
    def build(folder: str) -> Client:
        import timm
        from timm.utils.onnx import onnx_export

        model = timm.create_model(name, pretrained=False).eval()
        example = torch.randn(1, 3, size, size)

        def run(path: str) -> None:
            onnx_export(model, path, example_input=example, use_dynamo=use_dynamo, check=False)

        return run, example

    return build


CLIENTS: dict[str, Callable[[str], Client]] = {
    "ultralytics yolo11n detect 320": ultralytics_detect,
    "timm resnet18 224": timm_model("resnet18", 224, False),
    "timm mobilenetv3_small_100 224": timm_model("mobilenetv3_small_100", 224, False),
    "timm vit_tiny_patch16_224": timm_model("vit_tiny_patch16_224", 224, False),
    "timm resnet18 224 use_dynamo=True": timm_model("resnet18", 224, True),
}


class _Stages(logging.Handler):
    """Keeps the stage times of fastonnx's last export (its "capture ..., convert ..." log line)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.capture: list[float] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("fastonnx: capture") and isinstance(record.args, tuple):
            self.capture.append(float(record.args[0]))


STAGES = _Stages()


def export_once(run: Callable[[str], None], path: str, fast: bool) -> float:
    for leftover in (path, path + ".data"):
        if os.path.exists(leftover):
            os.remove(leftover)
    t0 = time.perf_counter()
    if fast:
        with fastonnx.patch_torch_onnx():
            run(path)
    else:
        run(path)
    return time.perf_counter() - t0


def zero_weight_bytes(path: str) -> int:
    """Bytes of the file's all-zero initializers (random inits that zero a BatchNorm scale make them)."""
    import onnx
    import onnx.numpy_helper

    model = onnx.load(path)
    arrays = (onnx.numpy_helper.to_array(t) for t in model.graph.initializer)
    return sum(a.nbytes for a in arrays if not a.any())


def latency(path: str, x: torch.Tensor, iters: int) -> list[float]:
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    feed = {sess.get_inputs()[0].name: x.numpy()}
    for _ in range(3):
        sess.run(None, feed)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        sess.run(None, feed)
        times.append(time.perf_counter() - t0)
    return times


def measure(name: str, build: Callable[[str], Client], runs: int, folder: str) -> dict[str, Any]:
    run, x = build(folder)
    paths = {"torch": os.path.join(folder, "torch.onnx"), "fastonnx": os.path.join(folder, "fastonnx.onnx")}
    first = {k: export_once(run, paths[k], k == "fastonnx") for k in paths}
    outs = {}
    for k, path in paths.items():
        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        outs[k] = torch.from_numpy(sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0])
    torch.testing.assert_close(outs["fastonnx"], outs["torch"], rtol=1e-4, atol=1e-4)
    STAGES.capture.clear()
    exports: dict[str, list[float]] = {k: [] for k in paths}
    lat: dict[str, list[float]] = {k: [] for k in paths}
    for i in range(runs):
        order = ["fastonnx", "torch"] if i % 2 == 0 else ["torch", "fastonnx"]
        for k in order:
            exports[k].append(export_once(run, paths[k], k == "fastonnx"))
        for k in order:
            lat[k] += latency(paths[k], x, 20)
        print(
            f"  {name} run {i + 1}/{runs}: export torch {exports['torch'][-1]:.2f}s, "
            f"fastonnx {exports['fastonnx'][-1]:.2f}s",
            flush=True,
        )
    zeros = {k: zero_weight_bytes(p) for k, p in paths.items()}
    sizes = {
        k: os.path.getsize(p) + (os.path.getsize(p + ".data") if os.path.exists(p + ".data") else 0)
        for k, p in paths.items()
    }
    for p in paths.values():
        for leftover in (p, p + ".data"):
            if os.path.exists(leftover):
                os.remove(leftover)
    return {
        "name": name,
        "first": first,
        "export": {k: ledger.median(v) for k, v in exports.items()},
        "latency": {k: ledger.median(v) for k, v in lat.items()},
        "size": sizes,
        "zeros": zeros,
        "capture": ledger.median(STAGES.capture) if STAGES.capture else float("nan"),
    }


def report(rows: list[dict[str, Any]], runs: int, load: list[float]) -> str:
    body = []
    slower = []
    for r in rows:
        e, lt, first = r["export"], r["latency"], r["first"]
        body.append(
            [
                r["name"],
                f"{e['torch']:.2f}",
                f"{e['fastonnx']:.2f}",
                f"{e['torch'] / e['fastonnx']:.2f}x",
                f"{r['capture']:.2f}",
                f"{first['torch']:.2f} / {first['fastonnx']:.2f}",
                f"{lt['torch'] * 1e3:.2f}",
                f"{lt['fastonnx'] * 1e3:.2f}",
                f"{lt['torch'] / lt['fastonnx']:.2f}x",
                f"{r['size']['torch'] / 1e6:.1f} / {r['size']['fastonnx'] / 1e6:.1f}",
                f"{r['zeros']['torch'] / 1e6:.1f} / {r['zeros']['fastonnx'] / 1e6:.1f}",
            ]
        )
        if e["fastonnx"] > e["torch"]:
            slower.append(f"{r['name']} ({e['fastonnx']:.2f}s vs {e['torch']:.2f}s)")
        if lt["fastonnx"] > lt["torch"] * 1.05:
            slower.append(
                f"{r['name']} onnxruntime latency ({lt['fastonnx'] * 1e3:.2f} vs {lt['torch'] * 1e3:.2f} ms)"
            )
    lines = [
        "## Real clients through torch.onnx.export vs under fastonnx.patch_torch_onnx() (benches/clients.py)",
        "",
        f"Machine: {ledger.machine()}. Each client called as users call it (ultralytics: "
        "`export(format='onnx', simplify=True)`, TorchScript exporter; timm: `onnx_export`, TorchScript "
        "exporter unless use_dynamo=True). Export = the client's whole call, median of "
        f"{runs} alternated runs after one warm-up each (first = that warm-up, imports included). Latency = "
        'onnxruntime CPU, batch 1, median of 20 runs per round. "of which torch.export" = fastonnx\'s '
        "capture stage (torch.export.export) inside its export time. Load average (1 min) at start / end: "
        f"{load[0]:.1f} / {load[1]:.1f} (the machine is shared: figures are comparable within a row).",
        "",
        ledger.table(
            [
                "client",
                "torch export s",
                "fastonnx export s",
                "export speed-up",
                "of which torch.export s",
                "first call torch / fastonnx s",
                "torch file ms",
                "fastonnx file ms",
                "latency speed-up",
                "file MB torch / fastonnx",
                "all-zero weights MB torch / fastonnx",
            ],
            body,
        ),
        "",
    ]
    lines.append(
        "File sizes differ where random init zeroes weights: timm zero-inits each residual block's last "
        "BatchNorm scale, so the conv-BatchNorm fusion yields all-zero tensors; the TorchScript exporter "
        "stores equal tensors once, fastonnx keeps one initializer per weight."
    )
    lines.append("")
    if slower:
        lines.append("fastonnx is slower here: " + "; ".join(slower) + ".")
    else:
        lines.append("fastonnx is not slower on any client in this run.")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", default=",".join(CLIENTS), help="comma-separated names from CLIENTS")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--no-ledger", action="store_true")
    a = p.parse_args()
    warnings.filterwarnings("ignore")
    log = logging.getLogger("fastonnx")
    log.addHandler(STAGES)
    log.setLevel(logging.INFO)
    folder = tempfile.mkdtemp(prefix="fastonnx-clients-")
    load = [os.getloadavg()[0]]
    rows = []
    try:
        for name in a.clients.split(","):
            print(f"{name}: measuring", flush=True)
            rows.append(measure(name, CLIENTS[name], a.runs, folder))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    load.append(os.getloadavg()[0])
    text = report(rows, a.runs, load)
    if not a.no_ledger:
        ledger.write_section("clients", text)
    print(text)


if __name__ == "__main__":
    main()
