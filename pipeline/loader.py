"""``Loader``: uint8 batches from stoker shards, in an exact, resumable, distributed order.

>>> loader = Loader("out/train", batch_size=256, train=True, crop=224, device="cuda", seed=0)
>>> for epoch in range(epochs):
...     loader.set_epoch(epoch)
...     for images, targets in loader:   # uint8 [N, 3, crop, crop] on device; int64 classes
...         ...

The targets are the split's kind (:mod:`.shards.targets`): int64 classes, float32 values or
multi-hot rows, or uint8 masks ``[N, H, W]`` that get exactly their image's crop and flip.

The Loader is composed of stages and is itself only the iteration and its state: split source
(:class:`.stages.SplitSource`; a URL's shards through :mod:`.cache`, a window ahead) → order
(:mod:`.order`) → batch planner (header guard, stand-ins, crop boxes:
:func:`.backends.base.plan_batch`; boxes and flips from :mod:`.augment`, so every backend and a
resumed run see the same crops) → backend decode (:class:`.stages.DecodeStage`) → train recipe
(:mod:`.augment.apply`). Options live in the objects that own them (:mod:`.options`).
"""

from __future__ import annotations

import functools
import warnings
import weakref
from typing import Any

import numpy as np

from stoker.errors import ArgumentError, LoaderError, NoBatchError

from . import order
from .augment import CropSpec
from .backends import Backend
from .backends.base import DecodeSettings, Runner
from .dataloader_compat import DataLoaderSurface, LoaderBatchSampler, LoaderDataset, LoaderSampler
from .fsutil import PathLike
from .loader_checks import (
    DECODES,
    SHUFFLES,
    check_cache_limit,
    check_every_rank_has_a_batch,
    check_stored_size,
    rank_and_world,
    torch_device,
)
from .options import BackendOptions, Order, Storage, loader_options, resized
from .pixels import PixelCache
from .prefetch import cached_groups
from .shards.stats import TargetStats
from .stages import DecodeStage, LoaderIterator, SplitSource, stand_ins


class Loader(DataLoaderSurface):
    """Iterate ``(images, targets)`` batches over a split written by ``stoker pack``.

    Args:
        path: a split directory (``stoker.json`` + shards + ``.idx``), or its fsspec URL
            (``s3://bucket/ds/train``, ``gs://...``, ``https://...``, ``file://...``): shards
            are then fetched whole into a local cache and checked against the manifest's
            size and sha256 before use.
        batch_size: samples per batch (the last val batch may be smaller).
        train: RandomResizedCrop + flip and a fresh permutation each epoch; else the val
            transform (shorter side to ``crop/crop_pct``, center crop) in stored order.
        crop: output side in pixels, or ``(height, width)``, or the whole crop recipe
            (:class:`~.augment.CropSpec`: ``scale``, ``ratio``, ``crop_pct``, ``val_resize``).
        device: where the batches land (``"cpu"``, ``"cuda"``, ``"cuda:1"``, a ``torch.device``).
        seed: seeds the order and the augmentation.
        rank, world_size: this process's share; default from ``torch.distributed`` when
            initialized, else 0 / 1.
        backend: :class:`~.options.Dali`, :class:`~.options.Nvjpeg`, :class:`~.options.Pil`,
            :class:`~.options.Auto` (each with its own knobs), a name (that object with defaults, or
            a backend registered by name) or a configured registry backend
            (``get_backend("nvjpeg", overlap=False)``). ``"auto"``: DALI when installed, else nvjpeg
            on CUDA where a GPU JPEG decoder works, else pil; :attr:`backend_reason` says why.
        shuffle: ``"global"``, ``"block"``, or the whole :class:`~.options.Order`.
        augment: train batches' augmentation on their device: a transform of :mod:`.augment`, a
            policy name (``"rand-m9-mstd0.5-inc1"``) or an :class:`~.options.Augmentation`.
        storage: a URL's cache and a local split's sha256 checks (:class:`~.options.Storage`).
        pixel_cache: a folder or a :class:`~.pixels.PixelCache`: the decoded-pixel tier (the first
            epoch decodes each sample into a memory-mapped store; later epochs crop from it).
        **options: a field of those objects given alone (``threads``, ``prefetch``, ``channels``,
            ``channels_last``, ``scale``, ``ratio``, ``crop_pct``, ``val_resize``,
            ``block_shards``, ``drop_last``, ``mixing``, ``storage_options``, ``cache_dir``,
            ``cache_limit``, ``sha256``): handed to the object that owns it.

    Samples that fail at run time (the image header check; with ``backend="pil"`` also the
    decoder; DALI raises, naming the shards and keys) are dropped from their batch and counted in
    :attr:`skipped`; batches are fixed slices of this rank's order, so ``len(loader)`` is exact and
    a ``state_dict`` position stays a sample count. A train batch none of whose samples passes the
    header check is filled with stand-ins (the next samples of this rank's epoch order that pass
    it), so every rank takes ``len(loader)`` steps and DDP's collectives stay matched; a val one is
    yielded empty (``[0, C, H, W]``), so every loadable sample is counted exactly once.

    Raises:
        ManifestError: a shard is missing, truncated or (with ``sha256``) corrupt; names it.
        ValueError: a bad argument value, named in the message (:class:`~stoker.errors.ArgumentError`).
    """

    def __init__(
        self,
        path: PathLike,
        *,
        batch_size: int,
        train: bool = True,
        crop: int | tuple[int, int] | CropSpec = 224,
        device: str | Any = "cpu",
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        backend: str | BackendOptions | Backend = "auto",
        shuffle: str | Order = "global",
        augment: Any = None,
        storage: Storage | None = None,
        pixel_cache: PathLike | PixelCache | None = None,
        **options: Any,
    ):
        opts = loader_options(
            crop=crop, backend=backend, shuffle=shuffle, storage=storage, augment=augment, keywords=options
        )
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ArgumentError(f"batch_size={batch_size!r} must be a positive integer")
        self.device = torch_device(device)
        resolved = opts.backend.resolve(self.device)
        #: the configured registry backend (:class:`~.backends.Backend`); :attr:`backend` is its name;
        #: :attr:`backend_options` the option object it was asked as
        self.backend_config, self.backend_reason = resolved.backend, resolved.reason
        self.backend, self.backend_options, self.decode = resolved.backend.name, opts.backend, resolved.decode
        self.rank, self.world_size = rank_and_world(rank, world_size)
        #: the crop recipe (:class:`~.augment.CropSpec`); :attr:`crop` the size as given
        self.crops, self.crop = opts.crops, crop.size if isinstance(crop, CropSpec) else crop
        self.batch_size, self.train, self.seed = batch_size, bool(train), int(seed)
        self.shuffle, self.block_shards = opts.order.shuffle, opts.order.block_shards
        self.drop_last = self.train if opts.order.drop_last is None else bool(opts.order.drop_last)
        self.channels = opts.backend.channels
        self.source = SplitSource(path, opts.storage)
        self.path, self.index, self.cache = self.source.path, self.source.index, self.source.cache
        #: samples the loader draws from (manifest skips and samples without image/cls removed)
        self.num_samples = self.index.num_valid
        if self.num_samples == 0:
            raise ArgumentError(f"{self.path} has no loadable samples")
        #: this rank's sample order (:mod:`.order`): share, positions, windows, what a state holds
        self.order = order.make_order(
            self.shuffle,
            self.index.valid_counts(),
            block_shards=self.block_shards,
            rank=self.rank,
            world_size=self.world_size,
            train=self.train,
            batch_size=self.batch_size,
            drop_last=self.drop_last,
        )
        check_every_rank_has_a_batch(self.order, num_samples=self.num_samples, path=self.path)
        #: the train batches' per-sample augmentation and mixing (:mod:`.augment.apply`)
        self.recipe = opts.augmentation.recipe(train=self.train, index=self.index, path=self.path)
        self.augment, self.mixing = self.recipe.augment, self.recipe.mixing
        check_stored_size(self.crops, self.index.manifest, train=self.train, crop=self.crop, path=self.path)
        self._initial_crops, self._crop_schedule = self.crops, None  # a state saved at another crop says so
        if self.cache is not None:
            limit, shards = self.cache.cache_limit, self.block_shards
            check_cache_limit(limit, self.order, self.index, seed=self.seed, block_shards=shards, path=self.path)
        self.skipped_in_manifest = self.index.num_skipped  #: excluded up front (pack's skips, no image)
        self.skipped = 0  # samples dropped at run time this epoch (failed the header guard or decoding)
        self.epoch = self.position = self._offset = 0  # _offset: where this rank count's split begins
        self._finished = self._resumed = self._closed = False  # _resumed: position from load_state_dict
        self._active: weakref.ref | None = None  # weak: a dropped iterator is closed at once
        self._usable: set | None = None  # shards a stand-in may come from (block mode, URL)
        self.decoding = DecodeStage(
            resolved,
            index=self.index,
            path=self.path,
            device=self.device,
            batch_size=self.batch_size,
            train=self.train,
            stand_in=functools.partial(stand_ins, self),
            pixel_cache=pixel_cache,
        )
        self.threads, self.pixel_cache = self.decoding.threads, self.decoding.pixel_cache
        self.decoding.check_pixel_tier(self.source, self.shuffle, self.crops)

    # ---- order ---------------------------------------------------------------------------
    @property
    def offset(self) -> int:
        """Where this rank count's split of the current epoch begins: 0, or after a resume on
        another number of ranks, the samples the saved ranks had handed out (:mod:`.order`)."""
        return self._offset

    def __len__(self) -> int:
        """Batches this rank yields in a whole epoch (the same on every rank for train; for the
        epoch a resume on another number of ranks continues, the batches of its rest)."""
        return self.order.num_batches(self._offset)

    def indices(self, epoch: int | None = None) -> np.ndarray:
        """Global sample positions this rank reads in ``epoch`` (default: the current one),
        in order, before ``drop_last`` is applied."""
        epoch = self.epoch if epoch is None else epoch
        pick = self.order.positions(self.seed, epoch, self._offset if epoch == self.epoch else 0)
        return self.index.valid_at(pick)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iteration reads. The next iteration starts it at its first
        batch, except right after :meth:`load_state_dict` (it continues where the state says)."""
        epoch = order.non_negative(epoch, "epoch")
        if epoch != self.epoch or self._finished:
            self._start_epoch(epoch)

    def _start_epoch(self, epoch: int) -> None:
        self.epoch, self.position, self.skipped, self._finished = epoch, 0, 0, False
        self._resumed = False
        self._offset = 0  # a resume on another number of ranks sets it for its epoch
        if self._crop_schedule is not None:
            self._apply_crop(self._crop_schedule(epoch))

    # ---- resolution ----------------------------------------------------------------------
    def set_crop(self, crop: Any) -> None:
        """The output size from the next iteration on (between epochs; the train crop's scale and
        ratio and the val resize rule stay): a side, ``(height, width)``, a whole
        :class:`~.augment.CropSpec`, or a schedule, a callable of the epoch returning a side or
        ``(height, width)`` (:class:`~.augment.ProgressiveCrop`, FFCV's progressive resizing),
        applied at the start of every epoch. A state saved mid-epoch restores the crop it was
        saved at; the pixel tier's store holds stored sizes, so no crop refills it.

        Raises:
            ValueError: a bad size (named).
        """
        if callable(crop) and not isinstance(crop, CropSpec):
            self._crop_schedule = crop
            crop = crop(self.epoch)
        else:
            self._crop_schedule = None
        self._apply_crop(crop)

    def _apply_crop(self, crop: Any) -> None:
        crops = resized(self.crops, crop)
        if crops != self.crops:
            self.crops, self.crop = crops, crops.size[0] if crops.size[0] == crops.size[1] else crops.size
            check_stored_size(self.crops, self.index.manifest, train=self.train, crop=self.crop, path=self.path)

    # ---- resume --------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """``{seed, epoch, position, world_size, num_samples, batch_size}``: where the current (or
        last) iteration stands, so that ``load_state_dict`` of it continues there. ``position``
        counts the samples of ``epoch`` this rank has consumed; once an epoch's last batch is handed
        out the state names the next epoch at position 0. Ranks step in lockstep, so rank 0's state
        says where every rank is; ``offset``: where a resumed rank count's split began (:mod:`.order`)."""
        if self._finished:
            return self.order.state(seed=self.seed, epoch=self.epoch + 1, position=0, offset=0)
        state = self.order.state(seed=self.seed, epoch=self.epoch, position=self.position, offset=self._offset)
        if self.position and self.crops.size != self._initial_crops.size:
            state["crop"] = list(self.crops.size)  # mid-epoch at a crop set since: resumed at it
        return state

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state``: the next iteration yields exactly the rest of that epoch.

        The state's seed replaces the constructor's (the order and the augmentation are the
        saved run's; a warning says so when they differ). A train state saved with another number
        of ranks continues the same epoch on this one: the samples the saved ranks had not handed
        out yet, split over the new ranks, each exactly once (:mod:`.order`); keep the global
        batch (``batch_size * world_size``) to keep the steps per epoch. A val state from another
        number of ranks restarts its evaluation (every sample once); ``shuffle="block"`` resumes
        on the same number of ranks only.
        """
        seed, epoch, position, offset = self.order.restore(state, where=self.path)
        if seed != self.seed:
            warnings.warn(
                f"stoker Loader {self.path}: load_state_dict replaces seed={self.seed} with the state's seed={seed}",
                UserWarning,
                stacklevel=2,
            )
        self._close_active()
        self.seed = seed
        self._start_epoch(epoch)
        if position:  # mid-epoch: the rest of it at the crop it started with
            self._apply_crop(tuple(state["crop"]) if "crop" in state else self._initial_crops.size)
        self.position, self._offset = position, offset
        self._resumed = True  # a val loader continues a restored position once, too

    # ---- iteration -----------------------------------------------------------------------
    def __iter__(self) -> LoaderIterator:
        self._close_active()  # an abandoned iteration: drain it (the next one starts the epoch over)
        if self._closed:
            raise ArgumentError(f"this Loader of {self.path} was closed; create a new one")
        it = LoaderIterator(self)
        self._active = weakref.ref(it)
        return it

    def _close_active(self) -> None:
        it = self._active() if self._active is not None else None
        self._active = None
        if it is not None:
            it._supersede()

    def _iterate(self):
        if self._finished:  # iterated again without set_epoch: the next epoch
            self._start_epoch(self.epoch + 1)
        elif self.position and not self._resumed:
            # As a torch DataLoader does, every new iteration starts its epoch over: a peek at one
            # batch, a sanity check or a loop cut short never shortens the next full pass. Only a
            # state loaded by load_state_dict continues mid-epoch (once).
            self._start_epoch(self.epoch)
        self._resumed = False
        stop = self.order.stop(self._offset)
        batches = self._batches(self.position, stop)
        if not batches:  # resumed at the very end of an epoch (an older state): it is done
            self._finish_epoch(stop)
            self._start_epoch(self.epoch + 1)
            batches = self._batches(0, stop)
        runner = self.decoding.runner_for(self.crops)
        last = len(batches) - 1
        k = -1
        # a URL's shards come through the cache: all before the first batch, or a window at a time
        windows = self.order.windows(self.seed, self.epoch) if self.cache is not None else None
        groups = cached_groups(self.cache, batches, windows, self.index)
        try:
            for group, self._usable in groups:
                inner = runner.iterate(group, self.epoch, self.seed)
                try:
                    for batch in inner:
                        k += 1
                        self.position += batch.consumed
                        self.skipped += batch.skipped
                        if k == last:
                            # The epoch ends when its last batch is handed out, not when the caller
                            # asks for one more: loops bounded by len(loader) (Lightning, islice, zip
                            # with a range) never ask, and must still get a fresh epoch next time.
                            self._finish_epoch(stop)
                        yield self.recipe(batch, seed=self.seed, epoch=self.epoch)
                finally:
                    inner.close()  # now, not whenever the GC gets to it: stops the producer in order
        finally:
            groups.close()  # a window download in flight ends before the iteration does
            self._usable = None

    def _batches(self, start: int, stop: int) -> order.EpochBatches:
        """This epoch's batches from ``start`` (each computed when it is read)."""
        return self.order.batches(self.seed, self.epoch, self._offset, start, stop, self.index.valid_at)

    def epoch_batches(self) -> order.EpochBatches:
        """This rank's batches of the current epoch (arrays of the split's sample positions), from
        its first, ``drop_last`` applied: what an iteration decodes. Each is computed when read."""
        return self._batches(0, self.order.stop(self._offset))

    def _finish_epoch(self, stop: int) -> None:
        self.position = max(self.position, stop)
        self._finished = True
        if self.skipped:
            warnings.warn(
                f"stoker Loader {self.path}: epoch {self.epoch}: skipped {self.skipped} "
                f"undecodable sample(s) on rank {self.rank}",
                RuntimeWarning,
                stacklevel=4,
            )

    @property
    def target_stats(self) -> TargetStats | None:
        """The split's target statistics (:meth:`.stages.SplitSource.target_stats`): float targets'
        count, mean, std, min and max per column; a mask split's classes; else ``None``."""
        return self.source.target_stats()

    @property
    def runner(self) -> Runner | None:
        """The decode backend's runner (made at the first iteration; ``None`` before): its own
        figures, e.g. the nvjpeg runner's ``stage_totals``."""
        return self.decoding.runner

    def close(self) -> None:
        """Stop any iteration and release the decode pipeline and the shard maps. The Loader
        cannot be iterated afterwards. Also what ``with Loader(...) as loader:`` does on exit."""
        self._close_active()
        self.decoding.close()
        self.source.close()
        self._closed = True

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def pixel_store(self):
        """The pixel tier's :class:`~.pixels.PixelStore` (``None`` without ``pixel_cache``, or before
        a URL split's first batch): its ``stats()`` say how much of the split it holds."""
        return self.decoding.store

    def decode_settings(self) -> DecodeSettings:
        """What this Loader's decode backend is given (a runner of another backend can be made
        from it too: ``get_backend("nvjpeg").make_runner(loader.decode_settings())``)."""
        return self.decoding.settings(self.crops)

    def __repr__(self) -> str:
        return (
            f"Loader({str(self.path)!r}, batch_size={self.batch_size}, train={self.train}, "
            f"crop={self.crop}, device={str(self.device)!r}, backend={self.backend!r}, "
            f"decode={self.decode!r}, shuffle={self.shuffle!r}, rank={self.rank}, "
            f"world_size={self.world_size}, num_samples={self.num_samples})"
        )


__all__ = [
    "Loader",
    "LoaderError",
    "LoaderIterator",
    "NoBatchError",
    "LoaderDataset",
    "LoaderSampler",
    "LoaderBatchSampler",
    "DECODES",
    "SHUFFLES",
]
