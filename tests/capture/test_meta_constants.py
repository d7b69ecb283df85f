"""Number tensors a forward makes on its inputs' device, captured from a meta-device model
(capture/meta_constants.py): made on the CPU so the constant keeps its value; masked_fill, which takes no
CPU tensor for a meta one, gets its number; list indices become CPU tensors; a table of numbers is
made on the CPU and copied to the meta device in the graph. Checked against eager through a safetensors checkpoint."""

from __future__ import annotations

import pathlib

import torch
from safetensors.torch import save_file

import fastonnx


class Masked(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.proj(x)
        low = torch.tensor(-3.0, device=y.device)  # GPT-Neo's way: a number on the input's device
        y = torch.where(y > 0, y, low)
        fill = torch.scalar_tensor(7.0, device=y.device, dtype=y.dtype)  # CpmAnt's way
        y = torch.masked_fill(y, y < -1.0, fill)
        picked = y[:, [[0], [2]], 1:4].sum((1, 2)).unsqueeze(1)  # Falcon's list indices
        # Mask2Former's table of sizes, made from a list of tuples on the input's device
        table = torch.as_tensor([(4, 2), (3, 5)], dtype=torch.long, device=y.device)
        scaled = y[..., :2] / table.prod(1)
        return torch.cat([y, y[..., [6, 1, -1]] + picked, scaled], dim=-1)


def test_a_meta_models_number_tensors_keep_their_values(tmp_path: pathlib.Path) -> None:
    torch.manual_seed(0)
    real = Masked().eval()
    save_file({k: v.contiguous() for k, v in real.state_dict().items()}, str(tmp_path / "model.safetensors"))
    with torch.device("meta"):
        meta = Masked().eval()
    x = torch.randn(2, 5, 8)
    result = fastonnx.to_onnx(
        meta, (x.to("meta"),), filename=tmp_path / "m.onnx", weights=str(tmp_path), external_data=True
    )
    with torch.no_grad():
        want = real(x)
    assert (want == 7.0).any() and (want > 0).any()  # both constants decide some values
    torch.testing.assert_close(result(x), want)


class HalvedPositions(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = torch.arange(8, dtype=torch.float32, device=x.device)
        t //= 2  # DAB-DETR's sine positions: aten.floor_divide_.Tensor, whose twin is floor_divide.default
        return self.proj(x) / (t + 1)


def test_an_in_place_floor_division_of_a_made_tensor_converts(tmp_path: pathlib.Path) -> None:
    torch.manual_seed(0)
    real = HalvedPositions().eval()
    save_file({k: v.contiguous() for k, v in real.state_dict().items()}, str(tmp_path / "model.safetensors"))
    with torch.device("meta"):
        meta = HalvedPositions().eval()
    x = torch.randn(2, 8)
    result = fastonnx.to_onnx(
        meta, (x.to("meta"),), filename=tmp_path / "m.onnx", weights=str(tmp_path), external_data=True
    )
    with torch.no_grad():
        torch.testing.assert_close(result(x), real(x))
