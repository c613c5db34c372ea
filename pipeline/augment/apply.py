"""A train Loader's augmentation and mixing, checked against its split and applied to its batches.

The Loader hands each decoded batch to :class:`TrainRecipe` on the batch's device: the per-sample
augmentation (each row's parameters from ``(seed, epoch, its sample position)``; masks move with
the geometric ops), then MixUp/CutMix (class targets become soft ``[N, classes]``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stoker.errors import ArgumentError


@dataclass(frozen=True)
class TrainRecipe:
    """``recipe(batch, seed=, epoch=) -> (images, targets)``: a runner's batch as the Loader hands
    it out. ``augment`` and ``mixing`` may be None (then the batch passes unchanged)."""

    augment: Any = None
    mixing: Any = None
    spatial: bool = False

    @classmethod
    def of(cls, augment: Any, mixing: Any, *, train: bool, target: Any, num_classes: int, path: Any) -> TrainRecipe:
        """The recipe of a Loader of ``path`` whose split holds ``target`` targets of
        ``num_classes`` classes; a policy name is parsed; a setting that cannot apply is a
        one-line ValueError."""
        if (augment is not None or mixing is not None) and not train:
            raise ArgumentError("augment= and mixing= are for train Loaders (val batches are not augmented)")
        if isinstance(augment, str):
            from .chain import build_augment

            augment = build_augment(
                augment, ignore_index=target.ignore_index if target.ignore_index is not None else 255
            )
        if augment is not None and not callable(augment):
            raise ArgumentError(f"augment={augment!r} must be a transform of stoker.pipeline.augment or a policy name")
        if augment is not None and target.follows_crop and moves_pixels(augment):
            raise ArgumentError(
                f"augment={augment!r} moves pixels (geometric ops); the {target.kind} targets of {path} follow "
                "the crop and flip only: use photometric ops (ColorJitter, or a policy without geometric ops)"
            )
        if mixing is not None:
            if target.task != "classify":
                raise ArgumentError(
                    f"mixing= (MixUp/CutMix) mixes class targets; the targets of {path} are {target.describe()}"
                )
            if getattr(mixing, "num_classes", num_classes) != num_classes:
                raise ArgumentError(f"mixing has num_classes={mixing.num_classes}, {path} has {num_classes}")
        return cls(augment, mixing, target.spatial)

    def __call__(self, batch: Any, *, seed: int, epoch: int) -> tuple:
        images, targets = batch.images, batch.targets
        if self.augment is not None and len(images):
            if self.spatial:  # the masks move with the geometric ops
                images, targets = self.augment(images, batch.ids, seed=seed, epoch=epoch, masks=targets)
            else:
                images = self.augment(images, batch.ids, seed=seed, epoch=epoch)
        if self.mixing is not None and len(images):
            images, targets = mix(self.mixing, images, targets, batch.ids, seed=seed, epoch=epoch)
        return images, targets


def moves_pixels(augment: Any, *, samples: int = 64, side: int = 16) -> bool:
    """Whether ``augment`` moved a probe mask (a distinct value a pixel) in ``samples`` draws: a
    transform with geometric ops, which targets that are no image cannot follow."""
    import torch

    masks = (torch.arange(side * side) % 251).to(torch.uint8).view(1, side, side).repeat(samples, 1, 1)
    images = torch.full((samples, 3, side, side), 128, dtype=torch.uint8)
    out = augment(images, torch.arange(samples), seed=0, epoch=0, masks=masks)
    return not torch.equal(out[1], masks)


def mix(mixing: Any, images, targets, ids, *, seed: int, epoch: int) -> tuple:
    """``mixing`` over the batch's first even number of rows (timm mixes pairs); an odd last row
    keeps its own image and gets its label smoothed as mixing smooths them."""
    import torch

    n = len(images) - len(images) % 2
    if n == len(images):
        return mixing(images, targets, ids, seed=seed, epoch=epoch)
    soft = torch.full(
        (len(images), mixing.num_classes), mixing.label_smoothing / mixing.num_classes, device=images.device
    )
    soft[-1, targets[-1]] += 1.0 - mixing.label_smoothing
    if n:
        head, soft[:n] = mixing(images[:n], targets[:n], ids[:n], seed=seed, epoch=epoch)
        images = torch.cat([head, images[n:]])
    return images, soft


__all__ = ["TrainRecipe", "mix", "moves_pixels"]
