"""The nvjpeg backend: torchvision's batched JPEG decode on the GPU, without DALI.

Bytes come from the memory-mapped shards (:mod:`.samples`) exactly as for the other
backends; one ``torchvision.io.decode_jpeg(list, device="cuda")`` call decodes a batch
(nvJPEG); the crop boxes and flips are :mod:`.augment`'s, so a sample gets the same crop
as with ``dali`` and ``pil``; the crops are resized together on the device with pillow's
antialiased bilinear weights (:func:`crop_resize`) into one uint8 batch.

A producer thread prepares batches ahead (``prefetch``) on its own CUDA stream,
so decoding overlaps the training step; the consumer's stream waits on an event per
batch (no host sync). A JPEG the GPU rejects (nvJPEG refuses some files libjpeg reads:
CMYK, lossless, some progressive) and a PNG are decoded on the CPU with pillow instead,
counted in :attr:`NvjpegRunner.gpu_fallbacks` and never dropped; only a sample neither
decoder reads is dropped and counted like the other backends do.

With ``device="cpu"`` the same code runs with torchvision's CPU decode: the batched crop
and resize are tested without a GPU.
"""

from __future__ import annotations

import io
import queue
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from . import producer
from .base import (
    Batch,
    DecodeSettings,
    Plan,
    crop_masks,
    decode_masks,
    empty_batch,
    empty_images,
    plan_batch,
    targets_of,
)
from .producer import END, Failure, ProducerThread, stop_at_exit
from .resize import MODES


def decode_jpegs(datas: list, device, channels: int = 3) -> list:
    """Decode encoded JPEGs (1-D uint8 CPU tensors) to ``[channels, H, W]`` uint8 tensors (RGB,
    or the decoder's luma for 1) on ``device`` in one batched call (nvJPEG on CUDA). Raises when
    any of them fails."""
    from torchvision.io import ImageReadMode, decode_jpeg

    mode = ImageReadMode.RGB if channels == 3 else ImageReadMode.GRAY
    out = decode_jpeg(datas, mode=mode, device=device)
    return list(out)


def decode_cpu(data, channels: int = 3) -> Any:
    """Pillow decode of one encoded image (JPEG or PNG, any mode) to a ``[channels, H, W]``
    uint8 CPU tensor: the fallback for what the GPU decoder rejects."""
    import torch
    from PIL import Image

    mode = MODES[channels]
    im = Image.open(io.BytesIO(data.numpy().tobytes() if hasattr(data, "numpy") else bytes(data)))
    if im.format == "JPEG" and mode == "L":
        im.draft("L", im.size)  # the decoder's luma, as nvJPEG's grayscale output
    if im.mode != mode:
        im = im.convert(mode)
    return torch.from_numpy(np.asarray(im).reshape(im.size[1], im.size[0], -1).copy()).permute(2, 0, 1)


#: float32 bytes of one chunk's padded regions in :func:`crop_resize` (bounds its memory)
CHUNK_BYTES = 512 << 20


def _weights(start, scale, length, size: int, crop: int):
    """Pillow's antialiased bilinear weights along one axis, as dense ``[N, crop, size]``
    matrices: output pixel ``o`` of image ``n`` is centred at ``start + (o + 0.5) * scale``
    (region pixels), its triangle filter is ``max(1, scale)`` wide on each side, taps past
    ``length`` (the region's end) weigh nothing, and each row sums to 1."""
    import torch

    dev = start.device
    support = scale.clamp(min=1.0)[:, None, None]
    centre = start[:, None, None] + (torch.arange(crop, device=dev)[None, :, None] + 0.5) * scale[:, None, None]
    pixel = torch.arange(size, device=dev)[None, None, :] + 0.5
    w = (1 - ((pixel - centre) / support).abs()).clamp_(min=0)
    w *= pixel < length[:, None, None]
    return w / w.sum(-1, keepdim=True)


def crop_resize(images: list, boxes: np.ndarray, flips: np.ndarray, out) -> None:
    """Crop ``boxes`` (``[N, 4]`` ``(x, y, w, h)``) out of ``images`` (``[C, H, W]`` uint8
    tensors), resize each to ``out``'s size with antialiased bilinear, flip where ``flips``,
    and write them into ``out`` (``[N, C, crop_h, crop_w]`` uint8, any memory format, on the
    images' device).

    The resize is pillow's ``resize(BILINEAR, box=...)`` written as two matrix products,
    ``Wy @ region @ Wx.T``, batched over the images: each image's region (its box plus the
    filter's reach, which pillow also reads) is copied into one padded float32 tensor, the
    per-image weight matrices are built on the device, and a flip is the reversed order of
    ``Wx``'s rows. So a batch costs one small copy per image and a dozen batched kernels,
    where resizing crop by crop cost about six kernel launches per image: on an H200, batch
    256 at crop 224, 20,300-20,900 img/s against 12,300-12,600 (docs/benchmarks.md). On a
    CPU the dense products cost more than a per-crop resize; the backend decodes on the GPU.
    Images are taken in chunks of similar size (at most :data:`CHUNK_BYTES` of padded floats).
    """
    import torch

    channels, crop_h, crop_w = out.shape[-3:]
    n = len(images)
    if not n:
        return
    hw = np.array([img.shape[-2:] for img in images], np.int64)  # (H, W)
    box = boxes.astype(np.float64)
    box[:, 0] = np.clip(box[:, 0], 0, hw[:, 1] - 1)  # a box past the edge: clamped
    box[:, 1] = np.clip(box[:, 1], 0, hw[:, 0] - 1)
    box[:, 2] = np.clip(box[:, 2], 1, hw[:, 1] - box[:, 0])
    box[:, 3] = np.clip(box[:, 3], 1, hw[:, 0] - box[:, 1])
    scale = box[:, 2:] / np.array([crop_w, crop_h], np.float64)  # (x, y) input pixels per output pixel
    reach = np.ceil(np.maximum(scale, 1.0)) + 1  # how far past the box the filter reads
    lo = np.maximum(0, np.floor(box[:, :2] - reach)).astype(np.int64)  # region (x0, y0)
    hi = np.minimum(hw[:, ::-1], np.ceil(box[:, :2] + box[:, 2:] + reach)).astype(np.int64)  # (x1, y1)
    size = hi - lo  # region (w, h)
    order = np.argsort(size[:, 0] * size[:, 1], kind="stable")
    dev = out.device
    start = 0
    while start < n:  # chunks of similar-size regions, the padded floats within CHUNK_BYTES
        stop, mw, mh = start, 0, 0
        while stop < n:
            w, h = size[order[stop]]
            if stop > start and (stop - start + 1) * channels * 4 * max(mw, w) * max(mh, h) > CHUNK_BYTES:  # float32
                break
            mw, mh, stop = max(mw, w), max(mh, h), stop + 1
        ks = order[start:stop]
        region = torch.zeros((len(ks), channels, mh, mw), dtype=torch.float32, device=dev)  # 0 * padding, not NaN
        for j, k in enumerate(ks.tolist()):
            (x0, y0), (x1, y1) = lo[k], hi[k]
            region[j, :, : y1 - y0, : x1 - x0].copy_(images[k][:, y0:y1, x0:x1])
        per = torch.from_numpy(np.concatenate([box[ks, :2] - lo[ks], scale[ks], size[ks]], 1)).to(dev, torch.float32)
        wx = _weights(per[:, 0], per[:, 2], per[:, 4], mw, crop_w)
        wy = _weights(per[:, 1], per[:, 3], per[:, 5], mh, crop_h)
        flip = torch.from_numpy(flips[ks].astype(bool)).to(dev)
        wx = torch.where(flip[:, None, None], wx.flip(1), wx)  # a mirrored output: Wx's rows reversed
        res = wy[:, None] @ region @ wx[:, None].transpose(-1, -2)  # [n, C, crop_h, crop_w]
        res.add_(0.5).clamp_(0, 255)  # float -> uint8 truncates: +0.5 rounds
        out[torch.from_numpy(ks).to(dev)] = res.to(torch.uint8)
        start = stop


class NvjpegRunner(ProducerThread):
    """The Loader's runner for ``backend="nvjpeg"`` (a :class:`.base.Runner`):
    ``iterate(batches, epoch, seed)`` yields one :class:`.base.Batch` per batch of global sample
    ids, in order.

    Attributes:
        gpu_fallbacks: samples decoded with pillow on the CPU instead of on the device
            (JPEGs nvJPEG rejected, PNGs), since this runner was made.
        decode_jpegs: the batched decoder (``(list of tensors, device) -> list``);
            :func:`decode_jpegs` (tests replace it with one that fails).
    """

    def __init__(self, settings: DecodeSettings):
        import torch

        self.settings = settings
        self.device = settings.device
        self.cuda = self.device.type == "cuda"
        self.gpu_fallbacks = 0
        self.decode_jpegs: Callable[..., list] = decode_jpegs
        self._epoch_fallbacks = 0
        self._fallback_examples: list = []
        self._stream = torch.cuda.Stream(self.device) if self.cuda else None
        self._stop: threading.Event | None = None
        self._worker: threading.Thread | None = None
        stop_at_exit(self)

    # ---- one batch ---------------------------------------------------------------------
    def _decode(self, ids: np.ndarray, enc: list) -> list:
        """Decoded ``[C, H, W]`` tensors on the device for ``enc`` (``None`` where neither
        the GPU nor pillow reads the sample)."""
        import torch

        blob = np.concatenate(enc) if enc else np.zeros(0, np.uint8)  # one copy, writable
        flat = torch.from_numpy(blob)
        offs = np.concatenate([[0], np.cumsum([len(e) for e in enc])]).tolist()
        datas = [flat[offs[k] : offs[k + 1]] for k in range(len(enc))]
        jpeg = [k for k, e in enumerate(enc) if len(e) > 2 and e[0] == 0xFF and e[1] == 0xD8]
        out: list = [None] * len(enc)
        failed = dict.fromkeys(sorted(set(range(len(enc))) - set(jpeg)), "not a JPEG")

        def decode(ks: list) -> None:
            """One batched call; when it fails (one bad JPEG fails all), halve and retry: a
            rejected sample costs ~2 log2(batch) extra calls, not one call per sample."""
            try:
                images = self.decode_jpegs([datas[k] for k in ks], self.device, self.settings.channels)
                for k, img in zip(ks, images, strict=True):
                    out[k] = img
            except Exception as e:  # noqa: BLE001 - nvJPEG said no: find which; pillow decodes it
                if len(ks) == 1:
                    failed[ks[0]] = " ".join(str(e).split())[:120] or type(e).__name__
                else:
                    decode(ks[: len(ks) // 2])
                    decode(ks[len(ks) // 2 :])

        if jpeg:
            decode(jpeg)
        for k, why in failed.items():
            try:
                out[k] = decode_cpu(datas[k], self.settings.channels).to(self.device)
            except Exception:  # noqa: BLE001 - undecodable for pillow too: dropped, counted
                continue
            self.gpu_fallbacks += 1
            self._epoch_fallbacks += 1
            if len(self._fallback_examples) < 3:
                self._fallback_examples.append(f"{self.settings.index.describe(int(ids[k]))} ({why})")
        return out

    def _load(self, plan: Plan) -> tuple[list, list | None, Plan]:
        """``(images, masks, plan)``: the samples of ``plan`` that decode (images on either
        decoder; a mask split's masks with pillow, first: they are cheap and may drop a sample)."""
        masks = None
        if self.settings.masks:
            masks = decode_masks(plan)
            ok = np.array([m is not None for m in masks], bool)
            plan, masks = plan.keep(ok), [m for m in masks if m is not None]
        decoded = self._decode(plan.ids, plan.enc)
        keep = np.array([d is not None for d in decoded], bool)
        if masks is not None:
            masks = [m for m, k in zip(masks, keep, strict=True) if k]
        return [d for d in decoded if d is not None], masks, plan.keep(keep)

    def _batch(self, ids: np.ndarray, epoch: int, seed: int) -> Batch:
        """One batch, on the device."""
        s = self.settings
        # stand-ins are this runner's to pick: a sample can also fail the decoder, after the guard
        decoded, masks, plan = self._load(plan_batch(s, ids, epoch=epoch, seed=seed, stand_ins=False))
        if not len(plan.ids):
            if not s.train:
                return empty_batch(s, plan.consumed, plan.skipped)
            # stand-ins keep every rank's step count (the Loader's rule, as in the other backends)
            stand_in = plan_batch(s, s.stand_in(ids), epoch=epoch, seed=seed, stand_ins=False)
            decoded, masks, stand_in = self._load(stand_in)
            plan = stand_in._replace(consumed=plan.consumed, skipped=plan.skipped)
        images = empty_images(s, len(plan.ids))
        crop_resize(decoded, plan.boxes, plan.flips, images)
        targets = targets_of(s, plan.ids) if masks is None else crop_masks(s, masks, plan)
        return Batch(images, targets.to(self.device, non_blocking=True), plan.consumed, plan.skipped, plan.ids)

    # ---- the producer thread -----------------------------------------------------------
    def _produce(self, batches: list, epoch: int, seed: int, out_q: queue.Queue, stop: threading.Event) -> None:
        import contextlib

        import torch

        def put(item) -> None:  # never blocks past a consumer that has gone
            producer.put(out_q, stop, item)

        ctx = torch.cuda.stream(self._stream) if self.cuda else contextlib.nullcontext()
        dev = torch.cuda.device(self.device) if self.cuda else contextlib.nullcontext()
        ids = None
        try:
            with dev, ctx:
                for ids in batches:
                    if stop.is_set():
                        return
                    item = self._batch(ids, epoch, seed)
                    event = None
                    if self.cuda:
                        event = torch.cuda.Event()
                        event.record(self._stream)
                    put((item, event))
            put(END)
        except Exception as e:  # noqa: BLE001 - handed to the consumer, naming the shards
            if not stop.is_set():
                put(Failure(RuntimeError(self._describe_failure(ids, e))))

    def _describe_failure(self, ids, error: BaseException) -> str:
        index, split = self.settings.index, self.settings.path
        what = " ".join(f"{type(error).__name__}: {error}".split())[:200]
        if ids is None or not len(ids):
            return f"nvjpeg backend failed on {split}: {what}"
        shards = sorted({index.shard_names[index.shard_of(int(i))] for i in ids})
        keys = [index.key(int(i)) for i in ids[:8]]
        more = f" (+{len(ids) - 8} more)" if len(ids) > 8 else ""
        return (
            f"nvjpeg backend failed on a batch of {split} (shards {', '.join(shards)}; keys "
            f"{', '.join(keys)}{more}): {what}"
        )

    def iterate(self, batches: list, epoch: int, seed: int) -> Iterator[Batch]:
        """One :class:`.base.Batch` per array of global sample ids in ``batches``, in order;
        images uint8 NCHW on the loader's device."""
        import torch

        self._epoch_fallbacks, self._fallback_examples = 0, []
        items = self._run_producer(
            self._produce, (batches, epoch, seed), prefetch=self.settings.prefetch, name="stoker-nvjpeg"
        )
        try:
            for item in items:
                batch, event = item
                if event is not None:
                    # the consumer's stream waits for the producer's work (no host sync), and the
                    # allocator must not hand these blocks back to the producer's stream too early
                    current = torch.cuda.current_stream(self.device)
                    current.wait_event(event)
                    batch.images.record_stream(current)
                    batch.targets.record_stream(current)
                yield batch
        finally:
            items.close()  # stops the producer thread now, not whenever the GC gets to it
        if self._epoch_fallbacks:
            shown = "; ".join(self._fallback_examples)
            warnings.warn(
                f"stoker Loader {self.settings.path}: epoch {epoch}: {self._epoch_fallbacks} sample(s) "
                f"decoded on the CPU, not the GPU: {shown}",
                RuntimeWarning,
                stacklevel=2,
            )

    def close(self) -> None:
        """Stop an iteration's producer thread."""
        self.shutdown()


__all__ = ["NvjpegRunner", "crop_resize", "decode_jpegs", "decode_cpu"]
