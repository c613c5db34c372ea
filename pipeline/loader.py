"""``Loader``: uint8 batches from stoker shards, in an exact, resumable, distributed order.

>>> loader = Loader("out/train", batch_size=256, train=True, crop=224, device="cuda", seed=0)
>>> for epoch in range(epochs):
...     loader.set_epoch(epoch)
...     for images, targets in loader:   # uint8 [N, 3, crop, crop] on device; int64 classes
...         ...

The targets are the split's kind (:mod:`.shards.targets`): int64 classes ``[N]``, float32
values ``[N]`` / ``[N, K]``, float32 multi-hot ``[N, C]``, or uint8 masks ``[N, H, W]`` that get
exactly their image's crop and flip.

The sample order is ours, not a reader's: the Loader holds one order object (:mod:`.order`,
``shuffle=`` names it: a fresh global permutation of ``(seed, epoch)`` split across ranks, or
shard blocks) that says this rank's share, its positions, its windows and what a resume state
holds. Its fixed batches of sample positions are turned into uint8 batches by a decode backend
(:mod:`.backends`). The crop boxes and flips are ours too (:mod:`.augment`), so every backend and
a resumed run see the same crops. A URL's shards come through the cache (:mod:`.cache`; a window
ahead: :mod:`.prefetch`).

This module is the Loader's contract (arguments, epochs, resume, iteration); its checks are in
:mod:`.loader_checks`, its DataLoader-shaped views in :mod:`.dataloader_compat`.
"""

from __future__ import annotations

import warnings
import weakref
from pathlib import Path
from typing import Any

import numpy as np

from stoker.errors import ArgumentError, LoaderError, NoBatchError

from . import order
from .augment import RATIO, SCALE, CropSpec
from .augment.apply import TrainRecipe
from .backends import Backend, resolve_backend
from .backends.base import DecodeSettings, Runner, next_loadable
from .backends.decoders import DECODER_NAMES
from .cache import ShardCache, is_url
from .dataloader_compat import DataLoaderSurface, LoaderBatchSampler, LoaderDataset, LoaderSampler, habit_message
from .deps import usable_cores
from .fsutil import PathLike
from .loader_checks import (
    DECODES,
    SHUFFLES,
    check_arguments,
    check_cache_limit,
    check_every_rank_has_a_batch,
    check_stored_size,
    rank_and_world,
    torch_device,
)
from .pixels import PixelCache
from .prefetch import cached_groups
from .shards.samples import SampleIndex, open_split
from .shards.stats import TargetStats


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
            (:class:`~.augment.CropSpec`, what the commands pass).
        scale, ratio: the train crop's area share and aspect ranges (torchvision's
            ``RandomResizedCrop``; default ``(0.08, 1)`` and ``(3/4, 4/3)``).
        crop_pct: val: the shorter side is resized to ``min(crop) / crop_pct`` before the
            center crop (timm's name; default 0.875: 224 from 256).
        val_resize: val: the shorter side before the center crop, in pixels (torchvision's
            ``Resize(256)``), instead of ``crop_pct``.
        channels: 3 (RGB) or 1 (grayscale: ``[N, 1, H, W]``, the decoder's own luma).
        augment: per-sample augmentation of train batches on their device, after the crop and
            flip: a transform of :mod:`.augment` (``build_augment(...)``, ``RandAugment(...)``) or a
            policy name as timm and torchvision name them (``"rand-m9-mstd0.5-inc1"``,
            ``"ta_wide"``, ``"original"``). Each sample's parameters come from ``(seed, epoch,
            sample)``: the same on every backend and batch size, and after a resume. Masks move
            with the geometric ops.
        mixing: MixUp/CutMix of train batches (``build_mixing(...)``): the targets become soft,
            float32 ``[N, classes]``; class splits only. A batch left odd by a dropped sample mixes
            its first ``N - 1`` rows (the last keeps its smoothed label).
        device: where the batches land (``"cpu"``, ``"cuda"``, ``"cuda:1"``, a ``torch.device``).
        seed: seeds the order and the augmentation.
        rank, world_size: this process's share; default from ``torch.distributed`` when
            initialized, else 0 / 1.
        backend: ``"dali"``, ``"nvjpeg"`` (batched GPU decode without DALI, by ``decoder``),
            ``"pil"``, a backend registered by name (:func:`~.backends.register_backend`), a
            configured one (``get_backend("nvjpeg", overlap=False)``), or ``"auto"``: DALI when
            installed, else nvjpeg on a CUDA device where a GPU JPEG decoder works, else pil
            (:func:`~.backends.resolve_backend`). :attr:`backend_reason` says why.
        decoder: the nvjpeg backend's JPEG decoder: ``"nvimgcodec"`` (hardware decoder and
            region decode), ``"torchcodec"``, ``"torchvision"``, or ``"auto"``: the first whose
            probe decode works on the device (:func:`stoker.pipeline.backends.decoders.resolve_decoder`).
        decode: ``"mixed"`` (nvJPEG + hardware decoder, GPU resize), ``"cpu"``, or ``"auto"``
            (mixed when ``device`` is CUDA and the backend is DALI or nvjpeg, which only
            decodes on the GPU).
        threads: DALI threads / pillow worker processes (default: usable cores).
        drop_last: drop this rank's incomplete last batch; default ``True`` for train
            (every rank and every step has ``batch_size`` samples), ``False`` for val (every
            sample is seen exactly once).
        channels_last: return images in ``torch.channels_last`` memory format (the shape stays
            NCHW); cheaper on the CPU path and what AMP convolutions want.
        hw_decoder_load: share of JPEGs for the hardware decoder (DALI ``decode="mixed"``,
            nvjpeg with nvimgcodec).
        prefetch: batches prepared ahead (DALI ``prefetch_queue_depth``, pillow
            ``prefetch_factor``).
        cpu_resize: with CPU decode in DALI, resize with ``"pillow"`` (pillow-simd, default:
            measured ~2x faster here) or ``"dali"`` (``fn.resize`` inside the graph).
        sha256: verify every shard's checksum before the first batch (reads all data; a
            URL's shards are always checked as they are fetched).
        shuffle: ``"global"`` (default): a fresh permutation of the whole split each epoch; a
            URL's whole split is cached before the first batch. ``"block"``: each epoch
            permutes the shards, gives each rank a contiguous run of them (ranks share at most
            the one shard at each boundary) and permutes samples within windows of
            ``block_shards`` shards; a URL's next window is fetched while the current one
            trains, so each node downloads only its share and keeps two windows.
        block_shards: shards per window with ``shuffle="block"``.
        storage_options: fsspec options for a URL (``{"endpoint_url": ..., "anon": True}``);
            credentials otherwise come the ecosystem's way (``AWS_*`` environment variables).
        cache_dir: the local cache of a URL (default ``~/.cache/stoker/shards/<hash of URL>``);
            processes of one node may share it (file locks: each shard is fetched once).
        cache_limit: bytes of shards the cache keeps (least recently used evicted; never a
            shard the current or next window needs). Needs ``shuffle="block"`` unless the
            whole split fits.
        pixel_cache: a folder (node-local disk or ``/dev/shm``) or a :class:`~.pixels.PixelCache`
            (with a byte ``budget``): the decoded-pixel tier. The first epoch decodes each sample
            this rank reads at its stored size into a memory-mapped store there (shared by the
            ranks of a node, keyed to the split and the decoder, crash-safe); later epochs crop,
            resize and flip from the pixels, with the same boxes and flips as from JPEG. Its size
            is checked here: pixels that cannot fit are one line naming the size they need.

    Samples that fail at run time (the image header check; with ``backend="pil"`` also the
    decoder, while DALI raises, naming the batch's shards and keys) are dropped from
    their batch and counted in :attr:`skipped`; the batches themselves are fixed slices of this
    rank's order, so ``len(loader)`` is exactly the number of batches an epoch yields and the
    position in ``state_dict`` stays a sample count. A batch may then be smaller than
    ``batch_size``. When *no* sample of a batch passes the header check:

    * train: the batch is filled with stand-ins, the next samples of this rank's epoch order
      that pass it (wrapping around). Every rank still takes ``len(loader)`` steps (DDP's
      collectives stay matched) and never trains on an empty batch; those few samples are
      seen twice this epoch.
    * val: an empty batch (``[0, C, H, W]``, no targets) is yielded in its place, so
      every loadable sample is counted exactly once and ``len`` holds; evaluation loops
      that sum counts handle it.

    Merging it into the next batch instead would shift every later batch boundary and leave
    that rank one step short, which hangs a DDP job at its next collective.

    Raises:
        ManifestError: a shard is missing, truncated or (with ``sha256``) corrupt; names it.
        ValueError: a bad argument value, named in the message.
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
        backend: str | Backend = "auto",
        decoder: str = "auto",
        decode: str = "auto",
        threads: int | None = None,
        drop_last: bool | None = None,
        channels_last: bool = False,
        hw_decoder_load: float = 0.65,
        prefetch: int = 2,
        cpu_resize: str = "pillow",
        sha256: bool = False,
        shuffle: str = "global",
        block_shards: int = 4,
        storage_options: dict | None = None,
        cache_dir: PathLike | None = None,
        cache_limit: int | None = None,
        scale: tuple[float, float] = SCALE,
        ratio: tuple[float, float] = RATIO,
        crop_pct: float | None = None,
        val_resize: float | None = None,
        channels: int = 3,
        augment: Any = None,
        mixing: Any = None,
        pixel_cache: PathLike | PixelCache | None = None,
        **dataloader_kwargs: Any,
    ):

        if dataloader_kwargs:
            raise ArgumentError(habit_message(dataloader_kwargs))

        #: the crop recipe: size (height, width), scale, ratio, the val resize (given whole as ``crop=``,
        #: or made of ``crop``, ``scale``, ``ratio``, ``crop_pct`` and ``val_resize``)
        if isinstance(crop, CropSpec):
            if (scale, ratio, crop_pct, val_resize) != (SCALE, RATIO, None, None):
                raise ArgumentError("crop= is a whole CropSpec: give scale=, ratio=, crop_pct=, val_resize= in it")
            self.crops = crop
            crop = crop.size
        else:
            self.crops = CropSpec.of(crop, scale=scale, ratio=ratio, crop_pct=crop_pct, val_resize=val_resize)
        remote = is_url(path)
        check_arguments(
            path=path,
            remote=remote,
            batch_size=batch_size,
            channels=channels,
            decode=decode,
            cpu_resize=cpu_resize,
            threads=threads,
            prefetch=prefetch,
            shuffle=shuffle,
            block_shards=block_shards,
            cache_limit=cache_limit,
            storage_options=storage_options,
            cache_dir=cache_dir,
            hw_decoder_load=hw_decoder_load,
        )
        if decoder not in DECODER_NAMES:
            raise ArgumentError(f"decoder={decoder!r} must be one of {DECODER_NAMES}")
        self.device = torch_device(device)
        # which backend, and why (also what `stoker diagnose` reports)
        #: the configured backend (:class:`~.backends.Backend`); :attr:`backend` is its name
        self.backend_config, self.backend_reason = resolve_backend(backend, self.device, decoder=decoder)
        decode = self.backend_config.resolve_decode(decode, self.device)
        backend = self.backend_config.name
        self.rank, self.world_size = rank_and_world(rank, world_size)

        self.path: Path | str = str(path).rstrip("/") if remote else Path(path)
        self.shuffle, self.block_shards = shuffle, block_shards
        self._offset = 0  # where this rank count's split of the epoch begins (a resume elsewhere)
        self.batch_size, self.train, self.seed = batch_size, bool(train), int(seed)
        #: output side, or ``(height, width)``, as given; :attr:`crops` holds the recipe
        self.crop, self.channels = crop, channels
        self.backend, self.decode, self.decoder = backend, decode, decoder
        self.threads = usable_cores() if threads is None else threads
        self.drop_last = self.train if drop_last is None else bool(drop_last)
        self.channels_last = bool(channels_last)
        self.hw_decoder_load, self.prefetch, self.cpu_resize = float(hw_decoder_load), prefetch, cpu_resize
        #: the local cache of a URL's shards (``None`` for a local split)
        self.cache: ShardCache | None = None
        if remote:
            self.cache = ShardCache(
                self.path, storage_options=storage_options, cache_dir=cache_dir, cache_limit=cache_limit
            )
            self.index: SampleIndex = SampleIndex(self.cache.dir, self.cache.open(), manifest_sizes=True)
        else:
            # Checks sizes and .idx presence of every shard (sha256 on request) before any batch.
            self.index = open_split(self.path, sha256=sha256)
        #: samples the loader draws from (manifest skips and samples without image/cls removed)
        self.num_samples = self.index.num_valid
        if self.num_samples == 0:
            raise ArgumentError(f"{self.path} has no loadable samples")
        #: this rank's sample order (:mod:`.order`): share, positions, windows, what a state holds
        self.order = order.make_order(
            shuffle,
            self.index.valid_counts(),
            block_shards=block_shards,
            rank=self.rank,
            world_size=self.world_size,
            train=self.train,
            batch_size=self.batch_size,
            drop_last=self.drop_last,
        )
        check_every_rank_has_a_batch(self.order, num_samples=self.num_samples, path=self.path)
        #: the train batches' per-sample augmentation and mixing (:mod:`.augment.apply`)
        self.recipe = TrainRecipe.of(
            augment,
            mixing,
            train=self.train,
            target=self.index.target,
            num_classes=len(self.index.manifest.classes),
            path=self.path,
        )
        self.augment, self.mixing = self.recipe.augment, self.recipe.mixing
        check_stored_size(self.crops, self.index.manifest, train=self.train, crop=self.crop, path=self.path)
        #: the decoded-pixel tier (:class:`~.pixels.PixelCache`), or ``None``; its store opens here
        #: for a local split (the size check), at the first batch for a URL's (its shards local then)
        self.pixel_cache = PixelCache.of(pixel_cache)
        self._pixels = None
        self._initial_crops = self.crops  # what a state saved mid-epoch at another crop differs from
        self._crop_schedule = None
        if self.cache is not None:
            check_cache_limit(
                self.cache.cache_limit,
                self.order,
                self.index,
                seed=self.seed,
                block_shards=self.block_shards,
                path=self.path,
            )
        #: samples excluded up front (``pack["skip"]`` or missing image/cls component)
        self.skipped_in_manifest = self.index.num_skipped
        #: samples dropped at run time this epoch (failed the header guard or decoding)
        self.skipped = 0
        self.epoch = 0
        self.position = 0
        self._finished = False
        self._resumed = False  # position came from load_state_dict (continued even for val)
        self._closed = False
        # weak: an iterator the caller drops is closed at once (its producer thread stops)
        self._active: weakref.ref | None = None
        self._runner: Runner | None = None
        self._usable: set | None = None  # shards a stand-in may come from (block mode, URL)
        self._target_stats: TargetStats | None = None  # computed once for a split whose manifest has none
        self._runner_crops = self.crops
        if self.pixel_cache is not None:
            if self.cache is not None and self.shuffle == "block":
                raise ArgumentError(
                    "pixel_cache= lays out the whole split, which a URL's shuffle='block' never has locally "
                    "at once: use shuffle='global' (or a local copy of the split)"
                )
            if self.cache is None:
                self._pixel_store()  # the size check, before any batch

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
        c = self.crops
        crops = (
            crop
            if isinstance(crop, CropSpec)
            else CropSpec.of(
                tuple(crop) if isinstance(crop, list) else crop,
                scale=c.scale,
                ratio=c.ratio,
                crop_pct=None if c.val_resize is not None else c.crop_pct,
                val_resize=c.val_resize,
            )
        )
        if crops == self.crops:
            return
        self.crops = crops
        self.crop = crops.size[0] if crops.size[0] == crops.size[1] else crops.size
        check_stored_size(self.crops, self.index.manifest, train=self.train, crop=self.crop, path=self.path)

    # ---- resume --------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """``{seed, epoch, position, world_size, num_samples, batch_size}``: where the current (or
        last) iteration stands, so that ``load_state_dict`` of it continues there. ``position``
        counts the samples of ``epoch`` this rank has consumed (batches handed out so far); once an
        epoch's last batch is handed out the state already names the next epoch at position 0.
        (A new ``iter()`` without ``load_state_dict`` starts the epoch over, as a DataLoader
        does.) Ranks step in lockstep, so rank 0's state (what ``stoker train`` and every
        framework save) says where every rank is. After a resume on
        another number of ranks, ``offset`` is where that rank count's split of the epoch began
        (:mod:`.order`)."""
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
        runner = self._get_runner()
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

    @property
    def runner(self) -> Runner | None:
        """The decode backend's runner (made at the first iteration; ``None`` before): its own
        figures, e.g. the nvjpeg runner's ``stage_totals``."""
        return self._runner

    def close(self) -> None:
        """Stop any iteration and release the decode pipeline and the shard maps. The Loader
        cannot be iterated afterwards. Also what ``with Loader(...) as loader:`` does on exit."""
        self._close_active()
        runner, self._runner = self._runner, None
        if runner is not None:
            runner.close()
        if self._pixels is not None:
            self._pixels.close()
        self.index.close()
        if self.cache is not None:
            self.cache.close()
        self._closed = True

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _stand_in(self, planned: np.ndarray) -> np.ndarray:
        """Samples for a train batch none of whose samples is loadable: the next ones in this
        rank's epoch order (wrapping around) that pass the header guard."""
        seed, epoch, offset = self.seed, self.epoch, self._offset
        k = self.order.rank_position(seed, epoch, offset, self.index.valid_position(int(planned[-1])))
        after = (self.index.valid_at(p) for p in self.order.following(seed, epoch, offset, k))
        picked = next_loadable(self.index, after, len(planned), self._usable)
        if not len(picked):
            raise RuntimeError(
                f"stoker Loader {self.path}: no sample of rank {self.rank}'s share "
                f"passes the image header check (run `stoker verify {self.path}`)"
            )
        return picked

    def _get_runner(self) -> Runner:
        if self._runner is not None and self._runner_crops != self.crops:
            set_crops = getattr(self._runner, "set_crops", None)
            if set_crops is not None:  # a runner that takes the crop with each batch
                set_crops(self.crops)
            else:  # its pipeline is built for one crop size: built again
                self._runner.close()
                self._runner = None
        if self._runner is None:
            settings = self.decode_settings()
            if self.pixel_cache is not None:
                from .pixels import make_runner

                self._runner = make_runner(settings, self.pixel_cache, self._pixel_store)
            else:
                self._runner = self.backend_config.make_runner(settings)
        self._runner_crops = self.crops
        return self._runner

    def _pixel_store(self):
        """The pixel tier's store, opened once (a URL's split: at the first batch, its shards local)."""
        if self._pixels is None:
            from .pixels import open_store

            self._pixels = open_store(self.decode_settings(), self.pixel_cache)
        return self._pixels

    @property
    def pixel_store(self):
        """The pixel tier's :class:`~.pixels.PixelStore` (``None`` without ``pixel_cache``, or before
        a URL split's first batch): its ``stats()`` say how much of the split it holds."""
        return self._pixels

    def decode_settings(self) -> DecodeSettings:
        """What this Loader's decode backend is given (a runner of another backend can be made
        from it too: ``get_backend("nvjpeg").make_runner(loader.decode_settings())``)."""
        return DecodeSettings(
            index=self.index,
            path=str(self.path),
            device=self.device,
            batch_size=self.batch_size,
            crops=self.crops,
            train=self.train,
            channels_last=self.channels_last,
            threads=self.threads,
            prefetch=self.prefetch,
            decode=self.decode,
            cpu_resize=self.cpu_resize,
            hw_decoder_load=self.hw_decoder_load,
            decoder=self.decoder,
            stand_in=self._stand_in,
            channels=self.channels,
        )

    def __repr__(self) -> str:
        return (
            f"Loader({str(self.path)!r}, batch_size={self.batch_size}, train={self.train}, "
            f"crop={self.crop}, device={str(self.device)!r}, backend={self.backend!r}, "
            f"decode={self.decode!r}, shuffle={self.shuffle!r}, rank={self.rank}, "
            f"world_size={self.world_size}, num_samples={self.num_samples})"
        )


class LoaderIterator:
    """What ``iter(loader)`` returns: the rest of the Loader's current epoch, one batch per
    ``next()``. A Loader runs one iteration at a time: a newer ``iter(loader)`` (or
    ``load_state_dict``/``close``) replaces this one, whose ``next()`` then raises instead
    of ending as if the epoch were over."""

    def __init__(self, loader: Loader):
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
