"""Text encoder-decoders the architecture sweep (scripts/architecture_sweep.py) found failing to export
as text2text-generation, each built from the sweep's own tiny config, exported by ``export_pretrained``
and verified against transformers eager:

- EncoderDecoderModel, T5Gemma, T5Gemma 2: composite configs (sizes in ``encoder`` / ``decoder``),
  which the task now reads (task_inputs.seq2seq_sides); EncoderDecoderModel's BERTs bound the lengths
  by their own position tables;
- M2M100, NLLB-MoE (a sinusoidal table grown past its size), LongT5 and PEGASUS-X (blocks of a padded
  length), ProphetNet (one token a step after the past, a position through ``int()``) and LED (chunked
  attention, ``.item()`` branches): forms swapped while torch.export captures
  (capture/seq2seq_shifts.py), each checked against eager here at lengths other than the example's.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable

import pytest
import torch
from checkpoint_folders import architecture_sweep

import fastonnx
from fastonnx.capture.seq2seq_shifts import guard_free_seq2seq_shifts
from fastonnx.pretrained.task_inputs import seq2seq_shape, seq2seq_vocab
from support.matrix import sampled

_sweep = architecture_sweep

EXPORTS = [
    ("text2text-generation", "m2m_100"),
    ("text2text-generation", "nllb-moe"),
    ("text2text-generation", "pegasus_x"),
    ("text2text-generation", "longt5"),
    ("text2text-generation", "prophetnet"),
    ("text2text-generation", "encoder-decoder"),
    ("text2text-generation", "t5gemma"),
    ("text2text-generation", "t5gemma2"),
    ("text2text-generation", "led"),
    ("question-answering", "led"),
]


@pytest.mark.parametrize(
    ("task", "model_type"),
    # in CI: a swapped form (the sinusoidal table) and a composite config
    sampled(
        EXPORTS, lambda case: case[1] == "m2m_100"
    ),  # composite configs: the vision encoder-decoder in CI
)
def test_exports_verified(tmp_path: pathlib.Path, task: str, model_type: str) -> None:
    sweep = _sweep()
    class_name = dict(sweep.architectures(task))[model_type]
    folder = tmp_path / "checkpoint"
    sweep.build_checkpoint(task, model_type, class_name, folder)
    written = fastonnx.export_pretrained(folder, tmp_path / "package", task=task, progress=False)
    assert written.verified is True, written.verify_note


def test_composite_configs_give_the_decoder_cache_and_encoder_width() -> None:
    from transformers import BertConfig, EncoderDecoderConfig, T5GemmaConfig, T5GemmaModuleConfig

    encoder = BertConfig(hidden_size=48, num_attention_heads=4, num_hidden_layers=1, vocab_size=90)
    decoder = BertConfig(hidden_size=32, num_attention_heads=2, num_hidden_layers=3, vocab_size=70)
    config = EncoderDecoderConfig.from_encoder_decoder_configs(encoder, decoder)
    assert seq2seq_shape(config) == (3, 2, 16, 48)
    assert seq2seq_vocab(config) == 70
    module = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}
    gemma = T5GemmaConfig(
        encoder=T5GemmaModuleConfig(num_hidden_layers=1, **module),
        decoder=T5GemmaModuleConfig(num_hidden_layers=2, **module),
        vocab_size=128,
    )
    assert seq2seq_shape(gemma) == (2, 2, 16, 64)  # the key-value heads the cache holds


def _masked_ids(vocab: int, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (2, length), generator=g)
    mask = torch.ones(2, length, dtype=torch.int64)
    mask[1, length // 2 :] = 0
    return ids, mask


def _same_with_forms(run: Callable[[int], torch.Tensor], lengths: tuple[int, ...]) -> None:
    """``run(length)`` (a model's output at that length) equals with the forms swapped in and without."""
    for n in lengths:
        with torch.no_grad():
            expected = run(n)
            with guard_free_seq2seq_shifts():
                got = run(n)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_sinusoidal_positions_match_the_grown_table() -> None:
    """Past the table's 16 positions (eager grows it), with padding tokens and a past length."""
    from transformers.models.m2m_100.modeling_m2m_100 import M2M100SinusoidalPositionalEmbedding

    def run(length: int) -> torch.Tensor:
        table = M2M100SinusoidalPositionalEmbedding(16, 13, padding_idx=1)  # an odd width: a zero column
        ids = torch.randint(2, 50, (2, length), generator=torch.Generator().manual_seed(length))
        ids[1, -3:] = 1
        return torch.cat([table(ids), table(ids, past_key_values_length=5)], dim=1)

    _same_with_forms(run, (4, 16, 40))


def test_longt5_blocks_match_eager() -> None:
    """Blocks of 4 (local radius 3): lengths of whole blocks (the extra padded block) and of a partial one."""
    from transformers import LongT5Config, LongT5EncoderModel

    config = LongT5Config(
        vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, local_radius=3
    )
    torch.manual_seed(0)
    model = LongT5EncoderModel(config).eval()

    def run(length: int) -> torch.Tensor:
        ids, mask = _masked_ids(64, length, length)
        out: torch.Tensor = model(input_ids=ids, attention_mask=mask).last_hidden_state
        return out

    _same_with_forms(run, (4, 8, 10, 13))


def test_pegasus_x_blocks_match_eager() -> None:
    """Blocks of 4 with staggered layers: whole and partial blocks, a padded row."""
    from transformers import PegasusXConfig, PegasusXModel

    config = PegasusXConfig(
        vocab_size=64,
        d_model=32,
        encoder_layers=2,
        decoder_layers=1,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        block_size=4,
        num_global_tokens=2,
        stagger_local_blocks=True,
    )
    torch.manual_seed(0)
    encoder = PegasusXModel(config).eval().get_encoder()

    def run(length: int) -> torch.Tensor:
        ids, mask = _masked_ids(64, length, length)
        out: torch.Tensor = encoder(input_ids=ids, attention_mask=mask).last_hidden_state
        return out

    _same_with_forms(run, (4, 8, 11))


def test_led_dense_attention_matches_eager_with_global_tokens() -> None:
    """LED's windowed attention (window 4) at lengths off the window, with and without global tokens."""
    from transformers import LEDConfig, LEDModel

    config = LEDConfig(
        vocab_size=64,
        d_model=32,
        encoder_layers=2,
        decoder_layers=1,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        attention_window=4,
        max_encoder_position_embeddings=64,
    )
    torch.manual_seed(0)
    encoder = LEDModel(config).eval().get_encoder()

    def run(length: int, globals_: bool) -> torch.Tensor:
        ids, mask = _masked_ids(64, length, length)
        marked = torch.zeros_like(mask)
        if globals_:
            marked[:, 0] = 1
            marked[0, length - 2] = 1
        out: torch.Tensor = encoder(
            input_ids=ids, attention_mask=mask, global_attention_mask=marked
        ).last_hidden_state
        return out

    _same_with_forms(lambda n: run(n, False), (5, 8, 13))
    _same_with_forms(lambda n: run(n, True), (5, 8, 13))


def test_prophetnet_step_position_follows_the_past() -> None:
    """The position after a past of p tokens is padding_idx + p + 1, as eager's ``int()`` makes it."""
    from transformers import DynamicCache, ProphetNetConfig
    from transformers.models.prophetnet.modeling_prophetnet import ProphetNetPositionalEmbeddings

    config = ProphetNetConfig(hidden_size=8, max_position_embeddings=32, pad_token_id=0)
    torch.manual_seed(0)
    table = ProphetNetPositionalEmbeddings(config)

    def run(past: int) -> torch.Tensor:
        cache = DynamicCache()
        cache.update(torch.zeros(1, 2, past, 4), torch.zeros(1, 2, past, 4), 0)
        embedded, positions = table((1, 1), torch.device("cpu"), past_key_values=cache)
        return torch.cat([embedded.flatten(), positions.flatten().float()])

    _same_with_forms(run, (1, 5, 20))
