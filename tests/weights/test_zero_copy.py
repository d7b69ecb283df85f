"""Weights go from torch storage to the file without a copy: peak memory during to_onnx stays under
128 MiB + 5% of the weights (not timed; memory is what is asserted)."""

from __future__ import annotations

import onnx
import pytest
import torch

import fastonnx
from support.matrix import sampled
from support.memory import peak_extra_bytes
from support.model_zoo import Wide

GIB = 1 << 30


# CI: each dtype once, each write path once; every pair under FASTONNX_FULL_MATRIX=1
@pytest.mark.parametrize(
    ("dtype", "external"),
    sampled(
        [(d, e) for e in (False, True) for d in (torch.float32, torch.bfloat16)],
        lambda case: case in ((torch.float32, False), (torch.bfloat16, True)),
    ),
)
def test_peak_memory_of_a_1gib_export(tmp_path, dtype: torch.dtype, external: bool) -> None:
    with torch.no_grad():
        model = Wide(GIB, dtype).eval()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    x = torch.randn(1, 4096, dtype=dtype)
    ep = torch.export.export(model, (x,), strict=False)
    path = tmp_path / "wide.onnx"
    extra = peak_extra_bytes(lambda: fastonnx.to_onnx(ep, (x,), filename=path, external_data=external))
    limit = 128 * (1 << 20) + 0.05 * weights
    # shown with `pytest -s`: the figure the ledger and the closing notes quote
    print(
        f"\n{dtype} external={external}: extra peak {extra / 2**20:.0f} MiB for {weights / 2**20:.0f} MiB of weights"
    )
    assert extra < limit, f"peak extra memory {extra / 2**20:.0f} MiB > limit {limit / 2**20:.0f} MiB"
    # the file holds the weights, and loads back (structure only: no need to read 1 GiB again)
    model_proto = onnx.load(str(path), load_external_data=False)
    assert len(model_proto.graph.initializer) == len(model.layers)
    first = model_proto.graph.initializer[0]
    assert (first.data_location == onnx.TensorProto.EXTERNAL) == external
    if not external:
        # the weight is stored as it is, or transposed for MatMul (the writer transposes as it writes)
        w = model.layers[0].weight.detach()
        as_is, transposed = (t.contiguous().view(torch.uint8).numpy().tobytes() for t in (w, w.t()))
        assert first.raw_data in (as_is, transposed)
