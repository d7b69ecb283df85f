"""The diagnostics of README's "When something goes wrong", run for real: a report of a failed export
and an intermediate verification that names a wrong converter. Run: python examples/diagnostics.py OUT_DIR
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

import fastonnx
from fastonnx.context import ConversionContext, Value


@torch.library.custom_op("demo::swish_beta", mutates_args=())
def swish_beta(x: torch.Tensor, beta: float) -> torch.Tensor:
    return x * torch.sigmoid(beta * x)


@swish_beta.register_fake
def _(x: torch.Tensor, beta: float) -> torch.Tensor:
    return torch.empty_like(x)


class Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(16, 32)
        self.down = torch.nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(F.layer_norm(x, (16,)))
        h = swish_beta(h, 1.5)
        return x + self.down(h)


def main(out: str) -> None:
    torch.manual_seed(0)
    model, x = Mlp().eval(), torch.randn(2, 4, 16)
    # 1. no converter for the user's op: the export fails and the report says where
    try:
        fastonnx.to_onnx(model, (x,), report=f"{out}/mlp.report.md")
    except fastonnx.UnsupportedOpError as e:
        print(e)

    # 2. a converter with a bug (beta ignored): intermediate verification names the node
    def swish_beta_wrong(ctx: ConversionContext, x: Value, beta: float) -> str:
        return ctx.op("Mul", x, ctx.op("Sigmoid", x))

    result = fastonnx.to_onnx(
        model, (x,), custom_converters={torch.ops.demo.swish_beta.default: swish_beta_wrong}
    )
    print(result.verify(x, intermediate=True))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
