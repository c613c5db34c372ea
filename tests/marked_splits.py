"""Splits of every target kind whose pixels carry their targets (``from marked_splits import ...``).

Each image is one solid colour: red and green hold the sample's number in the whole run of splits
(``uid = red + 256 * green``), blue a code of its target. A crop, a flip, a resize or a letterbox
of a solid image keeps the colour at the output's centre, so a test reads, from a batch alone,
which sample each row is and whether its target is that sample's (:func:`check_batch`). A mask is
one class all over (the mask's value and the image's blue agree); a sample's boxes are one box
over the whole picture (its class in the blue).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image

from stoker.pipeline.shards.boxes import encode_boxes
from stoker.pipeline.shards.kinds import Target, encode_float, encode_labels
from stoker.pipeline.shards.manifest import Manifest
from stoker.pipeline.shards.table import write_split_table
from stoker.pipeline.shards.writer import ShardWriter
from stoker.tools.common.synth import encode

KINDS = ("class", "multilabel", "float", "mask", "boxes")
CLASSES = ("ant", "bee", "cat")
#: blue of class c (apart enough that a resize's rounding never reads one as another)
STEP = 60


def target_of(kind: str, uid: int) -> object:
    """The target sample ``uid`` of a ``kind`` split carries."""
    c = uid % len(CLASSES)
    if kind == "multilabel":
        return [k for k in range(len(CLASSES)) if (uid + 1) >> k & 1]  # 1..7 as bits; uid % 7 == 6 none
    if kind == "float":
        return [float(uid % 4)]
    return c


def blue_of(kind: str, target: object) -> int:
    """The blue a target is painted as."""
    if kind == "multilabel":
        return 30 * sum(1 << k for k in target)  # 0 .. 210
    if kind == "float":
        return STEP * int(target[0])
    return STEP * int(target)


def write_marked(
    split: Path, kind: str, *, n: int, first_uid: int = 0, per_shard: int = 8, classes=CLASSES, side: int = 40
) -> Path:
    """A ``kind`` split of ``n`` solid PNG pictures (sides ``side`` to ``side + 24``), samples
    ``first_uid ..``, its table written with the images' sizes (as pack writes it); returns ``split``."""
    split.mkdir(parents=True, exist_ok=True)
    shards = []
    target = {
        "float": Target.of("float", columns=("y",)),
        "mask": Target.of("mask", num_classes=len(classes)),
    }.get(kind) or Target.of(kind)
    for start in range(0, n, per_shard):
        with ShardWriter(split / f"shard-{start // per_shard:06d}.tar") as w:
            for i in range(start, min(n, start + per_shard)):
                uid = first_uid + i
                t = target_of(kind, uid)
                wh = (side + 2 * (uid % 13), side + 2 * ((uid * 7) % 13))  # aspects 0.6 to 1.6: buckets differ
                pixel = (uid % 256, uid // 256, blue_of(kind, t))
                png = encode(Image.new("RGB", wh, pixel), "PNG")
                members = {"png": png, "json": json.dumps({"width": wh[0], "height": wh[1]}).encode()}
                if kind == "class":
                    members["cls"] = str(t).encode()
                elif kind == "multilabel":
                    members["labels.npy"] = encode_labels(t)
                elif kind == "float":
                    members["target.npy"] = encode_float(t)
                elif kind == "mask":
                    members["mask.png"] = encode(Image.new("L", wh, t), "PNG")
                else:
                    members["boxes.npy"] = encode_boxes([(0, 0, wh[0], wh[1], t, 0)])
                w.write(f"{uid:09d}", members)
        shards.append(w.info)
    Manifest(num_samples=n, classes=list(classes), shards=shards, target=target).save(split)
    write_split_table(split)
    return split


def uids_of(images) -> np.ndarray:
    """The samples of a batch of images ``[N, 3, H, W]`` (uint8), read at each one's centre."""
    x = images.cpu().numpy()
    h, w = x.shape[2] // 2, x.shape[3] // 2
    return x[:, 0, h, w].astype(np.int64) + 256 * x[:, 1, h, w].astype(np.int64)


def check_batch(kind: str, images, targets) -> np.ndarray:
    """Assert each row's target is the one its pixels carry (after its crop, flip and resize);
    return the batch's samples (:func:`uids_of`)."""
    x = images.cpu().numpy()
    h, w = x.shape[2] // 2, x.shape[3] // 2
    uids, blue = uids_of(images), x[:, 2, h, w].astype(np.int64)
    for k, uid in enumerate(uids.tolist()):
        want = target_of(kind, uid)
        assert abs(int(blue[k]) - blue_of(kind, want)) <= 2, (kind, uid, blue[k], want)
        if kind == "class":
            assert int(targets[k]) == want
        elif kind == "multilabel":
            assert np.flatnonzero(targets[k].cpu().numpy()).tolist() == want
        elif kind == "float":
            assert float(targets[k].reshape(-1)[0]) == want[0]
        elif kind == "mask":
            m = targets[k].cpu().numpy()
            assert int(m[h, w]) == want and set(np.unique(m).tolist()) <= {want, 255}, (uid, np.unique(m))
        else:
            assert int(targets.counts[k]) == 1 and int(targets.labels[k, 0]) == want
    return uids
