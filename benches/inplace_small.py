"""to_onnx(weights=<shards>) against writing the weights, on a Llama-shaped random checkpoint (~0.45 GB fp32).

    PYTHONPATH=python python benches/inplace_small.py [--layers 4] [--hidden 1024]

Three exports of the same checkpoint, each output deleted before the next: the real model written
(today), a meta-device instance referencing the shards in place, the real model referencing them (its
Linear weights read as stored, so referenced too). Prints the stages' times and the bytes written.
The 15 GiB Llama-3-8B-shaped bench is benches/inplace_big.py.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

import torch

import fastonnx


class Logits(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.m = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.m(input_ids=input_ids, attention_mask=attention_mask).logits


def main() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=1024)
    a = ap.parse_args()
    cfg = LlamaConfig(
        vocab_size=32000,
        hidden_size=a.hidden,
        intermediate_size=a.hidden * 11 // 4,
        num_hidden_layers=a.layers,
        num_attention_heads=a.hidden // 64,
        num_key_value_heads=a.hidden // 256,
        use_cache=False,
    )
    ids = torch.randint(0, 32000, (1, 16))
    mask = torch.ones(1, 16, dtype=torch.int64)
    root = tempfile.mkdtemp(prefix="inplace-bench-", dir=os.environ.get("BENCH_DIR"))
    try:
        ckpt = os.path.join(root, "ckpt")
        real = LlamaForCausalLM(cfg).eval()
        real.save_pretrained(ckpt, max_shard_size="200MB")
        size = sum(os.path.getsize(os.path.join(ckpt, f)) for f in os.listdir(ckpt))
        print(f"checkpoint: {size / 1e9:.2f} GB in {len(os.listdir(ckpt))} files")
        with torch.device("meta"):
            meta = LlamaForCausalLM(cfg).eval()
        meta.model.rotary_emb = LlamaRotaryEmbedding(cfg)
        runs = [
            ("real, written", Logits(real), (ids, mask), None),
            ("meta, in place", Logits(meta), (ids.to("meta"), mask.to("meta")), ckpt),
            ("real, in place", Logits(real), (ids, mask), ckpt),
        ]
        print(
            "| export | capture s | convert s | optimize s | write s | total s | written MB | referenced MB |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for label, model, args, weights in runs:
            path = os.path.join(ckpt, "model.onnx")
            t0 = time.perf_counter()
            r = fastonnx.to_onnx(model, args, filename=path, external_data=True, weights=weights)
            total = time.perf_counter() - t0
            s, f = r.stats, r.stats["file"]
            written = (f["data_bytes"] if f["data_path"] else 0) + f["model_bytes"]
            referenced = f.get("weights", {}).get("referenced_bytes", 0)
            print(
                f"| {label} | {s['capture_s']:.2f} | {s['convert_s']:.2f} | {s['optimize_s']:.2f} | "
                f"{s['write_s']:.2f} | {total:.2f} | {written / 1e6:.0f} | {referenced / 1e6:.0f} |"
            )
            for p in (path, path + ".data"):
                if os.path.exists(p):
                    os.unlink(p)
    finally:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
