"""``shuffle="block"``: shards permuted and split across ranks, samples permuted within a
window of shards (a URL's cache holds two windows). Resumes on the same number of ranks only."""

from __future__ import annotations

import numpy as np

from stoker.errors import ArgumentError

from .base import SampleOrder


def _shard_bounds(shard_counts) -> np.ndarray:
    counts = np.asarray(shard_counts, np.int64)
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)


def block_shard_order(num_shards: int, seed: int, epoch: int, train: bool) -> np.ndarray:
    """The shard sequence of an epoch in block mode: a fresh permutation of ``(seed, epoch)``
    for train, the stored order for val."""
    if not train:
        return np.arange(num_shards, dtype=np.int64)
    # a stream of its own (the 0xB10C key), so it is unrelated to the global permutation
    rng = np.random.Generator(np.random.PCG64([int(seed) & 0xFFFFFFFF, int(epoch), 0xB10C]))
    return rng.permutation(num_shards).astype(np.int64)


def block_rank_range(num_samples: int, *, rank: int, world_size: int, train: bool) -> tuple[int, int]:
    """``[start, stop)`` of this rank's contiguous piece of the epoch's shard-ordered sample
    sequence. train: ``num_samples // world_size`` samples each (equal steps; the last
    ``num_samples % world_size`` of the sequence, different ones each epoch, are left out).
    val: every sample exactly once, piece sizes differing by at most one."""
    if not 0 <= rank < world_size:
        raise ArgumentError(f"rank={rank} is outside world_size={world_size}")
    if train:
        q = num_samples // world_size
        return rank * q, (rank + 1) * q
    return rank * num_samples // world_size, (rank + 1) * num_samples // world_size


def block_plan(
    shard_counts, *, seed: int, epoch: int, rank: int, world_size: int, train: bool, block_shards: int
) -> tuple[np.ndarray, list[np.ndarray]]:
    """This rank's epoch order in block mode and the shards of each window.

    The epoch's shards are permuted (train) and laid end to end; each rank takes a contiguous
    piece of that sample sequence (:func:`block_rank_range`), so ranks read disjoint shards
    except the at most one shard at each boundary between neighbouring ranks. The rank's
    shards are grouped in windows of ``block_shards`` in sequence order; train permutes the
    samples within each window (a stream of ``(seed, epoch, rank, window)``), val keeps the
    stored order.

    Args:
        shard_counts: samples per shard, in stored order (positions ``0 .. sum-1`` are laid out
            shard after shard).

    Returns:
        ``(indices, windows)``: the positions this rank reads, in order, and for each window
        the shard numbers it holds (the windows' samples follow each other in ``indices``).
    """
    if block_shards < 1:
        raise ArgumentError(f"block_shards={block_shards} must be a positive integer")
    bounds = _shard_bounds(shard_counts)
    num_samples = int(bounds[-1])
    shards = block_shard_order(len(bounds) - 1, seed, epoch, train)
    sizes = bounds[1:][shards] - bounds[:-1][shards]
    seq_start = np.concatenate([[0], np.cumsum(sizes)])  # where each shard starts in the sequence
    lo, hi = block_rank_range(num_samples, rank=rank, world_size=world_size, train=train)
    pieces, mine = [], []
    for k, s in enumerate(shards.tolist()):  # this rank's part of each shard it touches
        a, b = max(lo, int(seq_start[k])), min(hi, int(seq_start[k + 1]))
        if a < b:
            off = int(bounds[s]) - int(seq_start[k])
            pieces.append(np.arange(a + off, b + off, dtype=np.int64))
            mine.append(s)
    out, windows = [], []
    for w in range(0, len(mine), block_shards):
        part = np.concatenate(pieces[w : w + block_shards])
        if train:
            rng = np.random.Generator(np.random.PCG64([int(seed) & 0xFFFFFFFF, int(epoch), 1 + rank, w]))
            part = part[rng.permutation(len(part))]
        out.append(part)
        windows.append(np.asarray(mine[w : w + block_shards], np.int64))
    indices = np.concatenate(out) if out else np.zeros(0, np.int64)
    return indices, windows


def block_samples_per_rank(num_samples: int, *, rank: int, world_size: int, train: bool) -> int:
    """``len(block_plan(...)[0])`` without building it (train: equal for every rank)."""
    lo, hi = block_rank_range(num_samples, rank=rank, world_size=world_size, train=train)
    return hi - lo


class BlockOrder(SampleOrder):
    """``shuffle="block"``: each epoch permutes the shards, gives each rank a contiguous run of
    them and permutes samples within windows of ``block_shards`` shards (:func:`block_plan`).
    Resumes on the same number of ranks only."""

    name = "block"

    def __init__(self, shard_counts, *, block_shards: int, **kw):
        super().__init__(shard_counts, **kw)
        self.block_shards = block_shards
        self._last: tuple | None = None

    def share(self, rank: int | None = None, offset: int = 0) -> int:
        rank = self.rank if rank is None else rank
        return block_samples_per_rank(self.num_samples, rank=rank, world_size=self.world_size, train=self.train)

    def _plan(self, seed: int, epoch: int) -> tuple[np.ndarray, list]:
        """The epoch's plan (the rank's share, built whole: its windows are permuted in place;
        the last one kept)."""
        if self._last is None or self._last[0] != (seed, epoch):
            plan = block_plan(
                self.shard_counts,
                seed=seed,
                epoch=epoch,
                rank=self.rank,
                world_size=self.world_size,
                train=self.train,
                block_shards=self.block_shards,
            )
            self._last = ((seed, epoch), plan)
        return self._last[1]

    def positions(self, seed: int, epoch: int, offset: int = 0, start: int = 0, stop: int | None = None) -> np.ndarray:
        return self._plan(seed, epoch)[0][start:stop]

    def windows(self, seed: int, epoch: int) -> list:
        return self._plan(seed, epoch)[1]

    def mode(self) -> dict:
        return {"shuffle": "block", "block_shards": self.block_shards}

    def state_fields(self) -> dict:
        return self.mode()

    def check_state(self, state: dict, saved_world: int) -> None:
        if saved_world != self.world_size:
            raise ArgumentError(
                f"state was saved with world_size={saved_world}, this loader has world_size={self.world_size}: "
                "shuffle='block' resumes on the same number of ranks only (shuffle='global' resumes on any)"
            )
        super().check_state(state, saved_world)
