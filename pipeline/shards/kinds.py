"""The target kinds, each one class (its data and its behaviour) in one registry: every room asks
the kind, none switches on its name.

A split's target (:class:`Target`, what its manifest records) is an object of its kind's class: a
frozen dataclass of the fields (member, columns, classes, statistics) whose methods say how pack
encodes one value (:meth:`Target.encode`), how a batch of them is read for the Loader
(:meth:`~Target.decode`, or with its image for a spatial kind), how ``stoker verify`` and ``stoker
index`` check one (:meth:`~Target.check`, :meth:`~Target.index_value`), what statistics it keeps
(:meth:`~Target.accumulator`), how it is described in a summary (:meth:`~Target.summary`), what an
empty batch of it is, and which task ``stoker train --task auto`` trains on it (:attr:`~Target.task`).

A kind of your own is a subclass registered once (or named under the ``stoker.target_kinds``
entry points of your package)::

    @register_kind
    class Score(TargetKind):
        name, member, task = "score", "score.json", "regress"
        ...                                    # encode, decode, check, describe, accumulator

``Target(kind="score", ...)`` (or ``Target.from_json`` of its manifest) is then a ``Score``. The
built-in kinds: ``class`` (``cls``), ``float`` (``target.npy``), ``multilabel`` (``labels.npy``)
and ``mask`` (``mask.png``, spatial), and in a module of its own (:mod:`.boxes`, registered by
:mod:`.targets`) ``boxes`` (``boxes.npy``, follows the crop); their formats are in :mod:`.targets`.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np

from stoker.errors import ArgumentError, TargetError, arg, one_line

from ..registry import Registry
from .idx import MAX_CLASSES, MAX_CLS_BYTES, parse_label
from .stats import IGNORE_INDEX, StatsAccumulator, TargetStats

Where = Callable[[int], str]


#: the largest target member ``stoker verify`` and ``stoker index`` read (a larger one is no target)
MAX_TARGET_BYTES = 64 << 20
#: the most float columns a target may have (a wider one is a mistake, e.g. a CSV of pixels)
MAX_COLUMNS = 4096
# ``num_classes`` without masks (stoker index --num-classes): the error of every kind but the mask's
_NUM_CLASSES_FOR_MASKS = f"{arg('num_classes')} is for {arg('targets', 'mask')} (class names: {arg('classes')})"


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
        raise ArgumentError(one_line(e)) from None


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


def check_mask(target: Target, raw: bytes, image_wh: tuple[int, int] | None) -> str | None:
    """Why ``raw`` is not a mask of ``target`` (a one-channel PNG of the image's size, each value a
    declared class or the ignored one), or None."""
    from PIL import Image

    from ..imagedecode import DAMAGED_INPUT

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
    except DAMAGED_INPUT as e:  # a damaged mask is a finding; a bug raises
        return f"mask does not decode: {one_line(e)}"
    if target.num_classes:
        bad = (values >= target.num_classes) & (values != target.ignore_index)
        if bad.any():
            return f"mask value {int(values[bad][0])} is not below the split's {target.num_classes} classes"
    return None


def _kind_class(cls: type[Target], kind: str | None) -> type[Target]:
    """The class of a target of ``kind`` made through ``cls`` (``Target(kind="float")`` is a
    :class:`FloatKind`; a kind's own class, or ``Target()``, is a class target)."""
    if kind is None or kind == cls.name:
        return cls if cls.name else _REGISTRY["class"]
    return _REGISTRY[kind]


@dataclass(frozen=True)
class Target:
    """A split's targets, as its manifest records them: the data of one target kind and its
    behaviour together (each kind is a subclass; ``Target(kind="float", ...)`` makes a
    :class:`FloatKind`). See the module docstring for what a kind says.

    Attributes:
        kind: the kind's name (the manifest's ``target.kind``; a subclass's :attr:`name`).
        member: the tar member (extension after the key) that holds it.
        columns: ``float``: the names of the K values (``("y",)`` for one).
        num_classes: ``mask``: the classes a pixel may hold (``None``: not declared);
            ``class``/``multilabel`` read the manifest's class list instead.
        ignore_index: ``mask``: the pixel value no loss counts.
        stats: what the packer saw of the targets (:class:`TargetStats`; ``None`` when not recorded).

    Class attributes (a kind's own, what a subclass sets):
        name: the kind's name. ``member`` (the field's default) is the member pack writes.
        task: what ``stoker train --task auto`` trains on it (``classify``, ``regress``,
            ``multilabel``, ``segment``).
        spatial: cropped, flipped and resized with its image (read with the image, not by
            :meth:`decode`).
        named_classes: its values are indices into the manifest's class list.
        dtype: the dtype of a batch of it (``"int64"``, ``"float32"``, ``"uint8"``).
        format: the manifest format that records it (1: what every stoker reads; 2: with ``target``).
        sized: :meth:`check` needs the image's size (``stoker verify``/``index`` read it then).
        follows_crop: a batch of it is :meth:`decode`'s values moved by :meth:`follow` with each
            image's crop box, flip and placement (boxes).
        max_bytes: a larger member is no target (:meth:`oversize` says so, unread).
    """

    kind: str = "class"
    member: str = "cls"
    columns: tuple[str, ...] = field(default=())
    num_classes: int | None = None
    ignore_index: int | None = None
    stats: TargetStats | None = field(default=None, compare=False)

    name: ClassVar[str] = ""
    task: ClassVar[str] = ""
    spatial: ClassVar[bool] = False
    named_classes: ClassVar[bool] = False
    dtype: ClassVar[str] = "float32"
    format: ClassVar[int] = 2
    sized: ClassVar[bool] = True
    max_bytes: ClassVar[int] = MAX_TARGET_BYTES
    #: its values move with the crop box and flip of their image but are no image (boxes): the
    #: backends read them with :meth:`decode` and place them with :meth:`follow`
    follows_crop: ClassVar[bool] = False
    #: the val transform a Loader of ``val_fit="auto"`` applies: ``center`` crop or ``letterbox``
    val_fit: ClassVar[str] = "center"
    #: how ``balance="classes"`` groups a split's samples (:mod:`stoker.pipeline.balance_tables`):
    #: ``"label"``, by each sample's class; ``"rarest"``, by each sample's rarest label (a sample
    #: with none in a group of its own, never drawn); ``None``: not balanced by class
    balance_groups: ClassVar[str | None] = None

    def __new__(cls, *args: Any, **kw: Any):
        return object.__new__(_kind_class(cls, kw.get("kind", args[0] if args else None)))

    def __init_subclass__(cls, **kw: Any) -> None:
        """A kind's class is a frozen dataclass whose ``kind`` and ``member`` default to its
        ``name`` and the ``member`` it sets (no decorator needed)."""
        super().__init_subclass__(**kw)
        own = dict(cls.__dict__.get("__annotations__", {}))
        if cls.name and "kind" not in cls.__dict__:
            cls.kind = cls.name
        for f in ("kind", "member"):
            if f in cls.__dict__ and f not in own:
                own[f] = "str"
        cls.__annotations__ = own
        dataclass(frozen=True)(cls)

    def __post_init__(self) -> None:
        self.validate()

    # ---- the data ----------------------------------------------------------------------------
    @property
    def spec(self) -> _KindOf:
        """The kind as code written before kinds held their data reads it (``target.spec.X(target,
        ...)``): prefer ``target.X(...)``."""
        return _KindOf(type(self))

    @classmethod
    def of(cls, kind: str | None = None, **kw: Any) -> Target:
        """The packed form of ``kind`` (None: this class's kind) with its default member and fields
        (e.g. a mask ignores 255): ``Target.of("mask")``, ``MaskKind.of(num_classes=21)``."""
        kind_cls = _REGISTRY[kind] if kind is not None else cls if cls.name else _REGISTRY["class"]
        kind = kind_cls.name
        for name, value in kind_cls.defaults().items():
            kw.setdefault(name, value)
        return kind_cls(kind=kind, **kw)

    @property
    def width(self) -> int:
        """Values per sample of a ``float`` target (K)."""
        return len(self.columns)

    def to_json(self) -> dict:
        d: dict[str, Any] = {"kind": self.kind, "member": self.member}
        if self.columns:
            d["columns"] = list(self.columns)
        if self.ignore_index is not None:  # a pixel value no loss counts: its class count beside it
            d.update(num_classes=self.num_classes, ignore_index=self.ignore_index)
        if self.stats is not None:
            d["stats"] = self.stats.to_json()
        return d

    @classmethod
    def from_json(cls, d: dict) -> Target:
        if not isinstance(d, dict) or "kind" not in d:
            raise ArgumentError(f"target must be an object with a kind, got {d!r}")
        kind = str(d["kind"])
        return Target(
            kind=kind,
            member=str(d.get("member") or _REGISTRY[kind].member),
            columns=tuple(str(c) for c in d.get("columns") or ()),
            num_classes=None if d.get("num_classes") is None else int(d["num_classes"]),
            ignore_index=None if d.get("ignore_index") is None else int(d["ignore_index"]),
            stats=TargetStats.from_json(d["stats"]) if d.get("stats") is not None else None,
        )

    @classmethod
    def from_flags(
        cls, *, member: str | None = None, num_classes: int | None = None, ignore_index: int = IGNORE_INDEX
    ) -> tuple[Target, bool]:
        """``(target, discover_width)``: the target ``stoker index --targets NAME`` names (its
        ``--target-member``, ``--num-classes``, ``--ignore-index``), and whether the data says
        its width.

        Raises:
            ArgumentError: ``num_classes`` for a kind whose values are no mask's.
        """
        if num_classes is not None:
            raise ArgumentError(_NUM_CLASSES_FOR_MASKS)
        return cls.of(cls.name, **({"member": member} if member else {})), False

    # ---- what pack writes --------------------------------------------------------------------
    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """The fields a split of this kind gets unless given (a mask's ``ignore_index``)."""
        return {}

    def validate(self) -> None:
        """Raise :class:`~stoker.errors.ArgumentError` when the fields do not fit the kind."""

    def encode(self, value: Any) -> bytes:
        """The member bytes pack writes for one sample's parsed ``value``."""
        raise NotImplementedError

    def meta(self, value: Any, classes: Sequence[str]) -> dict[str, Any]:
        """What a packed sample's ``json`` member records of its target (readable: class names)."""
        return {}

    def pack_value(self, item: Any, res: Any, classes: Sequence[str]) -> tuple[Any, dict[str, Any]]:
        """``(value, meta)`` pack writes of a scanned ``item`` whose image the sanitizer made
        ``res``: the value :meth:`encode` takes and what the sample's ``json`` records of it."""
        value = item.label if item.target is None else item.target
        return value, self.meta(value, classes)

    def add_seen(self, acc: StatsAccumulator, item: Any, res: Any, value: Any) -> None:
        """Count a packed sample's target ``value`` (:meth:`pack_value`'s) in the split's statistics."""
        acc.add(np.asarray(value, np.float32))

    # ---- what the Loader reads ---------------------------------------------------------------
    def decode(self, raws: Sequence, *, classes: Sequence[str], where: Where, split: Any) -> np.ndarray:
        """A batch of targets as the Loader yields them (on the CPU) from the members' bytes
        ``raws`` (zero-copy uint8 views). A sample whose target does not parse is a
        :class:`~stoker.errors.TargetError` naming ``where(k)`` and the fix."""
        raise NotImplementedError

    def batch_shape(self, n: int, crop: tuple[int, int], num_classes: int) -> tuple[int, ...]:
        """The shape of a batch of ``n`` of these targets (an empty val batch is made of it)."""
        return (n,)

    def empty(self, n: int, crop: tuple[int, int], num_classes: int, device: Any) -> Any:
        """An uninitialised batch of ``n`` of these targets on ``device`` (an empty val batch's)."""
        import torch

        return torch.empty(self.batch_shape(n, crop, num_classes), dtype=getattr(torch, self.dtype), device=device)

    def follow(self, decoded: Any, crops: np.ndarray, flips: np.ndarray, places: np.ndarray) -> Any:
        """A kind that :attr:`follows_crop`: the batch of :meth:`decode`'s ``decoded`` values moved
        as their images are (crop boxes ``x y w h`` in stored pixels, flips, and where each crop
        lands in the output, ``x y w h``), on the CPU."""
        raise NotImplementedError

    def gather(self, pieces: Sequence[tuple[np.ndarray, Any]], n: int) -> Any:
        """A batch of ``n`` of :meth:`decode`'s values put together from ``pieces``, each a boolean
        selection of the batch's rows and :meth:`decode`'s values of those rows (a mix's splits
        each decode their own samples): an array of ``n`` rows, or a list where the kind decodes
        to a list (a sample's boxes)."""
        first = pieces[0][1]
        if isinstance(first, np.ndarray):
            out = np.empty((n, *first.shape[1:]), first.dtype)
            for sel, part in pieces:
                out[sel] = part
            return out
        rows: list = [None] * n
        for sel, part in pieces:
            for k, value in zip(np.flatnonzero(sel).tolist(), part, strict=True):
                rows[k] = value
        return rows

    # ---- a label space, across the splits of a mix
    def same_space(self, classes: Sequence[str], other: Target, other_classes: Sequence[str]) -> bool:
        """Whether a split of these targets (``classes``: its manifest's) and one of ``other``'s
        can be read as one: the same kind and fields, and, for a kind of :attr:`named_classes`,
        the same class names in the same order (an index means one class in both)."""
        return self == other and (not self.named_classes or list(classes) == list(other_classes))

    def space(self, classes: Sequence[str]) -> str:
        """Its label space in words, for a refusal that names two: ``"3 classes (ant, bee, cat),
        multilabel targets"``, ``"float targets ({...})"``."""
        if self.named_classes:
            names = ", ".join(classes[:8]) + (", ..." if len(classes) > 8 else "")
            return f"{len(classes)} classes ({names}), {self.kind} targets"
        return f"{self.kind} targets ({self.to_json()})"

    def class_count(self, classes: Sequence[str]) -> int:
        """The classes its values span (0 when it has none)."""
        return len(classes) if self.named_classes else 0

    def outputs(self, classes: Sequence[str], num_classes: int | None = None) -> int:
        """The outputs of a network trained on these targets (``stoker train``): a class each of a
        kind of :attr:`named_classes` (``num_classes``, else the manifest's ``classes``), else one a
        value a sample holds.

        Raises:
            ArgumentError: a kind whose class count is not known (a mask split's without one).
        """
        n = num_classes or len(classes)
        return n if self.named_classes else math.prod(self.batch_shape(1, (1, 1), n)[1:])

    # ---- what `stoker verify` and `stoker index` hold every sample to -------------------------
    def check(
        self,
        raw: bytes,
        *,
        num_classes: int,
        image_wh: tuple[int, int] | None = None,
        names: dict[str, int] | None = None,
    ) -> str | None:
        """Why ``raw`` is not a usable target of this kind (``"what: detail"``), or None
        (``num_classes``: the manifest's class count; ``image_wh``: the image's stored size, when
        :attr:`sized`; ``names``: class names a ``cls`` may hold)."""
        raise NotImplementedError

    def missing(self) -> str:
        """What a sample without the target member lacks."""
        return f"no {self.member} target"

    def oversize(self, size: int) -> str:
        """Why a member of ``size`` bytes (past :attr:`max_bytes`) is no target."""
        return f"{self.member} is {size:,} bytes: not a target"

    def index_value(
        self,
        raw: bytes,
        *,
        num_classes: int | None,
        names: dict[str, int],
        width: int | None,
        image_wh: tuple[int, int] | None,
    ) -> Any:
        """What ``stoker index`` keeps of a sample's target: why it is unusable (a string); the
        largest class it names (a kind of :attr:`named_classes`); or the value its statistics
        count (``None``: none). ``num_classes`` bounds class labels (``None``: unknown yet);
        ``width``: a float target's values a sample (``None``: the first sample's)."""
        why = self.check(raw, num_classes=self.num_classes or 0, image_wh=image_wh)
        if why or self.accumulator() is None:
            return why or None
        return self.decode([np.frombuffer(raw, np.uint8)], classes=list(names), where=str, split="")[0]

    def resized(self, width: int) -> Target:
        """This target with ``width`` values a sample (a float target whose width the data says)."""
        return self

    def width_of(self, value: Any) -> int:
        """The values a sample of :meth:`index_value`'s ``value`` holds (a float target's K)."""
        return self.width

    # ---- statistics and summaries ------------------------------------------------------------
    def accumulator(self) -> StatsAccumulator | None:
        """A :class:`~.stats.StatsAccumulator` for what pack and index record of these targets
        (``None``: nothing)."""
        return None

    def describe(self) -> str:
        """``"float, 3 columns (x, y, z)"``, ``"mask, 21 classes, 255 ignored"``: for summaries."""
        return self.kind

    def describe_stats(self, stats: TargetStats) -> tuple[str, str]:
        """``(targets line, found line)`` of a pack's summary, with what it saw of the targets."""
        return self.describe(), ""

    def summary(self, num_classes: int, stats: TargetStats | None) -> tuple[str, str]:
        """A pack's ``targets:`` line and its ``found`` line: the classes of a kind of
        :attr:`named_classes`, else what the kind says of its statistics (``stats``)."""
        if self.named_classes:
            n = num_classes
            alone = " (one class: nothing for a classifier to learn; stoker train refuses it)" if n == 1 else ""
            return f"{self.kind}, {n:,} class{'es' if n != 1 else ''}{alone}", ""
        if stats is None:
            return self.describe(), ""
        return self.describe_stats(stats)


#: the base of a kind of one's own (the name of the days when kinds held no data)
TargetKind = Target
#: what a kind read of a split's target when the two were apart: now the target itself
TargetFields = Target


class _KindOf:
    """A kind's class read as the target-first interface of old (``spec.encode(target, value)``
    is ``target.encode(value)``): what ``target.spec`` returns."""

    __slots__ = ("cls",)

    def __init__(self, cls: type[Target]):
        self.cls = cls

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cls, name)

    def num_classes(self, target: Target, classes: Sequence[str]) -> int:
        return target.class_count(classes)


# ---- the statistics the built-in kinds keep ---------------------------------------------------
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


class MaskStats(StatsAccumulator):
    """Each pixel value's share of the labelled pixels."""

    flavour = "mask"

    def __init__(self, kind: str = "mask", width: int = 0):
        super().__init__(kind, width)
        self.pixels = np.zeros(256, np.int64)

    def add(self, value) -> None:
        """One ``[H, W]`` uint8 mask."""
        self.pixels += np.bincount(np.asarray(value, np.uint8).reshape(-1), minlength=256)
        self.count += 1

    def add_counts(self, counts) -> None:
        """One mask by its pixel count per value (``((value, count), ...)``): what :meth:`add` of
        the mask itself adds, without the pixels."""
        for value, n in counts:
            self.pixels[int(value)] += int(n)
        self.count += 1

    def _merge_from(self, other: StatsAccumulator) -> None:
        self.pixels += other.pixels
        self.count += other.count

    def state(self) -> dict:
        return {**super().state(), "pixels": self.pixels.tolist()}

    def _load(self, d: dict) -> None:
        if "pixels" in d:
            self.pixels = np.asarray(d["pixels"], np.int64)

    def result(self, ignore_index: int | None = IGNORE_INDEX) -> TargetStats | None:
        if not self.count:
            return None
        pixels = self.pixels.copy()
        if ignore_index is not None and 0 <= ignore_index < 256:
            pixels[ignore_index] = 0
        found = np.flatnonzero(pixels)
        total = pixels.sum()
        share = pixels[: found[-1] + 1] / total if len(found) else np.zeros(0)
        return TargetStats(self.count, class_share=tuple(float(v) for v in share))


# ---- the built-in kinds ------------------------------------------------------------------------
class ClassKind(Target):
    """A class index a sample, stored as text (``b"3"``; a class name when ``stoker index --classes``
    names them)."""

    name, member, task, named_classes, dtype, format, sized = "class", "cls", "classify", True, "int64", 1, False
    balance_groups = "label"
    max_bytes = MAX_CLS_BYTES

    def encode(self, value):
        return str(int(value)).encode()

    def meta(self, value, classes):
        return {"class": classes[int(value)]}

    def decode(self, raws, *, classes, where, split):
        names = None  # made only for a class stored by name: most splits store indices
        out = np.empty(len(raws), np.int64)
        for k, raw in enumerate(raws):
            text = bytes(raw).strip() if len(raw) <= MAX_CLS_BYTES else b"x"
            if not text.isdigit() and names is None:
                names = {c.encode("utf-8", "surrogateescape"): i for i, c in enumerate(classes)}
            try:
                out[k] = int(text) if text.isdigit() else names.get(text, -1)
            except ValueError:  # digits Python will not convert (e.g. too long)
                out[k] = -1
        bad = (out < 0) | (out >= len(classes))
        if bad.any():
            k = int(np.argmax(bad))
            text = bytes(raws[k][:MAX_CLS_BYTES]).decode("utf-8", "replace")
            raise bad_target(where(k), f"cls {text!r} is not a class index below {len(classes)}", split)
        return out

    def check(self, raw, *, num_classes, image_wh=None, names=None):
        value = parse_label(raw, num_classes or None, names)
        return value if isinstance(value, str) else None

    def missing(self):
        return "no cls label"

    def oversize(self, size):
        return f"cls is not an integer: {size:,} bytes"

    def index_value(self, raw, *, num_classes, names, width, image_wh):
        return parse_label(raw, num_classes, names)  # a name: what --classes names


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


class MultilabelKind(Target):
    """Any number of classes a sample, stored as their sorted indices (int32 ``(n,)`` ``.npy``)."""

    name, member, task, named_classes, sized = "multilabel", "labels.npy", "multilabel", True, False
    balance_groups = "rarest"

    def encode(self, value):
        return encode_labels(value)

    def meta(self, value, classes):
        return {"classes": [classes[k] for k in value]}

    def decode(self, raws, *, classes, where, split):
        out = np.zeros((len(raws), len(classes)), np.float32)
        for k, raw in enumerate(raws):
            labels = parse_labels(bytes(raw), self.member, len(classes))
            if isinstance(labels, str):
                raise bad_target(where(k), labels, split)
            out[k, labels] = 1.0
        return out

    def check(self, raw, *, num_classes, image_wh=None, names=None):
        value = parse_labels(raw, self.member, num_classes)
        return value if isinstance(value, str) else None

    def index_value(self, raw, *, num_classes, names, width, image_wh):
        labels = parse_labels(raw, self.member, num_classes or MAX_CLASSES)
        return labels if isinstance(labels, str) else int(labels.max(initial=-1))

    def batch_shape(self, n, crop, num_classes):
        return (n, num_classes)


class MaskKind(Target):
    """A class index a pixel (segmentation), stored as a one-channel PNG of the image's size."""

    name, member, task, spatial, dtype = "mask", "mask.png", "segment", True, "uint8"

    @classmethod
    def defaults(cls):
        return {"ignore_index": IGNORE_INDEX}

    @classmethod
    def from_flags(cls, *, member=None, num_classes=None, ignore_index=IGNORE_INDEX):
        kw = {"member": member} if member else {}
        return cls.of(cls.name, num_classes=num_classes, ignore_index=ignore_index, **kw), False

    def accumulator(self):
        return MaskStats("mask")

    def pack_value(self, item, res, classes):
        return res.mask, {"mask": item.mask}  # the sanitizer checked and wrote the mask beside its image

    def add_seen(self, acc, item, res, value):
        acc.add_counts(res.mask_counts)  # the sanitizer counted the mask's pixels

    def encode(self, value):
        return bytes(value)  # pack's sanitizer already wrote the PNG

    def decode(self, raws, *, classes, where, split):
        raise ArgumentError("a mask split's targets are images: they are read with their images (masks())")

    def check(self, raw, *, num_classes, image_wh=None, names=None):
        return check_mask(self, raw, image_wh)

    def index_value(self, raw, *, num_classes, names, width, image_wh):
        return check_mask(self, raw, image_wh) or _mask_values(raw)

    def describe(self):
        classes = f"{self.num_classes} classes" if self.num_classes else "classes not declared"
        return f"mask, {classes}, {self.ignore_index} ignored"

    def batch_shape(self, n, crop, num_classes):
        return (n, *crop)

    def describe_stats(self, stats):
        share = stats.class_share
        absent = [str(v) for v, p in enumerate(share) if p == 0]
        found = f"classes 0..{len(share) - 1} found" if share else "no labelled pixel found"
        if absent:
            found += f" ({', '.join(absent[:8])}{', ...' if len(absent) > 8 else ''} absent)"
        return self.describe(), found

    def outputs(self, classes, num_classes=None):
        n = num_classes or self.class_count(classes)
        if not n:
            raise ArgumentError(
                f"the masks' class count is not in the manifest: pass {arg('num_classes')} (pack with "
                f"{arg('num_classes')})"
            )
        return n

    def class_count(self, classes):
        found = len(self.stats.class_share) if self.stats is not None and self.stats.class_share else 0
        return self.num_classes or found or len(classes)


def _mask_values(raw: bytes) -> np.ndarray:
    """A checked mask PNG's values (what its statistics count)."""
    from PIL import Image

    with Image.open(io.BytesIO(raw)) as im:
        return np.asarray(im)


#: the entry-point group a package names its target kinds in
ENTRY_POINTS = "stoker.target_kinds"
_REGISTRY: Registry[TargetKind] = Registry("target kind", TargetKind, ENTRY_POINTS, required=("name", "member"))


def register_kind(cls: type[TargetKind]) -> type[TargetKind]:
    """Add a target kind (usable as a decorator). Its name must be new."""
    return _REGISTRY.register(cls)


for _cls in (ClassKind, FloatKind, MultilabelKind, MaskKind):
    register_kind(_cls)


def ensure_kind(cls: type[TargetKind]) -> None:
    """Register ``cls`` unless its name is known: what a worker process does with the kind of a
    split its parent read (a kind registered at run time travels with the split's index)."""
    if cls.name not in _REGISTRY:
        register_kind(cls)


def kind_names() -> tuple[str, ...]:
    """The registered kinds' names (``--targets`` choices, the manifest's ``target.kind``)."""
    return _REGISTRY.names()


def get_kind(name: str) -> type[Target]:
    """The kind ``name``: its class (``get_kind("float").member``, ``get_kind("float")(columns=("y",))``).

    Raises:
        ArgumentError: an unknown name (the message lists the registered ones).
    """
    return _REGISTRY[name]


def kinds() -> list[type[Target]]:
    """Every registered kind's class."""
    return list(_REGISTRY)


def _num(v: float) -> str:
    """A statistic, short: 47.2, 0.289, 18, 1,234, 2.5e-05."""
    if v == int(v) and abs(v) < 1e6:
        return f"{int(v):,}"
    if 1000 <= abs(v) < 1e6:
        return f"{v:,.0f}"
    return f"{v:.3g}"


__all__ = [
    "IGNORE_INDEX",
    "MAX_COLUMNS",
    "MAX_TARGET_BYTES",
    "ClassKind",
    "FloatKind",
    "FloatStats",
    "MaskKind",
    "MaskStats",
    "MultilabelKind",
    "Target",
    "TargetFields",
    "TargetKind",
    "bad_target",
    "check_mask",
    "encode_float",
    "encode_labels",
    "encode_npy",
    "ensure_kind",
    "fast_float_reader",
    "finite_number",
    "get_kind",
    "kind_names",
    "kinds",
    "parse_float",
    "parse_labels",
    "register_kind",
]
