"""The converter registry: one registration style, names that resolve, an index that is current."""

from __future__ import annotations

import ast
import builtins
import importlib
import operator
import pathlib
import subprocess
import sys

import pytest
import torch

import fastonnx
from fastonnx import registry
from fastonnx.converters._generated_index import COMPLEX_FAMILY, FAMILY_OF
from fastonnx.errors import InputError

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONVERTERS_DIR = ROOT / "python" / "fastonnx" / "converters"
# modules of the converters package that are not families
NOT_FAMILIES = {"__init__", "_generated_index"}


def _family_modules() -> list[str]:
    return sorted(p.stem for p in CONVERTERS_DIR.glob("*.py") if p.stem not in NOT_FAMILIES)


def test_every_module_is_a_listed_family() -> None:
    """A family left out of FAMILIES would be invisible to the registry: none is."""
    assert sorted(registry.FAMILIES) == _family_modules()


def _tables(tree: ast.Module) -> dict[str, ast.expr]:
    out = {}
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = node.value
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    out[t.id] = node.value
    return out


@pytest.mark.parametrize("family", registry.FAMILIES)
def test_one_registration_style(family: str) -> None:
    """Each family registers its converters in ONE literal dict with string keys, assigned once and
    never changed, so that grep finds every op's line."""
    source = (CONVERTERS_DIR / f"{family}.py").read_text()
    tree = ast.parse(source)
    tables = _tables(tree)
    for name in ("CONVERTERS", "COMPLEX_CONVERTERS"):
        if name not in tables:
            assert name != "CONVERTERS", f"{family} has no CONVERTERS table"
            continue
        table = tables[name]
        assert isinstance(table, ast.Dict), f"{family}.{name} is not a literal dict"
        for key in table.keys:
            assert isinstance(key, ast.Constant) and isinstance(key.value, str), (
                f"{family}.{name} has a key that is not a string literal: {ast.unparse(key) if key else '**'}"
            )
            assert f'"{key.value}":' in source.splitlines()[key.lineno - 1], key.value
    for node in ast.walk(tree):
        # no CONVERTERS[...] = ..., CONVERTERS.update(...) after the literal
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
            assert getattr(node.value, "id", None) not in ("CONVERTERS", "COMPLEX_CONVERTERS")
        if isinstance(node, ast.Attribute) and getattr(node.value, "id", None) in (
            "CONVERTERS",
            "COMPLEX_CONVERTERS",
        ):
            assert node.attr not in ("update", "setdefault", "pop"), f"{family} changes its table"


@pytest.mark.parametrize("family", registry.FAMILIES)
def test_families_import_only_the_library(family: str) -> None:
    """Families share code through fastonnx.converters.lib, the context and dtypes, never through
    each other: no family imports another."""
    tree = ast.parse((CONVERTERS_DIR / f"{family}.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "fastonnx.converters":
                names = {a.name for a in node.names}
                assert not names & set(registry.FAMILIES), f"{family} imports families {names}"
            elif node.module.startswith("fastonnx.converters."):
                other = node.module.split(".")[2]
                assert other not in registry.FAMILIES, f"{family} imports family {other}"


def test_index_is_current() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "converter_index.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr


def test_every_key_names_a_real_op() -> None:
    """Every registered name resolves to a real overload of this torch (libraries imported first,
    so that their namespaces are checked too)."""
    import torch.nn.modules.linear_cross_entropy  # defines torch_nn ops
    import torch.onnx.ops  # defines the onnx and onnx_symbolic ops (torch.onnx.ops)
    import torchao  # noqa: F401  (defines the quantized_decomposed ops)
    import torchvision  # noqa: F401
    import transformers.integrations.moe  # noqa: F401

    for key in [*FAMILY_OF, *COMPLEX_FAMILY]:
        if key.startswith(("higher_order.", "operator.", "math.", "torch.")):
            assert not registry.unknown_keys([key]), key
            continue
        if key.startswith("builtins."):  # round() on a SymFloat
            assert callable(getattr(builtins, key.split(".", 1)[1], None)), key
            continue
        ns, name, overload = key.split(".")
        op = getattr(getattr(getattr(torch.ops, ns), name), overload)
        assert isinstance(op, torch._ops.OpOverload) and str(op) == key


def test_a_misspelled_name_is_refused() -> None:
    assert registry.unknown_keys(["aten.add.Tensor", "aten.relu.default"]) == []
    assert registry.unknown_keys(["aten.add.Tensr", "aten.rellu.default", "operator.plus"]) == [
        "aten.add.Tensr",
        "aten.rellu.default",
        "operator.plus",
    ]


def test_keys_of_targets() -> None:
    assert registry.op_key(torch.ops.aten.add.Tensor) == "aten.add.Tensor"
    assert registry.op_key(torch.ops.aten.relu.default) == "aten.relu.default"
    assert registry.op_key(operator.add) == "operator.add"
    assert registry.op_key(torch.sym_max) == "torch.sym_max"
    assert registry.op_key(torch.ops.higher_order.cond) == "higher_order.cond"


def test_in_place_overloads_are_served_by_their_functional_twin() -> None:
    reg = registry.Registry()
    entry = reg.lookup(torch.ops.aten.add_.Tensor)
    assert entry is not None and entry.in_place and entry.key == "aten.add.Tensor"
    plain = reg.lookup(torch.ops.aten.add.Tensor)
    assert plain is not None and not plain.in_place and plain.convert is entry.convert
    # dunder ops are not in-place forms of anything
    assert registry.functional_key("aten.__and__.Tensor") is None
    assert registry.functional_key("aten.__iand__.Tensor") is None


def test_complex_forms_are_registry_properties() -> None:
    reg = registry.Registry()
    add = reg.lookup(torch.ops.aten.add.Tensor)
    sin = reg.lookup(torch.ops.aten.sin.default)
    fft = reg.lookup(torch.ops.aten.fft_fft.default)
    assert add and sin and fft
    assert reg.complex_converter(add) not in (None, add.convert)  # complex_ops' own form
    assert reg.complex_converter(sin) is None  # refused on complex values
    assert reg.complex_converter(fft) is fft.convert  # complex_ops' own op


def test_custom_converters_sit_on_top() -> None:
    def mine(ctx, x):
        return ctx.op("Neg", x)

    reg = registry.Registry({torch.ops.aten.relu.default: mine})
    entry = reg.lookup(torch.ops.aten.relu.default)
    assert entry is not None and entry.custom and entry.convert is mine
    with pytest.raises(InputError, match="names an op but not an overload"):
        registry.Registry({torch.ops.aten.relu: mine})
    model = torch.nn.ReLU()
    x = torch.randn(3, 4)
    result = fastonnx.to_onnx(model, (x,), custom_converters={torch.ops.aten.relu.default: mine})
    torch.testing.assert_close(result(x), -x)
    assert result.stats["custom_converters_used"] == ["aten.relu.default"]


def test_an_op_without_converter_has_no_entry() -> None:
    assert registry.Registry().lookup("aten.hypothetical.default") is None


def test_families_are_imported_on_first_use() -> None:
    """A fresh process converting an MLP imports only the families its graph uses."""
    code = (
        "import sys, torch, fastonnx\n"
        "m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())\n"
        "fastonnx.to_onnx(m, (torch.randn(2, 4),))\n"
        "print(sorted(k.split('.')[-1] for k in sys.modules if k.startswith('fastonnx.converters.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(ast.literal_eval(out.stdout.strip().splitlines()[-1]))
    assert "_generated_index" in loaded
    assert not loaded & {
        "linalg_lu",
        "linalg_cholesky",
        "linalg_ldl",
        "linalg_products",
        "linalg_spectral",
        "gamma_functions",
        "error_functions",
        "bessel_functions",
        "orthogonal_polynomials",
        "float_structure",
        "losses",
        "complex_numbers",
        "statistics",
    }


def test_importing_fastonnx_imports_no_family() -> None:
    code = "import sys, fastonnx; print([k for k in sys.modules if k.startswith('fastonnx.converters.')])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_families_importable_alone() -> None:
    for family in registry.FAMILIES:
        importlib.import_module(f"fastonnx.converters.{family}")
