"""Aspect-ratio buckets: every batch holds images of one shape, chosen by each image's own aspect.

A split's samples go to the bucket nearest their aspect (:class:`Buckets`, from the widths and
heights the sample table records). An epoch is cut into **chunks** of ``batch_size`` samples of
one bucket, and a rank's batches are chunks:

* train: the epoch's global permutation (the same bijection as ``shuffle="global"``), grouped by
  bucket in that order; each bucket's samples cut into whole chunks (the fewer than
  ``batch_size`` left in a bucket wait for another epoch: a different few each epoch); the
  chunks interleaved in a seeded order; the ranks take the chunks in turn, ``rank, rank + W,
  ...``, and every rank the same number (the last fewer than ``W`` chunks wait too).
* val: every sample once, in stored order within its bucket, the last chunk of a bucket short;
  the ranks take the chunks in turn (their counts differ by at most one).

Ranks step in lockstep, so after ``p`` batches each the ``W`` ranks of an epoch split at chunk
``c`` have handed out exactly chunks ``c .. c + W * p``: a resume, on any number of ranks, goes
on from there, exactly as the global order does with samples (:mod:`stoker.pipeline.order`).

``sync=True`` makes the ``W`` chunks of one step one bucket (step times match under DDP and a
compiled model sees fewer shapes): the chunk order is then laid out in runs of ``W`` chunks of
one bucket, and the chunks of a bucket that do not fill a run wait for another epoch.

Everything here is a pure function of ``(seed, epoch)`` and the buckets; the plan of an epoch is
computed for the whole split (``8`` bytes a sample while the epoch runs, ``~0.1 s`` a million).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from stoker.errors import ArgumentError

from .base import EpochBatches, SampleOrder
from .global_order import PERMUTATION
from .permutation import Permutation

#: buckets ``"auto"`` chooses at most
AUTO_MAX = 7
#: samples ``"auto"`` reads the aspect histogram from at most
AUTO_SAMPLE = 100_000
#: a bucket's sides are multiples of this (what convolutional nets and patch embeddings divide by)
SIDE_MULTIPLE = 8
#: two ``"auto"`` buckets whose aspects differ by less than this factor are one
AUTO_MERGE = 1.12
_CHUNK_SEED = 0x5B0C4E7  # the chunk interleave's stream, apart from every other seeded draw


@dataclass(frozen=True)
class Buckets:
    """A set of output shapes ``(height, width)``, and which one each image goes to: the one
    nearest its aspect (``width / height``, compared in log space)."""

    shapes: tuple[tuple[int, int], ...]

    @classmethod
    def of(cls, shapes) -> Buckets:
        """Validate a list of ``(height, width)`` pairs; a bad one is one ``ArgumentError``."""
        try:
            got = tuple((int(h), int(w)) for h, w in shapes)
        except (TypeError, ValueError):
            raise ArgumentError(f"buckets={shapes!r} must be 'auto' or a list of (height, width) pairs") from None
        if not got or any(h < 1 or w < 1 for h, w in got):
            raise ArgumentError(f"buckets={shapes!r} must be 'auto' or a list of positive (height, width) pairs")
        if len(set(got)) != len(got) or len({h / w for h, w in got}) != len(got):
            raise ArgumentError(f"buckets={shapes!r} holds two shapes of one aspect: give each aspect once")
        if len(got) > 255:
            raise ArgumentError(f"buckets= holds {len(got)} shapes; at most 255")
        return cls(tuple(sorted(got, key=lambda hw: hw[1] / hw[0])))

    @property
    def aspects(self) -> np.ndarray:
        return np.array([w / h for h, w in self.shapes])

    def assign(self, wh: np.ndarray) -> np.ndarray:
        """The bucket (``uint8``) of each ``(width, height)`` row; a row without a size (0) goes to
        the bucket nearest square (the header guard leaves such a sample out anyway)."""
        wh = np.asarray(wh, np.float64).reshape(-1, 2)
        known = (wh > 0).all(axis=1)
        log_aspect = np.zeros(len(wh))
        log_aspect[known] = np.log(wh[known, 0] / wh[known, 1])
        centers = np.log(self.aspects)
        # the nearest center: between two, the boundary is their midpoint in log space
        cut = (centers[1:] + centers[:-1]) / 2
        return np.searchsorted(cut, log_aspect).astype(np.uint8)

    def describe(self, counts: Sequence[int]) -> str:
        """``"5 buckets (h x w: count): 160x288: 37, ..."``."""
        parts = ", ".join(f"{h}x{w}: {int(n):,}" for (h, w), n in zip(self.shapes, counts, strict=True))
        return f"{len(self.shapes)} bucket{'s' * (len(self.shapes) != 1)} (height x width: samples): {parts}"


def shape_for(aspect: float, area: float, multiple: int = SIDE_MULTIPLE) -> tuple[int, int]:
    """The ``(height, width)`` of about ``area`` pixels at ``aspect`` (width / height), each side a
    multiple of ``multiple`` (at least one)."""
    h = math.sqrt(area / aspect)
    w = aspect * h
    return max(multiple, round(h / multiple) * multiple), max(multiple, round(w / multiple) * multiple)


def auto_buckets(wh: np.ndarray, crop: tuple[int, int], *, min_count: int, most: int = AUTO_MAX) -> Buckets:
    """A few buckets of about the crop's area from the split's aspect histogram: ``most`` aspects
    placed at the histogram's quantiles and moved to their members' mean (a few rounds of 1-D
    k-means in log space), those nearer than :data:`AUTO_MERGE` merged, and the smallest bucket
    dropped (its samples go to their next nearest) while it holds fewer than ``min_count`` (a
    bucket that cannot fill a step would only ever wait)."""
    wh = np.asarray(wh, np.float64).reshape(-1, 2)
    wh = wh[(wh > 0).all(axis=1)]
    area = float(crop[0] * crop[1])
    min_count = min_count * min(1.0, AUTO_SAMPLE / max(1, len(wh)))
    if not len(wh):
        return Buckets.of([crop])
    if len(wh) > AUTO_SAMPLE:  # the histogram of an evenly spaced sample: the same shapes, a split's size apart
        wh = wh[np.linspace(0, len(wh) - 1, AUTO_SAMPLE).astype(np.int64)]
    x = np.log(wh[:, 0] / wh[:, 1])
    centers = np.unique(np.quantile(x, (np.arange(most) + 0.5) / most))
    for _ in range(8):  # Lloyd's rounds: assign to the nearest, move to the members' mean
        cut = (centers[1:] + centers[:-1]) / 2
        members = np.searchsorted(cut, x)
        sums, counts = np.bincount(members, x, len(centers)), np.bincount(members, minlength=len(centers))
        centers = np.unique(np.where(counts > 0, sums / np.maximum(counts, 1), centers))
    merged = [centers[0]]
    for c in centers[1:]:
        if c - merged[-1] < math.log(AUTO_MERGE):
            merged[-1] = (merged[-1] + c) / 2
        else:
            merged.append(c)
    centers = np.array(merged)
    while len(centers) > 1:
        counts = np.bincount(np.searchsorted((centers[1:] + centers[:-1]) / 2, x), minlength=len(centers))
        small = int(np.argmin(counts))
        if counts[small] >= min_count:
            break
        centers = np.delete(centers, small)
    shapes = {shape_for(math.exp(c), area) for c in centers}
    return Buckets.of(sorted(shapes))


class BucketBatches(EpochBatches):
    """A rank's batches of one bucketed epoch: each one chunk, and :meth:`bucket` says which
    bucket it is (its shape: ``order.buckets.shapes[bucket]``)."""

    def __len__(self) -> int:
        return len(self.order.rank_chunks(self.seed, self.epoch, self.offset, self.start, self.stop))

    def bucket(self, i: int) -> int:
        chunks = self.order.rank_chunks(self.seed, self.epoch, self.offset, self.start, self.stop)
        return int(self.order.plan(self.seed, self.epoch).bucket[chunks[i]])

    def __getitem__(self, i: int) -> np.ndarray:
        if not isinstance(i, int):
            raise TypeError("BucketBatches takes one batch number at a time")
        chunks = self.order.rank_chunks(self.seed, self.epoch, self.offset, self.start, self.stop)
        return self.to_global(self.order.plan(self.seed, self.epoch).members(int(chunks[i])))


@dataclass(frozen=True)
class EpochPlan:
    """An epoch's chunks: chunk ``t`` is ``order[start[t] : start[t] + size[t]]``, of ``bucket[t]``."""

    order: np.ndarray  # loadable positions, grouped by bucket
    start: np.ndarray
    size: np.ndarray
    bucket: np.ndarray

    def members(self, t: int) -> np.ndarray:
        return self.order[self.start[t] : self.start[t] + self.size[t]]


class BucketOrder(SampleOrder):
    """The order of a bucketed Loader (``buckets=``): see the module doc.

    Args:
        shard_counts, rank, world_size, train, batch_size, drop_last: as every order's.
        buckets: the shapes.
        bucket_of: each loadable sample's bucket (``uint8``, by loadable position).
        sync: every step's ``W`` chunks of one bucket.
    """

    name = "global"
    #: the order this one buckets (the Loader's, before ``buckets=``: a mix's plan and summary read it)
    inner: SampleOrder | None = None

    def __init__(
        self,
        shard_counts,
        *,
        buckets: Buckets,
        bucket_of: np.ndarray,
        sync: bool = False,
        base: SampleOrder | None = None,
        **kw,
    ):
        super().__init__(shard_counts, **kw)
        self.buckets, self.sync = buckets, bool(sync)
        self.bucket_of = np.asarray(bucket_of, np.uint8)
        if len(self.bucket_of) != self.num_samples:
            raise ArgumentError(f"bucket_of has {len(self.bucket_of)} entries for {self.num_samples} samples")
        #: a train epoch's draws come from this order (a mix's quotas, a balance's), read whole on
        #: one rank; ``None``: the global permutation of the loadable samples
        self.base = base if self.train else None
        #: samples per bucket (of the split; a base's epoch draws its own, each epoch others)
        self.counts = np.bincount(self.bucket_of, minlength=len(buckets.shapes)).astype(np.int64)
        b, w, k = self.batch_size, self.world_size, len(buckets.shapes)
        if self.base is not None:
            # The draws' buckets change from epoch to epoch, so an epoch takes the chunks every draw
            # fills whatever its buckets: all but fewer than a batch (a run) in each bucket.
            length = self.base.share(0)
            unit = b * w if self.sync else b
            self.num_chunks = max(0, (length - k * (unit - 1)) // unit) * (unit // b)
            self.chunks_per_bucket = None
        else:
            whole = self.counts // b
            if self.train and self.sync:
                whole = whole - whole % w
            #: chunks per bucket in an epoch
            self.chunks_per_bucket = whole if self.train else -(-self.counts // b)
            self.num_chunks = int(self.chunks_per_bucket.sum())
        self._plan: tuple | None = None

    # ---- what waits ------------------------------------------------------------------
    def waiting(self) -> int:
        """Train samples an epoch leaves for another (the same count every epoch, other samples)."""
        if not self.train:
            return 0
        used = self.num_chunks - self.num_chunks % self.world_size
        drawn = self.base.share(0) if self.base is not None else self.num_samples
        return drawn - used * self.batch_size

    # ---- the epoch's plan ------------------------------------------------------------
    def plan(self, seed: int, epoch: int) -> EpochPlan:
        """The epoch's chunks (the last one kept: every batch of an epoch asks for it)."""
        key = (seed, epoch) if self.train else None  # val's chunks are the same every epoch
        if self._plan is not None and self._plan[0] == key:
            return self._plan[1]
        n, b, k = self.num_samples, self.batch_size, len(self.counts)
        if self.base is not None:
            sequence = self.base.positions(seed, epoch)  # the epoch's draws, in the base's order
        elif self.train:
            sequence = Permutation(n, seed=seed, epoch=epoch)(np.arange(n, dtype=np.int64))
        else:
            sequence = np.arange(n, dtype=np.int64)
        of = self.bucket_of[sequence]
        grouped = sequence[np.argsort(of, kind="stable")]  # by bucket, in sequence order
        counts = np.bincount(of, minlength=k).astype(np.int64)
        first = np.concatenate([[0], np.cumsum(counts)[:-1]])  # where each bucket starts in grouped
        per_bucket = self.chunks_per_bucket
        if per_bucket is None:  # a base's draws: each bucket's whole chunks (runs), the first num_chunks taken
            per_bucket = counts // b
            if self.sync:
                per_bucket -= per_bucket % self.world_size
        labels = np.repeat(np.arange(k), per_bucket)  # chunk t's bucket, before shuffling
        if self.train:
            rng = np.random.Generator(np.random.PCG64([_CHUNK_SEED, seed, epoch]))
            if self.sync:  # runs of W chunks of one bucket, the runs shuffled
                runs = labels[:: self.world_size]
                labels = np.repeat(runs[rng.permutation(len(runs))], self.world_size)
            else:
                labels = labels[rng.permutation(len(labels))]
            labels = labels[: self.num_chunks]  # a base's draws: the chunks every epoch has
        # the j-th chunk of bucket k (in the shuffled order) is grouped[first[k] + j*b : ...]
        j = _occurrence(labels, len(self.counts))
        start = first[labels] + j * b
        size = np.minimum(b, counts[labels] - j * b)
        plan = EpochPlan(grouped, start, size, labels.astype(np.uint8))
        self._plan = (key, plan)
        return plan

    def rank_chunks(self, seed: int, epoch: int, offset: int, start: int = 0, stop: int | None = None) -> np.ndarray:
        """The chunk numbers this rank reads from its ``start``-th sample to its ``stop``-th (train:
        every chunk is ``batch_size``; val: counted through the chunks' sizes)."""
        first = offset // self.batch_size if self.train else 0
        count = self._rank_chunk_count(first)
        chunks = first + self.rank + self.world_size * np.arange(count, dtype=np.int64)
        if self.train:
            b = self.batch_size
            lo, hi = start // b, count if stop is None else -(-stop // b)
            return chunks[lo:hi]
        sizes = self.plan(seed, epoch).size[chunks]
        ends = np.cumsum(sizes)
        lo = int(np.searchsorted(ends, start, side="right"))
        hi = count if stop is None else int(np.searchsorted(ends, stop, side="left")) + 1
        return chunks[lo : min(hi, count)]

    def _rank_chunk_count(self, first: int) -> int:
        left = self.num_chunks - first
        if self.train:
            return max(0, left // self.world_size)
        return len(range(self.rank, left, self.world_size))

    # ---- the order's contract ----------------------------------------------------------
    def share(self, rank: int | None = None, offset: int = 0) -> int:
        rank = self.rank if rank is None else rank
        if self.train:
            return self._rank_chunk_count(offset // self.batch_size) * self.batch_size
        sizes = self.plan(0, 0).size
        return int(sizes[rank :: self.world_size].sum())

    def stop(self, offset: int = 0) -> int:
        return self.share(self.rank, offset)  # every batch is a whole chunk: nothing for drop_last to cut

    def num_batches(self, offset: int = 0) -> int:
        return len(self.rank_chunks(0, 0, offset))

    def positions(self, seed: int, epoch: int, offset: int = 0, start: int = 0, stop: int | None = None) -> np.ndarray:
        plan = self.plan(seed, epoch)
        chunks = self.rank_chunks(seed, epoch, offset)
        if not len(chunks):
            return np.zeros(0, np.int64)
        out = np.concatenate([plan.members(int(t)) for t in chunks])
        return out[start:stop]

    def batches(self, seed: int, epoch: int, offset: int, start: int, stop: int, to_global) -> BucketBatches:
        return BucketBatches(self, seed, epoch, offset, start, stop, to_global)

    def mode(self) -> dict:
        shapes = [list(s) for s in self.buckets.shapes]
        return {
            **(self.base.mode() if self.base is not None else {"shuffle": self.name}),
            "buckets": shapes,
            "bucket_sync": self.sync,
        }

    def state_fields(self) -> dict:
        fields = {"buckets": [list(s) for s in self.buckets.shapes], "bucket_sync": self.sync}
        if self.base is not None:
            return {**self.base.state_fields(), **fields}
        return {**fields, "permutation": PERMUTATION} if self.train else fields

    def check_state(self, state: dict, saved_world: int) -> None:
        if self.base is not None:
            self.base.check_state(state, saved_world)  # another mix or balance: its own line
            if saved_world != self.world_size and state.get("position"):
                raise ArgumentError(
                    f"state was saved mid-epoch on {saved_world} ranks by a bucketed mix or balance, whose epoch "
                    f"is laid out for that many: resume it on {saved_world} ranks, or from the start of an epoch"
                )
        saved = {"buckets": state.get("buckets"), "bucket_sync": state.get("bucket_sync", False)}
        if self.base is None:
            saved["shuffle"] = state.get("shuffle", "global")
        mine = {k: self.mode().get(k) for k in saved}
        if saved != mine:
            raise ArgumentError(
                f"state was saved with buckets={saved['buckets']!r} (bucket_sync={saved['bucket_sync']}), this "
                f"loader has buckets={mine['buckets']!r} (bucket_sync={mine['bucket_sync']}): another sample order"
            )
        if self.sync and self.train and saved_world != self.world_size and state.get("position"):
            raise ArgumentError(
                f"state was saved mid-epoch on {saved_world} ranks with bucket_sync=True, whose steps are runs of "
                f"{saved_world} chunks: resume it on {saved_world} ranks, or from the start of an epoch"
            )


def _occurrence(labels: np.ndarray, k: int) -> np.ndarray:
    """For each entry, how many earlier entries hold the same label (``j`` of "the j-th chunk")."""
    out = np.zeros(len(labels), np.int64)
    for b in range(k):
        where = np.flatnonzero(labels == b)
        out[where] = np.arange(len(where))
    return out


__all__ = ["AUTO_MAX", "BucketBatches", "BucketOrder", "Buckets", "EpochPlan", "auto_buckets", "shape_for"]
