"""The ``float`` kind: one value or a vector a sample (``target.npy``), and its statistics."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from stoker.errors import ArgumentError

from ..stats import IGNORE_INDEX, StatsAccumulator, TargetStats
from .base import (
    _NUM_CLASSES_FOR_MASKS,
    MAX_COLUMNS,
    Target,
    _num,
    bad_target,
    encode_float,
    fast_float_reader,
    parse_float,
)


class FloatStats(StatsAccumulator):
    """Per column mean, std (Chan's parallel mean and variance: parts merge exactly) and range."""

    flavour = "float"

    def __init__(self, kind: str = "float", width: int = 0):
        super().__init__(kind, width)
        self.mean = np.zeros(width, np.float64)
        self.m2 = np.zeros(width, np.float64)  # sum of squared deviations from the mean
        self.lo = np.full(width, np.inf)
        self.hi = np.full(width, -np.inf)

    def add(self, value) -> None:
        self._merge(1, np.asarray(value, np.float64).reshape(-1), 0.0, None, None)

    def add_many(self, values) -> None:
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

    def _merge_from(self, other: StatsAccumulator) -> None:
        self._merge(other.count, other.mean, other.m2, other.lo, other.hi)

    def state(self) -> dict:
        d = super().state()
        d.update(mean=self.mean.tolist(), m2=self.m2.tolist(), lo=self.lo.tolist(), hi=self.hi.tolist())
        return d

    def _load(self, d: dict) -> None:
        if self.count:
            self.mean, self.m2, self.lo, self.hi = (np.asarray(d[k], np.float64) for k in ("mean", "m2", "lo", "hi"))

    def result(self, ignore_index: int | None = IGNORE_INDEX) -> TargetStats | None:
        if not self.count:
            return None
        std = np.sqrt(np.maximum(self.m2 / self.count, 0.0))
        as_t = lambda a: tuple(float(v) for v in a)  # noqa: E731
        return TargetStats(self.count, as_t(self.mean), as_t(std), as_t(self.lo), as_t(self.hi))


class FloatKind(Target):
    """K float values a sample (regression), stored as float32 ``(K,)`` ``.npy``."""

    name, member, task, sized = "float", "target.npy", "regress", False

    def encode(self, value):
        return encode_float(value)

    def meta(self, value, classes):
        return {"target": dict(zip(self.columns, value, strict=True))}

    def decode(self, raws, *, classes, where, split):
        width = self.width
        size, header = fast_float_reader(width)
        out = np.empty((len(raws), width), np.float32)
        for k, raw in enumerate(raws):
            if len(raw) == size and bytes(raw[: len(header)]) == header:  # what pack wrote: one frombuffer
                out[k] = np.frombuffer(raw, "<f4", width, len(header))
                if np.isfinite(out[k]).all():
                    continue
            value = parse_float(bytes(raw), self.member, width)
            if isinstance(value, str):
                raise bad_target(where(k), value, split)
            out[k] = value
        return out[:, 0] if width == 1 else out

    def check(self, raw, *, num_classes, image_wh=None, names=None):
        value = parse_float(raw, self.member, self.width)
        return value if isinstance(value, str) else None

    def index_value(self, raw, *, num_classes, names, width, image_wh):
        return parse_float(raw, self.member, width)  # without declared columns the first sample says

    def width_of(self, value):
        return len(value)

    @classmethod
    def from_flags(cls, *, member=None, num_classes=None, ignore_index=IGNORE_INDEX):
        if num_classes is not None:
            raise ArgumentError(_NUM_CLASSES_FOR_MASKS)
        return cls(member=member or cls.member, columns=("y",)), True  # columns: found in the data

    def resized(self, width):
        columns = ("y",) if width == 1 else tuple(f"y{i}" for i in range(width))
        return self if width == self.width else replace(self, columns=columns)

    def validate(self):
        if not 1 <= len(self.columns) <= MAX_COLUMNS:
            raise ArgumentError(f"a float target has 1 to {MAX_COLUMNS} columns, got {len(self.columns)}")

    def accumulator(self):
        return FloatStats("float", self.width)

    def describe(self):
        names = f" ({', '.join(self.columns)})" if self.width > 1 else ""
        return f"float, {self.width} column{'s' if self.width > 1 else ''}{names}"

    def batch_shape(self, n, crop, num_classes):
        return (n,) if self.width == 1 else (n, self.width)

    def describe_stats(self, stats):
        k = self.width
        cols = [
            f"{name}: mean {_num(stats.mean[i])}, std {_num(stats.std[i])}, {_num(stats.min[i])}..{_num(stats.max[i])}"
            for i, name in enumerate(self.columns[:4])
        ]
        more = f"; {k - 4:,} more" if k > 4 else ""
        return f"float, {k:,} column{'s' if k > 1 else ''} ({'; '.join(cols)}{more})", ""


__all__ = ["FloatKind", "FloatStats"]
