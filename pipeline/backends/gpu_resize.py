"""The nvjpeg backend's batched crop and resize on the device: pillow's antialiased bilinear
resize of every crop of a batch, written as batched matrix products (:func:`crop_resize`), and
the region of each image it reads (:func:`filter_regions`, what a region decoder decodes)."""

from __future__ import annotations

import numpy as np

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


def filter_regions(boxes: np.ndarray, hw: np.ndarray, crop: tuple[int, int]) -> tuple:
    """What :func:`crop_resize` reads of each image: ``(box, scale, lo, hi)``, the ``boxes``
    (``[N, 4]`` ``(x, y, w, h)``) clamped to their images (``hw``: ``[N, 2]`` ``(H, W)``) as
    float64, the input pixels per output pixel ``(x, y)`` at ``crop`` (``(height, width)``),
    and the region the filter reads, ``lo`` ``(x0, y0)`` to ``hi`` ``(x1, y1)`` (int64): the box
    rounded out to whole pixels. The filter never reads past the crop, as torchvision's
    ``RandomResizedCrop`` (crop, then resize) and DALI's region decode + resize do: every backend
    and the pixel tier give one crop the same pixels, and a region decoder decodes the box alone."""
    crop_h, crop_w = crop
    box = np.asarray(boxes).astype(np.float64)
    box[:, 0] = np.clip(box[:, 0], 0, hw[:, 1] - 1)  # a box past the edge: clamped
    box[:, 1] = np.clip(box[:, 1], 0, hw[:, 0] - 1)
    box[:, 2] = np.clip(box[:, 2], 1, hw[:, 1] - box[:, 0])
    box[:, 3] = np.clip(box[:, 3], 1, hw[:, 0] - box[:, 1])
    scale = box[:, 2:] / np.array([crop_w, crop_h], np.float64)  # (x, y) input pixels per output pixel
    lo = np.maximum(0, np.floor(box[:, :2])).astype(np.int64)  # region (x0, y0)
    hi = np.minimum(hw[:, ::-1], np.ceil(box[:, :2] + box[:, 2:])).astype(np.int64)  # (x1, y1)
    return box, scale, lo, hi


def crop_resize(images: list, boxes: np.ndarray, flips: np.ndarray, out) -> None:
    """Crop ``boxes`` (``[N, 4]`` ``(x, y, w, h)``) out of ``images`` (``[C, H, W]`` uint8
    tensors), resize each to ``out``'s size with antialiased bilinear, flip where ``flips``,
    and write them into ``out`` (``[N, C, crop_h, crop_w]`` uint8, any memory format, on the
    images' device).

    The resize is pillow's ``crop(box).resize(BILINEAR)`` (torchvision's crop, then resize) written
    as two matrix products, ``Wy @ region @ Wx.T``, batched over the images: each image's region
    (its box rounded out to whole pixels) is copied into one padded float32 tensor, the
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
    box, scale, lo, hi = filter_regions(boxes, hw, (crop_h, crop_w))
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


__all__ = ["CHUNK_BYTES", "crop_resize", "filter_regions"]
