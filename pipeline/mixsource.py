"""The split source of a mix: several splits read as one (``Loader([a, b], weights=[0.7, 0.3])``),
and the class members a balanced split draws from (``balance="classes"``).

:class:`MixSource` is a :class:`~.stages.SplitSource` of several splits: its :class:`MixIndex`
numbers the splits' samples one split after another, so the batch planner, every backend and the
train recipe read a mix as they read a split. The order over it is :class:`~.order.mix.MixOrder`
(:func:`mix_order`). A balanced split's samples by class are a memory-mapped file beside its
table (:func:`class_members`: built once per manifest, read where a rank's draws land).
"""

from __future__ import annotations

import dataclasses
import hashlib
import numbers
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from stoker.errors import ArgumentError

from .balance_tables import ClassSlots, class_members
from .cache import is_url
from .loader_checks import check_cache_limit
from .options import SOURCE_STORAGE, Order, Source, Storage
from .order.mix import MixOrder, MixPlan, largest_remainder
from .policies import SamplingPolicy, balance_policy, policy_names, register_policy
from .shards.kinds import Target
from .shards.samples import SampleIndex

#: what ``balance=`` takes by name, built in (a registered balance policy is one too: :mod:`.policies`)
BALANCES = ("classes", "weights")


@dataclass(frozen=True)
class MixSpec:
    """A Loader's mix: its splits (each a :class:`~.options.Source`), their weights (``None``: their
    sizes, so an epoch of their sum reads each sample once), the epoch length (``None``: the sum of
    the splits, rounded down so the ranks' batches divide it), the balance inside each split
    (``None``, ``"classes"``, ``"weights"`` or ``{class_index: weight}``) and the splits left out
    (``"path: why"``: a weight of 0)."""

    sources: tuple
    weights: tuple | None
    epoch_length: int | None = None
    balance: Any = None
    left_out: tuple = ()
    #: one split read plainly (a source of one, ordered by ``shuffle=``): no mix keyword was given
    plain: bool = False

    @classmethod
    def one(cls, path: Any) -> MixSpec:
        """One split (a path, a URL or a :class:`~.options.Source`), read plainly."""
        return cls((Source.of(path),), None, plain=True)

    @property
    def paths(self) -> tuple:
        """The splits' paths or URLs."""
        return tuple(s.path for s in self.sources)

    @classmethod
    def of(cls, path: Any, options: dict) -> MixSpec | None:
        """The mix ``Loader(path, weights=, epoch_length=, balance=)`` asks for (those keywords
        are taken out of ``options``), or ``None``: one split, plainly. A split of weight 0 is left
        out (:attr:`left_out`)."""
        weights = options.pop("weights", None)
        length = options.pop("epoch_length", None)
        balance = options.pop("balance", None)
        many = isinstance(path, (list, tuple))
        weighted = isinstance(path, Source) and path.weight is not None
        if not many and not weighted and weights is None and length is None and balance is None:
            return None
        sources = tuple(Source.of(p) for p in (path if many else (path,)))
        if not sources:
            raise ArgumentError("Loader([]) needs at least one split")
        own = [s.weight for s in sources]
        if any(w is not None for w in own):
            if weights is not None:
                raise ArgumentError("weights= and Source(weight=) are both given: give each split's weight once")
            if None in own:
                bare = sources[own.index(None)].path
                raise ArgumentError(f"Source(weight=) is given to some splits only: give {bare} one too")
            weights = own
        if weights is not None:  # None: the splits' sizes (mix_order), each sample once an epoch
            if not isinstance(weights, (list, tuple, np.ndarray)):
                raise ArgumentError(f"weights={weights!r} must be a list of numbers, one per split")
            weights = tuple(weights)
            _check_weights(weights, len(sources))
            weights = tuple(float(w) for w in weights)
        if length is not None and (isinstance(length, bool) or not isinstance(length, int) or length < 1):
            raise ArgumentError(f"epoch_length={length!r} must be a positive integer")
        if balance is not None and not isinstance(balance, dict) and balance not in policy_names("balance"):
            raise ArgumentError(
                f"balance={balance!r} must be one of {list(policy_names('balance'))} or a {{class_index: weight}} dict"
            )
        left_out: tuple = ()
        if weights is not None and 0.0 in weights:  # left out before any of its files is opened
            left_out = tuple(f"{s.path}: weight 0" for s, w in zip(sources, weights, strict=True) if not w)
            sources, weights = zip(*((s, w) for s, w in zip(sources, weights, strict=True) if w), strict=True)
        return cls(tuple(sources), weights, length, balance, left_out)

    def without(self, empty: Sequence[int]) -> MixSpec:
        """This mix without the splits ``empty`` (numbers; their size is their weight: 0)."""
        keep = [k for k in range(len(self.sources)) if k not in set(empty)]
        return dataclasses.replace(
            self,
            sources=tuple(self.sources[k] for k in keep),
            left_out=self.left_out
            + tuple(f"{self.sources[k].path}: no loadable samples (its weight: its size, 0)" for k in empty),
        )


def _check_weights(weights: tuple, splits: int) -> None:
    if len(weights) != splits:
        raise ArgumentError(f"weights={list(weights)} has {len(weights)} values for {splits} splits")
    for w in weights:
        if isinstance(w, bool) or not isinstance(w, numbers.Real) or not w >= 0 or w == float("inf"):
            raise ArgumentError(f"weights={list(weights)}: each must be a finite number >= 0")
    if not sum(weights):
        raise ArgumentError(f"weights={list(weights)}: at least one must be above 0")


class MixIndex:
    """Several splits' :class:`~.shards.samples.SampleIndex` as one: sample ``g`` of the mix is
    sample ``g - start[s]`` of split ``s``; shards and loadable positions are numbered the same
    way (one split after another). Shard names are the shards' full paths."""

    def __init__(self, parts: Sequence[SampleIndex]):
        self.parts = list(parts)
        first = self.parts[0]
        self.target, self.manifest, self.with_json = first.target, first.manifest, first.with_json
        self.split_dir = first.split_dir
        #: where each split's samples, loadable samples and shards begin (and the totals)
        self.starts = np.cumsum([0, *(len(p) for p in self.parts)])
        self.valid_starts = np.cumsum([0, *(p.num_valid for p in self.parts)])
        self.shard_names = [f"{p.split_dir}{os.sep}{n}" for p in self.parts for n in p.shard_names]  # no Path per shard
        self.shard_start = np.concatenate(
            [p.shard_start[:-1] + s for p, s in zip(self.parts, self.starts, strict=False)] + [self.starts[-1:]]
        )
        self.num_skipped = sum(p.num_skipped for p in self.parts)

    @property
    def num_valid(self) -> int:
        return int(self.valid_starts[-1])

    def __len__(self) -> int:
        return int(self.starts[-1])

    @property
    def max_maps(self) -> int | None:
        return self.parts[0].max_maps

    @max_maps.setter
    def max_maps(self, value: int | None) -> None:
        for p in self.parts:
            p.max_maps = value

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    def _split(self, idx, starts) -> np.ndarray:
        return np.searchsorted(starts, np.asarray(idx, np.int64), side="right") - 1

    def _each(self, idx, fn):
        """``fn(part, local positions)`` per split the samples ``idx`` are in, with the selection."""
        idx = np.asarray(idx, np.int64)
        split = self._split(idx, self.starts)
        for s in np.unique(split).tolist():
            sel = split == s
            yield sel, fn(self.parts[s], idx[sel] - self.starts[s])

    def valid_at(self, k) -> np.ndarray:
        k = np.asarray(k, np.int64)
        out = np.empty(k.shape, np.int64)
        split = self._split(k, self.valid_starts)
        for s in np.unique(split).tolist():
            sel = split == s
            out[sel] = self.parts[s].valid_at(k[sel] - self.valid_starts[s]) + self.starts[s]
        return out

    def valid_position(self, g: int) -> int:
        s = int(self._split(g, self.starts))
        return int(self.valid_starts[s]) + self.parts[s].valid_position(int(g - self.starts[s]))

    @property
    def valid(self) -> np.ndarray:
        return np.concatenate([p.valid + s for p, s in zip(self.parts, self.starts, strict=False)])

    def valid_counts(self) -> np.ndarray:
        return np.concatenate([p.valid_counts() for p in self.parts])

    def shard_of(self, i: int) -> int:
        return int(np.searchsorted(self.shard_start, i, side="right") - 1)

    def shard_path(self, i: int) -> Path:
        return Path(self.shard_names[self.shard_of(i)])

    @property
    def has_sizes(self) -> bool:
        return all(p.has_sizes for p in self.parts)

    def stored_sizes(self, idx) -> np.ndarray:
        idx = np.asarray(idx, np.int64)
        out = np.zeros((len(idx), 2), np.int64)
        for sel, wh in self._each(idx, lambda p, i: p.stored_sizes(i)):
            out[sel] = wh
        return out

    def images(self, idx) -> tuple[list, np.ndarray]:
        return self._gather_views(idx, lambda p, i: p.images(i))

    def masks(self, idx) -> tuple[list, np.ndarray]:
        return self._gather_views(idx, lambda p, i: p.masks(i))

    def _gather_views(self, idx, fn) -> tuple[list, np.ndarray]:
        """``fn``'s ``(views, (width, height) rows)`` of each split's part of ``idx``, put back in ``idx``'s order."""
        out, wh = [None] * len(idx), np.zeros((len(idx), 2), np.int64)
        for sel, (views, dims) in self._each(idx, fn):
            for k, v in zip(np.flatnonzero(sel).tolist(), views, strict=True):
                out[k] = v
            wh[sel] = dims
        return out, wh

    def _gather(self, idx, fn, target=None):
        """``fn``'s values of each split's part of ``idx``, put together in ``idx``'s order by the
        kind (:meth:`~.shards.kinds.Target.gather`: an array, or a list of boxes)."""
        pieces = list(self._each(idx, fn))
        if not pieces:
            return fn(self.parts[0], np.asarray(idx, np.int64))
        return (target or type(self.target)).gather(self.target, pieces, len(idx))

    def targets(self, idx) -> np.ndarray:
        return self._gather(idx, lambda p, i: p.targets(i))

    def labels(self, idx) -> np.ndarray:
        return self._gather(idx, lambda p, i: p.labels(i), Target)  # class indices: the base's array gather

    def label(self, i: int) -> int:
        return int(self.labels(np.array([i], np.int64))[0])

    def _one(self, i: int, method: str):
        s = int(self._split(i, self.starts))
        return getattr(self.parts[s], method)(int(i - self.starts[s]))

    def key(self, i: int) -> str:
        return self._one(i, "key")

    def meta(self, i: int) -> bytes:
        return self._one(i, "meta")

    def describe(self, i: int) -> str:
        return self._one(i, "describe")

    def image(self, i: int) -> np.ndarray:
        return self._one(i, "image")

    def target_stats(self):
        return None  # a mix's statistics are its splits' (loader.mix_sources[s].target_stats())

    def close(self) -> None:
        for p in self.parts:
            p.close()


class MixCache:
    """A mix's URL splits' caches as one: :meth:`ensure` fetches each shard (named by its full
    path in the :class:`MixIndex`) through its split's cache."""

    def __init__(self, sources: Sequence[Any]):
        self._by_name = {}
        for src in sources:
            if src.cache is not None:
                for name in src.index.shard_names:
                    self._by_name[f"{src.index.split_dir}{os.sep}{name}"] = (src.cache, name)
        self.cache_limit = None

    def ensure(self, names) -> None:
        wanted: dict = {}
        for n in names:
            if n in self._by_name:
                cache, name = self._by_name[n]
                wanted.setdefault(id(cache), (cache, []))[1].append(name)
        for cache, shard_names in wanted.values():
            cache.ensure(shard_names)


class MixSource:
    """A Loader's source: its splits, one (a plain split is a source of one) or several (a mix).
    Each split's :class:`~.stages.SplitSource` (local, or a URL's through its cache, with the
    options its :class:`~.options.Source` gives it, else the Loader's); a mix's are checked to
    share one label space (the kind says: :meth:`~.shards.kinds.Target.same_space`) and read as
    one :class:`MixIndex`, a source of one as its split's index. A split of a mix without loadable
    samples is one line naming it when it has a weight; without ``weights=`` (its size is its
    weight) it is left out, saying so."""

    def __init__(self, spec: MixSpec, storage: Storage):
        from .stages import SplitSource

        self.sources = []
        try:
            for src in spec.sources:
                self.sources.append(SplitSource(src.path, _own_storage(src, spec.sources, storage)))
            empty = [k for k, s in enumerate(self.sources) if not s.index.num_valid and not spec.plain]
            if empty and spec.weights is not None:
                s = self.sources[empty[0]]
                raise ArgumentError(
                    f"{s.path} has no loadable samples: a split of a mix needs some (give it weight 0 to leave it out)"
                )
            if empty and len(empty) < len(self.sources):
                for k in reversed(empty):
                    self.sources.pop(k).close()
                spec = spec.without(empty)
        except BaseException:
            self.close()
            raise
        self.spec = spec
        #: the sampling policy's role that orders it (:mod:`.policies`): ``shuffle=``'s, or a mix's
        self.role = "shuffle" if spec.plain else "mix"
        self._check_kinds()
        self.remote = any(s.remote for s in self.sources)
        if spec.plain:  # a source of one: its split's index, cache and name, nothing in between
            one = self.sources[0]
            self.path, self.index, self.cache = one.path, one.index, one.cache
            return
        #: the mix's name in messages: its splits, joined
        self.path = " + ".join(str(s.path) for s in self.sources)
        self.index = MixIndex([s.index for s in self.sources])
        self.cache = MixCache(self.sources) if self.remote else None

    def _check_kinds(self) -> None:
        first = self.sources[0]
        for other in self.sources[1:]:
            a, b = first.index.manifest, other.index.manifest
            if not a.target.same_space(a.classes, b.target, b.classes):
                raise ArgumentError(
                    f"a mix needs splits of one target: {first.path} has {a.target.space(a.classes)}, "
                    f"{other.path} has {b.target.space(b.classes)}"
                )

    def target_stats(self):
        """A source of one: its split's (:meth:`.stages.SplitSource.target_stats`); a mix's are its
        splits' (``loader.source.sources[s].target_stats()``)."""
        return self.sources[0].target_stats() if self.spec.plain else None

    def check_cache_limit(self, sample_order: Any, *, seed: int, block_shards: int) -> None:
        """Each URL split's cache holds that split whole (a mix reads every split each epoch)."""
        for s in self.sources:
            if s.cache is not None:
                limit = s.cache.cache_limit
                check_cache_limit(limit, sample_order, s.index, seed=seed, block_shards=block_shards, path=s.path)

    def close(self) -> None:
        for s in self.sources:
            s.close()


def _own_storage(src: Source, sources: Sequence[Source], storage: Storage) -> Storage:
    """The storage of one split of a mix: its own URL options, else the Loader's (a cache folder of
    its own under the Loader's ``cache_dir`` where several URL splits share it: shard names may
    coincide). The Loader's URL options apply to the URL splits only (refused where there is none);
    a local split's own are refused, naming it."""
    if not is_url(src.path):
        if src.own_storage():
            storage_of = Storage(**{k: getattr(src, k) for k in src.own_storage()})
            storage_of.check_local(src.path)
        if not any(is_url(s.path) for s in sources):
            storage.check_local(src.path)
        return dataclasses.replace(storage, **dict.fromkeys(SOURCE_STORAGE))
    own = src.storage(storage)
    urls = [s for s in sources if is_url(s.path)]
    if src.cache_dir is None and storage.cache_dir is not None and len(urls) > 1:
        sub = hashlib.sha256(str(src.path).rstrip("/").encode()).hexdigest()[:12]
        own = dataclasses.replace(own, cache_dir=Path(storage.cache_dir) / sub)
    return own


class MixPolicy(SamplingPolicy):
    """The sampling policy of a mix (``Loader([a, b], weights=...)``): its plan (quotas per split,
    and per group where a split is balanced by a ``balance`` policy), checked to give every rank a
    batch. ``shuffle="block"`` is one line."""

    name, role = "mix", "mix"

    def order(self, source, options, *, rank, world_size, train, batch_size, drop_last):
        spec = source.spec
        if options.shuffle != "global":
            raise ArgumentError(f"a mix reads shuffle='global' only, not shuffle={options.shuffle!r}")
        sizes = [s.index.num_valid for s in source.sources]
        length = spec.epoch_length
        if length is None:
            step = batch_size * world_size if drop_last else world_size
            length = max(step, sum(sizes) // step * step)
        split_weights = spec.weights if spec.weights is not None else sizes
        quotas = largest_remainder(length, split_weights).tolist()
        balance = balance_policy(spec.balance) if train and spec.balance is not None else None
        members, counts, weights, by_length = [], [], [], []
        for s, quota in zip(source.sources, quotas, strict=True):
            slots, c, w = balance.groups(spec.balance, s, quota) if balance is not None else (None, None, None)
            members.append(slots), counts.append(c), weights.append(w)
            by_length.append(balance.by_length(s) if balance is not None else None)
        plan = MixPlan(
            sizes,
            split_weights,
            length=length,
            class_counts=counts,
            class_weights=weights,
            names=[str(s.path) for s in source.sources],
            by_length=by_length,
        )
        kw = {"rank": rank, "world_size": world_size, "train": train, "batch_size": batch_size, "drop_last": drop_last}
        return MixOrder(plan, members, np.asarray(source.index.valid_starts[:-1]), **kw)


register_policy(MixPolicy)


def mix_order(
    options: Order, source: MixSource, *, rank: int, world_size: int, train: bool, batch_size: int
) -> MixOrder:
    """The order stage of a mix (:func:`.stages.sample_order` with its policy, :class:`MixPolicy`)."""
    from .stages import sample_order

    return sample_order(options, source, rank=rank, world_size=world_size, train=train, batch_size=batch_size)


class Mix:
    """What a Loader of a mix says about it (``loader.mix``): each split's weight, quota and
    cycles (:meth:`summary`), which split a sample is from (:meth:`split_of`)."""

    def __init__(self, plan: MixPlan, index: MixIndex, balance: Any):
        self.plan, self.balance = plan, balance
        self.names, self.weights = list(plan.names), list(plan.weights)
        self.quotas, self.length = plan.split_quota.tolist(), plan.length
        self._starts = index.starts

    def split_of(self, ids) -> np.ndarray:
        """The split (its number in the mix) of each sample of ``ids`` (the Loader's sample
        positions: :meth:`~.loader.Loader.indices`, :meth:`~.loader.Loader.epoch_batches`)."""
        return np.searchsorted(self._starts, np.asarray(ids, np.int64), side="right") - 1

    def summary(self) -> list[str]:
        """One line per split: weight, quota of the epoch, its size and cycles (repeats or sub-sampled)."""
        return self.plan.summary()

    def describe(self) -> str:
        """The mix in one line (``a:0.7,b:0.3``, with its balance and epoch length)."""
        total = sum(self.weights)
        text = ",".join(f"{n}:{w / total:.3g}" for n, w in zip(self.names, self.weights, strict=True))
        bal = "" if self.balance is None else f" balance={self.balance}"
        return f"{text} epoch_length={self.length}{bal}"


def start_mix(loader: Any, spec: MixSpec | None) -> Mix | None:
    """A Loader of a mix: its :class:`Mix`; on rank 0, one line per split a weight of 0 (or no
    sample, without ``weights=``) left out, and of a train loader one line per split (its quota
    and cycles), on stderr."""
    if spec is None:
        return None
    mix = Mix(getattr(loader.order, "inner", loader.order).plan, loader.index, spec.balance)  # bucketed: the mix's
    if loader.rank == 0:
        for why in loader.source.spec.left_out:
            print(f"stoker mix: {why}: left out", file=sys.stderr)
    if loader.train and loader.rank == 0:
        for line in mix.summary():
            print(f"stoker mix: {line}", file=sys.stderr)
    return mix


__all__ = [
    "Mix",
    "start_mix",
    "BALANCES",
    "ClassSlots",
    "MixCache",
    "MixIndex",
    "MixSource",
    "MixPolicy",
    "MixSpec",
    "class_members",
    "mix_order",
]
