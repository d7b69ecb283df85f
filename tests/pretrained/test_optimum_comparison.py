"""docs/coverage.md's comparison with optimum's ONNX exporter: the registrations read from optimum's source
(docs/data/optimum_onnx_tasks.json, by scripts/optimum_tasks.py) and the table scripts/optimum_comparison.py
renders from them."""

from __future__ import annotations

import importlib.util
import pathlib
import re
from types import ModuleType
from typing import Any

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


comparison = _script("optimum_comparison")
tasks_script = _script("optimum_tasks")
DATA: dict[str, Any] = comparison.load()


def _rows(lines: list[str]) -> dict[str, list[str]]:
    """label -> the other cells of each table row, a <details> cell read as its count."""
    rows = {}
    for line in lines:
        if line.startswith("| ") and not line.startswith("| task "):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            rows[cells[0]] = [
                re.sub(r"<details><summary>(\d+)</summary>.*</details>", r"\1", c) for c in cells[1:]
            ]
    return rows


def test_json_structure() -> None:
    assert DATA["source"] in ("huggingface/optimum-onnx", "huggingface/optimum")
    assert re.fullmatch(r"[0-9a-f]{40}", DATA["commit"])
    assert DATA["file"].endswith("model_configs.py")
    assert DATA["library"] == "transformers"
    tasks = DATA["tasks"]
    assert len(tasks) > 10
    for task, types in tasks.items():
        assert "-with-past" not in task and task != "default"  # normalized by optimum_tasks.py
        assert types and types == sorted(set(types)) and all(isinstance(t, str) for t in types)
    # pipeline parts of other libraries are kept apart, not counted as transformers model types
    assert "vae-encoder" not in {m for ms in tasks.values() for m in ms}


@pytest.mark.parametrize(
    ("model_type", "task"),
    [
        ("bert", "text-classification"),
        ("bert", "fill-mask"),
        ("bert", "multiple-choice"),  # COMMON_TEXT_TASKS, a starred constant
        ("gpt2", "text-generation"),  # text-generation-with-past, folded in
        ("gpt2", "token-classification"),
        ("llama", "text-classification"),
        ("t5", "text2text-generation"),
        ("bart", "question-answering"),  # a constant that stars another constant
        ("whisper", "automatic-speech-recognition"),
        ("wav2vec2", "audio-xvector"),
        ("clip", "zero-shot-image-classification"),
        ("detr", "object-detection"),
        ("vit", "masked-im"),
        ("vision-encoder-decoder", "image-to-text"),
    ],
)
def test_known_registrations(model_type: str, task: str) -> None:
    assert model_type in DATA["tasks"][task]


def test_known_absences() -> None:
    # optimum's own spellings are kept: transformers' "big_bird", not "big-bird"
    assert "big_bird" in DATA["tasks"]["fill-mask"]
    # t5 registers no classification head in optimum (feature-extraction and text2text-generation only)
    assert "t5" not in DATA["tasks"]["text-classification"]
    assert "gpt2" not in DATA["tasks"]["fill-mask"]


def test_render_small_case_by_hand() -> None:
    data = {
        "source": "huggingface/optimum-onnx",
        "commit": "0123456789abcdef0123456789abcdef01234567",
        "file": "optimum/exporters/onnx/model_configs.py",
        "tasks": {
            "text-generation": ["gpt2", "gpt_neo", "llama"],
            "fill-mask": ["bert", "big_bird"],
            "object-detection": ["detr"],
        },
    }
    verified = {
        "text-generation": ["gpt2", "gpt-neo", "qwen2"],  # gpt-neo: optimum's gpt_neo, "_" read as "-"
        "fill-mask": [],  # swept, none verified: 0, not "not swept"
        "image-classification": ["vit"],  # a task optimum does not register
    }
    lines = comparison.render(verified, ["text-generation", "fill-mask", "image-classification"], data=data)
    assert "huggingface/optimum-onnx" in lines[2] and "0123456789ab" in lines[2]
    assert "optimum/exporters/onnx/model_configs.py" in lines[2]
    rows = _rows(lines)
    #                      optimum, fastonnx, both, only optimum, only fastonnx
    assert rows["text-generation"] == ["3", "3", "2", "1", "1"]
    assert rows["fill-mask"] == ["2", "0", "0", "2", "0"]
    assert rows["image-classification"] == ["0", "1", "0", "0", "1"]
    assert rows["object-detection"] == ["1", "not swept", "not swept", "not swept", "not swept"]
    # any task: optimum {gpt2, gpt-neo, llama, bert, big-bird, detr}; fastonnx {gpt2, gpt-neo, qwen2, vit}
    assert rows["**any task** (distinct model types)"] == ["6", "4", "2", "4", "2"]
    # the swept tasks only: optimum's detr (object-detection, not swept) drops out
    assert rows["**any swept task** (distinct model types)"] == ["5", "4", "2", "3", "2"]
    tg = next(line for line in lines if line.startswith("| text-generation "))
    assert "<summary>1</summary>llama</details>" in tg and "<summary>1</summary>qwen2</details>" in tg
    assert list(rows)[:3] == ["text-generation", "fill-mask", "image-classification"]  # swept first


def test_render_counts_on_the_committed_json() -> None:
    verified = {
        "text-generation": ["gpt2", "llama", "qwen2", "not_in_optimum_lm"],
        "fill-mask": ["bert", "big-bird", "not-in-optimum-mlm"],
    }
    rows = _rows(comparison.render(verified, list(verified)))

    def norm(names: list[str]) -> set[str]:
        return {n.lower().replace("_", "-") for n in names}

    for task, ours in verified.items():
        theirs = norm(DATA["tasks"][task])
        mine = norm(ours)
        expected = [len(theirs), len(mine), len(theirs & mine), len(theirs - mine), len(mine - theirs)]
        assert rows[task] == [str(n) for n in expected]
    assert rows["text-generation"][2] == "3" and rows["fill-mask"][2] == "2"
    for task in set(DATA["tasks"]) - set(verified):
        served = comparison.SERVED_BY.get(task)
        assert rows[task if served is None else f"{task} (fastonnx: {served})"][1:] == ["not swept"] * 4
    theirs_all = norm([m for ms in DATA["tasks"].values() for m in ms])
    mine_all = norm([m for ms in verified.values() for m in ms])
    assert rows["**any task** (distinct model types)"][:3] == [
        str(len(theirs_all)),
        str(len(mine_all)),
        str(len(theirs_all & mine_all)),
    ]


SOURCE = """
register_tasks_manager_onnx = TasksManager.create_register("onnx")
BASE = ["feature-extraction", "fill-mask"]
GEN = [*BASE, "text-generation", "text-generation-with-past"]

@register_tasks_manager_onnx("bert", *BASE)
class A: ...

@register_tasks_manager_onnx("gpt_neo", *[*GEN, "text-classification"])
class B: ...

@register_tasks_manager_onnx("old", "default", "default-with-past", "causal-lm-with-past")
class C: ...

@register_tasks_manager_onnx("vae-encoder", *["semantic-segmentation"], library_name="diffusers")
class D: ...
"""


def test_parse_resolves_constants_and_normalizes_tasks() -> None:
    parsed = tasks_script.parse(SOURCE)
    assert parsed["transformers"] == {
        "feature-extraction": ["bert", "gpt_neo", "old"],
        "fill-mask": ["bert", "gpt_neo"],
        "text-classification": ["gpt_neo"],
        "text-generation": ["gpt_neo", "old"],
    }
    assert parsed["diffusers"] == {"semantic-segmentation": ["vae-encoder"]}


def test_parse_refuses_what_it_cannot_resolve() -> None:
    with pytest.raises(tasks_script.ParseError):
        tasks_script.parse('@register_tasks_manager_onnx("x", *tasks_for("x"))\nclass A: ...\n')


def test_image_to_text_is_compared_with_image_text_to_text() -> None:
    """optimum's image-to-text (transformers 4's Vision2Seq mapping) is what fastonnx's image-text-to-text
    exports in transformers 5: its row compares with that task's verified types, and counts as swept."""
    data = {
        "source": "huggingface/optimum-onnx",
        "commit": "0123456789abcdef0123456789abcdef01234567",
        "file": "optimum/exporters/onnx/model_configs.py",
        "tasks": {"image-to-text": ["pix2struct", "vision-encoder-decoder"]},
    }
    verified = {"image-text-to-text": ["vision-encoder-decoder", "llava"]}
    rows = _rows(comparison.render(verified, list(verified), data=data))
    assert rows["image-to-text (fastonnx: image-text-to-text)"] == ["2", "2", "1", "1", "1"]
    assert rows["**any swept task** (distinct model types)"][0] == "2"


def test_image_to_text_exports_as_image_text_to_text() -> None:
    from fastonnx.errors import InputError
    from fastonnx.pretrained.tasks import choose

    config = {"model_type": "vision-encoder-decoder", "architectures": ["VisionEncoderDecoderModel"]}
    task, cls = choose(config, "image-to-text")
    assert (task.name, cls) == ("image-text-to-text", "VisionEncoderDecoderModel")
    with pytest.raises(InputError, match="image-to-text"):  # the known names include the alias
        choose(config, "image-to-txt")
