"""Nodes that check what torch.export assumed (sizes, ranges, metadata): ONNX has nothing to check
them with at run time, so they convert to nothing. They never read values, so they hold for complex
operands too."""

from __future__ import annotations

from typing import Any

from fastonnx.context import ConversionContext, Converter

# every converter of this family leaves its operands alone, whatever their layout
COMPLEX_NATIVE = True


def convert_dropped(ctx: ConversionContext, *args: Any, **kwargs: Any) -> None:
    return None


CONVERTERS: dict[str, Converter] = {
    "aten._assert_tensor_metadata.default": convert_dropped,
    "aten._assert_scalar.default": convert_dropped,
    "aten.sym_constrain_range_for_size.default": convert_dropped,
    "aten.sym_constrain_range.default": convert_dropped,
    "aten._assert_async.msg": convert_dropped,
    "aten._assert_async.default": convert_dropped,
    "aten._functional_assert_async.msg": convert_dropped,
    "aten._functional_sym_constrain_range_for_size.default": convert_dropped,
    "aten._functional_sym_constrain_range.default": convert_dropped,
}
