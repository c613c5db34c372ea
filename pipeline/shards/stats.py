"""What the packer saw of a split's targets: :class:`TargetStats` (the manifest's ``target.stats``)
and the mergeable :class:`StatsAccumulator` that pack and ``stoker index`` sum them with."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

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
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items() if v != ()}

    @classmethod
    def from_json(cls, d: dict) -> TargetStats:
        if not isinstance(d, dict) or not isinstance(d.get("count"), int):
            raise ArgumentError(f"target stats must be an object with a count, got {d!r}")
        return cls(count=d["count"], **{k: tuple(float(v) for v in d.get(k) or ()) for k in _STAT_LISTS})


_STAT_LISTS = ("mean", "std", "min", "max", "class_share")


class StatsAccumulator:
    """Sums a split's targets as they are packed, into :class:`TargetStats`; parts (shards, worker
    processes, a resumed pack) merge exactly (Chan's parallel mean and variance). ``state()`` is
    JSON, so a pack journal keeps it per shard.

    Args:
        kind: the target kind (``float`` and ``mask`` keep statistics; others only count).
        width: ``float``: values per sample.
    """

    def __init__(self, kind: str, width: int = 0):
        self.kind, self.width = kind, width
        self.count = 0
        self.mean = np.zeros(width, np.float64)
        self.m2 = np.zeros(width, np.float64)  # sum of squared deviations from the mean
        self.lo = np.full(width, np.inf)
        self.hi = np.full(width, -np.inf)
        self.pixels = np.zeros(256, np.int64) if kind == "mask" else None

    def add(self, value) -> None:
        """One sample's target: ``float``: its K values; ``mask``: its ``[H, W]`` uint8 mask."""
        if self.kind == "float":
            self._merge(1, np.asarray(value, np.float64).reshape(-1), 0.0, None, None)
        elif self.kind == "mask":
            self.pixels += np.bincount(np.asarray(value, np.uint8).reshape(-1), minlength=256)
            self.count += 1
        else:
            self.count += 1

    def add_counts(self, counts) -> None:
        """One mask by its pixel count per value (``((value, count), ...)``): what :meth:`add` of
        the mask itself adds, without the pixels."""
        for value, n in counts:
            self.pixels[int(value)] += int(n)
        self.count += 1

    def add_many(self, values) -> None:
        """Many samples' float targets at once (``[N, K]``)."""
        v = np.asarray(values, np.float64).reshape(-1, self.width)
        if len(v):
            mean = v.mean(0)
            self._merge(len(v), mean, ((v - mean) ** 2).sum(0), v.min(0), v.max(0))

    def _merge(self, n: int, mean: np.ndarray, m2, lo, hi) -> None:
        total = self.count + n
        delta = mean - self.mean
        self.mean = self.mean + delta * (n / total)
        self.m2 = self.m2 + m2 + delta**2 * (self.count * n / total)
        self.lo = np.minimum(self.lo, mean if lo is None else lo)
        self.hi = np.maximum(self.hi, mean if hi is None else hi)
        self.count = total

    def merge(self, other: StatsAccumulator) -> StatsAccumulator:
        """Add ``other``'s samples to these; returns self."""
        if other.count == 0:
            return self
        if self.kind == "float":
            self._merge(other.count, other.mean, other.m2, other.lo, other.hi)
        else:
            if self.pixels is not None:
                self.pixels += other.pixels
            self.count += other.count
        return self

    def state(self) -> dict:
        """A JSON form of the partial sums (:meth:`from_state` reads it back)."""
        d: dict[str, Any] = {"kind": self.kind, "width": self.width, "count": self.count}
        if self.kind == "float":
            d.update(mean=self.mean.tolist(), m2=self.m2.tolist(), lo=self.lo.tolist(), hi=self.hi.tolist())
        if self.pixels is not None:
            d["pixels"] = self.pixels.tolist()
        return d

    @classmethod
    def from_state(cls, d: dict) -> StatsAccumulator:
        acc = cls(d["kind"], int(d.get("width", 0)))
        acc.count = int(d["count"])
        if acc.kind == "float" and acc.count:
            acc.mean, acc.m2, acc.lo, acc.hi = (np.asarray(d[k], np.float64) for k in ("mean", "m2", "lo", "hi"))
        if acc.pixels is not None and "pixels" in d:
            acc.pixels = np.asarray(d["pixels"], np.int64)
        return acc

    def result(self, ignore_index: int | None = IGNORE_INDEX) -> TargetStats | None:
        """The statistics (``None`` for a kind that keeps none, or no sample)."""
        if not self.count:
            return None
        if self.kind == "float":
            std = np.sqrt(np.maximum(self.m2 / self.count, 0.0))
            as_t = lambda a: tuple(float(v) for v in a)  # noqa: E731
            return TargetStats(self.count, as_t(self.mean), as_t(std), as_t(self.lo), as_t(self.hi))
        if self.kind == "mask":
            pixels = self.pixels.copy()
            if ignore_index is not None and 0 <= ignore_index < 256:
                pixels[ignore_index] = 0
            found = np.flatnonzero(pixels)
            total = pixels.sum()
            share = pixels[: found[-1] + 1] / total if len(found) else np.zeros(0)
            return TargetStats(self.count, class_share=tuple(float(v) for v in share))
        return None


__all__ = ["StatsAccumulator", "TargetStats"]
