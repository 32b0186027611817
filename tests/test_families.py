"""The model families (DINOv2, CLIP, SigLIP, DeiT, DeiT III): every named model gives timm's
outputs for the same weights, on both attention paths, at its native size and a resampled one;
state dicts load strictly both ways; weights that do not fit a switch name the tensors."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import timm
import torch
from conftest import RTOL, fake_hub_cache, relative_error

import vit
from vit.models import families
from vit.models.registry import MODELS
from vit.models.vision_transformer import VisionTransformerDistilled, model_class

FAMILIES = ("dinov2", "clip", "siglip", "deit", "deit3")
FAMILY_NAMES = [name for name, spec in MODELS.items() if spec.family in FAMILIES]
# One per family runs on every commit; the rest are slow.
FAST = {
    "vit_small_patch14_reg4_dinov2",
    "vit_base_patch32_clip_quickgelu_224",
    "vit_base_patch16_siglip_224",
    "deit_tiny_distilled_patch16_224",
    "deit3_small_patch16_224",
}
# Blocks are identical modules, so more of them add cost but no code path: the FAST models run
# at full depth, the others with their first MAX_DEPTH blocks (full width, heads, switches,
# image size and position embeddings), which keeps the slow set to a few minutes on a CPU.
MAX_DEPTH = 2


def timm_and_ours(name: str, **kwargs) -> tuple[torch.nn.Module, vit.VisionTransformer]:
    """timm's randomly initialised model and ours with its weights, loaded strictly."""
    if name not in FAST and "depth" not in kwargs:
        kwargs["depth"] = MAX_DEPTH
    torch.manual_seed(0)
    theirs = timm.create_model(name, **kwargs).eval()
    for key, p in theirs.named_parameters():
        if key.endswith("gamma"):  # LayerScale starts at 1e-5: the blocks would barely count
            p.data.uniform_(0.1, 1.0)
    ours = vit.create_model(name, **kwargs).eval()
    ours.load_state_dict(theirs.state_dict(), strict=True)  # same names, no remapping
    return theirs, ours


def other_size(name: str) -> tuple[int, int]:
    """A smaller input than the native one: a few patches per side, so resampling is cheap."""
    patch = MODELS[name].arch["patch_size"]
    side = patch * (5 if patch == 32 else 7)
    return (side, side)


def assert_same_outputs(theirs, ours, size: tuple[int, int]) -> None:
    x = torch.randn(1, 3, *size)
    with torch.no_grad():
        reference = theirs(x)
        for fused in (True, False):
            ours.set_fused_attn(fused)
            out = ours(x)
            assert out.shape == reference.shape
            assert relative_error(out, reference) <= RTOL, f"fused_attn={fused} at {size}"


@pytest.mark.parametrize(
    "name",
    [n if n in FAST else pytest.param(n, marks=pytest.mark.slow) for n in FAMILY_NAMES],
)
def test_every_family_model_matches_timm_at_native_and_resampled_size(name):
    # A native size the patch does not divide (so400m at 384 px) leaves a margin, which a
    # dynamic model refuses, timm's as ours: that model is compared at its fixed size.
    margin = bool(MODELS[name].arch["img_size"] % MODELS[name].arch["patch_size"])
    # Native size: logits, or features for the headless (num_classes=0) models.
    theirs, ours = timm_and_ours(name, dynamic_img_size=not margin)
    assert ours.num_prefix_tokens == theirs.num_prefix_tokens
    assert_same_outputs(theirs, ours, ours.patch_embed.img_size)
    if margin:  # timm's dynamic twin, for the other size below
        dynamic = timm.create_model(name, dynamic_img_size=True, depth=len(ours.blocks))
        dynamic.load_state_dict(theirs.state_dict())
        theirs = dynamic.eval()
    else:
        # Another size, position embeddings resampled on the fly (timm's dynamic_img_size)
        assert_same_outputs(theirs, ours, other_size(name))
    # ... and resampled once when loading into a model built for that size
    resized = vit.create_model(name, img_size=other_size(name), depth=len(ours.blocks))
    vit.load_weights(resized, theirs)
    assert_same_outputs(theirs, resized.eval(), other_size(name))


@pytest.mark.parametrize("name", sorted(FAST) + ["vit_small_patch16_224"])
def test_state_dicts_load_strictly_both_ways(name):
    theirs, ours = timm_and_ours(name)
    for p in ours.parameters():  # new values, so loading back into timm is visible
        p.data.normal_(std=0.02)
    theirs.load_state_dict(ours.state_dict(), strict=True)
    assert list(ours.state_dict()) == list(theirs.state_dict())  # same names, same order
    x = torch.randn(1, 3, *ours.patch_embed.img_size)
    with torch.no_grad():
        assert relative_error(ours(x), theirs(x)) <= RTOL


@pytest.mark.parametrize("name", ["vit_small_patch16_224.dino", "vit_base_patch16_224.mae"])
def test_self_supervised_tags_are_headless_backbones_like_timms(name):
    theirs, ours = timm_and_ours(name)
    assert ours.num_classes == theirs.num_classes == 0
    assert_same_outputs(theirs, ours, (224, 224))


def test_switch_parameters_have_timms_names_and_init():
    model = vit.VisionTransformer(
        img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, init_values=1e-5,
        reg_tokens=4, no_embed_class=True, pre_norm=True,
    )  # fmt: skip
    sd = model.state_dict()
    assert torch.equal(sd["blocks.1.ls2.gamma"], torch.full((32,), 1e-5))
    assert sd["reg_token"].shape == (1, 4, 32) and sd["reg_token"].abs().max() < 1e-4
    assert sd["pos_embed"].shape == (1, 16, 32)  # patches only: no_embed_class
    assert "norm_pre.weight" in sd and "patch_embed.proj.bias" not in sd  # CLIP: no bias
    assert model.num_prefix_tokens == 5
    siglip = vit.VisionTransformer(
        img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, class_token=False,
        global_pool="map", num_classes=0,
    )  # fmt: skip
    pool_keys = {k for k in siglip.state_dict() if k.startswith("attn_pool.")}
    assert pool_keys == {
        f"attn_pool.{k}"
        for k in (
            "latent", "q.weight", "q.bias", "kv.weight", "kv.bias", "proj.weight", "proj.bias",
            "norm.weight", "norm.bias", "mlp.fc1.weight", "mlp.fc1.bias", "mlp.fc2.weight",
            "mlp.fc2.bias",
        )
    }  # fmt: skip
    assert siglip.num_prefix_tokens == 0 and "cls_token" not in siglip.state_dict()
    assert 0.5 < siglip.attn_pool.latent.std().item() * 32**0.5 < 1.5  # std D**-0.5


@pytest.mark.parametrize("act_layer", ["gelu", "gelu_tanh", "quick_gelu"])
def test_activations_match_timms(act_layer):
    from timm.models.vision_transformer import VisionTransformer as TimmViT

    kwargs = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=5)
    torch.manual_seed(0)
    theirs = TimmViT(**kwargs, act_layer=act_layer).eval()
    ours = vit.VisionTransformer(**kwargs, act_layer=act_layer).eval()
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(ours(x), theirs(x))  # same kernels on the same tensors: same bits
        if act_layer != "gelu":  # and the activation matters: exact GELU gives other numbers
            exact = vit.VisionTransformer(**kwargs).eval()
            exact.load_state_dict(theirs.state_dict())
            assert not torch.equal(exact(x), theirs(x))


def test_attention_pool_softmax_is_observable_on_the_explicit_path():
    model = vit.VisionTransformer(
        img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=4, class_token=False,
        global_pool="map", num_classes=0,
    ).eval()  # fmt: skip
    seen = []
    model.attn_pool.softmax.register_forward_hook(lambda m, i, out: seen.append(out))
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        fused = model(x)
        assert not seen  # the fused path never materialises the probabilities
        model.set_fused_attn(False)
        explicit = model(x)
    assert len(seen) == 1 and seen[0].shape == (2, 4, 1, 16)  # (B, nh, 1 query, 16 patches)
    torch.testing.assert_close(seen[0].sum(-1), torch.ones(2, 4, 1))
    torch.testing.assert_close(explicit, fused, rtol=1e-5, atol=1e-6)


def test_distilled_model_averages_its_heads_and_trains_like_timm():
    theirs, ours = timm_and_ours("deit_tiny_distilled_patch16_224", img_size=64)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        features = ours.forward_features(x)
        mean = (ours.head(features[:, 0]) + ours.head_dist(features[:, 1])) / 2
        torch.testing.assert_close(ours(x), mean)
        ours.train(), theirs.train()
        # training without distillation: still the mean (timm's fine-tuning behaviour)
        assert relative_error(ours(x), theirs(x)) <= RTOL
        ours.set_distilled_training(True), theirs.set_distilled_training(True)
        (cls, dist), (t_cls, t_dist) = ours(x), theirs(x)
        assert relative_error(cls, t_cls) <= RTOL and relative_error(dist, t_dist) <= RTOL
    assert [h.out_features for h in ours.get_classifier()] == [1000, 1000]
    ours.reset_classifier(7)
    assert ours.head.out_features == ours.head_dist.out_features == 7
    assert ours.no_weight_decay() == {"pos_embed", "cls_token", "dist_token"}


def test_get_classifier_and_reset_classifier_follow_timm():
    theirs, ours = timm_and_ours("vit_base_patch16_siglip_224", img_size=32)
    assert type(ours.get_classifier()) is type(theirs.get_classifier()) is torch.nn.Identity
    ours.reset_classifier(3)
    assert ours.get_classifier().out_features == 3
    ours.reset_classifier(0, global_pool="avg")  # the attention pool goes, as in timm
    assert ours.attn_pool is None and ours(torch.randn(1, 3, 32, 32)).shape == (1, 768)
    ours.reset_classifier(0, global_pool="")  # no pooling: every token
    assert ours(torch.randn(1, 3, 32, 32)).shape == (1, 4, 768)
    with pytest.raises(ValueError, match="cannot be added"):
        ours.reset_classifier(0, global_pool="map")


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(indices=None),
        dict(indices=2, norm=True),
        dict(indices=[0, -1], return_prefix_tokens=True),
        dict(indices=[1], output_fmt="NLC", intermediates_only=True),
        dict(indices=[0, 2], stop_early=True, intermediates_only=True, return_prefix_tokens=True),
    ],
)
def test_forward_intermediates_matches_timm(kwargs):
    theirs, ours = timm_and_ours("vit_small_patch14_reg4_dinov2", img_size=56, depth=3)
    x = torch.randn(2, 3, 56, 56)
    with torch.no_grad():
        expected, got = (
            theirs.forward_intermediates(x, **kwargs),
            ours.forward_intermediates(x, **kwargs),
        )
    if not kwargs.get("intermediates_only"):
        torch.testing.assert_close(got[0], expected[0], rtol=RTOL, atol=1e-6)
        expected, got = expected[1], got[1]
    assert len(got) == len(expected)
    flat = lambda items: [
        t for item in items for t in (item if isinstance(item, tuple) else (item,))
    ]  # noqa: E731
    for a, b in zip(flat(got), flat(expected), strict=True):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=RTOL, atol=1e-6)


def test_forward_intermediates_names_bad_arguments():
    model = vit.VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2)
    x = torch.randn(1, 3, 32, 32)
    with pytest.raises(ValueError, match="output_fmt must be"):
        model.forward_intermediates(x, output_fmt="NHWC")
    with pytest.raises(ValueError, match=r"block indices \[5\] out of range for 2 blocks"):
        model.forward_intermediates(x, indices=[5])
    with pytest.raises(ValueError, match="last 3 of 2 blocks"):
        model.forward_intermediates(x, indices=3)


def test_grad_checkpointing_recomputes_blocks_and_gives_the_same_gradients():
    torch.manual_seed(0)
    model = vit.VisionTransformer(
        img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=3
    )
    torch.nn.init.normal_(model.head.weight, std=0.1)
    calls = []
    model.blocks[0].register_forward_pre_hook(lambda *args: calls.append(1))
    x = torch.randn(2, 3, 32, 32)

    def gradients():
        model.zero_grad()
        calls.clear()
        model(x).square().sum().backward()
        return [p.grad.clone() for p in model.parameters()]

    plain, plain_calls = gradients(), len(calls)
    model.set_grad_checkpointing(True)
    checkpointed, checkpointed_calls = gradients(), len(calls)
    assert (plain_calls, checkpointed_calls) == (1, 2)  # recomputed in the backward pass
    for a, b in zip(plain, checkpointed, strict=True):
        torch.testing.assert_close(a, b)


def test_weights_without_a_switchs_tensors_name_them():
    dinov2 = timm.create_model("vit_small_patch14_dinov2", img_size=56, depth=2)
    small = dict(img_size=56, patch_size=14, embed_dim=384, depth=2, num_heads=6, num_classes=0)
    # LayerScale silently dropped is the classic bug: here it is a KeyError naming the tensors
    with pytest.raises(KeyError, match=r"unexpected keys \['blocks.0.ls1.gamma'.*init_values"):
        vit.load_weights(vit.VisionTransformer(**small), dinov2)
    with pytest.raises(KeyError, match=r"missing keys \['blocks.0.ls1.gamma'.*lack.*init_values"):
        vit.load_weights(
            vit.VisionTransformer(**small, init_values=1e-5), vit.VisionTransformer(**small)
        )
    registers = timm.create_model("vit_small_patch14_reg4_dinov2", img_size=56, depth=2)
    no_registers = vit.VisionTransformer(**small, init_values=1e-5, no_embed_class=True)
    with pytest.raises(KeyError, match=r"unexpected keys \['reg_token'\].*have.*reg_tokens"):
        vit.load_weights(no_registers, registers)
    deit = timm.create_model("deit_tiny_distilled_patch16_224", img_size=32, depth=1)
    with pytest.raises(ValueError, match="pos_embed of 6 tokens.*prefix-token switches"):
        vit.load_weights(vit.create_model("deit_tiny_patch16_224", img_size=32, depth=1), deit)


def test_distilled_and_register_switches_refuse_what_timm_cannot_express():
    with pytest.raises(ValueError, match="distilled=True reads the class and distillation"):
        vit.VisionTransformer(distilled=True, global_pool="avg")
    with pytest.raises(ValueError, match="act_layer must be one of"):
        vit.VisionTransformer(act_layer="relu")
    with pytest.raises(ValueError, match="global_pool must be one of"):
        vit.VisionTransformer(global_pool="mean")


# -- names, tags, pretrained weights, transforms ------------------------------------------------
def test_list_models_filters_like_timm():
    for pattern in ("vit_small*", "*dinov2*", "deit3_*", "*siglip_224"):
        ours = vit.list_models(pattern)
        # timm's names for the pattern, plus this project's CIFAR names
        assert ours and set(ours) - set(timm.list_models(pattern)) <= {"vit_small_patch4_32"}
        assert set(timm.list_models(pattern)) & set(vit.list_models()) == set(ours) & set(
            timm.list_models()
        )
    tagged = vit.list_models("*clip*", pretrained=True)
    assert "vit_base_patch16_clip_224.openai" in tagged
    assert set(tagged) <= set(timm.list_models("*clip*", pretrained=True))
    assert vit.list_models(["deit_tiny*", "deit_small*"]) == [
        "deit_small_distilled_patch16_224",
        "deit_small_patch16_224",
        "deit_tiny_distilled_patch16_224",
        "deit_tiny_patch16_224",
    ]


def test_a_tag_selects_its_preprocessing_and_head():
    openai = vit.create_model("vit_large_patch14_clip_224.openai", depth=1)
    laion = vit.create_model("vit_large_patch14_clip_224.laion2b", depth=1)
    assert openai.num_classes == laion.num_classes == 768  # CLIP's image projection
    assert openai.preprocess.mean == pytest.approx((0.48145466, 0.4578275, 0.40821073))
    assert laion.preprocess.mean == (0.5, 0.5, 0.5)
    assert vit.create_model("vit_base_patch16_224.dino", depth=1).num_classes == 0
    assert vit.create_model("vit_tiny_patch16_224.augreg_in21k", depth=1).num_classes == 21843
    with pytest.raises(ValueError, match="unknown pretrained tag 'dinov3'.*augreg2.*dino, mae"):
        vit.create_model("vit_base_patch16_224.dinov3")


def test_pretrained_offline_reads_the_hub_cache(tmp_path, monkeypatch):
    import huggingface_hub.constants

    torch.manual_seed(0)
    theirs = timm.create_model("deit_tiny_distilled_patch16_224").eval()
    fake_hub_cache(
        tmp_path, "timm/deit_tiny_distilled_patch16_224.fb_in1k", "model.safetensors",
        theirs.state_dict(),
    )  # fmt: skip
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    ours = vit.create_model("deit_tiny_distilled_patch16_224", pretrained=True).eval()
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        assert relative_error(ours(x), theirs(x)) <= RTOL


@pytest.mark.parametrize("cause", ["HF_HUB_OFFLINE", "no network"])
def test_pretrained_without_network_fails_fast_in_one_line(cause, tmp_path, monkeypatch):
    import socket

    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))  # empty
    if cause == "HF_HUB_OFFLINE":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    else:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)

        def unreachable(*args, **kwargs):
            raise OSError("Network is unreachable")

        monkeypatch.setattr(socket, "create_connection", unreachable)
    start = time.monotonic()
    with pytest.raises(ConnectionError) as error:
        vit.create_model("vit_small_patch14_dinov2", pretrained=True)
    assert time.monotonic() - start < 10  # the hub client's retries took 47-54 s
    message = str(error.value)
    assert "\n" not in message and "vit_small_patch14_dinov2.lvd142m" in message
    assert cause in message or "no network" in message
    assert "pretrained=PATH" in message


@pytest.mark.parametrize(
    "name", ["vit_base_patch16_clip_224.openai", "vit_base_patch16_siglip_256"]
)
def test_create_transform_from_a_name_matches_timms_eval_transform(name):
    import numpy as np
    from PIL import Image
    from timm.data import create_transform as timm_create_transform
    from timm.data import resolve_data_config

    image = Image.fromarray(
        np.random.default_rng(0).integers(0, 255, (300, 260, 3), dtype=np.uint8)
    )
    with torch.device("meta"):
        config = resolve_data_config({}, model=timm.create_model(name))
    expected = timm_create_transform(**config)(image)
    torch.testing.assert_close(vit.create_transform(name)(image), expected, rtol=0, atol=0)
    torch.testing.assert_close(vit.create_transform(config)(image), expected, rtol=0, atol=0)


def test_create_transform_for_training_augments_at_the_models_size():
    from PIL import Image

    image = Image.new("RGB", (300, 200), (200, 30, 90))
    image.paste((10, 200, 30), (0, 0, 150, 200))
    transform = vit.create_transform("vit_base_patch16_siglip_256", is_training=True)
    first, second = transform(image), transform(image)
    assert first.shape == second.shape == (3, 256, 256)
    assert not torch.equal(first, second)  # random crops, flips, RandAugment
    assert first.min() >= -1.0 - 1e-6 and first.max() <= 1.0 + 1e-6  # mean = std = 0.5
    with pytest.raises(TypeError, match="create_transform takes"):
        vit.create_transform(3)


def test_saved_family_models_reload_with_their_switches(tmp_path):
    for name in ("deit_tiny_distilled_patch16_224", "vit_small_patch14_reg4_dinov2"):
        model = vit.create_model(name, img_size=56 if "dinov2" in name else 32, depth=1).eval()
        for p in model.parameters():
            p.data.normal_(std=0.02)
        path = vit.save_weights(model, tmp_path / f"{name}.safetensors")
        loaded = vit.load_model(path).eval()
        assert loaded.config == model.config and loaded.preprocess == model.preprocess
        x = torch.randn(1, 3, *model.patch_embed.img_size)
        with torch.no_grad():
            assert torch.equal(loaded(x), model(x))


# -- the family records (vit.models.families) ----------------------------------------------------
def test_every_named_model_is_read_as_its_familys_record():
    records = {  # ModelSpec.family -> the records its names may be
        "dinov2": {"dinov2", "dinov2_reg"},
        "deit": {"deit", "vit"},  # distilled or not
        "cifar": {"vit"},
    }
    for name, spec in MODELS.items():
        family = families.family_of(vit.ViTConfig(**spec.arch))
        # SigLIP's gap towers average the patch tokens: a plain ViT without a class token
        expected = {"vit"} if "_siglip_gap_" in name else records.get(spec.family, {spec.family})
        assert family.name in expected, name
        assert family.switches.items() <= spec.arch.items(), name  # presets: the record's


@pytest.mark.parametrize(
    "family", [f for f in families.FAMILIES if f.switches], ids=lambda family: family.name
)
def test_each_record_names_the_tensors_its_switches_create(family):
    tiny = dict(img_size=16, patch_size=8, embed_dim=16, depth=1, num_heads=2)
    keys = list(vit.VisionTransformer(**tiny, **family.switches).state_dict())
    plain = list(vit.VisionTransformer(**tiny).state_dict())
    for fragment in family.tensors:
        removed = fragment == "cls_token" and family.switches["class_token"] is False  # SigLIP
        assert any(fragment in key for key in keys) != removed, fragment
        assert any(fragment in key for key in plain) == (fragment == "cls_token"), fragment
    assert families.family_of(vit.ViTConfig(**tiny, **family.switches)) is family


def test_readout_of_names_the_tokens_the_head_reads():
    tiny = dict(img_size=16, patch_size=8, embed_dim=16, depth=1, num_heads=2)
    assert families.readout_of(vit.VisionTransformer(**tiny)) == families.Readout("token", (0,))
    distilled = vit.VisionTransformer(**tiny, distilled=True)
    assert families.readout_of(distilled) == families.Readout("token", (0, 1))
    siglip = vit.VisionTransformer(**tiny, **families.SIGLIP.switches)
    assert families.readout_of(siglip) == families.Readout("map")
    model = vit.VisionTransformer(**tiny, reg_tokens=2)
    model.reset_classifier(0, global_pool="avg")  # the model's current readout, not its config's
    assert families.readout_of(model) == families.Readout("avg")
    assert families.readout_of(vit.ViTConfig(global_pool="")) == families.Readout("")


def test_transformers_model_types_are_read_by_their_familys_layout():
    named = {layout for family in families.BY_NAME.values() for layout in family.layouts}
    assert named == set(vit.interop.layouts.BY_NAME)  # every layout reads some family's checkpoints
    assert set(vit.interop.layouts.CONFIGS) == set(families.BY_MODEL_TYPE)
    for model_type, family in families.BY_MODEL_TYPE.items():
        assert vit.interop.layouts.CONFIGS[model_type].__name__.endswith("." + family.hf_layout)
    mae = families.family_of(vit.ViTConfig(num_classes=0), "vit_base_patch16_224.mae")
    assert mae is families.MAE and mae.hf_class(0).name == "ViTMAEModel"
    assert families.family_of(vit.ViTConfig(), "facebook/vit-mae-base") is families.MAE
    assert families.family_of(vit.ViTConfig(), "vit_base_patch16_224.augreg") is families.VIT
    with pytest.raises(ValueError, match="transformers cannot hold this DeiT III model"):
        families.DEIT3.hf_class(1000)


def test_families_and_configs_import_without_torch():
    code = "import sys, vit.models.families, vit.models.registry; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_a_distilled_config_builds_the_distilled_subclass_everywhere(tmp_path):
    tiny = dict(img_size=16, patch_size=8, embed_dim=16, depth=1, num_heads=2, num_classes=3)
    distilled = vit.VisionTransformer(**tiny, distilled=True)
    assert type(distilled) is VisionTransformerDistilled is model_class({"distilled": True})
    plain = vit.VisionTransformer(**tiny)
    assert type(plain) is vit.VisionTransformer and not hasattr(plain, "dist_token")
    assert type(vit.create_model("deit_tiny_distilled_patch16_224", depth=1)) is type(distilled)
    path = vit.save_weights(distilled, tmp_path / "deit.safetensors")
    assert type(vit.load_model(path)) is VisionTransformerDistilled
    with pytest.raises(ValueError, match="reads its class and distillation tokens"):
        distilled.reset_classifier(3, global_pool="avg")
