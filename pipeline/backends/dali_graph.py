"""The DALI graph: encoded bytes + crop boxes in, uint8 CHW (or HWC) crops out.

One ``@pipeline_def`` factory serves train and val, CPU and GPU: ``decode="mixed"``
decodes with nvJPEG / the hardware JPEG decoder and resizes on the GPU, ``decode="cpu"``
runs the same operators on the CPU (with ``device_id=None``: DALI's CPU-only mode).

The sample order and the crop parameters are not DALI's: the loader feeds them through
``fn.external_source`` (see :mod:`stoker.pipeline.backends.dali`), so the order is a global
per-epoch permutation and the crops are the ones the pillow backend computes too.
Only the crop region is decoded (``decoders.image_slice`` uses ROI decoding).
"""

from __future__ import annotations

from collections.abc import Callable

from stoker.errors import ArgumentError


def build_pipeline(
    source: Callable,
    *,
    batch_size: int,
    crop: int | tuple[int, int],
    decode: str = "cpu",
    threads: int = 2,
    prefetch: int = 2,
    device_id: int | None = None,
    hw_decoder_load: float = 0.65,
    resize: bool = True,
    layout: str = "CHW",
    interp: str = "linear",
    antialias: bool = True,
    seed: int = 0,
    channels: int = 3,
):
    """Build the DALI pipeline (call ``.build()`` / ``.run()`` on it).

    Args:
        source: the batch callback; returns ``(encoded, anchors, shapes[, mirror])``: a list
            of uint8 arrays, ``[B, 2]`` float32 ``(x, y)``, ``[B, 2]`` float32 ``(w, h)`` and,
            when ``resize``, ``[B]`` int32 flips; raises ``StopIteration`` at the epoch's end
            (then the pipeline must be ``reset()``).
        batch_size: the largest batch ``source`` returns (the last one may be smaller).
        crop: output side in pixels, or ``(height, width)``.
        decode: ``"cpu"`` or ``"mixed"``.
        threads: DALI worker threads.
        prefetch: batches DALI runs ahead (``prefetch_queue_depth``).
        device_id: ``None`` for CPU-only DALI; the CUDA device for ``"mixed"``.
        hw_decoder_load: share of JPEGs sent to the hardware decoder (``"mixed"`` only).
        resize: resize to ``crop``, flip and lay out in the graph (output: uint8 ``[B, C, H, W]``
            for ``layout="CHW"``, ``[B, H, W, C]`` for ``"HWC"``). When ``False`` the output is the
            decoded crop region, HWC, one size per sample.
        interp: ``"linear"``, ``"cubic"`` or ``"nn"``.
        antialias: low-pass when downscaling (torchvision/PIL semantics).
        channels: 3 (RGB) or 1 (grayscale: the decoder's own luma).
    """
    from nvidia.dali import fn, pipeline_def, types

    if decode not in ("cpu", "mixed"):
        raise ArgumentError(f"decode={decode!r} must be 'cpu' or 'mixed'")
    if layout not in ("CHW", "HWC"):
        raise ArgumentError(f"layout={layout!r} must be 'CHW' or 'HWC'")
    if channels not in (1, 3):
        raise ArgumentError(f"channels={channels!r} must be 1 or 3")
    crop_h, crop_w = (crop, crop) if isinstance(crop, int) else crop
    interp_type = {"linear": types.INTERP_LINEAR, "cubic": types.INTERP_CUBIC, "nn": types.INTERP_NN}[interp]

    @pipeline_def(enable_conditionals=False)
    def stoker_graph():
        if resize:
            encoded, anchor, shape, mirror = fn.external_source(
                source=source, num_outputs=4, batch=True, dtype=[types.UINT8, types.FLOAT, types.FLOAT, types.INT32]
            )
        else:
            encoded, anchor, shape = fn.external_source(
                source=source, num_outputs=3, batch=True, dtype=[types.UINT8, types.FLOAT, types.FLOAT]
            )
        kw = {"hw_decoder_load": hw_decoder_load} if decode == "mixed" else {}
        # ROI decode: only the crop box is decoded (EXIF is not applied: `stoker pack`
        # stores pixels upright, and the box was computed on the stored size)
        images = fn.decoders.image_slice(
            encoded,
            anchor,
            shape,
            device=decode,
            output_type=types.RGB if channels == 3 else types.GRAY,
            normalized_anchor=False,
            normalized_shape=False,
            adjust_orientation=False,
            axis_names="WH",
            **kw,
        )
        if not resize:
            return images
        images = fn.resize(
            images, size=[crop_h, crop_w], interp_type=interp_type, antialias=antialias, dtype=types.UINT8
        )
        return fn.crop_mirror_normalize(images, dtype=types.UINT8, output_layout=layout, mirror=mirror)

    # exec_dynamic: outputs own their memory, so they can go to torch via dlpack uncopied
    return stoker_graph(
        batch_size=batch_size,
        num_threads=threads,
        device_id=device_id,
        prefetch_queue_depth=prefetch,
        seed=seed,
        exec_dynamic=True,
    )


__all__ = ["build_pipeline"]
