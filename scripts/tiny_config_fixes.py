"""Per-architecture overrides on top of the architecture sweep's tiny configs (scripts/architecture_sweep.py):
where shrinking every size alike leaves sizes that disagree with each other (a head as wide as the full
tower's output, a pooling kernel of zero, a codebook larger than the vocabulary) or sizes the generic
shrinking cannot tell (stage widths of a convolutional backbone), the values that make transformers' own
eager forward run at tiny sizes. Each entry says what it makes consistent."""

from __future__ import annotations

from typing import Any

VOCAB = 128  # the sweep's tiny vocabulary (architecture_sweep.VOCAB)


def _chameleon_vocabulary(codebook: int) -> dict[str, int]:
    """Chameleon's BPE names of the VQ codes: IMGIMG + the code's digits as letters (A = 0) + one closing
    character; the codes take the last ids before the image placeholder ``<image>`` (the last id)."""
    first = VOCAB - 1 - codebook
    names = {f"IMGIMG{''.join(chr(ord('A') + int(c)) for c in str(i))}Z": first + i for i in range(codebook)}
    return {**names, "<image>": VOCAB - 1}


def _emu3_vocabulary(codebook: int) -> dict[str, int]:
    """Emu3's visual token names (``<|visual token000012|>``: the code in 6 digits), its image placeholder
    and the end-of-line token it puts after each row of codes."""
    first = VOCAB - 2 - codebook
    names = {f"<|visual token{i:06d}|>": first + i for i in range(codebook)}
    return {**names, "<|extra_200|>": VOCAB - 2, "<image>": VOCAB - 1}


_TINY_HIDDEN = 64  # the sweep's tiny hidden size (architecture_sweep._SIZES)
_CODEBOOK = 32  # the tiny VQ tokenizers' codes, inside the 128-token vocabulary

_FASTSPEECH2_CONFORMERS = {
    f"{side}_config": {"layers": 2, "linear_units": 128} for side in ("encoder", "decoder")
}

FIXES: dict[str, dict[str, Any]] = {
    # Gemma 3's projector average-pools the tower's patches (image 32 / patch 8: 4 x 4) to
    # mm_tokens_per_image (256 = 16 x 16 by default): a pooling kernel 4 // 16 = 0; 2 x 2 tokens pool 2 x 2
    **dict.fromkeys(("gemma3", "shieldgemma2"), {"mm_tokens_per_image": 4}),
    # Chameleon's VQ codes become BPE ids through vocabulary_map, which the config leaves empty; the
    # codebook (8192) and the VQ encoder's widths (base 128 x [1, 1, 2, 2, 4]) shrunk to fit
    "chameleon": {
        "vocabulary_map": _chameleon_vocabulary(_CODEBOOK),
        "image_token_id": VOCAB - 1,
        "vq_config": {
            "num_embeddings": _CODEBOOK,
            "base_channels": 32,  # its GroupNorms take 32 groups
            "channel_multiplier": [1, 1, 1, 1, 1],
            "latent_channels": 16,
            "embed_dim": 16,
            "resolution": 32,
        },
    },
    "emu3": {
        "vocabulary_map": _emu3_vocabulary(_CODEBOOK),
        "image_token_id": VOCAB - 1,
        "vq_config": {
            "codebook_size": _CODEBOOK,
            "base_channels": 32,  # its GroupNorms take 32 groups
            "channel_multiplier": [1, 1, 1, 1],
            "hidden_size": 32,  # its attention runs at base_channels x the last multiplier
            "num_attention_heads": 1,
        },
    },
    # deepseek-ai/DeepSeek-OCR-2: which layers are MoE ones (None by default, which its layers index); its
    # SAM's last downsampling gives the encoder's width (896 = encoder hidden_size): the tiny 64 (and its
    # MLP, 3072 wide, the tiny 128)
    "deepseek_ocr2": {
        "text_config": {"mlp_layer_types": ["dense", "sparse"]},
        "vision_config": {"sam_config": {"downsample_channels": [64, 64], "mlp_dim": 128}},
    },
    # rhymes-ai/Aria: its projector's query count by the tile's patch count, {1225: 128, 4900: 256} for the
    # processor's 490 and 980 pixel tiles (35² and 70² patches of 14); the tiny tiles' of 32 and 64 pixels
    # (4² and 8² patches of 8)
    "aria": {"projector_patch_to_query_dict": {16: 4, 64: 8}},
    # Step3p7: its text model builds a sliding-window mask whatever its layers' kinds, which fails without
    # the window its checkpoints set (None by default)
    "step3p7": {"text_config": {"sliding_window": 512}},
    # Granite Speech 5's encoder projects keys and values to num_attention_heads heads whatever its
    # num_key_value_heads, which it still divides into the heads to repeat them: None, as its checkpoints
    # leave it, is one key-value head a head (shrunk alone to 2 of 4, the repeat doubles them)
    "granite_speech5_encoder": {"num_key_value_heads": None},
    "granite_speech5_ctc": {"encoder_config": {"num_key_value_heads": None}},
    # baidu/Unlimited-OCR: its SAM's last downsampling is the CLIP encoder's width (1024) too; a 64-pixel
    # global view (and the processor's 640/1024 tiles: 40 pixels) so that each view gives 2 x 2 queries,
    # whose rows the grid's newlines interleave; a window of 3 generated tokens (128 by default), which a
    # verification's 6 steps slide
    "unlimited_ocr": {
        "vision_config": {"sam_config": {"downsample_channels": [64, 64], "image_size": 64, "mlp_dim": 128}},
        "text_config": {"sliding_window": 3},
    },
    # facebook/Perception-LM-1B: a timm Perception Encoder tower (vit_pe_core_large_patch14_336, width 1024)
    # whose width the projector reads from model_args; the resnet50 default has none. PE's tiny variant,
    # shrunk to the sweep's widths, on 2 x 2 patches of 16
    "perception_lm": {
        "vision_config": {
            "architecture": "vit_pe_core_tiny_patch16_384",
            "model_args": {
                "embed_dim": 64,
                "depth": 2,
                "num_heads": 4,
                "img_size": [32, 32],
                "ref_feat_shape": [2, 2],
                "global_pool": "",
                "use_post_transformer_norm": False,
            },
        }
    },
    # nvidia Cosmos 3 Edge: mrope_section [24, 20, 20] splits head_dim 128's 64 frequencies; the tiny 16's 8
    "cosmos3_edge": {"text_config": {"rope_parameters": {"mrope_section": [2, 3, 3]}}},
    # GLM-5 Next's sparse-attention (DSA) layers take no rotary part (qk_rope_head_dim 0, head_dim 0 by
    # default), which the multi-head-latent-attention shrinking sets to 8; its indexer's and linear
    # attention's heads, the vision tower's depth and output shrunk alike
    "glm5_next": {
        "text_config": {
            "qk_rope_head_dim": 0,
            "head_dim": 0,
            "index_head_dim": 16,
            "index_n_heads": 4,
            "index_topk": 8,
            "index_kpool": 4,
            "linear_head_dim": 16,
            "linear_num_heads": 4,
        },
        "vision_config": {
            "depth": 2,
            "num_heads": 4,
            "out_hidden_size": 64,
            "projection_intermediate_size": 128,
        },
    },
    # allenai/Molmo2: the adapter reads vision layers [24, 18] of 25 (the last and the seventh from last):
    # the tiny tower's two; a 32-pixel image of 8-pixel patches, its 16 positions
    "molmo2": {
        "adapter_config": {"vision_feature_layer": [-1, -2], "text_hidden_size": 64},
        "vision_config": {"image_size": [32, 32], "num_position_embeddings": 16},
    },
    # Muse Spark's audio pyramid: one patch size, width and depth a stage, as many stages as its layers
    "muse_spark": {
        "audio_config": {
            "patch_sizes": [16, 6],
            "hidden_sizes": [32, 64],
            "depths": [1, 1],
            "num_hidden_layers": 2,
        },
        "text_config": {"moe_hidden_size": 64},
    },
    # deepseek-community/Janus-Pro: its VQ tokenizer (for image generation) as Chameleon's above; its
    # aligners' widths (2048, the text's) and the tower's 576 image tokens (24 x 24 patches): 4 x 4
    "janus": {
        "vision_config": {"projection_dim": 64, "num_image_tokens": 16},
        "vq_config": {
            "num_embeddings": _CODEBOOK,
            "base_channels": 32,  # its GroupNorms take 32 groups
            "channel_multiplier": [1, 1, 1, 1, 1],
            "latent_channels": 16,
            "projection_dim": 64,
            "image_token_embed_dim": 64,
        },
    },
    # zai-org GLM-GA: its tower is GLM-4.1V's (24 blocks of 12 heads): 2 blocks of 4 heads of the tiny width
    # and its mrope_section [8, 12, 12] splits head_dim 128's 32 rotary frequencies (factor 0.5): the tiny 8 alike
    "glmga": {
        "vision_config": {"depth": 2, "num_heads": 4},
        "text_config": {"rope_parameters": {"mrope_section": [2, 3, 3]}},
    },
    # T5Gemma 2's encoder pools the tower's patches as Gemma 3's does (above)
    "t5gemma2": {"encoder": {"mm_tokens_per_image": 4}},
    # LLaVA-NeXT tiles an image by the best of image_grid_pinpoints (multiples of the tower's 336): the
    # same grids of the tiny 32-pixel tower, else a tile count the features' split does not hold
    **dict.fromkeys(
        ("llava_next", "llava_next_video"),
        {"image_grid_pinpoints": [[32, 64], [64, 32], [64, 64]], "image_seq_length": 16},
    ),
    # ibm-granite Granite 4 Vision: LLaVA-NeXT's tiles (above), its Window Q-Former's downsampling (the
    # checkpoint's "4/8": query windows half the key windows), and the (vision layer, text layer) pairs its
    # deepstack and spatial projectors feed, within the two layers of each
    "granite4_vision": {
        "image_grid_pinpoints": [[32, 64], [64, 32], [64, 64]],
        "image_seq_length": 16,
        "downsample_rate": "1/2",
        "deepstack_layer_map": [[-1, 0], [-2, 1]],
        "spatial_target_layers": [0, 1, 0, 1],
    },
    # AnnaZhang/lwdetr: its ViT's attention runs in num_windows windows (16: 4 a side) on the 1024-pixel
    # image's 64 x 64 patches, which its validator asks to divide evenly; the tiny 4 x 4 patches take 2 a
    # side. Windowed blocks among the tiny 4 layers, as the checkpoint's alternate. Its projector's scales
    # ([1.0] in the checkpoint; none by default, which leaves the decoder no feature level)
    "lw_detr": {
        "backbone_config": {"num_windows": 4, "num_windows_side": 2, "window_block_indices": [0, 2]},
        "projector_scale_factors": [1.0],
    },
    # BiT's GroupNorms take 32 groups (of its 256-wide first stage's 64-wide bottlenecks): the tiny
    # stages' narrower bottlenecks take 4
    "bit": {"num_groups": 4},
    # EfficientNet-B7's scaling (width x2, depth x3.1: 55 blocks up to 3840 channels) down to B0's
    # fraction: channels a quarter (rounded to the divisor 8), blocks a third; its head's width
    # (hidden_dim) is the last convolution's 1280 scaled alike
    "efficientnet": {"width_coefficient": 0.25, "depth_coefficient": 0.3, "hidden_dim": 320},
    "align": {
        "vision_config": {
            "width_coefficient": 0.25,
            "depth_coefficient": 0.3,
            "hidden_dim": 320,
            "image_size": 32,
        },
        # the text's projection meets the image's pooled last block (640 = B7's 320 x 2; 320 x 0.25)
        "projection_dim": 80,
    },
    # LeViT's patch embedding is four stride-2 convolutions (16 pixels a patch whatever patch_size says,
    # which sizes its attention biases): patches of 16 on a 64-pixel image (4 x 4, then 2 x 2, 1 x 1); its
    # subsampling attention's heads are the stage's width over key_dim
    "levit": {
        "patch_size": 16,
        "image_size": 64,
        "down_ops": [["Subsample", 16, 1, 4, 2, 2], ["Subsample", 16, 2, 4, 2, 2]],
    },
    # MobileViTV2 downsamples 32 times then folds 2 x 2 patches: a 64-pixel image (the tiny 32 leaves 1 x 1);
    # its attention widths (128, 192, 256 x width_multiplier) and blocks (2, 4, 3) shrunk
    "mobilevitv2": {"image_size": 64, "width_multiplier": 0.25, "n_attn_blocks": [1, 1, 1]},
    # Swin(V2)'s 4 stages (depths, num_heads: 4 entries) are num_layers, which the layer shrinking halved;
    # its output (hidden_size) is embed_dim doubled at each stage after the first: 32 x 8
    **{
        t: {"num_layers": 4, "hidden_size": 256, "out_features": ["stage4"], "out_indices": [4], **extra}
        for t, extra in (("swin", {}), ("swinv2", {"pretrained_window_sizes": [0, 0, 0, 0]}))
    },
    # TextNet's stem feeds its first stage (hidden_sizes[0]), its 640-pixel image a list the image
    # shrinking misses: 64 pixels through its 5 stride-2 steps
    "textnet": {"stem_out_channels": 16, "image_size": [64, 64]},
    # BEiT's segmentation head (UperNet over an FPN) reads 4 of its layers' outputs
    "beit": {
        "num_hidden_layers": 4,
        "out_indices": [1, 2, 3, 4],
        "out_features": ["stage1", "stage2", "stage3", "stage4"],
        "auxiliary_channels": 64,
    },
    # CHMv2's DPT head: its reassembly widths (post_process_channels, 1024 last) and fusion width shrunk
    "chmv2": {
        "post_process_channels": [16, 32, 64, 64],
        "fusion_hidden_size": 64,
        "head_hidden_size": 32,
        "number_output_channels": 64,
    },
    # Depth Pro: its encoders' hooks ([11, 5] of 12 layers) within the tiny 2, the features' widths shrunk;
    # patch_size is the patch encoder's image (384 pixels: its DINOv2's image_size)
    "depth_pro": {
        "patch_size": 32,
        "intermediate_hook_ids": [1, 0],
        "intermediate_feature_dims": [32, 32],
        "scaled_images_feature_dims": [64, 64, 32],
        "fusion_hidden_size": 64,
    },
    # DPT reads backbone_out_indices of hidden_states[1:] (0-based, [2, 5, 8, 11] of 12): the tiny 4 layers
    "dpt": {"backbone_out_indices": [0, 1, 2, 3], "fusion_hidden_size": 64},
    # facebook/sapiens2's heads (upsampling deconvolutions, then convolutions) are lists the config class
    # leaves None; its key-value heads a layer (16 full-attention, 8 grouped in the middle layers): the
    # tiny 4 heads' full and grouped, one layer each
    "sapiens2": {
        "head_config": {
            "upsample_out_channels": [32, 32],
            "upsample_kernel_sizes": [4, 4],
            "use_pixel_shuffle": False,
            "conv_out_channels": [32],
            "conv_kernel_sizes": [1],
        },
        "num_key_value_heads_per_layer": [4, 2],
        "num_key_value_attention_heads": 2,
        "num_first_full_attention_layers": 1,
        "num_last_full_attention_layers": 1,
    },
    # LayoutLMv3's 2-D position embeddings are x0, y0, x1, y1 (coordinate_size each) and height, width
    # (shape_size each), concatenated to the hidden size (6 x 128 = 768): 4 x 10 + 2 x 12 = 64
    "layoutlmv3": {"coordinate_size": 10, "shape_size": 12},
    # LiLT's 2-D position embeddings are hidden_size // 6 wide each, six of them concatenated back to the
    # hidden size (768): a hidden size that 6 and the layout stream's channel_shrink_ratio 4 x 4 heads divide
    "lilt": {"hidden_size": 48},
    # timm_wrapper's default ResNet-50 (24M): timm's test ResNet
    "timm_wrapper": {"architecture": "test_resnet"},
    # FastSpeech2's conformers read encoder_config / decoder_config (4 layers, 1536-wide feed-forwards),
    # not the encoder_layers / decoder_layers the generic shrinking sets: the same 2 layers there
    "fastspeech2_conformer": _FASTSPEECH2_CONFORMERS,
    "fastspeech2_conformer_with_hifigan": {"model_config": _FASTSPEECH2_CONFORMERS},
    # Kosmos-2's and Kosmos-2.5's text decoders count their layers in text_config's "layers" (24), which
    # the generic shrinking does not read
    **dict.fromkeys(("kosmos-2", "kosmos-2.5"), {"text_config": {"layers": 2}}),
}


_INTRACLASS = {
    "reduce_channel": [1, 1, 0],
    "return_channel": [1, 1, 0],
    "vertical_long_to_small_conv_longratio": [[7, 1], 1, [3, 0]],
    "vertical_long_to_small_conv_midratio": [[5, 1], 1, [2, 0]],
    "vertical_long_to_small_conv_shortratio": [[3, 1], 1, [1, 0]],
    "horizontal_small_to_long_conv_longratio": [[1, 7], 1, [0, 3]],
    "horizontal_small_to_long_conv_midratio": [[1, 5], 1, [0, 2]],
    "horizontal_small_to_long_conv_shortratio": [[1, 3], 1, [0, 1]],
    "symmetric_conv_long_longratio": [7, 1, 3],
    "symmetric_conv_long_midratio": [5, 1, 2],
    "symmetric_conv_long_shortratio": [3, 1, 1],
}
# PaddlePaddle's HGNetV2 (the classifier and the backbone of D-FINE, DEIMv2, PP-DocLayout, PP-OCRv5's
# detector): its stage widths are lists the generic shrinking does not tell apart (2048 output
# channels left). Each stage's input is the previous one's output, the stem's output the first stage's
# input; the classifier reads hidden_sizes[-1], which the checkpoints keep equal to the last stage's output
_HGNET_V2 = {
    "stem_channels": [3, 16, 16],
    "stage_in_channels": [16, 32, 32, 64],
    "stage_mid_channels": [16, 16, 32, 32],
    "stage_out_channels": [32, 32, 64, 64],
    "hidden_sizes": [32, 32, 64, 64],
    "embedding_size": 16,
    "stage_num_blocks": [1, 1, 1, 1],
    "stage_numb_of_layers": [2, 2, 2, 2],
}
_LCNET_V4 = {
    "stem_channels": [3, 16, 16],
    "block_configs": [
        [[3, 16, 16, 1, False]],
        [[3, 16, 32, 2, False]],
        [[3, 32, 32, 2, True]],
        [[3, 32, 64, 2, False]],
    ],
    "stage_out_channels": [16, 32, 32, 64],
    "depths": [1, 1, 1, 1],
    "out_features": ["stage1", "stage2", "stage3", "stage4"],
    "out_indices": [1, 2, 3, 4],
}
# the tiny HGNetV2's outputs at stages 2, 3, 4, which a detector's encoder reads
_HGNET_DETECTOR = {
    "encoder_in_channels": [32, 64, 64],
    "encoder_hidden_dim": 64,
    "decoder_in_channels": [64] * 3,
}
FIXES.update(
    {
        "hgnet_v2": _HGNET_V2,
        **dict.fromkeys(
            ("d_fine", "deimv2", "pp_doclayout_v2", "pp_doclayout_v3", "pp_doclayout_v4"),
            {"backbone_config": _HGNET_V2, **_HGNET_DETECTOR},
        ),
        "pp_ocrv5_server_det": {
            "backbone_config": _HGNET_V2,
            # PaddlePaddle/PP-OCRv5_server_det's intra-class blocks (kernel, stride, padding of each conv,
            # which the config class has no default for), the neck's upsampling of its 4 stages to the
            # first's scale, its head's kernels; the neck 64 wide (256)
            "intraclass_block_config": _INTRACLASS,
            "scale_factor_list": [1, 2, 4, 8],
            "kernel_list": [3, 2, 2],
            "neck_out_channels": 64,
        },
        # PP-OCRv6's detectors: their PP-LCNetV4 defaults are the recognizer's (stage 4 alone, strided only
        # vertically); the detectors' necks fuse 4 stages each twice the last's scale, [p2, p3, p4, p5]:
        # 4 stages of [kernel, in, out, stride, squeeze-excitation] blocks halving the scale from stage 2,
        # as wide as the necks read (layer_list_out_channels, stage_out_channels)
        **{
            t: {
                "backbone_config": _LCNET_V4,
                "layer_list_out_channels": _LCNET_V4["stage_out_channels"],
                "neck_out_channels": 32,
                **extra,
            }
            for t, extra in (
                ("pp_ocrv6_small_det", {}),
                (
                    "pp_ocrv6_medium_det",
                    {
                        "intraclass_block_config": _INTRACLASS,
                        "scale_factor_list": [1, 2, 4, 8],
                        "kernel_list": [3, 2, 2],
                    },
                ),
            )
        },
        # PP-DocLayoutV3's mask branch reads the first stage's output (x4_feat_dim: HGNetV2's 128)
        "pp_doclayout_v3": {"backbone_config": _HGNET_V2, **_HGNET_DETECTOR, "x4_feat_dim": 32},
        # PP-DocLayoutV2 keeps the boxes above a threshold a class and orders them by class: per-class
        # lists the checkpoint sets (the tiny config's 2 labels)
        "pp_doclayout_v2": {
            "backbone_config": _HGNET_V2,
            **_HGNET_DETECTOR,
            "class_thresholds": [0.5, 0.5],
            "class_order": [0, 1],
        },
    }
)

# Bark: its sub-models' heads (12) divide no tiny hidden size; its generate indexes fixed vocabulary offsets
# (BarkGenerationConfig's: the text at 10048 up to its pad 129595 and infer token 129599 in the semantic
# model's input, 10000 semantic tokens + eos out; coarse: 10000 semantic + 2 x 1024 codebook ids, its pad
# 12048 and infer token 12050; fine: a 1024-code codebook + its pad), so the vocabularies keep the sizes of
# suno/bark's checkpoints. EnCodec's code vectors are its decoder's input: as wide as its hidden size, and
# its filters few (the 512 channels of its LSTMs are most of its parameters)
_BARK_HEADS = 4
FIXES.update(
    {
        "bark": {
            "semantic_config": {
                "num_heads": _BARK_HEADS,
                "input_vocab_size": 129_600,
                "output_vocab_size": 10_048,
            },
            "coarse_acoustics_config": {
                "num_heads": _BARK_HEADS,
                "input_vocab_size": 12_096,
                "output_vocab_size": 12_096,
            },
            "fine_acoustics_config": {
                "num_heads": _BARK_HEADS,
                "input_vocab_size": 1056,
                "output_vocab_size": 1056,
            },
            "codec_config": {"codebook_dim": 64, "num_filters": 8},
        }
    }
)


# The text models of the M-RoPE vision-language models (feature-extraction's bare XTextModel): their
# mrope_section splits head_dim 128's rotary frequencies over the temporal, row and column planes (Qwen2-VL's
# [16, 24, 24] of 64; GLM-4V's [8, 12, 12] of 32 at partial_rotary_factor 0.5); the tiny head_dim 16 has 8
# (GLM-4.5V's 4), split alike, as their composite models' entries in architecture_sweep.py split them
FIXES.update(
    {
        **dict.fromkeys(
            ("qwen2_vl_text", "qwen2_5_vl_text"),
            {"rope_parameters": {"rope_type": "default", "mrope_section": [2, 3, 3]}},
        ),
        **dict.fromkeys(
            ("glm4v_text", "glm_ocr_text", "glm_image_text"),
            {"rope_parameters": {"mrope_section": [2, 3, 3]}},
        ),
        "glm4v_moe_text": {"rope_parameters": {"mrope_section": [1, 1, 2]}},
        "glm_image": {"text_config": {"rope_parameters": {"mrope_section": [2, 3, 3]}}},
    }
)


# MusicGen's decoder predicts EnCodec codes: its vocabulary is the codebook (2048 both in facebook/musicgen-*),
# its pad, start and bos token the extra embedding row past it (2048); the shrunk vocabulary (128) past the
# shrunk codebook would index codes EnCodec has no entry for. The top-level ids are what the generation
# config is made from (generate's pad and start token), as musicgen-small's generation_config.json has them
_MUSICGEN_CODES = 64
_MUSICGEN_IDS = dict.fromkeys(("pad_token_id", "bos_token_id", "decoder_start_token_id"), _MUSICGEN_CODES)
FIXES.update(
    dict.fromkeys(
        ("musicgen", "musicgen_melody"),
        {
            **_MUSICGEN_IDS,
            "eos_token_id": None,
            "decoder": {
                "vocab_size": _MUSICGEN_CODES,
                "pad_token_id": _MUSICGEN_CODES,
                "bos_token_id": _MUSICGEN_CODES,
            },
            # EnCodec's code vectors are its decoder's input: as wide as its (shrunk) hidden size
            "audio_encoder": {"codebook_size": _MUSICGEN_CODES, "codebook_dim": 64},
        },
    )
)


# Feature extraction's bare models that the generic shrinking left inconsistent (issue 42)
FIXES.update(
    {
        # huggingface/time-series-transformer-tourism-monthly (and Autoformer's, Informer's): the forecast's
        # length, which the config classes leave None and their decoders size themselves by; the context
        # as long (context_length defaults to it); its two time features (month of year, age: the config
        # classes' default 0 makes past_time_features an empty tensor)
        **dict.fromkeys(
            ("autoformer", "informer", "time_series_transformer"),
            {"prediction_length": 24, "num_time_features": 2},
        ),
        # (Bark: its heads and vocabularies above, with its generate's offsets)
        # facebook/vjepa2-vitl-fpc64-256: the predictor's 12 heads of 32 (384 wide), shrunk as the encoder's
        # width and heads are; clips of 256-pixel crops and 64 frames: 32-pixel crops of 4 frames (2 x 2
        # tubelets of 2 frames), as the shrunk image and patch sizes make them
        "vjepa2": {
            "pred_hidden_size": 64,
            "pred_num_attention_heads": 4,
            "pred_num_hidden_layers": 2,
            "crop_size": 32,
            "frames_per_clip": 4,
        },
        # nari-labs/Dia-1.6B's decoder predicts 9 codebooks, one delay of delay_pattern each: the decoder's
        # num_channels is the codebook count (the vision shrinking set it to 3 image channels)
        "dia": {"decoder_config": {"num_channels": 9}},
        # zju-community/efficientloftr: the backbone's stages (widths out_features, their last the
        # attention's hidden_size) and its fine fusion's widths back down, shrunk together: one block a
        # stage, each stage's input the previous one's output
        "efficientloftr": {
            "stage_num_blocks": [1, 1, 1, 1],
            "stage_block_stride": [[2], [1], [2], [2]],
            "stage_in_channels": [1, 16, 16, 32],
            "stage_block_in_channels": [[1], [16], [16], [32]],
            "stage_block_out_channels": [[16], [16], [32], [64]],
            "out_features": [16, 16, 32, 64],
            "fine_fusion_dims": [64, 32, 16],
        },
        # FunAudioLLM/Fun-ASR-Nano: the adaptor's intermediate width is the text's hidden size // 4 (256 of
        # 1024), which its validator checks
        "fun_asr_nano": {"adaptor_config": {"intermediate_size": _TINY_HIDDEN // 4}},
        # nvidia's Nemotron 3.5 Transcribe: the word-timestamp CTC head's blank is its last class (23862 of
        # 23863), inside the tiny vocabulary
        # its Nemotron-H text model's Mamba 2 mixers (64 heads of 64, 8 groups, a state of 128: in_proj
        # 10304 wide), which the generic shrinking leaves full: 4 heads of 16, one group, a state of 16
        "nemo_speechlm": {
            "word_timestamp_config": {"blank_token_id": VOCAB - 1},
            "text_config": {
                "mamba_num_heads": 4,
                "mamba_head_dim": 16,
                "n_groups": 1,
                "ssm_state_size": 16,
            },
        },
        # alibaba-damo/mgp-str-base reads 32 x 128 text-line images (a list its validator requires) in
        # patches of 4, which the generic shrinking made a square's side
        "mgp-str": {"image_size": [32, 128]},
        # Muse Spark's audio pyramid, alone as in the composite above
        "muse_spark_audio": {
            "patch_sizes": [16, 6],
            "hidden_sizes": [32, 64],
            "depths": [1, 1],
            "num_hidden_layers": 2,
        },
        # kyutai/mimi's SEANet doubles its base width (num_filters 64) at each of its 4 strides, to 1024
        # channels: a base of 16 doubles to 256 (Mimi under CSM and Pocket TTS alike)
        **dict.fromkeys(
            (
                "mimi",
                "mimi_decoder",
                "mimi_encoder",
                "pocket_tts_audio_tokenizer",
                "pocket_tts_audio_tokenizer_decoder",
                "pocket_tts_audio_tokenizer_encoder",
            ),
            {"num_filters": 16},
        ),
        # CSM's backbone and depth decoder choose among vocab_size codes (2051 in sesame/csm-1b, Mimi's 2048
        # and three special ones a trained model does not emit): at random weights any code comes, and Mimi
        # decodes only its own; its codebook as large as the tiny vocabulary (128). 8 codebooks, not 32:
        # each frame runs the depth decoder once a codebook, and the check generates several frames
        "csm": {
            "num_codebooks": 8,
            "depth_decoder_config": {"num_codebooks": 8},
            "codec_config": {"num_filters": 16, "codebook_size": 128, "num_quantizers": 8},
        },
        # transformers' load-time conversion of Gradium Phonon's fused in_proj chunks it into three equal
        # q / k / v parts: grouped key/value heads (the sweep's 2 of 4) fail to load back
        "gradium_phonon_tts": {"num_key_value_heads": 4},
        # Diffusion Gemma's text layers route to experts as Gemma 4's MoE checkpoints do (google/gemma-4-26B-A4B:
        # 128 experts, 8 a token); the config class leaves their count, top-k and width None, which its router's and
        # experts' widths read: the sweep's tiny expert count and width
        "diffusion_gemma": {
            "text_config": {"num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": 128}
        },
        # TimmBackbone wraps the timm model its checkpoint names (backbone: None by default): timm's test ResNet
        "timm_backbone": {"backbone": "test_resnet"},
        # the bare text models of composites above: Cosmos 3 Edge's mrope_section, GLM-5 Next's NoPE DSA
        "cosmos3_edge_text": {"rope_parameters": {"mrope_section": [2, 3, 3]}},
        # tencent/HunyuanOCR's text model: its xdrope_section's four planes, as the composite's (above)
        "hunyuan_vl_text": {"rope_parameters": {"rope_type": "default", "mrope_section": [2, 2, 2, 2]}},
        "glm5_next_text": FIXES["glm5_next"]["text_config"],
    }
)


# facebook/sam2.1-hiera-tiny's Hiera: 4 stages doubling the width (96 x [1, 2, 4, 8]) and heads on a
# 1024-pixel image (stride 4, then 2 a stage), attention windows tiling each stage, global attention in some
# blocks. Its widths shrunk to 16 x [1, 2, 4, 8] (heads of 16), a block a stage and two in the third, whose
# second attends globally (a stage's first block pools its queries in the previous stage's windows, as the
# checkpoint's global blocks 5, 7, 9 are none of its stages' first); its windows kept. The image is the
# 224 pixels fastonnx feeds a config naming no image size of its own (Sam2Config's is its backbone's):
# stages of 56, 28, 14, 7 a side, which the windows 8, 4, 14, 7 tile
_SAM2_HIERA = {
    "hidden_size": 16,
    "image_size": [224, 224],
    "embed_dim_per_stage": [16, 32, 64, 128],
    "num_attention_heads_per_stage": [1, 2, 4, 8],
    "blocks_per_stage": [1, 1, 2, 1],
    "global_attention_blocks": [3],
}
# its neck: the stages' widths (last first), the three finest stages' sizes, its FPN's width (256); the
# prompt encoder's and mask decoder's image (in 16-pixel patches: the coarsest fed stage) and widths alike
_SAM2_VISION = {
    "backbone_config": _SAM2_HIERA,
    "backbone_channel_list": [128, 64, 32, 16],
    "backbone_feature_sizes": [[56, 56], [28, 28], [14, 14]],
    "fpn_hidden_size": 64,
}
_SAM2 = {
    "vision_config": _SAM2_VISION,
    "prompt_encoder_config": {"hidden_size": 64, "image_size": 224, "patch_size": 16},
    "mask_decoder_config": {"hidden_size": 64, "mlp_dim": 128, "iou_head_hidden_dim": 64},
}
FIXES.update(
    {
        "sam2_hiera_det_model": _SAM2_HIERA,
        "sam2_vision_model": _SAM2_VISION,
        **dict.fromkeys(("sam2", "sam2_video"), _SAM2),
    }
)


# facebook/pe-av's audio embedder is DAC's encoder: its width doubles at each of its 4 strides from
# encoder_hidden_size (64) to the DAC hidden size (1024, shrunk to 64): from 4 alike; the decoder's 1536
# halves 4 times, shrunk as wide. Its video tower is timm's Perception Encoder (large, 1024 wide): PE's tiny
# variant at the sweep's widths, on 2 x 2 patches of 16 (as Perception LM's entry above)
_PE_DAC = {"dac_config": {"encoder_hidden_size": 4, "decoder_hidden_size": 64}}
_PE_VIDEO = {
    "vision_config": {
        "architecture": "vit_pe_core_tiny_patch16_384",
        "model_args": {
            "embed_dim": 64,
            "depth": 2,
            "num_heads": 4,
            "img_size": [32, 32],
            "ref_feat_shape": [2, 2],
        },
    }
}
_PE_AUDIO_VIDEO = {"audio_config": _PE_DAC, "video_config": _PE_VIDEO}
FIXES.update(
    {
        "pe_audio_encoder": _PE_DAC,
        "pe_audio": {"audio_config": _PE_DAC},
        "pe_video_encoder": _PE_VIDEO,
        "pe_video": {"video_config": _PE_VIDEO},
        "pe_audio_video_encoder": _PE_AUDIO_VIDEO,
        "pe_audio_video": {"audio_video_config": _PE_AUDIO_VIDEO},
        # neuphonic/neucodec, HKUSTAudio/xcodec2: the acoustic encoder doubles its width at each of its 5
        # strides from encoder_hidden_size (48: 1536 channels): from 8 (256); their quantizer reads the
        # semantic and acoustic encodings concatenated, quantization_dim = the two hidden sizes (1024 each);
        # their decoder's attention repeats no key-value heads: as many as the 4 tiny heads (16 and 16)
        **dict.fromkeys(
            ("xcodec2", "neucodec"),
            {"encoder_hidden_size": 8, "quantization_dim": 2 * _TINY_HIDDEN, "num_key_value_heads": 4},
        ),
    }
)


# microsoft/VibeVoice-1.5B's acoustic and semantic tokenizers: a convolutional encoder doubling its width
# from num_filters (32) at each of its 6 strides (to 2048 channels), [3, 3, 3, 3, 3, 3, 8] blocks a stage;
# from 4 (to 256), one block a stage
_VIBEVOICE_CODEC = {"num_filters": 4, "depths": [1] * 7}
FIXES.update(
    {
        **dict.fromkeys(
            (
                "vibevoice_acoustic_tokenizer",
                "vibevoice_acoustic_tokenizer_encoder",
                "vibevoice_acoustic_tokenizer_decoder",
            ),
            _VIBEVOICE_CODEC,
        ),
        "vibevoice": {"audio_config": _VIBEVOICE_CODEC, "semantic_model_config": _VIBEVOICE_CODEC},
        "vibevoice_asr": {
            "acoustic_tokenizer_encoder_config": _VIBEVOICE_CODEC,
            "semantic_tokenizer_encoder_config": _VIBEVOICE_CODEC,
        },
    }
)


# zai-org/GLM-4.1V's bare vision tower: 24 blocks of 12 heads into the text's 4096; the sweep shrinks these
# keys in the vision_config of the whole model, not at the top of the tower's own config
FIXES.update(
    dict.fromkeys(("glm4v_vision", "glm4v_moe_vision"), {"depth": 2, "num_heads": 4, "out_hidden_size": 64})
)
# zai-org/GLM-Image's bare vision tower: 40 blocks of 16 heads, shrunk as GLM-4V's
FIXES["glm_image_vision"] = {"depth": 2, "num_heads": 4}


# nvidia/Nemotron-3-Diarization's and Nemotron 3.5 Transcribe's audio encoders leave num_key_value_heads
# unset (as many as the heads): their v_proj has num_attention_heads heads, which the tiny 2 key-value
# heads do not repeat to (the sweep's fix of the whole nemotron3_diarization, for the encoders alone)
FIXES.update(
    dict.fromkeys(
        ("nemotron3_diarization_audio", "nemotron3_5_transcribe_asr_audio"), {"num_key_value_heads": 4}
    )
)

# google/gemma-3n-E4B's audio encoder: 12 conformer blocks of 8 heads, which the sweep's shrinking (it
# knows no conf_* keys) leaves as they are: 2 blocks, the tiny 4 heads
FIXES["gemma3n_audio"] = {"conf_num_hidden_layers": 2, "conf_num_attention_heads": 4}
# Qwen/Qwen3-ASR-1.7B-hf's encoder alone: its convolutions' 480 channels over 128 mel bins, which the
# sweep's shrinking leaves as they are (the whole qwen3_asr's audio_config alike): 8
FIXES["qwen3_asr_encoder"] = {"downsample_hidden_size": 8}

# bosonai's Higgs Audio V2: codebook_size counts the codes and the stream's bos and eos after them (its
# config's defaults, 1024 with the bos at 1024, leave them outside): 32 codes, bos 32, eos 33
FIXES["higgs_audio_v2"] = {"codebook_size": 34, "audio_stream_bos_id": 32, "audio_stream_eos_id": 33}


# facebook/hf-seamless-m4t-medium's and seamless-m4t-v2-large's text-to-unit model and unit HiFi-GAN: sizes
# under t2u_* and vocoder names the sweep's shrinking does not know (6 + 6 layers of 16 heads, 8192-wide
# FFNs; 512 HiFi-GAN channels over 1280-wide unit embeddings and 256-wide language and speaker ones): the
# text model's tiny 2 layers, 4 heads, 128-wide FFNs, and a 32-channel HiFi-GAN over 64-wide units
_SEAMLESS_UNITS = {
    **{f"t2u_{side}_layers": 2 for side in ("encoder", "decoder")},
    **{f"t2u_{side}_ffn_dim": 128 for side in ("encoder", "decoder")},
    **{f"t2u_{side}_attention_heads": 4 for side in ("encoder", "decoder")},
    "upsample_initial_channel": 32,
    "unit_embed_dim": 64,
    "lang_embed_dim": 16,
    "spkr_embed_dim": 16,
}
FIXES["seamless_m4t"] = _SEAMLESS_UNITS
FIXES["seamless_m4t_v2"] = {**_SEAMLESS_UNITS, "t2u_variance_predictor_hidden_dim": 64}

# Qwen/Qwen2.5-Omni-7B's talker reads its codec tokens (8292 to 8296) from its 8448 codes and the thinker's
# text tokens (151859 to 151861), both past the tiny vocabularies: the last of each instead; its DiT's
# codec table (8193 codes) the talker's codes; its BigVGAN's 1536 channels in six upsamplings (most of the
# tiny model's parameters) 32 in two. Its thinker_config sets the vision start token (151652), which
# get_rope_index reads and the config class has no default for, and both decoders' mrope_section ([16, 24,
# 24] of head_dim 128) split the tiny head_dim 16's 8 frequencies: as the sweep's qwen2_5_omni_thinker's
_OMNI_ROPE = {"rope_parameters": {"mrope_section": [2, 3, 3]}}
FIXES["qwen2_5_omni"] = {
    "thinker_config": {"vision_start_token_id": VOCAB - 7, "text_config": _OMNI_ROPE},
    "talker_config": {
        **_OMNI_ROPE,
        **{f"tts_codec_{k}_token_id": VOCAB - i for i, k in enumerate(("mask", "end", "start", "pad"), 1)},
        **{f"tts_text_{k}_token_id": VOCAB - i for i, k in enumerate(("end", "start", "pad"), 20)},
    },
    "token2wav_config": {
        "dit_config": {"num_embeds": VOCAB},
        "bigvgan_config": {
            "upsample_initial_channel": 32,
            "upsample_rates": [2, 2],
            "upsample_kernel_sizes": [4, 4],
            "resblock_kernel_sizes": [3],
            "resblock_dilation_sizes": [[1, 3, 5]],
        },
    },
}

# Qwen/Qwen3-Omni-30B-A3B-Instruct's talker: generate suppresses its last 1024 codec ids (but its eos), so
# its vocabulary is 1024 past the codebook (3072 of 2048); its codec ids (4196 to 4205) and speakers sit in
# that range, past the tiny 128: the last of 64 + 1024 instead. It reads the thinker's hidden states 18 of 48
# layers (one of the tiny 2) and 16 code groups, code2wav's quantizers: 4 each. Its thinker_config sets the
# vision start token (151652), which get_rope_index reads: below the top-level special tokens the sweep puts
# at the tiny vocabulary's last 8 ids
_OMNI3_CODES = 64 + 1024
FIXES["qwen3_omni_moe"] = {
    "thinker_config": {"vision_start_token_id": VOCAB - 20},
    "talker_config": {
        "text_config": {"vocab_size": _OMNI3_CODES},
        "code_predictor_config": {"vocab_size": 64, "num_code_groups": 4},
        "num_code_groups": 4,
        "accept_hidden_layer": 1,
        **{
            k: _OMNI3_CODES - i
            for i, k in enumerate(
                ("codec_eos_token_id", "codec_nothink_id", "codec_think_bos_id", "codec_think_eos_id"), 1
            )
        },
        "codec_pad_id": _OMNI3_CODES - 5,
        "codec_bos_id": _OMNI3_CODES - 6,
        "speaker_id": {"ethan": _OMNI3_CODES - 7},
    },
    "code2wav_config": {"codebook_size": 64, "num_quantizers": 4},
}


# issue #42's "not buildable" rows of every task but feature-extraction (eomt, eomt_dinov3, gemma3n, fast_vlm,
# and the others named below)
# tue/eomt-vit-large (and its DINOv3 variant): its last num_blocks (4) of 24 layers read the queries, which the
# layer num_layers - num_blocks prepends: at 2 layers none would, and the mask head reads no query. The last
# of the tiny 2
FIXES.update(dict.fromkeys(("eomt", "eomt_dinov3"), {"num_blocks": 1}))
FIXES.update(
    {
        # google/gemma-3n-E4B's MobileNetV5 tower (timm's mobilenetv5_300m_enc): stages up to 1280 channels
        # on a 768-pixel image; its fusion adapter's output is always 2048 wide (timm fixes it), which
        # hidden_size must be, and its 16 x 16 grid the 256 image tokens. Its channels a sixteenth, a 2 x 2
        # grid (4 image tokens)
        "gemma3n": {
            "vision_config": {
                "hidden_size": 2048,
                "model_args": {"channel_multiplier": 0.0625, "msfa_output_resolution": 2},
            },
            "vision_soft_tokens_per_image": 4,
        },
        # apple/FastVLM's FastViT-MCi3 tower (timm's fastvit_mci3): 5 stages of (2, 12, 24, 4, 2) blocks, 96
        # to 1536 wide, its head conv twice the last (hidden_size 3072). A block a stage, 16 to 64 wide (its
        # attention stages' heads are 32 wide), the head 128
        "fast_vlm": {
            "vision_config": {
                "hidden_size": 128,
                "model_args": {"layers": [1, 1, 1, 1, 1], "embed_dims": [16, 16, 32, 32, 64]},
            }
        },
        # mistralai/Voxtral-Mini-4B-Realtime-2602's windows (750 audio positions, 8192 tokens) shrunk
        # below the package check's 40 and 10, so that its masks' windows are crossed
        "voxtral_realtime": {"audio_config": {"sliding_window": 16}, "text_config": {"sliding_window": 8}},
        # kyutai/stt-1b-en_fr's Mimi codec: as Mimi's own (above), a base of 16 doubling to 256
        "kyutai_speech_to_text": {"codec_config": {"num_filters": 16}},
        # UsefulSensors/moonshine-streaming-tiny: its decoder layers read num_key_value_heads, which the
        # config class does not define and the checkpoints set (as many as the heads, as the encoder's)
        "moonshine_streaming": {"num_key_value_heads": 4},
        # facebook/detr-resnet-50-panoptic: the mask head reads d_model + the encoder's heads channels
        # (256 + 8), in GroupNorms of 8 groups: the tiny 64 takes 8 heads (of 8) too
        "detr": {"encoder_attention_heads": 8},
        # google/shieldgemma-2-4b-it reads its verdict from the logits of "Yes" and "No" (ids 10784 and 3771,
        # which the model defaults to when the config names none): two ordinary words of the tiny vocabulary
        "shieldgemma2": {**FIXES["shieldgemma2"], "yes_token_index": 4, "no_token_index": 5},
        # omlab/omdet-turbo-swin-tiny-hf: its encoder reads the timm Swin-T's stages 1 to 3 (192, 384 and 768
        # channels); the sweep's stand-in, timm's test ResNet, gives 32, 48 and 192 there. Swin's maps are
        # channels last, which the layer norms after the backbone read; the ResNet's are channels first, as
        # a convolutional backbone's, for which the config turns those norms off (Swin-T itself is 27M
        # parameters at any config: timm_kwargs passes on only its image size). Its encoder's width
        # (d_model), the projected features' and the decoder's are one (256), half its class embeddings' and
        # text tower's (512; transformers defines the decoder's task projection only where the two differ,
        # and reads it anyway): 32 against the tiny 64, the feed-forwards 2 x it, the decoder 2 layers of 4
        # heads and 16 queries
        "omdet-turbo": {
            "encoder_in_channels": [32, 48, 192],
            "apply_layernorm_after_vision_backbone": False,
            "d_model": 32,
            "vision_features_channels": [32, 32, 32],
            "decoder_hidden_dim": 32,
            "decoder_num_heads": 4,
            "decoder_num_layers": 2,
            "decoder_dim_feedforward": 64,
            "encoder_dim_feedforward": 64,
            "task_encoder_hidden_dim": 128,
            "num_queries": 16,
        },
        # nvidia's Nemotron 3.5 Transcribe: its ASR and diarization encoders and its word-timestamp encoder
        # leave num_key_value_heads unset (as many as their heads), and transformers' load-time conversion
        # splits their fused projections in three equal parts: the tiny 2 key-value heads of 4 do not load
        # back (as the encoders' own entries above)
        "nemo_speechlm": {
            **FIXES["nemo_speechlm"],
            "audio_config": {
                "asr_config": {"num_key_value_heads": 4},
                "diarization_config": {"audio_config": {"num_key_value_heads": 4}},
            },
            "word_timestamp_config": {
                **FIXES["nemo_speechlm"]["word_timestamp_config"],
                "num_key_value_heads": 4,
            },
        },
        # baidu/ERNIE-4.5-VL-28B-A3B-PT: mrope_section [22, 22, 20] (its rotary's default) splits head_dim
        # 128's 64 frequencies over rows, columns and time; the tiny head_dim 16 has 8, split alike. Its
        # tower's 32 blocks of 16 heads: 2 of 4, as the other Qwen-VL-style towers'
        "ernie4_5_vl_moe": {
            "text_config": {"rope_parameters": {"mrope_section": [3, 3, 2]}},
            "vision_config": {"depth": 2, "num_heads": 4},
        },
    }
)

# shi-labs/oneformer_ade20k_swin_tiny: conv_dim, mask_dim and hidden_dim all 256. Its transformer module
# projects the pixel decoder's features (conv_dim) to hidden_dim with convolutions it keeps in a plain list,
# which no checkpoint holds (drawn anew at every load) and which exist only where the two differ: the
# generic shrinking halved hidden_dim alone. The three at the tiny 64, and the feed-forwards 2 x it
FIXES["oneformer"] = {
    "conv_dim": 64,
    "mask_dim": 64,
    "hidden_dim": 64,
    "dim_feedforward": 128,
    "encoder_feedforward_dim": 128,
    "text_encoder_width": 64,
}


# Salesforce/blip2-itm-vit-g: the retrieval model's Q-Former reads the text too (its checkpoint's
# use_qformer_text_input), without which its layers have no text feed-forward to run; the query-only
# forwards of the other BLIP-2 classes leave those layers unused
FIXES["blip-2"] = {"qformer_config": {"use_qformer_text_input": True}}


def tiny_fixes(model_type: str) -> dict[str, Any]:
    """The overrides for ``model_type`` (sub-configs as nested dicts; none for most architectures)."""
    return FIXES.get(model_type, {})


# issue #42's "not buildable" rows of feature-extraction (sam, sam_hq, ... named below)
# facebook/sam-vit-base (and SAM-HQ's): a ViT of 768 over 1024 pixels in 16-pixel patches (64 x 64), its neck
# out to the prompt encoder's and mask decoder's 256 channels, which the dense prompt is added to on that
# 64 x 64 grid (image_embedding_size); the shared positional table's 2 x 128 features are those 256 too; 4 of
# its 12 blocks attend globally. At the tiny 64 wide over 32 pixels in patches of 8: a 4 x 4 grid, a neck
# out to 64, 2 x 32 positional features, the second block global; MLPs 4 x (vision) and 2 x (decoder) wide
_SAM = {
    "vision_config": {"output_channels": 64, "mlp_dim": 256, "global_attn_indexes": [1], "num_pos_feats": 32},
    "prompt_encoder_config": {"image_embedding_size": 4},
    "mask_decoder_config": {"mlp_dim": 128, "iou_head_hidden_dim": 64},
}
FIXES.update(dict.fromkeys(("sam", "sam_hq"), _SAM))
# facebook/sam3: a ViT of 1024 over 1008 pixels in 14-pixel patches (72 x 72), its position table learned at
# pretrain_image_size (336: 24 x 24) and tiled over the grid, windows of 24 (3 x 3 of them), 4 of its 32
# blocks global; its FPN (256 wide: the DETR encoder's, decoder's and mask decoder's width) scales the grid
# by 4, 2, 1 and 0.5, the first three the backbone_feature_sizes. At the tiny 64 wide over 32 pixels in
# patches of 8: a 4 x 4 grid, its table at 2 x 2 tiled twice, windows of 2, the second block global; the FPN
# 64 wide, its features 16, 8 and 4 a side
_SAM3_VISION = {
    "backbone_config": {"window_size": 2, "global_attn_indexes": [1], "pretrain_image_size": 16},
    "fpn_hidden_size": 64,
    "backbone_feature_sizes": [[16, 16], [8, 8], [4, 4]],
}
FIXES.update(dict.fromkeys(("sam3", "sam3_lite_text"), {"vision_config": _SAM3_VISION}))
# facebook/sam3's tracker: its vision tower as sam3's (above); the mask decoder's MLPs 2 x and its IoU head as
# wide as the tiny 64 (2048 and 256 of the checkpoint's 256)
_SAM_DECODER = {"mlp_dim": 128, "iou_head_hidden_dim": 64}
# (its video tracker: the same tower and mask decoder)
FIXES.update(
    dict.fromkeys(
        ("sam3_tracker", "sam3_tracker_video"),
        {"vision_config": _SAM3_VISION, "mask_decoder_config": _SAM_DECODER},
    )
)
# yonigozlan/EdgeTAM-hf: timm's RepViT-M1 (48 to 384 channels at strides 4 to 32), whose name the config
# class's default misspells ("archirecture"), so timm builds its default ResNet-50 (256 to 2048 channels) that
# the neck's backbone_channel_list does not take: RepViT-M1 as the checkpoint names it, its widths as they are
# (4.5M parameters). On the 224 pixels fastonnx feeds a config naming no image size: stages of 56, 28, 14, 7,
# the three finest the backbone_feature_sizes, the prompt encoder's 16-pixel patches the 14 x 14 grid; the FPN
# (256) and the mask decoder as wide as the tiny 64
_EDGETAM_VISION = {
    "backbone_config": {"architecture": "repvit_m1"},
    "backbone_feature_sizes": [[56, 56], [28, 28], [14, 14]],
    "fpn_hidden_size": 64,
}
_EDGETAM = {
    "vision_config": _EDGETAM_VISION,
    "prompt_encoder_config": {"image_size": 224, "patch_size": 16},
    "mask_decoder_config": _SAM_DECODER,
}
FIXES.update({"edgetam_vision_model": _EDGETAM_VISION, "edgetam": _EDGETAM})
# EdgeTAM's video model: its config class's vision tower is SAM 2's Hiera (sam2_vision_model), shrunk as
# sam2's (above), over the same 224 pixels (image_size, which its masks are resized to)
FIXES["edgetam_video"] = {**_SAM2, "image_size": 224}
# PaddlePaddle's UVDoc: its head concatenates the feature maps of its 6 bridge stages (its connector reads 6 x
# 128 channels), which the backbone config's out_features name; the config class's default names the last
# stage alone (128 channels), at any size. All six, as the head reads them
FIXES["uvdoc"] = {
    "backbone_config": {"out_features": [f"stage{i}" for i in range(1, 7)], "out_indices": [1, 2, 3, 4, 5, 6]}
}
# Intel/tvp-base: its frame-pad visual prompt is laid over frames of max_img_size (448, the size its processor
# resizes and pads frames to), 96 pixels of each border. fastonnx feeds a config naming no image size 224-pixel
# frames: max_img_size those 224, the border as it is
FIXES["tvp"] = {"max_img_size": 224}
# google/t5gemma-2's encoder alone: its text layers read dropout_rate, which T5Gemma2Config's __post_init__
# copies into encoder.text_config (so its checkpoints' encoder configs carry it) but T5Gemma2TextConfig does
# not define: the bare encoder config fails at any size without it. The composite's default, 0
FIXES["t5gemma2_encoder"] = {"text_config": {"dropout_rate": 0.0}}
# zju-community/efficientloftr: its 2-D rotary table fills hidden_size / 4 channels from the frequencies of a
# head (head_dim x partial_rotary_factor 4 / 2): 256 wide in 8 heads of 32 fills 64 with 64. Only 8 heads
# fill it (the tiny 64 in 8 heads of 8: 16 with 16), as the checkpoint's 8; its keys are viewed hidden_size
# wide, so as many key-value heads (its config class derives them so; the sweep's shrinking set 2)
FIXES["efficientloftr"] = {**FIXES["efficientloftr"], "num_attention_heads": 8, "num_key_value_heads": 8}
# laion/clap-htsat-unfused: its audio Swin's widths double over its 4 stages from patch_embeds_hidden_size
# (96) to its hidden_size (768 = 96 x 8), which the audio projection reads. From the tiny 64 / 8
FIXES["clap"] = {"audio_config": {"patch_embeds_hidden_size": 8}}
