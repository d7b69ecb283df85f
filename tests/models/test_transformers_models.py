"""transformers architectures (tiny configs, random weights) match eager in onnxruntime.

Each model is exported once, then converted at opset 18 and MAX_OPSET under every optimize setting.
"""

from __future__ import annotations

import pytest
import torch

import fastonnx
from support.export_check import check_export
from support.fusion_expectations import TRANSFORMERS_PATTERNS, expecting, traced_patterns
from support.model_zoo import TRANSFORMERS_MODELS

OPSETS = (18, fastonnx.MAX_OPSET)
SETTINGS = (False, True, "onnxruntime")
# outputs are O(0.1-5) (hidden states or logits of tiny random models); onnxruntime's largest
# difference from eager over all 28 models, both opsets and every setting is ~2e-6 (float32 rounding
# through two layers): 1e-5 absolute keeps a 5x margin, far below any wrong value
ATOL, RTOL = 1e-5, 1e-4
# models with convolutions and BatchNorm: those fusions are counted from their torch calls
_TRACED = {"mobilevit"}


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
        model, args, opsets=OPSETS, optimize=SETTINGS, atol=ATOL, rtol=RTOL, fusions=expecting(patterns)
    )
