"""Mistakes a user makes, each met with one line naming the input, what is wrong and what is
accepted; a non-zero exit; nothing a user saved lost, changed or half-written (issue 16)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tomllib
import torch
import yaml
from conftest import CONSOLE_SCRIPT

import vit
import vit.training.build as build
import vit.training.engine as engine
from vit.models.vision_transformer import VisionTransformer
from vit.predict import main as predict_main
from vit.training.settings import TrainConfig
from vit.utils.process_group import DistInfo

ROOT = Path(__file__).resolve().parents[1]


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` and its bytes: what "nothing written or changed" compares."""
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def refused(train_script, argv: list[str], capsys) -> str:
    """Run train.py expecting a refusal: exit status 2 and exactly one line on stderr."""
    with pytest.raises(SystemExit) as exit_info:
        train_script.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


@pytest.fixture(scope="module")
def finished_run(image_folder, tmp_path_factory, train_script, tiny_args) -> Path:
    """A complete one-epoch run (read-only; copy it to change it)."""
    run = tmp_path_factory.mktemp("finished") / "run"
    assert train_script.main(tiny_args(image_folder, run, 1)) == 0
    return run


# -- 1. a loaded model is ready for inference ------------------------------------------------------
def test_load_model_returns_an_eval_model_with_deterministic_outputs(tmp_path):
    torch.manual_seed(0)
    model = VisionTransformer(
        img_size=32, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=3,
        patch_drop_rate=0.5, drop_path_rate=0.1, drop_rate=0.2,
    )  # fmt: skip
    path = vit.save_weights(model, tmp_path / "model.safetensors")
    loaded = vit.load_model(path)
    assert not loaded.training and not any(m.training for m in loaded.modules())
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(loaded(x), loaded(x))  # patch dropout (0.5) is off
        assert torch.allclose(loaded(x), model.eval()(x), atol=1e-6)
    # create_model follows timm's convention: a new model is in training mode
    assert vit.create_model("vit_cifar_patch4_32", depth=1, embed_dim=32, num_heads=2).training


# -- 2. a finished run is not trained over ---------------------------------------------------------
def test_output_dir_holding_a_run_is_refused_and_left_untouched(
    finished_run, image_folder, tmp_path, train_script, tiny_args, capsys
):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    before = snapshot(run)
    err = refused(train_script, tiny_args(image_folder, run, 1), capsys)
    assert f"--output-dir {run} holds a run" in err
    assert f"--resume {run}" in err and "--overwrite" in err
    assert snapshot(run) == before
    (run / "training_state.pt").unlink()  # stopped in its first epoch: --resume is no way on
    err = refused(train_script, tiny_args(image_folder, run, 1), capsys)
    assert "holds a run's files but no checkpoint to resume" in err and "--resume" not in err
    assert "start anew with --overwrite" in err


def test_overwrite_replaces_the_run_and_removes_its_stale_outputs(
    finished_run, image_folder, tmp_path, train_script, tiny_args, capsys
):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    (run / "eval-old").mkdir()
    (run / "eval-old" / "report.json").write_text("{}")
    report = {"top1": 0.5, "checkpoint": str(run), "confusion_matrix": [[1]]}
    (run / "eval.json").write_text(json.dumps(report))  # evaluate.py --json RUN/eval.json
    (run / "eval_confusion_matrix.png").write_bytes(b"")  # and the picture it writes beside
    (run / "notes.txt").write_text("mine")  # not the run's: kept
    args = tiny_args(image_folder, run, 1) + ["--seed", "1", "--overwrite"]
    assert train_script.main(args) == 0
    assert not (run / "eval-old").exists() and not (run / "eval.json").exists()
    assert not (run / "eval_confusion_matrix.png").exists()
    assert (run / "notes.txt").read_text() == "mine"
    assert yaml.safe_load((run / "config.yaml").read_text())["seed"] == 1
    assert (
        vit.interop.weights.read_metadata(run / "model.safetensors")["vit.train_config"]["seed"]
        == 1
    )
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith(f"train.py: wrote {run}/: model.safetensors")
    assert "\r" not in err and "it/s" not in err  # no progress bar in a redirected log


# -- 3. predict writes nothing when nothing was classified -----------------------------------------
def test_predict_with_nothing_readable_keeps_the_existing_output(tmp_path, capsys):
    model = VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2,
                              num_classes=3)  # fmt: skip
    checkpoint = vit.save_weights(model, tmp_path / "model.safetensors", ["a", "b", "c"])
    output = tmp_path / "preds.csv"
    output.write_text("path,label,probability\nkept.jpg,a,0.9\n")
    argv = [str(tmp_path / "nope.jpg"), "--checkpoint", str(checkpoint), "--output", str(output)]
    assert predict_main(argv) == 2  # an existing file is replaced only with --overwrite
    assert "--overwrite" in capsys.readouterr().err
    assert predict_main([*argv, "--overwrite"]) == 2  # no image at all: one line
    assert (
        capsys.readouterr().err
        == f"error: cannot read image {tmp_path / 'nope.jpg'}: no such file\n"
    )
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"not a jpeg")
    assert predict_main([str(broken), *argv[1:], "--overwrite"]) == 1
    assert output.read_text() == "path,label,probability\nkept.jpg,a,0.9\n"
    err = capsys.readouterr().err
    assert f"--output {output} was not written" in err and "broken.jpg" in err


# -- 4, 7, 8, 9. values refused when the flags are read ------------------------------------------
BAD_VALUES = [
    ("--epochs", "0", "an integer >= 1"),
    ("--epochs", "-1", "an integer >= 1"),
    ("--train-subset", "0", "an integer >= 1"),
    ("--test-subset", "0", "an integer >= 1"),
    ("--batch-size", "0", "an integer >= 1"),
    ("--workers", "-1", "an integer >= 0"),
    ("--img-size", "0", "an integer >= 1"),
    ("--drop-path", "1.5", "a number in [0, 1)"),
    ("--drop", "1", "a number in [0, 1)"),
    ("--patch-drop", "-0.1", "a number in [0, 1)"),
    ("--label-smoothing", "1", "a number in [0, 1)"),
    ("--mixup", "-1", "a number >= 0"),
    ("--cutmix", "-0.5", "a number >= 0"),
    ("--mixup-prob", "1.1", "a number in [0, 1]"),
    ("--mixup-switch-prob", "-0.1", "a number in [0, 1]"),
    ("--reprob", "1.5", "a number in [0, 1]"),
    ("--hflip", "2", "a number in [0, 1]"),
    ("--rrc-scale", "0", "a number in (0, 1]"),
    ("--aa-n", "-1", "an integer >= 0"),
    ("--lr", "0", "a number > 0"),
    ("--lr", "inf", "a number > 0"),
    ("--lr", "nan", "a number > 0"),
    ("--min-lr", "-0.001", "a number >= 0"),
    ("--weight-decay", "-0.05", "a number >= 0"),
    ("--warmup-epochs", "-1", "a number >= 0"),
    ("--clip-grad", "-1", "a number >= 0"),
    ("--model-ema-decay", "1.5", "a number in [0, 1]"),
    ("--progressive-size", "0", "an integer >= 1"),
    ("--progressive-epochs", "0", "a number > 0"),
    ("--threads", "0", "an integer >= 1"),
    ("--eval-interval", "0", "an integer >= 1"),
    ("--processes", "0", "an integer >= 1"),
]


@pytest.mark.parametrize(("flag", "value", "accepted"), BAD_VALUES, ids=lambda v: str(v))
def test_out_of_range_flags_are_refused_naming_the_flag_and_range(
    image_folder, tmp_path, train_script, tiny_args, capsys, flag, value, accepted
):
    run = tmp_path / "run"
    err = refused(train_script, tiny_args(image_folder, run, 2, flag, value), capsys)
    assert err.startswith(f"train.py: error: {flag} {value}") and f"accepted: {accepted}" in err
    assert not run.exists()


def test_out_of_range_yaml_values_are_refused(tmp_path, train_script, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("drop_path: 1.5\n")
    err = refused(train_script, ["--config", str(config)], capsys)
    assert "--drop-path 1.5" in err and "[0, 1)" in err


def test_settings_at_odds_with_each_other_are_refused(
    image_folder, tmp_path, train_script, tiny_args, capsys
):
    args = tiny_args(image_folder, tmp_path / "run", 2)
    err = refused(train_script, args + ["--min-lr", "1e-2"], capsys)
    assert "--min-lr 0.01 is above --lr 0.003" in err
    err = refused(train_script, args + ["--warmup-epochs", "2"], capsys)
    assert "--warmup-epochs 2.0 is not shorter than --epochs 2" in err
    float16 = ["--graph-update", "--amp", "--amp-dtype", "float16"]
    err = refused(train_script, args + float16, capsys)
    assert "--graph-update with --amp-dtype float16" in err and "bfloat16" in err
    err = refused(train_script, args + ["--graph-step", "--amp", "--amp-dtype", "float16"], capsys)
    assert "--graph-step with --amp-dtype float16" in err and "bfloat16" in err
    nested = ["--graph-step", "--compile", "--compile-mode", "reduce-overhead"]
    err = refused(train_script, args + nested, capsys)
    assert "--graph-step with --compile-mode reduce-overhead" in err
    assert "use --compile-mode default" in err
    err = refused(train_script, args + ["--graph-update", "--opt", "momentum"], capsys)
    assert "--graph-update with --opt momentum: the graph captures AdamW's and Muon's" in err
    err = refused(train_script, args + ["--graph-update", "--opt", "lion"], capsys)
    assert "--graph-update with --opt lion: the graph captures AdamW's and Muon's" in err
    err = refused(train_script, args + ["--opt", "sgd", "--momentum", "0"], capsys)  # torch's error
    assert "--opt sgd is SGD with Nesterov momentum, which needs a --momentum above 0" in err
    err = refused(train_script, args + ["--opt", "sgd", "--momentum", "1"], capsys)
    assert "--momentum 1.0" in err and "[0, 1)" in err
    for flag in (["--patch-embed-init", "whiten"], ["--mimetic-init"], ["--pos-embed", "sincos"]):
        # the last two were ignored with --pretrained, without a word (config.yaml saying them)
        err = refused(train_script, args + [*flag, "--pretrained"], capsys)
        assert f"{' '.join(flag)} starts a model from scratch" in err
        assert "leave out one of the two" in err
    err = refused(train_script, args + ["--teacher-channel-mult", "1", "0", "4"], capsys)
    assert "--teacher-channel-mult 1 0 4: the teacher has three stages" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("value", ["0", "-3"])
def test_evaluate_subset_below_one_is_refused(evaluate_script, image_folder, tmp_path, capsys,
                                              value):  # fmt: skip
    argv = ["--checkpoint", str(tmp_path), "--data", str(image_folder), "--subset", value]
    with pytest.raises(SystemExit) as exit_info:
        evaluate_script.main(argv)
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1
    assert f"argument --subset: {value} is outside the accepted range: an integer >= 1" in err


@pytest.mark.parametrize(("flag", "value"), [("--batch-size", "0"), ("--workers", "-1")])
def test_evaluate_batch_size_and_workers_are_checked(evaluate_script, tmp_path, capsys, flag,
                                                     value):  # fmt: skip
    with pytest.raises(SystemExit):
        evaluate_script.main(["--checkpoint", "x", "--data", "y", flag, value])
    assert f"argument {flag}: {value} is outside the accepted range" in capsys.readouterr().err


# -- 5. a failed start leaves nothing behind -------------------------------------------------------
def test_missing_data_leaves_no_run_folder(tmp_path, train_script, tiny_args, capsys):
    run = tmp_path / "run"
    assert train_script.main(tiny_args(tmp_path / "missing", run, 1)) == 2
    assert "neither one of cifar10, cifar100" in capsys.readouterr().err
    assert not run.exists()


def test_splits_with_other_classes_name_the_classes_that_differ(
    make_images, tmp_path, train_script, tiny_args, capsys
):
    """The classes only one split has, not both lists (2 x 1,000 names for ImageNet)."""
    data = make_images(tmp_path / "data")
    make_images(tmp_path / "extra", classes=("dog",), train_per_class=0)
    (tmp_path / "extra" / "test" / "dog").rename(data / "test" / "dog")
    run = tmp_path / "run"
    assert train_script.main(tiny_args(data, run, 1)) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == (
        f"train.py: error: --data {data}: the train and test splits have different classes "
        f"(only in test/: dog); give both splits the same class folders"
    )
    assert not run.exists()


def test_a_run_folder_inside_the_data_is_refused(make_images, tmp_path, train_script, tiny_args,
                                                 capsys):  # fmt: skip
    """--output-dir DATA/train/cat was taken: the next run on DATA read curves.png as a cat (201
    images of 200), and with DATA/train, tensorboard/ became a class without images."""
    data = make_images(tmp_path / "data")
    for inside in (data / "train" / "red", data / "train"):
        assert refused(train_script, tiny_args(data, inside, 1), capsys) == (
            f"train.py: error: --output-dir {inside} is inside --data {data}: the next run on "
            f"that folder would read this run's files (curves.png, tensorboard/) as its images "
            f"or classes; choose a folder outside it"
        )
    assert sorted(p.name for p in (data / "train").iterdir()) == ["blue", "green", "red"]


def test_home_in_a_flag_after_an_equals_sign_is_the_home_folder(
    image_folder, tmp_path, train_script, tiny_args, monkeypatch
):
    """`--output-dir=~/run`: the shell expands no ~ there, and a folder named "~" was made in
    the current one (a config file's ~ was already expanded)."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    args = [a for a in tiny_args(image_folder, tmp_path / "x", 1) if a not in ("--output-dir",)]
    args.remove(str(tmp_path / "x"))
    assert train_script.main([*args, "--output-dir=~/run"]) == 0
    assert (tmp_path / "home" / "run" / "config.yaml").is_file()
    assert not (tmp_path / "~").exists()


def test_a_run_folder_named_like_a_flag_is_continued_by_the_command_given(train_script):
    """`--resume -run` is read as a flag without its folder; the advice says ./-run."""
    assert train_script.resume_command("-run", 1).endswith("--resume ./-run")
    assert train_script.resume_command("runs/a b", 1).endswith("--resume 'runs/a b'")


def test_a_run_folder_that_cannot_be_written_is_refused_before_resuming(
    image_folder, tmp_path, train_script, tiny_args, monkeypatch, capsys
):
    """A run folder on a read-only mount: a traceback from its lock file (OSError 30)."""
    run = tmp_path / "run"
    assert train_script.main(tiny_args(image_folder, run, 1)) == 0
    access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != run and access(path, mode))
    capsys.readouterr()
    assert refused(train_script, ["--resume", str(run), "--epochs", "2"], capsys) == (
        f"train.py: error: --resume {run}: cannot write there ({run} is not a writable folder)"
    )


def test_an_unwritable_default_cache_names_the_way_out(
    image_folder, tmp_path, train_script, tiny_args, monkeypatch, capsys
):
    """A read-only home folder: "--cache-dir ~/.cache/vit: cannot write there" named a flag
    the user never gave and no way on."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != home and access(path, mode))
    args = tiny_args(image_folder, tmp_path / "run", 1)
    at = args.index("--cache-dir")
    del args[at : at + 2]  # the default, ~/.cache/vit
    err = refused(train_script, args, capsys)
    assert err.endswith("is not a writable folder); give another --cache-dir, or --cache-dir none")


def test_an_unwritable_default_report_folder_names_the_way_out(
    onnx_exports, image_folder, tmp_path, monkeypatch, capsys
):
    """evaluate.py's default folder (./eval-NAME-DATA here) where it cannot write: the line
    named a flag the user never gave, and no way on."""
    from vit.evaluate import main as evaluate_main

    monkeypatch.chdir(tmp_path)
    access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != Path(".") and
                        Path(path) != tmp_path and access(path, mode))  # fmt: skip
    with pytest.raises(SystemExit) as refused_exit:
        evaluate_main(["--checkpoint", str(onnx_exports / "tiny.safetensors"), "--data",
                       str(image_folder)])  # fmt: skip
    assert refused_exit.value.code == 2
    assert capsys.readouterr().err.strip().endswith("; give an --output-dir")


def test_a_full_disk_stops_an_evaluation_in_one_line(
    onnx_exports, image_folder, tmp_path, monkeypatch, capsys
):
    """ "No space left on device" was a traceback, torch.save's words "iostream error"."""
    import errno

    import vit.evaluate as command

    def full(args, out_dir, json_path):
        raise OSError(errno.ENOSPC, "No space left on device", str(json_path))

    monkeypatch.setattr(command, "run", full)
    report = tmp_path / "r.json"
    argv = ["--checkpoint", str(onnx_exports / "tiny.safetensors"), "--data", str(image_folder)]
    assert command.main([*argv, "--json", str(report), "--output-dir", str(tmp_path)]) == 1
    assert capsys.readouterr().err.strip() == (
        f"{command.PROG}: stopped: No space left on device: {report}; {report} not written"
    )


def test_a_report_and_its_matrix_are_replaced_together_or_not_at_all(
    onnx_exports, image_folder, tmp_path, monkeypatch
):
    """The matrix was put in place before the report was written: a full disk at the report
    left the old report beside the new model's matrix."""
    import vit.evaluate as command

    other = tmp_path / "other.safetensors"
    shutil.copy(onnx_exports / "tiny.safetensors", other)
    report = tmp_path / "r.json"
    argv = ["--data", str(image_folder), "--json", str(report), "--output-dir", str(tmp_path)]
    assert command.main(["--checkpoint", str(onnx_exports / "tiny.safetensors"), *argv]) == 0
    kept = {path: path.read_bytes() for path in (report, command.confusion_png(report))}

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device", str(report))

    monkeypatch.setattr(command.json, "dumps", full_disk)
    assert command.main(["--checkpoint", str(other), *argv, "--overwrite"]) == 1
    assert {path: path.read_bytes() for path in kept} == kept  # the other model's: neither


def test_unknown_model_kwargs_key_leaves_no_run_folder(
    image_folder, tmp_path, train_script, tiny_args, capsys
):
    run = tmp_path / "run"
    args = tiny_args(image_folder, run, 1) + ["--model-kwargs", "depht=2"]
    assert train_script.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("train.py: error: --model-kwargs: unknown override(s) ['depht']")
    assert not run.exists()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--pretrained", "nope.safetensors"), "weights file not found: nope.safetensors"),
        (("--model", "vit_nope"), "--model vit_nope: unknown model name 'vit_nope'"),
        (("--img-size", "3"), "--img-size 3: img_size height 3 is smaller than patch_size"),
        (
            ("--model-kwargs", "depth=abc"),
            "--model-kwargs: depth 'abc': transformer blocks; accepted: an integer >= 1",
        ),
        (
            ("--model-kwargs", "depth=-1"),  # trained a model of no blocks
            "--model-kwargs: depth -1: transformer blocks; accepted: an integer >= 1",
        ),
        (
            ("--model-kwargs", "mlp_ratio=-2"),  # a traceback: a negative tensor size
            "--model-kwargs: mlp_ratio -2: MLP width / embed_dim; accepted: a number > 0",
        ),
        (
            ("--model-kwargs", "embed_dim=0"),  # a traceback: ZeroDivisionError
            "--model-kwargs: embed_dim 0: token width; accepted: an integer >= 1",
        ),
        (
            ("--model-kwargs", "patch_size=40"),  # blamed on --model before
            "--model-kwargs: img_size height 32 is smaller than patch_size height 40",
        ),
        (
            ("--batch-augment", "--aa", "none", "--progressive-size", "64"),
            "--progressive-size 64 is larger than the model's input size 32",
        ),
        (
            ("--batch-augment", "--aa", "none", "--progressive-size", "18"),  # 16 without a word
            "--progressive-size 18: the images grow in whole 4-pixel patches of the model's; "
            "give a multiple of 4 (16 or 20)",
        ),
    ],
    ids=[
        "missing-weights",
        "unknown-model",
        "img-size",
        "kwarg-type",
        "kwarg-depth",
        "kwarg-mlp-ratio",
        "kwarg-embed-dim",
        "kwarg-patch-size",
        "progressive-size",
        "progressive-size-patches",
    ],
)
def test_settings_found_wrong_at_start_leave_no_run_folder(
    image_folder, tmp_path, train_script, tiny_args, capsys, flags, message
):
    run = tmp_path / "run"
    assert train_script.main(tiny_args(image_folder, run, 1, *flags)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"train.py: error: {message}"), err
    assert not run.exists()


def test_offline_pretrained_is_one_line_naming_the_flag(
    image_folder, tmp_path, train_script, tiny_args, capsys, monkeypatch
):
    """train.py --pretrained without network or cached weights: one line advising the flag
    spelling (--pretrained PATH, not Python's pretrained=PATH), no traceback, no run folder."""
    import vit.factory.timm_weights

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(vit.factory.timm_weights, "_cached_timm_weights", lambda full_name: None)
    run = tmp_path / "run"
    flags = ("--model", "vit_tiny_patch16_224", "--pretrained", "--img-size", "32")
    assert train_script.main(tiny_args(image_folder, run, 1, *flags)) == 2
    err = capsys.readouterr().err
    assert err == (
        "train.py: error: --pretrained: cannot download the pretrained weights of "
        "vit_tiny_patch16_224.augreg_in21k_ft_in1k: HF_HUB_OFFLINE is set, and they are not in "
        "the Hugging Face cache; pass --pretrained PATH to a local weights file instead\n"
    )
    assert not run.exists()


def test_cache_dir_that_is_a_file_is_refused(image_folder, tmp_path, train_script, tiny_args,
                                             capsys):  # fmt: skip
    file = tmp_path / "cache"
    file.write_text("a file")
    args = tiny_args(image_folder, tmp_path / "run", 1) + ["--cache-dir", str(file)]
    assert f"--cache-dir {file}: exists and is not a folder" in refused(train_script, args, capsys)


def test_typo_in_yaml_key_leaves_no_run_folder(tmp_path, train_script, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("learning_rate: 0.1\n")
    run = tmp_path / "run"
    assert train_script.main(["--config", str(config), "--output-dir", str(run)]) == 2
    assert "unknown key 'learning_rate'" in capsys.readouterr().err
    assert not run.exists()


def test_divergence_in_the_first_epoch_says_no_checkpoint_exists(
    image_folder, tmp_path, train_script, tiny_args, monkeypatch, capsys
):
    def diverged(self, x, pre_logits=False):
        return x[:, 0, : self.num_classes] * float("nan")

    monkeypatch.setattr(VisionTransformer, "forward_head", diverged)
    run = tmp_path / "run"
    assert train_script.main(tiny_args(image_folder, run, 1)) == 1
    err = capsys.readouterr().err
    assert "loss became nan at epoch 1, step 1/" in err
    assert "No checkpoint was written" in err and "is kept" not in err
    assert not (run / "training_state.pt").exists()


# -- 6, 11. --resume of what cannot be resumed -----------------------------------------------------
@pytest.mark.parametrize("damage", ["truncated", "random bytes", "not a state"])
def test_resume_from_a_damaged_state_is_one_line_and_changes_nothing(
    finished_run, tmp_path, train_script, capsys, damage
):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    state = run / "training_state.pt"
    if damage == "truncated":
        state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
    elif damage == "random bytes":
        state.write_bytes(os.urandom(4096))
    else:
        torch.save({"epoch": 1}, state)
    before = snapshot(run)
    assert train_script.main(["--resume", str(run), "--epochs", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{state}" in err, err
    assert "weights_only=False" not in err
    assert snapshot(run) == before


def test_resume_with_another_architecture_is_one_line(finished_run, tmp_path, train_script, capsys):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["model_kwargs"]["depth"] = 3  # the state no longer fits the run's settings
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    before = snapshot(run)
    assert train_script.main(["--resume", str(run), "--epochs", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "does not fit the model" in err, err
    assert snapshot(run) == before


def test_resume_without_a_checkpoint_is_refused_and_writes_nothing(tmp_path, train_script, capsys):
    run = tmp_path / "killed-early"
    run.mkdir()
    (run / "config.yaml").write_text("epochs: 3\n")
    err = refused(train_script, ["--resume", str(run)], capsys)
    assert f"--resume {run}: no checkpoint there" in err
    assert f"--output-dir {run} --overwrite" in err
    assert snapshot(run) == {"config.yaml": b"epochs: 3\n"}


def test_resume_into_another_output_dir_is_refused(finished_run, tmp_path, train_script, capsys):
    other = tmp_path / "other"
    err = refused(train_script, ["--resume", str(finished_run), "--output-dir", str(other)], capsys)
    assert "continues in its own folder" in err and not other.exists()


def test_resume_with_overwrite_is_refused(finished_run, train_script, capsys):
    err = refused(train_script, ["--resume", str(finished_run), "--overwrite"], capsys)
    assert "--overwrite would start anew" in err


def test_default_run_folders_never_share_a_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(build.time, "strftime", lambda _: "20260101-000000")
    cfg = TrainConfig(data="some/folder/")
    first = build.default_run_dir(cfg, DistInfo())
    assert first == "runs/vit_cifar_patch4_32-folder-20260101-000000"
    Path(first).mkdir(parents=True)
    assert build.default_run_dir(cfg, DistInfo()) == f"{first}-2"


def test_output_dir_that_is_a_file_is_refused(image_folder, tmp_path, train_script, tiny_args,
                                              capsys):  # fmt: skip
    file = tmp_path / "run"
    file.write_text("a file")
    err = refused(train_script, tiny_args(image_folder, file, 1), capsys)
    assert f"--output-dir {file}: exists and is not a folder" in err


@pytest.mark.parametrize("device", ["gpu0", "cuda:0", "mps", "xpu"])
def test_bad_or_missing_device_is_one_line(evaluate_script, finished_run, image_folder, device,
                                           capsys):  # fmt: skip
    if device.startswith("cuda") and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    if device == "mps" and torch.backends.mps.is_available():
        pytest.skip("this machine has MPS")
    argv = ["--checkpoint", str(finished_run), "--data", str(image_folder), "--device", device,
            "--output-dir", str(finished_run / "unused")]  # fmt: skip
    assert evaluate_script.main(argv) == 2
    assert f"--device {device}:" in capsys.readouterr().err
    assert not (finished_run / "unused").exists()


# -- 10. files that are not checkpoints --------------------------------------------------------
def test_random_bytes_are_not_a_checkpoint_and_no_unsafe_advice(tmp_path):
    """torch.load fails on random bytes in several ways (an UnpicklingError that advises
    weights_only=False, an IndexError, ...): each is "not a checkpoint"."""
    path = tmp_path / "weights.pth"
    model = VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2)
    for seed in range(30):
        path.write_bytes(np.random.default_rng(seed).bytes(3000))
        with pytest.raises(ValueError) as info:
            vit.load_weights(model, path)
        message = str(info.value)
        assert message.startswith(f"cannot read {path}: not a checkpoint"), (seed, message)
        assert "refused" not in message and "weights_only=False" not in message


def test_a_pickle_with_code_is_named_unsafe_without_unsafe_advice(tmp_path):
    path = tmp_path / "evil.pth"
    torch.save({"weight": torch.zeros(2), "hook": print}, path)
    with pytest.raises(ValueError) as info:
        vit.interop.weights.read_checkpoint(path)
    message = str(info.value)
    assert "refused to load" in message and "builtins.print" in message
    assert "weights_only=False" not in message


# -- outputs: where they go and what is said about them -------------------------------------------
def test_evaluate_of_a_bare_weights_file_writes_to_the_working_folder(
    finished_run, image_folder, tmp_path, evaluate_script, monkeypatch, capsys
):
    weights = tmp_path / "weights"
    weights.mkdir()
    shutil.copy(finished_run / "model.safetensors", weights / "cifar_vit.safetensors")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    argv = ["--checkpoint", str(weights / "cifar_vit.safetensors"), "--data", str(image_folder),
            "--workers", "0", "--device", "cpu"]  # fmt: skip
    assert evaluate_script.main(argv) == 0
    assert [p.name for p in weights.iterdir()] == ["cifar_vit.safetensors"]  # nothing added
    out = Path(f"eval-cifar_vit-{image_folder.name}")
    assert {p.name for p in (work / out).iterdir()} == {"confusion_matrix.png", "report.json"}
    err = capsys.readouterr().err
    assert f"evaluate.py: wrote {out / 'confusion_matrix.png'} and {out / 'report.json'}" in err
    assert "\r" not in err and "it/s" not in err  # no progress bar when stderr is not a terminal


def test_evaluate_outputs_of_different_evaluations_do_not_share_a_folder(
    finished_run, tmp_path, evaluate_script
):
    where = evaluate_script.default_output_dir
    data = "../data/cifar10-jpg/"
    assert where(str(finished_run), data) == finished_run / "eval-cifar10-jpg"
    assert where(str(finished_run / "model.safetensors"), data) == finished_run / "eval-cifar10-jpg"
    best = finished_run / "best.safetensors"
    assert where(str(best), data) == finished_run / "eval-best-cifar10-jpg"
    assert where(str(finished_run), data, "train") == finished_run / "eval-cifar10-jpg-train"
    bare = tmp_path / "weights" / "vit.safetensors"
    bare.parent.mkdir()
    shutil.copy(best, bare)
    assert where(str(bare), "cifar10") == Path("eval-vit-cifar10")  # not weights/
    assert where("vit_tiny_patch16_224", "imagenet") == Path("eval-vit_tiny_patch16_224-imagenet")
    downloaded = tmp_path / "vit-base-hf"  # a transformers folder is not written into
    downloaded.mkdir()
    (downloaded / "config.json").write_text("{}")
    (downloaded / "model.safetensors").write_bytes(b"")
    assert where(str(downloaded), "cifar10") == Path("eval-vit-base-hf-cifar10")
    assert where(str(downloaded / "model.safetensors"), "cifar10") == Path("eval-model-cifar10")


def test_evaluate_pretrained_with_a_run_folder_is_refused(
    finished_run, image_folder, tmp_path, evaluate_script, capsys
):
    argv = ["--checkpoint", str(finished_run), "--pretrained", "other.safetensors", "--data",
            str(image_folder), "--output-dir", str(tmp_path / "out")]  # fmt: skip
    assert evaluate_script.main(argv) == 2
    assert "--pretrained other.safetensors goes with a model name" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_evaluate_refuses_an_unwritable_report_before_any_work(
    finished_run, image_folder, tmp_path, evaluate_script, capsys
):
    argv = ["--checkpoint", str(finished_run), "--data", str(image_folder), "--json",
            str(tmp_path)]  # fmt: skip
    with pytest.raises(SystemExit):
        evaluate_script.main(argv)
    assert f"--json {tmp_path}: is a folder; give a file name" in capsys.readouterr().err


def test_predict_accepts_a_run_folder(finished_run, image_folder, capsys):
    image = next((image_folder / "test" / "red").iterdir())
    assert predict_main([str(image), "--checkpoint", str(finished_run), "--top-k", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == str(image) and out[1].strip().endswith(("blue", "green", "red"))


SHIP = "../shared/data/cifar10-jpg/test/ship/0001.jpg"  # from the repository root


@pytest.mark.skipif(not (ROOT / SHIP).is_file(), reason=f"{SHIP} is not there")
def test_readme_predict_example_is_what_predict_prints(monkeypatch, capsys, one_thread):
    monkeypatch.chdir(ROOT)
    argv = [SHIP, "--checkpoint", "weights/cifar10_vit_cpu.safetensors", "--top-k", "3"]
    assert predict_main(argv) == 0
    printed = capsys.readouterr().out
    example = f"$ python -m vit.predict {' '.join(argv)}\n{printed}```"
    assert example in (ROOT / "README.md").read_text()


def test_export_tolerance_is_checked(capsys):
    from vit.export import main as export_main

    with pytest.raises(SystemExit):
        export_main(["vit_tiny_patch16_224", "--onnx", "x.onnx", "--tolerance", "-1"])
    err = capsys.readouterr().err.strip()
    assert err == (
        "python -m vit.export: error: argument --tolerance: -1 is outside the accepted range: "
        "a number >= 0"
    )


def test_predict_flag_errors_are_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        predict_main([str(tmp_path), "--model", "vit_tiny_patch16_224", "--top-k", "0"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip() == (
        "python -m vit.predict: error: --top-k must be at least 1, got 0"
    )


# -- defaults picked from the machine, warnings ------------------------------------------------
def test_default_workers_follow_the_cores(monkeypatch):
    from vit.data.workers import default_workers

    for cores, workers in ((1, 0), (2, 1), (3, 2), (64, 4)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda _, n=cores: set(range(n)))
        assert default_workers() == workers
    assert TrainConfig().workers <= max(0, (os.cpu_count() or 1) - 1)


def test_float16_autocast_on_cpu_warns(monkeypatch, caplog):
    monkeypatch.setattr(engine, "_train", lambda *args: {})
    cfg = TrainConfig(amp=True, amp_dtype="float16", device="cpu")
    with caplog.at_level("WARNING", logger="vit"):
        engine.train(cfg)
    assert "--amp --amp-dtype float16 on a CPU" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="vit"):
        engine.train(TrainConfig(amp=True, amp_dtype="bfloat16", device="cpu"))
    assert "float16 on a CPU" not in caplog.text


# -- start-up cost ---------------------------------------------------------------------------------
def run_python(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.strip()


def test_import_vit_and_train_help_do_not_import_torch():
    code = (
        "import sys, runpy\n"
        "import vit\n"
        "print('torch' in sys.modules)\n"
        "sys.argv = ['train.py', '--help']\n"
        "try:\n"
        "    runpy.run_path('train.py', run_name='__main__')\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('torch' in sys.modules, 'torchvision' in sys.modules)\n"
    )
    lines = run_python(code).splitlines()
    assert lines[0] == "False" and lines[-1] == "False False"
    # the names still work, on first use, and create_model does not need torchvision
    code = (
        "import sys, vit\n"
        "m = vit.create_model('vit_cifar_patch4_32', depth=1, embed_dim=32, num_heads=2)\n"
        "print(type(m).__name__, 'torchvision' in sys.modules,"
        " vit.utils.files.atomic_write.__name__)\n"
    )
    assert run_python(code) == "VisionTransformer False atomic_write"


@pytest.mark.parametrize(
    "command, run, answered",
    [
        ("train.py", "runpy.run_path('train.py', run_name='__main__')", ["--help"]),
        *[
            (command, run, ["--help", "--no-such-flag"])
            for command, run in (
                ("evaluate.py", "runpy.run_path('evaluate.py', run_name='__main__')"),
                ("python -m vit.predict", "runpy.run_module('vit.predict', run_name='__main__')"),
                ("python -m vit.export", "runpy.run_module('vit.export', run_name='__main__')"),
                (
                    "python -m vit.benchmark",
                    "runpy.run_module('vit.benchmark', run_name='__main__')",
                ),
            )
        ],
    ],
)
def test_every_command_answers_help_before_importing_torch(command, run, answered):
    """--help (and, but for train.py, which reads a resumed run's settings first, a flag
    argparse refuses) is answered before torch is imported (torch alone takes seconds): what
    `python -m vit.predict --help` & co run, as a script or module."""
    for flag in answered:
        result, torch_loaded = run_before_torch(run, [command.split()[-1], flag], ROOT)
        assert ("usage:" if flag == "--help" else "error:") in result.stdout + result.stderr
        assert not torch_loaded, (command, flag)


def run_before_torch(run: str, argv: list[str], cwd: Path):
    """Run the statement `run` (a runpy call) with `argv` in a new interpreter: its result, and
    whether torch was imported by the time it exited."""
    code = (
        "import runpy, sys\n"
        f"sys.argv = {argv!r}\n"
        "try:\n"
        f"    {run}\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('torch' in sys.modules)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result, result.stdout.strip().splitlines()[-1] == "True"


SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_every_console_script_answers_help_and_mistakes_before_importing_torch(script, tmp_path):
    """`vit-predict --help` took 3.3 s where `python -m vit.predict --help` took 0.07 s: the
    console script imports the module, torch with it, before it calls main(), so the early
    answer under `if __name__ == "__main__"` never ran; and the usage line said `python -m
    vit.predict`. Run as pip writes it, each console script answers --help and a bad flag
    before torch is imported, under its own name."""
    wrapper = tmp_path / script
    wrapper.write_text(CONSOLE_SCRIPT.format(module=SCRIPTS[script].split(":")[0]))
    run = f"runpy.run_path({str(wrapper)!r}, run_name='__main__')"
    for flag in ("--help", "--no-such-flag"):
        result, torch_loaded = run_before_torch(run, [str(wrapper), flag], tmp_path)
        if flag == "--help":
            assert result.stdout.startswith(f"usage: {script} "), result.stdout
        else:
            assert result.stderr.startswith(f"{script}: error: "), result.stderr
        assert not torch_loaded, (script, flag)


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_every_console_scripts_help_names_commands_a_pip_install_has(script, tmp_path):
    """`vit-benchmark --help` said CHECKPOINT is read as evaluate.py reads it, `vit-predict
    --help` that it is a train.py run folder: files of a checkout, which a pip install does not
    have. The help of each console script names train.py and evaluate.py only as a
    checkout's."""
    wrapper = tmp_path / script
    wrapper.write_text(CONSOLE_SCRIPT.format(module=SCRIPTS[script].split(":")[0]))
    run = f"runpy.run_path({str(wrapper)!r}, run_name='__main__')"
    result, _ = run_before_torch(run, [str(wrapper), "--help"], tmp_path)
    lines = result.stdout.splitlines()
    assert len(lines) > 10 and lines[0].startswith(f"usage: {script} ")
    named = [line for line in lines if re.search(r"\b(train|evaluate)\.py\b", line)]
    assert [line for line in named if "checkout" not in line] == []
