"""fp16 and bf16 text-generation packages (issue 43, part 2): ``export_pretrained(dtype=...)``.

onnxruntime's CPU runs many float16 ops in float32 behind Casts, which can hide an overflow, and does
not run bfloat16 graphs at all: the packages are also run in ``onnx.reference``, which computes in the
half type itself, against transformers' float32 logits. The overflow case is a tiny Gemma 2 whose
post-feedforward norm weight (1e5) pushes the residual stream past float16's 65504.
"""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from checkpoint_folders import DECODER, DECODERS, save_checkpoint
from onnx import TensorProto
from onnx.reference import ReferenceEvaluator

import fastonnx
from fastonnx import half_precision
from fastonnx.pretrained import half_package
from support.matrix import sampled

PROMPT = [[1, 17, 42, 99, 5], [3, 8, 13, 21, 34]]


def _prefill_feeds(model: onnx.ModelProto) -> dict[str, np.ndarray[Any, Any]]:
    """A prefill of PROMPT from an empty cache, each float input in the model's type."""
    ids = np.array(PROMPT, np.int64)
    feeds: dict[str, np.ndarray[Any, Any]] = {}
    for i in model.graph.input:
        t = i.type.tensor_type
        if i.name == "input_ids":
            feeds[i.name] = ids
        elif i.name == "attention_mask":
            feeds[i.name] = np.ones_like(ids)
        elif i.name == "position_ids":
            feeds[i.name] = np.tile(np.arange(ids.shape[1]), (ids.shape[0], 1))
        else:  # past_key_values.%d.key / .value: (batch, heads, 0, head size)
            dims = [d.dim_value for d in t.shape.dim]
            feeds[i.name] = np.zeros(
                (ids.shape[0], dims[1], 0, dims[3]), onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)
            )
    return feeds


def _reference_logits(path: pathlib.Path) -> np.ndarray[Any, Any]:
    model = onnx.load(str(path))  # the weights read from the package's files
    feeds = _prefill_feeds(model)
    (logits,) = list(ReferenceEvaluator(model).run(["logits"], feeds))
    return np.asarray(logits).astype(np.float32)


def _transformers_logits(
    folder: pathlib.Path, class_name: str, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    import transformers

    model = getattr(transformers, class_name).from_pretrained(folder, dtype=dtype).eval()
    ids = torch.tensor(PROMPT)
    with torch.no_grad():
        logits: torch.Tensor = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    return logits.float()


def _input_types(path: pathlib.Path) -> dict[str, int]:
    m = onnx.load(str(path), load_external_data=False)
    return {v.name: v.type.tensor_type.elem_type for v in [*m.graph.input, *m.graph.output]}


def _half_share(path: pathlib.Path, dtype: str) -> float:
    m = onnx.load(str(path), load_external_data=False)
    flops = half_precision.matmul_flops(
        m, {"batch_size": 2, "sequence_length": 5, "total_sequence_length": 5}
    )
    return half_precision.half_share(flops, dtype)


def _genai_matches_transformers(package: pathlib.Path, checkpoint: pathlib.Path, class_name: str) -> None:
    """onnxruntime-genai's greedy 20 tokens from the package are transformers' (float32)."""
    import transformers

    og = pytest.importorskip("onnxruntime_genai")
    prompt = [1, 17, 42, 99, 5, 63, 21]
    model = getattr(transformers, class_name).from_pretrained(checkpoint, dtype=torch.float32).eval()
    ids = torch.tensor([prompt])
    want = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=20, do_sample=False)
    runtime = og.Model(str(package))
    params = og.GeneratorParams(runtime)
    params.set_search_options(max_length=len(prompt) + 20, do_sample=False)
    generator = og.Generator(runtime, params)
    generator.append_tokens(np.array([prompt], dtype=np.int32))
    while not generator.is_done():
        generator.generate_next_token()
    assert list(generator.get_sequence(0)) == want[0].tolist()


def _body_types(path: pathlib.Path) -> set[int]:
    """The element types of the values control-flow bodies return (Mixtral's experts: SequenceMap)."""
    m = onnx.load(str(path), load_external_data=False)
    return {
        v.type.tensor_type.elem_type
        for n in m.graph.node
        for a in n.attribute
        if a.type == onnx.AttributeProto.GRAPH
        for v in a.g.output
    }


# Mixtral's experts (control-flow bodies converted) under FASTONNX_FULL_MATRIX=1
# issue 43's families: Llama, Qwen2, Gemma 3 (sliding and full layers), GPT-OSS (sinks, experts)
HALF_FAMILIES = ["llama", "qwen2", "gemma3", "gpt_oss", "mixtral"]
ROUTED = ("mixtral", "gpt_oss")  # experts in a SequenceMap


@pytest.mark.parametrize("name", sampled(HALF_FAMILIES, lambda name: name == "llama"))
def test_half_packages_match_transformers(tmp_path: pathlib.Path, name: str) -> None:
    # a bf16 checkpoint: fp16 verified in onnxruntime by the export itself, fp16 and bf16 in onnx.reference
    model_type, class_name, extra = DECODERS[name]
    src = tmp_path / "ckpt"
    save_checkpoint(src, model_type, class_name, {**DECODER, **extra}, dtype=torch.bfloat16)
    expected = _transformers_logits(src, class_name)
    for dtype, kind in (("fp16", TensorProto.FLOAT16), ("bf16", TensorProto.BFLOAT16)):
        out = tmp_path / dtype
        # onnx refuses hard links; a bfloat16 package is CUDA's (onnxruntime's CPU runs none)
        target = "cuda" if dtype == "bf16" else "cpu"
        if name in ROUTED and dtype == "bf16":
            # routed experts (SplitToSequence / SequenceMap) have no CUDA kernels: refused by name
            with pytest.raises(fastonnx.InputError, match="'cuda'.*no kernel for SplitToSequence"):
                fastonnx.export_pretrained(src, out, dtype=dtype, copy=True, target=target)
            continue
        written = fastonnx.export_pretrained(src, out, dtype=dtype, copy=True, target=target)
        if dtype == "fp16":
            assert written.verified is True, written.verify_note
            if name == "llama":  # float16 caches and logits: genai generates transformers' tokens
                _genai_matches_transformers(out, src, class_name)
        else:
            assert written.verified is None and "bfloat16" in written.verify_note
        types = _input_types(written.model_path)
        assert types["logits"] == kind and types["past_key_values.0.key"] == kind
        assert _half_share(written.model_path, dtype) >= 0.9
        # the routed experts' SequenceMap body is converted too
        assert _body_types(written.model_path) == ({kind} if name in ROUTED else set())
        got = torch.from_numpy(_reference_logits(written.model_path))
        # half products over a hidden size of 64: errors of a few 1e-3 (fp16) and 1e-2 (bf16) of logits ~1
        tol = 1e-2 if dtype == "fp16" else 6e-2
        torch.testing.assert_close(got, expected, atol=tol, rtol=tol)
        report = (out / "fastonnx_report.md").read_text()
        assert "## Half precision" in report and "| softmax |" in report and "| reduction |" in report


def _gemma2_overflowing(folder: pathlib.Path) -> None:
    config = {**DECODER, "head_dim": 16, "initializer_range": 0.3, "attn_implementation": "eager"}
    model: Any = save_checkpoint(folder, "gemma2", "Gemma2ForCausalLM", config)
    with torch.no_grad():
        model.model.layers[0].post_feedforward_layernorm.weight.fill_(1e5)
    model.save_pretrained(folder)


def test_overflowing_residual_stays_float32(tmp_path: pathlib.Path) -> None:
    src = tmp_path / "gemma2"
    _gemma2_overflowing(src)
    expected = _transformers_logits(src, "Gemma2ForCausalLM")
    assert torch.isfinite(expected).all()
    # the residual stream past 65504: transformers in float16 gives inf / nan
    assert not torch.isfinite(_transformers_logits(src, "Gemma2ForCausalLM", torch.float16)).all()

    written = fastonnx.export_pretrained(src, tmp_path / "fp16", dtype="fp16", copy=True)
    assert written.verified is True, written.verify_note
    got = torch.from_numpy(_reference_logits(written.model_path))
    assert torch.isfinite(got).all()
    relative = float((got - expected).abs().max() / expected.abs().max())
    assert relative < 1e-2, relative
    assert _half_share(written.model_path, "fp16") >= 0.9
    assert "| range above 4094 |" in (tmp_path / "fp16" / "fastonnx_report.md").read_text()

    # the same float32 graph converted without the calibration's ranges overflows
    plain = tmp_path / "plain"
    fastonnx.export_pretrained(src, plain, verify=False, copy=True)
    model = onnx.load(str(plain / "model.onnx"), load_external_data=False)
    half_precision.convert(model, "fp16", base_dir=plain)
    onnx.save(model, str(plain / "model.onnx"))
    assert not np.isfinite(_reference_logits(plain / "model.onnx")).all()


def test_bad_options_are_input_errors(tmp_path: pathlib.Path) -> None:
    with pytest.raises(fastonnx.InputError, match="dtype must be 'fp16' or 'bf16'"):
        fastonnx.export_pretrained(tmp_path / "none", tmp_path / "out", dtype="fp8")
    with pytest.raises(fastonnx.InputError, match="give dtype too"):
        fastonnx.export_pretrained(tmp_path / "none", tmp_path / "out", keep_io_types=True)
    with pytest.raises(fastonnx.InputError, match="with cast_weights"):
        fastonnx.export_pretrained(
            tmp_path / "none", tmp_path / "out", dtype="bf16", cast_weights=True, target="cuda"
        )
    # several graphs feeding one another in a form not converted yet (Whisper's genai files)
    whisper_genai = dict.fromkeys(("encoder_model.onnx", "decoder_model_merged.onnx"))
    with pytest.raises(fastonnx.InputError, match="image-text-to-text's three in their common form"):
        half_package.check_specs("fp16", "automatic-speech-recognition", whisper_genai)  # type: ignore[arg-type]


class _Scaled(torch.nn.Module):
    """Products, a value past float16's range (x 1e4 of activations ~10), a norm and a softmax."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, 8)
        self.norm = torch.nn.LayerNorm(32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x) * 1e4
        return torch.softmax(self.b(self.norm(h)), dim=-1)


def test_to_onnx_dtype(tmp_path: pathlib.Path) -> None:
    torch.manual_seed(0)
    model, x = _Scaled().eval(), torch.randn(4, 16) * 10
    expected = model(x).detach()
    path = tmp_path / "m.onnx"
    result = fastonnx.to_onnx(model, (x,), filename=path, dtype="fp16")
    half = result.stats["half_precision"]
    assert half["calibrated"] and half["matmul_share"] == 1.0 and "range above 4094" in half["kept_float32"]
    out = result(x)
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.float(), expected, atol=2e-3, rtol=1e-2)
    (reference, *_) = list(
        ReferenceEvaluator(onnx.load(str(path))).run(None, {"x": x.numpy().astype(np.float16)})
    )
    torch.testing.assert_close(
        torch.from_numpy(np.asarray(reference)).float(), expected, atol=2e-3, rtol=1e-2
    )
    kept = fastonnx.to_onnx(model, (x,), filename=tmp_path / "io.onnx", dtype="fp16", keep_io_types=True)
    assert kept(x).dtype == torch.float32
    with pytest.raises(fastonnx.InputError, match="give filename too"):
        fastonnx.to_onnx(model, (x,), dtype="fp16")
    with pytest.raises(fastonnx.InputError, match="dtype must be"):
        fastonnx.to_onnx(model, (x,), filename=path, dtype="float16")
    with pytest.raises(fastonnx.InputError, match="give dtype too"):
        fastonnx.to_onnx(model, (x,), filename=path, keep_io_types=True)
    with pytest.raises(fastonnx.InputError, match="with cast_weights"):
        fastonnx.to_onnx(model, (x,), filename=path, dtype="fp16", cast_weights=True)


def test_cli_dtype_keep_io_types(tmp_path: pathlib.Path) -> None:
    # exit status 0: the package verified in onnxruntime against transformers (1 on a mismatch)
    from fastonnx.pretrained.cli import main

    model_type, class_name, extra = DECODERS["llama"]
    src = tmp_path / "ckpt"
    save_checkpoint(src, model_type, class_name, {**DECODER, **extra}, dtype=torch.bfloat16)
    # at the onnxruntime level: FusedMatMul and RotaryEmbedding (com.microsoft) in float16 too
    args = [
        "export",
        str(src),
        str(tmp_path / "out"),
        "--dtype",
        "fp16",
        "--keep-io-types",
        "--optimize",
        "onnxruntime",
    ]
    assert main(args) == 0
    ops = {
        n.op_type
        for n in onnx.load(str(tmp_path / "out" / "model.onnx"), load_external_data=False).graph.node
    }
    assert {"FusedMatMul", "RotaryEmbedding"} <= ops
    types = _input_types(tmp_path / "out" / "model.onnx")
    assert (
        types["logits"] == TensorProto.FLOAT and _half_share(tmp_path / "out" / "model.onnx", "fp16") >= 0.9
    )
    assert main(["export", str(src), str(tmp_path / "bad"), "--keep-io-types"]) == 2


def _ort_logits(path: pathlib.Path) -> np.ndarray[Any, Any]:
    import onnxruntime as ort

    feeds = _prefill_feeds(onnx.load(str(path), load_external_data=False))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (logits,) = session.run(["logits"], feeds)
    return np.asarray(logits).astype(np.float32)


def test_int4_with_fp16(tmp_path: pathlib.Path) -> None:
    # transformers.js's q4f16: weights int4, everything else float16 (MatMulNBits / the dequantized
    # products read float16 activations and scales); against the float32 int4 package of the same codes
    model_type, class_name, extra = DECODERS["llama"]
    src = tmp_path / "ckpt"
    save_checkpoint(src, model_type, class_name, {**DECODER, **extra}, dtype=torch.bfloat16)
    q4 = fastonnx.export_pretrained(src, tmp_path / "q4", quantize="int4")
    expected = torch.from_numpy(_ort_logits(q4.model_path))
    for level in ("default", "onnxruntime"):
        out = tmp_path / f"q4f16-{level}"
        written = fastonnx.export_pretrained(src, out, quantize="int4", dtype="fp16", optimize=level)
        model = onnx.load(str(written.model_path), load_external_data=False)
        types = _input_types(written.model_path)
        assert types["logits"] == TensorProto.FLOAT16
        products = [n for n in model.graph.node if n.op_type in ("MatMulNBits", "DequantizeLinear")]
        # 7 products a layer; at the onnxruntime level q/k/v and gate/up read one packed product each
        assert len(products) == (14 if level == "default" else 8)
        flops = half_precision.matmul_flops(model, {"batch_size": 2, "sequence_length": 5})
        assert half_precision.half_share(flops, "fp16") >= 0.9
        got = torch.from_numpy(_ort_logits(written.model_path))
        # the same int4 codes: float16 activations and scales move logits ~2.5 by ~0.04 at most
        relative = float((got - expected).abs().max() / expected.abs().max())
        assert relative < 3e-2, relative


def test_encoder_package_fp16(tmp_path: pathlib.Path) -> None:
    # a one-graph task besides text-generation: calibrated on the verification's inputs, verified in
    # onnxruntime against transformers' float32; the LayerNorms stay float32, every product is float16
    from checkpoint_folders import architecture_sweep

    folder = tmp_path / "bert"
    architecture_sweep().build_checkpoint("fill-mask", "bert", "BertForMaskedLM", folder)
    written = fastonnx.export_pretrained(folder, tmp_path / "out", "fill-mask", dtype="fp16")
    assert written.verified is True, written.verify_note
    assert _input_types(written.model_path)["logits"] == TensorProto.FLOAT16
    assert _half_share(written.model_path, "fp16") == 1.0
    assert "| normalization |" in (tmp_path / "out" / "fastonnx_report.md").read_text()


def test_text2text_package_fp16(tmp_path: pathlib.Path) -> None:
    # text2text's three files, each calibrated on the inputs the float32 files give one another (the
    # encoder's states, the first step's cache), verified in onnxruntime against transformers
    from test_text2text import MODELS

    model_type, class_name, config, seed = MODELS["t5"]
    save_checkpoint(tmp_path / "t5", model_type, class_name, config, seed=seed, redraw_std=1.0)
    written = fastonnx.export_pretrained(tmp_path / "t5", tmp_path / "out", dtype="fp16")
    assert written.verified is True, written.verify_note
    for name in written.graphs:
        assert _half_share(tmp_path / "out" / name, "fp16") == 1.0
    assert _input_types(tmp_path / "out" / "decoder_with_past_model.onnx")["logits"] == TensorProto.FLOAT16


def test_vision_language_package_fp16(tmp_path: pathlib.Path) -> None:
    # image-text-to-text's three files, calibrated on what the float32 files give one another (the
    # image's features, the prompt's embeddings, the cache), verified in onnxruntime against
    # transformers' float32 generate, each step on transformers' token
    from checkpoint_folders import architecture_sweep

    folder = tmp_path / "llava"
    architecture_sweep().build_checkpoint(
        "image-text-to-text", "llava", "LlavaForConditionalGeneration", folder
    )
    written = fastonnx.export_pretrained(folder, tmp_path / "out", "image-text-to-text", dtype="fp16")
    assert written.verified is True, written.verify_note
    for name in ("vision_encoder.onnx", "decoder_model_merged.onnx"):
        assert _half_share(tmp_path / "out" / name, "fp16") == 1.0
    assert _input_types(tmp_path / "out" / "embed_tokens.onnx")["inputs_embeds"] == TensorProto.FLOAT16
    report = (tmp_path / "out" / "fastonnx_report.md").read_text()
    assert "step 5: logits" in report
