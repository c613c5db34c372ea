"""A Loader with ``buckets=``: the bucketed order made from the sizes the sample table records, the
crop recipe of each bucket, and the runner that decodes each batch at its bucket's shape.

Every backend takes part unchanged: each bucket has its own runner, made at that bucket's crop
recipe exactly as a Loader at that size would make it (the pixel tier's store shared), and
:class:`BucketRunner` hands each runner its bucket's batches and yields the batches back in the
epoch's order. Boxes and masks follow each crop as they do at any size: the bucket's runner
computes them at its own recipe.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from stoker.errors import ArgumentError

from .augment import CropSpec
from .backends.base import Batch, Runner
from .order.buckets import BucketOrder, Buckets, auto_buckets


def bucket_crops(crops: CropSpec, shape: tuple[int, int]) -> CropSpec:
    """``crops`` at a bucket's ``shape``: the output size, and the train crop's aspect range moved
    to the bucket's aspect (``ratio`` is a range around square: it becomes the same range around
    the bucket's), so a random-resized-crop cuts boxes of about the bucket's shape."""
    aspect = shape[1] / shape[0]
    lo, hi = crops.ratio
    return dataclasses.replace(crops, size=tuple(shape), ratio=(lo * aspect, hi * aspect))


def bucket_order(
    buckets: Any,
    *,
    index: Any,
    crops: CropSpec,
    sync: bool,
    path: Any,
    base: Any = None,
    rank: int,
    world_size: int,
    train: bool,
    batch_size: int,
) -> BucketOrder:
    """The bucketed order over ``index``'s loadable samples: ``buckets`` ``"auto"`` (chosen from the
    split's aspect histogram, at about the crop's area) or a list of ``(height, width)``; one line
    on stderr (rank 0) names the buckets and what an epoch leaves waiting.

    Raises:
        ArgumentError: bad ``buckets``; IdxFormatError: the split's table records no sizes (the
            ``stoker index`` to run).
    """
    n = index.num_valid
    wh = index.stored_sizes(index.valid_at(np.arange(n, dtype=np.int64)))
    if isinstance(buckets, str):
        if buckets != "auto":
            raise ArgumentError(f"buckets={buckets!r} must be 'auto' or a list of (height, width) pairs")
        chosen = auto_buckets(wh, crops.size, min_count=batch_size * world_size)
    else:
        chosen = Buckets.of(buckets)
    made = BucketOrder(
        index.valid_counts(),
        buckets=chosen,
        bucket_of=chosen.assign(wh),
        sync=sync,
        base=base,
        rank=rank,
        world_size=world_size,
        train=train,
        batch_size=batch_size,
        drop_last=train,
    )
    if made.num_batches() == 0:
        raise ArgumentError(
            f"{path}: no bucket holds a whole batch of {batch_size} on each of {world_size} rank(s) "
            f"({chosen.describe(made.counts)}): use fewer buckets or a smaller batch_size"
        )
    if rank == 0:
        waiting = made.waiting()
        line = f"stoker buckets: {path}: {chosen.describe(made.counts)}"
        if waiting:
            line += (
                f"; each epoch leaves {waiting:,} of {n:,} samples for another (a bucket's last part batch"
                f"{' and the steps not every rank can take' if world_size > 1 else ''}): other samples each epoch"
            )
        print(line, file=sys.stderr)
    return made


def bucketed(buckets: Any, *, inner: Any, base: Any, shuffle: str, source: Any, **kw: Any) -> BucketOrder:
    """The Loader's ``buckets=`` over its order ``inner``: refused in one line where it does not
    apply, else :func:`bucket_order` over the split, or over ``base``'s draws (a mix's or a
    balance's epoch, read whole as on one rank at the Loader's global batch)."""
    if shuffle != "global":
        raise ArgumentError(f"buckets= orders the whole split (shuffle='global'), not shuffle={shuffle!r}")
    if source.cache is not None:
        raise ArgumentError(
            f"buckets= needs the image sizes a local split's table records; {source.path} is a URL: "
            "bucket a local copy of it"
        )
    made = bucket_order(buckets, index=source.index, path=source.path, base=base, **kw)
    made.inner = inner  # the order bucketed (a mix's plan and summary read it)
    return made


def shown_share(wh: np.ndarray, crops: CropSpec, buckets: Buckets | None = None) -> float:
    """The mean share of each image's stored pixels the val transform shows the model: the center
    crop at ``crops``' size, or at each image's bucket with ``buckets`` (the same rule, the bucket's
    shape). ``wh``: ``(width, height)`` rows (those without a size are left out)."""
    from .augment.crops import center_crop

    wh = np.asarray(wh, np.int64).reshape(-1, 2)
    wh = wh[(wh > 0).all(axis=1)]
    if not len(wh):
        return 0.0
    boxes = np.zeros((len(wh), 4), np.int64)
    if buckets is None:
        boxes[:] = center_crop(wh, crops.size, crops.crop_pct, resize=crops.val_resize)
    else:
        of = buckets.assign(wh)
        for b, shape in enumerate(buckets.shapes):
            rows = of == b
            if rows.any():
                boxes[rows] = center_crop(wh[rows], shape, crops.crop_pct, resize=crops.val_resize)
    return float(np.mean(boxes[:, 2] * boxes[:, 3] / (wh[:, 0] * wh[:, 1])))


class _BucketBatches(Sequence):
    """The batches of one bucket, in the epoch's order (a view: each read when asked for)."""

    def __init__(self, batches: Sequence[np.ndarray], numbers: list[int]):
        self.batches, self.numbers = batches, numbers

    def __len__(self) -> int:
        return len(self.numbers)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.batches[self.numbers[i]]


class BucketRunner:
    """A runner per bucket (made on first use by ``make(crops)`` at the bucket's recipe); an
    iteration hands each its own bucket's batches and yields the batches in the epoch's order."""

    def __init__(self, buckets: Buckets, crops: CropSpec, make: Callable[[CropSpec], Runner]):
        self.buckets, self.make = buckets, make
        self.runners: dict[int, Runner] = {}
        self.set_crops(crops)

    def set_crops(self, crops: CropSpec) -> None:
        """Another recipe (a new crop size scales the buckets' shapes): the runners are made again."""
        self.crops = crops
        self.close()

    def crops_of(self, bucket: int) -> CropSpec:
        return bucket_crops(self.crops, self.buckets.shapes[bucket])

    def runner(self, bucket: int) -> Runner:
        if bucket not in self.runners:
            self.runners[bucket] = self.make(self.crops_of(bucket))
        return self.runners[bucket]

    def iterate(self, batches: Any, epoch: int, seed: int) -> Iterator[Batch]:
        of = [batches.bucket(i) for i in range(len(batches))]
        iters: dict[int, Iterator[Batch]] = {}
        try:
            for b in of:
                if b not in iters:
                    numbers = [i for i, x in enumerate(of) if x == b]
                    iters[b] = iter(self.runner(b).iterate(_BucketBatches(batches, numbers), epoch, seed))
                yield next(iters[b])
        finally:
            for it in iters.values():
                close = getattr(it, "close", None)
                if close is not None:
                    close()

    def close(self) -> None:
        runners, self.runners = self.runners, {}
        for r in runners.values():
            r.close()


__all__ = ["BucketRunner", "bucket_crops", "bucket_order", "bucketed", "shown_share"]
