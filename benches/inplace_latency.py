"""onnxruntime latency of Linear weights read as stored (what to_onnx(weights=) emits so that they are
referenced, not written) against today's pre-transposed weights, on the Llama ladder.

    PYTHONPATH=python python benches/inplace_latency.py [--runs 7] [--rungs 2x256,16x256,16x1024]

For each rung a random fp32 LlamaForCausalLM is saved with save_pretrained, then exported twice per
level: without ``weights=`` (MatMul reading a weight stored transposed, written to the data file) and
with ``weights=<the checkpoint>`` (Gemm(transB=1) around a reshape at the standard level,
com.microsoft.FusedMatMul(transB=1) at the onnxruntime level, the weights referenced in the shards).
Both files are checked against eager PyTorch, then timed in onnxruntime (CPU, default graph
optimizations) on a batch of 1x128 tokens and a decode-like 1x1, with one intra-op thread and two: the
two forms alternate run by run, medians. Writes the section ``inplace_latency`` of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np
import onnxruntime as ort
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fastonnx
from ledger import machine, median, table, write_section
from support.model_zoo import Logits, ladder_llama

LEVELS = {"standard": True, "onnxruntime": "onnxruntime"}


def session(path: str, threads: int) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def feeds(tokens: int) -> dict[str, np.ndarray]:
    ids = torch.randint(0, 32000, (1, tokens), generator=torch.Generator().manual_seed(tokens))
    return {"input_ids": ids.numpy(), "attention_mask": np.ones((1, tokens), dtype=np.int64)}


def timed(sess: ort.InferenceSession, feed: dict[str, np.ndarray]) -> float:
    t0 = time.perf_counter()
    sess.run(None, feed)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--rungs", default="2x256,16x256,16x1024")
    a = ap.parse_args()
    rows = []
    root = tempfile.mkdtemp(prefix="inplace-latency-", dir=os.environ.get("BENCH_DIR"))
    try:
        for rung in a.rungs.split(","):
            layers, hidden = (int(v) for v in rung.split("x"))
            torch.manual_seed(0)
            model = ladder_llama(layers, hidden)
            ckpt = os.path.join(root, rung)
            model.save_pretrained(ckpt)
            example = feeds(8)
            args = (torch.from_numpy(example["input_ids"]), torch.from_numpy(example["attention_mask"]))
            with torch.no_grad():
                want = {
                    t: model(**{k: torch.from_numpy(v) for k, v in feeds(t).items()}).logits for t in (128, 1)
                }
            dyn = ({1: torch.export.Dim("seq", max=2048)}, {1: torch.export.Dim("seq", max=2048)})
            for level, optimize in LEVELS.items():
                paths = {}
                for form, weights in (("pre-transposed", None), ("as stored", ckpt)):
                    path = os.path.join(ckpt, f"{level}-{form.replace(' ', '_')}.onnx")
                    r = fastonnx.to_onnx(
                        Logits(model),
                        args,
                        filename=path,
                        external_data=True,
                        optimize=optimize,
                        weights=weights,
                        dynamic_shapes=dyn,
                    )
                    if weights is not None:
                        assert r.stats["file"]["weights"]["written_bytes"] == 0, r.stats["file"]["weights"]
                    paths[form] = path
                for threads in (1, 2):
                    sessions = {form: session(p, threads) for form, p in paths.items()}
                    for tokens in (128, 1):
                        feed = feeds(tokens)
                        for sess in sessions.values():
                            (got,) = sess.run(None, feed)  # warm-up, and the check against eager
                            torch.testing.assert_close(
                                torch.from_numpy(got), want[tokens], atol=2e-4, rtol=2e-4
                            )
                        times: dict[str, list[float]] = {form: [] for form in sessions}
                        for _ in range(a.runs):
                            for form, sess in sessions.items():
                                times[form].append(timed(sess, feed))
                        pre, stored = median(times["pre-transposed"]), median(times["as stored"])
                        pre_min, stored_min = min(times["pre-transposed"]), min(times["as stored"])
                        rows.append(
                            [
                                rung,
                                level,
                                f"1x{tokens}",
                                threads,
                                f"{pre * 1e3:.2f} ({pre_min * 1e3:.2f})",
                                f"{stored * 1e3:.2f} ({stored_min * 1e3:.2f})",
                                f"{stored / pre:.2f}x",
                                f"{stored_min / pre_min:.2f}x",
                            ]
                        )
                        print(" | ".join(str(c) for c in rows[-1]), flush=True)
                    del sessions
            shutil.rmtree(ckpt)
    finally:
        shutil.rmtree(root)
    headers = [
        "rung",
        "level",
        "tokens",
        "threads",
        "pre-transposed ms (min)",
        "as stored ms (min)",
        "as stored / pre, medians",
        "as stored / pre, minima",
    ]
    ratios = [float(r[-1][:-1]) for r in rows]
    by_level = {level: median([float(r[-1][:-1]) for r in rows if r[1] == level]) for level in LEVELS}
    body = "\n".join(
        [
            "## Checkpoints in place: Linear weights read as stored vs pre-transposed",
            "",
            f"`python benches/inplace_latency.py --runs {a.runs}`; {machine()}.",
            "onnxruntime CPU latency of the Llama ladder exported twice per level: without `weights=`",
            "(MatMul reading a weight stored transposed, written) and with `weights=<checkpoint>` (the",
            "weights referenced in the shards, read as stored: `Gemm(transB=1)` around a reshape at the",
            "standard level, `com.microsoft.FusedMatMul(transB=1)` at the onnxruntime level). Random fp32",
            "weights, each file checked against eager PyTorch; the two forms alternate run by run, medians",
            f"(and minima) of {a.runs}. The machine is shared: minima are the runs least disturbed by the",
            "other jobs, and the ratio of minima the steadier figure.",
            "",
            table(headers, rows),
            "",
            "Ratio of minima, median over the rows of each level: "
            + ", ".join(f"{level} {r:.2f}x" for level, r in by_level.items())
            + f" (all rows: {min(ratios):.2f}x to {max(ratios):.2f}x).",
        ]
    )
    write_section("inplace_latency", body)


if __name__ == "__main__":
    main()
