"""A detection evaluation in the dataset's own terms: a COCO results file
(``stoker eval CKPT SPLIT --coco-results FILE``).

Each detection of each val image becomes ``{"image_id", "category_id", "bbox": [x, y, w, h],
"score"}``: the image id and category id the COCO JSON gave (recorded at pack time: the sample's
``json`` holds ``image_id``, the manifest ``category_ids``), the box in the pixels of the image
the annotation was drawn on (the letterbox undone, pack's resize undone, and an EXIF turn undone
for boxes drawn on the file's raw pixels). pycocotools' ``COCOeval`` of the file against the
COCO JSON scores it as ``stoker eval`` does (tests/model/test_coco_results.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from stoker.errors import ArgumentError, arg

#: an EXIF orientation's undoing: the upright-to-raw map of each (6 and 8 undo each other)
_UNDO = {1: 1, 2: 2, 3: 3, 4: 4, 5: 5, 6: 8, 7: 7, 8: 6}


def sample_records(split: str | Path) -> tuple[list[dict], np.ndarray, list | None]:
    """``(metas, stored sizes, category ids)`` of a local split's loadable samples in the order a
    val Loader reads them: each sample's ``json``, its stored ``(width, height)`` and the
    manifest's COCO category id of each class (None when the pack has none)."""
    from stoker.pipeline.shards.samples import image_size, open_split

    index = open_split(split, with_json=True)
    try:
        metas, sizes = [], []
        for k in range(index.num_valid):
            g = int(index.valid_at(k))
            metas.append(json.loads(index.meta(g) or b"{}"))
            sizes.append(image_size(index.image(g)) or (0, 0))
        return metas, np.asarray(sizes, np.int64).reshape(-1, 2), index.manifest.pack.get("category_ids")
    finally:
        index.close()


def to_original(boxes: np.ndarray, meta: dict, place: np.ndarray) -> np.ndarray:
    """xyxy ``boxes`` of one letterboxed val image (``place``: where its stored image is in the
    batch image) in the pixels its annotation was drawn on."""
    from stoker.pipeline.shards.boxes import orient_rows

    w, h = float(meta["width"]), float(meta["height"])  # the original image, upright
    shares = np.asarray(boxes, np.float64).reshape(-1, 4) / (place[2], place[3], place[2], place[3])
    orientation = int(meta.get("exif_orientation", 1))
    if meta.get("box_frame") == "raw" and orientation != 1:  # drawn on the file's own pixels: turned back
        rows = orient_rows(np.concatenate([shares, np.zeros((len(shares), 2))], axis=1), _UNDO[orientation])
        shares = rows[:, :4]
        if orientation in (5, 6, 7, 8):
            w, h = h, w
    return shares * (w, h, w, h)


def coco_results(preds: list[dict], metas: list[dict], places: np.ndarray, category_ids: list) -> list[dict]:
    """The COCO results of ``preds`` (per val image, in Loader order: ``boxes`` xyxy in the batch
    image's pixels, ``scores``, 0-based ``labels``)."""
    out = []
    for pred, meta, place in zip(preds, metas, places, strict=True):
        boxes = to_original(np.asarray(pred["boxes"], np.float64), meta, place)
        for (x0, y0, x1, y1), score, label in zip(
            boxes.tolist(), np.asarray(pred["scores"]).tolist(), np.asarray(pred["labels"]).tolist(), strict=True
        ):
            out.append(
                {
                    "image_id": meta["image_id"],
                    "category_id": category_ids[int(label)],
                    "bbox": [round(x0, 3), round(y0, 3), round(x1 - x0, 3), round(y1 - y0, 3)],
                    "score": round(float(score), 5),
                }
            )
    return out


def write_coco_results(path: str | Path, preds: list[dict], split: str, crop: Any, letterbox: bool) -> int:
    """Write the COCO results file of an evaluation's ``preds`` over ``split`` (read with the val
    ``crop``); returns the number of detections written.

    Raises:
        ArgumentError: the split holds no COCO ids (packed from YOLO or VOC), or was not read with
            the letterbox (a center crop cuts boxes away: no results in the original pixels).
    """
    from stoker.pipeline.augment import letterbox_places
    from stoker.pipeline.storage import is_url

    flag = arg("coco_results")
    if is_url(split):
        raise ArgumentError(f"{flag} reads a local split; {split} is a URL")
    if not letterbox:
        raise ArgumentError(f"{flag} needs the run's val images letterboxed (--val-fit letterbox), not center-cropped")
    metas, sizes, category_ids = sample_records(split)
    if not category_ids or any("image_id" not in m for m in metas):
        raise ArgumentError(
            f"{flag}: {split} holds no COCO image and category ids (it was not packed from a COCO JSON)"
        )
    if len(metas) != len(preds):
        raise ArgumentError(f"{flag}: {len(preds)} detections for the {len(metas)} images of {split}")
    results = coco_results(preds, metas, letterbox_places(sizes, crop), category_ids)
    Path(path).write_text(json.dumps(results))
    return len(results)


__all__ = ["coco_results", "sample_records", "to_original", "write_coco_results"]
