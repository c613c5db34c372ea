"""The pillow backend: mmap'd shards + pillow(-simd) + torch DataLoader worker processes.

Same order, same crop boxes and flips as the DALI backend (:mod:`.augment`), same output.
Used where DALI is not installed (macOS, Windows) and for debugging. Also home of the
pillow resize stage the DALI CPU path uses: pillow-simd's resize is ~4x faster than
DALI's CPU resize on this class of machine (see the README's bench section).
"""

from __future__ import annotations

import io
from typing import Iterator

import numpy as np

from . import augment, producer
from .backend import Batch
from .shards.samples import SampleIndex, image_size

# A whole batch is one DataLoader item, so worker→parent traffic is one tensor per batch.


def resize_into(out: np.ndarray, k: int, im, crop: int, flip: bool, box=None, chw: bool = True) -> None:
    """Resize ``im`` (a PIL image; ``box`` = ``(x, y, w, h)`` region, whole image when
    ``None``) to ``crop`` x ``crop`` with antialiased bilinear (torchvision's
    ``RandomResizedCrop`` default), flip, and write it into ``out[k]``
    (``[N, 3, crop, crop]`` when ``chw`` else ``[N, crop, crop, 3]``)."""
    from PIL import Image

    if box is not None:
        x, y, w, h = box
        im = im.resize((crop, crop), Image.BILINEAR, box=(x, y, x + w, y + h))
    elif im.size != (crop, crop):
        im = im.resize((crop, crop), Image.BILINEAR)
    if flip:
        im = im.transpose(Image.FLIP_LEFT_RIGHT)
    hwc = np.frombuffer(im.tobytes(), np.uint8).reshape(crop, crop, 3)
    # one copy into the batch; for CHW numpy's transposing copy of one image is cheap
    # (measured: 25% less than pillow split() into planes; a whole-batch torch permute is 3x slower)
    out[k] = hwc.transpose(2, 0, 1) if chw else hwc


def decode_region(data, box, crop: int):
    """Decode ``data`` (encoded bytes) with JPEG DCT scaling (pillow's ``draft``) when the
    crop box is at least twice the output size, as FFCV does; returns ``(image, box)``
    with the box in the decoded image's pixels."""
    from PIL import Image

    im = Image.open(io.BytesIO(data))
    W, H = im.size
    x, y, w, h = (int(v) for v in box)
    if im.format == "JPEG" and min(w, h) >= 2 * crop:
        im.draft("RGB", (max(1, -(-W * crop // w)), max(1, -(-H * crop // h))))
        sx, sy = im.size[0] / W, im.size[1] / H
        box = (x * sx, y * sy, w * sx, h * sy)
    if im.mode != "RGB":
        im = im.convert("RGB")
    return im, box


class PilBatches:
    """A map-style dataset whose items are whole batches: ``(epoch, seed, ids) → (images, bad)``,
    where ``bad`` is a bool mask of samples that failed to decode (dropped). Labels are read by
    the parent (:meth:`PilRunner.iterate`), so a bad label is one error line there, not a
    worker's traceback."""

    def __init__(self, index: SampleIndex, *, crop: int, train: bool, chw: bool):
        self.index, self.crop, self.train, self.chw = index, crop, train, chw

    def __getitem__(self, item):
        import torch

        epoch, seed, ids = item
        ids = np.asarray(ids, np.int64)
        enc, wh = self.index.images(ids)
        bad = wh[:, 0] == 0
        if self.train:
            boxes, flips = augment.random_resized_crop(wh, ids, seed=seed, epoch=epoch)
        else:
            boxes, flips = augment.center_crop(wh, self.crop), np.zeros(len(ids), bool)
        shape = (len(ids), 3, self.crop, self.crop) if self.chw else (len(ids), self.crop, self.crop, 3)
        images = torch.empty(shape, dtype=torch.uint8)
        if torch.utils.data.get_worker_info() is not None:
            images.share_memory_()  # allocated in shm: no copy when sent to the parent
        out = images.numpy()
        k = 0
        for j in range(len(ids)):
            if bad[j]:
                continue
            try:
                im, box = decode_region(enc[j], boxes[j], self.crop)
                resize_into(out, k, im, self.crop, bool(flips[j]), box=box, chw=self.chw)
            except Exception:  # noqa: BLE001 - any decoder failure means: skip and count
                bad[j] = True
                continue
            k += 1
        return images[:k], torch.from_numpy(bad)

    def __len__(self) -> int:  # not used: the sampler yields the items
        return 0


def _identity(x):
    return x


class _Plan:
    """The sampler: this epoch's ``(epoch, seed, ids)`` items, replaced each epoch, so one
    DataLoader (and its worker processes) serves every epoch."""

    def __init__(self):
        self.items: list = []

    def __iter__(self):
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)


class PilRunner:
    """The Loader's runner for ``backend="pil"`` (a :class:`.backend.Runner`): persistent pillow
    worker processes (one torch DataLoader serving every epoch) fed batches of sample positions."""

    def __init__(self, loader):
        import sys

        import torch

        self.loader = loader
        self.plan = _Plan()
        self.index = loader.index
        self.dataset = dataset = PilBatches(
            loader.index, crop=loader.crop, train=loader.train, chw=not loader.channels_last
        )
        workers = loader.threads
        kw = {}
        if workers > 0:
            # fork is cheapest, but forking a process where DALI's native threads run can
            # deadlock the child (a lock held mid-fork): use a fork server then.
            methods = torch.multiprocessing.get_all_start_methods()
            method = "fork" if "fork" in methods and "nvidia.dali.backend_impl" not in sys.modules else None
            if method is None and "forkserver" in methods:
                method = "forkserver"
            kw = {
                "prefetch_factor": max(1, loader.prefetch),
                "persistent_workers": True,
                "multiprocessing_context": method,
            }
        self.dl = torch.utils.data.DataLoader(
            dataset,
            sampler=self.plan,
            batch_size=None,
            num_workers=workers,
            pin_memory=loader.device.type == "cuda",
            collate_fn=_identity,
            **kw,
        )

    def _labels(self, ids: np.ndarray, bad):
        import torch

        return torch.from_numpy(self.index.labels(ids[~bad.numpy()]))

    def iterate(self, batches: list, epoch: int) -> Iterator[Batch]:
        """One :class:`.backend.Batch` per array of global sample positions in ``batches``."""
        ld = self.loader
        self.plan.items = [(epoch, ld.seed, b) for b in batches]
        it = iter(self.dl)  # persistent workers: one iterator, reset each epoch
        if self.dl.num_workers:
            # torch registers its own exit hook for these workers when the iterator is made; with
            # pinned memory some versions wait 5 s per worker in it (80 s with 16 workers, seen on
            # an H200). Registered after it, ours runs first and stops them at once.
            producer.stop_at_exit(self)
        for (images, bad), ids in zip(it, batches):
            labels, consumed, nbad = self._labels(ids, bad), len(ids), int(bad.sum())
            if not len(labels) and ld.train:  # nothing loadable: stand-ins, decoded here (rare)
                stand_in = ld._stand_in(ids)
                images, stand_in_bad = self.dataset[(epoch, ld.seed, stand_in)]
                labels = self._labels(stand_in, stand_in_bad)
            if ld.channels_last:
                images = images.permute(0, 3, 1, 2)  # NHWC memory → NCHW shape, channels_last
            yield Batch(
                images.to(ld.device, non_blocking=True), labels.to(ld.device, non_blocking=True), consumed, nbad
            )

    def shutdown(self) -> None:
        """Stop the worker processes now, not when the DataLoader's iterator is collected."""
        it = getattr(self.dl, "_iterator", None)  # the persistent workers' iterator
        if it is not None:
            it._shutdown_workers()

    def close(self) -> None:
        """Stop the worker processes and let the DataLoader go."""
        self.shutdown()
        self.dl = None


__all__ = ["PilBatches", "PilRunner", "resize_into", "decode_region", "image_size"]
