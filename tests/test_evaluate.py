"""evaluate.py: accuracy, per-class accuracy, confusion matrix PNG and JSON report."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import vit
from vit.data.datasets import load_split
from vit.data.transforms import EvalTransform
from vit.inference.evaluation import evaluate
from vit.models.class_names import class_names_for


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny 3-class model saved with its class names, as a run folder's model.safetensors."""
    torch.manual_seed(0)
    model = vit.create_model("vit_cifar_patch4_32", num_classes=3, depth=1, embed_dim=32,
                             num_heads=2)  # fmt: skip
    with torch.no_grad():  # a head that answers: the first colour channel mean decides
        model.head.weight.normal_()
        model.head.bias.normal_()
    run = tmp_path_factory.mktemp("run")
    vit.save_weights(model, run / "model.safetensors", ["blue", "green", "red"], "tiny")
    return run


def test_report_keys_and_values(checkpoint, image_folder, tmp_path, evaluate_script):
    report_path = tmp_path / "report.json"
    args = ["--checkpoint", str(checkpoint), "--data", str(image_folder), "--json",
            str(report_path), "--workers", "0", "--device", "cpu", "--batch-size", "5"]  # fmt: skip
    assert evaluate_script.main(args) == 0
    report = json.loads(report_path.read_text())
    assert {"top1", "top5", "per_class", "num_images"} <= set(report)
    assert report["num_images"] == 18
    assert 0 <= report["top1"] <= report["top5"] == 1.0  # 3 classes: top-5 covers all
    assert list(report["per_class"]) == ["blue", "green", "red"]
    confusion = np.array(report["confusion_matrix"])
    assert confusion.shape == (3, 3) and confusion.sum() == 18
    assert report["top1"] == pytest.approx(np.trace(confusion) / 18)
    for i, name in enumerate(["blue", "green", "red"]):
        assert report["per_class"][name] == pytest.approx(confusion[i, i] / confusion[i].sum())
    png = tmp_path / "confusion_matrix.png"  # beside the report --json named
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert report["confusion_matrix_png"] == str(png)

    # the same numbers as a direct forward pass over the test images
    model = vit.load_model(checkpoint / "model.safetensors").eval()
    ds = load_split(str(image_folder), "test")
    images = torch.stack([EvalTransform(model.preprocess)(ds.image(i)) for i in range(len(ds))])
    with torch.no_grad():
        predicted = model(images).argmax(1).numpy()
    assert report["top1"] == pytest.approx((predicted == ds.labels).mean())


def test_top5_counts_a_hit_anywhere_in_the_five_best():
    class Fixed(torch.nn.Module):  # the true class always ranks 5th of 8
        def forward(self, x):
            logits = torch.arange(8.0).repeat(x.shape[0], 1)  # class 7 scores highest
            return logits

    loader = [(torch.zeros(4, 3, 2, 2), torch.tensor([3, 3, 7, 0]))]
    result = evaluate(Fixed(), loader, 8, torch.device("cpu"))
    assert result["top1"] == 0.25  # only the sample of class 7
    assert result["top5"] == 0.75  # classes 7..3 are the five best; class 0 is not
    assert result["per_class"][7] == 1.0 and result["per_class"][3] == 0.0
    assert np.isnan(result["per_class"][1])  # no images of class 1
    assert result["confusion"][3, 7] == 2


def test_an_existing_json_is_replaced_only_with_overwrite(
    checkpoint, image_folder, tmp_path, evaluate_script, capsys, monkeypatch
):
    report = tmp_path / "mine.json"
    report.write_text('{"mine": 1}')
    args = ["--checkpoint", str(checkpoint), "--data", str(image_folder), "--json", str(report),
            "--workers", "0", "--device", "cpu"]  # fmt: skip
    with pytest.raises(SystemExit):
        evaluate_script.main(args)
    err = capsys.readouterr().err
    assert err == (
        f"evaluate.py: error: --json {report}: exists; add --overwrite to replace it, or "
        f"choose another file\n"
    )
    assert report.read_text() == '{"mine": 1}'
    assert evaluate_script.main([*args, "--overwrite"]) == 0
    assert "top1" in json.loads(report.read_text())
    assert (tmp_path / "mine_confusion_matrix.png").is_file()  # beside its report
    monkeypatch.chdir(image_folder)  # --data . names the folder it is
    where = evaluate_script.default_output_dir(str(checkpoint), ".")
    assert where == checkpoint / f"eval-{image_folder.name}"


def test_class_folders_are_matched_by_name(checkpoint, make_images, tmp_path, evaluate_script):
    # a folder holding only two of the model's classes: labels map to the model's indices
    data = make_images(tmp_path / "two", classes=("green", "red"), train_per_class=1)
    report = tmp_path / "r.json"
    args = ["--checkpoint", str(checkpoint / "model.safetensors"), "--data", str(data),
            "--json", str(report), "--workers", "0", "--device", "cpu"]  # fmt: skip
    assert evaluate_script.main(args) == 0
    assert list(json.loads(report.read_text())["per_class"]) == ["green", "red"]
    wrong = make_images(tmp_path / "wrong", classes=("cat", "dog"), train_per_class=1)
    args[3] = str(wrong)
    assert evaluate_script.main([*args, "--overwrite"]) == 2  # refused for its classes


def test_model_name_needs_pretrained(evaluate_script, image_folder, capsys):
    args = ["--checkpoint", "vit_tiny_patch16_224", "--data", str(image_folder)]
    assert evaluate_script.main(args) == 2
    assert "pass --pretrained" in capsys.readouterr().err


def test_model_name_with_weights_file(checkpoint, image_folder, tmp_path, evaluate_script, capsys):
    """A model name plus --pretrained PATH loads that file into the named architecture."""
    weights = str(checkpoint / "model.safetensors")
    args = ["--checkpoint", "vit_cifar_patch4_32", "--pretrained", weights,
            "--data", str(image_folder), "--workers", "0", "--device", "cpu",
            "--output-dir", str(tmp_path)]  # fmt: skip
    # vit_cifar_patch4_32 has 9 blocks of 192 channels: the tiny checkpoint does not fit it
    assert evaluate_script.main(args) == 2
    assert "another architecture" in capsys.readouterr().err


def test_imagenet_style_folder_with_a_model_name(make_images, tmp_path, evaluate_script):
    """A timm name + weights on an ImageNet-style folder holding two WordNet-id classes:
    labels map to ImageNet indices 0 and 1, reported as predict names them (tench, goldfish),
    40x40 images resized to 224."""
    torch.manual_seed(0)
    model = vit.create_model("vit_tiny_patch16_224")
    with torch.no_grad():
        model.head.bias[1] = 100.0  # the zero-initialised head now says "goldfish" for all
    weights = tmp_path / "vit_tiny.safetensors"
    vit.save_weights(model, weights)
    data = make_images(tmp_path / "imagenet", ("n01440764", "n01443537"), 1, 3, size=40)
    report = tmp_path / "r.json"
    args = ["--checkpoint", "vit_tiny_patch16_224", "--pretrained", str(weights),
            "--data", str(data), "--json", str(report), "--workers", "0", "--device", "cpu",
            "--output-dir", str(tmp_path / "out")]  # fmt: skip
    assert evaluate_script.main(args) == 0
    result = json.loads(report.read_text())
    names = class_names_for(vit.create_model("vit_tiny_patch16_224"))  # what predict prints
    assert result["per_class"] == {names[0]: 0.0, names[1]: 1.0}
    assert names[:2] == ["tench, Tinca tinca", "goldfish, Carassius auratus"]
    assert result["top1"] == 0.5 and result["num_images"] == 6
    assert (tmp_path / "r_confusion_matrix.png").is_file()  # beside its report


def test_data_is_checked_before_the_model_is_loaded(
    checkpoint, make_images, tmp_path, evaluate_script, capsys, monkeypatch
):
    """A missing folder, one without the split, or no such data set: one line naming --data,
    and the model is not even loaded."""

    def never(*args, **kwargs):
        raise AssertionError("the model was loaded before --data was checked")

    monkeypatch.setattr(vit.cli.model_argument, "resolve_model", never)
    no_test = make_images(tmp_path / "no-test", test_name="elsewhere", train_per_class=1)
    for data, split, message in (
        (tmp_path / "nowhere", "test", "neither one of cifar10, cifar100 nor an existing folder"),
        (no_test, "test", "has no test or val/ subfolder"),
        (tmp_path / "nowhere", "train", "with a train/ subfolder"),
    ):
        argv = ["--checkpoint", str(checkpoint), "--data", str(data), "--split", split,
                "--output-dir", str(tmp_path / "out")]  # fmt: skip
        assert evaluate_script.main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"evaluate.py: error: --data {data}: ") and message in err
        assert err.count("\n") == 1
    assert not (tmp_path / "out").exists()
