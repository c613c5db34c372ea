"""Chaining batch transforms: :class:`BatchAugment`, and :func:`build_augment`, timm's
``create_transform`` training augmentation (policy -> ColorJitter -> RandomErasing) on batches."""

from __future__ import annotations

from collections.abc import Sequence

from stoker.errors import ArgumentError

from .base import BatchTransform, _prob
from .erasing import IMAGENET_MEAN, IMAGENET_STD, RandomErasing
from .jitter import ColorJitter
from .params import Fill
from .timm_policies import parse_aa


class BatchAugment(BatchTransform):
    """The transforms in order, each sample with its own parameters: ``aug(images, ids, seed=, epoch=,
    masks=None) -> images`` (or ``(images, masks)``). No two may share a random stream."""

    def __init__(self, transforms: Sequence[BatchTransform] = ()):
        self.transforms = tuple(transforms)
        streams = [t.stream for t in self.transforms]
        dup = {s for s in streams if streams.count(s) > 1}
        if dup:
            raise ArgumentError(f"two transforms share the random stream {sorted(dup)[0]!r}: pass stream= to one")
        self.stream = "+".join(streams)

    def apply(self, images, ids, *, seed, epoch, masks):
        for t in self.transforms:
            images, masks = t.apply(images, ids, seed=seed, epoch=epoch, masks=masks)
        return images, masks

    def __repr__(self) -> str:
        return f"BatchAugment({', '.join(type(t).__name__ for t in self.transforms)})"


def build_augment(
    aa: str | None = None,
    *,
    reprob: float = 0.0,
    remode: str = "const",
    recount: int = 1,
    color_jitter: float | Sequence[float] | None = None,
    force_color_jitter: bool = False,
    fill: Fill = None,
    ignore_index: int = 255,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
) -> BatchAugment:
    """timm's ``create_transform`` training augmentation after the crop and flip, on batches.

    Args:
        aa: the policy (:func:`parse_aa`), or ``None``.
        reprob: RandomErasing's probability (0: none).
        remode: RandomErasing's mode: ``const``, ``rand`` or ``pixel``.
        recount: RandomErasing's maximum count of boxes.
        color_jitter: ``b`` for (b, b, b), or (brightness, contrast, saturation[, hue]); as in timm,
            applied only without ``aa`` unless ``force_color_jitter``.
        force_color_jitter: jitter colours after ``aa`` too.
        fill: the policy's geometric fill (``None``: its own default).
        ignore_index: the masks' fill.
        mean: RandomErasing's colour scale (timm erases after normalizing; 0..1 units).
        std: as ``mean``.

    Returns:
        The chain ``aa`` -> ColorJitter -> RandomErasing, each part present only when asked for.

    Example:
        >>> aug = build_augment("rand-m9-mstd0.5-inc1", reprob=0.25, remode="pixel")
        >>> images = aug(images, ids, seed=0, epoch=epoch)
    """
    out: list[BatchTransform] = [] if aa is None else [parse_aa(aa, fill=fill, ignore_index=ignore_index)]
    if color_jitter is not None and (aa is None or force_color_jitter):
        cj = (float(color_jitter),) * 3 if isinstance(color_jitter, (int, float)) else tuple(color_jitter)
        if len(cj) not in (3, 4):
            raise ArgumentError(f"color_jitter={color_jitter!r} must be a number or 3 or 4 numbers")
        if any(cj):
            out.append(ColorJitter(*cj))
    if _prob("reprob", reprob) > 0:
        out.append(RandomErasing(reprob, mode=remode, max_count=recount, mean=mean, std=std))
    return BatchAugment(out)


__all__ = ["BatchAugment", "build_augment"]
