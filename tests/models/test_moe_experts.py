"""Mixture-of-experts layers of transformers (issue 41, part 2): Qwen3-MoE, Mixtral and GPT-OSS run
their experts through transformers' grouped matmul (integrations/moe.py), which fastonnx converts to a
routed form: a SequenceMap over the experts that own rows (converters/third_party.py); inside
fused_experts(True) to_onnx captures the SwiGLU experts without biases as onnxruntime's MoE op instead
(capture/fused_experts.py: measured slower at decode, so not the default); quantized at the onnxruntime
level they are captured so and read by QMoE (int4 / int8 experts, rust/core/src/passes/
expert_quantization.rs), which measured faster than the float routed form. Each MoE block is
exported once with dynamic batch and sequence and compared with eager at 1, 5 and 64 tokens; the
onnxruntime profile shows one expert product per expert a token was routed to, not one per expert."""

from __future__ import annotations

import collections
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx
import onnxruntime
import pytest
import torch

import fastonnx
from support.export_check import check_export

HIDDEN, EXPERTS, TOP_K = 32, 8, 2
# one export (batch 2, sequence 7), run at 1, 5 and 64 tokens
EXAMPLE = (2, 7)
RUNS = [(1, 1), (1, 5), (2, 32)]
ATOL, RTOL = 1e-5, 1e-4  # as tests/models/test_transformers_models.py


def _block(model_type: str, cls_name: str, **cfg: Any) -> torch.nn.Module:
    """The MoE block of layer 0 of a tiny model built from its config, as from_pretrained builds it
    (experts_implementation "grouped_mm", transformers' default)."""
    import transformers
    from transformers import AutoConfig

    config = AutoConfig.for_model(
        model_type,
        vocab_size=64,
        hidden_size=HIDDEN,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_experts_per_tok=TOP_K,
        initializer_range=0.3,  # at 0.02 the blocks' outputs are ~1e-3: the comparison could not fail
        **cfg,
    )
    torch.manual_seed(0)
    model = getattr(transformers, cls_name)(config).eval()
    assert model.config._experts_implementation == "grouped_mm"
    return model.model.layers[0].mlp


BLOCKS: dict[str, Callable[[], torch.nn.Module]] = {
    "qwen3_moe": lambda: _block(
        "qwen3_moe", "Qwen3MoeForCausalLM", moe_intermediate_size=16, num_experts=EXPERTS, norm_topk_prob=True
    ),
    "mixtral": lambda: _block(
        "mixtral", "MixtralForCausalLM", intermediate_size=16, num_local_experts=EXPERTS
    ),
    # interleaved gate / up, biases on both products, a clamped SwiGLU with alpha; also returns the scores
    "gpt_oss": lambda: _block(
        "gpt_oss", "GptOssForCausalLM", intermediate_size=16, num_local_experts=EXPERTS, sliding_window=4
    ),
}


def _hidden(batch: int, seq: int) -> torch.Tensor:
    return torch.randn(batch, seq, HIDDEN, generator=torch.Generator().manual_seed(batch * 100 + seq))


def _nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    found = []
    for n in graph.node:
        found.append(n)
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                found += _nodes(a.g)
    return found


@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_moe_block_matches_eager_at_every_token_count(name: str) -> None:
    block = BLOCKS[name]()
    x = _hidden(*EXAMPLE)
    with torch.no_grad():
        out = block(x)
    scale = float((out[0] if isinstance(out, tuple) else out).abs().max())
    assert scale > 1e-2, f"{name}: eager output is ~0 ({scale}), the comparison could not fail"
    dims = {0: torch.export.Dim("batch"), 1: torch.export.Dim("seq")}
    results = check_export(
        block,
        (x,),
        dynamic_shapes=({**dims},),
        run_args=[(_hidden(*shape),) for shape in RUNS],
        optimize=(False, True, "onnxruntime"),
        atol=ATOL,
        rtol=RTOL,
    )
    for result in results:
        nodes = _nodes(result.model_proto.graph)
        ops = collections.Counter(n.op_type for n in nodes)
        # the two grouped products (gate_up, down), each a map over the experts that own rows
        assert ops["SequenceMap"] == 2 and ops["Loop"] == 0, ops
        # no Gather of the [experts, ...] weights by a per-row index in the main graph: each expert's
        # weight is gathered once, by its id, inside the map
        weights = {i.name for i in result.model_proto.graph.initializer if len(i.dims) == 3}
        assert not [
            n for n in result.model_proto.graph.node if n.op_type == "Gather" and n.input[0] in weights
        ]


def _right_at_every_token_count(
    block: torch.nn.Module, result: Any, name: str, of_largest: float | None = None
) -> None:
    """The file against eager at each token count; ``of_largest``: an absolute tolerance of that part of
    the largest value instead of float32's."""
    for shape in (EXAMPLE, *RUNS):
        x = _hidden(*shape)
        with torch.no_grad():
            want = block(x)
        got = result(x)
        want, got = (w[0] if isinstance(w, tuple) else w for w in (want, got))
        atol, rtol = (ATOL, RTOL) if of_largest is None else (of_largest * float(want.abs().max()), 0.0)
        torch.testing.assert_close(got, want, atol=atol, rtol=rtol, msg=f"{name} at {shape}")


@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_stored_expert_weights_are_not_transposed_whole(name: str) -> None:
    """to_onnx captures transformers' grouped linear of weights stored (experts, out, in) as one op
    (capture/grouped_linear.py): each routed expert's weight is read through Gemm(transB=1) in the map,
    and no Transpose of a whole stacked weight is left for onnxruntime (which folds none over 1 GiB).
    GPT-OSS stores its experts (experts, in, out): the products read them as they are."""
    block = BLOCKS[name]()
    dims = {0: torch.export.Dim("batch"), 1: torch.export.Dim("seq")}
    result = fastonnx.to_onnx(block, (_hidden(*EXAMPLE),), dynamic_shapes=(dims,), optimize=False)
    graph = result.model_proto.graph
    stacked = {i.name for i in graph.initializer if len(i.dims) == 3}
    assert not [n for n in graph.node if n.op_type == "Transpose" and n.input[0] in stacked]
    in_maps = [n for n in _nodes(graph) if n not in graph.node]  # the SequenceMap bodies' nodes
    gemms = [n for n in in_maps if n.op_type == "Gemm"]
    assert len(gemms) == (0 if name == "gpt_oss" else 2), [n.op_type for n in in_maps]
    _right_at_every_token_count(block, result, name)


@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_fused_experts_are_onnxruntimes_moe_op(name: str) -> None:
    """Inside fused_experts(True) (capture/fused_experts.py), to_onnx captures SwiGLU experts without
    biases (Qwen3-MoE, Mixtral) as one com.microsoft.MoE node a block, right at every token count;
    GPT-OSS's clamped, biased experts keep the routed form."""
    from fastonnx.capture.fused_experts import fused_experts

    block = BLOCKS[name]()
    dims = {0: torch.export.Dim("batch"), 1: torch.export.Dim("seq")}
    with fused_experts(True):
        result = fastonnx.to_onnx(block, (_hidden(*EXAMPLE),), dynamic_shapes=(dims,), optimize="onnxruntime")
    ops = collections.Counter(n.op_type for n in _nodes(result.model_proto.graph))
    fused = name != "gpt_oss"
    assert (ops["MoE"], ops["SequenceMap"]) == ((1, 0) if fused else (0, 2)), ops
    _right_at_every_token_count(block, result, name)


def _dequantized(model: onnx.ModelProto, weight: str, bits: int) -> torch.Tensor:
    """The float values of the QMoE codes and scales the file holds for ``weight`` ([E, rows, K]):
    per block along K, (code - 2**(bits - 1)) * scale, int4 codes two a byte, the low nibble first."""
    import numpy as np
    from onnx import numpy_helper

    found = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    (codes,) = [v for k, v in found.items() if k.endswith(f"{weight}_q{bits}")]
    (scales,) = [v for k, v in found.items() if k.endswith(f"{weight}_scales")]
    if bits == 4:
        codes = np.stack([codes & 0x0F, codes >> 4], axis=-1).reshape(*codes.shape[:2], -1)
    values = torch.from_numpy(codes.astype(np.float32) - 2 ** (bits - 1))
    block = values.shape[-1] // scales.shape[-1]
    return (values.unflatten(-1, (-1, block)) * torch.from_numpy(scales)[..., None]).flatten(-2)


@pytest.mark.parametrize("bits", (4, 8))
@pytest.mark.parametrize("name", ["mixtral", "qwen3_moe"])
def test_quantized_experts_are_onnxruntimes_qmoe(name: str, bits: int) -> None:
    """quantize= at the onnxruntime level captures the SwiGLU experts as one op and writes it as QMoE
    reading the experts' codes (fc1's interleaved in the graph, as the float MoE's): the file computes the
    block whose experts hold the values its codes and scales decode to, at every token count (accuracy
    level 0: float activations for int4, so the only difference from eager is the weights'). onnxruntime's
    CPU QMoE quantizes the activations of int8 experts to int8 whatever the level: measured 0.5% of the
    largest output off, so int8 is held to 1.5% of it (a wrong layout or zero point is off by the output's
    own size)."""
    from fastonnx.stored_weights.weight_quantization import WeightQuantization

    block = BLOCKS[name]()
    dims = {0: torch.export.Dim("batch"), 1: torch.export.Dim("seq")}
    settings = WeightQuantization(bits=bits, block_size=16, accuracy_level=0, exclude=["gate"])
    result = fastonnx.to_onnx(
        block, (_hidden(*EXAMPLE),), dynamic_shapes=(dims,), optimize="onnxruntime", quantize=settings
    )
    ops = collections.Counter(n.op_type for n in _nodes(result.model_proto.graph))
    assert (ops["QMoE"], ops["MoE"], ops["SequenceMap"]) == (1, 0, 0), ops
    quantized = result.stats["quantize"]["quantized"]
    assert {"experts.gate_up_proj", "experts.down_proj"} <= set(quantized), quantized
    experts = block.experts
    with torch.no_grad():
        for weight in ("gate_up_proj", "down_proj"):
            decoded = _dequantized(result.model_proto, weight, bits)
            assert decoded.shape == getattr(experts, weight).shape
            assert (decoded - getattr(experts, weight)).abs().max() > 0  # the codes round the weights
            getattr(experts, weight).copy_(decoded)
    _right_at_every_token_count(block, result, name, None if bits == 4 else 0.015)


def _routed_experts(block: torch.nn.Module, x: torch.Tensor) -> int:
    """How many distinct experts the tokens of ``x`` are routed to (the block's router in eager)."""
    router = getattr(block, "gate", None) or block.router
    with torch.no_grad():
        indices = router(x.reshape(-1, HIDDEN))[2]
    return int(indices.unique().numel())


@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_expert_products_follow_the_routed_experts(tmp_path: Path, name: str) -> None:
    """onnxruntime runs one gate_up and one down product per expert the tokens were routed to: at one
    token top-k experts of 8, not 8 (the Loop over every expert this form replaced ran 2 x 8)."""
    block = BLOCKS[name]()
    dims = {0: torch.export.Dim("batch"), 1: torch.export.Dim("seq")}
    path = tmp_path / "moe.onnx"
    result = fastonnx.to_onnx(block, (_hidden(*EXAMPLE),), dynamic_shapes=({**dims},), filename=path)
    products = ("MatMul", "Gemm")  # a routed expert's product: MatMul, or Gemm of a stored weight
    top_products = sum(n.op_type in products for n in result.model_proto.graph.node)
    for shape in [(1, 1), (1, 3)]:
        x = _hidden(*shape)
        options = onnxruntime.SessionOptions()
        # the graph as written (no fusion renames a MatMul); the map's steps appear in the profile
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.enable_profiling = True
        options.profile_file_prefix = str(tmp_path / "profile")
        session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        session.run(None, {session.get_inputs()[0].name: x.numpy()})
        profile = session.end_profiling()
        with open(profile) as f:
            events = json.load(f)
        os.remove(profile)
        runs = sum(
            e.get("cat") == "Node"
            and e["name"].endswith("_kernel_time")
            and e["args"].get("op_name") in products
            for e in events
        )
        routed = _routed_experts(block, x)
        assert TOP_K <= routed < EXPERTS
        assert runs - top_products == 2 * routed, (shape, runs, top_products, routed)
