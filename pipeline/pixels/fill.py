"""Filling the pixel store without slowing the first epoch: ``PixelCache(fill="background")``.

The Loader's epoch 0 runs its own JPEG path (its backend's runner: DALI decodes just the crop
regions) while one low-priority process (``nice 19``) decodes whole images into the store with
the CPU time that path leaves idle; every later epoch crops from the store
(:class:`~.cpu.PixelRunner`), decoding inline whatever the filler has not reached. So the first
epoch runs at the JPEG path's speed (the kernel gives a nice-19 process ~1.5% of a core the path
wants), where filling everything in it costs 10-35% (whole decodes instead of regions).

Which path serves an epoch depends on its number alone, never on how far the filler got or on
what an earlier run left in the store: epoch 0 always comes from the JPEG path, even from a full
store, so a run's batches are the same every time and a resumed run continues exactly
(``fill="inline"`` crops epoch 0 from the store too).

The filler writes as the runner's fill does (bytes, then the marker: a kill leaves whole samples
only) into the same shared store, so the ranks of a node fill it together; each starts at its own
place in the split, so they rarely decode the same sample.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ..backends.base import Batch, DecodeSettings, decode_masks, plan_batch

#: samples the filler plans at a time
CHUNK = 64


def missing_share(store: Any) -> float:
    """The share of the store's cacheable samples not filled yet."""
    st = store.stats()
    return 1.0 - st["filled"] / st["cacheable"] if st["cacheable"] else 0.0


def fill_store(settings: DecodeSettings, store: Any, start: int) -> int:
    """Decode every cacheable sample ``store`` lacks into it, from sample ``start`` round the split:
    the filler process's work (also callable in-process). Returns how many it wrote."""
    from ..imagedecode import DAMAGED_INPUT
    from .cpu import decode_whole

    s = dataclasses.replace(settings, stand_in=None, train=False)  # the whole image: no crop is drawn
    n = store.num_samples
    order = np.roll(np.arange(n, dtype=np.int64), -start % n if n else 0)
    wrote = 0
    for a in range(0, n, CHUNK):
        ids = order[a : a + CHUNK]
        ids = ids[store.can_cache(ids) & ~store.filled(ids)]
        if not len(ids):
            continue
        plan = plan_batch(s, ids, epoch=0, seed=0, stand_ins=False)  # the header guard, the bytes
        masks = decode_masks(plan) if s.masks else [None] * len(plan.ids)
        for j, i in enumerate(plan.ids.tolist()):
            if s.masks and masks[j] is None:
                continue  # a mask that does not decode: its sample is dropped wherever it is read
            try:
                im = decode_whole(plan.enc[j], s.channels)
            except DAMAGED_INPUT:
                continue
            wrote += bool(store.put(i, im.tobytes(), masks[j]))
    return wrote


def _filler_main(settings: DecodeSettings, store: Any, start: int, env: dict[str, str], cwd: str) -> None:
    from ..workers import as_parent, die_with_parent

    die_with_parent()
    as_parent(env, cwd)
    os.nice(19)  # the CPU the JPEG path leaves idle, never the path's own
    try:
        fill_store(settings, store, start)
    finally:
        store.close()


class BackgroundFill:
    """The filler process of one store (started once; it ends when the store is full)."""

    def __init__(self, settings: DecodeSettings, store: Any):
        self.settings, self.store = settings, store
        self.proc = None

    def start(self) -> None:
        """Start the filler, where it is not running yet (a no-op once it ended)."""
        if self.proc is not None:
            return
        from ..workers import check_not_bootstrapping, context, refers_to_main

        check_not_bootstrapping()
        settings = dataclasses.replace(self.settings, stand_in=None)
        ctx = context(main=refers_to_main(*map(type, vars(settings).values())))
        start = int.from_bytes(os.urandom(4), "little") % max(1, self.store.num_samples)  # ranks apart
        self.proc = ctx.Process(
            target=_filler_main,
            args=(settings, self.store, start, dict(os.environ), os.getcwd()),
            name="stoker-pixel-fill",
            daemon=True,
        )
        self.proc.start()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.is_alive()

    def stop(self) -> None:
        """Stop the filler now (what it wrote whole stays; a sample half written stays unmarked)."""
        if self.proc is not None and self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(5)
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join()


class FillingRunner:
    """The CPU pixel tier with ``fill="background"`` (a :class:`~..backends.base.Runner`): the JPEG
    path's runner and the :class:`BackgroundFill` for epoch 0, the :class:`~.cpu.PixelRunner`
    for every later epoch (see the module).

    Attributes:
        cropping: epochs come from the store now.
    """

    def __init__(self, settings: DecodeSettings, store: Callable[[], Any], jpeg: Callable[[], Any]):
        from .cpu import PixelRunner

        self.settings = settings
        self._open, self._make_jpeg = store, jpeg
        self.warm = PixelRunner(settings, store)
        self.jpeg = None
        self.filler: BackgroundFill | None = None
        self.cropping = False

    @property
    def store(self):
        return self.warm.store

    @property
    def decoded(self) -> int:
        return self.warm.decoded

    @property
    def from_store(self) -> int:
        return self.warm.from_store

    def set_crops(self, crops) -> None:
        """The crop recipe of the next iteration: the store's runner takes it; the JPEG path's is
        made again at it."""
        self.settings = dataclasses.replace(self.settings, crops=crops)
        self.warm.set_crops(crops)
        if self.jpeg is not None:
            self.jpeg.close()
            self.jpeg = None

    def expect(self, batches) -> None:
        """The next iteration's batches: the store's runner starts on them where they are past
        epoch 0 (see :meth:`.cpu.PixelRunner.expect`)."""
        if batches.epoch > 0:
            self.warm.expect(batches)

    def iterate(self, batches, epoch: int, seed: int) -> Iterator[Batch]:
        """One :class:`~..backends.base.Batch` per array of ``batches``: from the JPEG path in
        epoch 0 (the filler filling the store meanwhile), from the store in every later epoch."""
        if self.warm.store is None:
            self.warm.store = self._open()
        store = self.warm.store
        if epoch > 0 and not self.cropping:
            self._to_store()
        if self.cropping:
            yield from self.warm.iterate(batches, epoch, seed)
            return
        if missing_share(store) > 0:
            if self.filler is None:
                self.filler = BackgroundFill(self.settings, store)
            self.filler.start()
        if self.jpeg is None:
            self.jpeg = self._make_jpeg(self.settings)
        yield from self.jpeg.iterate(batches, epoch, seed)

    def _to_store(self) -> None:
        self.cropping = True  # the filler goes on with what is missing, at its low priority, until done
        if self.jpeg is not None:
            self.jpeg.close()
            self.jpeg = None

    def close(self) -> None:
        """Stop the filler, the JPEG path and the store's runner."""
        if self.filler is not None:
            self.filler.stop()
        if self.jpeg is not None:
            self.jpeg.close()
            self.jpeg = None
        self.warm.close()


__all__ = ["BackgroundFill", "FillingRunner", "fill_store", "missing_share"]
