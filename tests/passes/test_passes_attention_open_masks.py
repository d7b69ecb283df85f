"""The open-mask pass (rust/core/src/passes/attention/open_masks.rs): an attention mask folded to
all-true constants, and its closed-rows flag folded to all-false, are dropped at any opset; it must fire
and keep onnxruntime's outputs (see pass_harness.py)."""

from __future__ import annotations

from support.attention_graphs import open_attention
from support.pass_harness import Pattern, fires_and_keeps_outputs

PATTERNS: dict[str, Pattern] = {
    "attention without padding (opset 20)": (open_attention, "attention_open_masks_removed", "default", 20),
}


test_pass_fires_and_keeps_outputs = fires_and_keeps_outputs(PATTERNS)
