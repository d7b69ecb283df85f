"""The architecture sweep's (scripts/architecture_sweep.py) pieces for HiggsAudioV2ForConditionalGeneration:
its eager check (``generate``, greedy, from a prompt ending on the audio bos token, as the processor's chat
template ends it) and the second tiny checkpoint its text-to-audio package needs: an audio tokenizer whose
decode matches the model's codebooks, in a folder beside the model's, named by its processor_config.json
(pretrained/higgs_audio_stages.py)."""

from __future__ import annotations

import pathlib
from typing import Any

CLASS = "HiggsAudioV2ForConditionalGeneration"

SAMPLE_RATE, HOP = 1600, 16  # 100 frames a second, 16 samples a frame (a DAC decoder upsampling 4 x 4)


def generate_check(model: Any) -> None:
    """``generate`` on a few text tokens and the audio bos token, a few frames."""
    import torch

    config = model.config
    ids = torch.randint(3, 20, (1, 6), generator=torch.Generator().manual_seed(0))
    ids = torch.cat([ids, torch.tensor([[int(config.audio_bos_token_id)]])], dim=1)
    model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=12)


def tokenizer_config(model_config: Any) -> Any:
    """A tiny HiggsAudioV2TokenizerConfig decoding the model's codes: as many quantizers as its codebooks
    (``num_quantizers`` comes from the bandwidth: codebooks x frame rate x bits a code), as many codes as
    precede its stream bos."""
    import math

    from transformers import HiggsAudioV2TokenizerConfig

    books, codes = int(model_config.num_codebooks), int(model_config.audio_stream_bos_id)
    bits = math.ceil(math.log2(codes))
    return HiggsAudioV2TokenizerConfig(
        sample_rate=SAMPLE_RATE,
        target_bandwidths=[books * (SAMPLE_RATE // HOP) * bits / 1000],
        codebook_size=codes,
        codebook_dim=8,
        acoustic_model_config={
            "encoder_hidden_size": 4,
            "downsampling_ratios": [4, 4],
            "decoder_hidden_size": 16,
            "upsampling_ratios": [4, 4],
            "hidden_size": 8,
        },
        semantic_model_config={
            "hidden_size": 8,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "intermediate_size": 16,
            "num_conv_pos_embedding_groups": 2,
            "conv_dim": [8] * 7,
        },
    )


def save_audio_tokenizer(model: Any, folder: pathlib.Path) -> None:
    """The tiny audio tokenizer beside ``model``'s checkpoint in ``folder``: its decode's weights (code
    vectors drawn: transformers starts them at zero, where every code decodes alike)."""
    import torch

    from fastonnx.pretrained.higgs_audio_stages import TokenizerDecode, save_tokenizer_decode

    if type(model).__name__ != CLASS:
        return
    torch.manual_seed(0)
    decode = TokenizerDecode(tokenizer_config(model.config))
    with torch.no_grad():
        for quantizer in decode.quantizer.quantizers:
            quantizer.codebook.embed.normal_()
    save_tokenizer_decode(decode, folder)
