"""No capture setting turns a tensor of the user's arguments into a constant: every tensor the forward
reads from its arguments is a graph input (the file computes with what the caller passes later) or the
export fails with an error naming the input. The trace takes the pytree leaves torch.export takes and
refuses the rest; a constant of either capture that is memory of the arguments is an error."""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import pytest
import torch
import torch.utils._pytree as pytree
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import fastonnx
from fastonnx.capture.input_tensors import CONSTANT_LEAF_TYPES
from fastonnx.errors import CaptureError

CAPTURES = ("auto", "trace", "export")
SHAPE = (2, 3)


class Holder:
    """A user's class torch's pytree knows nothing of."""

    def __init__(self, t: Any) -> None:
        self.t = t


@dataclasses.dataclass
class LooseData:
    """A dataclass nobody registered: torch.export refuses it as an input."""

    t: Any


@dataclasses.dataclass
class Registered:
    """A dataclass registered with torch.export: its fields are pytree children."""

    t: Any
    u: Any


torch.export.register_dataclass(Registered, serialized_type_name="tests.test_input_tensors.Registered")


class Constant:
    """A class registered as a pytree constant: torch.export bakes it, tensors and all."""

    def __init__(self, t: Any) -> None:
        self.t = t

    # equal by content, tensors by place only (as a config object would be): a fresh one of the same
    # layout is the same input structure
    def __eq__(self, other: object) -> bool:
        return isinstance(other, Constant) and _layout(self.t) == _layout(other.t)

    def __hash__(self) -> int:
        return hash(_layout(self.t))


def _layout(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return "tensor"
    if isinstance(value, (list, tuple)):
        return tuple(_layout(v) for v in value)
    return value


pytree.register_constant(Constant)


class Pair(NamedTuple):
    a: Any
    b: Any


def _tensors(value: Any) -> list[torch.Tensor]:
    """Every tensor held by ``value``, walked as the forward below reads it: containers in order,
    objects by their attributes."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for k in sorted(value) for t in _tensors(value[k])]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    if hasattr(value, "__dict__"):
        return [t for k in sorted(vars(value)) for t in _tensors(vars(value)[k])]
    return []


class ReadsEverything(torch.nn.Module):
    """x plus every tensor of ``h``, each scaled by its place (a swapped pair of inputs shows)."""

    def forward(self, x: torch.Tensor, h: Any) -> torch.Tensor:
        out = x
        for i, t in enumerate(_tensors(h)):
            out = out + t * float(i + 2)
        return out


def _randn(seed: int) -> torch.Tensor:
    return torch.randn(SHAPE, generator=torch.Generator().manual_seed(seed))


def _export(model: torch.nn.Module, args: tuple[Any, ...], capture: str) -> Any:
    return fastonnx.to_onnx(model, args, capture=capture)


@pytest.mark.parametrize("capture", CAPTURES)
def test_an_unregistered_holder_is_torch_exports_error_under_every_capture(
    capture: str, caplog: pytest.LogCaptureFixture
) -> None:
    class AddHeld(torch.nn.Module):
        def forward(self, x: torch.Tensor, h: Holder) -> torch.Tensor:
            return x + h.t

    with (
        caplog.at_level(logging.INFO, logger="fastonnx"),
        pytest.raises(CaptureError, match="Unsupported input type"),
    ):
        _export(AddHeld(), (_randn(0), Holder(torch.ones(SHAPE))), capture)
    if capture != "export":
        # the trace said why it gave the model to torch.export
        assert any("input 'h' is a Holder" in r.message for r in caplog.records)


@pytest.mark.parametrize("capture", CAPTURES)
@pytest.mark.parametrize(
    "holder", [LooseData, Constant], ids=["unregistered_dataclass", "registered_constant"]
)
def test_other_holders_are_refused(capture: str, holder: Callable[[Any], Any]) -> None:
    with pytest.raises(CaptureError, match=r"Unsupported input type|input 'h\.t' a constant"):
        _export(ReadsEverything(), (_randn(0), holder(_randn(1))), capture)


@pytest.mark.parametrize("capture", CAPTURES)
def test_registered_dataclasses_and_named_tuples_are_inputs(capture: str) -> None:
    def build(seed: int) -> Any:
        return {
            "r": Registered(_randn(seed), [_randn(seed + 1)]),
            "p": Pair(_randn(seed + 2), (_randn(seed + 3),)),
        }

    result = _export(ReadsEverything(), (_randn(0), build(1)), capture)
    assert len(result.input_names) == 5
    assert result.stats["capture"] == ("export" if capture == "export" else "trace")
    x, h = _randn(10), build(11)
    torch.testing.assert_close(result(x, h), ReadsEverything()(x, h))


def test_a_global_tensor_is_a_constant_as_torch_export_makes_it() -> None:
    # not an input: torch.export lifts a tensor read from a global or closure as a constant, silently;
    # the trace records the same program
    table = _randn(5)

    class AddGlobal(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + table

    for capture in CAPTURES:
        result = _export(AddGlobal(), (_randn(0),), capture)
        assert result.input_names == ["x"]
        torch.testing.assert_close(result(_randn(1)), _randn(1) + table)


def test_the_traces_constant_leaves_are_torch_exports() -> None:
    # torch.export bakes exactly these leaf types into the program (ints: into a trace's fixed shapes)
    from torch._export.non_strict_utils import _is_constant_argument

    for value in (None, True, 1.5, "s"):
        assert _is_constant_argument(value) and type(value) in CONSTANT_LEAF_TYPES
    for value in (torch.float32, torch.device("cpu"), Holder(None), 1j):
        assert not _is_constant_argument(value) and type(value) not in CONSTANT_LEAF_TYPES


# ---- the property: any nesting of containers and classes -------------------------------------------
_KINDS = ("list", "tuple", "dict", "pair", "registered", "holder", "loose", "constant")
_REFUSED = {"holder", "loose", "constant"}


def _structures() -> Any:
    """A recipe for a nested argument: ("tensor",), ("int",), or (kind, children)."""
    leaf = st.sampled_from([("tensor",), ("tensor",), ("int",)])
    return st.recursive(
        leaf,
        lambda children: st.tuples(st.sampled_from(_KINDS), st.lists(children, min_size=2, max_size=3)),
        max_leaves=6,
    )


def _build(recipe: Any, seeds: list[int]) -> Any:
    """The argument a recipe describes, with fresh tensors drawn from ``seeds``."""
    if recipe[0] == "tensor":
        seeds[0] += 1
        return _randn(seeds[0])
    if recipe[0] == "int":
        return 3
    kind, parts = recipe
    items = [_build(p, seeds) for p in parts]
    if kind == "list":
        return items
    if kind == "tuple":
        return tuple(items)
    if kind == "dict":
        return {f"k{i}": v for i, v in enumerate(items)}
    if kind == "pair":
        return Pair(items[0], items[1:])
    if kind == "registered":
        return Registered(items[0], items[1:])
    return {"holder": Holder, "loose": LooseData, "constant": Constant}[kind](items)


def _kinds(recipe: Any) -> set[str]:
    return set() if len(recipe) == 1 else {recipe[0]} | {k for p in recipe[1] for k in _kinds(p)}


def _reads_a_tensor_through(recipe: Any, refused: set[str]) -> bool:
    """Whether a tensor sits below a node of a refused kind."""
    if len(recipe) == 1:
        return False
    if recipe[0] in refused:
        return "tensor" in str(recipe[1])
    return any(_reads_a_tensor_through(p, refused) for p in recipe[1])


@pytest.mark.parametrize("capture", CAPTURES)
@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(recipe=_structures())
# a registered constant without tensors is part of the input structure, compared by its __eq__
@example(recipe=("constant", [("int",), ("int",)]))
@example(recipe=("list", [("tensor",), ("constant", [("int",), ("int",)])]))
def test_every_tensor_read_from_the_arguments_is_an_input_or_an_error(capture: str, recipe: Any) -> None:
    model = ReadsEverything()
    example = _build(recipe, [0])
    try:
        result = _export(model, (_randn(0), example), capture)
    except CaptureError as e:
        # a refusal names the input; only an argument holding a class pytree does not flatten into
        # leaves may be refused (an unregistered class, even without tensors, as torch.export does)
        assert _kinds(recipe) & _REFUSED, f"refused a registered structure: {e}"
        assert "Unsupported input type" in str(e) or "a constant of the program" in str(e)
        return
    # exported: no tensor sat inside a refused kind, and every tensor it reads is an input
    assert not _reads_a_tensor_through(recipe, _REFUSED)
    other = _build(recipe, [100])
    assert len(_tensors(other)) == len([i for i in result.input_names if i != "x"])
    x = _randn(99)
    expected = model(x, other)
    torch.testing.assert_close(result(x, other), expected)
    if _tensors(other):  # the new values changed the result: the comparison above could fail
        assert not math.isclose(float(expected.sum()), float(model(x, example).sum()))
