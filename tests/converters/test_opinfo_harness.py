"""The OpInfo harness itself: its samples captured as one graph speed the passing case only; a wrong
converter is still reported sample by sample, with its detail."""

from __future__ import annotations

import pytest
import torch

from fastonnx.converters import elementwise
from support.opinfo_harness import assert_op_converts, check_samples_together, op_db_by_name, samples


def test_samples_pass_together() -> None:
    op = op_db_by_name()["mul"]
    chosen = samples(op, torch.float32, 3)
    assert len(chosen) == 3
    assert check_samples_together("mul", op, chosen, (18,))


def test_a_wrong_converter_is_reported_per_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    # mul converted as add: wrong on every sample
    monkeypatch.setitem(elementwise.CONVERTERS, "aten.mul.Tensor", elementwise.CONVERTERS["aten.add.Tensor"])
    op = op_db_by_name()["mul"]
    assert not check_samples_together("mul", op, samples(op, torch.float32, 3), (18,))
    with pytest.raises(AssertionError, match=r"mul \(torch.float32\): sample 0 opset 18: wrong"):
        assert_op_converts("mul", (18,), limit=3)
