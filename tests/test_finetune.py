"""Fine-tuning pretrained weights (vit.training.finetune): layer decay's groups and rates against
a hand count, frozen parameters untouched and absent from the optimizer, the probe's head, the
validation split, exact resume, and the one-line refusals."""

from __future__ import annotations

import json
import logging
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import CLASSES, fake_hub_cache, read_rows, stop_after_first_save
from safetensors.torch import load_file

import vit
from vit.data.datasets import ImageDataset
from vit.data.transforms import EvalTransform
from vit.inference.probe import fit_linear_probe
from vit.interop.weights import read_metadata
from vit.training.engine import top_lr
from vit.training.finetune import freeze_below, layer_lr_scales, parameter_depths, probe_head
from vit.training.optimizers import build_optimizer

TINY = dict(img_size=32, patch_size=4, embed_dim=32, depth=3, num_heads=2, num_classes=3)
TINY_KWARGS = ("--model-kwargs", "depth=3", "embed_dim=32", "num_heads=2")


@pytest.fixture(autouse=True)
def same_threads_after():
    """train.py's --threads sets the process's thread count, and these runs share the test
    process: the tests after them (whose references are made in this process and compared
    with runs in others) must find the count as it was."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def exit_status(main, argv: list[str]) -> int:
    """train.py's status: main's return, or the SystemExit of a refusal while parsing."""
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


def tiny(**overrides) -> vit.VisionTransformer:
    torch.manual_seed(0)
    return vit.create_model("vit_cifar_patch4_32", **{**TINY, **overrides})


def test_depths_and_layer_decay_rates_follow_timm_by_hand():
    """Depth 0: the patch embedding, the position embeddings, the class token; block i: i + 1;
    the final norm and head: 4 (3 blocks). The factor is RATE^(4 - depth)."""
    model = tiny()
    depths = parameter_depths(model)
    expected = {"cls_token": 0, "pos_embed": 0, "patch_embed.proj.weight": 0}
    expected |= {"blocks.0.attn.qkv.weight": 1, "blocks.2.mlp.fc2.bias": 3}
    expected |= {"norm.weight": 4, "head.weight": 4, "head.bias": 4}
    assert {name: depths[name] for name in expected} == expected
    assert set(depths) == {name for name, _ in model.named_parameters()}
    scales = layer_lr_scales(model, 0.5)
    assert scales["cls_token"] == 0.5**4 and scales["blocks.0.norm1.weight"] == 0.5**3
    assert scales["blocks.2.attn.proj.weight"] == 0.5 and scales["head.weight"] == 1.0


@pytest.mark.parametrize("overrides", [{}, {"reg_tokens": 2}, {"global_pool": "avg"}])
def test_layer_decay_is_timms_but_for_the_final_norm(overrides):
    """As the docs say: BEiT's and MAE's depths, which timm's `param_groups_layer_decay` gives
    too (reading `group_matcher`) but for the final norm, which it puts with the last block."""
    from timm.optim import param_groups_layer_decay

    model = tiny(**overrides)
    names = {id(p): name for name, p in model.named_parameters()}
    groups = param_groups_layer_decay(model, layer_decay=0.5)
    timms = {names[id(p)]: group["lr_scale"] for group in groups for p in group["params"]}
    ours = layer_lr_scales(model, 0.5)
    differ = {name for name in ours if ours[name] != timms[name]}
    assert differ == ({"norm.weight", "norm.bias"} if "global_pool" not in overrides else set())
    assert all(ours[name] == 2 * timms[name] for name in differ)


def test_registers_and_distillation_tokens_are_at_depth_zero():
    registers = parameter_depths(tiny(reg_tokens=4))
    assert registers["reg_token"] == 0
    distilled = vit.create_model("deit_small_distilled_patch16_224", num_classes=3, depth=2)
    depths = parameter_depths(distilled)
    assert depths["dist_token"] == 0 and depths["head_dist.weight"] == 3


@pytest.mark.parametrize("opt", ["adamw", "muon"])
def test_layer_decay_gives_each_group_its_depths_rate(opt):
    """Every trainable parameter sits in one group whose learning rate is the base one (--lr for
    AdamW's, --muon-lr for Muon's) times RATE^(top - depth); weight decay on matrices only."""
    model = tiny()
    scales = layer_lr_scales(model, 0.7)
    optimizer = build_optimizer(
        model, opt, lr=1e-3, weight_decay=0.05, muon_lr=2e-2, lr_scales=scales
    )
    names = {id(p): n for n, p in model.named_parameters()}
    seen = []
    for group in optimizer.param_groups:
        base = 2e-2 if group.get("use_muon") else 1e-3
        for param in group["params"]:
            name = names[id(param)]
            seen.append(name)
            assert group["lr"] == pytest.approx(base * scales[name]), name
            decayed = param.ndim > 1 and name not in ("pos_embed", "cls_token")
            assert group["weight_decay"] == (0.05 if decayed else 0.0), name
    assert sorted(seen) == sorted(names.values())
    muon = [g for g in optimizer.param_groups if g.get("use_muon")]
    assert bool(muon) == (opt == "muon")


@pytest.mark.parametrize(("opt", "top"), [("adamw", 1e-3), ("muon", 2e-2)])
def test_the_logged_rate_under_layer_decay_is_the_first_groups_rate_at_the_top(opt, top):
    """metrics.csv's lr is the first group's base rate, before its depth's factor: --lr for
    AdamW, --muon-lr where Muon trains the matrices (its groups come first)."""
    model = tiny()
    optimizer = build_optimizer(
        model, opt, lr=1e-3, weight_decay=0.05, muon_lr=2e-2, lr_scales=layer_lr_scales(model, 0.5)
    )
    assert optimizer.param_groups[0]["lr"] < top  # the first group is a decayed one
    assert top_lr(optimizer) == pytest.approx(top)


@pytest.mark.parametrize("opt", ["sgd", "momentum"])
def test_sgd_steps_as_by_hand_with_decay_on_matrices_only_and_layer_decay(opt):
    """--opt sgd (Nesterov) and momentum (plain), timm's names, over layer decay's groups: two
    steps of every trainable tensor as SGD's formulas give them by hand, the weight decay added
    to the matrices' gradients only, each group at its depth's rate."""
    from vit.training import settings

    model = tiny()
    scales = layer_lr_scales(model, 0.7)
    lr, decay, momentum = 0.1, 0.01, 0.9
    optimizer = build_optimizer(
        model, opt, lr=lr, weight_decay=decay, momentum=momentum, lr_scales=scales
    )
    assert isinstance(optimizer, torch.optim.SGD)
    names = {id(p): n for n, p in model.named_parameters()}
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    buffers: dict[str, torch.Tensor] = {}
    for step in range(2):
        torch.manual_seed(step)
        for param in model.parameters():
            param.grad = torch.randn_like(param)
        for group in optimizer.param_groups:  # by hand, before the step moves the weights
            for param in group["params"]:
                name = names[id(param)]
                decayed = param.ndim > 1 and name not in ("pos_embed", "cls_token")
                grad = param.grad + (decay * weights[name] if decayed else 0)
                # torch's buffer starts as the first gradient, then m b + g
                buffers[name] = grad if step == 0 else momentum * buffers[name] + grad
                update = grad + momentum * buffers[name] if opt == "sgd" else buffers[name]
                weights[name] = weights[name] - lr * scales[name] * update
        optimizer.step()
        for name, param in model.named_parameters():
            torch.testing.assert_close(param.detach(), weights[name], msg=name)
    # the weight decay's default follows the optimizer: SGD's is added to the gradient, Lion's
    # is taken at rates 10x below AdamW's
    defaults = {"sgd": 0.0, "momentum": 0.0, "adamw": 0.05, "muon": 0.05, "lamb": 0.05, "lion": 0.5}
    for name, expected in defaults.items():
        assert settings.resolve_weight_decay(settings.TrainConfig(opt=name)) == expected
    assert settings.resolve_weight_decay(settings.TrainConfig(opt="sgd", weight_decay=1e-4)) == 1e-4


def by_hand_lion(weight, grad, momentum, lr, decay, betas=(0.9, 0.99)):
    """One Lion step (Chen et al. 2023): the sign of a blend of momentum and gradient, the
    weight decay decoupled. (new weight, new momentum)."""
    update = torch.sign(betas[0] * momentum + (1 - betas[0]) * grad)
    weight = weight * (1 - lr * decay) - lr * update
    return weight, betas[1] * momentum + (1 - betas[1]) * grad


def by_hand_lamb(weight, grad, moments, step, lr, decay, betas=(0.9, 0.999), eps=1e-6):
    """One LAMB step (You et al. 2020) as timm's defaults take it, `grad` already clipped: Adam's
    update plus the decay, scaled for a decayed tensor to the ratio of its norm to the update's.
    (new weight, new moments)."""
    mean = betas[0] * moments[0] + (1 - betas[0]) * grad
    square = betas[1] * moments[1] + (1 - betas[1]) * grad**2
    adam = (mean / (1 - betas[0] ** step)) / ((square / (1 - betas[1] ** step)).sqrt() + eps)
    update = adam + decay * weight
    if decay and weight.norm() > 0:  # a zero tensor (the ViT paper's head) takes Adam's step
        update = update * (weight.norm() / update.norm())
    return weight - lr * update, (mean, square)


@pytest.mark.parametrize("opt", ["lamb", "lion"])
def test_lamb_and_lion_step_as_by_hand_with_decay_on_matrices_only_and_layer_decay(opt):
    """--opt lamb and lion, timm's optimizers over layer decay's groups: two steps of every
    trainable tensor by their formulas by hand (LAMB's gradients clipped to a global norm of
    1 first), the weight decay on the matrices only, each group at its depth's rate."""
    model = tiny()
    scales = layer_lr_scales(model, 0.7)
    lr, decay = 0.01, 0.1
    optimizer = build_optimizer(model, opt, lr=lr, weight_decay=decay, lr_scales=scales)
    assert type(optimizer).__name__ == opt.capitalize()
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    state = {n: (torch.zeros_like(w), torch.zeros_like(w)) for n, w in weights.items()}
    for step in (1, 2):
        torch.manual_seed(step)
        grads = {n: torch.randn_like(p) for n, p in model.named_parameters()}
        for name, param in model.named_parameters():
            param.grad = grads[name].clone()
        norm = torch.cat([g.flatten() for g in grads.values()]).norm()
        for name, weight in weights.items():
            rate = lr * scales[name]
            decayed = weight.ndim > 1 and name not in ("pos_embed", "cls_token")
            tensor_decay = decay if decayed else 0
            if opt == "lion":
                weights[name], momentum = by_hand_lion(
                    weight, grads[name], state[name][0], rate, tensor_decay
                )
                state[name] = (momentum, state[name][1])
            else:
                grad = grads[name] / max(norm.item(), 1.0)
                weights[name], state[name] = by_hand_lamb(
                    weight, grad, state[name], step, rate, tensor_decay
                )
        optimizer.step()
        for name, param in model.named_parameters():
            torch.testing.assert_close(param.detach(), weights[name], msg=name)


def test_without_layer_decay_the_groups_are_the_saved_runs_two():
    """Runs saved before layer decay hold AdamW's two groups (decayed, then not): the grouping
    without it must stay that, or their optimizer state would not load on --resume."""
    model = tiny()
    groups = build_optimizer(model, "adamw", lr=1e-3, weight_decay=0.05).param_groups
    assert [g["weight_decay"] for g in groups] == [0.05, 0.0] and "lr_scale" not in groups[0]


def test_frozen_parameters_stay_put_without_optimizer_state_or_decay():
    """--trainable-blocks 1: the last block, the final norm and the head train; the rest keeps
    its values through steps (weight decay included) and has no optimizer state."""
    model = tiny()
    freeze_below(model, 1)
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained == {
        n for n in parameter_depths(model) if n.startswith(("blocks.2.", "norm.", "head."))
    }
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = build_optimizer(model, "adamw", lr=1e-2, weight_decay=0.5)
    for _ in range(3):
        loss = model(torch.randn(4, 3, 32, 32)).logsumexp(dim=1).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    for name, param in model.named_parameters():
        moved = not torch.equal(param, before[name])
        assert moved == (name in trained), name
        assert (param in optimizer.state) == (name in trained), name
    freeze_below(model, 0)  # the head alone
    assert {n for n, p in model.named_parameters() if p.requires_grad} == {
        "head.weight",
        "head.bias",
    }


def test_trainable_blocks_beyond_the_depth_is_one_line():
    with pytest.raises(ValueError, match=r"--trainable-blocks 4: the model has 3 blocks; give 0"):
        freeze_below(tiny(), 4)


def test_probe_head_equals_the_linear_probe_fit(tmp_path, one_thread):
    """--head-init probe: the head holds exactly what the linear probe fits on the model's
    pooled features (the same features, the same protocol and seed)."""
    model = tiny()
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(30, 32, 32, 3), dtype=np.uint8)
    labels = np.repeat(np.arange(3), 10)
    transform = EvalTransform(model.preprocess)
    dataset = ImageDataset(labels=labels, class_names=["a", "b", "c"], images=images)
    dataset = dataset.with_transform(transform)
    fit = probe_head(
        model, dataset, seed=3, batch_size=8, workers=0, device=torch.device("cpu"), amp=False
    )
    with torch.no_grad():
        x = torch.stack([dataset[i][0] for i in range(30)])
        features = model.forward_head(model.forward_features(x), pre_logits=True).double()
    expected = fit_linear_probe(features, torch.as_tensor(labels), num_classes=3, seed=3)
    # the engine's features come in batches of 8, these in one: the same up to rounding
    assert fit.l2 == pytest.approx(expected.l2)
    torch.testing.assert_close(model.head.weight.double(), expected.weight, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(model.head.bias.double(), expected.bias, rtol=1e-4, atol=1e-5)


# -- train.py fine-tuning runs --------------------------------------------------------------------
@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> Path:
    """A 'pretrained' tiny model's weights (random, of another class count) to fine-tune from."""
    path = tmp_path_factory.mktemp("pretrained") / "weights.safetensors"
    vit.save_weights(tiny(num_classes=5), path)
    return path


def finetune_args(image_folder, out, pretrained, epochs, *extra) -> list[str]:
    return [
        "--data", str(image_folder), "--output-dir", str(out), "--epochs", str(epochs),
        *TINY_KWARGS, "--pretrained", str(pretrained), "--batch-size", "8", "--lr", "1e-3",
        "--warmup-epochs", "0", "--workers", "0", "--device", "cpu", "--cache-dir", "none",
        *extra,
    ]  # fmt: skip


FINETUNE = (
    "--layer-decay",
    "0.7",
    "--trainable-blocks",
    "2",
    "--head-init",
    "probe",
    "--val-split",
    "0.25",
)


def test_finetuning_run_logs_its_rates_and_probe_and_resumes_exactly(
    image_folder, pretrained, tmp_path, train_script, monkeypatch, caplog
):
    """Layer decay, the last 2 of 3 blocks trained, the probe's head, a validation split: the
    log says the rates by depth once and the probe's accuracy as epoch 0; the frozen block and
    embeddings end as they began; a run stopped after epoch 1 resumes to the same weights."""
    straight = tmp_path / "straight"
    with caplog.at_level("INFO", logger="vit"):
        assert (
            train_script.main(finetune_args(image_folder, straight, pretrained, 2, *FINETUNE)) == 0
        )
    log = caplog.text
    assert log.count("--layer-decay 0.7: peak learning rate by depth") == 1
    assert "epoch 0/2 (--head-init probe" in log and "validation top-1" in log
    start, end = load_file(pretrained), load_file(straight / "model.safetensors")
    for name in ("pos_embed", "cls_token", "patch_embed.proj.weight", "blocks.0.mlp.fc1.weight"):
        assert torch.equal(start[name], end[name]), name
    assert not torch.equal(start["blocks.1.mlp.fc1.weight"], end["blocks.1.mlp.fc1.weight"])
    config = (straight / "config.yaml").read_text()
    assert "val_split: 0.25" in config and "layer_decay: 0.7" in config

    stopped, source = tmp_path / "stopped", tmp_path / "source.safetensors"
    shutil.copy(pretrained, source)
    with monkeypatch.context() as patch:
        stop_after_first_save(patch)
        assert train_script.main(finetune_args(image_folder, stopped, source, 2, *FINETUNE)) == 130
    source.unlink()  # the run resumes from its own folder: its source may be gone (or offline)
    assert train_script.main(["--resume", str(stopped)]) == 0
    resumed = load_file(stopped / "model.safetensors")
    for name, value in end.items():
        assert torch.equal(resumed[name], value), name
    assert (
        read_rows(stopped / "metrics.csv")[-1]["test_top1"]
        == read_rows(straight / "metrics.csv")[-1]["test_top1"]
    )


@pytest.mark.parametrize(("opt", "lr"), [("sgd", "3e-2"), ("lamb", "1e-3")])
def test_an_sgd_or_lamb_fine_tuning_resumes_to_the_uninterrupted_runs_weights(
    image_folder, pretrained, tmp_path, train_script, monkeypatch, opt, lr
):
    """--opt sgd, the ViT paper's way of fine-tuning, and timm's LAMB: the momentum buffers
    (LAMB's moments and its groups' step counts) are saved with the run, so a run stopped after
    epoch 1 resumes to the weights of one that was not; config.yaml keeps the optimizer and its
    momentum, and the weight decay unset (the optimizer's default)."""
    sgd = ("--opt", opt, "--lr", lr, "--layer-decay", "0.7")
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    assert train_script.main(finetune_args(image_folder, straight, pretrained, 2, *sgd)) == 0
    config = (straight / "config.yaml").read_text()
    assert f"opt: {opt}" in config and "momentum: 0.9" in config
    assert "weight_decay: null" in config
    with monkeypatch.context() as patch:
        stop_after_first_save(patch)
        assert train_script.main(finetune_args(image_folder, stopped, pretrained, 2, *sgd)) == 130
    assert train_script.main(["--resume", str(stopped)]) == 0
    end, resumed = (load_file(run / "model.safetensors") for run in (straight, stopped))
    assert end.keys() == resumed.keys()
    for name, value in end.items():
        assert torch.equal(resumed[name], value), name
    start = load_file(pretrained)["blocks.0.mlp.fc1.weight"]
    assert not torch.equal(end["blocks.0.mlp.fc1.weight"], start)  # every block trained


def test_muon_layer_decay_logs_the_rates_muon_and_adamw_apply(
    image_folder, pretrained, tmp_path, train_script, caplog
):
    """--opt muon with a --muon-lr of its own: the log's rates by depth were --lr's for every
    parameter, where Muon's groups take --muon-lr's (and metrics.csv's lr is Muon's). Each
    list now says whose rates it gives, and the column follows the one it names."""
    run = tmp_path / "run"
    muon = ("--opt", "muon", "--muon-lr", "2e-2", "--layer-decay", "0.5", "--min-lr", "1e-3")
    with caplog.at_level("INFO", logger="vit"):  # --min-lr = --lr: the peak rates throughout
        assert train_script.main(finetune_args(image_folder, run, pretrained, 1, *muon)) == 0
    assert (
        "(0: patch and position embeddings, prefix tokens; 1-3: the blocks; 4: the final norm "
        "and head): Muon's matrices (top 0.02, metrics.csv's lr): 1: 0.0025, 2: 0.005, 3: 0.01; "
        "the AdamW rest (top 0.001): 0: 6.25e-05, 1: 0.000125, 2: 0.00025, 3: 0.0005, 4: 0.001"
    ) in caplog.text
    assert float(read_rows(run / "metrics.csv")[-1]["lr"]) == pytest.approx(0.02)


def test_validation_split_is_stratified_seeded_and_apart_from_training(image_folder, caplog):
    from vit.data.datasets import load_split
    from vit.training.build import validation_split

    train = load_split(str(image_folder), "train", cache=True)
    with caplog.at_level(logging.INFO, logger="vit"):
        assert len(validation_split(train, 0.01, seed=1)[1]) == 3  # one a class, not 1%: said
    assert "--val-split 0.01: 3 of the 48 training images held out to evaluate on (6.2%" in (
        caplog.text
    )
    kept, held = validation_split(train, 0.25, seed=1)
    again = validation_split(train, 0.25, seed=1)[1]
    other = validation_split(train, 0.25, seed=2)[1]
    assert len(kept) + len(held) == len(train)
    assert np.bincount(held.labels).tolist() == [4, 4, 4]  # 16 a class, a quarter held out
    assert list(held.paths) == list(again.paths) and list(held.paths) != list(other.paths)
    assert not set(held.paths) & set(kept.paths)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--layer-decay", "0"), "--layer-decay 0.0: "),
        (("--layer-decay", "1.5"), "--layer-decay 1.5: "),
        (("--val-split", "1"), "--val-split 1.0: "),
        (("--trainable-blocks", "4"), "--trainable-blocks 4: the model has 3 blocks"),
        ((*TINY_KWARGS, "global_pool=''"), "the model outputs every token, not one prediction"),
        # as a shell passes `global_pool=''` on: it was None ("got None")
        ((*TINY_KWARGS, "global_pool="), "the model outputs every token, not one prediction"),
        # weights of another width than --model's (its default, never typed): name the way out
        ((*TINY_KWARGS, "embed_dim=64"), "needs its architecture as --model NAME"),
        # the same width, another MLP: tensors of other shapes, the same way out
        ((*TINY_KWARGS, "mlp_ratio=3"), "needs its architecture as --model NAME"),
    ],
)
def test_bad_fine_tuning_settings_are_one_line_and_write_nothing(
    image_folder, pretrained, tmp_path, train_script, capsys, extra, message
):
    out = tmp_path / "run"
    assert (
        exit_status(train_script.main, finetune_args(image_folder, out, pretrained, 1, *extra)) == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not out.exists()


def test_trainable_blocks_beyond_the_depth_is_refused_before_weights_are_read(
    image_folder, pretrained, tmp_path, train_script, capsys, monkeypatch
):
    """The depth is --model's (and --model-kwargs'): --trainable-blocks 4 of 3 blocks was
    refused only once the pretrained weights were read (minutes, for large ones)."""
    import vit.factory.create as create

    read, original = [], create.read_checkpoint

    def reading(source):
        read.append(source)
        return original(source)

    monkeypatch.setattr(create, "read_checkpoint", reading)
    args = finetune_args(image_folder, tmp_path / "run", pretrained, 1, "--trainable-blocks", "4")
    assert exit_status(train_script.main, args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--trainable-blocks 4: the model has 3 blocks; give 0" in err[0], err
    assert read == []


@pytest.mark.parametrize("flag", [("--trainable-blocks", "0"), ("--head-init", "probe")])
def test_head_only_or_probe_without_pretrained_weights_is_refused(
    image_folder, tmp_path, train_script, capsys, flag, tiny_args
):
    out = tmp_path / "run"
    assert exit_status(train_script.main, tiny_args(image_folder, out, 1, *flag)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no --pretrained was given" in err[0], err
    assert not out.exists()


def test_head_only_run_evaluates_as_an_ordinary_run_folder(
    image_folder, pretrained, tmp_path, train_script, evaluate_script
):
    """--trainable-blocks 0 with the probe: only the head moves, and the run folder is one
    evaluate.py takes."""
    run = tmp_path / "run"
    args = finetune_args(
        image_folder, run, pretrained, 1, "--trainable-blocks", "0", "--head-init", "probe"
    )
    assert train_script.main(args) == 0
    start, end = load_file(pretrained), load_file(run / "model.safetensors")
    assert all(torch.equal(start[n], end[n]) for n in start if not n.startswith("head."))
    # the probed head (epoch 0) competes for best.safetensors with the epochs after it
    # (here the probe separates the three colours, 100%, and the epoch after it does not)
    best = read_metadata(run / "best.safetensors")
    epochs = [float(row["ema_top1"]) for row in read_rows(run / "metrics.csv")]
    assert best["vit.epoch"] == 0 and best["vit.top1"] > max(epochs)
    report = tmp_path / "report.json"
    assert (
        evaluate_script.main(
            [
                "--checkpoint",
                str(run),
                "--data",
                str(image_folder),
                "--json",
                str(report),
                "--workers",
                "0",
            ]
        )
        == 0
    )
    assert math.isfinite(json.loads(report.read_text())["top1"])


# Every family, headless backbones included, from a weights file of its own (random, one block:
# blocks add cost, not code paths), at a few patches a side: fine-tuned with every lever, then
# evaluated as a run folder.
FAMILY_MODELS = [
    "vit_small_patch14_reg4_dinov2",
    "vit_small_patch14_dinov2",
    "vit_base_patch32_clip_quickgelu_224",
    "vit_base_patch16_siglip_224",
    "deit_tiny_distilled_patch16_224",
    "vit_small_patch16_224.dino",
    "vit_base_patch16_224.mae",
]


@pytest.mark.parametrize("name", FAMILY_MODELS)
def test_every_family_fine_tunes_and_its_run_evaluates(
    name, image_folder, tmp_path, train_script, evaluate_script
):
    source = vit.create_model(name, depth=2)
    patch = source.patch_embed.patch_size[0]
    weights = tmp_path / "pretrained.safetensors"
    vit.save_weights(source, weights)
    run = tmp_path / "run"
    args = [
        "--data", str(image_folder), "--output-dir", str(run), "--epochs", "1",
        "--model", name, "--model-kwargs", "depth=2", "--pretrained", str(weights),
        "--img-size", str(2 * patch), "--batch-size", "8", "--warmup-epochs", "0.5",
        "--workers", "0", "--device", "cpu", "--cache-dir", "none",
        "--trainable-blocks", "1", "--layer-decay", "0.7", "--head-init", "probe",
    ]  # fmt: skip
    assert train_script.main(args) == 0
    start, end = load_file(weights), load_file(run / "model.safetensors")
    assert torch.equal(start["blocks.0.attn.qkv.weight"], end["blocks.0.attn.qkv.weight"])
    assert not torch.equal(start["blocks.1.attn.qkv.weight"], end["blocks.1.attn.qkv.weight"])
    report = tmp_path / "report.json"
    evaluate = ["--checkpoint", str(run), "--data", str(image_folder), "--workers", "0"]
    assert evaluate_script.main([*evaluate, "--json", str(report)]) == 0
    assert json.loads(report.read_text())["num_images"] == 18


@pytest.mark.parametrize(
    ("name", "pool"), [("vit_base_patch16_224.mae", "avg"), ("vit_small_patch16_224.dino", "token")]
)
def test_headless_backbones_fine_tune_with_their_papers_readout(name, pool, tmp_path):
    """MAE fine-tunes with the mean patch token, normalised (fc_norm: the encoder's final norm
    moves there); DINO with its class token, as its weights have it. --model-kwargs
    global_pool=... chooses otherwise."""
    from vit.training.build import build_training_model
    from vit.training.settings import TrainConfig

    source = vit.create_model(name, depth=1)
    weights = tmp_path / "backbone.safetensors"
    vit.save_weights(source, weights)
    settings = dict(model=name, pretrained=str(weights), img_size=32, model_kwargs={"depth": 1})
    model = build_training_model(TrainConfig(**settings), ["a", "b"])
    assert model.global_pool == pool and model.num_classes == 2
    final_norm = model.fc_norm if pool == "avg" else model.norm
    assert torch.equal(final_norm.weight, source.norm.weight)
    settings["model_kwargs"] = {"depth": 1, "global_pool": "token"}
    assert build_training_model(TrainConfig(**settings), ["a", "b"]).global_pool == "token"


def test_average_pooled_weights_give_their_fc_norm_to_a_class_token_models_norm(tmp_path):
    """The other direction of the move above: a model fine-tuned with avg pooling (fc_norm)
    loaded into one that reads the class token normalises every token with that norm."""
    torch.manual_seed(0)
    source = vit.VisionTransformer(**TINY, global_pool="avg")
    with torch.no_grad():  # not LayerNorm's initial ones and zeros: the values must travel
        source.fc_norm.weight.normal_(), source.fc_norm.bias.normal_()
    weights = vit.save_weights(source, tmp_path / "avg.safetensors")
    target = vit.VisionTransformer(**TINY, global_pool="token")
    vit.load_weights(target, weights)
    assert torch.equal(target.norm.weight, source.fc_norm.weight)
    assert torch.equal(target.norm.bias, source.fc_norm.bias)


def source_of(kind: str, folder: Path, monkeypatch) -> tuple[list[str], dict]:
    """(train.py's model flags, the source's own state dict) for weights read from `kind`:
    timm's name through an offline Hugging Face cache, or a transformers folder; each at two
    patches a side."""
    import huggingface_hub.constants
    import timm
    import transformers

    torch.manual_seed(0)
    if kind == "timm name":
        name = "deit_tiny_distilled_patch16_224"
        theirs = timm.create_model(name)
        fake_hub_cache(folder, f"timm/{name}.fb_in1k", "model.safetensors", theirs.state_dict())
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(folder))
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        return ["--model", name, "--pretrained", "--img-size", "32"], theirs.state_dict()
    # ViT-S/14's widths with one layer: --model vit_small_patch14_dinov2 --model-kwargs depth=1
    config = transformers.Dinov2Config(
        hidden_size=384, num_hidden_layers=1, num_attention_heads=6, intermediate_size=1536
    )
    transformers.Dinov2Model(config).save_pretrained(folder)
    flags = [
        "--model", "vit_small_patch14_dinov2", "--model-kwargs", "depth=1",
        "--pretrained", str(folder), "--img-size", "28",
    ]  # fmt: skip
    return flags, vit.load_model(str(folder)).state_dict()


@pytest.mark.parametrize("kind", ["timm name", "transformers folder"])
def test_fine_tunes_from_a_timm_name_and_a_transformers_folder(
    kind, image_folder, tmp_path, monkeypatch, train_script
):
    """The last block and the head train from the source's weights; what is frozen is the
    source's, exactly (our own file: test_every_family_fine_tunes_and_its_run_evaluates)."""
    model_flags, source = source_of(kind, tmp_path / "source", monkeypatch)
    run = tmp_path / "run"
    args = [
        "--data", str(image_folder), "--output-dir", str(run), "--epochs", "1", *model_flags,
        "--batch-size", "8", "--warmup-epochs", "0", "--workers", "0", "--device", "cpu",
        "--cache-dir", "none", "--trainable-blocks", "1", "--head-init", "probe",
    ]  # fmt: skip
    assert train_script.main(args) == 0
    end = load_file(run / "model.safetensors")
    last = len([k for k in source if k.endswith(".attn.qkv.weight")]) - 1
    assert torch.equal(end["patch_embed.proj.weight"], source["patch_embed.proj.weight"])
    if last > 0:
        assert torch.equal(end["blocks.0.attn.qkv.weight"], source["blocks.0.attn.qkv.weight"])
    trained = f"blocks.{last}.attn.qkv.weight"
    assert not torch.equal(end[trained], source[trained])


def test_a_kept_head_answers_for_the_data_classes_its_weights_record(
    image_folder, tmp_path, train_script, caplog
):
    """A head of the data's size was kept whatever classes its weights recorded: fine-tuning
    on the same classes in another order (or on others) trained each row for another class.
    The same classes get the rows in the data's order; other classes a new head."""
    source = tiny()
    torch.nn.init.normal_(source.head.weight)
    torch.nn.init.normal_(source.head.bias)
    reversed_names = list(reversed(CLASSES))  # the data's are ("blue", "green", "red")
    path = vit.save_weights(source, tmp_path / "w.safetensors", class_names=reversed_names)
    loaded = vit.create_model("vit_cifar_patch4_32", pretrained=path, **TINY)
    assert loaded.class_names == reversed_names  # the kept head's classes, as the file says
    head = load_file(path)
    for names, out in ((reversed_names, "reordered"), (["cat", "dog", "emu"], "new")):
        path = vit.save_weights(source, tmp_path / f"{out}.safetensors", class_names=names)
        tiny_rate = ("--lr", "1e-12", "--min-lr", "0")
        args = finetune_args(image_folder, tmp_path / out, path, 1, *tiny_rate)
        with caplog.at_level("INFO", logger="vit"):
            assert train_script.main(args) == 0
        model = vit.load_model(tmp_path / out / "model.safetensors")
        weight = model.head.weight.detach()
        if out == "reordered":  # a learning rate of 1e-12: the rows as they started
            assert "its rows put in --data's order" in caplog.text
            torch.testing.assert_close(weight, head["head.weight"].flip(0), rtol=0, atol=1e-9)
        else:
            assert "3-class head answered for other classes (cat, dog, emu)" in caplog.text
            assert weight.abs().max() < 1e-6  # a new (zero) head, barely moved


def test_val_split_needs_no_test_split(image_folder, pretrained, tmp_path, train_script):
    """--val-split reads the train split alone: a folder without test/ trains and keeps a best
    model chosen on the images held out."""
    import shutil

    data = tmp_path / "data"
    shutil.copytree(image_folder / "train", data / "train")
    run = tmp_path / "run"
    assert train_script.main(finetune_args(data, run, pretrained, 1, "--val-split", "0.25")) == 0
    assert (run / "best.safetensors").is_file()
    assert len(read_rows(run / "metrics.csv")) == 1


@pytest.mark.parametrize("source", ["our file", "transformers folder"])
def test_mae_weights_are_told_by_what_they_say_of_themselves(source, tmp_path):
    """MAE weights under a path and a --model that do not say "mae": our file's model name, a
    transformers folder's model_type "vit_mae", still give MAE's readout."""
    import transformers

    from vit.training.build import build_training_model
    from vit.training.settings import TrainConfig

    if source == "our file":
        weights = tmp_path / "backbone.safetensors"
        mae = vit.create_model("vit_base_patch16_224.mae", depth=1)
        vit.save_weights(mae, weights, model_name="vit_base_patch16_224.mae")
    else:
        weights = tmp_path / "backbone"
        config = transformers.ViTMAEConfig(num_hidden_layers=1, mask_ratio=0.0)
        transformers.ViTMAEModel(config).save_pretrained(weights)
    settings = dict(
        model="vit_base_patch16_224", pretrained=str(weights), img_size=32,
        model_kwargs={"depth": 1},
    )  # fmt: skip
    assert build_training_model(TrainConfig(**settings), ["a", "b"]).global_pool == "avg"
    plain = tmp_path / "plain.safetensors"
    vit.save_weights(vit.create_model("vit_base_patch16_224", depth=1), plain)
    settings["pretrained"] = str(plain)
    assert build_training_model(TrainConfig(**settings), ["a", "b"]).global_pool == "token"


def test_a_new_head_reading_by_attention_pool_trains_the_pool_it_brings(tmp_path):
    """--trainable-blocks 0 trains the head alone, and with it the attention pool a new head
    brings where the weights had none (global_pool=map on a class-token backbone); a pool the
    weights gave (SigLIP's) stays frozen with the blocks."""
    from vit.training.build import build_training_model
    from vit.training.settings import TrainConfig

    def trained(weights: Path) -> set[str]:
        settings = dict(
            model="vit_cifar_patch4_32", pretrained=str(weights), trainable_blocks=0,
            model_kwargs={"depth": 3, "embed_dim": 32, "num_heads": 2, "global_pool": "map"},
        )  # fmt: skip
        model = build_training_model(TrainConfig(**settings), ["a", "b", "c"])
        return {n.split(".")[0] for n, p in model.named_parameters() if p.requires_grad}

    token = tmp_path / "token.safetensors"
    vit.save_weights(tiny(num_classes=0), token)
    assert trained(token) == {"head", "attn_pool"}
    pooled = tmp_path / "map.safetensors"
    vit.save_weights(tiny(num_classes=0, global_pool="map"), pooled)
    assert trained(pooled) == {"head"}
    # and the other way: a new head that reads the class token drops the weights' pool
    report = vit.load_weights(tiny(num_classes=3), pooled)
    assert report.fresh_head and not any(k.startswith("attn_pool.") for k in report.loaded)
    assert any("dropped the weights' attention pool" in m for m in report.messages)


def test_weights_without_the_models_tensors_are_one_line_and_write_nothing(
    image_folder, tmp_path, train_script, capsys
):
    """A 3-class model's weights (its head kept) into a model that reads by an attention pool
    they lack: one line naming the first missing tensors and their count (the pool's 13), not a
    KeyError's traceback."""
    weights = tmp_path / "three-classes.safetensors"
    vit.save_weights(tiny(), weights)
    out = tmp_path / "run"
    args = finetune_args(image_folder, out, weights, 1, *TINY_KWARGS, "global_pool=map")
    assert exit_status(train_script.main, args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--pretrained: " in err[0] and "attn_pool.latent" in err[0], err
    assert "... (13 in all)" in err[0], err
    assert not out.exists()
