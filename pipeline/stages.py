"""The Loader's stages, each with a small contract: the split source (local shards, or a URL's
through the cache) and the decode stage (the backend's runner, the pixel tier, what a runner is
given). The order is :mod:`.order`'s, the batch plan (header guard, stand-ins, crop boxes)
:func:`.backends.base.plan_batch`'s, the train recipe :mod:`.augment.apply`'s; the
:class:`~.loader.Loader` holds them and is the iteration and its state.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from stoker.errors import ArgumentError, LoaderError

from .augment import CropSpec
from .backends.base import DecodeSettings, Runner, next_loadable
from .cache import ShardCache, is_url
from .deps import usable_cores
from .options import Resolved, Storage
from .pixels import PixelCache
from .shards.samples import SampleIndex, open_split
from .shards.stats import TargetStats


class SplitSource:
    """A split's samples: :attr:`index` over a local split's shards, or over a URL's shards in the
    local :attr:`cache` (``None`` for a local split), fetched whole and checked against the
    manifest's size and sha256 before use. A local split's shards are checked (sizes, ``.idx``;
    sha256 with ``storage.sha256``) before any batch."""

    def __init__(self, path: Any, storage: Storage):
        self.remote = is_url(path)
        if not self.remote:
            storage.check_local(path)
        #: the split's folder, or its URL (no trailing slash)
        self.path: Path | str = str(path).rstrip("/") if self.remote else Path(path)
        self.cache: ShardCache | None = None
        self._target_stats: TargetStats | None = None  # computed once for a split whose manifest has none
        if self.remote:
            self.cache = ShardCache(
                self.path,
                storage_options=storage.storage_options,
                cache_dir=storage.cache_dir,
                cache_limit=storage.cache_limit,
            )
            self.index: SampleIndex = SampleIndex(self.cache.dir, self.cache.open(), manifest_sizes=True)
        else:
            self.index = open_split(self.path, sha256=storage.sha256)

    def target_stats(self) -> TargetStats | None:
        """Float targets: their count, mean, std, min and max per column over this split
        (:class:`~.shards.targets.TargetStats`), as ``stoker pack`` recorded them (read from the
        targets once when the manifest has none). A mask split: the classes its masks hold. Else
        ``None``. Standardize with them so targets in natural units learn:
        ``loss = mse(model(x), stats.standardize(y))``, and ``stats.restore(model(x))`` predicts."""
        target = self.index.target
        if target.stats is not None or target.spatial:  # a mask's would need every mask decoded
            return target.stats
        if self._target_stats is None:
            self._target_stats = self.index.target_stats()
        return self._target_stats

    def close(self) -> None:
        self.index.close()
        if self.cache is not None:
            self.cache.close()


class DecodeStage:
    """The backend decode stage of a Loader: its runner (made at the first batch, and again when a
    new crop needs a new pipeline), the pixel tier's store, and the :class:`DecodeSettings` a
    runner is given.

    Args:
        resolved: the backend on the Loader's device (:meth:`.options.BackendOptions.resolve`).
        index, path, device, batch_size, train: the Loader's.
        stand_in: the Loader's stand-in rule for a train batch with nothing loadable.
        pixel_cache: a folder or a :class:`~.pixels.PixelCache`, or ``None``.
    """

    def __init__(
        self,
        resolved: Resolved,
        *,
        index: SampleIndex,
        path: Any,
        device: Any,
        batch_size: int,
        train: bool,
        stand_in: Callable[[np.ndarray], np.ndarray],
        pixel_cache: Any,
    ):
        self.resolved = resolved
        opts = resolved.options
        #: decode threads / pillow worker processes, resolved (default: usable cores)
        self.threads = usable_cores() if opts.threads is None else opts.threads
        self._fixed = dict(
            index=index,
            path=str(path),
            device=device,
            batch_size=batch_size,
            train=train,
            channels_last=bool(opts.channels_last),
            threads=self.threads,
            prefetch=opts.prefetch,
            **{**opts.knobs(), "decode": resolved.decode},
            stand_in=stand_in,
            channels=opts.channels,
        )
        #: the decoded-pixel tier (:class:`~.pixels.PixelCache`), or ``None``
        self.pixel_cache = PixelCache.of(pixel_cache)
        self.store = None  # the pixel tier's store, opened once
        self.runner: Runner | None = None
        self._runner_crops: CropSpec | None = None

    def settings(self, crops: CropSpec) -> DecodeSettings:
        """What a runner is given, at the crop recipe ``crops``."""
        return DecodeSettings(crops=crops, **self._fixed)

    def runner_for(self, crops: CropSpec) -> Runner:
        """The runner at ``crops``: one that takes a new crop with each batch is told; one whose
        pipeline is built for one crop size is made again."""
        # (a runner set from outside, e.g. a test's, counts as made at the current crop)
        if self.runner is not None and self._runner_crops not in (None, crops):
            set_crops = getattr(self.runner, "set_crops", None)
            if set_crops is not None:
                set_crops(crops)
            else:
                self.runner.close()
                self.runner = None
        if self.runner is None:
            settings = self.settings(crops)
            if self.pixel_cache is not None:
                from .pixels import make_runner

                self.runner = make_runner(settings, self.pixel_cache, lambda: self.open_store(crops))
            else:
                self.runner = self.resolved.backend.make_runner(settings)
        self._runner_crops = crops
        return self.runner

    def open_store(self, crops: CropSpec):
        """The pixel tier's store, opened once (a URL's split: at the first batch, its shards local)."""
        if self.store is None:
            from .pixels import open_store

            self.store = open_store(self.settings(crops), self.pixel_cache)
        return self.store

    def check_pixel_tier(self, source: SplitSource, shuffle: str, crops: CropSpec) -> None:
        """The pixel tier's checks before any batch: a URL's block order never has the whole split
        locally; a local split's store opens here (pixels that cannot fit are one line)."""
        if self.pixel_cache is None:
            return
        if source.cache is not None and shuffle == "block":
            raise ArgumentError(
                "pixel_cache= lays out the whole split, which a URL's shuffle='block' never has locally "
                "at once: use shuffle='global' (or a local copy of the split)"
            )
        if source.cache is None:
            self.open_store(crops)  # the size check, before any batch

    def close(self) -> None:
        runner, self.runner = self.runner, None
        if runner is not None:
            runner.close()
        if self.store is not None:
            self.store.close()


class LoaderIterator:
    """What ``iter(loader)`` returns: the rest of the Loader's current epoch, one batch per
    ``next()``. A Loader runs one iteration at a time: a newer ``iter(loader)`` (or
    ``load_state_dict``/``close``) replaces this one, whose ``next()`` then raises instead
    of ending as if the epoch were over."""

    def __init__(self, loader: Any):
        self._path = loader.path
        self._gen = loader._iterate()
        self._superseded = False

    def __iter__(self) -> LoaderIterator:
        return self

    def __next__(self):
        if self._superseded:
            raise LoaderError(
                f"this iterator over {self._path} was replaced by a newer iter(loader): a Loader "
                "runs one iteration at a time (use a second Loader to read the split twice at once)"
            )
        return next(self._gen)

    def close(self) -> None:
        """Stop now (the producer thread and the decode pipeline's queue are drained)."""
        self._gen.close()

    def _supersede(self) -> None:
        self._superseded = True
        self._gen.close()


def stand_ins(loader: Any, planned: np.ndarray) -> np.ndarray:
    """The batch planner's stand-ins for a train batch of ``loader`` none of whose ``planned``
    samples is loadable: the next ones of this rank's epoch order (wrapping around) that pass the
    header guard, from the shards fetched for this window only (block mode from a URL)."""
    seed, epoch, offset, index, sample_order = loader.seed, loader.epoch, loader.offset, loader.index, loader.order
    k = sample_order.rank_position(seed, epoch, offset, index.valid_position(int(planned[-1])))
    after = (index.valid_at(p) for p in sample_order.following(seed, epoch, offset, k))
    picked = next_loadable(index, after, len(planned), loader._usable)
    if not len(picked):
        raise RuntimeError(
            f"stoker Loader {loader.path}: no sample of rank {loader.rank}'s share "
            f"passes the image header check (run `stoker verify {loader.path}`)"
        )
    return picked


__all__ = ["DecodeStage", "LoaderIterator", "SplitSource", "stand_ins"]
