"""The target kinds, each one class in one registry: every room asks the kind, none switches on its name.

A kind says, for the targets of its samples, how pack encodes one (:meth:`TargetKind.encode`), how a
batch of them is read for the Loader (:meth:`~TargetKind.decode`, or with its image for a spatial
kind), how ``stoker verify``/``stoker index`` check one (:meth:`~TargetKind.check`), how it is
described and what an empty batch of it is, and which task ``stoker train --task auto`` trains on
it (:attr:`~TargetKind.task`). A split's manifest names its kind (:class:`~.targets.Target`), and
``target.spec`` is the kind's object.

A kind of your own is a subclass registered once (or named under the ``stoker.target_kinds``
entry points of your package)::

    @register_kind
    class Score(TargetKind):
        name, member, task = "score", "score.json", "regress"
        ...                                    # encode, decode, check, describe, batch_shape

The built-in kinds: ``class`` (``cls``), ``float`` (``target.npy``), ``multilabel``
(``labels.npy``) and ``mask`` (``mask.png``, spatial); their formats are in :mod:`.targets`.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Protocol

import numpy as np

from stoker.errors import ArgumentError, TargetError

from ..registry import Registry
from .stats import IGNORE_INDEX, StatsAccumulator, TargetStats

Where = Callable[[int], str]


class TargetFields(Protocol):
    """What a kind reads of a split's target: the fields of :class:`~.targets.Target` (which
    imports this module, so a kind names the fields, not that class)."""

    @property
    def kind(self) -> str: ...

    @property
    def member(self) -> str: ...

    @property
    def columns(self) -> tuple[str, ...]: ...

    @property
    def num_classes(self) -> int | None: ...

    @property
    def ignore_index(self) -> int | None: ...

    @property
    def stats(self) -> TargetStats | None: ...

    @property
    def width(self) -> int: ...


#: the most float columns a target may have (a wider one is a mistake, e.g. a CSV of pixels)
MAX_COLUMNS = 4096


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


def check_mask(target: TargetFields, raw: bytes, image_wh: tuple[int, int] | None) -> str | None:
    """Why ``raw`` is not a mask of ``target`` (a one-channel PNG of the image's size, each value a
    declared class or the ignored one), or None."""
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


class TargetKind:
    """One kind of target (see the module docstring).

    Attributes:
        name: the manifest's ``target.kind``.
        member: the tar member pack writes (``stoker index`` may name another of foreign tars).
        task: what ``stoker train --task auto`` trains on it (``classify``, ``regress``,
            ``multilabel``, ``segment``).
        spatial: cropped, flipped and resized with its image (read with the image, not by
            :meth:`decode`).
        named_classes: its values are indices into the manifest's class list.
        dtype: the dtype of a batch of it (``"int64"``, ``"float32"``, ``"uint8"``).
        format: the manifest format that records it (1: what every stoker reads; 2: with ``target``).
    """

    name: ClassVar[str] = ""
    member: ClassVar[str] = ""
    task: ClassVar[str] = ""
    spatial: ClassVar[bool] = False
    named_classes: ClassVar[bool] = False
    dtype: ClassVar[str] = "float32"
    format: ClassVar[int] = 2

    def defaults(self) -> dict[str, Any]:
        """The :class:`~.targets.Target` fields a split of this kind gets unless given (a mask's
        ``ignore_index``)."""
        return {}

    def validate(self, target: TargetFields) -> None:
        """Raise :class:`~stoker.errors.ArgumentError` when ``target``'s fields do not fit the kind."""

    def accumulator(self, target: TargetFields):
        """A :class:`~.targets.StatsAccumulator` for what pack and index record of these targets
        (``None``: nothing)."""
        return None

    def encode(self, target: TargetFields, value: Any) -> bytes:
        """The member bytes pack writes for one sample's parsed ``value``."""
        raise NotImplementedError

    def meta(self, target: TargetFields, value: Any, classes: Sequence[str]) -> dict[str, Any]:
        """What a packed sample's ``json`` member records of its target (readable: class names)."""
        return {}

    def decode(
        self, target: TargetFields, raws: Sequence, *, classes: Sequence[str], where: Where, split: Any
    ) -> np.ndarray:
        """A batch of targets as the Loader yields them (on the CPU) from the members' bytes
        ``raws`` (zero-copy uint8 views). A sample whose target does not parse is a
        :class:`~stoker.errors.TargetError` naming ``where(k)`` and the fix."""
        raise NotImplementedError

    def check(
        self,
        target: TargetFields,
        raw: bytes,
        *,
        num_classes: int,
        image_wh: tuple[int, int] | None = None,
        names: dict[str, int] | None = None,
    ) -> str | None:
        """Why ``raw`` is not a usable target of this kind (``"what: detail"``), or None: what
        ``stoker verify`` and ``stoker index`` hold every sample to."""
        raise NotImplementedError

    def describe(self, target: TargetFields) -> str:
        """``"float, 3 columns (x, y, z)"``: for summaries."""
        return self.name

    def describe_stats(self, target: TargetFields, stats: TargetStats) -> tuple[str, str]:
        """``(targets line, found line)`` of a pack's summary, with what it saw of the targets."""
        return self.describe(target), ""

    def batch_shape(self, target: TargetFields, n: int, crop: tuple[int, int], num_classes: int) -> tuple[int, ...]:
        """The shape of a batch of ``n`` of these targets (an empty val batch is made of it)."""
        return (n,)

    def num_classes(self, target: TargetFields, classes: Sequence[str]) -> int:
        """The classes its values span (0 when it has none)."""
        return len(classes) if self.named_classes else 0


class ClassKind(TargetKind):
    name, member, task, named_classes, dtype, format = "class", "cls", "classify", True, "int64", 1

    def encode(self, target, value):
        return str(int(value)).encode()

    def meta(self, target, value, classes):
        return {"class": classes[int(value)]}

    def decode(self, target, raws, *, classes, where, split):
        from .idx import MAX_CLS_BYTES

        names = {c.encode("utf-8", "surrogateescape"): i for i, c in enumerate(classes)}
        out = np.empty(len(raws), np.int64)
        for k, raw in enumerate(raws):
            text = bytes(raw).strip() if len(raw) <= MAX_CLS_BYTES else b"x"
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

    def check(self, target, raw, *, num_classes, image_wh=None, names=None):
        from .idx import parse_label

        value = parse_label(raw, num_classes or None, names)
        return value if isinstance(value, str) else None


class FloatKind(TargetKind):
    name, member, task = "float", "target.npy", "regress"

    def encode(self, target, value):
        return encode_float(value)

    def meta(self, target, value, classes):
        return {"target": dict(zip(target.columns, value, strict=True))}

    def decode(self, target, raws, *, classes, where, split):
        width = target.width
        size, header = fast_float_reader(width)
        out = np.empty((len(raws), width), np.float32)
        for k, raw in enumerate(raws):
            if len(raw) == size and bytes(raw[: len(header)]) == header:  # what pack wrote: one frombuffer
                out[k] = np.frombuffer(raw, "<f4", width, len(header))
                if np.isfinite(out[k]).all():
                    continue
            value = parse_float(bytes(raw), target.member, width)
            if isinstance(value, str):
                raise bad_target(where(k), value, split)
            out[k] = value
        return out[:, 0] if width == 1 else out

    def check(self, target, raw, *, num_classes, image_wh=None, names=None):
        value = parse_float(raw, target.member, target.width)
        return value if isinstance(value, str) else None

    def validate(self, target):
        if not 1 <= len(target.columns) <= MAX_COLUMNS:
            raise ArgumentError(f"a float target has 1 to {MAX_COLUMNS} columns, got {len(target.columns)}")

    def accumulator(self, target):
        return StatsAccumulator("float", target.width)

    def describe(self, target):
        names = f" ({', '.join(target.columns)})" if target.width > 1 else ""
        return f"float, {target.width} column{'s' if target.width > 1 else ''}{names}"

    def batch_shape(self, target, n, crop, num_classes):
        return (n,) if target.width == 1 else (n, target.width)

    def describe_stats(self, target, stats):
        k = target.width
        cols = [
            f"{name}: mean {_num(stats.mean[i])}, std {_num(stats.std[i])}, {_num(stats.min[i])}..{_num(stats.max[i])}"
            for i, name in enumerate(target.columns[:4])
        ]
        more = f"; {k - 4:,} more" if k > 4 else ""
        return f"float, {k:,} column{'s' if k > 1 else ''} ({'; '.join(cols)}{more})", ""


class MultilabelKind(TargetKind):
    name, member, task, named_classes = "multilabel", "labels.npy", "multilabel", True

    def encode(self, target, value):
        return encode_labels(value)

    def meta(self, target, value, classes):
        return {"classes": [classes[k] for k in value]}

    def decode(self, target, raws, *, classes, where, split):
        out = np.zeros((len(raws), len(classes)), np.float32)
        for k, raw in enumerate(raws):
            labels = parse_labels(bytes(raw), target.member, len(classes))
            if isinstance(labels, str):
                raise bad_target(where(k), labels, split)
            out[k, labels] = 1.0
        return out

    def check(self, target, raw, *, num_classes, image_wh=None, names=None):
        value = parse_labels(raw, target.member, num_classes)
        return value if isinstance(value, str) else None

    def batch_shape(self, target, n, crop, num_classes):
        return (n, num_classes)


class MaskKind(TargetKind):
    name, member, task, spatial, dtype = "mask", "mask.png", "segment", True, "uint8"

    def defaults(self):
        return {"ignore_index": IGNORE_INDEX}

    def accumulator(self, target):
        return StatsAccumulator("mask")

    def encode(self, target, value):
        return bytes(value)  # pack's sanitizer already wrote the PNG

    def decode(self, target, raws, *, classes, where, split):
        raise ArgumentError("a mask split's targets are images: they are read with their images (masks())")

    def check(self, target, raw, *, num_classes, image_wh=None, names=None):
        return check_mask(target, raw, image_wh)

    def describe(self, target):
        classes = f"{target.num_classes} classes" if target.num_classes else "classes not declared"
        return f"mask, {classes}, {target.ignore_index} ignored"

    def batch_shape(self, target, n, crop, num_classes):
        return (n, *crop)

    def describe_stats(self, target, stats):
        share = stats.class_share
        absent = [str(v) for v, p in enumerate(share) if p == 0]
        found = f"classes 0..{len(share) - 1} found" if share else "no labelled pixel found"
        if absent:
            found += f" ({', '.join(absent[:8])}{', ...' if len(absent) > 8 else ''} absent)"
        return self.describe(target), found

    def num_classes(self, target, classes):
        found = len(target.stats.class_share) if target.stats is not None and target.stats.class_share else 0
        return target.num_classes or found or len(classes)


#: the entry-point group a package names its target kinds in
ENTRY_POINTS = "stoker.target_kinds"
_REGISTRY: Registry[TargetKind] = Registry("target kind", TargetKind, ENTRY_POINTS, required=("name", "member"))
_INSTANCES: dict[type[TargetKind], TargetKind] = {}  # a kind holds no state: one object of each


def register_kind(cls: type[TargetKind]) -> type[TargetKind]:
    """Add a target kind (usable as a decorator). Its name must be new."""
    return _REGISTRY.register(cls)


for _cls in (ClassKind, FloatKind, MultilabelKind, MaskKind):
    register_kind(_cls)


def _instance(cls: type[TargetKind]) -> TargetKind:
    kind = _INSTANCES.get(cls)
    if kind is None:
        kind = _INSTANCES[cls] = cls()
    return kind


def ensure_kind(cls: type[TargetKind]) -> None:
    """Register ``cls`` unless its name is known: what a worker process does with the kind of a
    split its parent read (a kind registered at run time travels with the split's index)."""
    if cls.name not in _REGISTRY:
        register_kind(cls)


def kind_names() -> tuple[str, ...]:
    """The registered kinds' names (``--targets`` choices, the manifest's ``target.kind``)."""
    return _REGISTRY.names()


def get_kind(name: str) -> TargetKind:
    """The kind ``name``.

    Raises:
        ArgumentError: an unknown name (the message lists the registered ones).
    """
    return _instance(_REGISTRY[name])


def kinds() -> list[TargetKind]:
    """Every registered kind."""
    return [_instance(cls) for cls in _REGISTRY]


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
    "ClassKind",
    "FloatKind",
    "MaskKind",
    "MultilabelKind",
    "TargetFields",
    "TargetKind",
    "bad_target",
    "ensure_kind",
    "check_mask",
    "encode_float",
    "encode_labels",
    "encode_npy",
    "fast_float_reader",
    "finite_number",
    "get_kind",
    "kind_names",
    "kinds",
    "parse_float",
    "parse_labels",
    "register_kind",
]
