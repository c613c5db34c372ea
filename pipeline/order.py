"""Sample order: pure functions of ``(seed, epoch, rank, world, position)``.

Training sees a fresh global permutation of all samples each epoch (not a shuffle
buffer), split across ranks so that the slices are disjoint and cover the epoch.
Validation keeps the stored order and gives every sample to exactly one rank.

The permutation is never built whole: it is a seeded bijection (:mod:`.permutation`) evaluated
at this rank's positions only, so a rank's cost is its share, and a resume anywhere is ``O(1)``.

Resuming on another number of ranks (elastic): ranks step in lockstep, so after ``p`` samples
per rank the ``W`` ranks of a split at ``offset`` have handed out exactly the epoch sequence's
``offset .. offset + W * p`` (the permutation's, in order). The rest of the epoch is the sequence
from there, split over the new ranks the way an epoch is (:func:`rank_indices` with ``offset``):
every sample not yet handed out once, none handed out twice; each rank gets the same count, the
last fewer than ``W'`` left out as an epoch leaves ``n % W`` out.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from .permutation import Permutation

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
        raise ValueError(f"rank={rank} is outside world_size={world_size}")
    if train:
        if not 0 <= offset <= num_samples:
            raise ValueError(f"offset={offset} is outside the epoch's {num_samples} samples")
        per_rank = (num_samples - offset) // world_size
        at = np.arange(offset + rank, offset + per_rank * world_size, world_size, dtype=np.int64)
        return Permutation(num_samples, seed=seed, epoch=epoch)(at)
    return np.arange(rank, num_samples, world_size, dtype=np.int64)


def num_batches(n: int, batch_size: int, *, drop_last: bool) -> int:
    return n // batch_size if drop_last else -(-n // batch_size)


# ---- block mode: shards permuted and split across ranks, samples permuted within a window ----


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
        raise ValueError(f"rank={rank} is outside world_size={world_size}")
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
        raise ValueError(f"block_shards={block_shards} must be a positive integer")
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


# ---- the strategy a Loader holds: one order object, no branches ----
class Cursor(NamedTuple):
    """Where a Loader's iteration stands: ``position`` samples into this rank's part of
    ``epoch``, split over the ranks from ``offset`` (:meth:`SampleOrder.restore`)."""

    seed: int
    epoch: int
    position: int
    offset: int


def non_negative(value: Any, name: str) -> int:
    """``value`` as an int, or a ``ValueError`` naming it."""
    try:
        value = operator.index(value)
    except TypeError:
        raise ValueError(f"{name}={value!r} must be a non-negative integer") from None
    if value < 0:
        raise ValueError(f"{name}={value!r} must be a non-negative integer")
    return value


class SampleOrder:
    """How one rank's epochs are ordered and cut into batches: the strategy a
    :class:`~stoker.pipeline.loader.Loader` holds (``shuffle=`` names it).

    Fixed for the Loader's life: the loadable samples per shard, this rank, the world size,
    train or val, the batch size and ``drop_last``. Every method is a pure function of
    ``(seed, epoch, offset)``; ``offset`` is where this rank count's split of an epoch begins
    (0, or what a resume on another number of ranks continues from). Positions are into the
    split's loadable samples (``0 .. num_samples - 1``, shard after shard).

    An order defines :meth:`share`, :meth:`positions`, and where it differs from the whole-split
    default, :meth:`windows`, :meth:`state_fields` and :meth:`check_state`.
    """

    #: the ``shuffle=`` name
    name = ""

    def __init__(self, shard_counts, *, rank: int, world_size: int, train: bool, batch_size: int, drop_last: bool):
        #: loadable samples per shard, in stored order
        self.shard_counts = np.asarray(shard_counts, np.int64)
        self.num_samples = int(self.shard_counts.sum())
        self.rank, self.world_size, self.train = rank, world_size, bool(train)
        self.batch_size, self.drop_last = batch_size, bool(drop_last)

    # ---- what an order defines -------------------------------------------------------
    def share(self, rank: int | None = None, offset: int = 0) -> int:
        """Samples ``rank`` (default: this one) reads in an epoch split from ``offset``."""
        raise NotImplementedError

    def positions(self, seed: int, epoch: int, offset: int = 0, start: int = 0, stop: int | None = None) -> np.ndarray:
        """The positions this rank reads in ``epoch``, in order, before ``drop_last``: the
        ``start .. stop`` of them (default: all), computed for those only."""
        raise NotImplementedError

    def windows(self, seed: int, epoch: int) -> list | None:
        """The shard numbers of each window this rank reads in turn (a URL's cache fetches one
        window ahead), or ``None``: the whole split is needed at once."""
        return None

    def mode(self) -> dict:
        """What names this order's sample sequence (``shuffle`` and its settings)."""
        return {"shuffle": self.name}

    def state_fields(self) -> dict:
        """What a Loader's ``state_dict`` adds so a state of one order is not read by another."""
        return {}

    def check_mid_epoch(self, state: dict) -> None:
        """Refuse, in one line, a mid-epoch ``state`` whose sequence this order does not make."""

    def check_state(self, state: dict, saved_world: int) -> None:
        """Refuse, in one line, a state this order cannot continue: another order's (another
        sample sequence), or what it cannot resume from."""
        saved = {"shuffle": state.get("shuffle", "global")}
        if saved["shuffle"] == "block":
            saved["block_shards"] = state.get("block_shards")
        mine = self.mode()
        if saved != mine:
            fmt = lambda d: ", ".join(f"{k}={v!r}" for k, v in d.items())  # noqa: E731
            raise ValueError(f"state was saved with {fmt(saved)}, this loader has {fmt(mine)} (another sample order)")

    # ---- shared by every order -------------------------------------------------------
    def state(self, *, seed: int, epoch: int, position: int, offset: int) -> dict:
        """A Loader's ``state_dict``: ``{seed, epoch, position, world_size, num_samples,
        batch_size}``, ``offset`` when not 0, and the order's own fields."""
        state = {
            "seed": seed,
            "epoch": epoch,
            "position": position,
            "world_size": self.world_size,
            "num_samples": self.num_samples,
            "batch_size": self.batch_size,
        }
        if offset:
            state["offset"] = offset
        state.update(self.state_fields())  # a state of one order means nothing in another
        return state

    def restore(self, state: dict, *, where: Any) -> Cursor:
        """Where ``state`` (a :meth:`state`, possibly saved on another number of ranks) continues
        on this rank, checked: one ``ValueError`` naming the bad value, ``where`` (the split) in it."""
        if not isinstance(state, dict):
            raise ValueError(f"state must be the dict Loader.state_dict() returned, not {type(state).__name__}")
        missing = {"seed", "epoch", "position"} - set(state)
        if missing:
            raise ValueError(f"state is missing {sorted(missing)}")
        saved_world = state.get("world_size", self.world_size)
        if not isinstance(saved_world, int) or saved_world < 1:
            raise ValueError(f"state['world_size']={saved_world!r} must be a positive integer")
        self.check_state(state, saved_world)
        if state.get("num_samples", self.num_samples) != self.num_samples:
            raise ValueError(f"state was saved for num_samples={state['num_samples']}, {where} has {self.num_samples}")
        seed = non_negative(state["seed"], "state['seed']")
        epoch = non_negative(state["epoch"], "state['epoch']")
        position = non_negative(state["position"], "state['position']")
        offset = non_negative(state.get("offset", 0), "state['offset']")
        if saved_world != self.world_size:  # the saved ranks handed out offset .. offset + W * position
            offset, position = (offset + saved_world * position, 0) if self.train else (0, 0)
        if self.train and offset > self.num_samples:
            raise ValueError(f"state['offset']={offset} is past the {self.num_samples} samples of {where}")
        stop = self.stop(offset)
        if position > stop:
            raise ValueError(
                f"state['position']={position} is past the end of rank {self.rank}'s epoch "
                f"({stop} samples): the state is from another split or batch size"
            )
        if (position or offset) and position < stop:
            self.check_mid_epoch(state)
        return Cursor(seed, epoch, position, offset if self.train else 0)

    def stop(self, offset: int = 0) -> int:
        """Samples of this rank's epoch that are handed out (``drop_last`` applied)."""
        n = self.share(self.rank, offset)
        return n - n % self.batch_size if self.drop_last else n

    def num_batches(self, offset: int = 0) -> int:
        """Batches this rank yields in an epoch split from ``offset``."""
        return num_batches(self.share(self.rank, offset), self.batch_size, drop_last=self.drop_last)

    def batches(self, seed: int, epoch: int, offset: int, start: int, stop: int, to_global) -> EpochBatches:
        """This rank's epoch from ``start`` to ``stop`` cut into batches of ``batch_size``, each
        made when it is asked for (``to_global`` maps positions to the split's samples)."""
        return EpochBatches(self, seed, epoch, offset, start, stop, to_global)


class EpochBatches(Sequence):
    """A rank's batches of one epoch (arrays of sample positions in the split), computed one at a
    time as they are read: an epoch's start and a resume cost a batch, not the rank's share."""

    def __init__(self, order: SampleOrder, seed: int, epoch: int, offset: int, start: int, stop: int, to_global):
        self.order, self.seed, self.epoch, self.offset = order, seed, epoch, offset
        self.start, self.stop, self.to_global = start, stop, to_global

    def __len__(self) -> int:
        return max(0, -(-(self.stop - self.start) // self.order.batch_size))

    def __getitem__(self, i: int) -> np.ndarray:
        if not isinstance(i, int):
            raise TypeError("EpochBatches takes one batch number at a time")
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"batch {i} of {n}")
        lo = self.start + (i % n) * self.order.batch_size
        hi = min(lo + self.order.batch_size, self.stop)
        return self.to_global(self.order.positions(self.seed, self.epoch, self.offset, lo, hi))


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
            raise ValueError(
                f"state is mid-epoch {state.get('epoch')!r} of a train order this stoker no longer makes (an older "
                "stoker's permutation): resume it with that stoker, or from the start of an epoch "
                "(state['position'] = 0, no 'offset')"
            )

    def positions(self, seed: int, epoch: int, offset: int = 0, start: int = 0, stop: int | None = None) -> np.ndarray:
        share = self.share(self.rank, offset)
        stop = share if stop is None else min(stop, share)
        k = np.arange(start, max(start, stop), dtype=np.int64)
        if not self.train:
            return self.rank + self.world_size * k
        if not 0 <= offset <= self.num_samples:
            raise ValueError(f"offset={offset} is outside the epoch's {self.num_samples} samples")
        return self._permutation(seed, epoch)(offset + self.rank + self.world_size * k)

    def _permutation(self, seed: int, epoch: int) -> Permutation:
        """The epoch's bijection (the last one kept: a batch at a time asks for the same)."""
        if self._perm is None or self._perm[0] != (seed, epoch):
            self._perm = ((seed, epoch), Permutation(self.num_samples, seed=seed, epoch=epoch))
        return self._perm[1]


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
            raise ValueError(
                f"state was saved with world_size={saved_world}, this loader has world_size={self.world_size}: "
                "shuffle='block' resumes on the same number of ranks only (shuffle='global' resumes on any)"
            )
        super().check_state(state, saved_world)


#: the orders by ``shuffle=`` name
ORDERS: dict[str, type[SampleOrder]] = {"global": GlobalOrder, "block": BlockOrder}
#: their names, what ``shuffle=`` and ``--shuffle`` take
SHUFFLES = tuple(ORDERS)


def make_order(shuffle: str, shard_counts, *, block_shards: int, **kw) -> SampleOrder:
    """The order ``shuffle`` names over ``shard_counts`` loadable samples per shard (``kw``:
    ``rank``, ``world_size``, ``train``, ``batch_size``, ``drop_last``)."""
    if shuffle == "block":
        return BlockOrder(shard_counts, block_shards=block_shards, **kw)
    return ORDERS[shuffle](shard_counts, **kw)
