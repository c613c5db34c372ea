"""The pixel tier on the CPU: crops, resizes and flips from the decoded pixels of a
:class:`~.store.PixelStore`, in worker processes, filling the store as it goes.

A batch is planned as on every backend (:func:`~stoker.pipeline.backends.base.plan_batch`: the
same boxes and flips); each sample the store holds is read where it lies and cropped straight
into the batch (:func:`~.kernel.crop_into`: OpenCV's warp, or pillow-simd's antialiased resize
where a box is larger than the crop, as the JPEG path resizes its decoded region); a sample it
does not hold yet is decoded whole with pillow (libjpeg-turbo: the same pixels as DALI's CPU
decode), written to the store and cropped from that decode in the same way. So the first epoch
fills the store and yields the same batches later epochs will.

Worker processes, not threads: OpenCV and pillow release the GIL while they resize, but the
Python around each call holds it; two threads measured no faster than one on two cores, two
processes twice as fast (docs/pixel-cache.md). On the CPU each worker's batch slot is lent to
the caller as the batch, and the workers begin the next epoch as this one ends (:meth:`PixelRunner.expect`).
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Callable, Iterator

import numpy as np

from ..augment import CropSpec, crop_mask
from ..backends import producer
from ..backends.base import Batch, DecodeSettings, decode_masks, plan_batch, targets_of
from ..backends.gpu_resize import filter_regions
from ..backends.pil import BatchItems, EpochItems, batch_loader, worker_batches
from ..backends.resize import MODES
from ..backends.slots import SlotLender, SlotPool, copy_out
from .kernel import crop_into
from .store import PixelStore

#: batches the workers keep in flight at least (``prefetch`` per worker, raised to reach it): on
#: two cores, 4 (prefetch 2) kept 175-186% of the CPU busy, 6 188-190%, 8 188-192%
MIN_IN_FLIGHT = 8


def decode_whole(data, channels: int):
    """``data`` (encoded bytes) decoded at its stored size with pillow, as a PIL image: RGB, or the
    JPEG decoder's own luma for one channel (what the JPEG path decodes, without DCT scaling)."""
    from PIL import Image

    mode = MODES[channels]
    im = Image.open(io.BytesIO(data))
    if im.format == "JPEG" and mode == "L":
        im.draft("L", im.size)
    if im.mode != mode:
        im = im.convert(mode)
    im.load()
    return im


class PixelBatches:
    """A map-style dataset whose items are whole batches, ``(epoch, seed, ids, crops, slot) ->
    (images, masks, bad, decoded)``: the images (and a mask split's cropped masks) of the planned
    samples that load, written into ``slot`` of the :class:`SlotPool` (then ``images`` is how many;
    a slot of ``None``: new tensors), ``bad`` the planned samples that did not (dropped), ``decoded``
    how many were decoded from JPEG (the rest came from the store)."""

    def __init__(self, settings: DecodeSettings, store: PixelStore, pool: SlotPool | None = None):
        self.settings = dataclasses.replace(settings, stand_in=None)  # the parent applies stand-ins
        self.store, self.pool = store, pool

    def __getitem__(self, item):
        import torch

        from ..imagedecode import DAMAGED_INPUT

        epoch, seed, ids, crops, slot = item
        s = self.settings if crops == self.settings.crops else dataclasses.replace(self.settings, crops=crops)
        ids = np.asarray(ids, np.int64)
        # the sizes from the store's layout (the same header guard, read once): no header is read again
        plan = plan_batch(s, ids, epoch=epoch, seed=seed, stand_ins=False, wh=self.store.wh[ids])
        n, (h, w), c = len(plan.ids), s.crop, s.channels
        if slot is None:
            images = torch.empty((n, h, w, c) if s.channels_last else (n, c, h, w), dtype=torch.uint8)
            masks = torch.empty((n, h, w), dtype=torch.uint8) if s.masks else None
        else:
            images, masks = self.pool.views(slot, n, s.crop)
        out, mask_out = images.numpy(), None if masks is None else masks.numpy()
        store, chw = self.store, not s.channels_last
        cached = store.filled(plan.ids)
        if not cached.all():  # the bytes of the samples to decode
            enc = iter(s.index.images(plan.ids[~cached])[0])
            plan = plan._replace(enc=[None if f else next(enc) for f in cached])
        # the region each crop's filter reads, for the whole batch at once
        _, _, lo, hi = filter_regions(plan.boxes, plan.wh[:, ::-1], s.crop)
        boxes, lo, hi, flips = plan.boxes.tolist(), lo.tolist(), hi.tolist(), plan.flips.tolist()
        # a mask split: the masks the store lacks are decoded (with their images) below
        fresh = iter(decode_masks(plan.keep(~cached)) if s.masks else ())
        good = np.zeros(n, bool)
        decoded = kept = 0
        for j in range(n):
            i, box, flip = int(plan.ids[j]), boxes[j], flips[j]
            try:
                if cached[j]:
                    crop_into(out, kept, store.pixels(i), box, flip, s.crop, lo[j], hi[j], chw=chw)
                    mask = store.mask(i) if s.masks else None
                else:
                    mask = next(fresh) if s.masks else None
                    if s.masks and mask is None:
                        continue  # a mask that does not decode drops its sample, as on every backend
                    im = decode_whole(plan.enc[j], c)
                    decoded += 1
                    pixels = np.asarray(im).reshape(im.height, im.width, c)
                    store.put(i, pixels.tobytes(), mask)
                    # cropped as a stored sample is: this epoch's batch is the one a warm epoch gives
                    crop_into(out, kept, pixels, box, flip, s.crop, lo[j], hi[j], chw=chw)
            except DAMAGED_INPUT:  # a damaged image: skipped and counted
                continue
            if mask_out is not None:
                crop_mask(mask, box, flip, mask_out[kept])
            good[j] = True
            kept += 1
        bad = ~np.isin(ids, plan.ids[good])
        if slot is not None:
            return kept, None, bad, decoded
        return images[:kept], None if masks is None else masks[:kept], bad, decoded

    def __len__(self) -> int:  # not used: the sampler yields the items
        return 0


class ItemChain:
    """The DataLoader's sampler across iterations: one iteration's items, then those of the
    iteration expected next, so the workers go from an epoch's last batch to the next epoch's first
    without the pause a new DataLoader iteration costs (its workers idle while it starts: ~10%
    of a warm epoch of 16 batches on two cores)."""

    def __init__(self, items):
        self._now = iter(items)
        self._next: list = []

    def then(self, items) -> None:
        """Items to go on with once these run out."""
        self._next.append(items)

    def stop(self) -> None:
        """No more items (an abandoned iteration)."""
        self._now, self._next = iter(()), []

    def __iter__(self):
        return self

    def __next__(self):
        while True:
            try:
                return next(self._now)
            except StopIteration:
                if not self._next:
                    raise
                self._now = iter(self._next.pop(0))


class PixelRunner:
    """The Loader's runner with ``pixel_cache=`` on the CPU (a :class:`~..backends.base.Runner`):
    persistent worker processes crop batches out of the store into a
    :class:`~..backends.slots.SlotPool`, filling the store where it has no pixels.

    Attributes:
        store: the :class:`~.store.PixelStore`.
        decoded: samples decoded from JPEG (filling the store, or past its budget) since made;
            ``from_store``: samples cropped from stored pixels.
    """

    def __init__(self, settings: DecodeSettings, store: PixelStore | Callable[[], PixelStore]):
        self.settings = settings
        self._open = store if callable(store) else lambda: store
        self.store: PixelStore | None = None
        self.crops: CropSpec = settings.crops
        self.items = EpochItems()
        self.dataset: PixelBatches | None = None
        self.pool: SlotPool | None = None
        self.lender: SlotLender | None = None  # on the CPU: the slots are the batches handed out
        self.dl = None
        self.decoded = self.from_store = 0
        self._chain: ItemChain | None = None  # the items of this iteration, then of the one expected
        self._it = None  # the DataLoader iteration the chain feeds
        self._upcoming = None  # what expect() said the next iteration will ask for
        self._ahead = None  # ``(batches, crops)`` the workers began after this iteration's
        #: iterations whose first batches the workers began before it was asked for (expect())
        self.ran_ahead = 0

    def _start(self) -> None:
        """Open the store (a URL's shards are local by now), make the slot pool for this crop and
        the workers' DataLoader."""
        if self.store is None:
            self.store = self._open()
        s = self.settings
        if s.threads:  # torch gives batches to the workers in turn: a quick one waits behind a slow one
            s = dataclasses.replace(s, prefetch=max(s.prefetch, -(-MIN_IN_FLIGHT // s.threads)))
        lend = s.device.type == "cpu"  # a CUDA Loader copies each batch to pinned memory for the device
        self.pool = SlotPool.for_settings(s, self.crops.size, spare=2) if s.threads else None
        self.lender = SlotLender(self.pool) if lend and self.pool is not None else None
        if self.lender is not None and not self.lender.lends:
            self.lender = None
        self.dataset = PixelBatches(s, self.store, self.pool)
        self.dl = batch_loader(self.dataset, self.items, s)

    def set_crops(self, crops: CropSpec) -> None:
        """The crop recipe of the next iteration (the workers take it with each batch; a larger
        crop than the slot pool holds starts them again with a larger pool)."""
        self.crops = crops
        if self.pool is not None and not self.pool.fits(crops.size):
            self.shutdown()
            self.dl = None  # made again at the next iteration, with slots for this crop

    def _targets(self, ids: np.ndarray, masks, bad: np.ndarray, epoch: int, seed: int, crops: CropSpec):
        if masks is not None:
            return masks
        s = self.settings if crops == self.settings.crops else dataclasses.replace(self.settings, crops=crops)
        return targets_of(s, ids[~bad], epoch=epoch, seed=seed)  # boxes: the workers' crops, computed again

    def expect(self, batches) -> None:
        """The batches the next iteration will likely ask for (an
        :class:`~..order.base.EpochBatches`): the workers start on them as this one ends."""
        self._upcoming = batches

    def _items(self, batches, epoch: int, seed: int, crops: CropSpec) -> BatchItems:
        slots = self.lender or (self.pool.slots if self.pool is not None else 0)
        return BatchItems(batches, slots, lambda b, slot: (epoch, seed, b, crops, slot))

    def _results(self, batches, epoch: int, seed: int) -> Iterator:
        """The workers' results for ``batches``: where they began them already (:meth:`expect`),
        the same DataLoader iteration goes on; else a new one. Then the expected next batches go
        after these (on the CPU only: a lent slot is taken when its batch is started, where a
        copied one is fixed by its batch's number)."""
        crops, ahead, upcoming = self.crops, self._ahead, self._upcoming
        self._ahead = self._upcoming = None
        same = ahead is not None and ahead[1] == crops and ahead[0].same(batches)
        if same:
            self.ran_ahead += 1
        else:  # a new DataLoader iteration: torch drops what the workers began for another
            if self.lender is not None:
                self.lender.reset()
            self._chain = ItemChain(self._items(batches, epoch, seed, crops))
            self.items.items = self._chain
            self._it = iter(self.dl)
            if self.dl.num_workers:
                producer.stop_at_exit(self)  # before torch's own exit hook for the workers (see pil.py)
        if upcoming is not None and self.lender is not None and self.dl.num_workers:
            self._chain.then(self._items(upcoming, upcoming.epoch, upcoming.seed, crops))
            self._ahead = (upcoming, crops)
        return worker_batches(self._it)

    def iterate(self, batches: list, epoch: int, seed: int) -> Iterator[Batch]:
        """One :class:`~..backends.base.Batch` per array of global sample positions in ``batches``."""
        if self.dl is None:
            self._start()
        s, crops, pool, lender = self.settings, self.crops, self.pool, self.lender
        slots = pool.slots if pool is not None else 0
        results = self._results(batches, epoch, seed)
        ended = False
        try:
            for k, ids in enumerate(batches):  # batches first: a result past them is the next iteration's
                images, masks, bad, decoded = next(results)
                slot = (lender.arrived() if lender is not None else k % slots) if pool is not None else None
                if slot is not None:
                    views = pool.views(slot, images, crops.size)
                    if lender is not None:  # lent: written again only once nothing refers to it
                        images, masks = views
                    else:  # copied out of the slot: it is written again later
                        images, masks = (copy_out(v, pin=s.device.type == "cuda") for v in views)
                yield self._batch(ids, images, masks, bad, decoded, epoch, seed, crops)
            ended = True
        finally:
            if not ended:  # abandoned: what the workers began is dropped by the next iteration
                self._ahead = None
                self._chain.stop()
        self.store.seal_soon()  # a whole epoch went by: the store may be complete (its markers made durable)

    def _batch(self, ids, images, masks, bad, decoded: int, epoch: int, seed: int, crops: CropSpec) -> Batch:
        s = self.settings
        targets, consumed, nbad = self._targets(ids, masks, bad, epoch, seed, crops), len(ids), int(bad.sum())
        rows = ids[~bad]
        if not len(targets) and s.train:  # nothing loadable: stand-ins, made here (rare)
            stand_in = s.stand_in(ids)
            images, masks, stand_in_bad, more = self.dataset[(epoch, seed, stand_in, crops, None)]
            decoded += more
            targets = self._targets(stand_in, masks, stand_in_bad, epoch, seed, crops)
            rows = stand_in[~stand_in_bad]
        self.decoded += decoded
        self.from_store += len(rows) - decoded
        if s.channels_last:
            images = images.permute(0, 3, 1, 2)  # NHWC memory -> NCHW shape, channels_last
        images, targets = images.to(s.device, non_blocking=True), targets.to(s.device, non_blocking=True)
        return Batch(images, targets, consumed, nbad, rows)

    def shutdown(self) -> None:
        """Stop the worker processes now."""
        it = getattr(self.dl, "_iterator", None) if self.dl is not None else None
        if it is not None:
            it._shutdown_workers()

    def close(self) -> None:
        """Stop the worker processes and release the store."""
        self.shutdown()
        self.dl = None
        if self.store is not None:
            self.store.close()


__all__ = ["ItemChain", "PixelBatches", "PixelRunner", "decode_whole"]
