"""What an order is (:class:`SampleOrder`): this rank's share of an epoch, its positions, its
windows, the batches they are cut into (:class:`EpochBatches`, computed as they are read) and the
resume state it writes and checks (:class:`Cursor`)."""

from __future__ import annotations

import operator
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np

from stoker.errors import ArgumentError


def num_batches(n: int, batch_size: int, *, drop_last: bool) -> int:
    return n // batch_size if drop_last else -(-n // batch_size)


class Cursor(NamedTuple):
    """Where a Loader's iteration stands: ``position`` samples into this rank's part of
    ``epoch``, split over the ranks from ``offset`` (:meth:`SampleOrder.restore`)."""

    seed: int
    epoch: int
    position: int
    offset: int


def non_negative(value: Any, name: str) -> int:
    """``value`` as an int, or an ``ArgumentError`` (a ``ValueError``) naming it."""
    try:
        value = operator.index(value)
    except TypeError:
        raise ArgumentError(f"{name}={value!r} must be a non-negative integer") from None
    if value < 0:
        raise ArgumentError(f"{name}={value!r} must be a non-negative integer")
    return value


def saved_cursor(state: dict) -> Cursor:
    """The ``seed``, ``epoch``, ``position`` and ``offset`` (default 0) ``state`` holds, as saved
    (before any change of rank count), each checked non-negative."""
    return Cursor(
        non_negative(state["seed"], "state['seed']"),
        non_negative(state["epoch"], "state['epoch']"),
        non_negative(state["position"], "state['position']"),
        non_negative(state.get("offset", 0), "state['offset']"),
    )


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

    def rank_draws(self, offset: int, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Which of the epoch's draws, counted from ``offset``, this rank's ``start .. stop`` (default:
        to the end of its share) are: the ranks take turns, ``rank, rank + W, ...``."""
        share = self.share(self.rank, offset)
        stop = share if stop is None else min(stop, share)
        return self.rank + self.world_size * np.arange(start, max(start, stop), dtype=np.int64)

    def rank_position(self, seed: int, epoch: int, offset: int, position: int) -> int:
        """Where ``position`` is in this rank's order of ``epoch`` (it must be there)."""
        return int(np.flatnonzero(self.positions(seed, epoch, offset) == position)[0])

    def following(self, seed: int, epoch: int, offset: int, k: int, chunk: int = 64) -> Iterator[np.ndarray]:
        """This rank's positions after its ``k``-th, wrapping around to ``k``, ``chunk`` at a time
        (where a train batch with nothing loadable takes its stand-ins from)."""
        share = self.share(self.rank, offset)
        for lo, hi in ((k + 1, share), (0, k + 1)):
            for s in range(lo, hi, chunk):
                yield self.positions(seed, epoch, offset, s, min(s + chunk, hi))

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
            raise ArgumentError(
                f"state was saved with {fmt(saved)}, this loader has {fmt(mine)} (another sample order)"
            )

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

    def checked_world(self, state: dict) -> int:
        """The number of ranks ``state`` was saved on, once its shape (a dict with ``seed``,
        ``epoch``, ``position``) and :meth:`check_state` pass: one ``ArgumentError`` if not."""
        if not isinstance(state, dict):
            raise ArgumentError(f"state must be the dict Loader.state_dict() returned, not {type(state).__name__}")
        missing = {"seed", "epoch", "position"} - set(state)
        if missing:
            raise ArgumentError(f"state is missing {sorted(missing)}")
        saved_world = state.get("world_size", self.world_size)
        if not isinstance(saved_world, int) or saved_world < 1:
            raise ArgumentError(f"state['world_size']={saved_world!r} must be a positive integer")
        self.check_state(state, saved_world)
        return saved_world

    def restore(self, state: dict, *, where: Any) -> Cursor:
        """Where ``state`` (a :meth:`state`, possibly saved on another number of ranks) continues
        on this rank, checked: one ``ArgumentError`` (a ``ValueError``) naming the bad value,
        ``where`` (the split) in it."""
        saved_world = self.checked_world(state)
        if state.get("num_samples", self.num_samples) != self.num_samples:
            raise ArgumentError(
                f"state was saved for num_samples={state['num_samples']}, {where} has {self.num_samples}"
            )
        seed, epoch, position, offset = saved_cursor(state)
        if saved_world != self.world_size:  # the saved ranks handed out offset .. offset + W * position
            offset, position = (offset + saved_world * position, 0) if self.train else (0, 0)
        if self.train and offset > self.num_samples:
            raise ArgumentError(f"state['offset']={offset} is past the {self.num_samples} samples of {where}")
        stop = self.stop(offset)
        if position > stop:
            raise ArgumentError(
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


#: batches an :class:`EpochBatches` computes at once: an order's call has a fixed cost (a few dozen
#: numpy passes: 0.4 ms of the plain order's 0.45 ms a batch of 256, 1.5 ms of a 2-split mix's),
#: shared by this many batches
BLOCK_BATCHES = 16


class EpochBatches(Sequence):
    """A rank's batches of one epoch (arrays of sample positions in the split), computed a block of
    :data:`BLOCK_BATCHES` at a time as they are read: an epoch's start and a resume cost a block,
    not the rank's share."""

    def __init__(self, order: SampleOrder, seed: int, epoch: int, offset: int, start: int, stop: int, to_global):
        self.order, self.seed, self.epoch, self.offset = order, seed, epoch, offset
        self.start, self.stop, self.to_global = start, stop, to_global
        self._block: tuple[int, np.ndarray] | None = None  # (block number, its positions)

    def __len__(self) -> int:
        return max(0, -(-(self.stop - self.start) // self.order.batch_size))

    def same(self, other: object) -> bool:
        """Are ``other``'s batches these (the same order, seed, epoch and range)?"""
        return isinstance(other, EpochBatches) and (
            other.order is self.order
            and (other.seed, other.epoch, other.offset, other.start, other.stop)
            == (self.seed, self.epoch, self.offset, self.start, self.stop)
            and other.to_global == self.to_global
        )

    def __getitem__(self, i: int) -> np.ndarray:
        if not isinstance(i, int):
            raise TypeError("EpochBatches takes one batch number at a time")
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"batch {i} of {n}")
        bs, k = self.order.batch_size, i % n
        b = k // BLOCK_BATCHES
        block = self._block
        if block is None or block[0] != b:  # positions are per draw: a block's slice is the batch's own
            lo = self.start + b * BLOCK_BATCHES * bs
            hi = min(lo + BLOCK_BATCHES * bs, self.stop)
            block = self._block = (b, self.to_global(self.order.positions(self.seed, self.epoch, self.offset, lo, hi)))
        at = (k - b * BLOCK_BATCHES) * bs
        return block[1][at : at + bs].copy()
