"""Sample order: pure functions of ``(seed, epoch, rank, world, position)``.

Training sees a fresh global permutation of all samples each epoch (not a shuffle
buffer), split across ranks so that the slices are disjoint and cover the epoch.
Validation keeps the stored order and gives every sample to exactly one rank.

Resuming on another number of ranks (elastic): ranks step in lockstep, so after ``p`` samples
per rank the ``W`` ranks of a split at ``offset`` have handed out exactly the epoch sequence's
``offset .. offset + W * p`` (the permutation's, in order). The rest of the epoch is the sequence
from there, split over the new ranks the way an epoch is (:func:`rank_indices` with ``offset``):
every sample not yet handed out once, none handed out twice; each rank gets the same count, the
last fewer than ``W'`` left out as an epoch leaves ``n % W`` out.
"""

from __future__ import annotations

import numpy as np

from stoker.errors import ArgumentError


def epoch_permutation(num_samples: int, seed: int, epoch: int) -> np.ndarray:
    """A permutation of ``range(num_samples)`` that depends only on ``(seed, epoch)``."""
    rng = np.random.Generator(np.random.PCG64([int(seed) & 0xFFFFFFFF, int(epoch)]))
    return rng.permutation(num_samples).astype(np.int64)


def samples_per_rank(num_samples: int, *, rank: int, world_size: int, train: bool, offset: int = 0) -> int:
    """``len(rank_indices(...))`` without building it (train: equal for every rank)."""
    if train:
        return (num_samples - offset) // world_size
    return len(range(rank, num_samples, world_size))


def rank_indices(
    num_samples: int, *, seed: int, epoch: int, rank: int, world_size: int, train: bool, offset: int = 0
) -> np.ndarray:
    """The sample indices this rank reads this epoch, in order.

    train: a strided slice of the epoch permutation (from ``offset``: what a resume on another
    number of ranks starts from), truncated to ``(num_samples - offset) // world_size`` so every
    rank takes the same number of steps (the samples left over are different ones each epoch).
    val: ``range(num_samples)[rank::world_size]``: each sample exactly once over all
    ranks, no padding; rank sizes differ by at most one.
    """
    if not 0 <= rank < world_size:
        raise ArgumentError(f"rank={rank} is outside world_size={world_size}")
    if train:
        if not 0 <= offset <= num_samples:
            raise ArgumentError(f"offset={offset} is outside the epoch's {num_samples} samples")
        per_rank = (num_samples - offset) // world_size
        rest = epoch_permutation(num_samples, seed, epoch)[offset:]
        return rest[rank : per_rank * world_size : world_size]
    return np.arange(rank, num_samples, world_size, dtype=np.int64)


def num_batches(n: int, batch_size: int, *, drop_last: bool) -> int:
    return n // batch_size if drop_last else -(-n // batch_size)


# ---- block mode: shards permuted and split across ranks, samples permuted within a window ----
SHUFFLES = ("global", "block")


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
