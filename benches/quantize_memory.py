"""Peak memory of quantize= from a checkpoint: a Llama-architecture float32 checkpoint (8 layers, hidden
1024, 32000 tokens: 0.6 GB) exported from a meta-device model with ``weights=``, each variant in a fresh
process: referenced in place without quantization (the control: nothing is read or written), then
``quantize="int4"`` / ``"int8"`` at the standard level and int4 at the "onnxruntime" level, where the
writer reads every product's weight from the shard and quantizes it as it streams.

    PYTHONPATH=python python benches/quantize_memory.py [--layers 8] [--hidden 1024] [--dir DIR]

Per variant: the process's resident memory once torch, transformers and fastonnx are imported and the
meta model is built (``VmRSS``), its peak over the export (``VmHWM``), the growth, the bytes written and
the export's time. The quantizer holds one piece of float32 values at a time (at most 2 MiB) per tensor
in flight, the writer four 2 MiB buffers: the growth over the control stays near that, far below the
largest float weight (the MLP's, 11.5 MB here) and the checkpoint (0.6 GB).
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

VARIANTS = ("in place, float (control)", "int4, standard", "int4, onnxruntime", "int8, standard")


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


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--dir", default=None)
    p.add_argument("--child", nargs=2, metavar=("VARIANT", "CKPT"))
    a = p.parse_args()
    if a.child:
        out = tempfile.mkdtemp(dir=a.child[1])
        try:
            print(json.dumps(run_variant(a.child[0], a.child[1], out, a.layers, a.hidden)))
        finally:
            shutil.rmtree(out, ignore_errors=True)
        return
    root = tempfile.mkdtemp(dir=a.dir)
    try:
        ckpt = os.path.join(root, "ckpt")
        float_bytes = write_checkpoint(ckpt, a.layers, a.hidden)
        print(f"checkpoint: {float_bytes / 2**20:.0f} MiB float32, {a.layers} layers, hidden {a.hidden}")
        print(f"{'variant':28} {'RSS before':>11} {'peak':>9} {'growth':>8} {'written':>9} {'time':>7}")
        for variant in VARIANTS:
            cmd = [sys.executable, __file__, "--layers", str(a.layers), "--hidden", str(a.hidden)]
            proc = subprocess.run([*cmd, "--child", variant, ckpt], capture_output=True, text=True)
            if proc.returncode != 0:
                print(proc.stderr[-3000:])
                raise SystemExit(f"{variant} failed")
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            mib = 2**20
            print(
                f"{variant:28} {r['baseline_rss'] / mib:9.0f} M {r['peak_rss'] / mib:7.0f} M "
                f"{r['growth'] / mib:6.1f} M {r['written_bytes'] / mib:7.1f} M {r['seconds']:6.2f}s"
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
