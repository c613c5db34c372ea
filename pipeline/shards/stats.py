"""What the packer saw of a split's targets: :class:`TargetStats` (the manifest's ``target.stats``)
and the mergeable :class:`StatsAccumulator` that pack and ``stoker index`` sum them with."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

import numpy as np

from stoker.errors import ArgumentError

#: a mask's "no class here" value (what CrossEntropyLoss(ignore_index=255) skips)
IGNORE_INDEX = 255


@dataclass(frozen=True)
class TargetStats:
    """What the packer saw of a split's targets (the manifest's ``target.stats``).

    Attributes:
        count: samples counted.
        mean, std, min, max: ``float``: per column, over the split's samples (population std).
        class_share: ``mask``: each pixel value's share of the labelled pixels (``ignore_index``
            left out), indexed by value ``0 .. largest value found``: the classes the masks hold
            (``len``) and the weights a loss may use.
    """

    count: int
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()
    min: tuple[float, ...] = ()
    max: tuple[float, ...] = ()
    class_share: tuple[float, ...] = ()
    #: what a kind keeps beyond these (JSON; boxes: counts per image and class, sizes)
    detail: dict | None = field(default=None, compare=False)

    @property
    def scale(self) -> tuple[float, ...]:
        """``std`` with a constant column's 0 replaced by 1 (what standardizing divides by)."""
        return tuple(s if s > 0 else 1.0 for s in self.std)

    def standardize(self, targets):
        """``(targets - mean) / std`` per column (a torch tensor on any device, or a numpy array):
        float targets in units a network learns from its first step."""
        mean, scale = self._like(targets)
        return (targets - mean) / scale

    def restore(self, outputs):
        """``outputs * std + mean``: a network's standardized outputs in the targets' own units."""
        mean, scale = self._like(outputs)
        return outputs * scale + mean

    def _like(self, x):
        if not self.mean:
            raise ArgumentError("these statistics have no mean/std (not a float target's)")
        shape = (-1,) if len(self.mean) > 1 else ()
        if isinstance(x, np.ndarray):
            return np.asarray(self.mean, np.float32).reshape(shape), np.asarray(self.scale, np.float32).reshape(shape)
        import torch

        as_t = lambda v: torch.tensor(v, dtype=torch.float32, device=x.device).reshape(shape)  # noqa: E731
        return as_t(self.mean), as_t(self.scale)

    def to_json(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items() if v not in ((), None)}

    @classmethod
    def from_json(cls, d: dict) -> TargetStats:
        if not isinstance(d, dict) or not isinstance(d.get("count"), int):
            raise ArgumentError(f"target stats must be an object with a count, got {d!r}")
        lists = {k: tuple(float(v) for v in d.get(k) or ()) for k in _STAT_LISTS}
        return cls(count=d["count"], detail=d.get("detail") if isinstance(d.get("detail"), dict) else None, **lists)


_STAT_LISTS = ("mean", "std", "min", "max", "class_share")


class StatsAccumulator:
    """Sums a split's targets as they are packed, into :class:`TargetStats`; parts (shards, worker
    processes, a resumed pack) merge exactly. ``state()`` is JSON, so a pack journal keeps it per
    shard. This class only counts; a kind that keeps statistics has a subclass of its own (its
    ``flavour``: :mod:`.kinds` holds the float columns' and the masks' pixels').

    ``StatsAccumulator(flavour, width)`` is the accumulator of that flavour (``"float"``: per
    column mean, std and range; ``"mask"``: the share of each pixel value; any other: a count).

    Args:
        kind: the flavour (what :meth:`state` records as ``kind``).
        width: values per sample (a float target's K).
    """

    #: the name a subclass is made by and its state records
    flavour: ClassVar[str] = ""
    _flavours: ClassVar[dict[str, type[StatsAccumulator]]] = {}

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if cls.flavour:
            StatsAccumulator._flavours[cls.flavour] = cls

    def __new__(cls, kind: str = "", width: int = 0):
        if cls is StatsAccumulator:  # the built-in flavours: .kinds, imported with this package
            cls = StatsAccumulator._flavours.get(kind, StatsAccumulator)
        return super().__new__(cls)

    def __init__(self, kind: str = "", width: int = 0):
        self.kind, self.width = kind or self.flavour, width
        self.count = 0

    def add(self, value) -> None:
        """One sample's target."""
        self.count += 1

    def add_many(self, values) -> None:
        """Many samples' targets at once (``[N, ...]``)."""
        for v in values:
            self.add(v)

    def merge(self, other: StatsAccumulator) -> StatsAccumulator:
        """Add ``other``'s samples to these; returns self."""
        if other.count:
            self._merge_from(other)
        return self

    def _merge_from(self, other: StatsAccumulator) -> None:
        self.count += other.count

    def state(self) -> dict:
        """A JSON form of the partial sums (:meth:`from_state` reads it back)."""
        return {"kind": self.kind, "width": self.width, "count": self.count}

    @classmethod
    def from_state(cls, d: dict) -> StatsAccumulator:
        acc = StatsAccumulator(d["kind"], int(d.get("width", 0)))
        acc.count = int(d["count"])
        acc._load(d)
        return acc

    def _load(self, d: dict) -> None:
        """The partial sums of a :meth:`state` beyond the count."""

    def result(self, ignore_index: int | None = IGNORE_INDEX) -> TargetStats | None:
        """The statistics (``None`` for a kind that keeps none, or no sample)."""
        return None


__all__ = ["StatsAccumulator", "TargetStats"]
