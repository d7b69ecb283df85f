"""The backward of CPU flash attention (what torch.compile training graphs hold) against torch's
kernel: plain, causal, float and boolean masks, an explicit scale, float16."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import fastonnx

flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default


def _grads(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dout: torch.Tensor,
    causal: bool,
    mask: torch.Tensor | None,
    scale: float | None,
) -> tuple[torch.Tensor, ...]:
    out, lse = flash(q, k, v, 0.0, causal, attn_mask=mask, scale=scale)
    return tuple(flash_backward(dout, q, k, v, out, lse, 0.0, causal, attn_mask=mask, scale=scale))


CASES = {
    "plain": (False, None, None),
    "causal": (True, None, None),
    "float_mask": (False, "float", None),
    "scale": (False, None, 0.3),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_torch(case: str, dtype: torch.dtype) -> None:
    causal, mask_kind, scale = CASES[case]
    g = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(2, 3, 7, 8, generator=g).to(dtype) for _ in range(4))
    mask = None
    if mask_kind == "float":
        mask = torch.randn(2, 1, 7, 7, generator=g).to(dtype)
        mask[..., 3] = float("-inf")

    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return _grads(q, k, v, dout, causal, mask, scale)

    gm = make_fx(f)(q, k, v, dout)
    assert any(n.target is flash_backward for n in gm.graph.nodes)
    result = fastonnx.graph_module_to_onnx(gm)
    got = result(q, k, v, dout)
    expected = f(q, k, v, dout)
    # float16: torch and the graph both compute in float32 and round once; the sums run in other orders
    atol, rtol = (1e-5, 1e-4) if dtype == torch.float32 else (2e-3, 2e-3)
    for name, a, b in zip(("grad_query", "grad_key", "grad_value"), got, expected, strict=True):
        assert a.dtype == b.dtype == dtype
        assert float(b.abs().max()) > 1e-2, f"{name} is ~0: the comparison could not fail"
        torch.testing.assert_close(a, b, atol=atol, rtol=rtol, msg=lambda m, n=name: f"{case} {n}: {m}")


def test_dropout_is_refused_naming_the_op() -> None:
    g = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(1, 2, 4, 8, generator=g) for _ in range(4))

    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out, lse = flash(q, k, v, 0.0, False)
        return tuple(flash_backward(dout, q, k, v, out, lse, 0.5, False))

    with pytest.raises(fastonnx.ConversionError, match="dropout"):
        fastonnx.graph_module_to_onnx(make_fx(f)(q, k, v, dout))
