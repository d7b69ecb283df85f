"""A Llama-3-8B-shaped random bf16 checkpoint (15 GiB at 32 layers) exported in place with dynamic batch
and sequence, end to end, two ways in one run: capture="export" (torch.export of every layer: the path
before stamping) and capture="auto" (torch.export of the first two layers, the others stamped:
capture/stamping.py), each the first export of a fresh process.

    PYTHONPATH=python python benches/inplace_dynamic.py [--layers 32] [--runs 2] [--dir /path]

The checkpoint is written once (benches/inplace_big.py's writer: a random block tiled, shards of at most
2 GiB) and deleted at the end, also on failure; each export's file is deleted after its run. Per run:
building the meta model, to_onnx's stages (capture, convert, optimize, write) and the total after
imports; runs alternate between the two ways. Target: the stamped export's total at most 1/5 of
torch.export's. Writes the section ``inplace_dynamic`` of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

VARIANTS = ("export", "auto")
NAMES = {"export": 'torch.export of every layer (`capture="export"`)', "auto": 'stamped (`capture="auto"`)'}


def run_variant(how: str, ckpt: str, layers: int) -> dict[str, Any]:
    """One export, in this (fresh) process."""
    import torch

    import fastonnx
    from inplace_big import meta_model
    from support.model_zoo import Logits

    t0 = time.perf_counter()
    model = Logits(meta_model(layers))
    ids = torch.zeros(2, 16, dtype=torch.int64, device="meta")
    mask = torch.ones(2, 16, dtype=torch.int64, device="meta")
    build = time.perf_counter() - t0
    path = os.path.join(ckpt, "model.onnx")
    dims = {0: "batch", 1: "sequence"}
    t1 = time.perf_counter()
    r = fastonnx.to_onnx(
        model,
        (ids, mask),
        filename=path,
        external_data=True,
        weights=ckpt,
        dynamic_shapes={"input_ids": dims, "attention_mask": dims},
        capture=how,
        progress=False,
    )
    total = time.perf_counter() - t1
    import onnx

    nodes = len(onnx.load(path, load_external_data=False).graph.node)  # the weights stay in the shards
    for leftover in ("model.onnx", "model.onnx.data"):
        if os.path.exists(os.path.join(ckpt, leftover)):
            os.unlink(os.path.join(ckpt, leftover))
    return {
        "build": build,
        **{s: r.stats[f"{s}_s"] for s in ("capture", "convert", "optimize", "write")},
        "to_onnx": total,
        "path": r.stats["capture"],
        "stamped": r.stats.get("stamped"),
        "nodes": nodes,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--dir", default=os.environ.get("BENCH_DIR"))
    ap.add_argument("--no-ledger", action="store_true")
    ap.add_argument("--child", nargs=3, metavar=("VARIANT", "CKPT", "LAYERS"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        variant, ckpt, layers = a.child[0], a.child[1], int(a.child[2])
        if variant == "checkpoint":
            from inplace_big import write_checkpoint

            print(json.dumps({"size": write_checkpoint(ckpt, layers)}))
        else:
            sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
            print(json.dumps(run_variant(variant, ckpt, layers)))
        return

    from ledger import child_json, machine, median, table, write_section

    root = tempfile.mkdtemp(prefix="inplace-dynamic-", dir=a.dir)
    results: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    try:
        t0 = time.perf_counter()
        size = child_json(__file__, "checkpoint", root, str(a.layers))["size"]
        print(f"checkpoint: {size / 2**30:.2f} GiB in {time.perf_counter() - t0:.1f} s", flush=True)
        for run in range(a.runs):
            for how in VARIANTS if run % 2 == 0 else tuple(reversed(VARIANTS)):
                r = child_json(__file__, how, root, str(a.layers))
                results[how].append(r)
                print(how, r, flush=True)
    finally:
        shutil.rmtree(root)

    def med(how: str, key: str) -> float:
        return median([r[key] for r in results[how]])

    rows = [
        [
            NAMES[how],
            *(f"{med(how, k):.2f}" for k in ("build", "capture", "convert", "optimize", "write", "to_onnx")),
            f"{med(how, 'build') + med(how, 'to_onnx'):.2f}",
            str(results[how][0]["nodes"]),
        ]
        for how in VARIANTS
    ]
    share = median(
        [
            (s["build"] + s["to_onnx"]) / (e["build"] + e["to_onnx"])
            for s, e in zip(results["auto"], results["export"], strict=True)
        ]
    )
    stamped = results["auto"][0]["stamped"] or f"nothing ({results['auto'][0]['path']})"
    body = "\n".join(
        [
            "## Checkpoints in place with dynamic shapes: a Llama-3-8B-shaped bf16 checkpoint (`inplace_dynamic`)",
            "",
            f"`PYTHONPATH=python python benches/inplace_dynamic.py --layers {a.layers} --runs {a.runs}` — "
            f"{machine()}.",
            "",
            f"A random bf16 checkpoint of the Llama-3-8B shape ({a.layers} layers, {size / 2**30:.2f} GiB, "
            "safetensors shards) exported from a meta-device model with `weights=` (every weight referenced "
            "in place), inputs `input_ids` and `attention_mask` (2, 16) with batch and sequence dynamic, "
            f"each export the first of a fresh process, imports excluded; {a.runs} runs per way, "
            f"alternated; seconds, medians. Stamped: {stamped}. The stamped export's end-to-end time "
            f"(build + to_onnx) over torch.export's in the same run: **1/{1 / share:.1f}** (median of the "
            "runs' ratios; target 1/5 or less).",
            "",
            table(
                [
                    "capture",
                    "build",
                    "capture",
                    "convert",
                    "optimize",
                    "write",
                    "to_onnx",
                    "end to end",
                    "ONNX nodes",
                ],
                rows,
            ),
        ]
    )
    print(body)
    if not a.no_ledger:
        write_section("inplace_dynamic", body)


if __name__ == "__main__":
    main()
