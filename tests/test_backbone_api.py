"""The API DINOv2 and timm users reach for (issue 21): any input size (`dynamic_img_size`) equal
to the source library at every size, DINOv2's `get_intermediate_layers` and `forward_features`
dict, timm's `features_only`, `pretrained_cfg`, `set_input_size` and
`resolve_model_data_config`.

References are the libraries themselves, on random weights (transformers' Dinov2Model saved
with `save_pretrained`, timm's models created with `pretrained=False`) and on the real
DINOv2-S folder (../shared/data/dinov2-small) where it is on the machine. facebookresearch/dinov2
is not installed: its `get_intermediate_layers` is written out below from transformers'
hidden states and final LayerNorm, which is what it computes.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from conftest import RTOL, relative_error

import vit
from vit.models.registry import CIFAR10_MEAN, CIFAR10_STD

transformers = pytest.importorskip("transformers")
timm = pytest.importorskip("timm")

ROOT = Path(__file__).resolve().parents[1]
DINOV2_REAL = ROOT.parent / "shared" / "data" / "dinov2-small"
CIFAR_WEIGHTS = ROOT / "weights" / "cifar10_vit_cpu.safetensors"
TINY = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=128)
SIZES = [(224, 224), (112, 168), (448, 448)]  # (H, W): the processor's, non-square, larger
TIMM_TINY = dict(embed_dim=32, depth=3, num_heads=2)


def images(height: int, width: int, batch: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, 3, height, width, generator=torch.Generator().manual_seed(seed))


def tiny_dinov2(folder: Path, registers: int = 0) -> torch.nn.Module:
    """A random transformers DINOv2 (518-px position embeddings), every parameter perturbed,
    saved with `save_pretrained` only: no preprocessor_config.json."""
    torch.manual_seed(0)
    if registers:
        config = transformers.Dinov2WithRegistersConfig(
            **TINY, image_size=518, patch_size=14, num_register_tokens=registers
        )
        model = transformers.Dinov2WithRegistersModel(config)
    else:
        model = transformers.Dinov2Model(transformers.Dinov2Config(**TINY, image_size=518))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    model.save_pretrained(folder)
    assert not (folder / "preprocessor_config.json").exists()
    return model.eval()


def real_dinov2():
    if not DINOV2_REAL.is_dir():
        pytest.skip(f"{DINOV2_REAL} is not on this machine")
    return transformers.Dinov2Model.from_pretrained(DINOV2_REAL).eval(), vit.load_model(DINOV2_REAL)


def timm_and_ours(name: str, **kwargs):
    """timm's model `name` (random weights) and ours with its state dict, both in eval mode."""
    torch.manual_seed(0)
    theirs = timm.create_model(name, pretrained=False, **kwargs).eval()
    ours = vit.create_model(name, **kwargs)
    ours.load_state_dict(theirs.state_dict())
    return theirs, ours.eval()


# -- any input size --------------------------------------------------------------------------------
@pytest.mark.parametrize("registers", [0, 2], ids=["dinov2", "dinov2-registers"])
def test_transformers_dinov2_folder_runs_any_size_as_transformers(tmp_path, one_thread, registers):
    """A folder saved with save_pretrained only: dynamic as transformers (which resamples its
    37x37 grid in every forward), equal to it at every size, preprocessing DINOv2's 224 px."""
    theirs = tiny_dinov2(tmp_path / "hf", registers)
    ours = vit.load_model(tmp_path / "hf")
    assert ours.config.dynamic_img_size and ours.grid_size == (37, 37)  # the stored grid
    assert ours.config.pos_embed_resample == ("timm" if registers else "transformers")
    assert ours.preprocess.input_size == (224, 224) and ours.preprocess.crop_pct == 224 / 256
    assert ours.preprocess.mean == (0.485, 0.456, 0.406)
    for height, width in SIZES:
        x = images(height, width)
        with torch.no_grad():
            reference = theirs(pixel_values=x)
            assert relative_error(ours.forward_features(x), reference.last_hidden_state) <= RTOL
            assert relative_error(ours(x), reference.pooler_output) <= RTOL


def test_set_input_size_keeps_a_dinov2_folders_stored_grid(tmp_path, one_thread):
    """set_input_size(112) on the dynamic folder resampled its 37x37 grid once to 8x8, which
    every other size then resampled again: 0.095 off Dinov2Model at 168 px on the real
    DINOv2-S. The stored grid stays, the preprocessing takes the size: transformers' numbers
    at every size still."""
    theirs = tiny_dinov2(tmp_path / "hf")
    ours = vit.load_model(tmp_path / "hf")
    ours.set_input_size(img_size=112)
    assert ours.grid_size == (37, 37) and ours.preprocess.input_size == (112, 112)
    for height, width in ((112, 112), (168, 168), (112, 168)):
        x = images(height, width)
        with torch.no_grad():
            reference = theirs(pixel_values=x).last_hidden_state
            assert relative_error(ours.forward_features(x), reference) <= RTOL
    with pytest.raises(ValueError, match="not a multiple of patch_size"):
        ours.set_input_size(img_size=100)
    assert ours.preprocess.input_size == (112, 112)


def test_dinov2_folder_given_img_size_is_fixed_at_that_size(tmp_path, one_thread):
    """load_model(folder, img_size=N) builds a model of that size, as for every other source:
    transformers' numbers at N, and another size refused, not given features whose grid was
    resampled twice (once at load, again per call: ~2% off on the real DINOv2-S)."""
    theirs = tiny_dinov2(tmp_path / "hf")
    ours = vit.load_model(tmp_path / "hf", img_size=112)
    assert not ours.config.dynamic_img_size and ours.grid_size == (8, 8)
    assert ours.preprocess.input_size == (112, 112)
    x = images(112, 112)
    with torch.no_grad():
        assert relative_error(ours(x), theirs(pixel_values=x).pooler_output) <= RTOL
        with pytest.raises(ValueError, match="does not match the model's img_size"):
            ours(images(224, 224))


def test_dynamic_dinov2_keeps_its_resampling_by_name_and_through_save_weights(tmp_path, one_thread):
    """The folder's weights by timm's name (create_model, dynamic_img_size=True), and the
    loaded model saved as our .safetensors and loaded again: transformers' numbers at 448 px."""
    theirs = tiny_dinov2(tmp_path / "hf")
    arch = dict(embed_dim=32, depth=3, num_heads=4, num_classes=0)
    named = vit.create_model(
        "vit_small_patch14_dinov2",
        pretrained=tmp_path / "hf" / "model.safetensors",
        dynamic_img_size=True,
        **arch,
    )
    vit.save_weights(vit.load_model(tmp_path / "hf"), tmp_path / "ours.safetensors")
    reloaded = vit.load_model(tmp_path / "ours.safetensors")
    assert named.config.pos_embed_resample == reloaded.config.pos_embed_resample == "transformers"
    x = images(448, 448)
    with torch.no_grad():
        reference = theirs(pixel_values=x).pooler_output
        assert relative_error(named.eval()(x), reference) <= RTOL
        assert relative_error(reloaded(x), reference) <= RTOL


def test_flag_set_by_hand_resamples_an_already_resampled_grid(tmp_path, one_thread):
    """Why setting `patch_embed.dynamic_img_size` by hand was off: the model was built at
    224 px, its 37x37 embeddings resampled once to 16x16 at load, then resampled again from
    16x16 (with timm's antialiased kernel) for each other size. transformers resamples the
    37x37 grid every time, as the folder loaded dynamic does."""
    theirs = tiny_dinov2(tmp_path / "hf")
    by_hand = vit.load_model(tmp_path / "hf", img_size=224, dynamic_img_size=False)
    by_hand.config.pos_embed_resample = "timm"
    by_hand.patch_embed.dynamic_img_size = True
    dynamic = vit.load_model(tmp_path / "hf")
    x = images(448, 448)
    with torch.no_grad():
        reference = theirs(pixel_values=x).last_hidden_state
        assert relative_error(by_hand.forward_features(x), reference) > 1e-3
        assert relative_error(dynamic.forward_features(x), reference) <= RTOL


def test_real_dinov2_small_equals_transformers_at_three_sizes(one_thread):
    """../shared/data/dinov2-small loaded as it is (dynamic by default) at 224 px (its
    preprocessing), non-square 168x224 and 448 px: transformers' Dinov2Model's outputs."""
    theirs, ours = real_dinov2()
    assert ours.config.dynamic_img_size and ours.preprocess.input_size == (224, 224)
    for height, width in [(224, 224), (168, 224), (448, 448)]:
        x = images(height, width, batch=1)
        with torch.no_grad():
            reference = theirs(pixel_values=x)
            assert relative_error(ours.forward_features(x), reference.last_hidden_state) <= RTOL
            assert relative_error(ours(x), reference.pooler_output) <= RTOL


@pytest.mark.parametrize("name", ["vit_tiny_patch16_224", "vit_small_patch14_reg4_dinov2"])
def test_create_model_dynamic_img_size_equals_timm_at_three_sizes(one_thread, name):
    theirs, ours = timm_and_ours(name, dynamic_img_size=True, **TIMM_TINY)
    patch = ours.patch_embed.patch_size[0]
    for height, width in [(8 * patch, 8 * patch), (6 * patch, 10 * patch), (20 * patch,) * 2]:
        x = images(height, width)
        with torch.no_grad():
            assert relative_error(ours(x), theirs(x)) <= RTOL
            assert relative_error(ours.forward_features(x), theirs.forward_features(x)) <= RTOL


def test_a_model_built_non_square_equals_timm_at_a_square_size_of_as_many_tokens(one_thread):
    """A 2x8 grid at a 4x4 input was taken for unchanged (as many tokens, a square input) and
    read as 4x4, positions scrambled (logits 1.9e-3 off timm's); set_input_size kept it too."""
    kwargs = dict(img_size=(32, 128), dynamic_img_size=True, **TIMM_TINY)
    theirs, ours = timm_and_ours("vit_tiny_patch16_224", **kwargs)
    with torch.no_grad():
        for height, width in [(32, 128), (64, 64)]:
            x = images(height, width)
            assert relative_error(ours(x), theirs(x)) <= RTOL
    theirs.set_input_size((64, 64))
    ours.set_input_size((64, 64))
    torch.testing.assert_close(ours.pos_embed, theirs.pos_embed, rtol=0, atol=0)


def test_load_model_dynamic_img_size_and_a_true_size_message(tmp_path):
    """load_model takes dynamic_img_size (our files too); without it, another size is refused
    by a message naming options load_model has."""
    model = vit.create_model("vit_cifar_patch4_32", depth=1, embed_dim=32, num_heads=2)
    vit.save_weights(model, tmp_path / "m.safetensors")
    fixed = vit.load_model(tmp_path / "m.safetensors")
    with pytest.raises(ValueError, match="does not match") as refused:
        fixed(images(48, 48))
    assert "dynamic_img_size=True (vit.create_model and vit.load_model" in str(refused.value)
    dynamic = vit.load_model(tmp_path / "m.safetensors", dynamic_img_size=True)
    assert dynamic(images(48, 48)).shape == (2, 10)
    with torch.no_grad():  # at its own size the same model
        torch.testing.assert_close(dynamic(images(32, 32)), fixed(images(32, 32)))


# -- DINOv2's get_intermediate_layers and forward_features dict -----------------------------------
def dinov2_intermediate_layers(output, layernorm, n, reshape, return_class_token, norm, registers):
    """facebookresearch/dinov2's `get_intermediate_layers`, written out on transformers'
    hidden states (hidden_states[i + 1] is block i's output) and its final LayerNorm."""
    depth = len(output.hidden_states) - 1
    take = range(depth - n, depth) if isinstance(n, int) else n
    outputs = [output.hidden_states[i + 1] for i in range(depth) if i in take]
    if norm:
        outputs = [layernorm(out) for out in outputs]
    class_tokens = [out[:, 0] for out in outputs]
    outputs = [out[:, 1 + registers :] for out in outputs]
    if reshape:
        side = int(outputs[0].shape[1] ** 0.5)
        outputs = [out.reshape(len(out), side, side, -1).permute(0, 3, 1, 2) for out in outputs]
    return tuple(zip(outputs, class_tokens, strict=True)) if return_class_token else tuple(outputs)


CASES = [  # n, reshape, return_class_token, norm
    (1, False, False, True),
    (4, True, False, True),
    ([0, 5, 11], False, True, True),
    (2, True, True, False),
]


def assert_same_outputs(ours, reference) -> None:
    assert isinstance(ours, tuple) and len(ours) == len(reference)
    for mine, theirs in zip(ours, reference, strict=True):
        if isinstance(theirs, tuple):  # (patch tokens, class token)
            assert len(mine) == 2
            for a, b in zip(mine, theirs, strict=True):
                assert relative_error(a, b) <= RTOL
        else:
            assert relative_error(mine, theirs) <= RTOL


@pytest.mark.parametrize(("n", "reshape", "return_class_token", "norm"), CASES)
def test_get_intermediate_layers_has_dinov2_meaning_on_the_real_folder(
    one_thread, n, reshape, return_class_token, norm
):
    theirs, ours = real_dinov2()
    x = images(224, 224, batch=1)
    with torch.no_grad():
        output = theirs(pixel_values=x, output_hidden_states=True)
        reference = dinov2_intermediate_layers(
            output, theirs.layernorm, n, reshape, return_class_token, norm, registers=0
        )
        mine = ours.get_intermediate_layers(
            x, n=n, reshape=reshape, return_class_token=return_class_token, norm=norm
        )
    assert_same_outputs(mine, reference)
    if reshape:
        assert (mine[0][0] if return_class_token else mine[0]).shape == (1, 384, 16, 16)


def test_registers_are_left_out_of_intermediate_layers_and_kept_in_the_dict(tmp_path, one_thread):
    theirs = tiny_dinov2(tmp_path / "hf", registers=2)
    ours = vit.load_model(tmp_path / "hf")
    x = images(112, 112)
    with torch.no_grad():
        output = theirs(pixel_values=x, output_hidden_states=True)
        reference = dinov2_intermediate_layers(output, theirs.layernorm, 2, True, True, True, 2)
        assert_same_outputs(
            ours.get_intermediate_layers(x, n=2, reshape=True, return_class_token=True), reference
        )
        features = ours.forward_features(x, return_dict=True)
        tensor = ours.forward_features(x)  # timm's tensor stays the default
    last = output.last_hidden_state  # (B, 1 + 2 + 64, D)
    assert set(features) == {
        "x_norm_clstoken",
        "x_norm_regtokens",
        "x_norm_patchtokens",
        "x_prenorm",
        "masks",
    }
    assert relative_error(features["x_norm_clstoken"], last[:, 0]) <= RTOL
    assert relative_error(features["x_norm_regtokens"], last[:, 1:3]) <= RTOL
    assert relative_error(features["x_norm_patchtokens"], last[:, 3:]) <= RTOL
    assert relative_error(features["x_prenorm"], output.hidden_states[-1]) <= RTOL
    assert features["masks"] is None and torch.equal(tensor, ours.norm(features["x_prenorm"]))


def test_an_unknown_resampling_is_refused_at_construction():
    with pytest.raises(ValueError, match="pos_embed_resample must be one of"):
        vit.VisionTransformer(img_size=16, patch_size=8, depth=1, pos_embed_resample="bilinear")


def test_get_intermediate_layers_refuses_a_class_token_the_model_lacks():
    model = vit.VisionTransformer(
        img_size=16, patch_size=8, embed_dim=16, depth=2, num_heads=2, class_token=False,
        global_pool="avg",
    )  # fmt: skip
    assert len(model.get_intermediate_layers(images(16, 16), n=2)) == 2
    with pytest.raises(ValueError, match="needs a model with a class token"):
        model.get_intermediate_layers(images(16, 16), return_class_token=True)


def test_get_intermediate_layers_gives_timms_numbers_with_timms_keywords(one_thread):
    """DINOv2's default norm=True stays; with norm and timm's return_prefix_tokens (a
    TypeError before) the method gives timm's pairs of patch and prefix tokens."""
    theirs, ours = timm_and_ours("vit_small_patch14_reg4_dinov2", img_size=56, **TIMM_TINY)
    x = images(56, 56)
    with torch.no_grad():
        for norm in (False, True):
            mine = ours.get_intermediate_layers(x, 2, norm=norm, return_prefix_tokens=True)
            reference = theirs.get_intermediate_layers(x, 2, norm=norm, return_prefix_tokens=True)
            for (patches, prefix), (their_patches, their_prefix) in zip(
                mine, reference, strict=True
            ):
                assert prefix.shape == (2, 5, 32)  # the class token and 4 registers
                assert relative_error(patches, their_patches) <= RTOL
                assert relative_error(prefix, their_prefix) <= RTOL
    with pytest.raises(ValueError, match="give one"):
        ours.get_intermediate_layers(x, return_class_token=True, return_prefix_tokens=True)


def test_forward_intermediates_output_dict_is_timms(one_thread):
    """timm's output_dict=True (a TypeError before): the same keys and tensors as timm's."""
    theirs, ours = timm_and_ours("vit_small_patch14_reg4_dinov2", img_size=56, **TIMM_TINY)
    x = images(56, 56)
    for flags in (dict(), dict(return_prefix_tokens=True, intermediates_only=True, norm=True)):
        with torch.no_grad():
            mine = ours.forward_intermediates(x, indices=2, output_dict=True, **flags)
            reference = theirs.forward_intermediates(x, indices=2, output_dict=True, **flags)
        assert sorted(mine) == sorted(reference)
        for key, value in reference.items():
            values = value if isinstance(value, list) else [value]
            mine_values = mine[key] if isinstance(value, list) else [mine[key]]
            for a, b in zip(mine_values, values, strict=True):
                assert relative_error(a, b) <= RTOL, key


def test_intermediate_maps_of_a_non_square_grid_are_timms_with_rows_and_columns_in_place(
    one_thread,
):
    """A 4x6 grid (56x84 input, 14-px patches): tokens reshaped as gw x gh rows instead of
    gh x gw give scrambled positions, which square inputs (every other test's) cannot show."""
    theirs, ours = timm_and_ours("vit_small_patch14_reg4_dinov2", img_size=(56, 84), **TIMM_TINY)
    x = images(56, 84)
    with torch.no_grad():
        maps = ours.forward_intermediates(x, indices=2, intermediates_only=True)
        reference = theirs.forward_intermediates(x, indices=2, intermediates_only=True)
        tokens = ours.forward_intermediates(x, indices=2, output_fmt="NLC", intermediates_only=True)
        layers = ours.get_intermediate_layers(x, n=2, reshape=True, norm=True)
        reference_layers = theirs.get_intermediate_layers(x, n=2, reshape=True, norm=True)
    pairs = [*zip(maps, reference, strict=True), *zip(layers, reference_layers, strict=True)]
    for mine, theirs_map in pairs:
        assert mine.shape == theirs_map.shape == (2, 32, 4, 6)
        assert relative_error(mine, theirs_map) <= RTOL
    for patch_map, patch_tokens in zip(maps, tokens, strict=True):
        assert patch_tokens.shape == (2, 24, 32)  # prefix (class, 4 registers) left out
        for i, j in [(0, 5), (3, 0), (2, 4)]:  # row i, column j is token i * gw + j
            assert torch.equal(patch_map[:, :, i, j], patch_tokens[:, i * 6 + j])


# -- timm: features_only, pretrained_cfg, set_input_size, resolve_model_data_config ---------------
@pytest.mark.parametrize(
    ("name", "out_indices"),
    [
        ("vit_tiny_patch16_224", 3),
        ("vit_tiny_patch16_224", (0, 2)),
        ("vit_small_patch14_reg4_dinov2", (-2,)),
    ],
)
def test_features_only_returns_timms_feature_maps(one_thread, name, out_indices):
    kwargs = dict(features_only=True, out_indices=out_indices, **dict(TIMM_TINY, depth=4))
    torch.manual_seed(0)
    theirs = timm.create_model(name, pretrained=False, **kwargs).eval()
    ours = vit.create_model(name, **kwargs).eval()
    ours.load_state_dict(theirs.state_dict())  # strict: pruned as timm prunes
    assert ours.out_indices == list(theirs.out_indices)
    assert ours.feature_info.channels() == theirs.feature_info.channels()
    assert ours.feature_info.reduction() == theirs.feature_info.reduction()
    assert ours.feature_info.module_name() == theirs.feature_info.module_name()
    assert ours.feature_info.get_dicts() == theirs.feature_info.get_dicts(["module", "num_chs",
        "reduction"])  # fmt: skip
    assert ours.feature_info.channels(idx=[0, 1]) == theirs.feature_info.channels(idx=[0, 1])
    for idx in (1, [0, 2]):
        keyed = dict(keys=["num_chs", "module"], idx=idx)
        assert ours.feature_info.get_dicts(**keyed) == theirs.feature_info.get_dicts(**keyed)
    assert len(ours.feature_info) == len(theirs.feature_info)
    # the model's preprocessing (0.5 means here), which timm's helpers once read as ImageNet's
    config = timm.data.resolve_model_data_config(ours)
    assert config == timm.data.resolve_model_data_config(theirs)
    assert vit.resolve_model_data_config(ours) == config
    x = images(*ours.model.patch_embed.img_size)
    with torch.no_grad():
        mine, reference = ours(x), theirs(x)
    assert len(mine) == len(reference) == len(ours.out_indices)
    for a, b in zip(mine, reference, strict=True):
        assert a.shape == b.shape and a.ndim == 4  # (B, D, gh, gw)
        assert relative_error(a, b) <= RTOL


def test_feature_info_of_non_square_patches_is_timms_int():
    """timm reports a (16, 8) patch's reduction as 16 (its feat_ratio); (16, 8) broke code that
    reads reduction() as an output stride."""
    kwargs = dict(img_size=32, patch_size=(16, 8), embed_dim=16, depth=1, num_heads=2)
    theirs = timm.models.VisionTransformer(**kwargs)
    assert vit.VisionTransformer(**kwargs).feature_info == theirs.feature_info


def test_pretrained_cfg_says_what_timms_says_for_a_name():
    ours = vit.create_model("vit_small_patch16_224.augreg_in21k_ft_in1k", depth=1)
    theirs = timm.create_model("vit_small_patch16_224.augreg_in21k_ft_in1k", depth=1).pretrained_cfg
    cfg = ours.pretrained_cfg
    for key in ("input_size", "interpolation", "crop_pct", "crop_mode", "num_classes",
                "first_conv", "classifier", "architecture", "tag"):  # fmt: skip
        assert cfg[key] == theirs[key], key
    assert cfg["mean"] == tuple(theirs["mean"]) and cfg["std"] == tuple(theirs["std"])
    assert cfg["fixed_input_size"] is True


def test_resolve_model_data_config_of_the_shipped_cifar_model():
    """The shipped CIFAR model: 32 px and CIFAR-10's statistics. timm's resolver, given a
    model without a pretrained_cfg (ours before this API), falls back to 224 px and ImageNet's
    statistics; it reads ours now, and agrees."""
    model = vit.load_model(CIFAR_WEIGHTS)
    config = vit.resolve_model_data_config(model)
    assert config["input_size"] == (3, 32, 32)
    assert config["mean"] == CIFAR10_MEAN and config["std"] == CIFAR10_STD
    assert config["crop_pct"] == 1.0 and config["crop_mode"] == "center"
    fallback = timm.data.resolve_model_data_config(torch.nn.Identity())
    assert fallback["input_size"] == (3, 224, 224)
    assert fallback["mean"] == timm.data.IMAGENET_DEFAULT_MEAN
    assert timm.data.resolve_model_data_config(model) == config
    transform = vit.create_transform(config)  # timm's dict feeds our transform, as timm's does
    assert repr(transform) == repr(vit.create_transform(model))


def test_set_input_size_equals_timms(one_thread):
    theirs, ours = timm_and_ours("vit_small_patch14_reg4_dinov2", **TIMM_TINY)
    ours.preprocess = vit.Preprocess(input_size=(518, 518))
    theirs.set_input_size(img_size=(224, 252))
    ours.set_input_size(img_size=(224, 252))
    assert ours.grid_size == (16, 18) and ours.preprocess.input_size == (224, 252)
    assert ours.pretrained_cfg["input_size"] == (3, 224, 252)
    torch.testing.assert_close(ours.pos_embed, theirs.pos_embed, rtol=0, atol=0)
    x = images(224, 252)
    with torch.no_grad():
        assert relative_error(ours(x), theirs(x)) <= RTOL
    with pytest.raises(ValueError, match="cannot change patch_size"):
        ours.set_input_size(patch_size=16)


def test_set_input_size_refused_leaves_the_model_as_it_was(one_thread):
    """A size smaller than a patch is refused, and the model still runs at its own size (it
    used to keep the refused size and refuse every input after)."""
    model = vit.create_model("vit_tiny_patch16_224", img_size=32, patch_size=4, depth=1).eval()
    with pytest.raises(ValueError, match="img_size height 3 is smaller than patch_size"):
        model.set_input_size(img_size=3)
    assert model.patch_embed.img_size == (32, 32) and model.grid_size == (8, 8)
    with torch.no_grad():
        assert model(images(32, 32)).shape == (2, 1000)


def test_resolve_model_data_config_is_exported():
    assert "resolve_model_data_config" in vit.__all__
    assert vit.resolve_model_data_config is vit.models.registry.resolve_model_data_config


# -- timm's tools on our models ------------------------------------------------------------------
TIMM_FAMILIES = [
    "vit_tiny_patch16_224",
    "vit_small_patch14_reg4_dinov2",
    "deit_tiny_distilled_patch16_224",
    "deit3_small_patch16_224",
    "vit_base_patch16_clip_224",
]


@pytest.mark.parametrize("name", TIMM_FAMILIES)
def test_timms_attributes_and_layer_decay_read_our_model_as_theirs(name):
    """Without group_matcher, timm's layer decay guessed our layers: on vit_tiny 96 of 152
    tensors got other rates than on timm's model (each block's attention a layer too low)."""
    from timm.optim import param_groups_layer_decay

    theirs, ours = timm_and_ours(name, **TIMM_TINY)
    for attribute in ("no_embed_class", "has_class_token", "dynamic_img_size", "in_chans",
                      "head_hidden_size", "num_prefix_tokens", "feature_info"):  # fmt: skip
        assert getattr(ours, attribute) == getattr(theirs, attribute), attribute
    assert ours.default_cfg == ours.pretrained_cfg

    def scales(model) -> dict[str, float]:
        names = {id(p): name for name, p in model.named_parameters()}
        groups = param_groups_layer_decay(model, layer_decay=0.5)
        return {names[id(p)]: group["lr_scale"] for group in groups for p in group["params"]}

    assert scales(ours) == scales(theirs)


@pytest.mark.parametrize(
    ("name", "size"), [("vit_small_patch14_reg4_dinov2", 224), ("deit3_small_patch16_224", 160)]
)
def test_timms_checkpoint_filter_resizes_a_checkpoint_for_our_model_as_for_theirs(name, size):
    """timm's loader counts the prefix tokens by `no_embed_class`: missing here, it took the
    registers' (or DeiT III's class token's) embeddings for the grid and failed."""
    from timm.models.vision_transformer import checkpoint_filter_fn

    state = timm.create_model(name, **TIMM_TINY).state_dict()
    theirs = checkpoint_filter_fn(state, timm.create_model(name, img_size=size, **TIMM_TINY))
    ours = checkpoint_filter_fn(state, vit.create_model(name, img_size=size, **TIMM_TINY))
    torch.testing.assert_close(ours["pos_embed"], theirs["pos_embed"], rtol=0, atol=0)


def test_pool_takes_timms_pool_type():
    theirs, ours = timm_and_ours("vit_tiny_patch16_224", **TIMM_TINY)
    tokens = torch.randn(2, 197, 32)
    for pool_type in ("token", "avg", ""):
        torch.testing.assert_close(ours.pool(tokens, pool_type), theirs.pool(tokens, pool_type))
    with pytest.raises(ValueError, match="pool_type='map' needs a model built with"):
        ours.pool(tokens, "map")


def test_torch_export_of_a_model_of_any_size_runs_at_other_sizes(one_thread):
    """The position embeddings' shortcut for the model's own grid fixed an exported program to
    the example's size ("Guard failed: x.size()[2] // 16 == 14" at any other)."""
    model = vit.create_model("vit_tiny_patch16_224", dynamic_img_size=True, **TIMM_TINY).eval()
    height, width = torch.export.Dim("height", min=2, max=32), torch.export.Dim("width", max=32)
    program = torch.export.export(
        model, (images(224, 224),), dynamic_shapes={"x": {2: 16 * height, 3: 16 * width}}
    )
    with torch.no_grad():
        for size in ((224, 224), (160, 256)):
            x = images(*size)
            torch.testing.assert_close(program.module()(x), model(x), rtol=1e-5, atol=1e-5)


def test_a_traced_model_saved_and_loaded_gives_the_same_logits(tmp_path, one_thread):
    """TorchScript by tracing (docs/model.md), for LibTorch: the family switches included."""
    for name in ("vit_tiny_patch16_224", "vit_small_patch14_reg4_dinov2"):
        model = vit.create_model(name, img_size=112, **TIMM_TINY).eval()
        x = images(112, 112)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch deprecates TorchScript
            # the input-size checks, which the trace fixes to the example's size
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            torch.jit.trace(model, x).save(tmp_path / "traced.pt")
            traced = torch.jit.load(tmp_path / "traced.pt")
        other_batch = images(112, 112, batch=3, seed=2)
        with torch.no_grad():
            for batch in (x, other_batch):
                torch.testing.assert_close(traced(batch), model(batch), rtol=1e-5, atol=1e-5)
