"""Training batches straight from uint8 images in memory, augmented a whole batch at a time.

For small images (CIFAR: 50,000 x 3 x 32 x 32 bytes = 150 MB) per-image augmentation in
Python costs as much as the model's step on a CPU. Here the decoded images live in one uint8
tensor and every augmentation is a tensor operation on the batch:

    uint8 (N, 3, H, W) --index--> (B, 3, H, W) float --pad + random crop, flip, RandAugment-->
    --resize to the epoch's size (progressive resizing)--> normalise, erase --> (B, 3, S, S)

Randomness comes from a generator seeded by (seed, epoch), never from the global RNG, so an
epoch's batches are the same after a resume, and every process of a distributed run draws the
same permutation and takes its own share of it.

On a GPU (`device`) the uint8 images, the generator and every operation live there: a step
costs the host a few kernel launches and no copy, and nothing waits for the GPU. The draws then
come from the GPU's generator (Philox, where the CPU's is a Mersenne twister): the same
distributions, other values, so a run keeps the device it started its epochs on for them to
repeat exactly. On the CPU the draws are those of every earlier release.

The test images take the same way (`InMemoryEvalBatches`): normalised in large batches where
they lie, the values of the evaluation transform, where that transform only normalises.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from .batch_randaugment import compiled_apply_ops, rand_augment
from .repeated_augmentation import deal_repeats


class InMemoryBatches:
    """An iterable of (images (B, 3, S, S) float, labels (B,) int64) batches, one epoch each.

    images: (N, H, W, 3) uint8 (numpy, as decoded) or (N, 3, H, W) uint8 tensor.
    pad: pixels of padding before the random crop back to (H, W) (0: no crop); pad_mode:
    "constant" (zeros) or "reflect" (the image mirrored at its edges).
    hflip: probability of a horizontal flip. hflip_alternate: instead, flip each image on
    alternate epochs, starting from a random half (airbench's derandomised flips: over any two
    epochs every image is seen both ways, where random flips miss a quarter of them).
    randaug_ops: RandAugment ops per image (0: none), each image its own draws
    (`vit.data.batch_randaugment`: the per-image pipeline's menu, on the whole batch).
    reprob: probability of random erasing (one box of 10-40% per side, filled with normal
    noise after normalisation, as timm's RandomErasing).
    aug_repeats: repeated augmentation (`vit.data.repeated_augmentation`): each image of the
    epoch's shuffle this many times in a row, each copy augmented on its own (with
    hflip_alternate every other copy flipped the other way) (0 or 1: off).
    device: where the images are held, augmented and yielded (a GPU: see the module's notes).
    compile_randaug: off the CPU, RandAugment compiled (`batch_randaugment.compiled_apply_ops`:
    a few fused kernels a round where eager dispatches ~270); on the CPU it stays eager, each
    op on the images that drew it.
    augment_batches: the images of this many batches augmented in one call, then yielded a
    batch at a time. The host's work for a call (its draws and kernel launches, the same for
    512 images as for 8,192) is then paid once per `augment_batches` steps: on a GPU whose step
    the host sets, that is host time taken off the step. The same distributions, other draws
    (1: the draws of earlier releases). Every call has one shape, so RandAugment compiles once:
    the epoch's last call is filled up with other images of the epoch, whose augmented copies
    are dropped.
    Call `set_epoch(epoch, size)` before iterating; `size` (default H) resizes the batch to that
    height, its width in proportion (square images: size x size).
    """

    def __init__(
        self,
        images: np.ndarray | torch.Tensor,
        labels: Sequence[int] | np.ndarray,
        *,
        batch_size: int,
        mean: Sequence[float],
        std: Sequence[float],
        pad: int = 4,
        pad_mode: str = "constant",
        hflip: float = 0.5,
        hflip_alternate: bool = False,
        randaug_ops: int = 0,
        reprob: float = 0.0,
        aug_repeats: int = 0,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        device: torch.device | str = "cpu",
        compile_randaug: bool = False,
        augment_batches: int = 1,
    ) -> None:
        self.device = torch.device(device)
        images, labels = labelled_images(images, labels, "InMemoryBatches")
        self.images, self.labels = images.to(self.device), labels.to(self.device)
        self.batch_size = batch_size
        self.mean = pixel_scaled(mean, self.device)
        self.std = pixel_scaled(std, self.device)
        self.pad, self.pad_mode, self.hflip, self.reprob = pad, pad_mode, hflip, reprob
        self.randaug_ops = randaug_ops
        compiled = compile_randaug and randaug_ops > 0 and self.device.type != "cpu"
        self.apply_randaug = compiled_apply_ops() if compiled else None  # None: eager
        self.repeats = max(aug_repeats, 1)
        if augment_batches < 1:
            raise ValueError(f"augment_batches must be 1 or more, got {augment_batches}")
        self.augment_batches = augment_batches
        # Which images start flipped under hflip_alternate: fixed by the seed, not the epoch.
        start = self.generator(seed * 1_000_003 - 1)
        self.flip_start = (
            torch.rand(len(self.images), generator=start, device=self.device) < 0.5
            if hflip_alternate
            else None
        )
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.epoch = 0
        self.size: int | None = None  # the batches' height; None: the images' own
        # Every process gets the same number of full batches (DDP steps in lockstep).
        self.per_process = len(self.images) // world_size
        if self.per_process < batch_size:
            raise ValueError(
                f"--batch-size {batch_size} is larger than the {self.per_process} training "
                f"images each of the {world_size} process(es) gets; use a batch size <= "
                f"{self.per_process}"
            )

    def set_epoch(self, epoch: int, size: int | None = None) -> None:
        self.epoch = epoch
        self.size = None if size is None else int(size)

    def __len__(self) -> int:
        return self.per_process // self.batch_size

    def generator(self, seed: int) -> torch.Generator:
        return torch.Generator(device=self.device).manual_seed(seed)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        generator = self.generator(self.seed * 1_000_003 + self.epoch)
        order = torch.randperm(len(self.images), generator=generator, device=self.device)
        if self.repeats > 1 and self.world_size > 1:
            # Every process draws the same augmentations from the shared generator: without
            # repeats they fall on other images, but a process's copy of an image must differ
            # from the others' copies (without repeats the draws stay those of earlier releases).
            own_seed = hash((self.seed, self.epoch, self.rank)) & 0x7FFF_FFFF_FFFF_FFFF
            generator = self.generator(own_seed)
        mine, copy = deal_repeats(
            order, self.repeats, rank=self.rank, world_size=self.world_size, count=self.per_process
        )  # (N / world,) each
        B = self.batch_size
        per_call = min(self.augment_batches, len(self))  # batches augmented in one call
        for first in range(0, len(self), per_call):
            batches = min(per_call, len(self) - first)  # the batches of this call yielded
            span = slice(first * B, (first + per_call) * B)
            index = mine[span]  # (per_call * B,), but where the last call runs short
            # copy numbers only where there are copies: no work in a step without repeats
            copies = copy[span] if self.repeats > 1 else None
            if len(index) < per_call * B:  # filled up (with the images the epoch leaves out,
                # then its first): one shape, one compilation
                fill = per_call * B - len(index)
                index = torch.cat([index, mine[:fill]])
                copies = None if copies is None else torch.cat([copies, copy[:fill]])
            images = self.augment(self.images[index], generator, index, copies)
            labels = self.labels[index]  # (per_call * B,)
            for start in range(0, batches * B, B):
                yield images[start : start + B], labels[start : start + B]

    def augment(
        self,
        batch: torch.Tensor,
        generator: torch.Generator,
        index: torch.Tensor | None = None,
        copy: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """uint8 (B, 3, H, W) -> normalised float (B, 3, size, size * W / H), augmented.

        index: the images' positions in the data set (needed by hflip_alternate); copy (B,):
        which of an image's aug_repeats copies each is (odd ones flip the other way)."""
        x = batch.float()  # (B, 3, H, W), 0..255
        B, _, H, W = x.shape
        if self.pad > 0:
            x = random_crop(x, self.pad, generator, mode=self.pad_mode)
        if self.flip_start is not None:
            flip = self.flip_start[index] ^ bool(self.epoch % 2)  # (B,)
            if copy is not None:
                flip = flip ^ (copy % 2).bool()
            x = torch.where(flip[:, None, None, None], x.flip(-1), x)
        elif self.hflip > 0:
            flip = torch.rand(B, generator=generator, device=x.device) < self.hflip  # (B,)
            x = torch.where(flip[:, None, None, None], x.flip(-1), x)
        if self.randaug_ops > 0:
            x = rand_augment(x, self.randaug_ops, generator, apply=self.apply_randaug)
        if self.size is not None and self.size != H:
            # the width in proportion: a square size stretched non-square images (16x24 to 24x24)
            size = (self.size, round(self.size * W / H))
            x = F.interpolate(x, size=size, mode="bilinear", antialias=True, align_corners=False)
        x = (x - self.mean) / self.std
        if self.reprob > 0:
            x = random_erase(x, self.reprob, generator)
        return x


def random_crop(
    x: torch.Tensor, pad: int, generator: torch.Generator, mode: str = "constant"
) -> torch.Tensor:
    """Pad (B, C, H, W) by `pad` on every side, with zeros or (mode "reflect") the image
    mirrored at its edges, and crop each image back at its own offset. `generator` lives on
    x's device."""
    B, C, H, W = x.shape
    on = {"device": x.device}
    padded = F.pad(x, (pad, pad, pad, pad), mode=mode)  # (B, C, H + 2p, W + 2p)
    dy = torch.randint(0, 2 * pad + 1, (B,), generator=generator, **on)
    dx = torch.randint(0, 2 * pad + 1, (B,), generator=generator, **on)
    rows = (dy[:, None] + torch.arange(H, **on))[:, None, :, None]  # (B, 1, H, 1)
    cols = (dx[:, None] + torch.arange(W, **on))[:, None, None, :]  # (B, 1, 1, W)
    batch = torch.arange(B, **on)[:, None, None, None]
    channel = torch.arange(C, **on)[None, :, None, None]
    return padded[batch, channel, rows, cols]  # (B, C, H, W)


def random_erase(x: torch.Tensor, prob: float, generator: torch.Generator) -> torch.Tensor:
    """With probability `prob` per image, fill one box (10-40% per side) with N(0, 1) noise.
    `generator` lives on x's device."""
    B, C, H, W = x.shape
    on = {"device": x.device}
    apply = torch.rand(B, generator=generator, **on) < prob  # (B,)
    box_h = (torch.empty(B, **on).uniform_(0.1, 0.4, generator=generator) * H).long().clamp(min=1)
    box_w = (torch.empty(B, **on).uniform_(0.1, 0.4, generator=generator) * W).long().clamp(min=1)
    top = (torch.rand(B, generator=generator, **on) * (H - box_h + 1)).long()  # (B,)
    left = (torch.rand(B, generator=generator, **on) * (W - box_w + 1)).long()
    rows = torch.arange(H, **on)[None, :]  # (1, H)
    cols = torch.arange(W, **on)[None, :]
    in_rows = (rows >= top[:, None]) & (rows < (top + box_h)[:, None])  # (B, H)
    in_cols = (cols >= left[:, None]) & (cols < (left + box_w)[:, None])  # (B, W)
    box = in_rows[:, None, :, None] & in_cols[:, None, None, :] & apply[:, None, None, None]
    noise = torch.randn(x.shape, generator=generator, **on)
    return torch.where(box, noise, x)  # (B, C, H, W)


class InMemoryEvalBatches:
    """The test images as an iterable of (images (B, 3, H, W) float, labels (B,) int64) batches
    on `device`, normalised as the evaluation transform does (ToTensor, then Normalize: the same
    operations, so the same values) for images already at the model's input size, which that
    transform then only normalises. Under DDP each process takes every world_size-th image, as
    `vit.data.loaders.eval_loader` does."""

    def __init__(
        self,
        images: np.ndarray | torch.Tensor,
        labels: Sequence[int] | np.ndarray,
        *,
        batch_size: int,
        mean: Sequence[float],
        std: Sequence[float],
        rank: int = 0,
        world_size: int = 1,
        device: torch.device | str = "cpu",
    ) -> None:
        images, labels = labelled_images(images, labels, "InMemoryEvalBatches")
        self.images = images[rank::world_size].to(device)  # (N / world, 3, H, W) uint8
        self.labels = labels[rank::world_size].to(device)
        self.batch_size = batch_size
        self.mean = torch.tensor(mean, dtype=torch.float32, device=device).view(1, 3, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32, device=device).view(1, 3, 1, 1)

    def __len__(self) -> int:
        return -(-len(self.images) // self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for start in range(0, len(self.images), self.batch_size):
            batch = self.images[start : start + self.batch_size].float().div(255)  # ToTensor
            yield (batch - self.mean) / self.std, self.labels[start : start + self.batch_size]


def labelled_images(
    images: np.ndarray | torch.Tensor, labels: Sequence[int] | np.ndarray, who: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 images (N, H, W, 3) (numpy, as decoded) or (N, 3, H, W), and N labels ->
    ((N, 3, H, W) uint8, (N,) int64) tensors; ValueError naming `who` for anything else."""
    images = torch.as_tensor(images)
    if images.dtype != torch.uint8 or images.ndim != 4:
        raise ValueError(
            f"{who} needs uint8 images (N, H, W, 3) or (N, 3, H, W), got "
            f"{images.dtype} {tuple(images.shape)}"
        )
    if images.shape[-1] == 3 and images.shape[1] != 3:
        images = images.permute(0, 3, 1, 2)  # (N, H, W, 3) -> (N, 3, H, W)
    labels = torch.as_tensor(np.asarray(labels), dtype=torch.int64)
    if len(labels) != len(images):
        raise ValueError(f"{len(images)} images but {len(labels)} labels")
    return images.contiguous(), labels


def pixel_scaled(values: Sequence[float], device: torch.device) -> torch.Tensor:
    """Per-channel mean or std on the 0..1 scale -> (1, 3, 1, 1) on the 0..255 scale."""
    return torch.tensor(values, dtype=torch.float32, device=device).view(1, 3, 1, 1) * 255
