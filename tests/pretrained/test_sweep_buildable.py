"""Architectures the architecture sweep (scripts/architecture_sweep.py) listed as "not buildable" because of
its own tiny-config maker, not because transformers cannot run them (issue 42): sizes the generic shrinking
left inconsistent or full size (HGNetV2's and PP-LCNetV4's stage widths, Gemma 3's pooling to 256 tokens
from 4 x 4 patches, LeViT's fixed 16-pixel patches, LayoutLMv3's 2-D embeddings), values the config classes
leave None that checkpoints set (Chameleon's vocabulary map, PP-OCR's intra-class blocks, Sapiens2's heads),
and inputs the eager check did not feed (LLaVA-NeXT's anyres tiles, BROS's boxes, Longformer's global
attention). The overrides live in scripts/tiny_config_fixes.py.

Each is built by the sweep's own ``build_checkpoint`` (its tiny config, one eager forward in transformers);
those whose export then passes are exported by ``export_pretrained`` and verified against transformers eager.
"""

from __future__ import annotations

import pathlib

import pytest
import torch
from checkpoint_folders import architecture_sweep

import fastonnx
from fastonnx.pretrained.encoder_tasks import image_inputs
from support.matrix import sampled

# (task, model type): "not buildable" before, built now
BUILT = [
    ("image-text-to-text", "gemma3"),
    ("image-text-to-text", "shieldgemma2"),
    ("image-text-to-text", "chameleon"),
    ("image-text-to-text", "emu3"),
    ("image-text-to-text", "janus"),
    ("image-text-to-text", "deepseek_ocr2"),
    ("image-text-to-text", "perception_lm"),
    ("image-text-to-text", "cosmos3_edge"),
    ("image-text-to-text", "glm5_next"),
    ("image-text-to-text", "molmo2"),
    ("image-text-to-text", "muse_spark"),
    ("image-text-to-text", "glmga"),
    ("image-text-to-text", "t5gemma2"),
    ("image-text-to-text", "llava_next"),
    ("image-text-to-text", "llava_next_video"),
    ("image-text-to-text", "granite4_vision"),
    ("image-text-to-text", "fuyu"),
    ("object-detection", "d_fine"),
    ("object-detection", "deimv2"),
    ("object-detection", "lw_detr"),
    ("object-detection", "pp_doclayout_v2"),
    ("object-detection", "pp_doclayout_v3"),
    ("object-detection", "pp_doclayout_v4"),
    ("object-detection", "pp_ocrv5_server_det"),
    ("object-detection", "pp_ocrv6_medium_det"),
    ("object-detection", "pp_ocrv6_small_det"),
    ("image-classification", "bit"),
    ("image-classification", "efficientnet"),
    ("image-classification", "hgnet_v2"),
    ("image-classification", "levit"),
    ("image-classification", "mobilevitv2"),
    ("image-classification", "swinv2"),
    ("image-classification", "textnet"),
    ("image-classification", "timm_wrapper"),
    ("zero-shot-image-classification", "align"),
    ("semantic-segmentation", "beit"),
    ("semantic-segmentation", "dpt"),
    ("semantic-segmentation", "mobilevitv2"),
    ("semantic-segmentation", "sapiens2"),
    ("keypoint-detection", "sapiens2"),
    ("depth-estimation", "chmv2"),
    ("depth-estimation", "depth_pro"),
    ("depth-estimation", "dpt"),
    ("masked-im", "swin"),
    ("masked-im", "swinv2"),
    ("text-classification", "layoutlmv3"),
    ("token-classification", "layoutlmv3"),
    ("question-answering", "layoutlmv3"),
    ("text-classification", "lilt"),
    ("token-classification", "lilt"),
    ("question-answering", "lilt"),
    ("token-classification", "bros"),
    ("question-answering", "longformer"),
    ("multiple-choice", "longformer"),
    ("question-answering", "lxmert"),
    ("feature-extraction", "autoformer"),
    ("feature-extraction", "bark"),
    ("feature-extraction", "vjepa2"),
    ("feature-extraction", "mimi_decoder"),
    ("feature-extraction", "csm"),
    ("feature-extraction", "sam2"),
    ("feature-extraction", "sam2_video"),
    ("feature-extraction", "pe_audio"),
    ("feature-extraction", "pe_video_encoder"),
    ("feature-extraction", "xcodec2"),
    ("feature-extraction", "vibevoice_asr"),
    ("feature-extraction", "nemo_speechlm"),
    ("feature-extraction", "diffusion_gemma"),
    ("feature-extraction", "mgp-str"),
    ("feature-extraction", "qwen3_vl_vision"),  # its forward's grid_thw: not run by the eager check
    ("image-segmentation", "eomt"),
    ("image-segmentation", "eomt_dinov3"),
    ("image-segmentation", "detr"),
    ("text-generation", "gemma3n"),
    ("image-text-to-text", "gemma3n"),
    ("image-text-to-text", "fast_vlm"),
    ("image-text-to-text", "ernie4_5_vl_moe"),
    ("image-text-to-text", "dots3_note"),  # its tower's image_grid_thw: not run by the eager check
    ("image-classification", "shieldgemma2"),
    ("automatic-speech-recognition", "moonshine_streaming"),
    ("automatic-speech-recognition", "dia"),
    ("time-series-forecasting", "timesfm"),
    ("time-series-forecasting", "timesfm2_5"),
    ("zero-shot-object-detection", "omdet-turbo"),
    # a codec's waveform: batch x channels x samples (frame_widths.waveform_channels)
    ("feature-extraction", "dac"),
    ("feature-extraction", "encodec"),
    ("feature-extraction", "mimi"),
    ("feature-extraction", "mimi_encoder"),
    ("feature-extraction", "xcodec"),
    ("feature-extraction", "pocket_tts_audio_tokenizer"),
    ("feature-extraction", "pocket_tts_audio_tokenizer_encoder"),
    ("feature-extraction", "vibevoice_acoustic_tokenizer"),
    ("feature-extraction", "pe_audio_encoder"),
    ("feature-extraction", "sam"),
    ("feature-extraction", "sam_hq"),
    ("feature-extraction", "sam3"),
    ("feature-extraction", "sam3_lite_text"),
    ("feature-extraction", "sam3_tracker"),
    ("feature-extraction", "edgetam"),
    ("feature-extraction", "edgetam_vision_model"),
    ("feature-extraction", "edgetam_video"),
    ("feature-extraction", "flava"),
    ("feature-extraction", "glmasr_encoder"),
    ("feature-extraction", "audioflamingo3_encoder"),
    ("feature-extraction", "voxtral_realtime_encoder"),
    ("feature-extraction", "muse_spark_audio"),
    ("feature-extraction", "uvdoc"),
    ("feature-extraction", "tvp"),
    ("feature-extraction", "t5gemma2_encoder"),
    ("feature-extraction", "kosmos-2"),
    ("feature-extraction", "efficientloftr"),
    ("feature-extraction", "lightglue"),
    ("feature-extraction", "pe_audio_video_encoder"),
    ("feature-extraction", "udop"),
    ("feature-extraction", "clap"),
    ("feature-extraction", "idefics"),
]

# built and exported, verified against transformers eager
EXPORTED = [
    ("image-text-to-text", "gemma3"),
    ("image-text-to-text", "chameleon"),
    ("image-text-to-text", "glmga"),
    ("image-classification", "hgnet_v2"),
    ("image-classification", "mobilevitv2"),
    ("image-classification", "swinv2"),
    ("image-classification", "textnet"),
    ("image-classification", "timm_wrapper"),
    ("object-detection", "pp_ocrv5_server_det"),
    ("object-detection", "pp_ocrv6_small_det"),
    ("object-detection", "pp_ocrv6_medium_det"),
    ("semantic-segmentation", "beit"),
    ("semantic-segmentation", "dpt"),
    ("semantic-segmentation", "sapiens2"),
    ("depth-estimation", "chmv2"),
    ("image-classification", "bit"),
    ("image-classification", "efficientnet"),
    ("image-classification", "levit"),
    ("zero-shot-image-classification", "align"),
    ("object-detection", "lw_detr"),
    ("semantic-segmentation", "mobilevitv2"),
    ("keypoint-detection", "sapiens2"),
    ("masked-im", "swin"),
    ("masked-im", "swinv2"),
    ("depth-estimation", "dpt"),
    ("text-classification", "layoutlmv3"),
    ("token-classification", "layoutlmv3"),
    ("question-answering", "layoutlmv3"),
    ("text-classification", "lilt"),
    ("token-classification", "lilt"),
    ("question-answering", "lilt"),
    # their encoders' top-k scores spread apart by the sweep's tiny config (architecture_sweep.py)
    ("object-detection", "d_fine"),
    ("object-detection", "deimv2"),
    ("object-detection", "pp_doclayout_v3"),
    ("object-detection", "pp_doclayout_v4"),
    ("feature-extraction", "sam2_hiera_det_model"),
    ("feature-extraction", "sam2_vision_model"),
    ("feature-extraction", "cosmos3_edge_text"),
    ("feature-extraction", "hunyuan_vl_text"),
    ("image-segmentation", "detr"),
    ("text-generation", "gemma3n"),
    ("image-text-to-text", "gemma3n"),
    ("image-text-to-text", "fast_vlm"),
    ("feature-extraction", "pe_audio_encoder"),
    ("feature-extraction", "edgetam"),
    ("feature-extraction", "edgetam_vision_model"),
    ("feature-extraction", "flava"),
    ("feature-extraction", "glmasr_encoder"),
    ("feature-extraction", "audioflamingo3_encoder"),
    ("feature-extraction", "muse_spark_audio"),
    ("feature-extraction", "uvdoc"),
    ("feature-extraction", "t5gemma2_encoder"),
    ("feature-extraction", "kosmos-2"),
    ("feature-extraction", "udop"),
    ("feature-extraction", "clap"),
    ("feature-extraction", "idefics"),
    ("feature-extraction", "vibevoice_acoustic_tokenizer"),  # a codec's latents (CODEC_OUTPUTS)
    ("feature-extraction", "sam"),  # its image embeddings (encoder_tasks.embeds_images)
    ("feature-extraction", "sam3_tracker"),  # a level an image embedding (tuple_outputs.tuple_count)
    ("feature-extraction", "sam_hq"),  # with its intermediate embeddings
    ("feature-extraction", "sam2_video"),  # a video tracker: a frame's image embeddings
    ("feature-extraction", "sam3_tracker_video"),
    ("feature-extraction", "fastspeech2_conformer"),  # its text encoder's states
    ("feature-extraction", "seggpt"),  # an image beside its in-context prompt (72 s)
    # codecs' encodings at any length (test_codec_encodings.py): their encode, padding forms
    ("feature-extraction", "mimi"),
    ("feature-extraction", "mimi_encoder"),
    ("feature-extraction", "pocket_tts_audio_tokenizer"),
    ("feature-extraction", "pocket_tts_audio_tokenizer_encoder"),
    ("feature-extraction", "encodec"),
    ("feature-extraction", "dac"),
    ("feature-extraction", "xcodec"),  # in whole hops (encoder_tasks.WHOLE_HOP_CODECS)
    ("feature-extraction", "xcodec2"),  # its semantic model's frames beside the waveform
    ("feature-extraction", "neucodec"),
    # SigLIP 2's NaFlex patches (naflex_images.py; test_naflex_towers.py runs other shapes)
    ("image-classification", "siglip2"),
    ("feature-extraction", "siglip2"),
    # VideoPrism's clips and BLIP-2 retrieval's image-token prompts in zero-shot classification
    ("zero-shot-image-classification", "videoprism"),
    ("zero-shot-image-classification", "blip-2"),
    ("question-answering", "lxmert"),  # its answer scores (encoder_tasks.FALLBACK_OUTPUTS)
    ("feature-extraction", "decision_transformer"),  # its trajectories (and a CI test below)
    ("feature-extraction", "mgp-str"),  # its three heads' logits (tuple_outputs.SCENE_TEXT_HEADS)
    ("feature-extraction", "kyutai_speech_to_text"),  # ids pairing text and codes (paired_columns)
    ("feature-extraction", "voxtral_realtime"),  # a prompt and its audio (streamed_audio_steps.bare_graph)
    ("feature-extraction", "efficientloftr"),  # its coarse and residual maps (tuple_outputs.tuple_count)
]


def _class_name(task: str, model_type: str) -> str:
    return dict(architecture_sweep().architectures(task))[model_type]


@pytest.mark.parametrize(
    ("task", "model_type"),
    # CI: a stage-width table (HGNetV2) and a composite's pooling (Gemma 3), each a second or two
    sampled(
        BUILT, lambda case: case in {("image-classification", "hgnet_v2"), ("image-text-to-text", "gemma3")}
    ),
    ids=lambda value: str(value),
)
def test_the_tiny_config_builds_and_runs_in_transformers(
    tmp_path: pathlib.Path, task: str, model_type: str
) -> None:
    sweep = architecture_sweep()
    params = sweep.build_checkpoint(task, model_type, _class_name(task, model_type), tmp_path / "checkpoint")
    assert 0 < params <= sweep.MAX_PARAMS
    assert (tmp_path / "checkpoint" / "config.json").is_file()


@pytest.mark.parametrize(
    ("task", "model_type"),
    sampled(EXPORTED, lambda case: case == ("object-detection", "pp_ocrv6_small_det")),
    ids=lambda value: str(value),
)
def test_the_newly_built_architecture_exports_verified(
    tmp_path: pathlib.Path, task: str, model_type: str
) -> None:
    folder = tmp_path / "checkpoint"
    architecture_sweep().build_checkpoint(task, model_type, _class_name(task, model_type), folder)
    written = fastonnx.export_pretrained(folder, tmp_path / "package", task=task, progress=False)
    assert written.verified is True, written.verify_note


def test_an_encoder_decoders_image_is_its_encoder_towers_size() -> None:
    """T5Gemma 2's vision tower is its encoder's (config.encoder.vision_config): its images are that
    tower's size, not the 224 pixels of a config naming no image size."""
    from transformers import T5Gemma2Config

    config = T5Gemma2Config(encoder={"vision_config": {"image_size": 32, "patch_size": 8}})
    pixels = image_inputs(config, 2, "cpu")["pixel_values"]
    assert pixels.shape == torch.Size([2, 3, 32, 32])


class _OrderedByMask(torch.nn.Module):
    """PP-DocLayoutV2's ordering of its queries: each row's classes and boxes taken along the argsort of
    a per-row key (a real-valued one here, so that the order has no ties)."""

    def forward(self, scores: torch.Tensor, boxes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        indices = torch.argsort(scores.max(-1).values, dim=1, descending=True)
        classes = torch.take_along_dim(scores.argmax(-1), indices, dim=1)
        return classes, torch.take_along_dim(boxes, indices[..., None].expand(-1, -1, 4), dim=1)


def test_take_along_dim_keeps_the_batch_dynamic(tmp_path: pathlib.Path) -> None:
    """torch's take_along_dim broadcasts from concrete sizes, which specialised PP-DocLayoutV2's batch to
    the example's; capture swaps in symbolic_take_along.py's form: the file takes another batch, as eager."""
    g = torch.Generator().manual_seed(0)
    scores, boxes = torch.randn(2, 6, 3, generator=g), torch.randn(2, 6, 4, generator=g)
    batch = torch.export.Dim("batch", min=1, max=64)
    result = fastonnx.to_onnx(
        _OrderedByMask(),
        (scores, boxes),
        dynamic_shapes=({0: batch}, {0: batch}),
        filename=tmp_path / "ordered.onnx",
    )
    other = torch.randn(5, 6, 3, generator=g), torch.randn(5, 6, 4, generator=g)
    assert result.verify(*other).passed


def test_symbolic_take_along_dim_broadcasts_as_torch() -> None:
    from fastonnx.capture.symbolic_take_along import symbolic_take_along_dim

    g = torch.Generator().manual_seed(0)
    x, index = torch.randn(3, 1, 5, generator=g), torch.randint(0, 5, (1, 4, 2), generator=g)
    for dim in (2, -1, None):
        torch.testing.assert_close(
            symbolic_take_along_dim(x, index, dim), torch.take_along_dim(x, index, dim)
        )
    rows = torch.randint(0, 3, (1, 1, 5), generator=g)
    torch.testing.assert_close(symbolic_take_along_dim(x, rows, 0), torch.take_along_dim(x, rows, 0))


def test_shieldgemma2s_image_tokens_attend_as_gemma3s() -> None:
    """ShieldGemma 2's image-text model is Gemma3ForConditionalGeneration under its own model type: its
    image tokens attend to each other both ways from the token types, as Gemma 3's (IMAGE_BLOCK_TYPES)."""
    from transformers import ShieldGemma2Config

    from fastonnx.pretrained import vision_language as vl

    model = torch.nn.Module()
    model.config = ShieldGemma2Config()  # the positions read its type and image token, no weights
    token = vl.image_token_id(model.config)
    ids = torch.tensor([[5, token, token, 6]])
    _, _, placed = vl.prompt_positions(model, ids, {})
    torch.testing.assert_close(placed["token_type_ids"], torch.tensor([[0, 1, 1, 0]]))


def test_depthwise_groups_shrink_with_the_hidden_size() -> None:
    """Mimi's upsampling convolution takes a group a channel (upsample_groups = hidden_size, 512): left full
    beside the shrunk width, torch refused the layer (in_channels not divisible by groups)."""
    sweep = architecture_sweep()
    config = sweep.tiny_config("mimi_decoder")
    assert config.upsample_groups == config.hidden_size == sweep._SIZES["hidden_size"]
    from transformers import MimiDecoderModel

    with torch.device("meta"):
        model = MimiDecoderModel(config)
    assert sum(p.numel() for p in model.parameters()) <= sweep.MAX_PARAMS


class _GridTower(torch.nn.Module):
    """A vision tower as Qwen-VL's: packed patches and their grid, no input a task graph of fastonnx makes."""

    def __init__(self) -> None:
        super().__init__()
        from transformers import Qwen3VLVisionConfig

        self.config = Qwen3VLVisionConfig()

    def forward(self, hidden_states: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        raise AssertionError("not run: its inputs are none fastonnx makes")


class _BrokenImageModel(torch.nn.Module):
    """A model fed what fastonnx makes (pixel_values) whose forward fails: a tiny checkpoint the sweep
    cannot run, which fails the build (a sweep gap)."""

    def __init__(self) -> None:
        super().__init__()
        from transformers import ViTConfig

        self.config = ViTConfig(image_size=32, patch_size=8)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        raise ValueError("sizes disagree")


def test_the_eager_check_runs_what_fastonnx_feeds_and_skips_what_it_cannot() -> None:
    """The eager check's forward needs fastonnx's own inputs: a forward requiring others (grid_thw) is not
    run (its TypeError said nothing of the tiny config; the export reports the gap), while one on
    fastonnx's inputs still fails the build when transformers' forward fails."""
    sweep = architecture_sweep()
    assert sweep._unmade_inputs(_GridTower()) == {"hidden_states", "grid_thw"}
    assert sweep._unmade_inputs(_BrokenImageModel()) == set()
    assert sweep._unmade_inputs(_BrokenImageModel(), {"pixel_values": None}) == set()
    sweep._eager_check("feature-extraction", _GridTower())
    with pytest.raises(RuntimeError, match="eager forward fails: ValueError: sizes disagree"):
        sweep._eager_check("feature-extraction", _BrokenImageModel())


def test_a_univariate_forecasters_series_are_batch_by_steps() -> None:
    """TimesFM's prediction models read batch x steps (a config naming no num_input_channels): the
    channel axis other forecasters take made its forward fail (its concatenation of 3-D and 2-D series)."""
    from transformers import TimesFmConfig, TimesFmModelForPrediction

    from fastonnx.pretrained.encoder_tasks import series_inputs

    config = TimesFmConfig(
        hidden_size=16,
        intermediate_size=32,
        head_dim=8,
        num_attention_heads=2,
        num_hidden_layers=1,
        context_length=64,
        horizon_length=32,
    )
    torch.manual_seed(0)
    model = TimesFmModelForPrediction(config).eval()
    inputs = series_inputs(model, config, 2, "cpu")
    assert inputs["past_values"].shape == torch.Size([2, 64])
    with torch.no_grad():
        out = model(**inputs)
    assert out.mean_predictions.shape == torch.Size([2, 32])


def test_timms_test_resnet_stands_in_without_the_replaced_models_arguments() -> None:
    """OmDet-Turbo's config carries its Swin's timm arguments (img_size, always_partition) into
    timm.create_model: with the sweep's test ResNet standing in, timm refused them; detectors without such
    arguments (DETR's) keep their backbone config as it was."""
    sweep = architecture_sweep()
    config = sweep.tiny_config("omdet-turbo")
    assert config.backbone_config.backbone == sweep.TINY_TIMM
    assert config.timm_kwargs == {}
    from transformers import OmDetTurboForObjectDetection

    with torch.device("meta"):
        model = OmDetTurboForObjectDetection(config)
    assert sum(p.numel() for p in model.parameters()) <= sweep.MAX_PARAMS
    detr = sweep.tiny_config("detr").backbone_config
    assert detr.backbone == sweep.TINY_TIMM and hasattr(detr, "use_pretrained_backbone")


def test_a_codecs_waveform_has_its_channel_axis() -> None:
    """A codec reads ``batch x channels x samples`` (EnCodec's documented shape; Perception Encoder's audio
    encoder hands it to its DAC encoder's first convolution): the speech encoders' ``batch x samples``
    made their forwards fail. Wav2Vec2 and Moonshine add the channel themselves and keep their 2-D wave."""
    from transformers import (
        EncodecConfig,
        EncodecModel,
        MoonshineConfig,
        MoonshineModel,
        PeAudioEncoder,
        PeAudioEncoderConfig,
        Wav2Vec2Config,
        Wav2Vec2Model,
    )

    from fastonnx.pretrained.encoder_tasks import audio_inputs
    from fastonnx.pretrained.frame_widths import waveform_channels

    with torch.device("meta"):
        for cls, config in ((Wav2Vec2Model, Wav2Vec2Config()), (MoonshineModel, MoonshineConfig())):
            assert waveform_channels(cls(config), config) is None
        pe_config = PeAudioEncoderConfig()
        assert waveform_channels(PeAudioEncoder(pe_config), pe_config) == 1
    config = EncodecConfig(
        audio_channels=2, hidden_size=8, num_filters=4, codebook_size=16, codebook_dim=8, num_lstm_layers=1
    )
    torch.manual_seed(0)
    model = EncodecModel(config).eval()
    inputs, dims = audio_inputs(model, config, 2, "cpu")
    assert inputs["input_values"].shape == torch.Size([2, 2, 16000])
    assert dims == {"input_values": {0: "batch_size", 2: "audio_sequence_length"}}
    with torch.no_grad():
        assert model(**inputs).audio_values.shape == torch.Size([2, 2, 16000])


def test_a_codecs_features_are_its_encoding() -> None:
    """A codec's feature-extraction graph returns its encoding of the waveform: the continuous latents
    where its output declares them, and the codes its quantizers pick, not the reconstructed audio."""
    from transformers import (
        DacConfig,
        DacModel,
        EncodecConfig,
        EncodecModel,
        VibeVoiceAcousticTokenizerConfig,
        VibeVoiceAcousticTokenizerModel,
    )

    from fastonnx.pretrained.encoder_tasks import output_fields

    with torch.device("meta"):
        encodec = EncodecModel(EncodecConfig())
        dac = DacModel(DacConfig())
        tokenizer = VibeVoiceAcousticTokenizerModel(VibeVoiceAcousticTokenizerConfig())
    assert output_fields(encodec, "feature-extraction") == ("audio_codes",)
    assert output_fields(dac, "feature-extraction") == ("quantized_representation", "audio_codes")
    assert output_fields(tokenizer, "feature-extraction") == ("latents",)


def test_sams_features_are_its_image_embeddings() -> None:
    """SAM's base model returns masks and scores from prompts: its feature-extraction graph is the image
    embeddings its prompt encoder and mask decoder read (get_image_embeddings); SAM-HQ's also the states
    after its global-attention layers, which its HQ decoder reads, one output each. A model declaring the
    fields the task reads (BERT's last_hidden_state) is not concerned."""
    from transformers import BertConfig, BertModel, SamConfig, SamHQConfig, SamHQModel, SamModel

    from fastonnx.pretrained.encoder_tasks import embeds_images, image_embedding_fields, output_fields
    from fastonnx.pretrained.tuple_outputs import output_names

    vision = {"num_hidden_layers": 3, "global_attn_indexes": [0, 2], "window_size": 4}
    with torch.device("meta"):
        sam = SamModel(SamConfig(vision_config=vision))
        hq = SamHQModel(SamHQConfig(vision_config=vision))
        bert = BertModel(BertConfig(num_hidden_layers=1))
    fe = "feature-extraction"
    assert embeds_images(sam, fe, output_fields(sam, fe)) and embeds_images(hq, fe, output_fields(hq, fe))
    assert not embeds_images(bert, fe, output_fields(bert, fe))
    assert output_names(sam, image_embedding_fields(sam)) == ("image_embeddings",)
    assert output_names(hq, image_embedding_fields(hq)) == (
        "image_embeddings",
        "intermediate_embeddings.0",
        "intermediate_embeddings.1",
    )
    assert not embeds_images(sam, "image-segmentation", output_fields(sam, "image-segmentation"))


def test_sam3_trackers_image_embeddings_are_one_a_backbone_level() -> None:
    """SAM 3's tracker returns its image embeddings as a list, one a backbone feature size, and its vision
    config names no num_feature_levels: the graph's outputs are named one a level all the same."""
    from transformers import Sam3TrackerConfig, Sam3TrackerModel

    from fastonnx.pretrained.tuple_outputs import output_names

    with torch.device("meta"):
        model = Sam3TrackerModel(Sam3TrackerConfig())
    assert getattr(model.config.vision_config, "num_feature_levels", None) is None
    levels = len(model.backbone_feature_sizes)
    assert levels > 1
    assert output_names(model, ("image_embeddings",)) == tuple(f"image_embeddings.{i}" for i in range(levels))


def test_a_video_trackers_features_are_a_frames_image_embeddings() -> None:
    """A video tracker's forward steps an inference session through a video; its feature-extraction graph
    reads images (``pixel_values``, any batch) and returns their image embeddings, a level each."""
    from transformers import Sam2VideoModel

    from fastonnx.pretrained.encoder_tasks import encoder_inputs, tracks_video
    from fastonnx.pretrained.tuple_outputs import output_names

    config = architecture_sweep().tiny_config("sam2_video")
    with torch.device("meta"):
        model = Sam2VideoModel(config)
    assert tracks_video(model)
    inputs, dims = encoder_inputs(model, config, "feature-extraction", 2, "cpu")
    assert list(inputs) == ["pixel_values"] and inputs["pixel_values"].shape[0] == 2
    assert dims == {"pixel_values": {0: "batch_size"}}
    levels = config.vision_config.num_feature_levels
    assert output_names(model, ("image_embeddings",)) == tuple(f"image_embeddings.{i}" for i in range(levels))


def test_a_speech_synthesizers_features_are_its_text_encoders() -> None:
    """FastSpeech2's base model returns a spectrogram: its feature-extraction graph is its text encoder's
    states (encoder_last_hidden_state), computed before the durations turn the text into frames."""
    from transformers import FastSpeech2ConformerConfig, FastSpeech2ConformerModel

    from fastonnx.pretrained.encoder_tasks import output_fields

    with torch.device("meta"):
        model = FastSpeech2ConformerModel(FastSpeech2ConformerConfig())
    assert output_fields(model, "feature-extraction") == ("encoder_last_hidden_state",)


def test_seggpt_reads_an_image_beside_its_prompt_image_and_mask() -> None:
    """SegGPT stacks an in-context prompt (an example image and its mask) above the image: its graph takes
    the three at half its config's image height each, any batch."""
    from transformers import SegGptConfig, SegGptModel

    from fastonnx.pretrained.encoder_tasks import encoder_inputs

    config = SegGptConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=[64, 32],
        patch_size=16,
        mlp_dim=64,
        merge_index=0,
        intermediate_hidden_state_indices=[1],
    )
    with torch.device("meta"):
        model = SegGptModel(config)
    inputs, dims = encoder_inputs(model, config, "feature-extraction", 2, "cpu")
    height, width = config.image_size
    assert list(inputs) == ["pixel_values", "prompt_pixel_values", "prompt_masks"]
    assert {tuple(t.shape) for t in inputs.values()} == {(2, config.num_channels, height // 2, width)}
    assert dims == {name: {0: "batch_size"} for name in inputs}


def test_flavas_images_are_its_image_towers_size() -> None:
    """FLAVA names its vision tower image_config: its images are that tower's size, not the 224 pixels of a
    config naming no image size (its patch embeddings refuse any other)."""
    from transformers import FlavaConfig

    config = FlavaConfig(image_config={"image_size": 32, "patch_size": 8})
    assert image_inputs(config, 2, "cpu")["pixel_values"].shape == torch.Size([2, 3, 32, 32])


def test_an_encoder_reading_mel_bins_first_gets_them_first() -> None:
    """GLM-ASR's encoder hands input_features straight to a convolution over the mel bins (batch x bins x
    frames), which the frames-first features made fail; AudioFlamingo 3's Whisper-style encoder reads its
    frames' mask too (its forward sums it), which its fixed frames now come with."""
    from transformers import (
        AudioFlamingo3Encoder,
        AudioFlamingo3EncoderConfig,
        GlmAsrEncoder,
        GlmAsrEncoderConfig,
    )

    from fastonnx.pretrained.encoder_tasks import audio_inputs

    torch.manual_seed(0)
    glm = GlmAsrEncoderConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, num_mel_bins=8
    )
    flamingo = AudioFlamingo3EncoderConfig(
        d_model=16,
        encoder_layers=1,
        encoder_attention_heads=2,
        encoder_ffn_dim=32,
        num_mel_bins=8,
        max_source_positions=50,
    )
    for cls, config, shapes in (
        (GlmAsrEncoder, glm, {"input_features": [2, 8, 100]}),
        (AudioFlamingo3Encoder, flamingo, {"input_features": [2, 8, 100], "input_features_mask": [2, 100]}),
    ):
        model = cls(config).eval()
        inputs, _ = audio_inputs(model, config, 2, "cpu")
        assert {name: list(value.shape) for name, value in inputs.items()} == shapes
        with torch.no_grad():
            assert model(**inputs).last_hidden_state.shape[0] == 2


def test_a_waveform_of_whole_tokens_is_a_multiple_of_their_samples() -> None:
    """Muse Spark's audio model refuses a waveform that is no whole number of its tokens (its feature
    extractor pads to one): the example rounds up, the dim is a multiple of samples_per_token."""
    from transformers import MuseSparkAudioConfig, MuseSparkAudioModel

    from fastonnx.pretrained.encoder_tasks import AUDIO_TOKENS, audio_inputs, dynamic_shapes

    config = MuseSparkAudioConfig()
    with torch.device("meta"):
        model = MuseSparkAudioModel(config)
    token = config.samples_per_token
    inputs, dims = audio_inputs(model, config, 2, "meta")
    assert inputs["input_values"].shape[1] % token == 0 and inputs["input_values"].shape[1] >= 16000
    length = dynamic_shapes(model, dims)["input_values"][1]
    assert str(length) == str(token * torch.export.Dim(AUDIO_TOKENS, min=1, max=1 << 20))


def test_a_waveform_reshaped_into_frames_is_a_multiple_of_a_frame() -> None:
    """Moonshine Streaming's encoder reshapes the waveform into frames of sample_rate x frame_ms samples
    (80): its program is right only for whole frames, so the dim is 80 x frames, from the frames holding
    the fewest samples its convolutions take (min_samples)."""
    import transformers

    from fastonnx.pretrained.encoder_tasks import (
        AUDIO_FRAMES,
        audio_inputs,
        dynamic_shapes,
        min_samples,
        samples_per_frame,
    )
    from fastonnx.pretrained.meta_init import build_on_meta

    config = architecture_sweep().tiny_config("moonshine_streaming")
    model = build_on_meta(lambda: transformers.MoonshineStreamingForConditionalGeneration(config))
    frame = samples_per_frame(config)
    assert frame == 80  # 16 kHz, 5 ms
    inputs, dims = audio_inputs(model, config, 2, "meta")
    assert inputs["input_values"].shape[1] % frame == 0
    least = -(-min_samples(model) // frame)
    length = dynamic_shapes(model, dims)["input_values"][1]
    assert str(length) == str(frame * torch.export.Dim(AUDIO_FRAMES, min=least, max=1 << 20))
    assert samples_per_frame(transformers.WhisperConfig()) is None


def test_kosmos2s_prompt_holds_its_images_positions() -> None:
    """Kosmos-2's forward puts its image's latent_query_num rows where image_embeds_position_mask is 1 (its
    processor's image tokens after the first): without the mask it failed. A prompt a row, each with its
    image's positions, and the mask an input of the graph."""
    from transformers import Kosmos2Config, Kosmos2Model

    from fastonnx.pretrained.encoder_tasks import ENCODERS, PlacedImageTextEncoder, encoder_inputs

    config = Kosmos2Config(
        text_config={"embed_dim": 16, "layers": 1, "attention_heads": 2, "ffn_dim": 32, "vocab_size": 64},
        vision_config={
            "hidden_size": 16,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "intermediate_size": 32,
            "image_size": 32,
            "patch_size": 8,
        },
        latent_query_num=4,
    )
    torch.manual_seed(0)
    model = Kosmos2Model(config).eval()
    inputs, dims = encoder_inputs(model, config, "feature-extraction", 2, "cpu")
    assert ENCODERS[tuple(inputs)] is PlacedImageTextEncoder
    assert inputs["input_ids"].shape == inputs["image_embeds_position_mask"].shape == torch.Size([2, 11])
    assert inputs["image_embeds_position_mask"].sum(dim=1).tolist() == [4, 4]
    assert dims["image_embeds_position_mask"] == dims["input_ids"]
    with torch.no_grad():
        assert model(**inputs).last_hidden_state.shape == torch.Size([2, 11, 16])


def test_a_keypoint_matcher_reads_pairs_of_images() -> None:
    """EfficientLoFTR and LightGlue match two images a row (batch x 2 x channels x height x width) and refuse
    anything else; other image models keep their batch of single images."""
    from transformers import CLIPVisionConfig, EfficientLoFTRConfig

    from fastonnx.pretrained.encoder_tasks import image_pairs

    pixels = torch.randn(3, 3, 32, 32)
    pairs = image_pairs(EfficientLoFTRConfig(), pixels)
    assert pairs.shape == torch.Size([3, 2, 3, 32, 32]) and torch.equal(pairs[:, 0], pixels)
    assert not torch.equal(pairs[:, 1], pixels)
    assert image_pairs(CLIPVisionConfig(), pixels) is pixels


def test_perception_encoders_audio_video_encoder_reads_clips_and_their_sound() -> None:
    """Perception Encoder's audio-video encoder reads each clip with its waveform (one channel, as its DAC
    encoder takes it); the clips alone left its audio embedder a None."""
    from transformers import PeAudioVideoEncoder, PeAudioVideoEncoderConfig

    from fastonnx.pretrained.encoder_tasks import ENCODERS, SoundVideoEncoder, encoder_inputs

    config = PeAudioVideoEncoderConfig()
    with torch.device("meta"):
        model = PeAudioVideoEncoder(config)
    inputs, dims = encoder_inputs(model, config, "feature-extraction", 2, "meta")
    assert ENCODERS[tuple(inputs)] is SoundVideoEncoder
    assert inputs["input_values"].shape == torch.Size([2, 1, 16000])
    assert inputs["pixel_values_videos"].shape[:3] == torch.Size([2, 3, 3])
    assert dims["input_values"] == {0: "batch_size", 2: "audio_sequence_length"}


def test_udops_words_come_with_their_boxes() -> None:
    """UDOP's encoder lays its words over its page by their boxes (combine_image_text_embeddings reads
    bbox at any size): the words, their boxes (x0 <= x1, y0 <= y1 in 0..1) and the page, with the decoder's
    tokens."""
    from transformers import UdopConfig, UdopModel

    from fastonnx.pretrained.encoder_tasks import ENCODERS, BoxedPageEncoder, encoder_inputs

    config = UdopConfig(d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2, vocab_size=64)
    with torch.device("meta"):
        model = UdopModel(config)
    inputs, dims = encoder_inputs(model, config, "feature-extraction", 2, "cpu")
    assert ENCODERS[tuple(inputs)] is BoxedPageEncoder
    boxes = inputs["bbox"]
    assert boxes.shape == (*inputs["input_ids"].shape, 4) and dims["bbox"] == dims["input_ids"]
    assert bool((boxes[..., :2] <= boxes[..., 2:]).all()) and bool(((boxes >= 0) & (boxes <= 1)).all())


def test_claps_two_towers_read_prompts_and_spectrograms() -> None:
    """CLAP embeds prompts and log-mel spectrograms apart (text_embeds, audio_embeds): its graph takes both,
    the spectrograms of one channel x its feature extractor's 1001 frames x its mel bins; its text alone left
    its audio tower a None."""
    from transformers import ClapConfig, ClapModel

    from fastonnx.pretrained import media_text_towers

    config = ClapConfig()
    with torch.device("meta"):
        model = ClapModel(config)
    assert media_text_towers.owns(model, "feature-extraction")
    assert media_text_towers.embed_fields(model) == ("text_embeds", "audio_embeds")
    inputs, dims = media_text_towers.tower_inputs(model, config, 2, "meta")
    assert inputs["input_ids"].shape[0] == 3
    assert inputs["input_features"].shape == torch.Size([2, 1, 1001, config.audio_config.num_mel_bins])
    assert dims["input_features"] == {0: "batch_size"}


def test_idefics_reads_an_image_a_prompt_and_which_tokens_attend_to_it() -> None:
    """IDEFICS' forward reads images x prompts (5-D pixel_values) and which tokens attend to which image
    (image_attention_mask, summed at any size): one image a prompt, every token attending. FLAVA's optional
    patch mask of that name is left out."""
    from transformers import FlavaConfig, FlavaModel, IdeficsConfig, IdeficsModel

    from fastonnx.pretrained.encoder_tasks import ENCODERS, AttendedImageTextEncoder, encoder_inputs

    config = IdeficsConfig()
    with torch.device("meta"):
        model = IdeficsModel(config)
        flava = FlavaModel(FlavaConfig())
    inputs, dims = encoder_inputs(model, config, "feature-extraction", 2, "meta")
    assert ENCODERS[tuple(inputs)] is AttendedImageTextEncoder
    assert inputs["pixel_values"].shape[:2] == torch.Size([2, 1])
    assert inputs["image_attention_mask"].shape == (*inputs["input_ids"].shape, 1)
    assert dims["image_attention_mask"] == dims["input_ids"]
    flava_inputs, _ = encoder_inputs(flava, flava.config, "feature-extraction", 2, "meta")
    assert "image_attention_mask" not in flava_inputs and flava_inputs["pixel_values"].dim() == 4


def test_a_decision_transformer_exports_its_predictions(tmp_path: pathlib.Path) -> None:
    """A Decision Transformer's trajectories (encoder_tasks.trajectory_inputs) to its next state, action
    and return predictions and its states, right at another batch and trajectory length than the
    export's."""
    import numpy as np
    import onnxruntime
    from transformers import AutoModel

    from fastonnx.pretrained.encoder_tasks import TRAJECTORY_OUTPUTS, trajectory_inputs

    task, folder = "feature-extraction", tmp_path / "checkpoint"
    architecture_sweep().build_checkpoint(task, "decision_transformer", "DecisionTransformerModel", folder)
    written = fastonnx.export_pretrained(folder, tmp_path / "package", task=task, progress=False)
    assert written.verified is True, written.verify_note
    model = AutoModel.from_pretrained(folder).eval()
    feeds, _ = trajectory_inputs(model.config, 3, "cpu")
    g = torch.Generator().manual_seed(5)
    feeds = {
        k: torch.cat(
            [v, v[:, :5] + (torch.rand(v[:, :5].shape, generator=g) if v.is_floating_point() else 0)], 1
        )
        for k, v in feeds.items()
    }
    feeds["attention_mask"][0, :4] = 0  # a trajectory's first steps padded, as its loop pads short ones
    session = onnxruntime.InferenceSession(str(tmp_path / "package" / "model.onnx"))
    got = session.run(None, {i.name: feeds[i.name].numpy() for i in session.get_inputs()})
    with torch.no_grad():
        want = model(**feeds)
    assert [o.name for o in session.get_outputs()] == list(TRAJECTORY_OUTPUTS)
    for name, value in zip(TRAJECTORY_OUTPUTS, got, strict=True):
        expected = getattr(want, name)
        assert value.shape == tuple(expected.shape) and value.shape[:2] in {(3, 11), (3, 33)}, name
        torch.testing.assert_close(torch.from_numpy(np.asarray(value)), expected, atol=1e-4, rtol=1e-3)


def test_mgp_str_features_are_its_three_heads_logits() -> None:
    """MGP-STR's recogniser returns a tuple of its character, BPE and WordPiece logits: one named output
    each (its feature-extraction graph's), and one ``logits`` tensor for every other model."""
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        MgpstrConfig,
        MgpstrForSceneTextRecognition,
    )

    from fastonnx.pretrained.encoder_tasks import output_fields
    from fastonnx.pretrained.tuple_outputs import output_names, read

    config = MgpstrConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=(16, 32))
    model = MgpstrForSceneTextRecognition(config).eval()
    fields = output_fields(model, "feature-extraction")
    assert output_names(model, fields) == ("logits.0", "logits.1", "logits.2")
    with torch.no_grad():
        out = model(torch.randn(1, 3, 16, 32))
    widths = [read(out, name).shape[-1] for name in output_names(model, fields)]
    assert widths == [config.num_character_labels, config.num_bpe_labels, config.num_wordpiece_labels]
    bert = BertForSequenceClassification(
        BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2)
    )
    assert output_names(bert, ("logits",)) == ("logits",)


def test_a_perceiver_classifier_reads_one_image() -> None:
    """Perceiver's config names 16 frames for its multimodal autoencoder; its image classifiers read one
    image (batch x channels x height x width), while a video encoder's config gives its frames."""
    from transformers import PerceiverConfig, VideoMAEConfig

    from fastonnx.pretrained.multimodal_features import video_frames

    assert PerceiverConfig().num_frames == 16 and video_frames(PerceiverConfig()) is None
    assert video_frames(VideoMAEConfig(num_frames=8)) == 8
