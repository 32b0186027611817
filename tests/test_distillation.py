"""--distillation-type: the CNN teacher, its loss, its training before the ViT's, and the run
folder's teacher.safetensors that --resume and --teacher-path read."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import assert_resumes_exactly, read_rows, tiny_train_args
from safetensors.torch import load_file, save_file

import vit
from vit.data.batch_pipeline import InMemoryBatches
from vit.models.cnn_teacher import CnnTeacher, whiten_stem_
from vit.training.build import build_forward_loss, build_mixup
from vit.training.distillation import (
    distillation_loss,
    load_teacher,
    save_teacher,
    teacher_logits,
)
from vit.training.settings import TrainConfig
from vit.training.teacher_recipe import RECIPES, train_teacher
from vit.utils.process_group import DistInfo

# a teacher of 4 channels trained 3 epochs: seconds on a CPU
TEACHER = ("--distillation-type", "hard", "--teacher-width", "4", "--teacher-epochs", "3")
# ... and one with a whitening stem and airbench's stages, (w, 4w, 4w)
WHITENED_TEACHER = (*TEACHER, "--teacher-stem", "whiten", "--teacher-channel-mult", "1", "4", "4")


def test_the_teacher_maps_images_of_any_multiple_of_8_to_logits():
    teacher = CnnTeacher(num_classes=7, width=8)
    assert teacher(torch.randn(2, 3, 32, 32)).shape == (2, 7)
    assert teacher(torch.randn(1, 3, 48, 40)).shape == (1, 7)
    # the docstring's count at width 64: convs (no bias), norms, head
    assert sum(p.numel() for p in CnnTeacher(10, width=64).parameters()) == 1_185_866
    # airbench's widths after a whitening stem: 2x2 to 24 channels, then 31 -> 15 -> 7 -> 3 px
    whitened = CnnTeacher(num_classes=7, width=4, channel_mult=(1, 4, 4), stem="whiten")
    assert whitened(torch.randn(2, 3, 32, 32)).shape == (2, 7)
    assert whitened.stages[0].conv1[0].in_channels == 24 and whitened.head.in_features == 16
    assert whitened.widths == (4, 16, 16)
    # the docstring's count for airbench's network
    airbench = CnnTeacher(10, width=64, channel_mult=(1, 4, 4), stem="whiten")
    assert sum(p.numel() for p in airbench.parameters()) == 1_972_802
    with pytest.raises(ValueError, match="three multipliers"):
        CnnTeacher(num_classes=7, channel_mult=(1, 2))
    with pytest.raises(ValueError, match="stem must be one of"):
        CnnTeacher(num_classes=7, stem="patchify")


def test_a_whitening_stem_decorrelates_the_patches_it_was_measured_on():
    torch.manual_seed(0)
    # images whose neighbouring pixels and channels are correlated, as photographs' are
    smooth = F.interpolate(torch.randn(16, 1, 9, 9), size=32, mode="bilinear")
    images = smooth * torch.tensor([1.0, 0.8, 0.5]).view(1, 3, 1, 1) + 0.3
    images = images + 0.2 * torch.randn(16, 3, 32, 32)
    teacher = CnnTeacher(num_classes=3, width=4, stem="whiten")
    whiten_stem_(teacher, [images[:8], images[8:]])
    with torch.no_grad():
        out = teacher.stem.conv(images)  # (16, 24, 31, 31), before the GELU
    # the non-overlapping 2x2 patches, those it measured: (16 * 16 * 16, 12)
    directions = out[:, :12, ::2, ::2].permute(0, 2, 3, 1).reshape(-1, 12).double()
    assert directions.mean(0).abs().max() < 1e-4  # centred by the bias
    # unit variance and no correlation (the eps shrinks the faintest direction by a few %)
    assert torch.allclose(torch.cov(directions.T), torch.eye(12, dtype=torch.double), atol=0.03)
    assert torch.allclose(out[:, 12:], -out[:, :12], atol=1e-5)  # the negatives: GELU sees both
    assert not teacher.stem.conv.weight.requires_grad and teacher.stem.conv.bias.requires_grad
    with pytest.raises(ValueError, match="stem='whiten'"):
        whiten_stem_(CnnTeacher(num_classes=3, width=4), [images])


def test_hard_distillation_takes_the_teachers_class_as_a_second_label():
    torch.manual_seed(0)
    logits, teacher_logits = torch.randn(6, 5), torch.randn(6, 5)
    base = torch.tensor(1.7)
    loss = distillation_loss(logits, teacher_logits, base, kind="hard", alpha=0.25)
    by_hand = 0.75 * 1.7 + 0.25 * F.cross_entropy(logits, teacher_logits.argmax(1))
    assert torch.allclose(loss, by_hand)
    assert distillation_loss(logits, teacher_logits, base, kind="hard", alpha=0.0) == base


def test_soft_distillation_is_tau_squared_times_the_kl_divergence_per_image():
    torch.manual_seed(0)
    logits, teacher_logits = torch.randn(4, 3), torch.randn(4, 3)
    tau = 2.0
    p_teacher = F.softmax(teacher_logits / tau, dim=1)
    kl = (p_teacher * (p_teacher.log() - F.log_softmax(logits / tau, dim=1))).sum(1).mean()
    loss = distillation_loss(
        logits, teacher_logits, torch.tensor(0.0), kind="soft", alpha=1.0, tau=tau
    )
    assert torch.allclose(loss, tau**2 * kl)
    # a student that agrees with its teacher has nothing to learn from it
    same = distillation_loss(logits, logits, torch.tensor(0.5), kind="soft", alpha=0.5, tau=tau)
    assert torch.allclose(same, torch.tensor(0.25), atol=1e-6)
    with pytest.raises(ValueError, match="'hard' or 'soft'"):
        distillation_loss(logits, logits, torch.tensor(0.0), kind="none", alpha=0.5)


def test_the_training_loss_smooths_the_labels_by_label_smoothing():
    """Without a teacher: cross-entropy on labels smoothed by --label-smoothing (0.3 here)."""
    torch.manual_seed(0)
    model = vit.create_model(
        "vit_cifar_patch4_32", embed_dim=32, depth=1, num_heads=2, num_classes=4
    )
    with torch.no_grad():  # a head that answers (a new one is zero: every loss is log 4)
        model.head.weight.normal_(std=2.0)
    cfg = TrainConfig(label_smoothing=0.3)
    images, labels = torch.randn(8, 3, 32, 32), torch.randint(0, 4, (8,))
    logits, loss = build_forward_loss(model, cfg, torch.device("cpu"), False)(images, labels)
    expected = F.cross_entropy(logits, labels, label_smoothing=0.3)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert loss.item() != pytest.approx(F.cross_entropy(logits, labels).item(), rel=1e-3)


def test_mixup_targets_are_smoothed_by_label_smoothing():
    mix = build_mixup(TrainConfig(mixup=0.8, cutmix=1.0, label_smoothing=0.3), 3)
    mix.enabled = False  # one-hot targets, smoothed: 0.3 / 3 off, 1 - 0.3 + 0.1 on
    _, targets = mix(torch.zeros(2, 3, 4, 4), torch.tensor([0, 2]))
    assert targets.flatten().tolist() == pytest.approx([0.8, 0.1, 0.1, 0.1, 0.1, 0.8])


def test_the_forward_loss_adds_the_frozen_teachers_loss_on_the_same_images():
    torch.manual_seed(0)
    model = vit.create_model(
        "vit_cifar_patch4_32", embed_dim=32, depth=1, num_heads=2, num_classes=4
    )
    teacher = CnnTeacher(num_classes=4, width=4).eval().requires_grad_(False)
    cfg = TrainConfig(distillation_type="hard", distillation_alpha=0.5, label_smoothing=0.0)
    images, labels = torch.randn(8, 3, 32, 32), torch.randint(0, 4, (8,))
    forward_loss = build_forward_loss(model, cfg, torch.device("cpu"), False, teacher=teacher)
    logits, loss = forward_loss(images, labels)
    expected = 0.5 * F.cross_entropy(logits, labels) + 0.5 * F.cross_entropy(
        logits, teacher(images).argmax(1)
    )
    assert torch.allclose(loss, expected)
    loss.backward()
    assert all(p.grad is None for p in teacher.parameters())  # the teacher learns nothing
    assert model.head.weight.grad.abs().sum() > 0


def lopsided_teacher_and_images(num_classes: int) -> tuple[torch.nn.Module, torch.Tensor]:
    """A frozen linear teacher over every pixel, whose answers about an image and its mirror
    image differ (a CnnTeacher fresh from its initialisation answers nearly alike about any
    image), and 8 images (8, 3, 32, 32)."""
    torch.manual_seed(0)
    teacher = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, num_classes))
    return teacher.eval().requires_grad_(False), torch.randn(8, 3, 32, 32)


def test_a_flip_averaged_teachers_answer_is_its_mean_probability_and_the_same_for_the_mirror():
    """--teacher-tta flip: the log of the mean of the teacher's two softmax distributions, the
    image's and its mirror image's (one pass of both), so an image and its mirror image get one
    answer; none: the plain logits."""
    teacher, images = lopsided_teacher_and_images(num_classes=5)
    plain, mirrored = teacher(images), teacher(images.flip(-1))  # each (8, 5)
    assert not torch.allclose(plain, mirrored, atol=0.1)  # the teacher is not symmetric
    assert torch.equal(teacher_logits(teacher, images, "none"), plain)
    flip = teacher_logits(teacher, images, "flip")  # (8, 5)
    mean = (plain.softmax(1) + mirrored.softmax(1)) / 2
    assert torch.allclose(flip.softmax(1), mean, atol=1e-6)
    assert torch.allclose(flip.exp().sum(1), torch.ones(8), atol=1e-5)  # log-probabilities
    assert torch.allclose(teacher_logits(teacher, images.flip(-1), "flip"), flip, atol=1e-5)
    with pytest.raises(ValueError, match="--teacher-tta must be none or flip, got 'shift'"):
        teacher_logits(teacher, images, "shift")


def test_the_forward_loss_distils_the_flip_averaged_answer_under_teacher_tta():
    teacher, images = lopsided_teacher_and_images(num_classes=4)
    model = vit.create_model(
        "vit_cifar_patch4_32", embed_dim=32, depth=1, num_heads=2, num_classes=4
    )
    labels = torch.randint(0, 4, (8,))
    cfg = TrainConfig(distillation_type="soft", teacher_tta="flip", label_smoothing=0.0)
    forward_loss = build_forward_loss(model, cfg, torch.device("cpu"), False, teacher=teacher)
    logits, loss = forward_loss(images, labels)
    base = F.cross_entropy(logits, labels)
    answers = {tta: teacher_logits(teacher, images, tta) for tta in ("none", "flip")}
    expected = {
        tta: distillation_loss(logits, answer, base, kind="soft", alpha=0.5)
        for tta, answer in answers.items()
    }
    assert torch.allclose(loss, expected["flip"])
    assert not torch.allclose(loss, expected["none"], atol=0.01)


def coloured_images(count: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(count, 32, 32, 3) uint8 noise whose label (0-2) is its strongest colour channel."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 3, count)
    images = rng.integers(0, 110, (count, 32, 32, 3)).astype(np.uint8)
    images[np.arange(count), :, :, labels] += 120
    return images, labels


# airbench's logits x1/9 need larger head weights than 4 channels give in 3 epochs
@pytest.mark.parametrize(
    ("stem", "recipe", "width", "epochs"),
    [("conv", "dawnbench", 4, 3), ("whiten", "airbench", 8, 4)],
)
def test_a_teacher_trained_a_few_epochs_learns_the_images_and_ends_frozen(
    stem, recipe, width, epochs
):
    torch.manual_seed(0)
    images, labels = coloured_images(256)
    loader = InMemoryBatches(images, labels, batch_size=32, mean=(0.5,) * 3, std=(0.25,) * 3)
    recipe = RECIPES[recipe]
    teacher = CnnTeacher(num_classes=3, width=width, stem=stem, **recipe.network)
    if stem == "whiten":
        whiten_stem_(teacher, [(torch.from_numpy(images).permute(0, 3, 1, 2) / 255 - 0.5) / 0.25])
    stem_before = {k: v.clone() for k, v in teacher.stem.state_dict().items()}
    loss = train_teacher(
        teacher, loader, recipe=recipe, epochs=epochs, device=torch.device("cpu"), amp=False,
        amp_dtype="bfloat16", info=DistInfo(),
    )  # fmt: skip
    assert loss < 0.9  # chance is log(3) = 1.10; the floor of label smoothing 0.2 ~0.47
    held, held_labels = coloured_images(96, seed=1)
    batch = (torch.from_numpy(held).permute(0, 3, 1, 2) / 255 - 0.5) / 0.25
    accuracy = (teacher(batch).argmax(1).numpy() == held_labels).mean()
    assert accuracy > 0.9
    assert not teacher.training and not any(p.requires_grad for p in teacher.parameters())
    if stem == "whiten":  # its filters stay what the images measured; its bias learnt
        assert torch.equal(teacher.stem.conv.weight, stem_before["conv.weight"])
        assert not torch.equal(teacher.stem.conv.bias, stem_before["conv.bias"])


def test_a_saved_teacher_loads_as_it_was_and_a_wrong_file_is_named(tmp_path):
    torch.manual_seed(0)
    teacher = CnnTeacher(num_classes=3, width=4).eval()
    save_teacher(teacher, tmp_path / "teacher.safetensors", {"epochs": 2})
    loaded, facts = load_teacher(tmp_path / "teacher.safetensors", num_classes=3)
    images = torch.randn(2, 3, 32, 32)
    assert torch.equal(loaded(images), teacher(images)) and facts["epochs"] == 2
    # airbench's recipe scales the logits by 1/9: the file says so, and it loads so
    scaled = CnnTeacher(num_classes=3, width=4, logit_scale=1 / 9).eval()
    save_teacher(scaled, tmp_path / "scaled.safetensors", {"epochs": 2})
    loaded, _ = load_teacher(tmp_path / "scaled.safetensors", num_classes=3)
    assert loaded.logit_scale == 1 / 9 and torch.equal(loaded(images), scaled(images))
    with pytest.raises(ValueError, match="a teacher of 3 classes, and the data has 10"):
        load_teacher(tmp_path / "teacher.safetensors", num_classes=10)
    with pytest.raises(ValueError, match="no such file"):
        load_teacher(tmp_path / "missing.safetensors", num_classes=3)
    # a run folder stands for the teacher it wrote; a folder without one is named
    from_folder, _ = load_teacher(tmp_path, num_classes=3)
    assert torch.equal(from_folder(images), teacher(images))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="empty: a folder without a teacher.safetensors"):
        load_teacher(tmp_path / "empty", num_classes=3)
    student = vit.create_model(
        "vit_cifar_patch4_32", embed_dim=32, depth=1, num_heads=2, num_classes=3
    )
    vit.save_weights(student, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="no teacher's metadata"):
        load_teacher(tmp_path / "model.safetensors", num_classes=3)


def test_a_saved_whitened_teacher_loads_with_its_stem_and_stages_and_a_first_file_still_loads(
    tmp_path,
):
    torch.manual_seed(0)
    teacher = CnnTeacher(num_classes=3, width=2, channel_mult=(1, 4, 4), stem="whiten")
    whiten_stem_(teacher, [torch.randn(4, 3, 32, 32) * 2 + 1])
    teacher.eval()
    save_teacher(teacher, tmp_path / "teacher.safetensors", {"epochs": 2})
    loaded, _ = load_teacher(tmp_path / "teacher.safetensors", num_classes=3)
    images = torch.randn(2, 3, 32, 32)
    assert loaded.stem_kind == "whiten" and loaded.widths == (2, 8, 8)
    assert torch.equal(loaded(images), teacher(images))
    # the first teachers' files name their width only: a conv stem, stages (w, 2w, 4w)
    first = CnnTeacher(num_classes=3, width=4).eval()
    tensors = {k: v.contiguous() for k, v in first.state_dict().items()}
    save_file(tensors, str(tmp_path / "first.safetensors"),
              {"vit.teacher": '{"num_classes": 3, "width": 4, "epochs": 1}'})  # fmt: skip
    loaded, _ = load_teacher(tmp_path / "first.safetensors", num_classes=3)
    assert loaded.stem_kind == "conv" and torch.equal(loaded(images), first(images))


def test_train_py_distils_into_a_plain_vit_and_resumes_exactly(
    train_script, monkeypatch, tmp_path, image_folder
):
    reference = assert_resumes_exactly(train_script, monkeypatch, tmp_path, image_folder, *TEACHER)
    model = vit.load_model(reference / "model.safetensors")  # the student alone, a plain ViT
    assert type(model) is vit.VisionTransformer
    assert (reference / "teacher.safetensors").is_file()
    # without distillation the same seed ends elsewhere: the teacher's loss trained it
    plain = tmp_path / "plain"
    assert train_script.main(tiny_train_args(image_folder, plain, 2)) == 0
    ours, theirs = (
        load_file(reference / "model.safetensors"),
        load_file(plain / "model.safetensors"),
    )
    assert not torch.equal(ours["head.weight"], theirs["head.weight"])


@pytest.mark.parametrize("teacher", [TEACHER, WHITENED_TEACHER], ids=["conv", "whiten"])
def test_a_teacher_read_from_teacher_path_teaches_as_the_one_trained_in_the_run(
    train_script, tmp_path, image_folder, teacher
):
    trained = tmp_path / "trained"
    assert train_script.main(tiny_train_args(image_folder, trained, 2, *teacher)) == 0
    read = tmp_path / "read"
    flags = ("--distillation-type", "hard", "--teacher-path", str(trained / "teacher.safetensors"))
    assert train_script.main(tiny_train_args(image_folder, read, 2, *flags)) == 0
    # training the teacher took none of the student's random draws: the same student
    ours, theirs = load_file(read / "model.safetensors"), load_file(trained / "model.safetensors")
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)


def test_a_teacher_path_that_is_no_teacher_stops_with_one_line(
    train_script, tmp_path, image_folder, capsys
):
    flags = ("--distillation-type", "soft", "--teacher-path", str(tmp_path / "nothing.safetensors"))
    assert train_script.main(tiny_train_args(image_folder, tmp_path / "run", 1, *flags)) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("train.py: error: --teacher-path") and "no such file" in err[-1]
    assert not (tmp_path / "run").exists()  # a failed start writes nothing


def test_two_processes_train_one_teacher_and_resume_against_it(tmp_path, image_folder):
    """Under torchrun each process trains the teacher on its share of the images (DDP), then
    takes rank 0's batch-norm statistics; rank 0 saves it, and a resumed run reads it."""
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    run = tmp_path / "ddp"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node"]
    args = tiny_train_args(image_folder, run, 1, *TEACHER, "--batch-size", "4")
    for command in (
        [*torchrun, "2", str(root / "train.py"), *args],
        [*torchrun, "2", str(root / "train.py"), "--resume", str(run), "--epochs", "2"],
    ):
        done = subprocess.run(command, env=env, capture_output=True, timeout=300)
        assert done.returncode == 0, done.stderr.decode()[-3000:]
    facts = load_teacher(run / "teacher.safetensors", num_classes=3)[1]
    assert facts["epochs"] == 3 and 0 <= facts["test_top1"] <= 1
    assert len(read_rows(run / "metrics.csv")) == 2  # the resumed epoch, after the first


def test_a_run_whose_teacher_is_gone_is_not_resumed_against_another(
    train_script, tmp_path, image_folder, capsys
):
    run = tmp_path / "run"
    assert train_script.main(tiny_train_args(image_folder, run, 1, *TEACHER)) == 0
    (run / "teacher.safetensors").unlink()
    state = (run / "training_state.pt").read_bytes()
    assert train_script.main(["--resume", str(run), "--epochs", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"train.py: error: --resume {run}") and "teacher.safetensors" in err
    assert (run / "training_state.pt").read_bytes() == state  # the run is left as it was


def test_the_teacher_screen_trains_each_rows_teacher_as_a_run_does(
    monkeypatch, tmp_path, image_folder, capsys
):
    """benchmarks/teacher_screen.py: a row per teacher, trained through the run's own path
    (`make_teacher`), its top-1 single view and with flip TTA, written to --json; each row the
    teacher it names, whatever the YAML's teacher is."""
    import importlib
    import json

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    screen = importlib.import_module("teacher_screen")
    out = tmp_path / "teachers.json"
    flags = ["--data", str(image_folder), "--epochs", "2", "--batch-size", "16"]
    names = ["w32", "whiten-wide", "airbench-first"]
    screen.main([*flags, "--device", "cpu", "--rows", *names, "--json", str(out)])
    rows = json.loads(out.read_text())
    assert [r["row"] for r in rows] == names
    assert [r["recipe"]["name"] for r in rows] == ["dawnbench", "dawnbench", "airbench"]
    assert rows[2]["recipe"]["pool_before_norm"] is False  # the row's change to the recipe
    assert rows[0]["params_m"] == round(sum(
        p.numel() for p in CnnTeacher(3, width=32).parameters()) / 1e6, 3)  # fmt: skip
    assert rows[1]["params_m"] == round(sum(
        p.numel() for p in CnnTeacher(3, channel_mult=(1, 4, 4), stem="whiten").parameters()
    ) / 1e6, 3)  # fmt: skip
    assert rows[1]["train_images"] == 48
    for row in rows:
        assert 0 <= row["top1"] <= 100 and 0 <= row["top1_flip_tta"] <= 100
        assert 0 <= row["top1_flip_shift_tta"] <= 100
        assert row["epochs"] == 2 and row["gflop_forward"] > 0
    assert "| `whiten-wide` |" in capsys.readouterr().out


def test_the_teacher_targets_benchmark_asks_a_runs_teacher_about_its_students_batches(
    train_script, monkeypatch, tmp_path, image_folder, capsys
):
    """benchmarks/teacher_targets.py: a run's own teacher on the test images (the top-1 the
    run logged, and evaluate()'s loss where no smoothing changes the targets) and on an
    epoch's training batches, mixed on the run's schedule (CutMix on every batch of epoch 1, on
    none from --mixup-off-epoch) and unmixed; a folder without a teacher is refused in one
    line."""
    import importlib
    import json

    from vit.inference.evaluation import evaluate
    from vit.training.build import build_training_model, load_data, make_loaders

    run = tmp_path / "run"
    mixing = ("--batch-augment", "--cutmix", "1.0", "--mixup-prob", "1.0", "--mixup-off-epoch", "1")
    flags = tiny_train_args(image_folder, run, 2, *TEACHER, *mixing, "--label-smoothing", "0")
    assert train_script.main(flags) == 0
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    targets = importlib.import_module("teacher_targets")
    out = tmp_path / "targets.json"
    targets.main([str(run), "--epochs", "0", "1", "--json", str(out)])
    (row,) = json.loads(out.read_text())
    assert row["teacher"] == {"width": 4, "channel_mult": [1, 2, 4], "stem": "conv",
                              "recipe": "dawnbench", "aa": "none"}  # fmt: skip
    assert row["test"]["top1"] == row["logged_test_top1"]
    cfg, info = targets.run_config(run), DistInfo()
    train_set, test_set = load_data(cfg, info)
    model = build_training_model(cfg, train_set.class_names)
    _, test_loader = make_loaders(cfg, train_set, test_set, model, info, torch.device("cpu"))
    teacher, _ = load_teacher(run / "teacher.safetensors", num_classes=train_set.num_classes)
    scores = evaluate(teacher, test_loader, num_classes=3, device=torch.device("cpu"))
    assert row["test"]["cross_entropy"] == pytest.approx(scores["loss"], rel=1e-5)
    assert row["test"]["images"] == len(test_set)
    first, second = row["epochs"]["0"], row["epochs"]["1"]
    assert first["unmixed"]["images"] == second["mixed"]["images"] == 48  # 6 batches of 8
    assert first["mixed"]["cross_entropy"] > first["unmixed"]["cross_entropy"]  # CutMix
    assert second["mixed"] == second["unmixed"]  # no mixing from --mixup-off-epoch
    for asked in (row["test"], first["mixed"], first["unmixed"]):
        assert 0 <= asked["top1"] <= 1 and 1 / 3 <= asked["top_probability"] <= 1
    assert "| run | conv stem, dawnbench | epoch 0, mixed | " in capsys.readouterr().out
    # --set: the same batches without flips, the test images as they were
    targets.main([str(run), "--epochs", "1", "--set", "hflip=0", "--json", str(out)])
    (unflipped,) = json.loads(out.read_text())
    assert unflipped["changes"] == {"hflip": 0} and unflipped["test"] == row["test"]
    assert unflipped["epochs"]["1"]["unmixed"] != second["unmixed"]
    assert "| run | conv stem, dawnbench, hflip=0 | epoch 1, unmixed | " in capsys.readouterr().out
    with pytest.raises(SystemExit):  # refused by argparse, as training_pipeline.py's --set
        targets.main([str(run), "--set", "hflips=0"])
    assert "argument --set: 'hflips' is no train.py setting" in capsys.readouterr().err
    with pytest.raises(SystemExit, match=f"{tmp_path}: no teacher.safetensors and config.yaml"):
        targets.main([str(tmp_path)])


def test_teacher_aa_trains_the_teacher_under_the_runs_randaugment(
    train_script, tmp_path, image_folder
):
    """--teacher-aa randaug: the teacher's batches RandAugmented as the student's are (the
    run's --aa-n ops), recorded in its file; the same seed without it trains another teacher."""
    runs = {}
    for aa in ("none", "randaug"):
        runs[aa] = tmp_path / aa
        flags = (*TEACHER, "--aa", "randaug", "--aa-n", "2", "--teacher-aa", aa)
        assert train_script.main(tiny_train_args(image_folder, runs[aa], 1, *flags)) == 0
    teachers = {
        aa: load_teacher(run / "teacher.safetensors", num_classes=3) for aa, run in runs.items()
    }
    assert teachers["randaug"][1]["aa"] == "randaug" and teachers["none"][1]["aa"] == "none"
    plain, augmented = teachers["none"][0].state_dict(), teachers["randaug"][0].state_dict()
    assert not torch.equal(plain["head.weight"], augmented["head.weight"])


def test_teacher_tta_flip_distils_the_flip_averaged_answers_and_logs_their_top1(
    train_script, tmp_path, image_folder, caplog
):
    """--teacher-tta flip: the same teacher (its training is untouched), another student, and
    the log line and the teacher's file give the top-1 of the answers the student is given."""
    runs = {}
    for tta in ("none", "flip"):
        runs[tta] = tmp_path / tta
        # soft: a hard label from a teacher this weak is the same with or without the flips
        flags = (*TEACHER, "--distillation-type", "soft", "--teacher-tta", tta)
        with caplog.at_level("INFO", logger="vit"):
            assert train_script.main(tiny_train_args(image_folder, runs[tta], 1, *flags)) == 0
    teachers = {
        tta: load_teacher(run / "teacher.safetensors", num_classes=3) for tta, run in runs.items()
    }
    plain, flip = teachers["none"], teachers["flip"]
    assert all(torch.equal(v, flip[0].state_dict()[k]) for k, v in plain[0].state_dict().items())
    assert "test_top1_flip" not in plain[1] and 0.0 <= flip[1]["test_top1_flip"] <= 1.0
    assert flip[1]["test_top1"] == plain[1]["test_top1"]
    assert f"({100 * flip[1]['test_top1_flip']:.2f}% flip-averaged, as --teacher-tta" in caplog.text
    students = [load_file(run / "model.safetensors")["head.weight"] for run in runs.values()]
    assert not torch.equal(*students)
