"""The Loader's flags, declared once for every command that builds a Loader.

``stoker train``, ``stoker diagnose`` and ``stoker bench`` take the same crop recipe (``--crop PX``
or ``--crop H,W``, ``--scale``, ``--ratio``, ``--crop-pct``, ``--val-resize``), the same decode
choices (``--backend`` from the backend registry, ``--decode``, ``--decoder``, ``--threads``) and,
where they read object storage, the same storage and order flags. :func:`crop_spec` carries the
recipe whole (a :class:`~stoker.pipeline.augment.CropSpec`, what ``Loader(crop=)`` takes) and
:func:`loader_options` the rest, so a flag's meaning and its check are written here only.
No torch import: ``--help`` stays instant.
"""

from __future__ import annotations

import argparse
from typing import Any

#: the random resized crop's defaults (torchvision's RandomResizedCrop)
SCALE = (0.08, 1.0)
RATIO = (3 / 4, 4 / 3)


def floats(text: str) -> tuple[float, ...]:
    """``"0.08,1"`` -> ``(0.08, 1.0)`` (an argparse type)."""
    try:
        return tuple(float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers") from None


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
    """``--crop`` (and with ``recipe`` the train crop's ``--scale``/``--ratio`` and the val resize's
    ``--crop-pct``/``--val-resize``)."""
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


def add_decode_flags(p: argparse.ArgumentParser, *, decode: bool = True) -> None:
    """``--backend`` (the registry's names), ``--decoder``, ``--threads`` and (``decode``) ``--decode``."""
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
    p.add_argument("--threads", type=int, default=None, help="Loader decode threads (default: the Loader's choice)")


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
    return out


__all__ = [
    "add_crop_flags",
    "add_decode_flags",
    "add_storage_flags",
    "crop",
    "crop_spec",
    "floats",
    "loader_options",
]
