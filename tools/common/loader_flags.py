"""The Loader's flags, declared once for every command that builds a Loader.

``stoker train``, ``stoker diagnose`` and ``stoker bench`` take the same crop recipe (``--crop PX``
or ``--crop H,W``, ``--scale``, ``--ratio``, ``--crop-pct``, ``--val-resize``, and detection's
``--train-fit``, ``--jitter``, ``--val-fit``), the same decode
choices (``--backend`` from the backend registry, ``--decode``, ``--decoder``, ``--threads``), the
decoded-pixel tier (``--pixel-cache``, ``--pixel-cache-budget``) and, where they read object
storage, the same storage and order flags. :func:`crop_spec` carries the
recipe whole (a :class:`~stoker.pipeline.augment.CropSpec`, what ``Loader(crop=)`` takes) and
:func:`loader_options` the rest, so a flag's meaning and its check are written here only.
No torch import: ``--help`` stays instant.
"""

from __future__ import annotations

import argparse
from typing import Any

from stoker.pipeline.fits import JITTER, TRAIN_FITS, VAL_FITS  # torch-free

#: the random resized crop's defaults (torchvision's RandomResizedCrop)
SCALE = (0.08, 1.0)
RATIO = (3 / 4, 4 / 3)


def floats(text: str) -> tuple[float, ...]:
    """``"0.08,1"`` -> ``(0.08, 1.0)`` (an argparse type)."""
    try:
        return tuple(float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers") from None


def pair(text: str) -> tuple[float, float]:
    """``"0.1,2"`` or ``"0.1:2"`` -> ``(0.1, 2.0)`` (an argparse type)."""
    values = floats(text.replace(":", ","))
    if len(values) != 2:
        raise argparse.ArgumentTypeError(f"{text!r} is not LO,HI (two numbers)")
    return values


def crop(text: str) -> int | tuple[int, int]:
    """``"224"`` -> 224, ``"192,256"`` -> ``(192, 256)`` (height, width; an argparse type)."""
    try:
        sides = [int(v) for v in text.replace("x", ",").split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a side or height,width in pixels") from None
    if len(sides) not in (1, 2):
        raise argparse.ArgumentTypeError(f"{text!r} is not a side or height,width in pixels")
    return sides[0] if len(sides) == 1 else (sides[0], sides[1])


def add_crop_flags(p: argparse.ArgumentParser, *, default: int | None = 224, recipe: bool = True) -> None:
    """``--crop`` (and with ``recipe`` the train crop's ``--scale``/``--ratio``, the val resize's
    ``--crop-pct``/``--val-resize``, and which train crop and val transform: ``--train-fit``,
    ``--jitter``, ``--val-fit``)."""
    p.add_argument(
        "--crop",
        type=crop,
        default=default,
        metavar="PX|H,W",
        help="the crop the Loader yields: a side, or height,width (default: %(default)s)",
    )
    if not recipe:
        return
    p.add_argument(
        "--scale",
        type=floats,
        default=SCALE,
        metavar="LO,HI",
        help="the random crop's share of the image area (default: 0.08,1)",
    )
    p.add_argument(
        "--ratio",
        type=floats,
        default=RATIO,
        metavar="LO,HI",
        help="the random crop's aspect range, width/height (default: 0.75,1.333)",
    )
    p.add_argument(
        "--crop-pct",
        type=float,
        default=None,
        metavar="F",
        help="val: the crop's share of the resized shorter side (timm's crop_pct; default 0.875)",
    )
    p.add_argument(
        "--val-resize",
        type=float,
        default=None,
        metavar="PX",
        help="val: the shorter side before the center crop, instead of --crop-pct (torchvision's Resize)",
    )
    p.add_argument(
        "--train-fit",
        choices=TRAIN_FITS,
        default="rrc",
        help="the train crop: rrc (RandomResizedCrop, --scale/--ratio; default) or scale-jitter (detection's "
        "large-scale jitter: the whole image fitted to --crop, scaled by a factor in --jitter, then cropped or "
        "padded to --crop)",
    )
    p.add_argument(
        "--jitter",
        type=pair,
        default=JITTER,
        metavar="LO,HI",
        help="scale-jitter's factor range on the fitted size (default: 0.1,2, torchvision's detection recipe)",
    )
    p.add_argument(
        "--val-fit",
        choices=VAL_FITS,
        default="auto",
        help="the val transform: center (resize, center crop), letterbox (the whole image, aspect kept, padded) "
        "or auto (default: the split's kind says; letterbox for boxes)",
    )


def add_decode_flags(p: argparse.ArgumentParser, *, decode: bool = True, workers: bool = True) -> None:
    """``--backend`` (the registry's names), ``--decoder``, ``--threads`` and (``decode``) ``--decode``;
    with ``workers`` (a command with no ``--workers`` of its own) ``-j``/``--workers`` name ``--threads``
    too: timm's and pytorch/examples' loader workers, the same job (decoding in parallel)."""
    from stoker.pipeline.backends import DECODES, backend_names
    from stoker.pipeline.backends.decoders import DECODER_NAMES

    p.add_argument(
        "--backend",
        choices=backend_names(),
        default="auto",
        help="Loader backend (default: auto: DALI when installed, else nvjpeg on a CUDA device, else pil)",
    )
    p.add_argument(
        "--decoder",
        choices=DECODER_NAMES,
        default="auto",
        help="the nvjpeg backend's GPU JPEG decoder (default: auto: the first whose probe decode works)",
    )
    if decode:
        p.add_argument("--decode", choices=DECODES, default="auto", help="GPU (mixed) or CPU decode (default: auto)")
    names = ("-j", "--threads", "--workers") if workers else ("--threads",)
    p.add_argument(
        *names,
        dest="threads",
        type=int,
        default=None,
        help="Loader decode threads (DALI) or processes (pil)"
        + ("; -j/--workers as timm and pytorch/examples name their loader workers" if workers else "")
        + " (default: the Loader's choice)",
    )


def add_storage_flags(p: argparse.ArgumentParser, *, cache: bool = True, order: bool = True) -> None:
    """The object-storage group: ``--storage-option`` (and ``cache``: ``--cache-dir``,
    ``--cache-limit``; ``order``: ``--shuffle``, ``--block-shards``)."""
    g = p.add_argument_group("data in object storage (DATA is an s3://, gs://, https:// ... URL)")
    g.add_argument(
        "--storage-option",
        action="append",
        default=None,
        metavar="K=V",
        help="fsspec storage option, repeatable (e.g. endpoint_url=http://minio:9000)",
    )
    if cache:
        g.add_argument(
            "--cache-dir",
            default=None,
            help="local shard cache, DIR/train and DIR/val (default: ~/.cache/stoker/shards/...)",
        )
        g.add_argument("--cache-limit", default=None, metavar="SIZE", help="bytes the cache may keep, e.g. 50GB")
    if order:
        from stoker.pipeline.order import SHUFFLES

        g.add_argument(
            "--shuffle",
            choices=SHUFFLES,
            default="global",
            help="global: a fresh permutation of the whole split (default); block: shards per rank, "
            "samples shuffled within windows of --block-shards (for a bounded cache)",
        )
        g.add_argument("--block-shards", type=int, default=4, help="shards per window with --shuffle block")


def add_pixel_flags(p: argparse.ArgumentParser) -> None:
    """``--pixel-cache DIR`` and ``--pixel-cache-budget SIZE``: the Loader's decoded-pixel tier."""
    g = p.add_argument_group("decoded-pixel tier (the first epoch decodes into DIR; later ones crop from pixels)")
    g.add_argument(
        "--pixel-cache",
        default=None,
        metavar="DIR",
        help="keep every sample's decoded pixels in DIR (node-local disk or /dev/shm; shared by a node's "
        "processes; a folder per split inside), so epochs after the first skip JPEG decoding",
    )
    g.add_argument(
        "--pixel-cache-budget",
        default=None,
        metavar="SIZE",
        help="bytes the pixels of a split may take, e.g. 20GB (default: all of them; refused in one line "
        "when the disk cannot hold them): the split's first samples that fit are cached, the rest decoded",
    )


def pixel_cache(args: argparse.Namespace):
    """The :class:`~stoker.pipeline.pixels.PixelCache` of ``--pixel-cache``/``--pixel-cache-budget``, or
    ``None``. A budget without a folder is a usage error."""
    from stoker.errors import UsageError

    from .units import parse_size

    folder, budget = getattr(args, "pixel_cache", None), getattr(args, "pixel_cache_budget", None)
    if budget and not folder:
        raise UsageError("--pixel-cache-budget needs --pixel-cache DIR (where the pixels go)")
    if not folder:
        return None
    from stoker.pipeline.pixels import PixelCache

    return PixelCache(folder, budget=parse_size(budget, "--pixel-cache-budget") if budget else None)


def crop_spec(args: argparse.Namespace):
    """The crop recipe of ``args``, whole (a :class:`~stoker.pipeline.augment.CropSpec`; a flag
    a command does not have takes the Loader's default). Raises ``ValueError`` naming a bad value."""
    from stoker.pipeline.augment import CropSpec

    return CropSpec.of(
        args.crop,
        scale=tuple(getattr(args, "scale", SCALE)),
        ratio=tuple(getattr(args, "ratio", RATIO)),
        crop_pct=getattr(args, "crop_pct", None),
        val_resize=getattr(args, "val_resize", None),
        train_fit=getattr(args, "train_fit", "rrc"),
        jitter=tuple(getattr(args, "jitter", JITTER)),
        val_fit=getattr(args, "val_fit", "auto"),
    )


def loader_options(args: argparse.Namespace) -> dict[str, Any]:
    """The Loader keywords of the decode, storage and order flags ``args`` has (none of the crop's:
    :func:`crop_spec`)."""
    from stoker.pipeline.storage import parse_storage_options

    from .units import parse_size

    out: dict[str, Any] = {}
    for name in ("backend", "decoder", "decode", "threads", "cache_dir", "shuffle", "block_shards"):
        if hasattr(args, name):
            out[name] = getattr(args, name)
    if getattr(args, "storage_option", None):
        out["storage_options"] = parse_storage_options(args.storage_option)
    if getattr(args, "cache_limit", None):
        out["cache_limit"] = parse_size(args.cache_limit, "--cache-limit")
    if getattr(args, "pixel_cache", None):
        out["pixel_cache"] = pixel_cache(args)
    return out


__all__ = [
    "add_crop_flags",
    "add_decode_flags",
    "add_pixel_flags",
    "add_storage_flags",
    "crop",
    "crop_spec",
    "floats",
    "loader_options",
    "pair",
    "pixel_cache",
]
