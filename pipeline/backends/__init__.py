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
``registry``       every backend describing itself (:class:`~.registry.Backend`: name, where
                   it decodes, ``available(device)``, options, runner), the ``auto`` choice
                   and every name list; :func:`~.registry.register_backend` adds one
=================  ======================================================================

A backend's runner module is imported only when that backend runs, so an unused backend's
dependencies are never loaded.
"""

from __future__ import annotations

from .registry import (
    DECODES,
    Backend,
    backend_names,
    backends,
    get_backend,
    register_backend,
    resolve_backend,
    runner_class,
)

__all__ = [
    "DECODES",
    "Backend",
    "backend_names",
    "backends",
    "get_backend",
    "register_backend",
    "resolve_backend",
    "runner_class",
]
