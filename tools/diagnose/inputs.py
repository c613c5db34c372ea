"""What ``stoker diagnose`` measures, made from what the user names: DATA, ``--model``/``--arch``.

Turns a path into ``("shards", split)`` or ``("imagefolder", root)``, a ``MODULE:FACTORY`` spec
into an ``nn.Module`` (one-line :class:`UsageError` for every way that can fail), and settings
into stoker Loaders; reads loader-side hints from a split's manifest; packs a sample of an
ImageFolder so stoker can be measured on it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from stoker.errors import UsageError, arg

from ..pack.sanitize import IMAGE_EXTS


def _is_image_folder(root: Path) -> bool:
    for sub in sorted(root.iterdir()):
        if sub.is_dir():
            for f in sub.iterdir():
                if f.suffix.lower() in IMAGE_EXTS:
                    return True
    return False


def resolve_data(path: str, storage_options: dict | None = None) -> tuple[str, Path]:
    """``("shards", split_dir)`` or ``("imagefolder", root)``; UsageError otherwise. A URL is
    fetched whole into the shard cache first (its split, or its ``train/``)."""
    from stoker.errors import ManifestError
    from stoker.pipeline.cache import local_copy, read_manifest
    from stoker.pipeline.shards.manifest import MANIFEST_NAME
    from stoker.pipeline.shards.paths import check_path
    from stoker.pipeline.storage import is_url

    if is_url(path):
        url = str(path).rstrip("/")
        try:
            read_manifest(url, storage_options)
        except ManifestError:
            url += "/train"
        return "shards", local_copy(url, storage_options)
    root = Path(path).expanduser()
    check_path(root, "any")  # missing, or an unfinished pack: the line every command gives
    if root.is_file() and root.suffix.lower() in LIST_SUFFIXES:
        raise UsageError(
            f"DATA {path} is a list of images and their targets, not packed shards: pack it first, "
            f"`stoker pack {path} OUT`, then `stoker diagnose OUT`"
        )
    if not root.is_dir():
        raise UsageError(f"DATA {path} is not a folder")
    if (root / MANIFEST_NAME).is_file():
        return "shards", root
    if (root / "train" / MANIFEST_NAME).is_file():
        return "shards", root / "train"
    lists = sorted(p.name for p in root.iterdir() if p.is_file() and p.suffix.lower() in LIST_SUFFIXES)
    if lists and _class_folders(root) < 2:  # photos in a folder and a CSV of their targets: pack the CSV
        raise UsageError(
            f"DATA {path} holds {lists[0]}, not packed shards: pack it first, "
            f"`stoker pack {root / lists[0]} OUT`, then `stoker diagnose OUT`"
        )
    if _is_image_folder(root):
        return "imagefolder", root
    if (root / "train").is_dir() and _is_image_folder(root / "train"):
        return "imagefolder", root / "train"
    if _has_images(root):
        raise UsageError(
            f"DATA {path} holds images but no class folders or shards: pack them first with their targets, "
            "a CSV of path,target (`stoker pack LIST.csv OUT`), then `stoker diagnose OUT`"
        )
    raise UsageError(
        f"DATA {path} is neither stoker shards (no {MANIFEST_NAME} in it or in train/) "
        "nor an ImageFolder (class subfolders of images)"
    )


#: files `stoker pack` reads as a list of images and targets
LIST_SUFFIXES = (".csv", ".tsv", ".txt", ".parquet")


def _class_folders(root: Path) -> int:
    """Subfolders of ``root`` holding images (counted up to 2: is it a classification tree?)."""
    n = 0
    for sub in sorted(root.iterdir()):
        if sub.is_dir() and _has_images(sub):
            n += 1
            if n == 2:
                break
    return n


def _has_images(root: Path) -> bool:
    for k, f in enumerate(root.iterdir()):
        if k >= 2000:
            break
        if f.suffix.lower() in IMAGE_EXTS:
            return True
    return False


def pack_source(data: str | Path, path: Path) -> Path:
    """What to give ``stoker pack`` for ImageFolder ``path`` that :func:`resolve_data` found in
    DATA: the tree itself when DATA holds ``train/`` (and ``val/``), which pack splits into train
    and val, else the ImageFolder."""
    root = Path(data).expanduser()
    return root if path == root / "train" else path


def resolve_device(requested: str | None) -> str:
    """``--device`` (None: cuda when available) as a device string; UsageError when it cannot be had."""
    from stoker.model.train import resolve_device as resolve

    try:
        return str(resolve(requested or "auto"))
    except ValueError as e:
        raise UsageError(f"{arg('device')}: {e}") from None


def backend_choice(requested: str, device: str, decoder: str = "auto") -> dict:
    """Which Loader backend this setup uses for ``requested`` on ``device``, and why: the
    Loader's own choice (:func:`stoker.pipeline.backends.resolve_backend`, with the Loader's
    ``decoder``); a backend that cannot run here is a :class:`UsageError` naming the fix."""
    from stoker.pipeline.backends import resolve_backend

    try:
        backend, why = resolve_backend(requested, device, decoder=decoder)
    except ValueError as e:
        raise UsageError(f"{arg('backend')}: {e}") from None
    return {"name": backend.name, "why": why if requested == "auto" else f"--backend {requested}"}


def pack_sample(root: Path, n: int, tmp: Path) -> Path:
    """Pack ``n`` random images of ImageFolder ``root`` (symlinked into ``tmp``) with the
    default settings; return the packed split folder."""
    from ..bench.packing import link_image_folder
    from ..pack import pack

    src = tmp / "src"
    link_image_folder(root, src, n)
    print(pack(src, tmp / "out").summary(), file=sys.stderr)  # stdout carries the report (--json) alone
    return tmp / "out" / "train"


def count_data(kind: str, path: Path) -> tuple[int, int, Any]:
    """``(classes, samples, task)`` of shards (from the manifest) or an ImageFolder (by listing
    it). ``task`` (:class:`stoker.model.train.tasks.Task`) is what ``stoker train --task auto``
    trains on the split's targets (a float, multi-label or mask split); ``None`` for classes.

    Raises:
        UsageError: a split whose targets no task can train as they are (masks without a class count).
    """
    if kind == "shards":
        from stoker.model.train.tasks import resolve_task
        from stoker.pipeline.shards.manifest import Manifest

        manifest = Manifest.load(path)
        task = None
        if manifest.target.task != "classify":  # a class split trains on its classes, no task
            try:
                task = resolve_task("auto", manifest.target, manifest.classes)
            except ValueError as e:  # masks without a class count: only a repack can say it
                raise UsageError(f"{path}: {str(e).split(': pass')[0]}; repack with {arg('num_classes')} N") from None
        outputs = task.num_outputs if task is not None else len(manifest.classes)
        return outputs, manifest.num_samples, task
    from torchvision.datasets.folder import find_classes

    num_classes = len(find_classes(str(path))[0])
    count = sum(1 for c in path.iterdir() if c.is_dir() for f in c.iterdir() if f.suffix.lower() in IMAGE_EXTS)
    return num_classes, count, None


def loader_hints(manifest, crop) -> list:
    """Estimated loader-side steps read from the shards' manifest (pack settings)."""
    pack = manifest.pack or {}
    if "short_side" not in pack:  # not made by `stoker pack`: sizes unknown
        return []
    return _pack_hints(pack, crop)


# a center crop showing less than this share of the images' pixels on average: buckets are named
BUCKET_HINT_BELOW = 0.6


def bucket_hint(split, crop) -> str | None:
    """The report's ``buckets`` line, where a square crop shows little of images of many shapes:
    the buckets ``--buckets auto`` would use, with the share of each image's pixels the val
    transform shows either way (``None`` elsewhere, or where the table records no sizes)."""
    import numpy as np

    from stoker.pipeline.augment import CropSpec
    from stoker.pipeline.bucketing import shown_share
    from stoker.pipeline.order.buckets import auto_buckets
    from stoker.pipeline.shards.samples import open_split

    try:
        index = open_split(split)
    except Exception:  # a URL's split or an unreadable one: the loader rows say what is wrong
        return None
    if not index.has_sizes:
        return None
    rows = index.valid_at(np.unique(np.linspace(0, index.num_valid - 1, min(index.num_valid, 20_000)).astype(np.int64)))
    wh = index.stored_sizes(rows)
    crops = CropSpec.of(crop)
    square = shown_share(wh, crops)
    buckets = auto_buckets(wh, crops.size, min_count=1)
    bucketed = shown_share(wh, crops, buckets)
    if square >= BUCKET_HINT_BELOW or bucketed <= square * 1.1:
        return None
    names = ", ".join(f"{h}x{w}" for h, w in buckets.shapes)
    return (
        f"the val crop at {crop} shows {square:.0%} of each image's pixels on average; with "
        f"--buckets auto ({names}, height x width) it shows {bucketed:.0%} (stoker train --buckets auto, "
        "for a network that takes any input size)"
    )


def _pack_hints(pack: dict, crop) -> list:
    from stoker.pipeline.augment.crops import VAL_CROP_FRACTION

    target = round((crop if isinstance(crop, int) else min(crop)) / VAL_CROP_FRACTION)  # a val resize's need
    side = pack.get("short_side") or (round(0.75 * pack["max_side"]) if pack.get("max_side") else 0)
    if side and side <= 1.5 * target:
        return []
    # Decode time grows with the stored pixels: ImageNet originals (median 500x375) repacked to
    # short side 256 measured 1.6x faster for ~2.1x fewer pixels on this project's 2-core machine;
    # assume the same law.
    pixels = (side / target) ** 2 if side else 2.1
    src = pack.get("source", "SRC")
    return [
        {
            "id": "pack_smaller",
            "title": f"Repack with --short-side {target}",
            "action": f"stoker pack {src} OUT --short-side {target}",
            "est_loader_speedup": min(pixels**0.65, 4.0),
            "basis": f"stored short side {side or 'original size'} vs {target} for crop {crop}: "
            f"~{pixels:.1f}x the pixels to decode; 2.1x fewer pixels gave 1.6x on ImageNet",
        }
    ]


def build_net(arch: str, model, num_classes: int, crop, task=None):
    """The network to measure: ``model`` (an ``nn.Module``, or a ``MODULE:FACTORY`` spec), else
    stoker's or torchvision's ``arch`` (``"report"``: the report's network, one regressed output),
    with ``num_classes`` outputs, per pixel when ``task`` segments."""
    if model is not None and not isinstance(model, str):
        return model
    if model:
        from stoker.model.user import build_user_model

        return build_user_model(model, num_classes)
    from stoker.model.nets import build_model

    try:
        side = crop if isinstance(crop, int) else min(crop)
        if arch == "report":  # as in the report: one regressed output, Linear sized by the crop
            return build_model("report", 1, image_size=side)
        return build_model(arch, num_classes, image_size=side, task=task.name if task is not None else "classify")
    except ValueError as e:
        raise UsageError(f"{arg('arch')}: {e}") from None


def stoker_loader(split: Path, **kw):
    """stoker's Loader on ``split`` (a bad setting is the Loader's ArgumentError: one line, exit 2)."""
    from stoker.pipeline import Loader

    return Loader(str(split), **kw)


def describe_loader(loader) -> dict:
    """The settings of a stoker Loader, as strings, for the report."""
    out = {}
    for k in ("backend", "decode", "threads", "batch_size", "crop", "device"):
        v = getattr(loader, k, None)
        if v is not None:
            out[k] = str(v)
    store = getattr(loader, "pixel_store", None)
    if store is not None:  # the decoded-pixel tier: how much of the split it holds
        st = store.stats()
        out["pixel_cache"] = f"{st['dir']} ({st['filled']:,} of {st['samples']:,} samples decoded)"
    return out
