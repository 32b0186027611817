"""The model: shapes, both attention paths, and logits identical to timm's for the same weights."""

from functools import partial

import pytest
import timm
import torch
from conftest import RTOL, relative_error
from timm.models.vision_transformer import VisionTransformer as TimmViT

import vit
from vit.models.layers import DropPath
from vit.models.registry import MODELS

# Every plain ViT name that timm also has (the families: tests/test_families.py).
STANDARD = [n for n in vit.list_models() if n in timm.list_models() and MODELS[n].family == "vit"]
# Small enough to run on every commit; the rest are marked slow.
CHEAP = {
    "vit_tiny_patch16_224",
    "vit_small_patch16_224",
    "vit_small_patch32_224",
    "vit_base_patch32_224",
}


def randomise_head(model: torch.nn.Module) -> None:
    """Our init zeroes the head (logits all zero); give it weights so logits carry signal."""
    torch.nn.init.normal_(model.head.weight, std=0.02)
    torch.nn.init.normal_(model.head.bias, std=0.02)


def assert_same_logits_as_timm(ours: vit.VisionTransformer, theirs: torch.nn.Module) -> None:
    ours.load_state_dict(theirs.state_dict(), strict=True)  # same names: no remapping
    ours.eval()
    theirs.eval()
    x = torch.randn(2, ours.config.in_chans, *ours.patch_embed.img_size)
    with torch.no_grad():
        reference = theirs(x)
        ours.set_fused_attn(True)
        fused = ours(x)
        ours.set_fused_attn(False)
        explicit = ours(x)
    assert fused.shape == reference.shape
    assert relative_error(fused, reference) <= RTOL
    assert relative_error(explicit, reference) <= RTOL


@pytest.mark.parametrize(
    "name",
    [n if n in CHEAP else pytest.param(n, marks=pytest.mark.slow) for n in STANDARD],
)
def test_logits_match_timm_for_every_standard_config(name):
    # Blocks are identical modules: the huge and giant ones (0.6-1.0B parameters, about a
    # minute each at full depth) are compared through their first two, full width and size.
    depth = {"depth": 2} if MODELS[name].arch["embed_dim"] >= 1280 else {}
    torch.manual_seed(0)
    theirs = timm.create_model(name, num_classes=10, **depth)  # random init, a (random) head
    ours = vit.create_model(name, num_classes=10, **depth)
    assert_same_logits_as_timm(ours, theirs)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(img_size=32, patch_size=4, embed_dim=64, depth=2, num_heads=4, num_classes=10),
        dict(img_size=(48, 32), patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=5),
        dict(img_size=32, patch_size=4, embed_dim=32, depth=2, num_heads=2, global_pool="avg"),
        dict(
            img_size=32,
            patch_size=4,
            embed_dim=32,
            depth=1,
            num_heads=2,
            class_token=False,
            global_pool="avg",
            num_classes=3,
        ),
        dict(
            img_size=32,
            patch_size=(4, 8),
            embed_dim=48,
            depth=1,
            num_heads=3,
            mlp_ratio=2.0,
            qkv_bias=False,
            in_chans=1,
        ),
        # a size the patch does not divide: a 2-px margin no patch sees (timm's so400m at 384)
        dict(img_size=(30, 34), patch_size=4, embed_dim=32, depth=1, num_heads=2),
    ],
    ids=[
        "cifar",
        "non-square",
        "avg-pool",
        "no-class-token",
        "rect-patch-1ch-no-qkv-bias",
        "margin",
    ],
)
def test_logits_match_timm_for_other_geometries(kwargs):
    torch.manual_seed(0)
    theirs = TimmViT(**kwargs)
    torch.nn.init.normal_(theirs.head.weight, std=0.02)
    assert_same_logits_as_timm(vit.VisionTransformer(**kwargs), theirs)


@pytest.mark.parametrize("global_pool", ["avgmax", "max"])
def test_timms_max_pools_match_timm(global_pool):
    """timm's "avgmax" and "max" readouts (refused before): fc_norm after them as timm puts it,
    the same logits, and pool() and reset_classifier() taking them too."""
    kwargs = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=3)
    torch.manual_seed(0)
    theirs = TimmViT(**kwargs, global_pool=global_pool)
    randomise_head(theirs)
    ours = vit.VisionTransformer(**kwargs, global_pool=global_pool)
    assert isinstance(ours.fc_norm, torch.nn.LayerNorm) and isinstance(ours.norm, torch.nn.Identity)
    assert_same_logits_as_timm(ours, theirs)
    tokens = torch.randn(2, 17, 32)
    for pool_type in ("avgmax", "max", "avg"):
        assert torch.equal(ours.pool(tokens, pool_type), theirs.pool(tokens, pool_type))
    ours.reset_classifier(4, "max")
    assert ours.global_pool == ours.config.global_pool == "max" and ours.num_classes == 4


@pytest.mark.parametrize("global_pool", ["token", "avg"])
def test_norm_eps_reaches_every_layernorm_and_matches_timm_bit_for_bit(global_pool):
    kwargs = dict(
        img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, global_pool=global_pool
    )
    ours = vit.VisionTransformer(**kwargs, norm_eps=1e-12)
    norms = [m for m in ours.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert len(norms) == 2 * 2 + 1  # two per block, and the final norm (or fc_norm for "avg")
    assert {m.eps for m in norms} == {1e-12}
    torch.manual_seed(0)
    theirs = TimmViT(**kwargs, num_classes=5, norm_layer=partial(torch.nn.LayerNorm, eps=1e-12))
    randomise_head(theirs)
    ours = vit.VisionTransformer(**kwargs, num_classes=5, norm_eps=1e-12)
    assert_same_logits_as_timm(ours, theirs)
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        ours.set_fused_attn(True)
        # the same kernels on the same tensors: identical bits (a wrong eps alone breaks this)
        assert torch.equal(ours(x), theirs(x))
        default_eps = vit.VisionTransformer(**kwargs, num_classes=5)  # 1e-6
        default_eps.load_state_dict(theirs.state_dict())
        assert not torch.equal(default_eps.eval()(x), theirs(x))


@pytest.mark.parametrize("name", [n for n in MODELS if n.endswith("_32")])
def test_cifar_configs_match_timm(name):
    ours = vit.create_model(name)
    theirs = TimmViT(**{**MODELS[name].arch, "num_classes": 10})
    assert_same_logits_as_timm(ours, theirs)


def test_our_state_dict_loads_strictly_into_timm():
    torch.manual_seed(0)
    ours = vit.create_model("vit_tiny_patch16_224").eval()
    randomise_head(ours)
    theirs = timm.create_model("vit_tiny_patch16_224").eval()
    theirs.load_state_dict(ours.state_dict(), strict=True)
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        assert relative_error(ours(x), theirs(x)) <= RTOL
    assert list(ours.state_dict()) == list(theirs.state_dict())  # same names, same order


def test_patch_grid_tokens_and_shapes():
    model = vit.create_model("vit_tiny_patch16_224").eval()
    assert model.grid_size == (14, 14)
    assert model.patch_embed.num_patches == 196
    assert model.pos_embed.shape == (1, 197, 192)  # 196 patches + the class token
    x = torch.randn(3, 3, 224, 224)
    with torch.no_grad():
        tokens = model.forward_features(x)
        assert tokens.shape == (3, 197, 192)
        assert model.forward_head(tokens, pre_logits=True).shape == (3, 192)
        assert model.forward_head(tokens).shape == (3, 1000)
        assert model(x).shape == (3, 1000)


def test_a_fixed_size_the_patch_does_not_divide_leaves_its_margin_unseen():
    """30 x 34 px in patches of 4: a 7 x 8 grid over the top-left 28 x 32 px, as timm's and
    transformers' strided Conv2d cut it; what the margin holds changes nothing."""
    model = vit.VisionTransformer(
        img_size=(30, 34), patch_size=4, embed_dim=32, depth=1, num_heads=2
    )
    randomise_head(model.eval())
    assert model.grid_size == (7, 8) and model.pos_embed.shape == (1, 1 + 7 * 8, 32)
    x = torch.randn(2, 3, 30, 34)
    other = x.clone()
    other[:, :, 28:, :] = 5.0  # the bottom margin
    other[:, :, :, 32:] = -5.0  # the right margin
    with torch.no_grad():
        torch.testing.assert_close(model(other), model(x), rtol=0, atol=0)


def test_attention_paths_agree_in_training_mode_without_dropout():
    torch.manual_seed(0)
    model = vit.VisionTransformer(img_size=32, patch_size=4, embed_dim=64, depth=2, num_heads=4)
    randomise_head(model)
    model.train()
    x = torch.randn(4, 3, 32, 32)
    fused = model(x)
    model.set_fused_attn(False)
    explicit = model(x)
    assert relative_error(explicit, fused) <= RTOL
    fused.sum().backward()  # both paths are differentiable
    assert model.blocks[0].attn.qkv.weight.grad is not None


def test_attention_dropout_is_off_in_eval_on_both_paths():
    """attn_drop_rate > 0 must drop attention weights in training only: the fused path hands
    SDPA its dropout_p itself, so eval() has to zero it there (nn.Dropout does it on the other)."""
    torch.manual_seed(0)
    model = vit.VisionTransformer(
        img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, attn_drop_rate=0.5
    )
    randomise_head(model)
    x = torch.randn(2, 3, 32, 32)
    model.eval()
    with torch.no_grad():
        fused = model(x)
        assert torch.equal(model(x), fused)  # no randomness left in evaluation
        model.set_fused_attn(False)
        explicit = model(x)
        assert relative_error(fused, explicit) <= RTOL  # and nothing dropped on either path
        model.train()
        assert not torch.allclose(model(x), model(x))  # explicit path drops in training
        model.set_fused_attn(True)
        assert not torch.allclose(model(x), model(x))  # and so does the fused one


def test_explicit_path_hands_out_attention_probabilities():
    model = vit.VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2)
    model.set_fused_attn(False)
    seen = []
    hook = model.blocks[1].attn.softmax.register_forward_hook(lambda m, i, out: seen.append(out))
    model(torch.randn(2, 3, 32, 32))
    hook.remove()
    (probs,) = seen
    assert probs.shape == (2, 2, 17, 17)  # (B, heads, N, N)
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 2, 17))


def test_init_follows_the_vit_paper():
    torch.manual_seed(0)
    model = vit.create_model("vit_small_patch16_224")
    assert torch.count_nonzero(model.head.weight) == 0 and torch.count_nonzero(model.head.bias) == 0
    qkv = model.blocks[0].attn.qkv.weight
    # trunc_normal_(std=.02) cuts at +-2 absolute, as timm's: effectively a plain normal(0, .02)
    assert abs(qkv.std().item() - 0.02) < 0.001 and abs(qkv.mean().item()) < 0.001
    assert torch.count_nonzero(model.blocks[0].attn.qkv.bias) == 0
    assert abs(model.pos_embed.std().item() - 0.02) < 0.002
    assert model.cls_token.abs().max() < 1e-4


def test_a_gated_mlp_starts_as_timms_and_as_a_plain_mlp():
    """DINOv2 ViT-g/14's MLP (mlp_layer="swiglu_packed"): timm's GluMlp start, the value's rows
    near zero with a bias of one, so that each block begins as fc2(silu(gate)); the outputs
    equal timm's SwiGLUPacked on the same weights."""
    from timm.layers import SwiGLUPacked

    kwargs = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, mlp_ratio=4.0)
    torch.manual_seed(0)
    model = vit.VisionTransformer(**kwargs, mlp_layer="swiglu_packed", act_layer="silu")
    fc1 = model.blocks[0].mlp.fc1  # (128, 32): the gate's 64 rows, then the value's
    assert model.blocks[0].mlp.fc2.in_features == 64
    assert abs(fc1.weight[:64].std().item() - 0.02) < 0.002 and fc1.weight[64:].std() < 2e-6
    assert torch.count_nonzero(fc1.bias[:64]) == 0 and torch.equal(fc1.bias[64:], torch.ones(64))
    torch.manual_seed(1)
    theirs = TimmViT(**kwargs, mlp_layer=SwiGLUPacked, act_layer=torch.nn.SiLU)
    with torch.no_grad():  # every weight off its start: the values count
        for parameter in theirs.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    assert_same_logits_as_timm(model, theirs)


def test_a_fresh_model_learns():
    """The init must let training start: a few AdamW steps fit a tiny random batch."""
    torch.manual_seed(0)
    model = vit.VisionTransformer(
        img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=4
    )
    x, y = torch.randn(8, 3, 16, 16), torch.arange(8) % 4
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = None
    for _ in range(30):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        first = first if first is not None else loss.item()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert abs(first - torch.log(torch.tensor(4.0)).item()) < 1e-4  # zero head: uniform logits
    assert loss.item() < 0.2 * first


def test_drop_path_is_identity_in_eval_and_stochastic_in_training():
    torch.manual_seed(0)
    model = vit.VisionTransformer(
        img_size=16,
        patch_size=4,
        embed_dim=32,
        depth=4,
        num_heads=2,
        num_classes=3,
        drop_path_rate=0.5,
    )
    randomise_head(model)
    rates = [block.drop_path1.drop_prob for block in model.blocks]
    assert rates == pytest.approx([0.0, 0.5 / 3, 1.0 / 3, 0.5])  # rising linearly with depth
    x = torch.randn(2, 3, 16, 16)
    model.eval()
    torch.testing.assert_close(model(x), model(x))
    plain = vit.VisionTransformer(
        img_size=16, patch_size=4, embed_dim=32, depth=4, num_heads=2, num_classes=3
    )
    plain.load_state_dict(model.state_dict())
    assert torch.equal(model(x), plain.eval()(x))  # the identity: as if there were no DropPath
    model.train()
    assert not torch.allclose(model(x), model(x))


def test_drop_path_drops_whole_samples_and_rescales_the_kept_ones_by_one_over_keep_prob():
    """Stochastic depth, not dropout: one draw per sample zeroes its whole branch, and a kept
    branch is scaled by 1/keep_prob so that training matches evaluation on average."""
    torch.manual_seed(0)
    x = torch.ones(4000, 5, 7)
    layer = DropPath(0.25)
    assert torch.equal(layer.eval()(x), x)  # the identity in evaluation
    y = layer.train()(x)
    assert (y == y[:, :1, :1]).all()  # each sample all kept or all dropped
    kept = y[:, 0, 0] != 0
    assert torch.equal(y[kept], torch.full_like(y[kept], 1 / 0.75))  # rescaled by 1/keep_prob
    assert abs(kept.float().mean().item() - 0.75) < 0.03  # a quarter of the samples dropped
    assert abs(y.mean().item() - 1.0) < 0.03  # expectation unchanged


def test_reset_classifier_and_no_weight_decay():
    model = vit.create_model("vit_tiny_patch16_224")
    model.reset_classifier(7)
    assert model.head.out_features == 7 and model.num_classes == 7
    model.reset_classifier(0)
    assert isinstance(model.head, torch.nn.Identity)
    assert model(torch.randn(1, 3, 224, 224)).shape == (1, 192)
    assert model.no_weight_decay() == {"pos_embed", "cls_token"}


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match=r"input image size \(32x32\).*224x224"):
        vit.create_model("vit_tiny_patch16_224")(torch.randn(1, 3, 32, 32))
    with pytest.raises(ValueError, match="not a multiple of patch_size"):
        vit.VisionTransformer(img_size=30, patch_size=4, dynamic_img_size=True)
    with pytest.raises(ValueError, match="not divisible by num_heads"):
        vit.VisionTransformer(embed_dim=100, num_heads=3)
    with pytest.raises(TypeError, match="unknown VisionTransformer argument.*'depht'"):
        vit.VisionTransformer(depht=3)
    with pytest.raises(ValueError, match="global_pool='token' needs class_token=True"):
        vit.VisionTransformer(class_token=False)
    with pytest.raises(ValueError, match="Did you mean vit_base_patch16_224"):
        vit.create_model("vit_base_patch16_244")
    with pytest.raises(TypeError, match="unknown override"):
        vit.create_model("vit_tiny_patch16_224", dropout=0.1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"depth": -1}, "depth -1: transformer blocks; accepted: an integer >= 1"),  # 0 blocks
        ({"depth": "abc"}, "depth 'abc': transformer blocks; accepted: an integer >= 1"),
        ({"depth": 2.5}, "depth 2.5: transformer blocks; accepted: an integer >= 1"),
        ({"embed_dim": 0}, "embed_dim 0: token width; accepted: an integer >= 1"),
        ({"num_heads": 0}, "num_heads 0: attention heads; accepted: an integer >= 1"),
        ({"mlp_ratio": -2}, "mlp_ratio -2: MLP width / embed_dim; accepted: a number > 0"),
        ({"in_chans": 0}, "in_chans 0: image channels; accepted: an integer >= 1"),
        ({"num_classes": -1}, "num_classes -1: classes of the head (0: no head); accepted:"),
        ({"drop_path_rate": 1.0}, "drop_path_rate 1.0: a fraction dropped; accepted: a number"),
        ({"embed_dim": 30, "num_heads": 4}, "embed_dim 30 is not divisible by num_heads 4"),
        (  # a gate and a value of half the width each
            {"mlp_layer": "swiglu_packed", "mlp_ratio": 1.53125},
            "mlp_layer='swiglu_packed' splits its hidden width int(embed_dim * mlp_ratio) = 49",
        ),
    ],
)
def test_architecture_numbers_out_of_range_are_named(kwargs, message):
    """A value the layers cannot use (a negative tensor size, a division by zero, a model of no
    blocks before) is a ValueError naming the field and what is accepted."""
    geometry = {"img_size": 32, "patch_size": 4, "embed_dim": 32, "num_heads": 2}
    with pytest.raises(ValueError) as raised:
        vit.VisionTransformer(**{**geometry, **kwargs})
    assert str(raised.value).startswith(message), raised.value
    assert set(raised.value.fields) & set(kwargs)  # what train.py blames on --model-kwargs


@pytest.mark.parametrize(
    ("switches", "logits", "pre_logits"),
    [
        ({}, (2, 3), (2, 16)),  # the class token
        ({"global_pool": "avg"}, (2, 3), (2, 16)),  # the mean patch token
        ({"class_token": False, "global_pool": "map"}, (2, 3), (2, 16)),  # an attention pool
        ({"distilled": True}, (2, 3), (2, 16)),  # class and distillation tokens, averaged
        ({"global_pool": ""}, (2, 5, 3), (2, 5, 16)),  # no pooling: every token
        ({"reg_tokens": 2, "global_pool": ""}, (2, 7, 3), (2, 7, 16)),
    ],
)
def test_forward_head_returns_the_documented_shapes_for_every_readout(switches, logits, pre_logits):
    model = vit.VisionTransformer(
        img_size=16, patch_size=8, embed_dim=16, depth=1, num_heads=2, num_classes=3, **switches
    ).eval()
    with torch.no_grad():
        tokens = model.forward_features(torch.randn(2, 3, 16, 16))
        assert model.forward_head(tokens).shape == logits
        assert model.forward_head(tokens, pre_logits=True).shape == pre_logits
