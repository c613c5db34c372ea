"""The box target kind (object detection): any number of boxes a sample, each with a class and
COCO's ``iscrowd``, moved with their image by every crop, flip and letterbox.

A sample's boxes are stored as the tar member ``boxes.npy``: float32 ``(k, 6)`` rows ``x0 y0 x1
y1 class crowd`` in the stored image's pixels (``k = 0``: a negative, an image with no object). A
batch of them is a :class:`BoxBatch`: ``.boxes`` float32 ``[N, M, 4]`` xyxy in the batch image's
pixels (zero-padded), ``.labels`` int64 ``[N, M]`` (-1 padding), ``.counts`` int64 ``[N]``,
``.crowd`` bool ``[N, M]``; ``.to_list()`` is torchvision's ``list[dict(boxes, labels)]``.

Everything box-specific lives here: the rest of stoker asks the kind (:class:`BoxKind`) through
the generic hooks of :class:`~.kinds.Target` (``follows_crop``, ``follow``, ``empty``,
``pack_value``, ``add_seen``, ...), never its name.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from stoker.errors import one_line

from .kinds import Target, bad_target, encode_npy, register_kind
from .stats import StatsAccumulator, TargetStats

#: a box row: x0 y0 x1 y1 class crowd
COLUMNS = 6
#: torchvision ``SanitizeBoundingBoxes``' defaults: a box narrower or lower than ``min_size`` or
#: smaller than ``min_area`` pixels after the crop is dropped with its label
MIN_SIZE = 1.0
MIN_AREA = 1.0
#: box sizes (the square root of the area, in stored pixels) the manifest counts boxes between
SIZE_EDGES = (0, 8, 16, 32, 64, 96, 128, 256, 512)
#: COCO's small / medium / large boundaries (area in pixels)
COCO_AREAS = (32**2, 96**2)
_MAX_PER_IMAGE_BINS = 64  # images with more boxes share the last bin of the per-image histogram (max is exact)


class BoxTarget(NamedTuple):
    """A pack source's boxes of one image, in the frame they were drawn in.

    Attributes:
        rows: ``(x0, y0, x1, y1, class, crowd)`` rows, corners as shares (``[0, 1]``) of the image
            the annotation was drawn on.
        size: that image's ``(width, height)`` as the annotation gives it: it tells the file's raw
            pixels from its EXIF-upright ones (:func:`frame_of`). None: shares of the upright image.
        frame: which frame to take when ``size`` fits both (``auto``: upright, ``raw``, ``upright``).
        image_id: the dataset's own id of the image (COCO's), recorded in the sample's ``json``.
    """

    rows: tuple
    size: tuple | None = None
    frame: str = "auto"
    image_id: Any = None


#: EXIF orientations whose upright image swaps width and height
_SWAPS = (5, 6, 7, 8)


def frame_of(target: BoxTarget, orientation: int, upright: tuple[int, int]) -> str:
    """``"raw"`` or ``"upright"``: the frame ``target``'s boxes were drawn in, told by the size the
    annotation gives against the file's raw and upright (EXIF-oriented) sizes; or a reject reason
    when it fits neither (never rescaled: a box scaled to a wrong size lands beside its object)."""
    uw, uh = upright
    raw = (uh, uw) if orientation in _SWAPS else (uw, uh)
    size = tuple(target.size)
    fits = [name for name, wh in (("upright", (uw, uh)), ("raw", raw)) if size == wh]
    if not fits:
        if orientation == 1:
            return f"the annotation's size {size[0]}x{size[1]} is not the image's {uw}x{uh}"
        return (
            f"the annotation's size {size[0]}x{size[1]} is neither the image's {raw[0]}x{raw[1]} pixels nor "
            f"its {uw}x{uh} upright by EXIF orientation {orientation}"
        )
    if len(fits) == 2 and target.frame in ("raw", "upright"):
        return target.frame
    return fits[0]


def orient_rows(rows: np.ndarray, orientation: int) -> np.ndarray:
    """Rows whose corners are shares of a file's raw pixels, as shares of its upright image: the
    transpose that EXIF ``orientation`` asks for (what pack does to the pixels) done to the boxes."""
    x0, y0, x1, y1 = rows[:, 0], rows[:, 1], rows[:, 2], rows[:, 3]
    corners = {  # each orientation's upright (x0, y0, x1, y1) from the raw corners
        1: (x0, y0, x1, y1),
        2: (1 - x1, y0, 1 - x0, y1),  # FLIP_LEFT_RIGHT
        3: (1 - x1, 1 - y1, 1 - x0, 1 - y0),  # ROTATE_180
        4: (x0, 1 - y1, x1, 1 - y0),  # FLIP_TOP_BOTTOM
        5: (y0, x0, y1, x1),  # TRANSPOSE
        6: (1 - y1, x0, 1 - y0, x1),  # ROTATE_270: a quarter turn clockwise
        7: (1 - y1, 1 - x1, 1 - y0, 1 - x0),  # TRANSVERSE
        8: (y0, 1 - x1, y1, 1 - x0),  # ROTATE_90: a quarter turn counter-clockwise
    }[orientation]
    out = rows.copy()
    out[:, :4] = np.stack(corners, axis=1) if len(rows) else out[:, :4]
    return out


def encode_boxes(rows: Any) -> bytes:
    """A sample's boxes as packed: float32 ``(k, 6)`` ``.npy`` (``x0 y0 x1 y1 class crowd``)."""
    return encode_npy(np.asarray(rows, np.float32).reshape(-1, COLUMNS))


def read_boxes(raw: Any) -> np.ndarray | str:
    """The ``(k, 6)`` float32 rows of a ``boxes.npy`` member, or why it is not one. What pack
    wrote (little-endian float32, C order, header seen before) is one ``frombuffer``."""
    head = bytes(raw[:10])
    if head[:8] == b"\x93NUMPY\x01\x00":
        end = 10 + int.from_bytes(head[8:10], "little")
        k = _HEADERS.get(bytes(raw[10:end]))
        if k is not None and len(raw) == end + 4 * COLUMNS * k:
            return np.frombuffer(raw, "<f4", COLUMNS * k, end).reshape(k, COLUMNS)
    try:
        a = np.lib.format.read_array(io.BytesIO(bytes(raw)), allow_pickle=False)
    except (ValueError, TypeError, OSError, EOFError) as e:
        return f"boxes do not parse: {one_line(e)}"
    if a.dtype.kind not in "iuf" or not (a.ndim == 2 and a.shape[1] == COLUMNS or a.size == 0):
        return f"boxes are {a.dtype} {a.shape}, not float32 (k, {COLUMNS}) rows x0 y0 x1 y1 class crowd"
    if a.dtype == np.dtype("<f4") and a.ndim == 2 and head[:8] == b"\x93NUMPY\x01\x00" and len(_HEADERS) < 4096:
        end = 10 + int.from_bytes(head[8:10], "little")
        if bytes(raw[end - 1 : end]) == b"\n" and "True" not in bytes(raw[10:end]).decode("latin-1"):
            _HEADERS[bytes(raw[10:end])] = len(a)  # a C-order float32 header: read fast next time
    return a.astype(np.float32).reshape(-1, COLUMNS)


#: ``.npy`` headers of float32 ``(k, 6)`` C-order arrays seen, and their ``k``
_HEADERS: dict[bytes, int] = {}


def box_problem(rows: np.ndarray, num_classes: int, image_wh: tuple[int, int] | None) -> str | None:
    """Why ``rows`` are not usable boxes of an image of ``image_wh`` (a box with non-positive size,
    outside its image, not finite, naming an unknown class), or None."""
    if not np.isfinite(rows).all():
        return "a box is not finite"
    x0, y0, x1, y1, cls = rows[:, 0], rows[:, 1], rows[:, 2], rows[:, 3], rows[:, 4]
    bad = (x1 <= x0) | (y1 <= y0)
    if bad.any():
        return f"box {rows[np.argmax(bad), :4].tolist()} has no positive size"
    if image_wh is not None:
        w, h = image_wh
        out = (x0 < 0) | (y0 < 0) | (x1 > w) | (y1 > h)
        if out.any():
            return f"box {rows[np.argmax(out), :4].tolist()} is outside its {w}x{h} image"
    if num_classes and ((cls < 0) | (cls >= num_classes) | (cls != np.round(cls))).any():
        return f"a box's class is not an index below {num_classes}: {sorted(set(cls.tolist()))[:8]}"
    return None


class BoxBatch:
    """A batch of boxes as a detection model takes them.

    Attributes:
        boxes: float32 ``[N, M, 4]`` ``x0 y0 x1 y1`` in the batch image's pixels (zero past a
            sample's count).
        labels: int64 ``[N, M]`` class indices (-1 past a sample's count).
        counts: int64 ``[N]`` boxes per sample.
        crowd: bool ``[N, M]`` COCO's ``iscrowd`` (VOC's ``difficult``): scored as "ignore".
    """

    __slots__ = ("boxes", "labels", "counts", "crowd")

    def __init__(self, boxes, labels, counts, crowd):
        self.boxes, self.labels, self.counts, self.crowd = boxes, labels, counts, crowd

    @classmethod
    def from_rows(cls, rows: Sequence[np.ndarray]) -> BoxBatch:
        """The batch of per-sample ``(k, 6)`` rows (CPU tensors)."""
        import torch

        counts = np.array([len(r) for r in rows], np.int64)
        m = int(counts.max(initial=0))
        boxes = np.zeros((len(rows), m, 4), np.float32)
        labels = np.full((len(rows), m), -1, np.int64)
        crowd = np.zeros((len(rows), m), bool)
        for k, r in enumerate(rows):
            n = len(r)
            boxes[k, :n], labels[k, :n], crowd[k, :n] = r[:, :4], r[:, 4], r[:, 5] > 0
        as_t = torch.from_numpy
        return cls(as_t(boxes), as_t(labels), as_t(counts), as_t(crowd))

    @classmethod
    def empty(cls, n: int = 0, device: Any = "cpu") -> BoxBatch:
        """``n`` samples without boxes on ``device``."""
        return cls.from_rows([np.zeros((0, COLUMNS), np.float32)] * n).to(device)

    def to(self, device: Any, non_blocking: bool = False) -> BoxBatch:
        """The batch on ``device`` (every tensor moved)."""
        return BoxBatch(*(getattr(self, f).to(device, non_blocking=non_blocking) for f in self.__slots__))

    def pin_memory(self) -> BoxBatch:
        return BoxBatch(*(getattr(self, f).pin_memory() for f in self.__slots__))

    @property
    def device(self):
        return self.boxes.device

    def __len__(self) -> int:
        return len(self.counts)

    def __getitem__(self, rows) -> BoxBatch:
        """The samples ``rows`` (a slice, an index tensor or a mask) of the batch."""
        return BoxBatch(*(getattr(self, f)[rows] for f in self.__slots__))

    def to_list(self, *, crowd: bool = True) -> list[dict]:
        """torchvision's detection targets: a ``dict(boxes=[k, 4], labels=[k], iscrowd=[k])`` a
        sample (``crowd=False``: crowd boxes left out, as a detector is trained)."""
        out = []
        for k, n in enumerate(self.counts.tolist()):
            keep = slice(0, n) if crowd else ~self.crowd[k, :n]
            d = {"boxes": self.boxes[k, :n][keep], "labels": self.labels[k, :n][keep]}
            if crowd:
                d["iscrowd"] = self.crowd[k, :n].to(self.labels.dtype)
            out.append(d)
        return out

    def __repr__(self) -> str:
        return f"BoxBatch(samples={len(self)}, boxes={int(self.counts.sum())}, device={self.device})"


def follow_crop(
    rows: Sequence[np.ndarray],
    crops: np.ndarray,
    flips: np.ndarray,
    places: np.ndarray,
    *,
    min_size: float = MIN_SIZE,
    min_area: float = MIN_AREA,
    min_visible: float = 0.0,
) -> list[np.ndarray]:
    """Each sample's rows moved as its image is: the crop box ``crops[k]`` (``x y w h`` in stored
    pixels) is resized onto ``places[k]`` (``x y w h`` in the output) and flipped within it where
    ``flips[k]``. A box is clipped to the place; one left narrower or lower than ``min_size``,
    smaller than ``min_area`` output pixels or with less than ``min_visible`` of its stored area
    inside the crop is dropped with its label. Plain float64 arithmetic: the same on every backend."""
    n = len(rows)
    if n == 0:
        return []
    counts = np.array([len(r) for r in rows])
    flat = np.concatenate(rows).astype(np.float64) if counts.sum() else np.zeros((0, COLUMNS))
    k = np.repeat(np.arange(n), counts)
    c, p = np.asarray(crops, np.float64)[k], np.asarray(places, np.float64)[k]
    sx, sy = p[:, 2] / c[:, 2], p[:, 3] / c[:, 3]
    area = (flat[:, 2] - flat[:, 0]) * (flat[:, 3] - flat[:, 1])
    # clipped to the crop in stored pixels first: the visible share needs stored areas
    x0, x1 = np.clip(flat[:, 0], c[:, 0], c[:, 0] + c[:, 2]), np.clip(flat[:, 2], c[:, 0], c[:, 0] + c[:, 2])
    y0, y1 = np.clip(flat[:, 1], c[:, 1], c[:, 1] + c[:, 3]), np.clip(flat[:, 3], c[:, 1], c[:, 1] + c[:, 3])
    visible = (x1 - x0) * (y1 - y0) / np.maximum(area, 1e-12)
    ox0, ox1 = p[:, 0] + (x0 - c[:, 0]) * sx, p[:, 0] + (x1 - c[:, 0]) * sx
    oy0, oy1 = p[:, 1] + (y0 - c[:, 1]) * sy, p[:, 1] + (y1 - c[:, 1]) * sy
    flip = np.asarray(flips, bool)[k]
    mirror = 2 * p[:, 0] + p[:, 2]  # x -> mirror - x flips within the place
    ox0, ox1 = np.where(flip, mirror - ox1, ox0), np.where(flip, mirror - ox0, ox1)
    w, h = ox1 - ox0, oy1 - oy0
    keep = (w >= min_size) & (h >= min_size) & (w * h >= min_area) & (visible >= min_visible)
    moved = np.stack([ox0, oy0, ox1, oy1, flat[:, 4], flat[:, 5]], axis=1).astype(np.float32)
    bounds = np.cumsum(counts)[:-1]
    return [m[kk] for m, kk in zip(np.split(moved, bounds), np.split(keep, bounds), strict=True)]


class BoxStats(StatsAccumulator):
    """Boxes per image (a histogram), per class, and their sizes (``sqrt(area)`` bins and COCO's
    small / medium / large): counts, so parts merge exactly."""

    flavour = "boxes"

    def __init__(self, kind: str = "boxes", width: int = 0):
        super().__init__(kind, width)
        self.per_image = np.zeros(_MAX_PER_IMAGE_BINS + 1, np.int64)
        self.most = 0  # the most boxes an image holds: exact past the histogram's last bin
        self.per_class: dict[int, int] = {}
        self.sizes = np.zeros(len(SIZE_EDGES), np.int64)
        self.coco = np.zeros(3, np.int64)

    def add(self, value) -> None:
        """One sample's ``(k, 6)`` rows."""
        rows = np.asarray(value, np.float64).reshape(-1, COLUMNS)
        self.count += 1
        self.per_image[min(len(rows), _MAX_PER_IMAGE_BINS)] += 1
        self.most = max(self.most, len(rows))
        for c, n in zip(*np.unique(rows[:, 4].astype(np.int64), return_counts=True), strict=True):
            self.per_class[int(c)] = self.per_class.get(int(c), 0) + int(n)
        area = (rows[:, 2] - rows[:, 0]) * (rows[:, 3] - rows[:, 1])
        self.sizes += np.bincount(np.searchsorted(SIZE_EDGES, np.sqrt(area), "right") - 1, minlength=len(SIZE_EDGES))
        self.coco += np.bincount(np.searchsorted(COCO_AREAS, area, "right"), minlength=3)

    def _merge_from(self, other: StatsAccumulator) -> None:
        self.count += other.count
        self.per_image += other.per_image
        self.most = max(self.most, other.most)
        self.sizes += other.sizes
        self.coco += other.coco
        for c, n in other.per_class.items():
            self.per_class[c] = self.per_class.get(c, 0) + n

    def state(self) -> dict:
        return {
            **super().state(),
            "per_image": self.per_image.tolist(),
            "most": self.most,
            "per_class": {str(c): n for c, n in sorted(self.per_class.items())},
            "sizes": self.sizes.tolist(),
            "coco": self.coco.tolist(),
        }

    def _load(self, d: dict) -> None:
        if "per_image" in d:
            self.per_image[: len(d["per_image"])] = d["per_image"]
            hist = np.flatnonzero(self.per_image)
            self.most = int(d.get("most", hist[-1] if len(hist) else 0))  # a journal of before: its last bin
            self.per_class = {int(c): int(n) for c, n in d["per_class"].items()}
            self.sizes, self.coco = np.asarray(d["sizes"], np.int64), np.asarray(d["coco"], np.int64)

    def result(self, ignore_index: int | None = None) -> TargetStats | None:
        if not self.count:
            return None
        hist, boxes = self.per_image, int(sum(self.per_class.values()))
        last = int(np.flatnonzero(hist)[-1])  # the histogram's last bin: that many boxes or more
        detail = {
            "images": self.count,
            "boxes": boxes,
            "negatives": int(hist[0]),
            # histogram[n]: images of n boxes; its bin 64 counts those of 64 or more (max: the exact most)
            "per_image": {
                "mean": boxes / self.count,
                "max": max(self.most, last),
                "histogram": hist[: last + 1].tolist(),
            },
            "per_class": {str(c): n for c, n in sorted(self.per_class.items())},
            "size_edges": list(SIZE_EDGES),
            "sizes": self.sizes.tolist(),
            "coco_small_medium_large": self.coco.tolist(),
        }
        return TargetStats(self.count, detail=detail)


class BoxKind(Target):
    """Boxes a sample (detection), stored as float32 ``(k, 6)`` ``.npy`` rows ``x0 y0 x1 y1 class
    crowd`` in the stored image's pixels; read into a :class:`BoxBatch` moved with the crop."""

    name, member, task, named_classes, dtype, sized = "boxes", "boxes.npy", "detect", True, "float32", True
    follows_crop = True
    val_fit = "letterbox"  # a val batch keeps every box: the whole image, its aspect ratio kept

    # ---- pack
    def encode(self, value):
        return encode_boxes(value)

    def pack_value(self, item, res, classes):
        """Rows the source gave in shares of the image (``x0 y0 x1 y1`` in ``[0, 1]``; a
        :class:`BoxTarget` says which frame) in the stored image's pixels: turned as pack turned
        the pixels (EXIF) when drawn on the raw ones, scaled by pack's resize. A size that fits
        neither frame is ``(None, {"reject": why})``."""
        from PIL import Image

        target = item.target if isinstance(item.target, BoxTarget) else BoxTarget(item.target or ())
        rows = np.asarray(target.rows, np.float64).reshape(-1, COLUMNS)
        more: dict[str, Any] = {}
        if target.size is not None:
            orientation = getattr(res, "orientation", 1)
            frame = frame_of(target, orientation, (res.width, res.height))
            if frame not in ("raw", "upright"):
                return None, {"reject": frame}
            if frame == "raw" and orientation != 1:
                rows = orient_rows(rows, orientation)
            if orientation != 1:  # what maps a prediction back to the annotation's pixels
                more["box_frame"], more["exif_orientation"] = frame, orientation
        if target.image_id is not None:
            more["image_id"] = target.image_id
        with Image.open(io.BytesIO(res.jpg)) as im:  # the stored size: the header alone
            w, h = im.size
        rows = rows * (w, h, w, h, 1, 1)
        rows[:, :4] = np.clip(rows[:, :4], 0, (w, h, w, h))  # a share of exactly 1.0 stays on the image
        rows = rows.astype(np.float32)
        return rows, {"boxes": len(rows), **more}

    def add_seen(self, acc, item, res, value):
        acc.add(value)

    def accumulator(self):
        return BoxStats("boxes")

    # ---- the Loader
    def decode(self, raws, *, classes, where, split):
        out = []
        for k, raw in enumerate(raws):
            rows = read_boxes(raw)
            if isinstance(rows, str):
                raise bad_target(where(k), rows, split)
            out.append(rows)
        if out and box_problem(np.concatenate(out), len(classes), None):  # checked at once; then which
            k = next(k for k, rows in enumerate(out) if box_problem(rows, len(classes), None))
            raise bad_target(where(k), box_problem(out[k], len(classes), None), split)
        return out

    def follow(self, decoded, crops, flips, places, *, min_visible: float = 0.0):
        return BoxBatch.from_rows(follow_crop(decoded, crops, flips, places, min_visible=min_visible))

    def empty(self, n, crop, num_classes, device):
        return BoxBatch.empty(n, device)

    # ---- verify / index
    def check(self, raw, *, num_classes, image_wh=None, names=None):
        rows = read_boxes(raw)
        return rows if isinstance(rows, str) else box_problem(rows, num_classes, image_wh)

    def index_value(self, raw, *, num_classes, names, width, image_wh):
        rows = read_boxes(raw)
        if isinstance(rows, str):
            return rows
        return box_problem(rows, num_classes or 0, image_wh) or int(rows[:, 4].max(initial=-1))

    def missing(self):
        return "no boxes.npy (a negative has an empty one)"

    # ---- summaries
    def describe_stats(self, stats):
        d = stats.detail or {}
        if not d:
            return self.describe(), ""
        small, medium, large = d.get("coco_small_medium_large", (0, 0, 0))
        found = (
            f"{d['boxes']:,} boxes in {d['images']:,} images ({d['negatives']:,} negatives kept: no box), "
            f"{d['per_image']['mean']:.2g} per image (max {d['per_image']['max']}); "
            f"COCO sizes small {small:,}, medium {medium:,}, large {large:,}"
        )
        return self.describe(), found

    def summary(self, num_classes, stats):
        line = f"boxes, {num_classes:,} class{'es' if num_classes != 1 else ''}"
        return line, (self.describe_stats(stats)[1] if stats is not None else "")


register_kind(BoxKind)

__all__ = [
    "COLUMNS",
    "MIN_AREA",
    "MIN_SIZE",
    "BoxBatch",
    "BoxKind",
    "BoxStats",
    "BoxTarget",
    "encode_boxes",
    "follow_crop",
    "frame_of",
    "orient_rows",
]
