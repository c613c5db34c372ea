"""The nvjpeg backend: batched JPEG decode on the GPU, without DALI.

Bytes come from the memory-mapped shards (:mod:`.samples`) exactly as for the other
backends; one batched call of a :mod:`.decoders` decoder (nvImageCodec, TorchCodec or
torchvision, picked by :func:`stoker.pipeline.backends.decoders.resolve_decoder`) decodes a batch, only
the crop boxes' regions where the decoder can; the crop boxes and flips are :mod:`.augment`'s,
so a sample gets the same crop as with ``dali`` and ``pil``; the crops are resized together on
the device with pillow's antialiased bilinear weights (:func:`.gpu_resize.crop_resize`) into one
uint8 batch.

Two stages overlap (``overlap=True``): a thread reads and decodes batch k+1 while the producer
thread crops and resizes batch k, a bounded queue between them; each stage has a CUDA stream
of its own at the lowest priority, the resize stream waits on the decode's event and the
consumer's stream on the resize's (no host sync on the consumer's thread). A JPEG the GPU
rejects (nvJPEG refuses some files libjpeg reads: CMYK, lossless, some progressive) and a PNG
are decoded on the CPU with pillow instead, counted in :attr:`NvjpegRunner.gpu_fallbacks` and
never dropped; only a sample neither decoder reads is dropped and counted like the other
backends do. :attr:`NvjpegRunner.stage_seconds` says where an epoch's time went.

With ``device="cpu"`` the same code runs with a decoder's CPU decode: the stages, the batched
crop and resize and the region bookkeeping are tested without a GPU.
"""

from __future__ import annotations

import collections
import contextlib
import queue
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy as np

from stoker.errors import one_line

from . import decoders, producer
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
from .decoders import decode_cpu, decode_jpegs
from .gpu_resize import crop_resize, filter_regions
from .producer import END, Failure, ProducerThread, StageClock, stop_at_exit

#: the stages timed in :attr:`NvjpegRunner.stage_seconds`
STAGES = ("read", "decode", "crop_resize")

#: CUDA's lowest stream priority, the one the default stream has (priorities run from 0 down to
#: negative numbers, higher): the decode and resize streams take it, so any stream the training
#: step runs on with a higher priority (``torch.cuda.Stream(priority=-1)``) goes first
STREAM_PRIORITY = 0


class _Decoded(NamedTuple):
    """A batch as the decode stage hands it to the resize stage."""

    plan: Plan
    images: list  # [C, H, W] on the device: whole images, or the regions ``boxes`` are relative to
    boxes: np.ndarray  # [N, 4] crop boxes in the decoded images' pixels
    masks: list | None
    event: Any  # recorded on the decode stream after the decode (None on the CPU)


class NvjpegRunner(ProducerThread):
    """The Loader's runner for ``backend="nvjpeg"`` (a :class:`.base.Runner`):
    ``iterate(batches, epoch, seed)`` yields one :class:`.base.Batch` per batch of global sample
    ids, in order.

    Args:
        settings: the Loader's :class:`.base.DecodeSettings`.
        decoder: a name of :data:`.decoders.NAMES`, ``"auto"``, or a :class:`.decoders.Decoder`;
            default ``settings.decoder`` where it has one, else ``"auto"``.
        overlap: read + decode in a thread of their own, overlapping the crop + resize; default
            ``settings.overlap`` where it has one, else True.
        region: decode only the crop boxes' regions where the decoder can; default
            ``settings.region_decode`` where it has one, else True.
        hw_decoder_load: nvImageCodec's hardware decoder share (default ``settings``').
        stage_sync: synchronize each stage's stream at its end (on the producer's threads, never
            the consumer's), so :attr:`stage_seconds` includes the device's time: for measuring.

    Attributes:
        gpu_fallbacks: samples decoded with pillow on the CPU instead of on the device
            (JPEGs the decoder rejected, PNGs), since this runner was made.
        decoder: the :class:`.decoders.Decoder`; ``decoder_reason``: why it was picked.
        decode_jpegs: the batched decode (``(datas, device, channels) -> list``), the
            decoder's (tests replace it with one that fails; then whole images are decoded).
        crop_resize: the batched crop + resize (:func:`.gpu_resize.crop_resize`; tests slow it down).
        stage_seconds: the last iteration's busy seconds per stage (``read``: the bytes off the
            shards; ``decode``; ``crop_resize``: with the targets), its ``wall`` seconds,
            ``batches``, ``images`` and ``overlap``; :attr:`overlap_ratio` is the stages' sum
            over the wall time. ``stage_totals``: the same summed over every iteration.
    """

    def __init__(
        self,
        settings: DecodeSettings,
        *,
        decoder: str | decoders.Decoder | None = None,
        overlap: bool | None = None,
        region: bool | None = None,
        hw_decoder_load: float | None = None,
        stage_sync: bool = False,
    ):
        import torch

        self.settings = settings
        self.device = settings.device
        self.cuda = self.device.type == "cuda"
        self.overlap = bool(getattr(settings, "overlap", True) if overlap is None else overlap)
        self.region = bool(getattr(settings, "region_decode", True) if region is None else region)
        self.stage_sync = bool(stage_sync)
        hw = settings.hw_decoder_load if hw_decoder_load is None else hw_decoder_load
        if decoder is None or isinstance(decoder, str):
            name, self.decoder_reason = decoders.resolve_decoder(
                decoder or getattr(settings, "decoder", "auto"), self.device
            )
            self.decoder = decoders.make(name, hw_decoder_load=hw, threads=settings.threads)
        else:
            self.decoder, self.decoder_reason = decoder, "given"
        self.gpu_fallbacks = 0
        self.decode_jpegs: Callable[..., list] = self.decoder.decode
        self.crop_resize: Callable[..., None] = crop_resize
        self.clock = StageClock(STAGES, sync=self._sync if stage_sync else None)
        self._epoch_fallbacks = 0
        self._fallback_examples: list = []
        self._pending: collections.deque = collections.deque()  # (event, foreign buffers) in use
        # lowest priority: the training step's kernels are not queued behind the loader's
        self._decode_stream = torch.cuda.Stream(self.device, priority=STREAM_PRIORITY) if self.cuda else None
        self._resize_stream = torch.cuda.Stream(self.device, priority=STREAM_PRIORITY) if self.cuda else None
        self._stop: threading.Event | None = None
        self._worker: threading.Thread | None = None
        stop_at_exit(self)

    @property
    def stage_seconds(self) -> dict:
        """The last iteration's busy seconds per stage, ``wall``, ``batches``, ``images``, ``overlap``."""
        return self.clock.last

    @property
    def stage_totals(self) -> dict:
        """:attr:`stage_seconds` summed over every iteration of this runner."""
        return self.clock.totals

    @property
    def overlap_ratio(self) -> float | None:
        """The last iteration's busy seconds of all stages over its wall seconds (about 1 when the
        stages ran one after another, up to 3 when all overlapped); None before any."""
        return self.clock.ratio()

    # ---- streams -----------------------------------------------------------------------
    def _sync(self) -> None:
        """Wait for the current stream (``stage_sync``: measuring only, on a producer thread)."""
        import torch

        if self.cuda:
            torch.cuda.current_stream(self.device).synchronize()

    def _on(self, stream) -> contextlib.AbstractContextManager:
        """This runner's device and ``stream`` current in the calling thread (nothing on the CPU)."""
        stack = contextlib.ExitStack()
        if self.cuda:
            import torch

            stack.enter_context(torch.cuda.device(self.device))
            stack.enter_context(torch.cuda.stream(stream))
        return stack

    def _record(self):
        """An event on the current stream (None on the CPU): what the next stream waits on."""
        if not self.cuda:
            return None
        import torch

        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        return event

    # ---- the decode stage --------------------------------------------------------------
    def _region_mode(self) -> bool:
        # only the decoder's own decode takes boxes (a test may swap in a plain callable)
        return self.region and self.decoder.regions and getattr(self.decode_jpegs, "__self__", None) is self.decoder

    def _decode(self, ids: np.ndarray, datas: list, wh: np.ndarray, regions, is_jpeg) -> tuple[list, np.ndarray]:
        """:func:`.decoders.decode_batch` with this runner's decode, counting pillow's fallbacks."""
        name = self.decoder.name or "the decoder"
        out, is_region, fallbacks = decoders.decode_batch(
            self.decode_jpegs,
            datas,
            device=self.device,
            channels=self.settings.channels,
            regions=regions,
            wh=wh,
            name=name,
            is_jpeg=is_jpeg,
        )
        self.gpu_fallbacks += len(fallbacks)
        self._epoch_fallbacks += len(fallbacks)
        for k, why in fallbacks[: max(0, 3 - len(self._fallback_examples))]:
            self._fallback_examples.append(f"{self.settings.index.describe(int(ids[k]))} ({why})")
        return out, is_region

    def _load(self, plan: Plan) -> tuple[list, np.ndarray, list | None, Plan]:
        """``(images, boxes, masks, plan)``: the samples of ``plan`` that decode (images on either
        decoder, with the crop boxes in their pixels; a mask split's masks with pillow, first:
        they are cheap and may drop a sample)."""
        import torch

        from ..imagedecode import is_jpeg_each

        masks = None
        if self.settings.masks:
            with self.clock.time("decode"):
                masks = decode_masks(plan)
            ok = np.array([m is not None for m in masks], bool)
            plan, masks = plan.keep(ok), [m for m in masks if m is not None]
        with self.clock.time("read"):  # one copy, writable: the shard maps' page faults are paid here
            blob = np.concatenate(plan.enc) if plan.enc else np.zeros(0, np.uint8)
            flat = torch.from_numpy(blob)
            offs = np.concatenate([[0], np.cumsum([len(e) for e in plan.enc])]).astype(np.int64)
            datas = [flat[a:b] for a, b in zip(offs[:-1].tolist(), offs[1:].tolist(), strict=True)]
            is_jpeg = is_jpeg_each(blob, offs)  # vectorized: a check per sample costs ~1 ms a batch
        regions = shifted = None
        if self._region_mode() and len(plan.ids):
            clamped, _, lo, hi = filter_regions(plan.boxes, plan.wh[:, ::-1], self.settings.crop)
            regions = np.concatenate([lo, hi - lo], axis=1)  # (x, y, w, h): the box in whole pixels
            shifted = clamped.copy()
            shifted[:, :2] -= lo  # the crop box in its region's pixels
        with self.clock.time("decode"):
            decoded, is_region = self._decode(plan.ids, datas, plan.wh, regions, is_jpeg)
        boxes = plan.boxes if shifted is None else np.where(is_region[:, None], shifted, plan.boxes)
        keep = np.array([d is not None for d in decoded], bool)
        if masks is not None:
            masks = [m for m, k in zip(masks, keep, strict=True) if k]
        return [d for d in decoded if d is not None], boxes[keep], masks, plan.keep(keep)

    def _front(self, ids: np.ndarray, epoch: int, seed: int) -> _Decoded:
        """Read and decode one batch (stand-ins for a train batch none of whose samples decodes)."""
        s = self.settings
        # stand-ins are this runner's to pick: a sample can also fail the decoder, after the guard
        with self.clock.time("read"):
            plan = plan_batch(s, ids, epoch=epoch, seed=seed, stand_ins=False)
        decoded, boxes, masks, plan = self._load(plan)
        if not len(plan.ids) and s.train:
            # stand-ins keep every rank's step count (the Loader's rule, as in the other backends)
            with self.clock.time("read"):
                stand_in = plan_batch(s, s.stand_in(ids), epoch=epoch, seed=seed, stand_ins=False)
            decoded, boxes, masks, stand_in = self._load(stand_in)
            plan = stand_in._replace(consumed=plan.consumed, skipped=plan.skipped)
        return _Decoded(plan, decoded, boxes, masks, self._record())

    # ---- the resize stage --------------------------------------------------------------
    def _back(self, d: _Decoded) -> Batch:
        """Crop, resize and flip one decoded batch into a uint8 batch on the device, with its targets."""
        s, plan = self.settings, d.plan
        if not len(plan.ids) and not s.train:
            return empty_batch(s, plan.consumed, plan.skipped)  # a val batch with nothing loadable
        if d.event is not None and self.overlap:
            import torch

            current = torch.cuda.current_stream(self.device)
            current.wait_event(d.event)  # the decode's work first (no host sync)
            for img in d.images:  # the decode stream's blocks are not reused before this stream read them
                img.record_stream(current)
        images = empty_images(s, len(plan.ids))
        self.crop_resize(d.images, d.boxes, plan.flips, images)
        targets = targets_of(s, plan.ids, plan=plan) if d.masks is None else crop_masks(s, d.masks, plan)
        return Batch(images, targets.to(self.device, non_blocking=True), plan.consumed, plan.skipped, plan.ids)

    def _release(self, wait: bool = False) -> None:
        """Let go of a foreign decoder's buffers the device has finished reading (``wait``: all,
        waiting for them on this producer thread)."""
        while self._pending and (wait or self._pending[0][0].query()):
            event, _ = self._pending.popleft()
            if wait:
                event.synchronize()

    # ---- the producer thread -----------------------------------------------------------
    def _produce(self, batches: list, epoch: int, seed: int, out_q: queue.Queue, stop: threading.Event) -> None:
        def put(item) -> None:  # never blocks past a consumer that has gone
            producer.put(out_q, stop, item)

        def serial() -> Iterator[tuple]:
            for ids in batches:
                if stop.is_set():
                    return
                try:
                    decoded = self._front(ids, epoch, seed)
                except Exception as e:  # boundary: re-raised with its batch, handed to the consumer below
                    raise producer.StageFailure(ids, e) from e
                yield ids, decoded

        ids = None
        try:
            with self._on(self._resize_stream):
                if self.overlap:  # read + decode of batch k+1 in a thread of its own, on its own stream
                    stages = producer.ahead(
                        lambda b: self._front(b, epoch, seed),
                        batches,
                        stop,
                        depth=1,
                        name="stoker-nvjpeg-decode",
                        context=lambda: self._on(self._decode_stream),
                    )
                else:
                    stages = serial()
                try:
                    for ids, decoded in stages:  # noqa: B007 - ids names the batch a failure is on
                        if stop.is_set():
                            return
                        self._release()
                        with self.clock.time("crop_resize"):
                            item = self._back(decoded)
                        event = self._record()
                        if event is not None and self.decoder.foreign_memory:
                            self._pending.append((event, decoded.images))
                        put((item, event))
                finally:
                    stages.close()
                    self._release(wait=True)
            put(END)
        except producer.StageFailure as e:  # the decode stage's, on its batch
            if not stop.is_set():
                put(Failure(RuntimeError(self._describe_failure(e.item, e.error))))
        except Exception as e:  # boundary: the producer thread's error, raised in the consumer naming the shards
            if not stop.is_set():
                put(Failure(RuntimeError(self._describe_failure(ids, e))))

    def _describe_failure(self, ids, error: BaseException) -> str:
        index, split = self.settings.index, self.settings.path
        what = one_line(error, with_type=True)
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
        self.clock.start()
        t0, count, images = time.perf_counter(), 0, 0
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
                count, images = count + 1, images + len(batch.images)
                yield batch
        finally:
            items.close()  # stops the producer thread now, not whenever the GC gets to it
            self.clock.finish(time.perf_counter() - t0, count, images, overlap=self.overlap)
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


__all__ = ["STAGES", "NvjpegRunner", "crop_resize", "decode_cpu", "decode_jpegs", "filter_regions"]
