"""A Llama-3-8B-shaped random bf16 checkpoint (15 GiB at 32 layers) exported three ways, each in a fresh
process: the real model's weights written (today's path), a meta-device model + attach_weights, and a
meta-device model referencing the shards in place (to_onnx(weights=)).

    PYTHONPATH=python python benches/inplace_big.py [--layers 32] [--dir /path/on/the/same/disk]

The checkpoint is written once with safetensors (a random 1 Mi-element bf16 block tiled: the values do
not matter to an export), in shards of at most 2 GiB; every variant's output is deleted before the
next, and everything (checkpoint included) at the end, also on failure. The real model's parameters
are the checkpoint's tensors mapped from the shards (mmap, copy-on-write): loading 15 GiB into this
machine's 24 GiB is not what is measured, and their pages count in the peak RSS once written out.
Per variant: the stages' times (to_onnx's stats, attach_weights' own time), the total, the bytes
written and the peak RSS (``resource.getrusage``, the child process). Target for in place: torch.export's
time (capture) plus under a second, peak RSS under 2 GiB. Writes the section ``inplace_big`` of
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SHARD_BYTES = 2 << 30
VARIANTS = ("real, written", "meta + attach_weights", "meta, in place")


def config(layers: int) -> Any:
    import torch
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=layers,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=8192,
        rope_theta=500000.0,
        tie_word_embeddings=False,
        use_cache=False,
        dtype=torch.bfloat16,
    )


def meta_model(layers: int) -> Any:
    import torch
    from transformers import LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    cfg = config(layers)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    # rotary frequencies: a non-persistent buffer, in no checkpoint
    model.model.rotary_emb = LlamaRotaryEmbedding(cfg)
    return model


def write_checkpoint(folder: str, layers: int) -> int:
    """The checkpoint's shards, written one at a time; returns its size in bytes."""
    import torch
    from safetensors.torch import save_file

    shapes = {k: tuple(v.shape) for k, v in meta_model(layers).state_dict().items() if k != "lm_head.weight"}
    shapes["lm_head.weight"] = shapes["model.embed_tokens.weight"]
    block = torch.randn(1 << 20, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    groups: list[list[str]] = [[]]
    size = 0
    for key, shape in shapes.items():
        n = 2 * int(torch.Size(shape).numel())
        if groups[-1] and size + n > SHARD_BYTES:
            groups.append([])
            size = 0
        groups[-1].append(key)
        size += n
    total = 0
    for i, keys in enumerate(groups):
        tensors = {}
        for key in keys:
            numel = int(torch.Size(shapes[key]).numel())
            tensors[key] = block.repeat(numel // block.numel() + 1)[:numel].view(shapes[key]).clone()
        name = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        save_file(tensors, os.path.join(folder, name), metadata={"format": "pt"})
        total += os.path.getsize(os.path.join(folder, name))
        del tensors
    return total


def mapped_state_dict(folder: str) -> dict[str, Any]:
    """The checkpoint's tensors viewed in place in the shards (private mappings: nothing is read yet)."""
    import torch

    from fastonnx.stored_weights import checkpoints as inplace

    maps: dict[str, mmap.mmap] = {}
    out = {}
    for key, t in inplace.index_shards(inplace.shard_files(folder)).items():
        if t.shard not in maps:
            with open(t.shard, "rb") as f:
                maps[t.shard] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        assert isinstance(t.dtype, torch.dtype)
        numel = t.length // t.dtype.itemsize
        out[key] = torch.frombuffer(maps[t.shard], dtype=t.dtype, count=numel, offset=t.offset).view(t.shape)
    return out


def run_variant(variant: str, ckpt: str, out: str, layers: int) -> dict[str, Any]:
    """One export, in this (fresh) process."""
    import torch

    import fastonnx
    from support.model_zoo import Logits

    t0 = time.perf_counter()
    model = meta_model(layers)
    ids = torch.randint(0, 128256, (1, 16))
    mask = torch.ones(1, 16, dtype=torch.int64)
    stages: dict[str, float] = {}
    if variant == "real, written":
        model.load_state_dict(mapped_state_dict(ckpt), assign=True)
        args: tuple[Any, ...] = (ids, mask)
        path, weights = os.path.join(out, "model.onnx"), None
    else:
        args = (ids.to("meta"), mask.to("meta"))
        in_place = variant == "meta, in place"
        path = os.path.join(ckpt if in_place else out, "model.onnx")
        weights = ckpt if in_place else None
    stages["build"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    r = fastonnx.to_onnx(
        Logits(model), args, filename=path, external_data=True, weights=weights, progress=False
    )
    for s in ("capture", "convert", "optimize", "write"):
        stages[s] = r.stats[f"{s}_s"]
    stages["to_onnx"] = time.perf_counter() - t1
    if variant == "meta + attach_weights":
        t2 = time.perf_counter()
        # the exported module is Logits(model): its state-dict keys start with "m."
        fastonnx.attach_weights(path, {f"m.{k}": v for k, v in mapped_state_dict(ckpt).items()})
        stages["attach"] = time.perf_counter() - t2
    f = r.stats["file"]
    written = os.path.getsize(path) + (
        os.path.getsize(path + ".data") if os.path.exists(path + ".data") else 0
    )
    w = f.get("weights", {})
    return {
        "stages": stages,
        "total": time.perf_counter() - t0,
        "written": written,
        "referenced": w.get("referenced_bytes", 0),
        "read_as_stored": w.get("read_as_stored", 0),
        "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


def child(variant: str, ckpt: str, out: str, layers: int) -> dict[str, Any]:
    cmd = [
        sys.executable,
        __file__,
        "--variant",
        variant,
        "--ckpt",
        ckpt,
        "--out",
        out,
        "--layers",
        str(layers),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{variant}: {proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--dir", default=os.environ.get("BENCH_DIR"))
    ap.add_argument("--variant", help=argparse.SUPPRESS)
    ap.add_argument("--ckpt", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.variant == "checkpoint":
        print(json.dumps({"size": write_checkpoint(a.ckpt, a.layers)}))
        return
    if a.variant:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
        print(json.dumps(run_variant(a.variant, a.ckpt, a.out, a.layers)))
        return

    from ledger import machine, table, write_section

    root = tempfile.mkdtemp(prefix="inplace-big-", dir=a.dir)
    results: dict[str, dict[str, Any]] = {}
    try:
        ckpt, out = os.path.join(root, "ckpt"), os.path.join(root, "out")
        os.mkdir(ckpt)
        os.mkdir(out)
        t0 = time.perf_counter()
        # every step in a child process, this one stays small: a child's ru_maxrss starts at the RSS
        # its parent had when it forked (Linux keeps the high-water mark across exec)
        size = child("checkpoint", ckpt, out, a.layers)["size"]
        print(f"checkpoint: {size / 2**30:.2f} GiB in {time.perf_counter() - t0:.1f} s", flush=True)
        for variant in VARIANTS:
            results[variant] = child(variant, ckpt, out, a.layers)
            print(variant, results[variant], flush=True)
            for leftover in os.listdir(out):
                os.unlink(os.path.join(out, leftover))
            for leftover in ("model.onnx", "model.onnx.data"):
                if os.path.exists(os.path.join(ckpt, leftover)):
                    os.unlink(os.path.join(ckpt, leftover))
    finally:
        shutil.rmtree(root)

    def s(v: dict[str, Any], k: str) -> str:
        return f"{v['stages'][k]:.2f}" if k in v["stages"] else "-"

    rows = [
        [
            name,
            s(v, "build"),
            s(v, "capture"),
            s(v, "convert"),
            s(v, "optimize"),
            s(v, "write"),
            s(v, "attach"),
            f"{v['total']:.2f}",
            f"{v['written'] / 2**30:.2f}",
            f"{v['referenced'] / 2**30:.2f}",
            f"{v['peak_rss'] / 2**30:.2f}",
        ]
        for name, v in results.items()
    ]
    headers = [
        "variant",
        "build s",
        "capture s",
        "convert s",
        "optimize s",
        "write s",
        "attach s",
        "total s",
        "written GiB",
        "referenced GiB",
        "peak RSS GiB",
    ]
    ip = results["meta, in place"]
    beyond = ip["stages"]["to_onnx"] - ip["stages"]["capture"]
    scale = (
        "the full 32 layers"
        if a.layers == 32
        else f"{a.layers} of the 32 layers (to fit the time on this machine)"
    )
    body = "\n".join(
        [
            "## Checkpoints in place: a Llama-3-8B-shaped bf16 checkpoint exported three ways",
            "",
            f"`python benches/inplace_big.py --layers {a.layers}`; {machine()}.",
            f"A random bf16 checkpoint of Llama-3-8B's shapes, {scale}: {size / 2**30:.2f} GiB in",
            "safetensors shards of at most 2 GiB. One fresh process per variant; the real model's",
            "parameters are the checkpoint's tensors mapped from the shards (copy-on-write mmap), so its",
            "peak RSS counts the pages written out. Build = the model on the meta device (and mapped",
            "weights); capture = torch.export; attach = `fastonnx.attach_weights` from the mapped tensors.",
            "",
            table(headers, rows),
            "",
            f"In place: to_onnx took torch.export's {ip['stages']['capture']:.2f} s plus {beyond:.2f} s "
            f"(target: under 1 s), peak RSS {ip['peak_rss'] / 2**30:.2f} GiB (target: under 2 GiB); "
            f"{ip['written'] / 2**20:.1f} MiB written, {ip['read_as_stored']} Linear products read their "
            "weight as stored.",
        ]
    )
    write_section("inplace_big", body)
    print(body)


if __name__ == "__main__":
    main()
