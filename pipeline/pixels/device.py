"""The pixel tier on the device: each batch's crop boxes are read out of the store, moved to the
device together and resized there by the batched resize of the GPU path
(:func:`~stoker.pipeline.backends.gpu_resize.crop_resize`); YUV 4:2:0 pixels are converted to RGB
on the device first (:func:`yuv420_to_rgb`).

The store is filled by the decoder that would decode the JPEG: with a GPU decode
(``decode="mixed"``), the nvjpeg backend's (:func:`fill_decoder`; nvImageCodec is DALI's own
decode engine), whose whole-image output is copied to the host once; else pillow. A batch is
planned as on every backend, so the crops, flips and resize are the JPEG path's. On the CPU the
same code runs (a ``yuv420`` store, and the tests of the GPU path); the pillow runner
(:mod:`.cpu`) is the faster choice there for RGB.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from stoker.errors import one_line

from ..augment import CropSpec, crop_mask
from ..backends import decoders, producer
from ..backends.base import Batch, DecodeSettings, decode_masks, empty_batch, empty_images, plan_batch, targets_of
from ..backends.gpu_resize import crop_resize, filter_regions
from ..backends.producer import END, Failure, ProducerThread, stop_at_exit
from .cpu import decode_whole
from .store import PixelStore

# JPEG's YCbCr (full-range BT.601, what libjpeg converts with)
_TO_YUV = ((0.299, 0.587, 0.114), (-0.168736, -0.331264, 0.5), (0.5, -0.418688, -0.081312))
_TO_RGB = ((1.0, 0.0, 1.402), (1.0, -0.344136, -0.714136), (1.0, 1.772, 0.0))


class FillDecoder:
    """A GPU decode's whole-image JPEG decoder: the nvjpeg backend's (:mod:`~..backends.decoders`).
    ``identity`` names it with its version (the store's key); ``decode(datas, channels)`` gives
    ``[C, H, W]`` uint8 device tensors (``None`` where one fails, pillow taking what it rejects)."""

    def __init__(self, settings: DecodeSettings):
        name, self.reason = decoders.resolve_decoder(settings.decoder, settings.device)
        self.decoder = decoders.make(name, hw_decoder_load=settings.hw_decoder_load, threads=settings.threads)
        self.identity = f"{name} {self.decoder.version()}"
        self.device = settings.device

    def decode(self, datas: list, channels: int) -> list:
        out, _, _ = decoders.decode_batch(
            self.decoder.decode, datas, device=self.device, channels=channels, name=self.decoder.name
        )
        return out


def fill_decoder(settings: DecodeSettings) -> FillDecoder:
    """The decoder that fills a store for a GPU decode (see :class:`FillDecoder`)."""
    return FillDecoder(settings)


def rgb_to_yuv420(rgb) -> Any:
    """``[3, H, W]`` uint8 RGB (a torch tensor, any device) as the flat uint8 planes a ``yuv420``
    store holds: Y ``H*W``, then U and V at half resolution (rounded up; 2x2 means, the last row
    and column repeated for odd sizes)."""
    import torch

    x = rgb.float()
    m = torch.tensor(_TO_YUV, device=x.device)
    yuv = torch.einsum("ij,jhw->ihw", m, x)
    yuv[1:] += 128
    y = yuv[0].round().clamp_(0, 255).to(torch.uint8)
    h, w = y.shape
    uv = yuv[1:]
    if h % 2 or w % 2:
        uv = torch.nn.functional.pad(uv[None], (0, w % 2, 0, h % 2), mode="replicate")[0]
    uv = torch.nn.functional.avg_pool2d(uv[None], 2)[0].round().clamp_(0, 255).to(torch.uint8)
    return torch.cat([y.reshape(-1), uv.reshape(-1)])


def yuv420_to_rgb(y, u, v, dx: int = 0, dy: int = 0):
    """RGB ``[3, h, w]`` uint8 of a luma region ``y`` (``[h, w]``) and the half-resolution chroma
    ``u``, ``v`` around it: chroma upsampled 2x with the triangle filter JPEG decoders use ("fancy"
    upsampling: bilinear, centred), the luma region starting at ``(dx, dy)`` of the upsampled
    chroma, then JPEG's conversion. Chroma read with a sample of margin on each side (where the
    image has one) gives a region exactly the pixels of the whole image's conversion."""
    import torch

    h, w = y.shape
    uv = torch.stack([u, v]).float()[None]
    uv = torch.nn.functional.interpolate(uv, scale_factor=2, mode="bilinear", align_corners=False)[0]
    uv = uv[:, dy : dy + h, dx : dx + w] - 128
    m = torch.tensor(_TO_RGB, device=y.device)
    rgb = m[:, :1, None] * y.float()[None] + torch.einsum("ij,jhw->ihw", m[:, 1:], uv)
    return rgb.round_().clamp_(0, 255).to(torch.uint8)


def chroma_window(x0: int, y0: int, x1: int, y1: int, w: int, h: int) -> tuple:
    """The half-resolution chroma rows and columns a luma region ``(x0, y0)``-``(x1, y1)`` of a
    ``w`` x ``h`` image needs (one sample of margin each side, within the image): ``(cx0, cy0, cx1,
    cy1)``, and where the region starts in their 2x upsampling, ``(dx, dy)``."""
    cw, ch = (w + 1) // 2, (h + 1) // 2
    cx0, cy0 = max(0, x0 // 2 - 1), max(0, y0 // 2 - 1)
    cx1, cy1 = min(cw, (x1 + 1) // 2 + 1), min(ch, (y1 + 1) // 2 + 1)
    return (cx0, cy0, cx1, cy1), (x0 - 2 * cx0, y0 - 2 * cy0)


class DevicePixelRunner(ProducerThread):
    """The Loader's runner with ``pixel_cache=`` and a GPU decode or a ``yuv420`` store (a
    :class:`~..backends.base.Runner`): a producer thread plans a batch, fills what the store lacks,
    gathers the crop boxes' pixels into one host buffer, and crops, resizes and flips them on the
    device.

    Attributes:
        decoded: samples decoded from JPEG since made; ``from_store``: samples read from the store.
    """

    def __init__(self, settings: DecodeSettings, store: PixelStore | Callable[[], PixelStore]):
        self.settings = settings
        self._open = store if callable(store) else lambda: store
        self.store: PixelStore | None = None
        self.crops: CropSpec = settings.crops
        self.gpu = settings.decode == "mixed"
        self.decoder = fill_decoder(settings) if self.gpu else None
        self.decoded = self.from_store = 0
        self._stop: threading.Event | None = None
        self._worker: threading.Thread | None = None
        stop_at_exit(self)

    def set_crops(self, crops: CropSpec) -> None:
        """The crop recipe of the next iteration."""
        self.crops = crops

    # ---- filling -----------------------------------------------------------------------
    def _decode(self, datas: list) -> list:
        """Whole images ``[C, H, W]`` uint8 (``None`` for a failure): on the device with a GPU decode."""
        import torch

        from ..imagedecode import DAMAGED_INPUT

        c = self.settings.channels
        if self.gpu:
            return self.decoder.decode([torch.from_numpy(np.array(d)) for d in datas], c)
        out = []
        for d in datas:
            try:
                im = decode_whole(d, c)
            except DAMAGED_INPUT:  # a sample that does not decode is dropped and counted
                out.append(None)
                continue
            hwc = np.array(im).reshape(im.size[1], im.size[0], c)
            out.append(torch.from_numpy(hwc).permute(2, 0, 1))
        return out

    def _stored(self, image) -> Any:
        """What the store holds for a decoded ``[C, H, W]`` image: HWC bytes, or ``yuv420`` planes."""
        if self.store.pixel_format == "yuv420" and image.shape[0] == 3:
            return rgb_to_yuv420(image).cpu().numpy()
        return image.permute(1, 2, 0).contiguous().cpu().numpy()

    # ---- reading -----------------------------------------------------------------------
    def _gather(self, ids: list, lo: np.ndarray, hi: np.ndarray) -> list:
        """The crop regions of stored samples ``ids`` as ``[C, h, w]`` uint8 tensors on the device:
        copied into one (pinned) host buffer, moved there in one transfer."""
        import torch

        store, c, yuv = self.store, self.settings.channels, self.store.pixel_format == "yuv420"
        sizes, parts, shifts = [], [], []
        for i, (x0, y0), (x1, y1) in zip(ids, lo.tolist(), hi.tolist(), strict=True):
            if yuv and c == 3:
                w, h = store.wh[i].tolist()
                flat = store.pixels(i)
                cw, ch = (w + 1) // 2, (h + 1) // 2
                (cx0, cy0, cx1, cy1), shift = chroma_window(x0, y0, x1, y1, w, h)
                planes = (
                    flat[: w * h].reshape(h, w)[y0:y1, x0:x1],
                    flat[w * h : w * h + cw * ch].reshape(ch, cw)[cy0:cy1, cx0:cx1],
                    flat[w * h + cw * ch :].reshape(ch, cw)[cy0:cy1, cx0:cx1],
                )
                shifts.append(shift)
            else:
                planes = (store.pixels(i)[y0:y1, x0:x1],)
                shifts.append((0, 0))
            parts.append(planes)
            sizes.append([p.size for p in planes])
        total = int(sum(map(sum, sizes)))
        staging = torch.empty(total, dtype=torch.uint8, pin_memory=self.settings.device.type == "cuda")
        buf, at = staging.numpy(), 0
        for planes in parts:  # one copy each into the staging buffer
            for p in planes:
                buf[at : at + p.size].reshape(p.shape)[...] = p
                at += p.size
        flat = staging.to(self.settings.device, non_blocking=True)
        out, at = [], 0
        for planes, (dx, dy) in zip(parts, shifts, strict=True):
            views = []
            for p in planes:
                views.append(flat[at : at + p.size].view(p.shape))
                at += p.size
            out.append(yuv420_to_rgb(*views, dx=dx, dy=dy) if len(views) == 3 else views[0].permute(2, 0, 1))
        return out

    def _batch(self, ids: np.ndarray, epoch: int, seed: int, crops: CropSpec) -> Batch:
        """One batch: planned, filled where the store lacks it, cropped and resized on the device."""
        import dataclasses

        s = self.settings if crops == self.settings.crops else dataclasses.replace(self.settings, crops=crops)
        wh = self.store.wh
        plan = plan_batch(s, ids, epoch=epoch, seed=seed, stand_ins=False, wh=wh[ids])
        plan, images, boxes, masks = self._load(s, plan)
        if not len(plan.ids) and s.train:  # nothing loadable: stand-ins (the Loader's rule)
            more = s.stand_in(ids)
            alt = plan_batch(s, more, epoch=epoch, seed=seed, stand_ins=False, wh=wh[more])
            alt, images, boxes, masks = self._load(s, alt)
            plan = alt._replace(consumed=plan.consumed, skipped=plan.skipped)
        if not len(plan.ids):  # a val batch with nothing loadable: yielded empty in its place
            return empty_batch(s, plan.consumed, plan.skipped)
        out = empty_images(s, len(plan.ids))
        crop_resize(images, boxes, plan.flips, out)
        targets = targets_of(s, plan.ids, plan=plan) if masks is None else masks
        return Batch(out, targets.to(s.device, non_blocking=True), plan.consumed, plan.skipped, plan.ids)

    def _load(self, s: DecodeSettings, plan) -> tuple:
        """``(plan of the samples that load, their images on the device, each crop box in its
        image's pixels, their cropped masks or None)``: the store's samples are read as their crop
        region alone; the others are decoded whole and stored."""
        import torch

        store = self.store
        cached = store.filled(plan.ids)
        fresh = np.flatnonzero(~cached)
        masks = [store.mask(int(i)) if f else None for i, f in zip(plan.ids, cached, strict=True)] if s.masks else None
        images: list = [None] * len(plan.ids)
        ok = np.ones(len(plan.ids), bool)
        if len(fresh):
            datas = s.index.images(plan.ids[fresh])[0]
            fresh_masks = decode_masks(plan.keep(~cached)) if s.masks else [None] * len(fresh)
            for j, img, mask in zip(fresh.tolist(), self._decode(datas), fresh_masks, strict=True):
                if img is None or (s.masks and mask is None):
                    ok[j] = False  # does not decode: dropped and counted, as on every backend
                    continue
                images[j] = img
                if masks is not None:
                    masks[j] = mask
                store.put(int(plan.ids[j]), self._stored(img), mask)
                self.decoded += 1
        box, _, lo, hi = filter_regions(plan.boxes, plan.wh[:, ::-1], s.crop)
        hits = np.flatnonzero(cached)
        if len(hits):
            for j, t in zip(hits.tolist(), self._gather(plan.ids[hits].tolist(), lo[hits], hi[hits]), strict=True):
                images[j] = t
            box[hits, :2] -= lo[hits]  # a stored sample's tensor is its crop region alone
            self.from_store += len(hits)
        keep = np.flatnonzero(ok)
        cropped = None
        if masks is not None:
            cropped = torch.empty((len(keep), *s.crop), dtype=torch.uint8)
            for k, j in enumerate(keep.tolist()):
                crop_mask(masks[j], plan.boxes[j], bool(plan.flips[j]), cropped[k].numpy())
        return plan.keep(ok), [images[j] for j in keep.tolist()], box[keep], cropped

    # ---- the producer thread -----------------------------------------------------------
    def _produce(self, batches: list, epoch: int, seed: int, crops: CropSpec, out_q, stop) -> None:
        ids = None
        try:
            for ids in batches:
                if stop.is_set():
                    return
                producer.put(out_q, stop, self._batch(ids, epoch, seed, crops))
            producer.put(out_q, stop, END)
        except Exception as e:  # boundary: the producer thread's error, raised in the consumer naming the batch
            if not stop.is_set():
                what = one_line(e, with_type=True)
                keys = ", ".join(self.settings.index.key(int(i)) for i in (ids[:8] if ids is not None else []))
                error = RuntimeError(f"pixel tier failed on a batch of {self.settings.path} (keys {keys}): {what}")
                producer.put(out_q, stop, Failure(error))

    def iterate(self, batches: list, epoch: int, seed: int) -> Iterator[Batch]:
        """One :class:`~..backends.base.Batch` per array of global sample positions in ``batches``."""
        if self.store is None:
            self.store = self._open()
        yield from self._run_producer(
            self._produce, (batches, epoch, seed, self.crops), prefetch=self.settings.prefetch, name="stoker-pixels"
        )
        self.store.seal_soon()

    def close(self) -> None:
        """Stop an iteration's producer thread and release the store."""
        self.shutdown()
        if self.store is not None:
            self.store.close()


__all__ = ["DevicePixelRunner", "FillDecoder", "chroma_window", "fill_decoder", "rgb_to_yuv420", "yuv420_to_rgb"]
