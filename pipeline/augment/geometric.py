"""The geometric batch kernels: shear, translate and rotate, one parameter per sample.

Each resamples with nearest interpolation through one gather per batch (:func:`affine`, the
inverse matrices of :func:`inverse_affine` / :func:`geometric_matrices`, computed as torchvision
computes them) and moves optional ``masks`` ``[N, H, W]`` with the same per-sample transform,
filling what comes from outside the image with ``ignore_index``; they return ``(images, masks)``
then, ``images`` alone otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from .params import _KID, Fill, Moved, PerSample, _fill_values, _param, _per_sample, check_batch


def inverse_affine(cx, cy, angle, tx, ty, shear_x, shear_y) -> np.ndarray:
    """torchvision's ``_get_inverse_affine_matrix`` (scale 1) for arrays of parameters: ``[n, 2, 3]``
    float64 mapping output pixels to source pixels, both relative to the image centre."""
    rot, sx, sy = np.radians(angle), np.radians(shear_x), np.radians(shear_y)
    cos_sy, tan_sx = np.cos(sy), np.tan(sx)
    a = np.cos(rot - sy) / cos_sy
    b = -(a * tan_sx + np.sin(rot))
    c = np.sin(rot - sy) / cos_sy
    d = np.cos(rot) - c * tan_sx
    m = np.stack([d, -b, np.zeros_like(a), -c, a, np.zeros_like(a)], axis=-1)
    m[:, 2] += cx - m[:, 0] * (cx + tx) - m[:, 1] * (cy + ty)
    m[:, 5] += cy - m[:, 3] * (cx + tx) - m[:, 4] * (cy + ty)
    return m.reshape(-1, 2, 3)


def geometric_matrices(kernel: Sequence[str], arg: PerSample, height: int, width: int) -> np.ndarray:
    """The inverse matrices torchvision's AutoAugment family builds for each (kernel, argument):
    ``shear_*`` is ``F.affine(shear=degrees(atan(m)), center=[0, 0])`` (PIL's ``(1, m, 0, 0, 1, 0)``),
    ``translate_*`` ``F.affine(translate=px)``, ``rotate`` ``F.rotate(angle)`` (counter-clockwise)."""
    kind = np.asarray([_KID[k] for k in kernel], np.int64)
    arg = _param(arg, len(kind), "geometric argument")
    z = np.zeros(len(kind))
    sheared = (kind == _KID["shear_x"]) | (kind == _KID["shear_y"])
    return inverse_affine(
        np.where(sheared, -0.5 * width, z),
        np.where(sheared, -0.5 * height, z),
        np.where(kind == _KID["rotate"], -np.remainder(arg, 360.0), z),
        np.where(kind == _KID["translate_x"], arg, z),
        np.where(kind == _KID["translate_y"], arg, z),
        np.where(kind == _KID["shear_x"], np.degrees(np.arctan(arg)), z),
        np.where(kind == _KID["shear_y"], np.degrees(np.arctan(arg)), z),
    )


def affine(
    images: torch.Tensor,
    matrices: np.ndarray,
    *,
    fill: Fill = None,
    masks: torch.Tensor | None = None,
    ignore_index: int = 255,
) -> Moved:
    """Resample each image through its own inverse matrix, nearest interpolation, as torchvision's
    ``_affine_grid`` + ``grid_sample`` do.

    The sampling grid is computed the way torchvision computes it (float32: the matrix divided by
    half the size, then the pixel centres, then grid_sample's unnormalization on CPU) so the pixels
    picked are torchvision's except where a coordinate lands within float32 rounding of a .5 tie.

    Args:
        images: uint8 ``[N, C, H, W]``.
        matrices: ``[N, 2, 3]`` float64, :func:`inverse_affine`'s convention.
        fill: colour of what comes from outside the image: ``None`` (0), one value or one per channel.
        masks: optional uint8 ``[N, H, W]``, moved with the images.
        ignore_index: the masks' fill.

    Returns:
        The images, or ``(images, masks)`` when masks are given.
    """
    check_batch(images, masks=masks)
    n, ch, h, w = images.shape
    fills = _fill_values(fill, ch)
    if n == 0:
        return images.clone() if masks is None else (images.clone(), masks.clone())
    dev = images.device
    m = torch.as_tensor(np.asarray(matrices, np.float64).reshape(n, 6), dtype=torch.float32).to(dev)
    half = torch.tensor([0.5 * w] * 3 + [0.5 * h] * 3, dtype=torch.float32, device=dev)
    r = (m / half).view(n, 6, 1, 1)
    xs = (torch.arange(w, device=dev, dtype=torch.float32) - (w - 1) * 0.5).view(1, 1, w)
    ys = (torch.arange(h, device=dev, dtype=torch.float32) - (h - 1) * 0.5).view(1, h, 1)
    # The source image sits in a one-pixel frame of fill: every coordinate outside the image is
    # clamped onto the frame, so one gather both samples and fills (in-place ops: CPU speed).
    ix = _source_coord(xs * r[:, 0], ys * r[:, 1], r[:, 2], w)
    iy = _source_coord(xs * r[:, 3], ys * r[:, 4], r[:, 5], h)
    if (h + 2) * (w + 2) < 2**24:  # float32 holds the flat index exactly
        flat = iy.mul_(w + 2).add_(ix).to(torch.int64)
    else:
        flat = iy.to(torch.int64).mul_(w + 2).add_(ix.to(torch.int64))
    flat = flat.view(n, 1, h * w)
    fill_t = torch.tensor([round(v) for v in fills], dtype=torch.uint8, device=dev).view(1, ch, 1, 1)
    out = _framed(images, fill_t).gather(2, flat.expand(n, ch, h * w)).view(n, ch, h, w)
    if masks is None:
        return out
    frame = torch.full((1, 1, 1, 1), ignore_index, dtype=torch.uint8, device=dev)
    return out, _framed(masks.unsqueeze(1), frame).gather(2, flat).view(n, h, w)


def _source_coord(along: torch.Tensor, across: torch.Tensor, const: torch.Tensor, size: int) -> torch.Tensor:
    """Nearest source pixel + 1 (the frame's offset) for every output pixel, clamped to the frame:
    torchvision's ``(x * m0 + y * m1) + m2``, then grid_sample's CPU unnormalization and rounding."""
    g = torch.add(along, across).add_(const)
    return g.add_(1.0).mul_(size * 0.5).sub_(0.5).round_().clamp_(-1, size).add_(1.0)


def _framed(x: torch.Tensor, frame: torch.Tensor) -> torch.Tensor:
    """``x`` ``[n, c, h, w]`` inside a one-pixel frame of ``frame``, flattened to ``[n, c, (h+2)(w+2)]``."""
    n, c, h, w = x.shape
    out = frame.expand(n, c, h + 2, w + 2).clone()
    out[:, :, 1:-1, 1:-1] = x
    return out.view(n, c, (h + 2) * (w + 2))


def _geometric(name: str, images, value, fill, masks, ignore_index):
    n, _, h, w = images.shape
    mats = geometric_matrices([name] * n, _per_sample(images, value, name), h, w)
    return affine(images, mats, fill=fill, masks=masks, ignore_index=ignore_index)


def shear_x(
    images: torch.Tensor,
    factor: PerSample,
    *,
    fill: Fill = None,
    masks: torch.Tensor | None = None,
    ignore_index: int = 255,
) -> Moved:
    """Shear along x by ``factor`` per sample (source x = x + factor * y, y from the top row)."""
    return _geometric("shear_x", images, factor, fill, masks, ignore_index)


def shear_y(
    images: torch.Tensor,
    factor: PerSample,
    *,
    fill: Fill = None,
    masks: torch.Tensor | None = None,
    ignore_index: int = 255,
) -> Moved:
    """Shear along y by ``factor`` per sample (source y = y + factor * x, x from the left column)."""
    return _geometric("shear_y", images, factor, fill, masks, ignore_index)


def translate_x(
    images: torch.Tensor,
    pixels: PerSample,
    *,
    fill: Fill = None,
    masks: torch.Tensor | None = None,
    ignore_index: int = 255,
) -> Moved:
    """Move the content right by ``pixels`` per sample (a fraction picks the nearest source pixel)."""
    return _geometric("translate_x", images, pixels, fill, masks, ignore_index)


def translate_y(
    images: torch.Tensor,
    pixels: PerSample,
    *,
    fill: Fill = None,
    masks: torch.Tensor | None = None,
    ignore_index: int = 255,
) -> Moved:
    """Move the content down by ``pixels`` per sample."""
    return _geometric("translate_y", images, pixels, fill, masks, ignore_index)


def rotate(
    images: torch.Tensor,
    degrees: PerSample,
    *,
    fill: Fill = None,
    masks: torch.Tensor | None = None,
    ignore_index: int = 255,
) -> Moved:
    """Rotate counter-clockwise by ``degrees`` per sample about the image centre, keeping the size."""
    return _geometric("rotate", images, degrees, fill, masks, ignore_index)


__all__ = [
    "affine",
    "geometric_matrices",
    "inverse_affine",
    "rotate",
    "shear_x",
    "shear_y",
    "translate_x",
    "translate_y",
]
