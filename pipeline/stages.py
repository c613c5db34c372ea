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

from .augment import CropSpec
from .backends.base import DecodeSettings, Runner
from .cache import ShardCache, is_url
from .deps import usable_cores
from .options import Resolved, Storage
from .pixels import PixelCache
from .shards.samples import SampleIndex, open_split


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
        if self.runner is not None and self._runner_crops != crops:
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

    def close(self) -> None:
        runner, self.runner = self.runner, None
        if runner is not None:
            runner.close()
        if self.store is not None:
            self.store.close()


__all__ = ["DecodeStage", "SplitSource"]
