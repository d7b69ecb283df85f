"""Peak memory of quantize= from a checkpoint: a Llama-architecture float32 checkpoint (8 layers, hidden
1024, 32000 tokens: 0.6 GB) exported from a meta-device model with ``weights=``, each variant in a fresh
process: referenced in place without quantization (the control: nothing is read or written), then
``quantize="int4"`` / ``"int8"`` at the standard level and int4 at the "onnxruntime" level, where the
writer reads every product's weight from the shard and quantizes it as it streams.

    PYTHONPATH=python python benches/quantize_memory.py [--layers 8] [--hidden 1024] [--dir DIR]
    python benches/quantize_memory.py --no-ledger             # print only

Per variant: the process's resident memory once torch, transformers and fastonnx are imported and the
meta model is built (``VmRSS``), its peak over the export (``VmHWM``), the growth, the bytes written and
the export's time. The quantizer holds one piece of float32 values at a time per tensor in flight (at
most 2 MiB, or 512 values of each of a weight's N rows at the standard level when that is more: 5.5
MiB for the MLP's N = 2816 here), the writer four 2 MiB buffers: the growth over the control stays near
that, far below the largest float weight (the MLP's, 11.5 MB here) and the checkpoint (0.6 GB). Regenerates the
quantize_memory section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ledger

VARIANTS = ("in place, float (control)", "int4, standard", "int4, onnxruntime", "int8, standard")
LABELS = {
    VARIANTS[0]: "in place, float (control)",
    VARIANTS[1]: '`quantize="int4"`, standard level',
    VARIANTS[2]: '`quantize="int4"`, `optimize="onnxruntime"`',
    VARIANTS[3]: '`quantize="int8"`, standard level',
}
MIB = 2**20


def config(layers: int, hidden: int) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=32000,
        hidden_size=hidden,
        intermediate_size=int(hidden * 2.75) // 64 * 64,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 256,
        max_position_embeddings=2048,
        use_cache=False,
        tie_word_embeddings=False,
    )


def products(layers: int, hidden: int) -> tuple[int, int, int]:
    """The decoder's product weights (q, k, v, o, gate, up, down per layer): (float32 bytes per layer, of
    all layers, of the largest)."""
    cfg = config(layers, hidden)
    kv = hidden // cfg.num_attention_heads * cfg.num_key_value_heads
    sizes = [hidden * hidden, kv * hidden, kv * hidden, hidden * hidden] + [
        cfg.intermediate_size * hidden
    ] * 3
    per_layer = sum(sizes) * 4
    return per_layer, per_layer * layers, max(sizes) * 4


def write_checkpoint(folder: str, layers: int, hidden: int) -> int:
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(config(layers, hidden)).eval()
    model.save_pretrained(folder)
    return sum(p.numel() * p.element_size() for p in model.parameters())


def status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def run_variant(variant: str, ckpt: str, out: str, layers: int, hidden: int) -> dict[str, Any]:
    import torch
    from transformers import LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    import fastonnx

    cfg = config(layers, hidden)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg).eval()
    model.model.rotary_emb = LlamaRotaryEmbedding(cfg)
    ids = torch.zeros(1, 16, dtype=torch.int64, device="meta")
    mask = torch.ones(1, 16, dtype=torch.int64, device="meta")
    quantize: Any = None
    optimize: Any = True
    if variant != VARIANTS[0]:
        quantize = "int8" if variant.startswith("int8") else "int4"
        optimize = "onnxruntime" if "onnxruntime" in variant else True
    baseline = status("VmRSS")
    t0 = time.perf_counter()
    r = fastonnx.to_onnx(
        model,
        (ids,),
        {"attention_mask": mask},
        filename=os.path.join(out, "model.onnx"),
        weights=ckpt,
        optimize=optimize,
        quantize=quantize,
    )
    seconds = time.perf_counter() - t0
    peak = status("VmHWM")
    q = r.stats.get("quantize")
    return {
        "variant": variant,
        "baseline_rss": baseline,
        "peak_rss": peak,
        "growth": peak - baseline,
        "seconds": seconds,
        "write_s": r.stats["write_s"],
        "written_bytes": r.stats["file"]["weights"]["written_bytes"],
        "quantized": len(q["quantized"]) if q else 0,
    }


def written(n: int) -> str:
    if n == 0:
        return "0"
    return f"{n / 1024:.0f} KiB" if n < MIB / 10 else f"{n / MIB:.1f} MiB"


def report(
    rows: list[dict[str, Any]], a: argparse.Namespace, float_bytes: int, load: tuple[float, float]
) -> str:
    per_layer, read, largest = products(a.layers, a.hidden)
    # the quantizer's float32 piece: 2 MiB, or 512 values of each of the N rows of the widest weight
    # (the MLP's gate / up, N = intermediate size) at the standard level
    piece = max(2 * MIB, 512 * config(a.layers, a.hidden).intermediate_size * 4)
    control = rows[0]
    quantized = rows[1:]
    worst = max(quantized, key=lambda r: r["growth"])
    excess = (worst["growth"] - control["growth"]) / MIB
    counts = sorted({r["quantized"] for r in quantized})
    count = "/".join(map(str, counts))
    table = ledger.table(
        ["variant", "RSS before", "peak", "growth", "written", "time"],
        [
            [
                LABELS[r["variant"]],
                f"{r['baseline_rss'] / MIB:.0f} MiB",
                f"{r['peak_rss'] / MIB:.0f} MiB",
                f"{r['growth'] / MIB:.1f} MiB",
                written(r["written_bytes"]),
                f"{r['seconds']:.2f} s",
            ]
            for r in rows
        ],
    )
    if excess > 0:
        cost = f"costs at most {excess:.1f} MiB over the control ({LABELS[worst['variant']]})"
    else:
        cost = "costs nothing measurable over the control (no variant's growth exceeds it)"
    control_writes = "nothing read or written"
    if control["written_bytes"]:
        control_writes = (
            f"none read or written; its {written(control['written_bytes'])} are the graph's other constants"
        )
    relation = "less than" if excess * MIB < largest else "more than"
    return "\n".join(
        [
            "## Weight-only quantization from a checkpoint: memory (benches/quantize_memory.py)",
            "",
            f"{ledger.machine()}; load average {load[0]:.1f} at the start, {load[1]:.1f} at the end (the times",
            "are the machine's, not the work's).",
            f"`python benches/quantize_memory.py --layers {a.layers} --hidden {a.hidden}`: a Llama-architecture",
            f"float32 checkpoint ({a.layers} layers, hidden {a.hidden}, 32000 tokens, untied head:",
            f"{float_bytes / MIB:.0f} MiB) saved with `save_pretrained`, exported from a meta-device model with",
            '`weights=`, each variant in a fresh process. "RSS before" is the process once torch, transformers',
            'and fastonnx are imported and the meta model built; "growth" is its peak over the export',
            f"(`VmHWM`) minus that. The control references every weight in place ({control_writes}); the",
            f"quantized variants read the {count} product weights ({per_layer / 1e6:.0f} MB per layer) from the",
            "shard and write their codes and scales (the LM head and the embedding stay float, referenced).",
            "",
            table,
            "",
            f"Quantizing while streaming {cost}: one piece of float32 values (at most {piece / MIB:.1f} MiB:",
            "2 MiB, or 512 values of each of the weight's N rows at the standard level) being quantized",
            f"and the writer's buffers, {relation} the largest float weight ({largest / 1e6:.1f} MB, an MLP",
            f"projection); the weights read are {read / 1e6:.0f} MB.",
        ]
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--dir", default=None)
    p.add_argument("--no-ledger", action="store_true", help="print only, leave docs/benchmarks.md alone")
    p.add_argument("--child", nargs=2, metavar=("VARIANT", "CKPT"))
    a = p.parse_args()
    if a.child:
        out = tempfile.mkdtemp(dir=a.child[1])
        try:
            print(json.dumps(run_variant(a.child[0], a.child[1], out, a.layers, a.hidden)))
        finally:
            shutil.rmtree(out, ignore_errors=True)
        return
    start = os.getloadavg()[0]
    root = tempfile.mkdtemp(dir=a.dir)
    rows: list[dict[str, Any]] = []
    try:
        ckpt = os.path.join(root, "ckpt")
        float_bytes = write_checkpoint(ckpt, a.layers, a.hidden)
        print(f"checkpoint: {float_bytes / MIB:.0f} MiB float32, {a.layers} layers, hidden {a.hidden}")
        print(f"{'variant':28} {'RSS before':>11} {'peak':>9} {'growth':>8} {'written':>9} {'time':>7}")
        for variant in VARIANTS:
            cmd = [sys.executable, __file__, "--layers", str(a.layers), "--hidden", str(a.hidden)]
            proc = subprocess.run([*cmd, "--child", variant, ckpt], capture_output=True, text=True)
            if proc.returncode != 0:
                print(proc.stderr[-3000:])
                raise SystemExit(f"{variant} failed")
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            rows.append(r)
            print(
                f"{variant:28} {r['baseline_rss'] / MIB:9.0f} M {r['peak_rss'] / MIB:7.0f} M "
                f"{r['growth'] / MIB:6.1f} M {r['written_bytes'] / MIB:7.1f} M {r['seconds']:6.2f}s",
                flush=True,
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    text = report(rows, a, float_bytes, (start, os.getloadavg()[0]))
    print(text)
    if not a.no_ledger:
        ledger.write_section("quantize_memory", text)


if __name__ == "__main__":
    main()
