"""torchvision and timm classification models (random weights and BatchNorm statistics) match eager.

Each model is exported once, then converted at opset 18 and MAX_OPSET under every optimize setting.
Inputs are as small as each architecture allows, to keep CI fast.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import fastonnx
from export_check import check_export
from model_zoo import with_random_batchnorm_stats

OPSETS = (18, fastonnx.MAX_OPSET)
SETTINGS = (False, True, "onnxruntime")

# name -> input side; VGG and AlexNet are left out: 130M+ parameters of plain Conv/Linear, nothing new
TORCHVISION = {
    "resnet18": 64,
    "mobilenet_v2": 64,
    "mobilenet_v3_small": 64,
    "efficientnet_b0": 64,
    "squeezenet1_0": 64,
    "shufflenet_v2_x0_5": 64,
    "densenet121": 64,
    "regnet_y_400mf": 64,
    "mnasnet0_5": 64,
    "googlenet": 64,
    "inception_v3": 96,  # its stem needs at least 75 pixels
    "convnext_tiny": 64,
    "swin_t": 64,
    "vit_b_16": 32,
}
TIMM = {
    "resnet10t": 64,
    "efficientnet_b0": 64,
    "mobilenetv3_small_050": 64,
    "convnext_atto": 64,
    "vit_tiny_patch16_224": 32,
    "swin_tiny_patch4_window7_224": 56,
    "regnetx_002": 64,
    "densenet121": 64,
    "inception_v3": 96,
    "mixer_s32_224": 64,
    "levit_128s": 64,
}
# models whose constructor takes the input size (position embeddings, windows)
_SIZED = ("vit", "swin_tiny", "mixer", "levit")


def _check(model: torch.nn.Module, side: int) -> None:
    model = with_random_batchnorm_stats(model).eval()
    x = torch.randn(1, 3, side, side, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        scale = float(model(x).abs().max())
    # random BatchNorm statistics make deep nets' logits large (inception: ~1e6): tolerances follow
    # float32 rounding of values that size, relative to the largest logit
    check_export(model, (x,), opsets=OPSETS, optimize=SETTINGS, atol=1e-4 * max(1.0, scale), rtol=1e-3)


@pytest.mark.parametrize("name", sorted(TORCHVISION))
def test_torchvision(name: str) -> None:
    import torchvision

    kwargs: dict[str, Any] = {}
    if name in ("googlenet", "inception_v3"):
        kwargs = {"aux_logits": False, "init_weights": False}
    if name.startswith("vit"):
        kwargs = {"image_size": TORCHVISION[name]}
    torch.manual_seed(0)
    _check(torchvision.models.get_model(name, weights=None, **kwargs), TORCHVISION[name])


@pytest.mark.parametrize("name", sorted(TIMM))
def test_timm(name: str) -> None:
    import timm

    kwargs: dict[str, Any] = {"img_size": TIMM[name]} if name.startswith(_SIZED) else {}
    torch.manual_seed(0)
    _check(timm.create_model(name, pretrained=False, **kwargs), TIMM[name])
