"""The ``mask`` kind: a one-channel PNG of class indices a sample (``mask.png``), cropped and flipped
with its image; its check and its statistics."""

from __future__ import annotations

import io

import numpy as np

from stoker.errors import ArgumentError, arg, one_line

from ..stats import IGNORE_INDEX, StatsAccumulator, TargetStats
from .base import (
    Target,
)


def check_mask(target: Target, raw: bytes, image_wh: tuple[int, int] | None) -> str | None:
    """Why ``raw`` is not a mask of ``target`` (a one-channel PNG of the image's size, each value a
    declared class or the ignored one), or None."""
    from PIL import Image

    from ...imagedecode import DAMAGED_INPUT

    if raw[:8] != b"\x89PNG\r\n\x1a\n":
        return "mask is not a PNG"
    try:
        with Image.open(io.BytesIO(raw)) as im:
            im.load()
            if im.mode not in ("L", "P"):
                return f"mask mode {im.mode}, not L (one class index per pixel)"
            if image_wh is not None and im.size != tuple(image_wh):
                return f"mask is {im.size[0]}x{im.size[1]}, its image {image_wh[0]}x{image_wh[1]}"
            values = np.asarray(im)
    except DAMAGED_INPUT as e:  # a damaged mask is a finding; a bug raises
        return f"mask does not decode: {one_line(e)}"
    if target.num_classes:
        bad = (values >= target.num_classes) & (values != target.ignore_index)
        if bad.any():
            return f"mask value {int(values[bad][0])} is not below the split's {target.num_classes} classes"
    return None


class MaskStats(StatsAccumulator):
    """Each pixel value's share of the labelled pixels."""

    flavour = "mask"

    def __init__(self, kind: str = "mask", width: int = 0):
        super().__init__(kind, width)
        self.pixels = np.zeros(256, np.int64)

    def add(self, value) -> None:
        """One ``[H, W]`` uint8 mask."""
        self.pixels += np.bincount(np.asarray(value, np.uint8).reshape(-1), minlength=256)
        self.count += 1

    def add_counts(self, counts) -> None:
        """One mask by its pixel count per value (``((value, count), ...)``): what :meth:`add` of
        the mask itself adds, without the pixels."""
        for value, n in counts:
            self.pixels[int(value)] += int(n)
        self.count += 1

    def _merge_from(self, other: StatsAccumulator) -> None:
        self.pixels += other.pixels
        self.count += other.count

    def state(self) -> dict:
        return {**super().state(), "pixels": self.pixels.tolist()}

    def _load(self, d: dict) -> None:
        if "pixels" in d:
            self.pixels = np.asarray(d["pixels"], np.int64)

    def result(self, ignore_index: int | None = IGNORE_INDEX) -> TargetStats | None:
        if not self.count:
            return None
        pixels = self.pixels.copy()
        if ignore_index is not None and 0 <= ignore_index < 256:
            pixels[ignore_index] = 0
        found = np.flatnonzero(pixels)
        total = pixels.sum()
        share = pixels[: found[-1] + 1] / total if len(found) else np.zeros(0)
        return TargetStats(self.count, class_share=tuple(float(v) for v in share))


# ---- the built-in kinds ------------------------------------------------------------------------


class MaskKind(Target):
    """A class index a pixel (segmentation), stored as a one-channel PNG of the image's size."""

    name, member, task, spatial, dtype = "mask", "mask.png", "segment", True, "uint8"

    @classmethod
    def defaults(cls):
        return {"ignore_index": IGNORE_INDEX}

    @classmethod
    def from_flags(cls, *, member=None, num_classes=None, ignore_index=IGNORE_INDEX):
        kw = {"member": member} if member else {}
        return cls.of(cls.name, num_classes=num_classes, ignore_index=ignore_index, **kw), False

    def accumulator(self):
        return MaskStats("mask")

    def pack_value(self, item, res, classes):
        return res.mask, {"mask": item.mask}  # the sanitizer checked and wrote the mask beside its image

    def add_seen(self, acc, item, res, value):
        acc.add_counts(res.mask_counts)  # the sanitizer counted the mask's pixels

    def encode(self, value):
        return bytes(value)  # pack's sanitizer already wrote the PNG

    def decode(self, raws, *, classes, where, split):
        raise ArgumentError("a mask split's targets are images: they are read with their images (masks())")

    def check(self, raw, *, num_classes, image_wh=None, names=None):
        return check_mask(self, raw, image_wh)

    def index_value(self, raw, *, num_classes, names, width, image_wh):
        return check_mask(self, raw, image_wh) or _mask_values(raw)

    def describe(self):
        classes = f"{self.num_classes} classes" if self.num_classes else "classes not declared"
        return f"mask, {classes}, {self.ignore_index} ignored"

    def batch_shape(self, n, crop, num_classes):
        return (n, *crop)

    def describe_stats(self, stats):
        share = stats.class_share
        absent = [str(v) for v, p in enumerate(share) if p == 0]
        found = f"classes 0..{len(share) - 1} found" if share else "no labelled pixel found"
        if absent:
            found += f" ({', '.join(absent[:8])}{', ...' if len(absent) > 8 else ''} absent)"
        return self.describe(), found

    def outputs(self, classes, num_classes=None):
        n = num_classes or self.class_count(classes)
        if not n:
            raise ArgumentError(
                f"the masks' class count is not in the manifest: pass {arg('num_classes')} (pack with "
                f"{arg('num_classes', python='Masks.num_classes')})"
            )
        return n

    def class_count(self, classes):
        found = len(self.stats.class_share) if self.stats is not None and self.stats.class_share else 0
        return self.num_classes or found or len(classes)


def _mask_values(raw: bytes) -> np.ndarray:
    """A checked mask PNG's values (what its statistics count)."""
    from PIL import Image

    with Image.open(io.BytesIO(raw)) as im:
        return np.asarray(im)


__all__ = ["MaskKind", "MaskStats", "check_mask"]
