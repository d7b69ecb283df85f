"""transformers architectures (tiny configs, random weights) match eager in onnxruntime.

Each model is exported once, then converted at opset 18 and MAX_OPSET under every optimize setting
(``FASTONNX_FULL_MATRIX=1``); CI converts each model once per optimize setting, at both opsets, the
opsets rotated across the models so that every (opset, setting) pair is converted by some model
(``_conversions``).
"""

from __future__ import annotations

import pytest
import torch

import fastonnx
from support.export_check import check_export
from support.fusion_expectations import TRANSFORMERS_PATTERNS, expecting, traced_patterns
from support.matrix import rotated_conversions
from support.model_zoo import TRANSFORMERS_MODELS

OPSETS = (18, fastonnx.MAX_OPSET)
SETTINGS = (False, True, "onnxruntime")
# outputs are O(0.1-5) (hidden states or logits of tiny random models); onnxruntime's largest
# difference from eager over all 28 models, both opsets and every setting is ~2e-6 (float32 rounding
# through two layers): 1e-5 absolute keeps a 5x margin, far below any wrong value
ATOL, RTOL = 1e-5, 1e-4
# models with convolutions and BatchNorm: those fusions are counted from their torch calls
_TRACED = {"mobilevit"}


def _conversions(name: str) -> list[tuple[int, bool | str]]:
    """The (opset, optimize) pairs ``name`` converts at: each setting once, False and "onnxruntime" at
    one opset and True at the other, swapped from one model to the next: each model has an optimized
    conversion on both sides of opset 23 (Attention, RotaryEmbedding)."""
    index = sorted(TRANSFORMERS_MODELS).index(name)
    return rotated_conversions(index, OPSETS, SETTINGS, {False: 0, True: 1, "onnxruntime": 0})


@pytest.mark.parametrize("name", sorted(TRANSFORMERS_MODELS))
def test_matches_eager(name: str) -> None:
    model, args = TRANSFORMERS_MODELS[name]()
    with torch.no_grad():
        scale = float(torch.as_tensor(model(*args)).abs().max())
    assert scale > 1e-2, f"{name}: eager output is ~0 ({scale}), the comparison could not fail"
    patterns = TRANSFORMERS_PATTERNS[name](model)
    if name in _TRACED:
        patterns = patterns + traced_patterns(model, args)
    check_export(
        model, args, conversions=_conversions(name), atol=ATOL, rtol=RTOL, fusions=expecting(patterns)
    )


def test_the_sample_converts_every_pair() -> None:
    done = {name: _conversions(name) for name in TRANSFORMERS_MODELS}
    assert {pair for pairs in done.values() for pair in pairs} == {(o, s) for o in OPSETS for s in SETTINGS}
    for name, pairs in done.items():
        assert {opt for _, opt in pairs} == set(SETTINGS), (name, pairs)
        assert {opset for opset, opt in pairs if opt is not False} == set(OPSETS), (name, pairs)
