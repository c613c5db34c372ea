"""The measurements behind ``stoker diagnose``, each bounded in time, each with its spread.

Every function takes plain objects (any iterable loader yielding ``(images, labels)``,
any ``nn.Module``) so tests can hand in a deliberately slow loader or heavy model.
Throughputs are images per second; warm-up (graph building, oneDNN/cuDNN autotuning)
is excluded. A measurement runs at least ``seconds`` and at least :data:`MIN_STEPS`
timed batches or steps; past ``seconds`` it goes on only while the minimum can still be
reached within :data:`CAP` x ``seconds``. It is timed in windows of ``seconds`` /
:data:`WINDOWS`, and every figure says how far the windows spread and whether it can be
trusted (``trust``: ``"ok"``, ``"few"`` steps, or ``"noisy"``; ``caveat`` says why).
"""

from __future__ import annotations

import copy
import os
import platform
import sys
import time
from collections.abc import Iterable

import torch
from torch import nn

from stoker.errors import ArgumentError
from stoker.model.train import runtime

from .timing import CAP, MIN_STEPS, NOISY, WINDOWS, Clock, warm_up

__all__ = [
    "CAP",
    "MIN_STEPS",
    "NOISY",
    "WINDOWS",
    "measure_loader",
    "measure_model_alone",
    "measure_end_to_end",
    "measure_transfer",
    "environment",
    "dist_version",
]


def _images_of(batch):
    return batch[0] if isinstance(batch, (tuple, list)) else batch


def _batches(loader: Iterable):
    """Loop over ``loader`` epoch after epoch, from wherever it stands now.

    A loader with ``set_epoch`` (stoker's Loader) first finishes the epoch a previous
    measurement left half read, then goes on with the next epochs.
    """
    epoch = getattr(loader, "epoch", 0)
    empty = 0
    while True:
        inner = iter(loader)
        n = 0
        try:
            for batch in inner:
                n += 1
                yield batch
        finally:
            # Stopped mid-epoch (generator closed): let the loader's iterator shut down now,
            # before the next measurement starts a new one.
            if hasattr(inner, "close"):
                inner.close()
        empty = empty + 1 if n == 0 else 0
        if empty == 2:  # a fresh epoch gave nothing either
            raise ValueError("the loader yielded no batch (fewer samples than one batch with drop_last?)")
        epoch += 1
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)


def measure_loader(loader: Iterable, *, seconds: float = 5.0, warmup_batches: int = 2) -> dict:
    """Images per second of ``loader`` alone (nothing done with the batches).

    Args:
        loader: Yields ``(images, labels)`` (or just images); iterated again, epoch after
            epoch, for at least ``seconds`` and :data:`MIN_STEPS` batches after the warm-up.
        seconds: Least time of the timed part (at most :data:`CAP` times it).
        warmup_batches: Batches excluded from the timing (pipeline start-up).

    Returns:
        ``images_per_s``, ``batches``, ``images``, ``seconds``, the stability figures of
        :func:`stability`, and the last batch's ``batch_shape``, ``dtype`` and ``device``.
    """
    if seconds <= 0:
        raise ArgumentError(f"seconds={seconds} must be > 0")
    if warmup_batches < 0:
        raise ArgumentError(f"warmup_batches={warmup_batches} must be >= 0")
    it = _batches(loader)
    x = None
    for _ in range(warmup_batches):
        x = _images_of(next(it))
    clock = Clock(seconds=seconds, device=x.device if isinstance(x, torch.Tensor) else None)
    while True:
        x = _images_of(next(it))
        clock.device = x.device if isinstance(x, torch.Tensor) else None
        if clock.tick(int(x.shape[0])):
            break
    r = clock.result()
    it.close()
    return {
        "images_per_s": r.pop("images_per_s"),
        "batches": r.pop("steps"),
        **r,
        "batch_shape": list(x.shape),
        "dtype": str(x.dtype).replace("torch.", ""),
        "device": str(x.device),
    }


def hw_of(crop) -> tuple[int, int]:
    """``(height, width)`` of a crop given as a side, ``(height, width)`` or a ``CropSpec``."""
    if hasattr(crop, "size"):
        return tuple(crop.size)
    return (crop, crop) if isinstance(crop, int) else (int(crop[0]), int(crop[1]))


def synthetic_targets(task, batch_size: int, crop, generator: torch.Generator) -> torch.Tensor:
    """A batch of random targets of ``task``'s kind (:class:`stoker.model.train.tasks.Task`; ``None``:
    class labels in ``[0, 1000)``, what :func:`_loss` folds onto any head)."""
    if task is None or task.case_study:
        return torch.randint(0, 1000, (batch_size,), generator=generator)
    return task.synthetic(batch_size, hw_of(crop), generator)


def _loss(out, labels: torch.Tensor) -> torch.Tensor:
    if isinstance(out, (tuple, list)):  # e.g. torchvision's InceptionOutputs
        out = out[0]
    if out.dim() == 2 and out.shape[1] == 1:  # one output: regression, as in the report's loop
        # Targets in [0, 1) like model.throughput's, so a few steps cannot blow the weights up.
        return nn.functional.mse_loss(out.float().squeeze(1), (labels % 1000).float() / 1000)
    if out.dim() == 2:
        return nn.functional.cross_entropy(out.float(), labels % out.shape[1])
    return out.float().mean()


class _EndToEndStep:
    """The step :func:`measure_end_to_end` times: the batch moved to ``device`` (and to
    channels_last), uint8 normalized there by :class:`stoker.model.Normalize` unless the model
    has one (float batches, a torchvision pipeline's, go in as they are), then stoker's one
    training step, :class:`stoker.model.train.step.TrainStep` (SGD, autocast, GradScaler for
    fp16 on CUDA). No host sync inside a step (the loss stays on the device).

    Args:
        model: The network; moved to ``device`` (and to channels_last when asked) in place.
        device: Where the step runs.
        amp: ``None`` (fp32), ``"bf16"`` or ``"fp16"``.
        channels_last: Convert the model and each batch to channels_last.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        device,
        amp: str | None = None,
        channels_last: bool = False,
        lr: float = 0.01,
        task=None,
    ) -> None:
        from stoker.model.normalize import Normalize, has_normalize
        from stoker.model.train.runtime import make_scaler, resolve_amp
        from stoker.model.train.step import TrainStep

        if amp not in (None, "bf16", "fp16"):
            raise ArgumentError(f"amp={amp!r} must be None, 'bf16' or 'fp16'")
        self.device = torch.device(device)
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.model = model.to(self.device, memory_format=self.memory_format).train()
        self.normalize = None if has_normalize(model) else Normalize().to(self.device)
        spec = resolve_amp(amp or "off", self.device)
        scaler = make_scaler(spec) if spec.name == "fp16" and self.device.type == "cuda" else None
        opt = torch.optim.SGD(self.model.parameters(), lr=lr, momentum=0.9)
        # the task's own loss (a float, multi-label or mask split), else the class-label heuristic
        loss = _loss if task is None or task.case_study else task.loss()
        self.step = TrainStep(self._forward, opt, loss, amp=spec, scaler=scaler)

    def _forward(self, images: torch.Tensor):
        normalize = self.normalize is not None and images.dtype == torch.uint8
        return self.model(self.normalize(images) if normalize else images)

    def __call__(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        images = images.to(self.device, non_blocking=True)
        labels = labels.to(self.device, non_blocking=True)
        if images.dim() == 4:
            images = images.contiguous(memory_format=self.memory_format)
        return self.step(images, labels)

    def restore(self) -> None:
        """Put the model back in contiguous memory format (after a channels_last measurement)."""
        if self.memory_format is torch.channels_last:
            self.model.to(memory_format=torch.contiguous_format)


def measure_model_alone(
    model: nn.Module,
    *,
    batch_size: int,
    crop: int,
    device,
    amp: str | None = None,
    channels_last: bool = False,
    seconds: float = 5.0,
    warmup: int = 2,
    task=None,
) -> dict:
    """Training images/s of ``model`` on a synthetic uint8 batch already on ``device``.

    A copy of ``model`` (the caller's is left as it is) trained by the very step
    :func:`measure_end_to_end` times (:class:`_EndToEndStep`: normalize on the device,
    forward, loss, backward, SGD), on one batch made on the device once; timed like every
    figure here (at least ``seconds`` and :data:`MIN_STEPS` steps, see :class:`Clock`) after
    up to ``warmup`` untimed steps. An out-of-memory error is returned as
    ``{"images_per_s": None, "error": ...}``.

    Returns:
        ``images_per_s``, ``step_ms``, ``steps``, ``images``, ``seconds``, ``first_step_s``,
        the stability figures of :func:`stability`, ``batch_size``, ``image_size``,
        ``device``, ``amp``, ``channels_last``.
    """
    device = torch.device(device)
    facts = {
        "batch_size": batch_size,
        "image_size": crop,
        "device": str(device),
        "amp": amp or "off",
        "channels_last": channels_last,
    }
    try:
        step = _EndToEndStep(copy.deepcopy(model), device=device, amp=amp, channels_last=channels_last, task=task)
        gen = torch.Generator().manual_seed(0)
        x = torch.randint(0, 256, (batch_size, 3, *hw_of(crop)), dtype=torch.uint8, generator=gen).to(device)
        y = synthetic_targets(task, batch_size, crop, gen).to(device)
        first = warm_up(lambda: step(x, y), warmup, seconds, device)
        clock = Clock(seconds=seconds, device=device)
        while True:
            step(x, y)
            if clock.tick(batch_size):
                break
        r = clock.result()
    except torch.OutOfMemoryError as e:
        return {"images_per_s": None, "error": f"out of memory: {str(e).splitlines()[0]}", **facts}
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return {**r, "step_ms": 1000 * r["seconds"] / r["steps"], "first_step_s": first, **facts}


def measure_end_to_end(
    loader: Iterable,
    model: nn.Module,
    *,
    device,
    amp: str | None = None,
    channels_last: bool = False,
    seconds: float = 5.0,
    warmup_batches: int = 2,
    task=None,
) -> dict:
    """Training images/s with batches from ``loader``, and the data-wait fraction.

    The data-wait fraction is the time blocked in ``next(loader)`` over the total: near 1
    means the model idles waiting for data (loader-bound), near 0 means the loader keeps up.
    On CUDA the step is asynchronous, so the GPU's work overlaps the next ``next()``
    exactly as in a training loop. Timed like every figure here (:class:`Clock`).
    """
    device = torch.device(device)
    it = _batches(loader)
    step = _EndToEndStep(model, device=device, amp=amp, channels_last=channels_last, task=task)
    try:

        def warm():
            step(*next(it)[:2])

        warm_up(warm, warmup_batches, seconds, device)
        wait = 0.0
        clock = Clock(seconds=seconds, device=device)
        while True:
            tw = time.perf_counter()
            images, labels = next(it)[:2]
            wait += time.perf_counter() - tw
            step(images, labels)
            if clock.tick(int(images.shape[0])):
                break
        r = clock.result()
    finally:
        it.close()
        step.restore()
    return {
        **r,
        "data_wait_s": wait,
        "data_wait_fraction": min(1.0, wait / r["seconds"]),
        "amp": amp or "off",
        "channels_last": channels_last,
    }


def measure_transfer(batch_shape, *, device, seconds: float = 1.0) -> dict:
    """Host→device bytes per batch for uint8 vs float32, and (on CUDA) the copy rate of each.

    On a CPU device nothing crosses a bus: only the byte counts are given. On CUDA each copy
    rate is timed like every figure here (``seconds / 2`` each); ``trust`` and ``caveat`` are
    the less trusted of the two.
    """
    n = 1
    for s in batch_shape:
        n *= int(s)
    out = {
        "batch_shape": [int(s) for s in batch_shape],
        "bytes_uint8": n,
        "bytes_float32": 4 * n,
        "uint8_images_per_s": None,
        "float32_images_per_s": None,
        "applies": False,
    }
    device = torch.device(device)
    if device.type != "cuda":
        return out
    out["applies"] = True
    per_batch = int(batch_shape[0])
    rank = {"ok": 0, "noisy": 1, "few": 2}
    for dtype, key in ((torch.uint8, "uint8_images_per_s"), (torch.float32, "float32_images_per_s")):
        host = torch.empty(tuple(batch_shape), dtype=dtype).pin_memory()
        dev = torch.empty(tuple(batch_shape), dtype=dtype, device=device)
        warm_up(lambda dev=dev, host=host: dev.copy_(host, non_blocking=True), 2, seconds / 2, device)
        clock = Clock(seconds=seconds / 2, device=device)
        while True:
            dev.copy_(host, non_blocking=True)
            if clock.tick(per_batch):
                break
        r = clock.result()
        out[key] = r["images_per_s"]
        out[key.replace("images_per_s", "spread")] = r["spread"]
        if rank[r["trust"]] > rank[out.get("trust", "ok")]:
            out |= {"trust": r["trust"], "caveat": r["caveat"]}
    out.setdefault("trust", "ok")
    return out


def dist_version(*names: str) -> str | None:
    """The installed version of the first of ``names`` that is installed, else None."""
    from importlib.metadata import PackageNotFoundError, version

    for name in names:
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return None


def environment() -> dict:
    """Versions and hardware facts that explain the figures."""
    from stoker.pipeline.backends.decoders import gpu_jpeg_decode
    from stoker.pipeline.deps import HAS_DALI, pillow_info, usable_cores

    cores = usable_cores()
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torchvision": dist_version("torchvision"),
        "dali": dist_version("nvidia-dali-cuda120", "nvidia-dali-cuda110", "nvidia-dali-cuda130", "nvidia-dali")
        if HAS_DALI
        else None,
        "pillow": pillow_info(),
        "cpu_count": os.cpu_count(),
        "usable_cores": cores,
        "torch_threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_bf16": runtime.cpu_bf16(),
        "gpu": gpu,
        "cuda": torch.version.cuda if gpu else None,
        "gpu_bf16": bool(gpu and runtime.gpu_bf16()[0]),  # native, not emulated: what --amp auto asks
        # torchvision's nvJPEG decode (the Loader's nvjpeg backend): works here, and why (or why not)
        "gpu_jpeg_decode": dict(zip(("works", "why"), gpu_jpeg_decode(), strict=True)) if gpu else None,
    }
