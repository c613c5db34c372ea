"""The one interface the decode backends implement, what they are given, and the per-batch plan.

A backend is a *runner*: made once per :class:`~stoker.pipeline.loader.Loader` from its
:class:`DecodeSettings` (never the Loader itself), it turns batches of global sample positions
into decoded batches (:class:`Batch`), in order. The order, the batch boundaries, the epoch
bookkeeping and the shard cache are the Loader's; the crop boxes and flips are
:mod:`stoker.pipeline.augment`'s; every runner plans a batch the same way
(:func:`plan_batch`: header guard, stand-ins, crop boxes) and only reads bytes, decodes, crops
and resizes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import numpy as np

from .. import augment
from ..shards.samples import SampleIndex


@dataclass(frozen=True)
class DecodeSettings:
    """What a runner needs from its Loader, fixed for the Loader's life.

    Attributes:
        index: the split's samples (bytes, sizes, targets by global position).
        path: the split, for messages.
        device: where batches land (a ``torch.device``).
        batch_size: the largest batch (DALI sizes its pipeline by it).
        crop: output side in pixels.
        train: train augmentation (random crops and flips) or the val center crop.
        channels_last: images in ``torch.channels_last`` memory format (NCHW shape).
        threads: decode threads / worker processes.
        prefetch: batches prepared ahead.
        decode: ``"cpu"`` or ``"mixed"`` (GPU decode).
        cpu_resize: with CPU decode in DALI, ``"pillow"`` or ``"dali"``.
        hw_decoder_load: share of JPEGs for the hardware decoder (``decode="mixed"``).
        stand_in: for a train batch none of whose samples is loadable, the samples to decode
            instead (the Loader's rule: the next loadable ones of this rank's epoch order).
    """

    index: SampleIndex
    path: str
    device: Any
    batch_size: int
    crop: int
    train: bool
    channels_last: bool
    threads: int
    prefetch: int
    decode: str
    cpu_resize: str
    hw_decoder_load: float
    stand_in: Callable[[np.ndarray], np.ndarray] | None


class Batch(NamedTuple):
    """One decoded batch, as a runner yields it (the Loader hands users ``(images, labels)``).

    Attributes:
        images: uint8 ``[N, 3, crop, crop]`` on the Loader's device (``torch.channels_last``
            memory format when the Loader was asked for it).
        labels: int64 ``[N]`` on the same device.
        consumed: samples of the rank's epoch order this batch accounts for (its planned size,
            whatever was dropped): what the Loader's resume position advances by.
        skipped: of those, samples dropped (failed the header check or the decoder).
    """

    images: Any
    labels: Any
    consumed: int
    skipped: int


class Runner(Protocol):
    """What the Loader asks of a backend: ``Runner(settings)``, then per epoch
    :meth:`iterate`. A val batch with nothing loadable is yielded empty (``N == 0``) in its
    place; a train batch with nothing loadable is decoded from ``settings.stand_in``."""

    def iterate(self, batches: list, epoch: int, seed: int) -> Iterator[Batch]:
        """One :class:`Batch` per array of global sample positions in ``batches``, in order.
        Closing the iterator early stops any work running ahead."""
        ...

    def close(self) -> None:
        """Stop any iteration still running and let threads, processes and pipelines go."""
        ...


class Plan(NamedTuple):
    """A batch as planned before decoding (:func:`plan_batch`).

    Attributes:
        ids: global positions of the samples to decode (header-checked; stand-ins when none
            of the planned ones passed, for train).
        enc: their encoded image bytes (zero-copy views of the shard maps).
        wh: ``[len(ids), 2]`` stored ``(width, height)``.
        boxes: ``[len(ids), 4]`` crop boxes ``(x, y, w, h)`` in stored pixels.
        flips: ``[len(ids)]`` horizontal flips.
        consumed: samples of the epoch order this batch accounts for (its planned size).
        skipped: planned samples dropped by the header check.
    """

    ids: np.ndarray
    enc: list
    wh: np.ndarray
    boxes: np.ndarray
    flips: np.ndarray
    consumed: int
    skipped: int

    def keep(self, mask: np.ndarray) -> Plan:
        """This plan with only the samples where ``mask`` holds (the rest count as skipped)."""
        mask = np.asarray(mask, bool)
        return self._replace(
            ids=self.ids[mask],
            enc=[e for e, k in zip(self.enc, mask, strict=True) if k],
            wh=self.wh[mask],
            boxes=self.boxes[mask],
            flips=self.flips[mask],
            skipped=self.skipped + int((~mask).sum()),
        )


def crop_boxes(settings: DecodeSettings, wh: np.ndarray, ids: np.ndarray, *, epoch: int, seed: int) -> tuple:
    """``(boxes, flips)`` of ``ids``: random resized crops and flips for train (a pure function of
    ``(seed, epoch, sample)``), the center crop and no flip for val."""
    if settings.train:
        return augment.random_resized_crop(wh, ids, seed=seed, epoch=epoch)
    return augment.center_crop(wh, settings.crop), np.zeros(len(ids), bool)


def plan_batch(settings: DecodeSettings, ids: np.ndarray, *, epoch: int, seed: int, stand_ins: bool = True) -> Plan:
    """The plan of one batch: read the samples' bytes and sizes, drop those that fail the header
    guard (truncated or foreign bytes never reach a decoder), fill a train batch that lost every
    sample with stand-ins (``stand_ins=False`` leaves that to the caller), and compute the crops.
    A val plan may hold no sample: the runner yields an empty batch in its place."""
    consumed = len(ids)
    enc, wh = settings.index.images(ids)
    ok = wh[:, 0] > 0
    skipped = 0
    if not ok.all():
        skipped = int((~ok).sum())
        planned = ids
        ids, wh = ids[ok], wh[ok]
        enc = [e for e, k in zip(enc, ok, strict=True) if k]
        if not len(ids) and settings.train and stand_ins:  # stand-ins keep every rank's step count
            ids = settings.stand_in(planned)
            enc, wh = settings.index.images(ids)
    boxes, flips = crop_boxes(settings, wh, ids, epoch=epoch, seed=seed)
    return Plan(ids, enc, wh, boxes, flips, consumed, skipped)


def empty_images(settings: DecodeSettings, n: int, *, pin_memory: bool = False, device: Any | None = None):
    """An uninitialised uint8 image batch of ``n`` samples: ``[n, 3, crop, crop]`` on ``device``
    (default: the settings' device), in ``channels_last`` memory format when asked for."""
    import torch

    c = settings.crop
    device = settings.device if device is None else device
    if settings.channels_last:  # NHWC storage, NCHW shape: torch.channels_last
        return torch.empty((n, c, c, 3), dtype=torch.uint8, device=device, pin_memory=pin_memory).permute(0, 3, 1, 2)
    return torch.empty((n, 3, c, c), dtype=torch.uint8, device=device, pin_memory=pin_memory)


def empty_batch(settings: DecodeSettings, consumed: int, skipped: int) -> Batch:
    """A val batch none of whose samples is loadable: no images, no labels, on the Loader's
    device (yielded in place of the batch, so ``len(loader)`` holds)."""
    import torch

    labels = torch.empty(0, dtype=torch.int64, device=settings.device)
    return Batch(empty_images(settings, 0), labels, consumed, skipped)


__all__ = ["Batch", "DecodeSettings", "Plan", "Runner", "crop_boxes", "empty_batch", "empty_images", "plan_batch"]
