"""to_onnx(quantize=...): weight-only block quantization computed by the Rust writer while it streams.

The reference is computed here, independently, from the definition (docs/guides/quantization.md,
rust/core/src/tensor/quantize.rs): blocks of ``block`` values along a Linear weight's input axis;
symmetric, ``m`` the value of largest magnitude (the negative one on a tie), ``scale = m / -2^(bits-1)``,
``q = clamp(round(w / scale), -2^(bits-1), 2^(bits-1) - 1)``; asymmetric
``lo = min(w, 0)``, ``hi = max(w, 0)``, ``scale = (hi - lo) / L``, ``zp = clamp(round(-lo / scale), 0,
L)``, ``q = clamp(round(w / scale) + zp, 0, L)``; dequantized ``(q - zp) * scale``. Every step is one
float32 IEEE operation (division, min / max, subtraction), so torch and the writer get the same bits, and
both round ties to even (``torch.round``, ``f32::round_ties_even``): ties resolve identically. The
exported model, run by onnxruntime with its optimizations off (plain DequantizeLinear -> MatMul, or
MatMulNBits at accuracy level 0, both exact), is compared with eager torch on those dequantized
weights; the only difference left is the products' float accumulation order.
"""

from __future__ import annotations

import copy
import os

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from safetensors.torch import save_file

import fastonnx
from fastonnx.stored_weights.weight_quantization import WeightQuantization

# float32 products of at most a few hundred terms accumulated in another order (onnxruntime's MatMul
# vs torch's), through a two-layer Llama: the float export of this model is held to 1e-4 too
LLAMA_TOL = {"atol": 1e-4, "rtol": 1e-4}
# one or two small float32 products: a few ulps of outputs of order 1
STACK_TOL = {"atol": 1e-5, "rtol": 1e-5}


def dequantized(w: torch.Tensor, bits: int, block: int, symmetric: bool) -> torch.Tensor:
    """``w`` ([out, in]) quantized per block along ``in`` and dequantized, from the definition."""
    w = w.float()
    out = torch.empty_like(w)
    for start in range(0, w.shape[1], block):
        b = w[:, start : start + block]
        if symmetric:
            half = 2 ** (bits - 1)
            hi = b.amax(dim=1, keepdim=True).clamp(min=0)
            lo = b.amin(dim=1, keepdim=True).clamp(max=0)
            scale = torch.where(hi > -lo, hi, lo) / -half  # the extreme value is coded -half
            q = torch.clamp(torch.round(b / scale), -half, half - 1)
            q = torch.where(scale == 0, torch.zeros_like(q), q)
            out[:, start : start + block] = q * scale
        else:
            levels = 2**bits - 1
            lo = b.amin(dim=1, keepdim=True).clamp(max=0)
            hi = b.amax(dim=1, keepdim=True).clamp(min=0)
            scale = (hi - lo) / levels
            zp = torch.clamp(torch.round(-lo / scale), 0, levels)
            q = torch.clamp(torch.round(b / scale) + zp, 0, levels)
            out[:, start : start + block] = torch.where(scale == 0, torch.zeros_like(b), (q - zp) * scale)
    return out


def with_dequantized(
    model: torch.nn.Module, bits: int, block: int, symmetric: bool, skip: tuple[str, ...] = ()
) -> torch.nn.Module:
    ref = copy.deepcopy(model)
    with torch.no_grad():
        for name, m in ref.named_modules():
            if isinstance(m, torch.nn.Linear) and not any(name.endswith(s) for s in skip):
                m.weight.copy_(dequantized(m.weight, bits, block, symmetric))
    return ref


def run_plain(model: onnx.ModelProto | str, feeds: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """onnxruntime with every graph optimization off: the graph as written."""
    so = onnxruntime.SessionOptions()
    so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    src = model if isinstance(model, str) else model.SerializeToString()
    sess = onnxruntime.InferenceSession(src, so, providers=["CPUExecutionProvider"])
    return [torch.from_numpy(o) for o in sess.run(None, {k: v.numpy() for k, v in feeds.items()})]


class Stack(torch.nn.Module):
    """Two Linears with K = 96 and 80: tails for blocks 32 (80 = 2.5 blocks) and 128 (one short block)."""

    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(96, 80)
        self.down = torch.nn.Linear(80, 40, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.gelu(self.up(x)))


def stack() -> Stack:
    torch.manual_seed(0)
    return Stack().eval()


SETTINGS = [(bits, block, sym) for bits in (4, 8) for block in (16, 32, 128) for sym in (True, False)]


@pytest.mark.parametrize("level", [True, "onnxruntime"])
@pytest.mark.parametrize(("bits", "block", "symmetric"), SETTINGS)
def test_linear_stack_matches_dequantized_eager(
    level: bool | str, bits: int, block: int, symmetric: bool
) -> None:
    model = stack()
    x = torch.randn(2, 5, 96, generator=torch.Generator().manual_seed(1))
    q = WeightQuantization(bits=bits, block_size=block, symmetric=symmetric, accuracy_level=0)
    r = fastonnx.to_onnx(model, (x,), optimize=level, quantize=q)
    ops = [n.op_type for n in r.model_proto.graph.node]
    if level == "onnxruntime":
        assert ops.count("MatMulNBits") == 2 and "DequantizeLinear" not in ops
    else:
        assert ops.count("DequantizeLinear") == 2 and ops.count("MatMul") == 2
    # no float copy of a quantized weight is left in the file
    floats = [i.name for i in r.model_proto.graph.initializer if i.data_type == onnx.TensorProto.FLOAT]
    assert sorted(floats) == ["down.weight_scales", "up.bias", "up.weight_scales"]
    stats = r.stats["quantize"]
    assert sorted(stats["quantized"]) == ["down", "up"] and stats["float"] == {}
    (got,) = run_plain(r.model_proto, {r.input_names[0]: x})
    with torch.no_grad():
        want = with_dequantized(model, bits, block, symmetric)(x)
        plain = model(x)
    torch.testing.assert_close(got, want, **STACK_TOL)
    # and the quantization did something: the float model's outputs are further away
    assert (got - plain).abs().max() > 10 * STACK_TOL["atol"]


def test_two_d_inputs_go_through_gemm_with_its_bias() -> None:
    model = stack()
    x = torch.randn(7, 96, generator=torch.Generator().manual_seed(2))
    r = fastonnx.to_onnx(model, (x,), quantize="int4")
    # the bias rides on the product (the passes make MatMul + Add a Gemm again, of the dequantized
    # weight: onnxruntime fuses that into MatMulNBits too)
    read = {i for n in r.model_proto.graph.node for i in n.input}
    assert {"up.weight", "down.weight"}.isdisjoint(read)
    assert [n.op_type for n in r.model_proto.graph.node].count("DequantizeLinear") == 2
    (got,) = run_plain(r.model_proto, {r.input_names[0]: x})
    with torch.no_grad():
        want = with_dequantized(model, 4, 32, True)(x)
    torch.testing.assert_close(got, want, **STACK_TOL)


def _llama() -> torch.nn.Module:
    from support.model_zoo import tiny_llama

    return tiny_llama()


def _llama_feeds() -> dict[str, torch.Tensor]:
    ids = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(3))
    return {"input_ids": ids, "attention_mask": torch.ones(2, 8, dtype=torch.int64)}


@pytest.mark.parametrize(
    ("level", "bits", "block", "symmetric"),
    [(True, 4, 32, True), (True, 8, 16, False), ("onnxruntime", 4, 16, False), ("onnxruntime", 8, 128, True)],
)
def test_llama_matches_dequantized_eager(level: bool | str, bits: int, block: int, symmetric: bool) -> None:
    from support.model_zoo import Logits

    model = _llama()
    feeds = _llama_feeds()
    q = WeightQuantization(bits=bits, block_size=block, symmetric=symmetric, accuracy_level=0)
    r = fastonnx.to_onnx(
        Logits(model), (feeds["input_ids"], feeds["attention_mask"]), optimize=level, quantize=q
    )
    stats = r.stats["quantize"]
    # 2 layers x (q, k, v, o, gate, up, down); the LM head and the embedding stay float
    assert len(stats["quantized"]) == 14
    assert stats["float"]["m.lm_head"].startswith("LM head")
    assert stats["float"]["m.model.embed_tokens"].startswith("embedding")
    (got,) = run_plain(r.model_proto, dict(zip(r.input_names, feeds.values(), strict=True)))
    with torch.no_grad():
        want = Logits(with_dequantized(model, bits, block, symmetric, skip=("lm_head",)))(*feeds.values())
    torch.testing.assert_close(got, want, **LLAMA_TOL)


@pytest.mark.parametrize(("bits", "symmetric"), [(4, True), (4, False), (8, True)])
def test_onnxruntime_fuses_the_standard_form_into_matmul_nbits(
    bits: int, symmetric: bool, tmp_path: os.PathLike[str]
) -> None:
    model = stack()
    x = torch.randn(2, 5, 96, generator=torch.Generator().manual_seed(1))
    r = fastonnx.to_onnx(model, (x,), quantize=WeightQuantization(bits=bits, symmetric=symmetric))
    so = onnxruntime.SessionOptions()
    so.optimized_model_filepath = os.path.join(tmp_path, "optimized.onnx")
    # accuracy level 0: the fused kernel computes with the exactly dequantized weights (negative
    # scales of symmetric blocks included)
    so.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
    sess = onnxruntime.InferenceSession(
        r.model_proto.SerializeToString(), so, providers=["CPUExecutionProvider"]
    )
    ops = [n.op_type for n in onnx.load(so.optimized_model_filepath).graph.node]
    assert ops.count("MatMulNBits") == 2, ops
    (got,) = sess.run(None, {r.input_names[0]: x.numpy()})
    with torch.no_grad():
        want = with_dequantized(model, bits, 32, symmetric)(x)
    torch.testing.assert_close(torch.from_numpy(got), want, **STACK_TOL)


def test_exclusions_default_and_configured() -> None:
    from support.model_zoo import Logits

    model = _llama()
    feeds = _llama_feeds()
    args = (feeds["input_ids"], feeds["attention_mask"])
    # patterns replace the default rule: the MLPs stay float, the LM head is quantized
    q = WeightQuantization(exclude=("*.mlp.*",))
    r = fastonnx.to_onnx(Logits(model), args, quantize=q)
    stats = r.stats["quantize"]
    assert "m.lm_head" in stats["quantized"]
    mlp = [k for k in stats["float"] if ".mlp." in k]
    assert len(mlp) == 6 and all(stats["float"][k] == "excluded by pattern '*.mlp.*'" for k in mlp)
    assert len(stats["quantized"]) == 9  # 2 x (q, k, v, o) + the head
    (got,) = run_plain(r.model_proto, dict(zip(r.input_names, feeds.values(), strict=True)))
    with torch.no_grad():
        want = Logits(with_dequantized(model, 4, 32, True, skip=("gate_proj", "up_proj", "down_proj")))(*args)
    torch.testing.assert_close(got, want, **LLAMA_TOL)
    # a plain name matches the last part of a module's name; () quantizes everything
    r = fastonnx.to_onnx(Logits(model), args, quantize=WeightQuantization(exclude=("o_proj",)))
    assert sorted(r.stats["quantize"]["float"]) == [
        "m.model.embed_tokens",
        "m.model.layers.0.self_attn.o_proj",
        "m.model.layers.1.self_attn.o_proj",
    ]
    r = fastonnx.to_onnx(Logits(model), args, quantize=WeightQuantization(exclude=()))
    assert len(r.stats["quantize"]["quantized"]) == 15


def test_tied_lm_head_stays_float_by_default() -> None:
    from transformers import LlamaForCausalLM

    from support.model_zoo import Logits, tied_llama_config

    torch.manual_seed(0)
    model = LlamaForCausalLM(tied_llama_config()).eval()
    feeds = _llama_feeds()
    r = fastonnx.to_onnx(Logits(model), tuple(feeds.values()), quantize="int8")
    assert len(r.stats["quantize"]["quantized"]) == 14
    (got,) = run_plain(r.model_proto, dict(zip(r.input_names, feeds.values(), strict=True)))
    with torch.no_grad():
        want = Logits(with_dequantized(model, 8, 32, True, skip=("lm_head",)))(*feeds.values())
    torch.testing.assert_close(got, want, **LLAMA_TOL)


def _save(model: torch.nn.Module, folder: str, dtype: torch.dtype) -> None:
    os.makedirs(folder, exist_ok=True)
    state = {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}
    save_file(state, os.path.join(folder, "model.safetensors"))


def _data_file_tensors(path: str) -> dict[str, tuple[str, int]]:
    """initializer -> (location, length) of each one stored as external data."""
    m = onnx.load(path, load_external_data=False)
    found = {}
    for t in m.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            info = {e.key: e.value for e in t.external_data}
            found[t.name] = (info["location"], int(info["length"]))
    return found


# (bits, symmetric): the codes' bytes (int4 two a byte) and, per block of 32, a float32 scale and,
# asymmetric, a one-byte uint8 zero point; 3 blocks along K = 96 and along K = 80
CODES = 96 * 80 + 80 * 40
BLOCKS = 3 * 80 + 3 * 40


@pytest.mark.parametrize("stored", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("meta", [False, True])
@pytest.mark.parametrize(
    ("bits", "symmetric", "code_bytes", "total"),
    [(4, True, CODES // 2, CODES // 2 + 4 * BLOCKS), (8, False, CODES, CODES + 5 * BLOCKS)],
)
def test_from_a_checkpoint_only_quantized_bytes_are_written(
    stored: torch.dtype,
    meta: bool,
    bits: int,
    symmetric: bool,
    code_bytes: int,
    total: int,
    tmp_path: os.PathLike[str],
) -> None:
    model = stack()
    folder = os.path.join(tmp_path, "ckpt")
    _save(model, folder, stored)
    # what the checkpoint holds: the reference is quantized from those values
    held = copy.deepcopy(model)
    with torch.no_grad():
        for p in held.parameters():
            p.copy_(p.to(stored).float())
    if meta:
        with torch.device("meta"):
            exported = Stack().eval()
    else:
        exported = held  # its own memory holds the same values: read from the shard anyway
    x = torch.randn(2, 5, 96, generator=torch.Generator().manual_seed(1))
    path = os.path.join(folder, "model.onnx")
    args = (x.to("meta"),) if meta else (x,)
    q = WeightQuantization(bits=bits, symmetric=symmetric)
    r = fastonnx.to_onnx(exported, args, filename=path, weights=folder, external_data=True, quantize=q)
    stats = r.stats["quantize"]
    assert {v["source"] for v in stats["quantized"].values()} == {"checkpoint"}
    # the data file holds the quantized codes and nothing else (scales and zero points are small:
    # inline in the .onnx; the bias is referenced in the shard, or, bf16, read through a Cast); no float
    # copy of a quantized weight anywhere
    external = _data_file_tensors(path)
    in_data = {n: n_bytes for n, (loc, n_bytes) in external.items() if loc == "model.onnx.data"}
    assert set(in_data) == {f"up.weight_q{bits}", f"down.weight_q{bits}"}
    assert os.path.getsize(path + ".data") == sum(in_data.values()) == code_bytes
    assert stats["quantized_bytes"] == total
    names = {i.name for i in onnx.load(path, load_external_data=False).graph.initializer}
    assert not any(n.endswith(".weight") for n in names)
    (got,) = run_plain(path, {r.input_names[0]: x})
    with torch.no_grad():
        want = with_dequantized(held, bits, 32, symmetric)(x)
    torch.testing.assert_close(got, want, **STACK_TOL)


def test_meta_device_needs_weights(tmp_path: os.PathLike[str]) -> None:
    with torch.device("meta"):
        model = Stack().eval()
    with pytest.raises(fastonnx.InputError, match="meta device.*weights="):
        fastonnx.to_onnx(
            model,
            (torch.randn(2, 96, device="meta"),),
            filename=os.path.join(tmp_path, "m.onnx"),
            quantize="int4",
        )


@pytest.mark.parametrize(
    ("quantize", "match"),
    [
        (WeightQuantization(bits=3), "bits must be 4 or 8, got 3"),
        (WeightQuantization(block_size=7), "block_size must be a power of two from 16 to 256, got 7"),
        (WeightQuantization(block_size=512), "got 512"),
        (WeightQuantization(block_size=48), "got 48"),
        (WeightQuantization(accuracy_level=9), "accuracy_level must be None or 0-4, got 9"),
        (WeightQuantization(exclude="lm_head"), "exclude must be a sequence"),
        (WeightQuantization(symmetric=1), "symmetric must be True or False"),  # type: ignore[arg-type]
        ("int2", "quantize must be None, 'int4', 'int8'"),
    ],
)
def test_bad_settings_are_input_errors(quantize: object, match: str) -> None:
    with pytest.raises(fastonnx.InputError, match=match):
        fastonnx.to_onnx(stack(), (torch.randn(2, 96),), quantize=quantize)  # type: ignore[arg-type]


def test_local_functions_are_refused() -> None:
    with pytest.raises(fastonnx.InputError, match="export_modules_as_functions"):
        fastonnx.to_onnx(stack(), (torch.randn(2, 96),), quantize="int8", export_modules_as_functions=True)


def test_an_exclude_pattern_matching_nothing_is_named() -> None:
    with pytest.raises(fastonnx.InputError, match=r"\['nothing\*'\] match no module"):
        fastonnx.to_onnx(
            stack(), (torch.randn(2, 96),), quantize=WeightQuantization(exclude=("up", "nothing*"))
        )


def test_int4_below_opset_21_at_the_standard_level_is_an_opset_error() -> None:
    with pytest.raises(fastonnx.OpsetError, match="needs opset >= 21"):
        fastonnx.to_onnx(stack(), (torch.randn(2, 96),), opset=20, quantize="int4")
    # the default opset rises to 21; MatMulNBits takes any opset
    assert fastonnx.to_onnx(stack(), (torch.randn(2, 96),), quantize="int4").stats["opset"] == 21
    r = fastonnx.to_onnx(stack(), (torch.randn(2, 96),), opset=20, optimize="onnxruntime", quantize="int4")
    assert r.stats["opset"] == 20


def test_dynamic_shapes_run_at_other_sizes() -> None:
    from torch.export import Dim

    from support.model_zoo import Logits

    model = _llama()
    feeds = _llama_feeds()
    b, s = Dim("batch", min=1, max=8), Dim("seq", min=2, max=64)
    spec = {"input_ids": {0: b, 1: s}, "attention_mask": {0: b, 1: s}}
    r = fastonnx.to_onnx(Logits(model), tuple(feeds.values()), dynamic_shapes=spec, quantize="int4")
    ids = torch.randint(0, 256, (3, 13), generator=torch.Generator().manual_seed(4))
    mask = torch.ones(3, 13, dtype=torch.int64)
    (got,) = run_plain(r.model_proto, dict(zip(r.input_names, (ids, mask), strict=True)))
    with torch.no_grad():
        want = Logits(with_dequantized(model, 4, 32, True, skip=("lm_head",)))(ids, mask)
    torch.testing.assert_close(got, want, **LLAMA_TOL)


@pytest.mark.parametrize("symmetric", [True, False])
def test_codes_and_scales_equal_onnxruntimes_own_quantizer(symmetric: bool) -> None:
    """An independent implementation of the same rounding: onnxruntime's MatMulNBitsQuantizer over the
    float export writes the MatMulNBits tensors fastonnx's writer streams, up to the values that sit on
    a rounding tie in one and just off it in the other (onnxruntime multiplies by the scale's
    reciprocal where the writer divides by it)."""
    from onnx import numpy_helper
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 768, bias=False)).eval()
    x = torch.randn(1, 2, 512)
    q = WeightQuantization(bits=4, block_size=32, symmetric=symmetric, exclude=(), accuracy_level=0)
    ours = fastonnx.to_onnx(model, (x,), optimize="onnxruntime", quantize=q).model_proto
    theirs = MatMulNBitsQuantizer(
        fastonnx.to_onnx(model, (x,)).model_proto, bits=4, block_size=32, is_symmetric=symmetric
    )
    theirs.process()

    def tensors(proto: onnx.ModelProto) -> dict[str, object]:
        (node,) = [n for n in proto.graph.node if n.op_type == "MatMulNBits"]
        init = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}
        return {role: init[name].reshape(-1) for role, name in zip(("b", "scales", "zp"), node.input[1:])}

    a, b = tensors(ours), tensors(theirs.model.model)
    assert sorted(a) == sorted(b) == (["b", "scales"] if symmetric else ["b", "scales", "zp"])
    assert (a["scales"] == b["scales"]).all()
    if not symmetric:
        assert (a["zp"] == b["zp"]).all()
    codes = [np.asarray(t["b"]).astype(np.int16) for t in (a, b)]
    nibbles = [np.stack([c & 15, c >> 4]) for c in codes]
    off = np.abs(nibbles[0] - nibbles[1])
    # the codes that differ are one step apart, and few: a tie is rare in random float32 values
    assert off.max() <= 1 and int((off > 0).sum()) <= 4, int((off > 0).sum())


def test_a_quantized_tied_head_leaves_its_embedding_referenced(tmp_path: os.PathLike[str]) -> None:
    """The head tied to the embedding, quantized (``exclude=()``) from a checkpoint on the meta device:
    the head's product reads the quantized codes, the embedding's Gather still reads the same weight,
    referenced in the shard (behind a Cast, bfloat16 there): no float copy of it is written. The file
    computes what the in-memory export of the same values computes."""
    from transformers import LlamaForCausalLM

    from support.model_zoo import Logits, tied_llama_config

    torch.manual_seed(0)
    held = LlamaForCausalLM(tied_llama_config()).eval()
    folder = os.path.join(tmp_path, "ckpt")
    _save(held, folder, torch.bfloat16)
    with torch.no_grad():
        for p in held.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    with torch.device("meta"):
        meta = LlamaForCausalLM(tied_llama_config()).eval()
    # the rotary frequencies are computed, in no checkpoint: on the CPU as the model computes them
    for name, buffer in held.model.rotary_emb.named_buffers():
        setattr(meta.model.rotary_emb, name, buffer.clone())
    feeds = _llama_feeds()
    q = WeightQuantization(bits=8, exclude=())
    path = os.path.join(folder, "model.onnx")
    args = tuple(v.to("meta") if v.is_floating_point() else v for v in feeds.values())
    r = fastonnx.to_onnx(Logits(meta), args, filename=path, weights=folder, external_data=True, quantize=q)
    assert len(r.stats["quantize"]["quantized"]) == 15  # 14 layer products and the head
    external = _data_file_tensors(path)
    referenced = {n for n, (loc, _) in external.items() if loc == "model.safetensors"}
    assert any("embed_tokens" in n for n in referenced), referenced
    written = [n for n, (loc, _) in external.items() if loc == "model.onnx.data"]
    assert all(n.endswith(("_q8", "_scales")) for n in written), written
    (got,) = run_plain(path, dict(zip(r.input_names, feeds.values(), strict=True)))
    (want,) = run_plain(
        fastonnx.to_onnx(Logits(held), tuple(feeds.values()), quantize=q).model_proto,
        dict(zip(r.input_names, feeds.values(), strict=True)),
    )
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
