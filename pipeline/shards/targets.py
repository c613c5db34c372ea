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

from dataclasses import dataclass, field
from typing import Any

from stoker.errors import ArgumentError

from .kinds import (  # the kinds' codecs, named here too for what imported them from this module
    IGNORE_INDEX,
    MAX_COLUMNS,
    TargetKind,
    bad_target,
    check_mask,
    encode_float,
    encode_labels,
    encode_npy,
    fast_float_reader,
    finite_number,
    get_kind,
    parse_float,
    parse_labels,
)
from .stats import StatsAccumulator, TargetStats


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
        self.spec.validate(self)

    @property
    def spec(self) -> TargetKind:
        """The kind's object (:mod:`.kinds`): how these targets are packed, read, checked, trained."""
        return get_kind(self.kind)

    @classmethod
    def of(cls, kind: str, **kw: Any) -> Target:
        """The packed form of ``kind`` (its default member and fields, e.g. a mask ignores 255)."""
        spec = get_kind(kind)
        for name, value in spec.defaults().items():
            kw.setdefault(name, value)
        return cls(kind=kind, member=kw.pop("member", spec.member), **kw)

    @property
    def width(self) -> int:
        """Values per sample of a ``float`` target (K)."""
        return len(self.columns)

    @property
    def spatial(self) -> bool:
        """Cropped, flipped and resized with its image (a mask)."""
        return self.spec.spatial

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
        return cls(
            kind=str(d["kind"]),
            member=str(d.get("member") or get_kind(str(d["kind"])).member),
            columns=tuple(str(c) for c in d.get("columns") or ()),
            num_classes=None if d.get("num_classes") is None else int(d["num_classes"]),
            ignore_index=None if d.get("ignore_index") is None else int(d["ignore_index"]),
            stats=TargetStats.from_json(d["stats"]) if d.get("stats") is not None else None,
        )

    def describe(self) -> str:
        """``"float, 3 columns (x, y, z)"``, ``"mask, 21 classes, 255 ignored"``: for summaries."""
        return self.spec.describe(self)


__all__ = [
    "IGNORE_INDEX",
    "MAX_COLUMNS",
    "StatsAccumulator",
    "Target",
    "TargetStats",
    "bad_target",
    "check_mask",
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
    ``cls`` may hold, :func:`~.idx.parse_label`). The kind's own rule (:meth:`.kinds.TargetKind.check`)."""
    return target.spec.check(target, raw, num_classes=num_classes, image_wh=image_wh, names=names)
