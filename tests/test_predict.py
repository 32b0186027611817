"""`python -m vit.predict`: top-k output, class names, and clear messages for bad input."""

import subprocess
import sys

import numpy as np
import pytest
import timm
import torch
from PIL import Image
from safetensors.torch import save_file

import vit
from vit.predict import class_names_for, load_image, main

NAMES = ["cat", "dog", "ship"]


@pytest.fixture
def checkpoint(tmp_path):
    """A tiny model of ours whose head strongly prefers "dog" for bright images."""
    torch.manual_seed(0)
    model = vit.VisionTransformer(
        img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=3
    )
    with torch.no_grad():
        model.head.bias.copy_(torch.tensor([0.0, 3.0, 1.0]))
    return vit.save_weights(model, tmp_path / "model.safetensors", class_names=NAMES)


@pytest.fixture
def images(tmp_path):
    rng = np.random.default_rng(0)
    rgb = tmp_path / "rgb.png"
    Image.fromarray(rng.integers(0, 255, (40, 50, 3), dtype=np.uint8)).save(rgb)
    gray = tmp_path / "gray.jpg"
    Image.fromarray(rng.integers(0, 255, (32, 32), dtype=np.uint8), "L").save(gray)
    rgba = tmp_path / "rgba.png"
    Image.fromarray(rng.integers(0, 255, (32, 32, 4), dtype=np.uint8), "RGBA").save(rgba)
    return rgb, gray, rgba


def test_prints_top_k_with_stored_class_names(checkpoint, images, capsys):
    assert main([*map(str, images), "--checkpoint", str(checkpoint), "--top-k", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert (
        out[0].endswith("rgb.png") and out[3].endswith("gray.jpg") and out[6].endswith("rgba.png")
    )
    assert "dog" in out[1] and "ship" in out[2]  # best first
    probability = float(out[1].split("%")[0]) / 100
    expected = torch.tensor([0.0, 3.0, 1.0]).softmax(0)[1].item()  # head bias only: zero weights
    assert probability == pytest.approx(expected, abs=1e-4)


def test_grayscale_and_transparent_images_become_rgb(images):
    _, gray, rgba = images
    assert load_image(gray).mode == "RGB"
    converted = load_image(rgba)
    assert converted.mode == "RGB"
    alpha = np.asarray(Image.open(rgba))[..., 3:] / 255.0
    blended = np.asarray(Image.open(rgba))[..., :3] * alpha + 255 * (1 - alpha)  # over white
    assert np.abs(np.asarray(converted).astype(float) - blended).max() <= 1.0


def test_bad_inputs_get_one_line_each_and_the_rest_is_classified(
    checkpoint, images, tmp_path, capsys
):
    not_image = tmp_path / "notes.txt"
    not_image.write_text("hello")
    code = main(
        [
            str(images[0]),
            str(tmp_path / "missing.jpg"),
            str(not_image),
            "--checkpoint",
            str(checkpoint),
        ]
    )
    captured = capsys.readouterr()
    assert code == 1
    assert "rgb.png" in captured.out
    assert f"error: {tmp_path / 'missing.jpg'}: no such file" in captured.err
    assert f"error: {not_image}: not an image that can be read" in captured.err
    assert "Traceback" not in captured.err


def test_bad_flags_are_explained(checkpoint, images, capsys):
    assert main([str(images[0]), "--checkpoint", str(checkpoint.with_name("nope.pth"))]) == 2
    err = capsys.readouterr().err
    assert "--checkpoint" in err and "nope.pth: no such file" in err
    with pytest.raises(SystemExit):
        main([str(images[0]), "--model", "vit_base_patch16_244"])
    assert "unknown --model 'vit_base_patch16_244'" in capsys.readouterr().err
    assert main([str(images[0])]) == 2
    assert "pass --model NAME" in capsys.readouterr().err


def test_imagenet_heads_get_imagenet_names_and_timm_files_need_model(tmp_path, images, capsys):
    torch.manual_seed(0)
    theirs = timm.create_model("vit_tiny_patch16_224")
    torch.nn.init.normal_(theirs.head.weight, std=0.02)
    path = tmp_path / "timm.safetensors"
    save_file(theirs.state_dict(), str(path))
    assert main([str(images[0]), "--checkpoint", str(path)]) == 2
    assert "pass --model NAME" in capsys.readouterr().err
    assert main([str(images[0]), "--checkpoint", str(path), "--model", "vit_tiny_patch16_224"]) == 0
    names = class_names_for(vit.create_model("vit_tiny_patch16_224"))
    assert names[0] == "tench, Tinca tinca" and len(names) == 1000
    printed = capsys.readouterr().out.splitlines()[1].split("%")[1].strip()
    assert printed in names


def test_runs_as_a_module(checkpoint, images):
    result = subprocess.run(
        [sys.executable, "-m", "vit.predict", str(images[0]), "--checkpoint", str(checkpoint)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 4  # the path, then 3 classes (top-5 capped at 3)
