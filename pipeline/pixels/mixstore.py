"""The decoded-pixel store of a mix (``Loader([a, b], pixel_cache=DIR)``): one
:class:`~.store.PixelStore` per split under ``DIR`` (each in its own ``<split>-<hash>`` folder,
as the split alone has it, so a split's pixels are shared by every mix and every Loader of it),
read through the mix's sample numbering (sample ``g`` of the mix is sample ``g - start[s]`` of
split ``s``: :class:`~..mixsource.MixIndex`). A budget applies to each split's store.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .store import PixelStore


class MixPixelStore:
    """Several splits' :class:`~.store.PixelStore` as one, numbered as the mix numbers samples.

    Args:
        parts: the mix's splits' indexes (:attr:`MixIndex.parts <..mixsource.MixIndex>`), in order.
        open_part: opens one split's store from its index.
    """

    def __init__(self, parts: Sequence[Any], open_part: Callable[[Any], PixelStore]):
        self.stores: list[PixelStore] = []
        try:
            for index in parts:
                self.stores.append(open_part(index))
        except BaseException:
            self.close()
            raise
        first = self.stores[0]
        self.channels, self.pixel_format, self.masks = first.channels, first.pixel_format, first.masks
        #: where each split's samples begin (and the total)
        self.starts = np.cumsum([0, *(s.num_samples for s in self.stores)])
        self.num_samples = int(self.starts[-1])
        #: every sample's stored (width, height), the mix's numbering
        self.wh = np.concatenate([s.wh for s in self.stores])

    def _route(self, ids) -> tuple[np.ndarray, np.ndarray]:
        ids = np.asarray(ids, np.int64)
        split = np.searchsorted(self.starts, ids, side="right") - 1
        return split, ids - self.starts[split]

    def _one(self, i: int) -> tuple[PixelStore, int]:
        s = int(np.searchsorted(self.starts, i, side="right") - 1)
        return self.stores[s], int(i - self.starts[s])

    def _each(self, ids, method: str) -> np.ndarray:
        split, local = self._route(ids)
        out = np.zeros(len(local), bool)
        for s in np.unique(split).tolist():
            sel = split == s
            out[sel] = getattr(self.stores[s], method)(local[sel])
        return out

    def filled(self, ids) -> np.ndarray:
        """Which of ``ids`` are in their split's store, whole."""
        return self._each(ids, "filled")

    def can_cache(self, ids) -> np.ndarray:
        """Which of ``ids`` their split's store keeps once decoded."""
        return self._each(ids, "can_cache")

    def pixels(self, i: int) -> np.ndarray:
        store, j = self._one(i)
        return store.pixels(j)

    def mask(self, i: int) -> np.ndarray:
        store, j = self._one(i)
        return store.mask(j)

    def put(self, i: int, pixels: Any, mask: np.ndarray | None = None) -> bool:
        store, j = self._one(i)
        return store.put(j, pixels, mask)

    def seal(self) -> bool:
        """Each split's store sealed where complete; True when all are."""
        return all([s.seal() for s in self.stores])  # a list: every store gets its seal

    def seal_soon(self) -> None:
        """Each split's store sealed in a thread where complete (:meth:`.PixelStore.seal_soon`)."""
        for s in self.stores:
            s.seal_soon()

    def join_seal(self) -> None:
        for s in self.stores:
            s.join_seal()

    @property
    def cacheable(self) -> int:
        return sum(s.cacheable for s in self.stores)

    def stats(self) -> dict:
        """The stores' state summed (``dir``: their folders, joined by `` + ``)."""
        each = [s.stats() for s in self.stores]
        out = {k: sum(e[k] for e in each) for k in ("samples", "cacheable", "filled", "bytes")}
        return {"dir": " + ".join(e["dir"] for e in each), **out}

    def close(self) -> None:
        for s in self.stores:
            with contextlib.suppress(OSError):
                s.close()


__all__ = ["MixPixelStore"]
