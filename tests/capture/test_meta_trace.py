"""The trace on the meta device (capture/meta_cache.py): a model without weights recorded by the fast
path, each distinct meta-kernel call computed once.

The graph must be torch.export's for the same meta model (op types in order, inputs and outputs with
their types and shapes); the cache must give every node the metadata an uncached run gives it; a model
that would read a meta tensor's values is refused with a reason, and capture="auto" falls back to
torch.export; an export from the meta device, its weights attached or referenced in place, runs in
onnxruntime like the real model runs in eager PyTorch.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

import fastonnx
from fastonnx.capture import trace as trace_module
from fastonnx.capture.meta_cache import MetaCache
from support.model_zoo import TEXT, Logits, _config, _text_inputs, causal_lm

# name -> (model_type, class, config overrides): the suite's builders (model_zoo.TRANSFORMERS_MODELS)
LMS = {
    "llama": ("llama", "LlamaForCausalLM", {}),
    "qwen2": ("qwen2", "Qwen2ForCausalLM", {}),
    "gemma": ("gemma", "GemmaForCausalLM", {"head_dim": 8}),
}


def _meta_lm(name: str, **overrides: Any) -> torch.nn.Module:
    """The suite's tiny config of ``name``, built on the meta device (every weight and buffer meta)."""
    import transformers

    model_type, cls_name, extra = LMS[name]
    cfg = _config(model_type, **{**TEXT, **extra, **overrides})
    with torch.device("meta"):
        model = getattr(transformers, cls_name)(cfg).eval()
    return Logits(model)


def _meta_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    return tuple(t.to("meta") for t in _text_inputs())  # type: ignore[return-value]


def _graph(model: torch.nn.Module, args: tuple[Any, ...], folder: Any, capture: str) -> list[str]:
    """to_onnx with ``capture`` into ``folder`` (a meta model is saved with external data, its weights
    holes), checked to have been captured that way; op types in order, then the inputs and outputs
    with element type and shape."""
    import onnx

    path = os.path.join(str(folder), f"{capture}.onnx")
    result = fastonnx.to_onnx(model, args, filename=path, capture=capture)
    assert result.stats["capture"] == capture, result.stats.get("trace_refused")
    graph = onnx.load(path, load_external_data=False).graph

    def io(kind: str, values: Any) -> list[str]:
        return [f"{kind} {v.name}: {v.type.tensor_type.elem_type} {v.type.tensor_type.shape}" for v in values]

    return io("input", graph.input) + [n.op_type for n in graph.node] + io("output", graph.output)


def _nodes(ep: torch.export.ExportedProgram) -> list[tuple[Any, ...]]:
    """Every FX node: its kind, target, name, arguments and the metadata of its value(s)."""

    def meta(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return (v.dtype, tuple(v.shape), v.stride(), v.storage_offset(), v.device.type)
        if isinstance(v, (list, tuple)):
            return [meta(x) for x in v]
        return v

    return [
        (n.op, str(n.target), n.name, str(n.args), str(n.kwargs), meta(n.meta.get("val")))
        for n in ep.graph.nodes
    ]


# ---- torch.export's graph ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(LMS))
def test_meta_model_gives_torch_exports_graph(name: str, tmp_path: Any) -> None:
    model, args = _meta_lm(name), _meta_inputs()
    traced = _graph(model, args, tmp_path, "trace")
    assert "Softmax" in traced or "Attention" in traced
    assert traced == _graph(model, args, tmp_path, "export")


def test_auto_traces_a_meta_model(tmp_path: Any) -> None:
    result = fastonnx.to_onnx(_meta_lm("llama"), _meta_inputs(), filename=str(tmp_path / "m.onnx"))
    assert result.stats["capture"] == "trace" and "trace_refused" not in result.stats
    assert result.stats["deferred_weights"] > 0  # no weight has bytes: attach_weights fills them


def test_cpu_inputs_with_meta_weights(tmp_path: Any) -> None:
    """input_ids / attention_mask on the CPU, as torch.export takes them with meta weights: the run sees
    them there too (the mask's ops run on its values), the graph is torch.export's."""
    model, args = _meta_lm("llama"), _text_inputs()
    assert _graph(model, args, tmp_path, "trace") == _graph(model, args, tmp_path, "export")


# ---- the cache changes nothing ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(LMS))
def test_cache_gives_every_node_the_uncached_metadata(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model, args = _meta_lm(name), _meta_inputs()
    caches: list[MetaCache | None] = []
    original = trace_module.meta_cache_for

    def kept(*a: Any) -> MetaCache | None:
        caches.append(original(*a))
        return caches[-1]

    monkeypatch.setattr(trace_module, "meta_cache_for", kept)
    cached = trace_module.trace_model(model, args, {})
    cache = caches[0]
    assert cache is not None and cache.hits > 0  # the second layer's ops came from the cache
    monkeypatch.setattr(trace_module, "meta_cache_for", lambda *a: None)
    uncached = trace_module.trace_model(model, args, {})
    assert _nodes(cached) == _nodes(uncached)


def _meta(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device="meta")


def test_same_metadata_is_a_hit_with_the_kernels_strides() -> None:
    cache = MetaCache()
    x = _meta(4, 6).t()  # non-contiguous: clone keeps its strides
    first = cache.call(torch.ops.aten.clone.default, (x,), {})
    second = cache.call(torch.ops.aten.clone.default, (_meta(4, 6).t(),), {})
    assert (cache.misses, cache.hits) == (1, 1)
    assert second.stride() == first.stride() == (1, 6) and second.shape == first.shape
    assert second is not first and second.dtype == torch.float32 and second.is_meta


def test_the_key_holds_dtype_strides_scalars_and_the_default_dtype() -> None:
    cache = MetaCache()
    mul = torch.ops.aten.mul.Tensor
    ints = _meta(3, dtype=torch.int64)
    assert cache.call(mul, (ints, 2), {}).dtype == torch.int64
    assert cache.call(mul, (ints, 2.0), {}).dtype == torch.float32  # 2 and 2.0: two keys
    assert cache.call(mul, (ints, True), {}).dtype == torch.int64  # True == 1, but a bool: a third
    assert cache.call(mul, (_meta(3, dtype=torch.float16), 2), {}).dtype == torch.float16
    assert cache.misses == 4 and cache.hits == 0
    full = torch.ops.aten.full.default
    default = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.float64)
        assert cache.call(full, ([2], 1.0), {"device": torch.device("meta")}).dtype == torch.float64
        torch.set_default_dtype(torch.float32)
        assert cache.call(full, ([2], 1.0), {"device": torch.device("meta")}).dtype == torch.float32
    finally:
        torch.set_default_dtype(default)
    assert cache.hits == 0


def test_views_writes_and_random_ops_are_not_cached() -> None:
    cache = MetaCache()
    x = _meta(2, 6)
    for _ in range(2):
        v = cache.call(torch.ops.aten.view.default, (x, [3, 4]), {})
        assert v._base is x  # the alias kept: the recorder's write checks follow it
        assert cache.call(torch.ops.aten.add_.Tensor, (x, 1.0), {}) is x
        r = cache.call(torch.ops.aten.randn.default, ([2, 3],), {"device": torch.device("meta")})
        assert r.shape == (2, 3)
        # eval-free sdpa with dropout draws: not cached; without dropout it is
        q = _meta(1, 2, 4, 8)
        cache.call(torch.ops.aten.scaled_dot_product_attention.default, (q, q, q, None, 0.5), {})
    assert cache.hits == 0 and cache.uncached == 8
    q = _meta(1, 2, 4, 8)
    for _ in range(2):
        cache.call(torch.ops.aten.scaled_dot_product_attention.default, (q, q, q), {})
    assert cache.hits == 1


def test_ops_returning_nothing_or_lists_are_not_cached() -> None:
    cache = MetaCache()
    x = _meta(2, 6)
    for _ in range(2):
        assert cache.call(torch.ops.aten._assert_async.default, (_meta(1, dtype=torch.bool),), {}) is None
        assert len(cache.call(torch.ops.aten._foreach_add.Scalar, ([x, x], 1.0), {})) == 2
    assert cache.hits == cache.misses == 0 and cache.uncached == 4


def test_an_output_sharing_an_inputs_storage_is_not_cached() -> None:
    """_unsafe_view declares no alias but returns the input's storage: rebuilt fresh it would not be."""
    cache = MetaCache()
    x = _meta(2, 6)
    for _ in range(2):
        out = cache.call(torch.ops.aten._unsafe_view.default, (x, [12]), {})
        assert out.untyped_storage()._cdata == x.untyped_storage()._cdata
    assert cache.hits == 0


# ---- what a meta run cannot do: refused, torch.export instead -----------------------------------------------
class _CopiesToCpu(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x).cpu() * 2


class _ReadsAValue(_CopiesToCpu):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        return y * y.sum().item()


class _BranchesOnTheDevice(_CopiesToCpu):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        # torch.export's fake tensors of a meta model report the meta device too: the same branch
        return y + 1 if y.device.type == "meta" else y - 1


def _meta_module(cls: type[torch.nn.Module]) -> torch.nn.Module:
    with torch.device("meta"):
        return cls().eval()


def test_a_copy_off_the_meta_device_is_refused_and_auto_uses_torch_export(tmp_path: Any) -> None:
    model, x = _meta_module(_CopiesToCpu), _meta(2, 4)
    refused = fastonnx.capture.trace_or_refusal(model, (x,), {})
    assert isinstance(refused, str) and "copies a meta tensor's values to cpu" in refused
    assert "self.lin(x).cpu() * 2" in refused  # the user's line
    result = fastonnx.to_onnx(model, (x,), filename=str(tmp_path / "m.onnx"))
    assert result.stats["capture"] == "export"
    assert "copies a meta tensor's values" in result.stats["trace_refused"]


def test_reading_a_meta_value_is_refused() -> None:
    refused = fastonnx.capture.trace_or_refusal(_meta_module(_ReadsAValue), (_meta(2, 4),), {})
    assert isinstance(refused, str) and "reads a tensor's value into Python" in refused


def test_a_device_branch_takes_torch_exports_side(tmp_path: Any) -> None:
    model, x = _meta_module(_BranchesOnTheDevice), _meta(2, 4)
    traced = _graph(model, (x,), tmp_path, "trace")
    assert traced == _graph(model, (x,), tmp_path, "export")
    assert "Add" in traced and "Sub" not in traced


# ---- the weights filled in: onnxruntime against the real model ------------------------------------------
def _run(path: str, args: tuple[torch.Tensor, ...]) -> Any:
    import onnxruntime

    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    feeds = {i.name: a.numpy() for i, a in zip(session.get_inputs(), args)}
    return torch.from_numpy(session.run(None, feeds)[0])


def test_meta_export_with_weights_attached_matches_the_real_model(tmp_path: Any) -> None:
    real, args = causal_lm("llama", "LlamaForCausalLM")  # seeded: the weights the meta model lacks
    path = str(tmp_path / "model.onnx")
    result = fastonnx.to_onnx(_meta_lm("llama"), _meta_inputs(), filename=path)
    assert result.stats["capture"] == "trace", result.stats.get("trace_refused")
    fastonnx.attach_weights(path, real)  # its non-persistent buffers too (rotary frequencies)
    with torch.no_grad():
        expected = real(*args)
    torch.testing.assert_close(_run(path, args), expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("use_cache", [False, True])
def test_meta_export_referencing_a_checkpoint_matches_the_real_model(tmp_path: Any, use_cache: bool) -> None:
    from safetensors.torch import save_file

    # with a cache, the DynamicCache the forward makes holds empty meta tensors (lifted constants): they
    # have no bytes to find in the shards
    real, args = causal_lm("llama", "LlamaForCausalLM", use_cache=use_cache)
    folder = str(tmp_path)
    save_file(
        {k: v.contiguous() for k, v in real.state_dict().items()},
        os.path.join(folder, "model.safetensors"),
        metadata={"format": "pt"},
    )
    meta = _meta_lm("llama", use_cache=use_cache)
    # the rotary frequencies: a non-persistent buffer, in no checkpoint (docs/weights.md)
    meta.m.model.rotary_emb = type(real.m.model.rotary_emb)(real.m.config)
    path = os.path.join(folder, "model.onnx")
    result = fastonnx.to_onnx(meta, _meta_inputs(), filename=path, weights=folder)
    assert result.stats["capture"] == "trace", result.stats.get("trace_refused")
    assert result.stats["file"]["weights"]["written_tensors"] == 0
    with torch.no_grad():
        expected = real(*args)
    torch.testing.assert_close(_run(path, args), expected, atol=1e-4, rtol=1e-4)
