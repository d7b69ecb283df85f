"""as_strided over views of a base tensor (slices, transposes, partial views, views of computed values,
views whose base was written in place): as_strided reads the base's storage (the view's storage offset,
the base's strides), which the converter gets from the walker's alias tracking (``ctx.base``). OpInfo's
``as_strided`` and ``as_strided.partial_views`` samples are replayed over views built inside the model."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch

from support.export_check import Fn, check_export
from support.opinfo_harness import op_db_by_name, samples

View = Callable[[torch.Tensor, tuple[int, ...]], torch.Tensor]


def _slice(base: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """A 1-D base 3 + numel + 4 long; the view: its middle, reshaped (storage offset 3)."""
    return base[3 : 3 + math.prod(shape)].view(shape)


def _transpose(base: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """A base of the reversed shape; the view: its dims reversed (strides of the base, reversed)."""
    return base.permute(*reversed(range(base.dim())))


def _computed_slice(base: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """The base is computed in the graph (not an input)."""
    return _slice(base * 2 + 1, shape)


def _corner(base: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """A 2-D base with rows and columns around the view: a view with offset and a row stride > cols."""
    return base[1 : 1 + shape[0], 2 : 2 + shape[1]]


def _base_of(view: str, shape: tuple[int, ...], storage: int, g: torch.Generator) -> torch.Tensor:
    if view in ("slice", "computed_slice"):
        return torch.randn(3 + max(math.prod(shape), storage) + 4, generator=g)
    if view == "transpose":
        return torch.randn(*reversed(shape), generator=g)
    return torch.randn(shape[0] + 2, shape[1] + 3, generator=g)


VIEWS: dict[str, View] = {
    "slice": _slice,
    "transpose": _transpose,
    "computed_slice": _computed_slice,
    "corner": _corner,
}


def _cases() -> list[Any]:
    db = op_db_by_name()
    cases = []
    for name in ("as_strided", "as_strided.partial_views"):
        for i, s in enumerate(samples(db[name])):
            shape = tuple(s.input.shape)
            size, stride = s.args
            offset = s.kwargs.get("storage_offset")
            # the partial views' samples read past the view (up to its base's end): slices of a base
            # at least as long as theirs only (a transpose's base holds just the view's elements)
            storage = s.input.untyped_storage().nbytes() // s.input.element_size()
            for view in VIEWS:
                if view == "corner" and len(shape) != 2:
                    continue
                if view in ("transpose", "corner") and storage > math.prod(shape):
                    continue
                cases.append(
                    pytest.param(
                        view, shape, storage, tuple(size), tuple(stride), offset, id=f"{name}-{i}-{view}"
                    )
                )
    return cases


@pytest.mark.parametrize(("view", "shape", "storage", "size", "stride", "offset"), _cases())
def test_opinfo_samples_over_views(
    view: str,
    shape: tuple[int, ...],
    storage: int,
    size: tuple[int, ...],
    stride: tuple[int, ...],
    offset: Any,
) -> None:
    make = VIEWS[view]
    base = _base_of(view, shape, storage, torch.Generator().manual_seed(0))
    kwargs = {} if offset is None else {"storage_offset": offset}
    model = Fn(lambda b: make(b, shape).as_strided(size, stride, **kwargs))
    check_export(model, (base,), optimize=(False, True), atol=0, rtol=0)


def test_partial_view_as_in_opinfo() -> None:
    """OpInfo's partial-view samples as torch builds them: base[5:15] of a (20,) base."""
    base = torch.randn(20)
    for args in [((2, 2), (1, 2)), ((2, 2), (1, 2), 0), ((2, 2), (1, 2), 10), ((3, 4), (4, 1), 5)]:
        check_export(Fn(lambda b, a=args: b[5:15].as_strided(*a)), (base,), atol=0, rtol=0)


class WrittenBase(torch.nn.Module):
    """A view taken before an in-place write to its base: as_strided reads the written storage."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b = x.clone()
        v = b[1:]
        b.mul_(3)  # the base, written after the view was taken
        w = b[2:, 1:]
        w.add_(10)  # written through another view
        return v.as_strided((3, 2), (4, 2), 3), v.as_strided((2, 3), (1, 5))


def test_as_strided_after_writes_to_the_base() -> None:
    check_export(WrittenBase(), (torch.randn(4, 5),), optimize=(False, True), atol=0, rtol=0)


def test_as_strided_of_as_strided_and_of_split_pieces() -> None:
    def f(b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        inner = b.as_strided((4, 4), (5, 1), 6)  # a window of a 6x5 base
        first, second = b.split(3)  # split pieces: views of b with offsets 0 and 15
        return (
            inner.as_strided((2, 3), (1, 6), 7),
            second.as_strided((2, 2), (5, 2)),
            first.t().as_strided((3,), (7,)),
        )

    check_export(Fn(f), (torch.randn(6, 5),), optimize=(False, True), atol=0, rtol=0)


def test_as_strided_reads_past_the_view_inside_the_base() -> None:
    # torch checks bounds against the storage: reading past a view's end is fine while inside its base
    base = torch.randn(10)
    model = Fn(lambda b: b[2:6].as_strided((3,), (3,)))
    assert torch.equal(model(base), base[2:11:3])
    check_export(model, (base,), atol=0, rtol=0)
