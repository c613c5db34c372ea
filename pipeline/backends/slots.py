"""Batch buffers shared with worker processes (:class:`SlotPool`), made before the workers start.

The worker of batch ``k`` writes it into slot ``k % slots`` and the parent copies it out as it
arrives. A shared-memory segment made per batch, as torch's DataLoader workers send tensors, cost
0.23 ms an image on the development machine (the segment's creation and its pages' first touch in
both processes): more than cropping the image. ``slots`` exceeds the batches a DataLoader keeps in
flight (``prefetch_factor`` per worker), so a slot is written again only after the parent copied it.

A :class:`SlotLender` hands the slots themselves out instead (the pixel tier, where the copy was a
quarter of the CPU an image cost): each slot is a storage of its own, and one is written again only
when nothing outside the pool refers to it any more (its storage's use count), so a batch a
caller keeps is never overwritten; with every slot held, a batch travels as torch sends tensors.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class SlotPool:
    """``slots`` batches of ``batch_size`` uint8 images of ``size`` (``(height, width)``) and
    ``channels``, NHWC when ``channels_last`` else NCHW, and (``masks``) their ``[H, W]`` masks,
    in one shared-memory tensor."""

    def __init__(
        self, slots: int, *, batch_size: int, size: tuple, channels: int, channels_last: bool, masks: bool
    ) -> None:
        import torch

        (h, w), n = size, batch_size
        self.size, self.channels, self.channels_last, self.slots = tuple(size), channels, channels_last, slots
        self.image_bytes, self.mask_bytes = n * channels * h * w, n * h * w if masks else 0
        #: one shared storage a slot: a slot lent out is known free when its storage is no longer referenced
        nbytes = self.image_bytes + self.mask_bytes
        self.bufs = [torch.empty(nbytes, dtype=torch.uint8).share_memory_() for _ in range(slots)]

    @classmethod
    def for_settings(cls, settings: Any, size: tuple | None = None, spare: int = 2) -> SlotPool:
        """The pool of a runner's :class:`~.base.DecodeSettings` (its crop, or ``size``): the batches
        its DataLoader keeps in flight, and ``spare`` more."""
        in_flight = max(1, settings.prefetch) * max(1, settings.threads)
        return cls(
            in_flight + spare,
            batch_size=settings.batch_size,
            size=size or settings.crop,
            channels=settings.channels,
            channels_last=settings.channels_last,
            masks=settings.masks,
        )

    def fits(self, size: tuple) -> bool:
        """Can a batch of crops of ``size`` go in a slot (its images are no larger)?"""
        return size[0] * size[1] <= self.size[0] * self.size[1]

    def views(self, slot: int, n: int, size: tuple | None = None) -> tuple:
        """``(images, masks)`` of slot ``slot`` holding ``n`` crops of ``size`` (default the pool's;
        masks ``None`` without)."""
        (h, w), c = size or self.size, self.channels
        buf = self.bufs[slot]
        flat = buf[: n * c * h * w]
        images = flat.view(n, h, w, c) if self.channels_last else flat.view(n, c, h, w)
        if not self.mask_bytes:
            return images, None
        return images, buf[self.image_bytes : self.image_bytes + n * h * w].view(n, h, w)


class SlotLender:
    """The parent's side of a :class:`SlotPool` whose slots are handed out as the batches: which
    slot the next batch goes to (:meth:`acquire`, in batch order), and when it has arrived
    (:meth:`arrived`). A slot is free when no batch is being written to it and nothing outside the
    pool refers to its storage (the caller dropped every view of the batch it was lent)."""

    def __init__(self, pool: SlotPool):
        import torch

        self.pool = pool
        self._use_count = getattr(torch._C, "_storage_Use_Count", None)
        self._storages = [b.untyped_storage() for b in pool.bufs]  # held: the counts' baseline includes them
        self._idle = [self._count(k) for k in range(pool.slots)]
        self.writing: list[int | None] = []  # the slots of the batches asked for and not yet arrived, in order
        self._next = 0
        #: batches that found every slot held (sent as torch sends tensors)
        self.unslotted = 0

    def _count(self, k: int) -> int:
        return self._use_count(self._storages[k]._cdata)

    @property
    def lends(self) -> bool:
        """Can slots be lent (torch tells a storage's use count)?"""
        return self._use_count is not None

    def acquire(self) -> int | None:
        """A free slot for the next batch (round robin from the last one), or ``None`` when the caller
        holds every slot that is not being written (the batch then travels as torch sends tensors)."""
        busy = set(self.writing)
        n = self.pool.slots
        slot = None
        for step in range(n):
            k = (self._next + step) % n
            if k not in busy and self._count(k) == self._idle[k]:
                slot, self._next = k, (k + 1) % n
                break
        self.writing.append(slot)
        self.unslotted += slot is None
        return slot

    def arrived(self) -> int | None:
        """The slot of the batch that arrived now (the oldest one asked for)."""
        return self.writing.pop(0)

    def reset(self) -> None:
        """A new iteration: the batches asked for before are gone (the DataLoader drained them)."""
        self.writing.clear()


def copy_out(view: Any, pin: bool = False) -> Any:
    """A new tensor holding ``view`` (a slot's batch), pinned for a CUDA device. A numpy copy: torch's
    ``copy_`` runs on its intra-op threads, 2-8x the CPU time here."""
    import torch

    if view is None:
        return None
    out = torch.empty(view.shape, dtype=torch.uint8, pin_memory=pin)
    np.copyto(out.numpy(), view.numpy())
    return out


__all__ = ["SlotLender", "SlotPool", "copy_out"]
