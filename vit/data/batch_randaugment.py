"""RandAugment on whole batches (Cubuk et al. 2020): every image of a batch draws its own ops
and magnitudes, and the batch is transformed by tensor operations where it lies, a GPU
included, with no per-image Python and no host synchronisation.

The menu is the per-image pipeline's (`vit.data.transforms.randaugment_ops`): the same 13 ops in
the same order at the same strengths, each image's ops drawn as here (uniformly, with
replacement, applied in the order drawn), there from albumentations' generators.
tests/test_randaugment.py compares the two menus op by op, to within a level: the per-image ops
end in uint8, translate by whole pixels, and rotate the other way for the same angle. Each op
here is torchvision's functional op (PIL's definitions), which the tests compare with image by
image:

    rotate +-20 deg, shear x / y +-15 deg, translate x / y +-15%      one affine warp (bilinear,
                                                                        zeros outside)
    brightness x[0.6, 1.4], contrast x[0.6, 1.4], saturation x[0.5, 1.5], sharpness x[1.2, 1.6]
    posterize to 4-6 bits, solarize above 50-100%, equalize, autocontrast

Each of `num_ops` rounds draws, for every image, one op of the menu (uniformly, with
replacement, as timm's and torchvision's RandAugment) and one magnitude in its range. On the
CPU each op transforms the images that drew it; on a GPU each op transforms the whole batch and
every image keeps the result of its own op (no shapes that depend on the draws, which the GPU
would have to report back to the host: the step would wait).

Images are float (B, 3, H, W) in 0..255, as `InMemoryBatches` holds them between the crop and
the normalisation; posterize and equalize read the integer part of a pixel.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

OPS = (
    "rotate",
    "shear_x",
    "shear_y",
    "translate_x",
    "translate_y",
    "brightness",
    "contrast",
    "saturation",
    "sharpness",
    "posterize",
    "solarize",
    "equalize",
    "autocontrast",
)
# (low, high) of each op's magnitude; the draw u in [0, 1) gives low + u * (high - low)
RANGES = {
    "rotate": (-20.0, 20.0),  # degrees
    "shear_x": (-15.0, 15.0),  # degrees
    "shear_y": (-15.0, 15.0),
    "translate_x": (-0.15, 0.15),  # fraction of the width
    "translate_y": (-0.15, 0.15),  # fraction of the height
    "brightness": (0.6, 1.4),  # factors: 1 leaves the image as it is
    "contrast": (0.6, 1.4),
    "saturation": (0.5, 1.5),
    "sharpness": (1.2, 1.6),
    "posterize": (4.0, 7.0),  # bits kept: 4, 5 or 6 (the integer part)
    "solarize": (0.5, 1.0),  # threshold, a fraction of 255
}
GEOMETRIC = OPS[:5]
GRAY = (0.2989, 0.587, 0.114)  # torchvision's (ITU-R 601-2) luma weights


def rand_augment(
    x: torch.Tensor, num_ops: int, generator: torch.Generator, apply: Callable | None = None
) -> torch.Tensor:
    """float (B, 3, H, W) in 0..255 -> the same, each image through `num_ops` ops it drew.
    `generator` lives on x's device; `apply` (default `apply_ops`) transforms the images with
    the ops and magnitudes drawn (`compiled_apply_ops()`: the same, compiled)."""
    B = x.shape[0]
    on = {"device": x.device}
    for _ in range(num_ops):
        op = torch.randint(len(OPS), (B,), generator=generator, **on)  # (B,) index into OPS
        u = torch.rand(B, generator=generator, **on)  # (B,) where in its range the magnitude is
        x = (apply or apply_ops)(x, op, u)
    return x


def compiled_apply_ops() -> Callable:
    """`apply_ops` on the whole batch (the GPU's way), compiled into a few fused kernels.

    Eager, a round dispatches ~270 operations, each a kernel launch on a GPU: RandAugment x2
    took 681 a batch where the rest of the pipeline takes 95, and on an H200 the speedrun's
    epoch then spent 35% of its time waiting for batches (5% without RandAugment), its
    throughput down from ~36,000 images/s to ~23,000. The draws stay outside (a generator
    cannot enter a compiled graph), so a compiled run draws what an eager one does. One static
    shape: a run's batches all have one."""
    return torch.compile(
        functools.partial(apply_ops, whole_batch=True), fullgraph=True, dynamic=False
    )


def magnitude(name: str, u: torch.Tensor) -> torch.Tensor:
    low, high = RANGES[name]
    return low + u * (high - low)


def apply_ops(
    x: torch.Tensor, op: torch.Tensor, u: torch.Tensor, whole_batch: bool | None = None
) -> torch.Tensor:
    """Image i of float (B, 3, H, W) through op OPS[op[i]] at magnitude draw u[i].

    On the CPU each op runs on the images that drew it. On a GPU (whole_batch, by default
    where x is not on the CPU) every op runs on the whole batch and each image keeps its own
    op's result: choosing the images would make the host wait for the GPU to say which they
    are, where computing all 13 costs the GPU little. Both give the same images."""
    if whole_batch is None:
        whole_batch = x.device.type != "cpu"
    groups = [(op < len(GEOMETRIC), geometric)]  # the five geometric ops: one warp
    groups += [(op == OPS.index(name), photometric) for name, photometric in PHOTOMETRIC.items()]
    out = x
    for drew, transform in groups:  # drew: (B,) bool
        if not whole_batch:
            chosen = drew.nonzero().squeeze(1)  # (b,) the images that drew it
            if len(chosen) > 0:
                out = out.index_copy(0, chosen, transform(x[chosen], op[chosen], u[chosen]))
        else:
            out = torch.where(drew[:, None, None, None], transform(x, op, u), out)
    return out.clamp(0, 255)


def geometric(x: torch.Tensor, op: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Each image rotated, sheared or translated as its op says (0 for the others)."""
    H, W = x.shape[-2:]

    def amount(name: str, scale: float = 1.0) -> torch.Tensor:  # (B,) 0 where not drawn
        return torch.where(op == OPS.index(name), magnitude(name, u) * scale, 0.0)

    theta = inverse_affine(
        angle=amount("rotate"),
        shear_x=amount("shear_x"),
        shear_y=amount("shear_y"),
        shift_x=amount("translate_x", W),
        shift_y=amount("translate_y", H),
    )
    return warp(x, theta)


def per_image(values: torch.Tensor) -> torch.Tensor:
    return values[:, None, None, None]  # (B,) -> (B, 1, 1, 1)


PHOTOMETRIC = {  # name -> (images, their ops, their draws) -> images
    "brightness": lambda x, op, u: x * per_image(magnitude("brightness", u)),
    "contrast": lambda x, op, u: blend(
        x, grayscale(x).mean(dim=(-3, -2, -1), keepdim=True), magnitude("contrast", u)
    ),
    "saturation": lambda x, op, u: blend(x, grayscale(x), magnitude("saturation", u)),
    "sharpness": lambda x, op, u: blend(x, smoothed(x), magnitude("sharpness", u)),
    "posterize": lambda x, op, u: posterize(x, magnitude("posterize", u).floor()),
    "solarize": lambda x, op, u: torch.where(
        x >= per_image(magnitude("solarize", u) * 255), 255 - x, x
    ),
    "equalize": lambda x, op, u: equalize(x),
    "autocontrast": lambda x, op, u: autocontrast(x),
}


def inverse_affine(
    angle: torch.Tensor,
    shear_x: torch.Tensor,
    shear_y: torch.Tensor,
    shift_x: torch.Tensor,
    shift_y: torch.Tensor,
) -> torch.Tensor:
    """(B,) degrees and pixels -> (B, 2, 3): for each output pixel (from the image's centre),
    where to read the input: the inverse of T * R(angle) * ShearY * ShearX about the centre,
    torchvision's convention (`torchvision.transforms.functional.affine`)."""
    rot, sx, sy = (torch.deg2rad(t.double()) for t in (angle, shear_x, shear_y))
    # the forward rotation-shear [[a, b], [c, d]] (determinant 1), as torchvision writes it
    a = torch.cos(rot - sy) / torch.cos(sy)
    b = -torch.cos(rot - sy) * torch.tan(sx) / torch.cos(sy) - torch.sin(rot)
    c = torch.sin(rot - sy) / torch.cos(sy)
    d = -torch.sin(rot - sy) * torch.tan(sx) / torch.cos(sy) + torch.cos(rot)
    tx, ty = shift_x.double(), shift_y.double()
    inverse = torch.stack(
        [
            torch.stack([d, -b, d * -tx - b * -ty], dim=-1),
            torch.stack([-c, a, -c * -tx + a * -ty], dim=-1),
        ],
        dim=-2,
    )  # (B, 2, 3)
    return inverse.float()


def warp(x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """float (B, C, H, W) sampled bilinearly where theta (B, 2, 3) sends each output pixel's
    centre (in pixels from the image's centre); zeros outside the image."""
    B, _, H, W = x.shape
    on = {"device": x.device, "dtype": theta.dtype}
    xs = torch.arange(W, **on) - (W - 1) / 2  # (W,) pixel centres from the centre
    ys = torch.arange(H, **on) - (H - 1) / 2  # (H,)
    base = torch.stack(torch.broadcast_tensors(xs[None, :], ys[:, None], torch.ones(1, 1, **on)))
    base = base.reshape(3, H * W)  # (3, H*W): x, y, 1 of every output pixel
    source = theta @ base  # (B, 2, H*W) in pixels from the centre
    scale = torch.tensor([W / 2, H / 2], **on)[None, :, None]
    grid = (source / scale).transpose(1, 2).reshape(B, H, W, 2)  # grid_sample's -1..1
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


def grayscale(x: torch.Tensor) -> torch.Tensor:
    """(B, 3, H, W) -> (B, 1, H, W) luma."""
    r, g, b = x.unbind(dim=-3)
    return (GRAY[0] * r + GRAY[1] * g + GRAY[2] * b).unsqueeze(-3)


def blend(x: torch.Tensor, other: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """factor * x + (1 - factor) * other, per image (factor (B,)); clamped to 0..255."""
    factor = per_image(factor)
    return (factor * x + (1 - factor) * other).clamp(0, 255)


def smoothed(x: torch.Tensor) -> torch.Tensor:
    """PIL's SMOOTH filter (3x3, centre 5, the rest 1, over 13) inside the image; the one-pixel
    border kept as it is (what sharpness blends away from)."""
    C = x.shape[-3]
    kernel = torch.ones(3, 3, device=x.device, dtype=x.dtype)
    kernel[1, 1] = 5
    kernel = (kernel / kernel.sum()).expand(C, 1, 3, 3)
    inner = F.conv2d(x, kernel, groups=C)  # (B, C, H - 2, W - 2)
    out = x.clone()
    out[..., 1:-1, 1:-1] = inner
    return out


def posterize(x: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """The integer part of each pixel with only its top `bits` (B,) bits."""
    step = per_image(torch.exp2(8 - bits))  # 2^(8 - bits)
    return torch.div(x.floor(), step, rounding_mode="floor") * step


def equalize(x: torch.Tensor) -> torch.Tensor:
    """Histogram equalisation of each channel of each image (PIL's ImageOps.equalize, as
    torchvision computes it), on the integer part of the pixels."""
    B, C, H, W = x.shape
    levels = x.floor().clamp(0, 255).long().reshape(B, C, H * W)  # (B, C, H*W)
    hist = torch.zeros(B, C, 256, device=x.device, dtype=x.dtype)
    hist.scatter_add_(-1, levels, torch.ones_like(levels, dtype=x.dtype))  # (B, C, 256)
    # the count of the highest level present is left out of the step (PIL's rule)
    top = levels.amax(dim=-1, keepdim=True)  # (B, C, 1)
    step = torch.div(H * W - hist.gather(-1, top), 255, rounding_mode="floor")  # (B, C, 1)
    safe = step.clamp(min=1)
    lut = torch.div(
        hist.cumsum(-1) + torch.div(safe, 2, rounding_mode="floor"), safe, rounding_mode="floor"
    )
    lut = F.pad(lut, (1, 0))[..., :-1].clamp(0, 255)  # (B, C, 256): level -> new level
    equalized = lut.gather(-1, levels).reshape(B, C, H, W)
    # a channel of (nearly) one level is left as it is
    return torch.where(
        (step == 0).reshape(B, C, 1, 1), levels.reshape(B, C, H, W).to(x.dtype), equalized
    )


def autocontrast(x: torch.Tensor) -> torch.Tensor:
    """Each channel of each image stretched to span 0..255 (a flat channel kept)."""
    low = x.amin(dim=(-2, -1), keepdim=True)  # (B, C, 1, 1)
    high = x.amax(dim=(-2, -1), keepdim=True)
    flat = high == low
    scale = torch.where(flat, torch.ones_like(high), 255 / (high - low).clamp(min=math.ulp(1.0)))
    low = torch.where(flat, torch.zeros_like(low), low)
    return ((x - low) * scale).clamp(0, 255)
