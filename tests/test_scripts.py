"""The helper scripts' command lines (scripts/*.py, scripts/gpu_check.sh, the benchmarks that
start train.py): a mistake is one line and status 2, paths mean what they meant as typed, and
nothing of the user's is overwritten or removed. No training here: train.py is stood in for."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def script(monkeypatch, folder: str, name: str):
    """ROOT/folder/name.py as a module (scripts/ and benchmarks/ are not packages)."""
    monkeypatch.syspath_prepend(str(ROOT / folder))
    return importlib.import_module(name)


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


def fake_train(within: Path, returncode: int = 0):
    """subprocess.run standing in for train.py: a metrics.csv in its --output-dir, resolved as
    train.py would (against the cwd it is given, else the current folder), where that is inside
    `within` (elsewhere, say the repository, nothing is written)."""
    calls = []

    def run(cmd, *args, cwd=None, stdout=None, **kwargs):
        calls.append((cmd, cwd))
        out = Path(cwd or os.getcwd()) / cmd[cmd.index("--output-dir") + 1]
        if returncode == 0 and out.resolve().is_relative_to(within.resolve()):
            out.mkdir(parents=True, exist_ok=True)
            (out / "metrics.csv").write_text(
                "epoch,train_loss,test_top1,ema_top1\n10,1.5,0.4,0.5\n"
            )
        return subprocess.CompletedProcess(cmd, returncode, stdout="", stderr="")

    return run, calls


# -- benchmarks/finetune_table.py, benchmarks/speedrun_proxy.py -----------------------------------
def test_finetune_rows_write_where_the_user_pointed_from_any_folder(monkeypatch, tmp_path):
    table = script(monkeypatch, "benchmarks", "finetune_table")
    run, calls = fake_train(tmp_path)
    monkeypatch.setattr(table.subprocess, "run", run)
    monkeypatch.chdir(tmp_path)  # not the repository: --out is relative to here
    args = argparse.Namespace(
        out=Path("ft"), data="data", model="vit_tiny_patch16_224", img_size=32, train_images=10,
        test_images=10, epochs=1, batch_size=2, warmup_epochs=0, workers=0, device="cpu",
        seed=0, threads=1, model_kwargs=[], backbone="bb", overwrite=False,
    )  # fmt: skip
    args.out.mkdir()
    row = table.run_row("full fine-tuning", table.ROWS["full fine-tuning"], args)
    assert row["ema_top1"] == 0.5
    assert (tmp_path / "ft" / "full-fine-tuning" / "metrics.csv").is_file()
    assert not (ROOT / "ft").exists()


def test_finetune_table_keeps_an_earlier_run_unless_overwrite(monkeypatch, tmp_path, capsys):
    """A row's folder under --out that holds a run (the user's, an earlier table's) is refused
    before any row; with --overwrite, train.py is told to replace it."""
    table = script(monkeypatch, "benchmarks", "finetune_table")
    run, calls = fake_train(tmp_path)
    monkeypatch.setattr(table.subprocess, "run", run)
    kept = tmp_path / "ft" / "full-fine-tuning"
    kept.mkdir(parents=True)
    (kept / "config.yaml").write_text("seed: 7\n")
    argv = ["finetune_table.py", "--backbone", "bb", "--model", "vit_tiny_patch16_224"]
    argv += ["--data", "data", "--out", str(tmp_path / "ft"), "--rows", "full fine-tuning"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as stopped:
        table.main()
    assert stopped.value.code == 2 and calls == []
    assert str(kept) in one_line(capsys.readouterr().err)
    assert (kept / "config.yaml").read_text() == "seed: 7\n"
    monkeypatch.setattr(sys, "argv", [*argv, "--overwrite"])
    table.main()
    assert "--overwrite" in calls[0][0]


def test_gpu_check_finetune_passes_overwrite_for_its_own_folder():
    text = (ROOT / "scripts" / "gpu_check.sh").read_text()
    assert '--out "$OUTDIR/finetune" --overwrite' in text


def test_speedrun_proxy_runs_where_the_user_is_and_fails_when_a_run_fails(
    monkeypatch, tmp_path, capsys
):
    proxy = script(monkeypatch, "benchmarks", "speedrun_proxy")
    monkeypatch.chdir(tmp_path)
    for split in ("train", "test"):
        (tmp_path / "data" / split).mkdir(parents=True)
    run, _ = fake_train(tmp_path)
    monkeypatch.setattr(proxy.subprocess, "run", run)
    argv = ["speedrun_proxy.py", "--data", "data", "--output", "out", "--parallel", "1"]
    monkeypatch.setattr(sys, "argv", [*argv, "--rows", "recipe"])
    proxy.main()
    assert (tmp_path / "out" / "recipe-seed0" / "metrics.csv").is_file()
    assert "| recipe | 0 | 50.00 |" in capsys.readouterr().out  # the table has the run

    failing, _ = fake_train(tmp_path, returncode=1)
    monkeypatch.setattr(proxy.subprocess, "run", failing)
    monkeypatch.setattr(sys, "argv", [*argv, "--rows", "reprob"])
    with pytest.raises(SystemExit) as stopped:
        proxy.main()
    assert stopped.value.code not in (None, 0) and "reprob seed 0" in str(stopped.value.code)


def test_speedrun_proxy_refuses_a_data_folder_before_any_run(monkeypatch, tmp_path, capsys):
    proxy = script(monkeypatch, "benchmarks", "speedrun_proxy")
    run, calls = fake_train(tmp_path)
    monkeypatch.setattr(proxy.subprocess, "run", run)
    output = tmp_path / "out"
    monkeypatch.setattr(
        sys, "argv", ["p", "--data", str(tmp_path / "nope"), "--output", str(output)]
    )
    with pytest.raises(SystemExit) as stopped:
        proxy.main()
    assert stopped.value.code == 2 and calls == [] and not output.exists()
    assert "--data" in one_line(capsys.readouterr().err)


def test_cpu_ablation_paths_mean_what_they_meant_as_typed_and_a_failed_row_is_one_line(
    monkeypatch, tmp_path, image_folder
):
    """Relative --data and --out are the current folder's, not the repository's (where train.py
    runs); a row whose train.py fails ends the benchmark with one line naming the row and its
    log, not a CalledProcessError."""
    ablation = script(monkeypatch, "benchmarks", "cpu_ablation")
    monkeypatch.setattr(ablation, "load_split", lambda *args, **kwargs: None)  # no cache here
    calls = []

    def failing(cmd, *args, cwd=None, **kwargs):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 1)

    monkeypatch.setattr(ablation.subprocess, "run", failing)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").symlink_to(image_folder)
    with pytest.raises(SystemExit) as stopped:
        ablation.main(["--data", "data", "--rows", "recipe", "--out", "abl"])
    log = tmp_path / "abl" / "recipe-seed0.log"
    assert one_line(str(stopped.value.code)).endswith(f"row recipe seed 0: train.py failed "
                                                      f"(exit status 1); see {log}")  # fmt: skip
    cmd = calls[0]
    assert cmd[cmd.index("--data") + 1] == str(tmp_path / "data")
    assert cmd[cmd.index("--output-dir") + 1] == str(tmp_path / "abl" / "recipe-seed0")
    assert log.is_file() and not (ROOT / "abl").exists()


# -- scripts/pack_cifar10.py ----------------------------------------------------------------------
@pytest.fixture
def tiny_folder(tmp_path) -> Path:
    """train/ and test/ of two classes, two 'JPEGs' each (the packer only copies bytes)."""
    for split in ("train", "test"):
        for name in ("cat", "dog"):
            (tmp_path / "src" / split / name).mkdir(parents=True)
            for k in range(2):
                (tmp_path / "src" / split / name / f"{k}.jpg").write_bytes(b"jpeg %d" % k)
    return tmp_path / "src"


def test_pack_refuses_an_existing_output_unless_overwrite(
    monkeypatch, tiny_folder, tmp_path, capsys
):
    pack = script(monkeypatch, "scripts", "pack_cifar10")
    output = tmp_path / "mine.npz"
    output.write_bytes(b"the user's")
    assert pack.main(["--source", str(tiny_folder), "--output", str(output)]) == 2
    assert "--overwrite" in one_line(capsys.readouterr().err)
    assert output.read_bytes() == b"the user's"
    assert pack.main(["--source", str(tiny_folder), "--output", str(output), "--overwrite"]) == 0
    assert output.read_bytes() != b"the user's"
    # a folder: refused, overwrite or not, and no temporary file left nor named
    folder = tmp_path / "odir"
    folder.mkdir()
    assert pack.main(["--source", str(tiny_folder), "--output", str(folder), "--overwrite"]) == 2
    assert ".tmp" not in one_line(capsys.readouterr().err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.npz", "odir", "src"]


def test_gpu_check_pack_passes_overwrite_for_its_own_file():
    """--pack packs again into its own build file: the packer's --overwrite is its to give."""
    text = (ROOT / "scripts" / "gpu_check.sh").read_text()
    assert 'scripts/pack_cifar10.py --overwrite --output "$PACKED"' in text


def test_pack_stopped_by_ctrl_c_is_one_line_and_leaves_nothing(
    monkeypatch, tiny_folder, tmp_path, capsys
):
    pack = script(monkeypatch, "scripts", "pack_cifar10")

    def interrupted(handle, **arrays):
        handle.write(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(pack.np, "savez_compressed", interrupted)
    output = tmp_path / "out" / "c.npz"
    assert pack.main(["--source", str(tiny_folder), "--output", str(output)]) == 130
    assert "Ctrl-C" in one_line(capsys.readouterr().err)
    assert list(output.parent.iterdir()) == []


def test_unpack_of_a_file_it_did_not_pack_is_one_line(monkeypatch, tmp_path, capsys):
    pack = script(monkeypatch, "scripts", "pack_cifar10")
    text, other = tmp_path / "notes.txt", tmp_path / "other.npz"
    text.write_text("hello\n")
    np.savez(other, a=np.arange(3))
    for packed in (text, other):
        assert pack.main(["--unpack", str(packed), str(tmp_path / "out")]) == 2
        line = one_line(capsys.readouterr().err)
        assert str(packed) in line and "not a file this script packed" in line
    assert not (tmp_path / "out").exists()


def test_unpack_keeps_a_temporary_folder_it_did_not_make(monkeypatch, tiny_folder, tmp_path):
    pack = script(monkeypatch, "scripts", "pack_cifar10")
    packed = tmp_path / "c.npz"
    assert pack.main(["--source", str(tiny_folder), "--output", str(packed)]) == 0
    theirs = tmp_path / ".out.tmp"
    theirs.mkdir()
    (theirs / "keep.txt").write_text("mine")
    assert pack.main(["--unpack", str(packed), str(tmp_path / "out")]) == 2
    assert (theirs / "keep.txt").read_text() == "mine"
    theirs.rename(tmp_path / "kept")
    assert pack.main(["--unpack", str(packed), str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "train" / "cat" / "1.jpg").read_bytes() == b"jpeg 1"


def test_unpack_replaces_images_of_another_pack_of_as_many_only_with_overwrite(
    monkeypatch, tiny_folder, tmp_path, capsys
):
    """A folder unpacked from other images is told by their digest, not their count: kept
    whole without --overwrite (one line), replaced with it; the same images are kept as they are."""
    pack = script(monkeypatch, "scripts", "pack_cifar10")
    first, second, out = tmp_path / "a.npz", tmp_path / "b.npz", tmp_path / "out"
    assert pack.main(["--source", str(tiny_folder), "--output", str(first)]) == 0
    (tiny_folder / "train" / "cat" / "1.jpg").write_bytes(b"another cat")  # as many images
    assert pack.main(["--source", str(tiny_folder), "--output", str(second)]) == 0
    assert pack.main(["--unpack", str(first), str(out)]) == 0
    assert pack.main(["--unpack", str(second), str(out)]) == 2
    assert "--overwrite" in one_line(capsys.readouterr().err)
    assert (out / "train" / "cat" / "1.jpg").read_bytes() == b"jpeg 1"
    assert pack.main(["--unpack", str(second), str(out), "--overwrite"]) == 0
    assert (out / "train" / "cat" / "1.jpg").read_bytes() == b"another cat"
    (out / "mine.txt").write_text("kept")  # the same images again: the folder is not rewritten
    assert pack.main(["--unpack", str(second), str(out), "--overwrite"]) == 0
    assert (out / "mine.txt").read_text() == "kept"


def test_pack_runs_where_vit_is_not_installed(tiny_folder, tmp_path):
    """As on the GPU machine, whose image has numpy but no vit: `python3 scripts/pack_cifar10.py`
    from another folder, with no site (-S: no installed vit) and numpy on PYTHONPATH alone."""
    site_packages = Path(np.__file__).resolve().parents[1]
    packed = tmp_path / "c.npz"
    done = subprocess.run(
        [sys.executable, "-S", str(ROOT / "scripts" / "pack_cifar10.py"), "--source",
            str(tiny_folder), "--output", str(packed)],
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(site_packages)},
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert packed.is_file()


# -- benchmarks/plot_cpu_recipe.py ----------------------------------------------------------------
@pytest.fixture
def recipe_run(tmp_path) -> tuple[Path, Path]:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.csv").write_text(
        "epoch,train_loss,test_top1,ema_top1\n1,2.0,0.30,0.35\n2,1.5,0.40,0.45\n"
    )
    data = tmp_path / "pets"
    for k in range(3):
        (data / "test" / "cat").mkdir(parents=True, exist_ok=True)
        (data / "test" / "cat" / f"{k}.jpg").write_bytes(b"x")
    (run / "config.yaml").write_text(
        f"data: {data}\ntest_subset: null\ndevice: cpu\nprocesses: 4\nthreads: 1\n"
    )
    log = tmp_path / "train.log"
    log.write_text(
        "launched 2026-01-01 00:00:00 bash scripts/train.sh\n"
        "2026-01-01 00:01:00,000 INFO epoch 1/2: train loss 2.0\n"
        "2026-01-01 00:02:00,000 INFO epoch 2/2: train loss 1.5\n"
    )
    return run, log


def test_the_recipe_plot_says_what_the_run_recorded(monkeypatch, recipe_run, tmp_path):
    plot = script(monkeypatch, "benchmarks", "plot_cpu_recipe")
    figures = []
    monkeypatch.setattr(plot.Figure, "savefig", lambda self, *a, **k: figures.append(self))
    run, log = recipe_run
    argv = ["p", "--run", str(run), "--log", str(log), "--out", str(tmp_path / "c.png")]
    monkeypatch.setattr(sys, "argv", argv)
    plot.main()
    by_time = figures[0].axes[0]
    assert by_time.get_title() == "pets, all 3 test images"
    (label,) = [line.get_label() for line in by_time.get_lines()][:1]
    assert label == "this run (cpu, 4 processes, 1 thread each) (EMA weights)"


def test_the_recipe_plots_title_counts_the_images_its_evaluation_reads(
    monkeypatch, recipe_run, tmp_path
):
    """Not a stray file beside them (a README, macOS's .DS_Store); val/ where there is no test/."""
    plot = script(monkeypatch, "benchmarks", "plot_cpu_recipe")
    cats = tmp_path / "pets" / "test" / "cat"
    (cats / "README.txt").write_text("where these came from")
    (cats / ".DS_Store").write_bytes(b"\0")
    assert plot.test_images({"data": str(tmp_path / "pets")}) == "pets, all 3 test images"
    (tmp_path / "pets" / "test").rename(tmp_path / "pets" / "val")
    assert plot.test_images({"data": str(tmp_path / "pets")}) == "pets, all 3 test images"


def test_the_recipe_plot_refuses_a_missing_run_and_a_non_image_name(
    monkeypatch, recipe_run, tmp_path, capsys
):
    plot = script(monkeypatch, "benchmarks", "plot_cpu_recipe")
    run, log = recipe_run
    for given, flag in (
        (["--run", str(run), "--log", str(log), "--out", str(tmp_path / "x.txt")], "--out"),
        (["--run", "/nope", "--log", str(log), "--out", str(tmp_path / "x.png")], "--run"),
    ):
        monkeypatch.setattr(sys, "argv", ["p", *given])
        with pytest.raises(SystemExit) as stopped:
            plot.main()
        assert stopped.value.code == 2
        assert flag in one_line(capsys.readouterr().err)
    assert not (tmp_path / "x.txt").exists()


def test_the_recipe_plot_keeps_an_existing_image_unless_overwrite(
    monkeypatch, recipe_run, tmp_path, capsys
):
    plot = script(monkeypatch, "benchmarks", "plot_cpu_recipe")
    run, log = recipe_run
    mine = tmp_path / "mine.png"
    mine.write_bytes(b"my own figure")
    argv = ["p", "--run", str(run), "--log", str(log), "--out", str(mine)]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as stopped:
        plot.main()
    assert stopped.value.code == 2 and "--overwrite" in one_line(capsys.readouterr().err)
    assert mine.read_bytes() == b"my own figure"
    monkeypatch.setattr(sys, "argv", [*argv, "--overwrite"])
    plot.main()
    assert mine.read_bytes().startswith(b"\x89PNG")  # whole, through a temporary file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.png", "pets", "run", "train.log"]


def test_the_recipe_plot_names_the_epochs_its_log_lacks(monkeypatch, recipe_run, tmp_path, capsys):
    """Another run's log, or a resumed run's restarted one: one line, not a KeyError."""
    plot = script(monkeypatch, "benchmarks", "plot_cpu_recipe")
    run, log = recipe_run
    with open(run / "metrics.csv", "a") as f:
        f.write("3,1.2,0.5,0.55\n")
    argv = ["p", "--run", str(run), "--log", str(log), "--out", str(tmp_path / "c.png")]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as stopped:
        plot.main()
    assert stopped.value.code == 2 and "epoch(s) 3 of --run" in one_line(capsys.readouterr().err)
    assert not (tmp_path / "c.png").exists()


# -- scripts/choose_speedrun_flags.py -------------------------------------------------------------
ROW = {
    "config": "configs/cifar10_gpu_speedrun.yaml:graph_step=true", "shape": "config",
    "images_per_s": 40_000, "warm_up_seconds": 45.0, "train_loss": 2.0, "gpu_busy_share": 0.9,
}  # fmt: skip


@pytest.mark.parametrize(
    "content, flags, said",
    [
        ({"rows": [ROW]}, ["--time-budget", "-5"], "--time-budget"),
        ({"rows": [ROW]}, ["--time-budget", "nan"], "--time-budget"),
        ({"environment": {"gpu": "H200"}}, [], "not a training_pipeline.py --json (no 'rows')"),
        ([ROW], [], "no 'rows'"),
        ({"rows": [{k: v for k, v in ROW.items() if k != "images_per_s"}]}, [], "images_per_s"),
        ({"rows": [{k: v for k, v in ROW.items() if k != "config"}]}, [], "'config'"),
        ({"rows": [ROW]}, ["--json", "/nonexistent/c.json"], "--json"),
        ({"rows": [ROW]}, ["--json", "FOLDER"], "is a folder"),
    ],
)
def test_the_speedrun_chooser_refuses_in_one_line_before_choosing(
    monkeypatch, tmp_path, capsys, content, flags, said
):
    chooser = script(monkeypatch, "scripts", "choose_speedrun_flags")
    rows = tmp_path / "pipeline.json"
    rows.write_text(json.dumps(content))
    flags = [str(tmp_path) if flag == "FOLDER" else flag for flag in flags]
    with pytest.raises(SystemExit) as stopped:
        chooser.main([str(rows), *flags])
    out, err = capsys.readouterr()
    assert stopped.value.code == 2 and out == "" and said in one_line(err)


def test_the_speedrun_chooser_says_when_there_are_no_rows(monkeypatch, tmp_path, capsys):
    chooser = script(monkeypatch, "scripts", "choose_speedrun_flags")
    rows = tmp_path / "pipeline.json"
    rows.write_text(json.dumps({"rows": []}))
    with pytest.raises(SystemExit) as stopped:
        chooser.main([str(rows)])
    assert stopped.value.code == 2
    assert "(above)" not in one_line(capsys.readouterr().err)


# -- scripts/gpu_report.py ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "content, said",
    [
        ({"tests": {"passed": 3}}, "none of environment, speedrun, pipeline, speedrun_choice"),
        ([1, 2], "none of environment"),
        ({"speedrun": [{"seed": 0}]}, "speedrun[0] has no 'status'"),
        (
            {"pipeline": {"rows": [{"config": "c", "shape": "config"}]}},
            "pipeline row 0 has no 'images_per_s'",
        ),
        ({"speedrun_choice": {"row": "x"}}, "speedrun_choice has no 'flags'"),
        # a field a table formats as a number, given as something else
        (
            {
                "pipeline": {
                    "rows": [
                        {
                            "config": "a",
                            "shape": "b",
                            "images_per_s": None,
                            "ms_per_step": 1,
                            "data_wait_share": 0,
                        }
                    ]
                }
            },
            "pipeline row 0: 'images_per_s' is null, not a number",
        ),
        (
            {
                "speedrun": [
                    {
                        "seed": 0,
                        "status": 0,
                        "wall_seconds": 1,
                        "epochs": [],
                        "top1": "x",
                        "tta_top1": None,
                    }
                ]
            },
            "speedrun[0]: 'top1' is \"x\", not a number or null",
        ),
    ],
)
def test_gpu_report_names_the_file_and_the_missing_field(
    monkeypatch, tmp_path, capsys, content, said
):
    report = script(monkeypatch, "scripts", "gpu_report")
    records = tmp_path / "gpu_check.json"
    records.write_text(json.dumps(content))
    with pytest.raises(SystemExit) as stopped:
        report.main([str(records)])
    out, err = capsys.readouterr()
    line = one_line(err)
    assert stopped.value.code == 2 and out == "" and str(records) in line and said in line


# -- scripts/gpu_check.sh -------------------------------------------------------------------------
def gpu_check(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh"), *args],
        env={**os.environ, "PYTHON": sys.executable, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_gpu_check_help_and_usage_name_every_stage():
    done = gpu_check("--help")
    assert done.returncode == 0 and done.stderr == ""
    assert "bash scripts/gpu_check.sh OUTDIR [STAGE ...]" in done.stdout
    usage = gpu_check("--nope")
    assert usage.returncode == 2 and "[pipeline]" in one_line(usage.stderr)


def test_gpu_check_pack_backbone_checks_the_folder_before_making_anything(tmp_path):
    build = tmp_path / "bb"
    done = gpu_check("--pack-backbone", str(tmp_path / "dinov2"), VIT_GPU_BACKBONE_BUILD=str(build))
    assert done.returncode == 2 and "model.safetensors" in one_line(done.stderr)
    assert not build.exists()
