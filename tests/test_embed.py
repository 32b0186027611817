"""`vit.inference.embed`, the embedding engine, and `python -m vit.predict --features` on it:
features copied out of the batch, images streamed, shards resumed after a kill, unreadable images
listed, the feature choices of DINOv2, DINO and CLIP, torchrun's two processes writing the one file;
and predict's last_block maps of a headless backbone."""

import errno
import os
import signal
import subprocess
import sys
import time
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vit
from vit.inference.embed import (
    DEFAULT_SHARD_IMAGES,
    FeaturesError,
    check_embedding,
    embed_batch,
    extract_features,
    parts_folder,
    read_features,
)
from vit.inference.explanations import head_maps_figure
from vit.predict import DEFAULT_SHARD_IMAGES as PREDICT_SHARD_IMAGES
from vit.predict import main

ROOT = Path(__file__).resolve().parents[1]


def tiny_model(num_classes: int = 0, **kwargs) -> vit.VisionTransformer:
    torch.manual_seed(0)
    model = vit.VisionTransformer(
        img_size=16, patch_size=8, embed_dim=16, depth=2, num_heads=2, num_classes=num_classes,
        **kwargs,
    )  # fmt: skip
    model.preprocess = vit.Preprocess(input_size=(16, 16), crop_pct=1.0)
    return model.eval()


@pytest.fixture
def backbone(tmp_path) -> Path:
    """A tiny headless backbone file: 16x16 images, 4 patches, 16 values per embedding."""
    model = tiny_model()
    return vit.save_weights(
        model, tmp_path / "backbone.safetensors", preprocess=model.preprocess.to_dict()
    )


def write_images(folder: Path, count: int, seed: int = 0, start: int = 0) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(start, start + count):
        path = folder / f"{i:04d}.png"
        Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(path)
        paths.append(path)
    return paths


def subprocess_env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


# `python -c HOLD HELD RELEASE ARGS...`: `python -m vit.predict ARGS` with the image HELD slow to
# arrive: its decode waits until the file RELEASE exists, so that a test can stop a run between
# two shards (a named pipe did this until open_image refused to wait on one)
HOLD = """
import runpy, sys, time
from pathlib import Path
import vit.inference.predict_job as job
held, release = Path(sys.argv[1]).resolve(), Path(sys.argv[2])
read = job.open_image
def open_image(path):
    while Path(path).resolve() == held and not release.exists():
        time.sleep(0.05)
    return read(path)
job.open_image = open_image
sys.argv = ["vit.predict", *sys.argv[3:]]
runpy.run_module("vit.predict", run_name="__main__", alter_sys=True)
"""


def held_back(image: Path, release: Path, *args: str) -> list[str]:
    """The command of `python -m vit.predict ARGS` with `image` held back until `release` exists."""
    return [sys.executable, "-c", HOLD, str(image), str(release), *args]


# -- memory that does not grow with the number of images ---------------------------------------
@pytest.mark.parametrize(
    "embedding", ["pooled", "clstoken", "clstoken_avgpool", "last2_clstoken", "output"]
)
def test_embeddings_are_copied_out_of_the_token_tensor(embedding):
    """A view of the (B, N, D) tokens would keep them all alive; each embedding owns its
    storage, exactly its own size (the pooled class token of a forward pass is such a view)."""
    model = tiny_model()
    batch = torch.randn(4, 3, 16, 16)
    features = embed_batch(model, batch, embedding)
    assert features.dtype == torch.float32 and features.device.type == "cpu"
    assert features.untyped_storage().nbytes() == features.numel() * 4
    with torch.no_grad():
        view = model.forward_head(model.forward_features(batch), pre_logits=True)
    assert view.untyped_storage().nbytes() > view.numel() * 4  # what the copy avoids


def test_images_are_streamed_a_few_batches_at_a_time(tmp_path, one_thread):
    """At most about two batches of decoded images are alive at once, whatever the count."""
    model = tiny_model()
    paths = write_images(tmp_path / "images", 60)
    alive, most = set(), [0]

    def load(i: int) -> Image.Image:
        image = Image.open(paths[i]).convert("RGB")
        alive.add(i)
        weakref.finalize(image, alive.discard, i)
        most[0] = max(most[0], len(alive))
        return image

    out = tmp_path / "f.npz"
    result = extract_features(
        model, [str(p) for p in paths], load, out, batch_size=4, workers=2, shard_images=20
    )
    assert result.count == 60 and most[0] <= 2 * 4 + 2
    keys, features = read_features(out)
    assert keys.tolist() == [str(p) for p in paths] and features.shape == (60, 16)


def test_a_dataset_by_index_with_prepared_tensors(tmp_path, one_thread):
    """evaluate's use: keys are indices, load(i) returns a prepared (3, H, W) tensor; a load
    that raises OSError skips its item, listed with its key."""
    model = tiny_model()
    images = torch.randn(7, 3, 16, 16)

    def load(i: int) -> torch.Tensor:
        if i == 5:
            raise OSError("disk said no")
        return images[i]

    out = tmp_path / "train.npz"
    result = extract_features(
        model, [str(i) for i in range(7)], load, out, embedding="clstoken", shard_images=3
    )
    assert (result.count, result.dim, result.errors) == (6, 16, [("5", "disk said no")])
    keys, features = read_features(out)
    assert keys.tolist() == ["0", "1", "2", "3", "4", "6"]
    with torch.no_grad():
        expected = model.forward_features(images[[0, 1, 2, 3, 4, 6]])[:, 0]
    np.testing.assert_allclose(features, expected.numpy(), rtol=1e-5, atol=1e-6)
    assert (tmp_path / "train.npz.errors.txt").read_text() == "5\tdisk said no\n"


# -- the feature choices -----------------------------------------------------------------------
def test_every_embedding_choice_is_what_its_source_computes():
    model = tiny_model(reg_tokens=2, no_embed_class=True)  # DINOv2 with registers: 3 prefix tokens
    batch = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        tokens = model.forward_features(batch)  # (3, 3 + 4, 16)
        x, normed = model._embed(batch), []
        for block in model.blocks:
            x = block(x)
            normed.append(model.norm(x))
    by_hand = {
        "pooled": model.forward_head(tokens, pre_logits=True),
        "clstoken": tokens[:, 0],
        # DINOv2's linear protocol: class token, then the mean patch token (registers left out)
        "clstoken_avgpool": torch.cat([tokens[:, 0], tokens[:, 3:].mean(dim=1)], dim=-1),
        # DINO's n_last_blocks: the last n blocks' normed class tokens, in block order
        "last2_clstoken": torch.cat([normed[0][:, 0], normed[1][:, 0]], dim=-1),
        "last1_clstoken": normed[1][:, 0],
        "output": model(batch),
    }
    shapes = {"clstoken_avgpool": (3, 32), "last2_clstoken": (3, 32)}
    for name, expected in by_hand.items():
        features = embed_batch(model, batch, check_embedding(model, name))
        assert features.shape == shapes.get(name, (3, 16)), name
        torch.testing.assert_close(features, expected, rtol=1e-5, atol=1e-6, msg=name)


def test_clip_image_embeds_is_the_projection_and_is_refused_elsewhere():
    clip = tiny_model(num_classes=8, pre_norm=True, act_layer="quick_gelu")  # head: projection
    batch = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(embed_batch(clip, batch, "image_embeds"), clip(batch))
    for model, names in (
        (tiny_model(num_classes=8), ["image_embeds"]),  # a classifier: logits, no projection
        (tiny_model(pre_norm=True), ["image_embeds"]),  # a CLIP tower without its projection
        (tiny_model(class_token=False, global_pool="avg"), ["clstoken", "last4_clstoken"]),
        (tiny_model(), ["last3_clstoken", "last0_clstoken", "lastN_clstoken", "cls", ""]),
    ):
        for name in names:
            with pytest.raises(FeaturesError) as caught:
                check_embedding(model, name)
            message = str(caught.value)
            assert "\n" not in message and message.startswith(f"--embedding {name}: "), message
    with pytest.raises(FeaturesError, match="the model has no class token"):
        check_embedding(tiny_model(class_token=False, global_pool="map"), "clstoken")


def test_predict_takes_every_embedding_choice(backbone, tmp_path, one_thread, capsys):
    write_images(tmp_path / "images", 3)
    for name, dim in (("clstoken_avgpool", 32), ("last2_clstoken", 32), ("clstoken", 16)):
        out = tmp_path / f"{name}.npz"
        args = [str(tmp_path / "images"), "--checkpoint", str(backbone), "--features", str(out)]
        assert main([*args, "--embedding", name]) == 0
        assert read_features(out)[1].shape == (3, dim)
    assert "(32 values each, the last 2 blocks' class tokens)" in capsys.readouterr().err
    args = [str(tmp_path / "images"), "--checkpoint", str(backbone)]
    assert main([*args, "--features", str(tmp_path / "x.npz"), "--embedding", "image_embeds"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: --embedding image_embeds: CLIP's")
    assert not (tmp_path / "x.npz").exists() and not parts_folder(tmp_path / "x.npz").exists()


# -- files: overwrite, unreadable images, empty folders, formats -------------------------------
def test_a_finished_file_is_replaced_only_with_overwrite(tmp_path, one_thread):
    model = tiny_model()
    paths = write_images(tmp_path / "images", 5)
    keys = [str(p) for p in paths]
    out = tmp_path / "f.csv"
    out.write_text("precious\n")

    def load(i):
        return Image.open(paths[i]).convert("RGB")

    advice = r"add --overwrite \(in Python: overwrite=True\)"  # the caller may be either
    with pytest.raises(FeaturesError, match=f"^{out} exists .*{advice}"):
        extract_features(model, keys, load, out)
    assert out.read_text() == "precious\n" and not parts_folder(out).exists()
    result = extract_features(model, keys, load, out, overwrite=True)
    assert result.count == 5 and read_features(out)[0].tolist() == keys


def test_a_full_disk_at_the_start_leaves_no_parts_to_refuse_the_same_job_again(
    tmp_path, one_thread, monkeypatch
):
    """The parts folder comes with its manifest or not at all: one left without it by a full
    disk read as another job's, and the same command, run again once there was room, was
    refused."""
    model = tiny_model()
    paths = write_images(tmp_path / "images", 3)
    keys, out = [str(p) for p in paths], tmp_path / "f.npz"

    def load(i):
        return Image.open(paths[i]).convert("RGB")

    write_text = Path.write_text

    def full(path, *args, **kwargs):
        if path.name == "manifest.json":
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return write_text(path, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(OSError, match="No space left"):
        extract_features(model, keys, load, out)
    assert list(tmp_path.glob(".f.npz*")) == []  # neither the parts nor a temporary folder
    monkeypatch.setattr(Path, "write_text", write_text)
    assert extract_features(model, keys, load, out).count == 3


def test_predict_refuses_to_replace_an_output_file(tmp_path, one_thread, capsys):
    model = tiny_model(num_classes=3)
    checkpoint = vit.save_weights(
        model, tmp_path / "c.safetensors", preprocess=model.preprocess.to_dict()
    )
    write_images(tmp_path / "images", 2)
    out = tmp_path / "preds.json"
    args = [str(tmp_path / "images"), "--checkpoint", str(checkpoint), "--output", str(out)]
    assert main(args) == 0
    first = out.read_text()
    assert main(args) == 2
    assert capsys.readouterr().err.endswith(
        f"error: --output {out}: exists; add --overwrite to replace it, or choose another file\n"
    )
    assert main([*args, "--overwrite"]) == 0 and out.read_text() == first


def test_unreadable_images_are_listed_beside_the_file_and_skipped(backbone, tmp_path, capsys):
    paths = write_images(tmp_path / "images", 6)
    paths[2].write_bytes(b"not a png")
    paths[4].write_bytes(b"")
    out = tmp_path / "out" / "f.npz"
    code = main(
        [str(tmp_path / "images"), "--checkpoint", str(backbone), "--features", str(out),
         "--shard-size", "4", "--batch-size", "3"]
    )  # fmt: skip
    assert code == 1  # some images were skipped
    keys, features = read_features(out)
    assert keys.tolist() == [str(p) for i, p in enumerate(paths) if i not in (2, 4)]
    lines = (tmp_path / "out" / "f.npz.errors.txt").read_text().splitlines()
    assert [line.split("\t")[0] for line in lines] == [str(paths[2]), str(paths[4])]
    assert all(line.split("\t")[1].startswith("cannot read image") for line in lines)
    err = capsys.readouterr().err
    assert "wrote 4 embeddings" in err and f"2 unreadable images listed in {out}.errors" in err
    assert sorted(p.name for p in out.parent.iterdir()) == ["f.npz", "f.npz.errors.txt"]


def test_a_folder_without_images_is_one_line_and_nothing_written(backbone, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    out = tmp_path / "f.npz"
    assert (
        main([str(tmp_path / "empty"), "--checkpoint", str(backbone), "--features", str(out)]) == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {tmp_path / 'empty'}: a folder without")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["backbone.safetensors", "empty"]


def test_formats_hold_the_same_rows_and_progress_is_a_line_per_shard(
    backbone, tmp_path, one_thread, capsys
):
    write_images(tmp_path / "images", 7)
    base = [str(tmp_path / "images"), "--checkpoint", str(backbone), "--shard-size", "3"]
    read = {}
    for suffix in (".npz", ".csv", ".json"):
        assert main([*base, "--features", str(tmp_path / f"f{suffix}")]) == 0
        read[suffix] = read_features(tmp_path / f"f{suffix}")
    for suffix in (".csv", ".json"):
        assert read[suffix][0].tolist() == read[".npz"][0].tolist()
        assert np.array_equal(read[suffix][1], read[".npz"][1])  # 9 digits: exact float32
    err = capsys.readouterr().err  # not a terminal: a line per shard, no bar
    assert "shard 1/3: 3/7 images" in err and "shard 3/3: 7/7 images" in err
    assert "images/s" in err and "left" in err
    assert DEFAULT_SHARD_IMAGES == PREDICT_SHARD_IMAGES  # predict's --help states it


# -- kill and continue -------------------------------------------------------------------------
def test_ctrl_c_says_in_one_line_what_was_kept_and_how_to_go_on(backbone, tmp_path):
    """Ctrl-C in the middle of --features: one line (not a traceback) naming the finished
    shards and the command that continues from them; exit status 130, the shards kept."""
    write_images(tmp_path / "a", 20)
    write_images(tmp_path, 1, start=20)
    held, release = tmp_path / "0020.png", tmp_path / "release"  # the run waits on 0020.png
    out = tmp_path / "f.npz"
    command = held_back(held, release, str(tmp_path / "a"), str(held), "--checkpoint",
                        str(backbone), "--features", str(out), "--shard-size", "10",
                        "--batch-size", "4", "--workers", "1")  # fmt: skip
    process = subprocess.Popen(
        command,
        env=subprocess_env(),
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as in a terminal
    )
    parts = parts_folder(out)
    deadline = time.monotonic() + 120
    while len(list(parts.glob("shard-*.npz"))) < 2:
        assert process.poll() is None, process.stderr.read()
        assert time.monotonic() < deadline, "no shard was written"
        time.sleep(0.1)
    process.send_signal(signal.SIGINT)
    release.touch()  # the image's decode, waited for, ends: the run stops
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130
    assert err.splitlines()[-1] == (
        f"interrupted; 2 finished shards of --features {out} kept in {parts}, from which the "
        f"same command continues"
    )
    assert "Traceback" not in err and len(list(parts.glob("shard-*.npz"))) == 2


def test_a_killed_run_continues_from_its_last_shard_to_the_uninterrupted_file(
    backbone, tmp_path, one_thread, capsys
):
    """A run killed in the middle, run again, writes the file an uninterrupted run writes: the
    same rows in the same order, the same values. The kill comes while the run waits for an
    image that is slow to arrive, after the shards before it were written."""
    write_images(tmp_path / "a", 30)
    write_images(tmp_path / "b", 69, seed=1, start=31)
    write_images(tmp_path, 1, seed=2, start=30)
    held = tmp_path / "0030.png"
    out = tmp_path / "f.npz"
    job = [str(tmp_path / "a"), str(held), str(tmp_path / "b"), "--checkpoint", str(backbone),
           "--shard-size", "10", "--batch-size", "4", "--workers", "1"]  # fmt: skip
    args = [*job, "--features", str(out)]
    command = held_back(held, tmp_path / "never", *args)
    process = subprocess.Popen(command, env=subprocess_env(), stderr=subprocess.PIPE)
    parts = parts_folder(out)
    deadline = time.monotonic() + 120
    while len(list(parts.glob("shard-*.npz"))) < 3:  # items 0-29; item 30 never comes
        assert process.poll() is None, process.stderr.read().decode()
        assert time.monotonic() < deadline, "no shard was written"
        time.sleep(0.1)
    process.send_signal(signal.SIGKILL)
    process.wait()
    process.stderr.close()
    assert not out.exists() and len(list(parts.glob("shard-*.npz"))) == 3

    # another job's parts are refused in one line, and left as they are
    assert main([*args, "--embedding", "clstoken"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{parts} holds the parts of another job" in err
    assert len(list(parts.glob("shard-*.npz"))) == 3

    assert main(args) == 0
    err = capsys.readouterr().err
    assert "wrote 100 embeddings" in err and "3 shards from an earlier run" in err
    assert not parts.exists()
    whole = tmp_path / "whole.npz"
    assert main([*job, "--features", str(whole)]) == 0
    resumed_keys, resumed = read_features(out)
    keys, features = read_features(whole)
    assert resumed_keys.tolist() == keys.tolist() and len(set(keys.tolist())) == 100
    assert keys[30] == str(tmp_path / "0030.png")
    assert np.array_equal(resumed, features)


# -- torchrun ----------------------------------------------------------------------------------
def test_two_processes_under_torchrun_write_the_single_process_file(backbone, tmp_path):
    write_images(tmp_path / "images", 13)
    common = [str(tmp_path / "images"), "--checkpoint", str(backbone), "--device", "cpu",
              "--shard-size", "3", "--batch-size", "2"]  # fmt: skip
    single, double = tmp_path / "single.npz", tmp_path / "two.npz"
    done = subprocess.run(
        [sys.executable, "-m", "vit.predict", *common, "--features", str(single)],
        env=subprocess_env(), capture_output=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    done = subprocess.run(
        [sys.executable, "-m", "vit.distributed", "--standalone", "--nproc_per_node", "2",
         "-m", "vit.predict", *common, "--features", str(double)],
        env=subprocess_env(), capture_output=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    assert done.stderr.decode().count("wrote 13 embeddings") == 1  # rank 0 says it
    assert double.read_bytes() == single.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "backbone.safetensors", "images", "single.npz", "two.npz"
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--output", "o.csv"], "error: --output: under torchrun, predict splits --features only"),
        (["--top-k", "0"], "python -m vit.predict: error: --top-k must be at least 1, got 0"),
        (["--features", "f.txt"], "python -m vit.predict: error: --features f.txt: the file"),
    ],
    ids=["output-without-features", "bad-flag", "bad-features-name"],
)
def test_a_mistake_under_torchrun_is_said_once(
    backbone, tmp_path, capsys, monkeypatch, flags, message
):
    """Every process meets the same mistake: rank 0 says it in one line, the others nothing;
    --output is refused for itself (adding --features, as the check once advised, does not
    make it work)."""
    write_images(tmp_path / "images", 2)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank in ("1", "0"):
        monkeypatch.setenv("RANK", rank)
        try:
            status = main(["images", "--checkpoint", str(backbone), *flags])
        except SystemExit as stopped:  # argparse's refusal
            status = stopped.code
        assert status == 2
        err = capsys.readouterr().err
        assert err == "" if rank == "1" else err.count("\n") == 1 and err.startswith(message)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["backbone.safetensors", "images"]


# -- the picture of a backbone -----------------------------------------------------------------
def test_a_headless_backbone_explains_with_last_block_maps(backbone, tmp_path, one_thread, capsys):
    write_images(tmp_path / "images", 2)
    maps = tmp_path / "maps"
    assert (
        main([str(tmp_path / "images"), "--checkpoint", str(backbone), "--explain", str(maps)]) == 0
    )
    pngs = sorted(p.name for p in maps.iterdir())
    assert pngs == ["0000.png", "0001.png"]
    assert "wrote 2 attention maps" in capsys.readouterr().err
    with Image.open(maps / "0000.png") as png:
        assert png.width > 200 and png.height > 100
    heads = vit.explain.last_block_attention(tiny_model(), torch.randn(1, 3, 16, 16))
    fig = head_maps_figure(np.zeros((16, 16, 3)), heads[0], "x. Weights: backbone.safetensors")
    assert len(fig.axes) == 1 + 2 + 1  # the image, one panel per head, the colour bar
    assert fig.axes[-1].get_ylabel().startswith("attention")
    assert "Weights: backbone.safetensors" in fig._suptitle.get_text()


def test_dinov2_linear_protocol_features_equal_transformers_tokens(tmp_path, one_thread):
    """../shared/data/dinov2-small: clstoken_avgpool is transformers' last_hidden_state class
    token beside the mean of its patch tokens; clstoken its pooler_output."""
    folder = Path(os.environ.get("VIT_DINOV2", ROOT.parent / "shared" / "data" / "dinov2-small"))
    if not folder.is_dir():
        pytest.skip(f"the shared DINOv2 folder is not at {folder}")
    from transformers import Dinov2Model

    image = tmp_path / "photo.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (240, 300, 3), np.uint8)).save(image)
    model = vit.load_model(folder)
    pixels = vit.create_transform(model.preprocess)(Image.open(image).convert("RGB"))[None]
    with torch.no_grad():
        theirs = Dinov2Model.from_pretrained(folder).eval()(pixel_values=pixels)
    tokens = theirs.last_hidden_state  # (1, 1 + 256, 384)
    expected = torch.cat([tokens[:, 0], tokens[:, 1:].mean(dim=1)], dim=-1)
    for name, reference in (("clstoken_avgpool", expected), ("clstoken", theirs.pooler_output)):
        out = tmp_path / f"{name}.npz"
        assert main([str(image), "--checkpoint", str(folder), "--features", str(out),
                     "--embedding", name]) == 0  # fmt: skip
        np.testing.assert_allclose(read_features(out)[1], reference.numpy(), rtol=1e-4, atol=1e-4)
