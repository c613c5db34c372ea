"""``Loader``: uint8 batches from stoker shards, in an exact, resumable, distributed order.

>>> loader = Loader("out/train", batch_size=256, train=True, crop=224, device="cuda", seed=0)
>>> for epoch in range(epochs):
...     loader.set_epoch(epoch)
...     for images, targets in loader:   # uint8 [N, 3, crop, crop] on device; int64 classes
...         ...

The targets are the split's kind (:mod:`.shards.targets`): int64 classes, float32 values or
multi-hot rows, or uint8 masks ``[N, H, W]`` that get exactly their image's crop and flip.

The Loader is composed of stages and is itself only the iteration and its state: source
(:class:`.mixsource.MixSource`: one split or a mix, a :class:`.stages.SplitSource` each; a URL's
shards through :mod:`.cache`, a window ahead) → order
(:func:`.stages.sample_order`, :mod:`.order`) → batch planner (header guard, stand-ins, crop boxes:
:func:`.backends.base.plan_batch`; boxes and flips from :mod:`.augment`, so every backend and a
resumed run see the same crops; the crop recipe and its schedule: :class:`.stages.CropStage`) →
backend decode (:class:`.stages.DecodeStage`) → train recipe (:mod:`.augment.apply`). Options live
in the objects that own them (:mod:`.options`). The epochs and the resume state (``set_epoch``,
``state_dict``, ``load_state_dict``) are :class:`.state.EpochState`'s, a base of the Loader.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from typing import Any

import numpy as np

from stoker.errors import ArgumentError, LoaderError, NoBatchError

from . import order
from .augment import CropSpec
from .backends import Backend
from .backends.base import DecodeSettings, Runner
from .bucketing import bucketed
from .dataloader_compat import DataLoaderSurface, LoaderBatchSampler, LoaderDataset, LoaderSampler, habit_message
from .fsutil import PathLike
from .loader_checks import DECODES, SHUFFLES, check_stored_size, rank_and_world, torch_device, train_for_split
from .mixsource import MixSource, MixSpec, start_mix
from .options import MOVED, BackendOptions, Order, Source, Storage, loader_options
from .pixels import PixelCache
from .prefetch import cached_groups
from .shards.stats import TargetStats
from .stages import (
    ActiveIteration,
    CropStage,
    DecodeStage,
    LoaderIterator,
    describe,
    sample_order,
    stand_ins,
)
from .state import EpochState

#: the Loader's keywords that are a field of an option object given alone, or a mix's
_ALONE = (
    "threads",
    "prefetch",
    "channels",
    "channels_last",
    "scale",
    "ratio",
    "crop_pct",
    "val_resize",
    "block_shards",
    "drop_last",
    "mixing",
    "storage_options",
    "cache_dir",
    "cache_limit",
    "sha256",
    "weights",
    "epoch_length",
    "balance",
)


@functools.cache
def _keywords(cls: type) -> frozenset | None:
    """The keywords ``cls.__init__`` takes (``None``: any, a subclass's ``**kwargs``)."""
    params = inspect.signature(cls.__init__).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return frozenset(p.name for p in params)


class Loader(EpochState, DataLoaderSurface):
    """Iterate ``(images, targets)`` batches over a split written by ``stoker pack``.

    Args:
        path: a split directory (``stoker.json`` + shards + ``.idx``), or its fsspec URL
            (``s3://bucket/ds/train``, ``gs://...``, ``https://...``, ``file://...``): shards
            are then fetched whole into a local cache and checked against the manifest's
            size and sha256 before use. A :class:`~.options.Source` is a split with options of its
            own (``Source(url, weight=0.3, cache_dir=..., storage_options=...)``); a list of
            them (or of paths) is a mix.
        batch_size: samples per batch (the last val batch may be smaller).
        train: RandomResizedCrop + flip and a fresh permutation each epoch, and ``drop_last``;
            ``False``: the val transform (shorter side to ``crop/crop_pct``, center crop) in stored
            order, every sample once. ``None`` (the default): what the split is, as its manifest
            records it (``stoker pack`` writes ``val`` for ``OUT/val``); a split it does not name
            is trained on.
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
        weights, epoch_length, balance: a mix (``path`` a list of splits, or one split balanced):
            each split's proportion (default: its size), the samples an epoch (default: the
            splits' sum rounded down to whole global batches) and the balance inside each split
            (``"classes"`` or ``{class_index: weight}``); the quotas are exact every epoch on
            every rank (:mod:`.mixsource`, :attr:`mix`).
        threads, prefetch, channels, channels_last: the backend's (:class:`~.options.BackendOptions`),
            given alone; ``scale``, ``ratio``, ``crop_pct``, ``val_resize``: the crop recipe's
            (:class:`~.augment.CropSpec`); ``block_shards``, ``drop_last``: the order's
            (:class:`~.options.Order`); ``mixing``: the augmentation's; ``storage_options``,
            ``cache_dir``, ``cache_limit``, ``sha256``: the storage's (:class:`~.options.Storage`).
            Each is handed to the object that owns it (``None``: not given); given both alone and
            in its object, to another value, is one line. A keyword that moved (``decode=``,
            ``decoder=``, ...) or a torch DataLoader's (``num_workers=``, ...) is one line naming
            what to pass instead.
        buckets: every batch of one shape, chosen by each image's own aspect: ``"auto"`` (a few
            shapes of about the crop's area from the split's aspect histogram) or a list of
            ``(height, width)``. Train crops a random-resized-crop at the bucket's aspect, val
            resizes to the bucket; boxes and masks follow. Each epoch's samples are exact, every
            rank takes the same steps, a resume is exact on any number of ranks; the few samples
            that do not fill a bucket's last batch wait for another epoch (said once at start).
            Needs the image sizes ``stoker pack``/``stoker index`` record (:mod:`.order.buckets`).
        bucket_sync: every step's batches one bucket on all ranks (DDP step times match, a compiled
            model sees fewer shapes); a mid-epoch state then resumes on the same number of ranks.

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

    def __new__(cls, *args: Any, **kwargs: Any) -> Loader:
        # A keyword that moved into an option object, or a torch DataLoader habit, is one line
        # naming what to pass instead, before Python's bare TypeError for an unknown keyword.
        known = _keywords(cls)
        unknown = {k: v for k, v in kwargs.items() if known is not None and k not in known}
        if unknown:
            moved = [k for k in unknown if k in MOVED]
            if moved:
                k = moved[0]
                raise ArgumentError(f"Loader({k}=...) moved: pass {MOVED[k]} (from stoker.pipeline.options)")
            raise ArgumentError(habit_message(unknown))
        return super().__new__(cls)

    def __init__(
        self,
        path: PathLike | Source | Sequence[PathLike | Source],
        *,
        batch_size: int,
        train: bool | None = None,
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
        threads: int | None = None,
        prefetch: int | None = None,
        channels: int | None = None,
        channels_last: bool | None = None,
        scale: tuple[float, float] | None = None,
        ratio: tuple[float, float] | None = None,
        crop_pct: float | None = None,
        val_resize: float | None = None,
        block_shards: int | None = None,
        drop_last: bool | None = None,
        mixing: Any = None,
        storage_options: dict | None = None,
        cache_dir: PathLike | None = None,
        cache_limit: int | None = None,
        sha256: bool | None = None,
        weights: Sequence[float] | None = None,
        epoch_length: int | None = None,
        balance: str | dict | None = None,
        buckets: str | Sequence[tuple[int, int]] | None = None,
        bucket_sync: bool = False,
    ):
        # a field of an option object given alone (None: not given): handed to the object that owns it
        given = locals()
        options = {k: given[k] for k in _ALONE if given[k] is not None}
        # Loader([a, b], weights=, epoch_length=, balance=): a mix (pipeline/mixsource.py)
        mix = MixSpec.of(path, options)
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
        self.batch_size, self.seed = batch_size, int(seed)
        self.shuffle, self.block_shards = opts.order.shuffle, opts.order.block_shards
        self.channels = opts.backend.channels
        # one path: a split is a source of one (a path, a URL or a Source), a mix a source of several
        self.source = MixSource(mix if mix is not None else MixSpec.one(path), opts.storage)
        self.path, self.index, self.cache = self.source.path, self.source.index, self.source.cache
        self.train = train_for_split(train, self.index.manifest)
        #: samples the loader draws from (manifest skips and samples without image/cls removed)
        self.num_samples = self.index.num_valid
        if self.num_samples == 0:
            raise ArgumentError(f"{self.path} has no loadable samples")
        #: this rank's sample order (:mod:`.order`): share, positions, windows, what a state holds
        self.order = sample_order(
            opts.order, self.source, rank=self.rank, world_size=self.world_size, train=self.train, batch_size=batch_size
        )
        if buckets is not None:  # every batch one shape, by the images' own aspect (pipeline/bucketing.py)
            base = None  # a mix's or a balance's epoch, read whole as on one rank at the global batch
            if mix is not None and self.train:
                whole = {"rank": 0, "world_size": 1, "train": True, "batch_size": batch_size * self.world_size}
                base = sample_order(opts.order, self.source, **whole)
            self.order = bucketed(
                buckets, inner=self.order, base=base, shuffle=self.shuffle, source=self.source, crops=opts.crops,
                sync=bucket_sync, rank=self.rank, world_size=self.world_size, train=self.train, batch_size=batch_size,
            )  # fmt: skip
        self.drop_last = self.order.drop_last
        #: the train batches' per-sample augmentation and mixing (:mod:`.augment.apply`)
        self.recipe = opts.augmentation.recipe(train=self.train, index=self.index, path=self.path)
        self.augment, self.mixing = self.recipe.augment, self.recipe.mixing
        #: the crop stage (:class:`.stages.CropStage`): the crop recipe, its schedule, what a state records
        self.cropping = CropStage(opts.crops, crop, manifest=self.index.manifest, train=self.train, path=self.path)
        check_stored_size(self.crops, self.index.manifest, train=self.train, crop=self.crop, path=self.path)
        self.source.check_cache_limit(self.order, seed=self.seed, block_shards=self.block_shards)
        self.skipped_in_manifest = self.index.num_skipped  #: excluded up front (pack's skips, no image)
        self.skipped = 0  # samples dropped at run time this epoch (failed the header guard or decoding)
        self.epoch = self.position = self._offset = 0  # _offset: where this rank count's split begins
        self._finished = self._resumed = self._closed = False  # _resumed: position from load_state_dict
        self._active = ActiveIteration()  # the one iteration (weakly: a dropped iterator is closed at once)
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
        self.decoding.buckets = getattr(self.order, "buckets", None)
        self.decoding.check_pixel_tier(self.source, self.shuffle, self.crops)
        #: a mix's :class:`~.mixsource.Mix` (quotas, cycles, ``summary()``, ``split_of(ids)``), else ``None``
        self.mix = start_mix(self, mix)

    @property
    def crops(self) -> CropSpec:
        """The crop recipe (:class:`~.augment.CropSpec`) of the next batches; :attr:`crop` its size."""
        return self.cropping.crops

    @property
    def buckets(self) -> tuple[tuple[int, int], ...] | None:
        """The bucket shapes ``(height, width)`` of a Loader made with ``buckets=`` (``"auto"``: the
        ones chosen), else ``None``."""
        chosen = self.decoding.buckets
        return None if chosen is None else chosen.shapes

    @property
    def crop(self) -> int | tuple[int, int]:
        """The output size, as given (a side or ``(height, width)``) or as :meth:`set_crop` set it."""
        return self.cropping.crop

    # ---- order ---------------------------------------------------------------------------
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

    # ---- crop ----------------------------------------------------------------------------
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
        if self.decoding.buckets is not None:
            raise ArgumentError("set_crop() and buckets=: each bucket has its own shape (make a Loader with others)")
        self.cropping.set(crop, self.epoch)

    # ---- iteration -----------------------------------------------------------------------
    def __iter__(self) -> LoaderIterator:
        self._active.supersede()  # an abandoned iteration: drain it (the next one starts the epoch over)
        if self._closed:
            raise ArgumentError(f"this Loader of {self.path} was closed; create a new one")
        return self._active.start(LoaderIterator(self))

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
        expect = getattr(runner, "expect", None)
        # the next epoch, unless set_epoch or set_crop says otherwise (a bucketed epoch: each bucket's runner)
        if expect is not None and windows is None and self.decoding.buckets is None:
            expect(self.order.batches(self.seed, self.epoch + 1, 0, 0, self.order.stop(0), self.index.valid_at))
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
        self._active.supersede()
        try:
            self.decoding.close()  # may raise what the store's last seal met: the rest closes still
        finally:
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
        return describe(self)


# what help(), inspect and IDEs show of Loader(...): __init__'s typed keywords, not __new__'s catch-all
Loader.__signature__ = inspect.signature(Loader.__init__).replace(
    parameters=list(inspect.signature(Loader.__init__).parameters.values())[1:]
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
