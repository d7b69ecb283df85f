"""A checkpoint folder to an onnxruntime-genai package: ``fastonnx export`` against the onnxruntime-genai
model builder, side by side in one run.

Folders, written by this script and deleted after:

- ``8x1024``: a Llama-architecture folder of 8 layers (hidden 1024, 16 / 4 heads, intermediate 2816,
  32000 tokens, untied head, float32 random weights of std 0.1) saved with ``save_pretrained`` and a
  ``PreTrainedTokenizerFast``: ``write_folder`` of benches/quantize_int4.py;
- ``3b``: a Llama-3.2-3B-shaped bf16 folder (28 layers, hidden 3072, 24 / 8 heads, intermediate 8192,
  128256 tokens, tied embeddings; 6.4 GB), its safetensors shards written tensor by tensor from the
  model's meta-device shapes with random data (std 0.02, norms one), never the model in memory.

Precisions (``--sizes 3b:fp32+int4`` picks; fp32 and int4 by default), the two tools' flags:

- ``fp32``: fastonnx's default / the builder's ``-p fp32``;
- ``fp16``: ``--dtype fp16`` / ``-p fp16``;
- ``int4``: ``--quantize int4`` / ``-p int4``;
- ``int4mixed``: the LM head in int8, the rest int4: ``--quantize int4 --int8 lm_head`` / ``-p int4
  --extra_options matmul_mixed_precision=last_matmul:int8``.

Per size and precision, each tool in a fresh process (``--runs`` times, the tools' order alternated):

- fastonnx: ``fastonnx export FOLDER OUT --task text-generation --no-verify [precision flags]`` (its
  ``main`` called in the process, so the imports are timed apart: torch, transformers and fastonnx's
  export modules);
- the builder: ``python -m onnxruntime_genai.models.builder -i FOLDER -o OUT -p P -e cpu [extra]``
  (the module run as ``__main__`` in the process after importing it; its cache folder outside OUT).

Measured: imports, work (wall after the imports), peak RSS of the process (VmHWM: ``ru_maxrss``, and
the parent polls ``/proc/PID/status`` so a process killed for memory still has a figure; the parent
stops a process when the machine has under ``--min-free`` GiB available rather than let the kernel's
OOM killer pick among the machine's processes), the package on disk (files hard-linked from the
checkpoint counted apart) and, from the first run's package in ``--decode-turns`` fresh processes per tool
(the tools alternated turn by turn, the median over the turns), the decode step
through onnxruntime-genai (``Model`` / ``Generator``, session options overlaid to 1 intra-op and 1
inter-op thread): a 2048-token prompt appended, then ``--steps`` single-token steps timed, median.

Regenerates the pretrained_vs_builder section of docs/benchmarks.md (``--section NAME``: that section
instead, so that a long run of one size, e.g. the 3B folder alone, keeps its own stamped section beside
the other's).

    PYTHONPATH=python python benches/pretrained_vs_builder.py [--sizes 8x1024,3b] [--runs 1]
    python benches/pretrained_vs_builder.py --sizes 3b:fp32+int4 --section pretrained_vs_builder_3b
    python benches/pretrained_vs_builder.py --sizes 8x1024 --no-ledger     # print only
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ledger

SECTION = "pretrained_vs_builder"

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TOOLS = ("fastonnx", "builder")
# precision -> (fastonnx export's flags, the builder's -p and extra arguments)
PRECISIONS: dict[str, tuple[list[str], list[str]]] = {
    "fp32": ([], ["-p", "fp32"]),
    "fp16": (["--dtype", "fp16"], ["-p", "fp16"]),
    "int4": (["--quantize", "int4"], ["-p", "int4"]),
    "int4mixed": (
        ["--quantize", "int4", "--int8", "lm_head"],
        ["-p", "int4", "--extra_options", "matmul_mixed_precision=last_matmul:int8"],
    ),
}
PAST = 2048
LLAMA_3B = {
    "vocab_size": 128256,
    "hidden_size": 3072,
    "intermediate_size": 8192,
    "num_hidden_layers": 28,
    "num_attention_heads": 24,
    "num_key_value_heads": 8,
    "max_position_embeddings": 131072,
    "rope_theta": 500000.0,
    "tie_word_embeddings": True,
    "initializer_range": 0.02,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}
SHARD_BYTES = 2 * 2**30  # one shard's tensors in memory at a time


def write_3b(folder: str) -> None:
    """The Llama-3.2-3B shape in bf16: config, generation config, tokenizer and safetensors shards with
    an index, each tensor drawn alone (the model is built on the meta device only for names and shapes)."""
    import torch
    from safetensors.torch import save_file
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from pretrained.checkpoint_folders import save_tokenizer

    os.makedirs(folder)
    cfg = LlamaConfig(**LLAMA_3B, dtype="bfloat16", architectures=["LlamaForCausalLM"])
    cfg.save_pretrained(folder)
    GenerationConfig.from_model_config(cfg).save_pretrained(folder)
    save_tokenizer(folder, cfg.vocab_size)  # type: ignore[arg-type]
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items() if k != "lm_head.weight"}
    groups: list[list[str]] = [[]]
    size = 0
    for name, shape in shapes.items():
        n = 2 * int(torch.Size(shape).numel())
        if groups[-1] and size + n > SHARD_BYTES:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += n
    gen = torch.Generator().manual_seed(0)
    weight_map: dict[str, str] = {}
    total = 0
    for i, names in enumerate(groups):
        file = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        tensors = {}
        for name in names:
            if name.endswith("norm.weight"):
                t = torch.ones(shapes[name], dtype=torch.bfloat16)
            else:
                t = torch.empty(shapes[name], dtype=torch.bfloat16).normal_(0, 0.02, generator=gen)
            tensors[name] = t
            weight_map[name] = file
            total += 2 * t.numel()
        save_file(tensors, os.path.join(folder, file), metadata={"format": "pt"})
        del tensors
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def write_size(size: str, folder: str) -> None:
    if size == "3b":
        write_3b(folder)
        return
    from quantize_int4 import HIDDEN, write_folder

    layers, hidden = (int(x) for x in size.split("x"))
    if hidden != HIDDEN:
        raise SystemExit(f"{size}: quantize_int4's folder has hidden {HIDDEN}")
    write_folder(folder, layers)


def builder_args(precision: str, extra: list[str]) -> list[str]:
    """The builder's -p and extra options for ``precision``, with fastonnx's ``--block-size N`` (in
    ``extra``) as its ``block_size=N``: both tools quantize at one block size."""
    args = list(PRECISIONS[precision][1])
    if "--block-size" not in extra or not precision.startswith("int"):
        return args
    option = f"block_size={extra[extra.index('--block-size') + 1]}"
    if "--extra_options" in args:
        return [*args, option]  # nargs="+": one more KEY=VALUE after the others
    return [*args, "--extra_options", option]


def child_export(tool: str, precision: str, folder: str, out: str, extra: list[str]) -> dict[str, Any]:
    """One tool in this fresh process: import seconds, then the work."""
    t0 = time.perf_counter()
    if tool == "builder":
        import runpy

        import onnxruntime_genai.models.builder  # noqa: F401  (its imports, timed apart)

        imports = time.perf_counter() - t0
        cache = out + ".cache"  # beside OUT: the package's size is the package's
        sys.argv = [
            "builder",
            "-i",
            folder,
            "-o",
            out,
            "-e",
            "cpu",
            "-c",
            cache,
            *builder_args(precision, extra),
        ]
        t1 = time.perf_counter()
        try:
            runpy.run_module("onnxruntime_genai.models.builder", run_name="__main__", alter_sys=True)
        finally:
            shutil.rmtree(cache, ignore_errors=True)
        work = time.perf_counter() - t1
        info: dict[str, Any] = {}
    else:
        import torch  # noqa: F401
        import transformers  # noqa: F401

        import fastonnx.api
        import fastonnx.pretrained.package_export  # noqa: F401
        from fastonnx.pretrained import cli

        imports = time.perf_counter() - t0
        argv = ["export", folder, out, "--task", "text-generation", "--no-verify", "--no-progress", *extra]
        argv += PRECISIONS[precision][0]
        t1 = time.perf_counter()
        status = cli.main(argv)
        work = time.perf_counter() - t1
        if status != 0:
            raise SystemExit(f"fastonnx export exited {status}")
        info = {"optimize": cli._parser().parse_args(argv).optimize}
    return {
        "imports_s": imports,
        "work_s": work,
        "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        **info,
    }


def child_decode(package: str, steps: int, vocab: int) -> dict[str, Any]:
    """The decode step through onnxruntime-genai at past 2048, 1 thread."""
    import numpy as np
    import onnxruntime_genai as og

    config = og.Config(package)
    threads = {"intra_op_num_threads": 1, "inter_op_num_threads": 1}
    config.overlay(json.dumps({"model": {"decoder": {"session_options": threads}}}))
    model = og.Model(config)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=PAST + steps + 2, do_sample=False)
    gen = og.Generator(model, params)
    prompt = np.random.default_rng(7).integers(3, vocab, PAST).astype(np.int32)
    t0 = time.perf_counter()
    gen.append_tokens(prompt)
    prefill = time.perf_counter() - t0
    times, cpus = [], []
    for _ in range(steps):
        t, c = time.perf_counter(), time.process_time()
        gen.generate_next_token()
        times.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
    return {
        "prefill_s": prefill,
        "step_s": statistics.median(times),
        "step_cpu_s": statistics.median(cpus),  # about the wall time when one thread computes
        "tokens": int(gen.token_count()),
        "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


def decode_turns(packages: dict[str, str], a: argparse.Namespace, vocab: int, label: str) -> dict[str, Any]:
    """Each package's decode in ``a.decode_turns`` turns, the tools alternated turn by turn (a fresh
    process each): the median step and prefill over the turns, and every turn's step. One process per
    tool (the earlier form) measured 1.28x at 8x1024 int4 where 6 alternated turns gave 0.95x: a single
    process's median of 16 steps moves by 20% with the shared machine's load."""
    found: dict[str, list[dict[str, Any]]] = {tool: [] for tool in packages}
    tools = list(packages)
    for turn in range(a.decode_turns):
        for tool in tools if turn % 2 == 0 else list(reversed(tools)):
            log = packages[tool] + ".decode.log"
            d = run_child(["--decode", packages[tool], str(a.steps), str(vocab)], a.min_free, log)
            os.remove(log)
            print(f"{label} {tool} decode turn {turn + 1}: {d}", flush=True)
            found[tool].append(d)
    merged: dict[str, Any] = {}
    for tool, turns in found.items():
        ok = [d for d in turns if "step_s" in d]
        if not ok:
            merged[tool] = turns[0]
            continue
        merged[tool] = {
            **{k: statistics.median(d[k] for d in ok) for k in ("step_s", "step_cpu_s", "prefill_s")},
            "turns": [d["step_s"] for d in ok],
        }
    return merged


def vm_hwm(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def run_child(args: list[str], min_free: float, log: str) -> dict[str, Any]:
    """``args`` in a fresh process of this script, polled for its peak RSS and stopped when the machine
    runs out of memory. Returns its JSON, or ``{"failed": why, "peak_rss": last VmHWM seen}``."""
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "python")}
    with open(log, "w+") as out:
        proc = subprocess.Popen(
            [sys.executable, __file__, *args], stdout=out, stderr=subprocess.STDOUT, env=env
        )
        peak, stopped = 0, False
        while proc.poll() is None:
            peak = max(peak, vm_hwm(proc.pid))
            if mem_available() < min_free * 2**30:
                stopped = True
                proc.kill()
                proc.wait()
                break
            time.sleep(0.2)
        out.seek(0)
        text = out.read()
    if stopped:
        return {"failed": f"stopped with {min_free:g} GiB left on the machine", "peak_rss": peak}
    if proc.returncode != 0:
        why = "killed (signal 9, out of memory?)" if proc.returncode == -9 else f"exit {proc.returncode}"
        print(text[-3000:], file=sys.stderr)
        return {"failed": why, "peak_rss": peak}
    # the JSON line is the child's last print, but stderr (merged) may write after it at exit
    last = next(line for line in reversed(text.splitlines()) if line.startswith('{"'))
    result = dict(json.loads(last))
    result["peak_rss"] = max(result["peak_rss"], peak)
    return result


def package_bytes(package: str, checkpoint: str) -> tuple[int, int]:
    """(bytes the package adds, bytes hard-linked from the checkpoint)."""
    inodes = {
        (s.st_dev, s.st_ino) for s in (os.stat(os.path.join(checkpoint, f)) for f in os.listdir(checkpoint))
    }
    own = linked = 0
    for dirpath, _, files in os.walk(package):
        for f in files:
            s = os.lstat(os.path.join(dirpath, f))
            if (s.st_dev, s.st_ino) in inodes or s.st_nlink > 1:
                linked += s.st_size
            else:
                own += s.st_size
    return own, linked


def graph_facts(package: str) -> tuple[int, str]:
    """The file's opset and how its weights are stored: the dtype holding most initializer bytes, its
    share, and the ops that read quantized weights."""
    import onnx

    proto = onnx.load(os.path.join(package, "model.onnx"), load_external_data=False)
    opset = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    by_dtype: dict[int, int] = {}
    for t in proto.graph.initializer:
        ext = {e.key: e.value for e in t.external_data}
        n = int(ext["length"]) if "length" in ext else len(t.raw_data)
        by_dtype[t.data_type] = by_dtype.get(t.data_type, 0) + n
    dtype, n = max(by_dtype.items(), key=lambda kv: kv[1])
    text = f"{onnx.TensorProto.DataType.Name(dtype).lower()} {n / sum(by_dtype.values()):.0%}"
    ops = {node.op_type for node in proto.graph.node}
    # a Cast reads the weights only when they are not stored as float32
    wanted = ("MatMulNBits", "DequantizeLinear") + (("Cast",) if dtype != onnx.TensorProto.FLOAT else ())
    readers = [op for op in wanted if op in ops]
    return opset, text + (f" ({', '.join(readers)})" if readers else "")


def fmt_s(x: float) -> str:
    return f"{x:.1f} s" if x < 100 else f"{x:.0f} s"


def gib(x: float) -> str:
    return f"{x / 2**30:.2f} GiB"


def report(
    results: dict[tuple[str, str, str], dict[str, Any]], a: argparse.Namespace, info: dict[str, Any]
) -> str:
    rows = []
    for (size, precision, tool), r in results.items():
        if "failed" in r:
            rows.append(
                [
                    size,
                    precision,
                    tool,
                    "",
                    f"failed: {r['failed']}",
                    f"≥ {gib(r['peak_rss'])}",
                    "",
                    "",
                    "",
                    "",
                ]
            )
            continue
        d = r.get("decode", {})
        step = (
            f"{d['step_s'] * 1e3:.1f} / {d['step_cpu_s'] * 1e3:.1f} ms"
            if "step_s" in d
            else f"failed: {d['failed']}"
            if "failed" in d
            else ""
        )
        prefill = fmt_s(d["prefill_s"]) if "prefill_s" in d else ""
        rows.append(
            [
                size,
                precision,
                tool,
                fmt_s(r["imports_s"]),
                fmt_s(r["work_s"]),
                gib(r["peak_rss"]),
                f"{gib(r['own'])} + {gib(r['linked'])}",
                r["weights"],
                step,
                prefill,
            ]
        )
    ratios = []
    for size, precision in dict.fromkeys((s, p) for s, p, _ in results):
        f, b = results[(size, precision, "fastonnx")], results[(size, precision, "builder")]
        if "failed" in f or "failed" in b:
            ratios.append(f"- {size} {precision}: no ratio (a tool failed)")
            continue
        parts = [
            f"work {f['work_s'] / b['work_s']:.2f}x the builder's",
            f"peak RSS {f['peak_rss'] / b['peak_rss']:.2f}x",
            # what a user ships: the package's own bytes and those it links from the checkpoint
            f"shipped bytes {(f['own'] + f['linked']) / (b['own'] + b['linked']):.2f}x",
        ]
        fd, bd = f.get("decode", {}), b.get("decode", {})
        if "step_s" in fd and "step_s" in bd:
            wall, cpu = (fd[k] / bd[k] for k in ("step_s", "step_cpu_s"))
            parts.append(f"decode step {wall:.2f}x (CPU time {cpu:.2f}x)")
            if "prefill_s" in fd and "prefill_s" in bd:
                parts.append(f"prefill {fd['prefill_s'] / bd['prefill_s']:.2f}x")
            if "turns" in fd and "turns" in bd:
                each = (" / ".join(f"{t * 1e3:.1f}" for t in d["turns"]) for d in (fd, bd))
                parts.append("steps by turn (ms) fastonnx {}, builder {}".format(*each))
        ratios.append(f"- {size} {precision}: fastonnx's " + ", ".join(parts))
    passed = "" if a.opset is None else f" --opset {a.opset}"
    passed += "" if a.optimize is None else f" --optimize {a.optimize}"
    passed += " --quantize-head" if a.quantize_head else ""
    passed += "" if a.block_size is None else f" --block-size {a.block_size}"
    defaults = "" if passed else " (the command's defaults)"
    passed = f" --decode-turns {a.decode_turns}{passed}"  # the command as run, turns included
    passed += "" if a.section == SECTION else f" --section {a.section}"
    decodes = [r["decode"] for r in results.values() if "step_cpu_s" in r.get("decode", {})]
    threads = max((d["step_cpu_s"] / d["step_s"] for d in decodes), default=0.0)
    return "\n".join(
        [
            "## A checkpoint folder to an onnxruntime-genai package: `fastonnx export` against the"
            " onnxruntime-genai model builder (benches/pretrained_vs_builder.py"
            + ("" if a.section == SECTION else f", `--section {a.section}`")
            + ")",
            "",
            f"{ledger.machine()}, onnxruntime-genai {info['genai']}, transformers {info['transformers']};"
            f" load average {info['load'][0]:.1f} at the start, {info['load'][1]:.1f} at the end; the whole"
            f" bench took {info['total_s'] / 60:.0f} min.",
            f"`python benches/pretrained_vs_builder.py --sizes {a.sizes} --runs {a.runs} --steps {a.steps}{passed}`.",
            "Folders: 8x1024 is a Llama-architecture folder (8 layers, hidden 1024, 16 / 4 heads, intermediate"
            " 2816, 32000 tokens, untied head, float32 random weights, `save_pretrained` plus a"
            " `PreTrainedTokenizerFast`); 3b is Llama-3.2-3B-shaped (28 layers, hidden 3072, 24 / 8 heads,"
            " intermediate 8192, 128256 tokens, tied embeddings, bf16 random weights, 6.4 GB of safetensors"
            " shards written tensor by tensor). fastonnx: `fastonnx export FOLDER OUT --task text-generation"
            f" --no-verify [precision flags]`, which used opset {info['opset']} and optimization level"
            f" `{info['optimize']}`{defaults}. Builder: `python -m onnxruntime_genai.models.builder"
            " -i FOLDER -o OUT -p P -e cpu [extra]`. Precision flags (fastonnx / builder): "
            + "; ".join(
                f"{name} `{' '.join(f) or '(none)'}` / `{' '.join(b)}`" for name, (f, b) in PRECISIONS.items()
            )
            + ". Each tool in a fresh process; imports timed apart from the"
            f" work (wall after the imports; median of {a.runs} runs); peak RSS is the process's VmHWM (a"
            " failed row: the last seen). Package: bytes it adds + bytes hard-linked from the checkpoint."
            f" Decode: onnxruntime-genai `Generator`, 1 intra-op / 1 inter-op thread, a {PAST}-token prompt"
            f" appended (its time: prefill), then the median of {a.steps} single-token steps at past {PAST};"
            f" each package decoded in {a.decode_turns} fresh processes, the tools alternated turn by turn,"
            " and the table gives the median over the turns"
            f" (CPU time: the process's during the step, at most {threads:.2f}x the wall time, so one thread"
            " computed; on this shared machine the wall time also counts waiting for a core).",
            "",
            ledger.table(
                [
                    "folder",
                    "precision",
                    "tool",
                    "imports",
                    "work",
                    "peak RSS",
                    "package (own + linked)",
                    "weights (largest dtype by bytes; readers)",
                    f"decode step, past {PAST} (wall / CPU)",
                    f"prefill {PAST}",
                ],
                rows,
            ),
            "",
            "Targets (reported, not asserted): at 3b, fastonnx's work ≤ 1/3 of the builder's and its peak RSS"
            f" ≤ 1/2; its decode step at past {PAST} no slower than the builder's package's. Issue 43's, at"
            " 3b: the int4 decode step ≤ 0.9x the builder's at `--optimize onnxruntime` and ≤ 1.0x at the"
            f" standard level, fp32's ≤ 0.6x, prefill of {PAST} tokens ≤ 1.0x; shipped bytes (own + linked)"
            " ≤ the builder's.",
            "",
            *ratios,
        ]
    )


def parse_sizes(text: str) -> list[tuple[str, tuple[str, ...]]]:
    sizes = []
    for item in text.split(","):
        name, _, precisions = item.partition(":")
        if name != "3b" and "x" not in name:
            raise SystemExit(f"--sizes: {item!r} is neither LAYERSxHIDDEN nor 3b")
        chosen = tuple(precisions.split("+")) if precisions else ("fp32", "int4")
        unknown = [x for x in chosen if x not in PRECISIONS]
        if unknown:
            raise SystemExit(f"--sizes: precision(s) {unknown} are not among {sorted(PRECISIONS)}")
        sizes.append((name, chosen))
    return sizes


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--sizes", default="8x1024,3b", help="8x1024 and/or 3b, each optionally :fp32+fp16+int4+int4mixed"
    )
    p.add_argument("--runs", type=int, default=1, help="exports per tool and precision (median)")
    p.add_argument("--steps", type=int, default=16, help="decode steps timed after the prompt (median)")
    p.add_argument(
        "--decode-turns",
        type=int,
        default=5,
        help="decode processes per tool, alternated (median of medians)",
    )
    p.add_argument("--dir", default=None, help="where the folders go (default: the system's temp)")
    p.add_argument(
        "--min-free", type=float, default=1.0, help="GiB left on the machine before a tool is stopped"
    )
    p.add_argument("--opset", type=int, default=None, help="fastonnx export's --opset (default: its own)")
    p.add_argument("--optimize", default=None, help="fastonnx export's --optimize (default: default)")
    p.add_argument(
        "--quantize-head",
        action="store_true",
        help="fastonnx export's --quantize-head at int4 (the builder quantizes its LM head by default)",
    )
    p.add_argument(
        "--block-size",
        type=int,
        default=None,
        help="int4 / int8 block size for both tools (fastonnx's --block-size, the builder's block_size; "
        "default: their 32)",
    )
    p.add_argument("--no-ledger", action="store_true", help="print only, leave docs/benchmarks.md alone")
    p.add_argument(
        "--section",
        default=SECTION,
        help=f"the docs/benchmarks.md section the run writes (default: {SECTION})",
    )
    p.add_argument("--child", nargs=4, metavar=("TOOL", "PRECISION", "FOLDER", "OUT"), help=argparse.SUPPRESS)
    p.add_argument("--decode", nargs=3, metavar=("PACKAGE", "STEPS", "VOCAB"), help=argparse.SUPPRESS)
    p.add_argument("--write", nargs=2, metavar=("SIZE", "FOLDER"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        extra = [] if a.opset is None else ["--opset", str(a.opset)]
        extra += [] if a.optimize is None else ["--optimize", a.optimize]
        extra += ["--quantize-head"] if a.quantize_head and a.child[1] == "int4" else []
        quantized = a.child[1].startswith("int")
        extra += ["--block-size", str(a.block_size)] if a.block_size is not None and quantized else []
        print(json.dumps(child_export(*a.child, extra)))
        return
    if a.decode:
        print(json.dumps(child_decode(a.decode[0], int(a.decode[1]), int(a.decode[2]))))
        return
    if a.write:
        write_size(*a.write)
        return
    import onnxruntime_genai
    import transformers

    start, load = time.perf_counter(), os.getloadavg()[0]
    sizes = parse_sizes(a.sizes)
    results: dict[tuple[str, str, str], dict[str, Any]] = {}
    info: dict[str, Any] = {"genai": onnxruntime_genai.__version__, "transformers": transformers.__version__}
    root = tempfile.mkdtemp(prefix="pretrained_vs_builder.", dir=a.dir)
    try:
        for size, precisions in sizes:
            folder = os.path.join(root, size)
            t = time.perf_counter()
            # in a child: the parent stays small while the tools run
            subprocess.run(
                [sys.executable, __file__, "--write", size, folder],
                check=True,
                env={**os.environ, "PYTHONPATH": os.path.join(ROOT, "python")},
            )
            print(f"{size}: folder written in {time.perf_counter() - t:.0f} s", flush=True)
            with open(os.path.join(folder, "config.json")) as f:
                vocab = int(json.load(f)["vocab_size"])
            for precision in precisions:
                runs: dict[str, list[dict[str, Any]]] = {tool: [] for tool in TOOLS}
                kept: dict[str, str] = {}
                for run in range(a.runs):
                    for tool in TOOLS if run % 2 == 0 else tuple(reversed(TOOLS)):
                        out = os.path.join(root, f"{size}-{precision}-{tool}-{run}")
                        log = out + ".log"
                        passed = [] if a.opset is None else ["--opset", str(a.opset)]
                        passed += [] if a.optimize is None else ["--optimize", a.optimize]
                        passed += ["--quantize-head"] if a.quantize_head else []
                        passed += [] if a.block_size is None else ["--block-size", str(a.block_size)]
                        r = run_child(["--child", tool, precision, folder, out, *passed], a.min_free, log)
                        print(f"{size} {precision} {tool} run {run + 1}: {r}", flush=True)
                        if "failed" not in r:
                            r["own"], r["linked"] = package_bytes(out, folder)
                            r["opset"], r["weights"] = graph_facts(out)
                            if tool == "fastonnx":
                                info["opset"] = r["opset"]
                                info["optimize"] = r["optimize"]
                        os.remove(log)
                        if run == 0 and "failed" not in r:
                            kept[tool] = out  # its decode is timed after the runs, in turns
                        else:
                            shutil.rmtree(out, ignore_errors=True)
                        runs[tool].append(r)
                decodes = decode_turns(kept, a, vocab, f"{size} {precision}")
                for out in kept.values():
                    shutil.rmtree(out, ignore_errors=True)
                for tool, rs in runs.items():
                    ok = [r for r in rs if "failed" not in r]
                    if not ok:
                        results[(size, precision, tool)] = rs[0]
                        continue
                    merged = dict(ok[0])
                    for key in ("imports_s", "work_s", "peak_rss"):
                        merged[key] = statistics.median(r[key] for r in ok)
                    if tool in decodes:
                        merged["decode"] = decodes[tool]
                    results[(size, precision, tool)] = merged
            shutil.rmtree(folder, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    info["load"] = (load, os.getloadavg()[0])
    info["total_s"] = time.perf_counter() - start
    info.setdefault("opset", "?")
    info.setdefault("optimize", "?")
    text = report(results, a, info)
    print(text)
    print(f"the whole bench took {info['total_s'] / 60:.1f} min")
    if not a.no_ledger:
        ledger.write_section(a.section, text)


if __name__ == "__main__":
    main()
