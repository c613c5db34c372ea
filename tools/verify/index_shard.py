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
from stoker.pipeline.shards.idx import image_component, scan_tar, write_idx
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
    :class:`~stoker.pipeline.shards.targets.StatsAccumulator` state, when the kind keeps them).

    ``num_classes`` (known from ``--classes`` or the split's manifest) bounds the labels;
    without it a label only has to be below :data:`~stoker.pipeline.shards.idx.MAX_CLASSES`.
    ``names`` maps a ``cls`` that is a class name to its index. ``discover_width``: a float target's width is the first
    sample's (no columns were declared). Each sample's target is checked by its kind
    (:meth:`~stoker.pipeline.shards.kinds.Target.index_value`).
    """
    spec = Target.from_json(target) if target else Target()
    tar_path = Path(tar)
    try:
        scan = scan_tar(tar_path)
    except TarFormatError as e:
        return {"error": str(e)}
    try:
        write_idx(idx_path(tar_path), scan.samples)
    except OSError as e:
        return {"error": f"cannot write {idx_path(tar_path)}: {e.strerror or e}"}
    state = _ShardState(spec, num_classes, {n: i for i, n in enumerate(names or ())}, scan.problems, discover_width)
    checker = ImageChecker(require_rgb=False) if check else None
    with open(tar_path, "rb") as f:
        state.scan(f, scan.samples, checker)
    info = ShardInfo(tar_path.name, len(scan.samples), os.path.getsize(tar_path), sha256_file(tar_path))
    return {
        "info": dataclasses.asdict(info),
        "skips": [[i, why] for i, why in sorted(state.skips.items())],
        "ignored": [list(x) for x in scan.ignored],
        "exts": sorted(state.exts),
        "max_label": state.max_label,
        "width": state.width,
        "seen": state.seen,
        "members": sorted(state.members),
        "stats": state.acc.state() if state.acc is not None else None,
    }


class _ShardState:
    """What :func:`index_one` gathers of one shard's samples: the skips and why, the largest label
    and the statistics of the samples that stay (a decode skip does not define a class)."""

    def __init__(self, spec: Target, num_classes, index_of: dict, problems: dict, discover_width: bool):
        self.spec, self.num_classes, self.index_of = spec, num_classes, index_of
        self.skips: dict[int, str] = dict(problems)
        self.exts: set[str] = set()
        self.members: set[str] = set()
        self.max_label, self.seen = -1, False
        self.width = None if discover_width else spec.width
        self.acc: StatsAccumulator | None = None  # made once the width is known
        self.pending: list[tuple[int, bytes, Any]] = []

    def scan(self, f, samples: list, checker: ImageChecker | None) -> None:
        member_ext = self.spec.member.lower()
        for i, sample in enumerate(samples):
            comp = next((c for c in sample if c.ext.lower() == member_ext), None)
            self.seen = self.seen or comp is not None
            if len(self.members) < 16:
                self.members.update(c.ext for c in sample)
            if i in self.skips:
                continue
            img = image_component(sample)
            if img is None:
                self.skips[i] = f"no image: has {', '.join(c.ext for c in sample)[:80]}"
                continue
            if comp is None:
                self.skips[i] = self.spec.missing()
                continue
            value = self._target_value(f, comp, img)
            if isinstance(value, str):
                self.skips[i] = value
                continue
            value = self._counted(value)
            self.exts.add(img.ext)
            if checker is None:
                self._keep(value)
            else:
                f.seek(img.offset)
                self.pending.append((i, f.read(img.size), value))
                if len(self.pending) >= checker.batch_size:
                    self._flush(checker)
        if checker is not None:
            self._flush(checker)

    def _target_value(self, f, comp, img):
        """A sample's target as its kind checks it (a string says why it cannot be used)."""
        from stoker.pipeline.shards.samples import image_size

        spec = self.spec
        if comp.size > spec.max_bytes:
            return spec.oversize(comp.size)
        f.seek(comp.offset)
        raw = f.read(comp.size)
        wh = None
        if spec.sized:
            f.seek(img.offset)
            wh = image_size(f.read(img.size))
        return spec.index_value(raw, num_classes=self.num_classes, names=self.index_of, width=self.width, image_wh=wh)

    def _counted(self, value):
        """``value`` as the statistics count it: a named class is a label (its largest is kept),
        the first value of a kind that keeps statistics says their width."""
        if self.spec.named_classes:
            self.max_label = max(self.max_label, value)
            return None
        if value is not None and self.acc is None:
            self.width = self.width or self.spec.width_of(value)
            self.acc = self.spec.resized(self.width).accumulator()
        return value

    def _keep(self, value) -> None:  # a sample that stays: its target counts in the statistics
        if self.acc is not None and value is not None:
            self.acc.add(value)

    def _flush(self, checker: ImageChecker) -> None:
        pending = self.pending
        for (i, _, value), err in zip(pending, checker.check([d for _, d, _ in pending]), strict=True):
            if err:
                self.skips[i] = f"image does not decode: {err}"
            else:
                self._keep(value)
        pending.clear()


__all__ = ["index_one"]
