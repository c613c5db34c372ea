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

from collections.abc import Callable, Iterable, Iterator, Sequence
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
        crops: the crop recipe, whole (:class:`~stoker.pipeline.augment.CropSpec`): the output
            size (:attr:`crop`), the train crop's ``scale`` and ``ratio``, the val resize.
        train: train augmentation (random crops and flips) or the val center crop.
        channels_last: images in ``torch.channels_last`` memory format (NCHW shape).
        threads: decode threads / worker processes.
        prefetch: batches prepared ahead.
        decode: ``"cpu"`` or ``"mixed"`` (GPU decode).
        cpu_resize: with CPU decode in DALI, ``"pillow"`` or ``"dali"``.
        hw_decoder_load: share of JPEGs for the hardware decoder (``decode="mixed"``).
        decoder: the nvjpeg backend's JPEG decoder: ``"nvimgcodec"``, ``"torchcodec"``,
            ``"torchvision"`` or ``"auto"`` (:func:`stoker.pipeline.backends.decoders.resolve_decoder`).
        overlap: nvjpeg reads and decodes the next batch in a thread of its own while this one
            is resized.
        region_decode: nvjpeg decodes only the crop boxes' regions where the decoder can.
        stand_in: for a train batch none of whose samples is loadable, the samples to decode
            instead (the Loader's rule: the next loadable ones of this rank's epoch order).
        channels: 3 (RGB) or 1 (grayscale).
    """

    index: SampleIndex
    path: str
    device: Any
    batch_size: int
    crops: augment.CropSpec
    train: bool
    channels_last: bool
    threads: int
    prefetch: int
    decode: str
    cpu_resize: str
    hw_decoder_load: float
    stand_in: Callable[[np.ndarray], np.ndarray] | None
    channels: int = 3
    decoder: str = "auto"
    overlap: bool = True
    region_decode: bool = True

    @property
    def crop(self) -> tuple[int, int]:
        """The output ``(height, width)`` in pixels."""
        return self.crops.size

    @property
    def scale(self) -> tuple[float, float]:
        """The train crop's area range (a share of the image)."""
        return self.crops.scale

    @property
    def ratio(self) -> tuple[float, float]:
        """The train crop's aspect range (width / height)."""
        return self.crops.ratio

    @property
    def crop_pct(self) -> float:
        """The val center crop's share of the resized shorter side."""
        return self.crops.crop_pct

    @property
    def val_resize(self) -> float | None:
        """The val shorter side before the center crop, in pixels (instead of ``crop_pct``)."""
        return self.crops.val_resize

    @property
    def masks(self) -> bool:
        """The split's targets are masks: cropped and flipped with their images."""
        return self.index.target.spatial


class Batch(NamedTuple):
    """One decoded batch, as a runner yields it (the Loader hands users ``(images, targets)``).

    Attributes:
        images: uint8 ``[N, C, H, W]`` on the Loader's device (``torch.channels_last``
            memory format when the Loader was asked for it).
        targets: on the same device: int64 ``[N]`` classes, float32 ``[N]``/``[N, K]``
            values, float32 ``[N, C]`` multi-hot, or uint8 ``[N, H, W]`` masks
            (:mod:`stoker.pipeline.shards.targets`).
        consumed: samples of the rank's epoch order this batch accounts for (its planned size,
            whatever was dropped): what the Loader's resume position advances by.
        skipped: of those, samples dropped (failed the header check or the decoder).
        ids: the global positions of the batch's rows (stand-ins included): each row's random
            stream for the augmentation applied on the device.
    """

    images: Any
    targets: Any
    consumed: int
    skipped: int
    ids: Any = None


class Runner(Protocol):
    """What the Loader asks of a backend: ``Runner(settings)``, then per epoch
    :meth:`iterate`. A val batch with nothing loadable is yielded empty (``N == 0``) in its
    place; a train batch with nothing loadable is decoded from ``settings.stand_in``.

    A runner may also have ``expect(batches)``: the Loader says, before each iteration, the
    batches (an :class:`~stoker.pipeline.order.base.EpochBatches`) the next one will likely
    ask for, so the runner may start on them while this one ends; what it started is dropped
    when the next iteration asks for other batches."""

    def iterate(self, batches: Sequence[np.ndarray], epoch: int, seed: int) -> Iterator[Batch]:
        """One :class:`Batch` per array of global sample positions in ``batches``, in order (a
        sequence: the Loader's batches are computed as they are read, so read them in order,
        once). Closing the iterator early stops any work running ahead."""
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
        masks: their encoded masks (a mask split), else ``None``.
        boxes: ``[len(ids), 4]`` crop boxes ``(x, y, w, h)`` in stored pixels.
        flips: ``[len(ids)]`` horizontal flips.
        consumed: samples of the epoch order this batch accounts for (its planned size).
        skipped: planned samples dropped by the header check.
    """

    ids: np.ndarray
    enc: list
    wh: np.ndarray
    masks: list | None
    boxes: np.ndarray
    flips: np.ndarray
    consumed: int
    skipped: int
    #: ``[len(ids), 4]`` where each crop box lands in the output (:func:`places_of`)
    places: np.ndarray | None = None

    def keep(self, mask: np.ndarray) -> Plan:
        """This plan with only the samples where ``mask`` holds (the rest count as skipped)."""
        mask = np.asarray(mask, bool)
        return self._replace(
            ids=self.ids[mask],
            enc=[e for e, k in zip(self.enc, mask, strict=True) if k],
            wh=self.wh[mask],
            masks=None if self.masks is None else [m for m, k in zip(self.masks, mask, strict=True) if k],
            boxes=self.boxes[mask],
            flips=self.flips[mask],
            places=None if self.places is None else self.places[mask],
            skipped=self.skipped + int((~mask).sum()),
        )


def letterbox(settings: DecodeSettings) -> bool:
    """A val Loader whose crop recipe (or, for ``val_fit="auto"``, the split's kind) keeps the
    whole image: resized keeping its aspect ratio, then padded."""
    return not settings.train and settings.crops.letterbox(settings.index.target.val_fit)


def crop_boxes(settings: DecodeSettings, wh: np.ndarray, ids: np.ndarray, *, epoch: int, seed: int) -> tuple:
    """``(boxes, flips)`` of ``ids``: random resized crops and flips for train (a pure function of
    ``(seed, epoch, sample)``), the center crop (or the whole image, letterboxed) and no flip for val."""
    if settings.train and settings.crops.places_train:  # scale jitter: its window, then placed
        boxes, flips, _ = augment.scale_jitter(
            wh, ids, settings.crop, seed=seed, epoch=epoch, jitter=settings.crops.jitter
        )
        return boxes, flips
    if settings.train:
        return augment.random_resized_crop(wh, ids, seed=seed, epoch=epoch, scale=settings.scale, ratio=settings.ratio)
    if letterbox(settings):  # resized whole, then fitted into the output (.letterbox)
        return augment.whole_image(wh), np.zeros(len(ids), bool)
    boxes = augment.center_crop(wh, settings.crop, settings.crop_pct, resize=settings.val_resize)
    return boxes, np.zeros(len(ids), bool)


def plan_batch(
    settings: DecodeSettings,
    ids: np.ndarray,
    *,
    epoch: int,
    seed: int,
    stand_ins: bool = True,
    wh: np.ndarray | None = None,
) -> Plan:
    """The plan of one batch: read the samples' bytes and sizes, drop those that fail the header
    guard (truncated or foreign bytes never reach a decoder; a mask must be a complete PNG of its
    image's size), fill a train batch that lost every sample with stand-ins (``stand_ins=False``
    leaves that to the caller), and compute the crops. A val plan may hold no sample: the runner
    yields an empty batch in its place. ``wh``: the images' sizes as the header guard read them
    before (the pixel tier's layout): their headers are not read again, and ``enc`` holds ``None``."""
    consumed = len(ids)
    enc, wh, masks, ok = _read(settings, ids, wh)
    skipped = 0
    if not ok.all():
        skipped = int((~ok).sum())
        planned = ids
        ids, wh = ids[ok], wh[ok]
        enc = [e for e, k in zip(enc, ok, strict=True) if k]
        masks = None if masks is None else [m for m, k in zip(masks, ok, strict=True) if k]
        if not len(ids) and settings.train and stand_ins:  # stand-ins keep every rank's step count
            ids = settings.stand_in(planned)
            enc, wh, masks, _ = _read(settings, ids)
    boxes, flips = crop_boxes(settings, wh, ids, epoch=epoch, seed=seed)
    places = places_of(settings, wh, ids, epoch=epoch, seed=seed)
    return Plan(ids, enc, wh, masks, boxes, flips, consumed, skipped, places)


def _read(settings: DecodeSettings, ids: np.ndarray, wh: np.ndarray | None = None) -> tuple:
    """``(encoded images, their sizes, encoded masks or None, which pass the header guard)``; with
    ``wh`` given, the images are not read (``None`` each)."""
    if wh is None:
        enc, wh = settings.index.images(ids)
    else:
        enc, wh = [None] * len(ids), np.asarray(wh, np.int64)
    masks, mask_wh = settings.index.masks(ids) if settings.masks else (None, None)
    return enc, wh, masks, _header_ok(wh, mask_wh)


def _header_ok(wh: np.ndarray, mask_wh: np.ndarray | None) -> np.ndarray:
    """The header guard: an image whose header gives its size, and its mask (a mask split) a
    complete PNG of that size."""
    ok = wh[:, 0] > 0
    return ok if mask_wh is None else ok & (mask_wh == wh).all(axis=1)


def loadable(index: SampleIndex, ids: np.ndarray) -> np.ndarray:
    """Which of ``ids`` pass the header guard every plan applies (what a stand-in must pass)."""
    _, wh = index.images(ids)
    return _header_ok(wh, index.masks(ids)[1] if index.target.spatial else None)


def next_loadable(
    index: SampleIndex, chunks: Iterable[np.ndarray], count: int, shards: set | None = None
) -> np.ndarray:
    """The first ``count`` samples of ``chunks`` (a rank's epoch order from some point on, a
    chunk at a time) that pass the header guard, from ``shards`` only when given: a train batch's
    stand-ins."""
    picked: list = []
    for chunk in chunks:
        if shards is not None:  # block mode from a URL: only shards fetched for this window
            shard = np.searchsorted(index.shard_start, chunk, side="right") - 1
            chunk = chunk[np.isin(shard, list(shards))]
        picked.extend(chunk[loadable(index, chunk)][: count - len(picked)].tolist())
        if len(picked) == count:
            break
    return np.asarray(picked, np.int64)


def plan_with_masks(settings: DecodeSettings, ids: np.ndarray, *, epoch: int, seed: int) -> tuple[Plan, list | None]:
    """:func:`plan_batch` and, for a mask split, the plan's masks decoded (a mask that does not
    decode drops its sample; a train batch left with none gets stand-ins, as for images)."""
    plan = plan_batch(settings, ids, epoch=epoch, seed=seed)
    if not settings.masks:
        return plan, None
    plan, decoded = _decoded(plan)
    if not len(plan.ids) and settings.train:
        stand_in, decoded = _decoded(plan_batch(settings, settings.stand_in(ids), epoch=epoch, seed=seed))
        plan = stand_in._replace(consumed=plan.consumed, skipped=plan.skipped)
    return plan, decoded


def _decoded(plan: Plan) -> tuple[Plan, list]:
    decoded = decode_masks(plan)
    ok = np.array([m is not None for m in decoded], bool)
    return plan.keep(ok), [m for m in decoded if m is not None]


def decode_masks(plan: Plan) -> list:
    """The plan's masks decoded to ``[H, W]`` uint8 class indices (``None`` where one does not
    decode: the sample is dropped)."""
    import io

    from PIL import Image

    from ..imagedecode import DAMAGED_INPUT

    out = []
    for raw in plan.masks or ():
        try:
            with Image.open(io.BytesIO(raw.tobytes() if hasattr(raw, "tobytes") else bytes(raw))) as im:
                a = np.asarray(im.convert("L") if im.mode not in ("L", "P") else im)
        except DAMAGED_INPUT:  # a damaged mask drops its sample, like a damaged image
            out.append(None)
            continue
        out.append(a if a.dtype == np.uint8 else a.astype(np.uint8))
    return out


def crop_masks(settings: DecodeSettings, decoded: list, plan: Plan):
    """The decoded masks of ``plan`` with their images' boxes and flips: uint8 ``[N, H, W]`` (CPU)."""
    import torch

    h, w = settings.crop
    out = torch.empty((len(decoded), h, w), dtype=torch.uint8)
    buf = out.numpy()
    for k, m in enumerate(decoded):
        augment.crop_mask(m, plan.boxes[k], bool(plan.flips[k]), buf[k])
    return out


def placed(settings: DecodeSettings) -> bool:
    """The crop boxes land on a part of the output (:func:`places_of`): the val letterbox, the
    train scale jitter. A runner resizes onto the whole output; :mod:`.letterbox` fits the part."""
    return letterbox(settings) or (settings.train and settings.crops.places_train)


def places_of(settings: DecodeSettings, wh: np.ndarray, ids=None, *, epoch: int = 0, seed: int = 0) -> np.ndarray:
    """Where each crop box lands in the output (``[N, 4]`` ``x y w h``): all of it, the val
    letterbox's part, or the train scale jitter's (of ``ids`` at ``(seed, epoch)``)."""
    if letterbox(settings):
        return augment.letterbox_places(wh, settings.crop)
    if settings.train and settings.crops.places_train:
        jitter = settings.crops.jitter
        return augment.scale_jitter(wh, ids, settings.crop, seed=seed, epoch=epoch, jitter=jitter)[2]
    return augment.full_places(len(wh), settings.crop)


def targets_of(settings: DecodeSettings, ids: np.ndarray, *, plan: Plan | None = None, epoch: int = 0, seed: int = 0):
    """The non-spatial targets of ``ids`` as a CPU tensor (classes, floats, multi-hot), or, for a
    kind that :attr:`~..shards.kinds.Target.follows_crop`, moved with their images' crops: the
    ``plan``'s, or computed again here from ``(seed, epoch, sample)`` (a runner whose plans are
    made in worker processes)."""
    import torch

    target, values = settings.index.target, settings.index.targets(ids)
    if not target.follows_crop:
        return torch.from_numpy(values)
    if plan is None:
        _, wh = settings.index.images(ids)
        boxes, flips = crop_boxes(settings, wh, ids, epoch=epoch, seed=seed)
        places = places_of(settings, wh, ids, epoch=epoch, seed=seed)
    else:
        boxes, flips, places = plan.boxes, plan.flips, plan.places
    return target.follow(values, boxes, flips, places)


def empty_images(settings: DecodeSettings, n: int, *, pin_memory: bool = False, device: Any | None = None):
    """An uninitialised uint8 image batch of ``n`` samples: ``[n, channels, height, width]`` on
    ``device`` (default: the settings' device), in ``channels_last`` memory format when asked for."""
    import torch

    (h, w), c = settings.crop, settings.channels
    device = settings.device if device is None else device
    if settings.channels_last:  # NHWC storage, NCHW shape: torch.channels_last
        return torch.empty((n, h, w, c), dtype=torch.uint8, device=device, pin_memory=pin_memory).permute(0, 3, 1, 2)
    return torch.empty((n, c, h, w), dtype=torch.uint8, device=device, pin_memory=pin_memory)


def empty_targets(settings: DecodeSettings, n: int = 0):
    """An empty target batch of the split's kind on the device (an empty val batch's)."""
    target = settings.index.target
    return target.empty(n, settings.crop, target.class_count(settings.index.manifest.classes), settings.device)


def empty_batch(settings: DecodeSettings, consumed: int, skipped: int) -> Batch:
    """A val batch none of whose samples is loadable: no images, no targets, on the Loader's
    device (yielded in place of the batch, so ``len(loader)`` holds)."""
    return Batch(empty_images(settings, 0), empty_targets(settings), consumed, skipped, np.zeros(0, np.int64))


__all__ = [
    "Batch",
    "DecodeSettings",
    "Plan",
    "Runner",
    "crop_boxes",
    "crop_masks",
    "decode_masks",
    "empty_batch",
    "empty_images",
    "empty_targets",
    "letterbox",
    "loadable",
    "placed",
    "places_of",
    "plan_batch",
    "plan_with_masks",
    "targets_of",
]
