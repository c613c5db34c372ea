"""Mixes and balance: several splits in stated proportions, classes in stated shares, exact on
every rank and every epoch (``Loader([a, b], weights=[0.7, 0.3])``, ``balance="classes"``).

An epoch of a mix has a stated length ``L``. :class:`MixPlan` cuts it into *slots*: each split's
quota (``L`` by the split weights, largest-remainder rounding, so the quotas sum to ``L``), and
inside a balanced split, each class's quota (the split's by the class weights, the same
rounding). A slot of ``n`` samples hands out its quota ``q`` each epoch from a stream of draws:
draw ``d`` (epoch ``e``'s are ``e * q .. e * q + q - 1``) is sample ``σ_c(d mod n)`` of the
slot, ``σ_c`` a seeded permutation of cycle ``c = d // n`` (the plain order's Feistel bijection
with the slot's and cycle's own keys: :func:`~.permutation.permute_many`, every slot of a batch
in one vectorized pass). Inside a cycle no sample repeats, so
a large split is sub-sampled (every sample once before any twice) and a small one repeats (each
cycle a fresh order).

The epoch's multiset (``L`` draws, slot by slot) is laid out by the same seeded bijection as the
plain order (:class:`~.permutation.Permutation` of ``(seed, epoch)`` over ``[0, L)``) and split
over the ranks by striding from ``offset`` (:class:`MixOrder`): every rank takes the same steps,
the ranks' union is exactly the multiset (when the ranks divide ``L``; the default length is
rounded so they do), a resume anywhere is ``O(1)``, and a resume on another number of ranks
continues the epoch's sequence where the saved ranks left it. Nothing per sample is held: a
balanced split's class members come from a memory-mapped file (:mod:`stoker.pipeline.balance_tables`).
The state is the plain order's integers plus ``epoch_length`` and the mix's checksum
(:meth:`MixPlan.checksum`): a state of another mix is refused in one line.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

import numpy as np

from stoker.errors import ArgumentError

from .base import Cursor, SampleOrder, non_negative, saved_cursor
from .global_order import CHUNK
from .permutation import Permutation, permute_many, stream_keys


def largest_remainder(total: int, weights: Sequence) -> np.ndarray:
    """``total`` cut in integer parts proportional to ``weights`` (Hamilton's method): each part
    the floor of its share, the rest one each to the largest remainders (ties to the earlier).
    The parts sum to ``total``; a zero weight gets nothing. Exact in integers (a float is a
    dyadic rational), so every rank and every machine cuts the same parts."""
    ratios = [float(x).as_integer_ratio() for x in weights]
    den = max((d for _, d in ratios), default=1)  # powers of two: the largest is a common denominator
    w = [n * (den // d) for n, d in ratios]
    whole = sum(w)
    if total and not whole:
        raise ArgumentError("the weights are all zero")
    if not whole:
        return np.zeros(len(w), np.int64)
    parts, rems = zip(*(divmod(total * x, whole) for x in w), strict=True) if w else ((), ())
    parts = list(parts)
    for i in sorted(range(len(w)), key=lambda i: (-rems[i], i))[: total - sum(parts)]:
        parts[i] += 1
    return np.asarray(parts, np.int64)


class MixPlan:
    """An epoch of ``length`` draws cut into slots (pure arithmetic; nothing per sample).

    Args:
        sizes: loadable samples per split.
        weights: the splits' proportions (any non-negative numbers, normalized).
        length: draws per epoch.
        class_counts: per split, its samples per class (balanced), or ``None`` (one slot).
        class_weights: per split, its classes' weights (``None``: equal), where balanced.
        names: the splits' names, for the summary.
        by_length: per split, ``None``, or the name of a balance whose slots are cut from the
            epoch length (per-sample weights): it stands for the split's slots in the checksum,
            and the plan has no other length (:meth:`with_length`).
    """

    def __init__(
        self, sizes, weights, *, length: int, class_counts=None, class_weights=None, names=None, by_length=None
    ):
        self.sizes = [int(n) for n in sizes]
        self.weights = [float(w) for w in weights]
        self.length = non_negative(length, "epoch_length")
        self.names = list(names) if names is not None else [f"split {i}" for i in range(len(self.sizes))]
        class_counts = class_counts or [None] * len(self.sizes)
        class_weights = class_weights or [None] * len(self.sizes)
        #: draws per split per epoch
        self.split_quota = largest_remainder(self.length, self.weights)
        split, klass, size, quota = [], [], [], []
        for s, (n, q, counts) in enumerate(zip(self.sizes, self.split_quota.tolist(), class_counts, strict=True)):
            if counts is None:
                split.append(s), klass.append(-1), size.append(n), quota.append(q)
                continue
            counts = np.asarray(counts, np.int64)
            cw = np.ones(len(counts)) if class_weights[s] is None else np.asarray(class_weights[s], float)
            cw = np.where(counts > 0, cw, 0.0)  # a class with no sample gets no share
            for c, cq in enumerate(largest_remainder(q, cw.tolist()).tolist()):
                if counts[c]:
                    split.append(s), klass.append(c), size.append(int(counts[c])), quota.append(cq)
        self.slot_split, self.slot_class = np.asarray(split, np.int64), np.asarray(klass, np.int64)
        self.slot_size, self.slot_quota = np.asarray(size, np.int64), np.asarray(quota, np.int64)
        #: where each slot's draws begin in the epoch's multiset (and its end)
        self.slot_start = np.concatenate([[0], np.cumsum(self.slot_quota)])
        self._checksum: str | None = None
        self.by_length = list(by_length) if by_length is not None else [None] * len(self.sizes)
        self._description = {
            "sizes": self.sizes,
            "weights": self.weights,
            "balance": [
                b if b is not None else None if c is None else [list(map(int, c)), _weights(w)]
                for c, w, b in zip(class_counts, class_weights, self.by_length, strict=True)
            ],
        }

    def with_length(self, length: int) -> MixPlan:
        """The same mix over another epoch length (refused in one line where a split's slots are
        cut from the length)."""
        if length != self.length and any(self.by_length):
            raise ArgumentError(
                f"this state's epoch has epoch_length={length}, this loader's {self.length}: balance='weights' cuts "
                f"each sample's count from the epoch length, so give epoch_length={length} to finish that epoch"
            )
        bal = self._description["balance"]
        return MixPlan(
            self.sizes,
            self.weights,
            length=length,
            class_counts=[None if b is None else b[0] for b in bal],
            class_weights=[None if b is None else b[1] for b in bal],
            names=self.names,
        )

    def checksum(self) -> str:
        """What names the mix's sample sequence apart from its length: the splits' sizes, their
        weights and their balance (a state of another mix means nothing in this one)."""
        if self._checksum is None:
            text = json.dumps(self._description, sort_keys=True, separators=(",", ":"))
            self._checksum = hashlib.sha256(text.encode()).hexdigest()[:16]
        return self._checksum

    def draws(self, seed: int, epoch: int, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(slot, member)`` of the multiset's draws ``m`` in ``epoch``: the slot and the sample's
        place in it, by the slot's permutation of the draw's cycle (all slots at once)."""
        slot = np.searchsorted(self.slot_start, m, side="right") - 1
        d = epoch * self.slot_quota[slot] + (m - self.slot_start[slot])  # the draw in the slot's stream
        size = self.slot_size[slot]
        cycle, t = d // size, d % size
        streams, which = _streams(slot, cycle, len(self.slot_size))  # one bijection per (slot, cycle)
        keys = stream_keys(seed, streams)
        if len(streams) > FEW_STREAMS or len(t) < SMALL_DRAWS * len(streams):
            # many slots (a balanced split's classes), or a few draws each (a batch): one pass, keys per element
            return slot, permute_many(t, size, keys, which)
        out = np.empty_like(t)
        for u in range(len(streams)):  # few: a pass each with its scalar keys, a third of the work
            sel = which == u
            out[sel] = Permutation.with_keys(int(size[np.argmax(sel)]), keys[u])(t[sel])
        return slot, out

    def summary(self) -> list[str]:
        """One line per split: its weight, quota, size and cycles per epoch."""
        lines = []
        total = sum(self.weights)
        for s, (name, q, n) in enumerate(zip(self.names, self.split_quota.tolist(), self.sizes, strict=True)):
            c = q / n
            how = "repeats" if q > n else "sub-sampled" if q < n else "each sample once"
            slots = int(np.sum(self.slot_split == s))
            bal = (
                ", each sample its share of its packed weight"
                if self.by_length[s]
                else f", balanced over {slots} classes"
                if self.slot_class[self.slot_split == s].max(initial=-1) >= 0
                else ""
            )
            lines.append(
                f"{name}: weight {self.weights[s] / total:.3g}, {q:,} of {self.length:,} a epoch from "
                f"{n:,} samples ({c:.3g} cycles: {how}{bal})".replace(" a epoch", " an epoch")
            )
        return lines


#: up to this many (slot, cycle) bijections in a batch of draws, each is evaluated on its own
FEW_STREAMS = 16
#: ... when they hold this many draws each on average: fewer, and the passes' fixed cost is most of
#: the work (a batch of 256 from 2 splits took 4 passes of the rounds, 6x the plain order's batch)
SMALL_DRAWS = 4096


def _streams(slot: np.ndarray, cycle: np.ndarray, slots: int) -> tuple[np.ndarray, np.ndarray]:
    """The distinct ``(slot, cycle)`` streams of draws (uint64 ``slot << 40 ^ cycle``) and which
    one each draw is in: counted in one pass over their small integer codes (no sort)."""
    if not len(slot):
        return np.zeros(0, np.uint64), np.zeros(0, np.int64)
    low = int(cycle.min())
    span = int(cycle.max()) - low + 1
    if slots * span > 2 * len(slot) + 4096:  # more codes than draws: sorting them is cheaper
        stream = (slot.astype(np.uint64) << np.uint64(40)) ^ cycle.astype(np.uint64)
        streams, which = np.unique(stream, return_inverse=True)
        return streams, which.reshape(-1)
    code = slot * span + (cycle - low)
    present = np.flatnonzero(np.bincount(code, minlength=slots * span))
    rank = np.zeros(slots * span, np.int64)
    rank[present] = np.arange(len(present))
    streams = ((present // span).astype(np.uint64) << np.uint64(40)) ^ (present % span + low).astype(np.uint64)
    return streams, rank[code]


def _weights(w) -> list | None:
    return None if w is None else [float(x) for x in w]


class MixOrder(SampleOrder):
    """The order of a mix (:class:`MixPlan`): train lays out the epoch's multiset by a seeded
    bijection and splits it over the ranks by striding; val reads every split whole, one after
    another, ``rank::world_size`` (the plain val order over the splits' samples).

    Args:
        plan: the mix.
        members: per split, a function of slot-member arrays ``(class, place)`` to the split's
            loadable positions (a balanced split's class members), or ``None`` (identity).
        split_offsets: where each split's loadable positions begin in the mix's.
        rank, world_size, train, batch_size, drop_last: as every order.
    """

    name = "mix"

    def __init__(self, plan: MixPlan, members, split_offsets, *, rank, world_size, train, batch_size, drop_last):
        counts = plan.sizes if not train else [plan.length]
        super().__init__(
            counts, rank=rank, world_size=world_size, train=train, batch_size=batch_size, drop_last=drop_last
        )
        self.plan, self.members = plan, list(members)
        self.split_offsets = np.asarray(split_offsets, np.int64)
        self._resumed: MixPlan | None = None  # the saved length's plan, for an epoch resumed from an offset
        self._perm: tuple | None = None

    def _plan(self, offset: int) -> MixPlan:
        return self._resumed if offset and self._resumed is not None else self.plan

    def share(self, rank: int | None = None, offset: int = 0) -> int:
        rank = self.rank if rank is None else rank
        if not self.train:
            return len(range(rank, self.num_samples, self.world_size))
        return (self._plan(offset).length - offset) // self.world_size

    def positions(self, seed: int, epoch: int, offset: int = 0, start: int = 0, stop: int | None = None) -> np.ndarray:
        draws = self.rank_draws(offset, start, stop)
        if not self.train:
            return draws
        plan = self._plan(offset)
        at, layout = offset + draws, self._layout(plan.length, seed, epoch)
        parts = [self.locate(plan, seed, epoch, layout(at[i : i + CHUNK])) for i in range(0, len(at), CHUNK)]
        return np.concatenate(parts) if parts else at  # bounded temporaries: a chunk at a time

    def locate(self, plan: MixPlan, seed: int, epoch: int, m: np.ndarray) -> np.ndarray:
        """The mix's loadable positions of the multiset's draws ``m`` of ``epoch``."""
        slot, member = plan.draws(seed, epoch, m)
        split = plan.slot_split[slot]
        out = member.copy()
        for s, fn in enumerate(self.members):
            sel = split == s
            if fn is not None and sel.any():
                out[sel] = fn(plan.slot_class[slot[sel]], member[sel])
        return out + self.split_offsets[split]

    def split_of(self, positions) -> np.ndarray:
        """The split (its number in the mix) of each of the mix's loadable ``positions``."""
        return np.searchsorted(self.split_offsets, np.asarray(positions, np.int64), side="right") - 1

    def _layout(self, length: int, seed: int, epoch: int) -> Permutation:
        if self._perm is None or self._perm[0] != (length, seed, epoch):
            self._perm = ((length, seed, epoch), Permutation(length, seed=seed, epoch=epoch))
        return self._perm[1]

    def mode(self) -> dict:
        return {"shuffle": self.name, "mix": self.plan.checksum()}

    def state_fields(self) -> dict:
        return (
            {"mix": self.plan.checksum(), "epoch_length": self.plan.length}
            if self.train
            else {"mix": self.plan.checksum()}
        )

    def check_state(self, state: dict, saved_world: int) -> None:
        saved = state.get("mix")
        if saved is None:
            raise ArgumentError(
                "state was saved by a loader of one split, this loader reads a mix (another sample order)"
            )
        if saved != self.plan.checksum():
            raise ArgumentError(
                f"state was saved with mix {saved}, this loader has mix {self.plan.checksum()} "
                "(other splits, weights or balance: another sample order)"
            )

    def restore(self, state: dict, *, where) -> Cursor:
        """As every order's (one line naming the bad value), and: a state of another mix is
        refused; a train state of another epoch length (the default length follows the ranks)
        continues its epoch at the saved length, the next epochs at this loader's."""
        saved_world = self.checked_world(state)
        seed, epoch, position, offset = saved_cursor(state)
        length = non_negative(state.get("epoch_length", self.plan.length), "state['epoch_length']")
        self._resumed = None
        if not self.train:
            return Cursor(seed, epoch, position if saved_world == self.world_size else 0, 0)
        if position or offset:
            if (
                saved_world != self.world_size or length != self.plan.length
            ):  # the saved ranks handed out offset .. offset + W * position
                offset, position = offset + saved_world * position, 0
            if length != self.plan.length:
                self._resumed = self.plan.with_length(length)
            if offset > length:
                raise ArgumentError(f"state['offset']={offset} is past the {length} samples of an epoch of {where}")
        stop = self.stop(offset)
        if position > stop:
            raise ArgumentError(
                f"state['position']={position} is past the end of rank {self.rank}'s epoch "
                f"({stop} samples): the state is from another batch size"
            )
        return Cursor(seed, epoch, position, offset)


__all__ = ["MixOrder", "MixPlan", "largest_remainder"]
