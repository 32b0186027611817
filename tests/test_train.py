"""train.py end to end on tiny real image files: run folder, config layering, resume, NaN."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from conftest import (
    assert_close_weights,
    assert_resumes_exactly,
    read_rows,
    stop_after_first_save,
)

import vit
import vit.training.checkpoint as checkpoint
import vit.training.settings as settings
from vit.models.vision_transformer import VisionTransformer
from vit.training.optimizers import param_groups
from vit.training.run_log import RunLog
from vit.training.schedule import warmup_cosine

ROOT = Path(__file__).resolve().parents[1]
RUN_FILES = (
    "config.yaml",
    "metrics.csv",
    "curves.png",
    "training_state.pt",
    "model.safetensors",
    "best.safetensors",
)
# Every stochastic part of the recipe on: RandAugment, erasing, MixUp/CutMix, stochastic
# depth, EMA. Resuming must restore all of their random streams to match exactly.
RECIPE = ("--drop-path", "0.1", "--mixup", "0.8", "--cutmix", "1.0", "--reprob", "0.5")


def no_temporary_files(run: Path) -> bool:
    return not [p for p in run.rglob("*") if p.name.endswith(".tmp")]


@pytest.fixture(scope="module")
def reference_run(image_folder, tmp_path_factory, train_script, tiny_args) -> Path:
    """4 uninterrupted epochs of the full recipe: what every resumed run must reproduce."""
    run = tmp_path_factory.mktemp("reference") / "run"
    assert train_script.main(tiny_args(image_folder, run, 4, *RECIPE)) == 0
    return run


def test_run_folder_is_complete_and_loadable(reference_run):
    run = reference_run
    for name in RUN_FILES:
        assert (run / name).is_file(), name
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    assert no_temporary_files(run)

    rows = read_rows(run / "metrics.csv")
    assert [int(r["epoch"]) for r in rows] == [1, 2, 3, 4]
    for row in rows:
        assert 0 <= float(row["test_top1"]) <= float(row["test_top5"]) <= 1
        assert float(row["train_images_per_s"]) > 0
        assert 0 < float(row["data_seconds"]) < float(row["epoch_seconds"])  # the loader's share
    # 3 colour classes: the tiny model learns them well above chance (1/3) in 4 epochs
    assert float(rows[-1]["ema_top1"]) >= 0.6

    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["epochs"] == 4 and config["model_kwargs"]["embed_dim"] == 32
    assert config["mixup"] == 0.8 and config["model_ema"] is True

    model = vit.load_model(run / "model.safetensors")  # the file alone rebuilds the model
    assert model.class_names == ["blue", "green", "red"]
    assert model.config.depth == 2 and model.num_classes == 3
    metadata = vit.interop.weights.read_metadata(run / "model.safetensors")
    assert metadata["vit.weights"] == "ema" and metadata["vit.epoch"] == 4
    assert metadata["vit.top1"] == pytest.approx(float(rows[-1]["ema_top1"]))
    best = vit.interop.weights.read_metadata(run / "best.safetensors")
    assert best["vit.top1"] == pytest.approx(max(float(r["ema_top1"]) for r in rows))
    ema = [float(r["ema_top1"]) for r in rows]  # chosen by the EMA's top-1, the earlier of a tie
    assert best["vit.weights"] == "ema" and best["vit.epoch"] == 1 + ema.index(max(ema))

    state = torch.load(run / "training_state.pt", weights_only=True)  # no pickled code
    assert state["epoch"] == 4 and len(state["history"]) == 4
    assert {"model", "optimizer", "scheduler", "scaler", "ema", "rng"} <= set(state)


def test_config_yaml_is_overridden_by_flags(tmp_path, train_script):
    config = tmp_path / "c.yaml"
    config.write_text("lr: 1e-3\nepochs: 7\nbatch-size: 16\nmodel_kwargs: {depth: 3}\naa: none\n")
    cfg = train_script.parse_config(["--config", str(config), "--epochs", "3"])
    assert cfg.lr == 1e-3 and isinstance(cfg.lr, float)  # YAML reads 1e-3 as a string
    assert (cfg.epochs, cfg.batch_size, cfg.aa) == (3, 16, "none")
    assert cfg.model_kwargs == {"depth": 3}
    assert cfg.weight_decay == settings.TrainConfig.weight_decay  # untouched default
    cfg = train_script.parse_config(["--config", str(config), "--model-kwargs", "depth=5"])
    assert cfg.model_kwargs == {"depth": 5}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("learning_rate: 0.1\n", "unknown key 'learning_rate'"),
        ("aa: autoaugment\n", "aa must be one of"),
        ("epochs: many\n", "epochs: many; accepted: an integer"),
        # YAML values that are no strings are read as their flag's text would be: 1.5 epochs
        # trained 2, 'no' kept EMA on, hflip: yes flipped every image, null crashed
        ("epochs: 1.5\n", "epochs: 1.5; accepted: an integer"),
        ("epochs: true\n", "epochs: true; accepted: an integer"),
        ("epochs: null\n", "epochs: null; accepted: an integer (this setting has no 'none')"),
        ("model_ema: 'no'\n", "model_ema: 'no'; accepted: true or false"),
        ("hflip: yes\n", "hflip: true; accepted: a number"),
        ("teacher_channel_mult: 1\n", "accepted: a list of 3 items, each an integer"),
        ("model_kwargs: 3\n", "model_kwargs: 3; accepted: a mapping"),
        ("epochs: [1\n", "not YAML: line 2, column 1: expected ',' or ']'"),
        # PyYAML keeps a key's last value without a word; a run trained at the second lr
        ("lr: 0.01\nlr: 0.02\n", "not YAML: line 2, column 1: the key 'lr' is given twice"),
        ("batch-size: 32\nbatch_size: 16\n", "batch_size is given twice"),
        ("batchsize: 8\n", "unknown key 'batchsize'; did you mean batch_size? the keys are"),
        # a run to resume named in a file skipped every check --resume makes
        ("resume: runs/x\n", "resume: runs/x: a config file holds settings; continue a run"),
    ],
)
def test_bad_config_values_are_named(tmp_path, train_script, text, message, capsys):
    config = tmp_path / "c.yaml"
    config.write_text(text)
    with pytest.raises(SystemExit, match=re.escape(message)):
        train_script.parse_config(["--config", str(config)])
    assert train_script.main(["--config", str(config)]) == 2  # argparse's status, one line
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_a_config_files_paths_start_at_home_as_a_shells_do(tmp_path, train_script, monkeypatch):
    """`output_dir: ~/runs/tiny` trained into ./~/runs/tiny (a folder named ~, one rm -rf away
    from the home folder); --data ~/images was 'neither cifar10 nor a folder'."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    config = tmp_path / "c.yaml"
    config.write_text("data: ~/images\noutput_dir: ~/runs/tiny\ncache_dir: ~/cache\n")
    cfg = train_script.parse_config(["--config", str(config)])
    home = tmp_path / "home"
    assert (cfg.data, cfg.output_dir) == (str(home / "images"), str(home / "runs" / "tiny"))
    assert cfg.cache_path == home / "cache"


@pytest.mark.parametrize(
    ("text", "flags", "said"),
    [
        ("epochs: -3\n", [], "--epochs -3: training epochs; accepted: an integer >= 1"),
        ("warmup_epochs: 5\n", ["--epochs", "2"], "--warmup-epochs 5.0 is not shorter than"),
        ("epochs: 3\n", ["--epochs", "-3"], "--epochs -3: training epochs"),  # the flag's
    ],
    ids=["from the file", "from the file, beside a flag", "from a flag"],
)
def test_a_value_out_of_range_names_the_file_that_set_it(
    tmp_path, train_script, capsys, text, flags, said
):
    config = tmp_path / "c.yaml"
    config.write_text(text)
    with pytest.raises(SystemExit) as refused:
        train_script.main(["--config", str(config), *flags])
    err = capsys.readouterr().err
    assert refused.value.code == 2 and err.count("\n") == 1 and said in err, err
    from_file = said.split()[0] not in flags
    assert err.endswith(f"(set in {config})\n") == from_file, err


@pytest.mark.parametrize(
    ("item", "instead"),
    [
        ("num_classes=100", "the number of classes is the data's"),
        ("img_size=64", "the input size is --img-size's"),
        ("pretrained=weights.pth", "the weights are --pretrained's"),
        # given twice (--drop-path's default and the kwarg), the kwarg silently won
        ("drop_path_rate=0.1", "stochastic depth is --drop-path's"),
        ("drop_rate=0.1", "dropout is --drop's"),
        ("patch_drop_rate=0.5", "patch dropout is --patch-drop's"),
    ],
)
def test_model_kwargs_of_create_models_own_arguments_are_named(
    train_script, tmp_path, capsys, item, instead
):
    """They were create_model()'s 'got multiple values for keyword argument' after the data
    was read."""
    with pytest.raises(SystemExit) as refused:
        train_script.main(["--model-kwargs", "depth=1", item])
    err = capsys.readouterr().err
    assert refused.value.code == 2 and err.count("\n") == 1
    assert err.startswith(f"train.py: error: --model-kwargs {item}: {instead}")


def test_model_kwargs_values_are_read_as_timm_reads_them(train_script):
    """As Python literals first (timm's train.py: ast.literal_eval), YAML after: YAML alone
    read 1e-5 as the string '1e-5' (a traceback from torch.full for init_values) and None as
    'None'."""
    items = ["init_values=1e-5", "class_token=False", "qkv_bias=true"]
    items += ["global_pool='avg'", "depth=2", "mlp_ratio=2.5", "act_layer=gelu", "reg_tokens=null"]
    cfg = train_script.parse_config(["--model-kwargs", *items])
    assert cfg.model_kwargs == {
        "init_values": 1e-5, "global_pool": "avg", "class_token": False, "qkv_bias": True,
        "depth": 2, "mlp_ratio": 2.5, "act_layer": "gelu", "reg_tokens": None,
    }  # fmt: skip
    assert train_script.parse_config(["--model-kwargs", "global_pool=None"]).model_kwargs == {
        "global_pool": None
    }


@pytest.mark.parametrize("prefix", ["--output", "--warmup", "--model-ema-d", "--clip"])
def test_a_flag_is_never_taken_from_a_prefix_of_its_name(train_script, capsys, prefix):
    """argparse took timm's --output DIR (a parent of run folders) as --output-dir DIR: the
    run went into DIR itself. A prefix is an unknown flag now."""
    with pytest.raises(SystemExit) as refused:
        train_script.main([prefix, "1"])
    err = capsys.readouterr().err
    assert refused.value.code == 2 and f"unrecognized arguments: {prefix} 1" in err, err


def test_timms_names_for_our_settings_are_named_where_given(tmp_path, train_script, capsys):
    """--smoothing (timm's) was "unrecognized arguments" alone, and a config file's data_dir
    got "did you mean data_root?" (where CIFAR downloads to): each names the setting here."""
    from vit.training.settings import TrainConfig

    known = {f.name for f in dataclasses.fields(TrainConfig)}
    assert {ours.split()[0] for ours in train_script.OTHER_NAMES.values()} <= known
    with pytest.raises(SystemExit):
        train_script.main(["--smoothing", "0.1", "--sched", "cosine", "--data-dir", "d"])
    assert capsys.readouterr().err == (
        "train.py: error: unrecognized arguments: --smoothing 0.1 --sched cosine --data-dir d "
        "(here: --smoothing is --label-smoothing; --data-dir is --data)\n"
    )
    config = tmp_path / "c.yaml"
    config.write_text("data_dir: images\n")
    assert train_script.main(["--config", str(config)]) == 2
    assert "unknown key 'data_dir'; did you mean data? " in capsys.readouterr().err


def test_config_values_are_read_as_their_flags_read_text(tmp_path, train_script):
    config = tmp_path / "c.yaml"
    config.write_text("lr: 1e-3\nmodel_kwargs: depth=2 mlp_ratio=2\nepochs: 3\nhflip: 0\n")
    cfg = train_script.parse_config(["--config", str(config)])
    assert (cfg.lr, cfg.epochs, cfg.hflip) == (0.001, 3, 0.0)
    assert cfg.model_kwargs == {"depth": 2, "mlp_ratio": 2}


def test_a_run_keeps_absolute_paths_and_resumes_from_any_folder(
    tmp_path, train_script, image_folder, monkeypatch
):
    """A run started with a relative --data is continued from another folder, and the same
    folder spelt otherwise (relative, a trailing slash) is no change of --data."""
    shutil.copytree(image_folder, tmp_path / "data" / "images")
    monkeypatch.chdir(tmp_path)
    cfg = train_script.parse_config(["--data", "data/images/", "--output-dir", "run"])
    assert cfg.data == str(tmp_path / "data" / "images")
    assert cfg.data_root == str(tmp_path / "data") and cfg.pretrained is None
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump({"data": "data/images"}))  # a run of before
    (run / "training_state.pt").write_bytes(b"")  # only read once training starts
    same = train_script.parse_config(["--resume", "run", "--data", f"{tmp_path}/data/images/"])
    assert Path(same.data).resolve() == tmp_path / "data" / "images"
    with pytest.raises(SystemExit):  # CIFAR for a folder: other images
        train_script.parse_config(["--resume", "run", "--data", "cifar10"])
    moved = train_script.parse_config(["--resume", "run", "--data", str(image_folder)])
    assert moved.data == str(image_folder)  # a folder for a folder: its classes checked later


def test_shipped_configs_parse(train_script):
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        train_script.parse_config(["--config", str(path)])


def test_resume_takes_the_run_config_and_only_epochs_may_change(tmp_path, train_script, capsys):
    run = tmp_path / "run"
    run.mkdir()
    saved = {"epochs": 2, "lr": 0.01, "data": "x", "batch_size": 32, "amp": True}
    (run / "config.yaml").write_text(yaml.safe_dump(saved))
    (run / "training_state.pt").write_bytes(b"")  # only read once training starts
    cfg = train_script.parse_config(["--resume", str(run), "--epochs", "5"])
    assert (cfg.epochs, cfg.lr, cfg.data, cfg.output_dir) == (5, 0.01, "x", str(run))
    # a setting given again as the run has it, or one that does not change what is learned
    cfg = train_script.parse_config(["--resume", str(run), "--data", "x", "--workers", "3"])
    assert (cfg.batch_size, cfg.workers) == (32, 3)
    config = tmp_path / "recipe.yaml"  # a YAML recipe given again is compared the same way
    config.write_text("lr: 0.02\nbatch_size: 32\n")
    for changes, named in [
        (["--lr", "0.001", "--no-amp"], "--lr 0.001 (the run's: 0.01); --no-amp (the run's: on)"),
        (["--config", str(config)], "--lr 0.02 (the run's: 0.01)"),
        (["--data", "cifar10", "--batch-size", "32"], "--data cifar10 (the run's: x)"),
    ]:
        with pytest.raises(SystemExit) as refused:
            train_script.parse_config(["--resume", str(run), *changes])
        err = capsys.readouterr().err.strip()
        assert refused.value.code == 2 and len(err.splitlines()) == 1, err
        assert f"--resume {run} continues the run with its own settings" in err
        assert f"changes {named}: leave them out" in err


def test_every_setting_is_a_flag_and_every_flag_a_setting(train_script):
    parser = train_script.build_parser()
    flags = {
        option.lstrip("-").replace("-", "_")
        for action in parser._actions  # only this test looks inside argparse
        for option in action.option_strings
        if option.startswith("--") and not option.startswith("--no-")
    }
    assert flags - {"help", "config", "overwrite"} == set(settings.TrainConfig.field_names())
    cfg = train_script.parse_config([])
    assert cfg.data_root == os.path.abspath("data")  # kept absolute for --resume
    cfg.data_root = "data"
    assert cfg == settings.TrainConfig()  # the flags' defaults are the dataclass's


def test_flag_values_keep_their_meaning(train_script, tmp_path):
    parse = train_script.parse_config
    cfg = parse(["--train-subset", "5", "--img-size", "48", "--cache-dir", "none", "--no-cache"])
    assert (cfg.train_subset, cfg.img_size, cfg.cache_dir, cfg.cache) == (5, 48, None, False)
    assert parse(["--test-subset", "none"]).test_subset is None
    assert not parse(["--clip-grad", "0"]).clip_grad  # 0: no clipping
    assert parse(["--clip-grad", "none"]).clip_grad is None
    assert parse(["--pretrained"]).pretrained_weights is True  # timm's weights
    assert parse(["--pretrained", "timm"]).pretrained_weights is True
    assert parse(["--pretrained", "w.safetensors"]).pretrained_weights == "w.safetensors"
    assert parse([]).pretrained_weights is False
    run = tmp_path / "run"  # a train.py run folder means its model.safetensors
    run.mkdir()
    (run / "model.safetensors").write_bytes(b"")
    assert parse(["--pretrained", str(run)]).pretrained_weights == str(run / "model.safetensors")
    cfg = parse(["--model-kwargs", "depth=2", "embed_dim=32", "--no-model-ema", "--amp"])
    assert cfg.model_kwargs == {"depth": 2, "embed_dim": 32}
    assert (cfg.model_ema, cfg.amp, cfg.warmup_epochs, cfg.model_ema_decay) == (
        False,
        True,
        None,
        None,
    )
    with pytest.raises(SystemExit):
        parse(["--amp-dtype", "float8"])


def _interrupt_after_save(monkeypatch, at_epoch: int, mid_save: bool) -> None:
    """Make the save at `at_epoch` end the process like a kill: after the file is complete,
    or (mid_save) halfway through writing its temporary file, before the rename."""
    original = checkpoint.save_training_state

    def save(state: dict, path: Path) -> None:
        if state["epoch"] == at_epoch and mid_save:
            buffer = io.BytesIO()
            torch.save(state, buffer)
            partial = buffer.getvalue()[: len(buffer.getvalue()) // 2]
            (path.parent / f".{path.name}.killed.tmp").write_bytes(partial)
            raise KeyboardInterrupt
        original(state, path)
        if state["epoch"] == at_epoch:
            raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint, "save_training_state", save)


@pytest.mark.parametrize("mid_save", [False, True], ids=["after-save", "during-save"])
def test_killed_run_resumes_to_identical_weights(
    reference_run, image_folder, tmp_path, train_script, tiny_args, monkeypatch, capsys, mid_save
):
    run = tmp_path / "run"
    with monkeypatch.context() as patch:
        _interrupt_after_save(patch, at_epoch=3 if mid_save else 2, mid_save=mid_save)
        assert train_script.main(tiny_args(image_folder, run, 4, *RECIPE)) == 130  # Ctrl-C
    # the last complete checkpoint is epoch 2 either way, and the one line says so
    assert torch.load(run / "training_state.pt", weights_only=True)["epoch"] == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"train.py: interrupted; {run} stopped after epoch 2 of 4 (its last checkpoint): "
        f"continue it with python train.py --resume {run}"
    )
    assert no_temporary_files(run) is not mid_save  # a kill mid-save leaves its temp file

    assert train_script.main(["--resume", str(run)]) == 0
    assert no_temporary_files(run)
    assert_close_weights(run / "model.safetensors", reference_run / "model.safetensors")
    assert_close_weights(run / "best.safetensors", reference_run / "best.safetensors")
    ours = torch.load(run / "training_state.pt", weights_only=True)
    theirs = torch.load(reference_run / "training_state.pt", weights_only=True)
    for key in theirs["model"]:
        assert torch.equal(ours["model"][key], theirs["model"][key]), key
    rows, expected = read_rows(run / "metrics.csv"), read_rows(reference_run / "metrics.csv")
    for row, ref in zip(rows, expected, strict=True):
        for key in ("epoch", "train_loss", "train_acc", "test_loss", "test_top1", "ema_top1"):
            assert row[key] == ref[key], (key, row["epoch"])


def test_a_resumed_run_averages_its_ema_as_the_uninterrupted_run_does(
    image_folder, tmp_path, train_script, monkeypatch
):
    """In these short runs the default decay is 0 (1 - 1/horizon, a horizon under one step):
    the EMA is a copy of the model, and whether a resume restores it cannot show. A decay of
    0.9 averages from the first step (warm-up (1 + u) / (10 + u)): a resumed run whose update
    count restarted at 0 would pull its EMA back toward the model and end elsewhere."""
    flags = ("--model-ema-decay", "0.9")
    reference = assert_resumes_exactly(train_script, monkeypatch, tmp_path, image_folder, *flags)
    ours = torch.load(tmp_path / "run" / "training_state.pt", weights_only=True)
    theirs = torch.load(reference / "training_state.pt", weights_only=True)
    assert ours["ema"]["updates"] == theirs["ema"]["updates"] > 0
    for key, value in theirs["ema"]["module"].items():
        assert torch.equal(ours["ema"]["module"][key], value), key
    # an average, not a copy of the model (which would pass the above whatever the resume did)
    assert not torch.equal(theirs["ema"]["module"]["head.weight"], theirs["model"]["head.weight"])


def test_the_saved_rng_state_restores_pythons_numpys_and_torchs_generators():
    """Nothing in vit draws from Python's or numpy's global generator today, so the resume
    tests cannot see either left unrestored; a transform or a user's code that did would
    resume elsewhere. Saved as a checkpoint saves it (weights_only), and put back after."""
    before = checkpoint.get_rng_state()
    try:
        np.random.randn()  # a cached second Gaussian in numpy's state
        buffer = io.BytesIO()
        torch.save(checkpoint.get_rng_state(), buffer)
        first = (random.random(), np.random.randn(), np.random.rand(3).tolist(), torch.rand(3))
        random.random(), np.random.rand(), torch.rand(1)  # move every generator on
        buffer.seek(0)
        checkpoint.set_rng_state(torch.load(buffer, weights_only=True))
        again = (random.random(), np.random.randn(), np.random.rand(3).tolist(), torch.rand(3))
        assert first[:3] == again[:3] and torch.equal(first[3], again[3])
    finally:
        checkpoint.set_rng_state(before)


def test_ctrl_c_stops_the_run_even_where_its_exception_was_swallowed(
    image_folder, tmp_path, train_script, tiny_args, monkeypatch, capsys
):
    """Ctrl-C's KeyboardInterrupt is raised once, where the signal lands; landing in code whose
    exceptions Python swallows (a __del__, a weakref callback), it once left a time-boxed run
    training on and deaf to the next SIGINT. The loop stops at its next step all the same."""
    original = checkpoint.save_training_state

    def save_then_swallowed_ctrl_c(state: dict, path: Path) -> None:
        original(state, path)
        if state["epoch"] == 2:
            try:
                signal.raise_signal(signal.SIGINT)  # the handler runs here and raises ...
            except KeyboardInterrupt:
                pass  # ... and the exception goes nowhere, as in a __del__

    monkeypatch.setattr(checkpoint, "save_training_state", save_then_swallowed_ctrl_c)
    run = tmp_path / "run"
    assert train_script.main(tiny_args(image_folder, run, 4, *RECIPE)) == 130
    assert torch.load(run / "training_state.pt", weights_only=True)["epoch"] == 2
    assert "stopped after epoch 2 of 4" in capsys.readouterr().err


def test_ctrl_c_right_after_an_epochs_row_waits_for_its_checkpoint(
    image_folder, tmp_path, train_script, tiny_args, monkeypatch, capsys
):
    """Ctrl-C between the first epoch's metrics row and its training state (~0.4-1 s) left the
    row and weights with no state: the run 'held nothing to resume'. The state is written
    first now, and the run resumes from epoch 1."""
    logged = RunLog.epoch

    def row_then_ctrl_c(self, row: dict, history: list[dict]) -> None:
        logged(self, row, history)
        if row["epoch"] == 1:
            signal.raise_signal(signal.SIGINT)  # the run's handler, in this thread

    monkeypatch.setattr(RunLog, "epoch", row_then_ctrl_c)
    run = tmp_path / "run"
    assert train_script.main(tiny_args(image_folder, run, 2, *RECIPE)) == 130
    assert torch.load(run / "training_state.pt", weights_only=True)["epoch"] == 1
    assert "stopped after epoch 1 of 2" in capsys.readouterr().err


@pytest.mark.parametrize("where", ["last save", "log closed"])
def test_ctrl_c_swallowed_after_the_last_write_still_ends_with_its_status(
    where, image_folder, tmp_path, train_script, tiny_args, monkeypatch, capsys
):
    """The same swallowed Ctrl-C at the last epoch's save (held until its files are written)
    or once the run's log is closed, after which no step checks for it: the run once ended
    with status 0 as if no Ctrl-C had come. It is complete, and says so."""

    def swallowed_ctrl_c() -> None:
        with contextlib.suppress(KeyboardInterrupt):  # as in a __del__
            signal.raise_signal(signal.SIGINT)

    if where == "last save":
        original = checkpoint.save_training_state

        def save_then_ctrl_c(state: dict, path: Path) -> None:
            original(state, path)
            if state["epoch"] == 2:
                swallowed_ctrl_c()

        monkeypatch.setattr(checkpoint, "save_training_state", save_then_ctrl_c)
    else:
        closed = RunLog.close
        monkeypatch.setattr(
            RunLog, "close", lambda self, **kw: (closed(self, **kw), swallowed_ctrl_c())
        )
    run = tmp_path / "run"
    assert train_script.main(tiny_args(image_folder, run, 2, *RECIPE)) == 130
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith("train.py: interrupted after the last epoch, the run complete; wrote")
    assert torch.load(run / "training_state.pt", weights_only=True)["epoch"] == 2
    assert (run / "model.safetensors").exists()


def test_checkpoint_interval_writes_every_nth_epoch_and_resumes_from_the_last_written(
    image_folder, tmp_path, train_script, tiny_args, monkeypatch, capsys
):
    """--checkpoint-interval 2, evaluated only after the last epoch (so no epoch before it is a
    new best): the state is written after epochs 2 and 4 alone; Ctrl-C after epoch 3 leaves
    epoch 2's, and --resume from it ends on an uninterrupted run's weights."""
    flags = (*RECIPE, "--eval-interval", "4")
    reference = tmp_path / "reference"
    assert train_script.main(tiny_args(image_folder, reference, 4, *flags)) == 0
    written: list[int] = []
    original = checkpoint.save_training_state
    monkeypatch.setattr(
        checkpoint,
        "save_training_state",
        lambda state, path: (written.append(state["epoch"]), original(state, path)),
    )
    logged = RunLog.epoch

    def ctrl_c_after_epoch_3(self, row: dict, history: list[dict]) -> None:
        logged(self, row, history)
        if row["epoch"] == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(RunLog, "epoch", ctrl_c_after_epoch_3)
    run = tmp_path / "run"
    args = tiny_args(image_folder, run, 4, *flags, "--checkpoint-interval", "2")
    assert train_script.main(args) == 130
    assert written == [2] and "stopped after epoch 2 of 4" in capsys.readouterr().err
    monkeypatch.setattr(RunLog, "epoch", logged)
    assert train_script.main(["--resume", str(run)]) == 0
    assert written == [2, 4]
    assert_close_weights(run / "model.safetensors", reference / "model.safetensors")


@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_killed_process_resumes_to_identical_weights(
    reference_run, image_folder, tmp_path, tiny_args, stop
):
    """A real `kill -9` at whatever moment the first checkpoint appears, then --resume. A plain
    `kill` (SIGTERM: a scheduler's end of a job) ended the run without a word, status 143, and
    could leave a checkpoint's temporary file: now the files are closed and one line says where
    to continue, as after Ctrl-C."""
    run = tmp_path / "run"
    command = [sys.executable, str(ROOT / "train.py")]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        command + tiny_args(image_folder, run, 4, *RECIPE),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not (run / "training_state.pt").exists() and process.poll() is None:
        assert time.monotonic() < deadline, "no checkpoint within 120 s"
        time.sleep(0.05)
    process.send_signal(stop)
    err = process.communicate()[1]
    state = torch.load(run / "training_state.pt", weights_only=True)
    assert 1 <= state["epoch"] <= 4
    if stop == signal.SIGTERM:
        assert process.returncode == 143, err[-2000:]
        assert err.splitlines()[-1] == (
            f"train.py: stopped by SIGTERM; {run} stopped after epoch {state['epoch']} of 4 "
            f"(its last checkpoint): continue it with python {command[1]} --resume {run}"
        )
        assert no_temporary_files(run)
    resumed = subprocess.run(command + ["--resume", str(run)], env=env, capture_output=True)
    assert resumed.returncode == 0, resumed.stderr.decode()[-2000:]
    assert_close_weights(run / "model.safetensors", reference_run / "model.safetensors")


def test_nan_loss_stops_and_keeps_the_last_checkpoint(
    image_folder, tmp_path, train_script, tiny_args, monkeypatch, capsys
):
    run = tmp_path / "run"
    assert train_script.main(tiny_args(image_folder, run, 1)) == 0
    kept = {name: (run / name).read_bytes() for name in RUN_FILES if name != "curves.png"}

    def diverged(self, x, pre_logits=False):  # logits of a model whose weights blew up
        return x[:, 0, : self.num_classes] * float("nan")

    monkeypatch.setattr(VisionTransformer, "forward_head", diverged)
    assert train_script.main(["--resume", str(run), "--epochs", "2"]) == 1
    err = capsys.readouterr().err
    assert "loss became nan at epoch 2, step 1/" in err and "end of epoch 1" in err
    for name, content in kept.items():
        if name != "config.yaml":  # the resumed run records its new --epochs
            assert (run / name).read_bytes() == content, name


def test_fine_tune_from_weights_at_another_size(image_folder, tmp_path, train_script, tiny_args):
    """--pretrained PATH --img-size 48: position embeddings resampled from the 8x8 to a 12x12
    grid, the 5-class head replaced by a fresh 3-class one, 32x32 images resized to 48x48."""
    torch.manual_seed(0)
    source = vit.create_model("vit_cifar_patch4_32", num_classes=5, depth=2, embed_dim=32,
                              num_heads=2)  # fmt: skip
    vit.save_weights(source, tmp_path / "source.safetensors")
    run = tmp_path / "run"
    args = tiny_args(image_folder, run, 1) + [
        "--pretrained", str(tmp_path / "source.safetensors"), "--img-size", "48",
        "--lr", "1e-12", "--min-lr", "1e-13", "--no-model-ema",
    ]  # fmt: skip
    assert train_script.main(args) == 0
    tuned = vit.load_model(run / "model.safetensors")
    assert tuned.patch_embed.img_size == (48, 48) and tuned.num_classes == 3
    assert tuned.pos_embed.shape == (1, 1 + 12 * 12, 32)
    assert tuned.preprocess.input_size == (48, 48)
    # a learning rate of 1e-12 leaves the fine-tuned weights where the source put them
    weights = tuned.state_dict()
    assert torch.allclose(weights["blocks.1.mlp.fc1.weight"], source.blocks[1].mlp.fc1.weight)
    expected = vit.resample_abs_pos_embed(source.pos_embed.detach(), (12, 12))
    assert torch.allclose(weights["pos_embed"], expected, atol=1e-6)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_mixed_precision_trains(image_folder, tmp_path, train_script, tiny_args, dtype):
    run = tmp_path / "run"
    assert train_script.main(tiny_args(image_folder, run, 1, "--amp", "--amp-dtype", dtype)) == 0
    row = read_rows(run / "metrics.csv")[0]
    assert 0 < float(row["train_loss"]) < 2 and float(row["test_top1"]) > 0
    state = torch.load(run / "training_state.pt", weights_only=True)
    if dtype == "float16":  # float16 needs the gradient scaler; bfloat16 has float32's range
        assert state["scaler"]["scale"] > 0
    else:
        assert state["scaler"] == {}


@pytest.mark.slow
def test_compiled_training_matches_eager(image_folder, tmp_path, train_script, tiny_args):
    """--compile (torch.compile; ~40 s of compilation on CPU) trains to the eager weights,
    and its checkpoints carry plain parameter names (no `_orig_mod.` prefix)."""
    eager, compiled = tmp_path / "eager", tmp_path / "compiled"
    assert train_script.main(tiny_args(image_folder, eager, 1, "--no-model-ema")) == 0
    args = tiny_args(image_folder, compiled, 1, "--no-model-ema", "--compile")
    assert train_script.main(args) == 0
    assert_close_weights(compiled / "model.safetensors", eager / "model.safetensors", atol=1e-5)


def test_corrupt_image_stops_training_naming_it(
    image_folder, make_images, tmp_path, train_script, tiny_args, capsys
):
    data = make_images(tmp_path / "data", train_per_class=4, test_per_class=2)
    bad = data / "train" / "red" / "0002.jpg"
    bad.write_bytes(b"\x89PNG truncated")
    assert train_script.main(tiny_args(data, tmp_path / "run", 1, "--no-cache")) == 2
    assert f"cannot read image {bad}" in capsys.readouterr().err


def test_corrupt_image_read_by_a_loader_worker_is_its_one_line(
    make_images, tmp_path, train_script, tiny_args, capsys
):
    """Images over the cache's size are decoded in DataLoader worker processes: torch raises the
    worker's error again with its whole traceback as the message; the line is the worker's."""
    data = make_images(tmp_path / "data", train_per_class=4, test_per_class=2, size=80)
    bad = data / "train" / "red" / "0002.jpg"
    bad.write_bytes(b"")
    args = tiny_args(data, tmp_path / "run", 1, "--batch-size", "4", "--workers", "1")
    assert train_script.main(args) == 2
    said = [line for line in capsys.readouterr().err.splitlines() if " INFO " not in line]
    assert len(said) == 1 and said[0].startswith(f"train.py: error: cannot read image {bad}: ")


def test_data_errors_exit_with_a_message(tmp_path, train_script, tiny_args, capsys):
    assert train_script.main(tiny_args(tmp_path / "missing", tmp_path / "run")) == 2
    assert "neither one of cifar10, cifar100" in capsys.readouterr().err


def test_batch_larger_than_dataset_is_explained(image_folder, tmp_path, train_script, tiny_args):
    args = tiny_args(image_folder, tmp_path / "run") + ["--batch-size", "100"]
    assert train_script.main(args) == 2


def test_interrupted_atomic_write_keeps_the_old_file(tmp_path):
    path = tmp_path / "training_state.pt"
    checkpoint.save_training_state({"epoch": 1}, path)

    def dies_mid_write(tmp: Path) -> None:
        tmp.write_bytes(b"half a checkpo")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        vit.utils.files.atomic_write(path, dies_mid_write)
    assert checkpoint.load_training_state(path) == {"epoch": 1}
    assert no_temporary_files(tmp_path)


def test_warmup_cosine_schedule():
    factor = warmup_cosine(total_steps=110, warmup_steps=10, min_ratio=0.01)
    assert factor(0) == pytest.approx(0.1) and factor(9) == pytest.approx(1.0)
    assert factor(60) == pytest.approx(0.01 + 0.99 * 0.5)  # halfway through the cosine
    assert factor(110) == pytest.approx(0.01)


def test_the_rate_is_at_its_peak_on_the_first_step_after_warmup_and_never_above_it():
    factor = warmup_cosine(total_steps=110, warmup_steps=10, min_ratio=0.01)
    assert factor(10) == pytest.approx(1.0)  # the cosine starts at its top
    assert max(factor(step) for step in range(110)) == pytest.approx(1.0)
    assert factor(11) < 1.0


def test_no_weight_decay_on_biases_norms_and_embeddings():
    model = vit.create_model("vit_cifar_patch4_32", depth=1, embed_dim=32, num_heads=2)
    decay, no_decay = param_groups(model, 0.05)
    names = {id(p): n for n, p in model.named_parameters()}
    skipped = {names[id(p)] for p in no_decay["params"]}
    assert {"pos_embed", "cls_token", "norm.weight", "head.bias"} <= skipped
    assert {names[id(p)] for p in decay["params"]} == {
        "patch_embed.proj.weight",
        "blocks.0.attn.qkv.weight",
        "blocks.0.attn.proj.weight",
        "blocks.0.mlp.fc1.weight",
        "blocks.0.mlp.fc2.weight",
        "head.weight",
    }


CIFAR10_JPG = ROOT / "../shared/data/cifar10-jpg"


@pytest.mark.slow
@pytest.mark.skipif(
    not (CIFAR10_JPG / "train").is_dir(),
    reason=f"the CIFAR-10 JPEG copy is not at {CIFAR10_JPG.resolve()}",
)
def test_learns_real_cifar10_well_above_chance(tmp_path, train_script, evaluate_script):
    """Train 6 epochs on 10,000 real CIFAR-10 images (~2 min); 1,000 test images must score
    >= 30% top-1 (chance: 10%; this run measured 34.9%), in training's metrics and through
    evaluate.py alike."""
    run = tmp_path / "run"
    args = [
        "--data",
        str(CIFAR10_JPG),
        "--output-dir",
        str(run),
        "--device",
        "cpu",
        "--train-subset",
        "10000",
        "--test-subset",
        "1000",
        "--epochs",
        "6",
        "--model-kwargs",
        "embed_dim=64",
        "depth=3",
        "num_heads=4",
        "--batch-size",
        "32",
        "--lr",
        "2e-3",
        "--warmup-epochs",
        "0.3",
        "--workers",
        "0",
        "--label-smoothing",
        "0",
        "--model-ema-decay",
        "0.99",
    ]  # fmt: skip  (augmentation and regularisation: the light defaults)
    # One thread: on a few shared cores, two OpenMP threads stall each other (an epoch measured
    # 165 s instead of 15 s under load); one thread runs this small model at ~650 images/s.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert train_script.main(args) == 0
    finally:
        torch.set_num_threads(threads)
    top1 = float(read_rows(run / "metrics.csv")[-1]["ema_top1"])
    assert top1 >= 0.30
    report = tmp_path / "report.json"
    eval_args = ["--checkpoint", str(run), "--data", str(CIFAR10_JPG), "--subset", "1000",
                 "--json", str(report), "--workers", "0", "--device", "cpu"]  # fmt: skip
    assert evaluate_script.main(eval_args) == 0
    result = yaml.safe_load(report.read_text())  # JSON is YAML
    assert result["num_images"] == 1000 and len(result["per_class"]) == 10
    assert result["top1"] == pytest.approx(top1)


def test_epoch_based_settings_follow_the_length_of_the_run():
    short, long = settings.TrainConfig(epochs=4), settings.TrainConfig(epochs=200)
    assert settings.resolve_warmup_epochs(short) == pytest.approx(0.2)  # not 10 of 4 epochs
    assert settings.resolve_warmup_epochs(long) == pytest.approx(10)
    assert settings.resolve_warmup_epochs(settings.TrainConfig(epochs=4, warmup_epochs=1)) == 1
    with pytest.raises(ValueError, match="--warmup-epochs 10.0 is not shorter than --epochs 4"):
        settings.resolve_warmup_epochs(settings.TrainConfig(epochs=4, warmup_epochs=10.0))
    # 4 epochs of 5,000 images at batch 128: 156 steps. A 0.999 EMA would still hold 86% of
    # the random initial weights at the end; the default spans ~2% of the steps instead.
    steps = 4 * (5000 // 128)
    decay = settings.resolve_ema_decay(short, steps)
    assert decay**steps < 1e-6
    assert settings.resolve_ema_decay(long, 200 * 390) == pytest.approx(1 - 1 / 1560)
    assert settings.resolve_ema_decay(settings.TrainConfig(model_ema_decay=0.9), steps) == 0.9


def test_progressive_image_size_grows_in_whole_patches_to_the_model_size():
    cfg = settings.TrainConfig(epochs=20, progressive_size=16)
    sizes = [settings.image_size_for_epoch(cfg, e, final=32, patch=4) for e in range(20)]
    assert sizes[0] == 16 and sizes[10:] == [32] * 10  # grows over half of the run
    assert sizes == sorted(sizes) and all(s % 4 == 0 for s in sizes)
    assert len(set(sizes[:10])) >= 4  # several steps, not a jump
    fixed = settings.TrainConfig(epochs=20)
    assert {settings.image_size_for_epoch(fixed, e, final=32, patch=4) for e in range(20)} == {32}


FAST = (
    "--batch-augment", "--progressive-size", "16", "--progressive-epochs", "3",
    "--patch-drop", "0.25", "--reprob", "0.5", "--aa", "none", "--mixup", "0.8",
    "--aug-repeats", "2", "--eval-interval", "2",
)  # fmt: skip


def test_fast_cpu_levers_train_evaluate_on_schedule_and_resume_exactly(
    image_folder, tmp_path, train_script, tiny_args, monkeypatch
):
    reference = tmp_path / "reference"
    assert train_script.main(tiny_args(image_folder, reference, 5, *FAST)) == 0
    rows = read_rows(reference / "metrics.csv")
    assert [r["image_size"] for r in rows] == ["16", "20", "24", "32", "32"]
    assert [bool(r["test_top1"]) for r in rows] == [False, True, False, True, True]
    assert vit.load_model(reference / "model.safetensors").patch_embed.dynamic_img_size

    run = tmp_path / "run"
    with monkeypatch.context() as patch:
        _interrupt_after_save(patch, at_epoch=3, mid_save=False)
        assert train_script.main(tiny_args(image_folder, run, 5, *FAST)) == 130
    assert train_script.main(["--resume", str(run)]) == 0
    assert_close_weights(run / "model.safetensors", reference / "model.safetensors")
    for row, ref in zip(read_rows(run / "metrics.csv"), rows, strict=True):
        for key in ("epoch", "train_loss", "train_acc", "test_top1", "ema_top1", "image_size"):
            assert row[key] == ref[key], (key, row["epoch"])


# Draws from torch's global generator in every step: the mixing (its batches and boxes), patch
# dropout (its tokens) and stochastic depth; with --batch-augment the test images are evaluated
# from memory, without it through a DataLoader.
TRAINING_DRAWS = (
    "--cutmix", "1.0", "--mixup-prob", "0.5", "--patch-drop", "0.5", "--drop-path", "0.1",
)  # fmt: skip


@pytest.mark.parametrize("pipeline", [("--batch-augment",), ()], ids=["in-memory", "dataloader"])
def test_how_often_a_run_evaluates_leaves_the_training_draws_alone(
    image_folder, tmp_path, train_script, tiny_args, pipeline
):
    """An evaluation draws nothing from the global generator the training steps draw from:
    the evaluation from memory draws nothing at all, and the test DataLoader draws its workers'
    base seed from a generator of its own (with the global one, as before, each evaluation
    shifted the next epoch's draws, and --eval-interval changed what a run learnt)."""
    runs = {}
    for interval in ("1", "3"):
        out = tmp_path / f"every{interval}"
        flags = (*pipeline, *TRAINING_DRAWS, "--eval-interval", interval)
        assert train_script.main(tiny_args(image_folder, out, 3, *flags)) == 0
        runs[interval] = [(r["train_loss"], r["train_acc"]) for r in read_rows(out / "metrics.csv")]
    assert runs["1"] == runs["3"]
    assert_close_weights(
        tmp_path / "every1" / "model.safetensors", tmp_path / "every3" / "model.safetensors"
    )


ROUND_TWO = (
    "--batch-augment", "--opt", "muon", "--muon-lr", "3e-3", "--mimetic-init",
    "--pos-embed", "sincos", "--patch-drop", "0.5", "--patch-drop-anneal", "2",
    "--hflip-alternate", "--eval-interval", "2", "--muon-ns-dtype", "bfloat16",
    "--patch-embed-init", "whiten",
)  # fmt: skip


def test_second_round_cpu_levers_train_and_resume_exactly(
    image_folder, tmp_path, train_script, tiny_args, monkeypatch
):
    """Muon (its Newton-Schulz in bfloat16), mimetic init, fixed sin-cos positions, annealed
    patch dropout, alternating flips and the whitened patch embedding together: a killed run
    resumes to the uninterrupted run's weights, bit for bit."""
    reference = tmp_path / "reference"
    assert train_script.main(tiny_args(image_folder, reference, 4, *ROUND_TWO)) == 0
    model = vit.load_model(reference / "model.safetensors")
    fixed = vit.models.initializers.sincos_2d(model.grid_size, model.embed_dim)
    assert torch.equal(model.pos_embed[0, 1:], fixed)  # never trained
    run = tmp_path / "run"
    with monkeypatch.context() as patch:
        _interrupt_after_save(patch, at_epoch=2, mid_save=False)
        assert train_script.main(tiny_args(image_folder, run, 4, *ROUND_TWO)) == 130
    assert train_script.main(["--resume", str(run)]) == 0
    assert_close_weights(run / "model.safetensors", reference / "model.safetensors")


def test_a_run_starts_from_the_patch_embedding_that_whitens_its_training_images(
    image_folder, tmp_path, train_script, tiny_args, monkeypatch
):
    """--patch-embed-init whiten: the weights the optimizer starts from hold the patch embedding
    that whitens the run's training images, drawn with the run's seed; every other weight is
    the one a run without it starts from."""
    from vit.data.datasets import load_split
    from vit.models.initializers import whiten_patch_embed_
    from vit.training import build

    starts = {}  # run folder -> the model's weights as its optimizer is built
    build_training_state = build.build_training_state

    def recording(cfg, model, **kwargs):
        starts[cfg.output_dir] = {k: v.clone() for k, v in model.state_dict().items()}
        return build_training_state(cfg, model, **kwargs)

    monkeypatch.setattr(build, "build_training_state", recording)
    plain, whitened = str(tmp_path / "plain"), str(tmp_path / "whitened")
    assert train_script.main(tiny_args(image_folder, plain, 1, "--seed", "3")) == 0
    flags = ("--seed", "3", "--patch-embed-init", "whiten")
    assert train_script.main(tiny_args(image_folder, whitened, 1, *flags)) == 0
    expected = vit.load_model(Path(plain) / "model.safetensors")  # its architecture
    expected.load_state_dict(starts[plain])
    train_set = load_split(str(image_folder), "train", download=False, cache=False)
    batches = build.whitening_batches(train_set, expected.preprocess)
    whiten_patch_embed_(expected, batches, generator=torch.Generator().manual_seed(3))
    assert not torch.equal(
        starts[plain]["patch_embed.proj.weight"], expected.patch_embed.proj.weight
    )
    for name, tensor in expected.state_dict().items():
        assert torch.equal(starts[whitened][name], tensor), name
    assert (
        yaml.safe_load((Path(whitened) / "config.yaml").read_text())["patch_embed_init"] == "whiten"
    )


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--batch-augment", "--crop", "rrc"), "--batch-augment does pad-and-crop"),
        (("--hflip-alternate",), "--hflip-alternate needs --batch-augment"),
        (("--augment-batches", "4"), "--augment-batches 4 needs --batch-augment"),
        (("--progressive-size", "16"), "--progressive-size needs --batch-augment"),
        (("--batch-augment", "--aa", "none", "--no-cache"), "leave --cache on"),
    ],
)
def test_lever_combinations_that_cannot_work_are_explained(
    image_folder, tmp_path, train_script, tiny_args, capsys, flags, message
):
    args = tiny_args(image_folder, tmp_path / "run", 1, *flags)
    assert train_script.main(args) == 2
    assert message in capsys.readouterr().err


FIXTURE_RUN = Path(__file__).parent / "fixtures" / "run-before-layout"


def test_a_run_saved_before_the_layout_resumes_exactly(
    image_folder, tmp_path, train_script, tiny_args, one_thread
):
    """A run folder written by the code before vit/ was split into floors (tests/fixtures/
    README.md) resumes, and ends with the weights of an uninterrupted run of today's code:
    exactly on a CPU like the one that wrote it (AMD Zen 4, AVX-512), within 2e-5 on others,
    whose vector instructions round the reference's first epoch differently (2.3e-6 measured
    between a Zen 3 and an Intel Xeon with AVX-512 and AMX), where the second epoch alone moves
    the weights by 9e-4 (median) and up to 1e-2."""
    run = tmp_path / "old"
    shutil.copytree(FIXTURE_RUN, run)
    config = (run / "config.yaml").read_text().replace("data: DATA", f"data: {image_folder}")
    (run / "config.yaml").write_text(config)
    assert train_script.main(["--resume", str(run)]) == 0
    reference = tmp_path / "reference"
    flags = (*RECIPE, "--eval-interval", "2")  # as the fixture's run (tests/fixtures/README.md)
    assert train_script.main(tiny_args(image_folder, reference, 2, *flags)) == 0
    assert_close_weights(run / "model.safetensors", reference / "model.safetensors", atol=2e-5)
    assert [r["epoch"] for r in read_rows(run / "metrics.csv")] == ["1", "2"]


def test_a_runs_config_yaml_starts_the_same_run_again_and_train_log_keeps_its_lines(
    image_folder, tmp_path, train_script, tiny_args, capsys
):
    """The config.yaml of a resumed run held `resume: RUN`: given to --config it resumed that
    run past --resume's checks (a changed --lr trained at neither value), or named a folder the
    user never chose. It holds no `resume` now and starts the same run anew; train.log holds the
    run's lines, a resumed run's appended."""
    run, again = tmp_path / "run", tmp_path / "again"
    assert train_script.main(tiny_args(image_folder, run, 2)) == 0
    reproduce = ["--config", str(run / "config.yaml"), "--output-dir", str(again)]
    assert train_script.main(reproduce) == 0
    for column in ("train_loss", "test_top1", "ema_top1"):
        assert [r[column] for r in read_rows(run / "metrics.csv")] == [
            r[column] for r in read_rows(again / "metrics.csv")
        ], column
    assert train_script.main(["--resume", str(run), "--epochs", "3"]) == 0
    capsys.readouterr()
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert "resume" not in saved and saved["epochs"] == 3
    cfg = train_script.parse_config(["--config", str(run / "config.yaml"), "--output-dir", "new"])
    assert (cfg.resume, cfg.output_dir, cfg.epochs) == (None, "new", 3)
    log = (run / "train.log").read_text().splitlines()
    epochs = [line.split(" INFO ")[1].split(":")[0] for line in log if " INFO epoch " in line]
    assert epochs == ["epoch 1/2", "epoch 2/2", "epoch 3/3"]
    assert sum(f"resumed {run} after epoch 2" in line for line in log) == 1
    assert "resumed" not in (again / "train.log").read_text()


def test_a_resumed_run_leaves_its_config_yaml_as_it_was(
    image_folder, tmp_path, train_script, tiny_args, monkeypatch
):
    """A resumed run reads its config.yaml and writes it again: --cache-dir ~/cache came back
    expanded (/home/me/cache), the same settings in other bytes. It is kept as given, and the
    cache is still the home folder's."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    run = tmp_path / "run"
    with monkeypatch.context() as patch:
        stop_after_first_save(patch)
        assert train_script.main(tiny_args(image_folder, run, 2, "--cache-dir", "~/cache")) == 130
    written = (run / "config.yaml").read_bytes()
    assert b"cache_dir: ~/cache\n" in written
    assert train_script.main(["--resume", str(run)]) == 0
    assert (run / "config.yaml").read_bytes() == written
    assert (tmp_path / "home" / "cache").is_dir()


def test_a_resumed_run_reads_its_image_folder_where_it_has_moved(
    image_folder, make_images, tmp_path, train_script, tiny_args, capsys
):
    """A run on an image folder could not be resumed once the folder moved (or the run went to
    another machine): the run's --data was missing, and --data given anew was 'a change'."""
    data, run = tmp_path / "images", tmp_path / "run"
    shutil.copytree(image_folder, data)
    assert train_script.main(tiny_args(data, run, 1)) == 0
    moved = data.rename(tmp_path / "moved")
    capsys.readouterr()
    assert train_script.main(["--resume", str(run), "--epochs", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.endswith(
        "if the run's images have moved, give --data DIR where they are now\n"
    )
    other = make_images(tmp_path / "other", classes=("blue", "green", "cyan"))
    assert train_script.main(["--resume", str(run), "--epochs", "2", "--data", str(other)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"train.py: error: --resume {run} with --data {other}: its classes are not the run's "
        f"(only in the run: red; only in --data: cyan); give --data the run's own images\n"
    )
    assert train_script.main(["--resume", str(run), "--epochs", "2", "--data", str(moved)]) == 0
    assert [row["epoch"] for row in read_rows(run / "metrics.csv")] == ["1", "2"]


def test_a_diverged_loss_names_the_last_checkpoint_written_not_the_last_epoch(tmp_path):
    """With --checkpoint-interval 5 a loss that diverged in epoch 8 said 'the last complete
    checkpoint (end of epoch 7) is kept': the state held epoch 5."""
    from vit.training.engine import diverged_message

    cfg = settings.TrainConfig(output_dir=str(tmp_path), checkpoint_interval=5)
    message = diverged_message(cfg, float("nan"), epoch=7, step=3, steps=10)
    assert (
        "No checkpoint was written: the loss diverged before the run's first checkpoint" in message
    )
    torch.save({"epoch": 5}, tmp_path / checkpoint.STATE_FILE)
    message = diverged_message(cfg, float("nan"), epoch=7, step=3, steps=10)
    assert message.startswith("training loss became nan at epoch 8, step 4/10; stopped. ")
    assert f"The last complete checkpoint (end of epoch 5) is kept in {tmp_path}" in message


def test_a_flag_that_changes_nothing_with_the_others_is_said(train_script, capsys):
    """--muon-lr with --opt adamw, --teacher-epochs without a teacher, --compile-mode without
    --compile... trained exactly as without them, without a word. Flags only: a recipe's keys
    for a flag that turns them on are not (the speedrun's teacher, its fallback without one)."""
    flags = ["--opt", "adamw", "--muon-lr", "0.01", "--teacher-epochs", "3", "--compile-mode"]
    train_script.parse_config(
        [*flags, "max-autotune", "--model-ema-decay", "0.9", "--no-model-ema", "--momentum", "0.8"]
    )
    assert capsys.readouterr().err.splitlines() == [
        "train.py: warning: --muon-lr acts with --opt muon (the optimizer here: adamw); as "
        "given, it changes nothing",
        "train.py: warning: --momentum acts with --opt sgd or momentum (the optimizer here: "
        "adamw); as given, it changes nothing",
        "train.py: warning: --model-ema-decay acts with --model-ema; as given, it changes nothing",
        "train.py: warning: --compile-mode acts with --compile; as given, it changes nothing",
        "train.py: warning: --teacher-epochs acts with --distillation-type soft or hard; as "
        "given, it changes nothing",
    ]
    # a teacher read from a file was built and trained as its file says
    train_script.parse_config(
        ["--distillation-type", "soft", "--teacher-path", "t.safetensors", "--teacher-width", "8"]
    )
    assert capsys.readouterr().err.splitlines() == [
        "train.py: warning: --teacher-width acts with a teacher trained here (not --teacher-path); "
        "as given, it changes nothing"
    ]
    recipe = str(ROOT / "configs" / "cifar10_gpu_speedrun.yaml")
    train_script.parse_config(["--config", recipe, "--distillation-type", "none"])
    train_script.parse_config(["--config", recipe, "--teacher-path", "t.safetensors"])
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        train_script.parse_config(["--config", str(path)])
    assert capsys.readouterr().err == ""


def test_a_full_disk_stops_the_run_in_one_line_and_resume_continues_it(
    reference_run, image_folder, tmp_path, train_script, tiny_args, monkeypatch, capsys
):
    """A full disk at the second checkpoint: five chained tracebacks ("iostream error"), the
    last from redrawing curves.png on the same disk. Now one line names the file, the kept
    checkpoint and the command that continues the run once there is room; it then ends as an
    uninterrupted run."""
    import errno

    from vit.training import run_log

    run = tmp_path / "run"
    original = checkpoint.save_training_state
    disk = {"full": False}

    def full_from_the_second(state: dict, path: Path) -> None:
        disk["full"] = disk["full"] or state["epoch"] == 2
        if disk["full"]:  # what atomic_write raises there (test_data.py)
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        original(state, path)

    def drawn_on(figure, path: Path) -> None:
        if disk["full"]:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))

    with monkeypatch.context() as patch:
        patch.setattr(checkpoint, "save_training_state", full_from_the_second)
        patch.setattr(run_log, "save_figure", drawn_on)
        assert train_script.main(tiny_args(image_folder, run, 4, *RECIPE)) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(
        f"train.py: stopped: No space left on device: {run / checkpoint.STATE_FILE}; {run} "
        f"stopped after epoch 1 of 4 (its last checkpoint): continue it with "
    ) and err[-1].endswith(f"--resume {run}, once there is room")
    assert not any("Traceback" in line for line in err)
    assert train_script.main(["--resume", str(run)]) == 0
    assert_close_weights(run / "model.safetensors", reference_run / "model.safetensors")
