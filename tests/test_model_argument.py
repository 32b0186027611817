"""One model argument for every command: each kind of argument, sent through evaluate.py,
`python -m vit.predict` and `python -m vit.export`, is accepted by all three (with the same class
names) or refused by all three with the same one-line message (export names its positional
CHECKPOINT where the others say --checkpoint); the Python API (`resolve_model`) agrees."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

import vit
from vit import export
from vit.cli.model_argument import ModelArgumentError, resolve_model
from vit.factory import timm_weights
from vit.interop.export_check import ExportCheck
from vit.models.class_names import class_names_for
from vit.predict import main as predict_main

transformers = pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")  # export checks --onnx's packages before anything else

real_export = export.export_onnx  # before the `exported` fixture replaces it
COLOURS = ["blue", "green", "red"]  # the class folders of conftest's image_folder
TINY_HF = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
CLASSIFIERS = {  # transformers classes with a 3-colour head, and their configs
    "ViTForImageClassification": "ViTConfig",
    "DeiTForImageClassificationWithTeacher": "DeiTConfig",
}
HEADLESS = {  # families read as feature extractors (num_classes=0)
    "Dinov2Model": ("Dinov2Config", dict(image_size=28, patch_size=14)),
    "Dinov2WithRegistersModel": (
        "Dinov2WithRegistersConfig",
        dict(image_size=28, patch_size=14, num_register_tokens=2),
    ),
    "CLIPVisionModel": ("CLIPVisionConfig", dict(image_size=32, patch_size=16)),
    "SiglipVisionModel": ("SiglipVisionConfig", dict(image_size=32, patch_size=16)),
    "ViTMAEModel": ("ViTMAEConfig", dict(image_size=32, patch_size=16, mask_ratio=0.0)),
}


def save_transformers(folder, model_class: str, config_class: str, **config):
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(**TINY_HF, **config)
    getattr(transformers, model_class)(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Every kind of model argument, tiny: a timm-layout file of vit_tiny_patch16_224 (the one
    named architecture small enough), our files and a run folder with 3 colour classes,
    transformers folders, an ONNX file, and an ImageNet-style folder of two WordNet ids."""
    root = tmp_path_factory.mktemp("arguments")
    torch.manual_seed(0)
    torch.save(vit.create_model("vit_tiny_patch16_224").state_dict(), root / "tiny.pth")
    ours = vit.VisionTransformer(
        img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=3
    )
    torch.nn.init.normal_(ours.head.weight)
    vit.save_weights(ours, root / "ours.safetensors", class_names=COLOURS)
    (root / "run").mkdir()
    vit.save_weights(ours, root / "run" / "model.safetensors", class_names=COLOURS)
    vit.save_weights(ours, root / "run" / "best.safetensors", class_names=COLOURS)
    labels = dict(num_labels=3, id2label=dict(enumerate(COLOURS)), image_size=32, patch_size=16)
    for model_class, config_class in CLASSIFIERS.items():
        save_transformers(root / model_class, model_class, config_class, **labels)
    real_export(resolve_model(root / "ours.safetensors"), root / "model.onnx")
    rng = np.random.default_rng(0)
    for wordnet_id in ("n01440764", "n01443537"):  # tench, goldfish
        folder = root / "imagenet" / "test" / wordnet_id
        folder.mkdir(parents=True)
        pixels = rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / "0.png")
    return root


# (what is passed, the arguments given --checkpoint-first, the data evaluate.py reads, the
# phrase of the one-line refusal or None for accepted); paths are relative to `files`.
TINY = "vit_tiny_patch16_224"
ARGUMENTS = [
    ("name + --pretrained PATH", ["--checkpoint", TINY, "--pretrained", "tiny.pth"], None),
    (
        "name with a tag + --pretrained PATH",
        ["--checkpoint", f"{TINY}.augreg_in21k_ft_in1k", "--pretrained", "tiny.pth"],
        None,
    ),
    ("our .safetensors", ["--checkpoint", "ours.safetensors"], None),
    ("a run folder", ["--checkpoint", "run"], None),
    ("best.safetensors in a run folder", ["--checkpoint", "run/best.safetensors"], None),
    *[(f"transformers {name}", ["--checkpoint", name], None) for name in CLASSIFIERS],
    ("a foreign file + --model", ["--checkpoint", "tiny.pth", "--model", TINY], None),
    (
        "a misspelt name",
        ["--checkpoint", "vit_tiny_patch16_22"],
        "--checkpoint vit_tiny_patch16_22: no such model name, file or folder; did you mean "
        "vit_tiny_patch16_224, ",
    ),
    (
        "a missing path",
        ["--checkpoint", "missing.safetensors"],
        "--checkpoint {root}/missing.safetensors: no such file or folder",
    ),
    (
        "a name without --pretrained",
        ["--checkpoint", TINY],
        f"--checkpoint {TINY} is a model name: pass --pretrained (timm's weights) or "
        f"--pretrained PATH (a weights file)",
    ),
    (
        "a foreign file without --model",
        ["--checkpoint", "tiny.pth"],
        "--checkpoint {root}/tiny.pth does not say which architecture it holds: pass --model NAME",
    ),
    (
        "a misspelt --model",
        ["--checkpoint", "tiny.pth", "--model", "vit_tiny_patch16_22"],
        "--model vit_tiny_patch16_22: no such model name; did you mean vit_tiny_patch16_224, ",
    ),
    (
        "timm's weights, offline and not cached",
        ["--checkpoint", TINY, "--pretrained"],
        f"--checkpoint {TINY}: cannot download the pretrained weights of "
        f"{TINY}.augreg_in21k_ft_in1k: HF_HUB_OFFLINE is set, and they are not in the Hugging "
        f"Face cache; pass --pretrained PATH to a local weights file instead",
    ),
]


def with_paths(argument: list[str], root) -> list[str]:
    """Relative paths (those that exist under `root`, and missing.safetensors) made absolute."""
    out = []
    for item in argument:
        is_path = (root / item.split("/")[0]).exists() or item == "missing.safetensors"
        out.append(str(root / item) if is_path and not item.startswith("-") else item)
    return out


def as_positional(argument: list[str]) -> list[str]:
    """--checkpoint X ... -> X ... (export's positional CHECKPOINT)."""
    assert argument[0] == "--checkpoint"
    return argument[1:]


def python_keywords(argument: list[str]) -> dict:
    """The same argument for `resolve_model`: --pretrained alone means True."""
    keywords, flags = {}, {"--checkpoint": "source", "--model": "model", "--pretrained": None}
    for i, item in enumerate(argument):
        if item in flags:
            value = argument[i + 1] if i + 1 < len(argument) else None
            if item == "--pretrained":
                keywords["pretrained"] = value if value and not value.startswith("-") else True
            else:
                keywords[flags[item]] = value
    return keywords


def refusal(err: str, prefix: str) -> str:
    """The one error line of a refused command, without the command's prefix, with export's
    positional spelt as the others' flag."""
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert err.startswith(prefix), err
    return err[len(prefix) : -1].replace("CHECKPOINT ", "--checkpoint ", 1)


@pytest.fixture
def offline(monkeypatch):
    """No network and nothing in the Hugging Face cache, wherever the tests run."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(timm_weights, "_cached_timm_weights", lambda full_name: None)


@pytest.fixture
def exported(monkeypatch):
    """Export's ONNX writer replaced by one that records the model (the real one takes
    seconds a model and is tested in test_export.py)."""
    models = []

    def record(model, path, tolerance, **options):
        models.append(model)
        return ExportCheck(path, "recorded", 0.0)

    monkeypatch.setattr(export, "export_onnx", record)
    return models


@pytest.mark.parametrize(
    "argument, expected", [row[1:] for row in ARGUMENTS], ids=[row[0] for row in ARGUMENTS]
)
def test_every_command_reads_a_model_argument_alike(
    argument, expected, files, image_folder, evaluate_script, offline, exported, tmp_path,
    capsys, one_thread,
):  # fmt: skip
    argument = with_paths(argument, files)
    try:  # the Python API, spelt with keywords
        model = resolve_model(**python_keywords(argument))
    except ModelArgumentError:
        model = None
    assert (model is None) == (expected is not None)
    names = class_names_for(model) if model is not None else None
    data = files / "imagenet" if model is not None and model.num_classes == 1000 else image_folder
    image = next((image_folder / "test" / "red").iterdir())

    evaluated = evaluate_script.main(
        [
            *argument,
            "--data",
            str(data),
            "--workers",
            "0",
            "--device",
            "cpu",
            "--output-dir",
            str(tmp_path / "eval"),
        ]  # fmt: skip
    )
    evaluate_err = capsys.readouterr().err
    predicted = predict_main(
        [str(image), *argument, "--top-k", "1", "--output", str(tmp_path / "p.json")]
    )
    predict_err = capsys.readouterr().err
    exported_code = export.main([*as_positional(argument), "--onnx", str(tmp_path / "m.onnx")])
    export_err = capsys.readouterr().err

    if expected is not None:
        message = expected.format(root=files)
        lines = {
            refusal(evaluate_err, "evaluate.py: error: "),
            refusal(predict_err, "error: "),
            refusal(export_err, "error: "),
        }
        assert len(lines) == 1, lines  # the same line from every command
        assert lines.pop().startswith(message)
        assert (evaluated, predicted, exported_code) == (2, 2, 2)
        assert not (tmp_path / "eval").exists() and not (tmp_path / "p.json").exists()
        return
    assert (evaluated, predicted, exported_code) == (0, 0, 0), (evaluate_err, predict_err)
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    assert set(report["per_class"]) <= set(names)  # evaluate's names are predict's
    assert json.loads((tmp_path / "p.json").read_text())[0]["label"] in names
    assert class_names_for(exported[0]) == names
    if model.num_classes == 1000:  # WordNet-id folders, reported under predict's labels
        assert list(report["per_class"]) == ["tench, Tinca tinca", "goldfish, Carassius auratus"]


def test_an_onnx_file_is_run_by_evaluate_and_predict_and_refused_by_export(
    files, image_folder, evaluate_script, exported, tmp_path, capsys, one_thread
):
    """evaluate.py and predict run an exported ONNX file (with the class names it stores);
    export, which needs the PyTorch weights, refuses it in one line, as the Python API does."""
    onnx_file = files / "model.onnx"
    image = next((image_folder / "test" / "red").iterdir())
    argv = ["--checkpoint", str(onnx_file), "--data", str(image_folder), "--workers", "0"]
    assert evaluate_script.main([*argv, "--output-dir", str(tmp_path / "eval")]) == 0
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    assert list(report["per_class"]) == COLOURS
    output = tmp_path / "p.json"
    argv = [str(image), "--checkpoint", str(onnx_file), "--top-k", "1", "--output", str(output)]
    assert predict_main(argv) == 0
    assert json.loads(output.read_text())[0]["label"] in COLOURS
    capsys.readouterr()
    assert export.main([str(onnx_file), "--onnx", str(tmp_path / "m.onnx")]) == 2
    line = (
        f"--checkpoint {onnx_file}: an ONNX file, which only python -m vit.evaluate and python "
        f"-m vit.predict run; pass the weights it was exported from"
    )
    assert refusal(capsys.readouterr().err, "error: ").startswith(line)
    assert not exported and not (tmp_path / "m.onnx").exists()
    with pytest.raises(ModelArgumentError, match="an ONNX file, which only python -m vit.evaluate"):
        resolve_model(onnx_file)


@pytest.mark.parametrize("family", sorted(HEADLESS))
def test_feature_extractor_folders_of_every_family_are_read_by_every_command(
    family, image_folder, evaluate_script, exported, tmp_path, capsys, one_thread
):
    """A transformers folder of each headless family: predict embeds with it, export takes
    it, and evaluate reads it too, then says in one line that it has no head to evaluate."""
    config_class, config = HEADLESS[family]
    folder = save_transformers(tmp_path / family, family, config_class, **config)
    assert resolve_model(folder).num_classes == 0
    image = next((image_folder / "test" / "red").iterdir())
    features = tmp_path / "f.npz"
    assert predict_main([str(image), "--checkpoint", str(folder), "--features", str(features)]) == 0
    assert np.load(features)["features"].shape[0] == 1
    assert export.main([str(folder), "--onnx", str(tmp_path / "m.onnx")]) == 0
    assert exported[0].num_classes == 0
    capsys.readouterr()
    argv = ["--checkpoint", str(folder), "--data", str(image_folder), "--workers", "0"]
    assert evaluate_script.main(argv) == 2
    err = capsys.readouterr().err
    assert err == (
        f"evaluate.py: error: --checkpoint {folder}: the model has no classifier head "
        f"(num_classes=0, a feature extractor): nothing to evaluate; score its features with "
        f"--knn and/or --linear-probe, or embed images with python -m vit.predict --features "
        f"FILE\n"
    )


def test_model_alone_means_timms_weights_in_every_command(
    files, image_folder, evaluate_script, offline, tmp_path, capsys
):
    """--model NAME alone (predict's long-standing shortcut) is timm's weights everywhere:
    offline, the same one line from evaluate, predict and the Python API."""
    image = next((image_folder / "test" / "red").iterdir())
    argv = ["--model", TINY, "--output-dir", str(tmp_path / "eval")]
    assert evaluate_script.main([*argv, "--data", str(files / "imagenet")]) == 2
    evaluate_err = capsys.readouterr().err
    assert predict_main([str(image), "--model", TINY]) == 2
    predict_err = capsys.readouterr().err
    line = refusal(predict_err, "error: ")
    assert line == refusal(evaluate_err, "evaluate.py: error: ")
    assert line.startswith(f"--model {TINY}: cannot download the pretrained weights of {TINY}.")
    with pytest.raises(ModelArgumentError, match=r"pass pretrained=PATH to a local weights file"):
        resolve_model(model=TINY)


def test_hub_ids_capitals_and_a_file_that_is_no_archive_get_their_own_line(tmp_path):
    with pytest.raises(ModelArgumentError) as refused:
        resolve_model("hf-hub:timm/vit_tiny_patch16_224.augreg_in21k", pretrained=True)
    assert "a Hugging Face Hub id" in str(refused.value)
    assert "name the model as timm does, vit_tiny_patch16_224.augreg_in21k" in str(refused.value)
    with pytest.raises(ModelArgumentError, match="did you mean vit_tiny_patch16_224"):
        resolve_model("VIT_TINY_PATCH16_224", pretrained=True)
    fake = tmp_path / "fake.npz"
    fake.write_text("not an archive")
    with pytest.raises(ModelArgumentError) as refused:
        resolve_model(fake, model="vit_tiny_patch16_224")
    assert str(refused.value).endswith("not an .npz archive (a zip of arrays)")


def test_python_api_spells_the_keywords_and_allows_random_weights_when_asked():
    with pytest.raises(ModelArgumentError) as refused:
        resolve_model("vit_cifar_patch4_32")
    assert str(refused.value) == (
        "source='vit_cifar_patch4_32' is a model name: pass pretrained=True (timm's weights) or "
        "pretrained=PATH (a weights file); random weights classify nothing"
    )
    model = resolve_model("vit_cifar_patch4_32", random_init=True)
    assert not model.training and model.num_classes == 10
    assert class_names_for(model) == [f"class {i}" for i in range(10)]


def test_evaluate_refuses_a_model_that_pools_nothing_in_one_line(
    image_folder, evaluate_script, tmp_path, capsys, one_thread
):
    """global_pool='': its head classifies every token, (B, N, K), which reached the loss as a
    traceback; its pooled features are every token, refused for --knn before the data is read."""
    kwargs = dict(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, global_pool="")
    cases = (
        (3, [], "its head classifying every token"),
        (0, ["--knn"], "--embedding pooled: the model does not pool"),
    )
    for classes, flags, said in cases:
        model = vit.VisionTransformer(num_classes=classes, **kwargs)
        path = vit.save_weights(model, tmp_path / f"m{classes}.safetensors")
        argv = ["--checkpoint", str(path), "--data", str(image_folder), "--workers", "0"]
        assert evaluate_script.main([*argv, "--output-dir", str(tmp_path / "eval"), *flags]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and said in err and "global_pool=''" in err, err
    assert not (tmp_path / "eval").exists()
