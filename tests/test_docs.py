"""The documentation stays true to the code: docs/options.md is what to_onnx's docstring gives, the
docstring documents every parameter, every relative link of the README, docs/ and benches/README.md
resolves (its #anchor too), the fastonnx names they give exist, no issue numbers, and the README stays
short and opens with the two commands."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import pathlib
import re
from types import ModuleType

import pytest

import fastonnx

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# generated from measurements and sweeps: their text is their scripts'
LEDGERS = {ROOT / "docs" / "benchmarks.md", ROOT / "docs" / "coverage.md"}


def _options_doc() -> ModuleType:
    spec = importlib.util.spec_from_file_location("options_doc", ROOT / "scripts" / "options_doc.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _markdown_files() -> list[pathlib.Path]:
    return [README, ROOT / "benches" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _rel(path: pathlib.Path) -> str:
    return path.relative_to(ROOT).as_posix()


# ---- the options reference ------------------------------------------------------------------------
def test_options_md_is_what_the_docstring_gives():
    expected = _options_doc().render()
    actual = (ROOT / "docs" / "options.md").read_text(encoding="utf-8")
    assert actual == expected, "docs/options.md is stale: run python scripts/options_doc.py"


def test_every_parameter_of_to_onnx_is_documented():
    _, entries, _ = _options_doc().parse(fastonnx.to_onnx.__doc__ or "")
    params = list(inspect.signature(fastonnx.to_onnx).parameters)
    missing = [p for p in params if p not in entries]
    stale = [name for name in entries if name not in params]
    assert not missing, f"to_onnx's docstring (its Args: section) does not document {missing}"
    assert not stale, f"to_onnx's docstring documents {stale}, which to_onnx does not take"
    empty = [name for name, text in entries.items() if not text.strip()]
    assert not empty, f"empty entries in to_onnx's docstring: {empty}"


def test_options_doc_parses_sections_and_entries():
    doc = """Summary.

    Intro text.

    Args:
        a: First line
            continued.

            - a list
        b: Other.

    Returns:
        Something.
    """
    intro, entries, others = _options_doc().parse(doc)
    assert intro == "Summary.\n\nIntro text."
    assert entries == {"a": "First line\ncontinued.\n\n- a list", "b": "Other."}
    assert others == [("Returns", "Something.")]


# ---- links -----------------------------------------------------------------------------------------
_FENCE = re.compile(r"^(```|~~~)")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^()\s<>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def _prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks, inline code spans removed."""
    out: list[str] = []
    fence: str | None = None
    for line in text.splitlines():
        m = _FENCE.match(line.lstrip())
        if m:
            fence = None if fence == m.group(1) else (fence or m.group(1))
            continue
        if fence is None:
            out.append(re.sub(r"(`+)(?:(?!\1).)+?\1", "", line))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation removed, spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links and images: their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)  # keeps letters, digits, '_', '-' and spaces
    return text.replace(" ", "-")


def anchors(path: pathlib.Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    fence: str | None = None
    for line in path.read_text(encoding="utf-8").splitlines():
        m = _FENCE.match(line.lstrip())
        if m:
            fence = None if fence == m.group(1) else (fence or m.group(1))
            continue
        if fence is not None:
            continue
        h = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if h:
            base = slug(h.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
        found.update(re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", line))
    return found


def _links(path: pathlib.Path) -> list[str]:
    return [
        m.group(1) for line in _prose_lines(path.read_text(encoding="utf-8")) for m in _LINK.finditer(line)
    ]


def test_slugs_are_githubs():
    assert slug("Conversion speed: Llama ladder (benches/compare.py)") == (
        "conversion-speed-llama-ladder-benchescomparepy"
    )
    assert slug("`fastonnx.to_onnx` options") == "fastonnxto_onnx-options"
    assert (
        slug("In-place ops, mutated buffers, training mode") == "in-place-ops-mutated-buffers-training-mode"
    )


def test_relative_links_resolve():
    broken: list[str] = []
    checked = 0
    for path in _markdown_files():
        for link in _links(path):
            if _SCHEME.match(link) or link.startswith("//"):
                continue
            checked += 1
            target_part, _, anchor = link.partition("#")
            target = (path.parent / target_part).resolve() if target_part else path
            where = f"{_rel(path)}: ({link})"
            if not target.exists():
                broken.append(f"{where}: no file {target_part}")
            elif anchor and target.suffix == ".md" and anchor not in anchors(target):
                broken.append(f"{where}: no heading #{anchor} in {_rel(target)}")
    assert checked > 50, f"only {checked} relative links found: is the link pattern still right?"
    assert not broken, "broken links (a moved file or a renamed heading?):\n" + "\n".join(broken)


# ---- names -----------------------------------------------------------------------------------------
_NAME = re.compile(r"(?<![\w.])fastonnx(?:\.[A-Za-z_]\w*)+")


def _resolves(name: str) -> bool:
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


def test_fastonnx_names_in_the_docs_exist():
    missing: list[str] = []
    for path in _markdown_files():
        text = path.read_text(encoding="utf-8")
        for name in sorted(set(_NAME.findall(text))):
            name = re.sub(r"\.(md|onnx|py)$", "", name)  # file names such as fastonnx.report.md
            if not _resolves(name):
                missing.append(f"{_rel(path)}: {name}")
    assert not missing, "names the docs give that fastonnx does not have (moved or renamed?):\n" + "\n".join(
        missing
    )


# ---- wording and the README --------------------------------------------------------------------------
_ISSUE = re.compile(r"(?i)\bissues?\s*#?\d+|(?<![\w/#&])#\d+\b")


@pytest.mark.parametrize(
    "path",
    [p for p in _markdown_files() if p not in LEDGERS],
    ids=lambda p: _rel(p),
)
def test_no_issue_numbers(path):
    hits = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if _ISSUE.search(line)]
    assert not hits, f"{_rel(path)} refers to issue numbers; name the feature instead:\n" + "\n".join(hits)


def test_readme_is_short_and_opens_with_the_two_commands():
    text = README.read_text(encoding="utf-8")
    size = len(text.encode("utf-8"))
    assert size <= 12 * 1024, f"README.md is {size} bytes (at most 12 KiB): move the detail to docs/"
    headings = [line for line in _prose_lines(text) if line.startswith("## ")]
    assert headings[0] == "## Two commands", f"the README's first section is {headings[0]!r}"
    block = text.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    assert block[0].startswith("bash scripts/setup.sh") and block[1].startswith("bash scripts/test.sh"), block
