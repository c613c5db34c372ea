"""What a sample holds besides its image: the target kinds of the shard format.

=============  ===================  ============================================  ==========================
kind           member (packed)      stored as                                     the Loader yields
=============  ===================  ============================================  ==========================
``class``      ``cls``              the class index as text (``b"3"``)            int64 ``[N]``
``float``      ``target.npy``       float32 ``(K,)`` ``.npy``                     float32 ``[N]`` or ``[N, K]``
``multilabel`` ``labels.npy``       int32 ``(n,)`` ``.npy`` of class indices      float32 multi-hot ``[N, C]``
``mask``       ``mask.png``         8-bit grayscale PNG, one class index a pixel  uint8 ``[N, H, W]``
=============  ===================  ============================================  ==========================

A split's manifest names its kind and member (:class:`Target`); ``stoker index`` may name
another member of foreign tars (``.npy``, ``.json`` or text numbers; a mask ``.png``). A mask's
pixel value ``ignore_index`` (255 by default) marks pixels no loss should count.
"""

from __future__ import annotations

import io
import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from stoker.errors import ArgumentError, TargetError

TARGET_KINDS = ("class", "float", "multilabel", "mask")
#: the member each kind is packed as
MEMBERS = {"class": "cls", "float": "target.npy", "multilabel": "labels.npy", "mask": "mask.png"}
#: a mask's "no class here" value (what CrossEntropyLoss(ignore_index=255) skips)
IGNORE_INDEX = 255
#: the most float columns a target may have (a wider one is a mistake, e.g. a CSV of pixels)
MAX_COLUMNS = 4096


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


@dataclass(frozen=True)
class Target:
    """The target kind of a split, as its manifest records it.

    Attributes:
        kind: one of :data:`TARGET_KINDS`.
        member: the tar member (extension after the key) that holds it.
        columns: ``float``: the names of the K values (``("y",)`` for one).
        num_classes: ``mask``: the classes a pixel may hold (``None``: not declared);
            ``class``/``multilabel`` read the manifest's class list instead.
        ignore_index: ``mask``: the pixel value no loss counts.
        stats: what the packer saw of the targets (:class:`TargetStats`; ``None`` when not recorded).
    """

    kind: str = "class"
    member: str = "cls"
    columns: tuple[str, ...] = field(default=())
    num_classes: int | None = None
    ignore_index: int | None = None
    stats: TargetStats | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.kind not in TARGET_KINDS:
            raise ArgumentError(f"target kind {self.kind!r} is not one of {', '.join(TARGET_KINDS)}")
        if self.kind == "float" and not 1 <= len(self.columns) <= MAX_COLUMNS:
            raise ArgumentError(f"a float target has 1 to {MAX_COLUMNS} columns, got {len(self.columns)}")

    @classmethod
    def of(cls, kind: str, **kw: Any) -> Target:
        """The packed form of ``kind`` (its default member; masks ignore 255)."""
        if kind == "mask":
            kw.setdefault("ignore_index", IGNORE_INDEX)
        return cls(kind=kind, member=kw.pop("member", MEMBERS.get(kind, "cls")), **kw)

    @property
    def width(self) -> int:
        """Values per sample of a ``float`` target (K)."""
        return len(self.columns)

    @property
    def spatial(self) -> bool:
        """A mask: cropped, flipped and resized with its image."""
        return self.kind == "mask"

    def to_json(self) -> dict:
        d: dict[str, Any] = {"kind": self.kind, "member": self.member}
        if self.kind == "float":
            d["columns"] = list(self.columns)
        if self.kind == "mask":
            d.update(num_classes=self.num_classes, ignore_index=self.ignore_index)
        if self.stats is not None:
            d["stats"] = self.stats.to_json()
        return d

    @classmethod
    def from_json(cls, d: dict) -> Target:
        if not isinstance(d, dict) or "kind" not in d:
            raise ArgumentError(f"target must be an object with a kind, got {d!r}")
        return cls(
            kind=str(d["kind"]),
            member=str(d.get("member", MEMBERS.get(str(d["kind"]), "cls"))),
            columns=tuple(str(c) for c in d.get("columns") or ()),
            num_classes=None if d.get("num_classes") is None else int(d["num_classes"]),
            ignore_index=None if d.get("ignore_index") is None else int(d["ignore_index"]),
            stats=TargetStats.from_json(d["stats"]) if d.get("stats") is not None else None,
        )

    def describe(self) -> str:
        """``"float, 3 columns (x, y, z)"``, ``"mask, 21 classes, 255 ignored"``: for summaries."""
        if self.kind == "float":
            names = f" ({', '.join(self.columns)})" if self.width > 1 else ""
            return f"float, {self.width} column{'s' if self.width > 1 else ''}{names}"
        if self.kind == "mask":
            classes = f"{self.num_classes} classes" if self.num_classes else "classes not declared"
            return f"mask, {classes}, {self.ignore_index} ignored"
        return self.kind


# ---- encoding (what pack writes) ------------------------------------------------------------
def encode_npy(array: np.ndarray) -> bytes:
    """``np.save`` bytes of ``array`` (version 1.0 header: deterministic for a dtype and shape)."""
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.ascontiguousarray(array), version=(1, 0), allow_pickle=False)
    return buf.getvalue()


def encode_float(values) -> bytes:
    """A float target as packed: float32 ``(K,)`` ``.npy``."""
    return encode_npy(np.asarray(values, np.float32).reshape(-1))


def encode_labels(indices) -> bytes:
    """A multi-label target as packed: the sorted class indices, int32 ``(n,)`` ``.npy``."""
    return encode_npy(np.asarray(sorted(set(int(i) for i in indices)), np.int32))


# ---- decoding (what the Loader, verify and index read) --------------------------------------
def _numbers(raw: bytes, member: str) -> np.ndarray:
    """The numbers of a target member: ``.npy`` (any numeric dtype), ``.json`` (a number or a list
    of numbers), or text numbers separated by spaces, commas or ``|``."""
    ext = member.rsplit(".", 1)[-1].lower()
    try:
        if ext == "npy":
            a = np.lib.format.read_array(io.BytesIO(raw), allow_pickle=False)
            if a.dtype.kind not in "biuf":
                raise ArgumentError(f"dtype {a.dtype} is not numeric")
            return np.asarray(a).reshape(-1)
        if ext == "json":
            v = json.loads(raw)
            return np.asarray([v] if isinstance(v, (int, float)) else v, np.float64).reshape(-1)
        text = raw.decode("utf-8").replace(",", " ").replace("|", " ").split()
        return np.asarray([float(t) for t in text], np.float64)
    except (ValueError, TypeError, UnicodeDecodeError, OSError) as e:
        raise ArgumentError(" ".join(str(e).split())[:120] or type(e).__name__) from None


def parse_float(raw: bytes, member: str, width: int | None) -> np.ndarray | str:
    """A float target's ``width`` values (any number of them for ``None``) as float32, or why they
    are not (``"what: detail"``)."""
    try:
        a = _numbers(raw, member)
    except ValueError as e:
        return f"target does not parse: {e}"
    if width is None and not 1 <= a.size <= MAX_COLUMNS:
        return f"target has {a.size} values, not 1 to {MAX_COLUMNS}"
    if width is not None and a.size != width:
        return f"target has {a.size} value(s), the split's targets have {width}"
    a = a.astype(np.float32)
    if not np.isfinite(a).all():
        return f"target is not finite: {a.tolist()}"
    return a


def parse_labels(raw: bytes, member: str, num_classes: int) -> np.ndarray | str:
    """A multi-label target's class indices (int64), or why they are not."""
    try:
        a = _numbers(raw, member)
    except ValueError as e:
        return f"labels do not parse: {e}"
    if a.size and (not np.all(a == np.round(a)) or a.min() < 0 or a.max() >= num_classes):
        return f"labels are not class indices below {num_classes}: {a.tolist()[:8]}"
    return a.astype(np.int64)


def fast_float_reader(width: int):
    """``(size, header)`` of the float32 ``(width,)`` ``.npy`` pack writes: a member of exactly
    that size and header is read with one ``frombuffer`` (the Loader's fast path)."""
    raw = encode_float(np.zeros(width, np.float32))
    return len(raw), raw[: len(raw) - 4 * width]


def finite_number(text: str) -> float | None:
    """``float(text)`` when it is a finite number, else None."""
    try:
        v = float(text)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def bad_target(where: str, why: str, split_dir: Any) -> TargetError:
    """The one-line error of a sample whose target the Loader cannot use."""
    return TargetError(f"{where}: {why} (run `stoker index {split_dir}` to skip such samples)")


__all__ = [
    "IGNORE_INDEX",
    "MAX_COLUMNS",
    "MEMBERS",
    "TARGET_KINDS",
    "StatsAccumulator",
    "Target",
    "TargetStats",
    "bad_target",
    "check_target",
    "encode_float",
    "encode_labels",
    "encode_npy",
    "fast_float_reader",
    "finite_number",
    "parse_float",
    "parse_labels",
]


def check_target(
    target: Target,
    raw: bytes,
    *,
    num_classes: int,
    image_wh: tuple[int, int] | None = None,
    names: dict[str, int] | None = None,
) -> str | None:
    """Why the member ``raw`` is not a usable target of ``target``'s kind, or None: what ``stoker
    verify`` and ``stoker index`` hold every sample to (``num_classes``: the manifest's class
    count, for class and multi-label targets; a mask is held to its own declared classes;
    ``image_wh``: the image's stored size, which a mask must have; ``names``: class names a
    ``cls`` may hold, :func:`~.idx.parse_label`)."""
    from .idx import parse_label

    if target.kind == "class":
        value = parse_label(raw, num_classes or None, names)
        return value if isinstance(value, str) else None
    if target.kind == "float":
        value = parse_float(raw, target.member, target.width)
        return value if isinstance(value, str) else None
    if target.kind == "multilabel":
        value = parse_labels(raw, target.member, num_classes)
        return value if isinstance(value, str) else None
    return _check_mask(target, raw, image_wh)


def _check_mask(target: Target, raw: bytes, image_wh: tuple[int, int] | None) -> str | None:
    from PIL import Image

    if raw[:8] != b"\x89PNG\r\n\x1a\n":
        return "mask is not a PNG"
    try:
        with Image.open(io.BytesIO(raw)) as im:
            im.load()
            if im.mode not in ("L", "P"):
                return f"mask mode {im.mode}, not L (one class index per pixel)"
            if image_wh is not None and im.size != tuple(image_wh):
                return f"mask is {im.size[0]}x{im.size[1]}, its image {image_wh[0]}x{image_wh[1]}"
            values = np.asarray(im)
    except Exception as e:  # noqa: BLE001 - any decoder failure is a finding
        return f"mask does not decode: {' '.join(str(e).split())[:100] or type(e).__name__}"
    if target.num_classes:
        bad = (values >= target.num_classes) & (values != target.ignore_index)
        if bad.any():
            return f"mask value {int(values[bad][0])} is not below the split's {target.num_classes} classes"
    return None
