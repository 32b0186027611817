"""CIFAR-10's image folder as one compact file, to travel to a GPU machine, and back to a folder.

    python scripts/pack_cifar10.py                  # ../shared/data/cifar10-jpg -> build/gpu/
    python scripts/pack_cifar10.py --overwrite      # ... replacing the file packed before
    python scripts/pack_cifar10.py --per-class 1000 # a class-balanced subset of train/
    python scripts/pack_cifar10.py --unpack build/gpu/cifar10-jpg.npz /tmp/cifar10-jpg

The GPU machine receives the working tree and the ignored paths named in `carry`, 64 MiB in
all, and nothing else: 60,000 JPEG files of ~920 bytes are 55 MB of bytes, which one file holds
without the per-file overhead of a tar (a 512-byte header and padding each). The file is a numpy
`.npz` (read with no pickle): `paths` (N,) the files' paths under the folder (bytes),
`offsets` (N + 1,) int64 and `data` the JPEG bytes one after another; `--unpack` writes the
same image folder again, byte for byte, which train.py reads as it reads the original
(`--data FOLDER`): the package needs no new data format. build/ is ignored by git: the file is
never committed. scripts/gpu_check.sh unpacks it on the GPU machine. A folder unpacked before
from the same images (its `.unpacked` file holds their digest) is kept as it is; one unpacked
from other images is replaced only with --overwrite. The script runs from any checkout as
`python3 scripts/pack_cifar10.py`, with the package not installed (as on the GPU machine).

A mistake (no such folder, an output that exists: a file without --overwrite, or a folder) is
one line and status 2; Ctrl-C is one line and status 130. Nothing half-written is left (both
directions write a temporary file or folder, then rename, and remove it if stopped).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# `python3 scripts/pack_cifar10.py` puts scripts/, not the repository, on sys.path, and the GPU
# machine's image has no vit installed: the package is this checkout's
sys.path.insert(0, str(ROOT))

from vit.utils.files import marked_write_dir  # noqa: E402  (after the path above)

DEFAULT_SOURCE = ROOT.parent / "shared" / "data" / "cifar10-jpg"
DEFAULT_OUTPUT = ROOT / "build" / "gpu" / "cifar10-jpg.npz"
SPLITS = ("train", "test")
DONE = ".unpacked"  # written last into an unpacked folder: its image count and their digest
UNPACKING = ".unpacking"  # written first into the temporary folder: it is this script's own
KEYS = ("paths", "offsets", "data")


def image_paths(source: Path, per_class: int | None) -> list[Path]:
    """The folder's JPEGs, relative to it, sorted; with `per_class`, the first N of each class
    of train/ (sorted names: the same subset every time); test/ whole."""
    paths = []
    for split in SPLITS:
        classes = sorted(p for p in (source / split).iterdir() if p.is_dir())
        if not classes:
            raise ValueError(f"{source / split}: no class folders")
        for folder in classes:
            files = sorted(folder.glob("*.jpg"))
            if split == "train" and per_class is not None:
                files = files[:per_class]
            paths += [f.relative_to(source) for f in files]
    return paths


def pack(source: Path, output: Path, per_class: int | None) -> tuple[int, int]:
    """Write `output` from the image folder `source`; (images, bytes of the file)."""
    if not all((source / split).is_dir() for split in SPLITS):
        raise ValueError(f"--source {source}: not an image folder with train/ and test/ in it")
    paths = image_paths(source, per_class)
    blobs = [(source / p).read_bytes() for p in paths]
    offsets = np.zeros(len(blobs) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(b) for b in blobs])
    data = np.frombuffer(b"".join(blobs), dtype=np.uint8)
    names = np.array([str(p).encode() for p in paths])  # bytes: loads without pickle
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.tmp")
    try:
        with open(tmp, "wb") as f:  # a file object: np.savez would add .npz to a name
            np.savez_compressed(f, paths=names, offsets=offsets, data=data)  # shared JPEG headers
        os.replace(tmp, output)
    finally:
        tmp.unlink(missing_ok=True)  # stopped or failed: no temporary file left
    return len(paths), output.stat().st_size


def read_packed(packed: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(paths, offsets, data) of a file this script packed; ValueError naming it otherwise."""
    try:
        with np.load(packed, allow_pickle=False) as archive:
            return tuple(archive[key] for key in KEYS)
    except (ValueError, KeyError, OSError, TypeError, AttributeError):
        raise ValueError(
            f"--unpack {packed}: not a file this script packed (an .npz of paths, offsets and data)"
        ) from None


def digest(names: np.ndarray, offsets: np.ndarray, data: np.ndarray) -> str:
    """The SHA-256 of a pack's paths, offsets and bytes: the same images give the same digest
    however the file was compressed (a zip records when it was written)."""
    sha = hashlib.sha256()
    for array in (names, offsets, data):
        sha.update(np.ascontiguousarray(array).tobytes())
    return sha.hexdigest()


def unpack(packed: Path, destination: Path, overwrite: bool = False) -> int:
    """Write the image folder held in `packed` to `destination`; its image count. A folder
    already unpacked from the same images is kept as it is; one this script unpacked from
    others is replaced where `overwrite`."""
    names, offsets, data = read_packed(packed)
    done = f"{len(names)} {digest(names, offsets, data)}"
    marker = destination / DONE
    ours = marker.is_file()
    # the digest, not the count: another pack of as many images must not keep the old ones
    if ours and marker.read_text().strip() == done:
        return len(names)
    if ours and not overwrite:
        raise ValueError(
            f"{destination}: unpacked from other images than {packed}'s; add --overwrite to "
            f"replace it, or unpack elsewhere"
        )
    if destination.exists() and not ours:
        raise ValueError(
            f"{destination} exists and is not a folder unpacked from {packed}; remove it or "
            f"unpack elsewhere"
        )
    if ours:  # stopped after this, the folder is absent, never a mixture: unpacked next time
        shutil.rmtree(destination)

    def write(folder: Path) -> None:
        for i, name in enumerate(names):
            path = folder / name.decode()
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data[offsets[i] : offsets[i + 1]].tobytes())
        (folder / DONE).write_text(f"{done}\n")

    # a killed unpack's .FOLDER.tmp is removed, one this script did not make refused
    tmp = destination.with_name(f".{destination.name}.tmp")
    marked_write_dir(destination, tmp, UNPACKING, write)
    return len(names)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/pack_cifar10.py",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="the image folder")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="the packed file")
    parser.add_argument("--per-class", type=int, help="train images per class (default: all)")
    parser.add_argument(
        "--unpack", nargs=2, type=Path, metavar=("FILE", "FOLDER"), help="write FILE's images"
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing --output, or a FOLDER --unpack wrote from other images",
    )
    args = parser.parse_args(argv)
    try:
        if args.unpack:
            packed, destination = args.unpack
            if not packed.is_file():
                raise ValueError(f"--unpack {packed}: no such file; make it with this script")
            count = unpack(packed, destination, args.overwrite)
            print(f"{destination}: {count} images")
        else:
            if args.per_class is not None and args.per_class < 1:
                raise ValueError(f"--per-class {args.per_class}: give a number >= 1")
            if args.output.is_dir():
                raise ValueError(f"--output {args.output}: is a folder; give a file name")
            if args.output.exists() and not args.overwrite:
                raise ValueError(
                    f"--output {args.output}: exists; add --overwrite to replace it, or choose "
                    f"another file"
                )
            count, size = pack(args.source, args.output, args.per_class)
            print(f"{args.output}: {count} images, {size / 2**20:.1f} MiB")
    except (ValueError, OSError) as e:
        print(f"pack_cifar10.py: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("pack_cifar10.py: stopped (Ctrl-C); nothing written", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
