"""The decoded-pixel tier: ``Loader(pixel_cache=DIR)``.

The first epoch decodes each sample a rank reads, at its stored size, into a memory-mapped
store in ``DIR`` (node-local disk or ``/dev/shm``; :mod:`.store`); later epochs crop, resize and
flip from the decoded pixels with the same boxes and flips as the JPEG path (:mod:`.cpu` on the
CPU, :mod:`.device` on a GPU). The pixels are stored at their stored size, so the crop can change
between epochs (``Loader.set_crop``, a progressive resolution schedule) without refilling.

:class:`PixelCache` is the setting; :func:`open_store` opens a Loader's store (the size check)
and :func:`make_runner` the runner that reads it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stoker.errors import ArgumentError

from ..fsutil import PathLike
from .store import PIXEL_FORMATS, PixelStore, format_bytes

#: how the store fills (:mod:`.fill`): ``background`` (epoch 0 on the JPEG path while a low-priority
#: process fills it) or ``inline`` (the first epoch decodes every sample whole into it)
FILLS = ("background", "inline")
#: what ``pixel_format=`` may say: ``auto`` is RGB (measured fastest on the CPU: no conversion;
#: YUV 4:2:0 halves the bytes but is lossy, see docs/pixel-cache.md)
FORMATS = ("auto", *PIXEL_FORMATS)


@dataclasses.dataclass(frozen=True)
class PixelCache:
    """The decoded-pixel tier of a Loader (``Loader(pixel_cache=PixelCache(DIR, budget=...))``; a
    path alone is ``PixelCache(path)``).

    Attributes:
        dir: where the pixels go: node-local disk or ``/dev/shm`` (a folder per split inside;
            the ranks of a node share it).
        budget: bytes the pixels of a split may take (``None``: all of them, refused in one line
            when the disk cannot hold them): the first samples of the split that fit are cached,
            the rest decoded each epoch.
        pixel_format: ``"rgb"``, ``"yuv420"`` (half the bytes; converted on the device; lossy:
            chroma at half resolution), or ``"auto"`` (RGB).
        fill: on the CPU, ``"background"`` (default: epoch 0 runs the JPEG path, as fast as
            without the tier, while a ``nice 19`` process decodes whole images into the store with
            the idle CPU; every later epoch crops from the store, decoding what is still missing)
            or ``"inline"`` (epoch 0 decodes every sample whole into the store and crops from it:
            the store is full soonest, that epoch is slower than the JPEG path; a full store
            serves epoch 0 too). Either way which path serves an epoch depends on its number
            alone, so runs and resumes are exact. ``threads=0`` (no processes) always fills
            inline; a GPU decode fills on the device.
    """

    dir: PathLike
    budget: int | None = None
    pixel_format: str = "auto"
    fill: str = "background"

    def __post_init__(self) -> None:
        if self.budget is not None and (not isinstance(self.budget, int) or self.budget < 1):
            raise ArgumentError(f"pixel cache budget={self.budget!r} must be a positive number of bytes")
        if self.pixel_format not in FORMATS:
            raise ArgumentError(f"pixel_format={self.pixel_format!r} must be one of {FORMATS}")
        if self.fill not in FILLS:
            raise ArgumentError(f"pixel cache fill={self.fill!r} must be one of {FILLS}")

    @classmethod
    def of(cls, value: Any) -> PixelCache | None:
        """``value`` as a PixelCache: ``None``, a folder, or a PixelCache."""
        if value is None or isinstance(value, PixelCache):
            return value
        if isinstance(value, (str, Path)) or hasattr(value, "__fspath__"):
            return cls(value)
        raise ArgumentError(f"pixel_cache={value!r} must be a folder or a PixelCache")

    @property
    def resolved_format(self) -> str:
        """The pixel format stored: ``auto`` is RGB."""
        return "rgb" if self.pixel_format == "auto" else self.pixel_format


@functools.cache
def pillow_decoder() -> str:
    """The CPU fill decoder's identity (part of a store's key): pillow's and libjpeg-turbo's versions."""
    import PIL
    from PIL import features

    return f"pillow {PIL.__version__}, libjpeg-turbo {features.version('libjpeg_turbo') or 'absent'}"


def on_device(settings: Any, cache: PixelCache) -> bool:
    """Does this Loader's tier crop on the GPU (a GPU decode) or read YUV 4:2:0 (converted by torch),
    rather than in pillow worker processes?"""
    return settings.decode == "mixed" or cache.resolved_format == "yuv420"


def open_store(settings: Any, cache: PixelCache) -> PixelStore:
    """The store of a Loader's split (created, laid out and its space reserved when new: the size
    check; a stale one replaced); of a mix, one per split (:class:`~.mixstore.MixPixelStore`). Its
    key names the decoder that fills it: pillow on the CPU, the nvjpeg backend's decoder with a GPU
    decode."""
    if settings.decode == "mixed":
        from .device import fill_decoder

        decoder = fill_decoder(settings).identity
    else:
        decoder = pillow_decoder()

    def open_split(index: Any) -> PixelStore:
        return PixelStore(
            cache.dir,
            index,
            decoder=decoder,
            channels=settings.channels,
            pixel_format=cache.resolved_format,
            budget=cache.budget,
        )

    parts = getattr(settings.index, "parts", None)  # a mix: a store per split (.mixstore)
    if parts is not None:
        from .mixstore import MixPixelStore

        return MixPixelStore(parts, open_split)
    return open_split(settings.index)


def make_runner(
    settings: Any, cache: PixelCache, store: Callable[[], PixelStore], jpeg: Callable[[Any], Any] | None = None
) -> Any:
    """The runner of the tier (``store``: opens the Loader's store when first needed; ``jpeg``: makes
    the Loader's JPEG-path runner for given settings, which a background fill runs meanwhile)."""
    if on_device(settings, cache):
        from .device import DevicePixelRunner

        return DevicePixelRunner(settings, store)
    if cache.fill == "inline" or not settings.threads or jpeg is None:
        from .cpu import PixelRunner

        return PixelRunner(settings, store)
    from .fill import FillingRunner

    return FillingRunner(settings, store, jpeg)


__all__ = [
    "FILLS",
    "FORMATS",
    "PixelCache",
    "PixelStore",
    "format_bytes",
    "make_runner",
    "open_store",
    "pillow_decoder",
]
