"""Crops that land on a part of the output, on every backend: the val letterbox and the train
scale jitter. The runner resizes each crop box onto the whole output (:func:`.base.crop_boxes`:
the whole image for the letterbox, the jitter's window), and this wrapper fits each image back
into its place (:func:`.base.places_of`: the output's top-left corner, its aspect ratio kept),
zeros around it. One code path for dali, pil, nvjpeg and the pixel tier; targets that follow the
crop are placed by the same places (:func:`.base.targets_of`), a mask is fitted with its image
(nearest, the padding ``ignore_index``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from .base import Batch, DecodeSettings, Runner, placed, places_of


def fit_images(images, places: np.ndarray, *, fill: float = 0.0, mode: str = "bilinear"):
    """``images`` (``[N, C, H, W]`` uint8, or ``[N, H, W]`` masks with ``mode="nearest"``) each
    resized onto its place ``(x, y, w, h)`` of a canvas of ``fill`` of the same shape: pillow on
    the CPU (antialiased bilinear, as the pil backend resizes), torch on a GPU."""
    import torch

    out = torch.full_like(images, fill)
    if images.device.type == "cpu":
        _fit_cpu(images, out, places, mode)
        return out
    import torch.nn.functional as F

    spatial = images if images.ndim == 4 else images[:, None]
    target = out if out.ndim == 4 else out[:, None]
    sizes = [tuple(int(v) for v in p) for p in places]
    for x, y, w, h in set(sizes):  # one interpolation per distinct place
        rows = torch.as_tensor([k for k, p in enumerate(sizes) if p == (x, y, w, h)], device=images.device)
        src = spatial.index_select(0, rows).float()
        if mode == "nearest":
            fitted = F.interpolate(src, size=(h, w), mode="nearest-exact")
        else:
            fitted = F.interpolate(src, size=(h, w), mode=mode, antialias=True, align_corners=False)
        target[rows, :, y : y + h, x : x + w] = fitted.round_().clamp_(0, 255).to(images.dtype)
    return out


def _fit_cpu(images, out, places: np.ndarray, mode: str) -> None:
    """:func:`fit_images` on the CPU, a picture at a time with pillow (no torch op per sample)."""
    from PIL import Image

    resample = Image.NEAREST if mode == "nearest" else Image.BILINEAR
    src = images.numpy() if images.ndim == 3 else images.permute(0, 2, 3, 1).numpy()  # HWC views
    dst = out.numpy() if out.ndim == 3 else out.permute(0, 2, 3, 1).numpy()
    for k, (x, y, w, h) in enumerate(np.asarray(places, np.int64).tolist()):
        a = src[k]
        one = a.ndim == 3 and a.shape[2] == 1
        im = Image.fromarray(np.ascontiguousarray(a[..., 0] if one else a))
        fitted = np.asarray(im.resize((w, h), resample))
        dst[k, y : y + h, x : x + w] = fitted[..., None] if one else fitted


def letterbox_batch(settings: DecodeSettings, batch: Batch, *, epoch: int = 0, seed: int = 0) -> Batch:
    """``batch`` (each crop box resized onto the whole output) with each image fitted into its place."""
    if not len(batch.images):
        return batch
    ids = np.asarray(batch.ids)
    _, wh = settings.index.images(ids)
    places = places_of(settings, wh, ids, epoch=epoch, seed=seed)
    images = fit_images(batch.images, places)
    targets = batch.targets
    if settings.masks:
        fill = settings.index.target.ignore_index or 0
        targets = fit_images(targets, places, fill=float(fill), mode="nearest")
    return batch._replace(images=images, targets=targets)


class LetterboxRunner:
    """A runner whose batches are fitted into their places (:func:`letterbox_batch`)."""

    def __init__(self, inner: Runner, settings: DecodeSettings):
        self.inner, self.settings = inner, settings

    def iterate(self, batches: Sequence[np.ndarray], epoch: int, seed: int) -> Iterator[Batch]:
        it = self.inner.iterate(batches, epoch, seed)
        try:
            for batch in it:
                yield letterbox_batch(self.settings, batch, epoch=epoch, seed=seed)
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()

    @property
    def set_crops(self) -> Any:
        """The inner runner's ``set_crops`` (None when it has none: the stage makes a new runner)."""
        import dataclasses

        inner = getattr(self.inner, "set_crops", None)
        if inner is None:
            return None

        def set_crops(crops: Any) -> None:
            inner(crops)
            self.settings = dataclasses.replace(self.settings, crops=crops)

        return set_crops

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def letterboxed(runner: Runner, settings: DecodeSettings) -> Runner:
    """``runner`` wrapped when its crops land on a part of the output, else itself."""
    if not placed(settings):
        return runner
    return LetterboxRunner(runner, settings)


__all__ = ["LetterboxRunner", "fit_images", "letterbox_batch", "letterboxed"]
