"""Weight-only quantization at export: ``to_onnx(..., quantize="int4" | "int8" | WeightQuantization(...))``.

Which weights: every 2-D float weight a MatMul / Gemm / Linear reads (``GraphBuilder.quantizable_weights``),
except those left in float: by default the LM head (a Linear named ``lm_head``, one tied to an
embedding, or one outside numbered layers whose ``out_features`` is an ``nn.Embedding``'s
``num_embeddings``: the vocabulary projection); ``exclude=`` patterns replace that rule. Embeddings are
Gathers, never products: they stay float and ``stats["quantize"]["float"]`` says so, except one tied to a
head quantized at the "onnxruntime" level, which gathers the head's codes (``gather_codes``;
``stats["quantize"]["embeddings_from_codes"]``).

How: the builder rewrites the products before the passes (``GraphBuilder.quantize_weights``) into
``DequantizeLinear -> MatMul`` (standard level, opset >= 21) or ``com.microsoft.MatMulNBits``
("onnxruntime" level); the quantized tensors are computed by the Rust writer while it streams, a run
of whole blocks at a time, from the weight's memory or — with ``weights=`` — from the checkpoint shard
(read, never referenced: only quantized bytes are written). See rust/core/src/tensor/quantize.rs.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from fastonnx.dtypes import to_onnx_dtype
from fastonnx.errors import InputError, OpsetError

BLOCKED_DEQUANTIZE_OPSET = 21
"""DequantizeLinear with block_size and int4 / uint4 inputs: the first opset of both."""


@dataclasses.dataclass(frozen=True)
class WeightQuantization:
    """Weight-only block quantization of the products' weights (``to_onnx(quantize=...)``).

    bits: 4 or 8. block_size: values per block along the input (K) axis, a power of two from 16 to 256
    (default 32). symmetric: True (default) stores signed codes with a scale per block (int4 / int8);
    False adds a zero point per block (uint4 / uint8 codes). exclude: None (default) leaves the LM head
    in float (a Linear named ``lm_head``, tied to an embedding, or, outside numbered layers, whose
    out_features is an nn.Embedding's num_embeddings); a sequence of module-name patterns
    (``fnmatch``, on the full name; a pattern also matches a name ending in ``.<pattern>``, so that
    ``model.layers.0.*`` finds a model's layer inside a wrapper) replaces that rule; ``()``
    quantizes every product's weight, the LM head too. A pattern that matches no module is an
    ``InputError``. accuracy_level: MatMulNBits' ``accuracy_level`` at the "onnxruntime" optimize level:
    4 (default) quantizes the activations to int8 inside the kernel, as onnxruntime does by default
    for the standard level's fused form (so both levels compute alike and as fast: a 3B decode step
    took 3.2x longer at 0), 0 computes with the exactly dequantized weights, None leaves the attribute
    out (onnxruntime's attribute default, 0). At the standard level the session option
    ``session.qdq_matmulnbits_accuracy_level`` decides (4 unless set).

    Mixed precision (the onnxruntime-genai builder's ``matmul_mixed_precision``): ``bits_for`` maps
    module-name patterns (as ``exclude``'s) to 4 or 8 bits for the products they match, the first matching
    pattern deciding; a pattern matching the LM head quantizes it with those bits although ``exclude`` is
    None (``{"lm_head": 8}``: an int4 model with an int8 head). ``accuracy_level_for`` maps patterns to
    MatMulNBits' ``accuracy_level`` (0-4) for the products they match (the onnxruntime level; the standard
    level has no per-product setting, so it is an ``InputError`` there). A pattern matching no module is an
    ``InputError``, as in ``exclude``; ``exclude`` wins over both.

    gather_codes: at the "onnxruntime" level, an embedding tied to a quantized head (the head's weight is
    the embedding's table) reads the head's MatMulNBits codes through ``com.microsoft.GatherBlockQuantized``
    (as the onnxruntime-genai builder's int4 tied embeddings do): the package holds the table once, as
    codes, and no float copy of it. False keeps the float table for the embedding (a provider without
    that kernel: DirectML).
    """

    bits: int = 4
    block_size: int = 32
    symmetric: bool = True
    exclude: Sequence[str] | None = None
    accuracy_level: int | None = 4
    bits_for: Mapping[str, int] | None = None
    accuracy_level_for: Mapping[str, int] | None = None
    gather_codes: bool = True

    def check(self) -> WeightQuantization:
        """Self, validated: an ``InputError`` names each bad setting."""
        if self.bits not in (4, 8) or isinstance(self.bits, bool):
            raise InputError(f"quantize: bits must be 4 or 8, got {self.bits!r}")
        b = self.block_size
        if isinstance(b, bool) or not isinstance(b, int) or not 16 <= b <= 256 or b & (b - 1):
            raise InputError(f"quantize: block_size must be a power of two from 16 to 256, got {b!r}")
        if not isinstance(self.symmetric, bool):
            raise InputError(f"quantize: symmetric must be True or False, got {self.symmetric!r}")
        if not isinstance(self.gather_codes, bool):
            raise InputError(f"quantize: gather_codes must be True or False, got {self.gather_codes!r}")
        if self.exclude is not None and (
            isinstance(self.exclude, str) or not all(isinstance(p, str) and p for p in self.exclude)
        ):
            raise InputError(
                f"quantize: exclude must be a sequence of module-name patterns, got {self.exclude!r}"
            )
        level = self.accuracy_level
        if level is not None and (isinstance(level, bool) or level not in range(5)):
            raise InputError(f"quantize: accuracy_level must be None or 0-4, got {level!r}")
        for field, allowed in (("bits_for", (4, 8)), ("accuracy_level_for", tuple(range(5)))):
            table = getattr(self, field)
            if table is None:
                continue
            if not isinstance(table, Mapping) or not all(
                isinstance(p, str) and p and not isinstance(v, bool) and v in allowed
                for p, v in table.items()
            ):
                raise InputError(
                    f"quantize: {field} must map module-name patterns to one of {list(allowed)}, got {table!r}"
                )
        return self

    def patterns(self) -> list[str]:
        """Every module-name pattern the settings name."""
        return [*(self.exclude or ()), *(self.bits_for or {}), *(self.accuracy_level_for or {})]


def _in_a_stack(module_name: str) -> bool:
    """Whether the module sits in a numbered layer (``model.layers.3.mlp.up_proj``)."""
    return any(part.isdigit() for part in module_name.split("."))


def resolve_scheme(quantize: Any) -> WeightQuantization | None:
    """``to_onnx``'s ``quantize`` as settings (None: no quantization)."""
    if quantize is None:
        return None
    if quantize == "int4":
        return WeightQuantization(bits=4)
    if quantize == "int8":
        return WeightQuantization(bits=8)
    if isinstance(quantize, WeightQuantization):
        return quantize.check()
    raise InputError(
        f"quantize must be None, 'int4', 'int8' or a fastonnx.WeightQuantization, got {quantize!r}"
    )


def check_opset(settings: WeightQuantization, opset: int, level: str) -> None:
    """The standard forms need blocked DequantizeLinear (opset 21), and take no accuracy level."""
    if level != "onnxruntime" and settings.accuracy_level_for:
        raise InputError(
            "quantize: accuracy_level_for sets MatMulNBits' accuracy_level per product, which only the "
            "onnxruntime optimize level writes (the standard level's session option is one for all)"
        )
    if level != "onnxruntime" and opset < BLOCKED_DEQUANTIZE_OPSET:
        raise OpsetError(
            f"quantize={settings.bits}-bit at the standard level writes DequantizeLinear with block_size "
            f"(int{settings.bits} weights), which needs opset >= {BLOCKED_DEQUANTIZE_OPSET}; the export's "
            f"opset is {opset}: pass opset={BLOCKED_DEQUANTIZE_OPSET} or more, or "
            "optimize='onnxruntime' (com.microsoft.MatMulNBits at any opset)"
        )


def _matches(pattern: str, module: str) -> bool:
    # also a name ending in ".<pattern>": the model's own names match inside a wrapper
    # (export_pretrained captures transformers' model as an attribute of its task module)
    if fnmatch.fnmatchcase(module, pattern):
        return True
    if any(c in pattern for c in "*?["):
        return fnmatch.fnmatchcase(module, "*." + pattern)
    return module.endswith("." + pattern)


def _module_of(key: str) -> str:
    return key.rsplit(".", 1)[0] if "." in key else ""


def _expert_weights(builder: Any, settings: WeightQuantization, level: str) -> dict[str, str | None]:
    """The expert weights of the graph's MoE nodes (fastonnx's routed experts at the "onnxruntime" level),
    each with why it stays float, or None (a QMoE reads a node's two weights quantized)."""
    pairs: dict[str, str | None] = {}
    for fc1, fc2, _experts, hidden, inter in builder.quantizable_experts():
        why = None
        if level != "onnxruntime":
            why = "experts of a MoE node, read quantized by QMoE at the onnxruntime level only"
        elif hidden % settings.block_size or inter % settings.block_size:
            why = (
                f"experts (QMoE) need hidden and intermediate sizes ({hidden}, {inter}) that are multiples "
                f"of block_size {settings.block_size}"
            )
        pairs[fc1] = pairs[fc2] = why
    return pairs


def quantize_weights(
    builder: Any,
    settings: WeightQuantization,
    model: Any,
    level: str,
    weights_read: dict[str, tuple[str, torch.dtype, tuple[int, ...]]],
    deferred: dict[str, str],
    entries: dict[str, tuple[Any, torch.dtype]] | None,
) -> tuple[dict[str, Any], set[str]]:
    """Rewrites the products' weights (before the passes); returns ``stats["quantize"]`` and the
    initializers now read from the checkpoint by the quantizer (no longer to be referenced)."""
    from fastonnx.stored_weights.checkpoints import aliases

    modules: dict[str, torch.nn.Module] = (
        dict(model.named_modules(remove_duplicate=False)) if isinstance(model, torch.nn.Module) else {}
    )
    tied = aliases(model)
    vocab = {m.num_embeddings for m in modules.values() if isinstance(m, torch.nn.Embedding)}
    embedding_names = {name for name, m in modules.items() if isinstance(m, torch.nn.Embedding)}
    patterns = list(settings.exclude) if settings.exclude is not None else None
    known = list(modules) or [_module_of(k) for k, _, _ in weights_read.values()]
    unmatched = [p for p in settings.patterns() if not any(_matches(p, m) for m in known)]
    if unmatched:
        raise InputError(f"quantize: pattern(s) {unmatched} match no module of the model")

    def first(table: Mapping[str, int] | None, owners: list[str]) -> int | None:
        return next((v for p, v in (table or {}).items() if any(_matches(p, o) for o in owners)), None)

    # (bits, accuracy level) -> the weights quantized so (one builder call each)
    groups: dict[tuple[int, int | None], list[tuple[str, tuple[str, int, int] | None]]] = {}
    chosen: list[tuple[str, tuple[str, int, int] | None]] = []
    left: dict[str, str] = {}
    shapes: dict[str, list[int]] = {}
    from_checkpoint: set[str] = set()
    experts = _expert_weights(builder, settings, level)
    labels: dict[str, str] = {}
    owners_of: dict[str, list[str]] = {}
    for name, n, k, _products in builder.quantizable_weights():
        key = weights_read.get(name, (name, None, None))[0]
        keys = [key, *tied.get(key, [])]
        owners = [_module_of(k) for k in keys]
        label = key if name in experts else owners[0] or key  # an experts module holds two weights
        labels[name] = label
        owners_of[name] = owners
        shapes[label] = [n, k]
        reason = None
        if experts.get(name) is not None:
            reason = experts[name]
        elif patterns is not None:  # an experts module's two weights share its name: both or neither
            hit = next((p for p in patterns if any(_matches(p, o) for o in owners)), None)
            if hit is not None:
                reason = f"excluded by pattern {hit!r}"
        elif first(settings.bits_for, owners) is not None:
            pass  # named for its own bits: quantized, a head too
        elif any(o == "lm_head" or o.endswith(".lm_head") for o in owners):
            reason = "LM head (named lm_head)"
        elif any(o in embedding_names for o in owners):
            reason = "LM head (tied to an embedding)"
        elif n in vocab and not any(_in_a_stack(o) for o in owners):
            # by size only outside numbered layers: an MLP whose width equals the vocabulary's is not a head
            reason = f"LM head (out_features {n} is an embedding's vocabulary size)"
        if reason is not None:
            left[label] = reason
            continue
        bits = first(settings.bits_for, owners) or settings.bits
        accuracy = first(settings.accuracy_level_for, owners)
        group = groups.setdefault((bits, settings.accuracy_level if accuracy is None else accuracy), [])
        entry = entries.get(name) if entries is not None else None
        if entry is not None:
            shard = entry[0]
            stored = to_onnx_dtype(shard.dtype) if isinstance(shard.dtype, torch.dtype) else 0
            group.append((name, (shard.shard, shard.offset, stored)))
            from_checkpoint.add(name)
        elif name in deferred:
            raise InputError(
                f"quantize: weight {key!r} is on the meta device and has no bytes to quantize: pass "
                "weights= (the checkpoint) so that it is read from there"
            )
        else:
            group.append((name, None))
    for name in sorted(embedding_names):
        left.setdefault(name, "embedding (a Gather, not a product)")

    form = "matmulnbits" if level == "onnxruntime" else "dequantize"
    quantized: dict[str, Any] = {}
    done: list[tuple[str, int, int, int]] = []
    gathered: dict[str, str] = {}
    for (bits, accuracy), members in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        chosen.extend(members)
        made = builder.quantize_weights(
            members,
            bits,
            settings.block_size,
            settings.symmetric,
            form,
            accuracy,
            settings.gather_codes and form == "matmulnbits",
        )
        done.extend(made)
        for name, nbytes, products, gathers in made:
            if gathers:  # the tied embedding reads this weight's codes: no float table of its own
                for owner in owners_of[name]:
                    if owner in embedding_names:
                        gathered[owner] = labels[name]
            label = labels[name]
            quantized[label] = {
                "shape": shapes.get(label),
                "bytes": nbytes,
                "products": products,
                "source": "checkpoint" if name in from_checkpoint else "memory",
                "bits": bits,
                **({"accuracy_level": accuracy} if form == "matmulnbits" else {}),
            }
    missing = {name for name, _ in chosen} - {name for name, *_ in done}
    for name in sorted(missing):
        left[labels[name]] = "its bytes are not in host memory (device weight)"
    stats = {
        "bits": settings.bits,
        "block_size": settings.block_size,
        "symmetric": settings.symmetric,
        "form": "MatMulNBits" if form == "matmulnbits" else "DequantizeLinear",
        "quantized": quantized,
        "quantized_bytes": sum(v["bytes"] for v in quantized.values()),
        "float": {k: v for k, v in left.items() if k not in gathered},
        # embedding module -> the quantized weight whose codes it gathers (GatherBlockQuantized)
        **({"embeddings_from_codes": gathered} if gathered else {}),
    }
    # a weight another node still reads (a tied head's embedding Gather) stays referenced
    return stats, {name for name, *_ in done if name in from_checkpoint and not builder.has_initializer(name)}
