"""The settings of :func:`~stoker.tools.pack.api.pack` that come in groups: how SRC is read
(:class:`Reading`), what is done to each image (:class:`Images`), how the shards are cut
(:class:`Shards`), the masks of a segmentation pack (:class:`Masks`) and a Ray cluster
(:class:`Ray`). Each is a frozen dataclass whose defaults are ``stoker pack``'s; a field is the
flag of the same name (the table in docs/pack.md).

A message about a field names it as Python callers write it (``Shards.size``) and as the
command's flag (``--shard-size``): :func:`setting`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from stoker.errors import arg
from stoker.pipeline.shards.targets import IGNORE_INDEX

from .sanitize import MAX_BYTES, PIL_MAX_PIXELS

DEFAULT_SHARD_SIZE = 256 * 1000**2


@dataclass(frozen=True)
class Reading:
    """How SRC is read.

    Attributes:
        source: The reader of SRC by name (``"auto"``: the first that recognizes it).
        targets: What a CSV's target columns hold: ``"auto"`` (decided from the cells, said in
            the summary), ``"class"``, ``"float"`` or ``"multilabel"``
            (:mod:`~stoker.tools.pack.sources.csvlist`).
        image_column: A table's image column (parquet; None: the one image column).
        target_column: A table's target column, or comma-separated float columns (None: decided).
        weight_column: A CSV's column of per-sample sampling weights (``Loader(balance="weights")``).
        train_list: A file naming the train split's images (one name, path or stem a line):
            the official split; images in neither list are skipped.
        val_list: A file naming the val split's images (the rest is train without ``train_list``).
        box_frame: Boxes: the frame an EXIF-rotated image's boxes were drawn in when the size
            its annotation gives fits both the file's raw pixels and its upright ones (``"auto"``:
            upright, as labelling tools show a photo; ``"raw"``; ``"upright"``). A size that fits
            one of them decides; one that fits neither makes the image a reject.
    """

    source: str = "auto"
    targets: str = "auto"
    image_column: str | None = None
    target_column: str | None = None
    weight_column: str | None = None
    train_list: str | Path | None = None
    val_list: str | Path | None = None
    box_frame: str = "auto"


@dataclass(frozen=True)
class Images:
    """What is done to each image, and the limits an input must keep.

    Attributes:
        short_side: Resize down so the shorter side is at most this (0: keep the size; None: 256,
            or 0 with masks: segmentation crops are usually larger than 256).
        max_side: Resize down so the longer side is at most this (0: no limit).
        quality: JPEG quality of re-encoded images.
        reencode: Re-encode every image, even JPEGs that could be copied as they are.
        max_pixels: Reject images larger than this many pixels, before decoding.
        max_file_size: Reject input files larger than this many bytes, before reading.
    """

    short_side: int | None = None
    max_side: int = 0
    quality: int = 90
    reencode: bool = False
    max_pixels: int = PIL_MAX_PIXELS
    max_file_size: int = MAX_BYTES


@dataclass(frozen=True)
class Shards:
    """How the shards are cut.

    Attributes:
        size: Start a new shard before one would exceed this many bytes.
        samples: Exactly this many samples per shard (0: by ``size``).
    """

    size: int = DEFAULT_SHARD_SIZE
    samples: int = 0


@dataclass(frozen=True)
class Masks:
    """The masks of a segmentation pack (``masks="tree"`` is ``Masks("tree")``).

    Attributes:
        path: A mask tree parallel to SRC (same relative paths and stems): each image is stored
            with its mask (:mod:`~stoker.tools.pack.masks`). None: SRC carries its own masks (a
            CSV of image,mask pairs, a parquet mask column), which ``num_classes`` and
            ``ignore_index`` are then for.
        num_classes: Mask values must be below it (or ``ignore_index``); None: not checked.
        ignore_index: The "no class" pixel value.
    """

    path: str | Path | None = None
    num_classes: int | None = None
    ignore_index: int = IGNORE_INDEX


@dataclass(frozen=True)
class Ray:
    """Pack with Ray tasks (``engine="ray"`` is ``Ray()``); the output is the same.

    Attributes:
        address: The Ray cluster (``"auto"``, ``"ray://head:10001"``; None: a local Ray).
    """

    address: str | None = None


#: How Python callers write each setting that is a field of a group, by the keyword it was before
#: the groups (the ``dest`` of its ``stoker pack`` flag).
FIELDS = {
    **{name: f"Reading.{name}" for name in Reading.__dataclass_fields__},
    **{name: f"Images.{name}" for name in Images.__dataclass_fields__},
    "shard_size": "Shards.size",
    "samples_per_shard": "Shards.samples",
    "num_classes": "Masks.num_classes",
    "ignore_index": "Masks.ignore_index",
    "ray_address": "Ray.address",
}


def setting(name: str, *value: object) -> str:
    """:func:`~stoker.errors.arg` for a setting of :func:`pack` by its flag's ``dest``: Python
    callers read the group's field (``Shards.size``, ``Reading(source='coco')``), the command its
    flag (``--shard-size``, ``--source coco``); a setting of its own is spelled as itself."""
    return arg(name, *value, python=FIELDS.get(name))


__all__ = ["DEFAULT_SHARD_SIZE", "FIELDS", "Images", "Masks", "Ray", "Reading", "Shards", "setting"]
