"""fastonnx.to_onnx: capture, convert, optimize, write — each stage timed in ``stats``."""

from __future__ import annotations

import contextlib
import gc
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from fastonnx import pipeline
from fastonnx._core import GraphError
from fastonnx.diagnostics import debug
from fastonnx.diagnostics.export_report import ExportRecord, report_path
from fastonnx.errors import ConversionError, InputError
from fastonnx.interrupt import sigterm_as_interrupt
from fastonnx.pipeline.options import ExportOptions, check_writable, new_builder, optimize_level
from fastonnx.result import ExportResult
from fastonnx.stored_weights import checkpoints as inplace
from fastonnx.stored_weights.weight_quantization import WeightQuantization
from fastonnx.walker import local_functions

__all__ = ["check_writable", "new_builder", "optimize_level", "to_onnx"]

log = logging.getLogger("fastonnx")


def program_inputs(
    model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The inputs to export ``model`` with: those given, or an ExportedProgram's own example inputs
    when none are (as torch.onnx.export does); a program without them needs the inputs given."""
    if args or kwargs or not isinstance(model, torch.export.ExportedProgram):
        return args, kwargs
    example = model.example_inputs
    if example is None:
        raise InputError(
            "the ExportedProgram holds no example inputs (a deserialized or hand-built program): pass "
            "the args and kwargs it was exported with"
        )
    return tuple(example[0]), dict(example[1])


def to_onnx(
    model: Any,
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
    *,
    dynamic_shapes: Any = None,
    opset: int | None = None,
    filename: str | os.PathLike[str] | None = None,
    external_data: bool | None = None,
    optimize: bool | str = True,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    custom_converters: dict[Any, Any] | None = None,
    decompositions: dict[Any, Callable[..., Any]] | None = None,
    strict_dynamic: bool = True,
    keep_narrowed: bool = False,
    metadata: bool = True,
    value_info: bool = True,
    report: bool | str | os.PathLike[str] = False,
    verify: bool = False,
    verbose: bool = False,
    durable: bool = False,
    progress: bool | None = None,
    weights: inplace.Weights | None = None,
    export_modules_as_functions: local_functions.Selection = False,
    cast_weights: bool = False,
    capture: str = "auto",
    quantize: str | WeightQuantization | None = None,
    dtype: str | None = None,
    keep_io_types: bool = False,
) -> ExportResult:
    """Export ``model`` (an nn.Module or a torch.export.ExportedProgram) to ONNX.

    The model is captured (``capture``), each aten op is converted by one converter, the Rust passes
    optimize the graph (``optimize``) and, when ``filename`` is given, the file is streamed to disk from
    the tensors' own memory. Each stage is timed in ``result.stats``. This docstring is the reference of
    every option; docs/options.md is generated from it (``python scripts/options_doc.py``).

    Args:
        model: An ``nn.Module``, captured as ``capture`` says, or an ``ExportedProgram``, converted as it
            is. Converting ``torch.export.export(module)`` and the module itself give byte-identical files
            for MLPs and CNNs, and the same graph under other value names for transformers models.
        args: A tuple of positional inputs (for an ``ExportedProgram``, left out with ``kwargs``: the
            program's own ``example_inputs``). Tensor inputs become graph inputs in order, named after the FX
            placeholders (the argument names) unless ``input_names`` is given. Inputs are flattened with
            torch's pytree, as torch.export flattens them: tuples, lists, dicts, None and registered pytree
            containers (transformers' ``DynamicCache`` and ``EncoderDecoderCache`` included); a nested
            input is named after its path (``pair.1.0``, ``named.x``, ``past_key_values.0.key``).
            Non-tensor leaves of a basic type (None, bool, int, float, str) are baked in, as torch.export
            specialises on them. An object of a class pytree does not know (your own class, an
            unregistered dataclass) is torch.export's "Unsupported input type" error under every
            ``capture``: register it with ``torch.export.register_dataclass`` or ``register_pytree_node``.
            A tensor of the arguments that a capture would make a constant (a class registered with
            ``register_constant`` holding one) is a ``CaptureError`` naming it: no input is ever baked
            into the file.
        kwargs: Keyword inputs of the model, flattened and named as ``args`` are.
        dynamic_shapes: Which input dims stay dynamic, in every form torch.export accepts (``Dim`` with
            min / max, derived dims such as ``seq + 1``, ``Dim.DYNAMIC``, ``Dim.AUTO``), per input a dict
            ``{axis: spec}`` or a list with one entry per axis, and torch.onnx's named strings
            (``{"input_ids": {0: "batch", 1: "seq"}}``; a string means ``Dim.AUTO`` named that way). ONNX
            dims are named after the user's names, else the Dim's name, else ``<input>_dim<axis>``; derived
            dims read as expressions (``seq+1``). The capture uses torch's size-oblivious reasoning
            (``backed_size_oblivious``, as ``torch.onnx.export`` does), so an example size of 0 or 1 stays
            dynamic. When torch.export refuses the shapes with suggested fixes, the fixes are applied once
            and the model captured again (``stats["dynamic_shapes_refined"]`` lists them; the ONNX dims
            follow them, ``2*_n``). A dim asked to be dynamic that torch.export specialises is handled as
            ``strict_dynamic`` says; one whose program is right at some of the asked sizes only (torch
            narrowed its range, or a guard of the trace decides on it) as ``keep_narrowed`` says. The
            sizes each dynamic dim is proven for are in ``stats["dynamic_ranges"]``, in the file's
            metadata (``pkg.fastonnx.proven_sizes``), and the result refuses inputs outside them
            (``SizeGuardError``, also from ``verify``). Dynamic shapes are always captured by torch.export (``capture``):
            under ``capture="auto"``, a model with a stack of like layers (a transformer's decoder
            layers) is captured by torch.export with the stack cut to its first layers of each kind,
            and the other layers are stamped from them where their sameness is proven
            (``fastonnx.capture.stamping``; ``stats["stamped"]``, else ``stats["stamp_refused"]`` says
            why the whole model was captured); ``capture="export"`` captures every layer.
        opset: The ONNX opset, from ``fastonnx.MIN_OPSET`` (17) to ``fastonnx.MAX_OPSET`` (26, the newest
            the pinned onnxruntime loads). None means ``fastonnx.DEFAULT_OPSET`` (20), the official
            exporter's default. Another value raises ``OpsetError``, and so does a dtype the opset lacks
            (float8 below 19, float4 below 23). The IR version written is the lowest the opset needs.
        filename: Where to write the model; None keeps it in memory (``result.model_proto``,
            ``result.save``). The write is atomic: temporary files first, the ``.onnx`` renamed last. A
            failed or interrupted export leaves no file and does not touch an existing one. Temporary files
            are named ``<target>.tmp-<host>-<pid>-<random>``, beside the target; a process killed outright
            (SIGKILL, the out-of-memory killer) cannot remove them, so each save first removes the
            temporaries in its folder that this host's processes left and that no longer run (checked with
            ``kill(pid, 0)``; those of other hosts sharing the folder, and of live processes, are kept) and
            logs them as a warning on the ``fastonnx`` logger (``stats["file"]["swept"]``). Without
            ``durable``, ``to_onnx`` returns when the files are complete, closed and renamed; the system
            stores them on disk later (a power loss before then can lose them).
        external_data: None (default) keeps the weights inline unless the model would pass protobuf's
            2 GiB limit, then writes them to ``<filename>.data`` and logs it
            (``stats["file"]["switched_to_external"]``). True always uses the data file; False raises
            ``ModelTooLargeError`` past 2 GiB. In the data file, tensors over 1 MiB start at 64 KiB-aligned
            offsets (mmap-friendly everywhere), smaller ones at 64-byte offsets; tensors under 1 KiB stay
            in the ``.onnx``.
        optimize: What the Rust passes do after conversion (``stats["optimize"]`` counts what each pass
            changed):

            - False (or ``"none"``): the graph as converted, one group of nodes per aten op.
            - True (default; or ``"default"``, the level's name in the CLI and in Rust): standard ONNX that
              any runtime loads. Constant folding of shape arithmetic
              and small tensors (never of weights); no-op removal (Cast to the same type, same-shape
              Reshape / Expand / forward Slice, ``*1``, ``+0``); common-subexpression elimination; weights
              read through a Transpose stored transposed, for any rank and ``perm`` (a matrix, or a
              mixture-of-experts model's batched ``[experts, out, in]`` weights read as
              ``[experts, in, out]``: Mixtral and the other transformers models whose grouped experts read
              ``weight.transpose(-2, -1)`` keep no Transpose of a weight), permuted by one worker thread
              in pieces of 2 MiB ahead of the bytes being written (the writer's one pipeline holds at most
              four pieces, 8 MiB: no copy of a weight in memory); rewrites of Reshape∘Reshape,
              Transpose∘Transpose, lossless Cast∘Cast, Squeeze / Unsqueeze pairs and 2-D MatMul + Add into
              Gemm; BatchNormalization folded into the preceding Conv (the scaled weight is computed as it
              is written); Identity and unused-node / initializer removal. Fusions, on float32 chains
              only, each only where every intermediate value has no other reader:

              - hand-written LayerNorm (``(x - mean) / sqrt(var + eps) * w + b``) to
                ``LayerNormalization`` (opset 17 and up);
              - hand-written GELU, erf and tanh forms (GPT-2's ``NewGELU``) to ``Gelu`` (opset 20 and up);
              - hand-written RMS norms (``x * rsqrt(mean(x²) + eps) * w``) to ``RMSNormalization``
                (opset 23 and up);
              - attention as ``scaled_dot_product_attention`` converts (scale, QKᵀ, mask, softmax, V) to
                ``Attention`` (opset 23 and up), with keys and values fed unrepeated for grouped-query
                attention. Attention's specification gives zeros for rows the mask closes entirely, as
                torch does. Below opset 23 the mask's ``Where`` nodes are removed where the mask folded to
                all-true constants (ViT);
              - below opset 23, grouped-query attention whose keys and values are repeated per group
                (transformers' ``repeat_kv``, ``enable_gqa``) reads them unrepeated: the query heads of a
                group are stacked along the rows (``(b, G·h, s, e)`` to ``(b, h, G·s, e)``, a Reshape),
                one product per key/value head, masks applied on the scores as before; the ``Expand``
                copying the KV cache on every decode step goes (``grouped_attention_unrepeated``). The
                "onnxruntime" level keeps this form (``com.microsoft.GroupQueryAttention`` ran slower on
                onnxruntime 1.31's CPU kernel), except in the text-generation packages of
                ``export_pretrained``, whose caches onnxruntime-genai shares with the present outputs:
                there ``GroupQueryAttention`` writes each step into them in place
                (docs/guides/pretrained.md);
              - rotate-half rotary embeddings with constant cos / sin tables (static sequence length) to
                ``RotaryEmbedding`` (opset 23 and up);
              - rotate-half rotary embeddings whose cos / sin are computed at run time from the positions
                (``Cos`` / ``Sin`` of ``Concat(f, f)``, optionally times a scalar: Llama, Mistral, Qwen2,
                Phi-3 with position ids as an input, that is every decode step) to ``RotaryEmbedding``
                (opset 23 and up) with 3-D caches ``Cos(f)`` / ``Sin(f)`` computed once per model
                (``rotary_live_fused``); with partial rotary (Phi) the rotated slice fuses. At the
                "onnxruntime" level below opset 23 they become ``com.microsoft.RotaryEmbedding``, fed the
                same caches flattened to (batch·seq, h/2) rows with position ids numbering those rows (no
                precomputed table of all positions: exact for any scaling);
              - SiLU stays ``x * Sigmoid(x)``: the standard ``Swish`` (opset 24) ran slower in
                onnxruntime 1.31.

            - "onnxruntime": everything True does, plus onnxruntime's contrib operators where they pay,
              at any opset: RMS norms become ``SimplifiedLayerNormalization`` (onnxruntime's session
              optimizer does not recognise the decomposed form, which then runs as seven kernels), GELU
              below opset 20 becomes ``com.microsoft`` ``Gelu`` / ``FastGelu``, SiLU ``QuickGelu``, rotary
              embeddings below opset 23 (or with a dynamic batch) ``com.microsoft.RotaryEmbedding``, and
              attention below opset 23 whose heads are split from 3-D projections (BERT, ViT)
              ``MultiHeadAttention``. Not emitted, because they ran slower on onnxruntime 1.31's CPU
              kernels: ``SkipLayerNormalization`` / ``SkipSimplifiedLayerNormalization``, ``Swish`` and
              ``MoE`` (transformers' routed experts stay the routed ``SequenceMap`` form: on a
              Qwen3-30B-A3B-shaped block the CPU ``MoE`` took ~190 ms a decode step against ~14 ms, see
              the mixture-of-experts section of docs/benchmarks.md; capture inside
              ``fastonnx.capture.fused_experts.fused_experts(True)`` to get it anyway). With ``quantize``
              those experts become ``QMoE`` instead, which measured faster than the float routed form.
              Such a file loads in onnxruntime only; ``onnx.checker`` does not know these operators.
        input_names: Names for the tensor inputs, in order, instead of the FX placeholders' names.
        output_names: Names for the tensor outputs, in order. Without them, outputs that are one tensor
            or a flat tuple keep their FX node names; nested outputs are named after their path
            (``output.1.0.key``), dict and ``ModelOutput`` outputs by their keys (``logits``,
            ``past_key_values.0.value``). A mutated buffer or input becomes an extra output named
            ``mutated.<buffer or input name>``, after the user's outputs.
        custom_converters: ``{torch.ops.aten.x.overload: fn}`` (or the op's name,
            ``{"aten.x.overload": fn}``); they take priority over the built-in converters and their use is
            listed in ``stats["custom_converters_used"]``. A converter is ``fn(ctx, *args, **kwargs)``
            returning the ONNX value name (``ctx`` is a ``fastonnx.context.ConversionContext``; "Add a
            converter" in docs/architecture.md). A key naming an op without an overload
            (``torch.ops.aten.x``) is refused. A value may also be what torch.onnx.export's
            ``custom_translation_table`` takes: an ``@onnxscript.script`` function (inlined: its nodes go
            into the graph), a Python function calling onnxscript ops (run once, each op call emitting a
            node), or a list of them (overloads: the first whose signature takes the node's input types);
            a plain function is taken for onnxscript's when it uses onnxscript (an ``op`` of
            ``onnxscript.opset18``...) and its first parameter is not ``ctx``. Their arguments, opsets and
            errors: "Translation tables" in docs/migrating.md. A converter for a composite op (one with a
            CompositeImplicitAutograd kernel, such as a ``torch.library`` op defined by its
            decomposition) makes ``capture="auto"`` use torch.export, which keeps the op whole.
        decompositions: A decomposition table applied with ``ep.run_decompositions(table)`` before
            conversion (``stats["decompositions"]`` shows it was used; ``capture="auto"`` then captures
            with torch.export). fastonnx never decomposes on its own.
        strict_dynamic: What happens when a dim that ``dynamic_shapes`` asks to be dynamic comes out of
            torch.export fixed to its example size. True (default): ``CaptureError`` naming each such
            input, axis and size (``input 'x' axis 0 to 2``), with torch's reason when it gave one. False:
            the model is exported with that size fixed and a ``UserWarning`` says so (``input 'x' dim 0
            was asked to be dynamic but torch.export specialised it to 2``).
        keep_narrowed: What happens when the captured program is right at some of the sizes a dynamic
            dim asks for only: torch.export narrowed its range (a convolution's kernel, position
            embeddings: ``Dim('sequence', max=512)``) or recorded a guard that decides on it (a loop over
            64-token chunks traced at 9 tokens runs one chunk, and is wrong at 70); onnxruntime would run
            the file at the other sizes and could answer wrong without an error. False (default):
            ``CaptureError`` naming the input, the axis, each guard in the user's terms with the line
            that made it, the sizes it is right for and the bound to ask for (``Dim('sequence', min=2,
            max=64)``; asked for, the export succeeds and keeps it). True: the export keeps the sizes it
            is right for (and the guards), with a ``UserWarning``; ``stats["narrowed"]`` says what was
            kept. Guards that restate the request (``s >= 2``, ``s != 1``: 0 and 1 are left out as
            torch.export leaves them out) stay silent. What is checked: docs/capture.md.
        metadata: True (default) names each node after the module it comes from
            (``/model/layers.0/self_attn/q_proj/MatMul``, unique and the same on every run: the same model
            gives the same file byte for byte) and gives nodes, inputs, outputs, initializers and the
            graph the ``metadata_props`` the official exporter writes (key names in
            ``fastonnx.walker.node_metadata``). False leaves all of that out: node names are op types
            (``MatMul_3``), the file is smallest. Must be a bool.
        value_info: True (default) writes the graph's ``value_info``, as the official exporter does: the
            element type and full shape of every value a node makes that is not a graph output, for
            Netron, quantizers and other tools that read them: torch's record where it has one, else
            inferred from the ONNX operator's definition (the pieces converters add inside an op's
            decomposition, shape arithmetic, fusions, contrib and quantization nodes, local functions'
            call sites; ``rust/core/src/infer``), following small integer tensors so that computed
            sizes are named. Symbolic dims are named as the graph inputs name theirs (``batch``,
            ``seq``, expressions of them such as ``seq+1`` or ``2*seq``); a size no expression of the
            inputs' dims gives (a data-dependent count) is a dim without a name. If / Loop / Scan
            bodies get theirs too; local functions' bodies (``export_modules_as_functions``) get none,
            as one body may serve calls on values of other shapes. False leaves ``value_info`` out
            (the file is otherwise the same, byte for byte). Must be a bool.
        report: True or a path writes a markdown report of the export, also when it fails (the
            exception's message then ends with ``(fastonnx report: <path>)``). True writes it next to the
            model file (``net.onnx`` gives ``net.report.md``), or ``<ModelClass>.report.md`` in the current
            folder without a ``filename``. It holds the versions (fastonnx, torch, onnx, onnxruntime), the
            model's class and the arguments' structure, the capture (torch.export's error and your line
            when it failed), the op inventory (every aten op of the FX graph with its count, whether a
            converter exists and which family holds it, your custom converters), for a conversion failure
            the failing FX node with its arguments' dtypes and shapes and the builder's last 20 values,
            the stage timings, ONNX nodes by op type before and after optimization with the passes that
            changed the graph, and the verification table.
        verify: True runs the model eagerly and in onnxruntime on ``args`` and stores one
            ``VerificationInfo`` per output in ``stats["verify"]`` (max abs / rel difference, pass or
            fail); a disagreement is logged as a warning, not raised. Tolerances default per dtype
            (float32 ``atol=1e-4, rtol=1e-3``, float16 ``1e-2``, bfloat16 ``2e-2``, float64 ``1e-7``;
            integers and booleans exact; ``fastonnx.diagnostics.verdicts.DEFAULT_TOLERANCES``). Mutated
            buffers (``mutated.*`` outputs) are not compared. ``result.verify`` does the same on other
            inputs.
        verbose: True logs each stage (capture, convert, optimize, verify) through the ``fastonnx``
            logger, to stderr when the application has no logging handler, and puts the builder-state
            dump (``.debug``) of a conversion error into its message, as the environment variable
            ``FASTONNX_DEBUG=1`` does for every export. The dump: opset, FX node i of N, the FX node, its
            arguments' dtypes and shapes as torch recorded them, and the last ONNX nodes added with their
            inputs and outputs (and the outputs' types).
        durable: True flushes the data file and then the model file to the disk before they are renamed
            into place, and the folder after the renames, for jobs that upload the file or hand it on
            right after ``to_onnx`` returns. It costs the time the disk takes to store what the system has
            not written back yet (docs/benchmarks.md, "Stopping and durable writes"). Off by default.
        progress: Bars on stderr (tqdm), one per stage: capture, convert (node i of N), optimize (pass i
            of N), write (bytes of total). None (default): only when stderr is a terminal, and only for a
            stage that runs past a second (a quick export prints nothing and creates no bar). True: every
            stage, wherever stderr goes. False: nothing.
        weights: The model's checkpoint as safetensors shards (a folder, or a list of shard files in one
            folder: what ``save_pretrained`` writes). Each initializer whose state-dict key is in the
            shards with the same shape (and dtype, or a float dtype a Cast makes it), and which the graph
            reads as stored, is referenced in place: its external data points into the shard and none of
            its bytes are written. Keys are found under any name of a tied weight, without a wrapper
            module's prefix when one prefix fits, and as transformers' loading renames them. Linear
            weights are read as stored, ``[out, in]`` (``Gemm(transB=1)`` at the standard level,
            ``com.microsoft.FusedMatMul(transB=1)`` for float32 at the "onnxruntime" level), so they are
            referenced too; a float dtype that differs from the graph's is read through a ``Cast``
            (``cast_weights``); weights the graph reads in another form (batch norms folded into
            convolutions, constants) are written to ``<model>.onnx.data``. A key found with another shape,
            or a dtype no Cast makes it, raises ``InputError`` naming the key, both shapes and both dtypes
            before anything is written; so does a meta-device weight missing from the shards (a real
            module's is written as usual). The model may be real or on the meta device. Needs
            ``filename``; a ``.onnx`` outside the shards' folder gets the shards it uses hard-linked beside
            it (same filesystem, else ``SerializationError``). ``stats["file"]["weights"]`` counts the
            tensors and bytes referenced, linked and written. ``result.to_bytes()`` refuses such a model.
            Needs the ``safetensors`` package (extra ``checkpoints``).
        export_modules_as_functions: False (default), True (every submodule below the root; nested
            modules become nested functions) or a set of nn.Module classes: each instance becomes one call
            of an ONNX local function (``FunctionProto``). Instances whose bodies are the same graph share
            one function named after the class (``LlamaDecoderLayer``) in the domain of its package
            (``pkg.transformers``; ``pkg.torch`` for ``torch.nn`` classes); a body that differs gets its own,
            ``LlamaDecoderLayer_1``, ``_2``... in the order met. Weights are passed at each call; the passes
            run inside each body and never across a call. An instance whose nodes cannot form one call is
            left inline with a warning (``stats["functions"]["inlined"]``); ``stats["functions"]`` lists
            calls and functions. ``fastonnx.inline_functions`` gives the flat model back.
        cast_weights: With ``weights``: True writes the tensors whose checkpoint float dtype differs from
            the graph's, cast, into ``<model>.onnx.data`` instead of reading them through a ``Cast`` (a
            meta-device model's are read from the shard and converted 2 MiB at a time, never a whole
            tensor in memory; a real module's are its own weights, written as without ``weights``). False
            (default): they are referenced behind a ``Cast``, which onnxruntime folds when it loads the
            model.
        quantize: Weight-only quantization at export. None (default): weights as they are. ``"int4"`` /
            ``"int8"``: ``fastonnx.WeightQuantization(bits=4 | 8)``, whose fields are ``bits`` (4, 8),
            ``block_size`` (values per block along the input axis K; a power of two from 16 to 256,
            default 32), ``symmetric`` (True, default: int4 / int8 codes and a scale per block; False:
            uint4 / uint8 codes with a zero point per block), ``exclude`` (None, default: the LM head
            stays float — a Linear named ``lm_head``, tied to an embedding, or, outside numbered
            layers, whose out_features is an nn.Embedding's num_embeddings; a sequence of
            module-name patterns, ``fnmatch`` on the full name or on its last parts, replaces that rule;
            ``()`` quantizes the head too), ``accuracy_level`` (MatMulNBits' attribute at the
            "onnxruntime" level: 4, default, int8 activations inside the kernel as onnxruntime's fusion
            of the standard form uses by default; 0 exact; None leaves it out), and for mixed
            precision ``bits_for`` (patterns to 4 or 8 bits for the products they match, a matched LM
            head quantized too: ``{"lm_head": 8}`` is an int4 model with an int8 head) and
            ``accuracy_level_for`` (patterns to an accuracy level, "onnxruntime" level only), and
            ``gather_codes`` (True, default: at the "onnxruntime" level an embedding tied to a quantized
            head gathers the head's codes by ``com.microsoft.GatherBlockQuantized``, the same bytes, and
            no float table is written; False keeps the table). Every
            2-D float weight a MatMul / Gemm / Linear reads is quantized round-to-nearest per block (half
            to even) by the writer while it streams: standard level, ``DequantizeLinear(axis=0,
            block_size)`` of ``[in, out]`` codes then ``MatMul`` (needs opset >= 21: the default opset
            becomes 21, an explicit lower one raises ``OpsetError``; onnxruntime fuses it into
            ``MatMulNBits`` and its session option ``session.qdq_matmulnbits_accuracy_level`` decides the
            kernel's accuracy); "onnxruntime" level, ``com.microsoft.MatMulNBits`` (float32 / float16
            graphs); there transformers' SwiGLU experts without biases (Qwen3-MoE, Mixtral...) are
            captured as one op and read by ``com.microsoft.QMoE`` from int4 / int8 codes (both their
            sizes multiples of ``block_size``, else they stay float, with the reason), while at the
            standard level they stay float (no standard operator reads stacked experts quantized). With
            ``weights`` the quantized weights are read from the checkpoint (never
            referenced): only quantized bytes are written. A meta-device weight needs ``weights``
            (``InputError`` otherwise). Embeddings (Gathers) stay float. ``stats["quantize"]`` lists the
            weights quantized (shape, bytes) and those left float with the reason. Bad settings (bits 3,
            block 7, a pattern matching no module) raise ``InputError`` naming them, and so does
            ``export_modules_as_functions`` (function bodies read their weights as inputs). The guide:
            docs/guides/quantization.md.
        dtype: The type the graph computes in. None (default): float32 as captured. ``"fp16"`` /
            ``"bf16"``: the written float32 file is run once in onnxruntime on ``args`` with every
            intermediate value an output (float16 only; not with meta-device inputs), then rewritten
            (``fastonnx.half_precision``): products and elementwise ops in the half type; reductions,
            the squares and roots of norms, normalization ops, softmax, ``Exp`` / ``Log``, ``Tanh``
            (soft-capping), the rotary angles (values computed from integers cast to float) and every
            node reading or making a value recorded above 4094 (float16's 65504 over a margin of 16)
            stay float32, with Casts at their edges. Weights keep their bytes: a float32 or a
            checkpoint's bfloat16 tensor is read through a Cast, which onnxruntime folds at load.
            ``stats["half_precision"]``: the nodes kept float32 by reason, the share of MatMul / Gemm
            multiply-adds in the half type, the Casts added. Needs ``filename``; not with
            ``cast_weights`` (its float32 copies are what the Casts avoid). With ``quantize``
            (transformers.js's q4f16): the dequantized products (``DequantizeLinear``, ``MatMulNBits``)
            read float16 activations and scales (the scales through a Cast folded at load).
            ``verify`` is skipped (float32 tolerances). ``result(...)`` casts float
            inputs to the graph's types. onnxruntime's CPU runs no bfloat16 MatMul / Add / Softmax:
            run bfloat16 files elsewhere (``onnx.reference``, GPUs).
        keep_io_types: With ``dtype``: the float32 inputs and outputs stay float32 (Casts behind and
            before them). False (default): they take the half type, unless an output's recorded range
            exceeds float16's. True without ``dtype`` is an ``InputError``.
        capture: How an nn.Module becomes a graph. ``"auto"`` (default) runs the module once, eagerly
            under ``torch.no_grad()``, on the real ``args`` and records its aten ops in the form
            torch.export gives (``fastonnx.capture.trace``: the same graph as torch.export's for static
            shapes, without its fake-tensor cost per op) when ``dynamic_shapes`` and ``decompositions``
            are None and no dropout or norm layer is in training mode; otherwise, and wherever a real run
            could fix what torch.export keeps general (a tensor's value read into Python, an output size
            that depends on the data, a custom op, an in-place write into an input, a weight or a buffer,
            a higher-order op, a recurrent layer, a copy of a meta tensor's values, anything the recorder
            does not know), it captures with ``torch.export.export(strict=False)``, logging why at INFO level.
            ``"export"`` always uses torch.export; ``"trace"`` asks for the trace and warns, naming the
            reason and your line, when it falls back (with ``dynamic_shapes`` or an ExportedProgram it is
            an ``InputError``). ``stats["capture"]`` says which ran and ``stats["trace_refused"]`` why the
            trace did not. The trace runs on the caller's tensors in fresh containers (a forward that
            updates a cache object or a list it was given leaves the caller's untouched), with
            ``torch.compiler.is_compiling()`` and ``is_exporting()`` True, as under torch.export.

    Returns:
        An ``ExportResult``: ``model_proto`` (an ``onnx.ModelProto``, built on first use),
        ``save(path, external_data=None, *, durable=False, progress=None)`` (as ``to_onnx`` writes),
        ``to_bytes()``, ``__call__(*args, **kwargs)`` (runs the model in onnxruntime with the model's
        input structure and returns torch tensors in its output structure), ``session()``,
        ``input_names``, ``output_names``, ``stats`` and
        ``verify(*args, atol=None, rtol=None, intermediate=False, **kwargs)`` (``intermediate=True`` names
        the first FX node whose value departs). The result keeps a reference to the model and its
        ExportedProgram for ``verify``.

    Raises:
        Every error derives from ``fastonnx.FastOnnxError``: ``InputError`` (bad arguments),
        ``CaptureError`` (torch.export failed, with its message), ``UnsupportedOpError`` (no converter:
        names the aten op, the FX node, your source line and "node i of N"), ``OpsetError``,
        ``ConversionError``, ``GraphError``, ``SerializationError`` / ``ModelTooLargeError``,
        ``RuntimeCheckError`` (onnxruntime refused the model). Nothing falls back silently.
        ``ConversionError``, ``UnsupportedOpError`` and ``GraphError`` raised while converting carry a
        ``.debug`` text (the builder's state, see ``verbose``) and ``.fx_node``.

    Stopping:
        Ctrl-C (SIGINT) stops ``to_onnx`` within about a second at any stage with ``KeyboardInterrupt``
        (not wrapped in a fastonnx error): during capture (torch's own code) and conversion (a Python
        loop) at the next Python instruction, during optimization between two passes (one pass on a huge
        graph can take longer than a second), during the write between two 2 MiB pieces (the Rust writer
        releases the GIL and takes it back every 0.1 s to run the pending signal handlers; its
        prefetching thread stops on a shared flag). The temporary files are removed and the existing
        ``.onnx`` and ``.data`` are left untouched. SIGTERM, which job runners send and which Python
        leaves to the system (it ends the process on the spot, with no clean-up), is turned into the same
        ``KeyboardInterrupt`` while ``to_onnx`` (or ``ExportResult.save``) runs on the main thread and
        SIGTERM still has its default disposition; the default is restored when it returns. A handler
        the program installed is never replaced, and exports on other threads leave signals alone.

    Threads:
        ``to_onnx`` may be called from several threads at once. Everything that traces (torch.export,
        ``run_decompositions``, and the process-wide patches fastonnx applies while capturing: the
        recurrent custom ops, torchvision's detection helpers, torch's size-oblivious flag) runs under one
        lock, ``fastonnx.capture.TRACE_LOCK``; conversion, optimization and writing run in parallel (the
        Rust writer releases the GIL). Converting an ``ExportedProgram`` that needs no functionalization
        does not take the lock (past the first call of a process, which may register transformers' cache
        classes with torch's pytree under it). torch.export itself is not thread-safe: code that calls it
        in other threads while fastonnx captures should hold ``TRACE_LOCK`` too (it is reentrant).

    Devices:
        Weights that are not on the CPU (a model on CUDA or another accelerator) stay where they are
        while the graph is converted and optimized; each is copied to the host only when the file (or
        the in-memory model of ``result.session()``) is written, one tensor at a time: the writer's
        prefetching worker asks for the next weight's host copy (``t.to("cpu")``, in
        ``fastonnx.dtypes.tensor_bytes``, the one place a weight leaves its device) while the previous one
        is written, and drops it once written, so the host never holds more than about one weight. A
        weight read through a Transpose is permuted as its copy is written. The example inputs are traced
        on their own device; ``result(...)`` takes CPU inputs (onnxruntime runs on the CPU).
    """
    return run_export(
        model,
        args,
        kwargs,
        {
            "dynamic_shapes": dynamic_shapes,
            "opset": opset,
            "filename": filename,
            "external_data": external_data,
            "optimize": optimize,
            "input_names": input_names,
            "output_names": output_names,
            "custom_converters": custom_converters,
            "decompositions": decompositions,
            "strict_dynamic": strict_dynamic,
            "keep_narrowed": keep_narrowed,
            "metadata": metadata,
            "value_info": value_info,
            "durable": durable,
            "progress": progress,
            "weights": weights,
            "export_modules_as_functions": export_modules_as_functions,
            "cast_weights": cast_weights,
            "capture": capture,
            "quantize": quantize,
            "dtype": dtype,
            "keep_io_types": keep_io_types,
        },
        report=report,
        verify=verify,
        verbose=verbose,
    )


def run_export(
    model: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None,
    keywords: dict[str, Any],
    *,
    report: bool | str | os.PathLike[str] = False,
    verify: bool = False,
    verbose: bool = False,
) -> ExportResult:
    """What ``to_onnx`` does, its option keywords (all but report, verify and verbose) in one dict for
    ``ExportOptions.from_keywords``, those left out at to_onnx's defaults. fastonnx.export calls it
    directly, adding ``output_dims`` (its dynamic_axes' names for output dims, given before the write)."""
    if not isinstance(args, tuple):
        raise InputError(f"args must be a tuple of the model's positional inputs, got {type(args).__name__}")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise InputError(f"kwargs must be a dict, got {type(kwargs).__name__}")
    kwargs = dict(kwargs or {})
    args, kwargs = program_inputs(model, args, kwargs)
    filename = keywords.get("filename")
    path = report_path(report, filename, model)
    # the stages followed also without a report: an error outside any node still gets the builder's state
    record = ExportRecord(
        path,
        model,
        args,
        kwargs,
        {
            "opset": keywords.get("opset"),
            "optimize": keywords.get("optimize", True),
            "dynamic_shapes": keywords.get("dynamic_shapes"),
            "filename": filename,
        },
    )
    with sigterm_as_interrupt(), _verbose_logging(verbose), _heap_set_aside():
        try:
            options = ExportOptions.from_keywords(**keywords)
            result = pipeline.run(model, args, kwargs, options, record, verify=verify)
        except Exception as e:
            _explain(e, record, verbose)
            raise
    if record.path is not None:
        record.stage = "done"
        result.stats["report"] = record.write()
        log.info("report written to %s", record.path)
    return result


def _explain(e: Exception, record: ExportRecord, verbose: bool) -> None:
    """A failed export: the builder state on the error (.debug), shown in the message when asked for,
    and the report written, its path at the end of the message."""
    if isinstance(e, (ConversionError, GraphError)):
        # an error outside any node (a refused opset, optimize): the stage, and the graph if one exists
        g = record.builder
        opset = g.opset if g is not None else record.options.get("opset")
        debug.add_dump(e, debug.stage_dump(g, record.stage, opset))
    if verbose or debug.env_enabled():
        debug.show_in_message(e)
    if record.path is None:
        return
    try:
        where = record.write(e)
    except Exception as write_error:  # the report must not hide the export's own error
        e.add_note(f"(the report could not be written to {record.path}: {write_error})")
        return
    if e.args and isinstance(e.args[0], str):
        e.args = (f"{e.args[0]}\n(fastonnx report: {where})", *e.args[1:])
    else:
        e.add_note(f"fastonnx report: {where}")


@contextlib.contextmanager
def _verbose_logging(verbose: bool) -> Iterator[None]:
    """verbose=True: the fastonnx logger at INFO for this call, printing to stderr when no handler of
    the application would show it."""
    if not verbose:
        yield
        return
    previous = log.level
    handler = None if log.hasHandlers() else logging.StreamHandler()
    log.setLevel(logging.INFO)
    if handler is not None:
        handler.setFormatter(logging.Formatter("[%(name)s] %(message)s"))
        log.addHandler(handler)
    try:
        yield
    finally:
        log.setLevel(previous)
        if handler is not None:
            log.removeHandler(handler)


@contextlib.contextmanager
def _heap_set_aside() -> Iterator[None]:
    """The export with the caller's objects out of the garbage collector's sight: gc.freeze() moves
    every object that exists now to the permanent generation, so collections during the export scan
    only what it allocates (in a process holding torch and transformers a full collection triggered by
    importing converter families costs most of a small export: docs/benchmarks.md, job overhead);
    gc.unfreeze() hands them back afterwards. A caller that froze objects itself (a pre-fork server)
    keeps its frozen set untouched: nothing is done then."""
    if gc.get_freeze_count() > 0:
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
