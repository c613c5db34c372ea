"""One shard of ``stoker index`` (:func:`index_one`): scan the tar, write its ``.idx``, and
check every sample the way the Loader will read it (image, target, decoding), keeping the
statistics of the targets that stay. A worker process or a Ray task runs it; its result is
JSON, which the run's journal keeps."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from stoker.errors import TarFormatError
from stoker.pipeline.fsutil import sha256_file
from stoker.pipeline.shards.idx import MAX_CLASSES, image_component, read_label, scan_tar, write_idx
from stoker.pipeline.shards.manifest import ShardInfo, idx_path
from stoker.pipeline.shards.targets import StatsAccumulator, Target

from .imagecheck import ImageChecker


def index_one(
    tar: str,
    check: bool,
    num_classes: int | None = None,
    target: dict | None = None,
    names: list | None = None,
    discover_width: bool = False,
) -> dict:
    """Write ``tar``'s .idx and return what the manifest needs, as JSON (a journal keeps it): its
    ShardInfo (``info``), the samples to skip as ``[index, reason]``, the members no sample holds
    as ``[name, reason]``, image extensions seen, the largest label kept (classes, multi-label),
    the float width (the first sample's, with ``target`` a float of no declared columns), whether
    any sample holds the target member, and the kept samples' target statistics (``stats``: a
    :class:`~stoker.pipeline.shards.targets.StatsAccumulator` state; float and mask targets).

    ``num_classes`` (known from ``--classes`` or the split's manifest) bounds the labels;
    without it a label only has to be below :data:`MAX_CLASSES`. ``names`` maps a ``cls`` that
    is a class name to its index. ``discover_width``: a float target's width is the first
    sample's (no columns were declared).
    """
    spec = Target.from_json(target) if target else Target()
    member_ext = spec.member.lower()
    tar_path = Path(tar)
    try:
        scan = scan_tar(tar_path)
    except TarFormatError as e:
        return {"error": str(e)}
    samples = scan.samples
    try:
        write_idx(idx_path(tar_path), samples)
    except OSError as e:
        return {"error": f"cannot write {idx_path(tar_path)}: {e.strerror or e}"}
    skips: dict[int, str] = dict(scan.problems)
    exts: set[str] = set()
    max_label, seen = -1, False
    width = None if discover_width else spec.width
    members: set[str] = set()
    index_of = {n: i for i, n in enumerate(names or ())}
    checker = ImageChecker(require_rgb=False) if check else None
    pending: list[tuple[int, bytes, Any]] = []
    acc: StatsAccumulator | None = None  # made once the width is known

    def keep(value) -> None:  # a sample that stays: its target counts in the statistics
        if acc is not None and value is not None:
            acc.add(value)

    def flush() -> None:
        for (i, _, value), err in zip(pending, checker.check([d for _, d, _ in pending]), strict=True):
            if err:
                skips[i] = f"image does not decode: {err}"
            else:
                keep(value)
        pending.clear()

    with open(tar_path, "rb") as f:
        for i, sample in enumerate(samples):
            comp = next((c for c in sample if c.ext.lower() == member_ext), None)
            seen = seen or comp is not None
            if len(members) < 16:
                members.update(c.ext for c in sample)
            if i in skips:
                continue
            img = image_component(sample)
            if img is None:
                skips[i] = f"no image: has {', '.join(c.ext for c in sample)[:80]}"
                continue
            if comp is None:
                skips[i] = "no cls label" if spec.kind == "class" else f"no {spec.member} target"
                continue
            value = _target_value(f, comp, img, spec, num_classes, index_of, width)
            if isinstance(value, str):
                skips[i] = value
                continue
            if spec.kind in ("float", "mask"):
                if acc is None:
                    width = width or (len(value) if spec.kind == "float" else 0)
                    acc = StatsAccumulator(spec.kind, width)
            elif spec.kind in ("class", "multilabel"):
                max_label = max(max_label, value)
                value = None
            exts.add(img.ext)
            if checker is None:
                keep(value)
            else:
                f.seek(img.offset)
                pending.append((i, f.read(img.size), value))
                if len(pending) >= checker.batch_size:
                    flush()
        if checker is not None:
            flush()
    # the largest label of a sample that stays (a decode skip does not define a class)
    info = ShardInfo(tar_path.name, len(samples), os.path.getsize(tar_path), sha256_file(tar_path))
    return {
        "info": dataclasses.asdict(info),
        "skips": [[i, why] for i, why in sorted(skips.items())],
        "ignored": [list(x) for x in scan.ignored],
        "exts": sorted(exts),
        "max_label": max_label,
        "width": width,
        "seen": seen,
        "members": sorted(members),
        "stats": acc.state() if acc is not None else None,
    }


def _target_value(f, comp, img, spec: Target, num_classes, index_of: dict, width):
    """A sample's target checked: the class (or the largest label), the float values, or a
    mask's values; a string says why it cannot be used."""
    from stoker.pipeline.shards.samples import image_size
    from stoker.pipeline.shards.targets import check_target, parse_float, parse_labels

    if spec.kind == "class":
        return read_label(f, comp, num_classes, names=index_of)  # a name: what --classes names
    if comp.size > 64 << 20:
        return f"{spec.member} is {comp.size:,} bytes: not a target"
    f.seek(comp.offset)
    raw = f.read(comp.size)
    if spec.kind == "float":  # without declared columns the first sample says how wide they are
        return parse_float(raw, spec.member, width)
    if spec.kind == "multilabel":
        labels = parse_labels(raw, spec.member, num_classes or MAX_CLASSES)
        return labels if isinstance(labels, str) else int(labels.max(initial=-1))
    f.seek(img.offset)
    why = check_target(spec, raw, num_classes=spec.num_classes or 0, image_wh=image_size(f.read(img.size)))
    if why or not spec.spatial:  # a kind of one's own: its check is the whole test
        return why or None
    return _mask_values(raw)


def _mask_values(raw: bytes):
    """A checked mask PNG's values (what its statistics count)."""
    import io

    import numpy as np
    from PIL import Image

    with Image.open(io.BytesIO(raw)) as im:
        return np.asarray(im)


__all__ = ["index_one"]
