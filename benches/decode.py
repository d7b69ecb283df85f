"""LLM decode steps: fastonnx against torch.onnx.export(dynamo=True) on one Llama with a KV cache.

The decode-step model: Llama, hidden 1024, 8 layers, 16 query / 4 key-value heads, float32, batch 1.
One ExportedProgram (dynamic batch, sequence and past length; input_ids, attention_mask, position_ids
and the cache) is converted by fastonnx at opset 20 (optimize=True and "onnxruntime") and 23, and by the
official exporter at 20 and 23. Each file runs in onnxruntime with one thread
(intra_op_num_threads=1): a decode step (one token) at past 128 / 512 / 2048 and a prefill of 128
tokens (past 0). The files alternate within each repetition; figures are medians. Then onnxruntime's
profile of one decode step at the longest past gives each file's top op types. Regenerates its section
of docs/benchmarks.md.

    python benches/decode.py                     # the issue's model
    python benches/decode.py --layers 2 --runs 3 --pasts 128,512   # a quick look
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
import warnings
from collections import defaultdict
from typing import Any

import numpy as np
import onnxruntime
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
import fastonnx
import ledger
from fastonnx.capture.transformers_caches import register_transformers_caches
from support.model_zoo import DecodeStep, decode_step_shapes

HIDDEN, HEADS, KV_HEADS, VOCAB = 1024, 16, 4, 32000


def llama(layers: int) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=int(HIDDEN * 2.75) // 64 * 64,
        num_hidden_layers=layers,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=8192,
        use_cache=True,
    )
    torch.manual_seed(0)
    with torch.no_grad():
        return LlamaForCausalLM(cfg).eval()


def cache(layers: int, batch: int, past: int) -> Any:
    from transformers import DynamicCache

    c = DynamicCache()
    g = torch.Generator().manual_seed(0)
    for i in range(layers):
        shape = (batch, KV_HEADS, past, HIDDEN // HEADS)
        c.update(torch.randn(shape, generator=g), torch.randn(shape, generator=g), i)
    return c


def export_program(layers: int) -> tuple[Any, tuple[Any, ...]]:

    model = DecodeStep(llama(layers))
    register_transformers_caches()  # once transformers is imported
    batch, seq, past = 2, 3, 5
    args = (
        torch.randint(0, VOCAB, (batch, seq)),
        torch.ones(batch, past + seq, dtype=torch.int64),
        torch.arange(past, past + seq).repeat(batch, 1),
        cache(layers, batch, past),
    )
    spec = decode_step_shapes(layers)
    ep = torch.export.export(model, args, dynamic_shapes=spec, strict=False)
    return ep, args


def write_files(ep: Any, args: tuple[Any, ...], folder: str) -> dict[str, str]:
    files = {}
    for opset, opt, label in (
        (20, True, "fastonnx 20"),
        (20, "onnxruntime", "fastonnx 20 ort"),
        (23, True, "fastonnx 23"),
    ):
        path = os.path.join(folder, label.replace(" ", "_") + ".onnx")
        fastonnx.to_onnx(ep, args, filename=path, opset=opset, optimize=opt, external_data=True)
        files[label] = path
    for opset in (20, 23):
        path = os.path.join(folder, f"official_{opset}.onnx")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(ep, args, dynamo=True, opset_version=opset, optimize=False)
            program.optimize()
            program.save(path, external_data=True)
        del program
        files[f"official {opset}"] = path
        gc.collect()
    return files


def session(path: str, profile: str | None = None) -> onnxruntime.InferenceSession:
    so = onnxruntime.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    if profile:
        so.enable_profiling = True
        so.profile_file_prefix = profile
    return onnxruntime.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def feeds(sess: onnxruntime.InferenceSession, layers: int, past: int, seq: int) -> dict[str, np.ndarray]:
    """input_ids, attention_mask, position_ids, then each layer's keys and values, by input order."""
    rng = np.random.default_rng(past + seq)
    kv = (1, KV_HEADS, past, HIDDEN // HEADS)
    values = [
        rng.integers(0, VOCAB, (1, seq)).astype(np.int64),
        np.ones((1, past + seq), dtype=np.int64),
        np.arange(past, past + seq, dtype=np.int64)[None],
    ] + [rng.standard_normal(kv).astype(np.float32) for _ in range(2 * layers)]
    names = [i.name for i in sess.get_inputs()]
    assert len(names) == len(values), names
    return dict(zip(names, values, strict=True))


def timed(sess: onnxruntime.InferenceSession, feed: dict[str, np.ndarray]) -> float:
    t0 = time.perf_counter()
    sess.run(None, feed)
    return time.perf_counter() - t0


def top_ops(
    files: dict[str, str], layers: int, past: int, steps: int, folder: str
) -> dict[str, list[tuple[str, float]]]:
    """ms per decode step by op type for each file: the mean over 1 + `steps` profiled runs (the first,
    cold one included), the files alternated as in the timing."""
    sessions = {
        k: session(p, profile=os.path.join(folder, f"profile_{i}")) for i, (k, p) in enumerate(files.items())
    }
    fd = {k: feeds(s, layers, past, 1) for k, s in sessions.items()}
    for _ in range(1 + steps):
        for k, s in sessions.items():
            s.run(None, fd[k])
    out = {}
    for k, s in sessions.items():
        trace = s.end_profiling()
        with open(trace) as f:
            events = json.load(f)
        os.remove(trace)
        per_op: dict[str, float] = defaultdict(float)
        for e in events:
            if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
                per_op[e["args"]["op_name"]] += e["dur"] / 1000 / (1 + steps)
        out[k] = sorted(per_op.items(), key=lambda x: -x[1])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--runs", type=int, default=21, help="alternated repetitions of a decode step")
    ap.add_argument("--prefill-runs", type=int, default=5)
    ap.add_argument("--pasts", default="128,512,2048")
    ap.add_argument("--prefill", type=int, default=128)
    ap.add_argument("--no-ledger", action="store_true")
    a = ap.parse_args()
    pasts = [int(p) for p in a.pasts.split(",")]
    ep, args = export_program(a.layers)
    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(__file__))) as folder:
        files = write_files(ep, args, folder)
        del ep, args
        gc.collect()
        labels = list(files)
        sessions = {k: session(p) for k, p in files.items()}
        # the files agree before they are timed (logits of a decode step)
        check = {k: s.run(None, feeds(s, a.layers, 16, 1))[0] for k, s in sessions.items()}
        for k, v in check.items():
            np.testing.assert_allclose(v, check[labels[0]], atol=1e-3, rtol=1e-3, err_msg=k)
        cases = [(f"decode, past {p}", p, 1, a.runs) for p in pasts]
        cases.append((f"prefill {a.prefill}", 0, a.prefill, a.prefill_runs))
        times: dict[str, dict[str, list[float]]] = {}
        for name, past, seq, runs in cases:
            fd = {k: feeds(s, a.layers, past, seq) for k, s in sessions.items()}
            for k, s in sessions.items():
                s.run(None, fd[k])  # warm-up
            times[name] = {k: [] for k in labels}
            for i in range(runs):
                order = labels if i % 2 == 0 else labels[::-1]
                for k in order:
                    times[name][k].append(timed(sessions[k], fd[k]))
            print(name, {k: round(ledger.median(v) * 1000, 1) for k, v in times[name].items()}, flush=True)
        del sessions
        gc.collect()
        longest = max(pasts)
        profiles = top_ops(files, a.layers, longest, 15, folder)
        for k, ops in profiles.items():
            print(k, [(op, round(ms, 1)) for op, ms in ops[:6]], flush=True)
    body = report(a, cases, labels, times, profiles, longest)
    print(body)
    if not a.no_ledger:
        ledger.write_section("decode", body)


def report(
    a: argparse.Namespace,
    cases: list[tuple[str, int, int, int]],
    labels: list[str],
    times: dict[str, dict[str, list[float]]],
    profiles: dict[str, list[tuple[str, float]]],
    longest: int,
) -> str:
    rows = []
    for name, _, _, _ in cases:
        med = {k: ledger.median(v) * 1000 for k, v in times[name].items()}
        base = med["official 20"]
        rows.append([name] + [f"{med[k]:.1f} ({med[k] / base:.2f}x)" for k in labels])
    prof_rows = [
        [
            k,
            ", ".join(f"{op} {ms:.1f}" for op, ms in profiles[k][:6]),
            f"{sum(ms for _, ms in profiles[k]):.1f}",
        ]
        for k in labels
    ]
    return "\n".join(
        [
            "## LLM decode steps",
            "",
            f"Machine: {ledger.machine()}. Llama, hidden {HIDDEN}, {a.layers} layers, {HEADS} query / {KV_HEADS} "
            "key-value heads, float32, batch 1, one ExportedProgram (dynamic batch, sequence, past); onnxruntime "
            f"with one thread. ms, median of {a.runs} alternated runs ({a.prefill_runs} for the prefill, past 0); "
            "in brackets the ratio to the official exporter's opset-20 file. `fastonnx 20 ort` is "
            'optimize="onnxruntime". Produced by `python benches/decode.py`.',
            "",
            ledger.table(["case", *labels], rows),
            "",
            f"onnxruntime's profile of one decode step at past {longest} (ms per step by op type, top 6; "
            "total of all kernels):",
            "",
            ledger.table(["file", "top op types", "kernels"], prof_rows),
        ]
    )


if __name__ == "__main__":
    main()
