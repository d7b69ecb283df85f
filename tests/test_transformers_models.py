"""transformers architectures (tiny configs, random weights) match eager in onnxruntime.

Each model is exported once, then converted at opset 18 and MAX_OPSET under every optimize setting.
"""

from __future__ import annotations

import pytest

import fastonnx
from export_check import check_export
from model_zoo import TRANSFORMERS_MODELS

OPSETS = (18, fastonnx.MAX_OPSET)
SETTINGS = (False, True, "onnxruntime")


@pytest.mark.parametrize("name", sorted(TRANSFORMERS_MODELS))
def test_matches_eager(name: str) -> None:
    model, args = TRANSFORMERS_MODELS[name]()
    check_export(model, args, opsets=OPSETS, optimize=SETTINGS)
