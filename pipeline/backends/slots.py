"""Batch buffers shared with worker processes (:class:`SlotPool`), made before the workers start.

The worker of batch ``k`` writes it into slot ``k % slots`` and the parent copies it out as it
arrives. A shared-memory segment made per batch, as torch's DataLoader workers send tensors, cost
0.23 ms an image on the development machine (the segment's creation and its pages' first touch in
both processes): more than cropping the image. ``slots`` exceeds the batches a DataLoader keeps in
flight (``prefetch_factor`` per worker), so a slot is written again only after the parent copied it.
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
        self.buf = torch.empty(slots * (self.image_bytes + self.mask_bytes), dtype=torch.uint8).share_memory_()

    @classmethod
    def for_settings(cls, settings: Any, size: tuple | None = None) -> SlotPool:
        """The pool of a runner's :class:`~.base.DecodeSettings` (its crop, or ``size``): the batches
        its DataLoader keeps in flight, and two more."""
        in_flight = max(1, settings.prefetch) * max(1, settings.threads)
        return cls(
            in_flight + 2,
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
        base = slot * (self.image_bytes + self.mask_bytes)
        flat = self.buf[base : base + n * c * h * w]
        images = flat.view(n, h, w, c) if self.channels_last else flat.view(n, c, h, w)
        if not self.mask_bytes:
            return images, None
        base += self.image_bytes
        return images, self.buf[base : base + n * h * w].view(n, h, w)


def copy_out(view: Any, pin: bool = False) -> Any:
    """A new tensor holding ``view`` (a slot's batch), pinned for a CUDA device. A numpy copy: torch's
    ``copy_`` runs on its intra-op threads, 2-8x the CPU time here."""
    import torch

    if view is None:
        return None
    out = torch.empty(view.shape, dtype=torch.uint8, pin_memory=pin)
    np.copyto(out.numpy(), view.numpy())
    return out


__all__ = ["SlotPool", "copy_out"]
