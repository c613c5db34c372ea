"""The pillow backend: mmap'd shards + pillow(-simd) + torch DataLoader worker processes.

Same order, same crop boxes and flips as the other backends (:func:`.base.plan_batch`), same
output. Used where DALI is not installed (macOS, Windows) and for debugging. The decode and
resize of one sample are :mod:`.resize`.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Iterator

import numpy as np

from . import producer
from .base import Batch, DecodeSettings, crop_masks, decode_masks, plan_batch, targets_of
from .resize import decode_region, resize_into
from .slots import SlotPool, copy_out

# A whole batch is one DataLoader item, written by its worker into a slot of a pool shared with the
# parent: worker→parent traffic is a few numbers per batch.


class PilBatches:
    """A map-style dataset whose items are whole batches: ``(epoch, seed, ids, slot) → (images, masks,
    bad)``, where ``masks`` are the cropped masks of a mask split (else ``None``) and ``bad`` is a
    bool mask of the planned samples that failed the header check or a decoder (dropped). With a
    ``slot`` of the :class:`~.slots.SlotPool`, the batch is written there and ``images`` is how many
    it holds (``masks`` ``None``); a slot of ``None`` returns new tensors. Other targets are read by
    the parent (:meth:`PilRunner.iterate`), so a bad target is one error line there, not a worker's
    traceback."""

    def __init__(self, settings: DecodeSettings, pool: SlotPool | None = None):
        # sent to the worker processes: without the Loader's stand-in rule (a bound method of
        # the Loader), which the parent applies
        self.settings = dataclasses.replace(settings, stand_in=None)
        self.pool = pool

    def __getitem__(self, item):
        import torch

        epoch, seed, ids, slot = item
        s = self.settings
        ids = np.asarray(ids, np.int64)
        plan = plan_batch(s, ids, epoch=epoch, seed=seed, stand_ins=False)  # stand-ins: the parent's
        decoded = None
        if s.masks:
            decoded = decode_masks(plan)
            ok = np.array([m is not None for m in decoded], bool)
            plan, decoded = plan.keep(ok), [m for m in decoded if m is not None]
        n, (h, w), c = len(plan.ids), s.crop, s.channels
        # contiguous NHWC for channels_last (the parent permutes it): pinning keeps no strides
        if slot is None:
            images = torch.empty((n, h, w, c) if s.channels_last else (n, c, h, w), dtype=torch.uint8)
        else:
            images, mask_slot = self.pool.views(slot, n)
        out = images.numpy()
        good = np.zeros(n, bool)
        from ..imagedecode import DAMAGED_INPUT

        for j in range(n):
            try:
                im, box = decode_region(plan.enc[j], plan.boxes[j], s.crop, s.channels)
                resize_into(out, int(good.sum()), im, s.crop, bool(plan.flips[j]), box=box, chw=not s.channels_last)
            except DAMAGED_INPUT:  # a damaged image: skipped and counted
                continue
            good[j] = True
        masks = None
        if decoded is not None:
            plan = plan.keep(good)
            masks = crop_masks(s, [m for m, g in zip(decoded, good, strict=True) if g], plan)
        bad = ~np.isin(ids, plan.ids[good] if decoded is None else plan.ids)
        kept = int(good.sum())
        if slot is None:
            return images[:kept], masks, bad
        if masks is not None:
            mask_slot[:kept] = masks
        return kept, None, bad

    def __len__(self) -> int:  # not used: the sampler yields the items
        return 0


def _identity(x):
    return x


class BatchItems:
    """The sampler's item for each of ``batches``, ``make(ids, slot)``, made as the sampler reaches
    it (a Loader's batches are computed when read: an epoch's start costs one batch); ``slot`` is
    the shared slot the batch is written to (``None`` without worker processes): batch ``k``'s is
    ``k % slots``, or what a :class:`~.slots.SlotLender` gives."""

    def __init__(self, batches, slots, make):
        self.batches, self.slots, self.make = batches, slots, make

    def __iter__(self):
        slots = self.slots
        if hasattr(slots, "acquire"):
            return (self.make(b, slots.acquire()) for b in self.batches)
        return (self.make(b, k % slots if slots else None) for k, b in enumerate(self.batches))

    def __len__(self) -> int:
        return len(self.batches)


class EpochItems:
    """The sampler: this epoch's ``(epoch, seed, ids)`` items, replaced each epoch, so one
    DataLoader (and its worker processes) serves every epoch."""

    def __init__(self):
        self.items: list | BatchItems = []

    def __iter__(self):
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)


def batch_loader(dataset, sampler, settings: DecodeSettings):
    """A torch DataLoader whose items are whole batches (``dataset[item]`` for each item of
    ``sampler``), made by ``settings.threads`` persistent worker processes (none: in this one)."""
    import torch

    from ..workers import check_not_bootstrapping, context, refers_to_main

    workers = settings.threads
    kw = {}
    if workers > 0:
        check_not_bootstrapping()
        # workers start from a fork server, never a fork of this process: it may run threads
        # (fsspec's IO loop for a URL split, DALI's, torch's) whose held locks a fork would copy
        kw = {
            "prefetch_factor": max(1, settings.prefetch),
            "persistent_workers": True,
            # the classes it holds, not their data (the batch slots): a class of the main script's needs it
            "multiprocessing_context": context(main=refers_to_main(type(dataset), *map(type, vars(settings).values()))),
            "worker_init_fn": functools.partial(_worker_init, env=dict(os.environ), cwd=os.getcwd()),
        }
    return torch.utils.data.DataLoader(
        dataset,
        sampler=sampler,
        batch_size=None,
        num_workers=workers,
        pin_memory=settings.device.type == "cuda",
        collate_fn=_identity,
        **kw,
    )


def worker_batches(it: Iterator) -> Iterator:
    """The items of a DataLoader iterator; a worker process that died (killed, out of memory, a
    crash in a codec) is a :class:`~stoker.errors.LoaderError` naming it, not torch's traceback.
    torch notices a dead worker within its status interval (5 s)."""
    from stoker.errors import LoaderError, StokerError

    while True:
        try:
            item = next(it)
        except StopIteration:
            return
        except StokerError as e:  # torch re-raises a worker's error with its traceback in the message
            text = str(e)
            if not text.startswith("Caught "):
                raise
            last = text.rstrip().splitlines()[-1]
            raise type(e)(last.partition(": ")[2] or last) from None
        except RuntimeError as e:
            if not str(e).startswith("DataLoader worker"):
                raise
            why = " ".join(str(e).split()).rstrip(". ")
            raise LoaderError(
                f"a decode worker process died ({why}): this Loader cannot go on; make a new one and "
                "load_state_dict() its last state_dict() to resume mid-epoch"
            ) from None
        yield item


def _worker_init(_worker_id: int, env: dict[str, str], cwd: str) -> None:
    from ..workers import as_parent, die_with_parent

    die_with_parent()
    as_parent(env, cwd)


class PilRunner:
    """The Loader's runner for ``backend="pil"`` (a :class:`.base.Runner`): persistent pillow
    worker processes (one torch DataLoader serving every epoch) fed batches of sample positions."""

    def __init__(self, settings: DecodeSettings):
        self.settings = settings
        self.plan = EpochItems()
        self.index = settings.index
        self.pool = SlotPool.for_settings(settings) if settings.threads else None
        self.dataset = PilBatches(settings, self.pool)
        self.dl = batch_loader(self.dataset, self.plan, settings)

    def _targets(self, ids: np.ndarray, masks, bad: np.ndarray, epoch: int, seed: int):
        """The batch's targets: the worker's cropped masks, or the others read here (boxes moved
        with the workers' crops, computed again from ``(seed, epoch, sample)``)."""
        return masks if masks is not None else targets_of(self.settings, ids[~bad], epoch=epoch, seed=seed)

    def iterate(self, batches: list, epoch: int, seed: int) -> Iterator[Batch]:
        """One :class:`.base.Batch` per array of global sample positions in ``batches``."""
        s, pool = self.settings, self.pool
        slots = pool.slots if pool is not None else 0
        self.plan.items = BatchItems(batches, slots, lambda b, slot: (epoch, seed, b, slot))
        it = iter(self.dl)  # persistent workers: one iterator, reset each epoch
        if self.dl.num_workers:
            # torch registers its own exit hook for these workers when the iterator is made; with
            # pinned memory some versions wait 5 s per worker in it (80 s with 16 workers, seen on
            # an H200). Registered after it, ours runs first and stops them at once.
            producer.stop_at_exit(self)
        for k, ((images, masks, bad), ids) in enumerate(zip(worker_batches(it), batches, strict=True)):
            if pool is not None:  # copied out of the slot: it is written again later
                images, masks = (copy_out(v, pin=s.device.type == "cuda") for v in pool.views(k % slots, images))
            targets, consumed, nbad = self._targets(ids, masks, bad, epoch, seed), len(ids), int(bad.sum())
            rows = ids[~bad]
            if not len(targets) and s.train:  # nothing loadable: stand-ins, decoded here (rare)
                stand_in = s.stand_in(ids)
                images, masks, stand_in_bad = self.dataset[(epoch, seed, stand_in, None)]
                targets = self._targets(stand_in, masks, stand_in_bad, epoch, seed)
                rows = stand_in[~stand_in_bad]
            if s.channels_last:
                images = images.permute(0, 3, 1, 2)  # NHWC memory → NCHW shape, channels_last
            images, targets = images.to(s.device, non_blocking=True), targets.to(s.device, non_blocking=True)
            yield Batch(images, targets, consumed, nbad, rows)

    def shutdown(self) -> None:
        """Stop the worker processes now, not when the DataLoader's iterator is collected."""
        it = getattr(self.dl, "_iterator", None)  # the persistent workers' iterator
        if it is not None:
            it._shutdown_workers()

    def close(self) -> None:
        """Stop the worker processes and let the DataLoader go."""
        self.shutdown()
        self.dl = None


__all__ = ["BatchItems", "EpochItems", "PilBatches", "PilRunner", "batch_loader", "worker_batches"]
