"""feature-extraction of the audio base models whose forward reads more than ``input_features``, each built
from the architecture sweep's tiny config, exported by ``export_pretrained`` and verified against
transformers eager (a batch of 2 prompts, the last audio padded where the model reads a mask):

- audio-language base models (audio_base_models.py): their prompts hold the audio placeholder tokens
  their processor writes for the audios' frames ("embedding(): argument 'indices' must be Tensor, not
  NoneType" with the features alone);
- transducers: their features and one step of the prediction network's ids; Nemotron ASR's frames
  bounded where its position encoding raises;
- CTC heads transformers lists as base models: their logits ("returned no 'last_hidden_state'");
- Granite Speech 5: frames as wide as its first linear layer reads (4 x its mel bins);
- FunASR-Nano's encoder: frames of 7 stacked mel frames (its low-frame-rate frontend's), its mask, the
  frames bounded by its position table.
"""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
import torch
from checkpoint_folders import architecture_sweep, export_swept

from fastonnx.pretrained import audio_base_models as abm
from fastonnx.pretrained import audio_language as al
from fastonnx.pretrained.encoder_tasks import ctc_outputs
from fastonnx.pretrained.frame_widths import first_layer_width
from fastonnx.pretrained.meta_init import build_on_meta
from support.matrix import sampled

TASK = "feature-extraction"
FIXED = {
    # audio-language base models: a Whisper-style tower of fixed frames...
    "voxtral": "VoxtralModel",
    "qwen2_audio": "Qwen2AudioModel",  # ...with the frames' mask as feature_attention_mask
    # frames of any number and their mask; whole blocks of frames
    "audioflamingo3": "AudioFlamingo3Model",
    "glmasr": "GlmAsrModel",
    "qwen3_asr": "Qwen3ASRModel",
    "musicflamingo": "MusicFlamingoModel",  # its audio tower reads the prompt too
    "moss_transcribe_diarize": "MossTranscribeDiarizeModel",  # padding_mask passed as None
    "granite_speech": "GraniteSpeechModel",  # frames first, no mask
    "granite_speech_plus": "GraniteSpeechPlusModel",
    # transducers
    "parakeet_rnnt": "ParakeetForRNNT",
    "parakeet_tdt": "ParakeetForTDT",
    "nemotron_asr_streaming": "NemotronAsrStreamingForRNNT",
    "nemotron3_5_asr": "Nemotron3_5AsrForRNNT",  # and its language prompt_ids
    # CTC heads in MODEL_MAPPING
    "parakeet_ctc": "ParakeetForCTC",
    "lasr_ctc": "LasrForCTC",
    # an encoder alone with its frames' mask: FunASR-Nano's, 7 stacked mel frames a frame, bounded by its
    # position table
    "fun_asr_nano_encoder": "FunAsrNanoEncoder",
}


def _tiny(model_type: str, class_name: str) -> tuple[Any, Any]:
    import transformers

    sweep = architecture_sweep()
    cls = getattr(transformers, class_name)
    config = sweep._model_config(cls, sweep.tiny_config(model_type))
    return cls, config


@pytest.mark.parametrize("model_type", sampled(FIXED, lambda name: name == "glmasr"))
def test_exported_and_verified(tmp_path: pathlib.Path, model_type: str) -> None:
    written = export_swept(tmp_path, TASK, model_type, FIXED[model_type])
    assert written.verified is True, written.verify_note


def test_prompts_hold_the_rows_of_their_audios() -> None:
    """Each prompt holds as many audio tokens as the model makes rows of its audios (the first prompt's
    two, the last audio padded), and transformers' forward merges them: the placeholder check passes."""
    cls, config = _tiny("glmasr", "GlmAsrModel")
    config.audio_token_id = int(config.text_config.vocab_size) - 1  # in the tiny vocabulary
    torch.manual_seed(0)
    model = cls(config).eval()
    inputs = abm.base_inputs(model, config, 2, "cpu")
    assert inputs["input_features"].shape[0] == 3  # the audios are not the prompts
    tokens = (inputs["input_ids"] == al.audio_token_id(config)).sum(-1)
    with torch.no_grad():
        rows = [
            al.audio_features(
                model, input_features=inputs["input_features"][i], input_features_mask=inputs[al.MASK][i]
            ).shape[0]
            for i in ([0, 1], [2])
        ]
        out = model(**inputs)
    assert tokens.tolist() == rows and rows[1] < rows[0] / 2  # the last audio padded
    assert out.last_hidden_state.shape[:2] == inputs["input_ids"].shape


def test_nemotron_frames_end_where_its_position_encoding_raises() -> None:
    """The graph's frames stop at the most the encoder's subsampling turns into max_position_embeddings
    frames: eager runs there, and raises one frame further."""
    cls, config = _tiny("nemotron_asr_streaming", "NemotronAsrStreamingForRNNT")
    meta = build_on_meta(lambda: cls(config))
    most = abm.base_graph(meta, config).dynamic_shapes["input_features"][1].max
    limit = int(config.encoder_config.max_position_embeddings)
    lengths = meta.encoder._get_subsampling_output_length
    assert int(lengths(torch.tensor(most))) <= limit < int(lengths(torch.tensor(most + 1)))
    parakeet_cls, parakeet_config = _tiny("parakeet_rnnt", "ParakeetForRNNT")
    parakeet = build_on_meta(lambda: parakeet_cls(parakeet_config))  # holds the number, reads it nowhere
    assert abm.base_graph(parakeet, parakeet_config).dynamic_shapes["input_features"][1].max == 1 << 20


def test_frame_width_is_the_first_linear_layer_over_the_features() -> None:
    cls, config = _tiny("granite_speech5_ctc", "GraniteSpeech5ForCTC")
    meta = build_on_meta(lambda: cls(config))
    assert first_layer_width(meta) == 4 * int(config.encoder_config.num_mel_bins)
    cls, config = _tiny("lasr_ctc", "LasrForCTC")  # agrees with the config
    assert first_layer_width(build_on_meta(lambda: cls(config))) == int(config.encoder_config.num_mel_bins)


def test_only_ctc_heads_return_their_logits() -> None:
    ctc_cls, ctc_config = _tiny("parakeet_ctc", "ParakeetForCTC")
    assert ctc_outputs(build_on_meta(lambda: ctc_cls(ctc_config)), TASK) == ("logits",)
    assert ctc_outputs(build_on_meta(lambda: ctc_cls(ctc_config)), "automatic-speech-recognition") == ()
    vlm_cls, vlm_config = _tiny("fuyu", "FuyuModel")  # declares its language model's logits: not CTC
    assert ctc_outputs(build_on_meta(lambda: vlm_cls(vlm_config)), TASK) == ()
