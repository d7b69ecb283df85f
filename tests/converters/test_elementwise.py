"""Elementwise converters against torch's OpInfo samples, at both ends of the opset range."""

from __future__ import annotations

import pytest

from export_check import ENDS
from opinfo_harness import assert_op_converts, ci_sample_limit

OPS = ["add", "sub", "mul"]


@pytest.mark.parametrize("op_name", OPS)
def test_float32(op_name: str) -> None:
    assert_op_converts(op_name, ENDS, limit=ci_sample_limit())
