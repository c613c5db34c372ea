"""``shuffle="global"``: train reads a fresh permutation of the whole split each epoch (a
bijection evaluated at this rank's positions only, :mod:`.permutation`), split over the ranks by
striding; val reads the stored order, ``rank::world_size``. Resumes on any number of ranks."""

from __future__ import annotations

import numpy as np

from stoker.errors import ArgumentError

from .base import SampleOrder
from .permutation import Permutation

#: positions evaluated at once (the bijection's temporaries are a few times this, in int64)
CHUNK = 1 << 20

#: the global train sequence's version in a state: 2, :mod:`.permutation` (1, before it: numpy's
#: ``permutation(N)``, which a state without the field was saved with)
PERMUTATION = 2


def epoch_permutation(num_samples: int, seed: int, epoch: int) -> np.ndarray:
    """The epoch's whole sequence ``π(0 .. num_samples - 1)`` (:class:`~.permutation.Permutation`
    of ``(seed, epoch)``), built: for tests and small splits; a rank reads its part of it through
    :func:`rank_indices` without building it."""
    return Permutation(num_samples, seed=seed, epoch=epoch)(np.arange(num_samples, dtype=np.int64))


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
    rank takes the same number of steps (the samples left over are different ones each epoch):
    ``π(offset + rank + k * world_size)`` for ``k = 0 .. per_rank - 1``, evaluated at those
    positions only.
    val: ``range(num_samples)[rank::world_size]``: each sample exactly once over all
    ranks, no padding; rank sizes differ by at most one.
    """
    if not 0 <= rank < world_size:
        raise ArgumentError(f"rank={rank} is outside world_size={world_size}")
    if train:
        if not 0 <= offset <= num_samples:
            raise ArgumentError(f"offset={offset} is outside the epoch's {num_samples} samples")
        per_rank = (num_samples - offset) // world_size
        at = np.arange(offset + rank, offset + per_rank * world_size, world_size, dtype=np.int64)
        return Permutation(num_samples, seed=seed, epoch=epoch)(at)
    return np.arange(rank, num_samples, world_size, dtype=np.int64)


class GlobalOrder(SampleOrder):
    """``shuffle="global"``: train reads a fresh permutation of the whole split each epoch, split
    over the ranks by striding (:func:`rank_indices`); val the stored order, ``rank::world_size``.
    Resumes on any number of ranks."""

    name = "global"
    _perm: tuple | None = None

    def share(self, rank: int | None = None, offset: int = 0) -> int:
        rank = self.rank if rank is None else rank
        return samples_per_rank(
            self.num_samples, rank=rank, world_size=self.world_size, train=self.train, offset=offset
        )

    def state_fields(self) -> dict:
        return {"permutation": PERMUTATION} if self.train else {}

    def check_mid_epoch(self, state: dict) -> None:
        if self.train and state.get("permutation", 1) != PERMUTATION:
            raise ArgumentError(
                f"state is mid-epoch {state.get('epoch')!r} of a train order this stoker no longer makes (an older "
                "stoker's permutation): resume it with that stoker, or from the start of an epoch "
                "(state['position'] = 0, no 'offset')"
            )

    def positions(self, seed: int, epoch: int, offset: int = 0, start: int = 0, stop: int | None = None) -> np.ndarray:
        draws = self.rank_draws(offset, start, stop)
        if not self.train:
            return draws
        if not 0 <= offset <= self.num_samples:
            raise ArgumentError(f"offset={offset} is outside the epoch's {self.num_samples} samples")
        perm, at = self._permutation(seed, epoch), offset + draws
        if len(at) <= CHUNK:
            return perm(at)
        return np.concatenate([perm(at[i : i + CHUNK]) for i in range(0, len(at), CHUNK)])  # bounded temporaries

    def rank_position(self, seed: int, epoch: int, offset: int, position: int) -> int:
        if not self.train:
            return (position - self.rank) // self.world_size
        j = int(self._permutation(seed, epoch).inverse(np.array([position]))[0])  # its place in the sequence
        return (j - offset - self.rank) // self.world_size

    def _permutation(self, seed: int, epoch: int) -> Permutation:
        """The epoch's bijection (the last one kept: a batch at a time asks for the same)."""
        if self._perm is None or self._perm[0] != (seed, epoch):
            self._perm = ((seed, epoch), Permutation(self.num_samples, seed=seed, epoch=epoch))
        return self._perm[1]
