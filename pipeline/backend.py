"""The one interface the decode backends implement, and the Loader's pick among them.

A backend is a *runner*: made once per :class:`~stoker.pipeline.loader.Loader` (``Runner(loader)``),
it turns batches of global sample positions into decoded batches (:class:`Batch`), in order. The order,
the batch boundaries, the epoch bookkeeping and the shard cache are the Loader's; the crop boxes
and flips are :mod:`.augment`'s; a runner only reads bytes (``loader.index``), guards, decodes,
crops and resizes. One module per backend:

* ``dali``: :mod:`.dali_backend` (its graph: :mod:`.dali_graph`), DALI on the CPU or the GPU;
* ``nvjpeg``: :mod:`.nvjpeg_backend`, torchvision's batched GPU decode;
* ``pil``: :mod:`.pil_backend`, pillow(-simd) in worker processes.
"""

from __future__ import annotations

from typing import Any, Iterator, NamedTuple, Protocol


class Batch(NamedTuple):
    """One decoded batch, as a runner yields it (the Loader hands users ``(images, labels)``).

    Attributes:
        images: uint8 ``[N, 3, crop, crop]`` on the Loader's device (``torch.channels_last``
            memory format when the Loader was asked for it).
        labels: int64 ``[N]`` on the same device.
        consumed: samples of the rank's epoch order this batch accounts for (its planned size,
            whatever was dropped): what the Loader's resume position advances by.
        skipped: of those, samples dropped (failed the header check or the decoder).
    """

    images: Any
    labels: Any
    consumed: int
    skipped: int


class Runner(Protocol):
    """What the Loader asks of a backend. A runner is made with its Loader and reads, live,
    its settings (``index``, ``path``, ``batch_size``, ``crop``, ``train``, ``seed``, ``device``,
    ``channels_last``, ``threads``, ``prefetch``, ``decode``, ``cpu_resize``, ``hw_decoder_load``)
    and, for a train batch none of whose samples is loadable, ``loader._stand_in(planned)``
    (the Loader's rule: the next loadable samples of this rank's order, so no step is lost).
    A val batch with nothing loadable is yielded empty (``N == 0``) in its place."""

    def iterate(self, batches: list, epoch: int) -> Iterator[Batch]:
        """One :class:`Batch` per array of global sample positions in ``batches``, in order.
        Closing the iterator early stops any work running ahead."""
        ...

    def close(self) -> None:
        """Stop any iteration still running and let threads, processes and pipelines go."""
        ...


def runner_class(backend: str) -> type:
    """The runner class of ``backend`` (``"dali"``, ``"nvjpeg"`` or ``"pil"``); imported on demand,
    so an unused backend's dependencies are never loaded."""
    if backend == "dali":
        from .dali_backend import DaliRunner

        return DaliRunner
    if backend == "nvjpeg":
        from .nvjpeg_backend import NvjpegRunner

        return NvjpegRunner
    if backend == "pil":
        from .pil_backend import PilRunner

        return PilRunner
    raise ValueError(f"backend={backend!r} must be 'dali', 'nvjpeg' or 'pil'")


def empty_batch(loader: Any, consumed: int, skipped: int) -> Batch:
    """A val batch none of whose samples is loadable: no images, no labels, on the Loader's
    device (yielded in place of the batch, so ``len(loader)`` holds)."""
    import torch

    c = loader.crop
    if loader.channels_last:  # NHWC storage, NCHW shape: torch.channels_last
        images = torch.empty((0, c, c, 3), dtype=torch.uint8, device=loader.device).permute(0, 3, 1, 2)
    else:
        images = torch.empty((0, 3, c, c), dtype=torch.uint8, device=loader.device)
    return Batch(images, torch.empty(0, dtype=torch.int64, device=loader.device), consumed, skipped)


__all__ = ["Batch", "Runner", "empty_batch", "runner_class"]
