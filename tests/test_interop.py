"""Checkpoints from transformers and torchvision: recognised by their keys, logits equal theirs.

Every model here is randomly initialised and saved to tmp_path: nothing is downloaded. Logits
are compared in float32, eval mode, as max |ours - theirs| / max |theirs| <= 1e-5 (the other
libraries run other attention kernels, so the last bits differ).
"""

import json
import logging
import re

import pytest
import torch
from conftest import RTOL, relative_error
from safetensors.torch import load_file

import vit
from vit.interop.layouts import torchvision as torchvision_layout
from vit.models.pos_embed import resample_pos_embed

transformers = pytest.importorskip("transformers")
torchvision = pytest.importorskip("torchvision")

SMALL_HF = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=128,
    image_size=32,
    patch_size=8,
)
NAMES = ["cat", "dog", "ship"]


def images(size: int = 32, batch: int = 3, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(seed))


def hf_classifier(**overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.ViTConfig(
        **{**SMALL_HF, **overrides},
        id2label=dict(enumerate(NAMES)),
        label2id={n: i for i, n in enumerate(NAMES)},
    )
    return transformers.ViTForImageClassification(config).eval()


def hf_logits(model, x):
    with torch.no_grad():
        return model(pixel_values=x).logits


def our_logits(model, x):
    with torch.no_grad():
        return model.eval()(x)


# -- transformers folders ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides",
    [{}, {"qkv_bias": False, "layer_norm_eps": 1e-6}, {"image_size": 48, "patch_size": 16}],
    ids=["defaults-eps-1e-12", "no-qkv-bias-eps-1e-6", "other-size"],
)
def test_transformers_folder_loads_with_config_and_class_names(tmp_path, one_thread, overrides):
    theirs = hf_classifier(**overrides)
    theirs.save_pretrained(tmp_path / "hf")
    ours = vit.load_model(tmp_path / "hf")
    config = theirs.config
    assert ours.class_names == NAMES
    assert ours.config.norm_eps == config.layer_norm_eps
    assert ours.config.qkv_bias == config.qkv_bias
    assert ours.patch_embed.img_size == (config.image_size,) * 2
    assert ours.preprocess.mean == (0.5, 0.5, 0.5)  # ViTImageProcessor's defaults
    x = images(config.image_size)
    assert relative_error(our_logits(ours, x), hf_logits(theirs, x)) <= RTOL


def edit_config(folder, **changes) -> None:
    """Change config.json's entries (a value None removes the entry)."""
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps({k: v for k, v in config.items() if v is not None}))


def test_transformers_classifier_is_sized_by_its_weights_not_config_metadata(tmp_path, one_thread):
    """Without `architectures` transformers still loads ViTForImageClassification's head: so do
    we (its size is the classifier's rows, not a count of config.json's entries)."""
    theirs = hf_classifier()
    theirs.save_pretrained(tmp_path / "hf")
    edit_config(tmp_path / "hf", architectures=None)
    ours = vit.load_model(tmp_path / "hf")
    assert ours.num_classes == 3 and ours.class_names == NAMES
    x = images()
    assert relative_error(our_logits(ours, x), hf_logits(theirs, x)) <= RTOL


@pytest.mark.parametrize(
    ("id2label", "refusal"),
    [
        ({"0": "cat", "2": "ship"}, r"no name for \[1\]"),  # would build a 2-class head
        ({"0": "cat", "1": "dog", "3": "ship"}, r"ids \[3\] outside them; no name for \[2\]"),
    ],
    ids=["gap", "id-beyond-the-head"],
)
def test_transformers_id2label_that_does_not_name_each_output_is_refused(
    tmp_path, one_thread, id2label, refusal
):
    """Counting id2label's entries built a head of another size and dropped the trained one
    with a warning (transformers refuses such a folder): now refused, naming the ids."""
    hf_classifier().save_pretrained(tmp_path / "hf")
    edit_config(tmp_path / "hf", id2label=id2label, label2id=None)
    folder = re.escape(str(tmp_path / "hf"))
    with pytest.raises(ValueError, match=f"{folder}: .*3 outputs 0..2 .*{refusal}"):
        vit.load_model(tmp_path / "hf")


def test_transformers_id2label_is_read_by_id(tmp_path, one_thread):
    hf_classifier().save_pretrained(tmp_path / "hf")
    edit_config(tmp_path / "hf", id2label={"2": "ship", "0": "cat", "1": "dog"})
    assert vit.load_model(tmp_path / "hf").class_names == NAMES


def test_eps_matters_and_the_folder_carries_it(tmp_path, one_thread, caplog):
    """Built with timm's 1e-6 instead of the checkpoint's 1e-12, the same weights give other
    logits, and loading says so."""
    theirs = hf_classifier()
    with torch.no_grad():  # tiny LayerNorm inputs make eps matter
        theirs.vit.embeddings.patch_embeddings.projection.weight.mul_(1e-3)
        theirs.vit.embeddings.patch_embeddings.projection.bias.zero_()
        theirs.vit.embeddings.position_embeddings.mul_(1e-3)
        theirs.vit.embeddings.cls_token.mul_(1e-3)
    theirs.save_pretrained(tmp_path / "hf")
    x = images() * 1e-3
    exact = vit.load_model(tmp_path / "hf")
    assert relative_error(our_logits(exact, x), hf_logits(theirs, x)) <= RTOL
    wrong_eps = vit.VisionTransformer(**{**exact.config.to_dict(), "norm_eps": 1e-6})
    with caplog.at_level(logging.INFO, logger="vit"):
        vit.load_weights(wrong_eps, tmp_path / "hf")
    assert "trained with LayerNorm eps 1e-12 and the model uses 1e-06" in caplog.text
    assert relative_error(our_logits(wrong_eps, x), hf_logits(theirs, x)) > 1e-3


def test_vit_model_folder_with_pooler_and_a_pytorch_bin(tmp_path, one_thread, caplog):
    torch.manual_seed(0)
    theirs = transformers.ViTModel(transformers.ViTConfig(**SMALL_HF)).eval()  # with a pooler
    folder = tmp_path / "hf"
    theirs.save_pretrained(folder)
    sd = load_file(str(folder / "model.safetensors"))
    assert "pooler.dense.weight" in sd
    (folder / "model.safetensors").unlink()
    torch.save(sd, folder / "pytorch_model.bin")
    with caplog.at_level(logging.INFO, logger="vit"):
        ours = vit.load_model(folder)
    assert "ignored pooler.dense.weight" in caplog.text
    assert ours.num_classes == 0 and ours.class_names is None
    x = images()
    with torch.no_grad():
        reference = theirs(pixel_values=x).last_hidden_state  # (B, N, D)
        tokens = ours.eval().forward_features(x)
    assert relative_error(tokens, reference) <= RTOL


def test_transformers_state_dicts_in_file_and_memory_spellings(tmp_path, one_thread):
    """A bare state dict has no config: create_model(name, pretrained=FILE) recognises the
    layout, takes transformers' eps (1e-12) and matches; the in-memory module (transformers 5
    renamed q/k/v to q_proj/k_proj/v_proj) loads too."""
    torch.manual_seed(0)
    config = transformers.ViTConfig(
        hidden_size=192,
        num_hidden_layers=12,
        num_attention_heads=3,
        intermediate_size=768,
        num_labels=10,
    )
    theirs = transformers.ViTForImageClassification(config).eval()
    theirs.save_pretrained(tmp_path / "hf")
    file_keys = load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert "vit.encoder.layer.0.attention.attention.query.weight" in file_keys
    torch.save(file_keys, tmp_path / "hf.pth")
    x = images(224, batch=2)
    reference = hf_logits(theirs, x)
    ours = vit.create_model("vit_tiny_patch16_224", num_classes=10, pretrained=tmp_path / "hf.pth")
    assert ours.config.norm_eps == 1e-12
    assert relative_error(our_logits(ours, x), reference) <= RTOL
    memory = vit.create_model("vit_tiny_patch16_224", num_classes=10, norm_eps=1e-12)
    report = vit.load_weights(memory, theirs)  # the module itself: in-memory names
    assert report.layout == "transformers" and report.missing == [] and report.unexpected == []
    assert relative_error(our_logits(memory, x), reference) <= RTOL


def test_not_a_plain_vit_is_refused_naming_what_it_is(tmp_path):
    folder = tmp_path / "swin"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps({"model_type": "swin", "architectures": ["SwinForImageClassification"]})
    )
    with pytest.raises(ValueError, match=r"transformers 'swin' model .*supported: plain ViT"):
        vit.load_model(folder)
    deit = {
        "deit.embeddings.cls_token": torch.zeros(1, 1, 8),
        "deit.embeddings.distillation_token": torch.zeros(1, 1, 8),
        "deit.embeddings.patch_embeddings.projection.weight": torch.zeros(8, 3, 4, 4),
    }
    model = vit.VisionTransformer(img_size=8, patch_size=4, embed_dim=8, depth=1, num_heads=2)
    with pytest.raises(ValueError, match="DeiT with a distillation token"):
        vit.load_weights(model, deit)
    masked = {k.replace("deit.", "vit."): v for k, v in deit.items() if "distillation" not in k}
    masked["decoder.0.weight"] = torch.zeros(1)
    with pytest.raises(ValueError, match=r"tensors a plain ViT does not \(\['decoder\.0\.weight'"):
        vit.load_weights(model, masked)
    with pytest.raises(
        ValueError, match=r"unknown checkpoint layout.*Supported layouts.*torchvision"
    ):
        vit.load_weights(model, {"features.0.weight": torch.zeros(1)})
    (folder / "config.json").write_text(
        json.dumps({"model_type": "vit", "architectures": ["ViTForMaskedImageModeling"]})
    )
    with pytest.raises(ValueError, match="holds a ViTForMaskedImageModeling"):
        vit.load_model(folder)


def test_a_non_square_folder_loads_at_another_size_resampled_from_its_grid(tmp_path, one_thread):
    """config.json's image_size [32, 48] is a 4x6 grid: its 24 tokens are not a square, which
    was blamed on prefix-token switches."""
    theirs = hf_classifier(image_size=[32, 48])
    theirs.save_pretrained(tmp_path / "hf")
    ours = vit.load_model(tmp_path / "hf", img_size=48)
    stored = theirs.vit.embeddings.position_embeddings.detach()
    expected = resample_pos_embed(stored, (6, 6), (4, 6), method="transformers")
    torch.testing.assert_close(ours.pos_embed.detach(), expected)


# -- torchvision ---------------------------------------------------------------------------------
def test_torchvision_vision_transformer_matches(tmp_path, one_thread):
    torch.manual_seed(0)
    theirs = torchvision.models.VisionTransformer(
        image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128,
        num_classes=3,
    ).eval()  # fmt: skip
    torch.nn.init.normal_(theirs.heads.head.weight, std=0.02)  # torchvision zeroes its head
    path = tmp_path / "tv.pth"
    torch.save(theirs.state_dict(), path)
    ours = vit.VisionTransformer(
        img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, mlp_ratio=2.0,
        num_classes=3,
    )  # fmt: skip
    report = vit.load_weights(ours, path)
    assert report.layout == "torchvision" and len(report.loaded) == len(ours.state_dict())
    x = images()
    with torch.no_grad():
        assert relative_error(our_logits(ours, x), theirs(x)) <= RTOL


def test_torchvision_file_at_another_size_equals_torchvision_own_resampling(tmp_path, one_thread):
    """A 32-px file loaded at 48 px: the logits of torchvision's model built at 48 px from its
    `interpolate_embeddings` (bicubic, align_corners=True), not timm's resampling."""
    torch.manual_seed(0)
    small = dict(patch_size=8, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128)
    theirs_32 = torchvision.models.VisionTransformer(image_size=32, num_classes=3, **small)
    torch.nn.init.normal_(theirs_32.heads.head.weight, std=0.02)
    torch.save(theirs_32.state_dict(), tmp_path / "tv.pth")
    theirs = torchvision.models.VisionTransformer(image_size=48, num_classes=3, **small).eval()
    state = torchvision.models.vision_transformer.interpolate_embeddings(
        image_size=48, patch_size=8, model_state=theirs_32.state_dict()
    )
    theirs.load_state_dict(state)
    ours = vit.VisionTransformer(
        img_size=48, patch_size=8, embed_dim=64, depth=2, num_heads=4, mlp_ratio=2.0,
        num_classes=3,
    )  # fmt: skip
    report = vit.load_weights(ours, tmp_path / "tv.pth")
    assert report.resampled_pos_embed == ((4, 4), (6, 6))
    torch.testing.assert_close(ours.pos_embed, state["encoder.pos_embedding"], rtol=0, atol=0)
    x = images(48)
    with torch.no_grad():
        assert relative_error(our_logits(ours, x), theirs(x)) <= RTOL


def test_torchvision_vit_b_32_through_create_model(tmp_path, one_thread):
    torch.manual_seed(0)
    theirs = torchvision.models.vit_b_32(weights=None).eval()
    torch.nn.init.normal_(theirs.heads.head.weight, std=0.02)
    path = tmp_path / "vit_b_32.pth"
    torch.save(theirs.state_dict(), path)
    ours = vit.create_model("vit_base_patch32_224", pretrained=path)
    # torchvision's weights come with torchvision's preprocessing, not timm's
    assert ours.preprocess.mean == (0.485, 0.456, 0.406)
    assert ours.preprocess.interpolation == "bilinear" and ours.preprocess.crop_pct == 0.875
    x = images(224, batch=2)
    with torch.no_grad():
        assert relative_error(our_logits(ours, x), theirs(x)) <= RTOL


def test_torchvision_vit_h_14_at_224_gets_swag_preprocessing(tmp_path):
    """vit_h_14 has SWAG weights only: at 224 px, IMAGENET1K_SWAG_LINEAR_V1's transform (resize
    224 bicubic, crop 224), not V1's bilinear 256 -> 224 crop."""
    torch.manual_seed(0)
    theirs = torchvision.models.VisionTransformer(
        image_size=224, patch_size=14, num_layers=1, num_heads=2, hidden_dim=16, mlp_dim=32
    )
    path = tmp_path / "vit_h_14_swag_linear.pth"
    torch.save(theirs.state_dict(), path)
    ours = vit.create_model(
        "vit_huge_patch14_224", pretrained=path, embed_dim=16, depth=1, num_heads=2, mlp_ratio=2.0
    )
    swag = torchvision.models.ViT_H_14_Weights.IMAGENET1K_SWAG_LINEAR_V1.transforms()
    assert (swag.resize_size, swag.crop_size) == ([224], [224])
    assert swag.interpolation == torchvision.transforms.InterpolationMode.BICUBIC
    assert ours.preprocess.interpolation == "bicubic" and ours.preprocess.crop_pct == 1.0


@pytest.mark.parametrize("builder", sorted(torchvision_layout.BUILDERS))
def test_every_torchvision_vit_maps_onto_a_named_model(builder):
    """Shapes only (meta tensors: no memory, no init): every torchvision ViT's keys map onto
    the same-named architecture here, key for key."""
    ours_name = {
        "vit_b_16": "vit_base_patch16_224",
        "vit_b_32": "vit_base_patch32_224",
        "vit_l_16": "vit_large_patch16_224",
        "vit_l_32": "vit_large_patch32_224",
        "vit_h_14": "vit_huge_patch14_224",
    }[builder]
    with torch.device("meta"):
        theirs = getattr(torchvision.models, builder)(weights=None)
        ours = vit.create_model(ours_name, num_classes=1000)
    state, layout, _ = vit.interop.layouts.to_timm(theirs.state_dict(), builder)
    assert layout == "torchvision"
    assert {k: v.shape for k, v in state.items()} == {
        k: v.shape for k, v in ours.state_dict().items()
    }
    name, _ = torchvision_layout.constructor_args(ours.config)
    assert name == builder


def test_torchvision_variants_it_cannot_hold_are_refused():
    sd = {"conv_proj.weight": torch.zeros(1), "heads.pre_logits.weight": torch.zeros(1)}
    model = vit.VisionTransformer(img_size=8, patch_size=4, embed_dim=8, depth=1, num_heads=2)
    with pytest.raises(ValueError, match=r"representation layer \(heads\.pre_logits"):
        vit.load_weights(model, sd)
    stem = {"conv_proj.conv_bn_relu_0.weight": torch.zeros(1), "encoder.ln.weight": torch.ones(1)}
    with pytest.raises(ValueError, match="convolutional stem"):
        vit.load_weights(model, stem)


def test_a_model_whose_patches_leave_a_margin_is_not_exported_to_torchvision():
    """torchvision's ViT asserts that its patches tile the image (a traceback): named in one
    line instead, beside the rest of what it cannot hold."""
    model = vit.VisionTransformer(img_size=38, patch_size=16, embed_dim=8, depth=1, num_heads=2)
    with pytest.raises(ValueError, match="it has 38-px images its 16-px patches do not tile"):
        torchvision_layout.constructor_args(model.config)
