"""Capture time against depth: a meta-device Llama-3-8B-shaped model (hidden 4096, GQA 32/8, vocab
128256, bf16) at 2, 8 and 32 layers, captured by the trace (capture="trace") and by torch.export
(capture="export"), with static shapes, and with dynamic batch and sequence by torch.export of every
layer and by capture="auto"'s stamping (torch.export of the first layers, the others stamped: the
trace fixes every size).

    PYTHONPATH=python python benches/capture_depth.py [--layers 2,8,32] [--runs 3]

Each measurement is the first capture in a fresh process (a subprocess per run: torch's first-call
warm-up is part of what an export pays), timed around the capture stage to_onnx runs
(``pipeline.stages.run_capture``: torch.export or the trace, and what fastonnx does around it), imports and
building the model excluded (fastonnx's converter modules are imported first: the trace's check of the
recorded ops would load them, the conversion does anyway), the heap frozen out of the garbage
collector's sight as ``to_onnx`` freezes it. Inputs: ``input_ids`` and ``attention_mask`` of shape (2, 16) on the meta
device, as a meta model is exported (docs/weights.md). The runs of one depth are alternated between
the variants (trace, export, export with dynamic shapes, then again); the table gives medians of wall
and CPU time (the machine is shared: CPU time is what the capture itself spent) and the trace's share
of torch.export's static time in each run (median of the per-run ratios). Writes the section
``capture_depth`` of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

VARIANTS = ("trace, static", "export, static", "export, dynamic", "auto, dynamic")
EXPECTED = {"trace": "trace", "export": "export", "auto": "stamped"}  # the path each variant must take
MIN_STAMPED = 3  # below this depth capture="auto" captures every layer (nothing is left to stamp)


def meta_llama(layers: int) -> Any:
    """The Llama-3-8B shape on the meta device, every weight and buffer meta, wrapped to return logits."""
    import torch
    from transformers import LlamaForCausalLM
    from transformers.utils import logging

    logging.set_verbosity_error()
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from inplace_big import config as llama3_8b  # the same shape as the in-place bench
    from support.model_zoo import Logits

    cfg = llama3_8b(layers)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    return Logits(model)


def child(variant: str, layers: int) -> dict[str, Any]:
    """One capture, in this (fresh) process."""
    import torch

    from fastonnx.api import _heap_set_aside
    from fastonnx.opsets import MAX_OPSET
    from fastonnx.pipeline import stages
    from fastonnx.pipeline.options import ExportOptions
    from fastonnx.registry import FAMILIES, Registry

    model = meta_llama(layers)
    ids = torch.zeros(2, 16, dtype=torch.int64, device="meta")
    mask = torch.ones(2, 16, dtype=torch.int64, device="meta")
    how = variant.split(",")[0]
    shapes = None
    if variant.endswith("dynamic"):
        dims = {0: "batch", 1: "sequence"}
        shapes = {"input_ids": dims, "attention_mask": dims}
    options = ExportOptions(opset=MAX_OPSET, level="default", dynamic_shapes=shapes, capture=how)
    registry = Registry()
    for family in FAMILIES:  # the converters' modules: imports, which the trace's check would load
        importlib.import_module(f"fastonnx.converters.{family}")
    with _heap_set_aside():  # as to_onnx runs its stages: the heap frozen out of the collector's sight
        wall, cpu = time.perf_counter(), time.process_time()
        captured = stages.run_capture(model, (ids, mask), {}, options, registry)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    path = captured.info.path
    if path != EXPECTED[how] and not (how == "auto" and layers < MIN_STAMPED and path == "export"):
        why = captured.info.trace_refused or captured.info.stamp_refused
        raise SystemExit(f"{variant}: captured by {path}: {why}")
    guards = captured.info.guards_s or 0.0  # capture/guards.py: naming guards' lines, then the proof
    return {"wall": wall, "cpu": cpu, "nodes": len(captured.ep.graph.nodes), "path": path, "guards": guards}


def run_child(variant: str, layers: int) -> dict[str, Any]:
    from ledger import child_json

    return child_json(__file__, variant, str(layers))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--layers", default="2,8,32")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--no-ledger", action="store_true", help="print the table only")
    p.add_argument("--child", nargs=2, metavar=("VARIANT", "LAYERS"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        print(json.dumps(child(a.child[0], int(a.child[1]))))
        return

    from ledger import machine, median, table, write_section

    depths = [int(x) for x in a.layers.split(",")]
    results: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for layers in depths:
        for run in range(a.runs):
            order = VARIANTS if run % 2 == 0 else tuple(reversed(VARIANTS))
            for variant in order:
                r = run_child(variant, layers)
                results.setdefault((layers, variant), []).append(r)
                print(
                    f"{layers} layers, run {run + 1}/{a.runs}, {variant}: {r['wall']:.3f}s wall, "
                    f"{r['cpu']:.3f}s CPU, {r['nodes']} nodes",
                    flush=True,
                )
    rows = []
    for layers in depths:
        trace, static, dynamic, stamped = (results[(layers, v)] for v in VARIANTS)
        share = median([t["wall"] / s["wall"] for t, s in zip(trace, static)])
        share_cpu = median([t["cpu"] / s["cpu"] for t, s in zip(trace, static)])
        dyn_share = median([t["wall"] / s["wall"] for t, s in zip(stamped, dynamic)])
        dyn_share_cpu = median([t["cpu"] / s["cpu"] for t, s in zip(stamped, dynamic)])
        guards = median([t["guards"] / t["wall"] for t in stamped])
        rows.append(
            [
                layers,
                *(
                    f"{median([r['wall'] for r in rs]):.2f} / {median([r['cpu'] for r in rs]):.2f}"
                    for rs in (trace, static, dynamic, stamped)
                ),
                f"1/{1 / share:.1f} ({1 / share_cpu:.1f} CPU)",
                f"1/{1 / dyn_share:.1f} ({1 / dyn_share_cpu:.1f} CPU)"
                + ("" if stamped[0]["path"] == "stamped" else " (nothing stamped)"),
                f"{trace[0]['nodes']} / {static[0]['nodes']} / {dynamic[0]['nodes']} / {stamped[0]['nodes']}",
                f"{100 * guards:.2f}% ({median([t['guards'] for t in stamped]) * 1000:.1f} ms)",
            ]
        )
    body = "\n".join(
        [
            "## Capture time against depth (`capture_depth`)",
            "",
            f"`PYTHONPATH=python python benches/capture_depth.py --layers {a.layers} --runs {a.runs}` — "
            f"{machine()}.",
            "",
            "A meta-device Llama-3-8B-shaped model (hidden 4096, GQA 32/8, vocab 128256, bf16; inputs "
            "`input_ids` and `attention_mask` (2, 16) on the meta device), captured as `to_onnx` captures "
            "it (`pipeline.stages.run_capture`), each run the first capture of a fresh process, imports and "
            f"building the model excluded; {a.runs} runs per variant, alternated; seconds, median wall / "
            "median CPU. Dynamic: batch and sequence dynamic; `torch.export, dynamic` captures every layer "
            '(`capture="export"`), `stamped, dynamic` is `capture="auto"`: torch.export of the first two '
            "layers and the other layers stamped from the second (capture/stamping.py; with 2 layers "
            "nothing is left to stamp and torch.export captures both). Shares: the trace's time over "
            "torch.export's static time, and the stamped capture's over torch.export's dynamic time, in "
            "the same run (medians of the runs' ratios; targets at 32 layers: 1/15 and 1/3 or less). "
            "Guard check: what checking the stamped capture's ranges and guards against the request "
            "cost (capture/guards.py: naming each guard's line while torch.export runs, then the "
            "proof; `stats['guards_s']`), as a share of its wall time (median; target under 1%).",
            "",
            table(
                [
                    "layers",
                    "trace, static",
                    "torch.export, static",
                    "torch.export, dynamic",
                    "stamped, dynamic",
                    "trace's share of torch.export (static)",
                    "stamped share of torch.export (dynamic)",
                    "FX nodes (trace / export / dynamic / stamped)",
                    "guard check (share of stamped)",
                ],
                rows,
            ),
        ]
    )
    print(body)
    if not a.no_ledger:
        write_section("capture_depth", body)


if __name__ == "__main__":
    main()
