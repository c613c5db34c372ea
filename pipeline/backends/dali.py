"""The DALI backend: the Loader's order and crop boxes fed to the DALI graph (:mod:`.dali_graph`).

Batches go in through ``fn.external_source`` as byte ranges of the memory-mapped shards, so the
order is the Loader's global per-epoch permutation, not DALI's reader's, and the batch plan
(header guard, stand-ins, crops) is :func:`.base.plan_batch`, the same as the other backends'.
With ``decode="mixed"`` (or ``cpu_resize="dali"``) DALI also resizes, flips and lays out; with
CPU decode the decoded crop regions are resized by pillow-simd here
(:func:`.resize.resize_into`), measured faster.
A producer thread runs the pipeline and that resize while the caller trains.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterator

import numpy as np

from . import producer
from .base import Batch, DecodeSettings, crop_masks, empty_batch, plan_with_masks, targets_of
from .producer import END, Failure, ProducerThread, stop_at_exit


class DaliRunner(ProducerThread):
    """The Loader's runner for ``backend="dali"`` (a :class:`.base.Runner`): feeds the DALI
    graph from the Loader's order; one pipeline, built on first use, serves every epoch."""

    def __init__(self, settings: DecodeSettings):
        self.settings = settings
        self.pipe = None
        self.resize_in_graph = settings.decode == "mixed" or settings.cpu_resize == "dali"
        self._plan: Iterator = iter(())
        self._meta: collections.deque = collections.deque()
        self._carry: list = []
        self._stop: threading.Event | None = None
        self._worker: threading.Thread | None = None

    def _build(self):
        from .dali_graph import build_pipeline  # imports DALI, which registers its atexit teardown

        stop_at_exit(self)  # after DALI's own atexit hook: ours runs first

        ld = self.settings
        device_id = None
        if ld.decode == "mixed":
            import torch

            device_id = ld.device.index if ld.device.index is not None else torch.cuda.current_device()
        self.pipe = build_pipeline(
            self._source,
            batch_size=ld.batch_size,
            crop=ld.crop,
            decode=ld.decode,
            threads=max(1, ld.threads),
            prefetch=ld.prefetch,
            device_id=device_id,
            hw_decoder_load=ld.hw_decoder_load,
            resize=self.resize_in_graph,
            layout="HWC" if ld.channels_last else "CHW",
            channels=ld.channels,
        )
        self.pipe.build()

    def _source(self):
        """DALI's batch callback: called ahead of consumption (prefetch), in order."""
        s = self.settings
        empties = self._carry  # val batches with no loadable sample: yielded empty, in order
        while True:
            try:
                epoch, seed, ids = next(self._plan)
            except StopIteration:
                self._carry = empties  # trailing all-bad batches: yielded at the end
                raise
            plan, masks = plan_with_masks(s, ids, epoch=epoch, seed=seed)
            if len(plan.ids):
                break
            empties = empties + [(plan.consumed, plan.skipped)]
        self._carry = []
        # a mask is cropped here, with its image's box and flip: exactly as the other backends do
        targets = targets_of(s, plan.ids, plan=plan) if masks is None else crop_masks(s, masks, plan)
        self._meta.append((targets, plan.flips, plan.consumed, plan.skipped, plan.ids, empties))
        anchors = plan.boxes[:, :2].astype(np.float32)
        shapes = plan.boxes[:, 2:].astype(np.float32)
        if self.resize_in_graph:
            return plan.enc, anchors, shapes, plan.flips.astype(np.int32)
        return plan.enc, anchors, shapes

    def _finish(self, out, flips):
        """DALI output → torch on the loader's device."""
        import torch

        ld = self.settings
        if self.resize_in_graph:
            # exec_dynamic: DALI does not reuse an output's memory while a reference lives,
            # so the dlpack view is safe to hand out without a copy.
            images = torch.from_dlpack(out.as_tensor())
            if ld.channels_last:
                images = images.permute(0, 3, 1, 2)
            return images.to(ld.device, non_blocking=True)
        from PIL import Image

        from .resize import resize_into

        n, (h, w), c = len(out), ld.crop, ld.channels
        shape = (n, h, w, c) if ld.channels_last else (n, c, h, w)  # contiguous: pinning keeps no strides
        images = torch.empty(shape, dtype=torch.uint8, pin_memory=ld.device.type == "cuda")
        buf = images.numpy()
        # pillow-simd resize of each decoded crop (the decode itself was DALI's, ROI only).
        # One thread: splitting the batch over a thread pool measured slower (GIL).
        for k in range(n):
            region = np.asarray(out[k])
            im = Image.fromarray(region[..., 0] if c == 1 else region)
            resize_into(buf, k, im, ld.crop, bool(flips[k]), chw=not ld.channels_last)
        if ld.channels_last:
            images = images.permute(0, 3, 1, 2)
        return images.to(ld.device, non_blocking=True)

    def _describe_failure(self, ids: np.ndarray, error: BaseException) -> str:
        """One line for a DALI error on the batch ``ids``: its shards and sample keys (the
        failing one when DALI says which), and what to run."""
        import re

        index, split = self.settings.index, self.settings.path
        shards = sorted({index.shard_names[index.shard_of(int(i))] for i in ids})
        keys = [index.key(int(i)) for i in ids]
        text = str(error)
        m = re.search(r"sample #(\d+)", text)
        if m and int(m.group(1)) < len(keys):
            what = f"sample key {keys[int(m.group(1))]} does not decode"
        else:
            lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
            what = (lines[-1] if lines else type(error).__name__)[:200]
        shown = ", ".join(keys[:8]) + (f" (+{len(keys) - 8} more)" if len(keys) > 8 else "")
        return (
            f"DALI failed on a batch of {split} (shards {', '.join(shards)}; keys {shown}): "
            f"{what}; run `stoker verify {split}` to find corrupt samples "
            f"(`stoker index {split}` rewrites the manifest to skip undecodable ones)"
        )

    def _produce(self, out_q, stop):
        """Run the pipeline and the pillow stage; put finished batches on ``out_q``."""

        def put(item) -> None:  # never blocks past a consumer that has gone
            producer.put(out_q, stop, item)

        done = False
        try:
            while not stop.is_set():
                try:
                    (out,) = self.pipe.run()
                except StopIteration:
                    done = True
                    break
                targets, flips, consumed, nbad, ids, empties = self._meta.popleft()
                for item in empties:
                    put(empty_batch(self.settings, *item))
                images = self._finish(out, flips)
                targets = targets.to(self.settings.device, non_blocking=True)
                put(Batch(images, targets, consumed, nbad, ids))
            if done:
                for item in self._carry:
                    put(empty_batch(self.settings, *item))
                self._carry = []
                put(END)
        except Exception as exc:  # boundary: the DALI thread's error, raised in the consumer naming the shards
            if not stop.is_set():  # else nobody is listening (abandoned, or interpreter exit)
                error = RuntimeError(self._describe_failure(self._meta[0][4], exc)) if self._meta else exc
                put(Failure(error))
            done = True  # the pipeline is not drained after an error; it is rebuilt
            self.pipe = None
        finally:
            if not done and self.pipe is not None:  # abandoned: stop feeding, drain the queue
                self._plan = iter(())
                try:
                    while True:
                        self.pipe.run()
                except StopIteration:
                    pass
                except Exception:  # boundary: no consumer left to report to; the pipeline is rebuilt if used
                    self.pipe = None
            if self.pipe is not None:
                self.pipe.reset()
            self._meta.clear()

    def iterate(self, batches: list, epoch: int, seed: int) -> Iterator[Batch]:
        """One :class:`.base.Batch` per array of global sample positions in ``batches``."""
        if self.pipe is None:
            self._build()
        self._plan = ((epoch, seed, b) for b in batches)  # each batch made as DALI asks for it
        self._meta.clear()
        self._carry = []
        # A producer thread runs DALI and the pillow resize while the caller trains on the
        # previous batch (pillow and DALI release the GIL while they work).
        yield from self._run_producer(self._produce, (), prefetch=self.settings.prefetch, name="stoker-loader")

    def close(self) -> None:
        """Stop an iteration's producer thread; the pipeline goes with this runner."""
        self.shutdown()


__all__ = ["DaliRunner"]
