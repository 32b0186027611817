"""`python -m vit.predict` and `vit.data.images`: files, folders and globs; CSV/JSON records;
attention PNGs; evaluate.py's top-1; clear messages for bad input."""

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from conftest import read_rows
from PIL import Image
from safetensors.torch import save_file

import vit
from vit.data.datasets import load_split
from vit.data.images import CorruptImageError, expand_image_paths, load_image, open_image
from vit.data.transforms import EvalTransform
from vit.inference.embed import read_features
from vit.models.class_names import class_names_for
from vit.predict import main

NAMES = ["cat", "dog", "ship"]


@pytest.fixture
def checkpoint(tmp_path):
    """A tiny model of ours whose head strongly prefers "dog" for bright images."""
    torch.manual_seed(0)
    model = vit.VisionTransformer(
        img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=3
    )
    with torch.no_grad():
        model.head.bias.copy_(torch.tensor([0.0, 3.0, 1.0]))
    return vit.save_weights(model, tmp_path / "model.safetensors", class_names=NAMES)


@pytest.fixture
def varied_checkpoint(tmp_path):
    """A tiny model with a random head (predictions vary by image) and a real resize + crop."""
    torch.manual_seed(0)
    model = vit.VisionTransformer(
        img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=3
    )
    torch.nn.init.normal_(model.head.weight, std=1.0)
    preprocess = vit.Preprocess(input_size=(32, 32), interpolation="bicubic", crop_pct=0.875)
    return vit.save_weights(
        model,
        tmp_path / "varied.safetensors",
        class_names=["blue", "green", "red"],
        preprocess=preprocess.to_dict(),
    )


@pytest.fixture
def images(tmp_path):
    rng = np.random.default_rng(0)
    rgb = tmp_path / "rgb.png"
    Image.fromarray(rng.integers(0, 255, (40, 50, 3), dtype=np.uint8)).save(rgb)
    gray = tmp_path / "gray.jpg"
    Image.fromarray(rng.integers(0, 255, (32, 32), dtype=np.uint8), "L").save(gray)
    rgba = tmp_path / "rgba.png"
    Image.fromarray(rng.integers(0, 255, (32, 32, 4), dtype=np.uint8), "RGBA").save(rgba)
    return rgb, gray, rgba


def make_tree(root, sizes=((40, 56), (64, 48), (37, 37), (50, 90), (33, 45))):
    """root/<class>/<i>.png of several sizes, and a text file that is not an image."""
    rng = np.random.default_rng(1)
    for name in ("blue", "green", "red"):
        (root / name).mkdir(parents=True)
        for i, (h, w) in enumerate(sizes):
            pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.png")
    (root / "blue" / "notes.txt").write_text("not an image")
    return root


# -- vit.data.images ---------------------------------------------------------------------------
def test_grayscale_and_transparent_images_become_rgb(images, tmp_path):
    _, gray, rgba = images
    assert open_image(gray).mode == "RGB"
    array = load_image(gray)
    assert array.dtype == np.uint8 and array.shape == (32, 32, 3)
    assert (array[..., 0] == array[..., 2]).all()  # replicated
    converted = load_image(rgba)
    alpha = np.asarray(Image.open(rgba))[..., 3:] / 255.0
    blended = np.asarray(Image.open(rgba))[..., :3] * alpha + 255 * (1 - alpha)  # over white
    assert np.abs(converted.astype(float) - blended).max() <= 1.0
    palette = tmp_path / "palette.png"  # a GIF-style palette whose colour 0 is transparent
    Image.fromarray(np.array([[0, 1], [1, 0]], np.uint8), "P").save(palette, transparency=0)
    pixels = load_image(palette)
    assert (pixels[0, 0] == 255).all() and (pixels[1, 1] == 255).all()  # transparent: white
    # a transparent colour in an RGB or greyscale PNG (tRNS) too: it came out as its colour
    keyed_rgb, keyed_gray = tmp_path / "keyed-rgb.png", tmp_path / "keyed-gray.png"
    Image.fromarray(np.zeros((2, 2, 3), np.uint8)).save(keyed_rgb, transparency=(0, 0, 0))
    Image.fromarray(np.array([[0, 9], [9, 0]], np.uint8)).save(keyed_gray, transparency=0)
    assert (load_image(keyed_rgb) == 255).all()
    assert load_image(keyed_gray)[..., 0].tolist() == [[255, 9], [9, 255]]
    deep = tmp_path / "16bit.png"  # 16-bit greyscale: the levels scaled, not clipped to white
    levels = np.array([[0, 257 * 100], [257 * 200, 65535]], np.uint16)
    Image.fromarray(levels).save(deep)
    assert Image.open(deep).mode.startswith("I")
    assert load_image(deep)[..., 1].tolist() == [[0, 100], [200, 255]]


def test_a_pipe_named_as_an_image_is_refused_not_waited_on(tmp_path):
    """Opening a FIFO for reading waits until something writes to it: predict hung."""
    import threading

    pipe = tmp_path / "camera.jpg"
    os.mkfifo(pipe)
    said = []

    def read() -> None:
        with pytest.raises(CorruptImageError) as error:
            open_image(pipe)
        said.append(str(error.value))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=10)
    waited = reader.is_alive()
    if waited:  # free the reader: a writer that opens and closes the pipe gives it an end
        os.close(os.open(pipe, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(timeout=10)
    assert not waited, "open_image waited on the pipe"
    assert said == [f"cannot read image {pipe}: not a regular file (a pipe, socket or device)"]


def test_a_folder_is_searched_as_torchvisions_image_folder_finds_files(tmp_path):
    """Linked folders are followed (Path.rglob did not go into them: a class's linked folder
    of images was silently left out of training), a link back up is walked once, hidden
    folders (.ipynb_checkpoints/: a copy of each image) are skipped, .pgm is an image."""
    from vit.data.images import images_in_folder

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    Image.new("RGB", (8, 8)).save(elsewhere / "linked.jpg")
    cat = tmp_path / "train" / "cat"
    (cat / ".ipynb_checkpoints").mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(cat / "a.jpg")
    Image.new("RGB", (8, 8)).save(cat / ".ipynb_checkpoints" / "a-checkpoint.jpg")
    Image.new("L", (8, 8)).save(cat / "grey.pgm")
    (cat / "more").symlink_to(elsewhere, target_is_directory=True)
    (cat / "loop").symlink_to(cat, target_is_directory=True)
    assert images_in_folder(cat) == [cat / "a.jpg", cat / "grey.pgm", cat / "more" / "linked.jpg"]


def test_unreadable_images_raise_a_value_error_naming_the_file(tmp_path):
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"\xff\xd8\xff not really a jpeg")
    for path, reason in ((broken, ""), (tmp_path / "gone.png", "no such file"), (tmp_path, "")):
        with pytest.raises(CorruptImageError, match=f"cannot read image {path}: {reason}"):
            load_image(path)
    assert issubclass(CorruptImageError, ValueError)


def test_files_folders_and_globs_expand_in_order_without_duplicates(tmp_path):
    tree = make_tree(tmp_path / "tree")
    (tree / "deep" / "er").mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(tree / "deep" / "er" / "x.jpg")
    (tmp_path / "empty").mkdir()
    paths, problems = expand_image_paths(
        [
            str(tree / "red" / "0.png"),
            str(tree),  # recursive: includes deep/er/x.jpg, skips notes.txt
            str(tmp_path / "tree" / "*" / "1.png"),
            str(tmp_path / "empty"),
            str(tmp_path / "nothing*.jpg"),
            str(tmp_path / "missing.jpg"),
        ]
    )
    assert paths[0] == tree / "red" / "0.png"
    assert len(paths) == 16 and len(set(paths)) == 16  # 15 class images + x.jpg, once each
    assert tree / "deep" / "er" / "x.jpg" in paths
    assert all(p.suffix != ".txt" for p in paths)
    assert problems == [
        f"{tmp_path / 'empty'}: a folder without images (searched recursively for "
        ".jpg, .jpeg, .png, .bmp, .webp, .gif, .tif, .tiff, .ppm, .pgm)",
        f"{tmp_path / 'nothing*.jpg'}: no image matches this pattern",
        f"cannot read image {tmp_path / 'missing.jpg'}: no such file",
    ]


# -- terminal output -----------------------------------------------------------------------------
def test_prints_top_k_with_stored_class_names(checkpoint, images, capsys):
    assert main([*map(str, images), "--checkpoint", str(checkpoint), "--top-k", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert (
        out[0].endswith("rgb.png") and out[3].endswith("gray.jpg") and out[6].endswith("rgba.png")
    )
    assert "dog" in out[1] and "ship" in out[2]  # best first
    probability = float(out[1].split("%")[0]) / 100
    expected = torch.tensor([0.0, 3.0, 1.0]).softmax(0)[1].item()  # head bias only: zero weights
    assert probability == pytest.approx(expected, abs=1e-4)


def test_bad_inputs_get_one_line_each_and_the_rest_is_classified(
    checkpoint, images, tmp_path, capsys
):
    not_image = tmp_path / "notes.txt"
    not_image.write_text("hello")
    (tmp_path / "empty").mkdir()
    code = main(
        [
            str(images[0]),
            str(tmp_path / "missing.jpg"),
            str(not_image),
            str(tmp_path / "empty"),
            "--checkpoint",
            str(checkpoint),
        ]
    )
    captured = capsys.readouterr()
    assert code == 1
    assert "rgb.png" in captured.out
    errors = captured.err.splitlines()
    assert f"error: cannot read image {tmp_path / 'missing.jpg'}: no such file" in errors
    assert any(line.startswith(f"error: cannot read image {not_image}: ") for line in errors)
    assert f"error: {tmp_path / 'empty'}: a folder without images" in captured.err
    assert len(errors) == 3 and "Traceback" not in captured.err


def test_bad_flags_are_explained(checkpoint, images, tmp_path, capsys):
    assert main([str(images[0]), "--checkpoint", str(checkpoint.with_name("nope.pth"))]) == 2
    err = capsys.readouterr().err
    assert "--checkpoint" in err and "nope.pth: no such file" in err
    assert main([str(images[0]), "--model", "vit_base_patch16_244"]) == 2
    err = capsys.readouterr().err  # close names, not all 58
    assert err.startswith("error: --model vit_base_patch16_244: no such model name; did you mean")
    assert "vit_base_patch16_224" in err and "vit_tiny_patch16_224" not in err
    with pytest.raises(SystemExit):
        main([str(images[0])])
    assert "no model given: pass --checkpoint" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(images[0]), "--checkpoint", str(checkpoint), "--output", "p.txt"])
    assert "must end in .csv or .json" in capsys.readouterr().err
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for flag, target in (("--output", blocker / "p.csv"), ("--explain", blocker)):
        assert main([str(images[0]), "--checkpoint", str(checkpoint), flag, str(target)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"error: {flag} {target}: ")


def test_imagenet_heads_get_imagenet_names_and_timm_files_need_model(tmp_path, images, capsys):
    torch.manual_seed(0)
    theirs = timm.create_model("vit_tiny_patch16_224")
    torch.nn.init.normal_(theirs.head.weight, std=0.02)
    path = tmp_path / "timm.safetensors"
    save_file(theirs.state_dict(), str(path))
    assert main([str(images[0]), "--checkpoint", str(path)]) == 2
    assert "pass --model NAME" in capsys.readouterr().err
    assert main([str(images[0]), "--checkpoint", str(path), "--model", "vit_tiny_patch16_224"]) == 0
    names = class_names_for(vit.create_model("vit_tiny_patch16_224"))
    assert names[0] == "tench, Tinca tinca" and len(names) == 1000
    printed = capsys.readouterr().out.splitlines()[1].split("%")[1].strip()
    assert printed in names


# -- records, batches and evaluate.py ------------------------------------------------------------
def test_csv_and_json_records_hold_the_model_probabilities(
    varied_checkpoint, tmp_path, one_thread, capsys
):
    tree = make_tree(tmp_path / "tree")
    csv_path, json_path = tmp_path / "out" / "p.csv", tmp_path / "p.json"
    args = [str(tree), "--checkpoint", str(varied_checkpoint), "--top-k", "2"]
    assert main([*args, "--output", str(csv_path), "--batch-size", "4"]) == 0
    assert main([*args, "--output", str(json_path), "--batch-size", "15"]) == 0
    assert capsys.readouterr().out == ""  # with --output nothing goes to stdout
    rows, records = read_rows(csv_path), json.loads(json_path.read_text())
    assert list(rows[0]) == ["path", "label", "probability", "label_2", "probability_2"]
    assert len(rows) == len(records) == 15
    model = vit.load_model(varied_checkpoint).eval()
    transform = vit.create_transform(model.preprocess)
    for row, record in zip(rows, records, strict=True):
        assert row["path"] == record["path"]
        with torch.no_grad():
            probs = model(transform(open_image(record["path"]))[None]).softmax(-1)[0]
        best = probs.argsort(descending=True)
        assert record["label"] == model.class_names[best[0]]
        assert record["label_2"] == model.class_names[best[1]]
        assert record["probability"] == pytest.approx(probs[best[0]].item(), abs=1e-6)
        # batch size 4 (CSV) and 15 (JSON): the same numbers
        assert float(row["probability_2"]) == pytest.approx(record["probability_2"], abs=2e-6)
    assert len({r["label"] for r in records}) > 1  # the predictions do depend on the image


@pytest.mark.parametrize("method", ["flip", "flip-shift"])
def test_mirror_closed_tta_scores_an_image_and_its_mirror_image_alike(
    method, varied_checkpoint, tmp_path, one_thread
):
    """--tta flip and flip-shift: the mean probability of views that include each view's
    mirror image (a shift left mirrors a shift right), so an image and its mirror image get the
    same probabilities (plain predictions differ)."""
    rng = np.random.default_rng(1)
    pixels = rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(tmp_path / "a.png")
    Image.fromarray(pixels[:, ::-1]).save(tmp_path / "b.png")
    args = [str(tmp_path / "a.png"), str(tmp_path / "b.png"), "--checkpoint"]
    args += [str(varied_checkpoint), "--top-k", "3"]
    probabilities = {}
    for tta in ("none", method):
        out = tmp_path / f"{tta}.json"
        assert main([*args, "--tta", tta, "--output", str(out)]) == 0
        a, b = ({r[k]: r[p] for k, p in LABELS} for r in json.loads(out.read_text()))
        probabilities[tta] = (a, b)
    a, b = probabilities[method]
    assert a == pytest.approx(b, abs=1e-6)
    a, b = probabilities["none"]
    assert max(abs(a[name] - b[name]) for name in a) > 1e-3


LABELS = [("label", "probability"), ("label_2", "probability_2"), ("label_3", "probability_3")]


def test_top1_equals_evaluate_on_the_same_images(
    varied_checkpoint, tmp_path, one_thread, evaluate_script
):
    """predict's top-1 is evaluate.py's: the same accuracy, and image by image the class that
    evaluate's own data pipeline (load_split + EvalTransform) gives."""
    data = tmp_path / "data"
    make_tree(data / "test")
    (data / "test" / "blue" / "notes.txt").unlink()
    out = tmp_path / "preds.csv"
    assert (
        main([str(data / "test"), "--checkpoint", str(varied_checkpoint), "--output", str(out)])
        == 0
    )
    rows = read_rows(out)
    report_path = tmp_path / "report.json"
    code = evaluate_script.main(
        [
            "--checkpoint", str(varied_checkpoint), "--data", str(data), "--workers", "0",
            "--device", "cpu", "--json", str(report_path), "--output-dir", str(tmp_path / "ev"),
        ]
    )  # fmt: skip
    assert code == 0
    report = json.loads(report_path.read_text())
    correct = sum(row["label"] == row["path"].split("/")[-2] for row in rows)
    assert report["num_images"] == len(rows) == 15
    assert correct / len(rows) == pytest.approx(report["top1"], abs=1e-9)

    model = vit.load_model(varied_checkpoint).eval()
    dataset = load_split(str(data), "test", str(tmp_path))
    dataset.transform = EvalTransform(model.preprocess)
    by_path = {row["path"]: row["label"] for row in rows}
    for index, path in enumerate(dataset.paths):
        with torch.no_grad():
            evaluate_top1 = model(dataset[index][0][None]).argmax(-1).item()
        assert by_path[str(path)] == model.class_names[evaluate_top1]


# -- attention overlays --------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["rollout", "gradient_rollout", "relevance"])
def test_explain_writes_the_image_beside_its_map(
    varied_checkpoint, tmp_path, one_thread, method, capsys
):
    tree = make_tree(tmp_path / "tree", sizes=((40, 56), (64, 48)))
    Image.new("RGB", (40, 40), "white").save(tree / "red" / "0.jpg")  # beside red/0.png
    out = tmp_path / "maps"
    code = main(
        [str(tree), "--checkpoint", str(varied_checkpoint), "--explain", str(out),
         "--method", method, "--batch-size", "3"]
    )  # fmt: skip
    assert code == 0
    pngs = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.png"))
    assert pngs == [
        "blue/0.png", "blue/1.png", "green/0.png", "green/1.png",
        "red/0_jpg.png", "red/0_png.png", "red/1.png",
    ]  # fmt: skip
    assert not [p for p in out.rglob("*") if p.name.startswith(".")]  # no temporary files left
    picture = np.asarray(Image.open(out / "blue" / "0.png").convert("RGB")).astype(int)
    height, width, _ = picture.shape
    assert width > 1.5 * height  # two panels side by side
    left, right = picture[:, : width // 2], picture[:, width // 2 :]
    assert np.abs(left - right).mean() > 5  # the right panel carries the heat map
    assert "wrote 7 attention maps" in capsys.readouterr().err


def test_every_image_gets_a_map_of_its_own_name(tmp_path):
    """a.jpg beside a.png takes a_jpg.png, the name of an a_jpg.jpg beside them: one map
    replaced the other."""
    from vit.inference.explanations import explanation_paths

    images = [tmp_path / name for name in ("a.jpg", "a.png", "a_jpg.jpg", "b.jpg")]
    targets = explanation_paths(images, tmp_path / "maps")
    names = [targets[image].name for image in images]
    assert names == ["a_jpg.png", "a_png.png", "a_jpg_2.png", "b.png"]


def test_explain_never_replaces_an_image_and_keeps_earlier_maps(
    checkpoint, tmp_path, one_thread, capsys
):
    photos = tmp_path / "photos"
    photos.mkdir()
    cat = photos / "cat.png"
    Image.fromarray(np.full((32, 32, 3), 200, np.uint8)).save(cat)
    before = cat.read_bytes()
    base = [str(photos), "--checkpoint", str(checkpoint)]
    for overwrite in ([], ["--overwrite"]):  # the maps' folder is the images': cat.png's map
        assert main([*base, "--explain", str(photos), *overwrite]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "would replace that image" in err
    assert cat.read_bytes() == before
    # a JPEG's map takes another name, but among the images the next run would read it as one
    dog = tmp_path / "jpegs" / "dog.jpg"
    dog.parent.mkdir()
    Image.fromarray(np.full((32, 32, 3), 90, np.uint8)).save(dog)
    jpegs = [str(dog.parent), "--checkpoint", str(checkpoint), "--explain"]
    assert main([*jpegs, str(dog.parent)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "would go among the images being read" in err
    assert sorted(p.name for p in dog.parent.iterdir()) == ["dog.jpg"]
    maps = tmp_path / "maps"
    assert main([*base, "--explain", str(maps)]) == 0
    written = (maps / "cat.png").read_bytes()
    (maps / "cat.png").write_bytes(b"mine")
    capsys.readouterr()
    assert main([*base, "--explain", str(maps)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "1 of the maps exist" in err and "--overwrite" in err
    assert (maps / "cat.png").read_bytes() == b"mine"
    assert main([*base, "--explain", str(maps), "--overwrite"]) == 0
    assert (maps / "cat.png").read_bytes() == written


def test_flags_that_would_be_ignored_or_collide_are_refused(
    checkpoint, headless_checkpoint, images, tmp_path, capsys
):
    base = [str(images[0]), "--checkpoint", str(checkpoint)]
    for flags, message in (
        (["--method", "rollout"], "--method rollout chooses --explain's maps: pass --explain"),
        (["--workers", "-1"], "--workers must be at least 0"),
    ):
        with pytest.raises(SystemExit):
            main([*base, *flags])
        assert message in capsys.readouterr().err
    same = str(tmp_path / "same.csv")
    assert main([*base, "--output", same, "--features", same]) == 2
    assert "--features writes there too; give two files" in capsys.readouterr().err
    features = str(tmp_path / "f.npz")
    headless = [str(images[0]), "--checkpoint", str(headless_checkpoint), "--features", features]
    assert main([*headless, "--tta", "flip"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "leave out --tta" in err
    assert not (tmp_path / "f.npz").exists() and not (tmp_path / "same.csv").exists()


def test_runs_as_a_module(checkpoint, images):
    result = subprocess.run(
        [sys.executable, "-m", "vit.predict", str(images[0]), "--checkpoint", str(checkpoint)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 4  # the path, then 3 classes (top-5 capped at 3)


def test_matplotlib_is_imported_only_to_draw_explain_maps(checkpoint, images, tmp_path):
    """`python -m vit.predict` imported matplotlib (and the explain package) for every run, to
    draw --explain's maps: only --explain loads it now."""
    code = (
        "import sys\n"
        "from vit.predict import main\n"
        "status = main(sys.argv[1:])\n"
        "print(status, 'matplotlib' in sys.modules)\n"
    )
    argv = [sys.executable, "-c", code, str(images[0]), "--checkpoint", str(checkpoint)]
    for explain, loaded in (([], False), (["--explain", str(tmp_path / "maps")], True)):
        result = subprocess.run([*argv, *explain], capture_output=True, text=True, timeout=120)
        assert result.stdout.splitlines()[-1] == f"0 {loaded}", result.stderr[-2000:]


# -- embeddings (--features) and headless backbones -----------------------------------------------
@pytest.fixture
def headless_checkpoint(tmp_path):
    """A tiny backbone without a classifier head: model(x) is its pooled embedding (B, 32)."""
    torch.manual_seed(0)
    model = vit.VisionTransformer(
        img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=0
    )
    preprocess = vit.Preprocess(input_size=(32, 32), interpolation="bicubic", crop_pct=0.875)
    return vit.save_weights(
        model, tmp_path / "backbone.safetensors", preprocess=preprocess.to_dict()
    )


def embeddings_of(checkpoint, paths) -> torch.Tensor:
    """Each image's model(x) computed one by one, independently of vit.predict."""
    model = vit.load_model(checkpoint).eval()
    transform = vit.create_transform(model.preprocess)
    with torch.no_grad():
        return torch.cat([model(transform(open_image(p))[None]) for p in paths])


def test_features_of_a_headless_backbone_in_npz_csv_and_json(
    headless_checkpoint, tmp_path, one_thread, capsys
):
    tree = make_tree(tmp_path / "tree", sizes=((40, 56), (64, 48)))
    args = [str(tree), "--checkpoint", str(headless_checkpoint), "--batch-size", "4"]
    outputs = {
        suffix: tmp_path / "out" / f"features{suffix}" for suffix in (".npz", ".csv", ".json")
    }
    for path in outputs.values():
        assert main([*args, "--features", str(path)]) == 0
    captured = capsys.readouterr()
    assert captured.out == ""  # no classes to print
    assert "wrote 6 embeddings (32 values each, pooled pre-logits features)" in captured.err
    with np.load(outputs[".npz"]) as saved:  # no pickle needed
        paths, features = saved["paths"].tolist(), saved["features"]
    assert features.dtype == np.float32 and features.shape == (6, 32)
    expected = embeddings_of(headless_checkpoint, paths)  # model(x), image by image
    np.testing.assert_allclose(features, expected.numpy(), rtol=1e-5, atol=1e-6)
    assert sorted(paths) == sorted(str(p) for p in tree.rglob("*.png"))
    rows = read_rows(outputs[".csv"])
    assert list(rows[0]) == ["path"] + [f"f{i}" for i in range(32)]
    records = json.loads(outputs[".json"].read_text())
    for row, record, vector in zip(rows, records, features, strict=True):
        assert row["path"] == record["path"]
        # 9 significant digits: the float32 values come back exactly
        assert np.array_equal(np.float32([row[f"f{i}"] for i in range(32)]), vector)
        assert np.array_equal(np.float32(record["embedding"]), vector)
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.startswith(".")]


def test_features_of_a_classifier_are_its_pre_logits(
    varied_checkpoint, tmp_path, one_thread, capsys
):
    tree = make_tree(tmp_path / "tree", sizes=((40, 56),))
    out = tmp_path / "features.npz"
    args = [str(tree), "--checkpoint", str(varied_checkpoint), "--top-k", "1"]
    assert main([*args, "--features", str(out)]) == 0
    printed, said = capsys.readouterr()
    # a summary line instead of lines per image (its classes: tests/test_one_writer.py)
    assert printed == "" and "most frequent top-1 classes" in said
    model = vit.load_model(varied_checkpoint).eval()
    with np.load(out) as saved:
        features = torch.from_numpy(saved["features"])
        paths = saved["paths"].tolist()
    transform = vit.create_transform(model.preprocess)
    images = torch.stack([transform(open_image(p)) for p in paths])
    with torch.no_grad():
        torch.testing.assert_close(features, vit.explain.embed(model, images))
        torch.testing.assert_close(model.head(features), model(images))  # the head's input
    # --embedding output: the model's output instead (a CLIP tower's projection, here logits);
    # the finished file is replaced only with --overwrite
    assert main([*args, "--features", str(out), "--embedding", "output"]) == 2
    err = capsys.readouterr().err
    assert (
        err == f"error: --features {out}: exists; add --overwrite to replace it, or choose "
        "another file\n"
    )
    assert main([*args, "--features", str(out), "--embedding", "output", "--overwrite"]) == 0
    assert "(3 values each, the model's output)" in capsys.readouterr().err
    with np.load(out) as saved:
        assert saved["paths"].tolist() == paths
        with torch.no_grad():
            torch.testing.assert_close(torch.from_numpy(saved["features"]), model(images))


def test_a_headless_model_embeds_and_explains_but_does_not_classify(
    headless_checkpoint, images, tmp_path, one_thread, capsys
):
    image = str(images[0])
    base = [image, "--checkpoint", str(headless_checkpoint)]
    assert main(base) == 2
    assert "no classifier head" in capsys.readouterr().err
    assert main([*base, "--output", str(tmp_path / "p.csv")]) == 2
    assert "use --features FILE" in capsys.readouterr().err
    maps = tmp_path / "maps"
    assert main([*base, "--explain", str(maps), "--method", "relevance"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "use --method last_block (the default) or rollout" in err
    assert not maps.exists() and not (tmp_path / "p.csv").exists()
    assert main([*base, "--explain", str(maps), "--method", "rollout"]) == 0  # needs no class
    assert [p.name for p in maps.iterdir()] == ["rgb.png"]
    with pytest.raises(SystemExit):
        main([*base, "--features", str(tmp_path / "f.txt")])
    assert "must end in .npz, .csv or .json" in capsys.readouterr().err


def test_a_model_that_pools_nothing_embeds_its_class_token_and_nothing_else(
    images, tmp_path, one_thread, capsys
):
    """global_pool='': a row per token, (B, N, D) features and (B, N, K) logits. It was
    classified into a traceback and embedded as N values an image, D of every N*D dropped."""
    torch.manual_seed(0)
    kwargs = dict(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, global_pool="")
    backbone = vit.VisionTransformer(num_classes=0, **kwargs)
    backbone_path = vit.save_weights(backbone, tmp_path / "backbone.safetensors")
    classifier_path = vit.save_weights(
        vit.VisionTransformer(num_classes=3, **kwargs), tmp_path / "classifier.safetensors"
    )
    image, out = str(images[0]), tmp_path / "features.npz"
    refused = {
        (classifier_path,): "its head classifying every token",
        (classifier_path, "--features", str(out), "--embedding", "clstoken"): "every token",
        (backbone_path, "--features", str(out)): "--embedding pooled: the model does not pool",
        (backbone_path, "--features", str(out), "--embedding", "output"): "--embedding output",
        (backbone_path, "--explain", str(tmp_path / "maps")): "explanations follow the rows",
    }
    for (path, *flags), said in refused.items():
        assert main([image, "--checkpoint", str(path), *flags]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and said in err and "global_pool=''" in err, err
    assert not out.exists() and not (tmp_path / "maps").exists()
    assert main([image, "--checkpoint", str(backbone_path), "--features", str(out), "--embedding",
                 "clstoken"]) == 0  # fmt: skip
    model = vit.load_model(backbone_path).eval()
    x = vit.create_transform(model.preprocess)(open_image(images[0]))[None]
    with np.load(out) as saved, torch.no_grad():
        expected = model.forward_features(x)[:, 0]  # (1, D): the normed class token
        torch.testing.assert_close(torch.from_numpy(saved["features"]), expected)


def test_a_file_name_that_is_not_utf8_is_written_as_its_bytes(
    varied_checkpoint, images, tmp_path, one_thread, capsys
):
    """A Latin-1 name from an old archive (Python's surrogate escapes, 'caf\\udce9.png'): the
    CSV of --output and of --features stopped at it with a UnicodeEncodeError traceback."""
    latin = tmp_path / "in" / os.fsdecode(b"caf\xe9.png")
    latin.parent.mkdir()
    shutil.copy(images[0], latin)
    output, features = tmp_path / "top.csv", tmp_path / "f.csv"
    argv = [str(latin.parent), "--checkpoint", str(varied_checkpoint), "--top-k", "1"]
    assert main([*argv, "--output", str(output), "--features", str(features)]) == 0
    assert b"caf\xe9.png" in output.read_bytes()  # the name's own bytes
    with open(output, newline="", encoding="utf-8", errors="surrogateescape") as f:
        assert [row["path"] for row in csv.DictReader(f)] == [str(latin)]
    paths, rows = read_features(features)
    assert paths.tolist() == [str(latin)] and rows.shape == (1, 32)


def test_features_are_not_written_when_no_image_was_read(headless_checkpoint, tmp_path, capsys):
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"not an image")
    out = tmp_path / "features.npz"
    out.write_bytes(b"an earlier run's embeddings")
    args = [str(broken), "--checkpoint", str(headless_checkpoint), "--features", str(out)]
    assert main(args) == 2  # without --overwrite: refused before any work
    assert capsys.readouterr().err.count("\n") == 1
    assert main([*args, "--overwrite"]) == 1
    assert out.read_bytes() == b"an earlier run's embeddings"  # left as it was
    err = capsys.readouterr().err
    assert "wrote" not in err and f"--features {out} was not written" in err
    assert (tmp_path / "features.npz.errors.txt").read_text().startswith(f"{broken}\tcannot read")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "backbone.safetensors", "broken.jpg", "features.npz", "features.npz.errors.txt"
    ]  # fmt: skip


@pytest.mark.parametrize(
    "family",
    [
        {"reg_tokens": 4, "init_values": 0.1, "no_embed_class": True},  # DINOv2 with registers
        {"class_token": False, "global_pool": "map"},  # SigLIP's attention pool
        {"distilled": True},  # DeiT distilled
        {"pre_norm": True, "act_layer": "quick_gelu"},  # OpenAI CLIP
    ],
    ids=["dinov2-registers", "siglip", "deit-distilled", "clip"],
)
def test_explain_and_features_work_for_every_family(family, tmp_path, one_thread, capsys):
    torch.manual_seed(0)
    model = vit.VisionTransformer(
        img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=3, **family
    )
    torch.nn.init.normal_(model.head.weight, std=1.0)
    checkpoint = vit.save_weights(model, tmp_path / "family.safetensors", class_names=NAMES)
    tree = make_tree(tmp_path / "tree", sizes=((40, 56),))
    out, features = tmp_path / "maps", tmp_path / "features.npz"
    for method in ("rollout", "gradient_rollout", "relevance", "last_block"):
        code = main(
            [str(tree), "--checkpoint", str(checkpoint), "--explain", str(out), "--method", method,
             "--features", str(features), "--overwrite"]
        )  # fmt: skip
        assert code == 0
        assert len(list(out.rglob("*.png"))) == 3
    assert "wrote 3 attention maps" in capsys.readouterr().err
    with np.load(features) as saved:
        assert saved["features"].shape == (3, 32)


def test_predict_embeds_and_explains_the_real_dinov2_folder(tmp_path, one_thread, capsys):
    """../shared/data/dinov2-small, a transformers Dinov2Model folder: headless, so embeddings
    and rollout maps; the embeddings are transformers' own pooled output (the class token)."""
    folder = Path(__file__).resolve().parents[2] / "shared" / "data" / "dinov2-small"
    if not folder.is_dir():
        pytest.skip(f"the shared DINOv2 folder is not at {folder}")
    from transformers import Dinov2Model

    image = tmp_path / "photo.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (240, 300, 3), np.uint8)).save(image)
    out, features = tmp_path / "maps", tmp_path / "features.json"
    args = [str(image), "--checkpoint", str(folder), "--features", str(features)]
    assert main([*args, "--explain", str(out)]) == 0
    assert (out / "photo.png").is_file()
    (record,) = json.loads(features.read_text())
    model = vit.load_model(folder)
    pixels = vit.create_transform(model.preprocess)(open_image(image))[None]
    with torch.no_grad():
        theirs = Dinov2Model.from_pretrained(folder).eval()(pixel_values=pixels).pooler_output
    np.testing.assert_allclose(record["embedding"], theirs[0].numpy(), rtol=1e-4, atol=1e-4)
    assert main([*args, "--explain", str(out), "--method", "relevance", "--overwrite"]) == 2
    assert "use --method last_block (the default) or rollout" in capsys.readouterr().err


def test_sigterm_stops_a_prediction_as_ctrl_c_does(onnx_exports, image_folder, monkeypatch,
                                                   capsys):  # fmt: skip
    """SIGTERM (kill) ended it at once, three kills leaving three half-written temporary CSVs:
    now its Ctrl-C line, the temporary file removed on the way out, status 143."""
    import signal

    import vit.predict as command

    monkeypatch.setattr(command, "predict", lambda *a: signal.raise_signal(signal.SIGTERM))
    image = next((image_folder / "test" / "red").iterdir())
    assert command.main([str(image), "--checkpoint", str(onnx_exports / "tiny.safetensors")]) == 143
    assert capsys.readouterr().err.strip() == "stopped by SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_full_disk_stops_a_prediction_in_one_line(onnx_exports, image_folder, tmp_path,
                                                    monkeypatch, capsys):  # fmt: skip
    import errno

    import vit.predict as command

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "out.csv"))

    monkeypatch.setattr(command, "predict", full)
    image = next((image_folder / "test" / "red").iterdir())
    argv = [str(image), "--checkpoint", str(onnx_exports / "tiny.safetensors")]
    assert command.main([*argv, "--output", str(tmp_path / "out.csv")]) == 1
    assert capsys.readouterr().err.strip() == (
        f"stopped: No space left on device: {tmp_path / 'out.csv'}; --output "
        f"{tmp_path / 'out.csv'} not written (it is put in place at the end)"
    )
