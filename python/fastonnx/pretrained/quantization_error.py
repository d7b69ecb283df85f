"""What a quantized text-generation package costs in accuracy and what it saves in bytes, measured on
the verification prompt and written to its report.

Quantized products differ from transformers' float ones by design, so no tolerance can pass or fail them
(verification says "skipped"); the report still gives the user the numbers to judge a choice by (plain
int4, int4 with an int8 head, named layers in int8: ``WeightQuantization.bits_for``): the logits of a
prefill of the verification prompt (2 rows of 5 tokens) in onnxruntime against transformers' float model,
as the largest difference (absolute, and relative to the largest float logit), the mean cosine of the
rows, and how often the top token agrees; and the quantized weights' bytes by precision.
"""

from __future__ import annotations

import collections
import pathlib
from typing import Any

import torch

from fastonnx.pretrained.decoder_cache import config_layout, flat_tensors, text_config
from fastonnx.pretrained.folder import CheckpointFolder
from fastonnx.pretrained.graph_spec import GraphSpec
from fastonnx.pretrained.task_inputs import decoder_inputs

BATCH, PROMPT = 2, 5


def logits_error(got: torch.Tensor, want: torch.Tensor) -> dict[str, float]:
    """The differences of quantized logits ``got`` from float ``want`` (same shape, vocabulary last)."""
    got, want = got.float().flatten(0, -2), want.float().flatten(0, -2)
    largest = float((got - want).abs().max())
    return {
        "max_abs": largest,
        "max_rel": largest / max(float(want.abs().max()), 1e-12),
        "cosine": float(torch.nn.functional.cosine_similarity(got, want, dim=-1).mean()),
        "top1_agree": float((got.argmax(-1) == want.argmax(-1)).float().mean()),
    }


def bytes_by_precision(stats: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """``stats["quantize"]``'s quantized weights as {"int4": (products, bytes), ...}."""
    found: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for entry in stats.get("quantized", {}).values():
        key = f"int{entry.get('bits', stats.get('bits'))}"
        found[key][0] += 1
        found[key][1] += int(entry["bytes"])
    return {k: (v[0], v[1]) for k, v in sorted(found.items())}


def measure(
    package: pathlib.Path, checkpoint: CheckpointFolder, class_name: str, spec: GraphSpec
) -> dict[str, float]:
    """The prefill's logits error of the package's decoder (a cache decoder) on the verification prompt."""
    import onnxruntime as ort
    import transformers

    from fastonnx.pretrained.package_check import _run

    model = getattr(transformers, class_name).from_pretrained(checkpoint.path, dtype=torch.float32).eval()
    config = text_config(model.config)
    layout = spec.cache_layout or config_layout(config)
    with_positions = "position_ids" in spec.input_names
    first = decoder_inputs(layout, int(config.vocab_size), BATCH, PROMPT, 0, "cpu", with_positions)
    ids, mask = first[0], first[1]
    feeds = [ids, mask, *([first[2]] if with_positions else []), *flat_tensors(first[-1])]
    session = ort.InferenceSession(str(package / "model.onnx"), providers=["CPUExecutionProvider"])
    got = _run(session, spec.input_names, feeds)[0]
    with torch.no_grad():
        kwargs: dict[str, Any] = {"input_ids": ids, "attention_mask": mask}
        if with_positions:
            kwargs["position_ids"] = first[2]
        want = model(**kwargs).logits
    return logits_error(got, want)


def report(error: dict[str, float] | None, note: str, stats: dict[str, Any]) -> list[str]:
    """The report's section."""
    lines = ["## Quantization: bytes and logits on the verification prompt", ""]
    for precision, (products, nbytes) in bytes_by_precision(stats).items():
        lines.append(f"- {precision}: {products} weights, {nbytes / 2**20:.2f} MiB")
    for embedding, head in stats.get("embeddings_from_codes", {}).items():
        lines.append(
            f"- {embedding}: shares the head's codes ({head}), read by GatherBlockQuantized; no float table"
        )
    if stats.get("float"):
        lines.append(f"- float: {len(stats['float'])} weights or embeddings (listed above, with why)")
    lines.append("")
    if error is None:
        lines.append(f"Logits not measured: {note}.")
    else:
        lines.append(
            f"Prefill of {BATCH} x {PROMPT} tokens against transformers' float model (no pass or fail: the "
            f"products differ by design): largest difference {error['max_abs']:.4g} "
            f"({error['max_rel']:.2%} of the largest float logit), mean cosine {error['cosine']:.5f}, top "
            f"token agrees at {error['top1_agree']:.0%} of positions."
        )
    return lines
