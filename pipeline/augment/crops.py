"""Crop parameters shared by every backend: RandomResizedCrop (torchvision's algorithm)
and the validation center crop, computed in numpy for a whole batch at once.

Random numbers are a counter-based hash of ``(seed, epoch, sample position)``, so a
sample's crop and flip do not depend on the backend, the rank, the batch size or on
where a resumed run started: DALI decodes exactly the region the pillow backend does.
"""

from __future__ import annotations

import math

import numpy as np

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


def center_crop(wh: np.ndarray, crop: int, fraction: float = VAL_CROP_FRACTION) -> np.ndarray:
    """The source region that "resize shorter side to ``crop/fraction``, center crop
    ``crop``" keeps, as ``[B, 4]`` int64 ``(x, y, w, h)``: decoding only it and resizing it
    to ``crop`` gives the same picture with less work."""
    wh = np.asarray(wh, np.int64).reshape(-1, 2)
    short = wh.min(axis=1).astype(np.float64)
    side = np.maximum(1, np.rint(short * fraction)).astype(np.int64)
    x = (wh[:, 0] - side) // 2
    y = (wh[:, 1] - side) // 2
    return np.stack([x, y, side, side], axis=1)


__all__ = ["SCALE", "RATIO", "VAL_CROP_FRACTION", "uniforms", "random_resized_crop", "center_crop"]
