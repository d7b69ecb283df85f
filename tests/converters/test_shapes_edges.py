"""tensor_split at a runtime tensor of indices (data-dependent piece sizes): Slices between the
indices, Python slice semantics (negative indices wrap, out-of-range ones clamp, unsorted ones give
empty pieces); split at sizes read with ``.tolist()`` (unbacked symbols, JetMoE's experts)."""

from __future__ import annotations

import pytest
import torch

from support.export_check import check_export


class SplitAt(torch.nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor, indices: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.tensor_split(x, indices, dim=self.dim)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_tensor_split_runtime_indices(dim: int) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(10, 12, 3, generator=g) if dim == 0 else torch.randn(3, 10, 12, generator=g)
    if dim == -1:
        x = torch.randn(3, 4, 12, generator=g)
    runs = [
        torch.tensor([2, 5, 9]),
        torch.tensor([0, 0, 12]),  # empty pieces at both ends
        torch.tensor([7, 3, 11]),  # unsorted: the middle piece is empty
        torch.tensor([-4, -1, 20]),  # negative indices wrap, past-the-end ones clamp
    ]
    check_export(SplitAt(dim), (x, runs[0]), run_args=[(x, r) for r in runs[1:]], atol=0, rtol=0)


def test_tensor_split_constant_indices_tensor() -> None:
    class Const(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return torch.tensor_split(x, torch.tensor([1, 4]), dim=1)

    check_export(Const(), (torch.randn(3, 10),), atol=0, rtol=0)


class ExpertSplit(torch.nn.Module):
    """JetMoE's experts: rows grouped by expert, split at counts read with ``tolist()``; each piece goes
    through its own matrix. The counts are unbacked symbols that only the ``item`` nodes carry."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(3, 5, 4, generator=torch.Generator().manual_seed(1)))

    def forward(self, x: torch.Tensor, expert: torch.Tensor) -> torch.Tensor:
        order = expert.argsort(stable=True)
        counts = torch.nn.functional.one_hot(expert, 3).sum(0).tolist()
        pieces = x[order].split(counts, dim=0)
        out = torch.cat([p @ self.weight[i].T for i, p in enumerate(pieces)], dim=0)
        return out.new_zeros(out.shape).index_copy(0, order, out)


def test_split_at_sizes_read_from_a_tensor() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, 4, generator=g)
    runs = [
        (torch.randn(7, 4, generator=g), torch.tensor([2, 2, 2, 2, 2, 2, 2])),  # two experts get none
        (torch.randn(7, 4, generator=g), torch.tensor([1, 0, 1, 0, 1, 0, 1])),
    ]
    check_export(ExpertSplit(), (x, torch.tensor([0, 2, 1, 0, 2, 1, 1])), run_args=runs)
