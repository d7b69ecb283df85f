"""Run as a script: exports a model of zero weights, N bytes of them, into FOLDER/m.onnx with external
data. The weights come from numpy's zeros (calloc'd pages that are never written): the export reads
them as the kernel's zero page, so a multi-GiB export costs no memory, only the disk it writes.

    python zeros_export.py N_BYTES FOLDER [--durable]
"""

from __future__ import annotations

import sys

import numpy as np
import torch

import fastonnx

PIECE_BYTES = 256 << 20


class Zeros(torch.nn.Module):
    def __init__(self, n_bytes: int) -> None:
        super().__init__()
        pieces = max(1, n_bytes // PIECE_BYTES)
        self.ws = torch.nn.ParameterList(
            torch.nn.Parameter(torch.from_numpy(np.zeros(PIECE_BYTES // 4, np.float32)), requires_grad=False)
            for _ in range(pieces)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for w in self.ws:
            x = x + w[:1]
        return x


def main() -> None:
    n_bytes, folder = int(sys.argv[1]), sys.argv[2]
    durable = "--durable" in sys.argv[3:]
    model = Zeros(n_bytes).eval()
    print("exporting", flush=True)
    fastonnx.to_onnx(
        model,
        (torch.ones(1),),
        filename=f"{folder}/m.onnx",
        external_data=True,
        optimize=False,
        durable=durable,
    )
    print("finished", flush=True)


if __name__ == "__main__":
    main()
