"""Converter families: one module per family of ops, each ending with one literal ``CONVERTERS`` dict
from op names to converters. ``fastonnx.registry`` finds them; the rules are in its docstring."""
