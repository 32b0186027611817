"""The benchmarks as commands: a bad input is one line on stderr naming it and what is accepted,
exit status 2, before any work (not a traceback); Ctrl-C one line and exit status 130; the
header names the machine that measured the figures."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest
import torch
from conftest import one_line_error

from vit.inference.cpu_paths import cpu_flags, cpu_name

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
DATA = "DATA"  # replaced by the tiny image folder
# (benchmark, its arguments, how the line starts after "error: ")
BAD_INPUTS = [
    ("cpu_ablation", ["--data", "/nope"], "--data /nope: no such folder"),
    ("decode_throughput", ["--data", "/nope"], "--data /nope: no such folder"),
    ("teacher_screen", ["--data", "/nope"], "--data /nope: no such folder"),
    ("faithfulness", ["--data", "/nope"], "--data /nope: no .jpg images"),
    ("faithfulness", ["--weights", "/nope.safetensors"], "--weights /nope.safetensors: no such"),
    ("faithfulness", ["--num-images", "0"], "argument --num-images: 0 is outside"),
    ("training_pipeline", ["--data", DATA, "--device", "cuda"], "--device cuda: CUDA is not"),
    ("compile_time", ["--device", "cuda"], "--device cuda: CUDA is not"),
    ("compile_time", ["--steps", "0"], "argument --steps: 0 is outside the accepted range"),
    ("inference_throughput", ["--batch-size", "0"], "argument --batch-size: 0 is outside"),
    ("inference_throughput", ["--rounds", "0"], "argument --rounds: 0 is outside"),
    ("inference_throughput", ["--models", "vit_bogus"], "--models vit_bogus: not a model name"),
    ("timm_equivalence", ["--models", "vit_small_patch16_22"], "--models vit_small_patch16_22:"),
    ("onnx_families", ["--names", "vit_bogus"], "--names vit_bogus: not a model name"),
    ("onnx_throughput", ["--models", "vit_bogus"], "--models vit_bogus: not a model name"),
    ("training_memory", ["--model", "vit_bogus"], "--model vit_bogus: not a model name"),
    ("training_memory", ["--steps", "0"], "argument --steps: 0 is outside the accepted range"),
    ("tta_views", ["--checkpoint", "/nope", "--data", DATA], "--checkpoint /nope: no such"),
    ("onnx_profile", ["/nope.onnx"], "CHECKPOINT /nope.onnx: no such file"),
    ("onnx_profile", ["/nope.onnx", "--calibration", "/nope"], "--calibration /nope: no such"),
    # counts and sizes out of range: argparse's one line, not a traceback after the work began
    ("decode_throughput", ["--data", DATA, "--workers", "0"], "argument --workers: 0 is outside"),
    ("decode_throughput", ["--data", DATA, "--rounds", "0"], "argument --rounds: 0 is outside"),
    ("loader_throughput", ["--workers", "-1"], "argument --workers: -1 is outside"),
    ("loader_throughput", ["--rounds", "0"], "argument --rounds: 0 is outside"),
    ("speedrun_proxy", ["--data", DATA, "--parallel", "0"], "argument --parallel: 0 is outside"),
    ("timm_equivalence", ["--batch-size", "0"], "argument --batch-size: 0 is outside"),
    ("timm_equivalence", ["--max-depth", "0"], "argument --max-depth: 0 is outside"),
    ("int8_sensitivity", ["--images", "5"], "argument --images: 5 is outside"),
    ("int8_sensitivity", ["--images", "15"], "--images 15: accepted: a multiple of 10"),
    ("muon_step", ["--steps", "0"], "argument --steps: 0 is outside"),
    ("onnx_throughput", ["--rounds", "0"], "argument --rounds: 0 is outside"),
    ("step_profile", ["--steps", "0"], "argument --steps: 0 is outside"),
    ("finetune_table", ["--backbone", "bb", "--model", "m", "--data", DATA, "--out", "/nope",
        "--epochs", "0"], "argument --epochs: 0 is outside"),
    # --json where no file can go: refused before the work whose figures it would keep
    ("inference_throughput", ["--models", "vit_cifar_patch4_32", "--rounds", "1", "--iters",
        "1", "--batch-size", "1", "--device", "cpu", "--json", DATA], "--json DATA: is a folder"),
    ("training_pipeline", ["--data", DATA, "--device", "cpu", "--json", DATA], "--json DATA:"),
    ("teacher_screen", ["--data", DATA, "--device", "cpu", "--json", DATA], "--json DATA:"),
    ("teacher_targets", ["/nope", "--json", DATA], "--json DATA: is a folder"),
    ("compile_time", ["--json", DATA], "--json DATA: is a folder"),
    ("finetune_table", ["--backbone", "bb", "--model", "m", "--data", DATA, "--out", "/nope",
        "--json", DATA], "--json DATA: is a folder"),
]  # fmt: skip


@pytest.fixture
def command(monkeypatch):
    """command(NAME, *args): benchmarks/NAME.py's main run as `python benchmarks/NAME.py args`
    would run it (sys.argv is the command line), in this process."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))

    def run(name: str, *args: str):
        monkeypatch.setattr(sys, "argv", [str(BENCHMARKS / f"{name}.py"), *args])
        return importlib.import_module(name).main()

    return run


@pytest.mark.parametrize(("name", "argv", "start"), BAD_INPUTS, ids=lambda case: str(case))
def test_a_benchmark_refuses_a_bad_input_in_one_line(
    name, argv, start, command, image_folder, capsys
):
    if "cuda" in argv and torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(SystemExit) as exit_info:
        command(name, *(str(image_folder) if arg == DATA else arg for arg in argv))
    assert one_line_error(capsys, exit_info).startswith(start.replace(DATA, str(image_folder)))


def test_the_loader_benchmark_measures_loading_in_this_process(command, capsys):
    """--workers 0 (the DataLoader's own process) is a row, not an empty data set."""
    command("loader_throughput", "--workers", "0", "--opencv-threads", "1", "--batches", "1",
            "--rounds", "1")  # fmt: skip
    assert capsys.readouterr().out.splitlines()[-1].startswith("| 0 | 1 |")


def test_int8_sensitivity_without_the_test_images_is_one_line(
    command, tmp_path, monkeypatch, capsys
):
    """A checkout without ../shared/data: the folder named, before any export."""
    int8 = importlib.import_module("int8_sensitivity")
    monkeypatch.setattr(int8, "DATA", tmp_path / "data")
    with pytest.raises(SystemExit) as exit_info:
        command("int8_sensitivity", "--models", "cifar")
    folder = tmp_path / "data" / "cifar10-jpg" / "test"
    assert one_line_error(capsys, exit_info).startswith(f"no CIFAR-10 test images at {folder}")


def test_faithfulness_takes_as_many_images_of_each_class_as_the_smallest_has(
    command, image_folder, tmp_path
):
    """A class folder with one image fewer: every class gives as many as it has (balanced), not
    a reshape error."""
    import shutil
    import types

    import vit

    folder = tmp_path / "test"
    shutil.copytree(image_folder / "test", folder)
    names = sorted(p.name for p in folder.iterdir())
    min(folder.joinpath(names[1]).glob("*.jpg")).unlink()  # 6, 5, 6 images
    model = vit.create_model("vit_cifar_patch4_32", num_classes=len(names))
    stub = types.SimpleNamespace(class_names=names, preprocess=model.preprocess)
    faithfulness = importlib.import_module("faithfulness")
    images, labels = faithfulness.load_test_images(folder, 30, stub)
    assert images.shape[0] == 15 and labels.tolist() == [0, 1, 2] * 5


def test_a_json_in_a_new_folder_is_written_after_the_work(command, tmp_path):
    json_file = tmp_path / "new" / "bench.json"
    flags = ["--models", "vit_cifar_patch4_32", "--batch-size", "1", "--rounds", "1", "--iters"]
    command("inference_throughput", *flags, "1", "--device", "cpu", "--json", str(json_file))
    assert json.loads(json_file.read_text())["rows"][0]["model"] == "vit_cifar_patch4_32"


def test_the_pipeline_json_stays_whole_when_stopped_while_rewritten(
    command, image_folder, tmp_path, monkeypatch
):
    """gpu_check.sh stops training_pipeline.py with SIGINT at its deadline: one landing while the
    rows' file is rewritten after a row leaves the earlier rows' file whole, not half of one."""
    import types

    pipeline = importlib.import_module("training_pipeline")
    monkeypatch.setattr(pipeline, "row_config", lambda *a: types.SimpleNamespace(batch_size=1))
    monkeypatch.setattr(pipeline, "measure", lambda *a: {"images_per_s": 1.0})
    json_file = tmp_path / "pipeline.json"
    written = []
    real_write_text = Path.write_text

    def stopped_on_the_second(path, text, *args, **kwargs):
        written.append(path)
        if len(written) == 2:  # half the text, then SIGINT
            real_write_text(path, text[: len(text) // 2])
            raise KeyboardInterrupt
        return real_write_text(path, text, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", stopped_on_the_second)
    configs = ["--configs", "a.yaml", "b.yaml", "--shapes", "config"]
    with pytest.raises(KeyboardInterrupt):
        command("training_pipeline", "--data", str(image_folder), "--device", "cpu", *configs,
                "--json", str(json_file))  # fmt: skip
    assert [row["config"] for row in json.loads(json_file.read_text())["rows"]] == ["a.yaml"]
    assert [p.name for p in tmp_path.iterdir()] == ["pipeline.json"]


# --config files train.py refuses: (the file's text, None for no file, the line's words)
BAD_CONFIGS = [
    (None, "cannot read config file mine.yaml"),
    ("lr: [\n", "config file mine.yaml: not YAML"),
    ("lr: 0.1\nbogus_key: 1\n", "config file mine.yaml: unknown key 'bogus_key'"),
]


@pytest.mark.parametrize("name", ["teacher_screen", "host_overhead"])
@pytest.mark.parametrize(("text", "words"), BAD_CONFIGS, ids=["missing", "not-yaml", "unknown"])
def test_a_speedrun_benchmark_refuses_a_config_as_train_py_does(
    name, text, words, command, image_folder, tmp_path, monkeypatch, capsys
):
    """--config is read as typed, from the current folder (not the repository's), and refused
    in one line before any work."""
    monkeypatch.chdir(tmp_path)
    if text is not None:
        (tmp_path / "mine.yaml").write_text(text)
    data = ["--data", str(image_folder)] if name == "teacher_screen" else []
    with pytest.raises(SystemExit) as exit_info:
        command(name, *data, "--config", "mine.yaml")
    assert one_line_error(capsys, exit_info).startswith(words)


def test_the_speedrun_config_is_found_from_any_folder(image_folder, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # not the repository
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    args = importlib.import_module("teacher_screen").parse_args(["--data", str(image_folder)])
    assert args.config.model == "vit_cifar_patch4_32" and args.config.teacher_recipe == "airbench"


def test_a_training_memory_row_that_fails_is_marked_and_the_next_rows_run():
    """Each row's process asks for 602 GB (a million images): refused, as memory a step needs
    and the machine lacks would be; under a cap on the address space, so that a kernel that
    grants every request (overcommit) refuses it too, rather than the machine paging it in."""
    import resource
    import subprocess

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (16 * 2**30, 16 * 2**30))

    rows = ["one-batch", "checkpointing"]
    flags = ["--model", "vit_tiny_patch16_224", "--images", "1000000", "--steps", "1"]
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "training_memory.py"), *flags, "--rows", *rows],
        capture_output=True,
        text=True,
        preexec_fn=cap,
        timeout=300,
    )
    assert done.returncode == 1
    table = done.stdout.splitlines()[2:]
    assert [line.split() for line in table] == [[row, "1000000", "failed"] for row in rows]
    lines = done.stderr.strip().splitlines()
    assert [line.split(": ")[:3] for line in lines] == [
        ["training_memory.py", f"row {row} failed", "RuntimeError"] for row in rows
    ]
    assert all("can't allocate memory" in line for line in lines)


def test_a_misspelt_model_name_is_answered_with_the_closest(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        command("onnx_families", "--names", "vit_small_patch16_22")
    assert "did you mean vit_small_patch16_224" in one_line_error(capsys, exit_info)


def test_ctrl_c_ends_a_benchmark_with_one_line_and_status_130(image_folder, monkeypatch, capsys):
    """As `python benchmarks/decode_throughput.py` runs it (its __main__ block), Ctrl-C in the
    middle of decoding."""
    import runpy

    import vit.data.images

    def interrupted(paths, workers):
        raise KeyboardInterrupt

    monkeypatch.setattr(vit.data.images, "load_images_in_threads", interrupted)
    script = BENCHMARKS / "decode_throughput.py"
    monkeypatch.setattr(sys, "argv", [str(script), "--data", str(image_folder)])
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    with pytest.raises((SystemExit, KeyboardInterrupt)) as exit_info:  # not pytest's own stop
        runpy.run_path(str(script), run_name="__main__")
    assert exit_info.type is SystemExit and exit_info.value.code == 130
    assert capsys.readouterr().err.strip() == "decode_throughput.py: interrupted"


def test_a_throughput_header_names_the_cpu_and_its_flags(command, image_folder, capsys):
    command("decode_throughput", "--data", str(image_folder), "--workers", "1")
    header = capsys.readouterr().out.splitlines()[0]
    assert f"CPU {cpu_name()}, flags {cpu_flags()}" in header


@pytest.mark.parametrize(
    ("name", "last_words"),
    [("families_interop", "at the published model sizes."), ("timm_equivalence", "paths.")],
)
def test_a_benchmarks_help_gives_its_whole_first_paragraph(name, last_words, command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        command(name, "--help")
    assert exit_info.value.code == 0
    description = " ".join(capsys.readouterr().out.split("\n\n")[1].split())
    assert description.endswith(last_words)
