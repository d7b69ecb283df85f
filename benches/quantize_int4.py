"""int4 weight-only quantization of a Llama checkpoint folder, three tools side by side (issue 31, part 4).

The folder: a Llama-architecture model (8 layers, hidden 1024, 16 / 4 heads, 32000 tokens, untied head,
float32, random weights of std 0.1) saved with ``save_pretrained`` and a ``PreTrainedTokenizerFast``
(WordLevel) tokenizer. Each tool runs in a fresh process (imports timed apart from the work, peak RSS of
the process that does the work):

- fastonnx: ``LlamaForCausalLM.from_pretrained(folder)`` and ``to_onnx`` of one decode step with a KV
  cache (dynamic batch, sequence and past), ``quantize=WeightQuantization(bits=4, block_size=32)``
  (symmetric), at the standard level (DequantizeLinear -> MatMul, fused by onnxruntime) and at the
  "onnxruntime" level (MatMulNBits, accuracy_level 4), the LM head float (default) and quantized
  (``exclude=()``);
- the onnxruntime-genai model builder: ``python -m onnxruntime_genai.models.builder -i FOLDER -o OUT
  -p int4 -e cpu`` (it quantizes the LM head), and with ``--extra_options nodes_to_exclude=/lm_head/MatMul``;
- onnxruntime's ``MatMulNBitsQuantizer`` (block 32, symmetric, accuracy_level 4) over fastonnx's fp32
  file of the same step (the head excluded), its time without the fp32 export's.

Then, per file, in this process: its size, the decode-step latency (one token, onnxruntime, 1 thread,
median of ``--runs``) at past 512 and 2048, and accuracy against the float32 PyTorch model over 32
greedy steps after an 8-token prompt, teacher-forced (each file is fed torch's tokens, so every step's
logits compare at the same context): the largest logit difference and how many of the 32 next-token
argmaxes agree with torch's.

Regenerates the quantize_int4 section of docs/benchmarks.md.

    PYTHONPATH=python python benches/quantize_int4.py [--layers 8] [--runs 5] [--dir DIR]
    python benches/quantize_int4.py --no-ledger               # print only
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ledger

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
HIDDEN, HEADS, KV_HEADS, VOCAB = 1024, 16, 4, 32000
PROMPT, STEPS = 8, 32
TOOLS = (
    "fastonnx int4",
    "fastonnx int4 ort",
    "fastonnx int4 ort, head int4",
    "builder int4, head float",
    "builder int4",
    "MatMulNBitsQuantizer",
)
# the ledger's rows: the reference, then the tools with the head float, then with the head int4
ROWS = {
    "fp32": "fastonnx fp32 (reference file)",
    "fastonnx int4": "fastonnx int4, standard (head float)",
    "fastonnx int4 ort": "fastonnx int4, onnxruntime level (head float)",
    "builder int4, head float": "builder int4, head float",
    "MatMulNBitsQuantizer": "MatMulNBitsQuantizer over the fp32 file (head float)",
    "fastonnx int4 ort, head int4": "fastonnx int4, onnxruntime level, head int4 (`exclude=()`)",
    "builder int4": "builder int4 (head int4, its default)",
}
# fastonnx's files against the builder's of the same coverage
PAIRS = (
    (("fastonnx int4", "fastonnx int4 ort"), "builder int4, head float"),
    (("fastonnx int4 ort, head int4",), "builder int4"),
)


def write_folder(folder: str, layers: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from pretrained.checkpoint_folders import save_tokenizer

    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=int(HIDDEN * 2.75) // 64 * 64,
        num_hidden_layers=layers,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=4096,
        initializer_range=0.1,
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).eval().save_pretrained(folder)
    save_tokenizer(folder, VOCAB)  # type: ignore[arg-type]


def fastonnx_export(folder: str, path: str, quantize: Any, optimize: Any) -> dict[str, float]:
    """The export; returns the seconds of its parts: the folder's load, then to_onnx's stages."""
    import torch
    from transformers import DynamicCache, LlamaForCausalLM

    import fastonnx
    from fastonnx.capture.transformers_caches import register_transformers_caches

    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from support.model_zoo import DecodeStep, decode_step_shapes

    t0 = time.perf_counter()
    model = LlamaForCausalLM.from_pretrained(folder).eval()
    loaded = time.perf_counter() - t0
    layers = model.config.num_hidden_layers
    register_transformers_caches()
    cache = DynamicCache()
    for i in range(layers):
        shape = (2, KV_HEADS, 5, HIDDEN // HEADS)
        cache.update(torch.zeros(shape), torch.zeros(shape), i)
    args = (
        torch.zeros(2, 3, dtype=torch.int64),
        torch.ones(2, 8, dtype=torch.int64),
        torch.arange(5, 8).repeat(2, 1),
        cache,
    )
    spec = decode_step_shapes(layers)
    t1 = time.perf_counter()
    with torch.no_grad():
        result = fastonnx.to_onnx(
            DecodeStep(model),
            args,
            dynamic_shapes=spec,
            filename=path,
            external_data=True,
            optimize=optimize,
            quantize=quantize,
        )
    exported = time.perf_counter() - t1
    st = result.stats
    return {
        "load": loaded,
        "to_onnx": exported,
        "capture": st["capture_s"],
        "convert": st["convert_s"] + st["metadata_s"] + st["optimize_s"],
        "write": st["write_s"],
    }


def child(tool: str, folder: str, out: str) -> dict[str, Any]:
    """One tool in this fresh process: (import seconds, work seconds, peak RSS, the file)."""
    t0 = time.perf_counter()
    if tool.startswith("builder"):
        import onnxruntime_genai.models.builder  # noqa: F401  (its imports, timed apart)

        imports = time.perf_counter() - t0
        cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", folder, "-o", out]
        cmd += ["-p", "int4", "-e", "cpu", "-c", os.path.join(out, "cache")]
        if "head float" in tool:
            cmd += ["--extra_options", "nodes_to_exclude=/lm_head/MatMul"]
        t1 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(proc.stderr[-3000:])
        work = time.perf_counter() - t1
        # the builder's own process: imports it again, so its time includes them; counted apart
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
        shutil.rmtree(os.path.join(out, "cache"), ignore_errors=True)
        return {
            "imports_s": imports,
            "work_s": work - imports,
            "peak_rss": peak,
            "path": os.path.join(out, "model.onnx"),
        }
    if tool == "MatMulNBitsQuantizer":
        import onnx
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

        imports = time.perf_counter() - t0
        fp32 = os.path.join(out, "fp32", "model.onnx")
        t1 = time.perf_counter()
        model = onnx.load(fp32)
        shapes = {i.name: list(i.dims) for i in model.graph.initializer}
        head = [
            n.name
            for n in model.graph.node
            if n.op_type == "MatMul" and shapes.get(n.input[1]) == [HIDDEN, VOCAB]
        ]
        q = MatMulNBitsQuantizer(
            model, bits=4, block_size=32, is_symmetric=True, accuracy_level=4, nodes_to_exclude=head
        )
        q.process()
        path = os.path.join(out, "model.onnx")
        q.model.save_model_to_file(path, use_external_data_format=True)
        work = time.perf_counter() - t1
        return {
            "imports_s": imports,
            "work_s": work,
            "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "path": path,
        }
    import torch  # noqa: F401
    import transformers  # noqa: F401

    # the export script's own imports (the model class, the decode-step wrapper), timed apart as well
    from transformers import DynamicCache, LlamaForCausalLM  # noqa: F401

    import fastonnx

    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from support.model_zoo import DecodeStep  # noqa: F401

    imports = time.perf_counter() - t0
    path = os.path.join(out, "model.onnx")
    t1 = time.perf_counter()
    if tool == "fp32":
        split = fastonnx_export(folder, path, None, True)
    else:
        q = fastonnx.WeightQuantization(
            bits=4,
            block_size=32,
            exclude=() if "head int4" in tool else None,
            accuracy_level=4 if "ort" in tool else None,
        )
        split = fastonnx_export(folder, path, q, "onnxruntime" if "ort" in tool else True)
    work = time.perf_counter() - t1
    return {
        "imports_s": imports,
        "work_s": work,
        "split": split,
        "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "path": path,
    }


def run_child(tool: str, folder: str, out: str, layers: int) -> dict[str, Any]:
    os.makedirs(out, exist_ok=True)
    cmd = [sys.executable, __file__, "--layers", str(layers), "--child", tool, folder, out]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.path.join(ROOT, "python")}
    )
    if proc.returncode != 0:
        raise SystemExit(f"{tool}:\n{proc.stderr[-4000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def metadata_bytes(path: str) -> int:
    """The bytes of the nodes' metadata_props in the .onnx file."""
    import onnx

    proto = onnx.load(path, load_external_data=False)
    return sum(p.ByteSize() for n in proto.graph.node for p in n.metadata_props)


def files_size(path: str) -> int:
    folder = os.path.dirname(path)
    return sum(
        os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder) if f.endswith((".onnx", ".data"))
    )


class Runner:
    """One ONNX decode-step file: inputs found by name (ids, mask, positions; every other input a past
    key or value, in order), outputs logits then the presents in the same order."""

    def __init__(self, path: str) -> None:
        import onnxruntime

        so = onnxruntime.SessionOptions()
        so.intra_op_num_threads = 1
        so.inter_op_num_threads = 1
        self.sess = onnxruntime.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        self.names = [i.name for i in self.sess.get_inputs()]
        self.kv = [n for n in self.names if n not in ("input_ids", "attention_mask", "position_ids")]

    def feed(self, ids: Any, past: list[Any], past_len: int) -> dict[str, Any]:
        import numpy as np

        seq = ids.shape[1]
        f = {
            "input_ids": ids.astype(np.int64),
            "attention_mask": np.ones((1, past_len + seq), dtype=np.int64),
        }
        if "position_ids" in self.names:
            f["position_ids"] = np.arange(past_len, past_len + seq, dtype=np.int64)[None]
        f.update(zip(self.kv, past, strict=True))
        return f

    def empty_past(self, length: int, seed: int = 0) -> list[Any]:
        import numpy as np

        rng = np.random.default_rng(seed)
        return [
            rng.standard_normal((1, KV_HEADS, length, HIDDEN // HEADS)).astype(np.float32) for _ in self.kv
        ]

    def step(self, ids: Any, past: list[Any], past_len: int) -> tuple[Any, list[Any]]:
        out = self.sess.run(None, self.feed(ids, past, past_len))
        return out[0], out[1 : 1 + len(self.kv)]


def latency(r: Runner, past_len: int, runs: int) -> float:
    import numpy as np

    past = r.empty_past(past_len)
    ids = np.array([[5]])
    times = []
    for _ in range(runs + 1):
        t0 = time.perf_counter()
        r.sess.run(None, r.feed(ids, past, past_len))
        times.append(time.perf_counter() - t0)
    return float(np.median(times[1:]))


def reference(folder: str) -> tuple[Any, Any]:
    """torch's greedy tokens (prompt + 32) and the logits of every position after the prompt's last."""
    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(folder).eval()
    prompt = torch.randint(3, VOCAB, (1, PROMPT), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=STEPS, do_sample=False, min_new_tokens=STEPS)
        logits = model(out).logits[0, PROMPT - 1 : PROMPT - 1 + STEPS]
    return out[0].numpy(), logits.numpy()


def accuracy(r: Runner, tokens: Any, want: Any) -> tuple[float, float, int]:
    """Teacher-forced: the prompt at past 0, then torch's tokens one at a time; the logits predicting
    each of the 32 new tokens against torch's."""
    import numpy as np

    past = r.empty_past(0)
    logits, past = r.step(tokens[None, :PROMPT], past, 0)
    got = [logits[0, -1]]
    for t in range(PROMPT, PROMPT + STEPS - 1):
        logits, past = r.step(tokens[None, t : t + 1], past, t)
        got.append(logits[0, -1])
    g = np.stack(got)
    agree = int((g.argmax(-1) == tokens[PROMPT : PROMPT + STEPS]).sum())
    diff = np.abs(g - want)
    return float(diff.max()), float(diff.mean()), agree


def spread(values: list[float]) -> float:
    """How far apart values are: (largest - smallest) / smallest."""
    return (max(values) - min(values)) / min(values)


def span(values: list[float], unit: str, digits: int) -> str:
    lo, hi = min(values), max(values)
    return (
        f"{lo:.{digits}f}{unit}"
        if f"{lo:.{digits}f}" == f"{hi:.{digits}f}"
        else f"{lo:.{digits}f}-{hi:.{digits}f}{unit}"
    )


def findings(m: dict[str, dict[str, Any]]) -> list[str]:
    """The comparison at equal coverage, computed from the run's figures."""
    mib, gb = 2**20, 1e9
    gaps = [(m[f]["size"] - m[b]["size"]) / mib for fs, b in PAIRS for f in fs]
    meta = [m[f]["metadata_bytes"] / mib for fs, _ in PAIRS for f in fs]
    rss = [(m[b]["peak_rss"] - m[f]["peak_rss"]) / gb for fs, b in PAIRS for f in fs]
    if min(rss) > 0:
        rss_text = f"peak RSS {span(rss, ' GB', 2)} lower than the builder's"
    elif max(rss) < 0:
        rss_text = f"peak RSS {span([-x for x in rss], ' GB', 2)} higher than the builder's"
    else:
        rss_text = f"peak RSS from {min(rss):+.2f} to {max(rss):+.2f} GB below the builder's"
    lat = [(m[f][k] - m[b][k]) / m[b][k] * 100 for fs, b in PAIRS for f in fs for k in ("p512", "p2048")]
    quantized = [t for t in ROWS if t != "fp32"]
    errors = [m[t]["err"] for t in quantized]
    means = [m[t]["mean_err"] for t in quantized]
    agrees = [m[t]["agree"] for t in quantized]
    ratios = [[m[f]["work_s"] / m[b]["work_s"] for f in fs] for fs, b in PAIRS]
    fp32_split = m["fp32"]["split"]
    fastonnx_rows = [t for t in ROWS if t.startswith("fastonnx")]
    split_text = "; ".join(
        f"{'fp32' if t == 'fp32' else ROWS[t].split(' (')[0].removeprefix('fastonnx ')}: load "
        f"{m[t]['split']['load']:.1f}, capture {m[t]['split']['capture']:.1f}, conversion "
        f"{m[t]['split']['convert']:.1f}, write {m[t]['split']['write']:.1f} of to_onnx's "
        f"{m[t]['split']['to_onnx']:.1f}"
        for t in ["fp32", *fastonnx_rows]
    )
    writes = [m[t]["split"]["write"] for t in fastonnx_rows]
    captures = [m[t]["split"]["capture"] for t in fastonnx_rows]
    builder_work = [m[b]["work_s"] for _, b in PAIRS]
    third = "under" if max(max(r) for r in ratios) <= 1 / 3 else "not"
    return [
        "At equal coverage (fastonnx's files against the builder's with the head float, then int4): files",
        f"from {min(gaps):+.2f} to {max(gaps):+.2f} MiB beside the builder's (fastonnx's .onnx holds",
        f"{span(meta, ' MiB', 2)} of node metadata: module names, FX nodes, stack traces, which",
        f"`metadata=False` leaves out), {rss_text}, decode latencies from",
        f"{min(lat):+.0f}% to {max(lat):+.0f}% of the builder's (this machine swings by tens of percent under",
        f"load), and the quantized files' largest logit errors {min(errors):.2f}-{max(errors):.2f} (within",
        f"{spread(errors) * 100:.1f}% of each other), mean errors {min(means):.3f}-{max(means):.3f} (within",
        f"{spread(means) * 100:.1f}%): round-to-nearest blocks of 32 in every tool; a random model of std",
        "0.1 has logits in the hundreds, so int4 moves every tool's greedy tokens alike:",
        f"{min(agrees)}-{max(agrees)} of {STEPS} argmaxes agree. fastonnx's time is {third} a third of the",
        f"builder's: its work is {span(ratios[0], 'x', 2)} the builder's with the head float and",
        f"{span(ratios[1], 'x', 2)} with it int4. Where fastonnx's time goes (seconds: {split_text};",
        "to_onnx's rest is its checks, options and report): the quantized rows' writes",
        f"take {span(writes, ' s', 2)} against the fp32 file's {fp32_split['write']:.2f} s, and the load",
        "and the capture (torch.export of the step's first layers, the others stamped) are what the",
        "builder, writing its graph by hand from the checkpoint, does not pay.",
        *(
            [
                f"The capture alone ({span(captures, ' s', 1)}, torch.export's first call in a process included)",
                f"is more than a third of the builder's work ({span(builder_work, ' s', 1)}) at this size.",
            ]
            if min(captures) > max(builder_work) / 3
            else []
        ),
        "Not yet measured: a trained checkpoint's accuracy.",
    ]


def report(m: dict[str, dict[str, Any]], a: argparse.Namespace, load: tuple[float, float]) -> str:
    rows = [
        [
            ROWS[t],
            f"{r['imports_s']:.1f} s",
            f"{r['work_s']:.1f} s",
            f"{r['peak_rss'] / 2**20:.0f} MiB",
            f"{r['size'] / 2**20:.1f} MiB",
            f"{r['p512'] * 1e3:.1f} ms",
            f"{r['p2048'] * 1e3:.1f} ms",
            f"{r['err']:.4f}" if r["err"] < 0.01 else f"{r['err']:.2f}",
            f"{r['mean_err']:.5f}" if r["mean_err"] < 0.01 else f"{r['mean_err']:.3f}",
            f"{r['agree']}/{STEPS}",
        ]
        for t, r in ((t, m[t]) for t in ROWS)
    ]
    heads = f"{HEADS} / {KV_HEADS}"
    return "\n".join(
        [
            "## int4 weight-only: fastonnx against the onnxruntime-genai builder and MatMulNBitsQuantizer"
            " (benches/quantize_int4.py)",
            "",
            f"{ledger.machine()}; load average {load[0]:.1f} at the start, {load[1]:.1f} at the end (times and",
            "latencies swing with the machine's load; compare within a row pair).",
            f"`python benches/quantize_int4.py --layers {a.layers} --runs {a.runs}`: a Llama-architecture folder",
            f"({a.layers} layers, hidden {HIDDEN}, {heads} heads, {VOCAB} tokens, untied head, float32 random",
            "weights of std 0.1, `save_pretrained` plus a `PreTrainedTokenizerFast`), each tool in a fresh",
            "process. fastonnx loads the folder with `from_pretrained` and exports one decode step with a KV",
            'cache (dynamic batch, sequence and past; `capture="auto"`: torch.export of the first layers, the',
            "others stamped) with",
            '`quantize=WeightQuantization(bits=4, block_size=32)` (symmetric); its "work" is that whole export',
            "(load, capture, conversion, quantized write). The builder runs as",
            "`python -m onnxruntime_genai.models.builder -i FOLDER -o OUT -p int4 -e cpu` (block 32, symmetric,",
            'its defaults; it quantizes the LM head), "head float" adds',
            "`--extra_options nodes_to_exclude=/lm_head/MatMul`; its work is its process minus this process's",
            "import of the builder module (its own imports are inside). `MatMulNBitsQuantizer(bits=4,",
            "block_size=32, is_symmetric=True, accuracy_level=4)` runs over fastonnx's fp32 file (the head",
            "excluded), its work without that export. Latency: one decode step (one token), onnxruntime 1",
            f"thread, median of {a.runs}, at past 512 and 2048. Accuracy: {STEPS} steps after a {PROMPT}-token",
            "prompt, teacher-forced with torch's greedy tokens: the largest and the mean logit difference from",
            "the float32 torch model and the steps whose argmax is torch's token. fastonnx's imports include",
            "the export script's (the transformers model class, the decode-step wrapper).",
            "",
            ledger.table(
                [
                    "tool",
                    "imports",
                    "work",
                    "peak RSS",
                    "files",
                    "decode p512",
                    "decode p2048",
                    "max logit err",
                    "mean logit err",
                    "argmax agrees",
                ],
                rows,
            ),
            "",
            *findings(m),
        ]
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--dir", default=None)
    p.add_argument("--no-ledger", action="store_true", help="print only, leave docs/benchmarks.md alone")
    p.add_argument("--child", nargs=3, metavar=("TOOL", "FOLDER", "OUT"))
    a = p.parse_args()
    if a.child:
        print(json.dumps(child(*a.child)))
        return
    start = os.getloadavg()[0]
    root = tempfile.mkdtemp(dir=a.dir)
    try:
        folder = os.path.join(root, "llama")
        write_folder(folder, a.layers)
        results: dict[str, dict[str, Any]] = {}
        results["fp32"] = run_child("fp32", folder, os.path.join(root, "fp32"), a.layers)
        for tool in TOOLS:
            out = os.path.join(root, tool.replace(" ", "_").replace(",", ""))
            if tool == "MatMulNBitsQuantizer":
                out = root  # reads root/fp32/model.onnx, writes root/model.onnx
            results[tool] = run_child(tool, folder, out, a.layers)
            print(tool, {k: v for k, v in results[tool].items() if k != "path"}, flush=True)
        tokens, want = reference(folder)
        print(
            f"{'tool':30} {'imports':>8} {'work':>7} {'peak RSS':>9} {'size':>8} {'p512':>8} {'p2048':>8} {'max err':>8} {'agree':>6}"
        )
        for tool, r in results.items():
            runner = Runner(r["path"])
            r["size"] = files_size(r["path"])
            r["metadata_bytes"] = metadata_bytes(r["path"])
            r["p512"], r["p2048"] = latency(runner, 512, a.runs), latency(runner, 2048, a.runs)
            r["err"], r["mean_err"], r["agree"] = accuracy(runner, tokens, want)
            print(
                f"{tool:30} {r['imports_s']:7.1f}s {r['work_s']:6.1f}s {r['peak_rss'] / 2**20:7.0f} M "
                f"{r['size'] / 2**20:6.0f} M {r['p512'] * 1e3:6.1f}ms {r['p2048'] * 1e3:6.1f}ms {r['err']:8.4f} {r['agree']:3d}/{STEPS}",
                flush=True,
            )
            del runner
    finally:
        shutil.rmtree(root, ignore_errors=True)
    text = report(results, a, (start, os.getloadavg()[0]))
    print(text)
    if not a.no_ledger:
        ledger.write_section("quantize_int4", text)


if __name__ == "__main__":
    main()
