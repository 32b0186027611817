"""vit.inference.probe and evaluate.py --knn / --linear-probe: weighted kNN as DINO scores it,
the CLIP linear probe, the feature caches beside the report, and the one-line mistakes."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
import torch

import vit
from vit.inference.probe import (
    check_ks,
    dataset_features,
    fit_logistic_regression,
    knn_accuracy,
    knn_rankings,
    linear_probe,
    stratified_holdout,
    topk_accuracy,
)


def blobs(seed: int, per_class: int, classes: int, dim: int, spread: float):
    """Gaussian blobs around `classes` random centres (norm ~ sqrt(dim) * 3)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(classes, dim)) * 3
    labels = np.repeat(np.arange(classes), per_class)
    return centres[labels] + rng.normal(size=(len(labels), dim)) * spread, labels


# -- kNN -----------------------------------------------------------------------------------------
def test_knn_on_separated_blobs_is_always_right():
    train_x, train_y = blobs(0, per_class=30, classes=4, dim=16, spread=0.3)
    test_x, test_y = blobs(0, per_class=10, classes=4, dim=16, spread=0.3)  # the same centres
    scores = knn_accuracy(train_x, train_y, test_x, test_y, ks=(1, 10, 20, 100))
    assert scores == {k: {"top1": 1.0, "top5": 1.0} for k in (1, 10, 20, 100)}
    shuffled = np.random.default_rng(1).permutation(test_y)  # wrong labels score less
    assert knn_accuracy(train_x, train_y, test_x, shuffled, ks=(20,))[20]["top1"] < 0.6


def test_knn_votes_are_weighted_by_exp_similarity_over_temperature():
    """One test image at angle 0; training images at cosine 1 (class 0), 0.9 and 0.8 (class
    1). Three neighbours: class 0 votes e^(1/T), class 1 e^(0.9/T) + e^(0.8/T)."""
    angles = np.arccos([1.0, 0.9, 0.8])
    train = np.stack([np.cos(angles), np.sin(angles)], axis=1) * [[1.0], [7.0], [0.2]]  # norms
    labels = np.array([0, 1, 1])
    test = np.array([[3.0, 0.0]])  # features are L2-normalised first: the norms play no part
    # T = 0.07 (DINO's): e^14.29 > e^12.86 + e^11.43, so class 0
    assert knn_rankings(train, labels, test, ks=(3,))[3].tolist() == [[0, 1]]
    # T = 1: e^1 = 2.72 < e^0.9 + e^0.8 = 4.69, so class 1
    assert math.e < math.exp(0.9) + math.exp(0.8)
    assert knn_rankings(train, labels, test, ks=(3,), temperature=1.0)[3].tolist() == [[1, 0]]
    # one neighbour: the nearest alone decides
    assert knn_rankings(train, labels, test, ks=(1,), temperature=1.0)[1].tolist() == [[0, 1]]


def test_knn_similarity_is_the_cosine_whatever_the_test_features_norm():
    """Weights are exp(cos / T): training images at cosine 1 (class 0), 0.9 and 0.8 (class 1),
    T = 1, give class 1 (e^1 < e^0.9 + e^0.8) at any norm of the test feature; unnormalised,
    one of norm 10 would give class 0 (e^10 > e^9 + e^8)."""
    angles = np.arccos([1.0, 0.9, 0.8])
    train = np.stack([np.cos(angles), np.sin(angles)], axis=1)
    labels = np.array([0, 1, 1])
    for norm in (0.1, 1.0, 10.0):
        test = np.array([[norm, 0.0]])
        ranking = knn_rankings(train, labels, test, ks=(3,), temperature=1.0)[3]
        assert ranking.tolist() == [[1, 0]], norm


def test_knn_equal_votes_go_to_the_lower_class_index():
    train = np.array([[0.0, 1.0], [0.0, -1.0]])  # both at cosine 0 to the test image
    test = np.array([[1.0, 0.0]])
    for labels in ([1, 0], [0, 1]):
        ranking = knn_rankings(train, np.array(labels), test, ks=(2,))[2]
        assert ranking.tolist() == [[0, 1]]


def test_knn_blocks_of_any_size_give_the_same_answers():
    rng = np.random.default_rng(0)
    train, labels = rng.normal(size=(200, 12)), rng.integers(0, 7, 200)
    test = rng.normal(size=(37, 12))
    expected = knn_rankings(train, labels, test, ks=(10, 20, 100, 200))
    for block in (1, 5, 36, 37, 1000):
        got = knn_rankings(train, labels, test, ks=(10, 20, 100, 200), block_size=block)
        assert all(torch.equal(got[k], expected[k]) for k in expected)
    assert expected[10].shape == (37, 5)


def test_top5_counts_a_label_ranked_fifth_and_not_one_ranked_sixth():
    ranking = torch.tensor([[9, 8, 7, 6, 5, 4], [9, 8, 7, 6, 5, 4]])  # (2, 6), best first
    assert topk_accuracy(ranking, torch.tensor([5, 4])) == (0.0, 0.5)  # 5th: in; 6th: out
    assert topk_accuracy(ranking, torch.tensor([9, 6])) == (0.5, 1.0)


def test_k_larger_than_the_training_set_is_refused():
    with pytest.raises(
        ValueError,
        match=r"kNN with k = 200: k must be between 1 and the number of training images \(5\)",
    ):
        knn_rankings(np.eye(5), np.arange(5), np.eye(5), ks=(3, 200))
    check_ks((5,), 5)  # k = N is allowed: every training image votes


# -- linear probe --------------------------------------------------------------------------------
def test_the_held_out_part_is_stratified_and_seeded():
    labels = np.repeat([0, 1, 2], [10, 20, 5])
    fit, held = stratified_holdout(labels, 0.2, seed=0)
    assert np.bincount(labels[held]).tolist() == [2, 4, 1]
    assert sorted([*fit, *held]) == list(range(35))
    assert np.array_equal(held, stratified_holdout(labels, 0.2, seed=0)[1])
    assert not np.array_equal(held, stratified_holdout(labels, 0.2, seed=1)[1])


def test_logistic_regression_minimises_summed_cross_entropy_plus_half_the_l2_norm():
    """At the minimum of sum CE + l2/2 ||W||^2 (scikit-learn's C = 1/l2) the gradient is zero:
    X^T (P - Y) + l2 W = 0, and for the unpenalised bias sum(P - Y) = 0."""
    rng = np.random.default_rng(0)
    x = torch.as_tensor(rng.normal(size=(60, 5)))  # (N, D) float64
    y = torch.as_tensor(rng.integers(0, 3, 60))
    l2 = 4.0
    weight, bias = fit_logistic_regression(x, y, num_classes=3, l2=l2)
    residual = torch.softmax(x @ weight.T + bias, dim=1) - torch.nn.functional.one_hot(y, 3)
    assert weight.abs().max() > 0.05  # not a trivial fit
    zeros = torch.zeros(3, 5, dtype=torch.float64)
    torch.testing.assert_close(residual.T @ x + l2 * weight, zeros, atol=3e-2, rtol=0)
    torch.testing.assert_close(residual.sum(0), zeros[:, 0], atol=3e-2, rtol=0)


def test_linear_probe_separates_separable_data_and_reports_its_search(one_thread):
    train_x, train_y = blobs(0, per_class=20, classes=3, dim=6, spread=0.2)
    test_x, test_y = blobs(0, per_class=10, classes=3, dim=6, spread=0.2)
    result = linear_probe(train_x, train_y, test_x, test_y, seed=0, max_iter=50)
    assert result["top1"] == 1.0 and result["top5"] == 1.0
    search = result["search"]
    l2s = [row["l2"] for row in search]
    assert l2s == sorted(l2s) and l2s[0] == pytest.approx(1e-6) and l2s[-1] == pytest.approx(1e6)
    # CLIP's search: 7 starting values, then 2 more per halving of the step down to 1/8 decade
    assert 7 < len(search) <= 15
    steps = np.diff(np.log10(l2s))
    assert steps.min() == pytest.approx(0.125)
    best = max(row["heldout_top1"] for row in search)
    chosen = [row for row in search if row["l2"] == result["l2"]]
    assert chosen and chosen[0]["heldout_top1"] == best
    # on a tie, the strongest regularisation: every larger λ scored less
    assert all(row["heldout_top1"] < best for row in search if row["l2"] > result["l2"])
    assert result["C"] == pytest.approx(1 / result["l2"])
    assert (result["fit_images"], result["heldout_images"]) == (48, 12)


def test_linear_probe_regularises_noisy_data_and_is_deterministic(one_thread):
    """Few noisy images in many dimensions: the unregularised fit overfits, and the search
    finds a stronger λ that does better on the held-out part."""
    rng = np.random.default_rng(0)
    direction = rng.normal(size=40)

    def noisy(n: int):
        labels = rng.integers(0, 2, n)
        return rng.normal(size=(n, 40)) * 3 + np.outer(2 * labels - 1, direction) * 0.5, labels

    train_x, train_y = noisy(80)
    test_x, test_y = noisy(400)
    result = linear_probe(train_x, train_y, test_x, test_y, seed=0, max_iter=50)
    search = {row["l2"]: row["heldout_top1"] for row in result["search"]}
    assert result["l2"] > 1e-6 and search[result["l2"]] > search[min(search)]
    assert result["top1"] > 0.6  # chance is 0.5
    again = linear_probe(train_x, train_y, test_x, test_y, seed=0, max_iter=50)
    assert again == result


# -- features ------------------------------------------------------------------------------------
def tiny_model(num_classes: int = 3, seed: int = 0) -> vit.VisionTransformer:
    torch.manual_seed(seed)
    return vit.create_model(
        "vit_cifar_patch4_32", num_classes=num_classes, depth=1, embed_dim=32, num_heads=2
    )


def test_dataset_features_are_cached_and_reused_only_for_the_same_model(
    image_folder, tmp_path, one_thread
):
    from vit.data.datasets import load_split
    from vit.data.transforms import EvalTransform

    model = tiny_model()
    data = load_split(str(image_folder), "test", transform=EvalTransform(model.preprocess))
    cache = tmp_path / "features-test.npz"
    features, labels = dataset_features(model, data, cache, batch_size=5)
    assert features.shape == (18, 32) and features.dtype == np.float32
    assert labels.dtype == np.int64 and labels.tolist() == data.labels.tolist()
    with torch.no_grad():  # the pooled pre-logits embedding of each image, in order
        images = torch.stack([data[i][0] for i in range(len(data))])
        expected = model.eval().forward_head(model.forward_features(images), pre_logits=True)
    np.testing.assert_allclose(features, expected.numpy(), rtol=1e-5, atol=1e-5)
    stamp = cache.stat().st_mtime_ns

    def never(*args, **kwargs):
        raise AssertionError("extracted again although the cache holds these features")

    import vit.inference.probe

    original, vit.inference.probe.extract_features = vit.inference.probe.extract_features, never
    try:
        again, _ = dataset_features(model, data, cache)
    finally:
        vit.inference.probe.extract_features = original
    assert np.array_equal(again, features) and cache.stat().st_mtime_ns == stamp
    other, _ = dataset_features(tiny_model(seed=1), data, cache)  # other weights: extracted
    assert not np.allclose(other, features)
    assert np.array_equal(np.load(cache)["features"], other)


# -- evaluate.py ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny 3-class model with class names, and a headless one, as weights files."""
    folder = tmp_path_factory.mktemp("weights")
    vit.save_weights(tiny_model(), folder / "head.safetensors", ["blue", "green", "red"], "tiny")
    vit.save_weights(tiny_model(num_classes=0), folder / "headless.safetensors")
    return folder


def probe_args(weights, data, out, *more) -> list[str]:
    return ["--checkpoint", str(weights), "--data", str(data), "--output-dir", str(out),
            "--workers", "0", "--device", "cpu", "--batch-size", "8", *more]  # fmt: skip


def test_knn_and_linear_probe_end_to_end_reuse_the_features(
    checkpoint, image_folder, tmp_path, evaluate_script, capsys, one_thread
):
    out = tmp_path / "out"
    argv = probe_args(checkpoint / "head.safetensors", image_folder, out,
                      "--knn", "--knn-k", "5", "20", "--linear-probe")  # fmt: skip
    assert evaluate_script.main(argv) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["num_images"] == 18 and 0 <= report["top1"] <= 1  # the head, kept
    assert list(report["knn"]["by_k"]) == ["5", "20"] and report["knn"]["lead_k"] == 20
    assert report["knn_top1"] == report["knn"]["by_k"]["20"]["top1"]
    assert (report["knn"]["train_images"], report["knn"]["test_images"]) == (48, 18)
    assert report["linear_probe_top1"] == report["linear_probe"]["top1"]
    assert report["linear_probe"]["l2"] in [row["l2"] for row in report["linear_probe"]["search"]]
    # the colour classes are easy for the features of even a random tiny model
    assert report["knn_top1"] > 0.8 and report["linear_probe_top1"] > 0.8
    printed = capsys.readouterr().out
    assert "    k    top-1    top-5\n" in printed
    assert f"   20  {100 * report['knn_top1']:6.2f}%" in printed
    assert f"linear probe: top-1 {100 * report['linear_probe_top1']:.2f}%" in printed
    splits = report["features"]["splits"]
    assert not splits["train"]["reused"] and splits["train"]["images"] == 48
    stamps = {name: (out / f"features-{name}.npz").stat().st_mtime_ns for name in splits}

    assert evaluate_script.main(argv) == 0  # again: the features are read, not extracted
    second = json.loads((out / "report.json").read_text())
    assert all(second["features"]["splits"][name]["reused"] for name in splits)
    assert stamps == {name: (out / f"features-{name}.npz").stat().st_mtime_ns for name in splits}
    assert second["knn"] == report["knn"] and second["linear_probe"] == report["linear_probe"]


@pytest.mark.parametrize(
    "name", ["report.json", "confusion_matrix.png", "features-train.npz", "features-test.npz"]
)
def test_a_users_file_in_the_output_folder_is_replaced_only_with_overwrite(
    checkpoint, image_folder, tmp_path, evaluate_script, capsys, one_thread, name
):
    """A file of a name evaluate.py writes, that it did not write (a report, a picture, a
    `vit.predict --features` file of hours), is refused in one line and left as it was;
    --overwrite replaces it (evaluate.py's own reports and caches are replaced without it:
    the test above)."""
    out = tmp_path / "mine"
    out.mkdir()
    users = out / name
    with open(users, "wb") as f:  # an .npz, but no evaluate.py cache (any name: a file object)
        np.savez(f, features=np.zeros((2, 3)))
    before = users.read_bytes()
    argv = probe_args(checkpoint / "head.safetensors", image_folder, out, "--knn", "--knn-k", "5")
    with pytest.raises(SystemExit) as stopped:
        evaluate_script.main(argv)
    assert stopped.value.code == 2
    assert capsys.readouterr().err == (
        f"evaluate.py: error: --output-dir {out}: {name} there is not one evaluate.py wrote, and "
        f"this evaluation would replace it; add --overwrite to replace it, or choose another "
        f"--output-dir\n"
    )
    assert users.read_bytes() == before and sorted(out.iterdir()) == [users]
    assert evaluate_script.main([*argv, "--overwrite"]) == 0
    assert users.read_bytes() != before
    assert evaluate_script.main(argv) == 0  # now evaluate.py's own: replaced without it


def test_ctrl_c_is_one_line_naming_what_was_kept(
    checkpoint, image_folder, tmp_path, evaluate_script, capsys, monkeypatch
):
    """Ctrl-C while the features are extracted: one line (no traceback) saying the report was
    not written and which finished shards the same command continues from; exit status 130."""
    import vit.inference.probe
    from vit.inference.embed import parts_folder

    def interrupted(model, dataset, work_path, **kwargs):  # Ctrl-C after a shard was saved
        parts_folder(work_path).mkdir(parents=True)
        (parts_folder(work_path) / "shard-00000.npz").write_bytes(b"")
        raise KeyboardInterrupt

    monkeypatch.setattr(vit.inference.probe, "extract_features", interrupted)
    out = tmp_path / "out"
    argv = probe_args(checkpoint / "head.safetensors", image_folder, out, "--knn", "--knn-k", "5")
    assert evaluate_script.main(argv) == 130
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"evaluate.py: interrupted; {out / 'report.json'} not written; 1 finished shard of the "
        f"features kept in {out}, from which the same command continues"
    )
    assert not (out / "report.json").exists()


def test_under_torchrun_it_says_once_that_it_runs_in_one_process(
    checkpoint, image_folder, tmp_path, evaluate_script, capsys, monkeypatch
):
    """Each process would evaluate everything and lock the others out of the report (blaming
    a sibling for holding it): rank 0 says in one line to start it alone; nothing is made."""
    out = tmp_path / "out"
    argv = probe_args(checkpoint / "head.safetensors", image_folder, out)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert evaluate_script.main(argv) == 2
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(SystemExit) as stopped:
        evaluate_script.main(argv)
    assert stopped.value.code == 2
    assert capsys.readouterr().err == (
        "evaluate.py: error: runs in one process: start it without torchrun (python -m "
        "vit.predict --features splits images between processes)\n"
    )
    assert not out.exists()


def test_a_headless_backbone_is_scored_by_its_features_only(
    checkpoint, image_folder, tmp_path, evaluate_script, capsys, one_thread
):
    out = tmp_path / "out"
    plain = probe_args(checkpoint / "headless.safetensors", image_folder, out)
    assert evaluate_script.main(plain) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--knn and/or --linear-probe" in err
    assert not out.exists()
    assert evaluate_script.main([*plain, "--knn", "--knn-k", "5", "--subset", "9"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert "top1" not in report and not (out / "confusion_matrix.png").exists()
    assert (report["knn"]["train_images"], report["knn"]["test_images"]) == (9, 9)  # --subset
    assert "linear_probe" not in report
    printed = capsys.readouterr().out
    assert printed.startswith("kNN on pooled features: 9 train / 9 test images")


def test_train_subset_bounds_the_training_split_alone(
    checkpoint, image_folder, tmp_path, evaluate_script, one_thread
):
    out = tmp_path / "out"
    argv = probe_args(checkpoint / "headless.safetensors", image_folder, out, "--knn",
                      "--knn-k", "3", "--train-subset", "12")  # fmt: skip
    assert evaluate_script.main(argv) == 0
    splits = json.loads((out / "report.json").read_text())["features"]["splits"]
    assert (splits["train"]["images"], splits["test"]["images"]) == (12, 18)
    labels = np.load(out / "features-train.npz")["labels"]
    assert np.bincount(labels).tolist() == [4, 4, 4]  # stratified


def test_mistakes_are_one_line_and_write_nothing(
    checkpoint, image_folder, make_images, tmp_path, evaluate_script, capsys, one_thread
):
    no_train = make_images(tmp_path / "no-train", train_per_class=1)
    shutil.rmtree(no_train / "train")
    broken = tiny_model()
    with torch.no_grad():
        broken.norm.weight.fill_(float("nan"))
    vit.save_weights(broken, tmp_path / "nan.safetensors", ["blue", "green", "red"], "tiny")
    head = checkpoint / "head.safetensors"
    other_classes = make_images(tmp_path / "cats", classes=("cat", "dog"), train_per_class=2)
    cases = [
        (head, other_classes, ["--knn", "--knn-k", "1"], "are not among the model's class names"),
        (head, no_train, ["--knn"], "has no train/ subfolder"),
        (head, image_folder, ["--knn"], "k = 100, 200: k must be between 1 and the number of "),
        (head, image_folder, ["--knn", "--knn-k", "20", "49"], "k = 49: k must be between 1"),
        (tmp_path / "nan.safetensors", image_folder, ["--knn", "--knn-k", "5"], "NaN or infinite"),
        (
            checkpoint / "headless.safetensors",
            image_folder,
            ["--knn", "--knn-k", "5", "--tta", "shift"],
            "--tta shift: averages the classifier head's probabilities over views",
        ),
    ]
    for weights, data, more, message in cases:
        out = tmp_path / "out"
        assert evaluate_script.main(probe_args(weights, data, out, *more)) == 2
        # the extraction's progress lines (one per shard) may come first: then the one error
        lines = [line for line in capsys.readouterr().err.splitlines() if line]
        lines = [line for line in lines if not line.startswith("shard ")]
        assert len(lines) == 1 and lines[0].startswith("evaluate.py: error: "), lines
        assert message in lines[0], lines
        assert not (out / "report.json").exists() and not list(out.glob("*.npz"))
        assert not (out / "confusion_matrix.png").exists()
    with pytest.raises(SystemExit) as stop:  # a flag mistake: said by the parser
        evaluate_script.main(probe_args(head, image_folder, out, "--linear-probe", "--split",
                                        "train"))  # fmt: skip
    assert stop.value.code == 2 and "leave out --split train" in capsys.readouterr().err
