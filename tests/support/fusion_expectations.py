"""How many times each fusion of README's `optimize` section must fire on a model, per opset and setting.

A model is described by the fusable patterns its graph holds (`Patterns`), counted from the model itself:
config fields times what each layer computes (transformers), or the torch calls of one eager forward
pass (vision models, `traced_patterns`). `expected` applies README's gates (optimize level, opset) to
give the counters `stats["optimize"]` must report; every model here is float32, the fusions' one dtype.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

# the counters of stats["optimize"] (rust/core/src/passes/mod.rs) by fusion: the one place to rename one
COUNTER = {
    "rms_norm": "rms_norm_fused",
    "layer_norm": "layer_norm_fused",
    "gelu": "gelu_fused",
    "silu": "silu_fused",
    "rotary": "rotary_fused",
    "attention": "attention_fused",
    # com.microsoft.MultiHeadAttention (onnxruntime level, below opset 23)
    "multi_head_attention": "multi_head_attention_fused",
    # below opset 23: grouped-query attention reads unrepeated keys and values (no Expand)
    "grouped_attention": "grouped_attention_unrepeated",
    "conv_batchnorm": "conv_batchnorm_fused",
}

# README: the first opsets of the standard operators the fusions emit
LAYER_NORMALIZATION_OPSET = 17
GELU_OPSET = 20
RMS_NORMALIZATION_OPSET = 23
ATTENTION_OPSET = 23
ROTARY_EMBEDDING_OPSET = 23


@dataclass(frozen=True)
class Patterns:
    """How many fusable float32 patterns a model's graph holds.

    ``attention_3d`` counts attention chains whose heads are split from 3-D projections by Reshape +
    Transpose and merged back (BERT, ViT): Attention from opset 23, MultiHeadAttention below it at the
    onnxruntime level. ``attention`` counts the chains fused to Attention from opset 23 only: queries
    4-D before attention (rotated, or split from a fused qkv projection by a permute), and the other
    reasons MultiHeadAttention does not take a chain, given with each model.
    ``gelu_op`` counts torch's own gelu (nn.GELU, F.gelu): its converter writes the standard Gelu from
    opset 20 (nothing to fuse) and the erf / tanh formula below it, which only the onnxruntime level
    fuses (into com.microsoft Gelu / FastGelu). ``gelu_written`` counts GELUs a model writes out by
    hand (GPT-2's NewGELU): fused from opset 20 at both levels, below it at the onnxruntime level.
    ``grouped_attention`` counts chains whose keys and values are repeated per query-head group.
    ``layer_norm`` counts LayerNorms written out by hand over the last axis; torch's layer_norm
    converts to LayerNormalization directly and is not a fusion.
    """

    rms_norm: int = 0
    layer_norm: int = 0
    gelu_op: int = 0
    gelu_written: int = 0
    silu: int = 0
    rotary: int = 0
    attention: int = 0
    attention_3d: int = 0
    grouped_attention: int = 0
    conv_batchnorm: int = 0

    def __mul__(self, n: int) -> Patterns:
        return Patterns(**{f.name: getattr(self, f.name) * n for f in fields(self)})

    def __add__(self, other: Patterns) -> Patterns:
        return Patterns(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})


def expected(p: Patterns, opset: int, optimize: bool | str) -> dict[str, int]:
    """The counters a conversion of a model holding ``p`` must report (README's gates)."""
    counts = dict.fromkeys(COUNTER.values(), 0)
    if optimize is False:
        return counts
    ort = optimize == "onnxruntime"

    def add(fusion: str, n: int, when: bool) -> None:
        counts[COUNTER[fusion]] += n if when else 0

    # RMSNormalization from opset 23; onnxruntime's SimplifiedLayerNormalization at any opset
    add("rms_norm", p.rms_norm, ort or opset >= RMS_NORMALIZATION_OPSET)
    add("layer_norm", p.layer_norm, opset >= LAYER_NORMALIZATION_OPSET)
    add("gelu", p.gelu_op, ort and opset < GELU_OPSET)
    add("gelu", p.gelu_written, ort or opset >= GELU_OPSET)
    # SiLU stays x * Sigmoid(x) at the standard level; QuickGelu at the onnxruntime level
    add("silu", p.silu, ort)
    # static sequence and batch: RotaryEmbedding from 23, com.microsoft.RotaryEmbedding below it
    add("rotary", p.rotary, ort or opset >= ROTARY_EMBEDDING_OPSET)
    add("attention", p.attention + p.attention_3d, opset >= ATTENTION_OPSET)
    add("multi_head_attention", p.attention_3d, ort and opset < ATTENTION_OPSET)
    # below 23 grouped-query attention reads unrepeated keys and values (Attention does from 23)
    add("grouped_attention", p.grouped_attention, opset < ATTENTION_OPSET)
    add("conv_batchnorm", p.conv_batchnorm, True)
    return counts


def expecting(p: Patterns) -> Callable[[int, bool | str], dict[str, int]]:
    """`check_export`'s ``fusions=`` argument for a model holding ``p``."""
    return lambda opset, optimize: expected(p, opset, optimize)


# ---- vision models: the patterns of one eager forward pass -----------------------------------------
_CONVS = {torch.conv1d, torch.conv2d, torch.conv3d}
_BATCH_NORMS = {torch.nn.functional.batch_norm, torch.batch_norm}


class _Calls(TorchFunctionMode):
    """Counts torch calls, and BatchNorms whose input is a Conv's output read by nothing else."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[Any, int] = {}
        self.conv_out: dict[int, list[Any]] = {}  # id -> [tensor (kept alive), readers]
        self.bn_after_conv: list[list[Any]] = []  # the conv_out entry of each BatchNorm's input

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if any(isinstance(t, torch.Tensor) for t in tree_leaves(out)):  # computes (not .shape etc.)
            for t in tree_leaves((args, kwargs)):
                if isinstance(t, torch.Tensor) and id(t) in self.conv_out:
                    self.conv_out[id(t)][1] += 1
        self.calls[func] = self.calls.get(func, 0) + 1
        if func in _BATCH_NORMS and id(args[0]) in self.conv_out:  # now: ids of dead tensors are reused
            self.bn_after_conv.append(self.conv_out[id(args[0])])
        if func in _CONVS:
            self.conv_out[id(out)] = [out, 0]
        return out


def traced_patterns(model: torch.nn.Module, args: tuple[Any, ...]) -> Patterns:
    """The patterns of a vision model, from the torch calls of one forward pass (eval mode).

    Conv + BatchNorm: BatchNorms whose input is a convolution's output that nothing else reads (the
    fold's condition); GELU / SiLU: calls of torch's gelu / silu; attention: calls of
    scaled_dot_product_attention (timm splits heads from one qkv projection by a permute: 4-D).
    Attention a model writes by hand (matmul, softmax) is not counted: each vision test says what
    becomes of it.
    """
    f = torch.nn.functional
    mode = _Calls()
    with torch.no_grad(), mode:
        model(*args)
    c = mode.calls
    return Patterns(
        conv_batchnorm=sum(readers == 1 for _, readers in mode.bn_after_conv),
        gelu_op=c.get(f.gelu, 0),
        silu=c.get(f.silu, 0),
        # nn.MultiheadAttention splits heads seq-first ((s, b * n, h) views): 4-D at the attention
        attention=c.get(f.scaled_dot_product_attention, 0) + c.get(f.multi_head_attention_forward, 0),
    )


# ---- transformers models: config fields times what each layer computes ------------------------------
def _activation(cfg: Any) -> Patterns:
    """The fusable pattern of a config's MLP activation."""
    names = (
        getattr(cfg, f, None)
        for f in ("hidden_activation", "hidden_act", "activation_function", "activation")
    )
    return _act(next(n for n in names if n))


def _act(name: str) -> Patterns:
    """The fusable pattern of transformers' ACT2FN[name]."""
    return {
        "silu": Patterns(silu=1),
        "swish": Patterns(silu=1),
        "gelu": Patterns(gelu_op=1),  # GELUActivation calls torch's gelu
        "gelu_pytorch_tanh": Patterns(gelu_op=1),  # torch's gelu(approximate="tanh")
        "gelu_new": Patterns(gelu_written=1),  # NewGELUActivation writes the tanh formula out
        "relu": Patterns(),
        "quick_gelu": Patterns(),  # x * sigmoid(1.702 x): not SiLU's x * sigmoid(x)
    }[name]


def _llama_like(cfg: Any, norms_per_layer: int = 2, final_norm: int = 1, kv_heads: bool = True) -> Patterns:
    """A decoder layer of Llama's family: RMS norms, rotary q and k, one attention, the MLP activation.

    Its attention reads rotated 4-D queries (and grouped keys): Attention from opset 23 only. Fewer
    key/value heads than query heads (repeated per group) are read unrepeated below opset 23;
    ``kv_heads=False`` for models whose config carries num_key_value_heads without using it.
    """
    heads = cfg.num_attention_heads
    grouped = int(kv_heads and (getattr(cfg, "num_key_value_heads", None) or heads) < heads)
    layer = Patterns(rms_norm=norms_per_layer, rotary=2, attention=1, grouped_attention=grouped)
    layer = layer + _activation(cfg)
    return layer * cfg.num_hidden_layers + Patterns(rms_norm=final_norm)


def _encoder(cfg: Any, layers: int) -> Patterns:
    """BERT-like layers: heads split from 3-D projections (MultiHeadAttention below 23), LayerNorm
    (torch's layer_norm: converted directly, not fused), the MLP activation."""
    return (Patterns(attention_3d=1) + _activation(cfg)) * layers


def _config(model: torch.nn.Module) -> Any:
    return model.m.config  # model_zoo's wrappers hold the transformers model as .m


# Keys and values that go through the KV cache's update (use_cache is on in these decoders' tiny
# configs) reach the attention through an Identity, which the clean-up removes only after the
# fusions: MultiHeadAttention's head-split match stops there, so those chains fuse from opset 23 only
# (with use_cache=False GPT-2, OPT and BART fuse all their chains below 23 too). A fusion gap,
# reported; it is written here as `attention` rather than `attention_3d`.
TRANSFORMERS_PATTERNS: dict[str, Callable[[torch.nn.Module], Patterns]] = {
    "llama": lambda m: _llama_like(_config(m)),
    "mistral": lambda m: _llama_like(_config(m)),
    "qwen2": lambda m: _llama_like(_config(m)),
    "granite": lambda m: _llama_like(_config(m)),
    # transformers runs the routed experts as one batched computation (integrations/moe.py): one
    # activation per layer, whatever the number of experts
    "mixtral": lambda m: _llama_like(_config(m)),
    "phi3": lambda m: _llama_like(_config(m)),
    "gemma": lambda m: _llama_like(_config(m)),  # (1 + w) RMS norms: the constant folds first
    # four norms around attention and MLP, plus RMS norms of the queries and keys
    "gemma3": lambda m: _llama_like(_config(m), norms_per_layer=6),
    # OLMo's LayerNorms have no parameters: torch's layer_norm, converted directly
    "olmo": lambda m: _llama_like(_config(m), norms_per_layer=0, final_norm=0),
    # LayerNorm, partial rotary (the rotated slice fuses), GELU written out
    "phi": lambda m: _llama_like(_config(m), norms_per_layer=0, final_norm=0),
    # q, k, v chunked from one 4-D projection, partial rotary; LayerNorm
    "gpt_neox": lambda m: _llama_like(_config(m), norms_per_layer=0, final_norm=0, kv_heads=False),
    # heads split from 3-D projections, but through the KV cache (see above)
    "gpt2": lambda m: (Patterns(attention=1) + _activation(_config(m))) * _config(m).num_hidden_layers,
    "opt": lambda m: (Patterns(attention=1) + _activation(_config(m))) * _config(m).num_hidden_layers,
    "bert": lambda m: _encoder(_config(m), _config(m).num_hidden_layers),
    "roberta": lambda m: _encoder(_config(m), _config(m).num_hidden_layers),
    "xlm-roberta": lambda m: _encoder(_config(m), _config(m).num_hidden_layers),
    "distilbert": lambda m: _encoder(_config(m), _config(m).n_layers),
    "vit": lambda m: _encoder(_config(m), _config(m).num_hidden_layers),
    "beit": lambda m: _encoder(_config(m), _config(m).num_hidden_layers),
    "yolos": lambda m: _encoder(_config(m), _config(m).num_hidden_layers),
    # one block per stage here (depths [1, 1]): no shifted windows, no window mask
    "swin": lambda m: _encoder(_config(m), sum(_config(m).depths)),
    # whisper's convolution stem applies torch's gelu twice
    "whisper-encoder": lambda m: _encoder(_config(m), _config(m).encoder_layers) + Patterns(gelu_op=2),
    # decoders: self- and cross-attention through the KV cache (see above)
    "bart": lambda m: (
        _encoder(_config(m), _config(m).encoder_layers)
        + (Patterns(attention=2) + _activation(_config(m))) * _config(m).decoder_layers
    ),
    "marian": lambda m: (
        _encoder(_config(m), _config(m).encoder_layers)
        + (Patterns(attention=2) + _activation(_config(m))) * _config(m).decoder_layers
    ),
    # T5's LayerNorm is an RMS norm: 2 per encoder layer, 3 per decoder layer, one final each. Its
    # attention (scale 1) fuses from opset 23. Below it MultiHeadAttention does not fire: the mask is a
    # float bias with a value per head (relative positions), so the converter's flag of rows the mask
    # closes is (b, heads, q, 1), and the fusion keeps that Where only for a (b, 1, q, 1) flag.
    "t5": lambda m: (
        Patterns(rms_norm=2, attention=1) * _config(m).num_layers
        + Patterns(rms_norm=3, attention=2) * _config(m).num_decoder_layers
        + Patterns(rms_norm=2)
    ),
    # ConvNeXt's LayerNorms are torch's (permuted for channels-first): converted directly
    "convnext": lambda m: _activation(_config(m)) * sum(_config(m).depths),
    # MobileViT's CNN parts are counted from its calls (traced_patterns); its attention divides the
    # scores by sqrt(d) after QK^T (not Mul(q, scale) before it): not the README's pattern, not fused
    "mobilevit": lambda m: Patterns(),
    # LLaVA: the CLIP vision tower (every layer is traced, even the one after the feature layer),
    # its projector's gelu and a Llama
    "llava": lambda m: (
        _encoder(_config(m).vision_config, _config(m).vision_config.num_hidden_layers)
        + _act(_config(m).projector_hidden_act)
        + _llama_like(_config(m).text_config)
    ),
}
