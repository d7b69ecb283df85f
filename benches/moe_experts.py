"""Mixture of experts in onnxruntime: a Qwen3-MoE-shaped model's decode step and prefill, and its MoE
block alone, against the dense-FLOPs floor of the routed experts; this commit at each ``--levels``
optimize level (``default``: the routed ``SequenceMap`` form; ``onnxruntime+moe``: onnxruntime's ``MoE`` op,
capture/fused_experts.py; ``onnxruntime+int4``: ``quantize="int4"``, the experts read by ``QMoE`` and the
other products by ``MatMulNBits``, the floor left float), and a ``--before`` build, alternated.

Model: Qwen3-MoE with the layer shape of Qwen3-30B-A3B (hidden 2048, 32 query / 4 key-value heads of 128,
128 experts of moe_intermediate 768, top-8), ``--layers`` layers (default 2), vocabulary 1024, float32,
random weights, batch 1; its experts run through transformers' grouped matmul (experts_implementation
"grouped_mm", transformers' default), the forms fastonnx converts (converters/third_party.py). Each build
runs in a fresh process that exports, with external data into a temporary folder removed afterwards:

- the decode-step model (DynamicCache; dynamic batch, sequence and past), timed at one token after a
  past of 2048 and at a prefill of 2048 tokens (past 0);
- layer 0's MoE block alone (router and experts; dynamic batch and sequence), at 1 and 2048 tokens;
- the floor: a dense SwiGLU MLP of intermediate top-k x 768 (Qwen3MoeMLP), which does the routed experts'
  FLOPs (2 * tokens * k * 3 * hidden * moe_intermediate) and reads as many weight bytes, as three dense
  MatMuls: what onnxruntime's GEMMs take for that work on this machine, at 1 and 2048 tokens.

onnxruntime runs on the CPU with 1 and 2 intra-op threads; within a process the three files alternate,
and with ``--before`` the builds alternate over ``--rounds`` processes each; figures are medians of all
runs. Before timing, each process checks the block (5 tokens) and a decode step's logits (past 16)
against eager torch (quantized: their cosine similarity, above 0.9; a wrong layout gives about 0). Regenerates its section of docs/benchmarks.md (``--no-ledger`` prints only).

    # the build before a change: a worktree of its commit, with this checkout's extension when the
    # Rust side did not change
    git worktree add /tmp/moe-before <commit> \\
        && cp python/fastonnx/_core.abi3.so /tmp/moe-before/python/fastonnx/
    python benches/moe_experts.py --before /tmp/moe-before/python --before-label "<commit>" --rounds 2
    python benches/moe_experts.py --layers 1 --rounds 1 --no-ledger     # this build, a quick look

A process holds the model in torch (2.4 GB of experts a layer in float32) while it exports, then the
three files in onnxruntime: about 5 GB a layer at its peak.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
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

HERE = os.path.dirname(os.path.abspath(__file__))

HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 2048, 32, 4, 128
EXPERTS, TOP_K, MOE_INTERMEDIATE, VOCAB = 128, 8, 768, 1024
PAST, PREFILL = 2048, 2048
THREADS = (1, 2)
KINDS = ("model", "block", "floor")
# case -> (past, tokens)
CASES = {f"decode, past {PAST}": (PAST, 1), f"prefill {PREFILL}": (0, PREFILL)}


def config(layers: int) -> Any:
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=TOP_K * MOE_INTERMEDIATE,
        moe_intermediate_size=MOE_INTERMEDIATE,
        num_experts=EXPERTS,
        num_experts_per_tok=TOP_K,
        norm_topk_prob=True,
        num_hidden_layers=layers,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        max_position_embeddings=8192,
        use_cache=True,
    )


def routed_flops(tokens: int) -> int:
    """The routed experts' FLOPs of one layer: per token and chosen expert, gate, up and down products."""
    return 2 * tokens * TOP_K * 3 * HIDDEN * MOE_INTERMEDIATE


def export_all(layers: int, folder: str, level: str) -> tuple[dict[str, str], dict[str, Any]]:
    """The three files, and eager results to check them against (computed before the model is freed).
    ``level``: to_onnx's optimize, "onnxruntime+moe" (the experts as onnxruntime's MoE op) or
    "onnxruntime+int4" (quantize="int4": QMoE experts; the floor stays float)."""
    import numpy as np
    import torch
    from torch.export import Dim
    from transformers import DynamicCache, Qwen3MoeForCausalLM
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeMLP

    import fastonnx
    from fastonnx.capture.transformers_caches import register_transformers_caches
    from support.model_zoo import DecodeStep, decode_step_shapes

    cfg = config(layers)
    torch.manual_seed(0)
    with torch.no_grad():
        model = Qwen3MoeForCausalLM(cfg).eval()
    assert model.config._experts_implementation == "grouped_mm"
    register_transformers_caches()

    def cache(batch: int, past: int, rng: np.random.Generator) -> tuple[Any, list[np.ndarray]]:
        c, arrays = DynamicCache(), []
        for i in range(layers):
            k, v = (rng.standard_normal((batch, KV_HEADS, past, HEAD_DIM)).astype(np.float32) for _ in "kv")
            c.update(torch.from_numpy(k), torch.from_numpy(v), i)
            arrays += [k, v]
        return c, arrays

    step = DecodeStep(model)
    batch, seq, past = 2, 3, 5
    args = (
        torch.randint(0, VOCAB, (batch, seq)),
        torch.ones(batch, past + seq, dtype=torch.int64),
        torch.arange(past, past + seq).repeat(batch, 1),
        cache(batch, past, np.random.default_rng(0))[0],
    )
    spec = decode_step_shapes(layers)
    files = {k: os.path.join(folder, f"{k}.onnx") for k in KINDS}
    optimize, _, variant = level.partition("+")
    quantize = "int4" if variant == "int4" else None

    def experts_as_moe() -> Any:  # a --before build may not have the module
        if variant != "moe":
            return contextlib.nullcontext()
        from fastonnx.capture.fused_experts import fused_experts

        return fused_experts(True)

    t0 = time.perf_counter()
    with torch.no_grad(), experts_as_moe():
        fastonnx.to_onnx(
            step,
            args,
            filename=files["model"],
            external_data=True,
            dynamic_shapes=spec,
            optimize=optimize,
            quantize=quantize,
        )
    export_s = time.perf_counter() - t0
    tokens = {0: Dim("batch", min=1, max=64), 1: Dim("seq", min=1, max=8192)}
    x = torch.randn(2, 7, HIDDEN)
    torch.manual_seed(1)
    dense = Qwen3MoeMLP(cfg, intermediate_size=TOP_K * MOE_INTERMEDIATE).eval()
    with torch.no_grad(), experts_as_moe():
        for kind, module in (("block", model.model.layers[0].mlp), ("floor", dense)):
            fastonnx.to_onnx(
                module,
                (x,),
                filename=files[kind],
                dynamic_shapes=(tokens,),
                external_data=True,
                optimize=optimize,
                quantize=quantize if kind == "block" else None,
            )
    # the checks: the block at 5 tokens, a decode step's logits after a past of 16
    rng = np.random.default_rng(5)
    x5 = rng.standard_normal((1, 5, HIDDEN)).astype(np.float32)
    ids = rng.integers(0, VOCAB, (1, 1))
    kv16, arrays = cache(1, 16, rng)
    with torch.no_grad():
        block5 = model.model.layers[0].mlp(torch.from_numpy(x5)).numpy()
        logits = step(
            torch.from_numpy(ids), torch.ones(1, 17, dtype=torch.int64), torch.tensor([[16]]), kv16
        )[0].numpy()
    check = {"x5": x5, "block5": block5, "ids": ids, "kv": arrays, "logits": logits}
    del model, step, dense, args
    gc.collect()
    return files, {"check": check, "export_s": export_s, "quantized": quantize is not None}


def model_feeds(names: list[str], layers: int, past: int, tokens: int) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(past + tokens)
    kv = (1, KV_HEADS, past, HEAD_DIM)
    values = [
        rng.integers(0, VOCAB, (1, tokens)).astype(np.int64),
        np.ones((1, past + tokens), dtype=np.int64),
        np.arange(past, past + tokens, dtype=np.int64)[None],
    ] + [rng.standard_normal(kv).astype(np.float32) for _ in range(2 * layers)]
    assert len(names) == len(values), names
    return dict(zip(names, values, strict=True))


def close(got: Any, want: Any, quantized: bool, what: str) -> None:
    """onnxruntime's result against eager: float32's tolerances, or quantized a cosine above 0.9."""
    import numpy as np

    if not quantized:
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4, err_msg=what)
        return
    a, b = got.ravel().astype(np.float64), want.ravel().astype(np.float64)
    cosine = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
    print(f"{what}: cosine {cosine:.4f} (quantized)", file=sys.stderr)
    assert cosine > 0.9, f"{what}: cosine {cosine:.4f} against eager"


def child(layers: int, iters: int, prefill_iters: int, optimize: str) -> dict[str, Any]:
    """One build's process: export, check, time. Returns the samples (seconds) per threads, case, kind."""
    import numpy as np
    import onnxruntime

    import fastonnx

    folder = tempfile.mkdtemp(prefix="fastonnx-moe-", dir=tempfile.gettempdir())
    try:
        files, info = export_all(layers, folder, optimize)
        check = info["check"]
        samples: dict[str, dict[str, dict[str, list[float]]]] = {}
        for threads in THREADS:
            so = onnxruntime.SessionOptions()
            so.intra_op_num_threads = threads
            so.inter_op_num_threads = 1
            sessions = {
                k: onnxruntime.InferenceSession(f, so, providers=["CPUExecutionProvider"])
                for k, f in files.items()
            }
            names = {k: [i.name for i in s.get_inputs()] for k, s in sessions.items()}
            if threads == THREADS[0]:
                got = sessions["block"].run(None, {names["block"][0]: check["x5"]})[0]
                close(got, check["block5"], info["quantized"], "MoE block")
                feed = dict(
                    zip(
                        names["model"],
                        [check["ids"], np.ones((1, 17), dtype=np.int64), np.array([[16]]), *check["kv"]],
                        strict=True,
                    )
                )
                got = sessions["model"].run(None, feed)[0]
                close(got, check["logits"], info["quantized"], "decode logits")
            per_case: dict[str, dict[str, list[float]]] = {}
            for case, (past, tokens) in CASES.items():
                rng = np.random.default_rng(tokens)
                x = rng.standard_normal((1, tokens, HIDDEN)).astype(np.float32)
                feeds = {
                    "model": model_feeds(names["model"], layers, past, tokens),
                    "block": {names["block"][0]: x},
                    "floor": {names["floor"][0]: x},
                }
                for k in KINDS:
                    sessions[k].run(None, feeds[k])  # warm-up
                per_case[case] = {k: [] for k in KINDS}
                for i in range(iters if tokens == 1 else prefill_iters):
                    for k in KINDS if i % 2 == 0 else KINDS[::-1]:
                        t0 = time.perf_counter()
                        sessions[k].run(None, feeds[k])
                        per_case[case][k].append(time.perf_counter() - t0)
            samples[str(threads)] = per_case
            del sessions
            gc.collect()
        return {"module": fastonnx.__file__, "export_s": info["export_s"], "samples": samples}
    finally:
        shutil.rmtree(folder, ignore_errors=True)  # the files are GBs: nothing stays on the disk


def run_build(python_dir: str, optimize: str, a: argparse.Namespace) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": python_dir}
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        "--layers",
        str(a.layers),
        "--optimize",
        optimize,
    ]
    cmd += ["--iters", str(a.iters), "--prefill-iters", str(a.prefill_iters)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    line = next((x for x in out.stdout.splitlines() if x.startswith("SAMPLES ")), None)
    if out.returncode != 0 or line is None:
        raise SystemExit(f"the build in {python_dir} failed:\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(line[len("SAMPLES ") :])
    if not os.path.realpath(result["module"]).startswith(os.path.realpath(python_dir)):
        raise SystemExit(f"{python_dir} did not provide fastonnx (imported {result['module']})")
    return result


def report(a: argparse.Namespace, labels: list[str], merged: dict[str, Any]) -> str:
    def med(label: str, threads: int, case: str, kind: str) -> float:
        return ledger.median(merged[label][str(threads)][case][kind]) * 1000

    def pair(values: list[float], fmt: str) -> str:
        return " / ".join(format(v, fmt) for v in values)

    rows = []
    for threads in THREADS:
        for case, (_, tokens) in CASES.items():
            # the floor is the same file in every build: its median over all of them
            floor = (
                ledger.median([t for label in labels for t in merged[label][str(threads)][case]["floor"]])
                * 1000
            )
            block = [med(label, threads, case, "block") for label in labels]
            model = [med(label, threads, case, "model") for label in labels]
            rows.append(
                [
                    str(threads),
                    case,
                    f"{floor:.1f} ({routed_flops(tokens) / floor / 1e6:.1f} GFLOP/s)",
                    pair(block, ".1f"),
                    pair([b / floor for b in block], ".2f"),
                    pair(model, ".1f"),
                    pair([m / (a.layers * floor) for m in model], ".2f"),
                ]
            )
    builds = " / ".join(labels)
    return "\n".join(
        [
            "## Mixture of experts (benches/moe_experts.py)",
            "",
            f"Machine: {ledger.machine()}. Qwen3-MoE with Qwen3-30B-A3B's layer shape (hidden {HIDDEN}, "
            f"{HEADS} / {KV_HEADS} heads of {HEAD_DIM}, {EXPERTS} experts of {MOE_INTERMEDIATE}, top-{TOP_K}), "
            f"{a.layers} layers, vocabulary {VOCAB}, float32, batch 1, onnxruntime CPU. Floor: a dense SwiGLU "
            f"MLP of intermediate {TOP_K} x {MOE_INTERMEDIATE}, the routed experts' FLOPs "
            f"({routed_flops(1) / 1e6:.1f} MFLOP a token and layer) and weight bytes in three dense MatMuls "
            f"(in brackets the GFLOP/s it reaches). The block is layer 0's MoE block alone (router and "
            f"experts); the model ratio divides by {a.layers} floors, so it includes attention, norms and "
            f"the head. ms, medians of {a.rounds} process(es) a build, alternated, each timing {a.iters} "
            f"decode / {a.prefill_iters} prefill runs of each file, alternated. Builds: {builds}.",
            "",
            ledger.table(
                [
                    "threads",
                    "case",
                    "floor ms",
                    f"MoE block ms ({builds})",
                    "block / floor",
                    f"model ms ({builds})",
                    f"model / ({a.layers} x floor)",
                ],
                rows,
            ),
        ]
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--iters", type=int, default=7, help="decode runs of each file per process")
    p.add_argument("--prefill-iters", type=int, default=2, help="prefill runs of each file per process")
    p.add_argument("--rounds", type=int, default=2, help="processes per build, builds alternated")
    p.add_argument("--before", help="the python/ folder of a build to compare against")
    p.add_argument("--before-label", default="before")
    p.add_argument(
        "--levels",
        default="default,onnxruntime+moe",
        help="this commit's optimize levels, a build each (onnxruntime+moe: at optimize='onnxruntime', the experts "
        "as onnxruntime's MoE op, capture/fused_experts.py; onnxruntime+int4: quantize='int4', QMoE experts)",
    )
    p.add_argument("--optimize", default="default", help=argparse.SUPPRESS)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--no-ledger", action="store_true")
    a = p.parse_args()
    if a.child:
        sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
        print("SAMPLES " + json.dumps(child(a.layers, a.iters, a.prefill_iters, a.optimize)), flush=True)
        return
    # label -> (python/ folder, optimize level)
    builds = {a.before_label: (a.before, "default")} if a.before else {}
    for level in a.levels.split(","):
        builds[f"this commit, {level}"] = (os.path.join(os.path.dirname(HERE), "python"), level)
    labels = list(builds)
    merged: dict[str, Any] = {
        k: {str(t): {c: {kind: [] for kind in KINDS} for c in CASES} for t in THREADS} for k in labels
    }
    for r in range(a.rounds):
        for label in labels if r % 2 == 0 else labels[::-1]:
            got = run_build(*builds[label], a)
            for t, cases in got["samples"].items():
                for c, kinds in cases.items():
                    for kind, values in kinds.items():
                        merged[label][t][c][kind] += values
            medians = {
                t: {c: {k: round(ledger.median(v) * 1000, 1) for k, v in ks.items()} for c, ks in cs.items()}
                for t, cs in got["samples"].items()
            }
            print(f"round {r + 1}/{a.rounds} {label} (export {got['export_s']:.0f} s): {medians}", flush=True)
    body = report(a, labels, merged)
    print(body)
    if not a.no_ledger:
        ledger.write_section("moe_experts", body)


if __name__ == "__main__":
    main()
