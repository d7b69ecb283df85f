"""``export_pretrained``: a checkpoint folder in, a package a runtime loads out.

Steps: read the folder (folder.py), pick the task and class (tasks.py), build the model from its config
with parameters on meta and buffers real (meta_init.py), export the task's graph (task_inputs.py) with
the weights referenced in place from the folder's safetensors, copy the tokenizer and generation files,
write ``genai_config.json`` for text generation, Whisper (genai_config.py) and the vision-language types
genai runs (genai_vision.py), then verify the package against
transformers where the weights fit in memory (package_check.py). Everything is written into a temporary folder
beside ``outdir`` and renamed at the end: a failed export leaves nothing.
"""

from __future__ import annotations

import logging
import os
import pathlib
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any

import torch

from fastonnx.capture.dynamic_dims import map_dims
from fastonnx.errors import CaptureError, InputError, RuntimeCheckError
from fastonnx.pipeline.options import ExportOptions
from fastonnx.pretrained import (
    audio_code_loops,
    bark_stages,
    csm_stages,
    frame_paired_speech,
    higgs_audio_stages,
    melody_code_loops,
    omni3_speech_stages,
    omni_speech_stages,
    phonon_latent_loops,
    pocket_tts_stages,
    seamless_stages,
    shared_cache,
    spectrogram_loops,
    streamed_audio_steps,
    targets,
    vibevoice_stages,
)
from fastonnx.pretrained import folder as folder_mod
from fastonnx.pretrained.converted_weights import CONVERTED_FILE, write_converted
from fastonnx.pretrained.encoder_tasks import AUDIO, CLASS_SEQUENCE, FEATURES
from fastonnx.pretrained.genai_config import context_length, write_genai_config, write_whisper_genai_config
from fastonnx.pretrained.genai_vision import write_vision_genai_config
from fastonnx.pretrained.graph_spec import PAST, SEQUENCE, TOTAL, GraphSpec
from fastonnx.pretrained.image_encoder_decoders import image_encoder_decoder, image_kind
from fastonnx.pretrained.meta_init import (
    buffers_on_meta,
    build_on_meta,
    missing_parameters,
    stored_control_buffers,
)
from fastonnx.pretrained.shipped_bytes import all_initializers, is_linked, ship
from fastonnx.pretrained.task_inputs import graph_specs, seq2seq_sides
from fastonnx.pretrained.tasks import choose

log = logging.getLogger("fastonnx")

MODEL_FILE = "model.onnx"
REPORT_FILE = "fastonnx_report.md"
# what the checkpoint lacks: parameters (initialized as from_pretrained does) and the buffers the model's
# code computes (rotary frequencies, masks), which the meta-device model holds no values of
MISSING_FILE = "fastonnx_missing.safetensors"


@dataclass
class PretrainedExport:
    """What ``export_pretrained`` wrote."""

    outdir: pathlib.Path
    task: str
    architecture: str
    files: list[str]
    input_names: list[str]  # of the first model file
    output_names: list[str]
    verified: bool | None  # None: verification skipped (asked, or the weights do not fit in memory)
    verify_note: str = ""
    stats: dict[str, Any] = field(default_factory=dict)  # to_onnx's stats per file
    graphs: dict[str, tuple[list[str], list[str]]] = field(default_factory=dict)  # file: (inputs, outputs)
    main_file: str = MODEL_FILE

    @property
    def model_path(self) -> pathlib.Path:
        """The package's (first) model file: model.onnx, or encoder_model.onnx for text2text."""
        return self.outdir / self.main_file

    @property
    def report_path(self) -> pathlib.Path:
        return self.outdir / REPORT_FILE


def _prepare_outdir(outdir: pathlib.Path, overwrite: bool) -> None:
    if outdir.exists():
        if not outdir.is_dir():
            raise InputError(f"{outdir} exists and is not a folder")
        if any(outdir.iterdir()) and not overwrite:
            raise InputError(
                f"{outdir} exists and is not empty: remove it, or pass overwrite=True (--overwrite)"
            )
    if not outdir.parent.is_dir():
        raise InputError(f"the parent folder of {outdir} does not exist")


def load_config(path: pathlib.Path) -> Any:
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(path)
    except (ValueError, KeyError, OSError) as e:
        raise InputError(f"transformers cannot read {path / 'config.json'}: {e}") from e


def build_model(class_name: str, config: Any) -> Any:
    import torch
    import transformers

    cls = getattr(transformers, class_name, None)
    if cls is None:
        raise InputError(f"transformers {transformers.__version__} has no class {class_name}")
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)  # an fp32 graph; weights stored otherwise are cast as read
    try:
        model = build_on_meta(lambda: cls._from_config(config, dtype=torch.float32))
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


@dataclass
class _PackageWeights:
    """Where a package's weights come from: the checkpoint's shards, the tensors transformers converts as
    it loads them (converted_weights.py: stacked experts...), and the parameters and buffers the
    checkpoint lacks."""

    tmp: pathlib.Path
    shards: list[pathlib.Path]
    converted: list[str]
    missing: dict[str, Any]
    computed: dict[str, Any]

    def files(self, module: Any, model: Any) -> list[str]:
        """What the export's ``weights=`` reads: the shards as they are, unless the package needs files
        of its own beside them (``weights=`` reads shards from one folder): then the shards are
        hard-linked into the package folder, next to ``CONVERTED_FILE`` and ``MISSING_FILE`` (its keys
        under the exported ``module``'s path to ``model``)."""
        if not (self.missing or self.computed or self.converted):
            return [os.fspath(p) for p in self.shards]
        from safetensors.torch import save_file

        linked = []
        for shard in self.shards:
            try:
                os.link(shard, self.tmp / shard.name)
            except OSError as e:
                raise InputError(
                    f"cannot hard-link {shard} into {self.tmp} (another filesystem?): {e}"
                ) from e
            linked.append(os.fspath(self.tmp / shard.name))
        if self.converted:
            linked.append(os.fspath(self.tmp / CONVERTED_FILE))
        if self.missing or self.computed:
            prefix = next(f"{n}." for n, m in module.named_modules() if m is model)
            lacking = {prefix + k: v for k, v in {**self.missing, **self.computed}.items()}
            save_file(lacking, os.fspath(self.tmp / MISSING_FILE))
            linked.append(os.fspath(self.tmp / MISSING_FILE))
        return linked


def _package_weights(tmp: pathlib.Path, shards: list[pathlib.Path], built: Any) -> _PackageWeights:
    """The converted tensors written into ``tmp``, the parameters the checkpoint still lacks (given the
    model's own initial values) and the buffers computed beside it (moved to the meta device)."""
    paths = [os.fspath(p) for p in shards]
    converted = write_converted(built, paths, tmp / CONVERTED_FILE)
    if converted:
        log.info("%d tensors converted as transformers loads them, into %s", len(converted), CONVERTED_FILE)
        paths.append(os.fspath(tmp / CONVERTED_FILE))
    missing = missing_parameters(built, paths)
    computed = buffers_on_meta(built, paths)
    stored_control_buffers(built, paths, computed)
    return _PackageWeights(tmp, shards, converted, missing, computed)


SPEECH_TO_TEXT = ("automatic-speech-recognition", "text2text-generation")
"""The tasks whose mappings list the speech models that write text (text2text-generation's seq2seq
mapping lists the audio-LLMs and Voxtral Realtime too)."""


def _graph_specs(task: str, built: Any, config: Any, class_name: str) -> dict[str, Any]:
    """The task's graphs (task_inputs.py); a config without the sizes the task reads is an InputError."""
    try:
        if task == "image-text-to-text" and image_kind(built) is not None:
            # BLIP, Pix2Struct, Florence-2...: an encoder over the image (image_encoder_decoders.py)
            return image_encoder_decoder(built)
        if task == "automatic-speech-recognition" and frame_paired_speech.own_layout(built):
            return frame_paired_speech.paired_graphs(built, config)  # Kyutai's: a token a frame's codes
        if task in SPEECH_TO_TEXT and streamed_audio_steps.own_layout(built):
            # Voxtral Realtime's two streams; the seq2seq mapping lists it too, as the audio-LLMs
            return streamed_audio_steps.streamed_graphs(built, config)
        if task == "text-to-audio" and spectrogram_loops.own_layout(built):
            return spectrogram_loops.loop_graphs(built, config)  # SpeechT5's frame loop: three files
        if task == "text-to-audio" and audio_code_loops.own_layout(built):
            return audio_code_loops.loop_graphs(built, config)  # MusicGen's codebook loop: three files
        if task == "text-to-audio" and melody_code_loops.own_layout(built):
            return melody_code_loops.loop_graphs(built, config)  # MusicGen Melody's: four files
        if task == "text-to-audio" and bark_stages.own_layout(built):
            return bark_stages.stage_graphs(built, config)  # Bark's stages: four files
        if task == "text-to-audio" and csm_stages.own_layout(built):
            return csm_stages.stage_graphs(built, config)  # CSM's backbone, depth decoder, Mimi: three
        if task == "text-to-audio" and pocket_tts_stages.own_layout(built):
            return pocket_tts_stages.stage_graphs(built, config)  # Pocket TTS's step and flow head
        if task == "text-to-audio" and higgs_audio_stages.own_layout(built):
            return higgs_audio_stages.stage_graphs(built, config)  # Higgs Audio V2's: two files
        if task == "text-to-audio" and seamless_stages.own_layout(built):
            return seamless_stages.stage_graphs(built, config)  # SeamlessM4T's stages: four or five files
        if task == "text-to-audio" and phonon_latent_loops.own_layout(built):
            return phonon_latent_loops.loop_graphs(built, config)  # Gradium Phonon's: three files
        if task == "text-to-audio" and vibevoice_stages.own_layout(built):
            return vibevoice_stages.stage_graphs(built, config)  # VibeVoice's stages: seven files
        if task == "text-to-audio" and omni3_speech_stages.own_layout(built):
            return omni3_speech_stages.stage_graphs(built, config)  # Qwen3-Omni-MoE's stages: four files
        if task == "text-to-audio" and omni_speech_stages.own_layout(built):
            return omni_speech_stages.stage_graphs(built, config)  # Qwen2.5-Omni's stages: four files
        return graph_specs(task, built, config)
    except AttributeError as e:
        if getattr(e, "obj", None) is not config:
            raise
        # a composite (multimodal) config keeps the text model's sizes in a sub-config
        raise InputError(
            f"{class_name}: its config ({type(config).__name__}) has no {e.name!r}, which the {task} "
            "task reads; composite configs (sizes in a text_config / vision_config) are not exported yet"
        ) from e


def _drop_unused(tmp: pathlib.Path, files: list[str]) -> None:
    """Removes the package's own weight files (missing parameters and buffers, converted tensors) and
    the checkpoint shards linked into it when no graph reads any of them (a half package's shard whose
    tensors were all converted into its own file)."""
    import onnx

    used: set[str] = set()
    for name in files:
        proto = onnx.load(os.fspath(tmp / name), load_external_data=False)
        used |= {
            e.value for t in all_initializers(proto.graph) for e in t.external_data if e.key == "location"
        }
    linked = [p.name for p in tmp.iterdir() if p.suffix == ".safetensors" and is_linked(p)]
    for own in (MISSING_FILE, CONVERTED_FILE, *linked):
        if own not in used and (tmp / own).exists():
            (tmp / own).unlink()


POSITION_LIMITS = (
    "max_position_embeddings",
    "n_positions",
    "n_ctx",
    "max_target_positions",
    "max_source_positions",
    "max_seq_len",  # MPT's: its ALiBi table has that many columns
    "max_text_positions",  # SpeechT5's decoder
    "max_text_len",  # Grounding DINO's: it truncates longer prompts (another program)
)
"""Config keys that declare how many positions a model's position embeddings hold."""


def declared_positions(config: Any, sides: bool = False) -> list[int]:
    """The position counts ``config`` declares (``POSITION_LIMITS``), its text config's too (a composite's:
    CLIP's, SigLIP's) and, with ``sides``, its encoder's and decoder's (EncoderDecoderModel's, T5Gemma's)."""
    configs = [config, *(c for c in (getattr(config, "text_config", None),) if c is not None)]
    if sides:
        configs += seq2seq_sides(config) or ()
    return [int(v) for c in configs for k in POSITION_LIMITS if isinstance(v := getattr(c, k, None), int)]


def learned_position_tables(module: torch.nn.Module) -> set[int]:
    """The sizes of ``module``'s learned position tables (an ``nn.Embedding`` named for positions,
    indexed by the position itself: BigBird-Pegasus' ``embed_positions``)."""
    return {
        m.num_embeddings
        for name, m in module.named_modules()
        if isinstance(m, torch.nn.Embedding) and "position" in name.rsplit(".", 1)[-1]
    }


def within_positions(
    narrowed: list[Any], config: Any, dynamic_shapes: Any, module: torch.nn.Module | None = None
) -> Any:
    """``dynamic_shapes`` with the lengths bounded where a capture refused them (``narrowed``, a
    ``CaptureError``'s) for a bound the model declares itself (its position embeddings: BERT's 512,
    RoBERTa's 514 less its padding offset), or None when it refused anything else. A package keeps the
    bound (its files' metadata, the report)."""
    declared = declared_positions(config, sides=True)
    if not narrowed or not declared:
        return None
    tops: dict[str, int] = {}
    tables = learned_position_tables(module) & set(declared) if module is not None else set()
    for n in narrowed:
        top = max(n.admitted, default=0)
        if top > max(declared) and tables:
            # refused only beyond a learned table of positions (BigBird-Pegasus' branch at 704 tokens):
            # the model itself cannot run past the table, so it bounds the length exactly
            top = max(tables)
        if (
            not n.admitted
            or top > max(declared)
            or min(n.refused) <= top
            or n.name in tops
            and tops[n.name] != top
        ):
            return None  # refused below the bound, or a bound the config does not declare
        tops[n.name] = top

    def bound(d: Any) -> Any:
        name = getattr(d, "__name__", None)
        return torch.export.Dim(name, min=getattr(d, "min", 0), max=tops[name]) if name in tops else d

    log.info("the model's position embeddings bound %s", ", ".join(f"{k} to {v}" for k, v in tops.items()))
    return map_dims(dynamic_shapes, bound)


def table_bounded(spec: GraphSpec, config: Any) -> Any:
    """``spec.dynamic_shapes`` with its token lengths (``sequence_length``) bounded up front by the model's
    position table, or None where no table bounds them so.

    BERT's embeddings (DistilBERT's, ELECTRA's...) hold a ``position_ids`` buffer, ``arange`` over a
    learned table of positions as many as the config declares, and slice it to the tokens: past the
    table the slice is short. The capture finds that bound after the fact (``within_positions``, from
    the slice's guard), at the price of three refused or narrowed captures first; asking for it at once
    captures once, the same bound. Only that layout is bounded here: a table indexed otherwise (from a
    padding id up, RoBERTa's; clamped, TAPAS' cells; another table, LUKE's entities) is left to the
    capture's guards."""
    declared = set(declared_positions(config))
    bounds = set()
    for module in spec.module.modules():
        ids = getattr(module, "position_ids", None)
        if not isinstance(ids, torch.Tensor) or ids.dtype != torch.long or ids.dim() == 0:
            continue
        rows = int(ids.shape[-1])
        tables = [
            m
            for name, m in module.named_children()
            if isinstance(m, torch.nn.Embedding) and "position" in name and m.padding_idx is None
        ]
        if rows in declared and any(m.num_embeddings == rows for m in tables):
            bounds.add(rows)
    if len(bounds) != 1:  # none, or two sizes: which bounds the tokens is the capture's to find
        return None
    (top,) = bounds
    every = _dims(spec.dynamic_shapes)
    names = [getattr(d, "__name__", None) for d in every]
    if PAST in names or TOTAL in names:  # a decoder step: the table bounds the whole, not the new tokens
        return None
    # OmDet-Turbo's class names go through the same text tower as its task prompt
    texts = (SEQUENCE, CLASS_SEQUENCE)
    dims = [d for d, name in zip(every, names, strict=True) if name in texts]
    if not dims or any(getattr(d, "max", 0) <= top for d in dims):
        return None

    def bound(d: Any) -> Any:
        name = getattr(d, "__name__", None)
        if name not in texts:
            return d
        return torch.export.Dim(name, min=getattr(d, "min", 0), max=top)

    bounded = sorted(n for n in set(names) & set(texts) if n is not None)
    log.info("the model's position table bounds %s to %d", " and ".join(bounded), top)
    return map_dims(spec.dynamic_shapes, bound)


def _dims(dynamic_shapes: Any) -> list[Any]:
    found: list[Any] = []

    def keep(d: Any) -> Any:
        found.append(d)
        return d

    map_dims(dynamic_shapes, keep)
    return found


def within_declared(
    error: CaptureError, config: Any, dynamic_shapes: Any, module: torch.nn.Module | None = None
) -> Any:
    """``dynamic_shapes`` bounded where ``error`` refused sizes only at bounds the model declares: its
    audio lengths' by ``within_frames``, its other lengths' by ``within_positions`` (Speech2Text's base
    model refuses both at once: its frames past its source table, its decoder tokens past its target
    table); None when either refuses its part."""
    narrowed = getattr(error, "narrowed", None) or []
    audio = [n for n in narrowed if n.name in (AUDIO, FEATURES)]
    others = [n for n in narrowed if n.name not in (AUDIO, FEATURES)]
    shapes = dynamic_shapes if narrowed else None
    if shapes is not None and audio:
        shapes = within_frames(audio, config, shapes)
    if shapes is not None and others:
        shapes = within_positions(others, config, shapes, module)
    return shapes


def within_frames(narrowed: list[Any], config: Any, dynamic_shapes: Any) -> Any:
    """``dynamic_shapes`` with an audio length bounded where a capture refused only the sizes below some
    length (a speech encoder's subsampling convolutions need that many frames: Parakeet's 9) and, for a
    model declaring ``max_source_positions`` or ``max_position_embeddings`` (its position table), the sizes
    above the ones proven right (Speech2Text: 5 to 16385 frames; FunASR-Nano's encoder: 2 to 127); None
    when it refused anything else. The file refuses other lengths at run time."""
    if not narrowed:
        return None
    # a table of the frames' positions: Speech2Text's max_source_positions, FunASR-Nano's encoder's
    # max_position_embeddings (its sinusoidal table)
    table = any(
        isinstance(getattr(config, k, None), int) for k in ("max_source_positions", "max_position_embeddings")
    )
    bounds: dict[str, tuple[int, int | None]] = {}
    for n in narrowed:
        if n.name not in (AUDIO, FEATURES) or not n.admitted:
            return None
        low, high = min(n.admitted), max(n.admitted)
        above = [r for r in n.refused if r > high]
        run = [t for t in n.tried if low <= t <= high]
        if (
            any(r < low for r in n.refused) is False
            and not above
            or any(low < r < high for r in n.refused)
            or not set(run) <= set(n.admitted)
            or above
            and not table
        ):
            return None  # a hole among the sizes proven, or a top the model declares no table for
        bound = (low, high if above else None)
        if bounds.setdefault(n.name, bound) != bound:
            return None

    def bounded(d: Any) -> Any:
        name = getattr(d, "__name__", None)
        if name not in bounds:
            return d
        low, high = bounds[name]
        return torch.export.Dim(name, min=low, max=high if high is not None else getattr(d, "max", 1 << 20))

    log.info(
        "the model's audio lengths: %s",
        ", ".join(f"{k} in {v[0]}..{v[1] or 'any'}" for k, v in bounds.items()),
    )
    return map_dims(dynamic_shapes, bounded)


def _report_quantization(
    package: pathlib.Path,
    checkpoint: folder_mod.CheckpointFolder,
    task: str,
    class_name: str,
    specs: dict[str, GraphSpec],
    stats: dict[str, Any],
) -> None:
    """A quantized text-generation package's bytes by precision and logits error on the verification
    prompt, in its report and ``stats[MODEL_FILE]["quantize"]["logits_error"]``."""
    from fastonnx.pretrained import quantization_error
    from fastonnx.pretrained.package_check import fits

    spec = specs.get(MODEL_FILE)
    quantized = stats.get(MODEL_FILE, {}).get("quantize")
    if task != "text-generation" or spec is None or spec.stateless or not quantized:
        return
    ok, note = fits(checkpoint)
    error = quantization_error.measure(package, checkpoint, class_name, spec) if ok else None
    if error is not None:
        quantized["logits_error"] = error
    with open(package / REPORT_FILE, "a", encoding="utf-8") as f:
        f.write("\n" + "\n".join(quantization_error.report(error, note, quantized)) + "\n")


def _export(spec: GraphSpec, dynamic_shapes: Any, export_args: dict[str, Any]) -> Any:
    """``to_onnx`` of one graph of the package; ``export_args`` are its keywords, with the package's own
    ``shared_cache_mask`` (not a keyword of to_onnx) where the text-generation decoder asks for it."""
    from fastonnx.api import run_export

    keywords = {k: v for k, v in export_args.items() if k not in ("report", "verbose")}
    keywords["dynamic_shapes"] = dynamic_shapes
    if keywords.get("shared_cache_mask") is None:
        keywords.pop("shared_cache_mask", None)
        keywords.pop("shared_cache_positions", None)
        keywords.pop("shared_cache_windows", None)
    return run_export(
        spec.module,
        spec.args,
        None,
        keywords,
        report=export_args["report"],
        verbose=export_args.get("verbose", False),
    )


def _target(task: str, options: dict[str, Any]) -> tuple[targets.Target, str]:
    """The ``target`` and ``dtype`` options (popped) resolved: the target's default precision where no
    dtype is given, float32 where the task's packages take no other yet (and the report's note)."""
    given = options.get("dtype") is not None
    resolved = targets.resolve(
        options.pop("target", targets.DEFAULT_TARGET), options.pop("dtype", None), given
    )
    return targets.settle(resolved, task, None, options)


def export_pretrained(
    model: str | os.PathLike[str],
    outdir: str | os.PathLike[str],
    task: str = "auto",
    *,
    verify: bool = True,
    overwrite: bool = False,
    progress: bool | None = None,
    copy: bool = False,
    **options: Any,
) -> PretrainedExport:
    """Export the checkpoint at ``model`` (a folder with config.json and safetensors weights, or a Hub id
    in huggingface_hub's cache) for ``task`` into the package folder ``outdir``.

    ``options`` are passed to ``fastonnx.to_onnx`` (``opset``, ``optimize``, ``quantize`` where
    to_onnx has it...), checked as to_onnx checks them before anything is read: a bad value or a
    keyword to_onnx does not have is an ``InputError``. ``verify`` runs the package in onnxruntime against transformers when the weights
    fit in memory; a mismatch raises ``RuntimeCheckError`` after writing the package and its report.
    The package hard-links the checkpoint's shards it reads most of, and copies the tensors it reads
    from the others into a file of its own; ``copy`` copies every tensor it reads and links nothing (a
    folder sharing no file with the checkpoint). ``stats["shipped"]`` and the report give the bytes.
    Returns what was written. See docs/guides/pretrained.md.
    """
    from fastonnx.pretrained import half_package  # onnx: imported when an export runs, not with fastonnx

    for reserved in ("filename", "weights", "dynamic_shapes", "input_names", "output_names", "report"):
        if reserved in options:
            raise InputError(f"export_pretrained sets {reserved} itself")
    if options.get("quantize") is None:
        options.pop("quantize", None)
    # the half-precision conversion is the package's (after the float32 export and its calibration)
    target_of, target_note = _target(task, options)
    if "quantize" in options:
        options["quantize"] = targets.quantize_for(target_of.name, options["quantize"])
    dtype, keep_io_types = target_of.dtype, options.pop("keep_io_types", False)
    half_package.check_options(task, dtype, keep_io_types, options)
    # to_onnx's checks of the options, with its messages, before the folder is read or anything
    # captured (verbose is no option of the export, only of its logging)
    ExportOptions.from_keywords(progress=progress, **{k: v for k, v in options.items() if k != "verbose"})
    checkpoint = folder_mod.read_folder(model)
    chosen, class_name = choose(checkpoint.config, task)
    target = pathlib.Path(outdir).expanduser().resolve()
    _prepare_outdir(target, overwrite)
    config = load_config(checkpoint.path)
    built = build_model(class_name, config)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent))
    try:
        weights = _package_weights(tmp, checkpoint.shards, built)
        specs = _graph_specs(chosen.name, built, config, class_name)
        shards, missing = weights.files(next(iter(specs.values())).module, built), weights.missing
        if not target_note:  # the task and its graphs known now
            target_of, target_note = targets.settle(target_of, chosen.name, specs, model=built)
        dtype = target_of.dtype
        if dtype is not None:  # refused before any graph is exported
            half_package.check_specs(dtype, chosen.name, specs, built)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    stats: dict[str, Any] = {}
    shared_mask: str | None = None
    try:
        for filename, spec in specs.items():
            report = tmp / (f"{filename.removesuffix('.onnx')}.report.md" if stats else REPORT_FILE)
            export_args: dict[str, Any] = dict(
                filename=tmp / filename,
                weights=shards,
                input_names=spec.input_names,
                output_names=spec.output_names,
                report=report,
                progress=progress,
                **options,
            )
            if chosen.name == "text-generation" and filename == MODEL_FILE:
                shared_mask = shared_cache.wanted(config, spec, options, dtype, keep_io_types)
                export_args["shared_cache_mask"] = shared_mask
                export_args["shared_cache_positions"] = context_length(config)
                export_args["shared_cache_windows"] = shared_cache.window_inputs(config) or None
            shapes = table_bounded(spec, config) or spec.dynamic_shapes
            try:
                result = _export(spec, shapes, export_args)
            except CaptureError as e:
                bounded = within_declared(e, config, shapes, spec.module)
                if bounded is None:
                    raise
                result = _export(spec, bounded, export_args)
            stats[filename] = result.stats
            if report.name != REPORT_FILE:  # one report for the package: the files' in turn
                with open(tmp / REPORT_FILE, "a", encoding="utf-8") as f:
                    f.write(f"\n---\n\n(`{filename}`)\n\n" + report.read_text(encoding="utf-8"))
                report.unlink()
        if dtype is not None:
            half_package.convert_package(tmp, specs, config, dtype, keep_io_types, chosen.name, built)
            # the checkpoint's tensors the half graphs read through Casts: converted into the package
            from fastonnx.pretrained.half_weights import store_half_weights  # onnx: when an export runs

            store_half_weights(tmp, list(specs), dtype)
        _drop_unused(tmp, list(specs))
        shipped = ship(tmp, list(specs), copy)
        with open(tmp / REPORT_FILE, "a", encoding="utf-8") as f:
            f.write("\n" + shipped.report())
        if missing:
            with open(tmp / REPORT_FILE, "a", encoding="utf-8") as f:
                f.write(
                    f"\n## Parameters not in the checkpoint\n\n{len(missing)} parameters of {class_name} are "
                    "not in the checkpoint: the model's own initialization gives their values, as from_pretrained "
                    "does (random ones differ from its draw; the optimizer drops those the outputs do not "
                    "read): " + ", ".join(f"`{m}`" for m in missing) + "\n"
                )
        for side in checkpoint.side_files():
            shutil.copy2(side, tmp / side.name)
        genai: pathlib.Path | str | None = None
        if chosen.name == "text-generation":
            share = False
            if shared_mask is not None:
                unshared = shared_cache.unshared_reason(tmp / MODEL_FILE, specs[MODEL_FILE])
                share = unshared is None
                with open(tmp / REPORT_FILE, "a", encoding="utf-8") as f:
                    f.write("\n" + shared_cache.report(unshared) + "\n")
            genai = write_genai_config(
                tmp, config, checkpoint.generation_config(), specs[MODEL_FILE], MODEL_FILE, share
            )
        elif chosen.name == "image-text-to-text":
            genai = write_vision_genai_config(
                tmp, checkpoint.path, config, checkpoint.generation_config(), specs
            )
        elif chosen.name == "automatic-speech-recognition" and "encoder_model.onnx" in specs:
            genai = write_whisper_genai_config(tmp, config, checkpoint.generation_config(), list(specs))
        if isinstance(genai, pathlib.Path):
            targets.write_provider_options(genai, target_of.name)
        # every node against the target's kernels before the package is verified or moved in place
        lowered = targets.lower_package(tmp, list(specs), target_of.name)
        targets.check_package(tmp, list(specs), target_of.name)
        with open(tmp / REPORT_FILE, "a", encoding="utf-8") as f:
            f.write("\n" + targets.report(target_of, target_note, lowered))
        if isinstance(genai, str):  # the package is onnxruntime's still: said in the log and the report
            log.warning("%s: no genai_config.json written", genai)
            with open(tmp / REPORT_FILE, "a", encoding="utf-8") as f:
                f.write(f"\nNo genai_config.json: {genai}.\n")
        verified: bool | None = None
        note = "skipped (verify=False)"
        if verify and options.get("quantize") is not None:
            # the quantized products differ from the float ones by design: no float tolerance holds
            note = f"skipped: weights quantized ({options['quantize']}), transformers' are float"
            with open(tmp / REPORT_FILE, "a", encoding="utf-8") as f:
                f.write(f"\nVerification {note}.\n")
            _report_quantization(tmp, checkpoint, chosen.name, class_name, specs, stats)
        elif verify and dtype == "bf16":
            # onnxruntime's CPU has no bfloat16 MatMul, Add, Mul or Softmax: the package does not load there
            note = "skipped: onnxruntime's CPU does not run bfloat16 graphs (onnx.reference does)"
            with open(tmp / REPORT_FILE, "a", encoding="utf-8") as f:
                f.write(f"\nVerification {note}.\n")
        elif verify:
            from fastonnx.pretrained.package_check import verify_package

            verified, note = verify_package(
                tmp, checkpoint, chosen.name, class_name, specs, progress, half=dtype is not None
            )
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    main_file, main = next(iter(specs.items()))
    written = PretrainedExport(
        target,
        chosen.name,
        class_name,
        sorted(p.name for p in target.iterdir()),
        main.input_names,
        main.output_names,
        verified,
        note,
        {
            **stats,
            "missing_parameters": sorted(missing),
            "shipped": shipped.stats(),
            "target": {"name": target_of.name, "dtype": target_of.dtype_name},
        },
        {name: (spec.input_names, spec.output_names) for name, spec in specs.items()},
        main_file,
    )
    if verified is False:
        raise RuntimeCheckError(
            f"the package in {target} disagrees with transformers ({note}): see {written.report_path}"
        )
    return written
