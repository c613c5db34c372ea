"""The val letterbox on every backend: the runner decodes the whole image resized to the output
(:func:`.base.crop_boxes` gives it the whole image as its crop box), and this wrapper fits each
image back to its aspect ratio into the output's top-left corner (:func:`~..augment.letterbox_places`),
zeros around it. One code path for dali, pil, nvjpeg and the pixel tier; targets that follow the
crop are placed by the same places (:func:`.base.targets_of`), a mask is fitted with its image
(nearest, the padding ``ignore_index``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from .. import augment
from .base import Batch, DecodeSettings, Runner, letterbox


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


def letterbox_batch(settings: DecodeSettings, batch: Batch) -> Batch:
    """``batch`` (its images the whole images stretched to the output) letterboxed."""
    if not len(batch.images):
        return batch
    _, wh = settings.index.images(np.asarray(batch.ids))
    places = augment.letterbox_places(wh, settings.crop)
    images = fit_images(batch.images, places)
    targets = batch.targets
    if settings.masks:
        fill = settings.index.target.ignore_index or 0
        targets = fit_images(targets, places, fill=float(fill), mode="nearest")
    return batch._replace(images=images, targets=targets)


class LetterboxRunner:
    """A runner whose val batches are letterboxed (:func:`letterbox_batch`)."""

    def __init__(self, inner: Runner, settings: DecodeSettings):
        self.inner, self.settings = inner, settings

    def iterate(self, batches: Sequence[np.ndarray], epoch: int, seed: int) -> Iterator[Batch]:
        it = self.inner.iterate(batches, epoch, seed)
        try:
            for batch in it:
                yield letterbox_batch(self.settings, batch)
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
    """``runner`` wrapped when its settings ask for the val letterbox, else itself."""
    if not letterbox(settings):
        return runner
    return LetterboxRunner(runner, settings)


__all__ = ["LetterboxRunner", "fit_images", "letterbox_batch", "letterboxed"]
