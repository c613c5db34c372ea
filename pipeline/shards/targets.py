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
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stoker.errors import TargetError

TARGET_KINDS = ("class", "float", "multilabel", "mask")
#: the member each kind is packed as
MEMBERS = {"class": "cls", "float": "target.npy", "multilabel": "labels.npy", "mask": "mask.png"}
#: a mask's "no class here" value (what CrossEntropyLoss(ignore_index=255) skips)
IGNORE_INDEX = 255
#: the most float columns a target may have (a wider one is a mistake, e.g. a CSV of pixels)
MAX_COLUMNS = 4096


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
    """

    kind: str = "class"
    member: str = "cls"
    columns: tuple[str, ...] = field(default=())
    num_classes: int | None = None
    ignore_index: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in TARGET_KINDS:
            raise ValueError(f"target kind {self.kind!r} is not one of {', '.join(TARGET_KINDS)}")
        if self.kind == "float" and not 1 <= len(self.columns) <= MAX_COLUMNS:
            raise ValueError(f"a float target has 1 to {MAX_COLUMNS} columns, got {len(self.columns)}")

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
        return d

    @classmethod
    def from_json(cls, d: dict) -> Target:
        if not isinstance(d, dict) or "kind" not in d:
            raise ValueError(f"target must be an object with a kind, got {d!r}")
        return cls(
            kind=str(d["kind"]),
            member=str(d.get("member", MEMBERS.get(str(d["kind"]), "cls"))),
            columns=tuple(str(c) for c in d.get("columns") or ()),
            num_classes=None if d.get("num_classes") is None else int(d["num_classes"]),
            ignore_index=None if d.get("ignore_index") is None else int(d["ignore_index"]),
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
                raise ValueError(f"dtype {a.dtype} is not numeric")
            return np.asarray(a).reshape(-1)
        if ext == "json":
            v = json.loads(raw)
            return np.asarray([v] if isinstance(v, (int, float)) else v, np.float64).reshape(-1)
        text = raw.decode("utf-8").replace(",", " ").replace("|", " ").split()
        return np.asarray([float(t) for t in text], np.float64)
    except (ValueError, TypeError, UnicodeDecodeError, OSError) as e:
        raise ValueError(" ".join(str(e).split())[:120] or type(e).__name__) from None


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
    "Target",
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
