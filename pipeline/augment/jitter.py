"""torchvision's :class:`ColorJitter` on uint8 batches: each sample its own factors and op order."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from stoker.errors import ArgumentError

from .base import BatchTransform
from .ops import apply_ops


def _jitter_range(value, name: str, center: float = 1.0, bound=(0.0, math.inf), clip_zero: bool = True):
    """torchvision ``ColorJitter._check_input``: ``None`` (off), ``v`` or ``(lo, hi)`` -> ``(lo, hi)``."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value < 0:
            raise ArgumentError(f"ColorJitter {name}={value!r} must be >= 0")
        lo, hi = center - value, center + value
        lo = max(lo, 0.0) if clip_zero else lo
    elif isinstance(value, Sequence) and len(value) == 2:
        lo, hi = float(value[0]), float(value[1])
    else:
        raise ArgumentError(f"ColorJitter {name}={value!r} must be a number or (min, max)")
    if not bound[0] <= lo <= hi <= bound[1]:
        raise ArgumentError(f"ColorJitter {name}={value!r}: range ({lo}, {hi}) must be increasing within {bound}")
    return None if lo == hi == center else (lo, hi)


class ColorJitter(BatchTransform):
    """torchvision's ``ColorJitter``: per sample, brightness, contrast, saturation and hue factors
    drawn uniformly from their ranges, applied in a random order of the sample's own.

    Columns: 8: the four factors, then four keys whose argsort is the order.
    """

    _KERNELS = ("brightness", "contrast", "saturation", "hue")

    def __init__(self, brightness=None, contrast=None, saturation=None, hue=None, *, stream: str = "ColorJitter"):
        self.ranges = (
            _jitter_range(brightness, "brightness"),
            _jitter_range(contrast, "contrast"),
            _jitter_range(saturation, "saturation"),
            _jitter_range(hue, "hue", center=0.0, bound=(-0.5, 0.5), clip_zero=False),
        )
        self.stream = stream

    def plan(self, ids, *, seed: int, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """``(factors [N, 4], order [N, 4])``: brightness, contrast, saturation, hue, and the op order."""
        u = self._uniforms(ids, 8, seed, epoch)
        lo = np.asarray([r[0] if r else 0.0 for r in self.ranges])
        hi = np.asarray([r[1] if r else 0.0 for r in self.ranges])
        return lo + u[:, :4] * (hi - lo), np.argsort(u[:, 4:], axis=1, kind="stable")

    def apply(self, images, ids, *, seed, epoch, masks):
        factors, order = self.plan(ids, seed=seed, epoch=epoch)
        rows = np.arange(len(ids))
        for pos in range(4):
            op = order[:, pos]
            kernels = [self._KERNELS[k] if self.ranges[k] else None for k in op]
            images, _ = apply_ops(images, kernels, factors[rows, op])
        return images, masks


__all__ = ["ColorJitter"]
