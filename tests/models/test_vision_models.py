"""torchvision and timm classification models (random weights, calibrated BatchNorm) match eager.

Each model is exported once, then converted at opset 18 and MAX_OPSET under every optimize setting
(``FASTONNX_FULL_MATRIX=1``); CI converts each model once per optimize setting, at both opsets, the
opsets rotated across the models so that every (opset, setting) pair is converted by some model of
each library (``_conversions``). Inputs are as small as each architecture allows, to keep CI fast.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

import fastonnx
from support.export_check import check_export
from support.fusion_expectations import Patterns, expecting, traced_patterns
from support.matrix import rotated_conversions, sampled
from support.model_zoo import with_calibrated_batchnorm

OPSETS = (18, fastonnx.MAX_OPSET)
SETTINGS = (False, True, "onnxruntime")
# Tolerances. With BatchNorm statistics measured on random images (model_zoo.with_calibrated_batchnorm)
# the logits are O(1) (0.07-16), and onnxruntime differs from eager by float32 rounding only: at most
# 4e-5 (googlenet), 2e-5 (regnet_y_400mf, mnasnet0_5), about 1e-5 or less elsewhere, the same under every
# optimize setting. 5e-5 absolute plus 1e-4 relative passes them all; a wrong normalisation, activation
# or fold moves logits by orders more. Inception v3 is the exception: eager float32 itself is 1.7e-4
# (torchvision) / 9e-4 (timm, logits ~16) away from the same model in float64, and onnxruntime is as
# far (closer to float64 than eager, in fact). Measured block by block against float64, the rounding
# difference grows 1.5-2x per Inception block (no residual path damps it) to 6e-5 of the logits. So
# the absolute tolerance is the larger of 5e-5 and twice the model's own float32 error, measured
# against float64 on the test input.
ATOL, RTOL = 5e-5, 1e-4

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
    "vit_b_16": 32,  # ViT-B/16's patches on a tiny transformer (VIT_B_16_TINY)
}
# ViT's code is the same at every depth and width: 2 layers of width 64 instead of B's 12 of 768 (86M
# weights, which made it the slowest model here to convert and run)
VIT_B_16_TINY = {"patch_size": 16, "num_layers": 2, "num_heads": 4, "hidden_dim": 64, "mlp_dim": 128}
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


def _conversions(index: int) -> list[tuple[int, bool | str]]:
    """The (opset, optimize) pairs the ``index``-th model of its library converts at: each setting
    once, False and "onnxruntime" at one opset and True at the other, swapped from one model to the
    next: each model has an optimized conversion on both sides of opset 23 (Attention's)."""
    return rotated_conversions(index, OPSETS, SETTINGS, {False: 0, True: 1, "onnxruntime": 0})


def _random_zero_weights(model: torch.nn.Module) -> None:
    """Weights initialised to zero (torchvision ViT's and timm Mixer's heads) would make every logit 0."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2 and not p.any():
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)


def _float32_error(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """How far eager float32 is from the same model computed in float64."""
    with torch.no_grad():
        y64 = copy.deepcopy(model).double()(x.double())
    return float((y.double() - y64).abs().max())


def _check(model: torch.nn.Module, side: int, index: int, written: Patterns | None = None) -> None:
    """``index``: the model's place in its library's list (``_conversions``); ``written``: fusable
    patterns the model writes by hand, which tracing torch calls cannot see."""
    _random_zero_weights(model)
    model = with_calibrated_batchnorm(model, side)
    x = torch.randn(1, 3, side, side, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        y = model(x)
    assert float(y.std()) > 1e-2, f"logits barely vary (std {float(y.std())}): the comparison could not fail"
    atol = max(ATOL, 2 * _float32_error(model, x, y))
    patterns = traced_patterns(model, (x,)) + (written or Patterns())
    check_export(
        model, (x,), conversions=_conversions(index), atol=atol, rtol=RTOL, fusions=expecting(patterns)
    )


def _unshifted_windows(model: torch.nn.Module, x: torch.Tensor) -> int:
    """torchvision Swin blocks whose window attention is not shifted: a window as large as the (padded)
    feature map is not shifted, and even blocks never are."""
    from torchvision.models.swin_transformer import ShiftedWindowAttention

    shifted = []

    def hook(m: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        h, w = args[0].shape[1:3]
        (wh, ww), (sh, sw) = m.window_size, m.shift_size
        pad_h, pad_w = -(-h // wh) * wh, -(-w // ww) * ww
        shifted.append((sh > 0 and wh < pad_h) or (sw > 0 and ww < pad_w))

    mods = [m for m in model.modules() if isinstance(m, ShiftedWindowAttention)]
    handles = [m.register_forward_pre_hook(hook) for m in mods]
    with torch.no_grad():
        model.eval()(x)
    for h in handles:
        h.remove()
    return shifted.count(False)


# DenseNet-121 and Inception v3 run in CI as timm's (the same architectures), ConvNeXt as timm's atto;
# here under the full matrix
@pytest.mark.parametrize(
    "name",
    sampled(sorted(TORCHVISION), lambda name: name not in ("densenet121", "inception_v3", "convnext_tiny")),
)
def test_torchvision(name: str) -> None:
    import torchvision

    kwargs: dict[str, Any] = {}
    if name in ("googlenet", "inception_v3"):
        kwargs = {"aux_logits": False, "init_weights": False}
    torch.manual_seed(0)
    if name == "vit_b_16":
        model = torchvision.models.VisionTransformer(image_size=TORCHVISION[name], **VIT_B_16_TINY)
    else:
        model = torchvision.models.get_model(name, weights=None, **kwargs)
    written = Patterns()
    if name.startswith("swin"):
        # hand-written window attention, Mul(q, scale) before QK^T plus a relative-position bias: it
        # fuses where the window is not shifted; a shifted window adds its mask between two Reshapes
        # (scores viewed per window), which is not the README's pattern
        side = TORCHVISION[name]
        written = Patterns(attention=_unshifted_windows(model, torch.zeros(1, 3, side, side)))
    _check(model, TORCHVISION[name], sorted(TORCHVISION).index(name), written)


# DenseNet-121 (its concatenations: torchvision's too) and Swin (torchvision's Swin-T runs in CI) under
# the full matrix
@pytest.mark.parametrize(
    "name",
    sampled(
        sorted(TIMM), lambda name: name not in ("densenet121", "swin_tiny_patch4_window7_224", "inception_v3")
    ),
)
def test_timm(name: str) -> None:
    import timm

    kwargs: dict[str, Any] = {"img_size": TIMM[name]} if name.startswith(_SIZED) else {}
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, **kwargs)
    written = Patterns()
    # Attention these models write by hand:
    # - levit_128s multiplies QK^T by the scale after the product, then adds its bias (a variant, not
    #   fused, nothing added);
    # - swin_tiny (timm's fused_attn is off for Swin): Mul(q, scale) before QK^T plus a relative-position
    #   bias fuses in blocks without a shifted-window mask (an eval-mode Dropout converts to nothing);
    #   a shifted window adds its mask between two Reshapes, which is not the README's pattern
    if name.startswith("swin"):
        from timm.models.swin_transformer import SwinTransformerBlock

        blocks = [m for m in model.modules() if isinstance(m, SwinTransformerBlock)]
        written = Patterns(attention=sum(1 for b in blocks if b.attn_mask is None))
    _check(model, TIMM[name], sorted(TIMM).index(name), written)


def test_the_sample_converts_every_pair_in_each_library() -> None:
    for models in (TORCHVISION, TIMM):
        done = [_conversions(i) for i in range(len(models))]
        assert {pair for pairs in done for pair in pairs} == {(o, s) for o in OPSETS for s in SETTINGS}
        for pairs in done:
            assert {opt for _, opt in pairs} == set(SETTINGS), pairs
            assert {opset for opset, opt in pairs if opt is not False} == set(OPSETS), pairs
