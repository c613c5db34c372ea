"""Pack an image folder (or a CSV/TSV of path,target) into WebDataset tar shards.

SRC is an ImageFolder tree (one subfolder per class, class index = sorted folder
name), a tree with train/ and val/ subtrees, or a CSV/TSV of path,label rows (paths
relative to the CSV's folder; integer labels are kept as they are and must be in
0..1,000,000; otherwise labels are class names). OUT gets train/ (and val/): shards
train-000000.tar with one DALI .idx each and a stoker.json manifest, plus
rejects.jsonl listing every input that was not packed, with the reason.

Targets other than a class: a CSV whose label cells are numbers, at least one not an
integer, holds float targets (regression); several columns (path,x,y,z) are a vector
of floats; cells like cat|dog are multi-label. --targets forces a reading. The summary
always says which (targets: float, 1 column). Segmentation: --masks MASKS, a tree
parallel to SRC (same relative path and stem, usually .png; train/ and val/ on both
sides when SRC has them); mask pixels are class indices (palette indices, or L/I;16
values), 255 means ignore; image and mask get the same resize (the mask nearest).

Symlinks are followed, but each real folder and file is packed once, and a link that
loops back up or into another class's folder is not followed (listed as a reject), so
no image lands under another class's label. Only regular files up to --max-file-size
are read. A JPEG is copied byte for byte only when every decoder of the Loader reads it
identically (baseline, 8-bit, one scan, nothing after the end marker), is RGB or
grayscale, upright and within the size limits; every other image is decoded, turned
upright and RGB (a one-channel image stays grayscale), resized down and re-encoded, so
every stored sample decodes in DALI and Pillow.

The run is deterministic (same SRC and --seed: byte-identical shards), parallel,
and resumable: after a crash, a kill or a full disk, rerun the same command. A rerun
also restores shards deleted or truncated since, and manifests another tool rewrote.
With --part I/N, N machines pack disjoint slices into one OUT; then
`stoker pack --merge OUT`.

OUT may be a URL (s3://bucket/ds, gs://..., file://...; credentials and endpoint
from the usual AWS_* variables or --storage-option): shards are built in a local
staging folder, each uploaded as soon as it is finished, and the stoker.json
manifests go last, so a reader never sees a manifest before its shards. The
journal stays in the staging folder: rerun the same command after a crash or a
kill and it goes on where it stopped. With --engine ray the image work runs as
Ray tasks on a cluster (--ray-address) or on this machine; the output is the same.

examples:
  stoker pack ~/data/imagenet /fast/imagenet-shards
  stoker pack photos/ out/ --val-fraction 0.1 --short-side 0 --max-side 512
  stoker pack labels.csv out/ --part 3/8   # on 8 machines, then: stoker pack --merge out/
  stoker pack ages.csv out/ --targets float --val-fraction 0.1
  stoker pack images/ out/ --masks masks/ --num-classes 21 --val-fraction 0.1
  stoker pack ~/data/imagenet s3://bucket/imagenet --engine ray --ray-address auto
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from stoker.errors import InputsRejectedError, UsageError, arg
from stoker.pipeline.shards.targets import IGNORE_INDEX
from stoker.pipeline.storage import parse_storage_options

from ..common.units import parse_part, parse_size
from .api import merge_parts, pack
from .options import Images, Masks, Ray, Reading, Shards
from .result import PackResult
from .sanitize import MAX_BYTES, PIL_MAX_PIXELS
from .sources import MAX_LABEL
from .sources.csvlist import TARGET_MODES

HELP = "pack an image folder, CSV or parquet table into WebDataset shards + DALI .idx + stoker.json"
#: what Ctrl-C's line adds: the journal keeps every finished shard
ON_INTERRUPT = "rerun the same command to resume"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "src",
        nargs="?",
        metavar="SRC",
        help="image folder, train/+val/ tree, CSV/TSV of path,label (integer labels must be in "
        f"0..{MAX_LABEL:,}; other rows are rejected) or of image,mask pairs, or a parquet table (file, folder "
        "or URL; pip install stoker[parquet])",
    )
    p.add_argument(
        "out",
        nargs="?",
        metavar="OUT",
        help="output folder (created), or a URL: s3://bucket/ds, gs://..., any fsspec URL",
    )
    _image_flags(p)
    _target_flags(p)
    _source_flags(p)
    _shard_flags(p)
    _running_flags(p)
    _storage_flags(p)


def _image_flags(p: argparse.ArgumentParser) -> None:
    """The images: their size, quality, re-encoding and the limits an input must keep."""
    g = p.add_argument_group("images")
    g.add_argument(
        "--short-side",
        type=int,
        default=None,
        metavar="PX",
        help="resize down so the shorter side is at most PX (0: keep the size; default 256, or 0 with --masks)",
    )
    g.add_argument(
        "--max-side",
        type=int,
        default=0,
        metavar="PX",
        help="resize down so the longer side is at most PX (default: no limit)",
    )
    g.add_argument("--quality", type=int, default=90, help="JPEG quality of re-encoded images (default 90)")
    g.add_argument(
        "--reencode",
        action="store_true",
        help="re-encode every image, even baseline RGB JPEGs that could be copied as they are",
    )
    g.add_argument(
        "--max-pixels",
        type=int,
        default=PIL_MAX_PIXELS,
        metavar="N",
        help=f"reject images larger than N pixels, before decoding (default {PIL_MAX_PIXELS:,})",
    )
    g.add_argument(
        "--max-file-size",
        default=f"{MAX_BYTES // 1024**2}MiB",
        metavar="SIZE",
        help=f"reject input files larger than SIZE, before reading them (default {MAX_BYTES // 1024**2}MiB)",
    )


def _target_flags(p: argparse.ArgumentParser) -> None:
    """The targets: the label kind, masks, parquet columns and classes."""
    g = p.add_argument_group("targets")
    g.add_argument(
        "--targets",
        choices=TARGET_MODES,
        default="auto",
        help="what a CSV's target columns hold: auto (decided from the cells; the summary says which), class, "
        "float (regression; several columns: a vector), multilabel (cells like cat|dog); default auto",
    )
    g.add_argument(
        "--masks",
        metavar="MASKS",
        help="segmentation: a mask tree parallel to SRC (same relative paths and stems, usually .png)",
    )
    g.add_argument(
        "--image-column",
        metavar="NAME",
        help="a parquet SRC's image column (default: its one image column)",
    )
    g.add_argument(
        "--target-column",
        metavar="NAME[,NAME...]",
        help="a parquet SRC's target column: a class, float, list or mask column; several names: a vector "
        "of floats (default: a second image column as the mask, else the label-named or only other column)",
    )
    g.add_argument(
        "--weight-column",
        metavar="NAME",
        help="a CSV SRC's column of per-sample sampling weights (numbers >= 0; a header names it), stored "
        "with each sample and drawn exactly by Loader(balance='weights') / stoker train --balance weights",
    )
    g.add_argument(
        "--num-classes",
        type=int,
        default=None,
        metavar="N",
        help="with --masks: reject masks with a value >= N (other than --ignore-index); default: not checked",
    )
    g.add_argument(
        "--ignore-index",
        type=int,
        default=IGNORE_INDEX,
        metavar="V",
        help=f"with --masks: the mask value no loss counts (default {IGNORE_INDEX})",
    )


def _source_flags(p: argparse.ArgumentParser) -> None:
    """Which pack source reads SRC, and the lists that split it."""
    g = p.add_argument_group("source")
    g.add_argument(
        "--source",
        default="auto",
        metavar="NAME",
        help="the reader of SRC: folder, train-val, csv, pairs, mask-tree, parquet, coco, yolo, voc, or one "
        "registered by a plugin (default auto: recognized from SRC)",
    )
    g.add_argument(
        "--box-frame",
        default="auto",
        choices=("auto", "raw", "upright"),
        help="boxes of an EXIF-rotated image whose annotated size fits both frames: drawn on the file's raw "
        "pixels or on its upright ones (default auto: upright; a size that fits one frame decides)",
    )
    g.add_argument(
        "--train-list",
        metavar="FILE",
        help="the official train split: a file naming one image a line (relative path, with or without "
        "its extension, or file stem: Pascal VOC's ImageSets/Segmentation/train.txt); unlisted images are skipped",
    )
    g.add_argument(
        "--val-list",
        metavar="FILE",
        help="the official val split, named the same way (without --train-list, the other images are train)",
    )


def _shard_flags(p: argparse.ArgumentParser) -> None:
    """The shards: their size, the shuffle seed and the val split."""
    g = p.add_argument_group("shards")
    g.add_argument(
        "--shard-size",
        default="256MB",
        metavar="SIZE",
        help="start a new shard before one would exceed SIZE (256MB, 1GB, bytes; default 256MB)",
    )
    g.add_argument(
        "--samples-per-shard",
        type=int,
        default=0,
        metavar="N",
        help="exactly N samples per shard (overrides --shard-size)",
    )
    g.add_argument("--seed", type=int, default=0, help="seed of the sample shuffle and val split (default 0)")
    g.add_argument(
        "--val-fraction",
        type=float,
        default=0.0,
        metavar="F",
        help="put a seeded fraction F of the images into val/, stratified by class (when SRC has no "
        "val/ folder); classes too small to give one are filled from the others",
    )


def _running_flags(p: argparse.ArgumentParser) -> None:
    """How the pack runs: workers, engines, parts and merging, strictness, output."""
    g = p.add_argument_group("running")
    g.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 1,
        help=f"worker processes (default: all cores, {os.cpu_count()})",
    )
    g.add_argument("--part", metavar="I/N", help="pack only part I of N of the shuffled list (0-based)")
    g.add_argument("--merge", metavar="OUT", help="write the manifests of OUT once all its --part runs finished")
    g.add_argument(
        "--engine",
        choices=("local", "ray"),
        default="local",
        help="local: a process pool on this machine (default); ray: Ray tasks (pip install stoker[ray]) "
        "on --ray-address, or on a local Ray with --workers CPUs; the output is the same",
    )
    g.add_argument(
        "--ray-address",
        metavar="ADDR",
        help="the Ray cluster to run on (auto, ray://head:10001; default: a local Ray on this machine)",
    )
    g.add_argument("--strict", action="store_true", help="exit 1 when any input was rejected")
    g.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    g.add_argument("--json", action="store_true", help="print the result as JSON (PackResult.to_dict())")


def _storage_flags(p: argparse.ArgumentParser) -> None:
    """Object storage: OUT or SRC is a URL."""
    g = p.add_argument_group("object storage (OUT or SRC is a URL)")
    g.add_argument(
        "--storage-option",
        action="append",
        default=None,
        metavar="K=V",
        help="an fsspec storage option, repeatable (endpoint_url=http://host:9000, anon=true, "
        "config_kwargs.read_timeout=30)",
    )
    g.add_argument(
        "--staging",
        metavar="DIR",
        help="local folder for the journal and the shards on their way up (default: "
        "~/.cache/stoker/pack-staging/<hash of OUT>); needs room for about two shards",
    )


def main(args: argparse.Namespace) -> int:
    try:
        if args.merge:
            if args.src or args.out:
                raise UsageError("--merge OUT takes no SRC/OUT arguments")
            result = merge_parts(args.merge, strict=args.strict)
        else:
            if not args.src or not args.out:
                raise UsageError("need SRC and OUT (or --merge OUT)")
            result = pack(args.src, args.out, **_pack_settings(args), progress=not args.quiet)
    except InputsRejectedError as e:  # the pack is done: its summary, then the error
        _print(e.result, args.json)
        raise
    _print(result, args.json)
    return 0


def _pack_settings(args: argparse.Namespace) -> dict:
    """:func:`pack`'s settings from the flags, each flag the group field of its name (docs/pack.md)."""
    part = parse_part(args.part)
    if args.ray_address and args.engine != "ray":
        raise UsageError(f"{arg('ray_address')} needs {arg('engine', 'ray')}")
    return dict(
        val_fraction=args.val_fraction,
        seed=args.seed,
        masks=Masks(args.masks, num_classes=args.num_classes, ignore_index=args.ignore_index),
        reading=Reading(
            source=args.source,
            targets=args.targets,
            image_column=args.image_column,
            target_column=args.target_column,
            weight_column=args.weight_column,
            train_list=args.train_list,
            val_list=args.val_list,
            box_frame=args.box_frame,
        ),
        images=Images(
            short_side=args.short_side,
            max_side=args.max_side,
            quality=args.quality,
            reencode=args.reencode,
            max_pixels=args.max_pixels,
            max_file_size=parse_size(args.max_file_size, "--max-file-size"),
        ),
        shards=Shards(size=parse_size(args.shard_size), samples=args.samples_per_shard),
        workers=args.workers,
        engine=Ray(args.ray_address) if args.engine == "ray" else args.engine,
        part=part,
        strict=args.strict,
        storage_options=parse_storage_options(args.storage_option),
        staging=args.staging,
    )


def _print(result: PackResult, as_json: bool = False) -> None:
    for line in result.notes():
        print(line, file=sys.stderr)
    print(json.dumps(result.to_dict(), indent=1) if as_json else result.summary())
