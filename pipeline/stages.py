"""The Loader's stages, each with a small contract: the split source (local shards, or a URL's
through the cache), the order stage (:func:`sample_order`, this rank's :mod:`.order`, checked),
the crop stage (the crop recipe, its schedule, what a state records of it) and the decode stage
(the backend's runner, the pixel tier, what a runner is given). The batch plan (header guard,
stand-ins, crop boxes) is :func:`.backends.base.plan_batch`'s, the train recipe
:mod:`.augment.apply`'s; the :class:`~.loader.Loader` holds them and is the iteration and its state.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from stoker.errors import ArgumentError, LoaderError

from . import order
from .augment import CropSpec
from .backends.base import DecodeSettings, Runner, next_loadable
from .backends.letterbox import letterboxed
from .cache import ShardCache, is_url
from .deps import usable_cores
from .loader_checks import check_cache_limit, check_every_rank_has_a_batch, check_stored_size
from .options import Order, Resolved, Storage, resized
from .pixels import PixelCache
from .shards.manifest import Manifest
from .shards.samples import SampleIndex, open_split
from .shards.stats import TargetStats


class SplitSource:
    """A split's samples: :attr:`index` over a local split's shards, or over a URL's shards in the
    local :attr:`cache` (``None`` for a local split), fetched whole and checked against the
    manifest's size and sha256 before use. A local split's shards are checked (sizes, ``.idx``;
    sha256 with ``storage.sha256``) before any batch."""

    #: the sampling policy that orders it: the one ``shuffle=`` names (:mod:`.policies`)
    role = "shuffle"

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
        # pread, not maps: a shard truncated while an epoch reads it (a `cp` over it) is then one
        # line naming it on every backend, where a read through a map is a SIGBUS with nothing said
        self.index.mapped = False

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

    def check_cache_limit(self, sample_order: order.SampleOrder, *, seed: int, block_shards: int) -> None:
        """A URL's cache limit holds the shards ``sample_order`` needs at once (one line if not); a
        local split has nothing to check."""
        if self.cache is not None:
            limit, index = self.cache.cache_limit, self.index
            check_cache_limit(limit, sample_order, index, seed=seed, block_shards=block_shards, path=self.path)

    def close(self) -> None:
        self.index.close()
        if self.cache is not None:
            self.cache.close()


def sample_order(
    options: Order, source: Any, *, rank: int, world_size: int, train: bool, batch_size: int
) -> order.SampleOrder:
    """The order stage: this rank's sample order over ``source``'s loadable samples, made by its
    sampling policy (:mod:`.policies`: the one ``shuffle=`` names for a split, a mix's for a mix;
    ``drop_last`` by default for train only), checked to give every rank a batch."""
    from .policies import get_policy

    drop_last = train if options.drop_last is None else bool(options.drop_last)
    role = source.role
    policy = get_policy(options.shuffle if role == "shuffle" else role, role)
    kw = {"rank": rank, "world_size": world_size, "train": train, "batch_size": batch_size, "drop_last": drop_last}
    made = policy.order(source, options, **kw)
    check_every_rank_has_a_batch(made, num_samples=made.num_samples, path=source.path)
    return made


class CropStage:
    """The crop recipe a Loader's batches are cut with: :attr:`crops` now, :attr:`crop` its size as
    given, the :attr:`schedule` :meth:`~.loader.Loader.set_crop` set (a callable of the epoch,
    applied at each epoch's start), and the size a mid-epoch state records when it is not the one
    the Loader was made with (:attr:`initial`). A new size is checked against the sizes the split
    stores (:func:`.loader_checks.check_stored_size`) by the method that takes it, called straight
    from the Loader's, so the warning's stack level counts the same calls as in the Loader.

    Args:
        crops: the crop recipe the Loader was made with (the Loader checks it).
        crop: the Loader's ``crop=`` (a side, ``(height, width)`` or that recipe).
        manifest, train, path: the split's manifest, and the Loader's.
    """

    def __init__(self, crops: CropSpec, crop: Any, *, manifest: Manifest, train: bool, path: Any):
        self._check = functools.partial(check_stored_size, manifest=manifest, train=train, path=path)
        #: the crop recipe (:class:`~.augment.CropSpec`); :attr:`crop` the size as given
        self.crops, self.crop = crops, crop.size if isinstance(crop, CropSpec) else crop
        self.initial = crops  # a state saved mid-epoch at another crop says so
        self.schedule: Callable[[int], Any] | None = None

    def set(self, crop: Any, epoch: int) -> None:
        """A side, ``(height, width)`` or a whole recipe from now on; or a schedule (a callable of
        the epoch), at ``epoch`` now and at every epoch's start."""
        if callable(crop) and not isinstance(crop, CropSpec):
            self.schedule = crop
            crop = crop(epoch)
        else:
            self.schedule = None
        if self._resized(crop):
            self._check(self.crops, crop=self.crop)

    def start_epoch(self, epoch: int) -> None:
        """An epoch starts: the schedule's crop for it, if there is a schedule."""
        if self.schedule is not None and self._resized(self.schedule(epoch)):
            self._check(self.crops, crop=self.crop)

    def state(self, position: int) -> dict:
        """What a state saved ``position`` samples into an epoch records: mid-epoch at a crop set
        since the Loader was made, that crop's size (the rest of the epoch resumes at it)."""
        if position and self.crops.size != self.initial.size:
            return {"crop": list(self.crops.size)}
        return {}

    def restore(self, state: dict) -> None:
        """A mid-epoch ``state``'s crop: the size it records, else the one the Loader was made with."""
        if self._resized(tuple(state["crop"]) if "crop" in state else self.initial.size):
            self._check(self.crops, crop=self.crop)

    def _resized(self, crop: Any) -> bool:
        """Take the output size ``crop`` (the train crop's scale and ratio and the val resize rule
        stay); whether the recipe changed."""
        crops = resized(self.crops, crop)
        if crops == self.crops:
            return False
        self.crops, self.crop = crops, crops.size[0] if crops.size[0] == crops.size[1] else crops.size
        return True


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
        #: the bucketed order's :class:`~.order.buckets.Buckets` (``buckets=``), else ``None``
        self.buckets = None

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
            if self.buckets is not None:  # a runner per bucket, each made here at its bucket's recipe
                from .bucketing import BucketRunner

                self.runner = BucketRunner(self.buckets, crops, self.make_runner)
            else:
                self.runner = self.make_runner(crops)
        self._runner_crops = crops
        return self.runner

    def make_runner(self, crops: CropSpec) -> Runner:
        """A new runner at the crop recipe ``crops`` (the pixel tier's, when there is one; the val
        letterbox around it where the recipe places its crops)."""
        settings = self.settings(crops)
        if self.pixel_cache is not None:
            from .pixels import make_runner

            runner = make_runner(
                settings, self.pixel_cache, lambda: self.open_store(crops), jpeg=self.resolved.backend.make_runner
            )
        else:
            runner = self.resolved.backend.make_runner(settings)
        return letterboxed(runner, settings)  # the val letterbox, on every backend

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


class ActiveIteration:
    """A Loader's one iteration at a time: the newest :class:`LoaderIterator`, held weakly (an
    iterator its caller drops is closed at once), replaced by the next ``iter(loader)``,
    ``load_state_dict`` or ``close``."""

    def __init__(self) -> None:
        self._ref: weakref.ref | None = None

    def start(self, it: LoaderIterator) -> LoaderIterator:
        """``it`` is now the Loader's iteration (the one before it was superseded already)."""
        self._ref = weakref.ref(it)
        return it

    def supersede(self) -> None:
        """Close the current iteration, if one is alive: its ``next()`` raises from now on."""
        it = self._ref() if self._ref is not None else None
        self._ref = None
        if it is not None:
            it._supersede()


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


def describe(loader: Any) -> str:
    """A Loader's ``repr``: its split and the settings that pick and shape its batches."""
    return (
        f"Loader({str(loader.path)!r}, batch_size={loader.batch_size}, train={loader.train}, "
        f"crop={loader.crop}, device={str(loader.device)!r}, backend={loader.backend!r}, "
        f"decode={loader.decode!r}, shuffle={loader.shuffle!r}, rank={loader.rank}, "
        f"world_size={loader.world_size}, num_samples={loader.num_samples})"
    )


__all__ = [
    "ActiveIteration",
    "CropStage",
    "DecodeStage",
    "LoaderIterator",
    "SplitSource",
    "describe",
    "sample_order",
    "stand_ins",
]
