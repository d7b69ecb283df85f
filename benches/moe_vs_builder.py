"""A Qwen3.5-MoE package from ``fastonnx export`` against the onnxruntime-genai builder's, in onnxruntime.

Issue 41 asks for MoE decode and prefill against the builder's package of an architecture both tools
package at equal coverage: Qwen3.5-MoE (linear-attention layers with convolution and recurrent states,
full-attention layers, 256 routed experts and a shared one). The checkpoint is
``Qwen3_5MoeForConditionalGeneration`` with Qwen3.5-35B-A3B's text layer shape (hidden 2048, 16 / 2 heads
of 256, linear attention 16 / 32 heads of 128, 256 experts of 512, top-8, shared expert 512), ``--layers``
layers alternating linear and full attention (default 2), vocabulary 1024, a one-block vision tower,
random bfloat16 weights, saved into a temporary folder removed afterwards. Both packages are float32 for
the CPU:

- the builder: ``python -m onnxruntime_genai.models.builder -i CKPT -o OUT -p fp32 -e cpu`` (its experts
  are onnxruntime's ``com.microsoft.MoE``);
- fastonnx: ``fastonnx export CKPT OUT --no-verify`` (the routed ``SequenceMap`` form).

onnxruntime-genai 0.18 does not run the builder's package of this checkpoint (its ``RotaryEmbedding`` is
fed the 3-D positions genai makes for ``qwen3_5_moe_text``), so both ``model.onnx`` files run in onnxruntime
directly on the same inputs: a decode step after a past of ``--past`` tokens (random keys and values,
random states) and a prefill of ``--prefill`` tokens, ``--threads`` intra-op threads, the two files
alternated, medians. Each process also reports the build's wall time and peak memory (``ru_maxrss`` of
the child that built it). Regenerates its section of docs/benchmarks.md (``--no-ledger`` prints only).

    python benches/moe_vs_builder.py                     # 2 layers, past 2048, prefill 2048
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ledger

HERE = os.path.dirname(os.path.abspath(__file__))
VOCAB = 1024


def make_checkpoint(folder: str, layers: int) -> None:
    import torch
    import transformers

    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "pretrained"))
    from checkpoint_folders import save_tokenizer

    config = transformers.Qwen3_5MoeConfig()  # Qwen3.5-35B-A3B's sizes
    text = config.text_config
    text.num_hidden_layers = layers
    text.layer_types = ["linear_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
    text.vocab_size = VOCAB
    text.pad_token_id, text.bos_token_id, text.eos_token_id = 0, 1, 2
    vision = config.vision_config
    vision.depth, vision.hidden_size, vision.intermediate_size, vision.num_heads = 1, 64, 128, 4
    vision.out_hidden_size = text.hidden_size
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        model = transformers.Qwen3_5MoeForConditionalGeneration(config).eval()
    finally:
        torch.set_default_dtype(previous)
    model.save_pretrained(folder)
    save_tokenizer(folder, VOCAB)


# runs a module as ``python -m`` would, then prints its own peak memory (KiB)
_PEAK = """
import resource, runpy, sys
module, sys.argv = sys.argv[1], sys.argv[1:]
code = 0
try:
    runpy.run_module(module, run_name="__main__", alter_sys=True)
except SystemExit as e:
    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
print("PEAK", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
sys.exit(code)
"""


def timed(module: str, *args: str) -> tuple[float, float]:
    """Runs ``python -m module args`` in a child; (seconds, its peak GiB)."""
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", _PEAK, module, *args], capture_output=True, text=True, check=False
    )
    seconds = time.perf_counter() - t0
    peak = next((ln.split()[1] for ln in out.stdout.splitlines() if ln.startswith("PEAK ")), None)
    if out.returncode != 0 or peak is None:
        raise SystemExit(f"python -m {module} {' '.join(args)} failed:\n{out.stderr[-3000:]}")
    return seconds, int(peak) / 2**20


def feeds(session: Any, past: int, tokens: int) -> dict[str, Any]:
    """Inputs for one step of ``tokens`` new tokens after ``past`` ones, from the session's input list:
    ids, mask and positions; keys and values of ``past`` positions; states of their fixed shapes."""
    import numpy as np

    rng = np.random.default_rng(past + tokens)
    types = {"tensor(float)": np.float32, "tensor(int64)": np.int64, "tensor(int32)": np.int32}
    out: dict[str, Any] = {}
    for i in session.get_inputs():
        dtype = types[i.type]
        if i.name == "input_ids":
            out[i.name] = rng.integers(3, VOCAB, (1, tokens)).astype(dtype)
        elif i.name == "attention_mask":
            out[i.name] = np.ones((1, past + tokens), dtype=dtype)
        elif i.name == "position_ids":  # (batch, tokens), or (3, batch, tokens) where M-RoPE's are declared
            positions = np.arange(past, past + tokens, dtype=dtype)[None]
            out[i.name] = np.stack([positions] * 3) if len(i.shape) == 3 else positions
        else:  # a cache tensor: the batch 1, the symbolic sequence axis (keys, values) the past
            shape = [1 if j == 0 else (d if isinstance(d, int) else past) for j, d in enumerate(i.shape)]
            out[i.name] = (rng.standard_normal(shape) * 0.1).astype(dtype)
    return out


def measure(files: dict[str, str], a: argparse.Namespace) -> dict[str, dict[str, float | str]]:
    """Median ms of each file's decode step and prefill, or why onnxruntime does not run it."""
    import onnxruntime

    so = onnxruntime.SessionOptions()
    so.intra_op_num_threads = a.threads
    so.inter_op_num_threads = 1
    found: dict[str, dict[str, float | str]] = {k: {} for k in files}
    for case, (past, tokens, runs) in {
        "decode": (a.past, 1, a.iters),
        "prefill": (0, a.prefill, a.prefill_iters),
    }.items():
        for label, path in files.items():  # one session at a time: each holds the experts
            session = onnxruntime.InferenceSession(path, so, providers=["CPUExecutionProvider"])
            feed = feeds(session, past, tokens)
            try:
                session.run(None, feed)  # warm-up
            except Exception as e:  # onnxruntime's errors: the file does not run, which is the finding
                found[label][case] = "does not run: " + str(e).strip().splitlines()[0][:200]
                continue
            times = []
            for _ in range(runs):
                t0 = time.perf_counter()
                session.run(None, feed)
                times.append(time.perf_counter() - t0)
            found[label][case] = ledger.median(times) * 1000
            del session
    return found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--past", type=int, default=2048)
    p.add_argument("--prefill", type=int, default=2048)
    p.add_argument("--iters", type=int, default=7, help="decode runs a file")
    p.add_argument("--prefill-iters", type=int, default=2, help="prefill runs a file")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--no-ledger", action="store_true")
    a = p.parse_args()
    root = tempfile.mkdtemp(prefix="fastonnx-moe-builder-", dir=tempfile.gettempdir())
    try:
        checkpoint = os.path.join(root, "checkpoint")
        make_checkpoint(checkpoint, a.layers)
        out = {"builder": os.path.join(root, "builder"), "fastonnx": os.path.join(root, "fastonnx")}
        builds = {
            "builder": timed(
                "onnxruntime_genai.models.builder",
                "-i",
                checkpoint,
                "-o",
                out["builder"],
                "-p",
                "fp32",
                "-e",
                "cpu",
            ),
            "fastonnx": timed(
                "fastonnx", "export", checkpoint, out["fastonnx"], "--no-verify", "--no-progress"
            ),
        }
        files = {k: os.path.join(v, "model.onnx") for k, v in out.items()}
        ms = measure(files, a)
    finally:
        shutil.rmtree(root, ignore_errors=True)  # GBs of weights: nothing stays on the disk

    def cell(value: float | str, fmt: str) -> str:
        return format(value, fmt) if isinstance(value, float) else value.replace("|", "\\|")

    rows = [
        [
            label,
            f"{builds[label][0]:.0f}",
            f"{builds[label][1]:.1f}",
            cell(ms[label]["decode"], ".1f"),
            cell(ms[label]["prefill"], ".0f"),
        ]
        for label in ("builder", "fastonnx")
    ]
    ratios = []
    for c in ("decode", "prefill"):
        ours, theirs = ms["fastonnx"][c], ms["builder"][c]
        ratio = f"{ours / theirs:.2f}x" if isinstance(ours, float) and isinstance(theirs, float) else "-"
        ratios.append(f"{c} {ratio}")
    body = "\n".join(
        [
            "## Qwen3.5-MoE against the onnxruntime-genai builder (benches/moe_vs_builder.py)",
            "",
            f"Machine: {ledger.machine()}. Qwen3_5MoeForConditionalGeneration with Qwen3.5-35B-A3B's text "
            f"layer shape, {a.layers} layers (linear attention, full attention...), vocabulary {VOCAB}, random "
            "bfloat16 checkpoint; both packages float32 for the CPU (the builder's experts are onnxruntime's "
            "MoE, fastonnx's the routed SequenceMap form); both model.onnx files in onnxruntime on the same "
            f"inputs, {a.threads} threads, ms, medians of {a.iters} decode steps after a past of {a.past} and "
            f"{a.prefill_iters} prefills of {a.prefill} tokens. Build: the command's wall time and peak "
            "memory.",
            "",
            ledger.table(["package", "build s", "build peak GiB", "decode ms", "prefill ms"], rows),
            "",
            f"fastonnx / builder: {', '.join(ratios)}.",
        ]
    )
    print(body)
    if not a.no_ledger:
        ledger.write_section("moe_vs_builder", body)


if __name__ == "__main__":
    main()
