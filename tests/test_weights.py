"""Loading weights: every accepted format, pretrained downloads, resampling, and loud failures."""

import logging
import os
from pathlib import Path

import numpy as np
import PIL.Image
import pytest
import timm
import torch
from safetensors.torch import save_file
from timm.layers import resample_abs_pos_embed as timm_resample
from timm.models.vision_transformer import _load_weights as timm_load_npz

import vit
from vit.interop.weights import convert_jax_checkpoint, read_metadata

TINY = dict(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3, num_classes=5)


@pytest.fixture
def timm_tiny():
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", num_classes=10).eval()
    return model


def logits(model, size=224, seed=1):
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return model.eval()(x)


def assert_same(a, b):
    assert a.abs().max() > 0
    assert ((a - b).abs().max() / a.abs().max()).item() <= 1e-5


# -- file formats ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "wrap,suffix",
    [("plain", ".pth"), ("model", ".pth"), ("state_dict", ".pt"), ("module-prefix", ".bin")],
)
def test_torch_checkpoints_in_their_usual_wrappers(tmp_path, timm_tiny, wrap, suffix):
    sd = timm_tiny.state_dict()
    content = {
        "plain": sd,
        "model": {"model": sd, "epoch": 3},
        "state_dict": {"state_dict": sd, "optimizer": {}},
        "module-prefix": {"model": {f"module.{k}": v for k, v in sd.items()}},
    }[wrap]
    path = tmp_path / f"weights{suffix}"
    torch.save(content, path)
    model = vit.create_model("vit_tiny_patch16_224", num_classes=10, pretrained=path)
    assert_same(logits(timm_tiny), logits(model))


def test_safetensors_file_model_instance_and_plain_dict(tmp_path, timm_tiny):
    path = tmp_path / "w.safetensors"
    save_file(timm_tiny.state_dict(), str(path))
    for source in (path, str(path), timm_tiny, dict(timm_tiny.state_dict())):
        model = vit.create_model("vit_tiny_patch16_224", num_classes=10)
        report = vit.load_weights(model, source)
        assert report.missing == [] and report.unexpected == [] and not report.fresh_head
        assert len(report.loaded) == len(model.state_dict())
        assert_same(logits(timm_tiny), logits(model))


def test_our_files_carry_config_and_class_names(tmp_path):
    torch.manual_seed(0)
    model = vit.VisionTransformer(**{**TINY, "img_size": (32, 48)})
    torch.nn.init.normal_(model.head.weight)
    names = ["a", "b", "c", "d", "e"]
    path = vit.save_weights(model, tmp_path / "run" / "model.safetensors", class_names=names)
    assert sorted(p.name for p in path.parent.iterdir()) == ["model.safetensors"]  # no temp left
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # a normal file, not mkstemp's 0600
    restored = vit.load_model(path)  # no other file, no architecture given
    assert restored.class_names == names
    assert restored.patch_embed.img_size == (32, 48)
    assert read_metadata(path)["vit.config"]["embed_dim"] == 48
    x = torch.randn(2, 3, 32, 48)
    assert_same(model.eval()(x), restored.eval()(x))


def test_a_failed_save_leaves_the_previous_file_intact(tmp_path, monkeypatch):
    model = vit.VisionTransformer(**TINY)
    path = vit.save_weights(model, tmp_path / "model.safetensors")
    before = path.read_bytes()

    def crash(*args, **kwargs):
        Path(args[1]).write_bytes(b"half a file")  # the write gets partway, then dies
        raise KeyboardInterrupt

    monkeypatch.setattr("vit.interop.weights.save_file", crash)
    with pytest.raises(KeyboardInterrupt):
        vit.save_weights(model, path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["model.safetensors"]


# -- refusals and corrupt files ------------------------------------------------------------------
class RunsCodeWhenUnpickled:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_that_would_run_code_is_refused(tmp_path):
    marker = tmp_path / "code-ran"
    path = tmp_path / "evil.pth"
    torch.save({"model": RunsCodeWhenUnpickled(marker)}, path)
    with pytest.raises(ValueError, match=r"refused to load .*evil\.pth.*run code"):
        vit.load_weights(vit.VisionTransformer(**TINY), path)
    assert not marker.exists()


@pytest.mark.parametrize("suffix", [".pth", ".safetensors", ".npz"])
def test_truncated_files_fail_naming_the_file(tmp_path, suffix):
    model = vit.VisionTransformer(**TINY)
    path = tmp_path / f"cut{suffix}"
    sd = model.state_dict()
    if suffix == ".pth":
        torch.save(sd, path)
    elif suffix == ".safetensors":
        save_file(sd, str(path))
    else:
        np.savez(path, **{"embedding/kernel": np.zeros((8, 8, 3, 48), np.float32)})
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=str(path)):
        vit.load_weights(model, path)


def test_missing_file_unknown_format_and_wrong_source_type(tmp_path):
    model = vit.VisionTransformer(**TINY)
    with pytest.raises(FileNotFoundError, match="nowhere.pth"):
        vit.load_weights(model, tmp_path / "nowhere.pth")
    (tmp_path / "w.h5").write_bytes(b"x")
    with pytest.raises(
        ValueError, match=r"unsupported weights file .*w\.h5.*accepted: a \.safetensors"
    ):
        vit.load_weights(model, tmp_path / "w.h5")
    with pytest.raises(TypeError, match="cannot load weights from a int"):
        vit.load_weights(model, 3)
    torch.save({"epoch": 3}, tmp_path / "no-tensors.pth")
    with pytest.raises(ValueError, match="holds no tensors"):
        vit.load_weights(model, tmp_path / "no-tensors.pth")


def test_missing_and_unexpected_keys_are_named():
    model = vit.VisionTransformer(**TINY)
    sd = dict(model.state_dict())
    del sd["blocks.1.mlp.fc2.bias"]
    sd["blocks.2.attn.qkv.weight"] = torch.zeros(1)
    with pytest.raises(KeyError, match=r"blocks\.1\.mlp\.fc2\.bias.*blocks\.2\.attn\.qkv\.weight"):
        vit.load_weights(model, sd)
    report = vit.load_weights(model, sd, strict=False)
    assert report.missing == ["blocks.1.mlp.fc2.bias"]
    assert report.unexpected == ["blocks.2.attn.qkv.weight"]


def test_another_architecture_fails_with_the_shapes():
    other = vit.VisionTransformer(**{**TINY, "embed_dim": 24})
    with pytest.raises(
        ValueError, match=r"pos_embed width 24 does not match the model's embed_dim 48"
    ):
        vit.load_weights(vit.VisionTransformer(**TINY), other)
    deeper = vit.VisionTransformer(**{**TINY, "mlp_ratio": 2.0})
    with pytest.raises(ValueError, match=r"blocks\.0\.mlp\.fc1\.weight: checkpoint \(96, 48\)"):
        vit.load_weights(vit.VisionTransformer(**TINY), deeper)


# -- heads and position embeddings ---------------------------------------------------------------
def test_another_num_classes_drops_the_head_with_a_message(timm_tiny, caplog):
    with caplog.at_level(logging.WARNING, logger="vit"):
        model = vit.create_model("vit_tiny_patch16_224", num_classes=3, pretrained=None)
        report = vit.load_weights(model, timm_tiny)
    assert report.fresh_head and "dropped the checkpoint's 10-class head" in caplog.text
    assert torch.count_nonzero(model.head.weight) == 0  # the fresh head, untouched
    with torch.no_grad():
        x = torch.randn(1, 3, 224, 224)
        torch.testing.assert_close(
            model.forward_head(model.forward_features(x), pre_logits=True),
            timm_tiny.forward_head(timm_tiny.forward_features(x), pre_logits=True),
        )


def test_a_weights_file_keeps_its_own_head_size(tmp_path):
    """create_model(NAME, pretrained=FILE) without num_classes takes the file's head, as timm
    loads it: a fine-tuned 10-class file classifies as it was trained (the name's 1000-class
    head would be random); a file without a head gives a feature extractor."""
    torch.manual_seed(0)
    theirs = timm.create_model("vit_tiny_patch16_224", num_classes=10).eval()
    torch.nn.init.normal_(theirs.head.weight, std=0.5)
    torch.save(theirs.state_dict(), tmp_path / "fine_tuned.pth")
    ours = vit.create_model("vit_tiny_patch16_224", pretrained=tmp_path / "fine_tuned.pth")
    assert ours.num_classes == 10 and not ours.load_report.fresh_head
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(ours.eval()(x), theirs(x))
    torch.save(timm.create_model("vit_tiny_patch16_224", num_classes=0).state_dict(),
               tmp_path / "backbone.pth")  # fmt: skip
    backbone = vit.create_model("vit_tiny_patch16_224", pretrained=tmp_path / "backbone.pth")
    assert backbone.num_classes == 0 and not backbone.load_report.fresh_head
    # timm's name for it, checkpoint_path (the error listed ViTConfig's fields)
    same = vit.create_model("vit_tiny_patch16_224", checkpoint_path=tmp_path / "fine_tuned.pth")
    with torch.no_grad():
        torch.testing.assert_close(same.eval()(x), theirs(x))
    with pytest.raises(ValueError, match="give the weights once"):
        vit.create_model("vit_tiny_patch16_224", pretrained=True, checkpoint_path="w.pth")


def test_load_model_keeps_preprocess_and_class_names_in_step_with_the_model(tmp_path):
    model = vit.VisionTransformer(**TINY)
    model.preprocess = vit.Preprocess(input_size=(32, 32))
    names = ["a", "b", "c", "d", "e"]
    path = vit.save_weights(model, tmp_path / "m.safetensors", class_names=names, model_name="t")
    bigger = vit.load_model(path, img_size=64)
    assert tuple(bigger.preprocess.input_size) == (64, 64)
    image = PIL.Image.new("RGB", (50, 50))
    assert vit.create_transform(bigger)(image).shape == (3, 64, 64)
    assert vit.load_model(path, num_classes=2).class_names is None  # 5 names, 2 outputs
    again = vit.save_weights(vit.load_model(path), tmp_path / "again.safetensors")
    reloaded = vit.load_model(again)
    assert reloaded.class_names == names and reloaded.model_name == "t"


def test_a_headless_checkpoint_keeps_the_fresh_head(caplog):
    torch.manual_seed(0)
    features = timm.create_model("vit_tiny_patch16_224", num_classes=0)
    model = vit.create_model("vit_tiny_patch16_224", num_classes=10)
    with caplog.at_level(logging.WARNING, logger="vit"):
        report = vit.load_weights(model, features)
    assert report.fresh_head and report.missing == [] and "no classifier head" in caplog.text


@pytest.mark.parametrize(
    "new_size,old_size,prefix",
    [
        ((24, 24), None, 1),
        ((7, 7), None, 1),
        ((12, 20), None, 1),
        ((10, 10), (8, 12), 0),
        ((14, 14), None, 0),
        # as many tokens, another grid: resampled (a square one was taken for unchanged)
        ((4, 4), (2, 8), 1),
        ((2, 8), (2, 8), 1),
        # a square 4x4 grid (assumed without old_size) to 2x8 or 8x2: as many tokens, resampled
        ((2, 8), None, 1),
        ((8, 2), (4, 4), 1),
        ((8, 2), (2, 8), 0),  # transposed
    ],
)
def test_resample_matches_timm(new_size, old_size, prefix):
    torch.manual_seed(0)
    square = 16 if new_size[0] * new_size[1] == 16 else 196  # a 4x4 or 14x14 grid
    tokens = (old_size[0] * old_size[1] if old_size else square) + prefix
    posemb = torch.randn(1, tokens, 32)
    ours = vit.resample_abs_pos_embed(posemb, new_size, old_size, num_prefix_tokens=prefix)
    theirs = timm_resample(posemb, new_size, old_size, num_prefix_tokens=prefix)
    assert ours.shape == (1, new_size[0] * new_size[1] + prefix, 32)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    torch.testing.assert_close(ours[:, :prefix], posemb[:, :prefix])  # prefix tokens kept as is


def test_resample_works_in_float32_for_half_precision_weights():
    posemb = torch.randn(1, 197, 16).half()
    ours = vit.resample_abs_pos_embed(posemb, (8, 8))
    assert ours.dtype == torch.float16
    torch.testing.assert_close(ours, timm_resample(posemb, (8, 8)), rtol=0, atol=0)


def test_another_image_size_resamples_position_embeddings(timm_tiny, caplog):
    with caplog.at_level(logging.WARNING, logger="vit"):
        model = vit.create_model("vit_tiny_patch16_224", num_classes=10, img_size=(256, 320))
        report = vit.load_weights(model, timm_tiny)
    assert report.resampled_pos_embed == ((14, 14), (16, 20))
    assert "resampled pos_embed from a 14x14 to a 16x20" in caplog.text
    expected = timm_resample(timm_tiny.pos_embed.detach(), (16, 20), num_prefix_tokens=1)
    torch.testing.assert_close(model.pos_embed.detach(), expected, rtol=0, atol=0)
    assert model.preprocess.input_size == (256, 320)
    # timm resizing its own model the same way gives the same logits
    theirs = timm.create_model("vit_tiny_patch16_224", num_classes=10, img_size=(256, 320))
    theirs.load_state_dict({**timm_tiny.state_dict(), "pos_embed": expected})
    x = torch.randn(1, 3, 256, 320)
    with torch.no_grad():
        assert_same(theirs.eval()(x), model.eval()(x))


def test_non_square_grid_read_from_our_metadata(tmp_path):
    torch.manual_seed(0)
    wide = vit.VisionTransformer(**{**TINY, "img_size": (32, 64)})  # a 4x8 grid
    path = vit.save_weights(wide, tmp_path / "wide.safetensors")
    square = vit.VisionTransformer(**{**TINY, "img_size": 48})  # a 6x6 grid
    report = vit.load_weights(square, path)
    assert report.resampled_pos_embed == ((4, 8), (6, 6))
    expected = timm_resample(wide.pos_embed.detach(), (6, 6), (4, 8), num_prefix_tokens=1)
    torch.testing.assert_close(square.pos_embed.detach(), expected)


def test_a_transposed_grid_of_as_many_tokens_is_resampled(tmp_path):
    """A 4x6 grid loaded as 6x4 has as many tokens; read as it is, it would be scrambled."""
    torch.manual_seed(0)
    wide = vit.VisionTransformer(**{**TINY, "img_size": (32, 48)})
    path = vit.save_weights(wide, tmp_path / "wide.safetensors")
    tall = vit.VisionTransformer(**{**TINY, "img_size": (48, 32)})
    report = vit.load_weights(tall, path)
    assert report.resampled_pos_embed == ((4, 6), (6, 4))
    expected = timm_resample(wide.pos_embed.detach(), (6, 4), (4, 6), num_prefix_tokens=1)
    torch.testing.assert_close(tall.pos_embed.detach(), expected)


def test_our_file_resamples_the_way_its_weights_source_does(tmp_path):
    """A model loaded from a transformers folder, saved again, is resampled transformers' way
    (its config's pos_embed_resample), not timm's for our file's layout."""
    torch.manual_seed(0)
    model = vit.VisionTransformer(**{**TINY, "pos_embed_resample": "transformers"})
    path = vit.save_weights(model, tmp_path / "resaved.safetensors")
    bigger = vit.VisionTransformer(**{**TINY, "img_size": 48})
    vit.load_weights(bigger, path)
    stored = model.pos_embed.detach()
    expected = vit.models.pos_embed.resample_pos_embed(stored, (6, 6), method="transformers")
    torch.testing.assert_close(bigger.pos_embed.detach(), expected)


def test_a_missing_key_message_marks_its_hint_as_pythons():
    """The commands print the message too, and have no strict switch."""
    sd = dict(vit.VisionTransformer(**TINY).state_dict())
    del sd["norm.bias"]
    with pytest.raises(KeyError) as info:
        vit.load_weights(vit.VisionTransformer(**TINY), sd)
    assert "(in Python: load_weights(..., strict=False) loads the rest)" in info.value.args[0]


def test_a_whole_pickled_model_is_refused_as_such(tmp_path):
    """torch.nn classes are under "torch" too: this was put down to a newer pickle protocol."""
    path = tmp_path / "model.pth"
    torch.save(torch.nn.Linear(2, 2), path)
    with pytest.raises(ValueError, match=r"whole pickled model .*torch\.save\(model\.state_dict"):
        vit.interop.weights.read_checkpoint(path)


def test_an_npz_in_another_layout_than_googles_is_refused_in_one_line(tmp_path):
    """Only Google's arrays are converted; timm-named arrays reached load_state_dict."""
    model = vit.VisionTransformer(**TINY)
    path = tmp_path / "timm.npz"
    np.savez(path, **{k: v.numpy() for k, v in model.state_dict().items()})
    with pytest.raises(ValueError, match=r"cannot read .*timm\.npz: .*Google's JAX layout only"):
        vit.load_weights(model, path)


# -- Google's JAX checkpoints ------------------------------------------------------------------
def to_jax_layout(sd: dict, big_vision: bool = False) -> dict[str, np.ndarray]:
    """Write a timm state dict the way Google's JAX code stores it (the inverse conversion)."""
    prefix = "params/" if big_vision else ""
    attn_i, ln2_i, mlp_i = (0, 1, 0) if big_vision else (1, 2, 3)
    dim = sd["cls_token"].shape[-1]
    heads = 3
    out = {
        "embedding/kernel": sd["patch_embed.proj.weight"].permute(2, 3, 1, 0),
        "embedding/bias": sd["patch_embed.proj.bias"],
        "cls": sd["cls_token"],
        ("pos_embedding" if big_vision else "Transformer/posembed_input/pos_embedding"): sd[
            "pos_embed"
        ],
        "Transformer/encoder_norm/scale": sd["norm.weight"],
        "Transformer/encoder_norm/bias": sd["norm.bias"],
        "head/kernel": sd["head.weight"].T,
        "head/bias": sd["head.bias"],
    }
    depth = len({k.split(".")[1] for k in sd if k.startswith("blocks.")})
    for i in range(depth):
        b, j = f"blocks.{i}.", f"Transformer/encoderblock_{i}/"
        mha = f"{j}MultiHeadDotProductAttention_{attn_i}/"
        out[f"{j}LayerNorm_0/scale"], out[f"{j}LayerNorm_0/bias"] = (
            sd[b + "norm1.weight"],
            sd[b + "norm1.bias"],
        )
        for n, w, bias in zip(
            ("query", "key", "value"),
            sd[b + "attn.qkv.weight"].chunk(3),
            sd[b + "attn.qkv.bias"].chunk(3),
            strict=True,
        ):
            out[f"{mha}{n}/kernel"] = w.T.reshape(dim, heads, dim // heads)
            out[f"{mha}{n}/bias"] = bias.reshape(heads, dim // heads)
        out[f"{mha}out/kernel"] = sd[b + "attn.proj.weight"].T.reshape(heads, dim // heads, dim)
        out[f"{mha}out/bias"] = sd[b + "attn.proj.bias"]
        out[f"{j}LayerNorm_{ln2_i}/scale"], out[f"{j}LayerNorm_{ln2_i}/bias"] = (
            sd[b + "norm2.weight"],
            sd[b + "norm2.bias"],
        )
        for d, fc in ((0, "fc1"), (1, "fc2")):
            out[f"{j}MlpBlock_{mlp_i}/Dense_{d}/kernel"] = sd[f"{b}mlp.{fc}.weight"].T
            out[f"{j}MlpBlock_{mlp_i}/Dense_{d}/bias"] = sd[f"{b}mlp.{fc}.bias"]
    return {prefix + k: v.detach().numpy().copy() for k, v in out.items()}


@pytest.mark.parametrize("big_vision", [False, True], ids=["vit_jax", "big_vision"])
def test_google_npz_fuses_qkv_like_timm_does(tmp_path, timm_tiny, big_vision):
    path = tmp_path / "augreg.npz"
    np.savez(path, **to_jax_layout(timm_tiny.state_dict(), big_vision))
    ours = vit.create_model("vit_tiny_patch16_224", num_classes=10, pretrained=path)
    assert_same(logits(timm_tiny), logits(ours))
    # timm's own npz loader, reading the same file, agrees with us
    reference = timm.create_model("vit_tiny_patch16_224", num_classes=10)
    timm_load_npz(reference, str(path))
    assert_same(logits(reference), logits(ours))


def test_big_vision_map_head_loads_like_timm(tmp_path):
    """big_vision's MAP head (SigLIP's readout) has its own LayerNorm_0 and MlpBlock_0: they are
    the attention pool, not one more encoder block."""
    torch.manual_seed(0)
    theirs = timm.create_model("vit_tiny_patch16_224", global_pool="map", **TINY).eval()
    sd = theirs.state_dict()
    arrays = to_jax_layout(sd, big_vision=True)
    head, mha = "params/MAPHead_0/", "params/MAPHead_0/MultiHeadDotProductAttention_0/"
    dim, heads = sd["cls_token"].shape[-1], 3
    key, value = sd["attn_pool.kv.weight"].chunk(2)
    key_bias, value_bias = sd["attn_pool.kv.bias"].chunk(2)
    map_head = {
        head + "probe": sd["attn_pool.latent"],
        f"{mha}query/kernel": sd["attn_pool.q.weight"].T.reshape(dim, heads, -1),
        f"{mha}query/bias": sd["attn_pool.q.bias"].reshape(heads, -1),
        f"{mha}key/kernel": key.T.reshape(dim, heads, -1),
        f"{mha}key/bias": key_bias.reshape(heads, -1),
        f"{mha}value/kernel": value.T.reshape(dim, heads, -1),
        f"{mha}value/bias": value_bias.reshape(heads, -1),
        f"{mha}out/kernel": sd["attn_pool.proj.weight"].T.reshape(heads, -1, dim),
        f"{mha}out/bias": sd["attn_pool.proj.bias"],
        head + "LayerNorm_0/scale": sd["attn_pool.norm.weight"],
        head + "LayerNorm_0/bias": sd["attn_pool.norm.bias"],
    }
    for d, fc in ((0, "fc1"), (1, "fc2")):
        map_head[f"{head}MlpBlock_0/Dense_{d}/kernel"] = sd[f"attn_pool.mlp.{fc}.weight"].T
        map_head[f"{head}MlpBlock_0/Dense_{d}/bias"] = sd[f"attn_pool.mlp.{fc}.bias"]
    arrays.update({k: v.detach().numpy().copy() for k, v in map_head.items()})
    path = tmp_path / "siglip.npz"
    np.savez(path, **arrays)
    reference = timm.create_model("vit_tiny_patch16_224", global_pool="map", **TINY).eval()
    timm_load_npz(reference, str(path))  # timm's own reader agrees the file is what we wrote
    assert_same(logits(theirs, 32), logits(reference, 32))
    ours = vit.create_model("vit_tiny_patch16_224", global_pool="map", pretrained=path, **TINY)
    assert_same(logits(theirs, 32), logits(ours, 32))


def test_google_npz_with_a_pre_logits_layer_is_refused(tmp_path, timm_tiny):
    """The head of a ViT-21k file reads tanh(pre_logits(x)): without that layer it is another
    classifier, so the file is refused (as torchvision's heads.pre_logits)."""
    arrays = to_jax_layout(timm_tiny.state_dict())
    arrays["pre_logits/kernel"], arrays["pre_logits/bias"] = np.eye(192), np.zeros(192)
    path = tmp_path / "vit21k.npz"
    np.savez(path, **arrays)
    with pytest.raises(ValueError, match="pre_logits.*no representation layer"):
        vit.create_model("vit_tiny_patch16_224", num_classes=10, pretrained=path)


def test_npz_without_vit_arrays_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="not a ViT JAX checkpoint"):
        convert_jax_checkpoint({"foo": np.zeros(3)}, source="foo.npz")


# -- pretrained=True: timm's download, with only the network step replaced ------------------------
@pytest.fixture
def offline_hub(tmp_path, monkeypatch):
    """Serve a randomly initialised timm checkpoint where timm would download from the hub."""
    torch.manual_seed(0)
    published = timm.create_model("vit_tiny_patch16_224")  # 1000 classes, as the real weights
    torch.nn.init.normal_(published.head.weight, std=0.02)
    weights = tmp_path / "model.safetensors"
    save_file(published.state_dict(), str(weights))
    requests = []

    def hf_hub_download(repo_id, filename, revision=None, cache_dir=None, **kwargs):
        requests.append((repo_id, filename))
        return str(weights)

    monkeypatch.setattr("timm.models._hub.hf_hub_download", hf_hub_download)
    # the hub counts as reachable, and its cache as empty, so the download path is taken
    monkeypatch.setattr("vit.factory.timm_weights._hub_offline_reason", lambda: None)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    return published.eval(), requests


def test_pretrained_true_takes_timms_default_weights(offline_hub):
    published, requests = offline_hub
    model = vit.create_model("vit_tiny_patch16_224", pretrained=True)
    assert requests == [("timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k", "model.safetensors")]
    assert_same(logits(published), logits(model))


def test_pretrained_true_with_new_classes_and_size(offline_hub, caplog):
    published, _ = offline_hub
    with caplog.at_level(logging.WARNING, logger="vit"):
        model = vit.create_model(
            "vit_tiny_patch16_224", pretrained=True, num_classes=10, img_size=384
        )
    assert model.head.out_features == 10 and model.grid_size == (24, 24)
    assert "dropped the checkpoint's 1000-class head" in caplog.text
    expected = timm_resample(published.pos_embed.detach(), (24, 24), num_prefix_tokens=1)
    torch.testing.assert_close(model.pos_embed.detach(), expected, rtol=0, atol=0)


def test_pretrained_true_without_published_weights_says_what_to_do():
    with pytest.raises(ValueError, match="no published pretrained weights for vit_cifar_patch4_32"):
        vit.create_model("vit_cifar_patch4_32", pretrained=True)
