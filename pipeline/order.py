"""Sample order: pure functions of ``(seed, epoch, rank, world, position)``.

Training sees a fresh global permutation of all samples each epoch (not a shuffle
buffer), split across ranks so that the slices are disjoint and cover the epoch.
Validation keeps the stored order and gives every sample to exactly one rank.
"""

from __future__ import annotations

import numpy as np


def epoch_permutation(num_samples: int, seed: int, epoch: int) -> np.ndarray:
    """A permutation of ``range(num_samples)`` that depends only on ``(seed, epoch)``."""
    rng = np.random.Generator(np.random.PCG64([int(seed) & 0xFFFFFFFF, int(epoch)]))
    return rng.permutation(num_samples).astype(np.int64)


def samples_per_rank(num_samples: int, *, rank: int, world_size: int, train: bool) -> int:
    """``len(rank_indices(...))`` without building it (train: equal for every rank)."""
    if train:
        return num_samples // world_size
    return len(range(rank, num_samples, world_size))


def rank_indices(num_samples: int, *, seed: int, epoch: int, rank: int, world_size: int, train: bool) -> np.ndarray:
    """The sample indices this rank reads this epoch, in order.

    train: a strided slice of the epoch permutation, truncated to
    ``num_samples // world_size`` so every rank takes the same number of steps (the
    ``num_samples % world_size`` samples left over are different ones each epoch).
    val: ``range(num_samples)[rank::world_size]``: each sample exactly once over all
    ranks, no padding; rank sizes differ by at most one.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} is outside world_size={world_size}")
    if train:
        per_rank = num_samples // world_size
        perm = epoch_permutation(num_samples, seed, epoch)
        return perm[rank : per_rank * world_size : world_size]
    return np.arange(rank, num_samples, world_size, dtype=np.int64)


def num_batches(n: int, batch_size: int, *, drop_last: bool) -> int:
    return n // batch_size if drop_last else -(-n // batch_size)
