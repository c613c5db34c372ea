"""The decode backends: batches of sample positions in, uint8 batches on the device out.

=================  ======================================================================
``base``           the one interface (:class:`~.base.Runner`, :class:`~.base.Batch`), what a
                   runner is given (:class:`~.base.DecodeSettings`) and the per-batch plan
                   every backend follows (:func:`~.base.plan_batch`: header guard,
                   stand-ins, crop boxes)
``dali``           NVIDIA DALI on the CPU or the GPU (its graph: ``dali_graph``)
``nvjpeg``         batched GPU JPEG decode without DALI: read + decode of the next batch
                   overlapping this one's crop + resize
``decoders``       the JPEG decoders ``nvjpeg`` can use (nvImageCodec, TorchCodec,
                   torchvision), each probed, and the pillow fallback for what they reject
``gpu_resize``     ``nvjpeg``'s batched crop + antialiased resize on the device
``pil``            pillow(-simd) in worker processes
``resize``         the pillow decode-and-resize stage (``pil``, and ``dali`` on the CPU)
``producer``       the producer thread ``dali`` and ``nvjpeg`` prepare batches ahead in, and
                   a stage running ahead in a thread of its own
=================  ======================================================================

A backend is chosen by name (:func:`runner_class`); its module is imported only then, so an
unused backend's dependencies are never loaded.
"""

from __future__ import annotations

import importlib

#: backend name -> (module, runner class)
RUNNERS = {
    "dali": (".dali", "DaliRunner"),
    "nvjpeg": (".nvjpeg", "NvjpegRunner"),
    "pil": (".pil", "PilRunner"),
}


def runner_class(backend: str) -> type:
    """The runner class of ``backend`` (``"dali"``, ``"nvjpeg"`` or ``"pil"``), imported on demand."""
    try:
        module, name = RUNNERS[backend]
    except KeyError:
        raise ValueError(f"backend={backend!r} must be one of {', '.join(map(repr, RUNNERS))}") from None
    return getattr(importlib.import_module(module, __name__), name)


__all__ = ["RUNNERS", "runner_class"]
