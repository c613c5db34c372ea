"""Crop parameters shared by every backend: RandomResizedCrop (torchvision's algorithm)
and the validation center crop, computed in numpy for a whole batch at once.

Random numbers are a counter-based hash of ``(seed, epoch, sample position)``, so a
sample's crop and flip do not depend on the backend, the rank, the batch size or on
where a resumed run started: DALI decodes exactly the region the pillow backend does.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np

from stoker.errors import ArgumentError

from ..fits import JITTER, TRAIN_FITS, VAL_FITS  # named where no torch is imported

SCALE = (0.08, 1.0)
RATIO = (3.0 / 4.0, 4.0 / 3.0)
ATTEMPTS = 10  # torchvision's RandomResizedCrop tries 10 times, then falls back to a center crop
VAL_CROP_FRACTION = 0.875  # val: resize shorter side to crop / 0.875, center crop

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer (uint64 arithmetic wraps, which is the point)."""
    z = z + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


#: the largest crop side the Loader takes: past it is a mistake (a batch of 256 at 4096 is 12 GiB)
MAX_CROP = 4096


@dataclass(frozen=True)
class CropSpec:
    """A Loader's crop recipe, validated: the output ``size`` ``(height, width)``, the train crop's
    area ``scale`` and aspect ``ratio`` ranges (torchvision's ``RandomResizedCrop``), and the
    val center crop's ``crop_pct`` (timm's name) or ``val_resize`` (the shorter side before the
    crop, torchvision's ``Resize``)."""

    size: tuple[int, int]
    scale: tuple[float, float] = SCALE
    ratio: tuple[float, float] = RATIO
    crop_pct: float = VAL_CROP_FRACTION
    val_resize: float | None = None
    val_fit: str = "auto"
    train_fit: str = "rrc"
    jitter: tuple[float, float] = JITTER

    @property
    def places_train(self) -> bool:
        """The train crops land on a part of the output (scale jitter's padding), not all of it."""
        return self.train_fit == "scale-jitter"

    def letterbox(self, kind_fit: str = "center") -> bool:
        """The val transform keeps the whole image (resize keeping the aspect ratio, then pad);
        ``kind_fit``: the split's kind's own (what ``auto`` means)."""
        return (kind_fit if self.val_fit == "auto" else self.val_fit) == "letterbox"

    @classmethod
    def of(
        cls,
        crop,
        *,
        scale=SCALE,
        ratio=RATIO,
        crop_pct: float | None = None,
        val_resize: float | None = None,
        val_fit: str = "auto",
        train_fit: str = "rrc",
        jitter=JITTER,
    ) -> CropSpec:
        """Validate the Loader's arguments (``crop`` an int or ``(height, width)``); a bad one is a
        ValueError naming it."""
        size = (crop, crop) if isinstance(crop, int) and not isinstance(crop, bool) else crop
        if (
            not isinstance(size, (tuple, list))
            or len(size) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in size)
        ):
            raise ArgumentError(f"crop={crop!r} must be a positive integer or (height, width)")
        if max(size) > MAX_CROP:
            raise ArgumentError(f"crop={crop!r} is larger than any sensible training input (at most {MAX_CROP})")
        scale, ratio = _pair(scale, "scale"), _pair(ratio, "ratio")
        if not 0 < scale[0] <= scale[1] <= 1:
            raise ArgumentError(f"scale={scale!r} must satisfy 0 < low <= high <= 1 (a share of the image's area)")
        if not 0 < ratio[0] <= ratio[1]:
            raise ArgumentError(f"ratio={ratio!r} must satisfy 0 < low <= high (width / height)")
        if crop_pct is not None and val_resize is not None:
            raise ArgumentError("give crop_pct= or val_resize=, not both (both set the val resize)")
        if crop_pct is not None and not 0 < crop_pct <= 1:
            raise ArgumentError(f"crop_pct={crop_pct!r} must be in (0, 1] (the crop's share of the resized short side)")
        if val_resize is not None and not val_resize >= min(size):
            raise ArgumentError(f"val_resize={val_resize!r} must be at least the crop's shorter side ({min(size)})")
        if val_fit not in VAL_FITS:
            raise ArgumentError(f"val_fit={val_fit!r} must be one of {', '.join(VAL_FITS)}")
        if train_fit not in TRAIN_FITS:
            raise ArgumentError(f"train_fit={train_fit!r} must be one of {', '.join(TRAIN_FITS)}")
        jitter = _pair(jitter, "jitter")
        if not 0 < jitter[0] <= jitter[1]:
            raise ArgumentError(f"jitter={jitter!r} must satisfy 0 < low <= high (a factor on the fitted size)")
        pct = VAL_CROP_FRACTION if crop_pct is None else float(crop_pct)
        return cls(tuple(size), scale, ratio, pct, val_resize, val_fit, train_fit, jitter)


def _pair(value, name: str) -> tuple[float, float]:
    try:
        lo, hi = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ArgumentError(f"{name}={value!r} must be a (low, high) pair of numbers") from None
    return lo, hi


def uniforms(ids: np.ndarray, n: int, *, seed: int, epoch: int) -> np.ndarray:
    """``[len(ids), n]`` floats in ``[0, 1)``, a pure function of ``(seed, epoch, id, column)``."""
    with np.errstate(over="ignore"):
        key = _mix(np.array([(int(seed) & (2**64 - 1))], np.uint64))
        key = _mix(key ^ np.uint64(int(epoch) & (2**64 - 1)))
        ctr = np.asarray(ids, np.uint64)[:, None] * np.uint64(n) + np.arange(n, dtype=np.uint64)[None, :]
        z = _mix(ctr ^ key)
    return (z >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def random_resized_crop(
    wh: np.ndarray,
    ids: np.ndarray,
    *,
    seed: int,
    epoch: int,
    scale: tuple[float, float] = SCALE,
    ratio: tuple[float, float] = RATIO,
) -> tuple[np.ndarray, np.ndarray]:
    """Crop boxes and flips for a batch, with torchvision ``RandomResizedCrop.get_params``
    semantics (10 attempts, then the fallback center crop).

    Args:
        wh: ``[B, 2]`` stored image ``(width, height)``.
        ids: ``[B]`` global sample positions (the random stream of each sample).

    Returns:
        ``boxes`` ``[B, 4]`` int64 ``(x, y, w, h)`` in stored pixels and ``flip`` ``[B]`` bool.
    """
    wh = np.asarray(wh, np.int64).reshape(-1, 2)
    W = wh[:, 0:1].astype(np.float64)
    H = wh[:, 1:2].astype(np.float64)
    u = uniforms(ids, 4 * ATTEMPTS + 1, seed=seed, epoch=epoch)
    ua, ur, ui, uj = (u[:, k * ATTEMPTS : (k + 1) * ATTEMPTS] for k in range(4))
    area = W * H * (scale[0] + ua * (scale[1] - scale[0]))
    lo, hi = math.log(ratio[0]), math.log(ratio[1])
    aspect = np.exp(lo + ur * (hi - lo))
    w = np.rint(np.sqrt(area * aspect))  # rint: round-half-even, as Python's round()
    h = np.rint(np.sqrt(area / aspect))
    ok = (w > 0) & (w <= W) & (h > 0) & (h <= H)
    first = ok.argmax(axis=1)
    rows = np.arange(len(wh))
    found = ok[rows, first]
    bw, bh = w[rows, first], h[rows, first]
    by = np.floor(ui[rows, first] * (H[:, 0] - bh + 1))
    bx = np.floor(uj[rows, first] * (W[:, 0] - bw + 1))
    # fallback: central crop clamped to the ratio range
    Wf, Hf = W[:, 0], H[:, 0]
    in_ratio = Wf / np.maximum(Hf, 1)
    fw = np.where(in_ratio < ratio[0], Wf, np.where(in_ratio > ratio[1], np.rint(Hf * ratio[1]), Wf))
    fh = np.where(in_ratio < ratio[0], np.rint(Wf / ratio[0]), Hf)
    fx, fy = np.floor((Wf - fw) / 2), np.floor((Hf - fh) / 2)
    boxes = np.stack(
        [np.where(found, bx, fx), np.where(found, by, fy), np.where(found, bw, fw), np.where(found, bh, fh)], axis=1
    ).astype(np.int64)
    flip = u[:, -1] < 0.5
    return boxes, flip


def center_crop(
    wh: np.ndarray, crop, fraction: float = VAL_CROP_FRACTION, *, resize: float | None = None
) -> np.ndarray:
    """The source region that "resize the shorter side to ``resize``, center crop ``crop``"
    keeps, as ``[B, 4]`` int64 ``(x, y, w, h)``: decoding only it and resizing it to ``crop``
    gives the same picture with less work.

    Args:
        wh: ``[B, 2]`` stored ``(width, height)``.
        crop: the output side, or ``(height, width)``.
        fraction: the crop fraction (timm's ``crop_pct``): with ``resize=None`` the shorter side
            goes to ``min(crop) / fraction`` (0.875: 224 from 256).
        resize: the shorter side before the crop (torchvision's ``Resize(resize)``), instead.

    A region larger than the image (a crop wider than the resized image is tall) is clamped to
    the image; the resize then stretches it to ``crop``.
    """
    ch, cw = (crop, crop) if np.isscalar(crop) else (int(crop[0]), int(crop[1]))
    wh = np.asarray(wh, np.int64).reshape(-1, 2)
    short = wh.min(axis=1).astype(np.float64)
    if resize is None:  # the shorter output side spans `fraction` of the shorter stored side
        fh, fw = fraction * ch / min(ch, cw), fraction * cw / min(ch, cw)
    else:
        fh, fw = ch / resize, cw / resize
    h = np.minimum(wh[:, 1], np.maximum(1, np.rint(short * fh)).astype(np.int64))
    w = np.minimum(wh[:, 0], np.maximum(1, np.rint(short * fw)).astype(np.int64))
    x = (wh[:, 0] - w) // 2
    y = (wh[:, 1] - h) // 2
    return np.stack([x, y, w, h], axis=1)


_JITTER_STREAM = int.from_bytes(hashlib.blake2b(b"scale-jitter", digest_size=8).digest(), "little")


def scale_jitter(
    wh: np.ndarray, ids: np.ndarray, crop, *, seed: int, epoch: int, jitter: tuple[float, float] = JITTER
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Large-scale jitter (torchvision's ``ScaleJitter`` then ``FixedSizeCrop``) for a batch: each
    image scaled by ``min(out_h / h, out_w / w) * U(jitter)``, then a random window of the output's
    size (where the scaled image is larger) placed at the output's top-left (the rest padding),
    a pure function of ``(seed, epoch, sample)``.

    Returns:
        ``(boxes, flips, places)``: the window in stored pixels ``[B, 4]`` ``(x, y, w, h)``,
        horizontal flips ``[B]``, and where the window lands in the output ``[B, 4]``.
    """
    ch, cw = (crop, crop) if np.isscalar(crop) else (int(crop[0]), int(crop[1]))
    wh = np.asarray(wh, np.float64).reshape(-1, 2)
    u = uniforms(ids, 4, seed=(int(seed) ^ _JITTER_STREAM) & (2**64 - 1), epoch=epoch)
    s = np.minimum(ch / wh[:, 1], cw / wh[:, 0]) * (jitter[0] + u[:, 0] * (jitter[1] - jitter[0]))
    sw, sh = np.maximum(1, np.rint(wh[:, 0] * s)), np.maximum(1, np.rint(wh[:, 1] * s))
    pw, ph = np.minimum(sw, cw), np.minimum(sh, ch)  # the part of the output the image covers
    ox, oy = np.floor(u[:, 1] * (sw - pw + 1)), np.floor(u[:, 2] * (sh - ph + 1))  # in scaled pixels
    fx, fy = wh[:, 0] / sw, wh[:, 1] / sh  # stored pixels a scaled pixel
    x, y = np.floor(ox * fx), np.floor(oy * fy)
    w = np.clip(np.rint(pw * fx), 1, wh[:, 0] - x)
    h = np.clip(np.rint(ph * fy), 1, wh[:, 1] - y)
    boxes = np.stack([x, y, w, h], axis=1).astype(np.int64)
    places = np.stack([np.zeros_like(pw), np.zeros_like(ph), pw, ph], axis=1).astype(np.int64)
    return boxes, u[:, 3] < 0.5, places


def whole_image(wh: np.ndarray) -> np.ndarray:
    """``[B, 4]`` int64 ``(0, 0, w, h)``: the crop box of a transform that keeps the whole image."""
    wh = np.asarray(wh, np.int64).reshape(-1, 2)
    return np.concatenate([np.zeros_like(wh), wh], axis=1)


def letterbox_places(wh: np.ndarray, crop) -> np.ndarray:
    """Where the letterbox puts each whole image in the ``crop`` output: ``[B, 4]`` int64 ``(0, 0,
    w, h)``, the image resized by one factor (the largest that fits) into the top-left corner (the
    rest is padding: a box scales by one factor and needs no shift back to the original pixels)."""
    ch, cw = (crop, crop) if np.isscalar(crop) else (int(crop[0]), int(crop[1]))
    wh = np.asarray(wh, np.float64).reshape(-1, 2)
    s = np.minimum(cw / wh[:, 0], ch / wh[:, 1])
    w = np.clip(np.rint(wh[:, 0] * s), 1, cw).astype(np.int64)
    h = np.clip(np.rint(wh[:, 1] * s), 1, ch).astype(np.int64)
    return np.stack([np.zeros_like(w), np.zeros_like(h), w, h], axis=1)


def full_places(n: int, crop) -> np.ndarray:
    """``[n, 4]`` ``(0, 0, width, height)`` of ``crop``: every crop box resized onto the whole output."""
    ch, cw = (crop, crop) if np.isscalar(crop) else (int(crop[0]), int(crop[1]))
    return np.tile(np.array([[0, 0, cw, ch]], np.int64), (n, 1))


def crop_mask(mask: np.ndarray, box, flip: bool, out: np.ndarray) -> None:
    """Crop ``box`` (``(x, y, w, h)``) out of ``mask`` (``[H, W]`` uint8 class indices), resize it to
    ``out``'s shape with nearest neighbour, flip it where ``flip``, and write it into ``out``.

    Output pixel ``(i, j)`` takes the source pixel under its centre, ``(y + floor((i + 0.5) h /
    out_h), x + floor((j + 0.5) w / out_w))``: pillow's ``resize(NEAREST, box=...)`` rule, and the
    same centres the image's bilinear resize samples around, so mask and image stay aligned.
    Every backend crops masks with this one function: the mask is exactly the same everywhere.
    """
    oh, ow = out.shape
    x, y, w, h = (int(v) for v in box)
    rows = np.minimum(y + ((np.arange(oh) + 0.5) * (h / oh)).astype(np.int64), mask.shape[0] - 1)
    cols = np.minimum(x + ((np.arange(ow) + 0.5) * (w / ow)).astype(np.int64), mask.shape[1] - 1)
    if flip:
        cols = cols[::-1]
    out[...] = mask[rows[:, None], cols[None, :]]


__all__ = [
    "MAX_CROP",
    "RATIO",
    "SCALE",
    "VAL_CROP_FRACTION",
    "JITTER",
    "TRAIN_FITS",
    "VAL_FITS",
    "CropSpec",
    "center_crop",
    "crop_mask",
    "full_places",
    "letterbox_places",
    "whole_image",
    "random_resized_crop",
    "scale_jitter",
    "uniforms",
]
