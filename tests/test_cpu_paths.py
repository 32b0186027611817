"""The CPU's inference paths: static int8 (calibrated on images), OpenVINO running an exported
file in evaluate.py and `vit.predict`, and `python -m vit.benchmark` timing every path and naming
the fastest; each refusal in one line with nothing written.

The tests that load OpenVINO run in a pytest process of their own (marked `openvino`, run by
`test_the_openvino_cases_in_a_process_of_their_own`): once OpenVINO was loaded into the suite's
process, a DataLoader worker forked later no longer ignored SIGINT, and a later test's
`subprocess.run` of torchrun died of a segmentation fault (onnxruntime 1.32.0, openvino
2026.4.1, torch 2.14.1). A command loads it once, in its own process, and is not affected.
"""

import itertools
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision
from conftest import OfflineCifar

import vit
from vit import benchmark
from vit.benchmark import main as benchmark_main
from vit.cli.flags import DATA_ROOT, missing_model_argument, runtime_problem
from vit.cli.model_argument import model_from_flags, resolve_model
from vit.data import datasets
from vit.export import build_parser as export_parser
from vit.inference import cpu_paths
from vit.interop.onnx_export import OnnxOptions, quantized_copy
from vit.interop.onnx_runtime import OnnxModel
from vit.predict import build_parser as predict_parser
from vit.predict import check_args as predict_check_args
from vit.predict import main as predict_main

pytest.importorskip("onnxruntime", reason="running ONNX files needs onnxruntime ([interop])")
pytest.importorskip("onnxscript", reason="exporting the test's ONNX file needs onnxscript")

COLOURS = ["blue", "green", "red"]  # conftest's image_folder classes
OPENVINO_PROCESS = "VIT_TESTS_OPENVINO_PROCESS"  # set in the process that runs the OpenVINO cases


def openvino_case(test):
    """A test that loads OpenVINO: run only in the process of its own (see the docstring)."""
    alone = pytest.mark.skipif(
        os.environ.get(OPENVINO_PROCESS) != "1",
        reason="loads OpenVINO: run by test_the_openvino_cases_in_a_process_of_their_own",
    )
    return pytest.mark.openvino(alone(test))


def test_the_openvino_cases_in_a_process_of_their_own():
    if os.environ.get(OPENVINO_PROCESS) == "1":
        pytest.skip("this is that process")
    pytest.importorskip("openvino", reason="OpenVINO is optional (pip install openvino)")
    root = Path(__file__).resolve().parents[1]
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "openvino"]
    done = subprocess.run(
        [*command, str(Path(__file__).resolve())],
        cwd=root,
        env={**os.environ, OPENVINO_PROCESS: "1"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert (
        " passed" in done.stdout.splitlines()[-1] and "skipped" not in done.stdout.splitlines()[-1]
    )


@pytest.fixture
def exported(onnx_exports):
    """conftest's tiny classifier and headless model, as .safetensors and ONNX."""
    return onnx_exports


def calibration_images(count: int = 32) -> torch.Tensor:
    return torch.randn(count, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def graph_operators(path) -> set[str]:
    return {node.op_type for node in __import__("onnx").load(str(path)).graph.node}


def test_static_int8_stores_activation_ranges_and_agrees_with_float(exported, tmp_path, one_thread):
    model = resolve_model(exported / "tiny.safetensors")
    static = OnnxOptions(int8=True, calibration=calibration_images())
    check = quantized_copy(exported / "tiny.onnx", tmp_path / "static.onnx", model, static)
    # static: QuantizeLinear/DequantizeLinear pairs with stored ranges, no run-time range search
    operators = graph_operators(tmp_path / "static.onnx")
    assert {"QuantizeLinear", "DequantizeLinear"} <= operators
    assert "DynamicQuantizeLinear" not in operators
    assert check.max_relative_difference < 0.1
    onnx_model = OnnxModel(tmp_path / "static.onnx")
    assert (onnx_model.precision, onnx_model.class_names) == ("int8", COLOURS)
    images = calibration_images(8)
    ours = model(images).detach()
    theirs = onnx_model(images)
    assert (theirs - ours).abs().max() / ours.abs().max() < 0.1
    assert "DynamicQuantizeLinear" in graph_operators(
        quantized_copy(
            exported / "tiny.onnx", tmp_path / "d.onnx", model, OnnxOptions(int8=True)
        ).path
    )


def test_an_int8_copy_beyond_its_tolerance_writes_nothing(exported, tmp_path):
    model = resolve_model(exported / "tiny.safetensors")
    strict = OnnxOptions(int8=True, int8_tolerance=0.0)
    with pytest.raises(ValueError, match="does not reproduce our logits"):
        quantized_copy(exported / "tiny.onnx", tmp_path / "int8.onnx", model, strict)
    assert list(tmp_path.iterdir()) == []


def test_export_calibrates_on_the_folders_train_images(exported, image_folder, tmp_path, capsys):
    from vit.export import main as export_main

    out = tmp_path / "static.onnx"
    argv = [str(exported / "tiny.safetensors"), "--onnx", str(out), "--int8"]
    calibrate = ["--calibration", str(image_folder), "--calibration-images", "9"]
    assert export_main([*argv, *calibrate]) == 0
    assert "QuantizeLinear" in graph_operators(out)
    assert "onnxruntime int8" in capsys.readouterr().out


@pytest.mark.parametrize(
    "extra, line",
    [
        (
            ["--calibration", "DATA"],
            "python -m vit.export: error: --calibration calibrates --int8's activations: pass "
            "--int8 too\n",
        ),
        (
            ["--int8", "--calibration", "MISSING"],
            "error: --calibration MISSING: 'MISSING' is neither one of cifar10, cifar100 "
            "nor an existing folder",
        ),
        (
            ["--int8", "--data-root", "MISSING"],
            "python -m vit.export: error: --data-root is where --calibration cifar10/cifar100 is "
            "read: pass it too\n",
        ),
    ],
)
def test_export_refuses_calibration_it_cannot_use(extra, line, exported, tmp_path, capsys):
    from vit.export import main as export_main

    out = tmp_path / "m.onnx"
    argv = [str(exported / "tiny.safetensors"), "--onnx", str(out)]
    try:
        code = export_main([*argv, *[str(tmp_path / a) if a == "MISSING" else a for a in extra]])
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err.replace(str(tmp_path / "MISSING"), "MISSING")
    assert code == 2 and err.startswith(line) and err.count("\n") == 1, err
    assert not out.exists()


def test_export_reads_calibration_cifar_from_data_root_as_evaluate_does(
    exported, tmp_path, capsys, monkeypatch
):
    """--calibration cifar10 is read from --data-root and downloaded there when missing; offline,
    the download fails in one line, and neither the export nor the download's folder is left."""
    from vit.export import main as export_main

    monkeypatch.setattr(torchvision.datasets, "CIFAR10", OfflineCifar)
    out, root = tmp_path / "static.onnx", tmp_path / "downloads" / "cifar"
    argv = [str(exported / "tiny.safetensors"), "--onnx", str(out), "--int8"]
    assert export_main([*argv, "--calibration", "cifar10", "--data-root", str(root)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --calibration cifar10: cifar10 is not in {root} and could not")
    assert err.count("\n") == 1 and err.endswith("; nothing was written\n")
    assert list(tmp_path.iterdir()) == []


# -- OpenVINO ------------------------------------------------------------------------------------
@openvino_case
def test_openvino_runs_the_file_as_onnxruntime_does(exported, tmp_path, one_thread):
    ort = OnnxModel(exported / "tiny.onnx")
    ov = OnnxModel(exported / "tiny.onnx", runtime="openvino")
    assert (ov.num_classes, ov.class_names, ov.preprocess) == (3, COLOURS, ort.preprocess)
    # At the model's size the same to float rounding; at another size (the graph's dynamic height
    # and width) OpenVINO's antialiased cubic Resize of the position embeddings is not quite
    # onnxruntime's (measured 1.4e-3 relative at 40x24, docs/fast-inference.md)
    for size, tolerance in (((32, 32), 1e-5), ((40, 24), 1e-2)):
        images = torch.randn(3, 3, *size)
        ours = ort(images)
        assert (ov(images) - ours).abs().max() / ours.abs().max() < tolerance, size
    images = torch.randn(4, 3, 32, 32)
    bf16 = OnnxModel(exported / "tiny.onnx", runtime="openvino").to(torch.bfloat16)
    assert bf16.compute_dtype == torch.bfloat16
    ours = ort(images)
    assert (bf16(images) - ours).abs().max() / ours.abs().max() < 0.05
    with pytest.raises(ValueError, match="an ONNX file computes in what it was exported with"):
        ort.to(torch.bfloat16)
    with pytest.raises(ValueError, match="--device cuda: OpenVINO runs ONNX files on the CPU"):
        ov.to("cuda")
    # OpenVINO's reason, not the first of its lines, which names its own source file
    (tmp_path / "bad.onnx").write_bytes(b"not an ONNX graph")
    with pytest.raises(ValueError, match="^OpenVINO cannot run it: Unable to read the model"):
        OnnxModel(tmp_path / "bad.onnx", runtime="openvino")


@openvino_case
def test_evaluate_and_predict_run_the_file_in_openvino(
    exported, image_folder, evaluate_script, tmp_path, one_thread
):
    reports, rows = {}, {}
    for runtime in ("onnxruntime", "openvino"):
        argv = ["--checkpoint", str(exported / "tiny.onnx"), "--runtime", runtime]
        out = tmp_path / runtime
        data = ["--data", str(image_folder), "--workers", "0", "--output-dir", str(out)]
        assert evaluate_script.main([*argv, *data]) == 0
        reports[runtime] = json.loads((out / "report.json").read_text())
        csv = tmp_path / f"{runtime}.csv"
        assert predict_main([str(image_folder / "test"), *argv, "--output", str(csv)]) == 0
        rows[runtime] = csv.read_text().splitlines()
    for key in ("top1", "top5", "confusion_matrix", "num_images"):
        assert reports["openvino"][key] == reports["onnxruntime"][key], key
    assert (reports["onnxruntime"]["runtime"], reports["openvino"]["runtime"]) == (
        "onnxruntime",
        "openvino",
    )
    # a feature cache of one runtime is not taken for the other's
    ort = OnnxModel(exported / "tiny.onnx")
    ov = OnnxModel(exported / "tiny.onnx", runtime="openvino")
    assert not torch.equal(ort.state_dict()["onnx.sha1"], ov.state_dict()["onnx.sha1"])
    assert len(rows["openvino"]) == len(rows["onnxruntime"]) == 19
    classes = [[row.split(",")[1] for row in rows[r][1:]] for r in rows]
    assert classes[0] == classes[1]


def test_runtime_openvino_on_pytorch_weights_is_refused_in_one_line(
    exported, image_folder, tmp_path, capsys
):
    image = next((image_folder / "test" / "red").iterdir())
    out = tmp_path / "p.csv"
    argv = [str(image), "--checkpoint", str(exported / "tiny.safetensors"), "--runtime", "openvino"]
    with pytest.raises(SystemExit) as exit_info:
        predict_main([*argv, "--output", str(out)])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (
        "python -m vit.predict: error: --runtime openvino runs an exported ONNX file, and "
        "--checkpoint is not one: export it with python -m vit.export SRC --onnx FILE, or leave "
        "--runtime out\n"
    )
    assert not out.exists()


def test_a_missing_openvino_is_said_in_one_line(exported, image_folder, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "openvino", None)  # import openvino fails
    image = next((image_folder / "test" / "red").iterdir())
    argv = [str(image), "--checkpoint", str(exported / "tiny.onnx"), "--runtime", "openvino"]
    assert predict_main(argv) == 2
    assert capsys.readouterr().err == (
        f"error: --checkpoint {exported / 'tiny.onnx'}: running an ONNX file needs openvino: "
        f"pip install 'vit-from-scratch[openvino]'\n"
    )


# -- the benchmark -------------------------------------------------------------------------------
@openvino_case
@pytest.mark.parametrize("native", [False, True])
def test_paths_skip_bfloat16_where_the_cpu_emulates_it(native, exported, tmp_path, monkeypatch):
    monkeypatch.setattr(cpu_paths, "fast_bfloat16", lambda device: native)
    model = resolve_model(exported / "tiny.safetensors")
    paths = {p.label: p for p in cpu_paths.cpu_paths(model, tmp_path, log=lambda line: None)}
    for label in ("PyTorch bfloat16", "OpenVINO bfloat16"):
        assert (paths[label].run is None) == (not native), label
        assert paths[label].skipped == ("" if native else cpu_paths.NO_BF16)
    static = paths["onnxruntime int8 static"]
    assert static.run is None and "pass --data" in static.skipped  # no calibration images
    batch = calibration_images(4).numpy()
    reference = paths["PyTorch float32"].run(batch)
    for path in paths.values():
        if path.run is not None:
            difference, same = cpu_paths.agreement(reference, path.run(batch))
            assert difference < 0.1, path.label


def test_time_paths_reports_each_paths_median_round():
    calls = {"fast": 0, "slow": 0}

    def sleeper(label, seconds):
        def run(batch):
            calls[label] += 1
            __import__("time").sleep(seconds)

        return run

    batch = np.zeros((8, 3, 4, 4), np.float32)
    speed = cpu_paths.time_paths(
        {"fast": sleeper("fast", 0.002), "slow": sleeper("slow", 0.02)}, batch, 3, 0.05
    )
    assert speed["fast"] > 3 * speed["slow"]
    assert 8 / 0.02 / 1.5 < speed["slow"] < 8 / 0.02
    assert calls["slow"] >= 2 + 3  # warm-up, the timed call, and at least one call a round


@openvino_case
def test_benchmark_times_every_path_and_names_the_fastest(
    exported, image_folder, tmp_path, capsys, one_thread
):
    keep = tmp_path / "files"
    argv = [str(exported / "tiny.safetensors"), "--data", str(image_folder), "--batch-size", "6"]
    fast = ["--rounds", "1", "--round-seconds", "0.01", "--calibration-images", "9"]
    assert benchmark_main([*argv, *fast, "--onnx-dir", str(keep)]) == 0
    out = capsys.readouterr().out
    for label in ("PyTorch float32", "onnxruntime float32", "onnxruntime int8 static"):
        assert f"\n{label} " in out, label
    assert "against PyTorch float32 on the 6 test images of" in out
    fastest = out.split("fastest here: ")[1]
    assert "x PyTorch float32" in fastest.splitlines()[0]
    assert "python -m vit.evaluate --checkpoint " in fastest
    assert sorted(p.name for p in keep.iterdir()) == sorted(
        name for name, _ in cpu_paths.ONNX_FILES.values()
    )
    # the kept files are never overwritten: a second run into the same folder is refused
    before = (keep / "model.onnx").read_bytes()
    with pytest.raises(SystemExit) as exit_info:
        benchmark_main([*argv, *fast, "--onnx-dir", str(keep)])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (
        f"python -m vit.benchmark: error: --onnx-dir {keep}: model.onnx is there already; name "
        f"an empty or new folder\n"
    )
    assert (keep / "model.onnx").read_bytes() == before


@openvino_case
def test_benchmark_without_data_times_random_images(exported, capsys, one_thread):
    argv = [str(exported / "tiny.safetensors"), "--batch-size", "4", "--rounds", "1"]
    assert benchmark_main([*argv, "--round-seconds", "0.01"]) == 0
    out = capsys.readouterr().out
    assert "input (3, 32, 32), batch 4" in out
    assert "against PyTorch float32 on the 4 random images" in out
    assert "not timed: onnxruntime int8 static: static int8 needs calibration images" in out
    assert "fastest here: " in out


def test_a_benchmark_whose_rounds_disagree_says_its_ranking_may_not_hold(
    exported, capsys, monkeypatch, one_thread
):
    """On a shared 2-core host PyTorch's rounds ran 122-1,613 images/s, and the advice named a
    path '39.97x PyTorch float32' without a word: a spread over 1.5x is said now."""
    steady = {"PyTorch float32": [100.0, 110.0, 105.0], "PyTorch bfloat16": [90.0, 95.0, 99.0]}
    assert cpu_paths.unsteady(steady) is None
    noisy = {**steady, "PyTorch float32": [122.0, 1613.0, 400.0]}
    assert cpu_paths.unsteady(noisy) == ("PyTorch float32", pytest.approx(1613 / 122))
    monkeypatch.setattr(cpu_paths, "_installed", lambda name: False)  # PyTorch's paths: quick
    timings = iter([steady, noisy])
    monkeypatch.setattr(benchmark, "time_rounds", lambda run, *args: next(timings))
    argv = [str(exported / "tiny.safetensors"), "--batch-size", "4", "--rounds", "3"]
    for expected in (None, "warning: PyTorch float32's rounds differed 13.2x (fastest / slowest)"):
        assert benchmark_main(argv) == 0
        out = capsys.readouterr().out
        assert "max rel diff: max |output - PyTorch float32's| / max |PyTorch float32's|" in out
        warned = [line for line in out.splitlines() if line.startswith("warning:")]
        assert [line[: len(expected)] for line in warned] == ([expected] if expected else [])


def without_openvino(monkeypatch) -> None:
    """The benchmark's paths but OpenVINO's, which would load it into this process (see the
    docstring): a benchmark test that needs no OpenVINO path runs here."""
    installed = cpu_paths._installed
    monkeypatch.setattr(
        cpu_paths, "_installed", lambda name: name != "openvino" and installed(name)
    )


def printed_commands(text: str) -> dict[str, list[str]]:
    """The commands an advice prints, by program ("vit.export", "vit.evaluate", "vit.predict"),
    each as the words its parser gets from the shell (the comment dropped)."""
    commands = {}
    for line in text.splitlines():
        words = shlex.split(line, comments=True)
        if words[:2] == ["python", "-m"]:
            commands[words[2]] = words[3:]
        elif words[:1] == ["python"]:
            commands[words[1]] = words[2:]
    return commands


SOURCES = (
    "weights file",
    "state dict with --model",
    "name with --pretrained PATH",
    "name with --pretrained",
)


@pytest.fixture(scope="module")
def model_sources(onnx_exports, tmp_path_factory) -> dict[str, list[str]]:
    """The benchmark's model arguments for each kind of source; the state dict's file name has
    a space, which the printed commands must quote."""
    state_dict = tmp_path_factory.mktemp("sources") / "tiny state.pth"
    torch.manual_seed(0)
    torch.save(vit.create_model("vit_tiny_patch4_32", num_classes=3).state_dict(), state_dict)
    arguments = (
        [str(onnx_exports / "tiny.safetensors")],
        [str(state_dict), "--model", "vit_tiny_patch4_32"],
        ["vit_tiny_patch4_32", "--pretrained", str(state_dict)],
        ["vit_tiny_patch4_32", "--pretrained"],  # timm's weights: parsed, never loaded here
    )
    return dict(zip(SOURCES, arguments, strict=True))


@pytest.mark.parametrize("source", SOURCES)
def test_benchmark_advice_is_accepted_as_printed_with_the_model_arguments_given(
    source, model_sources, exported, evaluate_script, tmp_path, monkeypatch
):
    """For every path, headless or not: vit.export gets the model arguments the benchmark got,
    vit.evaluate and vit.predict those (a PyTorch path) or the exported file, and each command's
    parser and checks take the line as the shell splits it."""
    monkeypatch.chdir(tmp_path)  # predict checks its --features file there
    data = ["--data", "my data", "--data-root", "my root"]
    args = benchmark.build_parser().parse_args([*model_sources[source], *data])
    given = (args.checkpoint, args.model, args.pretrained)
    monkeypatch.setattr(cpu_paths, "_installed", lambda name: False)  # every path, none exported
    model = resolve_model(exported / "tiny.safetensors")
    paths = cpu_paths.cpu_paths(model, tmp_path, log=lambda line: None)
    assert len(paths) == 8
    parsers = {
        "vit.export": export_parser(),
        "vit.evaluate": evaluate_script.build_parser(),
        "vit.predict": predict_parser(),
    }
    for path, classifier in itertools.product(paths, (True, False)):
        printed = printed_commands(benchmark.advice(path, 1.0, args, classifier))
        made = [] if path.export is None else ["vit.export"]
        assert sorted(printed) == sorted(["vit.evaluate", "vit.predict", *made]), path.label
        parsed = {program: parsers[program].parse_args(words) for program, words in printed.items()}
        evaluate, predict = parsed["vit.evaluate"], parsed["vit.predict"]
        assert missing_model_argument(evaluate) is None and runtime_problem(evaluate) is None
        predict_check_args(parsers["vit.predict"], predict)
        assert (evaluate.data, evaluate.data_root, evaluate.knn) == (
            "my data",
            "my root",
            not classifier,
        )
        assert predict.images == ["IMAGES"]
        assert predict.features == (None if classifier else Path("embeddings.npz"))
        for runner in (evaluate, predict):
            ran = (runner.checkpoint, runner.model, runner.pretrained)
            if path.export is None:
                assert ran == given, path.label
            else:
                export = parsed["vit.export"]
                assert (export.checkpoint, export.model, export.pretrained) == given, path.label
                assert ran == (str(export.onnx), None, None), path.label
                calibrated = "static" in path.label  # its images read as --data is here
                assert export.calibration == ("my data" if calibrated else None)
                assert export.data_root == ("my root" if calibrated else DATA_ROOT)
    if source != "name with --pretrained":  # the printed arguments load the weights
        float32 = printed_commands(benchmark.advice(paths[0], 1.0, args))["vit.evaluate"]
        assert model_from_flags(parsers["vit.evaluate"].parse_args(float32)).num_classes == 3


def test_agreement_of_embeddings_is_their_least_cosine_similarity():
    reference = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 4.0]])
    outputs = torch.tensor([[2.0, 0.0], [1.0, 1.0], [3.0, 4.0]])  # scaled, 45 degrees off, same
    difference, cosine = cpu_paths.agreement(reference, outputs, classifier=False)
    assert cosine == pytest.approx(2**-0.5)
    assert difference == pytest.approx(1 / 4)  # max |outputs - reference| / max |reference|
    assert cpu_paths.agreement(reference, outputs)[1] == pytest.approx(2 / 3)  # top-1 same


def test_benchmark_of_a_headless_model_compares_embeddings_and_advises_knn(
    exported, image_folder, evaluate_script, tmp_path, capsys, monkeypatch, one_thread
):
    without_openvino(monkeypatch)
    keep = tmp_path / "files"
    headless = str(exported / "headless.safetensors")
    argv = [headless, "--data", str(image_folder), "--batch-size", "6"]
    fast = ["--rounds", "1", "--round-seconds", "0.01", "--calibration-images", "9"]
    assert benchmark_main([*argv, *fast, "--onnx-dir", str(keep)]) == 0
    out = capsys.readouterr().out
    rows = {line[:26].strip(): line[26:].split() for line in out.splitlines()}
    assert rows["path"] == ["images/s", "x", "float32", "min", "cosine", "max", "rel", "diff"]
    assert rows["PyTorch float32"][2] == "1.00000"
    assert float(rows["onnxruntime float32"][2]) > 0.9999
    assert "(min cosine of an image's embedding and max rel diff: against PyTorch" in out
    printed = printed_commands(out.split("fastest here: ")[1])
    assert "--knn" in printed["vit.evaluate"] and "--features" in printed["vit.predict"]
    monkeypatch.chdir(keep)  # where the printed ONNX file names are
    report = ["--knn-k", "10", "--workers", "0", "--output-dir", str(tmp_path / "eval")]
    assert evaluate_script.main([*printed["vit.evaluate"], *report]) == 0
    assert "knn_top1" in json.loads((tmp_path / "eval" / "report.json").read_text())


def test_benchmark_reads_cifar_as_evaluate_does(
    exported, evaluate_script, tmp_path, capsys, monkeypatch, one_thread
):
    """--data cifar10 is the data set, in --data-root (./data by default) and downloaded there
    when missing, as evaluate.py reads it, even beside a folder ./cifar10."""
    calls = []

    def torchvision_split(name, root, train, download, **dataset):
        calls.append((name, root, train, download))
        images = np.random.default_rng(0).integers(0, 256, (20, 32, 32, 3), dtype=np.uint8)
        classes = [f"class {i}" for i in range(10)]
        return datasets.ImageDataset(np.arange(20) % 10, classes, images=images, **dataset)

    monkeypatch.setattr(datasets, "_torchvision_split", torchvision_split)
    monkeypatch.setattr(cpu_paths, "_installed", lambda name: False)  # PyTorch's paths: quick
    monkeypatch.chdir(tmp_path)
    for split in ("train", "test"):
        (tmp_path / "cifar10" / split / "a").mkdir(parents=True)
    fast = ["--batch-size", "4", "--rounds", "1", "--round-seconds", "0.01"]
    elsewhere = tmp_path / "elsewhere"
    for root, extra in ((Path("data"), []), (elsewhere, ["--data-root", str(elsewhere)])):
        calls.clear()
        argv = [str(exported / "tiny.safetensors"), "--data", "cifar10", *extra, *fast]
        assert benchmark_main(argv) == 0
        assert calls == [("cifar10", root, False, True), ("cifar10", root, True, True)]
        out = capsys.readouterr().out
        assert "on the 4 test images of cifar10" in out
        evaluate = evaluate_script.build_parser().parse_args(printed_commands(out)["vit.evaluate"])
        assert (evaluate.data, Path(evaluate.data_root)) == ("cifar10", root)


def test_an_onnx_dir_that_cannot_be_written_is_one_line_before_any_work(tmp_path, monkeypatch):
    """A read-only location was a traceback from mkdir (or the export's temporary file) after
    the timings: refused first, as every command's outputs are."""
    (tmp_path / "file").write_text("mine")
    assert benchmark.onnx_dir_problem(tmp_path / "file") == (
        f"--onnx-dir {tmp_path / 'file'}: exists and is not a folder"
    )
    read_only = tmp_path / "mounted"
    read_only.mkdir()
    real_access = os.access
    monkeypatch.setattr(  # as a read-only mount answers, even to root
        os, "access", lambda path, mode: Path(path) != read_only and real_access(path, mode)
    )
    for folder in (read_only, read_only / "new"):
        problem = benchmark.onnx_dir_problem(folder)
        assert problem.startswith(f"--onnx-dir {folder}: ") and "write" in problem, problem
    assert benchmark.onnx_dir_problem(tmp_path / "new") is None
