"""`vit.export` / `python -m vit.export`: ONNX, transformers and torchvision exports, each
loaded back by the library it is for and compared with our logits (float32, eval)."""

import json
import math
import os
import re
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
import torch
from conftest import RTOL, relative_error

import vit
from vit import export
from vit.interop import torchvision_export, transformers_export
from vit.interop.export_check import MissingExtraError
from vit.interop.layouts import hf_common
from vit.interop.onnx_export import OnnxOptions, export_onnx
from vit.interop.torchvision_export import export_torchvision
from vit.interop.transformers_export import export_transformers

onnxruntime = pytest.importorskip("onnxruntime")
transformers = pytest.importorskip("transformers")
torchvision = pytest.importorskip("torchvision")

NAMES = ["cat", "dog", "ship"]
TINY = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=3)


@pytest.fixture
def model():
    torch.manual_seed(0)
    model = vit.VisionTransformer(**TINY)
    torch.nn.init.normal_(model.head.weight, std=0.5)
    model.class_names = NAMES
    model.preprocess = vit.Preprocess(input_size=(32, 32), mean=(0.4, 0.5, 0.6), crop_pct=1.0)
    return model.eval()


def logits(model, x):
    with torch.no_grad():
        return model.eval()(x)


def leftovers(folder):
    return [p.name for p in folder.iterdir() if p.name.startswith(".")]


def test_onnx_has_a_dynamic_batch_height_and_width_and_our_logits(model, tmp_path, one_thread):
    path = tmp_path / "model.onnx"
    result = export_onnx(model, path)
    assert result.path == path and result.max_relative_difference <= RTOL
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (batch_axis, channels, height, width) = session.get_inputs()[0].shape
    assert channels == 3 and all(isinstance(a, str) for a in (batch_axis, height, width))
    x = torch.randn(5, 3, 32, 32)
    (out,) = session.run(["logits"], {"pixel_values": x.numpy()})
    assert out.shape == (5, 3)
    assert relative_error(out, logits(model, x)) <= RTOL
    metadata = session.get_modelmeta().custom_metadata_map
    assert json.loads(metadata["vit.class_names"]) == NAMES
    assert json.loads(metadata["vit.preprocess"])["mean"] == [0.4, 0.5, 0.6]
    assert json.loads(metadata["vit.precision"]) == "float32"
    assert json.loads(metadata["vit.output"]) == "logits"
    assert json.loads(metadata["vit.model_name"]) is None  # built by hand, no registry name
    assert leftovers(tmp_path) == []


def test_a_large_onnx_keeps_its_weights_beside_it_and_a_failed_check_keeps_the_previous(
    model, tmp_path, monkeypatch, one_thread
):
    """Over protobuf's limit (here: any size) the weights go to FILE.data, which FILE names;
    both are checked before either is put in place. They were written in place: a failed
    check removed the previous export of that name, and a killed one left half a file."""
    from vit.interop import onnx_export

    monkeypatch.setattr(onnx_export, "EXTERNAL_DATA_BYTES", 0)
    path, data = tmp_path / "model.onnx", tmp_path / "model.onnx.data"
    assert export_onnx(model, path).path == path and data.stat().st_size > 10_000
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = torch.randn(2, 3, 32, 32)
    assert (
        relative_error(session.run(["logits"], {"pixel_values": x.numpy()})[0], logits(model, x))
        <= RTOL
    )
    before = path.read_bytes(), data.read_bytes()
    monkeypatch.setattr(onnx_export, "relative_difference", lambda theirs, ours: 0.5)
    with pytest.raises(ValueError, match="tolerance"):
        export_onnx(vit.VisionTransformer(**TINY), path)
    assert (path.read_bytes(), data.read_bytes()) == before and leftovers(tmp_path) == []


def test_static_size_onnx_keeps_the_model_input_size(model, tmp_path, one_thread):
    path = tmp_path / "model.onnx"
    export_onnx(model, path, options=OnnxOptions(dynamic_size=False))
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert session.get_inputs()[0].shape[1:] == [3, 32, 32]


def test_onnx_of_a_model_whose_patches_leave_a_margin_is_fixed_at_its_size(tmp_path, one_thread):
    """A dynamic graph takes multiples of the patch, which 38 px in 16-px patches (so400m's 384
    in 14s) is not: the file is exported at the model's own size, said, its int8 copy too."""
    torch.manual_seed(0)
    margin = vit.VisionTransformer(img_size=38, patch_size=16, embed_dim=32, depth=1, num_heads=2)
    torch.nn.init.normal_(margin.head.weight, std=0.5)
    path = tmp_path / "model.onnx"
    result = export_onnx(margin, path, options=OnnxOptions(int8=True))
    assert "fixed size: the patches leave a margin" in str(result)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert session.get_inputs()[0].shape[1:] == [3, 38, 38]


def test_onnx_of_a_headless_backbone_outputs_its_embeddings(tmp_path, one_thread):
    torch.manual_seed(0)
    headless = vit.VisionTransformer(**{**TINY, "num_classes": 0}).eval()
    path = tmp_path / "backbone.onnx"
    result = export_onnx(headless, path)
    assert result.max_relative_difference <= RTOL
    assert "onnxruntime (batch 1 and 3 at 32x32, 48x24) embeddings vs ours" in str(result)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [o.name for o in session.get_outputs()] == ["embeddings"]
    x = torch.randn(4, 3, 32, 32)
    (out,) = session.run(["embeddings"], {"pixel_values": x.numpy()})
    assert out.shape == (4, 32)  # the pooled embedding, as model(x)
    assert relative_error(out, logits(headless, x)) <= RTOL


# Every family's switches (timm's names) on the tiny model; each exports and runs in onnxruntime.
SWIGLU = {"mlp_layer": "swiglu_packed", "act_layer": "silu"}  # DINOv2 ViT-g/14's gated MLP
FAMILIES = {
    "dinov2 (LayerScale, headless)": {"init_values": 1e-5, "num_classes": 0},
    "dinov2 giant (gated MLP)": {"init_values": 1e-5, **SWIGLU, "mlp_ratio": 5.5},
    "dinov2 with registers": {"init_values": 1e-5, "reg_tokens": 4, "no_embed_class": True},
    "clip (pre_norm, QuickGELU)": {"pre_norm": True, "act_layer": "quick_gelu"},
    "siglip (attention pool)": {
        "class_token": False,
        "global_pool": "map",
        "act_layer": "gelu_tanh",
    },
    "deit distilled": {"distilled": True},
    "deit3 (LayerScale, no_embed_class)": {"init_values": 1e-4, "no_embed_class": True},
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_onnx_of_every_family_matches_in_onnxruntime(family, tmp_path, one_thread):
    torch.manual_seed(0)
    model = vit.VisionTransformer(**{**TINY, **FAMILIES[family]}).eval()
    with torch.no_grad():  # random heads and LayerScale at 1: nothing that hides a difference
        for name, parameter in model.named_parameters():
            if name.endswith("gamma"):
                parameter.fill_(1.0)
            elif name.startswith(("head.weight", "head_dist.weight")):
                torch.nn.init.normal_(parameter, std=0.5)
    path = tmp_path / "model.onnx"
    result = export_onnx(model, path)
    assert result.max_relative_difference <= RTOL
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = torch.randn(2, 3, 32, 32)
    (out,) = session.run(None, {"pixel_values": x.numpy()})
    assert out.shape == (2, model.num_classes or model.embed_dim)
    assert relative_error(out, logits(model, x)) <= RTOL
    # another size (non-square, 6x3 patches): equal to our model with dynamic_img_size
    dynamic = vit.VisionTransformer(**{**TINY, **FAMILIES[family]}, dynamic_img_size=True)
    dynamic.load_state_dict(model.state_dict())
    x = torch.randn(2, 3, 48, 24)
    (out,) = session.run(None, {"pixel_values": x.numpy()})
    assert relative_error(out, logits(dynamic, x)) <= RTOL


@pytest.mark.parametrize("method", ["transformers", "dinov2", "torchvision"])
def test_onnx_resamples_position_embeddings_as_the_weights_library(method, tmp_path, one_thread):
    torch.manual_seed(0)
    model = vit.VisionTransformer(**TINY, pos_embed_resample=method, dynamic_img_size=True)
    torch.nn.init.normal_(model.head.weight, std=0.5)
    path = tmp_path / "model.onnx"
    result = export_onnx(model.eval(), path)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    if method == "dinov2":  # its scale-factor resampling cannot be dynamic: fixed size, said
        assert session.get_inputs()[0].shape[2:] == [32, 32]
        assert "fixed size" in str(result)
        return
    x = torch.randn(3, 3, 24, 40)
    (out,) = session.run(None, {"pixel_values": x.numpy()})
    assert relative_error(out, logits(model, x)) <= RTOL


def fusion_warnings(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("warning: --optimize")]


def test_optimize_fuses_gelu_keeps_attention_fused_and_stays_exact(
    model, tmp_path, one_thread, capsys
):
    path = tmp_path / "model.onnx"
    result = export_onnx(model, path, options=OnnxOptions(optimize=True))
    assert result.max_relative_difference <= RTOL
    fused = dict(re.findall(r"(\w+) (\d+)", str(result).split("fused ", 1)[1].split(" logits")[0]))
    # opset 23 writes attention as one Attention operator per block; onnxruntime fuses GELU
    assert int(fused["BiasGelu"]) == 2 and int(fused["Attention"]) == 2
    # onnxruntime's residual + LayerNorm fusion needs its symbolic shape inference, which does
    # not know opset 23's Attention: it does not match, and that is warned, not silent
    warnings = fusion_warnings(capsys.readouterr().err)
    assert warnings == [
        "warning: --optimize fused 0 residual + LayerNorm operators for 2 blocks: onnxruntime's "
        "residual + LayerNorm fusion did not match this export"
    ]
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert json.loads(session.get_modelmeta().custom_metadata_map["vit.precision"]) == "float32"


# int8 on random images and tiny random models: max relative logit difference 0.01-0.03
# measured; the shipped CIFAR model keeps 99.4% of its float predictions on the test set.
INT8_TOLERANCE = 0.1
INT8_AGREEMENT = 0.9


def test_int8_is_smaller_and_agrees_with_float(tmp_path, one_thread):
    torch.manual_seed(0)
    model = vit.VisionTransformer(**{**TINY, "embed_dim": 64, "num_classes": 10}).eval()
    torch.nn.init.normal_(model.head.weight, std=0.5)
    float_path, int8_path = tmp_path / "float.onnx", tmp_path / "int8.onnx"
    export_onnx(model, float_path)
    result = export_onnx(model, int8_path, options=OnnxOptions(int8=True))
    assert 1e-4 < result.max_relative_difference <= INT8_TOLERANCE  # quantized, yet close
    assert int8_path.stat().st_size < 0.6 * float_path.stat().st_size
    session = onnxruntime.InferenceSession(str(int8_path), providers=["CPUExecutionProvider"])
    metadata = session.get_modelmeta().custom_metadata_map
    assert json.loads(metadata["vit.precision"]) == "int8"
    assert json.loads(metadata["vit.class_names"]) == [f"class {i}" for i in range(10)]
    ops = {node.op_type for node in __import__("onnx").load(str(int8_path)).graph.node}
    assert (
        "DynamicQuantizeLinear" in ops or "DynamicQuantizeMatMul" in ops or "MatMulInteger" in ops
    )
    # kept in float: LayerNorm, and attention (its softmax inside opset 23's Attention)
    assert "LayerNormalization" in ops and "Attention" in ops
    x = torch.randn(64, 3, 32, 32)
    (out,) = session.run(["logits"], {"pixel_values": x.numpy()})
    agreement = (torch.from_numpy(out).argmax(-1) == logits(model, x).argmax(-1)).float().mean()
    assert agreement >= INT8_AGREEMENT


@pytest.mark.parametrize("flag", ["--int8", "--optimize", "--static-size"])
def test_onnx_flags_without_onnx_are_refused_in_one_line(flag, model, tmp_path, capsys):
    path = vit.save_weights(model, tmp_path / "m.safetensors")
    for others in ([], ["--hf", str(tmp_path / "hf")]):
        with pytest.raises(SystemExit) as exit_info:
            export.main([str(path), flag, *others])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{flag} shapes the ONNX export: pass --onnx FILE" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.safetensors"]


@pytest.mark.parametrize(
    ("family", "named"),
    [
        ("dinov2 with registers", "reg_tokens=4"),
        ("clip (pre_norm, QuickGELU)", "pre_norm=True, act_layer='quick_gelu'"),
        ("siglip (attention pool)", "global_pool='map'"),
        ("deit distilled", "distilled=True"),
        ("deit3 (LayerScale, no_embed_class)", "init_values=0.0001, no_embed_class=True"),
        ("dinov2 giant (gated MLP)", "act_layer='silu', mlp_layer='swiglu_packed'"),
    ],
)
def test_torchvision_refuses_family_switches_by_name(family, named, tmp_path):
    model = vit.VisionTransformer(**{**TINY, **FAMILIES[family]})
    with pytest.raises(ValueError, match=re.escape(named)) as refused:
        export_torchvision(model, tmp_path / "tv.pth")
    assert "\n" not in str(refused.value)
    assert list(tmp_path.iterdir()) == []  # nothing written


def perturbed(model: vit.VisionTransformer) -> vit.VisionTransformer:
    """Every parameter moved off its initial value (LayerScale, norms, zero heads), so that a
    tensor written to the wrong place shows in the outputs."""
    torch.manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    return model.eval()


# family -> (switches on TINY, model name, the transformers class written, its output)
HF_FAMILIES = {
    "vit": ({}, None, "ViTForImageClassification", "logits"),
    "vit headless": ({"num_classes": 0}, None, "ViTModel", "last_hidden_state"),
    "mae": ({"num_classes": 0}, "vit_base_patch16_224.mae", "ViTMAEModel", "last_hidden_state"),
    "dinov2": (
        {"init_values": 1e-5, "num_classes": 0},
        None,
        "Dinov2Model",
        "last_hidden_state",
    ),
    "dinov2 with registers": (
        {"init_values": 1e-5, "reg_tokens": 2, "no_embed_class": True, "num_classes": 0},
        None,
        "Dinov2WithRegistersModel",
        "last_hidden_state",
    ),
    "dinov2 with a gated MLP (ViT-g/14)": (  # 176 rows: the gate's 88 and the value's
        {"init_values": 1e-5, "num_classes": 0, **SWIGLU, "mlp_ratio": 5.5},
        None,
        "Dinov2Model",
        "last_hidden_state",
    ),
    "clip with projection": (
        {"pre_norm": True, "act_layer": "quick_gelu", "norm_eps": 1e-5, "num_classes": 8},
        None,
        "CLIPVisionModelWithProjection",
        "image_embeds",
    ),
    "clip": ({"pre_norm": True, "num_classes": 0}, None, "CLIPVisionModel", "pooler_output"),
    "siglip": (
        {"class_token": False, "global_pool": "map", "act_layer": "gelu_tanh", "num_classes": 0},
        None,
        "SiglipVisionModel",
        "pooler_output",
    ),
    "siglip without its pool": (
        {"class_token": False, "global_pool": "", "num_classes": 0},
        None,
        "SiglipVisionModel",
        "last_hidden_state",
    ),
    "deit distilled": (
        {"distilled": True},
        None,
        "DeiTForImageClassificationWithTeacher",
        "logits",
    ),
}


def hf_family_model(family: str) -> vit.VisionTransformer:
    switches, name, _, _ = HF_FAMILIES[family]
    torch.manual_seed(0)
    model = perturbed(vit.VisionTransformer(**{**TINY, **switches}))
    if family == "clip with projection":
        torch.nn.init.zeros_(model.head.bias)  # CLIP's projection has no bias
    model.model_name = name
    return model


@pytest.mark.parametrize("family", list(HF_FAMILIES))
def test_transformers_export_of_every_family_round_trips(family, tmp_path, one_thread):
    _, _, class_name, output = HF_FAMILIES[family]
    model = hf_family_model(family)
    result = export_transformers(model, tmp_path / "hf")
    assert result.target == f"transformers {class_name}"
    assert result.max_relative_difference <= RTOL
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["architectures"] == [class_name]
    # transformers' own class reads the folder and gives our outputs
    x = torch.randn(2, 3, 32, 32)
    kwargs = {"add_pooling_layer": False} if class_name == "ViTModel" else {}
    theirs = getattr(transformers, class_name).from_pretrained(tmp_path / "hf", **kwargs).eval()
    inputs = {"pixel_values": x}
    if class_name == "ViTMAEModel":  # no masking, the patches in order
        inputs["noise"] = torch.arange(16.0).expand(2, -1)
    with torch.no_grad():
        found = getattr(theirs(**inputs), output)
        ours = model.forward_features(x) if output == "last_hidden_state" else model(x)
    assert found.shape == ours.shape
    assert relative_error(found, ours) <= RTOL
    # and our reader takes the folder back: same class, same outputs
    back = vit.load_model(tmp_path / "hf")
    assert type(back) is type(model) and back.num_classes == model.num_classes
    with torch.no_grad():
        assert relative_error(back(x), model(x)) <= RTOL


@pytest.mark.parametrize(
    ("switches", "named"),
    [
        (FAMILIES["deit3 (LayerScale, no_embed_class)"], "DeiT III"),
        ({**FAMILIES["deit3 (LayerScale, no_embed_class)"], "num_classes": 0}, "DeiT III"),
        ({"init_values": 1e-5}, "DINOv2 classifiers read the class token and the mean patch"),
        # and what it can hold instead
        ({"init_values": 1e-5}, "its backbone can be written, without the head (num_classes=0)"),
        ({**FAMILIES["siglip (attention pool)"], "num_classes": 3}, "SiglipForImageClassif"),
        ({"global_pool": "avg"}, "global_pool='avg'"),
        ({"no_embed_class": True}, "no_embed_class=True"),
        ({"pre_norm": True, "qkv_bias": False}, "qkv_bias=False"),
        ({**SWIGLU, "mlp_ratio": 5.5}, "mlp_layer='swiglu_packed'"),  # no gated MLP in ViT
        # transformers' DINOv2: a SiLU gate, a width from a whole mlp_ratio
        ({"init_values": 1e-5, "num_classes": 0, **SWIGLU, "act_layer": "gelu"}, "a SiLU"),
        ({"init_values": 1e-5, "num_classes": 0, **SWIGLU, "mlp_ratio": 2}, "width 32"),
    ],
)
def test_transformers_refuses_what_no_class_holds_in_one_line(switches, named, tmp_path):
    config = vit.ViTConfig(**{**TINY, **switches})
    with pytest.raises(ValueError, match=re.escape(named)) as refused:
        vit.interop.layouts.huggingface.config_to_hf(
            config, None
        )  # checked before anything is written
    assert "\n" not in str(refused.value)
    with pytest.raises(ValueError, match=re.escape(named)):
        export_transformers(vit.VisionTransformer(**{**TINY, **switches}), tmp_path / "hf")
    assert list(tmp_path.iterdir()) == []


def test_a_clip_head_with_a_bias_is_refused(tmp_path):
    model = vit.VisionTransformer(**{**TINY, "pre_norm": True})
    torch.nn.init.ones_(model.head.bias)
    with pytest.raises(ValueError, match="CLIP's projection has none"):
        export_transformers(model, tmp_path / "hf")
    assert list(tmp_path.iterdir()) == []


def test_transformers_folder_loads_with_id2label_and_round_trips(model, tmp_path, one_thread):
    folder = tmp_path / "hf"
    result = export_transformers(model, folder)
    assert result.max_relative_difference <= RTOL
    assert sorted(p.name for p in folder.iterdir()) == [
        "config.json", "model.safetensors", "preprocessor_config.json",
    ]  # fmt: skip
    umask = os.umask(0)
    os.umask(umask)
    assert {p.stat().st_mode & 0o777 for p in folder.iterdir()} == {0o666 & ~umask}
    theirs = transformers.ViTForImageClassification.from_pretrained(folder).eval()
    assert theirs.config.id2label == dict(enumerate(NAMES))
    assert theirs.config.layer_norm_eps == 1e-6  # ours, written down: logits match
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        assert relative_error(theirs(pixel_values=x).logits, logits(model, x)) <= RTOL
    processor = transformers.ViTImageProcessor.from_pretrained(folder)
    assert list(processor.image_mean) == [0.4, 0.5, 0.6]
    back = vit.load_model(folder)  # and our reader takes our writer's folder back exactly
    assert back.class_names == NAMES and torch.equal(logits(back, x), logits(model, x))


@pytest.mark.parametrize("input_size", [(32, 32), (32, 48)], ids=["square", "non-square"])
def test_transformers_folder_keeps_the_centre_crop(model, tmp_path, one_thread, input_size):
    """A model evaluated with a crop (timm's default crop_pct 0.9: resize to 35, crop 32) is
    written as DINOv2's BitImageProcessor, which transformers runs the same way, and read back
    as the same evaluation transform (it was written without the crop, and read back as a plain
    resize: another top-1 on 2 of 20 images of an audit's run). A non-square input is written
    (and read back) as a squash: transformers cannot keep the ratio to a non-square size."""
    from PIL import Image

    from vit.data.eval_transform import eval_transform

    model.preprocess = vit.Preprocess(input_size=input_size, mean=(0.4, 0.5, 0.6), crop_pct=0.9)
    export_transformers(model, tmp_path / "hf")
    back = vit.load_model(tmp_path / "hf").preprocess
    assert back.input_size == input_size and back.mean == (0.4, 0.5, 0.6)
    square = input_size[0] == input_size[1]
    assert back.crop_mode == ("center" if square else "squash")
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (61, 83, 3), np.uint8))
    expected = eval_transform(replace(model.preprocess, crop_mode=back.crop_mode))(image)
    assert torch.equal(eval_transform(back)(image), expected)
    theirs = transformers.AutoImageProcessor.from_pretrained(tmp_path / "hf", backend="pil")
    assert type(theirs).__name__ == "BitImageProcessorPil"
    assert theirs(image, return_tensors="pt")["pixel_values"][0].shape == expected.shape
    # transformers' own pixels, where the crop's offsets are whole (transformers rounds a half
    # one down, torchvision to even)
    model.preprocess = replace(model.preprocess, crop_pct=0.875)
    export_transformers(model, tmp_path / "hf2")
    theirs = transformers.AutoImageProcessor.from_pretrained(tmp_path / "hf2", backend="pil")
    # (W, H) -> 36 x 54 -> 32 x 32; non-square: squashed to 36 x 54 -> 32 x 48
    image = image.resize((90, 60) if square else (70, 60))
    pixels = theirs(image, return_tensors="pt")["pixel_values"][0]
    expected = eval_transform(replace(model.preprocess, crop_mode=back.crop_mode))(image)
    torch.testing.assert_close(pixels, expected, atol=1e-5, rtol=0)


def test_a_folder_without_a_crop_is_evaluated_as_transformers_resizes(model, tmp_path, one_thread):
    """ViTImageProcessor resizes both sides to its size: read as a squash, not as a resize of
    the shorter side and a crop (the pixels of a non-square photo were another part of it)."""
    from PIL import Image

    model.preprocess = vit.Preprocess(input_size=(32, 32), mean=(0.4, 0.5, 0.6), crop_pct=1.0)
    export_transformers(model, tmp_path / "hf")
    back = vit.load_model(tmp_path / "hf").preprocess
    assert (back.crop_pct, back.crop_mode) == (1.0, "squash")
    theirs = transformers.AutoImageProcessor.from_pretrained(tmp_path / "hf", backend="pil")
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 72, 3), np.uint8))
    pixels = theirs(image, return_tensors="pt")["pixel_values"][0]
    torch.testing.assert_close(vit.create_transform(back)(image), pixels, atol=1e-5, rtol=0)


def test_a_crop_read_back_resizes_to_the_size_written():
    """9 / (9 / 14) is 13.999... in floating point: the crop_pct read back is nudged so that
    the evaluation transform resizes to the size the folder names."""
    for crop in range(8, 400):
        for resized in range(crop, 2 * crop):
            pct = hf_common.crop_pct_of((crop,), (resized,))
            assert math.floor(crop / pct) == resized and pct <= crop / resized


def test_a_headless_model_becomes_a_vit_model(tmp_path, one_thread):
    torch.manual_seed(0)
    headless = vit.VisionTransformer(**{**TINY, "num_classes": 0})
    result = export_transformers(headless, tmp_path / "hf")
    assert result.target == "transformers ViTModel" and result.max_relative_difference <= RTOL
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["architectures"] == ["ViTModel"]


def test_torchvision_state_dict_loads_into_vit_b_32(tmp_path, one_thread):
    torch.manual_seed(0)
    ours = vit.create_model("vit_base_patch32_224", num_classes=10)
    torch.nn.init.normal_(ours.head.weight, std=0.02)
    path = tmp_path / "vit_b_32.pth"
    result = export_torchvision(ours, path)
    assert "torchvision.models.vit_b_32(image_size=224, num_classes=10)" in result.target
    theirs = torchvision.models.vit_b_32(num_classes=10)
    theirs.load_state_dict(torch.load(path, weights_only=True), strict=True)
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        assert relative_error(theirs.eval()(x), logits(ours, x)) <= RTOL


def test_torchvision_refuses_what_it_cannot_hold(tmp_path):
    avg = vit.VisionTransformer(**{**TINY, "global_pool": "avg", "class_token": False})
    with pytest.raises(
        ValueError, match=r"global_pool=.avg., no class token, a LayerNorm after pooling"
    ):
        export_torchvision(avg, tmp_path / "avg.pth")
    eps = vit.VisionTransformer(**{**TINY, "norm_eps": 1e-12})
    with pytest.raises(ValueError, match=r"norm_eps=1e-12 \(torchvision's is 1e-6\)"):
        export_torchvision(eps, tmp_path / "eps.pth")
    assert list(tmp_path.iterdir()) == []


def test_a_failed_check_writes_nothing_and_keeps_the_previous_export(
    model, tmp_path, monkeypatch, one_thread
):
    folder = tmp_path / "hf"
    export_transformers(model, folder)
    before = (folder / "model.safetensors").read_bytes()
    for module in (transformers_export, torchvision_export):
        monkeypatch.setattr(module, "relative_difference", lambda theirs, ours: 0.5)
    with pytest.raises(ValueError, match=r"max relative difference 5\.00e-01 > tolerance"):
        export_transformers(vit.VisionTransformer(**TINY), folder)
    assert (folder / "model.safetensors").read_bytes() == before
    with pytest.raises(ValueError, match="nothing was written"):
        export_torchvision(model, tmp_path / "tv.pth")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


def test_a_missing_extra_is_named(model, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import fails as if not installed
    with pytest.raises(
        MissingExtraError, match=r"'onnxruntime'.*pip install 'vit-from-scratch\[interop\]'"
    ):
        export_onnx(model, tmp_path / "m.onnx")
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(MissingExtraError, match="--hf .*'transformers'"):
        export_transformers(model, tmp_path / "hf")
    assert list(tmp_path.iterdir()) == []


def test_import_and_predict_need_no_extra(tmp_path):
    blocked = ["transformers", "onnx", "onnxruntime", "onnxscript"]
    code = (
        "import sys\n"
        f"for name in {blocked}: sys.modules[name] = None\n"
        "import vit, vit.export, vit.predict, vit.interop.weights\n"
        "m = vit.VisionTransformer(img_size=16, patch_size=8, embed_dim=16, depth=1, num_heads=2)\n"
        "print(m(__import__('torch').zeros(1, 3, 16, 16)).shape)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "torch.Size([1, 1000])"


def test_albumentations_is_imported_only_for_calibration(model, tmp_path):
    """vit.export imported albumentations (~1 s) at every start, for --calibration's images
    alone: an export without it loads none (nor matplotlib)."""
    checkpoint = vit.save_weights(model, tmp_path / "m.safetensors", class_names=NAMES)
    code = (
        "import sys\n"
        "from vit.export import main\n"
        "status = main(sys.argv[1:])\n"
        "print(status, 'albumentations' in sys.modules, 'matplotlib' in sys.modules)\n"
    )
    argv = [str(checkpoint), "--onnx", str(tmp_path / "m.onnx"), "--torchvision", "tv.pth"]
    result = subprocess.run(
        [sys.executable, "-c", code, *argv], cwd=tmp_path, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert result.stdout.splitlines()[-1] == "0 False False", result.stderr[-2000:]


def test_command_line_writes_all_three(model, tmp_path, one_thread, capsys):
    checkpoint = vit.save_weights(model, tmp_path / "m.safetensors", class_names=NAMES)
    out = tmp_path / "out"
    code = export.main(
        [str(checkpoint), "--onnx", str(out / "m.onnx"), "--hf", str(out / "hf"),
         "--torchvision", str(out / "tv.pth")]
    )  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    lines = [line for line in captured.out.splitlines() if line.startswith("--")]
    names = ["--onnx", "--hf", "--torchvision", "--torchvision"]  # the last: its note
    assert [line.split(":")[0] for line in lines] == names
    *checks, note = lines
    differences = [float(line.rsplit(" ", 1)[1]) for line in checks]
    # what a torchvision file cannot hold, and the preprocessing its users must apply
    mean = ", ".join(f"{v:g}" for v in model.preprocess.mean)
    assert "the file holds the weights alone" in note and f"mean ({mean})" in note, note
    assert all(0 <= d <= RTOL for d in differences)
    tv = torchvision.models.VisionTransformer(
        image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=128,
        num_classes=3,
    )  # fmt: skip
    tv.load_state_dict(torch.load(out / "tv.pth", weights_only=True))
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    with torch.no_grad():
        assert (
            relative_error(tv.eval()(torch.from_numpy(x)), logits(model, torch.from_numpy(x)))
            <= RTOL
        )


def test_command_line_errors_are_one_line(model, tmp_path, capsys):
    with pytest.raises(SystemExit):
        export.main([str(tmp_path / "x.safetensors")])
    assert "nothing to do" in capsys.readouterr().err
    missing = tmp_path / "missing.safetensors"
    assert export.main([str(missing), "--hf", str(tmp_path / "h")]) == 2
    assert capsys.readouterr().err == f"error: CHECKPOINT {missing}: no such file or folder\n"
    avg = vit.VisionTransformer(**{**TINY, "global_pool": "avg"})
    path = vit.save_weights(avg, tmp_path / "avg.safetensors")
    assert export.main([str(path), "--torchvision", str(tmp_path / "tv.pth")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "torchvision's VisionTransformer cannot hold" in err


def test_every_output_is_checked_before_any_is_written(tmp_path, capsys):
    """--onnx and --hf of a model transformers cannot hold: the ONNX file, which could be
    made, is not written either; a path named twice or a file where a folder goes is refused
    before the model is loaded."""
    avg = vit.VisionTransformer(**{**TINY, "global_pool": "avg"})
    path = vit.save_weights(avg, tmp_path / "avg.safetensors")
    out = tmp_path / "out"
    assert export.main([str(path), "--onnx", str(out / "m.onnx"), "--hf", str(out / "hf")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: --hf {out / 'hf'}: ")
    assert "global_pool='avg'" in err
    assert err.endswith("; nothing was written (--onnx FILE holds every model)\n")
    assert not out.exists()
    (tmp_path / "file").write_text("")
    for argv, message in (
        (["--onnx", str(out / "x"), "--torchvision", str(out / "x")], "--onnx writes there too"),
        (["--hf", str(tmp_path / "file")], "exists and is not a folder"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            export.main([str(tmp_path / "not-loaded.safetensors"), *argv])
        assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert not out.exists()


def test_what_the_writers_refuse_is_also_refused_before_anything_is_written(
    tmp_path, capsys, monkeypatch
):
    """A CLIP head with a bias (which the projection cannot hold) and an onnxruntime too old
    for the opset were refused by the writers, after the other outputs were in place."""
    clip = vit.VisionTransformer(**{**TINY, "pre_norm": True})
    torch.nn.init.ones_(clip.head.bias)
    path = vit.save_weights(clip, tmp_path / "clip.safetensors")
    out = tmp_path / "out"
    assert export.main([str(path), "--onnx", str(out / "m.onnx"), "--hf", str(out / "hf")]) == 2
    assert "CLIP's projection has none" in capsys.readouterr().err and not out.exists()
    monkeypatch.setattr(onnxruntime, "__version__", "1.22.1")
    plain = vit.save_weights(vit.VisionTransformer(**TINY), tmp_path / "plain.safetensors")
    assert export.main([str(plain), "--onnx", str(out / "m.onnx"), "--hf", str(out / "hf")]) == 2
    assert "onnxruntime>=1.23" in capsys.readouterr().err and not out.exists()


def test_what_a_user_saved_is_kept_and_the_input_never_replaced(
    model, tmp_path, capsys, one_thread
):
    """An existing output is replaced only with --overwrite (--hf's folder whole: never one
    holding files of the user's, nor the --calibration images); the weights being exported
    never are, and a file inside --hf's folder is refused (the folder is put in place after
    it)."""
    checkpoint = vit.save_weights(model, tmp_path / "m.safetensors", class_names=NAMES)
    saved = checkpoint.read_bytes()
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "notes.txt").write_text("mine")
    (tmp_path / "tv.pth").write_text("mine")
    calibration = tmp_path / "calibration"
    (calibration / "train" / "cat").mkdir(parents=True)
    mine = "holds files an export does not write (notes.txt), which replacing the folder"
    new = tmp_path / "new"
    refusals = [
        (["--hf", str(hf)], mine),
        (["--hf", str(hf), "--overwrite"], mine),
        (
            [
                "--hf",
                str(calibration),
                "--overwrite",
                "--int8",
                "--onnx",
                str(tmp_path / "q.onnx"),
                "--calibration",
                str(calibration),
            ],
            "holds files an export does not write (train)",
        ),  # fmt: skip
        (["--torchvision", str(tmp_path / "tv.pth")], "tv.pth: exists; add --overwrite"),
        (["--hf", str(tmp_path), "--overwrite"], f"would replace the input {checkpoint}"),
        (["--onnx", str(new / "m.onnx"), "--hf", str(new), "--overwrite"], "inside --hf"),
        (["--onnx", str(tmp_path / "m")], "the file name must end in .onnx"),
        (["--torchvision", str(tmp_path / "tv.bin")], "must end in .pth or .pt"),
    ]
    for argv, message in refusals:
        with pytest.raises(SystemExit) as exit_info:
            export.main([str(checkpoint), *argv])
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and err.count("\n") == 1 and message in err, err
    assert (hf / "notes.txt").read_text() == "mine" and checkpoint.read_bytes() == saved
    assert (tmp_path / "tv.pth").read_text() == "mine"
    with pytest.raises(SystemExit):  # the input, even with --overwrite
        export.main([str(checkpoint), "--torchvision", str(checkpoint), "--overwrite"])
    assert checkpoint.read_bytes() == saved
    (hf / "notes.txt").unlink()
    assert export.main([str(checkpoint), "--hf", str(hf)]) == 0  # empty: nothing to replace
    capsys.readouterr()
    with pytest.raises(SystemExit):  # an export's files only: --overwrite replaces them
        export.main([str(checkpoint), "--hf", str(hf)])
    assert "exists; add --overwrite to replace it" in capsys.readouterr().err
    assert export.main([str(checkpoint), "--hf", str(hf), "--overwrite"]) == 0
    assert (hf / "config.json").is_file()


def test_hf_dot_exports_into_the_current_folder(model, tmp_path, monkeypatch, one_thread):
    """'.' names a folder that can be replaced, but not renamed as '.'."""
    checkpoint = vit.save_weights(model, tmp_path / "m.safetensors", class_names=NAMES)
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.chdir(out)
    assert export.main([str(checkpoint), "--hf", "."]) == 0
    assert (out / "config.json").is_file() and not leftovers(tmp_path)


@pytest.mark.slow
def test_onnx_families_script_prints_a_table(capsys, one_thread, monkeypatch):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "onnx_families.py"
    monkeypatch.syspath_prepend(str(path.parent))  # its own helpers (_cli.py) beside it
    spec = importlib.util.spec_from_file_location("onnx_families", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.main(["--names", "deit_tiny_distilled_patch16_224", "--threads", "1"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")][1:]
    expected = 2 if script.REAL_DINOV2.is_dir() else 1  # + the real DINOv2 folder when present
    assert len(rows) == expected
    assert rows[0].startswith("| deit_tiny_distilled_patch16_224 | DeiT: distillation")
    assert "| logits (1000) |" in rows[0]
    for row in rows:
        assert 0 <= float(row.strip("| ").rsplit("|", 1)[1]) <= RTOL


def test_sigterm_or_ctrl_c_during_an_export_is_one_line_and_leaves_no_file(
    onnx_exports, tmp_path, monkeypatch, capsys
):
    """Ctrl-C printed torch's traceback; SIGTERM (kill) ended it at once, its temporary file
    (28.8 MB for a small model) left beside the outputs. Now one line, the file written before
    it kept, no temporary file: status 130 for Ctrl-C, 143 for SIGTERM."""
    import signal

    def killed_while_writing(model, path, tolerance=None):
        signal.raise_signal(signal.SIGTERM)

    monkeypatch.setattr(export, "export_torchvision", killed_while_writing)
    weights = str(onnx_exports / "tiny.safetensors")
    argv = [weights, "--hf", str(tmp_path / "hf"), "--torchvision", str(tmp_path / "tv.pth")]
    assert export.main(argv) == 143
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"python -m vit.export: stopped by SIGTERM; {tmp_path / 'hf'} written; nothing else was "
        f"written"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler was the command's


@pytest.mark.parametrize("target", ["torchvision", "transformers"])
def test_a_backbone_written_wrong_is_caught_under_a_head_never_trained(
    model, tmp_path, monkeypatch, target, one_thread
):
    """A new model's head starts at zero: its logits are zero whatever the backbone, and an
    export whose blocks were written wrong passed the logits check (0.0e+00). The features
    before the head are compared too."""
    torch.nn.init.zeros_(model.head.weight)
    torch.nn.init.zeros_(model.head.bias)
    if target == "torchvision":
        module, name, export_to = torchvision_export.torchvision_layout, "from_timm", "tv.pth"
        write = export_torchvision
    else:
        module, name, export_to = transformers_export.huggingface, "state_to_hf", "hf"
        write = export_transformers
    convert = getattr(module, name)

    def one_tensor_wrong(*args, **kwargs):
        state = dict(convert(*args, **kwargs))
        key = next(k for k in state if "mlp" in k or "intermediate" in k)
        # noise, not a constant: a constant added to a weight after a LayerNorm cancels out
        noise = torch.randn(state[key].shape, generator=torch.Generator().manual_seed(0))
        state[key] = state[key] + 0.1 * noise
        return state

    assert write(model, tmp_path / "right" / export_to).max_relative_difference < RTOL
    monkeypatch.setattr(module, name, one_tensor_wrong)
    with pytest.raises(ValueError, match="does not reproduce our (features|final tokens)"):
        write(model, tmp_path / export_to)
    assert not (tmp_path / export_to).exists()
