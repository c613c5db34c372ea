"""The base of every target kind (:class:`Target`), the codecs the built-in kinds share, and the
one registry of kinds (:func:`register_kind`, :func:`get_kind`); each kind is a module of this
package (:mod:`.classes`, :mod:`.floats`, :mod:`.multilabel`, :mod:`.mask`; the box kind in
:mod:`stoker.pipeline.shards.boxes`)."""

from __future__ import annotations

import io
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from stoker.errors import ArgumentError, TargetError, arg, one_line

from ...registry import Registry
from ..stats import IGNORE_INDEX, StatsAccumulator, TargetStats

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


#: the entry-point group a package names its target kinds in
ENTRY_POINTS = "stoker.target_kinds"
_REGISTRY: Registry[TargetKind] = Registry("target kind", TargetKind, ENTRY_POINTS, required=("name", "member"))


def register_kind(cls: type[TargetKind]) -> type[TargetKind]:
    """Add a target kind (usable as a decorator). Its name must be new."""
    return _REGISTRY.register(cls)


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
