"""text-to-audio of MusicgenForConditionalGeneration (pretrained/audio_code_loops.py): transformers'
``generate`` as a text encoder, a merged decoder step with its self- and cross-attention cache and
EnCodec's decode, the loop (delay pattern, classifier-free guidance) the runtime's; verified by that loop
over onnxruntime against ``generate(do_sample=False)`` at guidance 1 and the generation config's 3.
MusicgenMelodyForConditionalGeneration (pretrained/melody_code_loops.py) likewise, its conditioning a
prefix (the chroma's rows and the text's) prepended on the first step, with and without a melody.

The tiny model's decoder is drawn at a larger scale (``initializer_factor`` 1) than transformers' 0.02, so
its codes depend on the text and on the guidance (at 0.02 every row generates the same codes)."""

from __future__ import annotations

from typing import Any

import onnx
import onnxruntime as ort
import pytest
import torch

import fastonnx
from fastonnx.pretrained import audio_code_loops as loops
from fastonnx.pretrained import melody_code_loops as melody_loops
from fastonnx.pretrained.package_check import _run
from fastonnx.pretrained.tasks import choose
from support.matrix import sampled
from support.module_sessions import run_module

CODES = 32  # the decoder's vocabulary: EnCodec's codebook; its pad / start token the extra row past it


def _tiny_model(channels: int = 1, melody: bool = False) -> Any:
    import transformers
    from transformers import EncodecConfig, T5Config

    kind = "MusicgenMelody" if melody else "Musicgen"

    text = T5Config(
        vocab_size=40,
        d_model=24,
        d_kv=8,
        d_ff=32,
        num_layers=1,
        num_heads=2,
        relative_attention_num_buckets=8,
    )
    # 4 codebooks: EnCodec's quantizers for its largest bandwidth (1000 * 8 // (200 frames/s * 10))
    audio = EncodecConfig(
        hidden_size=16,
        num_filters=4,
        num_residual_layers=1,
        upsampling_ratios=[2, 2],
        codebook_size=CODES,
        codebook_dim=16,
        num_lstm_layers=1,
        sampling_rate=800,
        target_bandwidths=[8.0],
    )
    decoder = getattr(transformers, f"{kind}DecoderConfig")(
        vocab_size=CODES,
        hidden_size=16,  # narrower than the text encoder's 24: MusicGen projects its states
        num_hidden_layers=2,
        num_attention_heads=2,
        ffn_dim=32,
        num_codebooks=4 * channels,
        audio_channels=channels,
        max_position_embeddings=64,
        initializer_factor=1.0,
        pad_token_id=CODES,
        bos_token_id=CODES,
    )
    # Melody's chroma of 12 pitch classes, its prefix 6 rows (chroma_length; 235 in musicgen-melody)
    chroma = {"num_chroma": 12, "chroma_length": 6} if melody else {}
    config = getattr(transformers, f"{kind}Config")(
        **chroma,
        text_encoder=text.to_dict(),
        audio_encoder=audio.to_dict(),
        decoder=decoder.to_dict(),
        pad_token_id=CODES,
        bos_token_id=CODES,
        decoder_start_token_id=CODES,
    )
    torch.manual_seed(0)
    model = getattr(transformers, f"{kind}ForConditionalGeneration")(config).eval()
    model.generation_config.guidance_scale = 3.0  # musicgen-small's generation_config.json
    return model


CLASSES = {
    "musicgen": "MusicgenForConditionalGeneration",
    "musicgen_melody": "MusicgenMelodyForConditionalGeneration",
}


@pytest.mark.parametrize("model_type", CLASSES)
def test_auto_takes_musicgen_to_text_to_audio(model_type: str) -> None:
    task, chosen = choose({"model_type": model_type, "architectures": [CLASSES[model_type]]}, "auto")
    assert (task.name, chosen) == ("text-to-audio", CLASSES[model_type])


@pytest.mark.parametrize("channels", [1, 2])
@pytest.mark.parametrize("length", [2, 6, 7, 9, 12])
def test_delay_pattern_is_transformers(channels: int, length: int) -> None:
    from transformers import MusicgenDecoderConfig, MusicgenForCausalLM

    config = MusicgenDecoderConfig(
        vocab_size=CODES, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, ffn_dim=8,
        num_codebooks=4 * channels, audio_channels=channels,
    )  # fmt: skip
    decoder = MusicgenForCausalLM(config)
    start = torch.full((2 * 4 * channels, 1), CODES)
    _, want = decoder.build_delay_pattern_mask(start, pad_token_id=CODES, max_length=length)
    got = loops.delay_pattern(4 * channels, channels, length, CODES).repeat(2, 1)
    assert torch.equal(got, want)


def _modules_as_sessions(model: Any) -> tuple[dict[str, Any], Any]:
    """The three graphs' modules, run as the check runs sessions."""
    step = loops.DecoderStep(model)
    sessions = {
        loops.TEXT_ENCODER_FILE: loops.TextEncoder(model),
        loops.DECODER_FILE: lambda *t: step(*t[:3], list(t[3:])),
        loops.DECODE_FILE: loops.CodecDecode(model),
    }
    return sessions, run_module


# 8 new tokens: the delay pattern applies (9 columns >= 2 * 4 - 1); 3: it does not (transformers then
# generates every codebook from the first column); the package's check runs 8 at guidance 1 and 3
@pytest.mark.parametrize(("new_tokens", "guidance"), [(3, 1.0), (8, 3.0)])
def test_step_loop_is_generate(new_tokens: int, guidance: float) -> None:
    model = _tiny_model()
    ids, mask = loops.check_inputs(model)
    sessions, run = _modules_as_sessions(model)
    _, codes, audio = loops.generated_by_sessions(sessions, run, model, ids, mask, new_tokens, guidance)
    with torch.no_grad(), loops.recorded_codes(model) as seen:
        want = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=False,
            guidance_scale=guidance,
            max_new_tokens=new_tokens,
        )
    assert torch.equal(codes, seen[-1])
    assert not torch.equal(codes[0, 0], codes[0, 1])  # the two texts' codes differ
    torch.testing.assert_close(audio, want)


def test_stereo_step_loop_is_generate() -> None:
    # 8 codebooks, left and right interleaved: the pattern delays them in pairs, EnCodec decodes each half
    model = _tiny_model(channels=2)
    ids, mask = loops.check_inputs(model)
    sessions, run = _modules_as_sessions(model)
    _, codes, audio = loops.generated_by_sessions(sessions, run, model, ids, mask, 8, 3.0)
    with torch.no_grad(), loops.recorded_codes(model) as seen:
        want = model.generate(
            input_ids=ids, attention_mask=mask, do_sample=False, guidance_scale=3.0, max_new_tokens=8
        )
    assert torch.equal(codes, torch.cat(seen[-2:], dim=2)[:, :, [0, 4, 1, 5, 2, 6, 3, 7]])
    assert audio.shape[1] == 2
    torch.testing.assert_close(audio, want)


def _melody_modules_as_sessions(model: Any) -> tuple[dict[str, Any], Any]:
    step = melody_loops.MelodyStep(model)
    sessions = {
        melody_loops.TEXT_ENCODER_FILE: melody_loops.text_encoder(model),
        melody_loops.CHROMA_FILE: melody_loops.ChromaPrefix(model),
        melody_loops.DECODER_FILE: lambda *t: step(*t[:2], list(t[2:])),
        melody_loops.DECODE_FILE: loops.CodecDecode(model),
    }
    return sessions, _modules_as_sessions(model)[1]


@pytest.mark.parametrize(("melody", "guidance"), [(False, 1.0), (True, 3.0)])
def test_melody_step_loop_is_generate(melody: bool, guidance: float) -> None:
    model = _tiny_model(melody=True)
    inputs = melody_loops.check_inputs(model)
    if not melody:  # transformers' null chroma
        del inputs["input_features"]
    sessions, run = _melody_modules_as_sessions(model)
    _, codes, audio = melody_loops.generated_by_sessions(sessions, run, model, inputs, 8, guidance)
    with torch.no_grad(), loops.recorded_codes(model) as seen:
        want = model.generate(**inputs, do_sample=False, guidance_scale=guidance, max_new_tokens=8)
    assert torch.equal(codes, seen[-1])
    assert not torch.equal(codes[0, 0], codes[0, 1])
    torch.testing.assert_close(audio, want)


@pytest.mark.parametrize("frames", [4, 9])
def test_chroma_prefix_is_transformers(frames: int) -> None:
    # transformers repeats the frames up to chroma_length (6) rows and truncates: also past it
    model = _tiny_model(melody=True)
    features = torch.randn(2, frames, 12, generator=torch.Generator().manual_seed(frames))
    ids, mask = loops.check_inputs(model)
    with torch.no_grad():
        out = model(
            input_ids=ids, attention_mask=mask, input_features=features, decoder_input_ids=ids.new_zeros(8, 1)
        )
        got = melody_loops.ChromaPrefix(model)(features)
    torch.testing.assert_close(got, out.encoder_hidden_states[:, :6])


# CI: MusicGen's package; MusicGen Melody's (four files) under FASTONNX_FULL_MATRIX=1 (its modules' loop is
# compared with generate in CI above)
@pytest.fixture(scope="module", params=sampled(["musicgen", "musicgen_melody"], lambda t: t == "musicgen"))
def package(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any, str]:
    tmp = tmp_path_factory.mktemp(request.param)
    model = _tiny_model(melody=request.param == "musicgen_melody")
    model.save_pretrained(tmp / "checkpoint")
    written = fastonnx.export_pretrained(
        tmp / "checkpoint", tmp / "package", task="text-to-audio", progress=False
    )
    return written, model, request.param


def test_musicgen_package_is_verified(package: tuple[Any, Any, str]) -> None:
    written, _, model_type = package
    assert written.verified is True, written.verify_note
    report = written.report_path.read_text()
    graph = onnx.load(str(written.outdir / loops.DECODER_FILE), load_external_data=False).graph
    if model_type == "musicgen_melody":
        assert (
            "audio codes (melody, guidance 3)" in report and "audio_values (no melody, guidance 1)" in report
        )
        want = [*melody_loops.STEP_INPUTS, "past_key_values.0.key", "past_key_values.0.value"]
        assert [i.name for i in graph.input][:4] == want
        assert melody_loops.CHROMA_FILE in written.files
        return
    assert "audio codes (guidance 3)" in report and "audio_values (guidance 1)" in report
    names = [f"past_key_values.0.{side}.{kv}" for side in ("decoder", "encoder") for kv in ("key", "value")]
    assert [i.name for i in graph.input][:7] == [*loops.STEP_INPUTS, *names]
    assert [o.name for o in graph.output][:2] == ["logits", "present.0.decoder.key"]
    assert {loops.TEXT_ENCODER_FILE, loops.DECODE_FILE} <= set(written.files)


@pytest.mark.parametrize("perturbed", [loops.DECODER_FILE, loops.DECODE_FILE])
def test_musicgen_check_fails_on_a_wrong_session(package: tuple[Any, Any, str], perturbed: str) -> None:
    written, model, model_type = package
    melody = model_type == "musicgen_melody"
    files = [melody_loops.CHROMA_FILE] if melody else []
    sessions = {
        name: ort.InferenceSession(str(written.outdir / name), providers=["CPUExecutionProvider"])
        for name in (loops.TEXT_ENCODER_FILE, loops.DECODER_FILE, loops.DECODE_FILE, *files)
    }

    def run(session: Any, names: list[str], tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        out = _run(session, names, tensors)
        if session is sessions[perturbed]:
            # a decoder favouring code 0 of every codebook; audio off by 1e-3
            wrong = torch.nn.functional.one_hot(torch.tensor(0), CODES) * 100
            out[0] = out[0] + (wrong if perturbed == loops.DECODER_FILE else 1e-3)
        return out

    check = melody_loops.check_package if melody else loops.check_package
    infos = check(sessions, model, {}, run, lambda e: (None, None))
    failed = {i.name for i in infos if not i.passed}
    cases = ["no melody, ", "melody, "] if melody else [""]
    codes = {f"audio codes ({case}guidance {g})" for case in cases for g in (1, 3)}
    audio = {f"audio_values ({case}guidance {g})" for case in cases for g in (1, 3)}
    if perturbed == loops.DECODER_FILE:
        assert codes <= failed
    else:
        assert failed == audio
