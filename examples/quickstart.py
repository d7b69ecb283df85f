"""Export a small CNN with fastonnx, check it in onnxruntime, print where the file went and the stats."""

from __future__ import annotations

import os
import pprint

import torch

import fastonnx


class SmallCNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, padding=1),
            torch.nn.BatchNorm2d(16),
            torch.nn.ReLU(inplace=True),
            torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(16, 32, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1),
        )
        self.head = torch.nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.features(x), 1))


def main() -> None:
    model = SmallCNN().eval()
    x = torch.randn(2, 3, 32, 32)
    os.makedirs("out", exist_ok=True)
    result = fastonnx.to_onnx(model, (x,), filename="out/quickstart.onnx")
    torch.testing.assert_close(result(x), model(x), atol=1e-4, rtol=1e-4)
    print(f"wrote {os.path.abspath('out/quickstart.onnx')} (matches eager PyTorch in onnxruntime)")
    pprint.pprint(result.stats, sort_dicts=False)


if __name__ == "__main__":
    main()
