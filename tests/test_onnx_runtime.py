"""An exported ONNX file run by evaluate.py and `python -m vit.predict` (vit.interop.onnx_runtime):
the same report, classes, probabilities and files as the PyTorch weights it was exported from; what
needs the PyTorch model, and a file without our metadata, refused in one line."""

import csv
import json
import sys

import numpy as np
import pytest
import torch

from vit.cli.model_argument import ModelArgumentError, resolve_model
from vit.interop.onnx_runtime import OnnxModel
from vit.predict import main as predict_main

pytest.importorskip("onnxruntime", reason="running ONNX files needs onnxruntime ([interop])")
pytest.importorskip("onnxscript", reason="exporting the test's ONNX file needs onnxscript")

COLOURS = ["blue", "green", "red"]  # conftest's image_folder classes


@pytest.fixture
def exported(onnx_exports):
    """conftest's tiny classifier and headless model, as .safetensors and ONNX."""
    return onnx_exports


def run_evaluate(evaluate_script, checkpoint, data, out, *extra) -> int:
    argv = ["--checkpoint", str(checkpoint), "--data", str(data), "--workers", "0"]
    return evaluate_script.main([*argv, "--output-dir", str(out), *extra])


def test_onnx_model_reads_our_metadata(exported):
    model = resolve_model(exported / "tiny.onnx", onnx=True)
    assert isinstance(model, OnnxModel)
    assert (model.num_classes, model.class_names, model.precision) == (3, COLOURS, "float32")
    assert model.preprocess == resolve_model(exported / "tiny.safetensors").preprocess
    with pytest.raises(ModelArgumentError, match="an ONNX file, which only python -m vit.evaluate"):
        resolve_model(exported / "tiny.onnx")  # the Python API builds PyTorch models


def test_evaluate_reports_the_same_on_the_onnx_file(
    exported, image_folder, evaluate_script, tmp_path, one_thread
):
    reports = {}
    for name in ("tiny.safetensors", "tiny.onnx"):
        out = tmp_path / name
        assert run_evaluate(evaluate_script, exported / name, image_folder, out) == 0
        reports[name] = json.loads((out / "report.json").read_text())
        assert (out / "confusion_matrix.png").is_file()
    torch_report, onnx_report = reports.values()
    for key in ("top1", "top5", "per_class", "confusion_matrix", "num_images"):
        assert onnx_report[key] == torch_report[key], key
    assert onnx_report["loss"] == pytest.approx(torch_report["loss"], rel=1e-5)


def test_predict_gives_the_same_classes_probabilities_and_csv(
    exported, image_folder, tmp_path, one_thread
):
    images = str(image_folder / "test")
    rows = {}
    for name in ("tiny.safetensors", "tiny.onnx"):
        out = tmp_path / f"{name}.csv"
        argv = [images, "--checkpoint", str(exported / name), "--top-k", "3", "--tta", "flip-shift"]
        assert predict_main([*argv, "--threads", "1", "--output", str(out)]) == 0
        with open(out, newline="") as f:
            rows[name] = list(csv.DictReader(f))
    torch_rows, onnx_rows = rows.values()
    assert len(onnx_rows) == len(torch_rows) == 18
    for ours, theirs in zip(onnx_rows, torch_rows, strict=True):
        assert ours.keys() == theirs.keys()
        for key in ours:
            if key.startswith("probability"):
                assert float(ours[key]) == pytest.approx(float(theirs[key]), abs=1e-5)
            else:
                assert ours[key] == theirs[key], key


@pytest.mark.parametrize(
    "flag, line",
    [
        (
            ["--explain", "maps"],
            "error: --explain: needs the PyTorch model (attention maps are read inside it); an "
            "ONNX file gives only its output: pass the weights it was exported from\n",
        ),
        (
            ["--features", "f.npz"],
            "error: --features: needs the PyTorch model (an ONNX classifier gives its logits, "
            "not its features); an ONNX file gives only its output",
        ),
        (
            ["--model-dtype", "bfloat16"],
            "error: --model-dtype: casts the PyTorch model's weights (--runtime openvino "
            "computes an ONNX file in bfloat16); an ONNX file gives only its output: pass the "
            "weights it was exported from\n",
        ),
    ],
)
def test_predict_refuses_what_needs_the_pytorch_model(
    flag, line, exported, image_folder, tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    image = next((image_folder / "test" / "red").iterdir())
    argv = [str(image), "--checkpoint", str(exported / "tiny.onnx"), *flag]
    assert predict_main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(line) and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []


def test_evaluate_refuses_amp_on_an_onnx_file(
    exported, image_folder, evaluate_script, tmp_path, capsys
):
    out = tmp_path / "eval"
    assert run_evaluate(evaluate_script, exported / "tiny.onnx", image_folder, out, "--amp") == 2
    assert capsys.readouterr().err == (
        "evaluate.py: error: --amp: is PyTorch's bfloat16 autocast; an ONNX file gives only its "
        "output: pass the weights it was exported from\n"
    )
    assert not out.exists()


def test_an_onnx_file_without_our_metadata_is_refused(
    exported, image_folder, evaluate_script, tmp_path, capsys
):
    onnx = pytest.importorskip("onnx")
    proto = onnx.load(exported / "tiny.onnx")
    del proto.metadata_props[:]
    foreign = tmp_path / "foreign.onnx"
    onnx.save(proto, foreign)
    image = next((image_folder / "test" / "red").iterdir())
    line = (
        f"--checkpoint {foreign}: an ONNX file without our metadata (vit.preprocess: how its "
        f"input is prepared); export it with python -m vit.export SRC --onnx FILE\n"
    )
    out = tmp_path / "p.csv"
    assert predict_main([str(image), "--checkpoint", str(foreign), "--output", str(out)]) == 2
    assert capsys.readouterr().err == f"error: {line}"
    assert run_evaluate(evaluate_script, foreign, image_folder, tmp_path / "eval") == 2
    assert capsys.readouterr().err == f"evaluate.py: error: {line}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["foreign.onnx"]


def test_threads_reach_onnxruntime(exported, one_thread):
    torch.set_num_threads(1)
    model = OnnxModel(exported / "tiny.onnx")
    assert model.threads == 1
    assert OnnxModel(exported / "tiny.onnx", threads=2).threads == 2
    images = torch.randn(2, 3, 32, 32)
    expected = resolve_model(exported / "tiny.safetensors")(images)
    np.testing.assert_allclose(model(images).numpy(), expected.detach().numpy(), atol=1e-5)


def test_a_headless_models_file_embeds_and_probes_as_the_pytorch_model(
    exported, image_folder, evaluate_script, tmp_path, capsys, one_thread
):
    """An embeddings file's output is the pooled embedding: predict --features writes the
    PyTorch model's, evaluate --knn scores them alike; other embeddings are refused."""
    images = str(image_folder / "test")
    features, reports = {}, {}
    for name in ("headless.safetensors", "headless.onnx"):
        out = tmp_path / f"{name}.npz"
        argv = [images, "--checkpoint", str(exported / name), "--features", str(out)]
        assert predict_main(argv) == 0
        features[name] = np.load(out)
        argv = ["--knn", "--knn-k", "3", "--subset", "6"]
        out = tmp_path / name
        assert run_evaluate(evaluate_script, exported / name, image_folder, out, *argv) == 0
        reports[name] = json.loads((tmp_path / name / "report.json").read_text())["knn"]
    torch_features, onnx_features = features.values()
    assert list(onnx_features["paths"]) == list(torch_features["paths"])
    np.testing.assert_allclose(onnx_features["features"], torch_features["features"], atol=1e-5)
    assert reports["headless.onnx"]["by_k"] == reports["headless.safetensors"]["by_k"]
    capsys.readouterr()
    argv = [images, "--checkpoint", str(exported / "headless.onnx"), "--embedding", "clstoken"]
    assert predict_main([*argv, "--features", str(tmp_path / "c.npz")]) == 2
    assert capsys.readouterr().err.startswith(
        "error: --embedding clstoken: an ONNX file gives its output only (the pooled embedding)"
    )
    assert not (tmp_path / "c.npz").exists()


def test_a_missing_onnxruntime_is_said_in_one_line(
    exported, image_folder, tmp_path, capsys, monkeypatch
):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime fails
    image = next((image_folder / "test" / "red").iterdir())
    out = tmp_path / "p.csv"
    argv = [str(image), "--checkpoint", str(exported / "tiny.onnx"), "--output", str(out)]
    assert predict_main(argv) == 2
    assert capsys.readouterr().err == (
        f"error: --checkpoint {exported / 'tiny.onnx'}: running an ONNX file needs onnxruntime: "
        f"pip install 'vit-from-scratch[interop]'\n"
    )
    assert not out.exists()
