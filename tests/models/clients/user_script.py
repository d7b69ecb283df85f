"""A plain export script as users write it against torch.onnx.export (TorchScript-era keywords,
dynamic_axes). tests/models/test_clients.py runs it unchanged under fastonnx.patch_torch_onnx()."""

import torch


class Classifier(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1),
            torch.nn.BatchNorm2d(8),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(),
        )
        self.head = torch.nn.Linear(8, 5)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(pixels)).softmax(-1)


torch.manual_seed(0)
model = Classifier().eval()
dummy = torch.randn(1, 3, 32, 32)
torch.onnx.export(
    model,
    dummy,
    "classifier.onnx",
    export_params=True,
    opset_version=18,
    do_constant_folding=True,
    input_names=["pixels"],
    output_names=["probs"],
    dynamic_axes={"pixels": {0: "batch", 2: "height", 3: "width"}, "probs": {0: "batch"}},
    dynamo=False,
)
