"""What a sample holds besides its image: the target kinds of the shard format.

=============  ===================  ============================================  ==========================
kind           member (packed)      stored as                                     the Loader yields
=============  ===================  ============================================  ==========================
``class``      ``cls``              the class index as text (``b"3"``)            int64 ``[N]``
``float``      ``target.npy``       float32 ``(K,)`` ``.npy``                     float32 ``[N]`` or ``[N, K]``
``multilabel`` ``labels.npy``       int32 ``(n,)`` ``.npy`` of class indices      float32 multi-hot ``[N, C]``
``mask``       ``mask.png``         8-bit grayscale PNG, one class index a pixel  uint8 ``[N, H, W]``
``boxes``      ``boxes.npy``        float32 ``(k, 6)`` rows x0 y0 x1 y1 cls crowd  a box batch (:mod:`.boxes`)
=============  ===================  ============================================  ==========================

A split's manifest names its kind and member (:class:`Target`: an object of its kind's class, in
:mod:`.kinds`); ``stoker index`` may name
another member of foreign tars (``.npy``, ``.json`` or text numbers; a mask ``.png``). A mask's
pixel value ``ignore_index`` (255 by default) marks pixels no loss should count.
"""

from __future__ import annotations

from . import boxes as _boxes  # noqa: F401  (the box kind, a module of its own, registers itself)
from .kinds import (  # the kinds' codecs and the Target, named here too for what imported them from here
    IGNORE_INDEX,
    MAX_COLUMNS,
    Target,
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

__all__ = [
    "IGNORE_INDEX",
    "MAX_COLUMNS",
    "StatsAccumulator",
    "Target",
    "TargetKind",
    "TargetStats",
    "bad_target",
    "check_mask",
    "check_target",
    "encode_float",
    "encode_labels",
    "encode_npy",
    "fast_float_reader",
    "finite_number",
    "get_kind",
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
    ``cls`` may hold, :func:`~.idx.parse_label`). The kind's own rule (:meth:`.kinds.Target.check`)."""
    return target.check(raw, num_classes=num_classes, image_wh=image_wh, names=names)
