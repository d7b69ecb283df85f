"""torch.compile(backend="fastonnx") against eager and against backend="inductor": compile time
(the first call, dynamo and the backend included) and steady-state latency (median of --runs calls
after --warmup), for inference and for one training step (forward, backward, SGD step), on a small
Llama and a ResNet-18. Regenerates its section of docs/benchmarks.md (stamped with the commit and
machine).

    python benches/compile_backend.py
    python benches/compile_backend.py --runs 10 --models llama
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
import fastonnx
import ledger
from support.model_zoo import Logits, with_calibrated_batchnorm

BACKENDS = ("eager", "fastonnx", "inductor")


def llama() -> tuple[torch.nn.Module, tuple[Any, ...], Callable[[Any], torch.Tensor]]:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=4096,
        hidden_size=256,
        intermediate_size=704,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        use_cache=False,
    )
    torch.manual_seed(0)
    ids = torch.randint(3, 4096, (2, 64), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    return Logits(LlamaForCausalLM(cfg)), (ids, mask), lambda out: out.float().logsumexp(-1).mean()


def resnet() -> tuple[torch.nn.Module, tuple[Any, ...], Callable[[Any], torch.Tensor]]:
    import torchvision

    torch.manual_seed(0)
    model = with_calibrated_batchnorm(torchvision.models.resnet18(weights=None), 64)
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    return model, (x,), lambda out: out.logsumexp(-1).mean()


MODELS = {"llama": llama, "resnet18": resnet}


def _compiled(model: torch.nn.Module, backend: str, threads: int) -> Any:
    if backend == "eager":
        return model
    torch._dynamo.reset()
    if backend != "fastonnx":
        return torch.compile(model, backend=backend)
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = threads
    _last_backend[0] = fastonnx.backend(session_options=options)
    return torch.compile(model, backend=_last_backend[0])


_last_backend: list[Any] = [None]  # the fastonnx backend of the current measure, for its stats


def measure(name: str, backend: str, mode: str, warmup: int, runs: int, threads: int) -> dict[str, Any]:
    model, args, loss_of = MODELS[name]()
    model = copy.deepcopy(model).eval() if mode == "inference" else copy.deepcopy(model).train()
    fn = _compiled(model, backend, threads)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step() -> None:
        if mode == "inference":
            with torch.no_grad():
                fn(*args)
            return
        loss_of(fn(*args)).backward()
        opt.step()
        opt.zero_grad()

    t0 = time.perf_counter()
    step()
    first = time.perf_counter() - t0
    fell_back = []
    if backend == "fastonnx":
        fell_back = [s.name.rsplit("_", 1)[-1] for s in _last_backend[0].stats if s.fell_back]
    for _ in range(warmup):
        step()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    steady = ledger.median(times)
    return {
        "model": name,
        "mode": mode,
        "backend": backend,
        "first_s": first,
        "steady_ms": steady * 1e3,
        "eager_graphs": ", ".join(fell_back) or "-",
    }


def report(rows: list[dict[str, Any]], runs: int, threads: int) -> str:
    by = {(r["model"], r["mode"], r["backend"]): r for r in rows}
    table_rows = []
    for r in rows:
        if r["backend"] == "eager":
            continue
        eager = by[(r["model"], r["mode"], "eager")]
        table_rows.append(
            [
                r["model"],
                r["mode"],
                r["backend"],
                f"{r['first_s']:.2f}",
                f"{r['steady_ms']:.2f}",
                f"{eager['steady_ms']:.2f}",
                f"{r['steady_ms'] / eager['steady_ms']:.2f}x",
                r.get("eager_graphs", "-"),
            ]
        )
    lines = [
        "## torch.compile backends (benches/compile_backend.py)",
        "",
        f"Measured: {ledger.machine()}.",
        f"Latency is the median of {runs} calls after warm-up; compile is the first call (dynamo + the "
        "backend's compile + one run), cold (inductor's caches disabled). Training is one forward + backward + SGD step. "
        "Llama: 2 layers, hidden 256, vocab 4096, batch 2 x 64 tokens; ResNet-18 on 2 x 3 x 64 x 64. "
        f"torch and onnxruntime use {threads} intra-op thread(s). The machine was shared with other jobs: "
        "figures are indicative.",
        "",
        ledger.table(
            [
                "model",
                "mode",
                "backend",
                "compile s",
                "latency ms",
                "eager ms",
                "latency / eager",
                "graphs run eagerly (fastonnx fallback)",
            ],
            table_rows,
        ),
    ]
    for model in sorted({r["model"] for r in rows}):
        for mode in ("inference", "training"):
            f, i = by.get((model, mode, "fastonnx")), by.get((model, mode, "inductor"))
            if f and i:
                lines.append(
                    f"- {model} {mode}: fastonnx / inductor latency {f['steady_ms'] / i['steady_ms']:.2f}x, "
                    f"compile {f['first_s'] / i['first_s']:.2f}x"
                )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--modes", default="inference,training")
    p.add_argument("--backends", default=",".join(BACKENDS))
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--threads", type=int, default=1, help="torch's and onnxruntime's intra-op threads")
    a = p.parse_args()
    # one thread each by default: on a shared machine, thread pools waiting on descheduled workers
    # dominate (eager Llama went from ~10 ms to ~800 ms a call with 2 threads under load)
    torch.set_num_threads(a.threads)
    # a cold compile each time: inductor's on-disk caches would otherwise serve a rerun's graphs
    from torch._inductor import config as inductor_config

    inductor_config.force_disable_caches = True
    rows = []
    for name in a.models.split(","):
        for mode in a.modes.split(","):
            for backend in a.backends.split(","):
                row = measure(name, backend, mode, a.warmup, a.runs, a.threads)
                print(row, flush=True)
                rows.append(row)
    text = report(rows, a.runs, a.threads)
    if "eager" in a.backends.split(","):
        ledger.write_section("compile_backend", text)
    print(text)


if __name__ == "__main__":
    main()
