"""--model-dtype bfloat16 (vit.inference.precision): the weights cast, float32 images taken as they
are, logits and features given back in float32 and close to float32's; the same reports and files as
float32 from evaluate.py and `python -m vit.predict`; a warning where bfloat16 is slow."""

import csv
import json

import numpy as np
import pytest
import torch
from conftest import CLASSES

import vit
import vit.inference.precision
from vit.inference.embed import read_features
from vit.inference.precision import cast_for_inference
from vit.predict import main as predict_main


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    """A tiny classifier (random weights, a head big enough to order the classes)."""
    torch.manual_seed(0)
    model = vit.VisionTransformer(
        img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=2, num_classes=3
    )
    torch.nn.init.normal_(model.head.weight)
    path = tmp_path_factory.mktemp("bf16") / "tiny.safetensors"
    vit.save_weights(model, path, class_names=list(CLASSES))
    return path


def test_bfloat16_weights_take_float32_images_and_stay_near_float32(weights, one_thread):
    reference, model = vit.load_model(str(weights)), vit.load_model(str(weights))
    assert cast_for_inference(reference, "float32", torch.device("cpu")) is None
    cast_for_inference(model, "bfloat16", torch.device("cpu"))
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in reference.parameters()} == {torch.float32}
    images = torch.randn(4, 3, 32, 32)  # float32, as every loader gives them
    with torch.inference_mode():
        expected, got = reference(images), model(images)
    assert got.dtype == torch.bfloat16
    error = ((got.float() - expected).abs().max() / expected.abs().max()).item()
    assert 0 < error < 0.05  # bfloat16 keeps 8 bits of mantissa: about 2-3 significant digits


def test_a_slow_bfloat16_device_gets_a_warning(weights, monkeypatch):
    model = vit.load_model(str(weights))
    monkeypatch.setattr(vit.inference.precision, "fast_bfloat16", lambda device: False)
    warning = cast_for_inference(model, "bfloat16", torch.device("cpu"))
    assert warning.startswith("--model-dtype bfloat16: this CPU has neither AVX512-BF16 nor AMX")
    assert "slower than float32" in warning
    monkeypatch.setattr(vit.inference.precision, "fast_bfloat16", lambda device: True)
    assert cast_for_inference(vit.load_model(str(weights)), "bfloat16", torch.device("cpu")) is None


def test_evaluate_in_bfloat16_reports_as_float32(
    weights, image_folder, evaluate_script, tmp_path, one_thread
):
    reports = {}
    for dtype in ("float32", "bfloat16"):
        out = tmp_path / dtype
        argv = ["--checkpoint", str(weights), "--data", str(image_folder), "--workers", "0"]
        assert evaluate_script.main([*argv, "--output-dir", str(out), "--model-dtype", dtype]) == 0
        reports[dtype] = json.loads((out / "report.json").read_text())
    exact, fast = reports["float32"], reports["bfloat16"]
    assert (exact["model_dtype"], fast["model_dtype"]) == ("float32", "bfloat16")
    assert fast.keys() == exact.keys()
    assert fast["num_images"] == exact["num_images"] == 18
    assert abs(fast["top1"] - exact["top1"]) <= 1 / 18  # at most one image changes its class
    assert fast["loss"] == pytest.approx(exact["loss"], rel=0.05)


def test_predict_in_bfloat16_writes_float32_features_and_the_same_csv(
    weights, image_folder, tmp_path, one_thread
):
    images = str(image_folder / "test")
    rows, features = {}, {}
    for dtype in ("float32", "bfloat16"):
        out = tmp_path / dtype
        argv = [images, "--checkpoint", str(weights), "--model-dtype", dtype, "--threads", "1"]
        assert predict_main([*argv, "--output", f"{out}.csv", "--features", f"{out}.npz"]) == 0
        with open(f"{out}.csv", newline="") as f:
            rows[dtype] = list(csv.DictReader(f))
        paths, features[dtype] = read_features(f"{out}.npz")
        assert features[dtype].dtype == np.float32 and len(paths) == 18
    exact, fast = features["float32"], features["bfloat16"]
    cosine = (exact * fast).sum(1) / np.linalg.norm(exact, axis=1) / np.linalg.norm(fast, axis=1)
    assert cosine.min() > 0.99 and not np.array_equal(exact, fast)
    assert [r["path"] for r in rows["bfloat16"]] == [r["path"] for r in rows["float32"]]
    agree = [a["label"] == b["label"] for a, b in zip(*rows.values(), strict=True)]
    assert sum(agree) >= len(agree) - 1


@pytest.mark.parametrize(
    ("amx", "avx512_bf16", "speedup", "recipe"),
    [
        (True, True, 7.0, "bfloat16"),
        (False, True, 4.4, "bfloat16-avx512-fast"),  # measured on AMD Zen 5 hosts
        (False, True, 2.3, "bfloat16-avx512"),  # on Zen 4 hosts, the same flags
        (False, False, None, "float32"),
    ],
)
def test_cpu_recipe_follows_the_flags_and_the_measured_bfloat16_speed(
    monkeypatch, amx, avx512_bf16, speedup, recipe
):
    from vit.inference import precision

    monkeypatch.setattr(precision, "cpu_has_amx", lambda: amx)
    monkeypatch.setattr(precision, "cpu_has_avx512_bf16", lambda: avx512_bf16)
    monkeypatch.setattr(precision, "cpu_bf16_matmul_speedup", lambda: speedup)  # when measured
    assert precision.cpu_training_recipe() == recipe
    if speedup is not None and not amx:
        assert precision.cpu_training_recipe(bf16_speedup=speedup) == recipe


def test_bfloat16_speedup_is_measured_on_one_thread_and_leaves_the_threads_as_they_were():
    from vit.inference.precision import cpu_bf16_matmul_speedup

    threads = torch.get_num_threads()
    speedup = cpu_bf16_matmul_speedup(repeats=1)
    assert 0 < speedup < 100 and torch.get_num_threads() == threads
